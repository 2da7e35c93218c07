//! Background work's claim on the CPU: the one way a thread doing work no request waits for
//! (a backup being streamed, webhook deliveries) steps back for the requests.
//!
//! Two means, both used by every background thread:
//!
//! - **Priority** ([`lower_to_background`]): the thread runs at the lowest scheduling priority.
//!   Linux schedules threads one by one, so the rest of the process keeps its priority; threads
//!   the lowered one starts inherit it.
//! - **Pace** ([`Budget`]): priority alone does not keep background work from the writers on a
//!   machine with few cores. A write crosses several threads, and each of them waits for a
//!   core whenever background work holds both: two nice-19 (or `SCHED_IDLE`) busy loops took
//!   a third of the writers' rate on a 2-core VM (docs/performance.md). So while requests are
//!   being served, a background thread uses at most its share of one core, measured on its own
//!   CPU clock (so the system time of its sockets and files counts too); when none has been
//!   served for [`QUIET`], it takes all it can get. Work that falls behind meanwhile catches
//!   up when the load eases.
//!
//! The budget is a debt of CPU time: what the thread used minus its share of the wall time
//! since the last look. Work goes on only with no debt (less than a millisecond: looking costs
//! CPU too); a debt is slept off (the sleep is what the share of its length pays for).

use std::time::{Duration, Instant};

/// No request served for this long: the server is quiet, and deliveries are not paced.
pub const QUIET: Duration = Duration::from_millis(100);
/// What a quiet spell leaves as credit: a little work at once when requests come back (a
/// write's webhook message after a pause goes out without waiting).
const CREDIT: Duration = Duration::from_millis(20);
/// A debt below this is paid: looking at the budget and sleeping cost the thread some CPU of
/// their own (the sleep's system time counts on its clock), so at a small share a debt of a
/// few microseconds would never be slept off.
const GRAIN: f64 = 0.001;
/// The longest single wait, so that a change of load is noticed soon.
const MAX_WAIT: Duration = Duration::from_millis(100);

/// What the budget says of the next piece of work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    /// No request is being served: go, unpaced.
    Quiet,
    /// Requests are being served and the budget has room: go, paced (a caller that starts
    /// many pieces of work at once lets only a few through, so as not to overdraw it).
    Go,
    /// Requests are being served and the budget is spent: wait this long, then look again.
    Wait(Duration),
}

/// A background thread's CPU budget (see the module docs).
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

    /// Counts CPU time the thread's clock does not see: work done for it on another thread
    /// (a webhook message read and rendered on a blocking pool).
    pub fn charge(&mut self, elsewhere: Duration) {
        self.debt += elsewhere.as_secs_f64();
    }

    /// Looks at the budget at `now`, with the thread's CPU clock at `cpu` and `served`
    /// requests counted so far: whether the next piece of work is paced, and how long it
    /// waits.
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
        if self.debt > GRAIN {
            Pace::Wait(Duration::from_secs_f64(self.debt / self.share).min(MAX_WAIT))
        } else {
            Pace::Go
        }
    }
}

impl Budget {
    /// For a blocking thread doing the background work: waits (sleeping the thread) until the
    /// budget has room, `served` telling how many requests were served so far. Returns how
    /// long it waited.
    pub fn pace_blocking(&mut self, served: impl Fn() -> u64) -> Duration {
        let mut waited = Duration::ZERO;
        while let Pace::Wait(wait) = self.check(Instant::now(), thread_cpu(), served()) {
            std::thread::sleep(wait);
            waited += wait;
        }
        waited
    }
}

/// The calling thread's CPU clock (user and system time).
pub fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32)
}

/// The nice value of background threads: the lowest priority there is. Their own pace
/// matters less than the requests'.
pub const BACKGROUND_NICE: i32 = 19;

/// Lowers the calling thread's scheduling priority to [`BACKGROUND_NICE`]. A failure only
/// costs the writers some CPU: it is logged, with `what` the thread's work.
pub fn lower_to_background(what: &str) {
    let tid = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(tid), BACKGROUND_NICE) {
        tracing::warn!(error = %e, thread = what, "cannot lower a background thread's priority");
    }
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
    fn a_blocking_thread_sleeps_its_debt_off() {
        let mut b = Budget::new(1);
        assert_eq!(b.pace_blocking(|| 1), Duration::ZERO);
        // 30 ms of work on this thread's clock, requests still coming: 10 ms past the credit,
        // less 1 % of the wall time it took (under a second, even on a loaded machine), slept
        // off at 1 %.
        let started = thread_cpu();
        let mut x = 0u64;
        while thread_cpu() - started < 30 * MS {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
        }
        // Requests keep coming while it waits: each look counts one more.
        let served = std::cell::Cell::new(1);
        let waited = b.pace_blocking(|| {
            served.set(served.get() + 1);
            served.get()
        });
        assert!(waited > Duration::ZERO, "{waited:?}");
        // Paid off, but for the microseconds of CPU the looks themselves took since.
        let after = b.check(Instant::now(), thread_cpu(), served.get() + 1);
        assert!(after == Pace::Go || matches!(after, Pace::Wait(w) if w < 50 * MS), "{after:?}");
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
