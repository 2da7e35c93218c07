//! The Raft storage on the wal: openraft's own storage suite, then restarts of a real data dir
//! (the store closed and opened again) for what the suite cannot see.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use cluster::{
    ClusterNode, Entry, LogId, Machine, Record, RecordsStateMachine, SnapshotData, Spool,
    TypeConfig, Vote, WalLogStore,
};
use openraft::storage::{IOFlushed, RaftLogStorage, RaftStateMachine};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::type_config::TypeConfigExt;
use openraft::{EntryPayload, Membership, RaftLogReader, RaftSnapshotBuilder, StorageError};
use tempfile::TempDir;

use common::Applied;

/// A log store on a fresh temporary data dir (kept alive by the returned `TempDir`) and an
/// empty state machine, for each test of the suite.
struct FreshDir;

impl StoreBuilder<TypeConfig, WalLogStore, RecordsStateMachine, TempDir> for FreshDir {
    async fn build(
        &self,
    ) -> Result<(TempDir, WalLogStore, RecordsStateMachine), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = WalLogStore::open(dir.path()).expect("open the log store");
        Ok((dir, store, RecordsStateMachine::default()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite() {
    Suite::test_all(FreshDir).await.expect("openraft's storage suite");
}

/// A log store and the server's state machine ([`Machine`], its snapshot kept in the data
/// dir) on a fresh temporary data dir.
struct FreshMachine;

impl StoreBuilder<TypeConfig, WalLogStore, Machine<Applied>, TempDir> for FreshMachine {
    async fn build(
        &self,
    ) -> Result<(TempDir, WalLogStore, Machine<Applied>), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = WalLogStore::open(dir.path()).expect("open the log store");
        let machine =
            Machine::open(dir.path(), Applied::default(), store.clone()).expect("open the machine");
        Ok((dir, store, machine))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_with_the_servers_state_machine() {
    Suite::test_all(FreshMachine).await.expect("openraft's storage suite");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_state_machine_keeps_its_snapshot_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = WalLogStore::open(dir.path()).unwrap();
    let mut machine = Machine::open(dir.path(), Applied::default(), store.clone()).unwrap();
    let mut entries = vec![membership_entry(1, 0, &[1])];
    entries.extend((1..=3).map(|i| record_entry(1, i, format!("r{i}").as_bytes())));
    let stream = futures_util::stream::iter(entries.into_iter().map(|e| Ok((e, None))));
    machine.apply(stream).await.unwrap();
    let built = machine.get_snapshot_builder().await.build_snapshot().await.unwrap();
    assert_eq!(built.meta.last_log_id, Some(log_id(1, 1, 3)));
    drop(machine);

    // A start installs the kept snapshot: the state and the applied log id are the snapshot's.
    let mut again = Machine::open(dir.path(), Applied::default(), store).unwrap();
    let (applied, membership) = again.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(1, 1, 3)));
    assert_eq!(membership.membership().voter_ids().collect::<Vec<_>>(), vec![1]);
    let records = again.with_domain(|d, _| d.0.clone());
    let expected: Vec<(u64, Vec<u8>)> =
        (1..=3).map(|i| (i, format!("r{i}").into_bytes())).collect();
    assert_eq!(records, expected);
    // A record proposed for another index than where it landed is skipped.
    let mut misplaced = record_entry(1, 4, b"misplaced");
    if let EntryPayload::Normal(record) = &mut misplaced.payload {
        record.index = Some(9);
    }
    let stream = futures_util::stream::iter([Ok((misplaced, None))]);
    again.apply(stream).await.unwrap();
    assert_eq!(again.with_domain(|d, _| d.0.len()), 3);
    assert_eq!(again.applied_state().await.unwrap().0, Some(log_id(1, 1, 4)));
}

// --- restarts ---------------------------------------------------------------------------

fn log_id(term: u64, node: u64, index: u64) -> LogId {
    LogId::new(openraft::impls::leader_id_adv::LeaderId { term, node_id: node }, index)
}

fn record_entry(term: u64, index: u64, payload: &[u8]) -> Entry {
    let record = Record::unplaced(cluster::DEFAULT_GROUP, payload.to_vec());
    Entry { log_id: log_id(term, 1, index), payload: EntryPayload::Normal(record) }
}

fn membership_entry(term: u64, index: u64, voters: &[u64]) -> Entry {
    let voters: BTreeSet<u64> = voters.iter().copied().collect();
    let nodes = voters.iter().map(|&id| {
        let node = ClusterNode {
            raft_addr: format!("127.0.0.{id}:9100"),
            api_addr: format!("127.0.0.{id}:8080"),
        };
        (id, node)
    });
    let membership =
        Membership::new(vec![voters.clone()], nodes.collect::<BTreeMap<_, _>>()).unwrap();
    Entry { log_id: log_id(term, 1, index), payload: EntryPayload::Membership(membership) }
}

/// Appends `entries` and waits for their flush callback: they are durable when it returns.
async fn append(store: &mut WalLogStore, entries: Vec<Entry>) {
    let (tx, rx) = TypeConfig::oneshot();
    store.append(entries, IOFlushed::signal(tx)).await.unwrap();
    rx.await.unwrap().unwrap();
}

async fn all_entries(store: &mut WalLogStore) -> Vec<Entry> {
    store.get_log_reader().await.try_get_log_entries(..).await.unwrap()
}

/// Closes the store (the wal flushes and releases the dir) and opens it again.
fn restart(store: WalLogStore, dir: &Path) -> WalLogStore {
    store.shutdown().unwrap();
    drop(store);
    WalLogStore::open(dir).unwrap()
}

/// Opens the data dir of a store dropped without a stop, as a process started after a crash
/// would: once the dropped store's last task (an append's flush callback, spawned) let go of
/// the dir's lock, which a dead process's would have at once.
async fn open_after_crash(dir: &Path) -> WalLogStore {
    for _ in 0..250 {
        match WalLogStore::open(dir) {
            Err(cluster::Error::Wal(wal::Error::InUse { .. })) => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            opened => return opened.unwrap(),
        }
    }
    panic!("the dropped store still holds its data dir after 5 s");
}

fn first_entries() -> Vec<Entry> {
    let mut entries = vec![membership_entry(1, 0, &[1, 2, 3])];
    entries.extend((1..=9).map(|i| record_entry(1, i, format!("record {i}").as_bytes())));
    // One over the wal's chunk size, stored in parts.
    entries.push(record_entry(2, 10, &vec![7u8; 20_000]));
    entries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_vote_and_commit_point_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = WalLogStore::open(dir.path()).unwrap();
    append(&mut store, first_entries()).await;
    let vote = Vote::new_committed(2, 1);
    store.save_vote(&vote).await.unwrap();
    store.save_committed(Some(log_id(1, 1, 8))).await.unwrap();
    assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 1, 8)), "noted at once");
    // Written lazily: by the next persist (every second on a node), a vote, or a stop.
    store.persist_committed().unwrap();

    let mut store = restart(store, dir.path());
    assert_eq!(all_entries(&mut store).await, first_entries());
    assert_eq!(store.get_log_reader().await.read_vote().await.unwrap(), Some(vote));
    assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 1, 8)));
    let state = store.get_log_state().await.unwrap();
    assert_eq!((state.last_purged_log_id, state.last_log_id), (None, Some(log_id(2, 1, 10))));

    // The log goes on where it ended.
    append(&mut store, vec![record_entry(2, 11, b"after the restart")]).await;
    let mut store = restart(store, dir.path());
    assert_eq!(all_entries(&mut store).await.len(), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncation_is_durable_and_the_log_goes_on_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = WalLogStore::open(dir.path()).unwrap();
    append(&mut store, first_entries()).await;
    // A new leader of term 3 does not have entries 6..=10 of term 1 and 2.
    store.truncate_after(Some(log_id(1, 1, 5))).await.unwrap();
    append(&mut store, vec![record_entry(3, 6, b"the new leader's 6")]).await;

    let mut store = restart(store, dir.path());
    let entries = all_entries(&mut store).await;
    let mut expected = first_entries()[..=5].to_vec();
    expected.push(record_entry(3, 6, b"the new leader's 6"));
    assert_eq!(entries, expected);
    assert_eq!(store.get_log_state().await.unwrap().last_log_id, Some(log_id(3, 1, 6)));

    store.truncate_after(None).await.unwrap();
    let mut store = restart(store, dir.path());
    assert!(all_entries(&mut store).await.is_empty());
    assert_eq!(store.get_log_state().await.unwrap().last_log_id, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_keeps_the_last_purged_log_id_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = WalLogStore::open(dir.path()).unwrap();
    append(&mut store, first_entries()).await;
    store.purge(log_id(1, 1, 4)).await.unwrap();

    let mut store = restart(store, dir.path());
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 4)));
    assert_eq!(state.last_log_id, Some(log_id(2, 1, 10)));
    assert_eq!(all_entries(&mut store).await, first_entries()[5..].to_vec());

    // Past the end (a snapshot from another node covers more than this log holds): the log
    // is empty and begins after it.
    store.purge(log_id(4, 2, 30)).await.unwrap();
    let mut store = restart(store, dir.path());
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(4, 2, 30)));
    assert_eq!(state.last_log_id, Some(log_id(4, 2, 30)));
    assert!(all_entries(&mut store).await.is_empty());
    append(&mut store, vec![record_entry(4, 31, b"first after the snapshot")]).await;
    let mut store = restart(store, dir.path());
    assert_eq!(
        all_entries(&mut store).await,
        vec![record_entry(4, 31, b"first after the snapshot")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_are_readable_before_their_fsync_and_holes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = WalLogStore::open(dir.path()).unwrap();
    let (tx, rx) = TypeConfig::oneshot();
    store.append(first_entries(), IOFlushed::signal(tx)).await.unwrap();
    // Readable as soon as `append` returned, flushed or not.
    assert_eq!(all_entries(&mut store).await, first_entries());
    rx.await.unwrap().unwrap();
    assert_eq!(all_entries(&mut store).await, first_entries());

    let (tx, _rx) = TypeConfig::oneshot();
    let hole = store.append(vec![record_entry(2, 12, b"after a hole")], IOFlushed::signal(tx));
    assert!(hole.await.is_err(), "index 11 is missing");
    let (tx, _rx) = TypeConfig::oneshot();
    let overwrite = store.append(vec![record_entry(3, 5, b"over 5")], IOFlushed::signal(tx));
    assert!(overwrite.await.is_err(), "an entry is replaced only after a truncation");
    assert_eq!(all_entries(&mut store).await, first_entries());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_machine_applies_records_in_order_and_snapshots_exactly_that_state() {
    let mut sm = RecordsStateMachine::default();
    // Without responders: openraft makes them, for client writes only.
    let stream = futures_util::stream::iter(first_entries().into_iter().map(|e| Ok((e, None))));
    sm.apply(stream).await.unwrap();
    let state = sm.state();
    assert_eq!(state.last_applied, Some(log_id(2, 1, 10)));
    assert_eq!(state.records.len(), 10);
    assert!(state.records.iter().zip(1..).all(|((index, _), want)| *index == want));

    let snapshot = sm.build_snapshot().await.unwrap();
    let mut other = RecordsStateMachine::default();
    other.install_snapshot(&snapshot.meta, snapshot.snapshot).await.unwrap();
    assert_eq!(other.state(), state);

    // A snapshot whose bytes do not hold the state its metadata names is refused.
    let mut meta = snapshot.meta.clone();
    meta.last_log_id = Some(log_id(2, 1, 11));
    let bytes = sm.get_current_snapshot().await.unwrap().unwrap().snapshot;
    assert!(other.install_snapshot(&meta, bytes).await.is_err());
    assert_eq!(other.state(), state, "a refused snapshot changes nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_keeps_what_the_snapshot_retains_and_so_does_a_log_begun_after_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = WalLogStore::open(dir.path()).unwrap();
    append(&mut store, first_entries()).await;
    store.set_retained(BTreeSet::from([2, 5]));
    store.purge(log_id(1, 1, 7)).await.unwrap();
    let readable = |store: &WalLogStore| -> Vec<u64> {
        (0..=10).filter(|&i| store.read_record(i).unwrap().is_some()).collect()
    };
    // The wal keeps a pack of small records whole when one of them is retained, so the
    // others of its pack may stay readable too; Raft sees only the log after the purge.
    let retained_and_after = |store: &WalLogStore| -> bool {
        [2, 5, 8, 9, 10].iter().all(|&i| store.read_record(i).unwrap().is_some())
    };
    assert!(retained_and_after(&store));
    assert_eq!(all_entries(&mut store).await, first_entries()[8..].to_vec());

    // Kept across a restart (the sweep marker names them), and read back alike.
    let mut store = restart(store, dir.path());
    assert!(retained_and_after(&store));
    assert_eq!(all_entries(&mut store).await, first_entries()[8..].to_vec());

    // A node given a snapshot at 9 that retains 2 and 5: its log begins at 10 and holds them.
    let raw = store.raw_entries(&BTreeSet::from([2, 5])).unwrap();
    assert_eq!(raw.len(), 2);
    let other_dir = tempfile::tempdir().unwrap();
    let mut other = WalLogStore::open(other_dir.path()).unwrap();
    append(&mut other, vec![record_entry(1, 0, b"a stale entry of its own")]).await;
    other.begin_after_snapshot(log_id(1, 1, 9), &raw).unwrap();
    assert_eq!(readable(&other), vec![2, 5]);
    assert_eq!(other.read_record(5).unwrap(), store.read_record(5).unwrap());
    let state = other.get_log_state().await.unwrap();
    assert_eq!(
        (state.last_purged_log_id, state.last_log_id),
        (Some(log_id(1, 1, 9)), Some(log_id(1, 1, 9)))
    );
    append(&mut other, vec![record_entry(2, 10, b"after the snapshot")]).await;
    let mut other = restart(other, other_dir.path());
    assert_eq!(readable(&other), vec![2, 5, 10]);
    assert_eq!(all_entries(&mut other).await, vec![record_entry(2, 10, b"after the snapshot")]);

    // A later purge drops what the snapshot no longer retains.
    other.set_retained(BTreeSet::from([5]));
    append(&mut other, vec![record_entry(2, 11, b"eleven")]).await;
    other.purge(log_id(2, 1, 10)).await.unwrap();
    assert!(other.read_record(2).unwrap().is_none());
    assert!(other.read_record(5).unwrap().is_some());
    assert_eq!(all_entries(&mut other).await, vec![record_entry(2, 11, b"eleven")]);
}

/// A machine on `dir` that applied `entries`, appended to its log first, and the snapshot it
/// then built of them.
async fn built_over(
    dir: &Path,
    entries: Vec<Entry>,
) -> (
    WalLogStore,
    Machine<Applied>,
    openraft::type_config::alias::SnapshotOf<TypeConfig, SnapshotData>,
) {
    let mut store = WalLogStore::open(dir).unwrap();
    append(&mut store, entries.clone()).await;
    let mut machine = Machine::open(dir, Applied::default(), store.clone()).unwrap();
    let stream = futures_util::stream::iter(entries.into_iter().map(|e| Ok((e, None))));
    machine.apply(stream).await.unwrap();
    let mut builder = machine.try_create_snapshot_builder(false).await.expect("a state to give");
    let built = builder.build_snapshot().await.unwrap();
    (store, machine, built)
}

/// `snapshot` gathered in `spool` as a link gathers a large one: in parts (of 7 bytes here)
/// read by position.
fn gathered_in_parts(mut spool: Spool, snapshot: &SnapshotData) -> SnapshotData {
    let mut offset = 0;
    while offset < snapshot.len() {
        let part = snapshot.read_at(offset, 7).unwrap();
        spool.write(&part).unwrap();
        offset += part.len() as u64;
    }
    spool.finish().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_installed_elsewhere_carries_its_retained_records_into_that_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut entries = vec![membership_entry(1, 0, &[1])];
    entries.push(record_entry(1, 1, b"keep: one"));
    entries.extend((2..=4).map(|i| record_entry(1, i, format!("r{i}").as_bytes())));
    let (store, mut machine, built) = built_over(dir.path(), entries).await;
    assert_eq!(built.meta.last_log_id, Some(log_id(1, 1, 4)));
    assert_eq!(machine.counts().built, 1);
    // Nothing newer to give: no builder.
    assert!(machine.try_create_snapshot_builder(false).await.is_none());

    // Kept in the data dir and read from there: the bytes are not held in memory.
    assert!(matches!(built.snapshot, SnapshotData::File { .. }), "{:?}", built.snapshot);

    // Sent as a link sends a large one: in parts read by position, gathered in a spool in the
    // receiver's data dir.
    let other_dir = tempfile::tempdir().unwrap();
    let spool = Spool::new(Some(other_dir.path())).unwrap();
    let gathered = gathered_in_parts(spool, &built.snapshot);
    assert_eq!(gathered.len(), built.snapshot.len());
    let other_store = WalLogStore::open(other_dir.path()).unwrap();
    let mut other =
        Machine::open(other_dir.path(), Applied::default(), other_store.clone()).unwrap();
    other.install_snapshot(&built.meta, gathered).await.unwrap();
    let current = other.get_current_snapshot().await.unwrap().expect("the installed one");
    assert_eq!(current.meta, built.meta);
    assert_eq!(current.snapshot.into_bytes().unwrap(), built.snapshot.into_bytes().unwrap());
    assert_eq!(other.with_domain(|d, _| d.0.clone()), machine.with_domain(|d, _| d.0.clone()));
    assert_eq!(other.counts().installed, 1);
    assert_eq!(other_store.read_record(1).unwrap(), store.read_record(1).unwrap());
    assert!(other_store.read_record(2).unwrap().is_none(), "only what the state retains");
    drop(other);

    // A restart installs it again from the data dir, over the same log.
    let other_store = restart(other_store, other_dir.path());
    let mut again =
        Machine::open(other_dir.path(), Applied::default(), other_store.clone()).unwrap();
    assert_eq!(again.applied_state().await.unwrap().0, Some(log_id(1, 1, 4)));
    assert_eq!(again.with_domain(|d, _| d.0.len()), 4);
    assert!(other_store.read_record(1).unwrap().is_some());
}

/// A start over a snapshot built here gives the log back any record the snapshot retains that
/// the log lost (a purge that did not keep it): the snapshot carries them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_writes_back_a_retained_record_the_log_lost() {
    let dir = tempfile::tempdir().unwrap();
    let mut entries = vec![membership_entry(1, 0, &[1])];
    entries.push(record_entry(1, 1, b"keep: one"));
    entries.extend((2..=4).map(|i| record_entry(1, i, format!("r{i}").as_bytes())));
    let (mut store, machine, built) = built_over(dir.path(), entries).await;
    assert_eq!(built.meta.last_log_id, Some(log_id(1, 1, 4)));
    let kept = store.read_record(1).unwrap();
    assert!(kept.is_some());
    drop(machine);
    store.set_retained(BTreeSet::new());
    store.purge(log_id(1, 1, 2)).await.unwrap();
    assert!(store.read_record(1).unwrap().is_none(), "purged without it");

    let store = restart(store, dir.path());
    let _machine = Machine::open(dir.path(), Applied::default(), store.clone()).unwrap();
    assert_eq!(store.read_record(1).unwrap(), kept, "written back from the snapshot");
    assert_eq!(*store.retained(), BTreeSet::from([1]));
    // Durably: also after another restart.
    let store = restart(store, dir.path());
    assert_eq!(store.read_record(1).unwrap(), kept);
}

/// A snapshot gathered in parts into a spool laid out to be kept is kept by renaming that file,
/// not by copying it; a spool left by a crash is removed at the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_gathered_to_be_kept_is_renamed_into_place_not_copied() {
    use std::os::unix::fs::MetadataExt;

    let dir = tempfile::tempdir().unwrap();
    let mut entries = vec![membership_entry(1, 0, &[1])];
    entries.extend((1..=4).map(|i| record_entry(1, i, format!("r{i}").as_bytes())));
    let (_store, machine, built) = built_over(dir.path(), entries).await;

    let other_dir = tempfile::tempdir().unwrap();
    // What a crash in the middle of gathering leaves: removed when the machine opens.
    let left = Spool::to_keep(other_dir.path(), b"head".to_vec()).unwrap();
    std::mem::forget(left);
    let incoming = |dir: &std::path::Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().contains("incoming"))
            .count()
    };
    assert_eq!(incoming(other_dir.path()), 1);
    let other_store = WalLogStore::open(other_dir.path()).unwrap();
    let mut other =
        Machine::open(other_dir.path(), Applied::default(), other_store.clone()).unwrap();
    assert_eq!(incoming(other_dir.path()), 0, "a crash's spool is removed at the start");

    let head = cluster::kept_head(&built.meta).unwrap();
    let spool = Spool::to_keep(other_dir.path(), head).unwrap();
    let gathered = gathered_in_parts(spool, &built.snapshot);
    let SnapshotData::File { file, .. } = &gathered else { panic!("a file: {gathered:?}") };
    let gathered_inode = file.metadata().unwrap().ino();
    other.install_snapshot(&built.meta, gathered).await.unwrap();
    let kept = std::fs::metadata(other_dir.path().join("raft-snapshot")).unwrap();
    assert_eq!(kept.ino(), gathered_inode, "the gathered file itself is kept");
    assert_eq!(incoming(other_dir.path()), 0);
    let current = other.get_current_snapshot().await.unwrap().expect("the installed one");
    assert_eq!(current.meta, built.meta);
    assert_eq!(current.snapshot.into_bytes().unwrap(), built.snapshot.into_bytes().unwrap());
    assert_eq!(other.with_domain(|d, _| d.0.clone()), machine.with_domain(|d, _| d.0.clone()));
    drop(other);

    // A restart reads it from its place.
    let other_store = restart(other_store, other_dir.path());
    let again = Machine::open(other_dir.path(), Applied::default(), other_store.clone()).unwrap();
    assert_eq!(again.with_domain(|d, _| d.0.len()), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_forgets_at_most_the_committed_log_id_not_yet_written_never_a_vote() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = WalLogStore::open(dir.path()).unwrap();
    append(&mut store, first_entries()).await;
    store.save_committed(Some(log_id(1, 1, 8))).await.unwrap();
    store.persist_committed().unwrap();
    store.save_committed(Some(log_id(2, 1, 10))).await.unwrap();
    let vote = Vote::new_committed(3, 2);
    // A vote writes the live state, the committed log id noted before it too.
    store.save_vote(&vote).await.unwrap();
    store.save_committed(Some(log_id(2, 1, 10))).await.unwrap();
    let later = Vote::new_committed(4, 2);
    store.save_vote(&later).await.unwrap();

    // The process dies: no stop, no persist.
    drop(store);
    let mut store = WalLogStore::open(dir.path()).unwrap();
    assert_eq!(store.get_log_reader().await.read_vote().await.unwrap(), Some(later));
    assert_eq!(store.read_committed().await.unwrap(), Some(log_id(2, 1, 10)));

    // A committed log id noted after the last write is what a crash may forget, and only it.
    append(&mut store, vec![record_entry(4, 11, b"committed, not yet written")]).await;
    store.save_committed(Some(log_id(4, 2, 11))).await.unwrap();
    drop(store);
    let mut store = open_after_crash(dir.path()).await;
    assert_eq!(store.read_committed().await.unwrap(), Some(log_id(2, 1, 10)));
    assert_eq!(store.get_log_reader().await.read_vote().await.unwrap(), Some(later));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_kept_in_the_older_form_is_read_and_written_again_in_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open_after_crash(dir.path()).await;
    let entries: Vec<Entry> = std::iter::once(membership_entry(1, 0, &[1]))
        .chain((1..=3).map(|i| record_entry(1, i, format!("r{i}").as_bytes())))
        .collect();
    append(&mut store, entries.clone()).await;
    let mut machine = Machine::open(dir.path(), Applied::default(), store.clone()).unwrap();
    let stream = futures_util::stream::iter(entries.into_iter().map(|e| Ok((e, None))));
    machine.apply(stream).await.unwrap();
    let built = machine.try_create_snapshot_builder(false).await.unwrap();
    let built = { built }.build_snapshot().await.unwrap();
    let domain = machine.with_domain(|d, _| d.0.clone());
    drop(machine);

    // Built here: one zstd stream. An earlier build kept its bytes raw, in the older form
    // (the metadata and the bytes encoded as one).
    let path = dir.path().join("raft-snapshot");
    let compressed = built.snapshot.into_bytes().unwrap();
    assert_eq!(compressed[..4], [0x28, 0xb5, 0x2f, 0xfd], "a zstd frame");
    let bytes = zstd::decode_all(&compressed[..]).unwrap();
    let older = (built.meta.clone(), serde_bytes::ByteBuf::from(bytes.clone()));
    std::fs::write(&path, wal::codec::encode(&older).unwrap()).unwrap();

    let mut again = Machine::open(dir.path(), Applied::default(), store.clone()).unwrap();
    assert_eq!(again.with_domain(|d, _| d.0.clone()), domain);
    assert_eq!(std::fs::read(&path).unwrap()[..8], *b"sheetdR2", "written again in the new form");
    let current = again.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, built.meta);
    assert_eq!(current.snapshot.into_bytes().unwrap(), bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_taken_before_an_install_keeps_the_installed_snapshot() {
    // openraft builds in a task of its own: a node's state is taken for a snapshot at 3, then
    // a snapshot at 6 from the leader is installed before that build is written.
    let entries: Vec<Entry> = std::iter::once(membership_entry(1, 0, &[1, 2]))
        .chain((1..=6).map(|i| record_entry(1, i, format!("r{i}").as_bytes())))
        .collect();
    let leader_dir = tempfile::tempdir().unwrap();
    let mut leader_store = WalLogStore::open(leader_dir.path()).unwrap();
    append(&mut leader_store, entries.clone()).await;
    let mut leader = Machine::open(leader_dir.path(), Applied::default(), leader_store).unwrap();
    let all = futures_util::stream::iter(entries.clone().into_iter().map(|e| Ok((e, None))));
    leader.apply(all).await.unwrap();
    let from_leader = leader.get_snapshot_builder().await.build_snapshot().await.unwrap();
    assert_eq!(from_leader.meta.last_log_id, Some(log_id(1, 1, 6)));

    let dir = tempfile::tempdir().unwrap();
    let mut store = WalLogStore::open(dir.path()).unwrap();
    append(&mut store, entries[..4].to_vec()).await;
    let mut machine = Machine::open(dir.path(), Applied::default(), store.clone()).unwrap();
    let first = futures_util::stream::iter(entries[..4].iter().cloned().map(|e| Ok((e, None))));
    machine.apply(first).await.unwrap();
    let mut taken = machine.try_create_snapshot_builder(false).await.expect("a state to give");
    machine.install_snapshot(&from_leader.meta, from_leader.snapshot).await.unwrap();

    // The build finishes after the install: it gives the installed snapshot, and keeps it.
    let built = taken.build_snapshot().await.unwrap();
    assert_eq!(built.meta.last_log_id, Some(log_id(1, 1, 6)));
    assert_eq!(machine.counts().built, 0, "nothing older was kept");
    drop(machine);
    let store = restart(store, dir.path());
    let mut again = Machine::open(dir.path(), Applied::default(), store).unwrap();
    assert_eq!(again.applied_state().await.unwrap().0, Some(log_id(1, 1, 6)));
    assert_eq!(again.with_domain(|d, _| d.0.len()), 6);
}
