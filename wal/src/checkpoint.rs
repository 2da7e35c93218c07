//! The checkpoint file: one snapshot that replaces every log record up to its LSN.
//!
//! Owns: `<data dir>/checkpoint` and its temporary `<data dir>/checkpoint.tmp`.
//!
//! Layout (all integers little-endian):
//!
//! ```text
//! [magic "SHEETDCK" 8][version u8 = 2][lsn u64][len u64][crc32 u32 of the 25 bytes before]
//! then the snapshot's `len` bytes in blocks of `BLOCK` (the last one shorter), each
//! [crc32 u32 of (lsn, block index u64, the block)][the block]
//! ```
//!
//! A start reads the snapshot once, checking each block just before it hands the block on:
//! nothing unchecked reaches the decoder, and no pass of its own reads the whole file for a
//! CRC first. The LSN and index in a block's CRC keep a block of another checkpoint, or one
//! out of place, from passing. Version 1 files (one CRC, after the header, over the header and
//! the whole snapshot, checked by a pass of its own when opened) are still read.
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
//!
//! # The sweep marker
//!
//! `<data dir>/checkpoint.swept` says that the log holds, at or below the checkpoint's LSN,
//! only records the checkpoint retains (and how many and how large): it is written after the
//! truncation is durable ([`write_swept`]). A recovery that finds it naming the checkpoint's
//! LSN starts its walk of the log after that LSN instead of reading every retained record (a
//! change feed may retain gigabytes). The marker can only ever be missing or behind, never
//! ahead: a missing, damaged or older marker means a full walk, which is always correct.
//!
//! ```text
//! [magic "SHEETDS2" 8][lsn u64][records u64][bytes u64][crc32 u32]
//! then, optionally, the stored entries themselves:
//! [codec bytes of [(lsn - previous lsn, chunks, packed, bytes)]][crc32 u32 of this part]
//! ```
//!
//! A marker with the magic "SHEETDSW" (written before packs existed) lists
//! `(lsn - previous lsn, chunks, bytes)`, each one record; it is still read.
//!
//! With the list, the log's first truncation after a start asks about those records only, as
//! every later one does, instead of reading them back (`log::LogStore::remove_through_except`).
//! A marker without it (an older build's, or a damaged list) still saves the start its walk.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::error::{Corruption, Error, Result};
use crate::fsutil;
use crate::layout::entry::Kept;
use crate::Lsn;

/// First bytes of every checkpoint file.
pub const MAGIC: &[u8; 8] = b"SHEETDCK";
/// Version of the checkpoint file layout this build writes.
pub const CHECKPOINT_VERSION: u8 = 2;
/// The layout with one CRC over the header and the whole snapshot, still read.
const WHOLE_CRC_VERSION: u8 = 1;
/// Bytes before the snapshot: magic (8) + version (1) + lsn (8) + len (8) + crc (4).
pub const HEADER_LEN: usize = 29;
/// Snapshot bytes per checked block: its CRC costs 4 bytes a MiB, and a reader's buffer of
/// this size takes a block in one read.
pub const BLOCK: usize = 1 << 20;
/// Bytes of a block's CRC.
const BLOCK_CRC_LEN: usize = 4;
/// File name of the checkpoint inside the data dir.
pub const FILE_NAME: &str = "checkpoint";
/// File name of the checkpoint being written.
pub const TMP_FILE_NAME: &str = "checkpoint.tmp";
/// File name of the replaced checkpoint while its space is given back.
pub const OLD_FILE_NAME: &str = "checkpoint.old";

/// File name of the sweep marker inside the data dir (see the module docs).
pub const SWEPT_FILE_NAME: &str = "checkpoint.swept";
const SWEPT_MAGIC: &[u8; 8] = b"SHEETDS2";
/// The magic of a marker whose list has no pack counts (every entry one record).
const SWEPT_MAGIC_UNPACKED: &[u8; 8] = b"SHEETDSW";
const SWEPT_LEN: usize = 8 + 8 + 8 + 8 + 4;

/// What the sweep marker says of the log at or below a checkpoint's LSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Swept {
    /// The checkpoint LSN it was written for.
    pub(crate) lsn: Lsn,
    /// Records kept at or below it (retained, or stored in one pack with a retained one).
    pub(crate) records: u64,
    /// Their stored bytes.
    pub(crate) bytes: u64,
}

impl Swept {
    /// The marker of the checkpoint at `lsn` that retains `kept`.
    pub(crate) fn of(lsn: Lsn, kept: &[Kept]) -> Swept {
        Swept {
            lsn,
            records: kept.iter().map(|k| u64::from(k.records())).sum(),
            bytes: kept.iter().map(|k| k.bytes).sum(),
        }
    }
}

/// Records that the log holds nothing at or below `lsn` but `kept`, the records the
/// checkpoint at `lsn` retains (their count and bytes, then the list). Only call it once the
/// truncation of that checkpoint is durable.
pub(crate) fn write_swept(dir: &Path, lsn: Lsn, kept: &[Kept]) -> Result<()> {
    let swept = Swept::of(lsn, kept);
    let mut image = Vec::with_capacity(SWEPT_LEN);
    image.extend_from_slice(SWEPT_MAGIC);
    for n in [swept.lsn, swept.records, swept.bytes] {
        image.extend_from_slice(&n.to_le_bytes());
    }
    let crc = crc32fast::hash(&image);
    image.extend_from_slice(&crc.to_le_bytes());
    // Each LSN as its distance from the one before: one or two bytes apiece, where the plain
    // numbers took 20 bytes a record (10 MB for the engine bench's 480,000).
    let mut previous = 0;
    let deltas: Vec<(u64, u32, u32, u64)> = kept
        .iter()
        .map(|k| (k.lsn - std::mem::replace(&mut previous, k.lsn), k.chunks, k.packed, k.bytes))
        .collect();
    image.extend_from_slice(&crate::codec::encode(&deltas)?);
    let crc = crc32fast::hash(&image[SWEPT_LEN..]);
    image.extend_from_slice(&crc.to_le_bytes());
    let (tmp, target) = (dir.join("checkpoint.swept.tmp"), dir.join(SWEPT_FILE_NAME));
    {
        let mut file =
            fs::File::create(&tmp).map_err(Error::fs(format!("create {}", tmp.display())))?;
        file.write_all(&image).map_err(Error::fs(format!("write {}", tmp.display())))?;
        file.sync_all().map_err(Error::fs(format!("fsync {}", tmp.display())))?;
    }
    // No directory fsync: a marker lost to a crash only means one full walk.
    fs::rename(&tmp, &target).map_err(Error::fs(format!("rename {}", tmp.display())))
}

/// The sweep marker, if there is a valid one for the checkpoint at `lsn`, with the marker's
/// bytes, its list of records still encoded: [`read_kept`] decodes it, which for a large feed
/// takes a start tens of milliseconds better spent beside the checkpoint's decoding.
pub(crate) fn read_swept(dir: &Path, lsn: Lsn) -> Option<(Swept, Vec<u8>)> {
    let bytes = fs::read(dir.join(SWEPT_FILE_NAME)).ok()?;
    let magic = bytes.first_chunk::<8>();
    if bytes.len() < SWEPT_LEN
        || !magic.is_some_and(|m| [SWEPT_MAGIC, SWEPT_MAGIC_UNPACKED].contains(&m))
    {
        return None;
    }
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(bytes[32..36].try_into().expect("4 bytes"));
    let swept = Swept { lsn: word(8), records: word(16), bytes: word(24) };
    if crc32fast::hash(&bytes[..32]) != crc || swept.lsn != lsn {
        return None;
    }
    Some((swept, bytes))
}

/// The list of a sweep marker (its bytes from [`read_swept`]), if it is whole and agrees with
/// `swept`.
pub(crate) fn read_kept(marker: &[u8], swept: Swept) -> Option<Vec<Kept>> {
    let (encoded, crc) = marker.get(SWEPT_LEN..)?.split_last_chunk::<4>()?;
    if crc32fast::hash(encoded) != u32::from_le_bytes(*crc) {
        return None;
    }
    let deltas: Vec<(u64, u32, u32, u64)> = if marker.starts_with(SWEPT_MAGIC) {
        crate::codec::decode(encoded).ok()?
    } else {
        let unpacked: Vec<(u64, u32, u64)> = crate::codec::decode(encoded).ok()?;
        unpacked.into_iter().map(|(delta, chunks, bytes)| (delta, chunks, 0, bytes)).collect()
    };
    let mut next = 1u64;
    let mut kept = Vec::with_capacity(deltas.len());
    for (delta, chunks, packed, bytes) in deltas {
        // Entries ascend and never overlap; a pack holds two records or more.
        let lsn = kept.last().map_or(0, |k: &Kept| k.lsn).checked_add(delta)?;
        let entry = Kept { lsn, chunks, packed, bytes };
        if lsn < next || packed == 1 || lsn.checked_add(u64::from(packed)).is_none() {
            return None;
        }
        next = entry.last() + 1;
        kept.push(entry);
    }
    let agrees = kept.iter().map(|k| u64::from(k.records())).sum::<u64>() == swept.records
        && kept.iter().try_fold(0u64, |sum, k| sum.checked_add(k.bytes)) == Some(swept.bytes)
        && kept.last().is_none_or(|k| k.last() <= swept.lsn);
    agrees.then_some(kept)
}

/// Writes the sweep marker; failing to is not an error (the next start walks the whole log).
pub(crate) fn note_swept(dir: &Path, lsn: Lsn, kept: &[Kept]) {
    if let Err(e) = write_swept(dir, lsn, kept) {
        tracing::warn!(error = %e, "could not write the sweep marker; the next start reads the whole log");
    }
}

/// Removes the sweep marker (before a change that could make it wrong).
pub(crate) fn remove_swept(dir: &Path) -> Result<()> {
    fsutil::remove_if_exists(&dir.join(SWEPT_FILE_NAME)).map(|_| ())
}

/// A checkpoint on disk whose header has been checked, open to stream its snapshot: a start
/// never holds the whole file in memory (the snapshot is most of a data dir's size).
#[derive(Debug)]
pub(crate) struct Checkpoint<F = fs::File> {
    /// Every record with an LSN up to and including this one is reflected in the snapshot.
    pub(crate) lsn: Lsn,
    /// Bytes of the snapshot.
    pub(crate) len: u64,
    /// The layout: a version 1 file had its whole CRC checked when it was opened.
    version: u8,
    /// The file's path, to name it in errors.
    path: PathBuf,
    /// The file, positioned anywhere; [`Checkpoint::snapshot`] seeks.
    file: F,
}

impl<F: Read + Seek> Checkpoint<F> {
    /// The caller's snapshot bytes, exactly as given to [`write()`], read from the file. A
    /// damaged block fails the read that reaches it, and [`Snapshot::damage`] then says how.
    pub(crate) fn snapshot(&mut self) -> std::io::Result<Snapshot<'_, F>> {
        self.file.seek(SeekFrom::Start(HEADER_LEN as u64))?;
        if self.version == WHOLE_CRC_VERSION {
            // Unbuffered: the reader of a snapshot buffers it (`codec::stream` does).
            return Ok(Snapshot::Checked((&mut self.file).take(self.len)));
        }
        Ok(Snapshot::Blocks(BlockReader {
            file: (&mut self.file).take(blocks_size(self.len)),
            lsn: self.lsn,
            index: 0,
            left: self.len,
            block: Vec::new(),
            at: 0,
            damage: None,
            path: &self.path,
        }))
    }
}

impl Checkpoint<std::io::Cursor<Vec<u8>>> {
    /// A checkpoint known by its LSN alone, for a scan whose replayer does not read the
    /// snapshot (a heal re-checks the log; the state it describes is already in memory).
    pub(crate) fn lsn_only(lsn: Lsn) -> Self {
        let file = std::io::Cursor::new(Vec::new());
        Checkpoint { lsn, len: 0, version: CHECKPOINT_VERSION, path: PathBuf::new(), file }
    }
}

/// A checkpoint's snapshot as [`Checkpoint::snapshot`] streams it.
pub(crate) enum Snapshot<'a, F> {
    /// A version 1 file, checked whole when it was opened.
    Checked(std::io::Take<&'a mut F>),
    /// A file of blocks, each checked as it is read.
    Blocks(BlockReader<'a, F>),
}

impl<F: Read> Snapshot<'_, F> {
    /// The damage a read met, as recovery reports it: which block, and what was wrong.
    pub(crate) fn damage(&self) -> Option<Error> {
        match self {
            Snapshot::Checked(_) => None,
            Snapshot::Blocks(blocks) => blocks.damage.clone().map(|defect| {
                Corruption::Checkpoint { path: blocks.path.to_path_buf(), defect }.into()
            }),
        }
    }
}

impl<F: Read> Read for Snapshot<'_, F> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Snapshot::Checked(whole) => whole.read(out),
            Snapshot::Blocks(blocks) => blocks.read(out),
        }
    }
}

/// Reads a snapshot's blocks, checking each before any of its bytes are handed out.
pub(crate) struct BlockReader<'a, F> {
    file: std::io::Take<&'a mut F>,
    lsn: Lsn,
    /// The index of the next block.
    index: u64,
    /// Snapshot bytes in the blocks not read yet.
    left: u64,
    /// A checked block that a read smaller than it started on, and how much of it went out.
    block: Vec<u8>,
    at: usize,
    /// What was wrong with the damaged block a read met.
    damage: Option<String>,
    path: &'a Path,
}

impl<F: Read> BlockReader<'_, F> {
    /// Reads the next block into `into` (exactly its length) and checks it.
    fn next_block(&mut self, into: &mut [u8]) -> std::io::Result<()> {
        let mut crc = [0u8; BLOCK_CRC_LEN];
        let read = self.file.read_exact(&mut crc).and_then(|()| self.file.read_exact(into));
        let index = self.index;
        let damage = match read {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                format!("block {index} of the snapshot is cut short")
            }
            Err(e) => return Err(e),
            Ok(()) if block_crc(self.lsn, index, into) != u32::from_le_bytes(crc) => {
                format!("block {index} of the snapshot fails its CRC")
            }
            Ok(()) => {
                self.index += 1;
                self.left -= into.len() as u64;
                return Ok(());
            }
        };
        self.damage = Some(damage.clone());
        Err(std::io::Error::new(std::io::ErrorKind::InvalidData, damage))
    }
}

impl<F: Read> Read for BlockReader<'_, F> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.damage.is_some() {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "damaged snapshot"));
        }
        if self.at == self.block.len() {
            if self.left == 0 || out.is_empty() {
                return Ok(0);
            }
            let len = usize::try_from(self.left.min(BLOCK as u64)).expect("at most BLOCK");
            if out.len() >= len {
                // Straight into the caller's buffer (a `BufReader` of a block's size asks for
                // that much), and checked before the call returns: nothing unchecked escapes.
                self.next_block(&mut out[..len])?;
                return Ok(len);
            }
            let mut block = std::mem::take(&mut self.block);
            block.resize(len, 0);
            self.at = 0;
            let read = self.next_block(&mut block);
            self.block = block;
            if let Err(e) = read {
                self.at = self.block.len();
                return Err(e);
            }
        }
        let n = out.len().min(self.block.len() - self.at);
        out[..n].copy_from_slice(&self.block[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Bytes read from the checkpoint file at a time.
const READ_BUFFER: usize = 1 << 20;

/// Path of the checkpoint file in `dir`.
pub(crate) fn path(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// Path of the temporary checkpoint file in `dir`.
pub(crate) fn tmp_path(dir: &Path) -> PathBuf {
    dir.join(TMP_FILE_NAME)
}

/// Serializes a checkpoint file image.
#[cfg(test)]
fn encode(lsn: Lsn, snapshot: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + snapshot.len() + snapshot.len() / BLOCK * 4 + 4);
    out.extend_from_slice(&header(lsn, snapshot.len() as u64));
    let mut blocks = Blocks::new(out, lsn);
    // Writing to a vector cannot fail.
    blocks.write_all(snapshot).expect("in memory");
    blocks.finish().expect("in memory").0
}

/// Checks the checkpoint file `file`: its header and size, and a version 1 file's CRC in one
/// streaming pass (a version 2 file's blocks are checked as they are read); `path` names the
/// file in errors.
pub(crate) fn check<F: Read + Seek>(path: &Path, mut file: F) -> Result<Checkpoint<F>> {
    let damaged = |defect: String| -> Error {
        Corruption::Checkpoint { path: path.to_path_buf(), defect }.into()
    };
    let read_error =
        |e: std::io::Error| Error::fs(format!("read the checkpoint file {}", path.display()))(e);
    let size = file.seek(SeekFrom::End(0)).map_err(read_error)?;
    file.rewind().map_err(read_error)?;
    let mut header = [0u8; HEADER_LEN];
    let present = usize::try_from(size).unwrap_or(usize::MAX).min(HEADER_LEN);
    file.read_exact(&mut header[..present]).map_err(read_error)?;
    if present < MAGIC.len() || &header[..MAGIC.len()] != MAGIC {
        return Err(damaged("it does not start with the SHEETDCK magic".to_owned()));
    }
    if present < HEADER_LEN {
        return Err(damaged(format!(
            "only {present} of the {HEADER_LEN} header bytes are present"
        )));
    }
    // Magic matched, so this is our file: the version byte decides how to read the rest.
    let version = header[8];
    if version != CHECKPOINT_VERSION && version != WHOLE_CRC_VERSION {
        return Err(Error::UnsupportedVersion {
            what: format!("the checkpoint file {}", path.display()),
            found: version,
            supported: CHECKPOINT_VERSION,
        });
    }
    let lsn = u64::from_le_bytes(header[9..17].try_into().expect("8-byte slice"));
    let len = u64::from_le_bytes(header[17..25].try_into().expect("8-byte slice"));
    let stored_crc = u32::from_le_bytes(header[25..29].try_into().expect("4-byte slice"));
    let present = size - HEADER_LEN as u64;
    if version == CHECKPOINT_VERSION {
        if crc32fast::hash(&header[..25]) != stored_crc {
            return Err(damaged("the header fails its CRC".to_owned()));
        }
        let stored = blocks_size(len);
        if present != stored {
            return Err(damaged(format!(
                "the header announces {len} snapshot bytes, stored in {stored}, but {present} \
                 are present"
            )));
        }
        return Ok(Checkpoint { lsn, len, version, path: path.to_path_buf(), file });
    }
    if present != len {
        return Err(damaged(format!(
            "the header announces {len} snapshot bytes but {present} are present"
        )));
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header[..25]);
    let mut buf = vec![0u8; READ_BUFFER];
    loop {
        let n = file.read(&mut buf).map_err(read_error)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    if hasher.finalize() != stored_crc {
        return Err(damaged("CRC mismatch".to_owned()));
    }
    Ok(Checkpoint { lsn, len, version, path: path.to_path_buf(), file })
}

/// Opens and checks `<dir>/checkpoint`; `Ok(None)` if there is none.
pub(crate) fn read(dir: &Path) -> Result<Option<Checkpoint>> {
    let path = path(dir);
    match fs::File::open(&path) {
        Ok(file) => check(&path, file).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::fs(format!("read the checkpoint file {}", path.display()))(e)),
    }
}

/// Atomically replaces `<dir>/checkpoint` (see the module docs for the steps and why).
/// Does not touch the log.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn write(dir: &Path, lsn: Lsn, snapshot: &[u8]) -> Result<()> {
    write_with(dir, lsn, &mut |out| {
        out.write_all(snapshot).map_err(Error::fs("write the checkpoint snapshot".to_owned()))
    })
    .map(|_| ())
}

/// Writes what it is given as checked blocks (see the module docs), counting the snapshot's
/// bytes. A block goes out in one write, its CRC in the first bytes of the buffer; the buffer
/// also spares the file the small writes a snapshot is made of.
struct Blocks<W> {
    inner: W,
    lsn: Lsn,
    /// The next block's index.
    index: u64,
    /// Room for the CRC, then the block being filled.
    buf: Vec<u8>,
    /// Snapshot bytes written out so far.
    len: u64,
}

impl<W: Write> Blocks<W> {
    fn new(inner: W, lsn: Lsn) -> Self {
        let mut buf = Vec::with_capacity(BLOCK_CRC_LEN + BLOCK);
        buf.resize(BLOCK_CRC_LEN, 0);
        Blocks { inner, lsn, index: 0, buf, len: 0 }
    }

    /// Writes out the block in the buffer, if it holds any bytes.
    fn emit(&mut self) -> std::io::Result<()> {
        let block = &self.buf[BLOCK_CRC_LEN..];
        if block.is_empty() {
            return Ok(());
        }
        let crc = block_crc(self.lsn, self.index, block);
        self.len += block.len() as u64;
        self.buf[..BLOCK_CRC_LEN].copy_from_slice(&crc.to_le_bytes());
        self.inner.write_all(&self.buf)?;
        self.buf.truncate(BLOCK_CRC_LEN);
        self.index += 1;
        Ok(())
    }

    /// Writes out the last, partial block; returns the writer and the snapshot's length.
    fn finish(mut self) -> std::io::Result<(W, u64)> {
        self.emit()?;
        Ok((self.inner, self.len))
    }
}

impl<W: Write> Write for Blocks<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let room = BLOCK_CRC_LEN + BLOCK - self.buf.len();
        let n = room.min(buf.len());
        self.buf.extend_from_slice(&buf[..n]);
        if self.buf.len() == BLOCK_CRC_LEN + BLOCK {
            self.emit()?;
        }
        Ok(n)
    }

    /// Flushes what was written out, never a partial block: blocks have a fixed size.
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The CRC of block `index` of the checkpoint at `lsn`.
fn block_crc(lsn: Lsn, index: u64, block: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&lsn.to_le_bytes());
    crc.update(&index.to_le_bytes());
    crc.update(block);
    crc.finalize()
}

/// The stored size of a snapshot of `len` bytes: its blocks and their CRCs.
fn blocks_size(len: u64) -> u64 {
    len.saturating_add(len.div_ceil(BLOCK as u64) * BLOCK_CRC_LEN as u64)
}

/// The header of a checkpoint at `lsn` with a snapshot of `len` bytes.
fn header(lsn: Lsn, len: u64) -> [u8; HEADER_LEN] {
    let mut header = [0u8; HEADER_LEN];
    header[..8].copy_from_slice(MAGIC);
    header[8] = CHECKPOINT_VERSION;
    header[9..17].copy_from_slice(&lsn.to_le_bytes());
    header[17..25].copy_from_slice(&len.to_le_bytes());
    let crc = crc32fast::hash(&header[..25]);
    header[25..29].copy_from_slice(&crc.to_le_bytes());
    header
}

/// [`write()`] with the snapshot streamed by `snapshot` into the file as it is produced, so a
/// checkpoint of a large state is never held whole in memory. The header, which holds the
/// snapshot's length, is written last, before the fsync. Returns the snapshot's length.
pub(crate) fn write_with(
    dir: &Path,
    lsn: Lsn,
    snapshot: &mut dyn FnMut(&mut dyn Write) -> Result<()>,
) -> Result<u64> {
    let tmp = tmp_path(dir);
    let target = path(dir);
    let written = (|| -> Result<u64> {
        let mut file =
            fs::File::create(&tmp).map_err(Error::fs(format!("create {}", tmp.display())))?;
        file.write_all(&[0; HEADER_LEN]).map_err(Error::fs(format!("write {}", tmp.display())))?;
        let mut out = Blocks::new(fsutil::SyncEvery::new(file), lsn);
        snapshot(&mut out)?;
        let (file, len) = out.finish().map_err(Error::fs(format!("write {}", tmp.display())))?;
        let mut file = file.into_inner();
        file.seek(SeekFrom::Start(0))
            .and_then(|_| file.write_all(&header(lsn, len)))
            .map_err(Error::fs(format!("write {}", tmp.display())))?;
        // The data must be on disk before the rename makes it the checkpoint; otherwise a crash
        // could leave a correctly named file with garbage (or zero-length) contents.
        file.sync_all().map_err(Error::fs(format!("fsync {}", tmp.display())))?;
        Ok(len)
    })();
    if written.is_err() {
        // Not needed for safety (the next start removes it), only to give the space back.
        let _ = fs::remove_file(&tmp);
    }
    let len = written?;
    // The checkpoint being replaced keeps a second name until the new one is in place, so the
    // rename frees none of its blocks: freeing hundreds of megabytes at once is one large
    // journal transaction, which every group commit's fdatasync then waits behind (patches at
    // 64 connections saw 59-68 ms at the end of each checkpoint). It is given back in steps
    // after ([`release_gradually`]). `checkpoint` names a whole checkpoint at every moment.
    let old = old_path(dir);
    let _ = fs::remove_file(&old);
    let kept_old = fs::hard_link(&target, &old).is_ok();
    fs::rename(&tmp, &target).map_err(Error::fs(format!(
        "rename {} to {}",
        tmp.display(),
        target.display()
    )))?;
    // The rename is only durable once the directory entry is.
    fsutil::sync_dir(dir)?;
    if kept_old {
        release_gradually(&old);
    }
    Ok(len)
}

/// Bytes given back at a time by [`release_gradually`].
const RELEASE_STEP: u64 = 16 << 20;

/// Removes the file at `path` a [`RELEASE_STEP`] at a time, shortening it from its end, each
/// step its own small transaction of the file system's journal, and a millisecond apart so
/// group commits fit between them. Nothing here needs to be durable: a leftover is removed
/// at the next start ([`remove_leftover_tmp`]).
fn release_gradually(path: &Path) {
    if let Ok(file) = fs::OpenOptions::new().write(true).open(path) {
        let mut len = file.metadata().map_or(0, |m| m.len());
        while len > 0 {
            len = len.saturating_sub(RELEASE_STEP);
            if file.set_len(len).is_err() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    let _ = fs::remove_file(path);
}

/// Path of the replaced checkpoint while it is given back (see [`write_with`]).
pub(crate) fn old_path(dir: &Path) -> PathBuf {
    dir.join(OLD_FILE_NAME)
}

/// Removes a `checkpoint.tmp` left by a crash during [`write()`]; `Ok(true)` if one was found.
/// Only call this while holding the data dir's lock (a live writer may own the file).
pub(crate) fn remove_leftover_tmp(dir: &Path) -> Result<bool> {
    // A replaced checkpoint a crash left before it was given back: no longer needed.
    fsutil::remove_if_exists(&old_path(dir))?;
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
    fn a_sweep_marker_keeps_its_list_and_a_damaged_list_costs_only_the_list() {
        let dir = tempfile::tempdir().unwrap();
        let kept = vec![
            Kept { lsn: 3, chunks: 0, packed: 0, bytes: 40 },
            Kept { lsn: 9, chunks: 3, packed: 0, bytes: 12_050 },
            Kept { lsn: 12, chunks: 0, packed: 0, bytes: 77 },
            Kept { lsn: 13, chunks: 0, packed: 5, bytes: 900 },
        ];
        let swept = Swept { lsn: 20, records: 8, bytes: 40 + 12_050 + 77 + 900 };
        write_swept(dir.path(), 20, &kept).unwrap();
        let read_swept = |dir: &Path, lsn| {
            read_swept(dir, lsn).map(|(swept, list)| (swept, read_kept(&list, swept)))
        };
        assert_eq!(read_swept(dir.path(), 20), Some((swept, Some(kept.clone()))));
        assert_eq!(read_swept(dir.path(), 21), None, "another checkpoint's marker");

        let path = dir.path().join(SWEPT_FILE_NAME);
        let image = fs::read(&path).unwrap();
        assert!(image.len() < SWEPT_LEN + 4 * 20, "deltas and varints: {} bytes", image.len());
        // Any damaged byte of the list, or a cut one: the counts are still good.
        for at in SWEPT_LEN..image.len() {
            let mut damaged = image.clone();
            damaged[at] ^= 1;
            fs::write(&path, &damaged).unwrap();
            assert_eq!(read_swept(dir.path(), 20), Some((swept, None)), "byte {at}");
        }
        fs::write(&path, &image[..image.len() - 5]).unwrap();
        assert_eq!(read_swept(dir.path(), 20), Some((swept, None)));
        // An older build's marker has no list.
        fs::write(&path, &image[..SWEPT_LEN]).unwrap();
        assert_eq!(read_swept(dir.path(), 20), Some((swept, None)));
    }

    #[test]
    fn a_marker_from_before_packs_is_read_as_one_record_an_entry() {
        let dir = tempfile::tempdir().unwrap();
        let swept = Swept { lsn: 20, records: 2, bytes: 40 + 12_050 };
        let mut image = SWEPT_MAGIC_UNPACKED.to_vec();
        for n in [swept.lsn, swept.records, swept.bytes] {
            image.extend_from_slice(&n.to_le_bytes());
        }
        image.extend_from_slice(&crc32fast::hash(&image).to_le_bytes());
        let list: Vec<(u64, u32, u64)> = vec![(3, 0, 40), (6, 3, 12_050)];
        image.extend_from_slice(&crate::codec::encode(&list).unwrap());
        image.extend_from_slice(&crc32fast::hash(&image[SWEPT_LEN..]).to_le_bytes());
        fs::write(dir.path().join(SWEPT_FILE_NAME), &image).unwrap();
        let (read, list) = read_swept(dir.path(), 20).unwrap();
        assert_eq!(read, swept);
        assert_eq!(
            read_kept(&list, read),
            Some(vec![
                Kept { lsn: 3, chunks: 0, packed: 0, bytes: 40 },
                Kept { lsn: 9, chunks: 3, packed: 0, bytes: 12_050 },
            ])
        );
    }

    #[test]
    fn a_marker_list_with_overlapping_entries_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        // A pack of 3 from LSN 3 covers LSN 5: an entry at 5 cannot follow it.
        let kept = [
            Kept { lsn: 3, chunks: 0, packed: 3, bytes: 40 },
            Kept { lsn: 5, chunks: 0, packed: 0, bytes: 10 },
        ];
        write_swept(dir.path(), 20, &kept).unwrap();
        let (swept, list) = read_swept(dir.path(), 20).unwrap();
        assert_eq!(swept.records, 4);
        assert_eq!(read_kept(&list, swept), None);
    }

    /// Checks a file image held in memory and reads its snapshot.
    fn decode(path: &Path, image: Vec<u8>) -> Result<(Lsn, Vec<u8>)> {
        let mut checked = check(path, std::io::Cursor::new(image))?;
        Ok((checked.lsn, read_snapshot(&mut checked, usize::MAX)?))
    }

    /// The snapshot of a checked checkpoint, read whole in reads of at most `at_once` bytes;
    /// a damaged block is the error recovery reports.
    fn read_snapshot<F: Read + Seek>(c: &mut Checkpoint<F>, at_once: usize) -> Result<Vec<u8>> {
        let len = c.len;
        let mut snapshot = c.snapshot().unwrap();
        let mut bytes = Vec::new();
        let mut buf = vec![0u8; at_once.min(3 * BLOCK)];
        loop {
            match snapshot.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
                Err(e) => return Err(snapshot.damage().unwrap_or_else(|| panic!("{e}"))),
            }
        }
        assert_eq!(bytes.len() as u64, len);
        Ok(bytes)
    }

    /// `<dir>/checkpoint` as (LSN, snapshot), if there is one.
    fn read_whole(dir: &Path) -> Option<(Lsn, Vec<u8>)> {
        read(dir).unwrap().map(|mut c| (c.lsn, read_snapshot(&mut c, BLOCK).unwrap()))
    }

    /// A version 1 image: one CRC over the header and the whole snapshot.
    fn encode_v1(lsn: Lsn, snapshot: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.push(WHOLE_CRC_VERSION);
        out.extend_from_slice(&lsn.to_le_bytes());
        out.extend_from_slice(&(snapshot.len() as u64).to_le_bytes());
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&out);
        hasher.update(snapshot);
        out.extend_from_slice(&hasher.finalize().to_le_bytes());
        out.extend_from_slice(snapshot);
        out
    }

    #[test]
    fn image_round_trip() {
        let p = Path::new("/d/checkpoint");
        let large: Vec<u8> = (0..BLOCK * 2 + 17).map(|i| (i % 253) as u8).collect();
        let whole_blocks: Vec<u8> = (0..BLOCK * 2).map(|i| (i % 241) as u8).collect();
        for snapshot in [&b""[..], b"snapshot bytes", &[7u8; 4096], &large, &whole_blocks] {
            let image = encode(99, snapshot);
            let stored = HEADER_LEN as u64 + blocks_size(snapshot.len() as u64);
            assert_eq!(image.len() as u64, stored);
            assert_eq!(decode(p, image.clone()).unwrap(), (99, snapshot.to_vec()));
            // Reads smaller than a block, of sizes that straddle blocks, get the same bytes.
            for at_once in [1000, BLOCK - 1, BLOCK + 1] {
                let mut checked = check(p, std::io::Cursor::new(image.clone())).unwrap();
                assert_eq!(read_snapshot(&mut checked, at_once).unwrap(), snapshot);
            }
            // A version 1 file still reads.
            assert_eq!(decode(p, encode_v1(99, snapshot)).unwrap(), (99, snapshot.to_vec()));
        }
    }

    #[test]
    fn a_streamed_snapshot_makes_the_same_file_as_a_whole_one() {
        let dir = tempfile::tempdir().unwrap();
        let snapshot: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        // Pieces of uneven sizes, across the writer's buffer.
        write_with(dir.path(), 42, &mut |out| {
            for piece in snapshot.chunks(700_001) {
                out.write_all(piece).unwrap();
            }
            Ok(())
        })
        .unwrap();
        let streamed = fs::read(path(dir.path())).unwrap();
        assert_eq!(streamed, encode(42, &snapshot));
        assert_eq!(read_whole(dir.path()), Some((42, snapshot)));

        // A snapshot that fails leaves the old checkpoint in place.
        let failed = write_with(dir.path(), 43, &mut |out| {
            out.write_all(b"partial").unwrap();
            Err(Error::invalid("the state could not be encoded".to_owned()))
        });
        assert!(failed.is_err());
        assert_eq!(fs::read(path(dir.path())).unwrap(), streamed);
        assert!(!tmp_path(dir.path()).exists());
    }

    #[test]
    fn any_damage_is_corruption() {
        let p = Path::new("/d/checkpoint");
        for image in [encode(5, b"hello"), encode_v1(5, b"hello")] {
            for cut in 0..image.len() {
                let err = decode(p, image[..cut].to_vec()).unwrap_err();
                assert!(err.is_corruption(), "cut at {cut}: {err:?}");
            }
            for byte in 0..image.len() {
                if byte == 8 {
                    continue; // the version byte: checked below
                }
                let mut damaged = image.clone();
                damaged[byte] ^= 0x10;
                let err = decode(p, damaged.clone()).unwrap_err();
                assert!(err.is_corruption(), "flip in byte {byte}: {err:?}");
                assert!(err.to_string().contains("/d/checkpoint"), "{err}");
            }
            let mut newer = image.clone();
            newer[8] = CHECKPOINT_VERSION + 1;
            assert!(matches!(decode(p, newer.clone()), Err(Error::UnsupportedVersion { .. })));
        }

        // Several blocks: a flip in any one, two blocks swapped, or a block of another
        // checkpoint in place of its own.
        let snapshot: Vec<u8> = (0..BLOCK * 3 + 5).map(|i| (i % 239) as u8).collect();
        let image = encode(7, &snapshot);
        let block_at = |i: usize| HEADER_LEN + i * (BLOCK_CRC_LEN + BLOCK);
        for i in 0..4 {
            let mut damaged = image.clone();
            damaged[block_at(i) + BLOCK_CRC_LEN + 2] ^= 1;
            let err = decode(p, damaged).unwrap_err();
            assert!(err.to_string().contains(&format!("block {i} ")), "{err}");
        }
        let mut swapped = image.clone();
        let (first, rest) = swapped[block_at(0)..].split_at_mut(BLOCK_CRC_LEN + BLOCK);
        first.swap_with_slice(&mut rest[..BLOCK_CRC_LEN + BLOCK]);
        assert!(decode(p, swapped).unwrap_err().is_corruption());
        let other = encode(8, &snapshot);
        let mut mixed = image.clone();
        mixed[block_at(1)..block_at(2)].copy_from_slice(&other[block_at(1)..block_at(2)]);
        assert!(decode(p, mixed).unwrap_err().is_corruption());
    }

    #[test]
    fn write_read_and_leftover_cleanup() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_whole(dir.path()), None);
        write(dir.path(), 3, b"three").unwrap();
        write(dir.path(), 4, b"four").unwrap();
        assert_eq!(read_whole(dir.path()), Some((4, b"four".to_vec())));
        assert!(!tmp_path(dir.path()).exists());

        fs::write(tmp_path(dir.path()), b"half-written").unwrap();
        assert!(remove_leftover_tmp(dir.path()).unwrap());
        assert!(!tmp_path(dir.path()).exists());
        assert!(!remove_leftover_tmp(dir.path()).unwrap());
    }

    #[test]
    fn a_replaced_checkpoint_is_given_back_in_steps_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(OLD_FILE_NAME);
        let file = fs::File::create(&path).unwrap();
        // Sparse: its length is three steps and a bit, its blocks few.
        file.set_len(3 * RELEASE_STEP + 5).unwrap();
        drop(file);
        release_gradually(&path);
        assert!(!path.exists());
        // Gone already: nothing to do, no error.
        release_gradually(&path);
    }
}
