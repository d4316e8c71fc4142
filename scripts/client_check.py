"""Runs a short exchange through a client generated from openapi/openapi.json.

Called by scripts/client_check.sh with the generated package `dprec_client` on
PYTHONPATH and a server at $DPREC_URL. Nothing here is edited to suit the generated code:
every call goes through the generated functions and models, and a status the spec does
not document raises (raise_on_unexpected_status=True).
"""

import os
import random
import sys
import time

from dprec_client import AuthenticatedClient, Client
from dprec_client.api.admin import get_job, retrain
from dprec_client.api.items import list_items, register_items
from dprec_client.api.models import current_model, list_models
from dprec_client.api.ops import healthz, readyz
from dprec_client.api.pages import mint_overview_link, mint_receipt_link, receipt_page
from dprec_client.api.ratings import ingest
from dprec_client.api.recommendations import recommendations, similar_items
from dprec_client.api.users import audit, get_settings
from dprec_client.models import (
    Audit,
    CurrentModel,
    Health,
    IngestResult,
    ItemBatch,
    ItemInput,
    Job,
    Problem,
    RatingBatch,
    RatingIn,
    Ready,
    RegisterResult,
    Catalogue,
    Recommendations,
    PageLink,
    RatingSort,
    ReleaseList,
    RetrainRequest,
)

URL = os.environ["DPREC_URL"]
ADMIN = os.environ["DPREC_ADMIN_KEY"]
READER = os.environ["DPREC_READER_KEY"]


def client(key):
    return AuthenticatedClient(base_url=URL, token=key, raise_on_unexpected_status=True)


def expect(resp, status, kind):
    assert resp.status_code == status, (resp.status_code, resp.content)
    assert isinstance(resp.parsed, kind), (type(resp.parsed), resp.content)
    return resp.parsed


def wait(admin, job):
    """Polls a retrain job until it is no longer running."""
    deadline = time.time() + 120
    while job.status == "running":
        assert time.time() < deadline, "retrain did not finish in 120 s"
        time.sleep(0.2)
        job = expect(get_job.sync_detailed(job.id, client=admin), 200, Job)
    return job


def probes():
    anon = Client(base_url=URL, raise_on_unexpected_status=True)
    assert expect(healthz.sync_detailed(client=anon), 200, Health).status == "ok"
    assert expect(readyz.sync_detailed(client=anon), 200, Ready).backend == "sqlite"


ITEMS = [f"i{i}" for i in range(40)]


def register_catalogue(admin, reader):
    """The public catalogue first: ratings never create items."""
    r = expect(register_items.sync_detailed(client=admin, body=ItemBatch(items=ITEMS)), 200, RegisterResult)
    assert r.accepted == len(ITEMS), r
    # An item's public information: an object beside plain ids.
    info = ItemInput(id=ITEMS[0], title="Toy Story (1995)", labels=["Animation", "Comedy"])
    r = expect(register_items.sync_detailed(client=admin, body=ItemBatch(items=[info, ITEMS[1]])), 200, RegisterResult)
    assert (r.created, r.updated) == (0, 1), r
    cat = expect(list_items.sync_detailed(client=reader, limit=100), 200, Catalogue)
    assert cat.total == len(ITEMS) and cat.items == sorted(ITEMS), cat
    first = next(d for d in cat.details if d.id == ITEMS[0])
    assert (first.title, first.labels) == (info.title, info.labels), first
    print(f"catalogue: {cat.total} items registered, one with a title and labels")


def ingest_ratings(admin):
    """1,000 users x 40 items (about half rated), seeded, default eps, batches of 1,000."""
    rng = random.Random(11)
    ratings = [
        RatingIn(user=f"u{u}", item=item, rating=float(rng.randint(1, 5)))
        for u in range(1000)
        for item in ITEMS
        if rng.random() < 0.5
    ]
    for k in range(0, len(ratings), 1000):
        batch = ratings[k : k + 1000]
        r = expect(ingest.sync_detailed(client=admin, body=RatingBatch(ratings=batch)), 200, IngestResult)
        assert r.accepted == len(batch)
    print(f"ingested {len(ratings)} ratings")


def main():
    admin, reader = client(ADMIN), client(READER)
    probes()
    register_catalogue(admin, reader)
    ingest_ratings(admin)

    # Error cases come back as Problem documents with the documented status.
    bad = RatingBatch(ratings=[RatingIn(user="u1", item="i1", rating=4.0), RatingIn(user="u1", item="i2", rating=9.0)])
    p = expect(ingest.sync_detailed(client=admin, body=bad), 422, Problem)
    assert p.field == "ratings[1].rating", p
    p = expect(ingest.sync_detailed(client=reader, body=bad), 403, Problem)
    p = expect(list_models.sync_detailed(client=client("not-a-key-not-a-key")), 401, Problem)
    p = expect(retrain.sync_detailed(client=reader), 403, Problem)
    p = expect(audit.sync_detailed("u1", client=reader, limit=0), 422, Problem)
    assert p.field == "limit", p
    p = expect(recommendations.sync_detailed("u1", client=reader, n=3), 503, Problem)
    p = expect(get_job.sync_detailed(99999, client=admin), 404, Problem)
    p = expect(current_model.sync_detailed(client=reader), 404, Problem)
    print("error cases: 401, 403, 404, 422, 503 decoded as Problem")

    # Retrain (no body: the defaults) and poll the job.
    job = wait(admin, expect(retrain.sync_detailed(client=admin), 202, Job))
    assert job.status == "succeeded", job
    print(f"job {job.id}: {job.status}, release {job.release_id}")

    rec = expect(recommendations.sync_detailed("u1", client=reader, n=5), 200, Recommendations)
    assert rec.model_version == job.release_id and len(rec.items) == 5, rec
    new = expect(recommendations.sync_detailed("newcomer", client=reader, n=5), 200, Recommendations)
    assert new.fallback and new.source == "popularity", new
    sim = similar_items.sync_detailed("i1", client=reader, n=3)
    assert sim.status_code == 200, sim.content
    a = expect(audit.sync_detailed("u1", client=reader, limit=5), 200, Audit)
    assert a.releases.total == 1 and len(a.releases.entries) == 1, a
    entry = a.releases.entries[0]
    assert len(entry.mechanisms) >= 1 and len(entry.events) >= 1, entry
    assert a.ratings.entries[0].spent > 0, a.ratings.entries[0]
    s = get_settings.sync_detailed("u1", client=reader)
    assert s.status_code == 200
    models = expect(list_models.sync_detailed(client=reader), 200, ReleaseList)
    assert len(models.releases) == 1 and len(models.releases[0].mechanisms) >= 1
    cur = expect(current_model.sync_detailed(client=reader), 200, CurrentModel)
    assert cur.release.id == job.release_id
    print(
        f"recommendations for u1: {[i.item for i in rec.items]} (model {rec.model_version}); "
        f"audit: {a.releases.total} release, {len(entry.events)} RDP events; "
        f"models: {len(models.releases)}"
    )
    # The receipt page (HTML) with every query parameter, and the signed links.
    page = receipt_page.sync_detailed("u1", client=reader, sort=RatingSort.EPS, desc=True, limit=5, offset=0, roffset=0)
    assert page.status_code == 200 and b"Your privacy receipt" in page.content, page.content[:200]
    link = expect(mint_receipt_link.sync_detailed("u1", client=reader), 201, PageLink)
    assert link.path.startswith("/v1/users/u1/receipt?link="), link
    expect(mint_overview_link.sync_detailed(client=reader), 403, Problem)
    assert expect(mint_overview_link.sync_detailed(client=admin), 201, PageLink).path.startswith("/v1/admin/overview?link=")
    print("pages: receipt (sort=eps, desc), receipt and overview links")
    # A retrain with the optional body (operator safety: force past the input rule).
    forced = wait(admin, expect(retrain.sync_detailed(client=admin, body=RetrainRequest(force=True)), 202, Job))
    assert forced.status == "succeeded" and forced.release_id > job.release_id, forced
    print(f"job {forced.id} (force=True): {forced.status}, release {forced.release_id}")
    print("client check passed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"client check FAILED: {e!r}", file=sys.stderr)
        raise
