//! The sheetd domain and its owners.
//!
//! # Layout
//!
//! Each module uses only those listed before it, so the crate has no import cycles.
//!
//! - [`model`]: ids and plain data (users, projects, sheets, columns, rows, keys).
//! - [`coerce`]: cell coercion per column type, and the one RFC 3339 parser (pure).
//! - [`error`]: the domain's one error type.
//! - [`record`]: what the domain writes to the log.
//! - [`shared`]: the clock, the row-id counter, idempotency and event side stores, and the one
//!   append that changes them.
//! - [`sheet`]: the [`SheetActor`], the one writer of a sheet's rows.
//! - [`registry`]: where sheet actors live (spread over one arbiter per core).
//! - [`directory`]: the directory / key-registry actor, the one access rule, API keys
//!   ([`directory::keys`]) and the fixture format ([`directory::fixture`]).
//! - [`report`]: the [`ReportRunner`]: saved report definitions, compiled and run over snapshots.
//! - [`service`]: recovery, actor start-up and checkpoints; the one way in from above.
//!
//! The log (`wal`) is this crate's alone: the server and the CLI reach it only through
//! [`Service`], whose figures come in the log's own types, re-exported here ([`Lsn`],
//! [`WalStats`], [`RecoveryReport`], [`FLUSH_LATENCY_BUCKETS_SECONDS`]).
//!
//! # Guarantees
//!
//! - Nothing is acknowledged before its record is durable; no read reveals state whose record
//!   is not durable (readers wait for the LSN they saw).
//! - One writer per sheet: versions, `If-Match` preconditions, capacity and subtree deletes are
//!   decided in mailbox order.
//! - A write and its side effects (idempotency response, events) are one record.
#![forbid(unsafe_code)]

pub mod coerce;
pub mod directory;
pub mod error;
pub mod model;
pub mod record;
pub mod registry;
pub mod report;
pub mod service;
pub mod shared;
pub mod sheet;

pub use directory::{DirectoryActor, DirectoryState, Target};
pub use error::{Error, Result};
pub use report::ReportRunner;
pub use service::{Service, ServiceConfig};
pub use sheet::SheetActor;
pub use wal::{Lsn, RecoveryReport, WalStats, FLUSH_LATENCY_BUCKETS_SECONDS};
