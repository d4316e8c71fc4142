#!/usr/bin/env python3
"""Golden test vectors for dprec's accountant, computed with Google's dp_accounting.

Writes tests/data/accountant_vectors.json (or the path given as argv[1]): for each
case, the events in dprec's PrivacyEvent JSON format, the RDP curve that
dp_accounting's RdpAccountant computes on dprec's order grid (the same grid as
dp_accounting's DEFAULT_RDP_ORDERS), eps at several deltas and delta at several
eps, each with the optimal order.

Run it through scripts/accountant_vectors.sh, which sets up the virtualenv.
"""

import json
import math
import platform
import sys
from importlib import metadata

from absl import logging as absl_logging
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024]
assert [float(a) for a in ORDERS] == [float(a) for a in rdp_lib.DEFAULT_RDP_ORDERS]
DELTAS = [1e-5, 1e-6, 1e-3]


def to_dp_event(e):
    """dprec PrivacyEvent (dict) -> dp_accounting DpEvent."""
    m = e["mechanism"]
    count = e.get("count", 1)
    if m == "gaussian":
        inner = dp_event.GaussianDpEvent(e["noise_multiplier"])
    elif m == "poisson_subsampled_gaussian":
        inner = dp_event.PoissonSampledDpEvent(
            e["sampling_rate"], dp_event.GaussianDpEvent(e["noise_multiplier"])
        )
    elif m == "laplace":
        inner = dp_event.LaplaceDpEvent(e["scale"])
    elif m == "composed":
        return dp_event.ComposedDpEvent([to_dp_event(x) for x in e["events"]])
    else:
        raise ValueError(f"no dp_accounting counterpart for {m}")
    return dp_event.SelfComposedDpEvent(inner, count)


def g(sigma, count):
    return {"mechanism": "gaussian", "noise_multiplier": sigma, "count": count}


def sg(q, sigma, count):
    return {
        "mechanism": "poisson_subsampled_gaussian",
        "sampling_rate": q,
        "noise_multiplier": sigma,
        "count": count,
    }


def lap(scale, count):
    return {"mechanism": "laplace", "scale": scale, "count": count}


def cases():
    out = []
    for sigma, steps in [(0.8, 1), (1.0, 10), (2.0, 100), (5.0, 1000), (10.0, 50)]:
        out.append((f"gaussian sigma={sigma} steps={steps}", [g(sigma, steps)]))
    for q in [0.01, 0.1, 0.5, 1.0]:
        for sigma, steps in [(0.7, 100), (1.1, 1000), (3.0, 500), (10.0, 10000)]:
            out.append((f"subsampled q={q} sigma={sigma} steps={steps}", [sg(q, sigma, steps)]))
    for q, sigma, steps in [(0.001, 1.0, 100000), (0.05, 2.0, 2000), (0.25, 0.9, 20)]:
        out.append((f"subsampled q={q} sigma={sigma} steps={steps}", [sg(q, sigma, steps)]))
    for scale, steps in [(0.5, 1), (1.0, 5), (2.0, 10), (10.0, 100), (0.1, 3)]:
        out.append((f"laplace scale={scale} steps={steps}", [lap(scale, steps)]))
    out.append(("composition gaussian + subsampled", [g(4.0, 20), sg(0.01, 1.1, 1000)]))
    out.append(
        (
            "composition subsampled + laplace + gaussian",
            [sg(0.1, 2.0, 300), lap(5.0, 4), g(8.0, 10)],
        )
    )
    out.append(
        (
            "composition nested",
            [
                {"mechanism": "composed", "events": [g(3.0, 5), lap(2.0, 2)]},
                sg(0.5, 3.0, 10),
                {"mechanism": "composed", "events": [sg(0.01, 0.7, 50)]},
            ],
        )
    )
    return out


def num(x):
    """JSON number, with null for +inf (dprec's convention)."""
    x = float(x)
    if math.isinf(x) and x > 0:
        return None
    if not math.isfinite(x):
        raise ValueError(f"unexpected value {x}")
    return x


def main():
    # dp_accounting logs one warning per fractional order whose series does not
    # converge; those orders are +inf (null) in the output and counted below.
    absl_logging.set_verbosity(absl_logging.ERROR)
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/data/accountant_vectors.json"
    out_cases = []
    for name, events in cases():
        acc = rdp_lib.RdpAccountant(orders=ORDERS)
        acc.compose(dp_event.ComposedDpEvent([to_dp_event(e) for e in events]))
        rdp = acc._rdp  # the composed curve, aligned with ORDERS
        eps_rows = []
        for delta in DELTAS:
            eps, order = rdp_lib.compute_epsilon(ORDERS, rdp, delta)
            eps_rows.append({"delta": delta, "eps": num(eps), "best_order": num(order)})
        eps_ref = eps_rows[0]["eps"]
        targets = sorted({round(eps_ref * f, 6) for f in (0.5, 1.0, 2.0)} | {1.0})
        delta_rows = []
        for eps in targets:
            delta, order = rdp_lib.compute_delta(ORDERS, rdp, eps)
            delta_rows.append({"eps": eps, "delta": num(delta), "best_order": num(order)})
        out_cases.append(
            {
                "name": name,
                "events": events,
                "rdp": [num(r) for r in rdp],
                "eps_for_delta": eps_rows,
                "delta_for_eps": delta_rows,
            }
        )
    doc = {
        "generator": "scripts/accountant_vectors.sh (scripts/accountant_vectors.py)",
        "dp_accounting_version": metadata.version("dp-accounting"),
        "numpy_version": metadata.version("numpy"),
        "scipy_version": metadata.version("scipy"),
        "python_version": platform.python_version(),
        "note": "rdp computed by dp_accounting.rdp.RdpAccountant on `orders`; "
        "eps/delta by rdp_privacy_accountant.compute_epsilon/compute_delta; "
        "null means +inf (order excluded, e.g. fractional-order series did not converge)",
        "orders": [float(a) for a in ORDERS],
        "cases": out_cases,
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, allow_nan=False)
        f.write("\n")
    n_values = sum(
        len(c["rdp"]) + len(c["eps_for_delta"]) + len(c["delta_for_eps"]) for c in out_cases
    )
    n_inf = sum(r is None for c in out_cases for r in c["rdp"])
    print(
        f"wrote {path}: {len(out_cases)} cases, {n_values} values ({n_inf} RDP values +inf), "
        f"dp-accounting {doc['dp_accounting_version']}"
    )


if __name__ == "__main__":
    main()
