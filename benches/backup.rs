//! Backups' figures, measured in one run on the built `sheetd` binary (release) on a temporary
//! data dir over loopback, driven by `sheetd bench` (the library `sheetd_bench`):
//!
//! 1. a sheet of 1,000,000 rows loaded through bulkAdd (2,000-row bodies, 8 connections);
//! 2. the online backup of that state (`sheetd backup --admin-url`) and its restore (`sheetd
//!    restore`), each timed as the operator's command takes it, wall clock;
//! 3. patchRow of distinct rows at 64 connections (a 1,000-row sheet), 5 s: without a backup,
//!    then while online backups run back to back, alternated twice: the writers' p99;
//! 4. the same patch load on a server with and without `--archive-dir`, alternated twice
//!    each, restarted on the same data dir: the writers' durable rate (each acknowledged patch is
//!    durable), and the archive's lag at the end of the run;
//! 5. the same patch load while background checkpoints of the whole state run back to back
//!    (`--checkpoint-every-secs 1`), paced as by default and unpaced, alternated: the writers'
//!    p99 and max.
//!
//! Run: `cargo bench --bench backup` (`-- --quick` for 100,000 rows). Nothing here asserts a
//! duration: it prints.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sheetd_bench::{self as bench, BenchArgs, Report};

const KEY: &str = "svc_live_BackupBenchKey00000000000000000000001";
const ADMIN: &str = "adm_backup_bench";
const BIG: u64 = 1;
const SMALL: u64 = 3;

fn cells(i: usize, base: u64) -> Value {
    let c = |id: u64| (id + base).to_string();
    json!({c(100): format!("Task number {i} with some text"), c(101): if i.is_multiple_of(2) { "Open" } else { "Done" },
           c(102): i as f64 * 1.5, c(103): i.is_multiple_of(3), c(104): "2026-01-31", c(105): "2026-01-31T23:00:00Z",
           c(106): "x@y.z", c(107): ["a", "c"], c(108): "Red"})
}

/// The engine bench's data: a big sheet (1) to load, and a 1,000-row sheet (3) to patch.
fn fixture() -> Value {
    let columns: Vec<Value> = [BIG, SMALL]
        .iter()
        .flat_map(|&s| {
            [
                json!({"id": 100, "name": "Task", "type": "text", "primary": true}),
                json!({"id": 101, "name": "Status", "type": "dropdown", "options": ["Open", "Done"]}),
                json!({"id": 102, "name": "Hours", "type": "number"}),
                json!({"id": 103, "name": "Billable", "type": "checkbox"}),
                json!({"id": 104, "name": "Due", "type": "date"}),
                json!({"id": 105, "name": "Seen", "type": "datetime"}),
                json!({"id": 106, "name": "Owner", "type": "contact"}),
                json!({"id": 107, "name": "Tags", "type": "multi_select", "options": ["a", "b", "c"]}),
                json!({"id": 108, "name": "Flag", "type": "symbol", "options": ["Red", "Green"]}),
            ]
            .into_iter()
            .enumerate()
            .map(move |(pos, mut c)| {
                c["id"] = json!(c["id"].as_u64().unwrap() + (s - 1) * 1000);
                c["sheetId"] = json!(s);
                c["position"] = json!(pos);
                c
            })
        })
        .collect();
    let rows: Vec<Value> = (0..1000)
        .map(|i| json!({"id": 900_000_000 + i, "sheetId": SMALL, "cells": cells(i, 2000)}))
        .collect();
    json!({
        "plans": {"paid": {"maxRowsPerSheet": 5_000_000}},
        "users": [{"id": 1, "name": "bench", "plan": "paid"}],
        "projects": [{"id": 1, "name": "Backup", "ownerId": 1}],
        "sheets": [{"id": BIG, "projectId": 1, "name": "B"}, {"id": SMALL, "projectId": 1, "name": "S"}],
        "columns": columns,
        "rows": rows,
        "keys": [{"id": 1, "ownerId": 1, "name": "all", "secret": KEY,
                  "grants": [{"verb": "write", "scopeType": "account", "scopeId": null}]}]
    })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The server under test: the release binary.
struct Server {
    child: Child,
    base: String,
    admin: String,
}

impl Server {
    async fn start(data: &Path, extra: &[&str]) -> Server {
        let (port, admin) = (free_port(), free_port());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sheetd"));
        cmd.args(["serve", "--data-dir"]).arg(data);
        cmd.args([
            "--addr",
            &format!("127.0.0.1:{port}"),
            "--admin-addr",
            &format!("127.0.0.1:{admin}"),
        ]);
        cmd.args(["--admin-token", ADMIN, "--rate-limit-per-minute", "1000000000"]);
        cmd.args(["--max-body-bytes", "67108864"]);
        cmd.args(extra);
        cmd.env("RUST_LOG", "warn");
        let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("sheetd starts");
        let server = Server {
            child,
            base: format!("http://127.0.0.1:{port}/api/v1"),
            admin: format!("http://127.0.0.1:{admin}/admin/v1"),
        };
        loop {
            if get(&format!("{}/health", server.admin)).await.0 == 200 {
                return server;
            }
            actix_rt::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn terminate(mut self) {
        Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        self.child.wait().unwrap();
    }
}

/// A metric's value from a server's Prometheus text (0 if it is not there).
async fn metric(admin: &str, name: &str) -> f64 {
    let client = awc::Client::builder().timeout(Duration::from_secs(60)).finish();
    let url = format!("{admin}/metrics");
    let Ok(mut res) =
        client.get(&url).insert_header(("Authorization", format!("Bearer {ADMIN}"))).send().await
    else {
        return 0.0;
    };
    let text = res.body().limit(16 << 20).await.unwrap_or_default();
    let prefix = format!("{name} ");
    String::from_utf8_lossy(&text)
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

async fn get(url: &str) -> (u16, Value) {
    let client = awc::Client::builder().timeout(Duration::from_secs(60)).finish();
    match client.get(url).insert_header(("Authorization", format!("Bearer {ADMIN}"))).send().await {
        Ok(mut res) => {
            let body = res.body().limit(1 << 30).await.unwrap_or_default();
            (res.status().as_u16(), serde_json::from_slice(&body).unwrap_or(Value::Null))
        }
        Err(_) => (0, Value::Null),
    }
}

async fn run_bench(flags: &[&str]) -> Report {
    let args = BenchArgs::parse_flags(flags).expect("valid bench flags");
    let report = bench::execute(&args, None).await.expect("bench runs");
    assert!(report.passed, "the bench run had errors:\n{}", report.table());
    report
}

/// Runs the `sheetd` binary with `args` on a blocking thread: its output and wall time.
async fn sheetd(args: Vec<String>) -> (std::process::Output, f64) {
    actix_rt::task::spawn_blocking(move || {
        let started = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_sheetd")).args(&args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (out, started.elapsed().as_secs_f64())
    })
    .await
    .unwrap()
}

fn backup_args(admin: &str, out: &Path) -> Vec<String> {
    let url = admin.trim_end_matches("/admin/v1").to_owned();
    ["backup", "--admin-url", &url, "--admin-token", ADMIN, "--out"]
        .iter()
        .map(|s| (*s).to_owned())
        .chain([out.display().to_string()])
        .collect()
}

/// patchRow of distinct rows of the small sheet at 64 connections for 5 s.
async fn patch64(base: &str) -> Report {
    run_bench(&[
        "--url",
        base,
        "--key",
        KEY,
        "--workload",
        "patch",
        "--concurrency",
        "64",
        "--duration",
        "5s",
        "--warmup",
        "1s",
        "--sheet-ids",
        &SMALL.to_string(),
    ])
    .await
}

/// CPU seconds of process `pid` and of its thread named `sheetd-archive` (0 without one).
fn cpu_seconds(pid: u32) -> (f64, f64) {
    // Fields 14 and 15 of a stat line (after the command's parenthesis): user and system
    // ticks, 100 a second.
    let ticks = |stat: &str| {
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
    };
    let total = ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap());
    let mut archiver = 0.0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() == "sheetd-archive" {
            archiver += ticks(&std::fs::read_to_string(task.path().join("stat")).unwrap());
        }
    }
    (total, archiver)
}

fn row(what: &str, now: String) {
    println!("| {what:<70} | {now:<44} |");
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let big_rows: usize = if quick { 100_000 } else { 1_000_000 };
    actix_rt::System::new().block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        let seed = dir.path().join("seed.json");
        std::fs::write(&seed, fixture().to_string()).unwrap();
        let data = dir.path().join("data");
        let server = Server::start(&data, &["--seed", seed.to_str().unwrap()]).await;

        // 1. The load.
        let requests = (big_rows / 2000).to_string();
        run_bench(&[
            "--url",
            &server.base,
            "--key",
            KEY,
            "--sheet-ids",
            "1",
            "--workload",
            "bulk-add",
            "--bulk-size",
            "2000",
            "--concurrency",
            "8",
            "--requests",
            &requests,
            "--warmup",
            "0s",
        ])
        .await;

        // 2. Backup and restore, timed as the operator's commands.
        let file = dir.path().join("state.backup");
        let (_, backup_secs) = sheetd(backup_args(&server.admin, &file)).await;
        let backup_bytes = std::fs::metadata(&file).unwrap().len();
        // The check alone, which both commands include: the backup's after receiving the file,
        // the restore's before writing anything.
        let (_, verify_secs) = sheetd(
            ["backup", "verify"]
                .iter()
                .map(|s| (*s).to_owned())
                .chain([file.display().to_string()])
                .collect(),
        )
        .await;
        let restored = dir.path().join("restored");
        let (_, restore_secs) = sheetd(
            [
                "restore",
                "--from",
                &file.display().to_string(),
                "--data-dir",
                &restored.display().to_string(),
            ]
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
        )
        .await;
        std::fs::remove_dir_all(&restored).unwrap();

        // 3. Writers' p99 without and during online backups, alternated: backups by the
        //    operator's command (which also checks what it received, on these same 2 cores),
        //    and backups streamed from `GET /admin/v1/backup` and dropped (the server's side
        //    alone, as when the command runs on another machine).
        let (mut quiet, mut during, mut streamed, mut backups, mut streams) =
            (Vec::new(), Vec::new(), Vec::new(), 0u64, 0u64);
        for _ in 0..2 {
            quiet.push(patch64(&server.base).await.levels[0].clone());
            let stop = Arc::new(AtomicBool::new(false));
            let taken = Arc::new(AtomicU64::new(0));
            let looping = {
                let (stop, taken) = (stop.clone(), taken.clone());
                let args = backup_args(&server.admin, &dir.path().join("loop.backup"));
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        let out = Command::new(env!("CARGO_BIN_EXE_sheetd"))
                            .args(&args)
                            .output()
                            .unwrap();
                        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
                        taken.fetch_add(1, Ordering::Relaxed);
                    }
                })
            };
            // The first backup's copies are taken before the load's measured part begins.
            actix_rt::time::sleep(Duration::from_millis(300)).await;
            during.push(patch64(&server.base).await.levels[0].clone());
            stop.store(true, Ordering::Release);
            actix_rt::task::spawn_blocking(move || looping.join().unwrap()).await.unwrap();
            backups += taken.load(Ordering::Relaxed);

            let stop = Arc::new(AtomicBool::new(false));
            let streaming = {
                let (stop, url) = (stop.clone(), format!("{}/backup", server.admin));
                actix_rt::spawn(async move {
                    let client = awc::Client::builder().disable_timeout().finish();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Acquire) {
                        let mut res = client
                            .get(&url)
                            .insert_header(("Authorization", format!("Bearer {ADMIN}")))
                            .send()
                            .await
                            .expect("backup requested");
                        assert_eq!(res.status(), 200);
                        while let Some(chunk) = futures_util::StreamExt::next(&mut res).await {
                            chunk.expect("the backup streams");
                        }
                        n += 1;
                    }
                    n
                })
            };
            actix_rt::time::sleep(Duration::from_millis(300)).await;
            streamed.push(patch64(&server.base).await.levels[0].clone());
            stop.store(true, Ordering::Release);
            streams += streaming.await.unwrap();
        }
        server.terminate();

        // 4. The archive's cost to the writers' durable rate, alternated on the same data dir
        //    (the order flips each pair, so a drift of the shared machine falls on both), and
        //    the CPU its thread took against the whole server's during the archived runs.
        let archive: PathBuf = dir.path().join("archive");
        let archive_flag = archive.display().to_string();
        let (mut plain, mut archived, mut lags, mut cpu) =
            (Vec::new(), Vec::new(), Vec::new(), (0.0, 0.0));
        for pair in 0..4 {
            for with_archive in if pair % 2 == 0 { [false, true] } else { [true, false] } {
                let flags: &[&str] =
                    if with_archive { &["--archive-dir", &archive_flag] } else { &[] };
                let server = Server::start(&data, flags).await;
                let before = cpu_seconds(server.child.id());
                let rate = patch64(&server.base).await.levels[0].requests_per_second;
                let after = cpu_seconds(server.child.id());
                if with_archive {
                    archived.push(rate);
                    cpu.0 += after.1 - before.1;
                    cpu.1 += after.0 - before.0;
                    let (_, health) = get(&format!("{}/health", server.admin)).await;
                    lags.push(health["archive"]["lagRecords"].as_u64().unwrap_or(0));
                } else {
                    plain.push(rate);
                }
                server.terminate();
            }
        }

        // 5. Writers' latency while background checkpoints of the whole state run back to back
        //    (`--checkpoint-every-secs 1`), paced (`--background-cpu-percent`'s default) and
        //    unpaced (100), alternated, the order flipped each pair.
        let mut checkpointing: Vec<(bool, bench::report::LevelView, f64)> = Vec::new();
        for pair in 0..2 {
            for paced in if pair % 2 == 0 { [true, false] } else { [false, true] } {
                let share = if paced { "10" } else { "100" };
                let flags = ["--checkpoint-every-secs", "1", "--background-cpu-percent", share];
                let server = Server::start(&data, &flags).await;
                let before = metric(&server.admin, "sheetd_wal_checkpoints_total").await;
                let level = patch64(&server.base).await.levels[0].clone();
                let written = metric(&server.admin, "sheetd_wal_checkpoints_total").await - before;
                checkpointing.push((paced, level, written));
                server.terminate();
            }
        }

        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        println!("\nbackup bench: {big_rows} rows in the big sheet (+1,000 in the patched one)\n");
        row(
            "online backup (sheetd backup --admin-url, received and verified)",
            format!("{backup_secs:.2} s, {:.0} MB", backup_bytes as f64 / 1e6),
        );
        row("of which the check (sheetd backup verify)", format!("{verify_secs:.2} s"));
        row(
            "restore (sheetd restore: verify, write, recover and check)",
            format!("{restore_secs:.2} s"),
        );
        for (i, (q, d)) in quiet.iter().zip(&during).enumerate() {
            row(
                &format!("patchRow 64 conns, run {}: without / during backup commands", i + 1),
                format!(
                    "p99 {:.1} / {:.1} ms, {:.1}k / {:.1}k req/s",
                    q.latency_ms.p99,
                    d.latency_ms.p99,
                    q.requests_per_second / 1e3,
                    d.requests_per_second / 1e3
                ),
            );
        }
        for (i, (q, d)) in quiet.iter().zip(&streamed).enumerate() {
            row(
                &format!("patchRow 64 conns, run {}: without / during streamed backups", i + 1),
                format!(
                    "p99 {:.1} / {:.1} ms, {:.1}k / {:.1}k req/s",
                    q.latency_ms.p99,
                    d.latency_ms.p99,
                    q.requests_per_second / 1e3,
                    d.requests_per_second / 1e3
                ),
            );
        }
        row(
            "backups during the measured runs: commands / streams",
            format!("{backups} / {streams}"),
        );
        let p99 = |v: &[bench::report::LevelView]| {
            v.iter().map(|l| l.latency_ms.p99).sum::<f64>() / v.len() as f64
        };
        row(
            "patchRow p99 during commands / without (mean of the runs)",
            format!("{:.2}x", p99(&during) / p99(&quiet)),
        );
        row(
            "patchRow p99 during streams / without (mean of the runs)",
            format!("{:.2}x", p99(&streamed) / p99(&quiet)),
        );
        row(
            "patchRow 64 conns durable req/s, without / with --archive-dir (each run)",
            format!("{plain:.0?} / {archived:.0?}"),
        );
        row(
            "archive's cost to the durable rate (means)",
            format!("{:.1} %", 100.0 * (1.0 - mean(&archived) / mean(&plain))),
        );
        let mut ratios: Vec<f64> = archived.iter().zip(&plain).map(|(a, p)| a / p).collect();
        ratios.sort_by(f64::total_cmp);
        row(
            "archive's cost, median of the pairs",
            format!("{:.1} %", 100.0 * (1.0 - (ratios[1] + ratios[2]) / 2.0)),
        );
        row(
            "archiver thread CPU / server CPU during the archived runs",
            format!("{:.2} s / {:.2} s ({:.1} %)", cpu.0, cpu.1, 100.0 * cpu.0 / cpu.1),
        );
        row("archive lag at the end of each archived run (records)", format!("{lags:?}"));
        for (paced, level, written) in &checkpointing {
            row(
                &format!(
                    "patchRow 64 conns, checkpoints every second, {}",
                    if *paced { "paced (20 %)" } else { "unpaced" }
                ),
                format!(
                    "p99 {:.1} ms, max {:.1} ms, {:.1}k req/s, {written} checkpoints",
                    level.latency_ms.p99,
                    level.latency_ms.max,
                    level.requests_per_second / 1e3
                ),
            );
        }
    });
}
