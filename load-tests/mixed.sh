#!/usr/bin/env bash
# Mixed load on `dprec serve`: readers, writers, a health probe and back-to-back admin
# releases at the same time (loopback only, bounded in time and in request count).
#
#   load-tests/mixed.sh [--backend sqlite|postgres] [--duration S] [--data ml100k|synth1m]
#                       [--readers N] [--writers N] [--raters N] [--batch N] [--no-releases]
#                       [--read-rate R] [--write-rate B] [--bin PATH]
#
# 1. builds the release binary and the `load_mixed` client (examples/load_mixed.rs);
#    --bin PATH serves with another build of `dprec` instead (e.g. a copy of main's, to
#    compare two builds with the same client);
# 2. starts the service on 127.0.0.1 with a fresh store (SQLite file in a temp dir, or a
#    fresh PostgreSQL database that is dropped at the end), scheduler off;
# 3. imports the data through the API (`dprec import`): MovieLens-100K, or 1M synthetic
#    ratings from `dprec-lab synth --ratings 1000000`), and trains the first release;
# 4. runs the client for --duration seconds (default 60): 28 readers (top-N of random
#    existing users), 4 writers (batches of 100 ratings of existing users and items),
#    /healthz every 100 ms, and admin releases back to back (trigger, wait, trigger);
#    --raters N adds clients that rate one item and at once ask for their own top-N (the
#    answer right after a rating); --no-releases leaves the releases out; --read-rate R
#    paces the readers at R requests/s in all (open loop, latency from the scheduled
#    send time) instead of the closed loop that saturates the CPU; --write-rate B paces
#    the writers at B batches/s in all;
# 5. prints per endpoint: requests by status and p50 / p99 / max latency; exits 1 if any
#    response was a 5xx or a request got no answer (timeout / connection error).
#
# Diagnostics: LOAD_TIMELINE=FILE makes the client write per-second p50/p99/max per
# endpoint; MIXED_KEEP_LOG=FILE keeps the server log (release stages, commit phases).
#
# How to read its output: docs/BENCHMARKS.md ("Mixed load").
set -euo pipefail
cd "$(dirname "$0")/.."
BACKEND=sqlite
DURATION=60
DATA=ml100k
READERS=28
WRITERS=4
RATERS=0
RELEASES=""
BATCH=100
READ_RATE=()
WRITE_RATE=()
SERVE_BIN=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --backend) BACKEND="$2"; shift 2 ;;
        --duration) DURATION="$2"; shift 2 ;;
        --data) DATA="$2"; shift 2 ;;
        --readers) READERS="$2"; shift 2 ;;
        --writers) WRITERS="$2"; shift 2 ;;
        --raters) RATERS="$2"; shift 2 ;;
        --no-releases) RELEASES="--no-releases"; shift ;;
        --batch) BATCH="$2"; shift 2 ;;
        --read-rate) READ_RATE=(--read-rate "$2"); shift 2 ;;
        --write-rate) WRITE_RATE=(--write-rate "$2"); shift 2 ;;
        --bin) SERVE_BIN=$(realpath "$2"); shift 2 ;;
        *) echo "usage: $0 [--backend sqlite|postgres] [--duration S] [--data ml100k|synth1m] [--readers N] [--writers N] [--raters N] [--batch N] [--no-releases] [--read-rate R] [--write-rate B] [--bin PATH]" >&2; exit 2 ;;
    esac
done
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release --quiet --bin dprec --bin dprec-lab --example load_mixed
BIN=${SERVE_BIN:-$TARGET/release/dprec}
CLIENT=$TARGET/release/examples/load_mixed
WORK=$(mktemp -d)
PORT=$((20000 + RANDOM % 20000))
BASE=http://127.0.0.1:$PORT
ADMIN=load-admin-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
# shellcheck source=lib.sh
. load-tests/lib.sh
# MIXED_KEEP_LOG=FILE keeps the server log (with RUST_LOG=info: release stages and
# commit phases); LOAD_TIMELINE=FILE makes the client write per-second latencies.
trap 'svc_stop; if [[ -n "${MIXED_KEEP_LOG:-}" ]]; then cp "$WORK/serve.log" "$MIXED_KEEP_LOG"; fi; rm -rf "$WORK"' EXIT

case "$DATA" in
    ml100k)
        DATADIR=${DPREC_ML100K_DIR:-../shared/datasets/ml-100k}
        USERS=943; ITEMS=1682 ;;
    synth1m)
        # 1M ratings written as user,item,rating CSV by the synthetic generator.
        "$TARGET/release/dprec-lab" synth --preset ml100k --ratings 1000000 --seed 42 --out "$WORK/synth.csv" >&2
        DATADIR=$WORK/synth.csv
        USERS=$(cut -d, -f1 "$WORK/synth.csv" | sort -un | tail -1)
        ITEMS=$(cut -d, -f2 "$WORK/synth.csv" | sort -un | tail -1) ;;
    *) echo "--data ml100k|synth1m" >&2; exit 2 ;;
esac

RUST_LOG=${RUST_LOG:-warn} svc_start "$BACKEND" dprec_mixed

echo "== $BACKEND: import $DATA through the API" >&2
"$BIN" import --url "$BASE" --api-key "$ADMIN" --eps 1.0 "$DATADIR" 2>&1 | tail -1 >&2
echo "== $BACKEND: first release" >&2
JOB=$(curl -sf -X POST "$BASE/v1/admin/retrain" -H "Authorization: Bearer $ADMIN" | sed -E 's/.*"id":([0-9]+).*/\1/')
T0=$(date +%s)
for _ in $(seq 1 3000); do
    STATUS=$(curl -sf "$BASE/v1/admin/jobs/$JOB" -H "Authorization: Bearer $ADMIN")
    case "$STATUS" in *'"status":"succeeded"'*) break ;; *'"status":"failed"'*|*'"status":"skipped"'*) echo "$STATUS" >&2; exit 1 ;; esac
    sleep 0.2
done
echo "first release: $(( $(date +%s) - T0 )) s" >&2

echo "== $BACKEND / $DATA: mixed load for ${DURATION}s ($READERS readers, $WRITERS writers x $BATCH ratings, $RATERS raters, releases $([[ -n "$RELEASES" ]] && echo off || echo "back to back"))" >&2
"$CLIENT" --base "$BASE" --key "$ADMIN" --duration "$DURATION" --readers "$READERS" \
    --writers "$WRITERS" --raters "$RATERS" --batch "$BATCH" --users "$USERS" --items "$ITEMS" $RELEASES "${READ_RATE[@]}" "${WRITE_RATE[@]}" | tee "$WORK/out.txt"
if grep -q "database is locked\|panicked" "$WORK/serve.log"; then
    echo "server log:" >&2; grep -m5 "database is locked\|panicked" "$WORK/serve.log" >&2
fi
TOTALS=$(grep '^totals:' "$WORK/out.txt")
BAD=$(grep -cE ' (5[0-9][0-9]|timeout|connect|io):' "$WORK/out.txt" || true)
if [[ "$TOTALS" != *"5xx=0"* || "$BAD" != 0 ]]; then
    echo "FAIL: 5xx responses or requests without an answer" >&2
    exit 1
fi
