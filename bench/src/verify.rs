//! `--verify`: the ledger of acknowledged writes, and the read-back that checks it.
//!
//! # The ledger
//!
//! Each virtual user records, for every row it saw a 2xx for, what the server acknowledged:
//! the version and the cells of the row in the answer (not the cells it sent: the server's
//! coercion decides the stored form, and the claim under test is that what was acknowledged
//! stays). A later acknowledged write of the same row replaces the entry; an acknowledged
//! delete turns it into "must be gone". Only one virtual user ever writes a given row, so the
//! last acknowledgement it saw is the row's final state.
//!
//! A write that got no answer (transport error) or a 5xx may or may not have been applied, so
//! its row becomes *uncertain*: it is not checked, only counted, and its owner stops writing
//! it. The run reports transport errors and 5xx on their own and fails for them anyway.
//!
//! # The read-back
//!
//! Every sheet with ledger entries is read whole with `listRows` pages of 500 (one request per
//! 500 rows, never one per row), and each row met is compared with its entry. Then:
//!
//! - **lost**: an acknowledged row that no page held;
//! - **wrong**: a row whose version or cells differ from the acknowledgement;
//! - **not deleted**: a row whose delete was acknowledged but which is still listed.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::client::Http;

/// What one row must look like after the run.
#[derive(Clone, Debug)]
pub struct Expect {
    /// The row's sheet.
    pub sheet: u64,
    /// The acknowledged state.
    pub state: Expected,
}

/// The acknowledged state of a row.
#[derive(Clone, Debug, PartialEq)]
pub enum Expected {
    /// The row exists with this version; cells as canonical JSON (absent when not tracked).
    Row {
        /// The version the last acknowledged write gave the row.
        version: u64,
        /// The cells as the acknowledgement rendered them, as canonical JSON.
        cells: Option<Box<str>>,
    },
    /// Its delete was acknowledged.
    Deleted,
    /// A write of it got no answer or a 5xx: its state is unknown.
    Uncertain,
}

/// Acknowledged writes by row id.
#[derive(Debug, Default)]
pub struct Ledger {
    rows: HashMap<u64, Expect>,
}

/// The canonical text of a cell map: serde_json's map is ordered by key, so equal maps give
/// equal text, and a string costs less memory than a `Value` per tracked row.
pub fn canonical(cells: &Map<String, Value>) -> Box<str> {
    serde_json::to_string(cells).expect("JSON").into_boxed_str()
}

impl Ledger {
    /// An acknowledged row state.
    pub fn acked(&mut self, sheet: u64, id: u64, version: u64, cells: Option<Box<str>>) {
        self.rows.insert(id, Expect { sheet, state: Expected::Row { version, cells } });
    }

    /// An acknowledged delete.
    pub fn deleted(&mut self, sheet: u64, id: u64) {
        self.rows.insert(id, Expect { sheet, state: Expected::Deleted });
    }

    /// A write whose outcome is unknown.
    pub fn uncertain(&mut self, sheet: u64, id: u64) {
        self.rows.insert(id, Expect { sheet, state: Expected::Uncertain });
    }

    /// Every entry.
    pub fn rows(&self) -> impl Iterator<Item = (u64, &Expect)> {
        self.rows.iter().map(|(id, e)| (*id, e))
    }

    /// The entry of a row.
    pub fn get(&self, id: u64) -> Option<&Expect> {
        self.rows.get(&id)
    }

    /// The version last acknowledged for a row.
    pub fn version(&self, id: u64) -> Option<u64> {
        match self.rows.get(&id)?.state {
            Expected::Row { version, .. } => Some(version),
            _ => None,
        }
    }

    /// Take in another ledger's entries (another virtual user's: rows never overlap).
    pub fn merge(&mut self, other: Ledger) {
        self.rows.extend(other.rows);
    }

    /// Entries.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// No entries.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// A row that is not as acknowledged.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// The sheet the row is in.
    pub sheet_id: u64,
    /// The row's id, as its write was acknowledged.
    pub row_id: u64,
    /// `lost`, `wrong` or `not_deleted`.
    pub problem: &'static str,
    /// The acknowledged version (none for a delete).
    pub expected_version: Option<u64>,
    /// The version read back (none when the row is gone).
    pub found_version: Option<u64>,
    /// The acknowledged cells, when they differ.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_cells: Option<Value>,
    /// The cells read back, when they differ.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub found_cells: Option<Value>,
}

/// The verdict.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verification {
    /// Rows with an acknowledged state that were checked (rows and deletes).
    pub checked: u64,
    /// Of those, rows whose delete was acknowledged.
    pub deletes_checked: u64,
    /// Rows left unchecked because a write of them got no answer or a 5xx.
    pub uncertain: u64,
    /// `listRows` requests the read-back took.
    pub requests: u64,
    /// Acknowledged rows that are gone.
    pub lost: u64,
    /// Rows whose version or cells differ from the acknowledgement.
    pub wrong: u64,
    /// Rows whose delete was acknowledged but that are still there.
    pub not_deleted: u64,
    /// The first findings (at most 100), for a person to look at.
    pub findings: Vec<Finding>,
}

impl Verification {
    /// Nothing acknowledged was lost or wrong.
    pub fn passed(&self) -> bool {
        self.lost == 0 && self.wrong == 0 && self.not_deleted == 0
    }

    fn found(&mut self, f: Finding) {
        match f.problem {
            "lost" => self.lost += 1,
            "not_deleted" => self.not_deleted += 1,
            _ => self.wrong += 1,
        }
        if self.findings.len() < 100 {
            self.findings.push(f);
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RowsPage {
    data: Vec<ListedRow>,
    next_cursor: Option<String>,
}

#[derive(Deserialize)]
struct ListedRow {
    id: u64,
    version: u64,
    cells: Map<String, Value>,
}

/// Read back every sheet the ledger names and compare.
///
/// # Errors
///
/// A page could not be read (transport error, or an error answer other than 429, which is
/// waited out).
pub async fn verify(http: &Http, ledger: &Ledger) -> anyhow::Result<Verification> {
    let mut by_sheet: BTreeMap<u64, Vec<(u64, &Expected)>> = BTreeMap::new();
    let mut v = Verification::default();
    for (&id, e) in &ledger.rows {
        if e.state == Expected::Uncertain {
            v.uncertain += 1;
        } else {
            by_sheet.entry(e.sheet).or_default().push((id, &e.state));
        }
    }
    for (sheet, entries) in by_sheet {
        let expected: HashMap<u64, &Expected> = entries.into_iter().collect();
        let mut seen = std::collections::HashSet::with_capacity(expected.len());
        let mut cursor: Option<String> = None;
        loop {
            let path = match &cursor {
                Some(c) => format!("/sheets/{sheet}/rows?limit=500&cursor={c}"),
                None => format!("/sheets/{sheet}/rows?limit=500"),
            };
            let page: RowsPage = http.get_json(&path).await?;
            v.requests += 1;
            for row in page.data {
                let Some(want) = expected.get(&row.id) else { continue };
                seen.insert(row.id);
                check_row(&mut v, sheet, &row, want);
            }
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        for (&id, want) in &expected {
            v.checked += 1;
            match want {
                Expected::Deleted => v.deletes_checked += 1,
                Expected::Row { version, cells } if !seen.contains(&id) => v.found(Finding {
                    sheet_id: sheet,
                    row_id: id,
                    problem: "lost",
                    expected_version: Some(*version),
                    found_version: None,
                    expected_cells: cells.as_deref().and_then(|c| serde_json::from_str(c).ok()),
                    found_cells: None,
                }),
                _ => {}
            }
        }
    }
    Ok(v)
}

fn check_row(v: &mut Verification, sheet: u64, row: &ListedRow, want: &Expected) {
    match want {
        Expected::Deleted => v.found(Finding {
            sheet_id: sheet,
            row_id: row.id,
            problem: "not_deleted",
            expected_version: None,
            found_version: Some(row.version),
            expected_cells: None,
            found_cells: None,
        }),
        Expected::Row { version, cells } => {
            let found = canonical(&row.cells);
            let cells_differ = cells.as_deref().is_some_and(|c| *c != *found);
            if *version != row.version || cells_differ {
                v.found(Finding {
                    sheet_id: sheet,
                    row_id: row.id,
                    problem: "wrong",
                    expected_version: Some(*version),
                    found_version: Some(row.version),
                    expected_cells: cells
                        .as_deref()
                        .filter(|_| cells_differ)
                        .and_then(|c| serde_json::from_str(c).ok()),
                    found_cells: cells_differ.then(|| Value::Object(row.cells.clone())),
                });
            }
        }
        Expected::Uncertain => {}
    }
}
