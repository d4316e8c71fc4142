#!/usr/bin/env bash
# Load test of `dprec serve` on this machine (loopback only, bounded in time).
#
#   load-tests/run.sh [--backend sqlite|postgres] [--duration SECONDS] [--data DIR]
#
# 1. builds the release binary, starts the service on 127.0.0.1 with a fresh store
#    (SQLite file in a temp dir, or a fresh PostgreSQL database that is dropped at the end);
# 2. imports MovieLens-100K through the batch API (`dprec import`) and trains one release
#    with the production trainer (admin retrain, polled until it succeeds);
# 3. drives top-N recommendations (GET, random users, n=10) and batch ingestion (POST of
#    1,000 random ratings per request) with wrk, each for --duration seconds (default 20),
#    2 threads and 32 / 4 connections; prints requests/s, ratings/s and latency percentiles.
#
# Needs wrk (Debian package `wrk`; installed here if missing and apt-get is available).
# How to read its output: docs/BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BACKEND=sqlite
DURATION=20
DATA=../shared/datasets/ml-100k
while [[ $# -gt 0 ]]; do
    case "$1" in
        --backend) BACKEND="$2"; shift 2 ;;
        --duration) DURATION="$2"; shift 2 ;;
        --data) DATA="$2"; shift 2 ;;
        *) echo "usage: $0 [--backend sqlite|postgres] [--duration S] [--data DIR]" >&2; exit 2 ;;
    esac
done
if ! command -v wrk >/dev/null; then
    echo "installing wrk" >&2
    apt-get install -y -qq wrk >/dev/null || { echo "wrk is needed (apt-get install wrk)" >&2; exit 1; }
fi
cargo build --release --quiet
BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/dprec
WORK=$(mktemp -d)
PORT=$((20000 + RANDOM % 20000))
BASE=http://127.0.0.1:$PORT
ADMIN=load-admin-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
# shellcheck source=lib.sh
. load-tests/lib.sh
trap 'svc_stop; rm -rf "$WORK"' EXIT

svc_start "$BACKEND" dprec_load

echo "== $BACKEND: import MovieLens-100K through the API" >&2
"$BIN" import --url "$BASE" --api-key "$ADMIN" --eps 1.0 "$DATA" 2>&1 | tail -1
echo "== $BACKEND: train one release (the default trainer)" >&2
JOB=$(curl -sf -X POST "$BASE/v1/admin/retrain" -H "Authorization: Bearer $ADMIN" | sed -E 's/.*"id":([0-9]+).*/\1/')
for _ in $(seq 1 600); do
    STATUS=$(curl -sf "$BASE/v1/admin/jobs/$JOB" -H "Authorization: Bearer $ADMIN")
    case "$STATUS" in *'"status":"succeeded"'*) break ;; *'"status":"failed"'*|*'"status":"skipped"'*) echo "$STATUS" >&2; exit 1 ;; esac
    sleep 0.2
done
echo "$STATUS"

cat > "$WORK/recommend.lua" <<LUA
math.randomseed(42)
wrk.headers["Authorization"] = "Bearer $ADMIN"
request = function()
  return wrk.format("GET", "/v1/users/" .. math.random(1, 943) .. "/recommendations?n=10")
end
LUA
cat > "$WORK/ingest.lua" <<LUA
math.randomseed(7)
wrk.method = "POST"
wrk.headers["Authorization"] = "Bearer $ADMIN"
wrk.headers["Content-Type"] = "application/json"
request = function()
  local parts = {}
  -- item k of the batch, random user: no (user, item) pair twice in a batch (the API
  -- rejects duplicates), and re-ratings across batches exercise the upsert path.
  for k = 1, 1000 do
    parts[k] = string.format('{"user":"load%d","item":"%d","rating":%d,"eps":1.0}',
      math.random(1, 20000), k, math.random(1, 5))
  end
  return wrk.format("POST", "/v1/ratings", nil, '{"ratings":[' .. table.concat(parts, ",") .. ']}')
end
LUA
echo "== $BACKEND: top-N recommendations, ${DURATION}s, 32 connections" >&2
wrk -t2 -c32 -d"${DURATION}s" --latency -s "$WORK/recommend.lua" "$BASE" | tee "$WORK/rec.txt"
# The same at 4 connections: latency when the server is not driven to saturation (wrk
# shares the two cores, so at 32 connections p99 is mostly queueing).
echo "== $BACKEND: top-N recommendations, ${DURATION}s, 4 connections" >&2
wrk -t2 -c4 -d"${DURATION}s" --latency -s "$WORK/recommend.lua" "$BASE" | tee "$WORK/rec4.txt"
echo "== $BACKEND: batch ingestion (1,000 ratings per request), ${DURATION}s, 4 connections" >&2
wrk -t2 -c4 -d"${DURATION}s" --latency -s "$WORK/ingest.lua" "$BASE" | tee "$WORK/ing.txt"
REC=$(awk '/Requests\/sec/ {print $2}' "$WORK/rec.txt")
P99=$(awk '$1 == "99%" {print $2}' "$WORK/rec.txt")
ING=$(awk '/Requests\/sec/ {print $2}' "$WORK/ing.txt")
IP99=$(awk '$1 == "99%" {print $2}' "$WORK/ing.txt")
REC4=$(awk '/Requests\/sec/ {print $2}' "$WORK/rec4.txt")
P994=$(awk '$1 == "99%" {print $2}' "$WORK/rec4.txt")
printf '\nsummary (%s): recommendations %s req/s, p99 %s (32 connections); %s req/s, p99 %s (4 connections); ingestion %.0f ratings/s (%s batches/s), p99 %s per batch\n' \
    "$BACKEND" "$REC" "$P99" "$REC4" "$P994" "$(echo "$ING * 1000" | bc -l)" "$ING" "$IP99"
for f in rec rec4 ing; do grep -q "Non-2xx" "$WORK/$f.txt" && { echo "error: non-2xx responses in the $f run" >&2; exit 1; }; done; true
