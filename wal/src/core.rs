//! The state the handles and the commit thread share.
//!
//! Owns: [`Core`] (the store, the append state under its mutex, the log's failure, the
//! durable-LSN watch and the counters), and the messages that pass between appenders and the
//! commit thread ([`Command`], [`Reply`], [`Progress`]). These live apart from both `handle.rs`
//! and `commit.rs` so that each imports them and neither imports the other.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::thread::JoinHandle;

use crossbeam_channel::Sender;
use tokio::sync::{oneshot, watch};

use crate::codec;
use crate::error::{Error, Result};
use crate::log::LogStore;
use crate::space::SpaceGuard;
use crate::{Config, Lsn, FLUSH_LATENCY_BUCKETS_SECONDS};

/// Locks a mutex, ignoring poisoning: every critical section of the log leaves its data consistent
/// at each step (a panicking `build` closure, for one, runs before any state changes).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// State guarded by the append mutex.
#[derive(Debug)]
pub(crate) struct Appender {
    /// The LSN the next record gets.
    pub(crate) next_lsn: Lsn,
    /// The commit thread's queue; `None` once shut down.
    pub(crate) tx: Option<Sender<Command>>,
    /// Decoded payload sizes of the records after the checkpoint, oldest first (4 bytes per
    /// record; trimmed by every checkpoint), so `bytes_since_checkpoint` stays exact. Decoded,
    /// not stored ([`crate::codec::decoded_len`]): they measure what a recovery would replay.
    pub(crate) sizes: VecDeque<u32>,
    /// LSN of `sizes[0]`.
    pub(crate) sizes_first_lsn: Lsn,
    /// Sum of `sizes`.
    pub(crate) bytes_since_checkpoint: u64,
    /// Stored bytes of the records at or below the checkpoint kept for [`Wal::read`](crate::Wal::read).
    pub(crate) retained_bytes: u64,
    /// The free-space floor.
    pub(crate) space: SpaceGuard,
}

impl Appender {
    /// Accounts a newly assigned record of [`Size`].
    pub(crate) fn push_size(&mut self, size: Size) {
        self.sizes.push_back(u32::try_from(size.decoded).unwrap_or(u32::MAX));
        self.bytes_since_checkpoint += size.decoded as u64;
        self.space.count(size.stored);
    }

    /// Forgets the sizes of records with LSN > `lsn` (lost with a failed log).
    pub(crate) fn forget_after(&mut self, lsn: Lsn) {
        while self.sizes_first_lsn + self.sizes.len() as u64 > lsn + 1 {
            let Some(size) = self.sizes.pop_back() else { break };
            self.bytes_since_checkpoint -= u64::from(size);
        }
    }

    /// Forgets the sizes of records with LSN <= `lsn` (now covered by a checkpoint).
    pub(crate) fn forget_through(&mut self, lsn: Lsn) {
        while self.sizes_first_lsn <= lsn {
            let Some(size) = self.sizes.pop_front() else { break };
            self.bytes_since_checkpoint -= u64::from(size);
            self.sizes_first_lsn += 1;
        }
    }
}

/// A record's size as the log accounts it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Size {
    /// Bytes it stores: what the disk's free space pays.
    pub(crate) stored: usize,
    /// Bytes it decodes to ([`codec::decoded_len`]): what a recovery replays, so what counts
    /// toward the next checkpoint.
    pub(crate) decoded: usize,
}

impl Size {
    pub(crate) fn of(payload: &[u8]) -> Size {
        Size { stored: payload.len(), decoded: codec::decoded_len(payload) }
    }
}

/// Everything shared by the handles and the commit thread.
pub(crate) struct Core {
    /// The configuration the log was opened with.
    pub(crate) config: Config,
    /// The sled database; `None` once shut down, so the data dir's lock is released even
    /// while other handles still exist (a restart in the same process must be able to open it).
    pub(crate) store: RwLock<Option<LogStore>>,
    /// LSN assignment and the queue (see [`Appender`]).
    pub(crate) appender: Mutex<Appender>,
    /// Mirror of `next_lsn - 1`, readable without the mutex.
    pub(crate) last_lsn: AtomicU64,
    /// Durable LSN, failure and stop flag, published by the commit thread.
    pub(crate) progress: watch::Sender<Progress>,
    /// The first write failure since the log was opened or last healed; while set, the log
    /// takes nothing ([`Wal::heal`](crate::Wal::heal) clears it).
    pub(crate) failure: FailureCell,
    /// How many times [`Wal::heal`](crate::Wal::heal) re-opened the log; appenders whose state predates a heal
    /// are refused ([`AppendOptions::epoch`](crate::AppendOptions::epoch)).
    pub(crate) epoch: AtomicU64,
    /// Serializes [`Wal::heal`](crate::Wal::heal) calls.
    pub(crate) healing: Mutex<()>,
    /// Counters kept by the commit thread.
    pub(crate) flush_stats: Mutex<FlushStats>,
    /// Serializes checkpoints; holds the LSN of the checkpoint on disk.
    pub(crate) checkpoint: Mutex<Option<Lsn>>,
    /// Mirror of the checkpoint LSN (0 = none) for `stats` without waiting on a checkpoint.
    pub(crate) checkpoint_lsn: AtomicU64,
    /// Snapshot bytes of the checkpoint on disk (0 = none), for `stats`.
    pub(crate) checkpoint_bytes: AtomicU64,
    /// Checkpoints written since the log opened, and their time in nanoseconds, for `stats`.
    pub(crate) checkpoints_written: AtomicU64,
    pub(crate) checkpoint_nanos: AtomicU64,
    /// Serializes [`Wal::save_state`](crate::Wal::save_state) calls (they share `state.tmp`).
    pub(crate) state_file: Mutex<()>,
    /// The commit thread, until it is joined.
    pub(crate) thread: Mutex<Option<JoinHandle<()>>>,
    /// Test hook: make the next group write fail as if the disk had.
    #[cfg(test)]
    pub(crate) fail_next_write: std::sync::atomic::AtomicBool,
    /// Test hook: while held, the commit thread waits after taking a group's first command,
    /// so a test can queue more behind it and see them share one flush.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) gate: Mutex<()>,
}

impl Core {
    /// Stops accepting appends, lets the commit thread drain the queue, joins it.
    /// Returns the log's failure, if any, on the call that actually stopped the thread.
    pub(crate) fn shutdown(&self) -> Result<()> {
        // Dropping the only sender ends the thread once the queue is empty.
        drop(lock(&self.appender).tx.take());
        // Hold the mutex while joining so a concurrent second call waits for the same join.
        let mut thread = lock(&self.thread);
        let Some(handle) = thread.take() else {
            return Ok(());
        };
        if handle.join().is_err() {
            return Err(Error::CommitThreadDied);
        }
        // The thread is gone, so nothing writes any more: close sled and release the dir.
        drop(self.store.write().unwrap_or_else(|p| p.into_inner()).take());
        match self.failure.get() {
            Some(cause) => Err(Error::LogFailed { cause }),
            None => Ok(()),
        }
    }

    /// Run `f` on the open store, or fail with [`Error::ShutDown`] once the log is closed.
    pub(crate) fn with_store<T>(&self, f: impl FnOnce(&LogStore) -> Result<T>) -> Result<T> {
        match self.store.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
            Some(store) => f(store),
            None => Err(Error::ShutDown),
        }
    }

    /// Highest durable LSN.
    pub(crate) fn durable_lsn(&self) -> Lsn {
        self.progress.borrow().durable
    }

    /// The error an append gets when the log cannot take it.
    pub(crate) fn refuse(&self, appender: &Appender) -> Option<Error> {
        if let Some(cause) = self.failure.get() {
            return Some(Error::LogFailed { cause });
        }
        appender.tx.is_none().then_some(Error::ShutDown)
    }
}

/// The log's failure, if any: set by the first failed group, cleared by a heal.
#[derive(Debug, Default)]
pub(crate) struct FailureCell(Mutex<Option<Arc<Error>>>);

impl FailureCell {
    /// The failure, if the log is failed.
    pub(crate) fn get(&self) -> Option<Arc<Error>> {
        lock(&self.0).clone()
    }

    /// Records `e` unless a failure is already recorded; returns the one recorded.
    pub(crate) fn set(&self, e: Arc<Error>) -> Arc<Error> {
        Arc::clone(lock(&self.0).get_or_insert(e))
    }

    pub(crate) fn clear(&self) {
        *lock(&self.0) = None;
    }
}

/// What a waiter receives: the LSN it waited for, or the failure shared by its whole group.
pub(crate) type Reply = std::result::Result<Lsn, Arc<Error>>;

/// One append (or atomic batch) travelling from an appender to the commit thread.
#[derive(Debug)]
pub(crate) struct Command {
    /// LSN of `payloads[0]`; the rest follow consecutively.
    pub(crate) first_lsn: Lsn,
    /// Unframed payloads (framing happens on the commit thread, outside the append lock).
    pub(crate) payloads: Vec<Vec<u8>>,
    /// Resolves the caller's [`crate::Commit`].
    pub(crate) reply: oneshot::Sender<Reply>,
}

impl Command {
    /// LSN of the last payload (the one the [`crate::Commit`] resolves with).
    pub(crate) fn last_lsn(&self) -> Lsn {
        self.first_lsn + self.payloads.len() as u64 - 1
    }
}

/// What the commit thread publishes through the watch channel.
#[derive(Debug, Clone, Default)]
pub(crate) struct Progress {
    /// Every LSN up to this one is durable.
    pub(crate) durable: Lsn,
    /// Set once when the log fails; waiters for LSNs beyond `durable` get it.
    pub(crate) failure: Option<Arc<Error>>,
    /// The commit thread has exited; nothing beyond `durable` will become durable.
    pub(crate) stopped: bool,
}

/// Counters kept by the commit thread, copied into [`crate::WalStats`].
#[derive(Debug, Clone, Default)]
pub(crate) struct FlushStats {
    /// Successful group flushes.
    pub(crate) flushes: u64,
    /// Records made durable by those flushes.
    pub(crate) records_flushed: u64,
    /// Sum of the time spent writing and syncing groups.
    pub(crate) flush_seconds_total: f64,
    /// Cumulative histogram, one count per bound in [`FLUSH_LATENCY_BUCKETS_SECONDS`].
    pub(crate) latency_buckets: [u64; FLUSH_LATENCY_BUCKETS_SECONDS.len()],
    /// Largest group, in records.
    pub(crate) batch_size_max: u64,
}

impl FlushStats {
    /// Accounts one successful flush of `records` records that took `seconds`.
    pub(crate) fn record(&mut self, records: u64, seconds: f64) {
        self.flushes += 1;
        self.records_flushed += records;
        self.flush_seconds_total += seconds;
        self.batch_size_max = self.batch_size_max.max(records);
        // Prometheus buckets are cumulative: a 2 ms flush counts in every bucket >= 2 ms.
        for (count, bound) in self.latency_buckets.iter_mut().zip(FLUSH_LATENCY_BUCKETS_SECONDS) {
            if seconds <= *bound {
                *count += 1;
            }
        }
    }
}
