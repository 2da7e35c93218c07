//! The cluster link's handshake and frames against a real listener on loopback: wrong secrets,
//! damaged frames, garbage, huge length prefixes and floods are refused, and a correct peer is
//! still answered afterwards.

mod common;

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use cluster::net::{Channel, ClusterSecret, LinkConfig, Request, Rpc};
use cluster::{TypeConfig, Vote, DEFAULT_GROUP};
use common::{secret, within, Node};
use openraft::raft::{VoteRequest, VoteResponse};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The id the test's node runs as; the test's peer claims another.
const NODE: u64 = 1;
const PEER: u64 = 9;

/// A single, uninitialized node: enough to answer votes. Handshakes time out quickly.
async fn node() -> (TempDir, Node) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = LinkConfig::new(NODE, secret());
    config.handshake_timeout = Duration::from_millis(500);
    config.max_handshakes = 4;
    let node = Node::start_with(config, dir.path(), "127.0.0.1:0".parse().unwrap()).await;
    (dir, node)
}

fn vote_request() -> Vec<u8> {
    let rpc = Rpc::Vote(VoteRequest::new(Vote::new(1, PEER), None));
    wal::codec::encode(&Request { group: DEFAULT_GROUP, rpc }).unwrap()
}

async fn connect(addr: SocketAddr, secret: &ClusterSecret) -> io::Result<Channel<TcpStream>> {
    let stream = TcpStream::connect(addr).await?;
    Channel::client(stream, PEER, secret, Some(NODE)).await
}

/// A correct peer connects, asks for a vote, and gets an answer.
async fn answered(addr: SocketAddr) {
    let mut channel = within(5, "a correct handshake", connect(addr, &secret())).await.unwrap();
    channel.send(&vote_request()).await.unwrap();
    let reply = within(5, "a vote's reply", channel.recv(1 << 20)).await.unwrap();
    let reply: Result<VoteResponse<TypeConfig>, String> = wal::codec::decode(&reply).unwrap();
    reply.expect("the node answers the vote");
}

/// The node closes `stream` (end of stream or a reset), within a bound.
async fn closed_by_the_node(stream: &mut TcpStream) {
    let mut buf = [0u8; 256];
    let read = within(5, "the node closes the connection", async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {} // the node's hello, for a well-formed one
            }
        }
    });
    read.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_is_refused_and_the_right_one_accepted() {
    let (_dir, node) = node().await;
    let wrong =
        ClusterSecret::new(b"another cluster's secret, also 32 bytes long".to_vec()).unwrap();
    let refused = within(5, "a wrong handshake", connect(node.addr, &wrong)).await;
    let e = refused.expect_err("a wrong secret is refused");
    // The node closed on the client's proof; it never proved anything to it.
    assert!(
        matches!(e.kind(), io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset),
        "{e}"
    );
    // Expecting another node than the one reached is refused by the client itself.
    let stream = TcpStream::connect(node.addr).await.unwrap();
    let other = Channel::client(stream, PEER, &secret(), Some(NODE + 1)).await;
    assert_eq!(other.unwrap_err().kind(), io::ErrorKind::PermissionDenied);

    answered(node.addr).await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_frame_closes_the_connection() {
    let (_dir, node) = node().await;
    let mut channel = connect(node.addr, &secret()).await.unwrap();
    let mut body = vote_request();
    let tag = channel.seal(&mut body);
    let mut frame = ((body.len() + tag.len()) as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    frame.extend_from_slice(&tag);
    // One bit of the body flipped: its tag no longer matches.
    frame[4 + body.len() / 2] ^= 0x01;
    channel.get_mut().write_all(&frame).await.unwrap();
    let reply = within(5, "the node's answer to a damaged frame", channel.recv(1 << 20)).await;
    assert!(reply.is_err(), "a damaged frame gets no reply, only a closed connection");

    // The same with a frame whose tag is damaged, on another connection.
    let mut channel = connect(node.addr, &secret()).await.unwrap();
    let mut body = vote_request();
    let mut tag = channel.seal(&mut body);
    tag[0] ^= 0x80;
    let mut frame = ((body.len() + tag.len()) as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    frame.extend_from_slice(&tag);
    channel.get_mut().write_all(&frame).await.unwrap();
    assert!(within(5, "a damaged tag", channel.recv(1 << 20)).await.is_err());

    answered(node.addr).await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_truncated_frames_and_huge_prefixes_leave_the_listener_unharmed() {
    let (_dir, node) = node().await;

    // Bytes that are no protocol at all (an HTTP request).
    let mut stream = TcpStream::connect(node.addr).await.unwrap();
    stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    closed_by_the_node(&mut stream).await;

    // A length prefix of 4 GiB: refused before a byte of it is read or allocated.
    let mut stream = TcpStream::connect(node.addr).await.unwrap();
    stream.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    closed_by_the_node(&mut stream).await;

    // A prefix just over the handshake's cap.
    let mut stream = TcpStream::connect(node.addr).await.unwrap();
    let over = (cluster::net::HANDSHAKE_FRAME_MAX as u32 + 1).to_be_bytes();
    stream.write_all(&over).await.unwrap();
    closed_by_the_node(&mut stream).await;

    // A truncated frame: the prefix says 48 bytes, 10 come, then the peer stops writing.
    let mut stream = TcpStream::connect(node.addr).await.unwrap();
    stream.write_all(&48u32.to_be_bytes()).await.unwrap();
    stream.write_all(&[0u8; 10]).await.unwrap();
    stream.shutdown().await.unwrap();
    closed_by_the_node(&mut stream).await;

    // The same frame, the peer silent and the connection left open: the handshake timeout
    // closes it.
    let mut stream = TcpStream::connect(node.addr).await.unwrap();
    stream.write_all(&48u32.to_be_bytes()).await.unwrap();
    stream.write_all(&[0u8; 10]).await.unwrap();
    closed_by_the_node(&mut stream).await;

    // A right-sized hello with the wrong magic.
    let mut stream = TcpStream::connect(node.addr).await.unwrap();
    let mut hello = 48u32.to_be_bytes().to_vec();
    hello.extend_from_slice(&[0x5a; 48]);
    stream.write_all(&hello).await.unwrap();
    closed_by_the_node(&mut stream).await;

    // After an authenticated handshake, a huge prefix closes the connection as well.
    let mut channel = connect(node.addr, &secret()).await.unwrap();
    channel.get_mut().write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    assert!(within(5, "a huge frame", channel.recv(1 << 20)).await.is_err());

    answered(node.addr).await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_silent_connections_does_not_lock_out_a_peer() {
    let (_dir, node) = node().await;
    // Many more than the node's 4 handshake slots, all silent.
    let mut flood = Vec::new();
    for _ in 0..64 {
        flood.push(TcpStream::connect(node.addr).await.unwrap());
    }
    // A correct peer, retrying as openraft does, gets through once the silent ones have been
    // refused (over the cap) or timed out (within it).
    within(10, "a correct peer through the flood", async {
        loop {
            if let Ok(mut channel) = connect(node.addr, &secret()).await {
                channel.send(&vote_request()).await.unwrap();
                if channel.recv(1 << 20).await.is_ok() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    drop(flood);
    answered(node.addr).await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outgoing_connections_leave_from_the_raft_host() {
    use cluster::ClusterNode;
    use openraft::error::RPCError;
    use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};

    // A node on 127.0.0.4 calls a listener on 127.0.0.5 that speaks no protocol.
    let caller = cluster::net::ClusterLink::bind("127.0.0.4:0", LinkConfig::new(4, secret()))
        .expect("127.0.0.4 is a loopback address on Linux");
    let listener = tokio::net::TcpListener::bind("127.0.0.5:0").await.unwrap();
    let target = ClusterNode {
        raft_addr: listener.local_addr().unwrap().to_string(),
        api_addr: String::new(),
    };
    let mut client = caller.network(DEFAULT_GROUP).new_client(5, &target).await;
    let call = tokio::spawn(async move {
        let rpc = VoteRequest::new(Vote::new(1, 4), None);
        client.vote(rpc, RPCOption::new(Duration::from_secs(2))).await
    });
    let (mut stream, from) = within(5, "the caller connects", listener.accept()).await.unwrap();
    assert_eq!(from.ip().to_string(), "127.0.0.4", "bound to its raft host, not the default");
    // The caller's hello arrives; no answer comes, the connection closes: the call fails as
    // unreachable, not as anything a node said.
    let mut hello = [0u8; 4];
    stream.read_exact(&mut hello).await.unwrap();
    drop(stream);
    let failed = within(5, "the call fails", call).await.unwrap();
    assert!(matches!(failed, Err(RPCError::Unreachable(_))), "{failed:?}");
    caller.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_tells_its_own_api_address_and_learns_the_nodes_but_no_other() {
    use cluster::net::Announce;

    let dir = tempfile::tempdir().unwrap();
    let config =
        LinkConfig { api_addr: "127.0.0.1:8080".into(), ..LinkConfig::new(NODE, secret()) };
    let node = Node::start_with(config, dir.path(), "127.0.0.1:0".parse().unwrap()).await;
    let mut channel = within(5, "a handshake", connect(node.addr, &secret())).await.unwrap();
    let mut tell = async |from: u64, api_addr: &str| -> Result<String, String> {
        let rpc = Rpc::Announce(Announce { node: from, api_addr: api_addr.into() });
        let bytes = wal::codec::encode(&Request { group: DEFAULT_GROUP, rpc }).unwrap();
        channel.send(&bytes).await.unwrap();
        let reply = within(5, "an answer", channel.recv(1 << 20)).await.unwrap();
        wal::codec::decode(&reply).unwrap()
    };
    // Another node's address is refused, and not kept.
    let refused = tell(PEER + 1, "127.0.0.66:8080").await;
    assert!(refused.unwrap_err().contains("cannot tell"));
    assert_eq!(node.link.told_api_addr(PEER + 1), None);
    // Its own is kept, and answered with the node's.
    assert_eq!(tell(PEER, "127.0.0.9:8080").await, Ok("127.0.0.1:8080".to_owned()));
    assert_eq!(node.link.told_api_addr(PEER).as_deref(), Some("127.0.0.9:8080"));
    node.stop().await;
}

/// A connection whose first request is a forwarded one leaves the link's runtime for the
/// taker's thread, with its keys and sequence numbers: its later requests are answered there,
/// its peer's address is still taken on it, Raft on it closes it, and so does the link's stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarding_connection_is_served_on_the_takers_thread_until_the_link_stops() {
    use std::sync::Arc;

    use cluster::net::{Announce, ForwardTaker, Forwarded, ForwardedConnection, ForwardedReply};

    let dir = tempfile::tempdir().unwrap();
    let config =
        LinkConfig { api_addr: "127.0.0.1:8080".into(), ..LinkConfig::new(NODE, secret()) };
    let node = Node::start_with(config, dir.path(), "127.0.0.1:0".parse().unwrap()).await;

    // The taker's thread runs a runtime of its own, as an actix thread does; every answer
    // names the thread that made it.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<ForwardedConnection>();
    let taker_thread = std::thread::Builder::new()
        .name("taker".into())
        .spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let local = tokio::task::LocalSet::new();
            local.block_on(&runtime, async move {
                // Ends when the link, which holds the taker, is dropped.
                while let Some(connection) = rx.recv().await {
                    assert_eq!(connection.node(), PEER);
                    tokio::task::spawn_local(connection.serve(|request: Forwarded| async move {
                        let thread = std::thread::current().name().unwrap_or("").to_owned();
                        ForwardedReply {
                            status: 200,
                            headers: vec![("thread".into(), thread.into_bytes())],
                            body: request.body.into(),
                        }
                    }));
                }
            });
        })
        .unwrap();
    let taker: ForwardTaker = Arc::new(move |connection| tx.send(connection).unwrap());
    node.link.set_forward_taker(taker);

    let forward = |body: &[u8]| {
        let request = Forwarded {
            from: PEER,
            method: "GET".into(),
            path: "/".into(),
            headers: Vec::new(),
            body: body.to_vec(),
        };
        wal::codec::encode(&Request { group: DEFAULT_GROUP, rpc: Rpc::Forward(request) }).unwrap()
    };
    async fn answer<T: serde::de::DeserializeOwned>(channel: &mut Channel<TcpStream>) -> T {
        let reply = within(5, "an answer", channel.recv(1 << 20)).await.unwrap();
        wal::codec::decode(&reply).unwrap()
    }

    let mut channel = within(5, "a handshake", connect(node.addr, &secret())).await.unwrap();
    for n in 0..3u8 {
        channel.send(&forward(&[n; 40_000])).await.unwrap();
        let reply: Result<ForwardedReply, String> = answer(&mut channel).await;
        let reply = reply.unwrap();
        assert_eq!(reply.headers, vec![("thread".to_owned(), b"taker".to_vec())]);
        assert_eq!(&reply.body[..], &[n; 40_000][..]);
    }
    let rpc = Rpc::Announce(Announce { node: PEER, api_addr: "127.0.0.9:8080".into() });
    channel
        .send(&wal::codec::encode(&Request { group: DEFAULT_GROUP, rpc }).unwrap())
        .await
        .unwrap();
    let told: Result<String, String> = answer(&mut channel).await;
    assert_eq!(told, Ok("127.0.0.1:8080".to_owned()));
    assert_eq!(node.link.told_api_addr(PEER).as_deref(), Some("127.0.0.9:8080"));
    // Raft belongs on connections of its own: this one is closed.
    channel.send(&vote_request()).await.unwrap();
    let closed = within(5, "the node closes it", channel.recv(1 << 20)).await;
    assert!(closed.is_err(), "Raft on a forwarding connection is refused");

    // The link's stop closes a connection served on another thread.
    let mut channel = within(5, "a handshake", connect(node.addr, &secret())).await.unwrap();
    channel.send(&forward(b"once")).await.unwrap();
    let reply: Result<ForwardedReply, String> = answer(&mut channel).await;
    assert_eq!(&reply.unwrap().body[..], b"once");
    node.link.shutdown();
    let closed = within(5, "the stop closes it", channel.recv(1 << 20)).await;
    assert!(closed.is_err(), "a handed-over connection outlived its link");
    node.stop().await;
    taker_thread.join().unwrap();
}
