#!/usr/bin/env bash
# Issue 23's end-to-end replay (crates/dprec-lab/notes/eval-04-continual-release.md, "Continual release served"): a scratch
# service (SQLite, real keys, defaults otherwise) with DPREC_RELEASE__MODE=MODE and
# DPREC_BUDGET__PLANNED_RELEASES=PERIODS, MovieLens-100K u.data replayed by time, one
# release per period, next-period NDCG@10 of the served lists (scripts/continual_replay.py).
#
#   scripts/continual_replay.sh [--bin PATH] [--mode continual|independent]
#                               [--periods N] [--trainer NAME] [--csv FILE]
#                               [--config FILE]   (a TOML settings file for the service,
#                                                  e.g. trainer parameters)
#
# MovieLens-100K is read from $DPREC_ML100K_DIR (default ../shared/datasets/ml-100k).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin="$root/target/debug/dprec"
data="${DPREC_ML100K_DIR:-$root/../shared/datasets/ml-100k}"
mode=continual
periods=52
trainer=dp-topn
csv=""
config=()
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --mode) mode=$2; shift 2 ;;
        --periods) periods=$2; shift 2 ;;
        --trainer) trainer=$2; shift 2 ;;
        --csv) csv=$(realpath "$2"); shift 2 ;;
        --config) config=(--config "$(realpath "$2")"); shift 2 ;;
        *) echo "continual_replay: unknown argument $1" >&2; exit 2 ;;
    esac
done
bin=$(realpath "$bin")
data=$(realpath "$data")
[ -x "$bin" ] || { echo "continual_replay: no binary at $bin" >&2; exit 2; }
[ -f "$data/u.data" ] || { echo "continual_replay: no MovieLens-100K u.data at $data" >&2; exit 2; }

# shellcheck source=lib/service.sh
. "$root/scripts/lib/service.sh"
scratch_setup
export DATABASE_URL="sqlite://$scratch/dprec.sqlite" DPREC_SCHEDULER__ENABLED=false
export DPREC_RELEASE__MODE="$mode" DPREC_BUDGET__PLANNED_RELEASES="$periods"
export DPREC_TRAINER__NAME="$trainer"
start_service "$bin" "${config[@]}"
echo "\$ DPREC_RELEASE__MODE=$mode DPREC_BUDGET__PLANNED_RELEASES=$periods DPREC_TRAINER__NAME=$trainer dprec serve ${config[*]}"
python3 "$root/scripts/continual_replay.py" "$B" "$ADMIN" "$data/u.data" "$periods" ${csv:+--csv "$csv"}
