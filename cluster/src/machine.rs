//! The state machine a server runs: openraft's [`RaftStateMachine`] over a domain that knows
//! nothing of openraft, behind [`Apply`].
//!
//! Owns: [`Machine`], the Raft side of applying (the last applied log id, the membership, the
//! placement check of [`Record::belongs_at`]), and the durable copy of the last snapshot.
//!
//! # Model
//!
//! - The domain sees committed records in index order, each once per run, and only those that
//!   landed where their proposer put them; blank and membership entries only move the applied
//!   index on.
//! - A snapshot is the domain's state exactly at the last applied log id: taken under the lock
//!   that applying holds, so no entry is applied between the two.
//! - The last snapshot (built, or installed from the leader) is kept in `raft-snapshot` in the
//!   data dir, written to a temporary name, fsynced and renamed: a start installs it into the
//!   domain and openraft re-applies the committed entries after it. The log store purges only
//!   what a snapshot covers, so the two together always hold every committed record.

use std::fs;
use std::io::{self, Cursor, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures_util::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::type_config::alias::SnapshotOf;
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};
use wal::codec;

use crate::types::{Applied, LogId, SnapshotMeta, StoredMembership, TypeConfig};

/// The domain under a [`Machine`].
pub trait Apply: Send + 'static {
    /// Applies the committed record at `index`.
    ///
    /// # Errors
    /// The record cannot be applied (damaged, or from a newer build): the node stops applying,
    /// and openraft stops with it.
    fn apply(&mut self, index: u64, payload: &[u8]) -> io::Result<()>;

    /// Writes the whole state as applied so far.
    ///
    /// # Errors
    /// The state cannot be encoded or `out` refuses it.
    fn snapshot(&mut self, out: &mut dyn Write) -> io::Result<()>;

    /// Replaces the whole state with `snapshot`, the state at `index`.
    ///
    /// # Errors
    /// The bytes are not a snapshot this build reads; the state is left as it was.
    fn install(&mut self, index: u64, snapshot: &mut dyn Read) -> io::Result<()>;
}

/// The file the last snapshot is kept in.
const SNAPSHOT_FILE: &str = "raft-snapshot";

/// What `raft-snapshot` holds: the snapshot's metadata, then its bytes.
#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta,
    data: Vec<u8>,
}

/// The state machine over `A`. A cheap `Clone`: every clone is the same machine, and one
/// serves as its snapshot builder.
pub struct Machine<A: Apply> {
    inner: Arc<Mutex<Inner<A>>>,
    dir: PathBuf,
}

impl<A: Apply> Clone for Machine<A> {
    fn clone(&self) -> Self {
        Machine { inner: Arc::clone(&self.inner), dir: self.dir.clone() }
    }
}

struct Inner<A> {
    domain: A,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    /// The last snapshot built or installed, as kept on disk.
    snapshot: Option<(SnapshotMeta, Vec<u8>)>,
}

impl<A: Apply> Machine<A> {
    /// The machine over `domain` (empty), with the snapshot kept in `dir` installed into it.
    ///
    /// # Errors
    /// The kept snapshot cannot be read or the domain refuses it.
    pub fn open(dir: &Path, mut domain: A) -> io::Result<Machine<A>> {
        let path = dir.join(SNAPSHOT_FILE);
        let (mut last_applied, mut membership, mut snapshot) = (None, Default::default(), None);
        match fs::read(&path) {
            Ok(bytes) => {
                let stored: StoredSnapshot = codec::decode(&bytes).map_err(io::Error::other)?;
                let index = stored.meta.last_log_id.map_or(0, |l| l.index);
                domain.install(index, &mut stored.data.as_slice())?;
                last_applied = stored.meta.last_log_id;
                membership = stored.meta.last_membership.clone();
                snapshot = Some((stored.meta, stored.data));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let inner = Inner { domain, last_applied, membership, snapshot };
        Ok(Machine { inner: Arc::new(Mutex::new(inner)), dir: dir.to_owned() })
    }

    /// Runs `f` on the domain while nothing is applied.
    pub fn with_domain<T>(&self, f: impl FnOnce(&mut A, Option<LogId>) -> T) -> T {
        let mut inner = self.lock();
        let last = inner.last_applied;
        f(&mut inner.domain, last)
    }

    fn lock(&self) -> MutexGuard<'_, Inner<A>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `meta` and `data` as the last snapshot, durably.
    fn keep(&self, meta: &SnapshotMeta, data: &[u8]) -> io::Result<()> {
        let stored = StoredSnapshot { meta: meta.clone(), data: data.to_vec() };
        let bytes = codec::encode(&stored).map_err(io::Error::other)?;
        let tmp = self.dir.join(format!("{SNAPSHOT_FILE}.tmp"));
        let mut file = fs::File::create(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, self.dir.join(SNAPSHOT_FILE))?;
        fs::File::open(&self.dir)?.sync_all()
    }
}

impl<A: Apply> RaftSnapshotBuilder<TypeConfig> for Machine<A> {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn build_snapshot(&mut self) -> io::Result<SnapshotOf<TypeConfig, Cursor<Vec<u8>>>> {
        let (meta, data) = {
            let mut inner = self.lock();
            // Under the lock: no entry is applied between the state and its metadata.
            let mut data = Vec::new();
            inner.domain.snapshot(&mut data)?;
            let meta = SnapshotMeta {
                last_log_id: inner.last_applied,
                last_membership: inner.membership.clone(),
            };
            (meta, data)
        };
        self.keep(&meta, &data)?;
        self.lock().snapshot = Some((meta.clone(), data.clone()));
        Ok(SnapshotOf::<TypeConfig, Cursor<Vec<u8>>> { meta, snapshot: Cursor::new(data) })
    }
}

impl<A: Apply> RaftStateMachine<TypeConfig> for Machine<A> {
    type SnapshotData = Cursor<Vec<u8>>;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId>, StoredMembership)> {
        let inner = self.lock();
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> io::Result<()>
    where
        Strm: Stream<Item = io::Result<EntryResponder<TypeConfig>>> + Unpin + OptionalSend,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            let index = entry.log_id.index;
            let mut accepted = true;
            {
                let mut inner = self.lock();
                match entry.payload {
                    EntryPayload::Normal(record) if record.belongs_at(index) => {
                        inner.domain.apply(index, &record.payload)?;
                    }
                    // Decided by the entry alone, so every node skips the same ones.
                    EntryPayload::Normal(_) => accepted = false,
                    EntryPayload::Blank => {}
                    EntryPayload::Membership(membership) => {
                        inner.membership = StoredMembership::new(Some(entry.log_id), membership);
                    }
                }
                inner.last_applied = Some(entry.log_id);
            }
            if let Some(responder) = responder {
                responder.send(Applied { index, accepted });
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Cursor<Vec<u8>>,
    ) -> io::Result<()> {
        let data = snapshot.into_inner();
        let mut inner = self.lock();
        let index = meta.last_log_id.map_or(0, |l| l.index);
        // Installed before it is kept: bytes the domain refuses are never kept to be refused
        // again at the next start. openraft purges the log only after this returns, so a crash
        // before the snapshot is kept starts from the old state and the log that covers it.
        inner.domain.install(index, &mut data.as_slice())?;
        inner.last_applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
        self.keep(meta, &data)?;
        inner.snapshot = Some((meta.clone(), data));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> io::Result<Option<SnapshotOf<TypeConfig, Cursor<Vec<u8>>>>> {
        Ok(self.lock().snapshot.as_ref().map(|(meta, data)| SnapshotOf::<
            TypeConfig,
            Cursor<Vec<u8>>,
        > {
            meta: meta.clone(),
            snapshot: Cursor::new(data.clone()),
        }))
    }
}
