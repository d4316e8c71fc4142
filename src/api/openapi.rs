//! The OpenAPI document, generated from the handlers and types by utoipa. The committed
//! copy is openapi/openapi.json (`cargo run -- openapi > openapi/openapi.json`); a test
//! fails when it drifts.

use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use super::{
    admin, health, items, models, pages, predict, private_gd, problem, ratings, recommend, users,
};

struct Security;

/// The key scopes (DESIGN 6), as the security scheme's description.
const KEY_SCOPES: &str = "API key as `Authorization: Bearer KEY` (or the X-Api-Key header). \
Roles, lowest first: `public` (the published DP model, the release list and the item \
catalogue only: /v1/models*, /v1/items, similar items; no recommendations, no audit, no user \
profile), `user` (a token bound to one \
user id: that user's recommendations, budget audit, settings and published profile, 403 \
for any other user; plus what `public` reads), `reader` (service reader, the curator's \
backend: every read for every user), `writer` (reader plus ingestion, deletion, \
settings and item registration), `admin` (everything, including retrains, jobs, key management and the \
data-dependent /metrics). Admins create keys with POST /v1/admin/keys (or `dprec keys \
create --role ROLE [--user ID]`); only the key's SHA-256 is stored. Each operation's \
description ends with the keys it accepts.";

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let c = openapi.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "api_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(KEY_SCOPES))
                    .build(),
            ),
        );
        c.add_security_scheme(
            "x_api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-Api-Key",
                "The same keys as `api_key`, in the X-Api-Key header.",
            ))),
        );
    }
}

/// The errors every operation of a kind can answer, added to each operation that does not
/// document them itself, so a new endpoint cannot forget them (a generated client then
/// decodes them as `Problem` instead of raising on an unexpected status):
/// - with a security requirement: 401 (no or unknown key) and 403 (role too low);
/// - with path or query parameters: 422 (a parameter fails to parse or is out of range);
/// - with a JSON request body: 400, 413, 415 and 422 (see `json_body`);
/// - under `/v1`: 500 (store or internal error).
struct StandardErrors;

fn problem_response(description: &str) -> RefOr<utoipa::openapi::Response> {
    RefOr::T(
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/problem+json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("Problem")))
                    .build(),
            )
            .build(),
    )
}

fn add_standard_errors(path: &str, op: &mut Operation) {
    let mut wanted: Vec<(&str, &str)> = Vec::new();
    if op.security.as_ref().is_some_and(|s| !s.is_empty()) {
        wanted.push(("401", "No API key, or an unknown one"));
        wanted.push((
            "403",
            "The key may not call this operation: its role is too low (public < user < \
             reader < writer < admin; a metrics key reads /metrics only), or it is a user \
             token for another user",
        ));
    }
    if op.parameters.as_ref().is_some_and(|p| !p.is_empty()) {
        wanted.push((
            "422",
            "Invalid path or query parameter (the problem's `field` names it)",
        ));
    }
    if op.request_body.is_some() {
        wanted.push(("400", "Malformed JSON"));
        wanted.push(("413", "Body too large"));
        wanted.push(("415", "Content-Type is not application/json"));
        wanted.push((
            "422",
            "Invalid field (the problem's `field` is its JSON path)",
        ));
    }
    if path.starts_with("/v1/") {
        wanted.push(("500", "Store or internal error"));
    }
    for (status, description) in wanted {
        op.responses
            .responses
            .entry(status.to_string())
            .or_insert_with(|| problem_response(description));
    }
}

/// Operations whose JSON body may be left out (the handler then takes the defaults).
/// utoipa marks a body required unless its type is an `Option`, and an `Option` type
/// makes the schema `oneOf [null, ...]`, which openapi-python-client 0.29.1 turns into a
/// call that cannot be made without a body (it JSON-encodes its `UNSET` marker): so the
/// handler declares the plain type and this marks the body optional.
const OPTIONAL_BODIES: [(&str, &str); 3] = [
    ("/v1/admin/retrain", "post"),
    ("/v1/users/{user}/receipt/links", "post"),
    ("/v1/admin/overview/links", "post"),
];

struct OptionalBodies;

impl Modify for OptionalBodies {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for (path, method) in OPTIONAL_BODIES {
            let op = openapi
                .paths
                .paths
                .get_mut(path)
                .and_then(|item| match method {
                    "post" => item.post.as_mut(),
                    "put" => item.put.as_mut(),
                    _ => None,
                });
            let body = op.and_then(|op| op.request_body.as_mut());
            let body = body.unwrap_or_else(|| panic!("{method} {path} has no request body"));
            body.required = Some(utoipa::openapi::Required::False);
        }
    }
}

impl Modify for StandardErrors {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for (path, item) in openapi.paths.paths.iter_mut() {
            for (method, op) in [
                ("get", &mut item.get),
                ("put", &mut item.put),
                ("post", &mut item.post),
                ("delete", &mut item.delete),
                ("patch", &mut item.patch),
            ] {
                let Some(op) = op else { continue };
                add_standard_errors(path, op);
                if let Some(keys) = super::auth::route_scope(path, method) {
                    let d = op.description.get_or_insert_with(String::new);
                    if !d.is_empty() {
                        d.push_str("\n\n");
                    }
                    d.push_str(&format!("Keys: {keys}."));
                }
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "dprec",
        description = "Privacy-budgeted recommendation service. Every release is charged to a \
            per-rating eps_ij ledger and a per-user Renyi-DP ledger before it is served (a \
            release labelled `\"guarantee\": \"rating-level\"`, an operator opt-in, only to the \
            per-rating ledger; the user's audit shows its group-privacy bound). Errors \
            are RFC 7807 problem+json. Key roles: public < user < reader < writer < admin \
            (see the `api_key` security scheme), and `metrics`, a Prometheus scraper's token \
            that reads the full /metrics and nothing else.",
        version = "1"
    ),
    paths(
        ratings::ingest, ratings::delete_rating,
        users::get_settings, users::put_settings, users::delete_user, users::audit,
        items::register, items::list,
        recommend::recommendations, recommend::similar, predict::predictions,
        models::list, models::current, models::item_profiles, models::user_profile,
        admin::retrain, admin::job, admin::create_key, admin::list_keys, admin::revoke_key,
        private_gd::round, private_gd::report, private_gd::advance,
        health::root, health::healthz, health::readyz, health::metrics, health::openapi_json, health::docs,
        pages::receipt, pages::receipt_link, pages::overview, pages::overview_link,
    ),
    components(schemas(problem::Problem, users::RatingSort)),
    modifiers(&Security, &StandardErrors, &OptionalBodies),
    tags(
        (name = "ratings", description = "Ingestion and deletion of ratings"),
        (name = "recommendations", description = "Top-N and similar items from the served model"),
        (name = "users", description = "Privacy settings, deletion and the budget audit"),
        (name = "pages", description = "HTML pages for a browser: a user's privacy receipt and the operator overview, and the signed links that open them"),
        (name = "items", description = "The public item catalogue: registered by writers or `dprec import`, never created by ratings"),
        (name = "models", description = "Releases and published DP profiles"),
        (name = "admin", description = "Retraining and API keys"),
        (name = "private-gd", description = "Private-GD / GD-DR rounds: user-level LDP one-bit gradient reports"),
        (name = "ops", description = "Probes, metrics and documentation"),
    )
)]
pub struct ApiDoc;

/// The spec as pretty JSON with a trailing newline (what `dprec openapi` prints).
pub fn spec_json() -> String {
    let mut s = ApiDoc::openapi()
        .to_pretty_json()
        .expect("OpenAPI serialises");
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The retrain body is optional and a plain object (no `null` alternative): a client
    /// generated from the spec can call it with no body (issue 11, generated client).
    #[test]
    fn retrain_body_is_optional_and_not_nullable() {
        let spec: serde_json::Value = serde_json::from_str(&spec_json()).unwrap();
        let body = &spec["paths"]["/v1/admin/retrain"]["post"]["requestBody"];
        assert_ne!(body["required"], serde_json::json!(true), "{body}");
        let schema = &body["content"]["application/json"]["schema"];
        assert_eq!(
            schema,
            &serde_json::json!({"$ref": "#/components/schemas/RetrainRequest"})
        );
    }

    /// Every `$ref` in the document names a schema it defines: an unresolved one (the
    /// receipt's `sort` parameter once referred to an unregistered `RatingSort`) makes
    /// openapi-python-client skip the operation and leaves the docs page a dangling name.
    #[test]
    fn every_ref_resolves() {
        fn refs(v: &serde_json::Value, out: &mut Vec<String>) {
            match v {
                serde_json::Value::Object(m) => {
                    if let Some(serde_json::Value::String(r)) = m.get("$ref") {
                        out.push(r.clone());
                    }
                    m.values().for_each(|v| refs(v, out));
                }
                serde_json::Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
                _ => {}
            }
        }
        let spec: serde_json::Value = serde_json::from_str(&spec_json()).unwrap();
        let mut all = Vec::new();
        refs(&spec, &mut all);
        assert!(!all.is_empty());
        for r in all {
            let name = r
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("{r} is not a local schema"));
            assert!(
                spec["components"]["schemas"].get(name).is_some(),
                "{r} names no schema of the document"
            );
        }
    }

    /// Every operation that needs a key says which keys (auth::ROUTE_SCOPES), and every
    /// entry of the table is an operation.
    #[test]
    fn every_secured_operation_lists_its_keys() {
        let doc = ApiDoc::openapi();
        let mut secured = Vec::new();
        for (path, item) in &doc.paths.paths {
            for (method, op) in [
                ("get", &item.get),
                ("put", &item.put),
                ("post", &item.post),
                ("delete", &item.delete),
                ("patch", &item.patch),
            ] {
                if let Some(op) = op {
                    if op.security.as_ref().is_some_and(|s| !s.is_empty()) {
                        assert!(
                            op.description
                                .as_deref()
                                .is_some_and(|d| d.contains("Keys: ")),
                            "{method} {path} does not list its keys (add it to auth::ROUTE_SCOPES)"
                        );
                        secured.push((path.clone(), method));
                    }
                }
            }
        }
        for (p, m, _) in crate::api::auth::ROUTE_SCOPES {
            assert!(
                secured.iter().any(|(sp, sm)| sp.as_str() == *p && sm == m),
                "ROUTE_SCOPES lists {m} {p}, which is not a secured operation"
            );
        }
    }
}
