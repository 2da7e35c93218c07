//! What the link's frames carry: a request (the group it is for and the Raft RPC) and its
//! reply, both encoded with [`wal::codec`].
//!
//! Owns: [`Request`], [`Rpc`], the reply's shape (`Result<T, String>`) and the capped decoding.

use std::io;

use openraft::raft::{AppendEntriesRequest, TransferLeaderRequest, VoteRequest};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use wal::codec;

use crate::types::{GroupId, SnapshotMeta, TypeConfig, Vote};

/// One request on the link: every message names its group, so one link can later serve many
/// groups.
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    /// The Raft group the RPC is for.
    pub group: GroupId,
    /// The RPC.
    pub rpc: Rpc,
}

/// The Raft RPCs, as openraft's network passes them.
#[derive(Debug, Serialize, Deserialize)]
pub enum Rpc {
    /// Entries to append, or a heartbeat (no entries).
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    /// A candidate's request for a vote.
    Vote(VoteRequest<TypeConfig>),
    /// Whether a vote would be granted, changing nothing.
    PreVote(VoteRequest<TypeConfig>),
    /// A whole snapshot to install: the leader's vote, its metadata, its bytes.
    Snapshot {
        /// The sending leader's vote, checked by the receiver.
        vote: Vote,
        /// What the snapshot holds.
        meta: SnapshotMeta,
        /// The snapshot's bytes.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// A part of a snapshot too large for one frame. The parts of one snapshot come in order
    /// on one connection from offset 0; the one that completes `total` bytes installs it and
    /// is answered with the install's response, every other with `None`.
    SnapshotPart {
        /// The sending leader's vote, checked by the receiver.
        vote: Vote,
        /// What the snapshot holds.
        meta: SnapshotMeta,
        /// Where this part begins in the snapshot's bytes.
        offset: u64,
        /// The snapshot's length.
        total: u64,
        /// This part's bytes.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// The leader hands over to the receiver.
    TransferLeader(TransferLeaderRequest<TypeConfig>),
    /// A client's request a follower sends on to the leader, answered with a
    /// [`ForwardedReply`].
    Forward(Forwarded),
    /// A node tells a peer where clients reach it, answered with where clients reach the
    /// peer.
    Announce(Announce),
}

/// A node's API address, told to a peer (docs/spec/cluster.md: a node's public address is
/// told to its peers). The voters of `--initial-cluster` are listed by raft address only, so
/// this is how their peers learn where clients reach them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Announce {
    /// The node telling.
    pub node: u64,
    /// Where clients reach it.
    pub api_addr: String,
}

/// A client's HTTP request as a follower received it, sent on to the leader over the link
/// (docs/spec/cluster.md: one hop, node-to-node traffic on the link only).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Forwarded {
    /// The node that received it.
    pub from: u64,
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path and query, as received.
    pub path: String,
    /// The end-to-end headers, as received.
    #[serde(with = "header_pairs")]
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body, as received (still compressed if it came so).
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
}

/// The leader's answer to a [`Forwarded`] request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForwardedReply {
    /// The HTTP status.
    pub status: u16,
    /// The end-to-end headers.
    #[serde(with = "header_pairs")]
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body: on the receiving side, a slice of the frame it arrived in
    /// (`decode_forwarded_reply`).
    #[serde(serialize_with = "bytes_out", deserialize_with = "bytes_in")]
    pub body: bytes::Bytes,
}

/// A [`ForwardedReply`] as it lies in a frame: the same layout, its body borrowed.
#[derive(Deserialize)]
struct ForwardedReplyInPlace<'a> {
    status: u16,
    #[serde(with = "header_pairs")]
    headers: Vec<(String, Vec<u8>)>,
    body: &'a [u8],
}

/// Header pairs with each value as one byte string: the same bytes on the wire as a sequence
/// of `u8`, without a call per byte to write or read it.
mod header_pairs {
    use serde::{Deserialize, Deserializer, Serializer};
    use serde_bytes::{ByteBuf, Bytes};

    pub fn serialize<S: Serializer>(
        pairs: &[(String, Vec<u8>)],
        out: S,
    ) -> Result<S::Ok, S::Error> {
        out.collect_seq(pairs.iter().map(|(name, value)| (name, Bytes::new(value))))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        input: D,
    ) -> Result<Vec<(String, Vec<u8>)>, D::Error> {
        let pairs = Vec::<(String, ByteBuf)>::deserialize(input)?;
        Ok(pairs.into_iter().map(|(name, value)| (name, value.into_vec())).collect())
    }
}

fn bytes_out<S: serde::Serializer>(body: &bytes::Bytes, out: S) -> Result<S::Ok, S::Error> {
    out.serialize_bytes(body)
}

fn bytes_in<'de, D: serde::Deserializer<'de>>(input: D) -> Result<bytes::Bytes, D::Error> {
    serde_bytes::ByteBuf::deserialize(input).map(|b| bytes::Bytes::from(b.into_vec()))
}

/// Decodes the [`Reply`] to a forwarded request from the frame it arrived in, of at most
/// `max` decoded bytes. A page of rows is most of a frame: its body is relayed as a slice of
/// the frame rather than copied out of it.
pub(crate) fn decode_forwarded_reply(
    frame: Vec<u8>,
    max: usize,
) -> io::Result<Reply<ForwardedReply>> {
    if codec::is_compressed(&frame) {
        return decode(&frame, max);
    }
    let frame = bytes::Bytes::from(frame);
    let read: Reply<ForwardedReplyInPlace<'_>> = codec::decode_borrowed(&frame)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(read.map(|r| ForwardedReply {
        status: r.status,
        headers: r.headers,
        body: frame.slice_ref(r.body),
    }))
}

/// The bytes of a message's header pairs and body: about what it encodes to.
fn size_of(headers: &[(String, Vec<u8>)], body: &[u8]) -> usize {
    body.len() + headers.iter().map(|(name, value)| name.len() + value.len() + 2).sum::<usize>()
}

impl Forwarded {
    /// About the bytes it encodes to.
    pub fn size(&self) -> usize {
        self.path.len() + size_of(&self.headers, &self.body)
    }
}

impl ForwardedReply {
    /// About the bytes it encodes to.
    pub fn size(&self) -> usize {
        size_of(&self.headers, &self.body)
    }
}

impl Rpc {
    /// The RPC's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Rpc::AppendEntries(_) => "append_entries",
            Rpc::Vote(_) => "vote",
            Rpc::PreVote(_) => "pre_vote",
            Rpc::Snapshot { .. } => "snapshot",
            Rpc::SnapshotPart { .. } => "snapshot_part",
            Rpc::TransferLeader(_) => "transfer_leader",
            Rpc::Forward(_) => "forward",
            Rpc::Announce(_) => "announce",
        }
    }
}

/// A reply: the RPC's response, or why the receiving node could not answer it (its Raft has
/// stopped, the group is not there), as text: the caller only backs off and retries, so the
/// error's structure is of no use to it, and text decodes the same for every response type.
pub(crate) type Reply<T> = Result<T, String>;

/// Encodes a message.
pub(crate) fn encode<T: Serialize>(value: &T) -> io::Result<Vec<u8>> {
    codec::encode(value).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// Encodes a message never compressed: a forwarded request or answer. Its body is what a
/// client sent or will receive, already compressed when the client asked for that, and on a
/// cluster's network the CPU zstd takes for each page costs more than the bytes it saves.
/// `size_hint`, the bytes its body and headers take, spares the copies of a growing buffer.
pub(crate) fn encode_plain<T: Serialize>(value: &T, size_hint: usize) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(size_hint + 64);
    codec::encode_to(value, &mut out)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    Ok(out)
}

/// Whether the encoded message `bytes` fits a link whose cap is `max`: its frame and its
/// decoded size both at most `max` (a compressed message decodes larger than it travels).
pub(crate) fn fits(bytes: &[u8], max: usize) -> bool {
    bytes.len() <= max && codec::decoded_len(bytes) <= max
}

/// Decodes a message of at most `max` decoded bytes: the size a compressed body claims is
/// checked before it is decompressed, so a small frame cannot expand into a large allocation.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8], max: usize) -> io::Result<T> {
    let len = codec::decoded_len(bytes);
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a message decoding to {len} bytes, over the cap of {max}"),
        ));
    }
    codec::decode(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_encode_as_a_sequence_of_bytes_would_and_come_back() {
        #[derive(Serialize)]
        struct Plain {
            headers: Vec<(String, Vec<u8>)>,
        }
        let headers = vec![("etag".to_string(), b"\"v7\"".to_vec()), ("x".into(), vec![0, 255])];
        let reply = ForwardedReply { status: 200, headers: headers.clone(), body: "{}".into() };
        let encoded = encode(&reply).unwrap();
        let plain =
            encode(&(200u16, Plain { headers: headers.clone() }, b"{}".as_slice())).unwrap();
        assert_eq!(encoded, plain, "the wire form of a forwarded reply changed");
        let back: Reply<ForwardedReply> =
            decode_forwarded_reply(encode(&Reply::Ok(reply)).unwrap(), 1 << 20).unwrap();
        let back = back.unwrap();
        assert_eq!((back.status, back.headers, &back.body[..]), (200, headers, &b"{}"[..]));
    }
}
