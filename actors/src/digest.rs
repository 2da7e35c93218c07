//! The state's digest: one SHA-256 over everything a data dir's recovery rebuilds, so two
//! states (a backup and its restore, later two replicas) can be compared by 32 bytes.
//!
//! Owns: what goes in and in which order. The digest covers the directory, each sheet (its
//! columns; each row's id, parent, version and JSON; its change feed's index: spans, next and
//! oldest `seq`), the idempotency table sorted by key, and the event outbox with its next
//! sequence number, and the webhook table (secrets, positions and attempts included: they
//! are state a start rebuilds). Structured parts are hashed as their JSON (`serde_json` of types whose
//! maps are ordered), never as the log's binary codec, so a new codec format does not change
//! the digest of the same state. Every variable-length part goes in behind its length, so two
//! different states cannot feed the hash the same bytes.
//!
//! Derived indexes (key lookup by hash, child sets, column order, key indexes) are left out:
//! they follow from what is hashed. So is the row-id counter: it may run ahead of the rows
//! (ids taken by writes the log refused are never reused) without the state being different.

use std::fmt;

use sha2::{Digest as _, Sha256};

use crate::directory::DirectoryState;
use crate::record::IdemEntry;
use crate::shared::Event;
use crate::sheet::SheetState;
use crate::webhook::WebhookTable;

/// A state's SHA-256, shown as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct StateDigest(pub [u8; 32]);

impl fmt::Display for StateDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for StateDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StateDigest({self})")
    }
}

/// The parts of a state, borrowed: whatever holds them (recovery's working state, a backup's
/// copies) hands them over as they are.
pub struct StateParts<'a> {
    /// The directory.
    pub directory: &'a DirectoryState,
    /// Every sheet, in any order.
    pub sheets: Vec<&'a SheetState>,
    /// The stored idempotent answers, in any order.
    pub idem: Vec<IdemEntry>,
    /// The outbox's events.
    pub events: &'a [Event],
    /// The outbox's next sequence number.
    pub next_event_seq: u64,
    /// The webhooks.
    pub webhooks: &'a WebhookTable,
}

/// Feeds the hash, each part behind its length.
struct Feed(Sha256);

impl Feed {
    fn bytes(&mut self, bytes: &[u8]) {
        self.pieces(&[bytes]);
    }

    /// [`Feed::bytes`] of the pieces put together, without putting them together.
    fn pieces(&mut self, pieces: &[&[u8]]) {
        let len: usize = pieces.iter().map(|p| p.len()).sum();
        self.0.update((len as u64).to_le_bytes());
        for piece in pieces {
            self.0.update(piece);
        }
    }

    fn number(&mut self, n: u64) {
        self.0.update(n.to_le_bytes());
    }

    fn json<T: serde::Serialize>(&mut self, value: &T) {
        // Only types made of ordered maps and plain values reach here: they always serialize.
        let text = serde_json::to_vec(value).expect("a state part serializes as JSON");
        self.bytes(&text);
    }
}

/// The digest of `parts`.
pub fn digest(mut parts: StateParts<'_>) -> StateDigest {
    let mut feed = Feed(Sha256::new());
    feed.bytes(b"sheetd state digest 1");
    feed.json(parts.directory);
    parts.sheets.sort_by_key(|s| s.id);
    feed.number(parts.sheets.len() as u64);
    for sheet in parts.sheets {
        feed.number(sheet.id);
        feed.json(&*sheet.columns);
        feed.number(sheet.rows.len() as u64);
        for row in sheet.rows.values() {
            feed.number(row.id);
            feed.number(row.parent_id().map_or(0, |p| p + 1));
            feed.number(row.version());
            let [kept, tail] = row.json_pieces();
            feed.pieces(&[kept.as_bytes(), tail.as_bytes()]);
        }
        feed.number(sheet.changes.next_seq());
        feed.number(sheet.changes.oldest_seq());
        feed.json(&sheet.changes);
    }
    parts.idem.sort_by(|a, b| (a.key_id, &a.idem_key).cmp(&(b.key_id, &b.idem_key)));
    feed.number(parts.idem.len() as u64);
    for entry in &parts.idem {
        feed.json(entry);
    }
    feed.number(parts.next_event_seq);
    feed.number(parts.events.len() as u64);
    for event in parts.events {
        feed.json(event);
    }
    // Ordered by id (a `BTreeMap`).
    feed.json(parts.webhooks);
    StateDigest(feed.0.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts<'a>(directory: &'a DirectoryState, idem: Vec<IdemEntry>) -> StateParts<'a> {
        static NONE: std::sync::OnceLock<WebhookTable> = std::sync::OnceLock::new();
        let webhooks = NONE.get_or_init(WebhookTable::default);
        StateParts { directory, sheets: Vec::new(), idem, events: &[], next_event_seq: 1, webhooks }
    }

    fn answer(key_id: u64, key: &str) -> IdemEntry {
        IdemEntry {
            key_id,
            idem_key: key.to_owned(),
            fingerprint: [0; 32],
            status: 200,
            body: b"{}".to_vec(),
            request_id: "req_1".to_owned(),
            completed_at: 5,
        }
    }

    #[test]
    fn the_digest_ignores_the_order_parts_come_in_and_sees_any_change() {
        let d = DirectoryState::default();
        let a = digest(parts(&d, vec![answer(1, "a"), answer(2, "b")]));
        let b = digest(parts(&d, vec![answer(2, "b"), answer(1, "a")]));
        assert_eq!(a, b, "the table is hashed sorted");
        let c = digest(parts(&d, vec![answer(1, "a"), answer(2, "c")]));
        assert_ne!(a, c);
        assert_eq!(a.to_string().len(), 64);
    }
}
