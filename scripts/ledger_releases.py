#!/usr/bin/env python3
"""Issue 8's lifetime check against a running `dprec serve`: N admin retrains in a row,
then, for every user with ratings, how many releases the user took part in and what the
ledger says was spent (user level and rating level). Prints one summary table.

Usage: scripts/ledger_releases.py BASE_URL ADMIN_KEY [RELEASES [SAMPLE]]   (docs/LEDGER.md)
The per-user check reads every SAMPLE-th user of 1..943 (default 1: all of them; the
audit takes 0.01-0.02 s per user since migration 11, ~2.4 s before, when the recorded run
used 47).
Standard library only.
"""
import json
import sys
import time
import urllib.request


def call(base, key, method, path):
    req = urllib.request.Request(base + path, method=method,
                                 headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def retrain(base, key):
    started = time.time()
    job = call(base, key, "POST", "/v1/admin/retrain")
    while job["status"] == "running":
        time.sleep(0.5)
        job = call(base, key, "GET", f"/v1/admin/jobs/{job['id']}")
    return job, time.time() - started


def main():
    base, key = sys.argv[1], sys.argv[2]
    releases = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    for n in range(1, releases + 1):
        job, secs = retrain(base, key)
        print(f"release {n}: {job['status']} (release {job.get('release_id')}, "
              f"{secs:.1f} s){'' if job['status'] == 'succeeded' else ': ' + str(job.get('reason'))}")
    users, offset = [], 0
    # Users are listed by the admin audit of each user; the import names users 1..943.
    sample = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    user_ids = [str(u) for u in range(1, 944, sample)]
    took_part, user_eps, rating_spent, rating_eps, left = [], [], [], [], []
    for u in user_ids:
        a = call(base, key, "GET", f"/v1/users/{u}/budget?limit=1000")
        took_part.append(a["releases"]["total"])
        user_eps.append(a["spent"]["eps"] or 0.0)
        left.append(a["spent"]["releases_left"])
        for r in a["ratings"]["entries"]:
            rating_spent.append(r["spent"])
            rating_eps.append(r["eps"])
        users.append(u)
    full = sum(1 for t in took_part if t == releases)
    print(f"users: {len(users)}; took part in all {releases} releases: {full}; "
          f"fewest releases: {min(took_part)}")
    print(f"user-level eps spent (delta_u): max {max(user_eps):.3f}, "
          f"mean {sum(user_eps) / len(user_eps):.3f}; "
          f"releases left (min over users): {min(x for x in left if x is not None)}")
    over = sum(1 for s, e in zip(rating_spent, rating_eps) if s > e)
    print(f"ratings: {len(rating_spent)}; spent max {max(rating_spent):.3f} of eps_ij "
          f"{max(rating_eps):.3f}; mean {sum(rating_spent) / len(rating_spent):.3f}; "
          f"over eps_ij: {over}")


if __name__ == "__main__":
    main()
