//! Background maintenance of a running server: checkpoints by log size and by time, and
//! housekeeping of the in-memory side stores.
//!
//! # Why
//!
//! Start-up loads the last checkpoint and replays the log after it, and the log is truncated
//! only behind a checkpoint. Without periodic checkpoints both the log on disk and the next
//! start's replay grow with every write. Two triggers bound them:
//!
//! - **Size** (`--checkpoint-every-bytes`, default 64 MiB): bounds the log's size and the replay
//!   of a busy server.
//! - **Time** (`--checkpoint-every-secs`, default 300): bounds the replay of a quiet server whose
//!   log would take long to reach the size trigger.
//!
//! # Loop
//!
//! 1. Every [`POLL_EVERY`], measure the data dir's free space
//!    ([`actors::Service::refresh_free_space`]: the free-space floor's figure and edge log lines
//!    stay current while nothing is written) and read [`actors::Service::log_stats`] (atomics
//!    and two short locks).
//! 2. When anything was logged after the checkpoint and a trigger is crossed, take a
//!    checkpoint ([`actors::Service::checkpoint`]: copy the parts, write the snapshot, truncate
//!    the log behind it). Every checkpoint leaves exactly one record of its own after it (the
//!    marker it copies the side stores at), so "anything logged" means more records than that
//!    one: an idle server does not checkpoint again and again, and a write that landed while a
//!    checkpoint was copying (so the checkpoint stands before it) still gets checkpointed.
//! 3. Every [`HOUSEKEEPING_EVERY`], drop idempotency records whose 24-hour window has passed,
//!    events older than [`actors::shared::EVENT_RETENTION`], and rate-limit windows with no
//!    request in the last minute, so none of them grows without bound.
//! 4. A failed checkpoint is logged and retried after [`RETRY_AFTER`], not every second.
//! 5. While the log has failed (a write, flush or fsync error), try to re-open it from disk
//!    ([`actors::Service::heal`]) with backoff, from [`HEAL_FIRST_RETRY`] doubling up to
//!    [`HEAL_MAX_RETRY`]; both edges are logged, and health and metrics say so meanwhile.
//!
//! # Stopping
//!
//! [`Maintenance::stop`] waits for the step in progress to finish: the final checkpoint of
//! [`crate::server::stop`] must not race a background one (the log refuses a checkpoint older
//! than the current one).

use std::time::{Duration, Instant};

use actix_web::web;
use actors::Service;
use tokio::sync::oneshot;

use crate::config::ServeArgs;
use crate::priority::Budget;
use crate::state::AppState;

/// How often the log's counters are polled.
pub const POLL_EVERY: Duration = Duration::from_secs(1);
/// How often expired idempotency records and idle rate-limit windows are dropped. Both sweeps
/// visit every entry, so they run less often than the poll.
pub const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(10);
/// How long to wait after a failed checkpoint before trying again.
pub const RETRY_AFTER: Duration = Duration::from_secs(30);
/// The first wait before re-opening a failed log; it doubles after each failed attempt.
pub const HEAL_FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between two attempts to re-open a failed log.
pub const HEAL_MAX_RETRY: Duration = Duration::from_secs(30);

/// When to checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointPolicy {
    /// Checkpoint once this many payload bytes, or half the last checkpoint's size if that is
    /// more, were logged since the last checkpoint (`None`: never by size).
    pub every_bytes: Option<u64>,
    /// Checkpoint once this many records were logged since the last checkpoint (`None`: never
    /// by count).
    pub every_records: Option<u64>,
    /// Checkpoint this long after the last checkpoint (`None`: never by time).
    pub every: Option<Duration>,
}

/// Why a checkpoint is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The log grew past `--checkpoint-every-bytes`.
    Size,
    /// The log holds `--checkpoint-every-records` records past the checkpoint.
    Records,
    /// `--checkpoint-every-secs` passed.
    Time,
}

impl Trigger {
    fn as_str(self) -> &'static str {
        match self {
            Trigger::Size => "size",
            Trigger::Records => "records",
            Trigger::Time => "time",
        }
    }
}

impl CheckpointPolicy {
    /// The policy of the serve flags; 0 turns a trigger off.
    pub fn from_args(args: &ServeArgs) -> Self {
        CheckpointPolicy {
            every_bytes: Some(args.checkpoint_every_bytes).filter(|&b| b > 0),
            every_records: Some(args.checkpoint_every_records).filter(|&r| r > 0),
            every: Some(args.checkpoint_every_secs).filter(|&s| s > 0).map(Duration::from_secs),
        }
    }

    /// Whether a checkpoint is due, given what was logged after the checkpoint on disk, that
    /// checkpoint's snapshot bytes (0 for none), and the time since the last checkpoint.
    ///
    /// A checkpoint rewrites the whole state, so a fixed size trigger would make a large
    /// state's writes pay for it many times over (at 1,000,000 rows, a 400 MB rewrite per
    /// 64 MiB logged took a quarter of a bulk load's CPU). Waiting for half the state's size
    /// keeps that below twice the logged bytes, and the replay after a crash below half a
    /// checkpoint's decoding (the same rule as Redis's `auto-aof-rewrite-percentage`).
    ///
    /// Half a checkpoint's bytes of small records take longer to replay than the checkpoint
    /// to decode: on the engine bench's 1,000,000 rows, a start after SIGKILL with a
    /// 389,000-record (153 MB) tail of patches took 1.11 s, against 0.76-0.99 s with tails of
    /// 41,000 to 194,000. So a count of records is due on its own too, as Redis saves after a
    /// number of changes.
    pub fn due(&self, logged: Logged, last_checkpoint: u64, elapsed: Duration) -> Option<Trigger> {
        if !logged.any {
            None
        } else if self
            .every_bytes
            .is_some_and(|limit| logged.bytes >= limit.max(last_checkpoint / 2))
        {
            Some(Trigger::Size)
        } else if self.every_records.is_some_and(|limit| logged.records >= limit) {
            Some(Trigger::Records)
        } else if self.every.is_some_and(|period| elapsed >= period) {
            Some(Trigger::Time)
        } else {
            None
        }
    }
}

/// What was logged after the checkpoint on disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Logged {
    /// Anything beyond the checkpoint's own marker.
    pub any: bool,
    /// Payload bytes, as they decode.
    pub bytes: u64,
    /// Records, whatever their size (what `--checkpoint-every-records` counts).
    pub records: u64,
}

/// The running maintenance task.
#[derive(Debug)]
pub struct Maintenance {
    stop: oneshot::Sender<()>,
    task: actix_rt::task::JoinHandle<()>,
}

/// The loop's memory between polls.
struct Schedule {
    /// When the last checkpoint finished (or the loop started).
    checkpointed_at: Instant,
    /// No checkpoint before this instant (set after a failure).
    not_before: Option<Instant>,
    /// When the side stores were last swept.
    swept_at: Instant,
    /// While the log has failed: when to try re-opening it next, and the wait after that.
    heal: Option<(Instant, Duration)>,
}

impl Maintenance {
    /// Start the loop on the current actix system.
    pub fn start(state: web::Data<AppState>, policy: CheckpointPolicy) -> Self {
        let (stop, mut stopped) = oneshot::channel::<()>();
        let task = actix_rt::spawn(async move {
            let mut tick = actix_rt::time::interval(POLL_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let now = Instant::now();
            let mut schedule =
                Schedule { checkpointed_at: now, not_before: None, swept_at: now, heal: None };
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = tick.tick() => {}
                }
                // A cluster node that does not lead has no domain of its own to keep.
                let Some(service) = state.try_service() else { continue };
                // Keeps the free-space figure (health, metrics) and the floor's edge log lines
                // current while nothing is written.
                if let Err(e) = service.refresh_free_space() {
                    tracing::warn!(error = %e, "cannot measure the data dir's free space");
                }
                if service.storage_failed() {
                    heal_if_due(service, &mut schedule).await;
                    continue;
                }
                // A cluster's log is purged by the group behind its snapshots: the leader's
                // checkpoint is handed over as one, by a rule of its own.
                match &state.cluster {
                    None => checkpoint_if_due(&state, service, policy, &mut schedule).await,
                    Some(cluster) => {
                        snapshot_if_due(&state, cluster, service, policy, &mut schedule).await;
                    }
                }
                if schedule.swept_at.elapsed() >= HOUSEKEEPING_EVERY {
                    schedule.swept_at = Instant::now();
                    sweep(&state, service).await;
                }
            }
        });
        tracing::debug!(?policy, "background maintenance started");
        Maintenance { stop, task }
    }

    /// Stop the loop, waiting for a checkpoint in progress to finish.
    pub async fn stop(self) {
        // The receiver is gone only if the task already ended; either way it ends.
        let _ = self.stop.send(());
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "the maintenance task failed");
        }
    }
}

/// Step 2 of the loop.
async fn checkpoint_if_due(
    state: &web::Data<AppState>,
    service: &Service,
    policy: CheckpointPolicy,
    schedule: &mut Schedule,
) {
    if schedule.not_before.is_some_and(|t| Instant::now() < t) {
        return;
    }
    let stats = service.log_stats();
    // The checkpoint's own marker follows it; a log recovered at start-up counts like any other.
    let own_marker = u64::from(stats.checkpoint_lsn > 0);
    let logged = Logged {
        any: stats.records_since_checkpoint > own_marker,
        bytes: stats.bytes_since_checkpoint,
        records: stats.records_since_checkpoint,
    };
    let since = schedule.checkpointed_at.elapsed();
    let Some(trigger) = policy.due(logged, stats.checkpoint_bytes, since) else {
        return;
    };
    // It would wait for the backup to end, and the loop's other duties (healing a failed log,
    // purging) with it; the next round tries again.
    if service.checkpoints_held() {
        return;
    }
    let started = Instant::now();
    match service.checkpoint_paced(pace(state)).await {
        Ok(report) => {
            schedule.checkpointed_at = Instant::now();
            schedule.not_before = None;
            tracing::info!(
                trigger = trigger.as_str(),
                lsn = report.lsn,
                snapshot_bytes = report.bytes,
                log_bytes_before = stats.bytes_since_checkpoint,
                records_before = stats.records_since_checkpoint,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "background checkpoint written"
            );
        }
        Err(e) => {
            schedule.not_before = Some(Instant::now() + RETRY_AFTER);
            tracing::error!(
                trigger = trigger.as_str(),
                error = %e,
                retry_in_secs = RETRY_AFTER.as_secs(),
                "background checkpoint failed"
            );
        }
    }
}

/// Step 2 of the loop on a cluster's leader: its checkpoint, handed over as the group's next
/// snapshot, once `--checkpoint-every-records` entries were applied since the last snapshot,
/// or `--checkpoint-every-secs` passed with anything applied beyond the last checkpoint's
/// own entries. Sizes do not count: the purge keeps log behind each snapshot anyway.
async fn snapshot_if_due(
    state: &web::Data<AppState>,
    cluster: &actors::replica::ClusterDomain,
    service: &Service,
    policy: CheckpointPolicy,
    schedule: &mut Schedule,
) {
    if schedule.not_before.is_some_and(|t| Instant::now() < t) || service.checkpoints_held() {
        return;
    }
    let applied = cluster.applied_since_snapshot();
    let by_records = policy.every_records.is_some_and(|limit| applied >= limit);
    let by_time = policy.every.is_some_and(|period| schedule.checkpointed_at.elapsed() >= period)
        && applied > SNAPSHOT_OWN_ENTRIES;
    if !by_records && !by_time {
        return;
    }
    let started = Instant::now();
    match service.checkpoint_paced(pace(state)).await {
        Ok(report) => {
            schedule.checkpointed_at = Instant::now();
            schedule.not_before = None;
            tracing::info!(
                position = report.lsn,
                snapshot_bytes = report.bytes,
                applied_since_snapshot = applied,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "checkpoint handed over as the cluster's next snapshot"
            );
        }
        Err(e) => {
            schedule.not_before = Some(Instant::now() + RETRY_AFTER);
            tracing::error!(error = %e, retry_in_secs = RETRY_AFTER.as_secs(), "cluster checkpoint failed");
        }
    }
}

/// A leader's checkpoint stands at its copies' oldest tag, so its own marker, and at most a
/// write that raced it, come after it.
const SNAPSHOT_OWN_ENTRIES: u64 = 2;

/// Step 5 of the loop.
async fn heal_if_due(service: &Service, schedule: &mut Schedule) {
    let (at, wait) = *schedule.heal.get_or_insert_with(|| {
        tracing::error!(
            reason = service.unwritable_reason().unwrap_or_default(),
            "the data dir failed: writes get 503 storage_unavailable, reads go on; re-opening \
             the log from disk when the cause is gone"
        );
        (Instant::now() + HEAL_FIRST_RETRY, HEAL_FIRST_RETRY)
    });
    if Instant::now() < at {
        return;
    }
    let service = service.clone();
    match actix_web::rt::task::spawn_blocking(move || service.heal()).await {
        Ok(Ok(_)) => {
            schedule.heal = None;
            tracing::info!("the data dir works again: the log was re-opened, writes resume");
        }
        Ok(Err(e)) => {
            let next = (wait * 2).min(HEAL_MAX_RETRY);
            tracing::warn!(error = %chain(&e), retry_in_secs = next.as_secs(), "the log cannot be re-opened yet");
            schedule.heal = Some((Instant::now() + next, next));
        }
        Err(e) => tracing::error!(error = %e, "the attempt to re-open the log failed"),
    }
}

/// An error with its causes, as one line: the OS's own words are what an operator acts on.
fn chain(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        // A wrapper that prints its cause already ("write-ahead log: ...") adds nothing.
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    line
}

/// Step 3 of the loop. A cluster's leader decides what expires and replicates it, so that
/// every node forgets the same answers (see `actors::record::Record::Expire`).
async fn sweep(state: &AppState, service: &Service) {
    let purged = if state.cluster.is_some() {
        match service.expire_replicated().await {
            Ok(purged) => purged,
            Err(e) => {
                tracing::warn!(error = %e, "expired idempotency records and events stay until the next sweep");
                Default::default()
            }
        }
    } else {
        service.purge_expired()
    };
    state.limiter.prune(service.now());
    if purged.events > 0 {
        tracing::debug!(events = purged.events, "events past their retention dropped");
    }
    if purged.idempotency > 0 {
        tracing::debug!(purged = purged.idempotency, "expired idempotency records dropped");
    }
}

/// A background checkpoint's pace: encoding a large state takes seconds of a core, which
/// the writers' tail latency would otherwise wait for on a machine with few cores (see
/// [`crate::priority`]). One budget per checkpoint, looked at on the thread that writes it,
/// which is the checkpoint's own: its first look also lowers that thread's priority.
fn pace(state: &web::Data<AppState>) -> actors::service::Pace {
    let budget = std::sync::Mutex::new(Budget::new(state.background_cpu_percent));
    let lowered = std::sync::Once::new();
    let state = state.clone();
    std::sync::Arc::new(move || {
        lowered.call_once(|| crate::priority::lower_to_background("checkpoint"));
        let mut budget = budget.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let waited = budget.pace_blocking(|| state.metrics.served());
        let paced = &state.metrics.checkpoint_paced_micros;
        paced.fetch_add(waited.as_micros() as u64, std::sync::atomic::Ordering::Relaxed);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Something was logged: `bytes` in `records` records.
    fn logged(bytes: u64, records: u64) -> Logged {
        Logged { any: true, bytes, records }
    }

    const SECS: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn nothing_is_due_when_nothing_was_logged_since_the_last_checkpoint() {
        let p = CheckpointPolicy {
            every_bytes: Some(10),
            every_records: Some(1),
            every: Some(SECS(5)),
        };
        assert_eq!(p.due(Logged { any: false, bytes: 1_000, records: 1 }, 0, SECS(3600)), None);
    }

    #[test]
    fn size_wins_over_time_and_each_triggers_alone() {
        let p =
            CheckpointPolicy { every_bytes: Some(100), every_records: None, every: Some(SECS(5)) };
        assert_eq!(p.due(logged(100, 1), 0, SECS(60)), Some(Trigger::Size));
        assert_eq!(p.due(logged(99, 1), 0, SECS(5)), Some(Trigger::Time));
        assert_eq!(p.due(logged(99, 1), 0, SECS(4)), None);
    }

    #[test]
    fn a_count_of_records_is_due_on_its_own_whatever_their_bytes() {
        let p = CheckpointPolicy { every_bytes: Some(100), every_records: Some(10), every: None };
        assert_eq!(p.due(logged(50, 10), 0, SECS(1)), Some(Trigger::Records));
        assert_eq!(p.due(logged(50, 9), 0, SECS(1)), None);
        // A large checkpoint holds the size rule back, not the count.
        assert_eq!(p.due(logged(400, 10), 1_000, SECS(1)), Some(Trigger::Records));
        assert_eq!(p.due(logged(500, 3), 1_000, SECS(1)), Some(Trigger::Size));
        assert_eq!(p.due(Logged { any: false, bytes: 0, records: 10 }, 0, SECS(1)), None);
    }

    #[test]
    fn a_large_state_waits_for_half_its_size_before_the_next_checkpoint() {
        let p = CheckpointPolicy { every_bytes: Some(100), every_records: None, every: None };
        // A checkpoint smaller than twice the limit changes nothing.
        assert_eq!(p.due(logged(100, 1), 150, SECS(1)), Some(Trigger::Size));
        // A larger one: half its size.
        assert_eq!(p.due(logged(100, 1), 1_000, SECS(1)), None);
        assert_eq!(p.due(logged(499, 1), 1_000, SECS(1)), None);
        assert_eq!(p.due(logged(500, 1), 1_000, SECS(1)), Some(Trigger::Size));
        // Time still triggers on its own.
        let p =
            CheckpointPolicy { every_bytes: Some(100), every_records: None, every: Some(SECS(5)) };
        assert_eq!(p.due(logged(100, 1), 1_000, SECS(5)), Some(Trigger::Time));
    }

    fn serve_args(flags: &[&str]) -> ServeArgs {
        ServeArgs::parse_flags(flags.iter().copied()).unwrap()
    }

    #[test]
    fn flags_default_to_64_mib_and_5_minutes_and_zero_turns_a_trigger_off() {
        let p = CheckpointPolicy::from_args(&serve_args(&[]));
        assert_eq!(
            p,
            CheckpointPolicy {
                every_bytes: Some(64 << 20),
                every_records: Some(150_000),
                every: Some(SECS(300))
            }
        );
        let args = serve_args(&[
            "--checkpoint-every-bytes",
            "0",
            "--checkpoint-every-records",
            "0",
            "--checkpoint-every-secs",
            "7",
        ]);
        let p = CheckpointPolicy::from_args(&args);
        assert_eq!(
            p,
            CheckpointPolicy { every_bytes: None, every_records: None, every: Some(SECS(7)) }
        );
        let all = logged(u64::MAX, u64::MAX);
        assert_eq!(p.due(all, 0, SECS(6)), None);
        let args = serve_args(&["--checkpoint-every-secs", "0"]);
        assert_eq!(CheckpointPolicy::from_args(&args).due(logged(1, 1), 0, SECS(u64::MAX)), None);
    }
}
