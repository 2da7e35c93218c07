//! Helpers that damage or inspect a *stopped* log on purpose, for crash and corruption tests
//! elsewhere in the workspace (feature `testing`; always available to this crate's own tests).
//!
//! Owns nothing at runtime. Each helper opens the data dir's sled database itself, so it must
//! only be used with no [`crate::Wal`] open on that dir; if one is, the helper fails with
//! [`Error::InUse`] rather than corrupting a live log.
//!
//! Guarantees: every change is flushed and fsynced before the helper returns, so a following
//! `Wal::recover` sees exactly the damage asked for.

use std::path::Path;

use crate::error::{Error, Result};
use crate::layout::keys::{key, lsn_of, parse_key, Layout};
use crate::log::LogStore;
use crate::{checkpoint, Lsn};

/// Small page cache: these helpers touch a handful of records.
const CACHE_BYTES: u64 = 1 << 20;

/// Rewrites the highest-LSN record's stored frame truncated to its first `keep_bytes` bytes,
/// as a crash in the middle of writing it would. Returns that record's LSN.
///
/// # Errors
/// [`Error::InvalidArgument`] if the log is empty or `keep_bytes` is not shorter than the
/// frame; [`Error::InUse`] if a `Wal` has the dir open.
pub fn tear_last_record(dir: &Path, keep_bytes: usize) -> Result<Lsn> {
    let store = LogStore::open(dir, CACHE_BYTES)?;
    let (k, stored) = last(&store, dir)?;
    if keep_bytes >= stored.len() {
        return Err(Error::invalid(format!(
            "cannot tear the last record to {keep_bytes} bytes: its frame is only {} bytes",
            stored.len()
        )));
    }
    store.db.insert(&k, &stored[..keep_bytes])?;
    store.sync()?;
    lsn_of(&k)
}

/// Flips every bit of byte `byte_index` of the frame that stores record `lsn` (its own, or
/// its pack's).
///
/// # Errors
/// [`Error::InvalidArgument`] if the record does not exist or is shorter than
/// `byte_index + 1`; [`Error::InUse`] if a `Wal` has the dir open.
pub fn damage_record(dir: &Path, lsn: Lsn, byte_index: usize) -> Result<()> {
    let store = LogStore::open(dir, CACHE_BYTES)?;
    let (k, stored) = holder(&store, lsn)?.ok_or_else(|| {
        Error::invalid(format!("log record {lsn} does not exist in {}", dir.display()))
    })?;
    let mut damaged = stored.to_vec();
    let byte = damaged.get_mut(byte_index).ok_or_else(|| {
        Error::invalid(format!(
            "log record {lsn} has {} stored bytes; byte {byte_index} does not exist",
            stored.len()
        ))
    })?;
    *byte ^= 0xFF;
    store.db.insert(k, damaged)?;
    store.sync()
}

/// The key and stored frame of the record at `lsn` stored whole, or of the pack holding it.
fn holder(store: &LogStore, lsn: Lsn) -> Result<Option<(sled::IVec, sled::IVec)>> {
    if let Some(stored) = store.db.get(key(lsn))? {
        return Ok(Some((sled::IVec::from(&key(lsn)), stored)));
    }
    let Some((k, stored)) = store.db.range(..key(lsn + 1)).next_back().transpose()? else {
        return Ok(None);
    };
    Ok(match parse_key(&k)? {
        (first, Layout::Pack { count }) if lsn - first < Lsn::from(count) => Some((k, stored)),
        _ => None,
    })
}

/// Length of the highest-LSN record's stored frame (header + payload).
///
/// # Errors
/// [`Error::InvalidArgument`] if the log is empty; [`Error::InUse`] if a `Wal` has it open.
pub fn last_frame_len(dir: &Path) -> Result<usize> {
    let store = LogStore::open(dir, CACHE_BYTES)?;
    Ok(last(&store, dir)?.1.len())
}

/// Deletes record `lsn` from the log (to simulate a lost record: a gap).
///
/// # Errors
/// [`Error::InvalidArgument`] if the record does not exist or shares a pack with others;
/// [`Error::InUse`] if a `Wal` has the dir open.
pub fn remove_record(dir: &Path, lsn: Lsn) -> Result<()> {
    let store = LogStore::open(dir, CACHE_BYTES)?;
    if let Some((k, _)) = holder(&store, lsn)?.filter(|(k, _)| k.len() != key(lsn).len()) {
        return Err(Error::invalid(format!(
            "log record {lsn} is stored in a pack with others (key {k:?}); removing it alone is \
             not possible"
        )));
    }
    if store.db.remove(key(lsn))?.is_none() {
        return Err(Error::invalid(format!(
            "log record {lsn} does not exist in {}",
            dir.display()
        )));
    }
    store.sync()
}

/// LSNs of the records physically present in the log, in order (including records a checkpoint
/// already covers and damaged ones; every record of a pack).
///
/// # Errors
/// [`Error::InUse`] if a `Wal` has the dir open; sled errors.
pub fn record_lsns(dir: &Path) -> Result<Vec<Lsn>> {
    let store = LogStore::open(dir, CACHE_BYTES)?;
    let mut lsns = Vec::new();
    for k in store.db.iter().keys() {
        match parse_key(&k?)? {
            (first, Layout::Pack { count }) => lsns.extend(first..first + Lsn::from(count)),
            // A chunked record is listed once, at its first chunk.
            (_, Layout::Chunk { index, .. }) if index > 0 => {}
            (lsn, _) => lsns.push(lsn),
        }
    }
    Ok(lsns)
}

/// How many values the log stores: fewer than its records when some share a pack.
///
/// # Errors
/// [`Error::InUse`] if a `Wal` has the dir open; sled errors.
pub fn stored_values(dir: &Path) -> Result<usize> {
    let store = LogStore::open(dir, CACHE_BYTES)?;
    Ok(store.db.len())
}

/// Writes the checkpoint file exactly as [`crate::Wal::checkpoint`] does but does *not*
/// truncate the log: the state a crash between the two steps leaves behind.
///
/// # Errors
/// I/O errors writing the file.
pub fn write_checkpoint_only(dir: &Path, lsn: Lsn, snapshot: &[u8]) -> Result<()> {
    checkpoint::remove_swept(dir)?;
    checkpoint::write(dir, lsn, snapshot)
}

/// The highest record, or a clear error for an empty log.
fn last(store: &LogStore, dir: &Path) -> Result<(sled::IVec, sled::IVec)> {
    store
        .db
        .last()?
        .ok_or_else(|| Error::invalid(format!("the log in {} has no records", dir.display())))
}
