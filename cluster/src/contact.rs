//! How old a follower's applied state is (cluster.md, "Local reads"): when it last heard from
//! a leader, and how far that leader had committed then.
//!
//! A follower's state is as fresh as the latest contact whose committed index it has applied:
//! everything the leader had committed at that moment is in it. A follower that heard from a
//! leader a moment ago but is still applying a long backlog is as old as the backlog, not as
//! old as the heartbeat.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

// Tokio's clock: the system's, but in a simulation (paused, advanced by it).
use tokio::time::Instant;

/// Contacts closer together than this share one slot (the newest time, the highest index):
/// with [`KEPT`] slots the history spans at least `KEPT × GRAIN`.
const GRAIN: Duration = Duration::from_millis(5);

/// Slots kept: over a second of history at [`GRAIN`], more than a follower's apply ever lags
/// behind a leader it hears from.
const KEPT: usize = 256;

/// The recent contacts of a follower with its leader.
///
/// Invariant: slots are in time order and their committed indexes never go down (a leader's
/// commit index only rises, and a new leader's covers its predecessor's).
#[derive(Debug)]
pub struct Contact {
    started: Instant,
    /// (µs after `started`, the leader's committed index then), oldest first.
    slots: Mutex<VecDeque<(u64, u64)>>,
}

impl Default for Contact {
    fn default() -> Self {
        Contact { started: Instant::now(), slots: Mutex::new(VecDeque::with_capacity(KEPT)) }
    }
}

impl Contact {
    /// Notes that a leader this node accepts reached it now, having committed `committed`
    /// (`None`: nothing yet).
    pub fn heard(&self, committed: Option<u64>) {
        self.heard_at(self.started.elapsed().as_micros() as u64, committed.unwrap_or(0));
    }

    fn heard_at(&self, now: u64, committed: u64) {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        match slots.back_mut() {
            // The same commit heard again (an idle leader's heartbeats), or close in time: the
            // newest time is what a state that holds it can claim.
            Some(back)
                if committed == back.1 || now.saturating_sub(back.0) < GRAIN.as_micros() as u64 =>
            {
                back.0 = now;
                back.1 = back.1.max(committed);
            }
            // An older message arriving late: it says nothing about what is committed now.
            Some(back) if committed < back.1 => {}
            _ => {
                if slots.len() == KEPT {
                    slots.pop_front();
                }
                slots.push_back((now, committed));
            }
        }
    }

    /// How old a state that applied everything through `applied` is: the time since the latest
    /// contact whose committed index it holds. `None` when no contact kept is that old (none
    /// yet, or the state lags further behind than the history reaches).
    pub fn age_of(&self, applied: Option<u64>) -> Option<Duration> {
        self.age_at(self.started.elapsed().as_micros() as u64, applied)
    }

    fn age_at(&self, now: u64, applied: Option<u64>) -> Option<Duration> {
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let (at, _) = slots
            .iter()
            .rev()
            .find(|(_, committed)| applied.is_some_and(|a| a >= *committed) || *committed == 0)?;
        Some(Duration::from_micros(now.saturating_sub(*at)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_is_as_old_as_the_latest_contact_it_has_applied() {
        let contact = Contact::default();
        assert_eq!(contact.age_of(Some(10)), None, "never heard from a leader");
        contact.heard(Some(5));
        std::thread::sleep(GRAIN * 2);
        contact.heard(Some(9));
        let fresh = contact.age_of(Some(9)).expect("applied the latest commit");
        let older = contact.age_of(Some(7)).expect("applied the first contact's commit");
        assert!(older >= GRAIN * 2, "{older:?}");
        assert!(fresh < older, "{fresh:?} {older:?}");
        assert_eq!(contact.age_of(Some(4)), None, "behind every contact kept");
        assert_eq!(contact.age_of(None), None);
    }

    #[test]
    fn a_leader_with_nothing_committed_makes_any_state_current() {
        let contact = Contact::default();
        contact.heard(None);
        assert!(contact.age_of(None).is_some());
    }

    #[test]
    fn the_history_is_bounded_and_drops_the_oldest() {
        let contact = Contact::default();
        let grain = GRAIN.as_micros() as u64;
        for i in 1..=(KEPT as u64 + 10) {
            contact.heard_at(i * grain, i);
        }
        let now = (KEPT as u64 + 11) * grain;
        assert_eq!(contact.slots.lock().unwrap().len(), KEPT);
        assert_eq!(contact.age_at(now, Some(5)), None, "its contacts were dropped");
        let age = contact.age_at(now, Some(KEPT as u64 + 10)).expect("the latest contact");
        assert_eq!(age, GRAIN);
    }

    #[test]
    fn contacts_within_a_grain_share_a_slot_and_a_late_message_is_ignored() {
        let contact = Contact::default();
        contact.heard_at(1_000, 3);
        contact.heard_at(2_000, 4);
        assert_eq!(contact.slots.lock().unwrap().len(), 1);
        assert_eq!(contact.age_at(10_000, Some(4)), Some(Duration::from_micros(8_000)));
        assert_eq!(contact.age_at(10_000, Some(3)), None, "the slot now says 4");
        contact.heard_at(20_000, 2);
        assert_eq!(contact.slots.lock().unwrap().len(), 1, "a stale commit adds no slot");
        assert_eq!(contact.age_at(20_000, Some(4)), Some(Duration::from_micros(18_000)));
        contact.heard_at(500_000, 4);
        assert_eq!(contact.slots.lock().unwrap().len(), 1, "an idle leader's heartbeats");
        assert_eq!(contact.age_at(500_000, Some(4)), Some(Duration::ZERO));
    }
}
