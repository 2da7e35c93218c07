//! getRow and conditional requests (docs/spec/extensions.md X1, X2): `ETag` on the reads,
//! `If-None-Match` answered with 304, `If-Match` answered with 412 on patchRow and deleteRow, and a
//! 412 stored under an `Idempotency-Key` like a 409.

use std::time::Duration;

use actix_web::http::header::HeaderMap;
use serde_json::{json, Value};

use crate::common::*;

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

fn etag(r: &Reply) -> String {
    header(&r.2, "etag").unwrap_or_else(|| panic!("no ETag on {} {}", r.0, r.1)).to_owned()
}

/// A request to the public API with extra headers.
async fn call(
    s: &TestServer,
    method: &str,
    path: &str,
    key: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> Reply {
    let url = format!("{}{path}", s.base);
    send(method, &url, Some(key), headers, body.map(|b| b.to_string().into_bytes())).await
}

async fn get_if_none_match(s: &TestServer, path: &str, tag: &str) -> Reply {
    call(s, "GET", path, ADA_READ, &[("If-None-Match", tag)], None).await
}

/// `(status, body bytes, headers)`: for comparing a replay byte for byte.
async fn send_bytes(
    s: &TestServer,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> (u16, Vec<u8>, HeaderMap) {
    let client = awc::Client::builder().timeout(Duration::from_secs(60)).finish();
    let mut req = client
        .request(method.parse().unwrap(), format!("{}{path}", s.base))
        .insert_header(("Authorization", format!("Bearer {ADA_WRITE}")));
    for (n, v) in headers {
        req = req.insert_header((*n, *v));
    }
    let mut res = match body {
        Some(body) => {
            req.insert_header(("Content-Type", "application/json"))
                .send_body(body.to_string())
                .await
        }
        None => req.send().await,
    }
    .expect("request sent");
    let bytes = res.body().await.expect("body read").to_vec();
    (res.status().as_u16(), bytes, res.headers().clone())
}

/// The error body without its request id.
fn error_body(r: &Reply) -> Value {
    without_request_id(r.1.clone())
}

#[actix_rt::test]
async fn get_row_shows_the_row_with_its_etag() {
    let s = TestServer::start().await;
    let got = s.get("/sheets/10/rows/1003", ADA_READ).await;
    assert_eq!(got.0, 200, "{}", got.1);
    assert_eq!(header(&got.2, "content-type"), Some("application/json"));
    assert_eq!(etag(&got), "\"1003.1\"");
    assert_eq!(got.1["requestId"].as_str(), header(&got.2, "x-request-id"));
    let mut fields: Vec<&str> = got.1.as_object().unwrap().keys().map(String::as_str).collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        ["cells", "createdAt", "id", "requestId", "sheetId", "updatedAt", "updatedBy", "version"]
    );
    assert_eq!((got.1["id"].as_u64(), got.1["sheetId"].as_u64()), (Some(1003), Some(10)));
    assert_eq!(got.1["version"], 1);
    assert_eq!(got.1["updatedBy"], json!({"source": "import"}));
    assert_eq!(
        got.1["cells"],
        json!({"100": "other", "101": "Done", "102": 8, "103": true, "104": "2026-01-31",
               "105": "2026-02-01T01:00:00Z", "106": "x@y.z", "107": ["a", "c"], "108": "Red"})
    );
    // The same row as every other read shows it.
    let page = s.get("/sheets/10/rows", ADA_READ).await.1;
    let listed = page["data"].as_array().unwrap().iter().find(|r| r["id"] == 1003).unwrap();
    assert_eq!(&without_request_id(got.1.clone()), listed);

    // A write shows at once, with the next version's tag.
    let patch = json!({"version": 1, "cells": {"101": "Open"}});
    let patched = s.call("PATCH", "/sheets/10/rows/1003", Some(ADA_WRITE), Some(&patch)).await;
    assert_eq!(patched.0, 200, "{}", patched.1);
    let again = s.get("/sheets/10/rows/1003", ADA_READ).await;
    assert_eq!((again.0, etag(&again)), (200, "\"1003.2\"".to_owned()));
    assert_eq!(without_request_id(again.1.clone()), without_request_id(patched.1));
    assert_eq!(again.1["cells"]["101"], "Open");

    // HEAD: the status and headers of GET, no body.
    let head = s.call("HEAD", "/sheets/10/rows/1003", Some(ADA_READ), None).await;
    assert_eq!((head.0, &head.1, etag(&head)), (200, &Value::Null, "\"1003.2\"".to_owned()));
}

#[actix_rt::test]
async fn get_row_answers_404_as_the_writes_to_that_path_do() {
    let s = TestServer::start().await;
    let deleted = s.call("DELETE", "/sheets/10/rows/1002", Some(ADA_WRITE), None).await;
    assert_eq!(deleted.0, 204);
    let patch = json!({"version": 1});
    for (path, message) in [
        ("/sheets/10/rows/999999", "Row 999999 in sheet 10 not found."),
        ("/sheets/10/rows/1002", "Row 1002 in sheet 10 not found."),
        ("/sheets/10/rows/1100", "Row 1100 in sheet 10 not found."),
        ("/sheets/20/rows/2000", "Sheet 20 not found."),
        ("/sheets/20/rows/2999", "Sheet 20 not found."),
        ("/sheets/99/rows/2000", "Sheet 99 not found."),
    ] {
        let got = s.get(path, ADA_WRITE).await;
        assert_error(&got, 404, "not_found");
        assert_eq!(
            error_body(&got),
            json!({"errorCode": "not_found", "message": message, "detail": null}),
            "{path}"
        );
        assert!(header(&got.2, "etag").is_none(), "{path}");
        let write = s.call("PATCH", path, Some(ADA_WRITE), Some(&patch)).await;
        assert_eq!(error_body(&write), error_body(&got), "{path}");
        // A conditional read of what the key cannot see is the same 404, never a 304.
        let conditional = get_if_none_match(&s, path, "*").await;
        assert_eq!(error_body(&conditional), error_body(&got), "{path}");
    }
    // A key scoped to sheet 11 cannot tell whether sheet 10's rows exist.
    let scoped = s.get("/sheets/10/rows/1003", ADA_SHEET11).await;
    assert_error(&scoped, 404, "not_found");
    assert_eq!(scoped.1["message"], "Sheet 10 not found.");
    assert_eq!(error_body(&scoped), error_body(&s.get("/sheets/10/rows/5", ADA_SHEET11).await));
    // Another owner's key reads its own sheet's row.
    let bob = s.get("/sheets/20/rows/2000", BOB_ALL).await;
    assert_eq!((bob.0, etag(&bob)), (200, "\"2000.1\"".to_owned()));

    let bad = s.get("/sheets/10/rows/1.5", ADA_READ).await;
    assert_error(&bad, 422, "validation_failed");
    assert_eq!(bad.1["detail"][0]["loc"], json!(["path", "row_id"]));
    let bad_sheet = s.get("/sheets/x/rows/1003", ADA_READ).await;
    assert_error(&bad_sheet, 422, "validation_failed");
    assert_eq!(bad_sheet.1["detail"][0]["loc"], json!(["path", "sheet_id"]));
}

#[actix_rt::test]
async fn a_matching_if_none_match_is_a_bodiless_304_with_every_header_counted_by_the_limit() {
    let s = TestServer::start_with(fixture(), |a| a.rate_limit_per_minute = 60).await;
    let remaining =
        |r: &Reply| -> u64 { header(&r.2, "x-ratelimit-remaining").unwrap().parse().unwrap() };
    for path in
        ["/sheets/10/rows/1003", "/sheets/10", "/sheets/10/columns", "/sheets/10/rows?limit=2"]
    {
        let full = s.get(path, ADA_READ).await;
        assert_eq!(full.0, 200, "{path}: {}", full.1);
        let tag = etag(&full);
        assert!(tag.starts_with('"') && tag.ends_with('"') && !tag.starts_with("W/"), "{tag}");

        let hit = get_if_none_match(&s, path, &tag).await;
        assert_eq!((hit.0, &hit.1), (304, &Value::Null), "{path}");
        assert_eq!(etag(&hit), tag, "{path}");
        let rid = header(&hit.2, "x-request-id").expect("X-Request-Id");
        assert!(rid.starts_with("req_") && rid != header(&full.2, "x-request-id").unwrap());
        assert_eq!(header(&hit.2, "x-ratelimit-limit"), Some("60"), "{path}");
        assert_eq!(remaining(&hit), remaining(&full) - 1, "{path}: a 304 counts");
        let reset: i64 = header(&hit.2, "x-ratelimit-reset").unwrap().parse().unwrap();
        assert!(reset > 1_700_000_000, "{reset}");
        assert!(header(&hit.2, "ratelimit").is_some_and(|v| v.starts_with("\"default\";r=")));
        assert_eq!(header(&hit.2, "ratelimit-policy"), Some("\"default\";q=60;w=60"));
        assert_eq!(header(&hit.2, "content-type"), None, "{path}");

        // Weak comparison, lists (in one field or several) and `*` all match.
        let weak = format!("W/{tag}");
        let list = format!("\"0.0.0\", {tag}");
        for value in [weak.as_str(), list.as_str(), "*"] {
            assert_eq!(get_if_none_match(&s, path, value).await.0, 304, "{path} {value}");
        }
        let split = call(
            &s,
            "GET",
            path,
            ADA_READ,
            &[("If-None-Match", "\"0.0.0\""), ("If-None-Match", &tag)],
            None,
        )
        .await;
        assert_eq!(split.0, 304, "{path}");
        let head = call(&s, "HEAD", path, ADA_READ, &[("If-None-Match", &tag)], None).await;
        assert_eq!((head.0, etag(&head)), (304, tag.clone()), "{path}");

        // Any other tag: the full answer, with the same ETag.
        let miss = get_if_none_match(&s, path, "\"0.0.0\"").await;
        assert_eq!((miss.0, etag(&miss)), (200, tag.clone()), "{path}");
        assert_eq!(without_request_id(miss.1), without_request_id(full.1), "{path}");
    }
}

#[actix_rt::test]
async fn etags_change_exactly_when_what_they_show_can_change() {
    let s = TestServer::start().await;
    let first = s.get("/sheets/10/rows?limit=2", ADA_READ).await;
    let cursor = first.1["nextCursor"].as_str().unwrap().to_owned();
    let paths = [
        "/sheets/10/rows/1003".to_owned(),
        "/sheets/10/rows/1000".to_owned(),
        "/sheets/10".to_owned(),
        "/sheets/10?limit=2".to_owned(),
        "/sheets/10/columns".to_owned(),
        "/sheets/10/rows".to_owned(),
        "/sheets/10/rows?limit=2".to_owned(),
        format!("/sheets/10/rows?limit=2&cursor={cursor}"),
        format!("/sheets/10/rows?limit=3&cursor={cursor}"),
    ];
    async fn tags(s: &TestServer, paths: &[String]) -> Vec<String> {
        let mut out = Vec::new();
        for p in paths {
            let r = s.get(p, ADA_READ).await;
            assert_eq!(r.0, 200, "{p}: {}", r.1);
            out.push(etag(&r));
        }
        out
    }
    let before = tags(&s, &paths).await;
    assert_eq!(before[0], "\"1003.1\"");
    assert_eq!(before[1], "\"1000.1\"");
    let mut distinct = before.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), paths.len(), "every read and query has its own tag: {before:?}");
    assert_eq!(tags(&s, &paths).await, before, "stable while nothing changes");
    // The query is normalized: the default limit and a clamped one name the same page.
    let same = |a: &str, b: &str| {
        let (a, b) = (a.to_owned(), b.to_owned());
        let s = &s;
        async move { assert_eq!(etag(&s.get(&a, ADA_READ).await), etag(&s.get(&b, ADA_READ).await)) }
    };
    same("/sheets/10/rows", "/sheets/10/rows?limit=100").await;
    same("/sheets/10/rows?limit=500", "/sheets/10/rows?limit=9000").await;

    // A write to another sheet changes nothing here; that sheet's tags move.
    let other_rows = etag(&s.get("/sheets/11/rows", ADA_READ).await);
    let other = json!({"version": 1, "cells": {"110": "moved"}});
    assert_eq!(s.call("PATCH", "/sheets/11/rows/1100", Some(ADA_WRITE), Some(&other)).await.0, 200);
    assert_ne!(etag(&s.get("/sheets/11/rows", ADA_READ).await), other_rows);
    assert_eq!(tags(&s, &paths).await, before);
    let still = get_if_none_match(&s, "/sheets/10/rows", &before[5]).await;
    assert_eq!(still.0, 304);

    // A write to row 1000: row 1003's tag stays, every other tag of the sheet moves.
    let patch = json!({"version": 1, "cells": {"102": 6}});
    assert_eq!(s.call("PATCH", "/sheets/10/rows/1000", Some(ADA_WRITE), Some(&patch)).await.0, 200);
    let after = tags(&s, &paths).await;
    assert_eq!(after[0], before[0], "another row's write leaves this row's tag");
    assert_eq!(after[1], "\"1000.2\"");
    for (i, path) in paths.iter().enumerate().skip(2) {
        assert_ne!(after[i], before[i], "{path}");
    }
    let stale = get_if_none_match(&s, "/sheets/10/rows", &before[5]).await;
    assert_eq!((stale.0, etag(&stale)), (200, after[5].clone()));
    assert_eq!(stale.1["data"][0]["cells"]["102"], 6);
    let fresh = get_if_none_match(&s, "/sheets/10/rows", &after[5]).await;
    assert_eq!(fresh.0, 304);

    // A delete moves the sheet's tags too.
    assert_eq!(s.call("DELETE", "/sheets/10/rows/1003", Some(ADA_WRITE), None).await.0, 204);
    assert_ne!(etag(&s.get("/sheets/10", ADA_READ).await), after[2]);
    assert_error(
        &get_if_none_match(&s, "/sheets/10/rows/1003", &before[0]).await,
        404,
        "not_found",
    );
}

#[actix_rt::test]
async fn if_match_guards_patch_and_delete_in_the_sheets_own_order() {
    let s = TestServer::start().await;
    let patch = |if_match: &'static str, body: Value| {
        let s = &s;
        async move {
            call(
                s,
                "PATCH",
                "/sheets/10/rows/1003",
                ADA_WRITE,
                &[("If-Match", if_match)],
                Some(&body),
            )
            .await
        }
    };
    let row = || async { s.get("/sheets/10/rows/1003", ADA_READ).await };

    // If-Match stands in for the body version.
    let ok = patch("\"1003.1\"", json!({"cells": {"100": "a"}})).await;
    assert_eq!((ok.0, &ok.1["version"], &ok.1["cells"]["100"]), (200, &json!(2), &json!("a")));

    // Stale: 412 with the current row, nothing written.
    let stale = patch("\"1003.1\"", json!({"cells": {"100": "b"}})).await;
    assert_error(&stale, 412, "precondition_failed");
    let current = row().await;
    assert_eq!(stale.1["detail"]["currentVersion"], 2);
    assert_eq!(stale.1["detail"]["current"], without_request_id(current.1.clone()));
    assert_eq!((current.1["version"].clone(), etag(&current)), (json!(2), "\"1003.2\"".into()));
    assert_eq!(current.1["cells"]["100"], "a");

    // Header and body disagree: 412, even though the header alone matches.
    let disagree = patch("\"1003.2\"", json!({"version": 1, "cells": {"100": "c"}})).await;
    assert_error(&disagree, 412, "precondition_failed");
    assert_eq!(disagree.1["detail"]["currentVersion"], 2);
    // Agreeing, and a list holding the current tag: written.
    let both = patch("\"1003.2\"", json!({"version": 2, "cells": {"100": "d"}})).await;
    assert_eq!((both.0, &both.1["version"]), (200, &json!(3)));
    let list = patch("\"1003.1\", \"1003.3\"", json!({"cells": {"100": "e"}})).await;
    assert_eq!((list.0, &list.1["version"]), (200, &json!(4)));
    // A weak tag never matches, nor does another row's tag or an unreadable value.
    for value in ["W/\"1003.4\"", "\"1000.4\"", "1003.4"] {
        let refused = call(
            &s,
            "PATCH",
            "/sheets/10/rows/1003",
            ADA_WRITE,
            &[("If-Match", value)],
            Some(&json!({"cells": {"100": "f"}})),
        )
        .await;
        assert_error(&refused, 412, "precondition_failed");
    }
    // `*`: the row exists; the body version is then checked as without the header.
    let any = patch("*", json!({"version": 4, "cells": {"100": "g"}})).await;
    assert_eq!((any.0, &any.1["version"]), (200, &json!(5)));
    assert_error(
        &patch("*", json!({"version": 4, "cells": {"100": "h"}})).await,
        409,
        "version_conflict",
    );
    assert_eq!(row().await.1["cells"]["100"], "g");
    // Without either, `version` is still required.
    let neither =
        s.call("PATCH", "/sheets/10/rows/1003", Some(ADA_WRITE), Some(&json!({"cells": {}}))).await;
    assert_error(&neither, 422, "validation_failed");
    assert_eq!(neither.1["detail"][0]["loc"], json!(["body", "version"]));

    // A missing row is 404 whatever If-Match says: there is no row to hold a precondition.
    for value in ["*", "\"999999.1\""] {
        let missing = call(
            &s,
            "PATCH",
            "/sheets/10/rows/999999",
            ADA_WRITE,
            &[("If-Match", value)],
            Some(&json!({"cells": {}})),
        )
        .await;
        assert_error(&missing, 404, "not_found");
    }

    // Delete: stale → 412 and the subtree stays; current → 204 and the subtree goes.
    let delete = |if_match: &'static str| {
        let s = &s;
        async move {
            call(s, "DELETE", "/sheets/10/rows/1000", ADA_WRITE, &[("If-Match", if_match)], None)
                .await
        }
    };
    let refused = delete("\"1000.2\"").await;
    assert_error(&refused, 412, "precondition_failed");
    assert_eq!(refused.1["detail"]["currentVersion"], 1);
    assert_eq!(refused.1["detail"]["current"]["id"], 1000);
    for id in [1000, 1001, 1002] {
        assert_eq!(s.get(&format!("/sheets/10/rows/{id}"), ADA_READ).await.0, 200, "{id}");
    }
    assert_eq!(s.get("/sheets/10", ADA_READ).await.1["rowCount"], 4);
    let done = delete("\"1000.1\"").await;
    assert_eq!((done.0, &done.1), (204, &Value::Null));
    for id in [1000, 1001, 1002] {
        assert_eq!(s.get(&format!("/sheets/10/rows/{id}"), ADA_READ).await.0, 404, "{id}");
    }
    assert_error(&delete("*").await, 404, "not_found");
    // Without If-Match, deleteRow is api-v1's.
    let plain = s.call("DELETE", "/sheets/10/rows/1003", Some(ADA_WRITE), None).await;
    assert_eq!(plain.0, 204);
    assert_eq!(s.get("/sheets/10", ADA_READ).await.1["rowCount"], 0);
    // A key that can only read is refused before any precondition is looked at.
    let read_only =
        call(&s, "DELETE", "/sheets/11/rows/1100", ADA_READ, &[("If-Match", "\"1100.9\"")], None)
            .await;
    assert_error(&read_only, 403, "forbidden");
}

#[actix_rt::test]
async fn a_412_under_an_idempotency_key_is_stored_and_replayed_byte_for_byte() {
    let s = TestServer::start().await;
    let body = json!({"cells": {"100": "z"}});
    let path = "/sheets/10/rows/1003";
    let headers = [("If-Match", "\"1003.7\""), ("Idempotency-Key", "pre-1")];
    let (status, first, first_headers) = send_bytes(&s, "PATCH", path, &headers, Some(&body)).await;
    assert_eq!(status, 412);
    assert_eq!(header(&first_headers, "idempotent-replayed"), None);
    let parsed: Value = serde_json::from_slice(&first).unwrap();
    assert_eq!(parsed["errorCode"], "precondition_failed");
    assert_eq!(parsed["detail"]["currentVersion"], 1);

    // The row moves on; the replay still answers what was decided then, and writes nothing.
    let moved = s
        .call("PATCH", path, Some(ADA_WRITE), Some(&json!({"version": 1, "cells": {"100": "y"}})))
        .await;
    assert_eq!(moved.0, 200);
    let (again_status, again, again_headers) =
        send_bytes(&s, "PATCH", path, &headers, Some(&body)).await;
    assert_eq!((again_status, &again), (412, &first), "byte for byte");
    assert_eq!(header(&again_headers, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&again_headers, "x-request-id"), parsed["requestId"].as_str());
    let row = s.get(path, ADA_READ).await;
    assert_eq!((row.1["version"].clone(), row.1["cells"]["100"].clone()), (json!(2), json!("y")));

    // Another precondition under the same key is another request.
    let other = [("If-Match", "\"1003.2\""), ("Idempotency-Key", "pre-1")];
    let (status, reused, _) = send_bytes(&s, "PATCH", path, &other, Some(&body)).await;
    let reused: Value = serde_json::from_slice(&reused).unwrap();
    assert_eq!((status, reused["errorCode"].as_str()), (409, Some("idempotency_key_reused")));

    // A delete's 412 is stored the same way.
    let del = [("If-Match", "\"1000.3\""), ("Idempotency-Key", "pre-2")];
    let (status, first, _) = send_bytes(&s, "DELETE", "/sheets/10/rows/1000", &del, None).await;
    assert_eq!(status, 412);
    let (status, again, h) = send_bytes(&s, "DELETE", "/sheets/10/rows/1000", &del, None).await;
    assert_eq!((status, &again, header(&h, "idempotent-replayed")), (412, &first, Some("true")));
    assert_eq!(s.get("/sheets/10/rows/1000", ADA_READ).await.0, 200);
}

#[actix_rt::test]
async fn a_list_rows_etag_covers_its_fields_and_filter() {
    let s = TestServer::start().await;
    let plain = s.get("/sheets/10/rows?limit=5", ADA_READ).await;
    let fields = s.get("/sheets/10/rows?limit=5&fields=100", ADA_READ).await;
    let filter = r#"{"all":[{"column":"101","op":"eq","value":"Done"}]}"#;
    let filtered_path = format!(
        "/sheets/10/rows?limit=5&filter={}",
        filter.replace('"', "%22").replace(' ', "%20")
    );
    let filtered = s.get(&filtered_path, ADA_READ).await;
    assert_eq!((plain.0, fields.0, filtered.0), (200, 200, 200), "{}", filtered.1);
    let tags = [etag(&plain), etag(&fields), etag(&filtered)];
    assert!(tags[0] != tags[1] && tags[0] != tags[2] && tags[1] != tags[2], "{tags:?}");
    // Another query's tag does not validate this one; its own does.
    let other = get_if_none_match(&s, "/sheets/10/rows?limit=5&fields=100", &tags[0]).await;
    assert_eq!(other.0, 200);
    assert_eq!(other.1["data"], fields.1["data"]);
    let same = get_if_none_match(&s, "/sheets/10/rows?limit=5&fields=100", &tags[1]).await;
    assert_eq!(same.0, 304);
}
