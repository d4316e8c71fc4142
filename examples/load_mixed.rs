//! Mixed load against a running `dprec serve`: readers (top-N), writers (batch ingestion),
//! a /healthz probe and back-to-back admin releases, all at once, bounded in time and in
//! request count. Prints, per endpoint, the requests by status and p50 / p99 / max latency.
//!
//! ```text
//! cargo run --release --example load_mixed -- --base http://127.0.0.1:8080 --key KEY \
//!     --duration 60 --readers 28 --writers 4 --batch 100 --users 943 --items 1682
//! ```
//!
//! Readers run a closed loop (each sends again as soon as it has its answer: the CPU is
//! saturated, and by Little's law a reader's latency is then readers / throughput,
//! whatever the server does) or, with `--read-rate R`, an open loop of R requests/s in
//! all on a fixed schedule, latency counted from the scheduled time (no coordinated
//! omission). `--write-rate B` does the same for the writers (B batches/s in all).
//! Latency targets are checked at stated open-loop rates.
//!
//! Run through load-tests/mixed.sh, which builds, starts the service on loopback with a
//! fresh store, imports the data and trains the first release. Exit status 0 whatever the
//! figures; the script decides what counts as a failure.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Clone)]
struct Args {
    base: String,
    key: String,
    duration: Duration,
    readers: usize,
    writers: usize,
    /// Clients that rate one item and at once ask for their own top-N (the answer after
    /// a rating cannot come from the per-user cache).
    raters: usize,
    batch: usize,
    users: u64,
    items: u64,
    max_requests: u64,
    releases: bool,
    timeout: Duration,
    /// Open loop: the readers together send this many requests per second on a fixed
    /// schedule (latency counted from the scheduled send time, so a stall is not hidden
    /// by the readers waiting); `None` is the closed loop (each reader sends again at once).
    read_rate: Option<f64>,
    /// Open loop for the writers: batches per second in all (as `read_rate`).
    write_rate: Option<f64>,
}

fn parse_args() -> Args {
    let mut a = Args {
        base: "http://127.0.0.1:8080".into(),
        key: String::new(),
        duration: Duration::from_secs(30),
        readers: 28,
        writers: 4,
        raters: 0,
        batch: 100,
        users: 943,
        items: 1682,
        max_requests: 5_000_000,
        releases: true,
        timeout: Duration::from_secs(30),
        read_rate: None,
        write_rate: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--base" => a.base = val(),
            "--key" => a.key = val(),
            "--duration" => a.duration = Duration::from_secs_f64(val().parse().unwrap()),
            "--readers" => a.readers = val().parse().unwrap(),
            "--writers" => a.writers = val().parse().unwrap(),
            "--raters" => a.raters = val().parse().unwrap(),
            "--batch" => a.batch = val().parse().unwrap(),
            "--users" => a.users = val().parse().unwrap(),
            "--items" => a.items = val().parse().unwrap(),
            "--max-requests" => a.max_requests = val().parse().unwrap(),
            "--timeout" => a.timeout = Duration::from_secs_f64(val().parse().unwrap()),
            "--no-releases" => a.releases = false,
            "--read-rate" => a.read_rate = Some(val().parse().unwrap()),
            "--write-rate" => a.write_rate = Some(val().parse().unwrap()),
            other => panic!("unknown flag {other}"),
        }
    }
    assert!(!a.key.is_empty(), "--key is required");
    assert!(
        a.batch >= 1 && a.batch as u64 <= a.items,
        "1 <= batch <= items"
    );
    a
}

/// Outcomes of one endpoint: latencies in microseconds and counts by status
/// (`timeout` / `connect` for requests without a response).
#[derive(Default)]
struct Endpoint {
    latencies_us: Vec<u64>,
    /// When each request was due, in ms since the load started (same order as
    /// `latencies_us`), for the `LOAD_TIMELINE` file.
    due_ms: Vec<u64>,
    statuses: BTreeMap<String, u64>,
}

#[derive(Default)]
struct Recorder {
    endpoints: Mutex<BTreeMap<&'static str, Endpoint>>,
}

impl Recorder {
    fn record(&self, endpoint: &'static str, status: String, due_ms: u64, elapsed: Duration) {
        let mut m = self.endpoints.lock().unwrap();
        let e = m.entry(endpoint).or_default();
        e.latencies_us.push(elapsed.as_micros() as u64);
        e.due_ms.push(due_ms);
        *e.statuses.entry(status).or_default() += 1;
    }
}

fn status_of(r: &Result<reqwest::Response, reqwest::Error>) -> String {
    match r {
        Ok(r) => r.status().as_u16().to_string(),
        Err(e) if e.is_timeout() => "timeout".into(),
        Err(e) if e.is_connect() => "connect".into(),
        Err(_) => "io".into(),
    }
}

struct Shared {
    args: Args,
    client: reqwest::Client,
    rec: Recorder,
    stop: AtomicBool,
    sent: AtomicU64,
    started: Instant,
    /// Unix time (ms) of `started`, for the timeline file.
    started_unix_ms: u64,
}

impl Shared {
    fn go_on(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
            && self.started.elapsed() < self.args.duration
            && self.sent.fetch_add(1, Ordering::Relaxed) < self.args.max_requests
    }

    async fn timed(
        &self,
        endpoint: &'static str,
        req: reqwest::RequestBuilder,
    ) -> Option<serde_json::Value> {
        self.timed_from(Instant::now(), endpoint, req).await
    }

    /// [`Shared::timed`] with the latency counted from `t` (an open-loop schedule's send
    /// time, which may lie before the actual send).
    async fn timed_from(
        &self,
        t: Instant,
        endpoint: &'static str,
        req: reqwest::RequestBuilder,
    ) -> Option<serde_json::Value> {
        let r = req.bearer_auth(&self.args.key).send().await;
        let status = status_of(&r);
        // The body is part of the latency: a client waits for the whole answer.
        let body = match r {
            Ok(r) => r.bytes().await.ok(),
            Err(_) => None,
        };
        let due_ms = t.saturating_duration_since(self.started).as_millis() as u64;
        self.rec.record(endpoint, status, due_ms, t.elapsed());
        body.and_then(|b| serde_json::from_slice(&b).ok())
    }
}

/// An open-loop schedule: client `k` of `clients` sends its i-th request at
/// `(i * clients + k) / rate` seconds; `None` rate is a closed loop (send again at once).
struct Schedule {
    period: Option<Duration>,
    next: Instant,
}

impl Schedule {
    fn new(s: &Shared, rate: Option<f64>, k: usize, clients: usize) -> Self {
        let period = rate.map(|r| Duration::from_secs_f64(clients as f64 / r));
        let offset = period.map_or(Duration::ZERO, |p| p.mul_f64(k as f64 / clients as f64));
        Self {
            period,
            next: s.started + offset,
        }
    }

    /// Waits for the next send time and returns it (the latency's origin), or now in a
    /// closed loop.
    async fn wait(&mut self) -> Instant {
        let Some(p) = self.period else {
            return Instant::now();
        };
        let at = self.next;
        tokio::time::sleep_until(at.into()).await;
        self.next += p;
        at
    }
}

async fn reader(s: Arc<Shared>, k: usize, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut schedule = Schedule::new(&s, s.args.read_rate, k, s.args.readers);
    while s.go_on() {
        let u = rng.random_range(1..=s.args.users);
        let url = format!("{}/v1/users/{u}/recommendations?n=10", s.args.base);
        let at = schedule.wait().await;
        s.timed_from(
            at,
            "GET /v1/users/{user}/recommendations",
            s.client.get(url),
        )
        .await;
    }
}

async fn writer(s: Arc<Shared>, k: usize, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut schedule = Schedule::new(&s, s.args.write_rate, k, s.args.writers);
    while s.go_on() {
        // Distinct items within a batch (the API refuses a repeated pair); users among the
        // existing ones, so ingestion touches the rows a release reads and charges.
        let start = rng.random_range(0..s.args.items);
        let ratings: Vec<serde_json::Value> = (0..s.args.batch as u64)
            .map(|k| {
                serde_json::json!({
                    "user": rng.random_range(1..=s.args.users).to_string(),
                    "item": ((start + k) % s.args.items + 1).to_string(),
                    "rating": rng.random_range(1..=5),
                    "eps": 1.0,
                })
            })
            .collect();
        let url = format!("{}/v1/ratings", s.args.base);
        let body = serde_json::json!({ "ratings": ratings });
        let at = schedule.wait().await;
        s.timed_from(at, "POST /v1/ratings", s.client.post(url).json(&body))
            .await;
    }
}

/// Rates one random item as a random existing user, then asks for that user's top-N.
async fn rater(s: Arc<Shared>, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    while s.go_on() {
        let u = rng.random_range(1..=s.args.users);
        let body = serde_json::json!({ "ratings": [{
            "user": u.to_string(),
            "item": rng.random_range(1..=s.args.items).to_string(),
            "rating": rng.random_range(1..=5),
            "eps": 1.0,
        }]});
        let url = format!("{}/v1/ratings", s.args.base);
        s.timed(
            "POST /v1/ratings (1 rating, rater)",
            s.client.post(url).json(&body),
        )
        .await;
        let url = format!("{}/v1/users/{u}/recommendations?n=10", s.args.base);
        s.timed(
            "GET recommendations just after the user's rating",
            s.client.get(url),
        )
        .await;
    }
}

async fn prober(s: Arc<Shared>) {
    while s.go_on() {
        let url = format!("{}/healthz", s.args.base);
        s.timed("GET /healthz", s.client.get(url)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Releases back to back: trigger, poll the job until it ends, trigger the next.
async fn releaser(s: Arc<Shared>, outcomes: Arc<Mutex<BTreeMap<String, u64>>>) {
    while s.go_on() {
        let url = format!("{}/v1/admin/retrain", s.args.base);
        let Some(job) = s.timed("POST /v1/admin/retrain", s.client.post(url)).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let Some(id) = job["id"].as_i64() else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let status = loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let url = format!("{}/v1/admin/jobs/{id}", s.args.base);
            let j = s.timed("GET /v1/admin/jobs/{id}", s.client.get(url)).await;
            let st = j
                .as_ref()
                .and_then(|j| j["status"].as_str())
                .unwrap_or("unknown")
                .to_string();
            if st != "running" && st != "unknown" {
                break st;
            }
            // After the load window the last release is still waited for (bounded by the
            // client timeout per poll and the stop flag).
            if s.stop.load(Ordering::Relaxed) {
                break "unfinished".to_string();
            }
        };
        *outcomes.lock().unwrap().entry(status).or_default() += 1;
    }
}

fn loop_kind(rate: Option<f64>) -> String {
    rate.map_or("closed loop".into(), |r| {
        format!("open loop, {r} req/s in all")
    })
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx] as f64 / 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = parse_args();
    let client = reqwest::Client::builder()
        .timeout(args.timeout)
        .pool_max_idle_per_host(args.readers + args.writers + args.raters + 4)
        // Below the server's 5 s keep-alive: a pooled connection the server is closing
        // for idleness would otherwise now and then take a request and fail it (`io`),
        // a race of the client's pool, not an answer of the server.
        .pool_idle_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let s = Arc::new(Shared {
        args: args.clone(),
        client,
        rec: Recorder::default(),
        stop: AtomicBool::new(false),
        sent: AtomicU64::new(0),
        started: Instant::now(),
        started_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    });
    let releases = Arc::new(Mutex::new(BTreeMap::new()));
    let mut tasks = Vec::new();
    for k in 0..args.readers {
        tasks.push(tokio::spawn(reader(s.clone(), k, 1000 + k as u64)));
    }
    for k in 0..args.writers {
        tasks.push(tokio::spawn(writer(s.clone(), k, 2000 + k as u64)));
    }
    for k in 0..args.raters {
        tasks.push(tokio::spawn(rater(s.clone(), 3000 + k as u64)));
    }
    tasks.push(tokio::spawn(prober(s.clone())));
    let rel = args
        .releases
        .then(|| tokio::spawn(releaser(s.clone(), releases.clone())));
    for t in tasks {
        t.await.unwrap();
    }
    s.stop.store(true, Ordering::Relaxed);
    if let Some(r) = rel {
        // The release in flight gets at most the client timeout to finish.
        let _ = tokio::time::timeout(args.timeout, r).await;
    }
    let wall = s.started.elapsed().as_secs_f64();

    println!(
        "load: {:.1} s, {} readers ({}), {} writers ({}, {} ratings per batch), releases {}",
        wall,
        args.readers,
        loop_kind(args.read_rate),
        args.writers,
        loop_kind(args.write_rate),
        args.batch,
        if args.releases { "back to back" } else { "off" }
    );
    println!(
        "{:<40} {:>8} {:>9} {:>9} {:>9} {:>9}  statuses",
        "endpoint", "requests", "req/s", "p50 ms", "p99 ms", "max ms"
    );
    let mut fivexx = 0u64;
    let mut failed = 0u64;
    let mut m = s.rec.endpoints.lock().unwrap();
    if let Ok(path) = std::env::var("LOAD_TIMELINE") {
        write_timeline(&path, s.started_unix_ms, &m);
    }
    for (name, e) in m.iter_mut() {
        e.latencies_us.sort_unstable();
        let n = e.latencies_us.len();
        let statuses: Vec<String> = e.statuses.iter().map(|(k, v)| format!("{k}:{v}")).collect();
        for (k, v) in &e.statuses {
            if k.starts_with('5') {
                fivexx += v;
            }
            if !k.starts_with('2') {
                failed += v;
            }
        }
        println!(
            "{:<40} {:>8} {:>9.1} {:>9.1} {:>9.1} {:>9.1}  {}",
            name,
            n,
            n as f64 / wall,
            percentile(&e.latencies_us, 0.50),
            percentile(&e.latencies_us, 0.99),
            percentile(&e.latencies_us, 1.0),
            statuses.join(" ")
        );
    }
    let rel: Vec<String> = releases
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| format!("{k}:{v}"))
        .collect();
    println!("releases (job outcomes): {}", rel.join(" "));
    println!("totals: 5xx={fivexx} non-2xx={failed}");
}

/// `LOAD_TIMELINE=FILE`: per endpoint and second of the load (by due time), the UTC
/// second, requests, p50, p99 and max ms, to line stalls up with the server log.
fn write_timeline(path: &str, started_unix_ms: u64, m: &BTreeMap<&'static str, Endpoint>) {
    use std::fmt::Write;
    let mut out = String::from("endpoint\tunix_s\trequests\tp50_ms\tp99_ms\tmax_ms\n");
    for (name, e) in m {
        let mut by_sec: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for (&d, &l) in e.due_ms.iter().zip(&e.latencies_us) {
            by_sec
                .entry((started_unix_ms + d) / 1000)
                .or_default()
                .push(l);
        }
        for (sec, mut l) in by_sec {
            l.sort_unstable();
            let _ = writeln!(
                out,
                "{name}\t{sec}\t{}\t{:.1}\t{:.1}\t{:.1}",
                l.len(),
                percentile(&l, 0.5),
                percentile(&l, 0.99),
                percentile(&l, 1.0)
            );
        }
    }
    if let Err(e) = std::fs::write(path, out) {
        eprintln!("LOAD_TIMELINE {path}: {e}");
    }
}
