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
//! frame is `AES-256-GCM(key, nonce = seq, body)`: the body encrypted, then its 16-byte tag.
//! `seq` (8 bytes, big-endian, zero-padded to the 12-byte nonce) counts that direction's frames
//! from 0 and is never sent. A frame replayed, reordered, dropped or taken from another
//! connection (other nonces, so other keys) fails its tag, and the connection is closed. Each
//! key meets each nonce once: keys are per connection and direction, `seq` only rises.
//!
//! Why AES-GCM for the frames and HMAC-SHA256 for the handshake: the frames carry every
//! replicated entry and every forwarded page, tens of megabytes a second, so their protection
//! is the link's largest cost of its own. AES-GCM runs on the CPU's AES and carry-less
//! multiply instructions: on the development machine a 35 KB page took 3.8 µs to seal against
//! 5.8 µs for a BLAKE3 keyed tag (and SHA-256 had taken a sixth of a node's CPU), and it
//! encrypts as well, so a link without TLS no longer shows its rows to the network. The
//! handshake hashes a few dozen bytes once per connection.

use std::io;

use hmac::{Hmac, Mac};
use rand::rngs::OsRng;
use rand::RngCore;
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncWrite};

use super::frame::{self, HANDSHAKE_FRAME_MAX};
use super::ClusterSecret;
use crate::types::NodeId;

type HmacSha256 = Hmac<Sha256>;

/// The protocol's name and version, first in every hello: a peer speaking anything else is
/// refused before it costs more.
const MAGIC: &[u8; 8] = b"SHEETDR4";
const NONCE_LEN: usize = 32;
const HELLO_LEN: usize = MAGIC.len() + 8 + NONCE_LEN;
/// The length of an HMAC-SHA256 proof (and of the key each direction derives from one).
const PROOF_LEN: usize = 32;
/// The length of a frame's AES-GCM tag.
pub(crate) const TAG_LEN: usize = aead::MAX_TAG_LEN;

const CLIENT_PROOF: &[u8] = b"sheetd cluster link: client proof";
const SERVER_PROOF: &[u8] = b"sheetd cluster link: server proof";
const CLIENT_TO_SERVER: &[u8] = b"sheetd cluster link: client to server key";
const SERVER_TO_CLIENT: &[u8] = b"sheetd cluster link: server to client key";

/// An authenticated connection to a peer: frames out and in, each bound to this connection's
/// keys and its place in the stream.
pub struct Channel<S> {
    stream: S,
    peer: NodeId,
    send_key: LessSafeKey,
    recv_key: LessSafeKey,
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

    fn proof(&self, secret: &ClusterSecret, label: &[u8]) -> [u8; PROOF_LEN] {
        self.mac(secret, label).finalize().into_bytes().into()
    }

    /// Checks `proof` in constant time.
    fn check(&self, secret: &ClusterSecret, label: &[u8], proof: &[u8]) -> io::Result<()> {
        self.mac(secret, label).verify_slice(proof).map_err(|_| refused("a wrong proof"))
    }

    /// A direction's frame key: derived, so the secret itself never keys a frame.
    fn key(&self, secret: &ClusterSecret, label: &[u8]) -> LessSafeKey {
        let key = UnboundKey::new(&AES_256_GCM, &self.proof(secret, label))
            .unwrap_or_else(|_| unreachable!("an HMAC-SHA256 output is an AES-256 key"));
        LessSafeKey::new(key)
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

/// The nonce of a direction's frame `seq`: its sequence number, big-endian, after four zero
/// bytes. Unique for its key, which is the connection's and the direction's alone.
fn nonce(seq: u64) -> Nonce {
    let mut nonce = [0u8; aead::NONCE_LEN];
    nonce[aead::NONCE_LEN - 8..].copy_from_slice(&seq.to_be_bytes());
    Nonce::assume_unique_for_key(nonce)
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

    /// Seals `body` in place as the next frame (encrypts it) and returns its tag: the frame is
    /// the sealed body, then the tag (after the length prefix). Counts it as sent: what
    /// [`Channel::send_owned`] writes; public so a test can damage one.
    pub fn seal(&mut self, body: &mut [u8]) -> [u8; TAG_LEN] {
        let nonce = nonce(self.send_seq);
        self.send_seq += 1;
        let tag = self
            .send_key
            .seal_in_place_separate_tag(nonce, Aad::empty(), body)
            .unwrap_or_else(|_| unreachable!("a frame is far below AES-GCM's 64 GiB"));
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// Sends `body` as the next frame, sealing a copy of it: for a message the caller may
    /// send again on another connection (a Raft RPC).
    ///
    /// # Errors
    /// The stream's errors.
    pub async fn send(&mut self, body: &[u8]) -> io::Result<()> {
        self.send_owned(body.to_vec()).await
    }

    /// Sends `body` as the next frame, sealing it where it lies: a forwarded page is not
    /// copied again.
    ///
    /// # Errors
    /// The stream's errors.
    pub async fn send_owned(&mut self, mut body: Vec<u8>) -> io::Result<()> {
        let tag = self.seal(&mut body);
        frame::write(&mut self.stream, &[&body, &tag]).await
    }

    /// Receives the next frame's body, of at most `max` bytes, after checking its tag.
    ///
    /// # Errors
    /// `InvalidData` for a frame over the cap or too short to hold a tag; `PermissionDenied`
    /// for a tag that does not match (damaged, replayed, reordered, foreign): the connection
    /// must be closed then. The stream's errors.
    pub async fn recv(&mut self, max: usize) -> io::Result<Vec<u8>> {
        let mut body = frame::read(&mut self.stream, max.saturating_add(TAG_LEN)).await?;
        let Some(len) = body.len().checked_sub(TAG_LEN) else {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "a frame shorter than its tag"));
        };
        // ring compares the tag in constant time and leaves nothing decrypted on a mismatch
        // for the caller: the frame is dropped with the connection.
        self.recv_key
            .open_in_place(nonce(self.recv_seq), Aad::empty(), &mut body)
            .map_err(|_| refused("a frame failed its tag"))?;
        self.recv_seq += 1;
        body.truncate(len);
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
    async fn a_frame_travels_encrypted() {
        let (a, b) = tokio::io::duplex(1024);
        let (client, _server) =
            tokio::join!(Channel::client(a, 1, secret(7), None), Channel::server(b, 2, secret(7)));
        let mut client = client.unwrap();
        let plain = *b"a row's cells, in the clear";
        let mut sealed = plain;
        client.seal(&mut sealed);
        assert_ne!(sealed, plain);
        // The same body as the next frame seals differently: its nonce moved on.
        let mut again = plain;
        client.seal(&mut again);
        assert_ne!(again, sealed);
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
        assert!(err.to_string().contains("version 2 of the cluster link, this node 4"), "{err}");
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
        let mut sealed = *b"once";
        let tag = client.seal(&mut sealed);
        for _ in 0..2 {
            frame::write(client.get_mut(), &[&sealed, &tag]).await.unwrap();
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
        let mut sealed = *b"moved";
        let tag = first.seal(&mut sealed);
        frame::write(second.get_mut(), &[&sealed, &tag]).await.unwrap();
        assert_eq!(server.recv(16).await.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
    }
}
