//! Changing a group's voters while it serves (docs/spec/cluster.md, "Membership").
//!
//! Owns: [`MembershipChange`] (what one change is doing, as `GET /admin/v1/cluster` shows
//! it), [`ChangeError`], and the leader's side of adding and removing a member.
//!
//! One change runs at a time, on the leader, in the background: an added node first becomes
//! a learner and catches up from the log (openraft's replication), then a voter; a removed one
//! leaves the voters, then the members. Each voter change is openraft's joint consensus (a
//! joint configuration, then the uniform one), so there is never a moment with two majorities.
//! The change's progress lives in memory on the leader that runs it: a leader that dies midway
//! leaves the group in whatever configuration committed, and the change can be asked again.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::{ChangeMembers, Raft, ServerState};

use crate::machine::{Apply, Machine};
use crate::proposer::Proposer;
use crate::types::{ClusterNode, NodeId, TypeConfig};

/// What a membership change does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// A node joins: learner, caught up, then voter.
    Add,
    /// A node leaves the voters and the members.
    Remove,
}

/// Where a change stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The new node is a learner receiving the log.
    CatchingUp,
    /// The voters are changing (joint consensus).
    Joint,
    /// The change committed.
    Done,
    /// The change stopped; `detail` says why.
    Failed,
}

/// One membership change, as the leader that runs it knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipChange {
    /// The node added or removed.
    pub node_id: NodeId,
    /// Adding or removing it.
    pub action: Action,
    /// Where it stands.
    pub phase: Phase,
    /// What happened last, in words.
    pub detail: String,
}

impl MembershipChange {
    /// Whether the change still runs.
    pub fn running(&self) -> bool {
        matches!(self.phase, Phase::CatchingUp | Phase::Joint)
    }
}

/// Why a change was not started.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChangeError {
    /// Only the leader changes the membership.
    #[error("this node is not the leader (the leader is {leader:?})")]
    NotLeader {
        /// The leader this node knows of.
        leader: Option<NodeId>,
    },
    /// Another change has not finished.
    #[error("a membership change of node {0} is still running")]
    Busy(NodeId),
    /// The node to add is a member already.
    #[error("node {0} is a member already")]
    Member(NodeId),
    /// The node to add was a member: an id is for life, and a node back under an old id may
    /// have lost the votes it cast.
    #[error("node {0} was a member: a node that left or lost its data joins again under a new id")]
    FormerMember(NodeId),
    /// The node to remove is not a member.
    #[error("node {0} is not a member")]
    Unknown(NodeId),
    /// Removing it would leave no voter.
    #[error("node {0} is the last voter")]
    LastVoter(NodeId),
}

/// The change a leader runs, shared with its background task.
pub(crate) type ChangeSlot = Arc<Mutex<Option<MembershipChange>>>;

fn set(slot: &ChangeSlot, phase: Phase, detail: impl Into<String>) {
    let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(change) = slot.as_mut() {
        change.phase = phase;
        change.detail = detail.into();
    }
}

/// What a change may start from: this node leads, and no other change runs.
pub(crate) fn claim(
    slot: &ChangeSlot,
    leader: Option<NodeId>,
    leading: bool,
    id: NodeId,
    action: Action,
) -> Result<(), ChangeError> {
    if !leading {
        return Err(ChangeError::NotLeader { leader });
    }
    let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(running) = slot.as_ref().filter(|c| c.running()) {
        return Err(ChangeError::Busy(running.node_id));
    }
    let phase = match action {
        Action::Add => Phase::CatchingUp,
        Action::Remove => Phase::Joint,
    };
    *slot = Some(MembershipChange { node_id: id, action, phase, detail: "started".into() });
    Ok(())
}

/// How long the proposer waits for the proposals it gave out before a membership entry.
const DRAIN: Duration = Duration::from_secs(5);

/// How long a new learner may take to catch up before the change is given up.
const CATCH_UP: Duration = Duration::from_secs(600);

/// How close to the commit index a learner must be to become a voter.
const CAUGHT_UP_LAG: u64 = 64;

/// Adds node `id`: a learner caught up from the log, then a voter. Each membership entry is
/// appended with no proposal in flight ([`Proposer::exclusive`]), so no record's guessed index
/// lands behind one.
pub(crate) async fn add<A: Apply>(
    proposer: Proposer<Machine<A>>,
    slot: ChangeSlot,
    id: NodeId,
    node: ClusterNode,
) {
    let raft = proposer.raft().clone();
    tracing::info!(node = id, addr = %node, "adding a member: catching it up as a learner");
    let learner = proposer.exclusive(DRAIN, raft.add_learner(id, node, false)).await;
    if let Err(e) = learner {
        return set(&slot, Phase::Failed, format!("adding it as a learner failed: {e}"));
    }
    if let Err(why) = caught_up(&raft, id).await {
        return set(&slot, Phase::Failed, why);
    }
    set(&slot, Phase::Joint, "caught up; becoming a voter");
    let join = ChangeMembers::AddVoterIds(BTreeSet::from([id]));
    match proposer.exclusive(DRAIN, raft.change_membership(join, false)).await {
        Ok(_) => {
            tracing::info!(node = id, "a member was added as a voter");
            set(&slot, Phase::Done, "a voter");
        }
        Err(e) => set(&slot, Phase::Failed, format!("making it a voter failed: {e}")),
    }
}

/// Resolves once the leader has replicated to learner `id` all but [`CAUGHT_UP_LAG`] of what
/// it committed.
async fn caught_up<A: Apply>(
    raft: &Raft<TypeConfig, Machine<A>>,
    id: NodeId,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + CATCH_UP;
    let mut metrics = raft.metrics();
    loop {
        {
            let m = metrics.borrow_watched();
            if m.state != ServerState::Leader {
                return Err("this node stopped leading while the learner caught up".into());
            }
            let matched = m.replication.as_ref().and_then(|r| r.get(&id).cloned().flatten());
            let committed = m.local_committed.as_ref().map_or(0, |c| c.index);
            if matched.is_some_and(|l| l.index + CAUGHT_UP_LAG >= committed) {
                return Ok(());
            }
        }
        if tokio::time::timeout_at(deadline, metrics.changed()).await.is_err() {
            return Err(format!("the learner did not catch up within {CATCH_UP:?}"));
        }
    }
}

/// Removes node `id` from the voters (when it is one) and the members.
pub(crate) async fn remove<A: Apply>(
    proposer: Proposer<Machine<A>>,
    slot: ChangeSlot,
    id: NodeId,
    voter: bool,
) {
    let raft = proposer.raft().clone();
    tracing::info!(node = id, voter, "removing a member");
    if voter {
        // `retain: false`: the node leaves the members with the voters.
        let leave = ChangeMembers::RemoveVoters(BTreeSet::from([id]));
        match proposer.exclusive(DRAIN, raft.change_membership(leave, false)).await {
            Ok(_) => {
                tracing::info!(node = id, "a member was removed");
                return set(&slot, Phase::Done, "removed");
            }
            Err(e) => return set(&slot, Phase::Failed, format!("leaving the voters failed: {e}")),
        }
    }
    let gone = ChangeMembers::RemoveNodes(BTreeSet::from([id]));
    match proposer.exclusive(DRAIN, raft.change_membership(gone, false)).await {
        Ok(_) => {
            tracing::info!(node = id, "a learner was removed");
            set(&slot, Phase::Done, "removed");
        }
        Err(e) => set(&slot, Phase::Failed, format!("leaving the members failed: {e}")),
    }
}
