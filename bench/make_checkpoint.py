#!/usr/bin/env python3
"""Write a random-weight HuggingFace checkpoint of a real model's shapes.

kiln's benchmarks time real shapes on random weights (../shared/BENCHMARKS.md:
normal(0, 0.02), bf16, never zeros). This script writes such a checkpoint the
way transformers' save_pretrained lays it out, without building the model:

  OUT/config.json                       the model's config, in the transformers
                                        4.x form the published checkpoints use
                                        (top-level rope_theta / rope_scaling,
                                        torch_dtype); transformers 5 and kiln
                                        both read it
  OUT/model-0000i-of-0000n.safetensors  shards of at most --shard-size bytes,
  OUT/model.safetensors.index.json      filled in state-dict order as
                                        huggingface_hub's splitter does; one
                                        shard is written as model.safetensors
                                        with no index
  OUT/random_weights.json               how the weights were made (arch, seed,
                                        std, device, generator)

Weights: every matrix ~ normal(0, 0.02); RMSNorm weights ~ normal(1, 0.02).
They are drawn on the GPU when there is one (torch.Generator seeded with
--seed, one stream in state-dict order), so the same seed on the same kind of
device gives the same checkpoint; CPU and GPU draws differ.

Speed: tensors of one shard are drawn on the GPU, copied to host memory, and
handed to a writer thread (safetensors.torch.save_file) while the next shard
is drawn. Mistral-7B (14.5 GB) is meant to take well under a minute on a
16-core host with an H200 writing into the page cache.

With --fp8-block BN the projections (q/k/v/o, gate/up/down; not the
embedding, the LM head or experts) are written as a block-FP8 checkpoint
does it (DeepSeek-V3, Qwen3-FP8, transformers' FineGrainedFP8): <proj>.weight
F8_E4M3 and <proj>.weight_scale_inv F32 [out/BN, in/128], each block's scale
max|w| / 448 and the codes torch's float8_e4m3fn cast of w / scale, with
quantization_config {"quant_method": "fp8", "fmt": "e4m3",
"activation_scheme": "dynamic", "weight_block_size": [BN, 128]}.

With --gptq G the projections are written as a GPTQ v1 checkpoint
(AutoGPTQ/GPTQModel's layout: <proj>.qweight I32 [in/8, out], .qzeros I32
[in/G, out/8], .scales F16 [in/G, out], .g_idx I32 [in]) of random codes,
zeros and scales (about normal(0, 0.02)'s spread), asymmetric, groups of G;
with --act-order too, desc_act true and each input's columns grouped in a
random order (g_idx[order[j]] = j // G, q/k/v sharing one order and gate/up
one, as GPTQ orders a layer's columns by the Hessian of its input). For
speed runs only: the codes are not a quantization of anything.

Usage:
  python3 bench/make_checkpoint.py --arch mistral-7b --out /tmp/mistral-7b
  python3 bench/make_checkpoint.py --arch llama-3.1-8b --layers 4 --out /tmp/llama-4l
  python3 bench/make_checkpoint.py --arch tiny --out /tmp/tiny --shard-size 20000
Prints one JSON line at the end: {"checkpoint", "arch", "params", "bytes",
"shards", "seconds", "device"}.
"""

import argparse
import concurrent.futures
import json
import os
import sys
import time

import torch
from safetensors.torch import save_file

# The model shapes. Values are those of the published config.json files
# (mistralai/Mistral-7B-v0.1, meta-llama/Llama-3.1-8B, Qwen/Qwen3-8B, Qwen/Qwen2.5-7B,
# mistralai/Mixtral-8x7B-v0.1, Qwen/Qwen3-30B-A3B); "tiny", "tiny-llama3", "tiny-qwen3", "tiny-qwen2" and
# "tiny-mixtral" are for tests (a few hundred KB), "tiny-gqa128" too (4.7 MB: head_dim 128).
ARCHS = {
    "mistral-7b": dict(
        architectures=["MistralForCausalLM"], model_type="mistral",
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, vocab_size=32000, max_position_embeddings=32768,
        rope_theta=10000.0, sliding_window=4096, rms_norm_eps=1e-5,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False),
    "llama-3.1-8b": dict(
        architectures=["LlamaForCausalLM"], model_type="llama",
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, vocab_size=128256, max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192, rope_type="llama3"),
        rms_norm_eps=1e-5, bos_token_id=128000, eos_token_id=128001, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False),
    # Llama-3.1-70B's shapes (141 GB in bf16 at 80 layers: use --layers to fit a disk)
    "llama-3.1-70b": dict(
        architectures=["LlamaForCausalLM"], model_type="llama",
        hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
        intermediate_size=28672, vocab_size=128256, max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192, rope_type="llama3"),
        rms_norm_eps=1e-5, bos_token_id=128000, eos_token_id=128001, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False),
    "tiny": dict(
        architectures=["MistralForCausalLM"], model_type="mistral",
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=160, vocab_size=256, max_position_embeddings=512,
        rope_theta=10000.0, sliding_window=64, rms_norm_eps=1e-5,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False),
    # the tensor-core decode attention's shapes (4 query heads a kv head, head_dim 128) at a tiny size,
    # for test_gpu_exec's test_decode_tc
    "tiny-gqa128": dict(
        architectures=["LlamaForCausalLM"], model_type="llama",
        hidden_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        intermediate_size=256, vocab_size=256, max_position_embeddings=1024, rope_theta=500000.0,
        rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False),
    "tiny-llama3": dict(
        architectures=["LlamaForCausalLM"], model_type="llama",
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=160, vocab_size=256, max_position_embeddings=1024,
        rope_theta=500000.0,
        rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=128, rope_type="llama3"),
        rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False),
    # Qwen/Qwen3-8B: per-head q/k RMSNorm, explicit head_dim
    "qwen3-8b": dict(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3",
        hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        intermediate_size=12288, vocab_size=151936, max_position_embeddings=40960,
        rope_theta=1000000.0, rms_norm_eps=1e-6, attention_bias=False, use_sliding_window=False,
        sliding_window=None, max_window_layers=36,
        bos_token_id=151643, eos_token_id=151645, tie_word_embeddings=False),
    # Qwen/Qwen2.5-7B: biases on q, k, v
    "qwen2.5-7b": dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2",
        hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
        intermediate_size=18944, vocab_size=152064, max_position_embeddings=131072,
        rope_theta=1000000.0, rms_norm_eps=1e-6, use_sliding_window=False, sliding_window=131072,
        max_window_layers=28, bos_token_id=151643, eos_token_id=151643, tie_word_embeddings=False),
    # GPU tests of the Qwen paths: head_dim 32 (a power of two the GPU kernels take, not hidden / heads),
    # and Qwen2 with a window on layer 1 only
    "tiny-qwen3": dict(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3",
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        intermediate_size=160, vocab_size=256, max_position_embeddings=1024,
        rope_theta=1000000.0, rms_norm_eps=1e-6, attention_bias=False, use_sliding_window=False,
        sliding_window=None, max_window_layers=2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False),
    # mistralai/Mixtral-8x7B-v0.1: 8 experts, top 2 (published per-expert form: block_sparse_moe.experts.e.w1/w3/w2)
    "mixtral-8x7b": dict(
        architectures=["MixtralForCausalLM"], model_type="mixtral",
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, vocab_size=32000, max_position_embeddings=32768,
        num_local_experts=8, num_experts_per_tok=2, router_jitter_noise=0.0,
        rope_theta=1000000.0, sliding_window=None, rms_norm_eps=1e-5,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False),
    # Qwen/Qwen3-30B-A3B: 128 experts of width 768, top 8, renormalised; Qwen3 attention
    "qwen3-30b-a3b": dict(
        architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
        hidden_size=2048, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        intermediate_size=6144, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], vocab_size=151936,
        max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6, attention_bias=False,
        use_sliding_window=False, sliding_window=None, max_window_layers=48,
        bos_token_id=151643, eos_token_id=151645, tie_word_embeddings=False),
    "tiny-mixtral": dict(
        architectures=["MixtralForCausalLM"], model_type="mixtral",
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, vocab_size=256, max_position_embeddings=1024,
        num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.0,
        rope_theta=1000000.0, sliding_window=None, rms_norm_eps=1e-5,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False),
    "tiny-qwen2": dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2",
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=160, vocab_size=256, max_position_embeddings=1024,
        rope_theta=1000000.0, rms_norm_eps=1e-6, use_sliding_window=True, sliding_window=64,
        max_window_layers=1, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True),
}

DTYPES = {"bf16": (torch.bfloat16, "bfloat16"), "f16": (torch.float16, "float16"),
          "f32": (torch.float32, "float32")}

WEIGHT_STD = 0.02   # matrices: normal(0, 0.02), BENCHMARKS.md
NORM_STD = 0.02     # RMSNorm weights: normal(1, 0.02)

# transformers' save_pretrained default, in bytes ("5GB" = 5 * 10**9).
DEFAULT_SHARD_SIZE = 5 * 10**9


def make_config(arch, layers, dtype_name):
    """config.json as a dict, in the 4.x form of the published checkpoints."""
    c = dict(ARCHS[arch])
    if layers is not None:
        c["num_hidden_layers"] = layers
    c.update(hidden_act="silu", initializer_range=0.02, attention_dropout=0.0,
             torch_dtype=dtype_name, use_cache=True)
    return dict(sorted(c.items()))


def tensor_plan(cfg):
    """(name, shape, kind) in HF state-dict order; kind is "matrix" or "norm"."""
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or d // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    qwen2 = cfg["architectures"][0] == "Qwen2ForCausalLM"
    qwen3 = cfg["architectures"][0] in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
    plan = [("model.embed_tokens.weight", (v, d), "matrix")]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        plan += [
            (p + "self_attn.q_proj.weight", (q, d), "matrix"),
            (p + "self_attn.k_proj.weight", (kv, d), "matrix"),
            (p + "self_attn.v_proj.weight", (kv, d), "matrix"),
        ]
        if qwen2:  # biases ~ normal(0, 0.02) like the matrices
            plan += [(p + "self_attn.q_proj.bias", (q,), "matrix"), (p + "self_attn.k_proj.bias", (kv,), "matrix"),
                     (p + "self_attn.v_proj.bias", (kv,), "matrix")]
        if qwen3:
            plan += [(p + "self_attn.q_norm.weight", (hd,), "norm"), (p + "self_attn.k_norm.weight", (hd,), "norm")]
        plan.append((p + "self_attn.o_proj.weight", (d, q), "matrix"))
        experts = cfg.get("num_local_experts") or cfg.get("num_experts")
        if experts and cfg["architectures"][0] == "MixtralForCausalLM":  # the published per-expert form
            plan.append((p + "block_sparse_moe.gate.weight", (experts, d), "matrix"))
            for e in range(experts):
                b = p + "block_sparse_moe.experts.%d." % e
                plan += [(b + "w1.weight", (f, d), "matrix"), (b + "w2.weight", (d, f), "matrix"),
                         (b + "w3.weight", (f, d), "matrix")]
        elif experts:  # Qwen3-MoE, every layer sparse (decoder_sparse_step 1, no mlp_only_layers)
            fe = cfg["moe_intermediate_size"]
            plan.append((p + "mlp.gate.weight", (experts, d), "matrix"))
            for e in range(experts):
                b = p + "mlp.experts.%d." % e
                plan += [(b + "gate_proj.weight", (fe, d), "matrix"), (b + "up_proj.weight", (fe, d), "matrix"),
                         (b + "down_proj.weight", (d, fe), "matrix")]
        else:
            plan += [(p + "mlp.gate_proj.weight", (f, d), "matrix"), (p + "mlp.up_proj.weight", (f, d), "matrix"),
                     (p + "mlp.down_proj.weight", (d, f), "matrix")]
        plan += [(p + "input_layernorm.weight", (d,), "norm"), (p + "post_attention_layernorm.weight", (d,), "norm")]
    plan.append(("model.norm.weight", (d,), "norm"))
    if not cfg["tie_word_embeddings"]:
        plan.append(("lm_head.weight", (v, d), "matrix"))
    return plan


def is_proj(name):
    """a dense layer's projection (what block-FP8 checkpoints quantize): q/k/v/o and gate/up/down"""
    return ".experts." not in name and name.endswith(("_proj.weight",)) and (".self_attn." in name or ".mlp." in name)


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def split_shards(plan, elem_bytes, max_bytes):
    """Greedy split in state-dict order, as huggingface_hub's
    split_torch_state_dict_into_shards does: a tensor that would overflow the
    current (non-empty) shard starts a new one; a tensor larger than the limit
    gets a shard of its own."""
    shards, cur, cur_bytes = [], [], 0
    for item in plan:
        b = numel(item[1]) * elem_bytes
        if cur and cur_bytes + b > max_bytes:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(item)
        cur_bytes += b
    if cur:
        shards.append(cur)
    return shards


def parse_size(s):
    """'5GB' -> 5e9, '500MB', '20000' (bytes)."""
    s = s.strip().upper()
    for suf, mul in (("GIB", 2**30), ("MIB", 2**20), ("KIB", 2**10), ("GB", 10**9), ("MB", 10**6),
                     ("KB", 10**3), ("B", 1)):
        if s.endswith(suf):
            return int(float(s[: -len(suf)]) * mul)
    return int(s)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", required=True, choices=sorted(ARCHS))
    ap.add_argument("--out", required=True, help="output directory (created; existing checkpoint files replaced)")
    ap.add_argument("--layers", type=int, default=None, help="override num_hidden_layers (for fast runs)")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-size", default=str(DEFAULT_SHARD_SIZE),
                    help="max bytes per shard, e.g. 5GB (default, as save_pretrained), 500MB, 20000")
    ap.add_argument("--device", default="auto", help="where to draw the weights: auto (cuda if available), cuda, cpu")
    ap.add_argument("--writers", type=int, default=3, help="shard-writing threads")
    ap.add_argument("--fp8-block", type=int, default=0, metavar="BN",
                    help="write the projections as block FP8 with blocks of BN rows and 128 columns")
    ap.add_argument("--gptq", type=int, default=0, metavar="G", choices=[0, 32, 64, 128],
                    help="write the projections as random GPTQ v1 4-bit groups of G columns")
    ap.add_argument("--act-order", action="store_true", help="with --gptq: desc_act true, permuting g_idx")
    a = ap.parse_args(argv)
    if a.fp8_block < 0:
        ap.error("--fp8-block must be positive")
    if a.act_order and not a.gptq:
        ap.error("--act-order needs --gptq")
    if a.gptq and a.fp8_block:
        ap.error("--gptq and --fp8-block: one format at a time")
    if a.layers is not None and a.layers < 1:
        ap.error("--layers must be >= 1")
    if a.writers < 1:
        ap.error("--writers must be >= 1")
    try:
        shard_size = parse_size(a.shard_size)
    except ValueError:
        ap.error(f"--shard-size {a.shard_size!r}: expected a byte count such as 5GB, 500MB or 20000")
    if shard_size < 1:
        ap.error("--shard-size must be positive")
    dev = a.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")

    t0 = time.time()
    dtype, dtype_name = DTYPES[a.dtype]
    cfg = make_config(a.arch, a.layers, dtype_name)
    plan = tensor_plan(cfg)
    bn = a.fp8_block
    if bn:
        cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                      "weight_block_size": [bn, 128]}
        for name, shape, _ in plan:
            if is_proj(name) and (shape[0] % bn or shape[1] % 128):
                ap.error(f"--fp8-block {bn}: {name} {list(shape)} is not whole blocks of {bn} x 128")
    G = a.gptq
    if G:
        cfg["quantization_config"] = {"bits": 4, "checkpoint_format": "gptq", "damp_percent": 0.01,
                                      "desc_act": a.act_order, "group_size": G, "quant_method": "gptq",
                                      "static_groups": False, "sym": False, "true_sequential": True}
        for name, shape, _ in plan:
            if is_proj(name) and (shape[0] % 8 or shape[1] % G):
                ap.error(f"--gptq {G}: {name} {list(shape)} is not whole words of 8 rows and groups of {G}")
    esize = torch.empty((), dtype=dtype).element_size()
    shards = split_shards(plan, esize, shard_size)
    n = len(shards)
    names = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]

    os.makedirs(a.out, exist_ok=True)
    # Remove checkpoint files a previous run may have left (another shard count).
    for f in os.listdir(a.out):
        if f.endswith(".safetensors") or f == "model.safetensors.index.json":
            os.remove(os.path.join(a.out, f))

    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed)
    total_params = sum(numel(s) for _, s, _ in plan)
    total_bytes = total_params * esize
    weight_map = {}

    def draw(shape, kind):
        t = torch.empty(shape, dtype=dtype, device=dev)
        if kind == "norm":
            return t.normal_(1.0, NORM_STD, generator=gen)
        return t.normal_(0.0, WEIGHT_STD, generator=gen)

    def fp8_block(w):
        """codes (float8_e4m3fn) and scales [out/bn, in/128] (f32) of w, as block-FP8 quantizers make them"""
        n, k = w.shape
        b = w.float().reshape(n // bn, bn, k // 128, 128)
        s = b.abs().amax(dim=(1, 3)) / 448.0
        q = (b / s[:, None, :, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        return q.reshape(n, k), s

    orders = {}  # (layer, input) -> the act-order column order its projections share

    def gptq(name, shape):
        """random GPTQ v1 tensors of projection `name` [out, in] (suffix -> tensor)"""
        n, k = shape
        words = lambda *sh: torch.randint(-2**31, 2**31, sh, dtype=torch.int64, device=dev,
                                          generator=gen).to(torch.int32)
        t = {"qweight": words(k // 8, n), "qzeros": words(k // G, n // 8),
             "scales": (torch.rand((k // G, n), device=dev, generator=gen) * 0.004 + 0.002).half()}
        g_idx = torch.arange(k, device=dev, dtype=torch.int32) // G
        if a.act_order:
            parts = name.split(".")
            proj = parts[4]
            inp = {"q_proj": "attn", "k_proj": "attn", "v_proj": "attn", "gate_proj": "mlp", "up_proj": "mlp"}
            key = (parts[2], inp.get(proj, proj))
            if key not in orders:
                orders[key] = torch.randperm(k, device=dev, generator=gen)
            g = torch.empty(k, dtype=torch.int32, device=dev)
            g[orders[key]] = g_idx
            g_idx = g
        t["g_idx"] = g_idx
        return {name[:-len("weight")] + sfx: v.cpu() for sfx, v in t.items()}

    def write_shard(tensors, path):
        save_file(tensors, path, {"format": "pt"})
        os.chmod(path, 0o644)  # safetensors creates 0600; save_pretrained's files are 0644

    with concurrent.futures.ThreadPoolExecutor(max_workers=a.writers) as pool:
        futs = []
        for shard, fname in zip(shards, names):
            tensors = {}
            for name, shape, kind in shard:
                if G and is_proj(name):
                    for tn, tv in gptq(name, shape).items():
                        tensors[tn] = tv
                        weight_map[tn] = fname
                    continue
                t = draw(shape, kind)
                if bn and is_proj(name):
                    t, sc = fp8_block(t)
                    sname = name[:-len("weight")] + "weight_scale_inv"
                    tensors[sname] = sc.cpu()
                    weight_map[sname] = fname
                tensors[name] = t.cpu() if t.device.type != "cpu" else t
                weight_map[name] = fname
            futs.append(pool.submit(write_shard, tensors, os.path.join(a.out, fname)))
            del tensors
        for f in futs:
            f.result()

    if n > 1:
        index = {"metadata": {"total_parameters": total_params, "total_size": total_bytes},
                 "weight_map": dict(sorted(weight_map.items()))}
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(a.out, "random_weights.json"), "w") as f:
        json.dump({"generator": "bench/make_checkpoint.py", "arch": a.arch, "layers": cfg["num_hidden_layers"],
                   "seed": a.seed, "matrix": f"normal(0, {WEIGHT_STD})", "norm": f"normal(1, {NORM_STD})",
                   "dtype": dtype_name, "device": dev, "torch": torch.__version__,
                   "fp8_block": [bn, 128] if bn else None, "gptq": G or None, "act_order": a.act_order},
                  f, indent=2)
        f.write("\n")
    secs = time.time() - t0
    print(json.dumps({"checkpoint": os.path.abspath(a.out), "arch": a.arch, "layers": cfg["num_hidden_layers"],
                      "params": total_params, "bytes": total_bytes, "shards": n, "seconds": round(secs, 3),
                      "GBps": round(total_bytes / secs / 1e9, 3), "device": dev}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
