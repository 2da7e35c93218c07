//! Small file-system helpers the rest of the crate builds its durability on.
//!
//! Owns: directory fsync, recursive copy (for [`crate::Wal::verify`]'s private copy of the log),
//! sizes and free space, a self-deleting scratch directory, and a writer that makes a large
//! file durable as it goes ([`SyncEvery`]).
//!
//! Guarantees:
//! - [`sync_dir`] makes a directory's entries (creations, renames, removals) durable. On Linux a
//!   rename or a new file is not durable until its *directory* is fsynced.
//! - Errors name the path they concern.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// fsyncs a directory so that entries created, renamed or removed in it survive power loss.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    let handle = fs::File::open(dir)
        .map_err(Error::fs(format!("open directory {} to fsync it", dir.display())))?;
    handle.sync_all().map_err(Error::fs(format!("fsync directory {}", dir.display())))
}

/// Bytes a [`SyncEvery`] writer lets pile up before it makes them durable: at this disk's
/// 400 MB/s, about 10 ms of writing.
pub(crate) const SYNC_EVERY_BYTES: u64 = 4 << 20;

/// A file writer that `fdatasync`s every [`SYNC_EVERY_BYTES`] it wrote.
///
/// Why: a checkpoint writes hundreds of megabytes. Left to the page cache, they reach the
/// device in bursts and at the final fsync, and every group commit's `fdatasync` (a device
/// cache flush) waits behind whatever is in flight: under a 64-connection patch load, flushes
/// of 50-250 ms and replies held that long. A 400 MB write and fsync beside the same load (with
/// no checkpoint) did the same. Synced as it goes, the file never has more than a few
/// milliseconds of writing in flight, and its final fsync has little left to do.
pub(crate) struct SyncEvery {
    file: fs::File,
    unsynced: u64,
}

impl SyncEvery {
    pub(crate) fn new(file: fs::File) -> Self {
        SyncEvery { file, unsynced: 0 }
    }

    /// The file, with what was written since the last sync not yet durable.
    pub(crate) fn into_inner(self) -> fs::File {
        self.file
    }
}

impl std::io::Write for SyncEvery {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.unsynced += n as u64;
        if self.unsynced >= SYNC_EVERY_BYTES {
            self.file.sync_data()?;
            self.unsynced = 0;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// Creates `dir` (and parents) if missing. When something was created, the parent's entry is
/// fsynced so the new directory itself survives a crash.
pub(crate) fn ensure_dir(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::create_dir_all(dir).map_err(Error::fs(format!("create directory {}", dir.display())))?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent)?;
    }
    Ok(())
}

/// Removes a file if it exists; `Ok(true)` if something was removed.
pub(crate) fn remove_if_exists(path: &Path) -> Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::fs(format!("remove {}", path.display()))(e)),
    }
}

/// Bytes available to this process on the file system holding `dir` (statvfs `f_bavail`).
pub(crate) fn available_space(dir: &Path) -> Result<u64> {
    fs2::available_space(dir)
        .map_err(Error::fs(format!("read the free space of the file system of {}", dir.display())))
}

/// Total size of the regular files under `dir` (0 if it does not exist).
pub(crate) fn tree_size(dir: &Path) -> Result<u64> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::fs(format!("list directory {}", dir.display()))(e)),
    };
    let mut total = 0;
    for entry in entries {
        let entry = entry.map_err(Error::fs(format!("list directory {}", dir.display())))?;
        let meta =
            entry.metadata().map_err(Error::fs(format!("inspect {}", entry.path().display())))?;
        total += if meta.is_dir() { tree_size(&entry.path())? } else { meta.len() };
    }
    Ok(total)
}

/// Fails with [`Error::NoSpace`] unless the file system of `dir` has `needed` bytes free.
pub(crate) fn require_space(action: &'static str, dir: &Path, needed: u64) -> Result<()> {
    let available = available_space(dir)?;
    if available < needed {
        return Err(Error::NoSpace { action, dir: dir.to_path_buf(), needed, available });
    }
    Ok(())
}

/// Copies the directory tree `from` into `to` (which must not exist). Only regular files and
/// directories are copied; that is all sled creates.
pub(crate) fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir(to).map_err(Error::fs(format!("create directory {}", to.display())))?;
    let entries =
        fs::read_dir(from).map_err(Error::fs(format!("list directory {}", from.display())))?;
    for entry in entries {
        let entry = entry.map_err(Error::fs(format!("list directory {}", from.display())))?;
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let kind = entry.file_type().map_err(Error::fs(format!("inspect {}", src.display())))?;
        if kind.is_dir() {
            copy_dir(&src, &dst)?;
        } else if kind.is_file() {
            fs::copy(&src, &dst).map_err(Error::fs(format!(
                "copy {} to {}",
                src.display(),
                dst.display()
            )))?;
        }
    }
    Ok(())
}

/// A uniquely named directory under the system temp dir, removed (with its contents) on drop.
#[derive(Debug)]
pub(crate) struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// Creates `$TMPDIR/<prefix>-<pid>-<nanos>-<n>`.
    pub(crate) fn new(prefix: &str) -> Result<Self> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        loop {
            let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = base.join(format!("{prefix}-{}-{nanos}-{n}", std::process::id()));
            match fs::create_dir(&path) {
                Ok(()) => return Ok(Self { path }),
                // Name taken (practically impossible with the counter): try the next one.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(Error::fs(format!("create scratch directory {}", path.display()))(
                        e,
                    ))
                }
            }
        }
    }

    /// The directory's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "could not remove scratch directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_file_synced_as_it_goes_holds_every_byte_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        // Past two sync points, in pieces that straddle them.
        let bytes: Vec<u8> =
            (0..(2 * SYNC_EVERY_BYTES + 12_345)).map(|i| (i % 251) as u8).collect();
        let mut out = SyncEvery::new(fs::File::create(&path).unwrap());
        // A sync after the fifth piece (5,000,015 bytes) and none since.
        for piece in bytes.chunks(1_000_003) {
            out.write_all(piece).unwrap();
        }
        assert_eq!(out.unsynced, bytes.len() as u64 - 5_000_015);
        out.into_inner().sync_all().unwrap();
        assert_eq!(fs::read(&path).unwrap(), bytes);
    }
}
