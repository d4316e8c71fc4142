//! Every integration test in one binary: one crate to compile and one executable to link
//! instead of one per file, which is most of a cold `cargo test` (docs/DEVELOPING.md, "Time to first
//! green test"). Cargo.toml sets `autotests = false`, so a new file tests/NAME.rs (or
//! tests/NAME/mod.rs) runs only once it is declared here; `every_test_file_is_declared`
//! fails until it is. Run one file's tests with `cargo test --test tests NAME::`.

mod common;

mod accountant_golden;
mod api;
mod cli_accountant;
mod cli_keys;
mod docs;
mod honest_releases;
mod toolchain;
mod train_dp_alt;
mod train_gaussian_mf;
mod train_nonprivate;
mod train_objpert;
mod train_ssp;

/// A test file that is not declared above would silently never run.
#[test]
fn every_test_file_is_declared() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let main = std::fs::read_to_string(dir.join("main.rs")).unwrap();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let is_module = if path.is_dir() {
            assert!(
                !path.join("main.rs").exists(),
                "tests/{name}/main.rs would be its own test binary: rename it to mod.rs and \
                 declare `mod {name};` in tests/main.rs"
            );
            path.join("mod.rs").exists()
        } else {
            path.extension().is_some_and(|e| e == "rs") && name != "main"
        };
        if is_module && !main.contains(&format!("mod {name};")) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "declare these test modules in tests/main.rs (`mod NAME;`): {missing:?}"
    );
}
