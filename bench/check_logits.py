#!/usr/bin/env python3
"""kiln's logits against HuggingFace's, on the same random prompts.

Issue 4's bound: at each prompt length, kiln's logits (bf16 on the GPU) may be
at most 1.25x as far from an fp32 HuggingFace reference as HuggingFace's own
bf16 run of the same checkpoint on the same ids:

    err(a) = ||a - ref||_2 / ||ref||_2          over the logit vector(s)
    ratio  = err(kiln) / err(hf bf16)           pass: ratio <= 1.25

Stages (bench/gpu_correct_run.sh runs them in this order):

  ids      random prompt ids from a fixed seed, in [3, vocab) (no 0..2
           specials), raw little-endian int32.
  hf       MistralForCausalLM (or any causal LM) from the checkpoint, eager
           attention (the sliding window is applied through the mask),
           float32 with TF32 off, then bfloat16 (the checkpoint loaded again
           in bf16, the fp32 model freed first). For each length L one forward
           over ids[0 .. L+decode) keeps the logits of the last decode+1
           positions: positions L-1 .. L+decode-1, written as
           hf_<dtype>_L<L>.f32 ([decode+1, vocab] f32; bf16 logits upcast).
  compare  reads kiln_L<L>.f32 (bench/gpu_logits.c logits mode: row 0 from
           the last prefill step, rows 1.. from one-token decode steps) and
           the two HF files; prints one JSON line per length:
             {length, err_kiln_vs_fp32, err_hfbf16_vs_fp32, ratio, pass,
              then the same split into prefill (row 0) and decode (rows 1..)}
           `pass` is the issue's bound on all rows together; pass_prefill and
           pass_decode apply it to each part.

Run `python3 bench/check_logits.py STAGE -h` for each stage's options.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

BOUND = 1.25


def rel_err(a, ref):
    return float(np.linalg.norm((a - ref).ravel()) / np.linalg.norm(ref.ravel()))


def sig(x, digits=4):
    """x rounded to `digits` significant digits, for the JSON lines."""
    return float(f"{x:.{digits}g}")


def cmd_ids(a):
    rng = np.random.default_rng(a.seed)
    ids = rng.integers(3, a.vocab, size=a.n, dtype=np.int64).astype("<i4")
    ids.tofile(a.out)
    print(json.dumps({"ids": a.out, "n": a.n, "vocab": a.vocab, "seed": a.seed, "first": ids[:8].tolist()}),
          flush=True)
    return 0


def load_model(path, dtype, device):
    import torch
    from transformers import AutoModelForCausalLM
    # device_map loads straight onto the GPU (it needs accelerate, which the
    # GPU host has); on the CPU no map is needed
    kw = {"device_map": device} if device != "cpu" else {}
    m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager", **kw)
    m.eval()
    return m


def cmd_hf(a):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    ids = np.fromfile(a.ids, dtype="<i4").astype(np.int64)
    lengths = [int(x) for x in a.lengths.split(",")]
    need = max(lengths) + a.decode
    if need > len(ids):
        sys.exit(f"{a.ids}: {len(ids)} ids; length {max(lengths)} with {a.decode} decode steps needs {need}")
    os.makedirs(a.out, exist_ok=True)
    device = a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    for name in a.dtypes.split(","):
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
        t0 = time.time()
        model = load_model(a.model, dtype, device)
        t_load = time.time() - t0
        for L in lengths:
            t1 = time.time()
            x = torch.tensor(ids[: L + a.decode], device=device)[None]
            with torch.inference_mode():
                out = model(input_ids=x, use_cache=False, logits_to_keep=a.decode + 1)
            lg = out.logits[0].float().cpu().numpy()
            assert lg.shape[0] == a.decode + 1, lg.shape
            lg.astype("<f4").tofile(os.path.join(a.out, f"hf_{name}_L{L}.f32"))
            del out, x
            print(json.dumps({"hf": name, "length": L, "rows": int(lg.shape[0]), "vocab": int(lg.shape[1]),
                              "finite": bool(np.isfinite(lg).all()), "load_s": round(t_load, 2),
                              "forward_s": round(time.time() - t1, 3),
                              "max_mem_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2)
                              if device.startswith("cuda") else 0}), flush=True)
        del model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    return 0


def cmd_compare(a):
    lengths = [int(x) for x in a.lengths.split(",")]
    ok = True
    for L in lengths:
        f = {k: os.path.join(a.dir, f"{k}_L{L}.f32") for k in ("kiln", "hf_fp32", "hf_bf16")}
        missing = [p for p in f.values() if not os.path.exists(p)]
        if missing:
            print(json.dumps({"length": L, "error": "missing " + ", ".join(missing), "pass": False}), flush=True)
            ok = False
            continue
        v = {k: np.fromfile(p, dtype="<f4").astype(np.float64) for k, p in f.items()}
        n = {k: x.size for k, x in v.items()}
        if len(set(n.values())) != 1 or n["kiln"] % a.vocab:
            print(json.dumps({"length": L, "error": f"sizes differ: {n} (vocab {a.vocab})", "pass": False}),
                  flush=True)
            ok = False
            continue
        v = {k: x.reshape(-1, a.vocab) for k, x in v.items()}
        ref = v["hf_fp32"]
        r = {"length": L, "rows": int(ref.shape[0])}
        for part, sl in (("", slice(None)), ("_prefill", slice(0, 1)), ("_decode", slice(1, None))):
            if ref[sl].size == 0:
                continue
            ek, eb = rel_err(v["kiln"][sl], ref[sl]), rel_err(v["hf_bf16"][sl], ref[sl])
            ratio = ek / eb if eb > 0 else float("inf")
            r.update({f"err_kiln_vs_fp32{part}": sig(ek), f"err_hfbf16_vs_fp32{part}": sig(eb),
                      f"ratio{part}": sig(ratio), f"pass{part}": bool(ratio <= BOUND)})
        # does kiln pick the same top token as the reference?
        r["argmax_agree_kiln"] = int((v["kiln"].argmax(1) == ref.argmax(1)).sum())
        r["argmax_agree_hfbf16"] = int((v["hf_bf16"].argmax(1) == ref.argmax(1)).sum())
        r["ref_norm_row0"] = round(float(np.linalg.norm(ref[0])), 3)
        r["finite"] = bool(all(np.isfinite(x).all() for x in v.values()))
        r["pass"] = r["pass"] and r["finite"]
        ok &= r["pass"]
        print(json.dumps(r), flush=True)
    print(json.dumps({"summary": "logits", "lengths": lengths, "bound": BOUND, "all_pass": ok}), flush=True)
    return 0 if ok else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="stage", required=True)
    p = sub.add_parser("ids", help="random prompt ids")
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int, required=True, help="how many ids (the longest length + decode)")
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--seed", type=int, default=4)
    p.set_defaults(fn=cmd_ids)
    p = sub.add_parser("hf", help="HuggingFace logits in fp32 and bf16")
    p.add_argument("--model", required=True, help="HF checkpoint directory")
    p.add_argument("--ids", required=True)
    p.add_argument("--lengths", required=True, help="comma-separated prompt lengths")
    p.add_argument("--decode", type=int, default=4)
    p.add_argument("--out", required=True, help="directory for hf_<dtype>_L<L>.f32")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--device", default="auto")
    p.set_defaults(fn=cmd_hf)
    p = sub.add_parser("compare", help="kiln vs HF bf16, both against HF fp32")
    p.add_argument("--dir", required=True, help="directory with kiln_L<L>.f32 and hf_<dtype>_L<L>.f32")
    p.add_argument("--lengths", required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.set_defaults(fn=cmd_compare)
    a = ap.parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
