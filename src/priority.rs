//! Background work's CPU priority: the one way a thread doing work no request waits for (a
//! backup, webhook deliveries) steps back.
//!
//! Linux schedules threads one by one, so lowering the calling thread leaves the rest of the
//! process at its priority; threads it starts afterwards inherit the lower one. On a machine
//! with few cores that is what keeps writers' throughput and latency what they are without
//! the background work: it takes the CPU they leave, and all of it when they leave it all.

/// The nice value of background threads: the lowest priority there is. Their own pace
/// matters less than the requests' (a backup is a background job; a webhook that falls behind
/// under a write load catches up when the load eases, its messages getting fuller meanwhile).
pub const BACKGROUND_NICE: i32 = 19;

/// Lowers the calling thread's scheduling priority to [`BACKGROUND_NICE`]. A failure only
/// costs the writers some CPU: it is logged, with `what` the thread's work.
pub fn lower_to_background(what: &str) {
    let tid = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(tid), BACKGROUND_NICE) {
        tracing::warn!(error = %e, thread = what, "cannot lower a background thread's priority");
    }
}
