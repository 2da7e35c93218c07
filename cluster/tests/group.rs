//! A real 3-node Raft group over the cluster link on loopback: each node with its own data
//! dir and its own raft address (127.0.0.1, .2, .3), elections, replication, a leader stopped
//! for real, fail-over, and the stopped node's return.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use cluster::net::LinkConfig;
use cluster::{ClusterNode, NodeId, Record, DEFAULT_GROUP};
use common::{within, Node};
use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, RaftError};
use openraft::ServerState;

fn all(nodes: &[Node]) -> Vec<&Node> {
    nodes.iter().collect()
}

/// Waits until one of `nodes` is leader and every other one follows it; returns its position
/// in `nodes`.
async fn leader_of(nodes: &[&Node]) -> usize {
    within(20, "a leader elected and known to all", async {
        loop {
            let leaders: Vec<Option<NodeId>> =
                nodes.iter().map(|n| n.raft.metrics().borrow_watched().current_leader).collect();
            if let Some(Some(leader)) = leaders.first() {
                let agreed = leaders.iter().all(|l| *l == Some(*leader));
                let at = nodes.iter().position(|n| n.id == *leader);
                if let (true, Some(at)) = (agreed, at) {
                    if nodes[at].raft.metrics().borrow_watched().state == ServerState::Leader {
                        return at;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

/// Writes `payloads` through the leader of `nodes`, each acknowledged before the next;
/// returns the acknowledged (index, payload) pairs. A write refused because leadership moved
/// (certainly not appended) is sent again to the new leader; any other failure fails the test,
/// as its outcome would be unknown.
async fn write(nodes: &[&Node], payloads: impl IntoIterator<Item = String>) -> Vec<(u64, String)> {
    let mut acked = Vec::new();
    for payload in payloads {
        let record = Record::unplaced(DEFAULT_GROUP, payload.clone().into_bytes());
        loop {
            let leader = nodes[leader_of(nodes).await];
            match within(10, "a write", leader.raft.client_write(record.clone())).await {
                Ok(response) => {
                    assert_eq!(response.data.index, response.log_id.index);
                    acked.push((response.log_id.index, payload));
                    break;
                }
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => continue,
                Err(e) => panic!("write {payload}: {e}"),
            }
        }
    }
    acked
}

/// Waits until `node` has applied index `index`, then returns its applied records as
/// (index, payload).
async fn applied(node: &Node, index: u64) -> Vec<(u64, String)> {
    let wait = node.raft.wait(Some(Duration::from_secs(20)));
    wait.applied_index_at_least(Some(index), format!("node {} applies {index}", node.id))
        .await
        .unwrap();
    node.sm
        .state()
        .records
        .into_iter()
        .map(|(i, r)| {
            assert_eq!(r.group, DEFAULT_GROUP);
            (i, String::from_utf8(r.payload).unwrap())
        })
        .collect()
}

/// Every acknowledged write is in `records` exactly once, at the index it was acknowledged
/// with, and nothing else is there.
fn assert_exactly(records: &[(u64, String)], acked: &[(u64, String)]) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (_, payload) in records {
        *seen.entry(payload).or_default() += 1;
    }
    assert!(seen.values().all(|&n| n == 1), "a record applied twice: {seen:?}");
    assert_eq!(records, acked, "the applied records are the acknowledged ones, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_elect_replicate_fail_over_and_catch_up() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let id = i as NodeId + 1;
        let addr: SocketAddr = format!("127.0.0.{id}:0").parse().unwrap();
        nodes.push(Node::start(id, dir.path(), addr).await);
    }
    let members: BTreeMap<NodeId, ClusterNode> = nodes
        .iter()
        .map(|n| {
            let node = ClusterNode { raft_addr: n.addr.to_string(), api_addr: String::new() };
            (n.id, node)
        })
        .collect();
    within(10, "initialize", nodes[0].raft.initialize(members)).await.unwrap();

    // A leader, and replication to all three.
    let mut acked = write(&all(&nodes), (0..20).map(|i| format!("first {i}"))).await;
    let last = acked.last().unwrap().0;
    for node in &nodes {
        assert_exactly(&applied(node, last).await, &acked);
    }

    // The leader stops for real: its Raft, its listener and connections, its data dir.
    let at = leader_of(&all(&nodes)).await;
    let stopped = nodes.remove(at);
    let (stopped_id, stopped_dir, stopped_addr) = (stopped.id, stopped.dir.clone(), stopped.addr);
    stopped.stop().await;

    // A new leader among the two others takes writes.
    let at = leader_of(&all(&nodes)).await;
    assert_ne!(nodes[at].id, stopped_id);
    acked.extend(write(&all(&nodes), (0..20).map(|i| format!("second {i}"))).await);
    let last = acked.last().unwrap().0;
    for node in &nodes {
        assert_exactly(&applied(node, last).await, &acked);
    }

    // The stopped node comes back on its data dir and address, and catches up.
    let back = Node::start(stopped_id, &stopped_dir, stopped_addr).await;
    assert_exactly(&applied(&back, last).await, &acked);
    nodes.push(back);
    // It takes part again: a write after its return reaches all three.
    acked.extend(write(&all(&nodes), ["after the return".to_string()]).await);
    let last = acked.last().unwrap().0;
    for node in &nodes {
        assert_exactly(&applied(node, last).await, &acked);
    }

    for node in nodes {
        node.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_member_catches_up_by_a_snapshot_sent_over_the_link() {
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let first =
        lone_leader(LinkConfig::new(1, common::secret()), dirs[0].path(), "127.0.0.1:0").await;
    let mut acked = write(&[&first], (0..30).map(|i| format!("before the snapshot {i}"))).await;
    let last = acked.last().unwrap().0;

    // A snapshot at the last write, and the log purged through it: a new member can only be
    // caught up by the snapshot.
    snapshot_and_purge(&first, last).await;

    let second = Node::start(2, dirs[1].path(), "127.0.0.2:0".parse().unwrap()).await;
    let added = first.raft.add_learner(second.id, member(&second), true);
    within(20, "the learner caught up", added).await.unwrap();
    assert_exactly(&applied(&second, last).await, &acked);
    let installed = second.raft.metrics().borrow_watched().snapshot;
    assert!(installed.is_some_and(|s| s.index >= last), "caught up by the snapshot: {installed:?}");

    // And it follows the log after it.
    acked.extend(write(&[&first], ["after the snapshot".to_string()]).await);
    let last = acked.last().unwrap().0;
    assert_exactly(&applied(&second, last).await, &acked);

    second.stop().await;
    first.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_over_the_frame_cap_is_replicated_in_parts() {
    // 8 KiB frames; 60 records of 1 KiB of hex that zstd cannot squeeze below that together.
    let small = small_frames;
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let first = lone_leader(small(1), dirs[0].path(), "127.0.0.1:0").await;
    let mut noise = noise(0x2545_f491_4f6c_dd1d);
    let payloads: Vec<String> = (0..60).map(|i| format!("{i} {}", noise())).collect();
    let acked = write(&[&first], payloads).await;
    let last = acked.last().unwrap().0;

    // The learner's backlog goes out in appends of a few entries each, every one under 8 KiB.
    let second = Node::start_with(small(2), dirs[1].path(), "127.0.0.2:0".parse().unwrap()).await;
    let added = first.raft.add_learner(second.id, member(&second), true);
    within(20, "the learner caught up", added).await.unwrap();
    assert_exactly(&applied(&second, last).await, &acked);

    second.stop().await;
    first.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_over_the_frame_cap_is_sent_in_parts() {
    // 8 KiB frames; a snapshot of 40 records of 1 KiB of hex is several frames long.
    let small = small_frames;
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let first = lone_leader(small(1), dirs[0].path(), "127.0.0.1:0").await;
    let mut noise = noise(0x9e37_79b9_7f4a_7c15);
    let payloads: Vec<String> = (0..40).map(|i| format!("{i} {}", noise())).collect();
    let acked = write(&[&first], payloads).await;
    let last = acked.last().unwrap().0;
    snapshot_and_purge(&first, last).await;

    // The receiver gathers the parts in a file in its data dir, as a node does.
    let config = LinkConfig { spool_dir: Some(dirs[1].path().to_owned()), ..small(2) };
    let second = Node::start_with(config, dirs[1].path(), "127.0.0.2:0".parse().unwrap()).await;
    let added = first.raft.add_learner(second.id, member(&second), true);
    within(20, "the learner caught up", added).await.unwrap();
    assert_exactly(&applied(&second, last).await, &acked);
    let installed = second.raft.metrics().borrow_watched().snapshot;
    assert!(installed.is_some_and(|s| s.index >= last), "caught up by the snapshot: {installed:?}");

    second.stop().await;
    first.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_forwards_opens_no_more_connections_than_the_leader_takes_at_once() {
    use std::sync::Arc;

    use cluster::net::{ForwardTaker, Forwarded, ForwardedReply};

    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let leader = Node::start(1, dirs[0].path(), "127.0.0.1:0".parse().unwrap()).await;
    let follower = Node::start(2, dirs[1].path(), "127.0.0.2:0".parse().unwrap()).await;
    // Each forwarded request takes a while, so the burst's requests overlap: each needs a
    // connection of its own.
    let answer: ForwardTaker = Arc::new(|connection| {
        tokio::spawn(connection.serve(|request: Forwarded| async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            ForwardedReply { status: 200, headers: Vec::new(), body: request.body.into() }
        }));
    });
    leader.link.set_forward_taker(answer);
    let addr = leader.addr.to_string();
    let burst = (0..32u8).map(|n| {
        let request = Forwarded {
            from: 2,
            method: "GET".into(),
            path: "/".into(),
            headers: Vec::new(),
            body: vec![n],
        };
        follower.link.forward(1, &addr, DEFAULT_GROUP, request, Duration::from_secs(10))
    });
    let replies = within(30, "the burst", futures_util::future::join_all(burst)).await;
    for (n, reply) in replies.into_iter().enumerate() {
        let reply = reply.unwrap_or_else(|e| panic!("forward {n}: {e}"));
        assert_eq!((reply.status, &reply.body[..]), (200, &[n as u8][..]));
    }
    follower.stop().await;
    leader.stop().await;
}

/// How `node` is named in a membership.
fn member(node: &Node) -> ClusterNode {
    ClusterNode { raft_addr: node.addr.to_string(), api_addr: String::new() }
}

/// A link of node `id` whose frames are at most 8 KiB.
fn small_frames(id: NodeId) -> LinkConfig {
    let mut config = LinkConfig::new(id, common::secret());
    config.max_frame_bytes = 8 << 10;
    config
}

/// 1 KiB strings of hex from a xorshift generator seeded with `seed`: zstd cannot squeeze them.
fn noise(mut seed: u64) -> impl FnMut() -> String {
    move || {
        (0..1024)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                char::from_digit((seed % 16) as u32, 16).unwrap()
            })
            .collect::<String>()
    }
}

/// Starts node `config.node_id` on `dir` at `addr` as the one voter of a new group, leading.
async fn lone_leader(config: LinkConfig, dir: &std::path::Path, addr: &str) -> Node {
    let node = Node::start_with(config, dir, addr.parse().unwrap()).await;
    let me = BTreeMap::from([(node.id, member(&node))]);
    within(10, "initialize", node.raft.initialize(me)).await.unwrap();
    leader_of(&[&node]).await;
    node
}

/// Has `node` build a snapshot at `last` or later and purge its log through `last`: a member
/// added then can only be caught up by the snapshot.
async fn snapshot_and_purge(node: &Node, last: u64) {
    node.raft.trigger().snapshot().await.unwrap();
    let wait = node.raft.wait(Some(Duration::from_secs(10)));
    wait.metrics(|m| m.snapshot.is_some_and(|s| s.index >= last), "snapshot").await.unwrap();
    node.raft.trigger().purge_log(last).await.unwrap();
    let wait = node.raft.wait(Some(Duration::from_secs(10)));
    wait.metrics(|m| m.purged.is_some_and(|p| p.index >= last), "purge").await.unwrap();
}
