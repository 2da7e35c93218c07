//! A state machine of the applied records: openraft's [`RaftStateMachine`] over this crate's
//! types, keeping every applied record in order.
//!
//! Owns: [`RecordsStateMachine`] and its snapshots.
//!
//! It is what the log store is proven with (openraft's storage suite drives a log store and a
//! state machine together), and what a group's replication is checked against: two replicas
//! that applied the same index hold the same records. The domain's own state machine takes its
//! place next: the sheet actors, applying records by overwrite as replay does today, with the
//! wal's checkpoint as the snapshot.
//!
//! # Model
//!
//! - The state is the list of applied records, each with the index it was applied at, the
//!   last applied log id and the last applied membership.
//! - A snapshot is that whole state, encoded ([`wal::codec`]) and held in memory, taken under one lock: exactly
//!   the state at its last log id, never a mix of two moments.
//! - Installing a snapshot replaces the whole state at once, after checking that the snapshot
//!   holds the state its metadata names.
//! - Everything is in memory: after a restart the state is empty and is rebuilt from the log,
//!   so a node running on it must keep its log whole (no purge past what it can re-apply).

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::type_config::alias::SnapshotOf;
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};
use wal::codec;

use crate::error::Error;
use crate::snapshot_data::SnapshotData;
use crate::types::{Applied, LogId, Record, SnapshotMeta, StoredMembership, TypeConfig};

/// Everything the state machine holds but its last snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordsState {
    /// The log id of the last entry applied.
    pub last_applied: Option<LogId>,
    /// The last membership applied, with the log id of its entry.
    pub membership: StoredMembership,
    /// Every record applied, with the Raft index it was applied at, in index order.
    pub records: Vec<(u64, Record)>,
}

/// The state machine of the applied records. A cheap `Clone`: every clone is the same state
/// machine, and one serves as its snapshot builder.
#[derive(Debug, Clone, Default)]
pub struct RecordsStateMachine {
    inner: Arc<Mutex<Inner>>,
}

/// What the clones share.
#[derive(Debug, Default)]
struct Inner {
    /// The applied state.
    state: RecordsState,
    /// The last snapshot built or installed: its metadata and its bytes.
    snapshot: Option<(SnapshotMeta, Vec<u8>)>,
}

impl RecordsStateMachine {
    /// A copy of the applied state.
    pub fn state(&self) -> RecordsState {
        self.lock().state.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl RaftSnapshotBuilder<TypeConfig> for RecordsStateMachine {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> io::Result<SnapshotOf<TypeConfig, SnapshotData>> {
        let mut inner = self.lock();
        // Under the lock: no entry is applied between reading the state and its metadata.
        let bytes = codec::encode(&inner.state).map_err(io::Error::other)?;
        let meta = SnapshotMeta {
            last_log_id: inner.state.last_applied,
            last_membership: inner.state.membership.clone(),
        };
        inner.snapshot = Some((meta.clone(), bytes.clone()));
        Ok(SnapshotOf::<TypeConfig, SnapshotData> { meta, snapshot: SnapshotData::Bytes(bytes) })
    }
}

impl RaftStateMachine<TypeConfig> for RecordsStateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId>, StoredMembership)> {
        let inner = self.lock();
        Ok((inner.state.last_applied, inner.state.membership.clone()))
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
                let state = &mut inner.state;
                match entry.payload {
                    EntryPayload::Blank => {}
                    EntryPayload::Normal(record) => {
                        // Decided by the entry alone, so every node skips the same ones.
                        accepted = record.belongs_at(index);
                        if accepted {
                            state.records.push((index, record));
                        }
                    }
                    EntryPayload::Membership(membership) => {
                        state.membership = StoredMembership::new(Some(entry.log_id), membership);
                    }
                }
                state.last_applied = Some(entry.log_id);
            }
            // Every entry answers with its position, blank and membership ones too.
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
        snapshot: SnapshotData,
    ) -> io::Result<()> {
        let bytes = snapshot.into_bytes()?;
        let state: RecordsState = codec::decode(&bytes).map_err(io::Error::other)?;
        if state.last_applied != meta.last_log_id || state.membership != meta.last_membership {
            return Err(io::Error::other(Error::SnapshotMismatch {
                expected: meta.last_log_id,
                found: state.last_applied,
            }));
        }
        // One assignment: no reader sees half of the old state and half of the new.
        *self.lock() = Inner { state, snapshot: Some((meta.clone(), bytes)) };
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> io::Result<Option<SnapshotOf<TypeConfig, SnapshotData>>> {
        Ok(self.lock().snapshot.as_ref().map(|(meta, bytes)| SnapshotOf::<
            TypeConfig,
            SnapshotData,
        > {
            meta: meta.clone(),
            snapshot: SnapshotData::Bytes(bytes.clone()),
        }))
    }
}
