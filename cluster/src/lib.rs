//! Replication of sheetd's log with [openraft](https://docs.rs/openraft): the one crate that
//! names the consensus engine, so that its API changes touch this crate alone.
//!
//! It holds openraft's storage: the Raft log of a group kept on the `wal`, and the state
//! machine over a domain that knows nothing of openraft ([`Machine`] over [`Apply`]), with its
//! snapshots (the domain's checkpoints, and the log records they retain), both proven by
//! openraft's own storage test suite (`tests/storage.rs`); the cluster link ([`net`]): Raft
//! traffic and forwarded requests between nodes over TCP, authenticated with the cluster
//! secret, on a runtime of its own; the leader's proposer and membership changes; and a group
//! begun from a single node's state ([`begin_with_state`]). The server runs one [`GroupNode`]
//! per node, with `actors::replica::Replica` as the domain.
//!
//! # Layout
//!
//! Crate map, one line per module; each uses only those listed after it:
//! - `net/`: the cluster link: [`net::ClusterLink`] (listener, runtime, dispatch to the local
//!   Raft), [`net::Network`] (openraft's network), the handshake and authenticated frames.
//! - `contact.rs`: [`Contact`], how old a follower's applied state is (when it last heard
//!   from a leader, and how far that leader had committed).
//! - `adopt.rs`: [`begin_with_state`], a new group's first state from a single node's data.
//! - `machine.rs`: [`Machine`], openraft's state machine over a domain behind [`Apply`], and
//!   the durable copy of its last snapshot.
//! - `membership.rs`: adding and removing members ([`MembershipChange`]), on the leader.
//! - `node.rs`: [`GroupNode`], one member as a server runs it (store, machine, link, core,
//!   proposer), and its [`Status`].
//! - `proposer.rs`: [`Proposer`], the leader's one proposer of a group: a record's Raft index
//!   given before openraft appends it, leases and epochs, [`Leadership`].
//! - `state_machine.rs`: [`RecordsStateMachine`], the applied records in order, and its
//!   snapshots.
//! - `snapshot_data.rs`: [`SnapshotData`], a snapshot's bytes in memory or in a file, and the
//!   [`Spool`] a receiver gathers them in.
//! - `log_store.rs`: [`WalLogStore`], the Raft log on the wal: entry at index `i` = wal record
//!   at LSN `i + 1`; vote, committed and last purged log id in the wal's state file.
//! - `types.rs`: [`TypeConfig`] and what it names: [`Record`] (a group id and an opaque
//!   payload), [`Applied`] (the position applied), [`ClusterNode`] (a member's addresses).
//! - `offload.rs`: where the store's blocking work runs (a blocking thread; inline in a
//!   deterministic simulation).
//! - `error.rs`: [`Error`] and [`Result`].
//!
//! # Guarantees
//!
//! - Nothing is acknowledged before it is durable: an append's flush callback runs after the
//!   wal's group commit fsynced it, a vote or purge point is saved with an fsync before the
//!   call returns; the committed log id, which openraft makes optional, is written lazily
//!   (see `log_store.rs` for the full list).
//! - Every record carries its group id (0 today), so sheets can later be spread over groups.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod adopt;
mod contact;
mod error;
mod log_store;
mod machine;
mod membership;
pub mod net;
mod node;
mod offload;
mod proposer;
mod snapshot_data;
mod state_machine;
mod types;

pub use adopt::{begin_with_state, holds_group};
pub use contact::Contact;
pub use error::{Error, Result};
pub use log_store::{ArchiveHold, RaftState, WalLogStore};
pub use machine::{kept_head, Apply, DomainSnapshot, Machine, SnapshotCounts, WriteState};
pub use membership::{Action, ChangeError, MembershipChange, Phase};
pub use node::{
    raft_config, GroupNode, HoldForArchive, Member, NodeConfig, Status, ELECTION_TIMEOUT_MS,
    HEARTBEAT_MS,
};
pub use proposer::{Leadership, Proposal, ProposeError, Proposer};
pub use snapshot_data::{remove_stale_spools, SnapshotData, Spool, SpoolName};
pub use state_machine::{RecordsState, RecordsStateMachine};
pub use types::{
    Applied, ClusterNode, Entry, GroupId, LogId, NodeId, Record, SnapshotMeta, StoredMembership,
    TypeConfig, Vote, DEFAULT_GROUP,
};
