//! Checkpoints: writing one, truncating the log it replaces, and compacting the log store
//! after it.
//!
//! Owns: [`Wal::checkpoint`] and its variants, the order of their steps (the file durable
//! before a record it covers is removed, the sweep marker only after the truncation), and the
//! decision to rewrite a log store that has grown far beyond its live records. The file's
//! format is `checkpoint.rs`'s; the store's truncation and rewrite are `log.rs`'s.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::checkpoint;
use crate::core::lock;
use crate::error::{Error, Result};
use crate::fsutil;
use crate::handle::Wal;
use crate::log::{self, LogStore};
use crate::Lsn;

/// A checkpoint rewrites the log store when its files exceed this plus four times the payload
/// bytes after the checkpoint (see [`Wal::compact_if_bloated`]).
const COMPACT_ABOVE_BYTES: u64 = 32 * 1024 * 1024;

/// ... but only while the records to copy (those after the checkpoint and those it retains)
/// are at most this many bytes: appends wait for the whole copy, which took 26 s for the 222 MB
/// a change feed retained on the engine bench's data dir, and sled stored the copy in more
/// space than the original. Tests lower it, to see a large live set left alone.
const COMPACT_MAX_LIVE_BYTES: u64 = if cfg!(test) { 1 << 20 } else { 32 * 1024 * 1024 };

impl Wal {
    /// Write `snapshot` as the checkpoint at `lsn` (must be <= `durable_lsn()`), then truncate
    /// log records <= `lsn`. Blocking (callers use `spawn_blocking`).
    ///
    /// Steps: write `checkpoint.tmp`, fsync it, rename it to `checkpoint`, fsync the data dir;
    /// only then remove the covered records from sled in one batch, flush and fdatasync. A
    /// crash at any point leaves a recoverable dir (see `checkpoint.rs` for each window). If
    /// the truncation fails the checkpoint is still valid; the next recovery removes the
    /// stale records.
    ///
    /// # Errors
    /// [`Error::CheckpointAhead`] if `lsn > durable_lsn()`, [`Error::CheckpointBehind`] if an
    /// existing checkpoint is newer, [`Error::LogFailed`] on a failed log, I/O and sled errors.
    pub fn checkpoint(&self, lsn: Lsn, snapshot: &[u8]) -> Result<()> {
        self.checkpoint_retaining(lsn, snapshot, &|_| false)
    }

    /// [`Wal::checkpoint`], except that the records at or below `lsn` for which `retain`
    /// answers `true` stay in the log, to be read by [`Wal::read`] (a change feed serves old
    /// changes from the records that already hold them). The next recovery asks its replayer
    /// the same question ([`crate::Replayer::retains`]) before treating them as stale, and a
    /// later checkpoint drops the ones no longer retained.
    ///
    /// # Errors
    /// As [`Wal::checkpoint`].
    pub fn checkpoint_retaining(
        &self,
        lsn: Lsn,
        snapshot: &[u8],
        retain: &dyn Fn(Lsn) -> bool,
    ) -> Result<()> {
        self.checkpoint_streamed(
            lsn,
            &mut |out| {
                out.write_all(snapshot)
                    .map_err(Error::fs("write the checkpoint snapshot".to_owned()))
            },
            retain,
        )
    }

    /// [`Wal::checkpoint_retaining`] with the snapshot written by `snapshot` straight into the
    /// checkpoint file (for example by [`crate::codec::encode_to`]): a large state is encoded
    /// without a buffer the size of its snapshot.
    ///
    /// # Errors
    /// As [`Wal::checkpoint`], and whatever `snapshot` returns.
    pub fn checkpoint_streamed(
        &self,
        lsn: Lsn,
        snapshot: &mut dyn FnMut(&mut dyn std::io::Write) -> Result<()>,
        retain: &dyn Fn(Lsn) -> bool,
    ) -> Result<()> {
        let core = self.core();
        // Held to the end: two concurrent checkpoints would race on `checkpoint.tmp`.
        let mut current = lock(&core.checkpoint);
        let started = std::time::Instant::now();
        if let Some(cause) = core.failure.get() {
            return Err(Error::LogFailed { cause });
        }
        let durable = core.durable_lsn();
        if lsn > durable {
            return Err(Error::CheckpointAhead { lsn, durable });
        }
        if let Some(existing) = *current {
            if lsn < existing {
                return Err(Error::CheckpointBehind { lsn, current: existing });
            }
        }
        // A marker for an equal LSN would claim this checkpoint's truncation before it is done.
        checkpoint::remove_swept(&core.config.dir)?;
        // Order matters: the file is durable before a single record it covers is removed.
        let bytes = checkpoint::write_with(&core.config.dir, lsn, snapshot)?;
        *current = Some(lsn);
        core.checkpoint_lsn.store(lsn, Ordering::Release);
        core.checkpoint_bytes.store(bytes, Ordering::Release);
        lock(&core.appender).forget_through(lsn);
        let truncated = core.with_store(|store| {
            let truncated = store.remove_through_except(lsn, retain)?;
            store.with_kept(|kept| checkpoint::note_swept(&core.config.dir, lsn, kept));
            Ok(truncated)
        });
        let removed = match truncated {
            Ok((removed, retained_bytes)) => {
                lock(&core.appender).retained_bytes = retained_bytes;
                removed
            }
            Err(e) => {
                // A failed write or fsync of the log's own store: what sled holds in memory can
                // no longer be trusted to be on disk. Fail the log, so it heals from disk.
                let shared = core.failure.set(Arc::new(e));
                core.progress.send_modify(|p| p.failure = Some(Arc::clone(&shared)));
                return Err(Error::LogFailed { cause: shared });
            }
        };
        tracing::debug!(lsn, removed, "checkpoint written, log truncated");
        core.checkpoints_written.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        core.checkpoint_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.compact_if_bloated()
    }

    /// Rewrites the log store with only its live records when its files have grown far beyond
    /// them: sled reuses the space of truncated records but never gives it back, so after a
    /// burst of writes its files would stay at their high-water mark for good.
    ///
    /// Appends wait (the append lock is held) while the commit thread drains, the live records
    /// (those after the checkpoint, few just after one, and those it retains; at most
    /// [`COMPACT_MAX_LIVE_BYTES`], or there is no rewrite) are copied into `log.next/` and made
    /// durable, and the directories are swapped (`log` → `log.old`, `log.next` → `log`,
    /// directory fsync, `log.old` removed). A crash at any step leaves a dir that
    /// [`log::finish_interrupted_compaction`] completes or undoes at the next open.
    fn compact_if_bloated(&self) -> Result<()> {
        let core = self.core();
        let log_dir = core.config.dir.join(log::DIR_NAME);
        let on_disk = fsutil::tree_size(&log_dir)?;
        let mut appender = lock(&core.appender);
        // Records after the checkpoint count as they decode, so a compressed one counts above
        // what it stores: compaction waits a little longer, never runs early.
        let live = appender.bytes_since_checkpoint + appender.retained_bytes;
        if on_disk <= COMPACT_ABOVE_BYTES + 4 * live || core.failure.get().is_some() {
            return Ok(());
        }
        if live > COMPACT_MAX_LIVE_BYTES {
            tracing::debug!(
                on_disk,
                live,
                "the log store is large against its live records, but too many are live to \
                 rewrite it while appends wait; sled reuses the space"
            );
            return Ok(());
        }
        let Some(tx) = appender.tx.take() else { return Ok(()) };
        drop(tx);
        if let Some(thread) = lock(&core.thread).take() {
            let _ = thread.join();
        }
        let old = core.store.write().unwrap_or_else(|p| p.into_inner()).take();
        let rewritten = old.map_or(Ok(()), |old| log::rewrite_live(&core.config, old));
        let reopened = LogStore::open(&core.config.dir, core.config.cache_capacity_bytes);
        let result = match (rewritten, reopened) {
            (Ok(()), Ok(store)) => {
                *core.store.write().unwrap_or_else(|p| p.into_inner()) = Some(store);
                let (tx, rx) = crossbeam_channel::unbounded();
                appender.tx = Some(tx);
                core.start_commit_thread(rx)
            }
            (Err(e), Ok(store)) => {
                // The old store is intact: go on with it.
                *core.store.write().unwrap_or_else(|p| p.into_inner()) = Some(store);
                let (tx, rx) = crossbeam_channel::unbounded();
                appender.tx = Some(tx);
                core.start_commit_thread(rx)?;
                Err(e)
            }
            (_, Err(e)) => Err(e),
        };
        match &result {
            Ok(()) => tracing::info!(
                before_bytes = on_disk,
                after_bytes = fsutil::tree_size(&log_dir).unwrap_or(0),
                "log store rewritten with its live records only"
            ),
            Err(e) if core.store.read().unwrap_or_else(|p| p.into_inner()).is_none() => {
                // No store to write to: fail the log, so it heals (re-opens) from disk.
                let shared = core.failure.set(Arc::new(Error::fs(
                    "re-open the log after rewriting it".to_owned(),
                )(std::io::Error::other(
                    e.to_string(),
                ))));
                core.progress.send_modify(|p| p.failure = Some(Arc::clone(&shared)));
            }
            Err(_) => {}
        }
        result
    }
}
