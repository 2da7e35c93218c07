//! Probing and sharing sled's data-dir lock.
//!
//! Owns: our side of sled's locking protocol. sled 0.34 takes an exclusive `flock(2)` (through
//! fs2) on `log/db` for as long as a database is open; this module uses the same call on the
//! same file.
//!
//! Guarantees:
//! - [`is_locked`] never creates the file and never keeps a lock.
//! - A [`SharedLock`] keeps any sled instance (in this or another process) from opening the
//!   log until it is dropped; [`crate::Wal::verify`] holds one while it copies the log.
//! - flock locks belong to the open file description, so a lock taken here conflicts even with
//!   a sled instance in the same process, and closing our descriptor never drops sled's lock.

use std::fs::File;
use std::io;
use std::path::Path;

use fs2::FileExt;

use crate::error::{Error, Result};

/// Whether `path` is currently locked (by an open sled database). `Ok(false)` if it is missing.
pub(crate) fn is_locked(path: &Path) -> Result<bool> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(Error::fs(format!("open {} to check its lock", path.display()))(e)),
    };
    // Fully qualified: std's inherent `File::try_lock*` (Rust 1.89+) would shadow fs2's.
    match FileExt::try_lock_exclusive(&file) {
        // Dropping `file` closes the descriptor, which releases the probe lock.
        Ok(()) => Ok(false),
        Err(e) if is_contended(&e) => Ok(true),
        Err(e) => Err(Error::fs(format!("check the lock on {}", path.display()))(e)),
    }
}

/// A shared lock on a file, released on drop.
#[derive(Debug)]
pub(crate) struct SharedLock {
    /// The locked descriptor; closing it releases the lock.
    _file: File,
}

impl SharedLock {
    /// Takes a shared lock on `path` without waiting. `Ok(None)` if someone holds an exclusive
    /// lock on it.
    pub(crate) fn try_new(path: &Path) -> Result<Option<Self>> {
        let file =
            File::open(path).map_err(Error::fs(format!("open {} to lock it", path.display())))?;
        match FileExt::try_lock_shared(&file) {
            Ok(()) => Ok(Some(Self { _file: file })),
            Err(e) if is_contended(&e) => Ok(None),
            Err(e) => Err(Error::fs(format!("lock {}", path.display()))(e)),
        }
    }
}

/// Whether an error from a non-blocking lock attempt means "someone else holds it".
fn is_contended(e: &io::Error) -> bool {
    e.kind() == fs2::lock_contended_error().kind() || e.kind() == io::ErrorKind::WouldBlock
}
