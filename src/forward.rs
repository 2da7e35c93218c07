//! Forwarding on a cluster node (docs/spec/cluster.md, "Where a request is served"): a node
//! that does not serve from its own state sends a public request on to the leader over the
//! cluster link (one hop) and relays the answer. The leader's side, running what it is sent,
//! is [`crate::forwarded`]'s.
//!
//! A forwarded request carries `Sheetd-Forwarded-From`; a node never forwards such a request
//! again (one hop, no loops), it answers `503 cluster_unavailable` instead.

use std::time::Duration;

use actix_web::dev::ServiceRequest;
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::http::{Method, StatusCode};
use actix_web::{HttpMessage, HttpResponse};
use actors::error::ClusterOutcome;
use actors::replica::{ClusterDomain, ForwardError, Forwarded};
use futures_util::StreamExt;

use crate::error::{cluster_unavailable, ApiError, Code};

/// The header that marks a forwarded request, naming the node that received it.
pub const FORWARDED_FROM: &str = "sheetd-forwarded-from";

/// How long a follower waits for the leader's answer: a long poll of the change feed waits up
/// to 30 s on the leader.
const FORWARD_TTL: Duration = Duration::from_secs(45);

/// Headers of one connection, not of the request or answer: never relayed.
const HOP_BY_HOP: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
];

pub(crate) fn relayed(name: &str) -> bool {
    !HOP_BY_HOP.contains(&name) && name != "date"
}

/// Whether `req` may be forwarded (it was not forwarded to this node already).
pub fn may_forward(req: &ServiceRequest) -> bool {
    !req.headers().contains_key(FORWARDED_FROM)
}

/// Sends `req` on to the leader and builds the answer to relay, or the `503` to give.
pub async fn to_leader(
    cluster: &ClusterDomain,
    req: &mut ServiceRequest,
    max_body_bytes: usize,
) -> Result<HttpResponse, ApiError> {
    let mut body = Vec::new();
    let mut payload = req.take_payload();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|_| {
            ApiError::validation(
                vec![serde_json::json!("body")],
                "the request body could not be read",
                "value_error",
            )
        })?;
        // The leader counts the decompressed bytes; this only bounds what a follower holds.
        if body.len() + chunk.len() > max_body_bytes {
            return Err(ApiError::new(Code::PayloadTooLarge, "The request body is too large."));
        }
        body.extend_from_slice(&chunk);
    }
    relay(cluster, req.request(), body).await
}

/// Sends an admin request on to the leader (a membership change reaching a follower) and
/// builds the answer to relay; `None` when it was forwarded to this node already (one hop).
pub async fn admin_to_leader(
    cluster: &ClusterDomain,
    req: &actix_web::HttpRequest,
    body: Vec<u8>,
) -> Option<Result<HttpResponse, ApiError>> {
    if req.headers().contains_key(FORWARDED_FROM) {
        return None;
    }
    Some(relay(cluster, req, body).await)
}

/// Sends the request `req` with `body` over the cluster link to the leader.
async fn relay(
    cluster: &ClusterDomain,
    req: &actix_web::HttpRequest,
    body: Vec<u8>,
) -> Result<HttpResponse, ApiError> {
    let path = req.uri().path_and_query().map_or_else(|| req.path().to_owned(), |p| p.to_string());
    let headers = req
        .headers()
        .iter()
        .filter(|(name, _)| relayed(name.as_str()))
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect();
    let write = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    let request = Forwarded {
        from: cluster.node_id(),
        method: req.method().to_string(),
        path,
        headers,
        body,
    };
    match cluster.forward(request, FORWARD_TTL).await {
        Ok((leader, reply)) => {
            let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::BAD_GATEWAY);
            let mut res = HttpResponse::build(status);
            for (name, value) in reply.headers {
                if let (Ok(name), Ok(value)) =
                    (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_bytes(&value))
                {
                    res.append_header((name, value));
                }
            }
            res.insert_header(("sheetd-served-by", leader.to_string()));
            Ok(res.body(reply.body))
        }
        Err(ForwardError::NotSent { reason, .. }) => Err(cluster_unavailable(
            ClusterOutcome::NotApplied,
            None,
            &format!("The leader could not be reached: {reason}."),
        )),
        Err(ForwardError::NoAnswer { target, reason }) => {
            let outcome = if write { ClusterOutcome::Unknown } else { ClusterOutcome::NotApplied };
            Err(cluster_unavailable(
                outcome,
                Some(target),
                &format!("The leader did not answer: {reason}."),
            ))
        }
    }
}
