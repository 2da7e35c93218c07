//! Columns kept for scanning: the report runner's typed copies of the cells reports read, per
//! sheet, so a run over a large sheet reads arrays instead of parsing every row's JSON.
//!
//! # What is kept
//!
//! For each sheet a report has read, a [`SheetColumns`]: the sheet's row ids in id order (the
//! order its persistent map iterates, which is the order a scan visits rows, so a *position* is
//! a row's place in scan order) and, for each column id a report has read, one cell per
//! position ([`Cells`]): numbers as `f64`, strings of a column with few distinct values as
//! dictionary codes, other strings in one arena, anything else (lists, booleans, mixed kinds)
//! as the raw cell. Each form reads back as the very [`CellRef`] the row scan would read from
//! the row's JSON, so a run over kept columns compares, filters and groups exactly as the row
//! scan does ([`super::scan`]). Values shown in a result (group keys, `min`, `max`, flat rows)
//! are always read from the rows themselves, so their JSON form (`5` or `5.0`) is the row's.
//!
//! # Kept in step
//!
//! Columns are built on first use from a snapshot's row map (all missing columns in one parse
//! of each row, on every core). A later run brings them to its own snapshot
//! ([`SheetColumns::sync`]) by comparing that snapshot's row map with the one the columns
//! reflect (`OrdMap::diff`, which skips the subtrees both share: after a write of k rows it
//! visits O(k log n) entries) and re-reading only the rows that differ: an update rewrites the
//! row's cells in place, a removal marks its position dead (dead positions are compacted away
//! once they are an eighth of the sheet), a new row with an id above every kept id is appended.
//! Anything else (a row added below the highest id, or more changed rows than a quarter of the
//! sheet) rebuilds the columns from the snapshot, which costs what the first build did. Column
//! changes need nothing: the cells are read from the rows, whatever the column's type says.
//!
//! # Bounded
//!
//! [`ColumnCache`] holds every sheet's columns under one byte budget (`--report-column-cache-mb`,
//! [`DEFAULT_BUDGET`]; 0 turns the cache off and every run scans rows). After each run the
//! least recently used sheets are dropped until the rest fit; a sheet whose columns alone exceed
//! the budget is dropped after the run that built them (so such a sheet is scanned at the cost
//! of a build each time: the budget should exceed the largest sheet's columns). Entries unused
//! for [`IDLE`] are dropped too (checked every minute by the runner): besides its columns, an
//! entry keeps the version of the row map it reflects, so the previous version of rows written
//! since stays alive until the next run syncs it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use imbl::ordmap::DiffItem;
use imbl::OrdMap;
use serde_json::Value;

use super::run::CellRef;
use crate::model::{ColumnId, Row, RowId, SheetId};

/// The cache's byte budget when the server is given none: room for the columns reports read
/// on a few million-row sheets (a text column of 1,000,000 rows of ~35 characters costs
/// ~43 MB, a number column 8 MB, a dropdown 4 MB, the row ids 9 MB).
pub const DEFAULT_BUDGET: usize = 256 << 20;
/// A sheet's columns unused this long are dropped.
pub const IDLE: Duration = Duration::from_secs(600);
/// Most distinct strings a dictionary column holds before it becomes an arena column (a few in
/// tests, so their small sheets see every form).
const DICT_MAX: usize = if cfg!(test) { 4 } else { 1024 };
/// Garbage bytes past which (and past half the arena) a text column's arena is compacted.
const GARBAGE_MAX: usize = if cfg!(test) { 64 } else { 1 << 20 };
/// Dead positions, beyond an eighth of them, past which a sheet's columns are compacted.
const DEAD_MAX: usize = if cfg!(test) { 2 } else { 64 };
/// The code of a blank cell in a dictionary column.
pub(crate) const BLANK_CODE: u32 = u32::MAX;
/// Rows per thread below which building columns stays on one thread.
const PARALLEL_MIN: usize = 50_000;

/// The threads a large build or scan uses: every core, at most 8.
pub(crate) fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
}

/// One column's cells, one per position.
///
/// Invariant: every form reads back (through [`Cells::get`]) the [`CellRef`] of the cell it was
/// given. A cell that does not fit the form turns the whole column into a form that holds it
/// (numbers or strings into raw cells, a dictionary past `DICT_MAX` into an arena).
#[derive(Clone, Debug)]
pub enum Cells {
    /// Numbers; a blank cell is a NaN (JSON holds none).
    Num(Vec<f64>),
    /// Strings with few distinct values: a code per position into `values`
    /// (`BLANK_CODE`: blank); `index` finds a value's code.
    Dict { codes: Vec<u32>, values: Vec<Box<str>>, index: HashMap<Box<str>, u32> },
    /// Strings: `(start, len)` of each in `arena` (length 0: blank). `garbage` bytes of the
    /// arena belong to cells since rewritten. While `ordered`, the spans follow each other in
    /// the arena in position order (starts never decrease), so a search of the whole arena
    /// finds a hit's position by binary search (`contains`, [`super::scan`]); rewriting any
    /// cell but the last breaks it, compacting the arena restores it.
    Text { spans: Vec<(u32, u32)>, arena: String, garbage: usize, ordered: bool },
    /// Anything else: the cells as stored.
    Raw(Vec<Value>),
}

impl Default for Cells {
    fn default() -> Self {
        Cells::Num(Vec::new())
    }
}

impl Cells {
    /// Cells in the position order.
    pub fn len(&self) -> usize {
        match self {
            Cells::Num(v) => v.len(),
            Cells::Dict { codes, .. } => codes.len(),
            Cells::Text { spans, .. } => spans.len(),
            Cells::Raw(v) => v.len(),
        }
    }

    /// Whether there are no cells.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cell at `pos`, as the row scan reads it.
    #[inline]
    pub fn get(&self, pos: usize) -> CellRef<'_> {
        match self {
            Cells::Num(v) => {
                let x = v[pos];
                if x.is_nan() {
                    CellRef::Blank
                } else {
                    CellRef::Num(x)
                }
            }
            Cells::Dict { codes, values, .. } => match codes[pos] {
                BLANK_CODE => CellRef::Blank,
                c => CellRef::Str(&values[c as usize]),
            },
            Cells::Text { spans, arena, .. } => match spans[pos] {
                (_, 0) => CellRef::Blank,
                (start, len) => CellRef::Str(&arena[start as usize..(start + len) as usize]),
            },
            Cells::Raw(v) => CellRef::of(&v[pos]),
        }
    }

    /// Add a cell at the end.
    pub fn push(&mut self, cell: &Value) {
        let c = CellRef::of(cell);
        if !self.fits(c) {
            self.generalize(c);
        }
        match self {
            Cells::Num(v) => v.push(if let CellRef::Num(x) = c { x } else { f64::NAN }),
            Cells::Dict { codes, .. } => codes.push(BLANK_CODE),
            Cells::Text { spans, arena, .. } => spans.push((arena.len() as u32, 0)),
            Cells::Raw(v) => v.push(Value::Null),
        }
        if !matches!(self, Cells::Num(_)) {
            self.set(self.len() - 1, cell);
        }
    }

    /// Replace the cell at `pos`.
    pub fn set(&mut self, pos: usize, cell: &Value) {
        let c = CellRef::of(cell);
        if !self.fits(c) {
            self.generalize(c);
        }
        match self {
            Cells::Num(v) => v[pos] = if let CellRef::Num(x) = c { x } else { f64::NAN },
            Cells::Dict { codes, values, index } => {
                codes[pos] = match c {
                    CellRef::Str(s) => match index.get(s) {
                        Some(&code) => code,
                        None => {
                            let code = values.len() as u32;
                            values.push(s.into());
                            index.insert(s.into(), code);
                            code
                        }
                    },
                    _ => BLANK_CODE,
                }
            }
            Cells::Text { spans, arena, garbage, ordered } => {
                *garbage += spans[pos].1 as usize;
                *ordered = *ordered && pos + 1 == spans.len();
                let start = arena.len() as u32;
                spans[pos] = match c {
                    CellRef::Str(s) => {
                        arena.push_str(s);
                        (start, s.len() as u32)
                    }
                    _ => (start, 0),
                };
                if *garbage > GARBAGE_MAX && *garbage > arena.len() / 2 {
                    self.compact_arena();
                }
            }
            Cells::Raw(v) => v[pos] = cell.clone(),
        }
    }

    /// Whether the form holds `c` as it is.
    fn fits(&self, c: CellRef<'_>) -> bool {
        match (self, c) {
            (_, CellRef::Blank) | (Cells::Raw(_), _) | (Cells::Num(_), CellRef::Num(_)) => true,
            (Cells::Dict { values, index, .. }, CellRef::Str(s)) => {
                values.len() < DICT_MAX || index.contains_key(s)
            }
            (Cells::Text { arena, .. }, CellRef::Str(s)) => {
                arena.len() + s.len() <= u32::MAX as usize
            }
            _ => false,
        }
    }

    /// Turn the column into a form that holds `c` as well as every cell it holds.
    fn generalize(&mut self, c: CellRef<'_>) {
        let all_blank = (0..self.len()).all(|p| self.get(p).is_blank());
        let n = self.len();
        *self = match (&*self, c) {
            (Cells::Num(_), CellRef::Str(_)) if all_blank => Cells::Dict {
                codes: vec![BLANK_CODE; n],
                values: Vec::new(),
                index: HashMap::new(),
            },
            (Cells::Dict { .. }, CellRef::Str(s)) if s.len() <= u32::MAX as usize / 2 => {
                let mut text = Cells::Text {
                    spans: Vec::with_capacity(n),
                    arena: String::new(),
                    garbage: 0,
                    ordered: true,
                };
                for p in 0..n {
                    text.push(&value_of(self.get(p)));
                }
                text
            }
            _ => Cells::Raw((0..n).map(|p| value_of(self.get(p))).collect()),
        };
    }

    /// Rewrite the arena in position order, without the bytes of rewritten cells.
    fn compact_arena(&mut self) {
        if let Cells::Text { spans, arena, garbage, ordered } = self {
            let mut fresh = String::with_capacity(arena.len() - *garbage);
            for span in spans.iter_mut() {
                let start = fresh.len() as u32;
                fresh.push_str(&arena[span.0 as usize..(span.0 + span.1) as usize]);
                span.0 = start;
            }
            *arena = fresh;
            *garbage = 0;
            *ordered = true;
        }
    }

    /// Keep the cells whose `keep` is true.
    fn retain(&mut self, keep: &[bool]) {
        fn filter<T: Copy>(v: &mut Vec<T>, keep: &[bool]) {
            let mut i = 0;
            v.retain(|_| {
                i += 1;
                keep[i - 1]
            });
        }
        match self {
            Cells::Num(v) => filter(v, keep),
            Cells::Dict { codes, .. } => filter(codes, keep),
            Cells::Text { spans, garbage, .. } => {
                let dropped: usize =
                    spans.iter().zip(keep).filter(|(_, k)| !**k).map(|(s, _)| s.1 as usize).sum();
                *garbage += dropped;
                filter(spans, keep);
                self.compact_arena();
            }
            Cells::Raw(v) => {
                let mut i = 0;
                v.retain(|_| {
                    i += 1;
                    keep[i - 1]
                });
            }
        }
    }

    /// Add `other`'s cells after these (the parts of a parallel build, in order).
    fn append(&mut self, other: Cells) {
        match (&mut *self, other) {
            (Cells::Num(a), Cells::Num(b)) => a.extend(b),
            (Cells::Raw(a), Cells::Raw(b)) => a.extend(b),
            (
                Cells::Text { spans, arena, garbage, ordered },
                Cells::Text { spans: more, arena: bytes, garbage: g, ordered: o },
            ) if arena.len() + bytes.len() <= u32::MAX as usize => {
                let shift = arena.len() as u32;
                arena.push_str(&bytes);
                spans.extend(more.into_iter().map(|(start, len)| (start + shift, len)));
                *garbage += g;
                *ordered = *ordered && o;
            }
            (
                Cells::Dict { codes, values, index },
                Cells::Dict { codes: more, values: strings, .. },
            ) if values.len() + strings.len() <= DICT_MAX => {
                let recode: Vec<u32> = strings
                    .into_iter()
                    .map(|v| match index.get(&v) {
                        Some(&code) => code,
                        None => {
                            let code = values.len() as u32;
                            values.push(v.clone());
                            index.insert(v, code);
                            code
                        }
                    })
                    .collect();
                codes.extend(more.into_iter().map(|c| match c {
                    BLANK_CODE => BLANK_CODE,
                    c => recode[c as usize],
                }));
            }
            (_, other) => {
                for p in 0..other.len() {
                    self.push(&value_of(other.get(p)));
                }
            }
        }
    }

    /// Give back spare capacity (a built column is not grown again soon).
    fn shrink_to_fit(&mut self) {
        match self {
            Cells::Num(v) => v.shrink_to_fit(),
            Cells::Dict { codes, .. } => codes.shrink_to_fit(),
            Cells::Text { spans, arena, .. } => {
                spans.shrink_to_fit();
                arena.shrink_to_fit();
            }
            Cells::Raw(v) => v.shrink_to_fit(),
        }
    }

    /// Bytes on the heap.
    pub fn heap_bytes(&self) -> usize {
        match self {
            Cells::Num(v) => v.capacity() * 8,
            Cells::Dict { codes, values, index } => {
                codes.capacity() * 4
                    + values.iter().map(|v| 2 * (v.len() + 16) + 16).sum::<usize>()
                    + index.capacity() * 8
            }
            Cells::Text { spans, arena, .. } => spans.capacity() * 8 + arena.capacity(),
            Cells::Raw(v) => {
                v.capacity() * std::mem::size_of::<Value>()
                    + v.iter().map(|c| c.to_string().len()).sum::<usize>()
            }
        }
    }
}

/// A cell holding `c` (a number, a string, or the raw value behind it).
fn value_of(c: CellRef<'_>) -> Value {
    match c {
        CellRef::Num(x) => serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number),
        CellRef::Str(s) => Value::String(s.to_owned()),
        CellRef::Bool(b) => Value::Bool(b),
        CellRef::List(l) => Value::Array(l.to_vec()),
        CellRef::Other(v) => v.clone(),
        CellRef::Blank => Value::Null,
    }
}

/// A sheet's kept columns, as of one version of its row map.
///
/// Invariants: `ids` is strictly ascending; a position is live (`!dead[p]`) exactly when
/// `rows` holds `ids[p]`, and then every column's cell at `p` is that row's cell; every live
/// id of `rows` has a position; `dead_count` counts the dead positions; every column has
/// `ids.len()` cells.
#[derive(Clone, Debug)]
pub struct SheetColumns {
    /// The row map the columns reflect.
    rows: OrdMap<RowId, Arc<Row>>,
    ids: Vec<RowId>,
    dead: Vec<bool>,
    dead_count: usize,
    cells: HashMap<ColumnId, Cells>,
}

/// Parse `rows` for `columns` (one parse of each row for all of them), split over threads.
fn read_columns(rows: &[&Arc<Row>], columns: &[ColumnId]) -> Vec<Cells> {
    let lookup: Vec<Option<ColumnId>> = columns.iter().copied().map(Some).collect();
    let read = |part: &[&Arc<Row>]| {
        let mut out: Vec<Cells> = columns.iter().map(|_| Cells::default()).collect();
        let mut buf = Vec::new();
        for row in part {
            row.project_into(&lookup, &mut buf);
            for (cells, cell) in out.iter_mut().zip(&buf) {
                cells.push(cell);
            }
        }
        out
    };
    let threads = threads().min(rows.len() / PARALLEL_MIN).max(1);
    if threads == 1 {
        return read(rows);
    }
    let chunk = rows.len().div_ceil(threads);
    let parts: Vec<Vec<Cells>> = std::thread::scope(|scope| {
        let handles: Vec<_> =
            rows.chunks(chunk).map(|part| scope.spawn(move || read(part))).collect();
        handles.into_iter().map(|h| h.join().expect("a column reader panicked")).collect()
    });
    let mut parts = parts.into_iter();
    let mut out = parts.next().unwrap_or_default();
    for part in parts {
        for (cells, more) in out.iter_mut().zip(part) {
            cells.append(more);
        }
    }
    out
}

impl SheetColumns {
    /// Columns `columns` of the rows of `rows`.
    pub fn build(rows: &OrdMap<RowId, Arc<Row>>, columns: &[ColumnId]) -> Self {
        let mut kept = SheetColumns {
            rows: rows.clone(),
            ids: rows.keys().copied().collect(),
            dead: vec![false; rows.len()],
            dead_count: 0,
            cells: HashMap::new(),
        };
        kept.ensure(columns);
        kept
    }

    /// Positions, dead ones included.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether no position is kept.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Whether the row at `pos` exists in the map the columns reflect.
    #[inline]
    pub fn is_live(&self, pos: usize) -> bool {
        !self.dead[pos]
    }

    /// The row id at `pos`.
    #[inline]
    pub fn id(&self, pos: usize) -> RowId {
        self.ids[pos]
    }

    /// The kept cells of `column`, if kept.
    pub fn column(&self, column: ColumnId) -> Option<&Cells> {
        self.cells.get(&column)
    }

    /// Whether the columns reflect exactly `rows`.
    pub fn reflects(&self, rows: &OrdMap<RowId, Arc<Row>>) -> bool {
        self.rows.ptr_eq(rows)
    }

    /// Bytes the columns hold on the heap (the row map they reflect is shared with the sheet).
    pub fn heap_bytes(&self) -> usize {
        self.ids.capacity() * 8
            + self.dead.capacity()
            + self.cells.values().map(|c| c.heap_bytes() + 64).sum::<usize>()
    }

    /// Keep `columns` too, reading them from the rows.
    pub fn ensure(&mut self, columns: &[ColumnId]) {
        let mut missing: Vec<ColumnId> =
            columns.iter().copied().filter(|c| !self.cells.contains_key(c)).collect();
        missing.sort_unstable();
        missing.dedup();
        if missing.is_empty() {
            return;
        }
        // New columns are read in map order, so positions must be the map's.
        self.compact();
        let rows: Vec<&Arc<Row>> = self.rows.values().collect();
        for (id, mut cells) in missing.iter().zip(read_columns(&rows, &missing)) {
            cells.shrink_to_fit();
            self.cells.insert(*id, cells);
        }
    }

    /// Bring the columns to `to`, another version of the same sheet's row map (module docs).
    pub fn sync(&mut self, to: &OrdMap<RowId, Arc<Row>>) {
        if self.rows.ptr_eq(to) {
            return;
        }
        let limit = self.ids.len() / 4 + 1_000;
        let mut changed: Vec<(RowId, Option<&Arc<Row>>)> = Vec::new();
        for item in self.rows.diff(to) {
            changed.push(match item {
                DiffItem::Add(id, row) | DiffItem::Update { new: (id, row), .. } => {
                    (*id, Some(row))
                }
                DiffItem::Remove(id, _) => (*id, None),
            });
            if changed.len() > limit {
                return self.rebuild(to);
            }
        }
        let columns: Vec<ColumnId> = self.cells.keys().copied().collect();
        let lookup: Vec<Option<ColumnId>> = columns.iter().copied().map(Some).collect();
        let mut buf = Vec::new();
        for (id, row) in changed {
            let pos = match (self.ids.binary_search(&id), row) {
                (Ok(pos), _) => pos,
                (Err(pos), Some(_)) if pos == self.ids.len() => {
                    self.ids.push(id);
                    self.dead.push(true);
                    self.dead_count += 1;
                    for cells in self.cells.values_mut() {
                        cells.push(&Value::Null);
                    }
                    pos
                }
                // A row below the highest kept id, or a removal of a row never kept.
                (Err(_), _) => return self.rebuild(to),
            };
            match row {
                Some(row) => row.project_into(&lookup, &mut buf),
                None => {
                    buf.clear();
                    buf.resize(lookup.len(), Value::Null);
                }
            }
            for (column, cell) in columns.iter().zip(&buf) {
                // An unchanged cell is left alone: a text cell rewritten would leave garbage.
                match self.cells.get_mut(column) {
                    Some(cells) if cells.get(pos) != CellRef::of(cell) => cells.set(pos, cell),
                    _ => {}
                }
            }
            let dead = row.is_none();
            if self.dead[pos] != dead {
                self.dead[pos] = dead;
                if dead {
                    self.dead_count += 1;
                } else {
                    self.dead_count -= 1;
                }
            }
        }
        self.rows = to.clone();
        if self.dead_count > self.ids.len() / 8 + DEAD_MAX {
            self.compact();
        }
    }

    /// Read the columns afresh from `to`.
    fn rebuild(&mut self, to: &OrdMap<RowId, Arc<Row>>) {
        let columns: Vec<ColumnId> = self.cells.keys().copied().collect();
        *self = SheetColumns::build(to, &columns);
    }

    /// Drop the dead positions.
    fn compact(&mut self) {
        if self.dead_count == 0 {
            return;
        }
        let keep: Vec<bool> = self.dead.iter().map(|d| !d).collect();
        let mut i = 0;
        self.ids.retain(|_| {
            i += 1;
            keep[i - 1]
        });
        for cells in self.cells.values_mut() {
            cells.retain(&keep);
        }
        self.dead = vec![false; self.ids.len()];
        self.dead_count = 0;
    }
}

/// One sheet's entry in the [`ColumnCache`].
struct Kept {
    columns: Arc<Mutex<Option<SheetColumns>>>,
    /// Heap bytes after the last run that used it.
    bytes: usize,
    used: Instant,
}

/// Every sheet's kept columns, under one byte budget (module docs).
#[derive(Default)]
pub struct ColumnCache {
    inner: Mutex<CacheState>,
}

#[derive(Default)]
struct CacheState {
    budget: usize,
    sheets: HashMap<SheetId, Kept>,
}

/// What [`ColumnCache::stats`] tells.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ColumnCacheStats {
    /// Sheets with kept columns.
    pub sheets: usize,
    /// Their heap bytes, as of each one's last run.
    pub bytes: usize,
    /// The budget (0: off).
    pub budget: usize,
}

/// A sheet's slot, locked by a run while it syncs and scans its columns.
pub type Slot = Arc<Mutex<Option<SheetColumns>>>;

/// Lock a slot: a run that panicked half-way through a sync left columns that may not
/// reflect their map, so they are dropped and rebuilt.
pub fn lock_slot(slot: &Slot) -> MutexGuard<'_, Option<SheetColumns>> {
    slot.lock().unwrap_or_else(|poisoned| {
        let mut guard = poisoned.into_inner();
        *guard = None;
        guard
    })
}

impl ColumnCache {
    /// A cache with `budget` bytes (0: off).
    pub fn new(budget: usize) -> Self {
        ColumnCache { inner: Mutex::new(CacheState { budget, sheets: HashMap::new() }) }
    }

    fn state(&self) -> MutexGuard<'_, CacheState> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Change the budget, dropping sheets until the rest fit.
    pub fn set_budget(&self, budget: usize) {
        let mut state = self.state();
        state.budget = budget;
        state.fit(None, Instant::now());
    }

    /// The slot of `sheet`'s columns, made when missing; `None` when the cache is off.
    pub fn slot(&self, sheet: SheetId) -> Option<Slot> {
        let mut state = self.state();
        if state.budget == 0 {
            return None;
        }
        let now = Instant::now();
        let kept = state.sheets.entry(sheet).or_insert_with(|| Kept {
            columns: Arc::default(),
            bytes: 0,
            used: now,
        });
        kept.used = now;
        Some(kept.columns.clone())
    }

    /// After a run: `sheet`'s columns now hold `bytes`; drop sheets until the cache fits.
    pub fn note(&self, sheet: SheetId, bytes: usize) {
        let mut state = self.state();
        let now = Instant::now();
        if let Some(kept) = state.sheets.get_mut(&sheet) {
            kept.bytes = bytes;
            kept.used = now;
        }
        state.fit(Some(sheet), now);
    }

    /// Drop the sheets unused for [`IDLE`].
    pub fn expire(&self) {
        self.state().fit(None, Instant::now());
    }

    /// Sheets, bytes and budget.
    pub fn stats(&self) -> ColumnCacheStats {
        let state = self.state();
        ColumnCacheStats {
            sheets: state.sheets.len(),
            bytes: state.sheets.values().map(|k| k.bytes).sum(),
            budget: state.budget,
        }
    }
}

impl CacheState {
    /// Drop idle sheets, then the least recently used until the rest fit the budget; `last` (the
    /// sheet just used) goes last, and only when it alone exceeds the budget.
    fn fit(&mut self, last: Option<SheetId>, now: Instant) {
        self.sheets.retain(|_, k| now.duration_since(k.used) < IDLE);
        loop {
            let total: usize = self.sheets.values().map(|k| k.bytes).sum();
            if total <= self.budget {
                return;
            }
            let victim = self
                .sheets
                .iter()
                .min_by_key(|(id, k)| (Some(**id) == last, k.used))
                .map(|(id, _)| *id);
            match victim {
                Some(id) => {
                    self.sheets.remove(&id);
                }
                None => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn row(id: RowId, cells: Value) -> Arc<Row> {
        Arc::new(crate::report::run::tests::row(id, 1, cells))
    }

    fn read(kept: &SheetColumns, column: ColumnId) -> Vec<(RowId, Value)> {
        let cells = kept.column(column).unwrap();
        (0..kept.len())
            .filter(|p| kept.is_live(*p))
            .map(|p| (kept.id(p), value_of(cells.get(p))))
            .collect()
    }

    #[test]
    fn cells_change_form_to_hold_what_they_are_given() {
        let mut c = Cells::default();
        c.push(&Value::Null);
        c.push(&json!("a"));
        assert!(matches!(c, Cells::Dict { .. }), "blanks then strings: a dictionary");
        for i in 0..DICT_MAX + 1 {
            c.push(&json!(format!("s{i}")));
        }
        assert!(matches!(c, Cells::Text { .. }), "past {DICT_MAX} values: an arena");
        assert_eq!((c.get(0), c.get(1)), (CellRef::Blank, CellRef::Str("a")));
        c.push(&json!({"value": 2.5, "format": "0.0"}));
        assert!(matches!(c, Cells::Raw(_)), "a number among strings: raw cells");
        assert_eq!(c.get(c.len() - 1), CellRef::Num(2.5));
        assert_eq!(c.get(1), CellRef::Str("a"));
        let mut n = Cells::default();
        n.push(&json!(-0.0));
        n.push(&json!(""));
        assert_eq!((n.get(0), n.get(1)), (CellRef::Num(0.0), CellRef::Blank));
        assert!(matches!(n, Cells::Num(_)));
    }

    #[test]
    fn parts_append_in_order_whatever_their_forms() {
        let cells = [
            json!("b"),
            json!(null),
            json!("a"),
            json!("c"),
            json!("b"),
            json!(""),
            json!("d"),
            json!("e"),
            json!("f"),
            json!("g"),
            json!("h"),
            json!("i"),
            json!("j"),
            json!("a"),
            json!(3),
            json!("a"),
        ];
        for cut in 0..cells.len() {
            for end in cut..=cells.len() {
                let (mut whole, mut left, mut right) =
                    (Cells::default(), Cells::default(), Cells::default());
                cells[..end].iter().for_each(|c| whole.push(c));
                cells[..cut].iter().for_each(|c| left.push(c));
                cells[cut..end].iter().for_each(|c| right.push(c));
                left.append(right);
                let read = |c: &Cells| (0..c.len()).map(|p| value_of(c.get(p))).collect::<Vec<_>>();
                assert_eq!(read(&left), read(&whole), "cut at {cut} of {end}");
            }
        }
    }

    #[test]
    fn sync_follows_updates_removals_and_appends() {
        let mut rows: OrdMap<RowId, Arc<Row>> =
            (1..=10).map(|i| (i, row(i, json!({"7": i, "8": format!("t{i}")})))).collect();
        let mut kept = SheetColumns::build(&rows, &[7]);
        rows.insert(3, row(3, json!({"7": "three"})));
        rows.remove(&5);
        rows.insert(11, row(11, json!({"8": "new"})));
        kept.sync(&rows);
        assert!(kept.reflects(&rows));
        let want: Vec<(RowId, Value)> = rows
            .values()
            .map(|r| (r.id, value_of(CellRef::of(&r.cell(7).unwrap_or_default()))))
            .collect();
        assert_eq!(read(&kept, 7), want);
        // A row below the highest id rebuilds; a new column is read from the rows.
        rows.insert(0, row(0, json!({"7": 0})));
        kept.sync(&rows);
        kept.ensure(&[8]);
        assert_eq!(read(&kept, 7)[0], (0, json!(0.0)));
        assert_eq!(read(&kept, 8).len(), rows.len());
        assert_eq!(read(&kept, 8)[3], (3, Value::Null));
    }

    #[test]
    fn the_budget_drops_the_least_recently_used() {
        let cache = ColumnCache::new(100);
        assert!(cache.slot(1).is_some());
        cache.note(1, 60);
        assert!(cache.slot(2).is_some());
        cache.note(2, 60);
        assert_eq!(cache.stats(), ColumnCacheStats { sheets: 1, bytes: 60, budget: 100 });
        assert!(cache.state().sheets.contains_key(&2), "sheet 1 was used longer ago");
        cache.note(2, 160);
        assert_eq!(cache.stats().sheets, 0, "alone over the budget: dropped after its run");
        cache.set_budget(0);
        assert!(cache.slot(3).is_none(), "off");
    }
}
