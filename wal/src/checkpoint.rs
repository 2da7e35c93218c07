//! The checkpoint file: one snapshot that replaces every log record up to its LSN.
//!
//! Owns: `<data dir>/checkpoint` and its temporary `<data dir>/checkpoint.tmp`.
//!
//! Layout (all integers little-endian):
//!
//! ```text
//! [magic "SHEETDCK" 8][version u8][lsn u64][len u64][crc32 u32][snapshot: len bytes]
//! ```
//!
//! The CRC covers everything before it (magic, version, LSN, length) and the snapshot.
//!
//! Guarantees:
//! - [`write()`] replaces the file atomically: write `checkpoint.tmp`, fsync it, rename it over
//!   `checkpoint`, fsync the data dir. A crash leaves either the old or the new checkpoint,
//!   never a mix.
//! - [`read`] never ignores damage. A checkpoint that fails its checks is
//!   [`Corruption::Checkpoint`]: the records it replaced may already be gone from the log, so
//!   falling back to "no checkpoint" would silently lose data.
//!
//! Crash windows of a whole checkpoint (this module's write, then the log truncation done by
//! [`crate::Wal::checkpoint`]):
//! 1. Before the rename: the old checkpoint (or none) and the full log remain; the leftover
//!    `checkpoint.tmp` is removed by the next recovery.
//! 2. After the rename, before the directory fsync completes: after power loss either file
//!    may be visible. Both are consistent, because the log still holds every record.
//! 3. After the directory fsync, before the truncation is durable: the new checkpoint plus
//!    records it already covers. Recovery skips those "stale" records and deletes them.
//! 4. The truncation itself is one sled batch, so it is applied entirely or not at all.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Corruption, Error, Result};
use crate::fsutil;
use crate::Lsn;

/// First bytes of every checkpoint file.
pub const MAGIC: &[u8; 8] = b"SHEETDCK";
/// Version of the checkpoint file layout.
pub const CHECKPOINT_VERSION: u8 = 1;
/// Bytes before the snapshot: magic (8) + version (1) + lsn (8) + len (8) + crc (4).
pub const HEADER_LEN: usize = 29;
/// File name of the checkpoint inside the data dir.
pub const FILE_NAME: &str = "checkpoint";
/// File name of the checkpoint being written.
pub const TMP_FILE_NAME: &str = "checkpoint.tmp";

/// A checkpoint read back from disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    /// Every record with an LSN up to and including this one is reflected in `snapshot`.
    pub(crate) lsn: Lsn,
    /// The caller's snapshot bytes, exactly as given to [`write()`].
    pub(crate) snapshot: Vec<u8>,
}

/// Path of the checkpoint file in `dir`.
pub(crate) fn path(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// Path of the temporary checkpoint file in `dir`.
pub(crate) fn tmp_path(dir: &Path) -> PathBuf {
    dir.join(TMP_FILE_NAME)
}

/// Serializes a checkpoint file image.
pub(crate) fn encode(lsn: Lsn, snapshot: &[u8]) -> Vec<u8> {
    let len = snapshot.len() as u64; // usize -> u64 never truncates on supported targets
    let mut out = Vec::with_capacity(HEADER_LEN + snapshot.len());
    out.extend_from_slice(MAGIC);
    out.push(CHECKPOINT_VERSION);
    out.extend_from_slice(&lsn.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&out);
    hasher.update(snapshot);
    out.extend_from_slice(&hasher.finalize().to_le_bytes());
    out.extend_from_slice(snapshot);
    out
}

/// Parses a checkpoint file image; `path` is only used to name the file in errors.
pub(crate) fn decode(path: &Path, bytes: &[u8]) -> Result<Checkpoint> {
    let damaged = |defect: String| -> Error {
        Corruption::Checkpoint { path: path.to_path_buf(), defect }.into()
    };
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(damaged("it does not start with the SHEETDCK magic".to_owned()));
    }
    if bytes.len() < HEADER_LEN {
        return Err(damaged(format!(
            "only {} of the {HEADER_LEN} header bytes are present",
            bytes.len()
        )));
    }
    // Magic matched, so this is our file: the version byte decides how to read the rest.
    let version = bytes[8];
    if version != CHECKPOINT_VERSION {
        return Err(Error::UnsupportedVersion {
            what: format!("the checkpoint file {}", path.display()),
            found: version,
            supported: CHECKPOINT_VERSION,
        });
    }
    let lsn = u64::from_le_bytes(bytes[9..17].try_into().expect("8-byte slice"));
    let len = u64::from_le_bytes(bytes[17..25].try_into().expect("8-byte slice"));
    let stored_crc = u32::from_le_bytes(bytes[25..29].try_into().expect("4-byte slice"));
    let snapshot = &bytes[HEADER_LEN..];
    if snapshot.len() as u64 != len {
        return Err(damaged(format!(
            "the header announces {len} snapshot bytes but {} are present",
            snapshot.len()
        )));
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&bytes[..25]);
    hasher.update(snapshot);
    if hasher.finalize() != stored_crc {
        return Err(damaged("CRC mismatch".to_owned()));
    }
    Ok(Checkpoint { lsn, snapshot: snapshot.to_vec() })
}

/// Reads `<dir>/checkpoint`; `Ok(None)` if there is none.
pub(crate) fn read(dir: &Path) -> Result<Option<Checkpoint>> {
    let path = path(dir);
    match fs::read(&path) {
        Ok(bytes) => decode(&path, &bytes).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::fs(format!("read the checkpoint file {}", path.display()))(e)),
    }
}

/// Atomically replaces `<dir>/checkpoint` (see the module docs for the steps and why).
/// Does not touch the log.
pub(crate) fn write(dir: &Path, lsn: Lsn, snapshot: &[u8]) -> Result<()> {
    let tmp = tmp_path(dir);
    let target = path(dir);
    let image = encode(lsn, snapshot);
    {
        let mut file =
            fs::File::create(&tmp).map_err(Error::fs(format!("create {}", tmp.display())))?;
        file.write_all(&image).map_err(Error::fs(format!("write {}", tmp.display())))?;
        // The data must be on disk before the rename makes it the checkpoint; otherwise a crash
        // could leave a correctly named file with garbage (or zero-length) contents.
        file.sync_all().map_err(Error::fs(format!("fsync {}", tmp.display())))?;
    }
    fs::rename(&tmp, &target).map_err(Error::fs(format!(
        "rename {} to {}",
        tmp.display(),
        target.display()
    )))?;
    // The rename is only durable once the directory entry is.
    fsutil::sync_dir(dir)
}

/// Removes a `checkpoint.tmp` left by a crash during [`write()`]; `Ok(true)` if one was found.
/// Only call this while holding the data dir's lock (a live writer may own the file).
pub(crate) fn remove_leftover_tmp(dir: &Path) -> Result<bool> {
    let removed = fsutil::remove_if_exists(&tmp_path(dir))?;
    if removed {
        fsutil::sync_dir(dir)?;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_round_trip() {
        let p = Path::new("/d/checkpoint");
        for snapshot in [&b""[..], b"snapshot bytes", &[7u8; 4096]] {
            let image = encode(99, snapshot);
            let back = decode(p, &image).unwrap();
            assert_eq!(back, Checkpoint { lsn: 99, snapshot: snapshot.to_vec() });
        }
    }

    #[test]
    fn any_damage_is_corruption() {
        let p = Path::new("/d/checkpoint");
        let image = encode(5, b"hello");
        for cut in 0..image.len() {
            let err = decode(p, &image[..cut]).unwrap_err();
            assert!(err.is_corruption(), "cut at {cut}: {err:?}");
        }
        for byte in 0..image.len() {
            if byte == 8 {
                continue; // the version byte: checked below
            }
            let mut damaged = image.clone();
            damaged[byte] ^= 0x10;
            let err = decode(p, &damaged).unwrap_err();
            assert!(err.is_corruption(), "flip in byte {byte}: {err:?}");
            assert!(err.to_string().contains("/d/checkpoint"), "{err}");
        }
        let mut newer = image.clone();
        newer[8] = CHECKPOINT_VERSION + 1;
        assert!(matches!(decode(p, &newer), Err(Error::UnsupportedVersion { .. })));
    }

    #[test]
    fn write_read_and_leftover_cleanup() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        write(dir.path(), 3, b"three").unwrap();
        write(dir.path(), 4, b"four").unwrap();
        assert_eq!(
            read(dir.path()).unwrap(),
            Some(Checkpoint { lsn: 4, snapshot: b"four".to_vec() })
        );
        assert!(!tmp_path(dir.path()).exists());

        fs::write(tmp_path(dir.path()), b"half-written").unwrap();
        assert!(remove_leftover_tmp(dir.path()).unwrap());
        assert!(!tmp_path(dir.path()).exists());
        assert!(!remove_leftover_tmp(dir.path()).unwrap());
    }
}
