#!/usr/bin/env python3
"""plot_quant.py — docs/data/pycode22m_quant.csv (perplexity increase against bits per weight, measured
by kiln perplexity; see the CSV's header) as an SVG scatter plot, written without plotting libraries:
    python3 bench/plot_quant.py [CSV] [SVG]
Defaults: docs/data/pycode22m_quant.csv -> docs/img/quant_pycode22m.svg."""
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
src = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs/data/pycode22m_quant.csv"
dst = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "docs/img/quant_pycode22m.svg"
rows = list(csv.DictReader(l for l in src.read_text().splitlines() if l and not l.startswith("#")))

W, H, L, R, T, B = 1040, 520, 70, 440, 30, 60  # size, margins (the right one holds the labels)
X0, X1, Y0, Y1 = 4.0, 16.5, -0.5, 4.5
px = lambda x: L + (x - X0) / (X1 - X0) * (W - L - R)
py = lambda y: H - B - (y - Y0) / (Y1 - Y0) * (H - T - B)
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>']
for x in range(4, 17, 2):  # grid and ticks
    out.append(f'<line x1="{px(x):.1f}" y1="{py(Y0):.1f}" x2="{px(x):.1f}" y2="{py(Y1):.1f}" stroke="#eee"/>')
    out.append(f'<text x="{px(x):.1f}" y="{H - B + 18}" text-anchor="middle">{x}</text>')
for y in range(0, 5):
    out.append(f'<line x1="{px(X0):.1f}" y1="{py(y):.1f}" x2="{px(X1):.1f}" y2="{py(y):.1f}" stroke="#eee"/>')
    out.append(f'<text x="{L - 8}" y="{py(y) + 4:.1f}" text-anchor="end">{y} %</text>')
out.append(f'<line x1="{px(X0):.1f}" y1="{py(1):.1f}" x2="{px(X1):.1f}" y2="{py(1):.1f}" stroke="#c33" '
           'stroke-dasharray="4 3"/>')
out.append(f'<text x="{px(X0) + 4:.1f}" y="{py(1) - 4:.1f}" fill="#c33">auto at 18M: target +1.0 %</text>')
out.append(f'<text x="{(L + W - R) / 2:.1f}" y="{H - 20}" text-anchor="middle">average bits per weight '
           '(kiln inspect, all weights)</text>')
out.append(f'<text transform="translate(18 {(T + H - B) / 2:.1f}) rotate(-90)" text-anchor="middle">'
           'perplexity increase over bf16</text>')
out.append(f'<text x="{L}" y="{T - 10}" font-size="14">pycode-22m, kiln perplexity (CPU, 9,264 tokens)</text>')
out.append(f'<text x="{W - R - 190}" y="{T - 10}" font-size="12"><tspan fill="#1f77b4">● one format (uniform)</tspan>'
           ' <tspan fill="#d62728">■ --quant auto</tspan></text>')
colors = {"uniform": "#1f77b4", "auto": "#d62728"}
ly = T + 10
for i, r in enumerate(sorted(rows, key=lambda r: (r["kind"], -float(r["bits_per_weight"])))):
    x, y, c = float(r["bits_per_weight"]), float(r["ppl_increase_pct"]), colors[r["kind"]]
    shape = (f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="5" fill="{c}" fill-opacity="0.8"/>' if r["kind"] == "uniform"
             else f'<rect x="{px(x) - 5:.1f}" y="{py(y) - 5:.1f}" width="10" height="10" fill="{c}" fill-opacity="0.8"/>')
    out.append(shape)
    out.append(f'<text x="{px(x) + 7:.1f}" y="{py(y) - 6:.1f}" font-size="10" fill="{c}">{i + 1}</text>')
    out.append(f'<text x="{W - R + 16}" y="{ly}" font-size="11" fill="{c}">{i + 1}. {r["label"]}: '
               f'{x:.2f} bits, {y:+.2f} %</text>')
    ly += 16
out.append("</svg>")
dst.parent.mkdir(parents=True, exist_ok=True)
dst.write_text("\n".join(out) + "\n")
print(f"wrote {dst} ({len(rows)} points)")
