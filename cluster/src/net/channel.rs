//! One authenticated connection: the handshake that proves both ends know the cluster secret,
//! and the frames bound to it afterwards.
//!
//! Owns: [`Channel`], the handshake's messages, proofs and key derivation, and the per-frame
//! tags.
//!
//! # Handshake
//!
//! ```text
//! client → server   MAGIC, client id, client nonce        (48 bytes)
//! server → client   MAGIC, server id, server nonce        (48 bytes)
//! client → server   HMAC(secret, "client proof" ‖ T)      (32 bytes)
//! server → client   HMAC(secret, "server proof" ‖ T)      (32 bytes)
//! T = MAGIC ‖ client nonce ‖ server nonce ‖ client id ‖ server id
//! ```
//!
//! Why in this order: the server proves nothing to a peer that has not proven itself first, so
//! an unauthenticated peer learns nothing keyed by the secret, not even for nonces it chose.
//! The client's proof is useless anywhere else: it covers the server's fresh nonce. The two
//! labels differ, so one side's proof cannot be reflected back as the other's.
//!
//! After it, each direction has its own key, `HMAC(secret, "<direction> key" ‖ T)`, and every
//! frame is `body ‖ BLAKE3(key, body ‖ seq)` (BLAKE3's keyed mode, a MAC) with `seq` (8 bytes,
//! big-endian) counting that direction's frames from 0. A frame replayed, reordered, dropped
//! or taken from another connection (other nonces, so other keys) fails its tag, and the
//! connection is closed. `seq` comes last so that the body starts on BLAKE3's first chunk:
//! every whole 1 KiB chunk of it is then hashed in the vectorized many-chunk path, where 8
//! bytes first made the first chunk serial (a 35 KB page's tag took 8.2 µs, now 5.2 µs).
//!
//! Why BLAKE3 for the frames and HMAC-SHA256 for the handshake: the frames carry every
//! replicated entry and every forwarded page, and at tens of megabytes a second SHA-256 took a
//! sixth of a node's CPU where BLAKE3, vectorized across a frame's chunks, takes a fraction of
//! that; the handshake hashes a few dozen bytes once per connection.

use std::io;

use hmac::{Hmac, Mac};
use rand::rngs::OsRng;
use rand::RngCore;
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncWrite};

use super::frame::{self, HANDSHAKE_FRAME_MAX};
use super::ClusterSecret;
use crate::types::NodeId;

type HmacSha256 = Hmac<Sha256>;

/// The protocol's name and version, first in every hello: a peer speaking anything else is
/// refused before it costs more.
const MAGIC: &[u8; 8] = b"SHEETDR3";
const NONCE_LEN: usize = 32;
const HELLO_LEN: usize = MAGIC.len() + 8 + NONCE_LEN;
/// The length of an HMAC-SHA256 proof and of a frame's BLAKE3 tag.
pub(crate) const TAG_LEN: usize = 32;

const CLIENT_PROOF: &[u8] = b"sheetd cluster link: client proof";
const SERVER_PROOF: &[u8] = b"sheetd cluster link: server proof";
const CLIENT_TO_SERVER: &[u8] = b"sheetd cluster link: client to server key";
const SERVER_TO_CLIENT: &[u8] = b"sheetd cluster link: server to client key";

/// An authenticated connection to a peer: frames out and in, each bound to this connection's
/// keys and its place in the stream.
pub struct Channel<S> {
    stream: S,
    peer: NodeId,
    send_key: blake3::Hasher,
    recv_key: blake3::Hasher,
    send_seq: u64,
    recv_seq: u64,
}

impl<S> std::fmt::Debug for Channel<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel").field("peer", &self.peer).finish_non_exhaustive()
    }
}

/// What both sides' proofs and keys cover.
struct Transcript(Vec<u8>);

impl Transcript {
    fn new(client: &Hello, server: &Hello) -> Self {
        let mut t = Vec::with_capacity(MAGIC.len() + 2 * NONCE_LEN + 16);
        t.extend_from_slice(MAGIC);
        t.extend_from_slice(&client.nonce);
        t.extend_from_slice(&server.nonce);
        t.extend_from_slice(&client.node.to_be_bytes());
        t.extend_from_slice(&server.node.to_be_bytes());
        Transcript(t)
    }

    /// `HMAC(secret, label ‖ transcript)`, keyed and fed, not yet finalized.
    fn mac(&self, secret: &ClusterSecret, label: &[u8]) -> HmacSha256 {
        let mut mac = keyed(secret.bytes());
        mac.update(label);
        mac.update(&self.0);
        mac
    }

    fn proof(&self, secret: &ClusterSecret, label: &[u8]) -> [u8; TAG_LEN] {
        self.mac(secret, label).finalize().into_bytes().into()
    }

    /// Checks `proof` in constant time.
    fn check(&self, secret: &ClusterSecret, label: &[u8], proof: &[u8]) -> io::Result<()> {
        self.mac(secret, label).verify_slice(proof).map_err(|_| refused("a wrong proof"))
    }

    /// A direction's frame key: derived, so the secret itself never keys a frame.
    fn key(&self, secret: &ClusterSecret, label: &[u8]) -> blake3::Hasher {
        blake3::Hasher::new_keyed(&self.proof(secret, label))
    }
}

fn keyed(key: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length; this cannot fail.
    HmacSha256::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC accepts any key length"))
}

/// The first message of each side.
struct Hello {
    node: NodeId,
    nonce: [u8; NONCE_LEN],
}

impl Hello {
    fn fresh(node: NodeId) -> Self {
        let mut nonce = [0u8; NONCE_LEN];
        OsRng.fill_bytes(&mut nonce);
        Hello { node, nonce }
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HELLO_LEN);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.node.to_be_bytes());
        out.extend_from_slice(&self.nonce);
        out
    }

    fn decode(bytes: &[u8]) -> io::Result<Self> {
        if bytes.len() == HELLO_LEN && bytes[..MAGIC.len() - 1] == MAGIC[..MAGIC.len() - 1] {
            if bytes[MAGIC.len() - 1] != MAGIC[MAGIC.len() - 1] {
                // A node of another release (the link's version is the magic's last byte).
                return Err(refused(&format!(
                    "the peer speaks version {} of the cluster link, this node {}: every node \
                     must run a release with the same link version",
                    char::from(bytes[MAGIC.len() - 1]),
                    char::from(MAGIC[MAGIC.len() - 1])
                )));
            }
        } else {
            return Err(refused("not a cluster link hello"));
        }
        let (node, nonce) = bytes[MAGIC.len()..].split_at(8);
        let node = NodeId::from_be_bytes(node.try_into().map_err(|_| refused("a short hello"))?);
        let nonce = nonce.try_into().map_err(|_| refused("a short hello"))?;
        Ok(Hello { node, nonce })
    }
}

/// A refusal: the peer is not one of ours, or not speaking the protocol.
fn refused(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, format!("cluster link refused: {why}"))
}

impl<S: AsyncRead + AsyncWrite + Unpin> Channel<S> {
    /// The calling side's handshake on `stream`, as node `me`. With `expect`, the server must
    /// be that node (an address can come to belong to another node; talking Raft to the
    /// wrong one would be wrong).
    ///
    /// The caller bounds it in time.
    ///
    /// # Errors
    /// `PermissionDenied` when the server proves nothing, proves wrong, or is not `expect`;
    /// `UnexpectedEof` when it closes (as a server does on a wrong secret); I/O errors.
    pub async fn client(
        mut stream: S,
        me: NodeId,
        secret: &ClusterSecret,
        expect: Option<NodeId>,
    ) -> io::Result<Self> {
        let mine = Hello::fresh(me);
        frame::write(&mut stream, &[&mine.encode()]).await?;
        let theirs = Hello::decode(&frame::read(&mut stream, HANDSHAKE_FRAME_MAX).await?)?;
        if let Some(expect) = expect.filter(|&e| e != theirs.node) {
            return Err(refused(&format!("reached node {}, not node {expect}", theirs.node)));
        }
        let t = Transcript::new(&mine, &theirs);
        frame::write(&mut stream, &[&t.proof(secret, CLIENT_PROOF)]).await?;
        let proof = frame::read(&mut stream, HANDSHAKE_FRAME_MAX).await?;
        t.check(secret, SERVER_PROOF, &proof)?;
        Ok(Channel {
            stream,
            peer: theirs.node,
            send_key: t.key(secret, CLIENT_TO_SERVER),
            recv_key: t.key(secret, SERVER_TO_CLIENT),
            send_seq: 0,
            recv_seq: 0,
        })
    }

    /// The listening side's handshake on `stream`, as node `me`. The caller bounds it in
    /// time and logs a refusal.
    ///
    /// # Errors
    /// `PermissionDenied` for a peer that is not speaking the protocol or proves wrong; I/O
    /// errors.
    pub(crate) async fn server(
        mut stream: S,
        me: NodeId,
        secret: &ClusterSecret,
    ) -> io::Result<Self> {
        let theirs = Hello::decode(&frame::read(&mut stream, HANDSHAKE_FRAME_MAX).await?)?;
        let mine = Hello::fresh(me);
        frame::write(&mut stream, &[&mine.encode()]).await?;
        let t = Transcript::new(&theirs, &mine);
        let proof = frame::read(&mut stream, HANDSHAKE_FRAME_MAX).await?;
        t.check(secret, CLIENT_PROOF, &proof)?;
        frame::write(&mut stream, &[&t.proof(secret, SERVER_PROOF)]).await?;
        Ok(Channel {
            stream,
            peer: theirs.node,
            send_key: t.key(secret, SERVER_TO_CLIENT),
            recv_key: t.key(secret, CLIENT_TO_SERVER),
            send_seq: 0,
            recv_seq: 0,
        })
    }

    /// The node at the other end, as its handshake proved.
    pub fn peer(&self) -> NodeId {
        self.peer
    }

    /// The frame `body` becomes next: its body and tag (without the length prefix). Counts it
    /// as sent: what [`Channel::send`] writes; public so a test can damage one.
    pub fn seal(&mut self, body: &[u8]) -> [u8; TAG_LEN] {
        let mut mac = self.send_key.clone();
        mac.update(body);
        mac.update(&self.send_seq.to_be_bytes());
        self.send_seq += 1;
        mac.finalize().into()
    }

    /// Sends `body` as the next frame.
    ///
    /// # Errors
    /// The stream's errors.
    pub async fn send(&mut self, body: &[u8]) -> io::Result<()> {
        let tag = self.seal(body);
        frame::write(&mut self.stream, &[body, &tag]).await
    }

    /// Receives the next frame's body, of at most `max` bytes, after checking its tag.
    ///
    /// # Errors
    /// `InvalidData` for a frame over the cap or too short to hold a tag; `PermissionDenied`
    /// for a tag that does not match (damaged, replayed, reordered, foreign): the connection
    /// must be closed then. The stream's errors.
    pub async fn recv(&mut self, max: usize) -> io::Result<Vec<u8>> {
        let mut body = frame::read(&mut self.stream, max.saturating_add(TAG_LEN)).await?;
        let Some(at) = body.len().checked_sub(TAG_LEN) else {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "a frame shorter than its tag"));
        };
        let tag = body.split_off(at);
        let mut mac = self.recv_key.clone();
        mac.update(&body);
        mac.update(&self.recv_seq.to_be_bytes());
        // blake3::Hash compares in constant time.
        let tag = <[u8; TAG_LEN]>::try_from(tag.as_slice())
            .map_err(|_| refused("a frame failed its tag"))?;
        if mac.finalize() != blake3::Hash::from_bytes(tag) {
            return Err(refused("a frame failed its tag"));
        }
        self.recv_seq += 1;
        Ok(body)
    }

    /// The stream underneath, to write raw bytes (a test's damaged frame).
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.stream
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(byte: u8) -> &'static ClusterSecret {
        Box::leak(Box::new(ClusterSecret::new(vec![byte; 32]).unwrap()))
    }

    #[tokio::test]
    async fn both_sides_agree_and_frames_flow_both_ways() {
        let (a, b) = tokio::io::duplex(1024);
        let (client, server) = tokio::join!(
            Channel::client(a, 1, secret(7), Some(2)),
            Channel::server(b, 2, secret(7))
        );
        let (mut client, mut server) = (client.unwrap(), server.unwrap());
        assert_eq!((client.peer(), server.peer()), (2, 1));
        client.send(b"ping").await.unwrap();
        assert_eq!(server.recv(16).await.unwrap(), b"ping");
        server.send(b"pong").await.unwrap();
        assert_eq!(client.recv(16).await.unwrap(), b"pong");
    }

    #[tokio::test]
    async fn a_wrong_secret_or_node_is_refused() {
        let (a, b) = tokio::io::duplex(1024);
        let (client, server) =
            tokio::join!(Channel::client(a, 1, secret(7), None), Channel::server(b, 2, secret(8)));
        assert_eq!(server.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        assert!(client.is_err());

        let (a, b) = tokio::io::duplex(1024);
        let (client, _server) = tokio::join!(
            Channel::client(a, 1, secret(7), Some(3)),
            Channel::server(b, 2, secret(7))
        );
        assert_eq!(client.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
    }

    #[test]
    fn a_hello_of_another_link_version_is_refused_naming_both() {
        let mut hello = Hello::fresh(3).encode();
        assert_eq!(Hello::decode(&hello).unwrap().node, 3);
        hello[MAGIC.len() - 1] = b'2';
        let Err(err) = Hello::decode(&hello) else { panic!("a hello of version 2 was taken") };
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert!(err.to_string().contains("version 2 of the cluster link, this node 3"), "{err}");
        hello[0] = b'X';
        let Err(err) = Hello::decode(&hello) else { panic!("a foreign hello was taken") };
        assert!(err.to_string().contains("not a cluster link hello"), "{err}");
    }

    #[tokio::test]
    async fn a_replayed_frame_fails_its_tag() {
        let (a, b) = tokio::io::duplex(1024);
        let (client, server) =
            tokio::join!(Channel::client(a, 1, secret(7), None), Channel::server(b, 2, secret(7)));
        let (mut client, mut server) = (client.unwrap(), server.unwrap());
        // The same bytes twice: the second is a replay, its sequence number has passed.
        let tag = client.seal(b"once");
        for _ in 0..2 {
            frame::write(client.get_mut(), &[b"once", &tag]).await.unwrap();
        }
        assert_eq!(server.recv(16).await.unwrap(), b"once");
        assert_eq!(server.recv(16).await.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
    }

    #[tokio::test]
    async fn a_frame_from_another_connection_fails_its_tag() {
        let pair = || async {
            let (a, b) = tokio::io::duplex(1024);
            let (client, server) = tokio::join!(
                Channel::client(a, 1, secret(7), None),
                Channel::server(b, 2, secret(7))
            );
            (client.unwrap(), server.unwrap())
        };
        let (mut first, _) = pair().await;
        let (mut second, mut server) = pair().await;
        // Sealed for the first connection, at the very sequence number the second expects.
        let tag = first.seal(b"moved");
        frame::write(second.get_mut(), &[b"moved", &tag]).await.unwrap();
        assert_eq!(server.recv(16).await.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
    }
}
