//! The engine's figures, each against its target, measured in one run: the built `sheetd`
//! binary on a temporary data dir on loopback, loaded and driven by `sheetd bench` (the library
//! `sheetd_bench`), plus a bare actix-web handler in this process serving the same page
//! bytes, for the one figure that is a ratio against the wire.
//!
//! Run: `cargo bench --bench engine` (add `-- --quick` for a 100,000-row big sheet instead of
//! 1,000,000; `-- --keep DIR` to leave the data dir in `DIR`, to start or profile a server on
//! it afterwards; `-- --postgres ../shared/peers/postgres` to measure PostgreSQL 15 on as many
//! rows first, in the same run, so the rows against it are ratios of one run: see [`Peer`]).
//! Nothing here asserts a duration: it prints.
//!
//! The data: a big sheet (B1) loaded through bulkAdd of 2,000 rows (the fixture raises the paid
//! plan's row cap for it), and a small sheet (S) of 1,000 rows from the seed, all with nine
//! columns of every type. The upsert figure writes B1's rows by their text cell, half of the
//! items with texts only one row holds (updates), half with new texts (creates). The change
//! feed and leaner-read figures come last. The report rows (issue 27's three shapes over B1, the
//! first page of 100 right after a patch of one of its rows, median of 7) run with the server's
//! default column cache; `cargo bench --bench report_run` gives the same shapes in-process with
//! the cache off and on.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpResponse, HttpServer};
use serde_json::{json, Value};
use sheetd_bench::{self as bench, BenchArgs, Report};

const KEY: &str = "svc_live_EngineBenchKey00000000000000000000001";
const KEY_BIG: &str = "svc_live_EngineBenchBigSheet0000000000000002";
const KEY_SMALL: &str = "svc_live_EngineBenchSmallSheet00000000000003";
const ADMIN: &str = "adm_engine_bench";
const BIG: [u64; 1] = [1];
const SMALL: u64 = 3;
/// Rounds of the page figure, each sheetd's pages for 2 s and then the bare handler's.
const PAGE_ROUNDS: usize = 5;

fn cells(i: usize) -> Value {
    json!({"100": format!("Task number {i} with some text"), "101": if i.is_multiple_of(2) { "Open" } else { "Done" },
           "102": i as f64 * 1.5, "103": i.is_multiple_of(3), "104": "2026-01-31", "105": "2026-01-31T23:00:00Z",
           "106": "x@y.z", "107": ["a", "c"], "108": "Red"})
}

fn fixture() -> Value {
    let columns: Vec<Value> = [1u64, 2, 3]
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
                // Column ids are global: each sheet gets its own hundred.
                c["id"] = json!(c["id"].as_u64().unwrap() + (s - 1) * 1000);
                c["sheetId"] = json!(s);
                c["position"] = json!(pos);
                c
            })
        })
        .collect();
    let rows: Vec<Value> = (0..1000)
        .map(|i| {
            let mut c = cells(i);
            let shifted: serde_json::Map<String, Value> = c
                .as_object_mut()
                .unwrap()
                .iter()
                .map(|(k, v)| ((k.parse::<u64>().unwrap() + 2000).to_string(), v.clone()))
                .collect();
            json!({"id": 900_000_000 + i, "sheetId": SMALL, "cells": shifted})
        })
        .collect();
    let grant = |verb: &str, sheet: Option<u64>| match sheet {
        Some(id) => json!({"verb": verb, "scopeType": "sheet", "scopeId": id}),
        None => json!({"verb": verb, "scopeType": "account", "scopeId": null}),
    };
    json!({
        "plans": {"paid": {"maxRowsPerSheet": 5_000_000}},
        "users": [{"id": 1, "name": "bench", "plan": "paid"}],
        "projects": [{"id": 1, "name": "Engine", "ownerId": 1}],
        "sheets": [{"id": 1, "projectId": 1, "name": "B1"}, {"id": 2, "projectId": 1, "name": "B2"},
                   {"id": SMALL, "projectId": 1, "name": "S"}],
        "columns": columns,
        "rows": rows,
        "reports": REPORTS.iter().map(|(id, _, definition, _)| json!({"id": id, "projectId": 1,
            "ownerId": 1, "name": format!("r{id}"), "definition": definition()})).collect::<Vec<_>>(),
        "keys": [
            {"id": 1, "ownerId": 1, "name": "all", "secret": KEY, "grants": [grant("write", None)]},
            {"id": 2, "ownerId": 1, "name": "big", "secret": KEY_BIG, "grants": [grant("read", Some(1))]},
            {"id": 3, "ownerId": 1, "name": "small", "secret": KEY_SMALL, "grants": [grant("read", Some(SMALL))]}
        ]
    })
}

/// The issue 27 report shapes over the big sheet B1: id, what, definition, PostgreSQL 15's figure.
type ReportShape = (u64, &'static str, fn() -> Value, &'static str);

const REPORTS: [ReportShape; 3] = [
    (
        1,
        "aggregate: group by a dropdown, count + sum of a number",
        || {
            json!({"type": "summary", "sources": [1], "groupBy": ["Status"],
               "aggregates": [{"fn": "count"}, {"fn": "sum", "column": "Hours"}]})
        },
        "754-793 ms",
    ),
    (
        2,
        "filter (number > 500) + sort by text, first 100",
        || {
            json!({"type": "row", "sources": [1], "columns": ["Task", "Hours", "Status"],
               "filter": {"column": "Hours", "op": "gt", "value": 500}, "sort": [{"column": "Task"}]})
        },
        "238 ms",
    ),
    (
        3,
        "text contains, first 100",
        || {
            json!({"type": "row", "sources": [1], "columns": ["Task", "Hours"],
               "filter": {"column": "Task", "op": "contains", "value": "NUMBER 4242"}})
        },
        "220 ms",
    ),
];

/// PostgreSQL 15's figures for the rows of the table that have one. With `--postgres DIR` (DIR
/// being the peer harness, `../shared/peers/postgres`) they are measured in this run, before
/// sheetd starts and with PostgreSQL stopped again before sheetd's load, so a ratio compares
/// one machine at one time. Without it they are the figures the issue recorded on another day,
/// printed as such and never divided by.
struct Peer {
    /// Measured in this run (else recorded).
    measured: bool,
    /// W1: pages of 100 rows per second at 32 connections (`json_agg`).
    page_per_s: f64,
    /// W4: one row by id per second at 32 connections.
    get_per_s: f64,
    /// W2 at 64 connections: durable single-row updates per second, and their p99 in ms.
    update_per_s: f64,
    update_p99_ms: f64,
    update_max_ms: f64,
    /// W2 at 1 connection: p50 in ms.
    update1_p50_ms: f64,
    /// W3: durable rows per second, 2000 rows a transaction at 8 connections.
    bulk_rows_per_s: f64,
}

impl Peer {
    fn recorded() -> Peer {
        Peer {
            measured: false,
            page_per_s: 7031.0,
            get_per_s: 62_900.0,
            update_per_s: 21_300.0,
            update_p99_ms: 6.7,
            update_max_ms: 0.0,
            update1_p50_ms: 0.18,
            bulk_rows_per_s: 271_000.0,
        }
    }

    /// Loads `rows` rows into the harness's PostgreSQL, runs its workloads for 10 s each and
    /// stops it, even when a step failed. Fails with the harness's words if any step did: a
    /// bench asked to compare must not print a comparison it did not make.
    fn measure(dir: &Path, rows: usize) -> Result<Peer, String> {
        let script = |name: &str, env: &[(&str, String)]| -> Result<String, String> {
            let out = Command::new("bash")
                .arg(dir.join(name))
                .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                .stderr(Stdio::inherit())
                .output()
                .map_err(|e| format!("{}: {e}", dir.join(name).display()))?;
            let printed = String::from_utf8_lossy(&out.stdout).into_owned();
            match out.status.success() {
                true => Ok(printed),
                false => Err(format!("{name} failed ({}): {printed}", out.status)),
            }
        };
        eprintln!("PostgreSQL: loading {rows} rows, then its workloads (10 s each)");
        let printed = script("setup.sh", &[("ROWS", rows.to_string())]).and_then(|_| {
            script("bench.sh", &[("DUR", "10".into()), ("WAIT_QUIET_S", "30".into())])
        });
        let stopped = script("stop.sh", &[]);
        // Whatever the kernel still holds of the peer's load is written out before sheetd
        // starts, so its write-back can never pass for a stall of sheetd's (the time it took
        // is printed: 0.0 s in the runs so far).
        let syncing = Instant::now();
        let synced = Command::new("sync").status().map_err(|e| format!("sync: {e}"))?;
        eprintln!(
            "PostgreSQL stopped; its dirty pages written back in {:.1} s ({synced})",
            syncing.elapsed().as_secs_f64()
        );
        let printed = printed?;
        stopped?;
        let last = printed
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .ok_or("bench.sh printed no JSON summary line")?;
        let summary: Value =
            serde_json::from_str(last).map_err(|e| format!("bench.sh's summary: {e}"))?;
        let runs = summary["workloads"].as_array().ok_or("bench.sh's summary has no workloads")?;
        let workload = |name: &str| -> Result<&Value, String> {
            let run = runs.iter().find(|w| w["workload"] == name);
            match run {
                Some(run) if run["rc"] == 0 => Ok(run),
                Some(run) => Err(format!("{name} failed: {run}")),
                None => Err(format!("{name} did not run")),
            }
        };
        let number = |name: &str, field: &str| -> Result<f64, String> {
            let run = workload(name)?;
            run[field].as_f64().ok_or_else(|| format!("{name} has no {field}: {run}"))
        };
        Ok(Peer {
            measured: true,
            page_per_s: number("W1-page100", "tps")?,
            get_per_s: number("W4-get1", "tps")?,
            update_per_s: number("W2-update-c64", "tps")?,
            update_p99_ms: number("W2-update-c64", "lat_p99_ms")?,
            update_max_ms: number("W2-update-c64", "lat_max_ms")?,
            update1_p50_ms: number("W2-update-c1", "lat_p50_ms")?,
            bulk_rows_per_s: number("W3-bulk2000", "rows_per_s")?,
        })
    }

    /// ", max N ms" of its updates at 64 connections, when measured (none was recorded).
    fn max_of_updates(&self) -> String {
        if self.measured {
            format!(", max {:.0} ms", self.update_max_ms)
        } else {
            String::new()
        }
    }

    /// "ours vs PostgreSQL's = ratio" when measured in this run, else ours and the recorded
    /// figure, labelled.
    fn against(&self, ours: f64, theirs: f64, unit: &str) -> String {
        if self.measured {
            format!(
                "{:.1}k vs PostgreSQL {:.1}k {unit} = {:.2}",
                ours / 1e3,
                theirs / 1e3,
                ours / theirs
            )
        } else {
            format!("{:.1}k {unit} (PostgreSQL {:.1}k, recorded)", ours / 1e3, theirs / 1e3)
        }
    }
}

/// `method` on `url` with a JSON body; the status and the JSON answer (`null` if none).
async fn send(method: &str, url: &str, key: &str, body: Option<Value>) -> (u16, Value) {
    let client = awc::Client::builder().timeout(Duration::from_secs(60)).finish();
    let req = client
        .request(method.parse().unwrap(), url)
        .insert_header(("Authorization", format!("Bearer {key}")));
    let sent = match body {
        Some(b) => req.send_json(&b).await,
        None => req.send().await,
    };
    match sent {
        Ok(mut res) => {
            let bytes = res.body().limit(1 << 30).await.unwrap_or_default();
            (res.status().as_u16(), serde_json::from_slice(&bytes).unwrap_or(Value::Null))
        }
        Err(_) => (0, Value::Null),
    }
}

/// Each report of [`REPORTS`]: its first run (which builds the columns it reads), then the
/// median of 7 first pages of 100, each right after a patch of a row of B1 (so no cached result
/// answers). Returns (first run ms, median ms) per report.
async fn report_runs(url: &str) -> Vec<(f64, f64)> {
    let (_, page) = send("GET", &format!("{url}/sheets/1/rows?limit=1"), KEY, None).await;
    let row = &page["data"][0];
    let (id, mut version) = (row["id"].as_u64().unwrap(), row["version"].as_u64().unwrap());
    let mut out = Vec::new();
    let mut n = 0;
    for (report, ..) in REPORTS {
        let run = format!("{url}/reports/{report}/run?limit=100");
        let timed = |t: Instant, status: u16, body: &Value| {
            assert_eq!(status, 200, "report {report}: {body}");
            t.elapsed().as_secs_f64() * 1e3
        };
        let t = Instant::now();
        let (status, body) = send("POST", &run, KEY, None).await;
        let first = timed(t, status, &body);
        let mut times = Vec::new();
        for _ in 0..7 {
            n += 1;
            let patch = json!({"version": version, "cells": {"102": 1000.5 + n as f64}});
            let (status, row) =
                send("PATCH", &format!("{url}/sheets/1/rows/{id}"), KEY, Some(patch)).await;
            assert_eq!(status, 200, "{row}");
            version = row["version"].as_u64().unwrap();
            let t = Instant::now();
            let (status, body) = send("POST", &run, KEY, None).await;
            times.push(timed(t, status, &body));
        }
        times.sort_by(f64::total_cmp);
        out.push((first, times[3]));
    }
    out
}

/// A durable write of the disk alone, timed in a loop: what no durable write above it can beat.
struct DiskFloor {
    writes: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    over_50_ms: usize,
}

impl std::fmt::Display for DiskFloor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "p50 {:.2}, p99 {:.2}, max {:.0} ms; {} of {} over 50 ms",
            self.p50_ms, self.p99_ms, self.max_ms, self.over_50_ms, self.writes
        )
    }
}

/// 4 KiB written and `fdatasync`ed in a loop for `span`, in a file in `dir` (on the data dir's
/// disk), as the log's group commit does once per group: its stalls are the disk's own.
fn disk_floor(dir: &Path, span: Duration) -> DiskFloor {
    use std::os::unix::fs::FileExt;
    let path = dir.join("disk-floor.probe");
    let file = std::fs::File::create(&path).unwrap();
    let block = [0x5au8; 4096];
    let (mut times, mut offset, started) = (Vec::new(), 0u64, Instant::now());
    while started.elapsed() < span {
        let t = Instant::now();
        file.write_all_at(&block, offset).unwrap();
        file.sync_data().unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e3);
        // A 16 MiB ring: the file stops growing, as a log's segment does.
        offset = (offset + 4096) % (16 << 20);
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    let over_50_ms = times.iter().filter(|&&t| t > 50.0).count();
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
    DiskFloor {
        writes: times.len(),
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        max_ms: at(1.0),
        over_50_ms,
    }
}

/// Where the servers on `data` write their warnings: beside it, not in it (the data dir's size
/// is a figure).
fn warnings_of(data: &Path) -> std::path::PathBuf {
    data.with_extension("warnings.log")
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
    async fn start(data: &Path, seed: Option<&Path>, extra: &[&str]) -> (Server, Duration) {
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
        if let Some(seed) = seed {
            cmd.arg("--seed").arg(seed);
        }
        cmd.args(extra);
        // Request log lines off: they are not what is measured. Warnings are kept beside the
        // data dir (a slow group commit says where its time went) and printed at the end.
        cmd.env("RUST_LOG", "warn");
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(warnings_of(data)).unwrap();
        let started = Instant::now();
        let child = cmd.stdout(Stdio::null()).stderr(log).spawn().expect("sheetd starts");
        let server = Server {
            child,
            base: format!("http://127.0.0.1:{port}/api/v1"),
            admin: format!("http://127.0.0.1:{admin}/admin/v1"),
        };
        loop {
            if get(&format!("{}/health", server.admin), ADMIN).await.0 == 200 {
                return (server, started.elapsed());
            }
            actix_rt::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kb = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        kb.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    }

    fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn terminate(mut self) {
        Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        self.child.wait().unwrap();
    }
}

/// Checkpoints the server has written, and their seconds: one that falls in a measured phase
/// shares the 2 cores with it (a full checkpoint of the big sheet takes seconds of a core).
async fn checkpoints(server: &Server) -> (f64, f64) {
    let (_, metrics) = get(&format!("{}/metrics", server.admin), ADMIN).await;
    let text = String::from_utf8_lossy(&metrics);
    let metric = |name: &str| {
        let line = text.lines().find(|l| l.split_whitespace().next() == Some(name));
        line.and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok()).unwrap_or(0.0)
    };
    (metric("sheetd_wal_checkpoints_total"), metric("sheetd_wal_checkpoint_seconds_total"))
}

/// "N (S s)": the checkpoints written between two [`checkpoints`] readings.
fn written(before: (f64, f64), after: (f64, f64)) -> String {
    format!("{:.0} ({:.1} s)", after.0 - before.0, after.1 - before.1)
}

async fn get(url: &str, key: &str) -> (u16, actix_web::web::Bytes) {
    let client = awc::Client::builder().timeout(Duration::from_secs(60)).finish();
    match client.get(url).insert_header(("Authorization", format!("Bearer {key}"))).send().await {
        Ok(mut res) => {
            let body = res.body().limit(1 << 30).await.unwrap_or_default();
            (res.status().as_u16(), body)
        }
        Err(_) => (0, actix_web::web::Bytes::new()),
    }
}

/// p50 in milliseconds of `n` sequential GETs on one keep-alive connection.
async fn p50(url: &str, key: &str, n: usize) -> f64 {
    let client = awc::Client::builder().timeout(Duration::from_secs(60)).finish();
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let mut res = client
            .get(url)
            .insert_header(("Authorization", format!("Bearer {key}")))
            .send()
            .await
            .unwrap();
        res.body().limit(1 << 30).await.unwrap();
        assert_eq!(res.status(), 200, "{url}");
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    times[n / 2]
}

/// A bulkUpsert body on sheet 1 (key column 100, the text): every other item names an existing
/// key of `chunk` and sets the row's number cell to one `round` gives (an update), the others a
/// new key of that round (a create). Rounds never repeat within a run, so no item is a no-op.
fn upsert_body(chunk: &[String], round: usize) -> Vec<u8> {
    let rows: Vec<Value> = chunk
        .iter()
        .enumerate()
        .map(|(i, k)| match i % 2 {
            0 => json!({"cells": {"100": k, "102": 1_000_000 + round}}),
            _ => json!({"cells": {"100": format!("new {round} {k}"), "102": 1}}),
        })
        .collect();
    json!({"keyColumn": "100", "rows": rows}).to_string().into_bytes()
}

/// `count` bulkUpsert bodies of 2000 keys each (untimed: the client's JSON work is not what is
/// measured), their rounds numbered from `first_round`.
fn upsert_bodies(keys: &[String], count: usize, first_round: usize) -> Vec<Vec<u8>> {
    let chunks: Vec<&[String]> = keys.chunks(2000).filter(|c| c.len() == 2000).collect();
    assert!(!chunks.is_empty(), "fewer than 2000 distinct keys to upsert");
    (0..count)
        .map(|i| upsert_body(chunks[i % chunks.len()], first_round + i / chunks.len()))
        .collect()
}

/// Posts one bulkUpsert body to sheet 1, asserting a 200: the response's bytes.
async fn upsert_post(client: &awc::Client, url: &str, body: Vec<u8>) -> web::Bytes {
    let mut res = client
        .post(format!("{url}/sheets/1/rows:bulkUpsert"))
        .insert_header(("Authorization", format!("Bearer {KEY}")))
        .insert_header(("Content-Type", "application/json"))
        .send_body(body)
        .await
        .expect("bulkUpsert sent");
    let answer = res.body().limit(1 << 30).await.unwrap();
    assert_eq!(res.status(), 200, "{}", String::from_utf8_lossy(&answer));
    answer
}

fn upsert_client() -> awc::Client {
    awc::Client::builder().timeout(Duration::from_secs(120)).finish()
}

/// The first upsert naming key column 100 (it builds the key index, one scan of the sheet):
/// its seconds.
async fn upsert_first(url: &str, keys: &[String], round: usize) -> f64 {
    let first = Instant::now();
    let answer = upsert_post(&upsert_client(), url, upsert_body(&keys[..1], round)).await;
    let built = first.elapsed().as_secs_f64();
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer["results"][0]["action"], "updated", "{answer}");
    built
}

/// `bodies` posted over `connections` keep-alive connections: the durable rows they wrote and
/// the seconds it took.
async fn upsert_run(url: &str, bodies: Vec<Vec<u8>>, connections: usize) -> (u64, f64) {
    let queue = RefCell::new(VecDeque::from(bodies));
    let started = Instant::now();
    let workers = (0..connections).map(|_| {
        let queue = &queue;
        async move {
            let client = upsert_client();
            let mut rows = 0;
            loop {
                let next = queue.borrow_mut().pop_front();
                let Some(body) = next else { return rows };
                // Only the counts after the results are read, as `sheetd bench` reads a
                // bulkAdd's (whose rate this one is set against): parsing 2,000 rows a
                // response took the client a large share of a core of the two.
                let answer = upsert_post(&client, url, body).await;
                let (succeeded, failed) = tail_counts(&answer);
                assert_eq!(
                    failed,
                    0,
                    "{}",
                    String::from_utf8_lossy(&answer[..answer.len().min(600)])
                );
                rows += succeeded;
            }
        }
    });
    let rows: u64 = futures_util::future::join_all(workers).await.into_iter().sum();
    (rows, started.elapsed().as_secs_f64())
}

/// A bulk write's `succeededCount` and `failedCount`, read from the end of its response (they
/// follow the results).
fn tail_counts(body: &[u8]) -> (u64, u64) {
    let tail = &body[body.iter().rposition(|b| *b == b']').expect("a results list")..];
    let count = |name: &str| {
        let key = format!("\"{name}\":");
        let at = tail.windows(key.len()).position(|w| w == key.as_bytes()).expect(name) + key.len();
        let digits: String =
            tail[at..].iter().take_while(|b| b.is_ascii_digit()).map(|&b| b as char).collect();
        digits.parse::<u64>().expect(name)
    };
    (count("succeededCount"), count("failedCount"))
}

/// `connections` clients GET `url` with `headers` back to back for `secs` seconds: requests per
/// second, and the mean body bytes on the wire (as sent: awc here decodes no coding).
async fn hammer(url: &str, headers: &[(&str, &str)], connections: usize, secs: f64) -> (f64, f64) {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let workers = (0..connections).map(|_| async move {
        let client = awc::Client::builder().timeout(Duration::from_secs(60)).finish();
        let (mut n, mut bytes) = (0u64, 0u64);
        while Instant::now() < until {
            let mut req = client.get(url).insert_header(("Authorization", format!("Bearer {KEY}")));
            for h in headers {
                req = req.insert_header(*h);
            }
            let mut res = req.send().await.expect("sent");
            assert_eq!(res.status(), 200, "{url}");
            bytes += res.body().limit(1 << 30).await.unwrap().len() as u64;
            n += 1;
        }
        (n, bytes)
    });
    let started = Instant::now();
    let done = futures_util::future::join_all(workers).await;
    let (n, bytes) = done.iter().fold((0, 0), |(a, b), (n, by)| (a + n, b + by));
    (n as f64 / started.elapsed().as_secs_f64(), bytes as f64 / n.max(1) as f64)
}

/// One page of `sheet`'s change feed from `cursor` (`None`: the oldest retained change) on
/// `client`'s keep-alive connection: the number of changes and the next cursor.
async fn changes_page(
    client: &awc::Client,
    url: &str,
    sheet: u64,
    cursor: Option<&str>,
    wait: u32,
) -> (usize, String) {
    let mut u = format!("{url}/sheets/{sheet}/changes?limit=500&wait={wait}");
    if let Some(c) = cursor {
        u.push_str(&format!("&cursor={c}"));
    }
    let mut res = client
        .get(u)
        .insert_header(("Authorization", format!("Bearer {KEY}")))
        .send()
        .await
        .expect("changes sent");
    let body = res.body().limit(1 << 30).await.unwrap();
    assert_eq!(res.status(), 200, "{}", String::from_utf8_lossy(&body));
    let page: Value = serde_json::from_slice(&body).unwrap();
    (page["data"].as_array().unwrap().len(), page["nextCursor"].as_str().unwrap().to_owned())
}

/// One write to `sheet` after a run's writers stopped: a follower whose long-poll began after
/// their last write would otherwise wait out its `wait` (30 s), and count it as following.
async fn wake(url: &str, sheet: u64) {
    let client = awc::Client::builder().timeout(Duration::from_secs(60)).finish();
    let res = client
        .post(format!("{url}/sheets/{sheet}/rows:bulkAdd"))
        .insert_header(("Authorization", format!("Bearer {KEY}")))
        .send_json(&json!({"rows": [{"cells": {}}]}))
        .await
        .expect("the wake-up write is sent");
    assert_eq!(res.status(), 200);
}

/// A follower of `sheet`'s feed from its head, long-polling (after a pause of `pace` between
/// polls, if any) until `stop` is set and then until a poll comes back empty: the changes it
/// received, its polls, the seconds it followed, and how long it took after `stop` to have every
/// change.
async fn follow(
    url: String,
    sheet: u64,
    ready: std::sync::mpsc::Sender<()>,
    stop: Arc<AtomicBool>,
    pace: Option<Duration>,
) -> (u64, u64, f64, f64) {
    // The head of the feed: an export's cursor (the sheet is small), so the follower starts
    // caught up without reading the backlog.
    let client = awc::Client::builder().timeout(Duration::from_secs(60)).finish();
    let mut res = client
        .get(format!("{url}/sheets/{sheet}/export"))
        .insert_header(("Authorization", format!("Bearer {KEY}")))
        .send()
        .await
        .expect("export sent");
    res.body().limit(1 << 30).await.unwrap();
    let header = res.headers().get("sheet-changes-cursor").expect("the export's cursor");
    let mut cursor = header.to_str().unwrap().to_owned();
    ready.send(()).unwrap();
    let started = Instant::now();
    let (mut received, mut polls) = (0u64, 0u64);
    let mut stopped: Option<Instant> = None;
    loop {
        if let Some(pace) = pace {
            actix_rt::time::sleep(pace).await;
        }
        polls += 1;
        let stopping = stop.load(Ordering::Acquire);
        let wait = if stopping { 0 } else { 30 };
        if stopping && stopped.is_none() {
            stopped = Some(Instant::now());
        }
        let (n, next) = changes_page(&client, &url, sheet, Some(&cursor), wait).await;
        received += n as u64;
        cursor = next;
        if n == 0 && stopped.is_some() {
            let lag = stopped.map_or(0.0, |t| t.elapsed().as_secs_f64());
            return (received, polls, started.elapsed().as_secs_f64(), lag);
        }
    }
}

/// One kind of follower run: its pace, the writers' req/s of each run, and the follower's
/// changes, polls and seconds over the runs, and its largest delay after the writers stopped.
type FollowerRuns = (Option<Duration>, Vec<f64>, u64, u64, f64, f64);

async fn run_bench(flags: &[&str]) -> Report {
    let args = BenchArgs::parse_flags(flags).expect("valid bench flags");
    let report = bench::execute(&args, None).await.expect("bench runs");
    assert!(report.passed, "the bench run had errors:\n{}", report.table());
    report
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| {
                    let e = e.unwrap();
                    let meta = e.metadata().unwrap();
                    if meta.is_dir() {
                        dir_bytes(&e.path())
                    } else {
                        meta.len()
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

fn row(what: &str, now: String, target: &str) {
    println!("| {what:<58} | {now:<34} | {target:<22} |");
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let big_rows: usize = if quick { 100_000 } else { 1_000_000 };
    let args: Vec<String> = std::env::args().collect();
    let keep = args.iter().position(|a| a == "--keep").and_then(|i| args.get(i + 1)).cloned();
    let postgres = args.iter().position(|a| a == "--postgres").and_then(|i| args.get(i + 1));
    // The peer first, on its own: sheetd is not running yet, and PostgreSQL is stopped again
    // before sheetd's load begins.
    let peer = match postgres {
        Some(dir) => match Peer::measure(Path::new(dir), big_rows) {
            Ok(peer) => peer,
            Err(why) => {
                eprintln!("PostgreSQL was not measured, so nothing is compared with it: {why}");
                std::process::exit(1);
            }
        },
        None => Peer::recorded(),
    };
    actix_rt::System::new().block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        let seed = dir.path().join("seed.json");
        std::fs::write(&seed, fixture().to_string()).unwrap();
        let data = match &keep {
            Some(kept) => std::path::PathBuf::from(kept),
            None => dir.path().join("data"),
        };
        let (server, _) = Server::start(&data, Some(&seed), &[]).await;
        let url = server.base.clone();
        let common = ["--url", url.as_str(), "--key", KEY];

        // 1. Load the big sheets: durable bulkAdd of 2000-row bodies at 8 connections.
        let before = checkpoints(&server).await;
        let requests = (big_rows / 2000).to_string();
        let load = run_bench(&[&common[..], &["--sheet-ids", "1", "--workload", "bulk-add",
            "--bulk-size", "2000", "--concurrency", "8", "--requests", &requests, "--warmup", "0s"]]
            .concat())
        .await;
        let bulk = &load.levels[0];
        let load_checkpoints = written(before, checkpoints(&server).await);

        // 2. listRows page of 100 at 32 connections: sheetd against a bare actix-web handler
        //    serving its bytes, alternated in rounds, so the two rates are taken at the same
        //    moments (as in 8a): this machine's speed moves by a quarter between minutes.
        let page_url = format!("{url}/sheets/{SMALL}/rows?limit=100");
        let (_, page) = get(&page_url, KEY).await;
        // The bare server answers the calls the bench makes before its load (the key, the
        // sheet's columns) with sheetd's own bytes, and every other path with the page.
        let mut fixed = Vec::new();
        for path in ["/me".to_owned(), format!("/sheets/{SMALL}/columns"), format!("/sheets/{SMALL}")] {
            fixed.push((format!("/api/v1{path}"), get(&format!("{url}{path}"), KEY).await.1));
        }
        let (bare_url, bare_handle) = {
            let page = page.clone();
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let srv = HttpServer::new(move || {
                let mut app = App::new();
                for (path, bytes) in fixed.clone() {
                    app = app.route(&path, web::get().to(move || {
                        let bytes = bytes.clone();
                        async move { HttpResponse::Ok().content_type("application/json").body(bytes) }
                    }));
                }
                let page = page.clone();
                app.default_service(web::to(move || {
                    let page = page.clone();
                    async move { HttpResponse::Ok().content_type("application/json").body(page) }
                }))
            })
            .workers(2)
            .listen(listener)
            .unwrap()
            .run();
            let handle = srv.handle();
            actix_rt::spawn(srv);
            (format!("http://{addr}/api/v1"), handle)
        };
        let read_flags = ["--workload", "read-page", "--page-size", "100", "--concurrency", "32",
            "--duration", "2s", "--warmup", "500ms", "--sheet-ids", "3"];
        let bare_flags = ["--url", bare_url.as_str(), "--key", KEY];
        let before = checkpoints(&server).await;
        // (requests, seconds) of each side, summed over the rounds; each round's ratio.
        let (mut ours, mut bare, mut page_ratios) = ((0u64, 0f64), (0u64, 0f64), Vec::new());
        for _ in 0..PAGE_ROUNDS {
            let ours_run = run_bench(&[&common[..], &read_flags[..]].concat()).await;
            let bare_run = run_bench(&[&bare_flags[..], &read_flags[..]].concat()).await;
            let (o, b) = (&ours_run.levels[0], &bare_run.levels[0]);
            ours = (ours.0 + o.requests, ours.1 + o.elapsed_seconds);
            bare = (bare.0 + b.requests, bare.1 + b.elapsed_seconds);
            page_ratios.push(o.requests_per_second / b.requests_per_second);
        }
        bare_handle.stop(true).await;
        let page_checkpoints = written(before, checkpoints(&server).await);
        let (ours_rps, bare_rps) = (ours.0 as f64 / ours.1, bare.0 as f64 / bare.1);
        page_ratios.sort_by(f64::total_cmp);

        // 3. patchRow of distinct rows (each client owns its rows) at 64 and at 1 connection.
        let before = checkpoints(&server).await;
        let patch = run_bench(&[&common[..], &["--workload", "patch", "--concurrency", "64,1",
            "--duration", "5s", "--warmup", "1s", "--sheet-ids", "3"]].concat())
        .await;
        let patch_checkpoints = written(before, checkpoints(&server).await);
        let (p64, p1) = (&patch.levels[0], &patch.levels[1]);
        // One row by id at 32 connections: each client reads its own rows of the small sheet.
        let get_row = run_bench(&[&common[..], &["--workload", "get-row", "--concurrency", "32",
            "--duration", "5s", "--warmup", "1s", "--sheet-ids", "3"]].concat())
        .await;
        let get_row = &get_row.levels[0];

        // 4. Costs that must not grow with a sheet's size: the big sheet against the small one.
        let mut flat = Vec::new();
        for (what, path) in [("getSheet", "/sheets/{}?limit=100"), ("listSheets", "/sheets"),
            ("listRows first page", "/sheets/{}/rows?limit=100")]
        {
            let big = p50(&format!("{url}{}", path.replace("{}", "1")), KEY_BIG, 2000).await;
            let small = p50(&format!("{url}{}", path.replace("{}", "3")), KEY_SMALL, 2000).await;
            flat.push((what, big, small));
        }

        // 5. Memory: read every row of the big sheets (so every row is rendered), then RSS
        //    against the rows' JSON.
        let mut json_bytes = 0u64;
        // How many rows of B1 hold each text: the upsert keys are the ones only one row holds.
        let mut texts: HashMap<String, u32> = HashMap::new();
        for sheet in BIG {
            let mut cursor: Option<String> = None;
            loop {
                let u = match &cursor {
                    Some(c) => format!("{url}/sheets/{sheet}/rows?limit=500&cursor={c}"),
                    None => format!("{url}/sheets/{sheet}/rows?limit=500"),
                };
                let (status, body) = get(&u, KEY).await;
                assert_eq!(status, 200);
                let page: Value = serde_json::from_slice(&body).unwrap();
                for r in page["data"].as_array().unwrap() {
                    json_bytes += r.to_string().len() as u64;
                    if let (1, Some(text)) = (sheet, r["cells"]["100"].as_str()) {
                        *texts.entry(text.to_owned()).or_default() += 1;
                    }
                }
                match page["nextCursor"].as_str() {
                    Some(c) => cursor = Some(c.to_owned()),
                    None => break,
                }
            }
        }
        let rss = server.rss_bytes();
        let total_rows = big_rows + 1000;

        // 5a. Report runs over the big sheet (before the upsert adds rows to it), and the
        //     memory the columns kept for them cost.
        let reports = report_runs(&url).await;
        let rss_reports = server.rss_bytes();
        let report_load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();

        // 5b. bulkUpsert updating existing keys of a big sheet, 2000-row bodies, 8 connections
        //     (after the RSS figure, which is about reads). Its ratio to step 1's load is
        //     printed, but the target is judged at 8a, where the two run in the same minutes.
        let mut keys: Vec<String> = texts.into_iter().filter(|(_, n)| *n == 1).map(|(t, _)| t).collect();
        keys.sort_unstable();
        let upsert_bodies_n = if quick { 40 } else { 100 };
        let before = checkpoints(&server).await;
        let rss_unindexed = server.rss_bytes();
        let index_build = upsert_first(&url, &keys, 0).await;
        let index_rss = server.rss_bytes() as i64 - rss_unindexed as i64;
        let (rows, secs) = upsert_run(&url, upsert_bodies(&keys, upsert_bodies_n, 1), 8).await;
        let upsert_rps = rows as f64 / secs;
        let upsert_checkpoints = written(before, checkpoints(&server).await);

        // 5c. The change feed: reading the big sheet's backlog (its load's changes, from the
        //     oldest), then patches of the small sheet at 16 connections without and with a
        //     caught-up follower long-polling its feed.
        let backlog_target = (big_rows / 5).max(1000);
        let (mut read, mut cursor, started) = (0usize, None::<String>, Instant::now());
        let client = awc::Client::builder().timeout(Duration::from_secs(60)).finish();
        while read < backlog_target {
            let (n, next) = changes_page(&client, &url, 1, cursor.as_deref(), 0).await;
            read += n;
            cursor = Some(next);
            if n == 0 {
                break;
            }
        }
        let backlog_rate = read as f64 / started.elapsed().as_secs_f64();
        // Alternated (alone, eager follower, paced follower; twice) so a background checkpoint
        // hits every kind alike. The follower runs on a thread of its own, as a separate client
        // would: eager polls again as soon as a page arrives; paced waits 100 ms first, so each
        // poll brings a batch.
        let patch_flags = ["--workload", "patch", "--concurrency", "16", "--duration", "5s",
            "--warmup", "1s", "--sheet-ids", "3"];
        let mut runs: Vec<FollowerRuns> = vec![
            (None, Vec::new(), 0, 0, 0.0, 0.0),
            (Some(Duration::from_millis(100)), Vec::new(), 0, 0, 0.0, 0.0),
        ];
        let mut alone_rps = Vec::new();
        for _ in 0..2 {
            let alone = run_bench(&[&common[..], &patch_flags[..]].concat()).await;
            alone_rps.push(alone.levels[0].requests_per_second);
            for (pace, rps, changes, polls, secs, lag) in runs.iter_mut() {
                let stop = Arc::new(AtomicBool::new(false));
                let (ready, at_head) = std::sync::mpsc::channel();
                let follower = {
                    let (url, stop, pace) = (url.clone(), stop.clone(), *pace);
                    std::thread::spawn(move || {
                        actix_rt::System::new().block_on(follow(url, SMALL, ready, stop, pace))
                    })
                };
                at_head.recv().unwrap();
                let followed = run_bench(&[&common[..], &patch_flags[..]].concat()).await;
                rps.push(followed.levels[0].requests_per_second);
                stop.store(true, Ordering::Release);
                wake(&url, SMALL).await;
                let (n, p, s, l) = follower.join().unwrap();
                (*changes, *polls, *secs, *lag) = (*changes + n, *polls + p, *secs + s, lag.max(l));
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let alone_rps = mean(&alone_rps);

        // 5d. Leaner reads: a page of 100 with 2 of the 9 columns against all of them, and the
        //     bytes and req/s of a full page plain, gzip and zstd (32 connections, 5 s each).
        let small_page = format!("{url}/sheets/{SMALL}/rows?limit=100");
        let (all_rps, all_bytes) = hammer(&small_page, &[], 32, 5.0).await;
        let two = format!("{small_page}&fields=2100,2101");
        let (two_rps, two_bytes) = hammer(&two, &[], 32, 5.0).await;
        let mut coded = Vec::new();
        for coding in ["gzip", "zstd"] {
            let (rps, bytes) = hammer(&small_page, &[("Accept-Encoding", coding)], 32, 5.0).await;
            coded.push((coding, rps, bytes));
        }

        // 6. Start-up after SIGKILL, and after a clean stop; the data dir against its checkpoint.
        //    The log's tail since its last checkpoint is what the start replays: printed with it.
        let (_, metrics) = get(&format!("{}/metrics", server.admin), ADMIN).await;
        let metric = |name: &str| {
            let text = String::from_utf8_lossy(&metrics);
            let line = text.lines().find(|l| l.split_whitespace().next() == Some(name));
            line.and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok()).unwrap_or(0.0)
        };
        let tail_records = metric("sheetd_wal_records_since_checkpoint");
        let tail_mb = metric("sheetd_wal_bytes_since_checkpoint") / 1e6;
        let retained_mb = metric("sheetd_wal_retained_bytes") / 1e6;
        server.kill9();
        let (server, after_kill) = Server::start(&data, None, &[]).await;
        server.terminate();
        let checkpoint = std::fs::metadata(data.join("checkpoint")).map_or(0, |m| m.len());
        let data_dir = dir_bytes(&data);
        let (server, after_stop) = Server::start(&data, None, &[]).await;
        // 7. Memory of a fresh process holding the same data (no allocator history of the
        //    load), against the JSON of every row it holds.
        let rss_fresh = server.rss_bytes();
        let mut json_fresh = 0u64;
        let (_, sheets) = get(&format!("{}/sheets?limit=100", server.base), KEY).await;
        let sheets: Value = serde_json::from_slice(&sheets).unwrap();
        for sheet in sheets["data"].as_array().unwrap() {
            let id = sheet["id"].as_u64().unwrap();
            let mut cursor: Option<String> = None;
            loop {
                let u = match &cursor {
                    Some(c) => format!("{}/sheets/{id}/rows?limit=500&cursor={c}", server.base),
                    None => format!("{}/sheets/{id}/rows?limit=500", server.base),
                };
                let (status, body) = get(&u, KEY).await;
                assert_eq!(status, 200);
                let page: Value = serde_json::from_slice(&body).unwrap();
                json_fresh += page["data"].as_array().unwrap().iter().map(|r| r.to_string().len() as u64).sum::<u64>();
                match page["nextCursor"].as_str() {
                    Some(c) => cursor = Some(c.to_owned()),
                    None => break,
                }
            }
        }
        server.terminate();

        // 8. patchRow at 64 connections while checkpoints of the whole state run: the server
        //    again, told to checkpoint every 40,000 records, so several run within the 10 s.
        let (server, _) =
            Server::start(&data, None, &["--checkpoint-every-records", "40000"]).await;
        let before = checkpoints(&server).await;
        let loaded = run_bench(&["--url", server.base.as_str(), "--key", KEY, "--workload", "patch",
            "--concurrency", "64", "--duration", "10s", "--warmup", "1s", "--sheet-ids", "3"])
        .await;
        let loaded_checkpoints = written(before, checkpoints(&server).await);
        let loaded = &loaded.levels[0];
        server.terminate();

        // 8a. bulkUpsert on the big sheet beside bulkAdd on sheet 2 (the same columns, empty
        //     until now; its generated texts would make the upsert keys ambiguous on sheet 1),
        //     alternated in five rounds of a second or more each, so the two rates are taken at
        //     the same moments: this machine's speed moves between minutes, and a disk stall
        //     of a few hundred ms is lost in a round that long. Last, so the rows it adds
        //     change no figure above; its rounds are new, so every update changes a cell.
        const ROUNDS: usize = 5;
        let (server, _) = Server::start(&data, None, &[]).await;
        // The restarted server builds its key index untimed, in a round no body reuses.
        upsert_first(&server.base, &keys, 999).await;
        let alternated = upsert_bodies(&keys, 3 * upsert_bodies_n, 1000);
        let (mut added, mut upserted) = ((0u64, 0f64), (0u64, 0f64));
        for part in alternated.chunks(alternated.len().div_ceil(ROUNDS)) {
            let requests = part.len().to_string();
            let add = run_bench(&["--url", server.base.as_str(), "--key", KEY, "--sheet-ids", "2",
                "--workload", "bulk-add", "--bulk-size", "2000", "--concurrency", "8",
                "--requests", &requests, "--warmup", "0s"])
            .await;
            let level = &add.levels[0];
            added = (added.0 + level.rows_written, added.1 + level.elapsed_seconds);
            let (rows, secs) = upsert_run(&server.base, part.to_vec(), 8).await;
            upserted = (upserted.0 + rows, upserted.1 + secs);
        }
        server.terminate();
        let (add_beside, upsert_beside) = (added.0 as f64 / added.1, upserted.0 as f64 / upserted.1);

        // 9. The disk alone, with no server running: the floor under every max latency above.
        let disk = disk_floor(data.parent().unwrap_or(&data), Duration::from_secs(10));

        println!();
        println!("sheetd engine figures (release build, loopback, {} rows in all: a sheet of {big_rows} + one of 1,000)", total_rows);
        println!();
        row("measure", "now".into(), "target");
        println!("|{}|{}|{}|", "-".repeat(60), "-".repeat(36), "-".repeat(24));
        row(&format!("listRows page of 100, 32 conns, against bare actix-web, alternated in {PAGE_ROUNDS} rounds"), format!("{:.1}k vs {:.1}k req/s = {:.2}", ours_rps / 1e3, bare_rps / 1e3, ours_rps / bare_rps), ">= 0.8");
        let rounds: Vec<String> = page_ratios.iter().map(|r| format!("{r:.2}")).collect();
        row(&format!("  each round's ratio, lowest first (checkpoints meanwhile: {page_checkpoints})"), rounds.join(", "), "");
        row("  the same pages against PostgreSQL's (json_agg, database-side)", peer.against(ours_rps, peer.page_per_s, "pages/s"), "ahead of PostgreSQL");
        row("getRow, 32 conns", peer.against(get_row.requests_per_second, peer.get_per_s, "req/s"), "ahead of PostgreSQL");
        row("bulkAdd, 2000-row bodies, 8 conns", peer.against(bulk.rows_per_second, peer.bulk_rows_per_s, "durable rows/s"), "ahead of PostgreSQL");
        row(&format!("bulkUpsert on the {big_rows}-row sheet, 2000-row bodies, half updates, 8 conns"), format!("{:.0}k durable rows/s = {:.2} of step 1's bulkAdd", upsert_rps / 1e3, upsert_rps / bulk.rows_per_second), "the next row decides");
        row(&format!("  the same beside bulkAdd (sheet 2), alternated in {ROUNDS} rounds"), format!("{:.0}k vs {:.0}k durable rows/s = {:.2}", upsert_beside / 1e3, add_beside / 1e3, upsert_beside / add_beside), ">= 0.8 of bulkAdd");
        row(&format!("first upsert naming a key column ({big_rows} rows, one scan)"), format!("{:.0} ms", index_build * 1e3), "once per column");
        row("  RSS it added (the column's key index)", format!("{:+} MB", index_rss >> 20), "measured");
        row(&format!("patchRow of distinct rows, 64 conns (checkpoints meanwhile: {patch_checkpoints})"), format!("{:.1}k/s, p99 {:.1} ms, max {:.0} ms", p64.requests_per_second / 1e3, p64.latency_ms.p99, p64.latency_ms.max), "p99 <= 10 ms, max <= 50 ms");
        row("  against PostgreSQL's durable updates at 64 conns", format!("{}, p99 {:.1} ms{}", peer.against(p64.requests_per_second, peer.update_per_s, "/s"), peer.update_p99_ms, peer.max_of_updates()), "ahead of PostgreSQL");
        row(&format!("patchRow, 64 conns, 10 s, checkpoints every 40,000 records: {loaded_checkpoints}"), format!("{:.1}k/s, p99 {:.1} ms, max {:.0} ms", loaded.requests_per_second / 1e3, loaded.latency_ms.p99, loaded.latency_ms.max), "p99 <= 10 ms, max <= 50 ms");
        row("  the disk alone: 4 KiB write + fdatasync in a loop, 10 s", disk.to_string(), "the floor of a max");
        let source = if peer.measured { "this run" } else { "recorded" };
        row(&format!("patchRow, 1 conn (PostgreSQL p50 {:.2} ms, {source})", peer.update1_p50_ms), format!("p50 {:.2} ms", p1.latency_ms.p50), "the log's floor, docs");
        for (what, big, small) in &flat {
            row(&format!("{what} p50, {big_rows}-row sheet vs 1k-row sheet"), format!("{big:.3} vs {small:.3} ms ({:.2}x)", big / small), "ratio <= 1.5 (rows 1.2)");
        }
        row("RSS after the load, against the rows' JSON size", format!("{} MB vs {} MB ({:.2}x)", rss >> 20, json_bytes >> 20, rss as f64 / json_bytes as f64), "<= 1.5x");
        row("RSS of a fresh start against its rows' JSON", format!("{} MB vs {} MB ({:.2}x)", rss_fresh >> 20, json_fresh >> 20, rss_fresh as f64 / json_fresh.max(1) as f64), "<= 1.5x");
        for ((_, what, _, postgres), (first, median)) in REPORTS.iter().zip(&reports) {
            row(&format!("report {what} (PostgreSQL {postgres})"), format!("{median:.1} ms (first run {first:.0} ms)"), "<= 50 ms");
        }
        row("  RSS before / after the report runs (their kept columns)", format!("{} MB / {} MB", rss >> 20, rss_reports >> 20), "measured");
        row("  load average when the report runs ended", report_load.split_whitespace().take(3).collect::<Vec<_>>().join(" "), "");
        row("start-up after SIGKILL / after a clean stop", format!("{:.2} s / {:.2} s", after_kill.as_secs_f64(), after_stop.as_secs_f64()), "<= 1 s");
        row("  the log's tail the SIGKILL start replayed", format!("{tail_records:.0} records, {tail_mb:.0} MB"), "");
        row("data dir against its checkpoint (after a clean stop)", format!("{} MB vs {} MB ({:.2}x)", data_dir >> 20, checkpoint >> 20, data_dir as f64 / checkpoint.max(1) as f64), "<= 2x");
        row("  log records kept for the change feed before the kill", format!("{retained_mb:.0} MB as stored"), "");
        println!();
        println!("change feed and leaner reads");
        println!();
        row("measure", "now".into(), "for");
        println!("|{}|{}|{}|", "-".repeat(60), "-".repeat(36), "-".repeat(24));
        row(&format!("feed backlog read, limit 500, 1 client ({read} changes)"), format!("{:.0}k changes/s", backlog_rate / 1e3), "catch-up after export");
        for (pace, rps, changes, polls, secs, lag) in &runs {
            let kind = if pace.is_some() { "a follower pausing 100 ms per poll" } else { "an eager long-polling follower" };
            row(&format!("patchRow, 16 conns: alone / with {kind} (mean of 2)"), format!("{:.1}k / {:.1}k req/s ({:.2}x)", alone_rps / 1e3, mean(rps) / 1e3, mean(rps) / alone_rps), "writers pay nothing");
            row("  its changes delivered, polls, and delay after the writers stop", format!("{:.1}k/s, {:.0} polls/s, {:.0} ms", *changes as f64 / secs / 1e3, *polls as f64 / secs, lag * 1e3), "");
        }
        row("listRows page of 100: all 9 columns / fields of 2", format!("{:.1}k / {:.1}k req/s, {:.0} / {:.0} bytes", all_rps / 1e3, two_rps / 1e3, all_bytes, two_bytes), "");
        for (coding, rps, bytes) in &coded {
            row(&format!("listRows page of 100, {coding} against plain"), format!("{:.1}k vs {:.1}k req/s, {:.0} vs {:.0} bytes", rps / 1e3, all_rps / 1e3, bytes, all_bytes), "");
        }
        println!();
        println!("bulkAdd load: {} rows in {:.1} s; page of 100: {} bytes", bulk.rows_written, bulk.elapsed_seconds, page.len());
        println!("bulkUpsert: {upsert_bodies_n} bodies of 2000, updates over {} keys only one row of B1 holds", keys.len());
        println!("checkpoints written during the bulkAdd load {load_checkpoints}, the patchRow runs {patch_checkpoints}, the bulkUpsert {upsert_checkpoints}");
        // The servers' warnings, in order: a max latency in the table may have its cause here.
        let warnings = std::fs::read_to_string(warnings_of(&data)).unwrap_or_default();
        let warnings: Vec<&str> = warnings.lines().filter(|l| l.contains("WARN")).collect();
        println!("the servers' warnings during the run: {}", warnings.len());
        for line in warnings {
            println!("  {line}");
        }
    });
}
