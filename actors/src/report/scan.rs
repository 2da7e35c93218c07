//! Running a compiled [`QueryPlan`] over columns kept for scanning ([`super::columns`]) instead
//! of the rows' JSON: the same result as the row scan ([`super::run::execute`]), which stays the
//! reference (the property test `kept_columns_run_like_rows` compares the two).
//!
//! # Same result
//!
//! Everything that decides a result is shared with the row scan, not repeated: a cell is the
//! [`CellRef`] the row scan would read ([`Cells::get`]); filters go through
//! [`super::run::test`]; sorting through [`sort_cmp`] with the scan position as the last key
//! (positions are in source order, then row id order, as the row scan visits rows); groups are
//! classes of equal [`CellRef`]s, aggregated by `Acc` and ordered by `order_groups`; a value
//! shown (a group's key, a `min` or `max`) is read from the row the row scan would take it from.
//!
//! # Faster
//!
//! - A filter on a dictionary column is tested once per distinct value, then looked up by code.
//! - `contains` on a text column whose arena is in position order searches the whole arena for
//!   the needle's caseless run (`caseless_fragment`) and tests only the rows holding it.
//! - A flat run orders only its first [`PREFIX`] rows (a bounded selection instead of a sort of
//!   every match); a page past them orders the whole result once, by the row scan
//!   (`super::run::Rest`). [`PREFIX`] is at least two pages of the largest `limit`.
//! - The scan is split into contiguous parts, one per core, merged in scan order. Sums are
//!   split only when no rounding can tell the orders apart (`super::run::Sum`, checked up
//!   front by `sums_split`, and again by each merge: a refused merge runs the aggregation
//!   again on one thread, in scan order).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::ops::Range;

use serde_json::Value;

use super::columns::{threads, Cells, SheetColumns, BLANK_CODE};
use super::compile::{Predicate, QueryPlan, Shape, Source};
use super::definition::{AggFn, Direction, Op};
use super::run::{
    dyadic, exact_in_any_order, order_groups, selected, shown, sort_cmp, test, unwrap, Acc,
    CellRef, Output, Rest, RunResult,
};
use crate::model::ColumnId;

/// Rows a flat run orders up front: two pages of the largest `limit` (500).
pub const PREFIX: usize = 1_000;
/// Positions per thread below which a scan stays on one thread.
const PARALLEL_MIN: usize = 100_000;

/// A row in scan order: (source index, position).
type At = (u32, u32);

/// One source's kept columns, as a plan reads them.
struct View<'a> {
    sheet: &'a SheetColumns,
    /// The cells of each plan field (`None`: the source lacks the column; its cells are blank).
    fields: Vec<Option<&'a Cells>>,
    check: Option<Check<'a>>,
}

impl<'a> View<'a> {
    #[inline]
    fn cell(&self, field: usize, pos: usize) -> CellRef<'a> {
        self.fields[field].map_or(CellRef::Blank, |c| c.get(pos))
    }
}

/// A filter bound to one source's cells.
enum Check<'a> {
    All(Vec<Check<'a>>),
    Any(Vec<Check<'a>>),
    /// A test on a column the source lacks: the same for every row.
    Const(bool),
    /// A test on a dictionary column: its outcome per code, and for a blank cell.
    Codes {
        codes: &'a [u32],
        pass: Vec<bool>,
        blank: bool,
    },
    /// A test already run for every position.
    Hits(Vec<bool>),
    /// Any other test.
    Cell {
        cells: &'a Cells,
        op: Op,
        operand: &'a Value,
        needle: &'a str,
        instants: bool,
    },
}

impl<'a> Check<'a> {
    fn new(p: &'a Predicate, fields: &[Option<&'a Cells>]) -> Self {
        match p {
            Predicate::All(parts) => {
                Check::All(parts.iter().map(|p| Check::new(p, fields)).collect())
            }
            Predicate::Any(parts) => {
                Check::Any(parts.iter().map(|p| Check::new(p, fields)).collect())
            }
            Predicate::Test { field, op, operand, needle, instants } => {
                let (op, instants) = (*op, *instants);
                let of = |c: CellRef<'_>| test(c, op, operand, needle, instants);
                match fields[*field] {
                    None => Check::Const(of(CellRef::Blank)),
                    Some(Cells::Dict { codes, values, .. }) => Check::Codes {
                        codes,
                        pass: values.iter().map(|v| of(CellRef::Str(v))).collect(),
                        blank: of(CellRef::Blank),
                    },
                    Some(cells @ Cells::Text { spans, arena, ordered: true, .. })
                        if op == Op::Contains && caseless_fragment(needle).is_some() =>
                    {
                        let fragment = caseless_fragment(needle).unwrap_or_default();
                        Check::Hits(text_hits(spans, arena, fragment, |p| of(cells.get(p))))
                    }
                    Some(cells) => Check::Cell { cells, op, operand, needle, instants },
                }
            }
        }
    }

    #[inline]
    fn pass(&self, pos: usize) -> bool {
        match self {
            Check::All(parts) => parts.iter().all(|p| p.pass(pos)),
            Check::Any(parts) => parts.iter().any(|p| p.pass(pos)),
            Check::Const(b) => *b,
            Check::Hits(hits) => hits[pos],
            Check::Codes { codes, pass, blank } => match codes[pos] {
                BLANK_CODE => *blank,
                c => pass[c as usize],
            },
            Check::Cell { cells, op, operand, needle, instants } => {
                test(cells.get(pos), *op, operand, needle, *instants)
            }
        }
    }
}

/// The longest run of `needle`'s bytes that case folding leaves alone (ASCII other than
/// letters), when the needle is ASCII: a text holding the needle in any case holds this run as
/// it is (lower-casing never makes such a byte out of another character).
fn caseless_fragment(needle: &str) -> Option<&[u8]> {
    let runs = needle.as_bytes().split(|b| b.is_ascii_alphabetic());
    runs.max_by_key(|run| run.len()).filter(|run| !run.is_empty() && needle.is_ascii())
}

/// `contains` over a text column in position order: the arena searched whole for `fragment`
/// (a vector search over the bytes, instead of a search per cell), each hit's position found
/// by binary search and tested in full by `pass`.
fn text_hits(
    spans: &[(u32, u32)],
    arena: &str,
    fragment: &[u8],
    pass: impl Fn(usize) -> bool,
) -> Vec<bool> {
    let mut hits = vec![false; spans.len()];
    let finder = memchr::memmem::Finder::new(fragment);
    let bytes = arena.as_bytes();
    let mut from = 0;
    while let Some(i) = finder.find(&bytes[from..]) {
        let at = from + i;
        from = at + 1;
        // The last span starting at or before the hit holds it, if any does.
        let Some(pos) = spans.partition_point(|s| s.0 as usize <= at).checked_sub(1) else {
            continue;
        };
        let end = (spans[pos].0 + spans[pos].1) as usize;
        if at + fragment.len() <= end && !hits[pos] && pass(pos) {
            hits[pos] = true;
            from = end;
        }
    }
    hits
}

/// A contiguous part of the scan order: position ranges of sources, in order.
type Segment = Vec<(usize, Range<usize>)>;

/// The scan order cut into `parts` contiguous segments of about equal positions.
fn segments(views: &[View<'_>], parts: usize) -> Vec<Segment> {
    let total: usize = views.iter().map(|v| v.sheet.len()).sum();
    let per = total.div_ceil(parts.max(1)).max(1);
    let mut out = vec![Vec::new()];
    let mut room = per;
    for (s, view) in views.iter().enumerate() {
        let mut start = 0;
        while start < view.sheet.len() {
            if room == 0 {
                out.push(Vec::new());
                room = per;
            }
            let end = view.sheet.len().min(start + room);
            out.last_mut().expect("one segment at least").push((s, start..end));
            room -= end - start;
            start = end;
        }
    }
    out
}

/// `visit(at)` for every live row of `segment` that passes the filter, in scan order.
fn scan(views: &[View<'_>], segment: &Segment, mut visit: impl FnMut(At)) {
    for (s, range) in segment {
        let view = &views[*s];
        for pos in range.clone() {
            if view.sheet.is_live(pos) && view.check.as_ref().is_none_or(|c| c.pass(pos)) {
                visit((*s as u32, pos as u32));
            }
        }
    }
}

/// `work` on each segment, on a thread each when there are several.
fn each<T: Send>(segments: &[Segment], work: impl Fn(&Segment) -> T + Sync) -> Vec<T> {
    if segments.len() < 2 {
        return segments.iter().map(&work).collect();
    }
    std::thread::scope(|scope| {
        let work = &work;
        let handles: Vec<_> = segments.iter().map(|seg| scope.spawn(move || work(seg))).collect();
        handles.into_iter().map(|h| h.join().expect("a report scan panicked")).collect()
    })
}

/// Run `plan` over `sources` reading their cells from `kept` (one per source, each reflecting
/// exactly that source's rows and keeping every column `plan.lookup` names for it).
pub fn execute_kept(plan: &QueryPlan, sources: &[Source], kept: &[&SheetColumns]) -> RunResult {
    let total: usize = kept.iter().map(|k| k.len()).sum();
    execute_kept_in(plan, sources, kept, threads().min(total / PARALLEL_MIN).max(1))
}

/// [`execute_kept`], the scan cut into `parts` segments.
fn execute_kept_in(
    plan: &QueryPlan,
    sources: &[Source],
    kept: &[&SheetColumns],
    parts: usize,
) -> RunResult {
    debug_assert!(sources.iter().zip(kept).all(|(s, k)| k.reflects(&s.rows)));
    let views: Vec<View<'_>> = kept
        .iter()
        .zip(&plan.lookup)
        .map(|(sheet, lookup)| {
            let fields: Vec<Option<&Cells>> = lookup
                .iter()
                .map(|c| c.map(|c| sheet.column(c).expect("every column the plan reads is kept")))
                .collect();
            let check = plan.filter.as_ref().map(|p| Check::new(p, &fields));
            View { sheet, fields, check }
        })
        .collect();
    let segs = segments(&views, parts);
    match &plan.shape {
        Shape::Flat { select, sort } => {
            let (matched, first) = flat(&views, &segs, sort);
            let order =
                first.iter().map(|&(s, p)| (s, views[s as usize].sheet.id(p as usize))).collect();
            let rest = (matched > first.len()).then(|| Rest::new(plan, sources));
            let output = Output::Flat {
                rows: sources.iter().map(|s| s.rows.clone()).collect(),
                select: selected(plan, select),
                order,
                rest,
            };
            RunResult::new(plan, sources, matched as u64, output)
        }
        Shape::Grouped { group_by, aggregates, sort } => {
            let grouped = |segs: &[Segment]| grouped(&views, segs, group_by, aggregates);
            // Sums that could round otherwise when split are added in one pass, in scan order.
            let segs = if segs.len() > 1 && !sums_split(&views, aggregates) {
                segments(&views, 1)
            } else {
                segs
            };
            let groups = grouped(&segs).unwrap_or_else(|| {
                let whole = segments(&views, 1);
                grouped(&whole).expect("one segment merges nothing")
            });
            let rows = grid(plan, sources, &views, &groups, group_by, aggregates);
            let keys: Vec<Vec<CellRef<'_>>> = groups.iter().map(|g| g.key.clone()).collect();
            let rows = order_groups(rows, &keys, sort);
            RunResult::new(plan, sources, rows.len() as u64, Output::Grid(rows))
        }
    }
}

/// Whether every number the `sum`s and `avg`s of `aggregates` could add is such that any
/// order of the additions gives the same sum (`super::run::Sum`): then a scan split into parts
/// merges its sums exactly. One pass over the summed columns, which stops at the first number
/// that does not qualify.
fn sums_split(views: &[View<'_>], aggregates: &[(AggFn, Option<usize>)]) -> bool {
    let mut magnitude = 0.0;
    for (func, field) in aggregates {
        let Some(field) = field.filter(|_| matches!(func, AggFn::Sum | AggFn::Avg)) else {
            continue;
        };
        for cells in views.iter().filter_map(|v| v.fields[field]) {
            for pos in 0..cells.len() {
                if let CellRef::Num(x) = cells.get(pos) {
                    if !dyadic(x) {
                        return false;
                    }
                    magnitude += x.abs();
                }
            }
        }
    }
    exact_in_any_order(magnitude)
}

/// How many rows match, and the first [`PREFIX`] of them in result order.
fn flat(views: &[View<'_>], segs: &[Segment], sort: &[(usize, Direction)]) -> (usize, Vec<At>) {
    let cmp = |a: &At, b: &At| {
        let (va, vb) = (&views[a.0 as usize], &views[b.0 as usize]);
        sort.iter()
            .map(|(f, dir)| sort_cmp(va.cell(*f, a.1 as usize), vb.cell(*f, b.1 as usize), *dir))
            .find(|o| o.is_ne())
            .unwrap_or_else(|| a.cmp(b))
    };
    let parts = each(segs, |seg| {
        let mut matched = 0usize;
        let mut best: Vec<At> = Vec::new();
        if sort.is_empty() {
            scan(views, seg, |at| {
                matched += 1;
                if best.len() < PREFIX {
                    best.push(at);
                }
            });
            return (matched, best);
        }
        // The best PREFIX so far are kept among at most 2 × PREFIX candidates; once the buffer
        // has been cut, a row no better than the worst kept one is not a candidate.
        let mut worst: Option<At> = None;
        scan(views, seg, |at| {
            matched += 1;
            if worst.is_some_and(|w| cmp(&at, &w).is_ge()) {
                return;
            }
            best.push(at);
            if best.len() == 2 * PREFIX {
                best.select_nth_unstable_by(PREFIX - 1, cmp);
                best.truncate(PREFIX);
                worst = best.iter().copied().max_by(cmp);
            }
        });
        (matched, best)
    });
    let matched = parts.iter().map(|p| p.0).sum();
    let mut first: Vec<At> = parts.into_iter().flat_map(|p| p.1).collect();
    if !sort.is_empty() {
        first.sort_unstable_by(cmp);
    }
    first.truncate(PREFIX);
    (matched, first)
}

/// A `min` or `max` held by a scan of kept columns: the cell and its row.
type Best<'a> = (CellRef<'a>, At);

/// One group.
struct Group<'a> {
    /// Its key cells (one per `groupBy` field).
    key: Vec<CellRef<'a>>,
    /// Its first row in scan order, whose values the group shows.
    first: At,
    accs: Vec<Acc<Best<'a>>>,
}

/// Groups of one segment, found by the hash of their key cells.
struct Groups<'a> {
    list: Vec<Group<'a>>,
    index: HashMap<u64, Vec<usize>>,
    hashing: std::collections::hash_map::RandomState,
}

impl<'a> Groups<'a> {
    fn new() -> Self {
        Groups { list: Vec::new(), index: HashMap::new(), hashing: Default::default() }
    }

    /// The group of `key`, made (first seen at `at`) when missing.
    fn find(
        &mut self,
        key: &[CellRef<'a>],
        at: At,
        aggregates: &[(AggFn, Option<usize>)],
    ) -> usize {
        let mut h = self.hashing.build_hasher();
        key.iter().for_each(|c| c.hash(&mut h));
        let candidates = self.index.entry(h.finish()).or_default();
        if let Some(g) = candidates.iter().copied().find(|g| self.list[*g].key == key) {
            return g;
        }
        self.list.push(Group {
            key: key.to_vec(),
            first: at,
            accs: aggregates.iter().map(|(f, _)| Acc::new(*f)).collect(),
        });
        candidates.push(self.list.len() - 1);
        self.list.len() - 1
    }
}

/// The groups of the scan, merged in scan order; `None` when a merge of sums could round
/// otherwise than one pass in scan order.
fn grouped<'a>(
    views: &[View<'a>],
    segs: &[Segment],
    group_by: &[usize],
    aggregates: &[(AggFn, Option<usize>)],
) -> Option<Vec<Group<'a>>> {
    let parts = each(segs, |seg| {
        let mut groups = Groups::new();
        // A single dictionary key: each source's code → group, found once per code.
        let mut by_code: Vec<Vec<usize>> = views.iter().map(|_| Vec::new()).collect();
        let mut key: Vec<CellRef<'a>> = Vec::with_capacity(group_by.len());
        scan(views, seg, |at| {
            let (s, pos) = (at.0 as usize, at.1 as usize);
            let view = &views[s];
            let code = match group_by {
                [f] => match view.fields[*f] {
                    Some(Cells::Dict { codes, .. }) => Some(match codes[pos] {
                        BLANK_CODE => 0,
                        c => c as usize + 1,
                    }),
                    _ => None,
                },
                _ => None,
            };
            let cached = code.and_then(|c| by_code[s].get(c).copied().filter(|g| *g != usize::MAX));
            let g = match cached {
                Some(g) => g,
                None => {
                    key.clear();
                    key.extend(group_by.iter().map(|f| view.cell(*f, pos)));
                    let g = groups.find(&key, at, aggregates);
                    if let Some(c) = code {
                        let map = &mut by_code[s];
                        if map.len() <= c {
                            map.resize(c + 1, usize::MAX);
                        }
                        map[c] = g;
                    }
                    g
                }
            };
            for (acc, (_, field)) in groups.list[g].accs.iter_mut().zip(aggregates) {
                let c = field.map(|f| view.cell(f, pos));
                acc.add(c, |b: &Best<'a>| b.0, || (c.unwrap_or(CellRef::Blank), at));
            }
        });
        groups
    });
    let mut parts = parts.into_iter();
    let mut merged = parts.next().unwrap_or_else(Groups::new);
    for part in parts {
        for group in part.list {
            let g = merged.find(&group.key, group.first, aggregates);
            let accs = std::mem::take(&mut merged.list[g].accs);
            merged.list[g].accs = accs
                .into_iter()
                .zip(group.accs)
                .map(|(a, b)| a.merge(b, |b: &Best<'a>| b.0))
                .collect::<Option<Vec<_>>>()?;
        }
    }
    if group_by.is_empty() && merged.list.is_empty() {
        merged.find(&[], (0, 0), aggregates);
    }
    Some(merged.list)
}

/// The output rows of `groups` (unordered): key values and aggregates, read from the rows the
/// row scan would take them from.
fn grid(
    plan: &QueryPlan,
    sources: &[Source],
    views: &[View<'_>],
    groups: &[Group<'_>],
    group_by: &[usize],
    aggregates: &[(AggFn, Option<usize>)],
) -> Vec<Vec<Value>> {
    // The stored cell of `field` in the row at `at`.
    let raw = |field: usize, at: At| -> Value {
        let (s, pos) = (at.0 as usize, at.1 as usize);
        let column: Option<ColumnId> = plan.lookup[s][field];
        let id = views[s].sheet.id(pos);
        match sources[s].rows.get(&id) {
            Some(row) if column.is_some() => row.project(&[column]).remove(0),
            _ => Value::Null,
        }
    };
    groups
        .iter()
        .map(|g| {
            let keys = group_by.iter().map(|f| shown(&raw(*f, g.first)));
            let values = g.accs.iter().zip(aggregates).map(|(acc, (_, field))| {
                acc.value(|best: &Best<'_>| match field {
                    Some(f) => unwrap(&raw(*f, best.1)).clone(),
                    None => Value::Null,
                })
            });
            keys.chain(values).collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use imbl::OrdMap;
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::model::{Column, ColumnType, Json, Row, RowId, SheetId, SOURCE_IMPORT};
    use crate::report::columns::{lock_slot, ColumnCache, DEFAULT_BUDGET};
    use crate::report::compile::compile;
    use crate::report::definition::parse;
    use crate::report::run::execute;
    use crate::report::run_plan;

    /// Column ids of each sheet: (Task, Status, Hours, Flag, Tags); sheet 11 has no Tags.
    fn columns(sheet: SheetId) -> Arc<[Column]> {
        let base = sheet * 100;
        let col = |id: ColumnId, name: &str, ty: ColumnType, options: Option<&[&str]>| Column {
            id,
            sheet_id: sheet,
            name: name.into(),
            ty,
            position: (id - base) as i64,
            options: options.map(|o| o.iter().map(|s| (*s).to_owned()).collect()),
            primary: false,
        };
        let mut cols = vec![
            col(base + 1, "Task", ColumnType::Text, None),
            col(base + 2, "Status", ColumnType::Dropdown, Some(&["Open", "Done", "Blocked"])),
            col(base + 3, "Hours", ColumnType::Number, None),
            col(base + 4, "Flag", ColumnType::Checkbox, None),
        ];
        if sheet == 10 {
            cols.push(col(base + 5, "Tags", ColumnType::MultiSelect, Some(&["a", "b"])));
        }
        cols.into()
    }

    fn cell() -> impl Strategy<Value = Option<Value>> {
        proptest::option::of(prop_oneof![
            Just(json!(null)),
            Just(json!("")),
            Just(json!([])),
            Just(json!(true)),
            Just(json!(false)),
            (-3i64..6).prop_map(|n| json!(n)),
            Just(json!(2.5)),
            Just(json!(0.1)),
            Just(json!(-0.0)),
            Just(json!(5.0)),
            Just(json!({"value": 8, "format": "0.0"})),
            Just(json!({"formula": "=1"})),
            prop::sample::select(vec![
                "alpha",
                "Beta",
                "ALPHA beta",
                "gamma Δ",
                "x1",
                "Open",
                "Done",
                "Blocked",
                "x 12",
                "ab 12c",
                "Ω 1",
                "X 1",
            ])
            .prop_map(|s| json!(s)),
            Just(json!(["a"])),
            Just(json!(["a", "b"])),
        ])
    }

    /// A cell of the column at `index` (Task, Status, Hours, Flag, Tags): mostly of its type
    /// (so columns take their typed forms), now and then anything.
    fn typed(index: usize) -> impl Strategy<Value = Option<Value>> {
        let strings = |v: &[&'static str]| prop::sample::select(v.to_vec()).prop_map(|s| json!(s));
        let own: BoxedStrategy<Value> = match index {
            0 => strings(&[
                "alpha",
                "Beta",
                "ALPHA beta",
                "gamma Δ",
                "x 12",
                "ab 12c",
                "Ω 1",
                "X 1",
                "",
            ])
            .boxed(),
            1 => strings(&["Open", "Done", "Blocked"]).boxed(),
            2 => prop_oneof![
                (-3i64..6).prop_map(|n| json!(n)),
                Just(json!(0.1)),
                Just(json!(2.5)),
                Just(json!({"value": 8, "format": "0.0"})),
            ]
            .boxed(),
            3 => proptest::bool::ANY.prop_map(|b| json!(b)).boxed(),
            _ => strings(&["a", "b"]).prop_map(|s| json!([s])).boxed(),
        };
        prop_oneof![12 => proptest::option::of(own), 1 => cell()]
    }

    /// Cells of a row of `sheet`: each column of the sheet may hold one.
    fn cells(sheet: SheetId) -> impl Strategy<Value = Vec<(ColumnId, Value)>> {
        (typed(0), typed(1), typed(2), typed(3), typed(4)).prop_map(move |(a, b, c, d, e)| {
            [a, b, c, d, e]
                .into_iter()
                .enumerate()
                .filter_map(|(i, c)| Some((sheet * 100 + 1 + i as u64, c?)))
                .collect()
        })
    }

    #[derive(Clone, Debug)]
    enum Step {
        /// Write a row: `slot` picks an existing row (an update) or, past them, a new id above
        /// (or, when `below`, beneath) the sheet's ids.
        Put {
            sheet: SheetId,
            slot: usize,
            below: bool,
            cells: Vec<(ColumnId, Value)>,
        },
        Delete {
            sheet: SheetId,
            slot: usize,
        },
        /// A new process: no kept columns, rows decoded afresh.
        Restart,
        /// The same rows in new maps (nothing shared with the kept columns' map).
        Reload,
        /// Run a definition by both paths and compare.
        Run {
            def: usize,
            parts: usize,
        },
    }

    fn step() -> impl Strategy<Value = Step> {
        let sheet = prop::sample::select(vec![10u64, 11]);
        prop_oneof![
            6 => (sheet.clone(), 0..40usize, proptest::bool::weighted(0.1))
                .prop_flat_map(|(sheet, slot, below)| cells(sheet)
                    .prop_map(move |cells| Step::Put { sheet, slot, below, cells })),
            2 => (sheet, 0..40usize).prop_map(|(sheet, slot)| Step::Delete { sheet, slot }),
            1 => Just(Step::Restart),
            1 => Just(Step::Reload),
            4 => (0..DEFINITIONS.len(), 1..4usize).prop_map(|(def, parts)| Step::Run { def, parts }),
        ]
    }

    const DEFINITIONS: &[&str] = &[
        r#"{"type": "summary", "sources": [10, 11], "groupBy": ["Status"], "aggregates": [{"fn": "count"},
            {"fn": "sum", "column": "Hours"}, {"fn": "avg", "column": "Hours"}, {"fn": "min", "column": "Hours"},
            {"fn": "max", "column": "Task"}, {"fn": "count", "column": "Tags"}]}"#,
        r#"{"type": "summary", "sources": [10, 11], "groupBy": ["Task", "Flag"], "aggregates": [{"fn": "count"},
            {"fn": "max", "column": "Hours"}], "sort": [{"column": "count", "direction": "desc"}]}"#,
        r#"{"type": "summary", "sources": [11, 10], "aggregates": [{"fn": "count"}, {"fn": "sum", "column": "Hours"},
            {"fn": "min", "column": "Task"}], "filter": {"column": "Hours", "op": "gt", "value": 1}}"#,
        r#"{"type": "summary", "sources": [10], "groupBy": ["Tags"], "aggregates": [{"fn": "count"}]}"#,
        r#"{"type": "summary", "sources": [10, 11], "groupBy": ["Hours"], "aggregates": [{"fn": "sum", "column": "Hours"}]}"#,
        r#"{"type": "row", "sources": [10, 11], "columns": ["Task", "Hours"], "sort": [{"column": "Task"}],
            "filter": {"column": "Hours", "op": "gt", "value": 0}}"#,
        r#"{"type": "row", "sources": [10, 11], "columns": ["Task", "Status"],
            "filter": {"column": "Task", "op": "contains", "value": "AL"}}"#,
        r#"{"type": "row", "sources": [11, 10], "columns": ["Task", "Status", "Hours", "Tags"],
            "sort": [{"column": "Hours", "direction": "desc"}, {"column": "Status"}]}"#,
        r#"{"type": "row", "sources": [10, 11], "columns": ["Task", "Flag"], "sort": [{"column": "Flag", "direction": "desc"}],
            "filter": {"any": [{"column": "Status", "op": "in", "value": ["Open", "Blocked"]},
                               {"column": "Tags", "op": "contains", "value": "b"},
                               {"all": [{"column": "Status", "op": "is_blank"}, {"column": "Task", "op": "ne", "value": "alpha"}]}]}}"#,
        r#"{"type": "row", "sources": [10], "columns": ["Task"], "filter": {"column": "Status", "op": "eq", "value": "Done"}}"#,
        r#"{"type": "row", "sources": [10, 11], "columns": ["Task"], "filter": {"column": "Task", "op": "contains", "value": "X 1"}}"#,
    ];

    fn row(sheet: SheetId, id: RowId, cells: &[(ColumnId, Value)]) -> Arc<Row> {
        let cells = cells.iter().map(|(c, v)| (*c, Json(v.clone()))).collect();
        Arc::new(Row::new(id, sheet, cells, SOURCE_IMPORT, 0))
    }

    /// Output columns, scanned and matched counts, every row, and a page from offset 1.
    type Shown = (Vec<String>, u64, u64, Vec<Vec<Value>>, Vec<Vec<Value>>);

    /// What a result shows: everything but its run id.
    fn shown(r: &RunResult) -> Shown {
        let names = r.columns.iter().map(|c| format!("{} {}", c.name, c.ty.as_str())).collect();
        (names, r.scanned_rows, r.total_matched, r.page(0, usize::MAX), r.page(1, 2))
    }

    fn sources(maps: &[(SheetId, OrdMap<RowId, Arc<Row>>)], def: &Value) -> Vec<Source> {
        let listed: Vec<SheetId> =
            def["sources"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        listed
            .iter()
            .map(|id| {
                let rows = maps.iter().find(|(s, _)| s == id).unwrap().1.clone();
                Source { sheet_id: *id, columns: columns(*id), rows }
            })
            .collect()
    }

    fn check(steps: Vec<Step>, budget: usize) -> std::result::Result<(), TestCaseError> {
        let mut maps: Vec<(SheetId, OrdMap<RowId, Arc<Row>>)> =
            vec![(10, OrdMap::new()), (11, OrdMap::new())];
        let mut cache = ColumnCache::new(budget);
        let mut next: RowId = 1_000;
        for step in steps {
            match step {
                Step::Put { sheet, slot, below, cells } => {
                    let map = &mut maps.iter_mut().find(|(s, _)| *s == sheet).unwrap().1;
                    let id = match map.keys().nth(slot) {
                        Some(id) => *id,
                        None if below => {
                            let lowest = map.keys().next().copied().unwrap_or(next);
                            lowest.saturating_sub(1 + slot as u64 % 3).max(1)
                        }
                        None => {
                            next += 1;
                            next
                        }
                    };
                    map.insert(id, row(sheet, id, &cells));
                }
                Step::Delete { sheet, slot } => {
                    let map = &mut maps.iter_mut().find(|(s, _)| *s == sheet).unwrap().1;
                    if let Some(id) = map.keys().nth(slot).copied() {
                        map.remove(&id);
                    }
                }
                Step::Restart | Step::Reload => {
                    for (_, map) in &mut maps {
                        *map = map.iter().map(|(id, r)| (*id, Arc::new(Row::clone(r)))).collect();
                    }
                    if matches!(step, Step::Restart) {
                        cache = ColumnCache::new(budget);
                    }
                }
                Step::Run { def, parts } => {
                    let def: Value = serde_json::from_str(DEFINITIONS[def]).unwrap();
                    let sources = sources(&maps, &def);
                    let plan = compile(&parse(&def).unwrap(), &sources).unwrap();
                    let want = shown(&execute(&plan, &sources));
                    prop_assert_eq!(&shown(&run_plan(&plan, &sources, &cache)), &want, "{}", def);
                    // The same kept columns, the scan split into `parts` (as on a large sheet).
                    let slots: Vec<_> =
                        sources.iter().filter_map(|s| cache.slot(s.sheet_id)).collect();
                    let guards: Vec<_> = slots.iter().map(lock_slot).collect();
                    let kept: Vec<&SheetColumns> =
                        guards.iter().filter_map(|g| g.as_ref()).collect();
                    if kept.len() == sources.len()
                        && sources.iter().zip(&kept).all(|(s, k)| k.reflects(&s.rows))
                    {
                        let split = execute_kept_in(&plan, &sources, &kept, parts);
                        prop_assert_eq!(&shown(&split), &want, "{} in {} parts", def, parts);
                    }
                }
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

        /// A report over columns kept for scanning equals the same report over the rows, after
        /// any mix of writes, deletes and restarts; with a budget too small to keep anything,
        /// every run builds and drops its columns.
        #[test]
        fn kept_columns_run_like_rows(
            steps in proptest::collection::vec(step(), 1..80),
            tiny in proptest::bool::weighted(0.2),
        ) {
            check(steps, if tiny { 1 } else { DEFAULT_BUDGET })?;
        }
    }

    /// A flat run orders only its first [`PREFIX`] rows; a page past them comes from the whole
    /// order, which the row scan computes once.
    #[test]
    fn pages_past_the_prefix_come_from_the_whole_order() {
        let n = 3 * PREFIX as u64;
        let map: OrdMap<RowId, Arc<Row>> = (0..n)
            .map(|i| {
                (
                    i + 1,
                    row(10, i + 1, &[(1001, json!(format!("t{}", i % 13))), (1003, json!(i % 5))]),
                )
            })
            .collect();
        let maps = vec![(10, map), (11, OrdMap::new())];
        let def = json!({"type": "row", "sources": [10, 11], "columns": ["Task", "Hours"],
            "sort": [{"column": "Task", "direction": "desc"}, {"column": "Hours"}]});
        let sources = sources(&maps, &def);
        let plan = compile(&parse(&def).unwrap(), &sources).unwrap();
        let cache = ColumnCache::new(DEFAULT_BUDGET);
        let kept = run_plan(&plan, &sources, &cache);
        let rows = execute(&plan, &sources);
        assert!(
            matches!(&kept.output, Output::Flat { order, rest: Some(_), .. } if order.len() == PREFIX)
        );
        assert_eq!(kept.len(), rows.len());
        assert!(kept.ordered_to(PREFIX) && !kept.ordered_to(PREFIX + 1));
        for offset in [0, PREFIX - 3, PREFIX, 2 * PREFIX + 7] {
            assert_eq!(kept.page(offset, 500), rows.page(offset, 500), "offset {offset}");
        }
        assert!(kept.ordered_to(usize::MAX), "ordered once a page reached past the first rows");
        assert_eq!(cache.stats().sheets, 2);
        assert!(cache.stats().bytes > 0);
    }
}
