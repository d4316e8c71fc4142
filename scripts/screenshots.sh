#!/usr/bin/env bash
# Retakes the screenshots of the pages a person reads, in docs/figures/screens/: a user's
# privacy receipt (receipt-user.png), the operator overview (receipt-operator.png) and
# the API documentation page /docs (docs.png), from headless Chromium against a fresh
# service on MovieLens-100K after two releases. It is scripts/receipt_pages.sh, which
# also checks the pages' figures against the audit JSON and that no request leaves the
# machine; see docs/RECEIPT.md.
#
#   scripts/screenshots.sh [--bin PATH]   (default: target/release/dprec if built, else
#                                          target/debug/dprec)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/dprec
[ -x "$bin" ] || bin=target/debug/dprec
if [ "${1:-}" = --bin ]; then bin=$2; fi
exec bash scripts/receipt_pages.sh --bin "$bin" --out docs/figures/screens
