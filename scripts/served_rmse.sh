#!/usr/bin/env bash
# A rating predictor served end to end against `dprec-lab eval` on MovieLens-100K u1
# (issue 21; crates/dprec-lab/notes/eval-02-rating-predictors.md, "The joint-DP rating predictor" and "The papers'
# trainers served in the rating-level mode"). Starts a scratch service (SQLite, real keys,
# every setting at its default) with DPREC_TRAINER__NAME=TRAINER (and, for the rating-level
# trainers pdp-pmf and dp-pmf, DPREC_TRAINER__ALLOW_RATING_LEVEL=true), imports u1.base,
# then runs RELEASES admin retrains; after each one it predicts every u1.test rating
# through GET /v1/users/{user}/predictions (scripts/service_rmse.py) and checks that every
# answer carries the trainer's guarantee (rating-level, or proven for dp-alt). Finally it
# runs `dprec-lab eval` on u1 with the trainer's
# defaults and, for pdp-pmf, with the per-rating budget the service gives every rating at
# the default settings (eps_ij 12 x share 0.1, less the popularity eps 0.05 = 1.15: above
# t = 0.4, so RSM keeps every rating), the served setting.
#
# With --prefs paper (pdp-pmf), u1.base is loaded with one eps_ij per rating drawn from the
# paper's preference generator (scripts/import_paper_preferences.py), so the service's
# per-rating budgets follow the preferences `dprec-lab eval --trainer pdp-pmf` draws by default.
#
#   scripts/served_rmse.sh [--bin PATH] [--trainer pdp-pmf|dp-pmf|dp-alt] [--releases N]
#                          [--passes N]   (N more timed passes with the solves cached)
#                                [--prefs default|paper]
#
# MovieLens-100K is read from $DPREC_ML100K_DIR (default ../shared/datasets/ml-100k).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin="$root/target/debug/dprec"
data="${DPREC_ML100K_DIR:-$root/../shared/datasets/ml-100k}"
trainer=pdp-pmf
releases=3
prefs=default
passes=0
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --trainer) trainer=$2; shift 2 ;;
        --releases) releases=$2; shift 2 ;;
        --prefs) prefs=$2; shift 2 ;;
        --passes) passes=$2; shift 2 ;;
        *) echo "served_rmse: unknown argument $1" >&2; exit 2 ;;
    esac
done
bin=$(realpath "$bin" 2>/dev/null || echo "$bin")
data=$(realpath "$data")
[ -x "$bin" ] || { echo "served_rmse: no binary at $bin (cargo build, which builds dprec and dprec-lab; or --bin)" >&2; exit 2; }
[ -f "$data/u1.base" ] || { echo "served_rmse: no MovieLens-100K u1 split at $data" >&2; exit 2; }
fail() { echo "served_rmse: FAILED: $*" >&2; exit 1; }

# shellcheck source=lib/service.sh
. "$root/scripts/lib/service.sh"
scratch_setup
export DATABASE_URL="sqlite://$scratch/dprec.sqlite" DPREC_TRAINER__NAME="$trainer"
export DPREC_SCHEDULER__ENABLED=false
case "$trainer" in
    pdp-pmf|dp-pmf) export DPREC_TRAINER__ALLOW_RATING_LEVEL=true; guarantee=rating-level ;;
    dp-alt) guarantee=proven ;;
    *) fail "--trainer is pdp-pmf, dp-pmf or dp-alt, got $trainer" ;;
esac
start_service "$bin"

echo "\$ DPREC_TRAINER__NAME=$trainer${DPREC_TRAINER__ALLOW_RATING_LEVEL:+ DPREC_TRAINER__ALLOW_RATING_LEVEL=true} dprec serve  (scratch SQLite, defaults)"
case "$prefs" in
    default)
        echo "\$ dprec import --url \$B --api-key \$ADMIN $data/u1.base"
        "$bin" import --url "$B" --api-key "$ADMIN" "$data/u1.base" 2>&1 | tail -1 ;;
    paper)
        echo "\$ scripts/import_paper_preferences.py \$B \$ADMIN $data/u1.base"
        python3 "$root/scripts/import_paper_preferences.py" "$B" "$ADMIN" "$data/u1.base" ;;
    *) fail "--prefs is default or paper, got $prefs" ;;
esac

for r in $(seq "$releases"); do
    job=$(retrain_and_wait)
    current=$(curl -s "$B/v1/models/current" "${auth[@]}")
    echo "$current" | grep -q "\"guarantee\":\"$guarantee\"" || fail "current model not labelled: $current"
    echo "release $r (job $job): $(echo "$current" | grep -Eo '"guarantee":"[a-z-]+"' | head -1)"
    echo "\$ scripts/service_rmse.py \$B \$ADMIN $data/u1.test --passes $passes"
    python3 "$root/scripts/service_rmse.py" "$B" "$ADMIN" "$data/u1.test" --passes "$passes"
    one=$(curl -s "$B/v1/users/1/predictions?items=1,2" "${auth[@]}")
    echo "$one" | grep -q "\"guarantee\":\"$guarantee\"" || fail "predictions not labelled: $one"
done

if [ "$guarantee" = rating-level ]; then
    echo "\$ curl -s \$B/v1/users/1/budget?limit=1 | (rating_level: bound shown, not enforced)"
    curl -s "$B/v1/users/1/budget?limit=1" "${auth[@]}" \
        | python3 -c 'import json, sys
a = json.load(sys.stdin)
b, r = a["rating_level"], a["ratings"]["entries"][0]
print("user 1: %d ratings, first rating spent %.4f of eps_ij %g; rating-level bound eps %.3f over %d releases (enforced: %s); user-level releases %d"
      % (a["ratings"]["total"], r["spent"], r["eps"], b["eps"], len(b["releases"]), b["enforced"], a["releases"]["total"]))'
fi

if [ "$trainer" = pdp-pmf ] && [ "$prefs" = default ]; then
    served="--trainer pdp-pmf:eps=$(awk 'BEGIN { printf "%.6g", 12 * 0.1 - 0.05 }'),threshold=0.4"
else
    # dp-pmf offers every rating at its uniform eps 0.1 in eval and in the service; with
    # the paper's preferences the service's budgets are eval's default preferences.
    served=""
fi
echo "\$ dprec-lab eval --max-folds 1 --trainer $trainer $served"
# shellcheck disable=SC2086
"$(dirname "$bin")/dprec-lab" eval --data "$data" --max-folds 1 --trainer "$trainer" $served 2>&1 | grep -E "^$trainer.* u1 "
