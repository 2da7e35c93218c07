//! The group-commit thread: the only writer of new records.
//!
//! Owns: the dedicated `wal-commit` std thread (its start, `Core::start_commit_thread`, is
//! here too), the command queue it drains, the durable-LSN watch it advances, and the flush
//! statistics it keeps. Their types are in `core.rs`, shared with the handle.
//!
//! One loop iteration is one *group*:
//! 1. Block for the first queued command, then take whatever else is already queued, up to
//!    `max_batch_records` records (a single `append_batch` is never split).
//! 2. Frame every payload (runs of small ones as packs).
//! 3. [`LogStore::write_values`](crate::log::LogStore::write_values): one `insert` or one
//!    `apply_batch`, then `flush`, fsync new blobs, `fdatasync` the data file.
//! 4. Advance the durable LSN, *then* resolve every waiter of the group. One flush serves
//!    everyone queued behind it.
//!
//! Guarantees:
//! - Commands arrive in LSN order (appenders assign LSNs and send under one mutex), so groups
//!   are written in LSN order and the durable LSN only moves forward over a contiguous prefix.
//! - Nothing is acknowledged before step 3 returned `Ok`.
//! - After the first failure the log is *failed*: that group and every later command get the
//!   same error, and nothing more is written (a later record without its predecessor would
//!   leave a gap) until [`crate::Wal::heal`] re-opens the log and starts a new thread.
//! - When the thread ends, normally or by panic, the watch says `stopped`, so no
//!   `wait_durable` future waits forever.

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Receiver;

use crate::core::{lock, Command, Core, Reply};
use crate::error::{Error, Result};
use crate::layout::entry::put_records;

// Defined here rather than in `core.rs` beside the struct: starting the thread needs its body,
// and `core.rs` knows nothing of the thread, so that this file is the only one to know both.
impl Core {
    /// Starts a commit thread on `rx` and keeps its handle.
    pub(crate) fn start_commit_thread(self: &Arc<Self>, rx: Receiver<Command>) -> Result<()> {
        // The thread holds the Core, not a Handle, so dropping the last Wal still runs Drop
        // (and therefore shutdown) while the thread is alive.
        let thread_core = Arc::clone(self);
        let thread = std::thread::Builder::new()
            .name("wal-commit".to_owned())
            .spawn(move || run(thread_core, rx))
            .map_err(Error::fs("start the wal-commit thread"))?;
        *lock(&self.thread) = Some(thread);
        Ok(())
    }
}

/// Marks the thread as stopped when it exits, including by panic, so waiters wake up.
/// Holds the core whose watch it updates.
struct StoppedOnExit<'a>(&'a Core);

impl Drop for StoppedOnExit<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Appends after this see the failure instead of a closed channel.
            self.0.failure.set(Arc::new(Error::CommitThreadDied));
        }
        let failure = self.0.failure.get();
        self.0.progress.send_modify(|p| {
            p.stopped = true;
            if p.failure.is_none() {
                p.failure = failure;
            }
        });
    }
}

/// The commit thread's body: runs until every sender is gone and the queue is drained.
fn run(core: Arc<Core>, rx: Receiver<Command>) {
    let _stopped = StoppedOnExit(&core);
    let max_records = core.config.max_batch_records.max(1);
    let mut group: Vec<Command> = Vec::new();
    // `recv` fails only when the last sender is dropped (shutdown) *and* the queue is empty,
    // so shutdown drains everything already accepted.
    while let Ok(first) = rx.recv() {
        #[cfg(any(test, feature = "testing"))]
        drop(core.gate.lock().unwrap_or_else(|p| p.into_inner()));
        let mut records = first.payloads.len();
        group.push(first);
        while records < max_records {
            match rx.try_recv() {
                Ok(next) => {
                    records += next.payloads.len();
                    group.push(next);
                }
                Err(_) => break,
            }
        }
        commit_group(&core, &mut group, records as u64);
    }
}

/// Writes one group durably and answers its waiters (steps 2-4 of the module docs).
fn commit_group(core: &Core, group: &mut Vec<Command>, records: u64) {
    if let Some(failure) = core.failure.get() {
        // Failed earlier: never write past the hole the failed group left.
        reply_all(group, &Err(failure));
        return;
    }
    let started = Instant::now();
    let result = write_group(core, group);
    let seconds = started.elapsed().as_secs_f64();
    match result {
        Ok(()) => {
            let last = group.last().map_or(0, Command::last_lsn);
            core.flush_stats
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .record(records, seconds);
            // Publish first, then answer: a resolved Commit implies durable_lsn() >= its LSN.
            core.progress.send_modify(|p| p.durable = p.durable.max(last));
            for command in group.drain(..) {
                let lsn = command.last_lsn();
                // The receiver may have been dropped (caller not interested): fine.
                let _ = command.reply.send(Ok(lsn));
            }
        }
        Err(e) => {
            let first = group.first().map_or(0, |c| c.first_lsn);
            tracing::error!(
                error = %e,
                first_lsn = first,
                records,
                "write-ahead log flush failed; the log now refuses all writes"
            );
            let shared = core.failure.set(Arc::new(e));
            core.progress.send_modify(|p| p.failure = Some(Arc::clone(&shared)));
            reply_all(group, &Err(shared));
        }
    }
}

/// Steps 2 and 3: frame, batch, write, sync.
fn write_group(core: &Core, group: &[Command]) -> Result<()> {
    #[cfg(test)]
    if core.fail_next_write.swap(false, std::sync::atomic::Ordering::SeqCst) {
        return Err(Error::Io(std::io::Error::other("injected write failure (test)")));
    }
    // Commands are consecutive (module docs), so the group is one run of LSNs, and runs of
    // its small records can share a pack whichever command they came in.
    let Some(first) = group.first().map(|c| c.first_lsn) else { return Ok(()) };
    let mut values = Vec::new();
    debug_assert!(group.windows(2).all(|w| w[1].first_lsn == w[0].last_lsn() + 1));
    let payloads = group.iter().flat_map(|c| c.payloads.iter().map(Vec::as_slice));
    put_records(&mut values, first, payloads)?;
    core.with_store(|store| store.write_values(values))
}

/// Answers and empties the group with one shared result.
fn reply_all(group: &mut Vec<Command>, reply: &Reply) {
    for command in group.drain(..) {
        let _ = command.reply.send(reply.clone());
    }
}
