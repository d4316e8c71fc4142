#!/usr/bin/env bash
# The papers' trainers in their papers' settings on MovieLens-100K, folds u1..u5, seed 0
# (docs/EVALUATION.md). Each writes $OUT/<name>.json (per fold, mean, sd, privacy
# charges), $OUT/<name>.svg (RMSE against the swept parameter) and $OUT/<name>.txt (the
# table); OUT is a scratch directory unless DPREC_EVAL_OUT names another. The figures of
# earlier runs: crates/dprec-lab/notes/eval-02-rating-predictors.md.
# Usage:
#   scripts/experiments.sh [--data DIR] [NAME ...]     (default: every experiment)
# Names: pdp-fc pdp-epsm pdp-t gaussian dp-alt blp
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DPREC_ML100K_DIR:-../shared/datasets/ml-100k}
if [[ "${1:-}" == "--data" ]]; then DATA="$2"; shift 2; fi
OUT=${DPREC_EVAL_OUT:-${TMPDIR:-/tmp}/dprec-eval}
mkdir -p "$OUT"
echo "experiments: writing to $OUT" >&2
cargo build --release --quiet
DPREC=${CARGO_TARGET_DIR:-target}/release/dprec
run() { # run NAME TITLE ARGS...
    local name="$1" title="$2"; shift 2
    echo "==> $name: dprec-lab eval $*" >&2
    "$(dirname "$DPREC")/dprec-lab" eval --data "$DATA" --folds predefined --seed 0 --quiet \
        --title "$title" --out "$OUT/$name.json" --plot "$OUT/$name.svg" "$@" \
        | tee "$OUT/$name.txt"
}
PAPER="f_m=0.37,eps_c=0.1,eps_m=0.2,eps_l=1.0"
# The paper's t = mean of the preferences present is data-dependent: only the
# paper-faithful trainer takes it; pdp-pmf runs at its public default t = 0.4.
PAPER_T="$PAPER,threshold=mean"

exp_pdp_fc() { # PDP-PMF paper Table 1 / Fig. 2: fraction of conservative ratings
    run pdp-fc "PDP-PMF vs DP-PMF (eps=0.1) against f_c, ML-100K" \
        --trainer "pdp-pmf:$PAPER" --trainer "paper-pdp-pmf:$PAPER_T" \
        --trainer dp-pmf:eps=0.1 --trainer paper-dp-pmf:eps=0.1 --trainer baseline \
        --sweep f_c=0.1,0.2,0.3,0.4,0.5,0.6
}
exp_pdp_epsm() { # paper Table 3: eps_m varied (f_c = 0.54)
    run pdp-epsm "PDP-PMF against eps_m (f_c=0.54), ML-100K" \
        --trainer "pdp-pmf:f_c=0.54,f_m=0.37,eps_c=0.1,eps_l=1.0" \
        --trainer "paper-pdp-pmf:f_c=0.54,f_m=0.37,eps_c=0.1,eps_l=1.0" \
        --sweep eps_m=0.2,0.4,0.6,0.8
}
exp_pdp_t() { # paper Table 4: sampling threshold t
    run pdp-t "PDP-PMF against the sampling threshold t, ML-100K" \
        --trainer "pdp-pmf:f_c=0.54,f_m=0.37,eps_c=0.1,eps_m=0.2,eps_l=1.0" \
        --trainer "paper-pdp-pmf:f_c=0.54,f_m=0.37,eps_c=0.1,eps_m=0.2,eps_l=1.0" \
        --sweep threshold=0.6,0.7,0.8,1.0
}
exp_gaussian() { # Gaussian-MF paper setting: d=20, delta=0.01, delta_r=1e-5
    run gaussian "Gaussian-MF (paper-faithful) against eps_i, ML-100K" \
        --trainer "paper-gaussian-mf:d=20,delta=0.01,delta_r=0.00001" --trainer baseline \
        --sweep eps_i=0.15,0.25,0.5,1.0
}
exp_dp_alt() { # production trainer against per-rating eps, with non-private references
    run dp-alt "dp-alt (production) against per-rating eps, ML-100K" \
        --trainer dp-alt --trainer baseline --trainer sgd-mf \
        --eps 0.1,0.5,1,2,5
}
exp_blp() { # BLP-MoG-MF paper Fig. 4: RMSE against the local eps, with central DP trainers
    run blp "LDP (client-perturbed) vs central DP against eps, ML-100K" \
        --trainer blp-mog-mf --trainer blp-mog-mf:debias=true \
        --trainer blp-mog-mf:components=1 --trainer blp-mog-mf:mechanism=laplace,components=1 \
        --trainer dp-alt --trainer pdp-pmf --trainer baseline \
        --eps 0.1,0.5,1,2,3
}
ALL=(pdp-fc pdp-epsm pdp-t gaussian dp-alt blp)
for name in "${@:-${ALL[@]}}"; do
    case "$name" in
        pdp-fc) exp_pdp_fc ;; pdp-epsm) exp_pdp_epsm ;; pdp-t) exp_pdp_t ;;
        gaussian) exp_gaussian ;; dp-alt) exp_dp_alt ;; blp) exp_blp ;;
        *) echo "unknown experiment $name (one of: ${ALL[*]})" >&2; exit 2 ;;
    esac
done
