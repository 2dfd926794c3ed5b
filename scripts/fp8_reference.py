#!/usr/bin/env python3
"""An outside check of shardline's FP8 casts (tensor/fp8.go): PyTorch's own
float32 -> float8_e4m3fn and float8_e5m2 conversions, plain (x.to(dtype):
E4M3 overflows to NaN, E5M2 to inf) and saturating (torchao's to_fp8_saturated:
clamp to +-max, then cast), and its decoding of all 256 codes.

usage: fp8_reference.py INPUT.f32 OUTPUT.bin
INPUT.f32 is little-endian float32 values; OUTPUT.bin receives, per format
(e4m3fn, then e5m2): the plain codes, the saturated codes (one byte each per
input), then the 256 codes' float32 values (little-endian).
Exits 3 when this torch has no float8 dtypes (added in PyTorch 2.1).
"""
import importlib.metadata
import re
import sys

# Read the version before importing torch (seconds): Debian's 1.13 stops here.
version = importlib.metadata.version("torch")
major, minor = (int(v) for v in re.match(r"(\d+)\.(\d+)", version).groups())
if (major, minor) < (2, 1):
    print("torch %s has no float8 dtypes (PyTorch 2.1 added them)" % version)
    sys.exit(3)

import torch  # noqa: E402

src, dst = sys.argv[1], sys.argv[2]
with open(src, "rb") as f:
    x = torch.frombuffer(bytearray(f.read()), dtype=torch.float32)
out = bytearray()
for dt in (torch.float8_e4m3fn, torch.float8_e5m2):
    m = torch.finfo(dt).max
    out += x.to(dt).view(torch.uint8).numpy().tobytes()
    out += x.clamp(min=-m, max=m).to(dt).view(torch.uint8).numpy().tobytes()
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    out += codes.view(dt).to(torch.float32).numpy().tobytes()
with open(dst, "wb") as f:
    f.write(out)
print("torch %s: %d inputs" % (torch.__version__, x.numel()))
