#!/usr/bin/env python3
"""Issue 13's end-to-end check: the top-10 lists a running `dprec serve` gives every user
of a MovieLens-100K test fold, scored like `dprec-lab eval` scores them (relevant = held-out
ratings >= 4, rated items excluded, users with a relevant item): precision, recall and
NDCG at 10, and catalogue coverage. Import the fold's training file first, e.g.
`dprec import --url B --api-key KEY ../shared/datasets/ml-100k/u1.base`, then retrain.

Usage: scripts/service_ndcg.py BASE_URL KEY TEST_FILE   (scripts/served_topn.sh)
Standard library only.
"""
import json
import math
import sys
import urllib.request


def main():
    base, key, test_file = sys.argv[1], sys.argv[2], sys.argv[3]
    relevant = {}
    for line in open(test_file):
        u, i, r, _ = line.split("\t")
        if float(r) >= 4:
            relevant.setdefault(u, set()).add(i)
    p = r = g = 0.0
    listed, fallback = set(), 0
    for u, rel in relevant.items():
        req = urllib.request.Request(f"{base}/v1/users/{u}/recommendations?n=10",
                                     headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req) as resp:
            answer = json.loads(resp.read())
        items = [x["item"] for x in answer["items"]]
        fallback += answer["fallback"]
        hits = [k for k, i in enumerate(items[:10]) if i in rel]
        p += len(hits) / 10
        r += len(hits) / len(rel)
        dcg = sum(1 / math.log2(k + 2) for k in hits)
        ideal = sum(1 / math.log2(k + 2) for k in range(min(len(rel), 10)))
        g += dcg / ideal
        listed.update(items)
    n = len(relevant)
    print(f"users {n}: precision@10 {p / n:.4f}, recall@10 {r / n:.4f}, NDCG@10 {g / n:.4f}, "
          f"distinct items listed {len(listed)}, popularity fallbacks {fallback}")


if __name__ == "__main__":
    main()
