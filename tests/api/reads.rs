//! Every read endpoint and field, paging, the 401/404/422 bodies, restart and torn-tail
//! recovery.

use serde_json::{json, Value};

use crate::common::*;

fn keys_of(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

#[actix_rt::test]
async fn get_me_shows_identity_scopes_and_window() {
    let s = TestServer::start().await;
    let (status, body, headers) = s.get("/me", ADA_WRITE).await;
    assert_eq!(status, 200);
    assert_eq!(keys_of(&body), ["keyId", "ownerId", "rateLimit", "requestId", "scopes"]);
    assert_eq!(body["keyId"], 1);
    assert_eq!(body["ownerId"], 1);
    assert_eq!(body["scopes"], json!([{"verb": "write", "scopeType": "project", "scopeId": 1}]));
    assert_eq!(body["rateLimit"]["limit"], 100_000);
    assert_eq!(body["rateLimit"]["remaining"], 99_999);
    assert!(body["rateLimit"]["reset"].as_i64().unwrap() > 1_700_000_000);
    assert_eq!(
        headers.get("x-request-id").unwrap().to_str().unwrap(),
        body["requestId"].as_str().unwrap()
    );
    let (_, bob, _) = s.get("/me", BOB_ALL).await;
    assert_eq!(bob["scopes"], json!([{"verb": "write", "scopeType": "account", "scopeId": null}]));
}

#[actix_rt::test]
async fn list_sheets_shows_only_reachable_sheets_with_exact_fields() {
    let s = TestServer::start().await;
    let (status, body, _) = s.get("/sheets", ADA_WRITE).await;
    assert_eq!(status, 200);
    assert_eq!(keys_of(&body), ["data", "nextCursor", "requestId"]);
    let ids: Vec<u64> =
        body["data"].as_array().unwrap().iter().map(|s| s["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [10, 11], "project 2 is not ada's");
    let tasks = &body["data"][0];
    assert_eq!(
        keys_of(tasks),
        ["columnCount", "createdAt", "id", "name", "projectId", "rowCount", "updatedAt"]
    );
    assert_eq!((tasks["name"].as_str(), tasks["projectId"].as_u64()), (Some("Tasks"), Some(1)));
    assert_eq!((tasks["columnCount"].as_u64(), tasks["rowCount"].as_u64()), (Some(9), Some(4)));
    assert_eq!(body["nextCursor"], Value::Null);

    // bob: owner of project 2, viewer of folder 5 (sheet 10 only).
    let (_, bob, _) = s.get("/sheets", BOB_ALL).await;
    let ids: Vec<u64> =
        bob["data"].as_array().unwrap().iter().map(|s| s["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [10, 20]);
    // A sheet-scoped key sees its sheet only.
    let (_, one, _) = s.get("/sheets", ADA_SHEET11).await;
    assert_eq!(one["data"].as_array().unwrap().len(), 1);
    assert_eq!(one["data"][0]["id"], 11);
}

#[actix_rt::test]
async fn get_sheet_has_columns_and_first_rows_page_and_hides_internals() {
    let s = TestServer::start().await;
    let (status, body, _) = s.get("/sheets/10?limit=2", ADA_READ).await;
    assert_eq!(status, 200);
    assert_eq!(
        keys_of(&body),
        [
            "columnCount",
            "columns",
            "createdAt",
            "id",
            "name",
            "projectId",
            "requestId",
            "rowCount",
            "rows",
            "updatedAt"
        ]
    );
    let cols = body["columns"].as_array().unwrap();
    assert_eq!(cols.len(), 9);
    assert_eq!(
        cols[0],
        json!({"id": 100, "sheetId": 10, "name": "Task", "type": "text", "position": 0, "primary": true})
    );
    assert_eq!(cols[1]["options"], json!(["Open", "Done"]));
    assert!(cols[2].get("options").is_none(), "no options on a number column");
    let types: Vec<&str> = cols.iter().map(|c| c["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "text",
            "dropdown",
            "number",
            "checkbox",
            "date",
            "datetime",
            "contact",
            "multi_select",
            "symbol"
        ]
    );
    assert_eq!(keys_of(&body["rows"]), ["data", "nextCursor"]);
    let rows = body["rows"]["data"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    let row = &rows[0];
    assert_eq!(
        keys_of(row),
        ["cells", "createdAt", "id", "sheetId", "updatedAt", "updatedBy", "version"]
    );
    assert_eq!(row["cells"], json!({"100": "root", "101": "Done", "102": 5}));
    assert_eq!(row["version"], 1);
    assert_eq!(keys_of(&row["updatedBy"]), ["source"]);
    // The inline cursor continues on listRows.
    let cursor = body["rows"]["nextCursor"].as_str().unwrap();
    let (status, next, _) =
        s.get(&format!("/sheets/10/rows?limit=2&cursor={cursor}"), ADA_READ).await;
    assert_eq!(status, 200);
    let ids: Vec<u64> =
        next["data"].as_array().unwrap().iter().map(|r| r["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [1002, 1003]);
    assert_eq!(next["nextCursor"], Value::Null);
    // Stored values come back coerced: datetime normalized to UTC, lists kept.
    let other = &next["data"][1]["cells"];
    assert_eq!(other["105"], "2026-02-01T01:00:00Z");
    assert_eq!(other["107"], json!(["a", "c"]));
}

#[actix_rt::test]
async fn list_columns_is_by_position_with_null_cursor() {
    let s = TestServer::start().await;
    let (status, body, _) = s.get("/sheets/11/columns", ADA_READ).await;
    assert_eq!(status, 200);
    let ids: Vec<u64> =
        body["data"].as_array().unwrap().iter().map(|c| c["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [111, 110, 112], "ordered by position, not id");
    assert_eq!(body["nextCursor"], Value::Null);
}

#[actix_rt::test]
async fn reports_list_and_get_expose_metadata_only() {
    let s = TestServer::start().await;
    let (status, body, _) = s.get("/reports", ADA_READ).await;
    assert_eq!(status, 200);
    assert_eq!(
        body["data"],
        json!([
            {"id": 7, "name": "Done", "type": "row", "projectId": 1},
            {"id": 8, "name": "By status", "type": "summary", "projectId": 1}
        ])
    );
    let (status, one, _) = s.get("/reports/8", ADA_READ).await;
    assert_eq!(status, 200);
    assert_eq!(
        without_request_id(one),
        json!({"id": 8, "name": "By status", "type": "summary", "projectId": 1})
    );
    // Bob views folder 5 only: no project-level role on project 1, so its reports are hidden.
    let (_, bob, _) = s.get("/reports", BOB_ALL).await;
    assert_eq!(bob["data"], json!([{"id": 9, "name": "Bob's", "type": "row", "projectId": 2}]));
    let missing = s.get("/reports/7", BOB_ALL).await;
    assert_error(&missing, 404, "not_found");
}

#[actix_rt::test]
async fn rows_page_through_many_pages_without_skips_or_repeats_and_clamp_at_500() {
    let s = TestServer::start().await;
    // 1202 rows more in sheet 11.
    for chunk in 0..3 {
        let n = if chunk < 2 { 500 } else { 202 };
        let rows: Vec<Value> =
            (0..n).map(|i| json!({"cells": {"110": format!("r{chunk}-{i}")}})).collect();
        let (status, body, _) =
            s.post("/sheets/11/rows:bulkAdd", ADA_WRITE, &json!({"rows": rows})).await;
        assert_eq!(status, 200);
        assert_eq!(body["failedCount"], 0);
    }
    let (_, all, _) = s.get("/sheets/11/rows?limit=1000", ADA_READ).await;
    assert_eq!(all["data"].as_array().unwrap().len(), 500, "1000 is clamped to 500");
    let (status, huge, _) = s.get("/sheets/11/rows?limit=99999999999999999999999", ADA_READ).await;
    assert_eq!(
        (status, huge["data"].as_array().unwrap().len()),
        (200, 500),
        "any integer above 500 clamps"
    );
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/sheets/11/rows?limit=128&cursor={c}"),
            None => "/sheets/11/rows?limit=128".to_string(),
        };
        let (status, page, _) = s.get(&path, ADA_READ).await;
        assert_eq!(status, 200);
        pages += 1;
        seen.extend(page["data"].as_array().unwrap().iter().map(|r| r["id"].as_u64().unwrap()));
        if pages == 2 {
            // Rows added during iteration land after the cursor and are seen once.
            let (status, _, _) = s
                .post("/sheets/11/rows:bulkAdd", ADA_WRITE, &json!({"rows": [{"cells": {}}]}))
                .await;
            assert_eq!(status, 200);
        }
        match page["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen.len(), 1 + 1202 + 1);
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted, seen, "ascending, no duplicates");
    assert_eq!(pages, 10);
}

#[actix_rt::test]
async fn sheets_and_reports_lists_page_with_their_own_cursors() {
    let s = TestServer::start().await;
    let (_, p1, _) = s.get("/sheets?limit=1", BOB_ALL).await;
    assert_eq!(p1["data"][0]["id"], 10);
    let c = p1["nextCursor"].as_str().unwrap().to_owned();
    let (_, p2, _) = s.get(&format!("/sheets?limit=1&cursor={c}"), BOB_ALL).await;
    assert_eq!(p2["data"][0]["id"], 20);
    assert_eq!(p2["nextCursor"], Value::Null);
    // A sheets cursor is refused by the reports list and by listRows.
    assert_error(&s.get(&format!("/reports?cursor={c}"), BOB_ALL).await, 422, "validation_failed");
    assert_error(
        &s.get(&format!("/sheets/10/rows?cursor={c}"), BOB_ALL).await,
        422,
        "validation_failed",
    );
    let (_, r1, _) = s.get("/reports?limit=1", ADA_READ).await;
    let rc = r1["nextCursor"].as_str().unwrap();
    let (_, r2, _) = s.get(&format!("/reports?limit=1&cursor={rc}"), ADA_READ).await;
    assert_eq!(r2["data"][0]["id"], 8);
}

#[actix_rt::test]
async fn every_validation_error_has_the_contract_body() {
    let s = TestServer::start().await;
    let loc = |r: &Reply| r.1["detail"][0]["loc"].clone();
    for (path, expected) in [
        ("/sheets?limit=0", json!(["query", "limit"])),
        ("/sheets?limit=-5", json!(["query", "limit"])),
        ("/sheets?limit=abc", json!(["query", "limit"])),
        ("/sheets?limit=1.5", json!(["query", "limit"])),
        ("/sheets?limit=-99999999999999999999", json!(["query", "limit"])),
        ("/sheets?limit=1e3", json!(["query", "limit"])),
        ("/sheets/10/rows?limit=0", json!(["query", "limit"])),
        ("/sheets/10?limit=x", json!(["query", "limit"])),
        ("/reports?limit=", json!(["query", "limit"])),
        ("/sheets?cursor=garbage", json!(["query", "cursor"])),
        ("/sheets/10/rows?cursor=AAAA", json!(["query", "cursor"])),
        ("/sheets/abc", json!(["path", "sheet_id"])),
        ("/sheets/-1/rows", json!(["path", "sheet_id"])),
        ("/sheets/1.5/columns", json!(["path", "sheet_id"])),
        ("/sheets/+10", json!(["path", "sheet_id"])),
        ("/sheets/+10/rows", json!(["path", "sheet_id"])),
        ("/reports/x", json!(["path", "report_id"])),
        ("/reports/+7", json!(["path", "report_id"])),
        ("/sheets?cursor=", json!(["query", "cursor"])),
        ("/sheets/10/rows?cursor=", json!(["query", "cursor"])),
    ] {
        let r = s.get(path, ADA_READ).await;
        assert_error(&r, 422, "validation_failed");
        assert_eq!(loc(&r), expected, "{path}: {}", r.1);
        let item = &r.1["detail"][0];
        assert!(item["msg"].is_string() && item["type"].is_string(), "{path}: {item}");
    }
    // A cursor of another sheet, and one altered by a byte.
    let (_, page, _) = s.get("/sheets/10/rows?limit=1", ADA_READ).await;
    let c = page["nextCursor"].as_str().unwrap().to_owned();
    assert_eq!(
        loc(&s.get(&format!("/sheets/11/rows?cursor={c}"), ADA_READ).await),
        json!(["query", "cursor"])
    );
    let mut altered = c.clone().into_bytes();
    let last = altered.len() - 3;
    altered[last] = if altered[last] == b'A' { b'B' } else { b'A' };
    let altered = String::from_utf8(altered).unwrap();
    assert_error(
        &s.get(&format!("/sheets/10/rows?cursor={altered}"), ADA_READ).await,
        422,
        "validation_failed",
    );
    // Bodies: not JSON, missing rows, 0 rows, 2001 rows, version < 1, a wrong type.
    for (path, body, expected) in [
        ("/sheets/10/rows:bulkAdd", "not json".to_string(), json!(["body"])),
        ("/sheets/10/rows:bulkAdd", "{}".to_string(), json!(["body", "rows"])),
        ("/sheets/10/rows:bulkAdd", r#"{"rows": []}"#.to_string(), json!(["body", "rows"])),
        (
            "/sheets/10/rows:bulkAdd",
            json!({"rows": vec![json!({}); 2001]}).to_string(),
            json!(["body", "rows"]),
        ),
        (
            "/sheets/10/rows:bulkAdd",
            r#"{"rows": [{"cells": 5}]}"#.to_string(),
            json!(["body", "rows", 0, "cells"]),
        ),
        (
            "/sheets/10/rows:bulkUpdate",
            r#"{"rows": [{"id": 1000, "version": 0}]}"#.to_string(),
            json!(["body", "rows", 0, "version"]),
        ),
        (
            "/sheets/10/rows:bulkUpdate",
            r#"{"rows": [{"id": "x", "version": 1}]}"#.to_string(),
            json!(["body", "rows", 0, "id"]),
        ),
    ] {
        let r = s
            .raw(
                "POST",
                &format!("{}{path}", s.base),
                Some(ADA_WRITE),
                &[],
                Some(body.into_bytes()),
            )
            .await;
        assert_error(&r, 422, "validation_failed");
        assert_eq!(loc(&r), expected, "{path}: {}", r.1);
    }
    let r = s
        .raw(
            "PATCH",
            &format!("{}/sheets/10/rows/1000", s.base),
            Some(ADA_WRITE),
            &[],
            Some(br#"{"version": 0}"#.to_vec()),
        )
        .await;
    assert_eq!(loc(&r), json!(["body", "version"]));
}

#[actix_rt::test]
async fn unauthorized_bodies_are_identical_for_every_bad_key() {
    let s = TestServer::start().await;
    let url = format!("{}/sheets", s.base);
    let mut bodies = Vec::new();
    for header in [
        None,
        Some("Basic abc"),
        Some("Bearer"),
        Some("Bearer nope"),
        Some("Bearer svc_live_short"),
        Some("Bearer svc_live_UnknownKey000000000000000000000000000"),
    ] {
        let headers: Vec<(&str, &str)> = header.map(|h| ("Authorization", h)).into_iter().collect();
        let r = s.raw("GET", &url, None, &headers, None).await;
        assert_error(&r, 401, "unauthorized");
        bodies.push(without_request_id(r.1));
    }
    // Expired key: import one that expired yesterday.
    let (status, _, _) = s
        .admin_call(
            "POST",
            "/import",
            Some(&json!({"keys": [{"id": 50, "ownerId": 1, "name": "old", "secret": "svc_live_ExpiredKey00000000000000000000000050",
                "grants": [{"verb": "read", "scopeType": "account"}], "expiresAt": "2020-01-01T00:00:00Z"}]})),
        )
        .await;
    assert_eq!(status, 200);
    let r = s.get("/sheets", "svc_live_ExpiredKey00000000000000000000000050").await;
    assert_error(&r, 401, "unauthorized");
    bodies.push(without_request_id(r.1));
    // Revoked key.
    assert_eq!(s.get("/me", ADA_SHEET11).await.0, 200);
    assert_eq!(s.admin_call("POST", "/keys/4/revoke", None).await.0, 200);
    let r = s.get("/sheets", ADA_SHEET11).await;
    assert_error(&r, 401, "unauthorized");
    bodies.push(without_request_id(r.1));
    assert_eq!(bodies.len(), 8);
    assert!(bodies.windows(2).all(|w| w[0] == w[1]), "{bodies:?}");
}

#[actix_rt::test]
async fn missing_and_out_of_scope_objects_give_identical_404s() {
    let s = TestServer::start().await;
    // Sheet 20 and report 9 exist but are bob's; 99 exists nowhere.
    for (out_of_scope, missing) in [
        ("/sheets/20", "/sheets/99"),
        ("/sheets/20/rows", "/sheets/99/rows"),
        ("/sheets/20/columns", "/sheets/99/columns"),
        ("/reports/9", "/reports/99"),
    ] {
        let a = s.get(out_of_scope, ADA_WRITE).await;
        let b = s.get(missing, ADA_WRITE).await;
        assert_error(&a, 404, "not_found");
        assert_error(&b, 404, "not_found");
        let id = |p: &str| p.split('/').nth(2).unwrap().to_owned();
        let norm = |v: Value, id: String| without_request_id(v).to_string().replace(&id, "#");
        assert_eq!(
            norm(a.1, id(out_of_scope)),
            norm(b.1, id(missing)),
            "{out_of_scope} vs {missing}"
        );
    }
    // A sheet-scoped key cannot see sheet 10 although its owner can.
    assert_error(&s.get("/sheets/10", ADA_SHEET11).await, 404, "not_found");
}

#[actix_rt::test]
async fn unknown_routes_and_methods_are_404_envelopes() {
    let s = TestServer::start().await;
    assert_error(&s.get("/nope", ADA_READ).await, 404, "not_found");
    assert_error(&s.call("DELETE", "/sheets/10", Some(ADA_READ), None).await, 404, "not_found");
    assert_error(&s.call("PUT", "/me", Some(ADA_READ), None).await, 404, "not_found");
    let r = s
        .raw("GET", &format!("{}/api/v2/me", s.base.trim_end_matches("/api/v1")), None, &[], None)
        .await;
    assert_eq!(r.0, 404);
}

#[actix_rt::test]
async fn a_restart_serves_identical_reads() {
    let mut s = TestServer::start().await;
    let (status, _, _) = s
        .post("/sheets/10/rows:bulkAdd", ADA_WRITE, &json!({"rows": [{"cells": {"100": "new"}}]}))
        .await;
    assert_eq!(status, 200);
    let paths = [
        "/me",
        "/sheets",
        "/sheets/10",
        "/sheets/10/columns",
        "/sheets/10/rows",
        "/reports",
        "/reports/7",
    ];
    let mut before = Vec::new();
    for p in paths {
        before.push(without_request_id(s.get(p, ADA_WRITE).await.1));
    }
    s.restart().await;
    for (p, b) in paths.iter().zip(&before) {
        let mut now = without_request_id(s.get(p, ADA_WRITE).await.1);
        if *p == "/me" {
            now["rateLimit"] = b["rateLimit"].clone();
        }
        assert_eq!(&now, b, "{p}");
    }
}

#[actix_rt::test]
async fn a_torn_last_record_is_dropped_and_everything_before_it_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let (mut bin, data) = Binary::seeded(dir.path()).await;
    let add = |text: &'static str| json!({"rows": [{"cells": {"100": text}}]});
    let (_, first, _) = send(
        "POST",
        &format!("{}/sheets/10/rows:bulkAdd", bin.base),
        Some(ADA_WRITE),
        &[],
        Some(add("kept").to_string().into_bytes()),
    )
    .await;
    let kept = first["results"][0]["row"]["id"].as_u64().unwrap();
    let (_, second, _) = send(
        "POST",
        &format!("{}/sheets/10/rows:bulkAdd", bin.base),
        Some(ADA_WRITE),
        &[],
        Some(add("torn").to_string().into_bytes()),
    )
    .await;
    let torn = second["results"][0]["row"]["id"].as_u64().unwrap();
    bin.kill9();
    // The crash left the last record half written.
    let len = wal::testing::last_frame_len(&data).unwrap();
    wal::testing::tear_last_record(&data, len / 2).unwrap();
    let bin = Binary::start(&data, &[]).await;
    let (status, rows, _) =
        send("GET", &format!("{}/sheets/10/rows", bin.base), Some(ADA_READ), &[], None).await;
    assert_eq!(status, 200);
    let ids: Vec<u64> =
        rows["data"].as_array().unwrap().iter().map(|r| r["id"].as_u64().unwrap()).collect();
    assert!(ids.contains(&kept), "{ids:?}");
    assert!(!ids.contains(&torn), "the torn write is gone: {ids:?}");
    assert!(ids.contains(&1003), "the seed is intact: {ids:?}");
    let log = std::fs::read_to_string(&bin.log).unwrap();
    assert!(log.contains("torn_tail_dropped=true"), "start-up says what it dropped: {log}");
}

#[actix_rt::test]
async fn a_path_id_with_a_sign_is_refused_like_a_fraction() {
    let s = TestServer::start().await;
    for path in ["/sheets/+10", "/sheets/1.5"] {
        let r = s.get(path, ADA_READ).await;
        assert_error(&r, 422, "validation_failed");
        assert_eq!(r.1["detail"][0]["loc"], json!(["path", "sheet_id"]), "{path}");
        assert_eq!(r.1["detail"][0]["type"], "int_parsing", "{path}");
    }
    let r = s
        .call("PATCH", "/sheets/10/rows/+1003", Some(ADA_WRITE), Some(&json!({"version": 1})))
        .await;
    assert_eq!(r.1["detail"][0]["loc"], json!(["path", "row_id"]));
    assert_eq!(s.get("/sheets/10", ADA_READ).await.0, 200, "digits alone still resolve");
}

#[actix_rt::test]
async fn head_answers_every_get_route_as_get_without_a_body() {
    let s = TestServer::start().await;
    for (path, key) in [
        ("/me", Some(ADA_READ)),
        ("/sheets", Some(ADA_READ)),
        ("/sheets/10?limit=2", Some(ADA_READ)),
        ("/sheets/10/columns", Some(ADA_READ)),
        ("/sheets/10/rows", Some(ADA_READ)),
        ("/reports", Some(ADA_READ)),
        ("/reports/7", Some(ADA_READ)),
        ("/openapi.json", None),
        ("/docs", None),
    ] {
        let url = format!("{}{path}", s.base);
        let (get_status, _, get_headers) = s.raw("GET", &url, key, &[], None).await;
        let (status, body, headers) = s.raw("HEAD", &url, key, &[], None).await;
        assert_eq!((status, get_status), (200, 200), "HEAD {path}");
        assert_eq!(body, Value::Null, "HEAD {path} has no body");
        for h in ["x-request-id", "x-ratelimit-limit", "x-ratelimit-remaining", "content-type"] {
            assert!(headers.get(h).is_some(), "HEAD {path}: {h}");
        }
        assert_eq!(headers.get("content-type"), get_headers.get("content-type"), "HEAD {path}");
    }
    // Errors keep their status and headers, without the body.
    let url = format!("{}/sheets/99", s.base);
    let (status, body, headers) = s.raw("HEAD", &url, Some(ADA_READ), &[], None).await;
    assert_eq!((status, body), (404, Value::Null));
    assert!(headers.get("x-request-id").is_some());
    let (status, _, headers) = s.raw("HEAD", &format!("{}/me", s.base), None, &[], None).await;
    assert_eq!(status, 401);
    assert_eq!(headers.get("www-authenticate").unwrap(), "Bearer");
    // Only GET routes: HEAD of a write is an unknown method, the usual 404.
    let url = format!("{}/sheets/10/rows:bulkAdd", s.base);
    assert_eq!(s.raw("HEAD", &url, Some(ADA_WRITE), &[], None).await.0, 404);
    assert_eq!(s.raw("GET", &url, Some(ADA_WRITE), &[], None).await.0, 404);
}

/// Requests actix-http's own parser refuses before any service runs: `(what, request)`.
fn unparseable(addr: std::net::SocketAddr) -> Vec<(&'static str, Vec<u8>)> {
    let get = |target: String, extra: &str| {
        format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\n{extra}Connection: close\r\n\r\n")
            .into_bytes()
    };
    let many_params: Vec<String> = (0..10_000).map(|i| format!("p{i}=1")).collect();
    let many_headers: String = (0..1000).map(|i| format!("X-H{i}: 1\r\n")).collect();
    vec![
        ("a 64 KB URI", get(format!("/api/v1/me?q={}", "a".repeat(64 * 1024)), "")),
        ("10,000 query parameters", get(format!("/api/v1/me?{}", many_params.join("&")), "")),
        ("1,000 headers", get("/api/v1/me".into(), &many_headers)),
        ("a control character in a header", get("/api/v1/me".into(), "X-Bad: a\u{1}b\r\n")),
        (
            "Content-Length and Transfer-Encoding",
            format!(
                "POST /api/v1/sheets/10/rows:bulkAdd HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 5\r\n\
                 Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n"
            )
            .into_bytes(),
        ),
    ]
}

#[actix_rt::test]
async fn requests_the_http_parser_refuses_get_a_bare_400_or_431() {
    // actix-http answers these itself, before the service (and so the envelope) runs; the
    // README says so. This pins what a client sees, so a framework change that lets the
    // service shape them shows up here.
    let s = TestServer::start().await;
    let addr = s.running().addr;
    for (what, request) in unparseable(addr) {
        let (status, head, body) = http_bytes(addr, request).await;
        let expected = if what == "1,000 headers" { 431 } else { 400 };
        assert_eq!(status, expected, "{what}: {head}");
        assert!(body.is_empty(), "{what}");
    }
    assert_eq!(s.get("/me", ADA_READ).await.0, 200, "the server keeps serving");
}

#[actix_rt::test]
async fn requests_the_http_parser_refuses_are_not_logged_as_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (bin, _) = Binary::seeded(dir.path()).await;
    let addr: std::net::SocketAddr =
        bin.base.trim_start_matches("http://").trim_end_matches("/api/v1").parse().unwrap();
    for (what, request) in unparseable(addr) {
        let (status, _, _) = http_bytes(addr, request).await;
        assert!(status == 400 || status == 431, "{what}: {status}");
    }
    // A request through the service after them: once its line is logged, theirs would be too.
    let (status, _, _) =
        send("GET", &format!("{}/nope", bin.base), Some(ADA_READ), &[], None).await;
    assert_eq!(status, 404);
    let mut log = String::new();
    for _ in 0..100 {
        log = std::fs::read_to_string(&bin.log).unwrap();
        if log.contains("route=<unmatched>") {
            break;
        }
        actix_rt::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(log.contains("route=<unmatched>"), "{log}");
    assert!(!log.contains("ERROR"), "{log}");
}
