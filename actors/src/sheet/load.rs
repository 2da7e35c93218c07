//! Decoding a sheet's rows from a checkpoint, with the persistent map built on a second thread.
//!
//! Owns: the `Deserialize` side of [`SheetState::rows`](super::SheetState). A start-up spends
//! most of its time on the rows of its largest sheets: bincode decoding each row's fields and
//! JSON text (taken as stored: see `Row`'s `Deserialize`), then inserting the row into the
//! persistent map. The first half runs on the decoding thread; the second on a scoped worker
//! fed in chunks, so on two cores the two halves overlap. Small sheets decode inline: a thread
//! would cost more than it saves.
//!
//! The map is built with full leaves ([`packed_order`]): rows inserted in ascending order, as
//! a checkpoint holds them, would leave every leaf of the B+tree half full (a full leaf splits
//! at its median and only the right half fills again), which is about 20 bytes per row more.

use std::fmt;
use std::sync::mpsc;
use std::sync::Arc;

use imbl::OrdMap;
use serde::de::{Deserializer, Error as _, MapAccess, Visitor};

use crate::model::{Row, RowId};

/// Rows per chunk handed to the worker: large enough that the channel costs nothing per row,
/// small enough that the worker starts at once.
const CHUNK: usize = 4096;

/// Sheets with fewer rows decode on the calling thread.
const PARALLEL_FROM: usize = 4 * CHUNK;

/// `#[serde(deserialize_with)]` for a sheet's rows: the same map [`OrdMap`]'s own `Serialize`
/// writes.
pub(super) fn rows<'de, D: Deserializer<'de>>(d: D) -> Result<OrdMap<RowId, Arc<Row>>, D::Error> {
    d.deserialize_map(RowsVisitor)
}

struct RowsVisitor;

impl<'de> Visitor<'de> for RowsVisitor {
    type Value = OrdMap<RowId, Arc<Row>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map of rows by id")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        if map.size_hint().unwrap_or(0) < PARALLEL_FROM {
            let mut rows = OrdMap::new();
            let mut chunk = Vec::new();
            while let Some(entry) = map.next_entry::<RowId, Row>()? {
                chunk.push(entry);
                if chunk.len() == CHUNK {
                    insert_packed(&mut rows, std::mem::take(&mut chunk));
                }
            }
            insert_packed(&mut rows, chunk);
            return Ok(rows);
        }
        std::thread::scope(|scope| {
            // Two chunks in flight: the decoder never waits unless the worker is behind, and
            // memory stays bounded by the chunks, not the sheet.
            let (tx, rx) = mpsc::sync_channel::<Vec<(RowId, Row)>>(2);
            let worker = std::thread::Builder::new()
                .name("sheetd-load".to_owned())
                .spawn_scoped(scope, move || {
                    let mut rows = OrdMap::new();
                    for chunk in rx {
                        insert_packed(&mut rows, chunk);
                    }
                    rows
                })
                .map_err(|e| A::Error::custom(format!("start a row decoding thread: {e}")))?;
            let mut chunk = Vec::with_capacity(CHUNK);
            let decoded = loop {
                match map.next_entry::<RowId, Row>() {
                    Ok(Some(entry)) => chunk.push(entry),
                    Ok(None) => break Ok(()),
                    Err(e) => break Err(e),
                }
                if chunk.len() == CHUNK {
                    let full = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK));
                    // The worker stops only by panicking, which the join below reports.
                    if tx.send(full).is_err() {
                        break Ok(());
                    }
                }
            };
            if decoded.is_ok() && !chunk.is_empty() {
                // Fails only when the worker already stopped; the join says why.
                let _ = tx.send(chunk);
            }
            drop(tx);
            let rows = worker
                .join()
                .map_err(|_| A::Error::custom("a row map building thread panicked"))?;
            decoded.map(|()| rows)
        })
    }
}

/// The order to insert `len` rows in, given in ascending id order above every row the map
/// holds, so that the leaves they land in end up full: every other row first, then the rest.
///
/// Appended one by one, rows split each full leaf at its median and fill only its right half
/// again, so every leaf ends half full (about 20 bytes a row more). Inserted at even positions
/// first, each leaf splits off holding half its slots and spans twice as many ids; the odd rows
/// then fall between those, as many into each leaf, filling it without another split. Any
/// order gives the same map: only its memory differs. A start's chunks go in this order, and
/// so does a write that adds rows in ascending order (a bulkAdd's).
pub(super) fn packed_order(len: usize) -> impl Iterator<Item = usize> {
    (0..len).step_by(2).chain((1..len).step_by(2))
}

/// Inserts `chunk` (see [`packed_order`]).
fn insert_packed(rows: &mut OrdMap<RowId, Arc<Row>>, chunk: Vec<(RowId, Row)>) {
    let mut slots: Vec<Option<(RowId, Row)>> = chunk.into_iter().map(Some).collect();
    for i in packed_order(slots.len()) {
        if let Some((id, row)) = slots[i].take() {
            rows.insert(id, Arc::new(row));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use serde_json::json;

    use crate::model::{Json, Row, SOURCE_API};
    use crate::sheet::SheetState;

    /// A sheet large enough to decode on the worker, with a row in the last, partial chunk.
    fn big_sheet() -> SheetState {
        let n = super::PARALLEL_FROM as u64 + super::CHUNK as u64 / 2 + 1;
        let rows = (1..=n)
            .map(|id| {
                let cells = BTreeMap::from([(100, Json(json!(format!("row \"{id}\""))))]);
                Row::new(id, 7, cells, SOURCE_API, 1_700_000_000_000 + id as i64)
            })
            .collect();
        SheetState::new(7, 1_700_000_000_000, Vec::new(), rows)
    }

    #[test]
    fn a_large_sheet_decodes_to_the_same_rows_in_order() {
        let sheet = big_sheet();
        let mut bytes = Vec::new();
        crate::log::codec::encode_to(&sheet, &mut bytes).unwrap();
        let back: SheetState = crate::log::codec::decode(&bytes).unwrap();
        assert_eq!(back.rows.len(), sheet.rows.len());
        assert!(sheet.rows.len() > super::PARALLEL_FROM);
        for ((id, row), (back_id, back_row)) in sheet.rows.iter().zip(back.rows.iter()) {
            assert_eq!(id, back_id);
            assert_eq!(**row, **back_row);
        }
    }

    #[test]
    fn a_cut_short_sheet_fails_the_decode_wherever_it_ends() {
        let sheet = big_sheet();
        let mut bytes = Vec::new();
        crate::log::codec::encode_to(&sheet, &mut bytes).unwrap();
        // End the bytes inside one row's JSON: in the first chunk, in a middle one while the
        // worker is busy with earlier chunks, and in the last, partial chunk.
        let last = sheet.rows.len();
        for id in [1, super::CHUNK * 2 + 5, last] {
            let needle = format!("\"id\":{id},");
            let at = bytes
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap_or_else(|| panic!("row {id}'s JSON is in the encoding"));
            let err = crate::log::codec::decode::<SheetState>(&bytes[..at]).unwrap_err();
            // The bytes end inside a length-prefixed string: bincode runs out of input.
            assert!(
                matches!(&err, wal::Error::Codec(wal::CodecError::Decode(_)))
                    && format!("{err:?}").contains("UnexpectedEnd"),
                "row {id}: {err:?}"
            );
        }
        // The whole bytes still decode: the test cut what it meant to.
        let back: SheetState = crate::log::codec::decode(&bytes).unwrap();
        assert_eq!(back.rows.get(&1).map(Arc::clone), sheet.rows.get(&1).map(Arc::clone));
    }
}
