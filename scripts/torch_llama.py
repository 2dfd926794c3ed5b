"""PyTorch reference for trainer/gpu's BenchmarkStep134M: the same Llama (d768, 12
layers, 12 heads, SwiGLU ffn 2048, RoPE theta 10000, RMSNorm, vocabulary 32000,
untied head, 134M parameters) trained at T1024 B16 with bf16 autocast over fp32
weights and fused AdamW, eager and torch.compile. Prints tokens/s (median of the
timed steps after warm-up, CUDA events), MFU (6N + 6LTd flops per token over the
H100's 989 TFLOP/s) and peak memory. Usage: python3 scripts/torch_llama.py [eager|compile]..."""
import sys
import time
import torch
import torch.nn as nn
import torch.nn.functional as F

D, L, NH, FF, V, T, B = 768, 12, 12, 2048, 32000, 1024, 16
HD = D // NH


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype) * self.w


def rope(x, cos, sin):  # x (B, T, H, HD), rotate-half pairing i with i + HD/2
    x1, x2 = x[..., : HD // 2], x[..., HD // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = RMSNorm(D), RMSNorm(D)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(D, D, bias=False) for _ in range(4))
        self.w1, self.w3 = nn.Linear(D, FF, bias=False), nn.Linear(D, FF, bias=False)
        self.w2 = nn.Linear(FF, D, bias=False)

    def forward(self, x, cos, sin):
        h = self.n1(x)
        q = rope(self.wq(h).view(B, T, NH, HD), cos, sin).transpose(1, 2)
        k = rope(self.wk(h).view(B, T, NH, HD), cos, sin).transpose(1, 2)
        v = self.wv(h).view(B, T, NH, HD).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
        x = x + self.wo(a)
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.layers = nn.ModuleList(Layer() for _ in range(L))
        self.norm = RMSNorm(D)
        self.head = nn.Linear(D, V, bias=False)
        t = torch.arange(T, dtype=torch.float64)
        inv = 10000.0 ** (-torch.arange(0, HD // 2, dtype=torch.float64) * 2 / HD)
        ang = torch.outer(t, inv)
        self.register_buffer("cos", ang.cos().float()[None, :, None, :], persistent=False)
        self.register_buffer("sin", ang.sin().float()[None, :, None, :], persistent=False)

    def forward(self, tok, tgt):
        x = self.emb(tok)
        for layer in self.layers:
            x = layer(x, self.cos.to(x.dtype), self.sin.to(x.dtype))
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, V), tgt.view(-1))


def run(mode):
    torch.manual_seed(0)
    model = Llama().cuda()
    n = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    tok = torch.randint(0, V, (B, T), device="cuda")
    tgt = torch.randint(0, V, (B, T), device="cuda")
    fwd = torch.compile(model) if mode == "compile" else model

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(tok, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); step(); b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    times.sort()
    tps = B * T / times[len(times) // 2]
    flops = 6 * n + 6 * L * T * D
    print(f"torch {mode}: {tps:,.0f} tokens/s, MFU {100 * tps * flops / 989e12:.1f}%, "
          f"peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB, {n / 1e6:.1f}M params")


for mode in sys.argv[1:] or ["eager", "compile"]:
    run(mode)
