//! Row writes: bulk add, bulk update, patch and delete, through the real server.

use serde_json::{json, Value};

use crate::common::*;

fn ids(v: &Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(|r| r["id"].as_u64().unwrap()).collect()
}

async fn row(s: &TestServer, sheet: u64, id: u64) -> Value {
    let (_, page, _) = s.get(&format!("/sheets/{sheet}/rows?limit=500"), ADA_READ).await;
    page["data"].as_array().unwrap().iter().find(|r| r["id"] == id).cloned().unwrap_or(Value::Null)
}

#[actix_rt::test]
async fn bulk_add_mixes_successes_coercion_failures_and_capacity_failures_in_order() {
    // Paid sheets hold 4 rows here; sheet 11 starts with 1.
    let mut fx = fixture();
    fx["plans"] = json!({"paid": {"maxRowsPerSheet": 4}});
    let s = TestServer::start_with(fx, |_| {}).await;
    let body = json!({"rows": [
        {"cells": {"110": "a", "112": "2.5"}},
        {"cells": {"112": "not a number"}},
        {"cells": {"999": "x"}},
        {},
        {"cells": {"110": "c", "111": "Done"}},
        {"cells": {"110": "d"}},
        {"cells": {"111": "Nope"}}
    ]});
    let (status, res, _) = s.post("/sheets/11/rows:bulkAdd", ADA_WRITE, &body).await;
    assert_eq!(status, 200);
    let results = res["results"].as_array().unwrap();
    assert_eq!(results.len(), 7);
    let statuses: Vec<&str> = results.iter().map(|r| r["status"].as_str().unwrap()).collect();
    assert_eq!(
        statuses,
        ["succeeded", "failed", "failed", "succeeded", "succeeded", "failed", "failed"]
    );
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["index"], i);
    }
    assert_eq!((res["succeededCount"].as_u64(), res["failedCount"].as_u64()), (Some(3), Some(4)));
    let first = &results[0]["row"];
    assert_eq!(first["cells"], json!({"110": "a", "112": 2.5}), "the number string was coerced");
    assert_eq!(
        (first["version"].as_u64(), first["updatedBy"].clone()),
        (Some(1), json!({"source": "api"}))
    );
    assert!(first["createdAt"].is_string() && first["updatedAt"].is_string());
    assert_eq!(results[1]["error"]["errorCode"], "validation_failed");
    assert_eq!(results[1]["error"]["detail"]["column_id"], 112);
    assert!(results[1]["error"]["detail"]["reason"].is_string());
    assert!(
        results[1]["error"].get("requestId").is_none(),
        "items carry the envelope without requestId"
    );
    assert_eq!(
        results[2]["error"]["detail"]["column_id"], 999,
        "unknown column ids fail the same way"
    );
    assert_eq!(
        results[5]["error"]["errorCode"], "capacity_exceeded",
        "the 5th row would cross the cap of 4"
    );
    // A coercion failure past the cap still reports the coercion problem.
    assert_eq!(results[6]["error"]["errorCode"], "validation_failed");
    let (_, sheet, _) = s.get("/sheets/11", ADA_READ).await;
    assert_eq!(sheet["rowCount"], 4, "nothing dropped, nothing extra");
    // Ids are strictly increasing in request order.
    let new_ids: Vec<u64> =
        [0, 3, 4].iter().map(|i| results[*i]["row"]["id"].as_u64().unwrap()).collect();
    assert!(new_ids.windows(2).all(|w| w[0] < w[1]) && new_ids[0] > 2000, "{new_ids:?}");
}

#[actix_rt::test]
async fn bulk_update_replaces_cells_and_isolates_a_stale_version() {
    let s = TestServer::start().await;
    let body = json!({"rows": [
        {"id": 1000, "version": 1, "cells": {"100": "ROOT"}},
        {"id": 1001, "version": 7, "cells": {"100": "stale"}},
        {"id": 1003, "version": 1, "cells": {"102": "9"}},
        {"id": 1100, "version": 1, "cells": {"100": "other sheet"}},
        {"id": 424242, "version": 1, "cells": {}},
        {"id": 1002, "version": 1, "cells": {"104": "2026-02-30"}}
    ]});
    let (status, res, _) = s.post("/sheets/10/rows:bulkUpdate", ADA_WRITE, &body).await;
    assert_eq!(status, 200);
    let r = res["results"].as_array().unwrap();
    assert_eq!(r[0]["status"], "succeeded");
    assert_eq!(r[0]["row"]["cells"], json!({"100": "ROOT"}), "cells replace the whole map");
    assert_eq!(r[0]["row"]["version"], 2);
    let conflict = &r[1]["error"];
    assert_eq!(conflict["errorCode"], "version_conflict");
    assert_eq!(conflict["detail"]["currentVersion"], 1);
    assert_eq!(conflict["detail"]["current"]["id"], 1001);
    assert_eq!(conflict["detail"]["current"]["cells"]["100"], "child");
    assert!(
        conflict["detail"].get("conflictingColumns").is_none(),
        "no baseCells, no classification"
    );
    assert_eq!(r[2]["row"]["cells"], json!({"102": 9}));
    assert_eq!(r[3]["error"]["errorCode"], "not_found", "a row of another sheet");
    assert_eq!(r[4]["error"]["errorCode"], "not_found");
    assert_eq!(r[5]["error"]["errorCode"], "validation_failed");
    assert_eq!(r[5]["error"]["detail"]["column_id"], 104);
    assert_eq!((res["succeededCount"].as_u64(), res["failedCount"].as_u64()), (Some(2), Some(4)));
    // The failed rows are untouched.
    assert_eq!(row(&s, 10, 1001).await["version"], 1);
    assert_eq!(row(&s, 10, 1002).await["version"], 1);
    assert_eq!(row(&s, 11, 1100).await["cells"]["110"], "stock");
}

#[actix_rt::test]
async fn patch_merges_and_null_removes_while_bulk_update_replaces() {
    let s = TestServer::start().await;
    let (status, patched, _) = s
        .call(
            "PATCH",
            "/sheets/10/rows/1003",
            Some(ADA_WRITE),
            Some(&json!({"version": 1, "cells": {"102": 10, "103": null}})),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(patched["version"], 2);
    let cells = &patched["cells"];
    assert_eq!(cells["102"], 10);
    assert!(cells.get("103").is_none(), "null removed the cell");
    assert_eq!(cells["100"], "other", "untouched cells stay");
    assert_eq!(cells["107"], json!(["a", "c"]));
    assert_eq!(patched["requestId"].as_str().unwrap().len(), 28);
    // A write that changes nothing still adds exactly one version.
    let (_, again, _) = s
        .call(
            "PATCH",
            "/sheets/10/rows/1003",
            Some(ADA_WRITE),
            Some(&json!({"version": 2, "cells": {}})),
        )
        .await;
    assert_eq!(again["version"], 3);
    assert_eq!(again["cells"], patched["cells"]);
    // Wrappers are stored with the value coerced and read back verbatim.
    let (_, wrapped, _) = s
        .call(
            "PATCH",
            "/sheets/10/rows/1003",
            Some(ADA_WRITE),
            Some(&json!({"version": 3, "cells": {"102": {"value": "7.5", "format": "0.0"}, "100": {"formula": "=A1"}}})),
        )
        .await;
    assert_eq!(wrapped["cells"]["102"], json!({"value": 7.5, "format": "0.0"}));
    assert_eq!(wrapped["cells"]["100"], json!({"formula": "=A1"}));
    assert_eq!(row(&s, 10, 1003).await["cells"], wrapped["cells"]);
}

#[actix_rt::test]
async fn patch_conflicts_classify_against_base_cells_and_bad_cells_are_422() {
    let s = TestServer::start().await;
    let patch = |v: Value| {
        let s = &s;
        async move { s.call("PATCH", "/sheets/10/rows/1000", Some(ADA_WRITE), Some(&v)).await }
    };
    let (status, _, _) = patch(json!({"version": 1, "cells": {"100": "changed by someone"}})).await;
    assert_eq!(status, 200);
    // A client based on version 1 changes Task (changed since) and Hours (not changed since).
    let stale = patch(json!({"version": 1, "cells": {"100": "mine", "102": 6},
                             "baseCells": {"100": "root", "101": "Done", "102": 5}}))
    .await;
    assert_error(&stale, 409, "version_conflict");
    let d = &stale.1["detail"];
    assert_eq!(d["currentVersion"], 2);
    assert_eq!(d["current"]["cells"]["100"], "changed by someone");
    assert_eq!(d["current"]["version"], 2);
    assert_eq!(d["conflictingColumns"], json!(["100"]));
    assert_eq!(d["mergeableColumns"], json!(["102"]));
    // baseCells is never trusted for the write: the row did not change.
    assert_eq!(row(&s, 10, 1000).await["version"], 2);
    let bad = patch(json!({"version": 2, "cells": {"101": "Maybe"}})).await;
    assert_error(&bad, 422, "validation_failed");
    assert_eq!(bad.1["detail"]["column_id"], 101);
    assert_error(&patch(json!({"version": 2, "cells": {"5": 1}})).await, 422, "validation_failed");
    // Order of checks: a missing row is 404 before its version or cells are looked at.
    let missing = s
        .call(
            "PATCH",
            "/sheets/10/rows/1100",
            Some(ADA_WRITE),
            Some(&json!({"version": 9, "cells": {"x": 1}})),
        )
        .await;
    assert_error(&missing, 404, "not_found");
}

#[actix_rt::test]
async fn delete_removes_the_subtree_counters_attachments_and_emits_events() {
    let s = TestServer::start().await;
    let service = s.running().state.try_service().unwrap();
    let before = service.counts();
    assert_eq!((before.attachments, before.attachment_bytes), (2, 150));
    let (status, body, headers) =
        s.call("DELETE", "/sheets/10/rows/1000", Some(ADA_WRITE), None).await;
    assert_eq!(status, 204);
    assert_eq!(body, Value::Null, "204 has no body");
    assert!(headers.get("x-request-id").is_some());
    let (_, sheet, _) = s.get("/sheets/10", ADA_READ).await;
    assert_eq!(sheet["rowCount"], 1);
    assert_eq!(ids(&sheet["rows"]["data"]), [1003]);
    let after = service.counts();
    assert_eq!(
        (after.attachments, after.attachment_bytes),
        (0, 0),
        "the subtree's attachments are freed"
    );
    let events = service.events(0, 100);
    let deleted: Vec<(u64, u64, &str)> =
        events.iter().map(|e| (e.sheet_id, e.row_id, e.kind.as_str())).collect();
    assert_eq!(
        deleted,
        [(10, 1000, "ROW_DELETED"), (10, 1001, "ROW_DELETED"), (10, 1002, "ROW_DELETED")]
    );
    assert!(events.windows(2).all(|w| w[0].seq < w[1].seq));
    // Deleting again, a child of the deleted subtree, or a row of another sheet: 404.
    assert_error(
        &s.call("DELETE", "/sheets/10/rows/1000", Some(ADA_WRITE), None).await,
        404,
        "not_found",
    );
    assert_error(
        &s.call("DELETE", "/sheets/10/rows/1002", Some(ADA_WRITE), None).await,
        404,
        "not_found",
    );
    assert_error(
        &s.call("DELETE", "/sheets/10/rows/1100", Some(ADA_WRITE), None).await,
        404,
        "not_found",
    );
    assert_eq!(row(&s, 11, 1100).await["id"], 1100);
    // A patch through another sheet's path cannot reach the row either.
    let cross = s
        .call("PATCH", "/sheets/10/rows/1100", Some(ADA_WRITE), Some(&json!({"version": 1})))
        .await;
    assert_error(&cross, 404, "not_found");
}

#[actix_rt::test]
async fn read_only_keys_get_403_and_unreachable_sheets_404_for_every_write() {
    let s = TestServer::start().await;
    let writes: [(&str, &str, Option<Value>); 4] = [
        ("POST", "/sheets/10/rows:bulkAdd", Some(json!({"rows": [{"cells": {}}]}))),
        ("POST", "/sheets/10/rows:bulkUpdate", Some(json!({"rows": [{"id": 1000, "version": 1}]}))),
        ("PATCH", "/sheets/10/rows/1000", Some(json!({"version": 1}))),
        ("DELETE", "/sheets/10/rows/1000", None),
    ];
    for (method, path, body) in &writes {
        // ada-read: read ceiling on project 1.
        assert_error(&s.call(method, path, Some(ADA_READ), body.as_ref()).await, 403, "forbidden");
        // bob: account-wide write key, but his own role on sheet 10 is viewer.
        assert_error(&s.call(method, path, Some(BOB_ALL), body.as_ref()).await, 403, "forbidden");
        // A sheet-11 key does not reach sheet 10 at all.
        assert_error(
            &s.call(method, path, Some(ADA_SHEET11), body.as_ref()).await,
            404,
            "not_found",
        );
    }
    let (_, sheet, _) = s.get("/sheets/10", ADA_READ).await;
    assert_eq!(sheet["rowCount"], 4);
    assert_eq!(row(&s, 10, 1000).await["version"], 1);
}

#[actix_rt::test]
async fn row_ids_keep_increasing_across_restarts_and_deletes() {
    let mut s = TestServer::start().await;
    let add = json!({"rows": [{"cells": {}}, {"cells": {}}]});
    let (_, a, _) = s.post("/sheets/11/rows:bulkAdd", ADA_WRITE, &add).await;
    let last = a["results"][1]["row"]["id"].as_u64().unwrap();
    assert_eq!(
        s.call("DELETE", &format!("/sheets/11/rows/{last}"), Some(ADA_WRITE), None).await.0,
        204
    );
    s.restart().await;
    let (_, b, _) = s.post("/sheets/11/rows:bulkAdd", ADA_WRITE, &add).await;
    let next = b["results"][0]["row"]["id"].as_u64().unwrap();
    assert!(next > last, "{next} must be above the deleted {last}: ids are never reused");
    s.stop().await;
}

#[actix_rt::test]
async fn concurrent_writers_to_one_row_never_silently_overwrite() {
    let s = TestServer::start().await;
    // 20 writers all patch row 1003 at version 1: exactly one wins.
    let futures = (0..20).map(|i| {
        let body = json!({"version": 1, "cells": {"100": format!("writer {i}")}});
        let url = format!("{}/sheets/10/rows/1003", s.base);
        async move {
            send("PATCH", &url, Some(ADA_WRITE), &[], Some(body.to_string().into_bytes())).await
        }
    });
    let replies = futures_util::future::join_all(futures).await;
    let won: Vec<&Reply> = replies.iter().filter(|r| r.0 == 200).collect();
    assert_eq!(won.len(), 1);
    assert_eq!(replies.iter().filter(|r| r.0 == 409).count(), 19);
    let final_row = row(&s, 10, 1003).await;
    assert_eq!(final_row["version"], 2);
    assert_eq!(final_row["cells"]["100"], won[0].1["cells"]["100"]);
}

#[actix_rt::test]
async fn a_write_the_log_refused_is_never_revealed() {
    let s = TestServer::start().await;
    // The log goes away under a running server (as after a disk failure).
    s.running().state.try_service().unwrap().close().unwrap();
    let r = s
        .post("/sheets/11/rows:bulkAdd", ADA_WRITE, &json!({"rows": [{"cells": {"110": "ghost"}}]}))
        .await;
    assert_error(&r, 500, "internal_error");
    // The refused write never reached memory: reads go on from the durable state, without it.
    let (status, page, _) = s.get("/sheets/11/rows", ADA_READ).await;
    assert_eq!(status, 200, "{page}");
    let texts: Vec<&Value> =
        page["data"].as_array().unwrap().iter().map(|r| &r["cells"]["110"]).collect();
    assert_eq!(texts, [&json!("stock")], "{page}");
    let (status, sheet, _) = s.get("/sheets/11", ADA_READ).await;
    assert_eq!((status, &sheet["rowCount"]), (200, &json!(1)), "{sheet}");
}

/// `(loc, type)` of the one problem of a 422 validation body.
fn problem(r: &Reply) -> (Value, Value) {
    (r.1["detail"][0]["loc"].clone(), r.1["detail"][0]["type"].clone())
}

#[actix_rt::test]
async fn a_body_is_one_json_document_sent_as_application_json() {
    let s = TestServer::start().await;
    let url = format!("{}/sheets/10/rows:bulkAdd", s.base);
    let count = || async { s.get("/sheets/10", ADA_READ).await.1["rowCount"].clone() };
    let before = count().await;
    // Trailing garbage or a second document: not JSON, nothing written.
    for body in [r#"{"rows":[{}]} xyz"#, r#"{"rows":[{}]}{"rows":[{}]}"#, r#"{"rows":[{}]}]"#] {
        let r = s.raw("POST", &url, Some(ADA_WRITE), &[], Some(body.into())).await;
        assert_error(&r, 422, "validation_failed");
        assert_eq!(problem(&r), (json!(["body"]), json!("json_invalid")), "{body}");
    }
    // Anything but application/json (a charset other than utf-8 too), nothing written.
    for content_type in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonx",
        "application/json; charset=iso-8859-1",
    ] {
        let headers = [("Content-Type", content_type)];
        let r = s
            .raw("POST", &url, Some(ADA_WRITE), &headers, Some(br#"{"rows":[{}]}"#.to_vec()))
            .await;
        assert_error(&r, 422, "validation_failed");
        assert_eq!(
            problem(&r),
            (json!(["header", "Content-Type"]), json!("value_error")),
            "{content_type}"
        );
    }
    let patch = format!("{}/sheets/10/rows/1003", s.base);
    let r = s
        .raw(
            "PATCH",
            &patch,
            Some(ADA_WRITE),
            &[("Content-Type", "text/plain")],
            Some(br#"{"version":1}"#.to_vec()),
        )
        .await;
    assert_eq!(problem(&r), (json!(["header", "Content-Type"]), json!("value_error")));
    // No Content-Type at all (no HTTP client library leaves it out on its own).
    let addr = s.running().addr;
    let body = br#"{"rows":[{}]}"#;
    let request = format!(
        "POST /api/v1/sheets/10/rows:bulkAdd HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {ADA_WRITE}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let (status, head, answer) = http_bytes(addr, [request.as_bytes(), body].concat()).await;
    assert_eq!(status, 422, "{head}");
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer["errorCode"], "validation_failed");
    assert_eq!(answer["detail"][0]["loc"], json!(["header", "Content-Type"]));
    assert_eq!(answer["detail"][0]["type"], "missing");
    // The admin side reads its bodies the same way.
    let r = s
        .raw(
            "POST",
            &format!("{}/import", s.admin),
            Some(ADMIN_TOKEN),
            &[("Content-Type", "text/plain")],
            Some(b"{}".to_vec()),
        )
        .await;
    assert_eq!(problem(&r), (json!(["header", "Content-Type"]), json!("value_error")));
    assert_eq!(count().await, before, "nothing was written");
    // Parameters and case are JSON still; trailing whitespace is no second document.
    for content_type in
        ["application/json; charset=utf-8", "Application/JSON", "application/json;charset=UTF-8"]
    {
        let headers = [("Content-Type", content_type)];
        let r = s
            .raw("POST", &url, Some(ADA_WRITE), &headers, Some(b"{\"rows\":[{}]}\n \t".to_vec()))
            .await;
        assert_eq!((r.0, &r.1["succeededCount"]), (200, &json!(1)), "{content_type}: {}", r.1);
    }
}

#[actix_rt::test]
async fn integer_fields_take_any_integral_json_number() {
    let s = TestServer::start().await;
    // 1.0 and 1e0 are the integer 1, as JSON Schema's `integer` says.
    let (status, row, _) = s
        .call(
            "PATCH",
            "/sheets/10/rows/1003",
            Some(ADA_WRITE),
            Some(&json!({"version": 1.0, "cells": {"100": "a"}})),
        )
        .await;
    assert_eq!((status, &row["version"]), (200, &json!(2)), "{row}");
    let raw = br#"{"rows": [{"id": 1003.0, "version": 2e0, "cells": {"100": "b"}}]}"#.to_vec();
    let r = s
        .raw(
            "POST",
            &format!("{}/sheets/10/rows:bulkUpdate", s.base),
            Some(ADA_WRITE),
            &[],
            Some(raw),
        )
        .await;
    assert_eq!(r.0, 200, "{}", r.1);
    assert_eq!(r.1["results"][0]["status"], "succeeded", "{}", r.1);
    assert_eq!(r.1["results"][0]["row"]["version"], 3);
    // A fraction or a sign is still refused, where it is.
    for (body, loc, kind) in [
        (json!({"version": 3.5}), json!(["body", "version"]), "type_error"),
        (json!({"version": -3.0}), json!(["body", "version"]), "value_error"),
        (json!({"version": "3"}), json!(["body", "version"]), "type_error"),
    ] {
        let r = s.call("PATCH", "/sheets/10/rows/1003", Some(ADA_WRITE), Some(&body)).await;
        assert_error(&r, 422, "validation_failed");
        assert_eq!(problem(&r), (loc, json!(kind)), "{body}");
    }
    let r = s
        .post(
            "/sheets/10/rows:bulkUpdate",
            ADA_WRITE,
            &json!({"rows": [{"id": 1003.5, "version": 3}]}),
        )
        .await;
    assert_eq!(problem(&r), (json!(["body", "rows", 0, "id"]), json!("type_error")));
}

#[actix_rt::test]
async fn a_body_integer_beyond_the_documented_maximum_is_refused_before_the_write() {
    let s = TestServer::start().await;
    // The document bounds every integer of the write bodies as `int64`.
    let (_, doc, _) = s.call("GET", "/openapi.json", None, None).await;
    let schemas = &doc["components"]["schemas"];
    for (schema, field) in
        [("RowPatch", "version"), ("RowUpdateItem", "id"), ("RowUpdateItem", "version")]
    {
        let property = &schemas[schema]["properties"][field];
        assert_eq!((&property["type"], &property["format"]), (&json!("integer"), &json!("int64")));
    }
    let over = i64::MAX as u64 + 1;
    let url = format!("{}/sheets/10/rows/1003", s.base);
    // patchRow: a 422 at the field, not the If-Match check's 412 or the version check's 409.
    for if_match in [None, Some("\"1003.1\"")] {
        for body in [
            json!({"version": over, "cells": {"100": "x"}}).to_string(),
            r#"{"version": 1e19, "cells": {"100": "x"}}"#.to_owned(),
        ] {
            let headers: Vec<(&str, &str)> =
                if_match.map(|tag| ("If-Match", tag)).into_iter().collect();
            let r = s
                .raw("PATCH", &url, Some(ADA_WRITE), &headers, Some(body.clone().into_bytes()))
                .await;
            assert_error(&r, 422, "validation_failed");
            assert_eq!(problem(&r), (json!(["body", "version"]), json!("value_error")), "{body}");
        }
    }
    // The maximum itself is a version like any other: a stale one here.
    let body = json!({"version": i64::MAX, "cells": {"100": "x"}});
    let r = s.call("PATCH", "/sheets/10/rows/1003", Some(ADA_WRITE), Some(&body)).await;
    assert_error(&r, 409, "version_conflict");
    // bulkUpdateRows: the whole request is refused, naming the item's field.
    for (item, loc) in [
        (json!({"id": over, "version": 1}), json!(["body", "rows", 1, "id"])),
        (json!({"id": 1003, "version": over}), json!(["body", "rows", 1, "version"])),
    ] {
        let body = json!({"rows": [{"id": 1000, "version": 1, "cells": {"100": "y"}}, item]});
        let r = s.post("/sheets/10/rows:bulkUpdate", ADA_WRITE, &body).await;
        assert_error(&r, 422, "validation_failed");
        assert_eq!(problem(&r), (loc, json!("value_error")), "{body}");
    }
    for id in [1000, 1003] {
        assert_eq!(row(&s, 10, id).await["version"], 1, "row {id} was not written");
    }
}

#[actix_rt::test]
async fn a_cell_key_that_is_no_column_id_is_named_as_sent() {
    let s = TestServer::start().await;
    let (status, res, _) = s
        .post(
            "/sheets/10/rows:bulkAdd",
            ADA_WRITE,
            &json!({"rows": [{"cells": {"abc": 1}}, {"cells": {"+101": "Open"}}, {"cells": {"999": 1}}]}),
        )
        .await;
    assert_eq!(status, 200);
    let column_ids: Vec<Value> = res["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["error"]["detail"]["column_id"].clone())
        .collect();
    assert_eq!(column_ids, [json!("abc"), json!("+101"), json!(999)]);
    for r in res["results"].as_array().unwrap() {
        assert_eq!(r["error"]["errorCode"], "validation_failed");
        assert!(r["error"]["detail"]["reason"].as_str().unwrap().starts_with("no column with id"));
    }
    let r = s
        .call(
            "PATCH",
            "/sheets/10/rows/1003",
            Some(ADA_WRITE),
            Some(&json!({"version": 1, "cells": {"0101": "x"}})),
        )
        .await;
    assert_error(&r, 422, "validation_failed");
    assert_eq!(r.1["detail"]["column_id"], "0101");
}
