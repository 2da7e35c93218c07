//! Successful answers of handlers, rendered one way: [`ok`] for a view serialized now, and
//! [`respond`] for bytes already rendered (the writes, whose live answer and stored idempotent
//! replay are one rendering). Errors are [`crate::error::ApiError`]'s to render.

use actix_web::HttpResponse;
use serde::Serialize;

use crate::error::ApiError;

/// A 200 JSON response.
pub fn ok<T: Serialize>(body: &T) -> Result<HttpResponse, ApiError> {
    let bytes = serde_json::to_vec(body).map_err(ApiError::internal)?;
    Ok(HttpResponse::Ok().content_type("application/json").body(bytes))
}

/// A response of already rendered bytes: JSON when there is a body, none otherwise (204).
/// Writes answer this way, so a stored idempotent response and the original are one rendering.
pub fn respond(status: u16, body: Vec<u8>) -> HttpResponse {
    let status = actix_web::http::StatusCode::from_u16(status)
        .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR);
    if body.is_empty() {
        HttpResponse::build(status).finish()
    } else {
        HttpResponse::build(status).content_type("application/json").body(body)
    }
}
