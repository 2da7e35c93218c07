//! A saved report definition, parsed from its JSON into typed parts.
//!
//! Definitions are saved as opaque JSON (fixtures, `POST /admin/v1/import`) and are only checked
//! when the report runs, so everything here is about turning a malformed definition into a
//! `report_compile_failed` that helps its author: every error names the place (a JSON pointer
//! such as `/filter/all/0/op`) and the offending value. Nothing here looks at sheets: checks that
//! need the sources' columns (unknown columns, `sum` of a text column) belong to
//! [`super::compile`].
//!
//! # Shape
//!
//! ```json
//! {"type": "row", "sources": [11, 12], "columns": ["Task", "Hours"],
//!  "filter": {"all": [{"column": "Status", "op": "eq", "value": "Done"}]},
//!  "sort": [{"column": "Hours", "direction": "desc"}]}
//! {"type": "summary", "sources": [11, 12], "groupBy": ["Status"],
//!  "aggregates": [{"fn": "count"}, {"fn": "sum", "column": "Hours"}], "filter": null}
//! ```
//!
//! # Rules chosen where the contract is silent
//!
//! - `type` is required (`row` or `summary`); unknown top-level fields are refused, so a typo
//!   such as `groupby` fails loudly instead of being ignored.
//! - `sources` is a non-empty list of distinct sheet ids (a repeated id would count its rows
//!   twice).
//! - A row report needs a non-empty `columns` and takes no `groupBy`/`aggregates`; a summary
//!   report takes no `columns` and needs at least one `groupBy` column or aggregate.
//! - `filter` may be absent or `null` (every row matches). `{"all": []}` matches every row and
//!   `{"any": []}` matches none.
//! - Leaf values: `eq`/`ne` take a string, number, boolean or a list of strings; `gt`, `gte`,
//!   `lt`, `lte` a string or number; `contains` a string; `in` a list of strings, numbers or
//!   booleans; `is_blank`/`not_blank` no value (absent or `null`).
//! - `sort` items are `{"column", "direction"}` with `direction` `asc` (the default) or `desc`.
//! - `count` takes an optional column (then it counts non-blank cells, named `count(Col)`);
//!   `sum`, `avg`, `min`, `max` need one.

use serde_json::{json, Map, Value};

use crate::error::{Error, ReportErrorKind, Result};
use crate::model::SheetId;

/// A `report_compile_failed` error. Defined here, at the bottom of the report modules, so the
/// definition and the compiler share it without depending on the runner above them.
pub(crate) fn compile_error(message: impl Into<String>, detail: Value) -> Error {
    Error::Report { kind: ReportErrorKind::CompileFailed, message: message.into(), detail }
}

/// `row` (one output row per matching source row) or `summary` (one per group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportType {
    /// A flat grid of matching rows.
    Row,
    /// Groups with aggregates.
    Summary,
}

/// A definition, typed. Column names are kept as written; they are matched against the
/// sources' columns by [`super::compile`].
#[derive(Clone, Debug, PartialEq)]
pub struct Definition {
    /// Row or summary.
    pub ty: ReportType,
    /// The sheets to read, in order (the order is the flat result's tiebreaker).
    pub sources: Vec<SheetId>,
    /// Row reports: the output columns, in order.
    pub columns: Vec<Named>,
    /// Summary reports: the grouping columns (they are also the first output columns).
    pub group_by: Vec<Named>,
    /// Summary reports: one output column each, after the grouping columns.
    pub aggregates: Vec<Aggregate>,
    /// Which rows take part; `None` means all of them.
    pub filter: Option<Filter>,
    /// Sort keys, most significant first.
    pub sort: Vec<SortKey>,
}

/// A column name with the place it was written (for error detail).
#[derive(Clone, Debug, PartialEq)]
pub struct Named {
    /// The column name as written.
    pub name: String,
    /// JSON pointer of the name inside the definition.
    pub path: String,
}

/// An aggregate function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AggFn {
    /// Rows in the group (or non-blank cells of a column).
    Count,
    /// Sum of a number column.
    Sum,
    /// Mean of a number column.
    Avg,
    /// Least value.
    Min,
    /// Greatest value.
    Max,
}

impl AggFn {
    /// The function's name as definitions spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            AggFn::Count => "count",
            AggFn::Sum => "sum",
            AggFn::Avg => "avg",
            AggFn::Min => "min",
            AggFn::Max => "max",
        }
    }
}

/// One aggregate of a summary report.
#[derive(Clone, Debug, PartialEq)]
pub struct Aggregate {
    /// The function.
    pub func: AggFn,
    /// Its column (`None` only for a row `count`).
    pub column: Option<Named>,
}

impl Aggregate {
    /// The output column's name: `count`, `count(Task)`, `sum(Hours)`, ...
    pub fn name(&self) -> String {
        match &self.column {
            None => self.func.as_str().to_owned(),
            Some(c) => format!("{}({})", self.func.as_str(), c.name),
        }
    }
}

/// A filter: nested `all`/`any` over leaf conditions.
#[derive(Clone, Debug, PartialEq)]
pub enum Filter {
    /// Every part matches (true when empty).
    All(Vec<Filter>),
    /// Some part matches (false when empty).
    Any(Vec<Filter>),
    /// One condition on one column.
    Leaf(Condition),
}

/// A filter leaf: `{"column", "op", "value"}`.
#[derive(Clone, Debug, PartialEq)]
pub struct Condition {
    /// The column it tests.
    pub column: Named,
    /// The operator.
    pub op: Op,
    /// The operand (`Null` for `is_blank` / `not_blank`).
    pub value: Value,
    /// JSON pointer of the leaf.
    pub path: String,
}

/// Filter operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Equal.
    Eq,
    /// Not equal (the negation of `eq`: a blank cell is "not equal").
    Ne,
    /// Greater than.
    Gt,
    /// Greater than or equal.
    Gte,
    /// Less than.
    Lt,
    /// Less than or equal.
    Lte,
    /// Case-insensitive substring (text) or list membership (multi_select).
    Contains,
    /// Equal to one of a list of values.
    In,
    /// Missing, null, empty string or empty list.
    IsBlank,
    /// A value present: not missing, null, an empty string or an empty list.
    NotBlank,
}

impl Op {
    /// Every operator with its spelling.
    pub const ALL: [(&'static str, Op); 10] = [
        ("eq", Op::Eq),
        ("ne", Op::Ne),
        ("gt", Op::Gt),
        ("gte", Op::Gte),
        ("lt", Op::Lt),
        ("lte", Op::Lte),
        ("contains", Op::Contains),
        ("in", Op::In),
        ("is_blank", Op::IsBlank),
        ("not_blank", Op::NotBlank),
    ];

    /// The operator's spelling.
    pub fn as_str(self) -> &'static str {
        Op::ALL.iter().find(|(_, op)| *op == self).map_or("eq", |(s, _)| s)
    }

    /// Whether the operator orders values (`gt`, `gte`, `lt`, `lte`).
    pub fn is_ordering(self) -> bool {
        matches!(self, Op::Gt | Op::Gte | Op::Lt | Op::Lte)
    }
}

/// Sort direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Smallest first.
    Asc,
    /// Largest first.
    Desc,
}

/// One sort key.
#[derive(Clone, Debug, PartialEq)]
pub struct SortKey {
    /// The column: any source column for row reports, an output column for summary reports.
    pub column: Named,
    pub direction: Direction,
}

/// Parse a saved definition.
///
/// # Errors
///
/// `report_compile_failed` naming the first problem found, with `detail.path` pointing at it.
pub fn parse(raw: &Value) -> Result<Definition> {
    let obj = raw.as_object().ok_or_else(|| {
        compile_error(
            "The report definition is not a JSON object.",
            json!({"path": "", "reason": "the definition must be an object"}),
        )
    })?;
    const FIELDS: [&str; 7] =
        ["type", "sources", "columns", "groupBy", "aggregates", "filter", "sort"];
    if let Some(unknown) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(problem(
            &format!("/{unknown}"),
            format!("The report definition has an unknown field `{unknown}`."),
            json!({"field": unknown, "reason": format!("known fields: {}", FIELDS.join(", "))}),
        ));
    }
    let ty = match obj.get("type") {
        Some(Value::String(t)) if t == "row" => ReportType::Row,
        Some(Value::String(t)) if t == "summary" => ReportType::Summary,
        Some(other) => {
            return Err(problem(
                "/type",
                format!("The report type {other} is unknown; use `row` or `summary`."),
                json!({"type": other, "reason": "the type must be `row` or `summary`"}),
            ))
        }
        None => {
            return Err(problem(
                "/type",
                "The report definition has no `type`; use `row` or `summary`.",
                json!({"reason": "`type` is required"}),
            ))
        }
    };
    let sources = parse_sources(obj.get("sources"))?;
    let present = |k: &str| obj.get(k).is_some_and(|v| !v.is_null());
    let (columns, group_by, aggregates) = match ty {
        ReportType::Row => {
            for k in ["groupBy", "aggregates"] {
                if present(k) {
                    return Err(problem(
                        &format!("/{k}"),
                        format!("`{k}` belongs to summary reports; this is a row report."),
                        json!({"field": k, "reason": "row reports take `columns`"}),
                    ));
                }
            }
            let columns = parse_names(obj.get("columns"), "columns")?;
            if columns.is_empty() {
                return Err(problem(
                    "/columns",
                    "A row report needs at least one column in `columns`.",
                    json!({"reason": "`columns` must be a non-empty list of column names"}),
                ));
            }
            (columns, Vec::new(), Vec::new())
        }
        ReportType::Summary => {
            if present("columns") {
                return Err(problem(
                    "/columns",
                    "`columns` belongs to row reports; a summary report uses `groupBy` and \
                     `aggregates`.",
                    json!({"field": "columns", "reason": "summary reports take `groupBy` and `aggregates`"}),
                ));
            }
            let group_by = parse_names(obj.get("groupBy"), "groupBy")?;
            let aggregates = parse_aggregates(obj.get("aggregates"))?;
            if group_by.is_empty() && aggregates.is_empty() {
                return Err(problem(
                    "/aggregates",
                    "A summary report needs at least one `groupBy` column or aggregate.",
                    json!({"reason": "both `groupBy` and `aggregates` are empty"}),
                ));
            }
            (Vec::new(), group_by, aggregates)
        }
    };
    let filter = match obj.get("filter") {
        None | Some(Value::Null) => None,
        Some(f) => Some(parse_filter(f, "/filter")?),
    };
    let sort = parse_sort(obj.get("sort"))?;
    Ok(Definition { ty, sources, columns, group_by, aggregates, filter, sort })
}

/// A compile error at `path`, with `path` added to the detail.
fn problem(path: &str, message: impl Into<String>, mut detail: Value) -> Error {
    if let Some(d) = detail.as_object_mut() {
        d.insert("path".into(), Value::String(path.to_owned()));
    }
    compile_error(message, detail)
}

fn parse_sources(raw: Option<&Value>) -> Result<Vec<SheetId>> {
    let list = match raw {
        Some(Value::Array(list)) => list,
        None | Some(Value::Null) => {
            return Err(problem(
                "/sources",
                "The report has no sources: list the sheet ids to read in `sources`.",
                json!({"reason": "`sources` is required"}),
            ))
        }
        Some(other) => {
            return Err(problem(
                "/sources",
                "`sources` must be a list of sheet ids.",
                json!({"sources": other, "reason": "`sources` must be a list of sheet ids"}),
            ))
        }
    };
    if list.is_empty() {
        return Err(problem(
            "/sources",
            "The report has no sources: list the sheet ids to read in `sources`.",
            json!({"reason": "`sources` is empty"}),
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, v) in list.iter().enumerate() {
        let path = format!("/sources/{i}");
        let id = v.as_u64().ok_or_else(|| {
            problem(
                &path,
                format!("Source {v} is not a sheet id."),
                json!({"source": v, "reason": "a source is a sheet id (a non-negative integer)"}),
            )
        })?;
        if out.contains(&id) {
            return Err(problem(
                &path,
                format!("Sheet {id} is listed twice in `sources`."),
                json!({"source": id, "reason": "each source may be listed once"}),
            ));
        }
        out.push(id);
    }
    Ok(out)
}

/// A list of column names (absent or `null` is empty).
fn parse_names(raw: Option<&Value>, field: &str) -> Result<Vec<Named>> {
    let list = match raw {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(problem(
                &format!("/{field}"),
                format!("`{field}` must be a list of column names."),
                json!({field: other, "reason": format!("`{field}` must be a list of column names")}),
            ))
        }
    };
    list.iter().enumerate().map(|(i, v)| column_name(v, &format!("/{field}/{i}"))).collect()
}

fn column_name(v: &Value, path: &str) -> Result<Named> {
    match v {
        Value::String(s) if !s.is_empty() => Ok(Named { name: s.clone(), path: path.to_owned() }),
        other => Err(problem(
            path,
            format!("{other} is not a column name."),
            json!({"column": other, "reason": "a column is named by a non-empty string"}),
        )),
    }
}

/// Refuse fields other than `allowed` in an object at `path`.
fn only_fields(obj: &Map<String, Value>, allowed: &[&str], path: &str) -> Result<()> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => Err(problem(
            &format!("{path}/{k}"),
            format!("Unknown field `{k}` at {path}."),
            json!({"field": k, "reason": format!("known fields here: {}", allowed.join(", "))}),
        )),
    }
}

fn parse_aggregates(raw: Option<&Value>) -> Result<Vec<Aggregate>> {
    let list = match raw {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(problem(
                "/aggregates",
                "`aggregates` must be a list of `{\"fn\", \"column\"}` objects.",
                json!({"aggregates": other, "reason": "`aggregates` must be a list"}),
            ))
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let path = format!("/aggregates/{i}");
        let obj = item.as_object().ok_or_else(|| {
            problem(
                &path,
                format!("Aggregate {item} is not an object."),
                json!({"aggregate": item, "reason": "an aggregate is {\"fn\", \"column\"}"}),
            )
        })?;
        only_fields(obj, &["fn", "column"], &path)?;
        let func = match obj.get("fn") {
            Some(Value::String(f)) => match f.as_str() {
                "count" => AggFn::Count,
                "sum" => AggFn::Sum,
                "avg" => AggFn::Avg,
                "min" => AggFn::Min,
                "max" => AggFn::Max,
                _ => {
                    return Err(problem(
                        &format!("{path}/fn"),
                        format!("The aggregate function `{f}` is unknown."),
                        json!({"fn": f, "reason": "use count, sum, avg, min or max"}),
                    ))
                }
            },
            other => {
                return Err(problem(
                    &format!("{path}/fn"),
                    "An aggregate needs `fn`: count, sum, avg, min or max.",
                    json!({"fn": other, "reason": "`fn` must be count, sum, avg, min or max"}),
                ))
            }
        };
        let column = match obj.get("column") {
            None | Some(Value::Null) if func == AggFn::Count => None,
            None | Some(Value::Null) => {
                return Err(problem(
                    &format!("{path}/column"),
                    format!("The aggregate `{}` needs a `column`.", func.as_str()),
                    json!({"fn": func.as_str(), "reason": "this function needs a column"}),
                ))
            }
            Some(v) => Some(column_name(v, &format!("{path}/column"))?),
        };
        out.push(Aggregate { func, column });
    }
    Ok(out)
}

/// Parse a filter on its own (listRows' `filter` query, whose leaves name columns by id): the
/// same shape and rules as a definition's `filter`, places given as JSON pointers from the
/// filter's root.
///
/// # Errors
///
/// `report_compile_failed` naming the first problem, with `detail.path` pointing at it.
pub fn parse_filter_alone(raw: &Value) -> Result<Filter> {
    parse_filter(raw, "")
}

/// A place in a definition for a message: its JSON pointer, or "the top" for the root.
pub(crate) fn place(path: &str) -> &str {
    if path.is_empty() {
        "the top"
    } else {
        path
    }
}

fn parse_filter(raw: &Value, path: &str) -> Result<Filter> {
    let malformed = |reason: &str| {
        problem(
            path,
            format!("The filter at {} is malformed: {reason}.", place(path)),
            json!({"filter": raw, "reason": reason}),
        )
    };
    let obj = raw.as_object().ok_or_else(|| malformed("a filter is an object"))?;
    for (key, all) in [("all", true), ("any", false)] {
        if let Some(parts) = obj.get(key) {
            if obj.len() != 1 {
                return Err(malformed(&format!("`{key}` must be the only field of its object")));
            }
            let parts = parts
                .as_array()
                .ok_or_else(|| malformed(&format!("`{key}` must be a list of filters")))?;
            let parts = parts
                .iter()
                .enumerate()
                .map(|(i, p)| parse_filter(p, &format!("{path}/{key}/{i}")))
                .collect::<Result<Vec<_>>>()?;
            return Ok(if all { Filter::All(parts) } else { Filter::Any(parts) });
        }
    }
    if !obj.contains_key("column") {
        return Err(malformed("expected `all`, `any`, or a condition `{column, op, value}`"));
    }
    only_fields(obj, &["column", "op", "value"], path)?;
    let column = column_name(&obj["column"], &format!("{path}/column"))?;
    let op = match obj.get("op") {
        Some(Value::String(s)) => {
            Op::ALL.iter().find(|(name, _)| name == s).map(|(_, op)| *op).ok_or_else(|| {
                problem(
                    &format!("{path}/op"),
                    format!("The filter operator `{s}` is unknown."),
                    json!({"op": s, "reason": format!("use one of: {}", op_names())}),
                )
            })?
        }
        other => {
            return Err(problem(
                &format!("{path}/op"),
                format!("The condition at {} needs an `op`.", place(path)),
                json!({"op": other, "reason": format!("`op` must be one of: {}", op_names())}),
            ))
        }
    };
    let value = obj.get("value").cloned().unwrap_or(Value::Null);
    check_operand(op, &value, &format!("{path}/value"))?;
    Ok(Filter::Leaf(Condition { column, op, value, path: path.to_owned() }))
}

fn op_names() -> String {
    Op::ALL.iter().map(|(s, _)| *s).collect::<Vec<_>>().join(", ")
}

/// Whether `value` suits `op` (see the module docs).
fn check_operand(op: Op, value: &Value, path: &str) -> Result<()> {
    let scalar = |v: &Value| v.is_string() || v.is_number() || v.is_boolean();
    let (ok, wants) = match op {
        Op::Eq | Op::Ne => (
            scalar(value) || value.as_array().is_some_and(|l| l.iter().all(Value::is_string)),
            "a string, number, boolean or list of strings (use is_blank for blanks)",
        ),
        Op::Gt | Op::Gte | Op::Lt | Op::Lte => {
            (value.is_string() || value.is_number(), "a string or number")
        }
        Op::Contains => (value.is_string(), "a string"),
        Op::In => (
            value.as_array().is_some_and(|l| l.iter().all(scalar)),
            "a list of strings, numbers or booleans",
        ),
        Op::IsBlank | Op::NotBlank => (value.is_null(), "no value"),
    };
    if ok {
        Ok(())
    } else {
        Err(problem(
            path,
            format!("The operator `{}` takes {wants}, not {value}.", op.as_str()),
            json!({"op": op.as_str(), "value": value, "reason": format!("`{}` takes {wants}", op.as_str())}),
        ))
    }
}

fn parse_sort(raw: Option<&Value>) -> Result<Vec<SortKey>> {
    let list = match raw {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(problem(
                "/sort",
                "`sort` must be a list of `{\"column\", \"direction\"}` objects.",
                json!({"sort": other, "reason": "`sort` must be a list"}),
            ))
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let path = format!("/sort/{i}");
        let obj = item.as_object().ok_or_else(|| {
            problem(
                &path,
                format!("Sort key {item} is not an object."),
                json!({"sort": item, "reason": "a sort key is {\"column\", \"direction\"}"}),
            )
        })?;
        only_fields(obj, &["column", "direction"], &path)?;
        let column =
            column_name(obj.get("column").unwrap_or(&Value::Null), &format!("{path}/column"))?;
        let direction = match obj.get("direction") {
            None | Some(Value::Null) => Direction::Asc,
            Some(Value::String(d)) if d == "asc" => Direction::Asc,
            Some(Value::String(d)) if d == "desc" => Direction::Desc,
            Some(other) => {
                return Err(problem(
                    &format!("{path}/direction"),
                    format!("The sort direction {other} is unknown; use `asc` or `desc`."),
                    json!({"direction": other, "reason": "the direction must be `asc` or `desc`"}),
                ))
            }
        };
        out.push(SortKey { column, direction });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ReportErrorKind;

    fn detail_of(raw: Value) -> Value {
        match parse(&raw) {
            Err(Error::Report { kind: ReportErrorKind::CompileFailed, detail, message }) => {
                assert!(!message.is_empty());
                detail
            }
            other => panic!("expected a compile error for {raw}, got {other:?}"),
        }
    }

    #[test]
    fn parses_both_kinds_of_the_decisions_examples() {
        let row = parse(&json!({"type": "row", "sources": [11, 12],
            "columns": ["Task", "Status", "Hours"],
            "filter": {"all": [{"column": "Status", "op": "eq", "value": "Done"}]},
            "sort": [{"column": "Hours", "direction": "desc"}]}))
        .unwrap();
        assert_eq!(row.ty, ReportType::Row);
        assert_eq!(row.sources, [11, 12]);
        assert_eq!(
            row.columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["Task", "Status", "Hours"]
        );
        assert_eq!(row.columns[2].path, "/columns/2");
        assert_eq!(row.sort[0].direction, Direction::Desc);
        let Some(Filter::All(parts)) = &row.filter else { panic!("all") };
        let Filter::Leaf(c) = &parts[0] else { panic!("leaf") };
        assert_eq!((c.column.name.as_str(), c.op, &c.value), ("Status", Op::Eq, &json!("Done")));
        assert_eq!(c.path, "/filter/all/0");

        let summary = parse(&json!({"type": "summary", "sources": [11, 12], "groupBy": ["Status"],
            "aggregates": [{"fn": "count"}, {"fn": "sum", "column": "Hours"}], "filter": null}))
        .unwrap();
        assert_eq!(summary.ty, ReportType::Summary);
        assert_eq!(summary.filter, None);
        let names: Vec<String> = summary.aggregates.iter().map(Aggregate::name).collect();
        assert_eq!(names, ["count", "sum(Hours)"]);
    }

    #[test]
    fn defaults_sort_direction_and_accepts_every_operator() {
        let d = parse(&json!({"type": "row", "sources": [1], "columns": ["A"],
            "sort": [{"column": "A"}],
            "filter": {"any": [
                {"column": "A", "op": "eq", "value": "x"}, {"column": "A", "op": "ne", "value": 1},
                {"column": "A", "op": "gt", "value": 1}, {"column": "A", "op": "gte", "value": "b"},
                {"column": "A", "op": "lt", "value": 2.5}, {"column": "A", "op": "lte", "value": 3},
                {"column": "A", "op": "contains", "value": "x"}, {"column": "A", "op": "in", "value": ["a", 1, true]},
                {"column": "A", "op": "is_blank"}, {"column": "A", "op": "not_blank", "value": null},
                {"all": []}]}}))
        .unwrap();
        assert_eq!(d.sort[0].direction, Direction::Asc);
        let Some(Filter::Any(parts)) = d.filter else { panic!("any") };
        let ops: Vec<Op> = parts
            .iter()
            .filter_map(|p| match p {
                Filter::Leaf(c) => Some(c.op),
                _ => None,
            })
            .collect();
        assert_eq!(ops, Op::ALL.map(|(_, op)| op));
        assert_eq!(parts[10], Filter::All(vec![]));
    }

    #[test]
    fn refuses_shapes_with_a_pointer_to_the_problem() {
        assert_eq!(detail_of(json!([1, 2]))["path"], "");
        assert_eq!(detail_of(json!({"type": "pivot", "sources": [1]}))["type"], "pivot");
        assert_eq!(detail_of(json!({"sources": [1], "columns": ["A"]}))["path"], "/type");
        assert_eq!(detail_of(json!({"type": "row", "columns": ["A"]}))["path"], "/sources");
        assert_eq!(
            detail_of(json!({"type": "row", "sources": [], "columns": ["A"]}))["reason"],
            "`sources` is empty"
        );
        assert_eq!(
            detail_of(json!({"type": "row", "sources": [1, "x"], "columns": ["A"]}))["path"],
            "/sources/1"
        );
        assert_eq!(
            detail_of(json!({"type": "row", "sources": [1, 1], "columns": ["A"]}))["source"],
            1
        );
        assert_eq!(detail_of(json!({"type": "row", "sources": [1]}))["path"], "/columns");
        assert_eq!(
            detail_of(json!({"type": "row", "sources": [1], "columns": ["A"], "groupby": []}))
                ["field"],
            "groupby"
        );
        assert_eq!(
            detail_of(json!({"type": "row", "sources": [1], "columns": ["A"], "groupBy": ["A"]}))
                ["field"],
            "groupBy"
        );
        assert_eq!(
            detail_of(json!({"type": "summary", "sources": [1], "columns": ["A"]}))["field"],
            "columns"
        );
        assert_eq!(detail_of(json!({"type": "summary", "sources": [1]}))["path"], "/aggregates");
        assert_eq!(
            detail_of(json!({"type": "row", "sources": [1], "columns": ["A", 3]}))["path"],
            "/columns/1"
        );
    }

    #[test]
    fn refuses_bad_aggregates() {
        let base = |aggs: Value| json!({"type": "summary", "sources": [1], "aggregates": aggs});
        let d = detail_of(base(json!([{"fn": "median", "column": "A"}])));
        assert_eq!(
            (d["fn"].as_str(), d["path"].as_str()),
            (Some("median"), Some("/aggregates/0/fn"))
        );
        let d = detail_of(base(json!([{"fn": "count"}, {"fn": "sum"}])));
        assert_eq!(
            (d["fn"].as_str(), d["path"].as_str()),
            (Some("sum"), Some("/aggregates/1/column"))
        );
        assert_eq!(detail_of(base(json!([{"column": "A"}])))["path"], "/aggregates/0/fn");
        assert_eq!(detail_of(base(json!([{"fn": "max", "column": "A", "x": 1}])))["field"], "x");
        assert_eq!(detail_of(base(json!({"fn": "count"})))["path"], "/aggregates");
    }

    #[test]
    fn refuses_bad_filters_and_sorts() {
        let with = |filter: Value| json!({"type": "row", "sources": [1], "columns": ["A"], "filter": filter});
        let d = detail_of(with(json!({"column": "A", "op": "like", "value": "x"})));
        assert_eq!((d["op"].as_str(), d["path"].as_str()), (Some("like"), Some("/filter/op")));
        assert!(d["reason"].as_str().unwrap().contains("not_blank"));
        assert_eq!(detail_of(with(json!({"all": [{"column": "A"}]})))["path"], "/filter/all/0/op");
        assert_eq!(detail_of(with(json!({"all": {"column": "A"}})))["path"], "/filter");
        assert_eq!(detail_of(with(json!({"all": [], "any": []})))["path"], "/filter");
        assert_eq!(detail_of(with(json!({"none": []})))["path"], "/filter");
        assert_eq!(detail_of(with(json!("Status = Done")))["path"], "/filter");
        assert_eq!(
            detail_of(with(json!({"any": [{"all": [{"column": "A", "op": "in", "value": "x"}]}]})))
                ["path"],
            "/filter/any/0/all/0/value"
        );
        for (op, value) in [
            ("eq", json!(null)),
            ("eq", json!({"a": 1})),
            ("gt", json!(true)),
            ("gt", json!([1])),
            ("contains", json!(3)),
            ("in", json!([[1]])),
            ("is_blank", json!("x")),
        ] {
            let d = detail_of(with(json!({"column": "A", "op": op, "value": value})));
            assert_eq!(d["op"], op, "{op} {value}");
            assert_eq!(d["path"], "/filter/value");
        }
        assert_eq!(
            detail_of(with(json!({"column": "A", "op": "eq", "value": 1, "extra": 2})))["field"],
            "extra"
        );
        let sort = |s: Value| json!({"type": "row", "sources": [1], "columns": ["A"], "sort": s});
        let d = detail_of(sort(json!([{"column": "A", "direction": "up"}])));
        assert_eq!(
            (d["direction"].as_str(), d["path"].as_str()),
            (Some("up"), Some("/sort/0/direction"))
        );
        assert_eq!(detail_of(sort(json!([{"direction": "asc"}])))["path"], "/sort/0/column");
        assert_eq!(detail_of(sort(json!("A")))["path"], "/sort");
    }
}
