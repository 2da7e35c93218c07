//! A stream of compressed, checksummed blocks: the framing of files that leave the data dir
//! (backups), where any byte may be damaged or the end cut off in transit.
//!
//! Owns: the byte layout below, writing it in constant memory, and reading it back with every
//! block checked before its bytes are handed on. What the blocks' bytes mean is the caller's.
//!
//! ```text
//! header   [magic: 8 bytes][version u8]
//! block*   [kind u8][raw_len u32 LE][stored_len u32 LE][crc32 u32 LE][stored bytes]
//! trailer  [last block's offset u64 LE][blocks u64 LE][crc32 u32 LE][b"SHDBLEND"]
//! ```
//!
//! - A block's stored bytes are its raw bytes zstd-compressed at the writer's level, or, when
//!   its kind has the [`STORED`] bit, its raw bytes as they are: a block made mostly of bytes
//!   the caller says are compressed already ([`BlockWriter::write_compressed`], such as the
//!   log's compressed records) is not compressed again; `stored_len` then equals `raw_len`. `raw_len` is at most [`MAX_RAW`]. Its CRC covers its index in the stream, its
//!   kind, both lengths and the stored bytes, so a flipped byte, a block dropped, repeated or
//!   moved is found at that block.
//! - Every block can be checked without being decompressed ([`BlockReader::check`]): a reader
//!   that must refuse a damaged file before acting on any of it checks the whole file first,
//!   cheaply.
//! - Data blocks ([`DATA`]) carry the caller's byte stream cut at [`BLOCK`]; the last block is
//!   the caller's summary (its own kind), and the trailer points at it, so a reader that can
//!   seek finds the summary without reading the rest, and one that cannot meets it at the end.
//! - A file without the trailer, or with bytes after it, was cut short or appended to: the
//!   reader reports which, never a partial success.

use std::io::{self, Read, Seek, SeekFrom, Write};

/// The kind of the blocks carrying the caller's byte stream.
pub const DATA: u8 = 1;

/// The bit of a block's kind that says its bytes are stored as they are, not compressed.
pub const STORED: u8 = 0x80;

/// The zstd level of a [`BlockWriter`] unless told otherwise.
pub const DEFAULT_LEVEL: i32 = 3;

/// Raw bytes per data block.
pub const BLOCK: usize = 1024 * 1024;

/// The largest raw block accepted: a data block or the summary.
pub const MAX_RAW: usize = 4 * BLOCK;

const BLOCK_HEADER: usize = 13;
/// More than zstd ever makes of [`MAX_RAW`] bytes (its bound is raw + raw/256 + a little).
const MAX_STORED: usize = MAX_RAW + MAX_RAW / 128 + 1024;
const END_MAGIC: &[u8; 8] = b"SHDBLEND";
/// Length of the trailer.
pub const TRAILER: usize = 28;

/// Why a block stream cannot be read; each names where in the file it is.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The file does not start with the expected magic.
    #[error("not a {what} file (its first bytes are not the expected magic)")]
    NotOurs {
        /// What the file should be ("sheetd backup").
        what: &'static str,
    },
    /// Written by a format this build does not read.
    #[error("format version {found} is not one this build reads (it reads {supported})")]
    Version {
        /// The version found.
        found: u8,
        /// The newest version this build reads.
        supported: u8,
    },
    /// A block's bytes do not match its checksum, or its header is impossible.
    #[error("block {index} (at byte {offset}) is damaged: {why}")]
    Damaged {
        /// The block's index, from 0.
        index: u64,
        /// Its offset in the file.
        offset: u64,
        /// What is wrong.
        why: &'static str,
    },
    /// The file ends before the stream does.
    #[error("the file is cut short: it ends inside or after block {index} (at byte {offset}) without the trailer")]
    Truncated {
        /// The block being read when the file ended.
        index: u64,
        /// Where the file ended.
        offset: u64,
    },
    /// The trailer is damaged or does not point at the last block.
    #[error("the trailer at byte {offset} is damaged or does not match the blocks before it")]
    Trailer {
        /// Its offset.
        offset: u64,
    },
    /// Bytes follow the trailer.
    #[error("bytes follow the trailer at byte {offset}")]
    Trailing {
        /// The trailer's offset.
        offset: u64,
    },
    /// Reading or writing failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl From<BlockError> for io::Error {
    fn from(e: BlockError) -> io::Error {
        match e {
            BlockError::Io(e) => e,
            other => io::Error::new(io::ErrorKind::InvalidData, other),
        }
    }
}

fn block_crc(index: u64, head: &[u8], stored: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&index.to_le_bytes());
    crc.update(head);
    crc.update(stored);
    crc.finalize()
}

/// Writes a block stream: the caller's bytes through [`Write`], then [`BlockWriter::finish`]
/// with the summary. Holds at most one block.
pub struct BlockWriter<W: Write> {
    inner: W,
    buf: Vec<u8>,
    index: u64,
    offset: u64,
    /// The zstd level of the data blocks.
    level: i32,
    /// Bytes of `buf` written by [`BlockWriter::write_compressed`].
    compressed: usize,
    /// One compression context for every block: making one allocates its tables.
    compressor: Option<zstd::bulk::Compressor<'static>>,
    stored: Vec<u8>,
}

impl<W: Write> BlockWriter<W> {
    /// Starts a stream on `inner` with its header.
    ///
    /// # Errors
    /// `inner` refuses the header.
    pub fn new(mut inner: W, magic: &[u8; 8], version: u8) -> io::Result<Self> {
        inner.write_all(magic)?;
        inner.write_all(&[version])?;
        Ok(BlockWriter {
            inner,
            buf: Vec::with_capacity(BLOCK),
            index: 0,
            offset: 9,
            level: DEFAULT_LEVEL,
            compressed: 0,
            compressor: None,
            stored: Vec::new(),
        })
    }

    /// The zstd level of the data blocks from here on (the block being filled included).
    pub fn set_level(&mut self, level: i32) {
        self.level = level;
    }

    /// Writes `data`, bytes that are compressed already (a log record the log compressed): a
    /// block made mostly of such bytes is kept as it is rather than compressed again, which
    /// would cost about as much as compressing them the first time and save nothing.
    ///
    /// # Errors
    /// `inner` refuses a block.
    pub fn write_compressed(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let n = (BLOCK - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..n]);
            self.compressed += n;
            data = &data[n..];
            if self.buf.len() == BLOCK {
                self.emit(DATA)?;
            }
        }
        Ok(())
    }

    /// Bytes written to `inner` so far.
    pub fn written(&self) -> u64 {
        self.offset
    }

    fn emit(&mut self, kind: u8) -> io::Result<()> {
        // The summary is always compressed: it is small, and a reader of format 1 expects it so.
        let keep = kind == DATA && 2 * self.compressed >= self.buf.len();
        self.compressed = 0;
        let (kind, stored) = if keep {
            (kind | STORED, &self.buf)
        } else {
            let level = if kind == DATA { self.level } else { DEFAULT_LEVEL };
            let compressor = match &mut self.compressor {
                Some(c) => c,
                None => self.compressor.insert(zstd::bulk::Compressor::new(level)?),
            };
            compressor.set_compression_level(level)?;
            self.stored.clear();
            self.stored.reserve(zstd::compress_bound(self.buf.len()));
            compressor.compress_to_buffer(&self.buf, &mut self.stored)?;
            (kind, &self.stored)
        };
        let mut head = [0u8; BLOCK_HEADER];
        head[0] = kind;
        head[1..5].copy_from_slice(&(self.buf.len() as u32).to_le_bytes());
        head[5..9].copy_from_slice(&(stored.len() as u32).to_le_bytes());
        let crc = block_crc(self.index, &head[..9], stored);
        head[9..13].copy_from_slice(&crc.to_le_bytes());
        self.inner.write_all(&head)?;
        self.inner.write_all(stored)?;
        self.offset += (BLOCK_HEADER + stored.len()) as u64;
        self.index += 1;
        self.buf.clear();
        Ok(())
    }

    /// Writes out the data block being filled, the summary block of `kind` (not [`DATA`]) and
    /// the trailer; returns `inner`, flushed.
    ///
    /// # Errors
    /// `inner` refuses the bytes, or the summary is larger than [`MAX_RAW`].
    pub fn finish(mut self, kind: u8, summary: &[u8]) -> io::Result<W> {
        if kind == DATA || summary.len() > MAX_RAW {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a summary block"));
        }
        if !self.buf.is_empty() {
            self.emit(DATA)?;
        }
        let at = self.offset;
        self.buf.extend_from_slice(summary);
        self.emit(kind)?;
        let mut trailer = [0u8; TRAILER];
        trailer[..8].copy_from_slice(&at.to_le_bytes());
        trailer[8..16].copy_from_slice(&self.index.to_le_bytes());
        let crc = crc32fast::hash(&trailer[..16]);
        trailer[16..20].copy_from_slice(&crc.to_le_bytes());
        trailer[20..].copy_from_slice(END_MAGIC);
        self.inner.write_all(&trailer)?;
        self.inner.flush()?;
        Ok(self.inner)
    }
}

impl<W: Write> Write for BlockWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = (BLOCK - self.buf.len()).min(data.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == BLOCK {
            self.emit(DATA)?;
        }
        Ok(n)
    }

    /// Flushes `inner`; a partial block stays buffered (blocks are cut at [`BLOCK`]).
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Reads a block stream in order, checking each block before its bytes are handed on: the
/// data blocks as one byte stream through [`Read`], then [`BlockReader::summary`].
pub struct BlockReader<R: Read> {
    inner: R,
    version: u8,
    index: u64,
    offset: u64,
    block: Vec<u8>,
    pos: usize,
    /// The summary block, once met: its kind, bytes and offset.
    summary: Option<(u8, Vec<u8>, u64)>,
    /// One decompression context for every block.
    decompressor: Option<zstd::bulk::Decompressor<'static>>,
    /// The stored bytes of the block being read, kept for the next one.
    stored: Vec<u8>,
}

/// Reads exactly `buf.len()` bytes, or tells how many there were before the end.
fn read_full(inner: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match inner.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

impl<R: Read> BlockReader<R> {
    /// Opens a stream on `inner`, checking its magic and that its version is at most
    /// `supported`.
    ///
    /// # Errors
    /// Another file, a newer version, or `inner` failing.
    pub fn open(
        mut inner: R,
        what: &'static str,
        magic: &[u8; 8],
        supported: u8,
    ) -> Result<Self, BlockError> {
        let mut head = [0u8; 9];
        if read_full(&mut inner, &mut head)? < 9 || &head[..8] != magic {
            return Err(BlockError::NotOurs { what });
        }
        if head[8] == 0 || head[8] > supported {
            return Err(BlockError::Version { found: head[8], supported });
        }
        Ok(BlockReader {
            inner,
            version: head[8],
            index: 0,
            offset: 9,
            block: Vec::new(),
            pos: 0,
            summary: None,
            decompressor: None,
            stored: Vec::new(),
        })
    }

    /// The stream's format version.
    pub fn version(&self) -> u8 {
        self.version
    }

    /// Bytes of the file read so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Reads the next block's header and stored bytes into `self.stored` and checks its CRC;
    /// returns its kind and raw length, and the block's index and offset.
    fn next_stored(&mut self) -> Result<(u8, usize, u64, u64), BlockError> {
        let (index, offset) = (self.index, self.offset);
        let cut = BlockError::Truncated { index, offset };
        let damaged = |why| BlockError::Damaged { index, offset, why };
        let mut head = [0u8; BLOCK_HEADER];
        if read_full(&mut self.inner, &mut head)? < BLOCK_HEADER {
            return Err(cut);
        }
        let raw_len = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes")) as usize;
        let stored_len = u32::from_le_bytes(head[5..9].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(head[9..13].try_into().expect("4 bytes"));
        // Checked before anything is allocated for it: a flipped length must not ask for GiBs.
        if raw_len > MAX_RAW
            || stored_len > MAX_STORED
            || (head[0] & STORED != 0 && raw_len != stored_len)
        {
            return Err(damaged("its lengths are impossible"));
        }
        self.stored.resize(stored_len, 0);
        if read_full(&mut self.inner, &mut self.stored)? < stored_len {
            return Err(cut);
        }
        if block_crc(index, &head[..9], &self.stored) != crc {
            return Err(damaged("its checksum does not match"));
        }
        self.index += 1;
        self.offset += (BLOCK_HEADER + stored_len) as u64;
        Ok((head[0], raw_len, index, offset))
    }

    /// Reads the next block; `Ok(false)` once the summary was met (it is then kept).
    fn next_block(&mut self) -> Result<bool, BlockError> {
        if self.summary.is_some() {
            return Ok(false);
        }
        let (kind, raw_len, index, offset) = self.next_stored()?;
        let damaged = |why| BlockError::Damaged { index, offset, why };
        let mut raw = std::mem::take(&mut self.block);
        if kind & STORED != 0 {
            std::mem::swap(&mut raw, &mut self.stored);
        } else {
            let decompressor = match &mut self.decompressor {
                Some(d) => d,
                None => self.decompressor.insert(zstd::bulk::Decompressor::new()?),
            };
            raw.clear();
            raw.reserve(raw_len);
            decompressor
                .decompress_to_buffer(&self.stored[..], &mut raw)
                .map_err(|_| damaged("it does not decompress"))?;
            if raw.len() != raw_len {
                return Err(damaged("it decompresses to another length"));
            }
        }
        if kind & !STORED == DATA {
            self.block = raw;
            self.pos = 0;
            return Ok(true);
        }
        self.read_trailer(offset)?;
        self.summary = Some((kind & !STORED, raw, offset));
        Ok(false)
    }

    fn read_trailer(&mut self, summary_at: u64) -> Result<(), BlockError> {
        let at = self.offset;
        let mut trailer = [0u8; TRAILER];
        let n = read_full(&mut self.inner, &mut trailer)?;
        if n < TRAILER {
            return Err(BlockError::Truncated { index: self.index, offset: at + n as u64 });
        }
        let points = u64::from_le_bytes(trailer[..8].try_into().expect("8 bytes"));
        let blocks = u64::from_le_bytes(trailer[8..16].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(trailer[16..20].try_into().expect("4 bytes"));
        if &trailer[20..] != END_MAGIC
            || crc != crc32fast::hash(&trailer[..16])
            || points != summary_at
            || blocks != self.index
        {
            return Err(BlockError::Trailer { offset: at });
        }
        self.offset += TRAILER as u64;
        if read_full(&mut self.inner, &mut [0u8; 1])? != 0 {
            return Err(BlockError::Trailing { offset: at });
        }
        Ok(())
    }

    /// Reads (and checks) every block left, then returns the summary's kind and bytes.
    ///
    /// # Errors
    /// A damaged or missing block or trailer.
    pub fn summary(&mut self) -> Result<(u8, Vec<u8>), BlockError> {
        while self.next_block()? {}
        let (kind, bytes, _) = self.summary.clone().expect("met at the end");
        Ok((kind, bytes))
    }

    /// Checks every block left (its lengths and CRC, without decompressing it) and the
    /// trailer, then returns the summary's kind and bytes: what a reader that must refuse a
    /// damaged file before acting on any of it runs first. CRC32 runs at several GB/s, so
    /// this costs about one read of the file.
    ///
    /// # Errors
    /// A damaged or missing block or trailer.
    pub fn check(mut self) -> Result<(u8, Vec<u8>), BlockError> {
        loop {
            let (kind, raw_len, index, offset) = self.next_stored()?;
            if kind & !STORED != DATA {
                self.read_trailer(offset)?;
                // The summary alone is decompressed: the caller reads it.
                let raw = if kind & STORED != 0 {
                    std::mem::take(&mut self.stored)
                } else {
                    zstd::bulk::decompress(&self.stored, raw_len).map_err(|_| {
                        BlockError::Damaged { index, offset, why: "it does not decompress" }
                    })?
                };
                return Ok((kind & !STORED, raw));
            }
        }
    }
}

impl<R: Read> Read for BlockReader<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.block.len() {
            if !self.next_block()? {
                return Ok(0);
            }
        }
        let n = out.len().min(self.block.len() - self.pos);
        out[..n].copy_from_slice(&self.block[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// The summary of the block stream in `file` found through its trailer, without reading the
/// data blocks (which are not checked).
///
/// # Errors
/// The trailer or the summary block is damaged, or the file is too short to hold them.
pub fn read_summary<F: Read + Seek>(mut file: F) -> Result<(u8, Vec<u8>), BlockError> {
    let len = file.seek(SeekFrom::End(0))?;
    if len < (9 + BLOCK_HEADER + TRAILER) as u64 {
        return Err(BlockError::Truncated { index: 0, offset: len });
    }
    let at = len - TRAILER as u64;
    file.seek(SeekFrom::Start(at))?;
    let mut trailer = [0u8; TRAILER];
    file.read_exact(&mut trailer)?;
    let points = u64::from_le_bytes(trailer[..8].try_into().expect("8 bytes"));
    let blocks = u64::from_le_bytes(trailer[8..16].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(trailer[16..20].try_into().expect("4 bytes"));
    if &trailer[20..] != END_MAGIC || crc != crc32fast::hash(&trailer[..16]) || points >= at {
        return Err(BlockError::Trailer { offset: at });
    }
    file.seek(SeekFrom::Start(points))?;
    let mut reader = BlockReader {
        inner: file.take(at - points),
        version: 0,
        index: blocks.saturating_sub(1),
        offset: points,
        block: Vec::new(),
        pos: 0,
        summary: None,
        decompressor: None,
        stored: Vec::new(),
    };
    // The trailer follows, so reading it back is the summary block's job alone.
    let (index, offset) = (reader.index, reader.offset);
    let mut head = [0u8; BLOCK_HEADER];
    if read_full(&mut reader.inner, &mut head)? < BLOCK_HEADER {
        return Err(BlockError::Truncated { index, offset });
    }
    let raw_len = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes")) as usize;
    let stored_len = u32::from_le_bytes(head[5..9].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(head[9..13].try_into().expect("4 bytes"));
    let damaged = |why| BlockError::Damaged { index, offset, why };
    if raw_len > MAX_RAW || stored_len as u64 != at - points - BLOCK_HEADER as u64 {
        return Err(damaged("its lengths are impossible"));
    }
    let mut stored = vec![0u8; stored_len];
    reader.inner.read_exact(&mut stored)?;
    if block_crc(index, &head[..9], &stored) != crc || head[0] & !STORED == DATA {
        return Err(damaged("its checksum does not match"));
    }
    if head[0] & STORED != 0 {
        return Ok((head[0] & !STORED, stored));
    }
    let raw =
        zstd::bulk::decompress(&stored, raw_len).map_err(|_| damaged("it does not decompress"))?;
    Ok((head[0], raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAGIC: &[u8; 8] = b"TESTBLKS";

    fn stream(len: usize) -> (Vec<u8>, Vec<u8>) {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let mut w = BlockWriter::new(Vec::new(), MAGIC, 1).unwrap();
        w.write_all(&data).unwrap();
        (w.finish(9, b"the summary").unwrap(), data)
    }

    fn read_all(file: &[u8]) -> Result<(Vec<u8>, Vec<u8>), BlockError> {
        let mut r = BlockReader::open(file, "test", MAGIC, 1)?;
        let mut data = Vec::new();
        r.read_to_end(&mut data).map_err(|e| match e.into_inner() {
            Some(inner) => *inner.downcast::<BlockError>().expect("a block error"),
            None => panic!("no inner error"),
        })?;
        let (kind, summary) = r.summary()?;
        assert_eq!(kind, 9);
        Ok((data, summary))
    }

    #[test]
    fn a_stream_reads_back_whole_and_its_summary_is_found_from_the_end() {
        for len in [0, 1, BLOCK, BLOCK + 1, 3 * BLOCK + 17] {
            let (file, data) = stream(len);
            let (read, summary) = read_all(&file).unwrap();
            assert_eq!(read, data, "{len} bytes");
            assert_eq!(summary, b"the summary");
            let (kind, summary) = read_summary(std::io::Cursor::new(&file)).unwrap();
            assert_eq!((kind, summary.as_slice()), (9, &b"the summary"[..]));
        }
    }

    /// A stream whose first half is compressed and second half stored (bytes compressed
    /// already): it reads back whole, and [`BlockReader::check`] finds a flipped byte in a
    /// stored block, a cut and appended bytes without decompressing anything.
    #[test]
    fn stored_blocks_read_back_and_check_finds_damage_in_any_block() {
        let data: Vec<u8> = (0..3 * BLOCK + 99).map(|i| (i * 7 % 251) as u8).collect();
        let mut w = BlockWriter::new(Vec::new(), MAGIC, 2).unwrap();
        w.set_level(1);
        w.write_all(&data[..BLOCK]).unwrap();
        // A block of more compressed bytes than others is stored; of fewer, compressed.
        w.write_all(&data[BLOCK..BLOCK + 5]).unwrap();
        w.write_compressed(&data[BLOCK + 5..BLOCK + 10]).unwrap();
        w.write_all(&data[BLOCK + 10..BLOCK + 11]).unwrap();
        w.write_compressed(&data[BLOCK + 11..]).unwrap();
        let file = w.finish(9, b"the summary").unwrap();
        let kinds = |file: &[u8]| {
            let (mut at, mut kinds) = (9, Vec::new());
            while at + BLOCK_HEADER <= file.len() - TRAILER {
                let stored = u32::from_le_bytes(file[at + 5..at + 9].try_into().unwrap());
                kinds.push((file[at], at));
                at += BLOCK_HEADER + stored as usize;
            }
            kinds
        };
        let blocks = kinds(&file);
        let stored: Vec<_> = blocks.iter().filter(|(k, _)| k & STORED != 0).collect();
        // Compressed: the first block; stored: the three after it (the second has 5 plain bytes
        // among compressed ones); then the summary.
        assert_eq!(blocks.len(), 1 + 3 + 1, "{blocks:?}");
        assert_eq!(stored.len(), 3, "{blocks:?}");
        let mut r = BlockReader::open(&file[..], "test", MAGIC, 2).unwrap();
        let mut read = Vec::new();
        r.read_to_end(&mut read).unwrap();
        assert_eq!(read, data);
        let check = |file: &[u8]| BlockReader::open(file, "test", MAGIC, 2)?.check();
        assert_eq!(check(&file).unwrap(), (9, b"the summary".to_vec()));

        let mut flipped = file.clone();
        let (_, at) = *stored[1];
        let plain = |s: &[u8]| s.windows(3).any(|w| w == [4u8, 11, 18]);
        assert!(plain(&file[at..]), "a stored block holds its bytes as they are");
        flipped[at + BLOCK_HEADER + 100] ^= 0x01;
        let index = blocks.iter().position(|&(_, a)| a == at).unwrap() as u64;
        assert!(
            matches!(check(&flipped), Err(BlockError::Damaged { index: i, .. }) if i == index),
            "{:?}",
            check(&flipped)
        );
        assert!(matches!(read_all_v2(&flipped), Err(BlockError::Damaged { .. })));
        assert!(matches!(check(&file[..file.len() - 1]), Err(BlockError::Truncated { .. })));
        assert!(matches!(check(&file[..at + 7]), Err(BlockError::Truncated { .. })));
        let mut longer = file.clone();
        longer.push(0);
        assert!(matches!(check(&longer), Err(BlockError::Trailing { .. })));
    }

    fn read_all_v2(file: &[u8]) -> Result<Vec<u8>, BlockError> {
        let mut r = BlockReader::open(file, "test", MAGIC, 2)?;
        let mut data = Vec::new();
        r.read_to_end(&mut data)
            .map_err(|e| *e.into_inner().unwrap().downcast::<BlockError>().unwrap())?;
        Ok(data)
    }

    #[test]
    fn a_flipped_byte_a_cut_and_an_appended_byte_are_each_found() {
        let (file, _) = stream(3 * BLOCK);
        // A byte in the second block's stored bytes: the first block is skipped by its size.
        let second = 9 + BLOCK_HEADER + {
            let stored = u32::from_le_bytes(file[9 + 5..9 + 9].try_into().unwrap());
            stored as usize
        };
        let mut flipped = file.clone();
        flipped[second + BLOCK_HEADER + 5] ^= 0x40;
        assert!(
            matches!(read_all(&flipped), Err(BlockError::Damaged { index: 1, .. })),
            "{:?}",
            read_all(&flipped).err()
        );
        for cut in [file.len() - 1, file.len() - TRAILER, second + 3, 10] {
            assert!(
                matches!(read_all(&file[..cut]), Err(BlockError::Truncated { .. })),
                "cut at {cut}: {:?}",
                read_all(&file[..cut]).err()
            );
        }
        let mut longer = file.clone();
        longer.push(0);
        assert!(matches!(read_all(&longer), Err(BlockError::Trailing { .. })));
        assert!(matches!(read_all(b"something else"), Err(BlockError::NotOurs { .. })));
        let mut newer = file;
        newer[8] = 2;
        assert!(matches!(read_all(&newer), Err(BlockError::Version { found: 2, .. })));
    }
}
