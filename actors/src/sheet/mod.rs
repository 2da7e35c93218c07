//! The [`SheetActor`]: the one writer of a sheet's rows.
//!
//! # Pipeline
//!
//! A write is decided in mailbox order, its record is queued on the log, and only then applied
//! to memory (a record the log refuses leaves no trace); the actor moves on to its next message
//! at once, and the reply future resolves when the group commit covering the record is durable.
//! So one sheet takes many writes per flush, and version checks still see every earlier write.
//!
//! # Reads
//!
//! Readers never message the actor. When a write's record is durable, its reply future
//! publishes the sheet as of that write ([`SheetSnapshot`], an O(1) copy) before the reply
//! leaves; readers on any thread load the latest published snapshot. So reads never queue
//! behind writes, never wait for a flush, and never reveal a write a crash could take back.
//!
//! # Upserts
//!
//! An upsert finds each item's row by its key through the key indexes ([`keys`]), which live
//! beside the working state (never in a published snapshot) and follow every write in
//! `SheetActor::commit`, the one place a write reaches memory.

mod changes;
pub mod keys;
mod load;
mod state;

use std::sync::Arc;

use actix::prelude::*;
use serde_json::{Map, Value};

use crate::error::Result;
use crate::log::{encode_elsewhere, AppendOptions, Lsn};
use crate::model::{Row, RowId, SheetId};
pub use crate::publish::Published;
use crate::publish::{drop_elsewhere, AtPosition, Publisher};
use crate::record::{IdemEntry, Record, SheetWrite};
pub use crate::shared::Retention;
use crate::shared::Shared;
pub use changes::{extract, Change, ChangeKind, ChangeLog, ChangeSpan, SpanCache};
use keys::KeyIndexes;
pub use state::{IfMatch, PatchItem, SheetState, UpdateItem, UpsertAction, Upserted};

/// Renders the response of an idempotent write so it can be stored in the write's own record.
/// Returns `None` when the outcome must not be stored (server errors, or a response that could
/// not be rendered).
pub type Render<T> = Box<dyn FnOnce(&Result<T>) -> Option<(u16, Vec<u8>)> + Send>;

/// The idempotency part of a write message whose outcome is a `T`.
pub struct IdemRequest<T> {
    /// The key's namespace (API key id).
    pub key_id: u64,
    /// The `Idempotency-Key` header.
    pub idem_key: String,
    /// Fingerprint of method, path, query and body.
    pub fingerprint: [u8; 32],
    /// The request id that the stored body carries.
    pub request_id: String,
    /// Renders the stored response.
    pub render: Render<T>,
}

/// The outcome of a bulk add or a bulk update: one result per item, in request order.
pub type RowResults = Vec<Result<Arc<Row>>>;

/// Rows written or deleted from which a write's replaced states are dropped on another thread
/// (`drop_elsewhere`): a bulk body's, not a patch's.
const LARGE_WRITE: usize = 64;

/// The outcome of a bulk upsert: one result per item, in request order, with what each did.
pub type UpsertResults = Vec<Result<Upserted>>;

/// The reply to a write whose outcome is a `T`: the outcome, and the stored response when the
/// write was idempotent.
#[derive(Debug)]
pub struct WriteReply<T> {
    /// The outcome.
    pub result: Result<T>,
    /// `(status, body)` as stored for replay; the handler sends exactly these bytes.
    pub stored: Option<(u16, Vec<u8>)>,
}

/// A sheet as of a durable LSN: what every reader sees.
///
/// The actor publishes one after each write whose record is durable (and one at start), so a
/// reader loads the latest with no message and no lock, never waits for a flush, and never sees
/// a write a crash could take back. Cloning the state is O(1), so publishing costs the writer a
/// few pointer copies.
#[derive(Clone, Debug)]
pub struct SheetSnapshot {
    /// The sheet's columns, rows and counters.
    pub state: SheetState,
    /// Every record touching this sheet up to this LSN is in `state`, and durable.
    pub lsn: Lsn,
}

impl AtPosition for SheetSnapshot {
    fn lsn(&self) -> Lsn {
        self.lsn
    }
}

/// Where a sheet's latest [`SheetSnapshot`] is published: shared by its actor (the one writer)
/// and every reader.
pub type PublishedSheet = Arc<Published<SheetSnapshot>>;

/// The whole state of a sheet for a checkpoint.
#[derive(Clone, Debug, MessageResponse)]
pub struct CheckpointCopy {
    /// The state (rows are shared with the live map, not copied).
    pub state: SheetState,
    /// Every record touching this sheet at or below this LSN is in the copy.
    pub as_of: Lsn,
}

/// The whole state, for a checkpoint.
#[derive(Message)]
#[rtype(result = "CheckpointCopy")]
pub struct CopyForCheckpoint;

/// Add rows.
#[derive(Message)]
#[rtype(result = "WriteReply<RowResults>")]
pub struct BulkAdd {
    /// Cells of each new row, raw.
    pub items: Vec<Map<String, Value>>,
    /// The sheet's row cap under its owner's plan.
    pub cap: u64,
    /// Idempotency, when the request carried a key.
    pub idem: Option<IdemRequest<RowResults>>,
}

/// Create or merge rows by the value of a key column.
#[derive(Message)]
#[rtype(result = "WriteReply<UpsertResults>")]
pub struct BulkUpsert {
    /// The key column as the request names it (checked here, against the sheet's columns).
    pub key_column: String,
    /// Cells of each item, raw.
    pub items: Vec<Map<String, Value>>,
    /// The sheet's row cap under its owner's plan.
    pub cap: u64,
    /// Idempotency, when the request carried a key.
    pub idem: Option<IdemRequest<UpsertResults>>,
}

/// Replace the cells of rows, each at an expected version.
#[derive(Message)]
#[rtype(result = "WriteReply<RowResults>")]
pub struct BulkUpdate {
    /// The items, in request order.
    pub items: Vec<UpdateItem>,
    /// Idempotency, when the request carried a key.
    pub idem: Option<IdemRequest<RowResults>>,
}

/// Merge cells into one row at an expected version.
#[derive(Message)]
#[rtype(result = "WriteReply<Arc<Row>>")]
pub struct Patch {
    /// The row to patch; one of another sheet is 404, as a missing one is.
    pub row_id: RowId,
    /// The change.
    pub item: PatchItem,
    /// Idempotency, when the request carried a key.
    pub idem: Option<IdemRequest<Arc<Row>>>,
}

/// Delete a row and its subtree.
#[derive(Message)]
#[rtype(result = "WriteReply<Vec<RowId>>")]
pub struct DeleteRow {
    /// The row to delete, with its subtree; one of another sheet is 404.
    pub row_id: RowId,
    /// The request's precondition on the row's version, if any.
    pub if_match: Option<IfMatch>,
    /// Idempotency, when the request carried a key.
    pub idem: Option<IdemRequest<Vec<RowId>>>,
}

/// The one writer of a sheet's rows.
pub struct SheetActor {
    state: SheetState,
    shared: Shared,
    /// LSN of the last record applied to `state`.
    applied_lsn: Lsn,
    /// Publishes the sheet to readers as of its last durable write, and keeps what a re-sync
    /// after a lost log tail goes back to.
    publisher: Publisher<SheetSnapshot>,
    /// The key indexes of upserts over `state`: built on demand, kept in step by `commit`.
    keys: KeyIndexes,
}

impl SheetActor {
    /// An actor over `state`, which reflects every record up to `applied_lsn` that touched it,
    /// and the place its snapshots are published (holding `state` already).
    pub(crate) fn new(
        state: SheetState,
        shared: Shared,
        applied_lsn: Lsn,
        published: PublishedSheet,
    ) -> Self {
        let publisher = Publisher::new(published, shared.log.epoch());
        SheetActor { state, shared, applied_lsn, publisher, keys: KeyIndexes::default() }
    }

    /// Returns the working state to the durable one if the log's epoch moved on since it was
    /// last in step (see [`Publisher::resync`]): writes applied here whose records the log
    /// lost must not be decided upon, and must never reach a reader.
    fn sync_with_log(&mut self) {
        let epoch = self.shared.log.epoch();
        let Some(snapshot) = self.publisher.resync(epoch, self.shared.log.durable_lsn()) else {
            return;
        };
        tracing::info!(
            sheet = self.state.id,
            lsn = snapshot.lsn,
            dropped_lsn = self.applied_lsn,
            "the log was re-opened: the sheet goes on from its durable state"
        );
        self.state = snapshot.state.clone();
        // Built over the state just dropped; the next upsert builds them again.
        self.keys.clear();
        self.applied_lsn = snapshot.lsn;
    }

    /// The sheet's id.
    pub fn id(&self) -> SheetId {
        self.state.id
    }

    /// Apply a decided write to memory, log it with its side effects, and return a reply that
    /// resolves once the record is durable.
    fn commit<T: Send + 'static>(
        &mut self,
        put: Vec<Arc<Row>>,
        deleted: Vec<RowId>,
        result: Result<T>,
        idem: Option<IdemRequest<T>>,
    ) -> ResponseFuture<WriteReply<T>> {
        let at = self.shared.clock.now();
        let mut stored = None;
        let entry = idem.and_then(|i| {
            let (status, body) = (i.render)(&result)?;
            stored = Some((status, body.clone()));
            Some(IdemEntry {
                key_id: i.key_id,
                idem_key: i.idem_key,
                fingerprint: i.fingerprint,
                status,
                body,
                request_id: i.request_id,
                completed_at: at,
            })
        });
        if put.is_empty() && deleted.is_empty() && entry.is_none() {
            // Nothing changed and nothing to store, but the answer may rest on earlier writes
            // (a conflict shows the current row): wait for those to be durable.
            let wait = self.shared.log.wait_durable(self.applied_lsn);
            return Box::pin(async move {
                match wait.await {
                    Ok(()) => WriteReply { result, stored },
                    Err(e) => WriteReply { result: Err(e), stored: None },
                }
            });
        }
        let sheet_id = self.state.id;
        // What a large write replaced is freed on another thread (see `drop_elsewhere`).
        let large = put.len() + deleted.len() >= LARGE_WRITE;
        let record =
            Arc::new(Record::Sheet(SheetWrite { sheet_id, at, put, deleted, idem: entry }));
        let options = AppendOptions { reserve: false, epoch: Some(self.publisher.epoch()) };
        // Applied only once the log has taken the record: a refused append (no space, a failed
        // log) leaves memory as it was, so no reader ever sees that write. The key indexes
        // follow each row the map gives back.
        let keys = &mut self.keys;
        let mut replaced = |old: Option<&Arc<Row>>, new: Option<&Arc<Row>>| {
            keys.replaced(old.map(|r| &**r), new.map(|r| &**r));
        };
        let (appended, applied) = if large {
            // A large write's record is encoded (compressed, mostly) on another core while its
            // rows go into a copy of the state, which replaces the state only once the log took
            // the record.
            let Record::Sheet(write) = &*record else { unreachable!("built as a sheet record") };
            let encoding = encode_elsewhere(Arc::clone(&record));
            let mut next = self.state.clone();
            let pending = next.apply_rows_with(write, &mut replaced);
            let appended = encoding
                .bytes()
                .and_then(|bytes| self.shared.append_encoded(&record, bytes, options, |_| {}));
            (appended, Some((next, pending)))
        } else {
            (self.shared.append(&record, options, |_| {}), None)
        };
        let appended = match appended {
            Ok(appended) => appended,
            Err(e) => {
                tracing::warn!(sheet = sheet_id, error = %e, "the log refused a write; it is not acknowledged");
                if applied.is_some() {
                    // They followed rows the state never took: the next upsert builds them again.
                    self.keys.clear();
                }
                // The log may have lost records since this message's decision.
                self.sync_with_log();
                return Box::pin(async move { WriteReply { result: Err(e), stored: None } });
            }
        };
        let lsn = appended.lsn();
        match applied {
            Some((next, pending)) => {
                self.state = next;
                self.state.record_changes(pending, lsn);
            }
            None => {
                let Record::Sheet(write) = &*record else {
                    unreachable!("built as a sheet record")
                };
                self.state.apply_with(write, lsn, &mut replaced);
            }
        }
        self.state.changes.prune(at, self.shared.retention);
        self.applied_lsn = lsn;
        let snapshot = Arc::new(SheetSnapshot { state: self.state.clone(), lsn });
        let durable = self.shared.log.durable_lsn();
        self.publisher.keep_retiring(Arc::clone(&snapshot), durable, |done| {
            if large {
                drop_elsewhere(done);
            }
        });
        let published = Arc::clone(self.publisher.published());
        Box::pin(async move {
            match appended.await {
                Ok(_) => {
                    // Before the reply leaves: a client that saw its write acknowledged reads
                    // it back.
                    let displaced = published.publish(&snapshot);
                    if large {
                        drop_elsewhere(displaced);
                    }
                    WriteReply { result, stored }
                }
                Err(e) => WriteReply { result: Err(e), stored: None },
            }
        })
    }
}

impl Actor for SheetActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Many writers per sheet are normal; the default mailbox of 16 would make senders wait.
        ctx.set_mailbox_capacity(4096);
    }
}

impl Handler<CopyForCheckpoint> for SheetActor {
    type Result = CheckpointCopy;

    fn handle(&mut self, _: CopyForCheckpoint, _: &mut Self::Context) -> CheckpointCopy {
        // This actor appends (and applies) every record touching its sheet inside its own
        // handlers, so all of them up to the log's last LSN are in `state` now.
        CheckpointCopy { state: self.state.clone(), as_of: self.shared.log.last_lsn() }
    }
}

impl Handler<BulkAdd> for SheetActor {
    type Result = ResponseFuture<WriteReply<RowResults>>;

    fn handle(&mut self, msg: BulkAdd, _: &mut Self::Context) -> Self::Result {
        self.sync_with_log();
        let now = self.shared.clock.now();
        let (results, put) = self.state.bulk_add(msg.items, msg.cap, now, &self.shared.row_ids);
        self.commit(put, Vec::new(), Ok(results), msg.idem)
    }
}

impl Handler<BulkUpsert> for SheetActor {
    type Result = ResponseFuture<WriteReply<UpsertResults>>;

    fn handle(&mut self, msg: BulkUpsert, _: &mut Self::Context) -> Self::Result {
        self.sync_with_log();
        let key = match self.state.key_column(&msg.key_column) {
            Ok(column) => column.id,
            Err(e) => return self.commit(Vec::new(), Vec::new(), Err(e), msg.idem),
        };
        let now = self.shared.clock.now();
        let index = self.keys.get_or_build(&self.state, key);
        let (results, put) =
            self.state.bulk_upsert(key, msg.items, msg.cap, now, &self.shared.row_ids, index);
        self.commit(put, Vec::new(), Ok(results), msg.idem)
    }
}

impl Handler<BulkUpdate> for SheetActor {
    type Result = ResponseFuture<WriteReply<RowResults>>;

    fn handle(&mut self, msg: BulkUpdate, _: &mut Self::Context) -> Self::Result {
        self.sync_with_log();
        let now = self.shared.clock.now();
        let (results, put) = self.state.bulk_update(&msg.items, now);
        self.commit(put, Vec::new(), Ok(results), msg.idem)
    }
}

impl Handler<Patch> for SheetActor {
    type Result = ResponseFuture<WriteReply<Arc<Row>>>;

    fn handle(&mut self, msg: Patch, _: &mut Self::Context) -> Self::Result {
        self.sync_with_log();
        let now = self.shared.clock.now();
        match self.state.patch(msg.row_id, &msg.item, now) {
            Ok(row) => self.commit(vec![Arc::clone(&row)], Vec::new(), Ok(row), msg.idem),
            Err(e) => self.commit(Vec::new(), Vec::new(), Err(e), msg.idem),
        }
    }
}

impl Handler<DeleteRow> for SheetActor {
    type Result = ResponseFuture<WriteReply<Vec<RowId>>>;

    fn handle(&mut self, msg: DeleteRow, _: &mut Self::Context) -> Self::Result {
        self.sync_with_log();
        match self.state.delete(msg.row_id, msg.if_match.as_ref()) {
            Ok(ids) => self.commit(Vec::new(), ids.clone(), Ok(ids), msg.idem),
            Err(e) => self.commit(Vec::new(), Vec::new(), Err(e), msg.idem),
        }
    }
}
