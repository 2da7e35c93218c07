//! Report runs over a 999,000-row sheet of ten typed columns, without HTTP or actors: what a
//! [`actors::ReportRunner`] does on a blocking thread once it holds its sources' snapshots, by
//! the row scan (the column cache off) and over columns kept for scanning (on), each run right
//! after a write to the sheet (so the kept columns catch up with one changed row first, as the
//! server's would), median of 7. The issue 27 shapes: an aggregate (group by a dropdown: count,
//! sum of a number), a filter (number > 500) sorted by text, and a text `contains`; the first
//! page (100 rows) of each.
//!
//! The rows are those of the PostgreSQL peer's generator (`../shared/peers/postgres/gen_rows.py`:
//! name text, amount with cents, checkbox, date, status of 4 options, tags, contact, datetime,
//! symbol, notes on 2 rows in 3), built with the actors crate's own [`SheetState`], so they sit
//! in the persistent map a published snapshot holds. The kept columns' heap bytes and the
//! process's RSS before and after they are built are printed too.
//!
//! Run: `cargo bench --bench report_run` (`-- --quick`: 99,000 rows, 3 runs each).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use actors::model::{Column, ColumnType, Json, Row, RowId, SOURCE_IMPORT};
use actors::report::{compile, definition, run, run_plan, ColumnCache, Source};
use actors::sheet::SheetState;
use serde_json::{json, Value};

const STATUSES: [&str; 4] = ["Open", "Doing", "Done", "Blocked"];

fn column(id: u64, name: &str, ty: ColumnType, options: Option<&[&str]>) -> Column {
    Column {
        id,
        sheet_id: 1,
        name: name.into(),
        ty,
        position: id as i64 - 100,
        options: options.map(|o| o.iter().map(|s| (*s).to_owned()).collect()),
        primary: id == 100,
    }
}

/// A small deterministic generator (xorshift), so runs compare.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn cells(i: u64, rng: &mut Rng) -> BTreeMap<u64, Json> {
    let tags: Vec<&str> = ["a", "b", "c", "d"].into_iter().filter(|_| rng.next() % 5 < 2).collect();
    let mut cells = BTreeMap::new();
    let mut put = |id: u64, v: Value| {
        cells.insert(id, Json(v));
    };
    put(100, json!(format!("row {i:07} lorem ipsum dolor sit amet")));
    put(101, json!((rng.next() % 100_001) as f64 / 100.0));
    put(102, json!(rng.next().is_multiple_of(2)));
    put(103, json!(format!("2026-{:02}-{:02}", 1 + i % 12, 1 + i % 28)));
    put(104, json!(STATUSES[(i % 4) as usize]));
    if !tags.is_empty() {
        put(105, json!(tags));
    }
    put(106, json!(format!("user{}@example.com", i % 97)));
    put(107, json!(format!("2026-03-{:02}T10:{:02}:00Z", 1 + i % 28, i % 60)));
    put(108, json!(["Red", "Green"][(i % 2) as usize]));
    if !i.is_multiple_of(3) {
        put(109, json!("note"));
    }
    cells
}

fn sheet(rows: u64) -> Source {
    let columns = vec![
        column(100, "Name", ColumnType::Text, None),
        column(101, "Amount", ColumnType::Number, None),
        column(102, "Paid", ColumnType::Checkbox, None),
        column(103, "Due", ColumnType::Date, None),
        column(104, "Status", ColumnType::Dropdown, Some(&STATUSES)),
        column(105, "Tags", ColumnType::MultiSelect, Some(&["a", "b", "c", "d"])),
        column(106, "Owner", ColumnType::Contact, None),
        column(107, "Seen", ColumnType::Datetime, None),
        column(108, "Flag", ColumnType::Symbol, Some(&["Red", "Green"])),
        column(109, "Notes", ColumnType::Text, None),
    ];
    let mut rng = Rng(7);
    let rows = (1..=rows).map(|i| Row::new(i, 1, cells(i, &mut rng), SOURCE_IMPORT, 0));
    let state = SheetState::new(1, 0, columns, rows.collect());
    Source { sheet_id: 1, columns: state.columns_by_position().clone(), rows: state.rows.clone() }
}

/// A write to the sheet: a new version of row `id` with another amount.
fn write(source: &mut Source, id: RowId, n: u64) {
    let old = source.rows[&id].clone();
    let mut cells = old.cells();
    cells.insert(101, Json(json!(n as f64 + 0.25)));
    source.rows.insert(id, Arc::new(old.next(&cells, 1)));
}

fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse::<f64>().ok()));
    kb.unwrap_or(0.0) / 1024.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick" || a == "--test");
    let (n, runs) = if quick { (99_000, 3) } else { (999_000, 7) };
    let mut source = sheet(n);
    let rss_rows = rss_mb();
    let shapes = [
        (
            "aggregate: group by a dropdown, count + sum of a number",
            json!({"type": "summary", "sources": [1], "groupBy": ["Status"],
                "aggregates": [{"fn": "count"}, {"fn": "sum", "column": "Amount"}]}),
            "754-793 ms",
        ),
        (
            "filter (number > 500) + sort by text, first 100",
            json!({"type": "row", "sources": [1], "columns": ["Name", "Amount", "Status"],
                "filter": {"column": "Amount", "op": "gt", "value": 500},
                "sort": [{"column": "Name"}]}),
            "238 ms",
        ),
        (
            "text contains, first 100",
            json!({"type": "row", "sources": [1], "columns": ["Name", "Amount"],
                "filter": {"column": "Name", "op": "contains", "value": "ROW 00999"}}),
            "220 ms",
        ),
    ];
    let cache = ColumnCache::new(actors::report::columns::DEFAULT_BUDGET);
    let mut written = 0u64;
    let mut lines = Vec::new();
    let mut first_builds = Vec::new();
    for (what, def, postgres) in &shapes {
        let parsed = definition::parse(def).unwrap();
        let mut time = |kept: bool, source: &mut Source| {
            written += 1;
            write(source, 1 + (written * 7_919) % n, written);
            let sources = [source.clone()];
            let t = Instant::now();
            let plan = compile::compile(&parsed, &sources).unwrap();
            let result = if kept {
                run_plan(&plan, &sources, &cache)
            } else {
                run::execute(&plan, &sources)
            };
            let page = result.page(0, 100);
            let ms = t.elapsed().as_secs_f64() * 1e3;
            (ms, result.total_matched, page)
        };
        let rows: Vec<_> = (0..runs).map(|_| time(false, &mut source)).collect();
        let build = time(true, &mut source);
        first_builds.push(build.0);
        let kept: Vec<_> = (0..runs).map(|_| time(true, &mut source)).collect();
        // Both scans of the last state show the same page.
        let sources = [source.clone()];
        let plan = compile::compile(&parsed, &sources).unwrap();
        let (by_rows, by_kept) = (run::execute(&plan, &sources), run_plan(&plan, &sources, &cache));
        assert_eq!(by_rows.total_matched, by_kept.total_matched, "{what}");
        assert_eq!(by_rows.page(0, 100), by_kept.page(0, 100), "{what}");
        let rows_ms = median(rows.iter().map(|r| r.0).collect());
        let kept_ms = median(kept.iter().map(|r| r.0).collect());
        lines.push((what, postgres, rows_ms, kept_ms, build.0, kept[0].1));
    }
    let stats = cache.stats();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!();
    println!(
        "report runs over {n} rows of ten columns, right after a write, median of {runs} \
         (load average {}, {} threads)",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        std::thread::available_parallelism().map_or(1, |p| p.get())
    );
    println!();
    println!(
        "| {:<56} | {:<13} | {:<14} | {:<14} | {:<10} | {:<8} |",
        "report (first page of 100)",
        "PostgreSQL 15",
        "rows (off)",
        "kept columns",
        "target",
        "matched"
    );
    println!(
        "|{}|{}|{}|{}|{}|{}|",
        "-".repeat(58),
        "-".repeat(15),
        "-".repeat(16),
        "-".repeat(16),
        "-".repeat(12),
        "-".repeat(10)
    );
    for (what, postgres, rows_ms, kept_ms, _, matched) in &lines {
        println!(
            "| {what:<56} | {postgres:<13} | {:<14} | {:<14} | {:<10} | {matched:<8} |",
            format!("{rows_ms:.1} ms"),
            format!("{kept_ms:.1} ms"),
            "<= 50 ms"
        );
    }
    println!();
    println!(
        "first run over kept columns (builds the columns it reads): {}",
        first_builds.iter().map(|ms| format!("{ms:.0} ms")).collect::<Vec<_>>().join(" / ")
    );
    println!(
        "kept columns: {:.1} MB on the heap for {} rows (Name, Amount, Status); process RSS {:.0} MB with the rows, {:.0} MB after the runs",
        stats.bytes as f64 / 1e6,
        n,
        rss_rows,
        rss_mb()
    );
}
