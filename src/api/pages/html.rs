//! Pure HTML and SVG helpers of the pages: escaping, number and time formats, URL
//! encoding, the page shell and three small inline charts. No I/O, no JavaScript, no
//! external resource: every page is one self-contained document.

/// `s` as HTML text or attribute value: `& < > " '` escaped, so a user or item id such as
/// `<script>` renders as text.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `s` percent-encoded for a path segment or a query value (everything but the RFC 3986
/// unreserved characters).
pub fn url_part(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A query string `?k=v&k=v` (values percent-encoded; pairs with an empty value left out).
pub fn query(pairs: &[(&str, String)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={}", url_part(v)))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

/// `v` with `digits` decimals, or `n/a` (unbounded or unknown).
pub fn num(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:.digits$}"),
        _ => "n/a".into(),
    }
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn time(ms: i64) -> String {
    crate::api::keyring::time_utc(ms)
}

/// `n` and the noun in the number it takes ("1 release", "2 releases").
pub fn count<N: std::fmt::Display + PartialEq + From<u8>>(n: N, one: &str, many: &str) -> String {
    let noun = if n == N::from(1) { one } else { many };
    format!("{n} {noun}")
}

/// A serialised enum's name (`user`, `add-remove`, `proven`).
pub fn name_of<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The shared style of the pages (system fonts only).
const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5rem auto;max-width:64rem;\
color:#1f2328;padding:0 1rem;line-height:1.4}h1{margin-bottom:.2rem}h2{margin-top:2rem;\
border-bottom:1px solid #d0d7de;padding-bottom:.2rem}.sub{color:#59636e}table{border-collapse:\
collapse;width:100%;font-size:.92rem}th,td{border-bottom:1px solid #e5e7eb;padding:.25rem .5rem;\
text-align:left;vertical-align:top}th a{color:inherit}td.n,th.n{text-align:right;\
font-variant-numeric:tabular-nums}.big{font-size:1.6rem;font-weight:600}.kv{display:flex;\
gap:2.5rem;flex-wrap:wrap;margin:.6rem 0}.kv div span{display:block;color:#59636e;\
font-size:.85rem}.st-active{color:#1a7f37}.st-exhausted{color:#cf222e}.st-deleted{color:#59636e}\
.rel{border:1px solid #d0d7de;border-radius:6px;padding:.5rem .8rem;margin:.6rem 0}\
.rel p{margin:.3rem 0}nav.pg a{margin-right:1rem}code{font-family:ui-monospace,monospace;\
font-size:.88em}.note{background:#fff8c5;border:1px solid #d4a72c;border-radius:6px;\
padding:.4rem .7rem}dt{font-weight:600;margin-top:.4rem}svg text{font-family:system-ui,sans-serif}";

/// A complete document: `title` (escaped here) and `body` (already HTML). The referrer
/// is never sent (a link's token is in the page's URL).
pub fn page(title: &str, body: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"referrer\" content=\"no-referrer\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n",
        esc(title)
    )
}

/// A horizontal bar of `total`, filled to `used` (clamped), with a caption under it.
pub fn budget_bar(total: f64, used: f64, caption: &str) -> String {
    let w = 600.0;
    let frac = if total > 0.0 {
        (used / total).clamp(0.0, 1.0)
    } else {
        1.0
    };
    let fill = w * frac;
    format!(
        "<svg role=\"img\" aria-label=\"{cap}\" width=\"{w}\" height=\"58\" \
         viewBox=\"0 0 {w} 58\">\
         <rect x=\"0\" y=\"4\" width=\"{w}\" height=\"28\" rx=\"4\" fill=\"#dafbe1\" stroke=\"#1a7f37\"/>\
         <rect x=\"0\" y=\"4\" width=\"{fill:.1}\" height=\"28\" rx=\"4\" fill=\"#cf222e\" fill-opacity=\".75\"/>\
         <text x=\"4\" y=\"50\" font-size=\"13\" fill=\"#1f2328\">{cap}</text></svg>",
        cap = esc(caption),
    )
}

/// A line over `points` (label under each point, value above it) against a dashed
/// ceiling at `ceiling` (the budget), y from 0 to the larger of both.
pub fn line_chart(points: &[(String, f64)], ceiling: f64, y_label: &str) -> String {
    let (w, h, left, top, bottom) = (600.0, 220.0, 48.0, 16.0, 36.0);
    let plot_w = w - left - 16.0;
    let plot_h = h - top - bottom;
    let y_max = points.iter().map(|p| p.1).fold(ceiling, f64::max).max(1e-9);
    let y = |v: f64| top + plot_h * (1.0 - v / y_max);
    let x = |i: usize| {
        if points.len() <= 1 {
            left + plot_w / 2.0
        } else {
            left + plot_w * i as f64 / (points.len() - 1) as f64
        }
    };
    let mut s = format!(
        "<svg role=\"img\" aria-label=\"{yl}\" width=\"{w}\" height=\"{h}\" \
         viewBox=\"0 0 {w} {h}\">\
         <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{b}\" stroke=\"#59636e\"/>\
         <line x1=\"{left}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#59636e\"/>\
         <line x1=\"{left}\" y1=\"{cy:.1}\" x2=\"{r}\" y2=\"{cy:.1}\" stroke=\"#cf222e\" stroke-dasharray=\"6 4\"/>\
         <text x=\"{tx}\" y=\"{cyt:.1}\" font-size=\"12\" fill=\"#cf222e\" text-anchor=\"end\">budget {c}</text>\
         <text x=\"4\" y=\"{top}\" font-size=\"12\" fill=\"#59636e\">{yl}</text>",
        yl = esc(y_label),
        b = top + plot_h,
        r = left + plot_w,
        cy = y(ceiling),
        cyt = y(ceiling) - 4.0,
        tx = left + plot_w,
        c = num(Some(ceiling), 2),
    );
    let path: Vec<String> = points
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{:.1},{:.1}", x(i), y(p.1)))
        .collect();
    if points.len() > 1 {
        s.push_str(&format!(
            "<polyline points=\"{}\" fill=\"none\" stroke=\"#0969da\" stroke-width=\"2\"/>",
            path.join(" ")
        ));
    }
    for (i, (label, v)) in points.iter().enumerate() {
        s.push_str(&format!(
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"#0969da\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\">{}</text>\
             <text x=\"{:.1}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\" fill=\"#59636e\">{}</text>",
            x(i),
            y(*v),
            x(i),
            y(*v) - 8.0,
            num(Some(*v), 3),
            x(i),
            top + plot_h + 16.0,
            esc(label)
        ));
    }
    s.push_str("</svg>");
    s
}

/// Vertical bars: one per `(label, count)`, the count above each bar.
pub fn bar_chart(bars: &[(String, u64)], aria: &str) -> String {
    let (w, h, top, bottom) = (600.0, 200.0, 18.0, 34.0);
    let plot_h = h - top - bottom;
    let max = bars.iter().map(|b| b.1).max().unwrap_or(0).max(1) as f64;
    let slot = w / bars.len().max(1) as f64;
    let mut s = format!(
        "<svg role=\"img\" aria-label=\"{a}\" width=\"{w}\" height=\"{h}\" \
         viewBox=\"0 0 {w} {h}\">",
        a = esc(aria)
    );
    for (i, (label, n)) in bars.iter().enumerate() {
        let bh = plot_h * (*n as f64) / max;
        let x = slot * i as f64;
        s.push_str(&format!(
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bh:.1}\" fill=\"#0969da\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\">{n}</text>\
             <text x=\"{:.1}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\" fill=\"#59636e\">{}</text>",
            x + 3.0,
            top + plot_h - bh,
            slot - 6.0,
            x + slot / 2.0,
            top + plot_h - bh - 4.0,
            x + slot / 2.0,
            h - bottom + 16.0,
            esc(label)
        ));
    }
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_and_encoding() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"y\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;y&quot;"
        );
        assert_eq!(url_part("a b/<é>"), "a%20b%2F%3C%C3%A9%3E");
        assert_eq!(
            query(&[
                ("sort", "eps".into()),
                ("link", String::new()),
                ("x", "a&b".into())
            ]),
            "?sort=eps&x=a%26b"
        );
        assert_eq!(query(&[("a", String::new())]), "");
        assert_eq!(num(Some(1.23456), 3), "1.235");
        assert_eq!(num(Some(f64::INFINITY), 3), "n/a");
        assert_eq!(num(None, 1), "n/a");
    }

    #[test]
    fn charts_escape_their_labels_and_stay_inside_the_box() {
        let l = line_chart(&[("<b>".into(), 1.0), ("2".into(), 2.0)], 10.0, "eps");
        assert!(l.contains("&lt;b&gt;") && !l.contains("<b>"));
        assert!(l.contains("budget 10.00"));
        let b = bar_chart(&[("0-10%".into(), 3), ("<i>".into(), 0)], "users");
        assert!(b.contains("&lt;i&gt;") && !b.contains("<i>"));
        // A bar over the total is drawn full, never wider than the box.
        assert!(budget_bar(1.0, 5.0, "x").contains("width=\"600.0\""));
        let p = page("<t>", "<p>x</p>");
        assert!(p.contains("<title>&lt;t&gt;</title>") && p.contains("no-referrer"));
        assert!(!p.contains("http://") && !p.contains("https://"));
    }
}
