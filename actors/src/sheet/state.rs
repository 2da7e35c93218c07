//! One sheet's columns and rows, and every rule of a row write: coercion, versions, capacity,
//! subtree delete. Plain methods with no actor or log in sight, so they are tested directly.
//!
//! Every write method first decides, then goes through [`SheetState::apply`], the same function
//! recovery uses to replay a [`SheetWrite`]: there is one way a row changes.

use std::collections::{BTreeMap, HashMap};

use imbl::OrdMap;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::coerce::{coerce_cells, CellWrite};
use crate::error::{Error, Result};
use crate::model::{Column, ColumnId, Json, Millis, Row, RowId, SheetId};
use crate::record::SheetWrite;
use crate::shared::RowIds;

/// The `source` of rows written through the API.
pub const SOURCE_API: &str = "api";

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

/// A patch of one row.
#[derive(Clone, Debug)]
pub struct PatchItem {
    /// The version the client last read.
    pub version: u64,
    /// Changed cells only: merged; `null` removes a cell.
    pub cells: Map<String, Value>,
    /// Advisory snapshot the client based its change on.
    pub base_cells: Option<Map<String, Value>>,
}

/// A sheet's columns and rows.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SheetState {
    /// The sheet.
    pub id: SheetId,
    /// Creation time.
    pub created_at: Millis,
    /// Time of the last row write.
    pub updated_at: Millis,
    /// Columns by id.
    pub columns: BTreeMap<ColumnId, Column>,
    /// Rows by id; a persistent map, so snapshots for checkpoints and report scans are O(1).
    pub rows: OrdMap<RowId, Row>,
    /// Children of each parent row; derived from `rows`, rebuilt after decoding.
    #[serde(skip)]
    children: HashMap<RowId, Vec<RowId>>,
}

impl SheetState {
    /// A sheet with columns and rows (rows already coerced).
    pub fn new(id: SheetId, created_at: Millis, columns: Vec<Column>, rows: Vec<Row>) -> Self {
        let mut state = SheetState {
            id,
            created_at,
            updated_at: created_at,
            columns: columns.into_iter().map(|c| (c.id, c)).collect(),
            ..Default::default()
        };
        for row in rows {
            state.put(row);
        }
        state
    }

    /// Rebuild derived indexes (after decoding a checkpoint).
    pub fn reindex(&mut self) {
        self.children.clear();
        for row in self.rows.values() {
            if let Some(parent) = row.parent_id {
                self.children.entry(parent).or_default().push(row.id);
            }
        }
    }

    /// Columns ordered by position (then id).
    pub fn columns_by_position(&self) -> Vec<Column> {
        let mut cols: Vec<Column> = self.columns.values().cloned().collect();
        cols.sort_by_key(|c| (c.position, c.id));
        cols
    }

    /// Total bytes and count of attachments on the sheet's rows.
    pub fn attachment_totals(&self) -> (u64, u64) {
        self.rows
            .values()
            .flat_map(|r| &r.attachments)
            .fold((0, 0), |(n, b), a| (n + 1, b + a.bytes))
    }

    /// Up to `limit` rows after `after`, and whether more follow.
    pub fn page(&self, after: Option<RowId>, limit: usize) -> (Vec<Row>, bool) {
        let mut iter = match after {
            Some(after) => {
                self.rows.range((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
            }
            None => self.rows.range::<_, RowId>(..),
        };
        let page: Vec<Row> = iter.by_ref().take(limit).map(|(_, r)| r.clone()).collect();
        let more = iter.next().is_some();
        (page, more)
    }

    /// Apply a decided write (also the replay path).
    pub fn apply(&mut self, write: &SheetWrite) {
        for row in &write.put {
            self.put(row.clone());
        }
        for id in &write.deleted {
            self.remove(*id);
        }
        if !write.put.is_empty() || !write.deleted.is_empty() {
            self.updated_at = self.updated_at.max(write.at);
        }
    }

    fn put(&mut self, row: Row) {
        if let Some(parent) = row.parent_id {
            let siblings = self.children.entry(parent).or_default();
            if !siblings.contains(&row.id) {
                siblings.push(row.id);
            }
        }
        self.rows.insert(row.id, row);
    }

    fn remove(&mut self, id: RowId) {
        if let Some(row) = self.rows.remove(&id) {
            if let Some(siblings) = row.parent_id.and_then(|p| self.children.get_mut(&p)) {
                siblings.retain(|c| *c != id);
            }
        }
        self.children.remove(&id);
    }

    fn coerce(&self, raw: &Map<String, Value>) -> Result<Vec<(ColumnId, CellWrite)>> {
        Ok(coerce_cells(&self.columns, raw)?)
    }

    /// Decide a bulk add: one result per item, in order. Items past `cap` fail with
    /// `capacity_exceeded`; the ones before succeed.
    pub fn bulk_add(
        &self,
        items: &[Map<String, Value>],
        cap: u64,
        now: Millis,
        ids: &RowIds,
    ) -> (Vec<Result<Row>>, Vec<Row>) {
        let mut count = self.rows.len() as u64;
        let mut put = Vec::new();
        let results = items
            .iter()
            .map(|cells| {
                let writes = self.coerce(cells)?;
                if count >= cap {
                    return Err(Error::CapacityExceeded { cap });
                }
                count += 1;
                let row = Row {
                    id: ids.allocate(),
                    sheet_id: self.id,
                    parent_id: None,
                    version: 1,
                    cells: apply_writes(BTreeMap::new(), writes),
                    attachments: Vec::new(),
                    created_at: now,
                    updated_at: now,
                    source: SOURCE_API.into(),
                };
                put.push(row.clone());
                Ok(row)
            })
            .collect();
        (results, put)
    }

    /// Decide a bulk update: one result per item. An id may appear twice; the second item
    /// then sees the first one's result (it is checked against the new version).
    pub fn bulk_update(&self, items: &[UpdateItem], now: Millis) -> (Vec<Result<Row>>, Vec<Row>) {
        let mut written: HashMap<RowId, Row> = HashMap::new();
        let results = items
            .iter()
            .map(|item| {
                let current =
                    written.get(&item.id).or_else(|| self.rows.get(&item.id)).ok_or_else(|| {
                        Error::NotFound(format!("row {} in sheet {}", item.id, self.id))
                    })?;
                check_version(current, item.version, &item.cells, item.base_cells.as_ref(), true)?;
                let writes = self.coerce(&item.cells)?;
                let row = next_version(current, apply_writes(BTreeMap::new(), writes), now);
                written.insert(row.id, row.clone());
                Ok(row)
            })
            .collect();
        let mut put: Vec<Row> = written.into_values().collect();
        put.sort_by_key(|r| r.id);
        (results, put)
    }

    /// Decide a patch: 404 when the row is not in this sheet, 409 on a stale version, 422 on a
    /// coercion failure, in that order.
    pub fn patch(&self, row_id: RowId, item: &PatchItem, now: Millis) -> Result<Row> {
        let current = self
            .rows
            .get(&row_id)
            .ok_or_else(|| Error::NotFound(format!("row {row_id} in sheet {}", self.id)))?;
        check_version(current, item.version, &item.cells, item.base_cells.as_ref(), false)?;
        let writes = self.coerce(&item.cells)?;
        Ok(next_version(current, apply_writes(current.cells.clone(), writes), now))
    }

    /// Decide a delete: the row and its whole subtree, parents before children.
    pub fn subtree(&self, row_id: RowId) -> Result<Vec<RowId>> {
        if !self.rows.contains_key(&row_id) {
            return Err(Error::NotFound(format!("row {row_id} in sheet {}", self.id)));
        }
        let mut out = vec![row_id];
        let mut i = 0;
        while i < out.len() {
            if let Some(kids) = self.children.get(&out[i]) {
                out.extend(kids.iter().copied());
            }
            i += 1;
        }
        Ok(out)
    }
}

fn apply_writes(
    mut cells: BTreeMap<ColumnId, Json>,
    writes: Vec<(ColumnId, CellWrite)>,
) -> BTreeMap<ColumnId, Json> {
    for (col, write) in writes {
        match write {
            CellWrite::Clear => {
                cells.remove(&col);
            }
            CellWrite::Set(v) => {
                cells.insert(col, Json(v));
            }
        }
    }
    cells
}

fn next_version(current: &Row, cells: BTreeMap<ColumnId, Json>, now: Millis) -> Row {
    Row {
        version: current.version + 1,
        cells,
        updated_at: now,
        source: SOURCE_API.into(),
        ..current.clone()
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
    if current.version == version {
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
            for key in changed {
                let Ok(col) = key.parse::<ColumnId>() else { continue };
                let now = current.cells.get(&col).map(|j| &j.0);
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
