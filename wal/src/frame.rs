//! The on-disk frame around every log record.
//!
//! Owns: the byte layout of a stored record (the value under its big-endian LSN key in sled):
//!
//! ```text
//! [format version u8][payload len u32 LE][crc32 u32 LE][payload ...]
//! ```
//!
//! The CRC (crc32fast, IEEE) covers the version byte, the length field and the payload, so any
//! damage to any of them is caught, including a length that was rewritten to match a truncated
//! payload.
//!
//! Guarantees:
//! - [`decode`] checks, in order: header present, stored length equals header + payload length,
//!   CRC, version. The version is checked last on purpose: an unknown version with a *matching*
//!   CRC means "written by a newer build" (refuse to start), while a damaged version byte fails
//!   the CRC first and is treated like any other damage.
//! - Every truncation and every single-bit flip of a frame is detected (tested below).

use crate::error::{Error, FrameDefect, Result};

/// Version of the frame layout (the first byte of every stored record).
pub const FRAME_VERSION: u8 = 1;

/// Bytes before the payload: version (1) + length (4) + CRC (4).
pub const HEADER_LEN: usize = 9;

/// Frames `payload` for storage.
///
/// # Errors
/// [`Error::RecordTooLarge`] if the payload does not fit the `u32` length field.
pub fn encode(payload: &[u8]) -> Result<Vec<u8>> {
    let len =
        u32::try_from(payload.len()).map_err(|_| Error::RecordTooLarge { len: payload.len() })?;
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.push(FRAME_VERSION);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc(FRAME_VERSION, len, payload).to_le_bytes());
    out.extend_from_slice(payload);
    Ok(out)
}

/// Checks a stored frame and returns its payload.
///
/// # Errors
/// The first [`FrameDefect`] found (see the module docs for the order).
pub fn decode(stored: &[u8]) -> std::result::Result<&[u8], FrameDefect> {
    if stored.len() < HEADER_LEN {
        return Err(FrameDefect::ShortHeader { len: stored.len(), header: HEADER_LEN });
    }
    let version = stored[0];
    let len = u32::from_le_bytes([stored[1], stored[2], stored[3], stored[4]]);
    let stored_crc = u32::from_le_bytes([stored[5], stored[6], stored[7], stored[8]]);
    // u32 always fits usize on the 32/64-bit targets sled supports; saturate to be safe.
    let expected = HEADER_LEN.saturating_add(usize::try_from(len).unwrap_or(usize::MAX));
    if stored.len() < expected {
        return Err(FrameDefect::Truncated { len: stored.len(), expected });
    }
    if stored.len() > expected {
        return Err(FrameDefect::TrailingBytes { len: stored.len(), expected });
    }
    let payload = &stored[HEADER_LEN..];
    let computed = crc(version, len, payload);
    if computed != stored_crc {
        return Err(FrameDefect::CrcMismatch { stored: stored_crc, computed });
    }
    if version != FRAME_VERSION {
        return Err(FrameDefect::UnknownVersion { found: version });
    }
    Ok(payload)
}

/// CRC over exactly the bytes the frame stores before the CRC field, then the payload.
fn crc(version: u8, len: u32, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&[version]);
    hasher.update(&len.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_including_empty() {
        for payload in [&b""[..], b"x", b"hello frames", &[0u8; 1000]] {
            let framed = encode(payload).unwrap();
            assert_eq!(framed.len(), HEADER_LEN + payload.len());
            assert_eq!(decode(&framed).unwrap(), payload);
        }
    }

    #[test]
    fn every_truncation_is_detected() {
        let framed = encode(b"some payload bytes").unwrap();
        for keep in 0..framed.len() {
            let err = decode(&framed[..keep]).unwrap_err();
            if keep < HEADER_LEN {
                assert!(matches!(err, FrameDefect::ShortHeader { .. }), "{keep}: {err:?}");
            } else {
                assert!(matches!(err, FrameDefect::Truncated { .. }), "{keep}: {err:?}");
            }
        }
    }

    #[test]
    fn every_bit_flip_is_detected() {
        let framed = encode(b"abc\x00\xffdef").unwrap();
        for byte in 0..framed.len() {
            for bit in 0..8 {
                let mut damaged = framed.clone();
                damaged[byte] ^= 1 << bit;
                assert!(
                    decode(&damaged).is_err(),
                    "flip of bit {bit} in byte {byte} went unnoticed"
                );
            }
        }
    }

    #[test]
    fn trailing_bytes_and_newer_version_are_reported() {
        let mut framed = encode(b"abc").unwrap();
        framed.push(0);
        assert!(matches!(
            decode(&framed),
            Err(FrameDefect::TrailingBytes { len: 13, expected: 12 })
        ));

        // A frame with a valid CRC but an unknown version: what a newer build would write.
        let payload = b"future";
        let len = u32::try_from(payload.len()).unwrap();
        let mut future = vec![FRAME_VERSION + 1];
        future.extend_from_slice(&len.to_le_bytes());
        future.extend_from_slice(&crc(FRAME_VERSION + 1, len, payload).to_le_bytes());
        future.extend_from_slice(payload);
        assert_eq!(decode(&future), Err(FrameDefect::UnknownVersion { found: FRAME_VERSION + 1 }));
    }
}
