# Shared by the load tests (sourced, not run): one `dprec serve` on a scratch store with a
# configured admin key, on either backend.
#
# The caller sets BIN (the binary), WORK (a scratch directory), PORT, BASE
# (http://127.0.0.1:$PORT) and ADMIN (the admin key), and calls `trap 'svc_stop; rm -rf
# "$WORK"' EXIT`.
#
# svc_start BACKEND NAME  a fresh store (a new SQLite file in WORK, or a new PostgreSQL
#                         database NAME_<pid> at 127.0.0.1:5432), the service started on it
#                         with the scheduler off; returns once /readyz answers. Sets PID and
#                         PGDB. RUST_LOG passes through.
# svc_stop                stops the service and drops the PostgreSQL database, if any.

PID=""
PGDB=""

svc_start() {
    local backend=$1 name=$2 db_url
    if [[ "$backend" == postgres ]]; then
        PGDB=${name}_$$
        psql -q -h 127.0.0.1 -U postgres -c "CREATE DATABASE $PGDB" >/dev/null
        db_url="postgres://postgres@127.0.0.1:5432/$PGDB"
    else
        rm -f "$WORK"/dprec.sqlite*
        db_url="sqlite://$WORK/dprec.sqlite"
    fi
    cat > "$WORK/dprec.toml" <<TOML
[server]
bind = "127.0.0.1:$PORT"
[database]
url = "$db_url"
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
}

svc_stop() {
    if [[ -n "$PID" ]]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
    if [[ -n "$PGDB" ]]; then
        psql -q -h 127.0.0.1 -U postgres -c "DROP DATABASE IF EXISTS $PGDB WITH (FORCE)" >/dev/null || true
    fi
    PID=""; PGDB=""
}
