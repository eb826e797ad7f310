//! Check 5, `chain` (docs/protocol.md §11): per agent, the records are
//! exactly `first_seq..=last_seq`, each seq once, linked by `prev`, starting
//! at genesis or at a witnessed anchor; after a `key_rotation` the chain
//! goes on under `new_key_id`.
//!
//! The *chain walk* reads an agent's records in pack order. With `s` the
//! highest seq of the agent's records before this one, a record *extends*
//! the chain when it is the agent's first record or its seq is above `s`;
//! any other record is a duplicate, a fork or out of order, fails, and is
//! not used further by checks 4 and 5. An extending record is a [`Step`]:
//! the first one, one that follows the last extending record directly
//! (seq `s + 1`: its `prev` is compared, here and by check 4), or one after
//! a gap.

use tally_schemas::record::Body;
use tally_schemas::report::{CheckId, CheckResult};
use tally_schemas::{Hash, KeyId};

use super::{plural, Agent, Facts};
use crate::tally::Tally;

/// Where a record stands in its agent's chain walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// The agent's first record, at `first_seq`.
    First,
    /// It follows the last extending record directly; its `prev` must be
    /// that record's hash.
    Follows { prev: Hash },
    /// It extends the chain past missing seqs.
    Gap,
    /// Its seq is not above every earlier one of the agent.
    Behind,
}

#[derive(Debug, Default)]
struct Walk {
    seen: bool,
    /// The seq and hash of the last record that extended the chain.
    last_seq: u64,
    last_hash: Hash,
    /// The `new_key_id` of the last key_rotation that extended the chain,
    /// and its seq.
    required_key: Option<(KeyId, u64)>,
}

pub(crate) struct Chain {
    tally: Tally,
    walks: Vec<Walk>,
}

impl Chain {
    pub(crate) fn new(agents: usize) -> Self {
        Self {
            tally: Tally::new(CheckId::Chain),
            walks: (0..agents).map(|_| Walk::default()).collect(),
        }
    }

    /// Walks one record and judges it; returns its step, for check 4.
    pub(crate) fn record(&mut self, f: &Facts<'_>, agents: &[Agent]) -> Step {
        let a = &agents[f.agent];
        let w = &mut self.walks[f.agent];
        let rec = f.record();
        let seq = f.seq();
        let expected = if w.seen { w.last_seq + 1 } else { a.first_seq };
        let step = if !w.seen {
            if seq == a.first_seq {
                Step::First
            } else {
                Step::Gap
            }
        } else if seq <= w.last_seq {
            Step::Behind
        } else if seq == expected {
            Step::Follows { prev: w.last_hash }
        } else {
            Step::Gap
        };
        match step {
            Step::Behind => {
                self.tally.fail(
                    f.named(),
                    format!(
                        "seq {seq} comes after seq {}: a duplicate, a fork or records out of order",
                        w.last_seq
                    ),
                );
                return step;
            }
            Step::Gap => self.tally.fail(
                f.named(),
                format!("seq {expected}..={} missing before it (a gap)", seq - 1),
            ),
            Step::First => {
                if seq > 0 && f.witnessed().is_none() {
                    self.tally.fail(
                        f.named(),
                        format!("the chain's anchor (first_seq {seq}) is not witnessed, so nothing proves where the chain starts"),
                    );
                }
            }
            Step::Follows { prev } => {
                if rec.prev != Some(prev) {
                    self.tally.fail(
                        f.named(),
                        format!(
                            "does not link: prev does not equal the hash of seq {} ({prev})",
                            seq - 1
                        ),
                    );
                }
            }
        }
        if let Some((kid, at)) = w.required_key {
            if rec.key_id != kid {
                self.tally.fail(
                    f.named(),
                    format!(
                        "signed by key {}, but the key_rotation at seq {at} moved the chain to key {kid}",
                        rec.key_id
                    ),
                );
            }
        }
        w.seen = true;
        w.last_seq = seq;
        w.last_hash = f.hash;
        if let Body::KeyRotation(k) = &rec.body {
            w.required_key = Some((k.new_key_id, seq));
        }
        step
    }

    /// Every agent's range is covered to its end. An empty range expects
    /// no record.
    pub(crate) fn finish(mut self, agents: &[Agent]) -> CheckResult {
        for (a, w) in agents.iter().zip(&self.walks) {
            if a.first_seq > a.last_seq {
                continue;
            }
            if !w.seen {
                self.tally.fail(
                    None,
                    format!(
                        "agent {}: no records, the header says {}..={}",
                        a.name, a.first_seq, a.last_seq
                    ),
                );
            } else if w.last_seq < a.last_seq {
                self.tally.fail(
                    None,
                    format!(
                        "agent {}: seq {}..={} missing at the end",
                        a.name,
                        w.last_seq + 1,
                        a.last_seq
                    ),
                );
            }
        }
        self.tally.finish(format!(
            "{} seq contiguous and linked, starting at genesis or a witnessed anchor",
            plural(
                agents.len() as u64,
                "agent's chain is",
                "agents' chains are"
            )
        ))
    }
}
