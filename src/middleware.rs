//! The request middleware: one place for what every request gets.
//!
//! In order: a request id; on the public API, where it is answered from (on a cluster node:
//! this node's state, a local read's applied state, or the leader it is forwarded to), the
//! caller's key resolved once and the rate limit checked (429 before any handler runs); the
//! handler, with a panic caught and turned into a 500 envelope; every error response rendered
//! as the envelope with the request id; the `X-Request-Id` and rate-limit headers; one log line
//! with request id, key id (never the secret), route, status and latency.

use std::panic::AssertUnwindSafe;
use std::time::Instant;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::http::{Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage};
use futures_util::FutureExt;
use rand::Rng;
use serde_json::json;

use crate::auth::{resolve_key, Authn, LocalRead, RequestId};
use crate::error::{ApiError, Code};
use crate::rate_limit::{Decision, Subject};
use crate::state::AppState;

/// A fresh request id: `req_` and 24 hex digits (96 random bits). Written digit by digit,
/// in half the time `format!` of a padded `u128` took.
pub fn new_request_id() -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits = rand::thread_rng().gen::<u128>() >> 32;
    let mut id = String::with_capacity(28);
    id.push_str("req_");
    for digit in (0..24).rev() {
        id.push(char::from(HEX[(bits >> (4 * digit)) as usize & 15]));
    }
    id
}

/// The envelope for an error the framework produced (not an [`ApiError`]).
fn framework_error(status: StatusCode) -> ApiError {
    match status.as_u16() {
        401 => ApiError::unauthorized(),
        403 => ApiError::new(Code::Forbidden, "Forbidden."),
        404 | 405 => ApiError::new(Code::NotFound, "No such route."),
        413 => ApiError::new(Code::PayloadTooLarge, "The request body is too large."),
        429 => ApiError::new(Code::RateLimitExceeded, "Too many requests."),
        400..=499 => ApiError::validation(
            vec![json!("body")],
            "the request could not be read",
            "value_error",
        ),
        _ => ApiError::internal(format!("framework error with status {status}")),
    }
}

/// The rate-limit headers of every response.
fn rate_headers(d: &Decision) -> [(&'static str, String); 5] {
    [
        ("x-ratelimit-limit", d.limit.to_string()),
        ("x-ratelimit-remaining", d.remaining.to_string()),
        ("x-ratelimit-reset", d.reset.to_string()),
        ("ratelimit-policy", format!("\"default\";q={};w=60", d.limit)),
        ("ratelimit", format!("\"default\";r={};t={}", d.remaining, d.reset_after)),
    ]
}

/// The rate limit's 429.
pub fn too_many(d: &Decision) -> ApiError {
    let wait = d.reset_after.max(1);
    ApiError::new(
        Code::RateLimitExceeded,
        format!("Rate limit of {} requests per minute exceeded; retry in {wait} s.", d.limit),
    )
    .with_detail(json!({"retry_after_seconds": wait}))
    .with_header("retry-after", wait.to_string())
}

/// Run a handler with its panics caught: a panic becomes a 500 envelope and the worker keeps
/// serving. Wrapped around each resource, after routing, because the router needs the request
/// to itself until it has matched.
pub async fn catch_panic(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let http_req = req.request().clone();
    match AssertUnwindSafe(next.call(req)).catch_unwind().await {
        Ok(res) => res.map(ServiceResponse::map_into_boxed_body),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let api = ApiError::internal(format!("handler panicked: {what}"));
            Ok(ServiceResponse::new(http_req, actix_web::HttpResponse::from_error(api)))
        }
    }
}

/// The header a client asks for a local read with (docs/spec/cluster.md, "Local reads").
pub const CONSISTENCY: &str = "sheetd-consistency";

/// The header of a local read's answer: the Raft index of the state it was read from.
pub const APPLIED_INDEX: &str = "sheetd-applied-index";

/// Whether the request is a read to answer locally: `Sheetd-Consistency: local` on a `GET` or
/// `HEAD`, except webhooks (their delivery state is the leader's). `linearizable`, the default,
/// or `local` on a write (which always runs on the leader) is not.
///
/// # Errors
/// Any other value of the header: 422.
fn local_read(req: &ServiceRequest) -> Result<bool, ApiError> {
    let Some(value) = req.headers().get(CONSISTENCY) else { return Ok(false) };
    let value = value.to_str().unwrap_or_default().trim();
    let local = if value.eq_ignore_ascii_case("local") {
        true
    } else if value.eq_ignore_ascii_case("linearizable") {
        false
    } else {
        return Err(ApiError::validation(
            vec![json!("header"), json!("Sheetd-Consistency")],
            format!("`Sheetd-Consistency` is `local` or `linearizable`, got `{value}`"),
            "value_error",
        ));
    };
    let read = matches!(*req.method(), Method::GET | Method::HEAD);
    Ok(local && read && !req.path().starts_with("/api/v1/webhooks"))
}

/// Whether an admin request on a node without the domain goes to the leader. Health, metrics
/// and the cluster's own routes answer on every node (a membership change forwards itself);
/// a backup is streamed by the leader, larger than a forwarded answer may be, and says so.
fn forwarded_admin(path: &str) -> bool {
    const ON_EVERY_NODE: [&str; 4] =
        ["/admin/v1/health", "/admin/v1/metrics", "/admin/v1/cluster", "/admin/v1/backup"];
    path.starts_with("/admin/v1/") && !ON_EVERY_NODE.iter().any(|p| path.starts_with(p))
}

/// The request middleware. Requests under `/api/` are keyed and rate limited; the admin
/// listener's are not.
pub async fn request_context(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let started = Instant::now();
    let request_id = new_request_id();
    req.extensions_mut().insert(RequestId(request_id.clone()));
    let state = req.app_data::<web::Data<AppState>>().cloned();
    let public = req.path().starts_with("/api/");
    let mut decision = None;
    let mut key_id = None;
    let mut refused = None;
    let mut invalid = None;
    let mut applied_index = None;
    // A cluster node that does not serve from its own state answers every public request so.
    let reads = match (&state, public) {
        (Some(state), true) => {
            // A header value it does not know is answered 422 once the key and the rate
            // limit are decided, as any other bad input is; the read is not local meanwhile.
            let local = local_read(&req).unwrap_or_else(|e| {
                invalid = Some(e);
                false
            });
            match state.answer_from(local).await {
                Some((reads, applied)) => {
                    if local {
                        req.extensions_mut().insert(LocalRead);
                        applied_index = applied;
                    }
                    Some(reads)
                }
                None => {
                    refused = Some(state.not_serving());
                    None
                }
            }
        }
        // An admin request that needs the domain, on a cluster node without it: sent on to
        // the leader like a public one (docs/spec/cluster.md, "Membership": the admin API on
        // any node, forwarded to the leader).
        (Some(state), false)
            if state.cluster.is_some()
                && forwarded_admin(req.path())
                && state.try_service().is_none() =>
        {
            refused = Some(state.not_serving());
            None
        }
        _ => None,
    };
    if let (Some(state), Some(reads)) = (&state, reads) {
        let now = reads.now();
        let directory = reads.directory();
        let header = req.headers().get("authorization").and_then(|v| v.to_str().ok());
        let key = resolve_key(header, &directory, now);
        key_id = key.as_ref().map(|k| k.id);
        let subject = match &key {
            Some(k) => Subject::Key(k.id),
            None => Subject::Ip(
                req.peer_addr().map_or(std::net::Ipv4Addr::LOCALHOST.into(), |a| a.ip()),
            ),
        };
        let d = state.limiter.check(subject, now);
        decision = Some(d);
        req.extensions_mut().insert(d);
        req.extensions_mut().insert(Authn { key, directory });
    }
    let mut res = match (refused, decision) {
        (Some(e), _) => {
            // A cluster node that does not serve sends the request on to the leader, once (a
            // removed node, no longer a member, says so instead).
            let cluster = state.as_ref().and_then(|s| s.cluster.clone());
            match cluster.filter(|c| crate::forward::may_forward(&req) && !c.removed()) {
                Some(cluster) => {
                    let max = state.as_ref().map_or(0, |s| s.max_body_bytes);
                    let mut req = req;
                    match crate::forward::to_leader(&cluster, &mut req, max).await {
                        Ok(relayed) => req.into_response(relayed),
                        Err(e) => req.into_response(e.response(&request_id)),
                    }
                }
                None => req.into_response(e.response(&request_id)),
            }
        }
        (None, Some(d)) if !d.allowed => req.into_response(too_many(&d).response(&request_id)),
        // A request without a valid key gets its 401 from the handler first.
        _ if invalid.is_some() && key_id.is_some() => {
            req.into_response(invalid.take().expect("checked").response(&request_id))
        }
        _ => next.call(req).await?.map_into_boxed_body(),
    };
    if let Some(err) = res.response().error() {
        let api =
            err.as_error::<ApiError>().cloned().unwrap_or_else(|| framework_error(res.status()));
        res = res.into_response(api.response(&request_id));
    }
    let node = state.as_ref().and_then(|s| s.cluster.as_ref()).map(|c| c.node_id());
    let headers = res.headers_mut();
    if let Some(node) = node {
        headers.insert(HeaderName::from_static("sheetd-node"), HeaderValue::from(node));
    }
    if let Some(index) = applied_index {
        headers.insert(HeaderName::from_static(APPLIED_INDEX), HeaderValue::from(index));
    }
    if !headers.contains_key("x-request-id") {
        if let Ok(v) = HeaderValue::from_str(&request_id) {
            headers.insert(HeaderName::from_static("x-request-id"), v);
        }
    }
    if let Some(d) = &decision {
        for (name, value) in rate_headers(d) {
            if let Ok(v) = HeaderValue::from_str(&value) {
                headers.insert(HeaderName::from_static(name), v);
            }
        }
    }
    let status = res.status().as_u16();
    let route = res.request().match_pattern().unwrap_or_else(|| "<unmatched>".into());
    tracing::info!(
        request_id = %res.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or(&request_id),
        key_id = key_id.map_or(-1, |k| k as i64),
        method = %res.request().method(),
        route = %route,
        status,
        latency_ms = started.elapsed().as_secs_f64() * 1000.0,
        "request"
    );
    if let Some(state) = &state {
        state.metrics.observe(&route, status, started.elapsed());
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use actix_web::test as actix_test;
    use actix_web::{middleware::from_fn, web, App, HttpResponse};

    use super::*;

    #[test]
    fn request_ids_are_req_and_24_hex_digits_and_differ() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| new_request_id()).collect();
        assert_eq!(ids.len(), 1000);
        for id in &ids {
            let hex = id.strip_prefix("req_").expect("the prefix");
            assert_eq!(hex.len(), 24, "{id}");
            assert!(hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)), "{id}");
        }
        // Every digit position takes more than one value (none is stuck, e.g. at 0).
        for at in 4..28 {
            let digits: std::collections::HashSet<u8> =
                ids.iter().map(|id| id.as_bytes()[at]).collect();
            assert!(digits.len() > 8, "position {at}: {digits:?}");
        }
    }

    #[test]
    fn rate_headers_say_the_decision() {
        let d = Decision {
            allowed: true,
            limit: 600,
            remaining: 17,
            reset: 1_700_000_060,
            reset_after: 42,
        };
        assert_eq!(
            rate_headers(&d),
            [
                ("x-ratelimit-limit", "600".to_owned()),
                ("x-ratelimit-remaining", "17".to_owned()),
                ("x-ratelimit-reset", "1700000060".to_owned()),
                ("ratelimit-policy", "\"default\";q=600;w=60".to_owned()),
                ("ratelimit", "\"default\";r=17;t=42".to_owned()),
            ]
        );
    }

    async fn boom() -> HttpResponse {
        panic!("a bug in a handler")
    }

    #[actix_web::test]
    async fn a_handler_panic_is_a_500_envelope_and_the_server_keeps_serving() {
        let app = actix_test::init_service(
            App::new()
                .wrap(from_fn(request_context))
                .service(crate::routing::resource("/api/v1/boom").route(web::get().to(boom)))
                .service(
                    crate::routing::resource("/api/v1/fine").route(web::get().to(HttpResponse::Ok)),
                ),
        )
        .await;
        for _ in 0..2 {
            let res = actix_test::call_service(
                &app,
                actix_test::TestRequest::get().uri("/api/v1/boom").to_request(),
            )
            .await;
            assert_eq!(res.status(), 500);
            let rid = res.headers().get("x-request-id").unwrap().to_str().unwrap().to_owned();
            let body: serde_json::Value = actix_test::read_body_json(res).await;
            assert_eq!(body["errorCode"], "internal_error");
            assert_eq!(body["requestId"], rid);
            assert!(
                !body["message"].as_str().unwrap().contains("a bug"),
                "the cause is logged, not sent"
            );
            let ok = actix_test::call_service(
                &app,
                actix_test::TestRequest::get().uri("/api/v1/fine").to_request(),
            )
            .await;
            assert_eq!(ok.status(), 200);
        }
    }
}
