//! The one publisher of durable state: [`Published`] (what readers load) and [`Publisher`] (what
//! its one writer keeps to publish it right).
//!
//! A writer (a sheet's actor, the directory's actor) decides and applies a change at once, but
//! readers may see it only once its record is durable. So the writer appends, keeps the state
//! after the change as *pending*, and the append's future publishes it when the log says it is
//! durable. Two things make that subtle, and this module is the one place they are handled:
//!
//! - The futures of one writer's appends may resolve out of order: publishing only ever moves
//!   forward ([`Published::publish`]).
//! - The log may lose records it had not made durable (a failed disk re-opened; later, a
//!   leadership change). Its epoch then moves on, and the writer must go back to the newest
//!   state whose record is durable — which its own future may not have published yet. That is
//!   what the pending queue is for ([`Publisher::resync`]).

use std::collections::VecDeque;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::log::Lsn;

/// A state as of a position in the log: every record touching it up to [`AtPosition::lsn`] is
/// in it.
pub trait AtPosition {
    /// The position the state reflects.
    fn lsn(&self) -> Lsn;
}

/// Where readers find the latest durable state: loaded with no message and no lock.
///
/// Invariant: the published state's position never goes back, and only a state whose record is
/// durable is ever stored (its writer publishes from the append's future, or from
/// [`Publisher::resync`], which takes only durable states).
#[derive(Debug)]
pub struct Published<T> {
    current: ArcSwap<T>,
    /// The position of the newest published state: a reader waiting for the next write (a
    /// change-feed long-poll) wakes exactly when one lands, never on a timer.
    lsn: watch::Sender<Lsn>,
}

impl<T: AtPosition> Published<T> {
    /// Publishes the first state.
    pub fn new(first: T) -> Self {
        let (lsn, _) = watch::channel(first.lsn());
        Published { current: ArcSwap::from_pointee(first), lsn }
    }

    /// The latest published state.
    pub fn load_full(&self) -> Arc<T> {
        self.current.load_full()
    }

    /// The latest published state, for a short look on a hot path: cheaper than
    /// [`Published::load_full`], which takes a reference count every reader shares.
    pub fn load(&self) -> arc_swap::Guard<Arc<T>> {
        self.current.load()
    }

    /// A receiver that sees every later publication ([`watch::Receiver::changed`]).
    pub fn subscribe(&self) -> watch::Receiver<Lsn> {
        self.lsn.subscribe()
    }

    /// Publishes `state` unless a newer one is out already, then wakes the waiting readers.
    /// Call it only once `state`'s record is durable. Returns the state it displaced (the
    /// current one when that was newer), for a caller that would rather drop it elsewhere
    /// ([`drop_elsewhere`]).
    pub fn publish(&self, state: &Arc<T>) -> Arc<T> {
        let at = state.lsn();
        let displaced = self.current.rcu(|current| {
            if current.lsn() < at {
                Arc::clone(state)
            } else {
                Arc::clone(current)
            }
        });
        self.lsn.send_if_modified(|lsn| {
            let newer = *lsn < at;
            *lsn = (*lsn).max(at);
            newer
        });
        displaced
    }
}

/// The writer's side of a [`Published`]: the states of its appended changes not yet known
/// durable, and the log epoch its working state is consistent with.
///
/// Invariant: `pending` is in position order, and holds at most one state at or below the
/// durable position (the newest such, which a resync may need because its own future may not
/// have published it yet); everything in it was built within `epoch`.
#[derive(Debug)]
pub struct Publisher<T> {
    published: Arc<Published<T>>,
    pending: VecDeque<Arc<T>>,
    epoch: u64,
}

impl<T: AtPosition> Publisher<T> {
    /// A writer publishing to `published`, consistent with the log's `epoch`.
    pub fn new(published: Arc<Published<T>>, epoch: u64) -> Self {
        Publisher { published, pending: VecDeque::new(), epoch }
    }

    /// Where readers load the state.
    pub fn published(&self) -> &Arc<Published<T>> {
        &self.published
    }

    /// The log epoch the writer's state is consistent with: its appends carry it.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The position of the newest pending state, if any.
    pub fn newest_pending(&self) -> Option<Lsn> {
        self.pending.back().map(|s| s.lsn())
    }

    /// Keeps `state`, the writer's state after a change just appended, until a newer one is
    /// durable; `durable` is the log's durable position now.
    pub fn keep(&mut self, state: Arc<T>, durable: Lsn) {
        self.keep_retiring(state, durable, drop);
    }

    /// [`Publisher::keep`], handing each state it is done with to `retire`.
    pub fn keep_retiring(&mut self, state: Arc<T>, durable: Lsn, mut retire: impl FnMut(Arc<T>)) {
        while self.pending.get(1).is_some_and(|s| s.lsn() <= durable) {
            if let Some(done) = self.pending.pop_front() {
                retire(done);
            }
        }
        self.pending.push_back(state);
    }

    /// When the log's `epoch` has moved on, returns the state the writer must go on from: the
    /// newest one whose record is `durable` (published first, if it was not yet), and forgets
    /// the rest. `None` while the epoch is unchanged.
    pub fn resync(&mut self, epoch: u64, durable: Lsn) -> Option<Arc<T>> {
        if epoch == self.epoch {
            return None;
        }
        let published = self.published.load_full();
        let newest = self.pending.iter().rev().find(|s| s.lsn() <= durable).cloned();
        let state = match newest {
            Some(s) if s.lsn() > published.lsn() => {
                self.published.publish(&s);
                s
            }
            _ => published,
        };
        self.pending.clear();
        self.epoch = epoch;
        Some(state)
    }
}

/// Drops `value` on a thread kept for it, or here if that thread cannot start.
///
/// For a state a writer is done with whose drop is long work: when it is the last holder of
/// the map nodes a bulk write replaced, its drop frees each of them and touches every row
/// they point to (at random, on a large sheet: a cache miss each), about a tenth of a bulk
/// upsert's time on its writer's thread. Only for large writes: handing over wakes that
/// thread, which costs a single-row write more than its drop does.
pub fn drop_elsewhere<T: Send + 'static>(value: T) {
    type Retired = Box<dyn Send>;
    static DROPPER: std::sync::OnceLock<Option<crossbeam_channel::Sender<Retired>>> =
        std::sync::OnceLock::new();
    let dropper = DROPPER.get_or_init(|| {
        let (send, receive) = crossbeam_channel::unbounded::<Retired>();
        let spawned = std::thread::Builder::new()
            .name("sheetd-drop".into())
            .spawn(move || receive.into_iter().for_each(drop));
        spawned.is_ok().then_some(send)
    });
    match dropper {
        Some(dropper) => drop(dropper.send(Box::new(value))),
        None => drop(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct State(Lsn);

    impl AtPosition for State {
        fn lsn(&self) -> Lsn {
            self.0
        }
    }

    #[test]
    fn publishing_never_goes_backwards() {
        let published = Published::new(State(1));
        let mut seen = published.subscribe();
        published.publish(&Arc::new(State(5)));
        assert!(seen.has_changed().unwrap());
        assert_eq!(*seen.borrow_and_update(), 5);
        published.publish(&Arc::new(State(3)));
        assert_eq!(published.load_full().lsn(), 5, "an older state resolving late is not shown");
        assert!(!seen.has_changed().unwrap(), "readers are not woken for it");
        published.publish(&Arc::new(State(6)));
        assert_eq!(published.load_full().lsn(), 6);
    }

    #[test]
    fn an_epoch_change_drops_pending_state_to_the_newest_durable_one() {
        let published = Arc::new(Published::new(State(1)));
        let mut writer = Publisher::new(Arc::clone(&published), 0);
        for lsn in 2..=6 {
            writer.keep(Arc::new(State(lsn)), 1);
        }
        assert_eq!(writer.resync(0, 4), None, "same epoch: nothing to do");
        // Records up to 4 are durable, 5 and 6 were lost; 4's own future never published it.
        let back = writer.resync(1, 4).unwrap();
        assert_eq!(back.lsn(), 4);
        assert_eq!(published.load_full().lsn(), 4, "the durable state is published first");
        assert_eq!(writer.epoch(), 1);
        assert_eq!(writer.newest_pending(), None, "everything pending is dropped");
        assert_eq!(writer.resync(1, 9), None);
    }

    #[test]
    fn an_epoch_change_with_nothing_durable_pending_goes_back_to_the_published_state() {
        let published = Arc::new(Published::new(State(3)));
        let mut writer = Publisher::new(Arc::clone(&published), 7);
        writer.keep(Arc::new(State(4)), 3);
        let back = writer.resync(8, 3).unwrap();
        assert_eq!(back.lsn(), 3);
        assert_eq!(published.load_full().lsn(), 3);
    }

    #[test]
    fn keep_holds_only_the_newest_durable_state() {
        let published = Arc::new(Published::new(State(0)));
        let mut writer = Publisher::new(published, 0);
        for lsn in 1..=5 {
            writer.keep(Arc::new(State(lsn)), 0);
        }
        writer.keep(Arc::new(State(6)), 4);
        let kept: Vec<Lsn> = writer.pending.iter().map(|s| s.lsn()).collect();
        assert_eq!(kept, [4, 5, 6], "states older than the newest durable one are forgotten");
    }
}
