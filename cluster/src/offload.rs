//! Where the store's blocking work runs (an fsync, a truncation, writing or installing a
//! snapshot): on a blocking thread, off the runtime that heartbeats must never wait behind.
//!
//! Owns: [`off_runtime`], and in a deterministic simulation (the `sim` feature) its inline
//! form: there the work runs on the calling thread, so that no real time passes while the
//! simulation's paused clock could move (it moves only while every task waits), after a
//! simulated latency during which the other tasks run, as they would beside a blocking
//! thread.

use std::io;

/// How long blocking work takes in a simulation: about an fsync on a fast disk.
const SIM_LATENCY: std::time::Duration = std::time::Duration::from_millis(1);

/// Runs `f` on a blocking thread and returns what it returned; inline under the `sim`
/// feature.
///
/// # Errors
/// The blocking thread panicked or the runtime is shutting down.
pub(crate) async fn off_runtime<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    if cfg!(feature = "sim") {
        // The work is queued and done later, as on a blocking thread: other tasks run (and
        // messages arrive) meanwhile. Done whole after that: no real time passes while the
        // simulated clock could move.
        tokio::time::sleep(SIM_LATENCY).await;
        return Ok(f());
    }
    tokio::task::spawn_blocking(f).await.map_err(io::Error::other)
}
