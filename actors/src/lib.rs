//! The sheetd domain and its owners.
//!
//! # Layout
//!
//! - [`model`]: ids and plain data (users, projects, sheets, columns, rows, keys).
//! - [`coerce`]: cell coercion per column type (pure).
//! - [`directory`]: the directory / key-registry actor and the one access rule.
//! - [`sheet`]: the [`SheetActor`], the one writer of a sheet's rows.
//! - [`registry`]: where sheet actors live (spread over one arbiter per core).
//! - [`report`]: the [`ReportRunner`]: saved report definitions, compiled and run over snapshots.
//! - [`record`]: what the domain writes to the log.
//! - [`shared`]: the clock, the row-id counter, idempotency and event side stores.
//! - [`fixture`]: the fixture format, validated into an import.
//! - [`service`]: recovery, actor start-up and checkpoints.
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
pub mod fixture;
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
