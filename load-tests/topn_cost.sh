#!/usr/bin/env bash
# What a top-N and a prediction request cost against the size of the store, as a ratio
# to the same server's /healthz in the same run (loopback only, bounded in time).
#
#   load-tests/topn_cost.sh [--bin PATH]... [--data DIR | --store DIR [--pg DB]]
#                           [--duration S] [--warmup S] [--no-predictions] [--no-topn]
#
# 1. the store: MovieLens-100K from --data DIR (default ../shared/datasets/ml-100k)
#    imported through the API into a scratch SQLite store, or a copy of a store made by
#    `load-tests/release_memory.sh prepare --store DIR [--pg DB]` (SQLite: a file copy;
#    PostgreSQL: a scratch database made from DB as template, dropped at the end);
# 2. one release of the served default (dp-topn) by the first binary, and for
#    predictions a second store with a later `dp-alt` release on top (a joint-DP rating
#    predictor: dp-topn ranks without predicting ratings); every binary then serves the
#    same releases, so their lists are the same and only the serving cost differs;
# 3. per binary (--bin, repeatable; default target/release/dprec), one fresh service
#    per store, a warm-up of --warmup seconds (default 3) at 32 connections that asks
#    for every user once, in order (then /healthz until the time is up), so that the
#    runs below measure a service that has served its users before: on a large store
#    give it the time to reach them all (it prints how many it asked for; a first request
#    reads the user's ratings from the store), then wrk with 2 threads for --duration
#    seconds (default 10) per line, back to back: /healthz, top-N of random users (n=10) and predictions of random users (10
#    random items) at 32 and at 4 connections, then at 4 connections the users with about
#    10, 100 and 1,000 ratings (up to 200 users whose count is within 20% of each; a
#    store without such users prints nothing for them); --no-predictions leaves the
#    predictions out (and their release), --no-topn the top-N runs;
# 4. prints one line per run: requests/s, p50, p99, and requests/s as a ratio to /healthz
#    at the same connections with the same binary; then per service its resident memory
#    at the end (VmRSS) and the peak (VmHWM).
#
# Needs wrk and sqlite3 (or psql). How to read its output: docs/BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bins=()
data=../shared/datasets/ml-100k
store=""
pg=""
duration=10
warmup=3
predictions=1
topn=1
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bins+=("$(realpath "$2")"); shift 2 ;;
        --data) data=$2; shift 2 ;;
        --store) store=$(realpath "$2"); shift 2 ;;
        --pg) pg=$2; shift 2 ;;
        --duration) duration=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        --no-predictions) predictions=0; shift ;;
        --no-topn) topn=0; shift ;;
        *) echo "topn_cost: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ ${#bins[@]} -gt 0 ] || bins=("$root/target/release/dprec")
command -v wrk >/dev/null || { echo "topn_cost: wrk is needed (apt-get install wrk)" >&2; exit 2; }
# shellcheck source=../scripts/lib/service.sh
. "$root/scripts/lib/service.sh"
# shellcheck source=wrk_scripts.sh
. "$root/load-tests/wrk_scripts.sh"
scratch_setup
export DPREC_SCHEDULER__ENABLED=false
# Releases become visible at their commit: the script waits for them, not for a delay.
export DPREC_RELEASE__PUBLISH_DELAY_SECS=0

pg_url() { echo "postgres://postgres@127.0.0.1:5432/$1"; }
psql_q() { psql -qAt -h 127.0.0.1 -U postgres -d "$1" -c "$2"; }
scratch_dbs=()
cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
    server=""
    for db in "${scratch_dbs[@]}"; do
        psql_q postgres "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null || true
    done
    scratch_cleanup
}
trap cleanup EXIT

# Starts BIN on database URL $2 (its log: $scratch/serve.log); sets $server and $B.
serve_on() {
    DATABASE_URL="$2" "$1" serve --bind 127.0.0.1:0 2>"$scratch/serve.log" &
    server=$!
    local port
    port=$(wait_for_port "$scratch/serve.log")
    [ -n "$port" ] || { echo "topn_cost: the service did not start" >&2; cat "$scratch/serve.log" >&2; exit 1; }
    B="http://127.0.0.1:$port"
    for _ in $(seq 600); do curl -sf "$B/readyz" >/dev/null && return; sleep 0.2; done
    echo "topn_cost: the service is not ready" >&2
    exit 1
}
stop() { kill "$server"; wait "$server" 2>/dev/null || true; server=""; }
# Runs SQL on the store at URL $1.
sql() {
    case "$1" in
        sqlite://*) sqlite3 "${1#sqlite://}" "$2" ;;
        *) psql_q "${1##*/}" "$2" ;;
    esac
}

# The stores: $url_topn (one dp-topn release) and $url_pred (and a dp-alt release).
bin0=${bins[0]}
copy_store() { # NAME -> URL of a scratch copy of the base
    if [ -n "$pg" ]; then
        local db="${pg}_$1_$$"
        psql_q postgres "CREATE DATABASE $db TEMPLATE $2" >/dev/null
        scratch_dbs+=("$db")
        pg_url "$db"
    else
        mkdir -p "$scratch/$1"
        for f in "$2"/dprec.sqlite*; do cp "$f" "$scratch/$1/"; done
        echo "sqlite://$scratch/$1/dprec.sqlite"
    fi
}
if [ -n "$store" ]; then
    export DPREC_RATINGS__MIN=0.5 # the synthetic presets rate in half stars
    ADMIN=$(cat "$store/admin.key")
    url_topn=$(copy_store topn "${pg:-$store}")
    serve_on "$bin0" "$url_topn"
else
    mkdir -p "$scratch/topn"
    url_topn="sqlite://$scratch/topn/dprec.sqlite"
    serve_on "$bin0" "$url_topn"
    ADMIN=$(grep -Eo 'dprec_[0-9a-f]{64}' "$scratch/serve.log" | head -1)
    "$bin0" import --url "$B" --api-key "$ADMIN" --eps 1.0 "$data" 2>&1 | tail -1 >&2
fi
auth=(-H "Authorization: Bearer $ADMIN")
echo "release (dp-topn): job $(retrain_and_wait)" >&2
stop
if [ "$predictions" = 1 ]; then
    if [ -n "$pg" ]; then
        url_pred=$(copy_store pred "${url_topn##*/}")
    else
        url_pred=$(copy_store pred "$scratch/topn")
    fi
    DPREC_TRAINER__NAME=dp-alt serve_on "$bin0" "$url_pred"
    echo "release (dp-alt): job $(retrain_and_wait)" >&2
    stop
fi

# Users and items for the wrk scripts, and users by their number of ratings.
counts="$scratch/counts.txt"
sql "$url_topn" "SELECT user_id, COUNT(*) FROM ratings WHERE value IS NOT NULL GROUP BY user_id" |
    tr '|' ' ' >"$counts"
sql "$url_topn" "SELECT id FROM items" >"$scratch/items.txt"
echo "store: $(wc -l <"$counts") users with ratings, $(wc -l <"$scratch/items.txt") items" >&2

awk '{ print $1 }' "$counts" >"$scratch/users_all.txt"
for c in 10 100 1000; do
    # (Not `| head`: with pipefail, awk's broken pipe on a large store ends the script.)
    awk -v c="$c" '$2 >= 0.8 * c && $2 <= 1.2 * c && k++ < 200 { print $1 }' "$counts" >"$scratch/users_$c.txt"
done
# wrk script: GET PATH for random users of LIST (predictions: 10 random items).
lua() { random_requests_lua "$scratch/$1.lua" "$2" "$scratch/items.txt" "$3" "$ADMIN"; }
# The warm-up: every user once, in order (thread k of 2 takes every other one).
warm_lua() { # NAME USERS KIND
    cat >"$scratch/$1.lua" <<LUA
local n = 0
function setup(thread) thread:set("id", n); n = n + 1 end
wrk.headers["Authorization"] = "Bearer $ADMIN"
local users = $(lua_list "$2")
local k = 0
request = function()
  local i = (id or 0) + 2 * k + 1
  k = k + 1
  if i > #users then return wrk.format("GET", "/healthz") end
  if "$3" == "topn" then
    return wrk.format("GET", "/v1/users/" .. users[i] .. "/recommendations?n=10")
  end
  return wrk.format("GET", "/v1/users/" .. users[i] .. "/predictions?items=$(head -1 "$scratch/items.txt")")
end
LUA
}
for kind in topn pred; do
    warm_lua "${kind}_warm" "$scratch/users_all.txt" "$kind"
    lua "${kind}_all" "$scratch/users_all.txt" "$kind"
    for c in 10 100 1000; do
        [ -s "$scratch/users_$c.txt" ] && lua "${kind}_$c" "$scratch/users_$c.txt" "$kind"
    done
done

# One wrk run: prints "route conns req/s p50 p99 non-2xx".
run() { # LABEL CONNS SCRIPT|-
    local out="$scratch/wrk.txt"
    if [ "$3" = - ]; then
        wrk -t2 -c"$2" -d"${duration}s" --latency "$B/healthz" >"$out"
    else
        wrk -t2 -c"$2" -d"${duration}s" --latency -s "$3" "$B" >"$out"
    fi
    printf '%s %s %s %s %s %s\n' "$1" "$2" "$(awk '/Requests\/sec/ {print $2}' "$out")" \
        "$(awk '$1 == "50%" {print $2}' "$out")" "$(awk '$1 == "99%" {print $2}' "$out")" \
        "$(awk '/Non-2xx/ {print $NF}' "$out")"
}
printf '%-24s %-10s %5s %10s %7s %9s %9s\n' binary route conns "req/s" ratio p50 p99
for bin in "${bins[@]}"; do
    name=$(basename "$(dirname "$bin")")/$(basename "$bin")
    for kind in topn pred; do
        [ "$kind" = pred ] && [ "$predictions" = 0 ] && continue
        [ "$kind" = topn ] && [ "$topn" = 0 ] && continue
        url=url_$kind
        serve_on "$bin" "${!url}"
        wrk -t2 -c32 -d"${warmup}s" -s "$scratch/${kind}_warm.lua" "$B" >"$scratch/warm.txt"
        echo "warm-up ($name, $kind): $(awk '/requests in/ {print $1}' "$scratch/warm.txt") requests for $(wc -l <"$scratch/users_all.txt") users" >&2
        lines=()
        for c in 32 4; do
            lines+=("$(run healthz "$c" -)")
            lines+=("$(run "$kind" "$c" "$scratch/${kind}_all.lua")")
        done
        for u in 10 100 1000; do
            if [ -f "$scratch/${kind}_$u.lua" ]; then
                lines+=("$(run "$kind-$u" 4 "$scratch/${kind}_$u.lua")")
            fi
        done
        mem=$(awk '/VmRSS|VmHWM/ {printf "%s %s kB  ", $1, $2}' "/proc/$server/status")
        stop
        for l in "${lines[@]}"; do
            read -r route conns rps p50 p99 bad <<<"$l"
            base=$(printf '%s\n' "${lines[@]}" | awk -v c="$conns" '$1 == "healthz" && $2 == c {print $3}')
            printf '%-24s %-10s %5s %10s %6.2fx %9s %9s%s\n' "$name" "$route" "$conns" "$rps" \
                "$(echo "$rps / $base" | bc -l)" "$p50" "$p99" "${bad:+  non-2xx: $bad}"
        done
        printf '%-24s %-10s memory: %s\n' "$name" "$kind" "$mem"
    done
done
