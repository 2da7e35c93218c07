//! Any saved definition, however wrong, gives a result or a clean error: never a panic; a
//! result is the same over columns kept for scanning as over the rows. And a filter operand
//! matches the cells holding its value, however either was spelled.
//!
//! Definitions are saved without checks (fixtures, admin import) and only compiled when run, so
//! the runner must survive arbitrary JSON. The generator mixes well-shaped definitions over real
//! column names, operators and aggregates with wrong types, unknown names and free JSON.

use std::collections::BTreeMap;

use actors::coerce::{coerce_cell, CellWrite};
use actors::model::{Column, ColumnType, Json, Row, SOURCE_IMPORT};
use actors::report::{compile, definition, evaluate, run_plan, Caps, ColumnCache, Source};
use proptest::prelude::*;
use serde_json::{json, Value};

fn sources() -> Vec<Source> {
    let types = [
        ColumnType::Text,
        ColumnType::Number,
        ColumnType::Checkbox,
        ColumnType::Date,
        ColumnType::Datetime,
        ColumnType::Contact,
        ColumnType::Dropdown,
        ColumnType::MultiSelect,
        ColumnType::Symbol,
    ];
    let names = ["Task", "Hours", "Done", "Due", "Seen", "Owner", "Status", "Tags", "Flag"];
    let values = [
        json!("a"),
        json!(3.5),
        json!(true),
        json!("2026-01-02"),
        json!("2026-01-02T03:04:05Z"),
        json!("x@y.z"),
        json!("Open"),
        json!(["a", "b"]),
        json!("Red"),
    ];
    (0..2u64)
        .map(|s| {
            let sheet_id = 10 + s;
            // The second sheet gives "Hours" another type, so output types must reconcile.
            let columns: Vec<Column> = (0..9)
                .map(|i| Column {
                    id: i as u64 + 1,
                    sheet_id,
                    name: names[i].into(),
                    ty: if s == 1 && i == 1 { ColumnType::Text } else { types[i] },
                    position: i as i64,
                    options: types[i]
                        .has_options()
                        .then(|| vec!["Open".into(), "Red".into(), "a".into(), "b".into()]),
                    primary: i == 0,
                })
                .collect();
            let rows = (0..6u64)
                .map(|r| {
                    let mut cells = BTreeMap::new();
                    for (i, v) in values.iter().enumerate() {
                        let v = match (r + i as u64) % 4 {
                            0 => continue,
                            1 => json!({"value": v, "format": "f"}),
                            2 => json!({"formula": "=A1", "value": v}),
                            _ => v.clone(),
                        };
                        cells.insert(i as u64 + 1, Json(v));
                    }
                    let id = sheet_id * 100 + r;
                    let row = Row::new(id, sheet_id, cells, SOURCE_IMPORT, 0);
                    (id, std::sync::Arc::new(row))
                })
                .collect();
            Source { sheet_id, columns: columns.into(), rows }
        })
        .collect()
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e12f64..1e12).prop_map(Value::from),
        "[a-zA-Z0-9 _()-]{0,12}".prop_map(Value::from),
        prop::sample::select(vec![
            "Task",
            "Hours",
            "Status",
            "Tags",
            "Due",
            "sum(Hours)",
            "count",
            "Open"
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn column() -> impl Strategy<Value = Value> {
    prop_oneof![
        8 => prop::sample::select(vec!["Task", "Hours", "Done", "Due", "Seen", "Owner", "Status", "Tags", "Flag", "Nope"])
            .prop_map(Value::from),
        1 => any_json(),
    ]
}

fn filter() -> impl Strategy<Value = Value> {
    let op = prop_oneof![
        6 => prop::sample::select(vec![
            "eq", "ne", "gt", "gte", "lt", "lte", "contains", "in", "is_blank", "not_blank", "like",
        ])
        .prop_map(Value::from),
        1 => any_json(),
    ];
    let value = prop_oneof![
        3 => prop::sample::select(vec![json!("Open"), json!(3), json!("a"), json!(true), json!("2026-01-02"), json!(["a", "Open"])]),
        1 => any_json(),
    ];
    let leaf =
        (column(), op, value).prop_map(|(c, o, v)| json!({"column": c, "op": o, "value": v}));
    prop_oneof![4 => leaf, 1 => Just(Value::Null), 1 => any_json()].prop_recursive(
        3,
        16,
        4,
        move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(|v| json!({"all": v})),
                prop::collection::vec(inner, 0..4).prop_map(|v| json!({"any": v})),
            ]
        },
    )
}

fn source_list() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => Just(json!([10, 11])),
        2 => Just(json!([11])),
        2 => Just(json!([10, 99])),
        1 => any_json()
    ]
}

fn aggregate() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            6 => prop::sample::select(vec!["count", "sum", "avg", "min", "max", "median"]).prop_map(Value::from),
            1 => any_json()
        ],
        prop::option::of(column()),
    )
        .prop_map(|(f, c)| match c {
            Some(c) => json!({"fn": f, "column": c}),
            None => json!({"fn": f}),
        })
}

fn sort_key() -> impl Strategy<Value = Value> {
    (column(), prop_oneof![3 => Just(json!("asc")), 3 => Just(json!("desc")), 1 => any_json()])
        .prop_map(|(c, d)| json!({"column": c, "direction": d}))
}

/// Adds the optional parts of a definition.
fn with_optional(mut d: Value, filter: Option<Value>, sort: Option<Vec<Value>>) -> Value {
    if let Some(f) = filter {
        d["filter"] = f;
    }
    if let Some(s) = sort {
        d["sort"] = Value::from(s);
    }
    d
}

fn definition() -> impl Strategy<Value = Value> {
    // Row reports take columns; summary reports take groupBy and aggregates.
    let row = (
        source_list(),
        prop::collection::vec(column(), 1..4),
        prop::option::of(filter()),
        prop::option::of(prop::collection::vec(sort_key(), 0..3)),
    )
        .prop_map(|(sources, columns, filter, sort)| {
            with_optional(
                json!({"type": "row", "sources": sources, "columns": columns}),
                filter,
                sort,
            )
        });
    let summary = (
        source_list(),
        prop::collection::vec(column(), 0..3),
        prop::collection::vec(aggregate(), 1..4),
        prop::option::of(filter()),
        prop::option::of(prop::collection::vec(sort_key(), 0..2)),
    )
        .prop_map(|(sources, group_by, aggregates, filter, sort)| {
            let d = json!({"type": "summary", "sources": sources, "groupBy": group_by, "aggregates": aggregates});
            with_optional(d, filter, sort)
        });
    // Now and then a wrong type or an unknown field, or free JSON.
    let odd = (prop_oneof![Just(json!("row")), Just(json!("summary")), any_json()], any_json())
        .prop_map(
            |(k, extra)| json!({"type": k, "sources": [10], "columns": ["Task"], "x": extra}),
        );
    prop_oneof![4 => row, 4 => summary, 1 => odd, 1 => any_json()]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_definition_runs_or_fails_cleanly(def in definition()) {
        let all = sources();
        // The runner gets the readable sources in definition order; try both sheets and one.
        for readable in [&all[..], &all[1..]] {
            match evaluate(&def, readable, Caps::default()) {
                Ok(result) => {
                    let page = result.page(0, 5);
                    prop_assert!(page.len() <= 5);
                    let rest = result.page(3, usize::MAX);
                    prop_assert_eq!(rest.len(), result.len().saturating_sub(3));
                    // The same run over kept columns (wrapped cells, mixed kinds, sheets that
                    // disagree on a column's type) shows the same result.
                    let plan = compile::compile(&definition::parse(&def).unwrap(), readable).unwrap();
                    let kept = run_plan(&plan, readable, &ColumnCache::new(1 << 30));
                    prop_assert_eq!(&kept.columns, &result.columns);
                    prop_assert_eq!(kept.total_matched, result.total_matched);
                    prop_assert_eq!(kept.page(0, usize::MAX), result.page(0, usize::MAX));
                }
                Err(e) => {
                    // Only the report codes: a bad definition is the author's problem, not a 500.
                    prop_assert!(matches!(e, actors::Error::Report { .. }), "{e:?}");
                }
            }
        }
    }
}

/// A value a cell of one column can hold, and the accepted spellings of it.
#[derive(Clone, Debug)]
struct Spelled {
    ty: ColumnType,
    /// Every entry denotes the same value of a cell of `ty`.
    spellings: Vec<Value>,
}

fn spelled_text() -> impl Strategy<Value = Spelled> {
    let text = "[a-zA-Zé0-9 ]{0,8}[a-zA-Z]".prop_map(|s| vec![json!(s)]);
    let number = any::<i32>().prop_map(|n| vec![json!(n.to_string()), json!(n)]);
    let boolean = any::<bool>().prop_map(|b| vec![json!(b.to_string()), json!(b)]);
    prop_oneof![text, number, boolean]
        .prop_map(|spellings| Spelled { ty: ColumnType::Text, spellings })
}

fn spelled_number() -> impl Strategy<Value = Spelled> {
    // Integers exact in an f64, spelled as integers, floats, decimals and exponents.
    let integer = (-(1i64 << 52)..(1i64 << 52)).prop_map(|n| {
        vec![
            json!(n),
            json!(n as f64),
            json!(n.to_string()),
            json!(format!("{n}.0")),
            json!(format!("{n}e0")),
            json!(format!("{n}.00E+0")),
        ]
    });
    // Decimals m / 10^k: the same decimal spelled several ways parses to the same f64.
    let decimal = (-1_000_000_000i64..1_000_000_000, 1u32..7).prop_map(|(m, k)| {
        let digits = format!("{:0>width$}", m.unsigned_abs(), width = k as usize + 1);
        let (int, frac) = digits.split_at(digits.len() - k as usize);
        let sign = if m < 0 { "-" } else { "" };
        let text = format!("{sign}{int}.{frac}");
        let x: f64 = text.parse().unwrap();
        vec![json!(text), json!(format!("{text}00")), json!(format!("{m}e-{k}")), json!(x)]
    });
    prop_oneof![integer, decimal]
        .prop_map(|spellings| Spelled { ty: ColumnType::Number, spellings })
}

fn spelled_checkbox() -> impl Strategy<Value = Spelled> {
    any::<bool>().prop_map(|b| Spelled {
        ty: ColumnType::Checkbox,
        spellings: vec![json!(b), json!(b.to_string())],
    })
}

fn date() -> impl Strategy<Value = chrono::NaiveDate> {
    (1000i32..=8999, 1u32..=12, 1u32..=31)
        .prop_filter_map("a real date", |(y, m, d)| chrono::NaiveDate::from_ymd_opt(y, m, d))
}

fn spelled_date() -> impl Strategy<Value = Spelled> {
    date().prop_map(|d| Spelled {
        ty: ColumnType::Date,
        spellings: vec![json!(d.format("%Y-%m-%d").to_string())],
    })
}

/// One instant in UTC, spelled with several offsets, separators and trailing fraction zeros.
fn spelled_datetime() -> impl Strategy<Value = Spelled> {
    let offset = prop_oneof![Just(0i64), -(23 * 60 + 59)..=(23 * 60 + 59i64)];
    let spelling = (offset, 0usize..4, 0usize..4);
    (date(), 0u32..86_400, "([0-9]{1,5})?", prop::collection::vec(spelling, 2..5)).prop_map(
        |(day, seconds, fraction, spellings)| {
            let utc =
                day.and_hms_opt(0, 0, 0).unwrap() + chrono::TimeDelta::seconds(seconds.into());
            let spellings = spellings
                .into_iter()
                .map(|(offset, zeros, style)| {
                    let local = utc + chrono::TimeDelta::minutes(offset);
                    let digits = format!("{fraction}{}", "0".repeat(zeros));
                    let dot = if digits.is_empty() { String::new() } else { format!(".{digits}") };
                    let zone = match (offset, style) {
                        (0, 0) => "Z".to_owned(),
                        (0, 1) => "z".to_owned(),
                        (0, 2) => "-00:00".to_owned(),
                        _ => format!(
                            "{}{:02}:{:02}",
                            if offset < 0 { '-' } else { '+' },
                            offset.abs() / 60,
                            offset.abs() % 60
                        ),
                    };
                    let t = if style == 3 { 't' } else { 'T' };
                    json!(format!(
                        "{}{t}{}{dot}{zone}",
                        local.format("%Y-%m-%d"),
                        local.format("%H:%M:%S")
                    ))
                })
                .collect();
            Spelled { ty: ColumnType::Datetime, spellings }
        },
    )
}

fn spelled_contact() -> impl Strategy<Value = Spelled> {
    "[a-z0-9.+]{1,6}@[a-z0-9]{1,6}(\\.[a-z]{2,3})?"
        .prop_map(|c| Spelled { ty: ColumnType::Contact, spellings: vec![json!(c)] })
}

const OPTIONS: [&str; 5] = ["Open", "Done", "Zürich", "1", "a b"];

fn spelled_option() -> impl Strategy<Value = Spelled> {
    (
        prop::sample::select(vec![ColumnType::Dropdown, ColumnType::Symbol]),
        prop::sample::select(&OPTIONS[..]),
    )
        .prop_map(|(ty, o)| Spelled { ty, spellings: vec![json!(o)] })
}

/// A set of options as lists in any order (and a lone option as a string).
fn spelled_multi_select() -> impl Strategy<Value = Spelled> {
    prop::sample::subsequence(&OPTIONS[..], 1..=OPTIONS.len())
        .prop_flat_map(|set| {
            let shuffled = Just(set.clone()).prop_shuffle();
            (Just(set), shuffled)
        })
        .prop_map(|(set, shuffled)| {
            let mut spellings = vec![json!(set), json!(shuffled)];
            if set.len() == 1 {
                spellings.push(json!(set[0]));
            }
            Spelled { ty: ColumnType::MultiSelect, spellings }
        })
}

fn spelled() -> impl Strategy<Value = Spelled> {
    prop_oneof![
        spelled_text(),
        spelled_number(),
        spelled_checkbox(),
        spelled_date(),
        spelled_datetime(),
        spelled_contact(),
        spelled_option(),
        spelled_multi_select(),
    ]
}

/// One sheet with one column of `ty` and one row holding `cell`.
fn one_cell(ty: ColumnType, cell: Value) -> Source {
    let column = Column {
        id: 1,
        sheet_id: 1,
        name: "C".into(),
        ty,
        position: 0,
        options: ty.has_options().then(|| OPTIONS.iter().map(|o| (*o).to_owned()).collect()),
        primary: true,
    };
    let row = Row::new(100, 1, BTreeMap::from([(1, Json(cell))]), SOURCE_IMPORT, 0);
    Source {
        sheet_id: 1,
        columns: vec![column].into(),
        rows: [(100u64, std::sync::Arc::new(row))].into_iter().collect(),
    }
}

/// How many rows a filter `C <op> <value>` matches.
fn matches(source: &Source, op: &str, value: &Value) -> Result<u64, TestCaseError> {
    let def = json!({"type": "row", "sources": [1], "columns": ["C"],
                     "filter": {"column": "C", "op": op, "value": value}});
    evaluate(&def, std::slice::from_ref(source), Caps::default())
        .map(|r| r.total_matched)
        .map_err(|e| TestCaseError::fail(format!("{op} {value}: {e:?}")))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    /// A filter operand is coerced as a cell of its column and compared by value: any accepted
    /// spelling of a stored cell's value is `eq` to it (and not `ne`), whichever spelling the
    /// cell was written with and whether it sits in a wrapper.
    #[test]
    fn an_operand_equal_to_a_cell_in_any_spelling_matches_it(
        value in spelled(),
        written in any::<prop::sample::Index>(),
        wrapper in 0u8..3,
    ) {
        let column = one_cell(value.ty, Value::Null).columns[0].clone();
        let raw = written.get(&value.spellings);
        let stored = match coerce_cell(&column, raw) {
            Ok(CellWrite::Set(v)) => v,
            other => return Err(TestCaseError::fail(format!("{raw} refused: {other:?}"))),
        };
        let cell = match wrapper {
            0 => stored,
            1 => json!({"value": stored, "format": "0.00"}),
            _ => json!({"formula": "=A1", "value": stored}),
        };
        let source = one_cell(value.ty, cell.clone());
        for operand in &value.spellings {
            prop_assert_eq!(matches(&source, "eq", operand)?, 1, "{} eq {}", cell, operand);
            prop_assert_eq!(matches(&source, "ne", operand)?, 0, "{} ne {}", cell, operand);
            // `in` lists scalars (definition rules).
            if !operand.is_array() {
                prop_assert_eq!(matches(&source, "in", &json!([operand]))?, 1, "{} in [{}]", cell, operand);
            }
            if !matches!(value.ty, ColumnType::Checkbox | ColumnType::MultiSelect) && !operand.is_boolean() {
                for (op, expected) in [("gte", 1), ("lte", 1), ("gt", 0), ("lt", 0)] {
                    prop_assert_eq!(matches(&source, op, operand)?, expected, "{} {} {}", cell, op, operand);
                }
            }
        }
    }
}
