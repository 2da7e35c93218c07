//! Consistent export: `GET /sheets/{sheet_id}/export?format=ndjson|csv` (exportRows).
//!
//! Every row of one published snapshot, by id, streamed a chunk at a time: the response holds
//! the snapshot (an O(1) copy, so writers go on untouched) and a position, never the rows it
//! has sent, so memory does not grow with the sheet. Each row's JSON is copied into the chunk
//! ([`crate::views::write_row_json`]). The
//! `Sheet-Changes-Cursor` header is the change feed's position at the snapshot: following the
//! feed from it applies every later change once and none twice.

use std::collections::BTreeSet;
use std::sync::Arc;

use actix_web::web::Bytes;
use actix_web::{web, HttpRequest, HttpResponse};
use actors::model::{Column, Row, RowId};
use actors::report::compile::SheetFilter;
use actors::sheet::SheetSnapshot;
use futures_util::stream;
use serde_json::{json, Value};

use crate::api_doc as oa;
use crate::auth::Caller;
use crate::cursor::Kind;
use crate::error::ApiError;
use crate::input::{path_id, query_pairs, row_query};
use crate::routes::rows::checked_query;
use crate::routes::sheets::sheet_snapshot;
use crate::state::AppState;

/// Rows rendered per chunk of the body.
const CHUNK_ROWS: usize = 1000;
/// Most rows a filtered chunk looks at, so one chunk of a rare match stays short.
const CHUNK_EXAMINED: usize = 20_000;
/// The export's change-feed position (see the module docs).
pub const CURSOR_HEADER: &str = "Sheet-Changes-Cursor";

/// The two formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Ndjson,
    Csv,
}

/// exportRows: every row as of one instant.
#[utoipa::path(
    get,
    path = "/sheets/{sheet_id}/export",
    operation_id = "exportRows",
    tag = "changes",
    summary = "Every row of a sheet as of one instant, streamed, with the feed's cursor",
    description = "The rows of one instant, by id, streamed in constant memory (writers are not \
        held). `Sheet-Changes-Cursor` is the change feed's cursor of that instant: export once, \
        then follow listChanges from it, and nothing is missed or applied twice. `fields` and \
        `filter` as on listRows (with no examined-rows cap: the whole sheet is read).",
    params(
        ("sheet_id" = u64, Path, description = "Sheet id.", example = 10),
        oa::ExportQuery,
        oa::RowsQuery,
    ),
    responses(
        (status = 200, description = "NDJSON (one RowV1 per line) or CSV (RFC 4180).",
            content(
                (String = "application/x-ndjson"),
                (String = "text/csv"),
            ),
            headers(("Sheet-Changes-Cursor" = String,
                description = "The change-feed cursor of the exported instant."))),
        oa::ReadErrors,
    )
)]
pub async fn export_rows(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let sheet_id = path_id(&req, "sheet_id")?;
    let format = format_param(&req)?;
    let query = row_query(&req)?;
    let snapshot = sheet_snapshot(&state, &caller, sheet_id)?;
    let filter = checked_query(&query, &snapshot.state)?;
    let cursor = state.cursors.encode(Kind::Changes, sheet_id, snapshot.state.changes.next_seq());
    let columns: Vec<Column> = snapshot
        .state
        .columns_by_position()
        .iter()
        .filter(|c| query.fields.as_ref().is_none_or(|f| f.contains(&c.id)))
        .cloned()
        .collect();
    let header = match format {
        Format::Csv => csv_header(&columns)?,
        Format::Ndjson => Vec::new(),
    };
    let export = Export {
        snapshot,
        after: None,
        done: false,
        format,
        fields: query.fields,
        filter: filter.map(Arc::new),
        columns: columns.iter().map(|c| Some(c.id)).collect(),
        header,
    };
    let body = stream::unfold(export, |mut e| async move {
        let chunk = e.next_chunk()?;
        Some((Ok::<_, actix_web::Error>(Bytes::from(chunk)), e))
    });
    let content_type = match format {
        Format::Ndjson => "application/x-ndjson",
        Format::Csv => "text/csv; charset=utf-8",
    };
    Ok(HttpResponse::Ok()
        .content_type(content_type)
        .insert_header((CURSOR_HEADER, cursor))
        .streaming(body))
}

/// `format`: `ndjson` (default) or `csv`.
fn format_param(req: &HttpRequest) -> Result<Format, ApiError> {
    let mut format = Format::Ndjson;
    for (name, value) in query_pairs(req) {
        if name == "format" {
            format = match value.as_ref() {
                "ndjson" => Format::Ndjson,
                "csv" => Format::Csv,
                _ => {
                    return Err(ApiError::validation(
                        vec![json!("query"), json!("format")],
                        format!("`format` must be `ndjson` or `csv`, got `{value}`"),
                        "enum",
                    ))
                }
            }
        }
    }
    Ok(format)
}

/// An export in progress: the snapshot and how far it got.
struct Export {
    snapshot: Arc<SheetSnapshot>,
    /// The last row id sent.
    after: Option<RowId>,
    done: bool,
    format: Format,
    fields: Option<BTreeSet<u64>>,
    filter: Option<Arc<SheetFilter>>,
    /// The ids of the columns shown, by position (CSV).
    columns: Vec<Option<u64>>,
    /// The CSV header line, sent with the first chunk.
    header: Vec<u8>,
}

impl Export {
    /// The next chunk of the body, `None` after the last. The first chunk is never empty for
    /// CSV (the header), and an empty export of NDJSON is an empty body.
    fn next_chunk(&mut self) -> Option<Vec<u8>> {
        if self.done {
            return None;
        }
        let state = &self.snapshot.state;
        let (rows, resume) = match &self.filter {
            None => {
                let (rows, more) = state.page(self.after, CHUNK_ROWS);
                let last = rows.last().map(|r| r.id);
                (rows, if more { last } else { None })
            }
            Some(filter) => {
                state.page_filtered(self.after, CHUNK_ROWS, CHUNK_EXAMINED, |r| filter.matches(r))
            }
        };
        self.done = resume.is_none();
        self.after = resume;
        let mut out = std::mem::take(&mut self.header);
        match self.format {
            Format::Ndjson => {
                for row in &rows {
                    crate::views::write_row_json(&mut out, row, self.fields.as_ref());
                    out.push(b'\n');
                }
            }
            Format::Csv => {
                let mut writer = csv::Writer::from_writer(out);
                for row in &rows {
                    if writer.write_record(csv_record(row, &self.columns)).is_err() {
                        break;
                    }
                }
                out = writer.into_inner().unwrap_or_default();
            }
        }
        Some(out)
    }
}

/// `id,version,<column names by position>`.
fn csv_header(columns: &[Column]) -> Result<Vec<u8>, ApiError> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    let names = ["id", "version"].into_iter().chain(columns.iter().map(|c| c.name.as_str()));
    writer.write_record(names).map_err(ApiError::internal)?;
    writer.into_inner().map_err(ApiError::internal)
}

/// One row's CSV fields: id, version, then each column's cell as text (`ids`: the columns'
/// ids, in the same order).
fn csv_record(row: &Row, ids: &[Option<u64>]) -> Vec<String> {
    let mut record = vec![row.id.to_string(), row.version().to_string()];
    record.extend(row.project(ids).iter().map(cell_text));
    record
}

/// A cell as CSV text: a scalar as its text, a wrapper (`{value, format}`, `{formula, value}`)
/// as its `value`, a list (`multi_select`) as its JSON text, null as empty.
fn cell_text(cell: &Value) -> String {
    match cell {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Bool(_) | Value::Number(_) | Value::Array(_) => cell.to_string(),
        Value::Object(wrapper) => wrapper.get("value").map_or(String::new(), cell_text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_become_csv_text() {
        assert_eq!(cell_text(&json!(null)), "");
        assert_eq!(cell_text(&json!("a, \"b\"")), "a, \"b\"");
        assert_eq!(cell_text(&json!(1.5)), "1.5");
        assert_eq!(cell_text(&json!(true)), "true");
        assert_eq!(cell_text(&json!(["x", "y"])), "[\"x\",\"y\"]");
        assert_eq!(cell_text(&json!({"value": 3, "format": "0.0"})), "3");
        assert_eq!(cell_text(&json!({"formula": "=A1"})), "");
    }
}
