//! The free-space floor: refuse new records before the file system is full.
//!
//! Owns: the floor's default, when free space is measured on the append path, and the log
//! lines that mark both edges (below the floor, back above it).
//!
//! Why a floor: a log that runs the disk to ENOSPC fails mid-write, and a checkpoint (which is
//! what frees space, by truncating the log) or the next start then has no room either. Below
//! the floor, ordinary appends get [`Error::NoSpace`] while the log stays healthy; records that
//! let the log shrink or keep the service governable (checkpoint markers, directory changes such
//! as a key revocation) may still use the reserve. Writes come back by themselves once space is
//! above the floor again: every refused append measures anew (at most every
//! [`RECHECK_INTERVAL`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::fsutil;

/// The default floor is the smaller of this and [`DEFAULT_FLOOR_PERCENT`] of the file system.
pub(crate) const DEFAULT_FLOOR_BYTES: u64 = 256 * 1024 * 1024;
/// See [`DEFAULT_FLOOR_BYTES`].
pub(crate) const DEFAULT_FLOOR_PERCENT: u64 = 5;
/// Free space is measured again after this long...
pub(crate) const RECHECK_INTERVAL: Duration = Duration::from_millis(50);
/// ...or after this many bytes were appended since the last measurement, whichever is first.
pub(crate) const RECHECK_BYTES: u64 = 1024 * 1024;

/// The floor `configured` resolves to on the file system of `dir`.
pub(crate) fn resolve_floor(configured: Option<u64>, dir: &Path) -> Result<u64> {
    match configured {
        Some(bytes) => Ok(bytes),
        None => {
            let total = fs2::total_space(dir).map_err(Error::fs(format!(
                "read the size of the file system of {}",
                dir.display()
            )))?;
            Ok(DEFAULT_FLOOR_BYTES.min(total / 100 * DEFAULT_FLOOR_PERCENT))
        }
    }
}

/// Free space as last measured, kept under the append mutex.
#[derive(Debug)]
pub(crate) struct SpaceGuard {
    /// The data dir (its file system is the one measured).
    dir: PathBuf,
    /// The floor; 0 disables the guard.
    pub(crate) floor: u64,
    /// Free bytes at the last measurement.
    pub(crate) free: u64,
    /// When that was.
    measured_at: Instant,
    /// Bytes appended since.
    appended_since: u64,
}

impl SpaceGuard {
    /// A guard for `dir`, measured now.
    pub(crate) fn new(dir: &Path, floor: u64) -> Result<Self> {
        let mut guard = SpaceGuard {
            dir: dir.to_path_buf(),
            floor,
            free: 0,
            measured_at: Instant::now(),
            appended_since: 0,
        };
        guard.measure()?;
        if guard.is_low() {
            tracing::warn!(
                dir = %dir.display(), free_bytes = guard.free, min_free_bytes = floor,
                "free space is below the floor: writes are refused until space is freed"
            );
        }
        Ok(guard)
    }

    /// Whether free space was below the floor at the last measurement.
    pub(crate) fn is_low(&self) -> bool {
        self.floor > 0 && self.free < self.floor
    }

    fn measure(&mut self) -> Result<()> {
        self.free = fsutil::available_space(&self.dir)?;
        self.measured_at = Instant::now();
        self.appended_since = 0;
        Ok(())
    }

    /// Admits an ordinary append, or refuses it with [`Error::NoSpace`]. Measures when the
    /// last measurement is stale, logging when the floor is crossed either way.
    pub(crate) fn admit(&mut self) -> Result<()> {
        if self.floor == 0 {
            return Ok(());
        }
        if self.measured_at.elapsed() >= RECHECK_INTERVAL || self.appended_since >= RECHECK_BYTES {
            self.refresh()?;
        }
        if self.is_low() {
            return Err(Error::NoSpace {
                action: "append to the log in",
                dir: self.dir.clone(),
                needed: self.floor,
                available: self.free,
            });
        }
        Ok(())
    }

    /// Counts the bytes of an append (admitted, or one that may use the reserve).
    pub(crate) fn count(&mut self, len: usize) {
        self.appended_since += len as u64;
    }

    /// Measures now and logs an edge.
    pub(crate) fn refresh(&mut self) -> Result<()> {
        let was_low = self.is_low();
        self.measure()?;
        match (was_low, self.is_low()) {
            (false, true) => tracing::warn!(
                dir = %self.dir.display(), free_bytes = self.free, min_free_bytes = self.floor,
                "free space fell below the floor: writes are refused until space is freed"
            ),
            (true, false) => tracing::info!(
                dir = %self.dir.display(), free_bytes = self.free, min_free_bytes = self.floor,
                "free space is above the floor again: writes resume"
            ),
            _ => {}
        }
        Ok(())
    }
}
