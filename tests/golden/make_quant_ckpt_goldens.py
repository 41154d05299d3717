#!/usr/bin/env python3
"""Tiny published-style quantized checkpoints (AWQ, GPTQ, compressed-tensors, FP8) and their goldens.

From tests/data/tiny-mistral's weights this writes six checkpoints whose
projections (q/k/v/o, gate/up/down) are 4-bit, quantized round-to-nearest in
groups of 32 input columns and packed as the formats' own code packs them
(written again here in numpy from their documentation and source, not taken
from kiln):

  tests/data/tiny-mistral-awq        AutoAWQ "gemm": qweight [in, out/8], nibble i of a word holds
                                     output column 8j + [0, 2, 4, 6, 1, 3, 5, 7][i]; qzeros
                                     [in/32, out/8] the same way; scales [in/32, out] fp16; asymmetric
  tests/data/tiny-mistral-gptq       GPTQ v1 (checkpoint_format "gptq"), sym: qweight [in/8, out],
                                     nibble i of word [r, n] = input row 8r + i; qzeros [in/32, out/8]
                                     along out, stored zero - 1 (8 - 1 = 7); scales; g_idx = i // 32
  tests/data/tiny-mistral-gptq-asym  GPTQ v1, asymmetric, desc_act true with the trivial g_idx (what
                                     act-order checkpoints of one group order look like)
  tests/data/tiny-mistral-gptq-v2    GPTQ v2 (checkpoint_format "gptq_v2"): zeros stored as they are
  tests/data/tiny-mistral-gptq-dynamic  GPTQ v1, asymmetric, with GPTQModel's per-module "dynamic" map
                                     (DYNAMIC below): layer 0's attention projections left unquantized
                                     (bf16 .weight as in tiny-mistral), layer 1's MLP in groups of 64,
                                     a rule that changes nothing for the down_proj it matches after;
                                     which rule decides a module is Python's re.match here, in map order
  tests/data/tiny-mistral-gptq-actorder  GPTQ v1, asymmetric, desc_act true with permuting g_idx (ACT_ORDER
                                     below): each projection's input columns are taken in a random
                                     order (one per input, as GPTQ orders columns by the Hessian of that
                                     input: q/k/v share one, gate/up one), each run of 32 in that order
                                     is a group, g_idx[order[j]] = j // 32, and qweight stays in the
                                     checkpoint's column order; layer 1's o_proj keeps groups in order,
                                     and a dynamic map leaves layer 1's gate/up unquantized (bf16)
  tests/data/tiny-mistral-ct-actorder  compressed-tensors, asymmetric, f16 scales, actorder "group": every
                                     projection's columns grouped in a random order as for the GPTQ one,
                                     weight_g_idx I32 [in] the group of each column (llm-compressor's
                                     GPTQModifier with actorder="group" saves it so)
  tests/data/tiny-mistral-ct         compressed-tensors "pack-quantized" (llm-compressor's W4A16),
                                     symmetric: weight_packed [out, in/8], nibble i of word [r, j] =
                                     signed code of column 8j + i, plus 8 (pack_to_int32); weight_scale
                                     [out, in/32] bf16; weight_shape int64 [2]; no zero points
  tests/data/tiny-mistral-ct-asym    the same, asymmetric: weight_zero_point [out/8, in/32] packed
                                     along out (pack_to_int32 packed_dim 0), signed zero plus 8;
                                     weight_scale fp16; weight_shape int32 (older releases' dtype)

and four FP8 E4M3 checkpoints, the codes made by torch's float8_e4m3fn cast
(round to nearest even, after clamping to +-448 as AutoFP8 and
llm-compressor do), not by kiln:

  tests/data/tiny-mistral-fp8-tensor     quant_method "fp8", activation_scheme "static" (AutoFP8, vLLM):
                                         <proj>.weight F8_E4M3 [out, in], weight_scale F32 (one per
                                         tensor: max|w| / 448), input_scale F32 (max|x| / 448 of the
                                         projection's input over the prompts, from HF hooks); scalars []
                                         in layer 0 (AutoFP8) and [1] in layer 1 (vLLM reads both)
  tests/data/tiny-mistral-fp8-channel    compressed-tensors "float-quantized", llm-compressor's
                                         FP8_DYNAMIC: strategy channel, weight_scale BF16 [out, 1],
                                         input activations dynamic per token (nothing stored)
  tests/data/tiny-mistral-fp8-ct-tensor  compressed-tensors "float-quantized", llm-compressor's FP8
                                         (static W8A8): strategy tensor, weight_scale and input_scale
                                         BF16 [1]
  tests/data/tiny-mistral-fp8-block      quant_method "fp8", weight_block_size [128, 128] (DeepSeek-V3 /
                                         Qwen3-FP8): weight_scale_inv F32 [ceil(out/128), ceil(in/128)]
                                         (tiny-mistral's matrices fit one block: its values are the
                                         per-tensor ones)
  tests/data/tiny-llama3-fp8-block       the same from tiny-llama3 (MLP 192 wide: gate/up 2 row
                                         blocks, down 2 column blocks, the second of each short)
  tests/data/tiny-llama3-fp8-ct-block    compressed-tensors "float-quantized", llm-compressor's FP8_BLOCK:
                                         strategy block, block_structure [128, 128], weight_scale BF16
                                         [ceil(out/128), ceil(in/128)], inputs dynamic per group of 128

The embedding, norms and LM head stay bf16 as in tiny-mistral. Each
config.json carries the quantization_config transformers / AutoAWQ /
AutoGPTQ / AutoFP8 / llm-compressor write.

The goldens (tests/golden/<same name>/) come from HuggingFace transformers,
float32, eager, run on a dense checkpoint made by an independent numpy
dequantization of the packed tensors: unpack the nibbles (AWQ's reverse
order [0, 4, 1, 5, 2, 6, 3, 7], as its readers do; compressed-tensors'
nibble - 8 as unpack_from_int32 does), then (q - z) * s; FP8: each code's
value from its sign, exponent and mantissa bits (checked against torch's
own float8 -> float32 conversion), times its scale, in float32. So the
C test (test_golden) checks kiln's reading and repacking of the packed bytes,
not only its arithmetic. The script also checks that unpacking gives back the
codes and zeros it packed.

Run from the repository root: python3 tests/golden/make_quant_ckpt_goldens.py [NAME...]
(no names: all of them)
Versions: as make_goldens.py (each golden.json records them under generator).
"""
import json
import os
import re
import shutil
import sys
import tempfile

import numpy as np
import safetensors.torch
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_goldens as mg  # noqa: E402  (the golden format, prompts and checks)

mg.SCRIPT = "tests/golden/make_quant_ckpt_goldens.py"
REPO = mg.REPO
GROUP = 32
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]          # AutoAWQ's pack: nibble i <- column AWQ_ORDER[i] of 8
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]  # its readers' unpack: column j <- nibble AWQ_REVERSE_ORDER[j]
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# (checkpoint / golden name, format, symmetric, checkpoint_format, desc_act, prompts). The three
# asymmetric AWQ/GPTQ ones hold the same dequantized weights in three packings (so the same
# goldens); for compressed-tensors the fourth field is the scales' dtype. The symmetric ones' prompts are those of make_goldens.py whose greedy paths keep a top-1/top-2 margin
# of at least MIN_MARGIN (ID_PROMPTS[1] comes within 1e-4 at one step).
MIN_MARGIN = 1e-3
CHECKPOINTS = [
    ("tiny-mistral-awq", "awq", False, None, False, mg.ID_PROMPTS[1:]),
    ("tiny-mistral-gptq", "gptq", True, "gptq", False, [mg.ID_PROMPTS[0], mg.ID_PROMPTS[2]]),
    ("tiny-mistral-gptq-asym", "gptq", False, "gptq", True, mg.ID_PROMPTS[1:]),
    ("tiny-mistral-gptq-v2", "gptq", False, "gptq_v2", False, mg.ID_PROMPTS[1:]),
    ("tiny-mistral-ct", "ct", True, "bf16", False, [mg.ID_PROMPTS[0], mg.ID_PROMPTS[2]]),
    ("tiny-mistral-ct-asym", "ct", False, "f16", False, mg.ID_PROMPTS[1:]),
    ("tiny-mistral-gptq-dynamic", "gptq", False, "gptq", False, mg.ID_PROMPTS[1:]),
    ("tiny-mistral-gptq-actorder", "gptq", False, "gptq", True, mg.ID_PROMPTS[1:]),
    ("tiny-mistral-ct-actorder", "ct", False, "f16", True, mg.ID_PROMPTS[1:]),
]
# Act-order checkpoints: the seed of each projection's column order, by the input it reads (projections of
# one input share it); a module not listed keeps its groups in column order.
ACT_ORDER_INPUTS = {
    "self_attn.q_proj": "attn_in", "self_attn.k_proj": "attn_in", "self_attn.v_proj": "attn_in",
    "self_attn.o_proj": "o_in", "mlp.gate_proj": "mlp_in", "mlp.up_proj": "mlp_in", "mlp.down_proj": "down_in",
}
ACT_ORDER = {"tiny-mistral-gptq-actorder": ACT_ORDER_INPUTS, "tiny-mistral-ct-actorder": ACT_ORDER_INPUTS}
ACT_ORDER_KEEP = {"tiny-mistral-gptq-actorder": {"model.layers.1.self_attn.o_proj"}}


def act_order(name, base, k):
    """The column order GPTQ's act-order would quantize projection `base` of checkpoint `name` in (a
    permutation of range(k), one per layer and input), or None for groups in column order."""
    table = ACT_ORDER.get(name)
    if not table or base in ACT_ORDER_KEEP.get(name, ()):
        return None
    layer, proj = base.split(".")[2], ".".join(base.split(".")[3:])
    key = "%s/%s/%s" % (name, layer, table[proj])
    rng = np.random.default_rng(int.from_bytes(key.encode(), "little") % (1 << 63))
    return rng.permutation(k)
# GPTQModel's dynamic map of tiny-mistral-gptq-dynamic: "-:" rules leave modules unquantized, the others
# ("+:" or none) override the base's settings; the first rule whose pattern matches the module's name
# (re.match) decides (GPTQModel's and vLLM's get_dynamic_override)
DYNAMIC = {
    # layer 1's gate/up left dense while its down_proj is act-order: the down_proj order folds into dense rows
    "tiny-mistral-gptq-actorder": {r"-:model\.layers\.1\.mlp\.(gate|up)_proj": {}},
    "tiny-mistral-gptq-dynamic": {
        r"-:model\.layers\.0\.self_attn\.(q|k|v|o)_proj": {},
        r"+:model\.layers\.1\.mlp\..*": {"group_size": 64, "damp_percent": 0.05},
        r".*\.down_proj": {"desc_act": False},
    },
}


def dynamic_rule(dynamic, module):
    """(left unquantized, group size) of module under a dynamic map."""
    for key, ov in (dynamic or {}).items():
        if key.startswith("-:"):
            if re.match(key[2:], module):
                return True, None
        elif re.match(key[2:] if key.startswith("+:") else key, module):
            return False, ov.get("group_size", GROUP)
    return False, GROUP


def quantize(w, sym, sdt="f16", zero_in_range=False, group=GROUP):
    """RTN 4-bit of w [out, in] in groups of GROUP input columns, as AutoAWQ (asymmetric:
    scale = (max - min) / 15, zero = clamp(-round(min / scale), 0, 15)) and GPTQ (sym: scale =
    2 max|w| / 15, zero 8) compute it; scales rounded to fp16 (sdt "bf16": bfloat16) first, so the
    codes are for the stored scale. compressed-tensors computes the same in signed terms (sym:
    scale = max|w| / 7.5, code in -8..7; asym: zero = round(-8 - min / scale)), i.e. these codes and
    zeros minus 8, with its range widened to hold 0 (zero_in_range). Returns codes q [out, in],
    zeros z [out, in/G] (ints 0..15), scales s [out, in/G] float32 holding the rounded values."""
    n, k = w.shape
    x = w.astype(np.float32).reshape(n, k // group, group)
    rnd = ((lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).bfloat16().float().numpy())
           if sdt == "bf16" else (lambda a: a.astype(np.float16).astype(np.float32)))
    if sym:
        xmax = np.maximum(np.abs(x.min(axis=2)), x.max(axis=2))
        s = rnd(2 * xmax / 15)
        z = np.full(s.shape, 8, dtype=np.int64)
    else:
        lo, hi = x.min(axis=2), x.max(axis=2)
        if zero_in_range:
            lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
        s = rnd(np.maximum(hi - lo, 1e-5) / 15)
        z = np.clip(-np.rint(lo / s), 0, 15).astype(np.int64)
    q = np.clip(np.rint(x / s[:, :, None]) + z[:, :, None], 0, 15).astype(np.int64)
    return q.reshape(n, k), z, s


def pack_rows(a, order=range(8)):
    """a [R, C] ints 0..15 -> int32 [R, C/8]: nibble i of word [r, j] = a[r, 8j + order[i]]."""
    r, c = a.shape
    out = np.zeros((r, c // 8), dtype=np.uint32)
    for i, o in enumerate(order):
        out |= (a[:, o::8].astype(np.uint32) & 0xF) << np.uint32(4 * i)
    return out.view(np.int32)


def pack_cols(a):
    """a [R, C] ints 0..15 -> int32 [R/8, C] (GPTQ's qweight): nibble i of word [r, c] = a[8r + i, c]."""
    r, c = a.shape
    out = np.zeros((r // 8, c), dtype=np.uint32)
    for i in range(8):
        out |= (a[i::8, :].astype(np.uint32) & 0xF) << np.uint32(4 * i)
    return out.view(np.int32)


def pack(fmt, ckfmt, q, z, s, sym=False, group=GROUP, g_idx=None):
    """The checkpoint tensors of one projection (suffix -> numpy array or torch tensor); GPTQ's g_idx
    i // group unless given."""
    n, k = q.shape
    if fmt == "ct":  # compressed-tensors pack_to_int32: stored = signed + 8 = these unsigned nibbles
        t = {"weight_packed": pack_rows(q),  # [out, in/8] along in
             "weight_scale": torch.from_numpy(s).to(torch.bfloat16 if ckfmt == "bf16" else torch.float16),
             "weight_shape": np.array([n, k], dtype=np.int64 if ckfmt == "bf16" else np.int32)}
        if not sym:
            t["weight_zero_point"] = pack_cols(z)  # [out/8, in/G] along out (packed_dim 0)
        if g_idx is not None:
            t["weight_g_idx"] = g_idx.astype(np.int32)  # actorder "group"
        return t
    s = s.astype(np.float16)
    if fmt == "awq":  # transposed: [in, out], packed along out in AWQ's order
        return {"qweight": pack_rows(q.T, AWQ_ORDER), "qzeros": pack_rows(z.T, AWQ_ORDER),
                "scales": np.ascontiguousarray(s.T)}
    stored = z.T - (1 if ckfmt == "gptq" else 0)  # v1 stores zero - 1
    mg.check(stored.min() >= 0, "GPTQ v1 with a zero of 0 (stored as -1) is not a case this writes")
    return {"qweight": pack_cols(np.ascontiguousarray(q.T)), "qzeros": pack_rows(stored),
            "scales": np.ascontiguousarray(s.T),
            "g_idx": (np.arange(k) // group if g_idx is None else g_idx).astype(np.int32)}


def unpack_dequant(fmt, ckfmt, t):
    """Independent reader: the dense [out, in] float32 matrix (q - z) * s from the packed tensors."""
    shifts = np.arange(0, 32, 4, dtype=np.uint32)
    nib = lambda w: ((w.view(np.uint32)[..., None] >> shifts) & 0xF).astype(np.int64)  # [..., 8]
    if fmt == "ct":  # unpack_from_int32: nibble - 8, signed; zeros 0 when there are none (symmetric)
        n, k = (int(v) for v in t["weight_shape"])
        s = t["weight_scale"].float().numpy()                                  # [out, in/G]
        qs = nib(t["weight_packed"]).reshape(n, k) - 8
        zs = (np.transpose(nib(t["weight_zero_point"]), (0, 2, 1)).reshape(n, -1) - 8
              if "weight_zero_point" in t else np.zeros(s.shape, dtype=np.int64))
        g = (np.asarray(t["weight_g_idx"], dtype=np.int64) if "weight_g_idx" in t
             else np.arange(k) // (k // s.shape[1]))
        w = (qs - zs[:, g]).astype(np.float32) * s[:, g]
        return np.ascontiguousarray(w), qs + 8, zs + 8
    if fmt == "awq":
        qw = nib(t["qweight"]).reshape(t["qweight"].shape[0], -1)            # [in, out], AWQ's order
        qz = nib(t["qzeros"]).reshape(t["qzeros"].shape[0], -1)
        rev = (np.arange(qw.shape[1]).reshape(-1, 8)[:, AWQ_REVERSE_ORDER]).reshape(-1)
        iw, iz = qw[:, rev], qz[:, rev]
        g_idx = np.arange(iw.shape[0]) // (iw.shape[0] // qz.shape[0])
    else:
        iw = np.transpose(nib(t["qweight"]), (0, 2, 1)).reshape(-1, t["qweight"].shape[1])  # [in, out]
        iz = nib(t["qzeros"]).reshape(t["qzeros"].shape[0], -1) + (1 if ckfmt == "gptq" else 0)
        g_idx = t["g_idx"].astype(np.int64)
    s = t["scales"].astype(np.float32)
    w = (iw - iz[g_idx]).astype(np.float32) * s[g_idx]
    return np.ascontiguousarray(w.T), iw.T, iz.T


def quant_config(fmt, sym, ckfmt, desc_act, dynamic=None):
    if fmt == "ct":  # as llm-compressor saves a W4A16 group-32 scheme (QuantizationConfig.model_dump)
        weights = {"actorder": "group" if desc_act else None, "block_structure": None, "dynamic": False,
                   "group_size": GROUP, "num_bits": 4,
                   "observer": "minmax", "observer_kwargs": {}, "scale_dtype": None, "strategy": "group",
                   "symmetric": sym, "type": "int", "zp_dtype": None if sym else "torch.int8"}
        return {"config_groups": {"group_0": {"format": "pack-quantized", "input_activations": None,
                                              "output_activations": None, "targets": ["Linear"],
                                              "weights": weights}},
                "format": "pack-quantized", "global_compression_ratio": None, "ignore": ["lm_head"],
                "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed",
                "sparsity_config": {}, "transform_config": {}, "version": "0.12.2"}
    if fmt == "awq":  # transformers' AwqConfig as AutoAWQ saves it
        return {"bits": 4, "group_size": GROUP, "modules_to_not_convert": None, "quant_method": "awq",
                "version": "gemm", "zero_point": True}
    qc = {"bits": 4, "checkpoint_format": ckfmt, "damp_percent": 0.01, "desc_act": desc_act,
          "group_size": GROUP, "model_file_base_name": None, "model_name_or_path": None,
          "quant_method": "gptq", "static_groups": False, "sym": sym, "true_sequential": True}
    if dynamic:
        qc["dynamic"] = dynamic
    return qc


def make_one(name, fmt, sym, ckfmt, desc_act, prompts):
    src = os.path.join(REPO, "tests/data/tiny-mistral")
    d = os.path.join(REPO, "tests/data", name)
    dense = {}
    out = {}
    dynamic = DYNAMIC.get(name)
    for k, v in mg.state_tensors(src).items():
        base = k[:-len(".weight")]
        skip, group = dynamic_rule(dynamic, base)
        if not base.endswith(PROJ) or skip:
            out[k] = v  # embedding, norms, LM head (and what a dynamic "-:" rule skips): bf16 as they are
            dense[k] = v.float()
            continue
        ct = fmt == "ct"
        wv = v.float().numpy()
        order = act_order(name, base, wv.shape[1])
        g_idx = None
        if order is not None:  # act-order: groups of `group` columns in that order, codes in column order
            qp, z, s = quantize(np.ascontiguousarray(wv[:, order]), sym, ckfmt if ct else "f16", zero_in_range=ct,
                                group=group)
            q = np.empty_like(qp)
            q[:, order] = qp
            g_idx = np.empty(wv.shape[1], dtype=np.int64)
            g_idx[order] = np.arange(wv.shape[1]) // group
        else:
            q, z, s = quantize(wv, sym, ckfmt if ct else "f16", zero_in_range=ct, group=group)
        t = pack(fmt, ckfmt, q, z, s, sym, group, g_idx)
        w, q2, z2 = unpack_dequant(fmt, ckfmt, t)
        mg.check(np.array_equal(q2, q) and np.array_equal(z2, z), "%s %s: unpack != pack" % (name, k))
        for suffix, a in t.items():
            out[base + "." + suffix] = a if torch.is_tensor(a) else torch.from_numpy(np.ascontiguousarray(a))
        dense[k] = torch.from_numpy(w)
    mg.fresh_dir(d)
    safetensors.torch.save_file(out, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    os.chmod(os.path.join(d, "model.safetensors"), 0o644)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    shutil.copy(os.path.join(src, "generation_config.json"), d)
    qcfg = dict(cfg, quantization_config=quant_config(fmt, sym, ckfmt, desc_act, dynamic))
    mg.write_json(os.path.join(d, "config.json"), qcfg)
    with tempfile.TemporaryDirectory() as tmp:  # the dense float32 checkpoint HF runs
        shutil.copy(os.path.join(src, "generation_config.json"), tmp)
        mg.write_json(os.path.join(tmp, "config.json"), cfg)
        safetensors.torch.save_file({k: v.contiguous() for k, v in dense.items()},
                                    os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        mg.make_id_golden(name, tmp, prompts, synthetic=False)
    gpath = os.path.join(REPO, "tests/golden", name, "golden.json")
    with open(gpath) as f:
        gj = json.load(f)
    for i, c in enumerate(gj["cases"]):
        mg.check(c["min_margin"] >= MIN_MARGIN, "%s case %d: greedy margin %g" % (name, i, c["min_margin"]))
    gj["model"] = "tests/data/" + name
    gj["quantization"] = {"checkpoint": qcfg["quantization_config"],
                          "reference": "tests/golden/make_quant_ckpt_goldens.py unpack_dequant (numpy: "
                                       "(q - z) * s from the packed tensors)"}
    mg.write_json(gpath, gj)
    print("%s: %d tensors, %s%s, group %d, %d bytes" % (name, len(out), fmt, " " + ckfmt if ckfmt else "", GROUP,
                                                         os.path.getsize(os.path.join(d, "model.safetensors"))))


# ---- FP8 E4M3 ----------------------------------------------------------------------------------------

# (checkpoint / golden name, producer, scales, activations, scale dtype, prompts): producer "fp8" is
# quant_method "fp8" (AutoFP8 / vLLM layout), "ct" compressed-tensors float-quantized; scales
# "tensor", "channel" or "block" (128 x 128, refused by kiln: no golden, prompts None). The two longer
# prompts of make_goldens.py (their greedy paths keep margins of at least MIN_MARGIN).
FP8_CHECKPOINTS = [
    ("tiny-mistral-fp8-tensor", "fp8", "tensor", "static", torch.float32, mg.ID_PROMPTS[1:]),
    ("tiny-mistral-fp8-channel", "ct", "channel", "dynamic", torch.bfloat16, mg.ID_PROMPTS[1:]),
    ("tiny-mistral-fp8-ct-tensor", "ct", "tensor", "static", torch.bfloat16, mg.ID_PROMPTS[1:]),
    ("tiny-mistral-fp8-block", "fp8", "block", "dynamic", torch.float32, mg.ID_PROMPTS[1:]),
    # tiny-llama3's 192-wide MLP: gate/up two row blocks (128 + 64 rows), down two column blocks (128 + 64
    # columns), so scales differ along rows and columns of one matrix
    ("tiny-llama3-fp8-block", "fp8", "block", "dynamic", torch.float32, mg.ID_PROMPTS[1:], "tiny-llama3"),
    # llm-compressor's FP8_BLOCK: compressed-tensors strategy "block", block_structure [128, 128], weight_scale
    # per block (bf16), input activations dynamic per group of 128 (nothing stored)
    ("tiny-llama3-fp8-ct-block", "ct", "block", "dynamic", torch.bfloat16, mg.ID_PROMPTS[1:], "tiny-llama3"),
]
FP8_MAX = 448.0
FP8_BLOCK = 128


def e4m3_decode(codes):
    """float32 values of E4M3 ("e4m3fn") codes (uint8 array) from the format's definition: sign bit 7,
    exponent bits 6..3 (bias 7), mantissa bits 2..0; exponent 0 is subnormal (m * 2^-9); exponent 15
    with mantissa 7 is NaN (there are no infinities)."""
    c = codes.astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    e, m = (c >> 3) & 15, c & 7
    v = np.where(e == 0, m * 2.0 ** -9, (8 + m) * np.ldexp(1.0, e - 10))
    v = np.where((e == 15) & (m == 7), np.nan, v)
    return (sign * v).astype(np.float32)


def fp8_quantize(w, scales, sdt):
    """w [out, in] float32 -> (codes as torch float8_e4m3fn [out, in], scale tensor of dtype sdt): one scale
    per tensor (shape [1]), per output row ([out, 1]) or per 128 x 128 block ([ceil(out/128),
    ceil(in/128)]), each max|w| / 448 over what it covers (AutoFP8, llm-compressor's minmax observer,
    DeepSeek's), rounded to sdt first so the codes are for the stored scale, clamped to +-448 and cast."""
    n, k = w.shape
    wt = torch.from_numpy(w)
    if scales == "block":
        br, bc = -(-n // FP8_BLOCK), -(-k // FP8_BLOCK)
        s = torch.zeros(br, bc)
        for i in range(br):
            for j in range(bc):
                s[i, j] = wt[i * FP8_BLOCK:(i + 1) * FP8_BLOCK, j * FP8_BLOCK:(j + 1) * FP8_BLOCK].abs().max() / FP8_MAX
        s = s.to(sdt)
        full = s.float().repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)[:n, :k]
    else:
        s = (wt.abs().amax(dim=1, keepdim=True) if scales == "channel" else wt.abs().max().reshape(1)) / FP8_MAX
        s = s.to(sdt)
        full = s.float()
    codes = (wt / full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes, s


def fp8_dequant(codes, s, scales):
    """Independent reader: the dense [out, in] float32 matrix code * scale from the stored tensors."""
    raw = codes.view(torch.uint8).numpy()
    v = e4m3_decode(raw)
    mg.check(not np.isnan(v).any(), "a NaN code")
    mg.check(np.array_equal(v, codes.float().numpy()), "E4M3 decode != torch's float8_e4m3fn -> float32")
    sf = s.float().numpy()
    if scales == "block":
        n, k = v.shape
        sf = np.repeat(np.repeat(sf, FP8_BLOCK, 0), FP8_BLOCK, 1)[:n, :k]
    return np.ascontiguousarray((v * sf.reshape(sf.shape if scales != "tensor" else ())).astype(np.float32))


def input_amax(model_dir, prompts):
    """max |x| of each projection's input over the prompts (teacher-forced through the greedy golden
    length would need the goldens first; the prompts alone are what a calibration pass sees), run by HF
    on the dense model: {projection base name: float}."""
    model = mg.load_f32(model_dir)
    amax, hooks = {}, []
    for name, mod in model.named_modules():
        if name.endswith(PROJ):
            def hook(m, args, name=name):
                amax[name] = max(amax.get(name, 0.0), float(args[0].abs().max()))
            hooks.append(mod.register_forward_pre_hook(hook))
    with torch.no_grad():
        for p in prompts:
            model(torch.tensor([p]))
    for h in hooks:
        h.remove()
    return amax


def fp8_quant_config(producer, scales, acts):
    if producer == "fp8":  # AutoFP8's (activation_scheme, ignored_layers); DeepSeek-V3's block one
        if scales == "block":
            return {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                    "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
        return {"activation_scheme": acts, "ignored_layers": ["lm_head"], "quant_method": "fp8"}
    # llm-compressor's FP8_DYNAMIC (channel weights, dynamic per-token inputs) and FP8 (tensor weights, static
    # tensor inputs) schemes as QuantizationConfig.model_dump writes them
    block = scales == "block"  # FP8_BLOCK: weights per 128 x 128 block, inputs dynamic per group of 128
    weights = {"actorder": None, "block_structure": [FP8_BLOCK, FP8_BLOCK] if block else None, "dynamic": False,
               "group_size": None, "num_bits": 8, "observer": "minmax", "observer_kwargs": {}, "strategy": scales,
               "symmetric": True, "type": "float"}
    inputs = {"actorder": None, "block_structure": None, "dynamic": acts == "dynamic",
              "group_size": FP8_BLOCK if block else None, "num_bits": 8,
              "observer": None if acts == "dynamic" else "minmax", "observer_kwargs": {},
              "strategy": "group" if block else "token" if acts == "dynamic" else "tensor", "symmetric": True,
              "type": "float"}
    return {"config_groups": {"group_0": {"format": "float-quantized", "input_activations": inputs,
                                          "output_activations": None, "targets": ["Linear"], "weights": weights}},
            "format": "float-quantized", "global_compression_ratio": None, "ignore": ["lm_head"],
            "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed",
            "sparsity_config": {}, "transform_config": {}, "version": "0.12.2"}


def make_fp8_one(name, producer, scales, acts, sdt, prompts, base="tiny-mistral"):
    src = os.path.join(REPO, "tests/data", base)
    d = os.path.join(REPO, "tests/data", name)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    amax = input_amax(src, prompts or mg.ID_PROMPTS) if acts == "static" else {}
    dense, out = {}, {}
    for k, v in mg.state_tensors(src).items():
        base = k[:-len(".weight")]
        if not base.endswith(PROJ):
            out[k] = v  # embedding, norms, LM head: bf16 as they are
            dense[k] = v.float()
            continue
        codes, s = fp8_quantize(v.float().numpy(), scales, sdt)
        scalar = producer == "fp8" and scales == "tensor" and ".layers.0." in k  # AutoFP8's 0-dim scalars
        out[k] = codes
        inv = scales == "block" and producer == "fp8"  # DeepSeek's name; compressed-tensors keeps weight_scale
        out[base + (".weight_scale_inv" if inv else ".weight_scale")] = s.reshape(()) if scalar else s
        if acts == "static":
            x = torch.tensor([amax[base] / FP8_MAX], dtype=torch.float32).to(sdt)
            mg.check(float(x) > 0, "%s: input scale 0" % base)
            out[base + ".input_scale"] = x.reshape(()) if scalar else x
        dense[k] = torch.from_numpy(fp8_dequant(codes, s, scales))
    mg.fresh_dir(d)
    safetensors.torch.save_file(out, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    os.chmod(os.path.join(d, "model.safetensors"), 0o644)
    shutil.copy(os.path.join(src, "generation_config.json"), d)
    qcfg = dict(cfg, quantization_config=fp8_quant_config(producer, scales, acts))
    mg.write_json(os.path.join(d, "config.json"), qcfg)
    size = os.path.getsize(os.path.join(d, "model.safetensors"))
    if prompts is None:  # refused by kiln: no golden
        print("%s: %d tensors, %s %s scales, %d bytes (no golden)" % (name, len(out), producer, scales, size))
        return
    with tempfile.TemporaryDirectory() as tmp:  # the dense float32 checkpoint HF runs
        shutil.copy(os.path.join(src, "generation_config.json"), tmp)
        mg.write_json(os.path.join(tmp, "config.json"), cfg)
        safetensors.torch.save_file({k: v.contiguous() for k, v in dense.items()},
                                    os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        gpath = os.path.join(REPO, "tests/golden", name, "golden.json")
        # the given prompts, or (a model whose greedy paths come too close to a tie) other pairs of ID_PROMPTS
        for ps in (prompts, [mg.ID_PROMPTS[0], mg.ID_PROMPTS[2]], mg.ID_PROMPTS[:2]):
            mg.make_id_golden(name, tmp, ps, synthetic=False)
            with open(gpath) as f:
                gj = json.load(f)
            if all(c["min_margin"] >= MIN_MARGIN for c in gj["cases"]):
                break
    for i, c in enumerate(gj["cases"]):
        mg.check(c["min_margin"] >= MIN_MARGIN, "%s case %d: greedy margin %g" % (name, i, c["min_margin"]))
    gj["model"] = "tests/data/" + name
    gj["quantization"] = {"checkpoint": qcfg["quantization_config"],
                          "reference": "tests/golden/make_quant_ckpt_goldens.py fp8_dequant (numpy: each E4M3 "
                                       "code decoded from its bits, times its scale, float32; activations "
                                       "unquantized as in kiln)"}
    mg.write_json(gpath, gj)
    print("%s: %d tensors, %s %s scales (%s), %s inputs, %d bytes" % (name, len(out), producer, scales,
                                                                       str(sdt).replace("torch.", ""), acts, size))


def main():
    torch.set_num_threads(1)
    names = set(sys.argv[1:])
    unknown = names - {c[0] for c in CHECKPOINTS} - {c[0] for c in FP8_CHECKPOINTS}
    mg.check(not unknown, "unknown checkpoints: %s" % ", ".join(sorted(unknown)))
    for c in CHECKPOINTS:
        if not names or c[0] in names:
            make_one(*c)
    for c in FP8_CHECKPOINTS:
        if not names or c[0] in names:
            make_fp8_one(*c)


if __name__ == "__main__":
    main()
