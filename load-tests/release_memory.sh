#!/usr/bin/env bash
# One release of the served default at scale, end to end in the service (issue 22 item 2):
# snapshot read, training set, fit, charges, commit. Prints the release's wall time (the
# job's own start and finish) and the serve process's peak RSS (VmHWM) before and after it.
#
#   load-tests/release_memory.sh prepare --bin PATH --store DIR [--pg DB] [--preset ml20m] [--ratings N]
#   load-tests/release_memory.sh release --bin PATH --store DIR [--pg DB] [--releases N] [--env K=V]...
#                                        [--between CSV]
#
# prepare  generates `dprec-lab synth --preset P` (all its ratings, or N) and imports it through
#          the API into a fresh store: SQLite DIR/dprec.sqlite, or with --pg the PostgreSQL
#          database DB at 127.0.0.1:5432 (dropped and created); the admin key is kept in
#          DIR/admin.key (SQLite: 20-24 min for 20M here with builds running);
# release  copies the store to a scratch one (SQLite: a file copy; PostgreSQL: CREATE
#          DATABASE ... TEMPLATE DB), so two binaries can be compared on the same data,
#          starts `dprec serve` on it, runs one admin release and reports. The peak RSS is
#          the service's; PostgreSQL's own processes are not counted. With --releases N
#          the service is restarted for each of N releases on the same scratch store, so each
#          release's peak RSS is its own (e.g. the ticks of a continual series with
#          --env DPREC_RELEASE__MODE=continual). DPREC_* variables of the caller's
#          environment are not passed on; --env sets one for the service. --between CSV
#          imports CSV through the API before each release after the first (not timed in
#          the release), e.g. a week of new ratings between two ticks.
# Compare two builds in one run: `release --bin A` then `release --bin B` on the same DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cmd=${1:-}
shift || true
bin="$root/target/release/dprec"
store=""
preset=ml20m
ratings=""
pg=""
releases=1
service_env=()
between=""
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$(realpath "$2"); shift 2 ;;
        --store) store=$2; shift 2 ;;
        --preset) preset=$2; shift 2 ;;
        --ratings) ratings=$2; shift 2 ;;
        --pg) pg=$2; shift 2 ;;
        --releases) releases=$2; shift 2 ;;
        --env) service_env+=("$2"); shift 2 ;;
        --between) between=$(realpath "$2"); shift 2 ;;
        *) echo "release_memory: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -x "$bin" ] || { echo "release_memory: no binary at $bin" >&2; exit 2; }
[ -n "$store" ] || { echo "release_memory: --store DIR is required" >&2; exit 2; }
mkdir -p "$store"
store=$(realpath "$store")
# shellcheck source=../scripts/lib/service.sh
. "$root/scripts/lib/service.sh"
scratch_setup
for kv in "${service_env[@]}"; do export "${kv?}"; done
export DPREC_SCHEDULER__ENABLED=false
# The ML-20M presets rate in half stars from 0.5.
export DPREC_RATINGS__MIN=0.5

pg_url() { echo "postgres://postgres@127.0.0.1:5432/$1"; }
psql_admin() { psql -q -h 127.0.0.1 -U postgres -d postgres -c "$1" >/dev/null; }
scratch_db=""
drop_scratch_db() {
    [ -n "$scratch_db" ] && psql_admin "DROP DATABASE IF EXISTS $scratch_db WITH (FORCE)" || true
}

# Starts the service on the database URL $1; sets $server, $B and $admin.
start() {
    DATABASE_URL="$1" "$bin" serve --bind 127.0.0.1:0 2>"$scratch/serve.log" &
    server=$!
    local port
    port=$(wait_for_port "$scratch/serve.log")
    [ -n "$port" ] || { echo "release_memory: the service did not start" >&2; cat "$scratch/serve.log" >&2; exit 1; }
    B="http://127.0.0.1:$port"
    # The admin key is printed when a store is created; prepare keeps it beside the store.
    admin=$(grep -Eo 'dprec_[0-9a-f]{64}' "$scratch/serve.log" | head -1 || true)
    if [ -n "$admin" ]; then echo "$admin" >"$store/admin.key"; else admin=$(cat "$store/admin.key"); fi
}

hwm() { grep VmHWM "/proc/$server/status" | awk '{print $2}'; }

case "$cmd" in
    prepare)
        csv="$scratch/synth.csv"
        "$(dirname "$bin")/dprec-lab" synth --preset "$preset" ${ratings:+--ratings "$ratings"} --out "$csv"
        if [ -n "$pg" ]; then
            psql_admin "DROP DATABASE IF EXISTS $pg WITH (FORCE)"
            psql_admin "CREATE DATABASE $pg"
            start "$(pg_url "$pg")"
        else
            rm -f "$store/dprec.sqlite"*
            start "sqlite://$store/dprec.sqlite"
        fi
        t0=$(date +%s.%N)
        "$bin" import --url "$B" --api-key "$admin" "$csv"
        t1=$(date +%s.%N)
        echo "prepare: $(($(wc -l <"$csv") - 1)) ratings imported in $(echo "$t1 - $t0" | bc) s"
        ;;
    release)
        [ -f "$store/admin.key" ] || { echo "release_memory: run prepare first" >&2; exit 2; }
        if [ -n "$pg" ]; then
            scratch_db="${pg}_scratch_$$"
            trap 'drop_scratch_db; scratch_cleanup' EXIT
            psql_admin "CREATE DATABASE $scratch_db TEMPLATE $pg"
            url=$(pg_url "$scratch_db")
        else
            # With its write-ahead log: what was committed last may be only there.
            for f in "$store"/dprec.sqlite*; do cp "$f" "$scratch/"; done
            url="sqlite://$scratch/dprec.sqlite"
        fi
        echo "binary:   $bin"
        for k in $(seq 1 "$releases"); do
            start "$url"
            if [ "$k" -gt 1 ] && [ -n "$between" ]; then
                "$bin" import --url "$B" --api-key "$admin" "$between" 2>&1 | grep -E '^imported' | sed 's/^/between:  /'
            fi
            before=$(hwm)
            t0=$(date +%s.%N)
            answer=$(curl -s -X POST "$B/v1/admin/retrain" -H "Authorization: Bearer $admin")
            job=$(echo "$answer" | grep -Eo '"id":[0-9]+' | head -1 | cut -d: -f2 || true)
            [ -n "$job" ] || { echo "release_memory: retrain refused: $answer" >&2; exit 1; }
            while curl -s "$B/v1/admin/jobs/$job" -H "Authorization: Bearer $admin" | grep -q '"status":"running"'; do
                sleep 0.5
            done
            t1=$(date +%s.%N)
            status=$(curl -s "$B/v1/admin/jobs/$job" -H "Authorization: Bearer $admin")
            echo "$status" | grep -q '"status":"succeeded"' || { echo "release_memory: the release failed: $status" >&2; exit 1; }
            echo "release $k: $(echo "$t1 - $t0" | bc) s wall (request to finished job, polled every 0.5 s)"
            echo "peak RSS: $before kB after start-up, $(hwm) kB after the release (VmHWM)"
            # The commit logs its ledger transactions (count, total and longest time).
            grep -Eo 'release [0-9]+: [0-9]+ rating and [0-9]+ user charges committed.*' "$scratch/serve.log" | sed 's/^/ledger:   /' || true
            grep -Eo 'release stages: .*' "$scratch/serve.log" | sed 's/^release stages: /stages:   /' || true
            grep -Eo 'tick stages: .*' "$scratch/serve.log" | sed 's/^tick stages: /stages:   /' || true
            kill "$server"
            wait "$server" 2>/dev/null || true
        done
        ;;
    *) echo "usage: release_memory.sh prepare|release --bin PATH --store DIR" >&2; exit 2 ;;
esac
