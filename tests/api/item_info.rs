//! Public item information in the catalogue: titles and labels registered with the items
//! (`POST /v1/admin/items` objects, `dprec import` from MovieLens files), kept by the
//! store on both backends, listed by `GET /v1/items`. Plain ids behave as before.

use dprec::model::catalogue::ItemInfo;
use dprec::retrain::Hooks;
use dprec::store::{Registered, Store};
use serde_json::{json, Value};

use crate::api::fake::FakeDp;
use crate::api::helpers::*;
use crate::both_backends;

fn info(id: &str, title: Option<&str>, labels: &[&str]) -> ItemInfo {
    ItemInfo {
        id: id.into(),
        title: title.map(str::to_string),
        labels: labels.iter().map(|l| l.to_string()).collect(),
    }
}

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The store: new items with information, updates counted only when something changed,
/// a plain id never touches known information, an info without title or labels clears
/// them, and the reads give what was written (non-ASCII text, batches over a chunk).
async fn store_keeps_item_info(url: &str) {
    let store = Store::connect(url, 4).await.unwrap();
    assert_eq!(store.register_items(&ids(&["a", "b"])).await.unwrap(), 2);
    let toy = info("a", Some("Toy Story (1995)"), &["Animation", "Comedy"]);
    let cafe = info("c", Some("Café « noir », 1 (1993)"), &["Drame", "Ü"]);
    let r = store
        .register_item_info(&ids(&["b", "d"]), &[toy.clone(), cafe.clone()])
        .await
        .unwrap();
    assert_eq!(
        r,
        Registered {
            created: 2,
            updated: 1
        },
        "c and d are new, a got information, b is known"
    );
    let all = store.catalogue_info().await.unwrap();
    assert_eq!(
        all,
        [
            toy.clone(),
            ItemInfo::plain("b"),
            cafe.clone(),
            ItemInfo::plain("d")
        ]
    );
    // The same again: nothing new, nothing changed.
    let r = store
        .register_item_info(&[], &[toy.clone(), cafe.clone()])
        .await
        .unwrap();
    assert_eq!(r, Registered::default());
    // Plain ids leave the information alone, whichever way they come.
    assert_eq!(store.register_items(&ids(&["a", "c"])).await.unwrap(), 0);
    let r = store.register_item_info(&ids(&["a"]), &[]).await.unwrap();
    assert_eq!(r, Registered::default());
    assert_eq!(store.catalogue_info().await.unwrap(), all);
    // An info replaces the known one (labels reordered is a change); one without title
    // and labels clears them; an id both plain and with info gets the info.
    let toy2 = info("a", Some("Toy Story (1995)"), &["Comedy", "Animation"]);
    let r = store
        .register_item_info(&ids(&["c"]), &[toy2.clone(), ItemInfo::plain("c")])
        .await
        .unwrap();
    assert_eq!((r.created, r.updated), (0, 2));
    let (page, total) = store.catalogue_page(2, 0).await.unwrap();
    assert_eq!((page, total), (vec![toy2.clone(), ItemInfo::plain("b")], 4));
    let (page, _) = store.catalogue_page(10, 2).await.unwrap();
    assert_eq!(page, [ItemInfo::plain("c"), ItemInfo::plain("d")]);
    // Of two infos for one id the last counts.
    let last = info("e", None, &["x"]);
    let r = store
        .register_item_info(&[], &[info("e", Some("first"), &[]), last.clone()])
        .await
        .unwrap();
    assert_eq!((r.created, r.updated), (1, 0));
    // More items than one statement holds.
    let many: Vec<ItemInfo> = (0..450)
        .map(|k| {
            info(
                &format!("m{k:03}"),
                Some(&format!("Movie {k} (2001)")),
                &["L"],
            )
        })
        .collect();
    let r = store.register_item_info(&[], &many).await.unwrap();
    assert_eq!((r.created, r.updated), (450, 0));
    let mut changed = many.clone();
    for m in changed.iter_mut().step_by(3) {
        m.labels.push("M".into());
    }
    let r = store.register_item_info(&[], &changed).await.unwrap();
    assert_eq!((r.created, r.updated), (0, 150));
    let all = store.catalogue_info().await.unwrap();
    assert_eq!(all.len(), 455);
    assert_eq!(&all[..2], [toy2, ItemInfo::plain("b")]);
    assert_eq!(all[4], last);
    assert_eq!(all[5..], changed[..]);
}
both_backends!(store_keeps_item_info);

async fn register(app: &TestApp, body: Value) -> (u16, Value) {
    app.post("/v1/admin/items", WRITER, &body).await
}

/// The endpoints: objects beside plain ids, `updated` counted, `details` aligned with
/// `items` in `GET /v1/items`; each limit a 422 naming the field; a refused batch stores
/// nothing.
async fn item_info_endpoints(url: &str) {
    let app = TestApp::try_spawn(topn_settings(url), None, Hooks::default())
        .await
        .unwrap();
    // Plain ids as before: no `details` information, `updated` 0.
    let (st, r) = register(&app, json!({"items": ["b", "a", "a"]})).await;
    assert_eq!(
        (st, r),
        (200, json!({"accepted": 2, "created": 2, "updated": 0}))
    );
    let (st, r) = register(
        &app,
        json!({"items": [
            "b",
            {"id": "a", "title": "Toy Story (1995)", "labels": ["Animation", "Comedy"]},
            {"id": "c", "labels": ["Drama"]},
            {"id": "d", "title": "Heat (1995)"},
            {"id": "e"},
        ]}),
    )
    .await;
    assert_eq!(
        (st, r),
        (200, json!({"accepted": 5, "created": 3, "updated": 1}))
    );
    let (st, page) = app.get("/v1/items", PUBLIC).await;
    assert_eq!(st, 200, "{page}");
    assert_eq!(page["items"], json!(["a", "b", "c", "d", "e"]));
    assert_eq!(
        page["details"],
        json!([
            {"id": "a", "title": "Toy Story (1995)", "labels": ["Animation", "Comedy"]},
            {"id": "b", "labels": []},
            {"id": "c", "labels": ["Drama"]},
            {"id": "d", "title": "Heat (1995)", "labels": []},
            {"id": "e", "labels": []},
        ])
    );
    // Re-registering: a plain id keeps the information, an object replaces it.
    let (_, r) = register(
        &app,
        json!({"items": ["a", {"id": "c", "title": "Heat (1995)", "labels": ["Crime"]}, {"id": "d", "title": "Heat (1995)"}]}),
    )
    .await;
    assert_eq!(r, json!({"accepted": 3, "created": 0, "updated": 1}));
    let (_, page) = app.get("/v1/items?limit=2&offset=2", READER).await;
    assert_eq!(page["items"], json!(["c", "d"]));
    assert_eq!(
        page["details"][0],
        json!({"id": "c", "title": "Heat (1995)", "labels": ["Crime"]})
    );
    let (_, page) = app.get("/v1/items?limit=1", PUBLIC).await;
    assert_eq!(page["details"][0]["labels"], json!(["Animation", "Comedy"]));

    let before = app.store.catalogue_info().await.unwrap();
    let long = |n: usize| "x".repeat(n);
    let many: Vec<String> = (0..33).map(|k| format!("l{k}")).collect();
    let ok = json!({"id": "z", "title": "T", "labels": ["L"]});
    for (item, field, words) in [
        (json!({"id": "", "title": "T"}), "items[1].id", "empty"),
        (json!({"id": " z"}), "items[1].id", "whitespace"),
        (
            json!({"id": "z", "title": long(201)}),
            "items[1].title",
            "at most 200 characters",
        ),
        (json!({"id": "z", "title": ""}), "items[1].title", "empty"),
        (
            json!({"id": "z", "title": "a\nb"}),
            "items[1].title",
            "control",
        ),
        (
            json!({"id": "z", "title": "T "}),
            "items[1].title",
            "whitespace",
        ),
        (
            json!({"id": "z", "labels": many}),
            "items[1].labels",
            "at most 32 labels",
        ),
        (
            json!({"id": "z", "labels": ["a", "b", ""]}),
            "items[1].labels[2]",
            "empty",
        ),
        (
            json!({"id": "z", "labels": ["a", long(65)]}),
            "items[1].labels[1]",
            "at most 64",
        ),
        (
            json!({"id": "z", "labels": ["a", "b\u{7}"]}),
            "items[1].labels[1]",
            "control",
        ),
        (
            json!({"id": "z", "labels": [" a"]}),
            "items[1].labels[0]",
            "whitespace",
        ),
        (
            json!({"id": "z", "labels": ["a", "b", "a"]}),
            "items[1].labels[2]",
            "repeated",
        ),
        (
            json!({"id": "z", "labels": "Drama"}),
            "items[1].labels",
            "expected an array",
        ),
        (
            json!({"id": "z", "labels": ["a", 7]}),
            "items[1].labels[1]",
            "string",
        ),
        (
            json!({"id": "z", "genre": "x"}),
            "items[1].genre",
            "unknown field",
        ),
        (json!({"title": "T"}), "items[1]", "missing field `id`"),
        (json!(7), "items[1]", "an item id (a string) or an object"),
    ] {
        let body = json!({"items": [ok.clone(), item.clone()]});
        let (st, p) = register(&app, body).await;
        assert_eq!((st, p["field"].as_str()), (422, Some(field)), "{item}: {p}");
        let detail = p["detail"].as_str().unwrap();
        assert!(detail.contains(words), "{item}: {detail}");
    }
    // Limits are characters, not bytes: 200 two-byte letters and 64-letter labels pass.
    let (st, r) = register(
        &app,
        json!({"items": [{"id": "y", "title": "é".repeat(200), "labels": ["ü".repeat(64)]}]}),
    )
    .await;
    assert_eq!((st, &r["created"]), (200, &json!(1)), "{r}");
    let mut after = app.store.catalogue_info().await.unwrap();
    assert_eq!(after.pop().map(|i| i.id), Some("y".to_string()));
    assert_eq!(after, before, "no refused batch stored anything");
    app.stop().await;
}
both_backends!(item_info_endpoints);

/// Runs `dprec import` on `path` against `app` (at most `limit` ratings), 50 ratings
/// or items per request (the test servers' batch limit).
async fn import(app: &TestApp, path: std::path::PathBuf, limit: Option<usize>) {
    let args = dprec::cli::import::ImportArgs {
        url: app.base.clone(),
        api_key: Some(WRITER.into()),
        eps: None,
        batch: 50,
        limit,
        path,
    };
    tokio::task::spawn_blocking(move || dprec::cli::import::run(args))
        .await
        .unwrap()
        .unwrap();
}

/// `dprec import` registers titles and genres from `u.item` (Latin-1, named by
/// `u.genre`) and from `movies.csv` (quoted titles, no-genre marker); importing again
/// changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_registers_titles_and_genres() {
    let db = TestDb::new(Kind::Sqlite, "import_info").await.unwrap();
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(settings(&db.url), t, Hooks::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("u.data"), "1\t1\t4\t881250001\n2\t2\t3\t881250002\n").unwrap();
    std::fs::write(d.join("u.genre"), "unknown|0\nAction|1\nComedy|2\n\n").unwrap();
    std::fs::write(
        d.join("u.item"),
        b"1|Toy Story (1995)|01-Jan-1995||u|0|0|1\n2|Mis\xe9rables, Les (1995)|x||u|0|1|1\n3|unknown||||1|0|0\n",
    )
    .unwrap();
    import(&app, d.join("u.data"), None).await;
    let want = [
        info("1", Some("Toy Story (1995)"), &["Comedy"]),
        info("2", Some("Misérables, Les (1995)"), &["Action", "Comedy"]),
        info("3", Some("unknown"), &[]),
    ];
    assert_eq!(app.store.catalogue_info().await.unwrap(), want);
    import(&app, d.join("u.data"), None).await;
    assert_eq!(app.store.catalogue_info().await.unwrap(), want);
    assert_eq!(app.store.counts().await.unwrap().ratings, 2);

    let latest = tempfile::tempdir().unwrap();
    let l = latest.path();
    std::fs::write(
        l.join("ratings.csv"),
        "userId,movieId,rating,timestamp\n1,11,4.5,1\n",
    )
    .unwrap();
    std::fs::write(
        l.join("movies.csv"),
        "movieId,title,genres\n11,\"American President, The (1995)\",Comedy|Drama|Romance\n\
         12,Hyena Road,(no genres listed)\n",
    )
    .unwrap();
    import(&app, l.join("ratings.csv"), None).await;
    let (_, page) = app.get("/v1/items", PUBLIC).await;
    assert_eq!(page["items"], json!(["1", "11", "12", "2", "3"]));
    assert_eq!(
        json!(page["details"].as_array().unwrap()[1..3]),
        json!([
            {"id": "11", "title": "American President, The (1995)", "labels": ["Comedy", "Drama", "Romance"]},
            {"id": "12", "title": "Hyena Road", "labels": []},
        ])
    );
    app.stop().await;
}

/// The MovieLens-100K catalogue as `dprec import` registers it: 1,682 titled items, the
/// genres of `u.item` as labels, Latin-1 titles decoded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_registers_the_ml100k_catalogue() {
    let Some(dir) =
        crate::common::ml100k_dir("api::item_info::import_registers_the_ml100k_catalogue")
    else {
        return;
    };
    let db = TestDb::new(Kind::Sqlite, "import_ml100k_info")
        .await
        .unwrap();
    let (t, _) = FakeDp::gaussian(20.0);
    let app = TestApp::spawn(settings(&db.url), t, Hooks::default()).await;
    import(&app, dir.join("u1.base"), Some(500)).await;
    let all = app.store.catalogue_info().await.unwrap();
    assert_eq!(all.len(), 1682);
    assert!(all.iter().all(|i| i.title.is_some()));
    let by_id = |id: &str| all.iter().find(|i| i.id == id).unwrap().clone();
    assert_eq!(
        by_id("1"),
        info(
            "1",
            Some("Toy Story (1995)"),
            &["Animation", "Children's", "Comedy"]
        )
    );
    assert_eq!(
        by_id("543").title.as_deref(),
        Some("Misérables, Les (1995)")
    );
    assert_eq!(by_id("543").year(), Some(1995));
    // Item 267 is "unknown" with the genre of no genre: no label; every other item has one.
    let unlabelled: Vec<String> = all
        .iter()
        .filter(|i| i.labels.is_empty())
        .map(|i| i.id.clone())
        .collect();
    assert!(unlabelled.contains(&"267".to_string()), "{unlabelled:?}");
    assert!(unlabelled.len() <= 2, "{unlabelled:?}");
    let labels: usize = all.iter().map(|i| i.labels.len()).sum();
    eprintln!(
        "ml-100k catalogue: {} items, {labels} labels, unlabelled {unlabelled:?}",
        all.len()
    );
    app.stop().await;
}
