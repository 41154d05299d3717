#!/usr/bin/env python3
"""Perplexity of a checkpoint with HuggingFace, on exactly the positions
bench/gpu_logits.c (ppl mode) scores, and the comparison with kiln's.

Definition (../shared/eval/README.md: tokenize with the model's tokenizer,
prepend BOS, score next-token log-likelihood over windows of the model's
context):
  - the text is tokenized with the model's tokenizer.json (tokenizers
    library, no special tokens added): x_1 .. x_N;
  - it is cut into consecutive pieces of W-1 tokens (W = the window, by
    default the model's context; the last piece may be shorter);
  - each piece is read as its own sequence [BOS, x_1 .. x_n] of at most W
    tokens, and every one of its tokens is scored given what precedes it in
    the sequence: nll(x_i) = -log softmax(logits after [BOS .. x_{i-1}])[x_i];
  - every text token is scored exactly once; ppl = exp(mean nll over the N).
HF reads each sequence in one forward (eager attention, so the sliding window
applies through the mask), log-softmax in float64 over its logits (bf16
logits upcast, as HF's own loss does); kiln reads it one token per step.

Stages:
  ids    tokenize the text, write the ids (no BOS) as raw int32.
  score  HF per-token NLL in each dtype (fp32 with TF32 off, bf16), each
         written as hf_<dtype>_nll.f32; with --kiln-nll, compare kiln's
         per-token NLL file(s) and print one JSON line per reference and file:
           {ref, kiln, tokens, ppl_kiln, ppl_hf, rel_diff, pass (|rel_diff| <= 0.5%),
            nll_mean_abs_diff, nll_max_abs_diff, ...}
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np

BOUND = 0.005  # issue 4: kiln's perplexity within 0.5% of HF's


def cmd_ids(a):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(a.tokenizer)
    with open(a.text, encoding="utf-8") as f:
        text = f.read()
    ids = np.array(tok.encode(text, add_special_tokens=False).ids, dtype="<i4")
    ids.tofile(a.out)
    print(json.dumps({"ids": a.out, "tokens": int(ids.size), "text_bytes": len(text.encode()),
                      "first": ids[:8].tolist()}), flush=True)
    return 0


def pieces(n, window):
    """(start, length) of each piece of window-1 text tokens."""
    step = window - 1
    return [(s, min(step, n - s)) for s in range(0, n, step)]


def hf_nll(model, ids, window, bos, device):
    import torch
    nll = np.empty(ids.size, dtype=np.float64)
    for s, n in pieces(ids.size, window):
        seq = np.concatenate([[bos], ids[s: s + n - 1]]).astype(np.int64)  # [BOS, x_1 .. x_{n-1}]
        x = torch.tensor(seq, device=device)[None]
        with torch.inference_mode():
            logits = model(input_ids=x, use_cache=False).logits[0]
            lp = torch.log_softmax(logits.double(), dim=-1)
            tgt = torch.tensor(ids[s: s + n].astype(np.int64), device=device)  # x_1 .. x_n
            nll[s: s + n] = (-lp.gather(1, tgt[:, None])[:, 0]).cpu().numpy()
    return nll


def cmd_score(a):
    import torch
    from transformers import AutoModelForCausalLM
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    device = a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    ids = np.fromfile(a.ids, dtype="<i4").astype(np.int64)
    with open(os.path.join(a.model, "config.json")) as f:
        cfg = json.load(f)
    window = a.window or cfg["max_position_embeddings"]
    bos = a.bos if a.bos is not None else cfg["bos_token_id"]
    kilns = {}
    for path in (a.kiln_nll.split(",") if a.kiln_nll else []):
        k = np.fromfile(path, dtype="<f4").astype(np.float64)
        if k.size != ids.size:
            sys.exit(f"{path}: {k.size} values for {ids.size} tokens")
        kilns[os.path.basename(path)] = k
    os.makedirs(a.out, exist_ok=True)
    ok = True
    for name in a.dtypes.split(","):
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
        t0 = time.time()
        kw = {"device_map": device} if device != "cpu" else {}
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype, attn_implementation="eager", **kw).eval()
        nll = hf_nll(model, ids, window, bos, device)
        del model
        nll.astype("<f4").tofile(os.path.join(a.out, f"hf_{name}_nll.f32"))
        base = {"ref": f"hf_{name}", "tokens": int(ids.size), "windows": len(pieces(ids.size, window)),
                "window": window, "bos": bos, "nll_mean_hf": round(float(nll.mean()), 6),
                "ppl_hf": round(math.exp(nll.mean()), 5), "seconds": round(time.time() - t0, 2)}
        if not kilns:
            print(json.dumps(base), flush=True)
        for kname, kiln in kilns.items():
            d = kiln - nll
            rel = math.exp(kiln.mean()) / math.exp(nll.mean()) - 1.0
            r = dict(base, kiln=kname)
            r.update({"nll_mean_kiln": round(float(kiln.mean()), 6), "ppl_kiln": round(math.exp(kiln.mean()), 5),
                      "rel_diff": float(f"{rel:.4g}"), "pass": bool(abs(rel) <= BOUND),
                      "nll_mean_abs_diff": float(f"{np.abs(d).mean():.4g}"),
                      "nll_max_abs_diff": float(f"{np.abs(d).max():.4g}"),
                      "nll_max_abs_diff_at": int(np.abs(d).argmax())})
            ok &= r["pass"]
            print(json.dumps(r), flush=True)
    if kilns:
        print(json.dumps({"summary": "perplexity", "bound": BOUND, "all_pass": ok}), flush=True)
    return 0 if ok else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="stage", required=True)
    p = sub.add_parser("ids", help="tokenize the text")
    p.add_argument("--tokenizer", required=True, help="the model's tokenizer.json")
    p.add_argument("--text", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_ids)
    p = sub.add_parser("score", help="HF per-token NLL; compare kiln's")
    p.add_argument("--model", required=True, help="HF checkpoint directory")
    p.add_argument("--ids", required=True, help="text ids from the ids stage")
    p.add_argument("--window", type=int, default=0, help="tokens per sequence incl. BOS (0 = the model's context)")
    p.add_argument("--bos", type=int, default=None, help="BOS id (default: config.json's bos_token_id)")
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--kiln-nll", help="kiln's per-token NLL file(s), comma-separated (kiln_gpu_logits ppl)")
    p.add_argument("--out", required=True, help="directory for hf_<dtype>_nll.f32")
    p.add_argument("--device", default="auto")
    p.set_defaults(fn=cmd_score)
    a = ap.parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
