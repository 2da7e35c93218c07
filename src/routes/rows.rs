//! Rows: `GET /sheets/{sheet_id}/rows`, bulk add, bulk update, patch and delete.
//!
//! Every write takes the same path ([`run_write`]): parse and validate (422, not stored),
//! claim the idempotency key (replay or 409), authorize (404/403, stored when idempotent), then
//! one message to the sheet's actor, which decides, logs the write together with its stored
//! response, and replies once the record is durable.

use actix::{Handler, Message};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use actors::sheet::{
    BulkAdd, BulkUpdate, DeleteRow, IdemRequest, PageRows, Patch, PatchItem, UpdateItem,
    WriteOutcome, WriteReply,
};
use actors::SheetActor;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::auth::{Caller, Need};
use crate::cursor::Kind;
use crate::error::ApiError;
use crate::idempotency::{self, storable, Begin};
use crate::input::{body_problem, json_body, paging, path_id, read_body};
use crate::routes::ok;
use crate::routes::sheets::sheet_actor;
use crate::server::AppState;
use crate::views::{BulkResultItemView, BulkWriteView, ListView, RowResponseView, RowView};

/// Most rows in one bulk request.
pub const MAX_BULK_ROWS: usize = 2000;

/// BulkAddRequest.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkAddRequest {
    rows: Vec<RowAddItem>,
}

/// RowAddItem.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RowAddItem {
    #[serde(default)]
    cells: Map<String, Value>,
}

/// BulkUpdateRequest.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkUpdateRequest {
    rows: Vec<RowUpdateItem>,
}

/// RowUpdateItem.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RowUpdateItem {
    id: u64,
    version: u64,
    #[serde(default)]
    cells: Map<String, Value>,
    #[serde(default)]
    base_cells: Option<Map<String, Value>>,
}

/// RowPatch.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RowPatch {
    version: u64,
    #[serde(default)]
    cells: Map<String, Value>,
    #[serde(default)]
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
pub async fn list_rows(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let sheet_id = path_id(&req, "sheet_id")?;
    let page = paging(&req, &state.cursors, Some((Kind::Rows, sheet_id)))?;
    let addr = sheet_actor(&state, &caller, sheet_id, Need::Read)?;
    let rows = addr
        .send(PageRows { after: page.after, limit: page.limit })
        .await
        .map_err(ApiError::internal)?;
    state.service.visible(rows.visible_lsn).await?;
    let next_cursor = rows
        .more
        .then(|| state.cursors.encode(Kind::Rows, sheet_id, rows.rows.last().map_or(0, |r| r.id)));
    ok(&ListView {
        data: rows.rows.iter().map(RowView::from).collect(),
        next_cursor,
        request_id: caller.request_id,
    })
}

/// Renders an outcome as `(status, body)`; the same function serves the live answer and the
/// stored one, so a replay is byte-identical.
type RenderFn = fn(&actors::Result<WriteOutcome>, &str) -> (u16, Vec<u8>);

fn render_error(e: &actors::Error, request_id: &str) -> (u16, Vec<u8>) {
    let api = ApiError::from(e);
    (api.code.status().as_u16(), api.body(request_id))
}

fn render_bulk(result: &actors::Result<WriteOutcome>, request_id: &str) -> (u16, Vec<u8>) {
    match result {
        Ok(WriteOutcome::Bulk(items)) => {
            let results: Vec<BulkResultItemView> = items
                .iter()
                .enumerate()
                .map(|(index, r)| match r {
                    Ok(row) => BulkResultItemView {
                        index,
                        status: "succeeded",
                        row: Some(RowView::from(row)),
                        error: None,
                    },
                    Err(e) => BulkResultItemView {
                        index,
                        status: "failed",
                        row: None,
                        error: Some(ApiError::from(e).item_body()),
                    },
                })
                .collect();
            let succeeded_count = results.iter().filter(|r| r.status == "succeeded").count();
            let view = BulkWriteView {
                failed_count: results.len() - succeeded_count,
                succeeded_count,
                results,
                request_id: request_id.to_owned(),
            };
            (200, serde_json::to_vec(&view).unwrap_or_default())
        }
        Ok(_) => (500, Vec::new()),
        Err(e) => render_error(e, request_id),
    }
}

fn render_row(result: &actors::Result<WriteOutcome>, request_id: &str) -> (u16, Vec<u8>) {
    match result {
        Ok(WriteOutcome::Row(row)) => {
            let view =
                RowResponseView { row: RowView::from(&**row), request_id: request_id.to_owned() };
            (200, serde_json::to_vec(&view).unwrap_or_default())
        }
        Ok(_) => (500, Vec::new()),
        Err(e) => render_error(e, request_id),
    }
}

fn render_deleted(result: &actors::Result<WriteOutcome>, request_id: &str) -> (u16, Vec<u8>) {
    match result {
        Ok(WriteOutcome::Deleted(_)) => (204, Vec::new()),
        Ok(_) => (500, Vec::new()),
        Err(e) => render_error(e, request_id),
    }
}

fn respond(status: u16, body: Vec<u8>) -> HttpResponse {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if body.is_empty() {
        HttpResponse::build(status).finish()
    } else {
        HttpResponse::build(status).content_type("application/json").body(body)
    }
}

/// The one write path shared by the four row writes.
async fn run_write<M>(
    state: &web::Data<AppState>,
    req: &HttpRequest,
    caller: &Caller,
    sheet_id: u64,
    body: &[u8],
    render: RenderFn,
    make: impl FnOnce(Option<IdemRequest>, u64) -> M,
) -> Result<HttpResponse, ApiError>
where
    M: Message<Result = WriteReply> + Send + 'static,
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
                let (status, body) = render(result, &rid);
                storable(status).then_some((status, body))
            }),
        }
    });
    let cap = caller.directory.row_cap(sheet_id);
    let reply = addr.send(make(idem, cap)).await.map_err(ApiError::internal)?;
    drop(claim);
    let (status, body) = match reply.stored {
        Some(stored) => stored,
        None => render(&reply.result, &request_id),
    };
    if status >= 500 {
        return Err(match reply.result {
            Err(e) => ApiError::from(e),
            Ok(_) => ApiError::internal("a write produced an unexpected outcome"),
        });
    }
    Ok(respond(status, body))
}

/// bulkAddRows.
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
    run_write(&state, &req, &caller, sheet_id, &body, render_bulk, |idem, cap| BulkAdd {
        items,
        cap,
        idem,
    })
    .await
}

/// bulkUpdateRows.
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
    run_write(&state, &req, &caller, sheet_id, &body, render_bulk, |idem, _| BulkUpdate {
        items,
        idem,
    })
    .await
}

/// patchRow.
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
    check_version(parsed.version, &[json!("version")])?;
    let item =
        PatchItem { version: parsed.version, cells: parsed.cells, base_cells: parsed.base_cells };
    run_write(&state, &req, &caller, sheet_id, &body, render_row, |idem, _| Patch {
        row_id,
        item,
        idem,
    })
    .await
}

/// deleteRow.
pub async fn delete_row(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let sheet_id = path_id(&req, "sheet_id")?;
    let row_id = path_id(&req, "row_id")?;
    run_write(&state, &req, &caller, sheet_id, &[], render_deleted, |idem, _| DeleteRow {
        row_id,
        idem,
    })
    .await
}
