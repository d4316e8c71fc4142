//! Every response the API tests receive is checked against the committed
//! openapi/openapi.json, so a handler that answers with something the spec does not
//! describe (an undocumented status, a field of another type, an extra field, a body
//! where none is declared) fails the test that received it.
//!
//! The check is stricter than OpenAPI itself in one way: object schemas that list
//! `properties` get `additionalProperties: false`, so an undocumented field is drift too.
//! Responses of routes the spec does not list (the router's 404/405) are not checked.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use serde_json::{json, Value};

/// The committed spec, with object schemas made strict.
fn spec() -> &'static Value {
    static SPEC: OnceLock<Value> = OnceLock::new();
    SPEC.get_or_init(|| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi/openapi.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let mut doc: Value = serde_json::from_str(&text).expect("openapi.json is JSON");
        close_objects(&mut doc);
        doc
    })
}

/// Adds `additionalProperties: false` to every schema object that lists `properties`.
fn close_objects(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if map.get("properties").is_some_and(Value::is_object)
                && !map.contains_key("additionalProperties")
            {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            for (_, child) in map.iter_mut() {
                close_objects(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

/// The spec's path template that matches a concrete path (literal segments preferred
/// over `{param}` segments), if any.
fn template_for(path: &str) -> Option<&'static str> {
    let segs: Vec<&str> = path.split('/').collect();
    let paths = spec()["paths"].as_object()?;
    paths
        .keys()
        .filter_map(|tpl| {
            let t: Vec<&str> = tpl.split('/').collect();
            if t.len() != segs.len() {
                return None;
            }
            let mut params = 0;
            for (a, b) in t.iter().zip(&segs) {
                if a.starts_with('{') && a.ends_with('}') && !b.is_empty() {
                    params += 1;
                } else if a != b {
                    return None;
                }
            }
            Some((params, tpl.as_str()))
        })
        .min()
        .map(|(_, tpl)| tpl)
}

/// A compiled validator per (path template, method, status, content type).
fn validator(key: &str, schema: &Value) -> std::sync::Arc<jsonschema::Validator> {
    static CACHE: OnceLock<Mutex<HashMap<String, std::sync::Arc<jsonschema::Validator>>>> =
        OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(v) = cache.lock().unwrap().get(key) {
        return v.clone();
    }
    // The response schema with the spec's components beside it, so that
    // `#/components/schemas/X` resolves inside this document.
    let doc = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "components": spec()["components"],
        "allOf": [schema],
    });
    let v = std::sync::Arc::new(
        jsonschema::draft202012::new(&doc)
            .unwrap_or_else(|e| panic!("spec schema for {key} does not compile: {e}")),
    );
    cache.lock().unwrap().insert(key.to_string(), v.clone());
    v
}

/// Panics when a response is not what the spec says `method path` answers.
/// `path` may carry a query string; `content_type` is the response header.
pub fn check_response(
    method: &str,
    path: &str,
    status: u16,
    content_type: Option<&str>,
    body: &str,
) {
    let path_only = path.split('?').next().unwrap_or(path);
    let Some(tpl) = template_for(path_only) else {
        return;
    };
    let method_lc = method.to_ascii_lowercase();
    let Some(op) = spec()["paths"][tpl].get(&method_lc) else {
        return;
    };
    let what = format!("{method} {path} -> {status}");
    let responses = &op["responses"];
    let Some(resp) = responses
        .get(status.to_string())
        .or_else(|| responses.get("default"))
    else {
        let documented: Vec<&String> = responses
            .as_object()
            .map(|m| m.keys().collect())
            .unwrap_or_default();
        panic!(
            "OpenAPI drift: {what} is not documented for {method} {tpl} \
             (documented: {documented:?}); body: {body}"
        );
    };
    let content = resp.get("content").and_then(Value::as_object);
    if body.is_empty() {
        assert!(
            content.is_none_or(|c| c.is_empty()),
            "OpenAPI drift: {what} has an empty body but the spec declares content {:?}",
            content.map(|c| c.keys().collect::<Vec<_>>())
        );
        return;
    }
    let Some(content) = content else {
        panic!("OpenAPI drift: {what} has a body but the spec declares none; body: {body}");
    };
    let ct = content_type
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let Some(media) = content.get(&ct) else {
        panic!(
            "OpenAPI drift: {what} answered Content-Type {ct:?}, the spec declares {:?}",
            content.keys().collect::<Vec<_>>()
        );
    };
    let Some(schema) = media.get("schema") else {
        return;
    };
    assert!(
        ct.ends_with("json"),
        "OpenAPI drift: {what} has a schema for non-JSON content {ct:?}"
    );
    let instance: Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("OpenAPI drift: {what} body is not JSON ({e}): {body}"));
    let v = validator(&format!("{method_lc} {tpl} {status} {ct}"), schema);
    let errors: Vec<String> = v
        .iter_errors(&instance)
        .map(|e| format!("at {:?}: {e}", e.instance_path().as_str()))
        .collect();
    assert!(
        errors.is_empty(),
        "OpenAPI drift: {what} does not match the committed spec:\n  {}\nbody: {body}",
        errors.join("\n  ")
    );
}
