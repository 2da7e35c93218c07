//! The public API's machine-readable contract: an OpenAPI 3.1 document derived from the code.
//!
//! # How the document is made
//!
//! 1. Every public handler carries `#[utoipa::path(...)]` beside its code (operation id, path,
//!    parameters, request body and every status it can answer), and every view and request
//!    body derives [`ToSchema`](utoipa::ToSchema). A handler or view cannot change shape
//!    without the document changing with it.
//! 2. [`ApiDoc`] gathers every operation (the twelve of docs/spec/api-v1.md and those of
//!    docs/spec/extensions.md). Error answers are the reusable responses of [`crate::api_doc`],
//!    one per status ([`Unauthorized`], [`NotFound`], ...), each with the error envelope, and
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
//! 5. It adds the OpenAPI 3.1 `webhooks` section: what a webhook posts to its receivers
//!    (`webhooks`), for which utoipa 5 has no builder.
//!
//! This module stands above the routes (it collects their operations); what the handlers name
//! in their annotations is in [`crate::api_doc`] and [`crate::schema`], below them. Paths are
//! relative to the one server URL, `/api/v1`, as docs/spec/api-v1.md's paths are relative to
//! `{base_url}`. The document and the interactive reference are served by [`crate::docs`].

use std::sync::OnceLock;

use serde_json::{json, Map, Value};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::api_doc::{
    CellProblem, ClusterUnavailable, Conflict, ConflictErrorEnvelope, CursorExpired, ErrorEnvelope,
    Forbidden, InternalError, NotFound, NotModified, PayloadTooLarge, PaymentRequired,
    PreconditionErrorEnvelope, PreconditionFailed, RateLimitErrorEnvelope, RateLimited,
    RetryAfterDetail, StorageUnavailable, Unauthorized, ValidationErrorEnvelope, ValidationFailed,
    ValidationProblem, VersionConflictDetail,
};
use crate::schema::BulkItemError;

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
        crate::routes::webhooks::create_webhook,
        crate::routes::webhooks::list_webhooks,
        crate::routes::webhooks::get_webhook,
        crate::routes::webhooks::delete_webhook,
        crate::routes::webhooks::enable_webhook,
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
            crate::views::WebhookMessageView,
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
            ClusterUnavailable,
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
        (name = "webhooks", description = "The change feed, pushed: subscriptions that post a \
            sheet's changes to a URL, signed per Standard Webhooks v1."),
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
    let mut all: Map<String, Value> = ALWAYS.iter().map(|n| n.to_string()).zip(headers).collect();
    // A cluster node's (docs/spec/cluster.md, "What a client sees"); absent on a single node.
    let optional = |description: &str| json!({"description": description, "required": false, "schema": {"type": "integer"}});
    all.insert(
        "Sheetd-Node".into(),
        optional("On a cluster node: the id of the node that answered the client."),
    );
    all.insert(
        "Sheetd-Applied-Index".into(),
        optional(
            "On a cluster node, a read sent with `Sheetd-Consistency: local`: the Raft \
                  index of the state it was answered from.",
        ),
    );
    all.insert(
        "Sheetd-Served-By".into(),
        optional("On a cluster node that forwarded the request: the leader that served it."),
    );
    all
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

/// The `Sheetd-Consistency` request header of a read a cluster node may answer locally
/// (docs/spec/cluster.md, "Local reads"; `crate::middleware`).
fn add_consistency(op: &mut Value) {
    let parameter = json!({
        "name": "Sheetd-Consistency",
        "in": "header",
        "required": false,
        "description": "On a cluster node: `local` answers from the receiving node's applied \
            state without contacting the leader (possibly stale, by at most the node's \
            `--max-local-staleness`; never ahead of what was acknowledged, never torn), with \
            `Sheetd-Applied-Index`. `linearizable`, the default, answers from the leader. A \
            single node answers alike either way.",
        "schema": {"type": "string", "enum": ["local", "linearizable"]},
    });
    match op.get_mut("parameters").and_then(Value::as_array_mut) {
        Some(parameters) => parameters.push(parameter),
        None => op["parameters"] = json!([parameter]),
    }
    // Another value of the header is a client's mistake.
    if let Some(responses) = op["responses"].as_object_mut() {
        responses
            .entry("422")
            .or_insert_with(|| json!({"$ref": "#/components/responses/ValidationFailed"}));
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

/// The document's `webhooks` (OpenAPI 3.1): what a webhook posts to its URL. utoipa 5 has no
/// builder for this section, so it is written here, naming the message's schema.
fn webhooks() -> Value {
    let header = |name: &str, description: &str, example: &str| {
        json!({"name": name, "in": "header", "required": true, "description": description,
               "schema": {"type": "string"}, "example": example})
    };
    json!({
        "sheetChanges": {
            "post": {
                "operationId": "sheetChanges",
                "tags": ["webhooks"],
                "summary": "A webhook's message: up to 100 of a sheet's changes, in feed order",
                "description": "Posted to a webhook's `url` (see createWebhook), signed per the \
                    Standard Webhooks specification v1: verify `webhook-signature` with its \
                    libraries and the `whsec_` secret createWebhook returned. One message is in \
                    flight per webhook; the next is sent only after a 2xx. Anything else (a \
                    non-2xx, a redirect: redirects are never followed, no answer within 10 s, a \
                    refused connection) is retried after 1 s doubling to 10 min, with jitter, \
                    with the same `webhook-id` and the same body; only `webhook-timestamp` and \
                    the signature change. A receiver may see a message again (same \
                    `webhook-id`: deduplicate by it), never out of order, never with a gap. \
                    After 3 days of failures (the server's `--webhook-disable-after-secs`) the \
                    webhook is disabled (`failing`); enableWebhook resumes it.",
                "security": [],
                "parameters": [
                    header("webhook-id", "The message's id: the same on every retry of it.",
                           "msg_1_42"),
                    header("webhook-timestamp", "Unix seconds of this attempt.", "1767225600"),
                    header("webhook-signature",
                           "`v1,` and the base64 of HMAC-SHA256 over                             `<webhook-id>.<webhook-timestamp>.<body>`, keyed with the                             secret's decoded bytes.",
                           "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4="),
                    header("User-Agent", "`sheetd/<version>`.", "sheetd/0.1.0"),
                ],
                "requestBody": {
                    "required": true,
                    "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/WebhookMessage"}
                    }}
                },
                "responses": {
                    "2XX": {"description": "Acknowledged: the receiver has the message; the \
                        next one follows."},
                    "default": {"description": "Not acknowledged: the same message is sent \
                        again later."}
                }
            }
        }
    })
}

/// The served document: [`ApiDoc`] with its response headers, rendered once.
pub fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
        if let Some(paths) = doc["paths"].as_object_mut() {
            for (path, item) in paths.iter_mut() {
                let Some(item) = item.as_object_mut() else { continue };
                let local_reads = !path.starts_with("/webhooks");
                for (method, op) in item.iter_mut() {
                    if method == "get" && local_reads {
                        add_consistency(op);
                    }
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
        if let Some(doc) = doc.as_object_mut() {
            doc.insert("webhooks".into(), webhooks());
        }
        if let Some(responses) = doc["components"]["responses"].as_object_mut() {
            for (name, response) in responses.iter_mut() {
                let status = match name.as_str() {
                    "Unauthorized" => "401",
                    "RateLimited" => "429",
                    "StorageUnavailable" | "ClusterUnavailable" => "503",
                    _ => "",
                };
                let replayable = REPLAYABLE_ERRORS.contains(&name.as_str());
                add_headers(response, status, replayable, name == "NotModified");
            }
        }
        doc
    })
}
