//! The in-memory [`LogStore`]: the same contract as the redb backend
//! (docs/storage.md), nothing durable. For tests and benchmarks baselines.
//!
//! "Durable" here means "survives dropping the `Log`": tests share one
//! `Arc<MemoryStore>` across a simulated crash and reopen.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

use tally_schemas::{AgentName, Hash, LeafIndex, Nonce, Seq, TreeSize};

use super::{
    check_put_checkpoint, check_put_cosignature, BatchWrite, ChainHead, LogStore, StoreError,
};

#[derive(Default)]
struct State {
    hashes: Vec<Hash>,
    entries: Vec<Vec<u8>>,
    receipt_sizes: Vec<TreeSize>,
    checkpoints: BTreeMap<u64, String>,
    cosignatures: BTreeMap<(u64, String), String>,
    heads: HashMap<AgentName, ChainHead>,
    agent_seq: BTreeMap<(String, u64), LeafIndex>,
    nonces: HashMap<Vec<u8>, LeafIndex>,
    records: HashMap<Hash, LeafIndex>,
    leaves: HashMap<Hash, LeafIndex>,
}

/// A [`LogStore`] held in memory.
#[derive(Default)]
pub struct MemoryStore {
    state: Mutex<State>,
}

impl MemoryStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> Result<MutexGuard<'_, State>, StoreError> {
        self.state
            .lock()
            .map_err(|_| StoreError::Backend("memory store lock poisoned".into()))
    }
}

impl LogStore for MemoryStore {
    fn size(&self) -> Result<TreeSize, StoreError> {
        Ok(TreeSize::new(self.lock()?.entries.len() as u64))
    }

    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, StoreError> {
        let s = self.lock()?;
        indexes
            .iter()
            .map(|&i| {
                usize::try_from(i)
                    .ok()
                    .and_then(|i| s.hashes.get(i).copied())
                    .ok_or_else(|| StoreError::Corrupt(format!("stored hash {i} is missing")))
            })
            .collect()
    }

    fn entries(&self, start: LeafIndex, end: LeafIndex) -> Result<Vec<Vec<u8>>, StoreError> {
        let s = self.lock()?;
        let len = s.entries.len() as u64;
        let (a, b) = (start.get().min(len), end.get().min(len));
        if a >= b {
            return Ok(Vec::new());
        }
        Ok(s.entries[a as usize..b as usize].to_vec())
    }

    fn receipt_size(&self, index: LeafIndex) -> Result<Option<TreeSize>, StoreError> {
        let s = self.lock()?;
        Ok(usize::try_from(index.get())
            .ok()
            .and_then(|i| s.receipt_sizes.get(i).copied()))
    }

    fn checkpoint(&self, size: TreeSize) -> Result<Option<String>, StoreError> {
        Ok(self.lock()?.checkpoints.get(&size.get()).cloned())
    }

    fn latest_checkpoint(&self) -> Result<Option<(TreeSize, String)>, StoreError> {
        Ok(self
            .lock()?
            .checkpoints
            .last_key_value()
            .map(|(k, v)| (TreeSize::new(*k), v.clone())))
    }

    fn chain_head(&self, agent: &AgentName) -> Result<Option<ChainHead>, StoreError> {
        Ok(self.lock()?.heads.get(agent).cloned())
    }

    fn agent_indexes(
        &self,
        agent: &AgentName,
        from: Seq,
        limit: usize,
    ) -> Result<Vec<(Seq, LeafIndex)>, StoreError> {
        let s = self.lock()?;
        let name = agent.as_str().to_owned();
        s.agent_seq
            .range((name.clone(), from.get())..=(name, u64::MAX))
            .take(limit)
            .map(|((_, seq), index)| {
                Seq::new(*seq)
                    .map(|seq| (seq, *index))
                    .map_err(|e| StoreError::Corrupt(e.to_string()))
            })
            .collect()
    }

    fn index_of_nonce(&self, nonce: &Nonce) -> Result<Option<LeafIndex>, StoreError> {
        Ok(self.lock()?.nonces.get(nonce.as_bytes()).copied())
    }

    fn index_of_record(&self, record_hash: &Hash) -> Result<Option<LeafIndex>, StoreError> {
        Ok(self.lock()?.records.get(record_hash).copied())
    }

    fn index_of_leaf(&self, leaf_hash: &Hash) -> Result<Option<LeafIndex>, StoreError> {
        Ok(self.lock()?.leaves.get(leaf_hash).copied())
    }

    fn commit_batch(&self, batch: &BatchWrite) -> Result<(), StoreError> {
        batch.check_shape()?;
        let mut s = self.lock()?;
        if s.entries.len() as u64 != batch.old_size.get() {
            return Err(StoreError::Conflict(format!(
                "batch extends size {}, the stored size is {}",
                batch.old_size,
                s.entries.len()
            )));
        }
        if s.hashes.len() as u64 != tlog_tiles::stored_hash_count(batch.old_size.get()) {
            return Err(StoreError::Corrupt(
                "stored hash count does not match the tree size".into(),
            ));
        }
        s.hashes.extend_from_slice(&batch.hashes);
        for e in &batch.entries {
            s.entries.push(e.canonical.clone());
            s.receipt_sizes.push(batch.receipt_size);
            s.agent_seq
                .insert((e.agent.as_str().to_owned(), e.seq.get()), e.index);
            s.nonces.insert(e.nonce.as_bytes().to_vec(), e.index);
            s.records.insert(e.record_hash, e.index);
            s.leaves.insert(e.leaf_hash, e.index);
            // Entries of one agent come in seq order (checked above), so
            // the last one is the head.
            s.heads.insert(
                e.agent.clone(),
                ChainHead {
                    seq: e.seq,
                    record_hash: e.record_hash,
                    index: e.index,
                },
            );
        }
        Ok(())
    }

    fn put_checkpoint(&self, size: TreeSize, note: &str) -> Result<(), StoreError> {
        let mut s = self.lock()?;
        let latest = s
            .checkpoints
            .last_key_value()
            .map(|(k, _)| TreeSize::new(*k));
        let tree_size = TreeSize::new(s.entries.len() as u64);
        let existing = s.checkpoints.get(&size.get()).map(String::as_str);
        if check_put_checkpoint(size, note, tree_size, existing, latest)? {
            return Ok(());
        }
        s.checkpoints.insert(size.get(), note.to_owned());
        Ok(())
    }

    fn put_cosignature(
        &self,
        size: TreeSize,
        cosigner: &str,
        line: &str,
    ) -> Result<(), StoreError> {
        let mut s = self.lock()?;
        let key = (size.get(), cosigner.to_owned());
        let stored = s.checkpoints.contains_key(&size.get());
        let existing = s.cosignatures.get(&key).map(String::as_str);
        if check_put_cosignature(size, cosigner, line, stored, existing)? {
            return Ok(());
        }
        s.cosignatures.insert(key, line.to_owned());
        Ok(())
    }

    fn cosignatures(&self, size: TreeSize) -> Result<Vec<(String, String)>, StoreError> {
        let s = self.lock()?;
        Ok(s.cosignatures
            .range((size.get(), String::new())..)
            .take_while(|((k, _), _)| *k == size.get())
            .map(|((_, c), l)| (c.clone(), l.clone()))
            .collect())
    }
}
