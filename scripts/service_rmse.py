#!/usr/bin/env python3
"""The served rating predictor end to end: RMSE of the predicted ratings a running
`dprec serve` gives for every (user, item) of a MovieLens-100K test fold, from
`GET /v1/users/{user}/predictions` (each user's items in one request), scored like
`dprec-lab eval` scores them. Import the fold's training file first, e.g.
`dprec import --url B --api-key KEY ../shared/datasets/ml-100k/u1.base`, then retrain.

With --passes N (default 0) the same requests are sent N more times after the scored
pass, over one kept-alive connection, and the request latency of those passes is
printed too: the first pass solves each user's side, the later ones find it cached
(issue 21's "p99 <= 5 ms, solve cached per user").

Usage: scripts/service_rmse.py BASE_URL KEY TEST_FILE [--passes N]   (scripts/served_rmse.sh)
Standard library only.
"""
import http.client
import json
import math
import sys
import time
import urllib.parse


def percentiles(times):
    times = sorted(times)
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    return 1000 * times[len(times) // 2], 1000 * p99


def main():
    args = sys.argv[1:]
    passes = 0
    if "--passes" in args:
        k = args.index("--passes")
        passes = int(args[k + 1])
        del args[k:k + 2]
    base, key, test_file = args
    by_user = {}
    for line in open(test_file):
        u, i, r, _ = line.split("\t")
        by_user.setdefault(u, []).append((i, float(r)))
    url = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port)
    headers = {"Authorization": f"Bearer {key}"}

    def ask(u, rows):
        items = ",".join(i for i, _ in rows)
        start = time.perf_counter()
        conn.request("GET", f"/v1/users/{u}/predictions?items={items}", headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        took = time.perf_counter() - start
        assert resp.status == 200, (resp.status, body[:200])
        return json.loads(body), took

    se, n, times = 0.0, 0, []
    for u, rows in by_user.items():
        answer, took = ask(u, rows)
        times.append(took)
        for (i, r), p in zip(rows, answer["predictions"]):
            assert p["item"] == i, (p, i)
            se += (p["rating"] - r) ** 2
            n += 1
    p50, p99 = percentiles(times)
    print(f"ratings {n}, users {len(by_user)}: RMSE {math.sqrt(se / n):.4f}; "
          f"request p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    if passes:
        cached = [ask(u, rows)[1] for _ in range(passes) for u, rows in by_user.items()]
        p50, p99 = percentiles(cached)
        print(f"{passes} more passes ({len(cached)} requests, solves cached): "
              f"request p50 {p50:.2f} ms, p99 {p99:.2f} ms")


if __name__ == "__main__":
    main()
