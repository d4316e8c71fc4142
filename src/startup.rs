//! Builds the application: store, keys, model registry, retrainer, scheduler and the HTTP
//! server. Tests call [`Application::build`] with port 0 and talk HTTP to it.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Instant;

use actix_web::dev::{Server, Service, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::middleware::{ErrorHandlerResponse, ErrorHandlers};
use actix_web::ResponseError;
use actix_web::{web, App, HttpRequest, HttpServer};
use anyhow::{bail, Context};
use futures_util::future::Either;

use crate::api::{self, auth, ApiError, AppState};
use crate::config::{AuthMode, Settings};
use crate::metrics::Metrics;
use crate::release::{Hooks, Retrainer};
use crate::serve::Registry;
use crate::store::Store;
use crate::train::{self, Guarantee, Params, Trainer};

/// A built, not yet running, service.
pub struct Application {
    port: u16,
    server: Server,
    pub store: Store,
    pub registry: Arc<Registry>,
    pub retrainer: Arc<Retrainer>,
    /// The admin key generated on first start (printed once), if any.
    pub bootstrap_key: Option<String>,
    scheduler: bool,
    /// The key table the server checks (stored keys reloaded every `reload_secs`).
    keys: auth::Keys,
    /// The page-link secret (its file re-read with the keys).
    link_keys: api::pages::secret::LinkKeys,
    reload_secs: u64,
    /// The serving facts cache, refreshed every `reload_secs` from the store's changes.
    user_facts: Arc<crate::serve::facts::UserFactsCache>,
}

/// The trainer named in the config, checked against the serving policy.
pub fn trainer_from_settings(s: &Settings) -> anyhow::Result<Arc<dyn Trainer>> {
    let mut params = Params::new();
    for (k, v) in &s.trainer.params {
        params.set(k, v);
    }
    let t = train::build(&s.trainer.name, &params)
        .with_context(|| format!("trainer.name = {:?}", s.trainer.name))?;
    Ok(Arc::from(t))
}

/// A served proven trainer converts its rating-level loss at the ledger's
/// [`RATING_DELTA`](dprec_dp::ledger::RATING_DELTA), the delta the per-rating promise names
/// (docs/privacy/guarantee.md): the ledger composes every rating's Gaussian part at that
/// delta, so a trainer charging eps at another delta would make the promise wrong.
fn check_rating_delta(t: &dyn Trainer) -> anyhow::Result<()> {
    let want = dprec_dp::ledger::RATING_DELTA;
    match t.params().get("delta_r").and_then(|v| v.as_f64()) {
        Some(d) if d != want => bail!(
            "trainer.params.delta_r = {d} is refused for the served trainer {}: every \
             rating's loss is converted at the ledger's delta {want} (the per-rating promise); \
             remove trainer.params.delta_r or set it to {want}",
            t.name()
        ),
        _ => Ok(()),
    }
}

/// Refuses trainers the serving policy does not allow.
pub fn check_trainer(s: &Settings, t: &dyn Trainer) -> anyhow::Result<()> {
    s.trainer.check_rating_level(t.name(), t.guarantee())?;
    match t.guarantee() {
        Guarantee::Proven => check_rating_delta(t),
        // `check_rating_level` let it through: the operator opted in.
        Guarantee::RatingLevel => {
            log::warn!(
                "serving trainer {} in the RATING-LEVEL mode (trainer.allow_rating_level = \
                 true): each rating's eps_ij is enforced, the user-level budget is not; \
                 responses are labelled rating-level and each user's audit shows the \
                 group-privacy bound",
                t.name()
            );
            check_rating_delta(t)
        }
        Guarantee::NonPrivate if s.trainer.allow_non_private => {
            log::warn!(
                "serving NON-PRIVATE trainer {} (trainer.allow_non_private = true): \
                 releases are labelled non-private and charge no budget",
                t.name()
            );
            Ok(())
        }
        Guarantee::NonPrivate => bail!(
            "trainer {} is non-private; set trainer.allow_non_private = true to serve it",
            t.name()
        ),
        Guarantee::LocalDp => {
            log::info!(
                "trainer {} is local-DP: releases read only the ratings perturbed on the \
                 client (charged at ingestion) and charge nothing",
                t.name()
            );
            Ok(())
        }
        Guarantee::PaperClaimed => bail!(
            "trainer {} is paper-faithful (guarantee not proven for this code) and is never served",
            t.name()
        ),
    }
}

/// The API keys: configured keys plus stored (hashed) keys. On a first start in `keys`
/// mode without any, generates an admin key, stores its hash and returns it once.
async fn load_keys(
    settings: &Settings,
    store: &Store,
) -> anyhow::Result<(auth::Keys, Option<String>)> {
    let configured: Vec<(String, auth::Grant)> = settings
        .auth
        .keys
        .iter()
        .map(|k| (auth::hash_key(&k.key), auth::Grant::role(k.role)))
        .collect();
    let mut bootstrap_key = None;
    let mut stored = Vec::new();
    if settings.auth.mode == AuthMode::Keys {
        if settings.auth.keys.is_empty() && store.api_key_count().await? == 0 {
            let key = auth::generate_key();
            store
                .insert_api_key(&auth::hash_key(&key), "admin", None)
                .await?;
            eprintln!(
                "\n=== dprec: first start, no API keys configured ===\n\
                 generated admin API key (shown once, only its SHA-256 is stored):\n\n    {key}\n\n\
                 use it as `Authorization: Bearer <key>`; `dprec keys create --role ROLE` makes more\n\
                 (and replaces a lost one), `dprec keys list` / `dprec keys revoke ID` manage them;\n\
                 POST /v1/admin/keys does the same over HTTP (roles: admin, writer, reader, user, public)\n"
            );
            bootstrap_key = Some(key);
        }
        stored = auth::stored_grants(store).await?;
    }
    let keys = auth::Keys::new(settings.auth.mode, configured, stored);
    Ok((keys, bootstrap_key))
}

/// Re-reads the stored keys and the page-link secret file every `every`, so `dprec keys
/// create/revoke/rotate-link-secret` reach a running server without a restart.
async fn reload_keys(
    store: Store,
    keys: auth::Keys,
    link_keys: api::pages::secret::LinkKeys,
    every: std::time::Duration,
) {
    loop {
        tokio::time::sleep(every).await;
        if let Err(e) = keys.reload(&store).await {
            log::warn!("reloading API keys: {e:#}");
        }
        match link_keys.reload() {
            Ok(true) => log::info!("page-link secret rotated: links minted before are void"),
            Ok(false) => {}
            Err(e) => log::warn!("reloading the page-link secret (keeping the current one): {e:#}"),
        }
    }
}

/// How far back each check for changed ratings reaches before the previous check's read:
/// a rating's `updated_at` is taken inside its transaction, before the commit, so a write
/// can become visible after a check whose read began later than its timestamp. Merging a
/// change twice changes nothing; the overlap costs reading those rows again.
const CHANGE_OVERLAP_MS: i64 = 10_000;

/// Every `every`, merges the ratings other processes on the same database changed into
/// the serving facts of the cached users (`serve::facts`): only the rows changed since
/// the previous check (with an overlap), never a sweep of the cache.
async fn refresh_user_facts(
    store: Store,
    cache: Arc<crate::serve::facts::UserFactsCache>,
    every: std::time::Duration,
) {
    let mut last = crate::store::now_ms();
    loop {
        tokio::time::sleep(every).await;
        let started = crate::store::now_ms();
        let clock = cache.clock();
        let rows = store
            .ratings_changed_since(last - CHANGE_OVERLAP_MS, |u| cache.contains(u))
            .await;
        match rows {
            Ok(rows) => {
                let changes: Vec<_> = rows
                    .into_iter()
                    .map(
                        |(user, item, value, user_deleted)| crate::serve::facts::ChangedRating {
                            user,
                            item,
                            value,
                            user_deleted,
                        },
                    )
                    .collect();
                let n = cache.apply_changes(clock, &changes);
                if n > 0 {
                    log::debug!("serving facts: {n} cached users changed by other writers");
                }
                last = started;
            }
            Err(e) => log::warn!("reading changed ratings for the serving cache: {e:#}"),
        }
    }
}

/// `auth.mode = "disabled"` is for development on a loopback address only, and loud.
fn warn_if_auth_disabled(settings: &Settings, addr: std::net::SocketAddr) -> anyhow::Result<()> {
    if settings.auth.mode == AuthMode::Disabled {
        if !addr.ip().is_loopback() {
            bail!("auth.mode = \"disabled\" is only allowed on a loopback address, not {addr}");
        }
        log::warn!("AUTHENTICATION DISABLED (auth.mode = \"disabled\"): development only");
        eprintln!(
            "WARNING: dprec is running WITHOUT AUTHENTICATION on {addr} (auth.mode = \"disabled\")"
        );
    }
    Ok(())
}

/// The HTTP server: the API routes with problem+json errors for bad paths, queries,
/// methods and unknown routes, and per-route request metrics.
fn http_server(
    state: web::Data<AppState>,
    metrics: Arc<Metrics>,
    listener: TcpListener,
) -> anyhow::Result<actix_web::dev::Server> {
    let m = metrics;
    let server = HttpServer::new(move || {
        let m = m.clone();
        let series = std::rc::Rc::new(crate::metrics::RouteSeries::default());
        let foreground = state.store.foreground().clone();
        App::new()
            .app_data(state.clone())
            .app_data(
                web::QueryConfig::default()
                    .error_handler(|e, req| api::untyped_query_error(req, &e.to_string()).into()),
            )
            .app_data(
                web::PathConfig::default()
                    .error_handler(|e, _| ApiError::invalid("path", e.to_string()).into()),
            )
            .wrap_fn(move |req, srv| {
                let start = Instant::now();
                let method = req.method().clone();
                let m = m.clone();
                let series = series.clone();
                // While it runs, a release commit steps aside between its transactions.
                let busy = foreground.request();
                let fut = srv.call(req);
                async move {
                    let res = fut.await;
                    drop(busy);
                    let res = res?;
                    let route = res
                        .request()
                        .match_pattern()
                        .unwrap_or_else(|| "unmatched".into());
                    let secs = start.elapsed().as_secs_f64();
                    series.observe(&m, method.as_str(), &route, res.status().as_u16(), secs);
                    Ok(res)
                }
            })
            .wrap(ErrorHandlers::new().handler(StatusCode::METHOD_NOT_ALLOWED, method_not_allowed))
            .wrap_fn(|req, srv| {
                // Before routing: a too-long request target is refused without reading it
                // further.
                let len = req.uri().path_and_query().map_or(0, |pq| pq.as_str().len());
                if len > api::MAX_URI_BYTES {
                    let e = ApiError::new(
                        StatusCode::URI_TOO_LONG,
                        "URI too long",
                        format!(
                            "request target of {len} bytes exceeds the limit of {}",
                            api::MAX_URI_BYTES
                        ),
                    );
                    let res = req.into_response(e.error_response()).map_into_right_body();
                    Either::Left(std::future::ready(Ok(res)))
                } else {
                    let fut = srv.call(req);
                    Either::Right(async move { fut.await.map(|r| r.map_into_left_body()) })
                }
            })
            .configure(api::routes)
            .default_service(web::to(|req: HttpRequest| async move {
                Err::<actix_web::HttpResponse, _>(ApiError::not_found(format!(
                    "no route for {} {}",
                    req.method(),
                    req.path()
                )))
            }))
    })
    .workers(2)
    .listen(listener)?
    .run();
    Ok(server)
}

/// What a previous run left behind: its trainer lease, when this instance ran it (taken
/// over at once), and the jobs of runs that died (marked failed).
async fn recover_jobs(
    store: &Store,
    settings: &Settings,
    retrainer: &Retrainer,
) -> anyhow::Result<()> {
    let started_ms = crate::store::now_ms();
    if let Some(instance) = settings.instance_id() {
        if store
            .take_over_own_lease(&instance, retrainer.holder())
            .await?
        {
            // The previous run of this instance died holding the lease: its running
            // jobs will never finish (nothing of theirs was committed, or they would
            // be finished).
            let n = store
                .fail_running_jobs(
                    started_ms,
                    "abandoned: the instance running it stopped (taken over at restart)",
                )
                .await?;
            log::warn!(
                "took over the trainer lease left by a previous run of {instance}; \
                 marked {n} of its job(s) failed"
            );
        }
    }
    let abandoned = store
        .fail_abandoned_jobs(settings.scheduler.lease_secs)
        .await?;
    if abandoned > 0 {
        log::warn!("marked {abandoned} abandoned retrain job(s) as failed");
    }
    Ok(())
}

impl Application {
    /// Builds the service. `trainer`: `None` builds the configured one by name.
    pub async fn build(
        settings: Settings,
        trainer: Option<Arc<dyn Trainer>>,
        hooks: Hooks,
    ) -> anyhow::Result<Self> {
        settings.validate()?;
        let addr = settings.bind_addr()?;
        let trainer = match trainer {
            Some(t) => t,
            None => trainer_from_settings(&settings)?,
        };
        check_trainer(&settings, trainer.as_ref())?;
        warn_if_auth_disabled(&settings, addr)?;
        // Bind first: a port in use must fail before anything is created (e.g. the
        // first-start admin key, which is shown once).
        let listener = TcpListener::bind(addr).with_context(|| {
            format!("cannot listen on {addr} (server.bind / --bind; is another process using it?)")
        })?;
        let store = Store::connect_with(
            &settings.database.url,
            settings.database.max_connections,
            settings.database.sqlite_synchronous == crate::config::SqliteSync::Full,
        )
        .await?;
        log::info!(
            "store: {} ({})",
            store.backend().name(),
            crate::store::redact_url(&settings.database.url)
        );

        let (keys, bootstrap_key) = load_keys(&settings, &store).await?;
        let link_keys = api::pages::secret::LinkKeys::load(&settings)?;

        let settings = Arc::new(settings);
        let metrics = Arc::new(Metrics::new());
        let registry = Arc::new(Registry::new());
        let retrainer = Arc::new(Retrainer::new(
            store.clone(),
            registry.clone(),
            trainer,
            settings.clone(),
            metrics.clone(),
            hooks,
        )?);
        recover_jobs(&store, &settings, &retrainer).await?;
        if let Some(id) = retrainer.load_latest().await? {
            log::info!("serving release {id} from the store");
        }
        let user_facts = Arc::new(crate::serve::facts::UserFactsCache::new(
            settings.server.cache_users,
            settings.server.cache_ratings,
        ));
        let state = web::Data::new(AppState {
            store: store.clone(),
            registry: registry.clone(),
            retrainer: retrainer.clone(),
            settings: settings.clone(),
            metrics: metrics.clone(),
            keys: keys.clone(),
            link_keys: link_keys.clone(),
            scale: settings.scale()?,
            user_facts: user_facts.clone(),
            write_lane: Arc::new(crate::lanes::Lane::start("dprec-write")?),
            documents: Arc::new(documents()?),
        });
        let port = listener.local_addr()?.port();
        let server = http_server(state, metrics.clone(), listener)?;
        let scheduler = settings.scheduler.enabled;
        Ok(Self {
            port,
            server,
            store,
            registry,
            retrainer,
            bootstrap_key,
            scheduler,
            keys,
            link_keys,
            reload_secs: settings.scheduler.reload_secs,
            user_facts,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Runs the server (and the scheduler, if enabled) until it stops.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let sched = self
            .scheduler
            .then(|| tokio::spawn(self.retrainer.clone().schedule()));
        let watch = tokio::spawn(self.retrainer.clone().watch_releases());
        let key_reload = (self.reload_secs > 0).then(|| {
            tokio::spawn(reload_keys(
                self.store.clone(),
                self.keys.clone(),
                self.link_keys.clone(),
                std::time::Duration::from_secs(self.reload_secs),
            ))
        });
        let facts_refresh = (self.reload_secs > 0).then(|| {
            tokio::spawn(refresh_user_facts(
                self.store.clone(),
                self.user_facts.clone(),
                std::time::Duration::from_secs(self.reload_secs),
            ))
        });
        let cold_refresh = (self.reload_secs > 0).then(|| {
            tokio::spawn(crate::release::cold_items::refresh_every(
                self.store.clone(),
                self.registry.clone(),
                std::time::Duration::from_secs(self.reload_secs),
            ))
        });
        let r = self.server.await;
        if let Some(h) = sched {
            h.abort();
        }
        for h in [key_reload, facts_refresh, cold_refresh]
            .into_iter()
            .flatten()
        {
            h.abort();
        }
        watch.abort();
        r
    }

    /// A handle to stop the server.
    pub fn handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }
}

/// Turns actix's bare 405 into problem+json.
fn method_not_allowed<B>(res: ServiceResponse<B>) -> actix_web::Result<ErrorHandlerResponse<B>> {
    let detail = format!(
        "{} is not allowed on {}",
        res.request().method(),
        res.request().path()
    );
    let allow = res
        .request()
        .match_pattern()
        .and_then(|p| api::allowed_methods(&p));
    let (req, _) = res.into_parts();
    let problem = ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed", detail);
    let mut response = problem.error_response();
    if let Some(allow) = allow {
        response.headers_mut().insert(
            actix_web::http::header::ALLOW,
            actix_web::http::header::HeaderValue::from_static(allow),
        );
    }
    let res = ServiceResponse::new(req, response)
        .map_into_boxed_body()
        .map_into_right_body();
    Ok(ErrorHandlerResponse::Response(res))
}

/// The API document and its HTML page, rendered once from the code's OpenAPI spec.
fn documents() -> anyhow::Result<crate::api::Documents> {
    let spec_json = crate::api::openapi::spec_json();
    let spec: serde_json::Value = serde_json::from_str(&spec_json)?;
    Ok(crate::api::Documents {
        docs_page: crate::api::docs::render(&spec),
        spec_json,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(name: &str, params: &[(&str, &str)]) -> Settings {
        let mut s = Settings::default();
        s.trainer.name = name.into();
        s.trainer.params = params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        s
    }

    fn checked(s: &Settings) -> anyhow::Result<()> {
        check_trainer(s, trainer_from_settings(s)?.as_ref())
    }

    /// `pdp-pmf` and `dp-pmf` (rating-level) are refused at start-up unless the operator
    /// opts in, with a reason naming the switch; with the switch they pass, and the
    /// switch with a user-level trainer is refused.
    #[test]
    fn rating_level_trainers_need_the_switch() {
        for name in ["pdp-pmf", "dp-pmf"] {
            let mut s = settings(name, &[]);
            let msg = format!("{:#}", checked(&s).unwrap_err());
            assert!(
                msg.contains("trainer.allow_rating_level") && msg.contains(name),
                "{msg}"
            );
            s.trainer.allow_rating_level = true;
            checked(&s).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        }
        let mut s = settings("dp-alt", &[]);
        s.trainer.allow_rating_level = true;
        let msg = format!("{:#}", checked(&s).unwrap_err());
        assert!(msg.contains("trainer.allow_rating_level"), "{msg}");
    }

    /// A proven trainer converts its rating-level Renyi loss at the ledger's delta (the one
    /// the per-rating promise names); another delta_r is refused, naming the field.
    /// `dp-alt`'s and `gaussian-mf`'s former default (1e-5) is refused.
    #[test]
    fn a_served_trainer_must_use_the_ledgers_rating_delta() {
        for name in ["dp-alt", "gaussian-mf", "dp-topn", "dp-popularity"] {
            checked(&settings(name, &[])).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            let err = checked(&settings(name, &[("delta_r", "1e-5")])).unwrap_err();
            let msg = format!("{err:#}");
            assert!(msg.contains("trainer.params.delta_r"), "{name}: {msg}");
        }
    }
}
