#!/usr/bin/env bash
# One release of the served default at scale, end to end in the service (issue 22 item 2):
# snapshot read, training set, fit, charges, commit. Prints the release's wall time (the
# job's own start and finish) and the serve process's peak RSS (VmHWM) before and after it.
#
#   load-tests/release_memory.sh prepare --bin PATH --store DIR [--preset ml20m] [--ratings N]
#   load-tests/release_memory.sh release --bin PATH --store DIR
#
# prepare  generates `dprec synth --preset P` (all its ratings, or N) and imports it through
#          the API into a fresh SQLite store in DIR (DIR/dprec.sqlite, its admin key in
#          DIR/admin.key; 20 min for 20M here with two builds running);
# release  copies DIR/dprec.sqlite to a scratch file (so two binaries can be compared on the
#          same store), starts `dprec serve` on it, runs one admin release and reports.
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
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$(realpath "$2"); shift 2 ;;
        --store) store=$2; shift 2 ;;
        --preset) preset=$2; shift 2 ;;
        --ratings) ratings=$2; shift 2 ;;
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
export DPREC_SCHEDULER__ENABLED=false
# The ML-20M presets rate in half stars from 0.5.
export DPREC_RATINGS__MIN=0.5

# Starts the service on the SQLite file $1; sets $server, $B and $admin.
start() {
    DATABASE_URL="sqlite://$1" "$bin" serve --bind 127.0.0.1:0 2>"$scratch/serve.log" &
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
        rm -f "$store/dprec.sqlite"*
        csv="$scratch/synth.csv"
        "$bin" synth --preset "$preset" ${ratings:+--ratings "$ratings"} --out "$csv"
        start "$store/dprec.sqlite"
        t0=$(date +%s.%N)
        "$bin" import --url "$B" --api-key "$admin" "$csv"
        t1=$(date +%s.%N)
        echo "prepare: $(($(wc -l <"$csv") - 1)) ratings imported in $(echo "$t1 - $t0" | bc) s"
        ;;
    release)
        [ -f "$store/dprec.sqlite" ] || { echo "release_memory: run prepare first" >&2; exit 2; }
        # With its write-ahead log: what was committed last may be only there.
        for f in "$store"/dprec.sqlite*; do cp "$f" "$scratch/"; done
        start "$scratch/dprec.sqlite"
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
        echo "binary:   $bin"
        echo "release:  $(echo "$t1 - $t0" | bc) s wall (request to finished job, polled every 0.5 s)"
        echo "peak RSS: $before kB after start-up, $(hwm) kB after the release (VmHWM)"
        ;;
    *) echo "usage: release_memory.sh prepare|release --bin PATH --store DIR" >&2; exit 2 ;;
esac
