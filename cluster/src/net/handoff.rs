//! A forwarding connection handed from the link's thread to the thread that runs forwarded
//! requests (docs/spec/cluster.md, "Where a request is served").
//!
//! Owns: [`ForwardedConnection`] (its move between runtimes and its request loop) and
//! [`ForwardTaker`].
//!
//! Why: answered on the link's thread, each forwarded request crossed threads twice on the
//! node that runs it (the link's thread read it and woke the thread that runs requests, which
//! woke the link's thread again to send the answer), and every page went through the link's
//! one thread. A peer forwards on connections of their own, never on its Raft connections
//! (`client::forwarding_exchange`), so a connection whose first request is a forwarded one
//! leaves the link's runtime whole, its keys and sequence numbers with it: one thread then
//! reads each request, runs it and writes its answer, and the link's thread keeps to Raft.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::timeout;

use super::channel::Channel;
use super::message::{self, Forwarded, ForwardedReply, Reply, Request, Rpc};
use super::shared::LinkShared;
use super::tls::LinkStream;
use crate::types::{GroupId, NodeId};

/// Takes each connection a peer forwards requests on, with its first request, to serve it
/// ([`ForwardedConnection::serve`]) on the thread that runs forwarded requests.
pub type ForwardTaker = Arc<dyn Fn(ForwardedConnection) + Send + Sync>;

/// An authenticated connection a peer forwards requests on, taken off the link's runtime
/// (its socket detached), with the request it arrived with. It counts as one of the link's
/// connections until it closes.
pub struct ForwardedConnection {
    channel: Channel<LinkStream>,
    first: Forwarded,
    peer: SocketAddr,
    group: GroupId,
    shared: Arc<LinkShared>,
    _connection: OwnedSemaphorePermit,
}

impl std::fmt::Debug for ForwardedConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardedConnection")
            .field("peer", &self.peer)
            .field("node", &self.channel.peer())
            .finish_non_exhaustive()
    }
}

impl ForwardedConnection {
    /// Takes `channel`, on which `first` arrived for `group`, off the calling thread's runtime.
    ///
    /// # Errors
    /// The socket could not be detached; the connection is lost then.
    pub(crate) fn detach(
        mut channel: Channel<LinkStream>,
        first: Forwarded,
        peer: SocketAddr,
        group: GroupId,
        shared: Arc<LinkShared>,
        connection: OwnedSemaphorePermit,
    ) -> io::Result<Self> {
        channel.get_mut().detach()?;
        Ok(ForwardedConnection { channel, first, peer, group, shared, _connection: connection })
    }

    /// The node forwarding on it.
    pub fn node(&self) -> NodeId {
        self.channel.peer()
    }

    /// Serves the connection on the calling thread's runtime: each forwarded request, the
    /// first included, is answered with `run`'s reply, one at a time and in order. Ends when
    /// the peer closes it, falls silent for the link's idle timeout, sends anything but a
    /// forwarded request or its API address, or the link stops. Call it within a tokio
    /// runtime (an actix thread's is one).
    pub async fn serve<F, Fut>(self, mut run: F)
    where
        F: FnMut(Forwarded) -> Fut,
        Fut: Future<Output = ForwardedReply>,
    {
        let ForwardedConnection { mut channel, first, peer, group, shared, _connection } = self;
        let node = channel.peer();
        if let Err(e) = channel.get_mut().attach() {
            tracing::warn!(%peer, node, error = %e, "cluster link: forwarding connection lost");
            return;
        }
        let mut stopping = shared.stopping.subscribe();
        let config = &shared.config;
        let max = config.max_frame_bytes;
        let mut first = Some(Request { group, rpc: Rpc::Forward(first) });
        loop {
            let request = match first.take() {
                Some(request) => request,
                None => {
                    let body = tokio::select! {
                        body = timeout(config.idle_timeout, channel.recv(max)) => body,
                        _ = stopping.wait_for(|stopping| *stopping) => return,
                    };
                    let body = match body {
                        Ok(Ok(body)) => body,
                        Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => return,
                        Ok(Err(e)) => {
                            tracing::warn!(%peer, node, error = %e, "cluster link: connection closed");
                            return;
                        }
                        // Idle: the peer keeps a connection for less long than this.
                        Err(_) => return,
                    };
                    match message::decode::<Request>(&body, max) {
                        Ok(request) => request,
                        Err(e) => {
                            tracing::warn!(%peer, node, error = %e, "cluster link: bad request");
                            return;
                        }
                    }
                }
            };
            let reply = match request.rpc {
                _ if request.group != group => {
                    let refusal: Reply<()> =
                        Err(format!("group {} is not served here", request.group));
                    message::encode(&refusal)
                }
                Rpc::Forward(request) => {
                    // Encoded whole, the page copied once into the frame it is sealed in.
                    let reply: Reply<ForwardedReply> = Ok(run(request).await);
                    let size = reply.as_ref().map_or(0, ForwardedReply::size);
                    message::encode_plain(&reply, size)
                }
                Rpc::Announce(announce) => message::encode(&shared.announced(node, announce)),
                other => {
                    // A peer of this version sends Raft on connections of its own.
                    let rpc = other.name();
                    tracing::warn!(%peer, node, rpc, "cluster link: Raft on a forwarding connection");
                    return;
                }
            };
            let sent = match reply {
                Ok(reply) => channel.send_owned(reply).await,
                Err(e) => Err(e),
            };
            if let Err(e) = sent {
                tracing::debug!(%peer, node, error = %e, "cluster link: reply not sent");
                return;
            }
        }
    }
}
