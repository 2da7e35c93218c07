//! The log archive and restores to a point in time, through the real binary: `sheetd serve
//! --archive-dir`, then `sheetd restore --archive-dir (--until T | --until-position N)`, whose
//! result serves exactly the state at that point; a gap, a damaged segment and a point before
//! the backup refused before anything is written; an archive on a full disk that falls behind
//! (health and metrics say so, writes go on) and catches up with no gap once space is back.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::backup::{args, field, path, sheetd, stderr};
use crate::common::*;
use crate::faults::{fill, Tmpfs};

async fn health(admin: &str) -> Value {
    let (status, body, _) =
        send("GET", &format!("{admin}/health"), Some(ADMIN_TOKEN), &[], None).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// Waits (up to a minute: a bound on a hang, not a measure of speed) until `done(health)`.
async fn wait_health(admin: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let h = health(admin).await;
        if done(&h) {
            return h;
        }
        assert!(Instant::now() < deadline, "never {what}: {h}");
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the archive holds every durable record, without an error.
async fn caught_up(admin: &str) -> Value {
    wait_health(admin, "caught up", |h| {
        let a = &h["archive"];
        a["lastError"].is_null() && a["position"].as_u64() >= a["durableLsn"].as_u64()
    })
    .await
}

async fn add_row(base: &str, text: &str) -> u64 {
    let body = json!({"rows": [{"cells": {"110": text}}]}).to_string().into_bytes();
    let url = format!("{base}/sheets/11/rows:bulkAdd");
    let (status, reply, _) = send("POST", &url, Some(ADA_WRITE), &[], Some(body)).await;
    assert_eq!(status, 200, "{reply}");
    reply["results"][0]["row"]["id"].as_u64().unwrap()
}

async fn durable(admin: &str) -> u64 {
    metric(admin, "sheetd_wal_durable_lsn").await as u64
}

fn rfc3339(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// `sheetd restore --from FILE --data-dir TARGET` with `extra` flags.
async fn restore(file: &Path, target: &Path, extra: &[&str]) -> Output {
    let mut list = args(&["restore", "--from", path(file), "--data-dir", path(target)]);
    list.extend(args(extra));
    sheetd(list).await
}

/// The texts of sheet 11's rows on a server started on `data`.
async fn texts_of(data: &Path) -> BTreeSet<String> {
    let server = Binary::start(data, &[]).await;
    let rows = list_all(&server.base, ADA_READ, 11).await;
    rows.values().filter_map(|r| r["cells"]["110"].as_str().map(str::to_owned)).collect()
}

/// The LSN a restore rolled forward to, from its output.
fn rolled_to(out: &Output) -> u64 {
    let line = field(out, "rolled forward: to LSN ");
    line.split(' ').next().unwrap().parse().unwrap()
}

/// `sheetd backup` of the running server in `admin` into `file`; its position.
async fn backup(admin: &str, file: &Path) -> u64 {
    let admin_url = admin.trim_end_matches("/admin/v1");
    let out = sheetd(args(&[
        "backup",
        "--admin-url",
        admin_url,
        "--admin-token",
        ADMIN_TOKEN,
        "--out",
        path(file),
    ]))
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    field(&out, "position: LSN ").split(' ').next().unwrap().parse().unwrap()
}

/// The segment of `dir` holding `lsn`.
fn segment_holding(dir: &Path, lsn: u64) -> PathBuf {
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let Some((first, last)) = name.strip_suffix(".seg").and_then(|n| n.split_once('-')) else {
            continue;
        };
        let (first, last): (u64, u64) = (first.parse().unwrap(), last.parse().unwrap());
        if (first..=last).contains(&lsn) {
            return dir.join(name);
        }
    }
    panic!("no segment in {} holds {lsn}", dir.display());
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

async fn refused(file: &Path, target: &Path, extra: &[&str], expect: &str) -> String {
    let out = restore(file, target, extra).await;
    assert!(!out.status.success(), "restored with {extra:?}");
    assert!(stderr(&out).contains(expect), "{extra:?}: {}", stderr(&out));
    assert!(!target.exists(), "{extra:?}: the target was written");
    stderr(&out)
}

#[actix_rt::test]
async fn a_backup_rolls_forward_to_a_point_in_time_and_gaps_damage_and_early_points_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive");
    let seed = dir.path().join("seed.json");
    std::fs::write(&seed, fixture().to_string()).unwrap();
    let data = dir.path().join("data");
    let flags =
        ["--seed", path(&seed), "--archive-dir", path(&archive), "--archive-seal-ms", "100"];
    let server = Binary::start(&data, &flags).await;
    let before_backup = rfc3339(chrono::Utc::now());
    actix_rt::time::sleep(Duration::from_millis(20)).await;
    let file = dir.path().join("base.backup");
    let position = backup(&server.admin, &file).await;

    add_row(&server.base, "A").await;
    let lsn_a = durable(&server.admin).await;
    actix_rt::time::sleep(Duration::from_millis(400)).await;
    let between = rfc3339(chrono::Utc::now());
    actix_rt::time::sleep(Duration::from_millis(400)).await;
    add_row(&server.base, "B").await;
    let lsn_b = durable(&server.admin).await;
    let after_b = rfc3339(chrono::Utc::now() + chrono::Duration::seconds(1));
    assert!(position < lsn_a && lsn_a < lsn_b, "{position} {lsn_a} {lsn_b}");
    let h = caught_up(&server.admin).await;
    assert_eq!(h["status"], "ok", "{h}");
    assert_eq!(h["archive"]["gaps"], json!([]), "{h}");
    let (status, live, _) =
        send("GET", &format!("{}/cluster/digest", server.admin), Some(ADMIN_TOKEN), &[], None)
            .await;
    assert_eq!(status, 200, "{live}");
    let a = |name: &str| dir.path().join(name);

    // --until between A and B: A, not B; the restored server's next record follows the point.
    let out = restore(
        &file,
        &a("until-between"),
        &["--archive-dir", path(&archive), "--until", &between],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let point = rolled_to(&out);
    assert!((lsn_a..lsn_b).contains(&point), "{point} not in {lsn_a}..{lsn_b}");
    let texts = texts_of(&a("until-between")).await;
    assert!(texts.contains("A") && !texts.contains("B"), "{texts:?}");
    {
        let restored = Binary::start(&a("until-between"), &[]).await;
        assert_eq!(durable(&restored.admin).await, point);
        add_row(&restored.base, "C").await;
        assert_eq!(durable(&restored.admin).await, point + 1, "the next record gets point + 1");
    }

    // --until after B: both, and exactly the live state.
    let out =
        restore(&file, &a("until-after"), &["--archive-dir", path(&archive), "--until", &after_b])
            .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(rolled_to(&out) >= lsn_b);
    assert_eq!(field(&out, "restored digest: "), live["digest"].as_str().unwrap());
    let texts = texts_of(&a("until-after")).await;
    assert!(texts.contains("A") && texts.contains("B"), "{texts:?}");

    // --until-position likewise.
    let at_a = lsn_a.to_string();
    let out =
        restore(&file, &a("at-a"), &["--archive-dir", path(&archive), "--until-position", &at_a])
            .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(rolled_to(&out), lsn_a);
    let texts = texts_of(&a("at-a")).await;
    assert!(texts.contains("A") && !texts.contains("B"), "{texts:?}");
    let at_b = lsn_b.to_string();
    let out =
        restore(&file, &a("at-b"), &["--archive-dir", path(&archive), "--until-position", &at_b])
            .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(rolled_to(&out), lsn_b);
    assert_eq!(field(&out, "restored digest: "), live["digest"].as_str().unwrap());
    let check = sheetd(args(&["check", "--data-dir", path(&a("at-b"))])).await;
    assert_eq!(field(&check, "digest: "), live["digest"].as_str().unwrap());
    let texts = texts_of(&a("at-b")).await;
    assert!(texts.contains("A") && texts.contains("B"), "{texts:?}");

    // A missing segment: a gap, refused, nothing written.
    let (segment_a, segment_b) =
        (segment_holding(&archive, lsn_a), segment_holding(&archive, lsn_b));
    assert_ne!(segment_a, segment_b, "A and B were sealed apart");
    let gap = a("archive-gap");
    copy_dir(&archive, &gap);
    std::fs::remove_file(gap.join(segment_a.file_name().unwrap())).unwrap();
    refused(
        &file,
        &a("gap"),
        &["--archive-dir", path(&gap), "--until-position", &at_b],
        "has a gap",
    )
    .await;

    // A damaged segment.
    let damaged = a("archive-damaged");
    copy_dir(&archive, &damaged);
    let victim = damaged.join(segment_b.file_name().unwrap());
    let mut bytes = std::fs::read(&victim).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x10;
    std::fs::write(&victim, bytes).unwrap();
    let message = refused(
        &file,
        &a("damaged"),
        &["--archive-dir", path(&damaged), "--until-position", &at_b],
        "is damaged",
    )
    .await;
    assert!(message.contains("archive segment"), "{message}");

    // A point before the backup.
    refused(
        &file,
        &a("early"),
        &["--archive-dir", path(&archive), "--until", &before_backup],
        "before the backup's time",
    )
    .await;
    let early = (position - 1).to_string();
    refused(
        &file,
        &a("early-position"),
        &["--archive-dir", path(&archive), "--until-position", &early],
        "before the backup's position",
    )
    .await;
    // Past the archive's end, by position.
    let far = (lsn_b + 1_000_000).to_string();
    refused(
        &file,
        &a("far"),
        &["--archive-dir", path(&archive), "--until-position", &far],
        "past the archive's end",
    )
    .await;
    // --until without an archive is a usage error.
    refused(&file, &a("no-archive"), &["--until", &between], "--archive-dir").await;
}

/// The archive dir on a full file system: writes go on, health and metrics say the archive is
/// behind and why, checkpoints keep what it has not taken, and once space is back it catches
/// up with no gap, so a backup taken before rolls forward to the newest record.
#[actix_rt::test]
async fn an_archive_on_a_full_disk_falls_behind_says_so_and_catches_up_without_a_gap() {
    let fs = Tmpfs::mount(8);
    let dir = tempfile::tempdir().unwrap();
    let archive = fs.mount.join("archive");
    let seed = dir.path().join("seed.json");
    std::fs::write(&seed, fixture().to_string()).unwrap();
    let data = dir.path().join("data");
    let flags = [
        "--seed",
        path(&seed),
        "--archive-dir",
        path(&archive),
        "--archive-seal-ms",
        "100",
        "--checkpoint-every-records",
        "20",
        // The change feed keeps nothing, so only the archive's hold keeps records from a
        // checkpoint's truncation.
        "--changes-retention-days",
        "0",
        "--changes-retention-min",
        "0",
    ];
    let server = Binary::start(&data, &flags).await;
    let file = dir.path().join("base.backup");
    backup(&server.admin, &file).await;
    caught_up(&server.admin).await;

    let filler = fill(&fs.mount);
    let mut ids = Vec::new();
    for n in 0..60 {
        ids.push(add_row(&server.base, &format!("while full {n} {}", "x".repeat(2000))).await);
    }
    let h = wait_health(&server.admin, "degraded by the archive", |h| {
        h["status"] == "degraded" && h["archive"]["lastError"].is_string()
    })
    .await;
    assert!(h["archive"]["lagRecords"].as_u64().unwrap() > 0, "{h}");
    assert!(h["reason"].as_str().unwrap().contains("archive"), "{h}");
    assert_eq!(metric(&server.admin, "sheetd_archive_failing").await, 1.0);
    // A checkpoint runs past what the archive holds: it must keep those records for it.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let checkpoint = metric(&server.admin, "sheetd_wal_checkpoint_lsn").await;
        let position = metric(&server.admin, "sheetd_archive_position_lsn").await;
        if checkpoint > position {
            break;
        }
        assert!(Instant::now() < deadline, "no checkpoint past the archive's {position}");
        add_row(&server.base, "one more").await;
        actix_rt::time::sleep(Duration::from_millis(200)).await;
    }
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(log.contains("the log archive cannot write"), "{log}");

    std::fs::remove_file(filler).unwrap();
    let h = caught_up(&server.admin).await;
    assert_eq!(h["status"], "ok", "{h}");
    assert_eq!(h["archive"]["gaps"], json!([]), "no gap: {h}");
    assert_eq!(metric(&server.admin, "sheetd_archive_failing").await, 0.0);
    assert_eq!(metric(&server.admin, "sheetd_archive_gaps_total").await, 0.0);
    let newest = durable(&server.admin).await;
    caught_up(&server.admin).await;
    let live = list_all(&server.base, ADA_READ, 11).await;

    // (The digest would differ: it covers the change feed's index, which this server prunes
    // by its own retention flags and a restore by the defaults. The rows must not.)
    let target = dir.path().join("restored");
    let out = restore(&file, &target, &["--archive-dir", path(&archive)]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(rolled_to(&out) >= newest, "rolled forward to the newest record");
    let restored = Binary::start(&target, &[]).await;
    let rows = list_all(&restored.base, ADA_READ, 11).await;
    for id in ids {
        assert!(rows.contains_key(&id), "row {id}, written while the archive was full, is there");
    }
    assert_eq!(rows, live, "the restored rows are the live ones");
}

/// Two servers never archive into one dir: the second refuses to start, says why and names
/// the dir, and exits without a panic; the first goes on archiving.
#[actix_rt::test]
async fn a_second_server_on_an_archive_dir_in_use_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("archive");
    let flags = ["--archive-dir", path(&archive), "--archive-seal-ms", "100"];
    let first = Binary::start(&dir.path().join("one"), &flags).await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sheetd"))
        .args(["serve", "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("two"))
        .args(flags)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another server archives into") && err.contains(path(&archive)), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let health = health(&first.admin).await;
    assert_eq!(health["archive"]["lastError"], Value::Null, "{health}");
    assert_eq!(health["status"], "ok", "{health}");
}
