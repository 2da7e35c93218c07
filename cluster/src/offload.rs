//! Where the store's blocking work runs (an fsync, a truncation, writing or installing a
//! snapshot): on a blocking thread, off the runtime that heartbeats must never wait behind.
//!
//! Owns: [`off_runtime`], and in a deterministic simulation (the `sim` feature) its inline
//! form: there the work runs on the calling thread, so that no real time passes while the
//! simulation's paused clock could move (it moves only while every task waits).

use std::io;

/// Runs `f` on a blocking thread and returns what it returned; inline under the `sim`
/// feature.
///
/// # Errors
/// The blocking thread panicked or the runtime is shutting down.
pub(crate) async fn off_runtime<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    if cfg!(feature = "sim") {
        return Ok(f());
    }
    tokio::task::spawn_blocking(f).await.map_err(io::Error::other)
}
