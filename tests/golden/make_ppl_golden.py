#!/usr/bin/env python3
"""Make the golden for `kiln perplexity`: HuggingFace's perplexity of models/kjv-tiny on
tests/data/ppl/genesis-1.txt (KJV, public domain), for the window settings tests/cli_perplexity.sh
checks.

Reference: transformers on the CPU in float32, eager attention. The text is tokenized with the
model's tokenizer.json (tokenizers library, no special tokens). For window N, stride S and bos:
window w covers text tokens [w*S, min(w*S + N, n)), read after BOS when bos; a text token is scored
in the first window that holds it at a position other than the window's first (with bos, at any
position), given what precedes it in that window; windows stop at the one that reaches the end.
Each window is one HF forward; the log-softmax is taken in float64 over its float32 logits.

Writes tests/golden/ppl/kjv-tiny.json: per setting the token count, windows, scored tokens, the
mean negative log-likelihood and the perplexity, plus the versions used.

Usage (from anywhere): python3 tests/golden/make_ppl_golden.py
"""

import json
import math
import os
import sys

import tokenizers
import torch
import transformers
from transformers import AutoModelForCausalLM

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(REPO, "models/kjv-tiny")
TEXT = os.path.join(REPO, "tests/data/ppl/genesis-1.txt")
OUT = os.path.join(REPO, "tests/golden/ppl/kjv-tiny.json")
SETTINGS = [  # window, stride, bos
    (64, 64, False),
    (64, 24, False),
    (63, 63, True),
    (512, 512, False),
]


def windows(n, N, S, bos):
    """[(start, end, first)]: window text range and the first text position it scores."""
    out, scored_to, start = [], 0, 0
    while start < n:
        end = min(start + N, n)
        first = max(start + (0 if bos else 1), scored_to)
        if first < end:
            out.append((start, end, first))
        scored_to = max(scored_to, end)
        if end == n:
            break
        start += S
    return out


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    tok = tokenizers.Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))
    with open(TEXT, encoding="utf-8") as f:
        text = f.read()
    ids = tok.encode(text, add_special_tokens=False).ids
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32, attn_implementation="eager").eval()
    bos_id = model.config.bos_token_id
    cases = []
    for N, S, bos in SETTINGS:
        ws = windows(len(ids), N, S, bos)
        nll, scored = 0.0, 0
        for start, end, first in ws:
            seq = ([bos_id] if bos else []) + ids[start:end]
            with torch.no_grad():
                logits = model(torch.tensor([seq])).logits[0].double()
            lp = torch.log_softmax(logits, dim=-1)
            off = 1 if bos else 0
            for p in range(first, end):
                j = p - start + off  # the token's position in seq, predicted after position j - 1
                nll -= lp[j - 1, seq[j]].item()
                scored += 1
        mean = nll / scored
        if not math.isfinite(mean):
            sys.exit("make_ppl_golden: non-finite NLL")
        cases.append({"window": N, "stride": S, "bos": bos, "tokens": len(ids), "windows": len(ws),
                      "scored": scored, "nll_mean": round(mean, 10), "perplexity": round(math.exp(mean), 8)})
        print("window %d stride %d bos %s: %d tokens, %d windows, %d scored, ppl %.6f"
              % (N, S, bos, len(ids), len(ws), scored, math.exp(mean)))
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"model": "models/kjv-tiny", "text": "tests/data/ppl/genesis-1.txt",
                   "script": "tests/golden/make_ppl_golden.py", "reference": "transformers float32, eager; "
                   "log-softmax in float64", "generator": {"torch": torch.__version__,
                   "transformers": transformers.__version__, "tokenizers": tokenizers.__version__},
                   "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
