//! `dprec keys` end to end on a SQLite file, and the error messages a new user meets
//! first (`--data` that does not exist, an environment variable with one underscore).

use std::process::Command;

fn dprec(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dprec"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run dprec");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn keys_create_list_revoke() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("dprec.sqlite").display());
    let env = [("DATABASE_URL", url.as_str())];
    let (code, key, err) = dprec(&["keys", "create", "--role", "writer"], &env);
    assert_eq!(code, 0, "{err}");
    let key = key.trim();
    assert!(key.starts_with("dprec_") && key.len() > 60, "{key}");
    let id = dprec::api::keyring::key_id(&dprec::api::auth::hash_key(key)).to_string();
    assert!(err.contains(&id), "{err}");
    let (code, _, err) = dprec(&["keys", "create", "--role", "admin"], &env);
    assert_eq!(code, 0, "{err}");

    let (code, list, err) = dprec(&["keys", "list"], &env);
    assert_eq!(code, 0, "{err}");
    let line = list.lines().find(|l| l.starts_with(&id)).expect("listed");
    assert!(
        line.contains("writer") && line.contains("database"),
        "{list}"
    );
    assert!(
        !list.contains(key),
        "the key itself is never listed: {list}"
    );
    assert_eq!(list.lines().count(), 3, "{list}");

    let (code, _, err) = dprec(&["keys", "revoke", &id], &env);
    assert_eq!(code, 0, "{err}");
    let (_, list, _) = dprec(&["keys", "list"], &env);
    assert!(!list.contains(&id) && list.contains("admin"), "{list}");
    let (code, _, err) = dprec(&["keys", "revoke", &id], &env);
    assert_ne!(code, 0);
    assert!(err.contains("no stored key has id"), "{err}");
    let (code, _, err) = dprec(&["keys", "revoke", "xyz"], &env);
    assert_ne!(code, 0);
    assert!(err.contains("hex digits"), "{err}");
}

/// `dprec keys create --role user --user ID` makes a user token bound to that user (the
/// same key table as `POST /v1/admin/keys`); a user token needs its user, other roles
/// take none.
#[test]
fn keys_create_user_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("dprec.sqlite").display());
    let env = [("DATABASE_URL", url.as_str())];
    let (code, key, err) = dprec(&["keys", "create", "--role", "user", "--user", "u42"], &env);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("u42"), "{err}");
    let id = dprec::api::keyring::key_id(&dprec::api::auth::hash_key(key.trim())).to_string();
    let (code, _, err) = dprec(&["keys", "create", "--role", "public"], &env);
    assert_eq!(code, 0, "{err}");
    let (_, list, _) = dprec(&["keys", "list"], &env);
    let line = list.lines().find(|l| l.starts_with(&id)).expect("listed");
    assert!(line.contains("user") && line.contains("u42"), "{list}");
    assert!(list.lines().any(|l| l.contains("public")), "{list}");
    let (code, _, err) = dprec(&["keys", "create", "--role", "user"], &env);
    assert_ne!(code, 0);
    assert!(err.contains("needs the user"), "{err}");
    let (code, _, err) = dprec(
        &["keys", "create", "--role", "reader", "--user", "u42"],
        &env,
    );
    assert_ne!(code, 0);
    assert!(err.contains("takes no user"), "{err}");
}

#[test]
fn first_errors_say_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("dprec.sqlite").display());
    // A single-underscore variable is reported with the right name.
    let (code, _, err) = dprec(
        &["keys", "list"],
        &[
            ("DATABASE_URL", url.as_str()),
            ("DPREC_SERVER_BIND", "127.0.0.1:1"),
        ],
    );
    assert_ne!(code, 0);
    assert!(err.contains("DPREC_SERVER__BIND"), "{err}");
    // A wrong value from the environment names the variable and the format.
    let (code, _, err) = dprec(
        &["keys", "list"],
        &[
            ("DATABASE_URL", url.as_str()),
            ("DPREC_BUDGET__SHARE", "quarter"),
        ],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("DPREC_BUDGET__SHARE") && err.contains("fraction:F"),
        "{err}"
    );
}
