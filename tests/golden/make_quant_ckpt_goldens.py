#!/usr/bin/env python3
"""Tiny published-style quantized checkpoints (AWQ, GPTQ, compressed-tensors) and their goldens.

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
  tests/data/tiny-mistral-ct         compressed-tensors "pack-quantized" (llm-compressor's W4A16),
                                     symmetric: weight_packed [out, in/8], nibble i of word [r, j] =
                                     signed code of column 8j + i, plus 8 (pack_to_int32); weight_scale
                                     [out, in/32] bf16; weight_shape int64 [2]; no zero points
  tests/data/tiny-mistral-ct-asym    the same, asymmetric: weight_zero_point [out/8, in/32] packed
                                     along out (pack_to_int32 packed_dim 0), signed zero plus 8;
                                     weight_scale fp16; weight_shape int32 (older releases' dtype)

The embedding, norms and LM head stay bf16 as in tiny-mistral. Each
config.json carries the quantization_config transformers / AutoAWQ /
AutoGPTQ write.

The goldens (tests/golden/<same name>/) come from HuggingFace transformers,
float32, eager, run on a dense checkpoint made by an independent numpy
dequantization of the packed tensors: unpack the nibbles (AWQ's reverse
order [0, 4, 1, 5, 2, 6, 3, 7], as its readers do; compressed-tensors'
nibble - 8 as unpack_from_int32 does), then (q - z) * s. So the
C test (test_golden) checks kiln's reading and repacking of the packed bytes,
not only its arithmetic. The script also checks that unpacking gives back the
codes and zeros it packed.

Run from the repository root: python3 tests/golden/make_quant_ckpt_goldens.py [NAME...]
(no names: all of them)
Versions: as make_goldens.py (each golden.json records them under generator).
"""
import json
import os
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
]


def quantize(w, sym, sdt="f16", zero_in_range=False):
    """RTN 4-bit of w [out, in] in groups of GROUP input columns, as AutoAWQ (asymmetric:
    scale = (max - min) / 15, zero = clamp(-round(min / scale), 0, 15)) and GPTQ (sym: scale =
    2 max|w| / 15, zero 8) compute it; scales rounded to fp16 (sdt "bf16": bfloat16) first, so the
    codes are for the stored scale. compressed-tensors computes the same in signed terms (sym:
    scale = max|w| / 7.5, code in -8..7; asym: zero = round(-8 - min / scale)), i.e. these codes and
    zeros minus 8, with its range widened to hold 0 (zero_in_range). Returns codes q [out, in],
    zeros z [out, in/G] (ints 0..15), scales s [out, in/G] float32 holding the rounded values."""
    n, k = w.shape
    x = w.astype(np.float32).reshape(n, k // GROUP, GROUP)
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


def pack(fmt, ckfmt, q, z, s, sym=False):
    """The checkpoint tensors of one projection (suffix -> numpy array or torch tensor)."""
    n, k = q.shape
    if fmt == "ct":  # compressed-tensors pack_to_int32: stored = signed + 8 = these unsigned nibbles
        t = {"weight_packed": pack_rows(q),  # [out, in/8] along in
             "weight_scale": torch.from_numpy(s).to(torch.bfloat16 if ckfmt == "bf16" else torch.float16),
             "weight_shape": np.array([n, k], dtype=np.int64 if ckfmt == "bf16" else np.int32)}
        if not sym:
            t["weight_zero_point"] = pack_cols(z)  # [out/8, in/G] along out (packed_dim 0)
        return t
    s = s.astype(np.float16)
    if fmt == "awq":  # transposed: [in, out], packed along out in AWQ's order
        return {"qweight": pack_rows(q.T, AWQ_ORDER), "qzeros": pack_rows(z.T, AWQ_ORDER),
                "scales": np.ascontiguousarray(s.T)}
    stored = z.T - (1 if ckfmt == "gptq" else 0)  # v1 stores zero - 1
    mg.check(stored.min() >= 0, "GPTQ v1 with a zero of 0 (stored as -1) is not a case this writes")
    return {"qweight": pack_cols(np.ascontiguousarray(q.T)), "qzeros": pack_rows(stored),
            "scales": np.ascontiguousarray(s.T), "g_idx": (np.arange(k) // GROUP).astype(np.int32)}


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
        g = np.arange(k) // (k // s.shape[1])
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


def quant_config(fmt, sym, ckfmt, desc_act):
    if fmt == "ct":  # as llm-compressor saves a W4A16 group-32 scheme (QuantizationConfig.model_dump)
        weights = {"actorder": None, "block_structure": None, "dynamic": False, "group_size": GROUP, "num_bits": 4,
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
    return {"bits": 4, "checkpoint_format": ckfmt, "damp_percent": 0.01, "desc_act": desc_act,
            "group_size": GROUP, "model_file_base_name": None, "model_name_or_path": None,
            "quant_method": "gptq", "static_groups": False, "sym": sym, "true_sequential": True}


def make_one(name, fmt, sym, ckfmt, desc_act, prompts):
    src = os.path.join(REPO, "tests/data/tiny-mistral")
    d = os.path.join(REPO, "tests/data", name)
    dense = {}
    out = {}
    for k, v in mg.state_tensors(src).items():
        base = k[:-len(".weight")]
        if not base.endswith(PROJ):
            out[k] = v  # embedding, norms, LM head: bf16 as they are
            dense[k] = v.float()
            continue
        ct = fmt == "ct"
        q, z, s = quantize(v.float().numpy(), sym, ckfmt if ct else "f16", zero_in_range=ct)
        t = pack(fmt, ckfmt, q, z, s, sym)
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
    qcfg = dict(cfg, quantization_config=quant_config(fmt, sym, ckfmt, desc_act))
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


def main():
    torch.set_num_threads(1)
    names = set(sys.argv[1:])
    unknown = names - {c[0] for c in CHECKPOINTS}
    mg.check(not unknown, "unknown checkpoints: %s" % ", ".join(sorted(unknown)))
    for c in CHECKPOINTS:
        if not names or c[0] in names:
            make_one(*c)


if __name__ == "__main__":
    main()
