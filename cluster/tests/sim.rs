//! A deterministic simulation of a group of three: the real log store (on the wal, in a data
//! dir), state machine and proposer, and openraft as a server configures it, over a simulated
//! network that delays, drops and cuts messages (one way or both), with nodes crashed and
//! restarted, and snapshots built with the log purged behind them (all but the last 20
//! entries, so a node further behind catches up by the snapshot): the cases real processes
//! reach only by luck, such as a message delayed past a new election or a cut in the middle
//! of a catch-up.
//!
//! Everything runs on one thread under tokio's paused clock, openraft draws its randomness
//! from the seed, and the store's blocking work (fsyncs, snapshots built and installed) runs
//! on that thread after 1 ms of simulated time (the `sim` feature): other tasks run meanwhile,
//! as beside a blocking thread, and no real time passes behind the simulated clock. Tasks woken at the same simulated instant may still run
//! in either order, so each network link draws its delays and losses from dice of its own: a
//! run's outcome (each leader and its term, each proposal's fate and index) is a function of
//! its seed. A failure prints the seed, and
//! `SIM_SEED=<n> cargo test -p cluster --features sim --test sim -- --nocapture` replays it,
//! printing each event; `replays_identically` runs seeds twice and compares their events.
//!
//! What must hold, for every seed: at most one leader per term; after healing, every node
//! applies the same records at the same indexes; every proposal acknowledged is there at its
//! index, every one refused before its index was given out or skipped where it landed is
//! nowhere, and none is applied twice.

#![cfg(feature = "sim")]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster::{
    raft_config, ClusterNode, Machine, NodeId, ProposeError, Proposer, SnapshotData, TypeConfig,
    Vote, WalLogStore, DEFAULT_GROUP, ELECTION_TIMEOUT_MS, HEARTBEAT_MS,
};
use openraft::async_runtime::WatchReceiver;
use openraft::errors::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::type_config::alias::SnapshotOf;
use openraft::{Raft, ServerState};

use common::Applied;

type Seeded = openraft::rt::deterministic_rng::DeterministicRng<openraft::impls::TokioRuntime>;
type SimRaft = Raft<TypeConfig, Machine<Applied>>;

const NODES: [NodeId; 3] = [1, 2, 3];
/// Steps of the faulty phase, each [`STEP`] of simulated time.
const STEPS: u32 = 200;
const STEP: Duration = Duration::from_millis(25);

/// A xorshift generator: the simulation's only source of chance besides openraft's (drawn
/// from the same seed).
struct Dice(u64);

impl Dice {
    fn new(seed: u64) -> Dice {
        Dice(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> Option<T> {
        (!from.is_empty()).then(|| from[self.below(from.len() as u64) as usize])
    }
}

/// The network: who is up, which directed links are cut, how often a message is lost.
struct World {
    seed: u64,
    /// Each directed link's own dice: a link's delays and losses depend on its own traffic
    /// only, not on which of two messages sent at the same instant went first.
    links: BTreeMap<(NodeId, NodeId), Dice>,
    up: BTreeMap<NodeId, SimRaft>,
    cut: BTreeSet<(NodeId, NodeId)>,
    loss_per_mille: u64,
}

impl World {
    fn link(&mut self, from: NodeId, to: NodeId) -> &mut Dice {
        let seed = self.seed ^ (from << 32) ^ (to << 16) ^ 0x5eed;
        self.links.entry((from, to)).or_insert_with(|| Dice::new(seed))
    }
}

type Shared = Arc<Mutex<World>>;

struct Net {
    world: Shared,
    from: NodeId,
}

impl RaftNetworkFactory<TypeConfig> for Net {
    type Network = Client;

    async fn new_client(&mut self, target: NodeId, _node: &ClusterNode) -> Client {
        Client { world: Arc::clone(&self.world), from: self.from, to: target }
    }
}

struct Client {
    world: Shared,
    from: NodeId,
    to: NodeId,
}

fn unreachable(why: &str) -> RPCError<TypeConfig> {
    RPCError::Unreachable(Unreachable::from_string(why.to_owned()))
}

impl Client {
    /// One RPC: a delay of 1–8 ms each way, lost or cut in either direction, answered by the
    /// target's Raft if it is up.
    async fn call<T, E: std::fmt::Display, Fut>(
        &self,
        rpc: impl FnOnce(SimRaft) -> Fut,
    ) -> Result<T, RPCError<TypeConfig>>
    where
        Fut: Future<Output = Result<T, E>>,
    {
        let (there, lost) = {
            let mut w = self.world.lock().unwrap();
            let loss = w.loss_per_mille;
            let dice = w.link(self.from, self.to);
            let lost = dice.below(1000) < loss;
            let d = Duration::from_millis(1 + dice.below(8));
            (d, lost)
        };
        tokio::time::sleep(there).await;
        let raft = {
            let w = self.world.lock().unwrap();
            let open = !lost && !w.cut.contains(&(self.from, self.to));
            open.then(|| w.up.get(&self.to).cloned()).flatten()
        };
        let Some(raft) = raft else { return Err(unreachable("lost, cut or down")) };
        let reply = rpc(raft).await.map_err(|e| unreachable(&e.to_string()))?;
        let back = {
            let mut w = self.world.lock().unwrap();
            let loss = w.loss_per_mille;
            let dice = w.link(self.to, self.from);
            let (lost, back) = (dice.below(1000) < loss, Duration::from_millis(1 + dice.below(8)));
            let open = !lost && !w.cut.contains(&(self.to, self.from));
            open.then_some(back)
        };
        let Some(back) = back else { return Err(unreachable("the reply was lost or cut")) };
        tokio::time::sleep(back).await;
        Ok(reply)
    }
}

impl RaftNetworkV2<TypeConfig> for Client {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(|raft| async move { raft.append_entries(rpc).await }).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(|raft| async move { raft.vote(rpc).await }).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(|raft| async move { raft.pre_vote(rpc).await }).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: SnapshotOf<TypeConfig, SnapshotData>,
        _cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let installed =
            self.call(|raft| async move { raft.install_full_snapshot(vote, snapshot).await });
        Ok(installed.await?)
    }

    async fn transfer_leader(
        &mut self,
        rpc: TransferLeaderRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(|raft| async move { raft.handle_transfer_leader(rpc).await }).await
    }
}

/// A running member.
struct Live {
    raft: SimRaft,
    proposer: Proposer<Machine<Applied>>,
    machine: Machine<Applied>,
    store: WalLogStore,
}

/// What became of a proposal.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fate {
    /// Applied at this index (the proposer's acknowledgement).
    Acked(u64),
    /// Refused before it was given an index, or skipped where it landed: never applied.
    NotApplied,
    /// The proposer could not tell.
    Unknown,
}

struct Sim {
    seed: u64,
    dice: Dice,
    world: Shared,
    dirs: BTreeMap<NodeId, PathBuf>,
    live: BTreeMap<NodeId, Live>,
    fates: Arc<Mutex<BTreeMap<String, Fate>>>,
    /// The leader seen in each term.
    leaders: BTreeMap<u64, NodeId>,
    /// What happened, in order, with the simulated time: two runs of a seed must agree.
    events: Vec<String>,
    started: tokio::time::Instant,
    /// Snapshots the nodes installed from a leader (counted before each crash, and at the end).
    installed: u64,
}

fn members() -> BTreeMap<NodeId, ClusterNode> {
    let node = |id| ClusterNode { raft_addr: format!("sim-{id}"), api_addr: String::new() };
    NODES.iter().map(|&id| (id, node(id))).collect()
}

/// The `n`th proposal's payload, sent to node `id`. One in five is read back by position ever
/// after, as a change feed reads the records it retains: every snapshot retains it (`Applied`),
/// and every purge must keep it.
fn payload(id: NodeId, n: u32) -> String {
    if n.is_multiple_of(5) {
        format!("keep w{n}@{id}")
    } else {
        format!("w{n}@{id}")
    }
}

/// Opens a data dir's log, once a crashed node's store (dropped with its Raft) let go of it.
fn open_store(dir: &Path) -> WalLogStore {
    let mut config = wal::Config::default_for(dir);
    config.min_free_bytes = Some(0);
    config.cache_capacity_bytes = 1 << 20;
    for _ in 0..500 {
        match WalLogStore::open_with(config.clone()) {
            Err(cluster::Error::Wal(wal::Error::InUse { .. })) => {
                // Real time, not the simulation's: the old store's threads are ending.
                std::thread::sleep(Duration::from_millis(2));
            }
            opened => return opened.unwrap(),
        }
    }
    panic!("the data dir {} is still in use", dir.display());
}

impl Sim {
    fn new(seed: u64, root: &Path) -> Sim {
        let dirs = NODES
            .iter()
            .map(|&id| {
                let dir = root.join(format!("node{id}"));
                std::fs::create_dir_all(&dir).unwrap();
                (id, dir)
            })
            .collect();
        let world = World {
            seed,
            links: BTreeMap::new(),
            up: BTreeMap::new(),
            cut: BTreeSet::new(),
            loss_per_mille: 0,
        };
        Sim {
            seed,
            dice: Dice::new(seed),
            world: Arc::new(Mutex::new(world)),
            dirs,
            live: BTreeMap::new(),
            fates: Arc::default(),
            leaders: BTreeMap::new(),
            events: Vec::new(),
            started: tokio::time::Instant::now(),
            installed: 0,
        }
    }

    fn note(&mut self, event: String) {
        let at = self.started.elapsed().as_millis();
        let event = format!("{at:>6} ms {event}");
        if std::env::var("SIM_SEED").is_ok() {
            // Replaying one seed: as it happens, so a failure shows what led to it.
            println!("{event}");
        }
        self.events.push(event);
    }

    async fn start(&mut self, id: NodeId) {
        let dir = &self.dirs[&id];
        let store = open_store(dir);
        let machine = Machine::open(dir, Applied::default(), store.clone()).unwrap();
        let config = raft_config(HEARTBEAT_MS, ELECTION_TIMEOUT_MS, 20).unwrap();
        let net = Net { world: Arc::clone(&self.world), from: id };
        let raft = Raft::new(id, config, net, store.clone(), machine.clone()).await.unwrap();
        let proposer =
            Proposer::start(DEFAULT_GROUP, raft.clone(), &tokio::runtime::Handle::current());
        self.world.lock().unwrap().up.insert(id, raft.clone());
        self.live.insert(id, Live { raft, proposer, machine, store });
        self.note(format!("node {id} up"));
    }

    /// Stops node `id` as a crash does: no stop of its store, nothing written beyond what its
    /// fsyncs made durable (the committed log id it kept only in memory is lost).
    async fn crash(&mut self, id: NodeId) {
        self.world.lock().unwrap().up.remove(&id);
        if let Some(live) = self.live.remove(&id) {
            self.installed += live.machine.counts().installed;
            live.raft.shutdown().await.unwrap();
        }
        self.note(format!("node {id} crashed"));
    }

    fn set_cut(&mut self, cut: BTreeSet<(NodeId, NodeId)>) {
        self.note(format!("cut {cut:?}"));
        self.world.lock().unwrap().cut = cut;
    }

    /// One proposal to node `id`; its fate is noted when it is known.
    fn propose(&mut self, id: NodeId, n: u32) {
        let Some(live) = self.live.get(&id) else { return };
        let payload = payload(id, n);
        match live.proposer.propose(payload.clone().into_bytes(), None, |_| {}) {
            Err(ProposeError::NotLeader { .. }) => {
                self.fates.lock().unwrap().insert(payload, Fate::NotApplied);
            }
            Err(e) => panic!("seed {}: a refusal that is not NotLeader: {e}", self.seed),
            Ok(proposal) => {
                let fates = Arc::clone(&self.fates);
                let index = proposal.index();
                fates.lock().unwrap().insert(payload.clone(), Fate::Unknown);
                tokio::spawn(async move {
                    let fate = match proposal.await {
                        Ok(at) => {
                            assert_eq!(at, index, "acknowledged at the index it was given");
                            Fate::Acked(at)
                        }
                        Err(ProposeError::NotApplied { .. } | ProposeError::NotLeader { .. }) => {
                            Fate::NotApplied
                        }
                        Err(ProposeError::Unknown { .. }) => Fate::Unknown,
                    };
                    fates.lock().unwrap().insert(payload, fate);
                });
            }
        }
    }

    /// Notes each node that leads now: never two in one term.
    fn watch_leaders(&mut self) {
        let mut seen = Vec::new();
        for (&id, live) in &self.live {
            let m = live.raft.metrics().borrow_watched().clone();
            if m.state == ServerState::Leader {
                seen.push((m.current_term, id));
            }
        }
        for (term, id) in seen {
            match self.leaders.insert(term, id) {
                Some(other) if other != id => {
                    panic!("seed {}: nodes {other} and {id} both led term {term}", self.seed)
                }
                Some(_) => {}
                None => self.note(format!("node {id} leads term {term}")),
            }
        }
    }

    /// The faulty phase: writes all along, and now and then a cut, a heal, a crash, a restart,
    /// a snapshot with the log purged behind it, a lossy spell.
    async fn faults(&mut self) {
        let mut n = 0;
        for _ in 0..STEPS {
            let up: Vec<NodeId> = self.live.keys().copied().collect();
            let down: Vec<NodeId> = NODES.iter().copied().filter(|id| !up.contains(id)).collect();
            match self.dice.below(100) {
                0..=2 => {
                    // One node cut off from the others, both ways.
                    let alone = self.dice.pick(&NODES).unwrap();
                    let cut = NODES
                        .iter()
                        .filter(|&&o| o != alone)
                        .flat_map(|&o| [(alone, o), (o, alone)])
                        .collect();
                    self.set_cut(cut);
                }
                3 => {
                    // One direction only: a node that hears but is not heard.
                    let (a, b) = (self.dice.pick(&NODES).unwrap(), self.dice.pick(&NODES).unwrap());
                    if a != b {
                        self.set_cut(BTreeSet::from([(a, b)]));
                    }
                }
                4..=6 => self.set_cut(BTreeSet::new()),
                7..=8 => {
                    if let Some(id) = self.dice.pick(&up) {
                        self.crash(id).await;
                    }
                }
                9..=12 => {
                    if let Some(id) = self.dice.pick(&down) {
                        self.start(id).await;
                    }
                }
                13..=14 => {
                    if let Some(id) = self.dice.pick(&up) {
                        // As a node asks for one (`GroupNode::request_snapshot`); openraft
                        // then purges the log behind it but for the last 20 entries, so a
                        // node further behind catches up by the snapshot.
                        let raft = self.live[&id].raft.clone();
                        let _ = raft.trigger().snapshot().await;
                        self.note(format!("node {id} snapshots"));
                    }
                }
                15 => {
                    let loss = [0, 50, 200][self.dice.below(3) as usize];
                    self.world.lock().unwrap().loss_per_mille = loss;
                    self.note(format!("loss {loss}/1000"));
                }
                _ => {}
            }
            // Mostly to the node that led last, as a client that follows redirects does; now
            // and then to any node (a stale leader, a follower: refused, never applied).
            let last_leader = self.leaders.last_key_value().map(|(_, &id)| id);
            for _ in 0..3 {
                let id = match last_leader {
                    Some(id) if self.dice.below(4) > 0 => id,
                    _ => self.dice.pick(&NODES).unwrap(),
                };
                n += 1;
                self.propose(id, n);
            }
            tokio::time::sleep(STEP).await;
            self.watch_leaders();
        }
    }

    /// Heals everything, restarts every node, and waits until a leader has committed a write
    /// of its term and every node applied through it with no proposal's fate still pending
    /// on an answer.
    async fn heal(&mut self) -> u64 {
        self.set_cut(BTreeSet::new());
        self.world.lock().unwrap().loss_per_mille = 0;
        for id in NODES {
            if !self.live.contains_key(&id) {
                self.start(id).await;
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut n = 1_000_000;
        loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "seed {}: no convergence within 60 s after healing",
                self.seed
            );
            self.watch_leaders();
            let leader = self.live.iter().find_map(|(&id, l)| {
                let m = l.raft.metrics().borrow_watched().clone();
                (m.state == ServerState::Leader).then_some(id)
            });
            if let Some(leader) = leader {
                n += 1;
                self.propose(leader, n);
                let last = payload(leader, n);
                tokio::time::sleep(Duration::from_millis(200)).await;
                let fate = self.fates.lock().unwrap().get(&last).cloned();
                if let Some(Fate::Acked(index)) = fate {
                    let all_applied = self.live.values().all(|l| {
                        l.raft
                            .metrics()
                            .borrow_watched()
                            .last_applied
                            .is_some_and(|a| a.index >= index)
                    });
                    if all_applied {
                        self.note(format!("converged at {index}"));
                        return index;
                    }
                }
            } else {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// Checks the records every node applied against the proposals' fates.
    fn check(&mut self, through: u64) {
        let seed = self.seed;
        let applied: BTreeMap<NodeId, Vec<(u64, Vec<u8>)>> = self
            .live
            .iter()
            .map(|(&id, l)| {
                let records = l.machine.with_domain(|d, _| d.0.clone());
                (id, records.into_iter().filter(|(i, _)| *i <= through).collect())
            })
            .collect();
        let first = &applied[&NODES[0]];
        for (id, records) in &applied {
            assert_eq!(records, first, "seed {seed}: node {id} applied other records than node 1");
            // Each node's own log still holds every record its snapshots retain.
            let store = &self.live[id].store;
            for (index, payload) in records.iter().filter(|(_, p)| p.starts_with(b"keep")) {
                let held = store.read_record(*index).unwrap().map(|r| r.payload);
                assert_eq!(
                    held.as_ref(),
                    Some(payload),
                    "seed {seed}: node {id}'s log lost retained record {index}"
                );
            }
        }
        let mut at = BTreeMap::new();
        for (index, payload) in first {
            let payload = String::from_utf8(payload.clone()).unwrap();
            assert!(at.insert(payload.clone(), *index).is_none(), "seed {seed}: {payload} twice");
        }
        assert!(first.windows(2).all(|w| w[0].0 < w[1].0), "seed {seed}: indexes out of order");
        let fates = self.fates.lock().unwrap().clone();
        let mut acked = 0;
        for (payload, fate) in &fates {
            match fate {
                Fate::Acked(index) => {
                    acked += 1;
                    assert_eq!(
                        at.get(payload),
                        Some(index),
                        "seed {seed}: {payload} acknowledged at {index}, lost"
                    );
                }
                Fate::NotApplied => {
                    assert_eq!(
                        at.get(payload),
                        None,
                        "seed {seed}: {payload} refused, yet applied"
                    );
                }
                Fate::Unknown => {}
            }
        }
        for payload in at.keys() {
            assert!(fates.contains_key(payload), "seed {seed}: {payload} was never proposed");
        }
        let installed: u64 = self.live.values().map(|l| l.machine.counts().installed).sum();
        self.installed += installed;
        let summary = format!(
            "{} applied, {acked} acknowledged, {} proposed, {installed} snapshots installed",
            at.len(),
            fates.len()
        );
        self.note(summary);
        // Every proposal's fate, in one line a replay must match.
        let fates: Vec<String> = fates.iter().map(|(p, f)| format!("{p}={f:?}")).collect();
        self.note(format!("fates {}", fates.join(" ")));
    }

    async fn stop(&mut self) {
        for id in NODES {
            if let Some(live) = self.live.remove(&id) {
                live.raft.shutdown().await.unwrap();
            }
        }
        self.world.lock().unwrap().up.clear();
    }
}

/// Where the data dirs go: memory when the machine has a tmpfs (fsyncs cost nothing, and take
/// no simulated time either way).
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::tempdir_in(shm) {
            return dir;
        }
    }
    tempfile::tempdir().unwrap()
}

/// One seed's run: its events, and how many snapshots were installed.
fn run(seed: u64) -> (Vec<String>, u64) {
    let root = scratch();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let sim = async {
        let mut sim = Sim::new(seed, root.path());
        for id in NODES {
            sim.start(id).await;
        }
        sim.live[&1].raft.initialize(members()).await.unwrap();
        sim.faults().await;
        let through = sim.heal().await;
        sim.check(through);
        sim.stop().await;
        (sim.events, sim.installed)
    };
    runtime.block_on(Seeded::scope(seed, sim))
}

fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("SIM_SEED") {
        return vec![seed.parse().expect("SIM_SEED is a number")];
    }
    let count = std::env::var("SIM_SEEDS").ok().and_then(|n| n.parse().ok()).unwrap_or(200);
    (1..=count).collect()
}

#[test]
fn every_seed_converges_with_nothing_acknowledged_lost() {
    let mut installed = 0;
    for seed in seeds() {
        match std::panic::catch_unwind(|| run(seed)) {
            Ok((_, n)) => installed += n,
            Err(e) => {
                eprintln!("the simulation failed with seed {seed}: replay it with SIM_SEED={seed}");
                std::panic::resume_unwind(e);
            }
        }
    }
    if seeds().len() >= 20 {
        assert!(installed > 0, "no node ever caught up by a snapshot: the faults are too mild");
    }
}

#[test]
fn replays_identically() {
    for seed in [7, 8, 120, 1_000_003] {
        let ((first, _), (again, _)) = (run(seed), run(seed));
        assert!(first.len() > 10, "seed {seed}: too little happened: {first:?}");
        let differ = first.iter().zip(&again).position(|(a, b)| a != b);
        if let Some(at) =
            differ.or((first.len() != again.len()).then_some(first.len().min(again.len())))
        {
            let show = |events: &[String]| {
                events[at.saturating_sub(3)..(at + 1).min(events.len())].join("\n")
            };
            panic!(
                "seed {seed}: two runs differ from event {at}:\n{}\n---\n{}",
                show(&first),
                show(&again)
            );
        }
    }
}
