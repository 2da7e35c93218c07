//! The cluster link: Raft traffic between nodes over TCP, authenticated with the cluster
//! secret, and with `--cluster-tls-dir` inside mutual TLS.
//!
//! Owns: the node's listener on its raft address and the small runtime it runs on
//! ([`ClusterLink`]), openraft's network for outgoing RPCs ([`Network`], [`PeerClient`]), the
//! handshake and the authenticated frames ([`Channel`]), and what those frames carry
//! ([`Request`], [`Rpc`]).
//!
//! # Layout
//!
//! Module map; each uses only those listed after it:
//! - `server.rs`: [`ClusterLink`], the listener, the runtime thread, the dispatch of requests
//!   to the local [`openraft::Raft`], the caps on connections.
//! - `client.rs`: [`Network`] and [`PeerClient`], openraft's `RaftNetworkFactory` and
//!   `RaftNetworkV2`: one connection per client, opened from the node's own raft host; and
//!   forwarded requests and API addresses sent to a peer, on the caller's own runtime over
//!   connections its thread keeps.
//! - `handoff.rs`: [`ForwardedConnection`], a connection a peer forwards requests on, taken
//!   off the link's runtime and served on the thread that runs forwarded requests.
//! - `shared.rs`: what both ends share: the link's state (`LinkShared`), the kept forwarding
//!   connections and [`ForwardError`].
//! - `message.rs`: [`Request`] and [`Rpc`], a request as it travels, and the replies.
//! - `channel.rs`: [`Channel`], the handshake and the authenticated frames on one connection.
//! - `tls.rs`: [`LinkTls`] and [`LinkStream`], mutual TLS under the channel when configured.
//! - `frame.rs`: length-prefixed frames with a hard cap, read without trusting the prefix.
//! - this file: [`LinkConfig`] and [`ClusterSecret`].
//!
//! # Wire format
//!
//! Every frame is a 4-byte big-endian length, then that many bytes. Before authentication a
//! frame is at most [`HANDSHAKE_FRAME_MAX`] bytes, after it at most
//! [`LinkConfig::max_frame_bytes`] and its tag; a longer prefix closes the connection before a
//! byte of the body is read, and a body is read as it arrives (never allocated from the prefix
//! alone). Entries to append that are over the cap together go out in several RPCs.
//!
//! The handshake (see `channel.rs`): the client sends its node id and a fresh random nonce, the
//! server answers with its own; the client proves it knows the secret with an HMAC over both
//! nonces and both ids, the server checks that proof and only then proves itself the same way
//! (another label). Both derive one key per direction from the secret and that transcript.
//! Every later frame is sealed with AES-256-GCM under its direction's key, its sequence number
//! the nonce: a frame cannot be read, altered, replayed, reordered, dropped unseen or moved to
//! another connection. Without TLS a peer's address and certificate are not checked, so the
//! README still keeps a plain link to a trusted network. With it ([`LinkConfig::tls`]), every connection is TLS first, and
//! a peer must present a certificate the cluster's CA signed before the handshake begins.
//!
//! Messages are encoded with [`wal::codec`] (bincode, zstd for large values): entries already
//! are on disk, byte payloads stay bytes (JSON would write each byte as a number), and the
//! decoded size is checked against the cap before anything is decompressed.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::types::NodeId;

mod channel;
mod client;
mod frame;
mod handoff;
mod message;
mod server;
mod shared;
mod tls;

pub use channel::Channel;
pub use client::{Network, PeerClient};
pub use frame::HANDSHAKE_FRAME_MAX;
pub use handoff::{ForwardTaker, ForwardedConnection};
pub use message::{Announce, Forwarded, ForwardedReply, Request, Rpc};
pub use server::ClusterLink;
pub use shared::ForwardError;
pub use tls::{LinkStream, LinkTls, Socket};

/// The shortest cluster secret accepted, in bytes: 256 bits, the HMAC-SHA256 key size.
pub const MIN_SECRET_LEN: usize = 32;

/// The secret every node of a cluster shares. It keys the handshake's proofs and the session
/// keys, and is never sent. Its `Debug` never shows it.
#[derive(Clone)]
pub struct ClusterSecret(Vec<u8>);

impl ClusterSecret {
    /// A secret of at least [`MIN_SECRET_LEN`] bytes.
    ///
    /// # Errors
    /// [`Error::SecretTooShort`] for fewer bytes: a short secret could be guessed offline from
    /// one recorded handshake.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self> {
        let bytes = bytes.into();
        if bytes.len() < MIN_SECRET_LEN {
            return Err(Error::SecretTooShort { len: bytes.len(), min: MIN_SECRET_LEN });
        }
        Ok(ClusterSecret(bytes))
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterSecret({} bytes)", self.0.len())
    }
}

/// How a node's cluster link behaves: who it is, the secret, and the limits that keep a bad
/// peer from costing more than a bounded amount.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// This node's id, sent in the handshake and checked by the peer it calls.
    pub node_id: NodeId,
    /// The cluster's shared secret.
    pub secret: ClusterSecret,
    /// The largest message after the handshake, in bytes, as it travels and as it decodes: a
    /// connection never holds more than one such frame and its decoded message. Entries to
    /// append that are over it together go out in several RPCs; any other message over it
    /// (one entry, a snapshot) fails its RPC.
    pub max_frame_bytes: usize,
    /// How long a peer has to finish the handshake (connect included, on the calling side).
    pub handshake_timeout: Duration,
    /// How long an authenticated connection may stay silent before the server closes it.
    pub idle_timeout: Duration,
    /// Incoming connections still in their handshake, at most: more are closed at once, so a
    /// flood of silent connections costs a bounded number of sockets for at most
    /// `handshake_timeout` each.
    pub max_handshakes: usize,
    /// Authenticated incoming connections, at most (each peer opens a few: replication,
    /// heartbeats, snapshots, votes; and up to 64 for requests it forwards).
    pub max_connections: usize,
    /// Mutual TLS on every connection (`--cluster-tls-dir`); plain TCP without.
    pub tls: Option<std::sync::Arc<LinkTls>>,
    /// Where a snapshot arriving in parts is gathered (see [`crate::Spool`]): the data dir,
    /// so a large one is never held whole in memory; in memory when `None`.
    pub spool_dir: Option<std::path::PathBuf>,
    /// Where clients reach this node, told to peers ([`ClusterLink::announce`]); empty when
    /// it serves no clients.
    pub api_addr: String,
}

impl LinkConfig {
    /// The defaults for node `node_id`: 64 MiB frames, 2 s for a handshake, 60 s of silence,
    /// 16 handshakes and 288 connections at once (two peers forwarding 64 requests each, and
    /// their Raft connections, with room to spare).
    pub fn new(node_id: NodeId, secret: ClusterSecret) -> Self {
        LinkConfig {
            node_id,
            secret,
            max_frame_bytes: 64 << 20,
            handshake_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(60),
            max_handshakes: 16,
            max_connections: 288,
            tls: None,
            spool_dir: None,
            api_addr: String::new(),
        }
    }
}
