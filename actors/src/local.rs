//! A follower's applied state, published for local reads (docs/spec/cluster.md, "Local
//! reads"): what `replica::Replica` applied from committed records, as readers load it, with
//! no lock and no message, as they load a leader's published state.
//!
//! Everything here was committed on a majority before it was applied, so a local read may be
//! stale but never shows a write that was not acknowledged, and each part (the directory, a
//! sheet) is one consistent state at one position, never a torn one.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use dashmap::DashMap;

use crate::directory::DirectoryState;
use crate::log::Lsn;
use crate::model::SheetId;
use crate::publish::Published;
use crate::sheet::{PublishedSheet, SheetSnapshot, SheetState};

/// The published parts of a follower's applied state.
///
/// Invariant: every part holds only committed records; [`LocalView::applied`] is published
/// after the parts it covers, so a reader that loads it and then a part sees that part at least
/// as new as what the position promises.
#[derive(Debug, Default)]
pub struct LocalView {
    directory: ArcSwap<DirectoryState>,
    sheets: DashMap<SheetId, PublishedSheet>,
    /// The position applied through (a Raft index plus one); 0 before anything was applied.
    applied: AtomicU64,
    /// Set once the node starts leading: its actors answer from then on, and nothing more is
    /// published here.
    retired: AtomicBool,
}

/// What the records applied since the last publication touched.
#[derive(Debug, Default)]
pub(crate) struct Touched {
    pub(crate) directory: bool,
    pub(crate) sheets: BTreeSet<SheetId>,
}

impl LocalView {
    /// Publishes the directory as applied.
    pub(crate) fn publish_directory(&self, directory: &DirectoryState) {
        self.directory.store(Arc::new(directory.clone()));
    }

    /// Publishes a sheet as applied through `lsn` (its last record's position).
    pub(crate) fn publish_sheet(&self, state: &SheetState, lsn: Lsn) {
        let snapshot = SheetSnapshot { state: state.clone(), lsn };
        match self.sheets.get(&state.id) {
            Some(published) => drop(published.publish(&Arc::new(snapshot))),
            None => {
                self.sheets.insert(state.id, Arc::new(Published::new(snapshot)));
            }
        }
    }

    /// Replaces every part (after a snapshot was installed): sheets it does not hold are gone.
    pub(crate) fn replace<'a>(
        &self,
        directory: &DirectoryState,
        sheets: impl Iterator<Item = (&'a SheetState, Lsn)>,
        applied: Lsn,
    ) {
        let mut kept = BTreeSet::new();
        for (state, lsn) in sheets {
            kept.insert(state.id);
            let snapshot = SheetSnapshot { state: state.clone(), lsn };
            // A new publication point: the installed state may sit below what was published.
            self.sheets.insert(state.id, Arc::new(Published::new(snapshot)));
        }
        self.publish_directory(directory);
        self.sheets.retain(|id, _| kept.contains(id));
        self.set_applied(applied);
    }

    /// Publishes the position applied through, once its parts are published.
    pub(crate) fn set_applied(&self, lsn: Lsn) {
        self.applied.fetch_max(lsn, Ordering::Release);
    }

    /// The node leads from now on: its actors answer.
    pub(crate) fn retire(&self) {
        self.retired.store(true, Ordering::Release);
    }

    /// Whether local reads may be answered from here: the node follows and has applied
    /// something (a follower that has not would answer every key 401).
    pub fn serving(&self) -> bool {
        !self.retired.load(Ordering::Acquire) && self.applied() > 0
    }

    /// The position applied through (a Raft index plus one); 0 before anything was applied.
    pub fn applied(&self) -> Lsn {
        self.applied.load(Ordering::Acquire)
    }

    /// The directory as applied.
    pub fn directory(&self) -> Arc<DirectoryState> {
        self.directory.load_full()
    }

    /// A sheet as applied.
    pub fn sheet_snapshot(&self, id: SheetId) -> Option<Arc<SheetSnapshot>> {
        self.sheets.get(&id).map(|p| p.load_full())
    }

    /// Where a sheet's applied states are published, for a reader waiting for the next one.
    pub fn sheet_published(&self, id: SheetId) -> Option<PublishedSheet> {
        self.sheets.get(&id).map(|p| Arc::clone(&p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sheet(id: SheetId) -> SheetState {
        SheetState::new(id, 1, Vec::new(), Vec::new())
    }

    #[test]
    fn parts_publish_forward_and_an_install_replaces_them_whole() {
        let view = LocalView::default();
        assert!(!view.serving(), "nothing applied yet");
        view.publish_sheet(&sheet(1), 5);
        view.publish_sheet(&sheet(2), 6);
        view.set_applied(6);
        assert!(view.serving());
        let waiting = view.sheet_published(1).unwrap();
        let mut next = waiting.subscribe();
        next.borrow_and_update();
        view.publish_sheet(&sheet(1), 9);
        assert!(next.has_changed().unwrap(), "a waiting reader is woken");
        assert_eq!(view.sheet_snapshot(1).unwrap().lsn, 9);
        view.publish_sheet(&sheet(1), 7);
        assert_eq!(view.sheet_snapshot(1).unwrap().lsn, 9, "never back");

        view.replace(&DirectoryState::default(), [(&sheet(2), 3), (&sheet(3), 3)].into_iter(), 20);
        assert!(view.sheet_snapshot(1).is_none(), "not in the installed state");
        assert_eq!(view.sheet_snapshot(2).unwrap().lsn, 3);
        assert_eq!(view.applied(), 20);
        view.retire();
        assert!(!view.serving());
    }
}
