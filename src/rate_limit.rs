//! Per-key (or, without a usable key, per client IP) rate limiting over a rolling minute.
//!
//! Each subject keeps the times of its requests in the last minute, so `remaining` and `reset`
//! are exact for a rolling window (no fixed-window bursts at minute boundaries). The map is a
//! sharded `DashMap`: subjects never contend on a global lock. Idle subjects are pruned by
//! [`RateLimiter::prune`], so memory follows the active subjects, not every IP ever seen.

use std::collections::VecDeque;
use std::net::IpAddr;

use dashmap::DashMap;

const WINDOW_MS: i64 = 60_000;

/// Who is being limited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Subject {
    /// A usable API key.
    Key(u64),
    /// A client without a usable key.
    Ip(IpAddr),
}

/// The outcome of one request's check, and what the headers say.
#[derive(Clone, Copy, Debug)]
pub struct Decision {
    /// Whether the request may proceed.
    pub allowed: bool,
    /// The ceiling per minute.
    pub limit: u64,
    /// Requests left in the window after this one.
    pub remaining: u64,
    /// Unix seconds when the next slot frees.
    pub reset: i64,
    /// Seconds from now until `reset` (at least 1 when refused).
    pub reset_after: u64,
}

/// Rolling-minute windows: per subject, the times of its allowed requests in the last minute.
#[derive(Debug)]
pub struct RateLimiter {
    per_minute: u64,
    windows: DashMap<Subject, VecDeque<i64>>,
}

fn ceil_secs(ms: i64) -> i64 {
    (ms + 999).div_euclid(1000)
}

impl RateLimiter {
    /// A limiter allowing `per_minute` requests per subject per rolling minute.
    pub fn new(per_minute: u64) -> Self {
        RateLimiter { per_minute, windows: DashMap::new() }
    }

    /// Count a request of `subject` at `now_ms`, unless the window is full.
    pub fn check(&self, subject: Subject, now_ms: i64) -> Decision {
        let mut window = self.windows.entry(subject).or_default();
        while window.front().is_some_and(|t| *t <= now_ms - WINDOW_MS) {
            window.pop_front();
        }
        let allowed = (window.len() as u64) < self.per_minute;
        if allowed {
            window.push_back(now_ms);
        }
        let used = window.len() as u64;
        // The next slot frees when the oldest request in the window leaves it.
        let frees_at = window.front().map_or(now_ms, |oldest| oldest + WINDOW_MS);
        let reset_after = if allowed {
            ceil_secs(frees_at - now_ms).max(0)
        } else {
            ceil_secs(frees_at - now_ms).max(1)
        };
        Decision {
            allowed,
            limit: self.per_minute,
            remaining: self.per_minute.saturating_sub(used),
            reset: ceil_secs(now_ms) + reset_after,
            reset_after: reset_after as u64,
        }
    }

    /// Forget subjects with no request in the last minute.
    pub fn prune(&self, now_ms: i64) {
        self.windows.retain(|_, w| w.back().is_some_and(|t| *t > now_ms - WINDOW_MS));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rolling_window_refuses_the_next_request_until_a_slot_frees() {
        let rl = RateLimiter::new(3);
        let s = Subject::Key(1);
        for i in 0..3 {
            let d = rl.check(s, 1_000 + i * 10);
            assert!(d.allowed);
            assert_eq!(d.remaining, 2 - i as u64);
        }
        let d = rl.check(s, 2_000);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.reset_after, 59, "oldest at 1.000s frees at 61.000s");
        assert!(rl.check(Subject::Key(2), 2_000).allowed, "other subjects are unaffected");
        assert!(rl.check(s, 61_001).allowed, "the oldest left the window");
    }
}
