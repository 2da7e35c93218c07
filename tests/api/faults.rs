//! Faults of the disk under the data dir, through the built binary: a data dir on a small
//! tmpfs filled by writers until the file system refuses them.
//!
//! Mounting a tmpfs needs root. CI runs as root; elsewhere these tests fail (they never skip)
//! and say why.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::*;

/// A tmpfs of a given size mounted on a fresh temporary directory; unmounted on drop.
pub(crate) struct Tmpfs {
    pub(crate) mount: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    pub(crate) fn mount(mib: u64) -> Self {
        let uid = Command::new("id").arg("-u").output().expect("run id -u");
        assert_eq!(
            String::from_utf8_lossy(&uid.stdout).trim(),
            "0",
            "this test mounts a size-limited tmpfs and needs root (CI runs as root)"
        );
        let dir = tempfile::tempdir().unwrap();
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(&mount)
            .status()
            .expect("run mount");
        assert!(status.success(), "mount -t tmpfs failed: {status}");
        Tmpfs { mount, _dir: dir }
    }

    /// Grow (or shrink) the file system in place: how a test "frees space".
    fn resize(&self, mib: u64) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={mib}m")])
            .arg(&self.mount)
            .status()
            .expect("run mount -o remount");
        assert!(status.success(), "remount failed: {status}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

/// Fills the file system holding `dir` with a filler file until it refuses more.
pub(crate) fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![0xa5u8; 64 * 1024];
    while f.write_all(&chunk).is_ok() {}
    // Whatever is left is smaller than one chunk: take it byte-sized.
    while f.write_all(&chunk[..512]).is_ok() {}
    path
}

/// Every file under `dir` with its bytes.
fn contents(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            } else {
                out.insert(
                    path.strip_prefix(dir).unwrap().to_path_buf(),
                    std::fs::read(&path).unwrap(),
                );
            }
        }
    }
    out
}

/// Runs `sheetd <args>` to its end (bounded) and returns (success, stdout + stderr).
fn run_sheetd(args: &[&str], data_dir: &Path, envs: &[(&str, &Path)]) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sheetd"));
    cmd.args(args).arg("--data-dir").arg(data_dir);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    if args[0] == "serve" {
        cmd.args(["--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--admin-token"]);
        cmd.arg(ADMIN_TOKEN);
    }
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(_status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            return (out.status.success(), text);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "sheetd {args:?} still running after 60 s: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Adds 500-row batches to sheet 11 until a write is refused; returns the acknowledged row ids
/// with their text, and the refusal (`None` when the server went away instead of answering).
async fn write_until_refused(base: &str) -> (BTreeMap<u64, String>, Option<Reply>) {
    let mut acked = BTreeMap::new();
    for round in 0..5_000u64 {
        let rows: Vec<_> = (0..500u64)
            .map(|i| json!({"cells": {"110": format!("r{round}-{i}-{}", noise(round * 500 + i))}}))
            .collect();
        let client = awc::Client::builder().timeout(Duration::from_secs(60)).finish();
        let sent = client
            .post(format!("{base}/sheets/11/rows:bulkAdd"))
            .insert_header(("Authorization", format!("Bearer {ADA_WRITE}")))
            .insert_header(("Content-Type", "application/json"))
            .send_body(json!({ "rows": rows }).to_string())
            .await;
        let Ok(mut res) = sent else { return (acked, None) };
        let Ok(bytes) = res.body().limit(64 << 20).await else { return (acked, None) };
        let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        if res.status() != 200 {
            return (acked, Some((res.status().as_u16(), body, res.headers().clone())));
        }
        for r in body["results"].as_array().unwrap() {
            let row = &r["row"];
            acked.insert(row["id"].as_u64().unwrap(), row["cells"]["110"].as_str().unwrap().into());
        }
    }
    panic!("the file system never filled");
}

/// 300 characters zstd cannot shrink, different for each `seed`: the log compresses large
/// records, and a disk is filled by what it stores.
fn noise(seed: u64) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..300)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(ALPHABET[(x >> 58) as usize])
        })
        .collect()
}

/// Every row of sheet 11: id → Task text.
async fn all_rows(base: &str) -> BTreeMap<u64, String> {
    let rows = list_all(base, ADA_READ, 11).await;
    rows.into_iter()
        .map(|(id, r)| (id, r["cells"]["110"].as_str().unwrap_or_default().to_owned()))
        .collect()
}

/// Starts the binary on `data` with no fault, checks that every acknowledged row is there as it
/// was acknowledged, stops it cleanly and checks the data dir; returns every row it served.
async fn every_acknowledged_row_survives(
    data: &Path,
    acked: &BTreeMap<u64, String>,
) -> BTreeMap<u64, String> {
    let mut bin = Binary::start(data, &[]).await;
    let present = all_rows(&bin.base).await;
    for (id, text) in acked {
        assert_eq!(present.get(id), Some(text), "acknowledged row {id} is lost or wrong");
    }
    assert!(bin.terminate().success());
    let (ok, out) = run_sheetd(&["check"], data, &[]);
    assert!(ok, "check after a clean stop: {out}");
    present
}

/// The sequence that used to destroy a data dir: fill the disk, kill the server, try to start
/// (and to check) while the disk is still full. Both must refuse with a clear message and leave
/// every byte as it was; once space is back, every acknowledged row is served.
#[actix_rt::test]
async fn start_on_a_full_disk_changes_nothing_and_recovers_once_space_is_back() {
    let fs = Tmpfs::mount(32);
    let seed = fs.mount.join("seed.json");
    std::fs::write(&seed, fixture().to_string()).unwrap();
    let data = fs.mount.join("data");
    // No floor: the writers run the file system into ENOSPC itself.
    let flags = ["--seed", seed.to_str().unwrap(), "--min-free-disk-bytes", "0"];
    let mut bin = Binary::start(&data, &flags).await;
    let (acked, refusal) = write_until_refused(&bin.base).await;
    assert!(acked.len() >= 5_000, "the writers filled the disk: {} rows acknowledged", acked.len());
    // At ENOSPC the write is refused with 503 and reads go on from the durable data.
    assert_error(&refusal.expect("the server answered"), 503, "storage_unavailable");
    let (status, sheet, _) =
        send("GET", &format!("{}/sheets/11?limit=1", bin.base), Some(ADA_READ), &[], None).await;
    assert_eq!((status, sheet["rowCount"].as_u64()), (200, Some(1 + acked.len() as u64)));
    // Its own log lines cannot be written either (they live on the same full file system):
    // the server goes on answering all the same.
    assert_error(&add_row(&bin.base, "refused").await, 503, "storage_unavailable");
    bin.kill9();
    std::fs::remove_file(&seed).unwrap();
    let filler = fill(&fs.mount);

    let before = contents(&data);
    let (ok, out) = run_sheetd(&["serve"], &data, &[]);
    assert!(!ok, "serve must refuse a full disk: {out}");
    assert!(out.contains("free space"), "the message says what is wrong: {out}");
    assert_eq!(contents(&data), before, "a refused start changed the data dir");
    // `check` works on a private copy under $TMPDIR: here the same full file system.
    let (ok, out) = run_sheetd(&["check"], &data, &[("TMPDIR", &fs.mount)]);
    assert!(!ok, "check must fail when it cannot copy: {out}");
    assert_eq!(contents(&data), before, "a failed check changed the data dir");

    std::fs::remove_file(filler).unwrap();
    fs.resize(96);
    let (ok, out) = run_sheetd(&["check"], &data, &[]);
    // A kill mid-write may leave a torn, never-acknowledged last record: check reports it
    // (non-zero) and the next start drops it. Anything else is damage.
    assert!(ok || out.contains("is torn"), "check after space is back: {out}");

    every_acknowledged_row_survives(&data, &acked).await;
}

/// Below the free-space floor, writes get 503 `storage_unavailable` and change nothing, every
/// read goes on, health says why; once space is back writes resume without a restart, and a
/// SIGKILL afterwards loses nothing acknowledged.
#[actix_rt::test]
async fn below_the_floor_writes_get_503_reads_go_on_and_writes_resume_by_themselves() {
    let fs = Tmpfs::mount(64);
    let seed = fs.mount.join("seed.json");
    std::fs::write(&seed, fixture().to_string()).unwrap();
    let data = fs.mount.join("data");
    let floor = (40u64 << 20).to_string();
    let flags = ["--seed", seed.to_str().unwrap(), "--min-free-disk-bytes", floor.as_str()];
    let mut bin = Binary::start(&data, &flags).await;
    let (mut acked, refusal) = write_until_refused(&bin.base).await;
    assert!(acked.len() >= 5_000, "{} rows acknowledged before the floor", acked.len());
    let refusal = refusal.expect("the server answered the refused write");
    assert_error(&refusal, 503, "storage_unavailable");
    let retry: u64 =
        refusal.2.get("retry-after").expect("Retry-After").to_str().unwrap().parse().unwrap();
    assert!(retry >= 1);

    // Other writes are refused too, and nothing of them shows.
    let patch = json!({"version": 1, "cells": {"110": "changed"}});
    let reply = send(
        "PATCH",
        &format!("{}/sheets/11/rows/1100", bin.base),
        Some(ADA_WRITE),
        &[],
        Some(patch.to_string().into_bytes()),
    )
    .await;
    assert_error(&reply, 503, "storage_unavailable");
    // So is a large upsert, whose rows go into a copy of the sheet's state while its record is
    // encoded: none of them shows, and its key index forgets the rows it followed.
    let upsert = {
        let updates = acked.values().take(40).map(|text| json!({"cells": {"110": text, "112": 7}}));
        let creates = (0..40).map(|i| json!({"cells": {"110": format!("upserted {i}"), "112": 1}}));
        let rows: Vec<_> = updates.chain(creates).collect();
        json!({"keyColumn": "110", "rows": rows}).to_string().into_bytes()
    };
    let upsert_url = format!("{}/sheets/11/rows:bulkUpsert", bin.base);
    let reply = send("POST", &upsert_url, Some(ADA_WRITE), &[], Some(upsert.clone())).await;
    assert_error(&reply, 503, "storage_unavailable");
    // Reads are served from the durable state.
    let (status, sheet, _) =
        send("GET", &format!("{}/sheets/11?limit=1", bin.base), Some(ADA_READ), &[], None).await;
    assert_eq!(status, 200, "{sheet}");
    assert_eq!(sheet["rowCount"].as_u64(), Some(1 + acked.len() as u64), "{sheet}");
    let (status, row, _) =
        send("GET", &format!("{}/sheets/11/rows?limit=1", bin.base), Some(ADA_READ), &[], None)
            .await;
    assert_eq!(status, 200);
    assert_eq!(row["data"][0]["version"], 1, "the refused patch left no trace: {row}");
    for path in ["/me", "/sheets", "/sheets/11/columns", "/reports", "/reports/8"] {
        let (status, body, _) =
            send("GET", &format!("{}{path}", bin.base), Some(ADA_READ), &[], None).await;
        assert_eq!(status, 200, "GET {path} while writes are refused: {body}");
    }
    let (status, body, _) =
        send("POST", &format!("{}/reports/8/run", bin.base), Some(ADA_READ), &[], None).await;
    assert_eq!(status, 200, "{body}");
    let (_, health, _) =
        send("GET", &format!("{}/health", bin.admin), Some(ADMIN_TOKEN), &[], None).await;
    assert_eq!(health["status"], "degraded", "{health}");
    assert!(health["reason"].as_str().unwrap().contains("floor"), "{health}");
    let (_, metrics, _) =
        send("GET", &format!("{}/metrics", bin.admin), Some(ADMIN_TOKEN), &[], None).await;
    assert!(metrics.as_str().unwrap().contains("\nsheetd_storage_writable 0\n"), "{metrics}");
    // Governing the service still works: directory changes use the reserve.
    let (status, body, _) = send(
        "PUT",
        &format!("{}/users/2/plan", bin.admin),
        Some(ADMIN_TOKEN),
        &[],
        Some(json!({"plan": "paid"}).to_string().into_bytes()),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    fs.resize(160);
    let mut resumed = None;
    for _ in 0..40 {
        let body = json!({"rows": [{"cells": {"110": "after"}}]});
        let (status, body, _) = send(
            "POST",
            &format!("{}/sheets/11/rows:bulkAdd", bin.base),
            Some(ADA_WRITE),
            &[],
            Some(body.to_string().into_bytes()),
        )
        .await;
        if status == 200 {
            resumed = Some(body);
            break;
        }
        actix_rt::time::sleep(Duration::from_millis(250)).await;
    }
    let resumed =
        resumed.expect("writes resume within 10 s of space coming back, without a restart");
    acked.insert(resumed["results"][0]["row"]["id"].as_u64().unwrap(), "after".into());
    // The refused upsert again: its new keys are new, its others found as before.
    let (status, body, _) = send("POST", &upsert_url, Some(ADA_WRITE), &[], Some(upsert)).await;
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().unwrap();
    let actions: Vec<&str> =
        results.iter().map(|r| r["action"].as_str().unwrap_or("failed")).collect();
    assert_eq!(actions, [["updated"; 40], ["created"; 40]].concat(), "{body}");
    for r in &results[40..] {
        let row = &r["row"];
        acked.insert(row["id"].as_u64().unwrap(), row["cells"]["110"].as_str().unwrap().into());
    }
    let (_, health, _) =
        send("GET", &format!("{}/health", bin.admin), Some(ADMIN_TOKEN), &[], None).await;
    assert_eq!(health["status"], "ok", "{health}");

    bin.kill9();
    let present = every_acknowledged_row_survives(&data, &acked).await;
    assert_eq!(present.len(), 1 + acked.len(), "no refused write appeared");
}

/// libfiu's tools (Debian `fiu-utils`, installed by `.ci/run`): `fiu-run` starts a program
/// with failure points it can turn on, `fiu-ctrl` turns them on and off in a running one.
fn fiu_tools() {
    for tool in ["fiu-run", "fiu-ctrl"] {
        let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output();
        assert!(
            found.is_ok_and(|o| o.status.success()),
            "{tool} is needed to inject I/O faults: apt-get install fiu-utils (.ci/run does)"
        );
    }
}

/// Turns a libfiu failure point of a process started under `fiu-run` on or off.
fn fiu(pid: u32, on: bool, point: &str) {
    let verb = if on { "enable" } else { "disable" };
    let status = Command::new("fiu-ctrl")
        .args(["-c", &format!("{verb} name={point}"), &pid.to_string()])
        .status()
        .expect("run fiu-ctrl");
    assert!(status.success(), "fiu-ctrl {verb} {point}: {status}");
}

/// Adds one row to sheet 11: (status, body, headers).
async fn add_row(base: &str, text: &str) -> Reply {
    let body = json!({"rows": [{"cells": {"110": text}}]}).to_string().into_bytes();
    send("POST", &format!("{base}/sheets/11/rows:bulkAdd"), Some(ADA_WRITE), &[], Some(body)).await
}

/// Adds `n` rows to sheet 11, each acknowledged: id → text.
async fn add_rows(base: &str, prefix: &str, n: usize) -> BTreeMap<u64, String> {
    let mut acked = BTreeMap::new();
    for i in 0..n {
        let text = format!("{prefix}-{i}");
        let (status, body, _) = add_row(base, &text).await;
        assert_eq!(status, 200, "{body}");
        acked.insert(body["results"][0]["row"]["id"].as_u64().unwrap(), text);
    }
    acked
}

/// The row texts of sheet 11 (the fixture's row included).
async fn texts(base: &str) -> Vec<String> {
    all_rows(base).await.into_values().collect()
}

/// A failed fsync on a running server: writes get 503 and leave no trace, reads keep serving
/// the durable data, health says why; once the device works again the log re-opens itself
/// from disk and writes resume without a restart; a SIGKILL after that loses nothing.
#[actix_rt::test]
async fn a_failed_fsync_refuses_writes_keeps_reads_and_heals_without_a_restart() {
    fiu_tools();
    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("seed.json");
    std::fs::write(&seed, fixture().to_string()).unwrap();
    let data = dir.path().join("data");
    let mut bin =
        Binary::start_under(&["fiu-run", "-x"], &data, &["--seed", seed.to_str().unwrap()]).await;
    let pid = bin.child.id();
    let mut acked = add_rows(&bin.base, "before", 20).await;
    let before = texts(&bin.base).await;

    fiu(pid, true, "posix/io/sync/fdatasync");
    let refused = add_row(&bin.base, "refused").await;
    assert_error(&refused, 503, "storage_unavailable");
    assert!(refused.2.get("retry-after").is_some());
    assert_error(&add_row(&bin.base, "refused too").await, 503, "storage_unavailable");
    assert_eq!(texts(&bin.base).await, before, "reads serve the durable data, nothing refused");
    let (status, sheet, _) =
        send("GET", &format!("{}/sheets/11", bin.base), Some(ADA_READ), &[], None).await;
    assert_eq!((status, sheet["rowCount"].as_u64()), (200, Some(before.len() as u64)));
    let (_, health, _) =
        send("GET", &format!("{}/health", bin.admin), Some(ADMIN_TOKEN), &[], None).await;
    assert_eq!(health["status"], "degraded", "{health}");

    fiu(pid, false, "posix/io/sync/fdatasync");
    let mut resumed = None;
    for _ in 0..60 {
        let (status, body, _) = add_row(&bin.base, "after").await;
        if status == 200 {
            resumed = Some(body);
            break;
        }
        actix_rt::time::sleep(Duration::from_millis(250)).await;
    }
    let resumed = resumed.expect("writes resume within 15 s once fsync works, without a restart");
    acked.insert(resumed["results"][0]["row"]["id"].as_u64().unwrap(), "after".into());
    acked.extend(add_rows(&bin.base, "healed", 5).await);
    let (_, health, _) =
        send("GET", &format!("{}/health", bin.admin), Some(ADMIN_TOKEN), &[], None).await;
    assert_eq!(health["status"], "ok", "{health}");
    let log = std::fs::read_to_string(&bin.log).unwrap();
    assert!(log.contains("the data dir failed"), "the failure is logged");
    assert!(log.contains("writes resume"), "the recovery is logged");

    bin.kill9();
    let present = every_acknowledged_row_survives(&data, &acked).await;
    assert!(!present.values().any(|t| t.starts_with("refused")), "a refused write appeared");
    assert_eq!(present.len(), 1 + acked.len());
}

/// A device whose fsync fails under a checkpoint: the checkpoint fails and is retried, writes
/// (made durable by fdatasync) go on, and a graceful stop that cannot write its final
/// checkpoint exits non-zero saying so, losing nothing: the next start recovers every row.
#[actix_rt::test]
async fn a_checkpoint_on_a_sick_disk_fails_cleanly_and_a_graceful_stop_says_so() {
    fiu_tools();
    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("seed.json");
    std::fs::write(&seed, fixture().to_string()).unwrap();
    let data = dir.path().join("data");
    let flags = ["--seed", seed.to_str().unwrap(), "--checkpoint-every-secs", "1"];
    let mut bin = Binary::start_under(&["fiu-run", "-x"], &data, &flags).await;
    let mut acked = add_rows(&bin.base, "before", 10).await;

    fiu(bin.child.id(), true, "posix/io/sync/fsync");
    acked.extend(add_rows(&bin.base, "during", 10).await);
    let deadline = Instant::now() + Duration::from_secs(15);
    while !std::fs::read_to_string(&bin.log).unwrap().contains("background checkpoint failed") {
        assert!(Instant::now() < deadline, "no checkpoint was tried on the sick disk");
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    acked.extend(add_rows(&bin.base, "still", 5).await);

    let status = bin.terminate();
    assert!(!status.success(), "a stop that could not checkpoint must not exit 0");
    let log = std::fs::read_to_string(&bin.log).unwrap();
    assert!(log.contains("final checkpoint"), "the exit says what failed: {log}");

    every_acknowledged_row_survives(&data, &acked).await;
}

/// A start on a device that refuses fsync stops before anything is written: a clear message,
/// a non-zero exit, every byte of the data dir as it was; a later start serves everything.
#[actix_rt::test]
async fn a_start_on_a_device_that_refuses_fsync_changes_nothing() {
    fiu_tools();
    let dir = tempfile::tempdir().unwrap();
    let (mut bin, data) = Binary::seeded(dir.path()).await;
    let acked = add_rows(&bin.base, "row", 10).await;
    bin.kill9();
    let before = contents(&data);

    let mut cmd = Command::new("fiu-run");
    cmd.args(["-x", "-c", "enable name=posix/io/sync/fsync", env!("CARGO_BIN_EXE_sheetd")]);
    cmd.args(["serve", "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--data-dir"]);
    let out = cmd.arg(&data).output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a start on a failing device must not succeed: {text}");
    assert!(text.contains("refuses writes"), "the message says what is wrong: {text}");
    assert_eq!(contents(&data), before, "a refused start changed the data dir");

    every_acknowledged_row_survives(&data, &acked).await;
}

/// Total bytes of the files under `dir`, which a live server may be changing: a file or
/// directory it removes between the listing and the look at it (a checkpoint's temporary
/// file, renamed into place) counts as gone.
fn disk_bytes(dir: &Path) -> u64 {
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(entries) => entries,
            Err(e) if gone(&e) => continue,
            Err(e) => panic!("list {}: {e}", d.display()),
        };
        for entry in entries {
            let entry = entry.unwrap_or_else(|e| panic!("list {}: {e}", d.display()));
            match entry.metadata() {
                Ok(meta) if meta.is_dir() => stack.push(entry.path()),
                Ok(meta) => total += meta.len(),
                Err(e) if gone(&e) => {}
                Err(e) => panic!("stat {}: {e}", entry.path().display()),
            }
        }
    }
    total
}

/// Mixed writes (patches and bulk updates of the writers' own rows: the sheet keeps its size,
/// and no delete event piles up in the 7-day outbox) with a checkpoint every 2 seconds, for `SHEETD_SOAK_SECS` (300 under CI, 30
/// otherwise): every second the data dir stays within twice the checkpoint plus the log's
/// live bytes (those after the checkpoint and those the change feed retains), plus the fixed room of an almost empty log store (sled's files before a
/// checkpoint rewrites them: the 32 MiB threshold and its own segments); resident memory after
/// the first quarter stays flat; and every acknowledged write reads back.
#[actix_rt::test]
async fn a_soak_of_mixed_writes_keeps_disk_and_memory_bounded() {
    let default = if std::env::var_os("CI").is_some() { 300 } else { 30 };
    let secs: u64 =
        std::env::var("SHEETD_SOAK_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("seed.json");
    std::fs::write(&seed, fixture().to_string()).unwrap();
    let data = dir.path().join("data");
    // The change feed keeps only its last 5,000 changes here: with the default retention (7
    // days) a soak of minutes keeps every change, and the data dir grows by design.
    let flags = [
        "--seed",
        seed.to_str().unwrap(),
        "--checkpoint-every-secs",
        "2",
        "--changes-retention-days",
        "0",
        "--changes-retention-min",
        "5000",
    ];
    let mut bin = Binary::start(&data, &flags).await;
    let pid = bin.child.id();

    let duration = format!("{secs}s");
    let args = sheetd_bench::BenchArgs::parse_flags([
        "--url",
        bin.base.as_str(),
        "--key",
        ADA_WRITE,
        "--sheet-ids",
        "11",
        "--workload",
        "mixed",
        "--mix",
        "patch=70,bulk-update=30",
        "--bulk-size",
        "20",
        "--concurrency",
        "8",
        "--duration",
        duration.as_str(),
        "--warmup",
        "0s",
        "--verify",
    ])
    .unwrap();
    let load = actix_rt::spawn(async move { sheetd_bench::execute(&args, None).await });

    const SLACK: u64 = 48 << 20;
    let (mut worst, mut largest, mut rss) = (0.0f64, 0u64, Vec::new());
    while !load.is_finished() {
        actix_rt::time::sleep(Duration::from_secs(1)).await;
        let live = metric(&bin.admin, "sheetd_wal_bytes_since_checkpoint").await as u64
            + metric(&bin.admin, "sheetd_wal_retained_bytes").await as u64;
        let checkpoint = std::fs::metadata(data.join("checkpoint")).map_or(0, |m| m.len());
        let on_disk = disk_bytes(&data);
        let bound = 2 * (checkpoint + live) + SLACK;
        assert!(
            on_disk <= bound,
            "data dir {on_disk} bytes > 2 x ({checkpoint} + {live}) + {SLACK}"
        );
        worst = worst.max(on_disk as f64 / (checkpoint + live).max(1) as f64);
        largest = largest.max(on_disk);
        rss.push(rss_bytes(pid));
    }
    let report = load.await.unwrap().expect("the load ran");
    assert!(report.passed, "{}", report.table());
    let verify = report.verify.as_ref().expect("verified");
    assert_eq!((verify.lost, verify.wrong, verify.not_deleted), (0, 0, 0));
    let warm = rss[rss.len() / 4];
    let late = *rss[rss.len() / 2..].iter().max().unwrap();
    eprintln!(
        "soak {secs} s: {} requests, data dir at most {} MB ({worst:.1}x checkpoint + live log), RSS {} MB after warm-up, at most {} MB in the second half",
        report.levels[0].requests, largest >> 20, warm >> 20, late >> 20
    );
    assert!(late <= warm + warm / 4 + (16 << 20), "RSS grew: {warm} -> {late} bytes");
    assert!(bin.terminate().success());
}
