//! The two applications, each a listener's routes behind the same middleware: the public API
//! and the admin API. The listeners serve them, and a cluster leader runs the requests other
//! nodes forward to it through them in process ([`crate::forward`]), so a forwarded request is
//! authenticated, limited, logged and answered exactly as one sent to it directly.
//!
//! An application is [`application`] over one of the route tables, [`public`] or [`admin`].

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::middleware::{from_fn, Compress};
use actix_web::{web, App, Error};

use crate::auth::AdminToken;
use crate::compression;
use crate::middleware::request_context;
use crate::routing::no_route;
use crate::state::AppState;

/// The middleware every request meets, around `routes`.
pub fn application(
    routes: impl FnOnce(&mut web::ServiceConfig),
) -> App<
    impl ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<impl MessageBody>,
        Error = Error,
        InitError = (),
    >,
> {
    App::new()
        .wrap(from_fn(request_context))
        .wrap(from_fn(compression::keep_small_plain))
        .wrap(Compress::default())
        .wrap(from_fn(compression::negotiate))
        .configure(routes)
}

/// The public API under `/api/v1`, and its document.
pub fn public(state: web::Data<AppState>) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg| {
        cfg.app_data(state)
            .service(
                web::scope("/api/v1")
                    .configure(crate::routes::configure)
                    .configure(crate::docs::configure),
            )
            .default_service(web::to(no_route));
    }
}

/// The admin API, behind the admin token.
pub fn admin(
    state: web::Data<AppState>,
    token: web::Data<AdminToken>,
) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg| {
        cfg.app_data(state).app_data(token).configure(crate::routes::admin::configure);
    }
}
