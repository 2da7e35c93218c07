//! The leader's one proposer of a group: each record gets its Raft index before openraft
//! appends it.
//!
//! Owns: [`Proposer`], the lease it proposes under, the epoch, and [`Leadership`].
//!
//! # Why positions are given before the append
//!
//! The domain orders side effects by a record's position as it appends it (the log seam's `at`
//! callback: stored idempotent answers, events, the change feed) and only later learns that the
//! record is durable. openraft gives an entry its index inside its core, after the call. Within
//! one leadership the leader is the only writer of its log, so the proposer knows the next
//! index: its lease starts right after the leader's own first entry of the term, once
//! everything before it is applied, and grows by one per proposal, handed to openraft in order
//! (one queue, one task, `with_leader` so that nothing is appended under a later leadership).
//!
//! A guess can still be wrong: an entry the proposer did not send (a membership change) lands
//! between two proposals. The record carries its guess ([`Record::index`]), and every node
//! skips a record that lands elsewhere ([`Record::belongs_at`]): the proposal fails as
//! certainly not applied, the lease ends, and a new one starts from the log as it is. A wrong
//! guess costs a retry, never a divergence.
//!
//! # Epochs
//!
//! The epoch names one continuous lease. It moves on whenever this node stops being the leader
//! it proposed as, or a guess fails: whatever a writer decided against the old lease's pending
//! records may rest on records that will never apply, so a proposal made with an older epoch
//! is refused, and a writer drops back to its applied state first.
//!
//! # Outcomes
//!
//! A [`Proposal`] resolves with the record's index once it is applied on this node (so
//! committed on a majority), or with a [`ProposeError`] saying whether the record is certainly
//! not applied ([`ProposeError::NotLeader`], [`ProposeError::NotApplied`]) or may yet be
//! ([`ProposeError::Unknown`]: it reached the log and the leadership ended before its fate was
//! known).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::error::ClientWriteError;
use openraft::impls::ProgressResponder;
use openraft::raft::ClientWriteResult;
use openraft::storage::RaftStateMachine;
use openraft::type_config::alias::CommittedLeaderIdOf;
use openraft::{Raft, RaftMetrics, ServerState};
use tokio::sync::{mpsc, watch};

use crate::types::{GroupId, NodeId, Record, TypeConfig};

/// How often the proposer looks at the Raft state when nothing told it of a change: a lease
/// ended by a wrong guess starts again within this, even on an idle group.
const RECHECK: Duration = Duration::from_millis(20);

/// How recently a quorum must have acknowledged a leader for its lease to start, in ms.
const QUORUM_ACK_FRESH_MS: u64 = 1000;

/// What a node knows of its group's leadership, as the proposer last saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leadership {
    /// The epoch (see the module docs).
    pub epoch: u64,
    /// The current term.
    pub term: u64,
    /// The leader this node knows of, if any.
    pub leader: Option<NodeId>,
    /// Whether this node takes proposals now: it leads, and has applied everything before its
    /// term.
    pub proposing: bool,
}

/// Why a proposal did not apply, or may not have.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// This node takes no proposals now (not the leader, or a new leader not yet caught up),
    /// or the writer's epoch is over: certainly not applied.
    #[error("this node is not the group's leader now (the leader is {leader:?})")]
    NotLeader {
        /// The leader this node knows of.
        leader: Option<NodeId>,
    },
    /// The record landed at another index than it was given and every node skipped it:
    /// certainly not applied.
    #[error("the record was proposed for index {index} and skipped where it landed")]
    NotApplied {
        /// The index it was given.
        index: u64,
    },
    /// The record reached the log, and the leadership ended before its fate was known: it
    /// may or may not apply.
    #[error("the outcome of the record at index {index} is unknown: {reason}")]
    Unknown {
        /// The index it was given.
        index: u64,
        /// What ended the wait.
        reason: String,
    },
}

/// A record given its index, resolving once it is applied on this node.
pub struct Proposal {
    index: u64,
    outcome: Pin<Box<dyn Future<Output = Result<u64, ProposeError>> + Send>>,
}

impl Proposal {
    /// The Raft index the record was given.
    pub fn index(&self) -> u64 {
        self.index
    }
}

impl Future for Proposal {
    type Output = Result<u64, ProposeError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.outcome.as_mut().poll(cx)
    }
}

impl std::fmt::Debug for Proposal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proposal").field("index", &self.index).finish_non_exhaustive()
    }
}

type LeaderId = CommittedLeaderIdOf<TypeConfig>;

/// The leadership proposals are made under, and the next index it gives.
///
/// Invariant: while a lease lives, every entry appended to this node's log since its start was
/// sent by this proposer under it, so `next` is the index openraft gives the next proposal;
/// when that fails, a guess fails, and the lease ends.
#[derive(Debug)]
struct Lease {
    leader: LeaderId,
    next: u64,
}

#[derive(Debug)]
struct State {
    lease: Option<Lease>,
    epoch: u64,
    term: u64,
    leader: Option<NodeId>,
    /// While an exclusive change runs ([`Proposer::exclusive`]): no proposal is taken and no
    /// lease starts.
    paused: bool,
}

impl State {
    fn leadership(&self) -> Leadership {
        Leadership {
            epoch: self.epoch,
            term: self.term,
            leader: self.leader,
            proposing: self.lease.is_some(),
        }
    }

    /// Ends the lease, if one lives; `only` limits it to a lease of that leadership.
    fn end_lease(&mut self, only: Option<&LeaderId>) {
        if self.lease.as_ref().is_some_and(|l| only.is_none_or(|o| *o == l.leader)) {
            self.lease = None;
            self.epoch += 1;
        }
    }
}

/// A record on its way to openraft, in index order.
struct Queued {
    /// The epoch of the lease that gave the record its index.
    epoch: u64,
    leader: LeaderId,
    record: Record,
    responder: ProgressResponder<TypeConfig, ClientWriteResult<TypeConfig>>,
}

struct Shared {
    state: Mutex<State>,
    leadership: watch::Sender<Leadership>,
    /// How often this node saw another leader, and a newer term, since it started.
    leader_changes: std::sync::atomic::AtomicU64,
    term_changes: std::sync::atomic::AtomicU64,
    /// Until when (µs after `started`) this node's read lease holds: see
    /// [`Proposer::lease_fresh`]. 0 while it does not lead.
    lease_until_us: std::sync::atomic::AtomicU64,
    /// On tokio's clock, which is the system's but in a simulation (paused, advanced by it).
    started: tokio::time::Instant,
    /// The lease a quorum's acknowledgement gives: the shortest election timeout.
    lease: Duration,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn publish(&self, state: &State) {
        self.leadership.send_if_modified(|l| {
            let now = state.leadership();
            let changed = *l != now;
            *l = now;
            changed
        });
    }
}

/// The one proposer of a group on this node. A cheap `Clone`: every clone is the same
/// proposer. Its tasks end when the Raft shuts down.
pub struct Proposer<SM: RaftStateMachine<TypeConfig>> {
    group: GroupId,
    shared: Arc<Shared>,
    queue: mpsc::UnboundedSender<Queued>,
    raft: Raft<TypeConfig, SM>,
}

impl<SM: RaftStateMachine<TypeConfig>> Clone for Proposer<SM> {
    fn clone(&self) -> Self {
        Proposer {
            group: self.group,
            shared: Arc::clone(&self.shared),
            queue: self.queue.clone(),
            raft: self.raft.clone(),
        }
    }
}

impl<SM: RaftStateMachine<TypeConfig>> Proposer<SM> {
    /// The proposer of `group` over `raft`; its tasks run on `runtime` (the cluster link's, so
    /// a busy HTTP side does not delay them).
    pub fn start(
        group: GroupId,
        raft: Raft<TypeConfig, SM>,
        runtime: &tokio::runtime::Handle,
    ) -> Proposer<SM> {
        let state = State { lease: None, epoch: 1, term: 0, leader: None, paused: false };
        let (leadership, _) = watch::channel(state.leadership());
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            leadership,
            leader_changes: Default::default(),
            term_changes: Default::default(),
            lease_until_us: Default::default(),
            started: tokio::time::Instant::now(),
            lease: Duration::from_millis(raft.config().election_timeout_min),
        });
        let (queue, queued) = mpsc::unbounded_channel();
        runtime.spawn(watch_leadership(raft.clone(), Arc::clone(&shared)));
        runtime.spawn(hand_over(raft.clone(), Arc::clone(&shared), queued));
        Proposer { group, shared, queue, raft }
    }

    /// Whether a quorum acknowledged this node as its leader within the shortest election
    /// timeout (a group of one always has). No other node can have been elected since: a voter
    /// that heard from this leader refuses every candidate for openraft's leader lease (the
    /// longest election timeout). A leader that was paused, or cut off from the majority, fails
    /// this before it learns of a newer term. Kept current from openraft's metrics, so that a
    /// check per request costs one atomic load and a clock read.
    pub fn lease_fresh(&self) -> bool {
        let until = self.shared.lease_until_us.load(std::sync::atomic::Ordering::Acquire);
        until > 0 && (self.shared.started.elapsed().as_micros() as u64) < until
    }

    /// How long ago a quorum last acknowledged this node as its leader; `None` while it does
    /// not lead (a group of one is acknowledged always).
    pub fn quorum_ack_age(&self) -> Option<Duration> {
        let until = self.shared.lease_until_us.load(std::sync::atomic::Ordering::Acquire);
        if until == 0 {
            return None;
        }
        if until == u64::MAX {
            return Some(Duration::ZERO);
        }
        let acked = until.saturating_sub(self.shared.lease.as_micros() as u64);
        let now = self.shared.started.elapsed().as_micros() as u64;
        Some(Duration::from_micros(now.saturating_sub(acked)))
    }

    /// How often this node saw a new leader, and a newer term, since it started.
    pub fn changes_seen(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.shared.leader_changes.load(Relaxed), self.shared.term_changes.load(Relaxed))
    }

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.shared.lock().epoch
    }

    /// The index the next proposal would get, while a lease lives.
    pub fn next_index(&self) -> Option<u64> {
        self.shared.lock().lease.as_ref().map(|l| l.next)
    }

    /// What this node knows of the leadership now (no subscription: for a check per request).
    pub fn leadership_now(&self) -> Leadership {
        self.shared.leadership.borrow().clone()
    }

    /// What this node knows of the leadership, kept current.
    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.shared.leadership.subscribe()
    }

    /// Proposes `payload`: `at` runs with its index before any later proposal is given one,
    /// and the returned [`Proposal`] resolves once it is applied here.
    ///
    /// # Errors
    /// [`ProposeError::NotLeader`] when this node takes no proposals now, or `epoch` is given
    /// and over; then `at` has not run.
    pub fn propose(
        &self,
        payload: Vec<u8>,
        epoch: Option<u64>,
        at: impl FnOnce(u64),
    ) -> Result<Proposal, ProposeError> {
        let mut state = self.shared.lock();
        let not_leader = ProposeError::NotLeader { leader: state.leader };
        if epoch.is_some_and(|e| e != state.epoch) {
            return Err(not_leader);
        }
        let epoch = state.epoch;
        if state.paused {
            return Err(not_leader);
        }
        let Some(lease) = state.lease.as_mut() else { return Err(not_leader) };
        let index = lease.next;
        let leader = lease.leader;
        let (responder, applied) = ProgressResponder::complete_only();
        let record = Record { group: self.group, index: Some(index), payload };
        if self.queue.send(Queued { epoch, leader, record, responder }).is_err() {
            // The hand-over task ended: the Raft is shut down.
            state.end_lease(None);
            self.shared.publish(&state);
            return Err(ProposeError::NotLeader { leader: None });
        }
        lease.next += 1;
        at(index);
        drop(state);
        let shared = Arc::clone(&self.shared);
        let outcome = async move {
            let unknown = |reason: String| ProposeError::Unknown { index, reason };
            let result = match applied.await {
                Ok(Ok(response)) if response.data.accepted => return Ok(index),
                Ok(Ok(_)) => Err(ProposeError::NotApplied { index }),
                // Refused before its entry was appended.
                Ok(Err(ClientWriteError::ForwardToLeader(f))) => {
                    Err(ProposeError::NotLeader { leader: f.leader_id })
                }
                Ok(Err(e)) => Err(unknown(e.to_string())),
                Err(_) => Err(unknown("the group shut down".into())),
            };
            // Whatever follows this record under the lease was guessed on it: end the lease.
            let mut state = shared.lock();
            state.end_lease(Some(&leader));
            shared.publish(&state);
            result
        };
        Ok(Proposal { index, outcome: Box::pin(outcome) })
    }

    /// The Raft this proposer proposes to.
    pub fn raft(&self) -> &Raft<TypeConfig, SM> {
        &self.raft
    }

    /// Runs `change` (an entry openraft appends on its own, such as a membership change)
    /// with no proposal of this node's in flight, so that no guess lands behind it: new
    /// proposals are refused (before their `at`, so certainly not applied), those given an
    /// index are waited for (at most `drain`), the lease ends, `change` runs, and a new lease
    /// starts from the log as it is.
    pub async fn exclusive<T>(&self, drain: Duration, change: impl Future<Output = T>) -> T {
        let last_given = {
            let mut state = self.shared.lock();
            state.paused = true;
            state.lease.as_ref().and_then(|l| l.next.checked_sub(1))
        };
        if let Some(index) = last_given {
            // A leadership lost meanwhile ends the wait with an error; the lease ends anyway.
            let _ =
                self.raft.wait(Some(drain)).applied_index_at_least(Some(index), "drained").await;
        }
        {
            let mut state = self.shared.lock();
            state.end_lease(None);
            self.shared.publish(&state);
        }
        let out = change.await;
        self.shared.lock().paused = false;
        out
    }
}

/// Starts and ends leases as the Raft state changes, until the Raft shuts down.
async fn watch_leadership<SM: RaftStateMachine<TypeConfig>>(
    raft: Raft<TypeConfig, SM>,
    shared: Arc<Shared>,
) {
    let mut metrics = raft.metrics();
    loop {
        let now = metrics.borrow_watched().clone();
        if now.running_state.is_err() {
            break;
        }
        observe(&raft, &shared, &now);
        // The sender gone: the Raft's core ended.
        if let Ok(Err(_)) = tokio::time::timeout(RECHECK, metrics.changed()).await {
            break;
        }
    }
    let mut state = shared.lock();
    state.end_lease(None);
    state.leader = None;
    shared.publish(&state);
}

/// Brings the lease in line with `m`.
fn observe<SM: RaftStateMachine<TypeConfig>>(
    raft: &Raft<TypeConfig, SM>,
    shared: &Shared,
    m: &RaftMetrics<TypeConfig>,
) {
    // The leader id this node proposes as, if it leads now.
    let leading = match (m.state, raft.as_leader()) {
        (ServerState::Leader, Ok(leader)) => Some(leader.to_committed_leader_id()),
        _ => None,
    };
    let lease_until = if m.state != ServerState::Leader {
        0
    } else if m.membership_config.membership().voter_ids().nth(1).is_none() {
        u64::MAX
    } else {
        m.last_quorum_acked.as_ref().map_or(0, |acked| {
            let age = openraft::Instant::elapsed(&**acked);
            let until = (shared.started.elapsed() + shared.lease).saturating_sub(age);
            until.as_micros() as u64
        })
    };
    shared.lease_until_us.store(lease_until, std::sync::atomic::Ordering::Release);
    let mut state = shared.lock();
    if m.current_term > state.term && state.term > 0 {
        shared.term_changes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    if m.current_leader.is_some() && m.current_leader != state.leader {
        shared.leader_changes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    state.term = m.current_term;
    state.leader = m.current_leader;
    match (&leading, &state.lease) {
        (None, _) => state.end_lease(None),
        (Some(leader), Some(lease)) if *leader != lease.leader => state.end_lease(None),
        _ => {}
    }
    if let (Some(leader), None, false) = (leading, &state.lease, state.paused) {
        // Everything in the log is applied, the last entry being this leadership's own (its
        // first entry of the term, or a proposal of an ended lease): nothing but this
        // proposer appends after it.
        let caught_up = m.last_applied.as_ref().is_some_and(|applied| {
            Some(applied.index()) == m.last_log_index && *applied.committed_leader_id() == leader
        });
        // And a quorum has acknowledged it lately: a leader restarted from its own vote holds
        // its old term's entries as its own, but no quorum follows it once a newer term began.
        let followed = m.last_quorum_acked.as_ref().is_some_and(|at| {
            openraft::Instant::elapsed(&**at) < Duration::from_millis(QUORUM_ACK_FRESH_MS)
        });
        if caught_up && followed {
            let next = m.last_log_index.map_or(0, |i| i + 1);
            state.lease = Some(Lease { leader, next });
            state.epoch += 1;
            tracing::info!(term = m.current_term, next, epoch = state.epoch, "proposing as leader");
        }
    }
    shared.publish(&state);
}

/// Hands queued records to openraft in index order, each only under the leadership it was
/// given its index in.
async fn hand_over<SM: RaftStateMachine<TypeConfig>>(
    raft: Raft<TypeConfig, SM>,
    shared: Arc<Shared>,
    mut queued: mpsc::UnboundedReceiver<Queued>,
) {
    use openraft::raft::responder::Responder;
    while let Some(Queued { epoch, leader, record, responder }) = queued.recv().await {
        // A lease that ended on a wrong guess may be followed by one of the same leader: the
        // epoch tells them apart.
        let current = {
            let state = shared.lock();
            state.lease.is_some() && state.epoch == epoch
        };
        if !current {
            // Its lease ended before it was sent: certainly not appended.
            let refused = openraft::error::ForwardToLeader::empty();
            responder.on_complete(Err(ClientWriteError::ForwardToLeader(refused)));
            continue;
        }
        if raft.write(record).with_leader(leader).responder(responder).await.is_err() {
            // Fatal: the Raft stopped; every responder still queued is dropped, which its
            // proposal reports as unknown.
            break;
        }
    }
}
