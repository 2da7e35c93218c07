//! The delivery thread: every active webhook's messages, in order, at least once.
//!
//! # Shape
//!
//! Deliveries run on a thread of their own with its own single-threaded runtime, so no
//! receiver, however slow, takes time from the workers that serve requests or from the sheet
//! actors; and at the background priority ([`crate::priority`]), so that webhooks behind a
//! busy sheet's writes catch up with the CPU its writers leave rather than with theirs. A supervisor starts one task per active webhook (and again when one is made or
//! enabled); a task ends when its webhook is deleted or disabled, or when this node stops
//! serving from its own state (a cluster node that no longer leads: only the leader delivers).
//!
//! # One webhook's loop
//!
//! 1. Check access as a request of its key would be checked (`Caller::of_key` and
//!    `Caller::authorize`): a revoked or expired key, or one that can no longer read the
//!    sheet, disables the webhook (`access_lost`). This runs before every attempt.
//! 2. Fix the message: the one in flight if a record fixed it already, else the durable
//!    changes after `cursor` (up to 100), logged as `Send` and awaited durable before the
//!    first byte leaves. So the message id `msg_<webhook>_<cursor>` names the same changes on
//!    every retry and after any restart: a receiver that sees an id again sees the same body.
//!    With no change waiting, the task waits for the sheet's next durable write.
//! 3. Read those changes back from the feed and render the body (the same bytes every time:
//!    the feed and the cursor codec are deterministic), sign it, and post it with at most
//!    [`MAX_CONNECTIONS`] attempts open at once over the whole server. Message ends are
//!    aligned to multiples of 100, so webhooks behind on one sheet send the same ranges, and
//!    a range's changes are read and rendered once for all of them.
//! 4. Log the outcome (`Attempted`). A 2xx moves the cursor to the message's end and, when the
//!    next changes are there already, fixes the next message in the same record. Anything else
//!    waits 1 s doubling to 10 min (±20 % jitter) and retries; a webhook that has failed for
//!    the disable period without a success is disabled (`failing`); one whose next change has
//!    left the feed's retention, `cursor_expired`.
//!
//! Every time a record carries is decided here, before it is appended: applying a record
//! reads no clock. Memory per webhook is one message, held only while it is sent.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::web;
use actors::model::{Millis, SheetId};
use actors::service::ChangesError;
use actors::sheet::SheetSnapshot;
use actors::webhook::{
    Attempt, DisabledReason, Webhook, WebhookChange, WebhookId, MAX_MESSAGE_CHANGES,
};
use actors::{Service, Target};
use rand::Rng;
use serde_json::value::RawValue;
use tokio::sync::{watch, Semaphore};

use super::{client, sign};
use crate::auth::{Caller, Need};
use crate::cursor::Kind;
use crate::priority::{self, Budget, Pace};
use crate::state::AppState;
use crate::views::{ChangeView, WebhookMessageView};

/// Most delivery attempts open at once, over every webhook: bounds the sockets and the
/// memory of messages being sent, whatever the number of webhooks.
pub const MAX_CONNECTIONS: usize = 256;
/// An attempt without a complete status line by then has failed.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// The first retry waits this long (then twice as long each time).
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(600);
/// An idle webhook re-checks its access this often, so a lost key shows as `access_lost`
/// without waiting for the next write.
const IDLE_RECHECK: Duration = Duration::from_secs(5);
/// After a refusal of the log (no space, a failed disk), a task tries again after this.
const LOG_RETRY: Duration = Duration::from_secs(1);
/// The longest error text kept in `lastDelivery`.
const MAX_ERROR_CHARS: usize = 300;

/// The running delivery thread.
pub struct Deliveries {
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What every webhook task shares.
struct Ctx {
    state: web::Data<AppState>,
    connections: Semaphore,
    stop: watch::Receiver<bool>,
    user_agent: String,
    connector: client::Connector,
    /// The CPU deliveries may take while requests are served; looked at before each step.
    budget: std::sync::Mutex<Budget>,
    /// Held by each paced step ([`PACED_AT_ONCE`]).
    paced: Semaphore,
    /// Messages' changes rendered lately, shared by the webhooks of a sheet.
    rendered: std::sync::Mutex<Rendered>,
}

impl Deliveries {
    /// Starts the thread; it delivers whenever `state` has a domain that serves.
    ///
    /// # Errors
    /// The thread or its runtime cannot be made, or `--webhook-ca-file` cannot be read.
    pub fn start(state: web::Data<AppState>) -> std::io::Result<Deliveries> {
        let settings = &state.webhooks;
        let cpu_percent = settings.cpu_percent;
        let connector = client::Connector::new(settings.allow_private, settings.ca_file.as_deref())
            .map_err(std::io::Error::other)?;
        let (stop, stopped) = watch::channel(false);
        // Deliveries are background work: their thread and its blocking pool (which reads
        // the feed and renders messages) take the CPU requests leave (see `crate::priority`).
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("webhooks-io")
            .on_thread_start(|| crate::priority::lower_to_background("webhooks-io"))
            .build()?;
        let ctx = Arc::new(Ctx {
            state,
            connections: Semaphore::new(MAX_CONNECTIONS),
            stop: stopped,
            user_agent: format!("sheetd/{}", env!("CARGO_PKG_VERSION")),
            connector,
            budget: std::sync::Mutex::new(Budget::new(cpu_percent)),
            paced: Semaphore::new(PACED_AT_ONCE),
            rendered: std::sync::Mutex::default(),
        });
        let thread = std::thread::Builder::new().name("webhooks".into()).spawn(move || {
            crate::priority::lower_to_background("webhooks");
            runtime.block_on(supervise(ctx));
            // Tasks still sending are dropped with the runtime: their messages were not
            // acknowledged in a record, so they are sent again after the next start.
            runtime.shutdown_timeout(Duration::from_millis(100));
        })?;
        Ok(Deliveries { stop, thread: Some(thread) })
    }

    /// Stops every delivery and waits for the thread.
    pub async fn stop(mut self) {
        self.stop.send_replace(true);
        if let Some(thread) = self.thread.take() {
            let _ = actix_web::rt::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

impl Drop for Deliveries {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

/// Starts a task per active webhook that has none, whenever the roster changes (and every
/// second, for a node that starts serving or a change whose appender stopped waiting).
async fn supervise(ctx: Arc<Ctx>) {
    let mut tasks: HashMap<WebhookId, tokio::task::JoinHandle<()>> = HashMap::new();
    let mut roster: Option<watch::Receiver<u64>> = None;
    let mut stop = ctx.stop.clone();
    loop {
        if *stop.borrow() {
            return;
        }
        if let Some(service) = ctx.state.try_service() {
            let roster = roster.get_or_insert_with(|| service.webhooks().subscribe());
            roster.borrow_and_update();
            service.settle_webhooks();
            tasks.retain(|_, task| !task.is_finished());
            for (id, active) in service.webhooks().ids() {
                if active && !tasks.contains_key(&id) {
                    tasks.insert(id, tokio::spawn(run(Arc::clone(&ctx), id)));
                }
            }
        }
        let roster_changed = async {
            match roster.as_mut() {
                Some(r) => {
                    // A store that is gone wakes no one (the timer below still does).
                    if r.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = roster_changed => {}
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.changed() => {}
        }
    }
}

/// What a webhook's task does next.
enum Next {
    /// Go round again at once.
    Again,
    /// Wait this long, then go round again.
    Wait(Duration),
    /// End the task.
    Stop,
}

/// One webhook's task (see the module docs).
async fn run(ctx: Arc<Ctx>, id: WebhookId) {
    let mut stop = ctx.stop.clone();
    loop {
        if *stop.borrow() {
            return;
        }
        let Some(service) = ctx.state.try_service().cloned() else { return };
        let Some(webhook) = service.webhooks().get(id) else { return };
        if !webhook.is_active() {
            return;
        }
        let wait = match step(&ctx, &service, &webhook).await {
            Next::Again => continue,
            Next::Stop => return,
            Next::Wait(wait) => wait,
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Most paced steps at once: while requests are served, webhooks go through the budget a
/// few at a time, so that a thousand starting together cannot overdraw it a thousandfold.
const PACED_AT_ONCE: usize = 4;

/// Waits until the delivery budget allows the next step (see [`crate::priority`]). A paced step holds
/// the returned permit while it runs.
async fn pace(ctx: &Ctx) -> Option<tokio::sync::SemaphorePermit<'_>> {
    let mut permit = None;
    loop {
        let pace = {
            let mut budget = ctx.budget.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            budget.check(Instant::now(), priority::thread_cpu(), ctx.state.metrics.served())
        };
        match pace {
            Pace::Quiet => return None,
            Pace::Go if permit.is_some() => return permit,
            Pace::Go => permit = Some(ctx.paced.acquire().await.ok()?),
            Pace::Wait(wait) => {
                let paced = &ctx.state.metrics.webhooks.paced_micros;
                paced.fetch_add(wait.as_micros() as u64, Ordering::Relaxed);
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// One round of a webhook's loop: at most one attempt.
async fn step(ctx: &Ctx, service: &Service, w: &Webhook) -> Next {
    let paced = pace(ctx).await;
    let now = service.now();
    if !may_read(service, w, now) {
        return disable(service, w, DisabledReason::AccessLost, now).await;
    }
    let Some(published) = service.sheet_published(w.sheet_id) else {
        return disable(service, w, DisabledReason::AccessLost, now).await;
    };
    let mut written = published.subscribe();
    written.borrow_and_update();
    let snapshot = published.load_full();
    if w.cursor < snapshot.state.changes.oldest_seq() {
        return disable(service, w, DisabledReason::CursorExpired, now).await;
    }
    let end = match w.in_flight {
        Some(end) => end,
        None => {
            let next = snapshot.state.changes.next_seq();
            if next <= w.cursor {
                // Waiting for a write is no delivery: the permit goes to another webhook.
                drop(paced);
                let mut stop = ctx.stop.clone();
                // A closed signal disables its branch, so the wait never turns into a spin.
                tokio::select! {
                    Ok(()) = written.changed() => {}
                    () = tokio::time::sleep(IDLE_RECHECK) => {}
                    Ok(()) = stop.changed() => {}
                }
                return Next::Again;
            }
            let end = message_end(w.cursor, next);
            if let Err(e) = service.change_webhook(WebhookChange::Send { id: w.id, end }).await {
                tracing::warn!(webhook = w.id, error = %e, "cannot log a webhook message");
                return Next::Wait(LOG_RETRY);
            }
            end
        }
    };
    let body = match render(ctx, service, w, snapshot, end).await {
        Ok(body) => body,
        Err(ChangesError::Expired { .. }) => {
            return disable(service, w, DisabledReason::CursorExpired, now).await;
        }
        Err(ChangesError::Other(e)) => {
            tracing::warn!(webhook = w.id, error = %e, "cannot read a webhook message's changes");
            return Next::Wait(LOG_RETRY);
        }
    };
    let Ok(url) = super::address::parse(&w.url) else {
        // Checked when it was made; a URL this build reads otherwise fails every attempt.
        return attempted(ctx, service, w, end, failed(now, "the URL is not valid", 0)).await;
    };
    // An attempt waits for its receiver mostly: the permit goes to another webhook (the
    // attempt's own CPU still counts, on this thread's clock, at the next look).
    drop(paced);
    let attempt = {
        let Ok(_connection) = ctx.connections.acquire().await else { return Next::Stop };
        let message_id = w.message_id();
        let timestamp = chrono::Utc::now().timestamp();
        let headers = [
            ("webhook-id", message_id.clone()),
            ("webhook-timestamp", timestamp.to_string()),
            ("webhook-signature", sign::signature(&w.secret, &message_id, timestamp, &body)),
            ("User-Agent", ctx.user_agent.clone()),
        ];
        let at = service.now();
        let started = Instant::now();
        let outcome = ctx.connector.post(&url, &headers, &body, ATTEMPT_TIMEOUT).await;
        let duration_ms = started.elapsed().as_millis() as u64;
        match outcome {
            Ok(status) if (200..300).contains(&status) => {
                Attempt { at, status: Some(status), error: None, duration_ms }
            }
            Ok(status) => Attempt {
                at,
                status: Some(status),
                error: Some(format!("the receiver answered {status}")),
                duration_ms,
            },
            Err(error) => failed(at, &error, duration_ms),
        }
    };
    attempted(ctx, service, w, end, attempt).await
}

/// A failed attempt that got no status.
fn failed(at: Millis, error: &str, duration_ms: u64) -> Attempt {
    let error: String = error.chars().take(MAX_ERROR_CHARS).collect();
    Attempt { at, status: None, error: Some(error), duration_ms }
}

/// Logs `attempt` at the message `[w.cursor, end)` and decides what comes next.
async fn attempted(ctx: &Ctx, service: &Service, w: &Webhook, end: u64, attempt: Attempt) -> Next {
    let metrics = &ctx.state.metrics.webhooks;
    if attempt.acknowledged() {
        metrics.delivered.fetch_add(1, Ordering::Relaxed);
        metrics.changes_delivered.fetch_add(end - w.cursor, Ordering::Relaxed);
        // The next message, when its changes are durable already: fixed in the same record.
        let next = service.sheet_snapshot(w.sheet_id).map_or(0, |s| s.state.changes.next_seq());
        let next_end = (next > end).then(|| message_end(end, next));
        let change = WebhookChange::Attempted { id: w.id, attempt, next_end };
        if let Err(e) = service.change_webhook(change).await {
            // The receiver has the message; it will get it again under the same id.
            tracing::warn!(webhook = w.id, error = %e, "cannot log a webhook delivery");
            return Next::Wait(LOG_RETRY);
        }
        return Next::Again;
    }
    metrics.failed.fetch_add(1, Ordering::Relaxed);
    let at = attempt.at;
    let failing_since = w.failing_since.unwrap_or(at);
    let failures = w.consecutive_failures.saturating_add(1);
    let change = WebhookChange::Attempted { id: w.id, attempt, next_end: None };
    if let Err(e) = service.change_webhook(change).await {
        tracing::warn!(webhook = w.id, error = %e, "cannot log a webhook attempt");
        return Next::Wait(LOG_RETRY);
    }
    let period = ctx.state.webhooks.disable_after.as_millis() as Millis;
    if at.saturating_sub(failing_since) >= period {
        return disable(service, w, DisabledReason::Failing, at).await;
    }
    Next::Wait(backoff(failures))
}

/// The wait before retry number `failures` (from 1): 1 s doubling to 10 min, ±20 %.
fn backoff(failures: u32) -> Duration {
    let doubled = FIRST_BACKOFF.saturating_mul(1 << failures.saturating_sub(1).min(20));
    let base = doubled.min(MAX_BACKOFF).as_secs_f64();
    let jittered = base * rand::thread_rng().gen_range(0.8..1.2);
    Duration::from_secs_f64(jittered.min(MAX_BACKOFF.as_secs_f64()))
}

/// Disables `w` for `reason` and ends its task.
async fn disable(service: &Service, w: &Webhook, reason: DisabledReason, at: Millis) -> Next {
    let change = WebhookChange::Disable { id: w.id, reason, at };
    match service.change_webhook(change).await {
        Ok(()) => {
            tracing::info!(webhook = w.id, reason = reason.as_str(), "webhook disabled");
            Next::Stop
        }
        Err(e) => {
            tracing::warn!(webhook = w.id, error = %e, "cannot log a webhook's disabling");
            Next::Wait(LOG_RETRY)
        }
    }
}

/// Whether `w`'s key may still read its sheet, decided as a request of that key would be.
fn may_read(service: &Service, w: &Webhook, now: Millis) -> bool {
    Caller::of_key(w.key_id, service.directory(), String::new(), now).is_some_and(|caller| {
        caller.authorize(Target::Sheet(w.sheet_id), Need::Read, "Sheet").is_ok()
    })
}

/// The body of the message `[w.cursor, end)`: its changes rendered once for every webhook of
/// the sheet at that range ([`Rendered`]), else read back from the feed (blocking, on the
/// runtime's blocking pool) and rendered; then the webhook's own envelope around them.
async fn render(
    ctx: &Ctx,
    service: &Service,
    w: &Webhook,
    snapshot: Arc<SheetSnapshot>,
    end: u64,
) -> Result<Vec<u8>, ChangesError> {
    let from = w.cursor;
    let key = (w.sheet_id, from, end);
    let cached = ctx.rendered.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(key);
    let data = match cached {
        Some(data) => data,
        None => {
            let data = read_and_render(ctx, service, w.sheet_id, snapshot, from, end).await?;
            let mut rendered =
                ctx.rendered.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            rendered.put(key, Arc::clone(&data));
            data
        }
    };
    let message = WebhookMessageView {
        kind: "sheet.changes",
        webhook_id: w.id,
        sheet_id: w.sheet_id,
        data: &data,
        next_cursor: ctx.state.cursors.encode(Kind::Changes, w.sheet_id, end),
    };
    serde_json::to_vec(&message)
        .map_err(|e| ChangesError::Other(actors::Error::Inconsistent(e.to_string())))
}

/// The changes `[from, end)` of a sheet's feed as the JSON array a message carries.
async fn read_and_render(
    ctx: &Ctx,
    service: &Service,
    sheet_id: SheetId,
    snapshot: Arc<SheetSnapshot>,
    from: u64,
    end: u64,
) -> Result<Arc<RawValue>, ChangesError> {
    let reader = service.clone();
    let limit = usize::try_from(end.saturating_sub(from)).unwrap_or(0);
    let (rendered, cpu) = tokio::task::spawn_blocking(move || {
        let started = priority::thread_cpu();
        let rendered = reader.read_changes(&snapshot, Some(from), limit).and_then(|changes| {
            if changes.len() != limit || changes.first().is_some_and(|c| c.seq != from) {
                return Err(ChangesError::Other(actors::Error::Inconsistent(format!(
                    "the feed of sheet {sheet_id} does not hold changes {from} to {end} whole"
                ))));
            }
            let views: Vec<ChangeView> = changes.iter().map(ChangeView::new).collect();
            serde_json::value::to_raw_value(&views)
                .map_err(|e| ChangesError::Other(actors::Error::Inconsistent(e.to_string())))
        });
        (rendered, priority::thread_cpu().saturating_sub(started))
    })
    .await
    .map_err(|_| ChangesError::Other(actors::Error::Unavailable("the feed reader")))?;
    ctx.budget.lock().unwrap_or_else(std::sync::PoisonError::into_inner).charge(cpu);
    Ok(Arc::from(rendered?))
}

/// Most recently rendered messages' changes, shared by the webhooks of a sheet: a range of a
/// feed never changes (its `seq`s are never reused), and message ends are aligned
/// ([`message_end`]), so webhooks behind on one sheet ask for the same ranges. Bounded in
/// entries; the oldest goes first.
#[derive(Default)]
struct Rendered {
    entries: VecDeque<((SheetId, u64, u64), Arc<RawValue>)>,
}

impl Rendered {
    /// Ranges kept: a hundred changes each, so a few MB at most.
    const MAX: usize = 64;

    fn get(&self, key: (SheetId, u64, u64)) -> Option<Arc<RawValue>> {
        self.entries.iter().find(|(k, _)| *k == key).map(|(_, data)| Arc::clone(data))
    }

    fn put(&mut self, key: (SheetId, u64, u64), data: Arc<RawValue>) {
        if self.get(key).is_some() {
            return;
        }
        if self.entries.len() >= Self::MAX {
            self.entries.pop_front();
        }
        self.entries.push_back((key, data));
    }
}

/// The end of a message starting at `cursor` when the feed's next `seq` is `next`: at most
/// [`MAX_MESSAGE_CHANGES`] changes, ending at a multiple of it where the feed reaches that
/// far. Aligned ends make every webhook behind on a sheet send the same ranges, rendered once
/// ([`Rendered`]); only a webhook's first message after catching up is shorter.
fn message_end(cursor: u64, next: u64) -> u64 {
    let aligned = (cursor / MAX_MESSAGE_CHANGES + 1) * MAX_MESSAGE_CHANGES;
    next.min(aligned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ends_are_aligned_so_webhooks_behind_share_them() {
        assert_eq!(message_end(1, 1000), 100, "a feed starts at seq 1");
        assert_eq!(message_end(100, 1000), 200);
        assert_eq!(message_end(137, 1000), 200, "after catching up, the next one realigns");
        assert_eq!(message_end(137, 150), 150, "never past the feed");
        assert_eq!(message_end(199, 1000), 200);
        for cursor in 1..1000 {
            let end = message_end(cursor, 5000);
            assert!(end > cursor && end - cursor <= MAX_MESSAGE_CHANGES, "{cursor} -> {end}");
        }
    }

    #[test]
    fn rendered_ranges_are_bounded_and_found_by_sheet_and_range() {
        let data = |s: &str| Arc::from(RawValue::from_string(s.to_owned()).unwrap());
        let mut r = Rendered::default();
        r.put((1, 1, 100), data("[1]"));
        r.put((2, 1, 100), data("[2]"));
        assert_eq!(r.get((1, 1, 100)).unwrap().get(), "[1]");
        assert_eq!(r.get((2, 1, 100)).unwrap().get(), "[2]");
        assert!(r.get((1, 100, 200)).is_none());
        for i in 0..Rendered::MAX as u64 {
            r.put((3, i * 100, i * 100 + 100), data("[]"));
        }
        assert_eq!(r.entries.len(), Rendered::MAX);
        assert!(r.get((1, 1, 100)).is_none(), "the oldest went first");
    }

    #[test]
    fn the_backoff_doubles_from_one_second_to_ten_minutes_with_jitter() {
        for (failures, base) in [(1, 1.0), (2, 2.0), (3, 4.0), (10, 512.0)] {
            let wait = backoff(failures).as_secs_f64();
            assert!((base * 0.8..=base * 1.2).contains(&wait), "{failures}: {wait}");
        }
        assert!(backoff(11).as_secs_f64() <= 600.0);
        assert!(backoff(u32::MAX).as_secs_f64() >= 480.0);
    }
}
