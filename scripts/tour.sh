#!/usr/bin/env bash
# The README's tour, run as written: extracts the ```sh block under "## A seven-command
# tour" from README.md and runs it command by command in one shell, as a terminal does
# when the block is pasted, checks every answer, and writes (or checks) the transcript in
# docs/WALKTHROUGH.md.
#
#   scripts/tour.sh [--bin PATH] [--write FILE | --check FILE]
#
# The one substitution: the block's first line (`cargo build --release && export
# PATH=...target/release...`) is run as `export PATH=<dir of --bin>:$PATH`, since CI has
# already built target/debug/dprec with `cargo test` and a release build would add
# minutes. The transcript shows the README's line and says what ran instead. Every
# other line runs unchanged.
#
# Where: in a scratch directory laid out like a clone (`../shared/datasets/ml-100k` is a
# link to $DPREC_ML100K_DIR, default ../shared/datasets/ml-100k from the repository), so
# the tour's files (tour.sqlite, tour.log) never land in the checkout. The block listens
# on port 8080; when `unshare -n` works (root, Linux) the tour runs in a network
# namespace of its own, so another service on the machine's port 8080 does not matter;
# otherwise it runs on the machine and fails at once if 8080 is taken.
#
# What is checked:
# - each step's answer (import count, the job's success, a list of 3 items whose
#   `source` is the one the README's comment on that line names, the audit, /docs as
#   HTML, both links opening their pages);
# - pasting twice: the block runs a second time in the same shell (a reader who pastes
#   it again) and must pass the same checks;
# - a busy port: with port 8080 taken by another listener the block must say so (the
#   service's "Address already in use" and the port) and finish without hanging.
#
# --write FILE   writes the first run's transcript into FILE below its generated-part
#                marker (docs/WALKTHROUGH.md); the hand-written head above it is kept.
# --check FILE   fails when FILE's `$ ` command lines differ from the block's (CI: the
#                page cannot go stale; outputs carry fresh noise and are not compared).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin="$root/target/debug/dprec"
mode=print
file=""
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --write) mode=write; file=$2; shift 2 ;;
        --check) mode=check; file=$2; shift 2 ;;
        --in-namespace) in_ns=1; shift ;;
        *) echo "tour: unknown argument $1" >&2; exit 2 ;;
    esac
done
bin=$(realpath "$bin" 2>/dev/null || echo "$bin")
data=${DPREC_ML100K_DIR:-$root/../shared/datasets/ml-100k}
[ -x "$bin" ] || { echo "tour: no binary at $bin (cargo test builds target/debug/dprec; or --bin)" >&2; exit 2; }
[ -f "$data/u.data" ] || { echo "tour: no MovieLens-100K at $data (DPREC_ML100K_DIR)" >&2; exit 2; }
fail() { echo "tour: FAILED: $*" >&2; exit 1; }

# Own loopback, when the machine allows it: re-run this script inside `unshare -n`.
if [ -z "${in_ns:-}" ] && command -v unshare >/dev/null 2>&1 \
    && unshare -n true 2>/dev/null; then
    args=(--bin "$bin")
    [ "$mode" != print ] && args+=("--$mode" "$file")
    exec unshare -n bash -c 'ip link set lo up 2>/dev/null || ifconfig lo up 2>/dev/null || true; exec bash "$0" "$@"' \
        "$root/scripts/tour.sh" --in-namespace "${args[@]}"
fi

# The block: the lines between the ```sh after the heading and the closing ```.
block=$(awk '/^## A seven-command tour/ {h = 1; next} h && /^```sh$/ {b = 1; next}
             b && /^```$/ {exit} b {print}' README.md)
[ -n "$block" ] || fail "no \`\`\`sh block under \"## A seven-command tour\" in README.md"
first=$(printf '%s\n' "$block" | head -1)
[ "$first" = 'cargo build --release && export PATH="$PWD/target/release:$PATH"' ] \
    || fail "the block's first line is not the build line this script replaces: $first"

# Unset DPREC_* from the caller (the tour runs on the defaults, as a reader's would).
# shellcheck disable=SC2046
unset $(env | grep -o '^DPREC_[A-Z_]*') 2>/dev/null || true
scratch=$(mktemp -d)
trap 'jobs -p | xargs -r kill 2>/dev/null || true; rm -rf "$scratch"' EXIT
mkdir -p "$scratch/clone" "$scratch/shared/datasets" "$scratch/bin"
ln -s "$data" "$scratch/shared/datasets/ml-100k"
ln -s "$bin" "$scratch/bin/dprec"
cd "$scratch/clone"

# The block as complete commands: lines are joined until `bash -n` accepts them, as a
# shell reading pasted lines does.
commands=()
chunk=""
while IFS= read -r line; do
    chunk=${chunk:+$chunk$'\n'}$line
    if bash -n <<<"$chunk" 2>/dev/null && [[ "$chunk" != *\\ ]]; then
        commands+=("$chunk")
        chunk=""
    fi
done <<<"$block"
[ -z "$chunk" ] || fail "the block ends inside a command: $chunk"

# The source the README's comment on the list line names ("source": "popularity").
want_source=$(printf '%s\n' "${commands[@]}" | grep '/recommendations' | grep -Eo '"source": "[a-z]+"' | cut -d'"' -f4 || true)
[ -n "$want_source" ] || fail "the README's list line does not say what the list is (\"source\": \"...\")"

# Checks one command's answer, right after it ran (the service is still up): $1 the
# command, $2 its output. Commands without a check pass.
check_step() {
    local c=$1 out=$2 page link got
    case "$c" in
        *'dprec import'*)
            grep -q 'imported 100000 ratings' <<<"$out" || fail "$run: import: $out" ;;
        *'/v1/admin/retrain'*)
            grep -q '"status":"running"' <<<"$out" || fail "$run: retrain: $out" ;;
        *'/v1/admin/jobs/'*)
            curl -s "$B/v1/admin/jobs/1" -H "Authorization: Bearer $ADMIN" \
                | grep -q '"status":"succeeded"' || fail "$run: job 1 did not succeed" ;;
        *'/recommendations'*)
            [ "$(grep -o '"item":' <<<"$out" | wc -l)" -eq 3 ] || fail "$run: user 1's list: $out"
            got=$(grep -Eo '"source":"[a-z]+"' <<<"$out" | cut -d'"' -f4)
            [ "$got" = "$want_source" ] \
                || fail "$run: user 1's list is \"$got\", the README's comment says \"$want_source\": $out"
            list_source=$got ;;
        *'/budget'*)
            grep -q '"releases_left"' <<<"$out" || fail "$run: audit: $out" ;;
        *'"$B/docs"'*)
            grep -q '^200 text/html' <<<"$out" || fail "$run: /docs: $out" ;;
        *'/links'*)
            page=$(grep -Eo '"path":"[^"?]+' <<<"$out" | cut -d'"' -f4)
            link=$(grep -Eo '"path":"[^"]+' <<<"$out" | cut -d'"' -f4)
            [ -n "$link" ] || fail "$run: no link: $out"
            curl -s -o /dev/null -w '%{http_code} %{content_type}' "$B$link" | grep -q '^200 text/html' \
                || fail "$run: the link to $page does not open the page" ;;
    esac
}

# Runs the block once in this shell, as pasted; the transcript (`$ command`, `> `
# continuation lines, then the output) goes to $1; with $2 = check, each answer is checked.
paste_block() {
    local transcript=$1 i=0 c out
    : >"$transcript"
    for c in "${commands[@]}"; do
        i=$((i + 1))
        printf '%s\n' "$c" | sed '1s/^/$ /; 2,$s/^/> /' >>"$transcript"
        if [ "$i" -eq 1 ]; then
            export PATH="$scratch/bin:$PATH"
            echo "[tour.sh: the test build instead, export PATH=\"$(dirname "${bin#"$root"/}"):\$PATH\"]" >>"$transcript"
            continue
        fi
        # A background job of the block keeps this shell's stdout: its output is its own.
        eval "$c" >"$scratch/out" 2>&1 </dev/null || true
        out=$(cat "$scratch/out")
        [ -n "$out" ] && printf '%s\n' "$out" >>"$transcript"
        if [ "${2:-}" = check ]; then
            check_step "$c" "$out"
        fi
    done
}

if (exec 3<>/dev/tcp/127.0.0.1/8080) 2>/dev/null; then
    fail "port 8080 is in use (and this machine gives the tour no network namespace of its own): the README's tour needs it"
fi

# 1. The block as pasted; 2. pasted again in the same shell.
for run in "first paste" "second paste"; do
    paste_block "$scratch/$run.txt" check
    echo "tour: $run: every answer checked (user 1's list: source \"$list_source\")"
done

# 3. Port 8080 taken by another listener (one that answers HTTP, as a forgotten service
# would): the block must name the problem and finish.
python3 -m http.server 8080 --bind 127.0.0.1 >/dev/null 2>&1 &
squatter=$!
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/8080) 2>/dev/null && break; sleep 0.1; done
run="busy port"
SECONDS=0
paste_block "$scratch/busy.txt"
kill "$squatter" 2>/dev/null || true
wait "$squatter" 2>/dev/null || true
grep -q 'dprec serve stopped:' "$scratch/busy.txt" && grep -qi 'address already in use' "$scratch/busy.txt" \
    && grep -q '8080' "$scratch/busy.txt" \
    || { cat "$scratch/busy.txt" >&2; fail "with port 8080 taken the block did not say so"; }
[ "$SECONDS" -lt 120 ] || fail "with port 8080 taken the block took $SECONDS s"
echo "tour: busy port: the block says \"$(grep -i 'address already in use' "$scratch/busy.txt" | head -1 | cut -c1-120)\" and ends in $SECONDS s"

transcript="$scratch/first paste.txt"
case "$mode" in
    print) cat "$transcript" ;;
    write)
        marker='<!-- Generated by scripts/tour.sh --write docs/WALKTHROUGH.md: do not edit by hand. -->'
        {
            echo "$marker"
            echo "Run on $(date -u +%F) with \`${bin#"$root"/}\` ($(nproc) cores)."
            echo
            echo '```text'
            cat "$transcript"
            echo '```'
        } >"$scratch/part"
        # Keep the page's hand-written head (everything above the marker), replace the rest.
        target="$root/$file"
        [[ "$file" = /* ]] && target=$file
        if [ -f "$target" ] && grep -q '^<!-- Generated by scripts/' "$target"; then
            sed '/^<!-- Generated by scripts\//,$d' "$target" >"$scratch/head"
            cat "$scratch/head" "$scratch/part" >"$target"
        else
            cp "$scratch/part" "$target"
        fi
        echo "tour: wrote $file"
        ;;
    check)
        target="$root/$file"
        [[ "$file" = /* ]] && target=$file
        grep -E '^(\$|>) ' "$transcript" >"$scratch/ran"
        sed -n '/^<!-- Generated by scripts\/tour.sh/,$p' "$target" | grep -E '^(\$|>) ' >"$scratch/doc" || true
        diff -u "$scratch/doc" "$scratch/ran" \
            || fail "$file's commands are not the README's block: run scripts/tour.sh --write $file"
        echo "tour: $file shows the README's block (every answer checked)"
        ;;
esac
