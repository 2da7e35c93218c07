//! The public API's routes under `/api/v1`, one file per resource. Every `GET` route also
//! answers `HEAD` ([`read`]); any other unknown method is the 404 envelope
//! (docs/spec/decisions.md §9).

pub mod admin;
pub mod changes;
pub mod docs;
pub mod export;
pub mod me;
pub mod reports;
pub mod rows;
pub mod sheets;

use actix_web::{web, HttpResponse};
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

/// A read route: `GET`, and `HEAD` answered by the same handler. HTTP asks every server to
/// answer `HEAD` wherever it answers `GET`; the HTTP layer sends a `HEAD` response's status and
/// headers (request id, rate limit, `Content-Length`) and drops its body.
pub fn read() -> actix_web::Route {
    web::route().guard(actix_web::guard::Any(actix_web::guard::Get()).or(actix_web::guard::Head()))
}

/// Unknown route or method under `/api/v1`.
pub async fn no_route() -> Result<HttpResponse, ApiError> {
    Err(ApiError::new(crate::error::Code::NotFound, "No such route."))
}

/// A resource whose unknown methods are 404 envelopes and whose handler panics are 500s.
pub fn resource(
    path: &str,
) -> actix_web::Resource<
    impl actix_web::dev::ServiceFactory<
        actix_web::dev::ServiceRequest,
        Config = (),
        Response = actix_web::dev::ServiceResponse<actix_web::body::BoxBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    web::resource(path)
        .wrap(actix_web::middleware::from_fn(crate::middleware::catch_panic))
        .default_service(web::to(no_route))
}

/// Register every route of the public API.
pub fn configure(cfg: &mut web::ServiceConfig) {
    let resource = crate::routes::resource;
    // actix tries resources in the order they are registered, and a path with a `{segment}`
    // costs one regex run (regex-lite's pike VM) each: with five dynamic routes tried before
    // patchRow's, regex-lite took 5.5 % of the server's CPU in a profile of patches at 64
    // connections. So the static paths (a string compare) come first, then the dynamic ones by
    // how hot they are: single-row reads and writes, pages, bulk writes, then the rest.
    cfg.service(resource("/me").route(read().to(me::get_me)))
        .service(resource("/sheets").route(read().to(sheets::list_sheets)))
        .service(resource("/reports").route(read().to(reports::list_reports)))
        .service(
            resource("/sheets/{sheet_id}/rows/{row_id}")
                .route(read().to(rows::get_row))
                .route(web::patch().to(rows::patch_row))
                .route(web::delete().to(rows::delete_row)),
        )
        .service(resource("/sheets/{sheet_id}/rows").route(read().to(rows::list_rows)))
        .service(
            resource("/sheets/{sheet_id}/rows:bulkAdd").route(web::post().to(rows::bulk_add_rows)),
        )
        .service(
            resource("/sheets/{sheet_id}/rows:bulkUpdate")
                .route(web::post().to(rows::bulk_update_rows)),
        )
        .service(
            resource("/sheets/{sheet_id}/rows:bulkUpsert")
                .route(web::post().to(rows::bulk_upsert_rows)),
        )
        .service(resource("/sheets/{sheet_id}").route(read().to(sheets::get_sheet)))
        .service(resource("/sheets/{sheet_id}/columns").route(read().to(sheets::list_columns)))
        .service(resource("/sheets/{sheet_id}/changes").route(read().to(changes::list_changes)))
        .service(resource("/sheets/{sheet_id}/export").route(read().to(export::export_rows)))
        .service(resource("/reports/{report_id}").route(read().to(reports::get_report)))
        .service(resource("/reports/{report_id}/run").route(web::post().to(reports::run_report)))
        .configure(docs::configure)
        .default_service(web::to(no_route));
}
