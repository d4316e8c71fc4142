//! The OpenAPI document, generated from the handlers and types by utoipa. The committed
//! copy is openapi/openapi.json (`cargo run -- openapi > openapi/openapi.json`); a test
//! fails when it drifts.

use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{admin, health, models, private_gd, problem, ratings, recommend, users};

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let c = openapi.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "api_key",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        c.add_security_scheme(
            "x_api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-Api-Key"))),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "dprec",
        description = "Privacy-budgeted recommendation service. Every release is charged to a \
            per-rating eps_ij ledger and a per-user Renyi-DP ledger before it is served. Errors \
            are RFC 7807 problem+json. Roles: reader < writer < admin.",
        version = "1"
    ),
    paths(
        ratings::ingest, ratings::delete_rating,
        users::get_settings, users::put_settings, users::delete_user, users::audit,
        recommend::recommendations, recommend::similar,
        models::list, models::current, models::item_profiles, models::user_profile,
        admin::retrain, admin::job,
        private_gd::round, private_gd::report, private_gd::advance,
        health::healthz, health::readyz, health::metrics, health::openapi_json, health::docs,
    ),
    components(schemas(problem::Problem)),
    modifiers(&Security),
    tags(
        (name = "ratings", description = "Ingestion and deletion of ratings"),
        (name = "users", description = "Privacy settings, deletion and the budget audit"),
        (name = "recommendations", description = "Top-N and similar items from the served model"),
        (name = "models", description = "Releases and published DP profiles"),
        (name = "admin", description = "Retraining"),
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
