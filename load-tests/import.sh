#!/usr/bin/env bash
# Import speed: `dprec import` of a MovieLens directory into a fresh service, per backend.
#
#   load-tests/import.sh [--backend sqlite|postgres] [--bin PATH] [--data DIR] [--runs N]
#
# For each run: starts `dprec serve` on 127.0.0.1 on a scratch store (a SQLite file in a
# temp dir, or a fresh PostgreSQL database at 127.0.0.1:5432, user postgres, dropped
# afterwards), imports DIR through the batch API (`dprec import`, 5,000 ratings per
# request, eps 1.0), stops the service and prints the import's ratings/s. --bin picks the
# binary (default: the release build in $CARGO_TARGET_DIR or target/, built if missing),
# so two builds can be measured back to back. Results: docs/BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BACKEND=sqlite
BIN=""
DATA=../shared/datasets/ml-100k
RUNS=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --backend) BACKEND="$2"; shift 2 ;;
        --bin) BIN="$2"; shift 2 ;;
        --data) DATA="$2"; shift 2 ;;
        --runs) RUNS="$2"; shift 2 ;;
        *) echo "usage: $0 [--backend sqlite|postgres] [--bin PATH] [--data DIR] [--runs N]" >&2; exit 2 ;;
    esac
done
if [[ -z "$BIN" ]]; then
    BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/dprec
    [[ -x "$BIN" ]] || cargo build --release --quiet --bin dprec
fi
WORK=$(mktemp -d)
# shellcheck source=lib.sh
. load-tests/lib.sh
trap 'svc_stop; rm -rf "$WORK"' EXIT
ADMIN=import-admin-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')

for run in $(seq 1 "$RUNS"); do
    PORT=$((20000 + RANDOM % 20000))
    BASE=http://127.0.0.1:$PORT
    svc_start "$BACKEND" "dprec_import_$run"
    OUT=$("$BIN" import --url "$BASE" --api-key "$ADMIN" --eps 1.0 "$DATA" 2>&1 | tail -1)
    echo "$BACKEND run $run: $OUT"
    svc_stop
done
