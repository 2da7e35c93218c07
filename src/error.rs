//! The one API error type and its envelope.
//!
//! Every 4xx/5xx leaves as `{errorCode, message, detail, requestId}`. Handlers return
//! [`ApiError`]; the request middleware (see [`crate::middleware`]) adds the request id when it
//! renders the body, and turns any other framework error into the envelope too, so there is no
//! path by which a bare error page can leave. [`Code`] is the single table from error code to
//! HTTP status.

use std::fmt;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::{json, Value};

/// Every error code of the API (the 11 of docs/spec/api-v1.md, the three report codes, and
/// those of docs/spec/extensions.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// Missing, malformed, revoked or expired key.
    Unauthorized,
    /// Readable target, no write scope.
    Forbidden,
    /// Missing or out of reach (identical either way).
    NotFound,
    /// 422: a malformed request, or a value the contract refuses (a cell, a grant).
    ValidationFailed,
    /// 409: the write names a row version that is no longer current.
    VersionConflict,
    /// A capacity limit was reached.
    CapacityExceeded,
    /// 429: the key's (or client IP's) rolling minute is used up.
    RateLimitExceeded,
    /// Idempotency key reused for another request.
    IdempotencyKeyReused,
    /// Idempotency key still in use by a running request.
    IdempotencyInProgress,
    /// 413: a body over `--max-body-bytes`, counted decompressed.
    PayloadTooLarge,
    /// 500: a fault of the server, never of the request.
    InternalError,
    /// Report owner not on a paid plan.
    PaymentRequired,
    /// Report definition cannot be compiled or run.
    ReportCompileFailed,
    /// Report exceeds a run cap.
    ReportCapExceeded,
    /// The data dir cannot take writes now (free space below the floor, an I/O failure).
    StorageUnavailable,
    /// `If-Match` names no current ETag of the row.
    PreconditionFailed,
    /// A change-feed cursor older than the retained changes.
    CursorExpired,
    /// 503: a cluster node cannot serve the request now (no leader, a leader change, a node
    /// that is not the leader).
    ClusterUnavailable,
    /// 409: a cluster membership change the membership refuses now (the node is a member
    /// already, another change runs, the last voter).
    MembershipConflict,
}

impl Code {
    /// The `(status, errorCode)` of a code: the one table.
    pub fn parts(self) -> (StatusCode, &'static str) {
        use Code::*;
        match self {
            Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Forbidden => (StatusCode::FORBIDDEN, "forbidden"),
            NotFound => (StatusCode::NOT_FOUND, "not_found"),
            ValidationFailed => (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
            VersionConflict => (StatusCode::CONFLICT, "version_conflict"),
            CapacityExceeded => (StatusCode::CONFLICT, "capacity_exceeded"),
            RateLimitExceeded => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_exceeded"),
            IdempotencyKeyReused => (StatusCode::CONFLICT, "idempotency_key_reused"),
            IdempotencyInProgress => (StatusCode::CONFLICT, "idempotency_in_progress"),
            PayloadTooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            InternalError => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
            PaymentRequired => (StatusCode::PAYMENT_REQUIRED, "payment_required"),
            ReportCompileFailed => (StatusCode::UNPROCESSABLE_ENTITY, "report_compile_failed"),
            ReportCapExceeded => (StatusCode::PAYLOAD_TOO_LARGE, "report_cap_exceeded"),
            StorageUnavailable => (StatusCode::SERVICE_UNAVAILABLE, "storage_unavailable"),
            PreconditionFailed => (StatusCode::PRECONDITION_FAILED, "precondition_failed"),
            CursorExpired => (StatusCode::GONE, "cursor_expired"),
            ClusterUnavailable => (StatusCode::SERVICE_UNAVAILABLE, "cluster_unavailable"),
            MembershipConflict => (StatusCode::CONFLICT, "membership_conflict"),
        }
    }

    /// The HTTP status of every answer with this code.
    pub fn status(self) -> StatusCode {
        self.parts().0
    }

    /// The `errorCode` slug.
    pub fn slug(self) -> &'static str {
        self.parts().1
    }
}

/// Where a validation problem is: `["body", "rows", 3, "version"]`.
pub type Loc = Vec<Value>;

/// An API error: code, a sentence for people, and machine-readable detail.
#[derive(Clone, Debug)]
pub struct ApiError {
    /// Decides the answer's status and its `errorCode`.
    pub code: Code,
    /// A sentence naming the thing.
    pub message: String,
    /// Detail as the contract describes it for the code (or null).
    pub detail: Value,
    /// Extra response headers (`Retry-After`, `WWW-Authenticate`).
    pub headers: Vec<(&'static str, String)>,
}

impl ApiError {
    /// An error with no detail.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ApiError { code, message: message.into(), detail: Value::Null, headers: Vec::new() }
    }

    /// Set the envelope's `detail`, replacing what it held.
    pub fn with_detail(mut self, detail: Value) -> Self {
        self.detail = detail;
        self
    }

    /// Sets one field of the detail object (made an object if it was not one).
    pub fn with_detail_field(mut self, name: &str, value: impl Into<Value>) -> Self {
        if !self.detail.is_object() {
            self.detail = json!({});
        }
        self.detail[name] = value.into();
        self
    }

    /// Add a response header.
    pub fn with_header(mut self, name: &'static str, value: String) -> Self {
        self.headers.push((name, value));
        self
    }

    /// The single 401: identical for missing, malformed, unknown, revoked and expired keys.
    pub fn unauthorized() -> Self {
        ApiError::new(
            Code::Unauthorized,
            "A valid API key is required: send `Authorization: Bearer <key>`.",
        )
        .with_header("WWW-Authenticate", "Bearer".into())
    }

    /// A 404 that says the same whether the object is missing or out of reach.
    pub fn not_found(what: impl fmt::Display) -> Self {
        ApiError::new(Code::NotFound, format!("{what} not found."))
    }

    /// A 422 validation body with one problem.
    pub fn validation(loc: Loc, msg: impl Into<String>, kind: &str) -> Self {
        let msg = msg.into();
        ApiError::new(Code::ValidationFailed, format!("Request validation failed: {msg}"))
            .with_detail(json!([{"loc": loc, "msg": msg, "type": kind}]))
    }

    /// An internal error; the cause is logged, never sent.
    pub fn internal(cause: impl fmt::Display) -> Self {
        tracing::error!(error = %cause, "internal error");
        ApiError::new(
            Code::InternalError,
            "The server failed to handle the request; it has been logged.",
        )
    }

    /// The envelope without `requestId` (the form bulk results carry).
    pub fn item_body(&self) -> Value {
        json!({"errorCode": self.code.slug(), "message": self.message, "detail": self.detail})
    }

    /// The envelope with `requestId`, as bytes.
    pub fn body(&self, request_id: &str) -> Vec<u8> {
        let mut v = self.item_body();
        v["requestId"] = Value::String(request_id.to_owned());
        serde_json::to_vec(&v).unwrap_or_default()
    }

    /// The full response, with body and headers.
    pub fn response(&self, request_id: &str) -> HttpResponse {
        let mut res = HttpResponse::build(self.code.status());
        res.content_type("application/json");
        for (name, value) in &self.headers {
            res.insert_header((*name, value.as_str()));
        }
        res.body(self.body(request_id))
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.slug(), self.message)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.code.status()
    }

    /// Only the status: every app is wrapped in [`crate::middleware::request_context`], which
    /// finds this error on the response and renders the envelope once, with the request id.
    fn error_response(&self) -> HttpResponse {
        HttpResponse::new(self.code.status())
    }
}

impl From<actors::Error> for ApiError {
    fn from(e: actors::Error) -> Self {
        ApiError::from(&e)
    }
}

impl From<&actors::Error> for ApiError {
    fn from(e: &actors::Error) -> Self {
        use actors::Error as E;
        match e {
            E::NotFound(what) => ApiError::not_found(capitalize(what)),
            E::Coerce(c) => {
                ApiError::new(Code::ValidationFailed, format!("Cell value refused: {c}."))
                    .with_detail(json!({"column_id": c.column_id, "reason": c.reason}))
            }
            E::KeyColumn(reason) => {
                ApiError::validation(vec![json!("body"), json!("keyColumn")], reason, "value_error")
            }
            E::AmbiguousKey { column_id, row_ids } => {
                let reason = e.to_string();
                ApiError::new(
                    Code::ValidationFailed,
                    format!("Cell value refused: column {column_id}: {reason}."),
                )
                .with_detail(json!({"column_id": column_id, "reason": reason, "rowIds": row_ids}))
            }
            E::VersionConflict { current, conflicting, mergeable } => {
                let mut detail = current_row(current);
                let ids =
                    |v: &Vec<u64>| Value::from(v.iter().map(|c| c.to_string()).collect::<Vec<_>>());
                if let (Some(c), Some(m)) = (conflicting, mergeable) {
                    detail["conflictingColumns"] = ids(c);
                    detail["mergeableColumns"] = ids(m);
                }
                ApiError::new(
                    Code::VersionConflict,
                    format!(
                        "Row {} is at version {}; re-read it and retry.",
                        current.id,
                        current.version()
                    ),
                )
                .with_detail(detail)
            }
            E::PreconditionFailed { current } => ApiError::new(
                Code::PreconditionFailed,
                format!(
                    "Row {} is at version {}, which `If-Match` does not name; nothing was \
                     written. Re-read it and retry.",
                    current.id,
                    current.version()
                ),
            )
            .with_detail(current_row(current)),
            E::CapacityExceeded { cap } => ApiError::new(
                Code::CapacityExceeded,
                format!("The sheet has reached its cap of {cap} rows."),
            )
            .with_detail(json!({"maxRowsPerSheet": cap})),
            E::Invalid { message, detail } => {
                ApiError::new(Code::ValidationFailed, message.clone())
                    .with_detail(detail.clone().unwrap_or(Value::Null))
            }
            E::Report { kind, message, detail } => {
                let code = match kind {
                    actors::error::ReportErrorKind::CompileFailed => Code::ReportCompileFailed,
                    actors::error::ReportErrorKind::CapExceeded => Code::ReportCapExceeded,
                };
                ApiError::new(code, message.clone()).with_detail(detail.clone())
            }
            e @ E::Wal(_) if e.is_storage_unavailable() => {
                tracing::warn!(error = %e, "a write was refused: the data dir cannot take it now");
                ApiError::new(
                    Code::StorageUnavailable,
                    "The data dir cannot take writes right now; nothing was written. Reads are \
                     still served. Retry later.",
                )
                .with_header("Retry-After", STORAGE_RETRY_AFTER_SECS.to_string())
            }
            E::ClusterUnavailable { outcome, leader, reason } => {
                tracing::info!(outcome = outcome.as_str(), reason, "a request met no leader");
                cluster_unavailable(*outcome, *leader, reason)
            }
            e @ (E::Wal(_) | E::Unavailable(_) | E::Inconsistent(_) | E::Cluster(_)) => {
                ApiError::internal(e)
            }
        }
    }
}

/// `503 cluster_unavailable`: `detail.outcome` says whether the request was certainly not
/// applied (`not_applied`) or may yet be (`unknown`); `detail.leaderId` names the leader this
/// node knows of. A retry after `Retry-After` is safe (with the same `Idempotency-Key` for an
/// `unknown` write).
pub fn cluster_unavailable(
    outcome: actors::error::ClusterOutcome,
    leader: Option<u64>,
    reason: &str,
) -> ApiError {
    let message = match outcome {
        actors::error::ClusterOutcome::NotApplied => {
            format!("The cluster cannot serve this request now; it was not applied. {reason}")
        }
        actors::error::ClusterOutcome::Unknown => format!(
            "The write's outcome is unknown: it may or may not be applied. Retry it with the \
             same Idempotency-Key to learn which. {reason}"
        ),
    };
    ApiError::new(Code::ClusterUnavailable, message)
        .with_detail(json!({"outcome": outcome.as_str(), "leaderId": leader}))
        .with_header("Retry-After", "1".to_string())
}

/// `{currentVersion, current}`: what a client needs to diff and retry after a refused write
/// (`version_conflict`, `precondition_failed`). `current` is the row's own JSON (RowV1), the
/// rendering every response that shows the row shares.
fn current_row(current: &actors::model::Row) -> Value {
    json!({"currentVersion": current.version(), "current": current.to_json()})
}

/// `Retry-After` of a 503 `storage_unavailable`: free space is measured again at least this
/// often while writes are refused.
pub const STORAGE_RETRY_AFTER_SECS: u64 = 5;

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use actors::model::{Json, Row, SOURCE_API};

    use super::*;

    #[test]
    fn a_refused_writes_current_row_is_the_row_as_every_read_shows_it() {
        let cells: BTreeMap<u64, Json> = [
            (100, json!("text \"quoted\" é")),
            (102, json!({"value": 1.5, "format": "0.0"})),
            (107, json!(["a", "c"])),
            (2, json!(0.1)),
        ]
        .into_iter()
        .map(|(k, v)| (k, Json(v)))
        .collect();
        let row = Row::new(7, 10, cells, SOURCE_API, 1_767_225_600_123);
        let shown = serde_json::to_value(crate::views::RowView::from(&row)).unwrap();
        let refused = [
            actors::Error::PreconditionFailed { current: Box::new(row.clone()) },
            actors::Error::VersionConflict {
                current: Box::new(row.clone()),
                conflicting: None,
                mergeable: None,
            },
        ];
        for e in &refused {
            let detail = ApiError::from(e).detail;
            assert_eq!(detail, json!({"currentVersion": 1, "current": shown}), "{e}");
        }
    }
}
