//! Issue 8 ("Honest releases") regression tests that go through the service and its
//! store (both backends).

use std::sync::Arc;

use dprec::retrain::Hooks;
use dprec::train::{self, Params, Trainer};

use crate::both_backends;
use crate::helpers::*;

/// Finding 3: a `gaussian-mf` release charges every rating it touches, also a rating
/// with a small eps_ij (0.2): its audit shows the charge and `releases >= 1`, and after
/// enough releases it is exhausted and no longer used.
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
    assert_eq!(job["status"], "succeeded", "{job}");
    let (_, a) = app.get("/v1/users/a/budget?limit=100", ADMIN).await;
    let e = small(&a);
    assert!(e["spent"].as_f64().unwrap() > 0.0, "not charged: {e}");
    assert!(e["releases"].as_i64().unwrap() >= 1, "{e}");
    // Keep releasing: the rating is charged until its 0.2 is used up, then excluded.
    let mut last_spent = e["spent"].as_f64().unwrap();
    let mut exhausted = false;
    for _ in 0..8 {
        let job = app.retrain().await;
        assert_ne!(job["status"], "failed", "{job}");
        let (_, a) = app.get("/v1/users/a/budget?limit=100", ADMIN).await;
        let e = small(&a);
        let spent = e["spent"].as_f64().unwrap();
        assert!(spent <= 0.2, "{e}");
        if e["status"] == "exhausted" {
            exhausted = true;
            break;
        }
        assert!(spent > last_spent, "used without a charge: {e}");
        last_spent = spent;
    }
    assert!(exhausted, "the eps_ij = 0.2 rating was never exhausted");
    app.stop().await;
}
both_backends!(gaussian_mf_charges_small_eps_ratings);
