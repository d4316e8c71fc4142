//! The HTML pages (issue 25): a user's privacy receipt and the operator overview; who
//! opens them (the same 403 for every refusal, whether or not the user exists); signed
//! links (one user, expiring, dead once the minting key is revoked or the server secret
//! rotated, not forgeable from the database); escaping of ids; the
//! page's numbers against the audit JSON.

use dprec::api::pages::PageLink;
use dprec::retrain::Hooks;
use serde_json::json;

use crate::api::fake::FakeDp;
use crate::api::helpers::*;
use crate::both_backends;

const EVIL: &str = "<script>alert(1)</script>";

/// `GET path` with `key` as a bearer header (none when empty).
async fn open(app: &TestApp, path: &str, key: &str) -> Raw {
    let mut req = app.client.get(app.url(path));
    if !key.is_empty() {
        req = req.bearer_auth(key);
    }
    app.send(req).await
}

/// A 200 HTML page's text.
async fn page_ok(app: &TestApp, path: &str, key: &str) -> String {
    let r = open(app, path, key).await;
    assert_eq!(r.status, 200, "{path}: {}", r.text);
    assert_eq!(
        r.content_type.as_deref(),
        Some("text/html; charset=utf-8"),
        "{path}"
    );
    r.text
}

/// The text of the element with `id="ID"` (up to the next tag).
fn shown<'a>(html: &'a str, id: &str) -> &'a str {
    let at = html
        .find(&format!("id=\"{id}\">"))
        .unwrap_or_else(|| panic!("no element {id} in {html}"));
    let rest = &html[at + id.len() + 6..];
    &rest[..rest.find('<').unwrap()]
}

/// The item ids of the receipt's rating table, in the page's order.
fn rows(html: &str) -> Vec<String> {
    let table = &html[html.find("id=\"ratings\"").unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    table
        .split("<tr><td><code>")
        .skip(1)
        .map(|r| r[..r.find('<').unwrap()].to_string())
        .collect()
}

/// `POST path` (a link mint) with `key` and `body`; the status and the answer.
async fn mint(app: &TestApp, path: &str, key: &str, body: serde_json::Value) -> (u16, String) {
    let r = app
        .send(app.client.post(app.url(path)).bearer_auth(key).json(&body))
        .await;
    (r.status, r.text)
}

async fn mint_ok(app: &TestApp, path: &str, key: &str, body: serde_json::Value) -> PageLink {
    let (st, text) = mint(app, path, key, body).await;
    assert_eq!(st, 201, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// Two users with ratings, two releases.
async fn two_releases(url: &str) -> TestApp {
    let (t, _) = FakeDp::gaussian(5.0);
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    app.ingest(&[
        ("alice", "a", 4.0, Some(1.0)),
        ("alice", "b", 3.0, Some(3.0)),
        ("alice", "c", 5.0, Some(2.0)),
        ("bob", "a", 2.0, None),
    ])
    .await;
    for _ in 0..2 {
        assert_eq!(app.retrain().await.status, "succeeded");
    }
    app
}

/// A user's token reads the user's page, whose figures are the audit's at the shown
/// precision; every other caller, and any caller about a missing user, gets one 403.
async fn receipt_scopes_and_numbers(url: &str) {
    let app = two_releases(url).await;
    let alice = app.create_key("user", Some("alice")).await.key;
    let html = page_ok(&app, "/v1/users/alice/receipt", &alice).await;
    let audit = app.audit("alice", "").await;
    let s = &audit.spent;
    assert_eq!(
        shown(&html, "remaining-eps"),
        format!("{:.3}", s.remaining_eps.unwrap())
    );
    assert_eq!(
        shown(&html, "filter-eps"),
        format!("{:.3}", s.filter_eps.unwrap())
    );
    assert_eq!(shown(&html, "spent-eps"), format!("{:.3}", s.eps.unwrap()));
    assert_eq!(
        shown(&html, "releases-left"),
        s.releases_left.unwrap().to_string()
    );
    // Both releases, in words, and a point per release on the line.
    for r in &audit.releases.entries {
        assert!(html.contains(&format!("id=\"release-{}\"", r.release_id)));
        assert!(html.contains(&format!(">#{}<", r.release_id)), "{html}");
    }
    assert_eq!(audit.releases.total, 2);
    assert!(!html.contains("<script") && !html.contains("http://"));
    // What the list is made of: the page says what the recommendations answer says.
    let rec = app.recommendations("alice", "n=1").await;
    let said = match (rec.fallback, rec.source.as_str()) {
        (true, _) => "popularity",
        (false, "labels") => "labels",
        _ => "personal",
    };
    assert!(html.contains(&format!("data-source=\"{said}\"")), "{html}");
    // A reader (the curator's backend) reads it too.
    page_ok(&app, "/v1/users/alice/receipt", READER).await;

    let refused = open(&app, "/v1/users/bob/receipt", &alice).await;
    assert_eq!(refused.status, 403, "{}", refused.text);
    let carol = app.create_key("user", Some("carol")).await.key;
    for (path, key) in [
        ("/v1/users/nobody/receipt", alice.as_str()),
        ("/v1/users/nobody/receipt", READER),
        ("/v1/users/carol/receipt", carol.as_str()),
        ("/v1/users/alice/receipt", PUBLIC),
        ("/v1/users/alice/receipt", ""),
        ("/v1/users/alice/receipt", "not-a-key-not-a-key"),
        ("/v1/users/alice/receipt", carol.as_str()),
        ("/v1/users/alice/receipt?link=1.0011223344556677.00", ""),
    ] {
        let r = open(&app, path, key).await;
        assert_eq!(
            (r.status, &r.text),
            (403, &refused.text),
            "{path} with {key:?}"
        );
    }
    app.stop().await;
}
both_backends!(receipt_scopes_and_numbers);

/// A reader mints a link for one user: it opens that user's page without a header, no
/// other page, until it expires or the minting key is revoked.
async fn receipt_links(url: &str) {
    let app = two_releases(url).await;
    let refused = open(&app, "/v1/users/alice/receipt", "").await.text;
    let link = mint_ok(&app, "/v1/users/alice/receipt/links", READER, json!({})).await;
    assert!(link.path.starts_with("/v1/users/alice/receipt?link="));
    let html = page_ok(&app, &link.path, "").await;
    // The page's own links (sort, pages) carry the token.
    let token = link.path.split("link=").nth(1).unwrap();
    assert!(html.contains(&format!("receipt?link={token}&amp;sort=")));
    // Another user's page with alice's link, a tampered link.
    let other = format!("/v1/users/bob/receipt?link={token}");
    let r = open(&app, &other, "").await;
    assert_eq!((r.status, &r.text), (403, &refused));
    let last = token.chars().last().unwrap();
    let flipped = format!(
        "{}{}",
        &link.path[..link.path.len() - 1],
        if last == '0' { '1' } else { '0' }
    );
    assert_eq!(open(&app, &flipped, "").await.status, 403);
    // Who may mint: reader and above, not a user token or a public key.
    let alice = app.create_key("user", Some("alice")).await.key;
    for key in [alice.as_str(), PUBLIC] {
        let (st, _) = mint(&app, "/v1/users/alice/receipt/links", key, json!({})).await;
        assert_eq!(st, 403);
    }
    for ttl in [0, 3601] {
        let (st, body) = mint(
            &app,
            "/v1/users/alice/receipt/links",
            READER,
            json!({"ttl_secs": ttl}),
        )
        .await;
        assert_eq!(st, 422, "{body}");
    }
    // Revoking the minting key kills its links.
    let backend = app.create_key("reader", None).await;
    let link = mint_ok(
        &app,
        "/v1/users/alice/receipt/links",
        &backend.key,
        json!({}),
    )
    .await;
    assert_eq!(link.key_id, backend.stored.id);
    page_ok(&app, &link.path, "").await;
    let (st, _) = app
        .delete(&format!("/v1/admin/keys/{}", backend.stored.id), ADMIN)
        .await;
    assert_eq!(st, 204);
    let r = open(&app, &link.path, "").await;
    assert_eq!((r.status, &r.text), (403, &refused));
    // A one-second link: open now, refused once its expiry has passed.
    let short = mint_ok(
        &app,
        "/v1/users/alice/receipt/links",
        READER,
        json!({"ttl_secs": 1}),
    )
    .await;
    let wait = short.expires_at - dprec::store::now_ms() + 50;
    if wait > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(wait as u64)).await;
    }
    let r = open(&app, &short.path, "").await;
    assert_eq!((r.status, &r.text), (403, &refused));
    app.stop().await;
}
both_backends!(receipt_links);

/// The link secret file of the test settings for `url` (beside a SQLite file; in the
/// temporary directory for a PostgreSQL test database).
fn secret_file(url: &str) -> std::path::PathBuf {
    use dprec::api::pages::secret::LinkSecretSource;
    match LinkSecretSource::of(&settings(url)) {
        LinkSecretSource::File(p) => p,
        other => panic!("{url}: {other:?}"),
    }
}

/// A receipt link as the former code signed it: HMAC-SHA256 keyed by the minting key's
/// SHA-256 alone, which the key table stores (what a reader of a database backup can
/// compute for every key).
fn forged_with_key_hash(user: &str, key_hash: &str, expires_ms: i64) -> String {
    use hmac::{Hmac, Mac};
    let key_id = &key_hash[..16];
    let mut m = Hmac::<sha2::Sha256>::new_from_slice(key_hash.as_bytes()).unwrap();
    m.update(
        format!(
            "dprec page link v1\nreceipt:{}:{user}\n{expires_ms}\n{key_id}",
            user.len()
        )
        .as_bytes(),
    );
    let mac: String = m
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("/v1/users/{user}/receipt?link={expires_ms}.{key_id}.{mac}")
}

/// Issue 44 (2.4): links are signed with a server secret kept out of the database. The
/// secret file is created on first start with mode 0600; a link forged from a stored key
/// hash (a database backup) is refused; a link survives a restart that reads the same
/// file; rotating the secret (`dprec keys rotate-link-secret`) voids every link minted
/// before, in the running server (at its next key reload) and after a restart.
async fn links_need_the_server_secret(url: &str) {
    let file = secret_file(url);
    assert!(!file.exists(), "{}", file.display());
    let app = two_releases(url).await;
    assert!(file.exists(), "created on first start: {}", file.display());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    }
    let refused = open(&app, "/v1/users/alice/receipt", "").await.text;
    let backend = app.create_key("reader", None).await;
    // What a backup holds: the stored key's SHA-256.
    let rows = app.store.api_key_rows().await.unwrap();
    let hash = &rows
        .iter()
        .find(|r| r.hash.starts_with(&backend.stored.id))
        .unwrap()
        .hash;
    let forged = forged_with_key_hash("alice", hash, dprec::store::now_ms() + 600_000);
    let r = open(&app, &forged, "").await;
    assert_eq!((r.status, &r.text), (403, &refused), "a forged link opened");
    let link = mint_ok(
        &app,
        "/v1/users/alice/receipt/links",
        &backend.key,
        json!({"ttl_secs": 3600}),
    )
    .await;
    page_ok(&app, &link.path, "").await;
    app.stop().await;

    // A restart reads the same secret: the link still opens.
    let restart = || async {
        let (t, _) = FakeDp::gaussian(5.0);
        let mut s = settings(url);
        s.scheduler.reload_secs = 1;
        TestApp::spawn(s, t, Hooks::default()).await
    };
    let app = restart().await;
    page_ok(&app, &link.path, "").await;
    let r = open(&app, &forged, "").await;
    assert_eq!(r.status, 403);

    // Rotation: the running server drops the old links at its next reload.
    let before = std::fs::read_to_string(&file).unwrap();
    dprec::cli::keys::rotate_link_secret(&settings(url)).unwrap();
    assert_ne!(std::fs::read_to_string(&file).unwrap(), before);
    let mut status = 200;
    for _ in 0..50 {
        status = open(&app, &link.path, "").await.status;
        if status == 403 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(status, 403, "a link minted before the rotation still opens");
    let fresh = mint_ok(
        &app,
        "/v1/users/alice/receipt/links",
        &backend.key,
        json!({}),
    )
    .await;
    page_ok(&app, &fresh.path, "").await;
    app.stop().await;
    let app = restart().await;
    let r = open(&app, &link.path, "").await;
    assert_eq!((r.status, &r.text), (403, &refused));
    page_ok(&app, &fresh.path, "").await;
    app.stop().await;
}
both_backends!(links_need_the_server_secret);

/// A user id and an item id holding a script tag render as text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_render_escaped() {
    let db = TestDb::new(Kind::Sqlite, "ids_render_escaped")
        .await
        .unwrap();
    let (t, _) = FakeDp::gaussian(5.0);
    let app = TestApp::spawn(settings(&db.url), t, Hooks::default()).await;
    app.ingest(&[(EVIL, EVIL, 4.0, None), ("x", EVIL, 2.0, None)])
        .await;
    assert_eq!(app.retrain().await.status, "succeeded");
    let enc = "%3Cscript%3Ealert%281%29%3C%2Fscript%3E";
    let link = mint_ok(
        &app,
        &format!("/v1/users/{enc}/receipt/links"),
        READER,
        json!({"ttl_secs": 60}),
    )
    .await;
    assert!(link
        .path
        .starts_with(&format!("/v1/users/{enc}/receipt?link=")));
    let html = page_ok(&app, &link.path, "").await;
    assert!(!html.contains("<script"), "{html}");
    let escaped = "&lt;script&gt;alert(1)&lt;/script&gt;";
    assert!(html.contains(&format!("<code id=\"user\">{escaped}</code>")));
    assert!(html.contains(&format!("<td><code>{escaped}</code></td>")));
    app.stop().await;
}

/// Sorting and paging by query parameters, server-side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ratings_sort_and_page() {
    let db = TestDb::new(Kind::Sqlite, "ratings_sort_and_page")
        .await
        .unwrap();
    let app = two_releases(&db.url).await;
    let base = "/v1/users/alice/receipt";
    assert_eq!(rows(&page_ok(&app, base, READER).await), ["a", "b", "c"]);
    let by_eps = page_ok(&app, &format!("{base}?sort=eps&desc=true"), READER).await;
    assert_eq!(rows(&by_eps), ["b", "c", "a"]);
    let second = page_ok(
        &app,
        &format!("{base}?sort=eps&desc=true&limit=1&offset=1"),
        READER,
    )
    .await;
    assert_eq!(rows(&second), ["c"]);
    assert!(second.contains("sort=eps&amp;desc=true&amp;offset=2&amp;limit=1\">next"));
    let r = open(&app, &format!("{base}?sort=nope"), READER).await;
    assert_eq!(r.status, 422, "{}", r.text);
    app.stop().await;
}

/// Item ids that are numbers are listed by value on the page (1, 2, 10, 100), other ids
/// after them; the JSON audit keeps the store's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipt_lists_numeric_items_by_value() {
    let db = TestDb::new(Kind::Sqlite, "receipt_numeric_items")
        .await
        .unwrap();
    let (t, _) = FakeDp::gaussian(5.0);
    let app = TestApp::spawn(settings(&db.url), t, Hooks::default()).await;
    let items = ["100", "2", "x", "10", "1"];
    let ratings: Vec<_> = items.iter().map(|&i| ("dora", i, 3.0, None)).collect();
    app.ingest(&ratings).await;
    let base = "/v1/users/dora/receipt";
    assert_eq!(
        rows(&page_ok(&app, base, READER).await),
        ["1", "2", "10", "100", "x"]
    );
    let desc = page_ok(&app, &format!("{base}?sort=item&desc=true"), READER).await;
    assert_eq!(rows(&desc), ["x", "100", "10", "2", "1"]);
    // Paged in the same order; ties of another column keep it.
    let second = page_ok(&app, &format!("{base}?limit=2&offset=2"), READER).await;
    assert_eq!(rows(&second), ["10", "100"]);
    let by_eps = page_ok(&app, &format!("{base}?sort=eps"), READER).await;
    assert_eq!(rows(&by_eps), ["1", "2", "10", "100", "x"]);
    let json: Vec<String> = app
        .audit("dora", "")
        .await
        .ratings
        .entries
        .into_iter()
        .map(|e| e.item)
        .collect();
    assert_eq!(json, ["1", "10", "100", "2", "x"]);
    app.stop().await;
}

/// Issue 44 (2.3): every paging parameter of the receipt and of the JSON lists is bounded
/// (`0..=api::MAX_OFFSET`); a value outside is refused like a negative one (422 naming
/// the parameter), never wrapped or panicking; the largest accepted offset renders an
/// empty page with sane numbers.
async fn paging_parameters_are_bounded(url: &str) {
    let app = two_releases(url).await;
    let max: i64 = 1_000_000_000; // dprec::api::MAX_OFFSET
    let base = "/v1/users/alice/receipt";
    for (query, field) in [
        ("offset=9223372036854775807", "offset"),
        ("roffset=9223372036854775807", "roffset"),
        ("offset=-1", "offset"),
        (&format!("offset={}", max + 1) as &str, "offset"),
        (&format!("roffset={}", max + 1), "roffset"),
        ("limit=9223372036854775807", "limit"),
    ] {
        let r = open(&app, &format!("{base}?{query}"), READER).await;
        assert_eq!(r.status, 422, "{query}: {}", r.text);
        let p: serde_json::Value = serde_json::from_str(&r.text).unwrap();
        assert_eq!(p["field"], field, "{query}: {}", r.text);
    }
    let html = page_ok(&app, &format!("{base}?offset={max}&roffset={max}"), READER).await;
    assert!(html.contains("3 ratings; showing 3 to 3."), "{html}");
    assert!(!html.contains("showing -"), "{html}");
    assert!(
        html.contains("offset=999999950"),
        "the previous page: {html}"
    );
    for path in [
        "/v1/users/alice/budget",
        "/v1/items",
        "/v1/models",
        "/v1/users/alice/recommendations",
    ] {
        let (st, body) = app
            .get(&format!("{path}?offset=9223372036854775807"), READER)
            .await;
        assert_eq!(
            (st, body["field"].as_str()),
            (422, Some("offset")),
            "{path}: {body}"
        );
        let (st, body) = app.get(&format!("{path}?offset={max}"), READER).await;
        assert_eq!(st, 200, "{path}: {body}");
    }
    app.stop().await;
}

both_backends!(paging_parameters_are_bounded);

/// The overview: admin key or an admin-minted link only; releases, jobs, users by budget
/// left, the configured eval report, links to /docs and /metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overview_is_admin_only() {
    let db = TestDb::new(Kind::Sqlite, "overview_is_admin_only")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    std::fs::write(
        &report,
        r#"{"data":"ml-100k","folds":"predefined","seed":1,"runs":[{"trainer":"dp-topn",
        "label":"dp-topn","params":{},"folds":[],"mean":{"rmse":null,"mae":null,
        "train_seconds":1.0,"precision":0.125,"recall":0.0625,"ndcg":0.1875,
        "coverage":0.5,"mean_popularity":3.0},"std":{}}]}"#,
    )
    .unwrap();
    let mut s = settings(&db.url);
    s.pages.eval_report = Some(report.display().to_string());
    let (t, _) = FakeDp::gaussian(5.0);
    let app = TestApp::spawn(s, t, Hooks::default()).await;
    app.ingest(&[("alice", "a", 4.0, None), ("bob", "a", 2.0, None)])
        .await;
    let job = app.retrain().await;
    let html = page_ok(&app, "/v1/admin/overview", ADMIN).await;
    assert_eq!(shown(&html, "release-count"), "1");
    assert!(html.contains(&format!("<tr><td>{}</td>", job.release_id.unwrap())));
    assert!(html.contains("<code>fake-dp</code>"));
    assert!(html.contains("2 live users"), "{html}");
    // What users are served: the counts are what each user's recommendations answer.
    let mut personal = 0;
    for user in ["alice", "bob"] {
        personal += u32::from(!app.recommendations(user, "n=1").await.fallback);
    }
    assert_eq!(
        shown(&html, "served-personal"),
        personal.to_string(),
        "{html}"
    );
    assert_eq!(
        shown(&html, "served-popularity"),
        (2 - personal).to_string()
    );
    assert!(html.contains("Exact counts, not differentially private: shown to admin keys only"));
    assert!(html.contains("0.1875") && html.contains("0.1250"));
    assert!(html.contains("href=\"/docs\"") && html.contains("href=\"/metrics\""));
    let refused = open(&app, "/v1/admin/overview", READER).await;
    assert_eq!(refused.status, 403);
    let alice = app.create_key("user", Some("alice")).await.key;
    for key in [WRITER, PUBLIC, alice.as_str(), ""] {
        let r = open(&app, "/v1/admin/overview", key).await;
        assert_eq!((r.status, &r.text), (403, &refused.text), "{key}");
    }
    // Links: minted by an admin only; an overview link opens no receipt.
    let (st, _) = mint(&app, "/v1/admin/overview/links", READER, json!({})).await;
    assert_eq!(st, 403);
    let link = mint_ok(&app, "/v1/admin/overview/links", ADMIN, json!({})).await;
    page_ok(&app, &link.path, "").await;
    let token = link.path.split("link=").nth(1).unwrap();
    let r = open(&app, &format!("/v1/users/alice/receipt?link={token}"), "").await;
    assert_eq!(r.status, 403);
    // A receipt link opens no overview.
    let rl = mint_ok(&app, "/v1/users/alice/receipt/links", ADMIN, json!({})).await;
    let token = rl.path.split("link=").nth(1).unwrap();
    let r = open(&app, &format!("/v1/admin/overview?link={token}"), "").await;
    assert_eq!(r.status, 403);
    app.stop().await;
}
