//! The process's log: its filter, its format (text or JSON lines on stderr), and for the
//! server a writer thread that takes the lines off the request workers.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// The server's writer thread, while it runs.
static WRITER: Mutex<Option<BatchWriter>> = Mutex::new(None);

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
/// them to stderr in batches ([`BatchWriter`]), so a request's log line costs its worker
/// neither a write(2) nor a wakeup of that thread. The queue blocks rather than drops when it
/// is full ([`QUEUE_BYTES`]); a line that cannot be written (stderr on a full disk) is dropped
/// there. [`flush`] writes what is queued.
pub fn init_server(json: bool) {
    let writer = BatchWriter::start(std::io::stderr());
    init_to(json, "info", writer.queue());
    *WRITER.lock().unwrap_or_else(PoisonError::into_inner) = Some(writer);
}

/// Writes every line queued by [`init_server`]'s thread and ends it: called when the process
/// is about to exit or to replace itself, which would cut the queue short. Lines logged after
/// it are dropped; without [`init_server`] it does nothing.
pub fn flush() {
    let writer = WRITER.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let Some(writer) = writer {
        writer.stop();
    }
}

/// How much the queue holds before a line waits for room.
pub const QUEUE_BYTES: usize = 16 << 20;

/// How long the writer thread lets lines gather after a write before it takes them. While it
/// pauses it is not waiting for lines, so a line queued meanwhile wakes nothing: under load a
/// batch of lines costs one wakeup, not one per line (a thread woken for each request's line
/// took a tenth of a busy node's samples, nearly all of it in the scheduler).
const GATHER: Duration = Duration::from_millis(1);

/// A thread that writes the lines queued by [`LineQueue`]'s writers, in batches, in the order
/// they were queued.
pub struct BatchWriter {
    queue: LineQueue,
    thread: std::thread::JoinHandle<()>,
}

/// The queue of lines [`BatchWriter`]'s thread writes: a `MakeWriter` for the subscriber,
/// each event's line appended whole (the subscriber writes an event with one `write_all`).
#[derive(Clone)]
pub struct LineQueue(Arc<Shared>);

struct Shared {
    state: Mutex<Queued>,
    /// The thread waits here for lines while idle; a line waits here for room.
    changed: Condvar,
}

/// Invariant: `idle` is true only while the thread waits on `changed` for lines, so a line
/// queued then must wake it, and one queued at any other time need not.
#[derive(Default)]
struct Queued {
    lines: Vec<u8>,
    idle: bool,
    stopping: bool,
}

impl BatchWriter {
    /// Starts the thread, writing to `out`.
    ///
    /// # Panics
    /// When the thread cannot be spawned (at start, before anything is served).
    pub fn start(out: impl Write + Send + 'static) -> BatchWriter {
        let queue = LineQueue(Arc::new(Shared {
            state: Mutex::new(Queued::default()),
            changed: Condvar::new(),
        }));
        let shared = Arc::clone(&queue.0);
        let thread = std::thread::Builder::new()
            .name("sheetd-log".into())
            .spawn(move || write_batches(&shared, out))
            .expect("spawn the log writer thread");
        BatchWriter { queue, thread }
    }

    /// The queue to hand to the subscriber.
    pub fn queue(&self) -> LineQueue {
        self.queue.clone()
    }

    /// Writes every line queued so far and ends the thread; lines queued later are dropped.
    pub fn stop(self) {
        self.queue.lock().stopping = true;
        self.queue.0.changed.notify_all();
        let _ = self.thread.join();
    }
}

impl LineQueue {
    fn lock(&self) -> MutexGuard<'_, Queued> {
        self.0.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The thread's loop: takes every queued line at once, writes them, then pauses ([`GATHER`])
/// before the next take; waits for a line only when it found none.
fn write_batches(shared: &Shared, mut out: impl Write) {
    let mut spare = Vec::new();
    loop {
        let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        while state.lines.is_empty() && !state.stopping {
            state.idle = true;
            state = shared.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
        state.idle = false;
        if state.lines.is_empty() {
            // Stopping, and everything written.
            return;
        }
        std::mem::swap(&mut state.lines, &mut spare);
        drop(state);
        // Lines waiting for room may go on.
        shared.changed.notify_all();
        // A line that cannot be written (stderr on a full disk) is dropped.
        let _ = out.write_all(&spare).and_then(|()| out.flush());
        spare.clear();
        std::thread::sleep(GATHER);
    }
}

impl Write for &LineQueue {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let mut state = self.lock();
        while state.lines.len() >= QUEUE_BYTES && !state.stopping {
            state = self.0.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
        if state.stopping {
            return Ok(line.len());
        }
        state.lines.extend_from_slice(line);
        if state.idle {
            state.idle = false;
            drop(state);
            self.0.changed.notify_all();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LineQueue {
    type Writer = &'a LineQueue;

    fn make_writer(&'a self) -> &'a LineQueue {
        self
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink the test reads back.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Every line queued before the stop is written whole, each writer's in its order, and
    /// none after it.
    #[test]
    fn every_line_queued_before_the_stop_is_written_whole_and_in_order() {
        let sink = Sink::default();
        let writer = BatchWriter::start(sink.clone());
        let queue = writer.queue();
        std::thread::scope(|scope| {
            for t in 0..4 {
                let queue = &queue;
                scope.spawn(move || {
                    for n in 0..2000 {
                        let line = format!("thread {t} line {n} {}\n", "x".repeat(n % 300));
                        (&*queue).write_all(line.as_bytes()).unwrap();
                    }
                });
            }
        });
        writer.stop();
        (&queue).write_all(b"after the stop\n").unwrap();
        let written = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let mut next = [0usize; 4];
        for line in written.lines() {
            let mut words = line.split(' ');
            assert_eq!(words.next(), Some("thread"), "{line}");
            let t: usize = words.next().unwrap().parse().unwrap();
            assert_eq!(words.next(), Some("line"));
            let n: usize = words.next().unwrap().parse().unwrap();
            assert_eq!(n, next[t], "thread {t}'s lines out of order or torn");
            assert_eq!(words.next(), Some("x".repeat(n % 300).as_str()), "{line}");
            next[t] += 1;
        }
        assert_eq!(next, [2000; 4]);
    }
}
