//! bulkUpsertRows (docs/spec/extensions.md X5) through the real server: actions and versions, items
//! that see the items before them, ambiguous and missing keys, key columns, coerced key equality,
//! the key index following every other kind of write, capacity, access, idempotent replay and
//! restarts.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::*;

async fn upsert(s: &TestServer, sheet: u64, key_column: &str, rows: Value) -> Reply {
    let body = json!({"keyColumn": key_column, "rows": rows});
    s.post(&format!("/sheets/{sheet}/rows:bulkUpsert"), ADA_WRITE, &body).await
}

/// `(status, action, row id, version)` of one result.
type Outcome = (String, Option<String>, Option<u64>, Option<u64>);

/// The [`Outcome`] of each result, for a 200.
fn outcomes(r: &Reply) -> Vec<Outcome> {
    assert_eq!(r.0, 200, "{}", r.1);
    r.1["results"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, item)| {
            assert_eq!(item["index"], i);
            (
                item["status"].as_str().unwrap().to_owned(),
                item["action"].as_str().map(str::to_owned),
                item["row"]["id"].as_u64(),
                item["row"]["version"].as_u64(),
            )
        })
        .collect()
}

fn done(action: &str, id: u64, version: u64) -> Outcome {
    ("succeeded".into(), Some(action.into()), Some(id), Some(version))
}

fn failed() -> Outcome {
    ("failed".into(), None, None, None)
}

async fn get_row(s: &TestServer, sheet: u64, id: u64) -> Reply {
    s.get(&format!("/sheets/{sheet}/rows/{id}"), ADA_READ).await
}

async fn row_count(s: &TestServer, sheet: u64) -> u64 {
    s.get(&format!("/sheets/{sheet}"), ADA_READ).await.1["rowCount"].as_u64().unwrap()
}

#[actix_rt::test]
async fn items_create_update_or_leave_rows_unchanged_with_versions_to_match() {
    let s = TestServer::start().await;
    let (_, before, before_headers) = get_row(&s, 10, 1003).await;
    let r = upsert(
        &s,
        10,
        "100",
        json!([
            {"cells": {"100": "root", "102": 6}},
            {"cells": {"100": "new task", "101": "Open"}},
            {"cells": {"100": "other", "101": "Done", "108": "Red"}},
            {"cells": {"100": "child", "101": null}}
        ]),
    )
    .await;
    let got = outcomes(&r);
    let new_id = got[1].2.unwrap();
    assert!(new_id > 2000, "a fresh id: {new_id}");
    assert_eq!(
        got,
        [
            done("updated", 1000, 2),
            done("created", new_id, 1),
            done("unchanged", 1003, 1),
            done("updated", 1001, 2)
        ]
    );
    assert_eq!((r.1["succeededCount"].as_u64(), r.1["failedCount"].as_u64()), (Some(4), Some(0)));
    let results = &r.1["results"];
    // Merged as a patch merges: untouched cells stay, null removes one.
    assert_eq!(results[0]["row"]["cells"], json!({"100": "root", "101": "Done", "102": 6}));
    assert_eq!(results[1]["row"]["cells"], json!({"100": "new task", "101": "Open"}));
    assert_eq!(results[1]["row"]["updatedBy"], json!({"source": "api"}));
    assert_eq!(results[3]["row"]["cells"], json!({"100": "child", "102": 2}));
    // Unchanged: the row as it is, not written, its version and ETag as before.
    assert_eq!(results[2]["row"], without_request_id(before.clone()));
    assert!(results[2]["row"]["cells"].get("108").is_some());
    let (status, after, after_headers) = get_row(&s, 10, 1003).await;
    assert_eq!(status, 200);
    assert_eq!(without_request_id(after), without_request_id(before));
    assert_eq!(after_headers.get("etag"), before_headers.get("etag"));
    let (_, page, _) = s.get("/sheets/10/rows?limit=500", ADA_READ).await;
    let listed = page["data"].as_array().unwrap().iter().find(|r| r["id"] == 1003).unwrap();
    assert_eq!(listed["version"], 1);
    assert_eq!(row_count(&s, 10).await, 5);
    let (_, created, _) = get_row(&s, 10, new_id).await;
    assert_eq!(created["version"], 1);
}

#[actix_rt::test]
async fn a_later_item_sees_the_earlier_ones() {
    let s = TestServer::start().await;
    let r = upsert(
        &s,
        11,
        "110",
        json!([
            {"cells": {"110": "fresh", "112": 1}},
            {"cells": {"110": "fresh", "112": 2}},
            {"cells": {"110": "fresh", "112": "2"}},
            {"cells": {"110": "fresh", "111": "Open"}}
        ]),
    )
    .await;
    let got = outcomes(&r);
    let id = got[0].2.unwrap();
    assert_eq!(
        got,
        [
            done("created", id, 1),
            done("updated", id, 2),
            done("unchanged", id, 2),
            done("updated", id, 3)
        ]
    );
    assert_eq!(row_count(&s, 11).await, 2, "one row created, not four");
    let (_, row, _) = get_row(&s, 11, id).await;
    assert_eq!(
        (row["version"].clone(), row["cells"].clone()),
        (json!(3), json!({"110": "fresh", "111": "Open", "112": 2}))
    );
}

#[actix_rt::test]
async fn a_key_held_by_two_rows_fails_that_item_only() {
    let s = TestServer::start().await;
    let (_, added, _) = s
        .post(
            "/sheets/11/rows:bulkAdd",
            ADA_WRITE,
            &json!({"rows": [{"cells": {"110": "dup"}}, {"cells": {"110": "dup", "112": 1}}]}),
        )
        .await;
    let dups: Vec<u64> = added["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["row"]["id"].as_u64().unwrap())
        .collect();
    let r = upsert(
        &s,
        11,
        "110",
        json!([{"cells": {"110": "dup", "112": 7}}, {"cells": {"110": "stock", "112": 4}}]),
    )
    .await;
    assert_eq!(outcomes(&r), [failed(), done("updated", 1100, 2)]);
    let error = &r.1["results"][0]["error"];
    assert_eq!(error["errorCode"], "validation_failed");
    assert_eq!(error["detail"]["column_id"], 110);
    assert!(error["detail"]["reason"].as_str().unwrap().contains("2 rows"), "{error}");
    assert_eq!(error["detail"]["rowIds"], json!(dups));
    assert!(error.get("requestId").is_none());
    for id in dups {
        assert_eq!(get_row(&s, 11, id).await.1["version"], 1, "row {id} untouched");
    }
}

#[actix_rt::test]
async fn a_key_column_that_is_no_key_column_of_the_sheet_is_a_422_at_body_key_column() {
    let s = TestServer::start().await;
    let rows = json!([{"cells": {"100": "x"}}]);
    // Unknown, not a column id as cell keys spell one, another sheet's, or of a type that holds
    // no matchable scalar.
    for key in ["999", "abc", "0100", "+100", "", "110", "103", "105", "107"] {
        let r = upsert(&s, 10, key, rows.clone()).await;
        assert_error(&r, 422, "validation_failed");
        assert_eq!(r.1["detail"][0]["loc"], json!(["body", "keyColumn"]), "{key}: {}", r.1);
        assert_eq!(r.1["detail"][0]["type"], "value_error", "{key}");
    }
    let checkbox = upsert(&s, 10, "103", rows.clone()).await;
    assert!(
        checkbox.1["detail"][0]["msg"].as_str().unwrap().contains("checkbox"),
        "{}",
        checkbox.1
    );
    // Malformed bodies: refused before anything else, like every body.
    let url = "/sheets/10/rows:bulkUpsert";
    for (body, loc) in [
        (json!({"rows": rows}), json!(["body", "keyColumn"])),
        (json!({"keyColumn": 100, "rows": rows}), json!(["body", "keyColumn"])),
        (json!({"keyColumn": "100", "rows": []}), json!(["body", "rows"])),
        (json!({"keyColumn": "100"}), json!(["body", "rows"])),
        (json!({"keyColumn": "100", "rows": rows, "extra": 1}), json!(["body"])),
    ] {
        let r = s.post(url, ADA_WRITE, &body).await;
        assert_error(&r, 422, "validation_failed");
        let got = &r.1["detail"][0]["loc"];
        assert!(got.as_array().unwrap().starts_with(loc.as_array().unwrap()), "{body}: {got}");
    }
    assert_eq!(row_count(&s, 10).await, 4, "nothing written");
    // Access comes before the key column: an unreachable sheet stays a 404, a read-only one 403.
    let bad = json!({"keyColumn": "999", "rows": rows});
    assert_error(&s.post(url, ADA_SHEET11, &bad).await, 404, "not_found");
    assert_error(&s.post(url, ADA_READ, &bad).await, 403, "forbidden");
}

#[actix_rt::test]
async fn a_missing_null_or_empty_key_cell_fails_its_item_like_a_refused_cell() {
    let s = TestServer::start().await;
    let r = upsert(
        &s,
        10,
        "100",
        json!([
            {},
            {"cells": {"101": "Open"}},
            {"cells": {"100": null}},
            {"cells": {"100": ""}},
            {"cells": {"100": {"formula": "=A1"}}},
            {"cells": {"100": "root", "102": "many"}},
            {"cells": {"100": "root", "102": 9}}
        ]),
    )
    .await;
    let got = outcomes(&r);
    assert_eq!(&got[..6], &vec![failed(); 6][..]);
    assert_eq!(got[6], done("updated", 1000, 2));
    let results = r.1["results"].as_array().unwrap();
    for (i, item) in results[..6].iter().enumerate() {
        let error = &item["error"];
        assert_eq!(error["errorCode"], "validation_failed", "{i}: {error}");
        let column = if i == 5 { 102 } else { 100 };
        assert_eq!(error["detail"]["column_id"], column, "{i}: {error}");
        assert!(error["detail"]["reason"].as_str().is_some_and(|r| !r.is_empty()), "{i}");
    }
    assert_eq!(row_count(&s, 10).await, 4);
}

#[actix_rt::test]
async fn keys_match_by_their_coerced_values() {
    let s = TestServer::start().await;
    // Number keys: row 1003 holds 8, 1000 holds 5, 1001 holds 2.
    let r = upsert(
        &s,
        10,
        "102",
        json!([
            {"cells": {"102": "8", "100": "eight"}},
            {"cells": {"102": 5.0, "101": "Open"}},
            {"cells": {"102": {"value": "2", "format": "0.0"}}},
            {"cells": {"102": 2, "100": "two"}},
            {"cells": {"102": "1e3"}},
            {"cells": {"102": 1000}}
        ]),
    )
    .await;
    let got = outcomes(&r);
    let thousand = got[4].2.unwrap();
    assert_eq!(
        got,
        [
            done("updated", 1003, 2),
            done("updated", 1000, 2),
            done("updated", 1001, 2),
            done("updated", 1001, 3),
            done("created", thousand, 1),
            done("updated", thousand, 2)
        ]
    );
    let results = &r.1["results"];
    assert_eq!(results[2]["row"]["cells"]["102"], json!({"value": 2, "format": "0.0"}));
    assert_eq!(results[3]["row"]["cells"]["102"], 2);
    // Text keys: a number sent to a text column is its text; dates are matched as stored.
    let r =
        upsert(&s, 10, "100", json!([{"cells": {"100": 12}}, {"cells": {"100": "12", "102": 1}}]))
            .await;
    let got = outcomes(&r);
    let twelve = got[0].2.unwrap();
    assert_eq!(got, [done("created", twelve, 1), done("updated", twelve, 2)]);
    let r = upsert(&s, 10, "104", json!([{"cells": {"104": "2026-01-31", "103": false}}])).await;
    assert_eq!(outcomes(&r), [done("updated", 1003, 3)]);
    // Options and contacts match exactly.
    let r = upsert(
        &s,
        10,
        "106",
        json!([{"cells": {"106": "x@y.z", "108": "Green"}}, {"cells": {"106": "X@y.z"}}]),
    )
    .await;
    let got = outcomes(&r);
    assert_eq!(got[0], done("updated", 1003, 4));
    assert_eq!(got[1].1.as_deref(), Some("created"));
}

#[actix_rt::test]
async fn the_key_index_follows_every_other_write() {
    let s = TestServer::start().await;
    let path = |id: u64| format!("/sheets/11/rows/{id}");
    // The first upsert naming column 110 builds its index.
    let first = outcomes(&upsert(&s, 11, "110", json!([{"cells": {"110": "alpha"}}])).await);
    let a = first[0].2.unwrap();
    // patchRow moves row A from "alpha" to "beta"; deleteRow removes "stock".
    let (status, _, _) = s
        .call(
            "PATCH",
            &path(a),
            Some(ADA_WRITE),
            Some(&json!({"version": 1, "cells": {"110": "beta"}})),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(s.call("DELETE", &path(1100), Some(ADA_WRITE), None).await.0, 204);
    // bulkAdd adds "gamma" and "eta"; bulkUpdate turns "eta" into "theta".
    let (_, added, _) = s
        .post(
            "/sheets/11/rows:bulkAdd",
            ADA_WRITE,
            &json!({"rows": [{"cells": {"110": "gamma"}}, {"cells": {"110": "eta"}}]}),
        )
        .await;
    let g = added["results"][0]["row"]["id"].as_u64().unwrap();
    let h = added["results"][1]["row"]["id"].as_u64().unwrap();
    let (_, updated, _) = s
        .post(
            "/sheets/11/rows:bulkUpdate",
            ADA_WRITE,
            &json!({"rows": [{"id": h, "version": 1, "cells": {"110": "theta"}}]}),
        )
        .await;
    assert_eq!(updated["succeededCount"], 1);
    let r = upsert(
        &s,
        11,
        "110",
        json!([
            {"cells": {"110": "alpha", "112": 1}},
            {"cells": {"110": "beta", "112": 2}},
            {"cells": {"110": "stock", "112": 3}},
            {"cells": {"110": "gamma", "112": 4}},
            {"cells": {"110": "eta", "112": 5}},
            {"cells": {"110": "theta", "112": 6}}
        ]),
    )
    .await;
    let got = outcomes(&r);
    let created: Vec<u64> = [0, 2, 4].iter().map(|i| got[*i].2.unwrap()).collect();
    assert_eq!(
        got,
        [
            done("created", created[0], 1),
            done("updated", a, 3),
            done("created", created[1], 1),
            done("updated", g, 2),
            done("created", created[2], 1),
            done("updated", h, 3)
        ]
    );
    assert!(!created.contains(&1100) && !created.contains(&a), "{created:?}");
    // The same request again: every key now names one row, and nothing changes.
    let again = r.1["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["row"]["id"].as_u64())
        .collect::<Vec<_>>();
    let r2 = upsert(
        &s,
        11,
        "110",
        json!([
            {"cells": {"110": "alpha", "112": 1}},
            {"cells": {"110": "beta", "112": 2}},
            {"cells": {"110": "stock", "112": 3}},
            {"cells": {"110": "gamma", "112": 4}},
            {"cells": {"110": "eta", "112": 5}},
            {"cells": {"110": "theta", "112": 6}}
        ]),
    )
    .await;
    let got2 = outcomes(&r2);
    assert!(got2.iter().all(|o| o.1.as_deref() == Some("unchanged")), "{got2:?}");
    assert_eq!(got2.iter().map(|o| o.2).collect::<Vec<_>>(), again);
    assert_eq!(row_count(&s, 11).await, 6);
}

#[actix_rt::test]
async fn a_create_past_the_cap_fails_while_updates_still_apply() {
    let mut fx = fixture();
    fx["plans"] = json!({"paid": {"maxRowsPerSheet": 2}});
    let s = TestServer::start_with(fx, |_| {}).await;
    let r = upsert(
        &s,
        11,
        "110",
        json!([
            {"cells": {"110": "one"}},
            {"cells": {"110": "two"}},
            {"cells": {"110": "stock", "112": 9}},
            {"cells": {"110": "one", "112": 1}}
        ]),
    )
    .await;
    let got = outcomes(&r);
    let one = got[0].2.unwrap();
    assert_eq!(
        got,
        [done("created", one, 1), failed(), done("updated", 1100, 2), done("updated", one, 2)]
    );
    let error = &r.1["results"][1]["error"];
    assert_eq!(error["errorCode"], "capacity_exceeded");
    assert_eq!(error["detail"]["maxRowsPerSheet"], 2);
    assert_eq!(row_count(&s, 11).await, 2);
}

#[actix_rt::test]
async fn read_only_keys_get_403_and_unreachable_sheets_404() {
    let s = TestServer::start().await;
    let body = json!({"keyColumn": "100", "rows": [{"cells": {"100": "root", "102": 99}}, {"cells": {"100": "new"}}]});
    let url = "/sheets/10/rows:bulkUpsert";
    assert_error(&s.post(url, ADA_READ, &body).await, 403, "forbidden");
    // bob's key is account-wide write, but bob only views sheet 10.
    assert_error(&s.post(url, BOB_ALL, &body).await, 403, "forbidden");
    assert_error(&s.post(url, ADA_SHEET11, &body).await, 404, "not_found");
    assert_error(&s.post("/sheets/4242/rows:bulkUpsert", ADA_WRITE, &body).await, 404, "not_found");
    assert_eq!(row_count(&s, 10).await, 4);
    assert_eq!(get_row(&s, 10, 1000).await.1["version"], 1);
}

/// POST with an `Idempotency-Key`: `(status, raw body bytes, Idempotent-Replayed)`.
async fn post_idem(
    s: &TestServer,
    path: &str,
    idem_key: &str,
    body: &Value,
) -> (u16, Vec<u8>, Option<String>) {
    let client = awc::Client::builder().timeout(Duration::from_secs(60)).finish();
    let mut res = client
        .post(format!("{}{path}", s.base))
        .insert_header(("Authorization", format!("Bearer {ADA_WRITE}")))
        .insert_header(("Idempotency-Key", idem_key))
        .insert_header(("Content-Type", "application/json"))
        .send_body(body.to_string())
        .await
        .unwrap();
    let bytes = res.body().await.unwrap().to_vec();
    let replayed = res.headers().get("idempotent-replayed").map(|v| v.to_str().unwrap().to_owned());
    (res.status().as_u16(), bytes, replayed)
}

#[actix_rt::test]
async fn an_idempotent_retry_replays_the_same_bytes_and_writes_nothing() {
    let s = TestServer::start().await;
    let path = "/sheets/11/rows:bulkUpsert";
    let body = json!({"keyColumn": "110", "rows": [
        {"cells": {"110": "stock", "112": 5}}, {"cells": {"110": "new"}}, {"cells": {"112": 1}}
    ]});
    let (status, first, replayed) = post_idem(&s, path, "u-1", &body).await;
    assert_eq!((status, replayed), (200, None));
    let (status, again, replayed) = post_idem(&s, path, "u-1", &body).await;
    assert_eq!((status, replayed.as_deref()), (200, Some("true")));
    assert_eq!(first, again, "byte for byte");
    assert_eq!(get_row(&s, 11, 1100).await.1["version"], 2, "updated once");
    assert_eq!(row_count(&s, 11).await, 2, "created once");
    let other = json!({"keyColumn": "110", "rows": [{"cells": {"110": "stock", "112": 6}}]});
    let (status, reused, _) = post_idem(&s, path, "u-1", &other).await;
    let reused: Value = serde_json::from_slice(&reused).unwrap();
    assert_eq!((status, &reused["errorCode"]), (409, &json!("idempotency_key_reused")));
    // A key column that is no key column of the sheet is request validation (docs/spec/decisions.md
    // §6, §8): not stored, so the key stays free for the corrected request.
    let bad = json!({"keyColumn": "999", "rows": [{"cells": {"110": "x"}}]});
    let (status, _, _) = post_idem(&s, path, "u-2", &bad).await;
    let (again_status, _, replayed) = post_idem(&s, path, "u-2", &bad).await;
    assert_eq!((status, again_status, replayed), (422, 422, None));
    let fixed = json!({"keyColumn": "110", "rows": [{"cells": {"110": "x"}}]});
    let (status, created, replayed) = post_idem(&s, path, "u-2", &fixed).await;
    assert_eq!((status, replayed), (200, None));
    let created: Value = serde_json::from_slice(&created).unwrap();
    assert_eq!(created["results"][0]["action"], "created");
    // A sheet the key cannot write: stored like any 403.
    let (status, first, _) = post_idem(&s, "/sheets/20/rows:bulkUpsert", "u-3", &fixed).await;
    let (_, again, replayed) = post_idem(&s, "/sheets/20/rows:bulkUpsert", "u-3", &fixed).await;
    assert_eq!((status, replayed.as_deref()), (404, Some("true")));
    assert_eq!(first, again);
}

#[actix_rt::test]
async fn upserts_survive_a_restart_and_keep_matching_their_rows() {
    let mut s = TestServer::start().await;
    let r = upsert(&s, 11, "110", json!([{"cells": {"110": "persist", "112": 1}}])).await;
    let id = outcomes(&r)[0].2.unwrap();
    s.restart().await;
    let r = upsert(
        &s,
        11,
        "110",
        json!([{"cells": {"110": "persist", "112": 2}}, {"cells": {"110": "persist", "112": 2}}]),
    )
    .await;
    assert_eq!(outcomes(&r), [done("updated", id, 2), done("unchanged", id, 2)]);
    assert_eq!(row_count(&s, 11).await, 2, "updated, not duplicated");
    s.restart().await;
    let (_, row, _) = get_row(&s, 11, id).await;
    assert_eq!((row["version"].clone(), row["cells"]["112"].clone()), (json!(2), json!(2)));
    s.stop().await;
}

#[actix_rt::test]
async fn option_keys_match_dropdown_and_symbol_cells() {
    let s = TestServer::start().await;
    // Dropdown 101: "Open" is row 1001's alone, "Done" is held by 1000 and 1003.
    let r = upsert(
        &s,
        10,
        "101",
        json!([{"cells": {"101": "Open", "102": 9}}, {"cells": {"101": "Done", "102": 9}}]),
    )
    .await;
    let got = outcomes(&r);
    assert_eq!(got[0], done("updated", 1001, 2));
    assert_eq!(got[1], failed());
    assert_eq!(r.1["results"][1]["error"]["detail"]["rowIds"], json!([1000, 1003]));
    // Symbol 108: "Red" is row 1003's; "Green" is nobody's yet; an unknown option is refused.
    let r = upsert(
        &s,
        10,
        "108",
        json!([
            {"cells": {"108": "Red", "100": "red one"}},
            {"cells": {"108": "Green"}},
            {"cells": {"108": "Blue"}}
        ]),
    )
    .await;
    let got = outcomes(&r);
    assert_eq!(got[0], done("updated", 1003, 2));
    assert_eq!(got[1].1.as_deref(), Some("created"));
    assert_eq!(got[2], failed());
    assert_eq!(r.1["results"][2]["error"]["errorCode"], "validation_failed");
}
