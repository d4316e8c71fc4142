//! The `/docs` page: the OpenAPI document rendered on the server as one HTML document,
//! with no script and nothing loaded from anywhere (the pages' Content-Security-Policy).
//! Operations are grouped by tag in the order of the document's `tags`, descriptions are
//! rendered from their Markdown (code spans, bold, relative links, lists, paragraphs),
//! and every schema reference is resolved: a request body or an answer shows its
//! schema's fields in place, and each named type links to its section under "Schemas".
//!
//! Pure: [`render`] reads the spec as JSON; the handler serves [`page`], rendered once.

use serde_json::Value;

use super::pages::html::{esc, page as shell};

const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

/// Inline Markdown of one line of text, escaped: `code`, **bold**, [text](/relative).
/// A link to anything but a path on this service (`/...`) or an anchor (`#...`) stays
/// text, so the page links nowhere else.
fn inline(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('`') {
            if let Some(end) = after.find('`') {
                out.push_str(&format!("<code>{}</code>", esc(&after[..end])));
                rest = &after[end + 1..];
                continue;
            }
        }
        if let Some(after) = rest.strip_prefix("**") {
            if let Some(end) = after.find("**") {
                out.push_str(&format!("<b>{}</b>", inline(&after[..end])));
                rest = &after[end + 2..];
                continue;
            }
        }
        if let Some(after) = rest.strip_prefix('[') {
            if let Some((label, url, used)) = link(after) {
                if url.starts_with('/') || url.starts_with('#') {
                    out.push_str(&format!("<a href=\"{}\">{}</a>", esc(url), inline(label)));
                } else {
                    out.push_str(&format!("{} ({})", inline(label), esc(url)));
                }
                rest = &after[used..];
                continue;
            }
        }
        let c = rest.chars().next().expect("not empty");
        out.push_str(&esc(&c.to_string()));
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// `text](url)...` after a `[`: the label, the url and the bytes they take.
fn link(after: &str) -> Option<(&str, &str, usize)> {
    let close = after.find("](")?;
    let label = &after[..close];
    let url_start = close + 2;
    let url_len = after[url_start..].find(')')?;
    let url = &after[url_start..url_start + url_len];
    (!label.contains('\n') && !url.contains(' ')).then_some((label, url, url_start + url_len + 1))
}

/// A description's Markdown as HTML: paragraphs at blank lines, lines joined within one
/// (as Markdown does), `- ` lines as a list.
pub fn markdown(text: &str) -> String {
    let mut out = String::new();
    for block in text.split("\n\n").map(str::trim).filter(|b| !b.is_empty()) {
        let lines: Vec<&str> = block.lines().map(str::trim).collect();
        if lines.iter().all(|l| l.starts_with("- ")) {
            let items: String = lines
                .iter()
                .map(|l| format!("<li>{}</li>", inline(&l[2..])))
                .collect();
            out.push_str(&format!("<ul>{items}</ul>"));
        } else {
            out.push_str(&format!("<p>{}</p>", inline(&lines.join(" "))));
        }
    }
    out
}

/// The name of a `#/components/schemas/NAME` reference.
fn ref_name(v: &Value) -> Option<&str> {
    v.get("$ref")?
        .as_str()?
        .strip_prefix("#/components/schemas/")
}

/// A schema's type in words, with named types linked to their section.
fn type_of(s: &Value) -> String {
    if let Some(name) = ref_name(s) {
        return format!("<a href=\"#schema-{0}\">{0}</a>", esc(name));
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(alts) = s.get(key).and_then(Value::as_array) {
            return alts.iter().map(type_of).collect::<Vec<_>>().join(" or ");
        }
    }
    if let Some(values) = s.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values
            .iter()
            .map(|v| format!("<code>{}</code>", esc(&v.to_string())))
            .collect();
        return format!("one of {}", values.join(", "));
    }
    let kind = match s.get("type") {
        Some(Value::String(t)) => one_type(t, s),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .map(|t| one_type(t, s))
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "any".to_string(),
    };
    match s.get("format").and_then(Value::as_str) {
        Some(f) => format!("{kind} ({})", esc(f)),
        None => kind,
    }
}

fn one_type(t: &str, s: &Value) -> String {
    match (t, s.get("items")) {
        ("array", Some(items)) => format!("array of {}", type_of(items)),
        _ => esc(t),
    }
}

/// A schema's own description, or the one beside its reference in a `oneOf`.
fn description_of(s: &Value) -> Option<&str> {
    s.get("description").and_then(Value::as_str).or_else(|| {
        s.get("oneOf")?
            .as_array()?
            .iter()
            .find_map(|a| a.get("description").and_then(Value::as_str))
    })
}

/// The fields of a schema as a table (an object), or its values (an enum), resolving a
/// reference first; `None` for a schema with nothing to list.
fn fields(spec: &Value, s: &Value) -> Option<String> {
    let s = match ref_name(s) {
        Some(name) => &spec["components"]["schemas"][name],
        None => s,
    };
    if let Some(values) = s.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values
            .iter()
            .map(|v| format!("<code>{}</code>", esc(&v.to_string())))
            .collect();
        return Some(format!("<p>One of {}.</p>", values.join(", ")));
    }
    let props = s.get("properties")?.as_object()?;
    let required: Vec<&str> = s
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut out = String::from(
        "<table class=\"fields\"><thead><tr><th>field</th><th>type</th><th>description</th>\
         </tr></thead><tbody>",
    );
    for (name, p) in props {
        out.push_str(&format!(
            "<tr><td><code>{}</code>{}</td><td>{}</td><td>{}</td></tr>",
            esc(name),
            if required.contains(&name.as_str()) {
                " <span class=\"req\">required</span>"
            } else {
                ""
            },
            type_of(p),
            description_of(p).map(markdown).unwrap_or_default()
        ));
    }
    out.push_str("</tbody></table>");
    Some(out)
}

/// The parameters of an operation as a table.
fn parameters(op: &Value) -> String {
    let Some(ps) = op.get("parameters").and_then(Value::as_array) else {
        return String::new();
    };
    let rows: String = ps
        .iter()
        .map(|p| {
            let schema = p.get("schema").unwrap_or(&Value::Null);
            format!(
                "<tr><td><code>{}</code>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(p["name"].as_str().unwrap_or("")),
                if p["required"] == Value::Bool(true) {
                    " <span class=\"req\">required</span>"
                } else {
                    ""
                },
                esc(p["in"].as_str().unwrap_or("")),
                type_of(schema),
                p.get("description")
                    .and_then(Value::as_str)
                    .or_else(|| description_of(schema))
                    .map(markdown)
                    .unwrap_or_default()
            )
        })
        .collect();
    format!(
        "<h4>Parameters</h4><table class=\"fields\"><thead><tr><th>name</th><th>in</th>\
         <th>type</th><th>description</th></tr></thead><tbody>{rows}</tbody></table>"
    )
}

/// `(content type, schema)` of a request body or response.
fn content(v: &Value) -> Vec<(&str, &Value)> {
    v.get("content")
        .and_then(Value::as_object)
        .map(|c| {
            c.iter()
                .map(|(t, m)| (t.as_str(), m.get("schema").unwrap_or(&Value::Null)))
                .collect()
        })
        .unwrap_or_default()
}

/// The request body: its content type, type and fields in place.
fn request_body(spec: &Value, op: &Value) -> String {
    let Some(body) = op.get("requestBody") else {
        return String::new();
    };
    let mut out = format!(
        "<h4>Request body ({})</h4>",
        if body["required"] == Value::Bool(true) {
            "required"
        } else {
            "optional"
        }
    );
    if let Some(d) = body.get("description").and_then(Value::as_str) {
        out.push_str(&markdown(d));
    }
    for (ctype, schema) in content(body) {
        out.push_str(&format!(
            "<p><code>{}</code>: {}</p>{}",
            esc(ctype),
            type_of(schema),
            fields(spec, schema).unwrap_or_default()
        ));
    }
    out
}

/// The responses as a table; the fields of the success answers in place.
fn responses(spec: &Value, op: &Value) -> String {
    let Some(rs) = op.get("responses").and_then(Value::as_object) else {
        return String::new();
    };
    let mut rows = String::new();
    let mut success = String::new();
    for (status, r) in rs {
        let kinds: Vec<String> = content(r)
            .iter()
            .map(|(t, s)| {
                let ty = type_of(s);
                if ty == "any" {
                    format!("<code>{}</code>", esc(t))
                } else {
                    format!("<code>{}</code>: {ty}", esc(t))
                }
            })
            .collect();
        rows.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(status),
            r.get("description")
                .and_then(Value::as_str)
                .map(markdown)
                .unwrap_or_default(),
            kinds.join("<br>")
        ));
        if status.starts_with('2') {
            for (_, s) in content(r) {
                if let (Some(name), Some(f)) = (ref_name(s), fields(spec, s)) {
                    success.push_str(&format!("<p>{} ({}):</p>{f}", esc(name), esc(status)));
                }
            }
        }
    }
    format!(
        "<h4>Responses</h4><table class=\"fields\"><thead><tr><th>status</th>\
         <th>meaning</th><th>body</th></tr></thead><tbody>{rows}</tbody></table>{success}"
    )
}

/// One operation, collapsed to its line until opened.
fn operation(spec: &Value, path: &str, method: &str, op: &Value) -> String {
    let id = op["operationId"].as_str().unwrap_or("");
    format!(
        "<details class=\"op\" id=\"op-{id}\"><summary><span class=\"m {method}\">{m}</span> \
         <code>{path}</code> {summary}</summary>{description}{params}{body}{answers}\
         </details>\n",
        id = esc(id),
        method = esc(method),
        m = esc(&method.to_uppercase()),
        path = esc(path),
        summary = op
            .get("summary")
            .and_then(Value::as_str)
            .map(inline)
            .unwrap_or_default(),
        description = op
            .get("description")
            .and_then(Value::as_str)
            .map(markdown)
            .unwrap_or_default(),
        params = parameters(op),
        body = request_body(spec, op),
        answers = responses(spec, op),
    )
}

/// The operations of `tag`, in path order.
fn tag_section(spec: &Value, tag: &str, description: &str) -> String {
    let mut ops = String::new();
    let paths = spec["paths"].as_object().into_iter().flatten();
    for (path, item) in paths {
        for method in METHODS {
            let Some(op) = item.get(method) else { continue };
            let tagged = op["tags"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t == tag));
            if tagged {
                ops.push_str(&operation(spec, path, method, op));
            }
        }
    }
    format!(
        "<h2 id=\"tag-{0}\">{0}</h2>\n{1}\n{ops}",
        esc(tag),
        markdown(description)
    )
}

/// Extra style of the docs page (on top of the pages' shared style).
const STYLE: &str = "<style>.op{border:1px solid #d0d7de;border-radius:6px;margin:.35rem 0;\
padding:.3rem .7rem}.op summary{cursor:pointer}.op[open]{padding-bottom:.7rem}.m{display:\
inline-block;min-width:4rem;font-weight:600}.get{color:#1a7f37}.post{color:#0550ae}.put{color:\
#953800}.patch{color:#8250df}.delete{color:#cf222e}.req{color:#cf222e;font-size:.8rem}\
table.fields{margin:.3rem 0 .6rem}table.fields p{margin:0}h4{margin:.8rem 0 .2rem}\
nav.toc a{margin-right:1rem}.schema{margin:1rem 0}</style>";

/// The page for `spec`.
pub fn render(spec: &Value) -> String {
    let info = &spec["info"];
    let title = format!(
        "{} API, version {}",
        info["title"].as_str().unwrap_or("dprec"),
        info["version"].as_str().unwrap_or("")
    );
    let tags: Vec<(&str, &str)> = spec["tags"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| Some((t["name"].as_str()?, t["description"].as_str().unwrap_or(""))))
        .collect();
    let toc: String = tags
        .iter()
        .map(|(t, _)| format!("<a href=\"#tag-{0}\">{0}</a>", esc(t)))
        .chain(std::iter::once("<a href=\"#schemas\">schemas</a>".into()))
        .collect();
    let keys = spec["components"]["securitySchemes"]["api_key"]["description"]
        .as_str()
        .unwrap_or("");
    let mut body = format!(
        "{STYLE}<h1>{}</h1>\n{}\n<nav class=\"toc\">{toc}</nav>\n<h2>Keys</h2>{}\n\
         <h2>Pages for a browser</h2><p>A user's privacy receipt, \
         <code>GET /v1/users/{{user}}/receipt</code>, and the operator overview, \
         <code>GET /v1/admin/overview</code>, are HTML pages. A browser cannot send a bearer \
         header on a plain navigation, so it opens them with a short-lived signed link: \
         <code>POST /v1/users/{{user}}/receipt/links</code> (a reader key or above) and \
         <code>POST /v1/admin/overview/links</code> (an admin key) answer its \
         <code>path</code>. Both are under <a href=\"#tag-pages\">pages</a>. The machine-readable \
         document: <a href=\"/openapi.json\">/openapi.json</a>.</p>\n",
        esc(&title),
        markdown(info["description"].as_str().unwrap_or("")),
        markdown(keys),
    );
    for (tag, description) in &tags {
        body.push_str(&tag_section(spec, tag, description));
    }
    body.push_str("<h2 id=\"schemas\">Schemas</h2>\n");
    let schemas = spec["components"]["schemas"]
        .as_object()
        .into_iter()
        .flatten();
    for (name, s) in schemas {
        body.push_str(&format!(
            "<div class=\"schema\" id=\"schema-{0}\"><h3>{0}</h3>{1}{2}</div>\n",
            esc(name),
            s.get("description")
                .and_then(Value::as_str)
                .map(markdown)
                .unwrap_or_default(),
            fields(spec, s).unwrap_or_else(|| format!("<p>{}</p>", type_of(s)))
        ));
    }
    shell(&title, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_renders_code_bold_links_and_lists() {
        assert_eq!(
            markdown("A `x<y` and **b**,\nsame paragraph.\n\nNext."),
            "<p>A <code>x&lt;y</code> and <b>b</b>, same paragraph.</p><p>Next.</p>"
        );
        assert_eq!(
            markdown("- one `a`\n- two"),
            "<ul><li>one <code>a</code></li><li>two</li></ul>"
        );
        assert_eq!(
            inline("see [the spec](/openapi.json) or [x](https://example.org)"),
            "see <a href=\"/openapi.json\">the spec</a> or x (https://example.org)"
        );
        // Unbalanced markers stay text.
        assert_eq!(inline("a ` b ** c [d"), "a ` b ** c [d");
        assert_eq!(inline("<script>"), "&lt;script&gt;");
    }

    /// The page as served: grouped by tag in the document's order, no literal backtick,
    /// every reference resolved to a section, no external URL, no script.
    #[test]
    fn the_page_is_grouped_rendered_and_resolved() {
        let spec: Value = serde_json::from_str(&super::super::openapi::spec_json()).unwrap();
        let html = render(&spec);
        let mut at = 0;
        for t in spec["tags"].as_array().unwrap() {
            let name = t["name"].as_str().unwrap();
            let here = html
                .find(&format!("<h2 id=\"tag-{name}\">"))
                .unwrap_or_else(|| panic!("no section {name}"));
            assert!(here > at, "tag {name} out of order");
            at = here;
        }
        assert!(!html.contains('`'), "a literal backtick");
        assert!(!html.contains("$ref") && !html.contains("#/components"));
        for name in spec["components"]["schemas"].as_object().unwrap().keys() {
            assert!(html.contains(&format!("id=\"schema-{name}\"")), "{name}");
        }
        for (path, item) in spec["paths"].as_object().unwrap() {
            for (_, op) in item.as_object().unwrap() {
                let id = op["operationId"].as_str().unwrap();
                assert!(html.contains(&format!("id=\"op-{id}\"")), "{path} {id}");
            }
        }
        // A body's fields are shown in place, with their types linked.
        let ingest = &html[html.find("id=\"op-ingest\"").unwrap()..];
        let ingest = &ingest[..ingest.find("</details>").unwrap()];
        assert!(ingest.contains("<code>ratings</code> <span class=\"req\">required</span>"));
        assert!(ingest.contains("array of <a href=\"#schema-RatingIn\">RatingIn</a>"));
        for bad in [
            "http://",
            "https://",
            "<script",
            "src=",
            "href=\"/v1/admin/overview\"",
        ] {
            assert!(!html.contains(bad), "{bad}");
        }
    }
}
