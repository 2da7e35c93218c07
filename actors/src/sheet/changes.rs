//! A sheet's change feed: which log records hold its row changes, in the order the sheet
//! applied them, numbered by a per-sheet `seq`.
//!
//! # Where changes live
//!
//! Every write's record already holds the rows it wrote, so the feed keeps no copy of a row:
//! [`ChangeLog`] is an index of *spans*, one per record that changed the sheet's rows (its
//! LSN, its time, its first `seq` and how many changes it holds). A page of the feed reads
//! those records back from the log ([`extract`]). The records a span names stay in the log past
//! checkpoints for as long as the span is retained ([`crate::log::RecordLog::checkpoint`]), and the
//! index itself travels in the checkpoint. [`SpanCache`] keeps the decoded changes of records
//! that pages stopped inside, so paging through a large record decodes it once.
//!
//! # Numbering
//!
//! A span's changes are, in order: the record's rows as written (a row at version 1 was
//! created, a later version updated), then its removed rows. `seq`s are assigned when the
//! record is applied, live or in replay alike, so they are gap-free and identical across
//! restarts: a record the log lost (never acknowledged) was never applied and took no `seq`.
//!
//! # Retention
//!
//! [`ChangeLog::prune`] drops the oldest spans once they are both older than the retention
//! time and not among the last `min_changes` changes: "at least N days and at least M changes".

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use crate::log::Lsn;
use imbl::{OrdMap, Vector};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::{Millis, Row, RowId, SheetId};
use crate::record::Record;
use crate::shared::Retention;

/// The changes of one log record to one sheet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChangeSpan {
    /// `seq` of the first change.
    pub first_seq: u64,
    /// How many changes (rows written, then rows removed).
    pub count: u32,
    /// The record holding them.
    pub lsn: Lsn,
    /// When the write happened.
    pub at: Millis,
    /// The last versions of the removed rows, in the record's order: a removed row is gone
    /// from the sheet, and the record names only its id. Encoded as the sequence an
    /// `Arc<[u64]>` was.
    #[serde(deserialize_with = "deserialize_versions")]
    pub deleted_versions: Arc<Vec<u64>>,
}

/// A span as [`ChangeLog`] keeps it: 24 bytes, so 64 of them (one chunk of the persistent
/// vector) fit jemalloc's 1.75 KiB class, where a whole [`ChangeSpan`] took 3 KiB. A retained
/// feed holds one per record of a week (a million patches, a million spans). Its count is the
/// next span's `first_seq` less its own (spans are contiguous), and the versions of the rows
/// it removed, which few records have, are kept beside it by `first_seq`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Span {
    first_seq: u64,
    lsn: Lsn,
    at: Millis,
}

/// `versions` as a span keeps them. Most spans remove no row: theirs share one empty slice
/// instead of an allocation each (a retained feed holds hundreds of thousands of spans, and a
/// start decodes every one).
fn shared_versions(versions: Vec<u64>) -> Arc<Vec<u64>> {
    static NONE: std::sync::LazyLock<Arc<Vec<u64>>> = std::sync::LazyLock::new(Arc::default);
    if versions.is_empty() {
        Arc::clone(&NONE)
    } else {
        Arc::new(versions)
    }
}

fn deserialize_versions<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Arc<Vec<u64>>, D::Error> {
    Vec::deserialize(d).map(shared_versions)
}

/// A sheet's retained changes: the spans in `seq` order.
///
/// Persistent (`imbl`), so a copy for a published snapshot is O(1).
///
/// Invariant: `spans` are in `seq` order and contiguous (each starts where the one before
/// ends, the last ends at `next_seq`), and `deleted` holds an entry for exactly the retained
/// spans that removed rows, under their `first_seq`. Encoded as the list of [`ChangeSpan`]s
/// and `next_seq` it has always been.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChangeLog {
    spans: Vector<Span>,
    /// The last versions of the rows each span removed, for the spans that removed any.
    deleted: OrdMap<u64, Arc<Vec<u64>>>,
    /// The `seq` the next change gets (the first is 1).
    next_seq: u64,
}

/// [`ChangeLog`] as it is encoded.
#[derive(Serialize, Deserialize)]
struct ChangeLogForm<S> {
    spans: S,
    next_seq: u64,
}

impl Serialize for ChangeLog {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        /// The spans, one after the other, without a list of them in memory.
        struct Spans<'a>(&'a ChangeLog);
        impl Serialize for Spans<'_> {
            fn serialize<S: serde::Serializer>(
                &self,
                s: S,
            ) -> std::result::Result<S::Ok, S::Error> {
                s.collect_seq(self.0.spans_at(0))
            }
        }
        ChangeLogForm { spans: Spans(self), next_seq: self.next_seq }.serialize(s)
    }
}

impl<'de> Deserialize<'de> for ChangeLog {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        /// The spans, taken into a log one at a time, without a list of them in memory.
        struct Spans(ChangeLog);
        impl<'de> Deserialize<'de> for Spans {
            fn deserialize<D: serde::Deserializer<'de>>(
                d: D,
            ) -> std::result::Result<Self, D::Error> {
                struct Visit;
                impl<'de> serde::de::Visitor<'de> for Visit {
                    type Value = Spans;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str("a list of change spans")
                    }
                    fn visit_seq<A: serde::de::SeqAccess<'de>>(
                        self,
                        mut seq: A,
                    ) -> std::result::Result<Spans, A::Error> {
                        let mut log = ChangeLog::default();
                        while let Some(span) = seq.next_element::<ChangeSpan>()? {
                            if log.next_seq != 0 && span.first_seq != log.next_seq {
                                return Err(serde::de::Error::custom(format!(
                                    "change span at seq {} does not follow the one before, \
                                     which ends at {}",
                                    span.first_seq, log.next_seq
                                )));
                            }
                            log.push(span.first_seq, span.count, span.lsn, span.at);
                            if !span.deleted_versions.is_empty() {
                                log.deleted.insert(span.first_seq, span.deleted_versions);
                            }
                        }
                        Ok(Spans(log))
                    }
                }
                d.deserialize_seq(Visit)
            }
        }
        let form = ChangeLogForm::<Spans>::deserialize(d)?;
        let mut log = form.spans.0;
        if log.next_seq > form.next_seq {
            return Err(serde::de::Error::custom(format!(
                "the change spans end at seq {}, after the feed's next seq {}",
                log.next_seq, form.next_seq
            )));
        }
        log.next_seq = form.next_seq;
        Ok(log)
    }
}

/// What a change did to its row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    /// The row was added (version 1).
    Created,
    /// The row's cells changed.
    Updated,
    /// The row was removed (alone or with its parent's subtree).
    Deleted,
}

/// One change of the feed.
#[derive(Clone, Debug)]
pub struct Change {
    /// Per-sheet sequence number: strictly increasing, gap-free.
    pub seq: u64,
    /// What happened.
    pub kind: ChangeKind,
    /// The row changed; a subtree's removal gives one change per row.
    pub row_id: RowId,
    /// The row's version after the change (its last one for a removal).
    pub version: u64,
    /// The row after the change; `None` for a removal.
    pub row: Option<Arc<Row>>,
    /// When the write was made, as its record says (so a replay gives the same time).
    pub at: Millis,
}

impl ChangeLog {
    /// The `seq` of the oldest retained change (equal to [`ChangeLog::next_seq`] when none is).
    pub fn oldest_seq(&self) -> u64 {
        self.spans.front().map_or_else(|| self.next_seq(), |s| s.first_seq)
    }

    /// The `seq` the next change will get: a feed position "after everything so far".
    pub fn next_seq(&self) -> u64 {
        self.next_seq.max(1)
    }

    /// Notes `count` changes held by the record at `lsn`.
    pub(crate) fn record(&mut self, lsn: Lsn, at: Millis, count: usize, deleted: Vec<u64>) {
        if count == 0 {
            return;
        }
        let first_seq = self.next_seq();
        let count = u32::try_from(count).unwrap_or(u32::MAX);
        self.push(first_seq, count, lsn, at);
        if !deleted.is_empty() {
            self.deleted.insert(first_seq, Arc::new(deleted));
        }
    }

    /// Appends the span of `count` changes from `first_seq`.
    fn push(&mut self, first_seq: u64, count: u32, lsn: Lsn, at: Millis) {
        self.spans.push_back(Span { first_seq, lsn, at });
        self.next_seq = first_seq + u64::from(count);
    }

    /// The spans from the `index`th on, whole; the iterator knows its length exactly (their
    /// encoding writes it first).
    fn spans_at(&self, index: usize) -> impl Iterator<Item = ChangeSpan> + '_ {
        let index = index.min(self.spans.len());
        let ends = self.spans.focus().narrow(index..).into_iter().skip(1).map(|s| s.first_seq);
        let ends = ends.chain(std::iter::once(self.next_seq()));
        self.spans.focus().narrow(index..).into_iter().zip(ends).map(|(span, end)| ChangeSpan {
            first_seq: span.first_seq,
            count: u32::try_from(end - span.first_seq).unwrap_or(u32::MAX),
            lsn: span.lsn,
            at: span.at,
            deleted_versions: self
                .deleted
                .get(&span.first_seq)
                .map_or_else(|| shared_versions(Vec::new()), Arc::clone),
        })
    }

    /// Drops the oldest spans that `retention` no longer requires at time `now`.
    pub(crate) fn prune(&mut self, now: Millis, retention: Retention) {
        let horizon = now.saturating_sub(i64::from(retention.days) * 86_400_000);
        while let Some(front) = self.spans.front() {
            let end = self.spans.get(1).map_or(self.next_seq(), |next| next.first_seq);
            let after = self.next_seq() - end;
            if front.at >= horizon || after < retention.min_changes {
                break;
            }
            let first_seq = front.first_seq;
            self.spans.pop_front();
            self.deleted.remove(&first_seq);
        }
    }

    /// The LSNs of the records the retained changes live in.
    pub fn lsns(&self) -> impl Iterator<Item = Lsn> + '_ {
        self.spans.iter().map(|s| s.lsn)
    }

    /// The retained spans holding `seq` and later changes, in order.
    pub fn spans_from(&self, seq: u64) -> impl Iterator<Item = ChangeSpan> + '_ {
        // The last span starting at or before `seq` holds it (spans are contiguous).
        let start = match self.spans.binary_search_by(|s| s.first_seq.cmp(&seq)) {
            Ok(i) => i,
            Err(i) => i.saturating_sub(1),
        };
        self.spans_at(start)
    }
}

/// The changes of the spans recent feed pages stopped inside, decoded.
///
/// A page reads its spans' records back from the log, and a record can hold far more changes
/// than a page shows (a bulk write of 2,000 rows, an import of a whole sheet). Without this, a
/// follower reading such a record 500 changes at a time would decode all of it for every
/// page. A span's changes never change while it is retained (its record stays in the log and
/// a row at a version is immutable), so entries are never invalidated: they only age out.
#[derive(Debug, Default)]
pub struct SpanCache {
    /// Oldest first.
    entries: Mutex<VecDeque<CachedSpan>>,
}

/// `(sheet, record)`, and that record's changes of the sheet.
type CachedSpan = ((SheetId, Lsn), Arc<[Change]>);

impl SpanCache {
    /// Entries kept: a few followers each reading through a large record at once.
    const ENTRIES: usize = 8;
    /// Changes kept in all. A larger span (an import) is still kept, alone.
    const CHANGES: usize = 1 << 18;

    /// The changes of `sheet` in record `lsn`, if a page kept them.
    pub fn get(&self, sheet: SheetId, lsn: Lsn) -> Option<Arc<[Change]>> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.iter().find(|(key, _)| *key == (sheet, lsn)).map(|(_, c)| Arc::clone(c))
    }

    /// Keeps `changes` (all of `sheet`'s changes in record `lsn`) for the next page.
    pub fn put(&self, sheet: SheetId, lsn: Lsn, changes: Arc<[Change]>) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.retain(|(key, _)| *key != (sheet, lsn));
        entries.push_back(((sheet, lsn), changes));
        let mut total: usize = entries.iter().map(|(_, c)| c.len()).sum();
        while entries.len() > Self::ENTRIES || (total > Self::CHANGES && entries.len() > 1) {
            if let Some((_, old)) = entries.pop_front() {
                total -= old.len();
            }
        }
    }
}

/// The changes `span` describes, read from its record, for sheet `sheet_id`. `current` looks a
/// row up in the sheet as it is now: a change whose version is current shares that row (and
/// its rendered JSON) instead of the decoded copy.
///
/// # Errors
/// [`Error::Inconsistent`] when the record does not hold the changes the span says it does: the
/// index and the log disagree, which no client can cause.
pub fn extract(
    record: Record,
    sheet_id: SheetId,
    span: &ChangeSpan,
    current: impl Fn(RowId) -> Option<Arc<Row>>,
) -> Result<Vec<Change>> {
    let share = |row: Arc<Row>| match current(row.id) {
        Some(now) if now.version() == row.version() => now,
        _ => row,
    };
    let written = |row: Arc<Row>| {
        let row = share(row);
        let kind = if row.version() == 1 { ChangeKind::Created } else { ChangeKind::Updated };
        (kind, row.id, row.version(), Some(row))
    };
    let found: Vec<(ChangeKind, RowId, u64, Option<Arc<Row>>)> = match record {
        Record::Sheet(write) if write.sheet_id == sheet_id => {
            let removed = write.deleted.iter().zip(span.deleted_versions.iter());
            let mut all: Vec<_> = write.put.into_iter().map(written).collect();
            all.extend(removed.map(|(&id, &v)| (ChangeKind::Deleted, id, v, None)));
            all
        }
        Record::Import(batch) => batch
            .sheets
            .into_iter()
            .filter(|s| s.meta.id == sheet_id)
            .flat_map(|s| s.rows)
            .map(|row| written(Arc::new(row)))
            .collect(),
        _ => Vec::new(),
    };
    if found.len() != span.count as usize {
        return Err(Error::Inconsistent(format!(
            "the log record {} holds {} changes of sheet {sheet_id}, its index says {}",
            span.lsn,
            found.len(),
            span.count
        )));
    }
    Ok(found
        .into_iter()
        .zip(span.first_seq..)
        .map(|((kind, row_id, version, row), seq)| Change {
            seq,
            kind,
            row_id,
            version,
            row,
            at: span.at,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_span_takes_24_bytes() {
        // A retained feed holds a span per record (hundreds of thousands); the persistent
        // vector allocates them 64 at a time, so each byte here is 64 in a chunk's allocation.
        assert!(std::mem::size_of::<Span>() <= 24, "{}", std::mem::size_of::<Span>());
    }

    fn changes(n: usize) -> Arc<[Change]> {
        let change = |seq| Change {
            seq,
            kind: ChangeKind::Deleted,
            row_id: seq,
            version: 1,
            row: None,
            at: 0,
        };
        (1..=n as u64).map(change).collect()
    }

    #[test]
    fn the_span_cache_keeps_the_newest_entries_within_its_bounds() {
        let cache = SpanCache::default();
        for lsn in 1..=SpanCache::ENTRIES as u64 + 1 {
            cache.put(7, lsn, changes(10));
        }
        assert!(cache.get(7, 1).is_none(), "the oldest went first");
        assert_eq!(cache.get(7, 2).map(|c| c.len()), Some(10));
        assert!(cache.get(8, 2).is_none(), "another sheet's record");
        // Putting one again replaces it, not duplicates it.
        cache.put(7, 2, changes(3));
        assert_eq!(cache.get(7, 2).map(|c| c.len()), Some(3));
        // Past the change bound the oldest go, but a larger span is kept alone.
        cache.put(7, 100, changes(SpanCache::CHANGES - 5));
        assert!(cache.get(7, 3).is_none() && cache.get(7, 100).is_some());
        cache.put(7, 101, changes(SpanCache::CHANGES + 1));
        assert!(cache.get(7, 100).is_none());
        assert_eq!(cache.get(7, 101).map(|c| c.len()), Some(SpanCache::CHANGES + 1));
    }

    #[test]
    fn spans_from_any_seq_of_a_long_log_start_at_the_span_holding_it() {
        assert_eq!(ChangeLog::default().spans_from(1).count(), 0);
        // Spans of 2 changes each, enough to span many of the vector's chunks.
        let mut log = ChangeLog::default();
        for lsn in 1..=1000 {
            log.record(lsn, 0, 2, Vec::new());
        }
        for seq in [1, 2, 3, 64, 65, 129, 1000, 1999, 2000, 2001, 5000] {
            let spans: Vec<Lsn> = log.spans_from(seq).map(|s| s.lsn).collect();
            // Change `seq` is in span (seq + 1) / 2; past the end, the last span.
            let first = seq.div_ceil(2).min(1000);
            assert_eq!(spans, (first..=1000).collect::<Vec<_>>(), "seq {seq}");
        }
    }

    /// The log keeps its spans compactly but encodes (in checkpoints, and as JSON in the state
    /// digest) exactly the list of whole spans it always has, and decodes it back.
    #[test]
    fn a_log_encodes_as_its_whole_spans_and_decodes_back() {
        #[derive(Serialize)]
        struct Whole {
            spans: Vec<ChangeSpan>,
            next_seq: u64,
        }
        let mut log = ChangeLog::default();
        for lsn in 1..=300u64 {
            let deleted = if lsn % 7 == 0 { vec![lsn, lsn + 1] } else { Vec::new() };
            log.record(lsn, lsn as i64 * 1000, (lsn % 5 + deleted.len() as u64) as usize, deleted);
        }
        log.prune(10_000_000, Retention { days: 0, min_changes: 400 });
        assert!(log.oldest_seq() > 1, "pruned some");
        let whole = Whole { spans: log.spans_from(0).collect(), next_seq: log.next_seq };
        let span = |lsn: Lsn| whole.spans.iter().find(|s| s.lsn == lsn).cloned();
        assert_eq!(
            span(294).map(|s| (s.count, s.deleted_versions.to_vec())),
            Some((6, vec![294, 295]))
        );
        assert_eq!(span(296).map(|s| (s.count, s.deleted_versions.len())), Some((1, 0)));
        let kept = whole.spans.iter().map(|s| u64::from(s.count)).sum::<u64>();
        assert!(kept >= 400 && kept - u64::from(whole.spans[0].count) < 400, "{kept}");
        assert_eq!(whole.spans[0].first_seq + kept, log.next_seq());
        let bytes = wal::codec::encode(&log).unwrap();
        assert_eq!(bytes, wal::codec::encode(&whole).unwrap());
        assert_eq!(serde_json::to_string(&log).unwrap(), serde_json::to_string(&whole).unwrap());
        let back: ChangeLog = wal::codec::decode(&bytes).unwrap();
        assert_eq!(back, log);
        assert_eq!(back.spans_from(0).collect::<Vec<_>>(), whole.spans);
        // Spans that do not follow one another are a damaged checkpoint.
        let mut gap = whole;
        gap.spans[1].first_seq += 1;
        assert!(wal::codec::decode::<ChangeLog>(&wal::codec::encode(&gap).unwrap()).is_err());
    }

    #[test]
    fn seqs_are_contiguous_and_pruning_keeps_both_minimums() {
        let day = 86_400_000;
        let mut log = ChangeLog::default();
        assert_eq!((log.oldest_seq(), log.next_seq()), (1, 1));
        log.record(10, 0, 3, Vec::new());
        log.record(11, 0, 0, Vec::new());
        log.record(12, day, 2, vec![4, 5]);
        log.record(13, 9 * day, 1, Vec::new());
        assert_eq!((log.oldest_seq(), log.next_seq()), (1, 7));
        assert_eq!(log.lsns().collect::<Vec<_>>(), vec![10, 12, 13]);
        assert_eq!(log.spans_from(4).map(|s| s.lsn).collect::<Vec<_>>(), vec![12, 13]);
        assert_eq!(log.spans_from(5).map(|s| s.lsn).collect::<Vec<_>>(), vec![12, 13]);
        assert_eq!(log.spans_from(3).map(|s| s.lsn).collect::<Vec<_>>(), vec![10, 12, 13]);

        // Old enough but among the last 4 changes: kept.
        log.prune(9 * day, Retention { days: 7, min_changes: 4 });
        assert_eq!(log.oldest_seq(), 1);
        // With a smaller minimum the first span goes; the second is within 7 days.
        log.prune(8 * day - 1, Retention { days: 7, min_changes: 1 });
        assert_eq!(log.oldest_seq(), 4);
        log.prune(9 * day, Retention { days: 7, min_changes: 1 });
        assert_eq!(log.oldest_seq(), 6);
        // The newest span stays while the minimum asks for it.
        log.prune(99 * day, Retention { days: 7, min_changes: 1 });
        assert_eq!((log.oldest_seq(), log.next_seq()), (6, 7));
        log.prune(99 * day, Retention { days: 0, min_changes: 0 });
        assert_eq!((log.oldest_seq(), log.next_seq()), (7, 7));
    }
}
