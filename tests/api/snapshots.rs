//! Reads come from published snapshots: they never show a write whose record is not durable,
//! never wait for one, and never show part of a write.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::*;

/// Texts of sheet 11's column 110, in id order.
fn texts(page: &Value) -> Vec<String> {
    page["data"].as_array().unwrap().iter().map(|r| r["cells"]["110"].to_string()).collect()
}

#[actix_rt::test]
// Holding the commit thread across the reads below is the point: nothing may become durable.
#[allow(clippy::await_holding_lock)]
async fn a_read_never_shows_a_write_whose_record_is_not_durable() {
    let s = TestServer::start().await;
    let service = s.running().state.try_service().unwrap().clone();
    let before = service.log_stats().last_lsn;
    let held = service.hold_commits();
    let url = format!("{}/sheets/11/rows:bulkAdd", s.base);
    let body = json!({"rows": [{"cells": {"110": "pending"}}]}).to_string().into_bytes();
    let write =
        actix_rt::spawn(async move { send("POST", &url, Some(ADA_WRITE), &[], Some(body)).await });
    let deadline = Instant::now() + Duration::from_secs(10);
    while service.log_stats().last_lsn == before {
        assert!(Instant::now() < deadline, "the write never reached the log");
        actix_rt::time::sleep(Duration::from_millis(5)).await;
    }
    // The write is applied in its sheet's memory and queued on the log, not durable: every read
    // answers at once, without it.
    let (status, page, _) = s.get("/sheets/11/rows", ADA_READ).await;
    assert_eq!(status, 200);
    assert_eq!(texts(&page), ["\"stock\""]);
    let (_, sheet, _) = s.get("/sheets/11", ADA_READ).await;
    assert_eq!(sheet["rowCount"], 1, "{sheet}");
    let (_, sheets, _) = s.get("/sheets", ADA_READ).await;
    let eleven = sheets["data"].as_array().unwrap().iter().find(|s| s["id"] == 11).unwrap();
    assert_eq!(eleven["rowCount"], 1, "{sheets}");
    let (status, run, _) = s.call("POST", "/reports/7/run", Some(ADA_READ), None).await;
    assert_eq!(status, 200, "{run}");
    assert!(!run.to_string().contains("pending"), "{run}");
    assert!(!write.is_finished(), "the write was acknowledged before it was durable");

    drop(held);
    let (status, added, _) = write.await.unwrap();
    assert_eq!(status, 200, "{added}");
    let (_, page, _) = s.get("/sheets/11/rows", ADA_READ).await;
    assert_eq!(texts(&page), ["\"stock\"", "\"pending\""]);
}

#[actix_rt::test]
async fn a_page_never_mixes_rows_from_before_and_after_one_write() {
    let s = TestServer::start().await;
    let rows: Vec<Value> = (0..200).map(|i| json!({"cells": {"110": format!("r{i}")}})).collect();
    let (status, added, _) =
        s.post("/sheets/11/rows:bulkAdd", ADA_WRITE, &json!({"rows": rows})).await;
    assert_eq!(status, 200);
    let ids: Vec<u64> = added["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["row"]["id"].as_u64().unwrap())
        .collect();

    let base = s.base.clone();
    let writer = actix_rt::spawn(async move {
        for round in 1..=30u64 {
            let items: Vec<Value> = ids
                .iter()
                .map(|id| json!({"id": id, "version": round, "cells": {"110": "x", "112": round}}))
                .collect();
            let body = json!({ "rows": items }).to_string().into_bytes();
            let url = format!("{base}/sheets/11/rows:bulkUpdate");
            let (status, reply, _) = send("POST", &url, Some(ADA_WRITE), &[], Some(body)).await;
            assert_eq!(status, 200, "{reply}");
            assert!(
                reply["results"].as_array().unwrap().iter().all(|r| r["row"].is_object()),
                "{reply}"
            );
        }
    });
    let mut seen = std::collections::BTreeSet::new();
    while !writer.is_finished() {
        let (status, page, _) = s.get("/sheets/11/rows?limit=500", ADA_READ).await;
        assert_eq!(status, 200);
        let written: Vec<(&Value, &Value)> = page["data"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["id"] != 1100)
            .map(|r| (&r["version"], &r["cells"]["112"]))
            .collect();
        assert_eq!(written.len(), 200);
        assert!(written.iter().all(|w| *w == written[0]), "one page, two states: {written:?}");
        seen.insert(written[0].0.as_u64().unwrap());
    }
    writer.await.unwrap();
    assert!(seen.len() > 1, "reads ran while the writer did: versions seen {seen:?}");
}
