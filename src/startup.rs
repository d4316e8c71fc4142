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

use crate::api::{self, auth, ApiError, AppState};
use crate::config::{AuthMode, Role, Settings};
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

/// Refuses trainers the serving policy does not allow.
pub fn check_trainer(s: &Settings, t: &dyn Trainer) -> anyhow::Result<()> {
    match t.guarantee() {
        Guarantee::Proven => Ok(()),
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
    let mut hashed: Vec<(String, Role)> = settings
        .auth
        .keys
        .iter()
        .map(|k| (auth::hash_key(&k.key), k.role))
        .collect();
    let mut bootstrap_key = None;
    if settings.auth.mode == AuthMode::Keys {
        if settings.auth.keys.is_empty() && store.api_key_count().await? == 0 {
            let key = auth::generate_key();
            store.insert_api_key(&auth::hash_key(&key), "admin").await?;
            eprintln!(
                "\n=== dprec: first start, no API keys configured ===\n\
                 generated admin API key (shown once, only its SHA-256 is stored):\n\n    {key}\n\n\
                 use it as `Authorization: Bearer <key>`; configure [[auth.keys]] for more keys\n"
            );
            bootstrap_key = Some(key);
        }
        for (h, role) in store.api_keys().await? {
            if let Some(r) = auth::parse_role(&role) {
                hashed.push((h, r));
            }
        }
    }
    let keys = auth::Keys::new(settings.auth.mode, hashed);
    Ok((keys, bootstrap_key))
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
        App::new()
            .app_data(state.clone())
            .app_data(web::QueryConfig::default().error_handler(|e, _| {
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid query",
                    e.to_string(),
                )
                .with_field("query")
                .into()
            }))
            .app_data(
                web::PathConfig::default()
                    .error_handler(|e, _| ApiError::invalid("path", e.to_string()).into()),
            )
            .wrap_fn(move |req, srv| {
                let start = Instant::now();
                let method = req.method().to_string();
                let m = m.clone();
                let fut = srv.call(req);
                async move {
                    let res = fut.await?;
                    let route = res
                        .request()
                        .match_pattern()
                        .unwrap_or_else(|| "unmatched".into());
                    let status = res.status().as_u16().to_string();
                    m.http_requests
                        .with_label_values(&[method.as_str(), route.as_str(), status.as_str()])
                        .inc();
                    m.http_duration
                        .with_label_values(&[method.as_str(), route.as_str()])
                        .observe(start.elapsed().as_secs_f64());
                    Ok(res)
                }
            })
            .wrap(ErrorHandlers::new().handler(StatusCode::METHOD_NOT_ALLOWED, method_not_allowed))
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
        let store =
            Store::connect(&settings.database.url, settings.database.max_connections).await?;
        log::info!(
            "store: {} ({})",
            store.backend().name(),
            redact(&settings.database.url)
        );

        let (keys, bootstrap_key) = load_keys(&settings, &store).await?;

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
        let abandoned = store
            .fail_abandoned_jobs(settings.scheduler.lease_secs)
            .await?;
        if abandoned > 0 {
            log::warn!("marked {abandoned} abandoned retrain job(s) as failed");
        }
        if let Some(id) = retrainer.load_latest().await? {
            log::info!("serving release {id} from the store");
        }
        let state = web::Data::new(AppState {
            store: store.clone(),
            registry: registry.clone(),
            retrainer: retrainer.clone(),
            settings: settings.clone(),
            metrics: metrics.clone(),
            keys,
            scale: settings.scale()?,
            user_facts: Arc::new(crate::serve::facts::UserFactsCache::new(
                std::time::Duration::from_secs(settings.scheduler.reload_secs.clamp(1, 60)),
                200_000,
            )),
        });
        let listener = TcpListener::bind(addr).with_context(|| format!("binding {addr}"))?;
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
        let r = self.server.await;
        if let Some(h) = sched {
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
    let (req, _) = res.into_parts();
    let problem = ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed", detail);
    let res = ServiceResponse::new(req, problem.error_response())
        .map_into_boxed_body()
        .map_into_right_body();
    Ok(ErrorHandlerResponse::Response(res))
}

fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***{}", &url[..s], &url[at..]),
        _ => url.to_string(),
    }
}
