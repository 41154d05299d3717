#!/usr/bin/env python3
"""Turn the JSON lines of bench/run_peers.py into the markdown of docs/benchmarks.md.

  python3 bench/compare.py OUT/results.jsonl                 # markdown on stdout
  python3 bench/compare.py OUT/results.jsonl --append-to docs/benchmarks.md

Input: the {"meta": ...} line and the measurement lines run_peers.py prints
(other lines, non-JSON or dry-run, are ignored; several files may be given,
the first meta wins). Output: one block per run:

  ### <model>, <dtype>, <GPU> — <date>, commit <commit>
  a line with the weights, parameters and floors, then a table:
  | measurement | floor | kiln | HF transformers eager | gpt-fast style compiled | kiln vs HF | kiln vs gpt-fast | target |

Each number is followed by its fraction of the floor (run_peers.py's
"frac_of_floor": floor / time, or rate / floor-rate; 100% is the floor).
"kiln vs X" is a speedup: X's time / kiln's time, or kiln's rate / X's rate,
so > 1 means kiln is faster. Measurements outside the main rows go in a
second table; errors and skipped steps are listed after it.

--append-to FILE puts the block at the end of FILE's "## GPU benchmarks"
section (the section is created at the end of FILE when absent; nothing
outside it is changed).
"""

import argparse
import json
import math
import os
import re
import sys

SECTION = "## GPU benchmarks"
PLACEHOLDER = "No run has been recorded yet."  # dropped from the section by the first --append-to

IMPLS = [("kiln", "kiln"), ("hf", "HF transformers eager (SDPA)"), ("gptfast", "gpt-fast style, compiled")]
PEERS = [i for i in IMPLS if i[0] != "kiln"]

RATE_METRICS = {"decode_tok_per_s", "e2e_tok_per_s", "prefill_tok_per_s"}
# Metrics compared whatever the output length (a prefill / first token does
# not depend on how many tokens follow).
NO_OUTPUT_KEY = {"prefill_ms", "ttft_ms", "prefill_tok_per_s"}
# Metrics compared whatever the shape (one number per run).
NO_SHAPE_KEY = {"load_s", "compile_s", "compile_warm_s", "peak_gpu_mem_bytes", "peak_host_mem_bytes"}
MEM_METRICS = {"peak_gpu_mem_bytes", "peak_host_mem_bytes"}

# The main rows: (label, metric, batch, input_len, output_len, target) where
# target is (op, value) and applies to the full Mistral-7B only (issue 4).
MAIN_ROWS = [
    ("decode, batch 1 (prompt 512, 128 new)", "decode_tok_per_s", 1, 512, 128, (">=", 260)),
    ("decode, batch 8 (prompt 512, 128 new)", "decode_tok_per_s", 8, 512, 128, (">=", 2000)),
    ("decode, batch 64 (prompt 512, 128 new)", "decode_tok_per_s", 64, 512, 128, (">=", 10000)),
    ("decode step, batch 1", "decode_ms_per_token", 1, 512, 128, None),
    ("prefill 2048 tokens, batch 1", "prefill_ms", 1, 2048, None, ("<=", 48)),
    ("prefill 512 tokens, batch 1", "prefill_ms", 1, 512, None, None),
    ("time to first token, 128-token prompt", "ttft_ms", 1, 128, None, ("<=", 8)),
    ("time to first token, 512-token prompt", "ttft_ms", 1, 512, None, None),
    ("load to first-token-ready (page cache)", "load_s", None, None, None, ("<=", 2)),
    ("compile (cold kernel cache)", "compile_s", None, None, None, ("<=", 60)),
    ("compile (warm kernel cache)", "compile_warm_s", None, None, None, None),
    ("peak GPU memory", "peak_gpu_mem_bytes", None, None, None, None),
    ("peak host memory", "peak_host_mem_bytes", None, None, None, None),
]


def load(paths):
    meta, recs = None, []
    for p in paths:
        with open(p) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    o = json.loads(line)
                except ValueError:
                    continue
                if "meta" in o:
                    meta = meta or o["meta"]
                elif "metric" in o and "impl" in o:
                    recs.append(o)
    return meta or {}, recs


def key(r):
    m = r["metric"]
    if m in NO_SHAPE_KEY:
        return (m, None, None, None)
    return (m, r.get("batch"), r.get("input_len"), None if m in NO_OUTPUT_KEY else r.get("output_len"))


def index(recs):
    """{impl: {key: first numeric record}}"""
    ix = {}
    for r in recs:
        v = r.get("value")
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            continue
        ix.setdefault(r["impl"], {}).setdefault(key(r), r)
    return ix


def fmt_num(v):
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}" if v >= 1 else f"{v:.3g}"


def fmt_val(metric, v, unit):
    if metric in MEM_METRICS:
        return f"{v / 1e9:.1f} GB"
    return f"{fmt_num(v)} {unit or ''}".strip()


def cell(r):
    if r is None:
        return "—"
    s = fmt_val(r["metric"], r["value"], r.get("unit"))
    if r.get("frac_of_floor") is not None:
        pct = r["frac_of_floor"] * 100
        s += f" ({pct:.0f}%)" if pct >= 10 else f" ({pct:.2g}%)"
    return s


def speedup(k, p):
    """kiln's speedup over a peer (> 1: kiln faster), or None."""
    if k is None or p is None or k["metric"] in MEM_METRICS:
        return None
    kv, pv = k["value"], p["value"]
    if kv <= 0 or pv <= 0:
        return None
    return kv / pv if k["metric"] in RATE_METRICS else pv / kv


def fmt_speedup(s):
    return "—" if s is None else f"{s:.2f}×"


def floor_cell(rows):
    for r in rows:
        if r is not None and r.get("floor") is not None:
            return fmt_val(r["metric"], r["floor"], r.get("unit"))
    return "—"


def is_full_mistral(meta):
    return meta.get("model") == "mistral-7b" and meta.get("layers") == 32


def target_cell(target, k, meta, unit):
    if target is None:
        return ""
    op, tv = target
    t = f"{'≥' if op == '>=' else '≤'} {tv:,} {unit}"
    if not is_full_mistral(meta):
        return t + " (full Mistral-7B only)"
    if k is None:
        return t
    ok = k["value"] >= tv if op == ">=" else k["value"] <= tv
    return t + (" ✓" if ok else " ✗")


_UNITS = {"decode_tok_per_s": "tok/s", "decode_ms_per_token": "ms", "prefill_ms": "ms", "ttft_ms": "ms",
          "load_s": "s", "compile_s": "s", "compile_warm_s": "s", "peak_gpu_mem_bytes": "GB",
          "peak_host_mem_bytes": "GB"}


def markdown(meta, recs):
    ix = index(recs)
    out = []
    model = meta.get("model", "?")
    layers = meta.get("layers")
    title = f"### {model}" + (f" ({layers} layers)" if layers not in (None, 32) else "")
    out.append(title + f", {meta.get('dtype', '?')}, {meta.get('gpu', '?')} — {str(meta.get('date', '?'))[:10]}, "
               f"commit {meta.get('commit', '?')}")
    out.append("")
    if meta.get("weight_bytes"):
        out.append(f"Random weights normal(0, 0.02), {meta['weight_bytes'] / 1e9:.2f} GB, {meta['params'] / 1e9:.2f} B parameters "
                   f"(bench/make_checkpoint.py). Floors: a forward over T tokens takes at least "
                   f"max((weight bytes + KV read) / {meta.get('floor_bw_Bps', 4.2e12) / 1e12:.1f} TB/s, 2·params·T / "
                   f"{meta.get('floor_peak_flops', 785e12) / 1e12:.0f} TFLOP/s); the weights alone take "
                   f"{meta.get('decode_step_floor_ms_b1', float('nan')):.3g} ms to read. "
                   f"torch {meta.get('torch')}, transformers {meta.get('transformers')}. "
                   f"Percentages are fractions of the floor; \"kiln vs\" is a speedup (> 1: kiln faster).")
        out.append("")
    hdr = ["measurement", "floor"] + [name for _, name in IMPLS] + [f"kiln vs {name.split(' ')[0]}" for _, name in PEERS] + ["target"]
    out.append("| " + " | ".join(hdr) + " |")
    out.append("|" + "---|" * len(hdr))
    used = set()
    for label, metric, b, i, o, target in MAIN_ROWS:
        k = key({"metric": metric, "batch": b, "input_len": i, "output_len": o})
        cells = [ix.get(impl, {}).get(k) for impl, _ in IMPLS]
        if all(c is None for c in cells):
            continue
        used.add(k)
        row = [label, floor_cell(cells)] + [cell(c) for c in cells]
        row += [fmt_speedup(speedup(cells[0], c)) for c in cells[1:]]
        row.append(target_cell(target, cells[0], meta, _UNITS.get(metric, "")))
        out.append("| " + " | ".join(row) + " |")
    # everything else, one row per (metric, shape)
    others = sorted({k for impl in ix.values() for k in impl if k not in used},
                    key=lambda k: tuple("" if x is None else str(x).zfill(8) for x in k))
    if others:
        out.append("")
        out.append("Other measurements:")
        out.append("")
        hdr2 = ["metric", "batch", "input", "output"] + [name for _, name in IMPLS]
        out.append("| " + " | ".join(hdr2) + " |")
        out.append("|" + "---|" * len(hdr2))
        for k in others:
            cells = [ix.get(impl, {}).get(k) for impl, _ in IMPLS]
            out.append("| " + " | ".join([k[0]] + ["" if x is None else str(x) for x in k[1:]] + [cell(c) for c in cells]) + " |")
    notes = [r for r in recs if r.get("metric") in ("error", "skipped")]
    if notes:
        out.append("")
        for r in notes:
            shape = "" if r.get("batch") is None else f" (batch {r['batch']}, {r.get('input_len')}/{r.get('output_len')})"
            out.append(f"- {r['impl']} {r['metric']}{shape}: {str(r['value'])[:300]}")
    out.append("")
    return "\n".join(out)


def ratio_table(recs):
    """A plain-text table of kiln's speedup over each peer, for a terminal."""
    ix = index(recs)
    kiln = ix.get("kiln", {})
    lines = ["", "kiln vs peers (speedup, > 1: kiln faster; % = fraction of floor)"]
    rows = []
    for k, kr in kiln.items():
        for impl, name in PEERS:
            pr = ix.get(impl, {}).get(k)
            s = speedup(kr, pr)
            if s is None:
                continue
            shape = "" if k[1] is None else f"b{k[1]} in{k[2]}" + ("" if k[3] is None else f" out{k[3]}")
            rows.append((k[0], shape, cell(kr), name.split(" ")[0], cell(pr), f"{s:.2f}x"))
    if not rows:
        lines.append("(no measurement that both kiln and a peer made)")
    w = [max(len(r[c]) for r in rows) for c in range(6)] if rows else []
    for r in rows:
        lines.append("  ".join(x.ljust(w[c]) for c, x in enumerate(r)))
    return "\n".join(lines) + "\n"


def append_to(path, block):
    """Insert block at the end of the "## GPU benchmarks" section of path."""
    text = open(path).read() if os.path.exists(path) else "# kiln benchmarks\n"
    lines = text.split("\n")
    start = next((n for n, l in enumerate(lines) if l.strip() == SECTION), None)
    if start is None:
        if not text.endswith("\n"):
            text += "\n"
        text += f"\n{SECTION}\n\n{block}"
    else:
        end = next((n for n in range(start + 1, len(lines)) if re.match(r"^## ", lines[n])), len(lines))
        body = lines[:start] + [l for l in lines[start:end] if l.strip() != PLACEHOLDER]
        while body and body[-1].strip() == "":
            body.pop()
        rest = lines[end:]
        text = "\n".join(body) + "\n\n" + block.rstrip("\n") + "\n" + ("\n" + "\n".join(rest) if rest else "")
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def main(argv=None):
    ap = argparse.ArgumentParser(description="JSON lines of bench/run_peers.py -> markdown for docs/benchmarks.md")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--append-to", default=None, help="add the block to this file's '## GPU benchmarks' section")
    ap.add_argument("--ratios", action="store_true", help="print the plain-text ratio table instead")
    a = ap.parse_args(argv)
    meta, recs = load(a.files)
    if not recs:
        print(f"compare.py: no measurement lines in {', '.join(a.files)}", file=sys.stderr)
        return 1
    if a.ratios:
        print(ratio_table(recs))
        return 0
    block = markdown(meta, recs)
    if a.append_to:
        append_to(a.append_to, block)
        print(f"compare.py: added {meta.get('model')} ({meta.get('date')}) to {a.append_to}", file=sys.stderr)
    else:
        print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
