//! Log records: what the domain writes to the WAL, and how each is applied again on recovery.
//!
//! # Ownership
//!
//! Every record has one owner that appends it and applies it to memory:
//!
//! | record | owner | side stores touched inside the append lock |
//! |---|---|---|
//! | [`Record::Import`] | directory actor (metadata) + the sheets it creates | none |
//! | [`Record::Directory`] | directory actor | none |
//! | [`Record::Sheet`] | one sheet actor | idempotency store, event outbox |
//! | [`Record::Idempotency`] | [`crate::Service::store_answer`], for an answer decided before a sheet | idempotency store |
//! | [`Record::Marker`] | the checkpointer | none (it snapshots the side stores) |
//! | [`Record::FeedRetention`] | a cluster leader's promotion | none (the sheets prune by it) |
//! | [`Record::Expire`] | a cluster leader's housekeeping | idempotency store, event outbox |
//! | [`Record::Webhook`] | [`crate::Service::change_webhook`] (the API and the delivery side) | webhook table |
//!
//! A write's rows, its idempotency response, its counters and its `ROW_DELETED` events are one
//! record, so a crash keeps all of them or none.
//!
//! Records carry full row states (not diffs), so applying one is a plain overwrite and replaying
//! it twice gives the same state: recovery never has to reason about partial application.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use crate::model::{
    ApiKey, Column, Folder, KeyId, Millis, Plan, Project, Report, Row, RowId, Share, SheetId,
    SheetMeta, User, UserId,
};
use crate::webhook::WebhookChange;

/// How long changes are kept: at least `days` and at least the last `min_changes` per sheet.
/// Here, beside [`Record::FeedRetention`] that carries it, so records depend on nothing the
/// actors share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    /// Days a change is kept at least.
    pub days: u32,
    /// Changes per sheet kept at least.
    pub min_changes: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention { days: 7, min_changes: 100_000 }
    }
}

/// One entry of the write-ahead log.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Record {
    /// Objects added by a fixture or `POST /admin/v1/import`.
    Import(Box<ImportBatch>),
    /// A change to users, shares, plans or keys.
    Directory(DirectoryChange),
    /// A write to one sheet's rows, with its side effects.
    Sheet(SheetWrite),
    /// A stored idempotent response for a request that wrote nothing to a sheet.
    Idempotency(IdemEntry),
    /// Written by a checkpoint to fix the LSN at which the side stores were copied.
    Marker,
    /// The change feed's retention from here on. A cluster's leader appends it when its
    /// `--changes-retention-*` differ from the group's, so every node prunes its feeds alike.
    FeedRetention(Retention),
    /// Idempotent answers and events past their windows at `at`, dropped. A cluster's leader
    /// appends it from its housekeeping, so every node forgets the same answers at the same
    /// position (no node applies its own clock).
    Expire(Expiry),
    /// A change to a webhook (made, removed, enabled, disabled, a message fixed, an attempt).
    /// Added last: the variants before keep their encoding.
    Webhook(WebhookChange),
}

/// What [`Record::Expire`] drops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expiry {
    /// The leader's time when it decided: answers completed a whole idempotency window
    /// before it, and events older than their retention before it, are gone.
    pub at: Millis,
}

/// Normalized, validated objects of one import. Rows are already coerced.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ImportBatch {
    /// Row caps per plan, when the fixture sets them.
    pub plan_caps: Option<PlanCaps>,
    pub users: Vec<User>,
    pub projects: Vec<Project>,
    pub folders: Vec<Folder>,
    /// New sheets with their columns and rows.
    pub sheets: Vec<SheetImport>,
    pub shares: Vec<Share>,
    pub reports: Vec<Report>,
    /// New keys (hashes only; secrets never reach the log).
    pub keys: Vec<ApiKey>,
    /// Rows for sheets that already existed before this import.
    pub rows_for_existing: Vec<Row>,
}

/// One new sheet of an import.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SheetImport {
    /// Identity and place.
    pub meta: SheetMeta,
    pub columns: Vec<Column>,
    pub rows: Vec<Row>,
}

/// Per-plan row caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanCaps {
    /// Rows per sheet on `free`.
    pub free_max_rows: u64,
    /// Rows per sheet on `paid`.
    pub paid_max_rows: u64,
}

impl Default for PlanCaps {
    fn default() -> Self {
        PlanCaps { free_max_rows: 5_000, paid_max_rows: 500_000 }
    }
}

impl PlanCaps {
    /// The row cap of a plan.
    pub fn cap(&self, plan: Plan) -> u64 {
        match plan {
            Plan::Free => self.free_max_rows,
            Plan::Paid => self.paid_max_rows,
        }
    }
}

/// A change to the directory other than an import: keys, shares and plans.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum DirectoryChange {
    /// A key was created.
    CreateKey(Box<ApiKey>),
    /// A key was revoked (irreversible).
    RevokeKey(KeyId),
    /// A share was set; `None` removes it.
    SetShare {
        /// The share's identity (user, scope) and its new role.
        share: Share,
        /// `false` removes the share.
        present: bool,
    },
    /// A user's plan changed.
    SetPlan {
        /// The user.
        user_id: UserId,
        /// The new plan.
        plan: Plan,
    },
}

/// A write to one sheet.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SheetWrite {
    /// The sheet written.
    pub sheet_id: SheetId,
    /// When the write happened.
    pub at: Millis,
    /// Rows as they are after the write (inserted or replaced whole), shared with the sheet's
    /// map and the write's reply rather than copied.
    pub put: Vec<Arc<Row>>,
    /// Rows removed (a deleted row and its subtree); one `ROW_DELETED` event each.
    pub deleted: Vec<RowId>,
    /// The idempotent response guarding this write, if the request carried a key.
    pub idem: Option<IdemEntry>,
}

/// A stored response to an idempotent request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IdemEntry {
    /// Namespace: the API key that sent it.
    pub key_id: KeyId,
    /// The `Idempotency-Key` header.
    pub idem_key: String,
    /// SHA-256 of method, path, query and body.
    pub fingerprint: [u8; 32],
    /// The status replayed.
    pub status: u16,
    /// The body replayed byte for byte (empty for 204).
    pub body: Vec<u8>,
    /// The original request id (for `X-Request-Id` on replay).
    pub request_id: String,
    /// When the original completed; the replay window runs from here.
    pub completed_at: Millis,
}
