//! The log engine: one sequencer (a single writer thread with group commit),
//! checkpoint signing and crash recovery, and the Rust read API the witness
//! uses. docs/protocol.md §7–§8 (entries, checkpoints, receipts) and
//! docs/storage.md ("Write path", "Recovery").
//!
//! Order of operations for a batch, and why:
//! 1. Classify each queued record against storage plus the batch so far:
//!    retry of a committed record, replayed nonce, chain conflict, or new.
//! 2. Commit the new entries, their stored hashes, index rows and receipt
//!    sizes in one durable transaction (compare-and-swap on the tree size).
//! 3. Prove the new tree consistent with the last signed checkpoint, sign a
//!    checkpoint over the new size, and store it durably. Nothing is signed
//!    over state that is not on disk.
//! 4. Only then resolve each append with its entry and receipt.
//!
//! After any storage error the writer re-reads storage and runs recovery
//! (the same as at open) before the next batch, since a failed write may have
//! landed.

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::thread::JoinHandle;

use tally_schemas::entry::RECEIPT_VERSION;
use tally_schemas::limits::MAX_COUNTER;
use tally_schemas::note::open_checkpoint;
use tally_schemas::tree::verify_consistency;
use tally_schemas::{
    AgentName, Checkpoint, Entry, Hash, LeafIndex, Nonce, NoteSigner, NoteVerifier, Receipt,
    Record, Seq, TreeSize, UnixMillis,
};
use tokio::sync::{mpsc, oneshot};

use crate::error::{AppendError, OpenError, ProofRequestError, ReadError};
use crate::store::redb::RedbStore;
use crate::store::{BatchWrite, ChainHead, Found, LogStore, Lookup, NewEntry, StoreError};
use crate::tree::{self, StoredHashes};

/// Tuning of the sequencer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    /// Appends that may wait for the writer; beyond this, `Overloaded`.
    pub queue_capacity: usize,
    /// Most records committed in one transaction.
    pub max_batch: usize,
    /// The redb store's page cache in bytes ([`Log::open_redb`] only). redb
    /// reads through its own cache, which otherwise grows to 1 GiB as reads
    /// (exports, proofs) touch the file; the OS page cache still holds what
    /// does not fit.
    pub cache_bytes: usize,
}

/// The default [`LogConfig::cache_bytes`]: 64 MiB.
pub const DEFAULT_CACHE_BYTES: usize = 64 * 1024 * 1024;

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            queue_capacity: 8192,
            max_batch: 2048,
            cache_bytes: DEFAULT_CACHE_BYTES,
        }
    }
}

/// A checkpoint the log signed and stored, with its note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedCheckpoint {
    /// The parsed body.
    pub checkpoint: Checkpoint,
    /// The signed note, as served at `/checkpoint`.
    pub note: String,
}

/// A resolved append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// The entry (for a retry: the entry first committed).
    pub entry: Entry,
    /// The receipt (for a retry: byte-for-byte the receipt first issued).
    pub receipt: Receipt,
    /// Whether the record was already in the log.
    pub duplicate: bool,
}

/// Counters of the sequencer, for benchmarks and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogStats {
    /// Transactions that committed new entries.
    pub batches: u64,
    /// Entries committed.
    pub entries: u64,
    /// The largest number of entries committed in one transaction.
    pub largest_batch: u64,
}

/// One entry of an agent's chain, for exports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainEntry {
    /// The entry.
    pub entry: Entry,
    /// The size of the checkpoint its receipt was issued under.
    pub receipt_size: TreeSize,
}

/// A queued append ([`Log::enqueue`]): resolves once the record is durably
/// committed and covered by a signed checkpoint, or refused.
#[derive(Debug)]
#[must_use = "the append is queued either way; await it for the receipt"]
pub struct PendingAppend {
    rx: oneshot::Receiver<Result<Appended, AppendError>>,
}

impl Future for PendingAppend {
    type Output = Result<Appended, AppendError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.map_err(|_| AppendError::Closed).and_then(|a| a))
    }
}

struct Job {
    record: Record,
    received: UnixMillis,
    reply: oneshot::Sender<Result<Appended, AppendError>>,
}

#[derive(Default)]
struct Stats {
    batches: AtomicU64,
    entries: AtomicU64,
    largest: AtomicU64,
}

struct Shared {
    store: Arc<dyn LogStore>,
    signer: NoteSigner,
    latest: RwLock<Arc<SignedCheckpoint>>,
    stats: Stats,
}

/// The durable Merkle log. Open it over a store with [`Log::open`]; append
/// with [`Log::append`]; read with the other methods (blocking: call them from
/// a blocking thread in async code). There is no auth and no admission here:
/// the caller has already checked the record's signature, key and time.
pub struct Log {
    shared: Arc<Shared>,
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    capacity: usize,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("origin", &self.origin())
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl Log {
    /// Opens the log over `store`: recovers to the last committed state,
    /// checks the root recomputed from storage against the last signed
    /// checkpoint and proves the stored tree consistent with it, signs a
    /// checkpoint over the stored size if none covers it (including size 0
    /// for a new log), then starts the sequencer thread.
    ///
    /// The origin line of every checkpoint is the signer's key name.
    ///
    /// # Errors
    /// [`OpenError`] when storage fails or does not extend what was signed.
    pub fn open(
        store: Arc<dyn LogStore>,
        signer: NoteSigner,
        config: LogConfig,
    ) -> Result<Self, OpenError> {
        let latest = recover(store.as_ref(), &signer)?;
        let size = latest.checkpoint.size;
        let shared = Arc::new(Shared {
            store,
            signer,
            latest: RwLock::new(Arc::new(latest)),
            stats: Stats::default(),
        });
        let capacity = config.queue_capacity.max(1);
        let (tx, rx) = mpsc::channel(capacity);
        let writer_shared = Arc::clone(&shared);
        let max_batch = config.max_batch.max(1);
        let handle = std::thread::Builder::new()
            .name("tally-log-sequencer".into())
            .spawn(move || run_writer(&writer_shared, rx, max_batch, size))
            .map_err(|e| {
                OpenError::Store(StoreError::Backend(format!(
                    "cannot start the sequencer thread: {e}"
                )))
            })?;
        Ok(Self {
            shared,
            queue: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(handle)),
            capacity,
        })
    }

    /// Opens (or creates) a redb log file at `path`; see [`Log::open`].
    ///
    /// # Errors
    /// [`OpenError`] as for [`Log::open`], or when the file cannot be opened.
    pub fn open_redb(
        path: &Path,
        signer: NoteSigner,
        config: LogConfig,
    ) -> Result<Self, OpenError> {
        let store = RedbStore::open_with_cache(path, config.cache_bytes)?;
        Self::open(Arc::new(store), signer, config)
    }

    /// Queues `record`, received at `received`, and resolves once it is
    /// durably committed and covered by a stored, signed checkpoint.
    ///
    /// A record already in the log resolves to its existing entry and its
    /// original receipt (`duplicate: true`), whatever `received` says.
    ///
    /// # Errors
    /// [`AppendError::Overloaded`] at once when the queue is full;
    /// [`AppendError::NonceReplayed`], [`AppendError::ChainConflict`],
    /// [`AppendError::Entry`] for refused records; [`AppendError::Storage`]
    /// when storage failed (retrying is safe); [`AppendError::Closed`] after
    /// [`Log::shutdown`].
    pub async fn append(
        &self,
        record: Record,
        received: UnixMillis,
    ) -> Result<Appended, AppendError> {
        self.enqueue(record, received)?.await
    }

    /// Queues `record` now, synchronously, and returns a future of its
    /// append (see [`Log::append`]). Records are sequenced in the order they
    /// are queued, so a caller that stamps receive times and enqueues under
    /// one lock gets receive times that never decrease in log order.
    ///
    /// # Errors
    /// [`AppendError::Overloaded`] when the queue is full;
    /// [`AppendError::Closed`] after [`Log::shutdown`]. The future resolves
    /// to the other errors of [`Log::append`].
    pub fn enqueue(
        &self,
        record: Record,
        received: UnixMillis,
    ) -> Result<PendingAppend, AppendError> {
        let (reply, rx) = oneshot::channel();
        let queue = self.queue.lock().map_err(|_| AppendError::Closed)?;
        let Some(sender) = queue.as_ref() else {
            return Err(AppendError::Closed);
        };
        sender
            .try_send(Job {
                record,
                received,
                reply,
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => AppendError::Overloaded {
                    capacity: self.capacity,
                },
                mpsc::error::TrySendError::Closed(_) => AppendError::Closed,
            })?;
        Ok(PendingAppend { rx })
    }

    /// Stops taking appends, lets the writer finish the queued ones, and
    /// waits for it (blocking). Dropping a `Log` without this is safe (every
    /// batch is atomic); this only makes the store free to reopen at once.
    pub fn shutdown(&self) {
        if let Ok(mut q) = self.queue.lock() {
            q.take();
        }
        let handle = self.writer.lock().ok().and_then(|mut w| w.take());
        if let Some(h) = handle {
            if h.join().is_err() {
                tracing::error!("the sequencer thread panicked");
            }
            // The last checkpoint note was stored without a sync of its own.
            if let Err(e) = self.shared.store.sync() {
                tracing::warn!(error = %e, "syncing the store at shutdown failed; recovery will re-sign the last checkpoint");
            }
        }
    }

    /// The log's origin (its key name).
    #[must_use]
    pub fn origin(&self) -> &str {
        self.shared.signer.verifier().name()
    }

    /// The log's checkpoint verifier key.
    #[must_use]
    pub fn verifier(&self) -> &NoteVerifier {
        self.shared.signer.verifier()
    }

    /// The latest signed checkpoint (always stored before it is shown here).
    #[must_use]
    pub fn latest_checkpoint(&self) -> Arc<SignedCheckpoint> {
        latest(&self.shared)
    }

    /// Counters of the sequencer.
    #[must_use]
    pub fn stats(&self) -> LogStats {
        let s = &self.shared.stats;
        LogStats {
            batches: s.batches.load(Ordering::Relaxed),
            entries: s.entries.load(Ordering::Relaxed),
            largest_batch: s.largest.load(Ordering::Relaxed),
        }
    }

    /// The store (read access for tools and tests).
    #[must_use]
    pub fn store(&self) -> &Arc<dyn LogStore> {
        &self.shared.store
    }

    /// The head of `agent`'s chain as committed. It may be one batch ahead of
    /// the latest checkpoint while that batch's checkpoint is being signed.
    ///
    /// # Errors
    /// [`StoreError`] when storage fails.
    pub fn chain_head(&self, agent: &AgentName) -> Result<Option<ChainHead>, StoreError> {
        self.shared.store.chain_head(agent)
    }

    /// The entry at `index`, if the latest checkpoint covers it.
    ///
    /// # Errors
    /// [`ReadError`] when storage fails or the entry does not parse.
    pub fn entry(&self, index: LeafIndex) -> Result<Option<Entry>, ReadError> {
        if !self.latest_checkpoint().checkpoint.size.contains(index) {
            return Ok(None);
        }
        read_entry(self.shared.store.as_ref(), index)
    }

    /// The tree size of the checkpoint the receipt for `index` was issued
    /// under, if the latest checkpoint covers `index`.
    ///
    /// # Errors
    /// [`StoreError`] when storage fails.
    pub fn receipt_size(&self, index: LeafIndex) -> Result<Option<TreeSize>, StoreError> {
        if !self.latest_checkpoint().checkpoint.size.contains(index) {
            return Ok(None);
        }
        self.shared.store.receipt_size(index)
    }

    /// The receipt issued for the entry at `index` (the same bytes every time).
    ///
    /// # Errors
    /// [`ReadError`] when storage fails or is inconsistent.
    pub fn receipt(&self, index: LeafIndex) -> Result<Option<(Entry, Receipt)>, ReadError> {
        if !self.latest_checkpoint().checkpoint.size.contains(index) {
            return Ok(None);
        }
        stored_receipt(self.shared.store.as_ref(), &self.shared.signer, index)
    }

    /// The index of the record with `record_hash`, if the latest checkpoint covers it.
    ///
    /// # Errors
    /// [`StoreError`] when storage fails.
    pub fn index_of_record(&self, record_hash: &Hash) -> Result<Option<LeafIndex>, StoreError> {
        let size = self.latest_checkpoint().checkpoint.size;
        Ok(self
            .shared
            .store
            .index_of_record(record_hash)?
            .filter(|i| size.contains(*i)))
    }

    /// The signed checkpoint note stored for `size`.
    ///
    /// # Errors
    /// [`StoreError`] when storage fails.
    pub fn checkpoint_note(&self, size: TreeSize) -> Result<Option<String>, StoreError> {
        self.shared.store.checkpoint(size)
    }

    /// The entries of `agent`'s chain with `from <= seq < to` (to the end
    /// when `to` is `None`), in seq order, read from storage a page at a time.
    /// Entries past the latest checkpoint are left out.
    #[must_use]
    pub fn chain_entries(&self, agent: &AgentName, from: Seq, to: Option<Seq>) -> ChainEntries {
        ChainEntries {
            store: Arc::clone(&self.shared.store),
            agent: agent.clone(),
            next: Some(from),
            to,
            limit: self.latest_checkpoint().checkpoint.size,
            page: Vec::new(),
        }
    }

    /// The first seq of `agent`'s chain received at or after `t`, among its
    /// first `len` records (`len` when none is). Records the latest
    /// checkpoint does not cover yet count as received after every `t`. A
    /// chain's records are appended in seq order and receive times never
    /// decrease in log order, so this is a binary search of about log2(len)
    /// point reads, where a time range would otherwise scan the chain.
    ///
    /// # Errors
    /// [`ReadError`] when storage fails, or the chain has fewer than `len`
    /// records.
    pub fn chain_seq_received_from(
        &self,
        agent: &AgentName,
        len: u64,
        t: UnixMillis,
    ) -> Result<u64, ReadError> {
        let (mut lo, mut hi) = (0u64, len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self
                .chain_entry(agent, mid)?
                .is_some_and(|e| e.received() < t)
            {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    /// The entry of `agent`'s record `seq`, or `None` while the latest
    /// checkpoint does not cover it (a chain head can be one batch ahead).
    ///
    /// # Errors
    /// [`ReadError`] when storage fails, or the chain has no record `seq`.
    pub fn chain_entry(&self, agent: &AgentName, seq: u64) -> Result<Option<Entry>, ReadError> {
        let from = Seq::new(seq).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        match self.shared.store.agent_indexes(agent, from, 1)?.first() {
            Some((s, index)) if s.get() == seq => self.entry(*index),
            _ => Err(ReadError::Store(StoreError::Corrupt(format!(
                "{agent} has no record {seq}"
            )))),
        }
    }

    /// The RFC 9162 inclusion proof of leaf `index` in the tree of `size`
    /// (the latest checkpoint's size when `None`). Any size up to the latest
    /// checkpoint's is served: stored hashes never change.
    ///
    /// # Errors
    /// [`ProofRequestError`] for sizes or indexes out of range, or storage failure.
    pub fn inclusion_proof(
        &self,
        index: LeafIndex,
        size: Option<TreeSize>,
    ) -> Result<(TreeSize, Vec<Hash>), ProofRequestError> {
        let size = self.proof_size(size)?;
        if !size.contains(index) {
            return Err(ProofRequestError::IndexBeyondSize { index, size });
        }
        Ok((
            size,
            tree::inclusion_proof(self.shared.store.as_ref(), index, size)?,
        ))
    }

    /// The inclusion proof of the entry with `leaf_hash`; see [`Log::inclusion_proof`].
    ///
    /// # Errors
    /// [`ProofRequestError::UnknownLeafHash`] when no entry in that tree has it.
    pub fn inclusion_proof_by_leaf_hash(
        &self,
        leaf_hash: &Hash,
        size: Option<TreeSize>,
    ) -> Result<(LeafIndex, TreeSize, Vec<Hash>), ProofRequestError> {
        let size = self.proof_size(size)?;
        let index = self
            .shared
            .store
            .index_of_leaf(leaf_hash)?
            .filter(|i| size.contains(*i))
            .ok_or(ProofRequestError::UnknownLeafHash {
                leaf_hash: *leaf_hash,
                size,
            })?;
        Ok((
            index,
            size,
            tree::inclusion_proof(self.shared.store.as_ref(), index, size)?,
        ))
    }

    /// The RFC 9162 consistency proof from size `from` to size `to` (the
    /// latest checkpoint's size when `None`); empty when they are equal.
    ///
    /// # Errors
    /// [`ProofRequestError::FromEmptyTree`] for `from` = 0,
    /// [`ProofRequestError::SizesOutOfOrder`], [`ProofRequestError::SizeBeyondTree`].
    pub fn consistency_proof(
        &self,
        from: TreeSize,
        to: Option<TreeSize>,
    ) -> Result<(TreeSize, Vec<Hash>), ProofRequestError> {
        let to = self.proof_size(to)?;
        if from > to {
            return Err(ProofRequestError::SizesOutOfOrder { from, to });
        }
        if from.get() == 0 {
            return Err(ProofRequestError::FromEmptyTree);
        }
        Ok((
            to,
            tree::consistency_proof(self.shared.store.as_ref(), from, to)?,
        ))
    }

    /// The root hash of the tree of `size` (at most the latest checkpoint's).
    ///
    /// # Errors
    /// [`ProofRequestError::SizeBeyondTree`] or storage failure.
    pub fn root(&self, size: TreeSize) -> Result<Hash, ProofRequestError> {
        let size = self.proof_size(Some(size))?;
        Ok(tree::root(self.shared.store.as_ref(), size)?)
    }

    fn proof_size(&self, size: Option<TreeSize>) -> Result<TreeSize, ProofRequestError> {
        let tree_size = self.latest_checkpoint().checkpoint.size;
        match size {
            None => Ok(tree_size),
            Some(size) if size <= tree_size => Ok(size),
            Some(size) => Err(ProofRequestError::SizeBeyondTree { size, tree_size }),
        }
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        // Closing the queue ends the writer after its current batch; the
        // thread is not joined here so that a drop never blocks a runtime.
        if let Ok(mut q) = self.queue.lock() {
            q.take();
        }
    }
}

/// An iterator over one agent's chain entries; see [`Log::chain_entries`].
pub struct ChainEntries {
    store: Arc<dyn LogStore>,
    agent: AgentName,
    next: Option<Seq>,
    to: Option<Seq>,
    limit: TreeSize,
    page: Vec<(Seq, LeafIndex)>,
}

/// Rows read from storage per page of [`ChainEntries`].
const CHAIN_PAGE: usize = 256;

impl Iterator for ChainEntries {
    type Item = Result<ChainEntry, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.page.is_empty() {
            let from = self.next?;
            match self.store.agent_indexes(&self.agent, from, CHAIN_PAGE) {
                Ok(mut rows) => {
                    rows.reverse();
                    self.page = rows;
                }
                Err(e) => {
                    self.next = None;
                    return Some(Err(e.into()));
                }
            }
            if self.page.is_empty() {
                self.next = None;
                return None;
            }
        }
        let (seq, index) = self.page.pop()?;
        if self.to.is_some_and(|to| seq >= to) || !self.limit.contains(index) {
            self.page.clear();
            self.next = None;
            return None;
        }
        self.next = seq.next();
        let item = (|| {
            let entry = read_entry(self.store.as_ref(), index)?.ok_or_else(|| {
                ReadError::Store(StoreError::Corrupt(format!(
                    "entry {index} is indexed but not stored"
                )))
            })?;
            let receipt_size = self.store.receipt_size(index)?.ok_or_else(|| {
                ReadError::Store(StoreError::Corrupt(format!(
                    "entry {index} has no receipt size"
                )))
            })?;
            Ok(ChainEntry {
                entry,
                receipt_size,
            })
        })();
        if item.is_err() {
            self.page.clear();
            self.next = None;
        }
        Some(item)
    }
}

fn latest(shared: &Shared) -> Arc<SignedCheckpoint> {
    match shared.latest.read() {
        Ok(g) => Arc::clone(&g),
        Err(poisoned) => Arc::clone(&poisoned.into_inner()),
    }
}

fn set_latest(shared: &Shared, cp: SignedCheckpoint) {
    let cp = Arc::new(cp);
    match shared.latest.write() {
        Ok(mut g) => *g = cp,
        Err(poisoned) => *poisoned.into_inner() = cp,
    }
}

fn read_entry(store: &dyn LogStore, index: LeafIndex) -> Result<Option<Entry>, ReadError> {
    let next = LeafIndex::new(index.get().saturating_add(1));
    let Some(bytes) = store.entries(index, next)?.into_iter().next() else {
        return Ok(None);
    };
    let entry =
        Entry::from_json(&bytes).map_err(|source| ReadError::CorruptEntry { index, source })?;
    if entry.index() != index {
        return Err(ReadError::Store(StoreError::Corrupt(format!(
            "entry stored at {index} says index {}",
            entry.index()
        ))));
    }
    Ok(Some(entry))
}

/// Rebuilds the receipt first issued for `index` from storage.
///
/// Its checkpoint note is always stored (recovery stores the note of the
/// only batch that can be beyond the latest stored checkpoint). Should one
/// still be missing, it is re-signed from the stored tree: the note is a
/// deterministic function of the tree of that size and the key, so these are
/// the bytes first issued, and any tree the store holds is consistent with
/// every checkpoint signed over it.
fn stored_receipt(
    store: &dyn LogStore,
    signer: &NoteSigner,
    index: LeafIndex,
) -> Result<Option<(Entry, Receipt)>, ReadError> {
    let Some(entry) = read_entry(store, index)? else {
        return Ok(None);
    };
    let size = store.receipt_size(index)?.ok_or_else(|| {
        ReadError::Store(StoreError::Corrupt(format!(
            "entry {index} has no receipt size"
        )))
    })?;
    let note = match store.checkpoint(size)? {
        Some(note) => note,
        None if size <= store.size()? => {
            let root = tree::root(store, size)?;
            signer
                .sign_checkpoint(&Checkpoint::new(signer.verifier().name(), size, root))
                .map_err(|_| ReadError::MissingCheckpoint { index, size })?
        }
        None => return Err(ReadError::MissingCheckpoint { index, size }),
    };
    let inclusion = tree::inclusion_proof(store, index, size)?;
    let receipt = make_receipt(&entry, note, inclusion);
    Ok(Some((entry, receipt)))
}

fn make_receipt(entry: &Entry, checkpoint: String, inclusion: Vec<Hash>) -> Receipt {
    Receipt {
        v: RECEIPT_VERSION,
        record_hash: entry.record().hash(),
        nonce: entry.record().nonce.clone(),
        index: entry.index(),
        received: entry.received(),
        checkpoint,
        inclusion,
    }
}

/// Recovery (docs/storage.md, "Recovery"): check the latest signed
/// checkpoint against storage, and sign one over the stored size if it is
/// newer, after proving it consistent. Returns the latest checkpoint.
fn recover(store: &dyn LogStore, signer: &NoteSigner) -> Result<SignedCheckpoint, OpenError> {
    let size = store.size()?;
    let previous = match store.latest_checkpoint()? {
        None => None,
        Some((cs, note)) => {
            let cp = open_checkpoint(&note, signer.verifier())
                .map_err(|source| OpenError::ForeignCheckpoint { size: cs, source })?;
            if cp.size != cs {
                return Err(OpenError::Store(StoreError::Corrupt(format!(
                    "checkpoint stored under size {cs} says size {}",
                    cp.size
                ))));
            }
            if cs > size {
                return Err(OpenError::CheckpointBeyondStorage {
                    checkpoint_size: cs,
                    tree_size: size,
                });
            }
            let stored_root = tree::root(store, cs)?;
            if stored_root != cp.root {
                return Err(OpenError::RootMismatch {
                    size: cs,
                    checkpoint_root: cp.root,
                    stored_root,
                });
            }
            if cs == size {
                return Ok(SignedCheckpoint {
                    checkpoint: cp,
                    note,
                });
            }
            Some(cp)
        }
    };
    let new_root = tree::root(store, size)?;
    if let Some(prev) = &previous {
        check_extends(store, prev, size, &new_root)?;
    }
    sign_and_store(store, signer, size, new_root)
}

/// Proves the stored tree of `size` with `new_root` consistent with `prev`.
fn check_extends(
    store: &dyn LogStore,
    prev: &Checkpoint,
    size: TreeSize,
    new_root: &Hash,
) -> Result<(), OpenError> {
    check_extends_with(&StoredHashes::new(store), prev, size, new_root)
}

/// [`check_extends`] over a given hash reader.
fn check_extends_with(
    reader: &StoredHashes<'_>,
    prev: &Checkpoint,
    size: TreeSize,
    new_root: &Hash,
) -> Result<(), OpenError> {
    if prev.size.get() == 0 {
        return Ok(());
    }
    let proof = tree::consistency_proof_with(reader, prev.size, size)?;
    verify_consistency(prev.size, size, &prev.root, new_root, &proof).map_err(|source| {
        OpenError::Inconsistent {
            from: prev.size,
            to: size,
            source,
        }
    })
}

fn sign_and_store(
    store: &dyn LogStore,
    signer: &NoteSigner,
    size: TreeSize,
    root: Hash,
) -> Result<SignedCheckpoint, OpenError> {
    let checkpoint = Checkpoint::new(signer.verifier().name(), size, root);
    let note = signer
        .sign_checkpoint(&checkpoint)
        .map_err(OpenError::Sign)?;
    store.put_checkpoint(size, &note)?;
    Ok(SignedCheckpoint { checkpoint, note })
}

fn open_error_to_store(e: OpenError) -> StoreError {
    match e {
        OpenError::Store(s) => s,
        other => StoreError::Corrupt(other.to_string()),
    }
}

/// What the writer decided for one queued record.
enum Decision {
    /// New entry at this position of the batch.
    New(usize),
    /// A retry of the new entry at this position of the batch.
    Again(usize),
    /// Already committed at this index.
    Existing(LeafIndex),
    /// Refused.
    Refused(AppendError),
}

fn run_writer(shared: &Shared, mut rx: mpsc::Receiver<Job>, max_batch: usize, size: TreeSize) {
    let mut state = WriterState {
        size,
        healthy: true,
    };
    while let Some(first) = rx.blocking_recv() {
        let mut jobs = vec![first];
        while jobs.len() < max_batch {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        process_batch(shared, &mut state, jobs);
    }
}

struct WriterState {
    size: TreeSize,
    healthy: bool,
}

fn fail_all(jobs: Vec<Job>, err: &AppendError) {
    for job in jobs {
        let _ = job.reply.send(Err(err.clone()));
    }
}

fn process_batch(shared: &Shared, state: &mut WriterState, jobs: Vec<Job>) {
    let store = shared.store.as_ref();
    if !state.healthy {
        match recover(store, &shared.signer) {
            Ok(cp) => {
                state.size = cp.checkpoint.size;
                set_latest(shared, cp);
                state.healthy = true;
            }
            Err(e) => {
                tracing::error!(error = %e, "log recovery failed; refusing appends");
                fail_all(jobs, &AppendError::Storage(open_error_to_store(e)));
                return;
            }
        }
    }

    let old_size = state.size;
    let mut new_entries: Vec<NewEntry> = Vec::new();
    let mut built: Vec<Entry> = Vec::new();
    let mut by_hash: HashMap<Hash, usize> = HashMap::new();
    let mut by_nonce: HashMap<Nonce, LeafIndex> = HashMap::new();
    let mut heads: HashMap<AgentName, ChainHead> = HashMap::new();
    let mut decided: Vec<(Job, Decision)> = Vec::with_capacity(jobs.len());

    // Everything classification needs from storage, in one read. Storage
    // cannot change meanwhile: this thread is its only writer.
    let lookups: Vec<Lookup<'_>> = jobs
        .iter()
        .map(|j| Lookup {
            record_hash: j.record.hash(),
            nonce: &j.record.nonce,
            agent: &j.record.agent,
        })
        .collect();
    let found = match store.lookup(&lookups) {
        Ok(f) if f.len() == jobs.len() => f,
        Ok(_) => {
            fail_all(
                jobs,
                &AppendError::Storage(StoreError::Corrupt("short lookup answer".into())),
            );
            return;
        }
        Err(e) => {
            fail_all(jobs, &AppendError::Storage(e));
            return;
        }
    };
    drop(lookups);

    for (job, found) in jobs.into_iter().zip(found) {
        let d = classify(
            &job,
            &found,
            old_size,
            &built,
            &mut by_hash,
            &mut by_nonce,
            &mut heads,
        );
        let d = match d {
            Ok(Some(entry)) => {
                let pos = built.len();
                let record = entry.record();
                by_hash.insert(record.hash(), pos);
                by_nonce.insert(record.nonce.clone(), entry.index());
                heads.insert(
                    record.agent.clone(),
                    ChainHead {
                        seq: record.seq,
                        record_hash: record.hash(),
                        index: entry.index(),
                    },
                );
                new_entries.push(NewEntry {
                    index: entry.index(),
                    canonical: entry.canonical_bytes().to_vec(),
                    leaf_hash: entry.leaf_hash(),
                    record_hash: record.hash(),
                    nonce: record.nonce.clone(),
                    agent: record.agent.clone(),
                    seq: record.seq,
                });
                built.push(entry);
                Decision::New(pos)
            }
            Ok(None) => match (by_hash.get(&job.record.hash()), found.record) {
                (Some(&pos), _) => Decision::Again(pos),
                (None, Some(index)) => Decision::Existing(index),
                (None, None) => Decision::Refused(AppendError::Storage(StoreError::Corrupt(
                    "record classified as a retry but not found".into(),
                ))),
            },
            Err(e) => Decision::Refused(e),
        };
        decided.push((job, d));
    }

    let mut committed: Option<Committed> = None;
    if !new_entries.is_empty() {
        match commit_and_sign(shared, state, old_size, new_entries) {
            Ok(c) => committed = Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "batch failed; the writer will recover before the next one");
                state.healthy = false;
                let err = AppendError::Storage(e);
                for (job, d) in decided {
                    let result = match d {
                        Decision::New(_) | Decision::Again(_) => Err(err.clone()),
                        Decision::Existing(index) => existing(store, &shared.signer, index),
                        Decision::Refused(e) => Err(e),
                    };
                    let _ = job.reply.send(result);
                }
                return;
            }
        }
    }

    for (job, d) in decided {
        let result = match d {
            Decision::New(pos) | Decision::Again(pos) => {
                let duplicate = matches!(d, Decision::Again(_));
                let entry = &built[pos];
                match &committed {
                    // The proof is read from the batch's own hashes and the
                    // old tree's frontier, not from storage.
                    Some(c) => {
                        let reader = StoredHashes::for_batch(store, &c.hashes);
                        match tree::inclusion_proof_with(&reader, entry.index(), c.size) {
                            Ok(inclusion) => Ok(Appended {
                                entry: entry.clone(),
                                receipt: make_receipt(entry, c.note.clone(), inclusion),
                                duplicate,
                            }),
                            Err(e) => Err(AppendError::Storage(e)),
                        }
                    }
                    None => Err(AppendError::Storage(StoreError::Corrupt(
                        "no checkpoint after commit".into(),
                    ))),
                }
            }
            Decision::Existing(index) => existing(store, &shared.signer, index),
            Decision::Refused(e) => Err(e),
        };
        let _ = job.reply.send(result);
    }
}

/// A committed batch: its size, its checkpoint note, and its hashes.
struct Committed {
    size: TreeSize,
    note: String,
    hashes: tree::BatchHashes,
}

fn existing(
    store: &dyn LogStore,
    signer: &NoteSigner,
    index: LeafIndex,
) -> Result<Appended, AppendError> {
    match stored_receipt(store, signer, index)? {
        Some((entry, receipt)) => Ok(Appended {
            entry,
            receipt,
            duplicate: true,
        }),
        None => Err(AppendError::Storage(StoreError::Corrupt(format!(
            "record indexed at {index} has no entry"
        )))),
    }
}

/// Classifies one record. `Ok(Some(entry))`: a new entry; `Ok(None)`: a retry
/// of a record committed or earlier in this batch; `Err`: refused.
#[allow(clippy::too_many_arguments)]
fn classify(
    job: &Job,
    found: &Found,
    old_size: TreeSize,
    built: &[Entry],
    by_hash: &mut HashMap<Hash, usize>,
    by_nonce: &mut HashMap<Nonce, LeafIndex>,
    heads: &mut HashMap<AgentName, ChainHead>,
) -> Result<Option<Entry>, AppendError> {
    let record = &job.record;
    let hash = record.hash();
    if by_hash.contains_key(&hash) || found.record.is_some() {
        return Ok(None);
    }
    let first_index = match by_nonce.get(&record.nonce) {
        Some(i) => Some(*i),
        None => found.nonce,
    };
    if let Some(first_index) = first_index {
        return Err(AppendError::NonceReplayed {
            nonce: record.nonce.clone(),
            first_index,
        });
    }
    let head = match heads.get(&record.agent) {
        Some(h) => Some(h.clone()),
        None => found.head.clone(),
    };
    let extends = match &head {
        None => record.seq == Seq::GENESIS,
        Some(h) => h.seq.next() == Some(record.seq) && record.prev == Some(h.record_hash),
    };
    if !extends {
        return Err(AppendError::ChainConflict {
            agent: record.agent.clone(),
            head_seq: head.as_ref().map(|h| h.seq),
            head_hash: head.as_ref().map(|h| h.record_hash),
        });
    }
    let index = old_size.get() + built.len() as u64;
    if index >= MAX_COUNTER {
        return Err(AppendError::LogFull);
    }
    Ok(Some(Entry::new(
        LeafIndex::new(index),
        job.received,
        record.clone(),
    )?))
}

/// Steps 2 and 3 of the write path. On success the writer's size is the new
/// size and the returned checkpoint is stored (durably with the next batch).
fn commit_and_sign(
    shared: &Shared,
    state: &mut WriterState,
    old_size: TreeSize,
    entries: Vec<NewEntry>,
) -> Result<Committed, StoreError> {
    let store = shared.store.as_ref();
    let leaves: Vec<Hash> = entries.iter().map(|e| e.leaf_hash).collect();
    let hashes = tree::extend(store, old_size, &leaves)?;
    let mut last_per_agent: HashMap<AgentName, ChainHead> = HashMap::new();
    for e in &entries {
        last_per_agent.insert(
            e.agent.clone(),
            ChainHead {
                seq: e.seq,
                record_hash: e.record_hash,
                index: e.index,
            },
        );
    }
    let new_size = TreeSize::new(old_size.get() + entries.len() as u64);
    let n = entries.len() as u64;
    let batch = BatchWrite {
        old_size,
        entries,
        hashes: hashes.hashes.clone(),
        heads: last_per_agent.into_iter().collect(),
        receipt_size: new_size,
    };
    // The one durable write of the batch. It also persists the previous
    // batch's checkpoint note, stored without a sync of its own.
    store.commit_batch(&batch)?;
    drop(batch);
    state.size = new_size;

    // The batch is durable. Recompute the new root and prove it extends the
    // last signed checkpoint (the batch's hashes and the old frontier are
    // the bytes just committed and read; they are kept only to save reads).
    let reader = StoredHashes::for_batch(store, &hashes);
    let new_root = tree::root_with(&reader, new_size)?;
    let prev = latest(shared);
    check_extends_with(&reader, &prev.checkpoint, new_size, &new_root)
        .map_err(open_error_to_store)?;
    drop(reader);
    // Signing is deterministic, so this note is a function of durable state:
    // storing it without its own fsync loses nothing a crash cannot rebuild
    // (recovery re-signs the same bytes). docs/storage.md, "Write path".
    let signed =
        sign_and_store(store, &shared.signer, new_size, new_root).map_err(open_error_to_store)?;
    let note = signed.note.clone();
    set_latest(shared, signed);

    let stats = &shared.stats;
    stats.batches.fetch_add(1, Ordering::Relaxed);
    stats.entries.fetch_add(n, Ordering::Relaxed);
    stats.largest.fetch_max(n, Ordering::Relaxed);
    Ok(Committed {
        size: new_size,
        note,
        hashes,
    })
}
