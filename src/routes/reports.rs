//! `GET /reports` and `GET /reports/{report_id}`: public metadata of saved reports;
//! `POST /reports/{report_id}/run`: a page of a report's result, computed by the
//! [`actors::ReportRunner`].

use actix_web::{web, HttpRequest, HttpResponse};
use actors::model::Plan;
use actors::report::RunReport;
use actors::Target;

use crate::api_doc as oa;
use crate::auth::{Caller, Need};
use crate::cursor::Kind;
use crate::error::{ApiError, Code};
use crate::input::{paging, path_id};
use crate::response::ok;
use crate::state::AppState;
use crate::views::{
    ListView, ReportResponseView, ReportRunDataView, ReportRunView, ReportSummaryView,
};

/// listReports: reports whose project the key can read, by id.
#[utoipa::path(
    get,
    path = "/reports",
    operation_id = "listReports",
    tag = "reports",
    summary = "The reports the key can read, by id",
    params(oa::PageQuery),
    responses(
        (status = 200, description = "A page of report summaries; `nextCursor` is null on the \
            last page.", body = ListView<ReportSummaryView>),
        oa::ListErrors,
    )
)]
pub async fn list_reports(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let page = paging(&req, &state.cursors, Some((Kind::Reports, 0)))?;
    let (reports, more) =
        page.page_of(&caller.directory.reports, |r| caller.can_read(Target::Project(r.project_id)));
    let next_cursor =
        more.then(|| state.cursors.encode(Kind::Reports, 0, reports.last().map_or(0, |r| r.id)));
    ok(&ListView {
        data: reports.into_iter().map(ReportSummaryView::from).collect(),
        next_cursor,
        request_id: caller.request_id,
    })
}

/// The offset part of a report-run cursor's position (the high 32 bits name the run).
const OFFSET_MASK: u64 = u32::MAX as u64;

/// The report, once the caller can read its project.
pub fn readable_report(caller: &Caller, report_id: u64) -> Result<actors::model::Report, ApiError> {
    let what = format!("Report {report_id}");
    let report =
        caller.directory.reports.get(&report_id).ok_or_else(|| ApiError::not_found(&what))?;
    caller.authorize(Target::Project(report.project_id), Need::Read, &what)?;
    Ok(report.clone())
}

/// getReport.
#[utoipa::path(
    get,
    path = "/reports/{report_id}",
    operation_id = "getReport",
    tag = "reports",
    summary = "A report's public metadata",
    params(("report_id" = u64, Path, description = "Report id.", example = 8)),
    responses(
        (status = 200, description = "The report summary.", body = ReportResponseView),
        oa::ReadErrors,
    )
)]
pub async fn get_report(req: HttpRequest, caller: Caller) -> Result<HttpResponse, ApiError> {
    let report_id = path_id(&req, "report_id")?;
    let report = readable_report(&caller, report_id)?;
    ok(&ReportResponseView {
        report: ReportSummaryView::from(&report),
        request_id: caller.request_id,
    })
}

/// runReport: run a saved report and return one page of its result.
///
/// Checks in the contract's order: 422 for a malformed path id, `limit` or `cursor` (a cursor
/// is bound to its report); 404 when the key cannot read the report's project; 402 when the
/// report's owner is not on the paid plan; then the runner's 422 (the definition does not
/// compile) and 413 (a cap). Sources the key cannot read are skipped by the runner and only
/// counted.
#[utoipa::path(
    post,
    path = "/reports/{report_id}/run",
    operation_id = "runReport",
    tag = "reports",
    summary = "Run a saved report and get a page of its result grid",
    params(
        ("report_id" = u64, Path, description = "Report id.", example = 8),
        oa::PageQuery,
    ),
    responses(
        (status = 200, description = "A page of the result; `nextCursor` leads to the next.",
            body = ReportRunView),
        oa::ReadErrors,
        (status = 402, response = oa::PaymentRequired),
        (status = 413, response = oa::PayloadTooLarge),
    )
)]
pub async fn run_report(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let report_id = path_id(&req, "report_id")?;
    let page = paging(&req, &state.cursors, Some((Kind::ReportRun, report_id)))?;
    let report = readable_report(&caller, report_id)?;
    let owner_plan = caller.directory.users.get(&report.owner_id).map(|u| u.plan);
    if owner_plan != Some(Plan::Paid) {
        return Err(ApiError::new(
            Code::PaymentRequired,
            format!("Report {report_id} cannot run: its owner is not on a paid plan."),
        ));
    }
    let access = caller.clone();
    let run = RunReport {
        report_id,
        definition: report.definition.0.clone(),
        key_id: caller.key.id,
        can_read: Box::new(move |sheet_id| access.can_read(Target::Sheet(sheet_id))),
        offset: page.after.map_or(0, |p| p & OFFSET_MASK),
        run: page.after.map(|p| (p >> 32) as u32).filter(|r| *r != 0),
        limit: page.limit,
        caps: state.report_caps,
    };
    let result = state.service()?.reports().send(run).await.map_err(ApiError::internal)??;
    // The cursor names the run as well as the offset, so the next page comes from the same
    // result (see `actors::report`, "Paging").
    let next_cursor = result.next_offset.map(|offset| {
        let position = (u64::from(result.run) << 32) | (offset & OFFSET_MASK);
        state.cursors.encode(Kind::ReportRun, report_id, position)
    });
    ok(&ReportRunView {
        data: ReportRunDataView::new(&report, result),
        next_cursor,
        request_id: caller.request_id,
    })
}
