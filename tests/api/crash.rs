//! Durability: the server process is killed with SIGKILL under concurrent write load and
//! restarted on the same data dir; every write that got a 2xx is there with its version, and
//! new row ids continue above every id issued before.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use crate::common::*;

/// What a writer saw acknowledged: row id → (version, Task text).
type Acked = Arc<Mutex<BTreeMap<u64, (u64, String)>>>;

async fn writer(base: String, n: usize, acked: Acked, stop: Arc<std::sync::atomic::AtomicBool>) {
    let mut i = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        i += 1;
        let text = format!("w{n}-{i}");
        let body =
            json!({"rows": [{"cells": {"110": text}}, {"cells": {"110": format!("{text}b")}}]});
        let url = format!("{base}/sheets/11/rows:bulkAdd");
        let client = awc::Client::builder().timeout(Duration::from_secs(5)).finish();
        let sent = client
            .post(url)
            .insert_header(("Authorization", format!("Bearer {ADA_WRITE}")))
            .insert_header(("Content-Type", "application/json"))
            .send_body(body.to_string())
            .await;
        let Ok(mut res) = sent else { break };
        if res.status() != 200 {
            break;
        }
        let Ok(bytes) = res.body().await else { break };
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        for r in v["results"].as_array().unwrap() {
            let row = &r["row"];
            acked.lock().unwrap().insert(
                row["id"].as_u64().unwrap(),
                (
                    row["version"].as_u64().unwrap(),
                    row["cells"]["110"].as_str().unwrap().to_owned(),
                ),
            );
        }
        // Every other round, bump the first row so versions above 1 are at stake too.
        let first = &v["results"][0]["row"];
        let id = first["id"].as_u64().unwrap();
        let patch = json!({"version": 1, "cells": {"110": format!("{text}-patched")}});
        let res = client
            .patch(format!("{base}/sheets/11/rows/{id}"))
            .insert_header(("Authorization", format!("Bearer {ADA_WRITE}")))
            .insert_header(("Content-Type", "application/json"))
            .send_body(patch.to_string())
            .await;
        match res {
            Ok(mut res) if res.status() == 200 => {
                let Ok(bytes) = res.body().await else { break };
                let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                acked.lock().unwrap().insert(
                    id,
                    (
                        v["version"].as_u64().unwrap(),
                        v["cells"]["110"].as_str().unwrap().to_owned(),
                    ),
                );
            }
            _ => break,
        }
    }
}

#[actix_rt::test]
async fn sigkill_under_concurrent_writes_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let (mut bin, data) = Binary::seeded(dir.path()).await;
    let acked = load_then_kill(&mut bin, &|acked, _| acked > 300).await;
    // Concurrent writers' records share group commits, and so packs: the restart below reads
    // them back from packs, not only from records stored alone.
    let (records, values) = (
        wal::testing::record_lsns(&data).unwrap().len(),
        wal::testing::stored_values(&data).unwrap(),
    );
    assert!(values < records, "{values} stored values for {records} records");
    check_after_restart(&data, &acked).await;
}

/// The same with checkpoints every 20 records while the writers run: a checkpoint's LSN (its
/// marker record) falls among other writers' records, inside their packs, which its
/// truncation splits; the restart trusts the split log and replays what follows.
#[actix_rt::test]
async fn sigkill_under_writes_and_checkpoints_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("seed.json");
    std::fs::write(&seed, fixture().to_string()).unwrap();
    let data = dir.path().join("data");
    let flags = ["--seed", seed.to_str().unwrap(), "--checkpoint-every-records", "20"];
    let mut bin = Binary::start(&data, &flags).await;
    let admin = bin.admin.clone();
    let checkpoints = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = checkpoints.clone();
    // The maintenance loop looks once a second: run until two checkpoints were written.
    let acked = load_then_kill(&mut bin, &move |_, round| {
        if round % 10 == 0 {
            let admin = admin.clone();
            let seen = seen.clone();
            actix_rt::spawn(async move {
                let n = metric(&admin, "sheetd_wal_checkpoints_total").await as u64;
                seen.store(n, std::sync::atomic::Ordering::Relaxed);
            });
        }
        seen.load(std::sync::atomic::Ordering::Relaxed) >= 2
    })
    .await;
    assert!(checkpoints.load(std::sync::atomic::Ordering::Relaxed) >= 2, "checkpoints ran");
    check_after_restart(&data, &acked).await;
}

/// Runs six writers until `done(acknowledged rows, round)` says so (a round is 20 ms; at most
/// 500 rounds), then SIGKILLs the server mid-flight and returns what was acknowledged.
async fn load_then_kill(
    bin: &mut Binary,
    done: &dyn Fn(usize, usize) -> bool,
) -> BTreeMap<u64, (u64, String)> {
    let acked: Acked = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..6)
        .map(|n| actix_rt::spawn(writer(bin.base.clone(), n, acked.clone(), stop.clone())))
        .collect();
    for round in 0..500 {
        actix_rt::time::sleep(Duration::from_millis(20)).await;
        if done(acked.lock().unwrap().len(), round) {
            break;
        }
    }
    bin.kill9();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        let _ = w.await;
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= 50, "the load ran: {} acknowledged rows", acked.len());
    acked
}

/// Restarts the server on `data` and checks every acknowledged row is there at its version
/// (or a later one), and that new row ids continue above every id issued before.
async fn check_after_restart(data: &std::path::Path, acked: &BTreeMap<u64, (u64, String)>) {
    let bin = Binary::start(data, &[]).await;
    let mut present = BTreeMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let url = match &cursor {
            Some(c) => format!("{}/sheets/11/rows?limit=500&cursor={c}", bin.base),
            None => format!("{}/sheets/11/rows?limit=500", bin.base),
        };
        let (status, page, _) = send("GET", &url, Some(ADA_READ), &[], None).await;
        assert_eq!(status, 200);
        for r in page["data"].as_array().unwrap() {
            present.insert(
                r["id"].as_u64().unwrap(),
                (r["version"].as_u64().unwrap(), r["cells"]["110"].clone()),
            );
        }
        match page["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    for (id, (version, text)) in acked {
        let (v, t) = present.get(id).unwrap_or_else(|| panic!("acknowledged row {id} was lost"));
        // A later write may have landed without its reply arriving: never below what was acked.
        assert!(v >= version, "row {id}: version {v} < acknowledged {version}");
        if v == version {
            assert_eq!(t, text, "row {id}");
        }
    }
    let max_issued = present.keys().chain(acked.keys()).max().copied().unwrap();
    let (_, added, _) = send(
        "POST",
        &format!("{}/sheets/11/rows:bulkAdd", bin.base),
        Some(ADA_WRITE),
        &[],
        Some(json!({"rows": [{"cells": {}}]}).to_string().into_bytes()),
    )
    .await;
    assert!(added["results"][0]["row"]["id"].as_u64().unwrap() > max_issued);
}
