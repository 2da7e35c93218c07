//! Per-level statistics: latency histograms (HDR, microseconds), counts of requests, rows and
//! errors, and the same per second of the measurement (the timeline `--html` draws). Each
//! virtual user fills its own [`Stats`] without any sharing; the level merges them at the end,
//! so recording costs no lock and no atomic beyond the progress counter.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::workload::{Outcome, Workload};

/// Highest latency the histograms hold: one hour, in microseconds (longer ones are clamped).
const MAX_MICROS: u64 = 3_600_000_000;

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_MICROS, 3).expect("valid bounds")
}

/// One second of a level's measurement, by when the answers came.
#[derive(Clone, Debug, Default)]
pub struct Second {
    /// Answers (errors included).
    pub requests: u64,
    /// Of those, requests with an error answer or a transport error.
    pub errors: u64,
    /// Their latencies, microseconds. Kept as they are, not in a histogram: a histogram per
    /// user per second costs kilobytes each, which at thousands of users outgrows the 4 bytes
    /// an answer costs here.
    pub latencies: Vec<u32>,
}

impl Second {
    /// The latency at quantile `q` (0 to 1) of the sorted `latencies`, microseconds.
    pub fn quantile(sorted: &[u32], q: f64) -> Option<u32> {
        let n = sorted.len();
        (n > 0).then(|| sorted[((q * n as f64).ceil() as usize).clamp(1, n) - 1])
    }
}

/// An error kind: HTTP status (0: transport) and `errorCode` (or a transport class), and
/// whether it came from a failed item inside a 200 bulk answer.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ErrorKind {
    /// HTTP status; 0 for a transport error.
    pub status: u16,
    /// `errorCode`, or a transport class (`timeout`, `connect_failed`, ...).
    pub code: String,
    /// A failed item of a bulk write (the request itself was a 200).
    pub bulk_item: bool,
}

/// One request kind's latencies.
#[derive(Clone, Debug)]
pub struct OpStats {
    /// Latencies in microseconds.
    pub latency: Histogram<u64>,
}

/// The figures of one virtual user, or of a whole level once merged.
#[derive(Clone, Debug)]
pub struct Stats {
    /// Latencies of every measured request (every answer, errors included), microseconds.
    pub latency: Histogram<u64>,
    /// Per request kind (for mixed workloads).
    pub ops: BTreeMap<Workload, OpStats>,
    /// Measured requests.
    pub requests: u64,
    /// Of those, 2xx answers.
    pub ok: u64,
    /// Rows read: rows of pages and of report runs.
    pub rows_read: u64,
    /// Rows written and acknowledged.
    pub rows_written: u64,
    /// Deliberately stale patches answered with `version_conflict`.
    pub expected_conflicts: u64,
    /// Errors by kind.
    pub errors: BTreeMap<ErrorKind, u64>,
    /// Per whole second since the measurement started, by when each answer came.
    pub timeline: Vec<Second>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            latency: histogram(),
            ops: BTreeMap::new(),
            requests: 0,
            ok: 0,
            rows_read: 0,
            rows_written: 0,
            expected_conflicts: 0,
            errors: BTreeMap::new(),
            timeline: Vec::new(),
        }
    }
}

impl Stats {
    /// Count one measured request, answered `at` after the measurement started.
    pub fn record(&mut self, op: Workload, latency: Duration, out: &Outcome, at: Duration) {
        let micros = (latency.as_micros() as u64).clamp(1, MAX_MICROS);
        let second = at.as_secs() as usize;
        if self.timeline.len() <= second {
            self.timeline.resize_with(second + 1, Second::default);
        }
        let sec = &mut self.timeline[second];
        sec.requests += 1;
        sec.errors += u64::from(out.error.is_some());
        sec.latencies.push(micros.min(u64::from(u32::MAX)) as u32);
        self.latency.saturating_record(micros);
        self.ops
            .entry(op)
            .or_insert_with(|| OpStats { latency: histogram() })
            .latency
            .saturating_record(micros);
        self.requests += 1;
        if (200..300).contains(&out.status) {
            self.ok += 1;
        }
        self.rows_read += out.rows_read;
        self.rows_written += out.rows_written;
        self.expected_conflicts += u64::from(out.expected_conflict);
        if let Some(code) = &out.error {
            let kind = ErrorKind { status: out.status, code: code.clone(), bulk_item: false };
            *self.errors.entry(kind).or_default() += 1;
        }
        for code in &out.item_errors {
            let kind = ErrorKind { status: out.status, code: code.clone(), bulk_item: true };
            *self.errors.entry(kind).or_default() += 1;
        }
    }

    /// Add another user's figures.
    pub fn merge(&mut self, other: &Stats) {
        self.latency.add(&other.latency).expect("same bounds");
        for (op, s) in &other.ops {
            self.ops
                .entry(*op)
                .or_insert_with(|| OpStats { latency: histogram() })
                .latency
                .add(&s.latency)
                .expect("same bounds");
        }
        self.requests += other.requests;
        self.ok += other.ok;
        self.rows_read += other.rows_read;
        self.rows_written += other.rows_written;
        self.expected_conflicts += other.expected_conflicts;
        for (k, n) in &other.errors {
            *self.errors.entry(k.clone()).or_default() += n;
        }
        if self.timeline.len() < other.timeline.len() {
            self.timeline.resize_with(other.timeline.len(), Second::default);
        }
        for (mine, theirs) in self.timeline.iter_mut().zip(&other.timeline) {
            mine.requests += theirs.requests;
            mine.errors += theirs.errors;
            mine.latencies.extend_from_slice(&theirs.latencies);
        }
    }

    /// Answers that fail the run: 5xx and transport errors.
    pub fn fatal_errors(&self) -> u64 {
        self.errors
            .iter()
            .filter(|(k, _)| !k.bulk_item && (k.status == 0 || k.status >= 500))
            .map(|(_, n)| n)
            .sum()
    }
}

/// Latency percentiles of a histogram, in milliseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
    /// Smallest.
    pub min: f64,
    /// The arithmetic mean, which the slowest requests pull up (unlike `p50`).
    pub mean: f64,
}

impl Latency {
    /// The percentiles of `h` (microseconds) in milliseconds; zeros when empty.
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Latency::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Latency {
            p50: ms(h.value_at_quantile(0.5)),
            p90: ms(h.value_at_quantile(0.9)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
            min: ms(h.min()),
            mean: h.mean() / 1000.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, error: Option<&str>) -> Outcome {
        Outcome {
            status,
            error: error.map(str::to_owned),
            rows_read: 0,
            rows_written: 1,
            expected_conflict: false,
            item_errors: Vec::new(),
        }
    }

    #[test]
    fn answers_are_counted_in_the_second_they_came_and_merge_by_second() {
        let ms = Duration::from_millis;
        let mut a = Stats::default();
        a.record(Workload::Patch, ms(2), &answer(200, None), ms(100));
        a.record(Workload::Patch, ms(9), &answer(503, Some("storage_unavailable")), ms(2500));
        let mut b = Stats::default();
        b.record(Workload::Patch, ms(4), &answer(200, None), ms(900));
        a.merge(&b);
        assert_eq!(a.timeline.len(), 3, "seconds 0, 1 (none) and 2");
        assert_eq!((a.timeline[0].requests, a.timeline[0].errors), (2, 0));
        assert_eq!(a.timeline[1].requests, 0);
        assert_eq!((a.timeline[2].requests, a.timeline[2].errors), (1, 1));
        let mut first = a.timeline[0].latencies.clone();
        first.sort_unstable();
        assert_eq!(first, [2000, 4000]);
        assert_eq!(a.requests, 3);
    }

    #[test]
    fn quantiles_of_a_second_are_values_it_holds() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(Second::quantile(&v, 0.5), Some(50));
        assert_eq!(Second::quantile(&v, 0.99), Some(99));
        assert_eq!(Second::quantile(&v, 1.0), Some(100));
        assert_eq!(Second::quantile(&v, 0.0), Some(1));
        assert_eq!(Second::quantile(&[], 0.5), None);
    }
}
