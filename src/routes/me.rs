//! `GET /me`: the key's identity, scopes and current rate-limit window.

use actix_web::{HttpMessage, HttpRequest, HttpResponse};

use crate::api_doc as oa;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::rate_limit::Decision;
use crate::response::ok;
use crate::views::{GrantView, MeView, RateLimitView};

/// getMe.
#[utoipa::path(
    get,
    path = "/me",
    operation_id = "getMe",
    tag = "me",
    summary = "The key's identity, scopes and rate-limit window",
    responses(
        (status = 200, description = "The calling key.", body = MeView),
        oa::CommonErrors,
    )
)]
pub async fn get_me(req: HttpRequest, caller: Caller) -> Result<HttpResponse, ApiError> {
    let d: Option<Decision> = req.extensions().get::<Decision>().copied();
    let rate_limit = d.map_or(RateLimitView { limit: 0, remaining: 0, reset: 0 }, |d| {
        RateLimitView { limit: d.limit, remaining: d.remaining, reset: d.reset }
    });
    ok(&MeView {
        key_id: caller.key.id,
        owner_id: caller.key.owner_id,
        scopes: caller.key.grants.iter().map(GrantView::from).collect(),
        rate_limit,
        request_id: caller.request_id,
    })
}
