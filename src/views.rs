//! Response bodies (`*View`) in the API's camelCase shapes, the public API's and the admin
//! API's.
//!
//! Views are built from domain types field by field, so what the API shows is exactly what is
//! listed here: no folder id, parent id, attachments, key hash or report definition can leak by
//! a derive.

use std::collections::{BTreeMap, BTreeSet};

use actors::directory::fixture::IssuedSecret;
use actors::directory::ImportReport;
use actors::model::{ApiKey, Column, Grant, Millis, Plan, Report, Row, SheetMeta, UserId};
use actors::service::Counts;
use actors::shared::Event;
use actors::sheet::SheetState;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// RFC 3339 UTC with milliseconds (the one formatter, shared with the rows' JSON).
pub use actors::model::timestamp;

/// The list envelope: one page of items and the cursor that continues it.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListView<T> {
    /// This page's items, in the list's order.
    pub data: Vec<T>,
    /// Cursor of the next page, null on the last.
    pub next_cursor: Option<String>,
    /// The request's id, the same as the `X-Request-Id` header.
    pub request_id: String,
}

/// A sheet (SheetV1): its identity and kept counters; never its folder or members.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = SheetV1)]
pub struct SheetView {
    /// The sheet's id, as its paths name it (`/sheets/{sheet_id}`).
    pub id: u64,
    /// Display name, as the sheet was created with.
    pub name: String,
    /// The project holding the sheet; access flows down from it.
    pub project_id: u64,
    /// How many columns the sheet has (a kept counter: reading it costs O(1)).
    pub column_count: u64,
    /// How many rows the sheet holds, child rows included (a kept counter).
    pub row_count: u64,
    /// When the sheet was created (RFC 3339, UTC, milliseconds).
    pub created_at: Option<String>,
    /// Last row write.
    pub updated_at: Option<String>,
}

impl SheetView {
    /// From the directory's identity and the sheet's counters (O(1)).
    pub fn new(meta: &SheetMeta, s: &SheetState) -> Self {
        SheetView {
            id: meta.id,
            name: meta.name.clone(),
            project_id: meta.project_id,
            column_count: s.columns.len() as u64,
            row_count: s.rows.len() as u64,
            created_at: timestamp(s.created_at),
            updated_at: timestamp(s.updated_at),
        }
    }
}

/// The first page of rows inside a sheet.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RowsPage<'a> {
    /// Rows, as [`row_json`] renders them.
    #[schema(value_type = Vec<RowView>)]
    pub data: Vec<RowJson<'a>>,
    /// Continues on listRows.
    pub next_cursor: Option<String>,
}

/// getSheet's body (SheetV1WithChildren): the sheet, its columns and its first rows.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = SheetV1WithChildren)]
pub struct SheetWithChildrenView<'a> {
    /// The sheet's fields.
    #[serde(flatten)]
    pub sheet: SheetView,
    /// Columns by position.
    pub columns: Vec<ColumnView>,
    /// First page of rows.
    pub rows: RowsPage<'a>,
    /// The request's id, the same as the `X-Request-Id` header.
    pub request_id: String,
}

/// A column (ColumnV1): its type decides how the cells written to it are coerced.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = ColumnV1)]
pub struct ColumnView {
    /// The column's id: the key of its cell in a row's `cells`.
    pub id: u64,
    /// The sheet the column belongs to.
    pub sheet_id: u64,
    /// Display name; report definitions name columns by it.
    pub name: String,
    /// One of the nine column types (`text`, `number`, ..., `symbol`).
    #[serde(rename = "type")]
    pub ty: &'static str,
    /// Columns are listed by position, lowest first.
    pub position: i64,
    /// Options (option-bearing types only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options: Option<Vec<String>>,
    /// True for the sheet's primary column; a client may read a missing value as false.
    #[schema(required = false, default = false)]
    pub primary: bool,
}

impl From<&Column> for ColumnView {
    fn from(c: &Column) -> Self {
        ColumnView {
            id: c.id,
            sheet_id: c.sheet_id,
            name: c.name.clone(),
            ty: c.ty.as_str(),
            position: c.position,
            options: c.options.clone(),
            primary: c.primary,
        }
    }
}

/// Who made a row's last write (`updatedBy`): its source only, never a user.
#[derive(Serialize, ToSchema)]
pub struct UpdatedBy {
    /// `api` for rows written through this API.
    pub source: String,
}

/// A row (RowV1): its cells by column id, and the version a write must name.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = RowV1)]
pub struct RowView {
    /// Global and strictly increasing across the service; never reused.
    pub id: u64,
    /// The sheet the row belongs to.
    pub sheet_id: u64,
    /// 1 when the row is created, plus 1 for every write of it.
    #[schema(minimum = 1)]
    pub version: u64,
    /// Cells by column id, stored values verbatim.
    #[schema(schema_with = crate::schema::cells_schema)]
    pub cells: Map<String, Value>,
    /// When the row was created (RFC 3339, UTC, milliseconds).
    pub created_at: Option<String>,
    /// When the row was last written (RFC 3339, UTC, milliseconds).
    pub updated_at: Option<String>,
    /// Where the last write came from.
    pub updated_by: UpdatedBy,
}

/// A row's JSON (RowV1) in one piece, for a response that embeds it in a serialized value:
/// the row's own rendering, made when the row version was written ([`Row::json_pieces`]). The
/// same JSON as [`RowView`] (a test keeps them equal).
pub fn row_json(row: &Row) -> Box<RawValue> {
    row.to_json()
}

/// A row serialized as its JSON (RowV1), put together as it is written: for a response that
/// embeds rows in a serialized value.
#[derive(Clone, Copy, Debug)]
pub struct RowJson<'a>(pub &'a Row);

impl Serialize for RowJson<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.to_json().serialize(s)
    }
}

/// A row with the request id (RowResponse: getRow's and patchRow's body): the row's shared
/// rendering with `requestId` added as its last field, the same bytes as [`RowResponseView`]
/// without copying the row's cells more than once.
pub fn row_response(row: &Row, request_id: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(row.json_len() + request_id.len() + 16);
    row.write_json(&mut out);
    out.pop();
    out.extend_from_slice(b",\"requestId\":");
    serde_json::to_writer(&mut out, request_id).unwrap_or_default();
    out.push(b'}');
    out
}

/// A listRows page (`ListView<RowView>`) written straight from the rows' JSON: the same bytes
/// as serializing a [`ListView`] of [`row_json`]s, and with `fields` each row narrowed to those
/// cells as it is copied (no per-row buffer or re-parse).
pub fn rows_page<R: std::ops::Deref<Target = Row>>(
    rows: &[R],
    fields: Option<&BTreeSet<u64>>,
    next_cursor: Option<&str>,
    request_id: &str,
) -> Vec<u8> {
    let size: usize = rows.iter().map(|r| r.json_len_at_most() + 1).sum();
    let mut out = Vec::with_capacity(size + request_id.len() + 256);
    out.extend_from_slice(b"{\"data\":[");
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_row_json(&mut out, row, fields);
    }
    out.extend_from_slice(b"],\"nextCursor\":");
    serde_json::to_writer(&mut out, &next_cursor).unwrap_or_default();
    out.extend_from_slice(b",\"requestId\":");
    serde_json::to_writer(&mut out, request_id).unwrap_or_default();
    out.push(b'}');
    out
}

impl From<&Row> for RowView {
    fn from(r: &Row) -> Self {
        RowView {
            id: r.id,
            sheet_id: r.sheet_id(),
            version: r.version(),
            cells: r.cells().into_iter().map(|(k, v)| (k.to_string(), v.0)).collect(),
            created_at: timestamp(r.created_at),
            updated_at: timestamp(r.updated_at),
            updated_by: UpdatedBy { source: r.source().as_str().to_owned() },
        }
    }
}

/// Change: one entry of a sheet's change feed (listChanges, and each event of its stream).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = Change)]
pub struct ChangeView<'a> {
    /// Per-sheet sequence number: strictly increasing, gap-free, never reused.
    #[schema(minimum = 1)]
    pub seq: u64,
    /// What happened to the row.
    #[serde(rename = "type")]
    #[schema(schema_with = crate::schema::change_type_schema)]
    pub kind: &'static str,
    /// The row changed; a subtree's delete gives one change per row.
    pub row_id: u64,
    /// The row's version after the change; for `row.deleted` its last version.
    #[schema(minimum = 1)]
    pub version: u64,
    /// The row after the change, as listRows shows it; null for `row.deleted`.
    #[schema(value_type = Option<RowView>)]
    pub row: Option<RowJson<'a>>,
    /// When the change was made (RFC 3339, UTC).
    pub at: Option<String>,
}

impl<'a> ChangeView<'a> {
    /// The view of a change; its row is the row's shared rendering ([`row_json`]).
    pub fn new(change: &'a actors::sheet::Change) -> Self {
        use actors::sheet::ChangeKind;
        ChangeView {
            seq: change.seq,
            kind: match change.kind {
                ChangeKind::Created => "row.created",
                ChangeKind::Updated => "row.updated",
                ChangeKind::Deleted => "row.deleted",
            },
            row_id: change.row_id,
            version: change.version,
            row: change.row.as_deref().map(RowJson),
            at: timestamp(change.at),
        }
    }
}

/// A page of the change feed.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = ChangesPage)]
pub struct ChangesView<'a> {
    /// The changes after the cursor, in order.
    pub data: Vec<ChangeView<'a>>,
    /// The position after the last change returned (the same position when none was): never
    /// null. Store it and pass it back as `cursor`.
    pub next_cursor: String,
    /// The request's id, the same as the `X-Request-Id` header.
    pub request_id: String,
}

/// A row's JSON for a bulk reader (export) into `out`; with `fields`, only those cells.
pub fn write_row_json(out: &mut Vec<u8>, row: &Row, fields: Option<&BTreeSet<u64>>) {
    match fields {
        None => row.write_json(out),
        Some(fields) => row.write_json_fields(out, fields),
    }
}

/// A saved report (ReportSummaryV1); its definition is never shown.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = ReportSummaryV1)]
pub struct ReportSummaryView {
    /// The report's id, as its paths name it (`/reports/{report_id}`).
    pub id: u64,
    /// Display name; a run shows it as `reportName`.
    pub name: String,
    /// `row` or `summary`.
    #[serde(rename = "type")]
    pub ty: String,
    /// The project holding the report; who may see it follows the project.
    pub project_id: u64,
}

impl From<&Report> for ReportSummaryView {
    fn from(r: &Report) -> Self {
        ReportSummaryView {
            id: r.id,
            name: r.name.clone(),
            ty: r.kind().to_owned(),
            project_id: r.project_id,
        }
    }
}

/// One grant of an API key (ScopeGrant): a verb on a scope.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = ScopeGrant)]
pub struct GrantView {
    /// `read` or `write`.
    #[schema(schema_with = crate::schema::verb_schema)]
    pub verb: &'static str,
    /// `account`, `project`, `folder` or `sheet`.
    #[schema(schema_with = crate::schema::scope_type_schema)]
    pub scope_type: &'static str,
    /// Object id, null for account.
    pub scope_id: Option<u64>,
}

impl From<&Grant> for GrantView {
    fn from(g: &Grant) -> Self {
        GrantView { verb: g.verb.as_str(), scope_type: g.scope_type.as_str(), scope_id: g.scope_id }
    }
}

/// The calling key's rate-limit window (RateLimit), as the rate-limit headers show it.
#[derive(Serialize, ToSchema, Clone, Copy, Debug)]
#[schema(as = RateLimit)]
pub struct RateLimitView {
    /// Ceiling per minute.
    pub limit: u64,
    /// Left in the window.
    pub remaining: u64,
    /// Unix seconds when a slot frees.
    pub reset: i64,
}

/// getMe's body (MeResponseV1): the calling key, its owner's id, grants and window.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = MeResponseV1)]
pub struct MeView {
    /// The calling key's id.
    pub key_id: u64,
    /// The user whose access the key carries: the only owner data shown.
    pub owner_id: u64,
    /// The key's grants: it can do at most what they allow and its owner can do now.
    pub scopes: Vec<GrantView>,
    /// Current window.
    pub rate_limit: RateLimitView,
    /// The request's id, the same as the `X-Request-Id` header.
    pub request_id: String,
}

/// The outcome of one item of a bulk write (BulkResultItem).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BulkResultItem)]
pub struct BulkResultItemView<'a> {
    /// Position in the request.
    pub index: usize,
    /// `succeeded` or `failed`.
    #[schema(schema_with = crate::schema::bulk_status_schema)]
    pub status: &'static str,
    /// The row, when succeeded, as [`row_json`] renders it.
    #[schema(value_type = Option<RowView>)]
    pub row: Option<RowJson<'a>>,
    /// The error envelope without requestId, when failed.
    #[schema(value_type = Option<crate::schema::BulkItemError>)]
    pub error: Option<Value>,
    /// bulkUpsert only, on a succeeded item: `created`, `updated` or `unchanged` (nothing
    /// written, `row` is the current row).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::schema::upsert_action_schema, required = false)]
    pub action: Option<&'static str>,
}

/// The body of every bulk write (BulkWriteResponse): one result per item, in order.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = BulkWriteResponse)]
pub struct BulkWriteView<'a> {
    /// One per input row, in order.
    pub results: Vec<BulkResultItemView<'a>>,
    /// Items written (or, for an upsert, found `unchanged`).
    pub succeeded_count: usize,
    /// Items refused; the others still took effect.
    pub failed_count: usize,
    /// The request's id, the same as the `X-Request-Id` header.
    pub request_id: String,
}

/// A row with the request id (patchRow's response).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = RowResponse)]
pub struct RowResponseView {
    /// The row's own fields, flattened into the body.
    #[serde(flatten)]
    pub row: RowView,
    /// The request's id, the same as the `X-Request-Id` header.
    pub request_id: String,
}

/// A report summary with the request id (getReport's response).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = ReportSummaryResponse)]
pub struct ReportResponseView {
    /// The report summary's fields, flattened into the body.
    #[serde(flatten)]
    pub report: ReportSummaryView,
    /// The request's id, the same as the `X-Request-Id` header.
    pub request_id: String,
}

/// One output column of a report run.
#[derive(Serialize, ToSchema)]
#[schema(as = ReportColumn)]
pub struct ReportColumnView {
    /// 1, 2, 3 … in output order.
    pub id: u64,
    /// The source column's name, or the aggregate's (`sum(Hours)`).
    pub name: String,
    /// The column type (`text` when sources disagree; `number` for count, sum, avg).
    #[serde(rename = "type")]
    pub ty: &'static str,
}

/// One output row of a report run.
#[derive(Serialize, ToSchema)]
#[schema(as = ReportRow)]
pub struct ReportRowView {
    /// Values keyed by output column id as a string.
    #[schema(schema_with = crate::schema::cells_schema)]
    pub cells: Map<String, Value>,
}

/// One page of a report run (ReportRun): a flat or aggregated grid.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = ReportRun)]
pub struct ReportRunDataView {
    /// The id of the report run.
    pub report_id: u64,
    /// The report's name at the time of the run.
    pub report_name: String,
    /// `flat` (row reports) or `aggregated` (summary reports).
    #[schema(schema_with = crate::schema::report_mode_schema)]
    pub mode: &'static str,
    /// Output columns.
    pub columns: Vec<ReportColumnView>,
    /// This page's rows.
    pub rows: Vec<ReportRowView>,
    /// Rows read from readable sources.
    pub scanned_rows: u64,
    /// Rows (flat) or groups (aggregated) in the whole result.
    pub total_matched: u64,
    /// Sources skipped because the key cannot read them (or they are gone).
    pub sources_omitted_for_access: u64,
}

impl ReportRunDataView {
    /// From the report and one page of its run.
    pub fn new(report: &Report, page: actors::report::RunPage) -> Self {
        let ids: Vec<String> = (1..=page.columns.len()).map(|i| i.to_string()).collect();
        ReportRunDataView {
            report_id: report.id,
            report_name: report.name.clone(),
            mode: page.mode.as_str(),
            columns: page
                .columns
                .iter()
                .enumerate()
                .map(|(i, c)| ReportColumnView {
                    id: i as u64 + 1,
                    name: c.name.clone(),
                    ty: c.ty.as_str(),
                })
                .collect(),
            rows: page
                .rows
                .into_iter()
                .map(|values| ReportRowView { cells: ids.iter().cloned().zip(values).collect() })
                .collect(),
            scanned_rows: page.scanned_rows,
            total_matched: page.total_matched,
            sources_omitted_for_access: page.sources_omitted,
        }
    }
}

/// ReportRunEnvelopeV1 (runReport's response).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = ReportRunEnvelopeV1)]
pub struct ReportRunView {
    /// This page of the run.
    pub data: ReportRunDataView,
    /// Cursor of the next page, null on the last.
    pub next_cursor: Option<String>,
    /// The request's id, the same as the `X-Request-Id` header.
    pub request_id: String,
}

// ---------------------------------------------------------------------------------------------
// The admin API's bodies. Fields are listed in alphabetical order where the admin API has always
// written them that way, so its bytes stay as they were.
// ---------------------------------------------------------------------------------------------

/// A list on the admin API: `{"data": [...]}`, no paging cursor.
#[derive(Serialize)]
pub struct AdminListView<T> {
    /// Every item: admin lists are not paged.
    pub data: Vec<T>,
}

/// `GET /admin/v1/health`.
#[derive(Serialize)]
pub struct HealthView {
    /// The log archive (with `--archive-dir`): its position, lag and last error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub archive: Option<ArchiveView>,
    /// Why the data dir takes no writes, or the archive is behind by an error or has a gap;
    /// absent while neither.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `ok`, or `degraded` while the data dir takes no writes or the archive is behind
    /// because of an error (or lost records to a gap).
    pub status: &'static str,
}

/// The log archive in `GET /admin/v1/health`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveView {
    /// The archive dir.
    pub dir: String,
    /// Every record up to this LSN is in a sealed segment.
    pub position: u64,
    /// The log's durable LSN.
    pub durable_lsn: u64,
    /// Durable records not archived yet.
    pub lag_records: u64,
    /// Since when the oldest record not archived yet waits (RFC 3339); null when none.
    pub behind_since: Option<String>,
    /// When the last segment was sealed; null before the first.
    pub last_sealed_at: Option<String>,
    /// Why the archive cannot write, while it fails; null once it writes again.
    pub last_error: Option<String>,
    /// Ranges of records the archive lost (the log dropped them first), `[from, to]`.
    pub gaps: Vec<[u64; 2]>,
}

impl HealthView {
    /// `ok` without a reason, `degraded` with one: the data dir's, else the archive's.
    pub fn new(
        unwritable_reason: Option<String>,
        archive: Option<actors::archive::ArchiveStatus>,
    ) -> Self {
        let reason = unwritable_reason.or_else(|| archive.as_ref().and_then(|a| a.trouble()));
        let status = if reason.is_some() { "degraded" } else { "ok" };
        let archive = archive.map(|a| ArchiveView {
            dir: a.dir.display().to_string(),
            position: a.position,
            durable_lsn: a.durable_lsn,
            lag_records: a.lag_records,
            behind_since: a.behind_since.and_then(timestamp),
            last_sealed_at: a.last_sealed_at.and_then(timestamp),
            last_error: a.last_error,
            gaps: a.gaps.iter().map(|&(from, to)| [from, to]).collect(),
        });
        HealthView { archive, reason, status }
    }
}

/// `POST /admin/v1/import`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportView {
    /// Objects added, by kind.
    pub imported: BTreeMap<&'static str, usize>,
    /// Secrets generated for keys that came without one: shown here once, never again.
    pub issued_keys: Vec<IssuedKeyView>,
}

impl From<&ImportReport> for ImportView {
    fn from(report: &ImportReport) -> Self {
        ImportView {
            imported: report.counts.iter().copied().collect(),
            issued_keys: report.issued.iter().map(IssuedKeyView::from).collect(),
        }
    }
}

/// A key an import generated a secret for.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IssuedKeyView {
    /// The id of the key the import created.
    pub key_id: u64,
    /// The key's name, as the fixture gave it.
    pub name: String,
    /// The user whose access the key carries.
    pub owner_id: u64,
    /// The whole secret, shown in this answer only: only its hash is kept.
    pub secret: String,
}

impl From<&IssuedSecret> for IssuedKeyView {
    fn from(k: &IssuedSecret) -> Self {
        IssuedKeyView {
            key_id: k.key_id,
            name: k.name.clone(),
            owner_id: k.owner_id,
            secret: k.secret.clone(),
        }
    }
}

/// `POST /admin/v1/keys` (201): the one response that shows the secret.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatedKeyView {
    /// Expiry, null for never.
    pub expires_at: Option<String>,
    /// The new key's id.
    pub key_id: u64,
    /// `svc_live_` and the first characters of the secret.
    pub prefix: String,
    /// The whole secret, shown in this answer only: only its hash is kept.
    pub secret: String,
}

impl CreatedKeyView {
    /// The view of a key just created with `secret`.
    pub fn new(key: &ApiKey, secret: String) -> Self {
        CreatedKeyView {
            expires_at: key.expires_at.and_then(timestamp),
            key_id: key.id,
            prefix: key.prefix.clone(),
            secret,
        }
    }
}

/// A key as the admin side shows it: never its secret or hash, only the visible prefix.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyView {
    /// The key's id (`keyId` on the public API).
    pub key_id: u64,
    /// The user whose access the key carries.
    pub owner_id: UserId,
    /// The name given at creation: a label for people, not a credential.
    pub name: String,
    /// `svc_live_` and the first characters of the secret.
    pub prefix: String,
    /// The key's grants, as `GET /api/v1/me` shows them to the key.
    pub grants: Vec<GrantView>,
    /// `active`, `revoked` or `expired`.
    pub state: &'static str,
    /// Creation time.
    pub created_at: Option<String>,
    /// Expiry, null for never.
    pub expires_at: Option<String>,
}

impl KeyView {
    /// The view of `key` at `now`.
    pub fn new(key: &ApiKey, now: Millis) -> Self {
        KeyView {
            key_id: key.id,
            owner_id: key.owner_id,
            name: key.name.clone(),
            prefix: key.prefix.clone(),
            grants: key.grants.iter().map(GrantView::from).collect(),
            state: key.state(now).as_str(),
            created_at: timestamp(key.created_at),
            expires_at: key.expires_at.and_then(timestamp),
        }
    }
}

/// `PUT /admin/v1/users/{id}/plan`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanView {
    /// The plan now.
    pub plan: Plan,
    /// The user whose plan was set.
    pub user_id: UserId,
}

/// One internal event (`GET /admin/v1/events`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventView {
    /// When it happened.
    pub at: Option<String>,
    /// The row deleted.
    pub row_id: u64,
    /// Position in the outbox; pass the last one seen as `after` to resume.
    pub seq: u64,
    /// The sheet the row belonged to.
    pub sheet_id: u64,
    /// `ROW_DELETED`.
    #[serde(rename = "type")]
    pub kind: String,
}

impl From<&Event> for EventView {
    fn from(e: &Event) -> Self {
        EventView {
            at: timestamp(e.at),
            row_id: e.row_id,
            seq: e.seq,
            sheet_id: e.sheet_id,
            kind: e.kind.clone(),
        }
    }
}

/// `GET /admin/v1/stats`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatsView {
    /// Bytes of attachments of live rows.
    pub attachment_bytes: u64,
    /// Attachments of live rows.
    pub attachments: u64,
    /// API keys, in any state.
    pub keys: usize,
    /// Projects, of every owner.
    pub projects: usize,
    /// Rows in every sheet.
    pub rows: u64,
    /// Sheets, of every project.
    pub sheets: usize,
    /// Users, on any plan.
    pub users: usize,
    /// The last durable LSN.
    pub wal_lsn: u64,
}

impl StatsView {
    /// From the service's counts and its durable LSN.
    pub fn new(c: &Counts, durable_lsn: u64) -> Self {
        StatsView {
            attachment_bytes: c.attachment_bytes,
            attachments: c.attachments,
            keys: c.keys,
            projects: c.projects,
            rows: c.rows,
            sheets: c.sheets,
            users: c.users,
            wal_lsn: durable_lsn,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use actors::model::{Json, Row, SOURCE_API};
    use serde_json::json;

    use super::*;

    #[test]
    fn a_rows_json_is_byte_for_byte_its_view_and_a_new_version_renders_anew() {
        let cells: BTreeMap<u64, Json> = [
            (100, json!("text \"quoted\" é")),
            (102, json!({"value": 1.5, "format": "0.0"})),
            (103, json!(true)),
            (107, json!(["a", "c"])),
            (2, json!(null)),
        ]
        .into_iter()
        .map(|(k, v)| (k, Json(v)))
        .collect();
        let row = Row::new(7, 10, cells.clone(), SOURCE_API, 1_767_225_600_123);
        let rendered = row_json(&row).get().to_owned();
        assert_eq!(rendered, serde_json::to_string(&RowView::from(&row)).unwrap());

        let next = row.next(&cells, 1_767_225_601_000);
        assert_eq!(row_json(&next).get(), serde_json::to_string(&RowView::from(&next)).unwrap());
        assert_ne!(row_json(&next).get(), rendered);

        let view = RowResponseView { row: RowView::from(&row), request_id: "req_1\"x".into() };
        assert_eq!(
            String::from_utf8(row_response(&row, "req_1\"x")).unwrap(),
            serde_json::to_string(&view).unwrap()
        );
    }

    #[test]
    fn a_rows_page_is_byte_for_byte_its_list_view_and_fields_narrow_each_row() {
        let cells = |n: i64| -> BTreeMap<u64, Json> {
            [(100, json!(format!("row \"{n}\""))), (103, json!(n % 2 == 0)), (2, json!(n))]
                .into_iter()
                .map(|(k, v)| (k, Json(v)))
                .collect()
        };
        let rows: Vec<std::sync::Arc<Row>> = (1..=3)
            .map(|n| std::sync::Arc::new(Row::new(n as u64, 10, cells(n), SOURCE_API, 1_000 * n)))
            .collect();
        for (next, id) in [(Some("c\"1"), "req_1"), (None, "req_\u{e9}")] {
            let view = ListView {
                data: rows.iter().map(|r| row_json(r)).collect::<Vec<_>>(),
                next_cursor: next.map(str::to_owned),
                request_id: id.to_owned(),
            };
            let page = rows_page(&rows, None, next, id);
            assert_eq!(String::from_utf8(page).unwrap(), serde_json::to_string(&view).unwrap());
        }
        let empty =
            ListView::<RowView> { data: Vec::new(), next_cursor: None, request_id: "r".into() };
        assert_eq!(rows_page::<&Row>(&[], None, None, "r"), serde_json::to_vec(&empty).unwrap());

        let fields = BTreeSet::from([103, 2]);
        let page: Value =
            serde_json::from_slice(&rows_page(&rows, Some(&fields), None, "r")).unwrap();
        for (shown, row) in page["data"].as_array().unwrap().iter().zip(&rows) {
            let mut view = serde_json::to_value(RowView::from(&**row)).unwrap();
            view["cells"].as_object_mut().unwrap().remove("100");
            assert_eq!(shown, &view);
        }
    }
}

/// The last delivery attempt of a webhook.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastDeliveryView {
    /// When the attempt started (RFC 3339, UTC).
    pub at: Option<String>,
    /// The receiver's HTTP status; null when it did not answer.
    pub status: Option<u16>,
    /// Why the attempt failed (a non-2xx, a timeout, a refused connection or address); null
    /// on a success.
    pub error: Option<String>,
    /// How long the attempt took, in milliseconds.
    pub duration_ms: u64,
}

/// A webhook (Webhook): a subscription that pushes a sheet's change feed to a URL.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = Webhook)]
pub struct WebhookView {
    /// The webhook's id, as its paths name it (`/webhooks/{webhook_id}`).
    pub id: u64,
    /// The sheet whose changes it delivers.
    pub sheet_id: u64,
    /// Where deliveries are posted.
    pub url: String,
    /// The creator's note.
    pub description: Option<String>,
    /// `active` while it delivers, `disabled` once it stopped (see `disabledReason`).
    #[schema(schema_with = crate::schema::webhook_status_schema)]
    pub status: &'static str,
    /// Why it stopped: `failing` (no success for the server's disable period, 3 days by
    /// default), `access_lost` (its key was revoked or expired, or can no longer read the
    /// sheet) or `cursor_expired` (the next change left the feed's retention); null while
    /// active.
    #[schema(schema_with = crate::schema::webhook_disabled_reason_schema)]
    pub disabled_reason: Option<&'static str>,
    /// A change-feed cursor: the position after the last acknowledged delivery (listChanges
    /// takes it).
    pub cursor: String,
    /// How many durable changes wait to be delivered.
    pub pending_changes: u64,
    /// The last attempt; null before the first.
    pub last_delivery: Option<LastDeliveryView>,
    /// Failed attempts since the last success.
    pub consecutive_failures: u32,
    /// When it was made (RFC 3339, UTC).
    pub created_at: Option<String>,
}

impl WebhookView {
    /// The view of `w`; `cursor` is its position encoded, `pending` the changes after it.
    pub fn new(w: &actors::webhook::Webhook, cursor: String, pending: u64) -> Self {
        WebhookView {
            id: w.id,
            sheet_id: w.sheet_id,
            url: w.url.clone(),
            description: w.description.clone(),
            status: if w.is_active() { "active" } else { "disabled" },
            disabled_reason: w.disabled.map(|r| r.as_str()),
            cursor,
            pending_changes: pending,
            last_delivery: w.last_delivery.as_ref().map(|a| LastDeliveryView {
                at: timestamp(a.at),
                status: a.status,
                error: a.error.clone(),
                duration_ms: a.duration_ms,
            }),
            consecutive_failures: w.consecutive_failures,
            created_at: timestamp(w.created_at),
        }
    }
}

/// getWebhook's and enableWebhook's body: the webhook and the request's id.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = WebhookResponse)]
pub struct WebhookReplyView {
    /// The webhook's fields.
    #[serde(flatten)]
    pub webhook: WebhookView,
    /// The request's id, the same as the `X-Request-Id` header.
    pub request_id: String,
}

/// createWebhook's body: the webhook with its signing secret, shown this once only.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = WebhookCreated)]
pub struct WebhookCreatedView {
    /// The webhook's fields.
    #[serde(flatten)]
    pub webhook: WebhookView,
    /// The signing secret: `whsec_` and the base64 of 32 random bytes. Deliveries are signed
    /// with its decoded bytes (Standard Webhooks v1). Shown in this answer only.
    #[schema(pattern = "^whsec_[A-Za-z0-9+/]{43}=$")]
    pub secret: String,
    /// The request's id, the same as the `X-Request-Id` header.
    pub request_id: String,
}

/// What a webhook posts (WebhookMessage): up to 100 changes of the sheet, in feed order.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = WebhookMessage)]
pub struct WebhookMessageView<'a> {
    /// Always `sheet.changes`.
    #[serde(rename = "type")]
    #[schema(schema_with = crate::schema::webhook_message_type_schema)]
    pub kind: &'static str,
    /// The webhook delivering.
    pub webhook_id: u64,
    /// The sheet changed.
    pub sheet_id: u64,
    /// 1 to 100 changes, as listChanges shows them, in feed order with no gap (rendered once
    /// for every webhook of the sheet at that range).
    #[schema(value_type = Vec<ChangeView>)]
    pub data: &'a serde_json::value::RawValue,
    /// The feed position after the last change here: listChanges continues from it.
    pub next_cursor: String,
}
