//! Where sheet actors live: a map from sheet id to address, and the arbiters (one per core)
//! that the actors are spread over so different sheets write in parallel.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use actix::prelude::*;
use dashmap::DashMap;
use wal::Lsn;

use crate::model::SheetId;
use crate::shared::Shared;
use crate::sheet::{SheetActor, SheetState};

/// The running sheet actors. Cheap to clone.
#[derive(Clone)]
pub struct SheetRegistry {
    actors: Arc<DashMap<SheetId, Addr<SheetActor>>>,
    arbiters: Arc<Vec<ArbiterHandle>>,
    next: Arc<AtomicUsize>,
}

impl SheetRegistry {
    /// A registry spreading actors over `arbiters` round-robin.
    pub fn new(arbiters: Vec<ArbiterHandle>) -> Self {
        SheetRegistry { actors: Arc::default(), arbiters: Arc::new(arbiters), next: Arc::default() }
    }

    /// Start the actor of a sheet.
    pub fn spawn(&self, state: SheetState, shared: Shared, applied_lsn: Lsn) {
        let id = state.id;
        let actor = SheetActor::new(state, shared, applied_lsn);
        let addr = if self.arbiters.is_empty() {
            actor.start()
        } else {
            let i = self.next.fetch_add(1, Ordering::Relaxed) % self.arbiters.len();
            SheetActor::start_in_arbiter(&self.arbiters[i], move |_| actor)
        };
        self.actors.insert(id, addr);
    }

    /// The actor of a sheet.
    pub fn get(&self, id: SheetId) -> Option<Addr<SheetActor>> {
        self.actors.get(&id).map(|a| a.clone())
    }

    /// Every sheet actor, by id.
    pub fn all(&self) -> Vec<(SheetId, Addr<SheetActor>)> {
        let mut all: Vec<_> = self.actors.iter().map(|e| (*e.key(), e.value().clone())).collect();
        all.sort_by_key(|(id, _)| *id);
        all
    }
}
