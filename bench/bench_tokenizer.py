#!/usr/bin/env python3
"""HF `tokenizers` side of the tokenizer benchmark (bench/bench_tokenizer.sh).

  bench_tokenizer.py text OUT_FILE [MB]   write the mixed benchmark text
  bench_tokenizer.py hf TOKENIZER_DIR FILE
                                          encode FILE line by line (each line
                                          with its newline), single thread, and
                                          print one JSON line

The text (deterministic, ~MB megabytes, default 10): about 40% Python source
(the standard library of the running Python), 30% English prose (vim's
documentation when installed, else more Python), 30% multilingual and
adversarial lines (the tokenizer golden corpus: CJK, Korean, Arabic, Hebrew,
Cyrillic, emoji, decomposed forms, whitespace runs...), shuffled with a fixed
seed.
"""
import glob
import json
import os
import random
import sys
import sysconfig
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("RAYON_NUM_THREADS", "1")
HERE = os.path.dirname(os.path.abspath(__file__))


def read_until(files, limit):
    out, n = [], 0
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                t = fh.read()
        except (UnicodeDecodeError, OSError):
            continue
        out.append(t)
        n += len(t.encode("utf-8"))
        if n >= limit:
            break
    return "".join(out)


def make_text(path, mb):
    total = int(mb * 1e6)
    stdlib = sysconfig.get_paths()["stdlib"]
    code = read_until(sorted(glob.glob(os.path.join(stdlib, "*.py"))) +
                      sorted(glob.glob(os.path.join(stdlib, "*", "*.py"))), int(total * 0.4))
    prose_files = sorted(glob.glob("/usr/share/vim/vim*/doc/*.txt"))
    prose = read_until(prose_files, int(total * 0.3)) if prose_files else ""
    if not prose:
        prose = read_until(sorted(glob.glob(os.path.join(stdlib, "*", "*", "*.py"))), int(total * 0.3))
    corpus_path = os.path.join(HERE, "..", "tests", "golden", "tokenizer", "corpus.jsonl")
    with open(corpus_path, encoding="utf-8") as fh:
        corpus = [json.loads(l) for l in fh]
    rng = random.Random(1234)
    multi, n = [], 0
    while n < total * 0.3:
        s = rng.choice(corpus)
        multi.append(s + "\n")
        n += len(s.encode("utf-8")) + 1
    # shuffle at line granularity across the three parts, with the fixed seed
    def split(t):
        parts = [l + "\n" for l in t.split("\n")]
        parts[-1] = parts[-1][:-1]
        return [l for l in parts if l]
    lines = split(code) + split(prose) + split("".join(multi))
    rng.shuffle(lines)
    text = "".join(lines)
    with open(path, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)
    print(json.dumps({"text": path, "bytes": len(text.encode("utf-8")), "code": len(code), "prose": len(prose),
                      "prose_source": "vim docs" if prose_files else "python"}))


def hf(tok_dir, path):
    from tokenizers import Tokenizer
    import tokenizers
    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    with open(path, encoding="utf-8", newline="") as fh:
        text = fh.read()
    # split on "\n" only (str.splitlines also splits on \r, \x0b, \u2028...): the C side does the same
    lines = [l + "\n" for l in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    if not lines[-1]:
        lines.pop()
    t0 = time.perf_counter()
    encs = [tok.encode(line, add_special_tokens=False).ids for line in lines]
    dt = time.perf_counter() - t0
    n, h = 0, 0
    for ids in encs:  # the same order hash the C side prints, to check the ids match
        n += len(ids)
        for i in ids:
            h = (h * 1000003 + i) & 0xFFFFFFFFFFFFFFFF
    t0 = time.perf_counter()
    Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    load = time.perf_counter() - t0
    print(json.dumps({"impl": "hf", "version": tokenizers.__version__, "bytes": len(text.encode("utf-8")),
                      "seconds": round(dt, 4), "ids": n, "ids_hash": "%016x" % h, "load_ms": round(load * 1e3, 1)}))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "text":
        make_text(sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 10.0)
    elif len(sys.argv) == 4 and sys.argv[1] == "hf":
        hf(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
