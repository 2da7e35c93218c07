//! `GET /openapi.json` and `GET /docs`: the contract and its interactive reference, served
//! under `/api/v1` beside the routes (registered by [`crate::server`]). This module sits above
//! [`crate::openapi`], which collects the routes' operations, so it is not one of them.
//!
//! # Access
//!
//! Both are public: no handler here takes the [`crate::auth::Caller`] extractor, so no key is
//! needed. They still pass through [`crate::middleware::request_context`] like every request under
//! `/api/`, so they carry `X-Request-Id` and the rate-limit headers, and they count against the
//! limit: the key's when a usable key is sent, otherwise the client IP's (docs/spec/decisions.md
//! §9: every endpoint, every status). A view of the reference is five requests (page, stylesheet,
//! bundle, initializer, document), far below the 600 a minute, and no path under `/api/` is left
//! unthrottled for anonymous clients.
//!
//! # Assets
//!
//! Swagger UI is vendored in `assets/swagger-ui/` (its README names the upstream version and
//! checksums) and compiled into the binary, so the reference works with no internet access:
//! the page loads nothing but the files below and `/api/v1/openapi.json`. An unknown file
//! under `/docs/` is the usual 404 envelope.

use std::sync::OnceLock;

use actix_web::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use actix_web::{web, HttpRequest, HttpResponse};

use crate::error::ApiError;
use crate::routing::{read, resource};

/// A vendored file: its name under `/docs/`, its media type and its bytes.
struct Asset {
    name: &'static str,
    media_type: &'static str,
    bytes: &'static [u8],
}

macro_rules! asset {
    ($name:literal, $media_type:literal) => {
        Asset {
            name: $name,
            media_type: $media_type,
            bytes: include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/assets/swagger-ui/",
                $name
            )),
        }
    };
}

/// Every file the page references, and nothing else.
const ASSETS: [Asset; 4] = [
    asset!("swagger-ui.css", "text/css; charset=utf-8"),
    asset!("swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
    asset!("swagger-initializer.js", "text/javascript; charset=utf-8"),
    asset!("favicon-32x32.png", "image/png"),
];

/// The page: Swagger UI pointed at `/api/v1/openapi.json`.
const PAGE: &[u8] =
    include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/assets/swagger-ui/index.html"));

/// Register the document and the reference (paths relative to `/api/v1`).
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/openapi.json").route(read().to(get_openapi)))
        .service(resource("/docs").route(read().to(get_docs)))
        .service(resource("/docs/").route(read().to(get_docs)))
        .service(resource("/docs/{file}").route(read().to(get_docs_asset)));
}

/// The OpenAPI document, rendered once.
pub async fn get_openapi() -> Result<HttpResponse, ApiError> {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    let bytes =
        BYTES.get_or_init(|| serde_json::to_vec(crate::openapi::document()).unwrap_or_default());
    Ok(HttpResponse::Ok()
        .insert_header((CONTENT_TYPE, "application/json"))
        // Revalidate: a new build may serve a new contract at the same address.
        .insert_header((CACHE_CONTROL, "no-cache"))
        .body(bytes.as_slice()))
}

/// The reference page.
pub async fn get_docs() -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((CONTENT_TYPE, "text/html; charset=utf-8"))
        .insert_header((CACHE_CONTROL, "no-cache"))
        .body(PAGE)
}

/// A vendored file of the reference page.
pub async fn get_docs_asset(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let name = req.match_info().get("file").unwrap_or_default();
    let asset = ASSETS
        .iter()
        .find(|a| a.name == name)
        .ok_or_else(|| ApiError::not_found("Documentation file"))?;
    Ok(HttpResponse::Ok()
        .insert_header((CONTENT_TYPE, asset.media_type))
        .insert_header((CACHE_CONTROL, "no-cache"))
        .body(asset.bytes))
}
