//! The sheetd domain and its owners.
//!
//! # Layout
//!
//! Each module uses only those listed before it, so the crate has no import cycles.
//!
//! - [`model`]: ids and plain data (users, projects, sheets, columns, rows, keys).
//! - [`webhook`]: webhooks (X8): the table, the records that change it, and the store that
//!   shows readers its durable state.
//! - [`coerce`]: cell coercion per column type, and the one RFC 3339 parser (pure).
//! - [`error`]: the domain's one error type.
//! - [`record`]: what the domain writes to the log.
//! - [`log`]: the one seam to the log ([`log::RecordLog`]): append, read back by position,
//!   checkpoint, replay; [`log::WalLog`] is its one-node implementation on the `wal` crate.
//! - [`publish`]: the one publisher of durable state ([`publish::Publisher`]), used by the
//!   sheet and directory actors alike.
//! - [`shared`]: the clock, the row-id counter, idempotency and event side stores, and the one
//!   append of the domain ([`log::RecordLog::append`] with the side stores' changes).
//! - [`sheet`]: the [`SheetActor`], the one writer of a sheet's rows.
//! - [`registry`]: where sheet actors live (spread over one arbiter per core).
//! - [`directory`]: the directory / key-registry actor, the one access rule, API keys
//!   ([`directory::keys`]) and the fixture format ([`directory::fixture`]).
//! - [`report`]: the [`ReportRunner`]: saved report definitions, compiled and run over snapshots.
//! - [`digest`]: the state's digest, one hash of everything a recovery rebuilds.
//! - [`archive`]: the log archive: segment files of every durable record, the thread that
//!   writes them behind the log, and reading them back for a restore to a point in time.
//! - [`local`]: a follower's applied state, published for local reads.
//! - [`service`]: recovery, actor start-up, checkpoints and a backup's consistent copies; the
//!   one way in from above.
//! - [`backup`]: the backup file: writing one from the service's copies, verifying one,
//!   restoring one into a new data dir (rolled forward with the archive's records).
//! - [`replica`]: a cluster node's domain: committed records applied on a follower, the
//!   actors started when it leads, and the log seam over the Raft group (`cluster` crate).
//! - [`adopt`]: a single node's data dir becoming a cluster of one.
//! - [`reads`]: where a read is answered from: this node's [`Service`], or a follower's applied
//!   state ([`replica::LocalReads`]).
//!
//! The log is this crate's alone, and inside it every append, read and checkpoint goes through
//! [`log::RecordLog`]: the server and the CLI reach the log only through [`Service`], whose
//! figures come in the log's own types, re-exported here ([`Lsn`], [`WalStats`],
//! [`RecoveryReport`], [`FLUSH_LATENCY_BUCKETS_SECONDS`]). Besides `log`, only the record
//! format's version checks (`model`) and the error type name the `wal` crate (a backup reads
//! and writes data dirs through what `log` re-exports).
//!
//! # Guarantees
//!
//! - Nothing is acknowledged before its record is durable; no read reveals state whose record
//!   is not durable (readers wait for the LSN they saw).
//! - One writer per sheet: versions, `If-Match` preconditions, capacity and subtree deletes are
//!   decided in mailbox order.
//! - A write and its side effects (idempotency response, events) are one record.
#![forbid(unsafe_code)]

pub mod adopt;
pub mod archive;
pub mod backup;
pub mod coerce;
pub mod digest;
pub mod directory;
pub mod error;
pub mod local;
pub mod log;
pub mod model;
pub mod publish;
pub mod reads;
pub mod record;
pub mod registry;
pub mod replica;
pub mod report;
pub mod service;
pub mod shared;
pub mod sheet;
pub mod webhook;

#[cfg(test)]
mod test_support;

pub use directory::{DirectoryActor, DirectoryState, Target};
pub use error::{Error, Result};
pub use log::{Lsn, RecoveryReport, WalStats, FLUSH_LATENCY_BUCKETS_SECONDS};
pub use report::ReportRunner;
pub use service::{Service, ServiceConfig};
pub use sheet::SheetActor;
