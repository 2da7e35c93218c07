//! `sheetd bench`'s flags: what to load (an own server or a running one), with which requests,
//! how hard, and where the figures go, with the parsers of their values. They are the load
//! generator's, not the server's configuration: the `sheetd` binary only mounts them as its
//! `bench` subcommand.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::workload::{Mix, Workload};

/// `sheetd bench` flags. See [`crate`] for what each figure means.
// A run's flags given with `compare` would be ignored: refuse them instead.
#[derive(Debug, Clone, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    /// Base URL of a running server (`http://127.0.0.1:8080/api/v1`). Without it, bench starts
    /// its own server in-process on a temporary data dir with generated data, and removes it
    /// afterwards.
    #[arg(long, help_heading = "Target")]
    pub url: Option<String>,
    /// API key for `--url` (write access to the sheets for write workloads).
    #[arg(long, env = "SHEETD_BENCH_KEY", hide_env_values = true, help_heading = "Target")]
    pub key: Option<String>,
    /// Admin API of the `--url` server (`http://127.0.0.1:8081/admin/v1`), to report its log's
    /// records per flush and flush latency per level.
    #[arg(long, requires = "admin_token", help_heading = "Target")]
    pub admin_url: Option<String>,
    /// Admin token for `--admin-url`.
    #[arg(long, env = "SHEETD_BENCH_ADMIN_TOKEN", hide_env_values = true, help_heading = "Target")]
    pub admin_token: Option<String>,
    /// Sheets to spread the load over: generated ones (own server), or the first N the key can
    /// read (`--url`).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Target")]
    pub sheets: u64,
    /// Exactly these sheets of the `--url` server (comma-separated ids) instead of the first
    /// `--sheets`.
    #[arg(long, value_delimiter = ',', help_heading = "Target")]
    pub sheet_ids: Vec<u64>,
    /// Rows generated per sheet (own server).
    #[arg(long, default_value_t = 10_000, help_heading = "Target")]
    pub rows: u64,
    /// Columns generated per sheet (own server), of mixed types: text, number, dropdown,
    /// checkbox, date, datetime, contact, multi_select, symbol, then text and number again.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u64).range(1..=200), help_heading = "Target")]
    pub columns: u64,
    /// The saved report the `report` workload runs on a `--url` server (own server: its
    /// generated summary report).
    #[arg(long, help_heading = "Target")]
    pub report_id: Option<u64>,

    /// What each request does; `mixed` draws from `--mix`.
    #[arg(long, value_enum, default_value = "read-page", help_heading = "Workload")]
    pub workload: Workload,
    /// Weights for `--workload mixed` (implies it): `read-page=80,patch=15,bulk-add=5`.
    #[arg(long, help_heading = "Workload")]
    pub mix: Option<Mix>,
    /// Rows per page (`read-page`, `get-sheet`, `report`); the API clamps above 500.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Workload")]
    pub page_size: u64,
    /// Rows per `bulk-add` / `bulk-update` request (1 to 2000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=2000), help_heading = "Workload")]
    pub bulk_size: u64,
    /// Fraction of patches sent with a stale version on purpose; their 409s are counted as
    /// expected conflicts, not errors.
    #[arg(long, default_value_t = 0.0, value_parser = parse_fraction, help_heading = "Workload")]
    pub conflict_rate: f64,
    /// Rows each virtual client creates up front and then patches / updates (its own, so no
    /// other client conflicts with it).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=100_000), help_heading = "Workload")]
    pub rows_per_client: u64,

    /// Concurrency levels, each run in turn: virtual clients, each with one keep-alive
    /// connection and one request in flight.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64", value_parser = clap::value_parser!(u64).range(1..=10_000), help_heading = "Load")]
    pub concurrency: Vec<u64>,
    /// How long each level is measured (`10s`, `500ms`, `2m`).
    #[arg(long, default_value = "10s", value_parser = parse_duration, help_heading = "Load")]
    pub duration: Duration,
    /// Requests measured per level instead of a duration.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Load")]
    pub requests: Option<u64>,
    /// Load before each level's measurement that is not counted.
    #[arg(long, default_value = "2s", value_parser = parse_duration, help_heading = "Load")]
    pub warmup: Duration,
    /// Open-loop load: this many requests per second in total, sent on a fixed schedule; a
    /// request's latency counts from when it was due, so queueing shows (no coordinated
    /// omission). Without it, each client sends its next request when the last one answered.
    #[arg(long, value_parser = parse_rate, help_heading = "Load")]
    pub rate: Option<f64>,
    /// Run each level this many times, one after the other, and record how far the runs
    /// spread (`bench compare` tells a change from that noise).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100), help_heading = "Load")]
    pub repeat: u32,
    /// A header every load request carries, as `Name: value` (repeatable): e.g.
    /// `Sheetd-Consistency: local` to read from a cluster follower's own state.
    #[arg(long, value_parser = parse_header, help_heading = "Load")]
    pub header: Vec<(String, String)>,
    /// Threads the clients run on (default: the cores, or half of them with the own server,
    /// which needs the rest).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=256), help_heading = "Load")]
    pub client_threads: Option<u64>,

    /// Write every figure as JSON to this file (schema: see the [`crate`] docs).
    #[arg(long, help_heading = "Output")]
    pub json: Option<PathBuf>,
    /// Write one self-contained HTML page of charts to this file: per level, throughput and
    /// errors over time, latency over time, the percentile curve, the server's group commits;
    /// and the run's settings, machine and build.
    #[arg(long, help_heading = "Output")]
    pub html: Option<PathBuf>,
    /// After the run, read back every row the run saw acknowledged and check its version and
    /// cells (deleted rows must be gone); any lost or wrong write fails the run.
    #[arg(long, help_heading = "Output")]
    pub verify: bool,

    /// `bench compare`: two runs' JSON side by side, instead of a run.
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
}

/// What `sheetd bench` does instead of a run.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum BenchCommand {
    /// Compare two runs' `--json` files: per workload and level, B's throughput and
    /// percentiles over A's, a change marked only beyond the runs' own spread.
    Compare(CompareArgs),
}

/// `sheetd bench compare` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// The baseline run's `--json` file.
    pub a: PathBuf,
    /// The run compared with it.
    pub b: PathBuf,
    /// Also write the comparison as one self-contained HTML page.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// Exit with status 1 when a change is beyond this percentage: a throughput drop or a
    /// percentile rise of more than PCT % (`10`), and beyond the runs' spread.
    #[arg(long, value_name = "PCT", value_parser = parse_percent)]
    pub fail_if: Option<f64>,
}

impl BenchArgs {
    /// Parse `sheetd bench` flags (without the program and subcommand names), for callers that
    /// drive the load tester as a library (the `http_load` bench, tests).
    ///
    /// # Errors
    ///
    /// The flags do not parse.
    pub fn parse_flags<I, T>(flags: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: BenchArgs,
        }
        let all = std::iter::once(std::ffi::OsString::from("bench"))
            .chain(flags.into_iter().map(Into::into));
        Ok(Wrapper::try_parse_from(all)?.args)
    }
}

/// A header as `Name: value`.
pub fn parse_header(text: &str) -> Result<(String, String), String> {
    let (name, value) =
        text.split_once(':').ok_or_else(|| format!("`{text}` is not `Name: value`"))?;
    let name = name.trim();
    let valid = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if !valid {
        return Err(format!("`{name}` is not a header name"));
    }
    Ok((name.to_owned(), value.trim().to_owned()))
}

/// A duration as `10s`, `500ms`, `2m`, `1.5s` or plain seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let value: f64 = number.trim().parse().map_err(|_| format!("`{text}` is not a duration"))?;
    let scale = match unit {
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("`{text}`: the unit must be ms, s, m or h")),
    };
    Duration::try_from_secs_f64(value * scale).map_err(|_| format!("`{text}` is not a duration"))
}

fn parse_fraction(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("`{text}` is not a fraction from 0 to 1")),
    }
}

fn parse_percent(text: &str) -> Result<f64, String> {
    match text.trim_end_matches('%').parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{text}` is not a percentage (`10` for 10 %)")),
    }
}

fn parse_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("`{text}` is not a positive number of requests per second")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_unit_or_mean_seconds() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("10x").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn headers_are_a_name_and_a_value() {
        let local = ("Sheetd-Consistency".to_owned(), "local".to_owned());
        assert_eq!(parse_header("Sheetd-Consistency: local"), Ok(local));
        assert_eq!(parse_header("X-A:b:c"), Ok(("X-A".to_owned(), "b:c".to_owned())));
        for bad in ["no colon", ": value", "bad name: x"] {
            assert!(parse_header(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bench_flags_parse_with_their_defaults() {
        let a = BenchArgs::parse_flags(["--mix", "read-page=80,patch=20", "--concurrency", "2,4"])
            .unwrap();
        assert_eq!(a.concurrency, vec![2, 4]);
        assert_eq!(a.sheets, 4);
        assert_eq!(a.rows, 10_000);
        assert_eq!(a.duration, Duration::from_secs(10));
        assert!(BenchArgs::parse_flags(["--conflict-rate", "1.5"]).is_err());
        assert!(BenchArgs::parse_flags(["--bulk-size", "2001"]).is_err());
    }
}
