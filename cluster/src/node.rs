//! One member of a group as a server runs it: the log store, the state machine over the
//! domain, the cluster link, openraft's core on the link's runtime, and the proposer.
//!
//! Owns: [`GroupNode`], [`NodeConfig`] and [`Status`] (what `GET /admin/v1/cluster` shows).
//! Everything a server needs of the group goes through it, so openraft is named in this crate
//! alone.
//!
//! # Starting
//!
//! A node on a pristine data dir started with the initial voters calls openraft's `initialize`
//! with them: the lowest id at once, each other one after a grace in which the first usually
//! reaches it (see `initialize`). A node whose data dir already holds a log ignores the list
//! and rejoins the cluster its log belongs to.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::{Config, Raft, ReadPolicy, ServerState, SnapshotPolicy};

use crate::contact::Contact;
use crate::machine::{Apply, Machine};
use crate::membership::{self, Action, ChangeError, ChangeSlot, MembershipChange};
use crate::net::{
    ClusterLink, ClusterSecret, ForwardError, ForwardTaker, Forwarded, ForwardedReply, LinkConfig,
    LinkTls,
};
use crate::proposer::Proposer;
use crate::types::{ClusterNode, GroupId, NodeId, TypeConfig};
use crate::WalLogStore;

/// How a node starts.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The node's id for life.
    pub node_id: NodeId,
    /// The group.
    pub group: GroupId,
    /// The data dir: the log and the last snapshot.
    pub dir: PathBuf,
    /// Where the node listens for its peers.
    pub raft_addr: SocketAddr,
    /// Where clients reach the node (told to peers, so they can send clients here).
    pub api_addr: String,
    /// The voters of a new cluster, when this node is one of them.
    pub initial: Option<BTreeMap<NodeId, ClusterNode>>,
    /// Whether a node on an empty data dir waits to be added to a running cluster (without
    /// it, and without `initial`, an empty data dir is refused: a mistyped flag must not
    /// leave a node waiting for ever).
    pub join: bool,
    /// The cluster's secret.
    pub secret: ClusterSecret,
    /// Mutual TLS on the link (`--cluster-tls-dir`); plain TCP without.
    pub tls: Option<Arc<LinkTls>>,
    /// Heartbeat interval, ms.
    pub heartbeat_ms: u64,
    /// Election timeout, ms: a follower that hears no leader for a random time in this range
    /// stands for election.
    pub election_timeout_ms: (u64, u64),
    /// A node builds a snapshot once it applied this many entries after its last one (a
    /// leader's domain gives one only once it prepared it, see [`Apply::snapshot`]).
    pub snapshot_every: u64,
    /// Entries kept in the log behind a snapshot, so that a follower a little behind (or one
    /// that took long to receive a snapshot) catches up from the log (openraft #1706).
    pub keep_log: u64,
    /// A log archive's hold ([`WalLogStore::hold_for_archive`]), on the store before the node
    /// takes part in the group, so no purge runs without it.
    pub archive_hold: Option<HoldForArchive>,
}

/// [`NodeConfig::archive_hold`]: an [`crate::ArchiveHold`], shown by name only.
#[derive(Clone)]
pub struct HoldForArchive(pub crate::ArchiveHold);

impl std::fmt::Debug for HoldForArchive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HoldForArchive")
    }
}

/// What this node knows of its group, as `GET /admin/v1/cluster` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// This node.
    pub node_id: NodeId,
    /// The group.
    pub group: GroupId,
    /// The current term.
    pub term: u64,
    /// The leader this node knows of.
    pub leader: Option<NodeId>,
    /// The commit index this node knows of.
    pub commit_index: Option<u64>,
    /// This node's applied index.
    pub applied_index: Option<u64>,
    /// This node's role: `leader`, `follower`, `candidate` or `learner`.
    pub role: &'static str,
    /// The members, with what this node knows of each.
    pub members: Vec<Member>,
    /// Leaders this node came to know of since it started.
    pub leader_changes: u64,
    /// Newer terms this node saw since it started (each one an election somewhere).
    pub term_changes: u64,
    /// Requests this node forwarded to a leader since it started.
    pub forwarded: u64,
    /// The last index of this node's last snapshot (built or installed).
    pub snapshot_index: Option<u64>,
    /// The last index purged from this node's log.
    pub purged_index: Option<u64>,
    /// Snapshots this node built and installed since it started.
    pub snapshots: crate::machine::SnapshotCounts,
}

/// A member as another node sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its id.
    pub id: NodeId,
    /// Its addresses.
    pub node: ClusterNode,
    /// Whether it counts for a majority.
    pub voter: bool,
    /// Its role, as far as this node can tell.
    pub role: &'static str,
    /// Its matched index, when this node leads and has heard from it.
    pub matched: Option<u64>,
    /// Milliseconds since this node (as leader) heard from it.
    pub last_heard_ms: Option<u64>,
}

/// One member of a group, running.
pub struct GroupNode<A: Apply> {
    config: NodeConfig,
    raft: Raft<TypeConfig, Machine<A>>,
    machine: Machine<A>,
    store: WalLogStore,
    link: ClusterLink,
    proposer: Proposer<Machine<A>>,
    /// The membership change this node runs or ran last as leader.
    change: ChangeSlot,
    /// Requests forwarded to a leader.
    forwarded: std::sync::atomic::AtomicU64,
    /// This node's contacts with its leader, while it follows.
    contact: Arc<Contact>,
}

impl<A: Apply> GroupNode<A> {
    /// Opens the data dir (the log, then the last snapshot into `domain`), binds the link,
    /// starts openraft and the proposer, and initializes a new cluster when the data dir is
    /// pristine and `config.initial` lists the voters.
    ///
    /// # Errors
    /// The data dir cannot be opened, the address cannot be bound, the list omits this node,
    /// or openraft refuses its configuration.
    pub async fn start(config: NodeConfig, domain: A) -> io::Result<Arc<GroupNode<A>>> {
        if let Some(initial) = &config.initial {
            if !initial.contains_key(&config.node_id) {
                return Err(io::Error::other(format!(
                    "the initial cluster does not list this node ({})",
                    config.node_id
                )));
            }
        }
        let store = {
            let dir = config.dir.clone();
            tokio::task::spawn_blocking(move || WalLogStore::open(dir))
                .await
                .map_err(io::Error::other)?
                .map_err(io::Error::other)?
        };
        if let Some(hold) = &config.archive_hold {
            store.hold_for_archive(Arc::clone(&hold.0));
        }
        let pristine = store.is_pristine();
        if pristine && config.initial.is_none() && !config.join {
            return Err(io::Error::other(
                "the data dir belongs to no cluster yet: start it with --initial-cluster (a new \
                 cluster) or --join (to be added to a running one)",
            ));
        }
        if pristine && config.join {
            tracing::info!(
                "waiting to be added to a cluster (POST /admin/v1/cluster/nodes on its leader)"
            );
        }
        let machine = {
            let (dir, store) = (config.dir.clone(), store.clone());
            tokio::task::spawn_blocking(move || Machine::open(&dir, domain, store))
                .await
                .map_err(io::Error::other)??
        };
        let link = ClusterLink::bind(
            config.raft_addr,
            LinkConfig {
                tls: config.tls.clone(),
                spool_dir: Some(config.dir.clone()),
                api_addr: reachable_api_addr(&config.api_addr, config.raft_addr),
                ..LinkConfig::new(config.node_id, config.secret.clone())
            },
        )?;
        let raft_config =
            raft_config(config.heartbeat_ms, config.election_timeout_ms, config.keep_log)?;
        let network = link.network(config.group);
        let (id, log, sm) = (config.node_id, store.clone(), machine.clone());
        let raft = link
            .runtime()
            .spawn(Raft::new(id, raft_config, network, log, sm))
            .await
            .map_err(io::Error::other)?
            .map_err(io::Error::other)?;
        let contact = Arc::new(Contact::default());
        link.serve(config.group, raft.clone(), Arc::clone(&contact))?;
        let proposer = Proposer::start(config.group, raft.clone(), link.runtime());
        if let (true, Some(initial)) = (pristine, &config.initial) {
            initialize(&raft, link.runtime(), config.node_id, initial.clone()).await?;
        }
        let change = ChangeSlot::default();
        let forwarded = Default::default();
        let node = Arc::new(GroupNode {
            config,
            raft,
            machine,
            store,
            link,
            proposer,
            change,
            forwarded,
            contact,
        });
        node.link.runtime().spawn(snapshot_when_due(Arc::downgrade(&node)));
        node.link.runtime().spawn(announce_api_addr(Arc::downgrade(&node)));
        Ok(node)
    }

    /// Asks openraft to build a snapshot now (it asks the domain for its state; nothing is
    /// built when the domain has none newer to give).
    pub fn request_snapshot(&self) {
        let raft = self.raft.clone();
        self.link.runtime().spawn(async move {
            if let Err(e) = raft.trigger().snapshot().await {
                tracing::debug!(error = %e, "no snapshot: the Raft is shutting down");
            }
        });
    }

    /// Entries applied on this node since its last snapshot.
    pub fn applied_since_snapshot(&self) -> u64 {
        let applied = self.applied_index().map_or(0, |i| i + 1);
        let snapshot = self.machine.snapshot_log_id().map_or(0, |l| l.index + 1);
        applied.saturating_sub(snapshot)
    }

    /// The last membership change this node ran as leader, if any.
    pub fn membership_change(&self) -> Option<MembershipChange> {
        self.change.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Starts adding node `id` at `node` (see the `membership` module): a learner until it
    /// has caught up, then a voter.
    ///
    /// # Errors
    /// See [`ChangeError`]; nothing was started then.
    pub fn add_member(
        &self,
        id: NodeId,
        node: ClusterNode,
    ) -> Result<MembershipChange, ChangeError> {
        let (leading, leader, _, members) = self.membership_now();
        if members.contains(&id) {
            return Err(ChangeError::Member(id));
        }
        if self.machine.was_member(id) {
            return Err(ChangeError::FormerMember(id));
        }
        membership::claim(&self.change, leader, leading, id, Action::Add)?;
        let task = membership::add(self.proposer.clone(), Arc::clone(&self.change), id, node);
        self.link.runtime().spawn(task);
        Ok(self.membership_change().expect("claimed above"))
    }

    /// Starts removing node `id` from the voters and the members.
    ///
    /// # Errors
    /// See [`ChangeError`]; nothing was started then.
    pub fn remove_member(&self, id: NodeId) -> Result<MembershipChange, ChangeError> {
        let (leading, leader, voters, members) = self.membership_now();
        if !members.contains(&id) {
            return Err(ChangeError::Unknown(id));
        }
        if voters.len() == 1 && voters.contains(&id) {
            return Err(ChangeError::LastVoter(id));
        }
        membership::claim(&self.change, leader, leading, id, Action::Remove)?;
        let voter = voters.contains(&id);
        let task = membership::remove(self.proposer.clone(), Arc::clone(&self.change), id, voter);
        self.link.runtime().spawn(task);
        Ok(self.membership_change().expect("claimed above"))
    }

    /// Whether this node leads, the leader, the voters and every member, as it knows them.
    fn membership_now(&self) -> (bool, Option<NodeId>, BTreeSet<NodeId>, BTreeSet<NodeId>) {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        let membership = m.membership_config.membership();
        let voters = membership.voter_ids().collect();
        let members = membership.nodes().map(|(id, _)| *id).collect();
        (m.state == ServerState::Leader, m.current_leader, voters, members)
    }

    /// Whether this node has been removed from its group: it holds a membership (it joined
    /// once) that no longer names it.
    pub fn removed(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow_watched();
        let membership = m.membership_config.membership();
        membership.nodes().next().is_some() && membership.get_node(&self.config.node_id).is_none()
    }

    /// The proposer (leader side of writes).
    pub fn proposer(&self) -> &Proposer<Machine<A>> {
        &self.proposer
    }

    /// The log, for reading records back by index.
    pub fn store(&self) -> &WalLogStore {
        &self.store
    }

    /// The state machine, for reading the domain while nothing is applied.
    pub fn machine(&self) -> &Machine<A> {
        &self.machine
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.config.node_id
    }

    /// The link's runtime: where anything that calls into openraft runs.
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        self.link.runtime()
    }

    /// The index applied on this node, if any.
    pub fn applied_index(&self) -> Option<u64> {
        self.raft.metrics().borrow_watched().last_applied.map(|l| l.index)
    }

    /// See [`Proposer::lease_fresh`].
    pub fn lease_fresh(&self) -> bool {
        self.proposer.lease_fresh()
    }

    /// How old a follower's state that applied everything through `applied` is (cluster.md,
    /// "Local reads"): the time since the latest contact with a leader whose committed index
    /// it holds; `None` when it cannot tell (never heard from a leader, or far behind).
    pub fn follower_state_age(&self, applied: Option<u64>) -> Option<Duration> {
        self.contact.age_of(applied)
    }

    /// How long ago a quorum last acknowledged this node as its leader; `None` while it does
    /// not lead.
    pub fn quorum_ack_age(&self) -> Option<Duration> {
        self.proposer.quorum_ack_age()
    }

    /// Confirms this node's leadership with a quorum round trip (openraft's read index) when
    /// its lease is not fresh; `false` when it cannot within `timeout`.
    pub async fn confirm_leadership(&self, timeout: Duration) -> bool {
        if self.lease_fresh() {
            return true;
        }
        let raft = self.raft.clone();
        let confirm = async move {
            tokio::time::timeout(timeout, raft.ensure_linearizable(ReadPolicy::ReadIndex)).await
        };
        matches!(self.link.runtime().spawn(confirm).await, Ok(Ok(Ok(_))))
    }

    /// Resolves once this node has applied `index`, or fails after `timeout`.
    ///
    /// # Errors
    /// The timeout passed or the node is shutting down.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> io::Result<()> {
        let raft = self.raft.clone();
        let wait = async move {
            raft.wait(Some(timeout))
                .applied_index_at_least(Some(index), "applied")
                .await
                .map(|_| ())
                .map_err(io::Error::other)
        };
        self.link.runtime().spawn(wait).await.map_err(io::Error::other)?
    }

    /// Sets what takes the connections other nodes forward requests to this one on.
    pub fn set_forward_taker(&self, taker: ForwardTaker) {
        self.link.set_forward_taker(taker);
    }

    /// Sends `request` to the leader this node knows of; returns the leader's id and its answer.
    ///
    /// # Errors
    /// No leader is known, or it is this node ([`ForwardError::NotSent`]); or as
    /// [`ClusterLink::forward`].
    pub async fn forward_to_leader(
        &self,
        request: Forwarded,
        ttl: Duration,
    ) -> Result<(NodeId, ForwardedReply), ForwardError> {
        // The leader as the proposer last saw it: the same view that ends the wait below.
        let mut leadership = self.proposer.leadership();
        let leader = leadership.borrow_and_update().leader.filter(|l| *l != self.config.node_id);
        let addr = leader.and_then(|l| {
            let m = self.raft.metrics();
            let m = m.borrow_watched();
            m.membership_config.membership().get_node(&l).cloned()
        });
        let (Some(leader), Some(node)) = (leader, addr) else {
            let reason = "no other node is known to lead".to_string();
            return Err(ForwardError::NotSent { target: 0, reason });
        };
        self.forwarded.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // A leader cut off or paused holds the request until the link gives up; once another
        // leader is known it cannot answer for the group, so the wait ends then. (A write it
        // took may still commit: that is the caller's "no answer".)
        let moved = async move {
            while leadership.borrow_and_update().leader == Some(leader) {
                if leadership.changed().await.is_err() {
                    break;
                }
            }
        };
        let forwarded = self.link.forward(leader, &node.raft_addr, self.config.group, request, ttl);
        tokio::select! {
            reply = forwarded => Ok((leader, reply?)),
            () = moved => Err(ForwardError::NoAnswer {
                target: leader,
                reason: "another node leads now".into(),
            }),
        }
    }

    /// Where clients reach member `id`, as it told this node (or this node's own), if known.
    /// Members added with `POST /admin/v1/cluster/nodes` carry the address given there in the
    /// membership itself.
    fn api_addr_of(&self, id: NodeId) -> Option<String> {
        if id == self.config.node_id {
            Some(self.link.api_addr().to_owned())
        } else {
            self.link.told_api_addr(id)
        }
    }

    /// What this node knows of its group now.
    pub fn status(&self) -> Status {
        let m = self.raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
        let replication = m.replication.clone().unwrap_or_default();
        let heartbeat = m.heartbeat.clone().unwrap_or_default();
        let leading = m.state == ServerState::Leader;
        let members = membership
            .nodes()
            .map(|(id, node)| {
                let voter = voters.contains(id);
                let role = if Some(*id) == m.current_leader {
                    "leader"
                } else if voter {
                    "follower"
                } else {
                    "learner"
                };
                let matched = if *id == m.id {
                    m.last_log_index
                } else {
                    replication.get(id).and_then(|l| l.as_ref().map(|l| l.index))
                };
                let last_heard_ms = if *id == m.id || !leading {
                    None
                } else {
                    heartbeat
                        .get(id)
                        .and_then(|t| t.as_ref())
                        .map(|t| openraft::Instant::elapsed(&**t).as_millis() as u64)
                };
                let mut node = node.clone();
                if node.api_addr.is_empty() {
                    node.api_addr = self.api_addr_of(*id).unwrap_or_default();
                }
                Member { id: *id, node, voter, role, matched, last_heard_ms }
            })
            .collect();
        let role = match m.state {
            ServerState::Leader => "leader",
            ServerState::Candidate => "candidate",
            ServerState::Follower => "follower",
            ServerState::Learner | ServerState::Shutdown => "learner",
        };
        Status {
            node_id: m.id,
            group: self.config.group,
            term: m.current_term,
            leader: m.current_leader,
            commit_index: m.local_committed.map(|c| c.index),
            applied_index: m.last_applied.map(|l| l.index),
            role,
            members,
            leader_changes: self.proposer.changes_seen().0,
            term_changes: self.proposer.changes_seen().1,
            forwarded: self.forwarded.load(std::sync::atomic::Ordering::Relaxed),
            snapshot_index: m.snapshot.map(|l| l.index),
            purged_index: m.purged.map(|l| l.index),
            snapshots: cluster_counts(self.machine.counts(), self.link.snapshots_sent()),
        }
    }

    /// Stops the node: openraft's core, the link, the log (queued entries flushed).
    ///
    /// # Errors
    /// The log's failure, if it had failed.
    pub async fn shutdown(&self) -> io::Result<()> {
        let raft = self.raft.clone();
        let _ = self.link.runtime().spawn(async move { raft.shutdown().await }).await;
        self.link.shutdown();
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.shutdown())
            .await
            .map_err(io::Error::other)?
            .map_err(io::Error::other)
    }
}

/// How often a node tells its API address to the members that have not answered it yet.
const ANNOUNCE_EVERY: Duration = Duration::from_secs(1);

/// Tells every other member once where clients reach this node, and learns theirs from the
/// answers, retrying each one that did not answer every [`ANNOUNCE_EVERY`], until the node is
/// gone. A peer that restarts tells this node again, and learns this node's address from the
/// answer; so one exchange per pair is enough. Addresses live in memory only: the membership
/// of `--initial-cluster` names raft addresses alone, and recording an address in the log
/// would append a membership entry, which pauses every write for its commit.
async fn announce_api_addr<A: Apply>(node: std::sync::Weak<GroupNode<A>>) {
    let mut tick = tokio::time::interval(ANNOUNCE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut answered = BTreeSet::new();
    loop {
        tick.tick().await;
        let Some(node) = node.upgrade() else { return };
        let me = node.config.node_id;
        let peers: Vec<(NodeId, String)> = {
            let m = node.raft.metrics();
            let m = m.borrow_watched();
            let membership = m.membership_config.membership();
            membership
                .nodes()
                .filter(|(id, _)| **id != me && !answered.contains(*id))
                .map(|(id, n)| (*id, n.raft_addr.clone()))
                .collect()
        };
        for (id, raft_addr) in peers {
            match node.link.announce(id, &raft_addr, node.config.group, ANNOUNCE_EVERY).await {
                Ok(()) => {
                    answered.insert(id);
                }
                Err(e) => tracing::debug!(peer = id, error = %e, "API address not told yet"),
            }
        }
    }
}

/// The address clients reach a node listening on `api_addr` at: itself, unless it listens on
/// every address (`0.0.0.0`, `::`), which names no host; then the host of its raft address,
/// when that names one, with the API's port.
fn reachable_api_addr(api_addr: &str, raft_addr: SocketAddr) -> String {
    match api_addr.parse::<SocketAddr>() {
        Ok(api) if api.ip().is_unspecified() && !raft_addr.ip().is_unspecified() => {
            SocketAddr::new(raft_addr.ip(), api.port()).to_string()
        }
        _ => api_addr.to_owned(),
    }
}

/// The machine's counts with the link's count of snapshots sent.
fn cluster_counts(
    machine: crate::machine::SnapshotCounts,
    sent: u64,
) -> crate::machine::SnapshotCounts {
    crate::machine::SnapshotCounts { sent, ..machine }
}

/// Raft's timing: a heartbeat every 100 ms, an election timeout of 200–400 ms. openraft starts
/// an election only once the leader's lease (the longest timeout, 400 ms) and then a timeout
/// have passed since the last heartbeat: 600–800 ms, so a leader's death is noticed and
/// replaced in under a second (with 300–600 it took 900–1,200 ms: a failover median of
/// 1,024 ms, docs/performance.md), while a follower still outlasts six lost heartbeats.
pub const HEARTBEAT_MS: u64 = 100;
/// See [`HEARTBEAT_MS`].
pub const ELECTION_TIMEOUT_MS: (u64, u64) = (200, 400);

/// How long the listed voters of a new cluster after the first give it to reach them, per
/// place in the list (see [`initialize`]).
const INITIALIZE_GRACE: Duration = Duration::from_secs(2);

/// Starts a new cluster of the voters `initial` from this pristine node. The voter with the
/// lowest id initializes at once (openraft writes the membership and starts an election); the
/// k-th waits `k × INITIALIZE_GRACE` first, and initializes only if nobody reached it
/// meanwhile (openraft refuses a node that has voted or holds a log). Every node initializing
/// at once with the same list is allowed, but their elections in term 1 unseat one another:
/// openraft orders leaders of one term by node id, so a candidate with a higher id wins over a
/// leader already elected, which then restarts its domain. So a cluster started whole elects
/// its first node once, and one started without it still forms.
async fn initialize<A: Apply>(
    raft: &Raft<TypeConfig, Machine<A>>,
    runtime: &tokio::runtime::Handle,
    me: NodeId,
    initial: BTreeMap<NodeId, ClusterNode>,
) -> io::Result<()> {
    let place = initial.keys().position(|id| *id == me).unwrap_or(0) as u32;
    let voters = initial.len();
    let init = raft.clone();
    // On the link's runtime, as every call into openraft's core.
    let done = runtime.spawn(async move {
        tokio::time::sleep(INITIALIZE_GRACE * place).await;
        match init.initialize(initial).await {
            Ok(()) => tracing::info!(voters, "a new cluster initialized"),
            // Another listed node reached this one first: the same cluster.
            Err(e) => tracing::info!(error = %e, "the cluster was already initialized"),
        }
    });
    if place == 0 {
        done.await.map_err(io::Error::other)?;
    }
    Ok(())
}

/// openraft's configuration of a member: heartbeats every `heartbeat_ms`, an election after
/// a silence of `election_timeout_ms` (a random time between the two), snapshots only when the
/// node asks, `keep_log` entries kept behind a snapshot for followers a little behind.
///
/// # Errors
/// openraft refuses the values (an election timeout not above the heartbeat).
pub fn raft_config(
    heartbeat_ms: u64,
    election_timeout_ms: (u64, u64),
    keep_log: u64,
) -> io::Result<Arc<Config>> {
    let config = Config {
        heartbeat_interval: heartbeat_ms,
        election_timeout_min: election_timeout_ms.0,
        election_timeout_max: election_timeout_ms.1,
        // A snapshot is built when this node asks (`snapshot_every`, and a leader's prepared
        // checkpoint): openraft's own policy would ask a leader's domain before it has one.
        snapshot_policy: SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: keep_log,
        // A snapshot's send (in parts, each awaited) may take seconds for a large state, and
        // one cut short is sent again whole (openraft's 200 ms default is for chunks).
        install_snapshot_timeout: SNAPSHOT_SEND_TIMEOUT_MS,
        // A node back from a crash or a cut must not raise the term of a healthy leader (which
        // would make it step down, and restart): it asks first whether it could win.
        enable_pre_vote: Some(true),
        ..Default::default()
    };
    Ok(Arc::new(config.validate().map_err(io::Error::other)?))
}

/// How long a snapshot's send may take.
const SNAPSHOT_SEND_TIMEOUT_MS: u64 = 60_000;

/// How often a node looks whether a snapshot is due.
const SNAPSHOT_CHECK_EVERY: Duration = Duration::from_secs(1);

/// Asks for a snapshot whenever `snapshot_every` entries were applied since the last one, and
/// writes the committed log id, every second until the node is gone. A leader's domain gives
/// a snapshot only once it prepared it (its maintenance prepares it by the same rule and asks
/// at once), so this builds followers' snapshots.
async fn snapshot_when_due<A: Apply>(node: std::sync::Weak<GroupNode<A>>) {
    let mut tick = tokio::time::interval(SNAPSHOT_CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let Some(node) = node.upgrade() else { return };
        if node.applied_since_snapshot() >= node.config.snapshot_every.max(1) {
            node.request_snapshot();
        }
        // The committed log id, written lazily (`log_store.rs`): at most a second behind.
        let store = node.store.clone();
        drop(node);
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || store.persist_committed()).await {
            tracing::warn!(error = %e, "the committed log id was not saved");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::reachable_api_addr;

    #[test]
    fn an_api_address_on_every_interface_takes_the_raft_host() {
        let raft = "10.0.0.2:9101".parse().unwrap();
        assert_eq!(reachable_api_addr("0.0.0.0:8080", raft), "10.0.0.2:8080");
        assert_eq!(
            reachable_api_addr("[::]:8080", "[fd00::2]:9101".parse().unwrap()),
            "[fd00::2]:8080"
        );
    }

    #[test]
    fn a_named_api_address_is_kept() {
        assert_eq!(
            reachable_api_addr("127.0.0.2:8080", "127.0.0.2:9102".parse().unwrap()),
            "127.0.0.2:8080"
        );
        // Nothing better is known when the raft address names no host either.
        assert_eq!(
            reachable_api_addr("0.0.0.0:8080", "0.0.0.0:9101".parse().unwrap()),
            "0.0.0.0:8080"
        );
        assert_eq!(reachable_api_addr("", "127.0.0.1:9101".parse().unwrap()), "");
    }
}
