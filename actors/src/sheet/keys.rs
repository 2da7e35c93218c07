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

use std::collections::HashMap;

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

    /// The key of `row` in `column`, if it holds one.
    fn of_row(row: &Row, column: ColumnId) -> Option<KeyValue> {
        row.cell(column).and_then(|cell| KeyValue::of(&cell))
    }
}

/// The rows holding one key value. Keys are meant to be unique, so one id is the common case
/// and costs no allocation.
#[derive(Clone, Debug)]
enum Ids {
    One(RowId),
    Many(Vec<RowId>),
}

impl Ids {
    fn as_slice(&self) -> &[RowId] {
        match self {
            Ids::One(id) => std::slice::from_ref(id),
            Ids::Many(ids) => ids,
        }
    }
}

/// One key column's index: key value → the rows holding it.
#[derive(Clone, Debug, Default)]
pub struct KeyIndex {
    column: ColumnId,
    rows: HashMap<KeyValue, Ids, foldhash::quality::RandomState>,
}

impl KeyIndex {
    /// The index of `column` over every row of `state` (one scan).
    pub fn build(state: &SheetState, column: ColumnId) -> Self {
        let mut index = KeyIndex { column, rows: HashMap::default() };
        for row in state.rows.values() {
            index.insert_row(row);
        }
        index
    }

    /// The rows holding `key` (in no particular order).
    pub fn get(&self, key: &KeyValue) -> &[RowId] {
        self.rows.get(key).map_or(&[], Ids::as_slice)
    }

    fn insert_row(&mut self, row: &Row) {
        if let Some(key) = KeyValue::of_row(row, self.column) {
            self.insert(key, row.id);
        }
    }

    fn insert(&mut self, key: KeyValue, id: RowId) {
        match self.rows.get_mut(&key) {
            None => {
                self.rows.insert(key, Ids::One(id));
            }
            Some(Ids::One(one)) if *one == id => {}
            Some(ids @ Ids::One(_)) => {
                let first = ids.as_slice()[0];
                *ids = Ids::Many(vec![first, id]);
            }
            Some(Ids::Many(list)) => {
                if !list.contains(&id) {
                    list.push(id);
                }
            }
        }
    }

    /// From `old` (the row as it was, if it was) to `new`: nothing to do when its key is the
    /// same, as it is for every update an upsert makes by its key.
    fn replace_row(&mut self, old: Option<&Row>, new: &Row) {
        // One stored form per value (coercion), so equal bytes are an equal key: found without
        // building either (an upsert's updates keep their key).
        fn raw(row: &Row, column: ColumnId) -> Option<&str> {
            row.cell_raw(column).map(|cell| cell.get())
        }
        let column = self.column;
        if old.is_some_and(|old| raw(old, column) == raw(new, column)) {
            return;
        }
        let key = KeyValue::of_row(new, self.column);
        let old_key = old.and_then(|old| KeyValue::of_row(old, self.column));
        if old_key == key {
            return;
        }
        if let Some(old_key) = old_key {
            self.remove(&old_key, new.id);
        }
        if let Some(key) = key {
            self.insert(key, new.id);
        }
    }

    fn remove_row(&mut self, row: &Row) {
        if let Some(key) = KeyValue::of_row(row, self.column) {
            self.remove(&key, row.id);
        }
    }

    fn remove(&mut self, key: &KeyValue, id: RowId) {
        let Some(ids) = self.rows.get_mut(key) else { return };
        match ids {
            Ids::One(one) if *one == id => {
                self.rows.remove(key);
            }
            Ids::One(_) => {}
            Ids::Many(list) => {
                list.retain(|one| *one != id);
                match list.as_slice() {
                    [] => {
                        self.rows.remove(key);
                    }
                    [only] => *ids = Ids::One(*only),
                    _ => {}
                }
            }
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

    fn row(id: RowId, version: u64, key: Value) -> Arc<Row> {
        let cells = BTreeMap::from([(1, Json(key))]);
        Arc::new(Row::at_version(id, 9, version, &cells, SOURCE_API, (0, 0)))
    }

    fn write(put: Vec<Arc<Row>>, deleted: Vec<RowId>) -> SheetWrite {
        SheetWrite { sheet_id: 9, at: 1, put, deleted, idem: None }
    }

    /// Every write applied through `replaced` leaves the index equal to one built afresh from
    /// the rows.
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
        for w in &writes {
            state.apply_with(w, 1, |old, new| {
                indexes.replaced(old.map(|r| &**r), new.map(|r| &**r))
            });
            let kept = indexes.get_or_build(&state, 1);
            let rebuilt = KeyIndex::build(&state, 1);
            assert_eq!(kept.rows.len(), rebuilt.rows.len());
            for (key, ids) in &rebuilt.rows {
                let mut a = kept.get(key).to_vec();
                let mut b = ids.as_slice().to_vec();
                a.sort_unstable();
                b.sort_unstable();
                assert_eq!(a, b, "{key:?}");
            }
        }
        let kept = indexes.get_or_build(&state, 1);
        let mut sevens = kept.get(&KeyValue::Int(7)).to_vec();
        sevens.sort_unstable();
        assert_eq!(sevens, [2, 4]);
        assert!(kept.get(&KeyValue::Str("a".into())).is_empty());
    }
}
