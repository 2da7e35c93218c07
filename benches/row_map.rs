//! What a write costs the row map of a large sheet, with nothing else around it: the persistent
//! map (`imbl::OrdMap`) a sheet's state keeps, 1,100,000 rows of ten cells (the engine bench's
//! sheet), its version before each batch held as a published snapshot holds it, so every leaf a
//! batch changes is copied and the old version is dropped afterwards (on a thread of its own in
//! the server). Batches of 1,000 rows:
//!
//! - updates of random rows, the map holding `Arc<Row>` as now (each leaf copy clones the `Arc`
//!   of every row in the leaf, a cold count each; the old version's drop touches them again);
//! - the same updates, the map holding plain handles to rows kept elsewhere (the "rows in
//!   chunks, handles in the map" sketch of ARCHITECTURE.md, without its chunks' own upkeep);
//! - new rows at the map's right edge (what bulkAdd's rows are), `Arc<Row>` values;
//! - the same updates in place: the map holds a slot per row (`ArcSwap<Row>`) and an update
//!   swaps the slot's row, so the map is not copied at all (the lower bound of "versions in
//!   place" in ARCHITECTURE.md: no version kept for older readers, no reader registry). Its
//!   "drop" is the replaced rows' drop;
//! - the first kind again with each batch put in the order of its ids (a write may put its
//!   rows in any order that keeps a row's later version last).
//!
//! The rows are built outside the timed parts: only the map's insertions and the old version's
//! drop are timed. Each kind runs three times, alternated; microseconds per row.
//!
//! Run: `cargo bench --bench row_map` (`-- --quick`: 110,000 rows).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use actors::model::{Json, Row, RowId, SOURCE_IMPORT};
use arc_swap::ArcSwap;
use imbl::OrdMap;
use rand::{Rng, SeedableRng};
use serde_json::json;

/// As the server: the allocator is part of what a map's copies and drops cost.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const BATCH: usize = 1000;
const BATCHES: usize = 60;

/// A row of ten cells, about 220 bytes of JSON.
fn row(id: RowId) -> Row {
    let cells: BTreeMap<u64, Json> = [
        (100, json!(format!("alpha bravo #{id}"))),
        (101, json!("Open")),
        (102, json!(id % 1000)),
        (103, json!(id.is_multiple_of(2))),
        (104, json!("2026-08-25")),
        (105, json!("2026-09-01T01:08:58Z")),
        (106, json!(format!("user{}@example.com", id % 97))),
        (107, json!(["a", "c"])),
        (108, json!("Red")),
        (109, json!("note")),
    ]
    .into_iter()
    .map(|(column, value)| (column, Json(value)))
    .collect();
    Row::new(id, 1, cells, SOURCE_IMPORT, 0)
}

/// Seconds spent inserting and seconds spent dropping the old versions, over every batch.
#[derive(Default)]
struct Spent {
    insert: f64,
    drop: f64,
    rows: usize,
}

impl Spent {
    fn per_row(&self) -> (f64, f64) {
        let n = self.rows as f64;
        (self.insert / n * 1e6, self.drop / n * 1e6)
    }
}

/// A batch of [`BATCH`] new versions of random rows among the map's first `rows`.
fn random_updates(rng: &mut impl Rng, rows: RowId) -> Vec<(RowId, Arc<Row>)> {
    (0..BATCH).map(|_| rng.gen_range(1..=rows)).map(|id| (id, Arc::new(row(id)))).collect()
}

/// Times [`BATCHES`] batches on `map`: `next` gives each batch's entries, built untimed.
fn batches<V: Clone>(
    map: &mut OrdMap<RowId, V>,
    mut next: impl FnMut() -> Vec<(RowId, V)>,
) -> Spent {
    let mut spent = Spent::default();
    for _ in 0..BATCHES {
        let batch = next();
        let published = map.clone();
        spent.rows += batch.len();
        let t = Instant::now();
        for (id, value) in batch {
            map.insert(id, value);
        }
        spent.insert += t.elapsed().as_secs_f64();
        let t = Instant::now();
        drop(published);
        spent.drop += t.elapsed().as_secs_f64();
    }
    spent
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rows: RowId = if quick { 110_000 } else { 1_100_000 };
    let mut rng = rand::rngs::StdRng::seed_from_u64(27);
    let mut table: Vec<(&str, Vec<(f64, f64)>)> = vec![
        ("updates, Arc<Row> values", vec![]),
        ("updates, handles", vec![]),
        ("appends, Arc<Row> values", vec![]),
        ("updates in place, ArcSwap<Row> slots", vec![]),
        ("updates, Arc<Row> values, each batch in id order", vec![]),
    ];
    for _ in 0..3 {
        // Updates, the map as it is.
        let mut map: OrdMap<RowId, Arc<Row>> =
            (1..=rows).map(|id| (id, Arc::new(row(id)))).collect();
        let spent = batches(&mut map, || random_updates(&mut rng, rows));
        table[0].1.push(spent.per_row());

        // The same, each batch put in the order of its ids.
        let spent = batches(&mut map, || {
            let mut batch = random_updates(&mut rng, rows);
            batch.sort_by_key(|(id, _)| *id);
            batch
        });
        table[4].1.push(spent.per_row());
        drop(map);

        // Updates, the rows kept in a vector and the map holding their places in it.
        let mut kept: Vec<Row> = Vec::with_capacity(rows as usize + BATCH * BATCHES);
        kept.extend((1..=rows).map(row));
        let mut map: OrdMap<RowId, usize> = (1..=rows).map(|id| (id, id as usize - 1)).collect();
        let spent = batches(&mut map, || {
            (0..BATCH)
                .map(|_| {
                    let id = rng.gen_range(1..=rows);
                    kept.push(row(id));
                    (id, kept.len() - 1)
                })
                .collect()
        });
        table[1].1.push(spent.per_row());
        drop((map, kept));

        // Appends at the right edge.
        let mut map: OrdMap<RowId, Arc<Row>> =
            (1..=rows).map(|id| (id, Arc::new(row(id)))).collect();
        let mut last = rows;
        let spent = batches(&mut map, || {
            (0..BATCH)
                .map(|_| {
                    last += 1;
                    (last, Arc::new(row(last)))
                })
                .collect()
        });
        table[2].1.push(spent.per_row());
        drop(map);

        // Updates in place: the map never changes, each slot's row is swapped.
        let map: OrdMap<RowId, Arc<ArcSwap<Row>>> =
            (1..=rows).map(|id| (id, Arc::new(ArcSwap::from_pointee(row(id))))).collect();
        let mut spent = Spent::default();
        for _ in 0..BATCHES {
            let batch = random_updates(&mut rng, rows);
            let _published = map.clone();
            spent.rows += batch.len();
            let t = Instant::now();
            let replaced: Vec<Arc<Row>> =
                batch.into_iter().filter_map(|(id, row)| Some(map.get(&id)?.swap(row))).collect();
            spent.insert += t.elapsed().as_secs_f64();
            let t = Instant::now();
            drop(replaced);
            spent.drop += t.elapsed().as_secs_f64();
        }
        table[3].1.push(spent.per_row());
    }
    println!("row map of {rows} rows, batches of {BATCH} against a published version, {BATCHES} batches a run, three runs alternated (µs per row)");
    println!();
    println!("| kind | insert, each run | drop of the old version, each run |");
    println!("|---|---|---|");
    for (kind, runs) in &table {
        let list = |f: fn(&(f64, f64)) -> f64| {
            runs.iter().map(|r| format!("{:.2}", f(r))).collect::<Vec<_>>().join(", ")
        };
        println!("| {kind} | {} | {} |", list(|r| r.0), list(|r| r.1));
    }
}
