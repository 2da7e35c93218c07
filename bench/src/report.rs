//! The run's figures: the [`Report`] written by `--json` (its schema is in the
//! [`crate`] docs), and the table printed for a person.

use std::fmt::Write;

use serde::Serialize;

use super::driver::LevelResult;
use super::stats::Latency;
use super::target::{FlushFigures, LoadFigures, RateLimit};
use super::verify::Verification;

/// Everything a run measured.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Schema version of this document.
    pub version: u32,
    /// The server.
    pub target: TargetView,
    /// What the requests did.
    pub workload: WorkloadView,
    /// How the load was made.
    pub load: LoadView,
    /// The key's rate-limit window before the run.
    pub rate_limit: Option<RateLimit>,
    /// Said before the run (a planned load above the rate limit, say).
    pub warnings: Vec<String>,
    /// One per concurrency level.
    pub levels: Vec<LevelView>,
    /// The read-back, with `--verify`.
    pub verify: Option<Verification>,
    /// No 5xx, no transport error, and the read-back (if any) found nothing wrong.
    pub passed: bool,
}

/// The server under load.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetView {
    /// `own` (in-process, generated data) or `url`.
    pub mode: &'static str,
    /// The API's base URL.
    pub url: String,
    /// Sheet ids the load spread over.
    pub sheets: Vec<u64>,
    /// Generated rows per sheet (own server).
    pub rows_per_sheet: Option<u64>,
    /// Generated columns per sheet (own server).
    pub columns: Option<u64>,
    /// How the generated rows were loaded (own server).
    pub loaded: Option<LoadFigures>,
}

/// What the requests did.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadView {
    /// `--workload`.
    pub name: &'static str,
    /// The request kinds and their weights.
    pub mix: Vec<MixEntry>,
    /// `--page-size`.
    pub page_size: u64,
    /// `--bulk-size`.
    pub bulk_size: u64,
    /// `--conflict-rate`.
    pub conflict_rate: f64,
    /// `--rows-per-client`.
    pub rows_per_client: u64,
}

/// One kind of a mix.
#[derive(Clone, Debug, Serialize)]
pub struct MixEntry {
    /// Request kind.
    pub op: &'static str,
    /// Its relative weight in the mix (`--mix kind=weight`).
    pub weight: u32,
}

/// How the load was made.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadView {
    /// `closed` or `open`.
    #[serde(rename = "loop")]
    pub kind: &'static str,
    /// Open loop: requests per second in total.
    pub rate: Option<f64>,
    /// Measured seconds per level (duration budget).
    pub duration_seconds: Option<f64>,
    /// Measured requests per level (requests budget).
    pub requests: Option<u64>,
    /// Uncounted seconds before each level.
    pub warmup_seconds: f64,
    /// Threads the clients ran on (`--client-threads`; default the cores, half with own server).
    pub client_threads: usize,
}

/// One concurrency level.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LevelView {
    /// Virtual users.
    pub concurrency: usize,
    /// From the end of the warm-up to the last answer.
    pub elapsed_seconds: f64,
    /// Measured requests (every answer and transport error).
    pub requests: u64,
    /// Of those, 2xx.
    pub ok_requests: u64,
    /// `requests` over `elapsedSeconds`.
    pub requests_per_second: f64,
    /// Rows read (pages, report rows).
    pub rows_read: u64,
    /// Rows written and acknowledged (added, patched, updated, deleted).
    pub rows_written: u64,
    /// Rows read and written per second.
    pub rows_per_second: f64,
    /// Latency of every measured request, milliseconds.
    pub latency_ms: Latency,
    /// Errors by status and code; `bulkItem` marks failed items of a 200 bulk answer.
    pub errors: Vec<ErrorView>,
    /// Requests that got an error (items not counted).
    pub error_requests: u64,
    /// 5xx and transport errors (they fail the run).
    pub fatal_errors: u64,
    /// Deliberately stale patches that got their `version_conflict` (not errors).
    pub expected_conflicts: u64,
    /// Untimed `bulkAdd`s that refilled the clients' own rows during the level.
    pub refills: u64,
    /// Per request kind.
    pub ops: Vec<OpView>,
    /// The server's log during the level (own server, or with `--admin-url`).
    pub server: Option<FlushFigures>,
}

/// Errors of one kind.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorView {
    /// HTTP status (0: transport error).
    pub status: u16,
    /// `errorCode` (or `timeout`, `connect_failed`, `body_broken`, `transport_error`, and the
    /// client's own `stale_version_accepted`, `unreadable_answer`, `no_error_envelope`).
    pub error_code: String,
    /// A failed item inside a 200 bulk answer.
    pub bulk_item: bool,
    /// How many.
    pub count: u64,
}

/// One request kind of a level.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OpView {
    /// Request kind.
    pub op: &'static str,
    /// Measured requests.
    pub requests: u64,
    /// Their latency, milliseconds.
    pub latency_ms: Latency,
}

impl LevelView {
    /// The figures of a level.
    pub fn of(r: &LevelResult) -> Self {
        let s = &r.stats;
        let secs = r.elapsed.as_secs_f64().max(1e-9);
        LevelView {
            concurrency: r.plan.concurrency,
            elapsed_seconds: r.elapsed.as_secs_f64(),
            requests: s.requests,
            ok_requests: s.ok,
            requests_per_second: s.requests as f64 / secs,
            rows_read: s.rows_read,
            rows_written: s.rows_written,
            rows_per_second: (s.rows_read + s.rows_written) as f64 / secs,
            latency_ms: Latency::of(&s.latency),
            errors: s
                .errors
                .iter()
                .map(|(k, n)| ErrorView {
                    status: k.status,
                    error_code: k.code.clone(),
                    bulk_item: k.bulk_item,
                    count: *n,
                })
                .collect(),
            error_requests: s.errors.iter().filter(|(k, _)| !k.bulk_item).map(|(_, n)| n).sum(),
            fatal_errors: s.fatal_errors(),
            expected_conflicts: s.expected_conflicts,
            refills: r.refills,
            ops: s
                .ops
                .iter()
                .map(|(op, o)| OpView {
                    op: op.name(),
                    requests: o.latency.len(),
                    latency_ms: Latency::of(&o.latency),
                })
                .collect(),
            server: r.flush.clone(),
        }
    }
}

impl Report {
    /// The table for a person.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let t = &self.target;
        let place = match (t.mode, t.rows_per_sheet) {
            ("own", Some(rows)) => format!("own server, {rows} rows per sheet"),
            _ => t.url.clone(),
        };
        let budget = match (self.load.duration_seconds, self.load.requests) {
            (_, Some(n)) => format!("{n} requests"),
            (Some(d), None) => format!("{d} s"),
            _ => String::new(),
        };
        let lp = match self.load.rate {
            Some(r) => format!("open loop at {r} req/s"),
            None => "closed loop".to_owned(),
        };
        let mix: Vec<String> =
            self.workload.mix.iter().map(|m| format!("{}={}", m.op, m.weight)).collect();
        let _ = writeln!(
            out,
            "{} ({}), {lp}, {} sheet(s) ({place}), {budget} per level after {} s warm-up",
            self.workload.name,
            mix.join(","),
            t.sheets.len(),
            self.load.warmup_seconds
        );
        let _ = writeln!(
            out,
            "{:>5} {:>9} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>9} {:>9} {:>8}",
            "conc",
            "req/s",
            "rows/s",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "p99.9",
            "max ms",
            "errors",
            "conflicts",
            "rec/flush",
            "flush ms"
        );
        for l in &self.levels {
            let (per_flush, flush_ms) = match &l.server {
                // A level without writes has no group commits to describe.
                Some(f) if f.flushes > 0 => {
                    (format!("{:.1}", f.records_per_flush), format!("{:.2}", f.flush_mean_ms))
                }
                _ => ("-".to_owned(), "-".to_owned()),
            };
            let ms = &l.latency_ms;
            let _ = writeln!(
                out,
                "{:>5} {:>9.0} {:>10.0} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>7} {:>9} {:>9} {:>8}",
                l.concurrency,
                l.requests_per_second,
                l.rows_per_second,
                ms.p50,
                ms.p90,
                ms.p99,
                ms.p999,
                ms.max,
                l.error_requests,
                l.expected_conflicts,
                per_flush,
                flush_ms
            );
        }
        for l in &self.levels {
            if self.workload.mix.len() > 1 {
                for o in &l.ops {
                    let _ =
                        writeln!(
                        out,
                        "  c={} {:<12} {:>8} requests  p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
                        l.concurrency, o.op, o.requests, o.latency_ms.p50, o.latency_ms.p99,
                        o.latency_ms.max
                    );
                }
            }
            if !l.errors.is_empty() {
                let errs: Vec<String> = l
                    .errors
                    .iter()
                    .map(|e| {
                        let status =
                            if e.status == 0 { "transport".into() } else { e.status.to_string() };
                        let item = if e.bulk_item { " (bulk item)" } else { "" };
                        format!("{} x {status} {}{item}", e.count, e.error_code)
                    })
                    .collect();
                let _ = writeln!(out, "  c={} errors: {}", l.concurrency, errs.join("; "));
            }
        }
        if let Some(v) = &self.verify {
            let verdict = if v.passed() { "ok" } else { "FAILED" };
            let _ = writeln!(
                out,
                "verify: {verdict}: {} acknowledged rows checked ({} deletes) in {} page reads; \
                 {} lost, {} wrong, {} not deleted, {} unverifiable (write without an answer)",
                v.checked,
                v.deletes_checked,
                v.requests,
                v.lost,
                v.wrong,
                v.not_deleted,
                v.uncertain
            );
            for f in v.findings.iter().take(20) {
                let _ = writeln!(
                    out,
                    "  {} row {} of sheet {}: expected version {:?}, found {:?}",
                    f.problem, f.row_id, f.sheet_id, f.expected_version, f.found_version
                );
            }
        }
        out
    }
}
