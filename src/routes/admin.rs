//! The admin listener (`--admin-addr`): stands in for the web application's account settings.
//! Every route needs `Authorization: Bearer <admin token>`, compared in constant time.

use actix_web::{web, HttpRequest, HttpResponse};
use actors::directory::Import;
use actors::fixture::Fixture;
use serde_json::json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::{ApiError, Code};
use crate::input::{json_body, read_body};
use crate::routes::ok;
use crate::server::AppState;

/// Refuse a request without the admin token.
pub fn check_admin(state: &AppState, req: &HttpRequest) -> Result<(), ApiError> {
    let given = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .unwrap_or_default();
    // Compare hashes so the comparison's time does not depend on the token's length either.
    let a = Sha256::digest(given.as_bytes());
    let b = Sha256::digest(state.admin_token.as_bytes());
    if bool::from(a.as_slice().ct_eq(b.as_slice())) {
        Ok(())
    } else {
        Err(ApiError::new(
            Code::Unauthorized,
            "The admin token is required: send `Authorization: Bearer <token>`.",
        ))
    }
}

/// `GET /admin/v1/health`: 200 once recovery is complete (the listener starts after it).
pub async fn health(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    check_admin(&state, &req)?;
    ok(&json!({"status": "ok"}))
}

/// `POST /admin/v1/import`: add a fixture's objects; 422 on an id clash or bad reference.
pub async fn import(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    check_admin(&state, &req)?;
    let body = read_body(&req, payload, state.max_body_bytes).await?;
    let fixture: Fixture = json_body(&body)?;
    let report = state
        .service
        .directory_actor()
        .send(Import(fixture))
        .await
        .map_err(ApiError::internal)??;
    let counts: serde_json::Map<String, serde_json::Value> =
        report.counts.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    // Generated secrets are returned once, here, and never again.
    let keys: Vec<_> = report
        .issued
        .iter()
        .map(|k| json!({"keyId": k.key_id, "name": k.name, "ownerId": k.owner_id, "secret": k.secret}))
        .collect();
    ok(&json!({"imported": counts, "issuedKeys": keys}))
}

/// Register the admin routes.
pub fn configure(cfg: &mut web::ServiceConfig) {
    let resource = crate::routes::resource;
    cfg.service(resource("/admin/v1/health").route(web::get().to(health)))
        .service(resource("/admin/v1/import").route(web::post().to(import)))
        .default_service(web::to(crate::routes::no_route));
}
