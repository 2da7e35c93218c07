//! Value encoding for everything sheetd stores: log payloads and checkpoint snapshots.
//!
//! Owns: the only use of bincode in the workspace. Other crates call [`encode`] and [`decode`]
//! (or [`encode_to`] and [`stream`] for a checkpoint, which is never held whole in memory) and
//! never depend on bincode themselves, so the wire format can change in one place.
//!
//! Format: `[FORMAT_VERSION u8][bincode 2, standard config, serde integration]`, or, for an
//! [`encode`]d body of [`COMPRESS_FROM`] bytes or more that zstd makes smaller,
//! `[FORMAT_VERSION | COMPRESSED u8][body length u32 LE][zstd level 1 frame of the body]`. A
//! bulk write's record is mostly its rows' JSON, which level 1 shrinks 6-8x at about 500 MB/s:
//! the change feed retains such records for days, so they are most of a data dir. Small
//! records (a patch) stay plain: compressing them would save little and cost latency. A
//! checkpoint ([`encode_to`]) is never compressed, so a start reads it at the disk's speed.
//!
//! Versions: 1 to 4 share bincode's layout; they differ in how callers' types choose to encode
//! themselves (version 2 stores JSON cell values as a binary tree instead of JSON text; version
//! 3 stores a row as its rendered JSON; version 4 adds the webhook table at the end of a
//! checkpoint). A type whose encoding changed asks
//! [`decoding_version`] which one it is reading.
//!
//! Guarantees:
//! - [`decode`] refuses a version byte it does not know with [`Error::UnsupportedVersion`]
//!   instead of misreading bytes written by another build.
//! - [`decode`] refuses trailing bytes ([`CodecError::TrailingBytes`]): a buffer decodes to
//!   exactly one value or not at all, so a type mix-up fails loudly.
//! - Integrity is not this module's job: frames and the checkpoint file carry their own CRCs.

use std::io::Read as _;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{CodecError, Error, Result};

/// Current on-disk format version byte.
pub const FORMAT_VERSION: u8 = 4;

/// The oldest format version [`decode`] still reads.
pub const OLDEST_READABLE_VERSION: u8 = 1;

/// The bit of the format byte that says the body is zstd-compressed (see the module docs).
pub const COMPRESSED: u8 = 0x80;

/// [`encode`] compresses bodies of this many bytes or more.
pub const COMPRESS_FROM: usize = 4096;

/// zstd's fastest regular level: most of the saving at a fraction of the CPU of the default.
const ZSTD_LEVEL: i32 = 1;

/// The first bytes of every zstd frame (RFC 8878, 3.1.1).
const ZSTD_MAGIC: [u8; 4] = 0xFD2F_B528u32.to_le_bytes();

/// Bytes between the format byte and a compressed body: its decoded length.
const COMPRESSED_HEADER: usize = 1 + 4;

thread_local! {
    /// The version of the value [`decode`] is decoding on this thread.
    static DECODING: std::cell::Cell<u8> = const { std::cell::Cell::new(FORMAT_VERSION) };
}

/// The format version `bytes` (made by [`encode`]) say they are in; `None` for no bytes.
pub fn version_of(bytes: &[u8]) -> Option<u8> {
    bytes.first().map(|&b| b & !COMPRESSED)
}

/// How many bytes `bytes` (made by [`encode`]) stand for: their own length, or for a compressed
/// value the format byte plus the decoded body. The log counts this toward its next
/// checkpoint, because replaying a record costs what it decodes to, not what it stores.
pub fn decoded_len(bytes: &[u8]) -> usize {
    match compressed_body(bytes) {
        Some((len, _)) => 1 + len,
        None => bytes.len(),
    }
}

/// Whether `bytes` (made by [`encode`]) hold a compressed body: a copy that compresses what it
/// carries can keep these as they are.
pub fn is_compressed(bytes: &[u8]) -> bool {
    compressed_body(bytes).is_some()
}

/// The decoded length and the zstd frame of a compressed value; `None` for any other bytes
/// (a plain value, or bytes [`encode`] did not make).
fn compressed_body(bytes: &[u8]) -> Option<(usize, &[u8])> {
    let (&format, rest) = bytes.split_first()?;
    if format & COMPRESSED == 0 || readable_version(format).is_err() {
        return None;
    }
    let (len, frame) = rest.split_first_chunk::<4>()?;
    // The log's own payloads are always this codec's, but its API takes any bytes: the
    // frame's magic number keeps arbitrary ones from being read as compressed.
    frame.starts_with(&ZSTD_MAGIC).then_some((u32::from_le_bytes(*len) as usize, frame))
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
    thread_local! {
        /// Where this thread encodes a value before compressing or copying it out, kept
        /// between calls: grown by doubling for every large record (a bulk write's), a
        /// buffer copied itself over and over, onto pages the kernel had to zero first.
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let encode_in = |out: &mut Vec<u8>| -> Result<Vec<u8>> {
        // The version byte goes first so a future format can be recognised before decoding.
        out.clear();
        out.push(FORMAT_VERSION);
        bincode::serde::encode_into_std_write(value, &mut *out, bincode::config::standard())
            .map_err(CodecError::Encode)?;
        if out.len() > COMPRESS_FROM {
            if let Some(compressed) = compress(&out[1..]) {
                return Ok(compressed);
            }
        }
        Ok(out.as_slice().to_vec())
    };
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut out) => {
            let encoded = encode_in(&mut out);
            // A rare huge value (a bulk write of many megabytes) is not held for good.
            if out.capacity() > SCRATCH_KEPT {
                *out = Vec::new();
            }
            encoded
        }
        // A value whose serialization encodes another value on this thread.
        Err(_) => encode_in(&mut Vec::new()),
    })
}

/// The most [`encode`]'s buffer keeps between calls, per thread.
const SCRATCH_KEPT: usize = 8 << 20;

/// `body` as a compressed value, if zstd makes it smaller.
fn compress(body: &[u8]) -> Option<Vec<u8>> {
    thread_local! {
        /// A compression context per appending thread: making one allocates its tables.
        static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    let len = u32::try_from(body.len()).ok()?;
    let frame = COMPRESSOR.with_borrow_mut(|compressor| {
        let compressor = match compressor {
            Some(c) => c,
            None => compressor.insert(zstd::bulk::Compressor::new(ZSTD_LEVEL).ok()?),
        };
        compressor.compress(body).ok()
    })?;
    // Plain takes 1 + body bytes: keep the frame only if it is smaller than that.
    if COMPRESSED_HEADER + frame.len() > body.len() {
        return None;
    }
    let mut out = Vec::with_capacity(COMPRESSED_HEADER + frame.len());
    out.push(FORMAT_VERSION | COMPRESSED);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&frame);
    Some(out)
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
    let (&format, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    let version = readable_version(format)?;
    if format & COMPRESSED == 0 {
        return decode_body(version, body);
    }
    let (len, frame) = compressed_body(bytes).ok_or(CodecError::Truncated)?;
    let body = decompress(frame, len)?;
    if body.len() != len {
        return Err(CodecError::Truncated.into());
    }
    decode_body(version, &body)
}

/// The body `frame` holds, at most `len` bytes.
fn decompress(frame: &[u8], len: usize) -> Result<Vec<u8>> {
    thread_local! {
        /// A decompression context per decoding thread: making one allocates its tables, and
        /// a link thread decodes thousands of values a second.
        static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    DECOMPRESSOR
        .with_borrow_mut(|decompressor| {
            let decompressor = match decompressor {
                Some(d) => d,
                None => decompressor.insert(zstd::bulk::Decompressor::new()?),
            };
            decompressor.decompress(frame, len)
        })
        .map_err(|e| CodecError::Decompress(e).into())
}

/// A value read from a stream (a checkpoint file) rather than a buffer: its format byte is
/// read, its body not yet, so the caller can pick the type by [`Streamed::version`].
pub struct Streamed<R> {
    format: u8,
    reader: std::io::BufReader<R>,
}

/// The buffer a [`Streamed`] value is read through. bincode reads a value a field at a time,
/// and through a `BufReader` it takes each field, varints included, straight from the buffer
/// (peeking at it); through any other reader it calls `read_exact` per byte of a varint. A
/// caller's own buffer of the same size is read past, not copied twice.
const STREAM_BUFFER: usize = 1 << 20;

/// Reads the format byte of the value `reader` holds (made by [`encode`] or [`encode_to`]).
///
/// # Errors
/// [`CodecError::Empty`] for no bytes, [`Error::UnsupportedVersion`] for an unknown version,
/// [`Error::Codec`] when `reader` fails.
pub fn stream<R: std::io::Read>(reader: R) -> Result<Streamed<R>> {
    let mut reader = std::io::BufReader::with_capacity(STREAM_BUFFER, reader);
    let mut format = [0u8; 1];
    if reader.read(&mut format).map_err(|e| CodecError::Decode(io_error(e)))? == 0 {
        return Err(CodecError::Empty.into());
    }
    readable_version(format[0])?;
    Ok(Streamed { format: format[0], reader })
}

impl<R: std::io::Read> Streamed<R> {
    /// The value's format version.
    pub fn version(&self) -> u8 {
        self.format & !COMPRESSED
    }

    /// Decodes the value, which must end where the stream ends. The same checks as [`decode`].
    ///
    /// # Errors
    /// As [`decode`]; [`Error::Codec`] also when the stream fails.
    pub fn decode<T: DeserializeOwned>(mut self) -> Result<T> {
        if self.format & COMPRESSED != 0 {
            // Only `encode` compresses, and it makes small values: read it whole.
            let mut bytes = vec![self.format];
            self.reader.read_to_end(&mut bytes).map_err(|e| CodecError::Decode(io_error(e)))?;
            return decode(&bytes);
        }
        let value = decoding_as(self.version(), || {
            bincode::serde::decode_from_reader(&mut self.reader, bincode::config::standard())
        })
        .map_err(CodecError::Decode)?;
        let mut rest = Vec::new();
        self.reader.read_to_end(&mut rest).map_err(|e| CodecError::Decode(io_error(e)))?;
        if !rest.is_empty() {
            return Err(CodecError::TrailingBytes { extra: rest.len() }.into());
        }
        Ok(value)
    }
}

/// The version of a format byte (its [`COMPRESSED`] bit aside), if this build reads it.
fn readable_version(format: u8) -> Result<u8> {
    let version = format & !COMPRESSED;
    if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(Error::UnsupportedVersion {
            what: "an encoded value".to_owned(),
            found: format,
            supported: FORMAT_VERSION,
        });
    }
    Ok(version)
}

/// Runs `decode` with [`decoding_version`] answering `version` on this thread.
fn decoding_as<T>(version: u8, decode: impl FnOnce() -> T) -> T {
    let previous = DECODING.with(|v| v.replace(version));
    let decoded = decode();
    DECODING.with(|v| v.set(previous));
    decoded
}

/// A read error of a stream, as bincode reports its own.
fn io_error(inner: std::io::Error) -> bincode::error::DecodeError {
    bincode::error::DecodeError::Io { inner, additional: 0 }
}

/// Decodes a plain body written in format `version`.
/// Decodes a `T` from the start of `bytes` (made by [`encode`]) and ignores what follows it:
/// for a reader that needs only a value's leading fields (`T` lays out a prefix of the encoded
/// type's fields), without decompressing or decoding the rest (a bulk write's rows).
///
/// # Errors
/// An empty value, an unknown format, or bytes that do not start with a `T`.
pub fn decode_prefix<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    let (&format, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    let version = readable_version(format)?;
    let config = bincode::config::standard();
    if format & COMPRESSED == 0 {
        let (value, _) = decoding_as(version, || bincode::serde::decode_from_slice(body, config))
            .map_err(CodecError::Decode)?;
        return Ok(value);
    }
    let (_, frame) = compressed_body(bytes).ok_or(CodecError::Truncated)?;
    // Streamed: only the frame's first bytes are decompressed.
    let mut stream = zstd::stream::read::Decoder::with_buffer(frame)
        .map_err(CodecError::Decompress)?
        .single_frame();
    let value = decoding_as(version, || bincode::serde::decode_from_std_read(&mut stream, config))
        .map_err(CodecError::Decode)?;
    Ok(value)
}

/// Decodes a value made by [`encode_to`] (never compressed) whose fields may borrow from
/// `bytes` (a `&[u8]` or `&str`) rather than be copied out: a large byte field is then read in
/// place.
///
/// # Errors
/// As [`decode`]; a compressed value is refused ([`CodecError::Decode`]): it has no bytes in
/// place to borrow.
pub fn decode_borrowed<'a, T: serde::Deserialize<'a>>(bytes: &'a [u8]) -> Result<T> {
    let (&format, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    let version = readable_version(format)?;
    if format & COMPRESSED != 0 {
        let why = "a compressed value cannot be borrowed from";
        return Err(CodecError::Decode(bincode::error::DecodeError::Other(why)).into());
    }
    decode_body(version, body)
}

/// Decodes exactly one `T` from `body`, the bytes after the format byte; a `T` that borrows
/// (see [`decode_borrowed`]) borrows from `body`.
fn decode_body<'a, T: serde::Deserialize<'a>>(version: u8, body: &'a [u8]) -> Result<T> {
    let (value, used) = decoding_as(version, || {
        bincode::serde::borrow_decode_from_slice(body, bincode::config::standard())
    })
    .map_err(CodecError::Decode)?;
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

    /// Serializes as the encoding of its inner value: an encode inside an encode.
    struct Nested(Vec<u8>);

    impl Serialize for Nested {
        fn serialize<S: serde::Serializer>(&self, out: S) -> std::result::Result<S::Ok, S::Error> {
            let inner = encode(&self.0).map_err(serde::ser::Error::custom)?;
            out.serialize_bytes(&inner)
        }
    }

    #[test]
    fn the_thread_buffer_leaves_nothing_of_one_value_in_the_next() {
        // Large and incompressible enough to stay plain, then small, then nested.
        let big: Vec<u64> = (0..5000u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
        let small = vec![7u64, 8, 9];
        for _ in 0..2 {
            assert_eq!(decode::<Vec<u64>>(&encode(&big).unwrap()).unwrap(), big);
            let bytes = encode(&small).unwrap();
            assert_eq!(bytes.len(), 1 + 1 + 3, "version, length, three small integers");
            assert_eq!(decode::<Vec<u64>>(&bytes).unwrap(), small);
        }
        let nested = encode(&Nested(vec![1, 2, 3])).unwrap();
        let inner: Vec<u8> = decode(&nested).unwrap();
        assert_eq!(decode::<Vec<u8>>(&inner).unwrap(), vec![1, 2, 3]);
        // A value over what the buffer keeps leaves it, and encoding goes on.
        let huge = vec![0xA5u8; SCRATCH_KEPT + 1];
        assert_eq!(decode::<Vec<u8>>(&encode(&huge).unwrap()).unwrap(), huge);
        assert_eq!(decode::<Vec<u64>>(&encode(&small).unwrap()).unwrap(), small);
    }

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
    fn a_plain_value_decodes_in_place_and_a_compressed_one_is_refused() {
        #[derive(Serialize, Deserialize)]
        struct Owned {
            status: u16,
            #[serde(with = "serde_bytes")]
            body: Vec<u8>,
        }
        #[derive(Deserialize)]
        struct InPlace<'a> {
            status: u16,
            body: &'a [u8],
        }
        let value = Owned { status: 200, body: vec![7; 10_000] };
        let mut plain = Vec::new();
        encode_to(&value, &mut plain).unwrap();
        let read: InPlace<'_> = decode_borrowed(&plain).unwrap();
        assert_eq!((read.status, read.body), (200, &value.body[..]));
        let within = plain.as_ptr_range();
        assert!(within.contains(&read.body.as_ptr()), "the body is read where it lies");
        // Trailing bytes are refused, as by `decode`.
        plain.push(0);
        assert!(decode_borrowed::<InPlace<'_>>(&plain).is_err());

        let compressed = encode(&value).unwrap();
        assert!(is_compressed(&compressed));
        assert!(decode_borrowed::<InPlace<'_>>(&compressed).is_err());
        assert_eq!(decode::<Owned>(&compressed).unwrap().body, value.body);
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
        assert!(err.to_string().contains("format version 5"), "{err}");
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

    /// A bulk write's shape: many similar rows of JSON text.
    fn rows(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| {
                format!(r#"{{"id":{i},"cells":{{"100":"row {i}","101":{}}},"version":1}}"#, i * 7)
            })
            .collect()
    }

    #[test]
    fn a_large_value_is_stored_compressed_and_decodes_the_same() {
        let value = rows(2000);
        let bytes = encode(&value).unwrap();
        assert_eq!(bytes[0], FORMAT_VERSION | COMPRESSED);
        assert_eq!(version_of(&bytes), Some(FORMAT_VERSION));
        let plain = bincode::serde::encode_to_vec(&value, bincode::config::standard()).unwrap();
        assert!(bytes.len() * 4 < plain.len(), "{} of {} bytes", bytes.len(), plain.len());
        assert_eq!(decoded_len(&bytes), 1 + plain.len());
        assert_eq!(decode::<Vec<String>>(&bytes).unwrap(), value);

        // Small values stay plain, and count as what they store.
        let small = encode(&rows(3)).unwrap();
        assert_eq!(small[0], FORMAT_VERSION);
        assert_eq!(decoded_len(&small), small.len());
        // Bytes the codec did not make count as their length.
        assert_eq!(decoded_len(&[0xff, 1, 2, 3, 4, 5]), 6);
        assert_eq!(decoded_len(&[FORMAT_VERSION | COMPRESSED, 0xff, 0xff, 0, 0, 1, 2, 3, 4]), 9);
    }

    #[test]
    fn a_body_zstd_cannot_shrink_stays_plain() {
        // A xorshift stream: no redundancy for zstd to find.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let noise: Vec<u8> = (0..COMPRESS_FROM * 2)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let bytes = encode(&noise).unwrap();
        assert_eq!(bytes[0], FORMAT_VERSION);
        assert_eq!(decode::<Vec<u8>>(&bytes).unwrap(), noise);
    }

    #[test]
    fn a_damaged_compressed_value_is_an_error_not_a_panic() {
        let bytes = encode(&rows(2000)).unwrap();
        assert!(matches!(
            decode::<Vec<String>>(&bytes[..3]),
            Err(Error::Codec(CodecError::Truncated))
        ));
        let cut = decode::<Vec<String>>(&bytes[..bytes.len() / 2]).unwrap_err();
        assert!(matches!(cut, Error::Codec(CodecError::Decompress(_))), "{cut:?}");
        // A length that promises more than the frame holds.
        let mut longer = bytes.clone();
        let len = u32::from_le_bytes(longer[1..5].try_into().unwrap()) + 10;
        longer[1..5].copy_from_slice(&len.to_le_bytes());
        let short = decode::<Vec<String>>(&longer).unwrap_err();
        assert!(matches!(short, Error::Codec(CodecError::Truncated)), "{short:?}");
        // The thread's decompression context, used by the failures above, still decodes.
        assert_eq!(decode::<Vec<String>>(&bytes).unwrap(), rows(2000));
        // A newer version's compressed value is refused as such.
        let mut newer = bytes.clone();
        newer[0] = (FORMAT_VERSION + 1) | COMPRESSED;
        assert!(matches!(decode::<Vec<String>>(&newer), Err(Error::UnsupportedVersion { .. })));
    }

    #[test]
    fn a_streamed_value_decodes_like_a_buffered_one_with_the_same_checks() {
        let value = sample();
        let mut plain = Vec::new();
        encode_to(&value, &mut plain).unwrap();
        let streamed = stream(&plain[..]).unwrap();
        assert_eq!(streamed.version(), FORMAT_VERSION);
        assert_eq!(streamed.decode::<Sample>().unwrap(), value);

        // A compressed value streams too.
        let large = rows(2000);
        let compressed = encode(&large).unwrap();
        assert_eq!(stream(&compressed[..]).unwrap().decode::<Vec<String>>().unwrap(), large);

        let mut long = plain.clone();
        long.extend_from_slice(b"xyz");
        let trailing = stream(&long[..]).unwrap().decode::<Sample>().unwrap_err();
        assert!(
            matches!(trailing, Error::Codec(CodecError::TrailingBytes { extra: 3 })),
            "{trailing:?}"
        );
        let short = stream(&plain[..plain.len() - 2]).unwrap().decode::<Sample>().unwrap_err();
        assert!(matches!(short, Error::Codec(CodecError::Decode(_))), "{short:?}");
        assert!(matches!(stream(&b""[..]), Err(Error::Codec(CodecError::Empty))));
        let mut newer = plain.clone();
        newer[0] = FORMAT_VERSION + 1;
        assert!(matches!(stream(&newer[..]), Err(Error::UnsupportedVersion { .. })));
    }
}
