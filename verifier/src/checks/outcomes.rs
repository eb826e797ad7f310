//! Check 10, `outcomes` (docs/protocol.md §11): every decision has exactly
//! one outcome naming it; no orphan outcome; an open decision at the end of
//! the pack is `pending` within the grace window, else `fail`.
//!
//! The *open decisions* of an agent are its decisions seen so far in pack
//! order that no outcome answered yet. An outcome *answers* the open
//! decision its `decision` names when that decision has the outcome's
//! `call_id` (call_ids may repeat along a chain, as MCP request ids do). An
//! outcome that names an open decision with another call_id fails here. One
//! that names no open decision is judged at the end, against the set of
//! answered decisions: a second outcome if its decision was answered, else
//! an orphan, which fails unless the agent's range starts after genesis
//! (the decision may then be before the anchor, and cannot be judged).
//!
//! The [`Answer`] to each outcome is what checks 4 (the call_id's open
//! decisions) and 9 (the answered decision's times) compare with. The sets
//! that span the whole pack stay within a memory budget ([`crate::spill`]).

use std::collections::HashMap;
use std::hash::BuildHasher;

use tally_schemas::record::{Decision, Outcome};
use tally_schemas::report::{CheckId, CheckResult, RecordRef};
use tally_schemas::time::UnixMillis;
use tally_schemas::Hash;

use super::{plural, Agent, Facts};
use crate::spill::{self, Spill};
use crate::tally::{ref_text, Tally};

#[derive(Debug)]
struct OpenDecision {
    call_id: String,
    rref: RecordRef,
    time: UnixMillis,
    received: Option<UnixMillis>,
}

#[derive(Debug, Default)]
struct Open {
    by_hash: HashMap<Hash, OpenDecision>,
    by_call: HashMap<String, Vec<Hash>>,
}

/// What an outcome met among its agent's open decisions.
#[derive(Debug, Default)]
pub(crate) struct Answer {
    /// The hashes of the open decisions with the outcome's call_id, before
    /// it was read (check 4 requires its `decision` to be one of them).
    pub same_call_id: Vec<Hash>,
    /// The `time` and `received` of the decision it answers (check 9).
    pub answered: Option<(UnixMillis, Option<UnixMillis>)>,
}

/// An outcome whose decision was not open when it came: a second outcome,
/// an orphan, or in a pack that starts mid-chain possibly the answer to a
/// decision before the anchor. Decided at the end, against the answered
/// decisions; ordered by the fingerprint of the decision it names, then by
/// its place in the pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Unmatched {
    decision_fp: u64,
    line: u64,
    agent: u32,
    seq: u64,
    /// `u64::MAX` when not witnessed (indexes are at most 2^53 − 1).
    index: u64,
    decision: [u8; 32],
}

/// An [`Unmatched`] outcome found to fail, ordered by its place in the pack
/// so that failures are reported in pack order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Judged {
    line: u64,
    second: bool,
    outcome: Unmatched,
}

impl Unmatched {
    const BYTES: usize = 8 + 8 + 4 + 8 + 8 + 32;

    fn put_fields(&self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self.decision_fp.to_le_bytes());
        out[8..16].copy_from_slice(&self.line.to_le_bytes());
        out[16..20].copy_from_slice(&self.agent.to_le_bytes());
        out[20..28].copy_from_slice(&self.seq.to_le_bytes());
        out[28..36].copy_from_slice(&self.index.to_le_bytes());
        out[36..68].copy_from_slice(&self.decision);
    }

    fn get_fields(b: &[u8]) -> Self {
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        let mut agent = [0u8; 4];
        agent.copy_from_slice(&b[16..20]);
        let mut decision = [0u8; 32];
        decision.copy_from_slice(&b[36..68]);
        Self {
            decision_fp: u64_at(0),
            line: u64_at(8),
            agent: u32::from_le_bytes(agent),
            seq: u64_at(20),
            index: u64_at(28),
            decision,
        }
    }
}

impl spill::Item for Unmatched {
    const BYTES: usize = Self::BYTES;
    fn put(&self, out: &mut [u8]) {
        self.put_fields(out);
    }
    fn get(bytes: &[u8]) -> Self {
        Self::get_fields(bytes)
    }
}

impl spill::Item for Judged {
    const BYTES: usize = Unmatched::BYTES + 1;
    fn put(&self, out: &mut [u8]) {
        self.outcome.put_fields(out);
        out[Unmatched::BYTES] = u8::from(self.second);
    }
    fn get(bytes: &[u8]) -> Self {
        let outcome = Unmatched::get_fields(bytes);
        Self {
            line: outcome.line,
            second: bytes[Unmatched::BYTES] == 1,
            outcome,
        }
    }
}

pub(crate) struct Outcomes {
    tally: Tally,
    open: Vec<Open>,
    decisions: u64,
    answered: Spill<u64>,
    unmatched: Spill<Unmatched>,
    /// Keys the decision fingerprints (random per run, so nobody can aim a
    /// collision at them).
    fp_key: std::collections::hash_map::RandomState,
    budget: usize,
}

impl Outcomes {
    pub(crate) fn new(agents: usize, budget: usize) -> Self {
        Self {
            tally: Tally::new(CheckId::Outcomes),
            open: (0..agents).map(|_| Open::default()).collect(),
            decisions: 0,
            answered: Spill::new(budget),
            unmatched: Spill::new(budget),
            fp_key: Default::default(),
            budget,
        }
    }

    /// A decision opens.
    pub(crate) fn decision(&mut self, f: &Facts<'_>, d: &Decision) {
        self.decisions += 1;
        let open = &mut self.open[f.agent];
        if open.by_hash.contains_key(&f.hash) {
            return;
        }
        open.by_hash.insert(
            f.hash,
            OpenDecision {
                call_id: d.call_id.clone(),
                rref: f.rref.clone(),
                time: f.record().time,
                received: f.witnessed().map(|w| w.received),
            },
        );
        open.by_call
            .entry(d.call_id.clone())
            .or_default()
            .push(f.hash);
    }

    /// An outcome answers the open decision it names, when that decision
    /// has its call_id.
    pub(crate) fn outcome(&mut self, f: &Facts<'_>, o: &Outcome) -> Answer {
        let open = &mut self.open[f.agent];
        let same_call_id = open.by_call.get(&o.call_id).cloned().unwrap_or_default();
        let mut answered = None;
        match open.by_hash.get(&o.decision) {
            Some(d) if d.call_id == o.call_id => {
                answered = Some((d.time, d.received));
                open.by_hash.remove(&o.decision);
                if let Some(list) = open.by_call.get_mut(&o.call_id) {
                    list.retain(|h| *h != o.decision);
                    if list.is_empty() {
                        open.by_call.remove(&o.call_id);
                    }
                }
                self.answered
                    .push(self.fp_key.hash_one(o.decision.as_bytes()));
            }
            Some(d) => {
                let msg = format!(
                    "outcome for call_id {:?} names decision {} whose call_id is {:?}",
                    o.call_id,
                    ref_text(&d.rref),
                    d.call_id
                );
                self.tally.fail(f.named(), msg);
            }
            None => self.unmatched.push(Unmatched {
                decision_fp: self.fp_key.hash_one(o.decision.as_bytes()),
                line: f.line,
                // Below MAX_AGENTS_PER_PACK by the header check.
                agent: u32::try_from(f.agent).unwrap_or(u32::MAX),
                seq: f.seq(),
                index: f.rref.index.unwrap_or(u64::MAX),
                decision: *o.decision.as_bytes(),
            }),
        }
        Answer {
            same_call_id,
            answered,
        }
    }

    /// The decisions still open, each `pending` if `created − time ≤ grace`
    /// (a time after `created` counts as within), else `fail`; then the
    /// outcomes that named no open decision.
    ///
    /// # Errors
    /// An I/O error of the spill file.
    pub(crate) fn finish(
        mut self,
        agents: &[Agent],
        created: UnixMillis,
        grace_ms: u64,
    ) -> std::io::Result<CheckResult> {
        let open = std::mem::take(&mut self.open);
        for o in &open {
            let mut left: Vec<&OpenDecision> = o.by_hash.values().collect();
            left.sort_by_key(|d| d.rref.seq);
            for d in left {
                let age = created.as_millis().saturating_sub(d.time.as_millis());
                if age <= i64::try_from(grace_ms).unwrap_or(i64::MAX) {
                    self.tally.pending(
                        Some(d.rref.clone()),
                        format!(
                            "decision (call_id {:?}) has no outcome yet, within the grace window",
                            d.call_id
                        ),
                    );
                } else {
                    self.tally.fail(
                        Some(d.rref.clone()),
                        format!(
                            "decision (call_id {:?}) has no outcome, {age} ms before the pack was made (grace {grace_ms} ms)",
                            d.call_id
                        ),
                    );
                }
            }
        }
        self.judge_unmatched(agents)?;
        let n = self.decisions;
        Ok(self.tally.finish(format!(
            "{} {} exactly one outcome; no orphan outcomes",
            plural(n, "decision", "decisions"),
            if n == 1 { "has" } else { "each have" }
        )))
    }

    /// The outcomes whose decision was not open when they came: naming an
    /// answered decision, a second outcome; otherwise an orphan, unless the
    /// agent's range starts after genesis. Both sets are sorted by the
    /// decision's fingerprint and walked together; the failures are then
    /// sorted back into pack order.
    fn judge_unmatched(&mut self, agents: &[Agent]) -> std::io::Result<()> {
        let mut answered = std::mem::replace(&mut self.answered, Spill::new(0)).sorted()?;
        let mut unmatched = std::mem::replace(&mut self.unmatched, Spill::new(0)).sorted()?;
        let mut judged: Spill<Judged> = Spill::new(self.budget);
        let mut next_answered = answered.next_item()?;
        while let Some(u) = unmatched.next_item()? {
            while next_answered.is_some_and(|a| a < u.decision_fp) {
                next_answered = answered.next_item()?;
            }
            let second = next_answered == Some(u.decision_fp);
            let anchored = agents
                .get(u.agent as usize)
                .is_some_and(|a| a.first_seq > 0);
            if second || !anchored {
                judged.push(Judged {
                    line: u.line,
                    second,
                    outcome: u,
                });
            }
        }
        let mut judged = judged.sorted()?;
        while let Some(j) = judged.next_item()? {
            let u = j.outcome;
            let rref = RecordRef {
                agent: agents
                    .get(u.agent as usize)
                    .map_or_else(String::new, |a| a.name.clone()),
                seq: u.seq,
                index: (u.index != u64::MAX).then_some(u.index),
            };
            let decision = Hash::from_bytes(u.decision);
            let msg = if j.second {
                format!("a second outcome for decision {decision}, which already has one")
            } else {
                format!("orphan outcome: decision {decision} is not in the pack")
            };
            self.tally.fail(Some(rref), msg);
        }
        Ok(())
    }
}
