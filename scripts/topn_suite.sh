#!/usr/bin/env bash
# The served ranker (dp-topn at the service's calibration) beside dp-popularity at the
# same plan, over every data shape of the suite: NDCG@10 per shape (mean over seeds), the
# ratio to DP popularity (mean and minimum over the seeds), DP popularity of the liked
# ratings (`dp-popularity:liked=top`, the count rows dp-topn weighs), the non-private
# popularity and EASE (where affordable) for reference, and what the releases spent the
# rest of their budget on (Gram or counts; docs/privacy/dp-topn.md, "2a. Adaptive split").
# Release build first: nice -n 10 cargo build --release && nice -n 10 cargo build --release -p dprec-lab --example topn_bench
# Usage: scripts/topn_suite.sh [--large] [--releases-seen N] [--noise-draws R] [--param key=value ...]
#   --large    adds the ML-20M-size taste preset (138k users, 20M ratings; three seeds)
#   --releases-seen N   every DP trainer as served after N releases of an unchanged store
#              (counts combined across releases; default 1: a first release)
#   --noise-draws R   on the presets, each seed's figures are the means over R draws of the
#              trainers' noise on the same data and split (noise seeds S, S+1000, ...; 1 by
#              default: the noise seed is the data seed), and a column counts the single
#              draws whose ratio is below 1.0x (ML-100K's seeds are noise seeds already)
#   --param    passed to dp-topn on every shape (e.g. --param split=gram); the plan's
#              parameters (eps, delta, releases, eps_r, noise_factor) to dp-popularity too
set -euo pipefail
cd "$(dirname "$0")/.."
B=${DPREC_BIN:-target/release/dprec}
T=${DPREC_TOPN_BENCH:-target/release/examples/topn_bench}
ML=${DPREC_ML100K_DIR:-../shared/datasets/ml-100k}
# dp-topn and dp-popularity default to the service's calibration (plan, filter, eps_r 1.2);
# on the presets every rating takes full part (eps_r=none), as in the figures so far.
large=0
seen=1
draws=1
params=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --large) large=1; shift ;;
    --releases-seen) seen=$2; shift 2 ;;
    --noise-draws) draws=$2; shift 2 ;;
    --param) params+=("$2"); shift 2 ;;
    *) echo "unknown argument $1 (--large, --releases-seen N, --noise-draws R, --param key=value)" >&2; exit 2 ;;
  esac
done
extra=""
for p in "${params[@]}"; do extra+=",$p"; done
topn="dp-topn${extra:+:${extra#,}}"
# dp-popularity at dp-topn's plan: the plan's parameters go to both (as in topn_bench).
pop_extra=""
for p in "${params[@]}"; do
  case $p in eps=* | delta=* | releases=* | eps_r=* | noise_factor=*) pop_extra+=",$p" ;; esac
done
pop="dp-popularity${pop_extra:+:${pop_extra#,}}"
liked_pop="dp-popularity:liked=top${pop_extra}"
bench_params=()
for p in "${params[@]}"; do bench_params+=(--param "$p"); done
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# dprec-lab eval prints the fold mean last; its NDCG@10 column.
ndcg_eval() { nice -n 15 "$(dirname "$B")/dprec-lab" eval --data "$ML" --trainer "$1" --seed "$2" --releases-seen "$seen" --quiet 2>&1 | tail -1 | awk '{print $(NF-7)}'; }
row() { # shape, branches, liked DP popularity, popularity, ease, below, then "topn pop" pairs
  python3 -c '
import sys
shape, branches, liked, npop, ease, below = sys.argv[1:7]
mean = lambda xs: f"{sum(map(float, xs)) / len(xs):.4f}" if xs else "-"
liked, npop, ease = mean(liked.split()), mean(npop.split()), mean(ease.split())
v = [float(x) for x in sys.argv[7:]]
t, p = v[0::2], v[1::2]; r = [a / b for a, b in zip(t, p) if b > 0]
extra = f" {below} |" if below else ""
rm, rmin = (f"{sum(r)/len(r):.2f}x", f"{min(r):.2f}x") if len(r) == len(t) else ("-", "-")  # a DP popularity of 0
print(f"| {shape} | {sum(t)/len(t):.4f} | {sum(p)/len(p):.4f} | {rm} | {rmin} | {liked} | {npop} | {ease} | {branches} |{extra}")' "$@"
}
# The means over a seed's noise draws ("topn pop" pairs in, one pair out).
seed_means() { python3 -c '
import sys
v = [float(x) for x in sys.argv[1:]]
print(f"{sum(v[0::2]) / len(v[0::2])} {sum(v[1::2]) / len(v[1::2])}")' "$@"; }
head="| shape | dp-topn NDCG@10 (mean) | DP popularity (mean) | ratio (mean) | ratio (min) | DP popularity, liked counts | popularity (non-private) | EASE (non-private) | rest spent on |"
rule="| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
if [[ $draws -gt 1 ]]; then
  head+=" single draws below 1.0x |"
  rule+=" --- |"
fi
echo "$head"
echo "$rule"
v=()
branches=""
liked=""
for s in 1 2 3; do
  v+=("$(ndcg_eval "$topn" $s)" "$(ndcg_eval "$pop" $s)")
  liked+="$(ndcg_eval "$liked_pop" $s) "
done
below=""
[[ $draws -gt 1 ]] && below="-"
row "ML-100K u1..u5 (mean of folds), seeds 1-3" "-" "$liked" "$(ndcg_eval popularity 1)" "$(ndcg_eval ease 1)" "$below" "${v[@]}"
shapes=(ml100k ml100k-taste heavy-raters light-raters wide-catalogue small-store dense-raters ml1m-taste)
[[ $large == 1 ]] && shapes+=(ml20m-taste)
for shape in "${shapes[@]}"; do
  v=()
  branches=""
  npop="" ease="" liked=""
  below=0
  for s in 42 1 7; do
    pairs=()
    for ((i = 0; i < draws; i++)); do
      nice -n 15 $T --preset "$shape" --quality --seed "$s" --noise-seed $((s + 1000 * i)) \
        --param eps_r=none "${bench_params[@]}" --rank-users 3000 --releases-seen "$seen" \
        >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
      get() { grep -E "^$1 " "$log" | grep -o 'NDCG@10 [0-9.]*' | awk '{print $2}'; }
      t=$(get dp-topn) p=$(get dp-popularity)
      pairs+=("$t" "$p")
      below=$((below + $(awk -v t="$t" -v p="$p" 'BEGIN {print (t < p) ? 1 : 0}')))
      liked+="$(get dp-pop-liked) "
      if [[ $i == 0 ]]; then
        npop+="$(get popularity) "
        ease+="$(get ease || true) "
        b=$(grep -o '^dp-topn: spent on [a-z-]*' "$log" | awk '{print $4}' || true)
        branches+="${b:-gram} "
      fi
    done
    read -r tm pm <<<"$(seed_means "${pairs[@]}")"
    v+=("$tm" "$pm")
  done
  n_below=""
  [[ $draws -gt 1 ]] && n_below="$below of $((3 * draws))"
  row "$shape, seeds 42 1 7" "${branches% }" "$liked" "$npop" "$ease" "$n_below" "${v[@]}"
done
