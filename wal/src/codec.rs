//! Value encoding for everything sheetd stores: log payloads and checkpoint snapshots.
//!
//! Owns: the only use of bincode in the workspace. Other crates call [`encode`] and [`decode`]
//! and never depend on bincode themselves, so the wire format can change in one place.
//!
//! Format: `[FORMAT_VERSION u8][bincode 2, standard config, serde integration]`.
//!
//! Versions: 1 to 3 share bincode's layout; they differ in how callers' types choose to encode
//! themselves (version 2 stores JSON cell values as a binary tree instead of JSON text; version
//! 3 stores a row as its rendered JSON). A type whose encoding changed asks
//! [`decoding_version`] which one it is reading.
//!
//! Guarantees:
//! - [`decode`] refuses a version byte it does not know with [`Error::UnsupportedVersion`]
//!   instead of misreading bytes written by another build.
//! - [`decode`] refuses trailing bytes ([`CodecError::TrailingBytes`]): a buffer decodes to
//!   exactly one value or not at all, so a type mix-up fails loudly.
//! - Integrity is not this module's job: frames and the checkpoint file carry their own CRCs.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{CodecError, Error, Result};

/// Current on-disk format version byte.
pub const FORMAT_VERSION: u8 = 3;

/// The oldest format version [`decode`] still reads.
pub const OLDEST_READABLE_VERSION: u8 = 1;

thread_local! {
    /// The version of the value [`decode`] is decoding on this thread.
    static DECODING: std::cell::Cell<u8> = const { std::cell::Cell::new(FORMAT_VERSION) };
}

/// The format version `bytes` (made by [`encode`]) say they are in; `None` for no bytes.
pub fn version_of(bytes: &[u8]) -> Option<u8> {
    bytes.first().copied()
}

/// The format version of the bytes being decoded on this thread: [`FORMAT_VERSION`] outside a
/// [`decode`]. For a type whose own encoding differs between versions, read from its
/// `Deserialize` impl.
pub fn decoding_version() -> u8 {
    DECODING.with(std::cell::Cell::get)
}

/// bincode 2 (standard config, serde integration) behind a leading format-version byte.
///
/// # Errors
/// [`Error::Codec`] if the value cannot be serialized (for example a map with non-string keys
/// is fine, but a serde impl that returns an error is not).
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    // The version byte goes first so a future format can be recognised before decoding.
    let mut out = vec![FORMAT_VERSION];
    let body = bincode::serde::encode_to_vec(value, bincode::config::standard())
        .map_err(CodecError::Encode)?;
    out.extend_from_slice(&body);
    Ok(out)
}

/// [`encode`], written to `out` as it is produced: a large value (a checkpoint) is never held
/// whole in memory. Returns the bytes written.
///
/// # Errors
/// [`Error::Codec`] if the value cannot be serialized or `out` fails.
pub fn encode_to<T: Serialize, W: std::io::Write>(value: &T, out: &mut W) -> Result<u64> {
    out.write_all(&[FORMAT_VERSION])
        .map_err(|inner| CodecError::Encode(bincode::error::EncodeError::Io { inner, index: 0 }))?;
    let body = bincode::serde::encode_into_std_write(value, out, bincode::config::standard())
        .map_err(CodecError::Encode)?;
    Ok(1 + body as u64)
}

/// Decodes bytes produced by [`encode`].
///
/// # Errors
/// - [`Error::Codec`] with [`CodecError::Empty`] for an empty input, [`CodecError::Decode`] if
///   the bytes are not a `T`, [`CodecError::TrailingBytes`] if bytes are left over.
/// - [`Error::UnsupportedVersion`] if the leading byte is not a version from
///   [`OLDEST_READABLE_VERSION`] to [`FORMAT_VERSION`].
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(Error::UnsupportedVersion {
            what: "an encoded value".to_owned(),
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let previous = DECODING.with(|v| v.replace(version));
    let decoded = bincode::serde::decode_from_slice(body, bincode::config::standard());
    DECODING.with(|v| v.set(previous));
    let (value, used) = decoded.map_err(CodecError::Decode)?;
    if used != body.len() {
        return Err(CodecError::TrailingBytes { extra: body.len() - used }.into());
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::collections::BTreeMap;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Sample {
        id: u64,
        name: String,
        cells: BTreeMap<String, Option<f64>>,
        tags: Vec<String>,
        kind: Kind,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum Kind {
        Plain,
        Formula { text: String },
    }

    fn sample() -> Sample {
        let mut cells = BTreeMap::new();
        cells.insert("A1".to_owned(), Some(1.5));
        cells.insert("B2".to_owned(), None);
        Sample {
            id: 42,
            name: "budget ✓".to_owned(),
            cells,
            tags: vec!["x".to_owned(), String::new()],
            kind: Kind::Formula { text: "=A1*2".to_owned() },
        }
    }

    #[test]
    fn round_trip_struct() {
        let value = sample();
        let bytes = encode(&value).unwrap();
        assert_eq!(bytes[0], FORMAT_VERSION);
        let back: Sample = decode(&bytes).unwrap();
        assert_eq!(back, value);

        let unit_kind: Kind = decode(&encode(&Kind::Plain).unwrap()).unwrap();
        assert_eq!(unit_kind, Kind::Plain);
    }

    #[test]
    fn unknown_version_is_rejected() {
        let mut bytes = encode(&sample()).unwrap();
        bytes[0] = FORMAT_VERSION + 1;
        let err = decode::<Sample>(&bytes).unwrap_err();
        assert!(
            matches!(err, Error::UnsupportedVersion { found, supported, .. } if found == FORMAT_VERSION + 1 && supported == FORMAT_VERSION),
            "{err:?}"
        );
        assert!(err.to_string().contains("format version 4"), "{err}");
        assert!(!err.is_corruption());
    }

    #[test]
    fn an_older_version_decodes_and_says_so_while_it_does() {
        #[derive(Debug, PartialEq)]
        struct Seen(u8);
        impl<'de> Deserialize<'de> for Seen {
            fn deserialize<D: serde::Deserializer<'de>>(
                d: D,
            ) -> std::result::Result<Self, D::Error> {
                u8::deserialize(d)?;
                Ok(Seen(decoding_version()))
            }
        }
        let mut bytes = encode(&0u8).unwrap();
        assert_eq!(decode::<Seen>(&bytes).unwrap(), Seen(FORMAT_VERSION));
        bytes[0] = OLDEST_READABLE_VERSION;
        assert_eq!(decode::<Seen>(&bytes).unwrap(), Seen(OLDEST_READABLE_VERSION));
        assert_eq!(decoding_version(), FORMAT_VERSION, "restored after decode");
        bytes[0] = 0;
        assert!(matches!(decode::<Seen>(&bytes), Err(Error::UnsupportedVersion { found: 0, .. })));
    }

    #[test]
    fn empty_truncated_and_trailing_inputs_are_rejected() {
        assert!(matches!(decode::<Sample>(&[]), Err(Error::Codec(CodecError::Empty))));

        let bytes = encode(&sample()).unwrap();
        let short = decode::<Sample>(&bytes[..bytes.len() - 3]).unwrap_err();
        assert!(matches!(short, Error::Codec(CodecError::Decode(_))), "{short:?}");

        let mut long = bytes.clone();
        long.push(0);
        let trailing = decode::<Sample>(&long).unwrap_err();
        assert!(
            matches!(trailing, Error::Codec(CodecError::TrailingBytes { extra: 1 })),
            "{trailing:?}"
        );
    }
}
