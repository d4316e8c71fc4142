#!/usr/bin/env python3
"""Surprise baseline for the dprec side-by-side benchmark on MovieLens-100K.

Loads the predefined folds u1..u5 (uN.base / uN.test) with Surprise's
Reader / Dataset.load_from_folds and, for each algorithm, trains and tests on
every fold. For each fold it records

  * train_seconds: wall time of ``algo.fit(trainset)`` only, measured with
    time.perf_counter (building the trainset from the files and predicting the
    test set are NOT included),
  * rmse / mae on the fold's test file,

and writes JSON in the same shape as ``dprec-lab eval --out`` so that
bench/table.py can merge both:

  {"tool": "surprise",
   "meta": {...versions, machine...},
   "runs": [{"trainer": "surprise-svd", "label": "...", "params": {...},
             "folds": [{"fold": "u1", "rmse": .., "mae": .., "train_seconds": ..,
                        "n_train": .., "n_test": ..}, ...],
             "mean": {"rmse": .., "mae": .., "train_seconds": ..},
             "std":  {"rmse": .., "mae": .., "train_seconds": ..}}, ...]}

Algorithms (SVDpp is skipped: far too slow for a routine benchmark):
  * SVD(n_factors=20, random_state=0)   -- the reference for the speed-up
  * SVD(random_state=0)                 -- Surprise's default, 100 factors
  * BaselineOnly()                      -- biases only (ALS, Surprise defaults)

Usage:
  python bench/surprise_compare.py --data ../shared/datasets/ml-100k --out bench/out/surprise.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from importlib import metadata

DEFAULT_FOLDS = ["u1", "u2", "u3", "u4", "u5"]


def algorithms():
    """(trainer id, human label, params dict, factory) for every algorithm we run."""
    from surprise import SVD, BaselineOnly

    return [
        (
            "surprise-svd",
            "Surprise SVD (n_factors=20)",
            {"n_factors": 20, "n_epochs": 20, "lr_all": 0.005, "reg_all": 0.02, "random_state": 0},
            lambda: SVD(n_factors=20, random_state=0),
        ),
        (
            "surprise-svd",
            "Surprise SVD (default, n_factors=100)",
            {"n_factors": 100, "n_epochs": 20, "lr_all": 0.005, "reg_all": 0.02, "random_state": 0},
            # Only the seed is set, for reproducibility; everything else is Surprise's default.
            lambda: SVD(random_state=0),
        ),
        (
            "surprise-baseline",
            "Surprise BaselineOnly (ALS)",
            {"method": "als", "n_epochs": 10, "reg_u": 15, "reg_i": 10},
            lambda: BaselineOnly(verbose=False),
        ),
    ]


def summarize(values):
    mean = statistics.fmean(values)
    std = statistics.pstdev(values) if len(values) > 1 else 0.0
    return mean, std


def machine_info():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass

    def version(pkg):
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(),
        "scikit-surprise": version("scikit-surprise"),
        "numpy": version("numpy"),
        "scipy": version("scipy"),
        "platform": platform.platform(),
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--data",
        default=os.environ.get("DPREC_ML100K_DIR"),
        help="MovieLens-100K directory holding u1.base..u5.test "
        "(default: $DPREC_ML100K_DIR, else ../shared/datasets/ml-100k relative to the repo root)",
    )
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument(
        "--folds",
        default=",".join(DEFAULT_FOLDS),
        help="comma separated fold names (default: u1,u2,u3,u4,u5)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="fit each fold this many times and report the median fit time (default 1, like dprec-lab eval); "
        "all times are kept in train_seconds_all",
    )
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")

    if not args.data:
        repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        args.data = os.path.join(repo_root, "..", "shared", "datasets", "ml-100k")
    data_dir = os.path.abspath(args.data)
    folds = [f.strip() for f in args.folds.split(",") if f.strip()]
    if not folds:
        ap.error("--folds is empty")

    fold_files = []
    for name in folds:
        base = os.path.join(data_dir, f"{name}.base")
        test = os.path.join(data_dir, f"{name}.test")
        for p in (base, test):
            if not os.path.isfile(p):
                sys.exit(
                    f"error: {p} not found. Point --data (or DPREC_ML100K_DIR) at the MovieLens-100K directory."
                )
        fold_files.append((base, test))

    from surprise import Dataset, Reader, accuracy
    from surprise.model_selection import PredefinedKFold

    reader = Reader(line_format="user item rating timestamp", sep="\t", rating_scale=(1, 5))
    data = Dataset.load_from_folds(fold_files, reader=reader)
    # Build every trainset / testset once, so all algorithms see identical inputs and
    # the (slow, pure Python) trainset construction is outside every timing.
    splits = list(PredefinedKFold().split(data))

    runs = []
    for trainer, label, params, factory in algorithms():
        fold_results = []
        for name, (trainset, testset) in zip(folds, splits):
            times = []
            for _ in range(args.repeats):
                algo = factory()
                t0 = time.perf_counter()
                algo.fit(trainset)
                times.append(time.perf_counter() - t0)
            train_seconds = statistics.median(times)
            # With a fixed random_state every repeat fits the same model; score the last one.
            predictions = algo.test(testset)
            rmse = accuracy.rmse(predictions, verbose=False)
            mae = accuracy.mae(predictions, verbose=False)
            fold_results.append(
                {
                    "fold": name,
                    "rmse": rmse,
                    "mae": mae,
                    "train_seconds": train_seconds,
                    "train_seconds_all": times,
                    "n_train": trainset.n_ratings,
                    "n_test": len(testset),
                }
            )
            print(
                f"{label:40s} {name}: rmse={rmse:.4f} mae={mae:.4f} train={train_seconds:.3f}s",
                file=sys.stderr,
                flush=True,
            )
        mean, std = {}, {}
        for key in ("rmse", "mae", "train_seconds"):
            m, s = summarize([f[key] for f in fold_results])
            if not (math.isfinite(m) and math.isfinite(s)):
                sys.exit(f"error: non-finite {key} for {label}")
            mean[key], std[key] = m, s
        runs.append(
            {"trainer": trainer, "label": label, "params": params, "folds": fold_results, "mean": mean, "std": std}
        )

    meta = {**machine_info(), "data": data_dir, "folds": folds, "repeats": args.repeats}
    out = {"tool": "surprise", "meta": meta, "runs": runs}
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    os.replace(tmp, args.out)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
