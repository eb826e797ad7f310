//! The record journal end to end with the recorder and the store: what a
//! run could not commit is committed by the next `ChainStore::open`, and a
//! journal that does not continue the stored chain is refused, never
//! merged; receipts stored without a sync of the file are written out when
//! the store closes.

use std::path::Path;
use std::sync::Arc;

use tally_gateway::journal::{self, Journal};
use tally_gateway::recorder::Recorder;
use tally_gateway::store::{journal_path, Appended, ChainStore, ChainWriter, StoreError};
use tally_schemas::record::NoteBody;
use tally_schemas::time::SystemClock;
use tally_schemas::{AgentName, Body, Hash, SecretKey, Seq, UnixMillis};

/// A store that reads fine but refuses every commit.
struct Refusing(Arc<ChainStore>);

impl ChainWriter for Refusing {
    fn head(&self) -> Result<Option<(Seq, Hash, UnixMillis)>, StoreError> {
        self.0.head()
    }
    fn append(&self, _: &[Appended]) -> Result<(), StoreError> {
        Err(StoreError::Db("injected: Read-only file system".into()))
    }
}

fn note(text: &str) -> Body {
    Body::Note(NoteBody { text: text.into() })
}

/// Appends `n` notes through a durable recorder.
fn durable_notes(path: &Path, n: usize) {
    let store = Arc::new(ChainStore::open(path).unwrap());
    let r = Recorder::start(
        AgentName::new("j-bot").unwrap(),
        SecretKey::from_seed(&[2; 32]),
        Arc::new(SystemClock),
        Arc::clone(&store),
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    for i in 0..n {
        rt.block_on(r.handle().append(note(&format!("durable {i}")), None))
            .unwrap();
    }
    r.close();
}

/// Appends `n` notes through a journaled recorder whose store refuses every
/// commit, so they stay in the journal only.
fn journaled_notes(path: &Path, n: usize) {
    let store = Arc::new(ChainStore::open(path).unwrap());
    let r = Recorder::start_journaled(
        AgentName::new("j-bot").unwrap(),
        SecretKey::from_seed(&[2; 32]),
        Arc::new(SystemClock),
        Refusing(Arc::clone(&store)),
        Journal::open(&journal_path(path)).unwrap(),
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // One at a time: after the first commit fails, appends are refused.
    for i in 0..n {
        rt.block_on(r.handle().append(note(&format!("journaled {i}")), None))
            .unwrap();
    }
    r.close();
}

#[test]
fn records_a_run_could_not_commit_are_committed_by_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chain.redb");
    durable_notes(&path, 2);
    journaled_notes(&path, 1);
    assert_eq!(
        journal::read(&journal_path(&path)).unwrap().records.len(),
        1
    );

    let store = ChainStore::open(&path).unwrap();
    assert_eq!(store.recovered_from_journal().records, 1);
    let records = store.records(0, 10).unwrap();
    assert_eq!(records.len(), 3);
    assert_eq!(records[2].prev, Some(records[1].hash()));
    assert_eq!(
        serde_json::to_value(&records[2].body).unwrap()["text"],
        "journaled 0"
    );
    assert!(journal::read(&journal_path(&path))
        .unwrap()
        .records
        .is_empty());
    drop(store);

    // The chain goes on from the recovered head.
    durable_notes(&path, 1);
    let store = ChainStore::open(&path).unwrap();
    let records = store.records(0, 10).unwrap();
    assert_eq!(records.len(), 4);
    assert_eq!(records[3].prev, Some(records[2].hash()));
}

#[test]
fn a_journal_that_does_not_continue_the_stored_chain_is_refused() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let (pa, pb) = (a.path().join("chain.redb"), b.path().join("chain.redb"));
    // Chain A: one durable record, then one only in the journal.
    durable_notes(&pa, 1);
    journaled_notes(&pa, 1);
    // Chain B: a different record at seq 0, and A's journal beside it.
    durable_notes(&pb, 1);
    std::fs::copy(journal_path(&pa), journal_path(&pb)).unwrap();
    match ChainStore::open(&pb) {
        Err(StoreError::Corrupt(m)) => assert!(m.contains("does not continue"), "{m}"),
        other => panic!("{other:?}"),
    }
    // B's journal is left as it was, for a person to look at.
    assert_eq!(journal::read(&journal_path(&pb)).unwrap().records.len(), 1);

    // A journal whose record at a stored seq differs from the stored one.
    let c = tempfile::tempdir().unwrap();
    let pc = c.path().join("chain.redb");
    durable_notes(&pc, 2);
    std::fs::copy(journal_path(&pa), journal_path(&pc)).unwrap();
    match ChainStore::open(&pc) {
        Err(StoreError::Corrupt(m)) => assert!(m.contains("different record at seq 1"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn receipts_stored_without_a_sync_are_written_out_when_the_store_closes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chain.redb");
    durable_notes(&path, 3);
    {
        let store = ChainStore::open(&path).unwrap();
        assert_eq!(
            store
                .put_receipts_deferred(&[(0, b"r0"), (1, b"r1")])
                .unwrap(),
            2
        );
        assert_eq!(store.receipt(1).unwrap().as_deref(), Some(&b"r1"[..]));
    }
    {
        let store = ChainStore::open(&path).unwrap();
        assert_eq!(store.sync_cursor().unwrap(), 2);
        assert_eq!(store.receipt(0).unwrap().as_deref(), Some(&b"r0"[..]));
        store.put_receipts_deferred(&[(2, b"r2")]).unwrap();
        store.persist().unwrap();
        // Nothing left to write out: no second commit.
        store.persist().unwrap();
    }
    let store = ChainStore::open(&path).unwrap();
    assert_eq!(store.sync_cursor().unwrap(), 3);
    assert_eq!(store.receipt(2).unwrap().as_deref(), Some(&b"r2"[..]));
}
