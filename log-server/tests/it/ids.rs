//! Layout 3's deferred `ids` rows (docs/storage.md, "Deferred index rows")
//! on a real redb file: an entry's nonce, record-hash and leaf-hash rows
//! live in memory until a merge writes a generation of them into the
//! table, and opening the file rebuilds the ones not yet written from the
//! entries. Across many merges and reopens, every committed entry is found
//! by all three keys, a replayed nonce is refused, and `meta.ids_to` says
//! which entries the table covers (three rows each).

use crate::common;

use std::path::Path;
use std::sync::Arc;

use common::{now, signer, Agent};
use redb::{ReadableDatabase, ReadableTableMetadata, TableDefinition};
use tally_log::store::redb::RedbStore;
use tally_log::{AppendError, BatchItem, Log, LogConfig, LogStore};
use tally_schemas::{Hash, LeafIndex, Record};

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const IDS: TableDefinition<([u8; 16], u64), ()> = TableDefinition::new("ids");

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

/// (layout, tree size, ids_to, rows in `ids`), read with redb directly.
fn on_disk(path: &Path) -> (u64, u64, u64, u64) {
    let db = redb::Database::open(path).unwrap();
    let tx = db.begin_read().unwrap();
    let meta = tx.open_table(META).unwrap();
    let get = |k: &str| meta.get(k).unwrap().map(|g| g.value()).unwrap();
    let rows = tx.open_table(IDS).unwrap().len().unwrap();
    (get("layout"), get("tree_size"), get("ids_to"), rows)
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
        log.shutdown();
        drop(log);
        drop(store);

        let (layout, size, ids_to, rows) = on_disk(&path);
        assert_eq!(layout, 3);
        assert_eq!(size, committed.len() as u64);
        assert!(ids_to <= size, "ids_to {ids_to} beyond size {size}");
        // The table holds exactly the rows of the entries before ids_to,
        // plus any slices of a merge under way (never more than the
        // entries committed).
        assert!(
            rows >= 3 * ids_to && rows <= 3 * size,
            "{rows} rows, ids_to {ids_to}, size {size}"
        );
        merged_once |= ids_to > 0;
    }
    assert!(merged_once, "no merge completed in the test");
}

#[test]
fn a_merge_completes_and_the_table_then_holds_three_rows_per_covered_entry() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.redb");
    let store = Arc::new(RedbStore::open_with(&path, 1 << 24, 8).unwrap());
    let log = open_log(&store);
    let mut a = Agent::new("ids-one");
    // Eight single appends fill a generation; the ninth commit starts the
    // merge and writes all 24 rows (fewer than one slice) with ids_to = 8.
    for _ in 0..9 {
        rt().block_on(log.append(a.next(), now())).unwrap();
    }
    log.shutdown();
    drop(log);
    drop(store);
    assert_eq!(on_disk(&path), (3, 9, 8, 24));
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
    assert_eq!(on_disk(&path), (3, 6, 6, 18));
    let store = RedbStore::open_with(&path, 1 << 24, 1000).unwrap();
    for (r, got) in records.iter().zip(&answers) {
        let got = got.as_ref().unwrap();
        let i = got.entry.index();
        assert_eq!(store.index_of_nonce(&r.nonce).unwrap(), Some(i));
        assert_eq!(
            store.index_of_leaf(&got.entry.leaf_hash()).unwrap(),
            Some(i)
        );
    }
}

#[test]
fn lookups_beside_the_writer_find_every_entry_committed_before_they_began() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(RedbStore::open_with(&dir.path().join("log.redb"), 1 << 24, 3).unwrap());
    let log = open_log(&store);
    // (nonce, record hash, index) of each record whose append returned.
    let committed: Arc<std::sync::Mutex<Vec<(tally_schemas::Nonce, Hash, LeafIndex)>>> =
        Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|k| {
            let (store, committed, stop) = (store.clone(), committed.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut checked = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let known = committed.lock().unwrap().clone();
                    // The newest entries (in memory, or just merged) and one older.
                    for (nonce, hash, i) in known.iter().rev().take(4).chain(known.get(k)) {
                        assert_eq!(store.index_of_nonce(nonce).unwrap(), Some(*i));
                        assert_eq!(store.index_of_record(hash).unwrap(), Some(*i));
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
            c.push((r.nonce.clone(), r.hash(), a.unwrap().entry.index()));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let checked: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(checked > 100, "the readers checked only {checked} lookups");
    log.shutdown();
}
