//! The DP neighbourhood model served end to end (issue 10): `dpsgd-nbm` is stored with
//! its release and served from its published DP weights and the asking user's own
//! ratings; personal items carry explanations naming only that user's own items (which
//! follow a new rating without a retrain); similar items come from the DP item-item
//! weights; a restarted service answers the same.

use std::collections::{BTreeMap, HashSet};

use dprec::serve::StoredModel;

use crate::api::helpers::*;
use crate::both_backends;

/// Two tastes over 16 items: even users rate `a0..a7` 5 and one `b` item 1, odd users
/// the other way round; 4 + 1 items per user. Deterministic (an LCG).
fn ratings(n_users: usize) -> Vec<(String, String, f64)> {
    tastes(0x9e37_79b9_7f4a_7c15, n_users, 8, 4, false, 1.0).train
}

fn nbm_settings(url: &str) -> dprec::config::Settings {
    let mut s = settings(url);
    s.trainer.name = "dpsgd-nbm".into();
    s.budget.default_user_eps = 10.0;
    s.budget.share = "fraction:1".parse().unwrap();
    s.trainer.params = BTreeMap::from([
        ("eps".to_string(), "5".to_string()),
        ("steps".to_string(), "50".to_string()),
        ("q".to_string(), "0.2".to_string()),
    ]);
    s
}

async fn spawn_trained(url: &str) -> TestApp {
    let app = TestApp::try_spawn(nbm_settings(url), None, Default::default())
        .await
        .unwrap();
    let rows = ratings(120);
    let rows: Vec<(&str, &str, f64, Option<f64>)> = rows
        .iter()
        .map(|(u, i, v)| (u.as_str(), i.as_str(), *v, Some(10.0)))
        .collect();
    app.ingest(&rows).await;
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    app
}

/// `(item, [(explaining item, contribution)])` of a user's list.
type Explained = Vec<(String, Vec<(String, f64)>)>;

async fn explained(app: &TestApp, user: &str, n: usize) -> (Explained, bool) {
    let rec = app.recommendations(user, &format!("n={n}")).await;
    let list = rec
        .items
        .iter()
        .map(|s| {
            let e = s.explanations.as_ref().map_or_else(Vec::new, |e| {
                e.iter().map(|x| (x.item.clone(), x.contribution)).collect()
            });
            (s.item.clone(), e)
        })
        .collect();
    (list, rec.fallback)
}

/// A dpsgd-nbm release is served from its stored model: every personal item is
/// explained by at most 3 of the asking user's own items, exactly the terms the stored
/// model gives for that user's ratings; a user without ratings gets the release's DP
/// popularity with no explanations; similar items are the stored DP weights.
async fn nbm_release_is_served_with_explanations(url: &str) {
    let app = spawn_trained(url).await;
    let cur = app.current_model().await;
    assert_eq!(cur.release.trainer, "dpsgd-nbm");

    let row = app.store.latest_model().await.unwrap().unwrap();
    let stored: StoredModel = serde_json::from_str(&row.model).unwrap();
    let ranker = stored
        .ranker
        .expect("dpsgd-nbm stores its ranker")
        .into_ranker();
    let items: Vec<String> = serde_json::from_str(&row.items).unwrap();
    let index = |i: &str| items.iter().position(|x| x == i).unwrap();

    let all = ratings(120);
    for user in ["user000", "user001", "user042"] {
        let own_ids: Vec<(String, f64)> = all
            .iter()
            .filter(|(u, _, _)| u == user)
            .map(|(_, i, v)| (i.clone(), *v))
            .collect();
        let own: Vec<(usize, f64)> = own_ids.iter().map(|(i, v)| (index(i), *v)).collect();
        let rated: HashSet<&str> = own_ids.iter().map(|(i, _)| i.as_str()).collect();
        let rec = app.recommendations(user, "n=5").await;
        assert!(!rec.fallback && rec.source == "profile", "{rec:?}");
        assert_eq!(rec.items.len(), 5);
        for s in &rec.items {
            let e = s.explanations.as_ref().expect("nbm explains");
            assert!(!e.is_empty() && e.len() <= 3, "{e:?}");
            assert!(e.iter().all(|x| rated.contains(x.item.as_str())), "{e:?}");
            let want = ranker.explain(&own, index(&s.item)).unwrap();
            let got: Vec<(usize, f64)> =
                e.iter().map(|x| (index(&x.item), x.contribution)).collect();
            assert_eq!(got.len(), want.len(), "{user} {}", s.item);
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    g.0 == w.0 && (g.1 - w.1).abs() < 1e-9,
                    "{got:?} vs {want:?}"
                );
            }
            for x in e {
                let r = own_ids.iter().find(|(i, _)| *i == x.item).unwrap().1;
                assert_eq!(x.rating, r);
            }
            let mut scores = vec![0.0; ranker.n_items()];
            ranker.score_items(None, &own, &mut scores);
            // The same sum up to its order (the store's order of the user's ratings).
            let want = scores[index(&s.item)];
            assert!((s.score - want).abs() < 1e-9, "{} vs {want}", s.score);
        }
    }

    // No ratings: the release's DP popularity, no explanations field at all.
    let (st, raw) = app
        .get("/v1/users/nobody/recommendations?n=3", READER)
        .await;
    assert_eq!(st, 200, "{raw}");
    assert_eq!(raw["fallback"], true);
    assert!(raw["items"]
        .as_array()
        .unwrap()
        .iter()
        .all(|i| i.get("explanations").is_none()));

    // Similar items: the stored DP weights of the item's row.
    let sim = app.similar("a0", 4).await;
    let want: Vec<(String, f64)> = ranker
        .similar(index("a0"), 4)
        .unwrap()
        .1
        .into_iter()
        .map(|(k, w)| (items[k].clone(), w))
        .collect();
    let got: Vec<(String, f64)> = sim
        .items
        .iter()
        .map(|s| (s.item.clone(), s.score))
        .collect();
    assert_eq!(got, want);
    assert_eq!(got.len(), 4);
    assert!(sim.items.iter().all(|s| s.explanations.is_none()));
    app.stop().await;
}
both_backends!(nbm_release_is_served_with_explanations);

/// A newcomer's explanations follow its own ratings without a retrain (one rating: it
/// explains everything; a second rating joins the explanations), and a restarted
/// service answers the same lists and explanations from the stored release.
async fn explanations_follow_own_ratings_and_survive_restart(url: &str) {
    let app = spawn_trained(url).await;
    let (cold, fallback) = explained(&app, "newcomer", 3).await;
    assert!(fallback && cold.iter().all(|(_, e)| e.is_empty()));

    app.ingest(&[("newcomer", "a1", 5.0, None)]).await;
    let (one, fallback) = explained(&app, "newcomer", 3).await;
    assert!(!fallback);
    for (item, e) in &one {
        let names: Vec<&str> = e.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(names, ["a1"], "{item}");
    }
    app.ingest(&[("newcomer", "b2", 1.0, None)]).await;
    let (two, _) = explained(&app, "newcomer", 3).await;
    assert_ne!(two, one);
    for (item, e) in &two {
        let mut names: Vec<&str> = e.iter().map(|x| x.0.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["a1", "b2"], "{item}");
    }
    let before = explained(&app, "user007", 5).await;
    let similar = app.similar("b3", 5).await;
    app.stop().await;

    let again = TestApp::try_spawn(nbm_settings(url), None, Default::default())
        .await
        .unwrap();
    assert_eq!(explained(&again, "user007", 5).await, before);
    assert_eq!(explained(&again, "newcomer", 3).await.0, two);
    let after = again.similar("b3", 5).await;
    assert_eq!(
        after
            .items
            .iter()
            .map(|s| (&s.item, s.score))
            .collect::<Vec<_>>(),
        similar
            .items
            .iter()
            .map(|s| (&s.item, s.score))
            .collect::<Vec<_>>()
    );
    again.stop().await;
}
both_backends!(explanations_follow_own_ratings_and_survive_restart);
