//! `dprec accountant`: RDP curve and (eps, delta) for mechanism parameters.
//!
//! Thin layer: parses flags into [`PrivacyEvent`]s, calls the pure
//! [`dprec_dp::accountant`] functions, prints pretty JSON on stdout.

use std::io::Read;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde::Serialize;

use dprec_dp::accountant::{
    compose_events, default_orders, delta_from_rdp, eps_from_rdp, PrivacyEvent, PrivacyGuarantee,
    RdpCurve,
};

/// Arguments of `dprec accountant`.
#[derive(Debug, Args)]
#[command(
    after_help = "Composes the RDP curves of the events on the order grid 1.1..10.9 \
                  (step 0.1), 11..63, 128, 256, 512, 1024 and converts to (eps, delta) with the \
                  improved conversion of dp_accounting / Opacus. Prints JSON: {eps, delta, \
                  best_order, events, rdp_curve (with --curve)}. See docs/ACCOUNTANT.md."
)]
pub struct AccountantArgs {
    #[command(subcommand)]
    pub mechanism: Mechanism,
}

/// The mechanism to account for.
#[derive(Debug, Subcommand)]
pub enum Mechanism {
    /// Gaussian mechanism, `--steps` adaptive applications (RDP alpha s^2 / (2 sigma^2) each).
    Gaussian(GaussianArgs),
    /// Gaussian mechanism on Poisson subsamples of rate q (DP-SGD style), `--steps` times.
    SubsampledGaussian(SubsampledGaussianArgs),
    /// Laplace mechanism of scale b for L1 sensitivity 1 (eps = 1/b), `--steps` times.
    Laplace(LaplaceArgs),
    /// Any pure eps-DP mechanism, charged as RDP min(eps, alpha eps^2 / 2), `--steps` times.
    Pure(PureArgs),
    /// Composition of the privacy events listed in a JSON file.
    Compose(ComposeArgs),
}

/// What to report; shared by every subcommand.
#[derive(Debug, Args)]
pub struct Target {
    /// Target delta: report the smallest eps at this delta.
    #[arg(long, default_value_t = 1e-5, value_parser = parse_delta, allow_negative_numbers = true, conflicts_with = "target_eps")]
    pub delta: f64,
    /// Report the smallest delta at this eps instead of eps at --delta.
    #[arg(long, value_parser = parse_nonneg, allow_negative_numbers = true)]
    pub target_eps: Option<f64>,
    /// Also print the RDP curve (one {order, rdp} per order of the grid).
    #[arg(long, default_value_t = false)]
    pub curve: bool,
}

/// `dprec accountant gaussian`.
#[derive(Debug, Args)]
pub struct GaussianArgs {
    /// Standard deviation of the Gaussian noise (in the units of the query).
    #[arg(long, value_parser = parse_positive, allow_negative_numbers = true)]
    pub sigma: f64,
    /// L2 sensitivity of the query; the noise multiplier is sigma / sensitivity.
    #[arg(long, default_value_t = 1.0, value_parser = parse_positive, allow_negative_numbers = true)]
    pub sensitivity: f64,
    /// Number of applications (composed).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: u64,
    #[command(flatten)]
    pub target: Target,
}

/// `dprec accountant subsampled-gaussian`.
#[derive(Debug, Args)]
pub struct SubsampledGaussianArgs {
    /// Poisson sampling rate q in [0, 1] (each record is in a batch with probability q).
    #[arg(long, value_parser = parse_rate, allow_negative_numbers = true)]
    pub q: f64,
    /// Noise multiplier: noise standard deviation / L2 sensitivity (clipping norm).
    #[arg(long, value_parser = parse_positive, allow_negative_numbers = true)]
    pub sigma: f64,
    /// Number of steps (batches), composed.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: u64,
    #[command(flatten)]
    pub target: Target,
}

/// `dprec accountant laplace`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("noise").required(true).args(["scale", "eps"])))]
pub struct LaplaceArgs {
    /// Laplace scale b relative to L1 sensitivity 1 (eps = 1/b). Exclusive with --eps.
    #[arg(long, value_parser = parse_positive, allow_negative_numbers = true)]
    pub scale: Option<f64>,
    /// Per-application eps of the Laplace mechanism (scale = 1/eps). Exclusive with --scale.
    #[arg(long, value_parser = parse_positive, allow_negative_numbers = true)]
    pub eps: Option<f64>,
    /// Number of applications (composed).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: u64,
    #[command(flatten)]
    pub target: Target,
}

/// `dprec accountant pure`.
#[derive(Debug, Args)]
pub struct PureArgs {
    /// Per-application eps of the pure-DP mechanism.
    #[arg(long, value_parser = parse_nonneg, allow_negative_numbers = true)]
    pub eps: f64,
    /// Number of applications (composed).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: u64,
    #[command(flatten)]
    pub target: Target,
}

/// `dprec accountant compose`.
#[derive(Debug, Args)]
pub struct ComposeArgs {
    /// JSON file with a list of privacy events, e.g.
    /// [{"mechanism":"gaussian","noise_multiplier":2.0,"count":100}]; `-` reads stdin.
    /// Mechanisms: gaussian {noise_multiplier}, poisson_subsampled_gaussian
    /// {sampling_rate, noise_multiplier}, laplace {scale}, pure_dp {eps},
    /// composed {events}; count defaults to 1.
    #[arg(long)]
    pub events: PathBuf,
    #[command(flatten)]
    pub target: Target,
}

/// Why a number on the command line was refused.
#[derive(Debug, thiserror::Error)]
enum ArgError {
    #[error("`{0}` is not a number")]
    NotANumber(String),
    #[error("must be {requirement}, got {value}")]
    OutOfRange {
        value: f64,
        requirement: &'static str,
    },
}

/// A number that `ok` accepts; `requirement` says which ones do.
fn parse_where(s: &str, requirement: &'static str, ok: fn(f64) -> bool) -> Result<f64, ArgError> {
    let value = s
        .trim()
        .parse::<f64>()
        .map_err(|_| ArgError::NotANumber(s.to_owned()))?;
    if ok(value) {
        Ok(value)
    } else {
        Err(ArgError::OutOfRange { value, requirement })
    }
}

fn parse_positive(s: &str) -> Result<f64, ArgError> {
    parse_where(s, "finite and > 0", |v| v.is_finite() && v > 0.0)
}

fn parse_nonneg(s: &str) -> Result<f64, ArgError> {
    parse_where(s, "finite and >= 0", |v| v.is_finite() && v >= 0.0)
}

fn parse_rate(s: &str) -> Result<f64, ArgError> {
    parse_where(s, "in [0, 1]", |v| (0.0..=1.0).contains(&v))
}

fn parse_delta(s: &str) -> Result<f64, ArgError> {
    parse_where(s, "in (0, 1)", |v| v > 0.0 && v < 1.0)
}

/// One point of the printed RDP curve.
#[derive(Debug, Serialize)]
pub struct CurvePoint {
    pub order: f64,
    /// `null` when +inf (no bound at this order).
    pub rdp: Option<f64>,
}

/// The JSON printed by `dprec accountant`.
#[derive(Debug, Serialize)]
pub struct Report {
    pub eps: f64,
    pub delta: f64,
    pub best_order: Option<f64>,
    pub events: Vec<PrivacyEvent>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rdp_curve: Option<Vec<CurvePoint>>,
}

/// Computes the report for `events` (pure; used by [`run`] and by tests).
pub fn report(events: Vec<PrivacyEvent>, target: &Target) -> anyhow::Result<Report> {
    let curve: RdpCurve = compose_events(&events, &default_orders())?;
    let PrivacyGuarantee {
        eps,
        delta,
        best_order,
    } = match target.target_eps {
        Some(eps) => delta_from_rdp(&curve, eps)?,
        None => eps_from_rdp(&curve, target.delta)?,
    };
    anyhow::ensure!(
        eps.is_finite(),
        "no finite eps at --delta {delta}: every order of the RDP curve is infinite"
    );
    let rdp_curve = target.curve.then(|| {
        curve
            .points()
            .map(|(order, rdp)| CurvePoint {
                order,
                rdp: rdp.is_finite().then_some(rdp),
            })
            .collect()
    });
    Ok(Report {
        eps,
        delta,
        best_order,
        events,
        rdp_curve,
    })
}

fn read_events(path: &PathBuf) -> anyhow::Result<Vec<PrivacyEvent>> {
    let text = if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("--events -: reading stdin")?;
        s
    } else {
        std::fs::read_to_string(path)
            .with_context(|| format!("--events: cannot read {}", path.display()))?
    };
    let events: Vec<PrivacyEvent> = serde_json::from_str(&text).with_context(|| {
        format!(
            "--events {}: expected a JSON list of privacy events",
            path.display()
        )
    })?;
    compose_events(&events, &default_orders())
        .with_context(|| format!("--events {}", path.display()))?;
    Ok(events)
}

/// Builds the events from the flags (flag values are already range-checked
/// by clap; the event constructors check again).
fn events_and_target(mechanism: Mechanism) -> anyhow::Result<(Vec<PrivacyEvent>, Target)> {
    Ok(match mechanism {
        Mechanism::Gaussian(a) => (
            vec![PrivacyEvent::gaussian(a.sigma / a.sensitivity, a.steps)
                .context("--sigma / --sensitivity")?],
            a.target,
        ),
        Mechanism::SubsampledGaussian(a) => (
            vec![
                PrivacyEvent::poisson_subsampled_gaussian(a.q, a.sigma, a.steps)
                    .context("--q / --sigma")?,
            ],
            a.target,
        ),
        Mechanism::Laplace(a) => {
            let scale = match (a.scale, a.eps) {
                (Some(b), None) => b,
                (None, Some(e)) => 1.0 / e,
                _ => anyhow::bail!("give exactly one of --scale and --eps"),
            };
            (
                vec![PrivacyEvent::laplace(scale, a.steps).context("--scale / --eps")?],
                a.target,
            )
        }
        Mechanism::Pure(a) => (
            vec![PrivacyEvent::pure_dp(a.eps, a.steps).context("--eps")?],
            a.target,
        ),
        Mechanism::Compose(a) => (read_events(&a.events)?, a.target),
    })
}

/// Runs `dprec accountant`.
pub fn run(args: AccountantArgs) -> anyhow::Result<()> {
    let (events, target) = events_and_target(args.mechanism)?;
    let report = report(events, &target)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
