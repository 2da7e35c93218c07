//! Starting the domain: recovery from checkpoint + log, spawning the actors, and checkpoints.
//!
//! # Recovery
//!
//! 1. The WAL hands over the latest [`Checkpoint`]: the directory, every sheet and the side
//!    stores, **each with the LSN it reflects** (they are copied one after another while the
//!    service runs, so they reflect different LSNs).
//! 2. Every record after the checkpoint is offered to each part it touches, and a part applies
//!    it only when the record is newer than the part's own LSN. Records carry whole rows, so
//!    applying is an overwrite.
//! 3. The row-id counter is raised above every id seen, the derived indexes are rebuilt, and
//!    the actors start over the result.
//!
//! # Checkpoints
//!
//! 1. Copy the directory, then each sheet (O(1) copies; each actor answers between two
//!    messages, so its copy holds every record it appended), then the side stores inside the
//!    append lock of a [`Record::Marker`]. Each copy is tagged with the log's last LSN at the
//!    moment it was taken: every record at or below it that touches the part is in the copy.
//! 2. Wait until everything up to the newest tag is durable, so a checkpoint never holds a
//!    write the log could still lose.
//! 3. Write the checkpoint at the **oldest** tag and truncate the log behind it. Records between
//!    the oldest and a part's own tag are replayed and skipped by that part.
//!
//! # What the layers above reach
//!
//! [`Service`] is the only way into the domain from the HTTP server and the CLI: the log and the
//! side stores stay inside this crate, and the service offers the few operations those layers
//! need (claim and store an idempotent answer, read durable events, the log's counters and
//! health, the clock, checkpoint, close). So every record has its owner here, and nothing above
//! can append behind an actor's back.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use serde::{Deserialize, Serialize};

use crate::archive::{Archive, ArchiveConfig, ArchiveError, ArchiveStatus};
use crate::digest::{digest, StateDigest, StateParts};
use crate::directory::{
    CopyDirectoryForCheckpoint, DirectoryActor, DirectorySnapshot, DirectoryState,
    PublishedDirectory,
};
use crate::error::{Error, Result};
use crate::log::{
    codec, encode_snapshot, AppendOptions, Lsn, RecordLog, RecoveryReport, Replay, WalLog,
    WalLogConfig, WalStats,
};
use crate::model::{KeyId, Millis, Row, RowId, SheetId};
use crate::publish::Published;
use crate::record::{Expiry, IdemEntry, Record};
use crate::registry::SheetRegistry;
use crate::report::ReportRunner;
use crate::shared::Retention;
use crate::shared::{Claim, Clock, Event, IdemStore, Outbox, RowIds, Shared, EVENT_RETENTION};
use crate::sheet::{
    extract, Change, ChangeLog, ChangeSpan, CopyForCheckpoint, PublishedSheet, SheetActor,
    SheetSnapshot, SheetState, SpanCache,
};
use crate::webhook::{Webhook, WebhookChange, WebhookId, WebhookStore, WebhookTable};

/// How long an idempotent response is replayed.
pub const IDEMPOTENCY_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// Everything needed to rebuild the domain, as one checkpoint.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Users, projects, folders, sheet identities, shares, reports and keys.
    pub directory: DirectoryState,
    /// LSN the directory reflects.
    pub directory_lsn: Lsn,
    /// Each sheet with the LSN it reflects.
    pub sheets: Vec<(SheetState, Lsn)>,
    /// LSN the side stores reflect.
    pub side_lsn: Lsn,
    /// Stored idempotent responses.
    pub idem: Vec<IdemEntry>,
    /// The event outbox.
    pub events: Vec<Event>,
    /// The outbox's last sequence number.
    pub last_event_seq: u64,
    /// The next row id to issue: above every row id ever seen, so none is reused.
    pub next_row_id: RowId,
    /// The webhooks, as of `side_lsn` (copied with the side stores). Stored after the change
    /// indexes in the checkpoint file, so this struct's encoding stays as older
    /// builds wrote it.
    #[serde(skip)]
    pub webhooks: WebhookTable,
}

/// What a checkpoint file holds: the [`Checkpoint`], then each sheet's change index, then the
/// webhook table.
///
/// Builds before the change feed wrote codec format 1 and the [`Checkpoint`] alone; such a
/// file decodes as sheets whose feed starts after it. Formats 2 and 3 end after the change
/// indexes ([`CheckpointFileV3`]): no webhooks.
pub(crate) struct CheckpointFile {
    pub(crate) checkpoint: Checkpoint,
    pub(crate) changes: Vec<(SheetId, ChangeLog)>,
}

impl Serialize for CheckpointFile {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        // The codec lays a tuple out as a struct of the same fields: the checkpoint, the
        // change indexes, then the webhooks the checkpoint holds (skipped in its own layout).
        (&self.checkpoint, &self.changes, &self.checkpoint.webhooks).serialize(s)
    }
}

/// A checkpoint file of codec formats 2 and 3, before webhooks.
#[derive(Deserialize)]
struct CheckpointFileV3 {
    checkpoint: Checkpoint,
    changes: Vec<(SheetId, ChangeLog)>,
}

impl CheckpointFile {
    pub(crate) fn decode(snapshot: &mut dyn std::io::Read) -> Result<Checkpoint> {
        let streamed = codec::stream(snapshot)?;
        let (mut checkpoint, changes) = match streamed.version() {
            1 => (streamed.decode::<Checkpoint>()?, Vec::new()),
            2 | 3 => {
                let file = streamed.decode::<CheckpointFileV3>()?;
                (file.checkpoint, file.changes)
            }
            _ => {
                let (mut checkpoint, changes, webhooks) =
                    streamed.decode::<(Checkpoint, Vec<(SheetId, ChangeLog)>, WebhookTable)>()?;
                checkpoint.webhooks = webhooks;
                (checkpoint, changes)
            }
        };
        let mut changes: BTreeMap<SheetId, ChangeLog> = changes.into_iter().collect();
        for (state, _) in &mut checkpoint.sheets {
            state.changes = changes.remove(&state.id).unwrap_or_default();
        }
        Ok(checkpoint)
    }
}

/// Recovery's working state: a part per owner, each with the LSN it reflects.
pub(crate) struct Rebuild {
    directory: DirectoryState,
    directory_lsn: Lsn,
    /// Sheet state, LSN its copy reflects, LSN of the last record applied to it.
    sheets: BTreeMap<SheetId, (SheetState, Lsn, Lsn)>,
    side_lsn: Lsn,
    idem: Arc<IdemStore>,
    outbox: Arc<Outbox>,
    /// Webhooks, as of `side_lsn` and the records after it.
    webhooks: WebhookTable,
    row_ids: Arc<RowIds>,
    now: i64,
    /// Records replayed so far, and when progress was last logged (a long replay logs every
    /// [`PROGRESS_EVERY`] so an operator sees it is moving).
    progress: (u64, std::time::Instant),
    /// The records at or below the checkpoint that hold retained changes: gathered only if the
    /// log asks (a start without a sweep marker), from the sheets as the checkpoint left them.
    retained: std::sync::OnceLock<std::collections::HashSet<Lsn>>,
    /// The log archive's position and its hold (`ArchiveConfig::hold_records`): records above
    /// it are kept for the archive, as a checkpoint keeps them.
    archive_hold: Option<(Lsn, u64)>,
    /// The checkpoint the log handed over (0 before one).
    checkpoint_lsn: Lsn,
    /// The retention each applied sheet write prunes its feed by, as a live write does: the
    /// server's own on one node, the group's ([`Record::FeedRetention`]) on a cluster node.
    pub(crate) retention: Retention,
}

/// How often a long replay logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

impl Replay for Rebuild {
    fn checkpoint(&mut self, lsn: Lsn, snapshot: &mut dyn std::io::Read) -> Result<()> {
        self.checkpoint_lsn = lsn;
        self.load(CheckpointFile::decode(snapshot)?);
        Ok(())
    }

    fn record(&mut self, lsn: Lsn, record: Record) -> Result<()> {
        self.apply(lsn, record);
        Ok(())
    }

    fn retains(&self, lsn: Lsn) -> bool {
        // Asked before any record is replayed: the sheets are still the checkpoint's.
        let retained = self.retained.get_or_init(|| {
            self.sheets.values().flat_map(|(state, _, _)| state.changes.lsns()).collect()
        });
        let for_archive = self.archive_hold.is_some_and(|(position, hold)| {
            lsn > crate::archive::held_above(position, self.checkpoint_lsn, hold)
        });
        retained.contains(&lsn) || for_archive
    }
}

/// A replay that takes the state's digest once, before the first record after `at`.
struct DigestAt<'a> {
    rebuild: &'a mut Rebuild,
    at: Lsn,
    digest: Option<StateDigest>,
}

impl Replay for DigestAt<'_> {
    fn checkpoint(&mut self, lsn: Lsn, snapshot: &mut dyn std::io::Read) -> Result<()> {
        self.rebuild.checkpoint(lsn, snapshot)
    }

    fn record(&mut self, lsn: Lsn, record: Record) -> Result<()> {
        if lsn > self.at && self.digest.is_none() {
            self.digest = Some(self.rebuild.digest());
        }
        self.rebuild.record(lsn, record)
    }

    fn retains(&self, lsn: Lsn) -> bool {
        self.rebuild.retains(lsn)
    }
}

impl Rebuild {
    /// Takes a checkpoint's parts (their change indexes inside the sheets) as the start.
    pub(crate) fn load(&mut self, cp: Checkpoint) {
        // A checkpoint holds no derived index (keys by secret hash, rows by parent, columns
        // by position): built here, so that every state a rebuild gives out has them, a
        // follower's published view as much as the actors' start.
        self.directory = cp.directory;
        self.directory.reindex();
        self.directory_lsn = cp.directory_lsn;
        self.sheets = cp
            .sheets
            .into_iter()
            .map(|(mut s, lsn)| {
                s.reindex();
                (s.id, (s, lsn, 0))
            })
            .collect();
        self.side_lsn = cp.side_lsn;
        for entry in cp.idem {
            self.idem.complete(entry, 0);
        }
        self.outbox.restore(cp.events, cp.last_event_seq);
        self.webhooks = cp.webhooks;
        self.row_ids.observe(cp.next_row_id.saturating_sub(1));
    }

    /// Takes a Raft snapshot's checkpoint, the state at `lsn`, as the whole state, with the
    /// group's feed retention it carried.
    pub(crate) fn load_snapshot(&mut self, lsn: Lsn, checkpoint: Checkpoint, retention: Retention) {
        self.checkpoint_lsn = lsn;
        self.load(checkpoint);
        self.retention = retention;
    }

    /// Offers `record` to each part it touches; a part applies it only when it is newer than
    /// the part's own tag.
    pub(crate) fn apply(&mut self, lsn: Lsn, record: Record) {
        self.progress.0 += 1;
        // Reading the clock every 1024 records keeps its cost out of the replay.
        if self.progress.0.is_multiple_of(1024) && self.progress.1.elapsed() >= PROGRESS_EVERY {
            self.progress.1 = std::time::Instant::now();
            tracing::info!(records_replayed = self.progress.0, lsn, "replaying the log");
        }
        match record {
            Record::Import(batch) => {
                if lsn > self.directory_lsn {
                    self.directory.apply_import(&batch);
                }
                for s in &batch.sheets {
                    for r in &s.rows {
                        self.row_ids.observe(r.id);
                    }
                    self.sheets.entry(s.meta.id).or_insert_with(|| {
                        let mut state = SheetState::new(
                            s.meta.id,
                            s.meta.created_at,
                            s.columns.clone(),
                            s.rows.clone(),
                        );
                        state.record_import(lsn);
                        (state, lsn, lsn)
                    });
                }
            }
            Record::Directory(change) => {
                if lsn > self.directory_lsn {
                    self.directory.apply_change(&change);
                }
            }
            Record::Sheet(write) => {
                for r in &write.put {
                    self.row_ids.observe(r.id);
                }
                if let Some((state, copy_lsn, applied)) = self.sheets.get_mut(&write.sheet_id) {
                    if lsn > *copy_lsn {
                        state.apply(&write, lsn);
                        state.changes.prune(write.at, self.retention);
                        *applied = lsn;
                    }
                }
                if lsn > self.side_lsn {
                    self.outbox.row_deleted(write.sheet_id, &write.deleted, write.at, lsn);
                    if let Some(entry) = write.idem {
                        self.keep_idem(entry, lsn);
                    }
                }
            }
            Record::Idempotency(entry) => {
                if lsn > self.side_lsn {
                    self.keep_idem(entry, lsn);
                }
            }
            Record::Marker => {}
            Record::FeedRetention(retention) => self.retention = retention,
            Record::Expire(expiry) => {
                if lsn > self.side_lsn {
                    expire(&self.idem, &self.outbox, expiry);
                }
            }
            Record::Webhook(change) => {
                if lsn > self.side_lsn {
                    self.webhooks.apply(&change);
                }
            }
        }
    }

    /// The directory as rebuilt so far.
    pub(crate) fn directory(&self) -> &DirectoryState {
        &self.directory
    }

    /// A sheet as rebuilt so far, with the position of the newest record in it.
    pub(crate) fn sheet(&self, id: SheetId) -> Option<(&SheetState, Lsn)> {
        self.sheets.get(&id).map(|(state, copy_lsn, applied)| (state, (*copy_lsn).max(*applied)))
    }

    /// Every sheet as rebuilt so far, with the position of the newest record in it.
    pub(crate) fn all_sheets(&self) -> impl Iterator<Item = (&SheetState, Lsn)> {
        self.sheets.values().map(|(state, copy_lsn, applied)| (state, (*copy_lsn).max(*applied)))
    }

    /// The state rebuilt so far as a checkpoint at `lsn` (every record at or below it
    /// applied: a part whose tag is newer keeps its tag), and the records at or below `lsn`
    /// its change feeds retain. The parts are shared, not copied (persistent structures).
    pub(crate) fn checkpoint_at(&self, lsn: Lsn) -> (CheckpointFile, BTreeSet<Lsn>) {
        let (events, last_event_seq) = self.outbox.snapshot();
        let checkpoint = Checkpoint {
            directory: self.directory.clone(),
            directory_lsn: self.directory_lsn.max(lsn),
            sheets: self
                .sheets
                .values()
                .map(|(state, copy_lsn, _)| (state.clone(), (*copy_lsn).max(lsn)))
                .collect(),
            side_lsn: self.side_lsn.max(lsn),
            idem: self.idem.snapshot(),
            events,
            last_event_seq,
            next_row_id: self.row_ids.peek(),
            webhooks: self.webhooks.clone(),
        };
        let retained = checkpoint
            .sheets
            .iter()
            .flat_map(|(s, _)| s.changes.lsns())
            .filter(|&l| l <= lsn)
            .collect();
        let changes = checkpoint.sheets.iter().map(|(s, _)| (s.id, s.changes.clone())).collect();
        (CheckpointFile { checkpoint, changes }, retained)
    }

    /// The digest of the state rebuilt so far.
    pub(crate) fn digest(&self) -> StateDigest {
        let (events, next_event_seq) = self.outbox.snapshot();
        digest(StateParts {
            directory: &self.directory,
            sheets: self.sheets.values().map(|(state, _, _)| state).collect(),
            idem: self.idem.snapshot(),
            events: &events,
            next_event_seq,
            webhooks: &self.webhooks,
        })
    }

    /// Idempotent answers and events held.
    pub(crate) fn side_sizes(&self) -> (usize, usize) {
        (self.idem.len(), self.outbox.len())
    }

    /// What the state rebuilt so far holds.
    pub(crate) fn counts(&mut self) -> Counts {
        let d = &self.directory;
        let mut counts = Counts {
            users: d.users.len(),
            projects: d.projects.len(),
            sheets: self.sheets.len(),
            keys: d.keys.len(),
            reports: d.reports.len(),
            ..Default::default()
        };
        for (state, _, _) in self.sheets.values_mut() {
            counts.rows += state.rows.len() as u64;
            let (n, bytes) = state.recount_attachments();
            counts.attachments += n;
            counts.attachment_bytes += bytes;
        }
        counts
    }

    fn keep_idem(&self, entry: IdemEntry, lsn: Lsn) {
        if entry.completed_at + IDEMPOTENCY_WINDOW.as_millis() as i64 > self.now {
            self.idem.complete(entry, lsn);
        }
    }
}

/// Settings of the domain.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// The data dir (the log and checkpoint live here).
    pub data_dir: std::path::PathBuf,
    /// How many arbiters (threads) the sheet actors are spread over.
    pub sheet_threads: usize,
    /// The clock (tests move it).
    pub clock: Clock,
    /// The log's free-space floor (see [`WalLogConfig::min_free_bytes`]).
    pub min_free_bytes: Option<u64>,
    /// How long each sheet keeps its changes for the feed.
    pub retention: Retention,
    /// The log archive this service will run ([`Service::start_archive`]), if any: a start
    /// keeps the log's records it has not taken, where a crash between a checkpoint and its
    /// truncation leaves the start to decide which records below the checkpoint to keep.
    pub archive: Option<ArchiveConfig>,
}

/// Where a page of a change feed is read from: the record log holding the changes, and the
/// sheet's latest state (to tell a pruned record from a lost one). A leader reads its own
/// service's; a follower answering a local read reads its applied state's and its copy of the
/// log, which holds the same records at the same positions.
pub(crate) struct ChangeSource<'a> {
    /// The decoded large records kept for the pages that follow.
    pub(crate) spans: &'a SpanCache,
    /// The record at a position, if the log still holds it.
    pub(crate) read: &'a dyn Fn(Lsn) -> Result<Option<Record>>,
    /// A sheet's latest published state.
    pub(crate) latest: &'a dyn Fn(SheetId) -> Option<Arc<SheetSnapshot>>,
}

impl ChangeSource<'_> {
    /// See [`Service::read_changes`].
    pub(crate) fn read_changes(
        &self,
        snapshot: &SheetSnapshot,
        seq: Option<u64>,
        limit: usize,
    ) -> std::result::Result<Vec<Change>, ChangesError> {
        let log = &snapshot.state.changes;
        let from = seq.unwrap_or_else(|| log.oldest_seq());
        if from < log.oldest_seq() {
            return Err(ChangesError::Expired { oldest: log.oldest_seq() });
        }
        let current = |id: RowId| snapshot.state.rows.get(&id).cloned();
        let mut out = Vec::new();
        for span in log.spans_from(from) {
            if out.len() >= limit {
                break;
            }
            let sheet_id = snapshot.state.id;
            // Only a page that starts inside a record can follow one that ended there.
            let skipped = from.saturating_sub(span.first_seq) as usize;
            let kept = (skipped > 0).then(|| self.spans.get(sheet_id, span.lsn)).flatten();
            let changes = match kept {
                Some(changes) => changes,
                None => self.span_changes(snapshot, &span, &current)?,
            };
            let room = limit - out.len();
            if changes.len().saturating_sub(skipped) > room {
                // The page ends inside this record: the next one starts there.
                self.spans.put(sheet_id, span.lsn, Arc::clone(&changes));
            }
            out.extend(changes.iter().filter(|c| c.seq >= from).take(room).cloned());
        }
        Ok(out)
    }

    /// `snapshot`'s sheet's changes in `span`, read back from its record.
    fn span_changes(
        &self,
        snapshot: &SheetSnapshot,
        span: &ChangeSpan,
        current: &impl Fn(RowId) -> Option<Arc<Row>>,
    ) -> std::result::Result<Arc<[Change]>, ChangesError> {
        let Some(record) = (self.read)(span.lsn)? else {
            // Pruned and truncated by a checkpoint since `snapshot` was published.
            let oldest = (self.latest)(snapshot.state.id).map(|s| s.state.changes.oldest_seq());
            return Err(match oldest {
                Some(oldest) if oldest > span.first_seq => ChangesError::Expired { oldest },
                _ => Error::Inconsistent(format!(
                    "the log no longer holds record {} of sheet {}'s retained changes",
                    span.lsn, snapshot.state.id
                ))
                .into(),
            });
        };
        Ok(extract(record, snapshot.state.id, span, current)?.into())
    }
}

/// Why [`Service::read_changes`] returned no page.
#[derive(Debug, thiserror::Error)]
pub enum ChangesError {
    /// The position is older than the oldest retained change.
    #[error("the changes before seq {oldest} are no longer retained")]
    Expired {
        /// The oldest retained change's `seq`.
        oldest: u64,
    },
    /// Anything else.
    #[error(transparent)]
    Other(#[from] Error),
}

/// What a checkpoint did.
#[derive(Clone, Debug)]
pub struct CheckpointReport {
    /// The LSN the checkpoint stands at (the log is truncated up to it).
    pub lsn: Lsn,
    /// Size of the snapshot written.
    pub bytes: usize,
}

/// Counts of a data dir's contents, for `sheetd check` and the stats endpoint.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    pub users: usize,
    pub projects: usize,
    pub sheets: usize,
    /// Rows in every sheet, child rows included.
    pub rows: u64,
    /// Attachments of live rows (a delete frees its rows').
    pub attachments: u64,
    pub attachment_bytes: u64,
    /// API keys, in any state.
    pub keys: usize,
    pub reports: usize,
}

/// What [`Service::inspect`] found.
#[derive(Clone, Debug)]
pub struct Inspection {
    /// What the replay did.
    pub report: RecoveryReport,
    /// What the state holds.
    pub counts: Counts,
    /// The state's digest.
    pub digest: StateDigest,
}

/// The copies a checkpoint or a backup is made of: one consistent state, taken while writes
/// go on (see the module docs).
pub(crate) struct Copies {
    /// The checkpoint file's contents.
    pub(crate) file: CheckpointFile,
    /// The oldest tag: where the checkpoint stands.
    pub(crate) lsn: Lsn,
    /// The newest tag (the marker's), durable: the state the copies make together after the
    /// records between the two.
    pub(crate) newest: Lsn,
    /// The records the change feed retains.
    pub(crate) retained: std::collections::HashSet<Lsn>,
}

/// A backup's copies and what it needs to read the records after them; while it lives, no
/// checkpoint truncates the log (see [`Service::backup`]).
pub struct BackupCopies {
    pub(crate) copies: Copies,
    pub(crate) log: Arc<dyn crate::log::RecordLog>,
    /// The service clock when the copies were taken.
    pub(crate) taken_at: Millis,
    _no_checkpoint: tokio::sync::OwnedMutexGuard<()>,
}

impl BackupCopies {
    /// The position the backup's state is at.
    pub fn position(&self) -> Lsn {
        self.copies.newest
    }

    /// Rows in the copies (the state's size, for progress).
    pub fn rows(&self) -> u64 {
        self.copies.file.checkpoint.sheets.iter().map(|(s, _)| s.rows.len() as u64).sum()
    }
}

/// What [`Service::purge_expired`] dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Purged {
    /// Idempotency records past their window, and claims whose request never finished.
    pub idempotency: usize,
    /// Events past [`EVENT_RETENTION`].
    pub events: usize,
}

/// How much the side stores hold, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SideStoreSizes {
    /// Idempotency keys held (completed within the window, or in progress).
    pub idempotency: usize,
    /// Events held in the outbox.
    pub events: usize,
}

/// The running domain: the directory, the sheet actors and the shared stores.
#[derive(Clone)]
pub struct Service {
    /// What the actors share (log, clock, side stores); never handed out, see the module docs.
    shared: Shared,
    directory: Addr<DirectoryActor>,
    published: PublishedDirectory,
    sheets: SheetRegistry,
    reports: Addr<ReportRunner>,
    /// The feed's decoded large records, for the pages that follow.
    spans: Arc<SpanCache>,
    /// Held by a checkpoint, and by a backup while it reads the records after its copies: a
    /// checkpoint between would truncate them.
    checkpointing: Arc<tokio::sync::Mutex<()>>,
    /// The log archive, once started: a checkpoint keeps what it has not taken.
    archive: Arc<std::sync::OnceLock<Arc<Archive>>>,
    /// Held while a webhook is counted against its key's limit and its record appended, so
    /// two creations cannot both pass the limit.
    creating_webhook: Arc<std::sync::Mutex<()>>,
    _arbiters: Arc<Vec<Arbiter>>,
}

/// An empty state on stores of its own, keeping idempotent answers younger than the window at
/// `now` (a backup's digest and its restore's check both pass the backup's time, so an answer
/// that expired in between does not tell them apart).
pub(crate) fn fresh_rebuild(now: Millis) -> Rebuild {
    let row_ids = Arc::new(RowIds::default());
    row_ids.observe(0);
    rebuild((&Arc::new(IdemStore::new(IDEMPOTENCY_WINDOW)), &Arc::default(), &row_ids), now)
}

fn rebuild(shared_parts: (&Arc<IdemStore>, &Arc<Outbox>, &Arc<RowIds>), now: i64) -> Rebuild {
    Rebuild {
        directory: DirectoryState::default(),
        directory_lsn: 0,
        sheets: BTreeMap::new(),
        side_lsn: 0,
        idem: shared_parts.0.clone(),
        outbox: shared_parts.1.clone(),
        webhooks: WebhookTable::default(),
        row_ids: shared_parts.2.clone(),
        now,
        progress: (0, std::time::Instant::now()),
        retained: Default::default(),
        archive_hold: None,
        checkpoint_lsn: 0,
        retention: Retention::default(),
    }
}

/// Drops what `expiry` expires from the side stores: the one rule a leader's housekeeping and
/// every node's apply share.
fn expire(idem: &IdemStore, outbox: &Outbox, expiry: Expiry) -> Purged {
    Purged {
        idempotency: idem.purge(expiry.at),
        events: outbox.purge(expiry.at - EVENT_RETENTION.as_millis() as i64),
    }
}

impl Service {
    /// Recover the data dir and start the actors. Must run inside an actix system.
    pub fn open(config: ServiceConfig) -> Result<(Service, RecoveryReport)> {
        let idem = Arc::new(IdemStore::new(IDEMPOTENCY_WINDOW));
        let outbox = Arc::new(Outbox::default());
        let row_ids = Arc::new(RowIds::default());
        row_ids.observe(0);
        let mut rebuild = rebuild((&idem, &outbox, &row_ids), config.clock.now());
        rebuild.retention = config.retention;
        rebuild.archive_hold = config.archive.as_ref().and_then(|a| {
            crate::archive::archived_position(&a.dir).map(|position| (position, a.hold_records))
        });
        let log_config =
            WalLogConfig { dir: config.data_dir.clone(), min_free_bytes: config.min_free_bytes };
        let (log, report) = WalLog::open(log_config, &mut rebuild)?;
        let service = Service::start(&config, rebuild, Arc::new(log), report.last_lsn);
        Ok((service, report))
    }

    /// Starts the actors on `rebuild`, the state at `last_lsn` of `log`, which takes every
    /// later record. Must run inside an actix system.
    pub(crate) fn start(
        config: &ServiceConfig,
        mut rebuild: Rebuild,
        log: Arc<dyn RecordLog>,
        last_lsn: Lsn,
    ) -> Service {
        let shared = Shared {
            log,
            clock: config.clock.clone(),
            row_ids: Arc::clone(&rebuild.row_ids),
            idem: Arc::clone(&rebuild.idem),
            outbox: Arc::clone(&rebuild.outbox),
            retention: rebuild.retention,
            webhooks: Arc::new(WebhookStore::new(std::mem::take(&mut rebuild.webhooks))),
        };
        // The recovered table is durable: readers may see it at once.
        shared.webhooks.settle(last_lsn);

        let arbiters: Vec<Arbiter> =
            (0..config.sheet_threads.max(1)).map(|_| Arbiter::new()).collect();
        let sheets = SheetRegistry::new(arbiters.iter().map(|a| a.handle()).collect());
        // Indexed when loaded (`Rebuild::load`) and kept so by every record applied since.
        for (_, (state, _, applied)) in std::mem::take(&mut rebuild.sheets) {
            sheets.spawn(state, shared.clone(), applied);
        }
        let directory = Arc::new(rebuild.directory);
        let published: PublishedDirectory =
            Arc::new(Published::new(DirectorySnapshot { state: directory.clone(), lsn: last_lsn }));
        let actor =
            DirectoryActor::new(directory, published.clone(), shared.clone(), sheets.clone());
        let directory = actor.start();
        let reports = ReportRunner::new(sheets.clone()).start();
        Service {
            shared,
            directory,
            published,
            sheets,
            reports,
            spans: Arc::default(),
            checkpointing: Arc::default(),
            archive: Arc::default(),
            creating_webhook: Arc::default(),
            _arbiters: Arc::new(arbiters),
        }
    }

    /// Replay a data dir without changing it and count what it holds (`sheetd check`).
    pub fn verify(data_dir: &std::path::Path) -> Result<(RecoveryReport, Counts)> {
        let inspected = Service::inspect(data_dir, chrono::Utc::now().timestamp_millis())?;
        Ok((inspected.report, inspected.counts))
    }

    /// Opens a data dir no one holds as a start would (recovery may write, as a start's does)
    /// without starting the actors, and returns what it holds and its digest, idempotent
    /// answers judged by their age at `now`, with the digest of the state it passed through
    /// at `at` (the last record at or below it replayed): a restore rolled forward past a
    /// backup compares the backup's part with its manifest in the same replay. The log is
    /// closed again. For a dir just written by a restore: no copy of its log is made, and its
    /// first start finds it recovered.
    pub(crate) fn recover_and_inspect(
        data_dir: &std::path::Path,
        now: Millis,
        at: Lsn,
    ) -> Result<(Inspection, StateDigest)> {
        let mut rebuild = fresh_rebuild(now);
        let config = WalLogConfig { dir: data_dir.to_owned(), min_free_bytes: None };
        let mut replay = DigestAt { rebuild: &mut rebuild, at, digest: None };
        let (log, report) = WalLog::open(config, &mut replay)?;
        let passed = replay.digest;
        log.shutdown()?;
        let digest = rebuild.digest();
        let inspection = Inspection { report, counts: rebuild.counts(), digest };
        Ok((inspection, passed.unwrap_or(digest)))
    }

    /// [`Service::verify`], with the digest of the state a start would rebuild, idempotent
    /// answers judged by their age at `now`.
    pub fn inspect(data_dir: &std::path::Path, now: Millis) -> Result<Inspection> {
        let mut rebuild = fresh_rebuild(now);
        let report = WalLog::verify(data_dir, &mut rebuild)?;
        Ok(Inspection { report, counts: rebuild.counts(), digest: rebuild.digest() })
    }

    /// The directory as of the last durable change.
    pub fn directory(&self) -> Arc<DirectoryState> {
        self.published.load().state.clone()
    }

    /// The directory actor (for admin changes).
    pub fn directory_actor(&self) -> &Addr<DirectoryActor> {
        &self.directory
    }

    /// The report runner.
    pub fn reports(&self) -> &Addr<ReportRunner> {
        &self.reports
    }

    /// The actor of a sheet.
    pub fn sheet(&self, id: SheetId) -> Option<Addr<SheetActor>> {
        self.sheets.get(id)
    }

    /// Every sheet actor.
    pub fn sheets(&self) -> Vec<(SheetId, Addr<SheetActor>)> {
        self.sheets.all()
    }

    /// A sheet as of its last durable write (what every read of it shows).
    pub fn sheet_snapshot(&self, id: SheetId) -> Option<Arc<crate::sheet::SheetSnapshot>> {
        self.sheets.snapshot(id)
    }

    /// Where a sheet's snapshots are published, for a reader waiting for the next one.
    pub fn sheet_published(&self, id: SheetId) -> Option<PublishedSheet> {
        self.sheets.published(id)
    }

    /// Up to `limit` changes of the sheet in `snapshot`, from `seq` on (or from the oldest
    /// retained one), as durable as the snapshot. Blocking: the changes are read back from
    /// the log records holding them, which may reach the disk.
    ///
    /// # Errors
    /// [`ChangesError::Expired`] when `seq` is older than the oldest retained change; the log
    /// failing to read a record, or a record that does not hold what the index says.
    pub fn read_changes(
        &self,
        snapshot: &SheetSnapshot,
        seq: Option<u64>,
        limit: usize,
    ) -> std::result::Result<Vec<Change>, ChangesError> {
        let source = ChangeSource {
            spans: &self.spans,
            read: &|lsn| self.shared.log.read(lsn),
            latest: &|id| self.sheets.snapshot(id),
        };
        source.read_changes(snapshot, seq, limit)
    }

    /// Wait until `lsn` is durable (before revealing anything read at it).
    pub async fn visible(&self, lsn: Lsn) -> Result<()> {
        self.shared.log.wait_durable(lsn).await
    }

    /// Re-opens a failed log from disk so writes resume without a restart; `Ok(None)` when the
    /// log had not failed. Blocking (the log re-reads its records): call it off the runtime.
    ///
    /// Stored idempotent answers and events of the records the failed log lost are dropped
    /// before any new record can be appended; the sheet and directory actors return to their
    /// durable state on their next write (the log's epoch tells them).
    pub fn heal(&self) -> Result<Option<Lsn>> {
        let (idem, outbox) = (self.shared.idem.clone(), self.shared.outbox.clone());
        let webhooks = self.shared.webhooks.clone();
        self.shared.log.heal(&mut |durable| {
            idem.forget_after(durable);
            outbox.forget_after(durable);
            webhooks.forget_after(durable);
        })
    }

    /// Now, by the service clock (tests move it forward).
    pub fn now(&self) -> Millis {
        self.shared.clock.now()
    }

    /// Look up an `Idempotency-Key` of `key_id` and take it when free (see [`Claim`]). A
    /// [`Claim::Fresh`] must end in a stored answer (a write message's idempotency part, or
    /// [`Service::store_answer`]) or in [`Service::release_idempotency_key`].
    pub fn claim_idempotency_key(&self, key_id: KeyId, key: &str, fingerprint: [u8; 32]) -> Claim {
        self.shared.idem.claim(key_id, key, fingerprint, self.shared.clock.now())
    }

    /// Give back a claimed key whose request ended without a stored answer, so a retry runs
    /// again. A no-op once the answer is stored.
    pub fn release_idempotency_key(&self, key_id: KeyId, key: &str) {
        self.shared.idem.release(key_id, key);
    }

    /// Store an answer decided before any sheet was reached (a 404 or 403 of an idempotent
    /// write) in a record of its own; resolves once it is durable, so the answer can leave.
    pub async fn store_answer(&self, entry: IdemEntry) -> Result<()> {
        let appended =
            self.shared.append(&Record::Idempotency(entry), AppendOptions::default(), |_| {})?;
        appended.await?;
        Ok(())
    }

    /// Up to `limit` events after sequence number `after`, only those whose record is durable
    /// (a reader never sees an event a crash could take back).
    pub fn events(&self, after: u64, limit: usize) -> Vec<Event> {
        self.shared.outbox.read(after, limit, self.shared.log.durable_lsn())
    }

    /// Drop idempotency records past their window and events past [`EVENT_RETENTION`].
    pub fn purge_expired(&self) -> Purged {
        expire(&self.shared.idem, &self.shared.outbox, Expiry { at: self.shared.clock.now() })
    }

    /// [`Service::purge_expired`] on a cluster's leader: what expires is decided here, by this
    /// node's clock, and appended as a [`Record::Expire`], so that every node drops the same
    /// answers and events at the same position; dropped here once it is durable. Appends
    /// nothing while nothing has expired.
    ///
    /// # Errors
    /// The log refused the record or it did not become durable; nothing was dropped.
    pub async fn expire_replicated(&self) -> Result<Purged> {
        let expiry = Expiry { at: self.shared.clock.now() };
        let event_horizon = expiry.at - EVENT_RETENTION.as_millis() as i64;
        if !self.shared.idem.any_expired(expiry.at) && !self.shared.outbox.any_before(event_horizon)
        {
            return Ok(Purged::default());
        }
        let options = AppendOptions { reserve: false, epoch: None };
        self.shared.append(&Record::Expire(expiry), options, |_| {})?.await?;
        Ok(expire(&self.shared.idem, &self.shared.outbox, expiry))
    }

    /// How much the side stores hold.
    pub fn side_store_sizes(&self) -> SideStoreSizes {
        SideStoreSizes { idempotency: self.shared.idem.len(), events: self.shared.outbox.len() }
    }

    /// The log itself, for tests inside the crate.
    #[cfg(test)]
    pub(crate) fn log(&self) -> Arc<dyn RecordLog> {
        Arc::clone(&self.shared.log)
    }

    /// The log's counters (LSNs, group commits, sizes, free space); atomics and short locks.
    pub fn log_stats(&self) -> WalStats {
        self.shared.log.stats()
    }

    /// The highest LSN known durable.
    pub fn durable_lsn(&self) -> Lsn {
        self.shared.log.durable_lsn()
    }

    /// Measure the data dir's free space again, so the free-space floor, its log lines and
    /// [`Service::unwritable_reason`] stay current while nothing is written.
    pub fn refresh_free_space(&self) -> Result<()> {
        self.shared.log.refresh_space()
    }

    /// Whether the log has failed (a write, flush or fsync error) and takes nothing until
    /// [`Service::heal`] re-opens it.
    pub fn storage_failed(&self) -> bool {
        self.shared.log.is_failed()
    }

    /// Why the data dir takes no writes now, as a sentence; `None` while it does.
    pub fn unwritable_reason(&self) -> Option<String> {
        self.shared.log.unwritable_reason()
    }

    /// Close the log: drain what is queued, flush, stop the commit thread. Writes after this
    /// fail; a later call is a no-op.
    pub fn close(&self) -> Result<()> {
        self.shared.log.shutdown()
    }

    /// Test hook: hold the log's commit thread, so nothing becomes durable until the guard is
    /// dropped.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn hold_commits(&self) -> Box<dyn std::fmt::Debug + '_> {
        self.shared.log.hold_commits()
    }

    /// Take a checkpoint and truncate the log behind it. One at a time, and not while a
    /// backup reads the log. Records the log archive has not taken stay (see
    /// [`crate::archive`]).
    pub async fn checkpoint(&self) -> Result<CheckpointReport> {
        self.checkpoint_keeping(false, None).await
    }

    /// [`Service::checkpoint`], calling `pace` on the writing thread as the snapshot is
    /// written (every [`PACE_EVERY`] bytes): a background checkpoint steps back for the
    /// requests that way (the server's pace; nothing here knows of requests). That thread is
    /// the checkpoint's own ("sheetd-checkpoint", ended with it), so `pace` may lower its
    /// priority.
    pub async fn checkpoint_paced(&self, pace: Pace) -> Result<CheckpointReport> {
        self.checkpoint_keeping(false, Some(pace)).await
    }

    /// A checkpoint that truncates nothing: for an offline command on a data dir whose server
    /// may archive its log (`--archive-dir`), which this process does not know of. The records
    /// stay readable for that archive, and a start still replays none of them.
    pub async fn checkpoint_keeping_log(&self) -> Result<CheckpointReport> {
        self.checkpoint_keeping(true, None).await
    }

    async fn checkpoint_keeping(
        &self,
        everything: bool,
        pace: Option<Pace>,
    ) -> Result<CheckpointReport> {
        let _one_at_a_time = self.checkpointing.lock().await;
        let Copies { file, lsn, retained, .. } = self.copies().await?;
        let log = Arc::clone(&self.shared.log);
        // Records above this stay for the archive, which has not taken them yet.
        let hold = if everything { Some(0) } else { self.archive.get().map(|a| a.hold(lsn)) };
        // Encoded on a thread of its own straight into the file: a large state takes a while,
        // and would otherwise need a buffer of its whole size; and a paced checkpoint's thread
        // may be given a lower priority, which a pooled thread would keep for other work.
        let size = spawn_own_thread("sheetd-checkpoint", move || {
            let mut size = 0;
            let mut encode = |out: &mut dyn std::io::Write| {
                size = match &pace {
                    Some(pace) => encode_snapshot(&file, &mut Paced::new(out, &**pace))?,
                    None => encode_snapshot(&file, out)?,
                };
                Ok(())
            };
            let retains = |lsn| retained.contains(&lsn) || hold.is_some_and(|h| lsn > h);
            log.checkpoint(lsn, &mut encode, &retains).map(|()| size)
        })
        .await
        .map_err(|_| Error::Unavailable("checkpoint"))??;
        Ok(CheckpointReport { lsn, bytes: usize::try_from(size).unwrap_or(usize::MAX) })
    }

    /// The copies of one consistent state for a backup, taken as a checkpoint takes them (no
    /// pause for writers beyond that), at the position of their newest tag, durable. Until
    /// the result is dropped no checkpoint runs, so the records after the oldest tag, and
    /// those the feed retains, stay readable: a backup reads them after the copies.
    pub async fn backup(&self) -> Result<BackupCopies> {
        let guard = Arc::clone(&self.checkpointing).lock_owned().await;
        let copies = self.copies().await?;
        Ok(BackupCopies {
            copies,
            log: Arc::clone(&self.shared.log),
            taken_at: self.shared.clock.now(),
            _no_checkpoint: guard,
        })
    }

    /// Starts the log archive (see [`crate::archive`]) in `config.dir`, after the segments it
    /// holds. Once only; a second call is refused.
    ///
    /// # Errors
    /// The dir cannot be created or listed, or an archive runs already.
    pub fn start_archive(&self, config: ArchiveConfig) -> std::result::Result<(), ArchiveError> {
        let dir = config.dir.display().to_string();
        let log: Arc<dyn crate::archive::ArchiveSource> = Arc::new(Arc::clone(&self.shared.log));
        let archive = Archive::start(config, log, self.shared.clock.clone())?;
        self.archive.set(Arc::new(archive)).map_err(|archive| {
            archive.stop();
            ArchiveError::Io { dir, source: std::io::Error::other("an archive runs already") }
        })
    }

    /// The log archive's position, lag and last error; `None` without an archive.
    pub fn archive_status(&self) -> Option<ArchiveStatus> {
        self.archive.get().map(|a| a.status())
    }

    /// Lets the archive take what is durable now (a few seconds at most), then stops it.
    /// Blocking.
    pub fn stop_archive(&self) {
        if let Some(archive) = self.archive.get() {
            archive.stop();
        }
    }

    /// Whether a backup (or a checkpoint) holds the checkpoint exclusion now, so a checkpoint
    /// would wait for it.
    pub fn checkpoints_held(&self) -> bool {
        self.checkpointing.try_lock().is_err()
    }

    /// The tagged copies of the directory, every sheet and the side stores (see the module
    /// docs), once the newest tag is durable.
    async fn copies(&self) -> Result<Copies> {
        let (directory, directory_lsn) = self.directory.send(CopyDirectoryForCheckpoint).await?;
        let mut sheets = Vec::new();
        for (_, addr) in self.sheets.all() {
            let copy = addr.send(CopyForCheckpoint).await?;
            sheets.push((copy.state, copy.as_of));
        }
        let (idem, outbox) = (self.shared.idem.clone(), self.shared.outbox.clone());
        let webhooks = self.shared.webhooks.clone();
        let mut side = None;
        // The marker may use the reserve below the free-space floor: a checkpoint is what
        // lets the log shrink.
        let reserve = AppendOptions { reserve: true, epoch: None };
        let appended = self.shared.append(&Record::Marker, reserve, |_| {
            side = Some((idem.snapshot(), outbox.snapshot(), webhooks.snapshot()));
        })?;
        let side_lsn = appended.await?;
        let Some((idem, (events, last_event_seq), webhooks)) = side else {
            unreachable!("an append that succeeded ran its callback")
        };
        let lsn = sheets
            .iter()
            .map(|(_, l)| *l)
            .chain([directory_lsn, side_lsn])
            .min()
            .unwrap_or(side_lsn);
        let checkpoint = Checkpoint {
            directory: (*directory).clone(),
            directory_lsn,
            sheets,
            side_lsn,
            idem,
            events,
            last_event_seq,
            next_row_id: self.shared.row_ids.peek(),
            webhooks,
        };
        // The records holding retained changes stay in the log behind the checkpoint.
        let retained: std::collections::HashSet<Lsn> =
            checkpoint.sheets.iter().flat_map(|(s, _)| s.changes.lsns()).collect();
        let changes = checkpoint.sheets.iter().map(|(s, _)| (s.id, s.changes.clone())).collect();
        let file = CheckpointFile { checkpoint, changes };
        Ok(Copies { file, lsn, newest: side_lsn, retained })
    }

    /// The webhooks as of their last durable change (what every read of them shows).
    pub fn webhooks(&self) -> &WebhookStore {
        &self.shared.webhooks
    }

    /// Makes a webhook: `make` builds it with its new id, unless `key_id` holds `max_per_key`
    /// webhooks already (`Ok(None)`). Resolves once its record is durable.
    ///
    /// # Errors
    /// The log refuses the record or fails to make it durable.
    pub async fn create_webhook(
        &self,
        key_id: KeyId,
        max_per_key: usize,
        make: impl FnOnce(WebhookId) -> Webhook,
    ) -> Result<Option<Webhook>> {
        let appended = {
            let _one_at_a_time = self.creating_webhook.lock().unwrap_or_else(|p| p.into_inner());
            if self.shared.webhooks.count_of_key(key_id) >= max_per_key {
                return Ok(None);
            }
            let webhook = make(self.shared.webhooks.reserve_id());
            let record = Record::Webhook(WebhookChange::Create(Box::new(webhook.clone())));
            (self.shared.append(&record, AppendOptions::default(), |_| {})?, webhook)
        };
        let (appended, webhook) = appended;
        let lsn = appended.await?;
        self.shared.webhooks.settle(lsn);
        Ok(Some(webhook))
    }

    /// Logs a change to a webhook (see [`WebhookChange`]); resolves once it is durable and
    /// readers see it. Every time it carries was decided by the caller: applying reads no clock.
    ///
    /// # Errors
    /// The log refuses the record or fails to make it durable.
    pub async fn change_webhook(&self, change: WebhookChange) -> Result<()> {
        let appended =
            self.shared.append(&Record::Webhook(change), AppendOptions::default(), |_| {})?;
        let lsn = appended.await?;
        self.shared.webhooks.settle(lsn);
        Ok(())
    }

    /// Lets readers see every webhook change that is durable now (one whose appender stopped
    /// waiting for it, a request that was cancelled, is shown from here on).
    pub fn settle_webhooks(&self) {
        self.shared.webhooks.settle(self.shared.log.durable_lsn());
    }

    /// Counts of what the service holds, from the published snapshots' counters (O(sheets)).
    pub fn counts(&self) -> Counts {
        let d = self.directory();
        let mut counts = Counts {
            users: d.users.len(),
            projects: d.projects.len(),
            sheets: d.sheets.len(),
            keys: d.keys.len(),
            reports: d.reports.len(),
            ..Default::default()
        };
        for (_, snapshot) in self.sheets.snapshots() {
            let (attachments, bytes) = snapshot.state.attachment_totals();
            counts.rows += snapshot.state.rows.len() as u64;
            counts.attachments += attachments;
            counts.attachment_bytes += bytes;
        }
        counts
    }
}

/// Runs `work` on a new thread named `name` and waits for it without holding the runtime;
/// `Err` when the thread cannot start or `work` panics.
async fn spawn_own_thread<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> std::result::Result<T, ()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            // The receiver may be gone (the caller dropped): nothing to tell.
            let _ = tx.send(work());
        })
        .map_err(|e| tracing::error!(error = %e, thread = name, "cannot start a thread"))?;
    rx.await.map_err(|_| ())
}

/// A background writer's chance to wait: see [`Service::checkpoint_paced`].
pub type Pace = Arc<dyn Fn() + Send + Sync>;

/// Bytes a paced checkpoint writes between two calls of its pace.
pub const PACE_EVERY: usize = 1 << 20;

/// A writer that calls its pace every [`PACE_EVERY`] bytes.
struct Paced<'a> {
    out: &'a mut dyn std::io::Write,
    pace: &'a (dyn Fn() + Send + Sync),
    since: usize,
}

impl<'a> Paced<'a> {
    fn new(out: &'a mut dyn std::io::Write, pace: &'a (dyn Fn() + Send + Sync)) -> Self {
        Paced { out, pace, since: 0 }
    }
}

impl std::io::Write for Paced<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(bytes)?;
        self.since += n;
        if self.since >= PACE_EVERY {
            self.since = 0;
            (self.pace)();
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paced_writer_passes_every_byte_and_paces_every_mebibyte() {
        use std::io::Write;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let pace = move || {
            counted.fetch_add(1, Ordering::Relaxed);
        };
        let mut out = Vec::new();
        let chunk: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        {
            let mut paced = Paced::new(&mut out, &pace);
            for _ in 0..(3 * PACE_EVERY + PACE_EVERY / 2) / chunk.len() {
                paced.write_all(&chunk).unwrap();
            }
            paced.flush().unwrap();
        }
        assert_eq!(out.len(), 3 * PACE_EVERY + PACE_EVERY / 2);
        assert!(out.chunks(chunk.len()).all(|c| c == chunk.as_slice()));
        assert_eq!(calls.load(Ordering::Relaxed), 3);
    }

    fn answer(key: &str, completed_at: Millis) -> IdemEntry {
        IdemEntry {
            key_id: 1,
            idem_key: key.to_owned(),
            fingerprint: [0; 32],
            status: 200,
            body: b"{}".to_vec(),
            request_id: "req_1".to_owned(),
            completed_at,
        }
    }

    #[test]
    fn an_expiry_record_drops_exactly_the_answers_past_their_window_at_its_time() {
        let window = IDEMPOTENCY_WINDOW.as_millis() as Millis;
        // Nodes that read no clock while applying (as a cluster's followers do).
        let (mut expired, mut never_old) = (fresh_rebuild(Millis::MIN), fresh_rebuild(Millis::MIN));
        expired.apply(1, Record::Idempotency(answer("old", 10)));
        expired.apply(2, Record::Idempotency(answer("young", window)));
        never_old.apply(2, Record::Idempotency(answer("young", window)));
        assert_ne!(expired.digest(), never_old.digest());

        expired.apply(3, Record::Expire(Expiry { at: window + 10 }));
        assert_eq!(expired.idem.len(), 1);
        assert_eq!(expired.digest(), never_old.digest(), "only the old answer went");
    }

    /// A state rebuilt from a checkpoint (a start's, a follower's after a Raft snapshot) has
    /// the indexes a checkpoint does not hold: keys by their secret's hash, rows by parent,
    /// columns by position, attachment totals.
    #[test]
    fn a_state_loaded_from_a_checkpoint_has_its_derived_indexes() {
        let secret = "svc_live_AdaReadKey00000000000000000000000002";
        let fixture: crate::directory::fixture::Fixture = serde_json::from_value(serde_json::json!({
            "users": [{"id": 1, "name": "ada"}],
            "projects": [{"id": 1, "name": "Ops", "ownerId": 1}],
            "sheets": [{"id": 10, "projectId": 1, "name": "Tasks"}],
            "columns": [
                {"id": 101, "sheetId": 10, "name": "Status", "type": "text", "position": 1},
                {"id": 100, "sheetId": 10, "name": "Task", "type": "text", "position": 0, "primary": true}
            ],
            "rows": [
                {"id": 1000, "sheetId": 10, "cells": {"100": "root"}, "attachments": [{"name": "a.pdf", "bytes": 100}]},
                {"id": 1001, "sheetId": 10, "parentId": 1000, "cells": {"100": "child"}}
            ],
            "keys": [{"id": 2, "ownerId": 1, "name": "ada-read", "secret": secret,
                      "grants": [{"verb": "read", "scopeType": "project", "scopeId": 1}]}]
        }))
        .unwrap();
        let (batch, _) =
            crate::directory::fixture::prepare(fixture, &DirectoryState::default(), 1, 0).unwrap();
        let mut first = fresh_rebuild(Millis::MIN);
        first.apply(1, Record::Import(Box::new(batch)));
        let (file, _) = first.checkpoint_at(1);
        let mut bytes = Vec::new();
        encode_snapshot(&file, &mut bytes).unwrap();

        let mut loaded = fresh_rebuild(Millis::MIN);
        loaded.load_snapshot(
            1,
            CheckpointFile::decode(&mut bytes.as_slice()).unwrap(),
            loaded.retention,
        );
        let hash = crate::directory::keys::hash_secret(secret);
        assert_eq!(loaded.directory().key_by_hash(&hash).map(|k| k.id), Some(2));
        let (sheet, _) = loaded.sheet(10).unwrap();
        assert_eq!(sheet.subtree(1000).unwrap(), [1000, 1001]);
        let positions: Vec<crate::model::ColumnId> =
            sheet.columns_by_position().iter().map(|c| c.id).collect();
        assert_eq!(positions, [100, 101]);
        assert_eq!(sheet.attachment_totals(), (1, 100));
    }

    use crate::webhook::WebhookSecret;

    fn table() -> WebhookTable {
        let mut t = WebhookTable::default();
        t.apply(&WebhookChange::Create(Box::new(Webhook {
            id: 3,
            key_id: 1,
            sheet_id: 10,
            url: "http://example.com/".into(),
            description: Some("d".into()),
            secret: WebhookSecret([9; 32]),
            disabled: None,
            cursor: 7,
            in_flight: Some(9),
            last_delivery: None,
            consecutive_failures: 0,
            failing_since: None,
            created_at: 1,
        })));
        t
    }

    #[test]
    fn a_checkpoint_carries_its_webhooks_and_one_of_format_3_reads_without_them() {
        let checkpoint =
            Checkpoint { next_row_id: 42, side_lsn: 5, webhooks: table(), ..Default::default() };
        let file = CheckpointFile { checkpoint, changes: Vec::new() };
        let mut bytes = Vec::new();
        encode_snapshot(&file, &mut bytes).unwrap();
        let back = CheckpointFile::decode(&mut bytes.as_slice()).unwrap();
        assert_eq!((back.next_row_id, back.webhooks), (42, table()));

        // Format 3 laid out the same checkpoint and change indexes, and nothing after them.
        let old = (&file.checkpoint, &file.changes);
        let mut bytes = Vec::new();
        encode_snapshot(&old, &mut bytes).unwrap();
        bytes[0] = 3;
        let back = CheckpointFile::decode(&mut bytes.as_slice()).unwrap();
        assert_eq!((back.next_row_id, back.webhooks), (42, WebhookTable::default()));
    }
}
