#!/usr/bin/env bash
# The served ranker (dp-topn at the service's calibration) beside dp-popularity at the
# same plan, NDCG@10 per data shape and seed, and the ratio to DP popularity (mean and
# minimum over the seeds). Release build first: nice -n 10 cargo build --release
# --bin dprec --example topn_bench. Usage: scripts/topn_suite.sh [--large]
# (--large adds the ML-20M-size taste preset, one seed, ~3000 ranked users).
set -euo pipefail
cd "$(dirname "$0")/.."
B=target/release/dprec
T=target/release/examples/topn_bench
ML=${DPREC_ML100K_DIR:-../shared/datasets/ml-100k}
NF=1.2053384194761587 # the service's filter factor for its default plan
ndcg_eval() { nice -n 10 $B eval --data "$ML" --trainer "$1" --seed "$2" --quiet 2>&1 | tail -1 | awk '{print $(NF-7)}'; }
bench() { nice -n 10 $T --preset "$1" --quality --seed "$2" --param noise_factor=$NF --rank-users 3000 2>&1 | grep -o 'NDCG@10 [0-9.]*' | awk '{print $2}' | tr '\n' ' '; }
row() { # shape, then "topn pop" pairs
  python3 -c '
import sys
shape = sys.argv[1]; v = [float(x) for x in sys.argv[2:]]
t, p = v[0::2], v[1::2]; r = [a / b for a, b in zip(t, p)]
print(f"| {shape} | {sum(t)/len(t):.4f} | {sum(p)/len(p):.4f} | {sum(r)/len(r):.2f}x | {min(r):.2f}x |")' "$@"
}
echo "| shape | dp-topn NDCG@10 (mean) | DP popularity (mean) | ratio (mean) | ratio (min) |"
echo "| --- | --- | --- | --- | --- |"
v=()
for s in 1 2 3; do
  v+=("$(ndcg_eval dp-topn:noise_factor=$NF,eps_r=1.2 $s)" "$(ndcg_eval dp-popularity:releases=52,eps=10,eps_r=1.2 $s)")
done
row "ML-100K u1..u5 (mean of folds), seeds 1-3" "${v[@]}"
shapes=(ml100k ml100k-taste heavy-raters)
[[ "${1:-}" == --large ]] && shapes+=(ml20m-taste)
for shape in "${shapes[@]}"; do
  v=()
  seeds=(42 1 7)
  [[ $shape == ml20m-taste ]] && seeds=(1)
  for s in "${seeds[@]}"; do
    # shellcheck disable=SC2207
    v+=($(bench "$shape" "$s"))
  done
  row "$shape, seeds ${seeds[*]}" "${v[@]}"
done
