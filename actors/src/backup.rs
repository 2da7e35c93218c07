//! The backup file: what it holds, writing it from a running (or stopped) service, checking
//! it, and restoring it into a new data dir.
//!
//! # What a backup holds
//!
//! Exactly what a data dir needs to start in one state at one log position P, with the same
//! change feed: the checkpoint snapshot of [`crate::service::Service::backup`]'s copies (as a
//! checkpoint writes it, at their oldest tag C), the records the change feed retains at or
//! below C, and every record from C+1 to P. A restore writes them back at their LSNs, so a
//! restored server replays the same records into the same rows, the same `seq`s and the same
//! cursors, and its next record gets P+1.
//!
//! # The file
//!
//! A block stream of `wal::blocks` (magic `SHEETDBK`, format [`FORMAT`]): every block behind
//! its own length and CRC, the last one the manifest, then a trailer pointing at it. Blocks
//! are zstd-compressed (level [`SNAPSHOT_LEVEL`]), except those made mostly of records the log
//! compressed already: a record goes in as the log stores it, and such blocks are kept as
//! they are (decoding, encoding and compressing those records again cost a backup most of its
//! time and saved nothing). Format 1 (every block compressed at level 3, records re-encoded) holds the same
//! items and is still read. The data blocks carry, as one byte stream:
//!
//! ```text
//! H [checkpoint LSN C u64][position P u64][taken at, ms since the epoch, i64]   (all LE)
//! S [len u32][snapshot bytes]     repeated: the checkpoint snapshot, in pieces
//! R [lsn u64][len u64][record]    repeated, increasing LSNs: retained ones <= C, then C+1..=P
//! F [name len u16][name][len u64][bytes]   repeated: files the server keeps beside the log
//! E [records u64]                 how many R items came before
//! ```
//!
//! The files (`F`) are the server's own, named by it: the key cursors are signed with, so a
//! client's change-feed cursor means the same position on the restored server. They are not
//! part of the state's digest; their bytes are covered by the blocks' checksums.
//!
//! The manifest (the summary block, kind 2) is JSON: [`Manifest`]. A writer never holds more
//! than a block, and a reader never more than a block and one record beside the state it
//! rebuilds, whatever the data dir's size.
//!
//! Room to grow: a later format may add items (a reader refuses a tag it does not know) and
//! manifest fields (unknown ones are ignored). The log archive's segments ([`crate::archive`])
//! use the same blocks under their own magic and hold the records after P: [`restore_to`]
//! rolls a backup forward with them.
//!
//! # Checks
//!
//! [`verify`] reads every block, rebuilds the state in memory from the snapshot and the records
//! after C, and compares its digest ([`crate::digest`]) with the manifest's; it reads its input
//! once, in order, so `sheetd backup` runs it on the bytes as they arrive. [`restore`] checks
//! every block's checksum and the trailer first (one read of the file, no decompression) and
//! writes nothing unless that passes; then, in one more pass, it writes the data dir, recovers
//! it as a start would (without the actors), and compares the recovered state's digest with
//! the manifest's, removing what it wrote on a mismatch or on an item that does not fit. The
//! state is decoded and hashed once, from the restored dir itself, which is what must be right.
//! [`restore_to`] also reads every archive segment it uses (from P+1 to the point asked for)
//! and checks their records before writing anything, so a gap, a damaged segment or a point
//! before the backup is refused with nothing written; the recovery then takes the digest at P
//! on its way through the archived records, for the manifest's comparison.

use std::io::{self, Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::archive::{self, ArchiveError, SegmentReader};
use crate::log::blocks::{self, BlockError, BlockReader, BlockWriter};
use crate::log::{codec, encode_snapshot, LogError, Lsn, Replay, WalLogRestore};
use crate::model::Millis;
use crate::record::Record;
use crate::service::{fresh_rebuild, BackupCopies, Counts, Rebuild, Service};

/// The file's first bytes.
pub const MAGIC: &[u8; 8] = b"SHEETDBK";
/// The format this build writes, and the newest it reads. Format 2 keeps blocks of records
/// the log compressed as they are and compresses the others at [`SNAPSHOT_LEVEL`]; format 1
/// compressed every block at zstd level 3. Both are read: the
/// items are the same, and the blocks say how each is kept.
pub const FORMAT: u8 = 2;
/// zstd's level for the blocks it compresses: level 1 compresses a snapshot about 1.25 times
/// as fast as level 3 for a file about 5 % larger, and the snapshot is most of a backup's work.
pub const SNAPSHOT_LEVEL: i32 = 1;
/// The manifest's block kind.
const MANIFEST: u8 = 2;
/// Snapshot pieces are cut at this size.
const PIECE: usize = 256 * 1024;

/// Why a backup could not be written, read or restored.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The file's blocks or trailer are damaged, or the file is cut short.
    #[error("the backup file is damaged: {0}")]
    Blocks(#[from] BlockError),
    /// The blocks are intact but what they hold is not a backup this build can restore.
    #[error("the backup file is damaged: {0}")]
    Content(String),
    /// The state rebuilt from the file is not the one its manifest names.
    #[error("the state in the backup has digest {found}, but its manifest says {expected}")]
    DigestMismatch {
        /// The manifest's.
        expected: String,
        /// The rebuilt state's.
        found: String,
    },
    /// The restored data dir does not recover to the backed-up state; it was removed.
    #[error("the restored data dir recovers to digest {found}, not the backup's {expected}; it was removed")]
    RestoredMismatch {
        /// The manifest's.
        expected: String,
        /// The restored dir's.
        found: String,
    },
    /// The log archive lacks a segment a restore needs, or one is damaged.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// The point in time asked for is not one this backup and archive can reach.
    #[error("{0}")]
    Target(String),
    /// A restore's target holds something already.
    #[error("data dir {0} is not empty: a restore writes only into an empty or absent data dir")]
    NotEmpty(String),
    /// The service or its log failed.
    #[error(transparent)]
    Domain(#[from] crate::Error),
    /// Reading or writing a file failed.
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl BackupError {
    /// Reading the blocks' bytes comes back as an I/O error carrying the block's own error.
    fn from_read(e: io::Error) -> BackupError {
        if e.get_ref().is_some_and(|inner| inner.is::<BlockError>()) {
            let inner = e.into_inner().expect("checked").downcast::<BlockError>();
            return BackupError::Blocks(*inner.expect("checked"));
        }
        if e.kind() == io::ErrorKind::UnexpectedEof {
            return BackupError::Content("an item ends before its bytes do".to_owned());
        }
        BackupError::Io(e)
    }
}

type Result<T, E = BackupError> = std::result::Result<T, E>;

/// What a backup holds, as its last block says.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    /// The file's format.
    pub format: u8,
    /// The log position the state is at: a restored server's next record gets `position + 1`.
    pub position: Lsn,
    /// Where the snapshot stands; the records after it, up to `position`, complete it.
    pub checkpoint_lsn: Lsn,
    /// When the copies were taken (UTC, RFC 3339).
    pub created_at: String,
    /// The same, in milliseconds since the epoch.
    pub created_at_ms: Millis,
    /// What the state holds.
    pub counts: ManifestCounts,
    /// Records from `checkpoint_lsn + 1` to `position`.
    pub records: u64,
    /// Records at or below `checkpoint_lsn` the change feed retains.
    pub retained_records: u64,
    /// The state's digest ([`crate::digest`]), 64 hex digits.
    pub digest: String,
    /// The names of the files carried beside the log.
    #[serde(default)]
    pub files: Vec<String>,
}

/// The manifest's counts.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ManifestCounts {
    pub users: usize,
    pub projects: usize,
    pub sheets: usize,
    pub rows: u64,
    pub attachments: u64,
    pub keys: usize,
    pub reports: usize,
    /// Stored idempotent answers.
    pub idempotency_keys: usize,
    /// Events in the outbox.
    pub events: usize,
}

/// How far a backup, verify or restore has come.
#[derive(Clone, Copy, Debug, Default)]
pub struct Progress {
    /// Bytes of the file written or read.
    pub bytes: u64,
    /// Records written or read.
    pub records: u64,
}

/// Counts what goes through to the file.
struct Counting<W> {
    inner: W,
    bytes: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Cuts the snapshot into `S` items.
struct Pieces<'a, W: Write> {
    out: &'a mut W,
    buf: Vec<u8>,
}

impl<W: Write> Pieces<'_, W> {
    fn emit(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.out.write_all(b"S")?;
            self.out.write_all(&(self.buf.len() as u32).to_le_bytes())?;
            self.out.write_all(&self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }
}

impl<W: Write> Write for Pieces<'_, W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = (PIECE - self.buf.len()).min(data.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == PIECE {
            self.emit()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn manifest_counts(counts: &Counts, rebuild: &Rebuild) -> ManifestCounts {
    let (idempotency_keys, events) = rebuild.side_sizes();
    ManifestCounts {
        users: counts.users,
        projects: counts.projects,
        sheets: counts.sheets,
        rows: counts.rows,
        attachments: counts.attachments,
        keys: counts.keys,
        reports: counts.reports,
        idempotency_keys,
        events,
    }
}

/// Whether `name` may name a file a backup carries: a plain name inside the data dir.
fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
}

/// The state of `copies` at their position, rebuilt as a backup's manifest rebuilds it (the
/// copies with the records after their oldest tag applied as a start applies them), and its
/// digest: the position and digest a replica of the same log must also reach. Blocking: it
/// reads the log.
///
/// # Errors
/// The log no longer holds, or cannot read, a record after the oldest tag.
pub fn digest(copies: BackupCopies) -> Result<(Lsn, crate::digest::StateDigest)> {
    let BackupCopies { copies, log, taken_at, .. } = copies;
    let mut rebuild = fresh_rebuild(taken_at);
    rebuild.load(copies.file.checkpoint);
    for lsn in copies.lsn + 1..=copies.newest {
        let record = log.read(lsn)?.ok_or_else(|| {
            crate::Error::Inconsistent(format!(
                "the log no longer holds record {lsn}, which the digest needs"
            ))
        })?;
        rebuild.apply(lsn, record);
    }
    Ok((copies.newest, rebuild.digest()))
}

/// Writes the backup of `copies` and `files` (name and bytes of files kept beside the log) to
/// `out`, calling `progress` after each record (and once the snapshot is out); returns its
/// manifest. Blocking: it reads the log.
///
/// # Errors
/// The log no longer holds a record the backup needs, a record cannot be read, a file name is
/// not a plain name, or `out` fails.
pub fn write(
    copies: BackupCopies,
    files: &[(String, Vec<u8>)],
    out: impl Write,
    progress: &mut dyn FnMut(Progress),
) -> Result<Manifest> {
    let BackupCopies { copies, log, taken_at, .. } = copies;
    let (ckpt, position) = (copies.lsn, copies.newest);
    let mut out = BlockWriter::new(Counting { inner: out, bytes: 0 }, MAGIC, FORMAT)?;
    out.set_level(SNAPSHOT_LEVEL);
    out.write_all(b"H")?;
    out.write_all(&ckpt.to_le_bytes())?;
    out.write_all(&position.to_le_bytes())?;
    out.write_all(&taken_at.to_le_bytes())?;
    let mut pieces = Pieces { out: &mut out, buf: Vec::with_capacity(PIECE) };
    encode_snapshot(&copies.file, &mut pieces)?;
    pieces.emit()?;
    let mut done = Progress::default();
    let written = |out: &BlockWriter<Counting<_>>| out.written();
    progress(Progress { bytes: written(&out), records: 0 });

    // The state at `position`, for the manifest: the copies (persistent maps, so this shares
    // their rows) with the records after the oldest tag applied, as a start applies them.
    let mut rebuild = fresh_rebuild(taken_at);
    rebuild.load(copies.file.checkpoint);
    let mut retained: Vec<Lsn> = copies.retained.into_iter().filter(|&l| l <= ckpt).collect();
    retained.sort_unstable();
    let missing = |lsn| {
        crate::Error::Inconsistent(format!(
            "the log no longer holds record {lsn}, which the backup needs"
        ))
    };
    // The records go in as the log stores them: a bulk write's is compressed already, and a
    // block made mostly of such records is kept as it is rather than compressed a second time
    // (small records, stored plain by the log, are still compressed with their blocks).
    let item = |out: &mut BlockWriter<_>, lsn: Lsn, bytes: &[u8]| -> Result<()> {
        out.write_all(b"R")?;
        out.write_all(&lsn.to_le_bytes())?;
        out.write_all(&(bytes.len() as u64).to_le_bytes())?;
        if codec::is_compressed(bytes) {
            out.write_compressed(bytes)?;
        } else {
            out.write_all(bytes)?;
        }
        Ok(())
    };
    for &lsn in &retained {
        let bytes = log.read_stored(lsn)?.ok_or_else(|| missing(lsn))?;
        item(&mut out, lsn, &bytes)?;
        done.records += 1;
        progress(Progress { bytes: written(&out), ..done });
    }
    for lsn in ckpt + 1..=position {
        let bytes = log.read_stored(lsn)?.ok_or_else(|| missing(lsn))?;
        item(&mut out, lsn, &bytes)?;
        rebuild.apply(lsn, codec::decode(&bytes).map_err(crate::Error::from)?);
        done.records += 1;
        progress(Progress { bytes: written(&out), ..done });
    }
    for (name, bytes) in files {
        if !plain_name(name) {
            return Err(BackupError::Content(format!("`{name}` is not a plain file name")));
        }
        out.write_all(b"F")?;
        out.write_all(&(name.len() as u16).to_le_bytes())?;
        out.write_all(name.as_bytes())?;
        out.write_all(&(bytes.len() as u64).to_le_bytes())?;
        out.write_all(bytes)?;
    }
    out.write_all(b"E")?;
    out.write_all(&done.records.to_le_bytes())?;
    let counts = rebuild.counts();
    let manifest = Manifest {
        format: FORMAT,
        position,
        checkpoint_lsn: ckpt,
        created_at: crate::model::timestamp(taken_at).unwrap_or_default(),
        created_at_ms: taken_at,
        counts: manifest_counts(&counts, &rebuild),
        records: position - ckpt,
        retained_records: retained.len() as u64,
        digest: rebuild.digest().to_string(),
        files: files.iter().map(|(name, _)| name.clone()).collect(),
    };
    let summary = serde_json::to_vec_pretty(&manifest).expect("a manifest serializes");
    let mut file = out.finish(MANIFEST, &summary)?;
    file.flush()?;
    progress(Progress { bytes: file.bytes, ..done });
    Ok(manifest)
}

/// Reads a backup's items in order.
struct Items<R: Read> {
    blocks: BlockReader<R>,
    /// The tag read after the snapshot's pieces.
    pending: Option<u8>,
    /// Bytes left in the snapshot piece being read.
    left: usize,
    records: u64,
    /// Damage met while the snapshot's decoder read: its own error would only say the bytes
    /// did not decode.
    damage: Option<BlockError>,
}

fn read_array<const N: usize>(r: &mut impl Read) -> Result<[u8; N]> {
    let mut buf = [0u8; N];
    r.read_exact(&mut buf).map_err(BackupError::from_read)?;
    Ok(buf)
}

/// An item after the snapshot.
enum Item {
    Record(Lsn, Vec<u8>),
    File(String, Vec<u8>),
    End,
}

/// The header item.
struct Head {
    checkpoint: Lsn,
    position: Lsn,
    taken_at: Millis,
}

impl<R: Read> Items<R> {
    fn open(file: R) -> Result<(Items<R>, Head)> {
        let blocks = BlockReader::open(file, "sheetd backup", MAGIC, FORMAT)?;
        let mut items = Items { blocks, pending: None, left: 0, records: 0, damage: None };
        if read_array::<1>(&mut items.blocks)? != *b"H" {
            return Err(BackupError::Content("it does not start with its header".to_owned()));
        }
        let head = Head {
            checkpoint: u64::from_le_bytes(read_array(&mut items.blocks)?),
            position: u64::from_le_bytes(read_array(&mut items.blocks)?),
            taken_at: i64::from_le_bytes(read_array(&mut items.blocks)?),
        };
        if head.position < head.checkpoint || head.checkpoint == 0 {
            return Err(BackupError::Content("its header names impossible positions".to_owned()));
        }
        Ok((items, head))
    }

    /// The next tag after the snapshot: drains what the snapshot's reader left.
    fn after_snapshot(&mut self) -> Result<u8> {
        io::copy(&mut Snapshot(self), &mut io::sink()).map_err(BackupError::from_read)?;
        Ok(self.pending.take().expect("the snapshot ends at the next tag"))
    }

    /// A length-prefixed item's bytes. `max` keeps a damaged length from asking for the
    /// memory it names.
    fn sized(&mut self, what: &str, max: u64) -> Result<Vec<u8>> {
        let len = u64::from_le_bytes(read_array(&mut self.blocks)?);
        if len > max {
            return Err(BackupError::Content(format!("{what} has an impossible length")));
        }
        let mut bytes = Vec::with_capacity(len as usize);
        (&mut self.blocks).take(len).read_to_end(&mut bytes).map_err(BackupError::from_read)?;
        if bytes.len() as u64 != len {
            return Err(BackupError::Content(format!("{what} is cut short")));
        }
        Ok(bytes)
    }

    /// The next item after the snapshot: a record, a file, or the end (its count checked).
    fn item(&mut self, tag: u8) -> Result<Item> {
        match tag {
            b'R' => {
                let lsn = u64::from_le_bytes(read_array(&mut self.blocks)?);
                // A record is at most what a request body or an import makes, far below this.
                let bytes = self.sized(&format!("record {lsn}"), 1 << 34)?;
                self.records += 1;
                Ok(Item::Record(lsn, bytes))
            }
            b'F' => {
                let len = u16::from_le_bytes(read_array(&mut self.blocks)?);
                let mut name = vec![0u8; usize::from(len)];
                self.blocks.read_exact(&mut name).map_err(BackupError::from_read)?;
                let name = String::from_utf8(name)
                    .ok()
                    .filter(|n| plain_name(n))
                    .ok_or_else(|| BackupError::Content("a file has no plain name".to_owned()))?;
                let bytes = self.sized(&format!("file {name}"), 1 << 24)?;
                Ok(Item::File(name, bytes))
            }
            b'E' => {
                let count = u64::from_le_bytes(read_array(&mut self.blocks)?);
                if count != self.records {
                    return Err(BackupError::Content(format!(
                        "it says it holds {count} records but holds {}",
                        self.records
                    )));
                }
                Ok(Item::End)
            }
            other => Err(BackupError::Content(format!("it holds an item of unknown kind {other}"))),
        }
    }

    fn next_tag(&mut self) -> Result<u8> {
        Ok(read_array::<1>(&mut self.blocks)?[0])
    }

    /// After the end item: the manifest (every block left checked, the trailer too).
    fn manifest(mut self) -> Result<Manifest> {
        let mut rest = [0u8; 1];
        if self.blocks.read(&mut rest).map_err(BackupError::from_read)? != 0 {
            return Err(BackupError::Content("bytes follow its end item".to_owned()));
        }
        let (_, summary) = self.blocks.summary()?;
        serde_json::from_slice(&summary)
            .map_err(|e| BackupError::Content(format!("its manifest does not parse: {e}")))
    }
}

/// The snapshot's bytes, read from its pieces; ends at the first item of another kind.
struct Snapshot<'a, R: Read>(&'a mut Items<R>);

impl<R: Read> Read for Snapshot<'_, R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        self.read_pieces(out).map_err(|e| {
            if !e.get_ref().is_some_and(|inner| inner.is::<BlockError>()) {
                return e;
            }
            let message = e.to_string();
            if let Ok(damage) = e.into_inner().expect("checked").downcast::<BlockError>() {
                self.0.damage.get_or_insert(*damage);
            }
            io::Error::new(io::ErrorKind::InvalidData, message)
        })
    }
}

impl<R: Read> Snapshot<'_, R> {
    fn read_pieces(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let items = &mut *self.0;
        if items.pending.is_some() {
            return Ok(0);
        }
        if items.left == 0 {
            let mut tag = [0u8; 1];
            items.blocks.read_exact(&mut tag)?;
            if tag[0] != b'S' {
                items.pending = Some(tag[0]);
                return Ok(0);
            }
            let mut len = [0u8; 4];
            items.blocks.read_exact(&mut len)?;
            items.left = u32::from_le_bytes(len) as usize;
        }
        let n = out.len().min(items.left);
        let n = items.blocks.read(&mut out[..n])?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        items.left -= n;
        Ok(n)
    }
}

/// What [`verify`] found: the manifest, checked.
#[derive(Clone, Debug)]
pub struct Verified {
    /// The manifest, whose digest the rebuilt state matched.
    pub manifest: Manifest,
}

/// Checks the backup in `file` without writing anything: every block and the trailer, every
/// item, the records' order, and the digest of the state rebuilt in memory against the
/// manifest's.
///
/// # Errors
/// The first damage found, naming it; a digest that does not match.
pub fn verify(file: impl Read, progress: &mut dyn FnMut(Progress)) -> Result<Verified> {
    verify_rebuild(file, progress).map(|(verified, _)| verified)
}

/// [`verify`], and the state it rebuilt, at the backup's position.
fn verify_rebuild(
    file: impl Read,
    progress: &mut dyn FnMut(Progress),
) -> Result<(Verified, Rebuild)> {
    let (mut items, head) = Items::open(file)?;
    let mut rebuild = fresh_rebuild(head.taken_at);
    if let Err(e) = rebuild.checkpoint(head.checkpoint, &mut Snapshot(&mut items)) {
        return Err(match items.damage.take() {
            Some(damage) => damage.into(),
            None => BackupError::Content(format!("its snapshot does not decode: {e}")),
        });
    }
    let mut tag = items.after_snapshot()?;
    let mut order = Order::new(head.checkpoint);
    let mut files = Vec::new();
    loop {
        let (lsn, bytes) = match items.item(tag)? {
            Item::Record(lsn, bytes) => (lsn, bytes),
            Item::File(name, _) => {
                files.push(name);
                tag = items.next_tag()?;
                continue;
            }
            Item::End => break,
        };
        order.next(lsn)?;
        let record: Record = codec::decode(&bytes)
            .map_err(|e| BackupError::Content(format!("record {lsn} does not decode: {e}")))?;
        if lsn > head.checkpoint {
            rebuild.apply(lsn, record);
        }
        progress(Progress { bytes: items.blocks.offset(), records: items.records });
        tag = items.next_tag()?;
    }
    order.end(head.position)?;
    let manifest = items.manifest()?;
    if (manifest.position, manifest.checkpoint_lsn) != (head.position, head.checkpoint)
        || manifest.files != files
    {
        return Err(BackupError::Content("its manifest does not describe its items".to_owned()));
    }
    let found = rebuild.digest().to_string();
    if found != manifest.digest {
        return Err(BackupError::DigestMismatch { expected: manifest.digest, found });
    }
    Ok((Verified { manifest }, rebuild))
}

/// The records' order: increasing, and without a gap from the checkpoint to the position.
struct Order {
    checkpoint: Lsn,
    last: Lsn,
}

impl Order {
    fn new(checkpoint: Lsn) -> Order {
        Order { checkpoint, last: 0 }
    }

    fn next(&mut self, lsn: Lsn) -> Result<()> {
        let expected = self.last.max(self.checkpoint) + 1;
        if lsn <= self.last || (lsn > self.checkpoint && lsn != expected) {
            return Err(BackupError::Content(format!(
                "record {lsn} comes out of order (after {})",
                self.last
            )));
        }
        self.last = lsn;
        Ok(())
    }

    fn end(&self, position: Lsn) -> Result<()> {
        if self.last.max(self.checkpoint) != position {
            return Err(BackupError::Content(format!(
                "its records end at {} instead of its position {position}",
                self.last.max(self.checkpoint)
            )));
        }
        Ok(())
    }
}

/// How far a restore rolls a backup forward with the log archive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// As far as the archive goes without a gap.
    End,
    /// Up to the last record before the first one whose time is after this (see
    /// [`crate::archive`] for a record's time).
    Time(Millis),
    /// Up to this position.
    Position(Lsn),
}

/// A restore to a point after the backup: the archive dir and the point.
#[derive(Clone, Copy, Debug)]
pub struct PointInTime<'a> {
    /// The log archive (`sheetd serve --archive-dir`).
    pub archive_dir: &'a Path,
    /// Where to stop.
    pub until: Until,
}

/// What a restore restored.
#[derive(Clone, Debug)]
pub struct Restored {
    /// The backup's manifest.
    pub manifest: Manifest,
    /// The restored state's position: the restored server's next record gets `position + 1`.
    pub position: Lsn,
    /// The time of the record at `position`, when it came from the archive.
    pub position_at: Option<Millis>,
    /// Records taken from the archive.
    pub archived_records: u64,
    /// The segments they came from.
    pub segments: usize,
    /// The digest of the restored state.
    pub digest: String,
}

/// Restores the backup at `path` into `data_dir` (absent or empty): every block's checksum
/// first, then the data dir written at the backup's LSNs and fsynced, then recovered from disk
/// as a start would, its digest compared with the manifest's. Nothing is left in `data_dir` on
/// failure.
///
/// # Errors
/// A non-empty `data_dir`, a damaged file (nothing written), a failure while writing, or a
/// restored dir that does not recover to the backed-up state (removed).
pub fn restore(
    path: &Path,
    data_dir: &Path,
    progress: &mut dyn FnMut(Progress),
) -> Result<Manifest> {
    restore_to(path, data_dir, None, progress).map(|r| r.manifest)
}

/// [`restore`], rolled forward to `point` with the log archive's records: the backup's blocks
/// and every segment the restore uses (from the backup's position + 1 to the point) are read
/// and checked before anything is written; then the data dir is written and recovered, and
/// the state the recovery passes through at the backup's position is compared with the
/// manifest's digest. The restored state's digest is returned.
///
/// # Errors
/// As [`restore`]; and a segment missing (a gap) or damaged, or a point before the backup or
/// past the archive's end, each refused before anything is written.
pub fn restore_to(
    path: &Path,
    data_dir: &Path,
    point: Option<PointInTime<'_>>,
    progress: &mut dyn FnMut(Progress),
) -> Result<Restored> {
    let not_empty = || BackupError::NotEmpty(data_dir.display().to_string());
    match std::fs::read_dir(data_dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(not_empty());
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    let open = || std::fs::File::open(path).map(|f| io::BufReader::with_capacity(1 << 20, f));
    // Every block's checksum and the trailer, before anything is written: a damaged or
    // truncated file is refused here. The blocks are not decompressed for it; the one pass
    // that does (writing the data dir) follows.
    let manifest = check_file(open()?)?;
    let plan = match point {
        Some(point) => plan(&manifest, point, progress)?,
        None => Plan { segments: Vec::new(), target: manifest.position, target_at: None },
    };
    let existed = data_dir.exists();
    let position = manifest.position;
    let written = write_dir(open()?, data_dir, &manifest, progress, &mut |restore| {
        for segment in &plan.segments {
            let mut reader = SegmentReader::open(segment)?;
            while let Some(record) = reader.next_record()? {
                if record.lsn > position && record.lsn <= plan.target {
                    restore.record(record.lsn, &record.bytes).map_err(crate::Error::from)?;
                }
            }
        }
        Ok(())
    })
    .and_then(|()| {
        // The restored dir, recovered as a start recovers it: its state at the backup's
        // position must be the manifest's (a restore rolled forward passes through it).
        let (inspected, at_position) =
            Service::recover_and_inspect(data_dir, manifest.created_at_ms, position)?;
        let found = at_position.to_string();
        if found != manifest.digest {
            return Err(BackupError::RestoredMismatch { expected: manifest.digest.clone(), found });
        }
        Ok(inspected.digest.to_string())
    });
    let digest = match written {
        Ok(digest) => digest,
        Err(e) => {
            // What was written is of no use, and an empty target is what the caller gave.
            let _ = std::fs::remove_dir_all(data_dir);
            if existed {
                let _ = std::fs::create_dir(data_dir);
            }
            return Err(e);
        }
    };
    Ok(Restored {
        position: plan.target,
        position_at: plan.target_at,
        archived_records: plan.target - manifest.position,
        segments: plan.segments.len(),
        digest,
        manifest,
    })
}

/// Checks every block of the backup in `file` and its trailer (without decompressing the data
/// blocks) and returns its manifest.
fn check_file(file: impl Read) -> Result<Manifest> {
    let (kind, summary) = BlockReader::open(file, "sheetd backup", MAGIC, FORMAT)?.check()?;
    if kind != MANIFEST {
        return Err(BackupError::Content("its last block is not a manifest".to_owned()));
    }
    serde_json::from_slice(&summary)
        .map_err(|e| BackupError::Content(format!("its manifest does not parse: {e}")))
}

/// Refuses a point before the backup.
fn before_backup(manifest: &Manifest, until: Until) -> Result<()> {
    match until {
        Until::Time(at) if at < manifest.created_at_ms => Err(BackupError::Target(format!(
            "--until {} is before the backup's time {}: a restore cannot go back before its \
             backup; use an older backup",
            crate::model::timestamp(at).unwrap_or_else(|| at.to_string()),
            manifest.created_at
        ))),
        Until::Position(lsn) if lsn < manifest.position => Err(BackupError::Target(format!(
            "--until-position {lsn} is before the backup's position {}: a restore cannot go \
             back before its backup; use an older backup",
            manifest.position
        ))),
        _ => Ok(()),
    }
}

/// The segments a restore to a point uses and where it stops.
struct Plan {
    segments: Vec<archive::SegmentFile>,
    target: Lsn,
    target_at: Option<Millis>,
}

/// Finds the segments from the backup's position + 1 on, reads and checks each whole (every
/// record up to the point must decode), and finds where the point stops.
fn plan(
    manifest: &Manifest,
    point: PointInTime<'_>,
    progress: &mut dyn FnMut(Progress),
) -> Result<Plan> {
    before_backup(manifest, point.until)?;
    let dir = point.archive_dir.display().to_string();
    let gap = |why: String| BackupError::Archive(ArchiveError::Gap { dir: dir.clone(), why });
    let start = manifest.position + 1;
    let all = archive::list(point.archive_dir)?;
    let mut chain: Vec<archive::SegmentFile> = Vec::new();
    let mut beyond = None;
    for segment in all.into_iter().filter(|s| s.last >= start) {
        let next = chain.last().map_or(start, |s| s.last + 1);
        if segment.first > next {
            beyond = Some((next, segment.first));
            break;
        }
        if chain.last().is_some_and(|last| segment.first <= last.last) {
            return Err(ArchiveError::Content {
                path: segment.path.display().to_string(),
                why: format!("it overlaps {}", chain.last().expect("checked").path.display()),
            }
            .into());
        }
        chain.push(segment);
    }
    let (mut target, mut target_at, mut done) = (manifest.position, None, false);
    let mut used = Vec::new();
    let mut records = 0;
    for segment in chain {
        let mut reader = SegmentReader::open(&segment)?;
        while let Some(record) = reader.next_record()? {
            if record.lsn < start || done {
                continue;
            }
            done = match point.until {
                Until::Time(at) => record.at > at,
                Until::Position(lsn) => record.lsn > lsn,
                Until::End => false,
            };
            if done {
                continue;
            }
            codec::decode::<Record>(&record.bytes).map_err(|e| {
                BackupError::Content(format!("archived record {} does not decode: {e}", record.lsn))
            })?;
            (target, target_at) = (record.lsn, Some(record.at));
            records += 1;
            progress(Progress { bytes: 0, records });
        }
        used.push(segment);
        if done {
            break;
        }
    }
    if !done {
        if let Some((from, to)) = beyond {
            return Err(gap(format!(
                "no segment holds records {from} to {} (the segments go on at {to}); nothing \
                 was restored",
                to - 1
            )));
        }
        if let Until::Position(lsn) = point.until {
            if lsn > target {
                return Err(BackupError::Target(format!(
                    "--until-position {lsn} is past the archive's end: it holds records up to \
                     {target} after the backup's position {}",
                    manifest.position
                )));
            }
        }
    }
    Ok(Plan { segments: used, target, target_at })
}

/// Writes the checkpoint and records of a checked backup (whose manifest is `manifest`) into
/// `data_dir`, then lets `more` add the records after them. Items that do not fit their
/// manifest or their order are refused here; the caller removes what was written.
fn write_dir(
    file: impl Read,
    data_dir: &Path,
    manifest: &Manifest,
    progress: &mut dyn FnMut(Progress),
    more: &mut dyn FnMut(&mut WalLogRestore) -> Result<()>,
) -> Result<()> {
    let (mut items, head) = Items::open(file)?;
    if (manifest.position, manifest.checkpoint_lsn) != (head.position, head.checkpoint) {
        return Err(BackupError::Content("its manifest does not describe its items".to_owned()));
    }
    let mut restore = WalLogRestore::create(data_dir).map_err(crate::Error::from)?;
    let mut failed = None;
    restore
        .checkpoint(head.checkpoint, &mut |out| {
            io::copy(&mut Snapshot(&mut items), out).map(drop).map_err(|e| {
                let message = e.to_string();
                failed = Some(match items.damage.take() {
                    Some(damage) => damage.into(),
                    None => BackupError::from_read(e),
                });
                LogError::Io(io::Error::other(message))
            })
        })
        .map_err(|e| failed.take().unwrap_or_else(|| crate::Error::from(e).into()))?;
    let mut tag = items.after_snapshot()?;
    let mut files = Vec::new();
    let mut order = Order::new(head.checkpoint);
    loop {
        match items.item(tag)? {
            Item::Record(lsn, bytes) => {
                order.next(lsn)?;
                restore.record(lsn, &bytes).map_err(crate::Error::from)?;
                progress(Progress { bytes: items.blocks.offset(), records: items.records });
            }
            Item::File(name, bytes) => files.push((name, bytes)),
            Item::End => break,
        }
        tag = items.next_tag()?;
    }
    order.end(head.position)?;
    items.manifest()?;
    if files.iter().map(|(name, _)| name).ne(manifest.files.iter()) {
        return Err(BackupError::Content("its manifest does not describe its items".to_owned()));
    }
    more(&mut restore)?;
    restore.finish().map_err(crate::Error::from)?;
    for (name, bytes) in files {
        write_private(&data_dir.join(name), &bytes)?;
    }
    let dir = std::fs::File::open(data_dir)?;
    dir.sync_all()?;
    Ok(())
}

/// Writes a file only its owner reads (what the server keeps beside the log may be secret),
/// durably.
fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// The manifest of the backup in `file`, read through its trailer without checking the rest.
///
/// # Errors
/// A damaged trailer or manifest.
pub fn read_manifest(file: impl Read + io::Seek) -> Result<Manifest> {
    let (_, summary) = blocks::read_summary(file)?;
    serde_json::from_slice(&summary)
        .map_err(|e| BackupError::Content(format!("its manifest does not parse: {e}")))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::directory::Import;
    use crate::test_support::{add, config};

    fn changes(service: &Service) -> Vec<(u64, u64, u64)> {
        let snapshot = service.sheet_snapshot(10).unwrap();
        let read = service.read_changes(&snapshot, None, 1000).unwrap();
        read.iter().map(|c| (c.seq, c.row_id, c.version)).collect()
    }

    /// A backup taken between checkpoints restores to the same rows and the same change feed,
    /// and its file is refused once a byte is flipped, with nothing written.
    #[actix_rt::test]
    async fn a_backup_restores_the_same_state_and_feed_and_a_damaged_one_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (service, _) = Service::open(config(&dir.path().join("source"))).unwrap();
        let fixture = serde_json::from_value(json!({
            "users": [{"id": 1, "name": "ada", "plan": "paid"}],
            "projects": [{"id": 1, "name": "P", "ownerId": 1}],
            "sheets": [{"id": 10, "projectId": 1, "name": "A"}],
            "columns": [{"id": 100, "sheetId": 10, "name": "N", "type": "number", "position": 0}],
            "rows": [{"id": 1, "sheetId": 10, "cells": {"100": 0}}]
        }))
        .unwrap();
        service.directory_actor().send(Import(fixture)).await.unwrap().unwrap();
        for n in 1..=5 {
            add(&service, n).await;
        }
        // Records below the next copies' oldest tag are then held only because the feed
        // retains them: the backup must carry them.
        service.checkpoint().await.unwrap();
        for n in 6..=8 {
            add(&service, n).await;
        }
        let copies = service.backup().await.unwrap();
        let position = copies.position();
        // A checkpoint now would truncate the records the backup is about to read: it waits.
        let checkpointing = service.clone();
        let checkpoint = actix_rt::spawn(async move { checkpointing.checkpoint().await });
        actix_rt::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(!checkpoint.is_finished(), "a checkpoint ran while a backup held its copies");
        assert!(service.checkpoints_held());
        let mut file = Vec::new();
        let manifest = tokio::task::spawn_blocking(move || {
            write(copies, &[("cursor.key".to_owned(), vec![7; 32])], &mut file, &mut |_| {})
                .map(|m| (m, file))
        })
        .await
        .unwrap();
        let (manifest, file) = manifest.unwrap();
        let after = checkpoint.await.unwrap().unwrap();
        assert!(after.lsn >= position, "the checkpoint ran once the backup was written");
        assert_eq!(manifest.position, position);
        assert_eq!(manifest.counts.rows, 9);
        assert!(manifest.retained_records > 0, "{manifest:?}");
        // Writes after the copies are not in the backup.
        add(&service, 9).await;
        let source_changes = changes(&service);
        service.close().unwrap();

        assert_eq!(verify(&file[..], &mut |_| {}).unwrap().manifest, manifest);
        assert_eq!(read_manifest(io::Cursor::new(&file)).unwrap(), manifest);
        let path = dir.path().join("backup");
        std::fs::write(&path, &file).unwrap();
        let target = dir.path().join("restored");
        assert_eq!(restore(&path, &target, &mut |_| {}).unwrap(), manifest);
        assert!(matches!(restore(&path, &target, &mut |_| {}), Err(BackupError::NotEmpty(_))));

        assert_eq!(std::fs::read(target.join("cursor.key")).unwrap(), vec![7; 32]);
        let (restored, report) = Service::open(config(&target)).unwrap();
        assert_eq!(report.last_lsn, position);
        assert_eq!(restored.sheet_snapshot(10).unwrap().state.rows.len(), 9);
        let expected: Vec<_> = source_changes[..source_changes.len() - 1].to_vec();
        assert_eq!(changes(&restored), expected, "the same seqs, rows and versions");
        assert_eq!(expected.first().map(|c| c.0), Some(1));
        restored.close().unwrap();

        let mut damaged = file.clone();
        let middle = damaged.len() / 2;
        damaged[middle] ^= 0x01;
        std::fs::write(&path, &damaged).unwrap();
        let elsewhere = dir.path().join("never");
        let refused = restore(&path, &elsewhere, &mut |_| {});
        assert!(matches!(refused, Err(BackupError::Blocks(_))), "{refused:?}");
        assert!(!elsewhere.exists(), "nothing written");
        std::fs::write(&path, &file[..file.len() - 3]).unwrap();
        let refused = restore(&path, &elsewhere, &mut |_| {});
        assert!(
            matches!(refused, Err(BackupError::Blocks(BlockError::Truncated { .. }))),
            "{refused:?}"
        );
        assert!(!elsewhere.exists(), "nothing written");

        // Damage in the last data block (the records', kept as it is when the log compressed
        // them) is found by its checksum before anything is written too, and named.
        let (mut at, mut last) = (9, None);
        while at < file.len() - blocks::TRAILER {
            let len = u32::from_le_bytes(file[at + 5..at + 9].try_into().unwrap()) as usize;
            if file[at] & !blocks::STORED == blocks::DATA {
                last = Some((at, len));
            }
            at += 13 + len;
        }
        let (at, len) = last.expect("a data block");
        let mut damaged = file.clone();
        damaged[at + 13 + len / 2] ^= 0x10;
        std::fs::write(&path, &damaged).unwrap();
        let refused = restore(&path, &elsewhere, &mut |_| {});
        let message = refused.as_ref().map(drop).unwrap_err().to_string();
        assert!(matches!(refused, Err(BackupError::Blocks(BlockError::Damaged { .. }))));
        assert!(message.contains("is damaged") && message.contains("checksum"), "{message}");
        assert!(!elsewhere.exists(), "nothing written");

        // A file of format 1 (every block compressed at level 3, the same items) still
        // verifies and restores.
        let old = as_format_1(&file);
        assert_eq!(old[8], 1);
        let old_manifest = Manifest { format: 1, ..manifest.clone() };
        assert_eq!(verify(&old[..], &mut |_| {}).unwrap().manifest, old_manifest);
        std::fs::write(&path, &old).unwrap();
        let from_old = dir.path().join("from-format-1");
        assert_eq!(restore(&path, &from_old, &mut |_| {}).unwrap(), old_manifest);
        let (restored, report) = Service::open(config(&from_old)).unwrap();
        assert_eq!(report.last_lsn, position);
        assert_eq!(changes(&restored), expected);
        restored.close().unwrap();
    }

    /// The same backup as format 1 wrote it: the same items, every block zstd level 3.
    fn as_format_1(file: &[u8]) -> Vec<u8> {
        let mut reader = BlockReader::open(file, "sheetd backup", MAGIC, FORMAT).unwrap();
        let mut items = Vec::new();
        reader.read_to_end(&mut items).unwrap();
        let (kind, summary) = reader.summary().unwrap();
        let mut manifest: Manifest = serde_json::from_slice(&summary).unwrap();
        manifest.format = 1;
        let mut writer = BlockWriter::new(Vec::new(), MAGIC, 1).unwrap();
        writer.write_all(&items).unwrap();
        writer.finish(kind, &serde_json::to_vec_pretty(&manifest).unwrap()).unwrap()
    }
}
