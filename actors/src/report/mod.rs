//! The [`ReportRunner`]: runs saved reports over their source sheets and pages the result.
//!
//! # A run, step by step
//!
//! 1. **Parse** the saved definition ([`definition`]). Definitions are saved unchecked, so a bad
//!    one fails here with `report_compile_failed`, never with a 500.
//! 2. **Access**: each listed source the caller cannot read (key scope ∩ the key owner's live
//!    access, decided by the caller-supplied predicate), or that no longer exists, is dropped
//!    and only counted (`sourcesOmittedForAccess`). Nothing of it is read afterwards.
//! 3. **Snapshot** every readable source: its latest published [`SheetSnapshot`], an O(1) copy
//!    of its persistent row map as of a durable LSN. No sheet actor is asked or held while rows
//!    are scanned; writers keep going on their own copy.
//! 4. **Compile** the definition against the readable sources' columns into a [`QueryPlan`]
//!    ([`compile`]): unknown columns, `sum` of text and the like fail here, before a row is read.
//! 5. **Caps**: more sources listed than [`Caps::max_sources`], or more rows in the readable
//!    sources than [`Caps::max_scanned_rows`], fail with `report_cap_exceeded`. Both are decided
//!    from counts, before the scan.
//! 6. **Run** the plan on a blocking thread: scan, filter, sort, group, aggregate, producing
//!    the ordered result, or take it from the [result cache](#result-cache). The scan reads the
//!    sources' [columns kept for scanning](#columns-kept-for-scanning) ([`scan`]); with the
//!    column cache off, it parses the rows ([`run`], the reference both are tested against).
//! 7. **Cut** the page (the snapshots are durable, so nothing needs waiting for).
//!
//! The order of checks is the contract's: the HTTP layer answers 404 and 402 before sending
//! [`RunReport`]; this actor answers 422 (steps 1 and 4) before 413 (step 5).
//!
//! # Paging
//!
//! A result has a total order (see [`run`]), and a page is `limit` rows from an offset. Each
//! cached result gets a random run id, which the cursor carries with the offset: the next page
//! of that run is cut from the **same** result, so pages neither skip nor repeat even when
//! sources change between them (the run reads as of its first page; a new run without a cursor
//! sees the changes). A run is continued only while its report, key, definition and set of
//! readable sources are unchanged, so a source the caller can no longer read never leaks
//! through a pinned result; otherwise, or once the result has left the cache, the next page is
//! cut from a fresh run at the same offset.
//!
//! # Result cache
//!
//! Paging through a large report would rescan every source per page. So the runner keeps the
//! whole ordered result of recent runs, keyed by everything the result depends on: the report
//! id, the API key id, each readable source with the LSN its snapshot reflects, and a SHA-256 of
//! the definition. A page request whose snapshots show the same sources at the same LSNs reuses
//! the result; any write to a source (new LSN), a change of access (another set of readable
//! sources) or another key misses. Entries live [`CACHE_TTL`] (30 s) after their last use and at most
//! [`CACHE_ENTRIES`] are kept (the oldest is dropped first). A flat result holds row
//! references into the snapshots (16 bytes per matching row; the rows themselves are shared
//! with the sheet's persistent map), so an entry costs little beyond what the sheets already
//! hold, except that it keeps the snapshot's version of rows written since alive until it
//! expires. Aggregated results hold their (few) output rows.
//!
//! # Columns kept for scanning
//!
//! A run that misses the result cache reads only a few columns of every row, and reports run
//! again and again over the same sheets. So the runner keeps, per sheet, the cells of the
//! columns its reports read as typed vectors ([`columns`]): built on a sheet's first run (one
//! parse of its rows), brought up to each later run's snapshot by re-reading only the rows that
//! differ, dropped least recently used first beyond a byte budget ([`Caps::column_cache_bytes`],
//! `--report-column-cache-mb`). A run locks the kept columns of its sources (in sheet id order,
//! so two runs never wait on each other in a cycle) while it syncs and scans them, on every
//! core ([`scan`]). A definition listing a sheet twice is scanned row by row.
//!
//! # Inside
//!
//! Each step depends only on the steps before it: [`definition`] (the saved JSON, and the
//! `report_compile_failed` error every step shares) ← [`compile`] (a definition against its
//! [`Source`]s) ← [`run`] (a plan over the sources' rows) ← [`columns`] (cells kept for
//! scanning) ← [`scan`] (a plan over kept columns) ← this module (the actor and its caches).

pub mod columns;
pub mod compile;
pub mod definition;
pub mod run;
pub mod scan;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::log::Lsn;
use actix::prelude::*;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::error::{Error, ReportErrorKind, Result};
use crate::model::{ColumnId, KeyId, ReportId, SheetId};
use crate::registry::SheetRegistry;
use crate::sheet::SheetSnapshot;
pub use columns::{ColumnCache, ColumnCacheStats, SheetColumns};
pub use compile::Source;
pub use compile::{Mode, OutputColumn, QueryPlan};
pub use definition::Definition;
pub use run::RunResult;

/// How long a run's result is reused for later pages.
pub const CACHE_TTL: Duration = Duration::from_secs(30);
/// Most results kept at once.
pub const CACHE_ENTRIES: usize = 16;

/// The limits of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Most sources a definition may list (`--report-max-sources`).
    pub max_sources: usize,
    /// Most rows a run may read from its readable sources (`--report-max-scanned-rows`).
    pub max_scanned_rows: u64,
    /// Bytes the runner may keep in columns for scanning, across sheets
    /// (`--report-column-cache-mb`; 0: off, every run parses rows). A run bringing another
    /// value than the runner's sets it (dropping sheets until the rest fit).
    pub column_cache_bytes: usize,
}

impl Default for Caps {
    /// 50 sources, 1,000,000 rows, [`columns::DEFAULT_BUDGET`].
    fn default() -> Self {
        Caps {
            max_sources: 50,
            max_scanned_rows: 1_000_000,
            column_cache_bytes: columns::DEFAULT_BUDGET,
        }
    }
}

/// Refuse a run over a cap: too many sources listed, or too many rows to scan in the readable
/// sources.
///
/// # Errors
///
/// `report_cap_exceeded` with `detail: {"cap", "limit", "value"}`.
pub fn check_caps(def: &Definition, sources: &[Source], caps: Caps) -> Result<()> {
    let listed = def.sources.len();
    if listed > caps.max_sources {
        return Err(Error::Report {
            kind: ReportErrorKind::CapExceeded,
            message: format!(
                "The report lists {listed} sources; a run may read at most {}.",
                caps.max_sources
            ),
            detail: json!({"cap": "maxSources", "limit": caps.max_sources, "value": listed}),
        });
    }
    let rows: u64 = sources.iter().map(|s| s.rows.len() as u64).sum();
    if rows > caps.max_scanned_rows {
        return Err(Error::Report {
            kind: ReportErrorKind::CapExceeded,
            message: format!(
                "The report would scan {rows} rows; a run may scan at most {}.",
                caps.max_scanned_rows
            ),
            detail: json!({"cap": "maxScannedRows", "limit": caps.max_scanned_rows, "value": rows}),
        });
    }
    Ok(())
}

/// The whole pipeline on given sources, without actors: parse, compile, caps, run.
/// `sources` are the readable sources in definition order.
///
/// # Errors
///
/// `report_compile_failed` or `report_cap_exceeded`.
pub fn evaluate(definition: &Value, sources: &[Source], caps: Caps) -> Result<RunResult> {
    let def = definition::parse(definition)?;
    let plan = compile::compile(&def, sources)?;
    check_caps(&def, sources, caps)?;
    Ok(run::execute(&plan, sources))
}

/// Run `plan` over `sources` (the readable sources, in definition order), reading their cells
/// from the columns `cache` keeps for them ([module docs](#columns-kept-for-scanning)), or from
/// the rows when the cache is off or a sheet is listed twice.
pub fn run_plan(plan: &QueryPlan, sources: &[Source], cache: &ColumnCache) -> RunResult {
    let mut order: Vec<usize> = (0..sources.len()).collect();
    order.sort_unstable_by_key(|i| sources[*i].sheet_id);
    let repeated = order.windows(2).any(|w| sources[w[0]].sheet_id == sources[w[1]].sheet_id);
    let slots: Option<Vec<(usize, columns::Slot)>> =
        order.iter().map(|&i| Some((i, cache.slot(sources[i].sheet_id)?))).collect();
    let slots = match slots {
        Some(slots) if !repeated && !sources.is_empty() => slots,
        _ => return run::execute(plan, sources),
    };
    // Locked in sheet id order: two runs never wait on each other in a cycle.
    let mut guards: Vec<_> = slots.iter().map(|(i, slot)| (*i, columns::lock_slot(slot))).collect();
    for (i, kept) in &mut guards {
        let source = &sources[*i];
        let needed: Vec<ColumnId> = plan.lookup[*i].iter().flatten().copied().collect();
        match kept.as_mut() {
            Some(kept) => {
                kept.sync(&source.rows);
                kept.ensure(&needed);
            }
            None => **kept = Some(SheetColumns::build(&source.rows, &needed)),
        }
    }
    let mut by_source: Vec<Option<&SheetColumns>> = vec![None; sources.len()];
    for (i, kept) in &guards {
        by_source[*i] = kept.as_ref();
    }
    let kept: Vec<&SheetColumns> = by_source.into_iter().flatten().collect();
    let result = scan::execute_kept(plan, sources, &kept);
    let sizes: Vec<(SheetId, usize)> = guards
        .iter()
        .map(|(i, kept)| (sources[*i].sheet_id, kept.as_ref().map_or(0, |k| k.heap_bytes())))
        .collect();
    drop(guards);
    for (sheet, bytes) in sizes {
        cache.note(sheet, bytes);
    }
    result
}

/// Who may read a source: `true` when the caller can read the sheet.
pub type CanRead = Box<dyn Fn(SheetId) -> bool + Send>;

/// Run a saved report and return one page of its result.
#[derive(Message)]
#[rtype(result = "Result<RunPage>")]
pub struct RunReport {
    /// The report's id: part of the result cache's key.
    pub report_id: ReportId,
    /// Its saved definition.
    pub definition: Value,
    /// The API key running it (results are cached per key).
    pub key_id: KeyId,
    /// Whether the caller can read a sheet (key scope ∩ the owner's live access).
    pub can_read: CanRead,
    /// Position of the page's first row in the result.
    pub offset: u64,
    /// The run to continue (from the cursor), if any.
    pub run: Option<u32>,
    /// Rows per page.
    pub limit: usize,
    /// The run's caps.
    pub caps: Caps,
}

/// One page of a run.
#[derive(Clone, Debug)]
pub struct RunPage {
    /// Flat or aggregated.
    pub mode: Mode,
    /// Output columns (ids are positions plus one).
    pub columns: Vec<OutputColumn>,
    /// The page's rows: a value per output column.
    pub rows: Vec<Vec<Value>>,
    /// Rows read from readable sources.
    pub scanned_rows: u64,
    /// Rows or groups in the whole result.
    pub total_matched: u64,
    /// Sources skipped as unreadable or gone.
    pub sources_omitted: u64,
    /// Offset of the next page, when more rows follow.
    pub next_offset: Option<u64>,
    /// The run this page was cut from; the next page's cursor names it.
    pub run: u32,
}

/// How the result cache has done since start (for tests and metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, MessageResponse)]
pub struct CacheStats {
    /// Runs answered from the cache.
    pub hits: u64,
    /// Runs that scanned.
    pub misses: u64,
    /// Results held now.
    pub entries: usize,
}

/// Ask for the [`CacheStats`].
#[derive(Message)]
#[rtype(result = "CacheStats")]
pub struct GetCacheStats;

/// What a cached result depends on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct CacheKey {
    report_id: ReportId,
    key_id: KeyId,
    /// Each readable source and the LSN its snapshot reflects, in definition order.
    sources: Vec<(SheetId, Lsn)>,
    /// SHA-256 of the definition's JSON text.
    definition: [u8; 32],
}

/// Recent results (see the module docs). Time is passed in, so tests need no sleeping.
struct ResultCache {
    /// Each result with when it was last used and its run id.
    entries: HashMap<CacheKey, (Instant, Arc<RunResult>, u32)>,
    ttl: Duration,
    capacity: usize,
    stats: CacheStats,
}

impl ResultCache {
    fn new(ttl: Duration, capacity: usize) -> Self {
        ResultCache { entries: HashMap::new(), ttl, capacity, stats: CacheStats::default() }
    }

    fn get(&mut self, key: &CacheKey, now: Instant) -> Option<(Arc<RunResult>, u32)> {
        let ttl = self.ttl;
        let found = match self.entries.get_mut(key) {
            Some((at, r, run)) if now.duration_since(*at) < ttl => {
                *at = now;
                Some((r.clone(), *run))
            }
            Some(_) => {
                self.entries.remove(key);
                None
            }
            None => None,
        };
        match found {
            Some(_) => self.stats.hits += 1,
            None => self.stats.misses += 1,
        }
        found
    }

    /// The result of run `run`, if it is still cached and was made for the same report, key,
    /// definition and readable sources (at any LSN): the next page of a run is cut from it.
    fn continue_run(
        &mut self,
        run: u32,
        same: impl Fn(&CacheKey) -> bool,
        now: Instant,
    ) -> Option<Arc<RunResult>> {
        let ttl = self.ttl;
        let (_, (at, result, _)) = self
            .entries
            .iter_mut()
            .find(|(k, (at, _, r))| *r == run && same(k) && now.duration_since(*at) < ttl)?;
        *at = now;
        self.stats.hits += 1;
        Some(result.clone())
    }

    /// Keep a result; returns its run id (random, never 0, so cursors from another process or
    /// another run do not name it by accident).
    fn put(&mut self, key: CacheKey, result: Arc<RunResult>, now: Instant) -> u32 {
        let ttl = self.ttl;
        self.entries.retain(|_, (at, _, _)| now.duration_since(*at) < ttl);
        while self.entries.len() >= self.capacity {
            let Some(oldest) =
                self.entries.iter().min_by_key(|(_, (at, _, _))| *at).map(|(k, _)| k.clone())
            else {
                break;
            };
            self.entries.remove(&oldest);
        }
        let run = rand::random::<u32>().max(1);
        if self.capacity > 0 {
            self.entries.insert(key, (now, result, run));
        }
        run
    }

    fn stats(&self) -> CacheStats {
        CacheStats { entries: self.entries.len(), ..self.stats }
    }
}

/// Runs saved reports. Holds no sheet data of its own: it reads the sheets' published
/// snapshots, and keeps recent results in its cache.
pub struct ReportRunner {
    sheets: SheetRegistry,
    cache: Arc<Mutex<ResultCache>>,
    columns: Arc<ColumnCache>,
}

impl ReportRunner {
    /// A runner over the sheets of `sheets`.
    pub fn new(sheets: SheetRegistry) -> Self {
        ReportRunner {
            sheets,
            cache: Arc::new(Mutex::new(ResultCache::new(CACHE_TTL, CACHE_ENTRIES))),
            columns: Arc::new(ColumnCache::new(columns::DEFAULT_BUDGET)),
        }
    }
}

/// Ask for the [`ColumnCacheStats`] of the columns kept for scanning.
#[derive(Message)]
#[rtype(result = "ColumnCacheStats")]
pub struct GetColumnCacheStats;

impl Handler<GetColumnCacheStats> for ReportRunner {
    type Result = MessageResult<GetColumnCacheStats>;

    fn handle(&mut self, _: GetColumnCacheStats, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.columns.stats())
    }
}

impl Actor for ReportRunner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Kept columns of sheets no report reads any more go without waiting for another run.
        ctx.run_interval(Duration::from_secs(60), |runner, _| runner.columns.expire());
    }
}

fn lock(cache: &Mutex<ResultCache>) -> std::sync::MutexGuard<'_, ResultCache> {
    // The cache holds no invariant a panic could break half-way: keep using it.
    cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Handler<RunReport> for ReportRunner {
    type Result = ResponseFuture<Result<RunPage>>;

    fn handle(&mut self, msg: RunReport, _: &mut Self::Context) -> Self::Result {
        let def = match definition::parse(&msg.definition) {
            Ok(d) => d,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        // Durable snapshots, taken now: nothing read from them needs a wait.
        let mut readable: Vec<(SheetId, Arc<SheetSnapshot>)> = Vec::new();
        for &id in &def.sources {
            if let Some(snapshot) = self.sheets.snapshot(id).filter(|_| (msg.can_read)(id)) {
                readable.push((id, snapshot));
            }
        }
        let sources_omitted = (def.sources.len() - readable.len()) as u64;
        let digest: [u8; 32] = Sha256::digest(msg.definition.to_string().as_bytes()).into();
        let cache = self.cache.clone();
        let kept = self.columns.clone();
        if kept.stats().budget != msg.caps.column_cache_bytes {
            kept.set_budget(msg.caps.column_cache_bytes);
        }
        if let Some(run) = msg.run {
            let ids: Vec<SheetId> = readable.iter().map(|(id, _)| *id).collect();
            let same = |k: &CacheKey| {
                k.report_id == msg.report_id
                    && k.key_id == msg.key_id
                    && k.definition == digest
                    && k.sources.iter().map(|(id, _)| *id).eq(ids.iter().copied())
            };
            if let Some(result) = lock(&cache).continue_run(run, same, Instant::now()) {
                return Box::pin(async move {
                    page_of(result, msg.offset, msg.limit, sources_omitted, run).await
                });
            }
        }
        Box::pin(async move {
            let key = CacheKey {
                report_id: msg.report_id,
                key_id: msg.key_id,
                sources: readable.iter().map(|(id, s)| (*id, s.lsn)).collect(),
                definition: digest,
            };
            let sources: Vec<Source> = readable
                .iter()
                .map(|(id, s)| Source {
                    sheet_id: *id,
                    columns: Arc::clone(s.state.columns_by_position()),
                    rows: s.state.rows.clone(),
                })
                .collect();
            let plan = compile::compile(&def, &sources)?;
            check_caps(&def, &sources, msg.caps)?;
            let hit = lock(&cache).get(&key, Instant::now());
            let (result, run) = match hit {
                Some(found) => found,
                None => {
                    let r = tokio::task::spawn_blocking(move || run_plan(&plan, &sources, &kept))
                        .await
                        .map_err(|_| Error::Unavailable("report runner"))?;
                    let r = Arc::new(r);
                    let run = lock(&cache).put(key, r.clone(), Instant::now());
                    (r, run)
                }
            };
            page_of(result, msg.offset, msg.limit, sources_omitted, run).await
        })
    }
}

/// The page at `offset` of a result, cut on a blocking thread when it reaches past the rows
/// the run ordered (ordering the rest is a scan of the rows).
async fn page_of(
    result: Arc<RunResult>,
    offset: u64,
    limit: usize,
    sources_omitted: u64,
    run: u32,
) -> Result<RunPage> {
    let end = usize::try_from(offset).unwrap_or(usize::MAX).saturating_add(limit);
    if result.ordered_to(end) {
        return Ok(cut_page(&result, offset, limit, sources_omitted, run));
    }
    tokio::task::spawn_blocking(move || cut_page(&result, offset, limit, sources_omitted, run))
        .await
        .map_err(|_| Error::Unavailable("report runner"))
}

/// The page at `offset` of a result.
fn cut_page(
    result: &RunResult,
    offset: u64,
    limit: usize,
    sources_omitted: u64,
    run: u32,
) -> RunPage {
    let offset = usize::try_from(offset).unwrap_or(usize::MAX);
    let rows = result.page(offset, limit);
    let end = offset.saturating_add(rows.len());
    let next_offset = (!rows.is_empty() && end < result.len()).then_some(end as u64);
    RunPage {
        mode: result.mode,
        columns: result.columns.clone(),
        rows,
        scanned_rows: result.scanned_rows,
        total_matched: result.total_matched,
        sources_omitted,
        next_offset,
        run,
    }
}

impl Handler<GetCacheStats> for ReportRunner {
    type Result = CacheStats;

    fn handle(&mut self, _: GetCacheStats, _: &mut Self::Context) -> CacheStats {
        lock(&self.cache).stats()
    }
}

#[cfg(test)]
mod tests {
    use imbl::OrdMap;

    use super::*;
    use crate::model::{Column, ColumnType, Json, Row, SOURCE_IMPORT};

    fn source(sheet_id: SheetId, rows: u64) -> Source {
        Source {
            sheet_id,
            columns: vec![Column {
                id: sheet_id * 10,
                sheet_id,
                name: "N".into(),
                ty: ColumnType::Number,
                position: 0,
                options: None,
                primary: false,
            }]
            .into(),
            rows: (0..rows)
                .map(|i| {
                    let id = sheet_id * 1000 + i;
                    let cells = [(sheet_id * 10, Json(json!(i)))].into_iter().collect();
                    let row = Row::new(id, sheet_id, cells, SOURCE_IMPORT, 0);
                    (id, Arc::new(row))
                })
                .collect::<OrdMap<_, _>>(),
        }
    }

    fn cap_detail(r: Result<RunResult>) -> Value {
        match r {
            Err(Error::Report { kind: ReportErrorKind::CapExceeded, detail, .. }) => detail,
            other => panic!("expected a cap error, got {other:?}"),
        }
    }

    #[test]
    fn caps_come_after_compile_errors() {
        let caps = Caps { max_sources: 1, max_scanned_rows: 3, ..Caps::default() };
        let sources = [source(1, 2), source(2, 2)];
        let def = json!({"type": "summary", "sources": [1, 2], "aggregates": [{"fn": "sum", "column": "N"}]});
        assert_eq!(
            cap_detail(evaluate(&def, &sources, caps)),
            json!({"cap": "maxSources", "limit": 1, "value": 2})
        );
        let caps = Caps { max_sources: 2, ..caps };
        assert_eq!(
            cap_detail(evaluate(&def, &sources, caps)),
            json!({"cap": "maxScannedRows", "limit": 3, "value": 4})
        );
        // Only readable sources count towards the rows cap.
        let r = evaluate(&def, &sources[..1], caps).unwrap();
        assert_eq!((r.scanned_rows, r.page(0, 1)), (2, vec![vec![json!(1)]]));
        // A compile error wins over both caps.
        let bad = json!({"type": "summary", "sources": [1, 2, 3], "aggregates": [{"fn": "sum", "column": "X"}]});
        assert!(matches!(
            evaluate(&bad, &sources, caps),
            Err(Error::Report { kind: ReportErrorKind::CompileFailed, .. })
        ));
        assert_eq!(
            Caps::default(),
            Caps {
                max_sources: 50,
                max_scanned_rows: 1_000_000,
                column_cache_bytes: columns::DEFAULT_BUDGET
            }
        );
    }

    /// Through the real actors: snapshots, access, the cache, and a write invalidating it.
    #[actix_rt::test]
    async fn runner_pages_through_snapshots_and_caches_per_lsn() {
        use crate::directory::Import;
        use crate::sheet::BulkAdd;
        use crate::{Service, ServiceConfig};

        let dir = tempfile::tempdir().unwrap();
        let (service, _) = Service::open(ServiceConfig {
            data_dir: dir.path().to_owned(),
            sheet_threads: 1,
            clock: Default::default(),
            min_free_bytes: None,
            retention: Default::default(),
            archive: None,
        })
        .unwrap();
        let fixture = serde_json::from_value(json!({
            "users": [{"id": 1, "name": "ada", "plan": "paid"}],
            "projects": [{"id": 1, "name": "P", "ownerId": 1}],
            "sheets": [{"id": 10, "projectId": 1, "name": "A"}, {"id": 11, "projectId": 1, "name": "B"}],
            "columns": [{"id": 100, "sheetId": 10, "name": "N", "type": "number", "position": 0},
                        {"id": 110, "sheetId": 11, "name": "N", "type": "number", "position": 0}],
            "rows": [{"id": 1, "sheetId": 10, "cells": {"100": 3}}, {"id": 2, "sheetId": 10, "cells": {"100": 1}},
                     {"id": 3, "sheetId": 11, "cells": {"110": 2}}]
        }))
        .unwrap();
        service.directory_actor().send(Import(fixture)).await.unwrap().unwrap();
        let definition = json!({"type": "row", "sources": [10, 11, 99], "columns": ["N"], "sort": [{"column": "N"}]});
        let go = |offset: u64, readable: &'static [SheetId], run: Option<u32>| RunReport {
            report_id: 7,
            definition: definition.clone(),
            key_id: 1,
            can_read: Box::new(move |id| readable.contains(&id)),
            offset,
            run,
            limit: 2,
            caps: Caps::default(),
        };
        let run = |offset: u64, readable: &'static [SheetId]| go(offset, readable, None);
        let reports = service.reports();
        let first = reports.send(run(0, &[10, 11, 99])).await.unwrap().unwrap();
        assert_eq!(first.rows, [vec![json!(1)], vec![json!(2)]]);
        assert_eq!((first.next_offset, first.total_matched, first.scanned_rows), (Some(2), 3, 3));
        assert_eq!(first.sources_omitted, 1, "sheet 99 does not exist");
        let second = reports.send(run(2, &[10, 11, 99])).await.unwrap().unwrap();
        assert_eq!((second.rows, second.next_offset), (vec![vec![json!(3)]], None));
        assert_eq!(
            reports.send(GetCacheStats).await.unwrap(),
            CacheStats { hits: 1, misses: 1, entries: 1 }
        );

        // Another set of readable sources is another result.
        let only_ten = reports.send(run(0, &[10])).await.unwrap().unwrap();
        assert_eq!((only_ten.total_matched, only_ten.sources_omitted), (2, 2));
        // A write moves the sheet's LSN: the next page is computed afresh and sees it.
        let addr = service.sheet(11).unwrap();
        let mut cells = serde_json::Map::new();
        cells.insert("110".into(), json!(0));
        let reply = addr.send(BulkAdd { items: vec![cells], cap: 100, idem: None }).await.unwrap();
        assert!(reply.result.is_ok(), "{:?}", reply.result);
        let fresh = reports.send(run(0, &[10, 11, 99])).await.unwrap().unwrap();
        assert_eq!((fresh.rows, fresh.total_matched), (vec![vec![json!(0)], vec![json!(1)]], 4));
        assert_ne!(fresh.run, first.run);
        assert_eq!(
            reports.send(GetCacheStats).await.unwrap(),
            CacheStats { hits: 1, misses: 3, entries: 3 }
        );
        // The first run goes on as of its first page: its second page neither repeats row 1
        // (which the new row pushed to offset 2) nor shows the new row.
        let pinned = reports.send(go(2, &[10, 11, 99], Some(first.run))).await.unwrap().unwrap();
        assert_eq!(
            (pinned.rows, pinned.total_matched, pinned.run),
            (vec![vec![json!(3)]], 3, first.run)
        );
        // With another set of readable sources the run is not continued: a fresh one answers.
        let narrowed = reports.send(go(0, &[10], Some(first.run))).await.unwrap().unwrap();
        assert_eq!((narrowed.total_matched, narrowed.sources_omitted), (2, 2));
        assert_ne!(narrowed.run, first.run);
        service.close().unwrap();
    }

    fn key(n: u64) -> CacheKey {
        CacheKey { report_id: n, key_id: 1, sources: vec![(1, n)], definition: [0; 32] }
    }

    #[test]
    fn cache_expires_and_evicts_the_oldest() {
        let result = Arc::new(
            evaluate(
                &json!({"type": "row", "sources": [1], "columns": ["N"]}),
                &[source(1, 3)],
                Caps::default(),
            )
            .unwrap(),
        );
        let mut cache = ResultCache::new(Duration::from_secs(30), 2);
        let t0 = Instant::now();
        assert!(cache.get(&key(1), t0).is_none());
        cache.put(key(1), result.clone(), t0);
        assert!(cache.get(&key(1), t0 + Duration::from_secs(29)).is_some());
        assert!(
            cache.get(&key(1), t0 + Duration::from_secs(58)).is_some(),
            "a use keeps it 30 s more"
        );
        assert!(
            cache.get(&key(1), t0 + Duration::from_secs(88)).is_none(),
            "expired 30 s after its last use"
        );
        assert_eq!(cache.stats(), CacheStats { hits: 2, misses: 2, entries: 0 });
        cache.put(key(1), result.clone(), t0);
        cache.put(key(2), result.clone(), t0 + Duration::from_secs(1));
        cache.put(key(3), result.clone(), t0 + Duration::from_secs(2));
        assert_eq!(cache.entries.len(), 2);
        assert!(cache.get(&key(1), t0 + Duration::from_secs(2)).is_none(), "the oldest went first");
        assert!(cache.get(&key(2), t0 + Duration::from_secs(2)).is_some());
        assert!(cache.get(&key(3), t0 + Duration::from_secs(2)).is_some());
        // Another LSN of a source is another key.
        let mut moved = key(3);
        moved.sources[0].1 += 1;
        assert!(cache.get(&moved, t0 + Duration::from_secs(2)).is_none());
    }
}
