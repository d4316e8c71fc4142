//! Issue 8 ("Honest releases") regression tests that go through the service and its
//! store (both backends).

use std::sync::Arc;

use dprec::retrain::Hooks;
use dprec::train::{self, Params, Trainer};

use crate::api::helpers::*;
use crate::both_backends;

/// Finding 3: a `gaussian-mf` release charges every rating it touches, also a rating
/// with a small eps_ij (0.2): its audit shows the charge and `releases >= 1`, and once
/// its remaining budget cannot pay for the step it is no longer used.
async fn gaussian_mf_charges_small_eps_ratings(url: &str) {
    // One Gaussian step of z = 100: about 0.05 per rating at delta_r = 1e-5, within the
    // release share (fraction 0.4 of 0.2 = 0.08).
    let mut p = Params::new();
    p.set("sigma", "100");
    p.set("steps", "1");
    p.set("d", "2");
    let t: Arc<dyn Trainer> = Arc::from(train::build("gaussian-mf", &p).unwrap());
    let app = TestApp::spawn(settings(url), t, Hooks::default()).await;
    let mut batch = Vec::new();
    let users = ["a", "b", "c"];
    let items = ["i1", "i2", "i3"];
    for u in users {
        for i in items {
            batch.push((u, i, 4.0, Some(1.0)));
        }
    }
    batch.push(("a", "small", 3.0, Some(0.2)));
    app.ingest(&batch).await;
    let small = |a: &serde_json::Value| {
        a["ratings"]["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["item"] == "small")
            .cloned()
            .unwrap()
    };
    let job = app.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    let (_, a) = app.get("/v1/users/a/budget?limit=100", ADMIN).await;
    let e = small(&a);
    assert!(e["spent"].as_f64().unwrap() > 0.0, "not charged: {e}");
    assert!(e["releases"].as_i64().unwrap() >= 1, "{e}");
    // Keep releasing: the rating is charged every time it is used, until what is left of
    // its 0.2 cannot pay for the step; from then on it is left out (never used uncharged).
    let mut last_spent = e["spent"].as_f64().unwrap();
    let mut charged = 1;
    let mut left_out = false;
    for _ in 0..12 {
        let job = app.retrain().await;
        assert_ne!(job.status, "failed", "{job:?}");
        let (_, a) = app.get("/v1/users/a/budget?limit=100", ADMIN).await;
        let e = small(&a);
        let spent = e["spent"].as_f64().unwrap();
        assert!(spent <= 0.2, "{e}");
        if spent == last_spent {
            left_out = true;
            assert_eq!(e["releases"].as_i64().unwrap(), charged, "{e}");
            break;
        }
        charged += 1;
        last_spent = spent;
    }
    assert!(left_out, "the eps_ij = 0.2 rating was never left out");
    assert!(charged >= 2, "charged in {charged} releases");
    // Once left out it stays out.
    let job = app.retrain().await;
    assert_ne!(job.status, "failed", "{job:?}");
    let (_, a) = app.get("/v1/users/a/budget?limit=100", ADMIN).await;
    assert_eq!(small(&a)["spent"].as_f64().unwrap(), last_spent);
    app.stop().await;
}
both_backends!(gaussian_mf_charges_small_eps_ratings);
