#!/usr/bin/env python3
"""Issue 23's end-to-end replay: MovieLens-100K `u.data` replayed by time into a running
`dprec serve`, one release per period, and the next period's users asked for their
top-10 lists.

The ratings are ordered by timestamp and cut into PERIODS equal-width time periods (as
`crates/dprec-lab/examples/continual_bench.rs` does). For t = 1..PERIODS: the ratings of period t are sent
(POST /v1/ratings, service-default eps_ij), one release is run (POST /v1/admin/retrain,
waited for), and every user who rates in period t + 1 with at least one rating >= 4 asks
for `GET /v1/users/{user}/recommendations?n=10`. Relevant = the user's period-(t + 1)
ratings >= 4 on items the user had not rated before (the service excludes rated items
from lists itself). NDCG@10 and P@10 are averaged over users within a period, then over
the periods that have such users. One line per period goes to --csv.

Usage: scripts/continual_replay.py BASE_URL ADMIN_KEY U_DATA PERIODS [--csv FILE]
Standard library only. Run by scripts/continual_replay.sh (crates/dprec-lab/notes/eval-04-continual-release.md).
"""
import json
import math
import sys
import time
import urllib.request


def call(base, key, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{base}{path}", data=data, method=method,
                                 headers={"Authorization": f"Bearer {key}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req) as resp:
        return resp.status, json.loads(resp.read() or b"null")


def release(base, key):
    st, job = call(base, key, "POST", "/v1/admin/retrain", {})
    assert st == 202, job
    while True:
        _, j = call(base, key, "GET", f"/v1/admin/jobs/{job['id']}")
        if j["status"] != "running":
            # A refused release (operator safety: its DP total fell short of the served
            # one's) leaves the previous release served, as in production.
            if j["status"] not in ("succeeded", "refused"):
                raise SystemExit(f"continual_replay: job {j}")
            return j
        time.sleep(0.05)


def periods_of(rows, periods):
    t0 = min(r[3] for r in rows)
    t1 = max(r[3] for r in rows)
    width = (t1 - t0 + 1) / periods
    out = [[] for _ in range(periods)]
    for r in rows:
        out[min(int((r[3] - t0) / width), periods - 1)].append(r)
    return out


def list_metrics(items, relevant):
    hits = [k for k, i in enumerate(items[:10]) if i in relevant]
    dcg = sum(1 / math.log2(k + 2) for k in hits)
    ideal = sum(1 / math.log2(k + 2) for k in range(min(len(relevant), 10)))
    return dcg / ideal, len(hits) / 10


def main():
    args = sys.argv[1:]
    csv = None
    if "--csv" in args:
        k = args.index("--csv")
        csv = open(args[k + 1], "w")
        del args[k:k + 2]
    base, key, path, periods = args[0], args[1], args[2], int(args[3])
    rows = []
    for line in open(path):
        u, i, r, ts = line.split("\t")
        rows.append((u, i, float(r), int(ts)))
    rows.sort(key=lambda r: r[3])
    items = sorted({r[1] for r in rows}, key=int)
    for k in range(0, len(items), 1000):
        st, body = call(base, key, "POST", "/v1/admin/items", {"items": items[k:k + 1000]})
        assert st == 200, body
    cut = periods_of(rows, periods)
    seen = {}
    if csv:
        print("period,users,ndcg10,p10,release_id,status", file=csv)
    per_period = []
    refused = 0
    for t in range(periods):
        batch = [{"user": u, "item": i, "rating": r} for (u, i, r, _) in cut[t]]
        for k in range(0, len(batch), 5000):
            st, body = call(base, key, "POST", "/v1/ratings", {"ratings": batch[k:k + 5000]})
            assert st == 200, body
        for (u, i, _, _) in cut[t]:
            seen.setdefault(u, set()).add(i)
        job = release(base, key)
        refused += job["status"] == "refused"
        if t + 1 == periods:
            break
        relevant = {}
        for (u, i, r, _) in cut[t + 1]:
            if r >= 4 and i not in seen.get(u, ()):
                relevant.setdefault(u, set()).add(i)
        g = p = 0.0
        for u, rel in relevant.items():
            _, answer = call(base, key, "GET", f"/v1/users/{u}/recommendations?n=10")
            gu, pu = list_metrics([x["item"] for x in answer["items"]], rel)
            g, p = g + gu, p + pu
        n = len(relevant)
        if n:
            per_period.append((g / n, p / n))
        if csv:
            print(f"{t + 1},{n},{g / n if n else ''},{p / n if n else ''},{job['release_id']},{job['status']}",
                  file=csv, flush=True)
    m = len(per_period)
    print(f"periods {periods}: NDCG@10 {sum(x[0] for x in per_period) / m:.4f}, "
          f"P@10 {sum(x[1] for x in per_period) / m:.4f} over {m} periods with users; "
          f"{refused} releases refused (operator safety; the previous one stayed served)")


if __name__ == "__main__":
    main()
