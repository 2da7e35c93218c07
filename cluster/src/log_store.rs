//! The Raft log on the `wal`: openraft's [`RaftLogStorage`] and [`RaftLogReader`].
//!
//! Owns: [`WalLogStore`], the mapping from Raft log positions to wal records, and the Raft
//! state kept beside them (vote, committed log id, last purged log id) in the wal's state file.
//!
//! # Layout
//!
//! | Raft                      | wal                                                        |
//! |---------------------------|------------------------------------------------------------|
//! | entry at index `i`        | record at LSN `i + 1`: the [`Entry`] (log id and payload) encoded with [`wal::codec`] |
//! | `append`                  | [`Wal::append_batch_at`]: one batch, at the LSNs the leader chose |
//! | `truncate_after(i)`       | [`Wal::truncate_after`]`(i + 1)`                            |
//! | `purge(i)`                | [`Wal::purge_through_retaining`]`(i + 1, …)` (the wal's checkpoint at `i + 1`, empty; a snapshot's retained records stay) |
//! | vote, committed, purged   | [`Wal::save_state`]: one encoded [`RaftState`]              |
//!
//! Why `i + 1` and not `i`: openraft's first entry (the membership `initialize` writes) has
//! index 0, and the wal's LSNs begin at 1 (0 means "nothing").
//!
//! # Invariants
//!
//! - **Acknowledged only when durable.** An append's [`IOFlushed`] callback is called only
//!   once the wal's group commit covering its last entry is fsynced (the [`wal::Commit`]
//!   resolved); `save_vote` and a purge return only once the state file is fsynced and its
//!   directory entry too. Acknowledging earlier lets a node that loses power forget a vote
//!   (two leaders in one term) or an entry a majority counted on.
//! - **The committed log id is written lazily.** openraft makes saving it optional (a restart
//!   then applies only up to what was saved, and the rest once a leader's commit covers it),
//!   and awaits `save_committed` in its core before applying: writing it durably there cost
//!   two fsyncs per commit on every node, on the path of every write. It is kept in memory,
//!   written with the next vote or purge, and by [`WalLogStore::persist_committed`] (the node
//!   calls it every second and when it stops). A saved committed log id is always one this
//!   node learned, so a restart never applies an entry that was not committed.
//! - **No save writes an older state over a newer one:** every write of the state file reads
//!   the live state and writes it under one lock.
//! - **Readable when `append` returns.** The wal reads back only durable records, so entries
//!   waiting for their fsync are kept in memory (`unflushed`) until it covers them; a reader
//!   looks there first, then in the wal.
//! - **No holes.** The wal refuses an entry at any LSN but the next. A log that never held an
//!   entry begins where its first entry says; a purged log goes on right after the purged
//!   entry, also when it was purged past its end (a snapshot from another node).
//! - **The last purged log id is durable before the records go:** after a crash between the
//!   two, the start finds the state file ahead of the wal and purges again.
//! - **Truncation is durable when it returns**, and never reaches purged entries.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};
use serde::{Deserialize, Serialize};
use wal::{codec, Lsn, Wal};

use crate::error::{Error, Result};
use crate::types::{Entry, LogId, Record, TypeConfig, Vote};

/// The Raft state that is not log entries, kept durable in the wal's state file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaftState {
    /// The last vote this node saved: never forgotten, or it could vote twice in one term.
    pub vote: Option<Vote>,
    /// The last committed log id this node learned, so a restart re-applies up to it at once
    /// instead of waiting for a leader.
    pub committed: Option<LogId>,
    /// The log id of the last entry purged (the log begins after it).
    pub last_purged: Option<LogId>,
}

/// The Raft log store of one group on its own wal. A cheap `Clone`: every clone is the same
/// store, and one serves as openraft's log reader.
#[derive(Clone)]
pub struct WalLogStore {
    inner: Arc<Inner>,
}

impl Debug for WalLogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalLogStore").field("dir", &self.inner.wal.dir()).finish_non_exhaustive()
    }
}

/// What the clones share.
struct Inner {
    /// The log's records and state file.
    wal: Wal,
    /// The state as last made durable (only then published here, so a reader never sees a
    /// vote a crash could take back), but for `committed`, which is published at once and
    /// written lazily (module docs).
    state: Mutex<RaftState>,
    /// Held across each write of the state file, from reading the live state to publishing
    /// it, so two writes never cross (an older vote or purge point written last).
    saving: Mutex<()>,
    /// The committed log id the state file holds.
    durable_committed: Mutex<Option<LogId>>,
    /// Entries whose append is queued in the wal but not yet fsynced, by index: the wal does
    /// not read them back before, and openraft reads them as soon as `append` returns.
    unflushed: Mutex<BTreeMap<u64, Entry>>,
    /// Where the entries present begin and end.
    ends: Mutex<Ends>,
    /// Indexes of the entries the last snapshot retains: a purge keeps them (below the log's
    /// beginning, read by [`WalLogStore::read_record`] only), for the domain still reads them
    /// by position (a change feed's retained changes).
    retained: Mutex<Arc<std::collections::BTreeSet<u64>>>,
    /// The log archive's hold, when one runs ([`WalLogStore::hold_for_archive`]).
    archive_hold: Mutex<Option<ArchiveHold>>,
}

/// Given the wal LSN a purge would begin the log after, the LSN above which entries must stay
/// for a log archive that has not taken them yet (the archive decides how far back it holds).
pub type ArchiveHold = Arc<dyn Fn(Lsn) -> Lsn + Send + Sync>;

/// The entries present: indexes `first..=last.index`, none when `last` is `None`.
#[derive(Debug, Clone, Copy)]
struct Ends {
    /// Index of the first entry present (or of the first one to come, when there is none):
    /// the index of the wal's first LSN after its checkpoint.
    first: u64,
    /// Log id of the last entry present.
    last: Option<LogId>,
}

/// The wal LSN of the entry at Raft index `index`.
fn lsn_of(index: u64) -> Lsn {
    index + 1
}

/// The Raft index of the entry at wal LSN `lsn` (> 0).
fn index_of(lsn: Lsn) -> u64 {
    lsn - 1
}

/// Locks a mutex, ignoring poisoning: every critical section here leaves its data whole.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A wal error as openraft's storage traits want it.
fn io_err(e: impl Into<Error>) -> io::Error {
    io::Error::other(e.into())
}

/// Runs blocking wal work (an fsync, a truncation) off the async worker threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> io::Result<T> {
    crate::offload::off_runtime(f).await?.map_err(io_err)
}

impl Inner {
    /// Writes the live state as `change` makes it, durably, then publishes the change (over
    /// the live state, so a committed log id noted meanwhile stays).
    fn write_state(&self, change: impl Fn(&mut RaftState)) -> Result<()> {
        let _one = lock(&self.saving);
        let mut state = lock(&self.state).clone();
        change(&mut state);
        self.wal.save_state(&codec::encode(&state)?)?;
        change(&mut lock(&self.state));
        *lock(&self.durable_committed) = state.committed;
        Ok(())
    }
}

/// Replays nothing: the log store reads entries by position when openraft asks, so a start
/// only needs the wal's own checks (contiguity, frames) and its last LSN.
struct Skip;

impl wal::Replayer for Skip {
    fn checkpoint(
        &mut self,
        _lsn: Lsn,
        _snapshot: &mut dyn io::Read,
    ) -> std::result::Result<(), wal::BoxError> {
        // The "checkpoint" of a Raft log is only its purge point (an empty snapshot).
        Ok(())
    }

    fn record(&mut self, _lsn: Lsn, _payload: &[u8]) -> std::result::Result<(), wal::BoxError> {
        Ok(())
    }

    fn retains(&self, _lsn: Lsn) -> bool {
        // Asked only after a crash between a purge and its sweep marker: the records a
        // snapshot retains are not known yet, so every one left stays until the next purge,
        // which keeps only those ([`WalLogStore::set_retained`]).
        true
    }
}

impl WalLogStore {
    /// Opens (or creates) the log in the data dir `dir` with the wal's default settings.
    /// Blocking: the wal recovers its log (checks every record) before this returns.
    ///
    /// # Errors
    /// As [`WalLogStore::open_with`].
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self> {
        Self::open_with(wal::Config::default_for(dir))
    }

    /// Opens (or creates) the log with the wal settings `config`. Blocking.
    ///
    /// # Errors
    /// Whatever [`Wal::recover`] refuses (damage, a data dir in use), a damaged state file,
    /// an entry or state that does not decode.
    pub fn open_with(config: wal::Config) -> Result<Self> {
        let (wal, report) = Wal::recover(config, &mut Skip)?;
        let state: RaftState = match wal.state()? {
            Some(bytes) => codec::decode(&bytes)?,
            None => RaftState::default(),
        };
        // A crash between saving the last purged log id and purging: purge again. Which
        // records the last snapshot retains is not known yet, so every one stays, as the wal's
        // own recovery keeps them ([`Skip`]), until the next purge keeps only those.
        if let Some(purged) = &state.last_purged {
            if report.checkpoint_lsn.unwrap_or(0) < lsn_of(purged.index) {
                wal.purge_through_retaining(lsn_of(purged.index), &|_| true)?;
            }
        }
        let floor = wal.stats().checkpoint_lsn;
        let last_lsn = wal.last_lsn();
        let last = if last_lsn > floor { Some(read_entry(&wal, last_lsn)?.log_id) } else { None };
        let ends = Ends { first: index_of(floor + 1), last };
        tracing::debug!(dir = %wal.dir().display(), ?ends, ?state, "raft log opened");
        Ok(WalLogStore {
            inner: Arc::new(Inner {
                wal,
                durable_committed: Mutex::new(state.committed),
                state: Mutex::new(state),
                saving: Mutex::new(()),
                unflushed: Mutex::new(BTreeMap::new()),
                ends: Mutex::new(ends),
                retained: Mutex::default(),
                archive_hold: Mutex::default(),
            }),
        })
    }

    /// The Raft state as last saved.
    pub fn raft_state(&self) -> RaftState {
        lock(&self.inner.state).clone()
    }

    /// Stops the wal: queued entries are flushed, the data dir is released (it can be opened
    /// again, in this process too). Every clone stops with it.
    ///
    /// # Errors
    /// The wal's failure, if it had failed.
    pub fn shutdown(&self) -> Result<()> {
        self.persist_committed()?;
        Ok(self.inner.wal.shutdown()?)
    }

    /// The record the entry at `index` carries, if the log holds that entry and it is a
    /// record applied where it stands ([`Record::belongs_at`]); `None` for a blank or
    /// membership entry, a skipped record, or an index the log does not hold. Blocking. The
    /// caller asks only for committed indexes: an entry past the commit point may still be
    /// replaced.
    ///
    /// # Errors
    /// The wal failing to read, or an entry that does not decode.
    pub fn read_record(&self, index: u64) -> Result<Option<Record>> {
        Ok(self.entry(index)?.and_then(|entry| match entry.payload {
            openraft::EntryPayload::Normal(record) if record.belongs_at(index) => Some(record),
            _ => None,
        }))
    }

    /// The log id of the entry at `index`, if the log holds it. Blocking.
    ///
    /// # Errors
    /// The wal failing to read, or an entry that does not decode.
    pub fn log_id_at(&self, index: u64) -> Result<Option<LogId>> {
        if index < lock(&self.inner.ends).first {
            return Ok(None);
        }
        Ok(self.entry(index)?.map(|entry| entry.log_id))
    }

    /// Whether the log has never held anything: no entry, no vote, nothing purged.
    pub fn is_pristine(&self) -> bool {
        let state = lock(&self.inner.state);
        lock(&self.inner.ends).last.is_none() && state.vote.is_none() && state.last_purged.is_none()
    }

    /// What the entry at `index` holds for a copy of the committed log (a log archive):
    /// `None` when the log does not hold the entry, `Some(None)` when it holds no record to
    /// apply (a blank or membership entry, a skipped record), else its record. Blocking; the
    /// caller asks only for committed indexes, as for [`WalLogStore::read_record`].
    ///
    /// # Errors
    /// As [`WalLogStore::read_record`].
    pub fn read_for_archive(&self, index: u64) -> Result<Option<Option<Record>>> {
        Ok(self.entry(index)?.map(|entry| match entry.payload {
            openraft::EntryPayload::Normal(record) if record.belongs_at(index) => Some(record),
            _ => None,
        }))
    }

    /// Makes every later purge keep the entries `hold` says a log archive has not taken (read
    /// back by [`WalLogStore::read_for_archive`], below the log's beginning as retained ones are).
    pub fn hold_for_archive(&self, hold: ArchiveHold) {
        *lock(&self.inner.archive_hold) = Some(hold);
    }

    /// The data dir the log is in.
    pub fn dir(&self) -> &std::path::Path {
        self.inner.wal.dir()
    }

    /// The entries the last snapshot retains.
    pub fn retained(&self) -> Arc<std::collections::BTreeSet<u64>> {
        Arc::clone(&lock(&self.inner.retained))
    }

    /// Sets the entries the last snapshot retains, which every later purge keeps.
    pub fn set_retained(&self, indexes: std::collections::BTreeSet<u64>) {
        *lock(&self.inner.retained) = Arc::new(indexes);
    }

    /// The raw stored entries at `indexes` that the log holds (each its encoded [`Entry`]),
    /// in order: what a snapshot carries so that a node given it reads them as this one
    /// does. Blocking.
    ///
    /// # Errors
    /// The wal failing to read.
    pub fn raw_entries(
        &self,
        indexes: &std::collections::BTreeSet<u64>,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        let mut found = Vec::with_capacity(indexes.len());
        for &index in indexes {
            let raw = match lock(&self.inner.unflushed).get(&index) {
                Some(entry) => Some(codec::encode(entry)?),
                None => self.inner.wal.read(lsn_of(index))?,
            };
            if let Some(raw) = raw {
                found.push((index, raw));
            }
        }
        Ok(found)
    }

    /// Sets the entries the last snapshot retains (raw entries as
    /// [`WalLogStore::raw_entries`] gives them), writing back below the log's beginning any of
    /// them the log no longer holds. Blocking.
    ///
    /// # Errors
    /// The wal failing to read or write.
    pub fn keep_retained(&self, retained: &[(u64, Vec<u8>)]) -> Result<()> {
        let floor = self.inner.wal.stats().checkpoint_lsn;
        let mut missing = Vec::new();
        for (index, raw) in retained {
            let lsn = lsn_of(*index);
            if lsn <= floor && self.inner.wal.read(lsn)?.is_none() {
                missing.push((lsn, raw.clone()));
            }
        }
        if !missing.is_empty() {
            tracing::warn!(
                records = missing.len(),
                "records the last snapshot retains were missing from the log: written back"
            );
            self.inner.wal.keep_below_checkpoint(&missing)?;
        }
        self.set_retained(retained.iter().map(|(index, _)| *index).collect());
        Ok(())
    }

    /// Makes the log begin after `last`, the last log id of a snapshot this node installed
    /// from another, holding below it only `retained` (raw entries as
    /// [`WalLogStore::raw_entries`] gives them), and keeps those at every later purge. The
    /// last purged log id is durable first, as a purge's. Blocking.
    ///
    /// # Errors
    /// The wal failing to write, or an entry that is not at or below `last`.
    pub fn begin_after_snapshot(&self, last: LogId, retained: &[(u64, Vec<u8>)]) -> Result<()> {
        if lock(&self.inner.state).last_purged.is_none_or(|purged| purged < last) {
            self.inner.write_state(|state| state.last_purged = Some(last))?;
        }
        // Nothing below `last` is kept from this node's own log: the snapshot's records are
        // the committed ones, and an entry here may be one a newer leader replaced.
        if self.inner.wal.stats().checkpoint_lsn < lsn_of(last.index) {
            self.inner.wal.purge_through(lsn_of(last.index))?;
        }
        let records: Vec<(Lsn, Vec<u8>)> =
            retained.iter().map(|(index, raw)| (lsn_of(*index), raw.clone())).collect();
        self.inner.wal.keep_below_checkpoint(&records)?;
        self.set_retained(retained.iter().map(|(index, _)| *index).collect());
        let mut unflushed = lock(&self.inner.unflushed);
        *unflushed = unflushed.split_off(&(last.index + 1));
        drop(unflushed);
        let mut ends = lock(&self.inner.ends);
        ends.first = ends.first.max(last.index + 1);
        if ends.last.is_some_and(|l| l.index <= last.index) {
            ends.last = None;
        }
        Ok(())
    }

    /// The wal's counters, for metrics.
    pub fn stats(&self) -> wal::WalStats {
        self.inner.wal.stats()
    }

    /// Saves the state `change` makes of the current one, durably, then publishes it.
    async fn save(&self, change: impl Fn(&mut RaftState) + Send + 'static) -> io::Result<()> {
        let inner = Arc::clone(&self.inner);
        blocking(move || inner.write_state(change)).await
    }

    /// Writes the committed log id this node learned to the state file, if it holds an older
    /// one (see the module docs). Blocking.
    ///
    /// # Errors
    /// The state file could not be written.
    pub fn persist_committed(&self) -> Result<()> {
        let noted = lock(&self.inner.state).committed;
        if *lock(&self.inner.durable_committed) == noted {
            return Ok(());
        }
        // The live state as it is: the committed log id noted is part of it.
        self.inner.write_state(|_| {})
    }

    /// The entry at `index`: waiting for its fsync, or in the wal.
    fn entry(&self, index: u64) -> Result<Option<Entry>> {
        if let Some(entry) = lock(&self.inner.unflushed).get(&index) {
            return Ok(Some(entry.clone()));
        }
        // Not waiting any more, so durable (entries leave `unflushed` only once they are).
        match self.inner.wal.read(lsn_of(index))? {
            Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
            None => Ok(None),
        }
    }
}

/// Reads and decodes the durable record at `lsn`, which must be there.
fn read_entry(wal: &Wal, lsn: Lsn) -> Result<Entry> {
    let bytes = wal.read(lsn)?.ok_or(Error::MissingEntry { index: index_of(lsn) })?;
    Ok(codec::decode(&bytes)?)
}

impl RaftLogReader<TypeConfig> for WalLogStore {
    /// The entries present in `range`, in order. Blocking reads of the wal: its recent records
    /// are in sled's cache.
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        let ends = *lock(&self.inner.ends);
        let Some(last) = ends.last else { return Ok(Vec::new()) };
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        }
        .max(ends.first);
        let end = match range.end_bound() {
            Bound::Included(&i) => i.saturating_add(1),
            Bound::Excluded(&i) => i,
            Bound::Unbounded => u64::MAX,
        }
        .min(last.index + 1);
        let mut entries = Vec::with_capacity(end.saturating_sub(start).min(4096) as usize);
        for index in start..end {
            match self.entry(index).map_err(io_err)? {
                Some(entry) => entries.push(entry),
                // Purged meanwhile (the range began too early) or truncated (it ended too
                // late): what is present is a contiguous run; stop at its end.
                None if entries.is_empty() => continue,
                None => break,
            }
        }
        Ok(entries)
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        Ok(lock(&self.inner.state).vote)
    }
}

impl RaftLogStorage<TypeConfig> for WalLogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> io::Result<LogState<TypeConfig>> {
        let last_purged = lock(&self.inner.state).last_purged;
        let last = lock(&self.inner.ends).last;
        // Purged past its end, the log's last log id is the purged one.
        Ok(LogState { last_purged_log_id: last_purged, last_log_id: last.max(last_purged) })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        let vote = *vote;
        self.save(move |state| state.vote = Some(vote)).await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        // Written lazily (module docs): openraft awaits this before it applies.
        lock(&self.inner.state).committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> io::Result<Option<LogId>> {
        Ok(lock(&self.inner.state).committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
            callback.io_completed(Ok(()));
            return Ok(());
        };
        let (first_index, last_id) = (first.log_id.index, last.log_id);
        if entries.iter().zip(first_index..).any(|(e, index)| e.log_id.index != index) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("entries to append are not consecutive from index {first_index}"),
            ));
        }
        let wal = self.inner.wal.clone();
        // A log that never held an entry may begin at any index (openraft's own storage suite
        // starts logs anywhere): move the wal's beginning there. After a purge the log goes on
        // right after the purged entry (a node given a snapshot purges through it first), and
        // anywhere else the wal refuses a gap below.
        let never_held =
            lock(&self.inner.state).last_purged.is_none() && lock(&self.inner.ends).last.is_none();
        if never_held && lsn_of(first_index) > wal.last_lsn() + 1 {
            let at = lsn_of(first_index) - 1;
            let purging = wal.clone();
            blocking(move || Ok(purging.purge_through(at)?)).await?;
            lock(&self.inner.ends).first = first_index;
        }
        let payloads = entries.iter().map(codec::encode).collect::<wal::Result<Vec<_>>>();
        let commit = wal.append_batch_at(lsn_of(first_index), payloads.map_err(io_err)?);
        let commit = commit.map_err(io_err)?;
        lock(&self.inner.unflushed).extend(entries.into_iter().map(|e| (e.log_id.index, e)));
        lock(&self.inner.ends).last = Some(last_id);
        let inner = Arc::clone(&self.inner);
        let flushed = move |flushed: wal::Result<Lsn>| {
            // Drop what the wal now serves itself. By the durable LSN, not this append's own:
            // after a truncation the same indexes may hold newer entries still waiting. Read
            // under the lock: every entry in the map then, up to that LSN, is durable.
            let mut unflushed = lock(&inner.unflushed);
            let durable = inner.wal.durable_lsn();
            *unflushed = unflushed.split_off(&index_of(durable + 1));
            drop(unflushed);
            callback.io_completed(flushed.map(drop).map_err(io_err));
        };
        if cfg!(feature = "sim") {
            // A simulation's clock must not move while the disk works: wait here.
            flushed(commit.wait());
            return Ok(());
        }
        // The group commit covering the last entry (and so every earlier one) is fsynced.
        tokio::spawn(async move { flushed(commit.await) });
        Ok(())
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> io::Result<()> {
        let keep = last_log_id.map_or(0, |id| lsn_of(id.index));
        let wal = self.inner.wal.clone();
        blocking(move || Ok(wal.truncate_after(keep)?)).await?;
        let mut unflushed = lock(&self.inner.unflushed);
        unflushed.split_off(&index_of(keep + 1));
        drop(unflushed);
        let mut ends = lock(&self.inner.ends);
        ends.last = match last_log_id {
            // Every entry present was above it.
            None => None,
            Some(id) if id.index < ends.first => None,
            Some(id) => match ends.last {
                Some(last) if id.index < last.index => Some(id),
                // Nothing above it to remove.
                unchanged => unchanged,
            },
        };
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        if lock(&self.inner.state).last_purged.is_some_and(|purged| purged >= log_id) {
            return Ok(());
        }
        // Durable first: the start after a crash completes a purge it finds half done.
        self.save(move |state| state.last_purged = Some(log_id)).await?;
        let wal = self.inner.wal.clone();
        let retained = Arc::clone(&lock(&self.inner.retained));
        let archive_hold = lock(&self.inner.archive_hold).clone();
        blocking(move || {
            let lsn = lsn_of(log_id.index);
            if wal.stats().checkpoint_lsn >= lsn {
                return Ok(());
            }
            let archive = archive_hold.map(|hold| hold(lsn)).filter(|above| *above < lsn);
            // The records the last snapshot retains, and those the archive has not taken, stay
            // below the log's new beginning; also when this copy's own fsync of the entries
            // purged has not come yet (a quorum of the others made them committed).
            let keeps = |l: Lsn| retained.contains(&index_of(l)) || archive.is_some_and(|a| l > a);
            Ok(wal.purge_through_retaining(lsn, &keeps)?)
        })
        .await?;
        let mut unflushed = lock(&self.inner.unflushed);
        *unflushed = unflushed.split_off(&(log_id.index + 1));
        drop(unflushed);
        let mut ends = lock(&self.inner.ends);
        ends.first = ends.first.max(log_id.index + 1);
        if ends.last.is_some_and(|last| last.index <= log_id.index) {
            ends.last = None;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures_util::FutureExt;
    use openraft::type_config::TypeConfigExt;
    use openraft::EntryPayload;

    use super::*;

    fn entry(index: u64) -> Entry {
        let leader = openraft::impls::leader_id_adv::LeaderId { term: 1, node_id: 1 };
        let record = Record::unplaced(0, format!("record {index}").into_bytes());
        Entry { log_id: LogId::new(leader, index), payload: EntryPayload::Normal(record) }
    }

    /// The pitfall other stores fell into: acknowledging an append before it is on disk.
    /// With the wal's group commit held, the entries are readable but not acknowledged.
    #[allow(
        clippy::await_holding_lock,
        reason = "the guard holds the wal's commit thread on purpose; nothing awaited takes it"
    )]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_append_is_acknowledged_only_once_fsynced() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = WalLogStore::open(dir.path()).unwrap();
        let wal = store.inner.wal.clone();
        let held = wal.hold_commits();
        let (tx, mut rx) = TypeConfig::oneshot();
        let entries: Vec<Entry> = (0..5).map(entry).collect();
        store.append(entries.clone(), IOFlushed::signal(tx)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!((&mut rx).now_or_never().is_none(), "acknowledged before the fsync");
        assert_eq!(wal.durable_lsn(), 0);
        assert_eq!(store.try_get_log_entries(0..5).await.unwrap(), entries, "readable meanwhile");
        drop(held);
        rx.await.unwrap().unwrap();
        assert_eq!(wal.durable_lsn(), lsn_of(4));
        assert!(lock(&store.inner.unflushed).is_empty(), "the wal serves them now");
        assert_eq!(store.try_get_log_entries(..).await.unwrap(), entries);
    }

    /// A truncation that comes while an append waits for its fsync: the waiting entries are
    /// written, then removed, and their replacements are read back, not them.
    #[allow(
        clippy::await_holding_lock,
        reason = "the guard holds the wal's commit thread on purpose; nothing awaited takes it"
    )]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_truncation_removes_entries_still_waiting_for_their_fsync() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = WalLogStore::open(dir.path()).unwrap();
        let (tx, rx) = TypeConfig::oneshot();
        store.append((0..3).map(entry).collect::<Vec<_>>(), IOFlushed::signal(tx)).await.unwrap();
        rx.await.unwrap().unwrap();
        let wal = store.inner.wal.clone();
        let held = wal.hold_commits();
        let (tx, rx) = TypeConfig::oneshot();
        store.append((3..6).map(entry).collect::<Vec<_>>(), IOFlushed::signal(tx)).await.unwrap();
        let truncating = {
            let mut store = store.clone();
            tokio::spawn(async move { store.truncate_after(Some(entry(3).log_id)).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(held);
        truncating.await.unwrap().unwrap();
        rx.await.unwrap().unwrap();
        let mut replacement = entry(4);
        replacement.log_id =
            LogId::new(openraft::impls::leader_id_adv::LeaderId { term: 2, node_id: 2 }, 4);
        let (tx, rx) = TypeConfig::oneshot();
        store.append(vec![replacement.clone()], IOFlushed::signal(tx)).await.unwrap();
        rx.await.unwrap().unwrap();
        let mut expected: Vec<Entry> = (0..4).map(entry).collect();
        expected.push(replacement);
        assert_eq!(store.try_get_log_entries(..).await.unwrap(), expected);
    }

    /// A purge keeps the entries a log archive has not taken (as the hold says), readable
    /// below the log's new beginning, and drops the rest; an entry that holds no record reads
    /// as held but empty, one purged as not held.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_purge_keeps_what_the_archive_has_not_taken() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = WalLogStore::open(dir.path()).unwrap();
        // One append each: the wal keeps a batch's records together (a pack), all or none.
        for index in 0..10 {
            let mut one = entry(index);
            if index == 2 {
                one.payload = EntryPayload::Blank;
            }
            let (tx, rx) = TypeConfig::oneshot();
            store.append(vec![one], IOFlushed::signal(tx)).await.unwrap();
            rx.await.unwrap().unwrap();
        }
        // The archive took every entry up to index 3 (LSN 4).
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&asked);
        store.hold_for_archive(Arc::new(move |lsn| {
            lock(&seen).push(lsn);
            lsn_of(3)
        }));
        assert_eq!(store.read_for_archive(2).unwrap(), Some(None), "a blank entry is held, empty");
        store.purge(entry(7).log_id).await.unwrap();
        assert_eq!(*lock(&asked), [lsn_of(7)]);
        for index in 0..=3 {
            assert_eq!(store.read_for_archive(index).unwrap(), None, "{index} was archived");
        }
        for index in 4..10 {
            let kept = store.read_for_archive(index).unwrap().flatten();
            assert_eq!(kept.map(|r| r.payload), Some(format!("record {index}").into_bytes()));
        }
        assert_eq!(store.get_log_state().await.unwrap().last_purged_log_id, Some(entry(7).log_id));
        // Without a hold, the next purge drops them.
        *lock(&store.inner.archive_hold) = None;
        store.purge(entry(8).log_id).await.unwrap();
        assert_eq!(store.read_for_archive(5).unwrap(), None);
        assert!(store.read_for_archive(9).unwrap().is_some());
    }

    /// An entry stored alone: the wal keeps a group's small records together (a pack, kept
    /// or dropped whole), and 20 KB that do not compress fill a pack of their own.
    fn large_entry(index: u64) -> Entry {
        let mut x = index.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let bytes = (0..20_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()[0]
            })
            .collect();
        Entry { payload: EntryPayload::Normal(Record::unplaced(0, bytes)), ..entry(index) }
    }

    /// A purge keeps the records the last snapshot retains also when it comes before this
    /// copy's own fsync of the entries it purges (committed by a quorum of the other copies),
    /// and a start that finishes a purge a crash cut short keeps every record, not knowing
    /// yet which are retained.
    #[allow(
        clippy::await_holding_lock,
        reason = "the guard holds the wal's commit thread on purpose; nothing awaited takes it"
    )]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_purge_keeps_retained_records_before_its_own_fsync_and_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut store = WalLogStore::open(dir.path()).unwrap();
            store.set_retained(std::collections::BTreeSet::from([2]));
            let wal = store.inner.wal.clone();
            let held = wal.hold_commits();
            let mut flushed = Vec::new();
            for index in 0..6 {
                let (tx, rx) = TypeConfig::oneshot();
                store.append(vec![large_entry(index)], IOFlushed::signal(tx)).await.unwrap();
                flushed.push(rx);
            }
            assert_eq!(wal.durable_lsn(), 0);
            let purging = {
                let mut store = store.clone();
                tokio::spawn(async move { store.purge(entry(4).log_id).await })
            };
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(held);
            purging.await.unwrap().unwrap();
            for rx in flushed {
                rx.await.unwrap().unwrap();
            }
            assert!(store.read_record(2).unwrap().is_some(), "a retained record was purged");
            assert!(store.read_record(3).unwrap().is_none());
            assert!(store.read_record(5).unwrap().is_some());
            // A crash between saving the next purge point and purging.
            store.inner.write_state(|state| state.last_purged = Some(entry(5).log_id)).unwrap();
            store.shutdown().unwrap();
        }
        let store = WalLogStore::open(dir.path()).unwrap();
        assert_eq!(store.log_id_at(5).unwrap(), None, "the purge was finished");
        assert!(store.read_record(2).unwrap().is_some(), "a retained record was purged");
    }
}
