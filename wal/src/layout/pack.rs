//! Packs: several consecutive small records stored as one sled value.
//!
//! Owns: the byte layout of a pack's body (inside its [`crate::frame`]) and the choice of which
//! runs of records are worth packing.
//!
//! ```text
//! [PACK_ZSTD u8][raw length u32 LE][zstd level 1 frame of raw]
//! raw = for each record, in LSN order: [payload length u32 LE][payload]
//! ```
//!
//! The record count and the first record's LSN are in the sled key (`keys::pack_key`), so a
//! body decodes only together with its key.
//!
//! Why: a group commit under many connections holds dozens of small records (patches, each one
//! row's JSON), and a row alone barely compresses while rows of one sheet resemble each other.
//! Compressed together they shrink several times, and sled keeps one value (one key, one slot
//! in a leaf) instead of dozens. The change feed retains such records for days, so this is
//! what the data dir holds beside its checkpoint.
//!
//! Guarantees:
//! - [`encode`] refuses (saying how large the body came out) rather than build one over
//!   [`STORED_MAX`] bytes: a pack is stored whole like any small record and never reaches
//!   sled's blob files.
//! - [`decode`] yields exactly `count` payloads or fails with [`FrameDefect::BadPack`]: no
//!   trailing bytes, no short record, no length past the end.

use super::keys::CHUNK_BYTES;
use crate::error::FrameDefect;

/// The tag of a zstd-compressed body (the only kind written).
const PACK_ZSTD: u8 = 1;

/// Bytes before the zstd frame: tag (1) + raw length (4).
const HEADER: usize = 5;

/// A record longer than this is stored alone: bigger records gain little from a pack and
/// would leave little room for others.
pub(crate) const RECORD_MAX: usize = 2048;

/// A run is packed once its raw bytes reach this: at the 5-7x rows compress to, a pack stays
/// well under [`STORED_MAX`].
pub(crate) const RAW_TARGET: usize = 16 * 1024;

/// The most bytes a pack's body may take: a framed pack is no larger than a chunk of a large
/// record ([`CHUNK_BYTES`]), for the same reason (sled's leaves stay out of blob files).
pub(crate) const STORED_MAX: usize = CHUNK_BYTES;

/// zstd's fastest regular level, as for large records (`codec`).
const ZSTD_LEVEL: i32 = 1;

/// The largest raw length [`decode`] accepts: what [`encode`] can produce (a run stops at the
/// first record that takes it to [`RAW_TARGET`] or beyond), so a damaged length never makes a
/// large allocation.
const RAW_MAX: usize = RAW_TARGET + 4 + RECORD_MAX;

/// The body of a pack of `records` (two or more, each at most [`RECORD_MAX`] bytes), or, when
/// it would take more than [`STORED_MAX`] bytes, how many it would take (store fewer records
/// together).
pub(crate) fn encode(records: &[&[u8]]) -> Result<Vec<u8>, usize> {
    thread_local! {
        // A context per thread (the commit thread, mostly): creating one costs more than
        // compressing a small pack.
        static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    let raw_len: usize = records.iter().map(|r| 4 + r.len()).sum();
    let mut raw = Vec::with_capacity(raw_len);
    for record in records {
        // Callers pass records of at most RECORD_MAX bytes.
        raw.extend_from_slice(&u32::try_from(record.len()).map_err(|_| usize::MAX)?.to_le_bytes());
        raw.extend_from_slice(record);
    }
    let frame = COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let compressor = match slot.as_mut() {
            Some(c) => c,
            None => slot.insert(zstd::bulk::Compressor::new(ZSTD_LEVEL).ok()?),
        };
        compressor.compress(&raw).ok()
    });
    // zstd failing (out of memory) leaves the records to be stored alone.
    let frame = frame.ok_or(usize::MAX)?;
    let len = HEADER + frame.len();
    if len > STORED_MAX {
        return Err(len);
    }
    let mut body = Vec::with_capacity(len);
    body.push(PACK_ZSTD);
    body.extend_from_slice(&u32::try_from(raw.len()).map_err(|_| usize::MAX)?.to_le_bytes());
    body.extend_from_slice(&frame);
    Ok(body)
}

/// The `count` payloads of a pack's body, in LSN order.
///
/// # Errors
/// [`FrameDefect::BadPack`] for an unknown tag, a raw length out of range, a frame that does not
/// decompress to exactly that length, or records that do not add up to exactly `count`.
pub(crate) fn decode(body: &[u8], count: u32) -> Result<Vec<Vec<u8>>, FrameDefect> {
    thread_local! {
        static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    let bad = FrameDefect::BadPack { count };
    if body.len() < HEADER || body[0] != PACK_ZSTD {
        return Err(bad);
    }
    let raw_len = u32::from_le_bytes(body[1..HEADER].try_into().expect("4 bytes")) as usize;
    if raw_len > RAW_MAX {
        return Err(bad);
    }
    let raw = DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let decompressor = match slot.as_mut() {
            Some(d) => d,
            None => slot.insert(zstd::bulk::Decompressor::new().ok()?),
        };
        decompressor.decompress(&body[HEADER..], raw_len).ok()
    });
    let raw = raw.filter(|raw| raw.len() == raw_len).ok_or(bad)?;
    let mut records = Vec::with_capacity(count as usize);
    let mut rest = &raw[..];
    while let Some((len, tail)) = rest.split_first_chunk::<4>() {
        let len = u32::from_le_bytes(*len) as usize;
        if len > tail.len() || records.len() == count as usize {
            return Err(bad);
        }
        records.push(tail[..len].to_vec());
        rest = &tail[len..];
    }
    if !rest.is_empty() || records.len() != count as usize {
        return Err(bad);
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(i: usize) -> Vec<u8> {
        format!(
            r#"{{"id":{},"sheetId":1,"version":2,"cells":{{"100":"juniper alpha #{i}","102":{}.25}},"createdAt":"2026-11-25T14:46:16.174Z"}}"#,
            900_000 + i,
            i * 7
        )
        .into_bytes()
    }

    #[test]
    fn similar_records_round_trip_and_shrink() {
        let rows: Vec<Vec<u8>> = (0..40).map(row).collect();
        let refs: Vec<&[u8]> = rows.iter().map(Vec::as_slice).collect();
        let body = encode(&refs).expect("40 similar rows fit a pack");
        let raw: usize = rows.iter().map(|r| 4 + r.len()).sum();
        assert!(body.len() * 3 < raw, "{} stored for {raw} raw bytes", body.len());
        assert_eq!(decode(&body, 40).unwrap(), rows);
    }

    #[test]
    fn records_that_do_not_compress_are_refused() {
        // A xorshift stream: nothing for zstd to find, so 8 KiB cannot fit 4,000 bytes.
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let noise: Vec<Vec<u8>> = (0..4)
            .map(|_| {
                (0..2048)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect()
            })
            .collect();
        let refs: Vec<&[u8]> = noise.iter().map(Vec::as_slice).collect();
        let too_large = encode(&refs).unwrap_err();
        assert!(too_large > 8192, "{too_large}");
    }

    #[test]
    fn a_wrong_count_or_damaged_body_fails() {
        let rows: Vec<Vec<u8>> = (0..3).map(row).collect();
        let refs: Vec<&[u8]> = rows.iter().map(Vec::as_slice).collect();
        let body = encode(&refs).unwrap();
        for count in [2, 4] {
            assert_eq!(decode(&body, count), Err(FrameDefect::BadPack { count }));
        }
        let mut other_tag = body.clone();
        other_tag[0] = 7;
        assert_eq!(decode(&other_tag, 3), Err(FrameDefect::BadPack { count: 3 }));
        let mut long = body.clone();
        long[1..HEADER].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode(&long, 3), Err(FrameDefect::BadPack { count: 3 }));
        assert_eq!(decode(&body[..body.len() - 1], 3), Err(FrameDefect::BadPack { count: 3 }));
        assert_eq!(decode(&[], 3), Err(FrameDefect::BadPack { count: 3 }));
    }
}
