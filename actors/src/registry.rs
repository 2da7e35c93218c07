//! Where sheet actors live: a map from sheet id to the actor's address and its published
//! snapshot, and the arbiters (one per core) that the actors are spread over so different
//! sheets write in parallel. Readers take snapshots from here without messaging an actor.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::log::Lsn;
use actix::prelude::*;
use dashmap::DashMap;

use crate::model::SheetId;
use crate::shared::Shared;
use crate::sheet::{Published, PublishedSheet, SheetActor, SheetSnapshot, SheetState};

/// A running sheet: its actor (the one writer) and its published snapshot (for readers).
#[derive(Clone)]
struct Entry {
    addr: Addr<SheetActor>,
    published: PublishedSheet,
}

/// The running sheet actors. Cheap to clone.
#[derive(Clone)]
pub struct SheetRegistry {
    actors: Arc<DashMap<SheetId, Entry>>,
    arbiters: Arc<Vec<ArbiterHandle>>,
    next: Arc<AtomicUsize>,
}

impl SheetRegistry {
    /// A registry spreading actors over `arbiters` round-robin.
    pub fn new(arbiters: Vec<ArbiterHandle>) -> Self {
        SheetRegistry { actors: Arc::default(), arbiters: Arc::new(arbiters), next: Arc::default() }
    }

    /// Start the actor of a sheet whose `state` reflects every record up to `applied_lsn` that
    /// touched it; the state is published as the sheet's first snapshot.
    pub(crate) fn spawn(&self, state: SheetState, shared: Shared, applied_lsn: Lsn) {
        let id = state.id;
        let published: PublishedSheet =
            Arc::new(Published::new(SheetSnapshot { state: state.clone(), lsn: applied_lsn }));
        let actor = SheetActor::new(state, shared, applied_lsn, Arc::clone(&published));
        let addr = if self.arbiters.is_empty() {
            actor.start()
        } else {
            let i = self.next.fetch_add(1, Ordering::Relaxed) % self.arbiters.len();
            SheetActor::start_in_arbiter(&self.arbiters[i], move |_| actor)
        };
        self.actors.insert(id, Entry { addr, published });
    }

    /// The actor of a sheet.
    pub fn get(&self, id: SheetId) -> Option<Addr<SheetActor>> {
        self.actors.get(&id).map(|e| e.addr.clone())
    }

    /// The sheet as of its last durable write.
    pub fn snapshot(&self, id: SheetId) -> Option<Arc<SheetSnapshot>> {
        self.actors.get(&id).map(|e| e.published.load_full())
    }

    /// Where a sheet's snapshots are published: for a reader that waits for the next one.
    pub fn published(&self, id: SheetId) -> Option<PublishedSheet> {
        self.actors.get(&id).map(|e| Arc::clone(&e.published))
    }

    /// Every sheet actor, by id.
    pub fn all(&self) -> Vec<(SheetId, Addr<SheetActor>)> {
        let mut all: Vec<_> =
            self.actors.iter().map(|e| (*e.key(), e.value().addr.clone())).collect();
        all.sort_by_key(|(id, _)| *id);
        all
    }

    /// Every sheet as of its last durable write, by id.
    pub fn snapshots(&self) -> Vec<(SheetId, Arc<SheetSnapshot>)> {
        let mut all: Vec<_> =
            self.actors.iter().map(|e| (*e.key(), e.value().published.load_full())).collect();
        all.sort_by_key(|(id, _)| *id);
        all
    }
}
