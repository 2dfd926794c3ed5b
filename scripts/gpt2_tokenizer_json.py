#!/usr/bin/env python3
"""Build GPT-2's tokenizer.json for Hugging Face's tokenizers from the ranks
scripts/gpt2vocab prints (stdin), to stdout: byte-level BPE, the merges
recovered from the ranks as tiktoken's conversion does (each token's merge is
the last step of byte-pair encoding it with the tokens ranked below it)."""
import json, sys

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))

ranks = {}
for line in sys.stdin:
    i, h = line.split()
    ranks[bytes.fromhex(h)] = int(i)

def bpe(token, max_rank):
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best[1]):
                best = (i, r)
        if best is None:
            return parts
        i = best[0]
        parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2:]

u = bytes_to_unicode()
enc = lambda b: "".join(u[x] for x in b)
vocab = {enc(t): r for t, r in ranks.items()}
vocab["<|endoftext|>"] = 50256
merges = []
for t, r in sorted(ranks.items(), key=lambda kv: kv[1]):
    if len(t) > 1:
        a, b = bpe(t, r)
        merges.append(enc(a) + " " + enc(b))
json.dump({
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [{"id": 50256, "content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": True, "special": True}],
    "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    "post_processor": None,
    "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
              "vocab": vocab, "merges": merges},
}, sys.stdout)
