//! Webhook deliveries' figures, measured on the server in this process (release, a temporary
//! data dir, `--webhook-allow-private`) with receivers on loopback that answer 204 at once:
//!
//! 1. **Throughput**: 200,000 changes written first (bulkAdd, 2,000-row bodies), then one
//!    webhook `from` their start: changes per second until the receiver holds them all.
//! 2. **Latency**: one webhook following a sheet; single-row bulkAdds one at a time, 20 ms
//!    apart: from a write's acknowledgement to the receiver holding its change (p50, p99).
//! 3. **Writers' cost**: single-row bulkAdds at 16 connections for 5 s on a sheet with no
//!    webhook, then with 1,000 webhooks on it (all to one receiver), alternated twice: the
//!    writers' durable rate (each acknowledged write is durable), and what the webhooks
//!    delivered meanwhile (paced to `--webhook-cpu-percent`, 5 % of a core by default).
//!
//! Run: `cargo bench --bench webhooks` (`-- --quick`: 50,000 changes, 100 webhooks). Nothing
//! here asserts a duration: it prints.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actors::shared::Clock;
use serde_json::{json, Value};
use sheetd::config::ServeArgs;
use sheetd::server::{self, Options};

const KEY: &str = "svc_live_WebhookBenchKey0000000000000000000001";

fn fixture() -> Value {
    let mut keys = vec![json!({"id": 1, "ownerId": 1, "name": "bench", "secret": KEY,
        "grants": [{"verb": "write", "scopeType": "account", "scopeId": null}]})];
    keys.extend((0..HOOK_KEYS).map(|n| {
        json!({"id": n + 2, "ownerId": 1,
        "name": format!("hooks {n}"), "secret": hook_key(n),
        "grants": [{"verb": "read", "scopeType": "account", "scopeId": null}]})
    }));
    json!({
      "users": [{"id": 1, "name": "ada", "plan": "paid"}],
      "plans": {"free": {"maxRowsPerSheet": 5000}, "paid": {"maxRowsPerSheet": 10000000}},
      "projects": [{"id": 1, "name": "Bench", "ownerId": 1}],
      "sheets": [{"id": 1, "projectId": 1, "name": "Big"}, {"id": 2, "projectId": 1, "name": "Small"},
                 {"id": 3, "projectId": 1, "name": "Busy"}],
      "columns": [
        {"id": 100, "sheetId": 1, "name": "Task", "type": "text", "position": 0, "primary": true},
        {"id": 200, "sheetId": 2, "name": "Task", "type": "text", "position": 0, "primary": true},
        {"id": 300, "sheetId": 3, "name": "Task", "type": "text", "position": 0, "primary": true}
      ],
      "keys": keys,
    })
}

/// A key holds at most 50 webhooks: the writers' cost run spreads its webhooks over these.
const HOOK_KEYS: u64 = 40;

/// The secret of webhook key `n` (`0..HOOK_KEYS`).
fn hook_key(n: u64) -> String {
    format!("svc_live_WebhookBenchKey{:022}", n + 2)
}

/// What a receiver took: per message, when it arrived and the `seq`s it held.
#[derive(Default)]
struct Taken {
    changes: AtomicU64,
    messages: AtomicU64,
    /// `seq` → arrival, for the latency run (only sheet 2's).
    arrivals: Mutex<HashMap<u64, Instant>>,
}

/// A receiver on its own thread and runtime: reads a request, answers 204, closes.
fn receiver() -> (SocketAddr, Arc<Taken>) {
    let taken = Arc::new(Taken::default());
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = std_listener.local_addr().unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let t = Arc::clone(&taken);
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                tokio::spawn(serve(stream, Arc::clone(&t)));
            }
        });
    });
    (addr, taken)
}

async fn serve(mut stream: tokio::net::TcpStream, taken: Arc<Taken>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut chunk = [0u8; 16 * 1024];
    let (head_end, len) = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..p]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            break (p + 4, len);
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    while buf.len() < head_end + len {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let now = Instant::now();
    let _ = stream.write_all(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n").await;
    let raw = &buf[head_end..head_end + len];
    taken.messages.fetch_add(1, Ordering::Relaxed);
    // The receiver stands for an integration on another machine: it counts changes by their
    // `"seq":` keys and parses only the latency run's messages, so that its own cost weighs
    // as little as it can on the server's cores in this process.
    if !contains(raw, b"\"sheetId\":2,") {
        let changes = raw.windows(6).filter(|w| w == b"\"seq\":").count();
        taken.changes.fetch_add(changes as u64, Ordering::Relaxed);
        return;
    }
    let body: Value = serde_json::from_slice(raw).unwrap_or_default();
    let data = body["data"].as_array().cloned().unwrap_or_default();
    taken.changes.fetch_add(data.len() as u64, Ordering::Relaxed);
    let mut arrivals = taken.arrivals.lock().unwrap();
    for c in &data {
        arrivals.entry(c["seq"].as_u64().unwrap_or(0)).or_insert(now);
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn client() -> awc::Client {
    awc::Client::builder().timeout(Duration::from_secs(60)).finish()
}

async fn post(base: &str, path: &str, body: &Value) -> Value {
    post_as(base, KEY, path, body).await
}

async fn post_as(base: &str, key: &str, path: &str, body: &Value) -> Value {
    let mut res = client()
        .post(format!("{base}{path}"))
        .insert_header(("Authorization", format!("Bearer {key}")))
        .send_json(body)
        .await
        .expect("request");
    let bytes = res.body().limit(64 << 20).await.unwrap();
    assert!(res.status().is_success(), "{path}: {}", String::from_utf8_lossy(&bytes));
    serde_json::from_slice(&bytes).unwrap_or_default()
}

async fn feed_cursor(base: &str, sheet: u64) -> String {
    let mut res = client()
        .get(format!("{base}/sheets/{sheet}/export"))
        .insert_header(("Authorization", format!("Bearer {KEY}")))
        .send()
        .await
        .unwrap();
    let _ = res.body().limit(1 << 30).await.unwrap();
    res.headers().get("sheet-changes-cursor").unwrap().to_str().unwrap().to_owned()
}

async fn webhook(base: &str, sheet: u64, url: &str, from: Option<&str>) {
    let mut body = json!({"sheetId": sheet, "url": url});
    if let Some(from) = from {
        body["from"] = json!(from);
    }
    post(base, "/webhooks", &body).await;
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Single-row bulkAdds on `sheet` at `connections` for `secs`: acknowledged writes per second.
async fn write_load(base: &str, sheet: u64, connections: usize, secs: u64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(secs);
    let column = (sheet * 100).to_string();
    let tasks: Vec<_> = (0..connections)
        .map(|_| {
            let (base, done, column) = (base.to_owned(), Arc::clone(&done), column.clone());
            actix_rt::spawn(async move {
                let client = client();
                while Instant::now() < until {
                    let res = client
                        .post(format!("{base}/sheets/{sheet}/rows:bulkAdd"))
                        .insert_header(("Authorization", format!("Bearer {KEY}")))
                        .send_json(&json!({"rows": [{"cells": {column.as_str(): "load"}}]}))
                        .await;
                    if matches!(res, Ok(r) if r.status() == 200) {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    done.load(Ordering::Relaxed) as f64 / secs as f64
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (changes, hooks) = if quick { (50_000u64, 100usize) } else { (200_000, 1_000) };
    actix_rt::System::new().block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        let seed = dir.path().join("seed.json");
        std::fs::write(&seed, fixture().to_string()).unwrap();
        let data = dir.path().join("data");
        let args = ServeArgs::parse_flags([
            "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
            "--data-dir", data.to_str().unwrap(), "--seed", seed.to_str().unwrap(),
            "--rate-limit-per-minute", "100000000", "--admin-token", "adm_webhook_bench",
            "--webhook-allow-private",
        ])
        .unwrap();
        let running =
            server::start(Options { args, clock: Clock::default(), print_secrets: false }).await.unwrap();
        let base = format!("http://{}/api/v1", running.addr);
        println!("webhook bench: {changes} changes, {hooks} webhooks, {} cores", std::thread::available_parallelism().map_or(0, |n| n.get()));

        // 1. Throughput.
        let from = feed_cursor(&base, 1).await;
        for _ in 0..changes / 2000 {
            let rows: Vec<Value> = (0..2000).map(|i| json!({"cells": {"100": format!("row {i} of the load")}})).collect();
            post(&base, "/sheets/1/rows:bulkAdd", &json!({"rows": rows})).await;
        }
        let (addr, taken) = receiver();
        let started = Instant::now();
        webhook(&base, 1, &format!("http://{addr}/t"), Some(&from)).await;
        while taken.changes.load(Ordering::Relaxed) < changes {
            actix_rt::time::sleep(Duration::from_millis(5)).await;
        }
        let secs = started.elapsed().as_secs_f64();
        println!(
            "throughput: {changes} changes in {} messages, {secs:.2} s: {:.0} changes/s",
            taken.messages.load(Ordering::Relaxed),
            changes as f64 / secs
        );

        // 2. Latency.
        let (addr, taken) = receiver();
        webhook(&base, 2, &format!("http://{addr}/l"), None).await;
        actix_rt::time::sleep(Duration::from_millis(200)).await;
        let mut acks: Vec<(u64, Instant)> = Vec::new();
        // Sheet 2 starts empty: its first change is seq 1.
        let start_seq = 1;
        for i in 0..500u64 {
            post(&base, "/sheets/2/rows:bulkAdd", &json!({"rows": [{"cells": {"200": "one"}}]})).await;
            acks.push((start_seq + i, Instant::now()));
            actix_rt::time::sleep(Duration::from_millis(20)).await;
        }
        actix_rt::time::sleep(Duration::from_secs(1)).await;
        let arrivals = taken.arrivals.lock().unwrap().clone();
        let mut ms: Vec<f64> = acks
            .iter()
            .filter_map(|(seq, ack)| arrivals.get(seq).map(|at| at.saturating_duration_since(*ack).as_secs_f64() * 1e3))
            .collect();
        ms.sort_by(f64::total_cmp);
        println!(
            "latency (ack -> delivery, {} of 500 writes): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            ms.len(),
            percentile(&ms, 0.5),
            percentile(&ms, 0.99),
            ms.last().copied().unwrap_or(0.0)
        );

        // 3. Writers' cost of webhooks on their sheet.
        let (addr, taken) = receiver();
        let without = vec![write_load(&base, 3, 16, 5).await];
        println!("  no webhook: {:.0} writes/s", without[0]);
        for i in 0..hooks {
            let body = json!({"sheetId": 3, "url": format!("http://{addr}/w{i}")});
            post_as(&base, &hook_key(i as u64 / 50), "/webhooks", &body).await;
        }
        let mut with = Vec::new();
        for round in 0..2 {
            let before = taken.changes.load(Ordering::Relaxed);
            let rate = write_load(&base, 3, 16, 5).await;
            let delivered = taken.changes.load(Ordering::Relaxed) - before;
            println!(
                "  {hooks} webhooks, run {round}: {rate:.0} writes/s; {delivered} changes delivered \
                 during the run ({:.0}/s, {:.0} per webhook per s)",
                delivered as f64 / 5.0,
                delivered as f64 / 5.0 / hooks as f64
            );
            with.push(rate);
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        println!(
            "writers: {:.0} writes/s without webhooks, {:.0} with {hooks} ({:+.1} %)",
            mean(&without),
            mean(&with),
            (mean(&with) / mean(&without) - 1.0) * 100.0
        );
        server::stop(running).await.unwrap();
    });
}
