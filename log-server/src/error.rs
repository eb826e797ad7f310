//! The log's typed errors, one enum per operation whose callers act
//! differently (docs/storage.md, "Errors"). Each variant carries the evidence
//! a client needs: the first index of a replayed nonce, the chain head to
//! resync from, the sizes that were out of range.

use tally_schemas::entry::EntryError;
use tally_schemas::note::NoteError;
use tally_schemas::tree::ProofError;
use tally_schemas::{AgentName, Hash, LeafIndex, Nonce, Seq, TreeSize};

use crate::store::StoreError;

/// Why an append was refused or did not complete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    /// The sequencer's queue is full; retry later. Nothing was written.
    #[error("the log is overloaded ({capacity} appends already queued); retry later")]
    Overloaded {
        /// The queue capacity.
        capacity: usize,
    },
    /// The nonce was already used by another record.
    #[error("nonce {nonce} was already used by the record at index {first_index}")]
    NonceReplayed {
        /// The nonce.
        nonce: Nonce,
        /// Index of the entry that used it first.
        first_index: LeafIndex,
    },
    /// The record's seq/prev do not extend its agent's chain. `None`/`None`
    /// means the agent has no records yet, so only seq 0 is accepted.
    #[error(
        "record does not extend the chain of {agent}: head is seq {head_seq:?}, hash {head_hash:?}"
    )]
    ChainConflict {
        /// The agent.
        agent: AgentName,
        /// The seq of the chain's current head.
        head_seq: Option<Seq>,
        /// The record hash of the chain's current head.
        head_hash: Option<Hash>,
    },
    /// An earlier record of the same agent in the same batch (in the
    /// batch's admission order, docs/storage.md "Batches") was refused, so
    /// this one cannot extend the chain and is not considered.
    #[error("record {seq} of {agent} was refused earlier in this batch, so this later record of the same agent is not appended")]
    PriorRecordRefused {
        /// The agent.
        agent: AgentName,
        /// The seq of the first refused record of this agent in the batch.
        seq: Seq,
    },
    /// A batch holds more records than one group commit takes
    /// (`LogConfig::max_batch`). Nothing was queued.
    #[error("a batch of {count} records is more than the {max} records of one group commit")]
    BatchTooLarge {
        /// Records in the batch.
        count: usize,
        /// The largest batch.
        max: usize,
    },
    /// Returned only for a `BatchItem::Refused`: the caller refused that
    /// record before the log saw it, and the log kept its place so that the
    /// agent's later records are refused with `PriorRecordRefused`.
    #[error("refused by the caller before the log")]
    RefusedByCaller,
    /// The entry would not fit a C2SP entry bundle.
    #[error("entry: {0}")]
    Entry(#[from] EntryError),
    /// The log has reached its largest size (2^53 − 1 entries).
    #[error("the log is full")]
    LogFull,
    /// Storage failed. The record may or may not have been committed:
    /// retrying the same record is safe and returns its receipt if it was.
    #[error("storage: {0}")]
    Storage(#[from] StoreError),
    /// On a shared store (PostgreSQL): the agent's keys changed, through
    /// any front, after this record was admitted and before it could be
    /// committed (docs/protocol.md §4.1). Nothing was written for it; the
    /// caller checks it again against the new ranges and queues it again,
    /// or refuses it. Retryable; not an answer for clients.
    #[error("the keys of {agent} changed after this record was admitted; check it again")]
    KeyChanged {
        /// The agent.
        agent: AgentName,
    },
    /// The sequencer has shut down.
    #[error("the log is closed")]
    Closed,
    /// On PostgreSQL with several fronts: no sequencer answered within the
    /// front's waiting bound (a takeover is under way), or this front's
    /// sequencer lost the lease. The record may still be integrated:
    /// sending it again, to any front, is safe and returns its receipt if
    /// it was (docs/operations.md, "Running on PostgreSQL").
    #[error("no sequencer answered: {0}; retry")]
    Unavailable(String),
}

/// Why a log could not be opened over a store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// The store failed.
    #[error("storage: {0}")]
    Store(#[from] StoreError),
    /// The latest stored checkpoint is not signed by this log's key (or is
    /// malformed): refusing to sign over a log another key vouched for.
    #[error(
        "latest stored checkpoint (size {size}) does not verify with this log's key: {source}"
    )]
    ForeignCheckpoint {
        /// Its size.
        size: TreeSize,
        /// Why it does not verify.
        source: NoteError,
    },
    /// A signed checkpoint covers more entries than storage holds: committed
    /// entries were lost. The log refuses to sign a shorter tree.
    #[error("the latest checkpoint has size {checkpoint_size} but storage holds only {tree_size} entries")]
    CheckpointBeyondStorage {
        /// Size of the latest checkpoint.
        checkpoint_size: TreeSize,
        /// Entries in storage.
        tree_size: TreeSize,
    },
    /// The root recomputed from storage differs from the signed one.
    #[error("the root recomputed from storage at size {size} is {stored_root}, the signed checkpoint says {checkpoint_root}")]
    RootMismatch {
        /// The size.
        size: TreeSize,
        /// Root in the signed checkpoint.
        checkpoint_root: Hash,
        /// Root recomputed from stored hashes.
        stored_root: Hash,
    },
    /// The stored tree does not extend the last signed checkpoint.
    #[error("storage at size {to} is not consistent with the checkpoint at size {from}: {source}")]
    Inconsistent {
        /// Size of the last signed checkpoint.
        from: TreeSize,
        /// Size in storage.
        to: TreeSize,
        /// The failed check.
        source: ProofError,
    },
    /// Signing the checkpoint failed (the origin is not the key's name).
    #[error("signing the checkpoint: {0}")]
    Sign(NoteError),
}

/// Why a proof could not be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofRequestError {
    /// The requested size is beyond the latest signed checkpoint.
    #[error("size {size} is beyond the latest checkpoint's size {tree_size}")]
    SizeBeyondTree {
        /// Requested size.
        size: TreeSize,
        /// Latest checkpoint size.
        tree_size: TreeSize,
    },
    /// The leaf is not in a tree of the requested size.
    #[error("leaf index {index} is not in a tree of size {size}")]
    IndexBeyondSize {
        /// Requested index.
        index: LeafIndex,
        /// Requested size.
        size: TreeSize,
    },
    /// `from` is larger than `to`.
    #[error("size {from} is larger than size {to}")]
    SizesOutOfOrder {
        /// Older size.
        from: TreeSize,
        /// Newer size.
        to: TreeSize,
    },
    /// RFC 9162 defines no consistency proof from the empty tree.
    #[error("there is no consistency proof from the empty tree (every tree extends it)")]
    FromEmptyTree,
    /// No entry has this leaf hash (within the requested size).
    #[error("no entry with leaf hash {leaf_hash} in a tree of size {size}")]
    UnknownLeafHash {
        /// The leaf hash.
        leaf_hash: Hash,
        /// Requested size.
        size: TreeSize,
    },
    /// Storage failed.
    #[error("storage: {0}")]
    Store(#[from] StoreError),
}

/// Why stored data could not be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// Storage failed.
    #[error("storage: {0}")]
    Store(#[from] StoreError),
    /// A stored entry does not parse.
    #[error("stored entry {index} does not parse: {source}")]
    CorruptEntry {
        /// Its index.
        index: LeafIndex,
        /// Why.
        source: EntryError,
    },
    /// An entry names a receipt checkpoint that is not stored.
    #[error("the receipt checkpoint of entry {index} (size {size}) is not stored")]
    MissingCheckpoint {
        /// The entry.
        index: LeafIndex,
        /// The checkpoint size.
        size: TreeSize,
    },
}

impl From<ReadError> for AppendError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Store(s) => Self::Storage(s),
            other => Self::Storage(StoreError::Corrupt(other.to_string())),
        }
    }
}
