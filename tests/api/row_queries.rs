//! `fields` and `filter` on listRows (docs/spec/extensions.md X6).

use serde_json::{json, Value};

use crate::common::*;

fn encode(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn ids(page: &Value) -> Vec<u64> {
    page["data"].as_array().unwrap().iter().map(|r| r["id"].as_u64().unwrap()).collect()
}

/// Every row of `sheet` passing `filter`, following `nextCursor` to the end: `(ids, pages)`.
async fn all_matching(
    s: &TestServer,
    sheet: u64,
    filter: &Value,
    limit: usize,
) -> (Vec<u64>, Vec<Value>) {
    let base = format!("/sheets/{sheet}/rows?limit={limit}&filter={}", encode(&filter.to_string()));
    let (mut found, mut pages, mut cursor) = (Vec::new(), Vec::new(), None::<String>);
    loop {
        let url = match &cursor {
            Some(c) => format!("{base}&cursor={c}"),
            None => base.clone(),
        };
        let (status, page, _) = s.get(&url, ADA_READ).await;
        assert_eq!(status, 200, "{filter}: {page}");
        found.extend(ids(&page));
        cursor = page["nextCursor"].as_str().map(str::to_owned);
        pages.push(page);
        if cursor.is_none() {
            return (found, pages);
        }
    }
}

async fn matching(s: &TestServer, filter: Value) -> Vec<u64> {
    all_matching(s, 10, &filter, 500).await.0
}

fn leaf(column: &str, op: &str, value: Value) -> Value {
    json!({"column": column, "op": op, "value": value})
}

#[actix_rt::test]
async fn fields_keep_only_those_cells() {
    let s = TestServer::start().await;
    let (status, page, _) = s.get("/sheets/10/rows?fields=103,100", ADA_READ).await;
    assert_eq!(status, 200);
    let (_, full, _) = s.get("/sheets/10/rows", ADA_READ).await;
    for (row, whole) in
        page["data"].as_array().unwrap().iter().zip(full["data"].as_array().unwrap())
    {
        let mut expected = whole.clone();
        expected["cells"].as_object_mut().unwrap().retain(|k, _| k == "100" || k == "103");
        assert_eq!(row, &expected);
    }
    assert_eq!(page["data"][3]["cells"], json!({"100": "other", "103": true}));
    let (_, none, _) = s.get("/sheets/10/rows?fields=", ADA_READ).await;
    assert!(none["data"].as_array().unwrap().iter().all(|r| r["cells"] == json!({})));
    // With a filter on a column that is not shown.
    let filter = encode(&json!({"all": [leaf("101", "eq", json!("Done"))]}).to_string());
    let (status, page, _) =
        s.get(&format!("/sheets/10/rows?fields=102&filter={filter}"), ADA_READ).await;
    assert_eq!(status, 200);
    assert_eq!(
        page["data"].as_array().unwrap().iter().map(|r| r["cells"].clone()).collect::<Vec<_>>(),
        [json!({"102": 5}), json!({"102": 8})]
    );
}

#[actix_rt::test]
async fn fields_name_only_columns_of_the_sheet() {
    let s = TestServer::start().await;
    for (fields, named) in
        [("100,999", "`999`"), ("110", "`110`"), ("100,abc", "`abc`"), ("-1", "`-1`")]
    {
        let r = s.get(&format!("/sheets/10/rows?fields={fields}"), ADA_READ).await;
        assert_error(&r, 422, "validation_failed");
        assert_eq!(r.1["detail"][0]["loc"], json!(["query", "fields"]), "{fields}");
        assert!(r.1["detail"][0]["msg"].as_str().unwrap().contains(named), "{fields}: {}", r.1);
    }
    // A sheet the key cannot read is a 404 before any column is looked at.
    assert_error(&s.get("/sheets/20/rows?fields=999", ADA_READ).await, 404, "not_found");
}

#[actix_rt::test]
async fn filters_apply_every_operator_with_cells_coerced_operands() {
    let s = TestServer::start().await;
    // Rows 1000 (Done, 5), 1001 (Open, 2), 1002 (blank status, 1), 1003 (Done, 8, and every
    // other type; its datetime is stored as 2026-02-01T01:00:00Z).
    let cases = [
        (leaf("101", "eq", json!("Done")), vec![1000, 1003]),
        (leaf("101", "ne", json!("Done")), vec![1001, 1002]),
        (leaf("102", "gt", json!(2)), vec![1000, 1003]),
        (leaf("102", "gte", json!("2")), vec![1000, 1001, 1003]),
        (leaf("102", "lt", json!("5.0")), vec![1001, 1002]),
        (leaf("102", "lte", json!(5)), vec![1000, 1001, 1002]),
        (leaf("100", "contains", json!("CHILD")), vec![1001, 1002]),
        (leaf("101", "in", json!(["Open", "Done"])), vec![1000, 1001, 1003]),
        (json!({"column": "101", "op": "is_blank"}), vec![1002]),
        (json!({"column": "103", "op": "not_blank", "value": null}), vec![1003]),
        (leaf("103", "eq", json!("true")), vec![1003]),
        (leaf("104", "gt", json!("2026-01-30")), vec![1003]),
        (leaf("104", "lt", json!("2026-01-30")), vec![]),
        (leaf("105", "eq", json!("2026-02-01T03:00:00+02:00")), vec![1003]),
        (leaf("105", "eq", json!("2026-02-01T01:00:00.000Z")), vec![1003]),
        (leaf("105", "lt", json!("2026-02-01T00:30:00-01:00")), vec![1003]),
        (leaf("105", "gte", json!("2026-02-01T00:30:00-01:00")), vec![]),
        (leaf("106", "contains", json!("y.z")), vec![1003]),
        (leaf("107", "contains", json!("a")), vec![1003]),
        (leaf("107", "eq", json!(["c", "a"])), vec![1003]),
        (leaf("108", "eq", json!("Red")), vec![1003]),
        (
            json!({"any": [leaf("102", "lt", json!(2)), {"all": [leaf("101", "eq", json!("Done")), leaf("102", "gt", json!(6))]}]}),
            vec![1002, 1003],
        ),
        (json!({"all": []}), vec![1000, 1001, 1002, 1003]),
        (json!({"any": []}), vec![]),
    ];
    for (filter, expected) in cases {
        assert_eq!(matching(&s, filter.clone()).await, expected, "{filter}");
    }
}

#[actix_rt::test]
async fn a_bad_filter_is_422_naming_the_problem() {
    let s = TestServer::start().await;
    let cases = [
        ("{\"all\": [", "not JSON".to_owned()),
        (r#"{"all": [{"column": "999", "op": "eq", "value": "x"}]}"#, "`999`".to_owned()),
        (r#"{"column": "Status", "op": "eq", "value": "Done"}"#, "`Status`".to_owned()),
        (r#"{"column": "110", "op": "eq", "value": "x"}"#, "`110`".to_owned()),
        (r#"{"all": [{"column": "101", "op": "like", "value": "x"}]}"#, "`like`".to_owned()),
        (r#"{"column": "102", "op": "eq", "value": "abc"}"#, "column `102`".to_owned()),
        (r#"{"column": "101", "op": "eq", "value": "Nope"}"#, "column `101`".to_owned()),
        (r#"{"column": "105", "op": "lt", "value": "yesterday"}"#, "column `105`".to_owned()),
        (r#"{"column": "102", "op": "contains", "value": "1"}"#, "`contains`".to_owned()),
        (r#"{"column": "101", "op": "in", "value": "Done"}"#, "`in`".to_owned()),
        (r#"{"every": []}"#, "malformed".to_owned()),
        ("[]", "malformed".to_owned()),
    ];
    for (filter, named) in cases {
        let r = s.get(&format!("/sheets/10/rows?filter={}", encode(filter)), ADA_READ).await;
        assert_error(&r, 422, "validation_failed");
        assert_eq!(r.1["detail"][0]["loc"], json!(["query", "filter"]), "{filter}");
        let msg = r.1["detail"][0]["msg"].as_str().unwrap();
        assert!(msg.contains(&named), "{filter}: {msg}");
    }
}

#[actix_rt::test]
async fn a_cursor_serves_only_the_filter_and_fields_it_came_with() {
    let s = TestServer::start().await;
    let done = json!({"all": [leaf("101", "eq", json!("Done"))]});
    let url = |filter: &Value, extra: &str| {
        format!("/sheets/10/rows?limit=1&filter={}{extra}", encode(&filter.to_string()))
    };
    let (status, first, _) = s.get(&url(&done, ""), ADA_READ).await;
    assert_eq!((status, ids(&first)), (200, vec![1000]));
    let cursor = first["nextCursor"].as_str().unwrap().to_owned();
    // The same filter spelled otherwise is the same filter.
    let respelled: Value =
        serde_json::from_str(r#"{"all":[{"value":"Done","op":"eq","column":"101"}]}"#).unwrap();
    let (status, next, _) = s.get(&url(&respelled, &format!("&cursor={cursor}")), ADA_READ).await;
    assert_eq!((status, ids(&next)), (200, vec![1003]));
    let wrong = [
        url(&json!({"all": [leaf("101", "eq", json!("Open"))]}), &format!("&cursor={cursor}")),
        url(&done, &format!("&fields=100&cursor={cursor}")),
        format!("/sheets/10/rows?cursor={cursor}"),
    ];
    for path in wrong {
        let r = s.get(&path, ADA_READ).await;
        assert_error(&r, 422, "validation_failed");
        assert_eq!(r.1["detail"][0]["loc"], json!(["query", "cursor"]), "{path}");
    }
    // A cursor of an unfiltered page does not continue a filtered one.
    let (_, plain, _) = s.get("/sheets/10/rows?limit=1", ADA_READ).await;
    let plain = plain["nextCursor"].as_str().unwrap().to_owned();
    let r = s.get(&url(&done, &format!("&cursor={plain}")), ADA_READ).await;
    assert_error(&r, 422, "validation_failed");
    let (status, _, _) = s.get(&format!("/sheets/10/rows?cursor={plain}"), ADA_READ).await;
    assert_eq!(status, 200);
}

#[actix_rt::test]
async fn a_rare_match_pages_through_a_large_sheet_examining_at_most_100_000_rows_a_request() {
    let s = TestServer::start().await;
    // 300,000 rows on sheet 11 (fixture row 1100 is `Done`); three more are `Done`.
    let total = 300_000;
    let rare = [5, 150_000, 299_990];
    let mut done_ids = vec![1100];
    for batch in 0..total / 2000 {
        let rows: Vec<Value> = (0..2000)
            .map(|i| {
                let n = batch * 2000 + i;
                let status = if rare.contains(&n) { "Done" } else { "Open" };
                json!({"cells": {"110": format!("r{n}"), "111": status, "112": n}})
            })
            .collect();
        let (status, body, _) =
            s.post("/sheets/11/rows:bulkAdd", ADA_WRITE, &json!({"rows": rows})).await;
        assert_eq!((status, body["succeededCount"].as_u64()), (200, Some(2000)));
        for n in rare.iter().filter(|n| (batch * 2000..(batch + 1) * 2000).contains(*n)) {
            done_ids.push(body["results"][n - batch * 2000]["row"]["id"].as_u64().unwrap());
        }
    }
    let filter = leaf("111", "eq", json!("Done"));
    let (found, pages) = all_matching(&s, 11, &filter, 2).await;
    assert_eq!(found, done_ids, "every match once, in id order");
    let sizes: Vec<usize> = pages.iter().map(|p| p["data"].as_array().unwrap().len()).collect();
    // Page 1 fills up; page 2 examines 100,000 rows and finds none, yet has a cursor; pages 3
    // and 4 each find one within their 100,000 rows, and page 4 reaches the end.
    assert_eq!(sizes, [2, 0, 1, 1]);
    assert!(pages[1]["nextCursor"].is_string());
    // With a large page the cap is what ends the first page, short.
    let (found, pages) = all_matching(&s, 11, &filter, 500).await;
    assert_eq!(found, done_ids);
    let sizes: Vec<usize> = pages.iter().map(|p| p["data"].as_array().unwrap().len()).collect();
    // (The third page's 100,000 rows end one row short of the sheet: a last, empty page.)
    assert_eq!(sizes, [2, 1, 1, 0]);
}
