//! The run's figures: the [`Report`] written by `--json` (its schema is in the
//! [`crate`] docs), and the table printed for a person. A level run several times
//! (`--repeat`) is one [`LevelView`]: its figures over every run, each run's own throughput
//! and percentiles, and their spread.

use std::fmt::Write;

use serde::Serialize;

use hdrhistogram::Histogram;

use super::driver::LevelResult;
use super::stats::{Latency, Second, Stats};
use super::target::{FlushCounters, FlushFigures, LoadFigures, RateLimit};
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
    /// Where the load generator ran.
    pub machine: Machine,
    /// What was built.
    pub build: Build,
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
    /// Runs of each level (`--repeat`).
    pub repeat: u32,
}

/// The machine the load generator (and the own server) ran on.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Machine {
    /// `linux`, `macos`, ...
    pub os: String,
    /// `x86_64`, `aarch64`, ...
    pub arch: String,
    /// Cores the process may use.
    pub cores: usize,
    /// The CPU's model name, where the system says it (`/proc/cpuinfo`).
    pub cpu: Option<String>,
    /// Total memory in bytes, where the system says it (`/proc/meminfo`).
    pub memory_bytes: Option<u64>,
    /// The load average over the last minute when the run ended (`/proc/loadavg`): a shared
    /// machine's figures are not comparable with an idle one's.
    pub load_average: Option<f64>,
}

impl Machine {
    /// This machine, now.
    pub fn here() -> Self {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let cpu = read("/proc/cpuinfo").and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        });
        let memory_bytes = read("/proc/meminfo").and_then(|t| {
            let line = t.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        });
        let load_average = read("/proc/loadavg")
            .and_then(|t| t.split_whitespace().next().and_then(|v| v.parse().ok()));
        Machine {
            os: std::env::consts::OS.to_owned(),
            arch: std::env::consts::ARCH.to_owned(),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu,
            memory_bytes,
            load_average,
        }
    }
}

/// The build that made the figures.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Build {
    /// The load generator's crate version (the server is built with it, in one binary).
    pub version: &'static str,
    /// `release` or `debug`: a debug build's figures say little about the server.
    pub profile: &'static str,
}

impl Build {
    /// This build.
    pub fn this() -> Self {
        Build {
            version: env!("CARGO_PKG_VERSION"),
            profile: if cfg!(debug_assertions) { "debug" } else { "release" },
        }
    }
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
    /// Each run of the level (one without `--repeat`).
    pub repeats: Vec<RepeatView>,
    /// How far the runs spread (`--repeat` 2 or more).
    pub spread: Option<Spread>,
    /// Per second of the measurement (the runs of a repeated level one after the other).
    pub timeline: Vec<SecondView>,
    /// The latency distribution: the latency at each percentile, HDR style.
    pub latency_curve: Vec<CurvePoint>,
    /// The server's log per second, when its admin API answered.
    pub server_timeline: Option<Vec<ServerSecond>>,
}

/// One run of a level.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RepeatView {
    /// Measured requests over the run's measured time.
    pub requests_per_second: f64,
    /// The run's latency, milliseconds.
    pub latency_ms: Latency,
}

/// How far the runs of a level spread: (largest - smallest) / median of each figure.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Spread {
    /// Of the runs' requests per second.
    pub requests_per_second: f64,
    /// Of the runs' median latency.
    pub p50: f64,
    /// Of the runs' 90th percentile.
    pub p90: f64,
    /// Of the runs' 99th percentile.
    pub p99: f64,
    /// Of the runs' 99.9th percentile.
    pub p999: f64,
    /// Of the runs' largest latency.
    pub max: f64,
}

/// (largest - smallest) / median of `values`; 0 for fewer than two.
pub fn relative_spread(values: &[f64]) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let m = median_sorted(&v);
    if m > 0.0 {
        (v[v.len() - 1] - v[0]) / m
    } else {
        0.0
    }
}

/// The median of sorted values (the mean of the middle two for an even count).
pub fn median_sorted(v: &[f64]) -> f64 {
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// One second of a level.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SecondView {
    /// Seconds since the level's measurement started (its first run's).
    pub second: f64,
    /// Which run of the level (0 without `--repeat`).
    pub repeat: u32,
    /// Answers in this second, per second (the run's last second is partial).
    pub requests_per_second: f64,
    /// Error answers and transport errors in this second, per second.
    pub errors_per_second: f64,
    /// Latency of the answers of this second, milliseconds; `null` in a second without any.
    pub p50: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Largest.
    pub max: Option<f64>,
}

/// A point of the latency curve.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CurvePoint {
    /// Percentile, 0 to 100.
    pub percentile: f64,
    /// Latency at or below which that share of the requests answered, milliseconds.
    pub ms: f64,
}

/// The server's log during one second (between two scrapes of its metrics).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerSecond {
    /// Seconds since the level's measurement started, at the end of this interval.
    pub second: f64,
    /// Group commits per second.
    pub flushes_per_second: f64,
    /// Records made durable per second.
    pub records_per_second: f64,
    /// Records per group commit.
    pub records_per_flush: f64,
    /// Mean time of a group commit, milliseconds.
    pub flush_mean_ms: f64,
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
    /// The figures of a level run once.
    pub fn of(r: &LevelResult) -> Self {
        Self::of_runs(std::slice::from_ref(r))
    }

    /// The figures of a level run `runs.len()` times (`--repeat`): counts and percentiles
    /// over every run, each run's own figures, and their spread.
    ///
    /// # Panics
    ///
    /// `runs` is empty.
    pub fn of_runs(runs: &[LevelResult]) -> Self {
        let first = runs.first().expect("a level ran");
        let mut s = Stats::default();
        let mut elapsed = 0.0;
        let mut timeline = Vec::new();
        let mut server_timeline = Some(Vec::new());
        for (i, r) in runs.iter().enumerate() {
            s.merge(&r.stats);
            let secs = r.elapsed.as_secs_f64();
            // Runs follow one another on the time axis, each starting on a whole second.
            let offset = elapsed;
            elapsed += secs;
            timeline.extend(seconds_of(&r.stats, secs, offset, i as u32));
            match (&mut server_timeline, r.server_samples.len() >= 2) {
                (Some(t), true) => t.extend(server_seconds(&r.server_samples, offset)),
                _ => server_timeline = None,
            }
            elapsed = elapsed.ceil();
        }
        let elapsed = runs.iter().map(|r| r.elapsed.as_secs_f64()).sum::<f64>();
        let secs = elapsed.max(1e-9);
        let repeats: Vec<RepeatView> = runs
            .iter()
            .map(|r| RepeatView {
                requests_per_second: r.stats.requests as f64 / r.elapsed.as_secs_f64().max(1e-9),
                latency_ms: Latency::of(&r.stats.latency),
            })
            .collect();
        let spread = (repeats.len() >= 2).then(|| {
            let of = |f: fn(&RepeatView) -> f64| {
                relative_spread(&repeats.iter().map(f).collect::<Vec<_>>())
            };
            Spread {
                requests_per_second: of(|r| r.requests_per_second),
                p50: of(|r| r.latency_ms.p50),
                p90: of(|r| r.latency_ms.p90),
                p99: of(|r| r.latency_ms.p99),
                p999: of(|r| r.latency_ms.p999),
                max: of(|r| r.latency_ms.max),
            }
        });
        let flush = runs.iter().map(|r| r.flush.clone()).collect::<Option<Vec<_>>>();
        LevelView {
            concurrency: first.plan.concurrency,
            elapsed_seconds: elapsed,
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
            refills: runs.iter().map(|r| r.refills).sum(),
            ops: s
                .ops
                .iter()
                .map(|(op, o)| OpView {
                    op: op.name(),
                    requests: o.latency.len(),
                    latency_ms: Latency::of(&o.latency),
                })
                .collect(),
            server: flush.map(|f| FlushFigures::sum(&f)),
            repeats,
            spread,
            timeline,
            latency_curve: curve(&s.latency),
            server_timeline,
        }
    }
}

/// A run's seconds, placed `offset` seconds after the level's start.
fn seconds_of(s: &Stats, elapsed: f64, offset: f64, repeat: u32) -> Vec<SecondView> {
    let mut seconds: Vec<(f64, Second)> = s
        .timeline
        .iter()
        .enumerate()
        .map(|(i, sec)| ((elapsed - i as f64).clamp(0.0, 1.0), sec.clone()))
        .collect();
    // A closed loop's last answers come just after the end, a few in a sliver of a second: as
    // a second of their own they would read as a plunge (or a spike), so they join the one
    // before.
    if seconds.len() >= 2 && seconds[seconds.len() - 1].0 < 0.5 {
        let (width, last) = seconds.pop().expect("two or more");
        let before = seconds.last_mut().expect("one or more");
        before.0 += width;
        before.1.requests += last.requests;
        before.1.errors += last.errors;
        before.1.latencies.extend_from_slice(&last.latencies);
    }
    seconds
        .iter_mut()
        .enumerate()
        .map(|(i, (width, sec))| {
            let width = width.max(0.05);
            sec.latencies.sort_unstable();
            let ms = |q: f64| Second::quantile(&sec.latencies, q).map(|us| f64::from(us) / 1000.0);
            SecondView {
                second: offset + i as f64,
                repeat,
                requests_per_second: sec.requests as f64 / width,
                errors_per_second: sec.errors as f64 / width,
                p50: ms(0.5),
                p99: ms(0.99),
                max: ms(1.0),
            }
        })
        .collect()
}

/// The differences between consecutive scrapes of the log's counters.
fn server_seconds(samples: &[(f64, FlushCounters)], offset: f64) -> Vec<ServerSecond> {
    samples
        .windows(2)
        .filter(|w| w[1].0 - w[0].0 > 0.05)
        .map(|w| {
            let (t0, a) = w[0];
            let (t1, b) = w[1];
            let f = FlushFigures::between(a, b);
            let dt = t1 - t0;
            ServerSecond {
                second: offset + t1,
                flushes_per_second: f.flushes as f64 / dt,
                records_per_second: f.records_flushed as f64 / dt,
                records_per_flush: f.records_per_flush,
                flush_mean_ms: f.flush_mean_ms,
            }
        })
        .collect()
}

/// The latency at each percentile, HDR style: points closer together toward the tail, up to
/// the largest latency.
fn curve(h: &Histogram<u64>) -> Vec<CurvePoint> {
    if h.is_empty() {
        return Vec::new();
    }
    let mut out: Vec<CurvePoint> = h
        .iter_quantiles(4)
        .map(|v| CurvePoint {
            percentile: v.quantile_iterated_to() * 100.0,
            ms: h.highest_equivalent(v.value_iterated_to()) as f64 / 1000.0,
        })
        .filter(|p| p.percentile < 100.0)
        .collect();
    out.dedup_by(|b, a| (b.percentile - a.percentile).abs() < 1e-9);
    out.push(CurvePoint { percentile: 100.0, ms: h.max() as f64 / 1000.0 });
    out
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::driver::{Budget, LevelPlan};
    use crate::workload::{Outcome, Workload};

    /// A run of `per_second` answers of `ms` each second for `secs` seconds, plus one answer
    /// just after the end.
    fn run(secs: u64, per_second: u64, ms: u64) -> LevelResult {
        let mut stats = Stats::default();
        let ok = Outcome { status: 200, ..Outcome::default() };
        for s in 0..secs {
            for k in 0..per_second {
                let at = Duration::from_secs(s) + Duration::from_millis(k * 1000 / per_second);
                stats.record(Workload::Patch, Duration::from_millis(ms), &ok, at);
            }
        }
        let end = Duration::from_secs(secs) + Duration::from_millis(10);
        stats.record(Workload::Patch, Duration::from_millis(ms), &ok, end);
        let counters = |t: f64| FlushCounters {
            flushes: t * 10.0,
            records: t * 30.0,
            seconds: t * 0.01,
            timed: t * 10.0,
        };
        LevelResult {
            plan: LevelPlan {
                concurrency: 4,
                budget: Budget::Duration(Duration::from_secs(secs)),
                warmup: Duration::ZERO,
                rate: None,
            },
            elapsed: end,
            stats,
            flush: Some(FlushFigures::between(counters(0.0), counters(secs as f64))),
            refills: 0,
            server_samples: (0..=secs).map(|t| (t as f64, counters(t as f64))).collect(),
        }
    }

    #[test]
    fn repeated_runs_keep_each_runs_figures_their_spread_and_follow_on_the_time_axis() {
        let l = LevelView::of_runs(&[run(2, 100, 2), run(2, 50, 4)]);
        assert_eq!(l.requests, 201 + 101);
        assert_eq!(l.repeats.len(), 2);
        let (a, b) = (l.repeats[0].requests_per_second, l.repeats[1].requests_per_second);
        let spread = l.spread.as_ref().unwrap().requests_per_second;
        assert!((spread - (a - b) / ((a + b) / 2.0)).abs() < 1e-9, "{spread} {a} {b}");
        // Each run's stray last answer joined its last second; the second run starts on the
        // whole second after the first ends.
        let at: Vec<(f64, u32)> = l.timeline.iter().map(|s| (s.second, s.repeat)).collect();
        assert_eq!(at, [(0.0, 0), (1.0, 0), (3.0, 1), (4.0, 1)]);
        assert!((l.timeline[1].requests_per_second - 101.0 / 1.01).abs() < 1e-6);
        assert_eq!((l.timeline[0].p50, l.timeline[3].max), (Some(2.0), Some(4.0)));
        let server = l.server_timeline.as_ref().unwrap();
        assert_eq!(server.len(), 4);
        assert!(server.iter().all(|s| (s.records_per_flush - 3.0).abs() < 1e-9), "{server:?}");
        assert_eq!(l.server.as_ref().unwrap().flushes, 40);
        let last = l.latency_curve.last().unwrap();
        // HDR's largest value is exact to its 3 significant digits.
        assert!(last.percentile == 100.0 && (last.ms - 4.0).abs() < 0.01, "{last:?}");
        assert!(l.latency_curve.windows(2).all(|w| w[0].ms <= w[1].ms));
    }

    #[test]
    fn one_run_has_no_spread() {
        let l = LevelView::of(&run(1, 10, 1));
        assert!(l.spread.is_none());
        assert_eq!(l.repeats.len(), 1);
    }
}
