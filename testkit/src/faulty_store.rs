//! A fault-injecting [`LogStore`] wrapper (docs/storage.md, "Testing the
//! contract"), for tally-log's tests only (feature `log-store`): it fails writes on demand, including a write that returns an
//! error but still lands, the lost-acknowledgement case a real disk or network
//! filesystem can produce. Reads pass through.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tally_schemas::{AgentName, Hash, LeafIndex, Nonce, Seq, TreeSize};

use tally_log::store::{BatchWrite, ChainHead, Found, LogStore, Lookup, StoreError};

/// What happens to one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The write goes through.
    Pass,
    /// The write fails and does not land.
    Fail,
    /// The write lands, then reports failure.
    FailAfterLanding,
}

/// Which write a fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    /// [`LogStore::commit_batch`].
    Batch,
    /// [`LogStore::put_checkpoint`].
    Checkpoint,
    /// [`LogStore::put_cosignature`].
    Cosignature,
}

struct Plan {
    script: VecDeque<Fault>,
    /// xorshift64 state for random faults; 0 = no random faults.
    rng: u64,
    per_mille: u64,
    log: Vec<(WriteKind, Fault)>,
}

/// Wraps another store and injects write faults.
pub struct FaultyStore {
    inner: Arc<dyn LogStore>,
    plan: Mutex<Plan>,
}

impl FaultyStore {
    /// Wraps `inner`; no faults until some are scripted or enabled.
    #[must_use]
    pub fn new(inner: Arc<dyn LogStore>) -> Self {
        Self {
            inner,
            plan: Mutex::new(Plan {
                script: VecDeque::new(),
                rng: 0,
                per_mille: 0,
                log: Vec::new(),
            }),
        }
    }

    /// Queues faults for the next writes, in order; after the script runs
    /// out, random faults (if enabled) apply.
    pub fn script(&self, faults: impl IntoIterator<Item = Fault>) {
        if let Ok(mut p) = self.plan.lock() {
            p.script.extend(faults);
        }
    }

    /// Fails about `per_mille`/1000 of the writes, half of those after
    /// landing, deterministically from `seed`.
    pub fn random_faults(&self, seed: u64, per_mille: u64) {
        if let Ok(mut p) = self.plan.lock() {
            p.rng = seed | 1;
            p.per_mille = per_mille.min(1000);
        }
    }

    /// Every write so far and the fault it got.
    #[must_use]
    pub fn history(&self) -> Vec<(WriteKind, Fault)> {
        self.plan.lock().map(|p| p.log.clone()).unwrap_or_default()
    }

    fn next_fault(&self, kind: WriteKind) -> Fault {
        let Ok(mut p) = self.plan.lock() else {
            return Fault::Fail;
        };
        let fault = if let Some(f) = p.script.pop_front() {
            f
        } else if p.rng != 0 {
            let mut x = p.rng;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            p.rng = x;
            match x % 2000 {
                r if r < p.per_mille => Fault::Fail,
                r if r < 2 * p.per_mille => Fault::FailAfterLanding,
                _ => Fault::Pass,
            }
        } else {
            Fault::Pass
        };
        p.log.push((kind, fault));
        fault
    }

    fn write(
        &self,
        kind: WriteKind,
        op: impl FnOnce() -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        match self.next_fault(kind) {
            Fault::Pass => op(),
            Fault::Fail => Err(StoreError::Injected {
                landed: "did not land",
            }),
            Fault::FailAfterLanding => {
                op()?;
                Err(StoreError::Injected { landed: "landed" })
            }
        }
    }
}

impl LogStore for FaultyStore {
    fn size(&self) -> Result<TreeSize, StoreError> {
        self.inner.size()
    }
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, StoreError> {
        self.inner.read_hashes(indexes)
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
    fn index_of_record(&self, record_hash: &Hash) -> Result<Option<LeafIndex>, StoreError> {
        self.inner.index_of_record(record_hash)
    }
    fn index_of_leaf(&self, leaf_hash: &Hash) -> Result<Option<LeafIndex>, StoreError> {
        self.inner.index_of_leaf(leaf_hash)
    }
    fn lookup(&self, lookups: &[Lookup<'_>]) -> Result<Vec<Found>, StoreError> {
        self.inner.lookup(lookups)
    }
    fn sync(&self) -> Result<(), StoreError> {
        self.inner.sync()
    }
    fn commit_batch(&self, batch: &BatchWrite) -> Result<(), StoreError> {
        self.write(WriteKind::Batch, || self.inner.commit_batch(batch))
    }
    fn put_checkpoint(&self, size: TreeSize, note: &str) -> Result<(), StoreError> {
        self.write(WriteKind::Checkpoint, || {
            self.inner.put_checkpoint(size, note)
        })
    }
    fn put_cosignature(
        &self,
        size: TreeSize,
        cosigner: &str,
        line: &str,
    ) -> Result<(), StoreError> {
        self.write(WriteKind::Cosignature, || {
            self.inner.put_cosignature(size, cosigner, line)
        })
    }
    fn cosignatures(&self, size: TreeSize) -> Result<Vec<(String, String)>, StoreError> {
        self.inner.cosignatures(size)
    }
}
