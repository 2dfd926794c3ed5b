"""PyTorch reference for trainer/gpu's step benchmarks: the same Llama (SwiGLU,
RoPE theta 10000, RMSNorm, vocabulary 32000, untied head) trained with bf16
autocast over fp32 weights and fused AdamW, eager and torch.compile, at the
benchmarks' shapes:
  134m  d768, 12 layers, 12 heads, ffn 2048, T1024 B16 (BenchmarkStep134M)
  1b    d2048, 24 layers, 16 heads over 8 KV heads, ffn 5504, T2048 B8 (BenchmarkStep1B)
  moe   d768, 8 layers, 16 experts of ffn 768, top 2, T1024 B8 (BenchmarkStepMoE295M;
        experts in a loop over index_select / index_add, the usual eager form)
Prints tokens/s (median of the timed steps after warm-up, CUDA events), MFU (6N +
6LTd flops per token, N the parameters a token passes through, over the H100's 989
TFLOP/s) and peak memory.
float8 is compile with torchao's float8 training (convert_to_float8_training,
tensorwise scaling, the head left in bf16 as shardline's head_bf16): it prints
that torchao is missing, and runs nothing, where it is not installed.
Usage: python3 scripts/torch_llama.py [134m|1b|moe] [eager|compile|float8]...
(default 134m eager compile); --device cpu --tiny checks the script itself on a CPU."""
import contextlib
import sys
import time
import torch
import torch.nn as nn
import torch.nn.functional as F

SHAPES = {
    "134m": dict(D=768, L=12, NH=12, NKV=12, FF=2048, T=1024, B=16, E=0),
    "1b": dict(D=2048, L=24, NH=16, NKV=8, FF=5504, T=2048, B=8, E=0),
    "moe": dict(D=768, L=8, NH=12, NKV=12, FF=2048, T=1024, B=8, E=16, K=2, EF=768),
}
args = [a for a in sys.argv[1:]]
DEV = "cuda"
if "--device" in args:
    i = args.index("--device")
    DEV = args[i + 1]
    del args[i : i + 2]
TINY = "--tiny" in args
if TINY:
    args.remove("--tiny")
shape = "134m"
if args and args[0] in SHAPES:
    shape = args.pop(0)
globals().update(SHAPES[shape])
V = 32000
if TINY:  # the same code paths at a size a CPU runs in seconds
    D, L, NH, NKV, FF, T, B, V = 64, 2, 4, 2 if NKV != NH else 4, 128, 64, 2, 512
    if E:
        E, EF = 4, 32
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


def attention(q, k, v):  # (B, H, T, HD) each, causal
    if NKV != NH:
        k, v = k.repeat_interleave(NH // NKV, 1), v.repeat_interleave(NH // NKV, 1)
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    s = (q @ k.transpose(-1, -2)) / HD**0.5  # PyTorch before 2.0 (the CPU check only)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s.softmax(-1) @ v


class MoE(nn.Module):
    """Top-K routing over E SwiGLU experts, gates the softmax of the selected
    logits, Switch aux loss E·Σ f_e·P_e (coefficient 0.01), as shardline's."""

    def __init__(self):
        super().__init__()
        self.router = nn.Linear(D, E, bias=False)
        self.w1 = nn.Parameter(torch.randn(E, EF, D) * 0.02)
        self.w3 = nn.Parameter(torch.randn(E, EF, D) * 0.02)
        self.w2 = nn.Parameter(torch.randn(E, D, EF) * 0.02)

    def forward(self, h):
        x = h.reshape(-1, D)
        logits = self.router(x)
        probs = logits.float().softmax(-1)
        top, idx = logits.topk(K, dim=-1)
        gates = top.float().softmax(-1).to(x.dtype)
        out = torch.zeros_like(x)
        counts = torch.zeros(E, device=x.device)
        for e in range(E):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            counts[e] = tok.numel()
            xe = x.index_select(0, tok)
            ye = (F.silu(xe @ self.w1[e].t()) * (xe @ self.w3[e].t())) @ self.w2[e].t()
            out = out.index_add(0, tok, ye * gates[tok, slot].unsqueeze(-1))
        aux = E * (counts / (x.shape[0] * K) * probs.mean(0)).sum()
        return out.view_as(h), 0.01 * aux


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = RMSNorm(D), RMSNorm(D)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(D, D, bias=False) for _ in range(4))
        self.wk = nn.Linear(D, NKV * HD, bias=False)
        self.wv = nn.Linear(D, NKV * HD, bias=False)
        if E:
            self.moe = MoE()
        else:
            self.w1, self.w3 = nn.Linear(D, FF, bias=False), nn.Linear(D, FF, bias=False)
            self.w2 = nn.Linear(FF, D, bias=False)

    def forward(self, x, cos, sin):
        h = self.n1(x)
        q = rope(self.wq(h).view(B, T, NH, HD), cos, sin).transpose(1, 2)
        k = rope(self.wk(h).view(B, T, NKV, HD), cos, sin).transpose(1, 2)
        v = self.wv(h).view(B, T, NKV, HD).transpose(1, 2)
        a = attention(q, k, v).transpose(1, 2).reshape(B, T, D)
        x = x + self.wo(a)
        h = self.n2(x)
        if E:
            y, aux = self.moe(h)
            return x + y, aux
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h)), 0.0


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
        aux = 0.0
        for layer in self.layers:
            x, a = layer(x, self.cos.to(x.dtype), self.sin.to(x.dtype))
            aux = aux + a
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, V), tgt.view(-1)) + aux


def run(mode):
    torch.manual_seed(0)
    model = Llama().to(DEV)
    n = sum(p.numel() for p in model.parameters())
    if E:  # a token passes through K of the E experts
        n -= sum(p.numel() for name, p in model.named_parameters() if ".moe.w" in name) * (E - K) // E
    cuda = DEV == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, **({"fused": True} if cuda else {}))
    tok = torch.randint(0, V, (B, T), device=DEV)
    tgt = torch.randint(0, V, (B, T), device=DEV)
    if mode == "float8":
        try:
            from torchao.float8 import convert_to_float8_training
        except ImportError as e:
            print(f"torch {shape} float8: torchao is not installed ({e}): nothing run")
            return
        convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn != "head")
    fwd = torch.compile(model) if mode in ("compile", "float8") else model

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext():
            loss = fwd(tok, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(5 if cuda else 1):
        loss = step()
    assert torch.isfinite(loss), loss
    if not cuda:
        print(f"torch {shape} {mode} on {DEV}: loss {loss.item():.3f}, {n / 1e6:.3f}M active params: the script runs")
        return
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
    print(f"torch {shape} {mode}: {tps:,.0f} tokens/s, MFU {100 * tps * flops / 989e12:.1f}%, "
          f"peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB, {n / 1e6:.1f}M active params")


for mode in args or ["eager", "compile"]:
    run(mode)
