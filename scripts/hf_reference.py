#!/usr/bin/env python3
"""An outside check of `shardline ckpt export`: the forward passes of Hugging Face's
LlamaForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3ForCausalLM,
Qwen3MoeForCausalLM and Glm4MoeForCausalLM, written here from their published
definitions (transformers' modeling_llama.py, modeling_mixtral.py,
modeling_qwen2_moe.py, modeling_qwen3.py, modeling_qwen3_moe.py,
modeling_glm4_moe.py: RMSNorm, rotate-half RoPE over the first
partial_rotary_factor of each head, Qwen3's and Glm4Moe's (use_qk_norm) RMSNorm
of each head's queries and keys before it, grouped-query attention with key and
value heads repeated per group, SwiGLU MLPs, softmax-top-k routing with the
top-k weights renormalised (Mixtral) or as norm_topk_prob says (Qwen2-MoE,
Qwen3-MoE), Qwen2-MoE's sigmoid-gated shared expert, and Glm4Moe's DeepSeek-V3
router: sigmoid scores, e_score_correction_bias added for the choice only,
n_group groups scored by their two best, topk_group kept, the other experts'
scores filled with 0.0 as transformers 4.5x does, top-k, weights renormalised
as norm_topk_prob says and scaled by routed_scaling_factor, shared experts
without a gate, the first first_k_dense_replace layers dense), in float64, over
an exported directory read with a plain-Python safetensors parser.

usage: hf_reference.py MODEL_DIR CASE.json TOLERANCE
CASE.json holds {"tokens": [...], "logits": [[...], ...]} from shardline; the script
prints the largest absolute difference of the logits and exits 1 past TOLERANCE.
"""
import json
import os
import struct
import sys

import torch


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        assert entry["dtype"] == "F32", entry["dtype"]
        if begin == end:  # an empty tensor (a shared expert of width 0)
            out[name] = torch.zeros(entry["shape"], dtype=torch.float64)
            continue
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32)
        out[name] = t.reshape(entry["shape"]).to(torch.float64)
    return out


def read_model(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for f in files:
        w.update(read_safetensors(os.path.join(d, f)))
    return w


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x, theta, scaling=None, partial=1.0):
    # x (T, heads, head_dim); the first partial·head_dim dimensions turn, rotate_half
    # pairing element i with i + rotary_dim/2; the others pass.
    if partial != 1.0:
        rd = int(x.shape[-1] * partial)
        return torch.cat([rope(x[..., :rd], theta, scaling), x[..., rd:]], dim=-1)
    T, _, hd = x.shape
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    if scaling and scaling.get("rope_type") == "llama3":
        # transformers' _compute_llama3_parameters
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * torch.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        inv = torch.where(medium, blended, scaled)
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    rotated = torch.cat([-x[..., hd // 2 :], x[..., : hd // 2]], dim=-1)
    return x * cos + rotated * sin


def linear(x, w, b=None):
    y = x @ w.T
    return y if b is None else y + b


def swiglu(x, gate, up, down):
    return linear(torch.nn.functional.silu(linear(x, gate)) * linear(x, up), down)


def attention(x, w, pre, c):
    T = x.shape[0]
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    q = linear(x, w[pre + "q_proj.weight"], w.get(pre + "q_proj.bias")).view(T, nh, hd)
    k = linear(x, w[pre + "k_proj.weight"], w.get(pre + "k_proj.bias")).view(T, nkv, hd)
    v = linear(x, w[pre + "v_proj.weight"], w.get(pre + "v_proj.bias")).view(T, nkv, hd)
    if pre + "q_norm.weight" in w:  # Qwen3, Glm4Moe: RMSNorm over each head's head_dim, before RoPE
        q = rms_norm(q, w[pre + "q_norm.weight"], c["rms_norm_eps"])
        k = rms_norm(k, w[pre + "k_norm.weight"], c["rms_norm_eps"])
    part = c.get("partial_rotary_factor", 1.0)
    q, k = rope(q, c["rope_theta"], c.get("rope_scaling"), part), rope(k, c["rope_theta"], c.get("rope_scaling"), part)
    rep = nh // nkv  # repeat_kv: query head h reads key/value head h // rep
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = torch.einsum("thd,uhd->htu", q, k) / hd**0.5
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    o = torch.einsum("htu,uhd->thd", s.softmax(-1), v).reshape(T, nh * hd)
    return linear(o, w[pre + "o_proj.weight"])


def combine(x, idx, top, expert, n):
    # Each token's chosen experts' outputs, weighed by top.
    out = torch.zeros_like(x)
    for e in range(n):
        rows, slot = (idx == e).nonzero(as_tuple=True)
        if len(rows):
            out[rows] += top[rows, slot, None] * expert(e, x[rows])
    return out


def routed(x, w, gate_name, expert, n, k, norm=True):
    probs = linear(x, w[gate_name]).softmax(-1)
    top, idx = probs.topk(k, dim=-1)
    if norm:
        top = top / top.sum(-1, keepdim=True)  # renormalised top-k weights
    return combine(x, idx, top, expert, n)


def sigmoid_routed(x, w, m, c):
    # Glm4MoeMoE.route_tokens_to_experts (DeepseekV3's): the bias only chooses.
    n, k, groups, keep = c["n_routed_experts"], c["num_experts_per_tok"], c["n_group"], c["topk_group"]
    scores = linear(x, w[m + "gate.weight"]).sigmoid()
    choice = scores + w[m + "gate.e_score_correction_bias"]
    group_scores = choice.view(-1, groups, n // groups).topk(2, dim=-1)[0].sum(-1)
    mask = torch.zeros_like(group_scores, dtype=torch.bool)
    mask.scatter_(1, group_scores.topk(keep, dim=-1)[1], True)
    mask = mask.unsqueeze(-1).expand(-1, groups, n // groups).reshape(-1, n)
    choice = choice.masked_fill(~mask, 0.0)
    idx = choice.topk(k, dim=-1)[1]
    top = scores.gather(1, idx)
    if c["norm_topk_prob"]:
        top = top / (top.sum(-1, keepdim=True) + 1e-20)
    top = top * c["routed_scaling_factor"]
    out = combine(x, idx, top, lambda e, h: swiglu(h, w[f"{m}experts.{e}.gate_proj.weight"], w[f"{m}experts.{e}.up_proj.weight"], w[f"{m}experts.{e}.down_proj.weight"]), n)
    return out + swiglu(x, w[m + "shared_experts.gate_proj.weight"], w[m + "shared_experts.up_proj.weight"], w[m + "shared_experts.down_proj.weight"])


def mlp(x, w, layer, c):
    pre = f"model.layers.{layer}."
    arch = c["model_type"]
    if arch == "mixtral":
        m = pre + "block_sparse_moe."
        return routed(x, w, m + "gate.weight",
                      lambda e, h: swiglu(h, w[f"{m}experts.{e}.w1.weight"], w[f"{m}experts.{e}.w3.weight"], w[f"{m}experts.{e}.w2.weight"]),
                      c["num_local_experts"], c["num_experts_per_tok"])
    m = pre + "mlp."
    if arch == "glm4_moe" and layer >= c["first_k_dense_replace"]:
        return sigmoid_routed(x, w, m, c)
    if arch in ("qwen2_moe", "qwen3_moe") and (layer + 1) % c["decoder_sparse_step"] == 0:
        out = routed(x, w, m + "gate.weight",
                     lambda e, h: swiglu(h, w[f"{m}experts.{e}.gate_proj.weight"], w[f"{m}experts.{e}.up_proj.weight"], w[f"{m}experts.{e}.down_proj.weight"]),
                     c["num_experts"], c["num_experts_per_tok"], c["norm_topk_prob"])
        if arch == "qwen3_moe":
            return out
        shared = swiglu(x, w[m + "shared_expert.gate_proj.weight"], w[m + "shared_expert.up_proj.weight"], w[m + "shared_expert.down_proj.weight"])
        return out + torch.sigmoid(linear(x, w[m + "shared_expert_gate.weight"])) * shared
    return swiglu(x, w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"])


def forward(w, c, tokens):
    x = w["model.embed_tokens.weight"][torch.tensor(tokens)]
    for l in range(c["num_hidden_layers"]):
        pre = f"model.layers.{l}."
        x = x + attention(rms_norm(x, w[pre + "input_layernorm.weight"], c["rms_norm_eps"]), w, pre + "self_attn.", c)
        x = x + mlp(rms_norm(x, w[pre + "post_attention_layernorm.weight"], c["rms_norm_eps"]), w, l, c)
    x = rms_norm(x, w["model.norm.weight"], c["rms_norm_eps"])
    head = w["model.embed_tokens.weight"] if c["tie_word_embeddings"] else w["lm_head.weight"]
    return linear(x, head)


def main():
    model_dir, case_path, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    with open(case_path) as f:
        case = json.load(f)
    logits = forward(read_model(model_dir), c, case["tokens"])
    diff = (logits - torch.tensor(case["logits"], dtype=torch.float64)).abs().max().item()
    print(f"{c['architectures'][0]}: largest logit difference {diff:.3g} (tolerance {tol:g})")
    sys.exit(0 if diff <= tol else 1)


if __name__ == "__main__":
    main()
