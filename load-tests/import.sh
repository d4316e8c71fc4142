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
# so two builds can be measured back to back. Results: docs/BENCHMARKS.md (issue 22).
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
PID=""
PGDB=""
cleanup() {
    if [[ -n "$PID" ]]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
    if [[ -n "$PGDB" ]]; then psql -q -h 127.0.0.1 -U postgres -c "DROP DATABASE IF EXISTS $PGDB" >/dev/null || true; fi
    PID=""; PGDB=""
}
trap 'cleanup; rm -rf "$WORK"' EXIT
ADMIN=import-admin-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')

for run in $(seq 1 "$RUNS"); do
    PORT=$((20000 + RANDOM % 20000))
    BASE=http://127.0.0.1:$PORT
    if [[ "$BACKEND" == postgres ]]; then
        PGDB=dprec_import_$$_$run
        psql -q -h 127.0.0.1 -U postgres -c "CREATE DATABASE $PGDB" >/dev/null
        DB_URL="postgres://postgres@127.0.0.1:5432/$PGDB"
    else
        rm -f "$WORK"/dprec.sqlite*
        DB_URL="sqlite://$WORK/dprec.sqlite"
    fi
    cat > "$WORK/dprec.toml" <<TOML
[server]
bind = "127.0.0.1:$PORT"
[database]
url = "$DB_URL"
[auth]
mode = "keys"
[[auth.keys]]
key = "$ADMIN"
role = "admin"
[scheduler]
enabled = false
TOML
    "$BIN" serve --config "$WORK/dprec.toml" > "$WORK/serve.log" 2>&1 &
    PID=$!
    for _ in $(seq 1 100); do curl -sf "$BASE/readyz" >/dev/null && break; sleep 0.1; done
    curl -sf "$BASE/readyz" >/dev/null || { cat "$WORK/serve.log" >&2; exit 1; }
    OUT=$("$BIN" import --url "$BASE" --api-key "$ADMIN" --eps 1.0 "$DATA" 2>&1 | tail -1)
    echo "$BACKEND run $run: $OUT"
    cleanup
done
