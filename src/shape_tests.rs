//! Checks on the shape of the source itself (issue 7): no function in the workspace's
//! sources (src/, crates/*/src) runs over [`MAX_FN_LINES`] lines without a reason written
//! beside it.
//!
//! A long function is allowed when a comment containing `long:` stands in the comment
//! and attribute lines right above it, e.g.
//!
//! ```text
//! /// Fits the model.
//! // long: one numeric loop over the epochs; its steps share a dozen locals.
//! fn fit(...) { ... }
//! ```

use std::path::{Path, PathBuf};

/// The longest function body (lines from its `{` to its `}`) that needs no reason.
pub const MAX_FN_LINES: usize = 80;

/// Long functions in files that other branches are rewriting now (issue 7's DO NOT list);
/// each gets a split or a `long:` reason when that work lands. The test fails when an
/// entry no longer names a long function, so the list cannot outlive its reason.
const PENDING_ELSEWHERE: &[(&str, &str)] = &[];

/// A function found in a source file.
#[derive(Debug, Clone, PartialEq)]
pub struct FnSpan {
    pub name: String,
    /// 1-based line of the `fn` keyword.
    pub line: usize,
    /// Lines from the body's `{` to its `}`, both included.
    pub body_lines: usize,
    /// Whether a `long:` comment stands right above the function.
    pub has_reason: bool,
}

/// `text` with comments, string and character literals blanked out (newlines kept), so
/// that braces and `fn` inside them are not seen.
fn blank_literals(text: &str) -> Vec<u8> {
    let mut out = text.as_bytes().to_vec();
    let mut i = 0;
    while i < out.len() {
        match literal_end(text, i) {
            Some(end) => {
                let end = end.min(out.len());
                for c in &mut out[i..end] {
                    if *c != b'\n' {
                        *c = b' ';
                    }
                }
                i = end;
            }
            None => i += 1,
        }
    }
    out
}

/// Where the comment, string or character literal that starts at byte `i` ends
/// (exclusive); `None` when none starts there.
fn literal_end(text: &str, i: usize) -> Option<usize> {
    let b = text.as_bytes();
    let rest = &b[i..];
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    if rest.starts_with(b"//") {
        return Some(
            rest.iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |p| i + p),
        );
    }
    if rest.starts_with(b"/*") {
        // Block comments nest.
        let (mut depth, mut j) = (0, i);
        while j < b.len() {
            if b[j..].starts_with(b"/*") {
                depth += 1;
                j += 2;
            } else if b[j..].starts_with(b"*/") {
                depth -= 1;
                j += 2;
                if depth == 0 {
                    break;
                }
            } else {
                j += 1;
            }
        }
        return Some(j);
    }
    if rest.first() == Some(&b'r') && (i == 0 || !ident(b[i - 1])) {
        let hashes = rest[1..].iter().take_while(|&&c| c == b'#').count();
        if rest.get(1 + hashes) != Some(&b'"') {
            return None;
        }
        let mut close = vec![b'"'];
        close.extend(std::iter::repeat_n(b'#', hashes));
        let start = i + 2 + hashes;
        return Some(
            b[start..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(b.len(), |p| start + p + close.len()),
        );
    }
    match rest.first()? {
        b'"' => {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            Some(j + 1)
        }
        // A character literal ('x', '\n', '\u{..}'), not a lifetime ('a).
        b'\'' if rest.get(1) == Some(&b'\\') => rest[2..]
            .iter()
            .position(|&c| c == b'\'')
            .map(|p| i + p + 3),
        b'\'' => {
            let ch = text[i + 1..].chars().next().map_or(1, char::len_utf8);
            (rest.get(1 + ch) == Some(&b'\'')).then_some(i + ch + 2)
        }
        _ => None,
    }
}

/// The functions with a body in `text`, with their lengths.
pub fn functions(text: &str) -> Vec<FnSpan> {
    let code = blank_literals(text);
    let lines: Vec<&str> = text.lines().collect();
    let line_of = |pos: usize| code[..pos].iter().filter(|&&c| c == b'\n').count() + 1;
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(p) = code[i..].windows(3).position(|w| w == b"fn ") {
        let at = i + p;
        i = at + 3;
        if at > 0 && ident(code[at - 1]) {
            continue;
        }
        let name: String = code[i..]
            .iter()
            .skip_while(|c| c.is_ascii_whitespace())
            .take_while(|&&c| ident(c))
            .map(|&c| c as char)
            .collect();
        if name.is_empty() {
            continue; // `fn(` types
        }
        // The body starts at the first `{` outside parentheses and brackets; a `;` there
        // first means a declaration without a body.
        let mut depth = 0i32;
        let mut open = None;
        for (k, &c) in code.iter().enumerate().skip(i) {
            match c {
                b'(' | b'[' => depth += 1,
                b')' | b']' => depth -= 1,
                b';' if depth == 0 => break,
                b'{' if depth == 0 => {
                    open = Some(k);
                    break;
                }
                _ => {}
            }
        }
        let Some(open) = open else { continue };
        let mut braces = 0i32;
        let mut close = code.len() - 1;
        for (k, &c) in code.iter().enumerate().skip(open) {
            match c {
                b'{' => braces += 1,
                b'}' => {
                    braces -= 1;
                    if braces == 0 {
                        close = k;
                        break;
                    }
                }
                _ => {}
            }
        }
        let line = line_of(at);
        let has_reason = lines[..line - 1]
            .iter()
            .rev()
            .map(|l| l.trim_start())
            .take_while(|l| l.starts_with("//") || l.starts_with("#[") || l.starts_with(')'))
            .any(|l| l.starts_with("//") && l.contains("long:"));
        out.push(FnSpan {
            name,
            line,
            body_lines: line_of(close) - line_of(open) + 1,
            has_reason,
        });
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_long_function_without_a_reason() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        // The service and every crate of the workspace (crates/*/src).
        rust_files(&root.join("src"), &mut files);
        for krate in std::fs::read_dir(root.join("crates")).unwrap() {
            rust_files(&krate.unwrap().path().join("src"), &mut files);
        }
        let mut unexplained = Vec::new();
        let mut pending_seen = Vec::new();
        for f in &files {
            let rel = f
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let text = std::fs::read_to_string(f).unwrap();
            for s in functions(&text) {
                if s.body_lines <= MAX_FN_LINES || s.has_reason {
                    continue;
                }
                if PENDING_ELSEWHERE.contains(&(rel.as_str(), s.name.as_str())) {
                    pending_seen.push((rel.clone(), s.name.clone()));
                    continue;
                }
                unexplained.push(format!(
                    "{rel}:{} fn {} ({} lines)",
                    s.line, s.name, s.body_lines
                ));
            }
        }
        assert!(
            unexplained.is_empty(),
            "functions over {MAX_FN_LINES} lines without a `// long: why` comment above \
             them (split them into named steps, or say why not):\n{}",
            unexplained.join("\n")
        );
        for (file, name) in PENDING_ELSEWHERE {
            assert!(
                pending_seen.iter().any(|(f, n)| f == file && n == name),
                "{file}: fn {name} is no longer long (or has its reason): drop it from \
                 PENDING_ELSEWHERE"
            );
        }
    }

    /// The scanner: braces and `fn` in strings, characters and comments do not count,
    /// bodies are measured from `{` to `}`, and a `long:` comment above (among doc
    /// comments and attributes) is found; one farther away is not.
    #[test]
    fn scanner_measures_bodies_and_finds_reasons() {
        let body = |n: usize| "    let x = 1;\n".repeat(n);
        let src = format!(
            "/// Doc.\n// long: one loop.\n#[inline]\npub fn a() {{\n{}}}\n\n\
             // long: too far away\n\nfn b(x: &str) -> Result<(), String> {{\n    \
             let s = \"{{ fn c() {{\";\n    let c = '{{';\n    let r = r#\"}}\"#;\n    \
             // }} fn d() {{\n{}}}\n\
             trait T {{ fn e(&self); }}\nfn f<'a>(x: &'a str) -> &'a str {{ x }}\n",
            body(3),
            body(90)
        );
        let fns = functions(&src);
        let names: Vec<_> = fns.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "f"]);
        assert_eq!((fns[0].body_lines, fns[0].has_reason), (5, true));
        assert_eq!(fns[1].body_lines, 90 + 6);
        assert!(!fns[1].has_reason);
        assert_eq!(fns[2].body_lines, 1);
    }
}
