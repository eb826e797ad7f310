//! Migration of a layout 1 log file to layout 2 (docs/storage.md,
//! "Migration from layout 1"), on the fixture made by the layout 1 release
//! through `tally serve` (testdata/storage-v1/, see its README): every
//! stored hash, receipt size, chain row, index and checkpoint reads back
//! the same after the migration, also when it was stopped half-way, and the
//! migrated log opens (recovery proves it against its signed checkpoint)
//! and rebuilds every receipt the old release issued, byte for byte.

use std::path::{Path, PathBuf};

use redb::{ReadableDatabase, ReadableTable, TableDefinition, TableHandle};
use tally_log::store::redb::RedbStore;
use tally_log::store::redb_v1::migrate_steps;
use tally_log::{Log, LogConfig, LogStore};
use tally_schemas::pack::PackLine;
use tally_schemas::{AgentName, Hash, LeafIndex, Nonce, NoteSigner, Seq, TreeSize};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/storage-v1")
}

/// A copy of the fixture's log file in a temporary folder.
fn copy_fixture(dir: &Path) -> PathBuf {
    let path = dir.join("log.redb");
    std::fs::copy(fixture().join("data/log.redb"), &path).unwrap();
    path
}

/// A layout 1 `heads` row: agent → (seq, record hash, leaf index).
type HeadRow = (String, (u64, [u8; 32], u64));

/// Everything layout 1 holds, read with redb directly.
#[derive(Debug, PartialEq)]
struct V1 {
    size: u64,
    entries: Vec<Vec<u8>>,
    hashes: Vec<[u8; 32]>,
    receipt_sizes: Vec<u64>,
    checkpoints: Vec<(u64, String)>,
    heads: Vec<HeadRow>,
    agent_seq: Vec<((String, u64), u64)>,
    nonces: Vec<(Vec<u8>, u64)>,
    records: Vec<([u8; 32], u64)>,
    leaves: Vec<([u8; 32], u64)>,
}

fn read_v1(path: &Path) -> V1 {
    let db = redb::Database::open(path).unwrap();
    let tx = db.begin_read().unwrap();
    let meta = tx
        .open_table(TableDefinition::<&str, u64>::new("meta"))
        .unwrap();
    assert_eq!(meta.get("layout").unwrap().unwrap().value(), 1);
    let size = meta.get("tree_size").unwrap().unwrap().value();
    macro_rules! all {
        ($def:expr, |$k:ident, $v:ident| $map:expr) => {{
            let t = tx.open_table($def).unwrap();
            t.iter()
                .unwrap()
                .map(|row| {
                    let (k, v) = row.unwrap();
                    let ($k, $v) = (k.value(), v.value());
                    $map
                })
                .collect::<Vec<_>>()
        }};
    }
    V1 {
        size,
        entries: all!(TableDefinition::<u64, &[u8]>::new("entries"), |_k, v| v
            .to_vec()),
        hashes: all!(TableDefinition::<u64, [u8; 32]>::new("hashes"), |_k, v| v),
        receipt_sizes: all!(TableDefinition::<u64, u64>::new("receipt_sizes"), |_k, v| v),
        checkpoints: all!(TableDefinition::<u64, &str>::new("checkpoints"), |k, v| (
            k,
            v.to_owned()
        )),
        heads: all!(
            TableDefinition::<&str, (u64, [u8; 32], u64)>::new("chain_heads"),
            |k, v| (k.to_owned(), v)
        ),
        agent_seq: all!(
            TableDefinition::<(&str, u64), u64>::new("agent_seq"),
            |k, v| ((k.0.to_owned(), k.1), v)
        ),
        nonces: all!(TableDefinition::<&[u8], u64>::new("nonces"), |k, v| (
            k.to_vec(),
            v
        )),
        records: all!(
            TableDefinition::<[u8; 32], u64>::new("record_hashes"),
            |k, v| (k, v)
        ),
        leaves: all!(
            TableDefinition::<[u8; 32], u64>::new("leaf_hashes"),
            |k, v| (k, v)
        ),
    }
}

/// Checks that `store` (layout 2) answers everything `v1` held.
fn assert_same(store: &RedbStore, v1: &V1) {
    assert_eq!(store.size().unwrap(), TreeSize::new(v1.size));
    assert_eq!(v1.entries.len() as u64, v1.size);
    assert_eq!(
        store
            .entries(LeafIndex::new(0), LeafIndex::new(v1.size))
            .unwrap(),
        v1.entries
    );
    let all: Vec<u64> = (0..v1.hashes.len() as u64).collect();
    let hashes: Vec<[u8; 32]> = store
        .read_hashes(&all)
        .unwrap()
        .iter()
        .map(|h| *h.as_bytes())
        .collect();
    assert_eq!(hashes, v1.hashes, "stored hashes");
    for (i, want) in v1.receipt_sizes.iter().enumerate() {
        assert_eq!(
            store.receipt_size(LeafIndex::new(i as u64)).unwrap(),
            Some(TreeSize::new(*want))
        );
    }
    for (size, note) in &v1.checkpoints {
        assert_eq!(
            store.checkpoint(TreeSize::new(*size)).unwrap().as_ref(),
            Some(note)
        );
    }
    assert_eq!(
        store
            .latest_checkpoint()
            .unwrap()
            .map(|(s, n)| (s.get(), n)),
        v1.checkpoints.last().cloned()
    );
    for (agent, (seq, hash, index)) in &v1.heads {
        let head = store
            .chain_head(&AgentName::new(agent).unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                head.seq.get(),
                *head.record_hash.as_bytes(),
                head.index.get()
            ),
            (*seq, *hash, *index)
        );
    }
    for ((agent, seq), index) in &v1.agent_seq {
        let rows = store
            .agent_indexes(&AgentName::new(agent).unwrap(), Seq::new(*seq).unwrap(), 1)
            .unwrap();
        assert_eq!(
            rows,
            vec![(Seq::new(*seq).unwrap(), LeafIndex::new(*index))]
        );
    }
    for (nonce, index) in &v1.nonces {
        let nonce = Nonce::from_bytes(nonce.clone()).unwrap();
        assert_eq!(
            store.index_of_nonce(&nonce).unwrap(),
            Some(LeafIndex::new(*index))
        );
    }
    for (hash, index) in &v1.records {
        assert_eq!(
            store.index_of_record(&Hash::from_bytes(*hash)).unwrap(),
            Some(LeafIndex::new(*index))
        );
    }
    for (hash, index) in &v1.leaves {
        assert_eq!(
            store.index_of_leaf(&Hash::from_bytes(*hash)).unwrap(),
            Some(LeafIndex::new(*index))
        );
    }
}

fn tables(path: &Path) -> Vec<String> {
    let db = redb::Database::open(path).unwrap();
    let tx = db.begin_read().unwrap();
    let mut names: Vec<String> = tx
        .list_tables()
        .unwrap()
        .map(|t| t.name().to_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn the_layout_1_fixture_migrates_and_answers_everything_it_held() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_fixture(dir.path());
    let v1 = read_v1(&path);
    assert!(
        v1.size >= 20 && v1.checkpoints.len() > 5,
        "the fixture is too small"
    );
    let store = RedbStore::open(&path).unwrap();
    assert_same(&store, &v1);
    drop(store);
    assert_eq!(
        tables(&path),
        [
            "chains",
            "checkpoints",
            "cosignatures",
            "entries",
            "ids",
            "leaves",
            "meta"
        ]
    );
    // Opening again does nothing more.
    assert_same(&RedbStore::open(&path).unwrap(), &v1);
}

#[test]
fn a_migration_stopped_half_way_is_still_layout_1_and_the_next_open_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_fixture(dir.path());
    let v1 = read_v1(&path);
    {
        let db = redb::Database::open(&path).unwrap();
        assert!(
            !migrate_steps(&db, 4, 3).unwrap(),
            "12 entries of {}",
            v1.size
        );
    }
    // The old tables are untouched: a layout 1 build could still open it.
    assert_eq!(read_v1(&path), v1);
    assert_same(&RedbStore::open(&path).unwrap(), &v1);
}

#[test]
fn the_migrated_log_opens_and_rebuilds_every_receipt_the_old_release_issued() {
    let dir = tempfile::tempdir().unwrap();
    let path = copy_fixture(dir.path());
    let skey = std::fs::read_to_string(fixture().join("data/log.skey")).unwrap();
    let signer = NoteSigner::from_skey(skey.trim()).unwrap();
    let log = Log::open_redb(&path, signer, LogConfig::default()).unwrap();
    let pack = std::fs::read(fixture().join("pack.jsonl")).unwrap();
    let lines: Vec<PackLine> = pack
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| PackLine::from_json(l).unwrap())
        .collect();
    // The checkpoint notes the old release stored, by size.
    let notes: std::collections::HashMap<u64, String> = lines
        .iter()
        .filter_map(|l| match l {
            PackLine::Checkpoint(c) => Some((
                tally_schemas::note::peek_checkpoint(&c.checkpoint)
                    .unwrap()
                    .size
                    .get(),
                c.checkpoint.clone(),
            )),
            _ => None,
        })
        .collect();
    let mut checked = 0;
    for line in &lines {
        if let PackLine::Record(r) = line {
            let witnessed = r.witnessed.as_ref().unwrap();
            let issued = r.receipt.as_ref().unwrap();
            let (entry, rebuilt) = log.receipt(witnessed.index).unwrap().unwrap();
            assert_eq!(entry.record().hash(), r.record.hash());
            assert_eq!(entry.received(), witnessed.received);
            assert_eq!(
                (rebuilt.record_hash, &rebuilt.nonce, rebuilt.index),
                (issued.record_hash, &issued.nonce, issued.index)
            );
            // The very note the old release issued the receipt under.
            assert_eq!(
                Some(&rebuilt.checkpoint),
                notes.get(&issued.tree_size.get()),
                "receipt of {}",
                witnessed.index
            );
            rebuilt.verify(&r.record, log.verifier()).unwrap();
            checked += 1;
        }
    }
    assert_eq!(checked, 31);
    log.shutdown();
}
