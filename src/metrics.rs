//! Prometheus metrics of the service (names documented in docs/METRICS.md).
//!
//! Two registries (DESIGN 6). Without a key: only series that do not depend on the data,
//! the served release id and the time it was published (the release's start, see
//! `release::Retrainer`), both public in the release list too. Everything else is
//! rendered only for a `metrics` or admin key: HTTP request counts, statuses and
//! latencies (a backend that sends one rating per request would publish the number of
//! ratings through them, and a delete's 204 or 404 whether the rating existed), store
//! errors, and what counts data outright (ratings ingested, training outcomes and
//! durations, budget spent, ratings exhausted, users excluded).

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    Opts, Registry, TextEncoder,
};

pub struct Metrics {
    /// Data-independent series (no key needed).
    pub registry: Registry,
    /// Everything else (a metrics or admin key).
    pub data_registry: Registry,
    pub http_requests: IntCounterVec,
    pub http_duration: HistogramVec,
    pub ratings_ingested: IntCounter,
    pub training_runs: IntCounterVec,
    pub training_duration: Histogram,
    pub model_version: IntGauge,
    pub model_published_at: Gauge,
    pub budget_spent: prometheus::Counter,
    /// The Gaussian part of the same charges (zCDP rho), which `budget_spent` omits.
    pub budget_spent_rho: prometheus::Counter,
    pub ratings_exhausted: IntGauge,
    pub users_excluded: IntGauge,
    pub store_errors: IntCounter,
}

impl Metrics {
    /// All the metrics, registered.
    // long: one flat declaration per metric, in the order of the struct; splitting it
    // would only scatter the list.
    pub fn new() -> Self {
        let registry = Registry::new();
        let http_requests = IntCounterVec::new(
            Opts::new(
                "dprec_http_requests_total",
                "HTTP requests by route and status",
            ),
            &["method", "route", "status"],
        )
        .expect("metric");
        let http_duration = HistogramVec::new(
            HistogramOpts::new(
                "dprec_http_request_duration_seconds",
                "HTTP request latency by route",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
            &["method", "route"],
        )
        .expect("metric");
        let ratings_ingested = IntCounter::new(
            "dprec_ratings_ingested_total",
            "Ratings accepted by the batch endpoint (new and re-rated)",
        )
        .expect("metric");
        let training_runs = IntCounterVec::new(
            Opts::new(
                "dprec_training_runs_total",
                "Retrain jobs by outcome (succeeded, skipped, failed, refused)",
            ),
            &["outcome"],
        )
        .expect("metric");
        let training_duration = Histogram::with_opts(
            HistogramOpts::new("dprec_training_duration_seconds", "Retrain job duration")
                .buckets(vec![0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 1200.0]),
        )
        .expect("metric");
        let model_version = IntGauge::new(
            "dprec_model_release_id",
            "Release id of the served model (0: none)",
        )
        .expect("metric");
        let model_published_at = Gauge::new(
            "dprec_model_published_timestamp_seconds",
            "Unix time the served release's job started (age = now - this)",
        )
        .expect("metric");
        let budget_spent = prometheus::Counter::new(
            "dprec_budget_spent_eps_total",
            "Sum of the pure per-rating eps charged by releases this process published or \
             refused (the Gaussian part is dprec_budget_spent_rho_total)",
        )
        .expect("metric");
        let budget_spent_rho = prometheus::Counter::new(
            "dprec_budget_spent_rho_total",
            "Sum of the Gaussian per-rating charges (zCDP rho) of releases this process \
             published or refused",
        )
        .expect("metric");
        let ratings_exhausted = IntGauge::new(
            "dprec_ratings_exhausted",
            "Ratings left out of the last release because their eps_ij is used up",
        )
        .expect("metric");
        let users_excluded = IntGauge::new(
            "dprec_users_excluded",
            "Users left out of the last release because their Renyi filter is full",
        )
        .expect("metric");
        let store_errors =
            IntCounter::new("dprec_store_errors_total", "Database errors").expect("metric");
        // The release id and publication time are public (the release list is) and do
        // not depend on the data.
        for c in [
            Box::new(model_version.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(model_published_at.clone()),
        ] {
            registry.register(c).expect("unique metric names");
        }
        let data_registry = Registry::new();
        for c in [
            Box::new(http_requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(http_duration.clone()),
            Box::new(store_errors.clone()),
            Box::new(ratings_ingested.clone()),
            Box::new(training_runs.clone()),
            Box::new(training_duration.clone()),
            Box::new(budget_spent.clone()),
            Box::new(budget_spent_rho.clone()),
            Box::new(ratings_exhausted.clone()),
            Box::new(users_excluded.clone()),
        ] {
            data_registry.register(c).expect("unique metric names");
        }
        Self {
            registry,
            data_registry,
            http_requests,
            http_duration,
            ratings_ingested,
            training_runs,
            training_duration,
            model_version,
            model_published_at,
            budget_spent,
            budget_spent_rho,
            ratings_exhausted,
            users_excluded,
            store_errors,
        }
    }

    /// The text exposition format: the data-independent series, and with `with_data` (a
    /// metrics or admin key) all the others too.
    pub fn render(&self, with_data: bool) -> String {
        let mut families = self.registry.gather();
        if with_data {
            families.extend(self.data_registry.gather());
        }
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&families, &mut buf)
            .expect("encoding metrics");
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// One worker's request series by (route, method, status), taken from the metric
/// families once: `with_label_values` hashes the labels and takes a lock on every call.
/// Per worker (not shared), so a lookup takes no lock.
#[derive(Default)]
pub struct RouteSeries(std::cell::RefCell<RouteMap>);

type RouteMap = std::collections::HashMap<String, Vec<(String, u16, IntCounter, Histogram)>>;

impl RouteSeries {
    /// Counts one request of `route` answered with `status` after `secs`.
    pub fn observe(&self, m: &Metrics, method: &str, route: &str, status: u16, secs: f64) {
        let mut map = self.0.borrow_mut();
        if !map.contains_key(route) {
            map.insert(route.to_string(), Vec::new());
        }
        let list = map.get_mut(route).expect("inserted above");
        let k = match list.iter().position(|e| e.0 == method && e.1 == status) {
            Some(k) => k,
            None => {
                let code = status.to_string();
                list.push((
                    method.to_string(),
                    status,
                    m.http_requests.with_label_values(&[method, route, &code]),
                    m.http_duration.with_label_values(&[method, route]),
                ));
                list.len() - 1
            }
        };
        list[k].2.inc();
        list[k].3.observe(secs);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything but the release id and its publication time is rendered only on
    /// request (a metrics or admin key): request counts and latencies too.
    #[test]
    fn data_metrics_only_with_data() {
        let m = Metrics::new();
        m.ratings_ingested.inc();
        m.users_excluded.set(3);
        m.training_runs.with_label_values(&["succeeded"]).inc();
        m.http_requests
            .with_label_values(&["GET", "/x", "200"])
            .inc();
        m.http_duration
            .with_label_values(&["GET", "/x"])
            .observe(0.1);
        m.store_errors.inc();
        let public = m.render(false);
        let full = m.render(true);
        for name in [
            "dprec_http_requests_total",
            "dprec_http_request_duration_seconds",
            "dprec_store_errors_total",
            "dprec_ratings_ingested_total",
            "dprec_training_runs_total",
            "dprec_training_duration_seconds",
            "dprec_budget_spent_eps_total",
            "dprec_budget_spent_rho_total",
            "dprec_ratings_exhausted",
            "dprec_users_excluded",
        ] {
            assert!(!public.contains(name), "{name} is public: {public}");
            assert!(full.contains(name), "{name} missing: {full}");
        }
        assert!(public.contains("dprec_model_release_id"));
        assert!(public.contains("dprec_model_published_timestamp_seconds"));
        assert!(full.contains("dprec_users_excluded 3"));
    }

    /// The cached series count into the same families as `with_label_values`.
    #[test]
    fn route_series_count_per_route_method_and_status() {
        let m = Metrics::new();
        let s = RouteSeries::default();
        for (method, route, status) in [
            ("GET", "/a", 200),
            ("GET", "/a", 200),
            ("GET", "/a", 404),
            ("HEAD", "/a", 200),
            ("GET", "/b", 200),
        ] {
            s.observe(&m, method, route, status, 0.001);
        }
        let count = |l: &[&str]| m.http_requests.with_label_values(l).get();
        assert_eq!(count(&["GET", "/a", "200"]), 2);
        assert_eq!(count(&["GET", "/a", "404"]), 1);
        assert_eq!(count(&["HEAD", "/a", "200"]), 1);
        assert_eq!(count(&["GET", "/b", "200"]), 1);
        let seen = m
            .http_duration
            .with_label_values(&["GET", "/a"])
            .get_sample_count();
        assert_eq!(seen, 3);
    }
}
