//! The sled-backed record store: `<data dir>/log/`.
//!
//! Owns: the sled database, opening it with the right settings, detecting a data dir that is
//! already in use, making writes durable, and rewriting the store when a compaction asks. What
//! its keys and values hold is [`crate::layout`]'s.
//!
//! Guarantees:
//! - After a truncation through an LSN, no stored value holds records on both sides of it: a
//!   pack that straddles it is split ([`LogStore::remove_through_except`]).
//! - [`LogStore::write`] returns only after the batch is durable: sled `apply_batch` (atomic),
//!   `flush`, then fsync of the blob files sled created and an fdatasync of sled's data file
//!   (see [`LogStore::sync`] for why sled's own flush is not enough).
//! - Opening a data dir that another process (or another `Wal` in this process) holds fails
//!   with [`Error::InUse`], never a panic.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::layout::entry::{
    assemble, next_entry, put_records, records_of, span, split_entry, Kept,
};
use crate::layout::keys::{key, parse_key, Layout};
use crate::layout::pack;
use crate::{frame, fsutil, lock, Lsn};

/// Name of the log directory inside the data dir.
pub const DIR_NAME: &str = "log";
/// Where a compaction builds the rewritten log before it replaces [`DIR_NAME`].
const NEXT_DIR_NAME: &str = "log.next";
/// Where a compaction moves the old log before removing it.
const OLD_DIR_NAME: &str = "log.old";

/// Copies every record of `old` into a new store in `log.next/`, makes it durable, closes
/// both, and swaps it in for `log/` (see `Wal::compact_if_bloated`).
pub(crate) fn rewrite_live(config: &crate::Config, old: LogStore) -> Result<()> {
    let (dir, log) = (&config.dir, config.dir.join(DIR_NAME));
    let (next, prev) = (dir.join(NEXT_DIR_NAME), dir.join(OLD_DIR_NAME));
    remove_tree(&next)?;
    let copied = (|| {
        let new = LogStore::open_at(dir, &next, config.cache_capacity_bytes)?;
        let mut batch = sled::Batch::default();
        for item in old.db.iter() {
            let (k, v) = item?;
            batch.insert(k, v);
        }
        new.write(batch)?;
        fsutil::sync_dir(&next)
    })();
    drop(old);
    if let Err(e) = copied {
        remove_tree(&next)?;
        return Err(e);
    }
    std::fs::rename(&log, &prev).map_err(Error::fs(format!("rename {}", log.display())))?;
    std::fs::rename(&next, &log).map_err(Error::fs(format!("rename {}", next.display())))?;
    fsutil::sync_dir(dir)?;
    remove_tree(&prev)
}

/// Completes or undoes a compaction a crash interrupted, before the log is opened: `log.next`
/// beside `log` was never swapped in (removed); `log.next` without `log` is complete (the old
/// one was already moved aside), so it becomes `log`; a leftover `log.old` is removed.
pub(crate) fn finish_interrupted_compaction(dir: &Path) -> Result<()> {
    let (log, next, prev) = (dir.join(DIR_NAME), dir.join(NEXT_DIR_NAME), dir.join(OLD_DIR_NAME));
    if next.exists() {
        if log.exists() {
            tracing::warn!(dir = %next.display(), "removing an unfinished log rewrite");
            remove_tree(&next)?;
        } else {
            tracing::warn!(dir = %next.display(), "completing an interrupted log rewrite");
            std::fs::rename(&next, &log)
                .map_err(Error::fs(format!("rename {}", next.display())))?;
            fsutil::sync_dir(dir)?;
        }
    }
    remove_tree(&prev)
}

/// Removes a directory tree if it exists.
fn remove_tree(path: &Path) -> Result<()> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::fs(format!("remove {}", path.display()))(e)),
    }
}

/// sled's data file inside the log directory (sled 0.34 keeps the whole log in this one file,
/// plus one file per large value under `blobs/`).
pub(crate) const DATA_FILE: &str = "db";

/// sled's directory for values too large to inline in its log.
const BLOBS_DIR: &str = "blobs";

/// Free bytes an open needs beyond room for sled's new snapshot: sled's config file, a few of
/// its 512 KiB segments and recovery's repair batch, with a wide margin.
pub(crate) const OPEN_HEADROOM_BYTES: u64 = 16 * 1024 * 1024;

/// Makes sled's directory safe to open, before sled touches it.
///
/// sled 0.34 writes on every open: it replays its own log and writes a fresh snapshot to
/// `snap.<lsn>.generating`, fsyncs it and renames it to `snap.<lsn>`. On a full disk that write
/// fails half way and leaves the `.generating` file behind, and sled's next open takes the
/// newest `snap.*` file, that one included, finds it truncated and refuses the whole store as
/// corrupt ("Read corrupted data at file offset None") although the older snapshot and the log
/// are intact. So, in this order:
/// 1. Refuse ([`Error::NoSpace`], nothing changed) unless the file system has room for a new
///    snapshot as large as the current ones together, plus [`OPEN_HEADROOM_BYTES`].
/// 2. Refuse unless a small file can be written and fsynced there ([`probe_writes`]): a device
///    that fails writes or fsyncs fails here, before sled has touched anything.
/// 3. Remove every `snap.*.generating` file: sled renames a snapshot only after fsyncing it and
///    removes the old ones only after that rename, so such a file is never the only complete
///    snapshot. Removing it also lets a store damaged that way open again.
fn prepare_open(log_dir: &Path) -> Result<()> {
    let list = |e| Error::fs(format!("list {}", log_dir.display()))(e);
    let mut snapshots = 0u64;
    let mut interrupted = Vec::new();
    for entry in fs::read_dir(log_dir).map_err(list)? {
        let entry = entry.map_err(list)?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with("snap.") {
            continue;
        }
        if name.ends_with(".generating") {
            interrupted.push(entry.path());
        } else {
            let meta = entry
                .metadata()
                .map_err(Error::fs(format!("inspect {}", entry.path().display())))?;
            snapshots += meta.len();
        }
    }
    fsutil::require_space("open the log in", log_dir, snapshots + OPEN_HEADROOM_BYTES)?;
    probe_writes(log_dir)?;
    for path in &interrupted {
        tracing::warn!(path = %path.display(), "removing a snapshot file sled left unfinished");
        fsutil::remove_if_exists(path)?;
    }
    if !interrupted.is_empty() {
        fsutil::sync_dir(log_dir)?;
    }
    Ok(())
}

/// The sled database plus the handles needed to make its writes durable.
pub(crate) struct LogStore {
    /// `<data_dir>/log`.
    log_dir: PathBuf,
    /// The database. Opened with `flush_every_ms(None)`: we decide when to flush.
    pub(crate) db: sled::Db,
    /// sled's data file, opened once so every group commit can `fdatasync` it.
    data_file: fs::File,
    /// Blob files already fsynced, so each is synced once. The mutex also serializes
    /// concurrent [`LogStore::sync`] calls (commit thread and checkpoint truncation).
    synced_blobs: Mutex<HashSet<OsString>>,
    /// The records this store keeps at or below the last checkpoint, as the last truncation
    /// left them; `None` until one has run on this store.
    retained: Mutex<Option<Retained>>,
    /// The packs [`LogStore::read`] decoded last: a follower reads a pack's records one after
    /// another, and decoding the pack for each would cost it the whole pack every time.
    unpacked: Mutex<Unpacked>,
    /// Slow syncs not yet logged, and when the last line went out.
    slow_syncs: Mutex<SlowSyncs>,
    /// Declared last so it drops after `db`: waits until sled has really let go of the dir.
    _released: WaitForRelease,
}

/// A group commit ([`LogStore::write_values`]) that took at least this long is logged: every
/// writer of its group waited for it, so an operator should see it, and which part took the
/// time. Other writes (a restore's batches, a truncation, a compaction's copy) are large by
/// nature and not reported.
const SLOW_SYNC: Duration = Duration::from_millis(50);

/// At most one line about slow syncs this often; its `slow_syncs` counts itself and the ones
/// left out since the last line.
const SLOW_SYNC_LINE_EVERY: Duration = Duration::from_secs(10);

/// Where the time of one slow write and sync went (see [`LogStore::sync_after`]).
#[derive(Debug)]
struct SlowSync {
    /// sled's insert or batch (it may wait for room in sled's I/O buffers).
    apply: Duration,
    /// Waiting for another sync of this store (a truncation's).
    wait: Duration,
    /// sled's flush: its buffers written and `sync_file_range`d.
    sled_flush: Duration,
    /// The fsyncs of new blob files.
    blobs: Duration,
    /// The data file's `fdatasync` (the device's cache flush).
    fdatasync: Duration,
}

/// The rate limit of the slow-sync lines.
#[derive(Debug, Default)]
struct SlowSyncs {
    /// When the last line was logged.
    logged: Option<Instant>,
    /// Slow syncs since then, this one included once [`SlowSyncs::note`] counted it.
    since: u64,
}

impl SlowSyncs {
    /// Counts a slow sync at `now`; `Some(n)` when a line is due, `n` being the slow syncs it
    /// speaks for (this one and the ones left out since the last line).
    fn note(&mut self, now: Instant) -> Option<u64> {
        self.since += 1;
        if self.logged.is_some_and(|at| now.duration_since(at) < SLOW_SYNC_LINE_EVERY) {
            return None;
        }
        self.logged = Some(now);
        Some(std::mem::take(&mut self.since))
    }
}

/// The last few decoded packs, by first LSN; the oldest goes first. A record's bytes never
/// change while it is stored, so an entry stays true until its record is removed (a split pack
/// holds the same records under new keys); [`LogStore::truncate_after`], after which an LSN
/// may be stored again with other bytes, empties it.
#[derive(Debug, Default)]
struct Unpacked {
    packs: std::collections::VecDeque<(Lsn, Vec<Vec<u8>>)>,
    /// Counts removals of records. A read keeps the pack it decoded only when no removal
    /// came since it began: one that read the pack just before a removal would otherwise put
    /// back a copy of records that are gone (or whose LSNs are about to be reused).
    generation: u64,
}

impl Unpacked {
    /// Followers of a few sheets read side by side.
    const PACKS: usize = 8;

    fn get(&self, lsn: Lsn) -> Option<Vec<u8>> {
        self.packs.iter().find_map(|(first, records)| {
            let at = usize::try_from(lsn.checked_sub(*first)?).ok()?;
            records.get(at).cloned()
        })
    }

    fn insert(&mut self, first: Lsn, records: Vec<Vec<u8>>, read_in: u64) {
        if read_in != self.generation {
            return;
        }
        if self.packs.len() == Self::PACKS {
            self.packs.pop_front();
        }
        self.packs.push_back((first, records));
    }
}

/// Every record a truncation kept at or below its LSN, in LSN order.
///
/// With it, the next truncation asks `retain` about these and walks only the records after
/// `through`: a checkpoint's cost no longer grows with the history the change feed retains
/// (reading 480,000 retained records back from sled took longer than writing a checkpoint of
/// a million rows).
#[derive(Debug)]
struct Retained {
    through: Lsn,
    records: Vec<Kept>,
}

/// Blocks, on drop, until sled's lock on the data file is gone.
///
/// Dropping a `sled::Db` does not close its data file at once: work sled handed to its
/// background thread pool (writing a sealed buffer, an asynchronous segment truncation) holds
/// the file, and with it the lock, until it finishes. Without this wait, reopening the same
/// data dir right after dropping the last `Wal` (a restart in tests, `sheetd check` after a
/// shutdown) fails with [`Error::InUse`] now and then.
#[derive(Debug)]
struct WaitForRelease {
    /// sled's data file, `log/db`.
    data_path: PathBuf,
}

impl Drop for WaitForRelease {
    fn drop(&mut self) {
        // Generous: the pending work is a write or an fsync, normally microseconds to
        // milliseconds. Never hang forever on a misbehaving disk.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut pause = Duration::from_micros(100);
        while let Ok(true) = lock::is_locked(&self.data_path) {
            if Instant::now() >= deadline {
                tracing::warn!(
                    path = %self.data_path.display(),
                    "sled still holds its lock 10 s after the log was closed"
                );
                return;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }
}

impl std::fmt::Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore").field("log_dir", &self.log_dir).finish_non_exhaustive()
    }
}

impl LogStore {
    /// Opens (creating if needed) the log of the data dir `data_dir`.
    pub(crate) fn open(data_dir: &Path, cache_capacity_bytes: u64) -> Result<Self> {
        Self::open_at(data_dir, &data_dir.join(DIR_NAME), cache_capacity_bytes)
    }

    /// Opens the sled database in `log_dir`; `data_dir` names the owner in messages (verify
    /// opens a private copy but reports the original dir).
    pub(crate) fn open_at(
        data_dir: &Path,
        log_dir: &Path,
        cache_capacity_bytes: u64,
    ) -> Result<Self> {
        let created = !log_dir.exists();
        fsutil::ensure_dir(log_dir)?;
        let data_path = log_dir.join(DATA_FILE);

        // Ask first with the same flock(2) sled uses, so the common case gets a clean error
        // instead of sled's generic I/O error.
        if lock::is_locked(&data_path)? {
            return Err(Error::InUse { dir: data_dir.to_path_buf() });
        }
        prepare_open(log_dir)?;
        let db = sled::Config::new()
            .path(log_dir)
            .cache_capacity(cache_capacity_bytes)
            // We flush (and fsync) once per commit group; sled's timer would only add writes.
            .flush_every_ms(None)
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(|e| {
                // The lock can still be taken between our probe and sled's open.
                if is_lock_error(&e) {
                    Error::InUse { dir: data_dir.to_path_buf() }
                } else {
                    Error::Store(e)
                }
            })?;

        // A separate descriptor for fdatasync. flock(2) locks belong to sled's descriptor, so
        // opening and later closing this one does not release them.
        let data_file = fs::File::open(&data_path)
            .map_err(Error::fs(format!("open {} for fsync", data_path.display())))?;
        if created {
            // Make the new `log/` directory and sled's files in it survive power loss.
            fsutil::sync_dir(log_dir)?;
        }
        Ok(Self {
            log_dir: log_dir.to_path_buf(),
            db,
            data_file,
            synced_blobs: Mutex::new(HashSet::new()),
            slow_syncs: Mutex::default(),
            retained: Mutex::new(None),
            unpacked: Mutex::new(Unpacked::default()),
            _released: WaitForRelease { data_path },
        })
    }

    /// Applies `batch` atomically and returns once it is durable (see [`LogStore::sync`]).
    pub(crate) fn write(&self, batch: sled::Batch) -> Result<()> {
        self.db.apply_batch(batch)?;
        self.sync()
    }

    /// Writes `values` atomically and returns once they are durable: one value as a plain
    /// insert, several as a batch.
    ///
    /// Why not always a batch: sled 0.34 writes a batch's manifest in an I/O buffer of its own
    /// (`pin_log` rolls the buffer before and after reserving it), so a flush writes and waits
    /// for two buffers, often one after the other, and a batch takes sled's global write lock.
    /// A group of one value (one patch, or one pack) needs neither: a single insert is one log
    /// message, and sled's recovery keeps a message whole or not at all.
    pub(crate) fn write_values(&self, mut values: Vec<(Vec<u8>, Vec<u8>)>) -> Result<()> {
        let started = Instant::now();
        if values.len() == 1 {
            let (key, value) = values.pop().expect("one value");
            self.db.insert(key, value)?;
        } else {
            let mut batch = sled::Batch::default();
            for (key, value) in values {
                batch.insert(key, value);
            }
            self.db.apply_batch(batch)?;
        }
        self.sync_after(Some(started))
    }

    /// Makes everything applied so far durable.
    ///
    /// sled 0.34's `flush` writes its buffers and then, on Linux, calls `sync_file_range`,
    /// which waits for the page cache to write back but neither flushes the device's volatile
    /// write cache nor persists file metadata such as the file size. After power loss, data
    /// sled reported as flushed can therefore be gone. So after every flush we:
    /// 1. fsync each blob file sled created since the last sync (sled never syncs them) and
    ///    then the `blobs/` directory, so large values are as durable as their index entry;
    /// 2. `fdatasync` the data file (`log/db`), which issues the device cache flush and
    ///    persists the size.
    ///
    /// The commit thread calls this once per group: one fdatasync serves every record queued
    /// behind it, which is what makes group commit cheap.
    pub(crate) fn sync(&self) -> Result<()> {
        self.sync_after(None)
    }

    /// [`LogStore::sync`]; with `started`, of a group commit applied since then, logged with
    /// where its time went if it was slow ([`SLOW_SYNC`]).
    fn sync_after(&self, group: Option<Instant>) -> Result<()> {
        let started = group.unwrap_or_else(Instant::now);
        let applied = started.elapsed();
        let mut synced =
            self.synced_blobs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let locked = started.elapsed();
        self.db.flush()?;
        let flushed = started.elapsed();
        self.sync_new_blobs(&mut synced)?;
        let blobs = started.elapsed();
        self.data_file.sync_data().map_err(Error::fs(format!(
            "fdatasync the log file {}",
            self.log_dir.join(DATA_FILE).display()
        )))?;
        let took = started.elapsed();
        if group.is_some() && took >= SLOW_SYNC {
            self.slow_sync(SlowSync {
                apply: applied,
                wait: locked - applied,
                sled_flush: flushed - locked,
                blobs: blobs - flushed,
                fdatasync: took - blobs,
            });
        }
        Ok(())
    }

    /// Logs a slow sync, at most one line per [`SLOW_SYNC_LINE_EVERY`].
    fn slow_sync(&self, slow: SlowSync) {
        let due =
            self.slow_syncs.lock().unwrap_or_else(PoisonError::into_inner).note(Instant::now());
        let Some(count) = due else { return };
        let ms = |d: Duration| d.as_micros() as f64 / 1000.0;
        let total = slow.apply + slow.wait + slow.sled_flush + slow.blobs + slow.fdatasync;
        tracing::warn!(
            apply_ms = ms(slow.apply),
            wait_ms = ms(slow.wait),
            sled_flush_ms = ms(slow.sled_flush),
            blob_fsync_ms = ms(slow.blobs),
            fdatasync_ms = ms(slow.fdatasync),
            slow_syncs = count,
            "a write of the log took {:.0} ms to become durable, and the writes of its group \
             waited for it",
            ms(total)
        );
    }

    /// fsyncs blob files not synced before, then their directory if any were new.
    fn sync_new_blobs(&self, synced: &mut HashSet<OsString>) -> Result<()> {
        let blobs = self.log_dir.join(BLOBS_DIR);
        let entries = match fs::read_dir(&blobs) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::fs(format!("list {}", blobs.display()))(e)),
        };
        let mut present = HashSet::new();
        let mut any_new = false;
        for entry in entries {
            let entry = entry.map_err(Error::fs(format!("list {}", blobs.display())))?;
            let name = entry.file_name();
            if !synced.contains(&name) {
                match fs::File::open(entry.path()) {
                    Ok(f) => f
                        .sync_all()
                        .map_err(Error::fs(format!("fsync {}", entry.path().display())))?,
                    // sled removes blobs it no longer needs; a vanished one needs no sync.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(Error::fs(format!("open {}", entry.path().display()))(e)),
                }
                any_new = true;
            }
            present.insert(name);
        }
        if any_new {
            fsutil::sync_dir(&blobs)?;
        }
        // Forget blobs sled has deleted so the set does not grow forever.
        *synced = present;
        Ok(())
    }

    /// Removes every record with LSN <= `lsn` in one batch and makes that durable.
    /// Returns how many sled values (records and chunks) were removed.
    #[cfg(test)]
    pub(crate) fn remove_through(&self, lsn: Lsn) -> Result<u64> {
        // Every key of `lsn`, whole or chunked, sorts before the 8-byte key of `lsn + 1`.
        match lsn.checked_add(1) {
            Some(next) => self.remove_all(self.db.range(..key(next))),
            None => self.remove_all(self.db.iter()),
        }
    }

    /// Removes every record with LSN <= `lsn` except those `retain` keeps, in one durable
    /// batch. Returns how many sled values were removed, and the stored bytes of the records
    /// kept at or below `lsn` (retained now or by an earlier call; [`LogStore::with_kept`]
    /// lists them).
    pub(crate) fn remove_through_except(
        &self,
        lsn: Lsn,
        retain: &dyn Fn(Lsn) -> bool,
    ) -> Result<(u64, u64)> {
        // Taken, and put back only once the batch is durable: after a failure the next call
        // walks everything again.
        let known = self.retained.lock().unwrap_or_else(PoisonError::into_inner).take();
        let mut batch = sled::Batch::default();
        let mut removed = 0u64;
        let mut kept: Vec<Kept> = Vec::new();
        let walk_from = match known {
            Some(known) if known.through <= lsn => {
                for record in known.records {
                    if (record.lsn..=record.last()).any(retain) {
                        kept.push(record);
                    } else {
                        removed += record.remove(&mut batch);
                    }
                }
                known.through.saturating_add(1)
            }
            _ => 0,
        };
        let mut items = match lsn.checked_add(1) {
            Some(next) => self.db.range(key(walk_from)..key(next)),
            None => self.db.range(key(walk_from)..),
        }
        .peekable();
        while let Some(parts) = next_entry(&mut items)? {
            let (first, last) = span(&parts)?;
            if last > lsn {
                // A pack across the checkpoint: only its records after it must stay.
                removed += 1;
                kept.extend(split_entry(&mut batch, &parts, lsn, (first..=lsn).any(retain))?.0);
            } else if (first..=last).any(retain) {
                kept.push(Kept::of(first, &parts));
            } else {
                removed += parts.len() as u64;
                for (k, _, _) in parts {
                    batch.remove(k);
                }
            }
        }
        if removed > 0 {
            self.write(batch)?;
            // A purged record reads as gone, also from a pack decoded before.
            self.forget_unpacked();
        }
        let bytes = kept.iter().map(|k| k.bytes).sum();
        self.set_kept(lsn, kept);
        Ok((removed, bytes))
    }

    /// Tells the store which records it keeps at or below `through` (from a sweep marker or
    /// a start's walk), so its first truncation need not walk them.
    pub(crate) fn set_kept(&self, through: Lsn, records: Vec<Kept>) {
        *self.retained.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(Retained { through, records });
    }

    /// Runs `f` on the records the last truncation kept (empty if none ran).
    pub(crate) fn with_kept<T>(&self, f: impl FnOnce(&[Kept]) -> T) -> T {
        let retained = self.retained.lock().unwrap_or_else(PoisonError::into_inner);
        f(retained.as_ref().map_or(&[][..], |r| &r.records[..]))
    }

    /// The payload of the record at `lsn`: its one frame, its chunks in order, or its place in
    /// a pack.
    pub(crate) fn read(&self, lsn: Lsn) -> Result<Option<Vec<u8>>> {
        let generation = {
            let unpacked = self.unpacked.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(payload) = unpacked.get(lsn) {
                return Ok(Some(payload));
            }
            unpacked.generation
        };
        // A record stored whole: one lookup, no range scan.
        if let Some(stored) = self.db.get(key(lsn))? {
            return match crate::frame::decode(&stored) {
                Ok(payload) => Ok(Some(payload.to_vec())),
                Err(defect) => Err(crate::error::Corruption::Record { lsn, defect }.into()),
            };
        }
        let damaged = |defect| crate::error::Corruption::Record { lsn, defect };
        let end = match lsn.checked_add(1) {
            Some(next) => std::ops::Bound::Excluded(key(next)),
            None => std::ops::Bound::Unbounded,
        };
        // Its chunks, or the pack it begins: every key from `lsn`'s own to the next LSN's.
        let mut parts = Vec::new();
        for item in self.db.range((std::ops::Bound::Included(key(lsn)), end)) {
            let (k, v) = item?;
            let (_, layout) = parse_key(&k)?;
            parts.push((k, layout, v));
        }
        let (first, count, stored) = match parts.pop() {
            Some((_, Layout::Pack { count }, stored)) if parts.is_empty() => (lsn, count, stored),
            Some(last) => {
                parts.push(last);
                return assemble(&parts).map(Some).map_err(|d| damaged(d).into());
            }
            // A pack it lies inside: the value with the greatest key below `lsn`'s.
            None => match self.db.range(..key(lsn)).next_back().transpose()? {
                Some((k, stored)) => match parse_key(&k)? {
                    (first, Layout::Pack { count }) if lsn - first < Lsn::from(count) => {
                        (first, count, stored)
                    }
                    _ => return Ok(None),
                },
                None => return Ok(None),
            },
        };
        let payloads =
            frame::decode(&stored).and_then(|body| pack::decode(body, count)).map_err(damaged)?;
        let payload = payloads[(lsn - first) as usize].clone();
        self.unpacked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(first, payloads, generation);
        Ok(Some(payload))
    }

    /// Removes every record with LSN > `lsn` in one batch and makes that durable. Returns how
    /// many sled values (records and chunks) were removed.
    pub(crate) fn remove_after(&self, lsn: Lsn) -> Result<u64> {
        let removed = match lsn.checked_add(1) {
            Some(next) => self.remove_all(self.db.range(key(next)..))?,
            None => 0,
        };
        self.forget_unpacked();
        Ok(removed)
    }

    /// Removes every record with LSN > `lsn` and makes that durable, keeping the records up
    /// to `lsn` of a pack that runs past it (stored again under a key of their own). Returns
    /// how many records or packs were removed or rewritten.
    ///
    /// Unlike [`LogStore::remove_after`] (heal: a pack holds one group, and the durable LSN
    /// is a group's end) the cut may fall anywhere: a replicated log drops a leader's records
    /// that the new leader does not have, wherever they begin.
    pub(crate) fn truncate_after(&self, lsn: Lsn) -> Result<u64> {
        let Some(next) = lsn.checked_add(1) else { return Ok(0) };
        let mut batch = sled::Batch::default();
        let mut removed = 0u64;
        // The value with the greatest key below `next`'s: `lsn`'s own, one of its chunks, or
        // the pack `lsn` lies in.
        if let Some((k, stored)) = self.db.range(..key(next)).next_back().transpose()? {
            let (first, layout) = parse_key(&k)?;
            if let Layout::Pack { count } = layout {
                if first + Lsn::from(count) - 1 > lsn {
                    let parts = [(k.clone(), layout, stored)];
                    let damaged = |defect| crate::error::Corruption::Record { lsn: first, defect };
                    let records = records_of(&parts).map_err(damaged)?;
                    batch.remove(k);
                    let below = records[..=(lsn - first) as usize].iter().map(Vec::as_slice);
                    put_records(&mut batch, first, below)?;
                    removed += 1;
                }
            }
        }
        for item in self.db.range(key(next)..) {
            let (k, _) = item?;
            batch.remove(k);
            removed += 1;
        }
        if removed > 0 {
            self.write(batch)?;
        }
        // Decoded packs may hold records removed here, and the LSNs are about to be reused.
        self.forget_unpacked();
        Ok(removed)
    }

    /// Drops the decoded packs: called once records were removed, so that no read answers
    /// from a copy of one (see [`Unpacked::generation`]).
    fn forget_unpacked(&self) {
        let mut unpacked = self.unpacked.lock().unwrap_or_else(PoisonError::into_inner);
        unpacked.packs.clear();
        unpacked.generation += 1;
    }

    /// Removes the keys of `items` in one durable batch; returns how many.
    fn remove_all(&self, items: sled::Iter) -> Result<u64> {
        let mut batch = sled::Batch::default();
        let mut removed = 0u64;
        for item in items {
            let (k, _) = item?;
            batch.remove(k);
            removed += 1;
        }
        if removed > 0 {
            self.write(batch)?;
        }
        Ok(removed)
    }

    /// Bytes sled uses on disk (data file plus blobs); 0 if sled cannot tell.
    pub(crate) fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }
}

/// Writes, fsyncs and removes a small file in `dir`, so an open learns that the device takes
/// writes before sled writes anything.
fn probe_writes(dir: &Path) -> Result<()> {
    use std::io::Write;
    let path = dir.join(".write-probe");
    let result = (|| {
        let mut f = fs::File::create(&path)?;
        f.write_all(&[0u8; 4096])?;
        f.sync_all()
    })();
    let removed = fsutil::remove_if_exists(&path);
    result.map_err(Error::fs(format!(
        "write and fsync a probe file in {} (the device refuses writes; nothing was changed)",
        dir.display()
    )))?;
    removed.map(drop)
}

/// Whether a sled open error is its "could not acquire lock" error (sled 0.34 reports lock
/// contention as `Io(Other)` with this text and no structured kind).
fn is_lock_error(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.to_string().contains("could not acquire lock"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::keys::lsn_of;

    #[test]
    fn slow_syncs_are_logged_once_per_interval_counting_those_left_out() {
        let mut slow = SlowSyncs::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(slow.note(at(0)), Some(1), "the first is logged");
        assert_eq!(slow.note(at(10)), None);
        assert_eq!(slow.note(at(9_999)), None);
        assert_eq!(slow.note(at(10_000)), Some(3), "itself and the two left out");
        assert_eq!(slow.note(at(10_001)), None);
        assert_eq!(slow.note(at(60_000)), Some(2));
    }

    #[test]
    fn second_open_of_same_dir_is_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let first = LogStore::open(dir.path(), 1 << 20).unwrap();
        let err = LogStore::open(dir.path(), 1 << 20).unwrap_err();
        assert!(matches!(err, Error::InUse { .. }), "{err:?}");
        assert!(err.to_string().contains("is in use by another process"), "{err}");
        drop(first);
    }

    #[test]
    fn write_then_remove_through() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::open(dir.path(), 1 << 20).unwrap();
        let mut batch = sled::Batch::default();
        for lsn in 1..=5u64 {
            batch.insert(&key(lsn)[..], crate::frame::encode(b"x").unwrap());
        }
        store.write(batch).unwrap();
        assert_eq!(store.remove_through(3).unwrap(), 3);
        let left: Vec<Lsn> = store.db.iter().keys().map(|k| lsn_of(&k.unwrap()).unwrap()).collect();
        assert_eq!(left, vec![4, 5]);
        assert_eq!(store.remove_through(3).unwrap(), 0);
    }
}
