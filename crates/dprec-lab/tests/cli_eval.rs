//! `dprec-lab eval` end to end: random k-fold on a small CSV, JSON report, SVG plot, errors.

use std::process::Command;

fn dprec() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dprec-lab"))
}

/// A small MovieLens "latest" style CSV with a learnable structure.
fn write_csv(dir: &std::path::Path) -> std::path::PathBuf {
    let mut body = String::from("userId,movieId,rating,timestamp\n");
    for u in 0..60 {
        for i in 0..40 {
            if (u * 7 + i * 3) % 4 == 0 {
                continue;
            }
            let v = 1.0 + ((u % 3) as f64 + (i % 5) as f64) * 0.5;
            body.push_str(&format!("{u},{i},{v:.1},{}\n", 1_000_000 + u * 40 + i));
        }
    }
    let p = dir.join("ratings.csv");
    std::fs::write(&p, body).unwrap();
    p
}

#[test]
fn random_kfold_writes_report_and_plot() {
    let dir = tempfile::tempdir().unwrap();
    let data = write_csv(dir.path());
    let out = dir.path().join("r.json");
    let plot = dir.path().join("p.svg");
    let o = dprec()
        .args(["eval", "--data"])
        .arg(&data)
        .args(["--k", "3", "--seed", "4", "--trainer", "baseline"])
        .args(["--trainer", "als-mf", "--sweep", "d=2,4", "--quiet"])
        .arg("--out")
        .arg(&out)
        .arg("--plot")
        .arg(&plot)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("als-mf d=2"), "{stdout}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let runs = report["runs"].as_array().unwrap();
    // baseline has no `d`: it runs once, as a reference; als-mf runs per swept value.
    assert_eq!(runs.len(), 3, "{report}");
    assert!(runs[0]["sweep"].is_null() && runs[0]["trainer"] == "baseline");
    for r in runs {
        assert_eq!(r["folds"].as_array().unwrap().len(), 3);
        let rmse = r["mean"]["rmse"].as_f64().unwrap();
        assert!(rmse > 0.0 && rmse < 2.0, "{r}");
    }
    assert_eq!(runs[1]["sweep"]["param"], "d");
    assert_eq!(runs[2]["sweep"]["value"], 4.0);
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(
        svg.starts_with("<svg") || svg.contains("<svg"),
        "not an SVG"
    );
}

#[test]
fn errors_name_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let data = write_csv(dir.path());
    let run = |args: &[&str]| {
        let o = dprec()
            .arg("eval")
            .arg("--data")
            .arg(&data)
            .args(args)
            .output()
            .unwrap();
        assert!(!o.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    assert!(run(&["--trainer", "nope"]).contains("known trainers"));
    assert!(run(&["--trainer", "sgd-mf:epochz=3"]).contains("epochz"));
    assert!(run(&["--trainer", "sgd-mf", "--param", "lr=-1"]).contains("lr"));
    assert!(run(&["--trainer", "sgd-mf", "--sweep", "d=1,x"]).contains("\"x\""));
    let bad = dir.path().join("bad.csv");
    std::fs::write(
        &bad,
        "userId,movieId,rating,timestamp\n1,2,3.0,5\n1,3,abc,6\n",
    )
    .unwrap();
    let o = dprec()
        .args(["eval", "--trainer", "baseline", "--data"])
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("bad.csv:3:"), "{err}");
    // --data that does not exist: where it was looked for.
    let o = dprec()
        .args(["eval", "--trainer", "baseline", "--data", "no/such/dir"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("no/such/dir") && err.contains("relative to the working directory"),
        "{err}"
    );
    // DPREC_ML100K_DIR is the default of --data.
    let o = dprec()
        .args(["eval", "--trainer", "baseline"])
        .env("DPREC_ML100K_DIR", "/no/such/ml-100k")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("/no/such/ml-100k"),
        "{err}"
    );
}
