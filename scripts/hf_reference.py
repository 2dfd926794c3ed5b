#!/usr/bin/env python3
"""An outside check of `shardline ckpt export`: the forward passes of Hugging Face's
LlamaForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3ForCausalLM,
Qwen3MoeForCausalLM, Llama4ForCausalLM and Glm4MoeForCausalLM, written here from
their published definitions (transformers' modeling_llama.py,
modeling_mixtral.py, modeling_qwen2_moe.py, modeling_qwen3.py,
modeling_qwen3_moe.py, modeling_llama4.py and configuration_llama4.py,
modeling_glm4_moe.py: RMSNorm, rotate-half RoPE over the first
partial_rotary_factor of each head, Qwen3's and Glm4Moe's (use_qk_norm) RMSNorm
of each head's queries and keys before it, grouped-query attention with key and
value heads repeated per group, SwiGLU MLPs, softmax-top-k routing with the
top-k weights renormalised (Mixtral) or as norm_topk_prob says (Qwen2-MoE,
Qwen3-MoE), Qwen2-MoE's sigmoid-gated shared expert; Llama 4's RoPE over
adjacent pairs on its no_rope_layers, weightless L2 QK-norm after it, NoPE
layers' temperature tuning, chunked causal masks on its chunked_attention
layers, sigmoid top-k router scaling the token before its expert, fused
gate_up_proj/down_proj experts and a shared expert; and Glm4Moe's DeepSeek-V3
router: sigmoid scores, e_score_correction_bias added for the choice only,
n_group groups scored by their two best, topk_group kept, the other experts'
scores filled with 0.0 as transformers 4.5x does, top-k, weights renormalised
as norm_topk_prob says and scaled by routed_scaling_factor, shared experts
without a gate, the first first_k_dense_replace layers dense), in float64, over
an exported directory read with a plain-Python safetensors parser.

usage: hf_reference.py MODEL_DIR CASE.json TOLERANCE [MODEL_DIR CASE.json TOLERANCE ...]
CASE.json holds {"tokens": [...], "logits": [[...], ...]} from shardline; the script
prints, for each model in the order given, its largest absolute difference of the
logits on a line of its own, and exits 1 if any is past its TOLERANCE. (Several
models in one run import torch once: seconds saved per model.)
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


def inv_freq(hd, theta, scaling=None):
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    if scaling and scaling.get("rope_type") == "llama3":
        # transformers' _compute_llama3_parameters, with config.json's four numbers
        # (Llama 4's low == high makes the blend 0/0 or inf, but torch.where keeps
        # it only at wavelen == old / low exactly, which no test frequency is)
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * torch.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        inv = torch.where(medium, blended, scaled)
    return inv


def rope(x, theta, scaling=None, partial=1.0):
    # x (T, heads, head_dim); the first partial·head_dim dimensions turn, rotate_half
    # pairing element i with i + rotary_dim/2; the others pass.
    if partial != 1.0:
        rd = int(x.shape[-1] * partial)
        return torch.cat([rope(x[..., :rd], theta, scaling), x[..., rd:]], dim=-1)
    T, _, hd = x.shape
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq(hd, theta, scaling))
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


def llama4_layers(c):
    # Llama4TextConfig.__post_init__: no_rope_layers (1: the layer uses RoPE),
    # every no_rope_layer_interval-th layer NoPE when absent or empty; moe_layers,
    # every interleave_moe_layer_step-th when absent; layer_types, the RoPE
    # layers chunked when absent.
    L = c["num_hidden_layers"]
    rope_layers = c.get("no_rope_layers") or [int((l + 1) % c.get("no_rope_layer_interval", 4) != 0) for l in range(L)]
    moe_layers = c.get("moe_layers")
    if moe_layers is None:
        step = c.get("interleave_moe_layer_step", 1)
        moe_layers = list(range(step - 1, L, step))
    types = c.get("layer_types") or ["chunked_attention" if r else "full_attention" for r in rope_layers]
    return rope_layers, moe_layers, types


def rope_complex(x, theta, scaling=None):
    # Llama 4's apply_rotary_emb: adjacent elements (2i, 2i+1) are one complex
    # number, turned by position × frequency i.
    T, n, hd = x.shape
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq(hd, theta, scaling))
    z = torch.view_as_complex(x.reshape(T, n, hd // 2, 2).contiguous())
    return torch.view_as_real(z * torch.polar(torch.ones_like(ang), ang)[:, None, :]).reshape(T, n, hd)


def llama4_attention(x, w, pre, c, layer):
    T = x.shape[0]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim", 128)
    rope_layers, _, types = llama4_layers(c)
    use_rope = bool(rope_layers[layer])
    q = linear(x, w[pre + "q_proj.weight"]).view(T, nh, hd)
    k = linear(x, w[pre + "k_proj.weight"]).view(T, nkv, hd)
    v = linear(x, w[pre + "v_proj.weight"]).view(T, nkv, hd)
    if use_rope:
        scaling = c.get("rope_scaling")
        q, k = rope_complex(q, c["rope_theta"], scaling), rope_complex(k, c["rope_theta"], scaling)
    if c.get("use_qk_norm", True) and use_rope:  # Llama4TextL2Norm: no weight, after RoPE
        eps = c["rms_norm_eps"]
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + eps)
        k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps)
    if c.get("attn_temperature_tuning", True) and not use_rope:
        pos = torch.arange(T, dtype=torch.float64)
        scale = torch.log1p(torch.floor((pos + 1.0) / c.get("floor_scale", 8192))) * c.get("attn_scale", 0.1) + 1.0
        q = q * scale[:, None, None]
    rep = nh // nkv
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = torch.einsum("thd,uhd->htu", q, k) * hd**-0.5
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    hidden = j > i
    if types[layer] == "chunked_attention":  # chunked_causal_mask_function: the same chunk of attention_chunk_size
        C = c.get("attention_chunk_size", 8192)
        hidden = hidden | (i // C != j // C)
    s = s.masked_fill(hidden, float("-inf"))
    o = torch.einsum("htu,uhd->thd", s.softmax(-1), v).reshape(T, nh * hd)
    return linear(o, w[pre + "o_proj.weight"])


def llama4_feed_forward(x, w, layer, c):
    m = f"model.layers.{layer}.feed_forward."
    _, moe_layers, _ = llama4_layers(c)
    if layer not in moe_layers:
        return swiglu(x, w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"])
    # Llama4Router: the top num_experts_per_tok logits through a sigmoid, the
    # others' scores 0; each expert sees the token times its score (Llama4TextMoe),
    # and the shared expert the token, all summed.
    logits = linear(x, w[m + "router.weight"])
    top, idx = logits.topk(c.get("num_experts_per_tok", 1), dim=-1)
    scores = torch.full_like(logits, float("-inf")).scatter(1, idx, top).sigmoid()
    gate_up, down = w[m + "experts.gate_up_proj"], w[m + "experts.down_proj"]  # (E, h, 2f), (E, f, h)
    out = swiglu(x, w[m + "shared_expert.gate_proj.weight"], w[m + "shared_expert.up_proj.weight"], w[m + "shared_expert.down_proj.weight"])
    for e in range(gate_up.shape[0]):
        gate, up = ((x * scores[:, e : e + 1]) @ gate_up[e]).chunk(2, dim=-1)
        out = out + (up * torch.nn.functional.silu(gate)) @ down[e]
    return out


def forward(w, c, tokens):
    x = w["model.embed_tokens.weight"][torch.tensor(tokens)]
    for l in range(c["num_hidden_layers"]):
        pre = f"model.layers.{l}."
        if c["model_type"] == "llama4_text":
            x = x + llama4_attention(rms_norm(x, w[pre + "input_layernorm.weight"], c["rms_norm_eps"]), w, pre + "self_attn.", c, l)
            x = x + llama4_feed_forward(rms_norm(x, w[pre + "post_attention_layernorm.weight"], c["rms_norm_eps"]), w, l, c)
            continue
        x = x + attention(rms_norm(x, w[pre + "input_layernorm.weight"], c["rms_norm_eps"]), w, pre + "self_attn.", c)
        x = x + mlp(rms_norm(x, w[pre + "post_attention_layernorm.weight"], c["rms_norm_eps"]), w, l, c)
    x = rms_norm(x, w["model.norm.weight"], c["rms_norm_eps"])
    head = w["model.embed_tokens.weight"] if c["tie_word_embeddings"] else w["lm_head.weight"]
    return linear(x, head)


def check(model_dir, case_path, tol):
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    with open(case_path) as f:
        case = json.load(f)
    logits = forward(read_model(model_dir), c, case["tokens"])
    diff = (logits - torch.tensor(case["logits"], dtype=torch.float64)).abs().max().item()
    print(f"{model_dir}: {c['architectures'][0]}: largest logit difference {diff:.3g} (tolerance {tol:g})", flush=True)
    return diff <= tol


def main():
    args = sys.argv[1:]
    if not args or len(args) % 3:
        sys.exit(__doc__)
    ok = [check(args[i], args[i + 1], float(args[i + 2])) for i in range(0, len(args), 3)]
    sys.exit(0 if all(ok) else 1)


if __name__ == "__main__":
    main()
