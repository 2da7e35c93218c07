//! What the requests do: the workloads, the `--mix` weights, and the virtual user that sends
//! them while keeping its rows' versions right.
//!
//! # Ownership of rows
//!
//! Every row a virtual user patches, updates or deletes is one it created itself (before the
//! level, untimed, through `bulkAdd`), so no two users ever write the same row and every
//! `version_conflict` is one the run asked for with `--conflict-rate`. Rows that were there
//! before the run are only read: a load test of a running server must not rewrite its data.
//! The user tracks the version of each of its rows from the acknowledgements, in the same
//! [`Ledger`] `--verify` checks afterwards.

use std::str::FromStr;

use awc::http::Method;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::client::{Answer, Http};
use super::data::{patch_cells, row_cells, write_row, SheetInfo};
use super::verify::{canonical, Ledger};

/// The kinds of request, and `mixed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// `listRows` pages of `--page-size`, each client walking its sheet with cursors.
    ReadPage,
    /// `getSheet`: the sheet, its columns and a first page of rows.
    GetSheet,
    /// `getRow` of the client's own rows (needs a server that has the route).
    GetRow,
    /// `patchRow` of one or two cells of the client's own rows.
    Patch,
    /// `bulkAdd` of `--bulk-size` new rows.
    BulkAdd,
    /// `bulkUpdate` of `--bulk-size` of the client's own rows (every cell replaced).
    BulkUpdate,
    /// `deleteRow` of rows the client created for it.
    Delete,
    /// `runReport`: the first page of the saved report.
    Report,
    /// A weighted draw per request from `--mix`.
    Mixed,
}

impl Workload {
    /// The name as the command line spells it.
    pub fn name(self) -> &'static str {
        match self {
            Workload::ReadPage => "read-page",
            Workload::GetSheet => "get-sheet",
            Workload::GetRow => "get-row",
            Workload::Patch => "patch",
            Workload::BulkAdd => "bulk-add",
            Workload::BulkUpdate => "bulk-update",
            Workload::Delete => "delete",
            Workload::Report => "report",
            Workload::Mixed => "mixed",
        }
    }
}

/// Weights of the request kinds of a `mixed` workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Mix {
    entries: Vec<(Workload, u32)>,
}

impl FromStr for Mix {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let mut entries: Vec<(Workload, u32)> = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, weight) = part
                .split_once('=')
                .ok_or_else(|| format!("`{part}`: expected NAME=WEIGHT (read-page=80)"))?;
            let w = <Workload as clap::ValueEnum>::from_str(name.trim(), false)
                .map_err(|_| format!("`{name}` is not a workload"))?;
            if w == Workload::Mixed {
                return Err("`mixed` cannot be part of a mix".into());
            }
            let weight: u32 = weight
                .trim()
                .parse()
                .map_err(|_| format!("`{part}`: the weight is not a count"))?;
            if entries.iter().any(|(e, _)| *e == w) {
                return Err(format!("`{name}` appears twice"));
            }
            if weight > 0 {
                entries.push((w, weight));
            }
        }
        if entries.is_empty() {
            return Err("a mix needs at least one workload with a weight above 0".into());
        }
        Ok(Mix { entries })
    }
}

impl Mix {
    /// Every request of one kind.
    pub fn single(w: Workload) -> Self {
        Mix { entries: vec![(w, 1)] }
    }

    /// The default of `--workload mixed`: mostly reads, some patches, a few bulk adds.
    pub fn default_mixed() -> Self {
        "read-page=80,patch=15,bulk-add=5".parse().expect("valid")
    }

    /// The kinds and their weights.
    pub fn entries(&self) -> &[(Workload, u32)] {
        &self.entries
    }

    /// Whether requests of `w` are drawn.
    pub fn contains(&self, w: Workload) -> bool {
        self.entries.iter().any(|(e, _)| *e == w)
    }

    /// The share of requests of `w`.
    pub fn share(&self, w: Workload) -> f64 {
        let total: u32 = self.entries.iter().map(|(_, n)| n).sum();
        let mine: u32 = self.entries.iter().filter(|(e, _)| *e == w).map(|(_, n)| n).sum();
        f64::from(mine) / f64::from(total)
    }

    /// Draw the next request's kind.
    pub fn pick(&self, rng: &mut impl Rng) -> Workload {
        if let [(only, _)] = self.entries.as_slice() {
            return *only;
        }
        let total: u32 = self.entries.iter().map(|(_, n)| n).sum();
        let mut x = rng.gen_range(0..total);
        for (w, n) in &self.entries {
            if x < *n {
                return *w;
            }
            x -= n;
        }
        unreachable!("x < total")
    }

    /// `read-page=80,patch=15` (as parsed).
    pub fn describe(&self) -> String {
        let parts: Vec<String> =
            self.entries.iter().map(|(w, n)| format!("{}={n}", w.name())).collect();
        parts.join(",")
    }
}

/// What every virtual user reads and nobody changes during a run.
#[derive(Debug)]
pub struct Settings {
    /// The sheets the load spreads over.
    pub sheets: Vec<SheetInfo>,
    /// The report of the `report` workload.
    pub report_id: Option<u64>,
    /// What requests to send.
    pub mix: Mix,
    /// Rows per page.
    pub page_size: u64,
    /// Rows per bulk request.
    pub bulk_size: u64,
    /// Share of patches sent stale on purpose.
    pub conflict_rate: f64,
    /// Rows each client owns for patches and updates.
    pub rows_per_client: u64,
    /// Keep acknowledged cells for `--verify` (versions are kept anyway).
    pub track_cells: bool,
    /// Headers every load request carries besides the key (`--header`).
    pub headers: Vec<(String, String)>,
}

impl Settings {
    /// Rows a client owns before the level starts.
    fn own_rows_wanted(&self) -> usize {
        let mut n = 0;
        if self.mix.contains(Workload::Patch) || self.mix.contains(Workload::GetRow) {
            n = self.rows_per_client;
        }
        if self.mix.contains(Workload::BulkUpdate) {
            n = n.max(self.bulk_size);
        }
        n as usize
    }
}

/// What one request came to, for the statistics.
#[derive(Debug, Default)]
pub struct Outcome {
    /// HTTP status, 0 for a transport error.
    pub status: u16,
    /// The `errorCode` of an error answer, or a short transport error text.
    pub error: Option<String>,
    /// Rows read (pages, report rows, a row).
    pub rows_read: u64,
    /// Rows written (added, patched, updated, deleted) and acknowledged.
    pub rows_written: u64,
    /// A deliberate stale patch got its `version_conflict`.
    pub expected_conflict: bool,
    /// Failed items of a 200 bulk answer, by `errorCode`.
    pub item_errors: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Page {
    data: Vec<IgnoredAny>,
    next_cursor: Option<String>,
}

#[derive(Deserialize)]
struct SheetPage {
    rows: Page,
}

#[derive(Deserialize)]
struct ReportPage {
    data: ReportRows,
}

#[derive(Deserialize)]
struct ReportRows {
    rows: Vec<IgnoredAny>,
}

/// A row in a write's acknowledgement.
#[derive(Deserialize)]
struct RowAck {
    id: u64,
    version: u64,
    cells: Map<String, Value>,
}

#[derive(Deserialize)]
struct BulkAck {
    results: Vec<BulkItem>,
}

/// A bulk acknowledgement read for its outcome only.
#[derive(Deserialize)]
struct BulkOutcomes {
    results: Vec<ItemOutcome>,
}

/// `succeededCount` and `failedCount` of a BulkWriteResponse whose last fields follow its
/// `results`, read from the text after the last `]`: an answer of 2000 rows is not scanned to
/// learn that all of them succeeded. `None` (read it all) when the counts are not there.
///
/// A match is the field itself: inside a JSON string every `"` is escaped, so `"name":` does
/// not occur there, and after the last `]` no item of `results` is left.
fn tail_counts(body: &[u8]) -> Option<(u64, u64)> {
    let tail = &body[body.iter().rposition(|b| *b == b']')?..];
    let count = |name: &str| -> Option<u64> {
        let key = format!("\"{name}\":");
        let at = tail.windows(key.len()).position(|w| w == key.as_bytes())? + key.len();
        let digits = tail[at..].iter().take_while(|b| b.is_ascii_digit()).count();
        std::str::from_utf8(&tail[at..at + digits]).ok()?.parse().ok()
    };
    Some((count("succeededCount")?, count("failedCount")?))
}

#[derive(Deserialize)]
struct ItemOutcome {
    row: Option<IgnoredAny>,
    error: Option<ItemError>,
}

#[derive(Deserialize)]
struct BulkItem {
    row: Option<RowAck>,
    error: Option<ItemError>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ItemError {
    error_code: String,
    #[serde(default)]
    detail: Option<Value>,
}

#[derive(Deserialize)]
struct ConflictEnvelope {
    detail: ConflictDetail,
}

#[derive(Deserialize)]
struct ConflictDetail {
    current: RowAck,
}

/// How many rows a delete client creates at a time when its supply runs out.
const DELETE_REFILL: u64 = 200;

/// One virtual user: its rows, its position in its sheet, its random draws.
#[derive(Debug)]
pub struct VirtualUser {
    /// Its number (0-based); it works on sheet `index % sheets`.
    pub index: usize,
    sheet: usize,
    rng: StdRng,
    /// A counter that makes every generated text unique.
    seq: u64,
    /// Rows it patches and updates.
    own: Vec<u64>,
    /// Rows it created to delete.
    spare: Vec<u64>,
    cursor: Option<String>,
    /// Acknowledged writes (versions always; cells with `--verify`).
    pub ledger: Ledger,
    /// Untimed `bulkAdd`s that refilled its supply of rows during the run.
    pub refills: u64,
}

impl VirtualUser {
    /// User `index`, with its own deterministic random sequence.
    pub fn new(index: usize, sheets: usize) -> Self {
        VirtualUser {
            index,
            sheet: index % sheets.max(1),
            rng: StdRng::seed_from_u64(0x5eed_0000 + index as u64),
            seq: 0,
            own: Vec::new(),
            spare: Vec::new(),
            cursor: None,
            ledger: Ledger::default(),
            refills: 0,
        }
    }

    /// One of its own rows and that row's sheet, once it has made some.
    pub fn some_row(&self, s: &Settings) -> Option<(u64, u64)> {
        self.own.first().map(|id| (self.sheet(s).id, *id))
    }

    fn sheet<'a>(&self, s: &'a Settings) -> &'a SheetInfo {
        &s.sheets[self.sheet]
    }

    /// Create rows through `bulkAdd` (untimed setup), returning their ids.
    async fn create_rows(&mut self, http: &Http, s: &Settings, n: u64) -> anyhow::Result<Vec<u64>> {
        let sheet = self.sheet(s).clone();
        let mut ids = Vec::with_capacity(n as usize);
        while (ids.len() as u64) < n {
            let batch = (n - ids.len() as u64).min(2000);
            let rows: Vec<Value> = (0..batch)
                .map(|_| {
                    self.seq += 1;
                    json!({"cells": row_cells(&sheet.columns, self.seq, &mut self.rng)})
                })
                .collect();
            let answer = http
                .control(
                    Method::POST,
                    &format!("/sheets/{}/rows:bulkAdd", sheet.id),
                    Some(&json!({ "rows": rows })),
                )
                .await?;
            let ack: BulkAck = answer.parse()?;
            for item in ack.results {
                match (item.row, item.error) {
                    (Some(row), _) => {
                        self.record(sheet.id, &row, s);
                        ids.push(row.id);
                    }
                    (None, e) => anyhow::bail!(
                        "setting up rows in sheet {}: an item failed with {}",
                        sheet.id,
                        e.map_or("no error code".into(), |e| e.error_code)
                    ),
                }
            }
        }
        Ok(ids)
    }

    /// Before a level: create the rows its requests will write, untimed. `deletes` is how many
    /// deletes it expects to send (a guess for `--duration`; it refills when it runs out).
    ///
    /// # Errors
    ///
    /// A setup request failed.
    pub async fn prepare(&mut self, http: &Http, s: &Settings, deletes: u64) -> anyhow::Result<()> {
        let wanted = s.own_rows_wanted();
        if self.own.len() < wanted {
            let more = self.create_rows(http, s, (wanted - self.own.len()) as u64).await?;
            self.own.extend(more);
        }
        if s.mix.contains(Workload::Delete) && (self.spare.len() as u64) < deletes {
            let more = self.create_rows(http, s, deletes - self.spare.len() as u64).await?;
            self.spare.extend(more);
        }
        Ok(())
    }

    /// Draw the next request's kind, and make sure it has rows for it (an untimed refill when
    /// its supply ran out).
    ///
    /// # Errors
    ///
    /// A refill failed.
    pub async fn next(&mut self, http: &Http, s: &Settings) -> anyhow::Result<Workload> {
        let w = s.mix.pick(&mut self.rng);
        let refill = match w {
            Workload::Delete if self.spare.is_empty() => Some(DELETE_REFILL),
            Workload::Patch | Workload::GetRow | Workload::BulkUpdate
                if self.own.len() < s.own_rows_wanted() =>
            {
                Some((s.own_rows_wanted() - self.own.len()) as u64)
            }
            _ => None,
        };
        if let Some(n) = refill {
            let more = self.create_rows(http, s, n).await?;
            if w == Workload::Delete { &mut self.spare } else { &mut self.own }.extend(more);
            self.refills += 1;
        }
        Ok(w)
    }

    fn record(&mut self, sheet: u64, row: &RowAck, s: &Settings) {
        let cells = s.track_cells.then(|| canonical(&row.cells));
        self.ledger.acked(sheet, row.id, row.version, cells);
    }

    /// A write of `id` whose outcome is unknown: never write it again, never check it.
    fn lose_track(&mut self, sheet: u64, id: u64) {
        self.own.retain(|r| *r != id);
        self.ledger.uncertain(sheet, id);
    }

    /// Send one request of kind `w`.
    pub async fn send(&mut self, w: Workload, http: &Http, s: &Settings) -> Outcome {
        match w {
            Workload::ReadPage => self.read_page(http, s).await,
            Workload::GetSheet => {
                let path = format!("/sheets/{}?limit={}", self.sheet(s).id, s.page_size);
                let a = http.send(Method::GET, &path, None).await;
                read(&a, |p: SheetPage| p.rows.data.len())
            }
            Workload::GetRow => {
                let id = self.own[self.rng.gen_range(0..self.own.len())];
                let path = format!("/sheets/{}/rows/{id}", self.sheet(s).id);
                let a = http.send(Method::GET, &path, None).await;
                read(&a, |_: IgnoredAny| 1)
            }
            Workload::Report => {
                let id = s.report_id.unwrap_or_default();
                let path = format!("/reports/{id}/run?limit={}", s.page_size);
                let a = http.send(Method::POST, &path, None).await;
                read(&a, |p: ReportPage| p.data.rows.len())
            }
            Workload::Patch => self.patch(http, s).await,
            Workload::BulkAdd => self.bulk_add(http, s).await,
            Workload::BulkUpdate => self.bulk_update(http, s).await,
            Workload::Delete => self.delete(http, s).await,
            Workload::Mixed => unreachable!("a mix never draws `mixed`"),
        }
    }

    async fn read_page(&mut self, http: &Http, s: &Settings) -> Outcome {
        let sheet = self.sheet(s).id;
        let path = match &self.cursor {
            Some(c) => format!("/sheets/{sheet}/rows?limit={}&cursor={c}", s.page_size),
            None => format!("/sheets/{sheet}/rows?limit={}", s.page_size),
        };
        let a = http.send(Method::GET, &path, None).await;
        let mut next = None;
        let out = read(&a, |p: Page| {
            next = p.next_cursor;
            p.data.len()
        });
        // At the end of the sheet (or after an error) the walk starts over.
        self.cursor = next;
        out
    }

    async fn patch(&mut self, http: &Http, s: &Settings) -> Outcome {
        let sheet = self.sheet(s).clone();
        let id = self.own[self.rng.gen_range(0..self.own.len())];
        let version = self.ledger.version(id).unwrap_or(1);
        let stale = s.conflict_rate > 0.0 && self.rng.gen_bool(s.conflict_rate);
        // A version other than the current one; an older one where there is one.
        let sent = match (stale, version) {
            (false, v) => v,
            (true, 1) => 2,
            (true, v) => v - 1,
        };
        self.seq += 1;
        let body =
            json!({"version": sent, "cells": patch_cells(&sheet.columns, self.seq, &mut self.rng)});
        let path = format!("/sheets/{}/rows/{id}", sheet.id);
        let a = http.send(Method::PATCH, &path, Some(body.to_string().into_bytes())).await;
        let mut out = outcome(&a);
        match a.status {
            200 => match a.parse::<RowAck>() {
                Ok(row) => {
                    self.record(sheet.id, &row, s);
                    out.rows_written = 1;
                    if stale {
                        out.error = Some("stale_version_accepted".into());
                    }
                }
                Err(_) => out.error = Some("unreadable_answer".into()),
            },
            409 if out.error.as_deref() == Some("version_conflict") => {
                if stale {
                    out.expected_conflict = true;
                    out.error = None;
                } else if let Ok(c) = a.parse::<ConflictEnvelope>() {
                    // Someone else wrote the row: go on from its current state.
                    self.record(sheet.id, &c.detail.current, s);
                }
            }
            0 | 500.. => self.lose_track(sheet.id, id),
            _ => {}
        }
        out
    }

    async fn bulk_add(&mut self, http: &Http, s: &Settings) -> Outcome {
        let sheet = self.sheet(s).clone();
        let mut body = b"{\"rows\":[".to_vec();
        for i in 0..s.bulk_size {
            if i > 0 {
                body.push(b',');
            }
            self.seq += 1;
            write_row(&mut body, &sheet.columns, self.seq, &mut self.rng);
        }
        body.extend_from_slice(b"]}");
        let path = format!("/sheets/{}/rows:bulkAdd", sheet.id);
        let a = http.send(Method::POST, &path, Some(body)).await;
        let mut out = outcome(&a);
        if a.status == 200 && !s.track_cells {
            if let Some((succeeded, 0)) = tail_counts(&a.body) {
                if succeeded == s.bulk_size {
                    out.rows_written += succeeded;
                    return out;
                }
            }
            // Nothing to keep of the rows: each is skipped, not built.
            match a.parse::<BulkOutcomes>() {
                Ok(ack) => {
                    for item in ack.results {
                        match item.row {
                            Some(_) => out.rows_written += 1,
                            None => out.item_errors.push(item_code(item.error)),
                        }
                    }
                }
                Err(_) => out.error = Some("unreadable_answer".into()),
            }
        } else if a.status == 200 {
            match a.parse::<BulkAck>() {
                Ok(ack) => {
                    for item in ack.results {
                        match (item.row, item.error) {
                            (Some(row), _) => {
                                // Added rows are kept only to be checked by --verify: nobody
                                // writes them again.
                                self.record(sheet.id, &row, s);
                                out.rows_written += 1;
                            }
                            (None, e) => out.item_errors.push(item_code(e)),
                        }
                    }
                }
                Err(_) => out.error = Some("unreadable_answer".into()),
            }
        }
        out
    }

    async fn bulk_update(&mut self, http: &Http, s: &Settings) -> Outcome {
        let sheet = self.sheet(s).clone();
        let n = (s.bulk_size as usize).min(self.own.len());
        let start = self.rng.gen_range(0..self.own.len());
        let ids: Vec<u64> = (0..n).map(|i| self.own[(start + i) % self.own.len()]).collect();
        let items: Vec<Value> = ids
            .iter()
            .map(|&id| {
                self.seq += 1;
                json!({"id": id, "version": self.ledger.version(id).unwrap_or(1),
                       "cells": row_cells(&sheet.columns, self.seq, &mut self.rng)})
            })
            .collect();
        let body = json!({ "rows": items }).to_string().into_bytes();
        let path = format!("/sheets/{}/rows:bulkUpdate", sheet.id);
        let a = http.send(Method::POST, &path, Some(body)).await;
        let mut out = outcome(&a);
        match a.status {
            200 => match a.parse::<BulkAck>() {
                Ok(ack) => {
                    for (item, &id) in ack.results.into_iter().zip(&ids) {
                        match (item.row, item.error) {
                            (Some(row), _) => {
                                self.record(sheet.id, &row, s);
                                out.rows_written += 1;
                            }
                            (None, e) => {
                                let current = e
                                    .as_ref()
                                    .and_then(|e| e.detail.as_ref())
                                    .and_then(|d| d.get("current"))
                                    .and_then(|c| serde_json::from_value::<RowAck>(c.clone()).ok());
                                match current {
                                    Some(row) => self.record(sheet.id, &row, s),
                                    None => self.lose_track(sheet.id, id),
                                }
                                out.item_errors.push(item_code(e));
                            }
                        }
                    }
                }
                Err(_) => out.error = Some("unreadable_answer".into()),
            },
            0 | 500.. => {
                for id in ids {
                    self.lose_track(sheet.id, id);
                }
            }
            _ => {}
        }
        out
    }

    async fn delete(&mut self, http: &Http, s: &Settings) -> Outcome {
        let sheet = self.sheet(s).id;
        let id = self.spare.pop().expect("next() refilled the supply");
        let a = http.send(Method::DELETE, &format!("/sheets/{sheet}/rows/{id}"), None).await;
        let mut out = outcome(&a);
        match a.status {
            204 => {
                self.ledger.deleted(sheet, id);
                out.rows_written = 1;
            }
            0 | 500.. => self.ledger.uncertain(sheet, id),
            // Refused (429, say): nothing happened, the row can be deleted later.
            _ => self.spare.push(id),
        }
        out
    }
}

fn item_code(e: Option<ItemError>) -> String {
    e.map_or_else(|| "unknown".into(), |e| e.error_code)
}

/// Status and error code of an answer.
fn outcome(a: &Answer) -> Outcome {
    let error = match (&a.transport_error, a.is_success()) {
        (Some(e), _) => Some(transport_class(e)),
        (None, true) => None,
        (None, false) => Some(a.error_code().unwrap_or_else(|| "no_error_envelope".into())),
    };
    Outcome { status: a.status, error, ..Outcome::default() }
}

/// A read: rows counted from a 2xx body.
fn read<T: for<'de> Deserialize<'de>>(a: &Answer, rows: impl FnOnce(T) -> usize) -> Outcome {
    let mut out = outcome(a);
    if a.is_success() {
        match a.parse::<T>() {
            Ok(body) => out.rows_read = rows(body) as u64,
            Err(_) => out.error = Some("unreadable_answer".into()),
        }
    }
    out
}

/// Transport errors grouped by kind, so a table of them stays short.
fn transport_class(e: &str) -> String {
    let e = e.to_ascii_lowercase();
    let class = if e.contains("timeout") || e.contains("timed out") {
        "timeout"
    } else if e.contains("connect") || e.contains("refused") {
        "connect_failed"
    } else if e.contains("body") || e.contains("payload") {
        "body_broken"
    } else {
        "transport_error"
    };
    class.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mix_parses_names_and_weights_and_draws_by_weight() {
        let mix: Mix = "read-page=80,patch=15,bulk-add=5".parse().unwrap();
        assert_eq!(mix.describe(), "read-page=80,patch=15,bulk-add=5");
        assert!((mix.share(Workload::Patch) - 0.15).abs() < 1e-9);
        let mut rng = StdRng::seed_from_u64(1);
        let reads = (0..10_000).filter(|_| mix.pick(&mut rng) == Workload::ReadPage).count();
        assert!((7_500..8_500).contains(&reads), "{reads}");
        for bad in ["", "read-page", "nope=1", "mixed=1", "patch=x", "patch=1,patch=2", "patch=0"] {
            assert!(bad.parse::<Mix>().is_err(), "{bad} parses");
        }
    }

    #[test]
    fn bulk_counts_are_read_from_the_tail_only_when_they_follow_the_results() {
        let row = r#"{"id":1,"cells":{"1":"]\"succeededCount\":9 ]"},"version":1}"#;
        let answer = format!(
            r#"{{"results":[{{"index":0,"status":"succeeded","row":{row},"error":null}}],"succeededCount":1,"failedCount":0,"requestId":"req_1"}}"#
        );
        assert_eq!(tail_counts(answer.as_bytes()), Some((1, 0)));
        let failed = answer.replace(r#""failedCount":0"#, r#""failedCount":12"#);
        assert_eq!(tail_counts(failed.as_bytes()), Some((1, 12)));
        // Counts before the results, or none: the whole answer is read instead.
        let first = r#"{"succeededCount":1,"failedCount":0,"results":[{"index":0}]}"#;
        assert_eq!(tail_counts(first.as_bytes()), None);
        assert_eq!(tail_counts(b"{\"results\":[]}"), None);
        assert_eq!(tail_counts(b""), None);
    }
}
