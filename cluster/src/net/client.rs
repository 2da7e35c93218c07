//! The calling side of the link: openraft's network, one [`PeerClient`] per target and purpose.
//!
//! Owns: [`Network`] (`RaftNetworkFactory`) and [`PeerClient`] (`RaftNetworkV2`): opening a
//! connection from the node's own raft host, its handshake, one request and its reply at a time,
//! timeouts, and the mapping of failures to openraft's errors.
//!
//! openraft makes a client per target for replication, another for heartbeats, another for
//! snapshots, and drives each one RPC at a time; so each client owns at most one connection and
//! needs no multiplexing, and a long snapshot never delays a heartbeat (different connections).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use openraft::errors::{
    NetworkError, RPCError, ReplicationClosed, StreamingError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RPCTypes, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::type_config::alias::SnapshotOf;
use serde::de::DeserializeOwned;
use tokio::net::TcpSocket;
use tokio::time::{timeout_at, Instant};

use super::channel::Channel;
use super::message::{self, Announce, Forwarded, ForwardedReply, Reply, Request, Rpc};
use super::shared::{ForwardError, LinkShared};
use super::tls::LinkStream;
use crate::snapshot_data::SnapshotData;
use crate::types::{ClusterNode, GroupId, NodeId, TypeConfig, Vote};

/// openraft's network factory for one group: clients that send from this node's raft host,
/// on the link's runtime. Made by [`super::ClusterLink::network`].
#[derive(Debug, Clone)]
pub struct Network {
    shared: Arc<LinkShared>,
    group: GroupId,
}

impl Network {
    pub(crate) fn new(shared: Arc<LinkShared>, group: GroupId) -> Self {
        Network { shared, group }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    /// A client that connects when first used (openraft wants no connection here).
    async fn new_client(&mut self, target: NodeId, node: &ClusterNode) -> PeerClient {
        PeerClient {
            shared: Arc::clone(&self.shared),
            group: self.group,
            target,
            addr: node.raft_addr.clone(),
            channel: None,
        }
    }
}

/// RPCs to one peer over one connection, opened on first use and again after a failure.
#[derive(Debug)]
pub struct PeerClient {
    shared: Arc<LinkShared>,
    group: GroupId,
    target: NodeId,
    /// `host:port` of the target's raft address, as the membership names it.
    addr: String,
    /// The open connection, if any. Taken out while an RPC runs: an RPC abandoned half-way
    /// leaves the stream at an unknown place, so its connection is never reused.
    channel: Option<Channel<LinkStream>>,
}

/// Why an RPC got no reply.
#[derive(Debug)]
enum Failure {
    /// No connection could be made or authenticated: openraft backs off before the next try.
    Unreachable(io::Error),
    /// The connection failed during the RPC: openraft may retry at once.
    Network(io::Error),
    /// No reply within the RPC's time.
    Timeout,
    /// The peer answered that it could not serve the RPC (stopped, another group).
    Remote(String),
}

impl PeerClient {
    /// Sends `rpc` and waits for its reply, within `ttl`, on the link's runtime.
    async fn call<T>(&mut self, rpc: Rpc, ttl: Duration) -> Result<T, Failure>
    where
        T: DeserializeOwned,
    {
        let request =
            message::encode(&Request { group: self.group, rpc }).map_err(Failure::Network)?;
        self.call_encoded(request, ttl).await
    }

    /// Sends the encoded request `request` and waits for its reply, within `ttl`, on the
    /// link's runtime.
    async fn call_encoded<T>(&mut self, request: Vec<u8>, ttl: Duration) -> Result<T, Failure>
    where
        T: DeserializeOwned,
    {
        // The peer would refuse it and close the connection: fail here and keep it.
        let max = self.shared.config.max_frame_bytes;
        if !message::fits(&request, max) {
            let e = io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a message of {} bytes, over the link's cap of {max}", request.len()),
            );
            return Err(Failure::Network(e));
        }
        let channel = self.channel.take();
        let (shared, target, addr) = (Arc::clone(&self.shared), self.target, self.addr.clone());
        let exchange = self.shared.handle.spawn(async move {
            let deadline = Instant::now() + ttl;
            exchange(&shared, target, &addr, channel, &request, deadline).await
        });
        let (channel, reply) = exchange
            .await
            .map_err(|_| Failure::Unreachable(io::Error::other("the cluster link has stopped")))?;
        self.channel = channel;
        let reply: Reply<T> = message::decode(&reply?, self.shared.config.max_frame_bytes)
            .map_err(Failure::Network)?;
        reply.map_err(Failure::Remote)
    }

    fn rpc_error(&self, failure: Failure, action: RPCTypes, ttl: Duration) -> RPCError<TypeConfig> {
        match failure {
            Failure::Unreachable(e) => RPCError::Unreachable(Unreachable::new(&e)),
            Failure::Network(e) => RPCError::Network(NetworkError::new(&e)),
            Failure::Timeout => RPCError::Timeout(Timeout {
                action,
                id: self.shared.config.node_id,
                target: self.target,
                timeout: ttl,
            }),
            // The peer is up but its Raft cannot answer (stopping, or not this group): back
            // off as from an unreachable node.
            Failure::Remote(why) => RPCError::Unreachable(Unreachable::from_string(format!(
                "node {} could not answer: {why}",
                self.target
            ))),
        }
    }
}

/// A forwarded request on a connection of its own, on the caller's thread: see
/// [`super::ClusterLink::forward`].
pub(crate) async fn forward(
    shared: Arc<LinkShared>,
    target: NodeId,
    addr: &str,
    group: GroupId,
    request: Forwarded,
    ttl: Duration,
) -> Result<ForwardedReply, ForwardError> {
    let size = request.size();
    let bytes = message::encode_plain(&Request { group, rpc: Rpc::Forward(request) }, size)
        .map_err(|e| ForwardError::NotSent { target, reason: e.to_string() })?;
    let max = shared.config.max_frame_bytes;
    let frame = forwarding_exchange(shared, target, addr, bytes, ttl).await?;
    let no_answer = move |reason: String| ForwardError::NoAnswer { target, reason };
    message::decode_forwarded_reply(frame, max)
        .map_err(|e| no_answer(e.to_string()))?
        .map_err(no_answer)
}

/// This node's API address told to `target`, answered with the target's: see
/// [`super::ClusterLink::announce`].
pub(crate) async fn announce(
    shared: Arc<LinkShared>,
    target: NodeId,
    addr: &str,
    group: GroupId,
    announce: Announce,
    ttl: Duration,
) -> Result<String, ForwardError> {
    let bytes = message::encode(&Request { group, rpc: Rpc::Announce(announce) })
        .map_err(|e| ForwardError::NotSent { target, reason: e.to_string() })?;
    let max = shared.config.max_frame_bytes;
    let frame = forwarding_exchange(shared, target, addr, bytes, ttl).await?;
    let no_answer = move |reason: String| ForwardError::NoAnswer { target, reason };
    let reply: Reply<String> =
        message::decode(&frame, max).map_err(|e| no_answer(e.to_string()))?;
    reply.map_err(no_answer)
}

/// Sends the encoded request `bytes` to `target` on a forwarding connection (a kept one, or
/// a new one) and receives its reply's frame, all within `ttl`.
async fn forwarding_exchange(
    shared: Arc<LinkShared>,
    target: NodeId,
    addr: &str,
    bytes: Vec<u8>,
    ttl: Duration,
) -> Result<Vec<u8>, ForwardError> {
    let not_sent = move |reason: String| ForwardError::NotSent { target, reason };
    let no_answer = move |reason: String| ForwardError::NoAnswer { target, reason };
    let max = shared.config.max_frame_bytes;
    if !message::fits(&bytes, max) {
        return Err(not_sent(format!("a request over the link's cap of {max} bytes")));
    }
    // Run on the caller's thread, over connections that thread opened: their readiness is
    // the caller's own event loop's, so a forward crosses no thread on this node (on the
    // link's runtime it crossed two, each a wake-up through another event loop). Dropping
    // the caller's future (a leader change) drops the exchange and its connection.
    let deadline = Instant::now() + ttl;
    let Ok(Ok(_turn)) = timeout_at(deadline, Arc::clone(&shared.forwards).acquire_owned()).await
    else {
        return Err(not_sent("too many requests forwarded at once".into()));
    };
    let mut channel = match pooled(&shared, target) {
        Some(channel) => channel,
        None => {
            // A few handshakes at a time; one kept meanwhile by another forward is taken.
            let handshakes = Arc::clone(&shared.forward_handshakes);
            let Ok(Ok(_handshake)) = timeout_at(deadline, handshakes.acquire_owned()).await else {
                return Err(not_sent("no connection to the leader in time".into()));
            };
            match pooled(&shared, target) {
                Some(channel) => channel,
                None => {
                    let by = deadline.min(Instant::now() + shared.config.handshake_timeout);
                    match timeout_at(by, connect(&shared, target, addr)).await {
                        Ok(Ok(channel)) => channel,
                        Ok(Err(e)) => return Err(not_sent(e.to_string())),
                        Err(_) => return Err(not_sent("no handshake in time".into())),
                    }
                }
            }
        }
    };
    // From here on the request may have run: no second try, on this connection or another.
    let round_trip = async {
        channel.send_owned(bytes).await?;
        channel.recv(max).await
    };
    match timeout_at(deadline, round_trip).await {
        Ok(Ok(reply)) => {
            keep(&shared, target, channel);
            Ok(reply)
        }
        Ok(Err(e)) => Err(no_answer(e.to_string())),
        Err(_) => Err(no_answer(format!("no answer within {ttl:?}"))),
    }
}

/// How long a kept forwarding connection may have been idle to be used again: well under the
/// server's idle timeout, so a kept connection is one the peer still holds open.
const POOL_IDLE: Duration = Duration::from_secs(20);

/// Connections kept per target, at most, all threads together.
const POOL_MAX: usize = 64;

/// Forwarding connections this node opens at once, at most: well under a peer's
/// `LinkConfig::max_handshakes` (16), which leaves room for Raft's own connections.
pub(crate) const FORWARD_HANDSHAKES: usize = 4;

/// Forwards from this node under way at once, at most; more wait their turn. As many as a
/// load of 64 client connections: at 32, a follower's forwarded writes reached the leader
/// half as batched as its own clients' (docs/performance.md, 2026-11-28).
pub(crate) const FORWARDS_AT_ONCE: usize = 64;

/// A kept connection to `target` that was used lately, if any.
fn pooled(shared: &LinkShared, target: NodeId) -> Option<Channel<LinkStream>> {
    let mut pool = shared.forward_pool.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let kept = pool.get_mut(&(std::thread::current().id(), target))?;
    kept.retain(|(_, used)| used.elapsed() < POOL_IDLE);
    kept.pop().map(|(channel, _)| channel)
}

/// Keeps `channel` to `target` for the next forward, unless [`POOL_MAX`] are kept for it
/// already, on all threads together: a pool per thread alone would let every worker thread
/// keep its own 64, past what the target accepts (`LinkConfig::max_connections`).
fn keep(shared: &LinkShared, target: NodeId, channel: Channel<LinkStream>) {
    let mut pool = shared.forward_pool.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if kept_for(&mut pool, target) < POOL_MAX {
        let kept = pool.entry((std::thread::current().id(), target)).or_default();
        kept.push((channel, std::time::Instant::now()));
    }
}

/// How many connections to `target` the pool keeps on all threads, after letting go of those
/// idle too long to be used again.
fn kept_for<C>(
    pool: &mut std::collections::HashMap<
        (std::thread::ThreadId, NodeId),
        Vec<(C, std::time::Instant)>,
    >,
    target: NodeId,
) -> usize {
    pool.iter_mut()
        .filter(|((_, to), _)| *to == target)
        .map(|(_, kept)| {
            kept.retain(|(_, used)| used.elapsed() < POOL_IDLE);
            kept.len()
        })
        .sum()
}

/// One request and its reply on `channel`, or on a new connection. Returns the connection to
/// keep (none after any failure) and the reply's bytes.
async fn exchange(
    shared: &LinkShared,
    target: NodeId,
    addr: &str,
    mut channel: Option<Channel<LinkStream>>,
    request: &[u8],
    deadline: Instant,
) -> (Option<Channel<LinkStream>>, Result<Vec<u8>, Failure>) {
    let max = shared.config.max_frame_bytes;
    loop {
        let reused = channel.is_some();
        let mut ch = match channel.take() {
            Some(ch) => ch,
            None => {
                // The handshake has its own, usually shorter, bound.
                let by = deadline.min(Instant::now() + shared.config.handshake_timeout);
                match timeout_at(by, connect(shared, target, addr)).await {
                    Ok(Ok(ch)) => ch,
                    Ok(Err(e)) => return (None, Err(Failure::Unreachable(e))),
                    Err(_) => {
                        let e = io::Error::new(io::ErrorKind::TimedOut, "no handshake in time");
                        return (None, Err(Failure::Unreachable(e)));
                    }
                }
            }
        };
        let round_trip = async {
            ch.send(request).await?;
            ch.recv(max).await
        };
        match timeout_at(deadline, round_trip).await {
            Ok(Ok(reply)) => return (Some(ch), Ok(reply)),
            // A kept connection may have been closed by the peer meanwhile (idle, restarted):
            // one more try on a fresh one. Raft RPCs may be sent twice.
            Ok(Err(e)) if reused => {
                tracing::debug!(target, error = %e, "cluster link: kept connection failed, reconnecting");
                continue;
            }
            Ok(Err(e)) => return (None, Err(Failure::Network(e))),
            Err(_) => return (None, Err(Failure::Timeout)),
        }
    }
}

/// Opens an authenticated connection to `target` at `addr`, from the link's host.
async fn connect(
    shared: &LinkShared,
    target: NodeId,
    addr: &str,
) -> io::Result<Channel<LinkStream>> {
    let local = shared.local_ip;
    let remote: SocketAddr = tokio::net::lookup_host(addr)
        .await?
        .find(|a| local.is_none_or(|ip| ip.is_ipv4() == a.is_ipv4()))
        .ok_or_else(|| {
            io::Error::new(io::ErrorKind::AddrNotAvailable, format!("{addr}: no usable address"))
        })?;
    let socket = if remote.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    if let Some(ip) = local {
        // From our raft host, so a rule cutting two raft addresses apart cuts this too.
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    let stream = socket.connect(remote).await?;
    stream.set_nodelay(true)?;
    let config = &shared.config;
    let stream = match &config.tls {
        Some(tls) => tls.connect(addr, stream).await?,
        None => LinkStream::plain(stream),
    };
    Channel::client(stream, config.node_id, &config.secret, Some(target)).await
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let ttl = option.soft_ttl();
        let max = self.shared.config.max_frame_bytes;
        let all = rpc.entries.len();
        let mut request = Request { group: self.group, rpc: Rpc::AppendEntries(rpc) };
        let encode = |request: &Request| message::encode(request).map_err(Failure::Network);
        let mut encoded = encode(&request);
        // Over the frame cap: send the first half of the entries, again and again, until it
        // fits, and report a partial success (openraft's contract for a network that sends a
        // prefix): openraft sends the rest next. One entry over the cap cannot go: the RPC
        // fails, and keeps failing, loudly.
        while let (Ok(bytes), Rpc::AppendEntries(rpc)) = (&encoded, &mut request.rpc) {
            if message::fits(bytes, max) || rpc.entries.len() <= 1 {
                break;
            }
            rpc.entries.truncate(rpc.entries.len() / 2);
            encoded = encode(&request);
        }
        if let Ok(bytes) = &encoded {
            if !message::fits(bytes, max) {
                tracing::error!(
                    target = self.target,
                    bytes = bytes.len(),
                    max,
                    "cluster link: one entry is over the frame cap; it cannot be replicated"
                );
            }
        }
        let sent_last = match &request.rpc {
            Rpc::AppendEntries(rpc) if rpc.entries.len() < all => {
                rpc.entries.last().map(|entry| entry.log_id)
            }
            _ => None,
        };
        let reply = match encoded {
            Ok(bytes) => self.call_encoded(bytes, ttl).await,
            Err(failure) => Err(failure),
        };
        match reply {
            Ok(AppendEntriesResponse::Success) if sent_last.is_some() => {
                Ok(AppendEntriesResponse::PartialSuccess(sent_last))
            }
            Ok(response) => Ok(response),
            Err(f) => Err(self.rpc_error(f, RPCTypes::AppendEntries, ttl)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let ttl = option.soft_ttl();
        let reply = self.call(Rpc::Vote(rpc), ttl).await;
        reply.map_err(|f| self.rpc_error(f, RPCTypes::Vote, ttl))
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let ttl = option.soft_ttl();
        let reply = self.call(Rpc::PreVote(rpc), ttl).await;
        reply.map_err(|f| self.rpc_error(f, RPCTypes::Vote, ttl))
    }

    /// A small snapshot in one frame; a larger one in parts of half a frame, each read from
    /// the snapshot's file when it is sent, so neither side holds the whole in memory.
    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: SnapshotOf<TypeConfig, Self::SnapshotData>,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let ttl = option.soft_ttl();
        let data = Arc::new(snapshot.snapshot);
        let total = data.len();
        // Room in each frame for the part's envelope (vote, metadata, offsets).
        let part = (self.shared.config.max_frame_bytes / 2).max(1);
        let read = |offset: u64| {
            let data = Arc::clone(&data);
            async move {
                tokio::task::spawn_blocking(move || data.read_at(offset, part))
                    .await
                    .map_err(io::Error::other)?
            }
        };
        let unreadable = |e: io::Error| {
            tracing::warn!(error = %e, "a snapshot to send cannot be read");
            StreamingError::from(RPCError::Network(NetworkError::new(&e)))
        };
        if total <= part as u64 {
            let data = read(0).await.map_err(unreadable)?;
            let rpc = Rpc::Snapshot { vote, meta: snapshot.meta, data };
            let reply = tokio::select! {
                closed = cancel => return Err(StreamingError::Closed(closed)),
                reply = self.call(rpc, ttl) => reply,
            };
            let installed = reply.map_err(|f| self.rpc_error(f, RPCTypes::InstallSnapshot, ttl))?;
            self.shared.snapshots_sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok(installed);
        }
        // In parts, one at a time on this client's one connection: the receiver gathers them
        // on that connection and installs the whole.
        tokio::pin!(cancel);
        let mut offset = 0;
        while offset < total {
            let bytes = read(offset).await.map_err(unreadable)?;
            if bytes.is_empty() {
                break;
            }
            let sent = bytes.len() as u64;
            let rpc =
                Rpc::SnapshotPart { vote, meta: snapshot.meta.clone(), offset, total, data: bytes };
            let reply: Result<Option<SnapshotResponse<TypeConfig>>, Failure> = tokio::select! {
                closed = &mut cancel => return Err(StreamingError::Closed(closed)),
                reply = self.call(rpc, ttl) => reply,
            };
            match reply {
                Ok(Some(installed)) => {
                    self.shared.snapshots_sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Ok(installed);
                }
                Ok(None) => offset += sent,
                Err(f) => return Err(self.rpc_error(f, RPCTypes::InstallSnapshot, ttl).into()),
            }
        }
        let e = io::Error::other("every part of the snapshot was sent, and none installed it");
        Err(RPCError::Network(NetworkError::new(&e)).into())
    }

    async fn transfer_leader(
        &mut self,
        rpc: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        let ttl = option.soft_ttl();
        let reply = self.call(Rpc::TransferLeader(rpc), ttl).await;
        reply.map_err(|f| self.rpc_error(f, RPCTypes::TransferLeader, ttl))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Instant;

    use super::*;

    #[test]
    fn the_pool_counts_a_targets_connections_on_every_thread_and_lets_idle_ones_go() {
        let here = std::thread::current().id();
        let there = std::thread::spawn(|| std::thread::current().id()).join().unwrap();
        let now = Instant::now();
        let idle = now.checked_sub(POOL_IDLE + Duration::from_secs(1)).expect("a clock this old");
        let mut pool: HashMap<_, Vec<((), Instant)>> = HashMap::new();
        pool.insert((here, 2), vec![((), now), ((), now), ((), idle)]);
        pool.insert((there, 2), vec![((), now), ((), idle)]);
        pool.insert((there, 3), vec![((), now), ((), idle)]);

        assert_eq!(kept_for(&mut pool, 2), 3, "two on this thread, one on the other");
        assert_eq!(pool[&(here, 2)].len(), 2);
        assert_eq!(pool[&(there, 2)].len(), 1);
        assert_eq!(pool[&(there, 3)].len(), 2, "another target's are left as they are");
        assert_eq!(kept_for(&mut pool, 4), 0);
    }
}
