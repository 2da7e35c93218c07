//! How much CPU deliveries may take while the server serves requests.
//!
//! Webhooks behind a busy sheet have more to send than any machine could post (a thousand
//! webhooks on a sheet taking thousands of writes a second ask for millions of changes a
//! second), so deliveries take whatever CPU they are given. Scheduling priority alone does not
//! keep that from the writers on a machine with few cores: a write crosses several threads,
//! and each of them waits for a core whenever deliveries hold both. So deliveries are paced
//! instead: while requests are being served, the delivery thread uses at most its share of
//! one core (`--webhook-cpu-percent`, measured on the thread's own CPU clock, so it counts
//! the sockets' system time as well as the rendering); when none has been served for
//! [`QUIET`], it takes all it can get. Webhooks that fall behind meanwhile catch up when the
//! load eases, in fuller messages.
//!
//! The budget is a debt of CPU time: what the thread used minus its share of the wall time
//! since the last look. A delivery starts only with no debt; a debt is slept off (the sleep
//! is what the share of its length pays for).

use std::time::{Duration, Instant};

/// No request served for this long: the server is quiet, and deliveries are not paced.
pub const QUIET: Duration = Duration::from_millis(100);
/// What a quiet spell leaves as credit: a few deliveries' worth at once when requests come
/// back, so that a write's message after a pause goes out without waiting.
const CREDIT: Duration = Duration::from_millis(20);
/// The longest single wait, so that a change of load is noticed soon.
const MAX_WAIT: Duration = Duration::from_millis(100);

/// What the budget says of the next delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    /// No request is being served: go, unpaced.
    Quiet,
    /// Requests are being served and the budget has room: go, paced (one of a few at once,
    /// so that many webhooks starting together cannot overdraw it by much).
    Go,
    /// Requests are being served and the budget is spent: wait this long, then look again.
    Wait(Duration),
}

/// The delivery thread's CPU budget (see the module docs).
///
/// Invariant: `debt` is at least `-CREDIT` (no credit beyond what a quiet spell leaves).
#[derive(Debug)]
pub struct Budget {
    /// The share of one core allowed while requests are served, in (0, 1].
    share: f64,
    /// When the budget was last looked at, and the thread's CPU clock then.
    looked: Option<(Instant, Duration)>,
    /// The requests served by then, and when that count last moved.
    served: u64,
    served_moved: Instant,
    /// CPU used beyond the share, in seconds (negative: credit).
    debt: f64,
}

impl Budget {
    /// A budget of `percent` of one core while requests are served (clamped to 1..=100).
    pub fn new(percent: u8) -> Budget {
        Budget {
            share: f64::from(percent.clamp(1, 100)) / 100.0,
            looked: None,
            served: 0,
            served_moved: Instant::now(),
            debt: -CREDIT.as_secs_f64(),
        }
    }

    /// Counts CPU time the thread's clock does not see: work done for deliveries on another
    /// thread (reading and rendering a message on the blocking pool).
    pub fn charge(&mut self, elsewhere: Duration) {
        self.debt += elsewhere.as_secs_f64();
    }

    /// Looks at the budget at `now`, with the thread's CPU clock at `cpu` and `served`
    /// requests counted so far: whether the next delivery is paced, and how long it waits.
    pub fn check(&mut self, now: Instant, cpu: Duration, served: u64) -> Pace {
        if served != self.served {
            self.served = served;
            self.served_moved = now;
        }
        let (then, cpu_then) = self.looked.replace((now, cpu)).unwrap_or((now, cpu));
        if now.saturating_duration_since(self.served_moved) >= QUIET || self.share >= 1.0 {
            self.debt = -CREDIT.as_secs_f64();
            return Pace::Quiet;
        }
        let used = cpu.saturating_sub(cpu_then).as_secs_f64();
        let allowed = now.saturating_duration_since(then).as_secs_f64() * self.share;
        self.debt = (self.debt + used - allowed).max(-CREDIT.as_secs_f64());
        if self.debt > 0.0 {
            Pace::Wait(Duration::from_secs_f64(self.debt / self.share).min(MAX_WAIT))
        } else {
            Pace::Go
        }
    }
}

/// The calling thread's CPU clock (user and system time). A clock that cannot be read reads
/// zero: the budget then never runs into debt, and deliveries go unpaced.
pub fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Pace::{Go, Quiet, Wait};

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_quiet_server_never_paces() {
        let mut b = Budget::new(10);
        let t0 = Instant::now();
        assert_eq!(b.check(t0, Duration::ZERO, 5), Go);
        // No request for 100 ms: a whole core's use is not paced.
        let later = t0 + QUIET + MS;
        assert_eq!(b.check(later, 200 * MS, 5), Quiet);
        assert_eq!(b.check(later + 50 * MS, 250 * MS, 5), Quiet);
        // A request again: paced, with the credit a quiet spell leaves.
        assert_eq!(b.check(later + 60 * MS, 260 * MS, 6), Go);
    }

    #[test]
    fn a_busy_server_holds_deliveries_to_their_share_after_the_credit() {
        let mut b = Budget::new(10);
        let t0 = Instant::now();
        assert_eq!(b.check(t0, Duration::ZERO, 1), Go);
        // 10 ms of CPU in 10 ms of wall time, requests still coming: 9 ms over the share,
        // within the 20 ms of credit.
        assert_eq!(b.check(t0 + 10 * MS, 10 * MS, 2), Go);
        // Another 20 ms of CPU in 10 ms: 19 ms over, 8 ms of debt after the credit, slept off
        // at 10 %: 80 ms.
        let Wait(wait) = b.check(t0 + 20 * MS, 30 * MS, 3) else { panic!("not paced") };
        assert!((79 * MS..=81 * MS).contains(&wait), "{wait:?}");
        // Slept off: the next delivery goes.
        assert_eq!(b.check(t0 + 101 * MS, 30 * MS, 4), Go);
        // A long burst's wait is capped, so that a change of load is noticed soon.
        assert_eq!(b.check(t0 + 102 * MS, 90 * MS, 5), Wait(MAX_WAIT));
    }

    #[test]
    fn a_full_share_never_paces_and_the_credit_is_bounded() {
        let mut full = Budget::new(100);
        let t0 = Instant::now();
        assert_eq!(full.check(t0, Duration::ZERO, 1), Quiet);
        assert_eq!(full.check(t0 + MS, 50 * MS, 2), Quiet);
        // Cheap deliveries on a busy server earn no more than the credit: a burst after a
        // long cheap spell is paced once it is spent.
        let mut b = Budget::new(10);
        assert_eq!(b.check(t0, Duration::ZERO, 1), Go);
        assert_eq!(b.check(t0 + 50 * MS, Duration::ZERO, 2), Go);
        assert_eq!(b.check(t0 + 60 * MS, Duration::ZERO, 3), Go);
        assert!(matches!(b.check(t0 + 61 * MS, 30 * MS, 4), Wait(_)));
    }

    #[test]
    fn the_thread_clock_moves_with_work() {
        let before = thread_cpu();
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(thread_cpu() > before);
    }
}
