//! SVG plots of evaluation reports: a metric (RMSE, NDCG@k, precision@k, recall@k; mean
//! over folds, with +-1 sd bars) against the swept parameter, one line per trainer;
//! without a sweep, the metric per fold. Runs without the metric (NaN, e.g. RMSE of a
//! model that only ranks) are left out of the plot.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;

use super::{FoldResult, RunReport, Summary};

/// The figure a plot shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Metric {
    Rmse,
    Ndcg,
    Precision,
    Recall,
}

impl Metric {
    fn of_summary(self, s: &Summary) -> f64 {
        match self {
            Metric::Rmse => s.rmse,
            Metric::Ndcg => s.ndcg,
            Metric::Precision => s.precision,
            Metric::Recall => s.recall,
        }
    }

    fn of_fold(self, f: &FoldResult) -> f64 {
        let rank = |g: fn(&super::RankingMetrics) -> f64| f.ranking.as_ref().map(g);
        match self {
            Metric::Rmse => f.rmse,
            Metric::Ndcg => rank(|m| m.ndcg).unwrap_or(f64::NAN),
            Metric::Precision => rank(|m| m.precision).unwrap_or(f64::NAN),
            Metric::Recall => rank(|m| m.recall).unwrap_or(f64::NAN),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Metric::Rmse => "test RMSE",
            Metric::Ndcg => "NDCG@10",
            Metric::Precision => "precision@10",
            Metric::Recall => "recall@10",
        }
    }
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// A line of points (x, mean, sd) with its legend label.
type Series = (String, Vec<(f64, f64, f64)>);

/// The x axis label and the lines of the plot: per sweep point (with runs that lack the
/// swept parameter as flat reference lines), or per fold without a sweep.
fn plot_series(runs: &[RunReport], metric: Metric, swept: Option<&str>) -> (String, Vec<Series>) {
    let (x_label, mut series) = match swept {
        Some(param) => (param.to_owned(), sweep_series(runs, metric)),
        None => ("fold".to_owned(), fold_series(runs, metric)),
    };
    // In a sweep, runs without the swept parameter (e.g. non-private baselines) are
    // reference lines drawn flat across the swept range.
    if swept.is_some() {
        let xs: Vec<f64> = series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|x| x.0))
            .collect();
        let (lo, hi) = bounds(xs.into_iter());
        for r in runs.iter().filter(|r| r.sweep.is_none()) {
            series.push((
                format!("{} (reference)", r.label),
                vec![
                    (lo, metric.of_summary(&r.mean), 0.0),
                    (hi, metric.of_summary(&r.mean), 0.0),
                ],
            ));
        }
    }
    (x_label, series)
}

/// Writes an SVG plot of `runs` to `path`.
pub fn write_svg(
    runs: &[RunReport],
    title: &str,
    path: &Path,
    metric: Metric,
) -> anyhow::Result<()> {
    let with_metric: Vec<RunReport> = runs
        .iter()
        .filter(|r| metric.of_summary(&r.mean).is_finite())
        .cloned()
        .collect();
    let runs = with_metric.as_slice();
    let swept = runs
        .iter()
        .find_map(|r| r.sweep.as_ref().map(|s| s.param.clone()));
    let (x_label, series) = plot_series(runs, metric, swept.as_deref());
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|x| x.0))
        .collect();
    let lows = series.iter().flat_map(|(_, p)| p.iter().map(|x| x.1 - x.2));
    let highs = series.iter().flat_map(|(_, p)| p.iter().map(|x| x.1 + x.2));
    let (x0, x1) = bounds(xs.iter().copied());
    let (y0, y1) = bounds(lows.chain(highs));
    let log_x = swept.is_some() && x0 > 0.0 && x1 / x0 >= 20.0;
    let ypad = ((y1 - y0) * 0.1).max(1e-3);

    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60);
    // Headroom above the data for the legend box (one line per series).
    let legend_room = (y1 - y0 + ypad) * (0.08 * series.len() as f64 + 0.1);
    let y_range = (y0 - ypad)..(y1 + ypad + legend_room);
    if log_x {
        let mut chart = builder.build_cartesian_2d((x0 * 0.8..x1 * 1.25).log_scale(), y_range)?;
        chart
            .configure_mesh()
            .x_desc(format!("{x_label} (log scale)"))
            .y_desc(format!("{} (mean ± sd over folds)", metric.label()))
            .x_labels(10)
            .x_label_formatter(&|x| short_number(*x))
            .draw()?;
        draw_series(&mut chart, &series, true)?;
    } else {
        let xpad = if x1 > x0 { (x1 - x0) * 0.05 } else { 0.5 };
        let mut chart = builder.build_cartesian_2d((x0 - xpad)..(x1 + xpad), y_range)?;
        // Without a sweep the x axis is the fold: label whole positions with fold names.
        let fold_names: Vec<String> = runs
            .first()
            .map(|r| r.folds.iter().map(|f| f.fold.clone()).collect())
            .unwrap_or_default();
        let fold_label = |x: &f64| {
            let k = x.round();
            match fold_names.get(k as usize - 1) {
                Some(name) if (x - k).abs() < 1e-6 && k >= 1.0 => name.clone(),
                _ => String::new(),
            }
        };
        let mut mesh = chart.configure_mesh();
        mesh.x_desc(x_label);
        if swept.is_some() {
            mesh.y_desc(format!("{} (mean ± sd over folds)", metric.label()));
        } else {
            mesh.y_desc(metric.label())
                .x_labels(fold_names.len() * 2 + 3)
                .x_label_formatter(&fold_label);
        }
        mesh.draw()?;
        // Folds are separate data sets, not steps of a curve: points, not lines.
        draw_series(&mut chart, &series, swept.is_some())?;
    }
    root.present()?;
    Ok(())
}

fn draw_series<'a, X>(
    chart: &mut ChartContext<
        'a,
        SVGBackend<'a>,
        Cartesian2d<X, plotters::coord::types::RangedCoordf64>,
    >,
    series: &[Series],
    connect: bool,
) -> anyhow::Result<()>
where
    X: Ranged<ValueType = f64>,
{
    for (k, (label, pts)) in series.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        // Lines join the points of a sweep only; the legend entry hangs on the points.
        let line = if connect { pts.len() } else { 0 };
        chart
            .draw_series(LineSeries::new(
                pts.iter().take(line).map(|p| (p.0, p.1)),
                color.stroke_width(2),
            ))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart
            .draw_series(
                pts.iter()
                    .map(|p| Circle::new((p.0, p.1), 4, color.filled())),
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(label.clone())
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, color.filled()));
        chart
            .draw_series(pts.iter().filter(|p| p.2 > 0.0).map(|p| {
                ErrorBar::new_vertical(p.0, p.1 - p.2, p.1, p.1 + p.2, color.stroke_width(1), 8)
            }))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// One series per trainer (with its non-swept parameters), x = swept value.
fn sweep_series(runs: &[RunReport], metric: Metric) -> Vec<Series> {
    let mut by_label: BTreeMap<String, Vec<(f64, f64, f64)>> = BTreeMap::new();
    for r in runs {
        let Some(s) = &r.sweep else { continue };
        by_label.entry(r.label.clone()).or_default().push((
            s.value,
            metric.of_summary(&r.mean),
            metric.of_summary(&r.std),
        ));
    }
    by_label
        .into_iter()
        .map(|(l, mut pts)| {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (l, pts)
        })
        .collect()
}

/// One series per run, x = fold number.
fn fold_series(runs: &[RunReport], metric: Metric) -> Vec<Series> {
    runs.iter()
        .map(|r| {
            let pts = r
                .folds
                .iter()
                .enumerate()
                .map(|(k, f)| ((k + 1) as f64, metric.of_fold(f), 0.0))
                .collect();
            (r.label.clone(), pts)
        })
        .collect()
}

/// A tick label without floating-point noise: three significant digits, no trailing zeros.
fn short_number(x: f64) -> String {
    let s = format!("{:.3}", x);
    let s = if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else {
        s
    };
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn bounds(v: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = v.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), x| {
        (l.min(x), h.max(x))
    });
    if lo.is_finite() && hi.is_finite() {
        (lo, hi)
    } else {
        (0.0, 1.0)
    }
}
