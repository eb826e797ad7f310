//! Write faults, crashes mid-batch and overload, over the fault-injecting
//! backend (docs/storage.md "The `LogStore` contract", "Recovery"): a
//! failed write that did or did not land never loses an acknowledged entry,
//! never yields two receipts for one record, and never leads to two
//! inconsistent checkpoints.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{now, signer, Agent, AppendOne};
use tally_log::store::memory::MemoryStore;
use tally_log::store::{BatchWrite, ChainHead};
use tally_log::{AppendError, Log, LogConfig, LogStore, OpenError, SignedCheckpoint, StoreError};
use tally_schemas::note::open_checkpoint;
use tally_schemas::tree::verify_consistency;
use tally_schemas::{AgentName, Hash, LeafIndex, Nonce, Record, Seq, TreeSize};
use tally_testkit::faulty_store::{Fault, FaultyStore, WriteKind};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Every stored checkpoint is signed and consistent with the latest one.
fn assert_checkpoints_consistent(log: &Log, store: &dyn LogStore) {
    let latest = log.latest_checkpoint();
    let mut seen = 0;
    for size in 0..=latest.checkpoint.size.get() {
        let Some(note) = store.checkpoint(TreeSize::new(size)).unwrap() else {
            continue;
        };
        seen += 1;
        let cp = open_checkpoint(&note, signer().verifier()).unwrap();
        assert_eq!(cp.size.get(), size);
        if size == 0 {
            continue;
        }
        let (_, proof) = log.consistency_proof(cp.size, None).unwrap();
        verify_consistency(
            cp.size,
            latest.checkpoint.size,
            &cp.root,
            &latest.checkpoint.root,
            &proof,
        )
        .unwrap();
    }
    assert!(seen > 0);
}

fn scripted(faults: &[Fault]) -> (Arc<MemoryStore>, Arc<FaultyStore>) {
    let inner = Arc::new(MemoryStore::new());
    let faulty = Arc::new(FaultyStore::new(inner.clone()));
    faulty.script(faults.iter().copied());
    (inner, faulty)
}

#[test]
fn every_write_fault_is_survived_by_retrying_the_same_record() {
    // Opening an empty log writes the size-0 checkpoint: one Pass first.
    for (fault, landed_batch) in [
        (vec![Fault::Pass, Fault::Fail], false),
        (vec![Fault::Pass, Fault::FailAfterLanding], true),
        (vec![Fault::Pass, Fault::Pass, Fault::Fail], true),
        (
            vec![Fault::Pass, Fault::Pass, Fault::FailAfterLanding],
            true,
        ),
    ] {
        let (inner, faulty) = scripted(&fault);
        let log = Log::open(faulty.clone(), signer(), LogConfig::default()).unwrap();
        let mut a = Agent::new("alpha");
        let r0 = a.next();
        rt().block_on(async {
            let err = log.append(r0.clone(), now()).await.unwrap_err();
            assert!(
                matches!(&err, AppendError::Storage(StoreError::Backend(m)) if m.starts_with("injected")),
                "{fault:?}: {err}"
            );
            // Nothing unsigned is visible, whether or not the batch landed.
            assert_eq!(log.latest_checkpoint().checkpoint.size, TreeSize::new(0));
            assert_eq!(
                inner.size().unwrap(),
                TreeSize::new(u64::from(landed_batch))
            );
            let again = log.append(r0.clone(), now()).await.unwrap();
            assert_eq!(again.duplicate, landed_batch, "{fault:?}");
            assert_eq!(again.entry.index(), LeafIndex::new(0));
            again.receipt.verify(&r0, signer().verifier()).unwrap();
            let third = log.append(r0.clone(), now()).await.unwrap();
            assert_eq!(third.receipt, again.receipt, "{fault:?}");
            let r1 = a.next();
            let got = log.append(r1.clone(), now()).await.unwrap();
            assert_eq!(got.entry.index(), LeafIndex::new(1));
        });
        let kinds: Vec<WriteKind> = faulty.history().iter().map(|(k, _)| *k).collect();
        assert_eq!(kinds[0], WriteKind::Checkpoint);
        assert_checkpoints_consistent(&log, faulty.as_ref());
    }
}

#[test]
fn a_crash_between_commit_and_checkpoint_recovers_and_signs_the_landed_batch() {
    // The batch lands but its checkpoint write fails; then the process "dies".
    // Writes: checkpoint 0, batch 1, checkpoint 1, batch 2, checkpoint 2 (fails).
    let (inner, faulty) = scripted(&[
        Fault::Pass,
        Fault::Pass,
        Fault::Pass,
        Fault::Pass,
        Fault::Fail,
    ]);
    let mut a = Agent::new("alpha");
    let records: Vec<Record> = (0..3).map(|_| a.next()).collect();
    {
        let log = Log::open(faulty.clone(), signer(), LogConfig::default()).unwrap();
        rt().block_on(async {
            log.append(records[0].clone(), now()).await.unwrap();
            let err = log.append(records[1].clone(), now()).await.unwrap_err();
            assert!(matches!(err, AppendError::Storage(_)), "{err}");
        });
        assert_eq!(log.latest_checkpoint().checkpoint.size, TreeSize::new(1));
        // Dropped without shutdown: the crash.
    }
    assert_eq!(inner.size().unwrap(), TreeSize::new(2));
    assert_eq!(
        inner.latest_checkpoint().unwrap().unwrap().0,
        TreeSize::new(1)
    );
    let log = Log::open(inner.clone(), signer(), LogConfig::default()).unwrap();
    assert_eq!(log.latest_checkpoint().checkpoint.size, TreeSize::new(2));
    rt().block_on(async {
        let again = log.append(records[1].clone(), now()).await.unwrap();
        assert!(again.duplicate);
        let (cp, _) = again
            .receipt
            .verify(&records[1], signer().verifier())
            .unwrap();
        assert_eq!(cp.size, TreeSize::new(2));
        log.append(records[2].clone(), now()).await.unwrap();
    });
    assert_checkpoints_consistent(&log, inner.as_ref());
}

#[test]
fn random_faults_never_lose_an_acknowledged_entry_or_sign_inconsistent_checkpoints() {
    let inner = Arc::new(MemoryStore::new());
    let faulty = Arc::new(FaultyStore::new(inner.clone()));
    let log = Log::open(faulty.clone(), signer(), LogConfig::default()).unwrap();
    faulty.random_faults(0x5eed, 150);
    let mut agents: Vec<Agent> = (0..4).map(|i| Agent::new(&format!("agent-{i}"))).collect();
    let mut acked = Vec::new();
    let mut observed: Vec<Arc<SignedCheckpoint>> = Vec::new();
    rt().block_on(async {
        for round in 0..200 {
            let ag = &mut agents[round % 4];
            let r = ag.next();
            let mut attempts = 0;
            loop {
                attempts += 1;
                match log.append(r.clone(), now()).await {
                    Ok(got) => {
                        acked.push((r.clone(), got.receipt));
                        break;
                    }
                    Err(AppendError::Storage(_)) if attempts < 50 => continue,
                    Err(e) => panic!("round {round}: {e}"),
                }
            }
            observed.push(log.latest_checkpoint());
        }
    });
    let faults = faulty
        .history()
        .iter()
        .filter(|(_, f)| *f != Fault::Pass)
        .count();
    assert!(faults > 20, "only {faults} faults injected");
    assert_eq!(log.latest_checkpoint().checkpoint.size, TreeSize::new(200));
    let latest = log.latest_checkpoint();
    for (r, receipt) in &acked {
        let (cp, entry) = receipt.verify(r, signer().verifier()).unwrap();
        assert_eq!(log.entry(entry.index()).unwrap().unwrap(), entry);
        let (_, proof) = log.consistency_proof(cp.size, None).unwrap();
        verify_consistency(
            cp.size,
            latest.checkpoint.size,
            &cp.root,
            &latest.checkpoint.root,
            &proof,
        )
        .unwrap();
    }
    for cp in &observed {
        if cp.checkpoint.size.get() > 0 {
            assert_eq!(log.root(cp.checkpoint.size).unwrap(), cp.checkpoint.root);
        }
    }
    assert_checkpoints_consistent(&log, inner.as_ref());
}

/// A store whose batch commits wait on a gate the test holds, and which
/// can be made to lie about its size or its hashes.
struct TestStore {
    inner: MemoryStore,
    gate: Mutex<()>,
    entered: AtomicBool,
    size_override: Mutex<Option<TreeSize>>,
    flip_hashes: AtomicBool,
}

impl TestStore {
    fn new(inner: MemoryStore) -> Self {
        Self {
            inner,
            gate: Mutex::new(()),
            entered: AtomicBool::new(false),
            size_override: Mutex::new(None),
            flip_hashes: AtomicBool::new(false),
        }
    }
}

impl LogStore for TestStore {
    fn size(&self) -> Result<TreeSize, StoreError> {
        match *self.size_override.lock().unwrap() {
            Some(size) => Ok(size),
            None => self.inner.size(),
        }
    }
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, StoreError> {
        let hashes = self.inner.read_hashes(indexes)?;
        if self.flip_hashes.load(Ordering::SeqCst) {
            return Ok(hashes.iter().map(|h| Hash::sha256(h.as_bytes())).collect());
        }
        Ok(hashes)
    }
    fn entries(&self, start: LeafIndex, end: LeafIndex) -> Result<Vec<Vec<u8>>, StoreError> {
        self.inner.entries(start, end)
    }
    fn receipt_size(&self, index: LeafIndex) -> Result<Option<TreeSize>, StoreError> {
        self.inner.receipt_size(index)
    }
    fn checkpoint(&self, size: TreeSize) -> Result<Option<String>, StoreError> {
        self.inner.checkpoint(size)
    }
    fn latest_checkpoint(&self) -> Result<Option<(TreeSize, String)>, StoreError> {
        self.inner.latest_checkpoint()
    }
    fn chain_head(&self, agent: &AgentName) -> Result<Option<ChainHead>, StoreError> {
        self.inner.chain_head(agent)
    }
    fn agent_indexes(
        &self,
        agent: &AgentName,
        from: Seq,
        limit: usize,
    ) -> Result<Vec<(Seq, LeafIndex)>, StoreError> {
        self.inner.agent_indexes(agent, from, limit)
    }
    fn index_of_nonce(&self, nonce: &Nonce) -> Result<Option<LeafIndex>, StoreError> {
        self.inner.index_of_nonce(nonce)
    }
    fn index_of_record(&self, h: &Hash) -> Result<Option<LeafIndex>, StoreError> {
        self.inner.index_of_record(h)
    }
    fn index_of_leaf(&self, h: &Hash) -> Result<Option<LeafIndex>, StoreError> {
        self.inner.index_of_leaf(h)
    }
    fn commit_batch(&self, batch: &BatchWrite) -> Result<(), StoreError> {
        self.entered.store(true, Ordering::SeqCst);
        let _g = self.gate.lock().unwrap();
        self.inner.commit_batch(batch)
    }
    fn put_checkpoint(&self, size: TreeSize, note: &str) -> Result<(), StoreError> {
        self.inner.put_checkpoint(size, note)
    }
    fn put_cosignature(
        &self,
        size: TreeSize,
        cosigner: &str,
        line: &str,
    ) -> Result<(), StoreError> {
        self.inner.put_cosignature(size, cosigner, line)
    }
    fn cosignatures(&self, size: TreeSize) -> Result<Vec<(String, String)>, StoreError> {
        self.inner.cosignatures(size)
    }
}

#[test]
fn a_full_queue_refuses_at_once_with_overloaded_and_loses_nothing() {
    let store = Arc::new(TestStore::new(MemoryStore::new()));
    let config = LogConfig {
        queue_capacity: 2,
        max_batch: 8,
        ..LogConfig::default()
    };
    let log = Arc::new(Log::open(store.clone(), signer(), config).unwrap());
    // One agent per record: the queued ones may reach the queue in any order.
    let records: Vec<Record> = (0..4)
        .map(|i| Agent::new(&format!("agent-{i}")).next())
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let gate = store.gate.lock().unwrap();
    // The first append is taken by the writer, which blocks in its commit.
    let first = runtime.spawn({
        let (log, r) = (log.clone(), records[0].clone());
        async move { log.append(r, now()).await }
    });
    while !store.entered.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Two more fill the queue.
    let queued: Vec<_> = records[1..3]
        .iter()
        .map(|r| {
            let (log, r) = (log.clone(), r.clone());
            runtime.spawn(async move { log.append(r, now()).await })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    // The fourth is refused at once, while the writer is still blocked.
    let refused = runtime.block_on(log.append(records[3].clone(), now()));
    assert_eq!(
        refused.unwrap_err(),
        AppendError::Overloaded { capacity: 2 }
    );
    drop(gate);
    let first = runtime.block_on(first).unwrap().unwrap();
    assert_eq!(first.entry.index(), LeafIndex::new(0));
    for (k, q) in queued.into_iter().enumerate() {
        let got = runtime.block_on(q).unwrap().unwrap();
        got.receipt
            .verify(&records[k + 1], signer().verifier())
            .unwrap();
    }
    // The refused record was not written; it can be sent again.
    let got = runtime
        .block_on(log.append(records[3].clone(), now()))
        .unwrap();
    assert_eq!(got.entry.index(), LeafIndex::new(3));
    assert_eq!(
        log.stats().largest_batch,
        2,
        "the two queued appends commit together"
    );
}

#[test]
fn a_store_that_does_not_match_what_was_signed_is_refused_at_open() {
    let store = Arc::new(TestStore::new(MemoryStore::new()));
    {
        let log = Log::open(store.clone(), signer(), LogConfig::default()).unwrap();
        let mut a = Agent::new("alpha");
        rt().block_on(async {
            for _ in 0..3 {
                log.append(a.next(), now()).await.unwrap();
            }
        });
        log.shutdown();
    }
    // Entries covered by a signed checkpoint are gone.
    *store.size_override.lock().unwrap() = Some(TreeSize::new(2));
    assert_eq!(
        Log::open(store.clone(), signer(), LogConfig::default()).unwrap_err(),
        OpenError::CheckpointBeyondStorage {
            checkpoint_size: TreeSize::new(3),
            tree_size: TreeSize::new(2)
        }
    );
    *store.size_override.lock().unwrap() = None;
    // Stored hashes changed under the signed root.
    store.flip_hashes.store(true, Ordering::SeqCst);
    assert!(matches!(
        Log::open(store.clone(), signer(), LogConfig::default()).unwrap_err(),
        OpenError::RootMismatch { size, .. } if size == TreeSize::new(3)
    ));
    store.flip_hashes.store(false, Ordering::SeqCst);
    // The store itself refuses a second, different checkpoint for a size.
    let (size, _) = store.latest_checkpoint().unwrap().unwrap();
    assert!(matches!(
        store.put_checkpoint(size, "forged"),
        Err(StoreError::Conflict(_))
    ));
    let log = Log::open(store.clone(), signer(), LogConfig::default()).unwrap();
    assert_eq!(log.latest_checkpoint().checkpoint.size, TreeSize::new(3));
}
