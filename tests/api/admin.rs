//! The admin side (keys, shares, plans, events, stats, metrics) and the operator tools: the
//! `sheetd key` and `sheetd check` commands, graceful SIGTERM, background checkpoints, logs.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::*;

fn keys_of(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

fn ids(list: &Value, field: &str) -> Vec<u64> {
    list["data"].as_array().unwrap().iter().map(|k| k[field].as_u64().unwrap()).collect()
}

fn millis(rfc3339: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339.as_str().unwrap()).unwrap().timestamp_millis()
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).unwrap().to_rfc3339()
}

/// Assert a 422 whose first problem is at `loc`.
fn assert_invalid_at(reply: &Reply, loc: Value) {
    assert_error(reply, 422, "validation_failed");
    assert_eq!(reply.1["detail"][0]["loc"], loc, "{}", reply.1);
}

const HOUR_MS: i64 = 3600 * 1000;

// ---------------------------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------------------------

#[actix_rt::test]
async fn a_created_key_works_at_once_and_a_revoked_one_fails_on_the_next_request() {
    let s = TestServer::start().await;
    let grants = json!([{"verb": "read", "scopeType": "project", "scopeId": 1}]);
    let (status, created, _) = s
        .admin_call("POST", "/keys", Some(&json!({"ownerId": 1, "name": "ci", "grants": grants})))
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(keys_of(&created), ["expiresAt", "keyId", "prefix", "secret"]);
    assert_eq!(created["keyId"], 5, "the next id after the fixture's four keys");
    let secret = created["secret"].as_str().unwrap().to_owned();
    let prefix = created["prefix"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("svc_live_") && secret.len() >= 41, "{secret}");
    assert!(secret.starts_with(&prefix) && prefix.len() < secret.len() - 20, "{prefix}");
    let year = 365 * 24 * HOUR_MS;
    let expires = millis(&created["expiresAt"]);
    assert!((expires - (s.clock.now() + year)).abs() < 60_000, "default expiry is one year");

    // Usable on the very next request, with exactly the grants asked for.
    let (status, me, _) = s.get("/me", &secret).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!((me["keyId"].as_u64(), me["ownerId"].as_u64()), (Some(5), Some(1)));
    assert_eq!(me["scopes"], grants);
    assert_eq!(s.get("/sheets/10", &secret).await.0, 200);
    let write = json!({"version": 1, "cells": {"100": "nope"}});
    let reply = s.call("PATCH", "/sheets/10/rows/1003", Some(&secret), Some(&write)).await;
    assert_error(&reply, 403, "forbidden");

    // Listed with its prefix; the secret is never shown again.
    let (status, list, _) = s.admin_call("GET", "/keys?ownerId=1", None).await;
    assert_eq!(status, 200);
    assert_eq!(keys_of(&list), ["data"]);
    assert_eq!(ids(&list, "keyId"), [1, 2, 4, 5]);
    let listed = &list["data"][3];
    assert_eq!(
        keys_of(listed),
        ["createdAt", "expiresAt", "grants", "keyId", "name", "ownerId", "prefix", "state"]
    );
    assert_eq!(listed["name"], "ci");
    assert_eq!(
        (listed["prefix"].as_str(), listed["state"].as_str()),
        (Some(&*prefix), Some("active"))
    );
    assert_eq!(listed["grants"], grants);
    assert_eq!(listed["expiresAt"], created["expiresAt"]);
    assert!(millis(&listed["createdAt"]) <= s.clock.now());
    let (_, all, _) = s.admin_call("GET", "/keys", None).await;
    assert_eq!(ids(&all, "keyId"), [1, 2, 3, 4, 5]);
    let text = all.to_string();
    for secret in [&*secret, ADA_WRITE, ADA_READ, BOB_ALL, ADA_SHEET11] {
        assert!(!text.contains(secret), "a secret is listed: {text}");
    }

    // Revoked: the next request fails, and it stays revoked.
    let (status, revoked, _) = s.admin_call("POST", "/keys/5/revoke", None).await;
    assert_eq!(status, 200, "{revoked}");
    assert_eq!((revoked["keyId"].as_u64(), revoked["state"].as_str()), (Some(5), Some("revoked")));
    assert_error(&s.get("/me", &secret).await, 401, "unauthorized");
    let (_, list, _) = s.admin_call("GET", "/keys?ownerId=1", None).await;
    assert_eq!(list["data"][3]["state"], "revoked");
    assert_eq!(s.admin_call("POST", "/keys/5/revoke", None).await.1["state"], "revoked");
    assert_eq!(s.get("/me", ADA_WRITE).await.0, 200, "other keys are untouched");

    // The revocation is durable.
    let mut s = s;
    s.restart().await;
    assert_error(&s.get("/me", &secret).await, 401, "unauthorized");

    assert_error(&s.admin_call("POST", "/keys/99/revoke", None).await, 404, "not_found");
    assert_invalid_at(&s.admin_call("POST", "/keys/x/revoke", None).await, json!(["path", "id"]));
    assert_invalid_at(
        &s.admin_call("GET", "/keys?ownerId=me", None).await,
        json!(["query", "ownerId"]),
    );
    let (_, none, _) = s.admin_call("GET", "/keys?ownerId=77", None).await;
    assert_eq!(none, json!({"data": []}));
}

#[actix_rt::test]
async fn a_key_past_its_expiry_is_listed_expired_and_refused() {
    let s = TestServer::start().await;
    let at = s.clock.now() + HOUR_MS;
    let body = json!({"ownerId": 2, "name": "short", "expiresAt": rfc3339(at),
                      "grants": [{"verb": "read", "scopeType": "account"}]});
    let (status, created, _) = s.admin_call("POST", "/keys", Some(&body)).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(millis(&created["expiresAt"]), at);
    let secret = created["secret"].as_str().unwrap();
    assert_eq!(s.get("/me", secret).await.0, 200);

    s.clock.advance(Duration::from_secs(2 * 3600));
    assert_error(&s.get("/me", secret).await, 401, "unauthorized");
    let (_, list, _) = s.admin_call("GET", "/keys?ownerId=2", None).await;
    let states: Vec<&str> =
        list["data"].as_array().unwrap().iter().map(|k| k["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["active", "expired"]);

    let past = json!({"ownerId": 2, "name": "old", "expiresAt": rfc3339(s.clock.now() - 1000),
                      "grants": [{"verb": "read", "scopeType": "account"}]});
    assert_invalid_at(
        &s.admin_call("POST", "/keys", Some(&past)).await,
        json!(["body", "expiresAt"]),
    );
    let mut garbled = past.clone();
    garbled["expiresAt"] = json!("next tuesday");
    assert_invalid_at(
        &s.admin_call("POST", "/keys", Some(&garbled)).await,
        json!(["body", "expiresAt"]),
    );
}

#[actix_rt::test]
async fn an_over_grant_is_refused_naming_the_scope_and_malformed_bodies_are_422() {
    let s = TestServer::start().await;
    let key = |owner: u64, grants: Value| json!({"ownerId": owner, "name": "k", "grants": grants});
    let grant =
        |verb: &str, ty: &str, id: u64| json!([{"verb": verb, "scopeType": ty, "scopeId": id}]);

    // bob (user 2) only views folder 5 of ada's project 1.
    let reply = s.admin_call("POST", "/keys", Some(&key(2, grant("write", "project", 1)))).await;
    assert_error(&reply, 422, "validation_failed");
    assert_eq!(reply.1["detail"]["scopeId"], 1, "{}", reply.1);
    assert!(reply.1["detail"]["reason"].as_str().is_some_and(|r| !r.is_empty()));
    let reply = s.admin_call("POST", "/keys", Some(&key(2, grant("write", "folder", 5)))).await;
    assert_error(&reply, 422, "validation_failed");
    assert_eq!(reply.1["detail"]["scopeId"], 5);
    let mixed = json!([{"verb": "read", "scopeType": "folder", "scopeId": 5},
                       {"verb": "read", "scopeType": "sheet", "scopeId": 11}]);
    let reply = s.admin_call("POST", "/keys", Some(&key(2, mixed))).await;
    assert_eq!(reply.1["detail"]["scopeId"], 11, "the offending grant is named, not the first");
    let reply = s.admin_call("POST", "/keys", Some(&key(1, grant("read", "project", 99)))).await;
    assert_error(&reply, 422, "validation_failed");
    assert_eq!(reply.1["detail"]["scopeId"], 99);
    let (_, list, _) = s.admin_call("GET", "/keys?ownerId=2", None).await;
    assert_eq!(ids(&list, "keyId"), [3], "nothing was created by the refusals");

    // What bob holds he may grant; an account grant is always allowed.
    let (status, viewer, _) =
        s.admin_call("POST", "/keys", Some(&key(2, grant("read", "folder", 5)))).await;
    assert_eq!(status, 201, "{viewer}");
    let secret = viewer["secret"].as_str().unwrap();
    assert_eq!(s.get("/sheets/10", secret).await.0, 200);
    assert_error(&s.get("/sheets/11", secret).await, 404, "not_found");
    let account = json!([{"verb": "write", "scopeType": "account", "scopeId": null}]);
    assert_eq!(s.admin_call("POST", "/keys", Some(&key(2, account))).await.0, 201);

    // Malformed bodies: the 422 body names the place.
    let no_owner = json!({"name": "k", "grants": grant("read", "project", 1)});
    assert_invalid_at(
        &s.admin_call("POST", "/keys", Some(&no_owner)).await,
        json!(["body", "ownerId"]),
    );
    let no_grants = key(1, json!([]));
    assert_invalid_at(
        &s.admin_call("POST", "/keys", Some(&no_grants)).await,
        json!(["body", "grants"]),
    );
    let bad_verb = key(1, grant("admin", "project", 1));
    assert_invalid_at(
        &s.admin_call("POST", "/keys", Some(&bad_verb)).await,
        json!(["body", "grants", 0, "verb"]),
    );
    let mut blank = key(1, grant("read", "project", 1));
    blank["name"] = json!("  ");
    assert_invalid_at(&s.admin_call("POST", "/keys", Some(&blank)).await, json!(["body", "name"]));
    let mut extra = key(1, grant("read", "project", 1));
    extra["secret"] = json!("svc_live_mine");
    assert_error(&s.admin_call("POST", "/keys", Some(&extra)).await, 422, "validation_failed");
    let url = format!("{}/keys", s.admin);
    let reply = s.raw("POST", &url, Some(ADMIN_TOKEN), &[], Some(b"{not json".to_vec())).await;
    assert_invalid_at(&reply, json!(["body"]));
    assert_eq!(reply.1["detail"][0]["type"], "json_invalid");
    let reply = s.admin_call("POST", "/keys", Some(&key(9, grant("read", "project", 1)))).await;
    assert_error(&reply, 422, "validation_failed");
}

// ---------------------------------------------------------------------------------------------
// Shares and plans
// ---------------------------------------------------------------------------------------------

#[actix_rt::test]
async fn an_owner_who_loses_a_share_loses_it_through_every_key_at_once() {
    let s = TestServer::start().await;
    let body = json!({"ownerId": 2, "name": "bob-folder", "grants": [{"verb": "read", "scopeType": "folder", "scopeId": 5}]});
    let (_, created, _) = s.admin_call("POST", "/keys", Some(&body)).await;
    let bob_folder = created["secret"].as_str().unwrap().to_owned();
    for key in [BOB_ALL, &bob_folder] {
        assert_eq!(s.get("/sheets/10", key).await.0, 200);
    }

    let remove = json!({"userId": 2, "scopeType": "folder", "scopeId": 5, "role": "none"});
    let (status, echoed, _) = s.admin_call("PUT", "/shares", Some(&remove)).await;
    assert_eq!((status, &echoed), (200, &remove));
    for key in [BOB_ALL, &bob_folder] {
        assert_error(&s.get("/sheets/10", key).await, 404, "not_found");
    }
    assert_eq!(ids(&s.get("/sheets", BOB_ALL).await.1, "id"), [20]);

    // A higher share gives back more than before: bob's write-everything key can now edit.
    let editor = json!({"userId": 2, "scopeType": "sheet", "scopeId": 10, "role": "editor"});
    assert_eq!(s.admin_call("PUT", "/shares", Some(&editor)).await.0, 200);
    let patch = json!({"version": 1, "cells": {"100": "edited by bob"}});
    let (status, row, _) =
        s.call("PATCH", "/sheets/10/rows/1003", Some(BOB_ALL), Some(&patch)).await;
    assert_eq!(status, 200, "{row}");
    assert_error(
        &s.call("PATCH", "/sheets/10/rows/1003", Some(&bob_folder), Some(&json!({"version": 2})))
            .await,
        403,
        "forbidden",
    );

    let mut bad = remove.clone();
    bad["scopeType"] = json!("account");
    assert_invalid_at(
        &s.admin_call("PUT", "/shares", Some(&bad)).await,
        json!(["body", "scopeType"]),
    );
    bad = remove.clone();
    bad["role"] = json!("boss");
    assert_invalid_at(&s.admin_call("PUT", "/shares", Some(&bad)).await, json!(["body", "role"]));
    bad = remove.clone();
    bad["scopeId"] = json!(99);
    assert_error(&s.admin_call("PUT", "/shares", Some(&bad)).await, 404, "not_found");
    bad = remove.clone();
    bad["userId"] = json!(9);
    assert_error(&s.admin_call("PUT", "/shares", Some(&bad)).await, 404, "not_found");
}

#[actix_rt::test]
async fn a_plan_change_counts_from_the_next_request() {
    let mut fx = fixture();
    fx["plans"] = json!({"free": {"maxRowsPerSheet": 2}, "paid": {"maxRowsPerSheet": 100}});
    let s = TestServer::start_with(fx, |_| {}).await;
    let add = |n: usize| json!({"rows": vec![json!({"cells": {"200": "x"}}); n]});
    let statuses = |v: &Value| -> Vec<String> {
        v["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["status"].as_str().unwrap().to_owned())
            .collect()
    };
    // bob is on free (2 rows per sheet); his sheet 20 holds 1.
    let (_, res, _) = s.post("/sheets/20/rows:bulkAdd", BOB_ALL, &add(2)).await;
    assert_eq!(statuses(&res), ["succeeded", "failed"]);
    assert_eq!(res["results"][1]["error"]["errorCode"], "capacity_exceeded");
    // Reports run only for an owner on the paid plan; report 9 is bob's.
    let reply = s.call("POST", "/reports/9/run", Some(BOB_ALL), None).await;
    assert_error(&reply, 402, "payment_required");

    let (status, body, _) =
        s.admin_call("PUT", "/users/2/plan", Some(&json!({"plan": "paid"}))).await;
    assert_eq!((status, body), (200, json!({"userId": 2, "plan": "paid"})));
    let (_, res, _) = s.post("/sheets/20/rows:bulkAdd", BOB_ALL, &add(2)).await;
    assert_eq!(statuses(&res), ["succeeded", "succeeded"]);
    let (status, run, _) = s.call("POST", "/reports/9/run", Some(BOB_ALL), None).await;
    assert_eq!(status, 200, "{run}");
    assert_eq!(
        (run["data"]["reportId"].as_u64(), run["data"]["totalMatched"].as_u64()),
        (Some(9), Some(4))
    );

    assert_eq!(s.admin_call("PUT", "/users/2/plan", Some(&json!({"plan": "free"}))).await.0, 200);
    let (_, res, _) = s.post("/sheets/20/rows:bulkAdd", BOB_ALL, &add(1)).await;
    assert_eq!(statuses(&res), ["failed"]);
    let reply = s.call("POST", "/reports/9/run", Some(BOB_ALL), None).await;
    assert_error(&reply, 402, "payment_required");

    assert_error(
        &s.admin_call("PUT", "/users/9/plan", Some(&json!({"plan": "paid"}))).await,
        404,
        "not_found",
    );
    assert_invalid_at(
        &s.admin_call("PUT", "/users/2/plan", Some(&json!({"plan": "gold"}))).await,
        json!(["body", "plan"]),
    );
    assert_invalid_at(
        &s.admin_call("PUT", "/users/bob/plan", Some(&json!({"plan": "paid"}))).await,
        json!(["path", "id"]),
    );
}

// ---------------------------------------------------------------------------------------------
// Events, stats, metrics, the token
// ---------------------------------------------------------------------------------------------

#[actix_rt::test]
async fn events_after_a_delete_come_in_order_and_resume_after_a_seq() {
    let mut s = TestServer::start().await;
    assert_eq!(s.admin_call("GET", "/events", None).await.1, json!({"data": []}));
    let reply = s.call("DELETE", "/sheets/10/rows/1000", Some(ADA_WRITE), None).await;
    assert_eq!(reply.0, 204);

    let (status, events, _) = s.admin_call("GET", "/events", None).await;
    assert_eq!(status, 200);
    let data = events["data"].as_array().unwrap();
    assert_eq!(ids(&events, "rowId"), [1000, 1001, 1002], "the row, then its subtree");
    let seqs = ids(&events, "seq");
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    for e in data {
        assert_eq!(keys_of(e), ["at", "rowId", "seq", "sheetId", "type"]);
        assert_eq!((e["type"].as_str(), e["sheetId"].as_u64()), (Some("ROW_DELETED"), Some(10)));
        assert!((millis(&e["at"]) - s.clock.now()).abs() < 60_000);
    }

    // Resumable: `after` is the last seq seen.
    let (_, page, _) =
        s.admin_call("GET", &format!("/events?after={}&limit=1", seqs[0]), None).await;
    assert_eq!(page["data"], json!([data[1]]));
    let (_, rest, _) = s.admin_call("GET", &format!("/events?after={}", seqs[1]), None).await;
    assert_eq!(rest["data"], json!([data[2]]));
    let (_, none, _) = s.admin_call("GET", &format!("/events?after={}", seqs[2]), None).await;
    assert_eq!(none["data"], json!([]));

    // They survive a restart (through the final checkpoint) unchanged.
    s.restart().await;
    assert_eq!(s.admin_call("GET", "/events", None).await.1, events);

    assert_invalid_at(
        &s.admin_call("GET", "/events?limit=0", None).await,
        json!(["query", "limit"]),
    );
    assert_invalid_at(
        &s.admin_call("GET", "/events?after=-1", None).await,
        json!(["query", "after"]),
    );
}

#[actix_rt::test]
async fn stats_and_metrics_report_the_documented_fields() {
    let s = TestServer::start().await;
    assert_eq!(s.get("/me", ADA_WRITE).await.0, 200);
    let (status, stats, _) = s.admin_call("GET", "/stats", None).await;
    assert_eq!(status, 200);
    let wal_lsn = stats["walLsn"].as_u64().unwrap();
    assert!(wal_lsn >= 1, "the seed is logged");
    assert_eq!(
        stats,
        json!({"users": 2, "projects": 2, "sheets": 3, "rows": 6, "attachments": 2,
               "attachmentBytes": 150, "keys": 4, "walLsn": wal_lsn})
    );

    let url = format!("{}/metrics", s.admin);
    let (status, text, headers) = s.raw("GET", &url, Some(ADMIN_TOKEN), &[], None).await;
    assert_eq!(status, 200);
    let content_type = headers.get("content-type").unwrap().to_str().unwrap();
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
    let text = text.as_str().unwrap();
    for needle in [
        "sheetd_http_requests_total{route=\"/api/v1/me\",status=\"200\"} 1\n",
        "# TYPE sheetd_http_request_duration_seconds histogram\n",
        "sheetd_http_request_duration_seconds_bucket{le=\"+Inf\"}",
        "sheetd_http_request_duration_seconds_sum ",
        "# TYPE sheetd_wal_flush_duration_seconds histogram\n",
        "sheetd_wal_flush_duration_seconds_bucket{le=\"0.001\"}",
        "sheetd_wal_flush_duration_seconds_count ",
        "sheetd_wal_flushes_total ",
        "sheetd_wal_records_flushed_total ",
        "sheetd_wal_flush_batch_size_max ",
        &format!("sheetd_wal_durable_lsn {wal_lsn}\n"),
        "sheetd_wal_last_lsn ",
        "sheetd_wal_checkpoint_lsn 0\n",
        "sheetd_wal_checkpoints_total 0\n",
        "sheetd_wal_checkpoint_seconds_total 0\n",
        "sheetd_wal_records_since_checkpoint ",
        "sheetd_rows 6\n",
        "sheetd_keys 4\n",
        "sheetd_idempotency_records 0\n",
        "sheetd_events 0\n",
    ] {
        assert!(text.contains(needle), "no `{needle}` in\n{text}");
    }
    // Every sample line is `name{labels} value` with a numeric value.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let value = line.rsplit(' ').next().unwrap();
        assert!(value.parse::<f64>().is_ok(), "bad sample: {line}");
    }
}

#[actix_rt::test]
async fn every_admin_route_needs_the_admin_token() {
    let s = TestServer::start().await;
    let routes = [
        ("GET", "/health"),
        ("POST", "/import"),
        ("POST", "/keys"),
        ("GET", "/keys"),
        ("POST", "/keys/1/revoke"),
        ("PUT", "/shares"),
        ("PUT", "/users/1/plan"),
        ("GET", "/events"),
        ("GET", "/stats"),
        ("GET", "/metrics"),
    ];
    for (method, path) in routes {
        let url = format!("{}{path}", s.admin);
        for bearer in [None, Some("wrong"), Some(ADA_WRITE)] {
            let reply = s.raw(method, &url, bearer, &[], Some(b"{}".to_vec())).await;
            assert_error(&reply, 401, "unauthorized");
        }
    }
    assert_eq!(s.get("/me", ADA_WRITE).await.0, 200, "key 1 was not revoked");
}

// ---------------------------------------------------------------------------------------------
// Background checkpoints
// ---------------------------------------------------------------------------------------------

/// Poll `cond` every 50 ms for up to `secs`.
async fn eventually(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..secs * 20 {
        if cond() {
            return true;
        }
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    cond()
}

#[actix_rt::test]
async fn background_checkpoints_run_by_size_by_time_and_by_count_and_not_while_idle() {
    // By size: a 1-byte threshold, so what decides is the other half of the rule, half the
    // last checkpoint's size. The seed is checkpointed first (about 3 KB), then a write logs
    // more than half of that.
    let s = TestServer::start_with(fixture(), |a| {
        a.checkpoint_every_bytes = 1;
        a.checkpoint_every_secs = 0;
    })
    .await;
    let service = s.running().state.try_service().unwrap().clone();
    let seeded = || service.log_stats().checkpoint_lsn >= 1;
    assert!(eventually(5, seeded).await, "{:?}", service.log_stats());
    let (a, b) = ("a".repeat(2000), "b".repeat(2000));
    let body = json!({"rows": [{"cells": {"110": a}}, {"cells": {"110": b}}]});
    assert_eq!(s.post("/sheets/11/rows:bulkAdd", ADA_WRITE, &body).await.0, 200);
    // The seed is LSN 1, the write is 2 or later; once checkpointed, only the checkpoint's own
    // marker record is left in the log.
    let covered = || {
        let stats = service.log_stats();
        stats.checkpoint_lsn >= 2 && stats.records_since_checkpoint == 1
    };
    assert!(eventually(5, covered).await, "{:?}", service.log_stats());
    let stats = service.log_stats();
    // Idle: the checkpoint's own marker record does not trigger another one.
    let settled = (stats.checkpoint_lsn, stats.last_lsn);
    actix_rt::time::sleep(Duration::from_millis(2500)).await;
    let idle = service.log_stats();
    assert_eq!((idle.checkpoint_lsn, idle.last_lsn), settled);

    // By time: the seed import is checkpointed within a second or two with no size trigger.
    let t = TestServer::start_with(fixture(), |a| {
        a.checkpoint_every_bytes = 0;
        a.checkpoint_every_secs = 1;
    })
    .await;
    let service = t.running().state.try_service().unwrap().clone();
    let checkpointed = || service.log_stats().checkpoint_lsn >= 1;
    assert!(eventually(5, checkpointed).await, "{:?}", service.log_stats());
    // And the data is whole after a restart from it.
    let mut t = t;
    t.restart().await;
    assert_eq!(t.get("/sheets/10", ADA_READ).await.1["rowCount"], 4);

    // By count: 3 records, whatever their size, with size and time off. The seed's import and
    // one write are two; a second write makes three.
    let c = TestServer::start_with(fixture(), |a| {
        a.checkpoint_every_bytes = 0;
        a.checkpoint_every_secs = 0;
        a.checkpoint_every_records = 3;
    })
    .await;
    let service = c.running().state.try_service().unwrap().clone();
    let add = json!({"rows": [{"cells": {"110": "x"}}]});
    assert_eq!(c.post("/sheets/11/rows:bulkAdd", ADA_WRITE, &add).await.0, 200);
    actix_rt::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(service.log_stats().checkpoint_lsn, 0, "{:?}", service.log_stats());
    assert_eq!(c.post("/sheets/11/rows:bulkAdd", ADA_WRITE, &add).await.0, 200);
    let counted = || service.log_stats().checkpoint_lsn >= 3;
    assert!(eventually(5, counted).await, "{:?}", service.log_stats());
}

// ---------------------------------------------------------------------------------------------
// The binary: CLI, SIGTERM, logs
// ---------------------------------------------------------------------------------------------

/// Run the built `sheetd` with `args`.
fn sheetd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sheetd")).args(args).output().expect("sheetd runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Start `sheetd serve --log-json` on an existing data dir. [`Binary::start`] reads the
/// human-readable log's `serving` line; this reads the JSON one.
async fn start_json(data_dir: &Path) -> Binary {
    let log = data_dir.with_extension("json-log");
    let child = Command::new(env!("CARGO_BIN_EXE_sheetd"))
        .args(["serve", "--log-json", "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--admin-token", ADMIN_TOKEN])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("sheetd starts");
    let mut b = Binary { child, base: String::new(), admin: String::new(), log };
    for _ in 0..1200 {
        let text = std::fs::read_to_string(&b.log).unwrap_or_default();
        let serving = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| l["fields"]["message"] == "serving");
        if let Some(line) = serving {
            let f = &line["fields"];
            b.base = format!("http://{}/api/v1", f["addr"].as_str().unwrap());
            b.admin = format!("http://{}/admin/v1", f["admin_addr"].as_str().unwrap());
            return b;
        }
        if let Ok(Some(status)) = b.child.try_wait() {
            panic!("sheetd exited with {status}; log: {text}");
        }
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("sheetd did not start serving; log: {}", std::fs::read_to_string(&b.log).unwrap());
}

/// Any `svc_live_` secret (prefix and at least 32 alphanumerics) in `log`, or the admin token.
fn leaked_secret(log: &str) -> Option<String> {
    if log.contains(ADMIN_TOKEN) {
        return Some(ADMIN_TOKEN.to_owned());
    }
    log.match_indices("svc_live_").find_map(|(i, _)| {
        let tail: String = log[i + 9..].chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
        (tail.len() >= 32).then(|| format!("svc_live_{tail}"))
    })
}

#[actix_rt::test]
async fn check_prints_counts_and_fails_on_a_damaged_middle_record() {
    let dir = tempfile::tempdir().unwrap();
    let (mut bin, data) = Binary::seeded(dir.path()).await;
    let data_arg = data.to_str().unwrap();
    for i in 0..4 {
        let body = json!({"rows": [{"cells": {"110": format!("r{i}")}}]});
        let url = format!("{}/sheets/11/rows:bulkAdd", bin.base);
        let body = body.to_string().into_bytes();
        assert_eq!(send("POST", &url, Some(ADA_WRITE), &[], Some(body)).await.0, 200);
    }
    // A running server holds the dir: check refuses rather than read a moving target.
    let busy = sheetd(&["check", "--data-dir", data_arg]);
    assert!(!busy.status.success());
    assert!(text(&busy.stderr).contains("in use"), "{}", text(&busy.stderr));
    // SIGKILL: no final checkpoint, so every record stays in the log.
    bin.kill9();

    let good = sheetd(&["check", "--data-dir", data_arg]);
    let out = text(&good.stdout);
    assert!(good.status.success(), "{out}{}", text(&good.stderr));
    assert!(out.contains("5 records replayed"), "{out}");
    assert!(
        out.contains(
            "2 users, 2 projects, 3 sheets, 10 rows, 2 attachments (150 bytes), 4 keys, 3 reports"
        ),
        "{out}"
    );
    assert!(out.ends_with("ok\n"), "{out}");

    let lsns = wal::testing::record_lsns(&data).unwrap();
    assert_eq!(lsns, [1, 2, 3, 4, 5]);
    wal::testing::damage_record(&data, 3, 12).unwrap();
    let bad = sheetd(&["check", "--data-dir", data_arg]);
    let err = text(&bad.stderr);
    assert!(!bad.status.success(), "a damaged middle record passed: {}", text(&bad.stdout));
    assert!(err.contains("log record 3 is damaged"), "{err}");

    let missing = sheetd(&["check", "--data-dir", dir.path().join("nope").to_str().unwrap()]);
    assert!(!missing.status.success());
    assert!(text(&missing.stderr).contains("does not exist"));
}

#[actix_rt::test]
async fn key_commands_work_offline_and_the_next_server_honours_them() {
    let dir = tempfile::tempdir().unwrap();
    let (mut bin, data) = Binary::seeded(dir.path()).await;
    let d = data.to_str().unwrap();
    let create = ["key", "create", "--data-dir", d, "--owner", "1", "--name", "ci"];
    let grants = ["--grant", "write:project:1", "--grant", "read:account"];

    // Refused while a server holds the data dir.
    let busy = sheetd(&[&create[..], &grants[..]].concat());
    assert!(!busy.status.success());
    assert!(text(&busy.stderr).contains("in use"), "{}", text(&busy.stderr));
    assert!(bin.terminate().success());

    let made = sheetd(&[&create[..], &grants[..]].concat());
    let out = text(&made.stdout);
    assert!(made.status.success(), "{out}{}", text(&made.stderr));
    let secret = out.lines().last().unwrap().trim().to_owned();
    assert!(secret.starts_with("svc_live_") && secret.len() >= 41, "{out}");
    assert!(out.contains("Created key 5 \"ci\" for user 1"), "{out}");
    assert!(leaked_secret(&text(&made.stderr)).is_none(), "the secret went to the log");

    // The admin API's checks apply offline too: no past expiry, no empty name.
    let past =
        sheetd(&[&create[..], &grants[..], &["--expires-at", "2020-01-01T00:00:00Z"]].concat());
    assert!(!past.status.success());
    assert!(
        text(&past.stderr).contains("`expiresAt` must be in the future"),
        "{}",
        text(&past.stderr)
    );
    let unnamed = sheetd(&[
        "key",
        "create",
        "--data-dir",
        d,
        "--owner",
        "1",
        "--name",
        " ",
        "--grant",
        "read:account",
    ]);
    assert!(!unnamed.status.success());
    assert!(text(&unnamed.stderr).contains("`name` must have"), "{}", text(&unnamed.stderr));

    // Over-grant, a bad grant, an unknown key.
    let over = sheetd(&[
        "key",
        "create",
        "--data-dir",
        d,
        "--owner",
        "2",
        "--name",
        "x",
        "--grant",
        "write:project:1",
    ]);
    assert!(!over.status.success());
    assert!(text(&over.stderr).contains("\"scopeId\":1"), "{}", text(&over.stderr));
    let garbled = sheetd(&[
        "key",
        "create",
        "--data-dir",
        d,
        "--owner",
        "1",
        "--name",
        "x",
        "--grant",
        "write:team:1",
    ]);
    assert!(!garbled.status.success());
    assert!(text(&garbled.stderr).contains("write:team:1"));
    let unknown = sheetd(&["key", "revoke", "--data-dir", d, "--id", "99"]);
    assert!(!unknown.status.success());
    assert!(text(&unknown.stderr).contains("not found"), "{}", text(&unknown.stderr));

    // Revoke ada's read key offline, then list: prefixes and states, never a secret.
    let revoked = sheetd(&["key", "revoke", "--data-dir", d, "--id", "2"]);
    assert!(revoked.status.success(), "{}", text(&revoked.stderr));
    let listed = sheetd(&["key", "list", "--data-dir", d, "--owner", "1"]);
    let list = text(&listed.stdout);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let rows: Vec<Vec<&str>> =
        list.lines().skip(1).map(|l| l.split_whitespace().collect()).collect();
    let summary: Vec<(&str, &str, &str)> = rows.iter().map(|r| (r[0], r[2], r[4])).collect();
    assert_eq!(
        summary,
        [
            ("1", "ada-write", "active"),
            ("2", "ada-read", "revoked"),
            ("4", "ada-11", "active"),
            ("5", "ci", "active")
        ]
    );
    assert_eq!(rows[3][3], &secret[..13], "the prefix is shown");
    assert_eq!(rows[3][7], "write:project:1,read:account");
    assert!(leaked_secret(&list).is_none(), "{list}");

    // A server started afterwards honours both changes; JSON logs this time.
    let mut bin = start_json(&data).await;
    let (status, me, _) = send("GET", &format!("{}/me", bin.base), Some(&secret), &[], None).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["keyId"], 5);
    assert_eq!(
        me["scopes"],
        json!([{"verb": "write", "scopeType": "project", "scopeId": 1},
               {"verb": "read", "scopeType": "account", "scopeId": null}])
    );
    let reply = send("GET", &format!("{}/me", bin.base), Some(ADA_READ), &[], None).await;
    assert_error(&reply, 401, "unauthorized");
    assert!(bin.terminate().success());

    let log = std::fs::read_to_string(&bin.log).unwrap();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .collect();
    let recovered = lines.iter().find(|l| l["fields"]["message"] == "recovery complete").unwrap();
    assert!(recovered["fields"]["records_replayed"].as_u64().unwrap() <= 1, "{recovered}");
    let request = lines
        .iter()
        .find(|l| l["fields"]["message"] == "request" && l["fields"]["route"] == "/api/v1/me")
        .expect("a request line");
    let f = &request["fields"];
    assert_eq!((f["status"].as_u64(), f["key_id"].as_i64()), (Some(200), Some(5)), "{request}");
    assert!(f["request_id"].as_str().unwrap().starts_with("req_") && f["latency_ms"].is_number());
    assert_eq!(leaked_secret(&log), None);
}

/// Rows of a sheet by id, through every page.
async fn all_rows(base: &str, key: &str, sheet: u64) -> BTreeMap<u64, Value> {
    let mut rows = BTreeMap::new();
    let mut url = format!("{base}/sheets/{sheet}/rows?limit=500");
    loop {
        let (status, page, _) = send("GET", &url, Some(key), &[], None).await;
        assert_eq!(status, 200, "{page}");
        for r in page["data"].as_array().unwrap() {
            rows.insert(r["id"].as_u64().unwrap(), r.clone());
        }
        match page["nextCursor"].as_str() {
            Some(c) => url = format!("{base}/sheets/{sheet}/rows?limit=500&cursor={c}"),
            None => return rows,
        }
    }
}

/// Add rows one request at a time until the server stops answering; record what was acked.
async fn add_until_refused(base: String, n: usize, acked: Arc<Mutex<Vec<(u64, String)>>>) {
    for i in 0..100_000 {
        let text = format!("t{n}-{i}");
        let body = json!({"rows": [{"cells": {"110": text}}]}).to_string();
        let client = awc::Client::builder().timeout(Duration::from_secs(20)).finish();
        let sent = client
            .post(format!("{base}/sheets/11/rows:bulkAdd"))
            .insert_header(("Authorization", format!("Bearer {ADA_WRITE}")))
            .insert_header(("Content-Type", "application/json"))
            .send_body(body)
            .await;
        let Ok(mut res) = sent else { return };
        let Ok(bytes) = res.body().await else { return };
        if res.status() != 200 {
            return;
        }
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["results"][0]["status"], "succeeded", "{v}");
        acked.lock().unwrap().push((v["results"][0]["row"]["id"].as_u64().unwrap(), text));
    }
}

#[actix_rt::test]
async fn sigterm_under_load_drains_checkpoints_exits_zero_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (mut bin, data) = Binary::seeded(dir.path()).await;
    let acked = Arc::new(Mutex::new(Vec::new()));
    let writers: Vec<_> = (0..6)
        .map(|n| actix_rt::spawn(add_until_refused(bin.base.clone(), n, acked.clone())))
        .collect();
    for _ in 0..200 {
        actix_rt::time::sleep(Duration::from_millis(20)).await;
        if acked.lock().unwrap().len() >= 100 {
            break;
        }
    }
    // SIGTERM while the writers are still sending; they stop when the server stops answering.
    let pid = bin.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    for w in writers {
        w.await.unwrap();
    }
    let status = bin.child.wait().unwrap();
    assert!(status.success(), "exit status {status}");
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= 20, "too little load: {}", acked.len());

    let log = std::fs::read_to_string(&bin.log).unwrap();
    assert!(log.contains("final checkpoint written"), "{log}");
    assert!(!log.contains('\u{1b}'), "ANSI escapes in a log that is not a terminal");
    assert_eq!(leaked_secret(&log), None);

    // Restart: every acknowledged row is there, and only what followed the checkpoint replays.
    let bin = Binary::start(&data, &[]).await;
    let rows = all_rows(&bin.base, ADA_WRITE, 11).await;
    for (id, text) in &acked {
        assert_eq!(rows.get(id).map(|r| &r["cells"]["110"]), Some(&json!(text)), "row {id} lost");
    }
    let log = std::fs::read_to_string(&bin.log).unwrap();
    let line = log.lines().find(|l| l.contains("recovery complete")).expect("recovery line");
    let replayed: u64 = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("records_replayed="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no records_replayed in {line}"));
    assert!(replayed <= 1, "{line}");
    assert!(line.contains("elapsed_ms="), "{line}");
}
