//! The load itself: virtual users on client threads, each level's warm-up and measurement,
//! closed or open loop, and the live progress line.
//!
//! # Closed and open loop
//!
//! Closed loop (no `--rate`): each user sends its next request as soon as the last one is
//! answered, and a request's latency is its own round trip. This finds the throughput at a
//! concurrency, but a stall hides: a user stuck on one slow request sends nothing meanwhile, so
//! the requests it would have sent never see the stall (coordinated omission).
//!
//! Open loop (`--rate R`): each of the C users sends on a fixed schedule, one request every
//! C/R seconds (the users' schedules are staggered over one interval). A request's latency is
//! measured from when it was *due*, not from when it left: when an answer comes late, the
//! requests due meanwhile go out at once and each counts its wait. That is the load a
//! population of independent callers makes, and the figures say what those callers see
//! (wrk2's model).
//!
//! # A level
//!
//! 1. Users that the level adds are created; every user makes the rows it will write (untimed).
//! 2. All users start together; requests due before the warm-up ends are sent but not counted.
//! 3. The admin metrics are read when the warm-up ends and when the last user is done, and the
//!    difference gives the log's flushes during the level; in between they are read once a
//!    second, for the group commits over time.
//! 4. Each user's figures come back with the user itself (its rows and versions carry over to
//!    the next level), and are merged.

use std::cell::RefCell;
use std::future::Future;
use std::io::IsTerminal;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_rt::Arbiter;
use anyhow::Context;
use tokio::sync::oneshot;

use super::client::Http;
use super::stats::Stats;
use super::target::{scrape, FlushCounters, FlushFigures, Target};
use super::workload::{Settings, VirtualUser, Workload};

/// When a level's measurement ends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Budget {
    /// After this long.
    Duration(Duration),
    /// After this many requests (in total over the users).
    Requests(u64),
}

/// How one level runs.
#[derive(Clone, Copy, Debug)]
pub struct LevelPlan {
    /// Virtual users.
    pub concurrency: usize,
    /// When to stop measuring.
    pub budget: Budget,
    /// Uncounted load first.
    pub warmup: Duration,
    /// Open loop at this many requests per second in total.
    pub rate: Option<f64>,
}

/// What a level measured.
#[derive(Debug)]
pub struct LevelResult {
    /// The plan the level ran: concurrency, budget, warm-up and rate.
    pub plan: LevelPlan,
    /// From the end of the warm-up to the last answer.
    pub elapsed: Duration,
    /// Every user's figures, merged.
    pub stats: Stats,
    /// The server's log during the measurement, when its metrics are reachable.
    pub flush: Option<FlushFigures>,
    /// Untimed refills of the users' row supplies during the level.
    pub refills: u64,
    /// The log's counters once a second from the end of the warm-up (seconds since then),
    /// when the admin API answers.
    pub server_samples: Vec<(f64, FlushCounters)>,
}

/// The schedule every user of a level follows.
#[derive(Clone, Copy)]
struct Schedule {
    start: Instant,
    warm_end: Instant,
    /// Measure until (duration budget).
    until: Option<Instant>,
    /// Measure this many (requests budget, this user's share).
    count: Option<u64>,
    /// Open loop: time between this user's sends.
    interval: Option<Duration>,
}

/// Runs levels, keeping the users and the client threads between them.
pub struct Driver {
    settings: Arc<Settings>,
    base: String,
    key: String,
    threads: Vec<Arbiter>,
    users: Vec<VirtualUser>,
    progress: bool,
}

/// Run `work` on a client thread and get its result back. The future is built on that thread
/// because an `awc` client cannot move between threads.
fn on_thread<T, F, Fut>(thread: &Arbiter, work: F) -> oneshot::Receiver<T>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
{
    let (tx, rx) = oneshot::channel();
    thread.spawn_fn(move || {
        actix_rt::spawn(async move {
            let _ = tx.send(work().await);
        });
    });
    rx
}

impl Driver {
    /// A driver for `target` with `threads` client threads.
    pub fn new(target: &Target, settings: Settings, threads: usize) -> Self {
        Driver {
            settings: Arc::new(settings),
            base: target.base.clone(),
            key: target.key.clone(),
            threads: (0..threads.max(1)).map(|_| Arbiter::new()).collect(),
            users: Vec::new(),
            progress: std::io::stderr().is_terminal(),
        }
    }

    /// The shared settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Probe a route the workload needs before any load: `getRow` is not in every server.
    ///
    /// # Errors
    ///
    /// The server answers the route with 404.
    pub async fn probe(&mut self) -> anyhow::Result<()> {
        if !self.settings.mix.contains(Workload::GetRow) {
            return Ok(());
        }
        self.ensure_users(1).await?;
        let (sheet, row) =
            self.users[0].some_row(&self.settings).context("the first client made no rows")?;
        let http = Http::new(&self.base, &self.key).with_headers(&self.settings.headers);
        let path = format!("/sheets/{sheet}/rows/{row}");
        if http.send(awc::http::Method::GET, &path, None).await.status == 404 {
            anyhow::bail!(
                "get-row needs a server with getRow: GET {path} (a row this run just created) \
                 answered 404"
            );
        }
        Ok(())
    }

    /// Create users up to `n` and let every one of them make its rows.
    async fn ensure_users(&mut self, n: usize) -> anyhow::Result<()> {
        self.ensure_users_for(n, 0).await
    }

    async fn ensure_users_for(&mut self, n: usize, deletes: u64) -> anyhow::Result<()> {
        let sheets = self.settings.sheets.len();
        while self.users.len() < n {
            self.users.push(VirtualUser::new(self.users.len(), sheets));
        }
        let mut pending = Vec::new();
        for (i, mut vu) in self.users.drain(..n).enumerate() {
            let (s, base, key) = (self.settings.clone(), self.base.clone(), self.key.clone());
            pending.push(on_thread(&self.threads[i % self.threads.len()], move || async move {
                let http = Http::new(&base, &key).with_headers(&s.headers);
                let r = vu.prepare(&http, &s, deletes).await;
                (vu, r)
            }));
        }
        let mut ready = Vec::with_capacity(n);
        let mut failure = None;
        for rx in pending {
            let (vu, r) = rx.await.context("a client thread stopped")?;
            ready.push(vu);
            if let Err(e) = r {
                failure.get_or_insert(e);
            }
        }
        self.users.splice(0..0, ready);
        match failure {
            Some(e) => Err(e.context("preparing the clients' rows")),
            None => Ok(()),
        }
    }

    /// Run one level.
    ///
    /// # Errors
    ///
    /// Preparing rows or refilling them failed (a setup request was refused).
    pub async fn level(&mut self, plan: LevelPlan, target: &Target) -> anyhow::Result<LevelResult> {
        let c = plan.concurrency;
        let deletes = match plan.budget {
            Budget::Requests(n) if self.settings.mix.contains(Workload::Delete) => {
                let share = self.settings.mix.share(Workload::Delete);
                ((n as f64 / c as f64) * share * 1.1).ceil() as u64 + 10
            }
            _ if self.settings.mix.contains(Workload::Delete) => 200,
            _ => 0,
        };
        self.ensure_users_for(c, deletes).await?;

        let start = Instant::now() + Duration::from_millis(50);
        let warm_end = start + plan.warmup;
        let interval = plan.rate.map(|r| Duration::from_secs_f64(c as f64 / r));
        let done = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let mut pending = Vec::with_capacity(c);
        for (i, vu) in self.users.drain(..c).enumerate() {
            let schedule = Schedule {
                // Open-loop users are staggered over one interval so they do not send in step.
                start: start
                    + interval.map_or(Duration::ZERO, |iv| iv.mul_f64(i as f64 / c as f64)),
                warm_end,
                until: match plan.budget {
                    Budget::Duration(d) => Some(warm_end + d),
                    Budget::Requests(_) => None,
                },
                count: match plan.budget {
                    Budget::Requests(n) => {
                        Some(n / c as u64 + u64::from((i as u64) < n % c as u64))
                    }
                    Budget::Duration(_) => None,
                },
                interval,
            };
            let (s, base, key) = (self.settings.clone(), self.base.clone(), self.key.clone());
            let (done, failed) = (done.clone(), failed.clone());
            pending.push(on_thread(&self.threads[i % self.threads.len()], move || async move {
                let http = Http::new(&base, &key).with_headers(&s.headers);
                run_user(vu, http, s, schedule, done, failed).await
            }));
        }

        actix_rt::time::sleep_until(warm_end.into()).await;
        let before = target.flush_counters().await;
        let samples = Rc::new(RefCell::new(Vec::new()));
        let sampler = before
            .and(target.admin.clone())
            .map(|admin| actix_rt::spawn(sample_server(admin, warm_end, samples.clone())));
        let ticker = self.progress.then(|| {
            let (done, failed) = (done.clone(), failed.clone());
            actix_rt::spawn(progress(c, warm_end, done, failed))
        });
        let mut stats = Stats::default();
        let mut last = warm_end;
        let mut refills = 0;
        let mut failure = None;
        let mut back = Vec::with_capacity(c);
        for rx in pending {
            let (vu, user_stats, finished, r) = rx.await.context("a client thread stopped")?;
            stats.merge(&user_stats);
            last = last.max(finished);
            refills += vu.refills;
            back.push(vu);
            if let Err(e) = r {
                failure.get_or_insert(e);
            }
        }
        if let Some(t) = ticker {
            t.abort();
            eprint!("\r\x1b[K");
        }
        if let Some(s) = sampler {
            s.abort();
        }
        let after = target.flush_counters().await;
        let mut server_samples = std::mem::take(&mut *samples.borrow_mut());
        if let Some(a) = after {
            server_samples.push((last.saturating_duration_since(warm_end).as_secs_f64(), a));
        }
        for vu in &mut back {
            vu.refills = 0;
        }
        self.users.splice(0..0, back);
        if let Some(e) = failure {
            return Err(e.context(format!("concurrency {c}")));
        }
        Ok(LevelResult {
            plan,
            elapsed: last.saturating_duration_since(warm_end),
            stats,
            flush: before.zip(after).map(|(b, a)| FlushFigures::between(b, a)),
            refills,
            server_samples,
        })
    }

    /// Every user's ledger, merged (the users are kept).
    pub fn ledger(&mut self) -> super::verify::Ledger {
        let mut all = super::verify::Ledger::default();
        for vu in &mut self.users {
            all.merge(std::mem::take(&mut vu.ledger));
        }
        all
    }

    /// Stop the client threads.
    pub fn stop(self) {
        for t in self.threads {
            t.stop();
        }
    }
}

/// One user's part of a level: its figures, when its last answer came, and the first setup
/// failure (a refill the server refused), which ends its part early.
async fn run_user(
    mut vu: VirtualUser,
    http: Http,
    s: Arc<Settings>,
    at: Schedule,
    done: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
) -> (VirtualUser, Stats, Instant, anyhow::Result<()>) {
    let mut stats = Stats::default();
    let mut measured = 0u64;
    let mut k = 0u32;
    let mut last = Instant::now();
    let result = loop {
        let due = match at.interval {
            Some(iv) => at.start + iv * k,
            None => Instant::now().max(at.start),
        };
        let counted = due >= at.warm_end;
        if counted
            && (at.until.is_some_and(|u| due >= u) || at.count.is_some_and(|n| measured >= n))
        {
            break Ok(());
        }
        let op = match vu.next(&http, &s).await {
            Ok(op) => op,
            Err(e) => break Err(e),
        };
        if due > Instant::now() {
            actix_rt::time::sleep_until(due.into()).await;
        }
        let sent = Instant::now();
        let out = vu.send(op, &http, &s).await;
        last = Instant::now();
        if counted {
            // Open loop counts from when the request was due, so a late send shows.
            let from = if at.interval.is_some() { due } else { sent };
            stats.record(op, last - from, &out, last.saturating_duration_since(at.warm_end));
            measured += 1;
            done.fetch_add(1, Ordering::Relaxed);
            if out.error.is_some() {
                failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        k += 1;
    };
    (vu, stats, last, result)
}

/// Read the log's counters at the end of the warm-up and every second after it, until
/// aborted; a scrape that fails is left out.
async fn sample_server(
    admin: (String, String),
    from: Instant,
    into: Rc<RefCell<Vec<(f64, FlushCounters)>>>,
) {
    for k in 0u32.. {
        actix_rt::time::sleep_until((from + Duration::from_secs(k.into())).into()).await;
        if let Some(c) = scrape(&admin).await {
            into.borrow_mut().push((from.elapsed().as_secs_f64(), c));
        }
    }
}

/// The live progress line on a terminal.
async fn progress(c: usize, from: Instant, done: Arc<AtomicU64>, failed: Arc<AtomicU64>) {
    loop {
        actix_rt::time::sleep(Duration::from_secs(1)).await;
        let secs = from.elapsed().as_secs_f64();
        let n = done.load(Ordering::Relaxed);
        eprint!(
            "\r\x1b[K  concurrency {c}: {secs:.0} s, {n} requests, {:.0} req/s, {} errors",
            n as f64 / secs.max(1e-9),
            failed.load(Ordering::Relaxed)
        );
    }
}
