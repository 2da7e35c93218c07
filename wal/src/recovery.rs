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
//! 4. Assemble each record (one frame, or its chunks `0..count` in order, each a frame) and
//!    check it. A good record goes to the replayer. A bad frame or a missing chunk on the
//!    *highest* LSN is a torn tail (the only damage a crash can explain): every key of it is
//!    dropped. Damage anywhere else is [`Corruption::Record`], never silently skipped.
//! 5. In [`Mode::Repair`], delete stale records and the torn tail in one durable batch.
//!    In [`Mode::ReadOnly`], only report them.
//!
//! Steps 3 and 4 run on a walker thread: records that pass go, in batches, to the caller's
//! thread, which calls [`Replayer::record`] in LSN order while the walk reads on. With a sweep
//! marker the walker starts before step 1, so after a crash a long tail is read from sled while
//! the checkpoint decodes; only its replay waits for the checkpoint.

use std::collections::VecDeque;

use crate::checkpoint::{Checkpoint, Swept};
use crate::error::{Corruption, Error, FrameDefect, Result};
use crate::log::{key, lsn_of, next_record, Kept, LogStore, Part};
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
}

/// Runs steps 1-5 of the module docs. `store` is `None` when there is no log at all (verify of
/// a data dir without `log/`); `swept` is the sweep marker of `checkpoint`, if the caller trusts
/// one.
pub(crate) fn scan<F: std::io::Read + std::io::Seek>(
    store: Option<&LogStore>,
    checkpoint: Option<&mut Checkpoint<F>>,
    swept: Option<Swept>,
    replayer: &mut dyn Replayer,
    mode: Mode,
) -> Result<Scan> {
    let checkpoint_lsn = checkpoint.as_ref().map(|c| c.lsn);
    let mut report = RecoveryReport {
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
    let mut retained_bytes = 0u64;
    let Some(store) = store else {
        deliver_checkpoint(checkpoint, replayer)?;
        return Ok(Scan { report, sizes: VecDeque::new(), retained_bytes, kept: None });
    };

    // The torn-tail rule applies to the highest key only, so find it before walking.
    let highest = match store.db.last()? {
        Some((k, _)) => Some(lsn_of(&k)?),
        None => None,
    };
    // Collected even in read-only mode (cheap); applied only in repair mode, as one atomic
    // batch, so a crash during recovery leaves either the old or the repaired log.
    let repairs = sled::Batch::default();
    // With a sweep marker, the tail is every record after the checkpoint, and nothing below
    // it needs the replayer: the walk starts at once, beside the checkpoint's decoding.
    let start = match (swept, checkpoint_lsn) {
        (Some(swept), Some(lsn)) if swept.lsn == lsn => {
            report.records_retained = swept.records;
            retained_bytes = swept.bytes;
            lsn.checked_add(1).map(key)
        }
        _ => None,
    };
    let mut kept = (start.is_none() && checkpoint_lsn.is_some()).then(Vec::new);
    let mut tail = Tail { report: report.clone(), sizes: VecDeque::new(), repairs };
    std::thread::scope(|scope| -> Result<()> {
        // Steps 3 and 4 run on a walker that reads sled and checks frames, handing the good
        // records in batches to this thread, which replays them in LSN order: a long tail
        // after a crash is read while the checkpoint decodes, and costs about as much to read
        // as to replay. A bound on the queue bounds the memory of records read ahead.
        let (tx, rx) = crossbeam_channel::bounded::<Batch>(REPLAY_QUEUE);
        let mut walk = Some((&mut tail, tx));
        let mut walker = None;
        if let Some(first) = start {
            let (tail, tx) = walk.take().expect("unused");
            let items = store.db.range(first..).peekable();
            walker = Some(spawn_walk(scope, items, highest, mode, tail, tx)?);
        }
        // Step 1. On an error the walker, if started, stops at its next send.
        deliver_checkpoint(checkpoint, replayer)?;
        if let Some((tail, tx)) = walk.take() {
            // Step 2: the records at or below the checkpoint come first (keys ascend).
            let mut items = store.db.iter().peekable();
            while let Some(Ok((k, _))) = items.peek() {
                let lsn = lsn_of(k)?;
                if checkpoint_lsn.is_none_or(|c| lsn > c) {
                    break;
                }
                let parts = next_record(&mut items)?.expect("peeked");
                if replayer.retains(lsn) {
                    let record = Kept::of(lsn, &parts);
                    tail.report.records_retained += 1;
                    retained_bytes += record.bytes;
                    if let Some(kept) = kept.as_mut() {
                        kept.push(record);
                    }
                    continue;
                }
                tail.report.stale_records_truncated += 1;
                for (k, _, _) in parts {
                    tail.repairs.remove(k);
                }
            }
            walker = Some(spawn_walk(scope, items, highest, mode, tail, tx)?);
        }
        let walker = walker.expect("started above");
        let mut replayed = Ok(());
        'replay: for batch in rx {
            for (lsn, payload) in batch.records {
                if let Err(source) = replayer.record(lsn, &payload) {
                    replayed = Err(Error::ReplayRecord { lsn, source });
                    break 'replay;
                }
            }
        }
        // The receiver is gone here, so a walker still reading stops at its next send.
        let walked = match walker.join() {
            Ok(walked) => walked,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        // The replay's error first: the walk stops early only because the replay did.
        replayed.and(walked)
    })?;
    let Tail { report, sizes, repairs } = tail;

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
    if mode == Mode::Repair && (report.stale_records_truncated > 0 || report.torn_tail_dropped) {
        store.write(repairs)?;
    }
    Ok(Scan { report, sizes, retained_bytes, kept })
}

/// Starts [`walk_tail`] on a thread of `scope`.
fn spawn_walk<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    items: std::iter::Peekable<
        impl Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>> + Send + 'scope,
    >,
    highest: Option<Lsn>,
    mode: Mode,
    tail: &'scope mut Tail,
    tx: crossbeam_channel::Sender<Batch>,
) -> Result<std::thread::ScopedJoinHandle<'scope, Result<()>>> {
    std::thread::Builder::new()
        .name("wal-walk".to_owned())
        .spawn_scoped(scope, move || walk_tail(items, highest, mode, tail, &tx))
        .map_err(Error::fs("start the log walk thread".to_owned()))
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

/// Steps 3 and 4 for the records after the checkpoint: checks each, and sends the good ones
/// to the replay through `tx`. Stops early, without error, if the replay stopped.
fn walk_tail(
    mut items: std::iter::Peekable<impl Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>>,
    highest: Option<Lsn>,
    mode: Mode,
    tail: &mut Tail,
    tx: &crossbeam_channel::Sender<Batch>,
) -> Result<()> {
    let Tail { report, sizes, repairs } = tail;
    let mut batch = Batch::default();
    while let Some(parts) = next_record(&mut items)? {
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
        match assemble(&parts) {
            Ok(payload) => {
                report.records_replayed += 1;
                report.bytes_replayed += payload.len() as u64;
                // Counted as the appender counts it: what the record decodes to.
                let decoded = crate::codec::decoded_len(&payload);
                sizes.push_back(u32::try_from(decoded).unwrap_or(u32::MAX));
                report.last_lsn = lsn;
                batch.bytes += payload.len();
                batch.records.push((lsn, payload));
                let full = batch.records.len() >= Batch::RECORDS || batch.bytes >= Batch::BYTES;
                // A failed send means the replay stopped on an earlier record: its error is
                // the one to report.
                if full && tx.send(std::mem::take(&mut batch)).is_err() {
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
        let _ = tx.send(batch);
    }
    Ok(())
}

/// The payload of one record from its stored values: one whole frame, or chunks `0..count`
/// in order, each a frame of its own, all announcing the same count.
pub(crate) fn assemble(parts: &[Part]) -> std::result::Result<Vec<u8>, FrameDefect> {
    if let [(_, None, stored)] = parts {
        return frame::decode(stored).map(<[u8]>::to_vec);
    }
    let count = match parts.first() {
        Some((_, Some((_, count)), _)) => *count,
        _ => 1,
    };
    let mut payload = Vec::new();
    for (i, (_, chunk, stored)) in parts.iter().enumerate() {
        let index = u32::try_from(i).unwrap_or(u32::MAX);
        if *chunk != Some((index, count)) {
            return Err(FrameDefect::MissingChunk { index, count });
        }
        payload.extend_from_slice(frame::decode(stored)?);
    }
    if parts.len() != count as usize {
        let index = u32::try_from(parts.len()).unwrap_or(u32::MAX);
        return Err(FrameDefect::MissingChunk { index, count });
    }
    Ok(payload)
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
