//! The in-memory [`LogStore`]: the same contract as the redb backend
//! (docs/storage.md), nothing durable. For tests and benchmarks baselines.
//!
//! "Durable" here means "survives dropping the `Log`": tests share one
//! `Arc<MemoryStore>` across a simulated crash and reopen.
//!
//! Several fronts can share one memory store (`MemoryStore::front`, built
//! for tests), as they share a PostgreSQL database: each front's
//! [`MemoryFront`] holds its own lease token, fences the log's writes
//! with it, and hands requests over through the store, so the failover
//! and fencing logic of `crate::front` runs in fast tests without a
//! database server.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use tally_schemas::{AgentName, Hash, LeafIndex, Nonce, Seq, TreeSize};

use super::{
    check_put_checkpoint, check_put_cosignature, BatchWrite, ChainHead, Found, HandOver, Lease,
    LogStore, Lookup, OpenRow, SharedStore, StoreError,
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

/// The lease row (as PostgreSQL's `log_lease`): the current token, its
/// holder, and whether it is free (released or expired).
struct LeaseRow {
    token: i64,
    holder: String,
    free: bool,
}

impl Default for LeaseRow {
    fn default() -> Self {
        Self {
            token: 0,
            holder: "nobody".into(),
            free: true,
        }
    }
}

/// A handed-over request (as a `tally_pending` row).
struct Request {
    received: i64,
    items: String,
    answers: Option<(String, Instant)>,
}

/// What the fronts of one memory store share besides the log's tables.
#[derive(Default)]
struct Coordination {
    lease: LeaseRow,
    next_id: i64,
    requests: BTreeMap<i64, Request>,
    /// Each front's wake-ups (as each PostgreSQL front LISTENs on its own
    /// connection): requests handed over, answers written.
    listeners: Vec<(Weak<Notify>, Weak<Notify>)>,
}

impl Coordination {
    /// Wakes every live front's `requests` (or `answers`) notification.
    fn wake(&mut self, requests: bool) {
        self.listeners
            .retain(|(r, a)| r.strong_count() > 0 || a.strong_count() > 0);
        for (r, a) in &self.listeners {
            let n = if requests { r } else { a };
            if let Some(n) = n.upgrade() {
                n.notify_one();
            }
        }
    }
}

/// A [`LogStore`] held in memory.
#[derive(Default)]
pub struct MemoryStore {
    state: Mutex<State>,
    coordination: Mutex<Coordination>,
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

    fn coordination(&self) -> Result<MutexGuard<'_, Coordination>, StoreError> {
        self.coordination
            .lock()
            .map_err(|_| StoreError::Backend("memory store lock poisoned".into()))
    }

    /// A front's handle on this store, named `name` in messages; it holds
    /// no lease until [`Lease::try_lease`] takes it. Any number of fronts
    /// may share the store. Tests only: the product shares PostgreSQL.
    #[must_use]
    #[cfg(any(test, feature = "testing"))]
    pub fn front(self: &Arc<Self>, name: &str, ttl: Duration) -> MemoryFront {
        let (requests, answers) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        if let Ok(mut c) = self.coordination() {
            c.listeners
                .push((Arc::downgrade(&requests), Arc::downgrade(&answers)));
        }
        MemoryFront {
            store: Arc::clone(self),
            name: name.to_owned(),
            token: AtomicI64::new(0),
            ttl,
            requests,
            answers,
        }
    }

    /// Ends the lease as if its holder had stopped renewing it (paused
    /// past its expiry, cut off): the holder's writes are fenced from now
    /// on, it learns it lost the lease, and any front may take it. The
    /// memory lease has no clock: it ends only so, or when released.
    /// Tests only.
    #[cfg(any(test, feature = "testing"))]
    pub fn expire_lease(&self) {
        if let Ok(mut c) = self.coordination() {
            c.lease.free = true;
        }
    }
}

/// A front's handle on a [`MemoryStore`] that several fronts share
/// ([`SharedStore`]): it reads the store, writes the log only while it
/// holds the lease (checked under the same lock as the write, so a write
/// after a takeover never lands: [`StoreError::Fenced`]), and hands
/// requests over through the store.
pub struct MemoryFront {
    store: Arc<MemoryStore>,
    name: String,
    token: AtomicI64,
    ttl: Duration,
    requests: Arc<Notify>,
    answers: Arc<Notify>,
}

impl std::fmt::Debug for MemoryFront {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryFront")
            .field("name", &self.name)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl Drop for MemoryFront {
    fn drop(&mut self) {
        // As a PostgreSQL store: a standby takes over at once.
        self.release_lease();
    }
}

impl MemoryFront {
    /// Runs the log's write `f` if this front holds the lease, under the
    /// lease's lock (the fencing check of contract rule 2's writer).
    fn fenced<T>(
        &self,
        f: impl FnOnce(&MemoryStore) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let c = self.store.coordination()?;
        let mine = self.token.load(Ordering::SeqCst);
        if mine == 0 || c.lease.free || c.lease.token != mine {
            return Err(StoreError::Fenced(format!(
                "this process no longer holds the log's lease (its token was {mine}); \
                 another sequencer may have taken over"
            )));
        }
        let out = f(&self.store);
        drop(c);
        out
    }
}

impl LogStore for MemoryFront {
    fn size(&self) -> Result<TreeSize, StoreError> {
        self.store.size()
    }

    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, StoreError> {
        self.store.read_hashes(indexes)
    }

    fn entries(&self, start: LeafIndex, end: LeafIndex) -> Result<Vec<Vec<u8>>, StoreError> {
        self.store.entries(start, end)
    }

    fn receipt_size(&self, index: LeafIndex) -> Result<Option<TreeSize>, StoreError> {
        self.store.receipt_size(index)
    }

    fn checkpoint(&self, size: TreeSize) -> Result<Option<String>, StoreError> {
        self.store.checkpoint(size)
    }

    fn latest_checkpoint(&self) -> Result<Option<(TreeSize, String)>, StoreError> {
        self.store.latest_checkpoint()
    }

    fn chain_head(&self, agent: &AgentName) -> Result<Option<ChainHead>, StoreError> {
        self.store.chain_head(agent)
    }

    fn agent_indexes(
        &self,
        agent: &AgentName,
        from: Seq,
        limit: usize,
    ) -> Result<Vec<(Seq, LeafIndex)>, StoreError> {
        self.store.agent_indexes(agent, from, limit)
    }

    fn index_of_nonce(&self, nonce: &Nonce) -> Result<Option<LeafIndex>, StoreError> {
        self.store.index_of_nonce(nonce)
    }

    fn index_of_record(&self, record_hash: &Hash) -> Result<Option<LeafIndex>, StoreError> {
        self.store.index_of_record(record_hash)
    }

    fn index_of_leaf(&self, leaf_hash: &Hash) -> Result<Option<LeafIndex>, StoreError> {
        self.store.index_of_leaf(leaf_hash)
    }

    fn lookup(&self, lookups: &[Lookup<'_>]) -> Result<Vec<Found>, StoreError> {
        self.store.lookup(lookups)
    }

    fn commit_batch(&self, batch: &BatchWrite) -> Result<(), StoreError> {
        self.fenced(|s| s.commit_batch(batch))
    }

    fn put_checkpoint(&self, size: TreeSize, note: &str) -> Result<(), StoreError> {
        self.fenced(|s| s.put_checkpoint(size, note))
    }

    fn put_cosignature(
        &self,
        size: TreeSize,
        cosigner: &str,
        line: &str,
    ) -> Result<(), StoreError> {
        self.fenced(|s| s.put_cosignature(size, cosigner, line))
    }

    fn cosignatures(&self, size: TreeSize) -> Result<Vec<(String, String)>, StoreError> {
        self.store.cosignatures(size)
    }

    fn shared(self: Arc<Self>) -> Option<Arc<dyn SharedStore>> {
        Some(self)
    }
}

impl Lease for MemoryFront {
    fn try_lease(&self) -> Result<bool, StoreError> {
        if self.lease_token() != 0 {
            return Ok(true);
        }
        let mut c = self.store.coordination()?;
        if !c.lease.free {
            return Ok(false);
        }
        c.lease = LeaseRow {
            token: c.lease.token + 1,
            holder: self.name.clone(),
            free: false,
        };
        self.token.store(c.lease.token, Ordering::SeqCst);
        Ok(true)
    }

    fn release_lease(&self) {
        let mine = self.token.swap(0, Ordering::SeqCst);
        if let Ok(mut c) = self.store.coordination() {
            if mine != 0 && c.lease.token == mine {
                c.lease.free = true;
            }
        }
    }

    /// 0 once the lease expired or another front took it: a lost lease is
    /// not taken again here (a PostgreSQL store's renewal takes an expired
    /// one again if nobody else did); the front tries it as any other.
    fn lease_token(&self) -> i64 {
        let mine = self.token.load(Ordering::SeqCst);
        if mine == 0 {
            return 0;
        }
        let held = self
            .store
            .coordination()
            .is_ok_and(|c| !c.lease.free && c.lease.token == mine);
        if held {
            mine
        } else {
            let _ = self
                .token
                .compare_exchange(mine, 0, Ordering::SeqCst, Ordering::SeqCst);
            0
        }
    }

    fn lease_ttl(&self) -> Duration {
        self.ttl
    }

    fn lease_holder(&self) -> Result<String, StoreError> {
        let c = self.store.coordination()?;
        Ok(format!(
            "{} (token {}{})",
            c.lease.holder,
            c.lease.token,
            if c.lease.free { ", expired" } else { "" }
        ))
    }
}

impl HandOver for MemoryFront {
    fn pending_insert(
        &self,
        _front: &str,
        requests: &[(i64, String)],
    ) -> Result<Vec<i64>, StoreError> {
        let mut c = self.store.coordination()?;
        let mut ids = Vec::with_capacity(requests.len());
        for (received, items) in requests {
            c.next_id += 1;
            let id = c.next_id;
            c.requests.insert(
                id,
                Request {
                    received: *received,
                    items: items.clone(),
                    answers: None,
                },
            );
            ids.push(id);
        }
        c.wake(true);
        Ok(ids)
    }

    fn pending_open(&self, skip: &[i64], limit: i64) -> Result<Vec<OpenRow>, StoreError> {
        let c = self.store.coordination()?;
        Ok(c.requests
            .iter()
            .filter(|(id, r)| r.answers.is_none() && !skip.contains(id))
            .take(usize::try_from(limit).unwrap_or(0))
            .map(|(id, r)| (*id, r.received, r.items.clone()))
            .collect())
    }

    fn pending_answer(&self, answers: &[(i64, String)]) -> Result<(), StoreError> {
        let mut c = self.store.coordination()?;
        for (id, text) in answers {
            if let Some(r) = c.requests.get_mut(id) {
                r.answers
                    .get_or_insert_with(|| (text.clone(), Instant::now()));
            }
        }
        c.wake(false);
        Ok(())
    }

    fn pending_answers(&self, ids: &[i64]) -> Result<Vec<(i64, String)>, StoreError> {
        let c = self.store.coordination()?;
        Ok(ids
            .iter()
            .filter_map(|id| {
                let (text, _) = c.requests.get(id)?.answers.as_ref()?;
                Some((*id, text.clone()))
            })
            .collect())
    }

    fn pending_delete(&self, ids: &[i64], older_than_secs: f64) -> Result<u64, StoreError> {
        let mut c = self.store.coordination()?;
        let before = c.requests.len();
        let keep = Duration::try_from_secs_f64(older_than_secs).unwrap_or(Duration::ZERO);
        c.requests.retain(|id, r| match &r.answers {
            Some((_, at)) => !ids.contains(id) && at.elapsed() < keep,
            None => true,
        });
        Ok((before - c.requests.len()) as u64)
    }

    fn on_requests(&self) -> Result<Arc<Notify>, StoreError> {
        Ok(Arc::clone(&self.requests))
    }

    fn on_answers(&self) -> Result<Arc<Notify>, StoreError> {
        Ok(Arc::clone(&self.answers))
    }
}

impl SharedStore for MemoryFront {
    fn log_store(self: Arc<Self>) -> Arc<dyn LogStore> {
        self
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
