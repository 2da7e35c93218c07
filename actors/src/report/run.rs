//! Running a compiled [`QueryPlan`] over copies of its sources: scan, filter, sort, group, aggregate.
//!
//! Everything here is a pure function of the plan and the sources' rows (persistent copies
//! taken by the sheet actors in O(1)), so it runs on a blocking thread, outside every actor, and
//! is benchmarked directly (`benches/report_run.rs`).
//!
//! # Cell semantics
//!
//! A cell is read as its *value*: the wrappers `{value, format}` and `{formula, value}` count as
//! their `value` (a formula without one counts as `null`). A column a source lacks reads as
//! `null` in that source. Values are compared as follows ([`CellRef`]):
//!
//! - **Blank** is a missing cell, `null`, `""` or `[]`. `is_blank` matches it; `eq`, `in` and
//!   the ordering operators never do; `ne` always does (it is the negation of `eq`).
//! - Filter operands arrive coerced as cells of their column ([`super::compile`]), so a
//!   filter compares stored forms. Numbers compare numerically; strings (text, dates, options,
//!   contacts) by their characters (case-sensitive), which orders ISO dates by time. In a
//!   filter on a `datetime` column strings compare as the instants they denote
//!   ([`cmp_stored_datetimes`]): the stored UTC form keeps the fraction of a second as sent.
//! - A comparison between different kinds (a number against a string) is not a match.
//! - `contains` is a case-insensitive substring test on a string cell, and an exact membership
//!   test on a list cell (`multi_select`). `in` matches a cell equal to any listed value.
//! - A list cell `eq` a string matches when the list is exactly that one string; `eq` a list
//!   matches the same set of strings.
//!
//! # Order
//!
//! Sorting and grouping use one total order: by kind first (numbers, strings, booleans,
//! lists, anything else), then by value; blanks come **last in either direction**.
//!
//! - Flat results: the definition's sort keys, then the order of the sources in the
//!   definition, then row id. Every row has a distinct position, so a result read page by page
//!   neither skips nor repeats while the data does not change.
//! - Aggregated results: the sort keys (which name output columns), then the group key values
//!   in ascending order. Group keys are distinct, so the order is total as well.
//!
//! # Groups and aggregates
//!
//! Blank cells form one group whose key is `null`. The key shown for a group is the value of its
//! first row (in source order). A summary without `groupBy` always has exactly one group, also
//! over zero rows. `count` counts rows, or non-blank cells of its column; `sum` and `avg` add
//! the number cells of their column (`sum` of nothing is `0`, `avg` of nothing is `null`); `min`
//! and `max` take the least and greatest non-blank value in the order above (`null` if none).

use std::cmp::Ordering;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, OnceLock};

use imbl::OrdMap;
use serde_json::Value;

use super::compile::{Mode, OutputColumn, Predicate, QueryPlan, Shape, SheetFilter, Source};
use super::definition::{AggFn, Direction, Op};
use crate::coerce::cmp_stored_datetimes;
use crate::model::{ColumnId, Row, RowId};

/// The whole ordered result of a run; pages are cut from it.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// `flat` or `aggregated`.
    pub mode: Mode,
    /// Output columns (ids are their positions plus one).
    pub columns: Vec<OutputColumn>,
    /// Rows read from readable sources.
    pub scanned_rows: u64,
    /// Rows (flat) or groups (aggregated) in the whole result.
    pub total_matched: u64,
    pub(crate) output: Output,
}

/// The ordered output. Flat results keep row references into the sources' persistent maps
/// (16 bytes per matching row) instead of copies of their cells, so a cached result of a large
/// report stays small.
#[derive(Clone, Debug)]
pub(crate) enum Output {
    Flat {
        /// The sources' rows, in source order.
        rows: Vec<OrdMap<RowId, Arc<Row>>>,
        /// `select[source][output column]`: the column id read for each output column.
        select: Vec<Vec<Option<ColumnId>>>,
        /// `(source index, row id)` of the first matching rows, in result order: all of them
        /// unless `rest` is set.
        order: Vec<(u32, RowId)>,
        /// How to order the rows past `order`, for a result whose run ordered only its first
        /// rows ([`super::scan`]).
        rest: Option<Arc<Rest>>,
    },
    Grid(Vec<Vec<Value>>),
}

/// The whole order of a flat result whose run ordered only its first rows: computed by the
/// row scan ([`execute`]) when a page first reaches past them, then kept.
#[derive(Debug)]
pub(crate) struct Rest {
    plan: QueryPlan,
    sources: Vec<Source>,
    whole: OnceLock<Vec<(u32, RowId)>>,
}

impl Rest {
    /// The rows of `sources` past the first that `plan` matches, ordered when first asked.
    pub(crate) fn new(plan: &QueryPlan, sources: &[Source]) -> Arc<Rest> {
        Arc::new(Rest { plan: plan.clone(), sources: sources.to_vec(), whole: OnceLock::new() })
    }

    fn whole(&self) -> &[(u32, RowId)] {
        self.whole.get_or_init(|| match &self.plan.shape {
            Shape::Flat { select, sort } => flat(&self.plan, &self.sources, select, sort).2,
            Shape::Grouped { .. } => Vec::new(),
        })
    }
}

impl RunResult {
    /// A result made by another scan of the same plan ([`super::scan`]).
    pub(crate) fn new(plan: &QueryPlan, sources: &[Source], total: u64, output: Output) -> Self {
        RunResult {
            mode: plan.mode,
            columns: plan.columns.clone(),
            scanned_rows: sources.iter().map(|s| s.rows.len() as u64).sum(),
            total_matched: total,
            output,
        }
    }

    /// Rows (flat) or groups (aggregated) in the result.
    pub fn len(&self) -> usize {
        match &self.output {
            Output::Flat { order, rest: None, .. } => order.len(),
            Output::Flat { .. } => usize::try_from(self.total_matched).unwrap_or(usize::MAX),
            Output::Grid(rows) => rows.len(),
        }
    }

    /// Whether the rows up to position `end` are ordered already, so a page ending there is
    /// cut without a scan (a result that ordered only its first rows orders the rest by
    /// scanning the rows when a page first reaches past them).
    pub fn ordered_to(&self, end: usize) -> bool {
        match &self.output {
            Output::Flat { order, rest: Some(rest), .. } => {
                end <= order.len() || rest.whole.get().is_some()
            }
            _ => true,
        }
    }

    /// Whether the result is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Up to `limit` output rows from position `offset`, each a value per output column.
    pub fn page(&self, offset: usize, limit: usize) -> Vec<Vec<Value>> {
        let end = offset.saturating_add(limit).min(self.len());
        let range = offset.min(end)..end;
        match &self.output {
            Output::Flat { rows, select, order, rest } => {
                let order = match rest {
                    Some(rest) if range.end > order.len() => rest.whole(),
                    _ => &order[..],
                };
                self.flat_page(rows, select, &order[range])
            }
            Output::Grid(rows) => rows[range].to_vec(),
        }
    }

    fn flat_page(
        &self,
        rows: &[OrdMap<RowId, Arc<Row>>],
        select: &[Vec<Option<ColumnId>>],
        order: &[(u32, RowId)],
    ) -> Vec<Vec<Value>> {
        order
            .iter()
            .map(|&(s, id)| {
                let select = &select[s as usize];
                match rows[s as usize].get(&id) {
                    Some(row) => row.project(select).into_iter().map(unwrap_owned).collect(),
                    None => vec![Value::Null; select.len()],
                }
            })
            .collect()
    }
}

static NULL: Value = Value::Null;

/// The value of a stored cell: wrappers count as their `value`.
pub fn unwrap(v: &Value) -> &Value {
    match v {
        Value::Object(o) => o.get("value").unwrap_or(&NULL),
        v => v,
    }
}

/// [`unwrap`], taking the value.
fn unwrap_owned(v: Value) -> Value {
    match v {
        Value::Object(mut o) => o.remove("value").unwrap_or(Value::Null),
        v => v,
    }
}

/// A cell value reduced to what reports compare (see the module docs), borrowing the row.
#[derive(Clone, Copy, Debug)]
pub enum CellRef<'a> {
    /// A finite number (`-0` is read as `0`).
    Num(f64),
    /// A non-empty string.
    Str(&'a str),
    /// A boolean.
    Bool(bool),
    /// A non-empty list.
    List(&'a [Value]),
    /// Anything else (never produced by coercion; kept for a total order).
    Other(&'a Value),
    /// Missing, `null`, `""` or `[]`.
    Blank,
}

impl<'a> CellRef<'a> {
    /// Read a stored value (wrappers unwrapped).
    pub fn of(v: &'a Value) -> Self {
        match unwrap(v) {
            Value::Null => CellRef::Blank,
            Value::String(s) if s.is_empty() => CellRef::Blank,
            Value::String(s) => CellRef::Str(s),
            Value::Array(l) if l.is_empty() => CellRef::Blank,
            Value::Array(l) => CellRef::List(l),
            Value::Bool(b) => CellRef::Bool(*b),
            Value::Number(n) => match n.as_f64() {
                // `-0.0 + 0.0` is `0.0`: one zero, so equal numbers hash alike.
                Some(x) => CellRef::Num(x + 0.0),
                None => CellRef::Other(v),
            },
            other => CellRef::Other(other),
        }
    }

    /// Whether the cell is blank.
    pub fn is_blank(self) -> bool {
        matches!(self, CellRef::Blank)
    }

    fn rank(self) -> u8 {
        match self {
            CellRef::Num(_) => 0,
            CellRef::Str(_) => 1,
            CellRef::Bool(_) => 2,
            CellRef::List(_) => 3,
            CellRef::Other(_) => 4,
            CellRef::Blank => 5,
        }
    }

    /// The one total order: kind, then value; blanks last.
    pub fn total_cmp(self, other: CellRef<'_>) -> Ordering {
        match (self, other) {
            (CellRef::Num(a), CellRef::Num(b)) => a.total_cmp(&b),
            (CellRef::Str(a), CellRef::Str(b)) => a.cmp(b),
            (CellRef::Bool(a), CellRef::Bool(b)) => a.cmp(&b),
            (CellRef::List(a), CellRef::List(b)) => {
                let mut items =
                    a.iter().zip(b).map(|(x, y)| CellRef::of(x).total_cmp(CellRef::of(y)));
                items.find(|o| o.is_ne()).unwrap_or_else(|| a.len().cmp(&b.len()))
            }
            (CellRef::Other(a), CellRef::Other(b)) => a.to_string().cmp(&b.to_string()),
            (a, b) => a.rank().cmp(&b.rank()),
        }
    }
}

impl PartialEq for CellRef<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.total_cmp(*other).is_eq()
    }
}

impl Eq for CellRef<'_> {}

impl Hash for CellRef<'_> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.rank().hash(h);
        match self {
            CellRef::Num(x) => x.to_bits().hash(h),
            CellRef::Str(s) => s.hash(h),
            CellRef::Bool(b) => b.hash(h),
            CellRef::List(l) => {
                for item in *l {
                    CellRef::of(item).hash(h);
                }
            }
            CellRef::Other(v) => v.to_string().hash(h),
            CellRef::Blank => {}
        }
    }
}

/// Compare for sorting: blanks last whatever the direction.
pub fn sort_cmp(a: CellRef<'_>, b: CellRef<'_>, direction: Direction) -> Ordering {
    match (a.is_blank(), b.is_blank()) {
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => match direction {
            Direction::Asc => a.total_cmp(b),
            Direction::Desc => b.total_cmp(a),
        },
    }
}

/// The distinct strings of a list, sorted.
fn string_set(l: &[Value]) -> Vec<&str> {
    let mut v: Vec<&str> = l.iter().filter_map(Value::as_str).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Order a cell and an operand for a filter: numbers numerically, strings by text or, with
/// `instants`, as stored datetimes by the instants they denote. `None` for other pairs.
fn compare(cell: CellRef<'_>, operand: CellRef<'_>, instants: bool) -> Option<Ordering> {
    match (cell, operand) {
        (CellRef::Num(a), CellRef::Num(b)) => a.partial_cmp(&b),
        (CellRef::Str(a), CellRef::Str(b)) if instants => {
            Some(cmp_stored_datetimes(a, b).unwrap_or_else(|| a.cmp(b)))
        }
        (CellRef::Str(a), CellRef::Str(b)) => Some(a.cmp(b)),
        _ => None,
    }
}

/// `eq` between a cell and an operand (module docs).
fn equals(cell: CellRef<'_>, operand: CellRef<'_>, instants: bool) -> bool {
    match (cell, operand) {
        (CellRef::Blank, _) | (_, CellRef::Blank) => false,
        (CellRef::List(items), CellRef::Str(s)) => items.len() == 1 && items[0].as_str() == Some(s),
        (CellRef::List(a), CellRef::List(b)) => string_set(a) == string_set(b),
        (a @ CellRef::Str(_), b @ CellRef::Str(_)) => {
            compare(a, b, instants).is_some_and(Ordering::is_eq)
        }
        (a, b) => a.total_cmp(b).is_eq(),
    }
}

/// Whether `cell` passes `op` with `operand` (`needle`: the lower-cased operand of `contains`;
/// `instants`: strings are datetimes, compared by instant).
pub fn test(cell: CellRef<'_>, op: Op, operand: &Value, needle: &str, instants: bool) -> bool {
    match op {
        Op::IsBlank => cell.is_blank(),
        Op::NotBlank => !cell.is_blank(),
        Op::Eq => equals(cell, CellRef::of(operand), instants),
        Op::Ne => !equals(cell, CellRef::of(operand), instants),
        Op::In => operand
            .as_array()
            .is_some_and(|l| l.iter().any(|v| equals(cell, CellRef::of(v), instants))),
        Op::Contains => match cell {
            CellRef::Str(s) => contains_folded(s, needle),
            CellRef::List(items) => {
                let want = operand.as_str();
                items.iter().any(|i| i.as_str().is_some() && i.as_str() == want)
            }
            _ => false,
        },
        Op::Gt | Op::Gte | Op::Lt | Op::Lte => compare(cell, CellRef::of(operand), instants)
            .is_some_and(|o| match op {
                Op::Gt => o.is_gt(),
                Op::Gte => o.is_ge(),
                Op::Lt => o.is_lt(),
                _ => o.is_le(),
            }),
    }
}

/// Whether `s` contains `needle` (lower-cased) ignoring case: ASCII folding when both are
/// ASCII, else `s` lower-cased. Candidates for the needle's first byte are found with
/// `memchr2` (either case), so a miss costs a vector scan of the text rather than a
/// comparison at every offset.
pub fn contains_folded(s: &str, needle: &str) -> bool {
    if !(s.is_ascii() && needle.is_ascii()) {
        return s.to_lowercase().contains(needle);
    }
    let (hay, needle) = (s.as_bytes(), needle.as_bytes());
    let Some((&first, rest)) = needle.split_first() else {
        return true;
    };
    let Some(last) = hay.len().checked_sub(needle.len()) else {
        return false;
    };
    let (lower, upper) = (first.to_ascii_lowercase(), first.to_ascii_uppercase());
    let mut from = 0;
    while from <= last {
        match memchr::memchr2(lower, upper, &hay[from..=last]) {
            None => return false,
            Some(i) => {
                let at = from + i;
                if hay[at + 1..at + needle.len()].eq_ignore_ascii_case(rest) {
                    return true;
                }
                from = at + 1;
            }
        }
    }
    false
}

/// A JSON number for `x`: an integer when `x` is integral and exact, else a float.
pub fn number(x: f64) -> Value {
    if x.fract() == 0.0 && x.abs() < 9_007_199_254_740_992.0 {
        Value::from(x as i64)
    } else {
        serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
    }
}

impl Predicate {
    /// Whether a row passes, `read(field)` giving the row's cell for a field.
    fn matches<'a>(&self, read: &impl Fn(usize) -> &'a Value) -> bool {
        match self {
            Predicate::All(parts) => parts.iter().all(|p| p.matches(read)),
            Predicate::Any(parts) => parts.iter().any(|p| p.matches(read)),
            Predicate::Test { field, op, operand, needle, instants } => {
                test(CellRef::of(read(*field)), *op, operand, needle, *instants)
            }
        }
    }
}

impl SheetFilter {
    /// Whether a row of the sheet the filter was compiled for passes it.
    pub fn matches(&self, row: &Row) -> bool {
        let cells = row.project(&self.lookup);
        self.predicate.matches(&|f: usize| &cells[f])
    }
}

/// Run `plan` over `sources` (the readable sources, in definition order, as given to
/// [`super::compile::compile`]).
pub fn execute(plan: &QueryPlan, sources: &[Source]) -> RunResult {
    let scanned_rows: u64 = sources.iter().map(|s| s.rows.len() as u64).sum();
    let (total_matched, output) = match &plan.shape {
        Shape::Flat { select, sort } => {
            let (rows, select, order) = flat(plan, sources, select, sort);
            (order.len() as u64, Output::Flat { rows, select, order, rest: None })
        }
        Shape::Grouped { group_by, aggregates, sort } => {
            let rows = grouped(plan, sources, group_by, aggregates, sort);
            (rows.len() as u64, Output::Grid(rows))
        }
    };
    RunResult {
        mode: plan.mode,
        columns: plan.columns.clone(),
        scanned_rows,
        total_matched,
        output,
    }
}

/// Call `visit(source index, row, cells)` for every row passing the filter, in source order
/// then row id order; `cells[field]` is the row's cell of a plan field (parsed from the row once,
/// for every field the plan reads).
fn scan(plan: &QueryPlan, sources: &[Source], mut visit: impl FnMut(usize, &Row, &[Value])) {
    let mut cells = Vec::new();
    for (s, source) in sources.iter().enumerate() {
        let lookup = &plan.lookup[s];
        for row in source.rows.values() {
            row.project_into(lookup, &mut cells);
            if plan.filter.as_ref().is_none_or(|p| p.matches(&|f: usize| &cells[f])) {
                visit(s, row, &cells);
            }
        }
    }
}

/// The parts of [`Output::Flat`]: rows of each source, selected column ids, order.
type FlatParts = (Vec<OrdMap<RowId, Arc<Row>>>, Vec<Vec<Option<ColumnId>>>, Vec<(u32, RowId)>);

fn flat(
    plan: &QueryPlan,
    sources: &[Source],
    select: &[usize],
    sort: &[(usize, Direction)],
) -> FlatParts {
    let mut order: Vec<(u32, RowId)> = Vec::new();
    // Sort keys of every matching row, `sort.len()` per row, in scan order.
    let mut keys: Vec<Value> = Vec::new();
    scan(plan, sources, |s, row, cells| {
        order.push((s as u32, row.id));
        keys.extend(sort.iter().map(|(f, _)| cells[*f].clone()));
    });
    if !sort.is_empty() {
        let k = sort.len();
        let mut idx: Vec<u32> = (0..order.len() as u32).collect();
        // Scan order is (source order, row id), so the index itself is the final tiebreaker.
        idx.sort_unstable_by(|&a, &b| {
            let (ka, kb) = (&keys[a as usize * k..][..k], &keys[b as usize * k..][..k]);
            ka.iter()
                .zip(kb)
                .zip(sort)
                .map(|((x, y), (_, dir))| sort_cmp(CellRef::of(x), CellRef::of(y), *dir))
                .find(|o| o.is_ne())
                .unwrap_or_else(|| a.cmp(&b))
        });
        order = idx.into_iter().map(|i| order[i as usize]).collect();
    }
    (sources.iter().map(|s| s.rows.clone()).collect(), selected(plan, select), order)
}

/// `[source][output column]`: the column id each source reads for each selected field.
pub(crate) fn selected(plan: &QueryPlan, select: &[usize]) -> Vec<Vec<Option<ColumnId>>> {
    plan.lookup.iter().map(|l| select.iter().map(|f| l[*f]).collect()).collect()
}

/// A running sum of numbers, with what it takes to know that another order of the same
/// additions gives the very same sum: when every addend is a multiple of 2^-[`SUM_BITS`] and
/// their magnitudes add up to less than 2^53 of those units, every partial sum is exact, so the
/// order does not matter (a scan split over threads adds its parts in another order than the
/// row scan; [`Acc::merge`] refuses a merge that could round differently).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sum {
    total: f64,
    /// Sum of the magnitudes.
    magnitude: f64,
    /// Every addend so far is a multiple of 2^-SUM_BITS.
    dyadic: bool,
}

/// Fraction bits an addend may have for sums to be exact in any order (see [`Sum`]).
const SUM_BITS: i32 = 10;

impl Sum {
    const ZERO: Sum = Sum { total: 0.0, magnitude: 0.0, dyadic: true };

    fn add(&mut self, x: f64) {
        self.total += x;
        self.magnitude += x.abs();
        self.dyadic = self.dyadic && dyadic(x);
    }

    /// `self` then `later`, when that equals adding their addends in order.
    fn merge(self, later: Sum) -> Option<Sum> {
        let magnitude = self.magnitude + later.magnitude;
        let exact = self.dyadic && later.dyadic && exact_in_any_order(magnitude);
        exact.then_some(Sum { total: self.total + later.total, magnitude, dyadic: true })
    }
}

/// Whether `x` is a multiple of 2^-[`SUM_BITS`] (see [`Sum`]).
#[inline]
pub(crate) fn dyadic(x: f64) -> bool {
    let units = x * f64::from(1u32 << SUM_BITS);
    // Within ±2^62 the conversion is exact for integers, so equality means integral.
    units.abs() < 4.6e18 && units as i64 as f64 == units
}

/// Whether sums of multiples of 2^-[`SUM_BITS`] whose magnitudes add up to `magnitude` are
/// exact, whatever the order of the additions (see [`Sum`]).
pub(crate) fn exact_in_any_order(magnitude: f64) -> bool {
    magnitude * f64::from(1u32 << SUM_BITS) < 9_007_199_254_740_992.0
}

/// A running aggregate. `B` is how a `min` or `max` holds its best cell so far: the row scan
/// holds the value, a scan of kept columns the cell and where it is.
#[derive(Clone, Debug)]
pub(crate) enum Acc<B> {
    Count(u64),
    Sum(Sum),
    Avg(Sum, u64),
    /// The least cell so far.
    Min(Option<B>),
    /// The greatest cell so far.
    Max(Option<B>),
}

impl<B> Acc<B> {
    pub(crate) fn new(func: AggFn) -> Self {
        match func {
            AggFn::Count => Acc::Count(0),
            AggFn::Sum => Acc::Sum(Sum::ZERO),
            AggFn::Avg => Acc::Avg(Sum::ZERO, 0),
            AggFn::Min => Acc::Min(None),
            AggFn::Max => Acc::Max(None),
        }
    }

    /// Add a row: `c` is the aggregate column's cell (`None` for a row `count`); `cell` reads a
    /// held best, `hold` makes one of `c`. A `min` or `max` keeps the first best row.
    pub(crate) fn add<'c>(
        &mut self,
        c: Option<CellRef<'c>>,
        cell: impl Fn(&B) -> CellRef<'_>,
        hold: impl FnOnce() -> B,
    ) {
        let counted = c.is_none_or(|c| !c.is_blank());
        let c = c.unwrap_or(CellRef::Blank);
        match self {
            Acc::Count(n) => *n += u64::from(counted),
            Acc::Sum(sum) => {
                if let CellRef::Num(x) = c {
                    sum.add(x);
                }
            }
            Acc::Avg(sum, n) => {
                if let CellRef::Num(x) = c {
                    sum.add(x);
                    *n += 1;
                }
            }
            Acc::Min(best) => {
                if !c.is_blank() && best.as_ref().is_none_or(|b| c.total_cmp(cell(b)).is_lt()) {
                    *best = Some(hold());
                }
            }
            Acc::Max(best) => {
                if !c.is_blank() && best.as_ref().is_none_or(|b| c.total_cmp(cell(b)).is_gt()) {
                    *best = Some(hold());
                }
            }
        }
    }

    /// The aggregate of `self`'s rows followed by `later`'s, as if added in that order; `None`
    /// when a sum could round otherwise (see [`Sum`]).
    pub(crate) fn merge(self, later: Acc<B>, cell: impl Fn(&B) -> CellRef<'_>) -> Option<Self> {
        Some(match (self, later) {
            (Acc::Count(a), Acc::Count(b)) => Acc::Count(a + b),
            (Acc::Sum(a), Acc::Sum(b)) => Acc::Sum(a.merge(b)?),
            (Acc::Avg(a, n), Acc::Avg(b, m)) => Acc::Avg(a.merge(b)?, n + m),
            (Acc::Min(Some(a)), Acc::Min(Some(b))) => {
                let later_wins = cell(&b).total_cmp(cell(&a)).is_lt();
                Acc::Min(Some(if later_wins { b } else { a }))
            }
            (Acc::Max(Some(a)), Acc::Max(Some(b))) => {
                let later_wins = cell(&b).total_cmp(cell(&a)).is_gt();
                Acc::Max(Some(if later_wins { b } else { a }))
            }
            (Acc::Min(a), Acc::Min(b)) => Acc::Min(a.or(b)),
            (Acc::Max(a), Acc::Max(b)) => Acc::Max(a.or(b)),
            (a, _) => a,
        })
    }

    /// The output value; `show` gives a held best's value.
    pub(crate) fn value(&self, show: impl Fn(&B) -> Value) -> Value {
        match self {
            Acc::Count(n) => Value::from(*n),
            Acc::Sum(sum) => number(sum.total),
            Acc::Avg(_, 0) => Value::Null,
            Acc::Avg(sum, n) => number(sum.total / *n as f64),
            Acc::Min(best) | Acc::Max(best) => best.as_ref().map_or(Value::Null, show),
        }
    }
}

/// The order of a summary's output rows: its sort keys (output columns), then the group key
/// cells ascending (`keys[i]` are row `i`'s). Every run of a summary orders its groups here.
pub(crate) fn order_groups(
    rows: Vec<Vec<Value>>,
    keys: &[Vec<CellRef<'_>>],
    sort: &[(usize, Direction)],
) -> Vec<Vec<Value>> {
    let mut idx: Vec<usize> = (0..rows.len()).collect();
    idx.sort_by(|&a, &b| {
        sort.iter()
            .map(|(col, dir)| {
                sort_cmp(CellRef::of(&rows[a][*col]), CellRef::of(&rows[b][*col]), *dir)
            })
            .chain(keys[a].iter().zip(&keys[b]).map(|(x, y)| sort_cmp(*x, *y, Direction::Asc)))
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    });
    let mut rows: Vec<Option<Vec<Value>>> = rows.into_iter().map(Some).collect();
    idx.into_iter().filter_map(|i| rows[i].take()).collect()
}

/// The value a group shows for a key cell: blank as `null`, wrappers as their value.
pub(crate) fn shown(cell: &Value) -> Value {
    if CellRef::of(cell).is_blank() {
        Value::Null
    } else {
        unwrap(cell).clone()
    }
}

/// One group while scanning.
struct Group {
    /// The key cells (equal when their [`CellRef`]s are).
    key: Vec<Value>,
    /// The first row's key values (shown for the group).
    shown: Vec<Value>,
    accs: Vec<Acc<Value>>,
}

fn grouped(
    plan: &QueryPlan,
    sources: &[Source],
    group_by: &[usize],
    aggregates: &[(AggFn, Option<usize>)],
    sort: &[(usize, Direction)],
) -> Vec<Vec<Value>> {
    let new_group = |key: Vec<Value>, shown: Vec<Value>| Group {
        key,
        shown,
        accs: aggregates.iter().map(|(f, _)| Acc::new(*f)).collect(),
    };
    // Groups by the hash of their key's cells, so a row finds its group without copying its
    // key: only a new group's key is copied.
    let hashing = std::collections::hash_map::RandomState::new();
    let mut index: HashMap<u64, Vec<usize>> = HashMap::new();
    let mut groups: Vec<Group> = Vec::new();
    if group_by.is_empty() {
        groups.push(new_group(Vec::new(), Vec::new()));
    }
    scan(plan, sources, |_, _, cells| {
        let g = if group_by.is_empty() {
            0
        } else {
            let mut h = std::hash::BuildHasher::build_hasher(&hashing);
            for f in group_by {
                CellRef::of(&cells[*f]).hash(&mut h);
            }
            let candidates = index.entry(h.finish()).or_default();
            let found = candidates.iter().copied().find(|g| {
                let key = &groups[*g].key;
                key.iter().zip(group_by).all(|(k, f)| CellRef::of(k) == CellRef::of(&cells[*f]))
            });
            match found {
                Some(g) => g,
                None => {
                    let key: Vec<Value> = group_by.iter().map(|f| cells[*f].clone()).collect();
                    let shown = key.iter().map(shown).collect();
                    groups.push(new_group(key, shown));
                    candidates.push(groups.len() - 1);
                    groups.len() - 1
                }
            }
        };
        for (acc, (_, col)) in groups[g].accs.iter_mut().zip(aggregates) {
            let v = col.map(|f| &cells[f]);
            acc.add(v.map(CellRef::of), |b| CellRef::of(b), || unwrap(v.unwrap_or(&NULL)).clone());
        }
    });
    let rows: Vec<Vec<Value>> = groups
        .iter()
        .map(|g| {
            g.shown.iter().cloned().chain(g.accs.iter().map(|a| a.value(Value::clone))).collect()
        })
        .collect();
    let keys: Vec<Vec<CellRef<'_>>> =
        groups.iter().map(|g| g.key.iter().map(CellRef::of).collect()).collect();
    order_groups(rows, &keys, sort)
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::{Column, ColumnType, Json, SheetId, SOURCE_IMPORT};
    use crate::report::compile::compile;
    use crate::report::definition::parse;

    fn col(id: ColumnId, sheet_id: SheetId, name: &str, ty: ColumnType, position: i64) -> Column {
        let options: Option<&[&str]> = match ty {
            ColumnType::Dropdown => Some(&["Open", "Done"]),
            ColumnType::MultiSelect => Some(&["a", "b", "c"]),
            _ => None,
        };
        let options = options.map(|o| o.iter().map(|s| (*s).to_owned()).collect());
        Column { id, sheet_id, name: name.into(), ty, position, options, primary: false }
    }

    /// A row of `sheet_id` with `cells` (column id → value), as an import makes it.
    pub(crate) fn row(id: RowId, sheet_id: SheetId, cells: Value) -> Row {
        let cells = cells
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.parse().unwrap(), Json(v.clone())))
            .collect();
        Row::new(id, sheet_id, cells, SOURCE_IMPORT, 0)
    }

    /// The API test fixture's sheets 10 and 11 (a subset of the columns).
    fn sources() -> Vec<Source> {
        let ten = Source {
            sheet_id: 10,
            columns: vec![
                col(100, 10, "Task", ColumnType::Text, 0),
                col(101, 10, "Status", ColumnType::Dropdown, 1),
                col(102, 10, "Hours", ColumnType::Number, 2),
                col(104, 10, "Due", ColumnType::Date, 4),
                col(107, 10, "Tags", ColumnType::MultiSelect, 7),
            ]
            .into(),
            rows: [
                row(1000, 10, json!({"100": "root", "101": "Done", "102": 5})),
                row(1001, 10, json!({"100": "child", "101": "Open", "102": 2})),
                row(1002, 10, json!({"100": "grandchild", "102": 1})),
                row(
                    1003,
                    10,
                    json!({"100": "other", "101": "Done", "102": {"value": 8, "format": "0.0"},
                    "104": "2026-01-31", "107": ["a", "c"]}),
                ),
            ]
            .into_iter()
            .map(|r| (r.id, Arc::new(r)))
            .collect(),
        };
        let eleven = Source {
            sheet_id: 11,
            columns: vec![
                col(111, 11, "Status", ColumnType::Dropdown, 0),
                col(110, 11, "Task", ColumnType::Text, 1),
                col(112, 11, "Hours", ColumnType::Number, 2),
            ]
            .into(),
            rows: [row(1100, 11, json!({"110": "stock", "111": "Done", "112": 3}))]
                .into_iter()
                .map(|r| (r.id, r))
                .collect(),
        };
        vec![ten, eleven]
    }

    fn run(def: Value) -> RunResult {
        let sources = sources();
        let plan = compile(&parse(&def).unwrap(), &sources).unwrap();
        execute(&plan, &sources)
    }

    fn tasks(def: Value) -> Vec<Value> {
        let def = match def {
            Value::Object(mut o) => {
                o.insert("type".into(), json!("row"));
                o.insert("sources".into(), json!([10, 11]));
                o.insert("columns".into(), json!(["Task"]));
                Value::Object(o)
            }
            _ => unreachable!(),
        };
        let r = run(def);
        r.page(0, 100).into_iter().map(|mut cells| cells.remove(0)).collect()
    }

    fn filtered(column: &str, op: &str, value: Value) -> Vec<Value> {
        tasks(json!({"filter": {"column": column, "op": op, "value": value}}))
    }

    #[test]
    fn flat_run_filters_sorts_and_unwraps() {
        let r =
            run(json!({"type": "row", "sources": [10, 11], "columns": ["Task", "Status", "Hours"],
            "filter": {"all": [{"column": "Status", "op": "eq", "value": "Done"}]},
            "sort": [{"column": "Hours", "direction": "desc"}]}));
        assert_eq!((r.mode, r.scanned_rows, r.total_matched), (Mode::Flat, 5, 3));
        assert_eq!(
            r.page(0, 10),
            [
                vec![json!("other"), json!("Done"), json!(8)],
                vec![json!("root"), json!("Done"), json!(5)],
                vec![json!("stock"), json!("Done"), json!(3)],
            ]
        );
        assert_eq!(r.page(1, 1), [vec![json!("root"), json!("Done"), json!(5)]]);
        assert!(r.page(3, 10).is_empty());
        assert!(r.page(usize::MAX, 10).is_empty());
    }

    #[test]
    fn unsorted_flat_runs_follow_source_order_then_row_id() {
        let r = run(json!({"type": "row", "sources": [10, 11], "columns": ["Task", "Due"]}));
        let names: Vec<Value> = r.page(0, 10).into_iter().map(|c| c[0].clone()).collect();
        assert_eq!(
            names,
            [json!("root"), json!("child"), json!("grandchild"), json!("other"), json!("stock")]
        );
        assert_eq!(r.page(4, 1), [vec![json!("stock"), Value::Null]], "a missing column is null");
    }

    #[test]
    fn blanks_sort_last_in_both_directions() {
        for dir in ["asc", "desc"] {
            let got = tasks(json!({"sort": [{"column": "Status", "direction": dir}]}));
            assert_eq!(got.last(), Some(&json!("grandchild")), "{dir}");
        }
        let got = tasks(
            json!({"sort": [{"column": "Status"}, {"column": "Hours", "direction": "desc"}]}),
        );
        assert_eq!(
            got,
            [json!("other"), json!("root"), json!("stock"), json!("child"), json!("grandchild")]
        );
    }

    #[test]
    fn every_operator() {
        assert_eq!(
            filtered("Status", "eq", json!("Done")),
            [json!("root"), json!("other"), json!("stock")]
        );
        assert_eq!(filtered("Status", "ne", json!("Done")), [json!("child"), json!("grandchild")]);
        assert_eq!(filtered("Hours", "gt", json!(3)), [json!("root"), json!("other")]);
        assert_eq!(
            filtered("Hours", "gte", json!(3)),
            [json!("root"), json!("other"), json!("stock")]
        );
        assert_eq!(filtered("Hours", "lt", json!(2)), [json!("grandchild")]);
        assert_eq!(
            filtered("Hours", "lte", json!("2")),
            [json!("child"), json!("grandchild")],
            "numeric string"
        );
        assert_eq!(
            filtered("Hours", "gt", json!(7.5)),
            [json!("other")],
            "wrappers compare by value"
        );
        assert_eq!(filtered("Due", "gte", json!("2026-01-01")), [json!("other")]);
        assert_eq!(
            filtered("Due", "lt", json!("2026-01-01")),
            Vec::<Value>::new(),
            "blank never orders"
        );
        assert_eq!(
            filtered("Task", "contains", json!("CHILD")),
            [json!("child"), json!("grandchild")]
        );
        assert_eq!(filtered("Task", "contains", json!("")), tasks(json!({})), "empty needle");
        assert_eq!(filtered("Tags", "contains", json!("c")), [json!("other")]);
        assert_eq!(filtered("Tags", "eq", json!(["c", "a"])), [json!("other")]);
        assert_eq!(filtered("Tags", "eq", json!("a")), Vec::<Value>::new());
        assert_eq!(filtered("Status", "in", json!(["Open"])), [json!("child")]);
        assert_eq!(filtered("Hours", "in", json!([1, 3])), [json!("grandchild"), json!("stock")]);
        assert_eq!(filtered("Hours", "in", json!([])), Vec::<Value>::new());
        assert_eq!(filtered("Status", "is_blank", Value::Null), [json!("grandchild")]);
        assert_eq!(filtered("Tags", "not_blank", Value::Null), [json!("other")]);
        assert_eq!(
            tasks(json!({"filter": {"any": [
                {"column": "Hours", "op": "gt", "value": 6},
                {"all": [{"column": "Status", "op": "eq", "value": "Open"}, {"column": "Hours", "op": "lt", "value": 5}]}]}})),
            [json!("child"), json!("other")]
        );
        assert_eq!(tasks(json!({"filter": {"all": []}})).len(), 5);
        assert!(tasks(json!({"filter": {"any": []}})).is_empty());
    }

    #[test]
    fn cell_semantics() {
        let blank = [
            json!(null),
            json!(""),
            json!([]),
            json!({"formula": "=A1"}),
            json!({"value": null, "format": "x"}),
        ];
        for v in &blank {
            assert!(CellRef::of(v).is_blank(), "{v}");
            assert!(
                !test(CellRef::of(v), Op::Eq, &json!(""), "", false),
                "eq never matches a blank: {v}"
            );
            assert!(test(CellRef::of(v), Op::Ne, &json!("x"), "", false), "{v}");
        }
        assert!(test(
            CellRef::of(&json!({"formula": "=1+1", "value": 2})),
            Op::Eq,
            &json!(2),
            "",
            false
        ));
        assert!(test(CellRef::of(&json!(2.0)), Op::Eq, &json!(2), "", false), "2.0 == 2");
        assert!(test(CellRef::of(&json!(-0.0)), Op::Eq, &json!(0), "", false));
        assert!(!test(CellRef::of(&json!("5")), Op::Eq, &json!(5), "", false), "kinds differ");
        assert!(!test(CellRef::of(&json!("5")), Op::Gt, &json!(4), "", false), "kinds never order");
        assert!(!test(
            CellRef::of(&json!("Straße")),
            Op::Contains,
            &json!("STRASSE"),
            "strasse",
            false
        ));
        assert!(test(CellRef::of(&json!("ÉTÉ")), Op::Contains, &json!("été"), "été", false));
        assert!(test(CellRef::of(&json!("b")), Op::Gt, &json!("a"), "", false));
        assert!(test(CellRef::of(&json!(true)), Op::Eq, &json!(true), "", false));
        assert!(test(CellRef::of(&json!(false)), Op::In, &json!([1, false]), "", false));
        // Stored datetimes keep the fraction as sent: one instant, several texts.
        let (whole, zeros, half) = (
            json!("2026-03-01T10:00:00Z"),
            json!("2026-03-01T10:00:00.000Z"),
            json!("2026-03-01T10:00:00.5Z"),
        );
        assert!(test(CellRef::of(&whole), Op::Eq, &zeros, "", true));
        assert!(!test(CellRef::of(&whole), Op::Eq, &zeros, "", false), "text differs");
        assert!(test(CellRef::of(&half), Op::Gt, &whole, "", true));
        assert!(!test(CellRef::of(&half), Op::Gt, &whole, "", false), "text misorders");
        assert!(test(CellRef::of(&whole), Op::In, &json!([half, zeros]), "", true));
        // The total order: numbers < strings < booleans < lists, blanks last.
        let mut v =
            [json!(null), json!([1]), json!(true), json!("a"), json!(10), json!(9.5), json!("")];
        v.sort_by(|a, b| sort_cmp(CellRef::of(a), CellRef::of(b), Direction::Asc));
        assert_eq!(&v[..5], [json!(9.5), json!(10), json!("a"), json!(true), json!([1])]);
        v.sort_by(|a, b| sort_cmp(CellRef::of(a), CellRef::of(b), Direction::Desc));
        assert_eq!(&v[..5], [json!([1]), json!(true), json!("a"), json!(10), json!(9.5)]);
        assert!(v[5..].iter().all(|x| CellRef::of(x).is_blank()));
        assert_eq!(number(16.0), json!(16));
        assert_eq!(number(2.5), json!(2.5));
    }

    #[test]
    fn summary_groups_and_aggregates() {
        let r = run(json!({"type": "summary", "sources": [10, 11], "groupBy": ["Status"],
            "aggregates": [{"fn": "count"}, {"fn": "sum", "column": "Hours"}, {"fn": "avg", "column": "Hours"},
                {"fn": "min", "column": "Hours"}, {"fn": "max", "column": "Task"}, {"fn": "count", "column": "Due"}]}));
        assert_eq!((r.mode, r.scanned_rows, r.total_matched), (Mode::Aggregated, 5, 3));
        let names: Vec<&str> = r.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "Status",
                "count",
                "sum(Hours)",
                "avg(Hours)",
                "min(Hours)",
                "max(Task)",
                "count(Due)"
            ]
        );
        assert_eq!(
            r.page(0, 10),
            [
                vec![
                    json!("Done"),
                    json!(3),
                    json!(16),
                    json!(16.0 / 3.0),
                    json!(3),
                    json!("stock"),
                    json!(1)
                ],
                vec![
                    json!("Open"),
                    json!(1),
                    json!(2),
                    json!(2),
                    json!(2),
                    json!("child"),
                    json!(0)
                ],
                vec![
                    Value::Null,
                    json!(1),
                    json!(1),
                    json!(1),
                    json!(1),
                    json!("grandchild"),
                    json!(0)
                ],
            ]
        );
    }

    #[test]
    fn summary_sorts_by_output_columns_then_group_key() {
        let r = run(json!({"type": "summary", "sources": [10, 11], "groupBy": ["Status"],
            "aggregates": [{"fn": "count"}], "sort": [{"column": "count", "direction": "asc"}]}));
        let keys: Vec<Value> = r.page(0, 10).into_iter().map(|c| c[0].clone()).collect();
        assert_eq!(keys, [json!("Open"), Value::Null, json!("Done")], "ties by key, blank last");
        let r = run(json!({"type": "summary", "sources": [10, 11], "groupBy": ["Status"],
            "aggregates": [{"fn": "sum", "column": "Hours"}], "sort": [{"column": "Status", "direction": "desc"}]}));
        let keys: Vec<Value> = r.page(0, 10).into_iter().map(|c| c[0].clone()).collect();
        assert_eq!(keys, [json!("Open"), json!("Done"), Value::Null]);
    }

    #[test]
    fn summary_without_group_by_is_one_group_even_when_nothing_matches() {
        let r = run(json!({"type": "summary", "sources": [10, 11],
            "aggregates": [{"fn": "count"}, {"fn": "sum", "column": "Hours"}, {"fn": "avg", "column": "Hours"}, {"fn": "max", "column": "Hours"}],
            "filter": {"column": "Hours", "op": "gt", "value": 100}}));
        assert_eq!(r.total_matched, 1);
        assert_eq!(r.page(0, 10), [vec![json!(0), json!(0), Value::Null, Value::Null]]);
        let r = run(json!({"type": "summary", "sources": [10, 11], "groupBy": ["Status"],
            "aggregates": [{"fn": "count"}], "filter": {"any": []}}));
        assert_eq!((r.total_matched, r.len()), (0, 0));
    }

    #[test]
    fn multi_column_groups_use_every_key() {
        let r = run(json!({"type": "summary", "sources": [10, 11], "groupBy": ["Status", "Hours"],
            "aggregates": [{"fn": "count"}]}));
        assert_eq!(r.total_matched, 5);
        let first: Vec<Value> = r.page(0, 1).remove(0);
        assert_eq!(first, [json!("Done"), json!(3), json!(1)]);
    }

    #[test]
    fn a_sheet_filter_names_columns_by_id_and_runs_like_a_report_filter() {
        use crate::report::compile::compile_sheet_filter;
        use crate::report::definition::parse_filter_alone;
        let ten = &sources()[0];
        let mut columns = ten.columns.to_vec();
        columns.push(col(105, 10, "Seen", ColumnType::Datetime, 5));
        let matching = |filter: Value, extra: &[Row]| -> Vec<RowId> {
            let f = compile_sheet_filter(&parse_filter_alone(&filter).unwrap(), &columns).unwrap();
            ten.rows
                .values()
                .map(|r| &**r)
                .chain(extra)
                .filter(|r| f.matches(r))
                .map(|r| r.id)
                .collect()
        };
        assert_eq!(
            matching(json!({"column": "101", "op": "eq", "value": "Done"}), &[]),
            [1000, 1003]
        );
        assert_eq!(
            matching(
                json!({"any": [{"column": "102", "op": "gte", "value": "5"},
                                   {"column": "101", "op": "is_blank"}]}),
                &[]
            ),
            [1000, 1002, 1003]
        );
        // An offset operand is the instant a UTC cell holds.
        let seen = row(9, 10, json!({"105": "2026-03-01T10:00:00Z"}));
        let at = json!({"column": "105", "op": "eq", "value": "2026-03-01T12:00:00+02:00"});
        assert_eq!(matching(at, std::slice::from_ref(&seen)), [9]);
        let refused = |filter: Value| match parse_filter_alone(&filter)
            .and_then(|f| compile_sheet_filter(&f, &columns))
        {
            Err(crate::Error::Report { message, .. }) => message,
            other => panic!("{filter} compiled: {other:?}"),
        };
        assert!(refused(json!({"column": "Status", "op": "eq", "value": "Done"}))
            .contains("no column with id `Status`"));
        assert!(refused(json!({"column": "999", "op": "eq", "value": "x"})).contains("`999`"));
        assert!(
            refused(json!({"column": "102", "op": "eq", "value": "abc"})).contains("column `102`")
        );
        assert!(refused(json!({"column": "101", "op": "like", "value": "x"})).contains("`like`"));
        assert!(refused(json!([])).contains("at the top"));
    }
}
