//! The pages a reader follows: every relative link in README.md, docs/ (docs/privacy/
//! included), deploy/, bench/ and the lab's notes resolves to a file and, for a
//! `#anchor`, to a heading of that file; and no page under docs/ or in the notes is
//! longer than 500 lines (a page longer than that is not read).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 500;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn markdown_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            markdown_under(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// README.md and every Markdown page under docs/, deploy/, bench/ and the lab's notes.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut out = vec![root.join("README.md")];
    for dir in ["docs", "deploy", "bench", "crates/dprec-lab/notes"] {
        markdown_under(&root.join(dir), &mut out);
    }
    out.sort();
    out
}

/// The text outside fenced code blocks, line by line (links in code are not links).
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// `line` without its inline code spans.
fn without_code(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// The anchors GitHub gives the headings of a page: the heading's text (links reduced to
/// their text) lower-cased, every character but letters, digits, spaces, `-` and `_`
/// dropped, spaces made `-`; a repeated anchor gets `-1`, `-2`, ...
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for line in prose(text) {
        let t = line.trim_start();
        if !t.starts_with('#') {
            continue;
        }
        let heading = t.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let mut plain = String::new();
        let mut rest = heading.trim();
        // [text](url) -> text
        while let Some(open) = rest.find('[') {
            plain.push_str(&rest[..open]);
            let after = &rest[open + 1..];
            match (after.find("]("), after.find(')')) {
                (Some(close), Some(end)) if close < end => {
                    plain.push_str(&after[..close]);
                    rest = &after[end + 1..];
                }
                _ => {
                    plain.push('[');
                    rest = after;
                }
            }
        }
        plain.push_str(rest);
        let slug: String = plain
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut candidate = slug.clone();
        let mut n = 0;
        while seen.contains(&candidate) {
            n += 1;
            candidate = format!("{slug}-{n}");
        }
        seen.insert(candidate);
    }
    seen
}

/// The targets of the inline links `[text](target)` and images `![alt](target)` of a page.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let line = without_code(line);
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else {
                break;
            };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            out.push(target.to_owned());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let root = root();
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let shown = page.strip_prefix(&root).unwrap().display().to_string();
        for target in links(&text) {
            if target.is_empty()
                || target.contains("://")
                || target.starts_with("mailto:")
                || target.starts_with('$')
            {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            if !path.exists() {
                broken.push(format!("{shown}: {target} (no such file)"));
                continue;
            }
            if let Some(anchor) = anchor {
                if path.extension().is_some_and(|e| e == "md") {
                    let linked = std::fs::read_to_string(&path).unwrap();
                    if !anchors(&linked).contains(anchor) {
                        broken.push(format!("{shown}: {target} (no such heading)"));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn no_page_is_longer_than_a_reader_reads() {
    let root = root();
    let mut long = Vec::new();
    for page in pages() {
        let shown = page.strip_prefix(&root).unwrap().display().to_string();
        if !(shown.starts_with("docs/") || shown.starts_with("crates/dprec-lab/notes/")) {
            continue;
        }
        let lines = std::fs::read_to_string(&page).unwrap().lines().count();
        if lines > MAX_LINES {
            long.push(format!("{shown}: {lines} lines"));
        }
    }
    assert!(
        long.is_empty(),
        "pages over {MAX_LINES} lines (move the record to crates/dprec-lab/notes/, split \
         by topic):\n{}",
        long.join("\n")
    );
}

#[test]
fn anchors_follow_the_github_rule() {
    let a = anchors(
        "# Title\n## The `dp-topn` plan (eps_u, delta_u)\n## Title\n```\n# not a heading\n```\n\
         ## [Linked](x.md) text\n",
    );
    for expected in [
        "title",
        "the-dp-topn-plan-eps_u-delta_u",
        "title-1",
        "linked-text",
    ] {
        assert!(a.contains(expected), "{expected} not in {a:?}");
    }
    assert!(!a.contains("not-a-heading"));
    assert_eq!(
        links("see [a](b.md#c) and `[x](y)` and ![i](f.svg \"t\")\n```\n[z](w)\n```\n"),
        vec!["b.md#c", "f.svg"]
    );
}
