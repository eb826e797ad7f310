//! The twelve checks of docs/protocol.md §11, one module each, in the order
//! of the table. Each module owns its state and its report line; the
//! streaming driver (`crate::verify`) reads the pack and hands every check
//! the lines it judges, in pack order.
//!
//! Two readings are shared, and each lives with the check that defines it:
//! the *chain walk* of check 5 ([`chain::Step`], whose prev links check 4
//! compares), and the *open decisions* of check 10 ([`outcomes::Answer`],
//! whose call_ids check 4 and whose times check 9 compare).

pub(crate) mod agent_keys;
pub(crate) mod chain;
pub(crate) mod head;
pub(crate) mod inclusion;
pub(crate) mod log_consistency;
pub(crate) mod outcomes;
pub(crate) mod receipts;
pub(crate) mod record_hashes;
pub(crate) mod record_signatures;
pub(crate) mod schema;
pub(crate) mod timing;
pub(crate) mod witness_signatures;

use tally_schemas::pack::Witnessed;
use tally_schemas::report::RecordRef;
use tally_schemas::{Hash, Record};

use crate::pool::RecordWork;

/// A header agent: the first listing of each name, in header order (§9.1,
/// check 1). A range with `first_seq > last_seq` is empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Agent {
    pub name: String,
    pub first_seq: u64,
    pub last_seq: u64,
}

impl Agent {
    /// Whether `seq` is within the agent's range.
    pub(crate) fn holds(&self, seq: u64) -> bool {
        (self.first_seq..=self.last_seq).contains(&seq)
    }

    /// Records the range claims: 0 for an empty one.
    pub(crate) fn claimed(&self) -> u64 {
        if self.first_seq > self.last_seq {
            0
        } else {
            self.last_seq - self.first_seq + 1
        }
    }
}

/// A record line that passed check 1's per-record rules (a listed agent, a
/// seq within its range), with what the parallel half found. Records that
/// fail those rules are seen by no other check (§11).
pub(crate) struct Facts<'a> {
    /// The line number (the header is line 1).
    pub line: u64,
    /// The agent's position among the header agents.
    pub agent: usize,
    /// The record line and the parallel half's results.
    pub work: &'a RecordWork,
    /// How reports name the record (`agent#seq@index`).
    pub rref: RecordRef,
    /// Its record hash (§3.2).
    pub hash: Hash,
}

impl Facts<'_> {
    pub(crate) fn record(&self) -> &Record {
        &self.work.line.record
    }

    pub(crate) fn seq(&self) -> u64 {
        self.work.line.record.seq.get()
    }

    pub(crate) fn witnessed(&self) -> Option<&Witnessed> {
        self.work.line.witnessed.as_ref()
    }

    /// A copy of the reference, for a check that names the record.
    pub(crate) fn named(&self) -> Option<RecordRef> {
        Some(self.rref.clone())
    }
}

/// `1 thing` or `n things`.
pub(crate) fn plural(n: u64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}
