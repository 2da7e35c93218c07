//! What every actor shares: the log seam, the clock, the global row-id counter, and the two side
//! stores written by many sheets (idempotency responses and the event outbox), and the
//! webhook table's queue of changes.
//!
//! The log stays inside this crate: the HTTP layer reaches it only through the narrow
//! operations of [`crate::Service`], so every record and every side-store change has its owner
//! here.
//!
//! # Why the side stores change in log order
//!
//! The side stores are global while their records come from many actors. Each change to them is
//! made in the `at` callback of [`RecordLog::append`], which runs in log order, so the order of
//! changes equals the order of LSNs. That gives two guarantees cheaply: a checkpoint copies them
//! at an exact LSN by appending a [`crate::record::Record::Marker`] and copying in that
//! callback, and a reader that only trusts entries at or below the durable LSN sees a gap-free
//! prefix (event sequence numbers follow LSN order).
//!
//! `Shared::append` is the one append of the domain: a sheet write's record carries its own
//! stored response and deletions, an answer decided before any sheet was reached gets a
//! [`Record::Idempotency`] of its own, and directory records and markers pass through it too.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::Result;
use crate::log::{codec, AppendOptions, Appended, Lsn, RecordLog};
use crate::model::{KeyId, Millis, RowId, SheetId};
use crate::record::{IdemEntry, Record};
// Defined beside the record that changes it; the actors name it here.
pub use crate::record::Retention;
use crate::webhook::WebhookStore;
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use serde::{Deserialize, Serialize};

/// The service clock: system time plus an offset, so tests can move time forward (for the
/// idempotency window) without sleeping.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    offset_ms: Arc<AtomicI64>,
}

impl Clock {
    /// Now, in milliseconds since the epoch.
    pub fn now(&self) -> Millis {
        chrono::Utc::now().timestamp_millis() + self.offset_ms.load(Ordering::Relaxed)
    }

    /// Move the clock forward (tests only need this; production never calls it).
    pub fn advance(&self, by: Duration) {
        self.offset_ms.fetch_add(by.as_millis() as i64, Ordering::Relaxed);
    }
}

/// The global row-id allocator: ids are strictly increasing and never reused, also across
/// restarts (recovery raises it above every id any record or checkpoint has seen).
#[derive(Debug, Default)]
pub struct RowIds {
    next: AtomicU64,
}

impl RowIds {
    /// Take the next id.
    pub fn allocate(&self) -> RowId {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// The id the next allocation returns.
    pub fn peek(&self) -> RowId {
        self.next.load(Ordering::Relaxed)
    }

    /// Make sure every future id is above `seen`.
    pub fn observe(&self, seen: RowId) {
        self.next.fetch_max(seen + 1, Ordering::Relaxed);
    }
}

/// The state of one idempotency key.
#[derive(Clone, Debug)]
enum Slot {
    /// The first request is still running (since `started`).
    InProgress { fingerprint: [u8; 32], started: Millis },
    /// Completed; replayable once `lsn` is durable.
    Done { entry: Arc<IdemEntry>, lsn: Lsn },
}

/// How long an in-progress claim may stay before it is presumed abandoned.
const STALE_CLAIM_MS: Millis = 3600 * 1000;

/// What [`IdemStore::claim`] found.
#[derive(Debug)]
pub enum Claim {
    /// Nothing stored: the caller now holds the key and must complete or release it.
    Fresh,
    /// A completed request with the same fingerprint: replay it (after `lsn` is durable).
    Replay(Arc<IdemEntry>, Lsn),
    /// The same key is held by a request that is still running.
    InProgress,
    /// The same key was used for a different request.
    Reused,
}

/// Idempotency responses, namespaced per API key, kept for the replay window.
#[derive(Debug)]
pub struct IdemStore {
    slots: DashMap<(KeyId, String), Slot>,
    window_ms: Millis,
}

impl IdemStore {
    /// An empty store with a replay window.
    pub fn new(window: Duration) -> Self {
        IdemStore { slots: DashMap::new(), window_ms: window.as_millis() as Millis }
    }

    /// Look up `key` for `key_id`; take it when it is free (or its record has expired).
    pub fn claim(&self, key_id: KeyId, key: &str, fingerprint: [u8; 32], now: Millis) -> Claim {
        match self.slots.entry((key_id, key.to_owned())) {
            Entry::Vacant(v) => {
                v.insert(Slot::InProgress { fingerprint, started: now });
                Claim::Fresh
            }
            Entry::Occupied(mut o) => match o.get() {
                Slot::Done { entry, .. } if entry.completed_at + self.window_ms <= now => {
                    o.insert(Slot::InProgress { fingerprint, started: now });
                    Claim::Fresh
                }
                Slot::Done { entry, lsn } if entry.fingerprint == fingerprint => {
                    Claim::Replay(entry.clone(), *lsn)
                }
                Slot::InProgress { fingerprint: f, .. } if *f == fingerprint => Claim::InProgress,
                _ => Claim::Reused,
            },
        }
    }

    /// Give a key back when the request ended without a stored response.
    pub fn release(&self, key_id: KeyId, key: &str) {
        self.slots
            .remove_if(&(key_id, key.to_owned()), |_, s| matches!(s, Slot::InProgress { .. }));
    }

    /// Store a completed response. Called inside the append lock of the record carrying it.
    pub fn complete(&self, entry: IdemEntry, lsn: Lsn) {
        let key = (entry.key_id, entry.idem_key.clone());
        self.slots.insert(key, Slot::Done { entry: Arc::new(entry), lsn });
    }

    /// Drop completed responses whose window has passed, and claims whose request never
    /// finished (a write that could not be queued while the service stopped); returns how
    /// many were dropped.
    pub fn purge(&self, now: Millis) -> usize {
        let before = self.slots.len();
        self.slots.retain(|_, s| match s {
            Slot::Done { entry, .. } => entry.completed_at + self.window_ms > now,
            Slot::InProgress { started, .. } => *started + STALE_CLAIM_MS > now,
        });
        before - self.slots.len()
    }

    /// Whether a stored response's window has passed at `now` ([`IdemStore::purge`] would drop
    /// it).
    pub fn any_expired(&self, now: Millis) -> bool {
        self.slots.iter().any(|s| {
            matches!(s.value(), Slot::Done { entry, .. } if entry.completed_at + self.window_ms <= now)
        })
    }

    /// Drop the responses stored by records above `lsn`: a failed log lost those records
    /// (see [`RecordLog::heal`]), so their requests were never answered and may run again.
    pub fn forget_after(&self, lsn: Lsn) {
        self.slots.retain(|_, s| !matches!(s, Slot::Done { lsn: at, .. } if *at > lsn));
    }

    /// Completed responses, for a checkpoint.
    pub fn snapshot(&self) -> Vec<IdemEntry> {
        self.slots
            .iter()
            .filter_map(|s| match s.value() {
                Slot::Done { entry, .. } => Some((**entry).clone()),
                Slot::InProgress { .. } => None,
            })
            .collect()
    }

    /// How many completed responses are held.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

/// One internal event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the outbox, from 1, in log order.
    pub seq: u64,
    /// The event type; `ROW_DELETED` is the only one in v1.
    pub kind: String,
    /// The sheet the row belonged to.
    pub sheet_id: SheetId,
    /// The row deleted.
    pub row_id: RowId,
    /// When it happened.
    pub at: Millis,
    /// The record carrying it; readers only see events whose record is durable.
    #[serde(skip)]
    pub lsn: Lsn,
}

/// How long events stay readable in the outbox: a consumer that falls further behind than this
/// misses events (its `after` points before the oldest one kept).
pub const EVENT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The outbox of internal events (`ROW_DELETED`), in log order.
#[derive(Debug, Default)]
pub struct Outbox {
    inner: Mutex<OutboxInner>,
}

#[derive(Debug, Default)]
struct OutboxInner {
    events: VecDeque<Event>,
    next_seq: u64,
}

impl Outbox {
    /// Record `ROW_DELETED` for each row. Called inside the append lock of the delete's record.
    pub fn row_deleted(&self, sheet_id: SheetId, rows: &[RowId], at: Millis, lsn: Lsn) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for &row_id in rows {
            inner.next_seq += 1;
            let seq = inner.next_seq;
            inner.events.push_back(Event {
                seq,
                kind: "ROW_DELETED".into(),
                sheet_id,
                row_id,
                at,
                lsn,
            });
        }
    }

    /// Up to `limit` events after `after` whose records are durable.
    pub fn read(&self, after: u64, limit: usize, durable: Lsn) -> Vec<Event> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let start = inner.events.partition_point(|e| e.seq <= after);
        inner.events.range(start..).take_while(|e| e.lsn <= durable).take(limit).cloned().collect()
    }

    /// Drop events that happened before `before`; returns how many were dropped. Sequence
    /// numbers are never reused.
    pub fn purge(&self, before: Millis) -> usize {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let old = inner.events.partition_point(|e| e.at < before);
        inner.events.drain(..old);
        old
    }

    /// Whether an event older than `before` is held ([`Outbox::purge`] would drop it).
    pub fn any_before(&self, before: Millis) -> bool {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.events.front().is_some_and(|e| e.at < before)
    }

    /// Drop the events of records above `lsn` (lost with a failed log, never shown: readers
    /// take only durable events) and give their sequence numbers back, so the sequence stays
    /// gap-free.
    pub fn forget_after(&self, lsn: Lsn) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        while inner.events.back().is_some_and(|e| e.lsn > lsn) {
            inner.events.pop_back();
            inner.next_seq -= 1;
        }
    }

    /// Events and the next sequence number, for a checkpoint.
    pub fn snapshot(&self) -> (Vec<Event>, u64) {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        (inner.events.iter().cloned().collect(), inner.next_seq)
    }

    /// Restore from a checkpoint.
    pub fn restore(&self, events: Vec<Event>, next_seq: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.events = events.into();
        inner.next_seq = next_seq;
    }

    /// How many events are held.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).events.len()
    }

    /// Whether no event is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Everything the actors share. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Shared {
    /// The log: every append of the domain goes through [`Shared::append`].
    pub(crate) log: Arc<dyn RecordLog>,
    /// The service clock.
    pub(crate) clock: Clock,
    /// The global row-id allocator.
    pub(crate) row_ids: Arc<RowIds>,
    /// Idempotency responses.
    pub(crate) idem: Arc<IdemStore>,
    /// Internal events.
    pub(crate) outbox: Arc<Outbox>,
    /// How long each sheet keeps its changes.
    pub(crate) retention: Retention,
    /// Webhooks: their changes queue here in log order.
    pub(crate) webhooks: Arc<WebhookStore>,
}

impl Shared {
    /// Append a record, and make the side-store changes it carries in log order, at its LSN:
    /// the stored response of a [`Record::Sheet`] or a [`Record::Idempotency`] goes to the
    /// idempotency store, a sheet write's deletions to the outbox; then `also` runs with the
    /// LSN (a checkpoint copies the side stores there). Other records change no side store.
    ///
    /// # Errors
    /// The log refuses the record (no space, failed, shut down, an older epoch) or it cannot
    /// be encoded; then no side store changed and `also` did not run.
    pub(crate) fn append(
        &self,
        record: &Record,
        options: AppendOptions,
        also: impl FnOnce(Lsn),
    ) -> Result<Appended> {
        // Encoded before the log's ordering is taken: every appender waits on it.
        self.append_encoded(record, codec::encode(record)?, options, also)
    }

    /// [`Shared::append`] of `record` encoded already as `bytes` ([`codec::encode`] of it).
    ///
    /// # Errors
    /// As [`Shared::append`].
    pub(crate) fn append_encoded(
        &self,
        record: &Record,
        bytes: Vec<u8>,
        options: AppendOptions,
        also: impl FnOnce(Lsn),
    ) -> Result<Appended> {
        let (answer, deleted) = match record {
            Record::Sheet(w) => (w.idem.as_ref(), Some((w.sheet_id, &w.deleted, w.at))),
            Record::Idempotency(entry) => (Some(entry), None),
            Record::Import(_)
            | Record::Directory(_)
            | Record::Marker
            | Record::FeedRetention(_)
            | Record::Expire(_)
            | Record::Webhook(_) => (None, None),
        };
        let mut webhook = match record {
            Record::Webhook(change) => Some(change.clone()),
            _ => None,
        };
        // Copied before the log's ordering is taken: every appender waits on it.
        let mut answer = answer.cloned();
        let mut also = Some(also);
        self.log.append_encoded(bytes, options, &mut |lsn| {
            if let Some(entry) = answer.take() {
                self.idem.complete(entry, lsn);
            }
            if let Some((sheet_id, rows, at)) = deleted {
                self.outbox.row_deleted(sheet_id, rows, at, lsn);
            }
            if let Some(change) = webhook.take() {
                self.webhooks.appended(lsn, change);
            }
            if let Some(also) = also.take() {
                also(lsn);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(fingerprint: [u8; 32], completed_at: Millis) -> IdemEntry {
        IdemEntry {
            key_id: 1,
            idem_key: "k".into(),
            fingerprint,
            status: 200,
            body: b"{}".to_vec(),
            request_id: "req_1".into(),
            completed_at,
        }
    }

    #[test]
    fn a_claim_moves_from_fresh_to_in_progress_to_replay_and_expires() {
        let store = IdemStore::new(Duration::from_secs(10));
        let (a, b) = ([1; 32], [2; 32]);
        assert!(matches!(store.claim(1, "k", a, 0), Claim::Fresh));
        assert!(matches!(store.claim(1, "k", a, 1), Claim::InProgress));
        assert!(matches!(store.claim(1, "k", b, 1), Claim::Reused));
        assert!(matches!(store.claim(2, "k", b, 1), Claim::Fresh), "namespaced per API key");
        store.complete(entry(a, 5), 42);
        store.release(1, "k");
        assert!(
            matches!(store.claim(1, "k", a, 6), Claim::Replay(_, 42)),
            "release never drops a stored response"
        );
        assert!(matches!(store.claim(1, "k", b, 6), Claim::Reused));
        assert!(
            matches!(store.claim(1, "k", b, 5 + 10_000), Claim::Fresh),
            "free again after the window"
        );
    }

    #[test]
    fn purge_drops_expired_responses_and_abandoned_claims_only() {
        let store = IdemStore::new(Duration::from_secs(10));
        store.complete(entry([1; 32], 0), 1);
        assert!(matches!(store.claim(9, "running", [3; 32], 0), Claim::Fresh));
        assert_eq!(store.purge(9_999), 0);
        assert_eq!(store.purge(10_000), 1, "the response's window has passed");
        assert_eq!(store.purge(STALE_CLAIM_MS - 1), 0);
        assert_eq!(store.purge(STALE_CLAIM_MS), 1, "a claim nobody finished");
        assert!(store.is_empty());
    }

    #[test]
    fn readers_see_only_events_whose_record_is_durable() {
        let outbox = Outbox::default();
        outbox.row_deleted(10, &[1, 2], 0, 5);
        outbox.row_deleted(11, &[3], 0, 6);
        let seqs = |v: Vec<Event>| v.iter().map(|e| e.seq).collect::<Vec<_>>();
        assert_eq!(seqs(outbox.read(0, 10, 5)), [1, 2]);
        assert_eq!(seqs(outbox.read(0, 10, 6)), [1, 2, 3]);
        assert_eq!(seqs(outbox.read(1, 1, 6)), [2]);
        let (events, next) = outbox.snapshot();
        let copy = Outbox::default();
        copy.restore(events, next);
        copy.row_deleted(10, &[4], 50, 7);
        assert_eq!(seqs(copy.read(3, 10, 7)), [4], "numbering continues after a restore");
        assert_eq!(copy.purge(50), 3, "events before the cut-off are dropped");
        assert_eq!(seqs(copy.read(0, 10, 7)), [4]);
    }

    #[test]
    fn row_ids_only_grow() {
        let ids = RowIds::default();
        ids.observe(41);
        assert_eq!(ids.allocate(), 42);
        ids.observe(10);
        assert_eq!(ids.allocate(), 43);
    }
}
