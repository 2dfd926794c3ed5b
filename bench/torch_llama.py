#!/usr/bin/env python3
"""The shardline CPU model in PyTorch, for `make bench`: same architecture (token
embedding, RMSNorm, RoPE with rotate-half, grouped-query causal attention, SwiGLU
MLP, final RMSNorm, untied output head, cross-entropy), same shape, and a full
training step (forward, backward, AdamW). Prints tokens/s for each thread count
tried and the best, as JSON on the last line.

Usage: torch_llama.py [--layers 4 --hidden 128 --heads 4 --kv-heads 4 --ffn 384
                       --vocab 65 --seq 64 --batch 12 --steps 60 --warmup 10]
"""
import argparse, json, math, statistics, time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(T, hd, theta=10000.0):
    inv = theta ** (-torch.arange(0, hd // 2, dtype=torch.float32) * 2 / hd)
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


def rope(x, cos, sin):  # x: (B, H, T, hd); rotate element i with i + hd/2
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Block(nn.Module):
    def __init__(s, C, nh, nkv, ffn):
        super().__init__()
        s.nh, s.nkv, s.hd = nh, nkv, C // nh
        s.n1, s.n2 = RMSNorm(C), RMSNorm(C)
        s.wq = nn.Linear(C, nh * s.hd, bias=False)
        s.wk = nn.Linear(C, nkv * s.hd, bias=False)
        s.wv = nn.Linear(C, nkv * s.hd, bias=False)
        s.wo = nn.Linear(nh * s.hd, C, bias=False)
        s.w1 = nn.Linear(C, ffn, bias=False)
        s.w3 = nn.Linear(C, ffn, bias=False)
        s.w2 = nn.Linear(ffn, C, bias=False)
        s.register_buffer("mask", torch.ones(4096, 4096, dtype=torch.bool).triu(1)[:512, :512], persistent=False)

    def forward(s, x, cos, sin):
        B, T, C = x.shape
        h = s.n1(x)
        q = s.wq(h).view(B, T, s.nh, s.hd).transpose(1, 2)
        k = s.wk(h).view(B, T, s.nkv, s.hd).transpose(1, 2)
        v = s.wv(h).view(B, T, s.nkv, s.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        if s.nkv != s.nh:
            k = k.repeat_interleave(s.nh // s.nkv, dim=1)
            v = v.repeat_interleave(s.nh // s.nkv, dim=1)
        # Written out (Debian's PyTorch 1.13 predates scaled_dot_product_attention).
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(s.hd))
        att = att.masked_fill(s.mask[:T, :T], float("-inf")).softmax(dim=-1)
        y = att @ v
        x = x + s.wo(y.transpose(1, 2).reshape(B, T, C))
        h = s.n2(x)
        return x + s.w2(F.silu(s.w1(h)) * s.w3(h))


class Llama(nn.Module):
    def __init__(s, a):
        super().__init__()
        s.embed = nn.Embedding(a.vocab, a.hidden)
        s.blocks = nn.ModuleList(Block(a.hidden, a.heads, a.kv_heads, a.ffn) for _ in range(a.layers))
        s.norm = RMSNorm(a.hidden)
        s.out = nn.Linear(a.hidden, a.vocab, bias=False)
        cos, sin = rope_tables(a.seq, a.hidden // a.heads)
        s.register_buffer("cos", cos)
        s.register_buffer("sin", sin)

    def forward(s, idx, targets):
        x = s.embed(idx)
        for b in s.blocks:
            x = b(x, s.cos, s.sin)
        logits = s.out(s.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def measure(a, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Llama(a)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
    y = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    return a.batch * a.seq / statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    for name, default in [("layers", 4), ("hidden", 128), ("heads", 4), ("kv-heads", 4), ("ffn", 384),
                          ("vocab", 65), ("seq", 64), ("batch", 12), ("steps", 60), ("warmup", 10)]:
        p.add_argument("--" + name, type=int, default=default)
    a = p.parse_args()
    res = {}
    for th in (1, 2):
        res[th] = measure(a, th)
        print(f"pytorch {torch.__version__} threads={th}: {res[th]:.0f} tokens/s")
    best = max(res, key=res.get)
    print(json.dumps({"torch": torch.__version__, "threads": best, "tokens_per_s": res[best],
                      "blas": torch.__config__.show().count("OpenBLAS") > 0}))


if __name__ == "__main__":
    main()
