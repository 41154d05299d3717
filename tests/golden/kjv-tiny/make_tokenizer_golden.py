#!/usr/bin/env python3
"""make_tokenizer_golden.py — HF `tokenizers` encodings of held-out text for models/kjv-tiny.

Writes tests/golden/kjv-tiny/tokenizer_golden.json: for every verse of the
held-out chapters of scripts/train_quickstart.py's fixed split (text the
tokenizer was not trained on), plus a few non-KJV strings (digits, other
scripts, emoji, whitespace runs, literal special tokens), the ids with
add_special_tokens False (and, but for single verses, True, and the decode of
the plain ids); and one case holding all those verses joined by newlines.
tests/cli_quickstart.sh requires `kiln tokenize` to give exactly these.

usage (from the repository root; deterministic):
  python3 tests/golden/kjv-tiny/make_tokenizer_golden.py [.carry/quickstart/kjv.txt]
"""
import json
import os
import sys

from tokenizers import Tokenizer, __version__ as tok_version

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from train_quickstart import load_chapters, split  # noqa: E402

EXTRA = [
    "", " ", "In the beginning", " In the beginning", "in the beginning God created",
    "The LORD is my shepherd; I shall not want.",
    "Hello, world! 12345 3.14159 1,000,000", "it's they're we'll I'm you've he'd",
    "tabs\tand\t\tspaces    and\n\nnewlines\r\n", "   leading and trailing   ",
    "caf\u00e9 na\u00efve \u00fcber \u4e2d\u6587 \u0440\u0443\u0441\u0441\u043a\u0438\u0439 \u0627\u0644\u0639\u0631\u0628\u064a\u0629",
    "emoji \U0001f600\U0001f469\u200d\U0001f4bb flags \U0001f1ec\U0001f1e7",
    "<s>In the beginning</s>", "a<s>b </s> c", "x" * 300, "Selah. " * 20,
    "def f(x):\n    return x * 2  # code\n",
]


def main():
    data = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, ".carry/quickstart/kjv.txt")
    tok = Tokenizer.from_file(os.path.join(ROOT, "models/kjv-tiny/tokenizer.json"))
    _, held = split(load_chapters(data))
    lines = [v for c in held for v in c.split("\n")]
    cases = []
    for kind, texts in (("heldout", lines), ("extra", EXTRA), ("heldout_all", ["\n".join(lines)])):
        for t in texts:
            plain = tok.encode(t, add_special_tokens=False).ids
            c = {"kind": kind, "text": t, "ids": plain}
            if kind != "heldout":  # single verses: plain ids only (tests/cli_quickstart.sh)
                c["ids_special"] = tok.encode(t, add_special_tokens=True).ids
                c["decode"] = tok.decode(plain, skip_special_tokens=False)
            cases.append(c)
    out = {"tokenizer": "models/kjv-tiny/tokenizer.json", "tokenizers": tok_version,
           "note": "ids: add_special_tokens=False; ids_special: True (adds <s>); decode: of ids",
           "cases": cases}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer_golden.json")
    with open(path, "w", encoding="utf-8") as f:  # one case a line
        head = json.dumps({k: v for k, v in out.items() if k != "cases"}, ensure_ascii=False)[:-1]
        f.write(head + ', "cases": [\n')
        f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n]}\n")
    print(f"{path}: {len(cases)} cases ({len(lines)} held-out verses)")


if __name__ == "__main__":
    main()
