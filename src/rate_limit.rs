//! Per-key (or, without a usable key, per client IP) rate limiting over a rolling minute.
//!
//! Each subject keeps its allowed requests of the last minute, counted per millisecond, so
//! `remaining` and `reset` are exact for a rolling window (no fixed-window bursts at minute
//! boundaries) and a subject's memory is bounded by the minute's 60,000 milliseconds, not by
//! its limit: a load tester's key allowed millions of requests a minute keeps a count for each
//! millisecond it was served in, where an entry per request would grow with its rate (tens of
//! MB at 70 k requests a second, copied whole under the shard's lock each time the queue
//! doubles). The map is a sharded `DashMap`: subjects never contend on a global lock. Idle
//! subjects are pruned by [`RateLimiter::prune`], so memory follows the active subjects, not
//! every IP ever seen.

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

/// One subject's allowed requests of the last minute.
///
/// Invariants: `slots` holds (millisecond less `base`, requests allowed in it), the
/// milliseconds never decreasing from front to back (equal only when a count is full) and
/// every count at least 1; `allowed` is the sum of the counts. 8 bytes a slot, as little as a
/// timestamp per request, so a subject served at most once a millisecond costs no more. A
/// request checked at a millisecond before the newest one (the wall clock stepped back) counts
/// in the newest: it then leaves the window no earlier than it would.
#[derive(Debug, Default)]
struct Window {
    base: i64,
    slots: VecDeque<(u32, u32)>,
    allowed: u64,
}

impl Window {
    /// The millisecond a slot's offset stands for.
    fn at(&self, offset: u32) -> i64 {
        self.base + i64::from(offset)
    }

    /// When the oldest request counted was allowed.
    fn oldest(&self) -> Option<i64> {
        self.slots.front().map(|(offset, _)| self.at(*offset))
    }

    /// Drops the requests that left the window by `now_ms`.
    fn expire(&mut self, now_ms: i64) {
        while let Some((offset, count)) = self.slots.front().copied() {
            if self.at(offset) > now_ms - WINDOW_MS {
                break;
            }
            self.slots.pop_front();
            self.allowed -= u64::from(count);
        }
    }

    /// Counts one allowed request at `now_ms` (after [`Window::expire`] for it).
    fn count(&mut self, now_ms: i64) {
        self.allowed += 1;
        let newest = self.slots.back().map(|(offset, _)| self.at(*offset));
        // A clock stepped back counts in the newest millisecond.
        let at = newest.map_or(now_ms, |newest| newest.max(now_ms));
        if newest == Some(at) {
            if let Some((_, count)) = self.slots.back_mut().filter(|(_, count)| *count < u32::MAX) {
                *count += 1;
                return;
            }
        }
        if self.slots.is_empty() {
            self.base = at;
        } else if at - self.base > i64::from(u32::MAX) {
            // Every slot left is younger than a minute (expired), so rebasing on the oldest
            // leaves offsets below `WINDOW_MS`.
            let shift = self.slots.front().map_or(0, |(offset, _)| *offset);
            self.base += i64::from(shift);
            for (offset, _) in &mut self.slots {
                *offset -= shift;
            }
        }
        self.slots.push_back(((at - self.base) as u32, 1));
    }
}

/// Rolling-minute windows: per subject, its allowed requests of the last minute.
#[derive(Debug)]
pub struct RateLimiter {
    per_minute: u64,
    windows: DashMap<Subject, Window>,
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
        window.expire(now_ms);
        let allowed = window.allowed < self.per_minute;
        if allowed {
            window.count(now_ms);
        }
        let used = window.allowed;
        // The next slot frees when the oldest request in the window leaves it.
        let frees_at = window.oldest().map_or(now_ms, |oldest| oldest + WINDOW_MS);
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

    /// Forget subjects with no request in the last minute, and give back the room a busier
    /// spell left in the others' windows.
    pub fn prune(&self, now_ms: i64) {
        self.windows.retain(|_, w| {
            w.expire(now_ms);
            if w.slots.capacity() > 4 * w.slots.len().max(16) {
                w.slots.shrink_to(2 * w.slots.len());
            }
            !w.slots.is_empty()
        });
    }

    /// How many milliseconds `subject`'s window keeps a count for (tests: the memory bound).
    #[cfg(test)]
    fn slots(&self, subject: Subject) -> usize {
        self.windows.get(&subject).map_or(0, |w| w.slots.len())
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

    /// The windows decide as a list of every allowed request's time would (the definition of
    /// a rolling minute), for bursts within a millisecond and spells of silence alike.
    #[test]
    fn counted_per_millisecond_the_window_decides_as_a_list_of_requests() {
        let limit = 50;
        let rl = RateLimiter::new(limit);
        let s = Subject::Key(7);
        let mut times: VecDeque<i64> = VecDeque::new();
        let mut now = 1_000_000i64;
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut refused = 0;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Mostly the same or the next millisecond, sometimes most of a minute later.
            now += match seed % 100 {
                0..=59 => 0,
                60..=94 => (seed >> 8) as i64 % 40,
                _ => (seed >> 8) as i64 % 70_000,
            };
            while times.front().is_some_and(|t| *t <= now - WINDOW_MS) {
                times.pop_front();
            }
            let allowed = (times.len() as u64) < limit;
            if allowed {
                times.push_back(now);
            }
            let frees_at = times.front().map_or(now, |t| t + WINDOW_MS);
            let d = rl.check(s, now);
            assert_eq!(d.allowed, allowed, "at {now}");
            assert_eq!(d.remaining, limit - times.len() as u64, "at {now}");
            assert_eq!(d.reset_after as i64, ceil_secs(frees_at - now).max(i64::from(!allowed)));
            refused += u32::from(!allowed);
        }
        assert!(refused > 1_000, "the limit was reached often: {refused} refusals");
    }

    /// A limit in the millions keeps one count per millisecond, not one entry per request.
    #[test]
    fn a_high_limit_costs_a_slot_per_millisecond() {
        let rl = RateLimiter::new(1_000_000_000);
        let s = Subject::Key(3);
        for i in 0..100_000 {
            let d = rl.check(s, 5_000 + i / 10_000);
            assert!(d.allowed);
        }
        assert_eq!(rl.slots(s), 10);
        assert_eq!(rl.check(s, 5_009).remaining, 1_000_000_000 - 100_001);
        // A clock stepped back counts in the newest millisecond.
        assert_eq!(rl.check(s, 4_000).remaining, 1_000_000_000 - 100_002);
        assert_eq!(rl.slots(s), 10);
        // Seven weeks later every request has left: the window starts afresh from then.
        let later = 5_000 + 7 * 7 * 24 * 3_600_000;
        assert_eq!(rl.check(s, later).remaining, 1_000_000_000 - 1);
        assert_eq!(rl.check(s, later + 1).remaining, 1_000_000_000 - 2);
        let d = rl.check(s, later + 30_000);
        assert_eq!((d.remaining, d.reset_after), (1_000_000_000 - 3, 30));
        assert_eq!(rl.slots(s), 3);
        rl.prune(later + 30_000 + WINDOW_MS);
        assert_eq!(rl.slots(s), 0, "every request left the window: the subject is forgotten");
        assert!(rl.windows.is_empty());
    }

    /// A subject never idle for a minute keeps its window for weeks, past what a slot's
    /// 32-bit offset from the window's base spans: the base moves and the counts stay right.
    #[test]
    fn a_window_busy_for_weeks_moves_its_base() {
        let rl = RateLimiter::new(10);
        let s = Subject::Key(5);
        let start = 1_700_000_000_000i64;
        assert_eq!(rl.check(s, start).remaining, 9);
        let fifty_days = 50 * 24 * 3_600_000;
        for t in (start + 30_000..start + fifty_days).step_by(30_000) {
            let d = rl.check(s, t);
            // This request and the one 30 s before: the one before that left at this instant.
            assert_eq!((d.allowed, d.remaining, d.reset_after), (true, 8, 30), "at {t}");
        }
        assert!(rl.windows.get(&s).is_some_and(|w| w.base > start), "the base moved");
    }
}
