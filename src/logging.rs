//! The process's log: its filter, its format (text or JSON lines on stderr), and for the
//! server a writer thread that takes the lines off the request workers.

use std::sync::{Mutex, PoisonError};

use tracing_appender::non_blocking::WorkerGuard;

/// The server's writer thread, while it runs.
static WRITER: Mutex<Option<WorkerGuard>> = Mutex::new(None);

/// The log filter when `RUST_LOG` is unset. actix-http's connection dispatcher logs at ERROR
/// every request its own parser refuses (a 64 KB URI, too many headers, a control character in
/// a header, a conflicting `Content-Length` and `Transfer-Encoding`) before sheetd sees it. Those
/// are the client's faults, answered with a bare 400/431, and a filter cannot lower an event's
/// level, so that target is off by default; sheetd's own errors keep their level. openraft
/// logs every replication stream's start and end at INFO: its warnings and errors are kept, and
/// the cluster's own lines say what an operator needs (leadership, restarts).
pub const DEFAULT_LOG_FILTER: &str = "info,actix_http::h1::dispatcher=off,openraft=warn";

/// `default_level` applies when `RUST_LOG` is unset, beside [`DEFAULT_LOG_FILTER`]'s rule.
/// The lines go to stderr as they are made: a command's own output keeps its place among them.
pub fn init(json: bool, default_level: &str) {
    init_to(json, default_level, std::io::stderr);
}

/// [`init`] for the server: its lines are handed to a thread of its own, which writes
/// them to stderr in batches, so a request's log line costs its worker no write(2). The queue
/// blocks rather than drops when it is full (128,000 lines); a line that cannot be written
/// (stderr on a full disk) is dropped there. [`flush`] writes what is queued.
pub fn init_server(json: bool) {
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .thread_name("sheetd-log")
        .finish(std::io::BufWriter::new(std::io::stderr()));
    init_to(json, "info", writer);
    *WRITER.lock().unwrap_or_else(PoisonError::into_inner) = Some(guard);
}

/// Writes every line queued by [`init_server`]'s thread and ends it: called when the process
/// is about to exit or to replace itself, which would cut the queue short. Lines logged after
/// it are dropped; without [`init_server`] it does nothing.
pub fn flush() {
    let guard = WRITER.lock().unwrap_or_else(PoisonError::into_inner).take();
    drop(guard);
}

fn init_to<W>(json: bool, default_level: &str, writer: W)
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| DEFAULT_LOG_FILTER.replacen("info", default_level, 1).into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // A log line that cannot be written (stderr on a full disk) is dropped. By default the
        // subscriber reports that with `eprintln!`, which panics when stderr fails too, and
        // the panic took down the actor whose event it was.
        .log_internal_errors(false)
        .with_writer(writer)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}
