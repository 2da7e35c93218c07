//! The log's on-disk layout: how records become sled keys and values.
//!
//! Owns every rule about the shape of what the log stores: the key encodings, the chunking of
//! a large record, the packing of small ones, and the entries a truncation or a sweep marker
//! remembers. The store (`log.rs`), the replay (`recovery.rs`) and the checkpoint's sweep
//! marker (`checkpoint.rs`) read and write through it, and nothing here knows about them: a
//! change of format is made here alone, and the dependency only ever points this way.
//!
//! - [`keys`]: the three key encodings, what a key names, and [`keys::CHUNK_BYTES`].
//! - [`entry`]: stored entries (one record, its chunks, or a pack): writing records as entries,
//!   reading their records back, splitting a pack a checkpoint cuts in two.
//! - [`pack`]: the compressed body of a pack.
//!
//! Guarantees:
//! - Keys are 8-byte big-endian LSNs (a record stored whole), 16-byte LSN + chunk index +
//!   chunk count (a record over [`keys::CHUNK_BYTES`], stored in chunks so sled never takes it
//!   to a blob file) or 12-byte first LSN + count (a pack of consecutive small records), so
//!   sled's byte order is LSN order.
//! - Every value is a [`crate::frame`] of at most [`keys::CHUNK_BYTES`] payload bytes: a
//!   chunk, a record no larger, or a pack's body.

pub(crate) mod entry;
pub(crate) mod keys;
pub(crate) mod pack;
