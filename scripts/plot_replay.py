#!/usr/bin/env python3
"""Plots the per-period next-period NDCG@10 of scripts/continual_replay.py runs (their
--csv files) as one SVG: a line per run, each a moving average over WINDOW periods (the
raw per-period values swing with the few users a short period has), with the run's mean
in the legend.

Usage: scripts/plot_replay.py OUT.svg TITLE LABEL=FILE.csv [LABEL=FILE.csv ...] [--window N]
Standard library only.
"""
import sys

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def read(path):
    rows = []
    for line in open(path).read().splitlines()[1:]:
        t, users, ndcg = line.split(",")[:3]
        if ndcg:
            rows.append((int(t), int(users), float(ndcg)))
    return rows


def smooth(rows, window):
    out = []
    for k in range(len(rows)):
        part = rows[max(0, k - window + 1):k + 1]
        out.append((rows[k][0], sum(r[2] for r in part) / len(part)))
    return out


def main():
    args = sys.argv[1:]
    window = 7
    if "--window" in args:
        k = args.index("--window")
        window = int(args[k + 1])
        del args[k:k + 2]
    out, title, runs = args[0], args[1], [a.split("=", 1) for a in args[2:]]
    series = [(label, read(path)) for label, path in runs]
    w, h, left, right, top, bottom = 760, 420, 60, 20, 40, 110
    t_max = max(r[0] for _, rows in series for r in rows)
    lines = [smooth(rows, window) for _, rows in series]
    y_max = max(v for line in lines for _, v in line) * 1.1
    x = lambda t: left + (w - left - right) * (t - 1) / max(1, t_max - 1)
    y = lambda v: top + (h - top - bottom) * (1 - v / y_max)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>']
    for k in range(6):
        v = y_max * k / 5
        svg.append(f'<line x1="{left}" x2="{w - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                   f'stroke="#ddd"/><text x="{left - 6}" y="{y(v) + 4:.1f}" '
                   f'text-anchor="end">{v:.2f}</text>')
    for k in range(6):
        t = 1 + (t_max - 1) * k / 5
        svg.append(f'<text x="{x(t):.1f}" y="{h - bottom + 18}" text-anchor="middle">'
                   f'{t:.0f}</text>')
    svg.append(f'<text x="{(left + w - right) / 2}" y="{h - bottom + 36}" '
               f'text-anchor="middle">period (release)</text>')
    svg.append(f'<text x="16" y="{(top + h - bottom) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {(top + h - bottom) / 2})">next-period NDCG@10 '
               f'({window}-period moving average)</text>')
    for k, ((label, rows), line) in enumerate(zip(series, lines)):
        c = COLOURS[k % len(COLOURS)]
        pts = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in line)
        svg.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.6" points="{pts}"/>')
        mean = sum(r[2] for r in rows) / len(rows)
        ly = h - bottom + 56 + 16 * k
        svg.append(f'<line x1="{left}" x2="{left + 24}" y1="{ly - 4}" y2="{ly - 4}" '
                   f'stroke="{c}" stroke-width="2"/><text x="{left + 30}" y="{ly}">{label}: '
                   f'mean {mean:.4f} over {len(rows)} periods</text>')
    svg.append("</svg>")
    open(out, "w").write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
