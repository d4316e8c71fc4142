#!/usr/bin/env bash
# Side-by-side benchmark: dprec vs Python's Surprise on MovieLens-100K (predefined folds u1..u5).
# Not part of CI. See bench/README.md.
#
# Usage: bench/compare.sh [--data DIR] [--out FILE.md] [--surprise-only]
#   --data DIR        MovieLens-100K directory (default: $DPREC_ML100K_DIR, else
#                     ../shared/datasets/ml-100k relative to the repo root)
#   --out FILE        markdown table to write (default: bench/out/compare.md)
#   --surprise-only   run only the Surprise half (no cargo build, no dprec runs)
# Environment:
#   DPREC_ML100K_DIR  default for --data
#   DPREC_BIN         use this dprec-lab binary instead of building target/release/dprec-lab
#   CARGO_TARGET_DIR  honoured when locating the release binary
#   RAYON_NUM_THREADS passed through to dprec (recorded in the table's notes)
#
# Everything Surprise and dprec write goes to bench/out/ (gitignored).
set -euo pipefail

# ---------------------------------------------------------------------------
# dprec configurations. The tuned ones are placeholders: adjust them here.
# Space separated key=value pairs, each passed as `--param key=value`.
# Surprise SVD(n_factors=20) settings, for an equal-settings row (Surprise: lr_all=0.005,
# reg_all=0.02, init_std_dev=0.1, no learning-rate decay).
SGD_EQUAL="d=20 epochs=20 lr=0.005 reg=0.02 reg_bias=0.02 init_sd=0.1 lr_decay=1"
# dprec's sgd-mf defaults (tuned on u1..u5 mean RMSE, see crates/dprec-lab/notes/eval-01-calibration-and-nonprivate.md).
SGD_TUNED="d=100 epochs=40 lr=0.005 reg=0.06 reg_bias=0.02 lr_decay=0.99"
# dprec's als-mf defaults (ALS-WR weighting).
ALS_TUNED="d=20 epochs=15 reg=0.1"
# Speed-oriented settings: fewer passes at the same or better accuracy than SVD(n_factors=20).
SGD_FAST="d=20 epochs=10 lr=0.01 reg=0.02 reg_bias=0.02 lr_decay=1"
ALS_FAST="d=10 epochs=3 reg=0.1"
SEED=0
# Pinned so that every run of this benchmark measures the same Surprise.
SURPRISE_VERSION="1.1.5"
# ---------------------------------------------------------------------------

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BENCH_DIR="$REPO_ROOT/bench"
VENV="$BENCH_DIR/.venv"
OUT_DIR="$BENCH_DIR/out"

DATA_DIR="${DPREC_ML100K_DIR:-$REPO_ROOT/../shared/datasets/ml-100k}"
OUT_MD="$OUT_DIR/compare.md"
SURPRISE_ONLY=0

die() { echo "compare.sh: error: $*" >&2; exit 1; }
step() { echo; echo "==> $*" >&2; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --data) [[ $# -ge 2 ]] || die "--data needs a directory"; DATA_DIR="$2"; shift 2 ;;
        --out) [[ $# -ge 2 ]] || die "--out needs a file"; OUT_MD="$2"; shift 2 ;;
        --surprise-only) SURPRISE_ONLY=1; shift ;;
        -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

for f in u1 u2 u3 u4 u5; do
    [[ -f "$DATA_DIR/$f.base" && -f "$DATA_DIR/$f.test" ]] \
        || die "MovieLens-100K fold $f not found in '$DATA_DIR'. Pass --data DIR or set DPREC_ML100K_DIR."
done
DATA_DIR="$(cd "$DATA_DIR" && pwd)"
mkdir -p "$OUT_DIR"

# --- 1. Python venv with Surprise ------------------------------------------
# scikit-surprise 1.1.5 ships a manylinux wheel for CPython 3.11 built against
# numpy 2, so no `numpy<2` pin is needed (checked on 2026-11-21: numpy 2.4.6
# works). A Surprise build compiled against numpy 1.x headers (older releases,
# or a source build on a Python without a wheel) fails to import under numpy 2
# ("numpy.dtype size changed, may indicate binary incompatibility"); only in
# that case the fallback below pins `numpy<2`, which such a build needs.
if [[ ! -x "$VENV/bin/python" ]]; then
    step "creating venv at $VENV"
    python3 -m venv "$VENV" || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
fi
PY="$VENV/bin/python"
SURPRISE_IMPORT="import surprise.prediction_algorithms.matrix_factorization"
if ! "$PY" -c "import surprise, sys; sys.exit(surprise.__version__ != '$SURPRISE_VERSION')" 2>/dev/null; then
    step "installing scikit-surprise==$SURPRISE_VERSION into $VENV"
    "$PY" -m pip install --quiet --upgrade pip
    "$PY" -m pip install --quiet "scikit-surprise==$SURPRISE_VERSION" || die "pip install scikit-surprise failed"
fi
if ! "$PY" -c "$SURPRISE_IMPORT" 2>/dev/null; then
    step "Surprise does not import with this numpy; pinning numpy<2"
    "$PY" -m pip install --quiet "numpy<2" || die "pip install 'numpy<2' failed"
    "$PY" -c "$SURPRISE_IMPORT" || die "Surprise still does not import; see the error above"
fi
"$PY" -m pip freeze 2>/dev/null | grep -Ei '^(scikit-surprise|numpy)==' >&2 || true

# --- 2. Build dprec -----------------------------------------------------------
if [[ -n "${DPREC_BIN:-}" ]]; then
    DPREC="$DPREC_BIN"
    [[ "$SURPRISE_ONLY" -eq 1 || -x "$DPREC" ]] || die "DPREC_BIN=$DPREC is not an executable"
elif [[ "$SURPRISE_ONLY" -eq 0 ]]; then
    DPREC="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/dprec-lab"
    step "cargo build --release"
    (cd "$REPO_ROOT" && cargo build --release) || die "cargo build --release failed"
    [[ -x "$DPREC" ]] || die "$DPREC missing after the build"
fi

# --- 3. Surprise benchmark ------------------------------------------------------
SURPRISE_JSON="$OUT_DIR/surprise.json"
step "Surprise: SVD(n_factors=20), SVD() default, BaselineOnly() on u1..u5"
"$PY" "$BENCH_DIR/surprise_compare.py" --data "$DATA_DIR" --out "$SURPRISE_JSON" \
    || die "Surprise benchmark failed"

# --- 4. dprec on the same folds -----------------------------------------------
TABLE_ARGS=(--surprise "$SURPRISE_JSON")
FAILED=()
run_dprec() {  # run_dprec NAME TRAINER "k=v k=v ..."
    local name="$1" trainer="$2" params="$3" out="$OUT_DIR/dprec-$1.json" p
    local args=(eval --data "$DATA_DIR" --folds predefined --trainer "$trainer" --seed "$SEED" --out "$out")
    for p in $params; do args+=(--param "$p"); done
    step "dprec $name: ${args[*]}"
    rm -f "$out"
    if "$DPREC" "${args[@]}"; then
        TABLE_ARGS+=(--dprec "$name=$out")
    else
        # Keep going: the table still shows Surprise and the other dprec rows.
        echo "compare.sh: warning: dprec $name failed; its row is left out" >&2
        TABLE_ARGS+=(--note "dprec $name (${args[*]}) failed; no row.")
        FAILED+=("$name")
    fi
}
if [[ "$SURPRISE_ONLY" -eq 0 ]]; then
    run_dprec baseline baseline ""
    run_dprec sgd-equal sgd-mf "$SGD_EQUAL"
    run_dprec sgd-tuned sgd-mf "$SGD_TUNED"
    run_dprec als-tuned als-mf "$ALS_TUNED"
    run_dprec sgd-fast sgd-mf "$SGD_FAST"
    run_dprec als-fast als-mf "$ALS_FAST"
else
    TABLE_ARGS+=(--note "run with --surprise-only: no dprec rows.")
fi

# --- 5. Side-by-side table ------------------------------------------------------
step "side-by-side table"
TABLE_ARGS+=(--note "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)")
TABLE_ARGS+=(--note "RAYON_NUM_THREADS=${RAYON_NUM_THREADS:-unset} (Surprise trains on one thread)")
"$PY" "$BENCH_DIR/table.py" "${TABLE_ARGS[@]}" --out "$OUT_MD"

if [[ ${#FAILED[@]} -gt 0 ]]; then
    die "dprec run(s) failed: ${FAILED[*]} (the table above has no row for them)"
fi
