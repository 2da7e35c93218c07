//! Healing: re-opening a failed log from disk so that it takes records again.
//!
//! Owns: [`Wal::heal`], the one way out of a failed log short of a restart, and what it must
//! prove before writes resume: the store re-opened from disk, nothing unacknowledged left in
//! it, and everything up to the durable LSN whole and contiguous.

use std::sync::atomic::Ordering;

use crate::checkpoint;
use crate::core::lock;
use crate::error::Result;
use crate::handle::Wal;
use crate::log::{self, LogStore};
use crate::recovery::{self, Mode};
use crate::Lsn;

impl Wal {
    /// Re-opens a failed log from disk and resumes taking records. Returns the durable LSN the
    /// log continues from, or `None` when it had not failed. Blocking (use `spawn_blocking`).
    ///
    /// After a failed write, flush or fsync nothing in memory can be trusted to match the disk
    /// (a failed fsync may have dropped dirty pages silently). So, while appends keep being
    /// refused: stop the commit thread, close sled, open it again from disk (with the same
    /// free-space check as a start), remove every record above the durable LSN (none of them
    /// was acknowledged; a group that failed may have left some on disk), and re-verify every
    /// record after the checkpoint up to the durable LSN, frames and contiguity, as recovery
    /// does. Only then, under the append lock: LSNs continue at durable + 1, [`Wal::epoch`]
    /// moves on, `on_reopen(durable)` runs (before any new record can be appended, so callers
    /// drop what they kept of lost records), a new commit thread starts and the failure clears.
    ///
    /// # Errors
    /// Whatever re-opening or re-verifying found (no space yet, the device still failing,
    /// damage): the log stays failed, and a later call tries again.
    pub fn heal(&self, on_reopen: impl FnOnce(Lsn)) -> Result<Option<Lsn>> {
        let core = self.core();
        let _one_at_a_time = lock(&core.healing);
        if core.failure.get().is_none() {
            return Ok(None);
        }
        // Appends are refused while the failure is set; stop the thread that served them.
        drop(lock(&core.appender).tx.take());
        if let Some(thread) = lock(&core.thread).take() {
            let _ = thread.join();
        }
        drop(core.store.write().unwrap_or_else(|p| p.into_inner()).take());
        let durable = core.durable_lsn();
        log::finish_interrupted_compaction(&core.config.dir)?;
        let store = LogStore::open(&core.config.dir, core.config.cache_capacity_bytes)?;
        let dropped = store.remove_after(durable)?;
        let mut checkpoint = lock(&core.checkpoint).map(checkpoint::Checkpoint::lsn_only);
        let scan = recovery::scan(
            recovery::Store::Open(&store),
            checkpoint.as_mut(),
            None,
            &mut recovery::Discard,
            Mode::ReadOnly,
        )?;
        if scan.report.last_lsn != durable || scan.report.torn_tail_dropped {
            return Err(crate::error::Corruption::Gap {
                first_missing: scan.report.last_lsn + 1,
                last_missing: durable,
                next_present: durable + 1,
            }
            .into());
        }

        let mut appender = lock(&core.appender);
        *core.store.write().unwrap_or_else(|p| p.into_inner()) = Some(store);
        appender.next_lsn = durable + 1;
        core.last_lsn.store(durable, Ordering::Release);
        appender.forget_after(durable);
        core.epoch.fetch_add(1, Ordering::AcqRel);
        on_reopen(durable);
        let (tx, rx) = crossbeam_channel::unbounded();
        appender.tx = Some(tx);
        core.start_commit_thread(rx)?;
        core.failure.clear();
        core.progress.send_modify(|p| {
            p.failure = None;
            p.stopped = false;
        });
        tracing::info!(
            durable_lsn = durable,
            unacknowledged_records_dropped = dropped,
            "write-ahead log re-opened from disk; writes resume"
        );
        Ok(Some(durable))
    }
}
