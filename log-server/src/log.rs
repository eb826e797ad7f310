//! The log engine's public face (docs/storage.md, "Read API" and "Write
//! path"; docs/protocol.md §7–§8): [`Log`] opens a store (recovering it),
//! starts the sequencer ([`crate::sequencer`]), queues appends (one record,
//! or a batch of many records of several agents) and serves the Rust read
//! API the witness uses. The admission rules are in [`crate::rules`],
//! checkpoint signing and recovery in [`crate::checkpoint`].

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::thread::JoinHandle;

use tally_schemas::{
    AgentName, Entry, Hash, LeafIndex, NoteSigner, NoteVerifier, Receipt, Seq, TreeSize, UnixMillis,
};
use tokio::sync::{mpsc, oneshot};

use crate::checkpoint::recover;
pub use crate::checkpoint::SignedCheckpoint;
use crate::error::{AppendError, OpenError, ProofRequestError, ReadError};
use crate::item::{Appended, BatchItem};
use crate::receipt::{read_entry, stored_receipt};
use crate::sequencer::{self, BatchAnswers, Job, Shared, Stats};
use crate::store::redb::RedbStore;
use crate::store::{ChainHead, KeyVersion, LogStore, StoreError};
use crate::tree;

/// Tuning of the sequencer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    /// Records (of single appends and batches) that may wait for the
    /// writer; beyond this, `Overloaded`.
    pub queue_capacity: usize,
    /// Most records committed in one transaction, and the largest batch
    /// [`Log::enqueue_batch_fenced`] takes.
    pub max_batch: usize,
    /// The redb store's page cache in bytes ([`Log::open_redb`] only). redb
    /// reads through its own cache, which otherwise grows to 1 GiB as reads
    /// (exports, proofs) touch the file; the OS page cache still holds what
    /// does not fit.
    pub cache_bytes: usize,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            queue_capacity: 8192,
            max_batch: 2048,
            cache_bytes: crate::store::redb::DEFAULT_CACHE_BYTES,
        }
    }
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

/// A queued batch ([`Log::enqueue_batch_fenced`]): resolves to one answer per
/// item, in the items' order, once the batch's group commit is durable and
/// signed.
#[derive(Debug)]
#[must_use = "the batch is queued either way; await it for the receipts"]
pub struct PendingBatch {
    rx: Option<oneshot::Receiver<BatchAnswers>>,
}

impl Future for PendingBatch {
    type Output = Result<Vec<Result<Appended, AppendError>>, AppendError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.rx.as_mut() {
            None => Poll::Ready(Ok(Vec::new())),
            Some(rx) => Pin::new(rx)
                .poll(cx)
                .map(|r| r.map_err(|_| AppendError::Closed)),
        }
    }
}

/// The durable Merkle log. Open it over a store with [`Log::open`]; append
/// one record or many with [`Log::enqueue_batch_fenced`]; read with the other
/// methods (blocking: call them from a blocking thread in async code).
/// There is no auth and no admission here: the caller has already checked
/// each record's signature, key and time.
pub struct Log {
    shared: Arc<Shared>,
    /// Whether this process sequences now: always for a log over its own
    /// store; for a PostgreSQL front, while it holds the lease.
    sequencing: Arc<tokio::sync::watch::Sender<bool>>,
    queue: Mutex<Option<mpsc::UnboundedSender<Job>>>,
    queued: Arc<AtomicUsize>,
    writer: Mutex<Option<JoinHandle<()>>>,
    capacity: usize,
    max_batch: usize,
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
    /// Over a store several fronts share ([`LogStore::shared`]: a
    /// PostgreSQL store opened for a front, a memory store's front), this
    /// opens a front of the log (docs/operations.md, "Running on
    /// PostgreSQL"): every front admits records and serves reads; the one
    /// that takes the store's lease also sequences (recovering the log
    /// first, as above), and the others hand their records to it through
    /// the store and build the same receipts from it. A front takes the
    /// lease when it falls free, and gives up sequencing when it loses it,
    /// in-process. It waits while the store holds no signed checkpoint yet
    /// and another process holds the lease. One open for every backend.
    ///
    /// # Errors
    /// [`OpenError`] when storage fails or does not extend what was signed.
    pub fn open(
        store: Arc<dyn LogStore>,
        signer: NoteSigner,
        config: LogConfig,
    ) -> Result<Self, OpenError> {
        if let Some(shared) = Arc::clone(&store).shared() {
            return Self::open_shared(shared, signer, config);
        }
        let latest = recover(store.as_ref(), &signer)?;
        let size = latest.checkpoint.size;
        let shared = Arc::new(Shared {
            store,
            signer,
            latest: RwLock::new(Arc::new(latest)),
            signed: tokio::sync::watch::Sender::new(size),
            published: RwLock::new(None),
            stats: Stats::default(),
        });
        let capacity = config.queue_capacity.max(1);
        let max_batch = config.max_batch.max(1);
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let writer_shared = Arc::clone(&shared);
        let writer_queued = Arc::clone(&queued);
        let handle = std::thread::Builder::new()
            .name("tally-log-sequencer".into())
            .spawn(move || sequencer::run(&writer_shared, rx, &writer_queued, max_batch, size))
            .map_err(|e| {
                OpenError::Store(StoreError::Backend(format!(
                    "cannot start the sequencer thread: {e}"
                )))
            })?;
        Ok(Self {
            shared,
            sequencing: Arc::new(tokio::sync::watch::Sender::new(true)),
            queue: Mutex::new(Some(tx)),
            queued,
            writer: Mutex::new(Some(handle)),
            capacity,
            max_batch,
        })
    }

    /// [`Log::open`] over a store several fronts share, with the waits of
    /// [`crate::front::FrontOptions::for_ttl`] its lease's ttl.
    fn open_shared(
        store: Arc<dyn crate::store::SharedStore>,
        signer: NoteSigner,
        config: LogConfig,
    ) -> Result<Self, OpenError> {
        let options = crate::front::FrontOptions::for_ttl(store.lease_ttl());
        let placeholder = SignedCheckpoint {
            checkpoint: tally_schemas::Checkpoint::new(
                signer.verifier().name(),
                TreeSize::new(0),
                Hash::from_bytes([0; 32]),
            ),
            note: String::new(),
        };
        let dyn_store = Arc::clone(&store).log_store();
        let shared = Arc::new(Shared {
            store: dyn_store,
            signer,
            latest: RwLock::new(Arc::new(placeholder)),
            signed: tokio::sync::watch::Sender::new(TreeSize::new(0)),
            published: RwLock::new(None),
            stats: Stats::default(),
        });
        let max_batch = config.max_batch.max(1);
        // Sets the latest checkpoint: recovered, or followed.
        let sequencing = crate::front::open_role(&shared, store.as_ref(), max_batch)?;
        let role = Arc::new(tokio::sync::watch::Sender::new(sequencing.is_some()));
        let capacity = config.queue_capacity.max(1);
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let front = crate::front::Front {
            shared: Arc::clone(&shared),
            pg: store,
            queued: Arc::clone(&queued),
            max_batch,
            options,
            name: format!("{}:{}", std::process::id(), shared.signer.verifier().name()),
            sequencing: Arc::clone(&role),
            opened: Arc::default(),
        };
        let handle = std::thread::Builder::new()
            .name("tally-log-front".into())
            .spawn(move || crate::front::run(front, rx, sequencing))
            .map_err(|e| {
                OpenError::Store(StoreError::Backend(format!(
                    "cannot start the front's thread: {e}"
                )))
            })?;
        Ok(Self {
            shared,
            sequencing: role,
            queue: Mutex::new(Some(tx)),
            queued,
            writer: Mutex::new(Some(handle)),
            capacity,
            max_batch,
        })
    }

    /// Opens (or creates) a redb log file at `path`; see [`Log::open`]. A
    /// file of storage layout 1, 2 or 3 is migrated to layout 4 first
    /// ([`RedbStore::open`]).
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

    /// [`Log::enqueue_batch_fenced`] with no fences (tests only: the
    /// product fences every batch).
    ///
    /// # Errors
    /// As [`Log::enqueue_batch_fenced`].
    #[cfg(any(test, feature = "testing"))]
    pub fn enqueue_batch(
        &self,
        items: Vec<BatchItem>,
        received: UnixMillis,
    ) -> Result<PendingBatch, AppendError> {
        self.enqueue_batch_fenced(items, Vec::new(), received)
    }

    /// Queues a batch of items (records of one or several agents, all
    /// received at `received`) now, synchronously; the future resolves to
    /// one answer per item, in order (docs/storage.md, "Batches"):
    /// - the batch is one group commit: its new entries share one
    ///   checkpoint, and each receipt has its own inclusion proof in it;
    /// - each agent's records are admitted in seq order, whatever their
    ///   order in the batch; once one of them is refused (or was
    ///   [`BatchItem::Refused`] by the caller), the agent's later records in
    ///   the batch are refused with [`AppendError::PriorRecordRefused`];
    /// - a record already in the log, or twice in the batch, answers with
    ///   its entry and original receipt (`duplicate: true`), whatever
    ///   `received` says.
    ///
    /// `fences` holds the key version each item's key was checked against,
    /// by the items' order (docs/protocol.md §4.1; contract rule 8 of
    /// [`crate::store`]): on a shared store, a record of an agent whose
    /// keys changed since is answered [`AppendError::KeyChanged`], and so
    /// are the agent's other new records in the batch. `None`, and any
    /// version on a store one process owns, fences nothing; `fences` may
    /// be shorter than `items` (the rest are not fenced).
    ///
    /// # Errors
    /// At once, for the whole batch: [`AppendError::BatchTooLarge`] for more
    /// items than [`LogConfig::max_batch`], [`AppendError::Overloaded`],
    /// [`AppendError::Closed`]. The future fails only with
    /// [`AppendError::Closed`]; every other error is per item.
    pub fn enqueue_batch_fenced(
        &self,
        items: Vec<BatchItem>,
        fences: Vec<Option<KeyVersion>>,
        received: UnixMillis,
    ) -> Result<PendingBatch, AppendError> {
        if items.is_empty() {
            return Ok(PendingBatch { rx: None });
        }
        if items.len() > self.max_batch {
            return Err(AppendError::BatchTooLarge {
                count: items.len(),
                max: self.max_batch,
            });
        }
        let rx = self.send(items, fences, received)?;
        Ok(PendingBatch { rx: Some(rx) })
    }

    /// [`Log::enqueue_batch`], awaited (tests only: the product awaits
    /// the [`PendingBatch`] itself).
    ///
    /// # Errors
    /// As [`Log::enqueue_batch_fenced`].
    #[cfg(any(test, feature = "testing"))]
    pub async fn append_batch(
        &self,
        items: Vec<BatchItem>,
        received: UnixMillis,
    ) -> Result<Vec<Result<Appended, AppendError>>, AppendError> {
        self.enqueue_batch(items, received)?.await
    }

    fn send(
        &self,
        items: Vec<BatchItem>,
        fences: Vec<Option<KeyVersion>>,
        received: UnixMillis,
    ) -> Result<oneshot::Receiver<BatchAnswers>, AppendError> {
        let n = items.len();
        let queue = self.queue.lock().map_err(|_| AppendError::Closed)?;
        let Some(sender) = queue.as_ref() else {
            return Err(AppendError::Closed);
        };
        let capacity = self.capacity;
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q + n <= capacity.max(n)).then_some(q + n)
            })
            .map_err(|_| AppendError::Overloaded { capacity })?;
        let (reply, rx) = oneshot::channel();
        if sender
            .send(Job {
                items,
                fences,
                received,
                reply,
            })
            .is_err()
        {
            self.queued.fetch_sub(n, Ordering::AcqRel);
            return Err(AppendError::Closed);
        }
        Ok(rx)
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
        self.shared.latest()
    }

    /// Follows the sizes of newly signed checkpoints (each is stored and is
    /// [`Log::latest_checkpoint`] by the time its size is seen here).
    #[must_use]
    pub fn watch_checkpoints(&self) -> tokio::sync::watch::Receiver<TreeSize> {
        self.shared.signed.subscribe()
    }

    /// Follows whether this process sequences the log, and so signs its
    /// checkpoints and asks its cosigners (docs/operations.md, "Cosigners
    /// for the log"): always for a log over its own store; for a front on
    /// PostgreSQL, while it holds the lease, so taking or losing the lease
    /// changes it.
    #[must_use]
    pub fn watch_sequencing(&self) -> tokio::sync::watch::Receiver<bool> {
        self.sequencing.subscribe()
    }

    /// The checkpoint the log publishes at `/checkpoint` (docs/protocol.md
    /// §14.5): the one set by [`Log::publish`] (a checkpoint with its
    /// cosignature lines) once cosigning is on, otherwise the latest.
    #[must_use]
    pub fn published_checkpoint(&self) -> Arc<SignedCheckpoint> {
        let published = match self.shared.published.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        published.unwrap_or_else(|| self.latest_checkpoint())
    }

    /// Publishes `cosigned`, a checkpoint this log signed and stored, its
    /// note followed by cosignature lines. A checkpoint smaller than the one
    /// published is ignored, so the published size never goes back.
    ///
    /// # Errors
    /// [`StoreError::Conflict`] when `cosigned` does not start with the
    /// note stored for its size.
    pub fn publish(&self, cosigned: SignedCheckpoint) -> Result<(), StoreError> {
        let size = cosigned.checkpoint.size;
        let stored = self.shared.store.checkpoint(size)?;
        if !stored.is_some_and(|n| cosigned.note.starts_with(&n)) {
            return Err(StoreError::Conflict(format!(
                "the note to publish for size {size} is not the stored checkpoint"
            )));
        }
        let mut g = match self.shared.published.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if g.as_ref().is_some_and(|p| p.checkpoint.size > size) {
            return Ok(());
        }
        *g = Some(Arc::new(cosigned));
        Ok(())
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tally_schemas::record::NoteBody;
    use tally_schemas::{
        AgentName, Body, Nonce, NoteSigner, Record, SecretKey, Seq, UnixMillis, UnsignedRecord,
    };

    use super::{Log, LogConfig};
    use crate::front::{decode_answers, encode_answers, OpenedNote};
    use crate::item::BatchItem;
    use crate::store::memory::MemoryStore;
    use crate::store::LogStore;

    fn record(agent: &str, key: &SecretKey) -> Record {
        UnsignedRecord {
            agent: AgentName::new(agent).expect("agent name"),
            key_id: key.public_key().key_id(),
            seq: Seq::new(0).expect("seq"),
            prev: None,
            time: UnixMillis::new(1_796_025_600_000),
            nonce: Nonce::from_bytes(vec![7; 16]).expect("nonce"),
            body: Body::Note(NoteBody {
                text: "handed over".into(),
            }),
        }
        .sign(key)
        .expect("sign")
    }

    fn strip_receipts(text: &str) -> String {
        let mut wire: Vec<serde_json::Value> = serde_json::from_str(text).expect("answers");
        for w in &mut wire {
            w["Ok"]
                .as_object_mut()
                .expect("an Ok answer")
                .remove("receipt");
        }
        serde_json::to_string(&wire).expect("json")
    }

    /// A waiting front answers with the sequencer's receipt once it checks,
    /// without reading storage; an answer without one, or with one that
    /// does not check, has its receipt built from storage
    /// (docs/storage.md "Hand-over between fronts").
    #[test]
    fn answers_carry_the_sequencers_receipts_and_fall_back_to_storage() {
        let signer = NoteSigner::from_secret("log.example/front", SecretKey::from_seed(&[3; 32]))
            .expect("signer");
        let store: Arc<dyn LogStore> = Arc::new(MemoryStore::new());
        let log = Log::open(Arc::clone(&store), signer.clone(), LogConfig::default())
            .expect("open the log");
        let key = SecretKey::from_seed(&[9; 32]);
        let (mine, other) = (record("handed", &key), record("other", &key));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let answers = rt
            .block_on(async {
                log.enqueue_batch_fenced(
                    vec![BatchItem::Record(mine.clone())],
                    vec![None],
                    UnixMillis::new(1_796_025_600_001),
                )
                .expect("queued")
                .await
            })
            .expect("answered");
        let sent = answers[0].as_ref().expect("appended").clone();
        let text = encode_answers(&answers).expect("final answers");
        let empty: Arc<dyn LogStore> = Arc::new(MemoryStore::new());
        let opened = OpenedNote::default();
        // The one answer to `text` from `store`, for a request of `record`.
        let decode = |store: &Arc<dyn LogStore>, text: &str, record: &Record| {
            let mut answers = decode_answers(
                store.as_ref(),
                &signer,
                &opened,
                text,
                &[Some(record.clone())],
            );
            answers.remove(0)
        };

        // The receipt checks: answered as the sequencer's front answered,
        // with nothing read from storage (an empty store here).
        let got = decode(&empty, &text, &mine);
        let got = got.as_ref().expect("answered from the receipt");
        assert_eq!(got.receipt, sent.receipt);
        assert_eq!(got.entry, sent.entry);
        assert!(!got.duplicate);

        // A receipt that is not the handed-over record's does not check:
        // the receipt is built from storage instead, which an empty store
        // lacks.
        let got = decode(&empty, &text, &other);
        assert!(got.is_err(), "{got:?}");
        let got = decode(&store, &text, &other);
        assert_eq!(got.expect("built from storage").receipt, sent.receipt);

        // Answers without receipts (an earlier build's) are built from storage.
        let old = strip_receipts(&text);
        assert!(!old.contains("receipt"));
        let got = decode(&store, &old, &mine);
        assert_eq!(got.expect("built from storage").receipt, sent.receipt);
        let got = decode(&empty, &old, &mine);
        assert!(got.is_err(), "{got:?}");
        log.shutdown();
    }
}
