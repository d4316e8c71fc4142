#!/usr/bin/env python3
"""The tables and plots of docs/QUALITY.md, from what scripts/quality.sh wrote.

Usage:
  quality_tables.py rmse SCRATCH     RMSE table from the `dprec-lab eval --out` reports
  quality_tables.py eps SCRATCH OUT  MovieLens-100K at smaller budgets (also OUT/eps-ml100k.json)
  quality_tables.py summary OUT      summary tables from the suite tables in OUT
  quality_tables.py plots OUT        OUT/quality-releases.svg and OUT/quality-eps.svg
Standard library only.
"""
import json
import math
import os
import sys

SHAPES = ["ML-100K u1..u5", "ml100k", "ml100k-taste", "heavy-raters", "light-raters",
          "wide-catalogue", "small-store", "dense-raters", "ml1m-taste"]
# users, items, ratings of each shape (crates/dprec-lab/src/synthetic.rs presets; ML-100K itself).
SIZES = {
    "ML-100K u1..u5": "943 x 1,682, 100k, real",
    "ml100k": "943 x 1,682, 100k",
    "ml100k-taste": "943 x 1,682, 100k, taste groups",
    "heavy-raters": "610 x 9,742, 101k",
    "light-raters": "20,000 x 8,000, 400k",
    "wide-catalogue": "3,000 x 60,000, 150k",
    "small-store": "500 x 1,600, 25k",
    "dense-raters": "1,500 x 4,000, 375k",
    "ml1m-taste": "6,040 x 3,706, 1M, taste groups",
}


def read_suite(path):
    """{shape: dict of the suite row} from a scripts/topn_suite.sh table (None if absent)."""
    if not os.path.exists(path):
        return None
    out = {}
    for line in open(path).read().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 9 or cells[0] == "shape" or cells[0].startswith("---"):
            continue
        shape = cells[0].split(",")[0].replace(" (mean of folds)", "")
        num = lambda s: float(s.rstrip("x")) if s not in ("-", "") else None
        out[shape] = {
            "topn": num(cells[1]), "dppop": num(cells[2]), "ratio": num(cells[3]),
            "min": num(cells[4]), "liked": num(cells[5]), "pop": num(cells[6]),
            "ease": num(cells[7]), "rest": cells[8],
        }
    return out


def cell(row):
    if row is None or row["topn"] is None:
        return "(not run)"
    return f"{row['topn']:.3f} ({row['ratio']:.2f}x / {row['min']:.2f}x)"


def pair(row):
    """Served NDCG@10 / DP popularity's, where a ratio of two noisy small numbers says little."""
    if row is None or row["topn"] is None:
        return "(not run)"
    return f"{row['topn']:.3f} / {row['dppop']:.3f}"


def fmt(x, d=3):
    return "-" if x is None else f"{x:.{d}f}"


def summary(out):
    suite = {n: read_suite(f"{out}/suite-{n}.md") for n in (1, 10, 52)}
    print("NDCG@10 of the served list after 1, 10 and 52 releases of the default plan; in brackets")
    print("its ratio to DP popularity at the same plan and releases, mean / worst of 3 seeds.")
    print("References: DP popularity after 52 releases, exact popularity, non-private EASE (-: not")
    print("computed, catalogue over 2,000 items).\n")
    print("| shape (users x items, ratings) | after 1 release | after 10 | after 52 | DP popularity (52) | exact popularity | EASE (non-private) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for s in SHAPES:
        rows = [suite[n].get(s) if suite[n] else None for n in (1, 10, 52)]
        ref = next((r for r in reversed(rows) if r), None)
        if ref is None:
            continue
        last = rows[2]
        print(f"| {s} ({SIZES[s]}) | {cell(rows[0])} | {cell(rows[1])} | {cell(rows[2])} | "
              f"{fmt(last['dppop'] if last else None)} | {fmt(ref['pop'])} | {fmt(ref['ease'])} |")
    print()
    for n in (1,):
        base = suite[n]
        eps = {e: read_suite(f"{out}/suite-{n}-eps-{e}.md") for e in (5, 2, 1)}
        if not base and not any(eps.values()):
            continue
        print("NDCG@10 of the served list / of DP popularity at the same budget, after the first")
        print("release of a plan of 52 in each budget (mean of 3 seeds).\n")
        print("| shape | eps_u 10 (default) | eps_u 5 | eps_u 2 | eps_u 1 |")
        print("| --- | --- | --- | --- | --- |")
        for s in SHAPES:
            cols = [base.get(s) if base else None] + [eps[e].get(s) if eps[e] else None for e in (5, 2, 1)]
            if all(c is None for c in cols):
                continue
            print(f"| {s} | " + " | ".join(pair(c) for c in cols) + " |")
        print()
    plans = {n: read_suite(f"{out}/suite-{n}-plan-{n}.md") for n in (1, 10)}
    if any(plans.values()):
        print("NDCG@10 of the served list when the plan has 1 or 10 releases in eps_u 10, every rating")
        print("taking full part, against the default plan of 52 at the same release (ratio to DP")
        print("popularity at the same plan, mean / worst seed).\n")
        print("| shape | release 1 of 52 | release 1 of 1 | release 10 of 52 | release 10 of 10 |")
        print("| --- | --- | --- | --- | --- |")
        for s in SHAPES:
            cols = [suite[1].get(s) if suite[1] else None, plans[1].get(s) if plans[1] else None,
                    suite[10].get(s) if suite[10] else None, plans[10].get(s) if plans[10] else None]
            if all(c is None for c in cols):
                continue
            print(f"| {s} | " + " | ".join(cell(c) for c in cols) + " |")
        print()


def rmse(scratch):
    def runs(path):
        if not os.path.exists(path):
            return {}
        rep = json.load(open(path))
        return {r["label"]: [f["rmse"] for f in r["folds"]] for r in rep["runs"]}
    ml = {}
    for s in (1, 2, 3):
        for label, v in runs(f"{scratch}/rmse-ml100k-{s}.json").items():
            ml.setdefault(label, []).extend(v)
    print("| trainer | MovieLens-100K: mean RMSE (worst fold), 3 seeds x 5 folds |")
    print("| --- | --- |")
    names = {"baseline": "bias baseline (non-private: mean + user and item biases)",
             "dp-alt": "dp-alt, eps_u 10 (the default plan: 52 releases)"}
    for label, v in ml.items():
        name = names.get(label, label.replace("dp-alt:eps=", "dp-alt, eps_u ") + " (52 releases)")
        print(f"| {name} | {sum(v) / len(v):.4f} ({max(v):.4f}) |")
    after = []
    for s in (1, 2, 3):
        after.extend(runs(f"{scratch}/rmse10-ml100k-{s}.json").get("dp-alt", []))
    if after:
        name = "dp-alt, eps_u 10, after 10 releases (the item side combined across them)"
        print(f"| {name} | {sum(after) / len(after):.4f} ({max(after):.4f}) |")
    print()
    print("| synthetic shape | bias baseline | dp-alt (default plan) | dp-alt after 10 releases |")
    print("| --- | --- | --- | --- |")
    for p in ("ml100k", "ml100k-taste", "heavy-raters", "small-store"):
        r = runs(f"{scratch}/rmse-{p}.json")
        if not r:
            continue
        b, d = r.get("baseline", []), r.get("dp-alt", [])
        d10 = runs(f"{scratch}/rmse10-{p}.json").get("dp-alt", [])
        f = lambda v: f"{sum(v) / len(v):.4f} ({max(v):.4f})" if v else "-"
        print(f"| {p} ({SIZES[p]}) | {f(b)} | {f(d)} | {f(d10)} |")


def eps(scratch, out):
    """MovieLens-100K after 10 and 52 releases at eps_u 5, 2, 1 (eps-N-S.json)."""
    data = {}
    for n in (10, 52):
        for s in (1, 2, 3):
            path = f"{scratch}/eps-{n}-{s}.json"
            if not os.path.exists(path):
                continue
            for r in json.load(open(path))["runs"]:
                name, e = r["label"].split(":eps=")
                d = data.setdefault(str(n), {}).setdefault(e, {}).setdefault(name, [])
                d.append([f["ranking"]["ndcg"] for f in r["folds"]])
    json.dump(data, open(f"{out}/eps-ml100k.json", "w"), indent=1)
    print("| eps_u | releases seen | served NDCG@10, mean (worst fold) | DP popularity, mean | ratio, mean (worst seed) |")
    print("| --- | --- | --- | --- | --- |")
    for e in ("5", "2", "1"):
        for n in ("10", "52"):
            d = data.get(n, {}).get(e)
            if not d:
                continue
            t, p = d["dp-topn"], d["dp-popularity"]
            flat = lambda v: [x for fold in v for x in fold]
            mean = lambda v: sum(v) / len(v)
            ratios = [mean(a) / mean(b) for a, b in zip(t, p)]
            print(f"| {e} | {n} | {mean(flat(t)):.3f} ({min(flat(t)):.3f}) | {mean(flat(p)):.3f} | "
                  f"{mean(ratios):.2f}x ({min(ratios):.2f}x) |")


COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def line_plot(path, title, xlabel, xs_log, series, hlines):
    """series: [(name, [(x, y)], dashed)]; hlines: [(name, y)]."""
    w, h, left, right, top, bottom = 720, 420, 70, 230, 40, 55
    pw, ph = w - left - right, h - top - bottom
    ys = [y for _, pts, _ in series for _, y in pts] + [y for _, y in hlines]
    xs = [x for _, pts, _ in series for x, _ in pts]
    ymax = max(ys) * 1.1
    fx = (lambda x: math.log(x)) if xs_log else (lambda x: x)
    x0, x1 = fx(min(xs)), fx(max(xs))
    X = lambda x: left + (fx(x) - x0) / (x1 - x0) * pw
    Y = lambda y: top + ph - y / ymax * ph
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
         f'<rect width="{w}" height="{h}" fill="white"/>',
         f'<text x="{left}" y="22" font-size="14">{title}</text>',
         f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="black"/>',
         f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="black"/>',
         f'<text x="{left + pw / 2}" y="{h - 12}" text-anchor="middle">{xlabel}</text>',
         f'<text x="16" y="{top + ph / 2}" transform="rotate(-90 16 {top + ph / 2})" text-anchor="middle">NDCG@10</text>']
    step = 0.05 if ymax <= 0.5 else 0.1
    t = 0.0
    while t <= ymax:
        o.append(f'<line x1="{left - 4}" y1="{Y(t):.1f}" x2="{left + pw}" y2="{Y(t):.1f}" stroke="#ddd"/>')
        o.append(f'<text x="{left - 8}" y="{Y(t) + 4:.1f}" text-anchor="end">{t:.2f}</text>')
        t = round(t + step, 10)
    for x in sorted(set(xs)):
        o.append(f'<text x="{X(x):.1f}" y="{top + ph + 18}" text-anchor="middle">{x:g}</text>')
    legend_y = top + 10
    for i, (name, y) in enumerate(hlines):
        c = "#7f7f7f" if i == 0 else "#17becf"
        o.append(f'<line x1="{left}" y1="{Y(y):.1f}" x2="{left + pw}" y2="{Y(y):.1f}" stroke="{c}" stroke-dasharray="2,3"/>')
        o.append(f'<line x1="{left + pw + 12}" y1="{legend_y}" x2="{left + pw + 32}" y2="{legend_y}" stroke="{c}" stroke-dasharray="2,3"/>')
        o.append(f'<text x="{left + pw + 38}" y="{legend_y + 4}">{name}</text>')
        legend_y += 18
    for i, (name, pts, dashed) in enumerate(series):
        c = COLOURS[(i // 2) % len(COLOURS)] if len(series) > 2 else COLOURS[i]
        dash = ' stroke-dasharray="6,4"' if dashed else ""
        d = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in pts)
        o.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="2"{dash}/>')
        for x, y in pts:
            o.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="3" fill="{c}"/>')
        o.append(f'<line x1="{left + pw + 12}" y1="{legend_y}" x2="{left + pw + 32}" y2="{legend_y}" stroke="{c}" stroke-width="2"{dash}/>')
        o.append(f'<text x="{left + pw + 38}" y="{legend_y + 4}">{name}</text>')
        legend_y += 18
    o.append("</svg>")
    open(path, "w").write("\n".join(o) + "\n")


def plots(out):
    shapes = [("ML-100K u1..u5", "ML-100K"), ("ml1m-taste", "ml1m-taste"), ("small-store", "small-store")]
    suite = {n: read_suite(f"{out}/suite-{n}.md") for n in (1, 10, 52)}
    done = [n for n in (1, 10, 52) if suite[n]]
    if len(done) >= 2:
        series = []
        for key, name in shapes:
            series.append((f"{name}: served", [(n, suite[n][key]["topn"]) for n in done], False))
            series.append((f"{name}: DP popularity", [(n, suite[n][key]["dppop"]) for n in done], True))
        ml = suite[done[0]]["ML-100K u1..u5"]
        line_plot(f"{out}/quality-releases.svg",
                  "NDCG@10 against releases seen (default plan: 52 in eps_u 10)", "releases seen",
                  True, series, [("ML-100K: exact popularity", ml["pop"]), ("ML-100K: EASE (non-private)", ml["ease"])])
    series = []
    pts, dp = [], []
    for e in (1, 2, 5, 10):
        t = suite[1] if e == 10 else read_suite(f"{out}/suite-1-eps-{e}.md")
        if t and "ML-100K u1..u5" in t:
            pts.append((e, t["ML-100K u1..u5"]["topn"]))
            dp.append((e, t["ML-100K u1..u5"]["dppop"]))
    if len(pts) >= 2:
        series += [("served, 1 release", pts, False), ("DP popularity, 1 release", dp, True)]
    if os.path.exists(f"{out}/eps-ml100k.json"):
        data = json.load(open(f"{out}/eps-ml100k.json"))
        mean = lambda v: sum(x for fold in v for x in fold) / sum(len(fold) for fold in v)
        for n in ("10", "52"):
            if not suite[int(n)] or n not in data:
                continue
            base = suite[int(n)]["ML-100K u1..u5"]
            pts = [(float(e), mean(data[n][e]["dp-topn"])) for e in ("1", "2", "5") if e in data[n]]
            dp = [(float(e), mean(data[n][e]["dp-popularity"])) for e in ("1", "2", "5") if e in data[n]]
            series += [(f"served, {n} releases", pts + [(10.0, base["topn"])], False),
                       (f"DP popularity, {n} releases", dp + [(10.0, base["dppop"])], True)]
    if series:
        ml = next(t for t in suite.values() if t)["ML-100K u1..u5"]
        line_plot(f"{out}/quality-eps.svg", "MovieLens-100K: NDCG@10 against the user budget eps_u (52 planned)",
                  "eps_u (delta_u 1e-6)", True, series,
                  [("exact popularity", ml["pop"]), ("EASE (non-private)", ml["ease"])])


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"rmse": rmse, "eps": eps, "summary": summary, "plots": plots}[cmd](*args)
