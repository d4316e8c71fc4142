#!/usr/bin/env bash
# Generated-client check (issue 11): generates a Python client from the committed
# openapi/openapi.json with openapi-python-client, starts a real `dprec serve` on
# 127.0.0.1 (random free port, temporary SQLite file, scheduler off), and runs
# scripts/client_check.py through the generated client, unedited: ingest, error cases
# (401/403/404/422/503 decoded as Problem), retrain, job poll, recommendations, audit,
# models.
#
# Usage: scripts/client_check.sh [PATH/TO/dprec]
#   default binary: $CARGO_TARGET_DIR/release/dprec (or target/release/dprec), built with
#   `cargo build --release` when missing.
# Needs python3; the generator is pip-installed (from PyPI, once) into a virtualenv at
# $DPREC_CLIENT_VENV (default /tmp/dprec-client-venv). It fails when the generator prints
# a warning or skips an operation of the spec. CI runs it against the test build
# (`.ci/run`: scripts/client_check.sh target/debug/dprec).
set -euo pipefail
cd "$(dirname "$0")/.."
GENERATOR_VERSION=0.29.1

bin=${1:-${CARGO_TARGET_DIR:-target}/release/dprec}
if [ ! -x "$bin" ]; then
    cargo build --release
fi

venv=${DPREC_CLIENT_VENV:-/tmp/dprec-client-venv}
if ! "$venv/bin/openapi-python-client" --version 2>/dev/null | grep -q "$GENERATOR_VERSION"; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "openapi-python-client==$GENERATOR_VERSION"
fi

work=$(mktemp -d)
server=""
cleanup() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

printf 'post_hooks: []\n' > "$work/gen.yaml"
"$venv/bin/openapi-python-client" generate --path openapi/openapi.json --meta none \
    --config "$work/gen.yaml" --output-path "$work/dprec_client" >"$work/generate.log" 2>&1 \
    || { cat "$work/generate.log" >&2; echo "client check: the generator failed" >&2; exit 1; }
# The generator skips an operation it cannot parse with a WARNING and still exits 0: any
# warning fails the check, and every operation of the spec must have its module.
if grep -qi 'warning' "$work/generate.log"; then
    cat "$work/generate.log" >&2
    echo "client check: the generator warned (an operation or type may be missing)" >&2
    exit 1
fi
spec_ops=$(python3 -c 'import json; s = json.load(open("openapi/openapi.json")); print(sum(1 for p in s["paths"].values() for m in p if m in ("get", "put", "post", "delete", "patch")))')
gen_ops=$(find "$work/dprec_client/api" -name '*.py' ! -name '__init__.py' | wc -l)
if [ "$gen_ops" -ne "$spec_ops" ]; then
    echo "client check: the spec has $spec_ops operations, the generated client $gen_ops" >&2
    exit 1
fi
echo "client: openapi-python-client $GENERATOR_VERSION from openapi/openapi.json: $gen_ops of $spec_ops operations, no warning"

port=$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
admin="client-check-admin-$RANDOM$RANDOM$RANDOM"
reader="client-check-reader-$RANDOM$RANDOM$RANDOM"
cat > "$work/dprec.toml" <<TOML
[server]
bind = "127.0.0.1:$port"
[database]
url = "sqlite://$work/dprec.sqlite"
[auth]
mode = "keys"
[[auth.keys]]
key = "$admin"
role = "admin"
[[auth.keys]]
key = "$reader"
role = "reader"
[scheduler]
enabled = false
TOML
"$bin" serve --config "$work/dprec.toml" >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 1 100); do
    if "$venv/bin/python" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/healthz')" 2>/dev/null; then
        break
    fi
    if ! kill -0 "$server" 2>/dev/null; then
        cat "$work/server.log" >&2
        echo "client check: the server did not start" >&2
        exit 1
    fi
    sleep 0.2
done
echo "server: $bin on 127.0.0.1:$port, SQLite $work/dprec.sqlite"

if ! DPREC_URL="http://127.0.0.1:$port" DPREC_ADMIN_KEY="$admin" DPREC_READER_KEY="$reader" \
    PYTHONPATH="$work" "$venv/bin/python" scripts/client_check.py; then
    echo "--- server log ---" >&2
    tail -20 "$work/server.log" >&2
    exit 1
fi
