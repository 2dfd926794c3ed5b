#!/usr/bin/env python3
"""torch.mm (OpenBLAS on Debian) GFLOP/s on the shapes of tensor/cpu's BenchmarkSgemm,
best of 1 and 2 threads, one 'name gflops' line per shape."""
import sys, time
import torch

SHAPES = [("fwd_768x384x128", 768, 384, 128, False, True), ("fwd_768x512x128", 768, 512, 128, False, True),
          ("dinp_768x128x512", 768, 128, 512, False, False), ("dw_512x128x768", 512, 128, 768, True, False),
          ("square_1024", 1024, 1024, 1024, False, False)]

for name, M, N, K, tA, tB in SHAPES:
    a = torch.randn(K, M).t() if tA else torch.randn(M, K)
    b = torch.randn(N, K).t() if tB else torch.randn(K, N)
    best = 0.0
    for th in (1, 2):
        torch.set_num_threads(th)
        for _ in range(3):
            a @ b
        reps = max(3, int(2e9 / (2 * M * N * K)))
        t = time.perf_counter()
        for _ in range(reps):
            a @ b
        best = max(best, 2 * M * N * K * reps / (time.perf_counter() - t) / 1e9)
    print(name, round(best, 1))
