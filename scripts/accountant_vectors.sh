#!/usr/bin/env bash
# Regenerates tests/data/accountant_vectors.json from Google's dp_accounting.
#
#   scripts/accountant_vectors.sh            # uses/creates ./.venv (gitignored)
#   DP_ACCOUNTING_VERSION=0.6.0 scripts/accountant_vectors.sh
#
# The venv location can be overridden with VENV=/path/to/venv.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$root/.venv}"
version="${DP_ACCOUNTING_VERSION:-0.6.0}"

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet "dp-accounting==$version"

mkdir -p "$root/tests/data"
cd "$root"
"$venv/bin/python" scripts/accountant_vectors.py tests/data/accountant_vectors.json
