//! Behaviour tests of the whole log: round trips, concurrency, torn tails, checkpoints and
//! their crash windows, verify, failure handling. Unit tests of single modules live next to
//! their code.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::handle::block_on;
use crate::{
    fsutil, testing, AppendOptions, Config, Corruption, Error, FrameDefect, Lsn, RecoveryReport,
    Replayer, Wal,
};

type ReplayResult = std::result::Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Records everything recovery delivers; can be told to fail at one LSN.
#[derive(Debug, Default)]
struct Collect {
    checkpoint: Option<(Lsn, Vec<u8>)>,
    records: Vec<(Lsn, Vec<u8>)>,
    fail_at: Option<Lsn>,
    fail_checkpoint: bool,
}

impl Replayer for Collect {
    fn checkpoint(&mut self, lsn: Lsn, snapshot: &mut dyn std::io::Read) -> ReplayResult {
        assert!(self.checkpoint.is_none(), "checkpoint delivered twice");
        assert!(self.records.is_empty(), "checkpoint delivered after a record");
        if self.fail_checkpoint {
            return Err(format!("cannot load checkpoint {lsn}").into());
        }
        let mut bytes = Vec::new();
        snapshot.read_to_end(&mut bytes)?;
        self.checkpoint = Some((lsn, bytes));
        Ok(())
    }

    fn record(&mut self, lsn: Lsn, payload: &[u8]) -> ReplayResult {
        if self.fail_at == Some(lsn) {
            return Err(format!("cannot apply operation {lsn}").into());
        }
        self.records.push((lsn, payload.to_vec()));
        Ok(())
    }
}

/// Small caches keep sled's memory and start-up cost low in tests.
fn config(dir: &Path) -> Config {
    Config {
        dir: dir.to_path_buf(),
        max_batch_records: 8192,
        cache_capacity_bytes: 1 << 20,
        min_free_bytes: Some(0),
    }
}

fn recover(dir: &Path) -> (Wal, RecoveryReport, Collect) {
    let mut collect = Collect::default();
    let (wal, report) = Wal::recover(config(dir), &mut collect).expect("recover");
    (wal, report, collect)
}

fn try_recover(dir: &Path) -> crate::Result<(Wal, RecoveryReport, Collect)> {
    let mut collect = Collect::default();
    Wal::recover(config(dir), &mut collect).map(|(wal, report)| (wal, report, collect))
}

fn verify(dir: &Path) -> crate::Result<(RecoveryReport, Collect)> {
    let mut collect = Collect::default();
    Wal::verify(config(dir), &mut collect).map(|report| (report, collect))
}

/// Deterministic, recognisable payload bytes.
fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
        .collect()
}

/// Appends `payloads` one by one, waits for all, returns (lsn, payload) pairs.
fn append_all(wal: &Wal, payloads: &[Vec<u8>]) -> Vec<(Lsn, Vec<u8>)> {
    let commits: Vec<_> = payloads.iter().map(|p| wal.append(p.clone()).unwrap()).collect();
    commits.into_iter().zip(payloads).map(|(c, p)| (c.wait().unwrap(), p.clone())).collect()
}

/// Appends each payload once the one before is durable: one group each, so every record is
/// stored alone (never in a pack), for tests about one record's bytes.
fn append_each(wal: &Wal, payloads: &[Vec<u8>]) -> Vec<(Lsn, Vec<u8>)> {
    payloads.iter().map(|p| (wal.append(p.clone()).unwrap().wait().unwrap(), p.clone())).collect()
}

/// Appends `payloads` as one batch, so as one group (its small records packed); returns them
/// with their LSNs.
fn append_group(wal: &Wal, payloads: Vec<Vec<u8>>) -> Vec<(Lsn, Vec<u8>)> {
    let last = wal.append_batch(payloads.clone()).unwrap().wait().unwrap();
    (last + 1 - payloads.len() as Lsn..).zip(payloads).collect()
}

/// Ten small records of one group: one pack.
fn ten_packed(wal: &Wal) -> Vec<(Lsn, Vec<u8>)> {
    append_group(wal, (1..=10u64).map(|i| payload(i, 40)).collect())
}

/// Every record of `written` reads back from the open log.
fn assert_reads(wal: &Wal, written: &[(Lsn, Vec<u8>)]) {
    for (lsn, bytes) in written {
        assert_eq!(wal.read(*lsn).unwrap().as_deref(), Some(&bytes[..]), "lsn {lsn}");
    }
}

/// The key length and stored length of every value in the open log's store, in key order.
fn stored_values(wal: &Wal) -> Vec<(usize, usize)> {
    wal.core()
        .with_store(|store| {
            Ok(store.db.iter().map(|kv| kv.unwrap()).map(|(k, v)| (k.len(), v.len())).collect())
        })
        .unwrap()
}

/// All files under `dir` with their contents, to prove something did not change.
fn snapshot_files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, &mut out);
    out
}

/// Copies a stopped data dir to a fresh location.
fn copy_data_dir(from: &Path, parent: &Path, name: &str) -> PathBuf {
    let to = parent.join(name);
    fsutil::copy_dir(from, &to).unwrap();
    to
}

fn same_report(a: &RecoveryReport, b: &RecoveryReport) -> bool {
    RecoveryReport { elapsed: b.elapsed, ..a.clone() } == *b
}

#[test]
fn round_trip_various_sizes_and_next_lsn_continues() {
    let dir = tempfile::tempdir().unwrap();
    let mut sizes = vec![0, 1, 8, 9, 100, 4096, 100_000, 1 << 20, 0];
    sizes.extend((0..200).map(|i| (i * 37) % 700));
    let payloads: Vec<Vec<u8>> =
        sizes.iter().enumerate().map(|(i, &len)| payload(i as u64, len)).collect();

    let (wal, report, collect) = recover(dir.path());
    assert_eq!(report.last_lsn, 0);
    assert!(collect.checkpoint.is_none() && collect.records.is_empty());
    let written = append_all(&wal, &payloads);
    let lsns: Vec<Lsn> = written.iter().map(|(l, _)| *l).collect();
    assert_eq!(lsns, (1..=payloads.len() as u64).collect::<Vec<_>>());
    assert_eq!(wal.durable_lsn(), payloads.len() as u64);
    wal.shutdown().unwrap();
    drop(wal);

    let (wal, report, collect) = recover(dir.path());
    assert_eq!(collect.records, written, "replay must return exactly what was written");
    assert_eq!(report.records_replayed, payloads.len() as u64);
    assert_eq!(report.bytes_replayed, sizes.iter().sum::<usize>() as u64);
    assert_eq!(report.last_lsn, payloads.len() as u64);
    assert!(!report.torn_tail_dropped);
    assert_eq!(report.stale_records_truncated, 0);

    let next = wal.append(b"after restart".to_vec()).unwrap();
    assert_eq!(next.lsn(), payloads.len() as u64 + 1);
    assert_eq!(next.wait().unwrap(), payloads.len() as u64 + 1);
    let stats = wal.stats();
    assert_eq!(stats.records_since_checkpoint, payloads.len() as u64 + 1);
    assert_eq!(
        stats.bytes_since_checkpoint,
        sizes.iter().sum::<usize>() as u64 + b"after restart".len() as u64
    );
    drop(wal); // drop of the last handle shuts down too

    let (_wal, report, collect) = recover(dir.path());
    assert_eq!(report.last_lsn, payloads.len() as u64 + 1);
    assert_eq!(collect.records.last().unwrap().1, b"after restart");
}

#[test]
fn concurrent_appenders_get_contiguous_lsns_in_order() {
    const THREADS: u64 = 8;
    const PER_THREAD: u64 = 500;
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = recover(dir.path());
    // What append_with's closures observed, in the order they ran.
    let side_effects = Arc::new(Mutex::new(Vec::new()));

    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let wal = wal.clone();
            let side_effects = Arc::clone(&side_effects);
            std::thread::spawn(move || {
                let runtime =
                    tokio::runtime::Builder::new_current_thread().build().expect("runtime");
                let mut done = Vec::new();
                let mut pending = Vec::new();
                for i in 0..PER_THREAD {
                    let body = payload(t * 1_000_000 + i, (i % 50) as usize);
                    let commit = if t % 2 == 0 {
                        let expected = body.clone();
                        let side_effects = Arc::clone(&side_effects);
                        wal.append_with(move |lsn| {
                            side_effects.lock().unwrap().push(lsn);
                            expected
                        })
                        .unwrap()
                    } else {
                        wal.append(body.clone()).unwrap()
                    };
                    pending.push((commit, body));
                    // Mix waiting styles: sometimes one at a time, sometimes in bulk.
                    if i % 10 == 0 || i + 1 == PER_THREAD {
                        for (commit, body) in pending.drain(..) {
                            let lsn = commit.lsn();
                            assert_eq!(runtime.block_on(commit).unwrap(), lsn);
                            done.push((lsn, body));
                        }
                    }
                }
                done
            })
        })
        .collect();
    let mut all: Vec<(Lsn, Vec<u8>)> =
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect();

    // Each thread saw its own LSNs increase; together they are unique and contiguous.
    all.sort_by_key(|(lsn, _)| *lsn);
    let lsns: Vec<Lsn> = all.iter().map(|(l, _)| *l).collect();
    assert_eq!(lsns, (1..=THREADS * PER_THREAD).collect::<Vec<_>>());
    let effects = side_effects.lock().unwrap().clone();
    assert_eq!(effects.len() as u64, THREADS / 2 * PER_THREAD);
    assert!(effects.windows(2).all(|w| w[0] < w[1]), "append_with side effects out of LSN order");

    let stats = wal.stats();
    assert_eq!(stats.records_flushed, THREADS * PER_THREAD);
    assert_eq!(stats.durable_lsn, THREADS * PER_THREAD);
    eprintln!(
        "group commit: {} records in {} flushes (largest group {}, {:.3}s flushing)",
        stats.records_flushed, stats.flushes, stats.batch_size_max, stats.flush_seconds_total
    );
    drop(wal);

    let (_wal, report, collect) = recover(dir.path());
    assert_eq!(report.records_replayed, THREADS * PER_THREAD);
    assert_eq!(collect.records, all);
}

#[test]
fn torn_tail_at_every_byte_offset_is_dropped_and_lsn_reused() {
    const N: u64 = 5;
    let work = tempfile::tempdir().unwrap();
    let base = work.path().join("base");
    let written = {
        let (wal, _, _) = recover(&base);
        let payloads: Vec<_> = (0..N).map(|i| payload(i, 16)).collect();
        let written = append_each(&wal, &payloads);
        wal.shutdown().unwrap();
        written
    };
    let frame_len = testing::last_frame_len(&base).unwrap();
    assert_eq!(frame_len, crate::frame::HEADER_LEN + 16);

    for keep in 0..frame_len {
        let dir = copy_data_dir(&base, work.path(), &format!("torn-{keep}"));
        assert_eq!(testing::tear_last_record(&dir, keep).unwrap(), N);

        let (wal, report, collect) = recover(&dir);
        assert!(report.torn_tail_dropped, "keep={keep}");
        assert_eq!(report.torn_tail_lsn, Some(N));
        assert_eq!(collect.records, written[..N as usize - 1], "keep={keep}");
        assert_eq!(report.last_lsn, N - 1);
        // The torn record was never acknowledged, so its LSN is handed out again.
        let commit = wal.append(b"replacement".to_vec()).unwrap();
        assert_eq!(commit.wait().unwrap(), N);
        drop(wal);

        let (again, report, collect) = recover(&dir);
        assert!(!report.torn_tail_dropped, "keep={keep}: second recovery must be clean");
        assert_eq!(report.last_lsn, N);
        assert_eq!(collect.records[..N as usize - 1], written[..N as usize - 1]);
        assert_eq!(collect.records[N as usize - 1], (N, b"replacement".to_vec()));
        drop(again);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn flipped_byte_in_last_record_is_a_torn_tail() {
    const N: u64 = 4;
    let work = tempfile::tempdir().unwrap();
    let base = work.path().join("base");
    let written = {
        let (wal, _, _) = recover(&base);
        let payloads: Vec<_> = (0..N).map(|i| payload(i, 12)).collect();
        append_each(&wal, &payloads)
    };
    let frame_len = testing::last_frame_len(&base).unwrap();
    // Version byte, length, CRC and payload bytes.
    for byte in [0, 1, 4, 5, 8, 9, frame_len - 1] {
        let dir = copy_data_dir(&base, work.path(), &format!("flip-{byte}"));
        testing::damage_record(&dir, N, byte).unwrap();
        let (_wal, report, collect) = recover(&dir);
        assert!(report.torn_tail_dropped, "byte {byte}");
        assert_eq!(collect.records, written[..N as usize - 1]);
    }
}

#[test]
fn damage_before_the_end_refuses_to_start_naming_the_lsn() {
    const N: u64 = 6;
    let work = tempfile::tempdir().unwrap();
    let base = work.path().join("base");
    {
        let (wal, _, _) = recover(&base);
        let payloads: Vec<_> = (0..N).map(|i| payload(i, 20)).collect();
        append_each(&wal, &payloads);
    }
    for byte in [0, 3, 7, 12, 28] {
        let dir = copy_data_dir(&base, work.path(), &format!("mid-{byte}"));
        testing::damage_record(&dir, 3, byte).unwrap();
        let err = try_recover(&dir).unwrap_err();
        assert!(err.is_corruption(), "byte {byte}: {err:?}");
        assert!(matches!(err, Error::Corrupt(Corruption::Record { lsn: 3, .. })), "{err:?}");
        let message = err.to_string();
        assert!(message.starts_with("log record 3 is damaged ("), "{message}");
        assert!(message.contains("refusing to start"), "{message}");
        // verify reports the same and changes nothing.
        let before = snapshot_files(&dir);
        let verr = verify(&dir).unwrap_err();
        assert!(verr.is_corruption());
        assert_eq!(snapshot_files(&dir), before);
    }

    // A missing record is a gap, also named.
    let dir = copy_data_dir(&base, work.path(), "gap");
    testing::remove_record(&dir, 4).unwrap();
    let err = try_recover(&dir).unwrap_err();
    assert!(err.is_corruption());
    assert!(
        matches!(
            err,
            Error::Corrupt(Corruption::Gap { first_missing: 4, last_missing: 4, next_present: 5 })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("log records 4 to 4 are missing"), "{err}");

    // Losing the very first records (no checkpoint covers them) is a gap too.
    let dir = copy_data_dir(&base, work.path(), "head");
    testing::remove_record(&dir, 1).unwrap();
    let err = try_recover(&dir).unwrap_err();
    assert!(matches!(err, Error::Corrupt(Corruption::Gap { first_missing: 1, .. })), "{err:?}");
}

#[test]
fn crash_between_checkpoint_and_truncation() {
    let dir = tempfile::tempdir().unwrap();
    let written = {
        let (wal, _, _) = recover(dir.path());
        let payloads: Vec<_> = (0..10).map(|i| payload(i, 30)).collect();
        append_all(&wal, &payloads)
    };
    // Step one of a checkpoint only: the crash hit before truncation.
    testing::write_checkpoint_only(dir.path(), 6, b"state at 6").unwrap();
    assert_eq!(testing::record_lsns(dir.path()).unwrap(), (1..=10).collect::<Vec<_>>());

    // verify sees the stale records but leaves them.
    let (report, collect) = verify(dir.path()).unwrap();
    assert_eq!(report.stale_records_truncated, 6);
    assert_eq!(collect.records, written[6..]);
    assert_eq!(testing::record_lsns(dir.path()).unwrap(), (1..=10).collect::<Vec<_>>());

    let (wal, report, collect) = recover(dir.path());
    assert_eq!(collect.checkpoint, Some((6, b"state at 6".to_vec())));
    assert_eq!(collect.records, written[6..]);
    assert_eq!(report.checkpoint_lsn, Some(6));
    assert_eq!(report.stale_records_truncated, 6);
    assert_eq!(report.records_replayed, 4);
    assert_eq!(report.last_lsn, 10);
    assert_eq!(wal.stats().records_since_checkpoint, 4);
    drop(wal);

    assert_eq!(testing::record_lsns(dir.path()).unwrap(), (7..=10).collect::<Vec<_>>());
    let (_wal, report, collect) = recover(dir.path());
    assert_eq!(report.stale_records_truncated, 0);
    assert_eq!(collect.records, written[6..]);
}

#[test]
fn checkpoint_truncates_and_rejects_lsns_beyond_durable() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = recover(dir.path());
    let written = append_all(&wal, &(0..10).map(|i| payload(i, 10)).collect::<Vec<_>>());

    let ahead = wal.checkpoint(wal.last_lsn() + 1, b"too new").unwrap_err();
    assert!(matches!(ahead, Error::CheckpointAhead { lsn: 11, durable: 10 }), "{ahead:?}");
    assert!(ahead.is_retryable());

    wal.checkpoint(6, b"six").unwrap();
    let stats = wal.stats();
    assert_eq!(stats.checkpoint_lsn, 6);
    assert_eq!(stats.records_since_checkpoint, 4);
    assert_eq!(stats.bytes_since_checkpoint, 40);

    let behind = wal.checkpoint(5, b"older").unwrap_err();
    assert!(matches!(behind, Error::CheckpointBehind { lsn: 5, current: 6 }), "{behind:?}");

    // The log keeps going after a checkpoint.
    let eleven = wal.append(b"eleven".to_vec()).unwrap().wait().unwrap();
    assert_eq!(eleven, 11);
    wal.checkpoint(8, b"eight").unwrap();
    wal.checkpoint(8, b"eight again").unwrap(); // same LSN: allowed, replaces the file
    assert_eq!(wal.stats().records_since_checkpoint, 3);
    assert_eq!(wal.stats().bytes_since_checkpoint, 26);
    drop(wal);

    assert_eq!(testing::record_lsns(dir.path()).unwrap(), vec![9, 10, 11]);
    assert!(!dir.path().join("checkpoint.tmp").exists());
    // The checkpoints replaced were given back in full.
    assert!(!dir.path().join("checkpoint.old").exists());
    let (wal, report, collect) = recover(dir.path());
    assert_eq!(collect.checkpoint, Some((8, b"eight again".to_vec())));
    assert_eq!(collect.records[..2], written[8..]);
    assert_eq!(collect.records[2], (11, b"eleven".to_vec()));
    assert_eq!(report.stale_records_truncated, 0);
    assert_eq!(report.last_lsn, 11);

    // Checkpoint of everything, then restart with an empty log: the next LSN continues.
    wal.checkpoint(11, b"all").unwrap();
    assert_eq!(wal.stats().records_since_checkpoint, 0);
    drop(wal);
    let (wal, report, collect) = recover(dir.path());
    assert_eq!(report.last_lsn, 11);
    assert!(collect.records.is_empty());
    assert_eq!(wal.append(Vec::new()).unwrap().wait().unwrap(), 12);

    // Exactly the documented entries in the data dir.
    let mut entries: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    assert_eq!(entries, vec!["checkpoint", "checkpoint.swept", "log"]);
}

#[test]
fn wait_durable_resolves_and_fails_after_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = recover(dir.path());
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();

    runtime.block_on(wal.wait_durable(0)).unwrap(); // nothing to wait for
    let commit = wal.append(b"one".to_vec()).unwrap();
    let waiter = wal.wait_durable(commit.lsn());
    // The future is 'static: it can outlive the borrow of `wal` and move to a task.
    let task = runtime.spawn(waiter);
    runtime.block_on(task).unwrap().unwrap();
    assert!(wal.durable_lsn() >= 1);
    assert_eq!(runtime.block_on(commit).unwrap(), 1);

    // A waiter for an LSN that never comes ends with an error once the log shuts down.
    let never = wal.wait_durable(100);
    wal.shutdown().unwrap();
    assert!(matches!(runtime.block_on(never), Err(Error::ShutDown)));
    assert!(matches!(block_on(wal.wait_durable(100)), Err(Error::ShutDown)));
    block_on(wal.wait_durable(1)).unwrap();
}

#[test]
fn verify_reports_torn_tail_without_modifying_anything() {
    let dir = tempfile::tempdir().unwrap();
    let written = {
        let (wal, _, _) = recover(dir.path());
        append_each(&wal, &(0..5).map(|i| payload(i, 40)).collect::<Vec<_>>())
    };
    testing::tear_last_record(dir.path(), 20).unwrap();
    let before = snapshot_files(dir.path());

    let (first, collect) = verify(dir.path()).unwrap();
    assert!(first.torn_tail_dropped);
    assert_eq!(first.torn_tail_lsn, Some(5));
    assert_eq!(first.last_lsn, 4);
    assert_eq!(collect.records, written[..4]);
    assert_eq!(snapshot_files(dir.path()), before, "verify must not write to the data dir");

    let (second, _) = verify(dir.path()).unwrap();
    assert!(same_report(&first, &second), "{first:?} vs {second:?}");
    assert_eq!(snapshot_files(dir.path()), before);

    // recover repairs it; verify then finds nothing.
    drop(recover(dir.path()));
    let (after, _) = verify(dir.path()).unwrap();
    assert!(!after.torn_tail_dropped);
    assert_eq!(after.last_lsn, 4);

    // verify never creates a data dir.
    let missing = dir.path().join("nope");
    assert!(matches!(verify(&missing), Err(Error::NoDataDir { .. })));
    assert!(!missing.exists());
}

#[test]
fn data_dir_in_use_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = recover(dir.path());
    wal.append(b"x".to_vec()).unwrap().wait().unwrap();

    let err = try_recover(dir.path()).unwrap_err();
    assert!(matches!(err, Error::InUse { .. }), "{err:?}");
    assert!(err.to_string().contains("is in use by another process"), "{err}");
    assert!(err.is_retryable());
    assert!(matches!(verify(dir.path()), Err(Error::InUse { .. })));
    assert!(matches!(testing::last_frame_len(dir.path()), Err(Error::InUse { .. })));

    // Dropping one of several handles keeps the dir; an explicit shutdown releases it even
    // while other handles exist (they then refuse appends).
    let clone = wal.clone();
    drop(wal);
    assert!(matches!(try_recover(dir.path()), Err(Error::InUse { .. })));
    clone.shutdown().unwrap();
    assert!(matches!(clone.append(b"late".to_vec()), Err(Error::ShutDown)));
    let (_wal, report, _) = recover(dir.path());
    assert_eq!(report.last_lsn, 1);
    drop(clone);
}

#[test]
fn write_failure_fails_the_log_and_nothing_unflushed_is_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = recover(dir.path());
    assert_eq!(wal.append(b"ok".to_vec()).unwrap().wait().unwrap(), 1);

    wal.fail_next_write();
    let doomed = wal.append(b"lost".to_vec()).unwrap();
    let waiter = wal.wait_durable(doomed.lsn());
    let err = doomed.wait().unwrap_err();
    assert!(matches!(err, Error::LogFailed { .. }), "{err:?}");
    assert!(!err.is_retryable());
    assert!(matches!(block_on(waiter), Err(Error::LogFailed { .. })));
    assert_eq!(wal.durable_lsn(), 1, "the failed group must not count as durable");

    // Everything after is refused up front, and `build` is not even called.
    let refused = wal.append_with(|_| panic!("build must not run on a failed log")).unwrap_err();
    assert!(matches!(refused, Error::LogFailed { .. }), "{refused:?}");
    assert!(matches!(wal.checkpoint(1, b"s"), Err(Error::LogFailed { .. })));
    assert!(matches!(wal.shutdown(), Err(Error::LogFailed { .. })));
    wal.shutdown().unwrap(); // second call: nothing left to report
    drop(wal);

    let (_wal, report, collect) = recover(dir.path());
    assert_eq!(collect.records, vec![(1, b"ok".to_vec())]);
    assert_eq!(report.last_lsn, 1);
}

#[test]
fn shutdown_is_idempotent_and_refuses_later_appends() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = recover(dir.path());
    // Queue a lot without waiting: shutdown must drain and flush all of it.
    let commits: Vec<_> = (0..300).map(|i| wal.append(payload(i, 64)).unwrap()).collect();
    wal.shutdown().unwrap();
    wal.shutdown().unwrap();
    for (i, commit) in commits.into_iter().enumerate() {
        assert_eq!(commit.wait().unwrap(), i as u64 + 1);
    }
    assert_eq!(wal.durable_lsn(), 300);
    assert!(matches!(wal.append(b"late".to_vec()), Err(Error::ShutDown)));
    assert!(matches!(wal.append_batch(vec![b"late".to_vec()]), Err(Error::ShutDown)));
    assert_eq!(wal.last_lsn(), 300, "refused appends must not consume LSNs");
    drop(wal);
    let (_wal, report, _) = recover(dir.path());
    assert_eq!(report.last_lsn, 300);
}

#[test]
fn batches_get_consecutive_lsns_and_commit_resolves_with_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config { max_batch_records: 2, ..config(dir.path()) };
    let (wal, _) = Wal::recover(config, &mut Collect::default()).unwrap();
    assert!(matches!(wal.append_batch(Vec::new()), Err(Error::InvalidArgument { .. })));
    assert_eq!(wal.append(b"a".to_vec()).unwrap().lsn(), 1);
    // Larger than max_batch_records: still written whole.
    let batch = wal.append_batch((0..5).map(|i| vec![i]).collect()).unwrap();
    assert_eq!((batch.first_lsn(), batch.lsn()), (2, 6));
    let single = wal.append(b"b".to_vec()).unwrap();
    assert_eq!(batch.wait().unwrap(), 6);
    assert_eq!(single.wait().unwrap(), 7);
    let stats = wal.stats();
    assert!(stats.batch_size_max >= 5, "{stats:?}");
    assert_eq!(stats.records_flushed, 7);
    // Cumulative histogram: non-decreasing, never above the number of flushes.
    assert_eq!(stats.flush_latency_buckets.len(), crate::FLUSH_LATENCY_BUCKETS_SECONDS.len());
    assert!(stats.flush_latency_buckets.windows(2).all(|w| w[0] <= w[1]));
    assert!(stats.flush_latency_buckets.iter().all(|&c| c <= stats.flushes));
    assert!(stats.log_bytes_on_disk > 0);
    drop(wal);
    let (_wal, _, collect) = recover(dir.path());
    let lsns: Vec<Lsn> = collect.records.iter().map(|(l, _)| *l).collect();
    assert_eq!(lsns, (1..=7).collect::<Vec<_>>());
    assert_eq!(collect.records[3], (4, vec![2]));
}

#[test]
fn replayer_errors_and_damaged_checkpoints_stop_recovery() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (wal, _, _) = recover(dir.path());
        append_all(&wal, &(0..5).map(|i| payload(i, 8)).collect::<Vec<_>>());
    }
    let mut failing = Collect { fail_at: Some(3), ..Collect::default() };
    let err = Wal::recover(config(dir.path()), &mut failing).unwrap_err();
    assert!(matches!(err, Error::ReplayRecord { lsn: 3, .. }), "{err:?}");
    assert!(err.to_string().contains("log record 3"), "{err}");
    assert!(!err.is_corruption());
    // A failed recovery releases the dir and changes nothing.
    let (wal, report, _) = recover(dir.path());
    assert_eq!(report.last_lsn, 5);
    wal.checkpoint(2, b"two").unwrap();
    drop(wal);

    // A leftover temp file from a crashed checkpoint is removed; the checkpoint is used. So
    // is a replaced checkpoint a crash left before its space was given back.
    std::fs::write(dir.path().join("checkpoint.tmp"), b"garbage").unwrap();
    std::fs::write(dir.path().join("checkpoint.old"), b"an older checkpoint").unwrap();
    let (wal, report, collect) = recover(dir.path());
    assert!(!dir.path().join("checkpoint.tmp").exists());
    assert!(!dir.path().join("checkpoint.old").exists());
    assert_eq!(report.checkpoint_lsn, Some(2));
    assert_eq!(collect.records.len(), 3);
    drop(wal);

    // A damaged checkpoint is never silently ignored.
    let path = dir.path().join("checkpoint");
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let err = try_recover(dir.path()).unwrap_err();
    assert!(err.is_corruption(), "{err:?}");
    assert!(err.to_string().contains("checkpoint"), "{err}");
    assert!(verify(dir.path()).unwrap_err().is_corruption());
}

/// The replay worker takes records in batches: a tail of several batches arrives whole and in
/// order, a failure deep in it names its record, and a torn last record is still dropped.
#[test]
fn a_long_tail_replays_in_order_and_a_failure_in_it_names_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let written = {
        let (wal, _, _) = recover(dir.path());
        // Mixed sizes: the batch bound by count and by bytes (chunked records) both apply.
        let payloads: Vec<_> = (0..2000u64)
            .map(|i| payload(i, if i % 400 == 7 { 3 << 20 } else { 16 + (i as usize % 64) }))
            .collect();
        append_all(&wal, &payloads)
    };
    let (wal, report, collect) = recover(dir.path());
    assert_eq!(report.records_replayed, 2000);
    assert_eq!(collect.records, written);
    drop(wal);

    for fail_at in [1, 513, 1999, 2000] {
        let mut failing = Collect { fail_at: Some(fail_at), ..Collect::default() };
        let err = Wal::recover(config(dir.path()), &mut failing).unwrap_err();
        assert!(
            matches!(err, Error::ReplayRecord { lsn, .. } if lsn == fail_at),
            "failing at {fail_at}: {err:?}"
        );
        assert_eq!(failing.records, written[..fail_at as usize - 1], "before {fail_at}");
    }

    // Damage the last stored value's last byte: a torn tail. The small records of a group
    // share packs, so when it is one it takes every record in it along.
    let store = crate::log::LogStore::open(dir.path(), 1 << 20).unwrap();
    let (k, v) = store.db.last().unwrap().unwrap();
    let first = crate::layout::keys::lsn_of(&k).unwrap();
    let mut damaged = v.to_vec();
    *damaged.last_mut().unwrap() ^= 0xff;
    store.db.insert(k, damaged).unwrap();
    store.db.flush().unwrap();
    drop(store);
    let (_wal, report, collect) = recover(dir.path());
    assert!(report.torn_tail_dropped);
    assert_eq!((report.torn_tail_lsn, report.last_lsn), (Some(first), first - 1));
    assert_eq!(collect.records, written[..first as usize - 1]);
}

/// After a checkpoint with its sweep marker, the tail is walked while the checkpoint is
/// delivered: it still arrives after the checkpoint, whole and in order; a failure in it names
/// its record; and a failed checkpoint stops a walk that has filled its queue.
#[test]
fn a_tail_walked_beside_the_checkpoint_replays_after_it_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let written = {
        let (wal, _, _) = recover(dir.path());
        append_all(&wal, &(0..10u64).map(|i| payload(i, 20)).collect::<Vec<_>>());
        wal.checkpoint(10, b"state at 10").unwrap();
        assert!(dir.path().join("checkpoint.swept").exists());
        let payloads: Vec<_> = (10..2010u64)
            .map(|i| payload(i, if i % 500 == 7 { 3 << 20 } else { 16 + (i as usize % 64) }))
            .collect();
        append_all(&wal, &payloads)
    };
    let (wal, report, collect) = recover(dir.path());
    assert_eq!(collect.checkpoint, Some((10, b"state at 10".to_vec())));
    assert_eq!((report.records_replayed, report.last_lsn), (2000, 2010));
    assert_eq!(collect.records, written);
    drop(wal);

    for fail_at in [11, 11 + 64 * 6, 2009, 2010] {
        let mut failing = Collect { fail_at: Some(fail_at), ..Collect::default() };
        let err = Wal::recover(config(dir.path()), &mut failing).unwrap_err();
        assert!(
            matches!(err, Error::ReplayRecord { lsn, .. } if lsn == fail_at),
            "failing at {fail_at}: {err:?}"
        );
        assert_eq!(failing.records, written[..(fail_at - 11) as usize], "before {fail_at}");
    }

    // 2000 records are more batches than the queue holds: the walker waits on a full queue
    // when the checkpoint fails, and must stop rather than hold the start.
    let mut failing = Collect { fail_checkpoint: true, ..Collect::default() };
    let err = Wal::recover(config(dir.path()), &mut failing).unwrap_err();
    assert!(matches!(err, Error::ReplayCheckpoint { lsn: 10, .. }), "{err:?}");
    assert!(failing.records.is_empty());
    // Nothing was changed: the next start replays the same.
    let (_wal, report, collect) = recover(dir.path());
    assert_eq!(report.records_replayed, 2000);
    assert_eq!(collect.records, written);
}

#[test]
fn handles_and_futures_are_send_sync_static() {
    fn send_sync_static<T: Send + Sync + 'static>(_: &T) {}
    fn send_static<T: Send + 'static>(_: &T) {}
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = recover(dir.path());
    send_sync_static(&wal);
    let commit = wal.append(Vec::new()).unwrap();
    send_static(&commit);
    let waiter = wal.wait_durable(1);
    send_static(&waiter);
    assert_eq!(block_on(commit).unwrap(), 1);
    block_on(waiter).unwrap();
    let seen: HashSet<Lsn> = [wal.last_lsn(), wal.durable_lsn()].into_iter().collect();
    assert_eq!(seen, HashSet::from([1]));
}

#[test]
fn one_flush_serves_every_record_queued_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = recover(dir.path());
    let flushes_before = wal.stats().flushes;
    let held = wal.hold_commits();
    // The commit thread takes the first command and waits; the other 99 queue behind it.
    let commits: Vec<_> =
        (0..100u32).map(|i| wal.append(i.to_be_bytes().to_vec()).unwrap()).collect();
    assert_eq!(wal.durable_lsn(), 0, "nothing is durable while the thread is held");
    drop(held);
    for (i, c) in commits.into_iter().enumerate() {
        assert_eq!(c.wait().unwrap(), i as u64 + 1);
    }
    let stats = wal.stats();
    assert_eq!(stats.flushes - flushes_before, 1, "one group commit for all 100 records");
    assert_eq!(stats.batch_size_max, 100);
}

/// What a snapshot write cut short by a full disk leaves: sled's `.generating` file, empty or
/// truncated, named after a newer LSN than the last complete snapshot. Unhandled, sled takes it
/// for the newest snapshot and refuses the whole store; verify and recover must both see past it.
#[test]
fn a_snapshot_file_left_unfinished_by_sled_is_not_damage() {
    let dir = tempfile::tempdir().unwrap();
    let written = {
        let (wal, _, _) = recover(dir.path());
        append_all(&wal, &(0..5).map(|i| payload(i, 300)).collect::<Vec<_>>())
    };
    let log_dir = dir.path().join(crate::log::DIR_NAME);
    let unfinished = log_dir.join("snap.7FFFFFFFFFFFFFFF.generating");
    std::fs::write(&unfinished, [0u8; 5]).unwrap();

    let (report, collect) = verify(dir.path()).unwrap();
    assert_eq!(report.last_lsn, 5);
    assert_eq!(collect.records, written);
    assert!(unfinished.exists(), "verify changes nothing in the data dir");

    let (_wal, report, collect) = recover(dir.path());
    assert_eq!(report.last_lsn, 5);
    assert_eq!(collect.records, written);
    assert!(!unfinished.exists(), "recover removes the unfinished snapshot");
}

#[test]
fn below_the_free_space_floor_appends_are_refused_and_resume_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = recover(dir.path());
    block_on(wal.append(payload(1, 10)).unwrap()).unwrap();
    assert!(wal.stats().writable);

    wal.set_min_free_bytes(u64::MAX);
    let err = wal.append(payload(2, 10)).unwrap_err();
    assert!(matches!(err, Error::NoSpace { .. }), "{err:?}");
    assert!(err.to_string().contains("free space"), "{err}");
    assert!(matches!(wal.append_with(|_| payload(2, 10)), Err(Error::NoSpace { .. })));
    assert!(matches!(wal.append_batch(vec![payload(2, 10)]), Err(Error::NoSpace { .. })));
    let stats = wal.stats();
    assert!(!stats.writable);
    assert_eq!(stats.last_lsn, 1, "a refused append takes no LSN");
    assert!(wal.unwritable_reason().unwrap().contains("below the floor"));
    // The reserve stays open: a checkpoint's marker or a key revocation still goes through.
    assert_eq!(
        block_on(
            wal.append_with_options(AppendOptions { reserve: true, epoch: None }, |_| payload(
                3, 10
            ))
            .unwrap()
        )
        .unwrap(),
        2
    );

    wal.set_min_free_bytes(1);
    assert_eq!(block_on(wal.append(payload(4, 10)).unwrap()).unwrap(), 3);
    assert!(wal.stats().writable);
    assert_eq!(wal.unwritable_reason(), None);
    drop(wal);
    let (_, report, collect) = recover(dir.path());
    assert_eq!(report.last_lsn, 3);
    assert_eq!(collect.records.len(), 3);
}

/// Files under `dir/log/blobs`, where sled puts values (and tree nodes) too large for its log.
fn blob_files(dir: &Path) -> usize {
    std::fs::read_dir(dir.join(crate::log::DIR_NAME).join("blobs")).map_or(0, |d| d.count())
}

#[test]
fn large_records_are_stored_in_chunks_that_never_reach_a_blob_file() {
    let dir = tempfile::tempdir().unwrap();
    let payloads: Vec<Vec<u8>> =
        (0..40).map(|i| payload(i, [360_000, 1 << 20, 4_001, 3_999][i as usize % 4])).collect();
    let written = {
        let (wal, _, _) = recover(dir.path());
        append_all(&wal, &payloads)
    };
    assert_eq!(blob_files(dir.path()), 0, "no record went down sled's blob path");
    let (wal, report, collect) = recover(dir.path());
    assert_eq!(collect.records, written);
    assert!(!report.torn_tail_dropped);
    // A checkpoint truncates every chunk of the records it covers.
    wal.checkpoint(20, b"state").unwrap();
    drop(wal);
    let (_wal, report, collect) = recover(dir.path());
    assert_eq!((report.checkpoint_lsn, report.stale_records_truncated), (Some(20), 0));
    assert_eq!(collect.records, written[20..]);
    assert_eq!(blob_files(dir.path()), 0);
}

#[test]
fn a_damaged_chunk_is_a_torn_tail_on_the_last_record_and_damage_anywhere_else() {
    let dir = tempfile::tempdir().unwrap();
    let written = {
        let (wal, _, _) = recover(dir.path());
        append_all(&wal, &[payload(1, 20_000), payload(2, 20_000), payload(3, 20_000)])
    };
    let edit = |f: &dyn Fn(&sled::Db)| {
        let store = crate::log::LogStore::open(dir.path(), 1 << 20).unwrap();
        f(&store.db);
        store.sync().unwrap();
    };
    // Chunk 2 of 5 of the last record, cut short: a write a crash interrupted.
    edit(&|db| {
        let k = crate::layout::keys::chunk_key(3, 2, 5);
        let v = db.get(k).unwrap().unwrap();
        db.insert(k, &v[..100]).unwrap();
    });
    let (report, _) = verify(dir.path()).unwrap();
    assert_eq!((report.torn_tail_lsn, report.last_lsn), (Some(3), 2));
    let (wal, report, collect) = recover(dir.path());
    assert_eq!(report.torn_tail_lsn, Some(3));
    assert_eq!(collect.records, written[..2]);
    drop(wal);
    assert!(
        crate::log::LogStore::open(dir.path(), 1 << 20)
            .unwrap()
            .db
            .iter()
            .all(|kv| { crate::layout::keys::lsn_of(&kv.unwrap().0).unwrap() <= 2 }),
        "every chunk of the torn record is gone"
    );
    // A chunk missing from a record before the end is damage, never skipped.
    edit(&|db| {
        db.remove(crate::layout::keys::chunk_key(1, 4, 5)).unwrap();
    });
    let Err(err) = try_recover(dir.path()) else { panic!("a missing chunk was accepted") };
    assert!(matches!(err, Error::Corrupt(Corruption::Record { lsn: 1, .. })), "{err:?}");
}

#[test]
fn a_failed_log_heals_from_disk_drops_what_was_never_acknowledged_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = recover(dir.path());
    let acked = append_all(&wal, &[payload(1, 100), payload(2, 9_000)]);
    assert_eq!(wal.heal(|_| panic!("nothing to heal")).unwrap(), None);
    let epoch = wal.epoch();

    wal.fail_next_write();
    let lost = wal.append(payload(3, 100)).unwrap();
    assert!(matches!(block_on(lost), Err(Error::LogFailed { .. })));
    assert!(wal.is_failed() && !wal.stats().writable);
    assert!(matches!(wal.append(payload(4, 100)), Err(Error::LogFailed { .. })));
    assert!(wal.unwritable_reason().unwrap().contains("injected write failure"));
    // A failed group may have reached the disk in part: heal must not trust it.
    wal.core()
        .with_store(|store| {
            store
                .db
                .insert(crate::layout::keys::key(3), crate::frame::encode(&payload(3, 100))?)?;
            store.sync()
        })
        .unwrap();

    let mut reopened_at = None;
    assert_eq!(wal.heal(|lsn| reopened_at = Some(lsn)).unwrap(), Some(2));
    assert_eq!(reopened_at, Some(2));
    assert!(!wal.is_failed() && wal.stats().writable);
    assert_eq!(wal.epoch(), epoch + 1);
    // A writer whose state predates the heal is refused until it has re-read it.
    let stale = AppendOptions { epoch: Some(epoch), ..AppendOptions::default() };
    assert!(matches!(
        wal.append_with_options(stale, |_| payload(5, 1)),
        Err(Error::Reopened { .. })
    ));
    let fresh = AppendOptions { epoch: Some(wal.epoch()), ..AppendOptions::default() };
    let next = wal.append_with_options(fresh, |_| payload(6, 100)).unwrap();
    assert_eq!(block_on(next).unwrap(), 3, "LSNs continue after the durable one");
    assert_eq!(wal.stats().records_since_checkpoint, 3);
    drop(wal);

    let (_wal, report, collect) = recover(dir.path());
    assert_eq!(report.last_lsn, 3);
    let mut expected = acked;
    expected.push((3, payload(6, 100)));
    assert_eq!(collect.records, expected, "the record the failed group left is gone");
}

#[test]
fn a_checkpoint_rewrites_a_bloated_log_store_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join(crate::log::DIR_NAME);
    let (wal, _, _) = recover(dir.path());
    let written = append_all(&wal, &(0..2_000).map(|i| payload(i, 20_000)).collect::<Vec<_>>());
    let before = fsutil::tree_size(&log_dir).unwrap();
    assert!(before > 40 << 20, "the burst grew the store to {before} bytes");
    wal.checkpoint(1_990, b"state").unwrap();
    let after = fsutil::tree_size(&log_dir).unwrap();
    assert!(after < before / 4, "rewritten: {before} -> {after} bytes");
    // Appends go on after the rewrite, and recovery finds everything where it should be.
    let next = append_all(&wal, &[payload(9, 100)]);
    assert_eq!(next[0].0, 2_001);
    drop(wal);
    let (_wal, report, collect) = recover(dir.path());
    assert_eq!(report.checkpoint_lsn, Some(1_990));
    let mut expected = written[1_990..].to_vec();
    expected.extend(next);
    assert_eq!(collect.records, expected);
}

/// The rewrite holds appends for the copy of every live record: with many retained, a
/// bloated store is left as it is.
#[test]
fn a_bloated_store_whose_retained_records_are_many_is_not_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join(crate::log::DIR_NAME);
    let (wal, _, _) = recover(dir.path());
    append_all(&wal, &(0..2_000).map(|i| payload(i, 20_000)).collect::<Vec<_>>());
    let before = fsutil::tree_size(&log_dir).unwrap();
    assert!(before > 40 << 20, "the burst grew the store to {before} bytes");
    // 60 records of 20 KB retained: 1.2 MB live, over the tests' cap, and 4 x 1.2 MB + 32 MB
    // is below what the store holds, so only the cap keeps it from a rewrite.
    wal.checkpoint_retaining(1_990, b"state", &|lsn| lsn <= 60).unwrap();
    let live = wal.stats().retained_bytes;
    assert!((60 * 20_000..61 * 20_000).contains(&live), "{live} bytes retained");
    let after = fsutil::tree_size(&log_dir).unwrap();
    assert!(after >= before * 3 / 4, "not rewritten: {before} -> {after} bytes");
    drop(wal);
    let (_wal, report, _) = recover(dir.path());
    assert_eq!((report.checkpoint_lsn, report.records_retained), (Some(1_990), 60));
}

#[test]
fn a_rewrite_cut_short_by_a_crash_is_undone_or_completed_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let written = {
        let (wal, _, _) = recover(dir.path());
        append_all(&wal, &[payload(1, 100), payload(2, 100)])
    };
    let (log, next, old) =
        (dir.path().join("log"), dir.path().join("log.next"), dir.path().join("log.old"));
    // Crashed while copying: the half-built store is dropped, the old one is used.
    std::fs::create_dir(&next).unwrap();
    std::fs::write(next.join("db"), b"half a store").unwrap();
    drop(recover(dir.path()));
    assert!(!next.exists() && log.exists());
    // Crashed between the two renames: the complete copy becomes the log.
    std::fs::rename(&log, &next).unwrap();
    std::fs::create_dir(&old).unwrap();
    let (_wal, report, collect) = recover(dir.path());
    assert_eq!(report.last_lsn, 2);
    assert_eq!(collect.records, written);
    assert!(!next.exists() && !old.exists() && log.exists());
}

/// Retains the even LSNs at or below its checkpoint.
#[derive(Debug, Default)]
struct RetainEven(Collect);

impl Replayer for RetainEven {
    fn checkpoint(&mut self, lsn: Lsn, snapshot: &mut dyn std::io::Read) -> ReplayResult {
        self.0.checkpoint(lsn, snapshot)
    }

    fn record(&mut self, lsn: Lsn, payload: &[u8]) -> ReplayResult {
        self.0.record(lsn, payload)
    }

    fn retains(&self, lsn: Lsn) -> bool {
        lsn.is_multiple_of(2)
    }
}

#[test]
fn a_checkpoint_keeps_retained_records_readable_across_restarts_and_rewrites() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = recover(dir.path());
    // Large ones are stored in chunks: a read must assemble them.
    let payloads: Vec<_> =
        (0..12).map(|i| payload(i, if i % 3 == 0 { 9_000 } else { 40 })).collect();
    let written = append_each(&wal, &payloads);
    wal.checkpoint_retaining(8, b"state at 8", &|lsn| lsn % 2 == 0).unwrap();
    for (lsn, bytes) in &written {
        let kept = *lsn > 8 || lsn % 2 == 0;
        assert_eq!(wal.read(*lsn).unwrap(), kept.then(|| bytes.clone()), "lsn {lsn}");
    }
    assert_eq!(wal.read(13).unwrap(), None, "not written yet");
    let retained = wal.stats().retained_bytes;
    assert!(retained > 9_000, "the chunked record 6 counts: {retained}");
    drop(wal);
    assert_eq!(lsns(dir.path()), vec![2, 4, 6, 8, 9, 10, 11, 12]);

    // A replayer that retains them keeps them; they are not replayed.
    let mut replayer = RetainEven::default();
    let (wal, report) = Wal::recover(config(dir.path()), &mut replayer).unwrap();
    assert_eq!(report.records_retained, 4);
    assert_eq!(report.stale_records_truncated, 0);
    assert_eq!(replayer.0.records, written[8..]);
    assert_eq!(wal.stats().retained_bytes, retained);
    assert_eq!(wal.read(6).unwrap().as_deref(), Some(&written[5].1[..]));
    // A later checkpoint drops what is no longer retained.
    wal.checkpoint_retaining(10, b"state at 10", &|lsn| lsn >= 6 && lsn % 2 == 0).unwrap();
    drop(wal);
    assert_eq!(lsns(dir.path()), vec![6, 8, 10, 11, 12]);

    // The checkpoint's truncation completed, so its sweep marker lets a start skip the records
    // below it: they are counted from the marker, not read, and the replayer is not asked.
    let (wal, report, collect) = recover(dir.path());
    assert_eq!((report.records_retained, report.stale_records_truncated), (3, 0));
    assert_eq!(collect.records, written[10..]);
    let kept = wal.stats().retained_bytes;
    assert!(kept > 9_000, "the chunked record 6 counts: {kept}");
    drop(wal);
    assert_eq!(lsns(dir.path()), vec![6, 8, 10, 11, 12]);

    // Without the marker the start walks them: one that retains nothing treats them as stale
    // and removes them.
    std::fs::remove_file(dir.path().join(crate::checkpoint::SWEPT_FILE_NAME)).unwrap();
    let (wal, report, collect) = recover(dir.path());
    assert_eq!(report.stale_records_truncated, 3);
    assert_eq!(collect.records, written[10..]);
    drop(wal);
    assert_eq!(lsns(dir.path()), vec![11, 12]);
}

/// A checkpoint after the first one asks only about the records the last one kept and walks
/// only the ones after it; what it keeps, removes and counts matches a start that walks them
/// all, chunked records included.
#[test]
fn successive_checkpoints_drop_what_retention_let_go_and_count_what_stays() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = recover(dir.path());
    let payloads: Vec<_> =
        (0..40).map(|i| payload(i, if i % 7 == 0 { 9_000 } else { 40 + i as usize })).collect();
    let written = append_each(&wal, &payloads);
    // Retention moves forward: at each checkpoint the even records from `floor` on are kept.
    let keeps = |floor: Lsn| move |lsn: Lsn| lsn >= floor && lsn.is_multiple_of(2);
    for (checkpoint, floor) in [(10, 1), (20, 6), (20, 8), (30, 15), (40, 29)] {
        let retain = keeps(floor);
        wal.checkpoint_retaining(checkpoint, b"state", &retain).unwrap();
        for (lsn, bytes) in &written {
            let kept = *lsn > checkpoint || retain(*lsn);
            assert_eq!(wal.read(*lsn).unwrap(), kept.then(|| bytes.clone()), "lsn {lsn}");
        }
        // The bytes it counts are the bytes a walk of the store finds.
        let stored: u64 = wal
            .core()
            .with_store(|store| {
                let below = store.db.range(..crate::layout::keys::key(checkpoint + 1));
                Ok(below.map(|item| item.unwrap().1.len() as u64).sum())
            })
            .unwrap();
        assert_eq!(wal.stats().retained_bytes, stored, "checkpoint {checkpoint}");
    }
    drop(wal);
    assert_eq!(lsns(dir.path()), vec![30, 32, 34, 36, 38, 40]);
}

/// The sweep marker lists the records a checkpoint kept, so the first checkpoint after a
/// start asks about those instead of walking the log below the last checkpoint.
#[test]
fn the_first_checkpoint_after_a_start_uses_the_markers_list() {
    let dir = tempfile::tempdir().unwrap();
    let written = {
        let (wal, _, _) = recover(dir.path());
        let payloads: Vec<_> =
            (0..12).map(|i| payload(i, if i % 5 == 0 { 9_000 } else { 40 })).collect();
        let written = append_each(&wal, &payloads);
        wal.checkpoint_retaining(8, b"state at 8", &|lsn| lsn % 2 == 0).unwrap();
        written
    };
    // A stray record below the checkpoint that no list names: only a walk would find it.
    let store = crate::log::LogStore::open(dir.path(), 1 << 20).unwrap();
    store.db.insert(crate::layout::keys::key(5), crate::frame::encode(b"stray").unwrap()).unwrap();
    store.db.flush().unwrap();
    drop(store);

    let mut replayer = RetainEven::default();
    let (wal, report) = Wal::recover(config(dir.path()), &mut replayer).unwrap();
    assert_eq!(report.records_retained, 4, "counted from the marker");
    wal.checkpoint_retaining(10, b"state at 10", &|lsn| lsn >= 6 && lsn % 2 == 0).unwrap();
    for (lsn, bytes) in &written {
        let kept = *lsn > 10 || (*lsn >= 6 && lsn % 2 == 0);
        if *lsn != 5 {
            assert_eq!(wal.read(*lsn).unwrap(), kept.then(|| bytes.clone()), "lsn {lsn}");
        }
    }
    assert_eq!(wal.read(5).unwrap().as_deref(), Some(&b"stray"[..]), "not walked");
    drop(wal);

    // Without a list (an older marker), the first checkpoint walks and finds it.
    let marker = dir.path().join(crate::checkpoint::SWEPT_FILE_NAME);
    let image = std::fs::read(&marker).unwrap();
    std::fs::write(&marker, &image[..36]).unwrap();
    let (wal, report) = Wal::recover(config(dir.path()), &mut RetainEven::default()).unwrap();
    assert_eq!(report.records_retained, 3);
    wal.checkpoint_retaining(11, b"state at 11", &|lsn| lsn >= 6 && lsn % 2 == 0).unwrap();
    assert_eq!(wal.read(5).unwrap(), None, "walked and removed");
    assert_eq!(wal.read(6).unwrap().as_deref(), Some(&written[5].1[..]));
    assert_eq!(wal.read(7).unwrap(), None);
}

#[test]
fn a_sweep_marker_is_trusted_only_for_its_own_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = recover(dir.path());
    let written = append_each(&wal, &(0..10).map(|i| payload(i, 30)).collect::<Vec<_>>());
    // A finished checkpoint at 4 retaining 2 and 4: its marker names 4.
    wal.checkpoint_retaining(4, b"state at 4", &|lsn| lsn % 2 == 0).unwrap();
    drop(wal);
    assert_eq!(lsns(dir.path()), vec![2, 4, 5, 6, 7, 8, 9, 10]);
    let mut even = RetainEven::default();
    let (wal, report) = Wal::recover(config(dir.path()), &mut even).unwrap();
    assert_eq!((report.records_retained, report.stale_records_truncated), (2, 0));
    assert_eq!(even.0.records, written[4..]);
    drop(wal);

    // A checkpoint at 7 cut short before its truncation: the marker of 4 must not stand for
    // it, so the start walks the log, asks the replayer, and removes the stale records.
    testing::write_checkpoint_only(dir.path(), 7, b"state at 7").unwrap();
    let mut even = RetainEven::default();
    let (wal, report) = Wal::recover(config(dir.path()), &mut even).unwrap();
    assert_eq!((report.records_retained, report.stale_records_truncated), (3, 2));
    assert_eq!(even.0.records, written[7..]);
    drop(wal);
    assert_eq!(lsns(dir.path()), vec![2, 4, 6, 8, 9, 10]);

    // That walk left a marker for 7: the next start trusts it.
    let (_wal, report, collect) = recover(dir.path());
    assert_eq!((report.records_retained, report.stale_records_truncated), (3, 0));
    assert_eq!(collect.records, written[7..]);
}

/// The LSNs stored in a closed log, once each (a chunked record has several keys).
fn lsns(dir: &Path) -> Vec<Lsn> {
    let mut lsns = testing::record_lsns(dir).unwrap();
    lsns.dedup();
    lsns
}

#[test]
fn a_compressed_record_counts_toward_the_checkpoint_as_it_decodes() {
    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<String> = (0..5000).map(|i| format!(r#"{{"id":{i},"cells":{{}}}}"#)).collect();
    let record = crate::codec::encode(&rows).unwrap();
    let decoded = crate::codec::decoded_len(&record) as u64;
    assert!(decoded > 4 * record.len() as u64, "the record is stored compressed");

    let (wal, _, _) = recover(dir.path());
    wal.append(record.clone()).unwrap().wait().unwrap();
    assert_eq!(wal.stats().bytes_since_checkpoint, decoded);
    wal.shutdown().unwrap();
    drop(wal);

    // Recovery replays the stored bytes and counts them the same way.
    let (wal, report, collect) = recover(dir.path());
    assert_eq!(collect.records, vec![(1, record.clone())]);
    assert_eq!(report.bytes_replayed, record.len() as u64);
    assert_eq!(wal.stats().bytes_since_checkpoint, decoded);
    assert_eq!(crate::codec::decode::<Vec<String>>(&collect.records[0].1).unwrap(), rows);
}

#[test]
fn stats_name_the_size_of_the_checkpoint_on_disk_before_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = recover(dir.path());
    assert_eq!(wal.stats().checkpoint_bytes, 0);
    assert_eq!(wal.stats().checkpoints, 0);
    wal.append(b"one".to_vec()).unwrap().wait().unwrap();
    wal.checkpoint(1, &[7u8; 1000]).unwrap();
    assert_eq!(wal.stats().checkpoint_bytes, 1000);
    assert_eq!(wal.stats().checkpoints, 1);
    wal.append(b"two".to_vec()).unwrap().wait().unwrap();
    wal.checkpoint(2, b"smaller").unwrap();
    assert_eq!(wal.stats().checkpoint_bytes, 7);
    // A refused checkpoint is not counted.
    assert!(wal.checkpoint(1, b"behind").is_err());
    let stats = wal.stats();
    assert_eq!(stats.checkpoints, 2);
    assert!(stats.checkpoint_seconds_total > 0.0);
    wal.shutdown().unwrap();
    drop(wal);

    let (wal, _, collect) = recover(dir.path());
    assert_eq!(collect.checkpoint, Some((2, b"smaller".to_vec())));
    assert_eq!(wal.stats().checkpoint_bytes, 7);
}

/// Small records of one group are stored as packs: fewer values than records, every record
/// read back by its LSN (a large one between them stored alone), and replayed in order.
#[test]
fn small_records_of_one_group_share_packs_and_read_back_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<Vec<u8>> = (0..300u64)
        .map(|i| {
            if i == 150 {
                return payload(i, 9_000);
            }
            format!(r#"{{"id":{},"cells":{{"1":"row {i} of a sheet","2":{}}}}}"#, 1000 + i, i * 3)
                .into_bytes()
        })
        .collect();
    let (wal, _, _) = recover(dir.path());
    let written = append_group(&wal, rows.clone());
    assert_reads(&wal, &written);
    assert_eq!(wal.read(301).unwrap(), None);
    let values = stored_values(&wal);
    let stored: usize = values.iter().map(|(_, v)| v).sum();
    let raw: usize = rows.iter().map(Vec::len).sum();
    assert!(values.len() < 20, "{} values for 300 records", values.len());
    assert!(stored * 2 < raw, "{stored} bytes stored for {raw}");
    drop(wal);
    assert_eq!(testing::record_lsns(dir.path()).unwrap(), (1..=300).collect::<Vec<_>>());
    let (wal, report, collect) = recover(dir.path());
    assert_eq!(report.records_replayed, 300);
    // Nothing decoded yet: reads inside a pack, at its start and alone, in no order.
    for lsn in [77, 2, 300, 151, 150, 1, 149, 76] {
        assert_eq!(wal.read(lsn).unwrap().as_deref(), Some(&rows[lsn as usize - 1][..]), "{lsn}");
    }
    assert_eq!(collect.records, written);
}

/// A pack that is the last stored value and damaged is a torn tail (all its records were one
/// group that never became durable); damaged before the end it stops the start, naming its
/// first record.
#[test]
fn a_damaged_pack_is_a_torn_tail_at_the_end_and_refused_before_it() {
    let work = tempfile::tempdir().unwrap();
    let base = work.path().join("base");
    let written: Vec<(Lsn, Vec<u8>)> = {
        let (wal, _, _) = recover(&base);
        let mut written = append_each(&wal, &[payload(1, 40)]);
        written.extend(ten_packed(&wal));
        written.extend(ten_packed(&wal));
        written
    };
    let torn = copy_data_dir(&base, work.path(), "torn");
    testing::damage_record(&torn, 15, 20).unwrap();
    let (wal, report, collect) = recover(&torn);
    assert_eq!((report.torn_tail_lsn, report.last_lsn), (Some(12), 11));
    assert_eq!(collect.records, written[..11]);
    // LSNs go on from the last good record.
    assert_eq!(wal.append(payload(99, 8)).unwrap().wait().unwrap(), 12);
    drop(wal);

    let middle = copy_data_dir(&base, work.path(), "middle");
    testing::damage_record(&middle, 5, 20).unwrap();
    let err = try_recover(&middle).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Corrupt(Corruption::Record { lsn: 2, defect: FrameDefect::CrcMismatch { .. } })
        ),
        "{err:?}"
    );
    assert!(testing::remove_record(&middle, 5).unwrap_err().to_string().contains("pack"));
}

/// A checkpoint inside a pack splits it: the records after the checkpoint stay (and replay
/// after a restart), those at or below it stay only with a retained one among them.
#[test]
fn a_checkpoint_inside_a_pack_splits_it() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = recover(dir.path());
    let written = ten_packed(&wal);
    wal.checkpoint_retaining(5, b"state at 5", &|lsn| lsn == 2).unwrap();
    assert_reads(&wal, &written);
    // Two packs now, the first (1-5) below the checkpoint.
    let values = stored_values(&wal);
    assert_eq!(values.iter().map(|(k, _)| k).collect::<Vec<_>>(), [&12, &12]);
    assert_eq!(wal.stats().retained_bytes, values[0].1 as u64);
    drop(wal);
    // Records 1-5 share the pack with the retained 2; 6-10 are a pack of their own.
    assert_eq!(testing::record_lsns(dir.path()).unwrap(), (1..=10).collect::<Vec<_>>());
    let keys = {
        let store = crate::log::LogStore::open(dir.path(), 1 << 20).unwrap();
        store.db.iter().keys().map(|k| k.unwrap().to_vec()).collect::<Vec<_>>()
    };
    assert_eq!(
        keys,
        [
            crate::layout::keys::pack_key(1, 5).to_vec(),
            crate::layout::keys::pack_key(6, 5).to_vec()
        ]
    );

    let (wal, report, collect) = recover(dir.path());
    assert_eq!((report.records_retained, report.records_replayed), (5, 5));
    assert_eq!(collect.records, written[5..]);
    // Retention let go: the lower pack goes, the records after the checkpoint stay.
    wal.checkpoint_retaining(7, b"state at 7", &|_| false).unwrap();
    drop(wal);
    assert_eq!(testing::record_lsns(dir.path()).unwrap(), vec![8, 9, 10]);
    let (_wal, report, collect) = recover(dir.path());
    assert_eq!((report.records_retained, report.checkpoint_lsn), (0, Some(7)));
    assert_eq!(collect.records, written[7..]);
}

/// A crash between a checkpoint inside a pack and its truncation: the start replays the
/// records after the checkpoint from the pack and splits it, once.
#[test]
fn a_crash_before_splitting_a_pack_at_the_checkpoint_is_repaired_at_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let written = ten_packed(&recover(dir.path()).0);
    testing::write_checkpoint_only(dir.path(), 4, b"state at 4").unwrap();
    let (wal, report, collect) = recover(dir.path());
    assert_eq!((report.stale_records_truncated, report.records_replayed), (4, 6));
    assert_eq!(collect.records, written[4..]);
    assert_eq!(wal.read(3).unwrap(), None);
    assert_eq!(wal.read(5).unwrap().as_deref(), Some(&written[4].1[..]));
    drop(wal);
    assert_eq!(testing::record_lsns(dir.path()).unwrap(), (5..=10).collect::<Vec<_>>());
    // The start left a marker: the next one trusts it and replays the same records.
    let (_wal, report, collect) = recover(dir.path());
    assert_eq!((report.stale_records_truncated, report.records_replayed), (0, 6));
    assert_eq!(collect.records, written[4..]);

    // Retaining one of them keeps the lower part as a pack.
    let dir = tempfile::tempdir().unwrap();
    ten_packed(&recover(dir.path()).0);
    testing::write_checkpoint_only(dir.path(), 4, b"state at 4").unwrap();
    let mut even = RetainEven::default();
    let (wal, report) = Wal::recover(config(dir.path()), &mut even).unwrap();
    assert_eq!((report.records_retained, report.stale_records_truncated), (4, 0));
    assert_eq!(even.0.records, written[4..]);
    assert_eq!(wal.read(2).unwrap().as_deref(), Some(&written[1].1[..]));
    drop(wal);
    assert_eq!(testing::record_lsns(dir.path()).unwrap(), (1..=10).collect::<Vec<_>>());
}

/// Records that do not compress into one pack are stored as smaller packs, none beyond a
/// chunk's size, rather than each alone.
#[test]
fn a_run_too_large_for_one_pack_is_stored_as_several() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = recover(dir.path());
    // 30 incompressible records of 500 bytes: 15 KiB that zstd cannot shrink.
    let written = append_group(&wal, (1..=30u64).map(|i| payload(i, 500)).collect());
    assert_reads(&wal, &written);
    let sizes = stored_values(&wal);
    assert!(sizes.len() > 1 && sizes.len() < 30, "{sizes:?}");
    assert!(sizes
        .iter()
        .all(|&(_, v)| v <= crate::layout::keys::CHUNK_BYTES + crate::frame::HEADER_LEN));
    assert!(sizes.iter().any(|&(k, _)| k == 12), "some are packs: {sizes:?}");
    drop(wal);
    let (_wal, _, collect) = recover(dir.path());
    assert_eq!(collect.records, written);
}

// --- Positions: appending at a given LSN, truncating after one, purging through one ---------

/// Small payloads of one batch, so they share a pack.
fn small(seeds: std::ops::RangeInclusive<u64>) -> Vec<Vec<u8>> {
    seeds.map(|seed| payload(seed, 40)).collect()
}

#[test]
fn append_at_takes_only_the_next_lsn() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = recover(dir.path());
    block_on(wal.append_batch_at(1, small(1..=3)).unwrap()).unwrap();
    for wrong in [0, 1, 3, 5] {
        match wal.append_batch_at(wrong, small(9..=9)) {
            Err(Error::NotNextLsn { given, next: 4 }) => assert_eq!(given, wrong),
            other => panic!("append at {wrong}: {other:?}"),
        }
    }
    assert_eq!(wal.last_lsn(), 3, "a refused append assigns nothing");
    assert_eq!(block_on(wal.append_batch_at(4, small(4..=4)).unwrap()).unwrap(), 4);
}

#[test]
fn truncate_after_removes_the_records_above_durably_and_lsns_continue() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (wal, _, _) = recover(dir.path());
        block_on(wal.append_batch(small(1..=5)).unwrap()).unwrap();
        // Still queued when the truncation starts: written, then removed.
        let in_flight = wal.append_batch(vec![payload(6, 9000), payload(7, 40)]).unwrap();
        // Read one record of the pack, so its decoded records are cached.
        assert_eq!(wal.read(3).unwrap(), Some(payload(3, 40)));
        assert!(wal.truncate_after(2).unwrap() > 0);
        assert_eq!(block_on(in_flight).unwrap(), 7, "queued records were written before the cut");
        assert_eq!(wal.last_lsn(), 2);
        assert_eq!(wal.durable_lsn(), 2);
        assert_eq!(wal.read(3).unwrap(), None);
        // LSN 3 again, with other bytes: a read must not answer from the old pack.
        block_on(wal.append_batch_at(3, vec![payload(33, 40), payload(34, 40)]).unwrap()).unwrap();
        assert_eq!(wal.read(3).unwrap(), Some(payload(33, 40)));
        assert_eq!(wal.truncate_after(9).unwrap(), 0, "nothing above the end");
        wal.shutdown().unwrap();
    }
    let (wal, report, collect) = recover(dir.path());
    assert_eq!(report.last_lsn, 4);
    let expected =
        vec![(1, payload(1, 40)), (2, payload(2, 40)), (3, payload(33, 40)), (4, payload(34, 40))];
    assert_eq!(collect.records, expected);
    assert_eq!(block_on(wal.append(payload(5, 40)).unwrap()).unwrap(), 5);
}

#[test]
fn truncate_after_zero_empties_the_log() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (wal, _, _) = recover(dir.path());
        block_on(wal.append_batch(small(1..=4)).unwrap()).unwrap();
        wal.truncate_after(0).unwrap();
        assert_eq!(wal.last_lsn(), 0);
        wal.shutdown().unwrap();
    }
    let (wal, report, collect) = recover(dir.path());
    assert_eq!((report.last_lsn, collect.records.len()), (0, 0));
    assert_eq!(block_on(wal.append_batch_at(1, small(1..=1)).unwrap()).unwrap(), 1);
}

#[test]
fn truncate_after_never_reaches_below_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (wal, _, _) = recover(dir.path());
    block_on(wal.append_batch(small(1..=6)).unwrap()).unwrap();
    wal.purge_through(3).unwrap();
    match wal.truncate_after(2) {
        Err(Error::TruncateBelowCheckpoint { lsn: 2, checkpoint: 3 }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(wal.last_lsn(), 6);
    wal.truncate_after(3).unwrap();
    assert_eq!(wal.last_lsn(), 3);
}

#[test]
fn purge_through_removes_records_for_good_and_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (wal, _, _) = recover(dir.path());
        block_on(wal.append_batch(small(1..=8)).unwrap()).unwrap();
        wal.purge_through(5).unwrap();
        // Already purged: nothing to do, no error.
        wal.purge_through(2).unwrap();
        assert_eq!(wal.read(5).unwrap(), None);
        assert_eq!(wal.read(6).unwrap(), Some(payload(6, 40)));
        wal.shutdown().unwrap();
    }
    let (_wal, report, collect) = recover(dir.path());
    assert_eq!(report.checkpoint_lsn, Some(5));
    assert_eq!(collect.checkpoint, Some((5, Vec::new())));
    assert_eq!(
        collect.records,
        vec![(6, payload(6, 40)), (7, payload(7, 40)), (8, payload(8, 40))]
    );
}

#[test]
fn purge_through_past_the_end_moves_the_next_lsn_durably() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (wal, _, _) = recover(dir.path());
        block_on(wal.append_batch(small(1..=3)).unwrap()).unwrap();
        // Queued when the purge starts: written, then purged with the rest.
        let in_flight = wal.append(payload(4, 40)).unwrap();
        wal.purge_through(20).unwrap();
        assert_eq!(block_on(in_flight).unwrap(), 4);
        assert_eq!(wal.last_lsn(), 20);
        assert_eq!(wal.durable_lsn(), 20);
        block_on(wal.wait_durable(20)).unwrap();
        assert_eq!(wal.read(4).unwrap(), None);
        assert!(matches!(wal.append_batch_at(1, small(1..=1)), Err(Error::NotNextLsn { .. })));
        wal.shutdown().unwrap();
    }
    {
        let (wal, report, collect) = recover(dir.path());
        assert_eq!((report.last_lsn, report.checkpoint_lsn), (20, Some(20)));
        assert!(collect.records.is_empty());
        assert_eq!(block_on(wal.append_batch_at(21, small(21..=22)).unwrap()).unwrap(), 22);
        wal.shutdown().unwrap();
    }
    let (_wal, report, collect) = recover(dir.path());
    assert_eq!(report.last_lsn, 22);
    assert_eq!(collect.records, vec![(21, payload(21, 40)), (22, payload(22, 40))]);
}

/// A replicated log purges entries a quorum of other copies made durable, possibly before its
/// own fsync of them: the purge waits for them, and still keeps what it is told to retain
/// (the records a change feed reads), whether the purge point lies inside the log or past it.
#[test]
fn a_purge_past_the_durable_point_keeps_the_records_it_retains() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (wal, _, _) = recover(dir.path());
        // Records stored alone (a pack is kept or dropped whole).
        let held = wal.hold_commits();
        let queued: Vec<_> = (1..=8).map(|i| wal.append(payload(i, 20_000)).unwrap()).collect();
        assert_eq!(wal.durable_lsn(), 0, "nothing is durable while the thread is held");
        std::thread::scope(|scope| {
            let purging = scope.spawn(|| wal.purge_through_retaining(6, &|lsn| lsn == 3));
            std::thread::sleep(std::time::Duration::from_millis(100));
            drop(held);
            purging.join().unwrap().unwrap();
        });
        for commit in queued {
            commit.wait().unwrap();
        }
        assert_eq!(wal.read(3).unwrap(), Some(payload(3, 20_000)), "a retained record purged");
        assert_eq!(wal.read(4).unwrap(), None);
        assert_eq!(wal.read(7).unwrap(), Some(payload(7, 20_000)));
        // Past the end: the log is empty after it, and the retained records stay below.
        wal.purge_through_retaining(20, &|lsn| lsn == 3).unwrap();
        assert_eq!(wal.read(3).unwrap(), Some(payload(3, 20_000)));
        assert_eq!(wal.read(7).unwrap(), None);
        assert_eq!(wal.last_lsn(), 20);
        wal.shutdown().unwrap();
    }
    let (wal, report, _) = recover(dir.path());
    assert_eq!(report.checkpoint_lsn, Some(20));
    assert_eq!(wal.read(3).unwrap(), Some(payload(3, 20_000)), "retained across a restart");
    assert_eq!(wal.read(7).unwrap(), None);
}

#[test]
fn records_kept_below_a_checkpoint_are_read_back_and_survive_restarts_and_purges() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (wal, _, _) = recover(dir.path());
        // A log begun from another node's snapshot at 20, holding two of its retained records.
        wal.purge_through(20).unwrap();
        let refused = wal.keep_below_checkpoint(&[(21, payload(21, 40))]);
        assert!(matches!(refused, Err(Error::InvalidArgument { .. })), "{refused:?}");
        let disordered = wal.keep_below_checkpoint(&[(9, payload(9, 40)), (4, payload(4, 40))]);
        assert!(matches!(disordered, Err(Error::InvalidArgument { .. })), "{disordered:?}");
        wal.keep_below_checkpoint(&[(4, payload(4, 40)), (9, payload(9, 20_000))]).unwrap();
        // Given again (a restart finishing an install): left as it is.
        wal.keep_below_checkpoint(&[(4, payload(4, 40))]).unwrap();
        assert_eq!(wal.read(4).unwrap(), Some(payload(4, 40)));
        assert_eq!(wal.read(9).unwrap(), Some(payload(9, 20_000)));
        assert_eq!(wal.read(5).unwrap(), None);
        block_on(wal.append_batch_at(21, small(21..=24)).unwrap()).unwrap();
        wal.shutdown().unwrap();
    }
    let (wal, report, collect) = recover(dir.path());
    assert_eq!(report.records_retained, 2);
    assert_eq!(collect.records.len(), 4, "only the records after the checkpoint replay");
    assert_eq!(wal.read(9).unwrap(), Some(payload(9, 20_000)));
    // A later checkpoint keeps what its retain says, and drops the rest.
    wal.checkpoint_retaining(22, &[], &|lsn| lsn == 9).unwrap();
    assert_eq!(wal.read(4).unwrap(), None);
    assert_eq!(wal.read(9).unwrap(), Some(payload(9, 20_000)));
}
