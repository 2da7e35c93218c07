//! `POST /reports/{report_id}/run`: flat and aggregated results checked value by value against
//! the fixture, every filter operator, sorting, paging with cursors, per-source access, and the
//! 402 / 422 / 413 envelopes in the contract's order.

use serde_json::{json, Value};

use crate::common::*;

/// An account-wide read key of ada (user 1): her live access is the only limit.
const ADA_ALL: &str = "svc_live_AdaAccountReadKey000000000000000000005";

/// Import objects through the admin side; panics unless accepted.
async fn import(s: &TestServer, fixture: Value) {
    let (status, body, _) = s.admin_call("POST", "/import", Some(&fixture)).await;
    assert_eq!(status, 200, "import refused: {body}");
}

/// A report owned by ada in project 1.
fn report(id: u64, definition: Value) -> Value {
    json!({"id": id, "projectId": 1, "ownerId": 1, "name": format!("r{id}"), "definition": definition})
}

async fn run(s: &TestServer, id: u64, key: &str) -> Reply {
    s.call("POST", &format!("/reports/{id}/run"), Some(key), None).await
}

/// Run and expect 200; returns the `data` object.
async fn data(s: &TestServer, id: u64, key: &str) -> Value {
    let (status, body, _) = run(s, id, key).await;
    assert_eq!(status, 200, "report {id}: {body}");
    body["data"].clone()
}

/// The values of output column `col` of every row of a page.
fn column(data: &Value, col: &str) -> Vec<Value> {
    data["rows"].as_array().unwrap().iter().map(|r| r["cells"][col].clone()).collect()
}

fn keys_of(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

#[actix_rt::test]
async fn row_report_runs_flat_value_by_value() {
    let s = TestServer::start().await;
    let (status, body, headers) = run(&s, 7, ADA_READ).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(keys_of(&body), ["data", "nextCursor", "requestId"]);
    assert_eq!(headers.get("x-request-id").unwrap().to_str().unwrap(), body["requestId"]);
    // Sheet 10: root (Done, 5), child (Open, 2), grandchild (no status, 1), other (Done, 8);
    // sheet 11: stock (Done, 3). Status = Done, by Hours descending.
    assert_eq!(
        without_request_id(body),
        json!({
            "data": {
                "reportId": 7,
                "reportName": "Done",
                "mode": "flat",
                "columns": [
                    {"id": 1, "name": "Task", "type": "text"},
                    {"id": 2, "name": "Status", "type": "dropdown"},
                    {"id": 3, "name": "Hours", "type": "number"}
                ],
                "rows": [
                    {"cells": {"1": "other", "2": "Done", "3": 8}},
                    {"cells": {"1": "root", "2": "Done", "3": 5}},
                    {"cells": {"1": "stock", "2": "Done", "3": 3}}
                ],
                "scannedRows": 5,
                "totalMatched": 3,
                "sourcesOmittedForAccess": 0
            },
            "nextCursor": null
        })
    );
}

#[actix_rt::test]
async fn summary_report_runs_aggregated_value_by_value() {
    let s = TestServer::start().await;
    let (status, body, _) = run(&s, 8, ADA_WRITE).await;
    assert_eq!(status, 200, "{body}");
    // Done: root 5 + other 8 + stock 3; Open: child 2; blank status: grandchild 1.
    assert_eq!(
        without_request_id(body),
        json!({
            "data": {
                "reportId": 8,
                "reportName": "By status",
                "mode": "aggregated",
                "columns": [
                    {"id": 1, "name": "Status", "type": "dropdown"},
                    {"id": 2, "name": "count", "type": "number"},
                    {"id": 3, "name": "sum(Hours)", "type": "number"}
                ],
                "rows": [
                    {"cells": {"1": "Done", "2": 3, "3": 16}},
                    {"cells": {"1": "Open", "2": 1, "3": 2}},
                    {"cells": {"1": null, "2": 1, "3": 1}}
                ],
                "scannedRows": 5,
                "totalMatched": 3,
                "sourcesOmittedForAccess": 0
            },
            "nextCursor": null
        })
    );

    // Every aggregate, a multi-column type clash and a summary sort by an aggregate.
    import(
        &s,
        json!({"reports": [report(40, json!({"type": "summary", "sources": [10, 11],
            "groupBy": ["Status"],
            "aggregates": [{"fn": "count"}, {"fn": "avg", "column": "Hours"}, {"fn": "min", "column": "Hours"},
                           {"fn": "max", "column": "Task"}, {"fn": "count", "column": "Due"}],
            "sort": [{"column": "min(Hours)", "direction": "desc"}]}))]}),
    )
    .await;
    let d = data(&s, 40, ADA_READ).await;
    let types: Vec<&str> =
        d["columns"].as_array().unwrap().iter().map(|c| c["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["dropdown", "number", "number", "number", "text", "number"]);
    assert_eq!(d["columns"][4]["name"], "max(Task)");
    // min(Hours) desc: Done 3, Open 2, blank 1.
    assert_eq!(
        d["rows"],
        json!([
            {"cells": {"1": "Done", "2": 3, "3": 16.0 / 3.0, "4": 3, "5": "stock", "6": 1}},
            {"cells": {"1": "Open", "2": 1, "3": 2, "4": 2, "5": "child", "6": 0}},
            {"cells": {"1": null, "2": 1, "3": 1, "4": 1, "5": "grandchild", "6": 0}}
        ])
    );
}

#[actix_rt::test]
async fn filters_of_every_operator() {
    let s = TestServer::start().await;
    let cases: Vec<(Value, Vec<&str>)> = vec![
        (json!({"column": "Status", "op": "eq", "value": "Done"}), vec!["root", "other", "stock"]),
        (json!({"column": "Status", "op": "ne", "value": "Done"}), vec!["child", "grandchild"]),
        (json!({"column": "Hours", "op": "gt", "value": 3}), vec!["root", "other"]),
        (json!({"column": "Hours", "op": "gte", "value": 3}), vec!["root", "other", "stock"]),
        (json!({"column": "Hours", "op": "lt", "value": 2}), vec!["grandchild"]),
        (json!({"column": "Hours", "op": "lte", "value": "2"}), vec!["child", "grandchild"]),
        (
            json!({"column": "Task", "op": "contains", "value": "CHILD"}),
            vec!["child", "grandchild"],
        ),
        (json!({"column": "Tags", "op": "contains", "value": "c"}), vec!["other"]),
        (json!({"column": "Owner", "op": "contains", "value": "Y.Z"}), vec!["other"]),
        (json!({"column": "Status", "op": "in", "value": ["Open"]}), vec!["child"]),
        (json!({"column": "Hours", "op": "eq", "value": "5.0"}), vec!["root"]),
        (json!({"column": "Hours", "op": "in", "value": [1, 8]}), vec!["grandchild", "other"]),
        (json!({"column": "Status", "op": "is_blank"}), vec!["grandchild"]),
        (json!({"column": "Due", "op": "not_blank"}), vec!["other"]),
        (json!({"column": "Due", "op": "lt", "value": "2026-02-01"}), vec!["other"]),
        // Datetimes are stored in UTC: 2026-01-31T23:00-02:00 is 2026-02-01T01:00Z.
        (json!({"column": "Seen", "op": "gte", "value": "2026-02-01T00:00:00Z"}), vec!["other"]),
        (json!({"column": "Billable", "op": "eq", "value": true}), vec!["other"]),
        (json!({"column": "Billable", "op": "eq", "value": "true"}), vec!["other"]),
        (json!({"column": "Flag", "op": "eq", "value": "Red"}), vec!["other"]),
        (
            json!({"any": [{"column": "Hours", "op": "gt", "value": 6},
                           {"all": [{"column": "Status", "op": "eq", "value": "Open"},
                                    {"column": "Hours", "op": "lt", "value": 5}]}]}),
            vec!["child", "other"],
        ),
        (json!({"all": []}), vec!["root", "child", "grandchild", "other", "stock"]),
        (json!({"any": []}), vec![]),
    ];
    let reports: Vec<Value> = cases
        .iter()
        .enumerate()
        .map(|(i, (filter, _))| {
            report(
                100 + i as u64,
                json!({"type": "row", "sources": [10, 11], "columns": ["Task"], "filter": filter}),
            )
        })
        .collect();
    import(&s, json!({"reports": reports})).await;
    for (i, (filter, expected)) in cases.iter().enumerate() {
        let d = data(&s, 100 + i as u64, ADA_READ).await;
        let got = column(&d, "1");
        assert_eq!(got, expected.iter().map(|t| json!(t)).collect::<Vec<_>>(), "filter {filter}");
        assert_eq!(d["totalMatched"], expected.len(), "filter {filter}");
        assert_eq!(d["scannedRows"], 5);
    }
}

#[actix_rt::test]
async fn datetime_operands_compare_as_instants_whatever_their_offset() {
    // Saved reports come with the fixture; rows are written through the API.
    let tests = [
        ("eq", "2026-03-01T12:00:00+02:00"),
        ("ne", "2026-03-01T12:00:00+02:00"),
        ("gt", "2026-03-01T11:30:00+02:00"),
        ("lt", "2026-03-01T11:00:00.5+01:00"),
        ("gte", "2026-03-01T05:00:00.5-05:00"),
        ("in", "2026-03-01T10:00:00+00:00"),
    ];
    let mut fx = fixture();
    for (i, (op, value)) in tests.iter().enumerate() {
        let value = if *op == "in" { json!([value]) } else { json!(value) };
        fx["reports"].as_array_mut().unwrap().push(report(
            60 + i as u64,
            json!({"type": "row", "sources": [10], "columns": ["Task", "Seen"],
                   "filter": {"column": "Seen", "op": op, "value": value}}),
        ));
    }
    let s = TestServer::start_with(fx, |_| {}).await;
    let (status, added, _) = s
        .post(
            "/sheets/10/rows:bulkAdd",
            ADA_WRITE,
            &json!({"rows": [
                {"cells": {"100": "utc", "105": "2026-03-01T10:00:00Z"}},
                {"cells": {"100": "new york", "105": "2026-03-01T05:00:00-05:00"}},
                {"cells": {"100": "millis", "105": "2026-03-01T10:00:00.000Z"}},
                {"cells": {"100": "half", "105": "2026-03-01T10:00:00.5Z"}}
            ]}),
        )
        .await;
    assert_eq!((status, &added["succeededCount"]), (200, &json!(4)), "{added}");
    let stored: Vec<Value> = added["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["row"]["cells"]["105"].clone())
        .collect();
    assert_eq!(
        stored,
        [
            json!("2026-03-01T10:00:00Z"),
            json!("2026-03-01T10:00:00Z"),
            json!("2026-03-01T10:00:00.000Z"),
            json!("2026-03-01T10:00:00.5Z")
        ]
    );
    // Row 1003 holds 2026-02-01T01:00:00Z; rows 1000 to 1002 have no Seen.
    let expected: [&[&str]; 6] = [
        &["utc", "new york", "millis"],
        &["root", "child", "grandchild", "other", "half"],
        &["utc", "new york", "millis", "half"],
        &["other", "utc", "new york", "millis"],
        &["half"],
        &["utc", "new york", "millis"],
    ];
    for (i, ((op, value), expected)) in tests.iter().zip(expected).enumerate() {
        let d = data(&s, 60 + i as u64, ADA_READ).await;
        let tasks: Vec<Value> = expected.iter().map(|t| json!(t)).collect();
        assert_eq!(column(&d, "1"), tasks, "Seen {op} {value}");
        assert_eq!(d["totalMatched"], expected.len(), "Seen {op} {value}");
    }
}

#[actix_rt::test]
async fn sort_keys_then_source_order_then_row_id_with_blanks_last() {
    let s = TestServer::start().await;
    import(
        &s,
        json!({"reports": [
            report(50, json!({"type": "row", "sources": [11, 10], "columns": ["Task", "Hours"],
                "sort": [{"column": "Status", "direction": "desc"}]})),
            report(51, json!({"type": "row", "sources": [11, 10], "columns": ["Task"],
                "sort": [{"column": "Status"}, {"column": "Hours"}]})),
            report(52, json!({"type": "row", "sources": [11, 10], "columns": ["Task"]}))
        ]}),
    )
    .await;
    // Open, then Done (sheet 11 before sheet 10, then by row id), blank last.
    let d = data(&s, 50, ADA_READ).await;
    assert_eq!(
        column(&d, "1"),
        [json!("child"), json!("stock"), json!("root"), json!("other"), json!("grandchild")]
    );
    assert_eq!(column(&d, "2"), [json!(2), json!(3), json!(5), json!(8), json!(1)]);
    let d = data(&s, 51, ADA_READ).await;
    assert_eq!(
        column(&d, "1"),
        [json!("stock"), json!("root"), json!("other"), json!("child"), json!("grandchild")]
    );
    let d = data(&s, 52, ADA_READ).await;
    assert_eq!(
        column(&d, "1"),
        [json!("stock"), json!("root"), json!("child"), json!("grandchild"), json!("other")]
    );
}

#[actix_rt::test]
async fn pages_follow_cursors_without_skips_or_repeats() {
    let s = TestServer::start().await;
    // 600 rows in sheet 30 with many ties on N, and sheet 10 (no N: blank, sorted last).
    let rows: Vec<Value> = (0..600)
        .map(|i| json!({"id": 30_000 + i, "sheetId": 30, "cells": {"300": format!("r{i:03}"), "301": i % 7}}))
        .collect();
    import(
        &s,
        json!({
            "sheets": [{"id": 30, "projectId": 1, "name": "Many"}],
            "columns": [{"id": 300, "sheetId": 30, "name": "Id", "type": "text", "position": 0},
                        {"id": 301, "sheetId": 30, "name": "N", "type": "number", "position": 1}],
            "rows": rows,
            "reports": [report(60, json!({"type": "row", "sources": [30, 10], "columns": ["Id", "N", "Task"],
                "sort": [{"column": "N", "direction": "desc"}]}))]
        }),
    )
    .await;
    let mut expected: Vec<Value> = (0..7)
        .rev()
        .flat_map(|n| {
            (0..600).filter(move |i| i % 7 == n).map(move |i| json!([format!("r{i:03}"), n, null]))
        })
        .collect();
    for task in ["root", "child", "grandchild", "other"] {
        expected.push(json!([null, null, task]));
    }
    let collect = |d: &Value| -> Vec<Value> {
        d["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| json!([r["cells"]["1"], r["cells"]["2"], r["cells"]["3"]]))
            .collect()
    };
    // Small pages.
    let (mut seen, mut cursor, mut pages) = (Vec::new(), None::<String>, 0);
    loop {
        let path = match &cursor {
            Some(c) => format!("/reports/60/run?limit=37&cursor={c}"),
            None => "/reports/60/run?limit=37".to_owned(),
        };
        let (status, body, _) = s.call("POST", &path, Some(ADA_READ), None).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            (body["data"]["totalMatched"].as_u64(), body["data"]["scannedRows"].as_u64()),
            (Some(604), Some(604))
        );
        let page = collect(&body["data"]);
        assert!(page.len() == 37 || body["nextCursor"].is_null(), "only the last page is short");
        seen.extend(page);
        pages += 1;
        match body["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 17);
    assert_eq!(seen, expected, "every row once, in the total order");
    // A limit above 500 is clamped to 500.
    let (status, big, _) = s.call("POST", "/reports/60/run?limit=1000", Some(ADA_READ), None).await;
    assert_eq!(status, 200);
    assert_eq!(big["data"]["rows"].as_array().unwrap().len(), 500);
    let c = big["nextCursor"].as_str().unwrap();
    let (_, rest, _) = s
        .call("POST", &format!("/reports/60/run?limit=500&cursor={c}"), Some(ADA_READ), None)
        .await;
    assert_eq!(rest["data"]["rows"].as_array().unwrap().len(), 104);
    assert_eq!(rest["nextCursor"], Value::Null);
    let mut both = collect(&big["data"]);
    both.extend(collect(&rest["data"]));
    assert_eq!(both, expected);

    // Aggregated results page the same way.
    let (_, p1, _) = s.call("POST", "/reports/8/run?limit=2", Some(ADA_READ), None).await;
    assert_eq!(column(&p1["data"], "1"), [json!("Done"), json!("Open")]);
    let c8 = p1["nextCursor"].as_str().unwrap().to_owned();
    let (_, p2, _) =
        s.call("POST", &format!("/reports/8/run?limit=2&cursor={c8}"), Some(ADA_READ), None).await;
    assert_eq!(column(&p2["data"], "1"), [Value::Null]);
    assert_eq!((p2["data"]["totalMatched"].as_u64(), &p2["nextCursor"]), (Some(3), &Value::Null));

    // A cursor is bound to its report (and its endpoint).
    for path in [
        format!("/reports/7/run?cursor={c8}"),
        format!("/reports/60/run?cursor={c8}"),
        "/reports/8/run?cursor=garbage".to_owned(),
    ] {
        let r = s.call("POST", &path, Some(ADA_READ), None).await;
        assert_error(&r, 422, "validation_failed");
        assert_eq!(r.1["detail"][0]["loc"], json!(["query", "cursor"]), "{path}");
    }
    let r = s.get(&format!("/reports?cursor={c8}"), ADA_READ).await;
    assert_error(&r, 422, "validation_failed");
    let r = s.call("POST", "/reports/8/run?limit=0", Some(ADA_READ), None).await;
    assert_error(&r, 422, "validation_failed");
    assert_eq!(r.1["detail"][0]["loc"], json!(["query", "limit"]));
}

#[actix_rt::test]
async fn writes_between_pages_are_seen_by_the_next_run() {
    let s = TestServer::start().await;
    assert_eq!(data(&s, 7, ADA_WRITE).await["totalMatched"], 3);
    let (status, _, _) = s.call("DELETE", "/sheets/10/rows/1003", Some(ADA_WRITE), None).await;
    assert_eq!(status, 204);
    let d = data(&s, 7, ADA_WRITE).await;
    assert_eq!((d["totalMatched"].as_u64(), d["scannedRows"].as_u64()), (Some(2), Some(4)));
    assert_eq!(column(&d, "1"), [json!("root"), json!("stock")]);
}

#[actix_rt::test]
async fn unreadable_and_missing_sources_are_only_counted() {
    let s = TestServer::start().await;
    // Sheet 21 is bob's (project 2) and types Hours as text; sheet 99 does not exist.
    import(
        &s,
        json!({
            "sheets": [{"id": 21, "projectId": 2, "name": "Bob's hours"}],
            "columns": [{"id": 210, "sheetId": 21, "name": "Task", "type": "text", "position": 0},
                        {"id": 211, "sheetId": 21, "name": "Hours", "type": "text", "position": 1},
                        {"id": 212, "sheetId": 21, "name": "Secret", "type": "text", "position": 2}],
            "rows": [{"id": 2100, "sheetId": 21, "cells": {"210": "hidden", "211": "lots", "212": "s"}}],
            "keys": [{"id": 5, "ownerId": 1, "name": "ada-all", "secret": ADA_ALL,
                      "grants": [{"verb": "read", "scopeType": "account", "scopeId": null}]}],
            "reports": [
                report(70, json!({"type": "row", "sources": [10, 21, 99], "columns": ["Task", "Hours"],
                    "filter": {"column": "Hours", "op": "not_blank"}})),
                report(71, json!({"type": "row", "sources": [21, 11], "columns": ["Secret"]}))
            ]
        }),
    )
    .await;
    let flat_ten = json!({
        "reportId": 70, "reportName": "r70", "mode": "flat",
        "columns": [{"id": 1, "name": "Task", "type": "text"}, {"id": 2, "name": "Hours", "type": "number"}],
        "rows": [{"cells": {"1": "root", "2": 5}}, {"cells": {"1": "child", "2": 2}},
                 {"cells": {"1": "grandchild", "2": 1}}, {"cells": {"1": "other", "2": 8}}],
        "scannedRows": 4, "totalMatched": 4, "sourcesOmittedForAccess": 2
    });
    // Ada holds no role on sheet 21 (owner's access), and ADA_READ is scoped to project 1.
    assert_eq!(data(&s, 70, ADA_ALL).await, flat_ten);
    assert_eq!(data(&s, 70, ADA_READ).await, flat_ten);
    // A column only an unreadable source has is unknown: nothing of that source is consulted.
    let r = run(&s, 71, ADA_ALL).await;
    assert_error(&r, 422, "report_compile_failed");
    assert_eq!(
        r.1["detail"],
        json!({"path": "/columns/0", "column": "Secret", "reason": "no readable source has this column"})
    );

    // Shared with ada: the account key now reads sheet 21 (its rows, its column type).
    let share =
        |role: &str| json!({"userId": 1, "scopeType": "sheet", "scopeId": 21, "role": role});
    let (status, body, _) = s.admin_call("PUT", "/shares", Some(&share("viewer"))).await;
    assert_eq!(status, 200, "{body}");
    let d = data(&s, 70, ADA_ALL).await;
    assert_eq!(d["sourcesOmittedForAccess"], 1);
    assert_eq!(
        d["columns"][1],
        json!({"id": 2, "name": "Hours", "type": "text"}),
        "types disagree"
    );
    assert_eq!(column(&d, "1").last(), Some(&json!("hidden")));
    assert_eq!((d["scannedRows"].as_u64(), d["totalMatched"].as_u64()), (Some(5), Some(5)));
    // ... but not ADA_READ: its scope is project 1.
    assert_eq!(data(&s, 70, ADA_READ).await, flat_ten);
    assert_eq!(column(&data(&s, 71, ADA_ALL).await, "1"), [json!("s"), Value::Null]);

    // Unshared again between runs: back to the first answer.
    let (status, _, _) = s.admin_call("PUT", "/shares", Some(&share("none"))).await;
    assert_eq!(status, 200);
    assert_eq!(data(&s, 70, ADA_ALL).await, flat_ten);
    assert_error(&run(&s, 71, ADA_ALL).await, 422, "report_compile_failed");

    // The sheet-scoped key cannot reach project 1, so not its reports either: 404 as if missing.
    let hidden = run(&s, 7, ADA_SHEET11).await;
    let missing = run(&s, 12345, ADA_SHEET11).await;
    assert_error(&hidden, 404, "not_found");
    assert_error(&missing, 404, "not_found");
    assert_eq!(
        hidden.1["message"].as_str().unwrap().replace("7", "N"),
        missing.1["message"].as_str().unwrap().replace("12345", "N")
    );
}

#[actix_rt::test]
async fn owner_not_on_paid_plan_is_402_after_404_and_before_422() {
    let s = TestServer::start().await;
    import(
        &s,
        json!({"reports": [
            {"id": 90, "projectId": 2, "ownerId": 2, "name": "Bob's bad", "definition": {"type": "nope"}}
        ]}),
    )
    .await;
    // Report 9 is bob's (free); 90 too, with a definition that would not compile.
    for id in [9, 90] {
        let r = run(&s, id, BOB_ALL).await;
        assert_error(&r, 402, "payment_required");
        assert_eq!(r.1["detail"], Value::Null);
    }
    // Out of reach comes first.
    assert_error(&run(&s, 9, ADA_READ).await, 404, "not_found");
    // Once bob pays, report 9 runs and 90 fails to compile.
    let (status, body, _) =
        s.admin_call("PUT", "/users/2/plan", Some(&json!({"plan": "paid"}))).await;
    assert_eq!(status, 200, "{body}");
    let d = data(&s, 9, BOB_ALL).await;
    assert_eq!(d["rows"], json!([{"cells": {"1": "launch"}}]));
    assert_eq!(d["columns"], json!([{"id": 1, "name": "Name", "type": "text"}]));
    assert_error(&run(&s, 90, BOB_ALL).await, 422, "report_compile_failed");
}

#[actix_rt::test]
async fn bad_definitions_are_422_with_detail_for_the_author() {
    let s = TestServer::start().await;
    let row = |extra: Value| {
        let mut d = json!({"type": "row", "sources": [10, 11], "columns": ["Task"]});
        for (k, v) in extra.as_object().unwrap() {
            d[k] = v.clone();
        }
        d
    };
    let cases: Vec<(Value, Value)> = vec![
        (json!("select *"), json!({"path": "", "reason": "the definition must be an object"})),
        (json!({}), json!({"path": "/type", "reason": "`type` is required"})),
        (
            json!({"type": "pivot", "sources": [10]}),
            json!({"path": "/type", "type": "pivot", "reason": "the type must be `row` or `summary`"}),
        ),
        (
            json!({"type": "row", "sources": [], "columns": ["Task"]}),
            json!({"path": "/sources", "reason": "`sources` is empty"}),
        ),
        (
            json!({"type": "row", "columns": ["Task"]}),
            json!({"path": "/sources", "reason": "`sources` is required"}),
        ),
        (
            row(json!({"columns": ["Task", "Hourz"]})),
            json!({"path": "/columns/1", "column": "Hourz", "reason": "no readable source has this column"}),
        ),
        (
            row(json!({"filter": {"column": "Status", "op": "like", "value": "D%"}})),
            json!({"path": "/filter/op", "op": "like",
                   "reason": "use one of: eq, ne, gt, gte, lt, lte, contains, in, is_blank, not_blank"}),
        ),
        (
            json!({"type": "summary", "sources": [10, 11], "aggregates": [{"fn": "sum", "column": "Task"}]}),
            json!({"path": "/aggregates/0/column", "fn": "sum", "column": "Task", "reason": "`sum` needs a number column, not text"}),
        ),
        (
            json!({"type": "summary", "sources": [10], "aggregates": [{"fn": "avg", "column": "Status"}]}),
            json!({"path": "/aggregates/0/column", "fn": "avg", "column": "Status", "reason": "`avg` needs a number column, not dropdown"}),
        ),
        (
            json!({"type": "summary", "sources": [10], "aggregates": [{"fn": "median", "column": "Hours"}]}),
            json!({"path": "/aggregates/0/fn", "fn": "median", "reason": "use count, sum, avg, min or max"}),
        ),
        (
            row(json!({"sort": [{"column": "Hours", "direction": "up"}]})),
            json!({"path": "/sort/0/direction", "direction": "up", "reason": "the direction must be `asc` or `desc`"}),
        ),
        (
            row(json!({"filter": {"all": {"column": "Status", "op": "eq", "value": "Done"}}})),
            json!({"path": "/filter", "filter": {"all": {"column": "Status", "op": "eq", "value": "Done"}},
                   "reason": "`all` must be a list of filters"}),
        ),
        (
            row(json!({"filter": {"column": "Hours", "op": "gt", "value": "abc"}})),
            json!({"path": "/filter/value", "op": "gt", "column": "Hours", "value": "abc",
                   "reason": "expected a number (a finite JSON number, or a string holding a \
                              decimal such as \"12\", \"-3.5\" or \"1e3\"), got the string \"abc\""}),
        ),
        // Operands are coerced as cells are: no trimming, only the column's options.
        (
            row(json!({"filter": {"column": "Hours", "op": "eq", "value": " 5"}})),
            json!({"path": "/filter/value", "op": "eq", "column": "Hours", "value": " 5",
                   "reason": "expected a number (a finite JSON number, or a string holding a \
                              decimal such as \"12\", \"-3.5\" or \"1e3\"), got the string \" 5\""}),
        ),
        (
            row(json!({"filter": {"column": "Status", "op": "in", "value": ["Open", "Gone"]}})),
            json!({"path": "/filter/value", "op": "in", "column": "Status", "value": ["Open", "Gone"],
                   "reason": "item 1: expected one of the column's options [\"Open\", \"Done\"] \
                              (as a string), got the string \"Gone\""}),
        ),
        (
            row(json!({"filter": {"column": "Seen", "op": "eq", "value": "2026-03-01T12:00:00"}})),
            json!({"path": "/filter/value", "op": "eq", "column": "Seen", "value": "2026-03-01T12:00:00",
                   "reason": "expected an RFC 3339 date-time with an offset, e.g. \
                              \"2026-01-02T03:04:05Z\" or \"2026-01-02T03:04:05.120+01:00\", got the \
                              string \"2026-03-01T12:00:00\" (not of the form YYYY-MM-DDTHH:MM:SS[.fraction] \
                              followed by Z or ±hh:mm)"}),
        ),
        (
            row(json!({"filter": {"column": "Status", "op": "in", "value": "Done"}})),
            json!({"path": "/filter/value", "op": "in", "value": "Done",
                   "reason": "`in` takes a list of strings, numbers or booleans"}),
        ),
        (
            row(json!({"groupby": ["Status"]})),
            json!({"path": "/groupby", "field": "groupby",
                   "reason": "known fields: type, sources, columns, groupBy, aggregates, filter, sort"}),
        ),
        // A compile error comes before the sources cap.
        (
            json!({"type": "row", "sources": (1..=60).collect::<Vec<u64>>(), "columns": ["Nope"]}),
            json!({"path": "/columns/0", "column": "Nope", "reason": "no readable source has this column"}),
        ),
    ];
    let reports: Vec<Value> =
        cases.iter().enumerate().map(|(i, (def, _))| report(200 + i as u64, def.clone())).collect();
    import(&s, json!({"reports": reports})).await;
    for (i, (def, detail)) in cases.iter().enumerate() {
        let r = run(&s, 200 + i as u64, ADA_READ).await;
        assert_error(&r, 422, "report_compile_failed");
        assert_eq!(&r.1["detail"], detail, "{def}");
    }
}

#[actix_rt::test]
async fn too_many_sources_is_413() {
    let s = TestServer::start().await;
    let mut fifty: Vec<u64> = vec![10, 11];
    fifty.extend(1000..1048);
    let mut fifty_one = fifty.clone();
    fifty_one.push(5000);
    import(
        &s,
        json!({"reports": [
            report(80, json!({"type": "row", "sources": fifty, "columns": ["Task"]})),
            report(81, json!({"type": "row", "sources": fifty_one, "columns": ["Task"]}))
        ]}),
    )
    .await;
    let d = data(&s, 80, ADA_READ).await;
    assert_eq!(
        (d["sourcesOmittedForAccess"].as_u64(), d["totalMatched"].as_u64()),
        (Some(48), Some(5))
    );
    let r = run(&s, 81, ADA_READ).await;
    assert_error(&r, 413, "report_cap_exceeded");
    assert_eq!(r.1["detail"], json!({"cap": "maxSources", "limit": 50, "value": 51}));
}

#[actix_rt::test]
async fn too_many_scanned_rows_is_413() {
    let s = TestServer::start_with(fixture(), |a| a.report_max_scanned_rows = 3).await;
    let r = run(&s, 7, ADA_READ).await;
    assert_error(&r, 413, "report_cap_exceeded");
    assert_eq!(r.1["detail"], json!({"cap": "maxScannedRows", "limit": 3, "value": 5}));
    // Only readable sources count: ADA_READ reads sheet 11 (1 row) but not bob's sheet 20.
    import(&s, json!({"reports": [report(82, json!({"type": "row", "sources": [11, 20], "columns": ["Task"]}))]})).await;
    let d = data(&s, 82, ADA_READ).await;
    assert_eq!(
        (d["scannedRows"].as_u64(), d["sourcesOmittedForAccess"].as_u64()),
        (Some(1), Some(1))
    );
    // A compile error still wins over the cap.
    import(&s, json!({"reports": [report(83, json!({"type": "row", "sources": [10, 11], "columns": ["Hourz"]}))]})).await;
    assert_error(&run(&s, 83, ADA_READ).await, 422, "report_compile_failed");
}

#[actix_rt::test]
async fn unknown_reports_and_routes() {
    let s = TestServer::start().await;
    let r = run(&s, 99, ADA_READ).await;
    assert_error(&r, 404, "not_found");
    let r = s.call("POST", "/reports/x/run", Some(ADA_READ), None).await;
    assert_error(&r, 422, "validation_failed");
    assert_eq!(r.1["detail"][0]["loc"], json!(["path", "report_id"]));
    assert_error(&s.get("/reports/7/run", ADA_READ).await, 404, "not_found");
    assert_error(&s.call("POST", "/reports/7/run", None, None).await, 401, "unauthorized");
    // A body is ignored.
    let (status, _, _) = s.post("/reports/7/run", ADA_READ, &json!({"anything": 1})).await;
    assert_eq!(status, 200);
}

/// Follow a run's cursors from its first page; returns the pages' `data`.
async fn all_pages(
    s: &TestServer,
    id: u64,
    key: &str,
    limit: usize,
    between: impl AsyncFn(usize),
) -> Vec<Value> {
    let (mut pages, mut cursor) = (Vec::new(), None::<String>);
    loop {
        let path = match &cursor {
            Some(c) => format!("/reports/{id}/run?limit={limit}&cursor={c}"),
            None => format!("/reports/{id}/run?limit={limit}"),
        };
        let (status, body, _) = s.call("POST", &path, Some(key), None).await;
        assert_eq!(status, 200, "{body}");
        pages.push(body["data"].clone());
        between(pages.len()).await;
        match body["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return pages,
        }
    }
}

#[actix_rt::test]
async fn a_run_pages_as_of_its_first_page_while_rows_are_added() {
    let s = TestServer::start().await;
    import(&s, json!({"reports": [report(61, json!({"type": "row", "sources": [11], "columns": ["Task", "Hours"],
        "sort": [{"column": "Hours", "direction": "desc"}]}))]}))
    .await;
    let rows: Vec<Value> =
        (1..=9).map(|h| json!({"cells": {"110": format!("h{h}"), "112": h}})).collect();
    assert_eq!(s.post("/sheets/11/rows:bulkAdd", ADA_WRITE, &json!({"rows": rows})).await.0, 200);
    // After the first page, rows arrive that sort before everything already seen.
    let pages = all_pages(&s, 61, ADA_READ, 4, async |n| {
        if n == 1 {
            let top: Vec<Value> = (100..103)
                .map(|h| json!({"cells": {"110": format!("top{h}"), "112": h}}))
                .collect();
            assert_eq!(
                s.post("/sheets/11/rows:bulkAdd", ADA_WRITE, &json!({"rows": top})).await.0,
                200
            );
        }
    })
    .await;
    let hours: Vec<Value> = pages.iter().flat_map(|p| column(p, "2")).collect();
    assert_eq!(hours, [9, 8, 7, 6, 5, 4, 3, 3, 2, 1].map(|h| json!(h)), "no skips, no repeats");
    assert!(pages.iter().all(|p| p["totalMatched"] == 10), "every page describes the same run");
    // A new run sees the rows added meanwhile.
    let fresh = data(&s, 61, ADA_READ).await;
    assert_eq!(
        (fresh["totalMatched"].as_u64(), column(&fresh, "2")[0].clone()),
        (Some(13), json!(102))
    );
}

#[actix_rt::test]
async fn a_source_unshared_mid_run_is_not_read_from_the_pinned_result() {
    let s = TestServer::start().await;
    // Bob (paid for this test) reads sheet 20 as owner and sheet 10 through a folder share.
    assert_eq!(s.admin_call("PUT", "/users/2/plan", Some(&json!({"plan": "paid"}))).await.0, 200);
    import(
        &s,
        json!({"reports": [{"id": 62, "projectId": 2, "ownerId": 2, "name": "mixed",
        "definition": {"type": "row", "sources": [20, 10], "columns": ["Name"]}}]}),
    )
    .await;
    let pages = all_pages(&s, 62, BOB_ALL, 2, async |n| {
        if n == 1 {
            let unshare = json!({"userId": 2, "scopeType": "folder", "scopeId": 5, "role": "none"});
            assert_eq!(s.admin_call("PUT", "/shares", Some(&unshare)).await.0, 200);
        }
    })
    .await;
    // Sheet 10's four rows have no Name: they read as nulls after bob's one row.
    assert_eq!(
        (pages[0]["sourcesOmittedForAccess"].as_u64(), pages[0]["totalMatched"].as_u64()),
        (Some(0), Some(5))
    );
    assert_eq!(column(&pages[0], "1"), [json!("launch"), Value::Null]);
    // After the unshare the pinned result is not used: the run is redone over sheet 20 only.
    let later: Vec<&Value> = pages[1..].iter().collect();
    assert!(!later.is_empty());
    for p in later {
        assert_eq!(
            (p["sourcesOmittedForAccess"].as_u64(), p["totalMatched"].as_u64()),
            (Some(1), Some(1)),
            "{p}"
        );
        assert!(p["rows"].as_array().unwrap().is_empty(), "no row of sheet 10: {p}");
    }
}
