#!/usr/bin/env bash
# The receipt and overview pages (issue 25) and /docs in a real browser: start a fresh service
# (SQLite in a scratch directory, real keys, scheduler off), import MovieLens-100K, run two
# admin releases, mint a receipt link for one user (reader key) and an overview link
# (admin key), open both in headless Chromium, save screenshots, and check:
#   - the rendered text: the remaining eps, the eps in use, the (eps, delta) spent and the
#     releases left equal the audit JSON's (GET /v1/users/{u}/budget) at the shown
#     precision; both releases are described; the overview counts both releases;
#   - that no request leaves the machine: Chromium runs with every host name resolving to
#     nothing but 127.0.0.1, its net log lists only URLs on 127.0.0.1, and no page
#     holds an external src/href or a script.
#
#   scripts/receipt_pages.sh [--bin PATH] [--user ID] [--out DIR] [--eval-report FILE]
#
# --bin          the dprec binary (default target/release/dprec)
# --user         the ML-100K user whose receipt is opened (default 1)
# --out          where the screenshots go (default docs/figures/screens)
# --eval-report  a `dprec-lab eval --out` report for the overview's quality table (default:
#                one is made first, `dprec-lab eval --trainer dp-topn --trainer popularity`
#                on ML-100K's five predefined folds, about 20 s)
# Chromium comes from the distribution (`apt-get install -y chromium`; installed here when
# missing and running as root). MovieLens-100K is read at $DPREC_ML100K_DIR or
# ../shared/datasets/ml-100k.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin="$root/target/release/dprec"
data="${DPREC_ML100K_DIR:-$root/../shared/datasets/ml-100k}"
user=1
out="$root/docs/figures/screens"
eval_report=""
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --user) user=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --eval-report) eval_report=$(realpath "$2"); shift 2 ;;
        *) echo "receipt_pages: unknown argument $1" >&2; exit 2 ;;
    esac
done
fail() { echo "receipt_pages: FAILED: $*" >&2; exit 1; }
[ -x "$bin" ] || fail "no binary at $bin (cargo build --release, or --bin)"
[ -f "$data/u.data" ] || fail "no MovieLens-100K at $data"
if ! command -v chromium >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || fail "chromium is missing: apt-get install -y chromium"
    apt-get install -y chromium >/dev/null
fi
mkdir -p "$out"

# shellcheck source=lib/service.sh
. "$root/scripts/lib/service.sh"
scratch_setup

export DATABASE_URL="sqlite://$scratch/dprec.sqlite"
export DPREC_SCHEDULER__ENABLED=false
if [ -z "$eval_report" ]; then
    eval_report="$scratch/eval.json"
    echo "receipt_pages: dprec-lab eval --trainer dp-topn --trainer popularity (the overview's quality figures)"
    "$(dirname "$bin")/dprec-lab" eval --data "$data" --trainer dp-topn --trainer popularity --out "$eval_report" \
        >"$scratch/eval.log" 2>&1 || fail "dprec-lab eval: $(tail -3 "$scratch/eval.log")"
fi
export DPREC_PAGES__EVAL_REPORT="$eval_report"
start_service "$bin"

echo "receipt_pages: service at $B; importing $data"
"$bin" import --url "$B" --api-key "$ADMIN" "$data" 2>&1 | tail -1
for n in 1 2; do
    job=$(curl -sf -X POST "$B/v1/admin/retrain" "${auth[@]}" | jq -r .id)
    for _ in $(seq 1200); do
        status=$(curl -sf "$B/v1/admin/jobs/$job" "${auth[@]}" | jq -r .status)
        [ "$status" != running ] && break
        sleep 0.5
    done
    [ "$status" = succeeded ] || fail "release $n: job $job is $status"
    echo "receipt_pages: release $n published (job $job)"
done

READER=$(curl -sf -X POST "$B/v1/admin/keys" "${auth[@]}" -H 'Content-Type: application/json' \
    -d '{"role":"reader"}' | jq -r .key)
user_path=$(curl -sf -X POST "$B/v1/users/$user/receipt/links" -H "Authorization: Bearer $READER" | jq -r .path)
overview_path=$(curl -sf -X POST "$B/v1/admin/overview/links" "${auth[@]}" | jq -r .path)
curl -sf "$B/v1/users/$user/budget?limit=1" -H "Authorization: Bearer $READER" >"$scratch/audit.json"

# Every host name resolves to nothing except 127.0.0.1; no background services.
browse() { # browse NAME URL HEIGHT
    chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
        --no-first-run --disable-background-networking --disable-component-update \
        --disable-sync --disable-default-apps --disable-extensions \
        --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" \
        --log-net-log="$scratch/$1.netlog.json" \
        --window-size="1200,$3" --screenshot="$out/$1.png" "$2" 2>>"$scratch/chromium.log"
    chromium --headless --no-sandbox --disable-gpu --no-first-run \
        --disable-background-networking --disable-component-update \
        --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" \
        --log-net-log="$scratch/$1.dom.netlog.json" \
        --dump-dom "$2" >"$scratch/$1.dom.html" 2>>"$scratch/chromium.log"
    curl -sf "$2" >"$scratch/$1.raw.html"
}
# The user's page, its first 12 ratings in item order (the link's token travels in the
# page's links); the overview; the top of /docs.
browse receipt-user "$B$user_path&limit=12" 3400
browse receipt-operator "$B$overview_path" 1900
browse docs "$B/docs" 1900

python3 - "$scratch" "$user" "$port" <<'EOF'
import json, re, sys, html
scratch, user, port = sys.argv[1], sys.argv[2], sys.argv[3]
audit = json.load(open(f"{scratch}/audit.json"))
dom = open(f"{scratch}/receipt-user.dom.html").read()
def shown(page, ident):
    m = re.search(r'id="%s">([^<]*)<' % ident, page)
    if not m:
        sys.exit(f"receipt_pages: FAILED: no #{ident} in the rendered page")
    return html.unescape(m.group(1))
s = audit["spent"]
checks = [
    ("remaining eps", shown(dom, "remaining-eps"), f'{s["remaining_eps"]:.3f}'),
    ("eps in use", shown(dom, "filter-eps"), f'{s["filter_eps"]:.3f}'),
    ("spent (eps, delta_u)", shown(dom, "spent-eps"), f'{s["eps"]:.3f}'),
    ("releases left", shown(dom, "releases-left"), str(s["releases_left"])),
    ("user", shown(dom, "user"), user),
]
for name, got, want in checks:
    print(f"receipt_pages: {name}: page {got}, audit JSON {want}")
    if got != want:
        sys.exit(f"receipt_pages: FAILED: {name} differs")
if audit["releases"]["total"] != 2:
    sys.exit("receipt_pages: FAILED: the user did not take part in both releases")
for rid in (1, 2):
    if f'id="release-{rid}"' not in dom:
        sys.exit(f"receipt_pages: FAILED: release {rid} is not described")
ov = open(f"{scratch}/receipt-operator.dom.html").read()
print(f'receipt_pages: overview: published releases {shown(ov, "release-count")}')
if shown(ov, "release-count") != "2":
    sys.exit("receipt_pages: FAILED: the overview does not count two releases")
if 'id="eval"' not in ov:
    sys.exit("receipt_pages: FAILED: the overview shows no eval figures")
if 'id="served"' not in ov:
    sys.exit("receipt_pages: FAILED: the overview does not say what users are served")
if 'id="list-source"' not in dom:
    sys.exit("receipt_pages: FAILED: the receipt does not say what the list is made of")
docs = open(f"{scratch}/docs.dom.html").read()
if 'id="tag-recommendations"' not in docs or 'id="schema-Audit"' not in docs:
    sys.exit("receipt_pages: FAILED: /docs is not grouped or lacks its schemas")
# No external resource in either page as served.
for name in ("receipt-user", "receipt-operator", "docs"):
    raw = open(f"{scratch}/{name}.raw.html").read()
    ext = re.findall(r'(?:src|href|action)\s*=\s*"((?:https?:)?//[^"]*)"', raw)
    if ext or "<script" in raw:
        sys.exit(f"receipt_pages: FAILED: {name} refers to {ext or 'a script'}")
# Chromium's net logs: every request the pages made went to the service, and every TCP
# connection the browser opened went to 127.0.0.1. The browser's own background requests
# (update and time checks; initiator "not an origin") are counted: the host resolver maps
# their names to nothing, so they never connect.
origin = f"http://127.0.0.1:{port}"
page_urls, own_urls, tcp = set(), set(), set()
for log in ("receipt-user.netlog", "receipt-user.dom.netlog", "receipt-operator.netlog",
            "receipt-operator.dom.netlog", "docs.netlog", "docs.dom.netlog"):
    text = open(f"{scratch}/{log}.json").read().rstrip().rstrip(",")
    if not text.endswith("}"):
        text += "]}"
    data = json.loads(text)
    types = {v: k for k, v in data["constants"]["logEventTypes"].items()}
    sources = {v: k for k, v in data["constants"]["logSourceType"].items()}
    for ev in data.get("events", []):
        p = ev.get("params") or {}
        kind, source = types.get(ev["type"], ""), sources.get(ev["source"]["type"], "")
        if kind == "URL_REQUEST_START_JOB" and "url" in p:
            if p.get("initiator", "").startswith(origin) or p["url"].startswith(origin + "/"):
                page_urls.add(p["url"])
            else:
                own_urls.add(p["url"])
        if kind.startswith("TCP_CONNECT") or (kind == "SOCKET_CONNECT" and "UDP" not in source):
            for a in [p.get("address")] + list(p.get("address_list") or []):
                if a:
                    tcp.add(a)
outside = sorted(u for u in page_urls if not u.startswith(origin + "/"))
far = sorted(a for a in tcp if not a.startswith("127.0.0.1:"))
print(f"receipt_pages: net log: {len(page_urls)} page requests, {len(outside)} outside {origin}; "
      f"{len(tcp)} TCP peers, {len(far)} not 127.0.0.1; {len(own_urls)} browser background "
      f"requests to {sorted({u.split('/')[2] for u in own_urls})} (no connection)")
if outside or far:
    sys.exit(f"receipt_pages: FAILED: requests left the machine: {outside} {far}")
print("receipt_pages: ok")
EOF
echo "receipt_pages: screenshots ${out#"$root"/}/receipt-user.png, ${out#"$root"/}/receipt-operator.png, ${out#"$root"/}/docs.png"
