//! Compiling a parsed [`Definition`] against the columns of its readable sources into a
//! [`QueryPlan`]: which column id each named column is in each source, the output columns and their
//! types, and the filter with its operands normalized to the columns' types. A lone filter
//! whose leaves name columns by id (listRows' `filter`) compiles against one sheet's columns
//! into a [`SheetFilter`] by the same rules ([`compile_sheet_filter`]).
//!
//! A plan is compiled once per run, before any row is read, so every problem with the
//! definition is found up front and the scan itself cannot fail.
//!
//! # Rules
//!
//! - Columns are matched by name in each readable source (the first by position when a sheet
//!   has two of the same name). A name no readable source has is refused
//!   (`{"column": "Hourz", "reason": "no readable source has this column"}`); a name only some
//!   sources have reads as `null` in the others. Unreadable sources are never consulted, so
//!   nothing about their columns can leak through an error or a type.
//! - When **no** source is readable there is nothing to match against: the column checks are
//!   skipped and the run returns an empty result (every source counted as omitted), rather than
//!   a 422 about columns the caller cannot see anyway.
//! - An output column's type is the columns' type when every readable source having it agrees,
//!   else `text`. `count`, `sum` and `avg` are `number`; `min` and `max` take their column's
//!   type (the least of a date column is a date).
//! - `sum` and `avg` need a `number` column in every readable source that has it.
//! - Filter operands are coerced exactly as a cell of their column is (docs/spec/decisions.md §3,
//!   through [`coerce_operand`]) when the readable sources agree on the column's type: `"5.0"`
//!   becomes the number `5.0` for a `number` column, `"true"` the boolean for a `checkbox`, a
//!   datetime with an offset its UTC form, a lone option a list of one for a `multi_select`. A
//!   column that several sources have is coerced against each until one accepts (their option lists
//!   may differ). Each item of an `in` list is such an operand. An operand a cell of the column
//!   could not hold (`"abc"` or `" 2.5 "` against a number, an option the column lacks, an
//!   impossible date) is refused, naming the column, the operator and the reason.
//! - `contains` takes a fragment, not a value: on text-like columns it is used as written (a
//!   contact `contains "example.com"`), on a `multi_select` it must be one of the options. It is
//!   refused on `number` and `checkbox` columns; ordering (`gt`, `gte`, `lt`, `lte`) is refused
//!   on `checkbox` and `multi_select` columns.
//! - A `datetime` test compares instants, not text ([`Predicate::Test::instants`]).
//! - When the sources disagree on the type the operand is used as written.
//! - Row reports may sort by any column of the sources; summary reports sort by their output
//!   columns (a `groupBy` column or an aggregate such as `sum(Hours)`).

use std::sync::Arc;

use imbl::OrdMap;
use serde_json::{json, Value};

use super::definition::{
    compile_error, place, AggFn, Condition, Definition, Direction, Filter, Named, Op, ReportType,
};
use crate::coerce::coerce_operand;
use crate::error::Result;
use crate::model::{Column, ColumnId, ColumnType, Row, RowId, SheetId};

/// One readable source: a copy of a sheet's columns and rows.
#[derive(Clone, Debug)]
pub struct Source {
    pub sheet_id: SheetId,
    /// Its columns, by position.
    pub columns: Arc<[Column]>,
    /// Its rows by id (a persistent map: cloning it is O(1)).
    pub rows: OrdMap<RowId, Arc<Row>>,
}

/// How the result is shaped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One output row per matching source row (row reports).
    Flat,
    /// One output row per group (summary reports).
    Aggregated,
}

impl Mode {
    /// `flat` or `aggregated`, as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Flat => "flat",
            Mode::Aggregated => "aggregated",
        }
    }
}

/// An output column; its id is its position plus one.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputColumn {
    /// Name: the source column's, or the aggregate's (`sum(Hours)`).
    pub name: String,
    /// Type (see the module docs).
    pub ty: ColumnType,
}

/// A compiled filter. Leaves name a plan field, not a column id: the id differs per source.
#[derive(Clone, Debug, PartialEq)]
pub enum Predicate {
    /// Every part passes.
    All(Vec<Predicate>),
    /// Some part passes.
    Any(Vec<Predicate>),
    /// One test on one field.
    Test {
        /// Index into [`QueryPlan::fields`].
        field: usize,
        /// The operator.
        op: Op,
        /// The operand, coerced as a cell of the column (module docs).
        operand: Value,
        /// `contains`: the operand lower-cased (empty otherwise).
        needle: String,
        /// Compare strings as stored datetimes, by the instants they denote (a `datetime`
        /// column): their fractions of a second are kept as sent, so their text can differ for
        /// one instant and misorder two.
        instants: bool,
    },
}

/// What to compute, per result shape. Field numbers index [`QueryPlan::fields`].
#[derive(Clone, Debug, PartialEq)]
pub enum Shape {
    /// Row reports.
    Flat {
        /// The field of each output column.
        select: Vec<usize>,
        /// Sort keys: field and direction.
        sort: Vec<(usize, Direction)>,
    },
    /// Summary reports.
    Grouped {
        /// The grouping fields (the first output columns).
        group_by: Vec<usize>,
        /// Each aggregate's function and field (`None`: a row count).
        aggregates: Vec<(AggFn, Option<usize>)>,
        /// Sort keys: output column index and direction.
        sort: Vec<(usize, Direction)>,
    },
}

/// A compiled report.
#[derive(Clone, Debug, PartialEq)]
pub struct QueryPlan {
    /// Flat or aggregated.
    pub mode: Mode,
    /// Output columns, in order.
    pub columns: Vec<OutputColumn>,
    /// Every column name the run reads.
    pub fields: Vec<String>,
    /// `lookup[source][field]`: the field's column id in each readable source (`None`: the
    /// source lacks it and reads `null`).
    pub lookup: Vec<Vec<Option<ColumnId>>>,
    /// The filter; `None` passes every row.
    pub filter: Option<Predicate>,
    /// Shape-specific parts.
    pub shape: Shape,
}

/// How a definition or filter names columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ColumnKey {
    /// By name, across sources (saved reports).
    Name,
    /// By id written as a decimal string, in one sheet (listRows' `filter`).
    Id,
}

/// The column `key` names in `columns` (by name: the first by position).
fn find<'s>(columns: &'s [Column], by: ColumnKey, key: &str) -> Option<&'s Column> {
    match by {
        ColumnKey::Name => columns.iter().find(|c| c.name == key),
        ColumnKey::Id => columns.iter().find(|c| c.id.to_string() == key),
    }
}

/// Collects the fields a plan reads, checking each against the readable sources' columns.
struct Fields<'s> {
    /// The columns of each readable source.
    tables: Vec<&'s [Column]>,
    by: ColumnKey,
    names: Vec<String>,
}

impl<'s> Fields<'s> {
    /// The field of a named column; refused when no readable source has it.
    fn field(&mut self, named: &Named) -> Result<usize> {
        if !self.tables.is_empty() && self.columns(&named.name).next().is_none() {
            let (message, reason) = match self.by {
                ColumnKey::Name => (
                    format!(
                        "No readable source of the report has a column named `{}`.",
                        named.name
                    ),
                    "no readable source has this column",
                ),
                ColumnKey::Id => (
                    format!("The sheet has no column with id `{}`.", named.name),
                    "no column of the sheet has this id",
                ),
            };
            return Err(compile_error(
                message,
                json!({"path": named.path, "column": named.name, "reason": reason}),
            ));
        }
        Ok(match self.names.iter().position(|n| *n == named.name) {
            Some(i) => i,
            None => {
                self.names.push(named.name.clone());
                self.names.len() - 1
            }
        })
    }

    /// The type the readable sources having `name` agree on, if they do.
    fn agreed_type(&self, name: &str) -> Option<ColumnType> {
        let mut types = self.columns(name).map(|c| c.ty);
        let first = types.next()?;
        types.all(|t| t == first).then_some(first)
    }

    /// The columns named `name` in the readable sources having it.
    fn columns<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'s Column> + 'a {
        self.tables.iter().filter_map(move |t| find(t, self.by, name))
    }

    /// The output type of a column (`text` when the sources disagree).
    fn output_type(&self, name: &str) -> ColumnType {
        self.agreed_type(name).unwrap_or(ColumnType::Text)
    }

    /// Each field's column id in `columns`.
    fn lookup(&self, columns: &[Column]) -> Vec<Option<ColumnId>> {
        self.names.iter().map(|n| find(columns, self.by, n).map(|c| c.id)).collect()
    }
}

/// A filter compiled against one sheet, its leaves naming columns by id: listRows' `filter`.
/// It runs through the same predicate evaluation as a report ([`SheetFilter::matches`]).
#[derive(Clone, Debug, PartialEq)]
pub struct SheetFilter {
    /// The compiled filter.
    pub predicate: Predicate,
    /// The column id of each field of the predicate.
    pub lookup: Vec<Option<ColumnId>>,
}

/// Compile a filter whose leaves name columns by id (as decimal strings) against one sheet's
/// `columns`, with the rules of a report's filter (module docs).
///
/// # Errors
///
/// `report_compile_failed` for a column id the sheet lacks, or an operand the column's type
/// cannot match; `detail.path` points into the filter.
pub fn compile_sheet_filter(filter: &Filter, columns: &[Column]) -> Result<SheetFilter> {
    let mut fields = Fields { tables: vec![columns], by: ColumnKey::Id, names: Vec::new() };
    let predicate = predicate(filter, &mut fields)?;
    Ok(SheetFilter { predicate, lookup: fields.lookup(columns) })
}

/// Compile `def` against its readable sources (in definition order).
///
/// # Errors
///
/// `report_compile_failed` for an unknown column, `sum`/`avg` of a non-number column, an
/// operand the column's type cannot match, or a summary sort key that is not an output column.
pub fn compile(def: &Definition, sources: &[Source]) -> Result<QueryPlan> {
    let tables = sources.iter().map(|s| &s.columns[..]).collect();
    let mut fields = Fields { tables, by: ColumnKey::Name, names: Vec::new() };
    let (mode, columns, shape) = match def.ty {
        ReportType::Row => {
            let mut select = Vec::new();
            let mut columns = Vec::new();
            for named in &def.columns {
                select.push(fields.field(named)?);
                columns.push(OutputColumn {
                    name: named.name.clone(),
                    ty: fields.output_type(&named.name),
                });
            }
            let sort = def
                .sort
                .iter()
                .map(|k| Ok((fields.field(&k.column)?, k.direction)))
                .collect::<Result<Vec<_>>>()?;
            (Mode::Flat, columns, Shape::Flat { select, sort })
        }
        ReportType::Summary => {
            let mut group_by = Vec::new();
            let mut columns = Vec::new();
            for named in &def.group_by {
                group_by.push(fields.field(named)?);
                columns.push(OutputColumn {
                    name: named.name.clone(),
                    ty: fields.output_type(&named.name),
                });
            }
            let mut aggregates = Vec::new();
            for agg in &def.aggregates {
                let field = match &agg.column {
                    None => None,
                    Some(named) => {
                        let f = fields.field(named)?;
                        if matches!(agg.func, AggFn::Sum | AggFn::Avg) {
                            check_number(sources, agg.func, named)?;
                        }
                        Some(f)
                    }
                };
                let ty = match (agg.func, &agg.column) {
                    (AggFn::Min | AggFn::Max, Some(named)) => fields.output_type(&named.name),
                    _ => ColumnType::Number,
                };
                aggregates.push((agg.func, field));
                columns.push(OutputColumn { name: agg.name(), ty });
            }
            let sort = def
                .sort
                .iter()
                .map(|k| {
                    let col = columns.iter().position(|c| c.name == k.column.name).ok_or_else(|| {
                        let names: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
                        compile_error(
                            format!(
                                "A summary report sorts by its output columns; `{}` is not one.",
                                k.column.name
                            ),
                            json!({"path": k.column.path, "column": k.column.name,
                                   "reason": format!("sort by one of the output columns: {}", names.join(", "))}),
                        )
                    })?;
                    Ok((col, k.direction))
                })
                .collect::<Result<Vec<_>>>()?;
            (Mode::Aggregated, columns, Shape::Grouped { group_by, aggregates, sort })
        }
    };
    let filter = def.filter.as_ref().map(|f| predicate(f, &mut fields)).transpose()?;
    let lookup = sources.iter().map(|s| fields.lookup(&s.columns)).collect();
    Ok(QueryPlan { mode, columns, fields: fields.names, lookup, filter, shape })
}

/// `sum`/`avg` need a number column in every readable source that has it.
fn check_number(sources: &[Source], func: AggFn, named: &Named) -> Result<()> {
    for s in sources {
        let column = find(&s.columns, ColumnKey::Name, &named.name);
        if let Some(c) = column.filter(|c| c.ty != ColumnType::Number) {
            return Err(compile_error(
                format!(
                    "`{}` needs a number column; `{}` is a {} column in sheet {}.",
                    func.as_str(),
                    named.name,
                    c.ty.as_str(),
                    s.sheet_id
                ),
                json!({"path": named.path, "fn": func.as_str(), "column": named.name,
                       "reason": format!("`{}` needs a number column, not {}", func.as_str(), c.ty.as_str())}),
            ));
        }
    }
    Ok(())
}

fn predicate(filter: &Filter, fields: &mut Fields<'_>) -> Result<Predicate> {
    Ok(match filter {
        Filter::All(parts) => {
            Predicate::All(parts.iter().map(|p| predicate(p, fields)).collect::<Result<_>>()?)
        }
        Filter::Any(parts) => {
            Predicate::Any(parts.iter().map(|p| predicate(p, fields)).collect::<Result<_>>()?)
        }
        Filter::Leaf(cond) => {
            let field = fields.field(&cond.column)?;
            let ty = fields.agreed_type(&cond.column.name);
            let operand = match ty {
                Some(ty) => {
                    operand(cond, ty, &fields.columns(&cond.column.name).collect::<Vec<_>>())?
                }
                None => cond.value.clone(),
            };
            let needle = match (cond.op, &operand) {
                (Op::Contains, Value::String(s)) => s.to_lowercase(),
                _ => String::new(),
            };
            let instants = ty == Some(ColumnType::Datetime);
            Predicate::Test { field, op: cond.op, operand, needle, instants }
        }
    })
}

/// A leaf's operand for a column of type `ty` (`columns`: that column in each readable source
/// having it), coerced as a cell of the column; refused when the operator does not apply to the
/// type or the operand cannot be such a cell (module docs).
fn operand(cond: &Condition, ty: ColumnType, columns: &[&Column]) -> Result<Value> {
    let refuse = |reason: String| {
        compile_error(
            format!(
                "The filter at {} cannot match column `{}`: {reason}.",
                place(&cond.path),
                cond.column.name
            ),
            json!({"path": format!("{}/value", cond.path), "op": cond.op.as_str(),
                   "column": cond.column.name, "value": cond.value, "reason": reason}),
        )
    };
    // Coerced against each source's column until one accepts; else the first refusal.
    let coerce = |raw: &Value| -> std::result::Result<Value, String> {
        let mut first = None;
        for column in columns {
            match coerce_operand(column, raw) {
                Ok(v) => return Ok(v),
                Err(e) => {
                    first.get_or_insert(e.reason);
                }
            }
        }
        Err(first.unwrap_or_else(|| "no readable source has this column".to_owned()))
    };
    let not_for = |what: &str| refuse(format!("`{}` does not apply to {what}", cond.op.as_str()));
    match cond.op {
        Op::IsBlank | Op::NotBlank => Ok(Value::Null),
        Op::Contains => match ty {
            ColumnType::Number => Err(not_for("a number column")),
            ColumnType::Checkbox => Err(not_for("a checkbox")),
            // One option, which a list cell contains.
            ColumnType::MultiSelect => {
                coerce(&cond.value).map(|_| cond.value.clone()).map_err(refuse)
            }
            _ => Ok(cond.value.clone()),
        },
        op if op.is_ordering() && ty == ColumnType::Checkbox => Err(not_for("a checkbox")),
        op if op.is_ordering() && ty == ColumnType::MultiSelect => Err(not_for("a list")),
        Op::In => match &cond.value {
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    coerce(item).map_err(|reason| refuse(format!("item {i}: {reason}")))
                })
                .collect::<Result<Vec<_>>>()
                .map(Value::Array),
            other => coerce(other).map_err(refuse),
        },
        _ => coerce(&cond.value).map_err(refuse),
    }
}

#[cfg(test)]
mod tests {
    use imbl::OrdMap;

    use super::*;
    use crate::error::Error;
    use crate::error::ReportErrorKind;
    use crate::model::SheetId;
    use crate::report::definition::parse;

    fn source(sheet_id: SheetId, cols: &[(ColumnId, &str, ColumnType)]) -> Source {
        Source {
            sheet_id,
            columns: cols
                .iter()
                .enumerate()
                .map(|(i, (id, name, ty))| Column {
                    id: *id,
                    sheet_id,
                    name: (*name).into(),
                    ty: *ty,
                    position: i as i64,
                    // Sheet 11 has one more status than sheet 10.
                    options: match (ty, sheet_id) {
                        (ColumnType::Dropdown, 10) => Some(vec!["Open".into(), "Done".into()]),
                        (ColumnType::Dropdown, _) => {
                            Some(vec!["Open".into(), "Done".into(), "Blocked".into()])
                        }
                        (ColumnType::MultiSelect, _) => Some(vec!["a".into(), "b".into()]),
                        _ => None,
                    },
                    primary: false,
                })
                .collect(),
            rows: OrdMap::new(),
        }
    }

    fn sources() -> Vec<Source> {
        vec![
            source(
                10,
                &[
                    (100, "Task", ColumnType::Text),
                    (101, "Status", ColumnType::Dropdown),
                    (102, "Hours", ColumnType::Number),
                    (103, "Billable", ColumnType::Checkbox),
                    (107, "Tags", ColumnType::MultiSelect),
                    (108, "Seen", ColumnType::Datetime),
                    (109, "Code", ColumnType::Number),
                ],
            ),
            source(
                11,
                &[
                    (111, "Status", ColumnType::Dropdown),
                    (110, "Task", ColumnType::Text),
                    (112, "Hours", ColumnType::Number),
                    (119, "Code", ColumnType::Text),
                ],
            ),
        ]
    }

    fn plan(def: Value) -> Result<QueryPlan> {
        compile(&parse(&def).unwrap(), &sources())
    }

    fn error(def: Value) -> Value {
        match plan(def.clone()) {
            Err(Error::Report { kind: ReportErrorKind::CompileFailed, detail, .. }) => detail,
            other => panic!("expected a compile error for {def}, got {other:?}"),
        }
    }

    fn row_with(filter: Value) -> Value {
        json!({"type": "row", "sources": [10, 11], "columns": ["Task"], "filter": filter})
    }

    #[test]
    fn resolves_columns_per_source_and_types() {
        let p = plan(
            json!({"type": "row", "sources": [10, 11], "columns": ["Task", "Code", "Billable"],
            "sort": [{"column": "Hours", "direction": "desc"}]}),
        )
        .unwrap();
        assert_eq!(p.mode, Mode::Flat);
        assert_eq!(p.fields, ["Task", "Code", "Billable", "Hours"]);
        assert_eq!(
            p.lookup,
            [
                vec![Some(100), Some(109), Some(103), Some(102)],
                vec![Some(110), Some(119), None, Some(112)],
            ]
        );
        let types: Vec<ColumnType> = p.columns.iter().map(|c| c.ty).collect();
        assert_eq!(
            types,
            [ColumnType::Text, ColumnType::Text, ColumnType::Checkbox],
            "Code disagrees"
        );
        assert_eq!(
            p.shape,
            Shape::Flat { select: vec![0, 1, 2], sort: vec![(3, Direction::Desc)] }
        );
    }

    #[test]
    fn summary_output_columns_and_sort() {
        let p = plan(json!({"type": "summary", "sources": [10, 11], "groupBy": ["Status"],
            "aggregates": [{"fn": "count"}, {"fn": "sum", "column": "Hours"}, {"fn": "min", "column": "Task"}],
            "sort": [{"column": "sum(Hours)", "direction": "desc"}]}))
        .unwrap();
        assert_eq!(p.mode, Mode::Aggregated);
        let cols: Vec<(&str, ColumnType)> =
            p.columns.iter().map(|c| (c.name.as_str(), c.ty)).collect();
        assert_eq!(
            cols,
            [
                ("Status", ColumnType::Dropdown),
                ("count", ColumnType::Number),
                ("sum(Hours)", ColumnType::Number),
                ("min(Task)", ColumnType::Text),
            ]
        );
        assert_eq!(
            p.shape,
            Shape::Grouped {
                group_by: vec![0],
                aggregates: vec![
                    (AggFn::Count, None),
                    (AggFn::Sum, Some(1)),
                    (AggFn::Min, Some(2))
                ],
                sort: vec![(2, Direction::Desc)],
            }
        );
        let d = error(json!({"type": "summary", "sources": [10], "groupBy": ["Status"],
            "aggregates": [{"fn": "count"}], "sort": [{"column": "Hours"}]}));
        assert_eq!(
            (d["column"].as_str(), d["path"].as_str()),
            (Some("Hours"), Some("/sort/0/column"))
        );
        assert!(d["reason"].as_str().unwrap().contains("Status, count"));
    }

    #[test]
    fn unknown_columns_are_refused_wherever_they_appear() {
        let d = error(json!({"type": "row", "sources": [10, 11], "columns": ["Task", "Hourz"]}));
        assert_eq!(
            d,
            json!({"path": "/columns/1", "column": "Hourz", "reason": "no readable source has this column"})
        );
        assert_eq!(
            error(row_with(json!({"column": "Nope", "op": "is_blank"})))["path"],
            "/filter/column"
        );
        assert_eq!(
            error(
                json!({"type": "row", "sources": [10], "columns": ["Task"], "sort": [{"column": "X"}]})
            )["path"],
            "/sort/0/column"
        );
        assert_eq!(
            error(json!({"type": "summary", "sources": [10], "groupBy": ["X"]}))["path"],
            "/groupBy/0"
        );
        assert_eq!(
            error(
                json!({"type": "summary", "sources": [10], "aggregates": [{"fn": "max", "column": "X"}]})
            )["path"],
            "/aggregates/0/column"
        );
    }

    #[test]
    fn with_no_readable_source_column_checks_are_skipped() {
        let def = parse(&json!({"type": "summary", "sources": [10], "groupBy": ["Anything"],
            "aggregates": [{"fn": "sum", "column": "Else"}]}))
        .unwrap();
        let p = compile(&def, &[]).unwrap();
        assert!(p.lookup.is_empty());
        assert_eq!(p.columns[0].ty, ColumnType::Text);
    }

    #[test]
    fn sum_and_avg_need_numbers() {
        let d = error(
            json!({"type": "summary", "sources": [10, 11], "aggregates": [{"fn": "avg", "column": "Task"}]}),
        );
        assert_eq!(d["fn"], "avg");
        assert_eq!(d["column"], "Task");
        assert_eq!(d["path"], "/aggregates/0/column");
        // Code is a number in sheet 10 but text in 11.
        assert_eq!(
            error(
                json!({"type": "summary", "sources": [10, 11], "aggregates": [{"fn": "sum", "column": "Code"}]})
            )["column"],
            "Code"
        );
        assert!(plan(json!({"type": "summary", "sources": [10, 11], "aggregates": [{"fn": "max", "column": "Code"}]})).is_ok());
    }

    fn test_of(filter: Value) -> Predicate {
        plan(row_with(filter)).unwrap().filter.unwrap()
    }

    fn operand(filter: Value) -> Value {
        match test_of(filter) {
            Predicate::Test { operand, .. } => operand,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn operands_are_coerced_as_cells_of_their_column() {
        assert_eq!(operand(json!({"column": "Hours", "op": "gt", "value": "2.5"})), json!(2.5));
        assert_eq!(
            operand(json!({"column": "Hours", "op": "in", "value": ["1", 2.0, "3e0"]})),
            json!([1, 2.0, 3.0])
        );
        assert_eq!(
            operand(json!({"column": "Billable", "op": "eq", "value": "true"})),
            json!(true)
        );
        assert_eq!(operand(json!({"column": "Task", "op": "eq", "value": 5})), json!("5"));
        assert_eq!(operand(json!({"column": "Tags", "op": "eq", "value": "a"})), json!(["a"]));
        assert_eq!(operand(json!({"column": "Tags", "op": "contains", "value": "b"})), json!("b"));
        assert_eq!(
            operand(json!({"column": "Status", "op": "in", "value": ["Done", "Blocked"]})),
            json!(["Done", "Blocked"]),
            "an option of any readable source having the column"
        );
        assert_eq!(
            operand(json!({"column": "Code", "op": "eq", "value": " 5"})),
            json!(" 5"),
            "types disagree: as written"
        );
        match test_of(json!({"column": "Seen", "op": "lt", "value": "2026-03-01T12:00:00.5+02:00"}))
        {
            Predicate::Test { operand, instants, .. } => {
                assert_eq!(operand, json!("2026-03-01T10:00:00.5Z"));
                assert!(instants, "datetimes compare as instants");
            }
            other => panic!("{other:?}"),
        }
        match test_of(json!({"column": "Task", "op": "contains", "value": "ÀB"})) {
            Predicate::Test { needle, instants, .. } => {
                assert_eq!(needle, "àb");
                assert!(!instants);
            }
            other => panic!("{other:?}"),
        }
        for (filter, op, reason) in [
            (json!({"column": "Hours", "op": "eq", "value": "abc"}), "eq", "expected a number"),
            (json!({"column": "Hours", "op": "gt", "value": " 2.5 "}), "gt", "expected a number"),
            (
                json!({"column": "Hours", "op": "in", "value": [1, "x"]}),
                "in",
                "item 1: expected a number",
            ),
            (
                json!({"column": "Hours", "op": "contains", "value": "1"}),
                "contains",
                "a number column",
            ),
            (json!({"column": "Billable", "op": "gt", "value": 1}), "gt", "a checkbox"),
            (
                json!({"column": "Billable", "op": "eq", "value": "yes"}),
                "eq",
                "expected a checkbox",
            ),
            (json!({"column": "Tags", "op": "lt", "value": "a"}), "lt", "a list"),
            (json!({"column": "Tags", "op": "eq", "value": ["a", "a"]}), "eq", "distinct"),
            (json!({"column": "Tags", "op": "contains", "value": "A"}), "contains", "options"),
            (json!({"column": "Status", "op": "eq", "value": "done"}), "eq", "options"),
            (json!({"column": "Status", "op": "in", "value": ["Open", "Gone"]}), "in", "item 1"),
            (json!({"column": "Seen", "op": "eq", "value": "2026-03-01T12:00:00"}), "eq", "offset"),
            (
                json!({"column": "Seen", "op": "gt", "value": "2026-02-30T00:00:00Z"}),
                "gt",
                "calendar",
            ),
        ] {
            let d = error(row_with(filter.clone()));
            assert_eq!(d["op"], op, "{filter}");
            assert_eq!(d["path"], "/filter/value");
            assert_eq!(d["value"], filter["value"]);
            let got = d["reason"].as_str().unwrap();
            assert!(got.contains(reason), "{filter}: {got}");
        }
    }
}
