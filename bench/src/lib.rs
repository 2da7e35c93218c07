//! `sheetd bench`: the load tester, shipped in the `sheetd` binary with the server it tests.
//!
//! It is a crate of its own, owning its flags and figures, and it knows the server only from the
//! outside: the public and admin HTTP APIs, and the `sheetd serve` flags of the own server it
//! runs on. Starting that server is left to the caller (the binary, a test) through a
//! [`StartServer`] function, so the load generator and the server library do not depend on
//! each other and either can change inside without the other.
//!
//! It drives the public API the way callers do (over HTTP, with a key, through the rate limiter)
//! and reports per concurrency level: throughput, HDR latency percentiles, errors by code and
//! status, and the server log's group commits, also per second; `--html` draws them, and
//! `bench compare` tells two runs apart beyond their own noise. Two things set it apart from a generic HTTP load
//! generator:
//!
//! - **Latency without coordinated omission.** With `--rate` the load is open-loop: requests
//!   go out on a fixed schedule and each one's latency counts from when it was due, so a server
//!   stall shows in every request that waited for it (see [`driver`]).
//! - **Every acknowledged write is checked.** Clients write only rows they created, track the
//!   version and cells each 2xx acknowledged, and `--verify` reads every sheet back afterwards
//!   and reports any lost or wrong write (see [`mod@verify`]).
//!
//! # Layout
//!
//! - [`args`]: the flags ([`BenchArgs`]).
//! - [`target`]: the own in-process server on generated data, or a running one; `/me`, metrics.
//! - [`data`]: the generated workspace (a fixture) and cell values.
//! - [`workload`]: request kinds, `--mix`, and the virtual user that sends them.
//! - [`driver`]: levels, warm-up, closed and open loop, client threads, progress line.
//! - [`stats`]: HDR histograms and counters per user, merged per level.
//! - [`report`]: the JSON document and the table; a level's runs (`--repeat`) and spread.
//! - [`html`]: `--html`, the run as one self-contained page of charts.
//! - [`compare`]: `bench compare`, two runs' JSON side by side, a change only beyond their
//!   spread.
//! - [`mod@verify`]: the ledger of acknowledged writes and the read-back.
//! - [`client`]: the `awc` client of each user and the control calls.
//!
//! As a library: [`Target::open`] (given the [`StartServer`] of the own server), then [`run`]
//! (the load, giving a [`Report`] and the [`Ledger`] of acknowledged writes), then
//! [`verify::verify`] against the ledger, then [`Target::close`]. [`execute`] does all of it as
//! the command does.
//!
//! # What the figures mean
//!
//! - `req/s`: measured requests (every answer, errors included) over the level's measured time
//!   (from the end of the warm-up to the last answer).
//! - `rows/s`: rows read (list pages, the sheet's first page, report rows) plus rows written
//!   and acknowledged (added, patched, updated, deleted), per second.
//! - `p50` ... `max`: latency of every measured request, errors included, in milliseconds, from
//!   an HDR histogram (3 significant digits). Closed loop: the round trip. Open loop: from when
//!   the request was due.
//! - `errors`: requests with an error answer or a transport error; the JSON has them by status
//!   and `errorCode`, and also counts failed items inside 200 bulk answers (`bulkItem`).
//! - `conflicts`: deliberately stale patches (`--conflict-rate`) that got their 409; expected,
//!   so not errors. A stale patch that succeeds is an error (`stale_version_accepted`).
//! - `rec/flush`, `flush ms`: log records made durable per group commit and the mean time of a
//!   group commit during the level, from `/admin/v1/metrics` before and after it (own server
//!   always; a running one with `--admin-url` and `--admin-token`).
//! - `spread` (`--repeat N`): per figure, (largest - smallest) / median over the level's runs.
//!
//! With `--repeat N` a level runs N times in a row; its counts and percentiles are over all
//! runs, `repeats` has each run's throughput and percentiles, and `timeline` places the runs one
//! after the other (each starting on a whole second).
//!
//! The run fails (exit 1) on any 5xx or transport error, and on any finding of `--verify`.
//! 429s are counted, not fatal; before the run a load planned above the key's rate limit
//! (from `GET /me`) is reported on stderr with the numbers.
//!
//! # The JSON document (`--json FILE`)
//!
//! ```text
//! {
//!   "version": 1,
//!   "target":   {"mode": "own"|"url", "url": str, "sheets": [id],
//!                "rowsPerSheet": int|null, "columns": int|null,
//!                "loaded": {"rows": int, "seconds": float}|null},
//!   "workload": {"name": str, "mix": [{"op": str, "weight": int}], "pageSize": int,
//!                "bulkSize": int, "conflictRate": float, "rowsPerClient": int},
//!   "load":     {"loop": "closed"|"open", "rate": float|null, "durationSeconds": float|null,
//!                "requests": int|null, "warmupSeconds": float, "clientThreads": int,
//!                "repeat": int},
//!   "machine":  {"os": str, "arch": str, "cores": int, "cpu": str|null,
//!                "memoryBytes": int|null, "loadAverage": float|null},
//!   "build":    {"version": str, "profile": "release"|"debug"},
//!   "rateLimit": {"limit": int, "remaining": int, "reset": int}|null,
//!   "warnings": [str],
//!   "levels": [{
//!     "concurrency": int, "elapsedSeconds": float,
//!     "requests": int, "okRequests": int, "requestsPerSecond": float,
//!     "rowsRead": int, "rowsWritten": int, "rowsPerSecond": float,
//!     "latencyMs": {"p50", "p90", "p99", "p999", "max", "min", "mean": float},
//!     "errors": [{"status": int, "errorCode": str, "bulkItem": bool, "count": int}],
//!     "errorRequests": int, "fatalErrors": int, "expectedConflicts": int, "refills": int,
//!     "ops": [{"op": str, "requests": int, "latencyMs": {...}}],
//!     "server": {"flushes": int, "recordsFlushed": int, "recordsPerFlush": float,
//!                "flushMeanMs": float}|null,
//!     "repeats": [{"requestsPerSecond": float, "latencyMs": {...}}],
//!     "spread": {"requestsPerSecond", "p50", "p90", "p99", "p999", "max": float}|null,
//!     "timeline": [{"second": float, "repeat": int, "requestsPerSecond": float,
//!                   "errorsPerSecond": float, "p50": float|null, "p99": float|null,
//!                   "max": float|null}],
//!     "latencyCurve": [{"percentile": float, "ms": float}],
//!     "serverTimeline": [{"second": float, "flushesPerSecond": float,
//!                         "recordsPerSecond": float, "recordsPerFlush": float,
//!                         "flushMeanMs": float}]|null
//!   }],
//!   "verify": {"checked": int, "deletesChecked": int, "uncertain": int, "requests": int,
//!              "lost": int, "wrong": int, "notDeleted": int,
//!              "findings": [{"sheetId", "rowId", "problem": "lost"|"wrong"|"not_deleted",
//!                            "expectedVersion", "foundVersion", "expectedCells"?,
//!                            "foundCells"?}]}|null,
//!   "passed": bool
//! }
//! ```
//!
//! Status 0 in `errors` is a transport error; its `errorCode` is then `timeout`,
//! `connect_failed`, `body_broken` or `transport_error`.

pub mod args;
pub mod client;
pub mod compare;
pub mod data;
pub mod driver;
pub mod html;
pub mod report;
pub mod stats;
pub mod target;
pub mod verify;
pub mod workload;

use std::process::ExitCode;

use anyhow::{bail, Context};

pub use args::{BenchArgs, BenchCommand, CompareArgs};
pub use report::Report;
pub use target::{StartServer, Started, Target};
pub use verify::{Ledger, Verification};
pub use workload::{Mix, Workload};

use driver::{Budget, Driver, LevelPlan};
use report::{Build, LevelView, LoadView, Machine, MixEntry, TargetView, WorkloadView};
use target::RateLimit;
use workload::Settings;

/// What a run gives back: the figures, and the acknowledged writes for [`verify::verify`].
#[derive(Debug)]
pub struct Run {
    /// The figures (without `verify`).
    pub report: Report,
    /// Every acknowledged write of the run.
    pub ledger: Ledger,
}

/// The request kinds the flags ask for.
fn mix_of(args: &BenchArgs) -> anyhow::Result<Mix> {
    Ok(match (&args.mix, args.workload) {
        (Some(mix), Workload::Mixed | Workload::ReadPage) => mix.clone(),
        (Some(_), w) => bail!("--mix goes with --workload mixed, not --workload {}", w.name()),
        (None, Workload::Mixed) => Mix::default_mixed(),
        (None, w) => Mix::single(w),
    })
}

/// Client threads: the cores, or half of them when the server shares the machine in-process.
fn client_threads(args: &BenchArgs, own: bool) -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    match args.client_threads {
        Some(n) => n as usize,
        None if own => (cores / 2).max(1),
        None => cores,
    }
}

/// What to say before a run whose planned load is above the key's rate limit.
pub fn rate_limit_warnings(args: &BenchArgs, rl: &RateLimit) -> Vec<String> {
    let levels = args.concurrency.len() as u64;
    let mut out = Vec::new();
    if let Some(rate) = args.rate {
        let per_minute = rate * 60.0;
        if per_minute > rl.limit as f64 {
            out.push(format!(
                "the planned open-loop load of {rate} req/s is {per_minute:.0} requests per \
                 minute, above the key's rate limit of {} per minute ({} left in the current \
                 window): expect 429 rate_limit_exceeded; --rate {:.1} stays under it",
                rl.limit,
                rl.remaining,
                rl.limit as f64 / 60.0
            ));
        }
    } else if let Some(n) = args.requests {
        if n * levels > rl.remaining {
            out.push(format!(
                "the run sends at least {} requests ({n} per level x {levels} level(s), plus \
                 warm-up and setup) as fast as the server answers, and the key has {} of its {} \
                 per minute left: closed-loop load will exceed its rate limit; expect 429 \
                 rate_limit_exceeded (--rate {:.1} stays under it)",
                n * levels,
                rl.remaining,
                rl.limit,
                rl.limit as f64 / 60.0
            ));
        }
    } else {
        let c = args.concurrency.iter().copied().max().unwrap_or(1);
        let least = c as f64 * 60.0 / rl.limit.max(1) as f64;
        // Below a millisecond a request cannot take: such a limit is out of reach.
        if least > 0.001 {
            out.push(format!(
                "closed-loop load at concurrency {c} stays under the key's rate limit of {} per \
                 minute ({} left now) only if each request takes {least:.3} s or more: expect \
                 429 rate_limit_exceeded (--rate {:.1} stays under it)",
                rl.limit,
                rl.remaining,
                rl.limit as f64 / 60.0
            ));
        }
    }
    out
}

/// Run the load of `args` against `target`: every level in turn. Warnings about the rate limit
/// go to stderr before the first request and into the report.
///
/// # Errors
///
/// The flags do not fit the target (`report` without a report, `get-row` without the route),
/// or a setup request (rows the clients write, `/me`) failed.
pub async fn run(args: &BenchArgs, target: &Target) -> anyhow::Result<Run> {
    let mix = mix_of(args)?;
    if mix.contains(Workload::Report) && target.report_id.is_none() {
        bail!("the report workload on a running server needs --report-id");
    }
    if target.sheets.is_empty() {
        bail!("no sheets to load");
    }
    let rate_limit = target.rate_limit().await.context("GET /me")?;
    let warnings = rate_limit_warnings(args, &rate_limit);
    for w in &warnings {
        eprintln!("sheetd bench: warning: {w}");
    }
    let threads = client_threads(args, target.is_own());
    let settings = Settings {
        sheets: target.sheets.clone(),
        report_id: target.report_id,
        mix: mix.clone(),
        page_size: args.page_size,
        bulk_size: args.bulk_size,
        conflict_rate: args.conflict_rate,
        rows_per_client: args.rows_per_client,
        track_cells: args.verify,
        headers: args.header.clone(),
    };
    let mut driver = Driver::new(target, settings, threads);
    let result = levels(args, target, &mut driver).await;
    let ledger = driver.ledger();
    driver.stop();
    let levels = result?;
    let fatal: u64 = levels.iter().map(|l| l.fatal_errors).sum();
    let report = Report {
        version: 1,
        target: TargetView {
            mode: if target.is_own() { "own" } else { "url" },
            url: target.base.clone(),
            sheets: target.sheets.iter().map(|s| s.id).collect(),
            rows_per_sheet: target.is_own().then_some(args.rows),
            columns: target.is_own().then_some(args.columns),
            loaded: target.loaded.clone(),
        },
        workload: WorkloadView {
            name: if mix.entries().len() > 1 { "mixed" } else { mix.entries()[0].0.name() },
            mix: mix.entries().iter().map(|(w, n)| MixEntry { op: w.name(), weight: *n }).collect(),
            page_size: args.page_size,
            bulk_size: args.bulk_size,
            conflict_rate: args.conflict_rate,
            rows_per_client: args.rows_per_client,
        },
        load: LoadView {
            kind: if args.rate.is_some() { "open" } else { "closed" },
            rate: args.rate,
            duration_seconds: args.requests.is_none().then_some(args.duration.as_secs_f64()),
            requests: args.requests,
            warmup_seconds: args.warmup.as_secs_f64(),
            client_threads: threads,
            repeat: args.repeat,
        },
        machine: Machine::here(),
        build: Build::this(),
        rate_limit: Some(rate_limit),
        warnings,
        levels,
        verify: None,
        passed: fatal == 0,
    };
    Ok(Run { report, ledger })
}

async fn levels(
    args: &BenchArgs,
    target: &Target,
    driver: &mut Driver,
) -> anyhow::Result<Vec<LevelView>> {
    driver.probe().await?;
    let mut out = Vec::new();
    for &c in &args.concurrency {
        let plan = LevelPlan {
            concurrency: c as usize,
            budget: match args.requests {
                Some(n) => Budget::Requests(n),
                None => Budget::Duration(args.duration),
            },
            warmup: args.warmup,
            rate: args.rate,
        };
        let mut runs = Vec::with_capacity(args.repeat as usize);
        for _ in 0..args.repeat {
            runs.push(driver.level(plan, target).await?);
        }
        out.push(LevelView::of_runs(&runs));
    }
    Ok(out)
}

/// Read back what `ledger` says was acknowledged; see [`mod@verify`].
///
/// # Errors
///
/// A page could not be read.
pub async fn verify(target: &Target, ledger: &Ledger) -> anyhow::Result<Verification> {
    verify::verify(&target.client(), ledger).await
}

/// The whole command: open the target (an own server through `start`), run, verify when
/// asked, close the target.
///
/// # Errors
///
/// Setup failed, or the read-back could not be made.
pub async fn execute(args: &BenchArgs, start: Option<StartServer>) -> anyhow::Result<Report> {
    if args.url.is_none() {
        eprintln!(
            "sheetd bench: starting an own server with {} sheet(s) of {} rows and {} columns",
            args.sheets, args.rows, args.columns
        );
    }
    let target = Target::open(args, start).await?;
    if let Some(l) = &target.loaded {
        eprintln!(
            "sheetd bench: loaded {} rows through bulkAdd in {:.1} s ({:.0} rows/s)",
            l.rows,
            l.seconds,
            l.rows as f64 / l.seconds.max(1e-9)
        );
    }
    let outcome = async {
        let Run { mut report, ledger } = run(args, &target).await?;
        if args.verify {
            let v = verify(&target, &ledger).await.context("--verify")?;
            report.passed &= v.passed();
            report.verify = Some(v);
        }
        anyhow::Ok(report)
    }
    .await;
    let closed = target.close().await;
    let report = outcome?;
    closed?;
    Ok(report)
}

/// `sheetd bench`: run, print the table, write the JSON and the page, and exit non-zero unless
/// it passed; or `bench compare`.
pub fn main(args: BenchArgs, start: StartServer) -> ExitCode {
    if let Some(BenchCommand::Compare(c)) = &args.command {
        return compare::main(c);
    }
    let result = actix_rt::System::new().block_on(execute(&args, Some(start)));
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sheetd bench: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", report.table());
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).expect("JSON");
        if let Err(e) = std::fs::write(path, text + "\n") {
            eprintln!("sheetd bench: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if let Some(path) = &args.html {
        if let Err(e) = std::fs::write(path, html::page(&report)) {
            eprintln!("sheetd bench: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if report.passed {
        ExitCode::SUCCESS
    } else {
        eprintln!("sheetd bench: failed: 5xx or transport errors, or writes not as acknowledged");
        ExitCode::FAILURE
    }
}
