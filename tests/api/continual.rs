//! Continual release (`release.mode = "continual"`, issue 23) end to end: every release
//! is a tick of a tree-aggregation series; a user is charged the series' levels once,
//! a rating once; node noise is stored before anything is published and reused after a
//! crash; a series that has run its ticks is followed by a new one that users with a
//! spent budget do not join.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dprec::config::ReleaseMode;
use dprec::retrain::Hooks;
use dprec::serve::Popularity;
use dprec_dp::privacy::tree::{decomposition, Node};

use crate::api::helpers::*;
use crate::both_backends;

/// Four ticks per series (three levels), user budget 10, ratings with room for the
/// series' rating charge.
fn continual_settings(url: &str) -> dprec::config::Settings {
    let mut s = settings(url);
    s.trainer.name = "dp-popularity".into();
    s.release.mode = ReleaseMode::Continual;
    s.release.continual_cap = 4;
    s.budget.planned_releases = 4;
    s.budget.default_user_eps = 10.0;
    s.budget.max_user_eps = 10.0;
    s.budget.default_rating_eps = 10.0;
    s
}

fn popularity_trainer() -> Arc<dyn dprec::train::Trainer> {
    Arc::from(dprec::train::build("dp-popularity", &Default::default()).unwrap())
}

/// `n` users rating items `i0..` with a popularity gradient (user k rates items
/// 0..=k mod 12 + 2).
async fn ingest_users(app: &TestApp, from: usize, n: usize) {
    let mut rows = Vec::new();
    for k in from..from + n {
        for j in 0..(k % 12 + 2) {
            rows.push((format!("u{k}"), format!("i{j}")));
        }
    }
    let rows: Vec<(&str, &str, f64, Option<f64>)> = rows
        .iter()
        .map(|(u, i)| (u.as_str(), i.as_str(), 4.0, None))
        .collect();
    app.ingest(&rows).await;
}

/// The user charges of user `u` in the audit, as (release id, events).
async fn user_events(app: &TestApp, u: &str) -> Vec<(i64, serde_json::Value)> {
    app.audit(u, "")
        .await
        .releases
        .entries
        .into_iter()
        .map(|r| (r.release_id, r.events))
        .collect()
}

/// Ticks charge levels, not releases: a user is charged `Gaussian { z_level, levels }`
/// once, at the tick the user joins, and nothing at later ticks of the series; a
/// rating is charged once, when admitted; a user registered later joins at a later
/// tick. After `horizon` ticks the next release starts a new series, which users whose
/// budget the first series spent do not join; they are left out, not overcharged.
async fn ticks_charge_levels_once(url: &str) {
    let app = TestApp::spawn(
        continual_settings(url),
        popularity_trainer(),
        Hooks::default(),
    )
    .await;
    ingest_users(&app, 0, 30).await;
    let first = app.retrain().await;
    assert_eq!(first.status, "succeeded", "{first:?}");
    let s = app.store.latest_series().await.unwrap().unwrap();
    assert_eq!((s.period, s.params.horizon, s.params.cap), (1, 4, 4));
    let z = s.params.z_level;
    let want = serde_json::json!([{"mechanism": "gaussian", "noise_multiplier": z, "count": 3}]);
    let ev = user_events(&app, "u5").await;
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0].1, want);
    // The audit shows the levels charged and the ticks left.
    let c = app.audit("u5", "").await.continual.expect("a series runs");
    assert_eq!(
        (
            c.series,
            c.horizon,
            c.period,
            c.ticks_left,
            c.levels,
            c.levels_charged
        ),
        (s.id, 4, 1, 3, 3, 3)
    );
    assert_eq!((c.status.as_str(), c.joined_period), ("joined", Some(1)));
    // The series took the whole budget: releases left are its 3 ticks left.
    assert_eq!(app.audit("u5", "").await.spent.releases_left, Some(3));
    // Second tick: a new user joins; the old ones are not charged again.
    ingest_users(&app, 30, 1).await;
    assert_eq!(app.retrain().await.status, "succeeded");
    assert_eq!(user_events(&app, "u5").await.len(), 1);
    let ev30 = user_events(&app, "u30").await;
    assert_eq!(ev30.len(), 1);
    assert_eq!(ev30[0].1, want);
    // The arrival cap: u11 rated 13 items, 4 are counted, each charged once.
    let audit = app.audit("u11", "limit=50").await;
    let charged: Vec<f64> = audit.ratings.entries.iter().map(|r| r.spent).collect();
    assert_eq!(
        charged.iter().filter(|&&x| x > 0.0).count(),
        4,
        "{charged:?}"
    );
    // Each counted rating carries the series' rating charge: its Gaussian rho, once.
    let want_loss = dprec_dp::ledger::gaussian_eps(s.params.rating_rho());
    for x in charged.iter().filter(|&&x| x > 0.0) {
        assert!((x - want_loss).abs() < 1e-9, "{x} vs {want_loss}");
    }
    let state = app.store.series_state(s.id).await.unwrap();
    assert_eq!(
        state
            .admitted
            .iter()
            .filter(|(u, _, _)| &**u == "u11")
            .count(),
        4
    );
    // Two more ticks finish the series; the fifth release starts a new one, which the
    // users of the first cannot join (their budget went to its levels).
    for _ in 0..2 {
        assert_eq!(app.retrain().await.status, "succeeded");
    }
    assert_eq!(app.store.latest_series().await.unwrap().unwrap().period, 4);
    ingest_users(&app, 40, 1).await;
    assert_eq!(app.retrain().await.status, "succeeded");
    let next = app.store.latest_series().await.unwrap().unwrap();
    assert_eq!((next.id, next.period), (s.id + 1, 1));
    let members = app.store.series_state(next.id).await.unwrap().members;
    assert_eq!(members.get("u5"), Some(&false), "a spent user joined");
    let c = app.audit("u5", "").await.continual.unwrap();
    assert_eq!(
        (c.status.as_str(), c.levels_charged, c.ticks_left),
        ("left_out", 0, 3)
    );
    assert_eq!(members.get("u40"), Some(&true));
    assert_eq!(user_events(&app, "u5").await.len(), 1);
    let again: Vec<f64> = app
        .audit("u11", "limit=50")
        .await
        .ratings
        .entries
        .iter()
        .map(|r| r.spent)
        .collect();
    assert_eq!(again, charged, "a counted rating was charged again");
    // A list holds n items whenever the catalogue has them: 13 items, u40 rated 6.
    assert_eq!(app.recommendations("u40", "n=5").await.items.len(), 5);
    assert_eq!(app.recommendations("u40", "n=10").await.items.len(), 7);
    app.stop().await;
}
both_backends!(ticks_charge_levels_once);

/// The node noise is stored before the release commits and reused after a crash: a
/// tick that fails after drawing (the process dies between storing the noise and the
/// ledger commit) leaves the noise of the node it releases; the service restarted with
/// ANOTHER noise seed publishes exactly the exact counts plus that stored noise.
async fn node_noise_survives_a_crash(url: &str) {
    let crash = Arc::new(AtomicBool::new(true));
    let c = crash.clone();
    let hooks = Hooks {
        before_commit: Some(Arc::new(move || {
            if c.load(Ordering::SeqCst) {
                Err("simulated kill after the node noise is stored".into())
            } else {
                Ok(())
            }
        })),
        ..Hooks::default()
    };
    let trainer = popularity_trainer;
    let app = TestApp::spawn(continual_settings(url), trainer(), hooks).await;
    ingest_users(&app, 0, 20).await;
    // Tick 1 succeeds; tick 2 crashes after storing the noise of the nodes ending at 2.
    crash.store(false, Ordering::SeqCst);
    assert_eq!(app.retrain().await.status, "succeeded");
    crash.store(true, Ordering::SeqCst);
    ingest_users(&app, 20, 5).await;
    assert_eq!(app.retrain().await.status, "failed");
    let s = app.store.latest_series().await.unwrap().unwrap();
    assert_eq!(s.period, 1, "the failed tick was recorded");
    // Tick 2 releases node (1, 0) (periods 1..=2); its noise is stored.
    let node = Node { level: 1, index: 0 };
    let stored: HashMap<String, i64> = app
        .store
        .node_noise(s.id, node)
        .await
        .unwrap()
        .expect("noise stored before the commit");
    // An item registered (and rated) after the crashed attempt drew the node's noise.
    app.ingest(&[("u0", "late", 5.0, None)]).await;
    app.stop().await;
    // Restart on the same database with another seed: the stored noise is used.
    let restarted = TestApp::spawn(
        continual_settings(url),
        trainer(),
        Hooks {
            seed: Some(TEST_SEED + 1000),
            ..Hooks::default()
        },
    )
    .await;
    let job = restarted.retrain().await;
    assert_eq!(job.status, "succeeded", "{job:?}");
    let now = restarted
        .store
        .node_noise(s.id, node)
        .await
        .unwrap()
        .unwrap();
    for (item, noise) in &stored {
        assert_eq!(
            now.get(item),
            Some(noise),
            "node {node:?}: {item} was redrawn"
        );
    }
    // The item registered after the crash has noise of its own in the node.
    assert!(now.contains_key("late") && now.len() == stored.len() + 1);
    // Node (0, 0) (tick 1) is in no later decomposition: forgotten once tick 2 is
    // recorded; node (1, 0) serves ticks 2 and 3: kept.
    let retired = Node { level: 0, index: 0 };
    assert!(restarted
        .store
        .node_noise(s.id, retired)
        .await
        .unwrap()
        .is_none());
    // Published counts = exact arrival-capped counts + the noise of the decomposition
    // of t = 2 (the single node (1, 0)).
    assert_eq!(decomposition(2), vec![Node { level: 1, index: 0 }]);
    let row = restarted.store.latest_model().await.unwrap().unwrap();
    assert_eq!(Some(row.release.id), job.release_id);
    let pop: Popularity = serde_json::from_str(&row.popularity).unwrap();
    let items: Vec<String> = serde_json::from_str(&row.items).unwrap();
    let state = restarted.store.series_state(s.id).await.unwrap();
    for (k, item) in items.iter().enumerate() {
        let exact = state
            .admitted
            .iter()
            .filter(|(_, i, _)| &**i == item)
            .count() as i64;
        assert_eq!(pop.counts[k], exact + now[item], "item {item}");
    }
    restarted.stop().await;
}
both_backends!(node_noise_survives_a_crash);

/// A tick reads only what its series has not offered yet (the ratings since the last
/// tick's mark, the earlier ratings of joining users, updated ratings) and its state in
/// aggregate form; it must decide exactly what [`plan_tick`] decides from a whole
/// snapshot and the whole state. Checked tick by tick over two series with: users
/// joining late, members below and at the cap rating more, a counted pair re-rated, a pair
/// deleted before it was
/// counted and rated again later (its rating id is old: only the read of updated ratings
/// offers it), a counted pair deleted (it stays counted), unaffordable ratings, an item
/// registered late, a tick with nothing new, and a user whose first ratings (more than
/// a tick reads of a user at first) are unaffordable.
async fn steady_ticks_decide_what_a_whole_snapshot_decides(url: &str) {
    use dprec::release::continual::plan_tick;
    use dprec::store::SeriesState;
    use std::collections::BTreeSet;

    let app = TestApp::spawn(
        continual_settings(url),
        popularity_trainer(),
        Hooks::default(),
    )
    .await;
    ingest_users(&app, 0, 12).await;
    // "d" rates i0 and i1 and deletes i1 before the first tick; "p" cannot afford the
    // series' rating charge (eps 0.001).
    app.ingest(&[("d", "i0", 3.0, None), ("d", "i1", 4.0, None)])
        .await;
    app.ingest(&[("p", "i0", 3.0, Some(0.001)), ("p", "i1", 3.0, Some(0.001))])
        .await;
    // "q" rates ten items, the first eight (at least what a tick reads of a user at first,
    // `FIRST_READ_PER_CAP` x the cap 4) unaffordable: only a second read finds i8 and i9.
    let q: Vec<(String, Option<f64>)> = (0..10)
        .map(|j| (format!("i{j}"), (j < 8).then_some(0.001)))
        .collect();
    let q: Vec<(&str, &str, f64, Option<f64>)> =
        q.iter().map(|(i, e)| ("q", i.as_str(), 3.0, *e)).collect();
    app.ingest(&q).await;
    const { assert!(dprec::release::continual::FIRST_READ_PER_CAP * 4 <= 8) };
    assert!(app.store.delete_rating("d", "i1").await.unwrap());
    type Rows = Vec<(&'static str, &'static str, f64, Option<f64>)>;
    let mut between: Vec<Rows> = vec![
        // Tick 2: d rates i1 again; u1 (3 items, below the cap) and u5 (at the cap) rate
        // more; a new user; an item registered late; u0 deletes a counted pair.
        vec![
            ("d", "i1", 5.0, None),
            ("u1", "i9", 4.0, None),
            ("u1", "i0", 2.0, None), // a counted pair re-rated: offered again, not counted
            ("u5", "i11", 4.0, None),
            ("new", "i3", 4.0, None),
            ("new", "late", 4.0, None),
        ],
        // Tick 3: nothing new.
        vec![],
        // Tick 4: u1 fills its cap, and one rating more is left out.
        vec![("u1", "i10", 4.0, None), ("u1", "i11", 4.0, None)],
        // Tick 1 of the next series: a whole read again.
        vec![("u2", "i10", 4.0, None)],
    ];
    between.reverse();
    let mut state: Option<(i64, SeriesState)> = None;
    let mut first_series = None;
    for tick in 0..5 {
        let snap = app.store.snapshot().await.unwrap();
        let job = app.retrain().await;
        assert_eq!(job.status, "succeeded", "{job:?}");
        let s = app.store.latest_series().await.unwrap().unwrap();
        let first = *first_series.get_or_insert(s.id);
        let before = match state.take() {
            Some((id, st)) if id == s.id => st,
            _ => SeriesState::default(),
        };
        let want = plan_tick(&s.params, s.period, &before, &snap).unwrap();
        let after = app.store.series_state(s.id).await.unwrap();
        let got: BTreeSet<(String, String)> = after
            .admitted
            .iter()
            .filter(|(_, _, t)| *t == s.period)
            .map(|(u, i, _)| (u.to_string(), i.to_string()))
            .collect();
        let expected: BTreeSet<(String, String)> = want
            .tick
            .admitted
            .iter()
            .map(|(u, i, _)| (u.to_string(), i.to_string()))
            .collect();
        assert_eq!(got, expected, "tick {} of series {}", s.period, s.id);
        let members: BTreeSet<(String, bool)> = after
            .members
            .iter()
            .map(|(u, a)| (u.to_string(), *a))
            .collect();
        let want_members: BTreeSet<(String, bool)> = before
            .members
            .iter()
            .map(|(u, a)| (u.to_string(), *a))
            .chain(want.tick.members.iter().map(|(u, a)| (u.to_string(), *a)))
            .collect();
        assert_eq!(members, want_members, "tick {}", s.period);
        let release = app.store.latest_model().await.unwrap().unwrap().release;
        assert_eq!(
            (release.n_ratings, release.n_users),
            (want.exact.iter().sum::<i64>(), want.members as i64)
        );
        match (tick, s.period) {
            // The re-rated pair is counted at tick 2, the unaffordable ones never.
            (0, 1) => assert!(got.contains(&("q".into(), "i8".into())), "{got:?}"),
            (1, 2) => assert!(got.contains(&("d".into(), "i1".into())), "{got:?}"),
            (2, 3) => assert!(got.is_empty(), "{got:?}"),
            (4, 1) => assert_eq!(s.id, first + 1, "the fifth tick starts a new series"),
            (k, t) => assert_eq!((k + 1, s.id), (t as usize, first)),
        }
        assert!(!got.iter().any(|(u, _)| u == "p"), "{got:?}");
        if tick == 0 {
            assert!(app.store.delete_rating("u0", "i0").await.unwrap());
        }
        if let Some(rows) = between.pop() {
            if !rows.is_empty() {
                app.ingest(&rows).await;
            }
        }
        state = Some((s.id, after));
    }
    app.stop().await;
}
both_backends!(steady_ticks_decide_what_a_whole_snapshot_decides);

/// `dprec serve` as a child process on `url`, in the continual mode of
/// [`continual_settings`], its log lines readable as they come.
struct ServeProcess {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    base: String,
}

impl ServeProcess {
    /// Starts the binary; `pause`: `DPREC_FAULT_PAUSE_BEFORE_COMMIT` seconds.
    fn start(url: &str, pause: Option<u64>) -> Self {
        use std::io::BufRead;
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_dprec"));
        cmd.args(["serve", "--bind", "127.0.0.1:0"])
            .env("DATABASE_URL", url)
            .env("RUST_LOG", "info,sqlx=warn")
            .envs(
                link_secret_file(url)
                    .map(|p| ("DPREC_AUTH__LINK_SECRET_FILE", p.display().to_string())),
            )
            .env("DPREC_SCHEDULER__ENABLED", "false")
            // The same instance across restarts: the restarted process takes over the
            // lease the killed one left (instead of waiting for it to expire).
            .env("DPREC_SCHEDULER__INSTANCE_ID", "crash-test")
            .env("DPREC_TRAINER__NAME", "dp-popularity")
            .env("DPREC_RELEASE__MODE", "continual")
            .env("DPREC_RELEASE__CONTINUAL_CAP", "4")
            .env("DPREC_RELEASE__PUBLISH_DELAY_SECS", "0")
            .env("DPREC_BUDGET__PLANNED_RELEASES", "4")
            .env("DPREC_BUDGET__DEFAULT_USER_EPS", "10")
            .env("DPREC_BUDGET__MAX_USER_EPS", "10")
            .env("DPREC_BUDGET__DEFAULT_RATING_EPS", "10")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        if let Some(secs) = pause {
            cmd.env("DPREC_FAULT_PAUSE_BEFORE_COMMIT", secs.to_string());
        }
        let mut child = cmd.spawn().expect("start dprec serve");
        let err = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut p = Self {
            child,
            lines,
            base: String::new(),
        };
        let line = p.wait_for("listening on port");
        let port = line.rsplit(' ').next().unwrap().trim().to_string();
        p.base = format!("http://127.0.0.1:{port}");
        p
    }

    /// The first log line from now on that contains `needle` (panics after 60 s).
    fn wait_for(&mut self, needle: &str) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(e) => panic!("no log line with {needle:?}: {e}"),
            }
        }
    }

    /// Asks for a release; the job id.
    async fn retrain(&self, client: &reqwest::Client, key: &str) -> i64 {
        let r = client
            .post(format!("{}/v1/admin/retrain", self.base))
            .bearer_auth(key)
            .json(&serde_json::json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        r.json::<serde_json::Value>().await.unwrap()["id"]
            .as_i64()
            .unwrap()
    }

    /// Job `id` once it is not running.
    async fn wait_job(&self, client: &reqwest::Client, key: &str, id: i64) -> serde_json::Value {
        for _ in 0..3000 {
            let j: serde_json::Value = client
                .get(format!("{}/v1/admin/jobs/{id}", self.base))
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if j["status"] != "running" {
                return j;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("job {id} did not finish");
    }

    /// SIGKILL: no shutdown, no cleanup, no flush.
    fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

/// Node persistence across a real kill -9: `dprec serve` runs a tick that stores its
/// node's noise and is SIGKILLed right before its ledger commit; the killed tick charged
/// nobody; the restarted process (its noise from the OS, so any redraw would differ)
/// publishes exactly the exact counts plus the noise the killed process stored.
async fn a_killed_tick_reuses_its_node_noise(url: &str) {
    let app = TestApp::spawn(
        continual_settings(url),
        popularity_trainer(),
        Hooks::default(),
    )
    .await;
    ingest_users(&app, 0, 20).await;
    assert_eq!(app.retrain().await.status, "succeeded");
    ingest_users(&app, 20, 5).await;
    app.stop().await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dprec"))
        .args(["keys", "create", "--role", "admin"])
        .env("DATABASE_URL", url)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let client = reqwest::Client::new();

    let mut serve = ServeProcess::start(url, Some(600));
    let killed = serve.retrain(&client, &key).await;
    serve.wait_for("fault: paused before commit");
    serve.kill9();

    let store = dprec::store::Store::connect(url, 2).await.unwrap();
    let s = store.latest_series().await.unwrap().unwrap();
    assert_eq!(s.period, 1, "the killed tick was recorded");
    let node = Node { level: 1, index: 0 };
    let stored = store
        .node_noise(s.id, node)
        .await
        .unwrap()
        .expect("noise stored before the kill");
    let u20 = store.user("u20").await.unwrap().unwrap();
    assert_eq!(
        u20.consumed,
        dprec_dp::accountant::RdpCurve::zeros_default(),
        "the killed tick charged a joiner"
    );

    let serve = ServeProcess::start(url, None);
    let job = serve.retrain(&client, &key).await;
    assert_eq!(
        serve.wait_job(&client, &key, job).await["status"],
        "succeeded"
    );
    let was = serve.wait_job(&client, &key, killed).await;
    assert_eq!(was["status"], "failed", "the killed run's job: {was}");
    serve.kill9();
    let now = store.node_noise(s.id, node).await.unwrap().unwrap();
    assert_eq!(now, stored, "node {node:?} was redrawn");
    let row = store.latest_model().await.unwrap().unwrap();
    let pop: Popularity = serde_json::from_str(&row.popularity).unwrap();
    let items: Vec<String> = serde_json::from_str(&row.items).unwrap();
    let state = store.series_state(s.id).await.unwrap();
    assert!(state
        .admitted
        .iter()
        .any(|(u, _, t)| &**u == "u20" && *t == 2));
    for (k, item) in items.iter().enumerate() {
        let exact = state
            .admitted
            .iter()
            .filter(|(_, i, _)| &**i == item)
            .count() as i64;
        assert_eq!(pop.counts[k], exact + now[item], "item {item}");
    }
    assert_ne!(
        store.user("u20").await.unwrap().unwrap().consumed,
        dprec_dp::accountant::RdpCurve::zeros_default()
    );
    store.close().await;
}
both_backends!(a_killed_tick_reuses_its_node_noise);
