//! `dprec import`: loads MovieLens ratings into a running service through the batch
//! endpoint, with a progress bar, reporting ratings/s at the end. It first registers the
//! public item catalogue (`POST /v1/admin/items`; ratings never create items): the
//! release's `u.item` / `movies.dat` / `movies.csv` beside the ratings file, with each
//! movie's title and genres (labels), else the distinct items of the imported file (said
//! on stdout).

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::api::domain::Epsilon;
use crate::data::movielens::{self, Format};
use crate::model::catalogue::movielens::{parse_u_genre, CatalogueFormat, ML100K_GENRES};
use crate::model::catalogue::ItemInfo;

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Base URL of the service.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// API key with the writer role.
    #[arg(long, env = "DPREC_API_KEY")]
    pub api_key: Option<String>,
    /// eps_ij sent with every rating (default: the service's defaults).
    #[arg(long)]
    pub eps: Option<f64>,
    /// Ratings per request.
    #[arg(long, default_value_t = 5000)]
    pub batch: usize,
    /// Stop after this many ratings.
    #[arg(long)]
    pub limit: Option<usize>,
    /// MovieLens directory (100K, 1M or latest) or ratings file.
    pub path: PathBuf,
}

pub fn run(args: ImportArgs) -> anyhow::Result<()> {
    // Every argument is checked before the first request, so a bad one stores nothing
    // (not even the catalogue).
    if args.batch == 0 {
        bail!("--batch must be >= 1");
    }
    if let Some(e) = args.eps {
        check_eps(e)?;
    }
    if args.limit == Some(0) {
        bail!("--limit must be >= 1");
    }
    super::require_input(&args.path, "the MovieLens path")?;
    let file = if args.path.is_dir() {
        movielens::ratings_file(&args.path)?
    } else {
        args.path.clone()
    };
    let format = Format::detect(&file)?;
    let size = std::fs::metadata(&file)?.len();
    let reader = BufReader::new(
        std::fs::File::open(&file).with_context(|| format!("opening {}", file.display()))?,
    );
    let api = Api::new(&args)?;
    // `Some`: no catalogue file, each batch's new items are registered as they come.
    let mut registered = register_catalogue(&api, &file, format, args.batch)?;
    let bar = ProgressBar::new(size);
    bar.set_style(ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {msg}",
    )?);
    let started = Instant::now();
    let mut sent = 0usize;
    let mut batch = Vec::with_capacity(args.batch);
    let mut read = 0u64;
    let mut post = |batch: &mut Vec<serde_json::Value>| -> anyhow::Result<()> {
        if let Some(seen) = registered.as_mut() {
            api.register_new(seen, batch, args.batch)?;
        }
        api.post("/v1/ratings", &json!({"ratings": batch}))?;
        batch.clear();
        Ok(())
    };
    for (n, line) in reader.lines().enumerate() {
        let line = line?;
        read += line.len() as u64 + 1;
        let Some(r) = movielens::parse_line(format, &line)
            .map_err(|e| anyhow::anyhow!("{}:{}: {e}", file.display(), n + 1))?
        else {
            continue;
        };
        let mut item = json!({"user": r.user, "item": r.item, "rating": r.value});
        if let Some(e) = args.eps {
            item["eps"] = json!(e);
        }
        batch.push(item);
        if batch.len() == args.batch {
            sent += batch.len();
            post(&mut batch)?;
            bar.set_position(read.min(size));
            bar.set_message(format!("{sent} ratings"));
        }
        if args.limit.is_some_and(|l| sent + batch.len() >= l) {
            break;
        }
    }
    if !batch.is_empty() {
        sent += batch.len();
        post(&mut batch)?;
    }
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "imported {sent} ratings from {} in {secs:.1} s ({:.0} ratings/s)",
        file.display(),
        sent as f64 / secs.max(1e-9)
    );
    Ok(())
}

/// `--eps`: finite and at least the API's smallest eps ([`Epsilon::MIN`]); the upper
/// bound is the service's `budget.max_rating_eps`, which the service checks.
fn check_eps(e: f64) -> anyhow::Result<()> {
    if !e.is_finite() || e < Epsilon::MIN {
        bail!(
            "--eps must be a finite number >= {} (and at most the service's \
             budget.max_rating_eps), got {}",
            Epsilon::MIN,
            crate::api::domain::echo(e)
        );
    }
    Ok(())
}

/// Registers the catalogue file beside `file` (`u.item`, `movies.dat`, `movies.csv`),
/// titles and genres included, and returns `None`; without one, says so and returns the (empty) set of items registered
/// so far, to be filled batch by batch from the ratings file.
fn register_catalogue(
    api: &Api,
    file: &std::path::Path,
    format: Format,
    batch: usize,
) -> anyhow::Result<Option<HashSet<String>>> {
    let Some(cat) = movielens::catalogue_file(file, format) else {
        println!(
            "no u.item, movies.dat or movies.csv beside {}: registering the distinct items \
             of the ratings file as the catalogue",
            file.display()
        );
        return Ok(Some(HashSet::new()));
    };
    let items = read_catalogue_info(&cat)?;
    let (created, updated) = api.register_info(&items, batch)?;
    let titled = items.iter().filter(|i| i.title.is_some()).count();
    let labelled = items.iter().filter(|i| !i.labels.is_empty()).count();
    println!(
        "registered the catalogue of {}: {} items ({created} new, {updated} updated), \
         {titled} with a title, {labelled} with labels",
        cat.display(),
        items.len()
    );
    Ok(None)
}

/// The items of a MovieLens catalogue file with their titles and genres
/// ([`crate::model::catalogue::movielens`]); a `u.item`'s genres are named by the `u.genre`
/// beside it, or are MovieLens-100K's when there is none.
pub fn read_catalogue_info(path: &Path) -> anyhow::Result<Vec<ItemInfo>> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let Some(format) = CatalogueFormat::of_file_name(name) else {
        bail!(
            "{}: not a MovieLens catalogue file (u.item, movies.dat or movies.csv)",
            path.display()
        );
    };
    let read = |p: &Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
    let genres: Vec<String> = match path.with_file_name("u.genre") {
        g if format == CatalogueFormat::UItem && g.is_file() => {
            parse_u_genre(&read(&g)?).map_err(|e| anyhow::anyhow!("{}: {e}", g.display()))?
        }
        _ => ML100K_GENRES.iter().map(|g| g.to_string()).collect(),
    };
    format
        .parse(&read(path)?, &genres)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// The service, as `dprec import` calls it.
struct Api {
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
    base: String,
    key: Option<String>,
}

impl Api {
    fn new(args: &ImportArgs) -> anyhow::Result<Self> {
        if args.url.starts_with("https://") && !cfg!(feature = "tls") {
            anyhow::bail!(
                "--url {}: this dprec was built without TLS; rebuild with \
                 `cargo build --release --features tls`, or import over http \
                 (e.g. on the service's host)",
                args.url
            );
        }
        Ok(Self {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
            client: reqwest::Client::new(),
            base: args.url.trim_end_matches('/').to_string(),
            key: args.api_key.clone(),
        })
    }

    /// Registers the items of `ratings` not in `seen` (and adds them to it).
    fn register_new(
        &self,
        seen: &mut HashSet<String>,
        ratings: &[serde_json::Value],
        batch: usize,
    ) -> anyhow::Result<()> {
        let new: Vec<String> = ratings
            .iter()
            .filter_map(|r| r["item"].as_str())
            .filter(|i| seen.insert(i.to_string()))
            .map(str::to_string)
            .collect();
        if !new.is_empty() {
            self.register(&new, batch)?;
        }
        Ok(())
    }

    /// POSTs `body` to `path`; the JSON answer, or an error with the service's problem.
    fn post(&self, path: &str, body: &serde_json::Value) -> anyhow::Result<serde_json::Value> {
        let mut req = self.client.post(format!("{}{path}", self.base)).json(body);
        if let Some(k) = &self.key {
            req = req.bearer_auth(k);
        }
        let resp = self.rt.block_on(req.send()).context("sending a batch")?;
        let status = resp.status();
        let text = self.rt.block_on(resp.text()).unwrap_or_default();
        if !status.is_success() {
            bail!("the service answered {status}: {text}");
        }
        Ok(serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
    }

    /// Registers `items` with their information in batches of `batch`; returns how many
    /// were new and how many got new information.
    fn register_info(&self, items: &[ItemInfo], batch: usize) -> anyhow::Result<(u64, u64)> {
        let (mut created, mut updated) = (0, 0);
        for chunk in items.chunks(batch) {
            let r = self.post("/v1/admin/items", &json!({ "items": chunk }))?;
            created += r["created"].as_u64().unwrap_or(0);
            updated += r["updated"].as_u64().unwrap_or(0);
        }
        Ok((created, updated))
    }

    /// Registers `items` in batches of `batch`; returns how many were new.
    fn register(&self, items: &[String], batch: usize) -> anyhow::Result<u64> {
        let mut created = 0;
        for chunk in items.chunks(batch) {
            let r = self.post("/v1/admin/items", &json!({ "items": chunk }))?;
            created += r["created"].as_u64().unwrap_or(0);
        }
        Ok(created)
    }
}
