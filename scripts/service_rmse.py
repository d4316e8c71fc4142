#!/usr/bin/env python3
"""The served rating predictor end to end: RMSE of the predicted ratings a running
`dprec serve` gives for every (user, item) of a MovieLens-100K test fold, from
`GET /v1/users/{user}/predictions` (each user's items in one request), scored like
`dprec eval` scores them. Import the fold's training file first, e.g.
`dprec import --url B --api-key KEY ../shared/datasets/ml-100k/u1.base`, then retrain.

Usage: scripts/service_rmse.py BASE_URL KEY TEST_FILE   (docs/EVALUATION.md)
Standard library only.
"""
import json
import math
import sys
import time
import urllib.request


def main():
    base, key, test_file = sys.argv[1], sys.argv[2], sys.argv[3]
    by_user = {}
    for line in open(test_file):
        u, i, r, _ = line.split("\t")
        by_user.setdefault(u, []).append((i, float(r)))
    se, n, times = 0.0, 0, []
    for u, rows in by_user.items():
        items = ",".join(i for i, _ in rows)
        req = urllib.request.Request(f"{base}/v1/users/{u}/predictions?items={items}",
                                     headers={"Authorization": f"Bearer {key}"})
        start = time.perf_counter()
        with urllib.request.urlopen(req) as resp:
            answer = json.loads(resp.read())
        times.append(time.perf_counter() - start)
        for (i, r), p in zip(rows, answer["predictions"]):
            assert p["item"] == i, (p, i)
            se += (p["rating"] - r) ** 2
            n += 1
    times.sort()
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    print(f"ratings {n}, users {len(by_user)}: RMSE {math.sqrt(se / n):.4f}; "
          f"request p50 {1000 * times[len(times) // 2]:.2f} ms, p99 {1000 * p99:.2f} ms")


if __name__ == "__main__":
    main()
