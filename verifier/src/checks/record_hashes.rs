//! Check 4, `record_hashes` (docs/protocol.md §3.2 and §11): every hash that
//! refers to a record recomputes from its canonical bytes:
//!
//! - `prev` of a record that directly follows the last record that extended
//!   its agent's chain ([`Step::Follows`], the chain walk of check 5) equals
//!   that record's hash;
//! - an outcome's `decision` equals the hash of one of the agent's open
//!   decisions with its `call_id`, when there is any
//!   ([`Answer::same_call_id`], check 10's open decisions), in whatever
//!   order several such decisions are answered;
//! - each receipt's `record_hash` equals its record's hash.

use tally_schemas::record::Outcome;
use tally_schemas::report::{CheckId, CheckResult};

use super::chain::Step;
use super::outcomes::Answer;
use super::Facts;
use crate::tally::Tally;

pub(crate) struct RecordHashes {
    tally: Tally,
    prev_links: u64,
    decision_links: u64,
    receipt_hashes: u64,
}

impl RecordHashes {
    pub(crate) fn new() -> Self {
        Self {
            tally: Tally::new(CheckId::RecordHashes),
            prev_links: 0,
            decision_links: 0,
            receipt_hashes: 0,
        }
    }

    /// `prev`, for a record the chain walk says follows directly.
    pub(crate) fn prev(&mut self, f: &Facts<'_>, step: &Step) {
        let Step::Follows { prev } = step else { return };
        self.prev_links += 1;
        if f.record().prev != Some(*prev) {
            self.tally.fail(
                f.named(),
                format!(
                    "prev does not equal the hash of seq {} ({prev})",
                    f.seq() - 1
                ),
            );
        }
    }

    /// An outcome's `decision`, against the open decisions with its call_id.
    pub(crate) fn outcome(&mut self, f: &Facts<'_>, o: &Outcome, answer: &Answer) {
        if answer.same_call_id.is_empty() {
            return;
        }
        self.decision_links += 1;
        if !answer.same_call_id.contains(&o.decision) {
            let open: Vec<String> = answer
                .same_call_id
                .iter()
                .map(ToString::to_string)
                .collect();
            self.tally.fail(
                f.named(),
                format!(
                    "outcome names decision {}, but the open decision with call_id {:?} hashes to {}",
                    o.decision,
                    o.call_id,
                    open.join(" or ")
                ),
            );
        }
    }

    /// A receipt's `record_hash`.
    pub(crate) fn receipt(&mut self, f: &Facts<'_>) {
        let Some(r) = &f.work.line.receipt else {
            return;
        };
        self.receipt_hashes += 1;
        if r.record_hash != f.hash {
            self.tally.fail(
                f.named(),
                format!(
                    "receipt names record hash {}, the record hashes to {}",
                    r.record_hash, f.hash
                ),
            );
        }
    }

    pub(crate) fn finish(self) -> CheckResult {
        self.tally.finish(format!(
            "{} prev links, {} outcome decision hashes and {} receipt hashes recompute",
            self.prev_links, self.decision_links, self.receipt_hashes
        ))
    }
}
