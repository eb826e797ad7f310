//! What a log is handed and what it answers, shared by the log's handle
//! (module `log`), its sequencer and its fronts, so that none of them
//! reaches into another for these types.

use tally_schemas::{AgentName, Entry, Receipt, Record, Seq};

/// A resolved append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// The entry (for a retry: the entry first committed).
    pub entry: Entry,
    /// The receipt (for a retry: byte-for-byte the receipt first issued).
    pub receipt: Receipt,
    /// Whether the record was already in the log (or earlier in the same
    /// group commit).
    pub duplicate: bool,
}

/// One item of a batch ([`crate::Log::enqueue_batch_fenced`]).
// Nearly every item is a record; boxing it would cost an allocation each.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchItem {
    /// A record the caller admitted (schema, signature, key, time): the log
    /// classifies it.
    Record(Record),
    /// A record the caller refused itself. It holds its place in its
    /// agent's seq order, so that the agent's later records in the batch
    /// are refused with [`crate::AppendError::PriorRecordRefused`]; its own answer
    /// is [`crate::AppendError::RefusedByCaller`].
    Refused {
        /// The record's agent.
        agent: AgentName,
        /// The record's seq.
        seq: Seq,
    },
}
