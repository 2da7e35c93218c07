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
//! - A snapshot is a state the domain gives ([`DomainSnapshot`]) at an index it names, at or
//!   below the last applied one: taken under the lock that applying holds, so no entry is
//!   applied between the two, and written out after. Its metadata names the log id and the
//!   membership in force at that index. A leader's domain gives the checkpoint its actors
//!   prepared; a follower's, its applied state.
//! - A snapshot carries the raw entries at or below its index that the state still reads by
//!   position (a change feed's retained changes). The log keeps them below its beginning at
//!   every purge, and a node that installs the snapshot writes them there.
//! - The last snapshot (built, or installed from the leader) is kept in `raft-snapshot` in the
//!   data dir, written to a temporary name, fsynced and renamed, and read from there by
//!   position when sent or installed: never held whole in memory. Its bytes are one zstd
//!   stream, compressed as the state is written and decompressed as it is installed. A start installs it into the
//!   domain and openraft re-applies the committed entries after it. The log store purges only
//!   what a snapshot covers, so the two together always hold every committed record.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures_util::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::type_config::alias::SnapshotOf;
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};
use wal::codec;

use crate::types::{Applied, LogId, NodeId, SnapshotMeta, StoredMembership, TypeConfig};
use crate::{SnapshotData, WalLogStore};

/// The domain under a [`Machine`].
pub trait Apply: Send + 'static {
    /// Applies the committed record at `index`.
    ///
    /// # Errors
    /// The record cannot be applied (damaged, or from a newer build): the node stops applying,
    /// and openraft stops with it.
    fn apply(&mut self, index: u64, payload: &[u8]) -> io::Result<()>;

    /// After a run of entries was applied (records, and entries the domain does not see:
    /// blanks, membership changes): everything through `index` is applied. The domain may
    /// publish what the run changed.
    fn applied(&mut self, _index: u64) {}

    /// The state to snapshot now, having applied everything through `last_applied`; `None`
    /// when the domain has none to give (openraft then builds no snapshot this time). Called
    /// while nothing is applied; the bytes are written after, outside that exclusion.
    ///
    /// # Errors
    /// The state cannot be taken.
    fn snapshot(&mut self, last_applied: u64) -> io::Result<Option<DomainSnapshot>>;

    /// Replaces the whole state with `snapshot`, whose [`DomainSnapshot::index`] was `index`.
    ///
    /// # Errors
    /// The bytes are not a snapshot this build reads; the state is left as it was.
    fn install(&mut self, index: u64, snapshot: &mut dyn Read) -> io::Result<()>;
}

/// A state the domain gives to be snapshotted.
///
/// Invariant: the state holds every committed record at or below `index`, and applying the
/// records after `index` to it, in order, gives the state that applying them to the exact
/// state at `index` gives (it may hold some of them already: the domain applies by overwrite).
pub struct DomainSnapshot {
    /// See the type's invariant; at most the last applied index.
    pub index: u64,
    /// Indexes at or below `index` whose records the state still reads back from the log (a
    /// change feed's retained changes): a purge keeps them, and the snapshot carries them to
    /// a node that installs it.
    pub retained: BTreeSet<u64>,
    /// Writes the state's bytes, as [`Apply::install`] reads them.
    pub write: WriteState,
}

/// Writes a state's bytes.
pub type WriteState = Box<dyn FnOnce(&mut dyn Write) -> io::Result<()> + Send>;

/// Raw stored entries by index, as [`WalLogStore::raw_entries`] gives them.
type RawEntries = Vec<(u64, Vec<u8>)>;

/// The file the last snapshot is kept in.
pub(crate) const SNAPSHOT_FILE: &str = "raft-snapshot";

/// The first bytes of `raft-snapshot` as it is written now: `[MAGIC][meta len u64 LE][meta,
/// encoded][the snapshot's bytes]`, read by position so the bytes are never loaded whole. A
/// file without them is of the older form (one encoded [`StoredSnapshot`]), which a start still
/// reads and writes again in this one.
const MAGIC: &[u8; 8] = b"sheetdR2";

/// Where a kept snapshot's metadata begins: after the magic and the metadata's length.
const HEAD_AT: u64 = MAGIC.len() as u64 + 8;

/// The older form of `raft-snapshot`: the snapshot's metadata, then its bytes, encoded as one.
#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
}

/// Writes a snapshot's bytes to `out`: `[len u64 LE][head, encoded][the domain's bytes, as
/// `domain` writes them]`, the head holding the retained entries as `(index, raw stored
/// entry)` pairs ([`WalLogStore::raw_entries`]) and the former members.
pub(crate) fn write_packed(
    out: &mut dyn Write,
    retained: &[(u64, Vec<u8>)],
    former: &BTreeSet<NodeId>,
    domain: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    let retained: Vec<(u64, &serde_bytes::Bytes)> =
        retained.iter().map(|(i, raw)| (*i, serde_bytes::Bytes::new(raw))).collect();
    let head = codec::encode(&(retained, former)).map_err(io::Error::other)?;
    out.write_all(&(head.len() as u64).to_le_bytes())?;
    out.write_all(&head)?;
    domain(out)
}

/// [`write_packed`] compressed as it goes, one zstd stream at level 1: what a snapshot built
/// here holds (see [`packed_reader`]).
pub(crate) fn write_packed_compressed(
    out: &mut dyn Write,
    retained: &[(u64, Vec<u8>)],
    former: &BTreeSet<NodeId>,
    domain: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    let mut compressed = zstd::stream::write::Encoder::new(out, 1)?;
    write_packed(&mut compressed, retained, former, domain)?;
    compressed.finish()?;
    Ok(())
}

/// A reader of what [`write_packed`] wrote into `data`: through zstd when the bytes are a
/// zstd stream ([`write_packed_compressed`]), as they are otherwise (a snapshot kept or sent
/// by an earlier build). The two cannot be mistaken: a packed snapshot begins with its head's
/// length, and one beginning with zstd's magic number would claim a head of gigabytes.
fn packed_reader(data: &SnapshotData) -> io::Result<Box<dyn Read + '_>> {
    const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
    if data.read_at(0, 4)? == ZSTD_MAGIC {
        Ok(Box::new(zstd::stream::read::Decoder::new(data.reader())?))
    } else {
        Ok(Box::new(data.reader()))
    }
}

/// [`write_packed`] into memory.
pub(crate) fn pack(
    retained: &[(u64, Vec<u8>)],
    former: &BTreeSet<NodeId>,
    domain: &[u8],
) -> io::Result<Vec<u8>> {
    let mut data = Vec::with_capacity(domain.len() + 64);
    write_packed(&mut data, retained, former, |out| out.write_all(domain))?;
    Ok(data)
}

/// Keeps `meta` and the bytes `write` writes (verbatim) as the last snapshot of the data dir
/// `dir`, durably: written to a temporary name, fsynced, renamed, the directory fsynced. Returns the
/// kept bytes, read from the file.
pub(crate) fn keep_snapshot(
    dir: &Path,
    meta: &SnapshotMeta,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<SnapshotData> {
    let head = kept_head(meta)?;
    let tmp = dir.join(format!("{SNAPSHOT_FILE}.tmp"));
    let file =
        fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&tmp)?;
    let mut out = io::BufWriter::with_capacity(1 << 20, file);
    out.write_all(&head)?;
    write(&mut out)?;
    let file = out.into_inner().map_err(io::IntoInnerError::into_error)?;
    file.sync_all()?;
    fs::rename(&tmp, dir.join(SNAPSHOT_FILE))?;
    File::open(dir)?.sync_all()?;
    // The bytes from the handle that wrote them: the layout `read_kept` reads.
    let start = head.len() as u64;
    let len = file.metadata()?.len() - start;
    Ok(SnapshotData::File { file: Arc::new(file), start, len, spooled: None })
}

/// What `raft-snapshot` holds before a snapshot's bytes when it keeps `meta`'s: the magic, the
/// metadata's length and the metadata. A receiver gathers a snapshot's parts after it
/// ([`crate::Spool::to_keep`]), so that keeping it is a rename.
///
/// # Errors
/// The metadata cannot be encoded.
pub fn kept_head(meta: &SnapshotMeta) -> io::Result<Vec<u8>> {
    let encoded = codec::encode(meta).map_err(io::Error::other)?;
    let mut head = Vec::with_capacity(HEAD_AT as usize + encoded.len());
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&(encoded.len() as u64).to_le_bytes());
    head.extend_from_slice(&encoded);
    Ok(head)
}

/// Keeps `data` as the last snapshot of `dir`, `meta`'s, by renaming the file it was gathered
/// in, when that file is a spool of `dir` laid out for `meta` ([`crate::Spool::to_keep`]):
/// fsynced, renamed, the directory fsynced. `false` when `data` is anything else, or the
/// rename failed: then it is kept by a copy.
fn keep_spooled(dir: &Path, meta: &SnapshotMeta, data: &SnapshotData) -> io::Result<bool> {
    let SnapshotData::File { file, spooled: Some(name), .. } = data else { return Ok(false) };
    if name.path().parent() != Some(dir) || name.head() != kept_head(meta)? {
        return Ok(false);
    }
    file.sync_all()?;
    if let Err(e) = fs::rename(name.path(), dir.join(SNAPSHOT_FILE)) {
        tracing::warn!(error = %e, "a gathered snapshot not renamed to be kept: copied instead");
        return Ok(false);
    }
    name.kept();
    File::open(dir)?.sync_all()?;
    Ok(true)
}

/// The snapshot kept in the data dir `dir`: its metadata, and its bytes still in the file
/// (only the head is read); `None` when there is none.
///
/// # Errors
/// The file cannot be read, or is damaged.
pub(crate) fn read_kept(dir: &Path) -> io::Result<Option<(SnapshotMeta, SnapshotData)>> {
    let path = dir.join(SNAPSHOT_FILE);
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let damaged = || io::Error::new(io::ErrorKind::InvalidData, "a damaged Raft snapshot file");
    let len = file.metadata()?.len();
    let mut word = [0u8; 8];
    if len >= HEAD_AT {
        file.read_exact_at(&mut word, 0)?;
    }
    if len < HEAD_AT || &word != MAGIC {
        // The older form.
        let stored: StoredSnapshot = codec::decode(&fs::read(&path)?).map_err(|_| damaged())?;
        return Ok(Some((stored.meta, SnapshotData::Bytes(stored.data))));
    }
    file.read_exact_at(&mut word, MAGIC.len() as u64)?;
    let head_len = u64::from_le_bytes(word);
    if head_len > len - HEAD_AT || head_len > 1 << 30 {
        return Err(damaged());
    }
    let mut head = vec![0u8; head_len as usize];
    file.read_exact_at(&mut head, HEAD_AT)?;
    let meta: SnapshotMeta = codec::decode(&head).map_err(|_| damaged())?;
    let start = HEAD_AT + head_len;
    let data = SnapshotData::File { file: Arc::new(file), start, len: len - start, spooled: None };
    Ok(Some((meta, data)))
}

/// Reads the head [`write_packed`] wrote from `input` (see [`packed_reader`]): the retained
/// entries and the former members. `input` is left at the domain's bytes.
fn read_head(input: &mut dyn Read) -> io::Result<(RawEntries, BTreeSet<NodeId>)> {
    let damaged = || io::Error::new(io::ErrorKind::InvalidData, "a damaged Raft snapshot");
    let mut word = [0u8; 8];
    input.read_exact(&mut word).map_err(|_| damaged())?;
    let len = u64::from_le_bytes(word);
    // Read as it comes, not allocated up front: a damaged length ends at the end of the bytes.
    let mut head = Vec::new();
    input.take(len).read_to_end(&mut head)?;
    if head.len() as u64 != len {
        return Err(damaged());
    }
    let (retained, former): (Vec<(u64, serde_bytes::ByteBuf)>, BTreeSet<NodeId>) =
        codec::decode(&head).map_err(io::Error::other)?;
    Ok((retained.into_iter().map(|(i, raw)| (i, raw.into_vec())).collect(), former))
}

/// The state machine over `A`. A cheap `Clone`: every clone is the same machine, and one
/// serves as its snapshot builder.
pub struct Machine<A: Apply> {
    inner: Arc<Mutex<Inner<A>>>,
    dir: PathBuf,
    store: WalLogStore,
    /// The state taken for the snapshot being built (by `try_create_snapshot_builder`).
    taken: Arc<Mutex<Option<(LogId, StoredMembership, DomainSnapshot)>>>,
    /// Held while a snapshot is written to `raft-snapshot`. openraft builds a snapshot in a
    /// task of its own, so a build can overlap an install from the leader: one at a time, and
    /// a build never replaces a newer snapshot kept meanwhile.
    keeping: Arc<Mutex<()>>,
    counts: Arc<Counters>,
}

/// Snapshots a node built, installed and sent since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotCounts {
    /// Built from this node's own state.
    pub built: u64,
    /// Installed from another node's.
    pub installed: u64,
    /// Sent to a peer that installed them (counted by the link).
    pub sent: u64,
}

#[derive(Default)]
struct Counters {
    built: std::sync::atomic::AtomicU64,
    installed: std::sync::atomic::AtomicU64,
}

impl<A: Apply> Clone for Machine<A> {
    fn clone(&self) -> Self {
        Machine {
            inner: Arc::clone(&self.inner),
            dir: self.dir.clone(),
            store: self.store.clone(),
            taken: Arc::clone(&self.taken),
            keeping: Arc::clone(&self.keeping),
            counts: Arc::clone(&self.counts),
        }
    }
}

struct Inner<A> {
    domain: A,
    last_applied: Option<LogId>,
    /// The membership as of the last applied entry, and the ones before it back to the
    /// snapshot's: a snapshot taken at an earlier index names the one in force there.
    memberships: Vec<StoredMembership>,
    /// The metadata of the last snapshot built or installed, kept on disk (its bytes are
    /// read from the file when wanted).
    snapshot: Option<SnapshotMeta>,
    /// Every node that was a member and is no more, as of the last applied entry (a
    /// snapshot carries them): an id is never given to another node.
    former: BTreeSet<NodeId>,
}

impl<A> Inner<A> {
    /// Takes `stored` as the membership from now on, noting who left.
    fn change_membership(&mut self, stored: StoredMembership) {
        let now: BTreeSet<NodeId> = stored.membership().nodes().map(|(id, _)| *id).collect();
        let before = self.membership();
        self.former
            .extend(before.membership().nodes().map(|(id, _)| *id).filter(|id| !now.contains(id)));
        self.memberships.push(stored);
    }

    fn membership(&self) -> StoredMembership {
        self.memberships.last().cloned().unwrap_or_default()
    }

    /// The membership in force at `index`.
    fn membership_at(&self, index: u64) -> StoredMembership {
        self.memberships
            .iter()
            .rev()
            .find(|m| m.log_id().is_none_or(|l| l.index <= index))
            .cloned()
            .unwrap_or_default()
    }
}

impl<A: Apply> Machine<A> {
    /// The machine over `domain` (empty), with the snapshot kept in `dir` installed into it,
    /// over the log `store` (the entries a snapshot retains are read from it and written to
    /// it).
    ///
    /// # Errors
    /// The kept snapshot cannot be read or the domain refuses it.
    pub fn open(dir: &Path, mut domain: A, store: WalLogStore) -> io::Result<Machine<A>> {
        // A leftover that cannot be removed costs disk, not correctness: the start goes on.
        if let Err(e) = crate::snapshot_data::remove_stale_spools(dir) {
            tracing::warn!(error = %e, "a snapshot spool a crash left could not be removed");
        }
        let (mut last_applied, mut memberships, mut snapshot) = (None, Vec::new(), None);
        let mut former = BTreeSet::new();
        if let Some((meta, data)) = read_kept(dir)? {
            let index = meta.last_log_id.map_or(0, |l| l.index);
            let mut input = packed_reader(&data)?;
            let (retained, left) = read_head(&mut input)?;
            former = left;
            domain.install(index, &mut input)?;
            drop(input);
            if let SnapshotData::Bytes(bytes) = &data {
                // Kept in the older form: written again in the one read by position.
                keep_snapshot(dir, &meta, |out| out.write_all(bytes))?;
            }
            if let Some(last) = meta.last_log_id {
                let holds = store.log_id_at(last.index).map_err(io::Error::other)?;
                if holds == Some(last) {
                    // Built here: the log holds the entries it covers, and those it retains
                    // (given back from the snapshot if a purge of an older build dropped one).
                    store.keep_retained(&retained).map_err(io::Error::other)?;
                } else {
                    // Installed from another node, and the log not yet moved past it when
                    // this node stopped: finish that now.
                    store.begin_after_snapshot(last, &retained).map_err(io::Error::other)?;
                }
            }
            last_applied = meta.last_log_id;
            memberships.push(meta.last_membership.clone());
            snapshot = Some(meta);
        }
        let inner = Inner { domain, last_applied, memberships, snapshot, former };
        Ok(Machine {
            inner: Arc::new(Mutex::new(inner)),
            dir: dir.to_owned(),
            store,
            taken: Arc::default(),
            keeping: Arc::default(),
            counts: Arc::default(),
        })
    }

    /// Runs `f` on the domain while nothing is applied.
    pub fn with_domain<T>(&self, f: impl FnOnce(&mut A, Option<LogId>) -> T) -> T {
        let mut inner = self.lock();
        let last = inner.last_applied;
        f(&mut inner.domain, last)
    }

    /// Whether node `id` was a member and is no more.
    pub fn was_member(&self, id: NodeId) -> bool {
        self.lock().former.contains(&id)
    }

    /// Snapshots built and installed since the start.
    pub fn counts(&self) -> SnapshotCounts {
        use std::sync::atomic::Ordering::Relaxed;
        SnapshotCounts {
            built: self.counts.built.load(Relaxed),
            installed: self.counts.installed.load(Relaxed),
            sent: 0,
        }
    }

    /// The last log id of the last snapshot built or installed.
    pub fn snapshot_log_id(&self) -> Option<LogId> {
        self.lock().snapshot.as_ref().and_then(|meta| meta.last_log_id)
    }

    fn lock(&self) -> MutexGuard<'_, Inner<A>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Installs `data`, a snapshot from another node (see `install_snapshot`). Blocking.
    fn install(&self, meta: &SnapshotMeta, data: SnapshotData) -> io::Result<()> {
        let mut input = packed_reader(&data)?;
        let (retained, former) = read_head(&mut input)?;
        let index = meta.last_log_id.map_or(0, |l| l.index);
        // Installed before it is kept: bytes the domain refuses are never kept to be refused
        // again at the next start.
        self.lock().domain.install(index, &mut input)?;
        drop(input);
        // Kept before the log moves past it: a crash in between starts from this snapshot,
        // and the start finishes the move (`Machine::open`). Gathered in parts, the bytes lie
        // in the data dir already, after the head they are kept with: renamed, not copied.
        {
            let _one = self.keeping.lock().unwrap_or_else(PoisonError::into_inner);
            if !keep_spooled(&self.dir, meta, &data)? {
                keep_snapshot(&self.dir, meta, |out| {
                    io::copy(&mut data.reader(), out).map(|_| ())
                })?;
            }
        }
        if let Some(last) = meta.last_log_id {
            self.store.begin_after_snapshot(last, &retained).map_err(io::Error::other)?;
        }
        let mut inner = self.lock();
        inner.last_applied = meta.last_log_id;
        inner.memberships = vec![meta.last_membership.clone()];
        inner.former = former;
        self.counts.installed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(index, bytes = data.len(), retained = retained.len(), "snapshot installed");
        inner.snapshot = Some(meta.clone());
        Ok(())
    }

    /// Takes the domain's state for a snapshot, with the log id and membership at its index.
    fn take(&self) -> io::Result<Option<(LogId, StoredMembership, DomainSnapshot)>> {
        let mut inner = self.lock();
        let Some(last) = inner.last_applied else { return Ok(None) };
        let Some(taken) = inner.domain.snapshot(last.index)? else { return Ok(None) };
        if taken.index > last.index {
            return Err(io::Error::other(format!(
                "the domain offered a snapshot at index {}, past the last applied {}",
                taken.index, last.index
            )));
        }
        if inner
            .snapshot
            .as_ref()
            .is_some_and(|m| m.last_log_id.is_some_and(|l| l.index >= taken.index))
        {
            // Not newer than the one kept: nothing to build.
            return Ok(None);
        }
        let log_id = if taken.index == last.index {
            last
        } else {
            match self.store.log_id_at(taken.index).map_err(io::Error::other)? {
                Some(id) => id,
                None => return Ok(None),
            }
        };
        let membership = inner.membership_at(taken.index);
        Ok(Some((log_id, membership, taken)))
    }
}

impl<A: Apply> RaftSnapshotBuilder<TypeConfig> for Machine<A> {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> io::Result<SnapshotOf<TypeConfig, SnapshotData>> {
        let taken = match self.taken.lock().unwrap_or_else(PoisonError::into_inner).take() {
            Some(taken) => Some(taken),
            None => self.take()?,
        };
        let Some((log_id, membership, domain)) = taken else {
            // Nothing newer to give: the current snapshot, if there is one.
            let (kept, nothing_applied, empty) = {
                let inner = self.lock();
                let empty = SnapshotMeta { last_log_id: None, last_membership: inner.membership() };
                (
                    inner.snapshot.is_some(),
                    inner.last_applied.is_none(),
                    (empty, inner.former.clone()),
                )
            };
            if kept {
                if let Some((meta, snapshot)) = read_kept(&self.dir)? {
                    return Ok(SnapshotOf::<TypeConfig, SnapshotData> { meta, snapshot });
                }
            }
            if nothing_applied {
                // Nothing applied yet (openraft asks at a start whose log was purged without
                // a snapshot): the empty state, not kept.
                let (meta, former) = empty;
                let snapshot = SnapshotData::Bytes(pack(&[], &former, &[])?);
                return Ok(SnapshotOf::<TypeConfig, SnapshotData> { meta, snapshot });
            }
            return Err(io::Error::other("the domain has no state to snapshot yet"));
        };
        // Outside the lock, on a blocking thread: entries go on being applied, and the link's
        // runtime goes on, while the state is written and kept. Written straight to the file:
        // the state is never held whole in memory a second time.
        let meta = SnapshotMeta { last_log_id: Some(log_id), last_membership: membership };
        let machine = self.clone();
        let kept = meta.clone();
        // Everyone who ever left, also after the snapshot's index: ids are never reused.
        let former = self.lock().former.clone();
        let (built, data) = crate::offload::off_runtime(move || {
            let _one = machine.keeping.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((newer, data)) = read_kept(&machine.dir)?
                .filter(|(m, _)| m.last_log_id.is_some_and(|l| l.index >= log_id.index))
            {
                // Installed from the leader while this one was taken: that one stays.
                return Ok::<_, io::Error>((Err(newer), data));
            }
            let retained = machine.store.raw_entries(&domain.retained).map_err(io::Error::other)?;
            let data = keep_snapshot(&machine.dir, &kept, |out| {
                write_packed_compressed(out, &retained, &former, domain.write)
            })?;
            Ok((Ok(retained), data))
        })
        .await??;
        let retained = match built {
            Ok(retained) => retained,
            Err(newer) => {
                tracing::info!(
                    index = log_id.index,
                    "snapshot not kept: a newer one was installed"
                );
                return Ok(SnapshotOf::<TypeConfig, SnapshotData> { meta: newer, snapshot: data });
            }
        };
        self.store.set_retained(retained.iter().map(|(index, _)| *index).collect());
        {
            let mut inner = self.lock();
            let index = log_id.index;
            // Memberships before the one in force at the snapshot are of no more use.
            let keep_from = inner
                .memberships
                .iter()
                .rposition(|m| m.log_id().is_none_or(|l| l.index <= index))
                .unwrap_or(0);
            inner.memberships.drain(..keep_from);
            inner.snapshot = Some(meta.clone());
        }
        self.counts.built.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(
            index = log_id.index,
            bytes = data.len(),
            retained = retained.len(),
            "snapshot built"
        );
        Ok(SnapshotOf::<TypeConfig, SnapshotData> { meta, snapshot: data })
    }
}

impl<A: Apply> RaftStateMachine<TypeConfig> for Machine<A> {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId>, StoredMembership)> {
        let inner = self.lock();
        Ok((inner.last_applied, inner.membership()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> io::Result<()>
    where
        Strm: Stream<Item = io::Result<EntryResponder<TypeConfig>>> + Unpin + OptionalSend,
    {
        let mut last = None;
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
                        let stored = StoredMembership::new(Some(entry.log_id), membership);
                        inner.change_membership(stored);
                    }
                }
                inner.last_applied = Some(entry.log_id);
            }
            if let Some(responder) = responder {
                responder.send(Applied { index, accepted });
            }
            last = Some(index);
        }
        if let Some(index) = last {
            self.lock().domain.applied(index);
        }
        Ok(())
    }

    /// A builder only when the domain has a state to give (a leader's domain gives the
    /// checkpoint it prepared, and none before): openraft then defers the snapshot.
    /// Forced (a start whose log was purged without a snapshot), the builder gives the kept
    /// snapshot, or the empty state when nothing was applied.
    async fn try_create_snapshot_builder(&mut self, force: bool) -> Option<Self::SnapshotBuilder> {
        match self.take() {
            Ok(Some(taken)) => {
                *self.taken.lock().unwrap_or_else(PoisonError::into_inner) = Some(taken);
                Some(self.clone())
            }
            Ok(None) => force.then(|| self.clone()),
            Err(e) => {
                tracing::warn!(error = %e, "no snapshot this time: the state could not be taken");
                None
            }
        }
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> io::Result<()> {
        // On a blocking thread: decoding, writing and fsyncing a large state must not hold up
        // the link's runtime (heartbeats, handshakes).
        let (machine, meta) = (self.clone(), meta.clone());
        crate::offload::off_runtime(move || machine.install(&meta, snapshot)).await?
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> io::Result<Option<SnapshotOf<TypeConfig, SnapshotData>>> {
        if self.lock().snapshot.is_none() {
            return Ok(None);
        }
        // The metadata as the file holds it: a snapshot renamed over it meanwhile is read
        // whole, its own metadata with its own bytes.
        let kept = read_kept(&self.dir)?;
        Ok(kept.map(|(meta, snapshot)| SnapshotOf::<TypeConfig, SnapshotData> { meta, snapshot }))
    }
}
