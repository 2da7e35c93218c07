//! The log archive (`sheetd serve --archive-dir DIR`): every durable record, in log order, kept
//! in sealed segment files, so a backup can be rolled forward to any later point in time.
//!
//! Owns: the segment file's layout, the archiver (a thread of its own that copies durable
//! records out of the log behind the writers), the archive's status (position, lag, last error,
//! gaps), how far a checkpoint must hold its truncation for it, and reading segments back for a
//! restore ([`list`], [`SegmentReader`]). What a restore does with them is [`crate::backup`]'s.
//!
//! # A segment
//!
//! A block stream of `wal::blocks` (the framing of backups) under its own magic `SHEETDAR`,
//! format [`FORMAT`]: every block zstd-compressed behind its own CRC, then the summary block
//! and the trailer. The data blocks carry, as one byte stream:
//!
//! ```text
//! R [lsn u64][time i64, ms since the epoch][len u64][record]   repeated, LSNs consecutive
//! E [records u64]
//! ```
//!
//! The record bytes are exactly what the log stores (`wal::codec`), so a restore writes them
//! back unchanged. The summary (kind 3) is JSON: [`SegmentSummary`]. The file is named
//! `<first LSN>-<last LSN>.seg`, both 20 digits, so names sort in log order and a listing shows
//! the ranges (and any gap) without opening a file. A segment is written as `NAME.tmp`,
//! fsynced, renamed to `NAME`, and the directory fsynced: a name without `.tmp` is complete.
//!
//! # A record's time
//!
//! What `--until T` compares: the time the record carries, a write's `at` (the time its
//! acknowledgement reports) or a stored idempotent answer's completion. Directory changes,
//! imports and checkpoint markers carry none; they take the time of the record before them
//! (the first record of a new archive: the clock when it is read). A restore `--until T`
//! replays records in log order and stops before the first one whose time is after T, so it
//! ends on a prefix of the log, as every state a server ever served was.
//!
//! # The archiver
//!
//! It runs on its own thread, reads records the log has made durable ([`ArchiveSource`]: a
//! single node's [`RecordLog::read_stored`], or a cluster node's committed entries; after the
//! writers, never in their way), fills a segment and seals it when it holds
//! [`ArchiveConfig::segment_bytes`] or its first record is [`ArchiveConfig::seal_after`] old, so
//! the archive trails the log by about that much. After a failure (a full or unwritable dir)
//! it drops the unsealed segment, reports the error, and tries again from the last sealed
//! record with backoff: since every sealed segment is complete, catching up leaves no gap.
//! At start it lists the dir and goes on after its last segment.
//!
//! A checkpoint keeps the log's records above the archive's position (`Archive::hold`), so
//! truncation never drops a record the archive has not taken, up to
//! [`ArchiveConfig::hold_records`] records behind the checkpoint: beyond that the log would
//! grow without end while the archive is broken, so the oldest are let go, with a warning.
//! The archiver then finds the log no longer holds the record it needs: a **gap**, reported
//! (log line, health, metrics) and never skipped silently; archiving goes on after it, and a
//! restore refuses to roll forward across it.

use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::log::blocks::{self, BlockError, BlockReader, BlockWriter};
use crate::log::{codec, Lsn, RecordLog};
use crate::model::Millis;
use crate::record::Record;
use crate::shared::Clock;

/// What the archiver reads: a log's durable records as stored, and how far it reaches. A single
/// node's [`RecordLog`]; on a cluster node, the group's committed entries
/// (`crate::replica::ClusterDomain::start_archive`), where an entry without a record of its own
/// (a membership change, a new leader's blank entry, a record skipped for landing elsewhere)
/// reads as a [`Record::Marker`], so positions stay consecutive and a restore replays nothing
/// for it.
pub trait ArchiveSource: Send + Sync + 'static {
    /// The record at `lsn` as stored ([`codec`] bytes), if the log still holds it. Blocking.
    ///
    /// # Errors
    /// The log failing to read, or a damaged record.
    fn read_stored(&self, lsn: Lsn) -> crate::error::Result<Option<Vec<u8>>>;

    /// Every record at or below this is durable (on a cluster node: committed), so archived
    /// records never change.
    fn durable_lsn(&self) -> Lsn;

    /// The highest position the log holds: an archive past it belongs to another history.
    fn last_lsn(&self) -> Lsn;

    /// The log's beginning: records at or below it are gone, unless it retains them.
    fn checkpoint_lsn(&self) -> Lsn;
}

impl ArchiveSource for Arc<dyn RecordLog> {
    fn read_stored(&self, lsn: Lsn) -> crate::error::Result<Option<Vec<u8>>> {
        RecordLog::read_stored(&**self, lsn)
    }

    fn durable_lsn(&self) -> Lsn {
        RecordLog::durable_lsn(&**self)
    }

    fn last_lsn(&self) -> Lsn {
        RecordLog::last_lsn(&**self)
    }

    fn checkpoint_lsn(&self) -> Lsn {
        self.stats().checkpoint_lsn
    }
}

/// A segment file's first bytes.
pub const MAGIC: &[u8; 8] = b"SHEETDAR";
/// The format this build writes, and the newest it reads.
pub const FORMAT: u8 = 1;
/// The summary's block kind.
const SUMMARY: u8 = 3;
/// A record is at most what a request body or an import makes, far below this.
const MAX_RECORD: u64 = 1 << 34;
/// The first wait after a failure; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How often an idle archiver looks at the log's durable position.
const POLL: Duration = Duration::from_millis(50);
/// How long a stopping archiver may spend taking the last durable records.
const FINAL_DRAIN: Duration = Duration::from_secs(10);

/// Settings of the archive.
#[derive(Clone, Debug)]
pub struct ArchiveConfig {
    /// Where segments go.
    pub dir: PathBuf,
    /// A segment is sealed once its first record is this old.
    pub seal_after: Duration,
    /// A segment is sealed once its records' bytes reach this.
    pub segment_bytes: usize,
    /// A checkpoint keeps at most this many records behind it that the archive has not taken.
    pub hold_records: u64,
}

/// What a segment's summary block says.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SegmentSummary {
    /// The file's format.
    pub format: u8,
    /// Its first record's LSN.
    pub first_lsn: Lsn,
    /// Its last record's LSN; every LSN in between is in it.
    pub last_lsn: Lsn,
    /// How many records (`last_lsn - first_lsn + 1`).
    pub records: u64,
    /// The first record's time (see the module docs), ms since the epoch.
    pub first_at_ms: Millis,
    /// The last record's time.
    pub last_at_ms: Millis,
    /// When it was sealed (UTC, RFC 3339).
    pub sealed_at: String,
}

/// Why a segment or the archive cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// A segment's blocks or trailer are damaged, or it is cut short.
    #[error("archive segment {path} is damaged: {source}")]
    Damaged {
        /// The segment.
        path: String,
        /// What the blocks say.
        source: BlockError,
    },
    /// A segment's blocks are intact but hold something else than its name says.
    #[error("archive segment {path} is damaged: {why}")]
    Content {
        /// The segment.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// The archive lacks records a restore needs.
    #[error("the archive in {dir} has a gap: {why}")]
    Gap {
        /// The archive dir.
        dir: String,
        /// Which records are missing.
        why: String,
    },
    /// Another server archives into the dir (it holds the dir's lock).
    #[error(
        "another server archives into {dir}; give each server (each node of a cluster) an \
         archive dir of its own"
    )]
    InUse {
        /// The archive dir.
        dir: String,
    },
    /// Listing or reading failed.
    #[error("cannot read the archive in {dir}: {source}")]
    Io {
        /// The archive dir.
        dir: String,
        /// The error.
        source: io::Error,
    },
}

/// `<first>-<last>.seg`.
pub fn segment_name(first: Lsn, last: Lsn) -> String {
    format!("{first:020}-{last:020}.seg")
}

fn parse_name(name: &str) -> Option<(Lsn, Lsn)> {
    let (first, last) = name.strip_suffix(".seg")?.split_once('-')?;
    let (first, last) = (first.parse().ok()?, last.parse().ok()?);
    (first >= 1 && last >= first).then_some((first, last))
}

/// A segment file found in an archive dir, by its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentFile {
    /// Its path.
    pub path: PathBuf,
    /// The first LSN its name gives.
    pub first: Lsn,
    /// The last LSN its name gives.
    pub last: Lsn,
}

/// The sealed segments in `dir`, in LSN order (unfinished `.tmp` files and other names are
/// left out).
///
/// # Errors
/// The dir cannot be listed.
pub fn list(dir: &Path) -> Result<Vec<SegmentFile>, ArchiveError> {
    let io_error = |source| ArchiveError::Io { dir: dir.display().to_string(), source };
    let mut segments = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_error)? {
        let entry = entry.map_err(io_error)?;
        let name = entry.file_name();
        if let Some((first, last)) = name.to_str().and_then(parse_name) {
            segments.push(SegmentFile { path: entry.path(), first, last });
        }
    }
    segments.sort_by_key(|s| (s.first, s.last));
    Ok(segments)
}

/// The leading fields of a [`Record`], laid out as the codec lays out the record (the same
/// variants in the same order, each with a prefix of its fields): what a record's time needs,
/// read without decoding (or decompressing) a bulk write's rows.
#[derive(Deserialize)]
enum RecordHead {
    Import(()),
    Directory(()),
    Sheet(SheetHead),
    Idempotency(IdemHead),
    Marker,
    FeedRetention(()),
    Expire(Millis),
    Webhook(()),
}

/// The first fields of [`crate::record::SheetWrite`].
#[derive(Deserialize)]
struct SheetHead {
    _sheet_id: crate::model::SheetId,
    at: Millis,
}

/// The fields of [`crate::record::IdemEntry`] up to its time.
#[derive(Deserialize)]
struct IdemHead {
    _key_id: crate::model::KeyId,
    _idem_key: String,
    _fingerprint: [u8; 32],
    _status: u16,
    _body: Vec<u8>,
    _request_id: String,
    completed_at: Millis,
}

/// The hold rule: a truncation at `checkpoint` keeps the records above the returned LSN for an
/// archive at `position`, but at most `hold_records` behind the checkpoint (so a broken archive
/// cannot grow the log without end). The one rule for a running archive ([`Archive::hold`]),
/// a single node's start before it runs, and a cluster node's purge before it runs.
pub(crate) fn held_above(position: Lsn, checkpoint: Lsn, hold_records: u64) -> Lsn {
    position.max(checkpoint.saturating_sub(hold_records))
}

/// The last LSN the sealed segments in `dir` hold; `None` for an empty or unreadable dir.
pub fn archived_position(dir: &Path) -> Option<Lsn> {
    list(dir).ok()?.last().map(|s| s.last)
}

/// The time of the record in `bytes` (see the module docs); `previous` when it carries none.
fn record_time(bytes: &[u8], previous: Millis) -> crate::Result<Millis> {
    let head = match codec::decode_prefix::<RecordHead>(bytes) {
        Ok(head) => head,
        // Not a layout the head mirrors (an older format's record): the whole record.
        Err(_) => match codec::decode::<Record>(bytes)? {
            Record::Sheet(write) => return Ok(write.at),
            Record::Idempotency(answer) => return Ok(answer.completed_at),
            Record::Expire(expiry) => return Ok(expiry.at),
            Record::Import(_)
            | Record::Directory(_)
            | Record::Marker
            | Record::FeedRetention(_)
            | Record::Webhook(_) => return Ok(previous),
        },
    };
    Ok(match head {
        RecordHead::Sheet(write) => write.at,
        RecordHead::Idempotency(answer) => answer.completed_at,
        RecordHead::Expire(at) => at,
        RecordHead::Import(())
        | RecordHead::Directory(())
        | RecordHead::Marker
        | RecordHead::FeedRetention(())
        | RecordHead::Webhook(()) => previous,
    })
}

/// Reads one segment's records in order, checking every block, then its summary against its
/// name and its records.
pub struct SegmentReader {
    blocks: BlockReader<BufReader<File>>,
    file: SegmentFile,
    next: Lsn,
    records: u64,
}

/// One archived record.
#[derive(Debug)]
pub struct Archived {
    /// Its position.
    pub lsn: Lsn,
    /// Its time (see the module docs).
    pub at: Millis,
    /// The record as the log stored it.
    pub bytes: Vec<u8>,
}

impl SegmentReader {
    /// Opens `file`.
    ///
    /// # Errors
    /// It cannot be opened, or is no segment this build reads.
    pub fn open(file: &SegmentFile) -> Result<SegmentReader, ArchiveError> {
        let path = file.path.display().to_string();
        let opened = File::open(&file.path)
            .map_err(|source| ArchiveError::Io { dir: path.clone(), source })?;
        let blocks = BlockReader::open(
            BufReader::with_capacity(1 << 20, opened),
            "sheetd archive segment",
            MAGIC,
            FORMAT,
        )
        .map_err(|source| ArchiveError::Damaged { path, source })?;
        Ok(SegmentReader { blocks, file: file.clone(), next: file.first, records: 0 })
    }

    fn content(&self, why: impl Into<String>) -> ArchiveError {
        ArchiveError::Content { path: self.file.path.display().to_string(), why: why.into() }
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), ArchiveError> {
        self.blocks.read_exact(buf).map_err(|e| self.read_error(e))
    }

    fn read_error(&self, e: io::Error) -> ArchiveError {
        let path = self.file.path.display().to_string();
        if e.get_ref().is_some_and(|inner| inner.is::<BlockError>()) {
            if let Ok(inner) = e.into_inner().expect("checked").downcast::<BlockError>() {
                return ArchiveError::Damaged { path, source: *inner };
            }
            return self.content("unreadable block");
        }
        if e.kind() == io::ErrorKind::UnexpectedEof {
            return self.content("an item ends before its bytes do");
        }
        ArchiveError::Io { dir: path, source: e }
    }

    fn u64(&mut self) -> Result<u64, ArchiveError> {
        let mut buf = [0u8; 8];
        self.read_exact(&mut buf)?;
        Ok(u64::from_le_bytes(buf))
    }

    /// The next record, or `None` after the last (whose count, summary and trailer are then
    /// checked).
    ///
    /// # Errors
    /// Damage, records out of order or outside the name's range, a summary that does not
    /// describe the records.
    pub fn next_record(&mut self) -> Result<Option<Archived>, ArchiveError> {
        let mut tag = [0u8; 1];
        self.read_exact(&mut tag)?;
        match tag[0] {
            b'R' => {
                let lsn = self.u64()?;
                let at = self.u64()? as i64;
                let len = self.u64()?;
                if lsn != self.next || lsn > self.file.last {
                    return Err(self.content(format!(
                        "it holds record {lsn} where record {} belongs",
                        self.next
                    )));
                }
                if len > MAX_RECORD {
                    return Err(self.content(format!("record {lsn} has an impossible length")));
                }
                let mut bytes = Vec::with_capacity(len as usize);
                (&mut self.blocks)
                    .take(len)
                    .read_to_end(&mut bytes)
                    .map_err(|e| self.read_error(e))?;
                if bytes.len() as u64 != len {
                    return Err(self.content(format!("record {lsn} is cut short")));
                }
                self.next += 1;
                self.records += 1;
                Ok(Some(Archived { lsn, at, bytes }))
            }
            b'E' => {
                let count = self.u64()?;
                self.end(count)?;
                Ok(None)
            }
            other => Err(self.content(format!("it holds an item of unknown kind {other}"))),
        }
    }

    fn end(&mut self, count: u64) -> Result<(), ArchiveError> {
        if count != self.records || self.next != self.file.last + 1 {
            return Err(self.content(format!(
                "it holds records {} to {} ({count} counted), not those its name gives",
                self.file.first,
                self.next - 1
            )));
        }
        let mut rest = [0u8; 1];
        if self.blocks.read(&mut rest).map_err(|e| self.read_error(e))? != 0 {
            return Err(self.content("bytes follow its end item"));
        }
        let path = self.file.path.display().to_string();
        let (kind, summary) =
            self.blocks.summary().map_err(|source| ArchiveError::Damaged { path, source })?;
        let summary: SegmentSummary = serde_json::from_slice(&summary)
            .ok()
            .filter(|_| kind == SUMMARY)
            .ok_or_else(|| self.content("its summary does not parse"))?;
        if (summary.first_lsn, summary.last_lsn, summary.records)
            != (self.file.first, self.file.last, count)
        {
            return Err(self.content("its summary does not describe its records"));
        }
        Ok(())
    }
}

/// The archive's state as health and metrics show it.
#[derive(Clone, Debug, Default)]
pub struct ArchiveStatus {
    /// The archive dir.
    pub dir: PathBuf,
    /// Every record from the archive's first up to this one is in a sealed segment (or in a
    /// reported gap).
    pub position: Lsn,
    /// The log's durable position.
    pub durable_lsn: Lsn,
    /// Durable records not archived yet.
    pub lag_records: u64,
    /// When the oldest record not archived yet was read from the log, if one waits.
    pub behind_since: Option<Millis>,
    /// When the last segment was sealed.
    pub last_sealed_at: Option<Millis>,
    /// Segments sealed since the server started.
    pub segments_sealed: u64,
    /// Bytes of segments sealed since the server started.
    pub bytes_sealed: u64,
    /// Why the archive is behind, while it fails; `None` once a segment is sealed again.
    pub last_error: Option<String>,
    /// Failures since the server started.
    pub errors: u64,
    /// Ranges of records lost to the archive (the log dropped them before it took them).
    pub gaps: Vec<(Lsn, Lsn)>,
}

impl ArchiveStatus {
    /// Why the archive makes the server degraded, as a sentence: failing, or with a gap.
    pub fn trouble(&self) -> Option<String> {
        if let Some(error) = &self.last_error {
            return Some(format!(
                "the log archive is {} records behind: {error}",
                self.lag_records
            ));
        }
        self.gaps.last().map(|(from, to)| {
            format!(
                "the log archive has a gap: records {from} to {to} left the log before it took \
                 them; take a new backup"
            )
        })
    }
}

/// What the archiver and the service share.
#[derive(Debug)]
struct Shared {
    dir: PathBuf,
    hold_records: u64,
    /// Every record up to this one is archived (or in a reported gap).
    position: AtomicU64,
    stop: AtomicBool,
    wake: (Mutex<()>, Condvar),
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    behind_since: Option<Millis>,
    last_sealed_at: Option<Millis>,
    segments_sealed: u64,
    bytes_sealed: u64,
    last_error: Option<String>,
    errors: u64,
    gaps: Vec<(Lsn, Lsn)>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The running archive: its status, and the thread writing it.
pub struct Archive {
    shared: Arc<Shared>,
    log: Arc<dyn ArchiveSource>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// `LOCK_FILE`, locked for as long as the archive runs.
    _lock: File,
}

/// The file an archive locks in its dir, so two servers (or two nodes of a cluster) never write
/// one dir: their segments would collide.
const LOCK_FILE: &str = "archive.lock";

impl std::fmt::Debug for Archive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Archive").field("shared", &self.shared).finish_non_exhaustive()
    }
}

impl Archive {
    /// Lists `config.dir` (created if missing), and starts the archiver after its last
    /// segment; an empty archive starts after the log's checkpoint (what a backup can be
    /// rolled forward from).
    ///
    /// # Errors
    /// The dir cannot be created or listed.
    pub(crate) fn start(
        config: ArchiveConfig,
        log: Arc<dyn ArchiveSource>,
        clock: Clock,
    ) -> Result<Archive, ArchiveError> {
        let dir_name = config.dir.display().to_string();
        let dir_error = |source| ArchiveError::Io { dir: dir_name.clone(), source };
        std::fs::create_dir_all(&config.dir).map_err(dir_error)?;
        let lock_file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(config.dir.join(LOCK_FILE))
            .map_err(dir_error)?;
        // Fully qualified: std's inherent `File::try_lock*` (Rust 1.89+) would shadow fs2's.
        if let Err(e) = fs2::FileExt::try_lock_exclusive(&lock_file) {
            if e.kind() == fs2::lock_contended_error().kind() {
                return Err(ArchiveError::InUse { dir: dir_name });
            }
            return Err(dir_error(e));
        }
        // A segment left unfinished by a crash or a full disk: it is written again.
        for entry in std::fs::read_dir(&config.dir).map_err(dir_error)?.flatten() {
            if entry.file_name().to_str().is_some_and(|n| n.ends_with(".seg.tmp")) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let segments = list(&config.dir)?;
        let mut state = State::default();
        let mut expected = None;
        for s in &segments {
            if let Some(next) = expected {
                if s.first > next {
                    tracing::error!(from = next, to = s.first - 1, dir = %config.dir.display(),
                        "the log archive has a gap: no segment holds these records");
                    state.gaps.push((next, s.first - 1));
                }
            }
            expected = Some(s.last + 1);
        }
        let checkpoint = log.checkpoint_lsn();
        let (position, previous_at) = match segments.last() {
            Some(last) => {
                let summary = File::open(&last.path)
                    .and_then(|f| blocks::read_summary(f).map_err(io::Error::from))
                    .ok()
                    .and_then(|(_, s)| serde_json::from_slice::<SegmentSummary>(&s).ok());
                (last.last, summary.map_or_else(|| clock.now(), |s| s.last_at_ms))
            }
            None => (checkpoint, clock.now()),
        };
        let shared = Arc::new(Shared {
            dir: config.dir.clone(),
            hold_records: config.hold_records,
            position: AtomicU64::new(position),
            stop: AtomicBool::new(false),
            wake: Default::default(),
            state: Mutex::new(state),
        });
        let last = log.last_lsn();
        let thread = if position > last {
            // Another history's archive (another server's, or this one's before a restore to
            // an earlier point): records of this log must not be filed beside it.
            let message = format!(
                "the archive dir holds records up to {position}, past this log's last record \
                 {last}: it belongs to another history; give this server an archive dir of its own"
            );
            tracing::error!(dir = %config.dir.display(), "{message}");
            let mut state = lock(&shared.state);
            state.last_error = Some(message);
            state.errors += 1;
            None
        } else {
            let writer = Writer {
                config,
                log: Arc::clone(&log),
                shared: Arc::clone(&shared),
                clock,
                open: None,
                cursor: position + 1,
                previous_at,
            };
            let thread = std::thread::Builder::new()
                .name("sheetd-archive".to_owned())
                .spawn(move || writer.run())
                .map_err(dir_error)?;
            Some(thread)
        };
        Ok(Archive { shared, log, thread: Mutex::new(thread), _lock: lock_file })
    }

    /// How far the archive has come: every record up to it is archived (or in a reported gap).
    pub fn position(&self) -> Lsn {
        self.shared.position.load(Ordering::Acquire)
    }

    /// The records a checkpoint at `checkpoint` must keep for the archive: those above the
    /// returned LSN. At most [`ArchiveConfig::hold_records`] behind the checkpoint; when the
    /// archive is further behind, the older ones are let go, with a warning (the archiver
    /// reports the gap when it gets there).
    pub(crate) fn hold(&self, checkpoint: Lsn) -> Lsn {
        let position = self.position();
        let held = held_above(position, checkpoint, self.shared.hold_records);
        if held > position {
            tracing::warn!(
                archived = position,
                checkpoint,
                dropped_from = position + 1,
                dropped_to = held,
                "the log archive is too far behind: the checkpoint no longer keeps records it \
                 has not taken (--archive-hold-records); it will have a gap"
            );
        }
        held
    }

    /// The archive's state now.
    pub fn status(&self) -> ArchiveStatus {
        let position = self.position();
        let durable = self.log.durable_lsn();
        let state = lock(&self.shared.state);
        ArchiveStatus {
            dir: self.shared.dir.clone(),
            position,
            durable_lsn: durable,
            lag_records: durable.saturating_sub(position),
            behind_since: state.behind_since,
            last_sealed_at: state.last_sealed_at,
            segments_sealed: state.segments_sealed,
            bytes_sealed: state.bytes_sealed,
            last_error: state.last_error.clone(),
            errors: state.errors,
            gaps: state.gaps.clone(),
        }
    }

    /// Takes what is durable now (for up to a few seconds), seals it, and stops the thread.
    pub(crate) fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.1.notify_all();
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
    }
}

/// The segment being filled.
struct Open {
    tmp: PathBuf,
    out: BlockWriter<File>,
    first: Lsn,
    last: Lsn,
    first_at: Millis,
    last_at: Millis,
    bytes: usize,
    opened: Instant,
}

/// The archiver thread's own state.
struct Writer {
    config: ArchiveConfig,
    log: Arc<dyn ArchiveSource>,
    shared: Arc<Shared>,
    clock: Clock,
    open: Option<Open>,
    /// The next record to read.
    cursor: Lsn,
    /// The time of the record before `cursor`.
    previous_at: Millis,
}

/// Why a step of the archiver failed.
enum Failure {
    /// Writing the dir, or reading the log, failed: drop the unsealed segment and retry.
    Retry(String),
}

impl Writer {
    fn run(mut self) {
        let mut backoff = FIRST_BACKOFF;
        let mut retry_at: Option<Instant> = None;
        let mut final_until: Option<Instant> = None;
        loop {
            let stopping = self.shared.stop.load(Ordering::Acquire);
            if stopping && final_until.is_none() {
                final_until = Some(Instant::now() + FINAL_DRAIN);
            }
            if retry_at.is_some_and(|at| Instant::now() < at) {
                if stopping {
                    break;
                }
                self.sleep(POLL);
                continue;
            }
            match self.step(stopping) {
                Ok(busy) => {
                    retry_at = None;
                    backoff = FIRST_BACKOFF;
                    if stopping && (!busy || final_until.is_some_and(|t| Instant::now() >= t)) {
                        let _ = self.seal();
                        break;
                    }
                    if !busy {
                        self.sleep(POLL);
                    }
                }
                Err(Failure::Retry(why)) => {
                    self.discard();
                    self.fail(&why);
                    if stopping {
                        break;
                    }
                    retry_at = Some(Instant::now() + backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
        self.discard();
    }

    fn sleep(&self, d: Duration) {
        let guard = lock(&self.shared.wake.0);
        if !self.shared.stop.load(Ordering::Acquire) {
            let _ = self.shared.wake.1.wait_timeout(guard, d);
        }
    }

    fn fail(&self, why: &str) {
        let mut state = lock(&self.shared.state);
        if state.last_error.as_deref() != Some(why) {
            tracing::error!(dir = %self.config.dir.display(), error = why,
                "the log archive cannot write or read what it needs; it retries, writes go on");
        }
        state.last_error = Some(why.to_owned());
        state.errors += 1;
    }

    /// Reads what is durable into the open segment and seals it when due; `Ok(true)` when
    /// there may be more to do at once.
    fn step(&mut self, stopping: bool) -> Result<bool, Failure> {
        let durable = self.log.durable_lsn();
        let mut budget = 4096;
        while self.cursor <= durable && budget > 0 {
            budget -= 1;
            let stored = self.log.read_stored(self.cursor).map_err(|e| {
                Failure::Retry(format!("reading record {} from the log: {e}", self.cursor))
            })?;
            let Some(bytes) = stored else {
                self.gap()?;
                continue;
            };
            let at = record_time(&bytes, self.previous_at).map_err(|e| {
                Failure::Retry(format!("record {} does not decode: {e}", self.cursor))
            })?;
            self.add(self.cursor, at, &bytes)?;
            self.previous_at = at;
            self.cursor += 1;
            if self.open.as_ref().is_some_and(|o| o.bytes >= self.config.segment_bytes) {
                self.seal()?;
            }
        }
        let due = self.open.as_ref().is_some_and(|o| o.opened.elapsed() >= self.config.seal_after);
        if due || (stopping && self.cursor > durable) {
            self.seal()?;
        }
        Ok(self.cursor <= self.log.durable_lsn())
    }

    /// The log no longer holds the record at the cursor: report the gap, seal what came
    /// before it, and go on after the log's checkpoint.
    fn gap(&mut self) -> Result<(), Failure> {
        let checkpoint = self.log.checkpoint_lsn();
        if self.cursor > checkpoint {
            return Err(Failure::Retry(format!(
                "the log lacks record {}, above its checkpoint {checkpoint}",
                self.cursor
            )));
        }
        self.seal()?;
        let (from, to) = (self.cursor, checkpoint);
        tracing::error!(from, to, dir = %self.config.dir.display(),
            "the log archive has a gap: the log dropped these records before the archive took \
             them; a backup taken before them cannot be rolled forward past them");
        lock(&self.shared.state).gaps.push((from, to));
        self.cursor = to + 1;
        self.shared.position.store(to, Ordering::Release);
        Ok(())
    }

    fn add(&mut self, lsn: Lsn, at: Millis, bytes: &[u8]) -> Result<(), Failure> {
        let io = |e: io::Error| Failure::Retry(format!("writing a segment: {e}"));
        if self.open.is_none() {
            // The dir may have been removed under the server: made again, not failed forever.
            std::fs::create_dir_all(&self.config.dir).map_err(io)?;
            let tmp = self.config.dir.join(format!("{}.tmp", segment_name(lsn, lsn)));
            let file = File::create(&tmp).map_err(io)?;
            let out = BlockWriter::new(file, MAGIC, FORMAT).map_err(io)?;
            lock(&self.shared.state).behind_since.get_or_insert_with(|| self.clock.now());
            self.open = Some(Open {
                tmp,
                out,
                first: lsn,
                last: lsn,
                first_at: at,
                last_at: at,
                bytes: 0,
                opened: Instant::now(),
            });
        }
        let open = self.open.as_mut().expect("opened above");
        let mut head = [0u8; 25];
        head[0] = b'R';
        head[1..9].copy_from_slice(&lsn.to_le_bytes());
        head[9..17].copy_from_slice(&at.to_le_bytes());
        head[17..25].copy_from_slice(&(bytes.len() as u64).to_le_bytes());
        open.out.write_all(&head).map_err(io)?;
        open.out.write_all(bytes).map_err(io)?;
        open.last = lsn;
        open.last_at = at;
        open.bytes += bytes.len();
        Ok(())
    }

    /// Seals the open segment: summary, trailer, fsync, rename, directory fsync.
    fn seal(&mut self) -> Result<(), Failure> {
        let Some(open) = self.open.take() else { return Ok(()) };
        let io = |e: io::Error| Failure::Retry(format!("sealing a segment: {e}"));
        let records = open.last - open.first + 1;
        let now = self.clock.now();
        let summary = SegmentSummary {
            format: FORMAT,
            first_lsn: open.first,
            last_lsn: open.last,
            records,
            first_at_ms: open.first_at,
            last_at_ms: open.last_at,
            sealed_at: crate::model::timestamp(now).unwrap_or_default(),
        };
        let tmp = open.tmp.clone();
        // Put back so a failure below discards the file.
        let sealed = (|| -> io::Result<u64> {
            let mut out = open.out;
            out.write_all(b"E")?;
            out.write_all(&records.to_le_bytes())?;
            let bytes = out.written();
            let json = serde_json::to_vec(&summary).map_err(io::Error::other)?;
            let file = out.finish(SUMMARY, &json)?;
            file.sync_all()?;
            let name = self.config.dir.join(segment_name(open.first, open.last));
            std::fs::rename(&tmp, &name)?;
            File::open(&self.config.dir)?.sync_all()?;
            Ok(bytes)
        })();
        let bytes = match sealed {
            Ok(bytes) => bytes,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                self.cursor = self.shared.position.load(Ordering::Acquire) + 1;
                return Err(io(e));
            }
        };
        self.shared.position.store(open.last, Ordering::Release);
        let mut state = lock(&self.shared.state);
        if state.last_error.take().is_some() {
            tracing::info!(dir = %self.config.dir.display(), position = open.last,
                "the log archive writes again");
        }
        state.last_sealed_at = Some(now);
        state.segments_sealed += 1;
        state.bytes_sealed += bytes;
        state.behind_since = None;
        Ok(())
    }

    /// Drops the unsealed segment; the next step reads its records again.
    fn discard(&mut self) {
        if let Some(open) = self.open.take() {
            drop(open.out);
            let _ = std::fs::remove_file(&open.tmp);
        }
        let position = self.shared.position.load(Ordering::Acquire);
        self.cursor = position + 1;
        // The time before the cursor is that of the last sealed record: read again from the
        // log, the records after it get the same times.
        if let Some(last) = list(&self.config.dir).ok().and_then(|l| l.into_iter().last()) {
            if last.last == position {
                if let Ok((_, s)) =
                    File::open(&last.path).map_err(BlockError::from).and_then(blocks::read_summary)
                {
                    if let Ok(s) = serde_json::from_slice::<SegmentSummary>(&s) {
                        self.previous_at = s.last_at_ms;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::test_support::add;
    use crate::{Service, ServiceConfig};

    async fn service(dir: &Path) -> Service {
        let mut config = crate::test_support::config(dir);
        // The feed keeps nothing: only the archive's hold keeps records from truncation.
        config.retention = crate::shared::Retention { days: 0, min_changes: 0 };
        crate::test_support::open_with_one_sheet(config).await
    }

    async fn archived_up_to(service: &Service, lsn: Lsn) -> ArchiveStatus {
        for _ in 0..600 {
            let status = service.archive_status().unwrap();
            if status.position >= lsn {
                return status;
            }
            actix_rt::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never archived up to {lsn}: {:?}", service.archive_status());
    }

    fn read_all(dir: &Path) -> Result<Vec<(Lsn, Vec<u8>)>, ArchiveError> {
        let mut records = Vec::new();
        for segment in list(dir)? {
            let mut reader = SegmentReader::open(&segment)?;
            while let Some(r) = reader.next_record()? {
                records.push((r.lsn, r.bytes));
            }
        }
        Ok(records)
    }

    /// Every durable record ends up in sealed segments as the log stored it, a checkpoint keeps
    /// what the archive has not taken, a restart goes on after the last segment, and a flipped
    /// byte or a segment's missing trailer is found.
    #[actix_rt::test]
    async fn the_archive_holds_every_record_in_order_and_damage_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("archive");
        let config = |hold| ArchiveConfig {
            dir: archive.clone(),
            seal_after: Duration::from_millis(1),
            segment_bytes: 1 << 20,
            hold_records: hold,
        };
        let service = service(&dir.path().join("data")).await;
        service.start_archive(config(1_000_000)).unwrap();
        for n in 0..20 {
            add(&service, n).await;
        }
        let status = archived_up_to(&service, service.durable_lsn()).await;
        assert!(status.last_error.is_none() && status.gaps.is_empty(), "{status:?}");
        // The log keeps nothing for the feed, so this checkpoint truncates everything the
        // archive has taken, and nothing it has not.
        service.checkpoint().await.unwrap();
        service.stop_archive();
        for n in 20..40 {
            add(&service, n).await;
        }
        let durable = service.durable_lsn();
        service.checkpoint().await.unwrap();
        let log = service.log();
        assert!(log.read_stored(durable).unwrap().is_some(), "kept for the stopped archive");
        service.close().unwrap();
        drop(service);

        // A restart goes on after the last segment with what the checkpoint kept.
        let service = crate::Service::open(ServiceConfig {
            data_dir: dir.path().join("data"),
            sheet_threads: 1,
            clock: Default::default(),
            min_free_bytes: None,
            retention: crate::shared::Retention { days: 0, min_changes: 0 },
            archive: None,
        })
        .unwrap()
        .0;
        service.start_archive(config(1_000_000)).unwrap();
        // A second archive into the same dir (another server's) is refused while this runs.
        let other: Arc<dyn ArchiveSource> = Arc::new(service.log());
        let refused = Archive::start(config(1_000_000), other, Default::default()).err();
        assert!(
            refused.as_ref().is_some_and(|e| matches!(e, ArchiveError::InUse { .. })),
            "{refused:?}"
        );
        add(&service, 40).await;
        let last = service.durable_lsn();
        let status = archived_up_to(&service, last).await;
        assert!(status.gaps.is_empty(), "no gap across the restart: {status:?}");
        let records = read_all(&archive).unwrap();
        let lsns: Vec<Lsn> = records.iter().map(|(l, _)| *l).collect();
        assert_eq!(lsns, (1..=last).collect::<Vec<_>>(), "every record, in order, once");
        let (lsn, bytes) = &records[records.len() - 1];
        assert_eq!(Some(bytes), service.log().read_stored(*lsn).unwrap().as_ref());
        service.stop_archive();
        service.close().unwrap();

        let segments = list(&archive).unwrap();
        let victim = &segments[segments.len() / 2];
        let mut bytes = std::fs::read(&victim.path).unwrap();
        let keep = bytes.clone();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x04;
        std::fs::write(&victim.path, &bytes).unwrap();
        assert!(matches!(read_all(&archive), Err(ArchiveError::Damaged { .. })));
        std::fs::write(&victim.path, &keep[..keep.len() - 5]).unwrap();
        assert!(
            matches!(
                read_all(&archive),
                Err(ArchiveError::Damaged { source: BlockError::Truncated { .. }, .. })
            ),
            "{:?}",
            read_all(&archive).err()
        );
    }

    /// The head's layout follows the record's: the same time as a whole decode, for every
    /// kind, small and compressed.
    #[test]
    fn a_records_time_read_from_its_head_is_the_whole_records() {
        use crate::record::{IdemEntry, SheetWrite};
        let answer = IdemEntry {
            key_id: 7,
            idem_key: "k".to_owned(),
            fingerprint: [3; 32],
            status: 200,
            body: vec![1; 5000],
            request_id: "req_1".to_owned(),
            completed_at: 1_700_000_000_123,
        };
        let write = |rows: usize| {
            let cells = [(100, crate::model::Json(json!("x".repeat(100))))].into_iter().collect();
            let row = crate::model::Row::new(1, 10, cells, crate::model::SOURCE_API, 5);
            Record::Sheet(SheetWrite {
                sheet_id: 10,
                at: 1_700_000_000_456,
                put: (0..rows).map(|_| Arc::new(row.clone())).collect(),
                deleted: vec![4, 5],
                idem: Some(answer.clone()),
            })
        };
        for (record, expected) in [
            (write(1), 1_700_000_000_456),
            (write(500), 1_700_000_000_456),
            (Record::Idempotency(answer.clone()), 1_700_000_000_123),
            (Record::Marker, 42),
        ] {
            let bytes = codec::encode(&record).unwrap();
            let head = codec::decode_prefix::<RecordHead>(&bytes).is_ok();
            assert!(head, "{record:?} has a head");
            assert_eq!(record_time(&bytes, 42).unwrap(), expected, "{record:?}");
        }
        let big = codec::encode(&write(500)).unwrap();
        assert!(big[0] & codec::COMPRESSED != 0, "a bulk write is stored compressed");
    }

    /// A start that finds no sweep marker (a crash between a checkpoint and its truncation)
    /// keeps the records the archive has not taken, as the checkpoint would have.
    #[actix_rt::test]
    async fn a_start_without_a_sweep_marker_keeps_what_the_archive_has_not_taken() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let config = ArchiveConfig {
            dir: dir.path().join("archive"),
            seal_after: Duration::from_millis(1),
            segment_bytes: 1 << 20,
            hold_records: 1_000_000,
        };
        let service = service(&data).await;
        service.start_archive(config.clone()).unwrap();
        archived_up_to(&service, service.durable_lsn()).await;
        service.stop_archive();
        for n in 0..20 {
            add(&service, n).await;
        }
        service.checkpoint().await.unwrap();
        service.close().unwrap();
        drop(service);
        std::fs::remove_file(data.join("checkpoint.swept")).unwrap();
        let (service, _) = Service::open(ServiceConfig {
            data_dir: data,
            sheet_threads: 1,
            clock: Default::default(),
            min_free_bytes: None,
            retention: crate::shared::Retention { days: 0, min_changes: 0 },
            archive: Some(config.clone()),
        })
        .unwrap();
        service.start_archive(config).unwrap();
        let status = archived_up_to(&service, service.durable_lsn()).await;
        assert!(status.gaps.is_empty(), "{status:?}");
        service.stop_archive();
    }

    /// Past `hold_records`, a checkpoint lets the oldest records go, and the archive reports
    /// the gap instead of skipping it.
    #[actix_rt::test]
    async fn records_dropped_past_the_hold_are_a_reported_gap() {
        let dir = tempfile::tempdir().unwrap();
        let service = service(&dir.path().join("data")).await;
        let archive = dir.path().join("archive");
        let config = ArchiveConfig {
            dir: archive.clone(),
            seal_after: Duration::from_millis(1),
            segment_bytes: 1 << 20,
            hold_records: 3,
        };
        service.start_archive(config.clone()).unwrap();
        archived_up_to(&service, service.durable_lsn()).await;
        service.stop_archive();
        for n in 0..20 {
            add(&service, n).await;
        }
        service.checkpoint().await.unwrap();
        service.close().unwrap();
        drop(service);
        let (service, _) = Service::open(ServiceConfig {
            data_dir: dir.path().join("data"),
            sheet_threads: 1,
            clock: Default::default(),
            min_free_bytes: None,
            retention: crate::shared::Retention { days: 0, min_changes: 0 },
            archive: None,
        })
        .unwrap();
        service.start_archive(config).unwrap();
        let status = archived_up_to(&service, service.durable_lsn()).await;
        assert_eq!(status.gaps.len(), 1, "{status:?}");
        assert!(status.trouble().unwrap().contains("gap"), "{status:?}");
        service.stop_archive();
    }
}
