//! The change feed (listChanges: pages, long-poll, event stream) and consistent export
//! (exportRows), through the real server: a follower that exports and then follows the feed
//! ends with exactly the sheet's rows, across writers, restarts and crashes.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::common::*;

/// A copy of a sheet kept by export-then-follow, checking the feed's promises as it goes.
#[derive(Debug, Default)]
struct Follower {
    rows: BTreeMap<u64, Value>,
    cursor: String,
    /// The `seq` the next change must carry (0: not known yet).
    next_seq: u64,
    applied: usize,
}

impl Follower {
    /// Export the sheet (NDJSON) and take the cursor of that instant.
    async fn export(base: &str, key: &str, sheet: u64) -> Self {
        let url = format!("{base}/sheets/{sheet}/export");
        let (status, body, headers) = send("GET", &url, Some(key), &[], None).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(headers.get("content-type").unwrap(), "application/x-ndjson");
        let text = match body {
            Value::String(s) => s,
            Value::Null => String::new(),
            // A one-line export parses as JSON whole.
            other => format!("{other}\n"),
        };
        let mut rows = BTreeMap::new();
        for line in text.lines() {
            let row: Value = serde_json::from_str(line).expect("each line is a row");
            rows.insert(row["id"].as_u64().unwrap(), row);
        }
        let cursor = headers.get("sheet-changes-cursor").unwrap().to_str().unwrap().to_owned();
        Follower { rows, cursor, next_seq: 0, applied: 0 }
    }

    /// Apply one page of changes; returns how many there were.
    fn apply(&mut self, page: &Value) -> usize {
        let changes = page["data"].as_array().expect("data");
        for c in changes {
            let seq = c["seq"].as_u64().unwrap();
            if self.next_seq != 0 {
                assert_eq!(seq, self.next_seq, "no change missed, none repeated: {c}");
            }
            self.next_seq = seq + 1;
            let id = c["rowId"].as_u64().unwrap();
            match c["type"].as_str().unwrap() {
                "row.deleted" => {
                    assert!(c["row"].is_null());
                    let gone = self.rows.remove(&id).expect("a deleted row was in the copy");
                    assert_eq!(gone["version"], c["version"], "last version of {id}");
                }
                kind => {
                    let row = &c["row"];
                    assert_eq!(row["id"], c["rowId"]);
                    assert_eq!(row["version"], c["version"]);
                    let old = self.rows.insert(id, row.clone());
                    match kind {
                        "row.created" => assert!(old.is_none(), "created twice: {c}"),
                        "row.updated" => {
                            let old = old.expect("an updated row was in the copy");
                            assert!(old["version"].as_u64() < row["version"].as_u64(), "{c}");
                        }
                        other => panic!("unknown change type {other}"),
                    }
                }
            }
            assert!(c["at"].as_str().is_some_and(|t| t.ends_with('Z')), "{c}");
        }
        self.cursor = page["nextCursor"].as_str().expect("nextCursor is never null").to_owned();
        self.applied += changes.len();
        changes.len()
    }

    /// One request of the feed from the current cursor.
    async fn poll(&mut self, base: &str, key: &str, sheet: u64, wait: u64) -> Option<usize> {
        let url =
            format!("{base}/sheets/{sheet}/changes?cursor={}&limit=500&wait={wait}", self.cursor);
        let (status, page, _) = send("GET", &url, Some(key), &[], None).await;
        (status == 200).then(|| self.apply(&page))
    }

    /// Poll until a page comes back empty.
    async fn catch_up(&mut self, base: &str, key: &str, sheet: u64) {
        while self.poll(base, key, sheet, 0).await.expect("feed answers") > 0 {}
    }
}

/// A write as ada's write key that reports a transport failure (a killed server) as `None`.
async fn attempt(method: &str, url: &str, body: Option<Value>) -> Option<(u16, Value)> {
    let client = awc::Client::builder().timeout(Duration::from_secs(10)).finish();
    let req = client
        .request(method.parse().unwrap(), url)
        .insert_header(("Authorization", format!("Bearer {ADA_WRITE}")));
    let mut res = match body {
        Some(b) => {
            req.insert_header(("Content-Type", "application/json")).send_body(b.to_string()).await
        }
        None => req.send().await,
    }
    .ok()?;
    let bytes = res.body().await.ok()?;
    Some((res.status().as_u16(), serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}

/// One writer's work on sheet 10: adds, patches, bulk updates (an id twice), deletes, and the
/// fixture's subtree delete once. Errors (conflicts, a row deleted by another writer, a server
/// that is down) are part of the game; only acknowledged writes count.
async fn write_for(base: String, writer: u64, rounds: u64) {
    let url = |p: &str| format!("{base}{p}");
    let mut mine: Vec<(u64, u64)> = Vec::new();
    for round in 0..rounds {
        let body = json!({"rows": [
            {"cells": {"100": format!("w{writer} r{round} a"), "102": round}},
            {"cells": {"100": format!("w{writer} r{round} b"), "101": "Open"}}
        ]});
        if let Some((200, reply)) =
            attempt("POST", &url("/sheets/10/rows:bulkAdd"), Some(body)).await
        {
            for r in reply["results"].as_array().unwrap() {
                mine.push((r["row"]["id"].as_u64().unwrap(), 1));
            }
        }
        if let Some(&(id, version)) = mine.first() {
            let patch = json!({"version": version, "cells": {"102": round * 10 + writer}});
            let path = url(&format!("/sheets/10/rows/{id}"));
            if let Some((200, row)) = attempt("PATCH", &path, Some(patch)).await {
                mine[0].1 = row["version"].as_u64().unwrap();
            }
        }
        if mine.len() >= 2 {
            let (id, version) = mine[1];
            let body = json!({"rows": [
                {"id": id, "version": version, "cells": {"100": "twice 1"}},
                {"id": id, "version": version + 1, "cells": {"100": "twice 2", "101": "Done"}}
            ]});
            let path = url("/sheets/10/rows:bulkUpdate");
            if let Some((200, reply)) = attempt("POST", &path, Some(body)).await {
                let results = reply["results"].as_array().unwrap();
                if let Some(v) = results.iter().filter_map(|r| r["row"]["version"].as_u64()).max() {
                    mine[1].1 = v;
                }
            }
        }
        if round % 3 == 2 && mine.len() > 2 {
            let (id, _) = mine.remove(2);
            attempt("DELETE", &url(&format!("/sheets/10/rows/{id}")), None).await;
        }
        if writer == 0 && round == rounds / 2 {
            // The fixture's subtree 1000 → 1001 → 1002: one row.deleted per row.
            attempt("DELETE", &url("/sheets/10/rows/1000"), None).await;
        }
    }
}

#[actix_rt::test]
async fn the_feed_shows_every_change_in_apply_order_with_deletes() {
    let s = TestServer::start().await;
    // Without a cursor: from the oldest retained change, the rows the sheet started with.
    let (status, first, _) = s.get("/sheets/10/changes", ADA_READ).await;
    assert_eq!(status, 200, "{first}");
    let data = first["data"].as_array().unwrap();
    assert_eq!(data.len(), 4);
    assert!(data.iter().all(|c| c["type"] == "row.created" && c["version"] == 1));
    assert_eq!(data.iter().map(|c| c["seq"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2, 3, 4]);
    let cursor = first["nextCursor"].as_str().unwrap().to_owned();
    // Caught up: an empty page, and the same position back.
    let (_, empty, _) = s.get(&format!("/sheets/10/changes?cursor={cursor}"), ADA_READ).await;
    assert_eq!(empty["data"], json!([]));
    assert_eq!(empty["nextCursor"], cursor.as_str());

    let add = json!({"rows": [{"cells": {"100": "new"}}, {"cells": {"102": "not a number"}}, {"cells": {"100": "new 2"}}]});
    let (_, added, _) = s.post("/sheets/10/rows:bulkAdd", ADA_WRITE, &add).await;
    assert_eq!(added["failedCount"], 1);
    let new = added["results"][0]["row"]["id"].as_u64().unwrap();
    // A conflict and a refused patch change nothing.
    let stale = json!({"version": 7, "cells": {"100": "x"}});
    assert_eq!(
        s.call("PATCH", &format!("/sheets/10/rows/{new}"), Some(ADA_WRITE), Some(&stale)).await.0,
        409
    );
    let patch = json!({"version": 1, "cells": {"100": "patched"}});
    let headers = [("Idempotency-Key", "patch-once")];
    let url = format!("{}/sheets/10/rows/{new}", s.base);
    for _ in 0..2 {
        let reply =
            send("PATCH", &url, Some(ADA_WRITE), &headers, Some(patch.to_string().into_bytes()))
                .await;
        assert_eq!(reply.0, 200);
    }
    let twice = json!({"rows": [
        {"id": 1003, "version": 1, "cells": {"100": "one"}},
        {"id": 1003, "version": 2, "cells": {"100": "two"}}
    ]});
    assert_eq!(
        s.post("/sheets/10/rows:bulkUpdate", ADA_WRITE, &twice).await.1["succeededCount"],
        2
    );
    assert_eq!(s.call("DELETE", "/sheets/10/rows/1000", Some(ADA_WRITE), None).await.0, 204);

    let (_, page, _) = s.get(&format!("/sheets/10/changes?cursor={cursor}"), ADA_READ).await;
    let got: Vec<(u64, &str, u64, u64)> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let (seq, kind) = (c["seq"].as_u64().unwrap(), c["type"].as_str().unwrap());
            (seq, kind, c["rowId"].as_u64().unwrap(), c["version"].as_u64().unwrap())
        })
        .collect();
    let new2 = added["results"][2]["row"]["id"].as_u64().unwrap();
    assert_eq!(
        got,
        [
            (5, "row.created", new, 1),
            (6, "row.created", new2, 1),
            (7, "row.updated", new, 2),
            (8, "row.updated", 1003, 2),
            (9, "row.updated", 1003, 3),
            (10, "row.deleted", 1000, 1),
            (11, "row.deleted", 1001, 1),
            (12, "row.deleted", 1002, 1),
        ]
    );
    let data = page["data"].as_array().unwrap();
    assert_eq!(data[2]["row"]["cells"]["100"], "patched");
    assert_eq!(data[3]["row"]["cells"]["100"], "one", "the row after that change, not the newest");
    assert!(data[5]["row"].is_null());
    // limit pages through the same changes.
    let (_, two, _) = s.get(&format!("/sheets/10/changes?cursor={cursor}&limit=2"), ADA_READ).await;
    assert_eq!(two["data"].as_array().unwrap().len(), 2);
    let next = two["nextCursor"].as_str().unwrap();
    let (_, rest, _) = s.get(&format!("/sheets/10/changes?cursor={next}"), ADA_READ).await;
    assert_eq!(rest["data"][0]["seq"], 7);

    // The same feed after a restart, and it goes on from there.
    let mut s = s;
    s.restart().await;
    let (_, again, _) = s.get(&format!("/sheets/10/changes?cursor={cursor}"), ADA_READ).await;
    assert_eq!(again["data"], page["data"]);
    s.post("/sheets/10/rows:bulkAdd", ADA_WRITE, &json!({"rows": [{"cells": {}}]})).await;
    let (_, after, _) = s
        .get(
            &format!("/sheets/10/changes?cursor={}", page["nextCursor"].as_str().unwrap()),
            ADA_READ,
        )
        .await;
    assert_eq!(after["data"][0]["seq"], 13);
}

/// Every change from `cursor` on, read in pages of `limit`: the pages, in order.
async fn pages(s: &TestServer, cursor: &str, limit: usize) -> Vec<Vec<Value>> {
    let (mut cursor, mut pages) = (cursor.to_owned(), Vec::new());
    loop {
        let url = format!("/sheets/10/changes?cursor={cursor}&limit={limit}");
        let (status, page, _) = s.get(&url, ADA_READ).await;
        assert_eq!(status, 200, "{page}");
        let data = page["data"].as_array().unwrap().clone();
        if data.is_empty() {
            return pages;
        }
        pages.push(data);
        cursor = page["nextCursor"].as_str().unwrap().to_owned();
    }
}

#[actix_rt::test]
async fn pages_that_end_inside_a_large_write_read_the_same_changes_as_one_page() {
    let s = TestServer::start().await;
    let (_, head, _) = s.get("/sheets/10/changes?limit=500", ADA_READ).await;
    let start = head["nextCursor"].as_str().unwrap().to_owned();
    let rows = |n: usize, tag: &str| json!({"rows": (0..n).map(|i| json!({"cells": {"100": format!("{tag} {i}")}})).collect::<Vec<_>>()});
    let (_, a, _) = s.post("/sheets/10/rows:bulkAdd", ADA_WRITE, &rows(7, "a")).await;
    s.post("/sheets/10/rows:bulkAdd", ADA_WRITE, &rows(5, "b")).await;
    let whole = pages(&s, &start, 500).await;
    assert_eq!(whole.len(), 1);
    let whole = &whole[0];
    assert_eq!(whole.len(), 12);

    // Pages of 3 end inside the first write, then in the second; of 5, across the two. Two
    // followers alternate, so each finds the other's record kept, or its own pushed out.
    let (threes, fives) =
        futures_util::future::join(pages(&s, &start, 3), pages(&s, &start, 5)).await;
    assert_eq!(threes.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 3, 3]);
    assert_eq!(fives.iter().map(Vec::len).collect::<Vec<_>>(), [5, 5, 2]);
    assert_eq!(&threes.concat(), whole);
    assert_eq!(&fives.concat(), whole);

    // A row patched after its write was read: a page still shows it as that write left it.
    let first = &a["results"][0]["row"];
    let id = first["id"].as_u64().unwrap();
    let patch = json!({"version": 1, "cells": {"100": "patched"}});
    let (status, _, _) =
        s.call("PATCH", &format!("/sheets/10/rows/{id}"), Some(ADA_WRITE), Some(&patch)).await;
    assert_eq!(status, 200);
    let again = pages(&s, &start, 3).await;
    assert_eq!(&again[..4].concat(), whole);
    assert_eq!(again[0][0]["row"], *first);
    assert_eq!(again[4][0]["row"]["cells"]["100"], "patched");
    assert_eq!(again[4][0]["version"], 2);
}

#[actix_rt::test]
async fn a_follower_that_exports_then_follows_ends_with_exactly_the_sheets_rows() {
    let s = TestServer::start().await;
    let mut follower = Follower::export(&s.base, ADA_READ, 10).await;
    assert_eq!(follower.rows.len(), 4);
    let writers: Vec<_> =
        (0..8).map(|w| actix_rt::spawn(write_for(s.base.clone(), w, 12))).collect();
    // Follow with long-polls while they write.
    let mut finished = false;
    while !finished {
        finished = writers.iter().all(|w| w.is_finished());
        follower.poll(&s.base, ADA_READ, 10, 1).await.expect("feed answers");
    }
    for w in writers {
        w.await.unwrap();
    }
    follower.catch_up(&s.base, ADA_READ, 10).await;
    assert!(follower.applied > 8 * 12 * 3, "applied {}", follower.applied);
    let listed = list_all(&s.base, ADA_READ, 10).await;
    assert!(!listed.contains_key(&1000) && !listed.contains_key(&1002));
    assert_eq!(follower.rows, listed, "ids, versions and cells");
}

#[actix_rt::test]
async fn a_follower_resumes_after_the_server_is_killed_missing_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (mut bin, data) = Binary::seeded(dir.path()).await;
    let mut follower = Follower::export(&bin.base, ADA_READ, 10).await;
    let writers: Vec<_> =
        (0..8).map(|w| actix_rt::spawn(write_for(bin.base.clone(), w, 40))).collect();
    while follower.applied < 60 {
        follower.poll(&bin.base, ADA_READ, 10, 1).await.expect("feed answers");
    }
    bin.kill9();
    for w in writers {
        w.await.unwrap();
    }
    let bin = Binary::start(&data, &[]).await;
    // The follower's cursor is from before the crash: it resumes there.
    follower.catch_up(&bin.base, ADA_READ, 10).await;
    let writers: Vec<_> =
        (0..4).map(|w| actix_rt::spawn(write_for(bin.base.clone(), w, 5))).collect();
    for w in writers {
        w.await.unwrap();
    }
    follower.catch_up(&bin.base, ADA_READ, 10).await;
    assert_eq!(follower.rows, list_all(&bin.base, ADA_READ, 10).await);
}

#[actix_rt::test]
async fn after_a_clean_restart_the_feed_reads_the_changes_behind_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (mut bin, data) = Binary::seeded(dir.path()).await;
    let mut follower = Follower::export(&bin.base, ADA_READ, 10).await;
    let writers: Vec<_> =
        (0..4).map(|w| actix_rt::spawn(write_for(bin.base.clone(), w, 10))).collect();
    for w in writers {
        w.await.unwrap();
    }
    // The stop's checkpoint covers every change; the log keeps their records for the feed and
    // says so in its sweep marker, so the next start does not read them.
    assert!(bin.terminate().success());
    assert!(data.join("checkpoint.swept").exists());
    let bin = Binary::start(&data, &[]).await;
    // The follower's cursor is from before every write: its changes come from those records.
    follower.catch_up(&bin.base, ADA_READ, 10).await;
    assert!(follower.applied >= 4 * 10, "applied {}", follower.applied);
    assert_eq!(follower.rows, list_all(&bin.base, ADA_READ, 10).await);
}

#[actix_rt::test]
async fn the_changes_of_unacknowledged_writes_appear_whole_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let (mut bin, data) = Binary::seeded(dir.path()).await;
    let base = bin.base.clone();
    // Writers add batches of 50 rows tagged by batch; each batch is one record.
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let base = base.clone();
            actix_rt::spawn(async move {
                let mut acknowledged = Vec::new();
                for b in 0..1000u64 {
                    let tag = format!("w{w}b{b}");
                    let rows: Vec<Value> =
                        (0..50).map(|i| json!({"cells": {"100": tag, "102": i}})).collect();
                    let body = json!({"rows": rows}).to_string().into_bytes();
                    let url = format!("{base}/sheets/10/rows:bulkAdd");
                    let client = awc::Client::builder().timeout(Duration::from_secs(5)).finish();
                    let sent = client
                        .post(url)
                        .insert_header(("Authorization", format!("Bearer {ADA_WRITE}")))
                        .insert_header(("Content-Type", "application/json"))
                        .send_body(body)
                        .await;
                    match sent {
                        Ok(r) if r.status() == 200 => acknowledged.push(tag),
                        _ => break,
                    }
                }
                acknowledged
            })
        })
        .collect();
    actix_rt::time::sleep(Duration::from_millis(1500)).await;
    bin.kill9();
    let mut acknowledged = Vec::new();
    for w in writers {
        acknowledged.extend(w.await.unwrap());
    }
    assert!(!acknowledged.is_empty());
    let bin = Binary::start(&data, &[]).await;
    let mut follower = Follower::default();
    let (_, first, _) = send(
        "GET",
        &format!("{}/sheets/10/changes?limit=500", bin.base),
        Some(ADA_READ),
        &[],
        None,
    )
    .await;
    follower.apply(&first);
    follower.catch_up(&bin.base, ADA_READ, 10).await;
    // Gap-free from 1 (checked by `apply`), and each batch all or nothing.
    let mut per_tag: BTreeMap<String, usize> = BTreeMap::new();
    for row in follower.rows.values() {
        if let Some(tag) = row["cells"]["100"].as_str().filter(|t| t.starts_with('w')) {
            *per_tag.entry(tag.to_owned()).or_default() += 1;
        }
    }
    assert!(per_tag.values().all(|&n| n == 50), "{per_tag:?}");
    for tag in &acknowledged {
        assert_eq!(per_tag.get(tag), Some(&50), "acknowledged batch {tag}");
    }
    assert_eq!(follower.rows, list_all(&bin.base, ADA_READ, 10).await);
}

#[actix_rt::test]
async fn cursors_are_checked_and_old_ones_expire() {
    let s = TestServer::start_with(fixture(), |a| {
        a.changes_retention_days = 1;
        a.changes_retention_min = 2;
    })
    .await;
    let (_, first, _) = s.get("/sheets/10/changes?limit=1", ADA_READ).await;
    let start = first["nextCursor"].as_str().unwrap().to_owned();
    let other =
        s.get("/sheets/11/changes", ADA_READ).await.1["nextCursor"].as_str().unwrap().to_owned();
    let rows_cursor = s.get("/sheets/10/rows?limit=1", ADA_READ).await.1["nextCursor"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut tampered = start.clone().into_bytes();
    tampered[5] = if tampered[5] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    for bad in [&tampered, &other, &rows_cursor] {
        let reply = s.get(&format!("/sheets/10/changes?cursor={bad}"), ADA_READ).await;
        assert_error(&reply, 422, "validation_failed");
        assert_eq!(reply.1["detail"][0]["loc"], json!(["query", "cursor"]));
    }
    for wait in ["31", "-1", "soon"] {
        let reply = s.get(&format!("/sheets/10/changes?wait={wait}"), ADA_READ).await;
        assert_error(&reply, 422, "validation_failed");
        assert_eq!(reply.1["detail"][0]["loc"], json!(["query", "wait"]));
    }
    // Not readable: 404, as any read.
    assert_error(&s.get("/sheets/10/changes", ADA_SHEET11).await, 404, "not_found");
    assert_error(&s.get("/sheets/99/changes", ADA_READ).await, 404, "not_found");

    // Two days on, a write prunes all but the last 2 changes.
    s.clock.advance(Duration::from_secs(2 * 86_400));
    for n in 0..3 {
        s.post("/sheets/10/rows:bulkAdd", ADA_WRITE, &json!({"rows": [{"cells": {"102": n}}]}))
            .await;
    }
    s.clock.advance(Duration::from_secs(2 * 86_400));
    s.post("/sheets/10/rows:bulkAdd", ADA_WRITE, &json!({"rows": [{"cells": {"102": 3}}]})).await;
    let reply = s.get(&format!("/sheets/10/changes?cursor={start}"), ADA_READ).await;
    assert_error(&reply, 410, "cursor_expired");
    let oldest = reply.1["detail"]["oldestCursor"].as_str().unwrap();
    let (status, kept, _) = s.get(&format!("/sheets/10/changes?cursor={oldest}"), ADA_READ).await;
    assert_eq!(status, 200);
    let seqs: Vec<u64> =
        kept["data"].as_array().unwrap().iter().map(|c| c["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [7, 8], "the last two changes are kept");
    // Without a cursor the feed starts at the oldest kept change; a restart keeps it all.
    let mut s = s;
    s.restart().await;
    let (_, fresh, _) = s.get("/sheets/10/changes", ADA_READ).await;
    assert_eq!(fresh["data"], kept["data"]);
    assert_error(
        &s.get(&format!("/sheets/10/changes?cursor={start}"), ADA_READ).await,
        410,
        "cursor_expired",
    );
}

#[actix_rt::test]
async fn a_long_poll_wakes_when_a_write_is_durable_and_ends_empty_otherwise() {
    let s = TestServer::start().await;
    let (_, first, _) = s.get("/sheets/10/changes", ADA_READ).await;
    let cursor = first["nextCursor"].as_str().unwrap().to_owned();
    let url = format!("{}/sheets/10/changes?cursor={cursor}&wait=30", s.base);
    let poll = actix_rt::spawn(async move { send("GET", &url, Some(ADA_READ), &[], None).await });
    actix_rt::time::sleep(Duration::from_millis(300)).await;
    assert!(!poll.is_finished(), "held while nothing changes");
    s.post("/sheets/10/rows:bulkAdd", ADA_WRITE, &json!({"rows": [{"cells": {"100": "wake"}}]}))
        .await;
    let (status, page, _) = poll.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(page["data"][0]["row"]["cells"]["100"], "wake");

    let next = page["nextCursor"].as_str().unwrap();
    let (status, empty, _) =
        s.get(&format!("/sheets/10/changes?cursor={next}&wait=1"), ADA_READ).await;
    assert_eq!((status, &empty["data"]), (200, &json!([])));
    assert_eq!(empty["nextCursor"], next);

    // A key that loses access while waiting gets the 404 when the wait ends.
    let body = json!({"ownerId": 2, "name": "bob-folder", "grants": [{"verb": "read", "scopeType": "folder", "scopeId": 5}]});
    let bob =
        s.admin_call("POST", "/keys", Some(&body)).await.1["secret"].as_str().unwrap().to_owned();
    let url = format!("{}/sheets/10/changes?cursor={next}&wait=2", s.base);
    let poll = actix_rt::spawn(async move { send("GET", &url, Some(&bob), &[], None).await });
    actix_rt::time::sleep(Duration::from_millis(300)).await;
    let remove = json!({"userId": 2, "scopeType": "folder", "scopeId": 5, "role": "none"});
    assert_eq!(s.admin_call("PUT", "/shares", Some(&remove)).await.0, 200);
    assert_error(&poll.await.unwrap(), 404, "not_found");
}

/// The events of an event stream as `(id, data)`, read until `n` arrived.
async fn read_events(
    body: &mut (impl futures_util::Stream<Item = Result<actix_web::web::Bytes, awc::error::PayloadError>>
              + Unpin),
    buffer: &mut String,
    n: usize,
) -> Vec<(String, Value)> {
    let mut events = Vec::new();
    while events.len() < n {
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let id = block.lines().find_map(|l| l.strip_prefix("id: ")).map(str::to_owned);
            let data = block.lines().find_map(|l| l.strip_prefix("data: "));
            if let (Some(id), Some(data)) = (id, data) {
                events.push((id, serde_json::from_str(data).unwrap()));
            }
        }
        if events.len() >= n {
            break;
        }
        let chunk = tokio::time::timeout(Duration::from_secs(20), body.next())
            .await
            .expect("an event in time")
            .expect("the stream goes on")
            .unwrap();
        buffer.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    events
}

#[actix_rt::test]
async fn the_event_stream_resumes_with_last_event_id_and_ends_when_access_goes() {
    let s = TestServer::start().await;
    let body = json!({"ownerId": 1, "name": "reader", "grants": [{"verb": "read", "scopeType": "project", "scopeId": 1}]});
    let created = s.admin_call("POST", "/keys", Some(&body)).await.1;
    let (key_id, reader) =
        (created["keyId"].as_u64().unwrap(), created["secret"].as_str().unwrap().to_owned());
    let client = awc::Client::builder().timeout(Duration::from_secs(60)).finish();
    let open = |last: Option<String>| {
        let mut req = client
            .get(format!("{}/sheets/10/changes", s.base))
            .insert_header(("Authorization", format!("Bearer {reader}")))
            .insert_header(("Accept", "text/event-stream"))
            .insert_header(("Accept-Encoding", "gzip"));
        if let Some(last) = last {
            req = req.insert_header(("Last-Event-ID", last));
        }
        req.send()
    };
    let mut res = open(None).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers().get("content-type").unwrap(), "text/event-stream");
    assert!(
        res.headers().get("content-encoding").is_none(),
        "events are never buffered by a coder"
    );
    let mut buffer = String::new();
    let start = read_events(&mut res, &mut buffer, 4).await;
    assert_eq!(
        start.iter().map(|(_, c)| c["seq"].as_u64().unwrap()).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    let add = json!({"rows": [{"cells": {"100": "e1"}}, {"cells": {"100": "e2"}}, {"cells": {"100": "e3"}}]});
    s.post("/sheets/10/rows:bulkAdd", ADA_WRITE, &add).await;
    let live = read_events(&mut res, &mut buffer, 3).await;
    assert_eq!(
        live.iter().map(|(_, c)| c["row"]["cells"]["100"].as_str().unwrap()).collect::<Vec<_>>(),
        ["e1", "e2", "e3"]
    );
    // Each id is the cursor after its change: the JSON feed agrees.
    let (_, after, _) = s.get(&format!("/sheets/10/changes?cursor={}", live[0].0), ADA_READ).await;
    assert_eq!(after["data"][0]["seq"], 6);
    drop(res);

    // Resume after the second event.
    let mut res = open(Some(live[1].0.clone())).await.unwrap();
    let mut buffer = String::new();
    let resumed = read_events(&mut res, &mut buffer, 1).await;
    assert_eq!(resumed[0].1["seq"], 7);
    // Revoking the key ends the stream within about a second.
    s.admin_call("POST", &format!("/keys/{key_id}/revoke"), None).await;
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(chunk) = res.next().await {
            if chunk.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the stream ended after the revoke");
    // A bad Last-Event-ID is a 422 at the header.
    let reply = s
        .raw(
            "GET",
            &format!("{}/sheets/10/changes", s.base),
            Some(ADA_READ),
            &[("Accept", "text/event-stream"), ("Last-Event-ID", "nope")],
            None,
        )
        .await;
    assert_error(&reply, 422, "validation_failed");
    assert_eq!(reply.1["detail"][0]["loc"], json!(["header", "Last-Event-ID"]));
}

#[actix_rt::test]
async fn export_is_one_instant_in_ndjson_or_csv_and_its_cursor_lines_up_with_the_feed() {
    let s = TestServer::start().await;
    let tricky = "comma, \"quote\"\nnew line";
    let add = json!({"rows": [{"cells": {"100": tricky, "102": {"value": 2.5, "format": "0.0"}, "107": ["a", "b"]}}]});
    let added = s.post("/sheets/10/rows:bulkAdd", ADA_WRITE, &add).await.1;
    let new = added["results"][0]["row"]["id"].as_u64().unwrap();

    let follower = Follower::export(&s.base, ADA_READ, 10).await;
    assert_eq!(follower.rows, list_all(&s.base, ADA_READ, 10).await);

    let url = format!("{}/sheets/10/export?format=csv", s.base);
    let (status, body, headers) = send("GET", &url, Some(ADA_READ), &[], None).await;
    assert_eq!(status, 200);
    assert_eq!(headers.get("content-type").unwrap(), "text/csv; charset=utf-8");
    let text = body.as_str().unwrap().to_owned();
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let header: Vec<String> = reader.headers().unwrap().iter().map(str::to_owned).collect();
    assert_eq!(
        header,
        [
            "id", "version", "Task", "Status", "Hours", "Billable", "Due", "Seen", "Owner", "Tags",
            "Flag"
        ]
    );
    let records: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert_eq!(records.len(), 5);
    let mine = records.iter().find(|r| r[0] == *new.to_string()).unwrap();
    assert_eq!(&mine[2], tricky, "quoted per RFC 4180 and read back whole");
    assert_eq!(&mine[4], "2.5", "a wrapper as its value");
    assert_eq!(&mine[9], "[\"a\",\"b\"]", "a list as its JSON text");
    assert_eq!(&mine[3], "", "a missing cell is empty");
    let other = records.iter().find(|r| &r[0] == "1003").unwrap();
    assert_eq!((&other[3], &other[5], &other[6]), ("Done", "true", "2026-01-31"));

    // fields and filter, as on listRows.
    let filter = "%7B%22all%22%3A%5B%7B%22column%22%3A%22101%22%2C%22op%22%3A%22eq%22%2C%22value%22%3A%22Done%22%7D%5D%7D";
    let url = format!("{}/sheets/10/export?format=csv&fields=100,102&filter={filter}", s.base);
    let text = send("GET", &url, Some(ADA_READ), &[], None).await.1.as_str().unwrap().to_owned();
    assert_eq!(text, "id,version,Task,Hours\n1000,1,root,5\n1003,1,other,8\n");
    for (query, loc) in
        [("format=xml", "format"), ("fields=999", "fields"), ("filter=%7B", "filter")]
    {
        let reply = s.get(&format!("/sheets/10/export?{query}"), ADA_READ).await;
        assert_error(&reply, 422, "validation_failed");
        assert_eq!(reply.1["detail"][0]["loc"], json!(["query", loc]));
    }
    assert_error(&s.get("/sheets/10/export", ADA_SHEET11).await, 404, "not_found");

    // Export, write, follow: exactly the write.
    let mut follower = Follower::export(&s.base, ADA_READ, 10).await;
    let patch = json!({"version": 1, "cells": {"100": "after export"}});
    s.call("PATCH", &format!("/sheets/10/rows/{new}"), Some(ADA_WRITE), Some(&patch)).await;
    assert_eq!(follower.poll(&s.base, ADA_READ, 10, 0).await, Some(1));
    assert_eq!(follower.rows, list_all(&s.base, ADA_READ, 10).await);
}

#[actix_rt::test]
async fn exporting_200k_rows_while_writers_run_keeps_memory_flat() {
    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("seed.json");
    std::fs::write(&seed, fixture().to_string()).unwrap();
    // No checkpoint by size during the test: encoding the whole state is a cost of its own
    // that would hide what the export costs.
    let flags = ["--seed", seed.to_str().unwrap(), "--checkpoint-every-bytes", "100000000000"];
    let bin = Binary::start(&dir.path().join("data"), &flags).await;
    let pad = "x".repeat(300);
    for batch in 0..100u64 {
        let rows: Vec<Value> = (0..2000)
            .map(|i| json!({"cells": {"100": format!("{batch}-{i} {pad}"), "102": i}}))
            .collect();
        let reply = attempt(
            "POST",
            &format!("{}/sheets/10/rows:bulkAdd", bin.base),
            Some(json!({"rows": rows})),
        )
        .await;
        assert_eq!(reply.unwrap().0, 200);
    }
    let pid = bin.child.id();
    let before = rss_bytes(pid);

    let client = awc::Client::builder().timeout(Duration::from_secs(600)).finish();
    let mut res = client
        .get(format!("{}/sheets/10/export", bin.base))
        .insert_header(("Authorization", format!("Bearer {ADA_READ}")))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    // Writers add rows while it streams. They start once the export has answered, so its
    // instant (taken before the status line is sent) holds none of their rows.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let (base, stop) = (bin.base.clone(), stop.clone());
            actix_rt::spawn(async move {
                let mut done = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let body = json!({"rows": [{"cells": {"100": format!("w{w} {done}")}}]});
                    if attempt("POST", &format!("{base}/sheets/10/rows:bulkAdd"), Some(body))
                        .await
                        .is_some()
                    {
                        done += 1;
                    }
                }
                done
            })
        })
        .collect();
    let (mut bytes, mut lines, mut peak, mut partial) = (0usize, 0usize, before, Vec::new());
    let mut last_id = 0;
    while let Some(chunk) = res.next().await {
        let chunk = chunk.unwrap();
        bytes += chunk.len();
        partial.extend_from_slice(&chunk);
        while let Some(end) = partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = partial.drain(..=end).collect();
            let row: Value = serde_json::from_slice(&line).expect("every line parses");
            let id = row["id"].as_u64().unwrap();
            assert!(id > last_id, "ordered by id");
            last_id = id;
            lines += 1;
        }
        if lines % 20_000 < 1000 {
            peak = peak.max(rss_bytes(pid));
            // A slow reader: the server must wait, not buffer.
            actix_rt::time::sleep(Duration::from_millis(20)).await;
        }
    }
    peak = peak.max(rss_bytes(pid));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut written = 0;
    for w in writers {
        written += w.await.unwrap();
    }
    assert!(partial.is_empty());
    // One instant: the rows the sheet had when the export began, none of the writers' later ones.
    assert_eq!(lines, 4 + 200_000);
    assert!(written > 0);
    let growth = peak.saturating_sub(before);
    eprintln!(
        "export of {lines} rows ({bytes} bytes) beside {written} writes: RSS {before} -> peak {peak} (+{growth})"
    );
    assert!(
        growth < bytes as u64 / 4,
        "memory grew by {growth} bytes for a {bytes}-byte export: it must not hold the rows it sent"
    );
}

#[actix_rt::test]
async fn an_upsert_shows_in_the_feed_as_its_created_and_updated_items_only() {
    let s = TestServer::start().await;
    let (_, first, _) = s.get("/sheets/10/changes", ADA_READ).await;
    let cursor = first["nextCursor"].as_str().unwrap().to_owned();
    let body = json!({"keyColumn": "100", "rows": [
        {"cells": {"100": "fresh", "102": 1}},
        {"cells": {"100": "other", "102": 8}},
        {"cells": {"100": "root", "102": 6}},
        {"cells": {"100": "fresh", "102": 2}}
    ]});
    let (status, reply, _) = s.post("/sheets/10/rows:bulkUpsert", ADA_WRITE, &body).await;
    assert_eq!(status, 200, "{reply}");
    let actions: Vec<&str> = reply["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["created", "unchanged", "updated", "updated"]);
    let (_, page, _) = s.get(&format!("/sheets/10/changes?cursor={cursor}"), ADA_READ).await;
    let got: Vec<(&str, u64)> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["type"].as_str().unwrap(), c["version"].as_u64().unwrap()))
        .collect();
    assert_eq!(got, [("row.created", 1), ("row.updated", 2), ("row.updated", 2)]);
    assert_eq!(page["data"][2]["rowId"], reply["results"][0]["row"]["id"]);
}

#[actix_rt::test]
async fn a_quiet_event_stream_sends_a_keep_alive_comment_every_15_seconds() {
    let s = TestServer::start().await;
    let client = awc::Client::builder().timeout(Duration::from_secs(60)).finish();
    let mut res = client
        .get(format!("{}/sheets/10/changes", s.base))
        .insert_header(("Authorization", format!("Bearer {ADA_READ}")))
        .insert_header(("Accept", "text/event-stream"))
        .send()
        .await
        .unwrap();
    let mut buffer = String::new();
    read_events(&mut res, &mut buffer, 4).await;
    let opened = std::time::Instant::now();
    while !buffer.contains(": keep-alive\n\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(20), res.next())
            .await
            .expect("a comment within 20 s")
            .expect("the stream goes on")
            .unwrap();
        buffer.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    // Not before its time (a lower bound only: a slow machine can only make it later; the
    // margin covers the time the client took to read the events before it).
    assert!(opened.elapsed() >= Duration::from_secs(10), "{:?}", opened.elapsed());
}

#[actix_rt::test]
async fn a_stream_and_an_export_each_count_one_request_against_the_rate_limit() {
    let s = TestServer::start_with(fixture(), |a| a.rate_limit_per_minute = 3).await;
    let client = awc::Client::builder().timeout(Duration::from_secs(60)).finish();
    let mut stream = client
        .get(format!("{}/sheets/10/changes", s.base))
        .insert_header(("Authorization", format!("Bearer {ADA_READ}")))
        .insert_header(("Accept", "text/event-stream"))
        .send()
        .await
        .unwrap();
    let mut buffer = String::new();
    // Four events (and more to come while it is open) are one request.
    read_events(&mut stream, &mut buffer, 4).await;
    let (status, _, _) =
        send("GET", &format!("{}/sheets/10/export", s.base), Some(ADA_READ), &[], None).await;
    assert_eq!(status, 200);
    assert_eq!(s.get("/me", ADA_READ).await.0, 200, "the third request of the minute");
    assert_error(&s.get("/me", ADA_READ).await, 429, "rate_limit_exceeded");
}
