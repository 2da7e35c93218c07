//! Moving the log's ends: truncating after an LSN and purging through one.
//!
//! Owns: [`Wal::truncate_after`] and [`Wal::purge_through`] (with its retaining form), what a
//! log that copies another one position for position needs besides [`Wal::append_batch_at`]:
//! a follower of a replicated log drops the records a new leader does not have (its log ends
//! earlier), and drops the records a snapshot replaced (its log begins later, possibly past its
//! own end, when the snapshot came from another node), keeping those a change feed still
//! reads.
//!
//! Guarantees:
//! - Both return only once their change is durable (sled batch written and synced, the
//!   checkpoint file renamed and its directory fsynced), so a restart finds the log ending or
//!   beginning where they left it.
//! - Both wait, under the append lock, until every record already queued is durable: a record
//!   is never removed while the commit thread may still write it, and no append slips between
//!   the wait and the change.
//! - The log stays contiguous: after `truncate_after(n)` the next record gets `n + 1`; after
//!   `purge_through(n)` past the end, the next record gets `n + 1` too.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::checkpoint;
use crate::core::{lock, Core};
use crate::error::{Error, Result};
use crate::handle::{block_on, Wal};
use crate::Lsn;

impl Wal {
    /// Removes every record with LSN > `lsn` and makes that durable; the next record gets
    /// `lsn + 1`. Returns how many stored values were removed (0 when the log already ends at
    /// or before `lsn`). Blocking (use `spawn_blocking`); appends wait meanwhile.
    ///
    /// Records queued but not yet durable are written first, then removed: the records above
    /// `lsn` are gone whether or not a [`crate::Commit`] of theirs resolved. A caller that
    /// truncates must have stopped relying on those records.
    ///
    /// # Errors
    /// [`Error::TruncateBelowCheckpoint`] when the checkpoint covers `lsn + 1` or more (those
    /// records are gone already), [`Error::LogFailed`] on a failed log (and when the removal
    /// itself fails: the log is then failed), [`Error::ShutDown`].
    pub fn truncate_after(&self, lsn: Lsn) -> Result<u64> {
        let core = self.core();
        // Lock order as a checkpoint's: the checkpoint, then the append lock.
        let checkpoint = lock(&core.checkpoint);
        if let Some(at) = *checkpoint {
            if lsn < at {
                return Err(Error::TruncateBelowCheckpoint { lsn, checkpoint: at });
            }
        }
        let mut appender = lock(&core.appender);
        if let Some(e) = core.refuse(&appender) {
            return Err(e);
        }
        let last = appender.next_lsn - 1;
        if lsn >= last {
            return Ok(0);
        }
        // The commit thread takes neither lock, so it drains the queue while they are held.
        block_on(self.wait_durable(last))?;
        let removed =
            core.with_store(|store| store.truncate_after(lsn)).map_err(|e| fail(core, e))?;
        appender.next_lsn = lsn + 1;
        core.last_lsn.store(lsn, Ordering::Release);
        appender.forget_after(lsn);
        // Waiters for the removed LSNs were answered above; the next group advances from here.
        core.progress.send_modify(|p| p.durable = lsn);
        tracing::debug!(lsn, removed, "log truncated after an LSN");
        Ok(removed)
    }

    /// Removes every record with LSN <= `lsn` for good, as a checkpoint with an empty snapshot
    /// at `lsn` does: for a log whose state lives elsewhere (a replicated log, whose state
    /// machine keeps its own snapshots). `lsn` may lie past the end of the log: the log is then
    /// empty and its next record gets `lsn + 1`. Does nothing when the checkpoint is at `lsn`
    /// or later already. Blocking (use `spawn_blocking`).
    ///
    /// It replaces the checkpoint: [`crate::Replayer::checkpoint`] receives an empty snapshot
    /// at `lsn` on the next start. Do not mix it with [`Wal::checkpoint`] on one log.
    ///
    /// # Errors
    /// As [`Wal::checkpoint`] (the log fails when removing the records fails).
    pub fn purge_through(&self, lsn: Lsn) -> Result<()> {
        self.purge_through_retaining(lsn, &|_| false)
    }

    /// [`Wal::purge_through`], except that the records at or below `lsn` for which `retain`
    /// answers `true` stay in the log, as [`Wal::checkpoint_retaining`] keeps them. Unlike a
    /// checkpoint, `lsn` may lie past the durable point (a replicated log purges entries a
    /// quorum of other copies made durable before its own fsync came): it waits for the
    /// records queued to become durable first, and keeps what `retain` says either way.
    ///
    /// # Errors
    /// As [`Wal::purge_through`].
    pub fn purge_through_retaining(&self, lsn: Lsn, retain: &dyn Fn(Lsn) -> bool) -> Result<()> {
        let core = self.core();
        if lock(&core.checkpoint).is_some_and(|at| at >= lsn) {
            return Ok(());
        }
        if lsn <= self.durable_lsn() {
            return self.checkpoint_retaining(lsn, &[], retain);
        }
        let mut current = lock(&core.checkpoint);
        let mut appender = lock(&core.appender);
        if let Some(e) = core.refuse(&appender) {
            return Err(e);
        }
        let last = appender.next_lsn - 1;
        block_on(self.wait_durable(last))?;
        if lsn <= last {
            // Within the log after all (it grew meanwhile): an ordinary checkpoint.
            drop(appender);
            drop(current);
            return self.checkpoint_retaining(lsn, &[], retain);
        }
        // Past the end. The file first: once it is durable, a start ignores every record at or
        // below `lsn` whether or not their removal below completed.
        checkpoint::remove_swept(&core.config.dir)?;
        let bytes = checkpoint::write_with(&core.config.dir, lsn, &mut |_| Ok(()))?;
        *current = Some(lsn);
        core.checkpoint_lsn.store(lsn, Ordering::Release);
        core.checkpoint_bytes.store(bytes, Ordering::Release);
        appender.next_lsn = lsn + 1;
        core.last_lsn.store(lsn, Ordering::Release);
        appender.sizes.clear();
        appender.sizes_first_lsn = lsn + 1;
        appender.bytes_since_checkpoint = 0;
        // Everything up to `lsn` is settled: `wait_durable(lsn)` must not wait for a record
        // that will never be written.
        core.progress.send_modify(|p| p.durable = p.durable.max(lsn));
        let (removed, retained_bytes) = core
            .with_store(|store| {
                let truncated = store.remove_through_except(lsn, retain)?;
                store.with_kept(|kept| checkpoint::note_swept(&core.config.dir, lsn, kept));
                Ok(truncated)
            })
            .map_err(|e| fail(core, e))?;
        appender.retained_bytes = retained_bytes;
        tracing::debug!(lsn, removed, "log purged past its end");
        Ok(())
    }
}

/// Fails the log after a write or sync of its own store failed (what sled holds in memory can
/// no longer be trusted to be on disk), as a failed checkpoint truncation does.
fn fail(core: &Core, e: Error) -> Error {
    if matches!(e, Error::ShutDown) {
        return e;
    }
    let shared = core.failure.set(Arc::new(e));
    core.progress.send_modify(|p| p.failure = Some(Arc::clone(&shared)));
    Error::LogFailed { cause: shared }
}

impl Wal {
    /// Writes `records` (LSN, payload; increasing LSNs, each at or below the checkpoint) into
    /// the log below its checkpoint, where [`Wal::read`] finds them and later checkpoints
    /// keep them while their `retain` says so: for a log whose checkpoint came from another
    /// node (a replicated log given a snapshot), so that it holds the records the snapshot's
    /// state still reads by position (a change feed's retained changes). A record the log
    /// holds already is left as it is. Durable when it returns. Blocking (use
    /// `spawn_blocking`).
    ///
    /// # Errors
    /// An LSN above the checkpoint or out of order ([`Error::InvalidArgument`]), a failed log, I/O and
    /// sled errors (the log is then failed).
    pub fn keep_below_checkpoint(&self, records: &[(Lsn, Vec<u8>)]) -> Result<()> {
        let core = self.core();
        let current = lock(&core.checkpoint);
        let at = current.unwrap_or(0);
        if records.windows(2).any(|w| w[0].0 >= w[1].0) || records.iter().any(|(l, _)| *l > at) {
            return Err(Error::invalid(
                "records kept below a checkpoint come in increasing order, at or below it",
            ));
        }
        if let Some(cause) = core.failure.get() {
            return Err(Error::LogFailed { cause });
        }
        let written = core
            .with_store(|store| {
                let mut kept = store.with_kept(<[_]>::to_vec);
                let mut batch = sled::Batch::default();
                let mut added = 0;
                for (lsn, payload) in records {
                    if kept.iter().any(|k| (k.lsn..=k.last()).contains(lsn)) {
                        continue;
                    }
                    kept.push(crate::layout::entry::put_record(&mut batch, *lsn, payload)?);
                    added += 1;
                }
                if added > 0 {
                    store.write(batch)?;
                    store.sync()?;
                }
                kept.sort_by_key(|k| k.lsn);
                let bytes = kept.iter().map(|k| k.bytes).sum::<u64>();
                checkpoint::note_swept(&core.config.dir, at, &kept);
                store.set_kept(at, kept);
                Ok((added, bytes))
            })
            .map_err(|e| fail(core, e))?;
        lock(&core.appender).retained_bytes = written.1;
        drop(current);
        tracing::debug!(added = written.0, checkpoint = at, "records kept below the checkpoint");
        Ok(())
    }
}
