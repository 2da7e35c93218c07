//! The types the Raft group is declared over: what a log entry carries, what applying one
//! answers, and what a member is.
//!
//! Owns: [`TypeConfig`] (openraft's one type parameter) and the application types in it:
//! [`Record`], [`Applied`], [`ClusterNode`], and the id aliases [`NodeId`] and [`GroupId`].
//! Everything else in the crate is generic over nothing: it names these.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A node's identity for life: a node whose data is lost joins again under a new id, never its
/// old one (an empty node under an old id could vote twice in one term).
pub type NodeId = u64;

/// A Raft group. Today there is one, group 0, holding every sheet; sheets will later be spread
/// over many groups, so every record says which group it belongs to from the start.
pub type GroupId = u64;

/// The one group of a cluster before sheets are spread over several.
pub const DEFAULT_GROUP: GroupId = 0;

/// One record of the replicated log: the bytes the domain appends today through its log seam
/// (an encoded operation), opaque to the cluster, the group it belongs to, and the position
/// its proposer gave it.
///
/// Invariant: a record with `index: Some(i)` is applied only as the entry at Raft index `i`.
/// The leader's [`crate::Proposer`] gives a record its position before openraft appends it
/// (the domain orders its side effects by it); were anything else appended in between, the
/// record lands elsewhere and every node skips it alike, so a wrong guess costs a retry, never
/// a divergence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The group whose log holds the record.
    pub group: GroupId,
    /// The Raft index the proposer gave the record; `None` for a record written without one
    /// (applied wherever it lands).
    pub index: Option<u64>,
    /// The domain's encoded operation.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
}

impl Record {
    /// A record without a position of its own: applied wherever it lands.
    pub fn unplaced(group: GroupId, payload: Vec<u8>) -> Record {
        Record { group, index: None, payload }
    }

    /// Whether the record is to be applied as the entry at `index` (see the invariant).
    pub fn belongs_at(&self, index: u64) -> bool {
        self.index.is_none_or(|i| i == index)
    }
}

impl fmt::Display for Record {
    /// A summary for openraft's logs: never the payload itself, which may be large.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "record of group {} ({} bytes)", self.group, self.payload.len())
    }
}

/// What applying an entry answers: the position it was applied at, which is the Raft log
/// index of its entry (the client's write is acknowledged with it, and a read that must see
/// the write waits until this index is applied), and whether its record was applied or skipped
/// for landing elsewhere than its proposer said ([`Record::belongs_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The Raft log index of the entry.
    pub index: u64,
    /// False when the entry's record was skipped on every node: certainly not applied.
    pub accepted: bool,
}

impl fmt::Display for Applied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.accepted {
            write!(f, "applied at {}", self.index)
        } else {
            write!(f, "skipped at {}: proposed for another position", self.index)
        }
    }
}

/// A member of the cluster as its peers know it: where to send Raft traffic, and where its
/// clients reach it (so a node can forward a request to another).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterNode {
    /// `host:port` of the node's cluster link (node-to-node traffic only).
    pub raft_addr: String,
    /// `host:port` of the node's public API.
    pub api_addr: String,
}

impl fmt::Display for ClusterNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "raft {} api {}", self.raft_addr, self.api_addr)
    }
}

/// The runtime openraft runs on: tokio; in a simulation, tokio with openraft's randomness
/// (election timeouts, first ticks) drawn from the simulation's seed.
#[cfg(not(feature = "sim"))]
type Runtime = openraft::impls::TokioRuntime;
#[cfg(feature = "sim")]
type Runtime = openraft::rt::deterministic_rng::DeterministicRng<openraft::impls::TokioRuntime>;

openraft::declare_raft_types!(
    /// The Raft group's types: records in, applied positions out, `u64` node ids, members
    /// carrying their two addresses; every other choice is openraft's default (terms are
    /// `u64`, a log id names its leader's term and node, the tokio runtime).
    pub TypeConfig:
        D = Record,
        R = Applied,
        NodeId = NodeId,
        Node = ClusterNode,
        AsyncRuntime = Runtime,
);

/// A Raft log entry of this group: a log id (leader's term and node, index) and a payload (a
/// [`Record`], a membership change, or blank).
pub type Entry = openraft::type_config::alias::EntryOf<TypeConfig>;
/// A log id of this group.
pub type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
/// A vote of this group.
pub type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;
/// A membership as applied, with the log id that carried it.
pub type StoredMembership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
/// A snapshot's metadata.
pub type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
