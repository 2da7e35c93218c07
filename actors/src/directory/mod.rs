//! The directory / key-registry actor: the one writer of users, plans, projects, folders, sheet
//! identities, shares, reports and keys.
//!
//! Readers never message it. They load the published [`DirectoryState`] (an `Arc` behind an
//! `ArcSwap`), which is replaced whole after every change **once the change's record is
//! durable**, so authorization is lock-free, always sees one consistent state, and never acts
//! on a change a crash could take back. A revoked key or a removed share counts from the next
//! request that starts after the revoke is acknowledged.
//!
//! # Inside
//!
//! Dependencies point one way, from the actor down to plain data:
//!
//! - `state`: [`DirectoryState`] and [`Target`], the data and the one access rule. Pure.
//! - [`keys`]: secrets, hashing, grant checks and expiry defaults, over the state.
//! - [`fixture`]: the fixture format, validated against the state into an import (its keys
//!   through [`keys`]).
//! - this module: the actor and its messages, which run [`fixture::prepare`] and [`keys`] in
//!   mailbox order, log the result and publish the new state.

pub mod fixture;
pub mod keys;
mod state;

use std::sync::Arc;

use actix::prelude::*;

use self::fixture::{Fixture, IssuedSecret};
use self::keys::GrantSpec;
use crate::error::{Error, Result};
use crate::log::{AppendOptions, Lsn};
use crate::model::{ApiKey, KeyId, Millis, Plan, Role, ScopeType, Share, UserId};
use crate::publish::{AtPosition, Published, Publisher};
use crate::record::{DirectoryChange, Record};
use crate::registry::SheetRegistry;
use crate::shared::Shared;
use crate::sheet::SheetState;
pub use state::{DirectoryState, Target};

/// The directory as readers see it.
#[derive(Debug, Default)]
pub struct DirectorySnapshot {
    /// The state.
    pub state: Arc<DirectoryState>,
    /// The LSN of the last record it reflects.
    pub lsn: Lsn,
}

impl AtPosition for DirectorySnapshot {
    fn lsn(&self) -> Lsn {
        self.lsn
    }
}

/// Where readers find the published directory.
pub type PublishedDirectory = Arc<Published<DirectorySnapshot>>;

/// What an import added.
#[derive(Clone, Debug, Default)]
pub struct ImportReport {
    /// Objects added, by kind.
    pub counts: Vec<(&'static str, usize)>,
    /// Secrets generated for keys that came without one (shown once).
    pub issued: Vec<IssuedSecret>,
}

/// Add a fixture's objects.
#[derive(Message)]
#[rtype(result = "Result<ImportReport>")]
pub struct Import(pub Fixture);

/// Create a key after the grant and over-grant checks; answers the key and its secret.
#[derive(Message)]
#[rtype(result = "Result<(ApiKey, String)>")]
pub struct CreateKey {
    /// The user whose access the key carries; must exist.
    pub owner_id: UserId,
    /// A label for people: 1 to 200 characters once trimmed.
    pub name: String,
    /// The grants asked for.
    pub grants: Vec<GrantSpec>,
    /// Expiry; default one year.
    pub expires_at: Option<Millis>,
}

/// Revoke a key at once and for good; answers the key.
#[derive(Message)]
#[rtype(result = "Result<ApiKey>")]
pub struct RevokeKey(pub KeyId);

/// Set (or with role `None`, remove) a share.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct SetShare {
    /// The user given the role.
    pub user_id: UserId,
    /// Project, folder or sheet.
    pub scope_type: ScopeType,
    /// The object.
    pub scope_id: u64,
    /// The role, or `None` to remove the share.
    pub role: Option<Role>,
}

/// Set a user's plan.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct SetPlan {
    pub user_id: UserId,
    /// The user's new plan: it sets their sheets' row cap and whether their reports run.
    pub plan: Plan,
}

/// The whole state, for a checkpoint, with the LSN every directory record at or below it is
/// reflected in. Not a published snapshot: it may be ahead of what readers see.
#[derive(Message)]
#[rtype(result = "(Arc<DirectoryState>, Lsn)")]
pub struct CopyDirectoryForCheckpoint;

/// The one writer of the directory.
pub struct DirectoryActor {
    /// The latest applied state (may be ahead of the published one until its flush).
    state: Arc<DirectoryState>,
    /// Publishes the directory to readers once a change is durable, and keeps what a re-sync
    /// after a lost log tail goes back to.
    publisher: Publisher<DirectorySnapshot>,
    shared: Shared,
    sheets: SheetRegistry,
}

impl DirectoryActor {
    /// An actor over recovered state, already published.
    pub(crate) fn new(
        state: Arc<DirectoryState>,
        published: PublishedDirectory,
        shared: Shared,
        sheets: SheetRegistry,
    ) -> Self {
        let publisher = Publisher::new(published, shared.log.epoch());
        DirectoryActor { state, publisher, shared, sheets }
    }

    /// Returns the working state to the durable one if the log's epoch moved on (see
    /// [`Publisher::resync`]): changes applied here whose records the log lost are dropped.
    fn resync(&mut self) {
        let epoch = self.shared.log.epoch();
        if let Some(target) = self.publisher.resync(epoch, self.shared.log.durable_lsn()) {
            tracing::info!(
                lsn = target.lsn,
                "the log was re-opened: the directory goes on from its durable state"
            );
            self.state = Arc::clone(&target.state);
        }
    }

    /// Log `record`, apply `change` to a copy of the state, and publish the copy once durable.
    fn commit<T: Send + 'static>(
        &mut self,
        record: Record,
        change: impl FnOnce(&mut DirectoryState),
        reply: T,
    ) -> ResponseFuture<Result<T>> {
        // Directory changes may use the log's reserve below the free-space floor: revoking a
        // key or a share must work while row writes are refused for lack of space. Each
        // handler re-syncs before it decides; the epoch still refuses a change decided on state
        // the log lost in between (a heal while it was decided), which answers 503 and whose
        // retry decides afresh.
        let options = AppendOptions { reserve: true, epoch: Some(self.publisher.epoch()) };
        let appended = match self.shared.append(&record, options, |_| {}) {
            Ok(appended) => appended,
            Err(e) => {
                self.resync();
                return Box::pin(async move { Err(e) });
            }
        };
        let mut next = (*self.state).clone();
        change(&mut next);
        self.state = Arc::new(next);
        let snapshot =
            Arc::new(DirectorySnapshot { state: self.state.clone(), lsn: appended.lsn() });
        self.publisher.keep(Arc::clone(&snapshot), self.shared.log.durable_lsn());
        let published = Arc::clone(self.publisher.published());
        Box::pin(async move {
            appended.await?;
            published.publish(&snapshot);
            Ok(reply)
        })
    }
}

impl Actor for DirectoryActor {
    type Context = Context<Self>;
}

impl Handler<Import> for DirectoryActor {
    type Result = ResponseFuture<Result<ImportReport>>;

    fn handle(&mut self, msg: Import, _: &mut Self::Context) -> Self::Result {
        self.resync();
        let now = self.shared.clock.now();
        let (batch, issued) =
            match fixture::prepare(msg.0, &self.state, self.shared.row_ids.peek(), now) {
                Ok(x) => x,
                Err(e) => return Box::pin(async move { Err(e) }),
            };
        let rows: usize = batch.sheets.iter().map(|s| s.rows.len()).sum();
        let report = ImportReport {
            counts: vec![
                ("users", batch.users.len()),
                ("projects", batch.projects.len()),
                ("folders", batch.folders.len()),
                ("sheets", batch.sheets.len()),
                ("columns", batch.sheets.iter().map(|s| s.columns.len()).sum()),
                ("rows", rows),
                ("shares", batch.shares.len()),
                ("reports", batch.reports.len()),
                ("keys", batch.keys.len()),
            ],
            issued,
        };
        if let Some(max) = batch.sheets.iter().flat_map(|s| &s.rows).map(|r| r.id).max() {
            self.shared.row_ids.observe(max);
        }
        let sheets: Vec<SheetState> = batch
            .sheets
            .iter()
            .map(|s| {
                SheetState::new(s.meta.id, s.meta.created_at, s.columns.clone(), s.rows.clone())
            })
            .collect();
        let applied = batch.clone();
        let before = self.publisher.newest_pending();
        let fut =
            self.commit(Record::Import(Box::new(batch)), |d| d.apply_import(&applied), report);
        // The sheets' actors exist before the directory publishes them: no request can reach
        // a sheet the registry does not know. A refused import (no new pending state) starts
        // none.
        let appended = self.publisher.newest_pending().filter(|&lsn| Some(lsn) != before);
        if let Some(lsn) = appended {
            for mut state in sheets {
                state.record_import(lsn);
                self.sheets.spawn(state, self.shared.clone(), lsn);
            }
        }
        fut
    }
}

impl Handler<CreateKey> for DirectoryActor {
    type Result = ResponseFuture<Result<(ApiKey, String)>>;

    fn handle(&mut self, msg: CreateKey, _: &mut Self::Context) -> Self::Result {
        self.resync();
        let build = || -> Result<(ApiKey, String)> {
            let grants = keys::check_new_key(&self.state, msg.owner_id, &msg.grants)?;
            let now = self.shared.clock.now();
            let secret = keys::generate_secret();
            let key = keys::new_key(
                self.state.next_key_id(),
                msg.owner_id,
                msg.name.clone(),
                &secret,
                grants,
                now,
                Some(msg.expires_at.unwrap_or_else(|| keys::default_expiry(now))),
            );
            Ok((key, secret))
        };
        match build() {
            Ok((key, secret)) => {
                let change = DirectoryChange::CreateKey(Box::new(key.clone()));
                let applied = change.clone();
                self.commit(
                    Record::Directory(change),
                    move |d| d.apply_change(&applied),
                    (key, secret),
                )
            }
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }
}

impl Handler<RevokeKey> for DirectoryActor {
    type Result = ResponseFuture<Result<ApiKey>>;

    fn handle(&mut self, msg: RevokeKey, _: &mut Self::Context) -> Self::Result {
        self.resync();
        let Some(key) = self.state.keys.get(&msg.0).cloned() else {
            return Box::pin(async move { Err(Error::NotFound(format!("key {}", msg.0))) });
        };
        let change = DirectoryChange::RevokeKey(msg.0);
        let applied = change.clone();
        self.commit(
            Record::Directory(change),
            move |d| d.apply_change(&applied),
            ApiKey { revoked: true, ..key },
        )
    }
}

impl Handler<SetShare> for DirectoryActor {
    type Result = ResponseFuture<Result<()>>;

    fn handle(&mut self, msg: SetShare, _: &mut Self::Context) -> Self::Result {
        self.resync();
        let s = &self.state;
        let exists = match msg.scope_type {
            ScopeType::Project => s.projects.contains_key(&msg.scope_id),
            ScopeType::Folder => s.folders.contains_key(&msg.scope_id),
            ScopeType::Sheet => s.sheets.contains_key(&msg.scope_id),
            ScopeType::Account => false,
        };
        if !s.users.contains_key(&msg.user_id) {
            return Box::pin(async move { Err(Error::NotFound(format!("user {}", msg.user_id))) });
        }
        if !exists {
            let what = format!("{:?} {}", msg.scope_type, msg.scope_id).to_lowercase();
            return Box::pin(async move { Err(Error::NotFound(what)) });
        }
        let share = Share {
            user_id: msg.user_id,
            scope_type: msg.scope_type,
            scope_id: msg.scope_id,
            role: msg.role.unwrap_or(Role::Viewer),
        };
        let change = DirectoryChange::SetShare { share, present: msg.role.is_some() };
        let applied = change.clone();
        self.commit(Record::Directory(change), move |d| d.apply_change(&applied), ())
    }
}

impl Handler<SetPlan> for DirectoryActor {
    type Result = ResponseFuture<Result<()>>;

    fn handle(&mut self, msg: SetPlan, _: &mut Self::Context) -> Self::Result {
        self.resync();
        if !self.state.users.contains_key(&msg.user_id) {
            return Box::pin(async move { Err(Error::NotFound(format!("user {}", msg.user_id))) });
        }
        let change = DirectoryChange::SetPlan { user_id: msg.user_id, plan: msg.plan };
        let applied = change.clone();
        self.commit(Record::Directory(change), move |d| d.apply_change(&applied), ())
    }
}

impl Handler<CopyDirectoryForCheckpoint> for DirectoryActor {
    type Result = MessageResult<CopyDirectoryForCheckpoint>;

    fn handle(&mut self, _: CopyDirectoryForCheckpoint, _: &mut Self::Context) -> Self::Result {
        // Every directory record is appended and applied inside one handler of this actor, so
        // all of them up to the log's last LSN are in `state`.
        MessageResult((self.state.clone(), self.shared.log.last_lsn()))
    }
}
