//! `dprec accountant` end to end: runs the built binary and checks its JSON
//! against the library.

use std::io::Write;
use std::process::{Command, Stdio};

use dprec_dp::accountant::{
    compose_events, default_orders, delta_from_rdp, eps_from_rdp, PrivacyEvent,
};

/// serde_json's default float parser is within 1 ulp-ish, not bit-exact.
fn same(json: &serde_json::Value, want: f64) -> bool {
    let got = json.as_f64().unwrap_or(f64::INFINITY);
    got == want || (got - want).abs() <= 1e-14 * want.abs()
}

fn dprec(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dprec"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dprec");
    {
        let mut pipe = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            pipe.write_all(s.as_bytes()).unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn subsampled_gaussian_json_matches_library() {
    let (code, stdout, stderr) = dprec(
        &[
            "accountant",
            "subsampled-gaussian",
            "--q",
            "0.01",
            "--sigma",
            "1.1",
            "--steps",
            "1000",
            "--delta",
            "1e-5",
            "--curve",
        ],
        None,
    );
    assert_eq!(code, 0, "stderr: {stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();

    let event = PrivacyEvent::poisson_subsampled_gaussian(0.01, 1.1, 1000).unwrap();
    let curve = event.rdp_curve(&default_orders()).unwrap();
    let want = eps_from_rdp(&curve, 1e-5).unwrap();

    assert!(same(&v["eps"], want.eps), "{}", v["eps"]);
    assert!(same(&v["delta"], 1e-5));
    assert_eq!(v["best_order"].as_f64(), want.best_order);
    let events: Vec<PrivacyEvent> = serde_json::from_value(v["events"].clone()).unwrap();
    assert_eq!(events, vec![event]);
    let points = v["rdp_curve"].as_array().unwrap();
    assert_eq!(points.len(), default_orders().len());
    for (p, (order, rdp)) in points.iter().zip(curve.points()) {
        assert_eq!(p["order"].as_f64().unwrap(), order);
        assert!(same(&p["rdp"], rdp), "order {order}");
    }
}

#[test]
fn compose_from_stdin_with_target_eps_matches_library() {
    let json = r#"[{"mechanism":"gaussian","noise_multiplier":4.0,"count":20},
                   {"mechanism":"laplace","scale":5.0,"count":2},
                   {"mechanism":"pure_dp","eps":0.1}]"#;
    let (code, stdout, stderr) = dprec(
        &[
            "accountant",
            "compose",
            "--events",
            "-",
            "--target-eps",
            "3",
        ],
        Some(json),
    );
    assert_eq!(code, 0, "stderr: {stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let events: Vec<PrivacyEvent> = serde_json::from_str(json).unwrap();
    let curve = compose_events(&events, &default_orders()).unwrap();
    let want = delta_from_rdp(&curve, 3.0).unwrap();
    assert!(same(&v["eps"], 3.0));
    assert!(same(&v["delta"], want.delta), "{}", v["delta"]);
    assert_eq!(v["best_order"].as_f64(), want.best_order);
    assert!(v.get("rdp_curve").is_none());
}

#[test]
fn bad_flag_value_fails_and_names_the_flag() {
    let (code, stdout, stderr) = dprec(&["accountant", "gaussian", "--sigma", "-2"], None);
    assert_ne!(code, 0);
    assert!(stdout.is_empty());
    assert!(stderr.contains("--sigma"), "{stderr}");

    let (code, _, stderr) = dprec(
        &["accountant", "compose", "--events", "-"],
        Some(r#"[{"mechanism":"gaussian","noise_multiplier":0}]"#),
    );
    assert_ne!(code, 0);
    assert!(
        stderr.contains("--events") && stderr.contains("events[0].noise_multiplier"),
        "{stderr}"
    );
}
