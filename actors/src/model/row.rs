//! A row of a sheet, stored as the JSON the API shows for it.
//!
//! A row's cells are kept only inside its rendered RowV1 JSON: one allocation per row version,
//! written when the version is made and shared by every read after (a page is a concatenation
//! of these bytes), by the log record that carries the row, and by checkpoints (so a start
//! decodes a row without building its cells). The few readers that need values (a write's
//! merge, filters, reports, key indexes, CSV export) parse only the cells they ask for.
//!
//! The stored text of a row written through the API leaves out the JSON's last field,
//! `updatedBy`, which is the same in every such row ([`Row::json_pieces`] gives it back): a
//! million rows keep 29 MB less, and a reader copies two pieces instead of one. Log records
//! and checkpoints carry the whole JSON, as they always have.
//!
//! The fields shown in the JSON (`id`, `sheet_id`, `version`, `created_at`, `updated_at`,
//! `source`) are fixed when a row is built: a change makes a new row ([`Row::next`]). The fields
//! the API never shows (`parent_id`, `attachments`) may be set on a new row before it is shared.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

use super::{Attachment, ColumnId, Json, Millis, RowId, SheetId};

/// Where a row's last write came from, as `updatedBy.source` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Source {
    /// Written through the API.
    Api,
    /// Loaded from a fixture or an admin import.
    Import,
}

impl Source {
    /// The name the API shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Api => "api",
            Source::Import => "import",
        }
    }
}

/// `source` of rows written through the API.
pub const SOURCE_API: Source = Source::Api;
/// `source` of rows loaded from a fixture or an admin import.
pub const SOURCE_IMPORT: Source = Source::Import;

/// RFC 3339 UTC with milliseconds, the form of every instant the API shows.
pub fn timestamp(ms: Millis) -> Option<String> {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

/// A row of a sheet: its identity and bookkeeping, and its cells inside its RowV1 JSON.
///
/// 48 bytes, so that a shared row (with `Arc`'s two counters) fills jemalloc's 64-byte class:
/// the sheet, the version and the source are read from the JSON ([`Row::sheet_id`],
/// [`Row::version`], [`Row::source`]).
#[derive(Clone, Debug)]
pub struct Row {
    /// Global row id.
    pub id: RowId,
    /// The parent and the attachments, which few rows have: behind one pointer, `None` when
    /// the row has neither (24 bytes less per row than the two fields were).
    family: Option<Box<Family>>,
    /// Creation time.
    pub created_at: Millis,
    /// Time of the last write.
    pub updated_at: Millis,
    /// RowV1, the row as the API shows it, cells included; a row written through the API
    /// keeps it without `updatedBy` (see [`Row::json_pieces`]).
    json: Box<RawValue>,
}

/// What few rows have (never exposed): a parent, files. Never both empty: that is `None`.
#[derive(Clone, Debug, PartialEq)]
struct Family {
    parent_id: Option<RowId>,
    attachments: Box<[Attachment]>,
}

impl Family {
    fn of(parent_id: Option<RowId>, attachments: Box<[Attachment]>) -> Option<Box<Family>> {
        (parent_id.is_some() || !attachments.is_empty())
            .then(|| Box::new(Family { parent_id, attachments }))
    }
}

impl Row {
    /// The sheet it belongs to, as its JSON names it (`{"id":…,"sheetId":…,`). Read from
    /// there rather than kept beside it (see [`Row`]'s size): the few readers (a checkpoint, a
    /// row's next version) pay a short digit scan.
    pub fn sheet_id(&self) -> SheetId {
        self.number_after(0, b",\"sheetId\":")
    }

    /// Optimistic-concurrency version: 1 when created, +1 on every successful write. Read
    /// from the JSON (`…,"version":…,`), as [`Row::sheet_id`] is: every reader of it (a write's
    /// check, the feed, a conflict's body) reads the row's JSON next or already has.
    pub fn version(&self) -> u64 {
        self.number_after(1, b",\"version\":")
    }

    /// The number after the `nth` comma of the JSON, which `key` (from that comma on) names.
    /// A JSON of another shape (never rendered, only a damaged record) reads as 0.
    fn number_after(&self, nth: usize, key: &[u8]) -> u64 {
        let json = self.json.get().as_bytes();
        let Some(at) = memchr::memchr_iter(b',', json).nth(nth) else { return 0 };
        json[at..].strip_prefix(key).map_or(0, |digits| {
            digits
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .fold(0, |n: u64, b| n.wrapping_mul(10).wrapping_add(u64::from(b - b'0')))
        })
    }

    /// The parent row; deleting a row deletes its subtree.
    pub fn parent_id(&self) -> Option<RowId> {
        self.family.as_ref().and_then(|f| f.parent_id)
    }

    /// Files attached to the row.
    pub fn attachments(&self) -> &[Attachment] {
        self.family.as_ref().map_or(&[], |f| &f.attachments)
    }

    /// Sets the parent (on a row not yet shared).
    pub fn set_parent_id(&mut self, parent_id: Option<RowId>) {
        let attachments = self.family.take().map(|f| f.attachments).unwrap_or_default();
        self.family = Family::of(parent_id, attachments);
    }

    /// Sets the attachments (on a row not yet shared).
    pub fn set_attachments(&mut self, attachments: Box<[Attachment]>) {
        self.family = Family::of(self.parent_id(), attachments);
    }

    /// A new row: version 1, no parent, no attachments, created and updated `at` by `source`.
    pub fn new(
        id: RowId,
        sheet_id: SheetId,
        cells: BTreeMap<ColumnId, Json>,
        source: Source,
        at: Millis,
    ) -> Self {
        Row::at_version(id, sheet_id, 1, &cells, source, (at, at))
    }

    /// The row's next version: `cells` written by the API `now`.
    pub fn next(&self, cells: &BTreeMap<ColumnId, Json>, now: Millis) -> Self {
        Row {
            family: self.family.clone(),
            ..Row::at_version(
                self.id,
                self.sheet_id(),
                self.version() + 1,
                cells,
                SOURCE_API,
                (self.created_at, now),
            )
        }
    }

    /// A row at any version, without parent or attachments; `at` is (created, updated).
    pub fn at_version(
        id: RowId,
        sheet_id: SheetId,
        version: u64,
        cells: &BTreeMap<ColumnId, Json>,
        source: Source,
        at: (Millis, Millis),
    ) -> Self {
        let cells = cells.iter().map(|(id, cell)| (*id, &cell.0));
        Row::rendered(RowJson { id, sheet_id, version, cells, at, source })
    }

    /// A new row (as [`Row::new`]) whose cells come in ascending id order, as a coerced
    /// write's values do: rendered straight from them, without a map built and dropped for
    /// every row of a bulk write.
    pub fn from_sorted_cells<I>(
        id: RowId,
        sheet_id: SheetId,
        cells: I,
        source: Source,
        at: Millis,
    ) -> Self
    where
        I: SortedCells,
    {
        debug_assert!(cells.clone().zip(cells.clone().skip(1)).all(|(a, b)| a.0 < b.0));
        Row::rendered(RowJson { id, sheet_id, version: 1, cells, at: (at, at), source })
    }

    fn rendered<I>(view: RowJson<I>) -> Self
    where
        I: SortedCells,
    {
        Row {
            id: view.id,
            family: None,
            created_at: view.at.0,
            updated_at: view.at.1,
            json: view.render(),
        }
    }

    /// The row as the API shows it (RowV1), in the two pieces it is kept in: the stored text
    /// up to its closing brace, and the end every row of its source shares (`updatedBy` and
    /// the brace).
    pub fn json_pieces(&self) -> [&str; 2] {
        let stored = self.json.get();
        match self.source() {
            Source::Api => [&stored[..stored.len() - 1], API_TAIL],
            Source::Import => [stored, ""],
        }
    }

    /// The length of the row's JSON (RowV1).
    pub fn json_len(&self) -> usize {
        let [kept, tail] = self.json_pieces();
        kept.len() + tail.len()
    }

    /// At least [`Row::json_len`], told without reading the JSON: for sizing a buffer ahead of
    /// many rows, whose texts (cold, on a large sheet) are read only when they are copied.
    pub fn json_len_at_most(&self) -> usize {
        self.json.get().len() - 1 + API_TAIL.len()
    }

    /// Where the last write came from, as the JSON shows it: a row written through the API
    /// keeps its JSON without `updatedBy` (so its text ends with `updatedAt`'s value and the
    /// brace), a row loaded from a fixture or an import keeps it whole (`…"import"}}`).
    pub fn source(&self) -> Source {
        if self.json.get().ends_with("}}") {
            Source::Import
        } else {
            Source::Api
        }
    }

    /// Appends the row's JSON (RowV1) to `out`.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        for piece in self.json_pieces() {
            out.extend_from_slice(piece.as_bytes());
        }
    }

    /// The row's JSON (RowV1), in one piece of its own: for a response that embeds it in a
    /// serialized value.
    pub fn to_json(&self) -> Box<RawValue> {
        let mut text = String::with_capacity(self.json_len());
        text.extend(self.json_pieces());
        // Rendered by `RowJson` and completed with a constant field: always valid.
        stored_json(text).expect("a row's JSON is valid")
    }

    /// The stored text (the JSON without `updatedBy`): the bytes a reader of the row touches.
    pub fn stored_text(&self) -> &str {
        self.json.get()
    }

    /// The JSON text of the row's `cells` object.
    pub fn cells_json(&self) -> &str {
        // After `cells` the stored text holds fields whose values hold no comma (`createdAt`,
        // `updatedAt`, and `updatedBy` unless it was left out): the comma before the first of
        // them is the one after `cells`.
        let after = match self.source() {
            Source::Api => 1,
            Source::Import => 2,
        };
        let onward = self.cells_onward();
        match memchr::memrchr_iter(b',', onward.as_bytes()).nth(after) {
            Some(end) => &onward[..end],
            None => "{}",
        }
    }

    /// The row's JSON from its `cells` object on, for a parse of the cells, which stops at
    /// that object's end: found without reading the row's tail, which on a cold row of a
    /// large sheet is one cache miss fewer for every reader of a cell.
    fn cells_onward(&self) -> &str {
        let json = self.json.get();
        // Before `cells` come three numeric fields, so the third comma is the one before
        // `"cells":`. memchr's search, not a byte-by-byte filter: every reader of a cell comes
        // through here, and the scan of ~140 bytes a call was 7-9 % of an upsert's actor time.
        match memchr::memchr_iter(b',', json.as_bytes()).nth(2) {
            Some(comma) if comma + 9 <= json.len() => {
                debug_assert_eq!(&json[comma..comma + 9], ",\"cells\":");
                &json[comma + 9..]
            }
            _ => "{}",
        }
    }

    /// Every cell, parsed.
    pub fn cells(&self) -> BTreeMap<ColumnId, Json> {
        let mut cells = BTreeMap::new();
        self.visit_cells(|col, raw| {
            cells.insert(col, Json(parse(raw)));
        });
        cells
    }

    /// One cell, parsed; `None` when the row holds none in `column`.
    pub fn cell(&self, column: ColumnId) -> Option<Value> {
        self.cell_raw(column).map(parse)
    }

    /// The cells of `columns`, in that order, parsed: `null` for a column the row holds no cell
    /// in and for `None`. One pass over the row whatever the number of columns.
    pub fn project(&self, columns: &[Option<ColumnId>]) -> Vec<Value> {
        let mut out = Vec::new();
        self.project_into(columns, &mut out);
        out
    }

    /// [`Row::project`] into `out` (cleared first), so a scan reuses one buffer.
    pub fn project_into(&self, columns: &[Option<ColumnId>], out: &mut Vec<Value>) {
        out.clear();
        out.resize(columns.len(), Value::Null);
        if columns.iter().all(Option::is_none) {
            return;
        }
        let mut de = serde_json::Deserializer::from_str(self.cells_onward());
        // The JSON was rendered by `RowJson`; it cannot fail to parse.
        let parsed = Pick { columns, out: &mut *out }.deserialize(&mut de);
        debug_assert!(parsed.is_ok(), "row {}: {parsed:?}", self.id);
        for (i, col) in columns.iter().enumerate() {
            // A column asked for twice is parsed once.
            if let Some(first) = columns[..i].iter().position(|c| c.is_some() && c == col) {
                out[i] = out[first].clone();
            }
        }
    }

    /// The row's next version with `writes` merged into its cells, written by the API `now`:
    /// a write's `Some` sets its cell, `None` clears it, the row's other cells stay. `writes`
    /// come in ascending column order, as coerced writes do; of two writes to one cell the
    /// later wins. `None` when the writes change nothing (every set cell already holds an equal
    /// value, every cleared one is absent).
    ///
    /// The cells the writes leave alone are copied as stored, never parsed: an update of one
    /// cell of a ten-cell row parses one cell, not ten twice.
    pub fn merged(&self, writes: &[(ColumnId, Option<&Value>)], now: Millis) -> Option<Row> {
        let (cells, changed) = self.merge_cells(writes);
        changed.then(|| self.next_from(cells.iter().copied(), now))
    }

    /// [`Row::merged`], as a new version also when the writes change nothing (a patch always
    /// makes one).
    pub fn patched(&self, writes: &[(ColumnId, Option<&Value>)], now: Millis) -> Row {
        let (cells, _) = self.merge_cells(writes);
        self.next_from(cells.iter().copied(), now)
    }

    /// The merge of [`Row::merged`]: the cells in ascending column order, and whether any
    /// differs from the row's.
    fn merge_cells<'a>(
        &'a self,
        writes: &'a [(ColumnId, Option<&'a Value>)],
    ) -> (Vec<(ColumnId, CellRef<'a>)>, bool) {
        let mut stored: Vec<(ColumnId, &RawValue)> = Vec::with_capacity(16);
        self.visit_cells(|col, raw| stored.push((col, raw)));
        // The JSON lists cells in the order of their decimal text.
        stored.sort_unstable_by_key(|(col, _)| *col);
        let mut cells = Vec::with_capacity(stored.len() + writes.len());
        let mut changed = false;
        let (mut stored, mut writes) = (stored.into_iter().peekable(), writes.iter().peekable());
        loop {
            match (stored.peek().copied(), writes.peek().copied()) {
                (None, None) => break,
                (Some((col, raw)), next) if next.is_none_or(|(w, _)| col < *w) => {
                    stored.next();
                    cells.push((col, CellRef::Raw(raw)));
                }
                (before, Some(&(col, value))) => {
                    writes.next();
                    if writes.peek().is_some_and(|(later, _)| *later == col) {
                        continue;
                    }
                    let before = match before {
                        Some((c, raw)) if c == col => {
                            stored.next();
                            Some(raw)
                        }
                        _ => None,
                    };
                    match value {
                        Some(value) => {
                            changed = changed || before.is_none_or(|raw| parse(raw) != *value);
                            cells.push((col, CellRef::Value(value)));
                        }
                        None => changed = changed || before.is_some(),
                    }
                }
                (Some(_), None) => unreachable!("taken by the arm above"),
            }
        }
        (cells, changed)
    }

    /// The row's next version with these cells, written by the API `now`.
    fn next_from<I: SortedCells>(&self, cells: I, now: Millis) -> Row {
        Row {
            family: self.family.clone(),
            ..Row::rendered(RowJson {
                id: self.id,
                sheet_id: self.sheet_id(),
                version: self.version() + 1,
                cells,
                at: (self.created_at, now),
                source: SOURCE_API,
            })
        }
    }

    /// One cell's JSON as stored; `None` when the row holds none in `column`.
    pub fn cell_raw(&self, column: ColumnId) -> Option<&RawValue> {
        let onward = self.cells_onward();
        match scan_cells(onward, column) {
            Scanned::Found(raw) => Some(raw),
            Scanned::Absent => None,
            Scanned::Unexpected => {
                let mut de = serde_json::Deserializer::from_str(onward);
                let mut find = FindCell { column, found: None };
                // Stops at the cell, so the rest of the row is never parsed; the deserializer
                // then finds the object unfinished, which is no error here.
                let _ = (&mut find).deserialize(&mut de);
                find.found
            }
        }
    }

    /// Whether the row's cells equal `cells` (what [`Row::merged`] decides, cell by cell).
    #[cfg(test)]
    pub fn cells_equal(&self, cells: &BTreeMap<ColumnId, Json>) -> bool {
        let mut n = 0;
        let mut equal = true;
        self.visit_cells(|col, raw| {
            n += 1;
            equal = equal && cells.get(&col).is_some_and(|c| c.0 == parse(raw));
        });
        equal && n == cells.len()
    }

    /// The row's JSON with only the cells of `fields`, written to `out` (listRows' and
    /// exportRows' `fields`).
    pub fn write_json_fields(&self, out: &mut Vec<u8>, fields: &BTreeSet<ColumnId>) {
        let [json, tail] = self.json_pieces();
        let cells = self.cells_json();
        // `cells` is a slice of `json`: what comes before and after it is kept as is.
        let start = cells.as_ptr() as usize - json.as_ptr() as usize;
        out.extend_from_slice(&json.as_bytes()[..start]);
        out.push(b'{');
        let mut first = true;
        self.visit_cells(|col, raw| {
            if fields.contains(&col) {
                if !first {
                    out.push(b',');
                }
                first = false;
                out.push(b'"');
                out.extend_from_slice(col.to_string().as_bytes());
                out.extend_from_slice(b"\":");
                out.extend_from_slice(raw.get().as_bytes());
            }
        });
        out.push(b'}');
        out.extend_from_slice(&json.as_bytes()[start + cells.len()..]);
        out.extend_from_slice(tail.as_bytes());
    }

    /// Calls `f` with every cell's column and JSON, in the order the JSON lists them.
    fn visit_cells<'a>(&'a self, f: impl FnMut(ColumnId, &'a RawValue)) {
        let mut de = serde_json::Deserializer::from_str(self.cells_onward());
        // The JSON was rendered by `RowJson`; it cannot fail to parse.
        let parsed = VisitCells(f).deserialize(&mut de);
        debug_assert!(parsed.is_ok(), "row {}: {parsed:?}", self.id);
    }
}

/// A cell's stored value from its JSON (rendered by this module, so always valid).
fn parse(raw: &RawValue) -> Value {
    serde_json::from_str(raw.get()).unwrap_or(Value::Null)
}

/// Parses the cells of `columns` out of a cells object into `out` (at each column's first
/// position), skipping the others without building them.
struct Pick<'c, 'o> {
    columns: &'c [Option<ColumnId>],
    out: &'o mut Vec<Value>,
}

impl<'de> DeserializeSeed<'de> for Pick<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Pick<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a row's cells")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<&'de str>()? {
            let col = key.parse::<ColumnId>().ok();
            match self.columns.iter().position(|c| c.is_some() && *c == col) {
                Some(i) => self.out[i] = map.next_value()?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// Finds one column's cell in a cells object, reading no further than it.
/// What [`scan_cells`] found.
enum Scanned<'a> {
    Found(&'a RawValue),
    Absent,
    /// Not the compact layout `RowJson` writes: the caller parses the object instead.
    Unexpected,
}

/// One cell of a cells object as `RowJson` writes it, `{"<column id>":<value>,...}` with no
/// whitespace, read key by key: only the values before the cell are parsed (each skipped as
/// one raw value), and the scan stops at the cell. [`FindCell`] does the same through serde,
/// but stopping inside the object makes serde_json build an error, whose position it finds by
/// counting the lines before it: most of a key index's upkeep on an upsert's rows.
fn scan_cells(cells: &str, column: ColumnId) -> Scanned<'_> {
    let bytes = cells.as_bytes();
    if bytes.first() != Some(&b'{') {
        return Scanned::Unexpected;
    }
    if bytes.get(1) == Some(&b'}') {
        return Scanned::Absent;
    }
    let mut at = 1;
    loop {
        // `"<digits>":`
        let digits = match bytes.get(at) {
            Some(b'"') => bytes[at + 1..].iter().take_while(|b| b.is_ascii_digit()).count(),
            _ => return Scanned::Unexpected,
        };
        let key_end = at + 1 + digits;
        if digits == 0 || bytes.get(key_end..key_end + 2) != Some(&b"\":"[..]) {
            return Scanned::Unexpected;
        }
        let key = cells[at + 1..key_end].parse::<ColumnId>();
        let value_at = key_end + 2;
        let mut de = serde_json::Deserializer::from_str(&cells[value_at..]);
        let Ok(raw) = <&RawValue>::deserialize(&mut de) else {
            return Scanned::Unexpected;
        };
        if key == Ok(column) {
            return Scanned::Found(raw);
        }
        // Where the value ends, found from the slice itself (a raw value is a slice of its input).
        at = raw.get().as_ptr() as usize - cells.as_ptr() as usize + raw.get().len();
        match bytes.get(at) {
            Some(b',') => at += 1,
            Some(b'}') => return Scanned::Absent,
            _ => return Scanned::Unexpected,
        }
    }
}

struct FindCell<'de> {
    column: ColumnId,
    found: Option<&'de RawValue>,
}

impl<'de> DeserializeSeed<'de> for &mut FindCell<'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for &mut FindCell<'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a row's cells")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<&'de str>()? {
            match key.parse::<ColumnId>() {
                Ok(col) if col == self.column => {
                    self.found = Some(map.next_value::<&'de RawValue>()?);
                    return Ok(());
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// Walks a cells object, handing each cell's raw JSON to the closure without parsing it.
struct VisitCells<F>(F);

impl<'de, F: FnMut(ColumnId, &'de RawValue)> DeserializeSeed<'de> for VisitCells<F> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, F: FnMut(ColumnId, &'de RawValue)> Visitor<'de> for VisitCells<F> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a row's cells")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<&'de str>()? {
            match key.parse::<ColumnId>() {
                Ok(col) => (self.0)(col, map.next_value::<&'de RawValue>()?),
                Err(_) => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// A row's cells in ascending id order, walked as often as rendering needs (a map's, the
/// values a coerced write sets, or a merge of a stored row's cells with a write's).
pub trait SortedCells: DoubleEndedIterator<Item = (ColumnId, Self::Cell)> + Clone {
    /// A cell as rendering takes it: a value, or a cell's JSON as stored.
    type Cell: Serialize;
}

impl<C: Serialize, I: DoubleEndedIterator<Item = (ColumnId, C)> + Clone> SortedCells for I {
    type Cell = C;
}

/// A cell of a row being rendered: a value a write sets, or a cell of the row before kept as
/// its stored JSON (copied, never parsed and written again).
#[derive(Clone, Copy, Debug)]
enum CellRef<'v> {
    Value(&'v Value),
    Raw(&'v RawValue),
}

impl Serialize for CellRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            CellRef::Value(value) => value.serialize(s),
            CellRef::Raw(raw) => raw.serialize(s),
        }
    }
}

/// RowV1 by reference: the one renderer of a row's JSON. `cells` iterates the cells in
/// ascending id order.
struct RowJson<I> {
    id: RowId,
    sheet_id: SheetId,
    version: u64,
    cells: I,
    at: (Millis, Millis),
    source: Source,
}

impl<I> RowJson<I>
where
    I: SortedCells,
{
    fn render(&self) -> Box<RawValue> {
        // Serializing numbers, strings and JSON values cannot fail.
        serde_json::value::to_raw_value(self).expect("a row renders")
    }
}

impl<I> Serialize for RowJson<I>
where
    I: SortedCells,
{
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        #[derive(Serialize)]
        struct UpdatedBy {
            source: &'static str,
        }
        // Without `updatedBy` when it is the API's: see [`API_TAIL`].
        let mut row = s.serialize_struct("RowV1", 7)?;
        row.serialize_field("id", &self.id)?;
        row.serialize_field("sheetId", &self.sheet_id)?;
        row.serialize_field("version", &self.version)?;
        row.serialize_field("cells", &DecimalOrder(self.cells.clone()))?;
        with_timestamp(CREATED, self.at.0, |t| row.serialize_field("createdAt", t))?;
        with_timestamp(UPDATED, self.at.1, |t| row.serialize_field("updatedAt", t))?;
        if self.source != Source::Api {
            row.serialize_field("updatedBy", &UpdatedBy { source: self.source.as_str() })?;
        }
        row.end()
    }
}

/// The end of the JSON of a row written through the API, which its stored text leaves out:
/// `updatedBy` (the same in every such row) and the closing brace. A row's source is then told
/// by whether its text ends with this field ([`Row::source`]).
const API_TAIL: &str = ",\"updatedBy\":{\"source\":\"api\"}}";

/// The end of the JSON of a row loaded from a fixture or an import, which its text keeps.
const IMPORT_TAIL: &str = ",\"updatedBy\":{\"source\":\"import\"}}";

/// [`with_timestamp`]'s entry for `createdAt`.
const CREATED: usize = 0;
/// [`with_timestamp`]'s entry for `updatedAt`.
const UPDATED: usize = 1;

/// Calls `f` with [`timestamp`] of `ms`, formatted once for as long as a thread renders the
/// same instant in the same field: a bulk add shows one instant twice in each of its rows, and
/// the updates of a write share their `updatedAt` while each keeps its own `createdAt`, so each
/// field remembers its own last instant.
fn with_timestamp<R>(field: usize, ms: Millis, f: impl FnOnce(&Option<String>) -> R) -> R {
    thread_local! {
        static LAST: std::cell::RefCell<[(Millis, Option<String>); 2]> =
            const { std::cell::RefCell::new([(Millis::MIN, None), (Millis::MIN, None)]) };
    }
    LAST.with_borrow_mut(|last| {
        let last = &mut last[field];
        // `timestamp(Millis::MIN)` is out of range, so the initial entry is right for it too.
        if last.0 != ms {
            *last = (ms, timestamp(ms));
        }
        f(&last.1)
    })
}

/// Cells keyed in the order of their decimal text (`"100"` before `"2"`), as a JSON object
/// of string keys orders them.
/// The cells come in ascending id order.
struct DecimalOrder<I>(I);

impl<I> Serialize for DecimalOrder<I>
where
    I: SortedCells,
{
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // serde_json writes integer map keys as strings: `{"100": ...}`.
        let digits = |n: u64| n.checked_ilog10();
        let (first, last) = (self.0.clone().next(), self.0.clone().next_back());
        if first.zip(last).is_none_or(|((a, _), (b, _))| digits(a) == digits(b)) {
            // Ids of one length (a sheet's columns usually are) sort as text as they sort as
            // numbers: no list to build and sort for every row rendered.
            return s.collect_map(self.0.clone());
        }
        let mut cells: Vec<_> = self.0.clone().collect();
        cells.sort_by(|(a, _), (b, _)| decimal_order(*a, *b));
        s.collect_map(cells)
    }
}

/// The order of `a` and `b` written in decimal and compared as text.
pub fn decimal_order(a: u64, b: u64) -> std::cmp::Ordering {
    let digits = |n: u64| n.checked_ilog10().map_or(1, |d| d + 1);
    let (da, db) = (digits(a), digits(b));
    // Compare the leading digits both have; on a tie the shorter text comes first.
    let (ta, tb) = if da > db { (a / 10u64.pow(da - db), b) } else { (a, b / 10u64.pow(db - da)) };
    ta.cmp(&tb).then(da.cmp(&db))
}

impl PartialEq for Row {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
            && self.family == other.family
            && self.created_at == other.created_at
            && self.updated_at == other.updated_at
            && self.json.get() == other.json.get()
    }
}

/// With `Eq`, an `Arc<Row>` compares by pointer first, so comparing two versions of a sheet's
/// persistent row map (the report column cache's catch-up, `OrdMap::diff`) costs a pointer test
/// per shared row.
impl Eq for Row {}

/// A row as the log and checkpoints store it since codec format 3: its fields and its JSON.
#[derive(Serialize)]
struct Stored<'a> {
    id: RowId,
    sheet_id: SheetId,
    parent_id: Option<RowId>,
    version: u64,
    attachments: &'a [Attachment],
    created_at: Millis,
    updated_at: Millis,
    source: Source,
    json: &'a str,
}

/// [`Stored`], decoding.
#[derive(Deserialize)]
struct StoredOwned {
    id: RowId,
    sheet_id: SheetId,
    parent_id: Option<RowId>,
    version: u64,
    attachments: Vec<Attachment>,
    created_at: Millis,
    updated_at: Millis,
    source: Source,
    json: String,
}

/// A row as formats 1 and 2 stored it: parsed cells, and `source` as text.
#[derive(Deserialize)]
struct StoredV2 {
    id: RowId,
    sheet_id: SheetId,
    parent_id: Option<RowId>,
    version: u64,
    cells: BTreeMap<ColumnId, Json>,
    attachments: Vec<Attachment>,
    created_at: Millis,
    updated_at: Millis,
    source: String,
}

impl Row {
    /// The row as records and checkpoints store it, `json` being its whole JSON.
    fn stored<'a>(&'a self, json: &'a str) -> Stored<'a> {
        Stored {
            id: self.id,
            sheet_id: self.sheet_id(),
            parent_id: self.parent_id(),
            version: self.version(),
            attachments: self.attachments(),
            created_at: self.created_at,
            updated_at: self.updated_at,
            source: self.source(),
            json,
        }
    }
}

impl Serialize for Row {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // The whole JSON, as records and checkpoints have always held it, put together in a
        // buffer the thread keeps: a checkpoint writes a million rows.
        thread_local! {
            static WHOLE: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
        }
        WHOLE.with(|whole| match whole.try_borrow_mut() {
            Ok(mut whole) => {
                whole.clear();
                whole.extend(self.json_pieces());
                self.stored(&whole).serialize(s)
            }
            Err(_) => self.stored(&self.json_pieces().concat()).serialize(s),
        })
    }
}

impl<'de> Deserialize<'de> for Row {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if !d.is_human_readable() && wal::codec::decoding_version() < 3 {
            let old = StoredV2::deserialize(d)?;
            let source =
                if old.source == Source::Import.as_str() { SOURCE_IMPORT } else { SOURCE_API };
            let at = (old.created_at, old.updated_at);
            return Ok(Row {
                family: Family::of(old.parent_id, old.attachments.into_boxed_slice()),
                ..Row::at_version(old.id, old.sheet_id, old.version, &old.cells, source, at)
            });
        }
        // A row written through the API is kept without the end every such row shares (see
        // `API_TAIL`). The text is taken as it is: it was rendered by `RowJson` and comes back
        // from a log record or a checkpoint whose CRC matched, so a start does not parse a
        // million rows again.
        let mut stored = StoredOwned::deserialize(d)?;
        let ends = match stored.source {
            Source::Api => API_TAIL,
            Source::Import => IMPORT_TAIL,
        };
        if !stored.json.ends_with(ends) {
            return Err(serde::de::Error::custom(format!(
                "row {} is stored with JSON that does not end with its updatedBy",
                stored.id
            )));
        }
        if stored.source == Source::Api {
            stored.json.truncate(stored.json.len() - API_TAIL.len());
            stored.json.push('}');
        }
        let row = Row {
            id: stored.id,
            family: Family::of(stored.parent_id, stored.attachments.into_boxed_slice()),
            created_at: stored.created_at,
            updated_at: stored.updated_at,
            json: stored_json(stored.json).map_err(serde::de::Error::custom)?,
        };
        // The sheet and the version are read from the JSON from now on: a row whose JSON
        // names others than its record is damaged.
        if (row.sheet_id(), row.version()) != (stored.sheet_id, stored.version) {
            return Err(serde::de::Error::custom(format!(
                "row {} is stored for sheet {} at version {} but its JSON names sheet {} at \
                 version {}",
                row.id,
                stored.sheet_id,
                stored.version,
                row.sheet_id(),
                row.version()
            )));
        }
        Ok(row)
    }
}

/// A row's JSON as a [`RawValue`] of its own, taken as it is: it was rendered by [`RowJson`],
/// and comes back from a log record or a checkpoint whose CRC matched (a start does not parse
/// a million rows again) or from [`Row::json_pieces`] (a response embedding many rows does not
/// parse them again). serde_json has no public way to wrap text as a [`RawValue`] unchecked, but its
/// `Deserialize` for `Box<RawValue>` does that with a string handed to it as a one-entry map:
/// [`Wrap`] hands it one. Should a serde_json release change how it asks, a probe on first use
/// notices and every row is checked by [`RawValue::from_string`] instead.
fn stored_json(text: String) -> Result<Box<RawValue>, serde_json::Error> {
    static WRAPS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let wraps = WRAPS.get_or_init(|| {
        let probe = "{\"probe\":[1,\"x\"]}";
        Box::<RawValue>::deserialize(Wrap(probe.to_owned())).is_ok_and(|raw| raw.get() == probe)
    });
    if *wraps {
        Box::<RawValue>::deserialize(Wrap(text))
    } else {
        RawValue::from_string(text)
    }
}

/// A deserializer that gives a `Box<RawValue>` its text: asked for the newtype that
/// `RawValue` is, it answers with the map `{name: text}` serde_json's visitor takes.
struct Wrap(String);

impl<'de> Deserializer<'de> for Wrap {
    type Error = serde_json::Error;

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_map(serde::de::value::MapDeserializer::new(std::iter::once((name, self.0))))
    }

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
        Err(serde::de::Error::custom("a stored row's JSON is read only as a raw value"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct seq tuple tuple_struct map struct enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use wal::codec;

    use super::*;

    fn sample() -> Row {
        let cells: BTreeMap<u64, Json> = [
            (100, json!("text \"quoted\" é ,\"createdAt\":")),
            (102, json!({"value": 1.5, "format": "0.0", "createdAt": 1})),
            (103, json!(true)),
            (107, json!(["a", "c"])),
            (2, json!(0.1)),
            (5, json!(null)),
        ]
        .into_iter()
        .map(|(k, v)| (k, Json(v)))
        .collect();
        Row::new(7, 10, cells, SOURCE_API, 1_767_225_600_123)
    }

    #[test]
    fn a_cells_object_in_another_layout_is_parsed_instead_of_scanned() {
        let spaced = r#"{ "100": "a", "7" : [1, 2] }"#;
        assert!(matches!(scan_cells(spaced, 7), Scanned::Unexpected));
        assert!(matches!(scan_cells(r#"{"x":1,"7":2}"#, 7), Scanned::Unexpected));
        assert!(
            matches!(scan_cells(r#"{"100":"a","7":[1,2]}"#, 7), Scanned::Found(raw) if raw.get() == "[1,2]")
        );
        assert!(matches!(scan_cells(r#"{"100":"a"}"#, 7), Scanned::Absent));
        assert!(matches!(scan_cells("{}", 7), Scanned::Absent));
    }

    #[test]
    fn cells_read_back_exactly_as_written_whatever_their_text_holds() {
        let row = sample();
        let cells = row.cells();
        assert_eq!(cells.len(), 6);
        assert_eq!(cells[&100].0, json!("text \"quoted\" é ,\"createdAt\":"));
        assert_eq!(cells[&2].0, json!(0.1));
        assert!(row.cells_equal(&cells));
        assert_eq!(row.cell(102), Some(json!({"value": 1.5, "format": "0.0", "createdAt": 1})));
        assert_eq!(row.cell(5), Some(Value::Null));
        assert_eq!(row.cell(6), None);
        // Every cell, first to last in the JSON, read alone as the whole map has it.
        for (col, value) in &cells {
            assert_eq!(row.cell(*col).as_ref(), Some(&value.0), "column {col}");
        }
        assert_eq!(
            row.project(&[Some(103), None, Some(9), Some(103)]),
            vec![json!(true), Value::Null, Value::Null, json!(true)]
        );
        let mut fewer = cells.clone();
        fewer.remove(&5);
        assert!(!row.cells_equal(&fewer));
        let next = row.next(&fewer, 1_767_225_601_000);
        assert_eq!(
            (next.version(), next.created_at, next.source()),
            (2, row.created_at, SOURCE_API)
        );
        assert_eq!(next.cells(), fewer);
    }

    #[test]
    fn fields_keep_the_rest_of_the_json_unchanged() {
        let row = sample();
        let mut out = Vec::new();
        row.write_json_fields(&mut out, &BTreeSet::from([2, 107, 999]));
        let full: Value = serde_json::from_str(row.to_json().get()).unwrap();
        let mut expected = full.clone();
        expected["cells"] = json!({"2": 0.1, "107": ["a", "c"]});
        assert_eq!(serde_json::from_slice::<Value>(&out).unwrap(), expected);
        out.clear();
        row.write_json_fields(&mut out, &BTreeSet::new());
        expected["cells"] = json!({});
        assert_eq!(serde_json::from_slice::<Value>(&out).unwrap(), expected);
    }

    #[test]
    fn a_shared_row_fits_a_64_byte_allocation() {
        // A million rows are a million of these beside their JSON: jemalloc's size classes
        // around here are 64, 80, 96 and 112 bytes, and `Arc` adds two counters.
        assert!(std::mem::size_of::<Row>() + 16 <= 64, "{}", std::mem::size_of::<Row>());
    }

    #[test]
    fn the_sheet_is_read_from_the_json_and_a_stored_row_naming_another_is_refused() {
        for sheet in [0, 7, 1_000_000_007, u64::MAX] {
            let row = Row::new(12, sheet, BTreeMap::new(), SOURCE_API, 0);
            assert_eq!(row.sheet_id(), sheet);
            assert_eq!(row.next(&BTreeMap::new(), 5).sheet_id(), sheet);
        }
        let row = sample();
        let whole = row.json_pieces().concat();
        let stored = |sheet_id| Stored {
            id: row.id,
            sheet_id,
            parent_id: None,
            version: row.version(),
            attachments: &[],
            created_at: row.created_at,
            updated_at: row.updated_at,
            source: row.source(),
            json: &whole,
        };
        let good = codec::encode(&stored(row.sheet_id())).unwrap();
        assert_eq!(codec::decode::<Row>(&good).unwrap(), row);
        let bad = codec::encode(&stored(row.sheet_id() + 1)).unwrap();
        let err = codec::decode::<Row>(&bad).unwrap_err();
        assert!(format!("{err:?}").contains("its JSON names sheet"), "{err:?}");
    }

    #[test]
    fn a_row_round_trips_through_the_codec_and_format_2_rows_still_decode() {
        let mut row = sample();
        row.set_parent_id(Some(3));
        row.set_attachments(Box::new([Attachment { name: "f".into(), bytes: 9 }]));
        let bytes = codec::encode(&row).unwrap();
        assert_eq!(codec::decode::<Row>(&bytes).unwrap(), row);

        /// The layout of formats 1 and 2.
        #[derive(Serialize)]
        struct V2 {
            id: RowId,
            sheet_id: SheetId,
            parent_id: Option<RowId>,
            version: u64,
            cells: BTreeMap<ColumnId, Json>,
            attachments: Vec<Attachment>,
            created_at: Millis,
            updated_at: Millis,
            source: String,
        }
        let old = V2 {
            id: row.id,
            sheet_id: row.sheet_id(),
            parent_id: row.parent_id(),
            version: row.version(),
            cells: row.cells(),
            attachments: row.attachments().to_vec(),
            created_at: row.created_at,
            updated_at: row.updated_at,
            source: "api".into(),
        };
        let mut bytes = codec::encode(&old).unwrap();
        bytes[0] = 2;
        assert_eq!(codec::decode::<Row>(&bytes).unwrap(), row);
    }

    /// A row keeps its JSON without `updatedBy`, but shows it whole, and records and
    /// checkpoints hold it whole, as before: a row stored without it (or with another source's)
    /// is refused.
    #[test]
    fn a_row_is_kept_without_its_updated_by_and_shown_and_stored_with_it() {
        for source in [SOURCE_API, SOURCE_IMPORT] {
            let row = Row::new(7, 10, sample().cells(), source, 1_767_225_600_123);
            let whole = row.to_json().get().to_owned();
            let tail = format!(",\"updatedBy\":{{\"source\":\"{}\"}}}}", source.as_str());
            assert!(whole.ends_with(&tail), "{whole}");
            // Only the API's rows leave it out; the source is read from that.
            let kept = row.stored_text().contains("updatedBy");
            assert_eq!(kept, source == SOURCE_IMPORT, "{}", row.stored_text());
            assert_eq!(row.source(), source);
            assert_eq!(row.json_len(), whole.len());
            assert!(row.json_len_at_most() >= whole.len());
            let mut written = Vec::new();
            row.write_json(&mut written);
            assert_eq!(written, whole.as_bytes());
            let shown: Value = serde_json::from_str(&whole).unwrap();
            assert_eq!(shown["updatedBy"]["source"], source.as_str());
            assert_eq!(shown["cells"], serde_json::from_str::<Value>(row.cells_json()).unwrap());
            let bytes = codec::encode(&row).unwrap();
            assert!(bytes.windows(tail.len()).any(|w| w == tail.as_bytes()));
            assert_eq!(codec::decode::<Row>(&bytes).unwrap(), row);
        }
        let row = sample();
        let refused = |json: &str| {
            let stored = row.stored(json);
            let err = codec::decode::<Row>(&codec::encode(&stored).unwrap()).unwrap_err();
            assert!(format!("{err:?}").contains("updatedBy"), "{err:?}");
        };
        refused(&row.to_json().get().replace("\"api\"", "\"import\""));
        refused(&format!("{}}}", &row.stored_text()[..row.stored_text().len() - 1]));
    }

    #[test]
    fn stored_json_is_taken_as_it_is() {
        // Not JSON at all: only a wrap that skips the parse accepts it. Should serde_json stop
        // taking the wrap, rows are parsed again (correct, but slow) and this fails.
        let raw = stored_json("not json, {".to_owned()).expect("taken unchecked");
        assert_eq!(raw.get(), "not json, {");
        let row = sample();
        let raw = stored_json(row.to_json().get().to_owned()).unwrap();
        assert_eq!(raw.get(), row.to_json().get());
    }

    #[test]
    fn rows_rendered_one_after_another_show_their_own_instants() {
        // The renderer remembers the last instant it formatted on this thread: rows of
        // different instants, in turn and mixed, must each show their own.
        let cells = BTreeMap::from([(1, Json(json!("a")))]);
        let at = |ms: i64| Row::at_version(1, 1, 1, &cells, SOURCE_API, (ms, ms + 1000));
        for ms in [1_767_225_600_000, 1_767_225_600_000, 1_767_225_601_000, 0, 1_767_225_600_000] {
            let row: Value = serde_json::from_str(at(ms).to_json().get()).unwrap();
            assert_eq!(row["createdAt"], json!(timestamp(ms)), "{ms}");
            assert_eq!(row["updatedAt"], json!(timestamp(ms + 1000)), "{ms}");
        }
        // Updates at one instant of rows created at others, and an instant seen first in the
        // other field.
        for created in [5_000, 6_000, 1_767_225_601_000, 5_000] {
            let now = 1_767_225_601_000;
            let row = Row::at_version(1, 1, 2, &cells, SOURCE_API, (created, now));
            let row: Value = serde_json::from_str(row.to_json().get()).unwrap();
            assert_eq!(row["createdAt"], json!(timestamp(created)), "{created}");
            assert_eq!(row["updatedAt"], json!(timestamp(now)), "{created}");
        }
        let out_of_range = Row::at_version(1, 1, 1, &cells, SOURCE_API, (i64::MAX, i64::MIN));
        let row: Value = serde_json::from_str(out_of_range.to_json().get()).unwrap();
        assert_eq!((&row["createdAt"], &row["updatedAt"]), (&Value::Null, &Value::Null));
    }

    #[test]
    fn a_row_from_sorted_cells_is_the_row_from_their_map() {
        let sample = sample();
        let cells = sample.cells();
        let from_map = Row::new(7, 10, cells.clone(), SOURCE_API, 1_767_225_600_123);
        let sorted = cells.iter().map(|(id, cell)| (*id, &cell.0));
        let from_sorted = Row::from_sorted_cells(7, 10, sorted, SOURCE_API, 1_767_225_600_123);
        assert_eq!(from_sorted, from_map);
        assert_eq!(from_sorted.to_json().get(), from_map.to_json().get());
        let same_length: BTreeMap<u64, Json> =
            [(100, Json(json!("a"))), (105, Json(json!(2))), (999, Json(json!(null)))].into();
        let sorted = same_length.iter().map(|(id, cell)| (*id, &cell.0));
        assert_eq!(
            Row::from_sorted_cells(1, 1, sorted, SOURCE_IMPORT, 5).to_json().get(),
            Row::new(1, 1, same_length.clone(), SOURCE_IMPORT, 5).to_json().get()
        );
    }

    #[test]
    fn cells_render_in_the_order_of_their_keys_as_text() {
        let keys = |ids: &[u64]| {
            let cells: BTreeMap<u64, Json> = ids.iter().map(|id| (*id, Json(json!(1)))).collect();
            let json = Row::new(1, 1, cells, SOURCE_API, 0).cells_json().to_owned();
            json.split(':')
                .filter_map(|part| part.rsplit('"').nth(1).map(str::to_owned))
                .collect::<Vec<_>>()
        };
        // One length: the numbers' order is the text's.
        assert_eq!(keys(&[999, 100, 101]), ["100", "101", "999"]);
        assert_eq!(keys(&[7]), ["7"]);
        assert_eq!(keys(&[]), Vec::<String>::new());
        // Mixed lengths, and 0 (whose length the logarithm does not give): sorted as text.
        assert_eq!(keys(&[2, 100, 30, 1000]), ["100", "1000", "2", "30"]);
        assert_eq!(keys(&[0, 5, 10]), ["0", "10", "5"]);
    }

    #[test]
    fn decimal_order_is_the_order_of_the_numbers_as_text() {
        let mut ids = vec![2u64, 100, 10, 1, 0, 21, 3, 1000, 99, u64::MAX, 101, 11];
        let mut as_text: Vec<String> = ids.iter().map(u64::to_string).collect();
        as_text.sort();
        ids.sort_by(|a, b| decimal_order(*a, *b));
        assert_eq!(ids.iter().map(u64::to_string).collect::<Vec<_>>(), as_text);
    }

    /// A cell value of a few shapes a stored cell takes.
    fn value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        prop_oneof![
            Just(json!(null)),
            (0..4i64).prop_map(|n| json!(n)),
            (0..4i64).prop_map(|n| json!(n as f64 + 0.5)),
            Just(json!(2.0)),
            "[a-c,\"é]{0,3}".prop_map(|s| json!(s)),
            Just(json!(["a", "c"])),
            (0..3i64).prop_map(|n| json!({"value": n, "format": "0"})),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 512, failure_persistence: None, ..Default::default() })]

        /// A cell read by scanning the stored cells is the cell the whole object parsed holds,
        /// for every column held and some not held, whatever the values before it hold.
        #[test]
        fn a_scanned_cell_is_the_parsed_cell(
            stored in proptest::collection::btree_map(
                proptest::sample::select(vec![0u64, 2, 5, 10, 100, 101, 107, 1000]), value(), 0..8),
        ) {
            let cells: BTreeMap<u64, Json> = stored.into_iter().map(|(k, v)| (k, Json(v))).collect();
            let row = Row::new(7, 10, cells.clone(), SOURCE_API, 1_767_225_600_123);
            for column in [0u64, 1, 2, 5, 9, 10, 100, 101, 107, 999, 1000, 1001] {
                let scanned = match scan_cells(row.cells_onward(), column) {
                    Scanned::Found(raw) => Some(parse(raw)),
                    Scanned::Absent => None,
                    Scanned::Unexpected => panic!("RowJson's own layout refused"),
                };
                proptest::prop_assert_eq!(scanned, cells.get(&column).map(|c| c.0.clone()));
            }
        }

        /// A merge that copies untouched cells as stored gives the row that parsing every cell,
        /// writing the map and rendering it again gives, and says "changed" exactly when the
        /// cells differ; with ids of mixed lengths (the JSON lists them as text sorts) and a
        /// cell written twice (the later wins).
        #[test]
        fn a_merge_equals_writing_the_parsed_cells(
            stored in proptest::collection::btree_map(
                proptest::sample::select(vec![0u64, 2, 5, 10, 100, 101, 107, 1000]), value(), 0..8),
            mut writes in proptest::collection::vec(
                (proptest::sample::select(vec![0u64, 2, 5, 9, 100, 101, 1000, 1001]),
                 proptest::option::of(value())), 0..6),
        ) {
            let cells: BTreeMap<u64, Json> = stored.into_iter().map(|(k, v)| (k, Json(v))).collect();
            let mut row = Row::new(7, 10, cells, SOURCE_IMPORT, 1_767_225_600_123);
            row.set_parent_id(Some(3));
            writes.sort_by_key(|(col, _)| *col);
            let mut expected = row.cells();
            for (col, write) in &writes {
                match write {
                    Some(v) => expected.insert(*col, Json(v.clone())),
                    None => expected.remove(col),
                };
            }
            let by_ref: Vec<(u64, Option<&Value>)> = writes.iter().map(|(c, w)| (*c, w.as_ref())).collect();
            let now = 1_767_225_601_000;
            let reference = row.next(&expected, now);
            let patched = row.patched(&by_ref, now);
            proptest::prop_assert_eq!(patched.to_json().get().to_owned(), reference.to_json().get().to_owned());
            proptest::prop_assert_eq!(patched.parent_id(), Some(3));
            proptest::prop_assert_eq!(patched.version(), 2);
            match row.merged(&by_ref, now) {
                None => proptest::prop_assert!(row.cells_equal(&expected)),
                Some(merged) => {
                    proptest::prop_assert!(!row.cells_equal(&expected));
                    proptest::prop_assert_eq!(merged.to_json().get().to_owned(), reference.to_json().get().to_owned());
                }
            }
        }
    }
}
