//! The [`SheetActor`]: the one writer of a sheet's rows.
//!
//! # Pipeline
//!
//! A write is decided and applied to memory in mailbox order, its record is queued on the log,
//! and the actor moves on to its next message at once; the reply future resolves when the group
//! commit covering the record is durable. So one sheet takes many writes per flush, and version
//! checks still see every earlier write. Reads return the LSN of the last write they can see
//! (`visible_lsn`); the caller waits for that LSN to be durable before replying, so no reply
//! reveals a write that a crash could still take back.

mod state;

use actix::prelude::*;
use imbl::OrdMap;
use serde_json::{Map, Value};
use wal::{codec, Lsn};

use crate::error::{Error, Result};
use crate::model::{Column, Millis, Row, RowId, SheetId};
use crate::record::{IdemEntry, Record, SheetWrite};
use crate::shared::Shared;
pub use state::{PatchItem, SheetState, UpdateItem};

/// Renders the response of an idempotent write so it can be stored in the write's own record.
/// Returns `None` when the outcome must not be stored (server errors).
pub type Render = Box<dyn FnOnce(&Result<WriteOutcome>) -> Option<(u16, Vec<u8>)> + Send>;

/// The idempotency part of a write message.
pub struct IdemRequest {
    /// The key's namespace (API key id).
    pub key_id: u64,
    /// The `Idempotency-Key` header.
    pub idem_key: String,
    /// Fingerprint of method, path, query and body.
    pub fingerprint: [u8; 32],
    /// The request id that the stored body carries.
    pub request_id: String,
    /// Renders the stored response.
    pub render: Render,
}

/// What a write did.
#[derive(Debug)]
pub enum WriteOutcome {
    /// Bulk writes: one result per item, in request order.
    Bulk(Vec<Result<Row>>),
    /// A patch: the row after the write.
    Row(Box<Row>),
    /// A delete: the rows removed (the row and its subtree).
    Deleted(Vec<RowId>),
}

/// The reply to a write: the outcome, and the stored response when the write was idempotent.
#[derive(Debug)]
pub struct WriteReply {
    /// The outcome.
    pub result: Result<WriteOutcome>,
    /// `(status, body)` as stored for replay; the handler sends exactly these bytes.
    pub stored: Option<(u16, Vec<u8>)>,
}

/// Counters and times of the sheet.
#[derive(Clone, Debug, MessageResponse)]
pub struct SheetSummary {
    /// Rows in the sheet.
    pub row_count: u64,
    /// Columns in the sheet.
    pub column_count: u64,
    /// Creation time.
    pub created_at: Millis,
    /// Last write time.
    pub updated_at: Millis,
    /// Attachments on the sheet's rows: (count, bytes).
    pub attachments: (u64, u64),
    /// Wait for this LSN to be durable before revealing the answer.
    pub visible_lsn: Lsn,
}

/// A page of rows.
#[derive(Clone, Debug, MessageResponse)]
pub struct RowPage {
    /// The rows, by id.
    pub rows: Vec<Row>,
    /// Whether more rows follow the last one.
    pub more: bool,
    /// Wait for this LSN to be durable before revealing the answer.
    pub visible_lsn: Lsn,
}

/// A consistent copy of a sheet's columns and rows (O(1): the row map is persistent).
#[derive(Clone, Debug, MessageResponse)]
pub struct SheetView {
    /// Columns ordered by position.
    pub columns: Vec<Column>,
    /// Rows by id.
    pub rows: OrdMap<RowId, Row>,
    /// The LSN of the last record applied (wait for it before revealing the copy).
    pub lsn: Lsn,
}

/// The whole state of a sheet for a checkpoint.
#[derive(Clone, Debug, MessageResponse)]
pub struct CheckpointCopy {
    /// The state (rows are shared with the live map, not copied).
    pub state: SheetState,
    /// Every record touching this sheet at or below this LSN is in the copy.
    pub as_of: Lsn,
}

/// Counters and times of the sheet.
#[derive(Message)]
#[rtype(result = "SheetSummary")]
pub struct Describe;

/// The columns, ordered by position.
#[derive(Message)]
#[rtype(result = "(Vec<Column>, Lsn)")]
pub struct ListColumns;

/// A page of rows after a row id.
#[derive(Message)]
#[rtype(result = "RowPage")]
pub struct PageRows {
    /// Start after this id.
    pub after: Option<RowId>,
    /// At most this many rows.
    pub limit: usize,
}

/// Counters, columns and the first page of rows, read at one instant (getSheet).
#[derive(Message)]
#[rtype(result = "(SheetSummary, Vec<Column>, RowPage)")]
pub struct Overview {
    /// Rows in the first page.
    pub limit: usize,
}

/// A consistent copy of the sheet's columns and rows, with the LSN it reflects.
#[derive(Message)]
#[rtype(result = "SheetView")]
pub struct Snapshot;

/// The whole state, for a checkpoint.
#[derive(Message)]
#[rtype(result = "CheckpointCopy")]
pub struct CopyForCheckpoint;

/// Add rows.
#[derive(Message)]
#[rtype(result = "WriteReply")]
pub struct BulkAdd {
    /// Cells of each new row, raw.
    pub items: Vec<Map<String, Value>>,
    /// The sheet's row cap under its owner's plan.
    pub cap: u64,
    /// Idempotency, when the request carried a key.
    pub idem: Option<IdemRequest>,
}

/// Replace the cells of rows, each at an expected version.
#[derive(Message)]
#[rtype(result = "WriteReply")]
pub struct BulkUpdate {
    /// The items, in request order.
    pub items: Vec<UpdateItem>,
    /// Idempotency, when the request carried a key.
    pub idem: Option<IdemRequest>,
}

/// Merge cells into one row at an expected version.
#[derive(Message)]
#[rtype(result = "WriteReply")]
pub struct Patch {
    /// The row.
    pub row_id: RowId,
    /// The change.
    pub item: PatchItem,
    /// Idempotency, when the request carried a key.
    pub idem: Option<IdemRequest>,
}

/// Delete a row and its subtree.
#[derive(Message)]
#[rtype(result = "WriteReply")]
pub struct DeleteRow {
    /// The row.
    pub row_id: RowId,
    /// Idempotency, when the request carried a key.
    pub idem: Option<IdemRequest>,
}

/// The one writer of a sheet's rows.
pub struct SheetActor {
    state: SheetState,
    shared: Shared,
    /// LSN of the last record applied to `state`.
    applied_lsn: Lsn,
}

impl SheetActor {
    /// An actor over recovered state; `applied_lsn` is the last record that touched it.
    pub fn new(state: SheetState, shared: Shared, applied_lsn: Lsn) -> Self {
        SheetActor { state, shared, applied_lsn }
    }

    /// The sheet's id.
    pub fn id(&self) -> SheetId {
        self.state.id
    }

    /// Apply a decided write to memory, log it with its side effects, and return a reply that
    /// resolves once the record is durable.
    fn commit(
        &mut self,
        put: Vec<Row>,
        deleted: Vec<RowId>,
        result: Result<WriteOutcome>,
        idem: Option<IdemRequest>,
    ) -> ResponseFuture<WriteReply> {
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
            let wait = self.shared.wal.wait_durable(self.applied_lsn);
            return Box::pin(async move {
                match wait.await {
                    Ok(()) => WriteReply { result, stored },
                    Err(e) => WriteReply { result: Err(e.into()), stored: None },
                }
            });
        }
        let write = SheetWrite { sheet_id: self.state.id, at, put, deleted, idem: entry };
        let (sheet_id, deleted, idem_entry) =
            (write.sheet_id, write.deleted.clone(), write.idem.clone());
        let record = Record::Sheet(write);
        let appended = codec::encode(&record).map_err(Error::from).and_then(|bytes| {
            let (idem_store, outbox) = (self.shared.idem.clone(), self.shared.outbox.clone());
            Ok(self.shared.wal.append_with(move |lsn| {
                if let Some(e) = idem_entry {
                    idem_store.complete(e, lsn);
                }
                outbox.row_deleted(sheet_id, &deleted, at, lsn);
                bytes
            })?)
        });
        match (appended, record) {
            (Ok(commit), Record::Sheet(write)) => {
                // Applied only once the log has taken the record: a refused append (no space,
                // a failed log) leaves memory as it was, so no reader ever sees that write.
                self.state.apply(&write);
                self.applied_lsn = commit.lsn();
                Box::pin(async move {
                    match commit.await {
                        Ok(_) => WriteReply { result, stored },
                        Err(e) => WriteReply { result: Err(e.into()), stored: None },
                    }
                })
            }
            (Ok(_), _) => unreachable!("built as a sheet record"),
            (Err(e), _) => {
                tracing::warn!(sheet = sheet_id, error = %e, "the log refused a write; it is not acknowledged");
                Box::pin(async move { WriteReply { result: Err(e), stored: None } })
            }
        }
    }
}

impl Actor for SheetActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Many writers per sheet are normal; the default mailbox of 16 would make senders wait.
        ctx.set_mailbox_capacity(4096);
    }
}

impl Handler<Describe> for SheetActor {
    type Result = SheetSummary;

    fn handle(&mut self, _: Describe, _: &mut Self::Context) -> SheetSummary {
        self.summary()
    }
}

impl SheetActor {
    fn summary(&self) -> SheetSummary {
        SheetSummary {
            row_count: self.state.rows.len() as u64,
            column_count: self.state.columns.len() as u64,
            created_at: self.state.created_at,
            updated_at: self.state.updated_at,
            attachments: self.state.attachment_totals(),
            visible_lsn: self.applied_lsn,
        }
    }
}

impl Handler<Overview> for SheetActor {
    type Result = MessageResult<Overview>;

    fn handle(&mut self, msg: Overview, _: &mut Self::Context) -> Self::Result {
        let (rows, more) = self.state.page(None, msg.limit);
        let page = RowPage { rows, more, visible_lsn: self.applied_lsn };
        MessageResult((self.summary(), self.state.columns_by_position(), page))
    }
}

impl Handler<ListColumns> for SheetActor {
    type Result = MessageResult<ListColumns>;

    fn handle(&mut self, _: ListColumns, _: &mut Self::Context) -> Self::Result {
        MessageResult((self.state.columns_by_position(), self.applied_lsn))
    }
}

impl Handler<PageRows> for SheetActor {
    type Result = RowPage;

    fn handle(&mut self, msg: PageRows, _: &mut Self::Context) -> RowPage {
        let (rows, more) = self.state.page(msg.after, msg.limit);
        RowPage { rows, more, visible_lsn: self.applied_lsn }
    }
}

impl Handler<Snapshot> for SheetActor {
    type Result = SheetView;

    fn handle(&mut self, _: Snapshot, _: &mut Self::Context) -> SheetView {
        SheetView {
            columns: self.state.columns_by_position(),
            rows: self.state.rows.clone(),
            lsn: self.applied_lsn,
        }
    }
}

impl Handler<CopyForCheckpoint> for SheetActor {
    type Result = CheckpointCopy;

    fn handle(&mut self, _: CopyForCheckpoint, _: &mut Self::Context) -> CheckpointCopy {
        // This actor appends (and applies) every record touching its sheet inside its own
        // handlers, so all of them up to the log's last LSN are in `state` now.
        CheckpointCopy { state: self.state.clone(), as_of: self.shared.wal.last_lsn() }
    }
}

impl Handler<BulkAdd> for SheetActor {
    type Result = ResponseFuture<WriteReply>;

    fn handle(&mut self, msg: BulkAdd, _: &mut Self::Context) -> Self::Result {
        let now = self.shared.clock.now();
        let (results, put) = self.state.bulk_add(&msg.items, msg.cap, now, &self.shared.row_ids);
        self.commit(put, Vec::new(), Ok(WriteOutcome::Bulk(results)), msg.idem)
    }
}

impl Handler<BulkUpdate> for SheetActor {
    type Result = ResponseFuture<WriteReply>;

    fn handle(&mut self, msg: BulkUpdate, _: &mut Self::Context) -> Self::Result {
        let now = self.shared.clock.now();
        let (results, put) = self.state.bulk_update(&msg.items, now);
        self.commit(put, Vec::new(), Ok(WriteOutcome::Bulk(results)), msg.idem)
    }
}

impl Handler<Patch> for SheetActor {
    type Result = ResponseFuture<WriteReply>;

    fn handle(&mut self, msg: Patch, _: &mut Self::Context) -> Self::Result {
        let now = self.shared.clock.now();
        match self.state.patch(msg.row_id, &msg.item, now) {
            Ok(row) => self.commit(
                vec![row.clone()],
                Vec::new(),
                Ok(WriteOutcome::Row(Box::new(row))),
                msg.idem,
            ),
            Err(e) => self.commit(Vec::new(), Vec::new(), Err(e), msg.idem),
        }
    }
}

impl Handler<DeleteRow> for SheetActor {
    type Result = ResponseFuture<WriteReply>;

    fn handle(&mut self, msg: DeleteRow, _: &mut Self::Context) -> Self::Result {
        match self.state.subtree(msg.row_id) {
            Ok(ids) => {
                self.commit(Vec::new(), ids.clone(), Ok(WriteOutcome::Deleted(ids)), msg.idem)
            }
            Err(e) => self.commit(Vec::new(), Vec::new(), Err(e), msg.idem),
        }
    }
}
