//! The layering of the service crate, checked on its sources: which top-level module may
//! import which (docs/DEVELOPING.md, "What is here"). A module imports another when its
//! code (not its comments, not its `mod tests`) names `crate::<other>`. The rules below
//! fail on an import that climbs; [`top_level_modules_form_no_cycle`] fails on a cycle.
//! The privacy core's own rule (no I/O stack) is checked on its dependency tree.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules that must not import `target`, except the paths listed (prefixes of the path
/// after `crate::`).
struct Rule {
    from: &'static str,
    target: &'static str,
    except: &'static [&'static str],
    why: &'static str,
}

/// The service-side modules above the trainers.
const SERVICE: [&str; 8] = [
    "api", "cli", "config", "release", "serve", "startup", "store", "lanes",
];

const RULES: &[Rule] = &[
    Rule {
        from: "api",
        target: "cli",
        except: &[],
        why: "the command line sits above the API (shared key helpers live in api::keyring)",
    },
    Rule {
        from: "serve",
        target: "store",
        except: &[],
        why: "serving reads published values; release turns stored rows into them",
    },
    Rule {
        from: "serve",
        target: "train",
        except: &[],
        why: "serving scores with published models (crate::model), it does not train",
    },
    Rule {
        from: "model",
        target: "train",
        except: &[],
        why: "a published model is what trainers produce; it knows no trainer",
    },
    Rule {
        from: "store",
        target: "train",
        // The sufficient-statistics port: a database computes dp-topn's sums
        // (suffstats, its contribution bounds, the continual series' parameters).
        except: &[
            "train::topn::suffstats",
            "train::topn::contribution",
            "train::topn::continual",
            "train::TrainError",
        ],
        why: "storage keeps rows; only the sufficient-statistics port is shared",
    },
    Rule {
        from: "config",
        target: "api",
        except: &[],
        why: "the configuration is read by the API, not the other way round",
    },
    Rule {
        from: "release",
        target: "api",
        except: &[],
        why: "the API starts releases; a release does not call handlers",
    },
];

/// The code of a source file: its text before `mod tests`, comments dropped.
fn code_of(text: &str) -> String {
    let body = match text.find("#[cfg(test)]\nmod tests") {
        Some(k) => &text[..k],
        None => text,
    };
    body.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `crate::...` paths a piece of code names, each as the text after `crate::`
/// (`use crate::{a::b, c}` gives `a::b` and `c`).
fn crate_paths(code: &str) -> Vec<String> {
    let is_path = |c: char| c.is_alphanumeric() || c == '_' || c == ':';
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(k) = rest.find("crate::") {
        let after = &rest[k + "crate::".len()..];
        let head: String = after.chars().take_while(|&c| is_path(c)).collect();
        if let Some(group) = after[head.len()..].strip_prefix('{') {
            // `crate::a::{b, c}`: one path per member, under the common prefix.
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let p: String = part.trim().chars().take_while(|&c| is_path(c)).collect();
                if !p.is_empty() {
                    out.push(format!("{head}{p}"));
                }
            }
        } else {
            out.push(head.trim_end_matches(':').to_string());
        }
        rest = after;
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every (module, path named) pair of the service crate's code, with the file.
fn imports() -> Vec<(String, String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut out = Vec::new();
    for f in files {
        let rel = f
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let module = rel
            .split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_string();
        if module.ends_with("_tests") || module == "lib" || module == "main" {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&f).unwrap());
        for p in crate_paths(&code) {
            out.push((module.clone(), p, rel.clone()));
        }
    }
    out
}

#[test]
fn no_import_climbs() {
    let mut bad = Vec::new();
    let mut rules: Vec<Rule> = Vec::new();
    // Nothing below the service imports it: the trainers, data and numerics know no
    // database, handler, configuration or release.
    for from in ["train", "model", "data", "numerics", "ldp"] {
        for target in SERVICE {
            rules.push(Rule {
                from,
                target,
                except: &[],
                why: "the trainers and their data sit below the service",
            });
        }
    }
    for (module, path, file) in imports() {
        let head = path.split("::").next().unwrap_or("");
        for r in RULES.iter().chain(&rules) {
            if r.from == module && r.target == head && !r.except.iter().any(|e| path.starts_with(e))
            {
                bad.push(format!("{file}: crate::{path} ({})", r.why));
            }
        }
    }
    assert!(bad.is_empty(), "imports that climb:\n{}", bad.join("\n"));
}

#[test]
fn top_level_modules_form_no_cycle() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, path, _) in imports() {
        let head = path.split("::").next().unwrap_or("").to_string();
        if head != module && !head.is_empty() {
            edges.entry(module).or_default().insert(head);
        }
    }
    // Depth-first search; a back edge is a cycle.
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        cycles: &mut Vec<String>,
    ) {
        if done.contains(m) {
            return;
        }
        if let Some(k) = stack.iter().position(|s| s == m) {
            cycles.push(format!("{} -> {m}", stack[k..].join(" -> ")));
            return;
        }
        stack.push(m.to_string());
        for n in edges.get(m).into_iter().flatten() {
            visit(n, edges, stack, done, cycles);
        }
        stack.pop();
        done.insert(m.to_string());
    }
    let mut cycles = Vec::new();
    let mut done = BTreeSet::new();
    for m in edges.keys() {
        visit(m, &edges, &mut Vec::new(), &mut done, &mut cycles);
    }
    assert!(cycles.is_empty(), "module cycles: {cycles:?}");
}

/// The budget rule lives in one place: the service (API, store, release, serving,
/// configuration, start-up) does no filter or conversion arithmetic of its own; it asks
/// the ledger (`dprec_dp::ledger`: admission, the commit's re-check, the audit numbers).
#[test]
fn the_service_leaves_budget_arithmetic_to_the_ledger() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut bad = Vec::new();
    for module in [
        "api",
        "store",
        "release",
        "serve",
        "config.rs",
        "startup.rs",
    ] {
        let mut files = Vec::new();
        let path = src.join(module);
        if path.is_dir() {
            rust_files(&path, &mut files);
        } else {
            files.push(path);
        }
        for f in files {
            let code = code_of(&std::fs::read_to_string(&f).unwrap());
            for name in [
                "RenyiFilter",
                "eps_from_rdp",
                "compose_events",
                "releases_left(",
                "admitting_order",
            ] {
                // The name itself, not a longer one ending in it.
                let named = code.match_indices(name).any(|(k, _)| {
                    !code[..k]
                        .chars()
                        .next_back()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_')
                });
                if named {
                    bad.push(format!("{}: {name}", f.display()));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "budget arithmetic outside the ledger: {bad:?}"
    );
}

/// The privacy core's dependency tree has no I/O stack (no database driver, HTTP server
/// or client, async runtime).
#[test]
fn the_privacy_core_has_no_io_stack() {
    let out = std::process::Command::new(env!("CARGO"))
        .args(["tree", "-p", "dprec-dp", "-e", "normal", "--prefix", "none"])
        .args(["--offline", "--all-features"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    let names: BTreeSet<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        names.contains("dprec-dp") && names.contains("rand"),
        "{tree}"
    );
    for io in [
        "sqlx",
        "actix-web",
        "tokio",
        "reqwest",
        "hyper",
        "mio",
        "libsqlite3-sys",
    ] {
        assert!(!names.contains(io), "dprec-dp depends on {io}:\n{tree}");
    }
}

#[test]
fn paths_are_read_from_code_not_comments() {
    let code = code_of(
        "use crate::{a::b, c};\nuse crate::x::{y, z::W};\n// crate::d\nfn f() { crate::e::g(); }\n#[cfg(test)]\nmod tests { use crate::h; }",
    );
    assert_eq!(crate_paths(&code), ["a::b", "c", "x::y", "x::z::W", "e::g"]);
}
