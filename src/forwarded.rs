//! Answering requests other nodes forward to this one (docs/spec/cluster.md, "Where a request
//! is served"): the leader runs a forwarded request through the application its listener
//! serves, in process, so it is authenticated, limited, logged and answered exactly as a
//! request sent to it directly. Sending a request on is [`crate::forward`]'s.
//!
//! The connections forwarded requests arrive on are served here too, on the actix thread that
//! runs them: each request is read, run and answered on one thread (the cluster link hands
//! such a connection over after its first request, `cluster::net::ForwardedConnection`).
//!
//! Apart from `forward` so that the middleware, which forwards, and the applications, which
//! this runs, do not import each other.

use std::rc::Rc;

use actix_http::Request;
use actix_service::{IntoServiceFactory, Service, ServiceFactory};
use actix_web::body::{to_bytes_limited, MessageBody};
use actix_web::dev::{AppConfig, Payload, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::http::{Method, StatusCode, Uri};
use actix_web::web;
use actors::replica::{ClusterDomain, Forwarded, ForwardedConnection, ForwardedReply};
use tokio::sync::mpsc;

use crate::auth::AdminToken;
use crate::forward::{relayed, FORWARDED_FROM};
use crate::state::AppState;

/// The largest answer a leader relays back: the link's default frame cap.
const FORWARDED_ANSWER_MAX: usize = 64 << 20;

/// Makes this node answer requests forwarded to it, through its public application (its
/// admin application, for an admin request) run in process on the current actix thread: the
/// request is not sent through this node's own listener again. The connections they arrive
/// on are served on this thread too.
pub fn serve_forwarded(
    cluster: &ClusterDomain,
    state: web::Data<AppState>,
    admin_token: web::Data<AdminToken>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<ForwardedConnection>();
    actix_rt::spawn(async move {
        let apps = async {
            use crate::apps::{admin, application, public};
            let public = application(public(state.clone())).into_factory();
            let admin = application(admin(state, admin_token)).into_factory();
            Ok::<_, ()>((
                public.new_service(AppConfig::default()).await?,
                admin.new_service(AppConfig::default()).await?,
            ))
        };
        let Ok((public, admin)) = apps.await else {
            tracing::error!("cannot build the applications forwarded requests run through");
            return;
        };
        let (public, admin) = (Rc::new(public), Rc::new(admin));
        while let Some(connection) = rx.recv().await {
            let (public, admin) = (public.clone(), admin.clone());
            // A connection's requests come one at a time; each connection is a task.
            actix_rt::spawn(connection.serve(move |request: Forwarded| {
                let (public, admin) = (public.clone(), admin.clone());
                async move {
                    if request.path.starts_with("/admin/") {
                        run_locally(&*admin, request).await
                    } else {
                        run_locally(&*public, request).await
                    }
                }
            }));
        }
    });
    cluster.set_forward_taker(std::sync::Arc::new(move |connection| {
        // The thread is gone only when the node stops: the connection closes with it.
        let _ = tx.send(connection);
    }));
}

/// An answer made here rather than by the listener.
fn failure(status: StatusCode, why: &str) -> ForwardedReply {
    let body = serde_json::json!({
        "errorCode": "cluster_unavailable",
        "message": format!("The leader could not run the forwarded request: {why}."),
        "detail": {"outcome": "unknown", "leaderId": null},
        "requestId": crate::middleware::new_request_id(),
    });
    ForwardedReply {
        status: status.as_u16(),
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: body.to_string().into(),
    }
}

/// Runs a forwarded request through `app`, as its listener would.
async fn run_locally<S, B>(app: &S, request: Forwarded) -> ForwardedReply
where
    S: Service<Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody,
{
    let Ok(method) = Method::from_bytes(request.method.as_bytes()) else {
        return failure(StatusCode::BAD_REQUEST, "an unknown method");
    };
    let Ok(uri) = request.path.parse::<Uri>() else {
        return failure(StatusCode::BAD_REQUEST, "an unreadable path");
    };
    let mut req = Request::with_payload(Payload::from(request.body));
    let head = req.head_mut();
    head.method = method;
    head.uri = uri;
    for (name, value) in &request.headers {
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_bytes(value))
        {
            head.headers.append(name, value);
        }
    }
    if let Ok(from) = HeaderValue::from_str(&request.from.to_string()) {
        head.headers.insert(HeaderName::from_static(FORWARDED_FROM), from);
    }
    let res = match app.call(req).await {
        Ok(res) => res,
        Err(e) => return failure(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    };
    let status = res.status().as_u16();
    let headers = res
        .headers()
        .iter()
        .filter(|(name, _)| relayed(name.as_str()))
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect();
    // The answer travels back in one link frame (64 MiB by default); a larger one fails its
    // forward there, so it is not held here beyond that.
    // A page is one buffer already: taken as it is, not gathered and copied again.
    let body = match res.into_body().try_into_bytes() {
        Ok(body) => Ok(Ok(body)),
        Err(body) => to_bytes_limited(body, FORWARDED_ANSWER_MAX).await,
    };
    let body = match body {
        Ok(Ok(body)) => body,
        Ok(Err(e)) => return failure(StatusCode::SERVICE_UNAVAILABLE, &e.into().to_string()),
        Err(_) => return failure(StatusCode::SERVICE_UNAVAILABLE, "the answer is too large"),
    };
    ForwardedReply { status, headers, body }
}
