//! The crate's one error type, [`Error`], and the detail types it carries.
//!
//! Owns: every way a `wal` operation can fail, phrased as a sentence an operator can act on,
//! plus the two questions callers ask of an error ([`Error::is_corruption`] and
//! [`Error::is_retryable`]).
//!
//! Guarantees:
//! - Every message names the thing that failed (an LSN, a file, the data dir) and, for damage,
//!   says what to do next. Messages do not repeat their `source()`; print the chain (for example
//!   with `{:#}` in `anyhow`) to see the underlying cause.
//! - `Error` is `Send + Sync + 'static`, so it crosses threads and lives in `Arc`s: one flush
//!   failure is shared by every waiter it affects.

use std::error::Error as StdError;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use crate::Lsn;

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error boxed by a [`crate::Replayer`]; recovery wraps it with the LSN it was replaying.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Everything that can go wrong in the write-ahead log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another process (or another `Wal` in this process) has the data dir open.
    #[error(
        "data dir {} is in use by another process (its log store is locked); stop the other \
         sheetd or point this one at a different data dir",
        .dir.display()
    )]
    InUse {
        /// The data dir whose `log/db` file is locked.
        dir: PathBuf,
    },

    /// A restore was pointed at a directory that already holds something.
    #[error("{} is not empty: a restore writes only into an empty or absent data dir", .dir.display())]
    NotEmpty {
        /// The directory.
        dir: PathBuf,
    },

    /// A restore was given its parts out of order.
    #[error("restore: {0}")]
    Restore(&'static str),

    /// `verify` was pointed at a directory that does not exist (it never creates one).
    #[error("data dir {} does not exist", .dir.display())]
    NoDataDir {
        /// The missing directory.
        dir: PathBuf,
    },

    /// The file system holding a directory the log must write to has too little free space
    /// for the operation to be sure to finish, so nothing was started.
    #[error(
        "not enough free space to {action} {}: it needs {needed} bytes free on that file \
         system and {available} are available. Nothing was changed; free space (or move the \
         data dir to a larger disk) and try again",
        .dir.display()
    )]
    NoSpace {
        /// What would have been done ("open the log in", "copy the log for checking to").
        action: &'static str,
        /// The directory that would have been written.
        dir: PathBuf,
        /// Free bytes the operation needs before it starts.
        needed: u64,
        /// Free bytes available to this process on that file system.
        available: u64,
    },

    /// A file-system operation on a named file or directory failed.
    #[error("could not {action}")]
    Fs {
        /// What was being done, naming the path (e.g. "fsync the checkpoint file /d/checkpoint.tmp").
        action: String,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },

    /// An I/O error without more context (kept for `?` on plain `io::Result`s).
    #[error("an I/O operation on the write-ahead log failed")]
    Io(#[from] io::Error),

    /// sled, the storage engine under the log, reported an error.
    #[error("the log store (sled) reported an error")]
    Store(#[from] sled::Error),

    /// Encoding or decoding a value through [`crate::codec`] failed.
    #[error(transparent)]
    Codec(#[from] CodecError),

    /// Bytes carry a format version this build does not know (written by a newer sheetd).
    #[error(
        "{what} has format version {found}, but this build understands only version \
         {supported}; it was probably written by a newer sheetd"
    )]
    UnsupportedVersion {
        /// What carried the version byte ("a codec value", "log record 42", "the checkpoint file ...").
        what: String,
        /// The version byte found.
        found: u8,
        /// The version this build writes and reads.
        supported: u8,
    },

    /// Stored data is damaged; start-up refuses to continue rather than lose data silently.
    #[error(transparent)]
    Corrupt(#[from] Corruption),

    /// The [`crate::Replayer`] rejected the checkpoint; recovery stopped.
    #[error("recovery stopped: the replayer rejected the checkpoint at LSN {lsn}")]
    ReplayCheckpoint {
        /// LSN of the checkpoint being delivered.
        lsn: Lsn,
        /// The replayer's error.
        #[source]
        source: BoxError,
    },

    /// The [`crate::Replayer`] rejected a log record; recovery stopped.
    #[error("recovery stopped: the replayer rejected log record {lsn}")]
    ReplayRecord {
        /// LSN of the record being delivered.
        lsn: Lsn,
        /// The replayer's error.
        #[source]
        source: BoxError,
    },

    /// An earlier write, flush or fsync failed. The log accepts nothing more: acknowledging a
    /// later record would be a lie, because its predecessors may not be on disk.
    #[error(
        "the write-ahead log has failed and takes no writes until it is re-opened from disk; \
         records that were not yet acknowledged may be lost"
    )]
    LogFailed {
        /// The failure that stopped the log (shared by every waiter it affected).
        #[source]
        cause: Arc<Error>,
    },

    /// The log was re-opened ([`crate::Wal::heal`]) since the appender's state was read, so
    /// that state may hold records the failed log lost: re-read it, then append.
    #[error(
        "the write-ahead log was re-opened after a failure (epoch {epoch}) since this writer's \
         state was read; it must be read again before writing"
    )]
    Reopened {
        /// The log's epoch now.
        epoch: u64,
    },

    /// The log was shut down; nothing more can be appended.
    #[error("the write-ahead log has been shut down and accepts no more writes")]
    ShutDown,

    /// The commit thread stopped without answering (it panicked). Nothing it had not
    /// acknowledged is assumed durable.
    #[error(
        "the write-ahead log's commit thread stopped unexpectedly; the record was not \
         acknowledged as durable"
    )]
    CommitThreadDied,

    /// A checkpoint was requested at an LSN that is not durable yet.
    #[error("cannot checkpoint at LSN {lsn}: only LSNs up to {durable} are durable so far")]
    CheckpointAhead {
        /// The requested checkpoint LSN.
        lsn: Lsn,
        /// The durable LSN at the time of the request.
        durable: Lsn,
    },

    /// A checkpoint was requested at an LSN older than the current checkpoint. Allowing it
    /// would leave a gap: the records between the two were already truncated.
    #[error("cannot checkpoint at LSN {lsn}: a newer checkpoint at LSN {current} already exists")]
    CheckpointBehind {
        /// The requested checkpoint LSN.
        lsn: Lsn,
        /// The LSN of the checkpoint on disk.
        current: Lsn,
    },

    /// [`crate::Wal::append_batch_at`] was given an LSN other than the next one: the record
    /// would leave a hole or overwrite one.
    #[error("cannot append at LSN {given}: the next LSN of the log is {next}")]
    NotNextLsn {
        /// The LSN asked for.
        given: Lsn,
        /// The LSN the next record gets.
        next: Lsn,
    },

    /// [`crate::Wal::truncate_after`] was asked to remove records the checkpoint already
    /// covers: they are gone from the log, so the truncation could not make it end there.
    #[error(
        "cannot truncate the log after LSN {lsn}: the checkpoint at LSN {checkpoint} covers it"
    )]
    TruncateBelowCheckpoint {
        /// The LSN the log was to end at.
        lsn: Lsn,
        /// The checkpoint's LSN.
        checkpoint: Lsn,
    },

    /// A payload does not fit the frame's `u32` length field.
    #[error("a log record of {len} bytes is too large (the limit is {} bytes)", u32::MAX)]
    RecordTooLarge {
        /// The payload length.
        len: usize,
    },

    /// A caller passed something unusable (an empty batch, an LSN that is not in the log, ...).
    #[error("{message}")]
    InvalidArgument {
        /// What was wrong, as a sentence.
        message: String,
    },
}

impl Error {
    /// True when stored data is damaged: the right response is to stop, restore from a backup
    /// or run `sheetd check`, not to retry.
    ///
    /// Replayer errors count when the replayer's own error is a corruption `wal::Error` (for
    /// example a nested log it was reading). Codec failures do not: bytes that passed their
    /// CRC but do not decode point at a version or type mismatch, not at damage.
    #[must_use]
    pub fn is_corruption(&self) -> bool {
        match self {
            Error::Corrupt(_) => true,
            // sled's own checksums failed: the damage is below our frames, but damage it is.
            Error::Store(sled::Error::Corruption { .. }) => true,
            Error::ReplayCheckpoint { source, .. } | Error::ReplayRecord { source, .. } => {
                source.downcast_ref::<Error>().is_some_and(Error::is_corruption)
            }
            Error::LogFailed { cause } => cause.is_corruption(),
            _ => false,
        }
    }

    /// True when the log refused a record because the disk cannot take it now: free space below
    /// the floor, or a write, flush or fsync that failed. Nothing of the refused record is
    /// applied anywhere; the client may retry later (503 `storage_unavailable`).
    #[must_use]
    pub fn is_storage_unavailable(&self) -> bool {
        matches!(self, Error::NoSpace { .. } | Error::LogFailed { .. } | Error::Reopened { .. })
    }

    /// True when the same operation may succeed if tried again later without operator action:
    /// the data dir is locked by a process that may exit, a checkpoint asked for an LSN that is
    /// about to become durable, or the OS reported a transient I/O condition.
    ///
    /// A failed log ([`Error::LogFailed`]) is not retryable: it needs a restart.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::InUse { .. } | Error::CheckpointAhead { .. } | Error::NoSpace { .. } => true,
            Error::Fs { source, .. } | Error::Io(source) => io_is_transient(source),
            Error::Store(sled::Error::Io(source)) => io_is_transient(source),
            _ => false,
        }
    }

    /// Wraps an `io::Error` with a sentence naming what was being done.
    pub(crate) fn fs(action: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
        let action = action.into();
        move |source| Error::Fs { action, source }
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::InvalidArgument { message: message.into() }
    }
}

/// I/O error kinds that describe a passing condition rather than a broken disk.
fn io_is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::TimedOut
            | io::ErrorKind::ResourceBusy
    )
}

/// Damage found in the data dir. Each message names the LSN or file and says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Corruption {
    /// A record before the end of the log failed its frame check. Only the very last record
    /// may be torn by a crash; damage earlier means acknowledged data is at risk.
    #[error(
        "log record {lsn} is damaged ({defect}) before the end of the log; refusing to start. \
         Restore the data dir from a backup or run `sheetd check`."
    )]
    Record {
        /// The damaged record's LSN.
        lsn: Lsn,
        /// What the frame check found.
        defect: FrameDefect,
    },

    /// LSNs are not contiguous: acknowledged records are missing.
    #[error(
        "log records {first_missing} to {last_missing} are missing (the next record present is \
         {next_present}); refusing to start. Restore the data dir from a backup or run \
         `sheetd check`."
    )]
    Gap {
        /// First LSN that should be present but is not.
        first_missing: Lsn,
        /// Last LSN that should be present but is not.
        last_missing: Lsn,
        /// The LSN found instead.
        next_present: Lsn,
    },

    /// A key in the log store is not a valid big-endian LSN.
    #[error(
        "the log store holds an invalid key ({detail}); refusing to start. Restore the data dir \
         from a backup or run `sheetd check`."
    )]
    BadKey {
        /// What is wrong with the key.
        detail: String,
    },

    /// The checkpoint file failed its checks. It is never ignored: the records it replaced
    /// may already be truncated from the log.
    #[error(
        "the checkpoint file {} is damaged ({defect}); refusing to start. Restore the data dir \
         from a backup or run `sheetd check`.",
        .path.display()
    )]
    Checkpoint {
        /// Path of the checkpoint file.
        path: PathBuf,
        /// What the check found.
        defect: String,
    },

    /// The state file ([`crate::Wal::save_state`]) failed its checks. Never ignored: what it
    /// held (a replicated log's vote, for one) must not silently go back to nothing.
    #[error(
        "the state file {} is damaged ({defect}); refusing to start. Restore the data dir \
         from a backup.",
        .path.display()
    )]
    State {
        /// Path of the state file.
        path: PathBuf,
        /// What the check found.
        defect: String,
    },
}

/// What is wrong with a stored record frame (see [`crate::frame`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameDefect {
    /// Fewer bytes than the fixed header.
    #[error("only {len} of the {header} header bytes are present")]
    ShortHeader {
        /// Bytes present.
        len: usize,
        /// The frame header's size: 9 bytes (version, length, CRC).
        header: usize,
    },
    /// The header promises more payload than is stored.
    #[error("truncated: {len} of {expected} bytes are present")]
    Truncated {
        /// Bytes present.
        len: usize,
        /// Bytes the header promises (header + payload).
        expected: usize,
    },
    /// More bytes are stored than the header accounts for.
    #[error("{len} bytes are stored but the header accounts for {expected}")]
    TrailingBytes {
        /// Bytes present.
        len: usize,
        /// Bytes the header accounts for.
        expected: usize,
    },
    /// A record stored in chunks lacks some of them, or its chunks disagree on their count.
    #[error("chunk {index} of {count} is missing or out of place")]
    MissingChunk {
        /// The first chunk index that is not where it should be.
        index: u32,
        /// How many chunks the record's keys announce.
        count: u32,
    },
    /// The checksum over version, length and payload does not match.
    #[error("CRC mismatch")]
    CrcMismatch {
        /// CRC stored in the frame.
        stored: u32,
        /// CRC computed over the stored bytes.
        computed: u32,
    },
    /// A pack's body (several records in one value) does not decode to the records its key
    /// announces.
    #[error("the pack of {count} records does not decode")]
    BadPack {
        /// How many records the pack's key announces.
        count: u32,
    },
    /// The checksum matches but the version byte is unknown: written by a newer build.
    #[error("unknown format version {found}")]
    UnknownVersion {
        /// The version byte found.
        found: u8,
    },
}

/// Why [`crate::codec::encode`] or [`crate::codec::decode`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// bincode could not encode the value.
    #[error("could not encode a value with bincode")]
    Encode(#[from] bincode::error::EncodeError),
    /// bincode could not decode the bytes into the requested type.
    #[error(
        "could not decode a value with bincode (the bytes do not match the expected type; they \
         may come from an incompatible build)"
    )]
    Decode(#[from] bincode::error::DecodeError),
    /// A compressed value's zstd frame did not decompress.
    #[error("could not decompress a value: {0}")]
    Decompress(#[source] std::io::Error),
    /// A compressed value is shorter than its header or decompresses to fewer bytes than it
    /// announces.
    #[error("a compressed value is cut short")]
    Truncated,
    /// The input was empty, so even the version byte is missing.
    #[error("cannot decode an empty byte string: the format version byte is missing")]
    Empty,
    /// The value decoded but bytes were left over: the input is not one value of that type.
    #[error("{extra} unexpected bytes follow the decoded value")]
    TrailingBytes {
        /// Number of bytes left over.
        extra: usize,
    },
}

impl From<bincode::error::EncodeError> for Error {
    fn from(e: bincode::error::EncodeError) -> Self {
        Error::Codec(CodecError::Encode(e))
    }
}

impl From<bincode::error::DecodeError> for Error {
    fn from(e: bincode::error::DecodeError) -> Self {
        Error::Codec(CodecError::Decode(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corruption_and_retry_classification() {
        let corrupt: Error = Corruption::Record {
            lsn: 42,
            defect: FrameDefect::CrcMismatch { stored: 1, computed: 2 },
        }
        .into();
        assert!(corrupt.is_corruption());
        assert!(!corrupt.is_retryable());
        assert_eq!(
            corrupt.to_string(),
            "log record 42 is damaged (CRC mismatch) before the end of the log; refusing to \
             start. Restore the data dir from a backup or run `sheetd check`."
        );

        let nested = Error::ReplayRecord { lsn: 7, source: Box::new(corrupt) };
        assert!(nested.is_corruption());
        let plain = Error::ReplayRecord { lsn: 7, source: "bad op".into() };
        assert!(!plain.is_corruption());

        assert!(Error::InUse { dir: "/d".into() }.is_retryable());
        assert!(Error::CheckpointAhead { lsn: 5, durable: 4 }.is_retryable());
        assert!(!Error::ShutDown.is_retryable());
        let failed = Error::LogFailed { cause: Arc::new(Error::Io(io::Error::other("disk gone"))) };
        assert!(!failed.is_retryable());
        assert!(!failed.is_corruption());
    }

    #[test]
    fn errors_are_send_sync_static() {
        fn check<T: Send + Sync + 'static>() {}
        check::<Error>();
    }
}
