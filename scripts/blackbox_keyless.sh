#!/usr/bin/env bash
# Black-box check of what a caller WITHOUT a key can learn from a default service with
# real keys (not --dev-no-auth). Two services are started one after the other on fresh
# SQLite files: D (the first N ratings of MovieLens-100K) and D' (the same plus one new
# user with one rating). Each gets R admin retrains; then every key-less answer is
# fetched from both (the probes, /metrics, /openapi.json, /docs, and every GET route of
# the OpenAPI document under /v1 with its path parameters filled in) and compared. The
# only values allowed to differ are wall-clock times (a release's publication time is
# its job's start; the check prints it next to the job's start from the admin API).
#
#   scripts/blackbox_keyless.sh [--bin PATH] [--ratings N] [--releases R]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin="$root/target/release/dprec"
n=20000
releases=10
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --ratings) n=$2; shift 2 ;;
        --releases) releases=$2; shift 2 ;;
        *) echo "blackbox: unknown argument $1" >&2; exit 2 ;;
    esac
done
bin=$(realpath "$bin")
data="$root/../shared/datasets/ml-100k"
[ -x "$bin" ] || { echo "blackbox: no binary at $bin" >&2; exit 2; }
[ -f "$data/u.data" ] || { echo "blackbox: no MovieLens-100K at $data" >&2; exit 2; }

# shellcheck source=lib/service.sh
. "$root/scripts/lib/service.sh"
scratch_setup

# D: the first N ratings with the catalogue; D' adds user "canary" rating item 50.
mkdir -p "$scratch/D"
head -n "$n" "$data/u.data" >"$scratch/D/u.data"
cp "$data/u.item" "$scratch/D/u.item"

# Starts a service on a fresh store, loads D (and the canary for D'), runs the releases,
# and saves every key-less answer under $scratch/$1.
run() {
    local name=$1 canary=$2 dir="$scratch/$1"
    mkdir -p "$dir"
    DATABASE_URL="sqlite://$dir/dprec.sqlite" "$bin" serve --bind 127.0.0.1:0 2>"$dir/serve.log" &
    server=$!
    local port
    port=$(wait_for_port "$dir/serve.log")
    [ -n "$port" ] || { echo "blackbox: $name did not start" >&2; cat "$dir/serve.log" >&2; exit 1; }
    local b="http://127.0.0.1:$port"
    local admin
    admin=$(grep -Eo 'dprec_[0-9a-f]{64}' "$dir/serve.log" | head -1)
    "$bin" import --url "$b" --api-key "$admin" "$scratch/D/u.data" >/dev/null 2>&1
    if [ "$canary" = yes ]; then
        curl -sf -X POST "$b/v1/ratings" -H "Authorization: Bearer $admin" \
            -H 'Content-Type: application/json' \
            -d '{"ratings":[{"user":"canary","item":"50","rating":5}]}' >/dev/null
    fi
    : >"$dir/job_starts"
    for _ in $(seq "$releases"); do
        local job
        job=$(curl -s -X POST "$b/v1/admin/retrain" -H "Authorization: Bearer $admin" \
            | grep -Eo '"id":[0-9]+' | head -1 | cut -d: -f2)
        while curl -s "$b/v1/admin/jobs/$job" -H "Authorization: Bearer $admin" | grep -q '"status":"running"'; do
            sleep 0.3
        done
        curl -s "$b/v1/admin/jobs/$job" -H "Authorization: Bearer $admin" >>"$dir/job_starts"
        echo >>"$dir/job_starts"
    done
    python3 - "$b" "$dir" <<'PY'
import json, sys, urllib.request, urllib.error
base, out = sys.argv[1], sys.argv[2]
def get(path):
    try:
        with urllib.request.urlopen(base + path, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
spec = json.loads(get("/openapi.json")[1])
fill = {"user": "canary", "item": "50", "id": "1"}
answers = {}
for path, ops in sorted(spec["paths"].items()):
    if "get" not in ops:
        continue
    concrete = path
    for k, v in fill.items():
        concrete = concrete.replace("{" + k + "}", v)
    answers[concrete] = get(concrete)
# Routes a key-less caller may try that the spec does not list.
for extra in ["/v1/users/1/recommendations", "/v1/users/canary/budget", "/v1/nonexistent"]:
    answers[extra] = get(extra)
json.dump(answers, open(out + "/keyless.json", "w"), indent=1, sort_keys=True)
PY
    kill "$server"; wait "$server" 2>/dev/null || true; server=""
}

echo "blackbox: D = first $n ratings of ML-100K, D' = D + one new user's rating; $releases releases each ($(basename "$bin"), real keys)"
run D no
run D1 yes
python3 - "$scratch" <<'PY'
import json, re, sys
s = sys.argv[1]
a = json.load(open(s + "/D/keyless.json")); b = json.load(open(s + "/D1/keyless.json"))
time_metric = re.compile(r"^dprec_model_published_timestamp_seconds (\S+)$", re.M)
def starts(d):
    return [json.loads(l)["created_at"] for l in open(f"{s}/{d}/job_starts") if l.strip()]
diffs = 0
for path in sorted(set(a) | set(b)):
    (sa, ba), (sb, bb) = a.get(path, (None, "")), b.get(path, (None, ""))
    if path == "/metrics":
        ta, tb = time_metric.search(ba), time_metric.search(bb)
        for d, t in (("D", ta), ("D'", tb)):
            last = starts("D" if d == "D" else "D1")[-1] / 1000.0
            print(f"  /metrics published time in {d}: {t.group(1) if t else None} (last job's start {last})")
        ba, bb = time_metric.sub("<time>", ba), time_metric.sub("<time>", bb)
    same = sa == sb and ba == bb
    diffs += not same
    print(f"{'same' if same else 'DIFFERS'}  {sa} {path}  ({len(ba)} bytes)")
    if not same:
        print("   D :", ba[:300]); print("   D':", bb[:300])
print(f"blackbox: {len(set(a) | set(b))} key-less answers compared, {diffs} differ (times masked)")
sys.exit(1 if diffs else 0)
PY
