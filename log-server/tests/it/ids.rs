//! Layout 4's deferred index rows (docs/storage.md, "Deferred index rows")
//! on a real redb file: an entry's nonce, record-hash and leaf-hash rows
//! and its chain row live in memory until a merge writes a generation of
//! them into their tables, and opening the file rebuilds the ones not yet
//! written from the entries. Across many merges and reopens, every
//! committed entry is found by all three keys and in its agent's chain,
//! each chain's head is its last record, a replayed nonce is refused, and
//! `meta.ids_to` says which entries the tables cover (three `ids` rows and
//! one `chains` row each).

use crate::common;

use std::path::Path;
use std::sync::Arc;

use common::{now, signer, Agent, AppendOne};
use redb::{ReadableDatabase, ReadableTableMetadata, TableDefinition};
use tally_log::store::redb::RedbStore;
use tally_log::{AppendError, BatchItem, Log, LogConfig, LogStore};
use tally_schemas::{AgentName, Hash, LeafIndex, Record, Seq};

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const IDS: TableDefinition<([u8; 16], u64), ()> = TableDefinition::new("ids");
const CHAINS: TableDefinition<(&str, u64), (u64, [u8; 32])> = TableDefinition::new("chains");

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A log over `store`.
fn open_log(store: &Arc<RedbStore>) -> Log {
    Log::open(
        Arc::clone(store) as Arc<dyn LogStore>,
        signer(),
        LogConfig::default(),
    )
    .unwrap()
}

/// (layout, tree size, ids_to, rows in `ids`, rows in `chains`), read
/// with redb directly.
fn on_disk(path: &Path) -> (u64, u64, u64, u64, u64) {
    let db = redb::Database::open(path).unwrap();
    let tx = db.begin_read().unwrap();
    let meta = tx.open_table(META).unwrap();
    let get = |k: &str| meta.get(k).unwrap().map(|g| g.value()).unwrap();
    let rows = tx.open_table(IDS).unwrap().len().unwrap();
    let chains = tx.open_table(CHAINS).unwrap().len().unwrap();
    (get("layout"), get("tree_size"), get("ids_to"), rows, chains)
}

/// `(seq, index)` of each record of `agent` in `committed`, in seq order.
fn chain_of(committed: &[(Record, LeafIndex, Hash)], agent: &AgentName) -> Vec<(Seq, LeafIndex)> {
    committed
        .iter()
        .filter(|(r, _, _)| r.agent == *agent)
        .map(|(r, i, _)| (r.seq, *i))
        .collect()
}

/// `agent`'s chain as the store answers it: its head and its rows, whole
/// and in a window from the middle.
fn check_chain(store: &RedbStore, committed: &[(Record, LeafIndex, Hash)], agent: &AgentName) {
    let want = chain_of(committed, agent);
    let head = store.chain_head(agent).unwrap();
    assert_eq!(
        head.as_ref().map(|h| (h.seq, h.index)),
        want.last().copied()
    );
    if let Some(h) = head {
        let last = committed.iter().find(|(_, i, _)| *i == h.index).unwrap();
        assert_eq!(h.record_hash, last.0.hash());
    }
    let all = store
        .agent_indexes(agent, Seq::new(0).unwrap(), usize::MAX)
        .unwrap();
    assert_eq!(all, want);
    if let Some((from, _)) = want.get(want.len() / 2) {
        let window = store.agent_indexes(agent, *from, 3).unwrap();
        assert_eq!(
            window,
            want[want.len() / 2..]
                .iter()
                .take(3)
                .copied()
                .collect::<Vec<_>>()
        );
    }
}

#[test]
fn every_entry_is_found_by_all_three_keys_across_merges_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.redb");
    let mut agents: Vec<Agent> = (0..3).map(|i| Agent::new(&format!("ids-{i}"))).collect();
    // (record, its index, its leaf hash)
    let mut committed: Vec<(Record, LeafIndex, Hash)> = Vec::new();
    let mut merged_once = false;
    for round in 0..8 {
        let store = Arc::new(RedbStore::open_with(&path, 1 << 24, 5).unwrap());
        // Everything committed before the reopen is found: from the table
        // or from the rows rebuilt from the entries.
        for (r, i, leaf) in &committed {
            assert_eq!(store.index_of_nonce(&r.nonce).unwrap(), Some(*i));
            assert_eq!(store.index_of_record(&r.hash()).unwrap(), Some(*i));
            assert_eq!(store.index_of_leaf(leaf).unwrap(), Some(*i));
        }
        for a in &agents {
            check_chain(&store, &committed, &a.name);
        }
        let log = open_log(&store);
        // Batches of several sizes and single appends: a merge slice rides
        // on commits of every size.
        for n in [1usize, 2, 4, 7] {
            let records: Vec<Record> = (0..n).map(|k| agents[k % 3].next()).collect();
            let items = records.iter().cloned().map(BatchItem::Record).collect();
            let answers = rt().block_on(log.append_batch(items, now())).unwrap();
            for (r, a) in records.into_iter().zip(answers) {
                let a = a.unwrap();
                committed.push((r, a.entry.index(), a.entry.leaf_hash()));
            }
        }
        // A record reusing a nonce of this round or of any round before is
        // refused with the index that used it first.
        for pick in [0, committed.len() / 2, committed.len() - 1] {
            let (first, i, _) = &committed[pick];
            let replay = agents[round % 3].next_with_nonce(first.nonce.clone());
            match rt().block_on(log.append(replay, now())) {
                Err(AppendError::NonceReplayed { first_index, .. }) => {
                    assert_eq!(first_index, *i);
                }
                other => panic!("round {round}: the replay was not refused: {other:?}"),
            }
        }
        let unknown = Agent::new("ids-nobody").next();
        assert_eq!(store.index_of_nonce(&unknown.nonce).unwrap(), None);
        assert_eq!(store.index_of_record(&unknown.hash()).unwrap(), None);
        assert_eq!(store.chain_head(&unknown.agent).unwrap(), None);
        for a in &agents {
            check_chain(&store, &committed, &a.name);
        }
        log.shutdown();
        drop(log);
        drop(store);

        let (layout, size, ids_to, rows, chains) = on_disk(&path);
        assert_eq!(layout, 4);
        assert_eq!(size, committed.len() as u64);
        assert!(ids_to <= size, "ids_to {ids_to} beyond size {size}");
        // The table holds exactly the rows of the entries before ids_to,
        // plus any slices of a merge under way (never more than the
        // entries committed).
        assert!(
            rows >= 3 * ids_to && rows <= 3 * size,
            "{rows} rows, ids_to {ids_to}, size {size}"
        );
        assert!(
            chains >= ids_to && chains <= size,
            "{chains} chain rows, ids_to {ids_to}, size {size}"
        );
        merged_once |= ids_to > 0;
    }
    assert!(merged_once, "no merge completed in the test");
}

#[test]
fn a_merge_completes_and_the_tables_then_hold_four_rows_per_covered_entry() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.redb");
    let store = Arc::new(RedbStore::open_with(&path, 1 << 24, 8).unwrap());
    let log = open_log(&store);
    let mut a = Agent::new("ids-one");
    // Eight single appends fill a generation; the ninth commit starts the
    // merge and writes all 24 `ids` rows (fewer than one slice) and the 8
    // chain rows with ids_to = 8.
    for _ in 0..9 {
        rt().block_on(log.append(a.next(), now())).unwrap();
    }
    log.shutdown();
    drop(log);
    drop(store);
    assert_eq!(on_disk(&path), (4, 9, 8, 24, 8));
}

#[test]
fn write_index_rows_puts_every_row_in_the_table_and_the_log_still_finds_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.redb");
    let store = Arc::new(RedbStore::open_with(&path, 1 << 24, 1000).unwrap());
    let log = open_log(&store);
    let mut a = Agent::new("ids-flush");
    let records: Vec<Record> = (0..6).map(|_| a.next()).collect();
    let items = records.iter().cloned().map(BatchItem::Record).collect();
    let answers = rt().block_on(log.append_batch(items, now())).unwrap();
    store.write_index_rows().unwrap();
    for (r, got) in records.iter().zip(&answers) {
        let i = got.as_ref().unwrap().entry.index();
        assert_eq!(store.index_of_nonce(&r.nonce).unwrap(), Some(i));
        assert_eq!(store.index_of_record(&r.hash()).unwrap(), Some(i));
    }
    log.shutdown();
    drop(log);
    drop(store);
    assert_eq!(on_disk(&path), (4, 6, 6, 18, 6));
    let store = RedbStore::open_with(&path, 1 << 24, 1000).unwrap();
    for (r, got) in records.iter().zip(&answers) {
        let got = got.as_ref().unwrap();
        let i = got.entry.index();
        assert_eq!(store.index_of_nonce(&r.nonce).unwrap(), Some(i));
        assert_eq!(
            store.index_of_leaf(&got.entry.leaf_hash()).unwrap(),
            Some(i)
        );
        assert_eq!(
            store.agent_indexes(&a.name, r.seq, 1).unwrap(),
            vec![(r.seq, i)]
        );
    }
    assert_eq!(
        store.chain_head(&a.name).unwrap().unwrap().seq,
        records[5].seq
    );
}

#[test]
fn lookups_beside_the_writer_find_every_entry_committed_before_they_began() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(RedbStore::open_with(&dir.path().join("log.redb"), 1 << 24, 3).unwrap());
    let log = open_log(&store);
    // (record, index) of each record whose append returned.
    let committed: Arc<std::sync::Mutex<Vec<(Record, LeafIndex)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|k| {
            let (store, committed, stop) = (store.clone(), committed.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut checked = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let known = committed.lock().unwrap().clone();
                    // The newest entries (in memory, or just merged) and one older.
                    for (r, i) in known.iter().rev().take(4).chain(known.get(k)) {
                        assert_eq!(store.index_of_nonce(&r.nonce).unwrap(), Some(*i));
                        assert_eq!(store.index_of_record(&r.hash()).unwrap(), Some(*i));
                        // Its chain row, and a head at least as far on
                        // whose entry is committed.
                        assert_eq!(
                            store.agent_indexes(&r.agent, r.seq, 1).unwrap(),
                            vec![(r.seq, *i)]
                        );
                        let head = store.chain_head(&r.agent).unwrap().unwrap();
                        assert!(head.seq >= r.seq);
                        assert!(head.index.get() < store.size().unwrap().get());
                        checked += 1;
                    }
                }
                checked
            })
        })
        .collect();
    let mut agents: Vec<Agent> = (0..2).map(|i| Agent::new(&format!("ids-r{i}"))).collect();
    for n in 0..120usize {
        let records: Vec<Record> = (0..1 + n % 4).map(|k| agents[k % 2].next()).collect();
        let items = records.iter().cloned().map(BatchItem::Record).collect();
        let answers = rt().block_on(log.append_batch(items, now())).unwrap();
        let mut c = committed.lock().unwrap();
        for (r, a) in records.iter().zip(answers) {
            c.push((r.clone(), a.unwrap().entry.index()));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let checked: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(checked > 100, "the readers checked only {checked} lookups");
    log.shutdown();
}
