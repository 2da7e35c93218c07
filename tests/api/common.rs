//! The test harness: a real sheetd (in-process on 127.0.0.1:0, or the built binary) over a
//! temporary data dir, and request helpers returning `(status, json, headers)`.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use actix_web::http::header::HeaderMap;
use actors::shared::Clock;
use serde_json::{json, Value};
use sheetd::config::ServeArgs;
use sheetd::server::{self, Options, Running};

/// Secrets of the keys in [`fixture`].
pub const ADA_WRITE: &str = "svc_live_AdaWriteKey0000000000000000000000001";
pub const ADA_READ: &str = "svc_live_AdaReadKey00000000000000000000000002";
pub const BOB_ALL: &str = "svc_live_BobAccountKey000000000000000000000003";
pub const ADA_SHEET11: &str = "svc_live_AdaSheetElevenKey000000000000000004";
pub const ADMIN_TOKEN: &str = "adm_test_token_0123456789";

/// The test workspace: ada (paid) owns project 1 (folder 5 with sheet 10; sheet 11 outside
/// any folder) and reports 7 (row) and 8 (summary); bob (free) owns project 2 (sheet 20) and
/// views folder 5. Sheet 10 has every column type and a subtree 1000 → 1001 → 1002.
pub fn fixture() -> Value {
    json!({
      "users": [{"id": 1, "name": "ada", "plan": "paid"}, {"id": 2, "name": "bob", "plan": "free"}],
      "projects": [{"id": 1, "name": "Ops", "ownerId": 1}, {"id": 2, "name": "Ads", "ownerId": 2}],
      "folders": [{"id": 5, "projectId": 1, "name": "Q3"}],
      "sheets": [
        {"id": 10, "projectId": 1, "folderId": 5, "name": "Tasks"},
        {"id": 11, "projectId": 1, "folderId": null, "name": "Stock"},
        {"id": 20, "projectId": 2, "name": "Campaigns"}
      ],
      "columns": [
        {"id": 100, "sheetId": 10, "name": "Task", "type": "text", "position": 0, "primary": true},
        {"id": 101, "sheetId": 10, "name": "Status", "type": "dropdown", "position": 1, "options": ["Open", "Done"]},
        {"id": 102, "sheetId": 10, "name": "Hours", "type": "number", "position": 2},
        {"id": 103, "sheetId": 10, "name": "Billable", "type": "checkbox", "position": 3},
        {"id": 104, "sheetId": 10, "name": "Due", "type": "date", "position": 4},
        {"id": 105, "sheetId": 10, "name": "Seen", "type": "datetime", "position": 5},
        {"id": 106, "sheetId": 10, "name": "Owner", "type": "contact", "position": 6},
        {"id": 107, "sheetId": 10, "name": "Tags", "type": "multi_select", "position": 7, "options": ["a", "b", "c"]},
        {"id": 108, "sheetId": 10, "name": "Flag", "type": "symbol", "position": 8, "options": ["Red", "Green"]},
        {"id": 110, "sheetId": 11, "name": "Task", "type": "text", "position": 1},
        {"id": 111, "sheetId": 11, "name": "Status", "type": "dropdown", "position": 0, "options": ["Open", "Done"]},
        {"id": 112, "sheetId": 11, "name": "Hours", "type": "number", "position": 2},
        {"id": 200, "sheetId": 20, "name": "Name", "type": "text", "position": 0}
      ],
      "rows": [
        {"id": 1000, "sheetId": 10, "cells": {"100": "root", "101": "Done", "102": 5}, "attachments": [{"name": "a.pdf", "bytes": 100}]},
        {"id": 1001, "sheetId": 10, "parentId": 1000, "cells": {"100": "child", "101": "Open", "102": 2}, "attachments": [{"name": "b.pdf", "bytes": 50}]},
        {"id": 1002, "sheetId": 10, "parentId": 1001, "cells": {"100": "grandchild", "102": 1}},
        {"id": 1003, "sheetId": 10, "cells": {"100": "other", "101": "Done", "102": 8, "103": true, "104": "2026-01-31",
                                              "105": "2026-01-31T23:00:00-02:00", "106": "x@y.z", "107": ["a", "c"], "108": "Red"}},
        {"id": 1100, "sheetId": 11, "cells": {"110": "stock", "111": "Done", "112": 3}},
        {"id": 2000, "sheetId": 20, "cells": {"200": "launch"}}
      ],
      "shares": [{"userId": 2, "scopeType": "folder", "scopeId": 5, "role": "viewer"}],
      "reports": [
        {"id": 7, "projectId": 1, "ownerId": 1, "name": "Done", "definition": {"type": "row", "sources": [10, 11],
          "columns": ["Task", "Status", "Hours"], "filter": {"all": [{"column": "Status", "op": "eq", "value": "Done"}]},
          "sort": [{"column": "Hours", "direction": "desc"}]}},
        {"id": 8, "projectId": 1, "ownerId": 1, "name": "By status", "definition": {"type": "summary", "sources": [10, 11],
          "groupBy": ["Status"], "aggregates": [{"fn": "count"}, {"fn": "sum", "column": "Hours"}], "filter": null}},
        {"id": 9, "projectId": 2, "ownerId": 2, "name": "Bob's", "definition": {"type": "row", "sources": [20], "columns": ["Name"]}}
      ],
      "keys": [
        {"id": 1, "ownerId": 1, "name": "ada-write", "secret": ADA_WRITE, "grants": [{"verb": "write", "scopeType": "project", "scopeId": 1}]},
        {"id": 2, "ownerId": 1, "name": "ada-read", "secret": ADA_READ, "grants": [{"verb": "read", "scopeType": "project", "scopeId": 1}]},
        {"id": 3, "ownerId": 2, "name": "bob-all", "secret": BOB_ALL, "grants": [{"verb": "write", "scopeType": "account", "scopeId": null}]},
        {"id": 4, "ownerId": 1, "name": "ada-11", "secret": ADA_SHEET11, "grants": [{"verb": "write", "scopeType": "sheet", "scopeId": 11}]}
      ]
    })
}

/// `(status, body as JSON (Null when empty), headers)`.
pub type Reply = (u16, Value, HeaderMap);

/// An in-process server over a data dir.
pub struct TestServer {
    /// `http://127.0.0.1:port/api/v1`.
    pub base: String,
    /// `http://127.0.0.1:port/admin/v1`.
    pub admin: String,
    /// The data dir (kept alive by `_dir`).
    pub data_dir: PathBuf,
    /// The clock the server uses.
    pub clock: Clock,
    /// Extra flags used at every start.
    pub args: ServeArgs,
    running: Option<Running>,
    _dir: Option<tempfile::TempDir>,
}

/// Serve flags for a data dir on ephemeral ports.
pub fn args(data_dir: &Path) -> ServeArgs {
    ServeArgs {
        addr: "127.0.0.1:0".parse().unwrap(),
        admin_addr: "127.0.0.1:0".parse().unwrap(),
        data_dir: data_dir.to_owned(),
        seed: None,
        no_demo: true,
        admin_token: Some(ADMIN_TOKEN.into()),
        rate_limit_per_minute: 100_000,
        max_body_bytes: 16 * 1024 * 1024,
        log_json: false,
        report_max_sources: 50,
        report_max_scanned_rows: 1_000_000,
        report_column_cache_mb: 256,
        checkpoint_every_bytes: 64 * 1024 * 1024,
        checkpoint_every_records: 150_000,
        checkpoint_every_secs: 300,
        min_free_disk_bytes: None,
        changes_retention_days: 7,
        changes_retention_min: 100_000,
        archive_dir: None,
        archive_seal_ms: 5_000,
        archive_segment_bytes: 16 * 1024 * 1024,
        archive_hold_records: 1_000_000,
        webhook_allow_private: false,
        webhook_disable_after_secs: 259_200,
        webhook_ca_file: None,
        webhook_cpu_percent: 5,
        background_cpu_percent: 10,
        node_id: None,
        raft_addr: None,
        initial_cluster: None,
        join: false,
        cluster_secret_file: None,
        cluster_tls_dir: None,
        max_local_staleness: std::time::Duration::from_secs(5),
    }
}

/// The own server of a `sheetd bench` run, started as the binary starts it: `sheetd serve` with
/// the load tester's flags, in this process.
pub fn own_server(
    flags: Vec<std::ffi::OsString>,
) -> futures_util::future::LocalBoxFuture<'static, anyhow::Result<sheetd_bench::Started>> {
    Box::pin(async move {
        let args = ServeArgs::parse_flags(flags)?;
        let running =
            server::start(Options { args, clock: Clock::default(), print_secrets: false }).await?;
        let (addr, admin_addr) = (running.addr, running.admin_addr);
        Ok(sheetd_bench::Started { addr, admin_addr, stop: Box::pin(server::stop(running)) })
    })
}

impl TestServer {
    /// A server seeded with [`fixture`].
    pub async fn start() -> Self {
        Self::start_with(fixture(), |_| {}).await
    }

    /// A server seeded with `fx`, after `tweak` adjusts the flags.
    pub async fn start_with(fx: Value, tweak: impl FnOnce(&mut ServeArgs)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let seed = dir.path().join("seed.json");
        std::fs::write(&seed, fx.to_string()).unwrap();
        let data_dir = dir.path().join("data");
        let mut a = args(&data_dir);
        a.seed = Some(seed);
        tweak(&mut a);
        let mut s = TestServer {
            base: String::new(),
            admin: String::new(),
            data_dir,
            clock: Clock::default(),
            args: a,
            running: None,
            _dir: Some(dir),
        };
        s.boot().await;
        s
    }

    async fn boot(&mut self) {
        let running = server::start(Options {
            args: self.args.clone(),
            clock: self.clock.clone(),
            print_secrets: false,
        })
        .await
        .expect("server starts");
        self.base = format!("http://{}/api/v1", running.addr);
        self.admin = format!("http://{}/admin/v1", running.admin_addr);
        self.running = Some(running);
    }

    /// The running server's state (service, limiter...).
    pub fn running(&self) -> &Running {
        self.running.as_ref().expect("running")
    }

    /// Stop gracefully (drain, checkpoint, close the log).
    pub async fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            server::stop(r).await.expect("clean stop");
        }
    }

    /// Stop gracefully and start again on the same data dir.
    pub async fn restart(&mut self) {
        self.stop().await;
        self.boot().await;
    }

    /// A request to the public API.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&Value>,
    ) -> Reply {
        self.raw(
            method,
            &format!("{}{path}", self.base),
            key,
            &[],
            body.map(|b| b.to_string().into_bytes()),
        )
        .await
    }

    /// GET with a key.
    pub async fn get(&self, path: &str, key: &str) -> Reply {
        self.call("GET", path, Some(key), None).await
    }

    /// POST with a key and JSON body.
    pub async fn post(&self, path: &str, key: &str, body: &Value) -> Reply {
        self.call("POST", path, Some(key), Some(body)).await
    }

    /// A request to the admin API with the admin token.
    pub async fn admin_call(&self, method: &str, path: &str, body: Option<&Value>) -> Reply {
        self.raw(
            method,
            &format!("{}{path}", self.admin),
            Some(ADMIN_TOKEN),
            &[],
            body.map(|b| b.to_string().into_bytes()),
        )
        .await
    }

    /// Any request: full URL, optional bearer, extra headers, raw body.
    pub async fn raw(
        &self,
        method: &str,
        url: &str,
        bearer: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Reply {
        send(method, url, bearer, headers, body).await
    }
}

/// Send one request with a fresh client.
pub async fn send(
    method: &str,
    url: &str,
    bearer: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<Vec<u8>>,
) -> Reply {
    let client = awc::Client::builder().timeout(Duration::from_secs(60)).finish();
    let mut req = client.request(method.parse().unwrap(), url);
    if let Some(k) = bearer {
        req = req.insert_header(("Authorization", format!("Bearer {k}")));
    }
    for (n, v) in headers {
        req = req.insert_header((*n, *v));
    }
    let mut res = match body {
        Some(b) if req.headers().contains_key("content-type") => req.send_body(b).await,
        Some(b) => req.insert_header(("Content-Type", "application/json")).send_body(b).await,
        None => req.send().await,
    }
    .expect("request sent");
    let bytes = res.body().limit(256 * 1024 * 1024).await.expect("body read");
    let json = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
    };
    (res.status().as_u16(), json, res.headers().clone())
}

/// Write `request` as is to `addr` and read until the server closes: `(status, head, body)`.
/// For requests no HTTP client would send (malformed, or without a header clients add).
pub async fn http_bytes(addr: std::net::SocketAddr, request: Vec<u8>) -> (u16, String, Vec<u8>) {
    actix_rt::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // The server may refuse before reading everything; what it answers is what counts.
        let _ = stream.write_all(&request);
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        let split = answer.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head");
        let head = String::from_utf8_lossy(&answer[..split]).into_owned();
        let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status");
        (status, head, answer[split + 4..].to_vec())
    })
    .await
    .unwrap()
}

/// A body without its `requestId` (to compare two responses).
pub fn without_request_id(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("requestId");
    }
    v
}

/// Assert a response is the error envelope with `code`, a `requestId` equal to `X-Request-Id`.
pub fn assert_error(reply: &Reply, status: u16, code: &str) {
    let (s, body, headers) = reply;
    assert_eq!(*s, status, "status of {body}");
    assert_eq!(body["errorCode"], code, "code of {body}");
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()), "message of {body}");
    let rid = body["requestId"].as_str().expect("requestId");
    assert_eq!(headers.get("x-request-id").unwrap().to_str().unwrap(), rid);
    let keys: Vec<&String> = body.as_object().unwrap().keys().collect();
    for k in &keys {
        assert!(
            ["errorCode", "message", "detail", "requestId"].contains(&k.as_str()),
            "unexpected field {k} in {body}"
        );
    }
}

/// The built `sheetd` binary running as a child process (for SIGKILL / SIGTERM tests).
pub struct Binary {
    /// The child.
    pub child: Child,
    /// `http://127.0.0.1:port/api/v1`.
    pub base: String,
    /// `http://127.0.0.1:port/admin/v1`.
    pub admin: String,
    /// Where its stderr goes.
    pub log: PathBuf,
}

impl Binary {
    /// Start `sheetd serve` on `data_dir` with `extra` flags, on ports the OS picks, and wait
    /// until its log says it serves and its health check answers.
    pub async fn start(data_dir: &Path, extra: &[&str]) -> Self {
        Self::start_under(&[], data_dir, extra).await
    }

    /// As [`Binary::start`], run through `wrapper` (e.g. `["fiu-run", "-x"]`): the wrapper
    /// execs sheetd, so the child's pid is sheetd's.
    pub async fn start_under(wrapper: &[&str], data_dir: &Path, extra: &[&str]) -> Self {
        static STARTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = data_dir.with_extension(format!("log{n}"));
        let program = env!("CARGO_BIN_EXE_sheetd");
        let mut command = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(program);
                c
            }
            None => Command::new(program),
        };
        let child = command
            .args(["serve", "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--admin-token", ADMIN_TOKEN, "--rate-limit-per-minute", "1000000"])
            .args(extra)
            // The default log filter is part of what is tested, and " serving " must be logged.
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("sheetd starts");
        let mut b = Binary { child, base: String::new(), admin: String::new(), log };
        for _ in 0..1200 {
            let text = std::fs::read_to_string(&b.log).unwrap_or_default();
            let field = |name: &str| {
                text.lines().find(|l| l.contains(" serving ")).and_then(|l| {
                    l.split_whitespace().find_map(|w| w.strip_prefix(name)).map(str::to_owned)
                })
            };
            if let (Some(addr), Some(admin)) = (field("addr="), field("admin_addr=")) {
                b.base = format!("http://{addr}/api/v1");
                b.admin = format!("http://{admin}/admin/v1");
                let (status, _, _) =
                    send("GET", &format!("{}/health", b.admin), Some(ADMIN_TOKEN), &[], None).await;
                assert_eq!(status, 200);
                return b;
            }
            if let Ok(Some(status)) = b.child.try_wait() {
                panic!("sheetd exited with {status}; log: {text}");
            }
            actix_rt::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "sheetd did not start serving; log: {}",
            std::fs::read_to_string(&b.log).unwrap_or_default()
        );
    }

    /// Start on `<dir>/data` seeded with [`fixture`]; returns the binary and its data dir.
    pub async fn seeded(dir: &Path) -> (Self, PathBuf) {
        let seed = dir.join("seed.json");
        std::fs::write(&seed, fixture().to_string()).unwrap();
        let data = dir.join("data");
        (Binary::start(&data, &["--seed", seed.to_str().unwrap()]).await, data)
    }

    /// SIGKILL it.
    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM it and wait for its exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        self.child.wait().unwrap()
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every row of a sheet by listRows (pages of 500), by id.
pub async fn list_all(base: &str, key: &str, sheet: u64) -> BTreeMap<u64, Value> {
    let mut rows = BTreeMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let url = match &cursor {
            Some(c) => format!("{base}/sheets/{sheet}/rows?limit=500&cursor={c}"),
            None => format!("{base}/sheets/{sheet}/rows?limit=500"),
        };
        let (status, page, _) = send("GET", &url, Some(key), &[], None).await;
        assert_eq!(status, 200, "{page}");
        for row in page["data"].as_array().unwrap() {
            rows.insert(row["id"].as_u64().unwrap(), row.clone());
        }
        match page["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return rows,
        }
    }
}

/// Bytes of `pid`'s resident memory.
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// A metric's value from the Prometheus text of `/admin/v1/metrics` (`admin`: the admin base).
pub async fn metric(admin: &str, name: &str) -> f64 {
    let (_, text, _) = send("GET", &format!("{admin}/metrics"), Some(ADMIN_TOKEN), &[], None).await;
    let prefix = format!("{name} ");
    text.as_str()
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("metric {name}"))
}
