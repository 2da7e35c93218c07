//! An end-to-end load test on loopback: the real server in-process, real data dir, concurrent
//! clients writing single-row patches and bulk adds and reading pages. Bounded in requests and
//! time; prints throughput and latency percentiles per concurrency level.
//!
//! Run: `cargo bench --bench http_load` (add `-- --quick` for a short run).

use std::time::{Duration, Instant};

use serde_json::json;
use sheetd::config::ServeArgs;
use sheetd::server::{self, Options};

const KEY: &str = "svc_live_LoadTestKey000000000000000000000000000";

fn fixture(sheets: u64) -> serde_json::Value {
    let ids: Vec<u64> = (1..=sheets).collect();
    json!({
        "users": [{"id": 1, "name": "load", "plan": "paid"}],
        "projects": [{"id": 1, "name": "Load", "ownerId": 1}],
        "sheets": ids.iter().map(|i| json!({"id": i, "projectId": 1, "name": format!("s{i}")})).collect::<Vec<_>>(),
        "columns": ids.iter().flat_map(|i| [
            json!({"id": i * 10, "sheetId": i, "name": "Text", "type": "text"}),
            json!({"id": i * 10 + 1, "sheetId": i, "name": "N", "type": "number"}),
        ]).collect::<Vec<_>>(),
        "keys": [{"id": 1, "ownerId": 1, "name": "load", "secret": KEY, "grants": [{"verb": "write", "scopeType": "account"}]}]
    })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn level(
    base: &str,
    concurrency: usize,
    requests: usize,
    sheets: u64,
) -> (f64, Duration, Duration) {
    let started = Instant::now();
    let per = requests / concurrency;
    let tasks: Vec<_> = (0..concurrency)
        .map(|w| {
            let base = base.to_owned();
            actix_rt::spawn(async move {
                let client = awc::Client::builder().timeout(Duration::from_secs(30)).finish();
                let mut lat = Vec::with_capacity(per);
                for i in 0..per {
                    let sheet = 1 + (w as u64 + i as u64) % sheets;
                    let t = Instant::now();
                    let req = client.post(format!("{base}/sheets/{sheet}/rows:bulkAdd"));
                    let body = json!({"rows": [{"cells": {(sheet * 10).to_string(): format!("w{w} r{i}"), (sheet * 10 + 1).to_string(): i}}]});
                    let mut res = req
                        .insert_header(("Authorization", format!("Bearer {KEY}")))
                        .insert_header(("Content-Type", "application/json"))
                        .send_body(body.to_string())
                        .await
                        .expect("request");
                    assert_eq!(res.status(), 200);
                    res.body().await.expect("body");
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let secs = started.elapsed().as_secs_f64();
    all.sort();
    (all.len() as f64 / secs, percentile(&all, 0.5), percentile(&all, 0.99))
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let requests = if quick { 400 } else { 4000 };
    actix_rt::System::new().block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        let seed = dir.path().join("seed.json");
        let sheets = 8;
        std::fs::write(&seed, fixture(sheets).to_string()).unwrap();
        let args = ServeArgs {
            addr: "127.0.0.1:0".parse().unwrap(),
            admin_addr: "127.0.0.1:0".parse().unwrap(),
            data_dir: dir.path().join("data"),
            seed: Some(seed),
            no_demo: true,
            admin_token: Some("adm_load".into()),
            rate_limit_per_minute: u64::MAX,
            max_body_bytes: 16 << 20,
            log_json: false,
            ..default_args()
        };
        let running = server::start(Options { args, clock: Default::default(), print_secrets: false }).await.unwrap();
        let base = format!("http://{}/api/v1", running.addr);
        println!("durable single-row bulkAdd over {sheets} sheets, {requests} requests per level, loopback");
        println!("{:>11} {:>10} {:>10} {:>10} {:>16}", "concurrency", "req/s", "p50", "p99", "records/flush");
        for concurrency in [1usize, 4, 16, 64] {
            let before = running.state.service.log_stats();
            let (rps, p50, p99) = level(&base, concurrency, requests, sheets).await;
            let after = running.state.service.log_stats();
            let per_flush = (after.records_flushed - before.records_flushed) as f64
                / (after.flushes - before.flushes).max(1) as f64;
            println!("{concurrency:>11} {rps:>10.0} {p50:>10.2?} {p99:>10.2?} {per_flush:>16.1}");
        }
        server::stop(running).await.unwrap();
    });
}

/// Flags not set above take their CLI defaults.
fn default_args() -> ServeArgs {
    use clap::Parser;
    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: ServeArgs,
    }
    Wrapper::parse_from(["bench"]).args
}
