//! What the cluster link's two ends share: the link's settings and runtime, the addresses
//! peers told, the kept forwarding connections and their caps, and how a forward fails.
//!
//! Owns: [`LinkShared`], [`ForwardPool`] and [`ForwardError`]. Apart from
//! `server` (which makes a link's state) and `client` (which sends on it), so that neither
//! imports the other's internals.

use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::runtime::Handle;
use tokio::sync::Semaphore;

use super::channel::Channel;
use super::message::{Announce, Reply};
use super::tls::LinkStream;
use super::LinkConfig;
use crate::types::NodeId;

/// What the link's parts share: its settings, where its runtime is, and the host outgoing
/// connections leave from.
pub(crate) struct LinkShared {
    pub(crate) config: LinkConfig,
    pub(crate) handle: Handle,
    /// The listener's IP, unless it listens on every address: outgoing connections are bound
    /// to it, so that cutting traffic between two raft addresses cuts everything between them.
    pub(crate) local_ip: Option<IpAddr>,
    /// Turns true when the link stops: connections handed to other threads close then too.
    pub(crate) stopping: tokio::sync::watch::Sender<bool>,
    /// The API addresses peers told this node, by node (see [`ClusterLink::announce`]).
    pub(crate) told: Mutex<std::collections::HashMap<NodeId, String>>,
    /// Authenticated connections kept for forwarding (see [`ForwardPool`]): a forward reuses
    /// one instead of a handshake per request.
    pub(crate) forward_pool: Mutex<ForwardPool>,
    /// Forwards under way at once, at most (`super::client::FORWARDS_AT_ONCE`): with the pool's
    /// cap, what keeps forwarding from taking the connections a peer keeps for Raft.
    pub(crate) forwards: Arc<Semaphore>,
    /// Forwarding connections in their handshake at once, at most
    /// (`super::client::FORWARD_HANDSHAKES`): a burst of forwards must not open more than a
    /// peer takes at once (`LinkConfig::max_handshakes`), which it would refuse.
    pub(crate) forward_handshakes: Arc<Semaphore>,
    /// Snapshots this node sent whole to a peer that installed them.
    pub(crate) snapshots_sent: std::sync::atomic::AtomicU64,
}

impl LinkShared {
    /// Keeps the API address node `id` told (an empty one tells nothing).
    pub(crate) fn was_told(&self, id: NodeId, api_addr: String) {
        if !api_addr.is_empty() {
            self.told.lock().unwrap_or_else(PoisonError::into_inner).insert(id, api_addr);
        }
    }

    /// Answers what the authenticated node `from` told: where clients reach this node, or why
    /// it is refused (a node tells only its own address).
    pub(crate) fn announced(&self, from: NodeId, announce: Announce) -> Reply<String> {
        let Announce { node, api_addr } = announce;
        if node != from {
            return Err(format!("node {from} cannot tell node {node}'s address"));
        }
        self.was_told(node, api_addr);
        Ok(self.config.api_addr.clone())
    }
}

impl fmt::Debug for LinkShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LinkShared")
            .field("config", &self.config)
            .field("local_ip", &self.local_ip)
            .finish_non_exhaustive()
    }
}

/// Kept forwarding connections by the thread that opened them and their target, each with
/// when it was last used. A connection is used only on the thread that opened it: its
/// readiness comes from that thread's event loop.
pub(crate) type ForwardPool =
    std::collections::HashMap<(std::thread::ThreadId, NodeId), Vec<(Channel<LinkStream>, Instant)>>;

/// Why a forwarded request got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForwardError {
    /// It never reached the target (no connection, no handshake): certainly not run.
    #[error("the request did not reach node {target}: {reason}")]
    NotSent {
        /// The node it was for.
        target: NodeId,
        /// Why.
        reason: String,
    },
    /// It was sent and no answer came back (the connection failed, the time ran out, or the
    /// target could not run it): it may have run.
    #[error("no answer from node {target}: {reason}")]
    NoAnswer {
        /// The node it was for.
        target: NodeId,
        /// Why.
        reason: String,
    },
}
