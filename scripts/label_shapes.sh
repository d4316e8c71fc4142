#!/usr/bin/env bash
# dp-topn with the label model (labels=on) beside dp-popularity at the same plan on
# synthetic shapes whose items carry public labels (`dprec-lab synth --labels SIGNAL`: a label is the item's taste group
# with probability SIGNAL, a random group otherwise; 0 is pure noise), after 1, 5 and 52
# releases of an unchanged store. Prints one line per shape, signal and release count:
# NDCG@10 of both (mean over seeds and folds) and the ratio's mean and minimum over the
# seeds (each seed's ratio is its folds' mean NDCG over DP popularity's). A seed draws the
# data set; with --draws K each data set is evaluated K times (folds and noise drawn from
# eval seeds seed*100+0 .. seed*100+K-1) and its ratio is over all K draws: the
# noise-averaged ratio of that data set. --draws 1 (the default) evaluates it once at
# eval seed = data seed.
# Release build first: cargo build --release -p dprec-lab
# Usage: scripts/label_shapes.sh [--seeds "1 2"] [--shapes "small-store ..."] [--signals "1 0"] [--releases "1 5 52"] [--draws K]
set -euo pipefail
cd "$(dirname "$0")/.."
L=${DPREC_LAB_BIN:-target/release/dprec-lab}
seeds="1 2"
shapes="small-store heavy-raters ml100k-taste light-raters"
signals="1 0.5 0"
releases="1 5 52"
draws=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --seeds) seeds=$2; shift 2 ;;
        --shapes) shapes=$2; shift 2 ;;
        --signals) signals=$2; shift 2 ;;
        --releases) releases=$2; shift 2 ;;
        --draws) draws=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '%-14s %6s %8s %10s %10s %9s %9s\n' shape signal releases dp-topn dp-pop "ratio" "worst"
for shape in $shapes; do
    for signal in $signals; do
        for seed in $seeds; do
            d="$work/$shape-$signal-$seed"
            mkdir -p "$d"
            "$L" synth --preset "$shape" --seed "$seed" --labels "$signal" --out "$d/ratings.csv" > /dev/null
        done
        for r in $releases; do
            for seed in $seeds; do
                d="$work/$shape-$signal-$seed"
                for k in $(seq 0 $((draws - 1))); do
                    eval_seed=$seed
                    [ "$draws" -eq 1 ] || eval_seed=$((seed * 100 + k))
                    "$L" eval --data "$d/ratings.csv" --folds random --seed "$eval_seed" --quiet \
                        --releases-seen "$r" --trainer dp-topn:labels=on --trainer dp-popularity \
                        --out "$d/r$r-$k.json" > /dev/null
                done
            done
            python3 - "$shape" "$signal" "$r" $(for s in $seeds; do echo "$work/$shape-$signal-$s/r$r"; done) <<'PY'
import glob, json, sys
shape, signal, r, prefixes = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
tops, pops, ratios = [], [], []
for prefix in prefixes:
    a, b = [], []
    for f in sorted(glob.glob(prefix + "-*.json")):
        runs = json.load(open(f))["runs"]
        a += [fo["ranking"]["ndcg"] for fo in runs[0]["folds"]]
        b += [fo["ranking"]["ndcg"] for fo in runs[1]["folds"]]
    tops += a; pops += b
    ratios.append(sum(a) / sum(b))
m = lambda x: sum(x) / len(x)
print(f"{shape:<14} {signal:>6} {r:>8} {m(tops):>10.4f} {m(pops):>10.4f} {m(ratios):>8.3f}x {min(ratios):>8.3f}x")
PY
        done
    done
done
