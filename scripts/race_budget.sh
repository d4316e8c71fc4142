#!/usr/bin/env bash
# A user lowering their budget while a release is in flight (docs/LEDGER.md, "Releases
# in flight"): MovieLens-100K is imported into a scratch SQLite service and released
# once; then, for each of three users, a release is started and 0.15 s later the user's
# budget_eps is lowered to what the user has spent + 0.01 (a lowering the release in
# flight cannot be charged within: refused with 409). Prints each answer and job outcome,
# the number of published releases, and how many releases a few users' audits count
# (each must equal the published number).
#
#   scripts/race_budget.sh [--bin PATH] [--data DIR] [--port N]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/dprec
data=../shared/datasets/ml-100k
port=18099
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --data) data=$2; shift 2 ;;
        --port) port=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -x "$bin" ] || cargo build --release
scratch=$(mktemp -d)
trap 'kill "$server" 2>/dev/null || true; rm -rf "$scratch"' EXIT
DATABASE_URL="sqlite://$scratch/race.sqlite" "$bin" serve --bind "127.0.0.1:$port" \
    2>"$scratch/serve.log" &
server=$!
until grep -sqE 'dprec_[0-9a-f]{64}' "$scratch/serve.log"; do
    kill -0 "$server" 2>/dev/null || { cat "$scratch/serve.log"; exit 1; }
    sleep 0.5
done
admin=$(grep -Eo 'dprec_[0-9a-f]{64}' "$scratch/serve.log" | head -1)
b=http://127.0.0.1:$port
auth=(-H "Authorization: Bearer $admin")
json() { python3 -c "import sys, json; print(json.load(sys.stdin)$1)"; }
"$bin" import --url "$b" --api-key "$admin" "$data" >/dev/null 2>&1
start() { curl -s -X POST "$b/v1/admin/retrain" "${auth[@]}" | json '["id"]'; }
finish() {
    while :; do
        s=$(curl -s "$b/v1/admin/jobs/$1" "${auth[@]}" | json '["status"]')
        [ "$s" = running ] || { echo "$s"; return; }
        sleep 0.2
    done
}
echo "release 1: $(finish "$(start)")"
for u in 3 4 5; do
    spent=$(curl -s "$b/v1/users/$u/budget?limit=1" "${auth[@]}" | json '["spent"]["eps"]')
    low=$(python3 -c "print($spent + 0.01)")
    job=$(start)
    sleep 0.15
    status=$(curl -s -o "$scratch/put.json" -w '%{http_code}' -X PUT "$b/v1/users/$u/settings" \
        "${auth[@]}" -H 'Content-Type: application/json' -d "{\"budget_eps\": $low}")
    echo "user $u: budget_eps $low -> HTTP $status; release: $(finish "$job")"
done
published=$(curl -s "$b/v1/models?limit=100" "${auth[@]}" | json '["releases"].__len__()')
echo "published releases: $published"
for u in 1 3 10 100 943; do
    n=$(curl -s "$b/v1/users/$u/budget?limit=1" "${auth[@]}" | json '["releases"]["total"]')
    echo "user $u: audit counts $n releases"
done
