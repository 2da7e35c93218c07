//! Backups through the real binary: `sheetd backup` of a running server under concurrent
//! writes and of a stopped data dir, `sheetd backup verify`, and `sheetd restore`, whose result
//! starts and serves exactly the backed-up state (rows, the change feed, cursors); damaged and
//! cut-short files and non-empty targets refused, each with its own message, nothing written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::*;

/// Run the built `sheetd` with `args` on a blocking thread, so writers on this runtime go on.
pub(crate) async fn sheetd(args: Vec<String>) -> Output {
    actix_web::rt::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_sheetd")).args(&args).output().expect("sheetd runs")
    })
    .await
    .unwrap()
}

pub(crate) fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

pub(crate) fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The value after `name` on a line of `out`'s stdout, e.g. `digest: `.
pub(crate) fn field(out: &Output, name: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find_map(|l| l.strip_prefix(name));
    line.unwrap_or_else(|| panic!("no `{name}` in {stdout}")).trim().to_owned()
}

pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// An acknowledged write: the row's id, version and text, when the answer came, and when the
/// request was sent.
type Acked = Arc<Mutex<Vec<(u64, u64, String, Instant, Instant)>>>;

/// Adds two rows to sheet 11 and patches the first, recording each answer.
async fn writer(base: String, n: usize, acked: Acked, stop: Arc<AtomicBool>) {
    let client = awc::Client::builder().timeout(Duration::from_secs(30)).finish();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let text = format!("w{n}-{i}");
        let body =
            json!({"rows": [{"cells": {"110": text}}, {"cells": {"110": format!("{text}b")}}]});
        let sent = Instant::now();
        let mut res = client
            .post(format!("{base}/sheets/11/rows:bulkAdd"))
            .insert_header(("Authorization", format!("Bearer {ADA_WRITE}")))
            .insert_header(("Content-Type", "application/json"))
            .send_body(body.to_string())
            .await
            .expect("the server answers");
        assert_eq!(res.status(), 200);
        let v: Value = serde_json::from_slice(&res.body().await.unwrap()).unwrap();
        let now = Instant::now();
        let rows: Vec<Value> =
            v["results"].as_array().unwrap().iter().map(|r| r["row"].clone()).collect();
        for row in &rows {
            let (id, version) = (row["id"].as_u64().unwrap(), row["version"].as_u64().unwrap());
            let text = row["cells"]["110"].as_str().unwrap().to_owned();
            acked.lock().unwrap().push((id, version, text, now, sent));
        }
        let id = rows[0]["id"].as_u64().unwrap();
        let patch = json!({"version": 1, "cells": {"110": format!("{text}-patched")}});
        let sent = Instant::now();
        let mut res = client
            .patch(format!("{base}/sheets/11/rows/{id}"))
            .insert_header(("Authorization", format!("Bearer {ADA_WRITE}")))
            .insert_header(("Content-Type", "application/json"))
            .send_body(patch.to_string())
            .await
            .expect("the server answers");
        assert_eq!(res.status(), 200);
        let v: Value = serde_json::from_slice(&res.body().await.unwrap()).unwrap();
        let text = v["cells"]["110"].as_str().unwrap().to_owned();
        let version = v["version"].as_u64().unwrap();
        acked.lock().unwrap().push((id, version, text, Instant::now(), sent));
    }
}

/// A change as (seq, type, row, version).
type Changes = Vec<(u64, String, u64, u64)>;

/// Every change of a sheet's feed from its oldest retained one, and the cursor after the first
/// page that reaches `mark` changes, with how many changes it follows.
async fn feed(base: &str, sheet: u64, mark: usize) -> (Changes, Option<(String, usize)>) {
    let (mut all, mut marked) = (Vec::new(), None);
    let mut url = format!("{base}/sheets/{sheet}/changes?limit=7");
    loop {
        let (status, page, _) = send("GET", &url, Some(ADA_READ), &[], None).await;
        assert_eq!(status, 200, "{page}");
        let changes = page["data"].as_array().unwrap();
        for c in changes {
            all.push((
                c["seq"].as_u64().unwrap(),
                c["type"].as_str().unwrap().to_owned(),
                c["rowId"].as_u64().unwrap(),
                c["version"].as_u64().unwrap(),
            ));
        }
        let cursor = page["nextCursor"].as_str().unwrap().to_owned();
        if all.len() >= mark && marked.is_none() {
            marked = Some((cursor.clone(), all.len()));
        }
        if changes.is_empty() {
            return (all, marked);
        }
        url = format!("{base}/sheets/{sheet}/changes?limit=7&cursor={cursor}");
    }
}

#[actix_rt::test]
async fn an_online_backup_under_writes_restores_exactly_an_acknowledged_state() {
    let dir = tempfile::tempdir().unwrap();
    let (source, _) = Binary::seeded(dir.path()).await;
    let fixture_rows = list_all(&source.base, ADA_READ, 11).await;
    let (acked, stop): (Acked, _) = (Arc::default(), Arc::new(AtomicBool::new(false)));
    // 64 connections, each adding rows and patching them.
    let writers: Vec<_> = (0..64)
        .map(|n| actix_rt::spawn(writer(source.base.clone(), n, acked.clone(), stop.clone())))
        .collect();
    actix_rt::time::sleep(Duration::from_millis(800)).await;
    let file = dir.path().join("online.backup");
    let admin_url = source.admin.trim_end_matches("/admin/v1").to_owned();
    let refused = sheetd(args(&[
        "backup",
        "--admin-url",
        &admin_url,
        "--admin-token",
        "adm_not_the_token",
        "--out",
        path(&file),
    ]))
    .await;
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("401"), "{}", stderr(&refused));
    assert!(!stderr(&refused).contains("adm_not_the_token"), "the token is never printed");
    assert!(!file.exists() && !dir.path().join("online.backup.tmp").exists());
    let began = Instant::now();
    let out = sheetd(args(&[
        "backup",
        "--admin-url",
        &admin_url,
        "--admin-token",
        ADMIN_TOKEN,
        "--out",
        path(&file),
    ]))
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let ended = Instant::now();
    actix_rt::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.iter().filter(|a| a.3 < began).count() > 50, "writes went on before");
    assert!(acked.iter().any(|a| a.3 > ended), "writes went on after");
    let digest = field(&out, "digest: ");
    let position: u64 = field(&out, "position: LSN ").split(' ').next().unwrap().parse().unwrap();
    assert!(!dir.path().join("online.backup.tmp").exists());

    let verified = sheetd(args(&["backup", "verify", path(&file)])).await;
    assert!(verified.status.success(), "{}", stderr(&verified));
    assert_eq!(field(&verified, "digest: "), digest);

    let target = dir.path().join("restored");
    let restored =
        sheetd(args(&["restore", "--from", path(&file), "--data-dir", path(&target)])).await;
    assert!(restored.status.success(), "{}", stderr(&restored));
    let check = sheetd(args(&["check", "--data-dir", path(&target)])).await;
    assert!(check.status.success(), "{}", stderr(&check));
    assert_eq!(
        field(&check, "digest: "),
        digest,
        "the restored dir recovers to the manifest's state"
    );
    assert!(field(&check, "log: ").ends_with(&format!("last LSN {position}")));

    let copy = Binary::start(&target, &[]).await;
    let rows = list_all(&copy.base, ADA_READ, 11).await;
    let every: BTreeSet<(u64, u64, String)> =
        acked.iter().map(|(id, v, t, _, _)| (*id, *v, t.clone())).collect();
    for (id, row) in &rows {
        let found = (
            *id,
            row["version"].as_u64().unwrap(),
            row["cells"]["110"].as_str().unwrap_or_default().to_owned(),
        );
        assert!(
            fixture_rows.get(id) == Some(row) || every.contains(&found),
            "row {id} was never acknowledged as {row}"
        );
    }
    // None written after it: a request sent once the backup had ended is not in it.
    for (id, version, _, _, sent) in &acked {
        if *sent > ended {
            let found = rows.get(id).map(|r| r["version"].as_u64().unwrap());
            assert!(found < Some(*version), "row {id} v{version}, sent after the backup, is in it");
        }
    }
    assert!(acked.iter().any(|a| a.4 > ended), "writes were sent after the backup");
    // The restored server's own digest of its state is the manifest's.
    let (restored_position, restored_digest) = live_digest(&copy.admin).await;
    assert_eq!(restored_digest, digest, "the restored server serves the manifest's state");
    assert!(restored_position > position, "its digest's marker follows the backup's position");
    let mut before: BTreeMap<u64, u64> = BTreeMap::new();
    for (id, version, _, at, _) in &acked {
        if *at < began {
            let v = before.entry(*id).or_default();
            *v = (*v).max(*version);
        }
    }
    for (id, version) in &before {
        let row = rows
            .get(id)
            .unwrap_or_else(|| panic!("row {id}, acknowledged before the backup, is missing"));
        assert!(row["version"].as_u64().unwrap() >= *version, "row {id} lost version {version}");
    }

    // The same feed: seq 1..N as the source shows its first N changes, and a cursor of the
    // source continues on the copy at the same place.
    let (restored_feed, _) = feed(&copy.base, 11, 0).await;
    let mark = restored_feed.len() / 2;
    let (source_feed, cursor) = feed(&source.base, 11, mark).await;
    assert!(!restored_feed.is_empty() && restored_feed[0].0 == 1);
    assert!(source_feed.len() > restored_feed.len(), "the source went on after the backup");
    assert_eq!(restored_feed, source_feed[..restored_feed.len()]);
    let (cursor, followed) = cursor.unwrap();
    assert!(followed < restored_feed.len());
    let url = format!("{}/sheets/11/changes?cursor={cursor}", copy.base);
    let (status, page, _) = send("GET", &url, Some(ADA_READ), &[], None).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["data"][0]["seq"].as_u64(), Some(followed as u64 + 1));
}

#[actix_rt::test]
async fn an_offline_backup_round_trips_and_damage_is_refused_with_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let (mut source, data) = Binary::seeded(dir.path()).await;
    // Over a few MiB of rows, so the file has several blocks.
    for n in 0..30 {
        let rows: Vec<Value> = (0..100)
            .map(|i| json!({"cells": {"110": format!("row {n}-{i} {}", "lorem ipsum ".repeat(3 + (i * 7 + n) % 40))}}))
            .collect();
        let (status, body, _) = send(
            "POST",
            &format!("{}/sheets/11/rows:bulkAdd", source.base),
            Some(ADA_WRITE),
            &[("Content-Type", "application/json")],
            Some(json!({"rows": rows}).to_string().into_bytes()),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let rows = list_all(&source.base, ADA_READ, 11).await;
    let file = dir.path().join("offline.backup");
    let refused = sheetd(args(&["backup", "--data-dir", path(&data), "--out", path(&file)])).await;
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("in use"), "{}", stderr(&refused));
    assert!(!file.exists() && !dir.path().join("offline.backup.tmp").exists());
    assert!(source.terminate().success());

    let out = sheetd(args(&["backup", "--data-dir", path(&data), "--out", path(&file)])).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let digest = field(&out, "digest: ");
    let check = sheetd(args(&["check", "--data-dir", path(&data)])).await;
    assert_eq!(field(&check, "digest: "), digest, "the backup holds the data dir's state");
    let verified = sheetd(args(&["backup", "verify", path(&file)])).await;
    assert!(verified.status.success(), "{}", stderr(&verified));
    assert_eq!(field(&verified, "digest: "), digest);

    let target = dir.path().join("restored");
    let restored =
        sheetd(args(&["restore", "--from", path(&file), "--data-dir", path(&target)])).await;
    assert!(restored.status.success(), "{}", stderr(&restored));
    let copy = Binary::start(&target, &[]).await;
    assert_eq!(list_all(&copy.base, ADA_READ, 11).await, rows);
    drop(copy);

    // A restore refuses each of these with its own message and writes nothing.
    let bytes = std::fs::read(&file).unwrap();
    let refuse = |name: &'static str, content: Vec<u8>, expect: &'static str| {
        let (file, target) = (dir.path().join(name), dir.path().join(format!("{name}.target")));
        std::fs::write(&file, content).unwrap();
        async move {
            let out =
                sheetd(args(&["restore", "--from", path(&file), "--data-dir", path(&target)]))
                    .await;
            assert!(!out.status.success(), "{name} restored");
            assert!(stderr(&out).contains(expect), "{name}: {}", stderr(&out));
            assert!(!target.exists(), "{name}: the target was written");
            let out = sheetd(args(&["backup", "verify", path(&file)])).await;
            assert!(!out.status.success() && stderr(&out).contains(expect), "{}", stderr(&out));
            stderr(&out)
        }
    };
    let mut flipped = bytes.clone();
    let middle = bytes.len() / 2;
    flipped[middle] ^= 0x20;
    let message = refuse("flipped", flipped, "is damaged").await;
    let block = message.split("block ").nth(1).and_then(|m| m.split(' ').next()?.parse().ok());
    let block: u64 = block.unwrap_or_else(|| panic!("no block named: {message}"));
    assert!(block > 0, "the damage is found in the block it hit, not the first: {message}");
    refuse("cut", bytes[..bytes.len() * 2 / 3].to_vec(), "cut short").await;

    let occupied = dir.path().join("occupied");
    std::fs::create_dir(&occupied).unwrap();
    std::fs::write(occupied.join("keep.txt"), b"mine").unwrap();
    let out =
        sheetd(args(&["restore", "--from", path(&file), "--data-dir", path(&occupied)])).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("is not empty"), "{}", stderr(&out));
    let left: Vec<_> =
        std::fs::read_dir(&occupied).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["keep.txt"]);
    assert_eq!(std::fs::read(occupied.join("keep.txt")).unwrap(), b"mine");
}

/// `GET /admin/v1/cluster/digest` of the live state at a position: `(appliedIndex, digest)`.
async fn live_digest(admin: &str) -> (u64, String) {
    let (status, body, _) =
        send("GET", &format!("{admin}/cluster/digest"), Some(ADMIN_TOKEN), &[], None).await;
    assert_eq!(status, 200, "{body}");
    let digest = body["digest"].as_str().unwrap().to_owned();
    assert!(digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()), "{body}");
    (body["appliedIndex"].as_u64().unwrap(), digest)
}

#[actix_rt::test]
async fn the_live_digest_follows_the_state_across_a_crash_and_agrees_with_check() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, data) = Binary::seeded(dir.path()).await;
    let (status, _, _) =
        send("GET", &format!("{}/cluster/digest", server.admin), None, &[], None).await;
    assert_eq!(status, 401, "the admin token is needed");

    let (first, before) = live_digest(&server.admin).await;
    // Taking a digest appends a marker: the position moves, the state does not.
    let (second, same) = live_digest(&server.admin).await;
    assert!(second > first, "{first} then {second}");
    assert_eq!(same, before, "a marker changes no state");

    let (status, body, _) = send(
        "POST",
        &format!("{}/sheets/11/rows:bulkAdd", server.base),
        Some(ADA_WRITE),
        &[("Content-Type", "application/json")],
        Some(json!({"rows": [{"cells": {"110": "digest me"}}]}).to_string().into_bytes()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (_, written) = live_digest(&server.admin).await;
    assert_ne!(written, before, "an acknowledged write is in the digest");

    // A crash and a replay rebuild the very state the live server held.
    server.kill9();
    let mut server = Binary::start(&data, &[]).await;
    assert_eq!(live_digest(&server.admin).await.1, written, "recovery reaches the same state");
    assert!(server.terminate().success());
    let check = sheetd(args(&["check", "--data-dir", path(&data)])).await;
    assert!(check.status.success(), "{}", stderr(&check));
    assert_eq!(field(&check, "digest: "), written, "`sheetd check` rebuilds the same state");
}
