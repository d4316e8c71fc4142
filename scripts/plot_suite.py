#!/usr/bin/env python3
"""Plots the shape suite's worst seed against the number of releases: one line per shape,
the minimum over the seeds of the served list's NDCG@10 as a ratio to DP popularity at the
same plan (the `ratio (min)` column of scripts/topn_suite.sh), read from saved suite
tables, with a line at 1.0x (DP popularity). The x axis is logarithmic in the releases.

Usage: scripts/plot_suite.py OUT.svg TITLE N=TABLE.md [N=TABLE.md ...]
  N is the --releases-seen the table was made with. Standard library only.
"""
import math
import sys

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
           "#e377c2", "#7f7f7f", "#17becf", "#bcbd22"]


def read(path):
    """{shape: (mean ratio, min ratio)} from a suite table."""
    out = {}
    for line in open(path).read().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 5 or not cells[3].endswith("x") or cells[0] == "shape":
            continue
        shape = cells[0].split(",")[0].replace(" (mean of folds)", "")
        out[shape] = (float(cells[3].rstrip("x")), float(cells[4].rstrip("x")))
    return out


def main():
    args = sys.argv[1:]
    if len(args) < 3:
        sys.exit(__doc__)
    out, title = args[0], args[1]
    tables = sorted((int(n), read(p)) for n, p in (a.split("=", 1) for a in args[2:]))
    shapes = list(dict.fromkeys(s for _, t in tables for s in t))
    w, h, left, right, top, bottom = 760, 440, 60, 220, 40, 50
    n_min, n_max = tables[0][0], tables[-1][0]
    values = [t[s][1] for _, t in tables for s in t]
    y_lo = min(0.9, math.floor(min(values) * 20) / 20)
    y_hi = math.ceil(max(values) * 10) / 10
    span = max(1e-9, math.log(n_max) - math.log(n_min))
    x = lambda n: left + (w - left - right) * (math.log(n) - math.log(n_min)) / span
    y = lambda v: top + (h - top - bottom) * (y_hi - v) / (y_hi - y_lo)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{(w - right + left) / 2}" y="20" text-anchor="middle" '
           f'font-size="14">{title}</text>']
    steps = round((y_hi - y_lo) / 0.1)
    for k in range(steps + 1):
        v = y_lo + 0.1 * k
        svg.append(f'<line x1="{left}" x2="{w - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                   f'stroke="#ddd"/><text x="{left - 6}" y="{y(v) + 4:.1f}" '
                   f'text-anchor="end">{v:.1f}x</text>')
    svg.append(f'<line x1="{left}" x2="{w - right}" y1="{y(1.0):.1f}" y2="{y(1.0):.1f}" '
               f'stroke="black" stroke-dasharray="5,4"/>')
    for n, _ in tables:
        svg.append(f'<text x="{x(n):.1f}" y="{h - bottom + 18}" text-anchor="middle">{n}'
                   f'</text>')
    svg.append(f'<text x="{(left + w - right) / 2}" y="{h - bottom + 36}" '
               f'text-anchor="middle">releases seen (log scale)</text>')
    svg.append(f'<text x="16" y="{(top + h - bottom) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {(top + h - bottom) / 2})">worst seed: NDCG@10 / '
               f'DP popularity</text>')
    for k, shape in enumerate(shapes):
        c = COLOURS[k % len(COLOURS)]
        pts = [(n, t[shape][1]) for n, t in tables if shape in t]
        line = " ".join(f"{x(n):.1f},{y(v):.1f}" for n, v in pts)
        svg.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.8" points="{line}"/>')
        for n, v in pts:
            svg.append(f'<circle cx="{x(n):.1f}" cy="{y(v):.1f}" r="2.5" fill="{c}"/>')
        ly = top + 10 + 18 * k
        svg.append(f'<line x1="{w - right + 14}" x2="{w - right + 36}" y1="{ly - 4}" '
                   f'y2="{ly - 4}" stroke="{c}" stroke-width="2"/><text x="{w - right + 42}" '
                   f'y="{ly}">{shape}</text>')
    svg.append("</svg>")
    open(out, "w").write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
