//! Any saved definition, however wrong, gives a result or a clean error: never a panic.
//!
//! Definitions are saved without checks (fixtures, admin import) and only compiled when run, so
//! the runner must survive arbitrary JSON. The generator mixes well-shaped definitions over real
//! column names, operators and aggregates with wrong types, unknown names and free JSON.

use std::collections::BTreeMap;

use actors::model::{Column, ColumnType, Json, Row, SOURCE_IMPORT};
use actors::report::{evaluate, Caps, Source};
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
                }
                Err(e) => {
                    // Only the report codes: a bad definition is the author's problem, not a 500.
                    prop_assert!(matches!(e, actors::Error::Report { .. }), "{e:?}");
                }
            }
        }
    }
}
