"""PyTorch side of trainer/gpu's TestTracksPyTorch: trains the same Llama from the
same initial weights on the same batches, bf16 autocast over fp32 weights (or fp32
throughout when the manifest's bf16 is false), AdamW
with the same hyper-parameters, no weight decay on norm gains and embeddings,
global-norm clipping, constant learning rate; prints one loss per line.

Usage: torch_track.py DIR, where DIR holds manifest.json (model shape, optimizer,
parameter names, shapes and whether each decays, in shardline's table order),
weights.bin (every parameter's fp32 values in that order) and batches.bin (steps ×
2 × B·T int32: tokens then targets of each step)."""
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F

d = sys.argv[1]
man = json.load(open(f"{d}/manifest.json"))
D, L, NH, NKV, FF, V = man["hidden"], man["layers"], man["heads"], man["kv_heads"], man["ffn"], man["vocab"]
B, T, steps, eps_norm, theta = man["B"], man["T"], man["steps"], man["norm_eps"], man["rope_theta"]
HD = D // NH
dev = "cuda"

raw = np.fromfile(f"{d}/weights.bin", dtype=np.float32)
params, at = {}, 0
for p in man["params"]:
    n = int(np.prod(p["shape"]))
    params[p["name"]] = torch.tensor(raw[at : at + n].reshape(p["shape"]), device=dev, requires_grad=True)
    at += n
assert at == raw.size, (at, raw.size)
batches = np.fromfile(f"{d}/batches.bin", dtype=np.int32).reshape(steps, 2, B, T)

t = torch.arange(T, dtype=torch.float64)
inv = theta ** (-torch.arange(0, HD // 2, dtype=torch.float64) * 2 / HD)
ang = torch.outer(t, inv)
cos = ang.cos().float().to(dev)[None, :, None, :]
sin = ang.sin().float().to(dev)[None, :, None, :]


def rms(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps_norm)).to(x.dtype) * w


def rope(x):  # (B, T, H, HD), rotate-half: i pairs with i + HD/2
    x1, x2 = x[..., : HD // 2], x[..., HD // 2 :]
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)


def forward(tok, tgt):
    P = params
    x = P["embed.weight"][tok]
    for l in range(L):
        pre = f"layers.{l}."
        h = rms(x, P[pre + "attn_norm.weight"])
        q = rope((h @ P[pre + "attn.wq"].t()).view(B, T, NH, HD)).transpose(1, 2)
        k = rope((h @ P[pre + "attn.wk"].t()).view(B, T, NKV, HD)).transpose(1, 2)
        v = (h @ P[pre + "attn.wv"].t()).view(B, T, NKV, HD).transpose(1, 2)
        if NKV != NH:
            k, v = k.repeat_interleave(NH // NKV, 1), v.repeat_interleave(NH // NKV, 1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, NH * HD)
        x = x + a @ P[pre + "attn.wo"].t()
        h = rms(x, P[pre + "mlp_norm.weight"])
        x = x + (F.silu(h @ P[pre + "mlp.w1"].t()) * (h @ P[pre + "mlp.w3"].t())) @ P[pre + "mlp.w2"].t()
    head = P["output.weight"] if "output.weight" in P else P["embed.weight"]
    logits = rms(x, P["norm.weight"]) @ head.t()
    return F.cross_entropy(logits.float().view(-1, V), tgt.view(-1))


decay = [params[p["name"]] for p in man["params"] if p["decay"]]
nodecay = [params[p["name"]] for p in man["params"] if not p["decay"]]
o = man["optimizer"]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]}, {"params": nodecay, "weight_decay": 0.0}],
                        lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"], fused=True)
for s in range(steps):
    tok = torch.tensor(batches[s, 0], device=dev, dtype=torch.long)
    tgt = torch.tensor(batches[s, 1], device=dev, dtype=torch.long)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=man["bf16"]):
        loss = forward(tok, tgt)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(list(params.values()), o["clip"])
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"{loss.item():.6f}", flush=True)
