//! A fault-injecting [`LogStore`] wrapper (docs/storage.md, "Testing the
//! contract"), for tally-log's tests only (feature `log-store`): it fails
//! writes on demand, including a write that returns an error but still
//! lands, the lost-acknowledgement case a real disk or network filesystem
//! can produce. Reads pass through.
//!
//! Wrapping a front of a shared store ([`FaultyStore::shared`], over a
//! memory store's front), it is a [`SharedStore`] too, and fails the
//! lease's and the hand-over's operations on demand as well (docs/storage.md,
//! "Several fronts: the `Lease` and `HandOver` traits"): taking, renewing
//! or giving up the lease, a holder left with a stale token, and each
//! hand-over call.
//!
//! An injected fault is reported as [`StoreError::Backend`], as a backend
//! that fails reports itself, with a message that starts with `injected`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tally_schemas::{AgentName, Hash, LeafIndex, Nonce, Seq, TreeSize};

use tally_log::store::{
    BatchWrite, ChainHead, Found, HandOver, Lease, LogStore, Lookup, OpenRow, SharedStore,
    StoreError,
};

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

/// A lease or hand-over operation of a [`FaultyStore::shared`] store, which
/// faults can be scripted for ([`FaultyStore::script_shared`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SharedOp {
    /// [`Lease::try_lease`]: `Fail` refuses without trying; `FailAfterLanding`
    /// takes the lease (if it can) and then reports failure.
    TryLease,
    /// The holder's renewal, which [`Lease::lease_token`] reports on:
    /// `Fail` is a renewal that kept failing until the lease ran out (the
    /// lease lapses: the holder's token goes to 0, its writes are fenced
    /// and any front may take the lease); `FailAfterLanding` is a renewal
    /// that landed but reported failure (nothing changes: the holder
    /// renews again).
    Renew,
    /// [`Lease::release_lease`]: `Fail` leaves the lease held until it is
    /// expired; `FailAfterLanding` gives it up (the call reports nothing).
    Release,
    /// [`HandOver::pending_insert`].
    PendingInsert,
    /// [`HandOver::pending_open`] (a read: both faults fail it).
    PendingOpen,
    /// [`HandOver::pending_answer`].
    PendingAnswer,
    /// [`HandOver::pending_answers`] (a read: both faults fail it).
    PendingAnswers,
    /// [`HandOver::pending_delete`].
    PendingDelete,
}

struct Plan {
    script: VecDeque<Fault>,
    shared_script: HashMap<SharedOp, VecDeque<Fault>>,
    shared_log: Vec<(SharedOp, Fault)>,
    /// The token [`Lease::lease_token`] keeps reporting, if set: a holder
    /// whose renewal has not yet learned that the lease was lost.
    stale: Option<i64>,
    /// xorshift64 state for random faults; 0 = no random faults.
    rng: u64,
    per_mille: u64,
    log: Vec<(WriteKind, Fault)>,
}

/// Wraps another store and injects write faults.
pub struct FaultyStore {
    inner: Arc<dyn LogStore>,
    /// The same store as a shared one, when it wraps a front.
    shared: Option<Arc<dyn SharedStore>>,
    plan: Mutex<Plan>,
}

fn injected(landed: &str) -> StoreError {
    StoreError::Backend(format!("injected storage fault ({landed})"))
}

impl FaultyStore {
    /// Wraps `inner`; no faults until some are scripted or enabled.
    #[must_use]
    pub fn new(inner: Arc<dyn LogStore>) -> Self {
        Self {
            inner,
            shared: None,
            plan: Mutex::new(Plan {
                script: VecDeque::new(),
                shared_script: HashMap::new(),
                shared_log: Vec::new(),
                stale: None,
                rng: 0,
                per_mille: 0,
                log: Vec::new(),
            }),
        }
    }

    /// Wraps `front`, a front of a store several fronts share: the log
    /// opens a front over it ([`LogStore::shared`]), and faults can be
    /// scripted for its lease and hand-over operations as well.
    #[must_use]
    pub fn shared(front: Arc<dyn SharedStore>) -> Self {
        let mut store = Self::new(Arc::clone(&front).log_store());
        store.shared = Some(front);
        store
    }

    /// Queues faults for the next calls of `op`, in order.
    pub fn script_shared(&self, op: SharedOp, faults: impl IntoIterator<Item = Fault>) {
        if let Ok(mut p) = self.plan.lock() {
            p.shared_script.entry(op).or_default().extend(faults);
        }
    }

    /// Every lease and hand-over operation so far that had a fault
    /// scripted, and the fault it got.
    #[must_use]
    pub fn shared_history(&self) -> Vec<(SharedOp, Fault)> {
        self.plan
            .lock()
            .map(|p| p.shared_log.clone())
            .unwrap_or_default()
    }

    /// While `stale`, [`Lease::lease_token`] keeps answering the token this
    /// store holds now, whatever happens to the lease: a holder paused
    /// before its renewal could learn that the lease was lost. Its front
    /// goes on sequencing; the store must fence every write it makes.
    pub fn stale_token(&self, stale: bool) {
        let token = if stale {
            self.shared.as_ref().map(|s| s.lease_token())
        } else {
            None
        };
        if let Ok(mut p) = self.plan.lock() {
            p.stale = token;
        }
    }

    fn shared_fault(&self, op: SharedOp) -> Fault {
        let Ok(mut p) = self.plan.lock() else {
            return Fault::Fail;
        };
        let fault = p.shared_script.get_mut(&op).and_then(VecDeque::pop_front);
        match fault {
            Some(f) => {
                p.shared_log.push((op, f));
                f
            }
            None => Fault::Pass,
        }
    }

    fn front(&self) -> Result<&Arc<dyn SharedStore>, StoreError> {
        self.shared.as_ref().ok_or_else(|| {
            StoreError::Backend("this fault-injecting store wraps no shared store".into())
        })
    }

    /// A hand-over call with `op`'s next fault.
    fn hand_over<T>(
        &self,
        op: SharedOp,
        call: impl FnOnce(&dyn SharedStore) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let front = self.front()?;
        let read = matches!(op, SharedOp::PendingOpen | SharedOp::PendingAnswers);
        match self.shared_fault(op) {
            Fault::Pass => call(front.as_ref()),
            Fault::FailAfterLanding if !read => {
                call(front.as_ref())?;
                Err(injected("landed"))
            }
            Fault::Fail | Fault::FailAfterLanding => Err(injected("did not land")),
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
            Fault::Fail => Err(injected("did not land")),
            Fault::FailAfterLanding => {
                op()?;
                Err(injected("landed"))
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

    fn shared(self: Arc<Self>) -> Option<Arc<dyn SharedStore>> {
        if self.shared.is_some() {
            Some(self)
        } else {
            None
        }
    }
}

impl Lease for FaultyStore {
    fn try_lease(&self) -> Result<bool, StoreError> {
        let front = self.front()?;
        match self.shared_fault(SharedOp::TryLease) {
            Fault::Pass => front.try_lease(),
            Fault::Fail => Err(injected("did not land")),
            Fault::FailAfterLanding => {
                front.try_lease()?;
                Err(injected("landed"))
            }
        }
    }

    fn release_lease(&self) {
        let Some(front) = &self.shared else {
            return;
        };
        match self.shared_fault(SharedOp::Release) {
            Fault::Pass | Fault::FailAfterLanding => front.release_lease(),
            Fault::Fail => {}
        }
    }

    fn lease_token(&self) -> i64 {
        let Some(front) = &self.shared else {
            return 0;
        };
        if let Some(stale) = self.plan.lock().ok().and_then(|p| p.stale) {
            return stale;
        }
        let token = front.lease_token();
        if token == 0 {
            return 0;
        }
        match self.shared_fault(SharedOp::Renew) {
            Fault::Pass | Fault::FailAfterLanding => token,
            Fault::Fail => {
                // Renewals failed until the lease ran out: it lapses, as
                // an expired PostgreSQL lease that another front takes.
                front.release_lease();
                front.lease_token()
            }
        }
    }

    fn lease_ttl(&self) -> std::time::Duration {
        self.shared
            .as_ref()
            .map_or(std::time::Duration::from_secs(10), |front| {
                front.lease_ttl()
            })
    }

    fn lease_holder(&self) -> Result<String, StoreError> {
        self.front()?.lease_holder()
    }
}

impl HandOver for FaultyStore {
    fn pending_insert(
        &self,
        front: &str,
        requests: &[(i64, String)],
    ) -> Result<Vec<i64>, StoreError> {
        self.hand_over(SharedOp::PendingInsert, |s| {
            s.pending_insert(front, requests)
        })
    }

    fn pending_open(&self, skip: &[i64], limit: i64) -> Result<Vec<OpenRow>, StoreError> {
        self.hand_over(SharedOp::PendingOpen, |s| s.pending_open(skip, limit))
    }

    fn pending_answer(&self, answers: &[(i64, String)]) -> Result<(), StoreError> {
        self.hand_over(SharedOp::PendingAnswer, |s| s.pending_answer(answers))
    }

    fn pending_answers(&self, ids: &[i64]) -> Result<Vec<(i64, String)>, StoreError> {
        self.hand_over(SharedOp::PendingAnswers, |s| s.pending_answers(ids))
    }

    fn pending_delete(&self, ids: &[i64], older_than_secs: f64) -> Result<u64, StoreError> {
        self.hand_over(SharedOp::PendingDelete, |s| {
            s.pending_delete(ids, older_than_secs)
        })
    }

    fn on_requests(&self) -> Result<Arc<tokio::sync::Notify>, StoreError> {
        self.front()?.on_requests()
    }

    fn on_answers(&self) -> Result<Arc<tokio::sync::Notify>, StoreError> {
        self.front()?.on_answers()
    }
}

impl SharedStore for FaultyStore {
    fn log_store(self: Arc<Self>) -> Arc<dyn LogStore> {
        self
    }
}
