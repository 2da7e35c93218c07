//! The public API's machine-readable contract: an OpenAPI 3.1 document derived from the code.
//!
//! # How the document is made
//!
//! 1. Every public handler carries `#[utoipa::path(...)]` beside its code (operation id, path,
//!    parameters, request body and every status it can answer), and every view and request
//!    body derives [`ToSchema`]. A handler or view cannot change shape without the document
//!    changing with it.
//! 2. [`ApiDoc`] gathers every operation (the twelve of docs/spec/api-v1.md and those of
//!    docs/spec/extensions.md). Error answers are the reusable responses defined here, one per
//!    status ([`Unauthorized`], [`NotFound`], ...), each with the error envelope, and
//!    [`NotModified`] is the bodiless 304; handlers name the ones they can produce.
//! 3. [`BearerAuth`] adds the `bearerAuth` scheme, applied to every operation.
//! 4. [`document`] renders the JSON once and adds the response headers the middleware sets on
//!    every answer ([`ALWAYS`]), `Retry-After` on 429, `WWW-Authenticate` on 401,
//!    `Idempotent-Replayed` on the write operations and `ETag` on the 200 and 304 of the
//!    conditional reads ([`CONDITIONAL_READS`]). That step works on the JSON because
//!    utoipa's `Header` has no `required` field, and marking the always-present headers
//!    required is what lets a conformance checker (schemathesis in `.ci/schemathesis.sh`)
//!    verify that they really are always present. It also respells the fields of response
//!    links, which utoipa 5 writes in snake_case (`fix_links`), and drops the `int64` format
//!    of `limit`, which is clamped at any size (`unbound_limit`).
//!
//! Paths are relative to the one server URL, `/api/v1`, as docs/spec/api-v1.md's paths are
//! relative to `{base_url}`. The document and the interactive reference are served by
//! [`crate::routes::docs`].

use std::sync::OnceLock;

use serde_json::{json, Map, Value};
use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::schema::{
    AdditionalProperties, AnyOfBuilder, ArrayBuilder, ObjectBuilder, Schema, SchemaType, Type,
};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{IntoParams, Modify, OpenApi, ToResponse, ToSchema};

/// The document: every operation, their schemas and the reusable error responses.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "sheetd public API",
        version = "1.0.0",
        description = "Sheets, columns, rows and saved reports over JSON. Every request sends \
            `Authorization: Bearer <API key>`. Every 4xx/5xx body is the error envelope; clients \
            switch on `errorCode`. Requests are limited per key per rolling minute; every \
            response carries the rate-limit headers. This document (`/api/v1/openapi.json`) \
            and the interactive reference (`/api/v1/docs`) need no key; they count against the \
            rate limit of the caller's key, or of its IP address without one. \
            Compression: a response body over 1 KiB is sent with `Content-Encoding` `zstd`, `br` \
            or `gzip` when `Accept-Encoding` allows one (preferred in that order when weighted \
            equally; never on 204); every response that has a body carries `Vary: \
            Accept-Encoding`. A request body may be sent with `Content-Encoding: gzip` or `zstd`; \
            the body limit (413 `payload_too_large`) counts its decompressed bytes, and another \
            coding is a 422 at `[\"header\", \"Content-Encoding\"]`.",
        license(name = "MIT")
    ),
    servers((url = "/api/v1", description = "This server; paths below are relative to it.")),
    paths(
        crate::routes::me::get_me,
        crate::routes::sheets::list_sheets,
        crate::routes::sheets::get_sheet,
        crate::routes::sheets::list_columns,
        crate::routes::rows::list_rows,
        crate::routes::rows::get_row,
        crate::routes::reports::list_reports,
        crate::routes::reports::get_report,
        crate::routes::reports::run_report,
        crate::routes::rows::bulk_add_rows,
        crate::routes::rows::bulk_update_rows,
        crate::routes::rows::bulk_upsert_rows,
        crate::routes::rows::patch_row,
        crate::routes::rows::delete_row,
        crate::routes::changes::list_changes,
        crate::routes::export::export_rows,
    ),
    components(
        schemas(
            ErrorEnvelope,
            ValidationErrorEnvelope,
            ValidationProblem,
            CellProblem,
            ConflictErrorEnvelope,
            VersionConflictDetail,
            PreconditionErrorEnvelope,
            RateLimitErrorEnvelope,
            RetryAfterDetail,
            BulkItemError,
            crate::views::ChangeView,
        ),
        responses(
            NotModified,
            Unauthorized,
            PaymentRequired,
            Forbidden,
            NotFound,
            Conflict,
            PreconditionFailed,
            PayloadTooLarge,
            ValidationFailed,
            RateLimited,
            InternalError,
            StorageUnavailable,
            CursorExpired,
        )
    ),
    modifiers(&BearerAuth),
    security(("bearerAuth" = [])),
    tags(
        (name = "me", description = "The calling key."),
        (name = "sheets", description = "Sheets and their columns."),
        (name = "rows", description = "Rows: paged reads and idempotent writes."),
        (name = "reports", description = "Saved reports: metadata and runs."),
        (name = "changes", description = "Keeping a copy in sync: the change feed and \
            consistent export."),
    )
)]
pub struct ApiDoc;

/// Adds the `bearerAuth` security scheme (an API key sent as a bearer token).
pub struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearerAuth",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("svc_live_...")
                    .description(Some(
                        "An API key: `svc_live_` followed by random characters. A missing, \
                         malformed, revoked or expired key gets 401 `unauthorized`.",
                    ))
                    .build(),
            ),
        );
    }
}

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

// ---------------------------------------------------------------------------------------------
// Schemas of values the views hold as free JSON.

/// `cells`: raw cell values keyed by column id as a decimal string.
pub fn cells_schema() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property_names(Some(
            ObjectBuilder::new().schema_type(Type::String).pattern(Some("^[0-9]+$")),
        ))
        .additional_properties(Some(AdditionalProperties::FreeForm(true)))
        .description(Some(
            "Cell values keyed by column id as a string. A value is null, a scalar, a list \
             (multi_select) or a wrapper `{value, format}` / `{formula, value}`, returned \
             verbatim as stored.",
        ))
        .into()
}

/// `baseCells`: like [`cells_schema`], or null.
pub fn nullable_cells_schema() -> Schema {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .property_names(Some(
            ObjectBuilder::new().schema_type(Type::String).pattern(Some("^[0-9]+$")),
        ))
        .additional_properties(Some(AdditionalProperties::FreeForm(true)))
        .description(Some(
            "An advisory snapshot of the cells as last read, used only to classify a version \
             conflict (`conflictingColumns`, `mergeableColumns`); never trusted for the write.",
        ))
        .into()
}

/// A string with a fixed set of values.
fn string_enum(values: &[&str]) -> Schema {
    ObjectBuilder::new().schema_type(Type::String).enum_values(Some(values.iter().copied())).into()
}

/// `verb` of a grant.
pub fn verb_schema() -> Schema {
    string_enum(&["read", "write"])
}

/// `scopeType` of a grant.
pub fn scope_type_schema() -> Schema {
    string_enum(&["account", "project", "folder", "sheet"])
}

/// `status` of a bulk result item.
pub fn bulk_status_schema() -> Schema {
    string_enum(&["succeeded", "failed"])
}

/// `type` of a change: `row.created`, `row.updated` or `row.deleted`.
pub fn change_type_schema() -> Schema {
    string_enum(&["row.created", "row.updated", "row.deleted"])
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
    #[param(value_type = String, pattern = "^(ndjson|csv)$")]
    pub format: Option<String>,
}

/// `action` of a bulkUpsert result item.
pub fn upsert_action_schema() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(["created", "updated", "unchanged"]))
        .description(Some(
            "bulkUpsertRows only, on a succeeded item: what the item did. `unchanged`: the \
             merge would change nothing, so nothing was written and `row` is the current row.",
        ))
        .into()
}

/// `mode` of a report run.
pub fn report_mode_schema() -> Schema {
    string_enum(&["flat", "aggregated"])
}

/// Any JSON value (`detail` of an envelope whose code has no fixed detail shape).
fn any_value(description: &str) -> Schema {
    ObjectBuilder::new().schema_type(SchemaType::AnyValue).description(Some(description)).into()
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
    /// `storage_unavailable`, `precondition_failed`, `cursor_expired`;
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

fn detail_any() -> Schema {
    any_value("Depends on `errorCode`; null when the code carries none.")
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

/// The error of a failed bulk item: the error envelope without `requestId` (more properties
/// may be added).
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct BulkItemError {
    /// `validation_failed`, `version_conflict`, `capacity_exceeded`, `not_found` or
    /// `forbidden`.
    pub error_code: String,
    /// A sentence naming the problem.
    pub message: String,
    /// As for the same code in a whole-request error.
    #[schema(schema_with = detail_any, required = false)]
    pub detail: Value,
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
         Retry after `Retry-After` seconds.";
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
// Response headers, added to the rendered JSON.

/// Headers on every response of the public API, set by [`crate::middleware::request_context`].
pub const ALWAYS: [&str; 6] = [
    "X-Request-Id",
    "X-RateLimit-Limit",
    "X-RateLimit-Remaining",
    "X-RateLimit-Reset",
    "RateLimit",
    "RateLimit-Policy",
];

/// The header objects of [`ALWAYS`], all required.
fn always_headers() -> Map<String, Value> {
    let header = |description: &str, schema: Value| json!({"description": description, "required": true, "schema": schema});
    let integer = json!({"type": "integer"});
    let string = json!({"type": "string"});
    let headers = [
        header("The request id; equals the body's `requestId`.", string.clone()),
        header("Requests allowed per rolling minute.", integer.clone()),
        header("Requests left in the window.", integer.clone()),
        header("Unix epoch seconds when the next slot frees.", integer),
        header("The window now, e.g. `\"default\";r=599;t=60`.", string.clone()),
        header("The limit policy, e.g. `\"default\";q=600;w=60`.", string),
    ];
    ALWAYS.iter().map(|n| n.to_string()).zip(headers).collect()
}

/// Spell the Link Object's fields as OpenAPI does: utoipa 5 serializes them in snake_case
/// (`operation_id`), which tools reject as a link naming no operation.
fn fix_links(response: &mut Value) {
    let Some(links) = response.get_mut("links").and_then(Value::as_object_mut) else { return };
    for link in links.values_mut().filter_map(Value::as_object_mut) {
        for (from, to) in [
            ("operation_id", "operationId"),
            ("operation_ref", "operationRef"),
            ("request_body", "requestBody"),
        ] {
            if let Some(v) = link.remove(from) {
                link.insert(to.into(), v);
            }
        }
    }
}

/// Add the headers each response carries, by status, by whether the operation is a write and
/// by whether the response carries an `ETag`.
fn add_headers(response: &mut Value, status: &str, write: bool, etag: bool) {
    let Some(response) = response.as_object_mut() else { return };
    if response.contains_key("$ref") {
        return;
    }
    let mut headers = always_headers();
    match status {
        "401" => {
            headers.insert(
                "WWW-Authenticate".into(),
                json!({"description": "`Bearer`.", "required": true,
                       "schema": {"type": "string"}}),
            );
        }
        "429" | "503" => {
            headers.insert(
                "Retry-After".into(),
                json!({"description": "Whole seconds to wait (at least 1).", "required": true,
                       "schema": {"type": "integer", "minimum": 1}}),
            );
        }
        _ => {}
    }
    if etag {
        headers.insert(
            "ETag".into(),
            json!({"description": "The strong validator of what the answer shows: getRow's is \
                                   `\"<rowId>.<version>\"`; the others change whenever \
                                   anything they show could change. Send it back in \
                                   `If-None-Match` (or, a row's, in `If-Match`).",
                   "required": true, "schema": {"type": "string"}}),
        );
    }
    if write {
        headers.insert(
            "Idempotent-Replayed".into(),
            json!({"description": "`true` when this is the stored response of an earlier \
                                   request with the same `Idempotency-Key` (row writes only).",
                   "schema": {"type": "string", "enum": ["true"]}}),
        );
    }
    // Headers an operation documents itself (exportRows' `Sheet-Changes-Cursor`) stay.
    if let Some(Value::Object(own)) = response.remove("headers") {
        headers.extend(own);
    }
    response.insert("headers".into(), Value::Object(headers));
}

/// Drop the `format` of `limit`: the field is an `i64` for utoipa, but any larger integer is
/// clamped, even one beyond 64 bits, and `format: int64` would tell a client (or a fuzzer) that
/// such a value is invalid.
fn unbound_limit(parameters: &mut Value) {
    for p in parameters.as_array_mut().into_iter().flatten() {
        if p["in"] == "query" && p["name"] == "limit" {
            if let Some(schema) = p["schema"].as_object_mut() {
                schema.remove("format");
            }
        }
    }
}

/// The row writes: they take `Idempotency-Key` and may answer with a replay.
pub const WRITES: [&str; 5] =
    ["bulkAddRows", "bulkUpdateRows", "bulkUpsertRows", "patchRow", "deleteRow"];

/// The reads that carry an `ETag` and answer `If-None-Match` with 304.
pub const CONDITIONAL_READS: [&str; 4] = ["getRow", "getSheet", "listColumns", "listRows"];

/// Statuses a replayed write can carry besides its success: stored answers of
/// docs/spec/decisions.md §8.
const REPLAYABLE_ERRORS: [&str; 5] =
    ["Forbidden", "NotFound", "Conflict", "PreconditionFailed", "ValidationFailed"];

/// The served document: [`ApiDoc`] with its response headers, rendered once.
pub fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
        if let Some(paths) = doc["paths"].as_object_mut() {
            for item in paths.values_mut().filter_map(Value::as_object_mut) {
                for op in item.values_mut() {
                    let id = op["operationId"].as_str().unwrap_or_default();
                    let write = WRITES.contains(&id);
                    let conditional = CONDITIONAL_READS.contains(&id);
                    if let Some(parameters) = op.get_mut("parameters") {
                        unbound_limit(parameters);
                    }
                    if let Some(responses) = op["responses"].as_object_mut() {
                        for (status, response) in responses.iter_mut() {
                            add_headers(response, status, write, conditional && status == "200");
                            fix_links(response);
                        }
                    }
                }
            }
        }
        if let Some(responses) = doc["components"]["responses"].as_object_mut() {
            for (name, response) in responses.iter_mut() {
                let status = match name.as_str() {
                    "Unauthorized" => "401",
                    "RateLimited" => "429",
                    "StorageUnavailable" => "503",
                    _ => "",
                };
                let replayable = REPLAYABLE_ERRORS.contains(&name.as_str());
                add_headers(response, status, replayable, name == "NotModified");
            }
        }
        doc
    })
}
