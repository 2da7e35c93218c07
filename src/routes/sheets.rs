//! `GET /sheets`, `GET /sheets/{sheet_id}`, `GET /sheets/{sheet_id}/columns`.

use actix_web::{web, HttpRequest, HttpResponse};
use actors::sheet::{Describe, ListColumns, Overview, SheetSummary};
use actors::Target;
use futures_util::future::try_join_all;

use crate::auth::{Caller, Need};
use crate::cursor::Kind;
use crate::error::ApiError;
use crate::input::{paging, path_id};
use crate::openapi as oa;
use crate::routes::ok;
use crate::server::AppState;
use crate::views::{ColumnView, ListView, RowView, RowsPage, SheetView, SheetWithChildrenView};

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
        (status = 401, response = oa::Unauthorized),
        (status = 422, response = oa::ValidationFailed),
        (status = 429, response = oa::RateLimited),
        (status = 500, response = oa::InternalError),
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
    let summaries: Vec<SheetSummary> = try_join_all(metas.iter().map(|m| {
        let addr = state.service.sheet(m.id);
        async move {
            match addr {
                Some(a) => a.send(Describe).await.map_err(ApiError::internal),
                None => Err(ApiError::internal(format!("sheet {} has no actor", m.id))),
            }
        }
    }))
    .await?;
    let lsn = summaries.iter().map(|s| s.visible_lsn).max().unwrap_or(0);
    state.service.visible(lsn).await?;
    let next_cursor =
        more.then(|| state.cursors.encode(Kind::Sheets, 0, metas.last().map_or(0, |m| m.id)));
    ok(&ListView {
        data: metas.iter().zip(&summaries).map(|(m, s)| SheetView::new(m, s)).collect(),
        next_cursor,
        request_id: caller.request_id,
    })
}

/// The sheet's actor, once the caller may touch it as `need` says.
pub fn sheet_actor(
    state: &AppState,
    caller: &Caller,
    sheet_id: u64,
    need: Need,
) -> Result<actix::Addr<actors::SheetActor>, ApiError> {
    let what = format!("Sheet {sheet_id}");
    caller.authorize(Target::Sheet(sheet_id), need, &what)?;
    state.service.sheet(sheet_id).ok_or_else(|| ApiError::not_found(&what))
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
    ),
    responses(
        (status = 200, description = "The sheet; `rows.nextCursor` continues on listRows.",
            body = SheetWithChildrenView),
        (status = 401, response = oa::Unauthorized),
        (status = 404, response = oa::NotFound),
        (status = 422, response = oa::ValidationFailed),
        (status = 429, response = oa::RateLimited),
        (status = 500, response = oa::InternalError),
    )
)]
pub async fn get_sheet(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let sheet_id = path_id(&req, "sheet_id")?;
    let page = paging(&req, &state.cursors, None)?;
    let addr = sheet_actor(&state, &caller, sheet_id, Need::Read)?;
    // Authorization found the sheet in this same directory snapshot.
    let meta = caller
        .directory
        .sheets
        .get(&sheet_id)
        .cloned()
        .ok_or_else(|| ApiError::not_found(format!("Sheet {sheet_id}")))?;
    let (summary, columns, page) =
        addr.send(Overview { limit: page.limit }).await.map_err(ApiError::internal)?;
    state.service.visible(summary.visible_lsn).await?;
    let (rows, more) = (page.rows, page.more);
    let next_cursor =
        more.then(|| state.cursors.encode(Kind::Rows, sheet_id, rows.last().map_or(0, |r| r.id)));
    ok(&SheetWithChildrenView {
        sheet: SheetView::new(&meta, &summary),
        columns: columns.iter().map(ColumnView::from).collect(),
        rows: RowsPage { data: rows.iter().map(RowView::from).collect(), next_cursor },
        request_id: caller.request_id,
    })
}

/// listColumns: by position, one page.
#[utoipa::path(
    get,
    path = "/sheets/{sheet_id}/columns",
    operation_id = "listColumns",
    tag = "sheets",
    summary = "A sheet's columns, by position",
    params(("sheet_id" = u64, Path, description = "Sheet id.", example = 10)),
    responses(
        (status = 200, description = "Every column, in one page (`nextCursor` is always null).",
            body = ListView<ColumnView>),
        (status = 401, response = oa::Unauthorized),
        (status = 404, response = oa::NotFound),
        (status = 422, response = oa::ValidationFailed),
        (status = 429, response = oa::RateLimited),
        (status = 500, response = oa::InternalError),
    )
)]
pub async fn list_columns(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let sheet_id = path_id(&req, "sheet_id")?;
    let addr = sheet_actor(&state, &caller, sheet_id, Need::Read)?;
    let (columns, lsn) = addr.send(ListColumns).await.map_err(ApiError::internal)?;
    state.service.visible(lsn).await?;
    ok(&ListView {
        data: columns.iter().map(ColumnView::from).collect(),
        next_cursor: None,
        request_id: caller.request_id,
    })
}
