//! Request metrics for `GET /admin/v1/metrics`: counts by route and status, and a latency
//! histogram. Sharded maps and atomics only: recording a request takes no global lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;

/// Upper bounds of the latency buckets, in seconds.
pub const LATENCY_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

/// Request counters.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: DashMap<(String, u16), u64>,
    buckets: [AtomicU64; 11],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Metrics {
    /// Record one request.
    pub fn observe(&self, route: &str, status: u16, latency: Duration) {
        *self.requests.entry((route.to_owned(), status)).or_default() += 1;
        let secs = latency.as_secs_f64();
        for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
            if secs <= *bound {
                self.buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(latency.as_micros() as u64, Ordering::Relaxed);
    }

    /// Requests by route and status, sorted.
    pub fn requests(&self) -> Vec<((String, u16), u64)> {
        let mut all: Vec<_> = self.requests.iter().map(|e| (e.key().clone(), *e.value())).collect();
        all.sort();
        all
    }

    /// Cumulative bucket counts, total count and total seconds.
    pub fn latency(&self) -> (Vec<u64>, u64, f64) {
        (
            self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect(),
            self.count.load(Ordering::Relaxed),
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
        )
    }
}
