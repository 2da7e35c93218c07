//! The building blocks of both APIs' route tables: a [`resource`] whose unknown methods are the
//! 404 envelope and whose handler panics are 500s, a [`read`] route that answers `GET` and
//! `HEAD` alike, and [`no_route`], the 404 of an unknown route or method (docs/spec/decisions.md §9).

use actix_web::{web, HttpResponse};

use crate::error::{ApiError, Code};

/// A read route: `GET`, and `HEAD` answered by the same handler. HTTP asks every server to
/// answer `HEAD` wherever it answers `GET`; the HTTP layer sends a `HEAD` response's status and
/// headers (request id, rate limit, `Content-Length`) and drops its body.
pub fn read() -> actix_web::Route {
    web::route().guard(actix_web::guard::Any(actix_web::guard::Get()).or(actix_web::guard::Head()))
}

/// Unknown route or method.
pub async fn no_route() -> Result<HttpResponse, ApiError> {
    Err(ApiError::new(Code::NotFound, "No such route."))
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
