//! Compiling a parsed [`Definition`] against the columns of its readable sources into a
//! [`Plan`]: which column id each named column is in each source, the output columns and their
//! types, and the filter with its operands normalized to the columns' types.
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
//! - Filter operands are normalized to the column's type when the readable sources agree on
//!   it: a numeric string becomes a number for a `number` column, `"true"`/`"false"` a boolean
//!   for a `checkbox`, a number or boolean a string for the text-like types. An operand that
//!   cannot match the type (`"abc"` against a number column, `contains` on a number column,
//!   ordering a checkbox or a list) is refused. When the sources disagree on the type the
//!   operand is used as written.
//! - Row reports may sort by any column of the sources; summary reports sort by their output
//!   columns (a `groupBy` column or an aggregate such as `sum(Hours)`).

use serde_json::{json, Value};

use super::compile_error;
use super::definition::{AggFn, Condition, Definition, Direction, Filter, Named, Op, ReportType};
use super::run::Source;
use crate::error::Result;
use crate::model::{Column, ColumnId, ColumnType};

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
        /// Index into [`Plan::fields`].
        field: usize,
        /// The operator.
        op: Op,
        /// The operand, normalized to the column's type.
        operand: Value,
        /// `contains`: the operand lower-cased (empty otherwise).
        needle: String,
    },
}

/// What to compute, per result shape. Field numbers index [`Plan::fields`].
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
pub struct Plan {
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

/// The column named `name` in a source (the first by position).
fn find<'s>(source: &'s Source, name: &str) -> Option<&'s Column> {
    source.columns.iter().find(|c| c.name == name)
}

/// Collects the fields a plan reads, checking each against the readable sources.
struct Fields<'s> {
    sources: &'s [Source],
    names: Vec<String>,
}

impl Fields<'_> {
    /// The field of a named column; refused when no readable source has it.
    fn field(&mut self, named: &Named) -> Result<usize> {
        if !self.sources.is_empty() && !self.sources.iter().any(|s| find(s, &named.name).is_some())
        {
            return Err(compile_error(
                format!("No readable source of the report has a column named `{}`.", named.name),
                json!({"path": named.path, "column": named.name,
                       "reason": "no readable source has this column"}),
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
        let mut types = self.sources.iter().filter_map(|s| find(s, name)).map(|c| c.ty);
        let first = types.next()?;
        types.all(|t| t == first).then_some(first)
    }

    /// The output type of a column (`text` when the sources disagree).
    fn output_type(&self, name: &str) -> ColumnType {
        self.agreed_type(name).unwrap_or(ColumnType::Text)
    }
}

/// Compile `def` against its readable sources (in definition order).
///
/// # Errors
///
/// `report_compile_failed` for an unknown column, `sum`/`avg` of a non-number column, an
/// operand the column's type cannot match, or a summary sort key that is not an output column.
pub fn compile(def: &Definition, sources: &[Source]) -> Result<Plan> {
    let mut fields = Fields { sources, names: Vec::new() };
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
    let lookup = sources
        .iter()
        .map(|s| fields.names.iter().map(|n| find(s, n).map(|c| c.id)).collect())
        .collect();
    Ok(Plan { mode, columns, fields: fields.names, lookup, filter, shape })
}

/// `sum`/`avg` need a number column in every readable source that has it.
fn check_number(sources: &[Source], func: AggFn, named: &Named) -> Result<()> {
    for s in sources {
        if let Some(c) = find(s, &named.name).filter(|c| c.ty != ColumnType::Number) {
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
            let operand = normalize(cond, fields.agreed_type(&cond.column.name))?;
            let needle = match (cond.op, &operand) {
                (Op::Contains, Value::String(s)) => s.to_lowercase(),
                _ => String::new(),
            };
            Predicate::Test { field, op: cond.op, operand, needle }
        }
    })
}

/// Normalize a leaf's operand to the column's type (module docs); refuse one that cannot match.
fn normalize(cond: &Condition, ty: Option<ColumnType>) -> Result<Value> {
    let refuse = |reason: String| {
        compile_error(
            format!(
                "The filter at {} cannot match column `{}`: {reason}.",
                cond.path, cond.column.name
            ),
            json!({"path": format!("{}/value", cond.path), "op": cond.op.as_str(),
                   "column": cond.column.name, "value": cond.value, "reason": reason}),
        )
    };
    let Some(ty) = ty else { return Ok(cond.value.clone()) };
    if matches!(cond.op, Op::IsBlank | Op::NotBlank) {
        return Ok(Value::Null);
    }
    // Apply `one` to the operand, or to each item of an `in` list.
    let each = |one: &dyn Fn(&Value) -> Option<Value>| -> Option<Value> {
        match (&cond.op, &cond.value) {
            (Op::In, Value::Array(items)) => {
                items.iter().map(one).collect::<Option<Vec<_>>>().map(Value::Array)
            }
            (_, v) => one(v),
        }
    };
    match ty {
        ColumnType::Number => {
            if cond.op == Op::Contains {
                return Err(refuse("`contains` applies to text and list columns".into()));
            }
            let as_number = |v: &Value| match v {
                Value::Number(_) => Some(v.clone()),
                Value::String(s) => s
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite())
                    .and_then(serde_json::Number::from_f64)
                    .map(Value::Number),
                _ => None,
            };
            each(&as_number)
                .ok_or_else(|| refuse("it is a number column; compare it with numbers".into()))
        }
        ColumnType::Checkbox => {
            if cond.op.is_ordering() || cond.op == Op::Contains {
                return Err(refuse(format!("`{}` does not apply to a checkbox", cond.op.as_str())));
            }
            let as_bool = |v: &Value| match v {
                Value::Bool(_) => Some(v.clone()),
                Value::String(s) if s == "true" => Some(Value::Bool(true)),
                Value::String(s) if s == "false" => Some(Value::Bool(false)),
                _ => None,
            };
            each(&as_bool)
                .ok_or_else(|| refuse("it is a checkbox; compare it with true or false".into()))
        }
        ColumnType::MultiSelect => {
            if cond.op.is_ordering() {
                return Err(refuse(format!("`{}` does not apply to a list", cond.op.as_str())));
            }
            Ok(cond.value.clone())
        }
        _ => {
            let as_text = |v: &Value| match v {
                Value::Number(n) => Some(Value::String(n.to_string())),
                Value::Bool(b) => Some(Value::String(b.to_string())),
                v => Some(v.clone()),
            };
            Ok(each(&as_text).unwrap_or_else(|| cond.value.clone()))
        }
    }
}

#[cfg(test)]
mod tests {
    use imbl::OrdMap;

    use super::*;
    use crate::error::Error;
    use crate::model::SheetId;
    use crate::report::definition::parse;
    use crate::report::ReportErrorKind;

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
                    options: None,
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

    fn plan(def: Value) -> Result<Plan> {
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

    fn operand(filter: Value) -> Value {
        match plan(row_with(filter)).unwrap().filter {
            Some(Predicate::Test { operand, .. }) => operand,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn operands_are_normalized_to_the_column_type() {
        assert_eq!(operand(json!({"column": "Hours", "op": "gt", "value": " 2.5 "})), json!(2.5));
        assert_eq!(
            operand(json!({"column": "Hours", "op": "in", "value": ["1", 2]})),
            json!([1.0, 2])
        );
        assert_eq!(
            operand(json!({"column": "Billable", "op": "eq", "value": "true"})),
            json!(true)
        );
        assert_eq!(operand(json!({"column": "Task", "op": "eq", "value": 5})), json!("5"));
        assert_eq!(
            operand(json!({"column": "Code", "op": "eq", "value": 5})),
            json!(5),
            "types disagree"
        );
        match plan(row_with(json!({"column": "Task", "op": "contains", "value": "ÀB"})))
            .unwrap()
            .filter
        {
            Some(Predicate::Test { needle, .. }) => assert_eq!(needle, "àb"),
            other => panic!("{other:?}"),
        }
        for (filter, op) in [
            (json!({"column": "Hours", "op": "eq", "value": "abc"}), "eq"),
            (json!({"column": "Hours", "op": "in", "value": [1, "x"]}), "in"),
            (json!({"column": "Hours", "op": "contains", "value": "1"}), "contains"),
            (json!({"column": "Billable", "op": "gt", "value": 1}), "gt"),
            (json!({"column": "Billable", "op": "eq", "value": "yes"}), "eq"),
            (json!({"column": "Tags", "op": "lt", "value": "a"}), "lt"),
        ] {
            let d = error(row_with(filter.clone()));
            assert_eq!(d["op"], op, "{filter}");
            assert_eq!(d["path"], "/filter/value");
        }
    }
}
