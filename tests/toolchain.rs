//! The declared Rust minimum (`rust-version` in Cargo.toml) must cover every locked
//! dependency: a `cargo update` that raises some crate's own minimum fails here, not in
//! a newcomer's container build. The Containerfile's builder image and the README name
//! the same version.

use std::path::Path;
use std::process::Command;

/// `"1.89"` or `"1.88.0"` as comparable numbers (missing parts are 0).
fn parse_version(v: &str) -> Vec<u64> {
    let mut parts: Vec<u64> = v
        .split('.')
        .map(|p| p.parse().unwrap_or_else(|_| panic!("bad version {v:?}")))
        .collect();
    parts.resize(3, 0);
    parts
}

/// The host's target triple (`rustc -vV`).
fn host_triple() -> String {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("run rustc -vV");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .expect("rustc -vV names the host")
}

/// The highest `rust_version` any locked package built for this host declares, with that
/// package's name. Offline and filtered to the host: a fresh machine has downloaded only
/// the crates its own build needs (not, e.g., Windows-only ones), and the service and its
/// container are built for Linux.
fn locked_minimum() -> (Vec<u64>, String) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let host = host_triple();
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .args(["--filter-platform", &host])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["name"] != "dprec")
        .filter_map(|p| {
            let rv = p["rust_version"].as_str()?;
            Some((parse_version(rv), format!("{} {}", p["name"], p["version"])))
        })
        .max()
        .expect("some locked package declares a rust_version")
}

#[test]
fn declared_rust_version_covers_every_locked_dependency() {
    let declared = env!("CARGO_PKG_RUST_VERSION");
    let (needed, by) = locked_minimum();
    assert_eq!(
        parse_version(declared),
        needed,
        "Cargo.toml says rust-version = {declared:?}, but the locked dependencies need \
         {needed:?} (highest: {by}); set rust-version, deploy/Containerfile's FROM and the \
         README's requirement to that version"
    );
}

#[test]
fn containerfile_and_readme_name_the_declared_rust_version() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let declared = env!("CARGO_PKG_RUST_VERSION");
    let containerfile = std::fs::read_to_string(root.join("deploy/Containerfile")).unwrap();
    assert!(
        containerfile.contains(&format!("FROM rust:{declared}-")),
        "deploy/Containerfile must build with rust:{declared}"
    );
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(
        readme.contains(&format!("Rust {declared} or newer")),
        "README.md must say `Rust {declared} or newer`"
    );
}

/// The README's first command, `cargo run --release -- serve`, must run the service: the
/// workspace has two binaries (`dprec`, `dprec-lab`), so the root package names its own
/// (`default-run`), or `cargo run` refuses to choose.
#[test]
fn cargo_run_at_the_root_runs_the_service() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest: toml::Table = std::fs::read_to_string(root.join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        manifest["package"]
            .get("default-run")
            .and_then(|v| v.as_str()),
        Some("dprec"),
        "Cargo.toml [package] needs default-run = \"dprec\""
    );
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(readme.contains("cargo run --release -- serve"));
}
