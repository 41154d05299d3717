#!/usr/bin/env python3
"""The act-order GPTQ seed of the checkpoint fuzz target:

  fuzz/corpus/checkpoint/gptq_act_order   quant_method "gptq" (v1, asymmetric, groups of 32, desc_act true):
                                          one layer, hidden 64, heads 2/1 (head_dim 32), intermediate 64; each
                                          projection's qweight/qzeros random words, scales F16, and a g_idx that
                                          groups the columns in a random order (q/k/v sharing one, gate/up one),
                                          so the importer sorts columns by group and inserts permute ops

Random codes (not a quantization of anything): the fuzzer mutates the shapes, dtypes and g_idx values.
Run from the repository root: python3 fuzz/data/make_gptq_checkpoint_seeds.py
"""
import json
import struct

import numpy as np

SEP = b"\n#####\n"
H, F, V, NH, NKV, HD, G = 64, 64, 16, 2, 1, 32, 32


def write_st(t):
    hdr, data = {}, bytearray()
    for k in sorted(t):
        dt, a = t[k]
        b = np.ascontiguousarray(a).tobytes()
        hdr[k] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    h = json.dumps(hdr, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + bytes(data)


def main():
    rng = np.random.default_rng(20261204)
    bf16 = lambda *s: ("BF16", (rng.normal(0, 0.02, s).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))
    ones = lambda n: ("BF16", np.full(n, 0x3F80, dtype=np.uint16))
    t = {"model.embed_tokens.weight": bf16(V, H), "lm_head.weight": bf16(V, H), "model.norm.weight": ones(H),
         "model.layers.0.input_layernorm.weight": ones(H), "model.layers.0.post_attention_layernorm.weight": ones(H)}
    orders = {}
    projs = {"self_attn.q_proj": (NH * HD, H, "attn"), "self_attn.k_proj": (NKV * HD, H, "attn"),
             "self_attn.v_proj": (NKV * HD, H, "attn"), "self_attn.o_proj": (H, NH * HD, "o"),
             "mlp.gate_proj": (F, H, "mlp"), "mlp.up_proj": (F, H, "mlp"), "mlp.down_proj": (H, F, "down")}
    for name, (n, k, inp) in projs.items():
        base = "model.layers.0." + name
        if inp not in orders:
            orders[inp] = rng.permutation(k)
        g_idx = np.empty(k, dtype=np.int32)
        g_idx[orders[inp]] = np.arange(k) // G
        words = lambda *s: rng.integers(-2**31, 2**31, s, dtype=np.int64).astype(np.int32)
        t[base + ".qweight"] = ("I32", words(k // 8, n))
        t[base + ".qzeros"] = ("I32", words(k // G, n // 8) & 0x66666666)  # stored zeros 0..6: zero 1..7
        t[base + ".scales"] = ("F16", rng.uniform(0.002, 0.006, (k // G, n)).astype(np.float16))
        t[base + ".g_idx"] = ("I32", g_idx)
    cfg = {"architectures": ["MistralForCausalLM"], "hidden_size": H, "num_hidden_layers": 1,
           "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD, "intermediate_size": F,
           "vocab_size": V, "max_position_embeddings": 32, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
           "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16", "sliding_window": 4,
           "quantization_config": {"bits": 4, "checkpoint_format": "gptq", "desc_act": True, "group_size": G,
                                   "quant_method": "gptq", "static_groups": False, "sym": False,
                                   "true_sequential": True}}
    with open("fuzz/corpus/checkpoint/gptq_act_order", "wb") as f:
        f.write(SEP.join([json.dumps(cfg).encode(), b"", write_st(t)]))


if __name__ == "__main__":
    main()
