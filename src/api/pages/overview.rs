//! The operator's overview page (admin): releases and their mechanisms, the plan and
//! where the service is in it, jobs, users by budget left (an exact aggregate, admin
//! only), the quality figures of the last `dprec-lab eval` run if configured. Pure: the
//! handler gathers the data, [`render`] writes the HTML.

use serde::Deserialize;

use super::html::{bar_chart, count, esc, name_of, num, page, query, time};
use super::serving::{Served, COUNT_USERS_UP_TO};
use crate::api::admin::Job;
use crate::api::models::Release;
use dprec_dp::ledger::UserBudget;

/// Everything the overview shows.
#[derive(Debug)]
pub struct OverviewView {
    pub generated_at: i64,
    pub served_release: Option<i64>,
    /// The newest releases (the `GET /v1/models` form), newest first.
    pub releases: Vec<Release>,
    pub release_count: i64,
    pub plan: PlanView,
    /// The newest jobs, newest first.
    pub jobs: Vec<Job>,
    pub budget_left: BudgetLeft,
    /// What the live users get from the served release.
    pub served: Served,
    /// `None`: `pages.eval_report` is not set; `Some(Err)`: it could not be read.
    pub eval: Option<Result<EvalFigures, String>>,
    /// The link token the page was opened with, if any.
    pub link: Option<String>,
}

/// The lifetime plan and the schedule (configuration).
#[derive(Debug, Clone)]
pub struct PlanView {
    pub trainer: String,
    pub planned_releases: u32,
    pub user_eps: f64,
    pub user_delta: f64,
    pub scheduler_enabled: bool,
    pub interval_secs: u64,
}

/// Live users by the share of their eps_u still free (an exact count: admin only).
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetLeft {
    pub users: u64,
    /// Users whose filter has no room at any order.
    pub exhausted: u64,
    /// Ten bins of remaining / eps_u: [0, 10%), ..., [90%, 100%].
    pub bins: [u64; 10],
}

/// Counts users by remaining eps (eps_u minus the filter's eps in use) over eps_u.
pub fn budget_left<'a>(users: impl IntoIterator<Item = &'a UserBudget>) -> BudgetLeft {
    let mut b = BudgetLeft {
        users: 0,
        exhausted: 0,
        bins: [0; 10],
    };
    for u in users {
        b.users += 1;
        let Ok((used, exhausted)) = u.filter_use() else {
            continue;
        };
        if exhausted {
            b.exhausted += 1;
        }
        let share = ((u.eps - used) / u.eps).clamp(0.0, 1.0);
        b.bins[((share * 10.0) as usize).min(9)] += 1;
    }
    b
}

/// The mean figures of one run of a `dprec-lab eval --out` report.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct EvalRun {
    pub trainer: String,
    pub label: String,
    pub mean: EvalMean,
}

/// `null` in the report (NaN: not measured) reads as `None`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct EvalMean {
    pub rmse: Option<f64>,
    pub mae: Option<f64>,
    pub precision: Option<f64>,
    pub recall: Option<f64>,
    pub ndcg: Option<f64>,
    pub coverage: Option<f64>,
}

/// The figures of an eval report, with its data set and when it was written.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalFigures {
    pub path: String,
    pub data: String,
    pub written_at: Option<i64>,
    pub runs: Vec<EvalRun>,
}

/// Parses a `dprec-lab eval --out` report (`{"data": ..., "runs": [...]}`).
pub fn parse_eval(path: &str, text: &str, written_at: Option<i64>) -> Result<EvalFigures, String> {
    #[derive(Deserialize)]
    struct Report {
        data: String,
        runs: Vec<EvalRun>,
    }
    let r: Report = serde_json::from_str(text)
        .map_err(|e| format!("{path}: not a dprec-lab eval report: {e}"))?;
    Ok(EvalFigures {
        path: path.into(),
        data: r.data,
        written_at,
        runs: r.runs,
    })
}

/// The page.
pub fn render(v: &OverviewView) -> String {
    let metrics_note = "the full series need the admin key as a bearer header; a browser \
                        sees the key-less subset";
    let mut body = format!(
        "<h1>dprec: operator overview</h1>\n<p class=\"sub\">generated {} · served release {} \
         · <a href=\"/docs\">API docs (/docs)</a> · <a href=\"/metrics\">metrics (/metrics)</a> \
         ({metrics_note}) · <a href=\"/openapi.json\">/openapi.json</a></p>\n",
        time(v.generated_at),
        v.served_release
            .map_or("none yet".to_string(), |id| id.to_string()),
    );
    body.push_str(&served_section(&v.served));
    body.push_str(&plan_section(v));
    body.push_str(&budget_section(&v.budget_left));
    body.push_str(&releases_section(v));
    body.push_str(&jobs_section(&v.jobs));
    body.push_str(&eval_section(v.eval.as_ref()));
    let again = format!(
        "/v1/admin/overview{}",
        query(&[("link", v.link.clone().unwrap_or_default())])
    );
    body.push_str(&format!(
        "<p class=\"sub\">Admin only. <a href=\"{}\">Reload</a>.</p>",
        esc(&again)
    ));
    page("dprec operator overview", &body)
}

/// What users are served today: personal lists or the DP popularity order.
pub fn served_section(s: &Served) -> String {
    let Some((id, trainer)) = &s.release else {
        return format!(
            "<h2>What users are served</h2>\n<p id=\"served\">Nothing yet: no release is \
             published, so recommendations answer 503 for all {}.</p>\n",
            count(s.live_users, "live user", "live users")
        );
    };
    let release = format!("release {id} (<code>{}</code>)", esc(trainer));
    let text = match s.counts {
        _ if !s.personalises => format!(
            "<b>Popularity for everybody.</b> The served {release} gives nobody a personal \
             list: every one of the {} gets the DP popularity order (<code>\"fallback\": \
             true, \"source\": \"popularity\"</code>). A <code>dp-topn</code> release does \
             this when its noisy test finds that the co-rating table would not beat the \
             counts yet (few ratings, or a small budget per release); later releases add \
             to the counts and switch to personal lists once they are better.",
            count(s.live_users, "live user", "live users")
        ),
        Some((personal, popular)) => format!(
            "The served {release} personalises lists: of the {}, <b id=\"served-personal\">\
             {personal}</b> get a personal list (<code>\"source\": \"profile\"</code>, or \
             <code>\"labels\"</code> from the label model) and \
             <b id=\"served-popularity\">{popular}</b> the DP popularity order (none of \
             their rated items is one the model scores from). Exact counts, admin only.",
            count(s.live_users, "live user", "live users")
        ),
        None => format!(
            "The served {release} personalises lists for users who rated at least one of the \
             items it scores from; the others get the DP popularity order. Not counted per \
             user here: {} are more than the {COUNT_USERS_UP_TO} this page reads one by one.",
            count(s.live_users, "live user", "live users")
        ),
    };
    format!("<h2>What users are served</h2>\n<p id=\"served\">{text}</p>\n")
}

fn plan_section(v: &OverviewView) -> String {
    let p = &v.plan;
    let days = p.interval_secs as f64 / 86_400.0;
    format!(
        "<h2>The plan</h2>\n<p>Every user is promised <b>{planned}</b> releases within \
         (eps_u, delta_u) = ({eps}, {delta:e}) (the default budget; users may lower theirs); \
         the noise of each release is calibrated from that plan before any data is seen. \
         Trainer: <code>{trainer}</code>. Scheduled releases: {sched}.</p>\n\
         <div class=\"kv\"><div><span>published releases</span><b class=\"big\" \
         id=\"release-count\">{count}</b></div><div><span>planned per user</span>\
         <b class=\"big\">{planned}</b></div><div><span>a user who took part in all is at</span>\
         <b class=\"big\">{count} of {planned}</b></div></div>\n",
        planned = p.planned_releases,
        eps = p.user_eps,
        delta = p.user_delta,
        trainer = esc(&p.trainer),
        sched = if p.scheduler_enabled {
            format!(
                "every {days:.1} days, so the plan lasts {:.0} days",
                days * f64::from(p.planned_releases)
            )
        } else {
            "off (admin retrains only)".into()
        },
        count = v.release_count,
    )
}

fn budget_section(b: &BudgetLeft) -> String {
    let bars: Vec<(String, u64)> = b
        .bins
        .iter()
        .enumerate()
        .map(|(i, n)| (format!("{}–{}%", i * 10, i * 10 + 10), *n))
        .collect();
    format!(
        "<h2>Users by budget left</h2>\n<p class=\"note\">Exact counts, not differentially \
         private: shown to admin keys only, never published.</p>\n<p>{}; {} with no \
         room left at any order. Share of eps_u still free (eps_u minus the filter's eps in \
         use):</p>\n{}\n",
        count(b.users, "live user", "live users"),
        b.exhausted,
        bar_chart(&bars, "live users by share of eps_u left")
    )
}

fn releases_section(v: &OverviewView) -> String {
    let mut out = format!(
        "<h2>Releases</h2>\n<p class=\"sub\">The newest {} of {}, newest first (the \
         <code>GET /v1/models</code> records: no exact counts).</p>\n<table id=\"releases\">\
         <thead><tr><th>id</th><th>started</th><th>trainer</th><th>guarantee</th><th>mechanisms \
         (unit, neighbours)</th><th class=\"n\">popularity eps</th><th class=\"n\">job</th></tr>\
         </thead><tbody>\n",
        v.releases.len(),
        v.release_count
    );
    for r in &v.releases {
        let mechs: Vec<String> = r
            .mechanisms
            .iter()
            .map(|m| {
                format!(
                    "<code>{}</code> ({}, {})",
                    esc(&m.name),
                    esc(&name_of(&m.unit)),
                    esc(&name_of(&m.neighbour))
                )
            })
            .collect();
        out.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td></tr>\n",
            r.id,
            time(r.created_at),
            esc(&r.trainer),
            esc(&name_of(&r.guarantee)),
            mechs.join("<br>"),
            if r.popularity_eps == 0.0 {
                "none: own counts".to_string()
            } else {
                num(Some(r.popularity_eps), 4)
            },
            r.job_id.map_or(String::new(), |j| j.to_string())
        ));
    }
    out.push_str(
        "</tbody></table>\n<p class=\"sub\">Popularity eps: what a separate DP popularity \
         release (the noisy counts behind the popularity order) charged each counted rating. \
         \"none: own counts\" means the release published no separate popularity, because \
         its trainer's own DP counts are the popularity order and are paid for in the \
         trainer's cost (<code>dp-topn</code>, <code>dp-alt</code>).</p>\n",
    );
    out
}

fn jobs_section(jobs: &[Job]) -> String {
    let mut out = String::from(
        "<h2>Jobs</h2>\n<table id=\"jobs\"><thead><tr><th>id</th><th>kind</th><th>status</th>\
         <th>started</th><th>took</th><th class=\"n\">release</th><th>reason</th></tr></thead>\
         <tbody>\n",
    );
    for j in jobs {
        out.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td>\
             <td>{}</td></tr>\n",
            j.id,
            esc(&j.kind),
            esc(&j.status),
            time(j.created_at),
            j.finished_at.map_or("running".into(), |f| format!(
                "{:.1} s",
                (f - j.created_at) as f64 / 1e3
            )),
            j.release_id.map_or(String::new(), |r| r.to_string()),
            esc(j.reason.as_deref().unwrap_or(""))
        ));
    }
    out.push_str("</tbody></table>\n");
    out
}

fn eval_section(eval: Option<&Result<EvalFigures, String>>) -> String {
    let mut out = String::from("<h2>Model quality (last eval run)</h2>\n");
    match eval {
        None => out.push_str(
            "<p>Not configured: set <code>pages.eval_report</code> to the JSON report of \
             <code>dprec-lab eval --out FILE</code> to show its figures here.</p>\n",
        ),
        Some(Err(e)) => out.push_str(&format!("<p class=\"note\">{}</p>\n", esc(e))),
        Some(Ok(f)) => {
            out.push_str(&format!(
                "<p class=\"sub\"><code>{}</code> on {}{}: mean over folds.</p>\n<table \
                 id=\"eval\"><thead><tr><th>run</th><th class=\"n\">RMSE</th><th class=\"n\">MAE\
                 </th><th class=\"n\">precision@10</th><th class=\"n\">recall@10</th><th \
                 class=\"n\">NDCG@10</th><th class=\"n\">coverage</th></tr></thead><tbody>\n",
                esc(&f.path),
                esc(&f.data),
                f.written_at
                    .map_or(String::new(), |t| format!(", written {}", time(t))),
            ));
            for r in &f.runs {
                let m = &r.mean;
                out.push_str(&format!(
                    "<tr><td><code>{}</code></td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                     <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                     <td class=\"n\">{}</td></tr>\n",
                    esc(&r.label),
                    num(m.rmse, 4),
                    num(m.mae, 4),
                    num(m.precision, 4),
                    num(m.recall, 4),
                    num(m.ndcg, 4),
                    num(m.coverage, 4)
                ));
            }
            out.push_str("</tbody></table>\n");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use dprec_dp::accountant::{compose_events, PrivacyEvent, RdpCurve};

    #[test]
    fn users_are_binned_by_the_share_left() {
        let zero = RdpCurve::zeros_default();
        let f = dprec_dp::accountant::RenyiFilter::with_default_orders(10.0, 1e-6).unwrap();
        let heavy = compose_events(&[PrivacyEvent::gaussian(0.2, 1).unwrap()], f.orders()).unwrap();
        let users = [
            UserBudget {
                eps: 10.0,
                delta: 1e-6,
                consumed: zero.clone(),
            },
            UserBudget {
                eps: 10.0,
                delta: 1e-6,
                consumed: zero,
            },
            UserBudget {
                eps: 10.0,
                delta: 1e-6,
                consumed: heavy,
            },
        ];
        let b = budget_left(&users);
        assert_eq!((b.users, b.exhausted), (3, 1));
        // A fresh user has nearly all of eps_u free (the filter's conversion term aside).
        assert_eq!(b.bins[9], 2);
        assert_eq!(b.bins[0], 1);
    }

    /// The overview says what users get: popularity for all, counts per source, or
    /// uncounted above the limit; with plurals.
    #[test]
    fn what_users_are_served_is_said() {
        let mut s = Served {
            release: Some((3, "dp-topn".into())),
            personalises: false,
            live_users: 943,
            counts: Some((0, 943)),
        };
        let html = served_section(&s);
        assert!(html.contains("Popularity for everybody") && html.contains("943 live users"));
        assert!(html.contains("release 3 (<code>dp-topn</code>)"), "{html}");
        s.personalises = true;
        s.counts = Some((900, 43));
        let html = served_section(&s);
        assert!(
            html.contains("id=\"served-personal\">900<") && html.contains(">43<"),
            "{html}"
        );
        s.counts = None;
        assert!(served_section(&s).contains("Not counted per user"));
        s.release = None;
        s.live_users = 1;
        let html = served_section(&s);
        assert!(
            html.contains("all 1 live user.") && html.contains("503"),
            "{html}"
        );
    }

    #[test]
    fn eval_reports_parse_with_nulls_and_render_escaped() {
        let text = r#"{"data":"ml-100k","folds":"x","seed":1,"runs":[{"trainer":"dp-topn",
            "label":"<dp-topn>","params":{},"folds":[],"mean":{"rmse":null,"mae":null,
            "train_seconds":1.0,"precision":0.1,"recall":0.2,"ndcg":0.25,"coverage":0.3,
            "mean_popularity":9.0},"std":{}}]}"#;
        let f = parse_eval("r.json", text, Some(0)).unwrap();
        assert_eq!(f.runs[0].mean.ndcg, Some(0.25));
        assert_eq!(f.runs[0].mean.rmse, None);
        let html = eval_section(Some(&Ok(f)));
        assert!(
            html.contains("&lt;dp-topn&gt;") && html.contains("0.2500") && html.contains("n/a")
        );
        assert!(parse_eval("r.json", "{}", None)
            .unwrap_err()
            .contains("r.json"));
        assert!(eval_section(None).contains("pages.eval_report"));
    }
}
