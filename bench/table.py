#!/usr/bin/env python3
"""Merge Surprise and dprec benchmark JSON into one side-by-side markdown table.

Inputs share one shape (see bench/surprise_compare.py and `dprec-lab eval --out`):
  {"runs": [{"trainer": ..., "params": {...}, "folds": [{"fold", "rmse", "mae",
             "train_seconds", ...}], "mean": {...}, "std": {...}}, ...]}

Usage:
  python3 bench/table.py --surprise bench/out/surprise.json \
      --dprec bench/out/dprec-baseline.json \
      --dprec "tuned=bench/out/dprec-sgd-tuned.json" \
      --out bench/out/compare.md

A --dprec value may be TAG=PATH; the tag is shown next to the algorithm name.
The speed-up column is (Surprise SVD n_factors=20 mean train seconds per fold) /
(this row's mean train seconds per fold). Standard library only, so it runs
with any python3; a missing or malformed dprec file is reported in the table's
notes instead of aborting, so the Surprise half of a run is never lost.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from datetime import datetime, timezone

METRICS = ("rmse", "mae", "train_seconds")
GOAL_SPEEDUP = 5.0


def num(x):
    """x as a finite float, or None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, str):
        try:
            return num(float(x))
        except ValueError:
            return None
    return None


def load(path, notes, what):
    """Parsed JSON dict, or None with a note explaining why."""
    if not os.path.isfile(path):
        notes.append(f"{what}: `{path}` not found.")
        return None
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        notes.append(f"{what}: `{path}` is not valid JSON ({e}).")
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list) or not doc["runs"]:
        notes.append(f"{what}: `{path}` has no non-empty \"runs\" list.")
        return None
    return doc


def fmt_value(v):
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def fmt_params(params):
    if not isinstance(params, dict) or not params:
        return ""
    return ", ".join(f"{k}={fmt_value(v)}" for k, v in params.items())


def run_means(run, notes, name):
    """Mean rmse/mae/train_seconds of a run: from "mean", else recomputed from "folds"."""
    folds = [f for f in run.get("folds") or [] if isinstance(f, dict)]
    given = run.get("mean") if isinstance(run.get("mean"), dict) else {}
    means = {}
    for key in METRICS:
        m = num(given.get(key))
        if m is None:
            vals = [num(f.get(key)) for f in folds]
            vals = [v for v in vals if v is not None]
            if vals:
                m = statistics.fmean(vals)
                notes.append(f"{name}: mean {key} missing, recomputed from {len(vals)} fold(s).")
            else:
                notes.append(f"{name}: no usable {key} values.")
        means[key] = m
    return means, folds


def collect(doc, source, tag, notes):
    rows = []
    for i, run in enumerate(doc["runs"]):
        if not isinstance(run, dict):
            notes.append(f"{source}: run #{i} is not an object, skipped.")
            continue
        trainer = str(run.get("trainer", f"run{i}"))
        if source == "surprise":
            name = run.get("label") or f"Surprise {trainer}"
        else:
            params = fmt_params(run.get("params"))
            name = f"dprec {trainer}" + (f" ({params})" if params else "")
        if tag and tag != trainer:
            name = f"{name} [{tag}]"
        means, folds = run_means(run, notes, name)
        rows.append(
            {
                "source": source,
                "trainer": trainer,
                "params": run.get("params") if isinstance(run.get("params"), dict) else {},
                "name": name,
                "mean": means,
                "folds": folds,
            }
        )
    return rows


def is_reference(row):
    """Surprise SVD with n_factors=20: the row every speed-up is measured against."""
    return (
        row["source"] == "surprise"
        and row["trainer"] == "surprise-svd"
        and num(row["params"].get("n_factors")) == 20.0
    )


def check_folds(rows, notes):
    """Warn when runs did not evaluate the same folds on the same data sizes."""
    seen = {}
    for row in rows:
        for f in row["folds"]:
            key = f.get("fold")
            sizes = (f.get("n_train"), f.get("n_test"))
            if key is None or None in sizes:
                continue
            if key in seen and seen[key][0] != sizes:
                notes.append(
                    f"fold {key}: sizes differ ({seen[key][1]}: n_train/n_test={seen[key][0]}, "
                    f"{row['name']}: {sizes}); the comparison is not like for like."
                )
            seen.setdefault(key, (sizes, row["name"]))
    fold_sets = {row["name"]: tuple(sorted(str(f.get("fold")) for f in row["folds"])) for row in rows}
    if rows:
        # The fold set of the first (Surprise) run is the yardstick; name every run that differs.
        expected = fold_sets[rows[0]["name"]]
        for name, got in fold_sets.items():
            if got != expected:
                notes.append(
                    f"{name}: folds {','.join(got) or 'none'} differ from {','.join(expected) or 'none'}; "
                    "its means are over different folds."
                )


def cell(x, digits):
    return "n/a" if x is None else f"{x:.{digits}f}"


def render(rows, ref, notes, extra_notes, meta):
    ref_t = ref["mean"]["train_seconds"] if ref else None
    ref_rmse = ref["mean"]["rmse"] if ref else None
    lines = [
        "# dprec vs Surprise on MovieLens-100K (predefined folds u1..u5)",
        "",
        f"Generated {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}.",
        "Train seconds = mean wall time of fitting one fold (data loading and prediction excluded).",
        "Speed-up = Surprise SVD (n_factors=20) mean train seconds / this row's.",
        "",
        "| algorithm | mean RMSE | mean MAE | mean train s / fold | speed-up vs Surprise SVD-20 | folds |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        m = row["mean"]
        t = m["train_seconds"]
        if ref_t is not None and t is not None and t > 0:
            speed = f"{ref_t / t:.2f}x"
        else:
            speed = "n/a"
        name = row["name"].replace("|", "\\|")
        lines.append(
            f"| {name} | {cell(m['rmse'], 4)} | {cell(m['mae'], 4)} | {cell(t, 4)} | {speed} | {len(row['folds'])} |"
        )

    lines += ["", f"## Goal: >= {GOAL_SPEEDUP:g}x faster than Surprise SVD (n_factors=20) at equal or better RMSE", ""]
    ours = [r for r in rows if r["source"] == "dprec"]
    if ref is None or ref_t is None or ref_rmse is None:
        lines.append("- Cannot check: no usable Surprise SVD (n_factors=20) result.")
    elif not ours:
        lines.append("- Cannot check: no dprec result.")
    else:
        for r in ours:
            t, rmse = r["mean"]["train_seconds"], r["mean"]["rmse"]
            if t is None or rmse is None or t <= 0:
                lines.append(f"- {r['name']}: n/a (missing figures)")
                continue
            speed = ref_t / t
            ok = speed >= GOAL_SPEEDUP and rmse <= ref_rmse
            lines.append(
                f"- {r['name']}: {speed:.2f}x, RMSE {rmse:.4f} vs {ref_rmse:.4f} "
                f"({rmse - ref_rmse:+.4f}) -> {'MET' if ok else 'not met'}"
            )

    if meta:
        lines += ["", "## Environment", ""]
        for k in ("python", "scikit-surprise", "numpy", "nproc", "cpu_model", "platform"):
            if meta.get(k) is not None:
                lines.append(f"- {k}: {meta[k]}")
    all_notes = list(extra_notes) + notes
    if all_notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in all_notes]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--surprise", required=True, help="JSON written by bench/surprise_compare.py")
    ap.add_argument(
        "--dprec", action="append", default=[], help="[TAG=]PATH of a `dprec-lab eval --out` JSON (repeatable)"
    )
    ap.add_argument("--out", help="markdown file to write (the table is always printed to stdout)")
    ap.add_argument("--note", action="append", default=[], help="extra line for the Notes section (repeatable)")
    args = ap.parse_args(argv)

    notes = []
    surprise = load(args.surprise, notes, "Surprise results")
    if surprise is None:
        # Without the reference there is nothing to compare against: that is an error.
        sys.exit("error: " + notes[-1])
    rows = collect(surprise, "surprise", None, notes)

    for spec in args.dprec:
        tag, path = None, spec
        left, sep, right = spec.partition("=")
        if sep and left and "/" not in left:
            tag, path = left, right
        doc = load(path, notes, f"dprec results{f' [{tag}]' if tag else ''}")
        if doc is not None:
            rows += collect(doc, "dprec", tag, notes)

    refs = [r for r in rows if is_reference(r)]
    ref = refs[0] if refs else None
    if ref is None:
        notes.append("no Surprise SVD run with n_factors=20 found: speed-ups are n/a.")
    check_folds(rows, notes)

    md = render(rows, ref, notes, args.note, surprise.get("meta") if isinstance(surprise.get("meta"), dict) else {})
    sys.stdout.write(md)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(md)
        print(f"\nwrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
