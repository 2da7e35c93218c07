//! A snapshot's bytes as they move between a state machine and the link: in memory when
//! small, or in a file, so that a large state is never held whole in memory to be kept,
//! sent or received (a 1M-row sheet's checkpoint is hundreds of megabytes).
//!
//! Owns: [`SnapshotData`] (what openraft hands between the state machine and the network)
//! and [`Spool`] (where a receiver gathers a snapshot's parts, and the name of a spool file
//! that can become the kept snapshot).
//!
//! A file's bytes are read by position (`pread`), never through a shared cursor, so one kept
//! snapshot can be sent to two followers at once and read by an install meanwhile; and the
//! file stays readable after a newer snapshot is renamed over its name (the open handle holds
//! the old one).

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A snapshot's bytes.
pub enum SnapshotData {
    /// Held in memory: a small snapshot, or a state machine that keeps everything in memory.
    Bytes(Vec<u8>),
    /// `len` bytes of `file` from `start`.
    File {
        /// The open file (shared: a clone reads the same bytes).
        file: Arc<File>,
        /// Where the snapshot's bytes begin.
        start: u64,
        /// How many there are.
        len: u64,
        /// The file's name when it is a spool laid out to be kept as it is ([`Spool::to_keep`]).
        spooled: Option<Arc<SpoolName>>,
    },
}

/// The name of a spool file in its dir, laid out to be kept as it is: `head`, then the
/// snapshot's bytes. Whoever keeps the snapshot renames the file ([`SpoolName::kept`]); a
/// spool never kept is removed when the last handle to its bytes goes.
#[derive(Debug)]
pub struct SpoolName {
    path: PathBuf,
    head: Vec<u8>,
    kept: AtomicBool,
}

impl SpoolName {
    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the file holds before the snapshot's bytes.
    pub fn head(&self) -> &[u8] {
        &self.head
    }

    /// Says the file was renamed to be kept: it is not removed.
    pub fn kept(&self) {
        self.kept.store(true, Ordering::Relaxed);
    }
}

impl Drop for SpoolName {
    fn drop(&mut self) {
        if !self.kept.load(Ordering::Relaxed) {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// The prefix of a spool file's name in its dir: [`remove_stale_spools`] removes what a crash
/// left of them.
const SPOOL_PREFIX: &str = "raft-snapshot.incoming.";

/// Removes the spool files a process that stopped in the middle of gathering left in `dir`.
/// Call it before anything spools there.
///
/// # Errors
/// The dir cannot be listed, or a file cannot be removed.
pub fn remove_stale_spools(dir: &Path) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(SPOOL_PREFIX) {
            fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

impl fmt::Debug for SnapshotData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotData::Bytes(b) => write!(f, "SnapshotData::Bytes({} bytes)", b.len()),
            SnapshotData::File { start, len, .. } => {
                write!(f, "SnapshotData::File({len} bytes from {start})")
            }
        }
    }
}

impl SnapshotData {
    /// The number of bytes.
    pub fn len(&self) -> u64 {
        match self {
            SnapshotData::Bytes(b) => b.len() as u64,
            SnapshotData::File { len, .. } => *len,
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `len` bytes from `offset` (fewer at the end).
    ///
    /// # Errors
    /// The file cannot be read, or is shorter than it was.
    pub fn read_at(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let end = self.len().min(offset.saturating_add(len as u64));
        let n = usize::try_from(end.saturating_sub(offset)).map_err(io::Error::other)?;
        match self {
            SnapshotData::Bytes(b) => {
                let from = usize::try_from(offset).map_err(io::Error::other)?;
                Ok(b.get(from..from + n).map(<[u8]>::to_vec).unwrap_or_default())
            }
            SnapshotData::File { file, start, .. } => {
                let mut buf = vec![0; n];
                file.read_exact_at(&mut buf, start + offset)?;
                Ok(buf)
            }
        }
    }

    /// A reader of every byte from the first, buffered.
    pub fn reader(&self) -> impl Read + '_ {
        let inner: Box<dyn Read + '_> = match self {
            SnapshotData::Bytes(b) => Box::new(&b[..]),
            SnapshotData::File { file, start, len, .. } => {
                Box::new(FileReader { file, at: *start, end: start + len })
            }
        };
        io::BufReader::with_capacity(1 << 20, inner)
    }

    /// Every byte, in memory.
    ///
    /// # Errors
    /// The file cannot be read.
    pub fn into_bytes(self) -> io::Result<Vec<u8>> {
        match self {
            SnapshotData::Bytes(b) => Ok(b),
            file => {
                let mut bytes = Vec::new();
                file.reader().read_to_end(&mut bytes)?;
                Ok(bytes)
            }
        }
    }
}

/// Reads a file's range by position.
struct FileReader<'a> {
    file: &'a File,
    at: u64,
    end: u64,
}

impl Read for FileReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = usize::try_from(self.end - self.at).unwrap_or(usize::MAX);
        let want = buf.len().min(left);
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.at)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "a snapshot file shrank"));
        }
        self.at += n as u64;
        Ok(n)
    }
}

/// Where a receiver gathers a snapshot's parts: a file in a dir (the data dir, so a large
/// snapshot counts against the disk that will keep it, not against memory), or memory.
///
/// The file has no name ([`Spool::new`]): it is unlinked as soon as it is created, so a crash
/// leaves nothing behind, and two snapshots received at once (from an old and a new leader)
/// never share one. Or it keeps a name of its own and starts with the head a kept snapshot
/// starts with ([`Spool::to_keep`]), so that keeping it is a rename, not a copy; a crash may
/// leave such a file, which [`remove_stale_spools`] removes.
pub struct Spool {
    out: SpoolOut,
    written: u64,
    /// Where the bytes begin in the file: after the head of a spool to keep.
    start: u64,
    name: Option<SpoolName>,
}

enum SpoolOut {
    Memory(Vec<u8>),
    File(io::BufWriter<File>),
}

impl Spool {
    /// A spool in `dir`, or in memory when `dir` is `None`.
    ///
    /// # Errors
    /// The file cannot be created in `dir`.
    pub fn new(dir: Option<&Path>) -> io::Result<Spool> {
        let out = match dir {
            None => SpoolOut::Memory(Vec::new()),
            Some(dir) => {
                let (path, file) = Spool::create(dir)?;
                fs::remove_file(&path)?;
                SpoolOut::File(io::BufWriter::with_capacity(1 << 20, file))
            }
        };
        Ok(Spool { out, written: 0, start: 0, name: None })
    }

    /// A spool in a file of `dir` with a name of its own, starting with `head` (not counted in
    /// [`Spool::written`]): its finished bytes carry the name ([`SnapshotData::File`]'s
    /// `spooled`), for whoever keeps them to rename the file rather than copy it.
    ///
    /// # Errors
    /// The file cannot be created in `dir`, or the head written.
    pub fn to_keep(dir: &Path, head: Vec<u8>) -> io::Result<Spool> {
        let (path, file) = Spool::create(dir)?;
        // Named from here on: removed if anything below fails, or the spool is dropped.
        let name = SpoolName { path, head, kept: AtomicBool::new(false) };
        let mut out = io::BufWriter::with_capacity(1 << 20, file);
        out.write_all(&name.head)?;
        let start = name.head.len() as u64;
        Ok(Spool { out: SpoolOut::File(out), written: 0, start, name: Some(name) })
    }

    /// A new file of a name no other spool has, in `dir`.
    fn create(dir: &Path) -> io::Result<(PathBuf, File)> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{SPOOL_PREFIX}{}.{n}", std::process::id()));
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        Ok((path, file))
    }

    /// How many bytes were written.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Appends `bytes`.
    ///
    /// # Errors
    /// The file cannot be written (the disk is full).
    pub fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        match &mut self.out {
            SpoolOut::Memory(v) => v.extend_from_slice(bytes),
            SpoolOut::File(w) => w.write_all(bytes)?,
        }
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// The bytes written, as a snapshot's data. Not fsynced: whoever keeps them writes them
    /// where they are kept, durably.
    ///
    /// # Errors
    /// The last bytes cannot be written.
    pub fn finish(self) -> io::Result<SnapshotData> {
        match self.out {
            SpoolOut::Memory(v) => Ok(SnapshotData::Bytes(v)),
            SpoolOut::File(w) => {
                let file = w.into_inner().map_err(io::IntoInnerError::into_error)?;
                Ok(SnapshotData::File {
                    file: Arc::new(file),
                    start: self.start,
                    len: self.written,
                    spooled: self.name.map(Arc::new),
                })
            }
        }
    }
}

/// A spool written as a stream (a checkpoint's writer takes a [`Write`]).
impl Write for Spool {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        Spool::write(self, bytes)?;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.out {
            SpoolOut::Memory(_) => Ok(()),
            SpoolOut::File(w) => w.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spooled_file_reads_back_by_range_and_whole_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::new(Some(dir.path())).unwrap();
        let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        for chunk in bytes.chunks(70_001) {
            spool.write(chunk).unwrap();
        }
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0, "the spool has no name");
        let data = spool.finish().unwrap();
        assert_eq!(data.len(), bytes.len() as u64);
        assert_eq!(data.read_at(1_000_000, 10).unwrap(), bytes[1_000_000..1_000_010]);
        assert_eq!(data.read_at(2_999_995, 10).unwrap(), bytes[2_999_995..]);
        assert!(data.read_at(3_000_000, 10).unwrap().is_empty());
        assert_eq!(data.into_bytes().unwrap(), bytes);
    }

    #[test]
    fn a_range_of_a_file_reads_only_that_range() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        fs::write(&path, b"headerPAYLOADtrailer").unwrap();
        let data = SnapshotData::File {
            file: Arc::new(File::open(&path).unwrap()),
            start: 6,
            len: 7,
            spooled: None,
        };
        let mut read = Vec::new();
        data.reader().read_to_end(&mut read).unwrap();
        assert_eq!(read, b"PAYLOAD");
        assert_eq!(data.read_at(3, 100).unwrap(), b"LOAD");
    }

    #[test]
    fn memory_spools_and_bytes_read_the_same() {
        let mut spool = Spool::new(None).unwrap();
        spool.write(b"abc").unwrap();
        spool.write(b"def").unwrap();
        let data = spool.finish().unwrap();
        assert_eq!(data.read_at(2, 3).unwrap(), b"cde");
        assert_eq!(data.into_bytes().unwrap(), b"abcdef");
    }

    #[test]
    fn a_spool_to_keep_starts_with_its_head_and_goes_unless_kept() {
        let dir = tempfile::tempdir().unwrap();
        let names = || fs::read_dir(dir.path()).unwrap().count();
        // Dropped before it is finished: gone.
        let mut spool = Spool::to_keep(dir.path(), b"HEAD".to_vec()).unwrap();
        spool.write(b"abc").unwrap();
        assert_eq!(names(), 1);
        drop(spool);
        assert_eq!(names(), 0);
        // Finished: the bytes after the head, the file gone with the last handle.
        let mut spool = Spool::to_keep(dir.path(), b"HEAD".to_vec()).unwrap();
        spool.write(b"abc").unwrap();
        let data = spool.finish().unwrap();
        let SnapshotData::File { spooled: Some(name), .. } = &data else { panic!("{data:?}") };
        assert_eq!(fs::read(name.path()).unwrap(), b"HEADabc");
        assert_eq!(data.read_at(0, 10).unwrap(), b"abc");
        drop(data);
        assert_eq!(names(), 0);
        // Kept (renamed by its keeper): left where it was put.
        let spool = Spool::to_keep(dir.path(), b"HEAD".to_vec()).unwrap();
        let data = spool.finish().unwrap();
        let SnapshotData::File { spooled: Some(name), .. } = &data else { panic!("{data:?}") };
        fs::rename(name.path(), dir.path().join("kept")).unwrap();
        name.kept();
        drop(data);
        assert_eq!(fs::read(dir.path().join("kept")).unwrap(), b"HEAD");
        // What a crash leaves is removed; nothing else is.
        std::mem::forget(Spool::to_keep(dir.path(), Vec::new()).unwrap());
        assert_eq!(names(), 2);
        remove_stale_spools(dir.path()).unwrap();
        assert_eq!(names(), 1);
    }
}
