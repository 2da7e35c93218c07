//! Pins the public API other crates build on (exact signatures) and exercises it the way
//! sheetd does: from async tasks, with bincode going through `wal::codec`.

use std::future::Future;
use std::path::Path;

use serde::{Deserialize, Serialize};
use wal::{codec, Commit, Config, Lsn, RecoveryReport, Replayer, Wal, WalStats};

type ReplayResult = std::result::Result<(), Box<dyn std::error::Error + Send + Sync>>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Op {
    Set { cell: String, value: f64 },
    Clear { cell: String },
}

#[derive(Default)]
struct Ops {
    snapshot: Option<(Lsn, Vec<Op>)>,
    ops: Vec<(Lsn, Op)>,
}

impl Replayer for Ops {
    fn checkpoint(&mut self, lsn: Lsn, snapshot: &mut dyn std::io::Read) -> ReplayResult {
        self.snapshot = Some((lsn, codec::stream(snapshot)?.decode()?));
        Ok(())
    }

    fn record(&mut self, lsn: Lsn, payload: &[u8]) -> ReplayResult {
        self.ops.push((lsn, codec::decode(payload)?));
        Ok(())
    }
}

/// Compiles only if the signatures are exactly the documented ones.
#[allow(dead_code)]
fn signatures() {
    let _: fn(Config, &mut dyn Replayer) -> wal::Result<(Wal, RecoveryReport)> = Wal::recover;
    let _: fn(Config, &mut dyn Replayer) -> wal::Result<RecoveryReport> = Wal::verify;
    let _: fn(&Wal, Vec<u8>) -> wal::Result<Commit> = Wal::append;
    let _: fn(&Wal, Vec<Vec<u8>>) -> wal::Result<Commit> = Wal::append_batch;
    let _: fn(&Wal) -> Lsn = Wal::last_lsn;
    let _: fn(&Wal) -> Lsn = Wal::durable_lsn;
    let _: fn(&Wal, Lsn, &[u8]) -> wal::Result<()> = Wal::checkpoint;
    let _: fn(&Wal) -> WalStats = Wal::stats;
    let _: fn(&Wal) -> wal::Result<()> = Wal::shutdown;
    let _: fn(&Commit) -> Lsn = Commit::lsn;
    let _: fn(&Path) -> Config = |p| Config::default_for(p);
    let _: fn(&Op) -> wal::Result<Vec<u8>> = codec::encode::<Op>;
    let _: fn(&[u8]) -> wal::Result<Op> = codec::decode::<Op>;
    let _: u8 = codec::FORMAT_VERSION;
    let _: &[f64] = wal::FLUSH_LATENCY_BUCKETS_SECONDS;
    fn waits<F: Future<Output = wal::Result<()>> + Send + 'static>(_: F) {}
    fn commits<F: Future<Output = wal::Result<Lsn>> + Send + 'static>(_: F) {}
    let _ = |w: &Wal, c: Commit| {
        waits(w.wait_durable(1));
        commits(c);
        w.append_with(|lsn| lsn.to_le_bytes().to_vec())
    };
}

#[test]
fn defaults_are_documented_values() {
    let config = Config::default_for("/data");
    assert_eq!(config.max_batch_records, 8192);
    assert_eq!(config.cache_capacity_bytes, 16 * 1024 * 1024);
    assert_eq!(codec::FORMAT_VERSION, 4);
    assert_eq!(codec::OLDEST_READABLE_VERSION, 1);
}

#[test]
fn async_appends_checkpoint_and_recover() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config { cache_capacity_bytes: 1 << 20, ..Config::default_for(dir.path()) };
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();

    let (wal, report) = Wal::recover(config.clone(), &mut Ops::default()).unwrap();
    assert_eq!(report.last_lsn, 0);
    let ops: Vec<Op> = (0..20)
        .map(|i| {
            if i % 3 == 0 {
                Op::Clear { cell: format!("A{i}") }
            } else {
                Op::Set { cell: format!("A{i}"), value: f64::from(i) * 1.5 }
            }
        })
        .collect();

    // Appends from many tasks; each awaits its own commit.
    let tasks: Vec<_> = ops
        .iter()
        .map(|op| {
            let wal = wal.clone();
            let bytes = codec::encode(op).unwrap();
            runtime.spawn(async move { wal.append(bytes).unwrap().await })
        })
        .collect();
    let mut lsns: Vec<Lsn> =
        tasks.into_iter().map(|t| runtime.block_on(t).unwrap().unwrap()).collect();
    lsns.sort_unstable();
    assert_eq!(lsns, (1..=20).collect::<Vec<_>>());

    // A checkpoint at LSN 10 (the snapshot content does not matter to the log), written on a
    // blocking thread as sheetd does.
    let snapshot = codec::encode(&Vec::<Op>::new()).unwrap();
    let checkpointer = wal.clone();
    runtime
        .block_on(runtime.spawn_blocking(move || checkpointer.checkpoint(10, &snapshot)))
        .unwrap()
        .unwrap();
    runtime.block_on(wal.wait_durable(20)).unwrap();
    assert_eq!(wal.stats().checkpoint_lsn, 10);
    wal.shutdown().unwrap();
    drop(wal);

    let mut replayed = Ops::default();
    let (_wal, report) = Wal::recover(config, &mut replayed).unwrap();
    assert_eq!(report.checkpoint_lsn, Some(10));
    assert_eq!(replayed.snapshot, Some((10, Vec::new())));
    assert_eq!(replayed.ops.len(), 10);
    assert!(replayed.ops.iter().all(|(lsn, _)| *lsn > 10));
    for (lsn, op) in &replayed.ops {
        // Which op got which LSN depends on task scheduling; each must be one of ours.
        assert!(ops.contains(op), "unexpected op at {lsn}: {op:?}");
    }
}
