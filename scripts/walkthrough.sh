#!/usr/bin/env bash
# The README's seven-command tour, run for real: start a fresh service (SQLite in a
# scratch directory, real keys), import MovieLens-100K, retrain, ask for a user's
# recommendations with that user's own token, read the user's budget audit, open the docs.
# Every command is echoed with `$ ` and its output follows, so the transcript in
# docs/WALKTHROUGH.md is this script's output, not hand-written text.
#
#   scripts/walkthrough.sh [--bin PATH] [--write FILE | --check FILE]
#
# It reads MovieLens-100K at ../shared/datasets/ml-100k, as the README's tour does.
#
# --write FILE   writes the transcript to FILE (docs/WALKTHROUGH.md's generated part).
# --check FILE   fails when FILE's `$ ` command lines differ from the ones run (CI: the
#                doc cannot go stale; the outputs carry fresh noise and are not compared).
# Every step's answer is also checked (status codes, shapes), so a broken tour fails.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin="$root/target/release/dprec"
data="$root/../shared/datasets/ml-100k"
mode=print
file=""
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --write) mode=write; file=$2; shift 2 ;;
        --check) mode=check; file=$2; shift 2 ;;
        *) echo "walkthrough: unknown argument $1" >&2; exit 2 ;;
    esac
done
bin=$(realpath "$bin" 2>/dev/null || echo "$bin")
[ -x "$bin" ] || { echo "walkthrough: no binary at $bin (cargo build --release, or --bin)" >&2; exit 2; }
[ -f "$data/u.data" ] || { echo "walkthrough: no MovieLens-100K at $data" >&2; exit 2; }

# shellcheck source=lib/service.sh
. "$root/scripts/lib/service.sh"
scratch_setup
transcript="$scratch/transcript.txt"

# The tour's commands call `dprec`; this puts the chosen binary first on PATH.
mkdir -p "$scratch/bin"
ln -s "$bin" "$scratch/bin/dprec"
export PATH="$scratch/bin:$PATH"
export DATABASE_URL="sqlite://$scratch/dprec.sqlite"

# Runs one tour command in this shell (so assignments stay): echoes it, runs it, keeps
# both in the transcript; its output is left in $out for the checks.
step() {
    printf '$ %s\n' "$1" >>"$transcript"
    eval "$1" >"$scratch/last" 2>&1 || true
    cat "$scratch/last" >>"$transcript"
    out=$(cat "$scratch/last")
}
fail() { echo "walkthrough: FAILED: $*" >&2; exit 1; }

# Start-up (not part of the tour's seven commands, shown for completeness).
dprec serve --bind 127.0.0.1:0 2>"$scratch/serve.log" &
server=$!
port=$(wait_for_port "$scratch/serve.log")
[ -n "$port" ] || fail "the service did not start: $(cat "$scratch/serve.log")"
export B="http://127.0.0.1:$port"
ADMIN=$(grep -Eo 'dprec_[0-9a-f]{64}' "$scratch/serve.log" | head -1)
[ -n "$ADMIN" ] || fail "no admin key printed on the first start"
export ADMIN

{
    echo '$ dprec serve 2> serve.log &   # first start: prints the admin key once on stderr'
    echo '$ ADMIN=$(grep -Eo '"'"'dprec_[0-9a-f]{64}'"'"' serve.log); B=http://127.0.0.1:8080'
} >>"$transcript"

step 'dprec import --url "$B" --api-key "$ADMIN" ../shared/datasets/ml-100k 2>&1 | tail -2'
echo "$out" | grep -q 'imported 100000 ratings' || fail "import: $out"

step 'JOB=$(curl -s -X POST "$B/v1/admin/retrain" -H "Authorization: Bearer $ADMIN" | grep -Eo '"'"'"id":[0-9]+'"'"' | head -1 | cut -d: -f2); echo "job $JOB"'
[ -n "${JOB:-}" ] || fail "retrain: $out"
for _ in $(seq 600); do
    curl -s "$B/v1/admin/jobs/$JOB" -H "Authorization: Bearer $ADMIN" | grep -q '"status":"running"' || break
    sleep 0.5
done
step 'curl -s "$B/v1/admin/jobs/$JOB" -H "Authorization: Bearer $ADMIN"; echo'
echo "$out" | grep -q '"status":"succeeded"' || fail "job: $out"

step 'USER_TOKEN=$(curl -s -X POST "$B/v1/admin/keys" -H "Authorization: Bearer $ADMIN" -H "Content-Type: application/json" -d '"'"'{"role": "user", "user": "1"}'"'"' | grep -Eo '"'"'dprec_[0-9a-f]{64}'"'"'); echo "user 1 token: ${USER_TOKEN:0:12}..."'
[ -n "${USER_TOKEN:-}" ] || fail "user token: $out"
step 'curl -s "$B/v1/users/1/recommendations?n=3" -H "Authorization: Bearer $USER_TOKEN"; echo'
echo "$out" | grep -q '"items":\[{"item"' || fail "recommendations: $out"
step 'curl -s -o /dev/null -w "%{http_code}\n" "$B/v1/users/2/recommendations?n=3" -H "Authorization: Bearer $USER_TOKEN"'
echo "$out" | tail -1 | grep -qx 403 || fail "another user's list must be 403: $out"

step 'curl -s "$B/v1/users/1/budget?limit=1" -H "Authorization: Bearer $USER_TOKEN" | cut -c1-300; echo'
echo "$out" | grep -q '"releases_left"' || fail "audit: $out"

step 'curl -s -o /dev/null -w "%{http_code} %{content_type}\n" "$B/docs"'
echo "$out" | tail -1 | grep -q '^200 text/html' || fail "docs: $out"

step 'curl -s -X POST "$B/v1/users/1/receipt/links" -H "Authorization: Bearer $ADMIN"; echo'
RECEIPT=$(echo "$out" | grep -Eo '/v1/users/1/receipt\?link=[0-9a-f.]+') || fail "receipt link: $out"
curl -s -o /dev/null -w '%{http_code} %{content_type}' "$B$RECEIPT" | grep -q '^200 text/html' \
    || fail "the receipt link does not open the page"
step 'curl -s -X POST "$B/v1/admin/overview/links" -H "Authorization: Bearer $ADMIN"; echo'
OVERVIEW=$(echo "$out" | grep -Eo '/v1/admin/overview\?link=[0-9a-f.]+') || fail "overview link: $out"
curl -s -o /dev/null -w '%{http_code} %{content_type}' "$B$OVERVIEW" | grep -q '^200 text/html' \
    || fail "the overview link does not open the page"

case "$mode" in
    print) cat "$transcript" ;;
    write)
        {
            echo '<!-- Generated by scripts/walkthrough.sh --write docs/WALKTHROUGH.md: do not edit by hand. -->'
            echo "Run on $(date -u +%F) with \`${bin#"$root"/}\` ($(nproc) cores)."
            echo
            echo '```text'
            cat "$transcript"
            echo '```'
        } >"$file.part"
        # Keep the page's hand-written head (everything above the marker), replace the rest.
        if [ -f "$file" ] && grep -q '^<!-- Generated by scripts/walkthrough.sh' "$file"; then
            sed '/^<!-- Generated by scripts\/walkthrough.sh/,$d' "$file" >"$file.head"
            cat "$file.head" "$file.part" >"$file"
            rm -f "$file.head"
        else
            mv "$file.part" "$file"
        fi
        rm -f "$file.part"
        echo "walkthrough: wrote $file"
        ;;
    check)
        grep '^\$ ' "$transcript" >"$scratch/ran"
        sed -n '/^<!-- Generated by scripts\/walkthrough.sh/,$p' "$file" | grep '^\$ ' >"$scratch/doc" || true
        diff -u "$scratch/doc" "$scratch/ran" \
            || fail "$file's commands differ from the tour's: run scripts/walkthrough.sh --write $file"
        echo "walkthrough: $file matches the tour (commands ok, every answer checked)"
        ;;
esac
