//! Generated data: the own server's workspace (as a fixture, the format `--seed` loads) and the
//! cell values every write sends.
//!
//! Cells are generated from a sheet's columns as the API lists them (type and options), so the
//! same generator writes valid rows into the own server's sheets and into any sheet of a running
//! server. Values are ones the column types store as sent (dates as `YYYY-MM-DD`, datetimes
//! already in UTC), though `--verify` does not rely on that: it compares against the cells the
//! server acknowledged.

use rand::Rng;
use serde_json::{json, Map, Value};

/// A column as `listColumns` describes it: what a generator needs to write a valid cell.
#[derive(Clone, Debug)]
pub struct ColumnInfo {
    /// Column id (cell key).
    pub id: u64,
    /// Column type (`text`, `number`, ...).
    pub ty: String,
    /// Options of `dropdown`, `multi_select` and `symbol` columns.
    pub options: Vec<String>,
}

/// A sheet the load goes to.
#[derive(Clone, Debug)]
pub struct SheetInfo {
    /// Sheet id.
    pub id: u64,
    pub columns: Vec<ColumnInfo>,
}

/// Name, type and options of the generated columns, in order; the pattern repeats text and
/// number columns beyond the first nine so every type appears at the default widths and up.
fn column_spec(index: u64) -> (String, &'static str, Option<Vec<&'static str>>) {
    let spec: (&str, &str, Option<Vec<&str>>) = match index {
        0 => ("Title", "text", None),
        1 => ("Amount", "number", None),
        2 => ("Status", "dropdown", Some(vec!["Open", "In progress", "Done", "Blocked"])),
        3 => ("Done", "checkbox", None),
        4 => ("Due", "date", None),
        5 => ("Seen", "datetime", None),
        6 => ("Owner", "contact", None),
        7 => ("Tags", "multi_select", Some(vec!["red", "green", "blue", "grey"])),
        8 => ("Flag", "symbol", Some(vec!["Low", "Medium", "High"])),
        n if n % 2 == 1 => return (format!("Note {n}"), "text", None),
        n => return (format!("Count {n}"), "number", None),
    };
    (spec.0.to_owned(), spec.1, spec.2)
}

/// The API key secret of the own server's generated workspace, in the format a seeded key
/// must have: `svc_live_` and at least 32 letters and digits.
pub fn own_key() -> String {
    format!("svc_live_{}", random_alphanumerics(40))
}

/// The own server's admin token: fresh per run, as no one else should reach its admin API.
pub fn own_admin_token() -> String {
    format!("adm_{}", random_alphanumerics(40))
}

fn random_alphanumerics(n: usize) -> String {
    rand::thread_rng()
        .sample_iter(rand::distributions::Alphanumeric)
        .take(n)
        .map(char::from)
        .collect()
}

/// The id of the summary report in [`fixture`].
pub const REPORT_ID: u64 = 1;

/// The own server's workspace: one paid user owning one project with `sheets` sheets (ids
/// 1..=sheets) of `columns` generated columns each, a summary report over all of them
/// (grouped by `Status` when there is one, counting rows and summing `Amount`), and one key
/// with write access to the account. No rows: [`crate::target`] loads them through the
/// API. The paid plan's row cap is raised so that long write runs never hit it.
pub fn fixture(sheets: u64, columns: u64, key: &str) -> Value {
    let sheet_ids: Vec<u64> = (1..=sheets).collect();
    let specs: Vec<_> = (0..columns).map(column_spec).collect();
    let mut cols = Vec::new();
    for &sheet in &sheet_ids {
        for (i, (name, ty, options)) in specs.iter().enumerate() {
            let mut c = json!({
                "id": column_id(sheet, i as u64), "sheetId": sheet, "name": name, "type": ty,
                "position": i, "primary": i == 0,
            });
            if let Some(options) = options {
                c["options"] = json!(options);
            }
            cols.push(c);
        }
    }
    let has = |name: &str| specs.iter().any(|(n, _, _)| n == name);
    let mut aggregates = vec![json!({"fn": "count"})];
    if has("Amount") {
        aggregates.push(json!({"fn": "sum", "column": "Amount"}));
    }
    let group_by: Vec<&str> = if has("Status") { vec!["Status"] } else { vec![] };
    json!({
        "plans": {"paid": {"maxRowsPerSheet": 1_000_000_000u64}},
        "users": [{"id": 1, "name": "bench", "plan": "paid"}],
        "projects": [{"id": 1, "name": "Bench", "ownerId": 1}],
        "sheets": sheet_ids.iter().map(|i| json!({"id": i, "projectId": 1, "name": format!("Bench {i}")})).collect::<Vec<_>>(),
        "columns": cols,
        "reports": [{"id": REPORT_ID, "projectId": 1, "ownerId": 1, "name": "Bench summary",
            "definition": {"type": "summary", "sources": sheet_ids, "groupBy": group_by,
                           "aggregates": aggregates, "filter": null}}],
        "keys": [{"id": 1, "ownerId": 1, "name": "bench", "secret": key,
                  "grants": [{"verb": "write", "scopeType": "account", "scopeId": null}]}]
    })
}

/// Generated column ids: unique across sheets, readable in a dump (sheet 3, column 2 → 3002).
fn column_id(sheet: u64, index: u64) -> u64 {
    sheet * 1000 + index
}

const WORDS: &[&str] = &[
    "alpha", "bravo", "cedar", "delta", "ember", "fjord", "grove", "harbor", "iris", "juniper",
    "kestrel", "lumen", "meadow", "nimbus", "orchid", "prairie",
];

/// A valid value for `column`; `n` makes text unique per write.
pub fn cell(column: &ColumnInfo, n: u64, rng: &mut impl Rng) -> Value {
    let mut text = Vec::with_capacity(64);
    write_cell(&mut text, column, n, rng);
    // The writer below emits JSON of plain values only.
    serde_json::from_slice(&text).expect("a generated cell is JSON")
}

/// [`cell`]'s value written as JSON into `out`, drawing the same numbers from `rng`: the body of
/// a bulk write is text, and building each value first cost the generator more CPU than the
/// server spent storing the row.
fn write_cell(out: &mut Vec<u8>, column: &ColumnInfo, n: u64, rng: &mut impl Rng) {
    match column.ty.as_str() {
        "number" => {
            // Quarters: the text of the f64 `k / 4`, as serde_json writes it.
            // Drawn as i32, as the generator always has: the type decides the draw.
            let k: i32 = rng.gen_range(0..100_000);
            decimal(out, u64::from(k.unsigned_abs() / 4));
            out.extend_from_slice([&b".0"[..], b".25", b".5", b".75"][(k % 4) as usize]);
        }
        "checkbox" => {
            out.extend_from_slice(if rng.gen_bool(0.5) { b"true" } else { b"false" });
        }
        "date" => {
            out.push(b'"');
            write_date(out, rng);
            out.push(b'"');
        }
        "datetime" => {
            out.push(b'"');
            write_date(out, rng);
            for (separator, range) in [(b'T', 0..24), (b':', 0..60), (b':', 0..60)] {
                out.push(separator);
                two_digits(out, rng.gen_range(range));
            }
            out.extend_from_slice(b"Z\"");
        }
        "contact" => {
            out.extend_from_slice(b"\"user");
            let user: i32 = rng.gen_range(0..1000);
            decimal(out, u64::from(user.unsigned_abs()));
            out.extend_from_slice(b"@example.com\"");
        }
        "dropdown" | "symbol" => {
            let options = &column.options;
            match options.get(rng.gen_range(0..options.len().max(1))) {
                Some(option) => string(out, option),
                None => out.extend_from_slice(b"null"),
            }
        }
        "multi_select" => {
            // Distinct options in the column's order: the form the type stores.
            out.push(b'[');
            let mut first = true;
            for option in &column.options {
                if rng.gen_bool(0.4) {
                    if !first {
                        out.push(b',');
                    }
                    first = false;
                    string(out, option);
                }
            }
            out.push(b']');
        }
        _ => {
            // The words are plain ASCII: nothing in this text needs escaping.
            out.push(b'"');
            out.extend_from_slice(WORDS[rng.gen_range(0..WORDS.len())].as_bytes());
            out.push(b' ');
            out.extend_from_slice(WORDS[rng.gen_range(0..WORDS.len())].as_bytes());
            out.extend_from_slice(b" #");
            decimal(out, n);
            out.push(b'"');
        }
    }
}

fn decimal(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// `2026-MM-DD`, month then day drawn from `rng`.
fn write_date(out: &mut Vec<u8>, rng: &mut impl Rng) {
    out.extend_from_slice(b"2026-");
    two_digits(out, rng.gen_range(1..=12));
    out.push(b'-');
    two_digits(out, rng.gen_range(1..=28));
}

fn two_digits(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&[b'0' + (v / 10) as u8, b'0' + (v % 10) as u8]);
}

/// `s` as a JSON string (an option named by the server may need escapes).
fn string(out: &mut Vec<u8>, s: &str) {
    // Writing to a vector cannot fail.
    serde_json::to_writer(&mut *out, s).expect("in memory");
}

/// A full row of valid cells.
pub fn row_cells(columns: &[ColumnInfo], n: u64, rng: &mut impl Rng) -> Map<String, Value> {
    columns.iter().map(|c| (c.id.to_string(), cell(c, n, rng))).collect()
}

/// A new row, `{"cells":{...}}` with [`row_cells`]' cells, written straight into `out`: a
/// bulk body of thousands of rows built as maps of values cost the generator as much CPU as
/// the server spent storing them.
pub fn write_row(out: &mut Vec<u8>, columns: &[ColumnInfo], n: u64, rng: &mut impl Rng) {
    out.extend_from_slice(b"{\"cells\":{");
    for (i, c) in columns.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'"');
        decimal(out, c.id);
        out.extend_from_slice(b"\":");
        write_cell(out, c, n, rng);
    }
    out.extend_from_slice(b"}}");
}

/// One or two cells changed, as a patch sends them.
pub fn patch_cells(columns: &[ColumnInfo], n: u64, rng: &mut impl Rng) -> Map<String, Value> {
    let mut cells = Map::new();
    if columns.is_empty() {
        return cells;
    }
    for _ in 0..rng.gen_range(1..=2) {
        let c = &columns[rng.gen_range(0..columns.len())];
        cells.insert(c.id.to_string(), cell(c, n, rng));
    }
    cells
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    /// The generator as it was when every value was built as a `Value`: the reference the
    /// text writer must match, draw for draw.
    fn reference_cell(column: &ColumnInfo, n: u64, rng: &mut impl Rng) -> Value {
        let pick = |rng: &mut dyn rand::RngCore, options: &[String]| {
            options
                .get(rng.gen_range(0..options.len().max(1)))
                .cloned()
                .map_or(Value::Null, Value::from)
        };
        match column.ty.as_str() {
            "number" => json!(rng.gen_range(0..100_000) as f64 / 4.0),
            "checkbox" => json!(rng.gen_bool(0.5)),
            "date" => {
                json!(format!("2026-{:02}-{:02}", rng.gen_range(1..=12), rng.gen_range(1..=28)))
            }
            "datetime" => json!(format!(
                "2026-{:02}-{:02}T{:02}:{:02}:{:02}Z",
                rng.gen_range(1..=12),
                rng.gen_range(1..=28),
                rng.gen_range(0..24),
                rng.gen_range(0..60),
                rng.gen_range(0..60)
            )),
            "contact" => json!(format!("user{}@example.com", rng.gen_range(0..1000))),
            "dropdown" | "symbol" => pick(rng, &column.options),
            "multi_select" => {
                let chosen: Vec<&String> =
                    column.options.iter().filter(|_| rng.gen_bool(0.4)).collect();
                json!(chosen)
            }
            _ => json!(format!(
                "{} {} #{n}",
                WORDS[rng.gen_range(0..WORDS.len())],
                WORDS[rng.gen_range(0..WORDS.len())]
            )),
        }
    }

    /// A bulk body's rows are written as text: they must hold the values the reference draws
    /// from the same numbers, and read back as the same `Value`s ([`cell`] reads the text).
    #[test]
    fn written_rows_hold_the_reference_draws() {
        let columns: Vec<ColumnInfo> = (0..12)
            .map(|i| {
                let (_, ty, options) = column_spec(i);
                ColumnInfo {
                    id: 3000 + i,
                    ty: ty.to_owned(),
                    options: options.unwrap_or_default().into_iter().map(str::to_owned).collect(),
                }
            })
            .chain([ColumnInfo {
                id: 4000,
                ty: "dropdown".into(),
                options: vec!["a \"q\"".into()],
            }])
            .chain([ColumnInfo { id: 4001, ty: "symbol".into(), options: vec![] }])
            .collect();
        for seed in 0..300 {
            let mut written = Vec::new();
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            write_row(&mut written, &columns, seed, &mut rng);
            let written: Value = serde_json::from_slice(&written).expect("a written row is JSON");
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let reference: Map<String, Value> = columns
                .iter()
                .map(|c| (c.id.to_string(), reference_cell(c, seed, &mut rng)))
                .collect();
            assert_eq!(written, json!({ "cells": reference }), "seed {seed}");
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            assert_eq!(row_cells(&columns, seed, &mut rng), reference, "seed {seed}");
        }
    }
}
