//! The state file: a few bytes the log's owner keeps durable beside the records.
//!
//! Owns: [`Wal::save_state`] and [`Wal::state`], and the file `<data dir>/state` they keep
//! (`state.tmp` exists only while one is being written). What the bytes mean is the caller's: a
//! replicated log keeps its vote and its commit point there, which must survive a restart and
//! must never be acknowledged before they are on disk.
//!
//! # Format
//!
//! `[SHEETDST]`, then the bytes in a [`crate::frame`] (version, length, CRC32).
//!
//! Guarantees:
//! - [`Wal::save_state`] returns only once the new bytes are durable: written to `state.tmp`,
//!   fsynced, renamed over `state`, the data dir fsynced. A crash at any step leaves either
//!   the old bytes or the new ones, never a mix (a leftover `state.tmp` is ignored and
//!   overwritten by the next save).
//! - Damage is never read as "no state": [`Wal::state`] fails with [`Corruption::State`].
//! - Saves are serialized; the file is independent of the records (saving it neither waits
//!   for nor orders any append).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::core::lock;
use crate::error::{Corruption, Error, Result};
use crate::handle::Wal;
use crate::{frame, fsutil};

/// The file's first bytes.
const MAGIC: &[u8; 8] = b"SHEETDST";
/// Name of the state file inside the data dir.
const FILE_NAME: &str = "state";
/// Name of the file a save writes before renaming it.
const TMP_NAME: &str = "state.tmp";

impl Wal {
    /// Replaces the state file's bytes with `state` and makes that durable before returning.
    /// Blocking (one file write, two fsyncs; use `spawn_blocking`).
    ///
    /// # Errors
    /// I/O errors naming the file ([`Error::Fs`]), [`Error::RecordTooLarge`] over 4 GiB.
    pub fn save_state(&self, state: &[u8]) -> Result<()> {
        let core = self.core();
        // Two saves at once would write the same `state.tmp`.
        let _one_at_a_time = lock(&core.state_file);
        write(&core.config.dir, state)
    }

    /// The bytes last given to [`Wal::save_state`] (on this data dir, before or after a
    /// restart), or `None` when none were ever saved.
    ///
    /// # Errors
    /// [`Corruption::State`] when the file is damaged, I/O errors.
    pub fn state(&self) -> Result<Option<Vec<u8>>> {
        read(&self.core().config.dir)
    }
}

/// Whether a state was ever saved ([`Wal::save_state`]) in the data dir `dir`, without opening
/// its log.
pub fn saved_in(dir: &Path) -> bool {
    path(dir).exists()
}

/// `<dir>/state`.
fn path(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// Writes `state` as the state file of `dir`, durably (module docs).
fn write(dir: &Path, state: &[u8]) -> Result<()> {
    let tmp = dir.join(TMP_NAME);
    let target = path(dir);
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&frame::encode(state)?);
    let written = (|| {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(&bytes)?;
        // On disk before the rename makes it the state: else a crash could leave a correctly
        // named file with nothing in it.
        file.sync_all()
    })();
    written.map_err(Error::fs(format!("write {}", tmp.display())))?;
    fs::rename(&tmp, &target).map_err(Error::fs(format!(
        "rename {} to {}",
        tmp.display(),
        target.display()
    )))?;
    // The rename is only durable once the directory entry is.
    fsutil::sync_dir(dir)
}

/// Reads and checks the state file of `dir`.
fn read(dir: &Path) -> Result<Option<Vec<u8>>> {
    let path = path(dir);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::fs(format!("read {}", path.display()))(e)),
    };
    let damaged = |defect: String| Corruption::State { path: path.clone(), defect };
    let Some(framed) = bytes.strip_prefix(MAGIC) else {
        return Err(damaged("it does not begin with SHEETDST".to_owned()).into());
    };
    match frame::decode(framed) {
        Ok(state) => Ok(Some(state.to_vec())),
        Err(defect) => Err(damaged(defect.to_string()).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn open(dir: &Path) -> Wal {
        Wal::recover(Config::default_for(dir), &mut crate::recovery::Discard).unwrap().0
    }

    #[test]
    fn no_state_until_one_is_saved() {
        let dir = tempfile::tempdir().unwrap();
        let wal = open(dir.path());
        assert_eq!(wal.state().unwrap(), None);
        wal.save_state(b"").unwrap();
        assert_eq!(wal.state().unwrap(), Some(Vec::new()));
    }

    #[test]
    fn the_last_state_saved_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        {
            let wal = open(dir.path());
            wal.save_state(b"vote 1").unwrap();
            wal.save_state(b"vote 2").unwrap();
            wal.shutdown().unwrap();
        }
        let wal = open(dir.path());
        assert_eq!(wal.state().unwrap().as_deref(), Some(&b"vote 2"[..]));
        assert!(!dir.path().join(TMP_NAME).exists());
    }

    #[test]
    fn a_leftover_tmp_file_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let wal = open(dir.path());
        wal.save_state(b"kept").unwrap();
        // A crash between writing the tmp file and renaming it.
        fs::write(dir.path().join(TMP_NAME), b"half written").unwrap();
        assert_eq!(wal.state().unwrap().as_deref(), Some(&b"kept"[..]));
        wal.save_state(b"next").unwrap();
        assert_eq!(wal.state().unwrap().as_deref(), Some(&b"next"[..]));
    }

    #[test]
    fn a_damaged_state_file_is_an_error_not_an_empty_state() {
        let dir = tempfile::tempdir().unwrap();
        let wal = open(dir.path());
        wal.save_state(b"vote 7").unwrap();
        let mut bytes = fs::read(path(dir.path())).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        fs::write(path(dir.path()), &bytes).unwrap();
        let err = wal.state().unwrap_err();
        assert!(err.is_corruption(), "{err}");
        fs::write(path(dir.path()), b"garbage").unwrap();
        assert!(wal.state().unwrap_err().is_corruption());
    }
}
