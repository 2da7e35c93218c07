//! `GET /sheets`, `GET /sheets/{sheet_id}`, `GET /sheets/{sheet_id}/columns`.
//!
//! Every read answers from the sheet's published snapshot ([`sheet_snapshot`]); getSheet and
//! listColumns carry its `ETag` and answer a matching `If-None-Match` with 304
//! ([`crate::conditional`]).

use actix_web::{web, HttpRequest, HttpResponse};
use std::sync::Arc;

use actors::sheet::SheetSnapshot;
use actors::Target;

use crate::api_doc as oa;
use crate::auth::{Caller, Need};
use crate::conditional::{self, sheet_tag, SheetRead};
use crate::cursor::Kind;
use crate::error::ApiError;
use crate::input::{paging, path_id};
use crate::response::ok;
use crate::state::AppState;
use crate::views::{ColumnView, ListView, RowJson, RowsPage, SheetView, SheetWithChildrenView};

/// listSheets: readable sheets by id, keyset paged.
#[utoipa::path(
    get,
    path = "/sheets",
    operation_id = "listSheets",
    tag = "sheets",
    summary = "The sheets the key can read, by id",
    params(oa::PageQuery),
    responses(
        (status = 200, description = "A page of sheets; `nextCursor` is null on the last page.",
            body = ListView<SheetView>),
        oa::ListErrors,
    )
)]
pub async fn list_sheets(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let page = paging(&req, &state.cursors, Some((Kind::Sheets, 0)))?;
    let (metas, more) =
        page.page_of(&caller.directory.sheets, |m| caller.can_read(Target::Sheet(m.id)));
    let reads = state.reads_of(caller.local)?;
    let data = metas
        .iter()
        .map(|m| match reads.sheet_snapshot(m.id) {
            Some(snapshot) => Ok(SheetView::new(m, &snapshot.state)),
            None => Err(ApiError::internal(format!("sheet {} has no actor", m.id))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let next_cursor =
        more.then(|| state.cursors.encode(Kind::Sheets, 0, metas.last().map_or(0, |m| m.id)));
    ok(&ListView { data, next_cursor, request_id: caller.request_id })
}

/// The sheet as of its last durable write, once the caller may read it.
pub fn sheet_snapshot(
    state: &AppState,
    caller: &Caller,
    sheet_id: u64,
) -> Result<Arc<SheetSnapshot>, ApiError> {
    let what = format!("Sheet {sheet_id}");
    caller.authorize(Target::Sheet(sheet_id), Need::Read, &what)?;
    state.reads_of(caller.local)?.sheet_snapshot(sheet_id).ok_or_else(|| ApiError::not_found(&what))
}

/// The sheet's actor (its one writer), once the caller may touch it as `need` says.
pub fn sheet_actor(
    state: &AppState,
    caller: &Caller,
    sheet_id: u64,
    need: Need,
) -> Result<actix::Addr<actors::SheetActor>, ApiError> {
    let what = format!("Sheet {sheet_id}");
    caller.authorize(Target::Sheet(sheet_id), need, &what)?;
    state.service()?.sheet(sheet_id).ok_or_else(|| ApiError::not_found(&what))
}

/// getSheet: the sheet, its columns and the first page of rows.
#[utoipa::path(
    get,
    path = "/sheets/{sheet_id}",
    operation_id = "getSheet",
    tag = "sheets",
    summary = "A sheet with its columns and first page of rows",
    params(
        ("sheet_id" = u64, Path, description = "Sheet id.", example = 10),
        oa::LimitQuery,
        oa::IfNoneMatch,
    ),
    responses(
        (status = 200, description = "The sheet; `rows.nextCursor` continues on listRows.",
            body = SheetWithChildrenView),
        oa::ReadErrors,
        (status = 304, response = oa::NotModified),
    )
)]
pub async fn get_sheet(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let sheet_id = path_id(&req, "sheet_id")?;
    let page = paging(&req, &state.cursors, None)?;
    let snapshot = sheet_snapshot(&state, &caller, sheet_id)?;
    // Authorization found the sheet in this same directory snapshot.
    let meta = caller
        .directory
        .sheets
        .get(&sheet_id)
        .cloned()
        .ok_or_else(|| ApiError::not_found(format!("Sheet {sheet_id}")))?;
    let tag = sheet_tag(SheetRead::GetSheet, &snapshot, Some(&page), 0);
    conditional::respond(&req, tag, || {
        let sheet = &snapshot.state;
        let (rows, more) = sheet.page(None, page.limit);
        let next_cursor = more
            .then(|| state.cursors.encode(Kind::Rows, sheet_id, rows.last().map_or(0, |r| r.id)));
        ok(&SheetWithChildrenView {
            sheet: SheetView::new(&meta, sheet),
            columns: sheet.columns_by_position().iter().map(ColumnView::from).collect(),
            rows: RowsPage { data: rows.iter().map(|r| RowJson(r)).collect(), next_cursor },
            request_id: caller.request_id,
        })
    })
}

/// listColumns: by position, one page.
#[utoipa::path(
    get,
    path = "/sheets/{sheet_id}/columns",
    operation_id = "listColumns",
    tag = "sheets",
    summary = "A sheet's columns, by position",
    params(("sheet_id" = u64, Path, description = "Sheet id.", example = 10), oa::IfNoneMatch),
    responses(
        (status = 200, description = "Every column, in one page (`nextCursor` is always null).",
            body = ListView<ColumnView>),
        oa::ReadErrors,
        (status = 304, response = oa::NotModified),
    )
)]
pub async fn list_columns(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let sheet_id = path_id(&req, "sheet_id")?;
    let snapshot = sheet_snapshot(&state, &caller, sheet_id)?;
    conditional::respond(&req, sheet_tag(SheetRead::ListColumns, &snapshot, None, 0), || {
        ok(&ListView {
            data: snapshot.state.columns_by_position().iter().map(ColumnView::from).collect(),
            next_cursor: None,
            request_id: caller.request_id,
        })
    })
}
