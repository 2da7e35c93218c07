//! The sled keys of the log: what each encoding says, and the size no stored value exceeds.
//!
//! Owns the three key encodings and their parsing, so that sled's byte order stays LSN order
//! whatever a value holds:
//!
//! ```text
//! [LSN u64 BE]                              one record, stored whole
//! [LSN u64 BE][index u32 BE][count u32 BE]  chunk `index` of the `count` chunks of one record
//! [first LSN u64 BE][count u32 BE]          a pack of `count` consecutive records
//! ```

use crate::error::{Corruption, Result};
use crate::Lsn;

/// Records longer than this are stored as several values of at most this many payload bytes.
///
/// sled 0.34 writes any value (and any tree node) larger than a quarter of its 512 KiB segment
/// to a file of its own under `blobs/`, one file and one fsync each, and those files can outlive
/// the records in them. A leaf node holds up to 16 values, so values of this size keep every
/// node, and therefore every write, inside sled's own log file.
pub(crate) const CHUNK_BYTES: usize = 4000;

/// The sled key for the record at `lsn` stored whole: the LSN, 8 bytes big-endian.
pub(crate) fn key(lsn: Lsn) -> [u8; 8] {
    lsn.to_be_bytes()
}

/// The sled key for chunk `index` of `count` of the record at `lsn`: the LSN, then index and
/// count, each big-endian. A record's chunks sort together, after every key of a lower LSN and
/// before every key of a higher one.
pub(crate) fn chunk_key(lsn: Lsn, index: u32, count: u32) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&lsn.to_be_bytes());
    k[8..12].copy_from_slice(&index.to_be_bytes());
    k[12..].copy_from_slice(&count.to_be_bytes());
    k
}

/// The sled key for the pack of `count` records from `first`: the LSN, then the count,
/// big-endian. It sorts where `first`'s own key would.
pub(crate) fn pack_key(first: Lsn, count: u32) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..8].copy_from_slice(&first.to_be_bytes());
    k[8..].copy_from_slice(&count.to_be_bytes());
    k
}

/// What a stored value holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// One record, whole.
    Whole,
    /// Chunk `index` of the `count` chunks of one record.
    Chunk { index: u32, count: u32 },
    /// `count` (two or more) consecutive records from the key's LSN.
    Pack { count: u32 },
}

/// What a sled key names: its (first) LSN and the layout of its value.
pub(crate) type KeyParts = (Lsn, Layout);

/// The LSN and layout a sled key names.
///
/// # Errors
/// [`Corruption::BadKey`] if the key is not 8, 12 or 16 bytes, names LSN 0 (never assigned),
/// or a pack of fewer than two records or past the last LSN.
pub(crate) fn parse_key(key: &[u8]) -> Result<KeyParts> {
    let word = |at: usize| u32::from_be_bytes(key[at..at + 4].try_into().expect("4 bytes"));
    let bad = |detail: String| Err(Corruption::BadKey { detail }.into());
    let (lsn, layout) = match key.len() {
        8 => (Lsn::from_be_bytes(key.try_into().expect("8 bytes")), Layout::Whole),
        12 => (
            Lsn::from_be_bytes(key[..8].try_into().expect("8 bytes")),
            Layout::Pack { count: word(8) },
        ),
        16 => (
            Lsn::from_be_bytes(key[..8].try_into().expect("8 bytes")),
            Layout::Chunk { index: word(8), count: word(12) },
        ),
        n => {
            return bad(format!(
                "{n} bytes where an 8-byte LSN, a 12-byte pack key or a 16-byte chunk key was \
                 expected"
            ))
        }
    };
    if lsn == 0 {
        return bad("LSN 0 is never assigned".to_owned());
    }
    if let Layout::Pack { count } = layout {
        if count < 2 || lsn.checked_add(Lsn::from(count) - 1).is_none() {
            return bad(format!("a pack of {count} records from LSN {lsn}"));
        }
    }
    Ok((lsn, layout))
}

/// The (first) LSN a sled key names.
///
/// # Errors
/// As [`parse_key`].
pub(crate) fn lsn_of(key: &[u8]) -> Result<Lsn> {
    parse_key(key).map(|(lsn, _)| lsn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_in_lsn_order_and_round_trip() {
        let mut keys: Vec<[u8; 8]> =
            [300u64, 1, 256, 255, u64::MAX].iter().map(|&l| key(l)).collect();
        keys.sort_unstable();
        let lsns: Vec<Lsn> = keys.iter().map(|k| lsn_of(k).unwrap()).collect();
        assert_eq!(lsns, vec![1, 255, 256, 300, u64::MAX]);
        assert!(lsn_of(&[1, 2, 3]).unwrap_err().is_corruption());
        assert!(lsn_of(&key(0)).unwrap_err().is_corruption());
    }
}
