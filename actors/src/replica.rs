//! The domain of a cluster node: [`Replica`], what the Raft state machine applies committed
//! records to, `RaftLog`, the log seam over the group, and `CommittedLog`, what the node's log
//! archive reads (its committed entries, on a follower too).
//!
//! # Roles
//!
//! - **Following**, the state of every node at start: committed records are applied to a
//!   `Rebuild` (the state recovery builds, without actors) exactly as a start replays them,
//!   at position `index + 1` (a record's position is the wal LSN of its Raft entry, so the
//!   change feed reads it back from the local log at the same position on every node). The
//!   node answers no public request from it: they go to the leader.
//! - **Leading**: when this node's proposer first takes proposals it has applied everything
//!   committed before its term, and [`ClusterDomain::promote`] starts the actors on the
//!   rebuilt state. From then on the actors decide writes and append them through
//!   `RaftLog`; applying a record on this node changes nothing more (its actors applied it
//!   when they decided it, and publish it when its proposal resolves).
//! - A leader that loses its lease keeps its actors: a record that did not apply fails its
//!   write and the actors drop back to their published state, as after a failed fsync (the
//!   epoch). A node that stops leading altogether leaves the process to restart it as a
//!   follower from its data dir: its actors may hold decisions the new leader never saw.
//!
//! # Snapshots
//!
//! A Raft snapshot is a checkpoint (the file a single node writes), after the group's feed
//! retention:
//! - **Following**, the node snapshots its `Rebuild` at the last applied position, every
//!   part tagged with it.
//! - **Leading**, the state lives in the actors: the server's maintenance takes a checkpoint as
//!   on one node (`Service::checkpoint_paced`: tagged copies, then a marker committed after
//!   them), and `RaftLog::checkpoint` hands it over as the snapshot at its oldest tag. Until
//!   one is handed over a leader has none to give, and openraft builds none.
//! - Installing one (a node too far behind the leader's log) replaces the `Rebuild` whole;
//!   the records its feeds retain come with it and are written below the log's beginning
//!   (`cluster::Machine`), so its feeds read as the leader's.

use std::future::Future;
use std::io::{self, Read, Write};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub use cluster::net::{
    ClusterSecret, ForwardError, ForwardTaker, Forwarded, ForwardedConnection, ForwardedReply,
    LinkTls,
};
pub use cluster::{
    Action, ChangeError, ClusterNode as Peer, HoldForArchive, Member, MembershipChange, NodeConfig,
    NodeId, Phase, Status, ELECTION_TIMEOUT_MS, HEARTBEAT_MS,
};
use cluster::{GroupNode, ProposeError};

use crate::archive::{Archive, ArchiveConfig, ArchiveError, ArchiveSource, ArchiveStatus};
use crate::digest::StateDigest;
use crate::error::{ClusterOutcome, Error, Result};
use crate::local::{LocalView, Touched};
use crate::log::{codec, AppendOptions, Appended, Lsn, RecordLog, WalStats};
use crate::model::Millis;
use crate::record::Record;
use crate::service::{fresh_rebuild, CheckpointFile, Rebuild, Service, ServiceConfig};
use crate::service::{ChangeSource, ChangesError};
use crate::shared::{Clock, Retention};
use crate::sheet::{Change, SheetSnapshot, SpanCache};

/// How long a write waits for its commit before it is answered `unknown`.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The domain under the state machine (see the module docs).
pub struct Replica {
    role: Role,
    /// The checkpoint a leader's maintenance handed over, not yet taken for a snapshot.
    prepared: Option<Prepared>,
    /// The applied state as local reads see it, while following.
    view: Arc<LocalView>,
    /// What the records applied since the last publication to `view` touched.
    touched: Touched,
}

/// A leader's checkpoint, as its snapshot.
struct Prepared {
    /// Its Raft index: its oldest tag's position minus one.
    index: u64,
    retained: std::collections::BTreeSet<u64>,
    /// Its bytes, in a nameless file in the data dir ([`cluster::Spool`]): a large state's
    /// snapshot is never held whole in memory, here as nowhere else.
    data: cluster::SnapshotData,
}

/// A snapshot's bytes: `[len u64 LE][the feeds' retention, encoded][the checkpoint file]`.
/// The retention is the group's ([`Record::FeedRetention`]), which a checkpoint of one node
/// does not hold (it is that node's flag there).
pub(crate) fn snapshot_header(retention: Retention, out: &mut dyn Write) -> io::Result<()> {
    let head = codec::encode(&retention).map_err(io::Error::other)?;
    out.write_all(&(head.len() as u64).to_le_bytes())?;
    out.write_all(&head)
}

/// Reads what [`snapshot_header`] wrote.
fn read_snapshot_header(input: &mut dyn Read) -> io::Result<Retention> {
    let mut len = [0u8; 8];
    input.read_exact(&mut len)?;
    let len = usize::try_from(u64::from_le_bytes(len)).map_err(io::Error::other)?;
    if len > 4096 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a sheetd snapshot"));
    }
    let mut head = vec![0u8; len];
    input.read_exact(&mut head)?;
    codec::decode(&head).map_err(io::Error::other)
}

enum Role {
    Following(Box<Rebuild>),
    Leading,
}

impl Replica {
    /// An empty domain. Applying reads no clock: it keeps every stored idempotent answer
    /// (judged against the earliest time there is), so what a node holds depends on the log
    /// alone; answers past their window are dropped by the leader's housekeeping.
    pub fn new() -> Replica {
        Replica {
            role: Role::Following(Box::new(fresh_rebuild(Millis::MIN))),
            prepared: None,
            view: Arc::default(),
            touched: Touched::default(),
        }
    }
}

impl Default for Replica {
    fn default() -> Self {
        Replica::new()
    }
}

impl cluster::Apply for Replica {
    fn apply(&mut self, index: u64, payload: &[u8]) -> io::Result<()> {
        match &mut self.role {
            Role::Following(rebuild) => {
                let record: Record = codec::decode(payload).map_err(io::Error::other)?;
                match &record {
                    Record::Import(batch) => {
                        self.touched.directory = true;
                        self.touched.sheets.extend(batch.sheets.iter().map(|s| s.meta.id));
                    }
                    Record::Directory(_) => self.touched.directory = true,
                    Record::Sheet(write) => {
                        self.touched.sheets.insert(write.sheet_id);
                    }
                    _ => {}
                }
                rebuild.apply(index + 1, record);
            }
            // Its actors applied it when they decided it.
            Role::Leading => {}
        }
        Ok(())
    }

    fn applied(&mut self, index: u64) {
        let Role::Following(rebuild) = &self.role else { return };
        let touched = std::mem::take(&mut self.touched);
        // Sheets before the directory: a reader that finds a new sheet in the directory finds
        // its state too.
        for id in touched.sheets {
            if let Some((state, lsn)) = rebuild.sheet(id) {
                self.view.publish_sheet(state, lsn);
            }
        }
        if touched.directory {
            self.view.publish_directory(rebuild.directory());
        }
        self.view.set_applied(index + 1);
    }

    fn snapshot(&mut self, last_applied: u64) -> io::Result<Option<cluster::DomainSnapshot>> {
        match &self.role {
            Role::Following(rebuild) => {
                let (file, retained) = rebuild.checkpoint_at(last_applied + 1);
                let retention = rebuild.retention;
                Ok(Some(cluster::DomainSnapshot {
                    index: last_applied,
                    retained: retained.into_iter().map(|lsn| lsn - 1).collect(),
                    write: Box::new(move |out| {
                        snapshot_header(retention, out)?;
                        crate::log::encode_snapshot(&file, out).map_err(io::Error::other)?;
                        Ok(())
                    }),
                }))
            }
            Role::Leading => Ok(self.prepared.take().map(|prepared| cluster::DomainSnapshot {
                index: prepared.index,
                retained: prepared.retained,
                write: Box::new(move |out| io::copy(&mut prepared.data.reader(), out).map(|_| ())),
            })),
        }
    }

    fn install(&mut self, index: u64, snapshot: &mut dyn Read) -> io::Result<()> {
        if matches!(self.role, Role::Leading) {
            return Err(io::Error::other(
                "a leader's state is its actors': no snapshot replaces it",
            ));
        }
        let retention = read_snapshot_header(snapshot)?;
        let checkpoint = CheckpointFile::decode(snapshot).map_err(io::Error::other)?;
        let mut rebuild = fresh_rebuild(Millis::MIN);
        rebuild.load_snapshot(index + 1, checkpoint, retention);
        self.view.replace(rebuild.directory(), rebuild.all_sheets(), index + 1);
        self.touched = Touched::default();
        self.role = Role::Following(Box::new(rebuild));
        self.prepared = None;
        Ok(())
    }
}

/// A running cluster node's domain side: the group, and what the server asks of it.
#[derive(Clone)]
pub struct ClusterDomain {
    node: Arc<GroupNode<Replica>>,
    guard: Arc<LeaderGuard>,
    local: LocalReads,
    /// The log archive of this node's committed entries, once started.
    archive: Arc<std::sync::OnceLock<Arc<Archive>>>,
}

/// A follower's local reads (docs/spec/cluster.md, "Local reads"): its applied state, and its
/// copy of the log for the change feed (the same records at the same positions as the
/// leader's).
#[derive(Clone)]
pub struct LocalReads {
    view: Arc<LocalView>,
    node: Arc<GroupNode<Replica>>,
    spans: Arc<SpanCache>,
    clock: Clock,
}

impl LocalReads {
    /// The applied state.
    pub fn view(&self) -> &LocalView {
        &self.view
    }

    /// The time keys and caps are judged at: this node's clock.
    pub fn now(&self) -> Millis {
        self.clock.now()
    }

    /// As [`Service::read_changes`], from the applied state and the local log.
    ///
    /// # Errors
    /// As [`Service::read_changes`].
    pub fn read_changes(
        &self,
        snapshot: &SheetSnapshot,
        seq: Option<u64>,
        limit: usize,
    ) -> std::result::Result<Vec<Change>, ChangesError> {
        let source = ChangeSource {
            spans: &self.spans,
            read: &|lsn| read_local(&self.node, lsn),
            latest: &|id| self.view.sheet_snapshot(id),
        };
        source.read_changes(snapshot, seq, limit)
    }
}

/// The record at `lsn` in this node's copy of the log.
fn read_local(node: &GroupNode<Replica>, lsn: Lsn) -> Result<Option<Record>> {
    let Some(index) = lsn.checked_sub(1) else { return Ok(None) };
    let stored = node.store().read_record(index).map_err(|e| Error::Inconsistent(e.to_string()))?;
    match stored {
        Some(record) => Ok(Some(codec::decode(&record.payload)?)),
        None => Ok(None),
    }
}

/// Whether the actors of a leader may still answer from their state.
///
/// Invariant: while the guard holds ([`ClusterDomain::serving`]), every record this node's actors decided and saw
/// acknowledged is committed, and every side effect they ordered (a stored idempotent answer)
/// belongs to a record that is committed or still pending under the current leadership. A
/// proposal that failed after its `at` ran (skipped, or of unknown fate) breaks that: the guard
/// is tainted for good, and the process restarts as a follower (`sheetd`'s cluster module).
pub struct LeaderGuard {
    /// The term the actors were started in; 0 before.
    term: std::sync::atomic::AtomicU64,
    tainted: std::sync::atomic::AtomicBool,
    /// Woken when the guard is tainted.
    pub tainted_now: tokio::sync::Notify,
}

impl LeaderGuard {
    fn taint(&self, why: &ProposeError) {
        if !self.tainted.swap(true, std::sync::atomic::Ordering::SeqCst) {
            tracing::warn!(reason = %why, "a proposal failed after it was ordered: this node stops serving from its actors");
        }
        self.tainted_now.notify_waiters();
        self.tainted_now.notify_one();
    }

    /// Whether the guard was tainted.
    pub fn is_tainted(&self) -> bool {
        self.tainted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl ClusterDomain {
    /// Starts the node: its data dir's log and its part of the group. Its local reads judge
    /// keys and caps at `clock`.
    ///
    /// # Errors
    /// As [`GroupNode::start`].
    pub async fn start(
        mut config: NodeConfig,
        clock: Clock,
        archive: Option<&ArchiveConfig>,
    ) -> Result<ClusterDomain> {
        let replica = Replica::new();
        let view = Arc::clone(&replica.view);
        let slot: Arc<std::sync::OnceLock<Arc<Archive>>> = Arc::default();
        if let Some(archive) = archive {
            // Until the archive runs ([`ClusterDomain::start_archive`]), a purge keeps what its
            // dir's last segment lacks, as the archive itself will ask (a single node's start
            // does the same). Weak: the archive holds the node, whose store holds this.
            let sealed = crate::archive::archived_position(&archive.dir);
            let (started, hold_records) = (Arc::downgrade(&slot), archive.hold_records);
            config.archive_hold = Some(HoldForArchive(Arc::new(move |lsn| {
                match started.upgrade().and_then(|slot| slot.get().cloned()) {
                    Some(archive) => archive.hold(lsn),
                    None => {
                        sealed.map_or(lsn, |p| crate::archive::held_above(p, lsn, hold_records))
                    }
                }
            })));
        }
        let node =
            GroupNode::start(config, replica).await.map_err(|e| Error::Cluster(e.to_string()))?;
        let guard = Arc::new(LeaderGuard {
            term: Default::default(),
            tainted: Default::default(),
            tainted_now: tokio::sync::Notify::new(),
        });
        let local = LocalReads { view, node: Arc::clone(&node), spans: Arc::default(), clock };
        Ok(ClusterDomain { node, guard, local, archive: slot })
    }

    /// Starts the log archive (see [`crate::archive`]) of this node's committed entries in
    /// `config.dir`, after the segments it holds, whether the node leads or follows: every
    /// node's committed log is the same, so any node's archive rolls a backup of the group
    /// forward. A purge of the log keeps what the archive has not taken, as a single node's
    /// checkpoint does (up to `hold_records` behind it), from the node's start when
    /// [`ClusterDomain::start`] was given the same config. Once only.
    ///
    /// # Errors
    /// The dir cannot be created or listed, or an archive runs already.
    pub fn start_archive(&self, config: ArchiveConfig) -> std::result::Result<(), ArchiveError> {
        let dir = config.dir.display().to_string();
        let source: Arc<dyn ArchiveSource> =
            Arc::new(CommittedLog { node: Arc::clone(&self.node) });
        let archive = Arc::new(Archive::start(config, source, self.local.clock.clone())?);
        if let Err(archive) = self.archive.set(archive) {
            archive.stop();
            return Err(ArchiveError::Io {
                dir,
                source: io::Error::other("an archive runs already"),
            });
        }
        Ok(())
    }

    /// The log archive's position, lag and last error; `None` without an archive.
    pub fn archive_status(&self) -> Option<ArchiveStatus> {
        self.archive.get().map(|archive| archive.status())
    }

    /// Lets the archive take what is committed now (a few seconds at most), then stops it.
    /// Blocking.
    pub fn stop_archive(&self) {
        if let Some(archive) = self.archive.get() {
            archive.stop();
        }
    }

    /// Where a read sent with `Sheetd-Consistency: local` is answered from on this follower:
    /// its applied state, while it follows and that state is at most `max_staleness` old
    /// (docs/spec/cluster.md, "Local reads"); `None` otherwise (the read goes to the leader).
    pub fn local_reads(&self, max_staleness: Duration) -> Option<&LocalReads> {
        let view = &self.local.view;
        // A removed node answers nothing from its state (cluster.md: 503, reason `removed`).
        if !view.serving() || self.removed() {
            return None;
        }
        let age = self.node.follower_state_age(view.applied().checked_sub(1))?;
        (age <= max_staleness).then_some(&self.local)
    }

    /// Whether this leader may answer a local read from its actors: it serves, and a quorum
    /// acknowledged it within `max_staleness` (a leader cut off from the majority stops).
    pub fn leads_within(&self, max_staleness: Duration) -> bool {
        self.serving() && self.node.quorum_ack_age().is_some_and(|age| age <= max_staleness)
    }

    /// The Raft index this node applied through.
    pub fn applied_index(&self) -> Option<u64> {
        self.node.applied_index()
    }

    /// Sets what takes the connections other nodes forward requests to this one on.
    pub fn set_forward_taker(&self, taker: ForwardTaker) {
        self.node.set_forward_taker(taker);
    }

    /// Sends a client's request on to the leader; its id and answer.
    ///
    /// # Errors
    /// See [`ForwardError`].
    pub async fn forward(
        &self,
        request: Forwarded,
        ttl: Duration,
    ) -> std::result::Result<(NodeId, ForwardedReply), ForwardError> {
        self.node.forward_to_leader(request, ttl).await
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.node.node_id()
    }

    /// Whether this node serves from its actors now: it was promoted, still leads in that
    /// term, and no proposal failed after it was ordered (see [`LeaderGuard`]).
    pub fn serving(&self) -> bool {
        serving(&self.node, &self.guard)
    }

    /// Whether this node may answer a request from its actors now: [`ClusterDomain::serving`],
    /// and a quorum still takes it as leader (its lease, or else a read-index round trip of at
    /// most `timeout`). So a leader that was paused or cut off never answers a read from a
    /// state a newer leader has moved past.
    pub async fn confirm_serving(&self, timeout: Duration) -> bool {
        self.serving() && self.node.confirm_leadership(timeout).await && self.serving()
    }

    /// Starts adding node `id` (see `cluster::GroupNode::add_member`).
    ///
    /// # Errors
    /// See [`ChangeError`].
    pub fn add_member(
        &self,
        id: NodeId,
        node: Peer,
    ) -> std::result::Result<MembershipChange, ChangeError> {
        self.node.add_member(id, node)
    }

    /// Starts removing node `id` (see `cluster::GroupNode::remove_member`).
    ///
    /// # Errors
    /// See [`ChangeError`].
    pub fn remove_member(&self, id: NodeId) -> std::result::Result<MembershipChange, ChangeError> {
        self.node.remove_member(id)
    }

    /// The last membership change this node ran as leader.
    pub fn membership_change(&self) -> Option<MembershipChange> {
        self.node.membership_change()
    }

    /// Whether this node was removed from its cluster.
    pub fn removed(&self) -> bool {
        self.node.removed()
    }

    /// Entries applied on this node since its last snapshot.
    pub fn applied_since_snapshot(&self) -> u64 {
        self.node.applied_since_snapshot()
    }

    /// The guard of this node's leadership.
    pub fn guard(&self) -> &Arc<LeaderGuard> {
        &self.guard
    }

    /// What this node knows of its group.
    pub fn status(&self) -> Status {
        self.node.status()
    }

    /// The epoch of this node's leadership, and whether it takes proposals now.
    pub fn leadership(&self) -> tokio::sync::watch::Receiver<cluster::Leadership> {
        self.node.proposer().leadership()
    }

    /// The applied position and the digest of the state there, while this node follows;
    /// `None` once it leads (its actors answer then).
    pub fn following_digest(&self) -> Option<(Lsn, StateDigest)> {
        self.node.machine().with_domain(|replica, last| match &replica.role {
            Role::Following(rebuild) => Some((last.map_or(0, |l| l.index + 1), rebuild.digest())),
            Role::Leading => None,
        })
    }

    /// Starts the actors on the state this node applied: called once, when it first takes
    /// proposals. Must run inside an actix system. A leader whose change-feed retention
    /// differs from the group's appends its own first ([`Record::FeedRetention`]): retention
    /// is the leader's to decide, and every node prunes by the same.
    ///
    /// # Errors
    /// Called a second time, or the retention record did not commit (the leadership ended).
    pub async fn promote(&self, config: &ServiceConfig) -> Result<Service> {
        let (rebuild, last) = self.node.machine().with_domain(|replica, last| {
            match std::mem::replace(&mut replica.role, Role::Leading) {
                Role::Following(rebuild) => Ok((rebuild, last)),
                Role::Leading => Err(Error::Inconsistent("promoted twice".into())),
            }
        })?;
        self.local.view.retire();
        let mut rebuild = *rebuild;
        let mut last_lsn = last.map_or(0, |l| l.index + 1);
        let term = self.node.proposer().leadership_now().term;
        self.guard.term.store(term, std::sync::atomic::Ordering::SeqCst);
        let log = Arc::new(RaftLog {
            node: Arc::clone(&self.node),
            guard: Arc::clone(&self.guard),
            retention: config.retention,
        });
        if rebuild.retention != config.retention {
            let record = Record::FeedRetention(config.retention);
            let options = AppendOptions { reserve: false, epoch: None };
            let appended = log.append(&record, options, &mut |_| {})?;
            last_lsn = appended.lsn();
            appended.await?;
            tracing::info!(retention = ?config.retention, "the change feeds' retention is this leader's from here on");
            rebuild.apply(last_lsn, record);
        }
        tracing::info!(applied = last_lsn, term, "leading: the actors start on the applied state");
        Ok(Service::start(config, rebuild, log, last_lsn))
    }

    /// Stops the node.
    ///
    /// # Errors
    /// The log's failure, if it had failed.
    pub async fn shutdown(&self) -> Result<()> {
        self.node.shutdown().await.map_err(|e| Error::Cluster(e.to_string()))
    }
}

/// The group's committed entries, as the log archive reads them: an entry's record as the
/// leader encoded it (the bytes a single node's log stores for it), and a
/// [`Record::Marker`] for an entry that holds none, so positions stay those of the group.
struct CommittedLog {
    node: Arc<GroupNode<Replica>>,
}

impl ArchiveSource for CommittedLog {
    fn read_stored(&self, lsn: Lsn) -> Result<Option<Vec<u8>>> {
        let Some(index) = lsn.checked_sub(1) else { return Ok(None) };
        let held = self
            .node
            .store()
            .read_for_archive(index)
            .map_err(|e| Error::Inconsistent(e.to_string()))?;
        match held {
            None => Ok(None),
            Some(Some(record)) => Ok(Some(record.payload)),
            Some(None) => Ok(Some(codec::encode(&Record::Marker)?)),
        }
    }

    fn durable_lsn(&self) -> Lsn {
        // Applied here means committed on a majority: an archived entry never changes.
        self.node.applied_index().map_or(0, |i| i + 1)
    }

    fn last_lsn(&self) -> Lsn {
        self.node.store().stats().last_lsn
    }

    fn checkpoint_lsn(&self) -> Lsn {
        self.node.store().stats().checkpoint_lsn
    }
}

/// The log seam over the group, on the leader: an append is a proposal, durable once applied
/// here (so committed on a majority).
struct RaftLog {
    node: Arc<GroupNode<Replica>>,
    guard: Arc<LeaderGuard>,
    /// The group's feed retention, which the snapshots carry.
    retention: Retention,
}

/// See [`ClusterDomain::serving`].
fn serving(node: &GroupNode<Replica>, guard: &LeaderGuard) -> bool {
    let term = guard.term.load(std::sync::atomic::Ordering::SeqCst);
    if term == 0 || guard.is_tainted() {
        return false;
    }
    let now = node.proposer().leadership_now();
    now.leader == Some(node.node_id()) && now.term == term
}

fn unavailable(e: ProposeError) -> Error {
    let (outcome, leader) = match &e {
        ProposeError::NotLeader { leader } => (ClusterOutcome::NotApplied, *leader),
        ProposeError::NotApplied { .. } => (ClusterOutcome::NotApplied, None),
        ProposeError::Unknown { .. } => (ClusterOutcome::Unknown, None),
    };
    Error::ClusterUnavailable { outcome, leader, reason: e.to_string() }
}

impl RecordLog for RaftLog {
    fn append_encoded(
        &self,
        bytes: Vec<u8>,
        options: AppendOptions,
        at: &mut dyn FnMut(Lsn),
    ) -> Result<Appended> {
        let proposal = self
            .node
            .proposer()
            .propose(bytes, options.epoch, |index| at(index + 1))
            .map_err(unavailable)?;
        let (lsn, index) = (proposal.index() + 1, proposal.index());
        let guard = Arc::clone(&self.guard);
        Ok(Appended::new(lsn, async move {
            let failed = match tokio::time::timeout(WRITE_TIMEOUT, proposal).await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(e)) => e,
                Err(_) => ProposeError::Unknown {
                    index,
                    reason: format!("not committed within {WRITE_TIMEOUT:?}"),
                },
            };
            // Its `at` ran: what the actors ordered by it may belong to no committed record.
            guard.taint(&failed);
            Err(unavailable(failed))
        }))
    }

    fn read(&self, lsn: Lsn) -> Result<Option<Record>> {
        match self.read_stored(lsn)? {
            Some(payload) => Ok(Some(codec::decode(&payload)?)),
            None => Ok(None),
        }
    }

    fn read_stored(&self, lsn: Lsn) -> Result<Option<Vec<u8>>> {
        let Some(index) = lsn.checked_sub(1) else { return Ok(None) };
        let stored =
            self.node.store().read_record(index).map_err(|e| Error::Inconsistent(e.to_string()))?;
        Ok(stored.map(|record| record.payload))
    }

    fn last_lsn(&self) -> Lsn {
        // The last index given is `next - 1`, at position `next`.
        let given = self.node.proposer().next_index().unwrap_or(0);
        given.max(self.durable_lsn())
    }

    fn durable_lsn(&self) -> Lsn {
        self.node.applied_index().map_or(0, |i| i + 1)
    }

    fn wait_durable(&self, lsn: Lsn) -> Pin<Box<dyn Future<Output = Result<()>> + Send>> {
        let node = Arc::clone(&self.node);
        Box::pin(async move {
            let Some(index) = lsn.checked_sub(1) else { return Ok(()) };
            node.wait_applied(index, WRITE_TIMEOUT)
                .await
                .map_err(|e| unavailable(ProposeError::Unknown { index, reason: e.to_string() }))
        })
    }

    fn epoch(&self) -> u64 {
        self.node.proposer().epoch()
    }

    fn checkpoint(
        &self,
        lsn: Lsn,
        snapshot: &mut dyn FnMut(&mut dyn Write) -> Result<()>,
        retains: &dyn Fn(Lsn) -> bool,
    ) -> Result<()> {
        // Handed over as the next snapshot; the log is purged by openraft behind it, never by
        // this node's maintenance. Its copies' marker committed, so every record they hold
        // did, unless a proposal failed after it was ordered: then the copies may hold one
        // that did not, and the process restarts instead.
        let Some(index) = lsn.checked_sub(1) else { return Ok(()) };
        if self.guard.is_tainted() {
            return Err(Error::Unavailable("checkpoint: this node stops leading"));
        }
        let store = self.node.store();
        let spooled = |e: io::Error| Error::Cluster(format!("spooling the snapshot: {e}"));
        let mut spool = cluster::Spool::new(Some(store.dir())).map_err(spooled)?;
        snapshot_header(self.retention, &mut spool).map_err(spooled)?;
        snapshot(&mut spool)?;
        let data = spool.finish().map_err(spooled)?;
        // Every record the feeds still retain at or below `index`: those the last snapshot
        // retained, and any after it.
        let machine = self.node.machine();
        let since = machine.snapshot_log_id().map_or(0, |l| l.index + 1);
        let retained = store
            .retained()
            .iter()
            .copied()
            .chain(since..=index)
            .filter(|&i| i <= index && retains(i + 1))
            .collect();
        machine.with_domain(|replica, _| {
            replica.prepared = Some(Prepared { index, retained, data });
        });
        self.node.request_snapshot();
        Ok(())
    }

    fn heal(&self, _on_reopen: &mut dyn FnMut(Lsn)) -> Result<Option<Lsn>> {
        Ok(None)
    }

    fn stats(&self) -> WalStats {
        self.node.store().stats()
    }

    fn refresh_space(&self) -> Result<()> {
        Ok(())
    }

    fn is_failed(&self) -> bool {
        false
    }

    fn unwritable_reason(&self) -> Option<String> {
        None
    }

    fn shutdown(&self) -> Result<()> {
        Ok(())
    }

    #[cfg(feature = "testing")]
    fn hold_commits(&self) -> Box<dyn std::fmt::Debug + '_> {
        Box::new("commits are not held on a cluster node")
    }
}
