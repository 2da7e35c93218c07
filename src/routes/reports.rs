//! `GET /reports` and `GET /reports/{report_id}`: public metadata of saved reports.

use actix_web::{web, HttpRequest, HttpResponse};
use actors::Target;

use crate::auth::{Caller, Need};
use crate::cursor::Kind;
use crate::error::ApiError;
use crate::input::{paging, path_id};
use crate::routes::ok;
use crate::server::AppState;
use crate::views::{ListView, ReportResponseView, ReportSummaryView};

/// listReports: reports whose project the key can read, by id.
pub async fn list_reports(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let page = paging(&req, &state.cursors, Some((Kind::Reports, 0)))?;
    let start = page.after.map_or(0, |a| a.saturating_add(1));
    let mut reports: Vec<_> = caller
        .directory
        .reports
        .range(start..)
        .map(|(_, r)| r)
        .filter(|r| caller.can_read(Target::Project(r.project_id)))
        .take(page.limit + 1)
        .collect();
    let more = reports.len() > page.limit;
    reports.truncate(page.limit);
    let next_cursor =
        more.then(|| state.cursors.encode(Kind::Reports, 0, reports.last().map_or(0, |r| r.id)));
    ok(&ListView {
        data: reports.into_iter().map(ReportSummaryView::from).collect(),
        next_cursor,
        request_id: caller.request_id,
    })
}

/// The report, once the caller can read its project.
pub fn readable_report(caller: &Caller, report_id: u64) -> Result<actors::model::Report, ApiError> {
    let what = format!("Report {report_id}");
    let report =
        caller.directory.reports.get(&report_id).ok_or_else(|| ApiError::not_found(&what))?;
    caller.authorize(Target::Project(report.project_id), Need::Read, &what)?;
    Ok(report.clone())
}

/// getReport.
pub async fn get_report(req: HttpRequest, caller: Caller) -> Result<HttpResponse, ApiError> {
    let report_id = path_id(&req, "report_id")?;
    let report = readable_report(&caller, report_id)?;
    ok(&ReportResponseView {
        report: ReportSummaryView::from(&report),
        request_id: caller.request_id,
    })
}
