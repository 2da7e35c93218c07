//! Running as a member of a cluster (docs/spec/cluster.md): the node's settings from the serve
//! flags, the cursor key every node shares, and the node's life as a leader.
//!
//! A cluster node starts as a follower: it applies committed records and answers its public
//! API with `503 cluster_unavailable`. When its proposer first takes proposals (it leads, and
//! has applied everything committed before its term), [`lead_when_elected`] starts the actors
//! on that state and the node serves. When the leadership moves on (another leader, or a new
//! term), the node's actors may hold decisions the cluster never committed; rather than
//! untangle them, the process starts itself again from its data dir (a crash-only restart: the
//! log and the vote are durable), and comes back as a follower.

use std::collections::BTreeMap;

use actix_web::web;
use actors::replica::{
    ClusterSecret, LinkTls, NodeConfig, Peer, ELECTION_TIMEOUT_MS, HEARTBEAT_MS,
};
use actors::{Service, ServiceConfig};
use anyhow::Context;
use sha2::{Digest, Sha256};

use crate::config::{parse_initial_cluster, ServeArgs};
use crate::state::AppState;

/// Entries kept behind a snapshot at the least.
const MIN_KEPT_LOG: u64 = 100;

/// The node's settings, when the flags ask for a cluster node, with the cursor key derived
/// from the secret ([`cursor_key`]).
///
/// # Errors
/// The secret file cannot be read or is too short, or `--initial-cluster` is malformed or
/// omits this node.
pub fn node_config(args: &ServeArgs) -> anyhow::Result<Option<(NodeConfig, [u8; 32])>> {
    let Some(node_id) = args.node_id else { return Ok(None) };
    let node_id = node_id.get();
    let (Some(raft_addr), Some(secret_file)) = (args.raft_addr, &args.cluster_secret_file) else {
        anyhow::bail!("--node-id needs --raft-addr and --cluster-secret-file");
    };
    let secret = std::fs::read(secret_file)
        .with_context(|| format!("cannot read the cluster secret {}", secret_file.display()))?;
    let secret = trim_newline(secret);
    let cursors = cursor_key(&secret);
    let secret = ClusterSecret::new(secret)
        .with_context(|| format!("the cluster secret in {}", secret_file.display()))?;
    let initial = match &args.initial_cluster {
        None => None,
        Some(text) => {
            let members = parse_initial_cluster(text).map_err(anyhow::Error::msg)?;
            if !members.iter().any(|(id, _)| *id == node_id) {
                anyhow::bail!("--initial-cluster does not list this node ({node_id})");
            }
            // Every listed node initializes with exactly this list, so it holds only what
            // every node is told alike (an API address is told to peers later).
            let members: BTreeMap<u64, Peer> = members
                .into_iter()
                .map(|(id, addr)| {
                    (id, Peer { raft_addr: addr.to_string(), api_addr: String::new() })
                })
                .collect();
            Some(members)
        }
    };
    let tls = match &args.cluster_tls_dir {
        None => None,
        Some(dir) => Some(std::sync::Arc::new(LinkTls::from_dir(dir).with_context(|| {
            format!(
                "cannot use the cluster TLS dir {} (it holds ca.crt, node.crt and node.key)",
                dir.display()
            )
        })?)),
    };
    let config = NodeConfig {
        node_id,
        group: 0,
        dir: args.data_dir.clone(),
        raft_addr,
        api_addr: args.addr.to_string(),
        initial,
        join: args.join,
        secret,
        tls,
        heartbeat_ms: HEARTBEAT_MS,
        election_timeout_ms: ELECTION_TIMEOUT_MS,
        // A cluster snapshots by the single node's record rule; half as many entries stay
        // behind each snapshot for followers a little behind.
        snapshot_every: Some(args.checkpoint_every_records).filter(|&n| n > 0).unwrap_or(u64::MAX),
        keep_log: (args.checkpoint_every_records / 2).max(MIN_KEPT_LOG),
        // Set by `ClusterDomain::start` for `--archive-dir`.
        archive_hold: None,
    };
    Ok(Some((config, cursors)))
}

/// A secret file's bytes without the line end an editor adds.
fn trim_newline(mut bytes: Vec<u8>) -> Vec<u8> {
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    bytes
}

/// The cursor key of a cluster: derived from the cluster secret, so a cursor (or an ETag) one
/// node issued works on every other.
pub fn cursor_key(secret_file_bytes: &[u8]) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(b"sheetd cursor key 1\0");
    hash.update(secret_file_bytes);
    hash.finalize().into()
}

/// Waits until this node leads, starts the actors on its applied state (`seed` fills a new
/// cluster's, as a single node seeds a new data dir), and restarts the process when the
/// leadership moves on (see the module docs).
pub async fn lead_when_elected<F, Fut>(state: web::Data<AppState>, config: ServiceConfig, seed: F)
where
    F: FnOnce(Service) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let Some(cluster) = state.cluster.clone() else { return };
    let me = cluster.node_id();
    let mut leadership = cluster.leadership();
    let term = loop {
        {
            let now = leadership.borrow_and_update();
            if now.proposing {
                break now.term;
            }
        }
        if leadership.changed().await.is_err() {
            return;
        }
    };
    match cluster.promote(&config).await {
        Ok(service) => {
            let counts = service.counts();
            if counts.users == 0 && counts.sheets == 0 && counts.keys == 0 {
                if let Err(e) = seed(service.clone()).await {
                    tracing::error!(error = %e, "seeding the new cluster failed");
                }
            }
            state.set_service(service);
            tracing::info!(node = me, term, "leading: serving the API");
        }
        Err(e) => {
            tracing::error!(error = %e, "the actors could not start on the applied state");
            restart();
        }
    }
    let guard = std::sync::Arc::clone(cluster.guard());
    loop {
        if guard.is_tainted() && !*state.stopping.borrow() {
            tracing::warn!(node = me, term, "restarting as a follower from the data dir");
            restart_after_answers(&state).await;
        }
        tokio::select! {
            changed = leadership.changed() => if changed.is_err() { return },
            () = guard.tainted_now.notified() => continue,
        }
        let now = leadership.borrow_and_update().clone();
        // A stop ends the leadership too; the process is on its way out then.
        if *state.stopping.borrow() {
            return;
        }
        if now.leader != Some(me) || now.term != term {
            tracing::warn!(
                node = me,
                term,
                new_term = now.term,
                leader = ?now.leader,
                "no longer the leader: restarting as a follower from the data dir"
            );
            restart_after_answers(&state).await;
        }
    }
}

/// How long a node that stops leading waits before it starts again: the writes that failed
/// with it are answered (503, with their outcome) rather than cut off with the connection.
const RESTART_GRACE: std::time::Duration = std::time::Duration::from_millis(250);

/// [`restart`] once the failed writes' answers have left (see [`RESTART_GRACE`]); the node
/// serves nothing from its actors meanwhile. A node that is stopping (its own shutdown ends
/// its leadership) is left to stop.
async fn restart_after_answers(state: &AppState) -> ! {
    tokio::time::sleep(RESTART_GRACE).await;
    if *state.stopping.borrow() {
        tracing::info!("stopping, not restarting");
        std::future::pending::<()>().await;
    }
    restart()
}

/// Starts this process again with the same arguments, in place (see the module docs).
fn restart() -> ! {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe();
    // The queued log lines (this restart's reason among them) would go with the process.
    crate::logging::flush();
    let error = match exe {
        Ok(exe) => std::process::Command::new(exe).args(std::env::args_os().skip(1)).exec(),
        Err(e) => e,
    };
    // The log's thread has ended: this line goes to stderr directly (and is lost with it).
    let _ = writeln!(std::io::stderr(), "sheetd: cannot restart the process; exiting: {error}");
    std::process::exit(1);
}
