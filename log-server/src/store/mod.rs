//! The storage contract of the log (docs/storage.md): the [`LogStore`] trait
//! every backend implements, and the values it stores.
//!
//! Stored hashes follow the Go sumdb/tlog layout (`tlog_tiles::stored_hash_index`):
//! the hashes of a tree of `n` leaves are a dense array of
//! `tlog_tiles::stored_hash_count(n)` values, appended as leaves are appended
//! and never rewritten, so every proof and tile is O(log n) point reads.
//!
//! # Contract
//! A backend promises:
//! 1. **Atomic batches.** [`LogStore::commit_batch`] writes everything in a
//!    [`BatchWrite`] or nothing, and is durable when it returns `Ok`, together
//!    with every earlier write (checkpoint notes are stored without a sync of
//!    their own and become durable with the next batch).
//! 2. **Compare-and-swap on size.** It refuses a batch whose `old_size` is not
//!    the stored size ([`StoreError::Conflict`]), so a stale writer can never
//!    append twice at one index.
//! 3. **Immutability.** Stored hashes, entries, index rows and receipt sizes are
//!    never changed once written. A checkpoint is never replaced by a different
//!    note of the same size ([`LogStore::put_checkpoint`] refuses), and never
//!    stored for a size below the latest one or above the stored tree size.
//! 4. **Read-your-writes.** After `Ok`, every read sees the write.
//! 5. **An error says nothing about landing.** A write that returns `Err` may or
//!    may not have landed (a lost acknowledgement); callers re-read state after
//!    an error instead of assuming either. The fault-injecting backend
//!    (`tally_testkit::faulty_store::FaultyStore`, dev-only) exercises both
//!    outcomes.
//!
//! 6. **Indexes follow the entries.** Everything a lookup answers (chain
//!    heads, an agent's `(seq, index)` rows, the nonce, record-hash and
//!    leaf-hash indexes, receipt sizes) is derived from the batch's
//!    [`NewEntry`] rows and answers for them once the batch is committed:
//!    written in the same atomic batch, or (the redb store's `ids` and `chains` rows,
//!    docs/storage.md "Deferred index rows") held in memory from before the
//!    commit and derived again from the stored entries at every open. An
//!    agent's chain head is its entry with the highest seq.
//!
//! 7. **Cosignatures are added, never replaced.** A cosigner's
//!    cosignature line is stored beside a stored checkpoint, keyed by
//!    `(tree size, cosigner)` ([`LogStore::put_cosignature`]); storing the
//!    same line again is a no-op, a different line for the same key is
//!    refused, and nothing is stored for a size without a checkpoint.
//!    Like checkpoint notes they need no sync of their own: a cosignature
//!    lost in a crash is asked for again (docs/protocol.md §14.5).
//!
//! 8. **Key fences (shared stores).** A store that several processes
//!    share (PostgreSQL) keeps, per agent, the latest `time` of its
//!    committed records and a key version that every change of the agent's
//!    keys increments (docs/protocol.md §4.1). It refuses a batch in which
//!    an entry of an agent was admitted under another key version than the
//!    agent's current one ([`BatchWrite::key_versions`]), writing nothing
//!    ([`StoreError::KeysChanged`]), and checks that in the transaction
//!    that commits the batch, holding the agents' rows until it commits.
//!    A store that one process owns (redb, memory) ignores key versions:
//!    that process fences key changes in its memory.
//!
//! The store itself checks no chain, nonce or signature rule: the single
//! writer (the sequencer) does that before it builds a batch, and the
//! compare-and-swap of rule 2 makes that check-then-write atomic. The trait
//! names no backend type, so a backend on another database (a SQL one)
//! implements the same methods; how a backend lays out its rows is its own
//! (docs/storage.md has the redb layout).

pub mod memory;
pub mod postgres;
pub mod redb;
mod redb_deferred;
mod redb_layout;
#[doc(hidden)]
pub mod redb_v1;

use tally_schemas::{AgentName, Hash, LeafIndex, Nonce, Seq, TreeSize, UnixMillis};

/// The version of an agent's keys in a shared store (contract rule 8):
/// incremented by every rotation and retirement of the agent. A record
/// admitted under one version is committed only while it is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct KeyVersion(i64);

impl KeyVersion {
    /// The version stored as `v`.
    #[must_use]
    pub const fn new(v: i64) -> Self {
        Self(v)
    }

    /// The stored value.
    #[must_use]
    pub const fn get(self) -> i64 {
        self.0
    }
}

impl std::fmt::Display for KeyVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Why a storage operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The backend failed (I/O, a full disk, a closed database).
    #[error("storage backend: {0}")]
    Backend(String),
    /// Stored data breaks the layout (a missing hash inside the tree, an
    /// undecodable row). The log refuses to sign anything over such a store.
    #[error("storage is corrupt: {0}")]
    Corrupt(String),
    /// A write that would break the contract: a batch at a stale size, or a
    /// second, different checkpoint note for one size.
    #[error("storage write refused: {0}")]
    Conflict(String),
    /// A write by a process that does not hold the log's lease (PostgreSQL:
    /// docs/operations.md, "Running on PostgreSQL"): another process
    /// sequences the log, or the lease expired. Nothing was written; the
    /// record is safe to send again, to whichever front.
    #[error("fenced: {0}")]
    Fenced(String),
    /// A shared store refused a batch because the keys of these agents
    /// changed after some of its records were admitted: each with its
    /// current key version (contract rule 8). Nothing was written.
    #[error("the keys of {} changed after records of theirs were admitted", agent_list(.0))]
    KeysChanged(Vec<(AgentName, KeyVersion)>),
}

fn agent_list(changed: &[(AgentName, KeyVersion)]) -> String {
    let names: Vec<&str> = changed.iter().map(|(a, _)| a.as_str()).collect();
    names.join(", ")
}

/// The latest record of an agent's chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainHead {
    /// Sequence number of the head record.
    pub seq: Seq,
    /// Record hash of the head record.
    pub record_hash: Hash,
    /// The head record's log index.
    pub index: LeafIndex,
}

/// One new entry of a batch, with the keys it is indexed under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEntry {
    /// Its log index.
    pub index: LeafIndex,
    /// The entry's canonical bytes (the leaf data).
    pub canonical: Vec<u8>,
    /// `SHA-256(0x00 ‖ canonical)`.
    pub leaf_hash: Hash,
    /// The record's hash.
    pub record_hash: Hash,
    /// The record's nonce.
    pub nonce: Nonce,
    /// The record's agent.
    pub agent: AgentName,
    /// The record's seq.
    pub seq: Seq,
    /// The record's `time` (the agent's clock), for the agent's latest
    /// record time (contract rule 8).
    pub time: UnixMillis,
}

/// What the sequencer looks up for one queued record before classifying it.
#[derive(Debug, Clone, Copy)]
pub struct Lookup<'a> {
    /// The record's hash (is it already committed?).
    pub record_hash: Hash,
    /// The record's nonce (was it used before?).
    pub nonce: &'a Nonce,
    /// The record's agent (where is its chain's head?).
    pub agent: &'a AgentName,
    /// The record's seq: a committed record with this hash is the agent's
    /// entry at this seq (the hash covers agent and seq), so a backend may
    /// answer [`Found::record`] from its `(agent, seq)` rows.
    pub seq: Seq,
}

/// The answers to one [`Lookup`], as of one consistent read of the store.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Found {
    /// [`LogStore::index_of_record`] of the record hash.
    pub record: Option<LeafIndex>,
    /// [`LogStore::index_of_nonce`] of the nonce.
    pub nonce: Option<LeafIndex>,
    /// [`LogStore::chain_head`] of the agent.
    pub head: Option<ChainHead>,
}

/// Everything one group commit writes, in one transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchWrite {
    /// The stored tree size this batch extends (compare-and-swap).
    pub old_size: TreeSize,
    /// The new entries, at indexes `old_size..old_size + entries.len()`.
    pub entries: Vec<NewEntry>,
    /// The new stored hashes, starting at stored-hash index
    /// `stored_hash_count(old_size)` and ending at `stored_hash_count(new size)`.
    pub hashes: Vec<Hash>,
    /// The tree size of the checkpoint every receipt for this batch is issued
    /// under: the new size.
    pub receipt_size: TreeSize,
    /// The key versions the batch's records were admitted under, per
    /// agent (an agent twice when its records were admitted under two):
    /// a shared store refuses the batch unless each is the agent's current
    /// one (contract rule 8). Empty when nothing was admitted (a copy).
    pub key_versions: Vec<(AgentName, KeyVersion)>,
}

impl BatchWrite {
    /// The tree size after this batch.
    #[must_use]
    pub fn new_size(&self) -> TreeSize {
        TreeSize::new(self.old_size.get() + self.entries.len() as u64)
    }

    /// Checks the batch's internal shape (indexes contiguous, hash count
    /// right), which every backend does before writing.
    ///
    /// # Errors
    /// [`StoreError::Conflict`] naming the first inconsistency.
    pub fn check_shape(&self) -> Result<(), StoreError> {
        for (i, e) in self.entries.iter().enumerate() {
            if e.index.get() != self.old_size.get() + i as u64 {
                return Err(StoreError::Conflict(format!(
                    "batch entry {i} has index {}, expected {}",
                    e.index,
                    self.old_size.get() + i as u64
                )));
            }
        }
        let want = tlog_tiles::stored_hash_count(self.new_size().get())
            - tlog_tiles::stored_hash_count(self.old_size.get());
        if self.hashes.len() as u64 != want {
            return Err(StoreError::Conflict(format!(
                "batch has {} stored hashes, {want} expected",
                self.hashes.len()
            )));
        }
        let mut last: std::collections::HashMap<&AgentName, Seq> = std::collections::HashMap::new();
        for e in &self.entries {
            if let Some(prev) = last.insert(&e.agent, e.seq) {
                if e.seq <= prev {
                    return Err(StoreError::Conflict(format!(
                        "batch entries of {} are not in seq order",
                        e.agent
                    )));
                }
            }
        }
        if self.receipt_size != self.new_size() {
            return Err(StoreError::Conflict(
                "receipt size is not the new tree size".into(),
            ));
        }
        Ok(())
    }
}

/// The storage of one log. See the module docs for the contract.
///
/// Every method is blocking; async callers run them on a blocking thread.
pub trait LogStore: Send + Sync + 'static {
    /// The number of committed entries.
    ///
    /// # Errors
    /// [`StoreError`] when the backend fails.
    fn size(&self) -> Result<TreeSize, StoreError>;

    /// The stored hashes at the given stored-hash indexes, in order.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] when an index is not stored.
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, StoreError>;

    /// The canonical bytes of the entries at `start..end` (fewer if the log
    /// is shorter).
    ///
    /// # Errors
    /// [`StoreError`] when the backend fails.
    fn entries(&self, start: LeafIndex, end: LeafIndex) -> Result<Vec<Vec<u8>>, StoreError>;

    /// The tree size of the checkpoint the receipt for `index` is issued under.
    ///
    /// # Errors
    /// [`StoreError`] when the backend fails.
    fn receipt_size(&self, index: LeafIndex) -> Result<Option<TreeSize>, StoreError>;

    /// The signed checkpoint note stored for `size`.
    ///
    /// # Errors
    /// [`StoreError`] when the backend fails.
    fn checkpoint(&self, size: TreeSize) -> Result<Option<String>, StoreError>;

    /// The stored checkpoint with the largest size.
    ///
    /// # Errors
    /// [`StoreError`] when the backend fails.
    fn latest_checkpoint(&self) -> Result<Option<(TreeSize, String)>, StoreError>;

    /// The head of `agent`'s chain.
    ///
    /// # Errors
    /// [`StoreError`] when the backend fails.
    fn chain_head(&self, agent: &AgentName) -> Result<Option<ChainHead>, StoreError>;

    /// `(seq, index)` of `agent`'s records with `seq >= from`, in seq order,
    /// at most `limit` of them.
    ///
    /// # Errors
    /// [`StoreError`] when the backend fails.
    fn agent_indexes(
        &self,
        agent: &AgentName,
        from: Seq,
        limit: usize,
    ) -> Result<Vec<(Seq, LeafIndex)>, StoreError>;

    /// The index of the entry whose record used `nonce`.
    ///
    /// # Errors
    /// [`StoreError`] when the backend fails.
    fn index_of_nonce(&self, nonce: &Nonce) -> Result<Option<LeafIndex>, StoreError>;

    /// The index of the entry holding the record with `record_hash`.
    ///
    /// # Errors
    /// [`StoreError`] when the backend fails.
    fn index_of_record(&self, record_hash: &Hash) -> Result<Option<LeafIndex>, StoreError>;

    /// The index of the entry with `leaf_hash`.
    ///
    /// # Errors
    /// [`StoreError`] when the backend fails.
    fn index_of_leaf(&self, leaf_hash: &Hash) -> Result<Option<LeafIndex>, StoreError>;

    /// The answers to many [`Lookup`]s, in order. Backends answer them in one
    /// read transaction; the default asks the single-key methods.
    ///
    /// # Errors
    /// [`StoreError`] when the backend fails.
    fn lookup(&self, lookups: &[Lookup<'_>]) -> Result<Vec<Found>, StoreError> {
        lookups
            .iter()
            .map(|l| {
                Ok(Found {
                    record: self.index_of_record(&l.record_hash)?,
                    nonce: self.index_of_nonce(l.nonce)?,
                    head: self.chain_head(l.agent)?,
                })
            })
            .collect()
    }

    /// Writes a batch atomically and durably (contract rules 1 and 2).
    ///
    /// # Errors
    /// [`StoreError::Conflict`] when `batch.old_size` is not the stored size
    /// or the batch is malformed; [`StoreError`] when the backend fails, in
    /// which case the batch may or may not have landed.
    fn commit_batch(&self, batch: &BatchWrite) -> Result<(), StoreError>;

    /// Stores a signed checkpoint note for `size`, atomically but **not
    /// necessarily durably**: it is durable once the next
    /// [`LogStore::commit_batch`] or [`LogStore::sync`] returns `Ok`. A note
    /// is a deterministic function of durable state (the tree of `size` and
    /// the log's key), so a note lost in a crash is re-signed byte for byte
    /// by recovery (docs/storage.md, "Write path").
    ///
    /// Storing the same note again is a no-op.
    ///
    /// # Errors
    /// [`StoreError::Conflict`] when another note is stored for `size`, when
    /// `size` is below the latest checkpoint's or above the stored tree size.
    fn put_checkpoint(&self, size: TreeSize, note: &str) -> Result<(), StoreError>;

    /// Stores `line`, the cosignature line (docs/protocol.md §14.2) that
    /// `cosigner` returned for the checkpoint stored for `size`, atomically
    /// but not necessarily durably (as [`LogStore::put_checkpoint`]).
    /// `cosigner` names the cosigner's key (`name+hex8(key id)`, §14.5). Storing
    /// the same line again is a no-op (contract rule 7).
    ///
    /// # Errors
    /// [`StoreError::Conflict`] when no checkpoint is stored for `size` or a
    /// different line is stored for `(size, cosigner)`.
    fn put_cosignature(&self, size: TreeSize, cosigner: &str, line: &str)
        -> Result<(), StoreError>;

    /// The cosignature lines stored for the checkpoint of `size`, as
    /// `(cosigner, line)` pairs ordered by cosigner.
    ///
    /// # Errors
    /// [`StoreError`] when the backend fails.
    fn cosignatures(&self, size: TreeSize) -> Result<Vec<(String, String)>, StoreError>;

    /// Makes every earlier write durable (a clean shutdown calls it).
    ///
    /// # Errors
    /// [`StoreError`] when the backend fails.
    fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// This store as one that several fronts share ([`SharedStore`]), if
    /// it was opened as one: [`crate::Log::open`] then opens a front over
    /// it. A store one process owns answers `None`.
    fn shared(self: std::sync::Arc<Self>) -> Option<std::sync::Arc<dyn SharedStore>> {
        None
    }
}

/// The rules of [`LogStore::put_cosignature`], shared by the backends.
///
/// # Errors
/// [`StoreError::Conflict`] as documented there. `Ok(true)` means the same
/// line is already stored.
pub(crate) fn check_put_cosignature(
    size: TreeSize,
    cosigner: &str,
    line: &str,
    checkpoint_stored: bool,
    existing: Option<&str>,
) -> Result<bool, StoreError> {
    if !checkpoint_stored {
        return Err(StoreError::Conflict(format!(
            "no checkpoint is stored for size {size} to keep a cosignature beside"
        )));
    }
    match existing {
        Some(old) if old == line => Ok(true),
        Some(_) => Err(StoreError::Conflict(format!(
            "a different cosignature of {cosigner} is already stored for size {size}"
        ))),
        None => Ok(false),
    }
}

/// The rules of [`LogStore::put_checkpoint`], shared by the backends.
///
/// # Errors
/// [`StoreError::Conflict`] as documented there. `Ok(true)` means the same
/// note is already stored.
pub(crate) fn check_put_checkpoint(
    size: TreeSize,
    note: &str,
    tree_size: TreeSize,
    existing: Option<&str>,
    latest: Option<TreeSize>,
) -> Result<bool, StoreError> {
    if let Some(old) = existing {
        return if old == note {
            Ok(true)
        } else {
            Err(StoreError::Conflict(format!(
                "a different checkpoint is already stored for size {size}"
            )))
        };
    }
    if size > tree_size {
        return Err(StoreError::Conflict(format!(
            "checkpoint size {size} is beyond the stored tree size {tree_size}"
        )));
    }
    if let Some(latest) = latest {
        if size < latest {
            return Err(StoreError::Conflict(format!(
                "checkpoint size {size} is below the latest checkpoint size {latest}"
            )));
        }
    }
    Ok(false)
}

/// The sequencer's lease over a store several processes share
/// (docs/operations.md, "Running on PostgreSQL"): at most one holder
/// sequences the log. Every write of the store checks, in the step that
/// makes it, that this store's token is the current one, so a holder that
/// lost the lease (paused past its expiry, cut off) can never write after
/// another took over: its write fails with [`StoreError::Fenced`] and
/// nothing lands. A holder keeps its lease renewed by itself while it
/// lives.
pub trait Lease: Send + Sync {
    /// Takes the lease if this store holds none and it is free or expired
    /// (and then keeps it renewed); whether this store holds it now.
    ///
    /// # Errors
    /// [`StoreError::Backend`] when the store cannot be reached.
    fn try_lease(&self) -> Result<bool, StoreError>;

    /// Gives the lease up, if this store holds it: its writes are fenced
    /// from now on, and another process may take it at once.
    fn release_lease(&self);

    /// The fencing token of the lease this store holds (0: none, or lost).
    fn lease_token(&self) -> i64;

    /// How long the lease lasts unrenewed.
    fn lease_ttl(&self) -> std::time::Duration;

    /// Who holds the lease, for messages.
    ///
    /// # Errors
    /// [`StoreError::Backend`] when the store cannot be reached.
    fn lease_holder(&self) -> Result<String, StoreError>;
}

/// An open hand-over request: `(id, received, items)`.
pub type OpenRow = (i64, i64, String);

/// The hand-over (docs/storage.md, "PostgreSQL layout", `tally_pending`):
/// how a front that does not sequence passes admitted requests to the one
/// that does, and gets their answers back. The requests and answers are
/// opaque text here (the front encodes them). None of these writes needs
/// the lease: they are not the log.
pub trait HandOver: Send + Sync {
    /// Stores one request per `(received, items)`, in order, and wakes
    /// [`HandOver::on_requests`]; the new requests' ids, ascending in the
    /// same order.
    ///
    /// # Errors
    /// [`StoreError::Backend`] (the requests may or may not have landed).
    fn pending_insert(
        &self,
        front: &str,
        requests: &[(i64, String)],
    ) -> Result<Vec<i64>, StoreError>;

    /// Up to `limit` unanswered requests in id order, leaving out `skip`
    /// (those being integrated already).
    ///
    /// # Errors
    /// [`StoreError::Backend`].
    fn pending_open(&self, skip: &[i64], limit: i64) -> Result<Vec<OpenRow>, StoreError>;

    /// Writes answers `(id, answers)` of requests not answered yet (the
    /// first answer stands), durably, then wakes [`HandOver::on_answers`].
    ///
    /// # Errors
    /// [`StoreError::Backend`].
    fn pending_answer(&self, answers: &[(i64, String)]) -> Result<(), StoreError>;

    /// The answers written so far for the requests `ids`.
    ///
    /// # Errors
    /// [`StoreError::Backend`].
    fn pending_answers(&self, ids: &[i64]) -> Result<Vec<(i64, String)>, StoreError>;

    /// Deletes answered requests: `ids`, and every one answered more than
    /// `older_than_secs` ago (nobody came back for it); how many.
    ///
    /// # Errors
    /// [`StoreError::Backend`].
    fn pending_delete(&self, ids: &[i64], older_than_secs: f64) -> Result<u64, StoreError>;

    /// Woken when requests were handed over (the sequencer waits on it;
    /// it polls as well, since a wake may be lost).
    ///
    /// # Errors
    /// [`StoreError::Backend`] when the store cannot be listened to.
    fn on_requests(&self) -> Result<std::sync::Arc<tokio::sync::Notify>, StoreError>;

    /// Woken when answers were written (followers wait on it, and poll).
    ///
    /// # Errors
    /// [`StoreError::Backend`] when the store cannot be listened to.
    fn on_answers(&self) -> Result<std::sync::Arc<tokio::sync::Notify>, StoreError>;
}

/// A store several fronts share ([`LogStore::shared`]; [`crate::Log::open`]
/// opens a front over it): the log's tables, the sequencer's lease and the
/// hand-over.
pub trait SharedStore: LogStore + Lease + HandOver {
    /// This store as the log's tables.
    fn log_store(self: std::sync::Arc<Self>) -> std::sync::Arc<dyn LogStore>;
}
