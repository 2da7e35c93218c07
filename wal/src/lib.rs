//! A durable write-ahead log on [sled](https://docs.rs/sled/0.34), with group commit,
//! checkpoints and torn-tail recovery.
//!
//! The log stores opaque byte records keyed by LSN (log sequence number, starting at 1). It
//! knows nothing about sheets: sheetd encodes its operations with [`codec`], appends them here,
//! and gets them back, in order, from a [`Replayer`] at start-up.
//!
//! # Layout
//!
//! Crate map, one line per module. Besides the items of `lib.rs`, each module uses only modules
//! listed after it, so their imports form no circle:
//! - `lib.rs`: this overview, [`Config`], [`Replayer`], [`RecoveryReport`], [`WalStats`].
//! - `tests.rs` (tests only): behaviour tests of the whole log.
//! - `testing` (feature `testing`): helpers that damage a stopped log for crash tests.
//! - [`restore`]: [`restore::Restore`], building a new data dir from a checkpoint and records
//!   at given LSNs (a restore from a backup).
//! - [`blocks`]: a stream of compressed, checksummed blocks with a summary and a trailer (the
//!   framing of backup files).
//! - `checkpointing.rs`: [`Wal::checkpoint`] and its variants: writing the checkpoint,
//!   truncating the log it replaces, compacting a bloated log store.
//! - `heal.rs`: [`Wal::heal`], re-opening a failed log from disk.
//! - `positions.rs`: [`Wal::truncate_after`] and [`Wal::purge_through`], moving the log's
//!   end back and its beginning forward (what a log replicated from another node needs,
//!   with [`Wal::append_batch_at`]).
//! - `state.rs`: [`Wal::save_state`] and [`Wal::state`], a few bytes kept durable beside the
//!   records.
//! - `handle.rs`: [`Wal`] and [`Commit`]: opening, appending, reading, statistics, shutdown.
//! - `commit.rs`: the group-commit thread, the only writer of new records.
//! - `core.rs`: the state the handles and the commit thread share, and the messages between
//!   them.
//! - `recovery.rs`: replay rules shared by [`Wal::recover`] and [`Wal::verify`].
//! - `checkpoint.rs`: the checkpoint file and its sweep marker.
//! - `log.rs`: the sled database: opening it, making its writes durable, truncating it.
//! - `layout/`: the log's on-disk layout: keys, chunks, packs, and the entries they make.
//!   - `entry.rs`: stored entries (a record whole, its chunks, or a pack) and their records.
//!   - `pack.rs`: the compressed body of a pack of small records.
//!   - `keys.rs`: the sled key encodings and the largest stored value.
//! - `space.rs`: the free-space floor below which new records are refused.
//! - [`codec`]: the workspace's only use of bincode (values behind a format-version byte).
//! - [`frame`]: the CRC-protected frame around each stored record.
//! - `fsutil.rs`: directory fsync, copies, sizes and free space, scratch directories.
//! - `lock.rs`: sled's file lock, probed and shared.
//! - `error.rs`: [`Error`] and its detail types.
//!
//! On disk, the data dir holds two entries, and a third for logs that keep a state:
//! - `log/`: the sled database. Key = LSN as 8 big-endian bytes (so key order is LSN order),
//!   value = `[version u8][len u32 LE][crc32 u32 LE][payload]`. A record over 4,000 bytes is
//!   stored as chunks of at most that size, each framed, under 16-byte keys `[LSN][index u32
//!   BE][count u32 BE]`: sled sends larger values (and tree nodes) to a file of their own under
//!   `blobs/`, one file and fsync each, that can outlive the records in them. Consecutive
//!   small records of one group commit are stored as one *pack* under a 12-byte key `[first
//!   LSN][count u32 BE]`, their payloads compressed together (`layout/pack.rs`).
//! - `checkpoint`: the latest snapshot: `[SHEETDCK][version u8][lsn u64][len u64][crc32]`, then
//!   the snapshot in 1 MiB blocks, each behind its own CRC (`checkpoint.tmp` exists only while
//!   one is being written, `checkpoint.old` only while the one it replaced is given back).
//! - `state`: the bytes of the last [`Wal::save_state`], `[SHEETDST]` then a frame
//!   (`state.tmp` exists only while one is being written).
//!
//! `log.next/` and `log.old/` exist only while a checkpoint rewrites a bloated log store with
//! its live records (sled never shrinks its files); a crash in between is completed or undone at
//! the next open.
//!
//! # Write path
//!
//! 1. [`Wal::append_with`] / [`Wal::append`] / [`Wal::append_batch`] take the append mutex,
//!    assign the next LSN(s), run the caller's `build` closure (for `append_with`) and send the
//!    command to the commit thread, all under that mutex. LSN order is queue order.
//! 2. The commit thread blocks for one command, drains whatever else is queued (up to
//!    [`Config::max_batch_records`]), frames every payload (or each chunk of a large one, or
//!    a pack of small ones) and writes them atomically: one sled insert when they make one
//!    value, else one `sled::Batch` (whose manifest costs sled a buffer write of its own).
//! 3. It flushes sled, fsyncs new blob files and `fdatasync`s sled's data file: sled's own flush
//!    does not reach the platter (see `LogStore::sync` in `log.rs`).
//! 4. It advances the durable LSN ([`Wal::durable_lsn`], [`Wal::wait_durable`]) and then resolves
//!    the [`Commit`] of every record in the group. One fsync serves the whole group.
//!
//! # Recovery
//!
//! [`Wal::recover`]:
//! 1. Creates the data dir if missing and opens sled (failing with [`Error::InUse`] if another
//!    process holds it). Before sled touches its files, the free space of their file system is
//!    checked (failing with [`Error::NoSpace`], nothing changed, when sled's snapshot could not
//!    be rewritten) and any snapshot file sled left unfinished is removed: a full disk must
//!    never turn a start attempt into damage.
//! 2. Removes a leftover `checkpoint.tmp` and `checkpoint.old`, reads and verifies `checkpoint` (damage is an error,
//!    never ignored) and hands it to [`Replayer::checkpoint`].
//! 3. Walks the log in LSN order: records covered by the checkpoint are stale and deleted; the
//!    rest must be contiguous and pass their frame check, and go to [`Replayer::record`].
//! 4. A bad frame on the highest LSN (or in the highest pack) is a torn tail: dropped with a
//!    warning. A bad frame anywhere else, or a gap, stops start-up with [`Error::Corrupt`]
//!    naming the LSN.
//! 5. Starts the commit thread; the next LSN is the last good one + 1.
//!
//! [`Wal::verify`] performs the same replay on a private copy of the log and changes nothing.
//!
//! # Invariants
//!
//! - A [`Commit`] resolves `Ok` only after its record, and every record with a smaller LSN, is
//!   flushed and fsynced. Nothing unflushed is ever acknowledged.
//! - LSNs are assigned without holes: every assigned LSN is queued, in order, under one mutex.
//!   On disk the log after the checkpoint is contiguous; a hole is corruption.
//! - After a write, flush or fsync failure the log is failed: pending and later appends get
//!   [`Error::LogFailed`] until [`Wal::heal`] re-opens it from disk (or a restart recovers it).
//! - Only the highest record (or the records of the highest pack, one group's) may be dropped
//!   at recovery (torn tail); it was never acknowledged, because its flush did not complete.
//! - Log records are truncated only after the checkpoint replacing them is durable (file fsync,
//!   rename, directory fsync).
//! - Records are removed from the end only by [`Wal::truncate_after`] (and by a heal, of
//!   records never acknowledged), never below the checkpoint, and only once every record
//!   queued before it is durable; it returns once the removal is durable, and LSNs go on from
//!   the new end.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::path::PathBuf;
use std::time::Duration;

pub mod blocks;
pub mod codec;
pub mod frame;
pub mod restore;

mod checkpoint;
mod checkpointing;
mod commit;
mod core;
mod error;
mod fsutil;
mod handle;
mod heal;
mod layout;
mod lock;
mod log;
mod positions;
mod recovery;
mod space;
mod state;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

#[cfg(test)]
mod tests;

pub use error::{BoxError, CodecError, Corruption, Error, FrameDefect, Result};
pub use handle::{AppendOptions, Commit, Wal};
pub use state::saved_in as state_saved_in;

/// Log sequence number. The first record is 1; 0 means "nothing".
pub type Lsn = u64;

/// Upper bounds (seconds) of the flush latency histogram in [`WalStats::flush_latency_buckets`].
pub const FLUSH_LATENCY_BUCKETS_SECONDS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];

/// Where the log lives and how it batches.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The data dir. Holds `log/` (the sled database) and `checkpoint`; created if missing.
    pub dir: PathBuf,
    /// The commit thread stops draining the queue once a group (one sled batch, one fsync)
    /// holds this many records. An [`Wal::append_batch`] is never split, so a group can exceed
    /// it by up to one batch. Values below 1 count as 1.
    pub max_batch_records: usize,
    /// sled's page cache size in bytes.
    pub cache_capacity_bytes: u64,
    /// The free-space floor: below this many free bytes on the data dir's file system,
    /// [`Wal::append_with`] and its siblings refuse new records with [`Error::NoSpace`] (the
    /// log itself stays healthy), so the room left is there for checkpoints, which let the log
    /// shrink, and for the next start. `None`: the smaller of 256 MiB and 5 % of the file
    /// system. `Some(0)`: no floor.
    pub min_free_bytes: Option<u64>,
}

impl Config {
    /// Default for [`Config::max_batch_records`].
    pub const DEFAULT_MAX_BATCH_RECORDS: usize = 8192;
    /// Default for [`Config::cache_capacity_bytes`] (16 MiB). The cache holds the pages of
    /// recent records, which the service keeps in memory anyway: a larger one only added to a
    /// loaded server's resident memory (about 55 MB more at 64 MiB after a bulk load).
    pub const DEFAULT_CACHE_CAPACITY_BYTES: u64 = 16 * 1024 * 1024;

    /// A config for the data dir `dir` with the defaults:
    /// - `max_batch_records`: 8192 records per group commit;
    /// - `cache_capacity_bytes`: 16 MiB of sled page cache;
    /// - `min_free_bytes`: the default floor (see [`Config::min_free_bytes`]).
    pub fn default_for(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            max_batch_records: Self::DEFAULT_MAX_BATCH_RECORDS,
            cache_capacity_bytes: Self::DEFAULT_CACHE_CAPACITY_BYTES,
            min_free_bytes: None,
        }
    }
}

/// Receives what recovery finds, in order, on the thread that called recovery.
pub trait Replayer {
    /// Called at most once, before any record: the latest checkpoint.
    ///
    /// # Errors
    /// Any error aborts recovery with [`Error::ReplayCheckpoint`].
    ///
    /// `snapshot` streams the bytes given to the checkpoint's write from the file, each part
    /// checked against its CRC before it is handed on (a damaged one fails the read, and the
    /// recovery with [`Error::Corrupt`]); a start never holds the whole file in memory. It is
    /// not buffered: read it through a buffer (`codec::stream` does).
    fn checkpoint(
        &mut self,
        lsn: Lsn,
        snapshot: &mut dyn std::io::Read,
    ) -> std::result::Result<(), Box<dyn std::error::Error + Send + Sync>>;

    /// Called for each record after the checkpoint, in LSN order.
    ///
    /// # Errors
    /// Any error aborts recovery with [`Error::ReplayRecord`] naming `lsn`.
    fn record(
        &mut self,
        lsn: Lsn,
        payload: &[u8],
    ) -> std::result::Result<(), Box<dyn std::error::Error + Send + Sync>>;

    /// Whether a record at or below the checkpoint must stay in the log (asked after
    /// [`Replayer::checkpoint`], for each such record found). Records the caller still reads
    /// by LSN ([`Wal::read`], kept by [`Wal::checkpoint_retaining`]) answer `true`; the rest
    /// are stale (a crash hit between a checkpoint and its truncation) and are removed.
    ///
    /// Only asked when the start walks those records: after a checkpoint whose truncation
    /// completed (its sweep marker is on disk), the log knows they are exactly the retained
    /// ones and does not read them.
    fn retains(&self, lsn: Lsn) -> bool {
        let _ = lsn;
        false
    }
}

/// What [`Wal::recover`] or [`Wal::verify`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    /// LSN of the checkpoint delivered to the replayer, if there was one.
    pub checkpoint_lsn: Option<Lsn>,
    /// Records delivered to [`Replayer::record`].
    pub records_replayed: u64,
    /// Sum of the payload sizes of those records.
    pub bytes_replayed: u64,
    /// Last good LSN: the last record replayed, else the checkpoint LSN, else 0. The next
    /// append gets `last_lsn + 1`.
    pub last_lsn: Lsn,
    /// The highest record was torn and dropped (`verify`: found, and left in place).
    pub torn_tail_dropped: bool,
    /// LSN of the dropped torn record, if any.
    pub torn_tail_lsn: Option<Lsn>,
    /// Records with LSN <= the checkpoint LSN found in the log and removed (`verify`: found,
    /// and left in place). Non-zero after a crash between checkpoint and truncation.
    pub stale_records_truncated: u64,
    /// Records at or below the checkpoint LSN kept because the replayer retains them
    /// ([`Replayer::retains`]).
    pub records_retained: u64,
    /// Wall time of the whole operation.
    pub elapsed: Duration,
}

/// Counters for metrics, from [`Wal::stats`].
#[derive(Debug, Clone, PartialEq)]
pub struct WalStats {
    /// Highest LSN assigned.
    pub last_lsn: Lsn,
    /// Highest LSN known durable.
    pub durable_lsn: Lsn,
    /// LSN of the current checkpoint (0 if none).
    pub checkpoint_lsn: Lsn,
    /// Snapshot bytes of the current checkpoint (0 if none): what the next checkpoint
    /// rewrites.
    pub checkpoint_bytes: u64,
    /// Checkpoints written (file written and log truncated) since the log opened: a phase of
    /// load that one fell in shared the machine with it.
    pub checkpoints: u64,
    /// Time those checkpoints took, in seconds.
    pub checkpoint_seconds_total: f64,
    /// Records assigned after the checkpoint (what a recovery would replay, plus records still
    /// in flight).
    pub records_since_checkpoint: u64,
    /// Payload bytes of those records, as they decode ([`codec::decoded_len`]): what a
    /// recovery would replay, whether or not the codec stored them compressed.
    pub bytes_since_checkpoint: u64,
    /// Stored bytes of the records at or below the checkpoint kept for [`Wal::read`] (see
    /// [`Wal::checkpoint_retaining`]): live data, like the records after the checkpoint.
    pub retained_bytes: u64,
    /// Group commits completed (each one flush + fsync).
    pub flushes: u64,
    /// Records made durable by those group commits.
    pub records_flushed: u64,
    /// Total time spent in group commits (write + flush + fsync), in seconds.
    pub flush_seconds_total: f64,
    /// Cumulative counts of flush latency <= each bound in [`FLUSH_LATENCY_BUCKETS_SECONDS`]
    /// (Prometheus-style cumulative histogram; the `+Inf` bucket is [`WalStats::flushes`]).
    pub flush_latency_buckets: Vec<u64>,
    /// Most records written by one group commit.
    pub batch_size_max: u64,
    /// Bytes sled uses on disk (data file and blobs).
    pub log_bytes_on_disk: u64,
    /// Free bytes on the data dir's file system at the last check.
    pub free_bytes: u64,
    /// The free-space floor in force (0: none).
    pub min_free_bytes: u64,
    /// Whether the log takes new records now: not failed, not shut down, and free space at or
    /// above the floor at the last check.
    pub writable: bool,
}
