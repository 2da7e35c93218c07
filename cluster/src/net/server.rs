//! The node's end of the cluster link: its listener, the runtime all link traffic runs on, and
//! the dispatch of incoming requests to the local Raft.
//!
//! Owns: [`ClusterLink`] (the runtime thread, the listener, the caps on connections), each
//! incoming connection's handshake and request loop, and the rate-limited log of refusals.
//!
//! Why a runtime of its own, on a thread of its own: the server's HTTP workers may be saturated
//! by clients; heartbeats and votes must still be read and answered within the election
//! timeout, or followers stand for election under load. Outgoing RPCs run here too
//! ([`super::Network`] spawns them on this runtime), so both directions of Raft traffic are
//! independent of how busy the rest of the process is; and the node's Raft itself is meant to
//! be built here ([`ClusterLink::runtime`]), so its ticks and heartbeats are too.

use std::fmt;
use std::io;
use std::net::{SocketAddr, TcpListener as StdListener, ToSocketAddrs};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use openraft::raft::{AppendEntriesResponse, SnapshotResponse};
use openraft::storage::RaftStateMachine;
use openraft::type_config::alias::SnapshotOf;
use openraft::Raft;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::timeout;

use super::channel::Channel;
use super::client::Network;
use super::handoff::{ForwardTaker, ForwardedConnection};
use super::message::{self, Announce, Forwarded, ForwardedReply, Reply, Request, Rpc};
pub use super::shared::ForwardError;
use super::shared::LinkShared;
use super::tls::LinkStream;
use super::LinkConfig;
use crate::contact::Contact;
use crate::snapshot_data::{SnapshotData, Spool};
use crate::types::{GroupId, NodeId, SnapshotMeta, TypeConfig, Vote};

/// A node's cluster link: a listener on its raft address, a small runtime on a thread of its
/// own, and the [`Network`] openraft sends through. Stops when dropped.
pub struct ClusterLink {
    shared: Arc<LinkShared>,
    local_addr: SocketAddr,
    /// The bound listener, until [`ClusterLink::serve`] takes it.
    listener: Mutex<Option<StdListener>>,
    /// What takes the connections peers forward requests on, once set.
    forward_taker: Arc<std::sync::OnceLock<ForwardTaker>>,
    /// Ends the runtime thread's wait (the thread then drops the runtime and every task).
    stop: Mutex<Option<oneshot::Sender<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for ClusterLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterLink")
            .field("shared", &self.shared)
            .field("local_addr", &self.local_addr)
            .field("forwarding", &self.forward_taker.get().is_some())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ClusterLink {
    /// Binds the listener on `addr` (port 0 picks a free port: see
    /// [`ClusterLink::local_addr`]) and starts the link's runtime thread. Nothing is accepted
    /// until [`ClusterLink::serve`].
    ///
    /// # Errors
    /// The bind's error (the address is in use, not local), the runtime's or thread's.
    pub fn bind(addr: impl ToSocketAddrs, config: LinkConfig) -> io::Result<Self> {
        let listener = StdListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        let local_ip = Some(local_addr.ip()).filter(|ip| !ip.is_unspecified());
        // One thread: openraft's core, its state machine worker and the link's I/O. What takes
        // long (a snapshot's encoding, writing or installing) runs on blocking threads, so
        // heartbeats and handshakes never wait behind it.
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("cluster-link-{}", config.node_id))
            .spawn(move || {
            // A current-thread runtime runs its tasks while this thread blocks on it.
            runtime.block_on(async {
                let _ = stopped.await;
            });
            // Dropping it drops every task: the listener and all connections close.
            drop(runtime);
        })?;
        Ok(ClusterLink {
            shared: Arc::new(LinkShared {
                config,
                handle,
                local_ip,
                stopping: tokio::sync::watch::Sender::new(false),
                told: Mutex::default(),
                forward_pool: Mutex::default(),
                forwards: Arc::new(Semaphore::new(super::client::FORWARDS_AT_ONCE)),
                forward_handshakes: Arc::new(Semaphore::new(super::client::FORWARD_HANDSHAKES)),
                snapshots_sent: Default::default(),
            }),
            local_addr,
            forward_taker: Arc::default(),
            listener: Mutex::new(Some(listener)),
            stop: Mutex::new(Some(stop)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The link's runtime. Build the node's [`Raft`] on it (`Raft::new` inside a task spawned
    /// here): openraft runs its core, its heartbeats and its replication on the runtime that
    /// built it, so on this one they are as independent of HTTP load as the link's sockets.
    pub fn runtime(&self) -> &Handle {
        &self.shared.handle
    }

    /// The network for `group`'s Raft: openraft's `RaftNetworkFactory`, sending from this
    /// link's host on its runtime.
    pub fn network(&self, group: GroupId) -> Network {
        Network::new(Arc::clone(&self.shared), group)
    }

    /// Starts accepting peers and answering their requests for `group` with `raft`.
    ///
    /// # Errors
    /// `AlreadyExists` when called a second time; the listener's registration error.
    pub fn serve<SM>(
        &self,
        group: GroupId,
        raft: Raft<TypeConfig, SM>,
        contact: Arc<Contact>,
    ) -> io::Result<()>
    where
        SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
    {
        let Some(listener) = lock(&self.listener).take() else {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, "the link serves already"));
        };
        let listener = {
            let _runtime = self.shared.handle.enter();
            TcpListener::from_std(listener)?
        };
        let serving = Arc::new(Serving {
            shared: Arc::clone(&self.shared),
            group,
            raft,
            contact,
            forward_taker: Arc::clone(&self.forward_taker),
            refusals: RefusalLog::new(),
        });
        self.shared.handle.spawn(accept_loop(listener, serving));
        Ok(())
    }

    /// Snapshots this node sent to a peer that installed them, since it started.
    pub fn snapshots_sent(&self) -> u64 {
        self.shared.snapshots_sent.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets what takes the connections peers forward requests on (once; later calls change
    /// nothing). Until it is set, a forwarded request is answered with an error.
    pub fn set_forward_taker(&self, taker: ForwardTaker) {
        let _ = self.forward_taker.set(taker);
    }

    /// Tells node `target` at its raft address `addr` where clients reach this node
    /// ([`LinkConfig::api_addr`]), and learns where clients reach it from its answer.
    ///
    /// # Errors
    /// See [`ForwardError`]; telling it again is harmless.
    pub async fn announce(
        &self,
        target: NodeId,
        addr: &str,
        group: GroupId,
        ttl: Duration,
    ) -> Result<(), ForwardError> {
        let config = &self.shared.config;
        let announce = Announce { node: config.node_id, api_addr: config.api_addr.clone() };
        let shared = Arc::clone(&self.shared);
        let theirs = super::client::announce(shared, target, addr, group, announce, ttl).await?;
        self.shared.was_told(target, theirs);
        Ok(())
    }

    /// Where clients reach this node, as it tells its peers ([`LinkConfig::api_addr`]).
    pub fn api_addr(&self) -> &str {
        &self.shared.config.api_addr
    }

    /// The API address node `id` told this one, if it did.
    pub fn told_api_addr(&self, id: NodeId) -> Option<String> {
        lock(&self.shared.told).get(&id).cloned()
    }

    /// Sends `request` to node `target` at its raft address `addr` and waits at most `ttl` for
    /// the answer, on a connection of its own (a request that may have run is never sent
    /// twice). Runs on the caller's tokio runtime, over connections its thread opened and
    /// keeps (an HTTP worker's own): no thread is crossed on this node.
    ///
    /// # Errors
    /// See [`ForwardError`].
    pub async fn forward(
        &self,
        target: NodeId,
        addr: &str,
        group: GroupId,
        request: Forwarded,
        ttl: Duration,
    ) -> Result<ForwardedReply, ForwardError> {
        super::client::forward(Arc::clone(&self.shared), target, addr, group, request, ttl).await
    }

    /// Stops the link: the listener closes, every connection in and out is dropped, RPCs
    /// under way fail. Waits for the runtime thread to end. Idempotent.
    pub fn shutdown(&self) {
        self.shared.stopping.send_replace(true);
        if let Some(stop) = lock(&self.stop).take() {
            let _ = stop.send(());
        }
        if let Some(thread) = lock(&self.thread).take() {
            if thread.join().is_err() {
                tracing::error!(
                    node = self.shared.config.node_id,
                    "the cluster link's thread panicked"
                );
            }
        }
        // Never served: the listener is still here; close it too.
        lock(&self.listener).take();
    }
}

impl Drop for ClusterLink {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// What every connection's task needs.
struct Serving<SM: RaftStateMachine<TypeConfig>> {
    shared: Arc<LinkShared>,
    group: GroupId,
    raft: Raft<TypeConfig, SM>,
    /// Where the leader's messages are noted, for local reads.
    contact: Arc<Contact>,
    forward_taker: Arc<std::sync::OnceLock<ForwardTaker>>,
    refusals: RefusalLog,
}

/// Warnings about refused connections, at most one a second, each saying how many were left
/// out since the last: a flood of bad connections must not become a flood of log lines.
struct RefusalLog {
    /// When the next warning may be written, and how many were left out meanwhile.
    state: Mutex<(Instant, u64)>,
}

impl RefusalLog {
    const EVERY: Duration = Duration::from_secs(1);

    fn new() -> Self {
        RefusalLog { state: Mutex::new((Instant::now(), 0)) }
    }

    /// Logs the refusal of `peer` for `reason` (never anything keyed by the secret), or counts
    /// it.
    fn warn(&self, peer: SocketAddr, reason: &dyn fmt::Display) {
        let now = Instant::now();
        let mut state = lock(&self.state);
        if now < state.0 {
            state.1 += 1;
            return;
        }
        let left_out = std::mem::take(&mut state.1);
        state.0 = now + Self::EVERY;
        drop(state);
        tracing::warn!(%peer, %reason, left_out, "cluster link: connection refused");
    }
}

async fn accept_loop<SM>(listener: TcpListener, serving: Arc<Serving<SM>>)
where
    SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
{
    let config = &serving.shared.config;
    let handshakes = Arc::new(Semaphore::new(config.max_handshakes));
    let connections = Arc::new(Semaphore::new(config.max_connections));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, a connection reset before it was accepted: the
                // listener itself is fine. A short pause so a persistent error does not spin.
                tracing::warn!(error = %e, "cluster link: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(handshake) = Arc::clone(&handshakes).try_acquire_owned() else {
            serving.refusals.warn(peer, &"too many handshakes under way");
            continue;
        };
        tokio::spawn(serve_connection(
            stream,
            peer,
            handshake,
            Arc::clone(&connections),
            Arc::clone(&serving),
        ));
    }
}

/// One incoming connection: the handshake within its timeout, then requests answered one at a
/// time until the peer closes, falls silent, or sends anything wrong.
async fn serve_connection<SM>(
    stream: TcpStream,
    peer: SocketAddr,
    handshake: OwnedSemaphorePermit,
    connections: Arc<Semaphore>,
    serving: Arc<Serving<SM>>,
) where
    SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
{
    let config = &serving.shared.config;
    // Small frames (heartbeats, votes) must not wait for Nagle's algorithm.
    let _ = stream.set_nodelay(true);
    // TLS (when configured) and the secret's handshake share the handshake's time.
    let shake = async {
        let stream = match &config.tls {
            Some(tls) => tls.accept(stream).await?,
            None => LinkStream::plain(stream),
        };
        Channel::server(stream, config.node_id, &config.secret).await
    };
    let shaken = timeout(config.handshake_timeout, shake).await;
    let mut channel = match shaken {
        Ok(Ok(channel)) => channel,
        Ok(Err(e)) => {
            serving.refusals.warn(peer, &e);
            return;
        }
        Err(_) => {
            serving.refusals.warn(peer, &"no handshake in time");
            return;
        }
    };
    drop(handshake);
    let Ok(connection) = connections.try_acquire_owned() else {
        serving.refusals.warn(peer, &"too many connections open");
        return;
    };
    let node = channel.peer();
    tracing::debug!(%peer, node, "cluster link: peer authenticated");
    let max = config.max_frame_bytes;
    // A snapshot arriving in parts on this connection.
    let mut parts: Option<Parts> = None;
    loop {
        let body = match timeout(config.idle_timeout, channel.recv(max)).await {
            Ok(Ok(body)) => body,
            Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                tracing::debug!(%peer, node, "cluster link: peer closed");
                return;
            }
            Ok(Err(e)) => {
                tracing::warn!(%peer, node, error = %e, "cluster link: connection closed");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, node, "cluster link: idle connection closed");
                return;
            }
        };
        let reply = match message::decode::<Request>(&body, max) {
            Ok(Request { group, rpc: Rpc::SnapshotPart { vote, meta, offset, total, data } })
                if group == serving.group =>
            {
                let part = Part { vote, meta, offset, total, data };
                snapshot_part(&serving, &mut parts, part).await
            }
            Ok(Request { group, rpc: Rpc::Forward(first) }) if group == serving.group => {
                match serving.forward_taker.get() {
                    Some(taker) => {
                        let shared = Arc::clone(&serving.shared);
                        match ForwardedConnection::detach(
                            channel, first, peer, group, shared, connection,
                        ) {
                            Ok(forwarding) => taker(forwarding),
                            Err(e) => {
                                tracing::warn!(%peer, node, error = %e, "cluster link: forwarding connection lost");
                            }
                        }
                        return;
                    }
                    None => message::encode(&Reply::<ForwardedReply>::Err(
                        "this node does not take forwarded requests yet".into(),
                    )),
                }
            }
            Ok(request) => dispatch(&serving, node, request).await,
            Err(e) => Err(e),
        };
        let sent = match reply {
            Ok(reply) => channel.send_owned(reply).await,
            Err(e) => {
                // Authenticated yet undecodable: a peer of another version. Say so and close.
                tracing::warn!(%peer, node, error = %e, "cluster link: bad request");
                return;
            }
        };
        if let Err(e) = sent {
            tracing::debug!(%peer, node, error = %e, "cluster link: reply not sent");
            return;
        }
    }
}

/// The largest snapshot a node gathers from parts.
const MAX_SNAPSHOT_BYTES: u64 = 64 << 30;

/// One part of a snapshot, as [`Rpc::SnapshotPart`] carries it.
struct Part {
    vote: Vote,
    meta: SnapshotMeta,
    offset: u64,
    total: u64,
    data: Vec<u8>,
}

/// A snapshot gathered so far from its parts, in a [`Spool`].
struct Parts {
    vote: Vote,
    meta: SnapshotMeta,
    total: u64,
    spool: Spool,
}

/// Takes one part of a snapshot sent in parts (see [`Rpc::SnapshotPart`]); installs the
/// snapshot with the part that completes it. A part out of order drops what was gathered: the
/// leader sends the whole snapshot again.
async fn snapshot_part<SM>(
    serving: &Serving<SM>,
    parts: &mut Option<Parts>,
    part: Part,
) -> io::Result<Vec<u8>>
where
    SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
{
    type PartReply = Reply<Option<SnapshotResponse<TypeConfig>>>;
    let refuse = |parts: &mut Option<Parts>, why: String| {
        *parts = None;
        message::encode(&PartReply::Err(why))
    };
    if part.offset == 0 {
        if part.total > MAX_SNAPSHOT_BYTES {
            return refuse(parts, format!("a snapshot of {} bytes is too large", part.total));
        }
        // Gathered in the data dir after the head it will be kept with, so that keeping it is
        // a rename (`machine::keep_spooled`).
        let spool = match serving.shared.config.spool_dir.as_deref() {
            Some(dir) => crate::machine::kept_head(&part.meta).and_then(|h| Spool::to_keep(dir, h)),
            None => Spool::new(None),
        };
        let spool = match spool {
            Ok(spool) => spool,
            Err(e) => return refuse(parts, format!("no room to gather a snapshot: {e}")),
        };
        *parts = Some(Parts { vote: part.vote, meta: part.meta.clone(), total: part.total, spool });
    }
    let fits = parts.as_ref().is_some_and(|p| {
        p.meta == part.meta
            && p.vote == part.vote
            && p.total == part.total
            && p.spool.written() == part.offset
            && part.offset + part.data.len() as u64 <= p.total
    });
    if !fits {
        return refuse(parts, "a snapshot part out of order".into());
    }
    // On a blocking thread: a part is up to half a frame (32 MiB), written to the data dir.
    let Parts { vote, meta, total, mut spool } = parts.take().expect("checked above");
    let written = tokio::task::spawn_blocking(move || {
        spool.write(&part.data)?;
        if spool.written() < total {
            return Ok(Err(spool));
        }
        spool.finish().map(Ok)
    })
    .await
    .map_err(io::Error::other)?;
    let snapshot = match written {
        Ok(Ok(snapshot)) => snapshot,
        Ok(Err(spool)) => {
            *parts = Some(Parts { vote, meta, total, spool });
            return message::encode(&PartReply::Ok(None));
        }
        Err(e) => return refuse(parts, format!("a snapshot part not gathered: {e}")),
    };
    let snapshot = SnapshotOf::<TypeConfig, SnapshotData> { meta, snapshot };
    let installed = serving.raft.install_full_snapshot(vote, snapshot).await;
    message::encode(&installed.map(Some).map_err(|e| e.to_string()))
}

/// Answers one request from the authenticated node `from` with the local Raft: the encoded
/// [`Reply`] of its RPC.
async fn dispatch<SM>(serving: &Serving<SM>, from: NodeId, request: Request) -> io::Result<Vec<u8>>
where
    SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
{
    if request.group != serving.group {
        // `Reply<()>`'s error decodes as any `Reply<T>`'s: the error side is the same text.
        let refusal: Reply<()> = Err(format!("group {} is not served here", request.group));
        return message::encode(&refusal);
    }
    let raft = &serving.raft;
    match request.rpc {
        Rpc::AppendEntries(rpc) => {
            let committed = rpc.leader_commit.map(|l| l.index);
            let reply = raft.append_entries(rpc).await;
            // Any answer but a higher vote means this node takes the sender as its leader.
            if matches!(&reply, Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_))) {
                serving.contact.heard(committed);
            }
            message::encode(&reply.map_err(|e| e.to_string()))
        }
        Rpc::Vote(rpc) => message::encode(&raft.vote(rpc).await.map_err(|e| e.to_string())),
        Rpc::PreVote(rpc) => message::encode(&raft.pre_vote(rpc).await.map_err(|e| e.to_string())),
        Rpc::SnapshotPart { .. } => {
            let refusal: Reply<()> = Err("a snapshot part for another group".into());
            message::encode(&refusal)
        }
        Rpc::Snapshot { vote, meta, data } => {
            let snapshot = SnapshotOf::<TypeConfig, SnapshotData> {
                meta,
                snapshot: SnapshotData::Bytes(data),
            };
            let installed = raft.install_full_snapshot(vote, snapshot).await;
            message::encode(&installed.map_err(|e| e.to_string()))
        }
        Rpc::TransferLeader(rpc) => {
            message::encode(&raft.handle_transfer_leader(rpc).await.map_err(|e| e.to_string()))
        }
        Rpc::Forward(_) => {
            // Never reached: one for this group is taken before dispatch, one for another
            // group refused above.
            let refusal: Reply<()> = Err("a forwarded request for another group".into());
            message::encode(&refusal)
        }
        Rpc::Announce(announce) => message::encode(&serving.shared.announced(from, announce)),
    }
}
