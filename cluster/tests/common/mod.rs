//! A node as the link tests and the group tests run it: a `WalLogStore` and a
//! `RecordsStateMachine` on a data dir, an `openraft::Raft` over them, and its cluster link;
//! and [`Applied`], the domain the storage tests and the simulation run a `Machine` over.

#![allow(dead_code)] // Each test file uses its own part of this.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cluster::net::{ClusterLink, ClusterSecret, LinkConfig};
use cluster::{
    Apply, DomainSnapshot, NodeId, RecordsStateMachine, TypeConfig, WalLogStore, DEFAULT_GROUP,
};
use openraft::{Config, Raft};

/// The secret every test node shares.
pub fn secret() -> ClusterSecret {
    ClusterSecret::new(b"the test cluster's secret, over 32 bytes long".to_vec()).unwrap()
}

/// Short timeouts, so elections and fail-over take a fraction of a second.
pub fn raft_config() -> Arc<Config> {
    let config = Config {
        heartbeat_interval: 100,
        election_timeout_min: 300,
        election_timeout_max: 600,
        ..Default::default()
    };
    Arc::new(config.validate().unwrap())
}

/// Fails the test if `future` takes longer than `secs`: a hung cluster must not hang CI.
pub async fn within<T>(secs: u64, what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), future).await {
        Ok(value) => value,
        Err(_) => panic!("{what}: not done within {secs} s"),
    }
}

pub struct Node {
    pub id: NodeId,
    pub dir: PathBuf,
    pub addr: SocketAddr,
    pub raft: Raft<TypeConfig, RecordsStateMachine>,
    pub sm: RecordsStateMachine,
    pub link: ClusterLink,
    log: WalLogStore,
}

impl Node {
    /// Starts node `id` on `dir`, listening on `addr` (port 0: any free one).
    pub async fn start(id: NodeId, dir: &Path, addr: SocketAddr) -> Node {
        Self::start_with(LinkConfig::new(id, secret()), dir, addr).await
    }

    pub async fn start_with(config: LinkConfig, dir: &Path, addr: SocketAddr) -> Node {
        let id = config.node_id;
        let log = {
            let dir = dir.to_owned();
            tokio::task::spawn_blocking(move || WalLogStore::open(dir)).await.unwrap().unwrap()
        };
        let link = bind(addr, config).await;
        let sm = RecordsStateMachine::default();
        let network = link.network(DEFAULT_GROUP);
        // Built on the link's runtime, as a node does: openraft's core, ticks and replication
        // run there, away from the test's own runtime.
        let (store, machine) = (log.clone(), sm.clone());
        let built = link.runtime().spawn(Raft::new(id, raft_config(), network, store, machine));
        let raft = built.await.unwrap().unwrap();
        link.serve(DEFAULT_GROUP, raft.clone(), Default::default()).unwrap();
        let addr = link.local_addr();
        Node { id, dir: dir.to_owned(), addr, raft, sm, link, log }
    }

    /// A real stop: the Raft's tasks end, the listener and every connection close, the data
    /// dir is released.
    pub async fn stop(self) {
        self.raft.shutdown().await.unwrap();
        self.link.shutdown();
        drop(self.raft);
        let log = self.log;
        tokio::task::spawn_blocking(move || log.shutdown()).await.unwrap().unwrap();
    }
}

/// Binds the link, waiting while the address is still taken (a restart on the same port).
async fn bind(addr: SocketAddr, config: LinkConfig) -> ClusterLink {
    for _ in 0..50 {
        match ClusterLink::bind(addr, config.clone()) {
            Ok(link) => return link,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("bind {addr}: {e}"),
        }
    }
    panic!("{addr} stayed in use");
}

/// The domain a server's `Machine` runs over, reduced to what it applied: (index, payload)
/// pairs, snapshotted as `[index u64][len u64][payload]` repeated (little-endian).
#[derive(Default)]
pub struct Applied(pub Vec<(u64, Vec<u8>)>);

impl Apply for Applied {
    fn apply(&mut self, index: u64, payload: &[u8]) -> std::io::Result<()> {
        self.0.push((index, payload.to_vec()));
        Ok(())
    }

    fn snapshot(&mut self, last_applied: u64) -> std::io::Result<Option<DomainSnapshot>> {
        let records = self.0.clone();
        let write = move |out: &mut dyn std::io::Write| {
            for (index, payload) in &records {
                out.write_all(&index.to_le_bytes())?;
                out.write_all(&(payload.len() as u64).to_le_bytes())?;
                out.write_all(payload)?;
            }
            Ok(())
        };
        // Records whose payload begins with "keep" are read back by position later, as a
        // change feed reads its retained changes.
        let retained =
            self.0.iter().filter(|(_, p)| p.starts_with(b"keep")).map(|(i, _)| *i).collect();
        Ok(Some(DomainSnapshot { index: last_applied, retained, write: Box::new(write) }))
    }

    fn install(&mut self, _index: u64, snapshot: &mut dyn std::io::Read) -> std::io::Result<()> {
        let mut bytes = Vec::new();
        snapshot.read_to_end(&mut bytes)?;
        let mut records = Vec::new();
        let mut rest = bytes.as_slice();
        while !rest.is_empty() {
            let index = u64::from_le_bytes(rest[..8].try_into().unwrap());
            let len = u64::from_le_bytes(rest[8..16].try_into().unwrap()) as usize;
            records.push((index, rest[16..16 + len].to_vec()));
            rest = &rest[16 + len..];
        }
        self.0 = records;
        Ok(())
    }
}
