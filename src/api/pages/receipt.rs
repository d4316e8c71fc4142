//! The user's privacy receipt page, rendered from the budget audit (the same [`Audit`]
//! value `GET /v1/users/{user}/budget` serialises) and the user's spend after each
//! release. Pure: no I/O, so `cargo test --lib pages::receipt` checks the HTML.

use super::html::{budget_bar, count, esc, line_chart, name_of, num, page, query, time, url_part};
use super::serving::ListSource;
use crate::api::users::{Audit, RatingOrder, RatingSort, ReleaseChargeView};
use dprec_dp::accountant::PrivacyEvent;

/// Decimals of the eps figures on the page (the browser check compares at this precision).
pub const EPS_DIGITS: usize = 3;

/// Everything the receipt page shows.
#[derive(Debug)]
pub struct ReceiptView {
    pub audit: Audit,
    /// The user's spend on the filter's scale before any release (`None`) and after each
    /// release the user took part in, oldest first: `(release id, filter eps)`
    /// (`dprec_dp::ledger::spend_history`).
    pub history: Vec<(Option<i64>, f64)>,
    /// `budget.planned_releases`: the releases every user is promised.
    pub planned_releases: u32,
    pub order: RatingOrder,
    /// The link token the page was opened with, carried by the page's own links.
    pub link: Option<String>,
    pub generated_at: i64,
    pub served_release: Option<i64>,
    /// What the user's list is made of with the served release.
    pub list: ListSource,
}

/// The page's own URL with `changes` applied to its current query (sort, page, link).
struct Here<'a> {
    user: &'a str,
    v: &'a ReceiptView,
}

impl Here<'_> {
    fn url(&self, sort: RatingOrder, offset: i64, roffset: i64) -> String {
        let a = &self.v.audit;
        let mut q = vec![("link", self.v.link.clone().unwrap_or_default())];
        if sort != RatingOrder::default() {
            q.push(("sort", sort.by.name().to_string()));
            if sort.descending {
                q.push(("desc", "true".into()));
            }
        }
        if offset > 0 {
            q.push(("offset", offset.to_string()));
        }
        if a.ratings.limit != super::RATINGS_PER_PAGE {
            q.push(("limit", a.ratings.limit.to_string()));
        }
        if roffset > 0 {
            q.push(("roffset", roffset.to_string()));
        }
        format!("/v1/users/{}/receipt{}", url_part(self.user), query(&q))
    }
}

/// The page.
pub fn render(v: &ReceiptView) -> String {
    let a = &v.audit;
    let mut body = format!(
        "<h1>Your privacy receipt</h1>\n<p class=\"sub\">User <code id=\"user\">{}</code> · \
         generated {} · served release {}</p>\n",
        esc(&a.user),
        time(v.generated_at),
        v.served_release
            .map_or("none yet".to_string(), |id| id.to_string()),
    );
    if let Some(note) = &a.note {
        body.push_str(&format!("<p class=\"note\">{}</p>\n", esc(note)));
    }
    body.push_str(&list_section(v.list, v.served_release));
    body.push_str(&budget_section(v));
    body.push_str(&rating_level_section(v));
    body.push_str(&ratings_section(v));
    body.push_str(&releases_section(v));
    body.push_str(PROMISE);
    body.push_str(&words_section(v));
    body.push_str(&format!(
        "<p class=\"sub\">Every number on this page comes from the same code as the JSON audit \
         <code>GET /v1/users/{}/budget</code>. API documentation: <a href=\"/docs\">/docs</a>.</p>",
        esc(&url_part(&a.user))
    ));
    page(&format!("Privacy receipt of user {}", a.user), &body)
}

/// What the user's list is made of today, in words.
fn list_section(list: ListSource, served: Option<i64>) -> String {
    let release = served.map_or(String::new(), |id| format!(" (release {id})"));
    let (id, text) = match list {
        ListSource::NoRelease => (
            "none",
            "No model is published yet, so you get no recommendations. Your ratings are \
             kept, and the first release will use them within your budget below."
                .to_string(),
        ),
        ListSource::Deleted => (
            "popularity",
            "You deleted your data: nothing of yours is used, and your list is the most \
             popular items, counted with noise (DP popularity), the same for everybody."
                .to_string(),
        ),
        ListSource::PopularityForAll => (
            "popularity",
            format!(
                "<b>Popularity, the same for everybody.</b> The model served today{release} \
                 gives nobody a personal list: it ranks items by how many people rated \
                 them, counted with noise. Early releases of the default model spend their \
                 budget on these counts until a personal model is good enough to beat them; \
                 your ratings were still used (and charged) to make the counts. The API \
                 answers your recommendations with <code>\"fallback\": true, \"source\": \
                 \"popularity\"</code>."
            ),
        ),
        ListSource::Popularity => (
            "popularity",
            format!(
                "<b>Popularity.</b> The model served today{release} personalises lists, but \
                 none of the items you rated is one it scores from (it learns about the \
                 most-rated items only), so your list is the most popular items, counted \
                 with noise. Rating one of the popular items makes your next list personal, \
                 without waiting for a release. The API says <code>\"fallback\": true, \
                 \"source\": \"popularity\"</code>."
            ),
        ),
        ListSource::Labels => (
            "labels",
            format!(
                "<b>Personal, by your items' labels.</b> Your list is computed when you ask, \
                 from the published model{release} and the public labels (genres, \
                 categories) of the items you rated: the most popular items, counted with \
                 noise, reweighted towards the labels you rate most. A new rating changes \
                 it at once. The API says <code>\"fallback\": false, \"source\": \
                 \"labels\"</code>."
            ),
        ),
        ListSource::Personal => (
            "personal",
            format!(
                "<b>Personal.</b> Your list is computed when you ask, from the published \
                 model{release} and your own ratings, so a new rating changes it at once. It \
                 is meant for you: it is not private from you, and nobody else is shown it. \
                 The API says <code>\"fallback\": false, \"source\": \"profile\"</code>."
            ),
        ),
    };
    format!("<h2>Your recommendations today</h2>\n<p id=\"list-source\" data-source=\"{id}\">{text}</p>\n")
}

/// The user-level budget: figures, the bar, and the line over the user's releases.
fn budget_section(v: &ReceiptView) -> String {
    let a = &v.audit;
    let s = &a.spent;
    let used = s.filter_eps.unwrap_or(f64::INFINITY);
    let left = match s.releases_left {
        Some(u64::MAX) => "unlimited".to_string(),
        Some(n) => n.to_string(),
        None => "n/a (no user-level release yet)".to_string(),
    };
    let mut out = format!(
        "<h2>Your budget (all your ratings together)</h2>\n<p><b>What eps means for you.</b> \
         eps (epsilon) bounds how much everything dprec ever publishes can reveal about \
         you: whatever anybody concludes from the published models, it is at most e<sup>eps\
         </sup> times more (or less) likely with your ratings in the data than without \
         them, except with the tiny probability delta. Smaller is more private; your \
         budget eps_u is the most the service may ever use for you, and your data stops \
         being used when it is reached.</p>\n<div class=\"kv\">\
         <div><span>remaining eps</span><b class=\"big\" id=\"remaining-eps\">{}</b></div>\
         <div><span>your budget (eps_u, delta_u)</span><b class=\"big\">{}</b> \
         (delta {:e})</div>\
         <div><span>in use (filter scale)</span><b class=\"big\" id=\"filter-eps\">{}</b></div>\
         <div><span>spent as (eps, delta_u)</span><b class=\"big\" id=\"spent-eps\">{}</b></div>\
         <div><span>releases left</span><b class=\"big\" id=\"releases-left\">{left}</b> \
         of a plan of {}</div></div>\n",
        num(s.remaining_eps, EPS_DIGITS),
        num(Some(a.budget.eps), 2),
        a.budget.delta,
        num(s.filter_eps, EPS_DIGITS),
        num(s.eps, EPS_DIGITS),
        v.planned_releases,
    );
    out.push_str(&budget_bar(
        a.budget.eps,
        used,
        &format!(
            "in use {} of eps_u = {} (red); remaining {} (green){}",
            num(s.filter_eps, EPS_DIGITS),
            num(Some(a.budget.eps), 2),
            num(s.remaining_eps, EPS_DIGITS),
            if a.exhausted { ": exhausted" } else { "" }
        ),
    ));
    out.push_str(
        "<p class=\"sub\">\"In use\" is what the service's Renyi filter counts against your \
         budget: it starts a little above zero (the filter's fixed conversion term) and a \
         release is admitted only while it stays within eps_u. \"Spent as (eps, delta_u)\" \
         is the same charges converted as if they had been fixed in advance. \"Releases \
         left\" is at the cost of your newest release.</p>\n",
    );
    if v.history.len() > 1 {
        let points: Vec<(String, f64)> = v
            .history
            .iter()
            .map(|(id, e)| (id.map_or("before".into(), |id| format!("#{id}")), *e))
            .collect();
        out.push_str("<h3>In use after each release you took part in</h3>\n");
        out.push_str(&line_chart(&points, a.budget.eps, "eps in use"));
    }
    out
}

/// The rating-level releases that used the user's ratings and their group-privacy bound
/// (shown, not enforced); nothing when there are none.
fn rating_level_section(v: &ReceiptView) -> String {
    let Some(b) = &v.audit.rating_level else {
        return String::new();
    };
    let mut out = format!(
        "<h2>Rating-level releases (a bound shown, not enforced)</h2>\n<div class=\"kv\">\
         <div><span>all your ratings together, at most eps</span>\
         <b class=\"big\" id=\"rating-level-eps\">{}</b> (delta 0; not counted in your \
         budget above)</div></div>\n<p class=\"note\">The operator turned on the rating-level \
         mode: {} below were proven for one rating only. Each of your ratings was \
         charged as usual (its eps_ij is enforced, see the table of ratings), but nothing was \
         charged to your user-level budget above. What they imply for all your ratings \
         together is at most the sum of what they charged your ratings: {}.</p>\n\
         <table id=\"rating-level\"><thead><tr><th>release</th><th>started</th>\
         <th>trainer</th><th class=\"n\">your ratings charged</th><th class=\"n\">eps \
         charged to them</th></tr></thead><tbody>\n",
        num(b.eps, EPS_DIGITS),
        count(b.releases.len(), "release", "releases"),
        esc(&b.note),
    );
    for r in &b.releases {
        out.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td><code>{}</code> ({})</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td></tr>\n",
            r.release_id,
            time(r.created_at),
            esc(&r.trainer),
            esc(&name_of(&r.guarantee)),
            r.ratings_charged,
            num(Some(r.eps), EPS_DIGITS),
        ));
    }
    out.push_str("</tbody></table>\n");
    out
}

fn status_class(status: &str) -> &'static str {
    match status {
        "active" => "st-active",
        "exhausted" => "st-exhausted",
        _ => "st-deleted",
    }
}

/// The per-rating table with sortable headers and page links.
fn ratings_section(v: &ReceiptView) -> String {
    let a = &v.audit;
    let here = Here { user: &a.user, v };
    let r = &a.ratings;
    let mut out = format!(
        "<h2>Your ratings (each has its own budget eps_ij)</h2>\n<p class=\"sub\">{}; \
         showing {} to {}. Click a column to sort.</p>\n<table id=\"ratings\"><thead><tr>",
        count(r.total, "rating", "ratings"),
        r.offset.saturating_add(1).min(r.total),
        r.offset
            .saturating_add(i64::try_from(r.entries.len()).unwrap_or(i64::MAX))
            .min(r.total),
    );
    for col in RatingSort::ALL {
        let desc = v.order.by == col && !v.order.descending;
        let arrow = match (v.order.by == col, v.order.descending) {
            (true, false) => " ▲",
            (true, true) => " ▼",
            _ => "",
        };
        let class = if matches!(col, RatingSort::Item | RatingSort::Status) {
            ""
        } else {
            " class=\"n\""
        };
        out.push_str(&format!(
            "<th{class}><a href=\"{}\">{}{arrow}</a></th>",
            esc(&here.url(
                RatingOrder {
                    by: col,
                    descending: desc
                },
                0,
                a.releases.offset
            )),
            col.name()
        ));
    }
    out.push_str("<th>origin</th></tr></thead><tbody>\n");
    for e in &r.entries {
        out.push_str(&format!(
            "<tr><td><code>{}</code></td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"{}\">{}</td><td>{}</td></tr>\n",
            esc(&e.item),
            num(Some(e.eps), EPS_DIGITS),
            num(Some(e.spent), EPS_DIGITS),
            num(Some(e.remaining), EPS_DIGITS),
            e.releases,
            status_class(&e.status),
            esc(&e.status),
            esc(&e.origin)
        ));
    }
    out.push_str("</tbody></table>\n");
    out.push_str(&pager(r.offset, r.limit, r.total, |o| {
        here.url(v.order, o, a.releases.offset)
    }));
    out
}

/// "previous / next" links for a list at `offset` of `total`.
fn pager(offset: i64, limit: i64, total: i64, url: impl Fn(i64) -> String) -> String {
    let mut links = Vec::new();
    if offset > 0 {
        links.push(format!(
            "<a href=\"{}\">← previous</a>",
            esc(&url(offset.saturating_sub(limit).max(0)))
        ));
    }
    if offset.saturating_add(limit) < total {
        links.push(format!(
            "<a href=\"{}\">next →</a>",
            esc(&url(offset.saturating_add(limit)))
        ));
    }
    if links.is_empty() {
        String::new()
    } else {
        format!("<nav class=\"pg\">{}</nav>\n", links.join(""))
    }
}

/// One event in words: `Gaussian (noise multiplier 3.1)` etc.
fn describe_event(e: &PrivacyEvent) -> String {
    let times = |c: u64| {
        if c == 1 {
            String::new()
        } else {
            format!(", {c} times")
        }
    };
    match e {
        PrivacyEvent::Gaussian {
            noise_multiplier,
            count,
        } => format!(
            "Gaussian noise (multiplier {noise_multiplier:.3}{})",
            times(*count)
        ),
        PrivacyEvent::PoissonSubsampledGaussian {
            sampling_rate,
            noise_multiplier,
            count,
        } => format!(
            "Gaussian noise on a random sample (rate {sampling_rate}, multiplier \
             {noise_multiplier:.3}{})",
            times(*count)
        ),
        PrivacyEvent::Laplace { scale, count } => {
            format!("Laplace noise (scale {scale:.3}{})", times(*count))
        }
        PrivacyEvent::PureDp { eps, count } => {
            format!("a pure eps = {eps:.3} mechanism{}", times(*count))
        }
        PrivacyEvent::Composed { events } => events
            .iter()
            .map(describe_event)
            .collect::<Vec<_>>()
            .join(", then "),
        PrivacyEvent::ReplaceOne { event } => {
            format!("{} (bounded for one changed rating)", describe_event(event))
        }
    }
}

/// A release's cost to the user alone, as (eps, delta_u), from its charged events.
fn release_eps(r: &ReleaseChargeView, delta: f64) -> Option<f64> {
    let events: Vec<PrivacyEvent> = serde_json::from_value(r.events.clone()).ok()?;
    dprec_dp::ledger::release_eps(&events, delta).ok()
}

/// One release that used the user's data, in plain words: trainer, mechanisms, the cost
/// to the user and to the user's ratings.
fn release_paragraph(r: &ReleaseChargeView, delta: f64) -> String {
    let events: Vec<PrivacyEvent> = serde_json::from_value(r.events.clone()).unwrap_or_default();
    let mechs: Vec<String> = r
        .mechanisms
        .iter()
        .map(|m| {
            format!(
                "<a href=\"#w-mechanisms\"><code>{}</code></a> (protects one {}, \
                 neighbours {})",
                esc(&m.name),
                esc(&name_of(&m.unit)),
                esc(&name_of(&m.neighbour))
            )
        })
        .collect();
    format!(
        "<div class=\"rel\" id=\"release-{id}\"><p><b>Release {id}</b>, {when}: trained by \
         <code>{trainer}</code> (guarantee: {guarantee}).</p>\
         <p>It ran {mechs}.</p>\
         <p><b>What it cost you, as a user:</b> {events}; on its own that is eps {alone} at \
         your delta_u (admitted at <a href=\"#w-order\">Renyi order</a> {order}). This is \
         the cost counted against your budget eps_u.</p>\
         <p><b>What it cost your ratings:</b> {n_charged} charged, eps {total} in total \
         ({each} each on average, out of each rating's own eps_ij). <span class=\"sub\">\
         This total adds up a separate figure per rating, each protecting that one \
         rating; it is not a cost to you as a person and is not compared with eps_u, so \
         it may exceed your budget without anything being overspent (<a \
         href=\"#w-units\">why</a>).</span></p></div>\n",
        id = r.release_id,
        when = time(r.created_at),
        trainer = esc(&r.trainer),
        guarantee = esc(&name_of(&r.guarantee)),
        mechs = if mechs.is_empty() {
            "no recorded mechanism".to_string()
        } else {
            mechs.join(", ")
        },
        events = if events.is_empty() {
            "nothing".to_string()
        } else {
            esc(&events
                .iter()
                .map(describe_event)
                .collect::<Vec<_>>()
                .join(", then "))
        },
        alone = num(release_eps(r, delta), EPS_DIGITS),
        order = r.admitted_order,
        n_charged = count(
            r.ratings_charged,
            "of your ratings was",
            "of your ratings were"
        ),
        total = num(Some(r.rating_eps_total), EPS_DIGITS),
        each = num(
            (r.ratings_charged > 0).then(|| r.rating_eps_total / r.ratings_charged as f64),
            EPS_DIGITS
        ),
    )
}

/// Each release that used the user's data, in plain words.
fn releases_section(v: &ReceiptView) -> String {
    let a = &v.audit;
    let rel = &a.releases;
    let mut out = format!(
        "<h2>Releases that used your data</h2>\n<p class=\"sub\">{}, newest first.</p>\n",
        count(rel.total, "release", "releases")
    );
    for r in &rel.entries {
        out.push_str(&release_paragraph(r, a.budget.delta));
    }
    let here = Here { user: &a.user, v };
    out.push_str(&pager(rel.offset, rel.limit, rel.total, |o| {
        here.url(v.order, a.ratings.offset, o)
    }));
    if !a.local_reports.is_empty() {
        out.push_str(&format!(
            "<p>You also sent {} perturbed on your device (local DP), each charged to your \
             budget when it arrived: eps {} in total.</p>\n",
            count(a.local_reports.len(), "one-bit report", "one-bit reports"),
            num(
                Some(a.local_reports.iter().map(|r| r.eps).sum()),
                EPS_DIGITS
            )
        ));
    }
    out
}

/// One sentence on what a mechanism of a release does, by its recorded name.
pub fn mechanism_words(name: &str) -> String {
    if let Some(rest) = name.strip_prefix("dp-topn-counts") {
        let mut out = String::from(
            "the served top-N model: how many people rated each item, with each person's \
             part capped and Gaussian noise added",
        );
        if rest.contains("select") {
            out.push_str("; then a noisy test of which second step would serve lists better");
        }
        if rest.ends_with("gram") {
            out.push_str(
                "; then, among the most-rated items, how often two of them were rated by \
                 the same person (a noisy co-rating table, which finds items like yours)",
            );
        } else if rest.ends_with("counts") {
            out.push_str("; then the counts again, with the rest of the budget");
        }
        out.push_str(". It protects all of one person's ratings together.");
        return out;
    }
    let s = match name {
        "dp-topn-rsm" => {
            "random sampling of ratings: each of your ratings takes part with a \
             probability set by its own eps_ij; this is how each rating's own budget is \
             charged. It protects one rating."
        }
        "popularity-discrete-laplace" => {
            "a noisy count of ratings per item (exact discrete Laplace noise): the \
             popularity order, the list of anybody without a personal one."
        }
        "rsm-objective-perturbation" => {
            "random sampling of ratings by their eps_ij, then a model trained with a random \
             term added to what it minimises (objective perturbation)."
        }
        "private-gd-one-bit-report" => {
            "one-bit reports randomised on your own device before they were sent (local DP)."
        }
        "ldp-ratings-post-processing" => {
            "a model trained only from ratings that were randomised on their senders' \
             devices (local DP); training adds no further cost."
        }
        n if n.contains("subsampled-gaussian") => {
            "Gaussian noise added to statistics of a random sample of the data."
        }
        n if n.contains("gaussian") || n.ends_with("-user-step") => {
            "Gaussian noise added to statistics of the data."
        }
        _ => {
            "a step of the trainer; docs/privacy/mechanisms.md describes each mechanism \
             with its proof."
        }
    };
    s.to_string()
}

/// The words the page uses, explained once (linked from where they appear): eps and
/// delta, the two units, the Renyi order, and each mechanism named on this page.
fn words_section(v: &ReceiptView) -> String {
    let a = &v.audit;
    let mut names: Vec<&str> = a
        .releases
        .entries
        .iter()
        .flat_map(|r| r.mechanisms.iter().map(|m| m.name.as_str()))
        .chain(
            a.rating_level
                .iter()
                .flat_map(|b| b.releases.iter())
                .flat_map(|r| r.mechanisms.iter().map(|m| m.name.as_str())),
        )
        .collect();
    names.sort_unstable();
    names.dedup();
    let mechs: String = names
        .iter()
        .map(|n| {
            format!(
                "<li><code>{}</code>: {}</li>",
                esc(n),
                esc(&mechanism_words(n))
            )
        })
        .collect();
    format!(
        "<h2 id=\"words\">Words on this page</h2>\n<dl>\
         <dt>eps, delta</dt><dd>How much what is published can depend on your data: with \
         eps, any conclusion is at most e<sup>eps</sup> times more (or less) likely with \
         your data than without it, except with probability delta (here {delta:e}). \
         Smaller is more private.</dd>\
         <dt id=\"w-units\">Two budgets, two units</dt><dd>Each rating has its own budget \
         eps_ij, which protects that one rating: whether you rated that item, and how. \
         Your budget eps_u protects all your ratings together, you as a person. A \
         release is charged to both, in different units: it costs each rating that took \
         part a little of its eps_ij, and it costs you one fixed amount, planned so that \
         every release of the plan fits in eps_u, because each person's part in a release \
         is capped before the noise is added. Adding up what the release charged your \
         ratings one by one (the \"in total\" figure of each release) gives a much looser \
         bound on you than that planned amount, so that sum can exceed eps_u while your \
         budget is kept; what the service enforces for you as a person is the user-level \
         figure.</dd>\
         <dt id=\"w-order\">Renyi order</dt><dd>dprec keeps your budget in Renyi \
         differential privacy: it tracks your loss at a range of orders (different \
         trade-offs between eps and delta) and uses whichever gives you the smallest eps. \
         The order named for a release is the one at which your remaining budget still \
         had room for it; it is bookkeeping and changes nothing in your protection.</dd>\
         <dt>neighbours add-remove</dt><dd>The protection compares the data with and \
         without the protected unit (one rating, or one user).</dd>\
         <dt id=\"w-mechanisms\">Mechanisms on this page</dt><dd><ul>{mechs}</ul>\
         {none}</dd></dl>\n",
        delta = a.budget.delta,
        none = if names.is_empty() {
            "None yet: no release used your data."
        } else {
            ""
        },
    )
}

/// What the service promises, short (docs/privacy/guarantee.md says it in full; a test
/// checks that the page's headings are that document's).
const PROMISE: &str = "<h2>What dprec promises you, and what it does not</h2>\n<ul>\
<li><b>Per rating.</b> Over all the models dprec ever publishes, each of your ratings is \
protected at its own eps_ij: adding or removing it changes what anyone can see by at most \
that much. A rating with nothing left is no longer used (you still see it above).</li>\
<li><b>Per user.</b> All your ratings together are protected at (eps_u, delta_u) over all \
releases. Every release costs every taking-part user the same amount, fixed before any data \
is seen, and the noise is planned so that the planned number of releases fits your budget. \
When it is used up, your data is no longer used for training.</li>\
<li><b>Rating-level releases</b> (only if the operator opts in; labelled \
<code>rating-level</code>): protected per rating as above, but not counted against your \
per-user budget; what they imply for all your ratings together is shown on this page as a \
bound, not enforced.</li>\
<li><b>What decides whether your data is used:</b> only public information and your own \
past charges, never whether anybody else's data exists.</li>\
<li><b>Your recommendations</b> are computed from the public model and your own ratings \
(joint DP): they are meant for you, and are not private from you.</li>\
<li><b>The item catalogue is public:</b> item ids, titles and labels (such as genres) can \
be read by anyone with a key, and using them costs none of your budget. They describe the \
items, never who rated them.</li></ul>\n\
<p><b>What dprec does not promise:</b> nothing about what you reveal yourself; a group of \
people who share information is protected person by person, not as a group; a private \
model can still be accurate about populations. The full text: \
<code>docs/privacy/guarantee.md</code> (\"What dprec promises you, and what it does not\").</p>\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_take_their_number() {
        assert_eq!(count(1_i64, "release", "releases"), "1 release");
        assert_eq!(count(0_i64, "release", "releases"), "0 releases");
        assert_eq!(count(52_usize, "release", "releases"), "52 releases");
    }
    use crate::api::users::{Budget, Paged, RatingBudgetView, Spent};

    fn view(user: &str, item: &str) -> ReceiptView {
        ReceiptView {
            audit: Audit {
                user: user.into(),
                deleted: false,
                budget: Budget {
                    eps: 10.0,
                    delta: 1e-6,
                },
                spent: Spent {
                    eps: Some(1.5),
                    delta: 1e-6,
                    best_order: Some(12.0),
                    filter_eps: Some(2.25),
                    remaining_eps: Some(7.75),
                    releases_left: Some(41),
                    curve: vec![],
                },
                exhausted: false,
                note: Some("<b>note</b>".into()),
                ratings: Paged {
                    total: 120,
                    limit: 50,
                    offset: 50,
                    entries: vec![RatingBudgetView {
                        item: item.into(),
                        eps: 12.0,
                        spent: 1.25,
                        remaining: 10.75,
                        releases: 2,
                        status: "active".into(),
                        origin: "raw".into(),
                    }],
                },
                releases: Paged {
                    total: 0,
                    limit: 10,
                    offset: 0,
                    entries: vec![],
                },
                rating_level: None,
                local_reports: vec![],
                continual: None,
            },
            history: vec![(None, 0.5), (Some(1), 1.0), (Some(2), 2.25)],
            planned_releases: 52,
            order: RatingOrder {
                by: RatingSort::Spent,
                descending: true,
            },
            link: Some("123.abc".into()),
            generated_at: 0,
            served_release: Some(2),
            list: ListSource::PopularityForAll,
        }
    }

    /// The page says what the list is made of, in words and as the API's `source`.
    #[test]
    fn the_list_source_is_said() {
        let mut v = view("u1", "i1");
        let html = render(&v);
        assert!(html.contains("data-source=\"popularity\""), "{html}");
        assert!(
            html.contains("Popularity, the same for everybody") && html.contains("(release 2)")
        );
        v.list = ListSource::Personal;
        let html = render(&v);
        assert!(html.contains("data-source=\"personal\"") && html.contains("\"profile\""));
        v.list = ListSource::Labels;
        let html = render(&v);
        assert!(html.contains("data-source=\"labels\"") && html.contains("\"labels\"</code>"));
        assert_eq!(ListSource::Labels.api_source(), Some("labels"));
        v.list = ListSource::Popularity;
        assert!(render(&v).contains("none of the items you rated"));
        v.list = ListSource::NoRelease;
        assert!(render(&v).contains("data-source=\"none\""));
    }

    /// "1 rating", "1 release", "1 of your ratings was charged"; plurals otherwise.
    #[test]
    fn counts_read_in_the_singular_and_plural() {
        let mut v = view("u1", "i1");
        v.audit.ratings.total = 1;
        v.audit.ratings.offset = 0;
        v.audit.releases.total = 1;
        v.audit.releases.entries = vec![release_view(1, 1)];
        let html = render(&v);
        assert!(html.contains(">1 rating; showing 1 to 1."), "{html}");
        assert!(html.contains(">1 release, newest first."), "{html}");
        assert!(html.contains("1 of your ratings was charged"), "{html}");
        assert!(!html.contains("1 ratings") && !html.contains("1 releases"));
        v.audit.ratings.total = 2;
        v.audit.releases.total = 2;
        v.audit.releases.entries = vec![release_view(2, 272), release_view(1, 272)];
        let html = render(&v);
        assert!(html.contains(">2 ratings; showing") && html.contains(">2 releases, newest"));
        assert!(html.contains("272 of your ratings were charged"));
    }

    fn release_view(id: i64, charged: i64) -> ReleaseChargeView {
        ReleaseChargeView {
            release_id: id,
            trainer: "dp-topn".into(),
            guarantee: crate::train::Guarantee::Proven,
            created_at: 0,
            mechanisms: vec![
                crate::api::models::MechanismView {
                    name: "dp-topn-counts+select+gram".into(),
                    params: serde_json::json!({}),
                    unit: dprec_dp::charges::PrivacyUnit::User,
                    neighbour: dprec_dp::charges::Neighbour::AddRemove,
                },
                crate::api::models::MechanismView {
                    name: "dp-topn-rsm".into(),
                    params: serde_json::json!({}),
                    unit: dprec_dp::charges::PrivacyUnit::Rating,
                    neighbour: dprec_dp::charges::Neighbour::AddRemove,
                },
            ],
            params: serde_json::json!({}),
            events: serde_json::json!([]),
            admitted_order: 2.9,
            ratings_charged: charged,
            rating_eps_total: 1.171 * charged as f64,
        }
    }

    /// The per-rating total is explained beside a budget it exceeds; the Renyi order and
    /// every mechanism named on the page link to their explanation, which is on the page.
    #[test]
    fn units_orders_and_mechanisms_are_explained() {
        let mut v = view("u1", "i1");
        v.audit.releases.total = 1;
        v.audit.releases.entries = vec![release_view(1, 272)];
        let html = render(&v);
        assert!(html.contains("eps 318.512 in total"), "{html}");
        assert!(html.contains("may exceed your budget") && html.contains("href=\"#w-units\""));
        assert!(html.contains("id=\"w-units\"") && html.contains("id=\"w-order\""));
        assert!(
            html.contains("<a href=\"#w-order\">Renyi order</a> 2.9"),
            "{html}"
        );
        assert!(html.contains("<a href=\"#w-mechanisms\"><code>dp-topn-rsm</code></a>"));
        assert!(html.contains("<li><code>dp-topn-counts+select+gram</code>: the served top-N"));
        assert!(html.contains("<li><code>dp-topn-rsm</code>: random sampling of ratings"));
        assert!(html.contains("What eps means for you"));
        assert!(mechanism_words("dp-topn-counts+counts").contains("counts again"));
        assert!(mechanism_words("something-new").contains("docs/privacy/mechanisms.md"));
    }

    /// The rating-level section: present exactly when the audit has a bound, with the
    /// bound's figure, each release's term and the words "not enforced".
    #[test]
    fn the_rating_level_bound_is_shown_not_enforced() {
        use crate::api::users::{RatingLevelBound, RatingLevelReleaseView, RATING_LEVEL_NOTE};
        let mut v = view("u1", "i1");
        let html = render(&v);
        assert!(!html.contains("id=\"rating-level-eps\""), "{html}");
        let release = |id: i64, eps: f64| RatingLevelReleaseView {
            release_id: id,
            trainer: "pdp-pmf".into(),
            guarantee: crate::train::Guarantee::RatingLevel,
            created_at: 0,
            mechanisms: vec![],
            ratings_charged: 3,
            eps,
        };
        v.audit.rating_level = Some(RatingLevelBound {
            eps: Some(1.5),
            enforced: false,
            note: RATING_LEVEL_NOTE.into(),
            releases: vec![release(4, 0.75), release(3, 0.75)],
        });
        let html = render(&v);
        assert!(html.contains("id=\"rating-level-eps\">1.500</b>"), "{html}");
        assert!(html.contains("not enforced") && html.contains("(rating-level)"));
        assert_eq!(html.matches("<td class=\"n\">0.750</td>").count(), 2);
    }

    #[test]
    fn ids_render_as_text() {
        let evil = "<script>alert(1)</script>";
        let html = render(&view(evil, evil));
        assert!(!html.contains("<script"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("&lt;b&gt;note&lt;/b&gt;"));
        // In links the id is percent-encoded.
        assert!(html.contains("/v1/users/%3Cscript%3Ealert%281%29%3C%2Fscript%3E/receipt?"));
    }

    #[test]
    fn figures_links_and_pages() {
        let html = render(&view("u1", "i1"));
        assert!(html.contains("id=\"remaining-eps\">7.750<"), "{html}");
        assert!(html.contains("id=\"filter-eps\">2.250<"));
        assert!(html.contains("id=\"releases-left\">41<"));
        // The page's links keep the link token and the order; page 2 of 3 links both ways.
        assert!(html
            .contains("href=\"/v1/users/u1/receipt?link=123.abc&amp;sort=spent&amp;desc=true\""));
        assert!(html.contains("href=\"/v1/users/u1/receipt?link=123.abc&amp;sort=spent&amp;desc=true&amp;offset=100\""));
        // The sorted column's header flips the direction.
        assert!(html.contains("href=\"/v1/users/u1/receipt?link=123.abc&amp;sort=spent\">spent ▼"));
        // The line has a point per release.
        assert!(html.contains(">before<") && html.contains(">#1<") && html.contains(">#2<"));
        assert!(html.contains("(delta 1e-6)"));
        assert!(
            !html.contains("http://") && !html.contains("https://") && !html.contains("<script")
        );
    }

    #[test]
    fn the_page_says_the_catalogue_is_public() {
        assert!(PROMISE.contains("The item catalogue is public:"));
        let doc = include_str!("../../../docs/privacy/guarantee.md");
        assert!(doc.contains("Each catalogue item's public information"));
    }

    #[test]
    fn the_promise_is_the_guarantee_documents() {
        let doc = include_str!("../../../docs/privacy/guarantee.md");
        for heading in [
            "# What dprec promises you, and what it does not",
            "## Two guarantees, both enforced",
            "## What dprec does not promise",
            "## Rating-level mode: an operator's opt-in",
            "**What decides whether your data is used.**",
            "## What is public",
        ] {
            assert!(doc.contains(heading), "guarantee.md lost {heading:?}");
        }
    }
}
