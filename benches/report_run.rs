//! Report runs over 1,000,000 rows, without HTTP or actors: the pure pipeline a
//! [`actors::ReportRunner`] executes on a blocking thread once it holds its sources' snapshots
//! (parse, compile, cap check, scan, filter, sort or group, aggregate).
//!
//! The sheet is built with the actors crate's own [`SheetState`], so the rows sit in the same
//! persistent map a published `actors::sheet::SheetSnapshot` holds, and the runner's [`Source`]
//! is made from it as the runner makes one. Run: `cargo bench --bench report_run`
//! (quick check: `cargo bench --bench report_run -- --test`).

use std::hint::black_box;
use std::time::Duration;

use actors::model::{Column, ColumnType, Json, Row, SOURCE_IMPORT};
use actors::report::{evaluate, Caps, Source};
use actors::sheet::SheetState;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::{json, Value};

const ROWS: u64 = 1_000_000;

fn column(id: u64, name: &str, ty: ColumnType, position: i64) -> Column {
    let options = (ty == ColumnType::Dropdown)
        .then(|| vec!["Open".to_owned(), "Done".to_owned(), "Blocked".to_owned()]);
    Column { id, sheet_id: 1, name: name.into(), ty, position, options, primary: position == 0 }
}

/// One sheet of [`ROWS`] rows: Task (text), Status (3 options, every 7th blank), Hours (number).
fn sheet() -> Source {
    let columns = vec![
        column(1, "Task", ColumnType::Text, 0),
        column(2, "Status", ColumnType::Dropdown, 1),
        column(3, "Hours", ColumnType::Number, 2),
    ];
    let statuses = ["Open", "Done", "Blocked"];
    let rows = (0..ROWS).map(|i| {
        let mut cells = std::collections::BTreeMap::new();
        cells.insert(1, Json(Value::String(format!("task {i}"))));
        if i % 7 != 0 {
            cells.insert(2, Json(json!(statuses[(i % 3) as usize])));
        }
        cells.insert(3, Json(json!((i * 7919) % 1000)));
        Row::new(i + 1, 1, cells, SOURCE_IMPORT, 0)
    });
    let state = SheetState::new(1, 0, columns, rows.collect());
    Source { sheet_id: 1, columns: state.columns_by_position().clone(), rows: state.rows.clone() }
}

fn report_runs(c: &mut Criterion) {
    let sources = [sheet()];
    let caps = Caps::default();
    let mut group = c.benchmark_group("report_run_1m_rows");
    group.sample_size(10).measurement_time(Duration::from_secs(20));
    group.throughput(Throughput::Elements(ROWS));

    let aggregated = json!({"type": "summary", "sources": [1], "groupBy": ["Status"],
        "aggregates": [{"fn": "count"}, {"fn": "sum", "column": "Hours"},
                       {"fn": "avg", "column": "Hours"}, {"fn": "max", "column": "Hours"}]});
    group.bench_function("aggregated_group_by_status", |b| {
        b.iter(|| {
            let r = evaluate(&aggregated, &sources, caps).unwrap();
            assert_eq!(r.total_matched, 4);
            black_box(r.page(0, 100))
        })
    });

    let flat = json!({"type": "row", "sources": [1], "columns": ["Task", "Status", "Hours"],
        "filter": {"column": "Status", "op": "eq", "value": "Done"},
        "sort": [{"column": "Hours", "direction": "desc"}]});
    group.bench_function("flat_filter_sort_first_page", |b| {
        b.iter(|| {
            let r = evaluate(&flat, &sources, caps).unwrap();
            black_box(r.page(0, 100))
        })
    });

    let unsorted = json!({"type": "row", "sources": [1], "columns": ["Task", "Hours"],
        "filter": {"column": "Task", "op": "contains", "value": "99"}});
    group.bench_function("flat_contains_unsorted_first_page", |b| {
        b.iter(|| {
            let r = evaluate(&unsorted, &sources, caps).unwrap();
            black_box(r.page(0, 100))
        })
    });
    group.finish();
}

criterion_group!(benches, report_runs);
criterion_main!(benches);
