//! Rows: `GET /sheets/{sheet_id}/rows`, `GET /sheets/{sheet_id}/rows/{row_id}`, bulk add,
//! bulk update, bulk upsert (docs/spec/extensions.md X5), patch and delete.
//!
//! The reads answer from the sheet's published snapshot, with an `ETag` and 304 on a matching
//! `If-None-Match` ([`crate::conditional`]).
//!
//! Every write takes the same path (`run_write`): parse and validate (422, not stored),
//! claim the idempotency key (replay or 409), authorize (404/403, stored when idempotent), then
//! one message to the sheet's actor, which decides (an `If-Match` included), logs the write
//! together with its stored response, and replies once the record is durable.

use actix::{Handler, Message};
use actix_web::{web, HttpRequest, HttpResponse};
use std::sync::Arc;

use actors::model::{Column, Row, RowId};
use actors::report::compile::{compile_sheet_filter, SheetFilter};
use actors::sheet::SheetState;
use actors::sheet::{
    BulkAdd, BulkUpdate, BulkUpsert, DeleteRow, IdemRequest, Patch, PatchItem, RowResults,
    UpdateItem, UpsertResults, WriteReply,
};
use actors::SheetActor;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use crate::api_doc as oa;
use crate::auth::{Caller, Need};
use crate::conditional::{self, row_tag, sheet_tag, SheetRead};
use crate::cursor::{query_binding, Kind};
use crate::error::ApiError;
use crate::idempotency::{self, storable_outcome, Begin};
use crate::input::{
    body_problem, filter_problem, integer, json_body, paging_bound, path_id, read_body, row_query,
    some_integer, RowQuery,
};
use crate::response::respond;
use crate::routes::sheets::{sheet_actor, sheet_snapshot};
use crate::state::AppState;
use crate::views::{
    row_response, rows_page, BulkResultItemView, BulkWriteView, ListView, RowJson, RowResponseView,
    RowView,
};

/// Most rows in one bulk request.
pub const MAX_BULK_ROWS: usize = 2000;

/// Most rows one filtered listRows request looks at: a rare match must not make one request
/// walk a whole 500,000-row sheet. A page may so end short, even empty, with a cursor.
pub const MAX_EXAMINED_ROWS: usize = 100_000;

/// bulkAddRows' body (BulkAddRequest): rows to add, each on its own.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"rows": [{"cells": {"100": "Try sheetd", "101": "Open", "102": 1.5}}]}))]
pub struct BulkAddRequest {
    /// The rows to insert, each separately (1 to 2000).
    #[schema(min_items = 1, max_items = 2000)]
    rows: Vec<RowAddItem>,
}

/// One row to add (RowAddItem): cells keyed by column id, coerced by their columns.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RowAddItem {
    /// The new row's cells (default empty).
    #[serde(default)]
    #[schema(schema_with = crate::schema::cells_schema)]
    cells: Map<String, Value>,
}

/// bulkUpsertRows' body (BulkUpsertRequest): a key column and the items it matches.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"keyColumn": "100", "rows": [{"cells": {"100": "Try sheetd", "101": "Done"}}]}))]
pub struct BulkUpsertRequest {
    /// The key column: the id, as a string, of a column of the sheet of type `text`,
    /// `number`, `contact`, `date`, `dropdown` or `symbol` (anything else: 422 at
    /// `["body", "keyColumn"]`).
    #[schema(pattern = "^[0-9]+$", example = "100")]
    key_column: String,
    /// The items (1 to 2000), applied in order, each on its own: its key cell (required, not
    /// null) is matched against the rows' key cells by coerced value.
    #[schema(min_items = 1, max_items = 2000)]
    rows: Vec<RowAddItem>,
}

/// bulkUpdateRows' body (BulkUpdateRequest): rows to overwrite, each on its own.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"rows": [{"id": 1003, "version": 1, "cells": {"100": "Build the API", "101": "Done"}}]}))]
pub struct BulkUpdateRequest {
    /// The rows to update (1 to 2000).
    #[schema(min_items = 1, max_items = 2000)]
    rows: Vec<RowUpdateItem>,
}

/// One row to overwrite (RowUpdateItem), at the version last read.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RowUpdateItem {
    /// The row's id; one that is no row of the path's sheet fails the item (`not_found`).
    #[serde(deserialize_with = "integer")]
    id: u64,
    /// The version last read; a stale one fails the item with `version_conflict`.
    #[serde(deserialize_with = "integer")]
    #[schema(minimum = 1)]
    version: u64,
    /// The whole new cell map: it replaces the row's cells rather than merging.
    #[serde(default)]
    #[schema(schema_with = crate::schema::cells_schema)]
    cells: Map<String, Value>,
    /// Advisory snapshot for conflict classification.
    #[serde(default)]
    #[schema(schema_with = crate::schema::nullable_cells_schema)]
    base_cells: Option<Map<String, Value>>,
}

/// patchRow's body (RowPatch): only the changed cells, merged into the row.
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"version": 1, "cells": {"101": "Done"}}))]
pub struct RowPatch {
    /// The version last read; a stale one is 409 `version_conflict`. Required (as api-v1 has
    /// it), except that a request sending `If-Match` may leave it out; with both, they must
    /// agree (else 412 `precondition_failed`). The document says required: no schema can say
    /// "unless a header is sent".
    #[serde(default, deserialize_with = "some_integer")]
    #[schema(value_type = u64, minimum = 1, required = true)]
    version: Option<u64>,
    /// Only the changed cells, merged into the row; a null value removes that cell.
    #[serde(default)]
    #[schema(schema_with = crate::schema::cells_schema)]
    cells: Map<String, Value>,
    /// Advisory snapshot for conflict classification.
    #[serde(default)]
    #[schema(schema_with = crate::schema::nullable_cells_schema)]
    base_cells: Option<Map<String, Value>>,
}

fn check_count(n: usize) -> Result<(), ApiError> {
    if (1..=MAX_BULK_ROWS).contains(&n) {
        Ok(())
    } else {
        Err(body_problem(
            &[json!("rows")],
            format!("`rows` must hold 1 to {MAX_BULK_ROWS} items, got {n}"),
            if n == 0 { "too_short" } else { "too_long" },
        ))
    }
}

fn check_version(version: u64, loc: &[Value]) -> Result<(), ApiError> {
    if version >= 1 {
        Ok(())
    } else {
        Err(body_problem(loc, "`version` must be at least 1", "greater_than_equal"))
    }
}

/// listRows: by id, keyset paged.
#[utoipa::path(
    get,
    path = "/sheets/{sheet_id}/rows",
    operation_id = "listRows",
    tag = "rows",
    summary = "A page of a sheet's rows, by id",
    params(
        ("sheet_id" = u64, Path, description = "Sheet id.", example = 10),
        oa::PageQuery,
        oa::RowsQuery,
        oa::IfNoneMatch,
    ),
    responses(
        (status = 200, description = "A page of rows; `nextCursor` is null on the last page. \
            With `filter` a page may be short or empty while `nextCursor` is not null.",
            body = ListView<RowView>),
        oa::ReadErrors,
        (status = 304, response = oa::NotModified),
    )
)]
pub async fn list_rows(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let sheet_id = path_id(&req, "sheet_id")?;
    let query = row_query(&req)?;
    let binding = query_binding(&query.normalized);
    let page = paging_bound(&req, &state.cursors, Some((Kind::Rows, sheet_id)), binding)?;
    let snapshot = sheet_snapshot(&state, &caller, sheet_id)?;
    // The ETag covers the page's query, `fields` and `filter` included.
    let tag = sheet_tag(SheetRead::ListRows, &snapshot, Some(&page), binding);
    if conditional::none_match(&req, &tag) {
        return conditional::respond(&req, tag, || Ok(HttpResponse::Ok().finish()));
    }
    let sheet = &snapshot.state;
    let cursor = move |state: &AppState, resume_after: Option<RowId>| {
        resume_after.map(|id| state.cursors.encode_bound(Kind::Rows, sheet_id, id, binding))
    };
    let body = match checked_query(&query, sheet)? {
        None => {
            let (rows, more) = sheet.page(page.after, page.limit);
            let next_cursor = cursor(&state, more.then(|| rows.last().map_or(0, |r| r.id)));
            rows_page(&rows, query.fields.as_ref(), next_cursor.as_deref(), &caller.request_id)
        }
        Some(filter) => {
            // Up to 100,000 rows of predicate work: off the worker, as report scans are.
            let (snapshot, state) = (snapshot.clone(), state.clone());
            let request_id = caller.request_id.clone();
            web::block(move || {
                let keep = |r: &actors::model::Row| filter.matches(r);
                let (rows, resume_after) =
                    snapshot.state.page_filtered(page.after, page.limit, MAX_EXAMINED_ROWS, keep);
                let next_cursor = cursor(&state, resume_after);
                rows_page(&rows, query.fields.as_ref(), next_cursor.as_deref(), &request_id)
            })
            .await
            .map_err(|e| ApiError::internal(format!("filtered page: {e}")))?
        }
    };
    conditional::respond(&req, tag, || Ok(respond(200, body)))
}

/// Checks a `fields` and `filter` query against the sheet's columns (listRows and exportRows):
/// an unknown column id in `fields` is a 422 at `["query", "fields"]`, a filter the compiler
/// refuses a 422 at `["query", "filter"]`. Returns the compiled filter, if there is one.
pub fn checked_query(
    query: &RowQuery,
    sheet: &SheetState,
) -> Result<Option<SheetFilter>, ApiError> {
    if let Some(unknown) = query.fields.iter().flatten().find(|id| !sheet.columns.contains_key(id))
    {
        return Err(ApiError::validation(
            vec![json!("query"), json!("fields")],
            format!("`{unknown}` is not the id of a column of sheet {}", sheet.id),
            "value_error",
        ));
    }
    let Some(filter) = &query.filter else { return Ok(None) };
    let columns: Vec<Column> = sheet.columns.values().cloned().collect();
    compile_sheet_filter(filter, &columns).map(Some).map_err(|e| {
        ApiError::validation(
            vec![json!("query"), json!("filter")],
            filter_problem(&e),
            "value_error",
        )
    })
}

/// getRow: one row, from the sheet's published snapshot.
#[utoipa::path(
    get,
    path = "/sheets/{sheet_id}/rows/{row_id}",
    operation_id = "getRow",
    tag = "rows",
    summary = "One row, with its ETag",
    params(
        ("sheet_id" = u64, Path, description = "Sheet id.", example = 10),
        ("row_id" = u64, Path, description = "Row id.", example = 1003),
        oa::IfNoneMatch,
    ),
    responses(
        (status = 200, description = "The row; `ETag` is `\"<rowId>.<version>\"`, the value \
            `If-Match` takes on patchRow and deleteRow.", body = RowResponseView),
        oa::ReadErrors,
        (status = 304, response = oa::NotModified),
    )
)]
pub async fn get_row(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let sheet_id = path_id(&req, "sheet_id")?;
    let row_id = path_id(&req, "row_id")?;
    let snapshot = sheet_snapshot(&state, &caller, sheet_id)?;
    // Missing, deleted or in another sheet: the same 404 as a write to that path.
    let row = snapshot.state.row(row_id)?;
    conditional::respond(&req, row_tag(row), || {
        Ok(respond(200, row_response(row, &caller.request_id)))
    })
}

/// Renders a write's outcome as `(status, body)`; the same function serves the live answer and
/// the stored one, so a replay is byte-identical. Errors render through [`render_error`]. An
/// `Err` is a response that could not be made: answered as a logged 500, never stored.
type RenderFn<T> = fn(&T, &str) -> Result<(u16, Vec<u8>), ApiError>;

fn render_error(e: &actors::Error, request_id: &str) -> (u16, Vec<u8>) {
    let api = ApiError::from(e);
    (api.code.status().as_u16(), api.body(request_id))
}

fn render_rows(items: &RowResults, request_id: &str) -> Result<(u16, Vec<u8>), ApiError> {
    bulk_body(items.iter().map(|r| r.as_ref().map(|row| (&**row, None))), request_id)
}

fn render_upserted(items: &UpsertResults, request_id: &str) -> Result<(u16, Vec<u8>), ApiError> {
    bulk_body(
        items.iter().map(|r| r.as_ref().map(|u| (&*u.row, Some(u.action.as_str())))),
        request_id,
    )
}

/// A BulkWriteResponse: one result per item, in order; an upsert's items carry their action.
fn bulk_body<'a>(
    items: impl Iterator<Item = Result<(&'a Row, Option<&'static str>), &'a actors::Error>>,
    request_id: &str,
) -> Result<(u16, Vec<u8>), ApiError> {
    let results: Vec<BulkResultItemView> = items
        .enumerate()
        .map(|(index, r)| match r {
            Ok((row, action)) => BulkResultItemView {
                index,
                status: "succeeded",
                row: Some(RowJson(row)),
                error: None,
                action,
            },
            Err(e) => BulkResultItemView {
                index,
                status: "failed",
                row: None,
                error: Some(ApiError::from(e).item_body()),
                action: None,
            },
        })
        .collect();
    let succeeded_count = results.iter().filter(|r| r.status == "succeeded").count();
    // Sized for the rows' shared text and each item's fields: 2000 rows would otherwise grow
    // the buffer by doubling, copying it a dozen times.
    let size = results
        .iter()
        .map(|r| r.row.map_or(256, |row| row.0.json_len_at_most() + 64))
        .sum::<usize>();
    let view = BulkWriteView {
        failed_count: results.len() - succeeded_count,
        succeeded_count,
        results,
        request_id: request_id.to_owned(),
    };
    let mut body = Vec::with_capacity(size + 128);
    serde_json::to_writer(&mut body, &view).map_err(ApiError::internal)?;
    Ok((200, body))
}

fn render_row(row: &Arc<Row>, request_id: &str) -> Result<(u16, Vec<u8>), ApiError> {
    Ok((200, row_response(row, request_id)))
}

fn render_deleted(_: &Vec<RowId>, _: &str) -> Result<(u16, Vec<u8>), ApiError> {
    Ok((204, Vec::new()))
}

/// The one write path shared by the five row writes.
async fn run_write<M, T>(
    state: &web::Data<AppState>,
    req: &HttpRequest,
    caller: &Caller,
    sheet_id: u64,
    body: &[u8],
    render: RenderFn<T>,
    make: impl FnOnce(Option<IdemRequest<T>>, u64) -> M,
) -> Result<HttpResponse, ApiError>
where
    M: Message<Result = WriteReply<T>> + Send + 'static,
    T: Send + 'static,
    SheetActor: Handler<M>,
{
    let claim = match idempotency::begin(state, req, caller, body).await? {
        Begin::Answer(res) => return Ok(res),
        Begin::Run(claim) => claim,
    };
    let request_id = caller.request_id.clone();
    let addr = match sheet_actor(state, caller, sheet_id, Need::Write) {
        Ok(addr) => addr,
        Err(e) => {
            return match claim {
                Some(claim) => idempotency::store_error(state, claim, e, &request_id).await,
                None => Err(e),
            }
        }
    };
    let idem = claim.as_ref().map(|c| {
        let rid = request_id.clone();
        IdemRequest {
            key_id: c.key_id,
            idem_key: c.idem_key.clone(),
            fingerprint: c.fingerprint,
            request_id: rid.clone(),
            render: Box::new(move |result| {
                let (status, body) = match result {
                    Ok(outcome) => render(outcome, &rid).ok()?,
                    Err(e) => render_error(e, &rid),
                };
                storable_outcome(status, result).then_some((status, body))
            }),
        }
    });
    let cap = caller.directory.row_cap(sheet_id);
    let sending = addr.send(make(idem, cap));
    let handed = claim.map(idempotency::Claimed::hand_off);
    let reply = match sending.await {
        Ok(reply) => reply,
        Err(e) => {
            idempotency::release(state, handed);
            return Err(ApiError::internal(e));
        }
    };
    if reply.stored.is_none() {
        idempotency::release(state, handed);
    }
    if let Some((status, body)) = reply.stored {
        return Ok(respond(status, body));
    }
    let (status, body) = match reply.result {
        Ok(outcome) => render(&outcome, &request_id)?,
        Err(e) => {
            let api = ApiError::from(e);
            if api.code.status().is_server_error() {
                // Answered by the error path, with its headers (a 503's `Retry-After`).
                return Err(api);
            }
            (api.code.status().as_u16(), api.body(&request_id))
        }
    };
    Ok(respond(status, body))
}

/// bulkAddRows.
#[utoipa::path(
    post,
    path = "/sheets/{sheet_id}/rows:bulkAdd",
    operation_id = "bulkAddRows",
    tag = "rows",
    summary = "Insert rows, each on its own (partial success)",
    params(
        ("sheet_id" = u64, Path, description = "Sheet id.", example = 10),
        oa::IdempotencyKey,
    ),
    request_body = BulkAddRequest,
    responses(
        (status = 200, description = "One result per input row, in order; 200 even when some \
            failed (`validation_failed`, `capacity_exceeded`).", body = BulkWriteView,
            links(
                ("patchAddedRow" = (operation_id = "patchRow", parameters(
                    ("sheet_id" = "$request.path.sheet_id"),
                    ("row_id" = "$response.body#/results/0/row/id"),
                ))),
                ("deleteAddedRow" = (operation_id = "deleteRow", parameters(
                    ("sheet_id" = "$request.path.sheet_id"),
                    ("row_id" = "$response.body#/results/0/row/id"),
                ))),
            )),
        oa::BodyWriteErrors,
    )
)]
pub async fn bulk_add_rows(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let sheet_id = path_id(&req, "sheet_id")?;
    let body = read_body(&req, payload, state.max_body_bytes).await?;
    let parsed: BulkAddRequest = json_body(&body)?;
    check_count(parsed.rows.len())?;
    let items = parsed.rows.into_iter().map(|r| r.cells).collect();
    run_write(&state, &req, &caller, sheet_id, &body, render_rows, |idem, cap| BulkAdd {
        items,
        cap,
        idem,
    })
    .await
}

/// bulkUpdateRows.
#[utoipa::path(
    post,
    path = "/sheets/{sheet_id}/rows:bulkUpdate",
    operation_id = "bulkUpdateRows",
    tag = "rows",
    summary = "Replace rows' cells, each with its version check (partial success)",
    params(
        ("sheet_id" = u64, Path, description = "Sheet id.", example = 10),
        oa::IdempotencyKey,
    ),
    request_body = BulkUpdateRequest,
    responses(
        (status = 200, description = "One result per input row, in order; 200 even when some \
            failed (`version_conflict`, `not_found`, `validation_failed`, ...).",
            body = BulkWriteView),
        oa::BodyWriteErrors,
    )
)]
pub async fn bulk_update_rows(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let sheet_id = path_id(&req, "sheet_id")?;
    let body = read_body(&req, payload, state.max_body_bytes).await?;
    let parsed: BulkUpdateRequest = json_body(&body)?;
    check_count(parsed.rows.len())?;
    for (i, r) in parsed.rows.iter().enumerate() {
        check_version(r.version, &[json!("rows"), json!(i), json!("version")])?;
    }
    let items = parsed
        .rows
        .into_iter()
        .map(|r| UpdateItem {
            id: r.id,
            version: r.version,
            cells: r.cells,
            base_cells: r.base_cells,
        })
        .collect();
    run_write(&state, &req, &caller, sheet_id, &body, render_rows, |idem, _| BulkUpdate {
        items,
        idem,
    })
    .await
}

/// bulkUpsertRows (extensions X5).
#[utoipa::path(
    post,
    path = "/sheets/{sheet_id}/rows:bulkUpsert",
    operation_id = "bulkUpsertRows",
    tag = "rows",
    summary = "Create or merge rows by a key column, each on its own (partial success)",
    description = "Items apply in order, each as if alone but after the items before it (a key \
        an earlier item created is updated by a later one). An item's key cell is required and \
        not null; it is coerced like any cell and matched by coerced value (a wrapper counts as \
        its `value`; `12`, `12.0` and `\"12\"` are one number). No row holds the key: a new row, \
        as bulkAddRows makes one (`capacity_exceeded` at the sheet's cap). One row: the item's \
        cells are merged into it as patchRow merges (null removes a cell) and its version goes \
        up by one; when that changes nothing, nothing is written (`unchanged`). More than one \
        row: the item fails with `validation_failed`, `detail.rowIds` naming them. Finding a \
        row costs the same whatever the sheet's size.",
    params(
        ("sheet_id" = u64, Path, description = "Sheet id.", example = 10),
        oa::IdempotencyKey,
    ),
    request_body = BulkUpsertRequest,
    responses(
        (status = 200, description = "One result per item, in order, each succeeded one with its \
            `action` (`created`, `updated`, `unchanged`); 200 even when some failed \
            (`validation_failed`: a refused cell, a missing, null or empty key cell, or a key \
            held by several rows, `detail: {column_id, reason, rowIds}`; \
            `capacity_exceeded`).", body = BulkWriteView),
        oa::BodyWriteErrors,
    )
)]
pub async fn bulk_upsert_rows(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let sheet_id = path_id(&req, "sheet_id")?;
    let body = read_body(&req, payload, state.max_body_bytes).await?;
    let parsed: BulkUpsertRequest = json_body(&body)?;
    check_count(parsed.rows.len())?;
    let items = parsed.rows.into_iter().map(|r| r.cells).collect();
    // The key column is checked by the sheet's actor, against the columns, after access: a
    // sheet the key cannot reach stays a 404 whatever the body names.
    run_write(&state, &req, &caller, sheet_id, &body, render_upserted, |idem, cap| BulkUpsert {
        key_column: parsed.key_column,
        items,
        cap,
        idem,
    })
    .await
}

/// patchRow.
#[utoipa::path(
    patch,
    path = "/sheets/{sheet_id}/rows/{row_id}",
    operation_id = "patchRow",
    tag = "rows",
    summary = "Merge changed cells into one row, with a version check",
    params(
        ("sheet_id" = u64, Path, description = "Sheet id.", example = 10),
        ("row_id" = u64, Path, description = "Row id.", example = 1003),
        oa::IdempotencyKey,
        oa::IfMatch,
    ),
    request_body = RowPatch,
    responses(
        (status = 200, description = "The updated row.", body = RowResponseView),
        oa::BodyWriteErrors,
        (status = 412, response = oa::PreconditionFailed),
    )
)]
pub async fn patch_row(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let sheet_id = path_id(&req, "sheet_id")?;
    let row_id = path_id(&req, "row_id")?;
    let body = read_body(&req, payload, state.max_body_bytes).await?;
    let parsed: RowPatch = json_body(&body)?;
    let if_match = conditional::if_match(&req, row_id);
    match parsed.version {
        Some(version) => check_version(version, &[json!("version")])?,
        None if if_match.is_none() => {
            return Err(body_problem(
                &[json!("version")],
                "missing field `version` (it may be left out only when `If-Match` is sent)",
                "missing",
            ))
        }
        None => {}
    }
    let item = PatchItem {
        version: parsed.version,
        if_match,
        cells: parsed.cells,
        base_cells: parsed.base_cells,
    };
    run_write(&state, &req, &caller, sheet_id, &body, render_row, |idem, _| Patch {
        row_id,
        item,
        idem,
    })
    .await
}

/// deleteRow.
#[utoipa::path(
    delete,
    path = "/sheets/{sheet_id}/rows/{row_id}",
    operation_id = "deleteRow",
    tag = "rows",
    summary = "Delete a row and its subtree",
    params(
        ("sheet_id" = u64, Path, description = "Sheet id.", example = 10),
        ("row_id" = u64, Path, description = "Row id.", example = 1003),
        oa::IdempotencyKey,
        oa::IfMatch,
    ),
    responses(
        (status = 204, description = "Deleted, with its subtree; no body."),
        oa::WriteErrors,
        (status = 412, response = oa::PreconditionFailed),
    )
)]
pub async fn delete_row(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let sheet_id = path_id(&req, "sheet_id")?;
    let row_id = path_id(&req, "row_id")?;
    let if_match = conditional::if_match(&req, row_id);
    run_write(&state, &req, &caller, sheet_id, &[], render_deleted, |idem, _| DeleteRow {
        row_id,
        if_match,
        idem,
    })
    .await
}
