//! Webhooks (extension X8): the subscriptions, their delivery positions, and the records that
//! change them.
//!
//! Owns: the webhook table ([`WebhookTable`]) and the one way it changes, applying a
//! [`WebhookChange`] record. Delivering is the server's (`sheetd::webhooks`): it decides what
//! happened (a message formed, an attempt's outcome, a webhook to disable), appends that as a
//! record through [`crate::Service::change_webhook`], and reads the table back. Nothing here
//! knows HTTP.
//!
//! # Model
//!
//! A webhook delivers its sheet's change feed from `cursor` (the `seq` of the next change not
//! yet acknowledged) in *messages* of up to 100 changes. A message is fixed before it is sent:
//! [`WebhookChange::Send`] logs its end, so the message in flight is `[cursor, end)` whatever
//! happens next, and its id (`msg_<webhook>_<cursor>`) names exactly those changes, across
//! retries, restarts and crashes. A 2xx moves `cursor` to `end` ([`WebhookChange::Attempted`],
//! which may also fix the next message when its changes are there already, saving a record).
//!
//! # Guarantees
//!
//! - **Apply is a pure function of the records.** Every time (creation, an attempt, a
//!   disable) is decided before the record is appended and travels in it; applying reads no
//!   clock, no flag and no randomness, so a replay and a follower build the same table.
//! - **Readers see durable changes only.** [`WebhookStore`] queues each change in log order at
//!   its position (inside the append, see [`crate::shared`]) and applies it to the table
//!   readers see once the log says it is durable (`WebhookStore::settle`); a log that lost
//!   records drops the queued changes above what it kept (`WebhookStore::forget_after`).
//! - **The secret is state.** It signs every message, so it is kept in the record and the
//!   checkpoint like any state (a backup carries it); its `Debug` shows nothing of it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::model::{KeyId, Millis, SheetId};

/// A log position (`crate::log::Lsn`, named here by its type so this module stays below the
/// log's in the crate's order: it uses only [`crate::model`]).
type Lsn = u64;

/// A webhook's id: global, from 1, never reused by a durable webhook.
pub type WebhookId = u64;

/// Most changes one message carries.
pub const MAX_MESSAGE_CHANGES: u64 = 100;

/// A signing secret: 32 random bytes, shown once as `whsec_` + base64.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookSecret(pub [u8; 32]);

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never printed: a record or a webhook may reach a log line through `Debug`.
        f.write_str("WebhookSecret(..)")
    }
}

/// Why a webhook stopped delivering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DisabledReason {
    /// No success for the whole disable period (`--webhook-disable-after-secs`).
    Failing,
    /// The key was revoked or expired, or can no longer read the sheet.
    AccessLost,
    /// The next change to deliver has left the feed's retention.
    CursorExpired,
}

impl DisabledReason {
    /// The API's name of the reason.
    pub fn as_str(self) -> &'static str {
        match self {
            DisabledReason::Failing => "failing",
            DisabledReason::AccessLost => "access_lost",
            DisabledReason::CursorExpired => "cursor_expired",
        }
    }
}

/// The outcome of one delivery attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// When the attempt started.
    pub at: Millis,
    /// The receiver's HTTP status, if it answered.
    pub status: Option<u16>,
    /// Why it failed (a non-2xx, a timeout, a refused connection, a refused address), if it did.
    pub error: Option<String>,
    /// How long it took.
    pub duration_ms: u64,
}

impl Attempt {
    /// Whether the receiver acknowledged the message (a 2xx).
    pub fn acknowledged(&self) -> bool {
        self.error.is_none() && self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

/// One subscription.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Webhook {
    /// Its id.
    pub id: WebhookId,
    /// The key that made it: only it sees or changes the webhook, and its access decides
    /// whether deliveries go on.
    pub key_id: KeyId,
    /// The sheet whose changes it delivers.
    pub sheet_id: SheetId,
    /// Where messages are posted.
    pub url: String,
    /// The caller's note.
    pub description: Option<String>,
    /// The signing secret.
    pub secret: WebhookSecret,
    /// `None` while active.
    pub disabled: Option<DisabledReason>,
    /// The `seq` of the next change not yet acknowledged.
    pub cursor: u64,
    /// The end (exclusive) of the message in flight, `[cursor, end)`, once it was formed.
    pub in_flight: Option<u64>,
    /// The last attempt.
    pub last_delivery: Option<Attempt>,
    /// Failed attempts since the last success (or since it was made or enabled).
    pub consecutive_failures: u32,
    /// When the first of those failures happened: the disable period runs from here.
    pub failing_since: Option<Millis>,
    /// When it was made.
    pub created_at: Millis,
}

impl Webhook {
    /// The id of the message in flight (or the next one): the same on every retry of it, and
    /// after a restart, since the message's changes are fixed by a record.
    pub fn message_id(&self) -> String {
        format!("msg_{}_{}", self.id, self.cursor)
    }

    /// Whether it delivers.
    pub fn is_active(&self) -> bool {
        self.disabled.is_none()
    }
}

/// A change to the webhook table: the payload of [`crate::record::Record::Webhook`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WebhookChange {
    /// A new webhook (its id taken from the store under [`crate::Service::create_webhook`]'s
    /// lock).
    Create(Box<Webhook>),
    /// Removed, with its deliveries.
    Delete {
        /// The webhook.
        id: WebhookId,
    },
    /// A disabled webhook resumes where it stopped; its failure count starts over.
    Enable {
        /// The webhook.
        id: WebhookId,
    },
    /// Deliveries stop, for `reason`.
    Disable {
        /// The webhook.
        id: WebhookId,
        /// Why.
        reason: DisabledReason,
        /// When it was decided.
        at: Millis,
    },
    /// The message in flight is fixed: `[cursor, end)`.
    Send {
        /// The webhook.
        id: WebhookId,
        /// Its end, exclusive.
        end: u64,
    },
    /// An attempt to deliver the message in flight ended.
    Attempted {
        /// The webhook.
        id: WebhookId,
        /// What happened.
        attempt: Attempt,
        /// On a success, the end of the next message when its changes were there already.
        next_end: Option<u64>,
    },
}

impl WebhookChange {
    /// The webhook it changes.
    pub fn webhook_id(&self) -> WebhookId {
        match self {
            WebhookChange::Create(w) => w.id,
            WebhookChange::Delete { id }
            | WebhookChange::Enable { id }
            | WebhookChange::Disable { id, .. }
            | WebhookChange::Send { id, .. }
            | WebhookChange::Attempted { id, .. } => *id,
        }
    }
}

/// Every webhook, by id: what a checkpoint holds and a replay rebuilds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookTable {
    /// The webhooks.
    pub webhooks: BTreeMap<WebhookId, Webhook>,
}

impl WebhookTable {
    /// Applies one change: a pure overwrite of the webhook it names. A change naming a webhook
    /// that is gone (deleted while an attempt ran) changes nothing.
    pub fn apply(&mut self, change: &WebhookChange) {
        if let WebhookChange::Create(webhook) = change {
            self.webhooks.insert(webhook.id, (**webhook).clone());
            return;
        }
        if let WebhookChange::Delete { id } = change {
            self.webhooks.remove(id);
            return;
        }
        let Some(w) = self.webhooks.get_mut(&change.webhook_id()) else { return };
        match change {
            WebhookChange::Create(_) | WebhookChange::Delete { .. } => {}
            WebhookChange::Enable { .. } => {
                w.disabled = None;
                w.consecutive_failures = 0;
                w.failing_since = None;
            }
            WebhookChange::Disable { reason, .. } => w.disabled = Some(*reason),
            WebhookChange::Send { end, .. } => w.in_flight = Some(*end),
            WebhookChange::Attempted { attempt, next_end, .. } => {
                if attempt.acknowledged() {
                    w.cursor = w.in_flight.unwrap_or(w.cursor).max(w.cursor);
                    w.in_flight = *next_end;
                    w.consecutive_failures = 0;
                    w.failing_since = None;
                } else {
                    w.consecutive_failures = w.consecutive_failures.saturating_add(1);
                    w.failing_since.get_or_insert(attempt.at);
                }
                w.last_delivery = Some(attempt.clone());
            }
        }
    }

    /// The id after every id held.
    fn next_id(&self) -> WebhookId {
        self.webhooks.keys().next_back().map_or(1, |id| id + 1)
    }
}

/// The live webhook table: the durable one readers see, and the changes appended but not yet
/// durable, in log order (see the module docs).
#[derive(Debug)]
pub struct WebhookStore {
    inner: Mutex<StoreInner>,
    /// Bumped whenever a webhook durably appears, goes, or starts or stops delivering (not
    /// on every delivery), so the delivery side wakes for what it must start.
    roster: tokio::sync::watch::Sender<u64>,
}

#[derive(Debug)]
struct StoreInner {
    /// As of `durable`.
    table: WebhookTable,
    /// Appended changes above `durable`, in log order.
    pending: VecDeque<(Lsn, WebhookChange)>,
    /// The position the table reflects.
    durable: Lsn,
    /// The next id to hand out: above every id durable or pending (an id of a change the
    /// log lost may be handed out again, as no one saw it).
    next_id: WebhookId,
}

impl WebhookStore {
    /// A store over `table` (a recovered state).
    pub fn new(table: WebhookTable) -> Self {
        let next_id = table.next_id();
        WebhookStore {
            inner: Mutex::new(StoreInner { table, pending: VecDeque::new(), durable: 0, next_id }),
            roster: tokio::sync::watch::channel(0).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StoreInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the next id for a webhook about to be created.
    pub(crate) fn reserve_id(&self) -> WebhookId {
        let mut inner = self.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        id
    }

    /// How many webhooks `key_id` has, counting those not yet durable.
    pub(crate) fn count_of_key(&self, key_id: KeyId) -> usize {
        let inner = self.lock();
        let mut table = inner.table.clone();
        for (_, change) in &inner.pending {
            table.apply(change);
        }
        table.webhooks.values().filter(|w| w.key_id == key_id).count()
    }

    /// Queues a change at its position. Called inside the append of its record, so changes
    /// queue in log order.
    pub(crate) fn appended(&self, lsn: Lsn, change: WebhookChange) {
        let mut inner = self.lock();
        if let WebhookChange::Create(w) = &change {
            inner.next_id = inner.next_id.max(w.id + 1);
        }
        inner.pending.push_back((lsn, change));
    }

    /// Applies the queued changes at or below `durable` to the table readers see.
    pub(crate) fn settle(&self, durable: Lsn) {
        let mut inner = self.lock();
        let mut roster_moved = false;
        while inner.pending.front().is_some_and(|(lsn, _)| *lsn <= durable) {
            let Some((_, change)) = inner.pending.pop_front() else { break };
            inner.table.apply(&change);
            roster_moved |=
                !matches!(change, WebhookChange::Send { .. } | WebhookChange::Attempted { .. });
        }
        inner.durable = inner.durable.max(durable);
        drop(inner);
        if roster_moved {
            self.roster.send_modify(|n| *n += 1);
        }
    }

    /// Drops the queued changes above `lsn`: the log lost their records.
    pub(crate) fn forget_after(&self, lsn: Lsn) {
        self.lock().pending.retain(|(at, _)| *at <= lsn);
    }

    /// The table with every change appended so far (durable or not): a checkpoint copies it
    /// inside its marker's append, when every change before the marker has been queued.
    pub(crate) fn snapshot(&self) -> WebhookTable {
        let inner = self.lock();
        let mut table = inner.table.clone();
        for (_, change) in &inner.pending {
            table.apply(change);
        }
        table
    }

    /// A durable webhook.
    pub fn get(&self, id: WebhookId) -> Option<Webhook> {
        self.lock().table.webhooks.get(&id).cloned()
    }

    /// The durable webhooks of `key_id` after id `after`, by id: up to `limit`, and whether
    /// more follow.
    pub fn page_of_key(
        &self,
        key_id: KeyId,
        after: WebhookId,
        limit: usize,
    ) -> (Vec<Webhook>, bool) {
        let inner = self.lock();
        let mut matching = inner
            .table
            .webhooks
            .range(after.saturating_add(1)..)
            .map(|(_, w)| w)
            .filter(|w| w.key_id == key_id);
        let page: Vec<Webhook> = matching.by_ref().take(limit).cloned().collect();
        let more = matching.next().is_some();
        (page, more)
    }

    /// The ids of every durable webhook and whether each is active.
    pub fn ids(&self) -> Vec<(WebhookId, bool)> {
        self.lock().table.webhooks.values().map(|w| (w.id, w.is_active())).collect()
    }

    /// A signal that moves whenever a webhook durably appears, goes, or starts or stops
    /// delivering.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.roster.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(id: WebhookId, key_id: KeyId) -> Webhook {
        Webhook {
            id,
            key_id,
            sheet_id: 10,
            url: "https://example.com/hook".into(),
            description: None,
            secret: WebhookSecret([7; 32]),
            disabled: None,
            cursor: 1,
            in_flight: None,
            last_delivery: None,
            consecutive_failures: 0,
            failing_since: None,
            created_at: 5,
        }
    }

    fn attempt(at: Millis, status: Option<u16>) -> Attempt {
        let ok = status.is_some_and(|s| (200..300).contains(&s));
        Attempt { at, status, error: (!ok).then(|| "refused".into()), duration_ms: 3 }
    }

    #[test]
    fn an_acknowledged_message_moves_the_cursor_to_its_end_and_a_failure_keeps_it() {
        let mut t = WebhookTable::default();
        t.apply(&WebhookChange::Create(Box::new(hook(1, 9))));
        t.apply(&WebhookChange::Send { id: 1, end: 40 });
        assert_eq!(t.webhooks[&1].message_id(), "msg_1_1");
        t.apply(&WebhookChange::Attempted {
            id: 1,
            attempt: attempt(100, Some(500)),
            next_end: None,
        });
        t.apply(&WebhookChange::Attempted { id: 1, attempt: attempt(200, None), next_end: None });
        let w = &t.webhooks[&1];
        assert_eq!((w.cursor, w.in_flight, w.consecutive_failures), (1, Some(40), 2));
        assert_eq!(w.failing_since, Some(100), "the period runs from the first failure");
        assert_eq!(w.message_id(), "msg_1_1", "a retry keeps the message id");
        t.apply(&WebhookChange::Attempted {
            id: 1,
            attempt: attempt(300, Some(204)),
            next_end: Some(60),
        });
        let w = &t.webhooks[&1];
        assert_eq!((w.cursor, w.in_flight, w.consecutive_failures), (40, Some(60), 0));
        assert_eq!((w.failing_since, w.message_id().as_str()), (None, "msg_1_40"));
    }

    #[test]
    fn readers_see_settled_changes_only_and_a_lost_change_is_dropped() {
        let store = WebhookStore::new(WebhookTable::default());
        let id = store.reserve_id();
        store.appended(5, WebhookChange::Create(Box::new(hook(id, 9))));
        assert!(store.get(id).is_none(), "not durable yet");
        assert_eq!(store.count_of_key(9), 1, "the limit counts it already");
        assert_eq!(store.snapshot().webhooks.len(), 1, "a checkpoint copies it");
        store.settle(5);
        assert!(store.get(id).is_some());
        store.appended(6, WebhookChange::Delete { id });
        store.forget_after(5);
        store.settle(6);
        assert!(store.get(id).is_some(), "the lost delete never applies");
        assert_eq!(store.reserve_id(), id + 1);
    }

    #[test]
    fn changes_to_a_deleted_webhook_change_nothing_and_the_secret_never_shows() {
        let mut t = WebhookTable::default();
        t.apply(&WebhookChange::Create(Box::new(hook(1, 9))));
        t.apply(&WebhookChange::Delete { id: 1 });
        t.apply(&WebhookChange::Send { id: 1, end: 3 });
        assert!(t.webhooks.is_empty());
        let shown = format!("{:?}", WebhookChange::Create(Box::new(hook(2, 9))));
        assert!(shown.contains("WebhookSecret(..)") && !shown.contains("[7, 7"), "{shown}");
    }
}
