#!/usr/bin/env bash
# The served top-N end to end against `dprec-lab eval` on MovieLens-100K u1 (crates/dprec-lab/
# notes/eval-08-selecting-split-default.md, "Served end to end"). Starts a scratch service (SQLite,
# real keys, every setting at its default: `dp-topn` with the selecting split), imports
# u1.base at the default eps_ij, then runs RELEASES admin retrains; after each one it scores
# the top-10 of every u1.test user with a relevant item (scripts/service_ndcg.py) and prints
# the selection's public record. Finally `dprec-lab eval --trainer dp-topn --releases-seen N`
# on u1 for the same numbers of releases (SEEDS seeds each), what eval says is served.
#
#   scripts/served_topn.sh [--bin PATH] [--releases N] [--eval-at "1 5 10"] [--seeds "1 2 3"]
#
# MovieLens-100K is read from $DPREC_ML100K_DIR (default ../shared/datasets/ml-100k).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin="$root/target/release/dprec"
data="${DPREC_ML100K_DIR:-$root/../shared/datasets/ml-100k}"
releases=10
eval_at="1 5 10"
seeds="1 2 3"
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --releases) releases=$2; shift 2 ;;
        --eval-at) eval_at=$2; shift 2 ;;
        --seeds) seeds=$2; shift 2 ;;
        *) echo "served_topn: unknown argument $1" >&2; exit 2 ;;
    esac
done
bin=$(realpath "$bin" 2>/dev/null || echo "$bin")
data=$(realpath "$data")
[ -x "$bin" ] || { echo "served_topn: no binary at $bin (cargo build --release, which builds dprec and dprec-lab; or --bin)" >&2; exit 2; }
[ -f "$data/u1.base" ] || { echo "served_topn: no MovieLens-100K u1 split at $data" >&2; exit 2; }

# shellcheck source=lib/service.sh
. "$root/scripts/lib/service.sh"
scratch_setup
export DATABASE_URL="sqlite://$scratch/dprec.sqlite" DPREC_SCHEDULER__ENABLED=false
start_service "$bin"
echo "\$ dprec serve  (scratch SQLite, defaults)"
echo "\$ dprec import --url \$B --api-key \$ADMIN $data/u1.base"
"$bin" import --url "$B" --api-key "$ADMIN" "$data/u1.base" 2>&1 | tail -1

for r in $(seq "$releases"); do
    retrain_and_wait >/dev/null
    record=$(curl -s "$B/v1/models/current" "${auth[@]}" | python3 -c 'import json, sys
m = json.load(sys.stdin)["release"]["mechanisms"][0]
s = m["params"].get("select") or {}
print("%s, select n %s grams %s decision %s" % (m["name"], s.get("n"), s.get("grams"), s.get("decision")))')
    echo "release $r: $record"
    python3 "$root/scripts/service_ndcg.py" "$B" "$ADMIN" "$data/u1.test"
done

for n in $eval_at; do
    for s in $seeds; do
        echo "\$ dprec-lab eval --max-folds 1 --trainer dp-topn --releases-seen $n --seed $s"
        "$(dirname "$bin")/dprec-lab" eval --data "$data" --max-folds 1 --trainer dp-topn --releases-seen "$n" \
            --seed "$s" 2>&1 | grep -E "^dp-topn.* u1 "
    done
done
