//! One sheet's columns and rows, and every rule of a row write: coercion, versions, capacity,
//! subtree delete. Plain methods with no actor or log in sight, so they are tested directly.
//!
//! Every write method first decides, then goes through [`SheetState::apply`], the same function
//! recovery uses to replay a [`SheetWrite`]: there is one way a row changes.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::Arc;

use imbl::{OrdMap, OrdSet};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::changes::ChangeLog;
use super::keys::{Ids, KeyIndex, KeyValue, KEY_COLUMN_TYPES};
use crate::coerce::{
    apply_writes, coerce_cells, coerce_owned_cells, parse_column_key, set_values, CellKey,
    CellWrite, CoerceError,
};
use crate::error::{Error, Result};
use crate::log::Lsn;
use crate::model::{Column, ColumnId, Millis, Row, RowId, SheetId, SOURCE_API};
use crate::record::SheetWrite;
use crate::shared::RowIds;

/// One item of a bulk update.
#[derive(Clone, Debug)]
pub struct UpdateItem {
    /// The row.
    pub id: RowId,
    /// The version the client last read.
    pub version: u64,
    /// The new cells: they replace the row's cells whole.
    pub cells: Map<String, Value>,
    /// Advisory snapshot the client based its change on (only classifies a conflict).
    pub base_cells: Option<Map<String, Value>>,
}

/// A write's precondition on one row's current version (HTTP `If-Match`), decided by the
/// sheet's actor in mailbox order, like the version check, so no write can slip in between
/// the check and the write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IfMatch {
    /// `*`: the row exists (a missing row is refused as not found before this is asked).
    Any,
    /// The row is at one of these versions. Empty when the header named no version of this
    /// row: then nothing matches.
    Versions(Vec<u64>),
}

impl IfMatch {
    /// Refuse the write unless `current` satisfies the precondition.
    pub fn check(&self, current: &Row) -> Result<()> {
        match self {
            IfMatch::Versions(versions) if !versions.contains(&current.version()) => {
                Err(Error::PreconditionFailed { current: Box::new(current.clone()) })
            }
            _ => Ok(()),
        }
    }
}

/// What a write applied by [`SheetState::apply_rows_with`] still owes the change feed.
#[must_use = "a write's rows are applied but its changes not yet recorded"]
pub(crate) struct PendingChanges {
    at: Millis,
    count: usize,
    /// The versions the deleted rows had, in the write's order (0 for one not held).
    deleted_versions: Vec<u64>,
}

/// A patch of one row.
#[derive(Clone, Debug)]
pub struct PatchItem {
    /// The version the client last read; optional only when `if_match` is given.
    pub version: Option<u64>,
    /// The request's precondition, checked before `version`.
    pub if_match: Option<IfMatch>,
    /// Changed cells only: merged; `null` removes a cell.
    pub cells: Map<String, Value>,
    /// Advisory snapshot the client based its change on.
    pub base_cells: Option<Map<String, Value>>,
}

/// What a succeeded upsert item did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpsertAction {
    /// No row held the key: a new row (version 1).
    Created,
    /// One row held the key: the item's cells merged into it (version + 1).
    Updated,
    /// One row held the key and the merge would change nothing: nothing written.
    Unchanged,
}

impl UpsertAction {
    /// The action as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            UpsertAction::Created => "created",
            UpsertAction::Updated => "updated",
            UpsertAction::Unchanged => "unchanged",
        }
    }
}

/// A succeeded upsert item: the row as it is after the item, and what the item did to it.
#[derive(Clone, Debug)]
pub struct Upserted {
    /// The row (for `Unchanged`, the current row).
    pub row: Arc<Row>,
    /// What happened.
    pub action: UpsertAction,
}

/// Items per thread below which an upsert's preparation stays on the actor's thread: a
/// thread's start (tens of microseconds) is then more than the work it takes over.
const UPSERT_PARALLEL_MIN: usize = 256;

/// An upsert item with what it needs of the state ([`SheetState::prepare_upserts`]).
struct Prepared<'a> {
    /// Its coerced cells and its key, or why it fails.
    item: Result<(Vec<(ColumnId, CellWrite)>, KeyValue)>,
    /// The rows holding its key (the key index's candidates, each checked).
    committed: Ids,
    /// The row, when one row holds the key.
    stored: Option<&'a Arc<Row>>,
    /// The item merged into `stored`; `None` when that changes nothing (or there is none).
    merged: Option<Row>,
}

/// A sheet's columns and rows.
///
/// Every part is cheap to clone (persistent maps, `Arc`s and counters), so the actor can
/// publish a copy after each write for readers on any thread (see [`super::SheetSnapshot`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SheetState {
    /// The sheet.
    pub id: SheetId,
    /// Creation time.
    pub created_at: Millis,
    /// Time of the last row write.
    pub updated_at: Millis,
    /// Columns by id.
    pub columns: Arc<BTreeMap<ColumnId, Column>>,
    /// Rows by id; a persistent map of shared rows, so a copy is O(1) and a write copies only
    /// the path to the rows it changes (pointers, never rows).
    #[serde(deserialize_with = "super::load::rows")]
    pub rows: OrdMap<RowId, Arc<Row>>,
    /// `(parent, child)` pairs; derived from `rows`, rebuilt after decoding.
    #[serde(skip)]
    children: OrdSet<(RowId, RowId)>,
    /// Columns ordered by position (then id); derived, rebuilt after decoding.
    #[serde(skip)]
    by_position: Arc<[Column]>,
    /// Attachments on the rows: (count, bytes); derived, kept up to date by `put`/`remove`
    /// so counters never cost a scan of the rows.
    #[serde(skip)]
    attachments: (u64, u64),
    /// The retained changes of the rows (see [`ChangeLog`]); a checkpoint stores it beside the
    /// state, not inside it, so checkpoints written before the feed existed still decode.
    #[serde(skip)]
    pub changes: ChangeLog,
}

impl SheetState {
    /// A sheet with columns and rows (rows already coerced).
    pub fn new(id: SheetId, created_at: Millis, columns: Vec<Column>, rows: Vec<Row>) -> Self {
        let mut state = SheetState {
            id,
            created_at,
            updated_at: created_at,
            columns: Arc::new(columns.into_iter().map(|c| (c.id, c)).collect()),
            ..Default::default()
        };
        state.by_position = state.sorted_columns();
        for row in rows {
            state.put(Arc::new(row));
        }
        state
    }

    /// Rebuild derived indexes (after decoding a checkpoint).
    pub fn reindex(&mut self) {
        self.by_position = self.sorted_columns();
        // One walk of the rows for both: a start spends it on every row of every sheet.
        let mut children = Vec::new();
        let (mut count, mut bytes) = (0, 0);
        for row in self.rows.values() {
            if let Some(parent) = row.parent_id() {
                children.push((parent, row.id));
            }
            count += row.attachments().len() as u64;
            bytes += row.attachments().iter().map(|a| a.bytes).sum::<u64>();
        }
        self.children = children.into_iter().collect();
        self.attachments = (count, bytes);
    }

    fn sorted_columns(&self) -> Arc<[Column]> {
        let mut cols: Vec<Column> = self.columns.values().cloned().collect();
        cols.sort_by_key(|c| (c.position, c.id));
        cols.into()
    }

    /// Columns ordered by position (then id).
    pub fn columns_by_position(&self) -> &Arc<[Column]> {
        &self.by_position
    }

    /// Count and total bytes of the attachments on the sheet's rows (a kept counter: O(1)).
    pub fn attachment_totals(&self) -> (u64, u64) {
        self.attachments
    }

    /// The same figures as [`SheetState::attachment_totals`], counted from the rows (O(rows)):
    /// for rebuilding the counter and for checking it.
    pub fn recount_attachments(&self) -> (u64, u64) {
        self.rows
            .values()
            .flat_map(|r| r.attachments())
            .fold((0, 0), |(n, b), a| (n + 1, b + a.bytes))
    }

    /// Up to `limit` rows after `after`, and whether more follow.
    pub fn page(&self, after: Option<RowId>, limit: usize) -> (Vec<&Row>, bool) {
        let mut iter = match after {
            Some(after) => self.rows.range((Bound::Excluded(after), Bound::Unbounded)),
            None => self.rows.range::<_, RowId>(..),
        };
        // Borrowed, not shared: a page is rendered while its snapshot is held, so a handle
        // per row would buy nothing (and cost an atomic count change in and out).
        // Sized up front: the map's range cannot tell its length, so a collect would grow
        // the vector (and copy it) several times per page.
        let mut page: Vec<&Row> = Vec::with_capacity(limit.min(self.rows.len()));
        page.extend(iter.by_ref().take(limit).map(|(_, r)| &**r));
        let more = iter.next().is_some();
        (page, more)
    }

    /// Up to `limit` rows after `after` that `keep` accepts, looking at no more than
    /// `max_examined` rows; and where to resume: after the last row looked at when rows remain
    /// unexamined (the page may then be short, even empty), `None` when none do.
    pub fn page_filtered(
        &self,
        after: Option<RowId>,
        limit: usize,
        max_examined: usize,
        keep: impl Fn(&Row) -> bool,
    ) -> (Vec<&Row>, Option<RowId>) {
        let mut iter = match after {
            Some(after) => self.rows.range((Bound::Excluded(after), Bound::Unbounded)),
            None => self.rows.range::<_, RowId>(..),
        }
        .peekable();
        let mut page = Vec::new();
        let mut examined = 0;
        while let Some((&id, row)) = iter.next() {
            examined += 1;
            if keep(row) {
                page.push(&**row);
            }
            let stop = page.len() == limit || examined == max_examined;
            if stop {
                return (page, iter.peek().map(|_| id));
            }
        }
        (page, None)
    }

    /// The rows a sheet starts with (an import's) as changes of the record at `lsn`, so a
    /// follower reading the feed from its start sees them.
    pub(crate) fn record_import(&mut self, lsn: Lsn) {
        self.changes.record(lsn, self.created_at, self.rows.len(), Vec::new());
    }

    /// Apply a decided write, held by the record at `lsn` (also the replay path).
    pub fn apply(&mut self, write: &SheetWrite, lsn: Lsn) {
        self.apply_with(write, lsn, |_, _| {});
    }

    /// [`SheetState::apply`], telling `replaced` of each row it puts or removes, as the map
    /// gives it back: `(the row as it was, if it was; as it is now, if it is)`. A row put twice
    /// by one write is told twice, its second time with its first version as the old one; the
    /// actor keeps its key indexes by it, without looking any row up again.
    pub fn apply_with(
        &mut self,
        write: &SheetWrite,
        lsn: Lsn,
        replaced: impl FnMut(Option<&Arc<Row>>, Option<&Arc<Row>>),
    ) {
        let changes = self.apply_rows_with(write, replaced);
        self.record_changes(changes, lsn);
    }

    /// The first half of [`SheetState::apply_with`]: the write's rows, before its position is
    /// known (a writer applies a large write while its record is encoded, to a copy it keeps
    /// only once the log took the record). The state is whole again only after
    /// [`SheetState::record_changes`] with what this gives back.
    pub(crate) fn apply_rows_with(
        &mut self,
        write: &SheetWrite,
        mut replaced: impl FnMut(Option<&Arc<Row>>, Option<&Arc<Row>>),
    ) -> PendingChanges {
        let pending = PendingChanges {
            at: write.at,
            count: write.put.len() + write.deleted.len(),
            deleted_versions: write
                .deleted
                .iter()
                .map(|id| self.rows.get(id).map_or(0, |r| r.version()))
                .collect(),
        };
        let mut put = |state: &mut Self, row: &Arc<Row>| {
            let old = state.put(Arc::clone(row));
            replaced(old.as_ref(), Some(row));
        };
        if write.put.windows(2).all(|w| w[0].id < w[1].id) {
            // Distinct rows in ascending order (a bulkAdd's new rows): in the order that
            // leaves the map's leaves full.
            for i in super::load::packed_order(write.put.len()) {
                put(self, &write.put[i]);
            }
        } else {
            // The same row may come twice: the later version wins.
            for row in &write.put {
                put(self, row);
            }
        }
        for id in &write.deleted {
            if let Some(old) = self.remove(*id) {
                replaced(Some(&old), None);
            }
        }
        if !write.put.is_empty() || !write.deleted.is_empty() {
            self.updated_at = self.updated_at.max(write.at);
        }
        pending
    }

    /// The second half of [`SheetState::apply_with`]: the write's changes in the feed, at the
    /// position of its record.
    pub(crate) fn record_changes(&mut self, pending: PendingChanges, lsn: Lsn) {
        let PendingChanges { at, count, deleted_versions } = pending;
        self.changes.record(lsn, at, count, deleted_versions);
    }

    /// Puts `row`, giving back the version it replaced.
    fn put(&mut self, row: Arc<Row>) -> Option<Arc<Row>> {
        let (id, parent) = (row.id, row.parent_id());
        self.count_attachments(&row, true);
        let old = self.rows.insert(id, row);
        if let Some(old) = &old {
            self.count_attachments(old, false);
            if let Some(old_parent) = old.parent_id() {
                self.children.remove(&(old_parent, id));
            }
        }
        if let Some(parent) = parent {
            self.children.insert((parent, id));
        }
        old
    }

    /// Removes the row `id`, giving it back.
    fn remove(&mut self, id: RowId) -> Option<Arc<Row>> {
        let row = self.rows.remove(&id)?;
        if let Some(parent) = row.parent_id() {
            self.children.remove(&(parent, id));
        }
        self.count_attachments(&row, false);
        Some(row)
    }

    fn count_attachments(&mut self, row: &Row, add: bool) {
        let (n, bytes) = (
            row.attachments().len() as u64,
            row.attachments().iter().map(|a| a.bytes).sum::<u64>(),
        );
        self.attachments = if add {
            (self.attachments.0 + n, self.attachments.1 + bytes)
        } else {
            (self.attachments.0.saturating_sub(n), self.attachments.1.saturating_sub(bytes))
        };
    }

    fn coerce(&self, raw: &Map<String, Value>) -> Result<Vec<(ColumnId, CellWrite)>> {
        Ok(coerce_cells(&self.columns, raw)?)
    }

    /// [`Self::coerce`] of cells the write gives up: their values move into the writes.
    fn coerce_owned(&self, raw: Map<String, Value>) -> Result<Vec<(ColumnId, CellWrite)>> {
        Ok(coerce_owned_cells(&self.columns, raw)?)
    }

    /// A new row of a bulk write, from its coerced writes, under the next row id.
    fn new_row(&self, writes: &[(ColumnId, CellWrite)], ids: &RowIds, now: Millis) -> Arc<Row> {
        let cells = set_values(writes);
        Arc::new(Row::from_sorted_cells(ids.allocate(), self.id, cells, SOURCE_API, now))
    }

    /// Decide a bulk add: one result per item, in order. Items past `cap` fail with
    /// `capacity_exceeded`; the ones before succeed.
    pub fn bulk_add(
        &self,
        items: Vec<Map<String, Value>>,
        cap: u64,
        now: Millis,
        ids: &RowIds,
    ) -> (Vec<Result<Arc<Row>>>, Vec<Arc<Row>>) {
        let mut count = self.rows.len() as u64;
        let mut put = Vec::new();
        let results = items
            .into_iter()
            .map(|cells| {
                let writes = self.coerce_owned(cells)?;
                if count >= cap {
                    return Err(Error::CapacityExceeded { cap });
                }
                count += 1;
                let row = self.new_row(&writes, ids, now);
                put.push(Arc::clone(&row));
                Ok(row)
            })
            .collect();
        (results, put)
    }

    /// The column `raw` (an upsert's `keyColumn`, a column id as cell keys spell it) names:
    /// a column of this sheet whose type can hold a key ([`KEY_COLUMN_TYPES`]).
    pub fn key_column(&self, raw: &str) -> Result<&Column> {
        let Some(column) = parse_column_key(raw).and_then(|id| self.columns.get(&id)) else {
            return Err(Error::KeyColumn(format!(
                "{} is not the id of a column of sheet {} (a column id written as a decimal \
                 integer, e.g. \"100\")",
                Value::String(raw.to_owned()),
                self.id
            )));
        };
        if !KEY_COLUMN_TYPES.contains(&column.ty) {
            let allowed: Vec<&str> = KEY_COLUMN_TYPES.iter().map(|t| t.as_str()).collect();
            return Err(Error::KeyColumn(format!(
                "column {} is a {} column; a key column must be of type {}",
                column.id,
                column.ty.as_str(),
                allowed.join(", ")
            )));
        }
        Ok(column)
    }

    /// Decide a bulk upsert keyed by column `key` (one [`SheetState::key_column`] accepted),
    /// `index` being that column's index over this state: one result per item, in order.
    ///
    /// Each item is decided as if alone, but after the items before it (a key an earlier item
    /// created is found by a later one, which then updates that row). Its key cell (coerced
    /// with its other cells) must hold a value. No row holds it: a new row, as bulk add makes
    /// one (capacity counted the same way). One row: the item's cells merged into it as a patch
    /// merges, unless that changes nothing. More than one: the item fails.
    ///
    /// `put` has one entry per item that created or changed a row, in item order, so a row
    /// updated twice appears twice (the later entry is its final state): the record says what
    /// each item did.
    pub fn bulk_upsert(
        &self,
        key: ColumnId,
        items: Vec<Map<String, Value>>,
        cap: u64,
        now: Millis,
        ids: &RowIds,
        index: &KeyIndex,
    ) -> (Vec<Result<Upserted>>, Vec<Arc<Row>>) {
        let threads = crate::report::columns::threads().min(items.len() / UPSERT_PARALLEL_MIN);
        self.bulk_upsert_on(threads.max(1), key, items, cap, now, ids, index)
    }

    /// [`SheetState::bulk_upsert`], its items prepared on `threads` threads.
    #[allow(clippy::too_many_arguments)]
    fn bulk_upsert_on(
        &self,
        threads: usize,
        key: ColumnId,
        items: Vec<Map<String, Value>>,
        cap: u64,
        now: Millis,
        ids: &RowIds,
        index: &KeyIndex,
    ) -> (Vec<Result<Upserted>>, Vec<Arc<Row>>) {
        let mut count = self.rows.len() as u64;
        // What each item needs of the state, each independent of the others (see
        // [`SheetState::prepare_upserts`]), on every core for a large body.
        let prepared: Vec<Prepared<'_>> = if threads == 1 {
            self.prepare_upserts(key, items, index, now)
        } else {
            let mut items = items;
            let mut parts = Vec::with_capacity(threads);
            let chunk = items.len().div_ceil(threads);
            while items.len() > chunk {
                parts.push(items.split_off(items.len() - chunk));
            }
            parts.push(items);
            parts.reverse();
            // The last part on this thread, the others on threads of their own.
            let last = parts.pop().unwrap_or_default();
            std::thread::scope(|scope| {
                let handles: Vec<_> = parts
                    .into_iter()
                    .map(|part| scope.spawn(move || self.prepare_upserts(key, part, index, now)))
                    .collect();
                let last = self.prepare_upserts(key, last, index, now);
                let mut prepared: Vec<Prepared<'_>> = handles
                    .into_iter()
                    .flat_map(|h| h.join().expect("an upsert's preparation panicked"))
                    .collect();
                prepared.extend(last);
                prepared
            })
        };
        // What the earlier items of this request did, which neither the state nor the index
        // shows yet. An update never moves a row to another key (it matched on that key), so
        // the keys created here are all the index lacks.
        // Sized for every item at once: grown from empty, a body of 2000 rehashed each 11 times.
        let n = prepared.len();
        let mut written: HashMap<RowId, Arc<Row>, foldhash::fast::RandomState> =
            HashMap::with_capacity_and_hasher(n, Default::default());
        let mut created: HashMap<KeyValue, RowId, foldhash::fast::RandomState> =
            HashMap::with_capacity_and_hasher(n, Default::default());
        let mut put = Vec::with_capacity(n);
        let results = prepared
            .into_iter()
            .map(|prepared| {
                let Prepared { item, committed, stored, merged } = prepared;
                let (writes, value) = item?;
                let holder = match (committed.as_slice(), created.get(&value)) {
                    ([], None) => None,
                    ([id], None) | ([], Some(id)) => Some(*id),
                    (committed, also) => {
                        let mut row_ids: Vec<RowId> =
                            committed.iter().chain(also).copied().collect();
                        row_ids.sort_unstable();
                        return Err(Error::AmbiguousKey { column_id: key, row_ids });
                    }
                };
                let Some(id) = holder else {
                    if count >= cap {
                        return Err(Error::CapacityExceeded { cap });
                    }
                    count += 1;
                    let row = self.new_row(&writes, ids, now);
                    created.insert(value, row.id);
                    written.insert(row.id, Arc::clone(&row));
                    put.push(Arc::clone(&row));
                    return Ok(Upserted { row, action: UpsertAction::Created });
                };
                // Not written by an earlier item: the one row the index holds under the key,
                // found and merged already (a key created here is always in `written`).
                let (current, merged) = match (written.get(&id), stored) {
                    (Some(row), _) => (Arc::clone(row), row.merged(&merge_writes(&writes), now)),
                    (None, Some(row)) => (Arc::clone(row), merged),
                    (None, None) => {
                        let row = self.row(id)?;
                        (Arc::clone(row), row.merged(&merge_writes(&writes), now))
                    }
                };
                let Some(row) = merged else {
                    return Ok(Upserted { row: current, action: UpsertAction::Unchanged });
                };
                let row = Arc::new(row);
                written.insert(id, Arc::clone(&row));
                put.push(Arc::clone(&row));
                Ok(Upserted { row, action: UpsertAction::Updated })
            })
            .collect();
        (results, put)
    }

    /// What each upsert item needs of the state, each independent of the others: its cells
    /// coerced and its key; the rows holding the key; the row of a key one row holds, and the
    /// item merged into it. What an earlier item of the same request did is not seen here:
    /// [`SheetState::bulk_upsert`] merges again the few items it changes.
    ///
    /// On a large sheet each lookup is a chain of cache misses; in loops of their own, the
    /// lookups of different items overlap in the processor instead of each waiting for the
    /// one before (+18 % on a 1,000,000-row sheet, half updates).
    fn prepare_upserts<'a>(
        &'a self,
        key: ColumnId,
        items: Vec<Map<String, Value>>,
        index: &'a KeyIndex,
        now: Millis,
    ) -> Vec<Prepared<'a>> {
        let items: Vec<_> = items
            .into_iter()
            .map(|cells| -> Result<_> {
                let writes = self.coerce_owned(cells)?;
                let value = upsert_key(key, &writes)?;
                Ok((writes, value))
            })
            .collect();
        let committed: Vec<Ids> = items
            .iter()
            .map(|item| item.as_ref().map_or(Ids::NONE, |(_, value)| index.candidates(value)))
            .collect();
        let stored: Vec<Option<&Arc<Row>>> = committed
            .iter()
            .map(|ids| match ids {
                Ids::One(id) => self.rows.get(id),
                Ids::Many(_) => None,
            })
            .collect();
        // The rows to update, read through once in a loop of its own for the same reason: each
        // is a cold row of the sheet, and its cells are what the check and the merge below
        // read first.
        let touched = stored.iter().flatten().fold(0u8, |acc, row| {
            row.stored_text().as_bytes().iter().step_by(64).fold(acc, |acc, byte| acc ^ byte)
        });
        std::hint::black_box(touched);
        items
            .into_iter()
            .zip(committed.into_iter().zip(stored))
            .map(|(item, (candidates, stored))| {
                let Ok((writes, value)) = &item else {
                    return Prepared { item, committed: Ids::NONE, stored: None, merged: None };
                };
                // The index's candidates are the rows whose keys share the item's key's
                // fingerprint: each is checked against its own cell.
                let (committed, stored) = match (candidates, stored) {
                    (Ids::One(id), Some(row)) if index.holds(row, value) => {
                        (Ids::One(id), Some(row))
                    }
                    (Ids::One(_), _) => (Ids::NONE, None),
                    (Ids::Many(ids), _) => {
                        let holders: Vec<RowId> = ids
                            .into_iter()
                            .filter(|id| {
                                self.rows.get(id).is_some_and(|row| index.holds(row, value))
                            })
                            .collect();
                        match holders[..] {
                            [id] => (Ids::One(id), self.rows.get(&id)),
                            _ => (Ids::Many(holders), None),
                        }
                    }
                };
                let merged = stored.and_then(|row| row.merged(&merge_writes(writes), now));
                Prepared { item, committed, stored, merged }
            })
            .collect()
    }

    /// Decide a bulk update: one result per item. An id may appear twice; the second item
    /// then sees the first one's result (it is checked against the new version).
    pub fn bulk_update(
        &self,
        items: &[UpdateItem],
        now: Millis,
    ) -> (Vec<Result<Arc<Row>>>, Vec<Arc<Row>>) {
        let mut written: HashMap<RowId, Arc<Row>> = HashMap::new();
        let mut put = Vec::new();
        let results = items
            .iter()
            .map(|item| {
                let current =
                    written.get(&item.id).or_else(|| self.rows.get(&item.id)).ok_or_else(|| {
                        Error::NotFound(format!("row {} in sheet {}", item.id, self.id))
                    })?;
                check_version(current, item.version, &item.cells, item.base_cells.as_ref(), true)?;
                let writes = self.coerce(&item.cells)?;
                let row = Arc::new(current.next(&apply_writes(BTreeMap::new(), writes), now));
                written.insert(row.id, Arc::clone(&row));
                put.push(Arc::clone(&row));
                Ok(row)
            })
            .collect();
        // In item order, one per succeeded item (an id twice is written twice): the change
        // feed shows one change per succeeded item.
        (results, put)
    }

    /// The row `row_id` of this sheet, or not found (the one wording of that 404, for reads and
    /// writes alike).
    pub fn row(&self, row_id: RowId) -> Result<&Arc<Row>> {
        self.rows
            .get(&row_id)
            .ok_or_else(|| Error::NotFound(format!("row {row_id} in sheet {}", self.id)))
    }

    /// Decide a patch: 404 when the row is not in this sheet, 412 when `if_match` fails, 409 on
    /// a stale version, 422 on a coercion failure, in that order.
    ///
    /// With both a list of versions in `if_match` and a body `version`, the two must agree: once
    /// the precondition holds, a body version other than the current one is a failed
    /// precondition too (412, not 409), since the request contradicts itself. With `*`, the
    /// body version is checked as usual.
    pub fn patch(&self, row_id: RowId, item: &PatchItem, now: Millis) -> Result<Arc<Row>> {
        let current = self.row(row_id)?;
        if let Some(if_match) = &item.if_match {
            if_match.check(current)?;
        }
        match (item.version, &item.if_match) {
            (Some(v), Some(IfMatch::Versions(_))) if v != current.version() => {
                return Err(Error::PreconditionFailed { current: Box::new((**current).clone()) });
            }
            (Some(v), _) => {
                check_version(current, v, &item.cells, item.base_cells.as_ref(), false)?
            }
            (None, _) => {}
        }
        let writes = self.coerce(&item.cells)?;
        Ok(Arc::new(current.patched(&merge_writes(&writes), now)))
    }

    /// Decide a delete: 404 when the row is not in this sheet, 412 when `if_match` fails;
    /// else the row and its subtree (see [`SheetState::subtree`]).
    pub fn delete(&self, row_id: RowId, if_match: Option<&IfMatch>) -> Result<Vec<RowId>> {
        let current = self.row(row_id)?;
        if let Some(if_match) = if_match {
            if_match.check(current)?;
        }
        self.subtree(row_id)
    }

    /// The row and its whole subtree, parents before children.
    pub fn subtree(&self, row_id: RowId) -> Result<Vec<RowId>> {
        self.row(row_id)?;
        let mut out = vec![row_id];
        let mut i = 0;
        while i < out.len() {
            let parent = out[i];
            let kids = self.children.range((parent, 0)..=(parent, RowId::MAX));
            out.extend(kids.map(|&(_, child)| child));
            i += 1;
        }
        Ok(out)
    }
}

/// Coerced writes as [`Row::merged`] takes them: the value a cell is set to, `None` to clear it.
fn merge_writes(writes: &[(ColumnId, CellWrite)]) -> Vec<(ColumnId, Option<&Value>)> {
    writes
        .iter()
        .map(|(col, write)| match write {
            CellWrite::Set(value) => (*col, Some(value)),
            CellWrite::Clear => (*col, None),
        })
        .collect()
}

/// The key an upsert item's coerced cells hold in column `key`; refused like a bad cell value
/// (`validation_failed` naming the column) when the cell is missing, null or holds no value.
fn upsert_key(key: ColumnId, writes: &[(ColumnId, CellWrite)]) -> Result<KeyValue> {
    let refuse = |reason: &str| {
        Error::Coerce(CoerceError { column_id: CellKey::Column(key), reason: reason.to_owned() })
    };
    match writes.iter().find(|(col, _)| *col == key).map(|(_, w)| w) {
        None => Err(refuse(
            "the key cell is missing: every item of a bulkUpsert must hold a value in its key \
             column",
        )),
        Some(CellWrite::Clear) => {
            Err(refuse("the key cell is null: an upsert item's key must hold a value"))
        }
        Some(CellWrite::Set(value)) => KeyValue::of(value).ok_or_else(|| {
            refuse(
                "the key cell holds no value to match (an empty string, or a wrapper without a \
                 value)",
            )
        }),
    }
}

/// Refuse a stale version, classifying the request's cells against `baseCells` when given.
/// `replaces` says whether the request replaces the whole cell map (bulk update), in which case
/// cells of the base it leaves out count as changed too.
fn check_version(
    current: &Row,
    version: u64,
    cells: &Map<String, Value>,
    base: Option<&Map<String, Value>>,
    replaces: bool,
) -> Result<()> {
    if current.version() == version {
        return Ok(());
    }
    let (conflicting, mergeable) = match base {
        None => (None, None),
        Some(base) => {
            let mut changed: Vec<&String> = cells.keys().collect();
            if replaces {
                changed.extend(base.keys().filter(|k| !cells.contains_key(*k)));
            }
            let (mut conflicting, mut mergeable) = (Vec::new(), Vec::new());
            let now_cells = current.cells();
            for key in changed {
                let Ok(col) = key.parse::<ColumnId>() else { continue };
                let now = now_cells.get(&col).map(|j| &j.0);
                let then = base.get(key).filter(|v| !v.is_null());
                if now != then {
                    conflicting.push(col);
                } else {
                    mergeable.push(col);
                }
            }
            (Some(conflicting), Some(mergeable))
        }
    };
    Err(Error::VersionConflict { current: Box::new(current.clone()), conflicting, mergeable })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::{Attachment, ColumnType, Json};

    #[test]
    fn a_write_applies_its_rows_in_any_order_with_the_later_version_of_a_row_winning() {
        let row = |id: RowId, version: u64| {
            let cells = BTreeMap::from([(1, Json(json!(format!("{id} v{version}"))))]);
            Arc::new(Row::at_version(id, 9, version, &cells, crate::model::SOURCE_API, (0, 0)))
        };
        let write = |put: Vec<Arc<Row>>| SheetWrite {
            sheet_id: 9,
            at: 1,
            put,
            deleted: Vec::new(),
            idem: None,
        };
        // Ascending (the order a start's rows and a bulkAdd's come in), after rows it holds.
        let mut s = SheetState::new(9, 0, Vec::new(), vec![(*row(1, 1)).clone()]);
        s.apply(&write((2..=1001).map(|id| row(id, 1)).collect()), 1);
        assert!(s
            .rows
            .iter()
            .map(|(id, r)| (*id, r.id, r.version()))
            .eq((1..=1001).map(|i| (i, i, 1))));
        // A row named twice: its later version stays (every other row first would not do).
        s.apply(&write(vec![row(3, 2), row(5, 3), row(5, 4)]), 2);
        let versions: Vec<u64> = [3, 5].iter().map(|id| s.rows[id].version()).collect();
        assert_eq!(versions, [2, 4]);
        assert_eq!(s.rows.len(), 1001);
    }

    fn sheet() -> SheetState {
        let col = Column {
            id: 1,
            sheet_id: 9,
            name: "N".into(),
            ty: ColumnType::Number,
            position: 0,
            options: None,
            primary: false,
        };
        let row = |id, parent: Option<RowId>, bytes: u64| {
            let mut row = Row::new(id, 9, BTreeMap::new(), crate::model::SOURCE_IMPORT, 0);
            row.set_parent_id(parent);
            row.set_attachments(Box::new([Attachment { name: "f".into(), bytes }]));
            row
        };
        SheetState::new(
            9,
            0,
            vec![col],
            vec![row(1, None, 10), row(2, Some(1), 20), row(3, Some(2), 30), row(4, None, 40)],
        )
    }

    fn cells(v: serde_json::Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn a_filtered_page_stops_at_the_limit_or_the_examined_cap() {
        let s = sheet();
        let ids = |(rows, next): (Vec<&Row>, Option<RowId>)| {
            (rows.iter().map(|r| r.id).collect::<Vec<_>>(), next)
        };
        let odd = |r: &Row| r.id % 2 == 1;
        assert_eq!(ids(s.page_filtered(None, 1, 100, odd)), (vec![1], Some(1)));
        assert_eq!(ids(s.page_filtered(Some(1), 1, 100, odd)), (vec![3], Some(3)));
        // Row 4 is left: the cursor still points past the last row examined.
        assert_eq!(ids(s.page_filtered(Some(3), 5, 100, odd)), (vec![], None));
        assert_eq!(ids(s.page_filtered(None, 5, 100, odd)), (vec![1, 3], None));
        assert_eq!(ids(s.page_filtered(None, 5, 2, |r| r.id == 4)), (vec![], Some(2)));
        assert_eq!(ids(s.page_filtered(Some(2), 5, 2, |r| r.id == 4)), (vec![4], None));
        // The limit reached on the last row: nothing remains, no cursor.
        assert_eq!(ids(s.page_filtered(Some(2), 2, 100, |_| true)), (vec![3, 4], None));
    }

    #[test]
    fn a_second_item_for_the_same_row_sees_the_first_items_version() {
        let s = sheet();
        let items = [
            UpdateItem { id: 1, version: 1, cells: cells(json!({"1": 5})), base_cells: None },
            UpdateItem { id: 1, version: 1, cells: cells(json!({"1": 6})), base_cells: None },
            UpdateItem { id: 1, version: 2, cells: cells(json!({"1": 7})), base_cells: None },
        ];
        let (results, put) = s.bulk_update(&items, 1);
        assert_eq!(results[0].as_ref().unwrap().version(), 2);
        assert!(matches!(results[1], Err(Error::VersionConflict { .. })));
        assert_eq!(results[2].as_ref().unwrap().version(), 3);
        // One entry per succeeded item, in item order: the feed shows each of them.
        assert_eq!(put.iter().map(|r| r.version()).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(put[1].cells()[&1], Json(json!(7)));
        let mut applied = s.clone();
        applied.apply(&SheetWrite { sheet_id: 9, at: 1, put, deleted: Vec::new(), idem: None }, 7);
        assert_eq!(applied.rows[&1].version(), 3);
        assert_eq!(applied.changes.next_seq() - applied.changes.oldest_seq(), 2);
    }

    #[test]
    fn subtree_lists_parents_before_children_and_replay_is_an_overwrite() {
        let mut s = sheet();
        assert_eq!(s.subtree(1).unwrap(), [1, 2, 3]);
        assert_eq!(s.attachment_totals(), (4, 100));
        let write =
            SheetWrite { sheet_id: 9, at: 5, put: Vec::new(), deleted: vec![1, 2, 3], idem: None };
        s.apply(&write, 1);
        s.apply(&write, 1);
        assert_eq!(s.rows.keys().copied().collect::<Vec<_>>(), [4]);
        assert_eq!(s.attachment_totals(), (1, 40));
        assert!(matches!(s.subtree(2), Err(Error::NotFound(_))));
        // The kept counter agrees with a recount of the rows.
        assert_eq!(s.recount_attachments(), s.attachment_totals());
        assert_eq!(s.recount_attachments(), (1, 40));
    }

    #[test]
    fn if_match_is_decided_after_the_row_exists_and_before_the_body_version() {
        let s = sheet();
        let patch = |version, if_match| PatchItem {
            version,
            if_match,
            cells: cells(json!({"1": 5})),
            base_cells: None,
        };
        let failed = |r: Result<_>| match r {
            Err(Error::PreconditionFailed { current }) => current.version(),
            other => panic!("expected a failed precondition, got {other:?}"),
        };
        let v1 = || Some(IfMatch::Versions(vec![1]));
        assert_eq!(s.patch(1, &patch(None, v1()), 0).unwrap().version(), 2);
        assert_eq!(s.patch(1, &patch(Some(1), v1()), 0).unwrap().version(), 2);
        assert_eq!(
            s.patch(1, &patch(None, Some(IfMatch::Versions(vec![3, 1]))), 0).unwrap().version(),
            2
        );
        assert_eq!(failed(s.patch(1, &patch(None, Some(IfMatch::Versions(vec![2]))), 0)), 1);
        assert_eq!(failed(s.patch(1, &patch(None, Some(IfMatch::Versions(vec![]))), 0)), 1);
        // The header matches, the body names another version: the request contradicts itself.
        assert_eq!(failed(s.patch(1, &patch(Some(2), v1()), 0)), 1);
        // `*` says only that the row exists; the body version is then checked as usual.
        assert_eq!(s.patch(1, &patch(None, Some(IfMatch::Any)), 0).unwrap().version(), 2);
        assert!(matches!(
            s.patch(1, &patch(Some(2), Some(IfMatch::Any)), 0),
            Err(Error::VersionConflict { .. })
        ));
        assert!(matches!(
            s.patch(77, &patch(None, Some(IfMatch::Any)), 0),
            Err(Error::NotFound(_))
        ));
        assert!(matches!(s.patch(77, &patch(None, v1()), 0), Err(Error::NotFound(_))));

        assert_eq!(s.delete(1, None).unwrap(), [1, 2, 3]);
        assert_eq!(s.delete(1, Some(&IfMatch::Any)).unwrap(), [1, 2, 3]);
        assert_eq!(s.delete(1, v1().as_ref()).unwrap(), [1, 2, 3]);
        assert!(matches!(
            s.delete(1, Some(&IfMatch::Versions(vec![2]))),
            Err(Error::PreconditionFailed { current }) if current.version() == 1
        ));
        assert!(matches!(s.delete(77, Some(&IfMatch::Any)), Err(Error::NotFound(_))));
    }

    /// The record of an upsert lists one row per item that created or changed one, in item
    /// order (the change feed reads created/updated off the versions); failed and unchanged
    /// items put nothing.
    #[test]
    fn an_upsert_puts_each_written_row_in_item_order() {
        let mut s = sheet();
        let ids = RowIds::default();
        ids.observe(100);
        let index = KeyIndex::build(&s, 1);
        let items = [
            cells(json!({"1": 7})),
            cells(json!({"1": "7"})),
            cells(json!({"1": 7.0})),
            cells(json!({"1": null})),
            cells(json!({"1": "x"})),
            cells(json!({})),
            cells(json!({"1": 8})),
        ];
        let (results, put) = s.bulk_upsert(1, items.to_vec(), 10, 5, &ids, &index);
        let actions: Vec<Option<UpsertAction>> =
            results.iter().map(|r| r.as_ref().ok().map(|u| u.action)).collect();
        use UpsertAction::*;
        // `7`, `"7"` and `7.0` are one key; the first creates, the second changes nothing, the
        // third stores 7.0 instead of 7 (what the row reads back changes).
        assert_eq!(
            actions,
            [Some(Created), Some(Unchanged), Some(Updated), None, None, None, Some(Created)]
        );
        assert_eq!(
            put.iter().map(|r| (r.id, r.version())).collect::<Vec<_>>(),
            [(101, 1), (101, 2), (102, 1)]
        );
        assert!(matches!(&results[3], Err(Error::Coerce(e)) if e.column_id == 1));
        assert!(matches!(&results[5], Err(Error::Coerce(e)) if e.column_id == 1));
        // Applied (twice, as replay may), the rows are the last entries.
        let write =
            SheetWrite { sheet_id: 9, at: 5, put: put.clone(), deleted: vec![], idem: None };
        s.apply(&write, 1);
        s.apply(&write, 1);
        assert_eq!(s.rows[&101].version(), 2);
        assert_eq!(s.rows[&101].cells()[&1], Json(json!(7.0)));
        // Two rows holding one key: the item fails naming both, the next item still runs.
        let write = SheetWrite {
            sheet_id: 9,
            at: 6,
            put: vec![Arc::new(Row::new(103, 9, s.rows[&102].cells(), SOURCE_API, 6))],
            deleted: vec![],
            idem: None,
        };
        s.apply(&write, 2);
        let index = KeyIndex::build(&s, 1);
        let (results, put) = s.bulk_upsert(
            1,
            vec![cells(json!({"1": 8})), cells(json!({"1": 7}))],
            10,
            7,
            &ids,
            &index,
        );
        assert!(matches!(
            &results[0],
            Err(Error::AmbiguousKey { column_id: 1, row_ids }) if row_ids == &[102, 103]
        ));
        assert_eq!(results[1].as_ref().unwrap().action, Updated);
        assert_eq!(put.iter().map(|r| (r.id, r.version())).collect::<Vec<_>>(), [(101, 3)]);
    }

    /// An upsert decides its items as if each came alone after the ones before it, however
    /// many threads prepare them and however often keys share a fingerprint: against items
    /// sent one by one, a large body with keys repeated inside it, keys two rows hold and bad
    /// items gives the same results and rows.
    #[test]
    fn a_large_upsert_decides_as_its_items_one_by_one() {
        let column = |id, ty| Column {
            id,
            sheet_id: 9,
            name: format!("c{id}"),
            ty,
            position: id as i64,
            options: None,
            primary: false,
        };
        let rows = (1..=300)
            .map(|id: u64| {
                // Keys 0..290: the last ten rows repeat keys, which two rows then hold.
                let cells = BTreeMap::from([(1, Json(json!(id % 290))), (2, Json(json!("old")))]);
                Row::new(id, 9, cells, SOURCE_API, 0)
            })
            .collect();
        let s = SheetState::new(
            9,
            0,
            vec![column(1, ColumnType::Number), column(2, ColumnType::Text)],
            rows,
        );
        let mut random = 0x2545_f491_4f6c_dd1d_u64;
        let items: Vec<Map<String, Value>> = (0..1500)
            .map(|i| {
                random ^= random << 13;
                random ^= random >> 7;
                random ^= random << 17;
                match random % 50 {
                    0 => cells(json!({"2": "no key"})),
                    1 => cells(json!({"1": "not a number", "2": "x"})),
                    k => cells(json!({"1": random % 600, "2": format!("v{}", i % (k + 3))})),
                }
            })
            .collect();
        let (now, cap) = (7, 1000);
        let decide = |threads: usize, shared_fingerprints: bool| {
            let ids = RowIds::default();
            ids.observe(300);
            let index = if shared_fingerprints {
                KeyIndex::build_with_shared_fingerprints(&s, 1)
            } else {
                KeyIndex::build(&s, 1)
            };
            let (results, put) =
                s.bulk_upsert_on(threads, 1, items.clone(), cap, now, &ids, &index);
            let results: Vec<_> = results
                .into_iter()
                .map(|r| r.map(|u| (u.action, (*u.row).clone())).map_err(|e| e.to_string()))
                .collect();
            (results, put.iter().map(|r| (**r).clone()).collect::<Vec<_>>())
        };
        let one_by_one =
            {
                let ids = RowIds::default();
                ids.observe(300);
                let mut s = s.clone();
                let (mut results, mut put) = (Vec::new(), Vec::new());
                for (lsn, item) in items.iter().enumerate() {
                    let index = KeyIndex::build(&s, 1);
                    let (r, p) = s.bulk_upsert_on(1, 1, vec![item.clone()], cap, now, &ids, &index);
                    let write = SheetWrite {
                        sheet_id: 9,
                        at: now,
                        put: p.clone(),
                        deleted: vec![],
                        idem: None,
                    };
                    s.apply(&write, lsn as u64 + 1);
                    results.extend(r.into_iter().map(|r| {
                        r.map(|u| (u.action, (*u.row).clone())).map_err(|e| e.to_string())
                    }));
                    put.extend(p.iter().map(|r| (**r).clone()));
                }
                (results, put)
            };
        let actions = |results: &[std::result::Result<(UpsertAction, Row), String>]| {
            let mut counts = BTreeMap::new();
            for r in results {
                *counts
                    .entry(r.as_ref().map(|(a, _)| a.as_str()).unwrap_or("failed"))
                    .or_insert(0) += 1;
            }
            counts
        };
        // Every kind of item is in the body.
        let kinds = actions(&one_by_one.0);
        for kind in ["created", "updated", "unchanged", "failed"] {
            assert!(kinds.get(kind).copied().unwrap_or(0) > 0, "{kinds:?}");
        }
        for threads in [1, 2, 3] {
            assert!(decide(threads, false) == one_by_one, "{threads} threads");
        }
        // Keys that share fingerprints all the time are still told apart.
        assert!(decide(2, true) == one_by_one, "shared fingerprints");
    }

    #[test]
    fn only_a_column_of_a_key_type_is_a_key_column() {
        let s = sheet();
        assert_eq!(s.key_column("1").unwrap().id, 1);
        for bad in ["2", "01", "+1", "", "x", "18446744073709551616"] {
            assert!(matches!(s.key_column(bad), Err(Error::KeyColumn(_))), "{bad}");
        }
    }

    #[test]
    fn capacity_counts_rows_added_earlier_in_the_same_request() {
        let s = sheet();
        let ids = RowIds::default();
        ids.observe(100);
        let (results, put) = s.bulk_add(
            vec![Map::new(), Map::new(), cells(json!({"1": "x"})), Map::new()],
            5,
            0,
            &ids,
        );
        assert!(results[0].is_ok());
        assert!(matches!(results[1], Err(Error::CapacityExceeded { cap: 5 })));
        assert!(matches!(results[2], Err(Error::Coerce(_))));
        assert!(matches!(results[3], Err(Error::CapacityExceeded { .. })));
        assert_eq!(put.iter().map(|r| r.id).collect::<Vec<_>>(), [101]);
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::model::{Attachment, Json};

    #[derive(Clone, Debug)]
    enum Op {
        /// Put a row (new or overwriting) with a parent below its id and some attachments.
        Put { id: RowId, parent: Option<RowId>, attachments: Vec<u64> },
        /// Delete a row and its subtree, as deleteRow decides it.
        Delete { id: RowId },
        /// Checkpoint and recover: encode, decode, rebuild the derived state.
        Restart,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (2..40u64, proptest::option::of(1..40u64), proptest::collection::vec(0..1000u64, 0..3))
                .prop_map(|(id, parent, attachments)| Op::Put {
                    id,
                    parent: parent.filter(|p| *p < id),
                    attachments,
                }),
            2 => (1..40u64).prop_map(|id| Op::Delete { id }),
            1 => Just(Op::Restart),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        /// A write's rows (ids below and above the map's last, some named twice, in any
        /// order, or ascending and distinct, which go in packed order) leave the map and tell `replaced` what putting them one by one
        /// in item order would: per row, the same versions in the same order.
        #[test]
        fn a_write_puts_its_rows_as_in_item_order(
            held in proptest::collection::btree_set(1..60u64, 0..30),
            put in proptest::collection::vec(1..90u64, 0..80),
        ) {
            let row = |id: RowId, version: u64| {
                let cells = BTreeMap::from([(1, Json(serde_json::json!(id)))]);
                Row::at_version(id, 9, version, &cells, crate::model::SOURCE_API, (0, 0))
            };
            let rows: Vec<Row> = held.iter().map(|&id| row(id, 1)).collect();
            let mut s = SheetState::new(9, 0, Vec::new(), rows);
            let mut expected: BTreeMap<RowId, u64> = held.iter().map(|&id| (id, 1)).collect();
            let mut told_expected: BTreeMap<RowId, Vec<(Option<u64>, u64)>> = BTreeMap::new();
            let put: Vec<Arc<Row>> = put
                .iter()
                .enumerate()
                .map(|(i, &id)| {
                    let version = 2 + i as u64;
                    let old = expected.insert(id, version);
                    told_expected.entry(id).or_default().push((old, version));
                    Arc::new(row(id, version))
                })
                .collect();
            let mut told: BTreeMap<RowId, Vec<(Option<u64>, u64)>> = BTreeMap::new();
            let write = SheetWrite { sheet_id: 9, at: 1, put, deleted: Vec::new(), idem: None };
            s.apply_with(&write, 1, |old, new| {
                let new = new.expect("a put");
                told.entry(new.id).or_default().push((old.map(|r| r.version()), new.version()));
            });
            let map: BTreeMap<RowId, u64> = s.rows.iter().map(|(id, r)| (*id, r.version())).collect();
            prop_assert_eq!(map, expected);
            prop_assert_eq!(told, told_expected);
        }

        /// The kept counters (rows, attachments) and the children index always equal a recount
        /// from the rows, through any mix of writes, subtree deletes and restarts.
        #[test]
        fn kept_counters_equal_a_recount(ops in proptest::collection::vec(op(), 1..60)) {
            let mut s = SheetState::new(9, 0, Vec::new(), Vec::new());
            let mut at = 0;
            for op in ops {
                at += 1;
                match op {
                    Op::Put { id, parent, attachments } => {
                        let mut row = Row::new(id, 9, BTreeMap::new(), crate::model::SOURCE_API, at);
                        row.set_parent_id(parent);
                        row.set_attachments(
                            attachments
                                .into_iter()
                                .map(|bytes| Attachment { name: "f".into(), bytes })
                                .collect(),
                        );
                        s.apply(&SheetWrite { sheet_id: 9, at, put: vec![Arc::new(row)], deleted: Vec::new(), idem: None }, 1);
                    }
                    Op::Delete { id } => {
                        if let Ok(ids) = s.subtree(id) {
                            s.apply(&SheetWrite { sheet_id: 9, at, put: Vec::new(), deleted: ids, idem: None }, 1);
                        }
                    }
                    Op::Restart => {
                        let bytes = crate::log::codec::encode(&s).unwrap();
                        s = crate::log::codec::decode(&bytes).unwrap();
                        s.reindex();
                    }
                }
                prop_assert_eq!(s.attachment_totals(), s.recount_attachments());
                let mut rebuilt = s.clone();
                rebuilt.reindex();
                for id in s.rows.keys() {
                    prop_assert_eq!(s.subtree(*id).unwrap(), rebuilt.subtree(*id).unwrap());
                }
            }
        }
    }
}
