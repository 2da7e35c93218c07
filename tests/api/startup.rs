//! Start-up: the embedded demo workspace, seeding, and refusing a bad fixture whole.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

use crate::common::*;

#[actix_rt::test]
async fn an_empty_data_dir_gets_the_demo_workspace_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut bin = Binary::start(&data, &[]).await;
    let keys_file = data.join("demo-keys.txt");
    let mode = std::fs::metadata(&keys_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let text = std::fs::read_to_string(&keys_file).unwrap();
    let key = text
        .lines()
        .find_map(|l| l.split_whitespace().nth(3).filter(|_| l.contains("ada-write")))
        .expect("the ada-write demo key")
        .to_owned();
    let get = |base: String, path: &'static str, key: String| async move {
        send("GET", &format!("{base}{path}"), Some(&key), &[], None).await
    };
    let (status, sheets, _) = get(bin.base.clone(), "/sheets", key.clone()).await;
    assert_eq!(status, 200);
    assert!(sheets["data"].as_array().unwrap().len() >= 2);
    let (_, tasks, _) = get(bin.base.clone(), "/sheets/10", key.clone()).await;
    let mut types: Vec<String> = tasks["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap().to_owned())
        .collect();
    types.sort();
    assert_eq!(
        types,
        [
            "checkbox",
            "contact",
            "date",
            "datetime",
            "dropdown",
            "multi_select",
            "number",
            "symbol",
            "text"
        ],
        "every column type"
    );
    let (_, reports, _) = get(bin.base.clone(), "/reports", key.clone()).await;
    let kinds: Vec<&str> =
        reports["data"].as_array().unwrap().iter().map(|r| r["type"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"row") && kinds.contains(&"summary"), "{kinds:?}");
    let before = without_request_id(get(bin.base.clone(), "/sheets/10/rows", key.clone()).await.1);
    assert!(bin.terminate().success());
    // A restart loads nothing again and serves the same data with the same keys.
    let bin = Binary::start(&data, &[]).await;
    assert_eq!(std::fs::read_to_string(&keys_file).unwrap(), text, "keys are not issued twice");
    let after = without_request_id(get(bin.base.clone(), "/sheets/10/rows", key.clone()).await.1);
    assert_eq!(before, after);
    let log = std::fs::read_to_string(&bin.log).unwrap();
    assert!(!log.contains("seeded an empty data dir"), "{log}");
    assert!(!log.contains(&key), "secrets never reach the log");
}

#[test]
fn the_demo_secrets_are_printed_once_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Port 0 everywhere; the process is stopped as soon as it prints its secrets.
    let mut child = Command::new(env!("CARGO_BIN_EXE_sheetd"))
        .args(["serve", "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = String::new();
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = [0u8; 4096];
    while !out.contains("Admin token") {
        let n = std::io::Read::read(&mut stdout, &mut buf).unwrap();
        assert!(n > 0, "stdout closed early: {out}");
        out.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let file = std::fs::read_to_string(data.join("demo-keys.txt")).unwrap();
    for secret in file
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter(|s| s.starts_with("svc_live_"))
    {
        assert_eq!(out.matches(secret).count(), 1, "printed once: {secret}");
    }
}

#[test]
fn a_bad_fixture_is_refused_whole_naming_the_offending_object() {
    let dir = tempfile::tempdir().unwrap();
    let mut fx = fixture();
    // The fourth row has a cell its column refuses.
    fx["rows"][3]["cells"]["102"] = json!("lots");
    let seed = dir.path().join("bad.json");
    std::fs::write(&seed, fx.to_string()).unwrap();
    let data = dir.path().join("data");
    let out = Command::new(env!("CARGO_BIN_EXE_sheetd"))
        .args(["serve", "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .arg("--seed")
        .arg(&seed)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rows[3] (id 1003)") && err.contains("column 102"), "{err}");
    // Nothing of it was applied: a later start with a good seed works from scratch.
    std::fs::write(&seed, fixture().to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sheetd"))
        .args(["check", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("0 users") && report.contains("0 rows"), "{report}");
}

#[actix_rt::test]
async fn import_refuses_clashes_and_bad_references_whole() {
    let s = TestServer::start().await;
    let cases: [(Value, &str); 5] = [
        (json!({"users": [{"id": 1, "name": "again"}]}), "users[0] (id 1)"),
        (json!({"sheets": [{"id": 30, "projectId": 77, "name": "x"}]}), "project 77"),
        (
            json!({"sheets": [{"id": 30, "projectId": 1, "name": "x"}],
                "rows": [{"id": 5000, "sheetId": 30}, {"id": 5001, "sheetId": 30, "parentId": 4999}]}),
            "rows[1] (id 5001)",
        ),
        (
            json!({"keys": [{"ownerId": 1, "name": "k", "secret": "svc_live_short", "grants": []}]}),
            "keys[0]",
        ),
        (
            json!({"shares": [{"userId": 1, "scopeType": "sheet", "scopeId": 404, "role": "viewer"}]}),
            "shares[0]",
        ),
    ];
    for (fx, needle) in cases {
        let r = s.admin_call("POST", "/import", Some(&fx)).await;
        assert_error(&r, 422, "validation_failed");
        assert!(r.1["message"].as_str().unwrap().contains(needle), "{needle}: {}", r.1);
    }
    let (_, sheets, _) = s.get("/sheets", BOB_ALL).await;
    assert_eq!(
        sheets["data"].as_array().unwrap().len(),
        2,
        "nothing of a refused import was applied"
    );
    // A good import adds its objects and they are served at once.
    let (status, body, _) = s
        .admin_call(
            "POST",
            "/import",
            Some(&json!({"sheets": [{"id": 30, "projectId": 2, "name": "New"}],
                          "columns": [{"id": 300, "sheetId": 30, "name": "N", "type": "number"}],
                          "rows": [{"id": 9000, "sheetId": 30, "cells": {"300": "4"}}]})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (_, rows, _) = s.get("/sheets/30/rows", BOB_ALL).await;
    assert_eq!(rows["data"][0]["cells"], json!({"300": 4}));
}

#[actix_rt::test]
async fn damage_before_the_tail_stops_start_up_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let (mut bin, data) = Binary::seeded(dir.path()).await;
    let url = format!("{}/sheets/11/rows:bulkAdd", bin.base);
    for _ in 0..3 {
        let body = json!({"rows": [{"cells": {"110": "x"}}]}).to_string().into_bytes();
        assert_eq!(send("POST", &url, Some(ADA_WRITE), &[], Some(body)).await.0, 200);
    }
    bin.kill9();
    // Record 2 is a write in the middle of the log: losing it silently would lose an
    // acknowledged write, so the server must refuse to start.
    wal::testing::damage_record(&data, 2, 12).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sheetd"))
        .args(["serve", "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("record 2") && err.contains("damaged"), "{err}");
}

/// A data dir written by the build before the change feed and codec format 2 (cells as JSON
/// text): its checkpoint, without a change index, and the log records after it, made by that
/// build's binary (`tests/data/format1-data-dir.tar.gz`: the demo workspace, writes, a clean
/// stop, more writes, then SIGKILL). `format1-rows.json` is what that build served before the
/// kill. The feed of such a dir starts with the first change after its last checkpoint.
#[actix_rt::test]
async fn a_data_dir_of_the_previous_format_opens_with_every_row_and_feeds_its_later_changes() {
    let dir = tempfile::tempdir().unwrap();
    let archive = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/format1-data-dir.tar.gz");
    let unpacked = Command::new("tar").arg("xzf").arg(archive).arg("-C").arg(dir.path()).status();
    assert!(unpacked.unwrap().success());
    let data = dir.path().join("d");
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/format1-rows.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let keys = std::fs::read_to_string(data.join("demo-keys.txt")).unwrap();
    let key = keys
        .lines()
        .find_map(|l| l.split_whitespace().nth(3).filter(|_| l.contains("ada-write")))
        .unwrap()
        .to_owned();
    let mut s = TestServer::start_with(fixture(), |a| {
        a.data_dir = data.clone();
        a.seed = None;
    })
    .await;
    for round in 0..2 {
        for sheet in ["10", "11"] {
            let (status, page, _) = s.get(&format!("/sheets/{sheet}/rows?limit=500"), &key).await;
            assert_eq!(status, 200);
            let mut rows = page["data"].clone();
            if round == 1 && sheet == "10" {
                // The write made after the upgrade.
                assert_eq!(rows[2]["cells"]["100"], "after the upgrade");
                rows[2] = expected["10"][2].clone();
            }
            assert_eq!(rows, expected[sheet], "sheet {sheet}, round {round}");
        }
        // The records after the old checkpoint were replayed into the feed (the patch of 2002
        // and the subtree delete of 1000) and are read back from format-1 records.
        let (status, feed, _) = s.get("/sheets/10/changes", &key).await;
        assert_eq!(status, 200, "{feed}");
        let got: Vec<(u64, &str, u64)> = feed["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let (seq, kind) = (c["seq"].as_u64().unwrap(), c["type"].as_str().unwrap());
                (seq, kind, c["rowId"].as_u64().unwrap())
            })
            .collect();
        let mut want = vec![
            (1, "row.updated", 2002),
            (2, "row.deleted", 1000),
            (3, "row.deleted", 1001),
            (4, "row.deleted", 1002),
        ];
        if round == 1 {
            want.push((5, "row.updated", 2001));
        }
        assert_eq!(got, want);
        assert_eq!(feed["data"][0]["row"], expected["10"][3]);
        if round == 0 {
            let patch = json!({"version": 1, "cells": {"100": "after the upgrade"}});
            let reply = s.call("PATCH", "/sheets/10/rows/2001", Some(&key), Some(&patch)).await;
            assert_eq!(reply.0, 200, "{}", reply.1);
            // A clean stop writes a checkpoint of the current format; the next start reads it.
            s.restart().await;
        }
    }
}
