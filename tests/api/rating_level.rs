//! The rating-level mode (DESIGN 3, issue 21 item 3): `pdp-pmf` / `dp-pmf`, proven for one
//! rating only, are refused unless the operator opts in (`trainer.allow_rating_level`);
//! when served, every answer that carries or derives from the model says
//! `"guarantee": "rating-level"`, each rating's eps_ij is charged as usual, nothing is
//! charged to the user-level ledger, and the audit and the receipt show the
//! group-privacy bound (the sum of the user's rating charges), not enforced.

use dprec::retrain::Hooks;
use serde_json::Value;

use crate::api::helpers::*;
use crate::both_backends;

fn rating_level_settings(url: &str, trainer: &str) -> dprec::config::Settings {
    let mut s = settings(url);
    s.trainer.name = trainer.into();
    s.trainer.allow_rating_level = true;
    s
}

/// Every value of a `guarantee` key anywhere in `v`.
fn guarantees(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "guarantee" {
                    out.push(x.as_str().unwrap_or("<not a string>").to_owned());
                }
                guarantees(x, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| guarantees(x, out)),
        _ => {}
    }
}

/// Asserts that `path` answers 200 and labels everything it carries `rating-level` (at
/// least one label).
async fn labelled(app: &TestApp, path: &str, key: &str) -> Value {
    let (st, body) = app.get(path, key).await;
    assert_eq!(st, 200, "{path}: {body}");
    let mut found = Vec::new();
    guarantees(&body, &mut found);
    assert!(!found.is_empty(), "{path} carries no guarantee: {body}");
    assert!(
        found.iter().all(|g| g == "rating-level"),
        "{path}: {found:?}"
    );
    body
}

/// Without the switch, start-up refuses both trainers with a reason naming the switch;
/// with the switch, a trainer that is not rating-level is refused too.
async fn rating_level_is_refused_unless_configured(url: &str) {
    for trainer in ["pdp-pmf", "dp-pmf"] {
        let mut s = rating_level_settings(url, trainer);
        s.trainer.allow_rating_level = false;
        let e = TestApp::try_spawn(s, None, Hooks::default())
            .await
            .err()
            .unwrap_or_else(|| panic!("{trainer} served without the switch"));
        let msg = format!("{e:#}");
        assert!(
            msg.contains("trainer.allow_rating_level")
                && msg.contains("DPREC_TRAINER__ALLOW_RATING_LEVEL")
                && msg.contains(trainer),
            "{msg}"
        );
    }
    let e = TestApp::try_spawn(
        rating_level_settings(url, "dp-topn"),
        None,
        Hooks::default(),
    )
    .await
    .err()
    .expect("the switch with a user-level trainer is refused");
    let msg = format!("{e:#}");
    assert!(
        msg.contains("trainer.allow_rating_level") && msg.contains("dp-topn"),
        "{msg}"
    );
}
both_backends!(rating_level_is_refused_unless_configured);

/// Served in the rating-level mode: every model answer is labelled, the rating ledger is
/// charged, the user ledger is not, and the audit's bound is the sum of the user's rating
/// charges over both releases (the receipt shows the same figure).
async fn rating_level_releases_are_labelled_and_bounded(url: &str) {
    let app = TestApp::try_spawn(
        rating_level_settings(url, "pdp-pmf"),
        None,
        Hooks::default(),
    )
    .await
    .unwrap();
    let data = tastes(0x5eed_0021, 40, 8, 4, false, 2.0);
    let rows: Vec<(&str, &str, f64, Option<f64>)> = data
        .train
        .iter()
        .map(|(u, i, v)| (u.as_str(), i.as_str(), *v, None))
        .collect();
    app.ingest(&rows).await;
    for _ in 0..2 {
        let job = app.retrain().await;
        assert_eq!(job.status, "succeeded", "{:?}", job.reason);
        let stored = app.stored_release(&job).await;
        assert_eq!(stored.guarantee, dprec::train::Guarantee::RatingLevel);
    }

    let user = "user001";
    let own = app.create_key("user", Some(user)).await.key;
    let item = &data.train.iter().find(|(u, _, _)| u == user).unwrap().1;
    for (path, key) in [
        ("/v1/models".to_string(), PUBLIC),
        ("/v1/models/current".into(), PUBLIC),
        ("/v1/models/current/items".into(), PUBLIC),
        (format!("/v1/items/{item}/similar"), PUBLIC),
        (format!("/v1/users/{user}/recommendations"), own.as_str()),
        (
            format!("/v1/users/{user}/predictions?items=a1,b2"),
            own.as_str(),
        ),
        (format!("/v1/models/current/users/{user}"), own.as_str()),
        (format!("/v1/users/{user}/budget"), own.as_str()),
    ] {
        labelled(&app, &path, key).await;
    }

    let audit = app.audit(user, "limit=100").await;
    // Nothing charged to the user-level ledger: no user-level release, zero curve.
    assert_eq!(audit.releases.total, 0);
    let stored = app.store.user(user).await.unwrap().unwrap();
    assert!(stored.consumed.points().all(|(_, r)| r == 0.0));
    // The rating ledger was charged; the bound is the sum of those charges.
    let spent: f64 = audit.ratings.entries.iter().map(|r| r.spent).sum();
    assert!(spent > 0.0);
    assert!(audit.ratings.entries.iter().all(|r| r.releases == 2));
    let b = audit.rating_level.as_ref().expect("the bound is shown");
    assert!(!b.enforced);
    assert!(b.note.contains("not enforced"), "{}", b.note);
    assert_eq!(b.releases.len(), 2);
    let bound = b.eps.unwrap();
    assert!(
        (bound - spent).abs() < 1e-9,
        "bound {bound} vs spent {spent}"
    );
    let terms: f64 = b.releases.iter().map(|r| r.eps).sum();
    assert!((bound - terms).abs() < 1e-12);
    let n = audit.ratings.total;
    assert!(b.releases.iter().all(|r| r.ratings_charged == n));

    let html = app
        .send(
            app.client
                .get(app.url(&format!("/v1/users/{user}/receipt")))
                .bearer_auth(&own),
        )
        .await;
    assert_eq!(html.status, 200, "{}", html.text);
    assert!(
        html.text
            .contains(&format!("id=\"rating-level-eps\">{bound:.3}<")),
        "{}",
        html.text
    );
    assert!(html.text.contains("not enforced") && html.text.contains("(rating-level)"));
    app.stop().await;
}
both_backends!(rating_level_releases_are_labelled_and_bounded);

/// Every response schema that names a served model version also states its guarantee,
/// so a model answer cannot go out unlabelled (the committed OpenAPI document is checked
/// against the code by `health::committed_openapi_matches_code`). The one exception is
/// the readiness probe, which says which release is loaded and carries nothing of it.
#[test]
fn every_model_answer_schema_has_a_guarantee() {
    let spec: Value = serde_json::from_str(include_str!("../../openapi/openapi.json")).unwrap();
    let schemas = spec["components"]["schemas"].as_object().unwrap();
    let mut checked = 0;
    for (name, schema) in schemas {
        let Some(props) = schema["properties"].as_object() else {
            continue;
        };
        if props.contains_key("model_version") && name != "Ready" {
            checked += 1;
            assert!(props.contains_key("guarantee"), "{name} has no guarantee");
        }
    }
    assert!(checked >= 5, "{checked} schemas with model_version");
}
