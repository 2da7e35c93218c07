//! [`Error`], the cluster crate's one error type, and its [`Result`].
//!
//! openraft's storage traits speak `std::io::Error`; the adapters wrap an [`Error`] in one
//! (`io::Error::other`), so the cause stays readable in openraft's own errors and logs.

use crate::types::LogId;

/// What can go wrong in the cluster's storage and its link.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The wal refused or failed: I/O, damage, a full disk, a position out of place. Encoding
    /// and decoding failures are the wal codec's, so they come this way too.
    #[error(transparent)]
    Wal(#[from] wal::Error),

    /// An entry the log's ends say is present could not be read.
    #[error("the Raft log has no entry at index {index}, though it should hold one")]
    MissingEntry {
        /// The Raft index of the missing entry.
        index: u64,
    },

    /// A snapshot given to install does not hold the state its metadata describes.
    #[error(
        "the snapshot does not match its metadata: it holds the state at {found:?}, its \
         metadata says {expected:?}"
    )]
    SnapshotMismatch {
        /// The last log id the metadata names.
        expected: Option<LogId>,
        /// The last log id the snapshot's state was taken at.
        found: Option<LogId>,
    },

    /// A cluster secret shorter than the link accepts.
    #[error("the cluster secret has {len} bytes; at least {min} are needed")]
    SecretTooShort {
        /// The given secret's length.
        len: usize,
        /// The shortest accepted.
        min: usize,
    },
}

/// The cluster crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
