//! Idempotent retries, rate limiting and payload limits.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::*;

fn header<'a>(r: &'a Reply, name: &str) -> Option<&'a str> {
    r.2.get(name).and_then(|v| v.to_str().ok())
}

async fn row_count(s: &TestServer, sheet: u64) -> u64 {
    s.get(&format!("/sheets/{sheet}"), ADA_READ).await.1["rowCount"].as_u64().unwrap()
}

async fn idem(
    s: &TestServer,
    method: &str,
    path: &str,
    key: &str,
    idem_key: &str,
    body: Option<&Value>,
) -> Reply {
    let url = format!("{}{path}", s.base);
    send(
        method,
        &url,
        Some(key),
        &[("Idempotency-Key", idem_key)],
        body.map(|b| b.to_string().into_bytes()),
    )
    .await
}

#[actix_rt::test]
async fn a_replay_returns_the_stored_response_byte_for_byte_and_writes_nothing() {
    let s = TestServer::start().await;
    let body = json!({"rows": [{"cells": {"110": "once"}}, {"cells": {"112": "bad"}}]});
    let first = idem(&s, "POST", "/sheets/11/rows:bulkAdd", ADA_WRITE, "k-1", Some(&body)).await;
    assert_eq!(first.0, 200);
    assert_eq!(header(&first, "idempotent-replayed"), None);
    assert_eq!(row_count(&s, 11).await, 2);
    let again = idem(&s, "POST", "/sheets/11/rows:bulkAdd", ADA_WRITE, "k-1", Some(&body)).await;
    assert_eq!(again.0, 200);
    assert_eq!(again.1, first.1, "same body, same requestId");
    assert_eq!(header(&again, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&again, "x-request-id"), first.1["requestId"].as_str());
    assert_eq!(row_count(&s, 11).await, 2, "nothing written twice");
    // A different request under the same key.
    let other = json!({"rows": [{"cells": {"110": "twice"}}]});
    assert_error(
        &idem(&s, "POST", "/sheets/11/rows:bulkAdd", ADA_WRITE, "k-1", Some(&other)).await,
        409,
        "idempotency_key_reused",
    );
    assert_error(
        &idem(&s, "POST", "/sheets/10/rows:bulkAdd", ADA_WRITE, "k-1", Some(&body)).await,
        409,
        "idempotency_key_reused",
    );
    // The same string under another API key is independent.
    let bob = json!({"rows": [{"cells": {"200": "bob's"}}]});
    assert_eq!(
        idem(&s, "POST", "/sheets/20/rows:bulkAdd", BOB_ALL, "k-1", Some(&bob)).await.0,
        200
    );
}

#[actix_rt::test]
async fn patch_conflicts_and_out_of_reach_answers_are_stored_too() {
    let s = TestServer::start().await;
    let stale = json!({"version": 5, "cells": {"100": "x"}});
    let first = idem(&s, "PATCH", "/sheets/10/rows/1000", ADA_WRITE, "p-1", Some(&stale)).await;
    assert_error(&first, 409, "version_conflict");
    let again = idem(&s, "PATCH", "/sheets/10/rows/1000", ADA_WRITE, "p-1", Some(&stale)).await;
    assert_eq!((again.0, &again.1), (409, &first.1));
    assert_eq!(header(&again, "idempotent-replayed"), Some("true"));
    let nope =
        idem(&s, "POST", "/sheets/20/rows:bulkAdd", ADA_WRITE, "p-2", Some(&json!({"rows": [{}]})))
            .await;
    assert_error(&nope, 404, "not_found");
    let nope_again =
        idem(&s, "POST", "/sheets/20/rows:bulkAdd", ADA_WRITE, "p-2", Some(&json!({"rows": [{}]})))
            .await;
    assert_eq!((nope_again.0, &nope_again.1), (404, &nope.1));
    // Request validation (422) is not stored: a corrected retry under the same key runs.
    let bad =
        idem(&s, "PATCH", "/sheets/10/rows/1000", ADA_WRITE, "p-3", Some(&json!({"version": 0})))
            .await;
    assert_error(&bad, 422, "validation_failed");
    let good =
        idem(&s, "PATCH", "/sheets/10/rows/1000", ADA_WRITE, "p-3", Some(&json!({"version": 1})))
            .await;
    assert_eq!(good.0, 200);
}

#[actix_rt::test]
async fn a_replayed_delete_returns_204_and_deletes_nothing_more() {
    let s = TestServer::start().await;
    let first = idem(&s, "DELETE", "/sheets/10/rows/1003", ADA_WRITE, "d-1", None).await;
    assert_eq!(first.0, 204);
    let rid = header(&first, "x-request-id").unwrap().to_owned();
    let again = idem(&s, "DELETE", "/sheets/10/rows/1003", ADA_WRITE, "d-1", None).await;
    assert_eq!((again.0, &again.1), (204, &Value::Null));
    assert_eq!(header(&again, "x-request-id"), Some(rid.as_str()), "the original request id");
    assert_eq!(header(&again, "idempotent-replayed"), Some("true"));
    assert_eq!(row_count(&s, 10).await, 3);
    let events = s.running().state.try_service().unwrap().events(0, 10);
    assert_eq!(events.len(), 1, "one ROW_DELETED, not two");
}

#[actix_rt::test]
async fn concurrent_requests_with_one_key_write_once() {
    let s = TestServer::start().await;
    let body = json!({"rows": [{"cells": {"110": "race"}}]});
    let replies =
        futures_util::future::join_all((0..8).map(|_| {
            idem(&s, "POST", "/sheets/11/rows:bulkAdd", ADA_WRITE, "race-1", Some(&body))
        }))
        .await;
    let ok: Vec<&Reply> = replies.iter().filter(|r| r.0 == 200).collect();
    assert!(!ok.is_empty());
    for r in &replies {
        match r.0 {
            200 => assert_eq!(r.1, ok[0].1, "a second 200 is a replay of the first"),
            409 => assert_eq!(r.1["errorCode"], "idempotency_in_progress"),
            other => panic!("unexpected {other}: {}", r.1),
        }
    }
    assert_eq!(row_count(&s, 11).await, 2, "exactly one write");
}

#[actix_rt::test]
async fn the_header_is_validated() {
    let s = TestServer::start().await;
    let long = "x".repeat(256);
    for bad in [long.as_str(), "has space", "tab\there"] {
        let r = idem(
            &s,
            "POST",
            "/sheets/11/rows:bulkAdd",
            ADA_WRITE,
            bad,
            Some(&json!({"rows": [{}]})),
        )
        .await;
        assert_error(&r, 422, "validation_failed");
        assert_eq!(r.1["detail"][0]["loc"], json!(["header", "Idempotency-Key"]));
    }
    assert_eq!(
        idem(
            &s,
            "POST",
            "/sheets/11/rows:bulkAdd",
            ADA_WRITE,
            &"x".repeat(255),
            Some(&json!({"rows": [{}]}))
        )
        .await
        .0,
        200
    );
}

#[actix_rt::test]
async fn the_key_is_free_again_after_24_hours() {
    let s = TestServer::start().await;
    let body = json!({"rows": [{"cells": {"110": "daily"}}]});
    assert_eq!(
        idem(&s, "POST", "/sheets/11/rows:bulkAdd", ADA_WRITE, "day", Some(&body)).await.0,
        200
    );
    s.clock.advance(Duration::from_secs(23 * 3600));
    let replay = idem(&s, "POST", "/sheets/11/rows:bulkAdd", ADA_WRITE, "day", Some(&body)).await;
    assert_eq!(header(&replay, "idempotent-replayed"), Some("true"));
    assert_eq!(row_count(&s, 11).await, 2);
    s.clock.advance(Duration::from_secs(3600 + 1));
    let fresh = idem(&s, "POST", "/sheets/11/rows:bulkAdd", ADA_WRITE, "day", Some(&body)).await;
    assert_eq!(fresh.0, 200);
    assert_eq!(header(&fresh, "idempotent-replayed"), None);
    assert_eq!(row_count(&s, 11).await, 3);
    // Expired records are purged from memory.
    let service = s.running().state.try_service().unwrap();
    let held = service.side_store_sizes().idempotency;
    s.clock.advance(Duration::from_secs(25 * 3600));
    assert_eq!(service.purge_expired().idempotency, held);
    assert_eq!(service.side_store_sizes().idempotency, 0);
}

#[actix_rt::test]
async fn a_replay_works_after_a_sigkill_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (mut bin, data) = Binary::seeded(dir.path()).await;
    let url = format!("{}/sheets/11/rows:bulkAdd", bin.base);
    let body = json!({"rows": [{"cells": {"110": "survives"}}]}).to_string().into_bytes();
    let first =
        send("POST", &url, Some(ADA_WRITE), &[("Idempotency-Key", "crash-1")], Some(body.clone()))
            .await;
    assert_eq!(first.0, 200);
    bin.kill9();
    let bin = Binary::start(&data, &[]).await;
    let url = format!("{}/sheets/11/rows:bulkAdd", bin.base);
    let again =
        send("POST", &url, Some(ADA_WRITE), &[("Idempotency-Key", "crash-1")], Some(body)).await;
    assert_eq!((again.0, &again.1), (200, &first.1));
    assert_eq!(header(&again, "idempotent-replayed"), Some("true"));
    let (_, sheet, _) =
        send("GET", &format!("{}/sheets/11", bin.base), Some(ADA_READ), &[], None).await;
    assert_eq!(sheet["rowCount"], 2);
}

#[actix_rt::test]
async fn the_601st_request_in_a_minute_is_429_with_consistent_headers() {
    let s = TestServer::start_with(fixture(), |a| a.rate_limit_per_minute = 600).await;
    for i in 0..600 {
        let r = s.get("/me", ADA_READ).await;
        assert_eq!(r.0, 200, "request {i}");
        assert_eq!(header(&r, "x-ratelimit-limit"), Some("600"));
        assert_eq!(header(&r, "x-ratelimit-remaining"), Some((599 - i).to_string().as_str()));
    }
    let r = s.get("/sheets", ADA_READ).await;
    assert_error(&r, 429, "rate_limit_exceeded");
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry));
    assert_eq!(r.1["detail"]["retry_after_seconds"], retry);
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("0"));
    let reset: i64 = header(&r, "x-ratelimit-reset").unwrap().parse().unwrap();
    let now = chrono::Utc::now().timestamp();
    assert!((reset - now - retry as i64).abs() <= 1, "reset {reset} is now + retry-after");
    assert_eq!(header(&r, "ratelimit-policy"), Some("\"default\";q=600;w=60"));
    assert_eq!(header(&r, "ratelimit"), Some(format!("\"default\";r=0;t={retry}").as_str()));
    // Other keys, and requests without a key (limited per IP), are unaffected.
    assert_eq!(s.get("/me", ADA_WRITE).await.0, 200);
    let anon = s.call("GET", "/me", None, None).await;
    assert_error(&anon, 401, "unauthorized");
    assert_eq!(header(&anon, "x-ratelimit-remaining"), Some("599"));
}

#[actix_rt::test]
async fn bodies_over_the_limit_are_413() {
    let s = TestServer::start_with(fixture(), |a| a.max_body_bytes = 1024).await;
    let rows: Vec<Value> =
        (0..100).map(|i| json!({"cells": {"110": format!("row {i}")}})).collect();
    let r = s.post("/sheets/11/rows:bulkAdd", ADA_WRITE, &json!({"rows": rows})).await;
    assert_error(&r, 413, "payload_too_large");
    assert_eq!(row_count(&s, 11).await, 1);
    assert_eq!(s.post("/sheets/11/rows:bulkAdd", ADA_WRITE, &json!({"rows": [{}]})).await.0, 200);
}

#[actix_rt::test]
async fn callers_without_a_usable_key_are_limited_per_ip_and_keys_are_not() {
    let s = TestServer::start_with(fixture(), |a| a.rate_limit_per_minute = 5).await;
    for i in 0..5 {
        let r = s
            .call("GET", "/sheets", Some("svc_live_NotAKey0000000000000000000000000000"), None)
            .await;
        assert_error(&r, 401, "unauthorized");
        assert_eq!(header(&r, "x-ratelimit-remaining"), Some((4 - i).to_string().as_str()));
        assert_eq!(header(&r, "retry-after"), None, "Retry-After is for 429 only");
    }
    // A sixth request from this address without a usable key is refused, whatever it carries.
    assert_error(&s.call("GET", "/me", None, None).await, 429, "rate_limit_exceeded");
    // A usable key is counted against its own window, not the address's.
    let keyed = s.get("/me", ADA_READ).await;
    assert_eq!(keyed.0, 200);
    assert_eq!(header(&keyed, "x-ratelimit-remaining"), Some("4"));
    assert_eq!(header(&keyed, "retry-after"), None);
}

#[actix_rt::test]
async fn idempotency_key_is_ignored_outside_the_row_writes() {
    let s = TestServer::start().await;
    let url = format!("{}/me", s.base);
    // A value the row writes would refuse with 422 is not even looked at here.
    let r = send("GET", &url, Some(ADA_READ), &[("Idempotency-Key", "has space")], None).await;
    assert_eq!(r.0, 200);
    let run = format!("{}/reports/8/run", s.base);
    for _ in 0..2 {
        let r = send("POST", &run, Some(ADA_READ), &[("Idempotency-Key", "same")], None).await;
        assert_eq!(r.0, 200, "{}", r.1);
        assert_eq!(header(&r, "idempotent-replayed"), None, "runs are never replayed");
    }
}
