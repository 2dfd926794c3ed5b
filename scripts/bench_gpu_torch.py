"""PyTorch reference for scripts/bench-gpu.sh: the same shapes as cuda/bench_test.go,
timed with CUDA events (median of 50 after 10 warm-up runs), printed as TFLOP/s."""
import torch
import torch.nn.functional as F

def bench(fn, flops, n=50):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    times.sort()
    return flops / times[len(times) // 2] / 1e12

dev = "cuda"
bt, c, oc = 16384, 768, 3072
x = torch.randn(bt, c, device=dev, dtype=torch.bfloat16, requires_grad=True)
w = torch.randn(oc, c, device=dev, dtype=torch.bfloat16, requires_grad=True)
g = torch.randn(bt, oc, device=dev, dtype=torch.bfloat16)
def mm():
    x.grad = None; w.grad = None
    (x @ w.t()).backward(g)
print(f"torch MatmulBF16 {bench(mm, 6 * bt * c * oc):.1f} TFLOP/s")

B, T, NH, HD = 16, 1024, 12, 64
q, k, v = (torch.randn(B, NH, T, HD, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
do = torch.randn(B, NH, T, HD, device=dev, dtype=torch.bfloat16)
def attn():
    q.grad = k.grad = v.grad = None
    F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)
fwd = 4 * B * NH * T * T * HD / 2
print(f"torch FlashAttentionBF16 {bench(attn, 3.5 * fwd):.1f} TFLOP/s")
def attn_fwd():
    with torch.no_grad():
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
print(f"torch FlashAttentionForwardBF16 {bench(attn_fwd, fwd):.1f} TFLOP/s")
