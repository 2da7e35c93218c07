//! What the public API's operations share in the OpenAPI document, named by the handlers'
//! `#[utoipa::path]` attributes: their query and header parameters, the error envelopes
//! (the JSON that [`crate::error::ApiError`] renders), the reusable error responses, one per
//! status, each with its envelope, [`NotModified`], the bodiless 304, and the sets of error
//! responses each kind of operation shares ([`ReadErrors`], [`WriteErrors`], ...).
//!
//! The document itself is assembled in [`crate::openapi`], which imports the routes; the routes
//! import this module and never that one.

use std::collections::BTreeMap;

use serde_json::Value;
use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::schema::{AnyOfBuilder, ArrayBuilder, ObjectBuilder, Schema, Type};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{IntoParams, IntoResponses, ToResponse, ToSchema};

use crate::schema::detail_any;

// ---------------------------------------------------------------------------------------------
// Parameters shared by several operations.

/// `limit` and `cursor` of the keyset-paged lists.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// Page size: default 100; a value above 500 is clamped to 500. Below 1 or not an
    /// integer: 422.
    #[param(minimum = 1, default = 100)]
    pub limit: Option<i64>,
    /// The `nextCursor` of the previous page, passed back unchanged. Opaque; one that is
    /// empty, was altered or comes from another endpoint or resource: 422.
    #[param(min_length = 1)]
    pub cursor: Option<String>,
}

/// listRows' `fields` and `filter`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RowsQuery {
    /// Only these cells in each row: comma-separated column ids (`cells` keeps only those
    /// keys; empty: no cells). An id that is not a column of the sheet: 422 at
    /// `["query", "fields"]`.
    #[param(example = "100,101")]
    pub fields: Option<String>,
    /// Only the rows passing this filter, as URL-encoded JSON: the report filter shape
    /// (`{"all": [...]}`, `{"any": [...]}`, nesting allowed; a leaf `{"column", "op", "value"}`
    /// with `op` in `eq ne gt gte lt lte contains in is_blank not_blank`) with `column` a
    /// column id as a string. Operands are coerced as cells of their column are (a datetime
    /// with an offset equals the UTC cell of the same instant). Bad JSON, an unknown column or
    /// operator, or an operand the column cannot hold: 422 at `["query", "filter"]`. A request
    /// examines at most 100,000 rows, so a filtered page may hold fewer than `limit` rows, even
    /// none, while `nextCursor` is not null: keep paging until it is null. A cursor is bound to
    /// the `filter` and `fields` it was issued with; with others it is a 422.
    #[param(example = json!("{\"all\":[{\"column\":\"101\",\"op\":\"eq\",\"value\":\"Done\"}]}"))]
    pub filter: Option<String>,
}

/// `limit` alone (the rows page of getSheet).
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LimitQuery {
    /// Size of the first rows page: default 100; a value above 500 is clamped to 500. Below 1
    /// or not an integer: 422.
    #[param(minimum = 1, default = 100)]
    pub limit: Option<i64>,
}

/// The optional `Idempotency-Key` of the five row writes.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct IdempotencyKey {
    /// 1 to 255 visible ASCII characters (a UUID per logical operation is recommended). A
    /// completed request with the same key and the same method, path, query, body and
    /// `If-Match` is replayed (`Idempotent-Replayed: true`) for 24 hours; another request
    /// under the same key is 409 `idempotency_key_reused`, one still running 409
    /// `idempotency_in_progress`.
    // `value_type`: the header is optional, never null (Option alone would say "or null").
    #[param(
        rename = "Idempotency-Key",
        value_type = String,
        required = false,
        min_length = 1,
        max_length = 255,
        pattern = "^[!-~]+$"
    )]
    pub idempotency_key: Option<String>,
}

/// `If-None-Match` of the reads that carry an `ETag`.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct IfNoneMatch {
    /// `*` or a comma-separated list of `ETag`s from earlier answers (`W/` allowed: compared
    /// weakly). When one is the current `ETag`, the answer is 304 with no body, which still
    /// counts against the rate limit. Any other value (an empty one included) is ignored.
    #[param(rename = "If-None-Match", value_type = String, required = false)]
    pub if_none_match: Option<String>,
}

/// `If-Match` of patchRow and deleteRow.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct IfMatch {
    /// `"<rowId>.<version>"` (getRow's `ETag`), a comma-separated list of them, or `*` (the
    /// row exists). When none is the row's current `ETag` (compared strongly: `W/` tags never
    /// match), the answer is 412 `precondition_failed` and nothing is written; a missing row is
    /// 404 as without the header. With it, patchRow's body `version` may be left out; when both
    /// are sent and disagree, 412. A value that names no current `ETag` (an empty one
    /// included) is a 412 too.
    #[param(rename = "If-Match", value_type = String, required = false)]
    pub if_match: Option<String>,
}

/// `limit`, `cursor` and `wait` of listChanges.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ChangesQuery {
    /// Changes per page: default 100; a value above 500 is clamped to 500. Below 1 or not an
    /// integer: 422.
    #[param(minimum = 1, default = 100)]
    pub limit: Option<i64>,
    /// A `nextCursor` of this sheet's feed (or an export's `Sheet-Changes-Cursor`), passed back
    /// unchanged. Without it the feed starts at the oldest retained change. Altered, or from
    /// another endpoint or sheet: 422. Older than the retained changes: 410
    /// `cursor_expired`.
    #[param(min_length = 1)]
    pub cursor: Option<String>,
    /// Long-poll: when no change follows the cursor, hold the request up to this many seconds
    /// and answer as soon as one is durable. 0 to 30; anything else: 422.
    #[param(minimum = 0, maximum = 30, default = 0)]
    pub wait: Option<i64>,
}

/// `Last-Event-ID` of listChanges as an event stream.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct LastEventId {
    /// With `Accept: text/event-stream`: the `id` of the last event received, to resume the
    /// stream after it (it takes the place of `cursor`). Not a cursor of this feed: 422.
    #[param(rename = "Last-Event-ID", value_type = String, required = false)]
    pub last_event_id: Option<String>,
}

/// `format` of exportRows, with listRows' `fields` and `filter`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExportQuery {
    /// `ndjson` (default): one RowV1 per line. `csv`: RFC 4180 with a header line
    /// `id,version,<column names by position>`; a cell is its text, a wrapper its `value`, a
    /// `multi_select` list its JSON text, a missing or null cell empty. Anything else: 422.
    // `value_type`: a string, never null; with it, utoipa takes the field as required unless
    // told otherwise, and the server sends ndjson when it is left out.
    #[param(value_type = String, required = false, default = "ndjson", pattern = "^(ndjson|csv)$")]
    pub format: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// Error bodies. They document the JSON that [`crate::error::ApiError`] renders.

/// The error envelope: the body of every 4xx/5xx. Clients switch on `errorCode`; `message`
/// is for people and may change.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct ErrorEnvelope {
    /// One of `unauthorized`, `forbidden`, `not_found`, `validation_failed`,
    /// `version_conflict`, `capacity_exceeded`, `rate_limit_exceeded`,
    /// `idempotency_key_reused`, `idempotency_in_progress`, `payload_too_large`,
    /// `internal_error`, `payment_required`, `report_compile_failed`, `report_cap_exceeded`,
    /// `storage_unavailable`, `precondition_failed`, `cursor_expired`, `cluster_unavailable`;
    /// codes are only ever added.
    pub error_code: String,
    /// A sentence naming the problem.
    pub message: String,
    /// Machine-readable detail; its shape depends on the code (null when there is none).
    #[schema(schema_with = detail_any, required = false)]
    pub detail: Value,
    /// Same value as the `X-Request-Id` header.
    pub request_id: String,
}

/// A 422 envelope (`validation_failed`, or `report_compile_failed` on runReport).
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct ValidationErrorEnvelope {
    /// `validation_failed` or `report_compile_failed`.
    pub error_code: String,
    /// A sentence naming the problem.
    pub message: String,
    /// What failed where.
    #[schema(schema_with = validation_detail, required = false)]
    pub detail: Value,
    /// Same value as the `X-Request-Id` header.
    pub request_id: String,
}

/// One problem with a malformed path, query, header or body.
#[derive(ToSchema)]
pub struct ValidationProblem {
    /// Where the problem is: `path`, `query`, `header` or `body`, then names and indexes.
    #[schema(schema_with = loc_schema)]
    pub loc: Vec<Value>,
    /// What is wrong, for people.
    pub msg: String,
    /// The kind of problem (`int_parsing`, `missing`, `json_invalid`, ...).
    #[schema(rename = "type")]
    pub kind: String,
}

/// A cell value refused by its column's type (or a cell key that is not a column, or an upsert
/// item's key value held by more than one row).
#[derive(ToSchema)]
pub struct CellProblem {
    /// The column id as an integer, or the cell key as sent (a string) when it is no column id.
    #[schema(schema_with = cell_key_schema)]
    pub column_id: Value,
    /// Why the value was refused.
    pub reason: String,
    /// bulkUpsertRows: the rows holding an item's key value, when more than one does.
    #[schema(rename = "rowIds", required = false)]
    pub row_ids: Option<Vec<u64>>,
}

/// A 409 envelope: `version_conflict`, `capacity_exceeded`, `idempotency_key_reused` or
/// `idempotency_in_progress`.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct ConflictErrorEnvelope {
    /// One of the four conflict codes.
    pub error_code: String,
    /// A sentence naming the problem.
    pub message: String,
    /// Depends on the code.
    #[schema(schema_with = conflict_detail, required = false)]
    pub detail: Value,
    /// Same value as the `X-Request-Id` header.
    pub request_id: String,
}

/// `detail` of `version_conflict`: enough to diff and retry.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct VersionConflictDetail {
    /// The row's current version.
    pub current_version: u64,
    /// The row as it is now.
    pub current: crate::views::RowView,
    /// With `baseCells`: cells the request changes that also changed since the base.
    #[schema(schema_with = column_ids)]
    pub conflicting_columns: Option<Vec<String>>,
    /// With `baseCells`: cells the request changes that did not change since the base.
    #[schema(schema_with = column_ids)]
    pub mergeable_columns: Option<Vec<String>>,
}

/// The 412 envelope (`precondition_failed`): `If-Match` names no current `ETag` of the row.
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct PreconditionErrorEnvelope {
    /// `precondition_failed`.
    pub error_code: String,
    /// A sentence naming the row and its version.
    pub message: String,
    /// The row as it is now, as for `version_conflict` (without `baseCells` columns).
    pub detail: VersionConflictDetail,
    /// Same value as the `X-Request-Id` header.
    pub request_id: String,
}

/// The 429 envelope (`rate_limit_exceeded`).
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct RateLimitErrorEnvelope {
    /// `rate_limit_exceeded`.
    pub error_code: String,
    /// A sentence naming the limit.
    pub message: String,
    /// When to retry.
    pub detail: RetryAfterDetail,
    /// Same value as the `X-Request-Id` header.
    pub request_id: String,
}

/// `detail` of a 429.
#[derive(ToSchema)]
pub struct RetryAfterDetail {
    /// Whole seconds to wait; the same as the `Retry-After` header.
    #[schema(minimum = 1)]
    pub retry_after_seconds: u64,
}

/// A `$ref` to a component schema.
fn schema_ref(name: &str) -> RefOr<Schema> {
    RefOr::Ref(Ref::from_schema_name(name))
}

/// `loc` of a validation problem: strings and integers.
fn loc_schema() -> Schema {
    ArrayBuilder::new()
        .items(
            AnyOfBuilder::new()
                .item(ObjectBuilder::new().schema_type(Type::String))
                .item(ObjectBuilder::new().schema_type(Type::Integer)),
        )
        .description(Some(
            "Where the problem is: `path`, `query`, `header` or `body`, then names and indexes.",
        ))
        .into()
}

/// `detail` of a 422.
fn validation_detail() -> Schema {
    AnyOfBuilder::new()
        .item(ArrayBuilder::new().items(schema_ref("ValidationProblem")))
        .item(schema_ref("CellProblem"))
        .item(ObjectBuilder::new().schema_type(Type::Object))
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .description(Some(
            "A list of ValidationProblem for a malformed path, query, header or body; a \
             CellProblem when a cell value is refused by its column; an object naming the \
             problem (`path`, `reason`, ...) for `report_compile_failed`.",
        ))
        .into()
}

/// `detail` of a 409.
fn conflict_detail() -> Schema {
    AnyOfBuilder::new()
        .item(schema_ref("VersionConflictDetail"))
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .property("maxRowsPerSheet", ObjectBuilder::new().schema_type(Type::Integer))
                .required("maxRowsPerSheet"),
        )
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .description(Some(
            "VersionConflictDetail for `version_conflict`, `{maxRowsPerSheet}` for \
             `capacity_exceeded`, null for the idempotency conflicts.",
        ))
        .into()
}

/// `column_id` of a refused cell: the column id, or the cell key as sent when it is not one.
fn cell_key_schema() -> Schema {
    AnyOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(0)))
        .item(ObjectBuilder::new().schema_type(Type::String))
        .description(Some(
            "The column's id; or, when the cell key is not a column id written as a decimal \
             integer (`\"abc\"`, `\"+101\"`), that key as sent, as a string.",
        ))
        .into()
}

/// Column ids as strings (`conflictingColumns`, `mergeableColumns`).
fn column_ids() -> Schema {
    ArrayBuilder::new().items(ObjectBuilder::new().schema_type(Type::String)).into()
}

// ---------------------------------------------------------------------------------------------
// Reusable error responses, one per status.

/// A JSON error response with `body` (a component schema name).
fn error_response(description: &str, body: &str) -> RefOr<Response> {
    ResponseBuilder::new()
        .description(description)
        .content("application/json", ContentBuilder::new().schema(Some(schema_ref(body))).build())
        .build()
        .into()
}

/// Declares a unit type whose [`ToResponse`] is an error response.
macro_rules! error_responses {
    ($($name:ident => $body:literal, $description:literal;)*) => {$(
        #[doc = $description]
        pub struct $name;

        impl<'r> ToResponse<'r> for $name {
            fn response() -> (&'r str, RefOr<Response>) {
                (stringify!($name), error_response($description, $body))
            }
        }
    )*};
}

error_responses! {
    Unauthorized => "ErrorEnvelope",
        "`unauthorized`: the key is missing, malformed, unknown, revoked or expired.";
    PaymentRequired => "ErrorEnvelope",
        "`payment_required`: the report's owner is not on the paid plan.";
    Forbidden => "ErrorEnvelope",
        "`forbidden`: the key can read the sheet but not write it.";
    NotFound => "ErrorEnvelope",
        "`not_found`: the object is missing or outside the key's reach (the same answer either way).";
    Conflict => "ConflictErrorEnvelope",
        "`version_conflict`, `capacity_exceeded`, `idempotency_key_reused` or `idempotency_in_progress`.";
    PreconditionFailed => "PreconditionErrorEnvelope",
        "`precondition_failed`: `If-Match` names no current `ETag` of the row; nothing was \
         written. `detail` carries the row as it is now.";
    PayloadTooLarge => "ErrorEnvelope",
        "`payload_too_large`: the body exceeds the server's limit; on runReport \
         `report_cap_exceeded`: the report lists too many sources or scans too many rows.";
    ValidationFailed => "ValidationErrorEnvelope",
        "`validation_failed`: a malformed path id, query, header or body, or a refused cell \
         value; on runReport also `report_compile_failed`.";
    RateLimited => "RateLimitErrorEnvelope",
        "`rate_limit_exceeded`: too many requests in the rolling minute; retry after \
         `Retry-After` seconds.";
    InternalError => "ErrorEnvelope",
        "`internal_error`: the server failed; the cause is logged, never sent.";
    CursorExpired => "ErrorEnvelope",
        "`cursor_expired`: the cursor points before the oldest change the sheet still keeps \
         (the server keeps at least 7 days and at least the last 100,000 changes per sheet, \
         unless configured otherwise). `detail.oldestCursor` is the cursor of the oldest kept \
         change; to resynchronize, export the sheet (exportRows) and follow from its \
         `Sheet-Changes-Cursor`.";
    StorageUnavailable => "ErrorEnvelope",
        "`storage_unavailable`: the data dir cannot take writes now (free space below the \
         server's floor, or an I/O failure); nothing was written and reads are still served. \
         Retry after `Retry-After` seconds. On a cluster node also `cluster_unavailable` (see \
         below).";
    ClusterUnavailable => "ErrorEnvelope",
        "`cluster_unavailable` (a cluster node only): no leader is known or reachable now, or \
         a leader change is under way. `detail.outcome` is `not_applied` (certainly not \
         applied: a retry is safe) or `unknown` (a write whose fate could not be learned: \
         retry it with the same `Idempotency-Key` to learn which); `detail.leaderId` names the \
         leader the node knows of, or null. Retry after `Retry-After` seconds, on this node or \
         another.";
}

/// The 304 of a conditional read: no body.
pub struct NotModified;

impl<'r> ToResponse<'r> for NotModified {
    fn response() -> (&'r str, RefOr<Response>) {
        let description = "`If-None-Match` names the current `ETag`: the representation the \
                           client holds is current. No body.";
        ("NotModified", ResponseBuilder::new().description(description).build().into())
    }
}

// ---------------------------------------------------------------------------------------------
// Response sets: the error answers a kind of operation shares, named once. A handler lists its
// success, the set of its kind and any answer of its own; utoipa merges them by status.

/// A `$ref` to the reusable response `R`, as `(status = ..., response = R)` writes it.
fn response_ref<'r, R: ToResponse<'r>>() -> RefOr<Response> {
    RefOr::Ref(Ref::from_response_name(R::response().0))
}

/// Declares a unit type whose [`IntoResponses`] are the responses of the set it extends, if
/// any, and the listed statuses, each a `$ref` to its reusable response.
macro_rules! response_sets {
    ($(
        $(#[$doc:meta])*
        $name:ident = $($base:ident +)? [$($status:literal => $response:ident),* $(,)?];
    )*) => {$(
        $(#[$doc])*
        pub struct $name;

        impl IntoResponses for $name {
            fn responses() -> BTreeMap<String, RefOr<Response>> {
                let mut responses = BTreeMap::new();
                $(responses.extend(<$base as IntoResponses>::responses());)?
                $(responses.insert($status.to_string(), response_ref::<$response>());)*
                responses
            }
        }
    )*};
}

response_sets! {
    /// What every operation can answer: 401, 429, 500, and on a cluster node 503.
    CommonErrors = [
        401 => Unauthorized,
        429 => RateLimited,
        500 => InternalError,
        503 => ClusterUnavailable,
    ];
    /// A paged list: [`CommonErrors`] and 422 for a malformed `limit` or `cursor`.
    ListErrors = CommonErrors + [422 => ValidationFailed];
    /// A read of what a path names: [`ListErrors`] and 404.
    ReadErrors = ListErrors + [404 => NotFound];
    /// A row write: [`ReadErrors`], 403 (the key reads the sheet but cannot write it), 409 and
    /// 503.
    WriteErrors = ReadErrors + [403 => Forbidden, 409 => Conflict, 503 => StorageUnavailable];
    /// A row write with a body: [`WriteErrors`] and 413.
    BodyWriteErrors = WriteErrors + [413 => PayloadTooLarge];
}
