//! Where the load goes: the own server, started in-process on a temporary data dir with
//! generated data, or a running server named by `--url`; and what the run learns from it
//! before it starts (sheets and columns, the key's rate limit, the admin metrics).
//!
//! # The own server
//!
//! It is `sheetd serve` with flags chosen here, started by the caller's [`StartServer`]: this
//! crate does not link the server, so the flags an operator would type are the whole contract,
//! and the run loads the very server the caller ships.
//!
//! 1. A temporary data dir, removed when the [`Target`] is closed (or dropped).
//! 2. The workspace (user, project, sheets, columns of mixed types, a summary report, a key with
//!    a known secret) goes in as a fixture through `--seed`, the path every seeded server takes.
//! 3. The rows go in through the public API: `bulkAdd` of 2000 rows, one loader per sheet in
//!    parallel. That is slower than putting them in the fixture, but the fixture would make one
//!    log record of the whole data set, a shape no real server ever sees, while this way the
//!    load phase is itself a realistic bulk load, measured and printed, and goes through the
//!    same code as every other write of the run.
//! 4. Its rate limit is set far above any load the machine can make, so the run measures the
//!    server, not the limiter.
//!
//! A running server is only read until the run starts: its sheets are listed (the first
//! `--sheets`, or `--sheet-ids`) and their columns fetched, so writes generate valid cells.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use awc::http::Method;
use futures_util::future::LocalBoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::client::Http;
use super::data::{self, ColumnInfo, SheetInfo};
use crate::args::BenchArgs;

/// Starts the own server in this process: given `sheetd serve` flags (without the program and
/// subcommand names), the server they describe, running.
pub type StartServer = fn(Vec<OsString>) -> LocalBoxFuture<'static, anyhow::Result<Started>>;

/// A server a [`StartServer`] started.
pub struct Started {
    /// Where its public API listens.
    pub addr: SocketAddr,
    /// Where its admin API listens.
    pub admin_addr: SocketAddr,
    /// Stops it as `sheetd serve` stops on a signal. Not polled until the run ends, and the data
    /// dir is removed only after it completes.
    pub stop: LocalBoxFuture<'static, anyhow::Result<()>>,
}

/// `rateLimit` of `GET /me`.
#[derive(Clone, Copy, Debug, Deserialize, Serialize)]
pub struct RateLimit {
    /// Requests per rolling minute.
    pub limit: u64,
    /// Left in the current window.
    pub remaining: u64,
    /// Unix seconds when the next slot frees.
    pub reset: i64,
}

/// The log's counters in `/admin/v1/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FlushCounters {
    /// `sheetd_wal_flushes_total`.
    pub flushes: f64,
    /// `sheetd_wal_records_flushed_total`.
    pub records: f64,
    /// `sheetd_wal_flush_duration_seconds_sum`.
    pub seconds: f64,
    /// `sheetd_wal_flush_duration_seconds_count`.
    pub timed: f64,
}

impl FlushCounters {
    /// Read the counters from Prometheus text.
    pub fn parse(text: &str) -> Option<Self> {
        let value = |name: &str| {
            text.lines().find_map(|l| {
                let (n, v) = l.split_once(' ')?;
                (n == name).then(|| v.trim().parse::<f64>().ok()).flatten()
            })
        };
        Some(FlushCounters {
            flushes: value("sheetd_wal_flushes_total")?,
            records: value("sheetd_wal_records_flushed_total")?,
            seconds: value("sheetd_wal_flush_duration_seconds_sum")?,
            timed: value("sheetd_wal_flush_duration_seconds_count")?,
        })
    }
}

/// What the server's log did during a level.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FlushFigures {
    /// Group commits.
    pub flushes: u64,
    /// Records they made durable.
    pub records_flushed: u64,
    /// Records per group commit.
    pub records_per_flush: f64,
    /// Mean time of one group commit (write, flush, fsync), milliseconds.
    pub flush_mean_ms: f64,
}

impl FlushFigures {
    /// The difference between two scrapes.
    pub fn between(before: FlushCounters, after: FlushCounters) -> Self {
        let flushes = (after.flushes - before.flushes).max(0.0);
        let records = (after.records - before.records).max(0.0);
        let timed = (after.timed - before.timed).max(0.0);
        let seconds = (after.seconds - before.seconds).max(0.0);
        FlushFigures {
            flushes: flushes as u64,
            records_flushed: records as u64,
            records_per_flush: if flushes > 0.0 { records / flushes } else { 0.0 },
            flush_mean_ms: if timed > 0.0 { seconds / timed * 1000.0 } else { 0.0 },
        }
    }

    /// The figures of several intervals (the runs of a repeated level) taken together.
    pub fn sum(parts: &[FlushFigures]) -> Self {
        let flushes: u64 = parts.iter().map(|f| f.flushes).sum();
        let records: u64 = parts.iter().map(|f| f.records_flushed).sum();
        let weighted: f64 = parts.iter().map(|f| f.flush_mean_ms * f.flushes as f64).sum();
        FlushFigures {
            flushes,
            records_flushed: records,
            records_per_flush: if flushes > 0 { records as f64 / flushes as f64 } else { 0.0 },
            flush_mean_ms: if flushes > 0 { weighted / flushes as f64 } else { 0.0 },
        }
    }
}

/// How the own server's rows were loaded.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadFigures {
    /// Rows added.
    pub rows: u64,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// The own server and the temporary dir it lives in.
struct OwnServer {
    stop: LocalBoxFuture<'static, anyhow::Result<()>>,
    dir: tempfile::TempDir,
}

/// The server under load.
pub struct Target {
    /// `http://host:port/api/v1`.
    pub base: String,
    /// The key's secret, sent as `Authorization: Bearer`.
    pub key: String,
    /// Admin base URL and token, when known.
    pub admin: Option<(String, String)>,
    /// The sheets the load spreads over, with their columns.
    pub sheets: Vec<SheetInfo>,
    /// The report the `report` workload runs.
    pub report_id: Option<u64>,
    /// How the own server's rows were loaded.
    pub loaded: Option<LoadFigures>,
    own: Option<OwnServer>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SheetList {
    data: Vec<SheetSummary>,
    next_cursor: Option<String>,
}

#[derive(Deserialize)]
struct SheetSummary {
    id: u64,
}

#[derive(Deserialize)]
struct ColumnList {
    data: Vec<ColumnItem>,
}

#[derive(Deserialize)]
struct ColumnItem {
    id: u64,
    #[serde(rename = "type")]
    ty: String,
    #[serde(default)]
    options: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Me {
    rate_limit: RateLimit,
}

impl Target {
    /// The own server (no `--url`), started with `start`, or a running one. A caller that only
    /// loads running servers has no `start` to give.
    ///
    /// # Errors
    ///
    /// The own server did not start or load, or cannot be started without `start`; or the
    /// running one did not answer the setup calls.
    pub async fn open(args: &BenchArgs, start: Option<StartServer>) -> anyhow::Result<Self> {
        match (&args.url, start) {
            (Some(url), _) => Self::connect(args, url).await,
            (None, _) if !args.sheet_ids.is_empty() => {
                bail!("--sheet-ids names sheets of a running server: it needs --url")
            }
            (None, Some(start)) => Self::start_own(args, start).await,
            (None, None) => bail!("no own server to start here: give --url"),
        }
    }

    async fn connect(args: &BenchArgs, url: &str) -> anyhow::Result<Self> {
        let key = args.key.clone().context("--url needs --key (an API key of that server)")?;
        let base = url.trim_end_matches('/').to_owned();
        let http = Http::new(&base, &key);
        let ids = if args.sheet_ids.is_empty() {
            first_sheets(&http, args.sheets).await?
        } else {
            args.sheet_ids.clone()
        };
        let sheets = columns_of(&http, &ids).await?;
        let admin = args.admin_url.clone().zip(args.admin_token.clone());
        Ok(Target { base, key, admin, sheets, report_id: args.report_id, loaded: None, own: None })
    }

    async fn start_own(args: &BenchArgs, start: StartServer) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("sheetd-bench-")
            .tempdir()
            .context("cannot create a temporary data dir")?;
        let key = data::own_key();
        let seed = dir.path().join("seed.json");
        std::fs::write(&seed, data::fixture(args.sheets, args.columns, &key).to_string())?;
        let admin_token = data::own_admin_token();
        let mut flags: Vec<OsString> = Vec::new();
        let mut flag = |name: &str, value: OsString| flags.extend([name.into(), value]);
        flag("--addr", "127.0.0.1:0".into());
        flag("--admin-addr", "127.0.0.1:0".into());
        flag("--data-dir", dir.path().join("data").into());
        flag("--seed", seed.into());
        flag("--admin-token", admin_token.clone().into());
        flag("--rate-limit-per-minute", "1000000000".into());
        flag("--report-max-sources", args.sheets.max(50).to_string().into());
        flag("--report-max-scanned-rows", u64::MAX.to_string().into());
        flags.push("--no-demo".into());
        let started = start(flags).await.context("starting the own server")?;
        let base = format!("http://{}/api/v1", started.addr);
        let admin = format!("http://{}/admin/v1", started.admin_addr);
        let mut target = Target {
            base,
            key,
            admin: Some((admin, admin_token)),
            sheets: Vec::new(),
            report_id: Some(data::REPORT_ID),
            loaded: None,
            own: Some(OwnServer { stop: started.stop, dir }),
        };
        match target.load(args).await {
            Ok(()) => Ok(target),
            Err(e) => {
                // Stop the server before its data dir goes.
                let _ = target.close().await;
                Err(e)
            }
        }
    }

    /// Learn the own server's columns and load its rows.
    async fn load(&mut self, args: &BenchArgs) -> anyhow::Result<()> {
        let http = Http::new(&self.base, &self.key);
        let ids: Vec<u64> = (1..=args.sheets).collect();
        self.sheets = columns_of(&http, &ids).await?;
        let started = std::time::Instant::now();
        let loads = self.sheets.iter().map(|s| load_rows(&self.base, &self.key, s, args.rows));
        for r in futures_util::future::join_all(loads).await {
            r.context("loading the generated rows")?;
        }
        self.loaded = Some(LoadFigures {
            rows: args.rows * args.sheets,
            seconds: started.elapsed().as_secs_f64(),
        });
        Ok(())
    }

    /// Whether this is the own server.
    pub fn is_own(&self) -> bool {
        self.own.is_some()
    }

    /// The own server's data dir.
    pub fn data_dir(&self) -> Option<PathBuf> {
        self.own.as_ref().map(|o| o.dir.path().join("data"))
    }

    /// A client of the public API with the run's key.
    pub fn client(&self) -> Http {
        Http::new(&self.base, &self.key)
    }

    /// The key's rate-limit window, from `GET /me`.
    ///
    /// # Errors
    ///
    /// `/me` did not answer.
    pub async fn rate_limit(&self) -> anyhow::Result<RateLimit> {
        Ok(self.client().get_json::<Me>("/me").await?.rate_limit)
    }

    /// The log's counters from the admin metrics; `None` without an admin API or when it does
    /// not answer (the figures are then left out, the run goes on).
    pub async fn flush_counters(&self) -> Option<FlushCounters> {
        scrape(self.admin.as_ref()?).await
    }

    /// Stop the own server and remove its data dir; nothing for a running server.
    ///
    /// # Errors
    ///
    /// The own server did not stop cleanly.
    pub async fn close(mut self) -> anyhow::Result<()> {
        if let Some(own) = self.own.take() {
            own.stop.await?;
            own.dir.close().context("removing the temporary data dir")?;
        }
        Ok(())
    }
}

/// The log's counters from the admin API at `(url, token)`; `None` when it does not answer.
pub async fn scrape((url, token): &(String, String)) -> Option<FlushCounters> {
    let answer = Http::new(url, token).control(Method::GET, "/metrics", None).await.ok()?;
    FlushCounters::parse(std::str::from_utf8(&answer.body).ok()?)
}

/// The first `n` sheets the key can read.
async fn first_sheets(http: &Http, n: u64) -> anyhow::Result<Vec<u64>> {
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    while (ids.len() as u64) < n {
        let path = match &cursor {
            Some(c) => format!("/sheets?limit=500&cursor={c}"),
            None => "/sheets?limit=500".to_owned(),
        };
        let page: SheetList = http.get_json(&path).await?;
        ids.extend(page.data.iter().map(|s| s.id));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    ids.truncate(n as usize);
    if ids.is_empty() {
        bail!("the key can read no sheet on {}", http.base());
    }
    Ok(ids)
}

/// Each sheet with its columns.
async fn columns_of(http: &Http, ids: &[u64]) -> anyhow::Result<Vec<SheetInfo>> {
    let mut sheets = Vec::with_capacity(ids.len());
    for &id in ids {
        let list: ColumnList = http
            .get_json(&format!("/sheets/{id}/columns"))
            .await
            .with_context(|| format!("reading the columns of sheet {id}"))?;
        let columns = list
            .data
            .into_iter()
            .map(|c| ColumnInfo { id: c.id, ty: c.ty, options: c.options.unwrap_or_default() })
            .collect();
        sheets.push(SheetInfo { id, columns });
    }
    Ok(sheets)
}

/// Add `rows` generated rows to a sheet, 2000 per `bulkAdd`.
async fn load_rows(base: &str, key: &str, sheet: &SheetInfo, rows: u64) -> anyhow::Result<()> {
    use rand::SeedableRng;
    let http = Http::new(base, key);
    let mut rng = rand::rngs::StdRng::seed_from_u64(sheet.id);
    let mut done = 0;
    while done < rows {
        let n = (rows - done).min(2000);
        let batch: Vec<_> = (done..done + n)
            .map(|i| json!({"cells": data::row_cells(&sheet.columns, i, &mut rng)}))
            .collect();
        let answer = http
            .control(
                Method::POST,
                &format!("/sheets/{}/rows:bulkAdd", sheet.id),
                Some(&json!({ "rows": batch })),
            )
            .await?;
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Counts {
            succeeded_count: u64,
        }
        let counts: Counts = answer.parse()?;
        if counts.succeeded_count != n {
            bail!(
                "loading sheet {}: {} of {n} rows were refused",
                sheet.id,
                n - counts.succeeded_count
            );
        }
        done += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_counters_come_from_the_prometheus_text() {
        let text = "# HELP sheetd_wal_flushes_total Group commits.\n\
                    sheetd_wal_flush_duration_seconds_bucket{le=\"0.001\"} 3\n\
                    sheetd_wal_flush_duration_seconds_sum 0.5\n\
                    sheetd_wal_flush_duration_seconds_count 10\n\
                    sheetd_wal_flushes_total 10\n\
                    sheetd_wal_records_flushed_total 250\n";
        let before = FlushCounters::default();
        let after = FlushCounters::parse(text).unwrap();
        let f = FlushFigures::between(before, after);
        assert_eq!((f.flushes, f.records_flushed), (10, 250));
        assert!((f.records_per_flush - 25.0).abs() < 1e-9);
        assert!((f.flush_mean_ms - 50.0).abs() < 1e-9);
        assert_eq!(FlushCounters::parse("nothing 1\n"), None);
    }
}
