//! Building a new data dir from a checkpoint and records at given LSNs: what a restore from a
//! backup writes, so that [`crate::Wal::recover`] then finds a log as a running server leaves it.
//!
//! Owns: [`Restore`], its order of steps and their checks. It writes the same files a running
//! log writes (the checkpoint file through the checkpoint writer, records framed as the commit
//! thread frames them), so nothing downstream knows the dir was restored.
//!
//! Records at or below the checkpoint are the ones a reader still reads by LSN (a change feed's
//! retained records): no sweep marker is written, so the first start asks its replayer about
//! each of them ([`crate::Replayer::retains`]), as after a crash between a checkpoint and its
//! truncation. The records above the checkpoint must follow it without a gap, as in a log.

use std::path::{Path, PathBuf};

use crate::checkpoint;
use crate::error::{Error, Result};
use crate::fsutil;
use crate::layout::entry::put_record;
use crate::log::LogStore;
use crate::Lsn;

/// Records are written in batches of about this many payload bytes, each made durable.
const BATCH_BYTES: usize = 8 * 1024 * 1024;

/// A data dir being built: [`Restore::create`], then [`Restore::checkpoint`] once, then
/// [`Restore::record`] in LSN order, then [`Restore::finish`]. Dropped unfinished, it leaves a
/// partial dir for the caller to remove.
pub struct Restore {
    dir: PathBuf,
    store: LogStore,
    checkpoint: Option<Lsn>,
    last: Lsn,
    batch: sled::Batch,
    batch_bytes: usize,
    records: u64,
}

impl std::fmt::Debug for Restore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Restore").field("dir", &self.dir).field("last", &self.last).finish()
    }
}

impl Restore {
    /// Starts a data dir in `dir`, which must be absent or empty.
    ///
    /// # Errors
    /// [`Error::NotEmpty`] if `dir` holds anything; I/O and sled errors.
    pub fn create(dir: &Path) -> Result<Restore> {
        if let Ok(mut entries) = std::fs::read_dir(dir) {
            if entries.next().is_some() {
                return Err(Error::NotEmpty { dir: dir.to_path_buf() });
            }
        }
        fsutil::ensure_dir(dir)?;
        let store = LogStore::open(dir, crate::Config::DEFAULT_CACHE_CAPACITY_BYTES)?;
        Ok(Restore {
            dir: dir.to_path_buf(),
            store,
            checkpoint: None,
            last: 0,
            batch: sled::Batch::default(),
            batch_bytes: 0,
            records: 0,
        })
    }

    /// Writes the checkpoint at `lsn`, its snapshot written by `snapshot` (as
    /// [`crate::Wal::checkpoint_streamed`] takes it). Must come before any record.
    ///
    /// # Errors
    /// A second checkpoint, or after a record; whatever `snapshot` returns; I/O errors.
    pub fn checkpoint(
        &mut self,
        lsn: Lsn,
        snapshot: &mut dyn FnMut(&mut dyn std::io::Write) -> Result<()>,
    ) -> Result<u64> {
        if self.checkpoint.is_some() || self.records > 0 || lsn == 0 {
            return Err(Error::Restore("the checkpoint comes once, first, at an LSN above 0"));
        }
        let len = checkpoint::write_with(&self.dir, lsn, snapshot)?;
        self.checkpoint = Some(lsn);
        Ok(len)
    }

    /// Adds the record `payload` at `lsn`: above the last one, and above the checkpoint only
    /// right after the one before it.
    ///
    /// # Errors
    /// An LSN out of order or leaving a gap after the checkpoint; I/O and sled errors.
    pub fn record(&mut self, lsn: Lsn, payload: &[u8]) -> Result<()> {
        let ckpt = self.checkpoint.unwrap_or(0);
        if lsn <= self.last {
            return Err(Error::Restore("records must come in increasing LSN order"));
        }
        if lsn > ckpt && lsn != (self.last.max(ckpt)) + 1 {
            return Err(Error::Restore(
                "records above the checkpoint must follow it without a gap",
            ));
        }
        put_record(&mut self.batch, lsn, payload)?;
        self.last = lsn;
        self.records += 1;
        self.batch_bytes += payload.len();
        if self.batch_bytes >= BATCH_BYTES {
            self.write_batch()?;
        }
        Ok(())
    }

    fn write_batch(&mut self) -> Result<()> {
        self.store.write(std::mem::take(&mut self.batch))?;
        self.batch_bytes = 0;
        Ok(())
    }

    /// Makes everything durable and closes the log; returns the last LSN (the checkpoint's
    /// when no record follows it).
    ///
    /// # Errors
    /// I/O and sled errors.
    pub fn finish(mut self) -> Result<Lsn> {
        self.write_batch()?;
        self.store.sync()?;
        fsutil::sync_dir(&self.dir)?;
        Ok(self.last.max(self.checkpoint.unwrap_or(0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, Replayer, Wal};

    #[derive(Default)]
    struct Seen {
        snapshot: Vec<u8>,
        records: Vec<(Lsn, Vec<u8>)>,
    }

    impl Replayer for Seen {
        fn checkpoint(
            &mut self,
            _: Lsn,
            snapshot: &mut dyn std::io::Read,
        ) -> std::result::Result<(), crate::BoxError> {
            snapshot.read_to_end(&mut self.snapshot)?;
            Ok(())
        }

        fn record(&mut self, lsn: Lsn, payload: &[u8]) -> std::result::Result<(), crate::BoxError> {
            self.records.push((lsn, payload.to_vec()));
            Ok(())
        }

        fn retains(&self, lsn: Lsn) -> bool {
            lsn == 2
        }
    }

    #[test]
    fn a_restored_dir_recovers_its_checkpoint_records_and_retained_records() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("restored");
        let mut restore = Restore::create(&target).unwrap();
        restore
            .checkpoint(3, &mut |out| {
                out.write_all(b"state at 3").map_err(Error::fs("write".to_owned()))
            })
            .unwrap();
        let big = vec![7u8; 10_000];
        restore.record(2, b"retained").unwrap();
        restore.record(4, &big).unwrap();
        restore.record(5, b"five").unwrap();
        assert_eq!(restore.finish().unwrap(), 5);

        let mut seen = Seen::default();
        let (wal, report) = Wal::recover(Config::default_for(&target), &mut seen).unwrap();
        assert_eq!(seen.snapshot, b"state at 3");
        assert_eq!(seen.records, vec![(4, big), (5, b"five".to_vec())]);
        assert_eq!((report.last_lsn, report.records_retained), (5, 1));
        assert_eq!(wal.read(2).unwrap().as_deref(), Some(&b"retained"[..]));
        assert_eq!(wal.append(b"six".to_vec()).unwrap().wait().unwrap(), 6);
    }

    #[test]
    fn a_gap_a_disorder_and_a_non_empty_dir_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut restore = Restore::create(&dir.path().join("a")).unwrap();
        restore
            .checkpoint(3, &mut |out| out.write_all(b"s").map_err(Error::fs("write".to_owned())))
            .unwrap();
        restore.record(4, b"four").unwrap();
        assert!(matches!(restore.record(4, b"again"), Err(Error::Restore(_))));
        assert!(matches!(restore.record(6, b"gap"), Err(Error::Restore(_))));
        drop(restore);
        std::fs::create_dir(dir.path().join("b")).unwrap();
        std::fs::write(dir.path().join("b/file"), b"x").unwrap();
        assert!(matches!(Restore::create(&dir.path().join("b")), Err(Error::NotEmpty { .. })));
    }
}
