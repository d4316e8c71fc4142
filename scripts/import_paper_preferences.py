#!/usr/bin/env python3
"""Loads a MovieLens-100K training file into a running `dprec serve` with one privacy
preference per rating drawn from the PDP-PMF paper's generator (section 6.1: conservative
with probability 0.54, eps uniform in [0.1, 0.2); moderate with 0.37, uniform in [0.2, 1);
else liberal, 1), so that a served `pdp-pmf` sees the preferences `dprec-lab eval --trainer
pdp-pmf` draws (crates/dprec-lab/notes/eval-02-rating-predictors.md, "The papers' trainers served in the rating-level
mode"). The service spends a share F (budget.share = fraction:F, default 0.1) of eps_ij per
release, and counts a rating in the DP popularity (eps P, default 0.05) when that share is
at least 2P; each rating is sent with eps_ij = (pref + P) / F, so the per-release training
budget the ledger gives it is exactly `pref`.

Registers the catalogue from u.item beside the file first (as `dprec import` does).

Usage: scripts/import_paper_preferences.py BASE_URL KEY TRAIN_FILE [SEED] [F] [P]
Standard library only.
"""
import json
import os
import random
import sys
import urllib.request


def post(base, key, path, body):
    req = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {key}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req) as resp:
        return json.loads(resp.read())


def preference(rng):
    u, w = rng.random(), rng.random()
    if u < 0.54:
        return 0.1 + (0.2 - 0.1) * w
    if u < 0.54 + 0.37:
        return 0.2 + (1.0 - 0.2) * w
    return 1.0


def main():
    base, key, train = sys.argv[1], sys.argv[2], sys.argv[3]
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    share = float(sys.argv[5]) if len(sys.argv) > 5 else 0.1
    pop = float(sys.argv[6]) if len(sys.argv) > 6 else 0.05
    rng = random.Random(seed)
    with open(os.path.join(os.path.dirname(train), "u.item"), encoding="latin-1") as f:
        items = [line.split("|")[0] for line in f if line.strip()]
    for k in range(0, len(items), 5000):
        post(base, key, "/v1/admin/items", {"items": items[k:k + 5000]})
    rows, prefs = [], []
    for line in open(train):
        u, i, r, _ = line.split("\t")
        p = preference(rng)
        prefs.append(p)
        rows.append({"user": u, "item": i, "rating": float(r), "eps": (p + pop) / share})
    for k in range(0, len(rows), 5000):
        post(base, key, "/v1/ratings", {"ratings": rows[k:k + 5000]})
    below = sum(p < 0.4 for p in prefs) / len(prefs)
    print(f"imported {len(rows)} ratings, {len(items)} items; preferences: mean "
          f"{sum(prefs) / len(prefs):.3f}, {100 * below:.1f}% below t = 0.4")


if __name__ == "__main__":
    main()
