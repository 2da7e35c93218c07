//! Replaying a data dir: the shared core of [`crate::Wal::recover`] and [`crate::Wal::verify`].
//!
//! Owns: the rules for what counts as a valid log, what is repaired and what is refused.
//!
//! Steps:
//! 1. Deliver the checkpoint (if any) to the replayer.
//! 2. Walk sled in key (= LSN) order. Records with LSN <= the checkpoint LSN are either
//!    *retained* (the replayer still reads them by LSN: kept, not replayed) or *stale* (a crash
//!    hit between writing the checkpoint and truncating the log): skip them. With a sweep
//!    marker for the checkpoint (`checkpoint.rs`) there are no stale ones, and the walk starts
//!    after the checkpoint's LSN without reading the retained records.
//! 3. Every other record must carry the next LSN: checkpoint LSN + 1 (or 1) for the first, then
//!    contiguous. A gap means acknowledged records are missing: [`Corruption::Gap`].
//! 4. Assemble each stored entry (one frame; a record's chunks `0..count` in order, each a
//!    frame; or a pack of several records) and check it. Good records go to the replayer. A bad
//!    frame, pack or missing chunk in the *highest* entry is a torn tail (the only damage a
//!    crash can explain): every key of it is dropped. Damage anywhere else is
//!    [`Corruption::Record`] (naming the entry's first LSN), never silently skipped. A pack
//!    across the checkpoint (a crash before the truncation that splits it) is split: its
//!    records after the checkpoint are replayed, those below are retained or stale.
//! 5. In [`Mode::Repair`], delete stale records and the torn tail in one durable batch.
//!    In [`Mode::ReadOnly`], only report them.
//!
//! Step 1 runs on the caller's thread while a walker thread opens sled (for a start: sled's
//! own recovery) and, with a sweep marker, does steps 3 and 4: records that pass go, in
//! batches, to the caller's thread, which calls [`Replayer::record`] in LSN order once the
//! checkpoint is in. So after a crash a long tail is read from sled while the checkpoint
//! decodes. Without a marker (rare: a crash between a checkpoint and its truncation), step 2
//! needs the replayer, so it and the tail follow step 1 on the caller's thread.

use std::collections::VecDeque;

use crate::checkpoint::{Checkpoint, Swept};
use crate::error::{Corruption, Error, FrameDefect, Result};
use crate::layout::entry::{next_entry, records_of, span, split_entry, Kept};
use crate::layout::keys::{key, lsn_of};
use crate::log::LogStore;
use crate::{frame, Lsn, RecoveryReport, Replayer};

/// Whether the scan may change the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `recover`: delete stale records and a torn tail.
    Repair,
    /// `verify`: change nothing.
    ReadOnly,
}

/// What a scan found, beyond the report.
#[derive(Debug)]
pub(crate) struct Scan {
    /// The report (with `elapsed` still zero; the caller times the whole operation).
    pub(crate) report: RecoveryReport,
    /// Decoded payload sizes of the replayed records, in LSN order (feeds
    /// `bytes_since_checkpoint`).
    pub(crate) sizes: VecDeque<u32>,
    /// Stored bytes of the records at or below the checkpoint that the replayer retains.
    pub(crate) retained_bytes: u64,
    /// Those records, when the scan walked them (no sweep marker was trusted).
    pub(crate) kept: Option<Vec<Kept>>,
    /// The store, when the scan opened it ([`Store::Opening`]).
    pub(crate) opened: Option<LogStore>,
}

/// Where a scan finds the log store.
pub(crate) enum Store<'a> {
    /// No log at all (verify of a data dir without `log/`).
    Absent,
    /// Open already.
    Open(&'a LogStore),
    /// Opened by the scan, on its walk thread while the checkpoint decodes (sled's own recovery
    /// costs a start after a crash about a tenth of a second), and handed back in
    /// [`Scan::opened`].
    Opening(Box<dyn FnOnce() -> Result<LogStore> + Send + 'a>),
}

/// Runs steps 1-5 of the module docs. `swept` is the sweep marker of `checkpoint`, if the
/// caller trusts one.
pub(crate) fn scan<F: std::io::Read + std::io::Seek>(
    store: Store<'_>,
    checkpoint: Option<&mut Checkpoint<F>>,
    swept: Option<Swept>,
    replayer: &mut dyn Replayer,
    mode: Mode,
) -> Result<Scan> {
    let checkpoint_lsn = checkpoint.as_ref().map(|c| c.lsn);
    let report = RecoveryReport {
        checkpoint_lsn,
        records_replayed: 0,
        bytes_replayed: 0,
        last_lsn: checkpoint_lsn.unwrap_or(0),
        torn_tail_dropped: false,
        torn_tail_lsn: None,
        stale_records_truncated: 0,
        records_retained: 0,
        elapsed: std::time::Duration::ZERO,
    };
    // Repairs are collected even in read-only mode (cheap); applied only in repair mode, as
    // one atomic batch, so a crash during recovery leaves either the old or the repaired log.
    let mut tail =
        Tail { report, sizes: VecDeque::new(), repairs: sled::Batch::default(), split: false };
    let (borrowed, open) = match store {
        Store::Absent => {
            deliver_checkpoint(checkpoint, replayer)?;
            let Tail { report, sizes, .. } = tail;
            return Ok(Scan { report, sizes, retained_bytes: 0, kept: None, opened: None });
        }
        Store::Open(store) => (Some(store), None),
        Store::Opening(open) => (None, Some(open)),
    };
    // With a sweep marker, the tail is every record after the checkpoint and nothing below it
    // needs the replayer: the walk runs beside the checkpoint's decoding.
    let early = swept.filter(|s| Some(s.lsn) == checkpoint_lsn && s.lsn < Lsn::MAX);
    let mut retained_bytes = 0u64;
    if let Some(swept) = early {
        tail.report.records_retained = swept.records;
        retained_bytes = swept.bytes;
    }
    let opened = std::thread::scope(|scope| -> Result<Option<LogStore>> {
        // Steps 3 and 4 on a walker that reads sled and checks frames, handing the good records
        // in batches to this thread, which replays them in LSN order. A bound on the queue
        // bounds the memory of records read ahead.
        let (tx, rx) = crossbeam_channel::bounded::<Batch>(REPLAY_QUEUE);
        let tail = &mut tail;
        let walker = std::thread::Builder::new()
            .name("wal-walk".to_owned())
            .spawn_scoped(scope, move || {
                let opened = match open.map(|open| open()).transpose() {
                    Ok(opened) => opened,
                    Err(e) => return (Err(e), Ok(())),
                };
                let walked = match (early, borrowed.or(opened.as_ref())) {
                    (Some(swept), Some(store)) => highest(store).and_then(|highest| {
                        let items = store.db.range(key(swept.lsn + 1)..).peekable();
                        walk_tail(items, highest, mode, tail, &mut |b| tx.send(b).is_ok())
                    }),
                    _ => Ok(()),
                };
                (Ok(opened), walked)
            })
            .map_err(Error::fs("start the log walk thread".to_owned()))?;
        // Step 1, then the records the walker hands on.
        let replayed =
            deliver_checkpoint(checkpoint, replayer).and_then(|()| replay(&rx, replayer));
        // Gone before the join, so a walker waiting on a full queue stops at its send.
        drop(rx);
        let (opened, walked) = match walker.join() {
            Ok(results) => results,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        // A store that does not open explains everything else; the walk stops early only
        // because the replay did, so the replay's error comes before the walk's.
        let opened = opened?;
        replayed?;
        walked?;
        Ok(opened)
    })?;
    let store = borrowed.or(opened.as_ref()).expect("a store was given or opened");
    let mut kept = None;
    if early.is_none() {
        // Step 2: the records at or below the checkpoint come first (keys ascend); which of
        // them are retained, only the replayer knows, and only once it has the checkpoint. The
        // tail follows, replayed as it is read (a start without a marker is rare).
        let highest = highest(store)?;
        let mut items = store.db.iter().peekable();
        kept = checkpoint_lsn.is_some().then(Vec::new);
        while let Some(Ok((k, _))) = items.peek() {
            let lsn = lsn_of(k)?;
            let Some(c) = checkpoint_lsn.filter(|&c| lsn <= c) else {
                break;
            };
            let parts = next_entry(&mut items)?.expect("peeked");
            let (first, last) = span(&parts)?;
            if last > c {
                // A pack across the checkpoint (the crash came before its truncation split
                // it): its records after the checkpoint are the tail's first.
                let retained = (first..=c).any(|lsn| replayer.retains(lsn));
                let (stored, above) = split_entry(&mut tail.repairs, &parts, c, retained)?;
                tail.split = true;
                if !retained {
                    tail.report.stale_records_truncated += c - first + 1;
                }
                for record in stored {
                    tail.report.records_retained += u64::from(record.records());
                    retained_bytes += record.bytes;
                    kept.iter_mut().for_each(|kept| kept.push(record));
                }
                let mut batch = Batch::default();
                for (lsn, payload) in (c + 1..).zip(above) {
                    accept(&mut tail.report, &mut tail.sizes, &mut batch, lsn, payload);
                }
                replay_batch(batch, replayer)?;
                break;
            }
            if (first..=last).any(|lsn| replayer.retains(lsn)) {
                let record = Kept::of(first, &parts);
                tail.report.records_retained += u64::from(record.records());
                retained_bytes += record.bytes;
                if let Some(kept) = kept.as_mut() {
                    kept.push(record);
                }
                continue;
            }
            tail.report.stale_records_truncated += last - first + 1;
            for (k, _, _) in parts {
                tail.repairs.remove(k);
            }
        }
        let mut replayed = Ok(());
        let walked = walk_tail(items, highest, mode, &mut tail, &mut |batch| {
            replayed = replay_batch(batch, replayer);
            replayed.is_ok()
        });
        replayed?;
        walked?;
    }
    let Tail { report, sizes, repairs, split } = tail;

    // Step 5.
    if report.stale_records_truncated > 0 {
        tracing::warn!(
            stale = report.stale_records_truncated,
            checkpoint_lsn,
            read_only = mode == Mode::ReadOnly,
            "found log records already covered by the checkpoint (a crash hit between writing \
             the checkpoint and truncating the log); skipping them, and removing them unless \
             this is verify"
        );
    }
    if mode == Mode::Repair
        && (report.stale_records_truncated > 0 || report.torn_tail_dropped || split)
    {
        store.write(repairs)?;
    }
    Ok(Scan { report, sizes, retained_bytes, kept, opened })
}

/// The highest record's LSN: the torn-tail rule applies to it alone, so it is found before
/// walking.
fn highest(store: &LogStore) -> Result<Option<Lsn>> {
    match store.db.last()? {
        Some((k, _)) => Ok(Some(lsn_of(&k)?)),
        None => Ok(None),
    }
}

/// Replays the batches `rx` brings until the walker is done.
fn replay(rx: &crossbeam_channel::Receiver<Batch>, replayer: &mut dyn Replayer) -> Result<()> {
    rx.iter().try_for_each(|batch| replay_batch(batch, replayer))
}

/// Replays one batch in order; stops at the first record the replayer rejects.
fn replay_batch(batch: Batch, replayer: &mut dyn Replayer) -> Result<()> {
    for (lsn, payload) in batch.records {
        replayer.record(lsn, &payload).map_err(|source| Error::ReplayRecord { lsn, source })?;
    }
    Ok(())
}

/// Step 1: hands the checkpoint's snapshot, if any, to the replayer.
fn deliver_checkpoint<F: std::io::Read + std::io::Seek>(
    checkpoint: Option<&mut Checkpoint<F>>,
    replayer: &mut dyn Replayer,
) -> Result<()> {
    let Some(c) = checkpoint else {
        return Ok(());
    };
    let lsn = c.lsn;
    let read_error = |e| Error::fs("read the checkpoint file's snapshot".to_owned())(e);
    let mut snapshot = c.snapshot().map_err(read_error)?;
    let delivered = replayer.checkpoint(lsn, &mut snapshot);
    // A damaged block fails the replayer's read: the damage is the error to report.
    if let Some(damage) = snapshot.damage() {
        return Err(damage);
    }
    delivered.map_err(|source| Error::ReplayCheckpoint { lsn, source })
}

/// What the walk of the log's tail finds: the report's counts, the sizes of the records it
/// hands on, and the removals a repair applies.
struct Tail {
    report: RecoveryReport,
    sizes: VecDeque<u32>,
    repairs: sled::Batch,
    /// Whether `repairs` splits a pack across the checkpoint.
    split: bool,
}

/// Batches queued between the walk and the replay: up to 192 MiB of records read ahead (or
/// 196,608 small ones), as much as a tail between two default checkpoints (64 MiB) holds.
/// Tests use a short queue of small batches, so a tail of a few thousand records fills it.
const REPLAY_QUEUE: usize = if cfg!(test) { 4 } else { 48 };

/// Records handed to the replay at once: a hand-off per record would cost more in wake-ups
/// than a small record costs to replay.
#[derive(Default)]
struct Batch {
    records: Vec<(Lsn, Vec<u8>)>,
    bytes: usize,
}

impl Batch {
    /// A batch is sent once it holds this many records or payload bytes.
    const RECORDS: usize = if cfg!(test) { 64 } else { 4096 };
    const BYTES: usize = 4 << 20;
}

/// Steps 3 and 4 for the records after the checkpoint: checks each, and hands the good ones
/// in batches to `sink`, which answers whether the replay goes on. Stops early, without
/// error, when it does not.
fn walk_tail(
    mut items: std::iter::Peekable<impl Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>>,
    highest: Option<Lsn>,
    mode: Mode,
    tail: &mut Tail,
    sink: &mut dyn FnMut(Batch) -> bool,
) -> Result<()> {
    let Tail { report, sizes, repairs, .. } = tail;
    let mut batch = Batch::default();
    while let Some(parts) = next_entry(&mut items)? {
        let lsn = lsn_of(&parts[0].0)?;
        // Step 3. Keys ascend, so `lsn` can only be at or beyond the expected one.
        let expected = report.last_lsn + 1;
        if lsn != expected {
            return Err(Corruption::Gap {
                first_missing: expected,
                last_missing: lsn - 1,
                next_present: lsn,
            }
            .into());
        }
        // Step 4.
        match records_of(&parts) {
            Ok(records) => {
                for (lsn, payload) in (lsn..).zip(records) {
                    accept(report, sizes, &mut batch, lsn, payload);
                }
                let full = batch.records.len() >= Batch::RECORDS || batch.bytes >= Batch::BYTES;
                // A failed send means the replay stopped on an earlier record: its error is
                // the one to report.
                if full && !sink(std::mem::take(&mut batch)) {
                    return Ok(());
                }
            }
            // A matching CRC with an unknown version is a newer build's record, not damage:
            // dropping it (even at the tail) would lose acknowledged data.
            Err(FrameDefect::UnknownVersion { found }) => {
                return Err(Error::UnsupportedVersion {
                    what: format!("log record {lsn}"),
                    found,
                    supported: frame::FRAME_VERSION,
                });
            }
            // Only the highest record can be explained by a crash: sled applies each group
            // atomically and later groups are written only after earlier ones are durable.
            Err(defect) if Some(lsn) == highest => {
                tracing::warn!(
                    lsn,
                    %defect,
                    read_only = mode == Mode::ReadOnly,
                    "the last log record is damaged; treating it as a torn tail and dropping it \
                     (verify only reports it). A write cut short by a crash was never \
                     acknowledged, so its loss is expected"
                );
                report.torn_tail_dropped = true;
                report.torn_tail_lsn = Some(lsn);
                for (k, _, _) in parts {
                    repairs.remove(k);
                }
            }
            Err(defect) => return Err(Corruption::Record { lsn, defect }.into()),
        }
    }
    if !batch.records.is_empty() {
        // Fails only if the replay already stopped; its error is the one to report.
        sink(batch);
    }
    Ok(())
}

/// Counts a good record after the checkpoint and adds it to the batch for the replay.
fn accept(
    report: &mut RecoveryReport,
    sizes: &mut VecDeque<u32>,
    batch: &mut Batch,
    lsn: Lsn,
    payload: Vec<u8>,
) {
    report.records_replayed += 1;
    report.bytes_replayed += payload.len() as u64;
    // Counted as the appender counts it: what the record decodes to.
    let decoded = crate::codec::decoded_len(&payload);
    sizes.push_back(u32::try_from(decoded).unwrap_or(u32::MAX));
    report.last_lsn = lsn;
    batch.bytes += payload.len();
    batch.records.push((lsn, payload));
}

/// A replayer that only lets the scan check the log (a heal re-verifies what is on disk; the
/// state it describes is already in memory).
pub(crate) struct Discard;

impl Replayer for Discard {
    fn checkpoint(
        &mut self,
        _: crate::Lsn,
        _: &mut dyn std::io::Read,
    ) -> std::result::Result<(), crate::BoxError> {
        Ok(())
    }

    fn record(&mut self, _: crate::Lsn, _: &[u8]) -> std::result::Result<(), crate::BoxError> {
        Ok(())
    }

    /// A re-verification changes nothing, so records below the checkpoint simply stay.
    fn retains(&self, _: crate::Lsn) -> bool {
        true
    }
}
