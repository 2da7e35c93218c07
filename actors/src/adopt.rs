//! A single node's data dir becoming a cluster of one (docs/spec/cluster.md, "Membership").
//!
//! Owns: [`adopt_single_node`], its steps and what a crash between them leaves.
//!
//! # Steps
//!
//! 1. `adopting` is written with `move`, and everything the single node kept in the data dir
//!    is moved into `single-node/` (kept there, untouched, as the operator's way back).
//! 2. `adopting` says `build`. The single node's data is recovered from `single-node/` as a
//!    start recovers it, and the data dir gets a Raft log and snapshot: the group's state at
//!    Raft index `L - 1` (`L` the single node's last position, so every position keeps its
//!    meaning: index `i` is position `i + 1`, as on every cluster node), the records its
//!    change feeds retain below it, and this node the only voter. No entry is written: the
//!    log begins after the snapshot, so every node added later catches up from it.
//! 3. `adopting` is removed.
//!
//! A start that finds `adopting` resumes: after `move` it moves what is left and builds; after
//! `build` it removes what the interrupted build wrote and builds again. The single node's
//! files are never changed in place.

use std::fs;
use std::io;
use std::path::Path;

use crate::error::{Error, Result};
use crate::log::{encode_snapshot, Lsn, RecordLog, WalLog, WalLogConfig};
use crate::model::Millis;
use crate::replica::{snapshot_header, NodeId, Peer};
use crate::service::{fresh_rebuild, Service};
use crate::shared::Retention;

/// Where a cluster node keeps the single node's data it began from.
pub const SINGLE_NODE_DIR: &str = "single-node";

/// The marker of an adoption under way, and its step.
const ADOPTING: &str = "adopting";

/// What an adoption made of the data dir.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adopted {
    /// The single node's last position: the group's state at Raft index `position - 1`.
    pub position: Lsn,
}

/// Makes the single node's data in `data_dir` the state of a new group whose only voter is
/// node `node_id` at `node`, the change feeds' retention being `retention` (see the module
/// docs). `None` when the data dir holds no single node's data (empty, or a cluster node's
/// already). Blocking.
///
/// # Errors
/// The single node's data cannot be recovered, or the data dir cannot be written; a start
/// after the error resumes.
pub fn adopt_single_node(
    data_dir: &Path,
    node_id: NodeId,
    node: Peer,
    retention: Retention,
) -> Result<Option<Adopted>> {
    let io = |e: io::Error| {
        Error::Cluster(format!("adopting the single node's data dir {}: {e}", data_dir.display()))
    };
    let marker = data_dir.join(ADOPTING);
    match fs::read_to_string(&marker).ok().as_deref() {
        None => {
            if !holds_single_node(data_dir)? {
                return Ok(None);
            }
            tracing::info!(dir = %data_dir.display(), "a single node's data dir: it becomes the state of a new cluster of one");
            write_marker(data_dir, "move").map_err(io)?;
            move_aside(data_dir).map_err(io)?;
            write_marker(data_dir, "build").map_err(io)?;
        }
        Some("move") => {
            move_aside(data_dir).map_err(io)?;
            write_marker(data_dir, "build").map_err(io)?;
        }
        Some(_) => remove_built(data_dir).map_err(io)?,
    }
    let adopted = build(data_dir, node_id, node, retention)?;
    fs::remove_file(&marker).map_err(io)?;
    sync_dir(data_dir).map_err(io)?;
    tracing::info!(
        position = adopted.position,
        kept_in = SINGLE_NODE_DIR,
        "the single node's data is the cluster's state; its files are kept unchanged"
    );
    Ok(Some(adopted))
}

/// Whether `dir` holds a single node's log: no group's, and a position above 0, and no
/// adoption under way. Blocking.
///
/// # Errors
/// The log cannot be read.
pub fn holds_single_node(dir: &Path) -> Result<bool> {
    if dir.join(ADOPTING).exists() {
        return Ok(true);
    }
    if cluster::holds_group(dir) || fs::read_dir(dir).map_or(true, |mut d| d.next().is_none()) {
        return Ok(false);
    }
    let inspected = Service::inspect(dir, Millis::MIN)?;
    Ok(inspected.report.last_lsn > 0)
}

fn write_marker(dir: &Path, step: &str) -> io::Result<()> {
    let tmp = dir.join(format!("{ADOPTING}.tmp"));
    fs::write(&tmp, step)?;
    fs::File::open(&tmp)?.sync_all()?;
    fs::rename(&tmp, dir.join(ADOPTING))?;
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

/// Entries of `dir` other than the marker and the single node's dir.
fn others(dir: &Path) -> io::Result<Vec<fs::DirEntry>> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name != ADOPTING && name != SINGLE_NODE_DIR && name != format!("{ADOPTING}.tmp").as_str()
        {
            found.push(entry);
        }
    }
    Ok(found)
}

/// Step 1: every entry of the data dir into `single-node/`.
fn move_aside(dir: &Path) -> io::Result<()> {
    let aside = dir.join(SINGLE_NODE_DIR);
    fs::create_dir_all(&aside)?;
    for entry in others(dir)? {
        fs::rename(entry.path(), aside.join(entry.file_name()))?;
    }
    sync_dir(&aside)?;
    sync_dir(dir)
}

/// Undoes an interrupted step 2.
fn remove_built(dir: &Path) -> io::Result<()> {
    for entry in others(dir)? {
        if entry.file_type()?.is_dir() {
            fs::remove_dir_all(entry.path())?;
        } else {
            fs::remove_file(entry.path())?;
        }
    }
    sync_dir(dir)
}

/// Step 2.
fn build(dir: &Path, node_id: NodeId, node: Peer, retention: Retention) -> Result<Adopted> {
    let aside = dir.join(SINGLE_NODE_DIR);
    // Every stored idempotent answer kept, as a cluster node's apply keeps them: the leader's
    // housekeeping expires them by its records.
    let mut rebuild = fresh_rebuild(Millis::MIN);
    rebuild.retention = retention;
    let config = WalLogConfig { dir: aside, min_free_bytes: None };
    let (log, report) = WalLog::open(config, &mut rebuild)?;
    let position = report.last_lsn;
    let Some(index) = position.checked_sub(1) else {
        return Err(Error::Inconsistent("the single node's log is empty".into()));
    };
    let (file, retained_positions) = rebuild.checkpoint_at(position);
    let mut retained = Vec::with_capacity(retained_positions.len());
    for lsn in retained_positions {
        if let Some(record) = log.read_stored(lsn)? {
            retained.push((lsn - 1, record));
        }
    }
    log.shutdown()?;
    let mut state = Vec::new();
    snapshot_header(retention, &mut state).map_err(|e| Error::Cluster(e.to_string()))?;
    encode_snapshot(&file, &mut state)?;
    cluster::begin_with_state(dir, node_id, node, index, &retained, &state)
        .map_err(|e| Error::Cluster(format!("cannot write the cluster's first state: {e}")))?;
    Ok(Adopted { position })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{add, config, open_with_one_sheet};

    /// A single node's data dir: a fixture, writes, a checkpoint, more writes, then closed.
    async fn single_node(dir: &Path) {
        let service = open_with_one_sheet(config(dir)).await;
        for n in 1..=5 {
            add(&service, n).await;
        }
        service.checkpoint().await.unwrap();
        for n in 6..=8 {
            add(&service, n).await;
        }
        service.close().unwrap();
    }

    fn peer() -> Peer {
        Peer { raft_addr: "127.0.0.1:9101".into(), api_addr: String::new() }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[actix_rt::test]
    async fn an_adoption_keeps_the_single_nodes_files_and_resumes_after_a_crash_at_either_step() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        single_node(&data).await;
        let digest = Service::inspect(&data, Millis::MIN).unwrap().digest;
        let files = names(&data);
        let retention = Retention::default();

        // A crash in the middle of step 1: some files moved, the rest not.
        fs::write(data.join(ADOPTING), "move").unwrap();
        fs::create_dir(data.join(SINGLE_NODE_DIR)).unwrap();
        let first = fs::read_dir(&data)
            .unwrap()
            .map(|e| e.unwrap())
            .find(|e| e.file_name() != ADOPTING && e.file_name() != SINGLE_NODE_DIR);
        let first = first.unwrap();
        fs::rename(first.path(), data.join(SINGLE_NODE_DIR).join(first.file_name())).unwrap();
        let adopted = adopt_single_node(&data, 1, peer(), retention).unwrap().unwrap();
        assert!(adopted.position > 8, "{adopted:?}");
        assert_eq!(names(&data.join(SINGLE_NODE_DIR)), files, "every file moved, unchanged");
        assert_eq!(
            Service::inspect(&data.join(SINGLE_NODE_DIR), Millis::MIN).unwrap().digest,
            digest
        );
        assert!(cluster::holds_group(&data));
        assert!(!data.join(ADOPTING).exists());
        // Done once: the dir is a cluster node's now.
        assert_eq!(adopt_single_node(&data, 1, peer(), retention).unwrap(), None);

        // A crash in the middle of step 2: what it wrote is removed and written again.
        let built = names(&data);
        fs::write(data.join(ADOPTING), "build").unwrap();
        fs::write(data.join("raft-snapshot"), b"half written").unwrap();
        let again = adopt_single_node(&data, 1, peer(), retention).unwrap().unwrap();
        assert_eq!(again, adopted);
        assert_eq!(names(&data), built);
        assert_ne!(fs::read(data.join("raft-snapshot")).unwrap(), b"half written");
    }
}
