//! The key indexes of upserts (docs/spec/extensions.md X5): for a column a `bulkUpsert` names as
//! its key, which rows hold each key value, so finding an item's row costs the same on a sheet of
//! ten rows and of half a million.
//!
//! This module owns what a key *is* ([`KeyValue::of`]: the stored cell read as its value, in one
//! canonical form) and the indexes themselves ([`KeyIndexes`]). The sheet's actor keeps them in
//! its working state, never in [`SheetState`]: a state is copied into every published snapshot,
//! and these maps are O(rows) to copy. An index is built on the first upsert naming its column
//! (one scan of the rows) and then kept exact by [`KeyIndexes::replaced`], which the actor
//! calls for every row each write it applies puts or removes, whatever the write was; a state
//! replaced wholesale (after the log was re-opened) drops them all ([`KeyIndexes::clear`]).
//!
//! An index holds a 64-bit fingerprint of each key, never the key: a row's cell is the one copy
//! of its key, and the index is a few tens of bytes a row whatever the keys' length.

use std::collections::HashMap;
use std::hash::BuildHasher;

use serde_json::Value;

use super::SheetState;
use crate::model::{ColumnId, ColumnType, Row, RowId};

/// The column types a key column may have: the ones whose cells hold one scalar that equality
/// can match (not a checkbox's two values, a list, or a datetime's instants).
pub const KEY_COLUMN_TYPES: [ColumnType; 6] = [
    ColumnType::Text,
    ColumnType::Number,
    ColumnType::Contact,
    ColumnType::Date,
    ColumnType::Dropdown,
    ColumnType::Symbol,
];

/// A key value in its canonical form: two cells hold the same key exactly when their
/// `KeyValue`s are equal.
///
/// A cell counts as its value (a `{value, format}` or `{formula, value}` wrapper as its
/// `value`), as a report filter reads it. Coercion already gives every type of
/// [`KEY_COLUMN_TYPES`] one stored form per value except numbers, where `12`, `12.0` and the
/// string `"12"` (stored as `12`) are one number: integral numbers are kept exactly as
/// integers (so two distinct 64-bit ids never meet, as they would as `f64`s), others by their
/// `f64` bits.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KeyValue {
    /// An integral number.
    Int(i128),
    /// Any other finite number, as the bits of its `f64` (never `-0.0`: that is `Int(0)`).
    Float(u64),
    /// A non-empty string (text, contact, date, option).
    Str(Box<str>),
}

impl KeyValue {
    /// The key a stored (or just coerced) cell value holds; `None` for a value that is no key:
    /// `null`, `""`, a wrapper without a value, a boolean or a list.
    pub fn of(value: &Value) -> Option<KeyValue> {
        let value = match value {
            Value::Object(wrapper) => wrapper.get("value")?,
            plain => plain,
        };
        match value {
            Value::String(s) if !s.is_empty() => Some(KeyValue::Str(s.as_str().into())),
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    return Some(KeyValue::Int(i.into()));
                }
                if let Some(u) = n.as_u64() {
                    return Some(KeyValue::Int(u.into()));
                }
                let x = n.as_f64()?;
                // Integral floats below 2^127 convert to i128 exactly.
                if x.fract() == 0.0 && x.abs() < 1.7e38 {
                    Some(KeyValue::Int(x as i128))
                } else {
                    Some(KeyValue::Float(x.to_bits()))
                }
            }
            _ => None,
        }
    }

    fn as_ref(&self) -> KeyRef<'_> {
        match self {
            KeyValue::Int(i) => KeyRef::Int(*i),
            KeyValue::Float(bits) => KeyRef::Float(*bits),
            KeyValue::Str(s) => KeyRef::Str(s),
        }
    }
}

/// A key as hashed for its fingerprint, borrowed: an index hashes the keys of the rows it
/// reads (most of them plain strings or integers in the row's JSON) without building a
/// [`KeyValue`].
#[derive(Hash, PartialEq)]
enum KeyRef<'a> {
    Int(i128),
    Float(u64),
    Str(&'a str),
}

/// The text of a stored cell that is a plain JSON string without escapes: then the text between
/// its quotes is the string itself, and so its key (when not empty), with nothing to parse.
fn plain_string(raw: &str) -> Option<&str> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    (!inner.contains(['\\', '"'])).then_some(inner)
}

/// The text of a stored cell that is a JSON integer within 64 bits, as [`KeyValue::of`] reads
/// it (`-0` is `0`); `None` for any other text, a number past 64 bits included (JSON parsing
/// makes that a float).
fn plain_integer(raw: &str) -> Option<i128> {
    let digits = raw.strip_prefix('-').unwrap_or(raw);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match raw.parse::<i64>() {
        Ok(i) => Some(i.into()),
        Err(_) => raw.parse::<u64>().ok().map(i128::from),
    }
}

/// The key a stored cell's JSON text holds, given to `f`: read off the text where it is plain
/// (a string without escapes, an integer), else parsed as [`KeyValue::of`] reads a value.
fn with_key_of<R>(raw: &str, f: impl FnOnce(Option<KeyRef<'_>>) -> R) -> R {
    if let Some(text) = plain_string(raw) {
        return f((!text.is_empty()).then_some(KeyRef::Str(text)));
    }
    if let Some(int) = plain_integer(raw) {
        return f(Some(KeyRef::Int(int)));
    }
    let key = serde_json::from_str::<Value>(raw).ok().and_then(|value| KeyValue::of(&value));
    f(key.as_ref().map(KeyValue::as_ref))
}

/// The rows whose keys have one fingerprint, as [`KeyIndex::candidates`] finds them: most
/// often one row, without an allocation.
#[derive(Clone, Debug, PartialEq)]
pub enum Ids {
    /// One row.
    One(RowId),
    /// None, or more than one.
    Many(Vec<RowId>),
}

impl Ids {
    /// No row.
    pub const NONE: Ids = Ids::Many(Vec::new());

    /// The ids, in no particular order.
    pub fn as_slice(&self) -> &[RowId] {
        match self {
            Ids::One(id) => std::slice::from_ref(id),
            Ids::Many(ids) => ids,
        }
    }
}

/// One key column's index: a key's fingerprint → the rows whose keys have it.
///
/// A fingerprint is a 64-bit hash of the key, so an entry is 16 bytes whatever the key, and no
/// key is copied out of its row (a million rows keyed by text: a quarter of the memory a map
/// of the keys took, see docs/performance.md). Two keys may share a fingerprint, so the index
/// gives candidates and [`KeyIndex::holds`] settles each against the row's own cell: what an
/// upsert finds is exact.
///
/// Invariants: each row holding a key is listed once, under its key's fingerprint, in `one`
/// when no other row's key has that fingerprint, else in `many` (at least two ids); no
/// fingerprint is in both.
#[derive(Clone, Debug)]
pub struct KeyIndex {
    column: ColumnId,
    /// Seeded at random for each index, so no caller can choose keys that share a fingerprint.
    hasher: foldhash::quality::RandomState,
    /// Only the fingerprint's lowest bits count where a test asks (collisions made common);
    /// all of them otherwise.
    mask: u64,
    one: HashMap<u64, RowId, foldhash::fast::RandomState>,
    many: HashMap<u64, Vec<RowId>, foldhash::fast::RandomState>,
}

impl KeyIndex {
    /// The index of `column` over every row of `state` (one scan).
    pub fn build(state: &SheetState, column: ColumnId) -> Self {
        Self::build_masked(state, column, u64::MAX)
    }

    /// The index of `column` with fingerprints cut to two bits, so that unequal keys share
    /// them all the time: what it finds must not change.
    #[cfg(test)]
    pub fn build_with_shared_fingerprints(state: &SheetState, column: ColumnId) -> Self {
        Self::build_masked(state, column, 3)
    }

    fn build_masked(state: &SheetState, column: ColumnId, mask: u64) -> Self {
        Self::build_with(state, column, Default::default(), mask)
    }

    fn build_with(
        state: &SheetState,
        column: ColumnId,
        hasher: foldhash::quality::RandomState,
        mask: u64,
    ) -> Self {
        // Grown as keys are found, not sized to the rows: a key column may be mostly empty.
        let (one, many) = Default::default();
        let mut index = KeyIndex { column, hasher, mask, one, many };
        for row in state.rows.values() {
            if let Some(print) = index.fingerprint_of_row(row) {
                index.insert(print, row.id);
            }
        }
        index
    }

    fn fingerprint(&self, key: KeyRef<'_>) -> u64 {
        self.hasher.hash_one(key) & self.mask
    }

    /// The fingerprint of the key `row` holds in this index's column, if it holds one.
    fn fingerprint_of_row(&self, row: &Row) -> Option<u64> {
        let raw = row.cell_raw(self.column)?;
        with_key_of(raw.get(), |key| key.map(|key| self.fingerprint(key)))
    }

    /// The rows whose keys may be `key`: every row holding it, and perhaps rows holding another
    /// key of the same fingerprint. [`KeyIndex::holds`] tells them apart.
    pub fn candidates(&self, key: &KeyValue) -> Ids {
        let print = self.fingerprint(key.as_ref());
        match self.one.get(&print) {
            Some(id) => Ids::One(*id),
            None => self.many.get(&print).map_or(Ids::NONE, |ids| Ids::Many(ids.clone())),
        }
    }

    /// Whether `row` holds `key` in this index's column.
    pub fn holds(&self, row: &Row, key: &KeyValue) -> bool {
        let Some(raw) = row.cell_raw(self.column) else { return false };
        with_key_of(raw.get(), |found| found == Some(key.as_ref()))
    }

    fn insert(&mut self, print: u64, id: RowId) {
        if let Some(ids) = self.many.get_mut(&print) {
            if !ids.contains(&id) {
                ids.push(id);
            }
            return;
        }
        match self.one.insert(print, id) {
            Some(first) if first != id => {
                self.one.remove(&print);
                self.many.insert(print, vec![first, id]);
            }
            _ => {}
        }
    }

    fn remove(&mut self, print: u64, id: RowId) {
        if self.one.get(&print) == Some(&id) {
            self.one.remove(&print);
            return;
        }
        let Some(ids) = self.many.get_mut(&print) else { return };
        ids.retain(|one| *one != id);
        if let [only] = ids[..] {
            self.many.remove(&print);
            self.one.insert(print, only);
        }
    }

    /// From `old` (the row as it was, if it was) to `new`: nothing to do when its key is the
    /// same, as it is for every update an upsert makes by its key.
    fn replace_row(&mut self, old: Option<&Row>, new: &Row) {
        // One stored form per value (coercion), so equal bytes are an equal key: found without
        // reading either (an upsert's updates keep their key).
        fn raw(row: &Row, column: ColumnId) -> Option<&str> {
            row.cell_raw(column).map(|cell| cell.get())
        }
        let column = self.column;
        if old.is_some_and(|old| raw(old, column) == raw(new, column)) {
            return;
        }
        let print = self.fingerprint_of_row(new);
        let old_print = old.and_then(|old| self.fingerprint_of_row(old));
        if old_print == print {
            return;
        }
        if let Some(old_print) = old_print {
            self.remove(old_print, new.id);
        }
        if let Some(print) = print {
            self.insert(print, new.id);
        }
    }

    fn remove_row(&mut self, row: &Row) {
        if let Some(print) = self.fingerprint_of_row(row) {
            self.remove(print, row.id);
        }
    }
}

/// A sheet's key indexes, one per column an upsert has named.
#[derive(Debug, Default)]
pub struct KeyIndexes {
    by_column: HashMap<ColumnId, KeyIndex>,
}

impl KeyIndexes {
    /// The index of `column` over `state`, built now if no upsert named it before.
    pub fn get_or_build(&mut self, state: &SheetState, column: ColumnId) -> &KeyIndex {
        self.by_column.entry(column).or_insert_with(|| KeyIndex::build(state, column))
    }

    /// Bring every index past one row's change, as [`SheetState::apply_with`] tells it:
    /// `old` the row as it was (if it was), `new` as it is now (if it is). The actor applies
    /// every write through it, whatever the write was.
    pub fn replaced(&mut self, old: Option<&Row>, new: Option<&Row>) {
        for index in self.by_column.values_mut() {
            match (old, new) {
                (old, Some(new)) => index.replace_row(old, new),
                (Some(old), None) => index.remove_row(old),
                (None, None) => {}
            }
        }
    }

    /// Forget every index (the state they described was replaced).
    pub fn clear(&mut self) {
        self.by_column.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::model::{Json, SOURCE_API};
    use crate::record::SheetWrite;

    #[test]
    fn a_cell_counts_as_its_value_and_numbers_as_numbers() {
        let key = |v: Value| KeyValue::of(&v);
        assert_eq!(key(json!(12)), key(json!(12.0)));
        assert_eq!(key(json!(12)), key(json!({"value": 12, "format": "0"})));
        assert_eq!(key(json!(-0.0)), key(json!(0)));
        assert_eq!(key(json!(1.5)), Some(KeyValue::Float(1.5f64.to_bits())));
        assert_ne!(key(json!(9_007_199_254_740_993u64)), key(json!(9_007_199_254_740_992u64)));
        assert_eq!(key(json!(u64::MAX)), Some(KeyValue::Int(u64::MAX.into())));
        assert_ne!(key(json!("12")), key(json!(12)), "kinds never meet");
        assert_eq!(key(json!("a")), key(json!({"formula": "=B1", "value": "a"})));
        for none in [json!(null), json!(""), json!(true), json!(["a"]), json!({"formula": "=1"})] {
            assert_eq!(key(none.clone()), None, "{none}");
        }
    }

    /// A key read off a cell's text where it is plain is the key parsing the text gives.
    #[test]
    fn a_key_read_off_the_text_is_the_parsed_one() {
        let texts = [
            "0",
            "-0",
            "7",
            "-7",
            "7.0",
            "1e3",
            "2.5",
            "-1.5e-3",
            "9223372036854775807",
            "-9223372036854775808",
            "-9223372036854775809",
            "18446744073709551615",
            "18446744073709551616",
            "123456789012345678901234567890",
            "\"a\"",
            "\"\"",
            "\"quote \\\"q\\\"\"",
            "\"\\u00e9\"",
            "\"é\"",
            "{\"value\":\"a\",\"format\":\"x\"}",
            "{\"value\":12}",
            "{\"formula\":\"=1\"}",
            "null",
            "true",
            "[\"a\"]",
        ];
        for text in texts {
            let parsed = KeyValue::of(&serde_json::from_str(text).unwrap());
            with_key_of(text, |read| {
                assert!(read == parsed.as_ref().map(KeyValue::as_ref), "{text}")
            });
        }
        assert_eq!(plain_integer("18446744073709551615"), Some(u64::MAX.into()));
        assert_eq!(plain_integer("-"), None);
        assert_eq!(plain_string("\"a\\\"b\""), None);
    }

    fn row(id: RowId, version: u64, key: Value) -> Arc<Row> {
        let cells = BTreeMap::from([(1, Json(key))]);
        Arc::new(Row::at_version(id, 9, version, &cells, SOURCE_API, (0, 0)))
    }

    fn write(put: Vec<Arc<Row>>, deleted: Vec<RowId>) -> SheetWrite {
        SheetWrite { sheet_id: 9, at: 1, put, deleted, idem: None }
    }

    /// The rows holding `key`, as an upsert finds them: the index's candidates, each checked.
    fn holders(index: &KeyIndex, state: &SheetState, key: &KeyValue) -> Vec<RowId> {
        let mut ids: Vec<RowId> = (index.candidates(key).as_slice().iter())
            .filter(|id| state.rows.get(*id).is_some_and(|row| index.holds(row, key)))
            .copied()
            .collect();
        ids.sort_unstable();
        ids
    }

    /// The same, read off every row: what the index must agree with.
    fn scanned(state: &SheetState, key: &KeyValue) -> Vec<RowId> {
        let rows = state.rows.values();
        let mut ids: Vec<RowId> = rows
            .filter(|row| row.cell(1).and_then(|cell| KeyValue::of(&cell)).as_ref() == Some(key))
            .map(|row| row.id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// The index's own invariants (see [`KeyIndex`]), and its entries equal to a rebuild's.
    fn check_entries(index: &KeyIndex, state: &SheetState) {
        assert!(index.many.values().all(|ids| ids.len() >= 2), "{:?}", index.many);
        assert!(index.one.keys().all(|print| !index.many.contains_key(print)));
        let rebuilt = KeyIndex::build_with(state, 1, index.hasher.clone(), index.mask);
        let listed = |i: &KeyIndex| {
            let mut all: Vec<(u64, RowId)> = (i.one.iter().map(|(p, id)| (*p, *id)))
                .chain(i.many.iter().flat_map(|(p, ids)| ids.iter().map(|id| (*p, *id))))
                .collect();
            all.sort_unstable();
            all
        };
        assert_eq!(listed(index), listed(&rebuilt));
    }

    /// Every write applied through `replaced` leaves the index finding exactly the rows a scan
    /// finds, with entries equal to one built afresh from the rows.
    #[test]
    fn the_index_follows_every_write_and_equals_a_rebuild() {
        let mut state = SheetState::new(9, 0, Vec::new(), Vec::new());
        let mut indexes = KeyIndexes::default();
        indexes.get_or_build(&state, 1);
        let writes = [
            write(
                vec![row(1, 1, json!("a")), row(2, 1, json!("b")), row(3, 1, json!("a"))],
                vec![],
            ),
            // A row changes key twice in one write, another loses its key.
            write(
                vec![row(1, 2, json!("c")), row(2, 2, json!(null)), row(1, 3, json!("b"))],
                vec![],
            ),
            write(vec![row(4, 1, json!(7))], vec![3]),
            write(vec![row(2, 3, json!(7.0))], vec![1]),
        ];
        let keys =
            [json!("a"), json!("b"), json!("c"), json!(7)].map(|v| KeyValue::of(&v).unwrap());
        for w in &writes {
            state.apply_with(w, 1, |old, new| {
                indexes.replaced(old.map(|r| &**r), new.map(|r| &**r))
            });
            let kept = indexes.get_or_build(&state, 1);
            check_entries(kept, &state);
            for key in &keys {
                assert_eq!(holders(kept, &state, key), scanned(&state, key), "{key:?}");
            }
        }
        let kept = indexes.get_or_build(&state, 1);
        assert_eq!(holders(kept, &state, &keys[3]), [2, 4]);
        assert!(holders(kept, &state, &keys[0]).is_empty());
    }

    /// A cell value of the kinds a key column stores: plain texts (some with escapes), numbers
    /// written two ways, wrappers, and cells that hold no key.
    fn cell_value(pick: u8) -> Value {
        match pick % 12 {
            0 => json!("a"),
            1 => json!("b"),
            2 => json!("quote \"q\""),
            3 => json!({"value": "a", "format": "x"}),
            4 => json!(7),
            5 => json!(7.0),
            6 => json!(2.5),
            7 => json!({"value": 7}),
            8 => json!(""),
            9 => json!(null),
            10 => json!("c"),
            _ => json!("é\n"),
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { failure_persistence: None, ..Default::default() })]

        /// With fingerprints cut to two bits (so unequal keys share them all the time) and
        /// with full ones, after every write of a random mix (rows created, rekeyed, given
        /// keys others hold, deleted): what the index finds for each key is what a scan of the
        /// rows finds, and its entries are a rebuild's.
        #[test]
        fn the_index_finds_what_a_scan_finds_through_shared_fingerprints(
            writes in proptest::collection::vec(
                proptest::collection::vec((0u64..12, proptest::prelude::any::<u8>(), proptest::prelude::any::<bool>()), 1..6),
                1..12,
            ),
            mask in proptest::prop_oneof![proptest::strategy::Just(3u64), proptest::strategy::Just(u64::MAX)],
        ) {
            let mut state = SheetState::new(9, 0, Vec::new(), Vec::new());
            let mut index = KeyIndex::build_masked(&state, 1, mask);
            let keys: Vec<KeyValue> = (0..12).filter_map(|p| KeyValue::of(&cell_value(p))).collect();
            for (n, changes) in writes.iter().enumerate() {
                let version = n as u64 + 1;
                let (mut put, mut deleted) = (Vec::new(), Vec::new());
                for &(id, pick, delete) in changes {
                    if delete && state.rows.contains_key(&id) {
                        deleted.push(id);
                    } else {
                        put.push(row(id, version, cell_value(pick)));
                    }
                }
                state.apply_with(&write(put, deleted), version, |old, new| match (old, new) {
                    (old, Some(new)) => index.replace_row(old.map(|r| &**r), new),
                    (Some(old), None) => index.remove_row(old),
                    (None, None) => {}
                });
                check_entries(&index, &state);
                for key in &keys {
                    proptest::prop_assert_eq!(holders(&index, &state, key), scanned(&state, key));
                }
            }
        }
    }
}
