#!/usr/bin/env python3
"""Make kiln's synthetic test checkpoints and the golden outputs the C tests compare against.

The reference is HuggingFace transformers on the CPU, in float32, with
attn_implementation="eager". Nothing here is a runtime dependency of kiln.

What it writes (all paths relative to the repository root):

  tests/data/tiny-mistral/          MistralForCausalLM, GQA, sliding window 8, untied, bf16
  tests/data/tiny-mistral-sharded/  the same weights, saved as >= 3 shards + index
  tests/data/tiny-llama3/           LlamaForCausalLM, llama3 RoPE scaling, tied, fp16,
                                    config.json rewritten to the transformers 4.x form
  tests/data/tiny-qwen3/            Qwen3ForCausalLM: per-head RMSNorm on q and k before RoPE,
                                    explicit head_dim (not hidden / heads), untied, bf16
  tests/data/tiny-qwen2/            Qwen2ForCausalLM: biases on q, k and v, a sliding window on
                                    layer 1 only (max_window_layers 1), tied, bf16, config.json
                                    rewritten to the transformers 4.x form (no layer_types)
  tests/data/tiny-mixtral/          MixtralForCausalLM: 8 experts, top-2, GQA, untied, bf16; layer 1's
                                    router rows of experts 2 and 5 equal, so their probabilities tie
  tests/golden/tiny-mixtral/        its golden, plus the experts HF routes each token to in each layer
  tests/data/tiny-qwen3-moe/        Qwen3MoeForCausalLM: 16 experts of width 16, top-4, norm_topk_prob,
                                    q/k norms, 3 layers of which layer 1 keeps a dense MLP of width 96
                                    (mlp_only_layers), untied, bf16; layer 2's router rows of experts
                                    3 and 11 equal
  tests/golden/tiny-qwen3-moe/      its golden, plus HF's routing (an empty list for the dense layer)
  tests/data/tiny-qwen3-moe-nonorm/ Qwen3MoeForCausalLM: norm_topk_prob false, decoder_sparse_step 2
                                    (layer 0 dense), 8 experts top-2, a window of 8 on every layer;
                                    layer 1's router rows of experts 1 and 6 equal
  tests/golden/tiny-qwen3-moe-nonorm/  its golden and routing (--only tiny-qwen3-moe makes both)
  tests/golden/topk-ties/golden.json  torch.topk's order on inputs full of ties (kiln_topk's reference)
  tests/golden/<name>/golden.json   greedy ids + metadata, for stories260k, tiny-mistral,
  tests/golden/<name>/case<i>.f32   tiny-llama3: full-forward logits, raw little-endian f32
  tests/golden/pycode-22m/...       text end-to-end golden for ../shared/models/pycode-22m

Usage (from anywhere):
  python3 tests/golden/make_goldens.py [--shared-dir DIR] [--only NAME]
(--only tiny-qwen3, tiny-qwen2, tiny-mixtral or tiny-qwen3-moe makes that checkpoint and golden
alone, leaving the others as they are; tiny-mixtral's also remakes topk-ties.)

Every run rebuilds everything from fixed seeds; on the same machine and
library versions the output is byte-identical. The script checks its own
output (greedy path == argmax of the full forward, KV-cache logits == full
forward logits, HF float32 == an independent float64 numpy forward pass,
shards == single file, 4.x config loads back identically) and exits non-zero
if a check fails. See tests/golden/README.md.
"""

import argparse
import hashlib
import tempfile
import json
import os
import re
import shutil
import sys

import numpy as np
import safetensors.torch
import tokenizers
import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = "tests/golden/make_goldens.py"

# Number of tokens every golden continuation has (the C tests need >= 64).
NEW_TOKENS = 72

# Prompts of token ids for the id-level goldens of the synthetic models (vocab 256).
ID_PROMPTS = [
    [1],
    [1, 50, 60, 70, 80, 90, 100, 110],
    [1] + [(37 * i + 11) % 250 + 3 for i in range(19)],
]
# tiny-llama3 gets a 4th prompt whose greedy path reaches eos id 3 (the
# second entry of its eos list) before any 2, found among [1, a, a+1, a+2].
LLAMA3_PROMPTS = ID_PROMPTS + [[1, 42, 43, 44]]
# stories260k's tok512 has byte-fallback tokens at ids 3..258 whose embeddings
# all collapsed to one vector in training, so prompts made of them all give
# the same continuation; its prompts use merged tokens (259..511) instead,
# picked among a few candidates for margins >= 0.01 along the greedy path.
STORIES_PROMPTS = [
    [1],
    [1, 300, 310, 320, 330, 340, 350, 360],
    [1] + [(37 * i + 76) % 253 + 259 for i in range(19)],
]

# Synthetic-model initialisation. The seeds were chosen by trying seeds 0..129
# (tiny-mistral) and 0..109 (tiny-llama3) with these stds and keeping the one
# whose greedy paths over ID_PROMPTS have the largest smallest top-1/top-2 gap
# while still being varied (>= 15 distinct ids among the first 20). tiny-llama3
# ties lm_head to the embedding, so with small layer weights the residual
# stream is dominated by the input embedding and the model just repeats its
# input token; its layer matrices therefore use std 0.3 instead of 0.15.
MISTRAL_INIT = dict(seed=45, matrix_std=0.15, embed_std=1.0, norm_noise=0.1)
LLAMA3_INIT = dict(seed=95, matrix_std=0.3, embed_std=1.0, norm_noise=0.1)
# tiny-qwen3: the seed with the largest smallest greedy margin over ID_PROMPTS among 0..9 (0.0215).
QWEN3_INIT = dict(seed=1, matrix_std=0.15, embed_std=1.0, norm_noise=0.1)
# tiny-qwen2: tied like tiny-llama3, so its matrices use std 0.3 too (with 0.15 it repeats its input);
# the seed with the largest smallest greedy margin over ID_PROMPTS among 0..9 (0.0148; seeds 4 and 5
# fail the variety check).
QWEN2_INIT = dict(seed=1, matrix_std=0.3, embed_std=1.0, norm_noise=0.1)
# tiny-mixtral: the seed with the largest smallest greedy margin over ID_PROMPTS among 0..9 (0.0266) whose
# continuations are varied (seeds 3 and 4: 0.0286 and 0.0375, but 10 and 6 distinct ids in one case).
MIXTRAL_INIT = dict(seed=0, matrix_std=0.15, embed_std=1.0, norm_noise=0.1)
# Layer 1's router row of expert MIXTRAL_TIE[1] is a copy of expert MIXTRAL_TIE[0]'s: their router logits,
# hence probabilities, are equal for every token, and where they share the top-k boundary, torch.topk's
# order decides which one is used.
MIXTRAL_TIE = (2, 5)
# tiny-qwen3-moe: the seed with the largest smallest greedy margin over ID_PROMPTS among 0..19 (0.0322) whose
# continuations are varied (seed 12: 0.0808, but 9 distinct ids in one case).
QWEN3_MOE_INIT = dict(seed=13, matrix_std=0.15, embed_std=1.0, norm_noise=0.1)
# Layer 2's router row of expert QWEN3_MOE_TIE[1] is a copy of QWEN3_MOE_TIE[0]'s, as in tiny-mixtral.
QWEN3_MOE_TIE = (3, 11)
QWEN3_MOE_TIE_LAYER = 2
# tiny-qwen3-moe-nonorm: the seed with the largest smallest greedy margin over ID_PROMPTS among 0..19 (0.0537).
QWEN3_MOE_NONORM_INIT = dict(seed=9, matrix_std=0.15, embed_std=1.0, norm_noise=0.1)
QWEN3_MOE_NONORM_TIE = (1, 6)  # in its only sparse layer, 1

# Checks the script enforces on what it writes.
# KV-cache (generate) logits vs one full forward, and the float32 full forward
# vs the float64 numpy reference: max abs diff <= REL_TOL x logit range.
# (An absolute 1e-5 is below float32's own noise for stories260k: there both
# float32 paths are ~5e-5..1.3e-4 away from float64, with logits spanning ~33.)
REL_TOL = 1e-5
MIN_DISTINCT_FIRST20 = 10  # greedy continuations of the synthetic models must be varied


def fail(msg):
    print("make_goldens: FAILED: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def rel(path):
    return os.path.relpath(path, REPO)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def fresh_dir(path):
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)


def generator_info():
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
        "safetensors": safetensors.__version__,
        "python": "%d.%d.%d" % sys.version_info[:3],
        "script": SCRIPT,
    }


def write_json(path, obj):
    """Indented JSON, but each list of plain numbers on one line."""
    text = json.dumps(obj, indent=1)
    text = re.sub(r"\[\s*([-+0-9.eE,\s]*?)\s*\]",
                  lambda m: "[" + ", ".join(v.strip() for v in m.group(1).split(",")) + "]", text)
    check(json.loads(text) == obj, "compact JSON changed the data")
    with open(path, "w") as f:
        f.write(text + "\n")


def write_f32(path, arr):
    a = np.ascontiguousarray(np.asarray(arr, dtype="<f4"))
    a.tofile(path)
    return sha256_file(path)


# --------------------------------------------------------------------------
# Synthetic checkpoints
# --------------------------------------------------------------------------

def init_weights(model, seed, matrix_std, embed_std, norm_noise, dtype):
    """Overwrite every parameter from one seeded generator, in name order.

    Norm weights are 1 + noise, the embedding and lm_head are N(0, embed_std)
    (std 1 gives logits spread over roughly +-25), other matrices
    N(0, matrix_std). Values are rounded to the checkpoint dtype so the
    in-memory model equals what gets saved.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                v = 1.0 + norm_noise * torch.randn(p.shape, generator=g)
            elif "embed_tokens" in name or name.startswith("lm_head"):
                v = embed_std * torch.randn(p.shape, generator=g)
            else:
                v = matrix_std * torch.randn(p.shape, generator=g)
            p.copy_(v.to(dtype).to(p.dtype))


def mistral_config(sliding_window=8):
    c = MistralConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        sliding_window=sliding_window,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    c.architectures = ["MistralForCausalLM"]
    return c


# original_max_position_embeddings is 64, not Llama-3.1's 8192 scaled down to
# 32: with theta 500000 and head_dim 16 the 8 RoPE wavelengths are
# 6.3, 32.5, 168, ... so with 64 the high-frequency band (< 64/4 = 16: kept),
# the smooth band (16..64: interpolated) and the low-frequency band (> 64:
# divided by factor) each get at least one frequency. With 32 no wavelength
# falls in the smooth band and that branch of the formula would go untested.
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def llama3_config(rope_scaling=LLAMA3_ROPE):
    c = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rope_theta=500000.0,
        rope_scaling=dict(rope_scaling) if rope_scaling else None,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=[2, 3],
    )
    c.architectures = ["LlamaForCausalLM"]
    return c


def qwen3_config():
    # head_dim 24 with 4 heads of a 64-wide model: q_proj is 96 wide, so the explicit head_dim is
    # exercised (hidden / heads would be 16)
    c = Qwen3Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        max_position_embeddings=256,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        attention_bias=False,
        use_sliding_window=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    c.architectures = ["Qwen3ForCausalLM"]
    return c


def qwen2_config():
    # a window of 8 on layer 1 only (max_window_layers 1), so the golden prompts of 8 and 20 tokens
    # cross it there and not in layer 0; tied, as the small Qwen2.5 models are
    c = Qwen2Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=1,
        bos_token_id=1,
        eos_token_id=2,
    )
    c.architectures = ["Qwen2ForCausalLM"]
    return c


def mixtral_config():
    # 8 experts of width 16, top-2; no sliding window (Mixtral-8x7B's config has null)
    c = MixtralConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=256,
        rope_theta=1000000.0,
        rms_norm_eps=1e-5,
        sliding_window=None,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    c.architectures = ["MixtralForCausalLM"]
    return c


def qwen3_moe_config():
    # 16 experts of width 16, top-4, renormalised (norm_topk_prob, as the published Qwen3-MoE models);
    # layer 1 keeps a dense MLP of width 96 (mlp_only_layers), so both widths are exercised
    c = Qwen3MoeConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=16,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=16,
        num_experts_per_tok=4,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        max_position_embeddings=256,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        attention_bias=False,
        use_sliding_window=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    c.architectures = ["Qwen3MoeForCausalLM"]
    return c


def qwen3_moe_nonorm_config():
    # the other variants: norm_topk_prob false (HF's default), decoder_sparse_step 2 (layer 0 dense,
    # layer 1 sparse), 8 experts top-2, and a sliding window of 8 (every layer, as transformers 5 does)
    c = Qwen3MoeConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=80,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        decoder_sparse_step=2,
        mlp_only_layers=[],
        max_position_embeddings=256,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        attention_bias=False,
        use_sliding_window=True,
        sliding_window=8,
        bos_token_id=1,
        eos_token_id=2,
    )
    c.architectures = ["Qwen3MoeForCausalLM"]
    return c


def build_model(cls, config, init, dtype):
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # HF's loop over experts (ignored by dense models)
    torch.manual_seed(0)  # every parameter is overwritten below; this only pins HF's own init
    model = cls(config).eval()
    init_weights(model, init["seed"], init["matrix_std"], init["embed_std"], init["norm_noise"], dtype)
    return model


def load_f32(path):
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
        moe = "num_local_experts" in cfg or "num_experts" in cfg
    kw = dict(experts_implementation="eager") if moe else {}  # HF's loop over experts
    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", **kw).eval()


def state_tensors(dirpath):
    """All tensors of a checkpoint dir (single file or shards), by name."""
    out = {}
    for fn in sorted(os.listdir(dirpath)):
        if fn.endswith(".safetensors"):
            for k, v in safetensors.torch.load_file(os.path.join(dirpath, fn)).items():
                check(k not in out, "%s: tensor %s in two files" % (dirpath, k))
                out[k] = v
    return out


def make_tiny_mistral():
    d = os.path.join(REPO, "tests/data/tiny-mistral")
    ds = os.path.join(REPO, "tests/data/tiny-mistral-sharded")
    model = build_model(MistralForCausalLM, mistral_config(), MISTRAL_INIT, torch.bfloat16)
    model = model.to(torch.bfloat16)
    fresh_dir(d)
    model.save_pretrained(d)
    fresh_dir(ds)
    model.save_pretrained(ds, max_shard_size="64KB")

    shards = sorted(f for f in os.listdir(ds) if f.endswith(".safetensors"))
    check(len(shards) >= 3, "tiny-mistral-sharded has %d shards, want >= 3" % len(shards))
    check(os.path.exists(os.path.join(ds, "model.safetensors.index.json")), "sharded: no index.json")
    check(not os.path.exists(os.path.join(ds, "model.safetensors")), "sharded: has a single-file model too")
    with open(os.path.join(d, "config.json"), "rb") as f1, open(os.path.join(ds, "config.json"), "rb") as f2:
        check(f1.read() == f2.read(), "tiny-mistral and tiny-mistral-sharded config.json differ")
    a, b = state_tensors(d), state_tensors(ds)
    check(sorted(a) == sorted(b), "sharded checkpoint has other tensor names")
    for k in a:
        check(a[k].dtype == torch.bfloat16, "tiny-mistral %s is %s, want bf16" % (k, a[k].dtype))
        check(torch.equal(a[k], b[k]), "sharded tensor %s differs" % k)
    with open(os.path.join(ds, "model.safetensors.index.json")) as f:
        wm = json.load(f)["weight_map"]
    check(sorted(wm) == sorted(a) and set(wm.values()) == set(shards), "index.json weight_map mismatch")
    print("tiny-mistral: %d tensors, bf16; sharded copy: %s" % (len(a), ", ".join(shards)))

    # The sharded copy must load to the same model: compare logits bitwise.
    m1, m2 = load_f32(d), load_f32(ds)
    x = torch.tensor([ID_PROMPTS[2]])
    with torch.no_grad():
        check(torch.equal(m1(x).logits, m2(x).logits), "sharded copy gives other logits")
    return d


def to_4x_config(path):
    """Rewrite a transformers-5 Llama config.json the way 4.x Llama-3.1 checkpoints look.

    5.x writes rope_parameters {rope_theta, rope_type, ...} and "dtype"; 4.x
    checkpoints have top-level rope_theta, a rope_scaling dict without
    rope_theta, "torch_dtype", and (Llama-3.1) no head_dim and no pad_token_id.
    transformers_version is set to a 4.x release to match the form.
    """
    with open(path) as f:
        c = json.load(f)
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp.pop("rope_theta")
    c["rope_scaling"] = rp
    c["torch_dtype"] = c.pop("dtype")
    check(c.pop("head_dim") == c["hidden_size"] // c["num_attention_heads"],
          "tiny-llama3 head_dim must be hidden/heads to drop it")
    check(c.pop("pad_token_id", None) is None, "tiny-llama3 has a pad_token_id")
    c["transformers_version"] = "4.45.2"
    with open(path, "w") as f:
        f.write(json.dumps(c, indent=2, sort_keys=True) + "\n")


def make_tiny_qwen3():
    d = os.path.join(REPO, "tests/data/tiny-qwen3")
    model = build_model(Qwen3ForCausalLM, qwen3_config(), QWEN3_INIT, torch.bfloat16).to(torch.bfloat16)
    fresh_dir(d)
    model.save_pretrained(d)
    t = state_tensors(d)
    check("model.layers.0.self_attn.q_norm.weight" in t and "lm_head.weight" in t,
          "tiny-qwen3 lacks q_norm or lm_head")
    check(t["model.layers.0.self_attn.q_proj.weight"].shape[0] == 4 * 24, "tiny-qwen3 q_proj is not heads x head_dim")
    print("tiny-qwen3: %d tensors, bf16, untied, head_dim 24 (hidden / heads = 16)" % len(t))
    return d


def to_4x_qwen2_config(path):
    """Rewrite a transformers-5 Qwen2 config.json the way 4.x Qwen2.5 checkpoints look: top-level
    rope_theta, "torch_dtype", no layer_types (the windowed layers follow from max_window_layers)."""
    with open(path) as f:
        c = json.load(f)
    rp = c.pop("rope_parameters")
    check(rp.get("rope_type", "default") == "default", "tiny-qwen2 rope type")
    c["rope_theta"] = rp["rope_theta"]
    c["torch_dtype"] = c.pop("dtype")
    check(c.pop("layer_types") == ["full_attention", "sliding_attention"], "tiny-qwen2 layer_types")
    c["transformers_version"] = "4.45.2"
    with open(path, "w") as f:
        f.write(json.dumps(c, indent=2, sort_keys=True) + "\n")


def make_tiny_qwen2():
    d = os.path.join(REPO, "tests/data/tiny-qwen2")
    cfg = qwen2_config()
    model = build_model(Qwen2ForCausalLM, cfg, QWEN2_INIT, torch.bfloat16).to(torch.bfloat16)
    fresh_dir(d)
    model.save_pretrained(d)
    with open(os.path.join(d, "config.json")) as f:
        c5 = json.load(f)
    to_4x_qwen2_config(os.path.join(d, "config.json"))
    back = Qwen2Config.from_pretrained(d).to_dict()
    orig = Qwen2Config.from_dict(c5).to_dict()
    for k in sorted(set(back) | set(orig)):
        if k in ("transformers_version",):
            continue
        check(back.get(k) == orig.get(k), "4.x config loads %s=%r, 5.x form has %r" % (k, back.get(k), orig.get(k)))
    t = state_tensors(d)
    check("model.layers.0.self_attn.q_proj.bias" in t and "lm_head.weight" not in t,
          "tiny-qwen2 lacks the q bias or stores a tied lm_head")
    check("model.layers.0.self_attn.o_proj.bias" not in t, "tiny-qwen2 has an o_proj bias")
    print("tiny-qwen2: %d tensors, bf16, tied, q/k/v biases, window 8 on layer 1, 4.x config form" % len(t))
    return d


def make_tiny_mixtral():
    d = os.path.join(REPO, "tests/data/tiny-mixtral")
    model = build_model(MixtralForCausalLM, mixtral_config(), MIXTRAL_INIT, torch.bfloat16).to(torch.bfloat16)
    a, b = MIXTRAL_TIE
    with torch.no_grad():
        w = model.model.layers[1].mlp.gate.weight
        w[b] = w[a]
    fresh_dir(d)
    model.save_pretrained(d)
    t = state_tensors(d)
    # transformers 5 saves the published per-expert form (its in-memory form is fused)
    check("model.layers.0.block_sparse_moe.experts.7.w2.weight" in t and "lm_head.weight" in t,
          "tiny-mixtral is not in the published per-expert form")
    check(not any(".mlp." in k for k in t), "tiny-mixtral has fused expert tensors")
    for k, v in t.items():
        check(v.dtype == torch.bfloat16, "tiny-mixtral %s is %s, want bf16" % (k, v.dtype))
    r = t["model.layers.1.block_sparse_moe.gate.weight"]
    check(torch.equal(r[a], r[b]), "tiny-mixtral: layer 1's tied router rows differ")
    print("tiny-mixtral: %d tensors, bf16, untied, 8 experts top-2, layer 1 router rows %d == %d"
          % (len(t), a, b))
    return d


def make_tiny_qwen3_moe():
    d = os.path.join(REPO, "tests/data/tiny-qwen3-moe")
    model = build_model(Qwen3MoeForCausalLM, qwen3_moe_config(), QWEN3_MOE_INIT, torch.bfloat16).to(torch.bfloat16)
    a, b = QWEN3_MOE_TIE
    with torch.no_grad():
        w = model.model.layers[QWEN3_MOE_TIE_LAYER].mlp.gate.weight
        w[b] = w[a]
    fresh_dir(d)
    model.save_pretrained(d)
    t = state_tensors(d)
    # transformers 5 saves the published per-expert form (its in-memory form is fused)
    check("model.layers.0.mlp.experts.15.down_proj.weight" in t and "model.layers.0.mlp.gate.weight" in t,
          "tiny-qwen3-moe is not in the published per-expert form")
    check(not any(k.endswith("gate_up_proj") for k in t), "tiny-qwen3-moe has fused expert tensors")
    check("model.layers.1.mlp.gate_proj.weight" in t and "model.layers.1.mlp.gate.weight" not in t,
          "tiny-qwen3-moe layer 1 is not dense")
    check(t["model.layers.1.mlp.gate_proj.weight"].shape[0] == 96 and
          t["model.layers.0.mlp.experts.0.gate_proj.weight"].shape[0] == 16, "tiny-qwen3-moe widths")
    check("model.layers.0.self_attn.q_norm.weight" in t and "lm_head.weight" in t,
          "tiny-qwen3-moe lacks q_norm or lm_head")
    for k, v in t.items():
        check(v.dtype == torch.bfloat16, "tiny-qwen3-moe %s is %s, want bf16" % (k, v.dtype))
    r = t["model.layers.%d.mlp.gate.weight" % QWEN3_MOE_TIE_LAYER]
    check(torch.equal(r[a], r[b]), "tiny-qwen3-moe: the tied router rows differ")
    print("tiny-qwen3-moe: %d tensors, bf16, untied, 16 experts top-4 renormalised, layer 1 dense, "
          "layer %d router rows %d == %d" % (len(t), QWEN3_MOE_TIE_LAYER, a, b))
    return d


def make_tiny_qwen3_moe_nonorm():
    d = os.path.join(REPO, "tests/data/tiny-qwen3-moe-nonorm")
    model = build_model(Qwen3MoeForCausalLM, qwen3_moe_nonorm_config(), QWEN3_MOE_NONORM_INIT,
                        torch.bfloat16).to(torch.bfloat16)
    a, b = QWEN3_MOE_NONORM_TIE
    with torch.no_grad():
        w = model.model.layers[1].mlp.gate.weight
        w[b] = w[a]
    fresh_dir(d)
    model.save_pretrained(d)
    t = state_tensors(d)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    check(cfg["norm_topk_prob"] is False and cfg["sliding_window"] == 8 and cfg["use_sliding_window"],
          "tiny-qwen3-moe-nonorm config.json: %s" % cfg)
    check("model.layers.0.mlp.gate_proj.weight" in t and "model.layers.1.mlp.experts.7.up_proj.weight" in t and
          "model.layers.0.mlp.gate.weight" not in t, "tiny-qwen3-moe-nonorm: layer 0 not dense or layer 1 not sparse")
    for k, v in t.items():
        check(v.dtype == torch.bfloat16, "tiny-qwen3-moe-nonorm %s is %s, want bf16" % (k, v.dtype))
    print("tiny-qwen3-moe-nonorm: %d tensors, bf16, 8 experts top-2 not renormalised, layer 0 dense "
          "(decoder_sparse_step 2), window 8, layer 1 router rows %d == %d" % (len(t), a, b))
    return d


# --------------------------------------------------------------------------
# Quantized engines: HF on the weights rounded as kiln's --quant rounds them
# --------------------------------------------------------------------------

def rtn_q8(w):
    """kiln's q8 (common/quant.c), written again in numpy float32: per row scale = max|w| / 127,
    q = rint(w / scale) in -127..127, w' = q * scale."""
    w = w.astype(np.float32)
    s = (np.max(np.abs(w), axis=1) / np.float32(127)).astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s > 0, np.clip(np.rint(w / s), -127, 127), 0).astype(np.float32)
    return (q * s).astype(np.float32)


def rtn_q4(w, g):
    """kiln's q4gG: per group of g columns lo = min, scale = (max - lo) / 15, q = rint((w - lo) / scale)
    in 0..15, w' = q * scale + lo (each product and sum rounded to float32, as C without contraction)."""
    n, k = w.shape
    x = w.astype(np.float32).reshape(n, k // g, g)
    lo = x.min(axis=2, keepdims=True)
    s = ((x.max(axis=2, keepdims=True) - lo) / np.float32(15)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s > 0, np.clip(np.rint((x - lo) / s), 0, 15), 0).astype(np.float32)
    return ((q * s).astype(np.float32) + lo).astype(np.float32).reshape(n, k)


def rtn_fp8(w):
    """kiln's fp8 (common/quant.c), written again in numpy float32 by another route: per row scale =
    max|w| / 448; y = w / scale rounded to the E4M3 grid, whose spacing is 2^(e - 3) for |y| in
    [2^e, 2^(e+1)), e >= -6, and 2^-9 below 2^-6 (subnormals), round half to even (np.rint on the
    exact quotient y / spacing), saturated at 448; w' = y' * scale."""
    w = w.astype(np.float32)
    s = (np.max(np.abs(w), axis=1) / np.float32(448)).astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(s > 0, w / s, np.float32(0)).astype(np.float32)
    a = np.abs(y).astype(np.float64)  # exact
    _, ex = np.frexp(a)  # a = f 2^ex, f in [0.5, 1): |y| in [2^(ex-1), 2^ex)
    e = np.maximum(ex - 1, -6)
    step = np.ldexp(1.0, e - 3)
    r = np.minimum(np.rint(a / step) * step, 448.0)
    yq = (np.sign(y) * r).astype(np.float32)
    if hasattr(torch, "float8_e4m3fn"):  # a cross-check against torch's own cast (round to nearest even)
        tq = torch.from_numpy(np.clip(y, -448, 448)).to(torch.float8_e4m3fn).float().numpy()
        assert np.array_equal(tq, yq), "rtn_fp8 disagrees with torch.float8_e4m3fn"
    return (yq * s).astype(np.float32)


# (golden name, the projections' format, int4 group, the embedding's, the LM head's): the LM head
# gets q8 (--quant-head's default) but in the fp8 one; the int8 one quantizes the embedding table too
# (--quant-embedding int8), the fp8 one the embedding and the LM head (--quant-head fp8
# --quant-embedding fp8)
QUANT_GOLDENS = [("tiny-mistral-int8", "int8", None, "int8", "int8"), ("tiny-mistral-int4g32", "int4", 32, None, "int8"),
                 ("tiny-mistral-fp8", "fp8", None, "fp8", "fp8")]
QUANT_ROUND = {"int8": rtn_q8, "fp8": rtn_fp8}


def make_quant_goldens():
    """tiny-mistral as kiln compiles it with --quant int8 --quant-embedding int8 and with --quant int4
    --group-size 32 (--quant-method rtn): the projections' matrices (q/k/v/o, gate/up/down), the LM
    head and (int8) the embedding table rounded by rtn_q8 / rtn_q4, the norms unchanged, written as a
    float32 checkpoint and run through HF as the others."""
    src = os.path.join(REPO, "tests/data/tiny-mistral")
    for name, fmt, group, emb, head in QUANT_GOLDENS:
        with tempfile.TemporaryDirectory() as tmp:
            for f in ("config.json", "generation_config.json"):
                shutil.copy(os.path.join(src, f), tmp)
            out = {}
            for k, v in state_tensors(src).items():
                w = v.float().numpy()
                if k == "lm_head.weight":
                    w = QUANT_ROUND[head](w)
                elif k == "model.embed_tokens.weight" and emb:
                    w = QUANT_ROUND[emb](w)
                elif k.endswith("_proj.weight"):
                    w = QUANT_ROUND[fmt](w) if fmt in QUANT_ROUND else rtn_q4(w, group)
                out[k] = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
            safetensors.torch.save_file(out, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
            make_id_golden(name, tmp, ID_PROMPTS[1:], synthetic=False)
        gpath = os.path.join(REPO, "tests/golden", name, "golden.json")
        with open(gpath) as f:
            gj = json.load(f)
        gj["model"] = "tests/data/tiny-mistral"
        gj["quantization"] = {"kiln_compile": "--quant %s%s%s%s --quant-method rtn"
                              % (fmt, " --group-size %d" % group if group else "",
                                 " --quant-head %s" % head if head != "int8" else "",
                                 " --quant-embedding %s" % emb if emb else ""),
                              "reference": "tests/golden/make_goldens.py rtn_q8 / rtn_q4 / rtn_fp8 (numpy float32)"}
        write_json(gpath, gj)


def make_tiny_llama3():
    d = os.path.join(REPO, "tests/data/tiny-llama3")
    cfg = llama3_config()
    model = build_model(LlamaForCausalLM, cfg, LLAMA3_INIT, torch.float16)
    x = torch.tensor([ID_PROMPTS[2]])
    with torch.no_grad():  # float32 in memory, values already rounded to fp16
        ref_logits = model(x).logits
    fresh_dir(d)
    model.to(torch.float16).save_pretrained(d)
    with open(os.path.join(d, "config.json")) as f:
        c5 = json.load(f)
    to_4x_config(os.path.join(d, "config.json"))
    with open(os.path.join(d, "config.json")) as f:
        c4 = json.load(f)
    check("rope_parameters" not in c4 and "rope_scaling" in c4 and "rope_theta" in c4, "4.x form")

    t = state_tensors(d)
    check("lm_head.weight" not in t, "tiny-llama3 is tied but stores lm_head.weight")
    for k, v in t.items():
        check(v.dtype == torch.float16, "tiny-llama3 %s is %s, want f16" % (k, v.dtype))

    # Loads back identically: every config field equal to the 5.x form's, and
    # the same logits bit for bit as the in-memory model.
    back = LlamaConfig.from_pretrained(d).to_dict()
    orig = LlamaConfig.from_dict(c5).to_dict()
    for k in sorted(set(back) | set(orig)):
        if k in ("transformers_version",):
            continue
        check(back.get(k) == orig.get(k), "4.x config loads %s=%r, 5.x form has %r" % (k, back.get(k), orig.get(k)))
    m = load_f32(d)
    check(m.config.head_dim == 16, "head_dim")
    check(m.config.rope_parameters["rope_type"] == "llama3", "rope_type did not survive the 4.x form")
    with torch.no_grad():
        check(torch.equal(m(x).logits, ref_logits), "tiny-llama3 reloads to other logits")
    print("tiny-llama3: %d tensors, f16, tied, config.json in 4.x form (loads back identically)" % len(t))
    return d


# --------------------------------------------------------------------------
# An independent reference: the forward pass written out in numpy (float64)
# --------------------------------------------------------------------------

def np_rope_inv_freq(cfg, head_dim):
    """RoPE inverse frequencies from config.json in either form (5.x rope_parameters or 4.x rope_theta + rope_scaling)."""
    rp = cfg.get("rope_parameters")
    if rp is None:
        rp = dict(cfg.get("rope_scaling") or {})
        rp["rope_theta"] = cfg["rope_theta"]
    kind = rp.get("rope_type", rp.get("type", "default"))
    inv = 1.0 / rp["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if kind == "default":
        return inv
    check(kind == "llama3", "numpy reference: rope_type %s not implemented" % kind)
    factor, lo_f, hi_f = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
    old = rp["original_max_position_embeddings"]
    wavelen = 2 * np.pi / inv
    lo_wl, hi_wl = old / lo_f, old / hi_f
    out = np.where(wavelen > lo_wl, inv / factor, inv)                 # low frequencies: / factor
    smooth = (old / wavelen - lo_f) / (hi_f - lo_f)
    medium = (wavelen >= hi_wl) & (wavelen <= lo_wl)                    # between: interpolate
    out = np.where(medium, (1 - smooth) * inv / factor + smooth * inv, out)
    return out                                                           # high frequencies: kept


def np_layer_window(cfg, layer):
    """The sliding window of one layer as transformers decides it from config.json in either form:
    every layer for Mistral; for Qwen2/Qwen3 only with use_sliding_window, then by layer_types, else
    from max_window_layers on."""
    window = cfg.get("sliding_window")
    arch = cfg["architectures"][0]
    if window is None or arch.startswith("Llama"):
        return None
    if arch == "Qwen3MoeForCausalLM":                                   # transformers 5: one mask, every layer
        return window if cfg.get("use_sliding_window", False) else None
    if not arch.startswith("Qwen"):
        return window
    if not cfg.get("use_sliding_window", False):
        return None
    types = cfg.get("layer_types")
    if types is not None:
        return window if types[layer] == "sliding_attention" else None
    return window if layer >= cfg.get("max_window_layers", 28) else None


def np_moe(w, p, h, k, proj=("w1", "w3", "w2"), renorm=True):
    """Mixtral's (Qwen3-MoE's) sparse MoE block in float64: softmax over the router logits, the top k
    (torch.topk on the float64 probabilities, for its order on ties), renormalised (Qwen3-MoE: if
    norm_topk_prob), the weighted sum of the experts' SwiGLU (proj: the gate, up and down tensor names)."""
    logits = h @ w[p + "gate.weight"].T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    top = torch.topk(torch.from_numpy(probs), k, dim=-1).indices.numpy()
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        wt = probs[t, top[t]] / (probs[t, top[t]].sum() if renorm else 1.0)
        for e, we in zip(top[t], wt):
            q = "%sexperts.%d." % (p, e)
            g = h[t] @ w[q + proj[0] + ".weight"].T
            out[t] += we * (((g / (1 + np.exp(-g))) * (h[t] @ w[q + proj[1] + ".weight"].T))
                            @ w[q + proj[2] + ".weight"].T)
    return out


def np_forward(model_dir, ids):
    """Logits [len(ids), vocab] of a Llama/Mistral checkpoint, float64, straight from the files."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    w = {k: v.double().numpy() for k, v in state_tensors(model_dir).items()}
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // nh
    eps = cfg["rms_norm_eps"]
    t = len(ids)

    inv = np_rope_inv_freq(cfg, hd)
    ang = np.arange(t, dtype=np.float64)[:, None] * inv[None, :]
    cos = np.cos(np.concatenate([ang, ang], -1))[:, None, :]            # [t, 1, hd]
    sin = np.sin(np.concatenate([ang, ang], -1))[:, None, :]

    def rope(x):                                                         # rotate_half pairing (i, i + hd/2)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + np.concatenate([-x2, x1], -1) * sin

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    x = w["model.embed_tokens.weight"][ids]
    for layer in range(cfg["num_hidden_layers"]):
        allowed = j <= i
        window = np_layer_window(cfg, layer)
        if window is not None:
            allowed &= j > i - window                                    # the last `window` keys, self included
        p = "model.layers.%d." % layer
        h = rms(x, w[p + "input_layernorm.weight"])

        def proj(name, heads):                                          # Qwen2: q, k, v carry biases
            y = h @ w[p + "self_attn.%s.weight" % name].T + w.get(p + "self_attn.%s.bias" % name, 0.0)
            return y.reshape(t, heads, hd)
        q, k = proj("q_proj", nh), proj("k_proj", nkv)
        if p + "self_attn.q_norm.weight" in w:                           # Qwen3: RMSNorm per head, before RoPE
            q = rms(q, w[p + "self_attn.q_norm.weight"])
            k = rms(k, w[p + "self_attn.k_norm.weight"])
        q, k = rope(q), rope(k)
        v = proj("v_proj", nkv)
        o = np.empty((t, nh, hd))
        for head in range(nh):
            kv = head // (nh // nkv)
            s = q[:, head] @ k[:, kv].T / np.sqrt(hd)
            s = np.where(allowed, s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            o[:, head] = (s / s.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + o.reshape(t, nh * hd) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        if p + "block_sparse_moe.gate.weight" in w:                      # Mixtral: top-k of E SwiGLU experts
            x = x + np_moe(w, p + "block_sparse_moe.", h, cfg["num_experts_per_tok"])
            continue
        if p + "mlp.gate.weight" in w:                                   # Qwen3-MoE's sparse layers
            x = x + np_moe(w, p + "mlp.", h, cfg["num_experts_per_tok"], ("gate_proj", "up_proj", "down_proj"),
                           cfg.get("norm_topk_prob", False))
            continue
        g = h @ w[p + "mlp.gate_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"])
    head_w = w.get("lm_head.weight")
    if head_w is None:
        check(cfg.get("tie_word_embeddings", True), "%s: no lm_head.weight and not tied" % model_dir)
        head_w = w["model.embed_tokens.weight"]
    return x @ head_w.T


# --------------------------------------------------------------------------
# Goldens
# --------------------------------------------------------------------------

def eos_list(config):
    e = config.eos_token_id
    if e is None:
        return []
    return list(e) if isinstance(e, (list, tuple)) else [e]


def greedy_generate(model, prompt, n, stop_at_eos=False):
    """HF generate, greedy. Returns (new ids, per-step raw logits [n, V] float32)."""
    gc = model.generation_config
    saved = gc.eos_token_id
    if not stop_at_eos:
        gc.eos_token_id = None  # generate() fills unset fields from here; None means never stop
    try:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=False,
                max_new_tokens=n,
                pad_token_id=0,
                output_logits=True,
                return_dict_in_generate=True,
            )
    finally:
        gc.eos_token_id = saved
    new = out.sequences[0, len(prompt):].tolist()
    logits = torch.stack([l[0] for l in out.logits]).float()
    return new, logits


def margins_of(logits):
    top2 = torch.topk(logits.float(), 2, dim=-1).values
    return top2[:, 0] - top2[:, 1]


def first_eos(ids, eos):
    for i, t in enumerate(ids):
        if t in eos:
            return i
    return None


def run_id_case(model, model_dir, prompt, eos):
    p = len(prompt)
    new, step_logits = greedy_generate(model, prompt, NEW_TOKENS)
    check(len(new) == NEW_TOKENS, "generate made %d tokens, want %d" % (len(new), NEW_TOKENS))
    seq = prompt + new
    with torch.no_grad():
        full = model(torch.tensor([seq])).logits[0].float()
    path_logits = full[p - 1: p - 1 + NEW_TOKENS]
    # The golden is sound only if the greedy ids are the argmax of the single
    # full forward we store, and the cached (incremental) path agrees with it.
    check(path_logits.argmax(-1).tolist() == new, "greedy ids != argmax of full forward")
    lr = (full.max() - full.min()).item()
    kv_err = (step_logits - path_logits).abs().max().item()
    check(kv_err <= REL_TOL * lr, "KV-cache logits differ from full forward by %g > %g x range %g"
          % (kv_err, REL_TOL, lr))
    # Independent check in true float64 (HF's own float64 mode still does
    # RMSNorm, softmax and RoPE in float32, so it is no float64 reference).
    ref = np_forward(model_dir, seq)
    np_err = float(np.abs(ref - full.double().numpy()).max())
    check(np_err <= REL_TOL * lr, "HF logits differ from the numpy float64 reference by %g > %g x range %g"
          % (np_err, REL_TOL, lr))
    check(ref[p - 1: p - 1 + NEW_TOKENS].argmax(-1).tolist() == new, "float64 greedy path differs")
    m = margins_of(path_logits)
    stop = first_eos(new, eos)
    # Where HF would really have stopped, run with eos on: it keeps the eos token.
    new_eos, _ = greedy_generate(model, prompt, NEW_TOKENS, stop_at_eos=True)
    want = NEW_TOKENS if stop is None else stop + 1
    check(len(new_eos) == want and new_eos == new[:want], "eos stop: HF made %d tokens, expected %d" % (len(new_eos), want))
    return {
        "new": new,
        "full": full,
        "kv_err": kv_err,
        "np_err": np_err,
        "logit_range": lr,
        "margins": m.tolist(),
        "min_margin": m.min().item(),
        "min_margin_step": int(m.argmin().item()),
        "eos_index": stop,
        "hf_stop_len": want,
    }


def cycle_of(ids):
    """(start, period) of the shortest periodic tail that repeats >= 3 times, or None."""
    n = len(ids)
    for period in range(1, n // 3 + 1):
        start = n - period
        while start > 0 and ids[start - 1] == ids[start - 1 + period]:
            start -= 1
        if n - start >= 3 * period:
            return start, period
    return None


def make_id_golden(name, model_dir, prompts, synthetic, same_weights=()):
    out_dir = os.path.join(REPO, "tests/golden", name)
    fresh_dir(out_dir)
    model = load_f32(model_dir)
    vocab = model.config.vocab_size
    eos = eos_list(model.config)
    cases = []
    for i, prompt in enumerate(prompts):
        check(all(0 <= t < vocab for t in prompt), "prompt id out of vocab")
        r = run_id_case(model, model_dir, prompt, eos)
        fn = "case%d.f32" % i
        sha = write_f32(os.path.join(out_dir, fn), r["full"].numpy())
        lr = r["logit_range"]
        distinct20 = len(set(r["new"][:20]))
        cyc = cycle_of(r["new"])
        if synthetic:
            check(distinct20 >= MIN_DISTINCT_FIRST20,
                  "%s case %d: only %d distinct ids in the first 20" % (name, i, distinct20))
        cases.append({
            "prompt": prompt,
            "greedy": r["new"],
            "logits": fn,
            "logits_sha256": sha,
            "positions": len(prompt) + NEW_TOKENS,
            "vocab": vocab,
            "min_margin": round(r["min_margin"], 6),
            "margins": [round(v, 4) for v in r["margins"]],
            "min_margin_step": r["min_margin_step"],
            "logit_range": round(lr, 6),
            "eos_token_ids": eos,
            "eos_index": r["eos_index"],
            "hf_stop_len": r["hf_stop_len"],
            "kv_cache_max_abs_diff": r["kv_err"],
            "float64_reference_max_abs_diff": r["np_err"],
        })
        print("  %s case %d: prompt %2d ids, min margin %.4f at step %d, logit range %.2f, "
              "kv diff %.2e, float64 ref diff %.2e, distinct in first 20: %d, cycle %s, eos at %s"
              % (name, i, len(prompt), r["min_margin"], r["min_margin_step"], lr, r["kv_err"], r["np_err"],
                 distinct20, cyc, r["eos_index"]))
    write_json(os.path.join(out_dir, "golden.json"), {
        "model": rel(model_dir),
        "model_root": "source",
        "same_weights": [rel(d) for d in same_weights],
        "dtype": "float32",
        "attn_implementation": "eager",
        "new_tokens": NEW_TOKENS,
        "generator": generator_info(),
        "cases": cases,
    })
    return model


def capture_routing(model):
    """Forward hooks on every layer's router. calls[l] gets (probabilities, chosen experts) per call (none for
    a layer with a dense MLP)."""
    calls = [[] for _ in model.model.layers]
    hooks = []
    for l, layer in enumerate(model.model.layers):
        def hook(mod, inp, out, l=l):
            logits, _, idx = out  # Mixtral/Qwen3MoeTopKRouter: (router_logits, router_scores, router_indices)
            calls[l].append((torch.softmax(logits.float(), dim=-1), idx))
        if hasattr(layer.mlp, "gate"):  # a router (a dense MLP has gate_proj)
            hooks.append(layer.mlp.gate.register_forward_hook(hook))
    return calls, hooks


def add_routing_golden(name, model, tie=MIXTRAL_TIE):
    """Add to each case of a MoE golden the experts HF chooses, per layer and position, in torch.topk's
    order, over the full forward (an empty list for a dense layer); check the KV-cache path chooses the
    same; list the tie events (experts `tie` have equal router rows)."""
    path = os.path.join(REPO, "tests/golden", name, "golden.json")
    with open(path) as f:
        golden = json.load(f)
    a, b = tie
    k = model.config.num_experts_per_tok
    n_ties = 0
    for ci, case in enumerate(golden["cases"]):
        seq = case["prompt"] + case["greedy"]
        calls, hooks = capture_routing(model)
        try:
            with torch.no_grad():
                model(torch.tensor([seq]))
            full = [c[0] if c else None for c in calls]
            for c in calls:
                c.clear()
            greedy_generate(model, case["prompt"], len(case["greedy"]))
            steps = [torch.cat([i for _, i in c]) if c else None for c in calls]
        finally:
            for h in hooks:
                h.remove()
        routing, ties, gap = [], [], float("inf")
        for l, f in enumerate(full):
            if f is None:  # a dense layer: nothing routed, in either path
                check(steps[l] is None, "%s case %d layer %d: routed only through the KV cache" % (name, ci, l))
                routing.append([])
                continue
            probs, idx = f
            n_steps = steps[l].shape[0]  # the last generated token is never fed back
            check(n_steps == len(seq) - 1 and torch.equal(steps[l], idx[:n_steps]),
                  "%s case %d layer %d: the KV-cache path routes differently from the full forward" % (name, ci, l))
            routing.append(idx.tolist())
            for t in range(len(seq)):
                srt = torch.sort(probs[t], descending=True).values
                chosen = set(idx[t].tolist())
                if probs[t, a] == probs[t, b] and len(chosen & {a, b}) == 1:
                    ties.append([l, t])  # the tie decided which expert runs
                elif srt[k - 1] > srt[k]:
                    gap = min(gap, (srt[k - 1] - srt[k]).item())
        check(gap > 1e-5, "%s case %d: a router margin of %g could flip in float32" % (name, ci, gap))
        case["routing"] = routing
        case["router_ties"] = ties
        case["router_min_margin"] = gap
        n_ties += len(ties)
        print("  %s case %d: routing of %d positions x %d layers, %d decided by a tie, smallest other margin %.2e"
              % (name, ci, len(seq), len(routing), len(ties), gap))
    check(n_ties > 0, "%s: no token's routing is decided by the tied experts" % name)
    write_json(path, golden)


def make_topk_golden():
    """torch.topk's order on the CPU over inputs full of ties: every (n, k) path of its implementation
    (nth_element + sort, partial_sort when k * 64 <= n, sort past 16 elements), and NaNs (written as null)."""
    out_dir = os.path.join(REPO, "tests/golden/topk-ties")
    fresh_dir(out_dir)
    g = torch.Generator().manual_seed(7)
    cases = []
    for n in (2, 3, 4, 5, 8, 16, 33, 64, 128, 256):
        for k in (1, 2, 3, 4, 8, 17, 24):
            for levels in (1, 3):
                if k > n:
                    continue
                v = torch.randint(0, levels, (n,), generator=g).float()
                cases.append({"k": k, "values": [int(x) for x in v.tolist()], "indices": torch.topk(v, k).indices.tolist()})
    for n, k, nans in ((8, 2, 2), (8, 4, 3), (16, 3, 5), (128, 2, 4)):
        v = torch.randint(0, 3, (n,), generator=g).float()
        v[torch.randperm(n, generator=g)[:nans]] = float("nan")
        cases.append({"k": k, "values": [None if x != x else int(x) for x in v.tolist()],
                      "indices": torch.topk(v, k).indices.tolist()})
    check(torch.topk(torch.full((8,), 0.25), 2).indices.tolist() != [0, 1], "torch.topk ties are lowest-first here")
    write_json(os.path.join(out_dir, "golden.json"), {"what": "torch.topk(values, k).indices on the CPU (sorted, "
                                                      "largest); null = NaN", "generator": generator_info(),
                                                      "cases": cases})
    print("topk-ties: %d cases" % len(cases))


def negative_controls(mistral_dir, llama_dir):
    """Show that the sliding window and the llama3 scaling change the logits (printed only)."""
    x = torch.tensor([ID_PROMPTS[2] + list(range(100, 100 + NEW_TOKENS))])
    with torch.no_grad():
        m = load_f32(mistral_dir)
        a = m(x).logits[0]
        cfg = m.config
        cfg.sliding_window = None
        cfg._attn_implementation = "eager"
        m2 = MistralForCausalLM(cfg).eval()
        m2.load_state_dict(m.state_dict())
        b = m2(x).logits[0]
        w = 8
        lr = (a.max() - a.min()).item()
        before = (a[:w] - b[:w]).abs().max().item()
        after = (a[w:] - b[w:]).abs().max().item()
        print("control: tiny-mistral sliding_window=8 vs None: positions < 8 max diff %.2e, "
              ">= 8 max diff %.3f (= %.3f x logit range)" % (before, after, after / lr))
        check(before <= 1e-5, "sliding window changes positions inside the window")
        check(after > 0.05 * lr, "sliding window does not matter for this model")

        l = load_f32(llama_dir)
        a = l(x).logits[0]
        cfg = l.config
        cfg.rope_parameters = {"rope_type": "default", "rope_theta": 500000.0}
        cfg._attn_implementation = "eager"
        l2 = LlamaForCausalLM(cfg).eval()
        l2.load_state_dict(l.state_dict())
        b = l2(x).logits[0]
        lr = (a.max() - a.min()).item()
        d0 = (a[0] - b[0]).abs().max().item()
        rest = (a[1:] - b[1:]).abs().max().item()
        print("control: tiny-llama3 llama3 rope scaling vs default rope: position 0 diff %.2e, "
              "later max diff %.3f (= %.3f x logit range)" % (d0, rest, rest / lr))
        check(d0 <= 1e-5, "rope scaling changes position 0")
        check(rest > 0.05 * lr, "llama3 rope scaling does not matter for this model")


# --------------------------------------------------------------------------
# pycode-22m: text end to end
# --------------------------------------------------------------------------

PYCODE_CASES = [
    ("def fibonacci(n):", 40),
    ("import os\n", 64),
    ("class Stack:\n    def __init__(self):", 64),
]


def make_pycode_golden(shared):
    mdir = os.path.join(shared, "models/pycode-22m")
    check(os.path.isdir(mdir), "no %s (pass --shared-dir)" % mdir)
    out_dir = os.path.join(REPO, "tests/golden/pycode-22m")
    fresh_dir(out_dir)
    tok = tokenizers.Tokenizer.from_file(os.path.join(mdir, "tokenizer.json"))
    models = {
        "float32": load_f32(mdir),
        "bfloat16": AutoModelForCausalLM.from_pretrained(
            mdir, dtype=torch.bfloat16, attn_implementation="eager").eval(),
    }
    eos = eos_list(models["float32"].config)
    cases = []
    for ci, (text, n) in enumerate(PYCODE_CASES):
        prompt = tok.encode(text, add_special_tokens=True).ids
        check(prompt[0] == 1, "pycode prompt does not start with BOS")
        case = {"text": text, "add_special_tokens": True, "prompt": prompt, "max_new_tokens": n}
        for dname, model in models.items():
            new, step_logits = greedy_generate(model, prompt, n)
            check(len(new) == n, "pycode generate made %d tokens" % len(new))
            with torch.no_grad():
                full = model(torch.tensor([prompt + new])).logits[0].float()
            path = full[len(prompt) - 1: len(prompt) - 1 + n]
            full_argmax_agrees = path.argmax(-1).tolist() == new
            kv_err = (step_logits - path).abs().max().item()
            if dname == "float32":
                check(full_argmax_agrees, "pycode f32: greedy != argmax of full forward")
                lr = (path.max() - path.min()).item()
                check(kv_err <= REL_TOL * lr,
                      "pycode f32: KV-cache logits differ from full forward by %g" % kv_err)
                ref = np_forward(mdir, prompt + new)
                np_err = float(np.abs(ref - full.double().numpy()).max())
                check(np_err <= REL_TOL * lr, "pycode f32: differs from the numpy float64 reference by %g" % np_err)
                check(ref[len(prompt) - 1: len(prompt) - 1 + n].argmax(-1).tolist() == new,
                      "pycode: float64 greedy path differs")
            m = margins_of(step_logits)  # the logits that actually chose each token
            res = {
                "greedy": new,
                "completion_text": tok.decode(new, skip_special_tokens=True),
                "full_text": tok.decode(prompt + new, skip_special_tokens=True),
                "min_margin": round(m.min().item(), 6),
                "margins": [round(v, 4) for v in m.tolist()],
                "min_margin_step": int(m.argmin().item()),
                "eos_index": first_eos(new, eos),
                "kv_cache_max_abs_diff": kv_err,
                "full_forward_argmax_agrees": full_argmax_agrees,
            }
            if dname == "float32":
                res["float64_reference_max_abs_diff"] = np_err
            if ci == 0 and dname == "float32":
                with torch.no_grad():
                    last = model(torch.tensor([prompt])).logits[0, -1].float()
                d = (last - full[len(prompt) - 1]).abs().max().item()
                check(d <= REL_TOL * (last.max() - last.min()).item(),
                      "prompt-only forward differs from the longer forward at the prompt's last position by %g" % d)
                fn = "fib_prompt_last.f32"
                res["prompt_last_logits"] = fn
                res["prompt_last_logits_sha256"] = write_f32(os.path.join(out_dir, fn), last.numpy())
                res["prompt_last_logit_range"] = round((last.max() - last.min()).item(), 6)
                res["prompt_last_argmax"] = int(last.argmax().item())
            case[dname] = res
            print("  pycode-22m case %d %-8s: %d prompt ids, min margin %.4f at step %d, kv diff %.2e, "
                  "full-forward argmax agrees: %s, float64 ref diff %s, eos at %s"
                  % (ci, dname, len(prompt), res["min_margin"], res["min_margin_step"], kv_err,
                     full_argmax_agrees, ("%.2e" % res["float64_reference_max_abs_diff"]) if dname == "float32" else "-", res["eos_index"]))
            print("    %r" % res["full_text"])
        f, b = case["float32"]["greedy"], case["bfloat16"]["greedy"]
        case["f32_bf16_first_divergence"] = next((i for i in range(n) if f[i] != b[i]), None)
        cases.append(case)
    write_json(os.path.join(out_dir, "golden.json"), {
        "model": "models/pycode-22m",
        "model_root": "shared",
        "tokenizer": "models/pycode-22m/tokenizer.json",
        "vocab": models["float32"].config.vocab_size,
        "attn_implementation": "eager",
        "decode": "tokenizers.Tokenizer.decode(ids, skip_special_tokens=True)",
        "generator": generator_info(),
        "cases": cases,
    })


def make_mixtral_goldens():
    model = make_id_golden("tiny-mixtral", make_tiny_mixtral(), ID_PROMPTS, synthetic=True)
    add_routing_golden("tiny-mixtral", model)
    make_topk_golden()


def make_qwen3_moe_goldens():
    model = make_id_golden("tiny-qwen3-moe", make_tiny_qwen3_moe(), ID_PROMPTS, synthetic=True)
    add_routing_golden("tiny-qwen3-moe", model, QWEN3_MOE_TIE)
    model = make_id_golden("tiny-qwen3-moe-nonorm", make_tiny_qwen3_moe_nonorm(), ID_PROMPTS, synthetic=True)
    add_routing_golden("tiny-qwen3-moe-nonorm", model, QWEN3_MOE_NONORM_TIE)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shared-dir", default=os.path.join(os.path.dirname(REPO), "shared"),
                    help="kiln's shared test-data dir (holds models/pycode-22m); default: ../shared")
    ap.add_argument("--only", choices=["tiny-qwen3", "tiny-qwen2", "tiny-mixtral", "tiny-qwen3-moe", "quant"],
                    help="make this checkpoint and golden alone")
    args = ap.parse_args()

    torch.set_num_threads(1)  # fixed reduction order: reruns are byte-identical
    torch.use_deterministic_algorithms(True)
    print("torch %s, transformers %s, tokenizers %s"
          % (torch.__version__, transformers.__version__, tokenizers.__version__))

    if args.only == "tiny-qwen3":
        make_id_golden("tiny-qwen3", make_tiny_qwen3(), ID_PROMPTS, synthetic=True)
        print("make_goldens: all checks passed (tiny-qwen3 only)")
        return
    if args.only == "quant":
        make_quant_goldens()
        print("make_goldens: all checks passed (quant only)")
        return
    if args.only == "tiny-qwen2":
        make_id_golden("tiny-qwen2", make_tiny_qwen2(), ID_PROMPTS, synthetic=True)
        print("make_goldens: all checks passed (tiny-qwen2 only)")
        return
    if args.only == "tiny-mixtral":
        make_mixtral_goldens()
        print("make_goldens: all checks passed (tiny-mixtral only)")
        return
    if args.only == "tiny-qwen3-moe":
        make_qwen3_moe_goldens()
        print("make_goldens: all checks passed (tiny-qwen3-moe only)")
        return
    mistral = make_tiny_mistral()
    llama3 = make_tiny_llama3()
    negative_controls(mistral, llama3)
    make_id_golden("stories260k", os.path.join(REPO, "models/stories260k"), STORIES_PROMPTS, synthetic=False)
    make_id_golden("tiny-mistral", mistral, ID_PROMPTS, synthetic=True,
                   same_weights=[os.path.join(REPO, "tests/data/tiny-mistral-sharded")])
    make_id_golden("tiny-llama3", llama3, LLAMA3_PROMPTS, synthetic=True)
    make_id_golden("tiny-qwen3", make_tiny_qwen3(), ID_PROMPTS, synthetic=True)
    make_id_golden("tiny-qwen2", make_tiny_qwen2(), ID_PROMPTS, synthetic=True)
    make_mixtral_goldens()
    make_qwen3_moe_goldens()
    make_quant_goldens()
    make_pycode_golden(args.shared_dir)
    print("make_goldens: all checks passed")


if __name__ == "__main__":
    main()
