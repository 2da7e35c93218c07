//! [`Wal`], the public handle, and [`Commit`], the future of one append.
//!
//! Owns: opening (`recover`, `verify`), LSN assignment (the append mutex), the lifecycle of the
//! commit thread (start in `recover`, drain and join in `shutdown`/drop), reads by LSN, and
//! statistics. Checkpoints are `checkpointing.rs`'s and healing is `heal.rs`'s, each an
//! `impl Wal` block of its own.
//!
//! Guarantees:
//! - LSNs are assigned and sent to the commit thread under one mutex, so LSN order is queue
//!   order and no assigned LSN is ever skipped. `append_with`'s closure runs under that mutex
//!   too, so its side effects happen in LSN order.
//! - `Wal` is a cheap `Clone` (one `Arc`), `Send + Sync`. Dropping the last clone shuts the log
//!   down: the queue is drained and flushed, the thread joined, sled closed.
//! - [`Commit`] and [`Wal::wait_durable`] futures are `Send + 'static` and do not keep the
//!   database open: they only hold channel ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Instant;

use tokio::sync::{oneshot, watch};

use crate::checkpoint;
use crate::core::{lock, Appender, Command, Core, FailureCell, FlushStats, Progress, Reply, Size};
use crate::error::{Error, Result};
use crate::fsutil::{self, ScratchDir};
use crate::lock::SharedLock;
use crate::log::{self, LogStore};
use crate::recovery::{self, Mode};
use crate::space::{self, SpaceGuard};
use crate::{Config, Lsn, RecoveryReport, Replayer, WalStats};

/// How an append may be refused beyond the log's own state (see [`Wal::append_with_options`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppendOptions {
    /// The record may use the reserve below the free-space floor: for records that let the log
    /// shrink (a checkpoint's marker) or keep the service governable while writes are refused
    /// (directory changes such as a key revocation).
    pub reserve: bool,
    /// Refuse with [`Error::Reopened`] unless [`Wal::epoch`] still equals this: for a writer
    /// whose in-memory state may hold records a failed log lost, so that it appends nothing
    /// built on them after a [`Wal::heal`] before it has re-read its state.
    pub epoch: Option<u64>,
}

/// Drops the last handle → shuts the log down.
struct Handle {
    /// The shared state; the commit thread holds another reference until it exits.
    core: Arc<Core>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        if let Err(e) = self.core.shutdown() {
            tracing::error!(error = %e, "write-ahead log did not shut down cleanly");
        }
    }
}

/// The write-ahead log. A cheap handle (`Arc` inside): clone it freely; `Send + Sync`.
///
/// Dropping the last clone runs [`Wal::shutdown`], which blocks until the queued records are
/// flushed and sled has closed its files; drop it where blocking briefly is acceptable.
#[derive(Clone)]
pub struct Wal {
    handle: Arc<Handle>,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.core().config.dir)
            .field("last_lsn", &self.last_lsn())
            .field("durable_lsn", &self.durable_lsn())
            .finish_non_exhaustive()
    }
}

impl Wal {
    /// The shared state behind this handle.
    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.handle.core
    }

    /// Open or create the log in `config.dir`, deliver checkpoint + records to the replayer,
    /// drop a torn tail, start the commit thread.
    ///
    /// # Errors
    /// - [`Error::InUse`] if another process (or `Wal`) has the data dir open.
    /// - [`Error::NoSpace`] if the file system lacks the room an open needs (nothing changed).
    /// - [`Error::Corrupt`] for a damaged checkpoint, a damaged record before the end of the
    ///   log, or a gap in the LSNs.
    /// - [`Error::ReplayCheckpoint`] / [`Error::ReplayRecord`] if the replayer fails.
    /// - [`Error::UnsupportedVersion`] for data written by a newer build.
    /// - I/O and sled errors.
    pub fn recover(config: Config, replayer: &mut dyn Replayer) -> Result<(Wal, RecoveryReport)> {
        let started = Instant::now();
        fsutil::ensure_dir(&config.dir)?;
        log::finish_interrupted_compaction(&config.dir)?;
        // The checkpoint and its sweep marker are read before sled's lock is taken: files
        // replaced only by rename, read through handles that keep what they opened. Should
        // another process hold the dir, opening sled fails and the start with it.
        let mut ckpt = checkpoint::read(&config.dir)?;
        let ckpt_lsn = ckpt.as_ref().map(|c| c.lsn);
        let ckpt_bytes = ckpt.as_ref().map_or(0, |c| c.len);
        let marker = ckpt_lsn.and_then(|lsn| checkpoint::read_swept(&config.dir, lsn));
        let swept = marker.as_ref().map(|(swept, _)| *swept);
        // sled opens (its own recovery) while the checkpoint decodes, and the marker's list
        // decodes after it. sled's lock proves no live process owns `checkpoint.tmp`, so that
        // goes only once sled is open.
        let mut listed = None;
        let open = Box::new(|| {
            let store = LogStore::open(&config.dir, config.cache_capacity_bytes)?;
            if checkpoint::remove_leftover_tmp(&config.dir)? {
                tracing::warn!(dir = %config.dir.display(), "removed a checkpoint.tmp left by a crash");
            }
            listed = marker.and_then(|(swept, bytes)| checkpoint::read_kept(&bytes, swept));
            Ok(store)
        });
        let mut scan = recovery::scan(
            recovery::Store::Opening(open),
            ckpt.as_mut(),
            swept,
            replayer,
            Mode::Repair,
        )?;
        let store = scan.opened.take().expect("recovery opened the store");
        if let Some(lsn) = ckpt_lsn {
            match (swept, listed, scan.kept.take()) {
                // The walk removed any stale record: the next start may skip the retained ones.
                (None, _, Some(kept)) => {
                    checkpoint::note_swept(&config.dir, lsn, &kept);
                    store.set_kept(lsn, kept);
                }
                (Some(_), Some(listed), _) => store.set_kept(lsn, listed),
                _ => {}
            }
        }
        let space = SpaceGuard::new(
            &config.dir,
            space::resolve_floor(config.min_free_bytes, &config.dir)?,
        )?;
        let mut report = scan.report;
        report.elapsed = started.elapsed();

        // Unbounded: back-pressure belongs to the callers (they await their Commits); a bound
        // here would block appenders while they hold the append mutex.
        let (tx, rx) = crossbeam_channel::unbounded();
        // Everything recovery read back is on disk already, so it starts out durable.
        let (progress, _) =
            watch::channel(Progress { durable: report.last_lsn, ..Progress::default() });
        let core = Arc::new(Core {
            store: RwLock::new(Some(store)),
            appender: Mutex::new(Appender {
                // Last good + 1: a dropped torn record's LSN is reused (it was never acknowledged).
                next_lsn: report.last_lsn + 1,
                tx: Some(tx),
                bytes_since_checkpoint: scan.sizes.iter().map(|&s| u64::from(s)).sum(),
                sizes: scan.sizes,
                retained_bytes: scan.retained_bytes,
                sizes_first_lsn: report.checkpoint_lsn.unwrap_or(0) + 1,
                space,
            }),
            last_lsn: AtomicU64::new(report.last_lsn),
            progress,
            failure: FailureCell::default(),
            epoch: AtomicU64::new(0),
            healing: Mutex::new(()),
            flush_stats: Mutex::new(FlushStats::default()),
            checkpoint: Mutex::new(report.checkpoint_lsn),
            checkpoint_lsn: AtomicU64::new(report.checkpoint_lsn.unwrap_or(0)),
            checkpoint_bytes: AtomicU64::new(ckpt_bytes),
            checkpoints_written: AtomicU64::new(0),
            checkpoint_nanos: AtomicU64::new(0),
            state_file: Mutex::new(()),
            thread: Mutex::new(None),
            #[cfg(test)]
            fail_next_write: std::sync::atomic::AtomicBool::new(false),
            #[cfg(any(test, feature = "testing"))]
            gate: Mutex::new(()),
            config,
        });
        core.start_commit_thread(rx)?;

        tracing::debug!(
            dir = %core.config.dir.display(),
            checkpoint_lsn = ?report.checkpoint_lsn,
            records = report.records_replayed,
            bytes = report.bytes_replayed,
            last_lsn = report.last_lsn,
            torn_tail_dropped = report.torn_tail_dropped,
            stale_records_truncated = report.stale_records_truncated,
            records_retained = report.records_retained,
            elapsed_ms = report.elapsed.as_millis(),
            "write-ahead log recovered"
        );
        Ok((Wal { handle: Arc::new(Handle { core }) }, report))
    }

    /// Read-only check of a data dir (no writes at all, no torn-tail removal): same replay, and
    /// the report says what it found. Used by `sheetd check`.
    ///
    /// sled writes to its files even when only opened (it recovers its own log and may write a
    /// snapshot), so this copies `log/` into a scratch directory under the system temp dir
    /// (`$TMPDIR`), replays the copy, and deletes it. The data dir is only read. During the copy
    /// a shared lock on sled's data file keeps a server from starting on the dir; a running
    /// server makes this fail with [`Error::InUse`] instead of reading a moving target.
    ///
    /// # Errors
    /// As [`Wal::recover`], plus [`Error::NoDataDir`] if `config.dir` does not exist.
    pub fn verify(config: Config, replayer: &mut dyn Replayer) -> Result<RecoveryReport> {
        let started = Instant::now();
        let dir = &config.dir;
        if !dir.is_dir() {
            return Err(Error::NoDataDir { dir: dir.clone() });
        }
        let log_dir = dir.join(log::DIR_NAME);
        let data_file = log_dir.join(log::DATA_FILE);
        let mut scan = if data_file.exists() {
            // Refuse up front rather than fail half way through the copy.
            let needed = fsutil::tree_size(&log_dir)? + log::OPEN_HEADROOM_BYTES;
            fsutil::require_space("copy the log for checking to", &std::env::temp_dir(), needed)?;
            let scratch = ScratchDir::new("sheetd-wal-verify")?;
            let copy = scratch.path().join(log::DIR_NAME);
            // Lock, then read the checkpoint and copy the log, so both come from one moment.
            // The open file keeps the checkpoint of this moment even if a rename replaces it.
            let mut ckpt = {
                let Some(_lock) = SharedLock::try_new(&data_file)? else {
                    return Err(Error::InUse { dir: dir.clone() });
                };
                let ckpt = checkpoint::read(dir)?;
                fsutil::copy_dir(&log_dir, &copy)?;
                ckpt
            };
            let store = LogStore::open_at(dir, &copy, config.cache_capacity_bytes)?;
            let store_ref = recovery::Store::Open(&store);
            let scan = recovery::scan(store_ref, ckpt.as_mut(), None, replayer, Mode::ReadOnly)?;
            // Close sled before the scratch dir is deleted.
            drop(store);
            scan
        } else {
            // No log yet: only a checkpoint (if any) to check.
            let mut ckpt = checkpoint::read(dir)?;
            recovery::scan(recovery::Store::Absent, ckpt.as_mut(), None, replayer, Mode::ReadOnly)?
        };
        scan.report.elapsed = started.elapsed();
        Ok(scan.report)
    }

    /// Assign the next LSN, call `build(lsn)` to produce the payload, queue it.
    ///
    /// `build` runs while the append lock is held, so LSN order equals queue order and any side
    /// effects `build` performs are ordered exactly like the LSNs (callers rely on this for
    /// consistent snapshots). Keep it short: every appender waits on it.
    ///
    /// If `build` panics, or returns a payload over `u32::MAX` bytes
    /// ([`Error::RecordTooLarge`]), the LSN is not consumed: the next append gets it again.
    ///
    /// # Errors
    /// [`Error::NoSpace`] while free space is below [`Config::min_free_bytes`] (the log stays
    /// healthy; later appends succeed once space is back), [`Error::LogFailed`] after a write
    /// failure, [`Error::ShutDown`] after shutdown, [`Error::RecordTooLarge`],
    /// [`Error::CommitThreadDied`]. `build` is not called when the log refuses the append up
    /// front.
    pub fn append_with(&self, build: impl FnOnce(Lsn) -> Vec<u8>) -> Result<Commit> {
        self.append_built(build, AppendOptions::default())
    }

    /// As [`Wal::append_with`], refused also as `options` says.
    ///
    /// # Errors
    /// As [`Wal::append_with`] (except [`Error::NoSpace`] with `options.reserve`), and
    /// [`Error::Reopened`] when `options.epoch` is not the log's epoch.
    pub fn append_with_options(
        &self,
        options: AppendOptions,
        build: impl FnOnce(Lsn) -> Vec<u8>,
    ) -> Result<Commit> {
        self.append_built(build, options)
    }

    /// [`Wal::append_with`] and [`Wal::append_with_options`].
    fn append_built(
        &self,
        build: impl FnOnce(Lsn) -> Vec<u8>,
        options: AppendOptions,
    ) -> Result<Commit> {
        let core = self.core();
        let mut appender = lock(&core.appender);
        if let Some(e) = core.refuse(&appender) {
            return Err(e);
        }
        let epoch = core.epoch.load(Ordering::Acquire);
        if options.epoch.is_some_and(|seen| seen != epoch) {
            return Err(Error::Reopened { epoch });
        }
        if !options.reserve {
            appender.space.admit()?;
        }
        let lsn = appender.next_lsn;
        // Nothing has changed yet: if `build` panics, the LSN stays unassigned.
        let payload = build(lsn);
        if u32::try_from(payload.len()).is_err() {
            return Err(Error::RecordTooLarge { len: payload.len() });
        }
        let size = Size::of(&payload);
        let commit = send(core, &mut appender, lsn, vec![payload])?;
        appender.push_size(size);
        Ok(commit)
    }

    /// Queue a ready payload under the next LSN.
    ///
    /// # Errors
    /// As [`Wal::append_with`].
    pub fn append(&self, payload: Vec<u8>) -> Result<Commit> {
        self.append_batch(vec![payload])
    }

    /// A batch gets consecutive LSNs and is written atomically (one sled Batch); the Commit
    /// resolves with the last LSN.
    ///
    /// # Errors
    /// As [`Wal::append_with`], plus [`Error::InvalidArgument`] for an empty batch.
    pub fn append_batch(&self, payloads: Vec<Vec<u8>>) -> Result<Commit> {
        self.append_batch_checked(None, payloads)
    }

    /// [`Wal::append_batch`] at LSNs chosen by the caller: `payloads[0]` goes at `first`, which
    /// must be the next LSN ([`Wal::last_lsn`] + 1), checked under the append lock. For a log
    /// that copies another one position for position (a follower of a replicated log), where
    /// a record at any other LSN would be a hole or an overwrite.
    ///
    /// # Errors
    /// As [`Wal::append_batch`], plus [`Error::NotNextLsn`] (nothing queued) when `first` is not
    /// the next LSN.
    pub fn append_batch_at(&self, first: Lsn, payloads: Vec<Vec<u8>>) -> Result<Commit> {
        self.append_batch_checked(Some(first), payloads)
    }

    /// [`Wal::append_batch`], refused unless the next LSN is `expected_first` when given.
    fn append_batch_checked(
        &self,
        expected_first: Option<Lsn>,
        payloads: Vec<Vec<u8>>,
    ) -> Result<Commit> {
        if payloads.is_empty() {
            return Err(Error::invalid("append_batch needs at least one payload"));
        }
        // Check sizes before taking the lock (and before any LSN is assigned).
        if let Some(p) = payloads.iter().find(|p| u32::try_from(p.len()).is_err()) {
            return Err(Error::RecordTooLarge { len: p.len() });
        }
        // Sizes are needed after the payloads have moved into the command.
        let sizes: Vec<Size> = payloads.iter().map(|p| Size::of(p)).collect();
        let core = self.core();
        let mut appender = lock(&core.appender);
        if let Some(e) = core.refuse(&appender) {
            return Err(e);
        }
        let first = appender.next_lsn;
        if let Some(given) = expected_first.filter(|&given| given != first) {
            return Err(Error::NotNextLsn { given, next: first });
        }
        appender.space.admit()?;
        let commit = send(core, &mut appender, first, payloads)?;
        for size in sizes {
            appender.push_size(size);
        }
        Ok(commit)
    }

    /// Highest LSN assigned so far.
    pub fn last_lsn(&self) -> Lsn {
        self.core().last_lsn.load(Ordering::Acquire)
    }

    /// Highest LSN known durable (all LSNs <= it are durable).
    pub fn durable_lsn(&self) -> Lsn {
        self.core().durable_lsn()
    }

    /// Resolves once `durable_lsn() >= lsn` (immediately if already), or `Err` if the log
    /// failed or was shut down before that happened.
    pub fn wait_durable(&self, lsn: Lsn) -> impl Future<Output = Result<()>> + Send + 'static {
        let mut rx = self.core().progress.subscribe();
        async move {
            loop {
                {
                    // Scoped: the borrow guard must not live across the await below.
                    let progress = rx.borrow_and_update();
                    if progress.durable >= lsn {
                        return Ok(());
                    }
                    if let Some(cause) = &progress.failure {
                        return Err(Error::LogFailed { cause: Arc::clone(cause) });
                    }
                    if progress.stopped {
                        return Err(Error::ShutDown);
                    }
                }
                if rx.changed().await.is_err() {
                    // The log was closed; take its final word.
                    let progress = rx.borrow();
                    return if progress.durable >= lsn { Ok(()) } else { Err(Error::ShutDown) };
                }
            }
        }
    }

    /// The payload of the durable record at `lsn`, if the log still holds it (records after
    /// the checkpoint, and those a checkpoint retained). Blocking: a read may reach the disk.
    ///
    /// # Errors
    /// [`Error::Corrupt`] when the stored record fails its frame check (damage, never silently
    /// skipped), [`Error::LogFailed`]-style errors while the log is being re-opened, sled errors.
    pub fn read(&self, lsn: Lsn) -> Result<Option<Vec<u8>>> {
        if lsn == 0 || lsn > self.durable_lsn() {
            return Ok(None);
        }
        self.core().with_store(|store| store.read(lsn))
    }

    /// How many times [`Wal::heal`] has re-opened the log (see [`AppendOptions::epoch`]).
    pub fn epoch(&self) -> u64 {
        self.core().epoch.load(Ordering::Acquire)
    }

    /// Whether the log has failed and takes nothing until [`Wal::heal`] succeeds.
    pub fn is_failed(&self) -> bool {
        self.core().failure.get().is_some()
    }

    /// Counters for metrics.
    pub fn stats(&self) -> WalStats {
        let core = self.core();
        let (records_since_checkpoint, bytes_since_checkpoint, retained_bytes, space, refused) = {
            let appender = lock(&core.appender);
            let space = &appender.space;
            (
                appender.sizes.len() as u64,
                appender.bytes_since_checkpoint,
                appender.retained_bytes,
                (space.free, space.floor, space.is_low()),
                core.refuse(&appender),
            )
        };
        let flush = lock(&core.flush_stats).clone();
        WalStats {
            last_lsn: self.last_lsn(),
            durable_lsn: self.durable_lsn(),
            checkpoint_lsn: core.checkpoint_lsn.load(Ordering::Acquire),
            checkpoint_bytes: core.checkpoint_bytes.load(Ordering::Acquire),
            checkpoints: core.checkpoints_written.load(Ordering::Relaxed),
            checkpoint_seconds_total: core.checkpoint_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            records_since_checkpoint,
            bytes_since_checkpoint,
            retained_bytes,
            flushes: flush.flushes,
            records_flushed: flush.records_flushed,
            flush_seconds_total: flush.flush_seconds_total,
            flush_latency_buckets: flush.latency_buckets.to_vec(),
            batch_size_max: flush.batch_size_max,
            log_bytes_on_disk: core.with_store(|store| Ok(store.size_on_disk())).unwrap_or(0),
            free_bytes: space.0,
            min_free_bytes: space.1,
            writable: !space.2 && refused.is_none(),
        }
    }

    /// Measures free space now (logging when the floor is crossed either way), so that
    /// [`Wal::stats`] and the edge log lines stay current while nothing is appended.
    ///
    /// # Errors
    /// When the file system cannot be asked.
    pub fn refresh_space(&self) -> Result<()> {
        lock(&self.core().appender).space.refresh()
    }

    /// Why the log takes no new records now, as a sentence; `None` when it does.
    pub fn unwritable_reason(&self) -> Option<String> {
        let core = self.core();
        let appender = lock(&core.appender);
        if let Some(e) = core.refuse(&appender) {
            // The whole chain: the OS's own words are what an operator acts on.
            let mut reason = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                reason.push_str(": ");
                reason.push_str(&cause.to_string());
                source = cause.source();
            }
            return Some(reason);
        }
        appender.space.is_low().then(|| {
            format!(
                "free space on the data dir's file system ({} bytes) is below the floor of {} \
                 bytes; writes are refused until space is freed",
                appender.space.free, appender.space.floor
            )
        })
    }

    /// Drain the queue, flush, stop the commit thread. Idempotent: later calls return `Ok`.
    /// Also done on drop of the last handle. Appends after this get [`Error::ShutDown`].
    ///
    /// # Errors
    /// [`Error::LogFailed`] if the log had failed (some records were not made durable),
    /// [`Error::CommitThreadDied`] if the thread panicked.
    pub fn shutdown(&self) -> Result<()> {
        self.core().shutdown()
    }

    /// The data dir this log lives in.
    pub fn dir(&self) -> &std::path::Path {
        &self.core().config.dir
    }

    /// Test hook: make the next group write fail.
    #[cfg(test)]
    pub(crate) fn fail_next_write(&self) {
        self.core().fail_next_write.store(true, Ordering::SeqCst);
    }

    /// Test hook: change the free-space floor of a running log.
    #[cfg(test)]
    pub(crate) fn set_min_free_bytes(&self, floor: u64) {
        let mut appender = lock(&self.core().appender);
        appender.space.floor = floor;
        appender.space.refresh().unwrap();
    }

    /// Test hook (feature `testing`): hold the commit thread before it gathers its next group,
    /// so nothing becomes durable until the guard is dropped.
    #[cfg(any(test, feature = "testing"))]
    pub fn hold_commits(&self) -> std::sync::MutexGuard<'_, ()> {
        lock(&self.core().gate)
    }
}

/// Sends a command for `payloads` starting at `first` and advances the LSN counter; called with
/// the append mutex held so that assignment and queueing are one step.
fn send(
    core: &Core,
    appender: &mut Appender,
    first: Lsn,
    payloads: Vec<Vec<u8>>,
) -> Result<Commit> {
    let count = payloads.len() as u64;
    let (reply, rx) = oneshot::channel();
    let tx = appender.tx.as_ref().ok_or(Error::ShutDown)?;
    tx.send(Command { first_lsn: first, payloads, reply }).map_err(|_| Error::CommitThreadDied)?;
    let last = first + count - 1;
    appender.next_lsn = last + 1;
    core.last_lsn.store(last, Ordering::Release);
    Ok(Commit { first_lsn: first, lsn: last, rx })
}

/// Future resolving to `Ok(lsn)` once the record(s) are durable, `Err` if the flush failed.
/// `Send + 'static`; dropping it does not cancel the write.
// Deliberately not `#[must_use]`: unlike most futures, a Commit does not drive the write
// (the commit thread does), so dropping it is a legitimate "fire and forget".
pub struct Commit {
    /// First LSN of the append (equals `lsn` except for batches).
    first_lsn: Lsn,
    /// LSN the future resolves with (the last of a batch).
    lsn: Lsn,
    /// Answered by the commit thread after the group's fsync.
    rx: oneshot::Receiver<Reply>,
}

impl std::fmt::Debug for Commit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Commit")
            .field("first_lsn", &self.first_lsn)
            .field("lsn", &self.lsn)
            .finish()
    }
}

impl Commit {
    /// The LSN this commit resolves with (the last LSN of a batch).
    pub fn lsn(&self) -> Lsn {
        self.lsn
    }

    /// The first LSN of the append (differs from [`Commit::lsn`] only for batches).
    pub fn first_lsn(&self) -> Lsn {
        self.first_lsn
    }

    /// Blocks the calling thread until the commit resolves. For synchronous callers (tools,
    /// tests); never call it on an async runtime's worker thread.
    ///
    /// # Errors
    /// As awaiting the commit.
    pub fn wait(self) -> Result<Lsn> {
        block_on(self)
    }
}

impl Future for Commit {
    type Output = Result<Lsn>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(Ok(lsn))) => Poll::Ready(Ok(lsn)),
            Poll::Ready(Ok(Err(cause))) => Poll::Ready(Err(Error::LogFailed { cause })),
            // The commit thread always answers unless it died mid-group.
            Poll::Ready(Err(_)) => Poll::Ready(Err(Error::CommitThreadDied)),
        }
    }
}

/// Wakes a parked thread (the waker of [`block_on`]); holds the thread to unpark.
struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Minimal executor: polls `future` on the current thread, parking between wake-ups.
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        // Spurious unparks just cause another poll.
        std::thread::park();
    }
}
