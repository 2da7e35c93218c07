//! Stored entries: a record whole, a record's chunks, or a pack of small records, each the
//! unit a truncation removes, keeps or splits.
//!
//! Owns: turning records into framed values under their keys ([`put_records`]), reading an
//! entry's records back ([`records_of`]), splitting a pack that a checkpoint cuts in two
//! ([`split_entry`]), and [`Kept`], an entry as a truncation or a sweep marker remembers it.

use super::keys::{chunk_key, key, lsn_of, pack_key, parse_key, Layout, CHUNK_BYTES};
use super::pack;
use crate::error::{Corruption, Error, FrameDefect, Result};
use crate::{frame, Lsn};

/// A kept entry: its first LSN, its chunk count (0: not chunked), how many records it packs
/// (0: not a pack, one record) and its stored bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Kept {
    pub(crate) lsn: Lsn,
    pub(crate) chunks: u32,
    pub(crate) packed: u32,
    pub(crate) bytes: u64,
}

impl Kept {
    /// The entry for the records stored under `parts` (its keys, in order, and their values).
    pub(crate) fn of(lsn: Lsn, parts: &[Part]) -> Kept {
        let (chunks, packed) = match parts.first().map(|(_, layout, _)| *layout) {
            Some(Layout::Chunk { count, .. }) => (count, 0),
            Some(Layout::Pack { count }) => (0, count),
            _ => (0, 0),
        };
        Kept { lsn, chunks, packed, bytes: parts.iter().map(|(_, _, v)| v.len() as u64).sum() }
    }

    /// How many records the entry holds.
    pub(crate) fn records(&self) -> u32 {
        self.packed.max(1)
    }

    /// The LSN of its last record.
    pub(crate) fn last(&self) -> Lsn {
        self.lsn + Lsn::from(self.records()) - 1
    }

    /// Adds the removal of every key of this entry to `batch`; returns how many.
    pub(crate) fn remove(&self, batch: &mut sled::Batch) -> u64 {
        if self.packed > 0 {
            batch.remove(&pack_key(self.lsn, self.packed)[..]);
            return 1;
        }
        if self.chunks == 0 {
            batch.remove(&key(self.lsn)[..]);
            return 1;
        }
        for index in 0..self.chunks {
            batch.remove(&chunk_key(self.lsn, index, self.chunks)[..]);
        }
        u64::from(self.chunks)
    }
}

/// One stored value: its key, what the key says it holds, and the framed bytes.
pub(crate) type Part = (sled::IVec, Layout, sled::IVec);

/// The stored values of the next entry in `items`: one record or pack, or a record's chunks
/// (they sort together); `None` at the end.
pub(crate) fn next_entry(
    items: &mut std::iter::Peekable<impl Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>>,
) -> Result<Option<Vec<Part>>> {
    let Some(item) = items.next() else {
        return Ok(None);
    };
    let (k, stored) = item?;
    let (lsn, layout) = parse_key(&k)?;
    let mut parts = vec![(k, layout, stored)];
    while let Some(Ok((next, _))) = items.peek() {
        if lsn_of(next).ok() != Some(lsn) {
            break;
        }
        let (k, stored) = items.next().expect("peeked")?;
        let layout = parse_key(&k)?.1;
        parts.push((k, layout, stored));
    }
    Ok(Some(parts))
}

/// The first and last LSN of the records an entry's `parts` hold.
pub(crate) fn span(parts: &[Part]) -> Result<(Lsn, Lsn)> {
    let first = lsn_of(&parts[0].0)?;
    match parts[0].1 {
        Layout::Pack { count } => Ok((first, first + Lsn::from(count) - 1)),
        _ => Ok((first, first)),
    }
}

/// Where [`put_record`] and [`put_records`] put the values they make: a `sled::Batch`, or the
/// list the store's `write_values` writes.
pub(crate) trait Put {
    fn put(&mut self, key: &[u8], value: Vec<u8>);
}

impl Put for sled::Batch {
    fn put(&mut self, key: &[u8], value: Vec<u8>) {
        self.insert(key, value);
    }
}

impl Put for Vec<(Vec<u8>, Vec<u8>)> {
    fn put(&mut self, key: &[u8], value: Vec<u8>) {
        self.push((key.to_vec(), value));
    }
}

/// Adds the record `payload` at `lsn` to `batch`: one framed value, or one framed value per
/// [`CHUNK_BYTES`] of payload. Returns the entry it stored.
pub(crate) fn put_record(batch: &mut impl Put, lsn: Lsn, payload: &[u8]) -> Result<Kept> {
    if payload.len() <= CHUNK_BYTES {
        let framed = frame::encode(payload)?;
        let bytes = framed.len() as u64;
        batch.put(&key(lsn), framed);
        return Ok(Kept { lsn, chunks: 0, packed: 0, bytes });
    }
    let count = u32::try_from(payload.len().div_ceil(CHUNK_BYTES))
        .map_err(|_| Error::RecordTooLarge { len: payload.len() })?;
    let mut bytes = 0;
    for (index, chunk) in (0..count).zip(payload.chunks(CHUNK_BYTES)) {
        let framed = frame::encode(chunk)?;
        bytes += framed.len() as u64;
        batch.put(&chunk_key(lsn, index, count), framed);
    }
    Ok(Kept { lsn, chunks: count, packed: 0, bytes })
}

/// Adds the consecutive records `payloads`, the first at `first`, to `batch`: runs of small
/// ones as packs ([`pack`]), every other record as [`put_record`] stores it. Returns the
/// entries it stored, in LSN order.
pub(crate) fn put_records<'a>(
    batch: &mut impl Put,
    first: Lsn,
    payloads: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Vec<Kept>> {
    let mut stored = Vec::new();
    // The run of small records not stored yet: its first LSN, the records, their raw bytes.
    let (mut start, mut run, mut raw) = (first, Vec::new(), 0);
    for (lsn, payload) in (first..).zip(payloads) {
        let small = payload.len() <= pack::RECORD_MAX;
        if small {
            run.push(payload);
            raw += 4 + payload.len();
        }
        if !small || raw >= pack::RAW_TARGET {
            put_packed(batch, start, &run, &mut stored)?;
            (start, raw) = (lsn + 1, 0);
            run.clear();
            if !small {
                stored.push(put_record(batch, lsn, payload)?);
            }
        }
    }
    put_packed(batch, start, &run, &mut stored)?;
    Ok(stored)
}

/// Splits the entry `parts` (a pack whose records lie on both sides of `at`) in `batch`: it is
/// removed, its records after `at` are stored under keys of their own, and so are those up to
/// `at` when `keep_below` (else they go). Returns the entries stored up to `at` and the
/// payloads after it, in LSN order.
///
/// # Errors
/// [`Corruption::Record`] when the pack does not decode.
pub(crate) fn split_entry(
    batch: &mut sled::Batch,
    parts: &[Part],
    at: Lsn,
    keep_below: bool,
) -> Result<(Vec<Kept>, Vec<Vec<u8>>)> {
    let first = lsn_of(&parts[0].0)?;
    let mut below =
        records_of(parts).map_err(|defect| Corruption::Record { lsn: first, defect })?;
    let above = below.split_off((at - first + 1) as usize);
    for (k, _, _) in parts {
        batch.remove(k);
    }
    let kept = if keep_below {
        put_records(batch, first, below.iter().map(Vec::as_slice))?
    } else {
        Vec::new()
    };
    put_records(batch, at + 1, above.iter().map(Vec::as_slice))?;
    Ok((kept, above))
}

/// Stores consecutive small records from `first`: as one pack, or, when they do not compress
/// into one, as packs of as many of them as should fit (judged by how large the whole came
/// out), down to records stored alone.
fn put_packed<P: Put>(
    batch: &mut P,
    first: Lsn,
    records: &[&[u8]],
    stored: &mut Vec<Kept>,
) -> Result<()> {
    if let [record] = records {
        stored.push(put_record(batch, first, record)?);
        return Ok(());
    }
    if records.is_empty() {
        return Ok(());
    }
    let compressed = match pack::encode(records) {
        Ok(body) => {
            let count = u32::try_from(records.len()).expect("a run is at most 16 KiB");
            let framed = frame::encode(&body)?;
            stored.push(Kept { lsn: first, chunks: 0, packed: count, bytes: framed.len() as u64 });
            batch.put(&pack_key(first, count), framed);
            return Ok(());
        }
        Err(compressed) => compressed,
    };
    // Aim a quarter under the bound: records differ in size and in how well they compress.
    let parts = compressed.div_ceil(pack::STORED_MAX * 3 / 4).clamp(2, records.len());
    let per = records.len().div_ceil(parts);
    for (at, part) in (0..).step_by(per).zip(records.chunks(per)) {
        put_packed(batch, first + at, part, stored)?;
    }
    Ok(())
}

/// The payloads of the records one entry's stored values hold, in LSN order: a pack's, or
/// the one record [`assemble`] puts together.
pub(crate) fn records_of(parts: &[Part]) -> std::result::Result<Vec<Vec<u8>>, FrameDefect> {
    match parts {
        [(_, Layout::Pack { count }, stored)] => {
            frame::decode(stored).and_then(|body| pack::decode(body, *count))
        }
        _ => assemble(parts).map(|payload| vec![payload]),
    }
}

/// The payload of one record from its stored values: one whole frame, or chunks `0..count`
/// in order, each a frame of its own, all announcing the same count.
pub(crate) fn assemble(parts: &[Part]) -> std::result::Result<Vec<u8>, FrameDefect> {
    if let [(_, Layout::Whole, stored)] = parts {
        return frame::decode(stored).map(<[u8]>::to_vec);
    }
    let count = match parts.first() {
        Some((_, Layout::Chunk { count, .. }, _)) => *count,
        _ => 1,
    };
    let mut payload = Vec::new();
    for (i, (_, layout, stored)) in parts.iter().enumerate() {
        let index = u32::try_from(i).unwrap_or(u32::MAX);
        if *layout != (Layout::Chunk { index, count }) {
            return Err(FrameDefect::MissingChunk { index, count });
        }
        payload.extend_from_slice(frame::decode(stored)?);
    }
    if parts.len() != count as usize {
        let index = u32::try_from(parts.len()).unwrap_or(u32::MAX);
        return Err(FrameDefect::MissingChunk { index, count });
    }
    Ok(payload)
}
