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
//! Steps 3 and 4 overlap the replayer: records that pass go, in batches, to a worker thread
//! that calls [`Replayer::record`] in LSN order while the walk reads on. After a crash with a
//! long tail, reading sled and replaying cost about the same, so a start takes the longer of
//! the two instead of their sum.

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
    // Step 1.
    if let Some(c) = checkpoint {
        let lsn = c.lsn;
        let read_error = |e| Error::fs("read the checkpoint file's snapshot".to_owned())(e);
        let mut snapshot = c.snapshot().map_err(read_error)?;
        replayer
            .checkpoint(lsn, &mut snapshot)
            .map_err(|source| Error::ReplayCheckpoint { lsn, source })?;
    }
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
    let mut sizes = VecDeque::new();
    let mut retained_bytes = 0u64;
    let Some(store) = store else {
        return Ok(Scan { report, sizes, retained_bytes, kept: None });
    };

    // The torn-tail rule applies to the highest key only, so find it before walking.
    let highest = match store.db.last()? {
        Some((k, _)) => Some(lsn_of(&k)?),
        None => None,
    };
    // Collected even in read-only mode (cheap); applied only in repair mode, as one atomic
    // batch, so a crash during recovery leaves either the old or the repaired log.
    let mut repairs = sled::Batch::default();
    let start = match (swept, checkpoint_lsn) {
        (Some(swept), Some(lsn)) if swept.lsn == lsn => {
            report.records_retained = swept.records;
            retained_bytes = swept.bytes;
            lsn.checked_add(1).map(key)
        }
        _ => None,
    };
    let mut items = match start {
        Some(first) => store.db.range(first..),
        None => store.db.iter(),
    }
    .peekable();
    // Step 2: the records at or below the checkpoint come first (keys ascend).
    let mut kept = (start.is_none() && checkpoint_lsn.is_some()).then(Vec::new);
    while let Some(Ok((k, _))) = items.peek() {
        let lsn = lsn_of(k)?;
        if checkpoint_lsn.is_none_or(|c| lsn > c) {
            break;
        }
        let parts = next_record(&mut items)?.expect("peeked");
        if replayer.retains(lsn) {
            let record = Kept::of(lsn, &parts);
            report.records_retained += 1;
            retained_bytes += record.bytes;
            if let Some(kept) = kept.as_mut() {
                kept.push(record);
            }
            continue;
        }
        report.stale_records_truncated += 1;
        for (k, _, _) in parts {
            repairs.remove(k);
        }
    }
    // Steps 3 and 4, in two stages: this thread walks sled and checks frames while a worker
    // decodes and applies the records before them (a long tail after a crash costs about
    // as much in each stage). A bound on the queue bounds the memory of records in flight.
    std::thread::scope(|scope| -> Result<()> {
        let (tx, rx) = crossbeam_channel::bounded::<Batch>(REPLAY_QUEUE);
        let worker = std::thread::Builder::new()
            .name("wal-replay".to_owned())
            .spawn_scoped(scope, move || -> Result<()> {
                for batch in rx {
                    for (lsn, payload) in batch.records {
                        replayer
                            .record(lsn, &payload)
                            .map_err(|source| Error::ReplayRecord { lsn, source })?;
                    }
                }
                Ok(())
            })
            .map_err(Error::fs("start the log replay thread".to_owned()))?;
        let walked =
            walk_tail(&mut items, highest, mode, &mut report, &mut sizes, &mut repairs, &tx);
        drop(tx);
        let replayed = match worker.join() {
            Ok(replayed) => replayed,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        // The worker's error first: the walk stops early only because the worker did.
        replayed.and(walked)
    })?;

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

/// Batches queued between the walk and the replay worker.
const REPLAY_QUEUE: usize = 4;

/// Records handed to the replay worker at once: a hand-off per record would cost more in
/// wake-ups than a small record costs to replay.
#[derive(Default)]
struct Batch {
    records: Vec<(Lsn, Vec<u8>)>,
    bytes: usize,
}

impl Batch {
    /// A batch is sent once it holds this many records or payload bytes.
    const RECORDS: usize = 512;
    const BYTES: usize = 4 << 20;
}

/// Steps 3 and 4 for the records after the checkpoint: checks each, and sends the good ones
/// to the replay worker through `tx`. Stops early, without error, if the worker stopped.
fn walk_tail(
    items: &mut std::iter::Peekable<impl Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>>,
    highest: Option<Lsn>,
    mode: Mode,
    report: &mut RecoveryReport,
    sizes: &mut VecDeque<u32>,
    repairs: &mut sled::Batch,
    tx: &crossbeam_channel::Sender<Batch>,
) -> Result<()> {
    let mut batch = Batch::default();
    while let Some(parts) = next_record(items)? {
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
                // A failed send means the worker failed on an earlier record: its error is
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
        // Fails only if the worker already stopped; its error is the one to report.
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
