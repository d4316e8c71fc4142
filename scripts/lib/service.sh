# Shared by the scripts that run a real dprec service on a scratch store (sourced, not run).
#
# scratch_setup: a scratch directory in $scratch, removed on exit together with the
#   service in $server (if any), and no DPREC_* setting inherited from the caller's shell
#   but DPREC_ML100K_DIR (so the script's service runs on its defaults).
# start_service BIN [ARGS...]: starts `BIN serve --bind 127.0.0.1:0 ARGS...` (environment as set by the
#   caller) logging to $scratch/serve.log; sets $server, $port, $B (its base URL), $ADMIN (the
#   admin key printed on the first start) and the curl arguments $auth; exits on failure.
# retrain_and_wait: POSTs an admin retrain to $B with $auth, waits for the job (up to 10
#   minutes), prints its id, and exits with the job's answer if it did not succeed.
# wait_for_port LOG: prints the port a `dprec serve --bind 127.0.0.1:0` writing its log
#   to LOG listens on, once the log says so (waits up to 60 s; prints nothing if it never
#   does).

scratch_setup() {
    scratch=$(mktemp -d)
    server=""
    trap 'scratch_cleanup' EXIT
    # shellcheck disable=SC2046
    unset $(env | grep -o '^DPREC_[A-Z_]*' | grep -v '^DPREC_ML100K_DIR$') 2>/dev/null || true
}

scratch_cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null || true
    rm -rf "$scratch"
}

wait_for_port() {
    local port=""
    for _ in $(seq 300); do
        port=$(grep -Eo 'listening on port [0-9]+' "$1" | grep -Eo '[0-9]+$' || true)
        [ -n "$port" ] && break
        sleep 0.2
    done
    echo "$port"
}

start_service() {
    "$1" serve --bind 127.0.0.1:0 "${@:2}" 2>"$scratch/serve.log" &
    server=$!
    port=$(wait_for_port "$scratch/serve.log")
    [ -n "$port" ] || { echo "the service did not start: $(cat "$scratch/serve.log")" >&2; exit 1; }
    B="http://127.0.0.1:$port"
    ADMIN=$(grep -Eo 'dprec_[0-9a-f]{64}' "$scratch/serve.log" | head -1)
    [ -n "$ADMIN" ] || { echo "no admin key printed on the first start" >&2; exit 1; }
    auth=(-H "Authorization: Bearer $ADMIN")
}

retrain_and_wait() {
    local job status
    job=$(curl -s -X POST "$B/v1/admin/retrain" "${auth[@]}" | grep -Eo '"id":[0-9]+' | head -1 | cut -d: -f2)
    [ -n "$job" ] || { echo "retrain refused" >&2; exit 1; }
    for _ in $(seq 1200); do
        curl -s "$B/v1/admin/jobs/$job" "${auth[@]}" | grep -q '"status":"running"' || break
        sleep 0.5
    done
    status=$(curl -s "$B/v1/admin/jobs/$job" "${auth[@]}")
    echo "$status" | grep -q '"status":"succeeded"' || { echo "job $job: $status" >&2; exit 1; }
    echo "$job"
}
