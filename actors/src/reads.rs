//! Where a read is answered from: this node's [`Service`] (a single node, a cluster's leader),
//! or, for a read sent with `Sheetd-Consistency: local`, a follower's applied state
//! ([`LocalReads`]). The server's read handlers take a [`Reads`] and never ask which.

use std::sync::Arc;

use crate::directory::DirectoryState;
use crate::model::{Millis, SheetId};
use crate::replica::LocalReads;
use crate::service::ChangesError;
use crate::sheet::{Change, PublishedSheet, SheetSnapshot};
use crate::Service;

/// The state a read is answered from.
#[derive(Clone, Copy)]
pub enum Reads<'a> {
    /// This node's domain: everything durable it published.
    Own(&'a Service),
    /// A follower's applied state: committed, possibly stale.
    Local(&'a LocalReads),
}

/// A [`Reads`] to hand to a blocking thread.
#[derive(Clone)]
pub enum OwnedReads {
    /// See [`Reads::Own`].
    Own(Service),
    /// See [`Reads::Local`].
    Local(LocalReads),
}

impl Reads<'_> {
    /// The directory.
    pub fn directory(&self) -> Arc<DirectoryState> {
        match self {
            Reads::Own(service) => service.directory(),
            Reads::Local(local) => local.view().directory(),
        }
    }

    /// A sheet as of its last durable (on a follower: applied) write.
    pub fn sheet_snapshot(&self, id: SheetId) -> Option<Arc<SheetSnapshot>> {
        match self {
            Reads::Own(service) => service.sheet_snapshot(id),
            Reads::Local(local) => local.view().sheet_snapshot(id),
        }
    }

    /// Where a sheet's states are published, for a reader waiting for the next one.
    pub fn sheet_published(&self, id: SheetId) -> Option<PublishedSheet> {
        match self {
            Reads::Own(service) => service.sheet_published(id),
            Reads::Local(local) => local.view().sheet_published(id),
        }
    }

    /// The time keys and caps are judged at.
    pub fn now(&self) -> Millis {
        match self {
            Reads::Own(service) => service.now(),
            Reads::Local(local) => local.now(),
        }
    }

    /// This source, to move to a blocking thread.
    pub fn to_owned(&self) -> OwnedReads {
        match self {
            Reads::Own(service) => OwnedReads::Own((*service).clone()),
            Reads::Local(local) => OwnedReads::Local((*local).clone()),
        }
    }
}

impl OwnedReads {
    /// See [`Service::read_changes`]. Blocking.
    ///
    /// # Errors
    /// As [`Service::read_changes`].
    pub fn read_changes(
        &self,
        snapshot: &SheetSnapshot,
        seq: Option<u64>,
        limit: usize,
    ) -> Result<Vec<Change>, ChangesError> {
        match self {
            OwnedReads::Own(service) => service.read_changes(snapshot, seq, limit),
            OwnedReads::Local(local) => local.read_changes(snapshot, seq, limit),
        }
    }
}
