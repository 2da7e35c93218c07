//! The leader's proposer on a real 3-node group over the cluster link (127.0.0.1, .2, .3):
//! indexes given before the append, in order, and where every node applies them; a new
//! leader's lease after a real stop; a wrong guess skipped on every node alike.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster::{
    ClusterNode, NodeId, ProposeError, Proposer, Record, RecordsStateMachine, DEFAULT_GROUP,
};
use common::{within, Node};
use openraft::async_runtime::WatchReceiver;

type Prop = Proposer<RecordsStateMachine>;

async fn start_three(dirs: &[tempfile::TempDir]) -> (Vec<Node>, Vec<Prop>) {
    let mut nodes = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let id = i as NodeId + 1;
        let addr: SocketAddr = format!("127.0.0.{id}:0").parse().unwrap();
        nodes.push(Node::start(id, dir.path(), addr).await);
    }
    let members: BTreeMap<NodeId, ClusterNode> = nodes
        .iter()
        .map(|n| (n.id, ClusterNode { raft_addr: n.addr.to_string(), api_addr: String::new() }))
        .collect();
    within(10, "initialize", nodes[0].raft.initialize(members)).await.unwrap();
    let proposers = nodes.iter().map(proposer_of).collect();
    (nodes, proposers)
}

fn proposer_of(node: &Node) -> Prop {
    Proposer::start(DEFAULT_GROUP, node.raft.clone(), node.link.runtime())
}

/// Waits until one of `proposers` takes proposals; returns its position.
async fn proposing(proposers: &[&Prop]) -> usize {
    within(20, "a proposing leader", async {
        loop {
            if let Some(at) = proposers.iter().position(|p| p.leadership().borrow().proposing) {
                return at;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// `node`'s applied records once it has applied `index`, as (index, payload).
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
            assert!(r.belongs_at(i), "a record applied away from its index: {i} {r:?}");
            (i, String::from_utf8(r.payload).unwrap())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexes_are_given_in_order_and_every_node_applies_each_record_at_its_own() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (nodes, proposers) = start_three(&dirs).await;
    let leader = proposing(&proposers.iter().collect::<Vec<_>>()).await;

    // Four writers at once; `at` sees the indexes in the order they are given.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (proposer, seen) = (proposers[leader].clone(), Arc::clone(&seen));
            tokio::spawn(async move {
                let mut acked = Vec::new();
                for i in 0..50 {
                    let payload = format!("w{w} {i}");
                    let proposal = proposer
                        .propose(payload.clone().into_bytes(), None, |index| {
                            seen.lock().unwrap().push(index)
                        })
                        .unwrap();
                    let index = proposal.index();
                    assert_eq!(proposal.await, Ok(index), "{payload} applied at its index");
                    acked.push((index, payload));
                }
                acked
            })
        })
        .collect();
    let mut acked = Vec::new();
    for w in writers {
        acked.extend(w.await.unwrap());
    }
    acked.sort();
    let seen = seen.lock().unwrap().clone();
    let first = seen[0];
    assert_eq!(seen, (first..first + 200).collect::<Vec<_>>(), "one index each, in order");

    let last = acked.last().unwrap().0;
    for node in &nodes {
        assert_eq!(applied(node, last).await, acked, "node {} applied exactly these", node.id);
    }
    for node in nodes {
        node.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_proposes_after_a_real_stop_and_the_old_epoch_is_refused() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (mut nodes, mut proposers) = start_three(&dirs).await;
    let at = proposing(&proposers.iter().collect::<Vec<_>>()).await;
    let mut acked = Vec::new();
    for i in 0..10 {
        let payload = format!("first {i}");
        let proposal = proposers[at].propose(payload.clone().into_bytes(), None, |_| {}).unwrap();
        acked.push((proposal.await.unwrap(), payload));
    }
    let old_epoch = proposers[at].epoch();

    // The leader stops for real; its proposer soon takes nothing more.
    let (stopped, old) = (nodes.remove(at), proposers.remove(at));
    stopped.stop().await;
    let mut leadership = old.leadership();
    within(5, "the stopped leader's lease ends", leadership.wait_for(|l| !l.proposing))
        .await
        .unwrap();
    let refused = old.propose(b"after the stop".to_vec(), None, |_| panic!("`at` ran"));
    assert!(matches!(refused, Err(ProposeError::NotLeader { .. })), "{refused:?}");

    // A new leader among the others proposes after everything acknowledged before.
    let at = proposing(&proposers.iter().collect::<Vec<_>>()).await;
    let epoch = proposers[at].epoch();
    for i in 0..10 {
        let payload = format!("second {i}");
        let proposal =
            proposers[at].propose(payload.clone().into_bytes(), Some(epoch), |_| {}).unwrap();
        assert!(proposal.index() > acked.last().unwrap().0);
        acked.push((proposal.await.unwrap(), payload));
    }
    // A writer holding another epoch (here the old leader's, which this node never had as
    // its own) is refused.
    if old_epoch != epoch {
        let stale = proposers[at].propose(b"stale".to_vec(), Some(old_epoch), |_| {});
        assert!(matches!(stale, Err(ProposeError::NotLeader { .. })), "{stale:?}");
    }
    let last = acked.last().unwrap().0;
    for node in &nodes {
        assert_eq!(applied(node, last).await, acked, "node {} applied exactly these", node.id);
    }
    for node in nodes {
        node.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_guess_is_skipped_on_every_node_and_a_new_lease_follows() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (nodes, proposers) = start_three(&dirs).await;
    let at = proposing(&proposers.iter().collect::<Vec<_>>()).await;
    let proposer = &proposers[at];
    let first = proposer.propose(b"first".to_vec(), None, |_| {}).unwrap().await.unwrap();
    let epoch = proposer.epoch();

    // An entry the proposer did not send lands where its next proposal was guessed to go.
    let outside = Record::unplaced(DEFAULT_GROUP, b"outside".to_vec());
    let landed = within(10, "a write past the proposer", nodes[at].raft.client_write(outside));
    assert_eq!(landed.await.unwrap().log_id.index, first + 1);
    let guessed = proposer.propose(b"guessed".to_vec(), Some(epoch), |_| {}).unwrap();
    assert_eq!(guessed.index(), first + 1, "the lease did not see the outside entry");
    assert_eq!(guessed.await, Err(ProposeError::NotApplied { index: first + 1 }));

    // The lease ends with it: the old epoch is refused, and a new lease takes proposals at the
    // right index again.
    let stale = proposer.propose(b"stale".to_vec(), Some(epoch), |_| panic!("`at` ran"));
    assert!(matches!(stale, Err(ProposeError::NotLeader { .. })), "{stale:?}");
    let after = within(10, "a proposal under a new lease", async {
        loop {
            if let Ok(proposal) = proposer.propose(b"after".to_vec(), None, |_| {}) {
                return proposal.await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(after, first + 3);
    assert!(proposer.epoch() > epoch);

    let expected = vec![
        (first, "first".to_string()),
        (first + 1, "outside".to_string()),
        (after, "after".to_string()),
    ];
    for node in &nodes {
        let records = applied(node, after).await;
        assert_eq!(records, expected, "node {} skipped the wrong guess", node.id);
        let payloads: HashSet<&str> = records.iter().map(|(_, p)| p.as_str()).collect();
        assert!(!payloads.contains("guessed"));
        let m = node.raft.metrics().borrow_watched().clone();
        assert!(m.last_applied.is_some_and(|l| l.index >= after));
    }
    for node in nodes {
        node.stop().await;
    }
}
