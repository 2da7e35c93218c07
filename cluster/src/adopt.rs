//! A group's first state from outside its log: a single node's data turned into a cluster of
//! one.
//!
//! Owns: [`begin_with_state`], which writes a pristine data dir's log and kept snapshot so that
//! the node starts as the only voter of a new group whose state at `index` is the one given,
//! and whose log begins after it. No entry is written: the first leader's blank entry follows
//! the snapshot, and a node added later catches up from the snapshot, for no log holds what
//! came before it.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::Path;

use openraft::{EntryPayload, Membership};
use wal::codec;

use crate::machine::{keep_snapshot, write_packed_compressed};
use crate::types::{ClusterNode, Entry, LogId, NodeId, Record, SnapshotMeta, StoredMembership};
use crate::{WalLogStore, DEFAULT_GROUP};

/// Whether the data dir `dir` belongs to a group already: it kept a snapshot, or its log
/// saved a vote or a purge (a node that was never added to a group has neither).
pub fn holds_group(dir: &Path) -> bool {
    dir.join(crate::machine::SNAPSHOT_FILE).exists() || wal::state_saved_in(dir)
}

/// Makes the pristine data dir `dir` that of node `node_id` (at `node`), the only voter of a
/// new group whose state at Raft index `index` is `state` (the bytes its domain installs), and
/// whose log holds below its beginning `retained`: the domain's records the state still reads
/// by position, each at its index. Blocking.
///
/// # Errors
/// The dir holds a log already, or the log or the snapshot cannot be written.
pub fn begin_with_state(
    dir: &Path,
    node_id: NodeId,
    node: ClusterNode,
    index: u64,
    retained: &[(u64, Vec<u8>)],
    state: &[u8],
) -> io::Result<()> {
    let store = WalLogStore::open(dir).map_err(io::Error::other)?;
    if !store.is_pristine() {
        return Err(io::Error::other("the data dir holds a Raft log already"));
    }
    // The state is nobody's term: term 0, named after this node.
    let leader = openraft::impls::leader_id_adv::LeaderId { term: 0, node_id };
    let log_id = |index| LogId::new(leader, index);
    let last = log_id(index);
    let raw = retained
        .iter()
        .map(|(at, payload)| {
            let record =
                Record { group: DEFAULT_GROUP, index: Some(*at), payload: payload.clone() };
            let entry = Entry { log_id: log_id(*at), payload: EntryPayload::Normal(record) };
            Ok((*at, codec::encode(&entry).map_err(io::Error::other)?))
        })
        .collect::<io::Result<Vec<_>>>()?;
    let voters = BTreeSet::from([node_id]);
    let membership = Membership::new(vec![voters], BTreeMap::from([(node_id, node)]))
        .map_err(io::Error::other)?;
    let meta = SnapshotMeta {
        last_log_id: Some(last),
        last_membership: StoredMembership::new(Some(last), membership),
    };
    keep_snapshot(dir, &meta, |out| {
        write_packed_compressed(out, &raw, &BTreeSet::new(), |out| out.write_all(state))
    })?;
    store.begin_after_snapshot(last, &raw).map_err(io::Error::other)?;
    store.shutdown().map_err(io::Error::other)
}
