//! The domain's one error type.
//!
//! Every message that can fail returns [`Result`]. The HTTP layer maps each variant to exactly
//! one error code of the API, so the variants follow the codes a client can act on, and carry
//! the details the contract promises (the current row on a version conflict, the column on a
//! coercion failure). Nothing here knows about HTTP.

use crate::coerce::CoerceError;
use crate::model::{ColumnId, Row, RowId};

/// `Result` with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a domain operation can refuse or fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object does not exist (or, at the HTTP layer, is out of the caller's reach).
    #[error("{0} not found")]
    NotFound(String),
    /// A cell value failed coercion (or named an unknown column).
    #[error(transparent)]
    Coerce(#[from] CoerceError),
    /// The write named a stale version.
    #[error("row {} has version {}, not the version sent", .current.id, .current.version())]
    VersionConflict {
        /// The row as it is now.
        current: Box<Row>,
        /// With `baseCells`: cells the request changes that also changed since the base.
        conflicting: Option<Vec<ColumnId>>,
        /// With `baseCells`: cells the request changes that did not change since the base.
        mergeable: Option<Vec<ColumnId>>,
    },
    /// The write's `If-Match` names no current version of the row (nothing was written).
    #[error("row {} is at version {}, which the write's precondition does not name", .current.id, .current.version())]
    PreconditionFailed {
        /// The row as it is now.
        current: Box<Row>,
    },
    /// An upsert's `keyColumn` names no column of the sheet, or one whose type cannot be a key
    /// (a whole-request refusal: the request is malformed for this sheet).
    #[error("{0}")]
    KeyColumn(String),
    /// An upsert item's key value is held by more than one row, so it names no single row.
    #[error(
        "the key value is held by {} rows ({}); a key must name at most one row",
        .row_ids.len(),
        .row_ids.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
    )]
    AmbiguousKey {
        /// The key column.
        column_id: ColumnId,
        /// The rows holding the key value, ascending.
        row_ids: Vec<RowId>,
    },
    /// The sheet is at its plan's row cap.
    #[error("the sheet has reached its cap of {cap} rows")]
    CapacityExceeded {
        /// The cap that applies.
        cap: u64,
    },
    /// Bad input to an admin or import operation, with a sentence naming the offending object.
    #[error("{message}")]
    Invalid {
        /// What is wrong, naming the object.
        message: String,
        /// Optional machine-readable detail (e.g. `{"scopeId": 3}`).
        detail: Option<serde_json::Value>,
    },
    /// The log failed: nothing more can be acknowledged.
    #[error("write-ahead log: {0}")]
    Wal(#[from] wal::Error),
    /// Two of the service's own stores disagree (a change index and the log): a defect or
    /// damage, never a client's doing.
    #[error("{0}")]
    Inconsistent(String),
    /// A cluster node cannot take the write now: it is not the leader, a leader change is under
    /// way, or no majority answers.
    #[error("{reason}")]
    ClusterUnavailable {
        /// Whether the write is certainly not applied, or may yet be.
        outcome: ClusterOutcome,
        /// The leader this node knows of.
        leader: Option<u64>,
        /// A sentence for the operator's log and the client.
        reason: String,
    },
    /// The node's part of its cluster failed to start or stop (its data dir, its address).
    #[error("cluster node: {0}")]
    Cluster(String),
    /// An actor's mailbox is closed (the service is shutting down).
    #[error("the {0} actor is not running")]
    Unavailable(&'static str),
    /// A saved report cannot run: its definition does not compile, or the run exceeds a cap.
    #[error("{message}")]
    Report {
        /// Compile failure or cap.
        kind: ReportErrorKind,
        /// A sentence for the report's author, naming the problem.
        message: String,
        /// Where and what: `{"path", "column", "reason"}` or `{"cap", "limit", "value"}`.
        detail: serde_json::Value,
    },
}

/// The fate of a write a cluster node could not acknowledge (`detail.outcome` of
/// `503 cluster_unavailable`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterOutcome {
    /// Certainly not applied: a retry is safe.
    NotApplied,
    /// Proposed, and its fate could not be learned in time: it may or may not apply; a retry
    /// with the same `Idempotency-Key` tells which.
    Unknown,
}

impl ClusterOutcome {
    /// The contract's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterOutcome::NotApplied => "not_applied",
            ClusterOutcome::Unknown => "unknown",
        }
    }
}

/// Why a report cannot run (the HTTP layer maps each to one error code).
///
/// It lives here, not in [`crate::report`], so this module depends on nothing that depends on
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportErrorKind {
    /// The definition cannot be compiled (`report_compile_failed`, 422).
    CompileFailed,
    /// The run exceeds a cap (`report_cap_exceeded`, 413).
    CapExceeded,
}

impl Error {
    /// Shorthand for [`Error::Invalid`] without detail.
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::Invalid { message: message.into(), detail: None }
    }

    /// Whether the data dir cannot take the write now (below the free-space floor, or the disk
    /// refused it) while the log stays healthy: nothing was written and a retry may succeed.
    pub fn is_storage_unavailable(&self) -> bool {
        matches!(self, Error::Wal(e) if e.is_storage_unavailable())
    }
}

impl From<actix::MailboxError> for Error {
    fn from(_: actix::MailboxError) -> Self {
        Error::Unavailable("domain")
    }
}
