#!/usr/bin/env bash
# Instructions the service executes per request (valgrind's callgrind: the service's own
# user-space instructions, not the kernel's or the client's): repeatable on a busy
# machine, where requests/s are not. /healthz, top-N and predictions of random users.
#
#   load-tests/request_instructions.sh [--bin PATH]... [--data DIR] [--duration S] [--eps E]
#
# 1. the stores of load-tests/topn_cost.sh: MovieLens-100K from --data DIR (default
#    ../shared/datasets/ml-100k) imported by the first binary, one dp-topn release, and a
#    copy with a later dp-alt release for predictions;
# 2. per binary (--bin, repeatable; default target/release/dprec) and store, the service
#    under callgrind; every user asked for once (their ratings read, their lists made);
#    then for /healthz and for the route (top-N n=10, or predictions of 10 random items):
#    the counts zeroed, wrk with 1 thread and 4 connections for --duration seconds
#    (default 10), the counts dumped;
#    `--eps E`: the ratings' eps_ij at import (default 1.0, where the first release serves
#    the DP counts' order to every user); `--eps default` imports at the service's default,
#    where the release publishes a label model and users get label lists. The sources of
#    the lists are printed after the release.
# 3. prints per run the requests, the instructions and the instructions per request.
#    Under valgrind SHA-256 runs its portable code (valgrind hides the CPU's SHA
#    extensions): the key check counts about 7,000 instructions more than on the CPU.
#
# Needs valgrind, wrk and sqlite3. How to read its output: docs/BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bins=()
data=../shared/datasets/ml-100k
duration=10
eps=1.0
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bins+=("$(realpath "$2")"); shift 2 ;;
        --data) data=$2; shift 2 ;;
        --duration) duration=$2; shift 2 ;;
        --eps) eps=$2; shift 2 ;;
        *) echo "request_instructions: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ ${#bins[@]} -gt 0 ] || bins=("$root/target/release/dprec")
for tool in valgrind callgrind_control wrk sqlite3; do
    command -v $tool >/dev/null || { echo "request_instructions: $tool is needed" >&2; exit 2; }
done
# shellcheck source=../scripts/lib/service.sh
. "$root/scripts/lib/service.sh"
# shellcheck source=wrk_scripts.sh
. "$root/load-tests/wrk_scripts.sh"
scratch_setup
export DPREC_SCHEDULER__ENABLED=false DPREC_RELEASE__PUBLISH_DELAY_SECS=0
# The check for other processes' writes is not a request's cost: out of the windows.
export DPREC_SCHEDULER__RELOAD_SECS=3600

# Starts "$@" on SQLite store DIR $1 (log: $scratch/serve.log); sets $server and $B.
serve_on() {
    local dir=$1
    shift
    DATABASE_URL="sqlite://$dir/dprec.sqlite" "$@" serve --bind 127.0.0.1:0 2>"$scratch/serve.log" &
    server=$!
    port=$(wait_for_port "$scratch/serve.log")
    [ -n "$port" ] || { echo "the service did not start" >&2; cat "$scratch/serve.log" >&2; exit 1; }
    B="http://127.0.0.1:$port"
    for _ in $(seq 600); do curl -sf "$B/readyz" >/dev/null && return; sleep 0.5; done
    echo "the service is not ready" >&2
    exit 1
}
stop() { kill "$server"; wait "$server" 2>/dev/null || true; server=""; }

bin0=${bins[0]}
mkdir -p "$scratch/topn" "$scratch/pred"
serve_on "$scratch/topn" "$bin0"
ADMIN=$(grep -Eo 'dprec_[0-9a-f]{64}' "$scratch/serve.log" | head -1)
auth=(-H "Authorization: Bearer $ADMIN")
eps_arg=(--eps "$eps")
[ "$eps" = default ] && eps_arg=()
"$bin0" import --url "$B" --api-key "$ADMIN" "${eps_arg[@]}" "$data" 2>&1 | tail -1 >&2
echo "release (dp-topn): job $(retrain_and_wait)" >&2
echo "list sources of the first 100 users: $(for u in $(seq 1 100); do
    curl -s "$B/v1/users/$u/recommendations?n=1" "${auth[@]}" | grep -Eo '"source":"[a-z]+"'
done | sort | uniq -c | tr -s ' \n' ' ')" >&2
stop
cp "$scratch"/topn/dprec.sqlite* "$scratch/pred/"
DPREC_TRAINER__NAME=dp-alt serve_on "$scratch/pred" "$bin0"
echo "release (dp-alt): job $(retrain_and_wait)" >&2
stop
sqlite3 "$scratch/topn/dprec.sqlite" "SELECT DISTINCT user_id FROM ratings WHERE value IS NOT NULL" >"$scratch/users.txt"
sqlite3 "$scratch/topn/dprec.sqlite" "SELECT id FROM items" >"$scratch/items.txt"

for kind in topn pred; do
    random_requests_lua "$scratch/$kind.lua" "$scratch/users.txt" "$scratch/items.txt" "$kind" "$ADMIN"
done

printf '%-24s %-8s %-8s %9s %15s %13s\n' binary store route requests instructions "per request"
for bin in "${bins[@]}"; do
    name=$(basename "$(dirname "$bin")")/$(basename "$bin")
    for kind in topn pred; do
        rm -rf "$scratch/run"
        mkdir -p "$scratch/run"
        cp "$scratch/$kind"/dprec.sqlite* "$scratch/run/"
        serve_on "$scratch/run" valgrind --tool=callgrind --callgrind-out-file="$scratch/cg.%p" "$bin"
        if [ $kind = topn ]; then q="recommendations?n=10"; else q="predictions?items=$(head -1 "$scratch/items.txt")"; fi
        # Every user once, in order, on one connection.
        awk -v b="$B" -v q="$q" '{ printf "url = \"%s/v1/users/%s/%s\"\noutput = /dev/null\n", b, $1, q }' \
            "$scratch/users.txt" >"$scratch/warm.cfg"
        warm=$(curl -s "${auth[@]}" -K "$scratch/warm.cfg" -w '%{http_code}\n' | grep -c '^200$' || true)
        echo "$name $kind: warm-up answered $warm of $(wc -l <"$scratch/users.txt") users" >&2
        sleep 5
        for route in healthz $kind; do
            callgrind_control -z "$server" >/dev/null
            if [ $route = healthz ]; then
                wrk -t1 -c4 -d"${duration}s" "$B/healthz" >"$scratch/wrk.txt"
            else
                wrk -t1 -c4 -d"${duration}s" -s "$scratch/$kind.lua" "$B" >"$scratch/wrk.txt"
            fi
            callgrind_control -d "$server" >/dev/null
            sleep 2
            out=$(ls -t "$scratch"/cg.* | head -1)
            n=$(awk '/requests in/ {print $1}' "$scratch/wrk.txt")
            bad=$(awk '/Non-2xx/ {print $NF}' "$scratch/wrk.txt")
            ir=$(awk '/^summary:|^totals:/ {print $2; exit}' "$out")
            rm -f "$out"
            printf '%-24s %-8s %-8s %9s %15s %13s%s\n' "$name" "$kind" "$route" "$n" "$ir" \
                "$((ir / n))" "${bad:+  non-2xx: $bad}"
        done
        stop
    done
done
