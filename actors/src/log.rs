//! The one seam to the log: [`RecordLog`], and [`WalLog`], its one-node implementation.
//!
//! Every record the domain writes goes through [`RecordLog::append`]: a sheet's writes, the
//! directory's changes and imports, an idempotent answer decided before any sheet is reached,
//! and a checkpoint's marker. Records are read back by position (the change feed), a checkpoint
//! truncates the log behind it, and a start replays the log through a [`Replay`]. Above this
//! module nothing knows how or where records are stored: the sled `wal` crate is named here and
//! nowhere else in the domain (its codec too is reached through [`codec`] below), so a
//! replicated log can take [`WalLog`]'s place behind the same trait.
//!
//! # What the seam promises
//!
//! - **Positions are opaque and ordered.** An [`Lsn`] is a number that only grows in append
//!   order; nothing above the seam does arithmetic on it beyond comparing.
//! - **Durable means "will survive".** [`Appended`] resolves once its record, and every record
//!   before it, will survive a crash (fsynced on this node; on a majority in a cluster).
//! - **Side effects in log order.** The `at` callback of an append runs once, with the record's
//!   position, before any later append is given a position: state that must follow log order
//!   (stored idempotent answers, events) is changed there.
//! - **An epoch names a continuous history.** When the log loses records it had not made
//!   durable (a failed disk re-opened, and later a leadership change), its epoch moves on; an
//!   append made with an older epoch is refused, so no writer builds on state the log lost.

use std::future::Future;
use std::io::{Read, Write};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

/// The checked, compressed block stream of a backup file (the log's framing, reused).
pub use wal::blocks;
pub use wal::codec;
/// Writes a new data dir in [`WalLog`]'s format from a checkpoint and records at their
/// positions: how a backup is restored on one node.
pub use wal::restore::Restore as WalLogRestore;
/// The sled log's own error, which [`crate::Error::Wal`] carries.
pub use wal::Error as LogError;
pub use wal::{RecoveryReport, WalStats, FLUSH_LATENCY_BUCKETS_SECONDS};

use crate::error::Result;
use crate::record::Record;

/// A record's position in the log: opaque, strictly increasing in append order; 0 is "before
/// the first record".
pub type Lsn = u64;

/// How an append may be refused beyond the log's own state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppendOptions {
    /// The record may use the room kept below the free-space floor: for records that let the
    /// log shrink (a checkpoint's marker) or keep the service governable while row writes are
    /// refused (a key revocation).
    pub reserve: bool,
    /// Refuse the append unless [`RecordLog::epoch`] still equals this: for a writer whose
    /// in-memory state may hold records the log has since lost.
    pub epoch: Option<u64>,
}

/// A record taken by the log: its position, and a future that resolves with it once the record
/// is durable. Dropping it does not cancel the write.
pub struct Appended {
    lsn: Lsn,
    durable: Pin<Box<dyn Future<Output = Result<()>> + Send>>,
}

impl Appended {
    /// A record at `lsn` that is durable once `durable` resolves `Ok`.
    pub fn new(lsn: Lsn, durable: impl Future<Output = Result<()>> + Send + 'static) -> Self {
        Appended { lsn, durable: Box::pin(durable) }
    }

    /// The record's position.
    pub fn lsn(&self) -> Lsn {
        self.lsn
    }
}

impl Future for Appended {
    type Output = Result<Lsn>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Lsn>> {
        let lsn = self.lsn;
        self.durable.as_mut().poll(cx).map_ok(|()| lsn)
    }
}

impl std::fmt::Debug for Appended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Appended").field("lsn", &self.lsn).finish_non_exhaustive()
    }
}

/// Receives what a start finds in the log, in order, on the thread that opens it.
pub trait Replay {
    /// At most once, before any record: the latest checkpoint, as the bytes its writer gave
    /// [`RecordLog::checkpoint`], each block checked before it is handed on.
    ///
    /// # Errors
    /// Any error aborts the start.
    fn checkpoint(&mut self, lsn: Lsn, snapshot: &mut dyn Read) -> Result<()>;

    /// Each record after the checkpoint, in position order.
    ///
    /// # Errors
    /// Any error aborts the start, naming `lsn`.
    fn record(&mut self, lsn: Lsn, record: Record) -> Result<()>;

    /// Whether a record at or below the checkpoint is still read by position (the change feed
    /// keeps it); asked after [`Replay::checkpoint`] when the log cannot tell by itself.
    fn retains(&self, lsn: Lsn) -> bool;
}

/// The durable, ordered log of the domain's records. See the module docs for its promises.
///
/// An implementation is opened by a constructor of its own that replays what it holds through
/// a [`Replay`] before it takes any append.
pub trait RecordLog: Send + Sync + 'static {
    /// Appends `record`: `at` runs once with its position (under the log's ordering, see the
    /// module docs), and the returned [`Appended`] resolves once it is durable.
    ///
    /// # Errors
    /// The log refuses the record (no space, failed, shut down, an older epoch) or it cannot be
    /// encoded; then `at` has not run.
    fn append(
        &self,
        record: &Record,
        options: AppendOptions,
        at: &mut dyn FnMut(Lsn),
    ) -> Result<Appended> {
        // Encoded before the log's ordering is taken: every appender waits on it.
        self.append_encoded(codec::encode(record)?, options, at)
    }

    /// [`RecordLog::append`] of a record encoded already ([`codec::encode`]): for a writer that
    /// encodes a large record on another core while it does other work.
    ///
    /// # Errors
    /// As [`RecordLog::append`].
    fn append_encoded(
        &self,
        bytes: Vec<u8>,
        options: AppendOptions,
        at: &mut dyn FnMut(Lsn),
    ) -> Result<Appended>;

    /// The durable record at `lsn`, if the log still holds it (records after the checkpoint,
    /// and those a checkpoint retained). Blocking: a read may reach the disk.
    ///
    /// # Errors
    /// A damaged record (never skipped silently), or the log failing to read.
    fn read(&self, lsn: Lsn) -> Result<Option<Record>>;

    /// The durable record at `lsn` as the log stores it ([`codec`] bytes), if it still holds
    /// it: for a copy of the log that keeps records as they are (the log archive), without a
    /// second encoding. Blocking.
    ///
    /// # Errors
    /// As [`RecordLog::read`].
    fn read_stored(&self, lsn: Lsn) -> Result<Option<Vec<u8>>>;

    /// The highest position given to a record.
    fn last_lsn(&self) -> Lsn;

    /// The highest position known durable: every record at or below it is.
    fn durable_lsn(&self) -> Lsn;

    /// Resolves once every record up to `lsn` is durable.
    fn wait_durable(&self, lsn: Lsn) -> Pin<Box<dyn Future<Output = Result<()>> + Send>>;

    /// The current epoch (see [`AppendOptions::epoch`]).
    fn epoch(&self) -> u64;

    /// Writes the checkpoint at `lsn` (durable already) with `snapshot`, then drops the records
    /// at or below it except those `retains` keeps for reading by position. Blocking.
    ///
    /// # Errors
    /// `lsn` not durable or behind the current checkpoint, the log failed, `snapshot` failing,
    /// or the disk refusing the file.
    fn checkpoint(
        &self,
        lsn: Lsn,
        snapshot: &mut dyn FnMut(&mut dyn Write) -> Result<()>,
        retains: &dyn Fn(Lsn) -> bool,
    ) -> Result<()>;

    /// Re-opens a failed log from what is durable; `on_reopen(durable)` runs before any new
    /// record is taken, so callers drop what they kept of lost records. `Ok(None)` when the log
    /// had not failed. Blocking.
    ///
    /// # Errors
    /// Whatever re-opening found; the log stays failed and a later call tries again.
    fn heal(&self, on_reopen: &mut dyn FnMut(Lsn)) -> Result<Option<Lsn>>;

    /// The log's counters, for metrics.
    fn stats(&self) -> WalStats;

    /// Measures free space again, so the floor and [`RecordLog::unwritable_reason`] stay current
    /// while nothing is appended.
    ///
    /// # Errors
    /// The file system cannot be asked.
    fn refresh_space(&self) -> Result<()>;

    /// Whether the log failed and takes nothing until [`RecordLog::heal`].
    fn is_failed(&self) -> bool;

    /// Why the log takes no records now, as a sentence; `None` while it does.
    fn unwritable_reason(&self) -> Option<String>;

    /// Makes what is queued durable and stops taking records; a later call is a no-op.
    ///
    /// # Errors
    /// Some queued records could not be made durable.
    fn shutdown(&self) -> Result<()>;

    /// Test hook: nothing becomes durable while the returned guard lives.
    #[cfg(feature = "testing")]
    fn hold_commits(&self) -> Box<dyn std::fmt::Debug + '_>;
}

/// Where [`WalLog`] keeps its files, and its free-space floor.
#[derive(Clone, Debug)]
pub struct WalLogConfig {
    /// The data dir.
    pub dir: std::path::PathBuf,
    /// The free-space floor (see `wal::Config::min_free_bytes`); `None` for the default.
    pub min_free_bytes: Option<u64>,
}

/// [`RecordLog`] on one node: the sled write-ahead log (`wal`), fsynced group commits.
#[derive(Clone, Debug)]
pub struct WalLog {
    wal: wal::Wal,
}

impl WalLog {
    /// Opens (or creates) the log in `config.dir` and replays it through `replay`.
    ///
    /// # Errors
    /// The data dir is in use, damaged, or lacks the room a start needs; `replay` failed.
    pub fn open(config: WalLogConfig, replay: &mut dyn Replay) -> Result<(WalLog, RecoveryReport)> {
        let wal_config = wal::Config {
            min_free_bytes: config.min_free_bytes,
            ..wal::Config::default_for(&config.dir)
        };
        let (wal, report) = wal::Wal::recover(wal_config, &mut Decoding(replay))?;
        Ok((WalLog { wal }, report))
    }

    /// Replays the log in `dir` through `replay` without changing it (from a private copy).
    ///
    /// # Errors
    /// As [`WalLog::open`].
    pub fn verify(dir: &std::path::Path, replay: &mut dyn Replay) -> Result<RecoveryReport> {
        Ok(wal::Wal::verify(wal::Config::default_for(dir), &mut Decoding(replay))?)
    }
}

/// Hands the sled log's payloads to a [`Replay`] as records.
struct Decoding<'a>(&'a mut dyn Replay);

impl wal::Replayer for Decoding<'_> {
    fn checkpoint(
        &mut self,
        lsn: Lsn,
        snapshot: &mut dyn Read,
    ) -> std::result::Result<(), wal::BoxError> {
        Ok(self.0.checkpoint(lsn, snapshot)?)
    }

    fn record(&mut self, lsn: Lsn, payload: &[u8]) -> std::result::Result<(), wal::BoxError> {
        Ok(self.0.record(lsn, codec::decode(payload)?)?)
    }

    fn retains(&self, lsn: Lsn) -> bool {
        self.0.retains(lsn)
    }
}

/// A record handed to an encoder thread ([`encode_elsewhere`]), encoded by whichever of that
/// thread and its writer takes it first.
pub(crate) struct Encoding {
    record: Arc<Record>,
    /// Set by whichever side encodes the record.
    taken: Arc<AtomicBool>,
    answer: crossbeam_channel::Receiver<Result<Vec<u8>>>,
}

impl Encoding {
    /// The record's bytes: encoded here unless an encoder thread took it first (then its
    /// answer is awaited). On a machine whose cores are all busy, an encoder may not have run
    /// yet when the writer is done with its other work; waiting for it then cost bulkAdd a
    /// tenth of its rate.
    pub(crate) fn bytes(self) -> Result<Vec<u8>> {
        if !self.taken.swap(true, Ordering::AcqRel) {
            return Ok(codec::encode(&*self.record)?);
        }
        self.answer.recv().unwrap_or_else(|_| Ok(codec::encode(&*self.record)?))
    }
}

/// Hands `record` to one of a few long-lived encoder threads (one per core), for a writer that
/// applies a large write meanwhile and then takes the bytes ([`Encoding::bytes`]). Long-lived,
/// so each keeps its compression context: a thread of its own per record built one every time,
/// and cost bulkAdd more than the overlap saved.
pub(crate) fn encode_elsewhere(record: Arc<Record>) -> Encoding {
    type Job = (Arc<Record>, Arc<AtomicBool>, crossbeam_channel::Sender<Result<Vec<u8>>>);
    static ENCODERS: OnceLock<Option<crossbeam_channel::Sender<Job>>> = OnceLock::new();
    let encoders = ENCODERS.get_or_init(|| {
        let (send, receive) = crossbeam_channel::unbounded::<Job>();
        let spawned = (0..crate::report::columns::threads())
            .filter(|i| {
                let receive = receive.clone();
                let encoder = move || {
                    for (record, taken, reply) in receive {
                        if !taken.swap(true, Ordering::AcqRel) {
                            // The writer waits for this answer: it found the record taken.
                            let _ = reply.send(codec::encode(&*record).map_err(Into::into));
                        }
                    }
                };
                std::thread::Builder::new()
                    .name(format!("sheetd-encode-{i}"))
                    .spawn(encoder)
                    .is_ok()
            })
            .count();
        (spawned > 0).then_some(send)
    });
    let (reply, answer) = crossbeam_channel::bounded(1);
    let taken = Arc::new(AtomicBool::new(false));
    if let Some(encoders) = encoders {
        // Not handed over: the writer finds the record untaken and encodes it itself.
        let _ = encoders.send((Arc::clone(&record), Arc::clone(&taken), reply));
    }
    Encoding { record, taken, answer }
}

impl RecordLog for WalLog {
    fn append_encoded(
        &self,
        bytes: Vec<u8>,
        options: AppendOptions,
        at: &mut dyn FnMut(Lsn),
    ) -> Result<Appended> {
        let options = wal::AppendOptions { reserve: options.reserve, epoch: options.epoch };
        let commit = self.wal.append_with_options(options, |lsn| {
            at(lsn);
            bytes
        })?;
        let lsn = commit.lsn();
        Ok(Appended::new(lsn, async move {
            commit.await?;
            Ok(())
        }))
    }

    fn read(&self, lsn: Lsn) -> Result<Option<Record>> {
        match self.wal.read(lsn)? {
            Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
            None => Ok(None),
        }
    }

    fn read_stored(&self, lsn: Lsn) -> Result<Option<Vec<u8>>> {
        Ok(self.wal.read(lsn)?)
    }

    fn last_lsn(&self) -> Lsn {
        self.wal.last_lsn()
    }

    fn durable_lsn(&self) -> Lsn {
        self.wal.durable_lsn()
    }

    fn wait_durable(&self, lsn: Lsn) -> Pin<Box<dyn Future<Output = Result<()>> + Send>> {
        let wait = self.wal.wait_durable(lsn);
        Box::pin(async move { Ok(wait.await?) })
    }

    fn epoch(&self) -> u64 {
        self.wal.epoch()
    }

    fn checkpoint(
        &self,
        lsn: Lsn,
        snapshot: &mut dyn FnMut(&mut dyn Write) -> Result<()>,
        retains: &dyn Fn(Lsn) -> bool,
    ) -> Result<()> {
        // The snapshot's own error is kept whole for the caller; the log only needs to know
        // that the file is not to be kept.
        let mut failed = None;
        let written = self.wal.checkpoint_streamed(
            lsn,
            &mut |out| {
                snapshot(out).map_err(|e| {
                    let message = e.to_string();
                    failed = Some(e);
                    wal::Error::Io(std::io::Error::other(message))
                })
            },
            retains,
        );
        match failed {
            Some(e) => Err(e),
            None => Ok(written?),
        }
    }

    fn heal(&self, on_reopen: &mut dyn FnMut(Lsn)) -> Result<Option<Lsn>> {
        Ok(self.wal.heal(on_reopen)?)
    }

    fn stats(&self) -> WalStats {
        self.wal.stats()
    }

    fn refresh_space(&self) -> Result<()> {
        Ok(self.wal.refresh_space()?)
    }

    fn is_failed(&self) -> bool {
        self.wal.is_failed()
    }

    fn unwritable_reason(&self) -> Option<String> {
        self.wal.unwritable_reason()
    }

    fn shutdown(&self) -> Result<()> {
        Ok(self.wal.shutdown()?)
    }

    #[cfg(feature = "testing")]
    fn hold_commits(&self) -> Box<dyn std::fmt::Debug + '_> {
        Box::new(self.wal.hold_commits())
    }
}

/// Encodes a checkpoint's value into `out` with the log's codec; returns the bytes written.
///
/// # Errors
/// The value cannot be encoded, or `out` refuses the bytes.
pub fn encode_snapshot<T: serde::Serialize>(value: &T, out: &mut dyn Write) -> Result<u64> {
    Ok(codec::encode_to(value, &mut &mut *out)?)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::record::IdemEntry;

    /// Keeps what a start replays.
    #[derive(Default)]
    struct Collect(Vec<(Lsn, Record)>);

    impl Replay for Collect {
        fn checkpoint(&mut self, _: Lsn, _: &mut dyn Read) -> Result<()> {
            Ok(())
        }

        fn record(&mut self, lsn: Lsn, record: Record) -> Result<()> {
            self.0.push((lsn, record));
            Ok(())
        }

        fn retains(&self, _: Lsn) -> bool {
            false
        }
    }

    fn answer(n: u64) -> Record {
        Record::Idempotency(IdemEntry {
            key_id: n,
            idem_key: format!("k{n}"),
            fingerprint: [0; 32],
            status: 200,
            body: n.to_string().into_bytes(),
            request_id: format!("req_{n}"),
            completed_at: 0,
        })
    }

    fn key_of(record: &Record) -> u64 {
        match record {
            Record::Idempotency(entry) => entry.key_id,
            other => panic!("not an answer: {other:?}"),
        }
    }

    fn open(dir: &std::path::Path) -> (WalLog, Collect) {
        let mut replayed = Collect::default();
        let config = WalLogConfig { dir: dir.to_owned(), min_free_bytes: Some(0) };
        let (log, _) = WalLog::open(config, &mut replayed).unwrap();
        (log, replayed)
    }

    #[tokio::test]
    async fn appends_are_durable_in_order_read_back_and_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = open(dir.path());
        let log: Arc<dyn RecordLog> = Arc::new(log);
        // Four writers at once; `at` sees each position in the order the log gives them.
        let seen = Arc::new(Mutex::new(Vec::new()));
        let writers: Vec<_> = (0..4u64)
            .map(|w| {
                let (log, seen) = (Arc::clone(&log), Arc::clone(&seen));
                std::thread::spawn(move || {
                    (0..50u64)
                        .map(|i| {
                            let n = w * 1000 + i;
                            let appended = log
                                .append(&answer(n), AppendOptions::default(), &mut |lsn| {
                                    seen.lock().unwrap().push(lsn)
                                })
                                .unwrap();
                            (n, appended)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut appended: Vec<(u64, Appended)> =
            writers.into_iter().flat_map(|w| w.join().unwrap()).collect();
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen, (1..=200).collect::<Vec<Lsn>>(), "positions given in call order");
        // Awaited newest first: each resolves only once it and everything before it is durable.
        appended.sort_by_key(|(_, a)| std::cmp::Reverse(a.lsn()));
        let mut written = Vec::new();
        for (n, a) in appended {
            let lsn = a.await.unwrap();
            assert!(log.durable_lsn() >= lsn);
            written.push((lsn, n));
        }
        written.sort();
        for &(lsn, n) in &written {
            assert_eq!(key_of(&log.read(lsn).unwrap().unwrap()), n, "record {lsn} reads back");
        }
        assert!(log.read(201).unwrap().is_none(), "nothing past the last record");
        log.shutdown().unwrap();
        drop(log);

        let (_, replayed) = open(dir.path());
        let replayed: Vec<(Lsn, u64)> = replayed.0.iter().map(|(l, r)| (*l, key_of(r))).collect();
        assert_eq!(replayed, written, "a start replays every record, in order");
    }

    #[tokio::test]
    async fn an_append_from_another_epoch_is_refused_and_runs_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = open(dir.path());
        let stale = AppendOptions { reserve: false, epoch: Some(log.epoch() + 1) };
        let mut ran = false;
        assert!(log.append(&answer(1), stale, &mut |_| ran = true).is_err());
        assert!(!ran, "`at` runs only for a record the log took");
        let current = AppendOptions { reserve: false, epoch: Some(log.epoch()) };
        let lsn = log.append(&answer(2), current, &mut |_| ran = true).unwrap().await.unwrap();
        assert!(ran);
        assert_eq!(lsn, 1, "the refused append took no position");
        log.wait_durable(lsn).await.unwrap();
    }

    #[tokio::test]
    async fn a_checkpoint_drops_what_it_covers_except_what_is_retained_and_keeps_a_snapshot_error()
    {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = open(dir.path());
        // One group commit each, so each record is stored on its own (the log stores the small
        // records of one group together, and keeps them together while one is retained).
        for n in 1..=3 {
            log.append(&answer(n), AppendOptions::default(), &mut |_| {}).unwrap().await.unwrap();
        }
        let refused = log.checkpoint(
            3,
            &mut |_| Err(crate::Error::invalid("the snapshot could not be made")),
            &|_| false,
        );
        assert!(
            matches!(&refused, Err(crate::Error::Invalid { message, .. }) if message.contains("could not be made")),
            "{refused:?}"
        );
        assert!(log.read(1).unwrap().is_some(), "a failed checkpoint truncates nothing");
        log.checkpoint(3, &mut |out| encode_snapshot(&7u32, out).map(|_| ()), &|lsn| lsn == 2)
            .unwrap();
        assert!(log.read(1).unwrap().is_none());
        assert_eq!(key_of(&log.read(2).unwrap().unwrap()), 2, "a retained record stays readable");
        assert!(log.read(3).unwrap().is_none());
    }
}
