//! Check 1, `schema` (docs/protocol.md §9.1 and §11): every line parses
//! under §2 and §9.1, in order, within its limit; the header's agents are
//! sorted, unique, at most 4,096, with `first_seq ≤ last_seq`, claiming at
//! most `MAX_RECORDS_PER_PACK` records; at most that many checkpoint lines
//! (and at most one per record claimed) and record lines; every record's
//! agent listed and its seq in range; the end line's counts match.
//!
//! A header that breaks its rules is still used: the first listing of each
//! name counts, and an agent whose range is inverted claims nothing
//! (§11 check 1). The per-record rules decide which records the other
//! checks see.

use std::collections::HashMap;

use tally_schemas::limits::{MAX_AGENTS_PER_PACK, MAX_RECORDS_PER_PACK, MAX_WIRE_OBJECT_BYTES};
use tally_schemas::pack::{PackEnd, PackHeader};
use tally_schemas::report::{CheckId, CheckResult, RecordRef};
use tally_schemas::tree::TreeSize;

use super::Agent;
use crate::tally::Tally;

/// Where in the pack the lines are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Checkpoints,
    Records,
    Ended,
}

pub(crate) struct Schema {
    tally: Tally,
    /// Lines after the header.
    lines: u64,
    checkpoint_lines: u64,
    record_lines: u64,
    /// Records the header claims (at most `MAX_RECORDS_PER_PACK`): also the
    /// most checkpoint lines a pack may have.
    claimed: u64,
    phase: Phase,
    /// The first end line.
    end: Option<PackEnd>,
    last_checkpoint_size: Option<u64>,
    unterminated: bool,
    index: HashMap<String, usize>,
    /// Records per agent that passed the per-record rules.
    records: Vec<u64>,
}

impl Schema {
    /// Reads the header's agents: the first listing of each name, in header
    /// order, with the header rules judged.
    pub(crate) fn new(header: &PackHeader) -> (Self, Vec<Agent>) {
        let mut tally = Tally::new(CheckId::Schema);
        let mut agents: Vec<Agent> = Vec::with_capacity(header.agents.len());
        let mut index = HashMap::new();
        let mut sorted = true;
        for (i, a) in header.agents.iter().enumerate() {
            if i > 0 && header.agents[i - 1].agent >= a.agent {
                sorted = false;
            }
            let (f, l) = (a.first_seq.get(), a.last_seq.get());
            if f > l {
                tally.fail(
                    None,
                    format!(
                        "header: agent {} has first_seq {f} above last_seq {l} (an empty range)",
                        a.agent
                    ),
                );
            }
            if index.contains_key(a.agent.as_str()) {
                continue;
            }
            index.insert(a.agent.as_str().to_owned(), agents.len());
            agents.push(Agent {
                name: a.agent.as_str().to_owned(),
                first_seq: f,
                last_seq: l,
            });
        }
        if !sorted {
            tally.fail(None, "header: agents are not sorted by name and unique");
        }
        if header.agents.len() > MAX_AGENTS_PER_PACK {
            tally.fail(
                None,
                format!(
                    "header: {} agents, more than {MAX_AGENTS_PER_PACK}",
                    header.agents.len()
                ),
            );
        }
        let claimed = agents
            .iter()
            .fold(0u64, |sum, a| sum.saturating_add(a.claimed()));
        if claimed > MAX_RECORDS_PER_PACK {
            tally.fail(
                None,
                format!("header: the agents' ranges hold {claimed} records, more than {MAX_RECORDS_PER_PACK}"),
            );
        }
        let records = vec![0; agents.len()];
        (
            Self {
                tally,
                lines: 0,
                checkpoint_lines: 0,
                record_lines: 0,
                claimed: claimed.min(MAX_RECORDS_PER_PACK),
                phase: Phase::Checkpoints,
                end: None,
                last_checkpoint_size: None,
                unterminated: false,
                index,
                records,
            },
            agents,
        )
    }

    /// Every line after the header, before it is judged as its type.
    pub(crate) fn line(&mut self, n: u64) {
        self.lines += 1;
        if self.phase == Phase::Ended {
            self.tally
                .fail(None, format!("line {n}: a line after the end line"));
        }
    }

    /// A line that is not a pack line under §2 and §9.1; it is ignored.
    pub(crate) fn bad(&mut self, n: u64, why: &str) {
        self.tally.fail(None, format!("line {n}: {why}"));
    }

    /// A line over its limit, skipped unread.
    pub(crate) fn too_long(&mut self, n: u64, len: u64) {
        self.tally.fail(
            None,
            format!("line {n}: {len} bytes, more than the limit of {MAX_WIRE_OBJECT_BYTES}"),
        );
    }

    pub(crate) fn second_header(&mut self, n: u64) {
        self.tally
            .fail(None, format!("line {n}: a second header line"));
    }

    /// An end line: the first one's counts are compared at the end.
    pub(crate) fn end_line(&mut self, n: u64, end: PackEnd) {
        if self.end.is_some() {
            self.tally
                .fail(None, format!("line {n}: a second end line"));
        } else {
            self.end = Some(end);
        }
        self.phase = Phase::Ended;
    }

    /// A checkpoint line that parsed. Returns false when it is beyond the
    /// records the header claims: it and every later checkpoint line are
    /// not otherwise read (§9.1).
    pub(crate) fn checkpoint_line(&mut self, n: u64) -> bool {
        self.checkpoint_lines += 1;
        if self.checkpoint_lines > self.claimed {
            if self.checkpoint_lines == self.claimed + 1 {
                self.tally.fail(
                    None,
                    format!(
                        "line {n}: more checkpoint lines than the {} records the header claims (a pack has at most one per record); the rest are not read",
                        self.claimed
                    ),
                );
            }
            return false;
        }
        if self.phase > Phase::Checkpoints {
            self.tally.fail(
                None,
                format!("line {n}: a checkpoint line after the record lines"),
            );
        }
        true
    }

    /// The size of a checkpoint line that could be read: sizes strictly
    /// increase.
    pub(crate) fn checkpoint_size(&mut self, n: u64, size: TreeSize) {
        let size = size.get();
        if self.last_checkpoint_size.is_some_and(|last| size <= last) {
            self.tally.fail(
                None,
                format!("checkpoint line {n}: size {size} does not increase (sizes must be increasing and unique)"),
            );
        }
        self.last_checkpoint_size = Some(size);
    }

    /// A record line that parsed. Returns the agent's position when the
    /// record passes the per-record rules, which is when the other checks
    /// see it.
    pub(crate) fn record(&mut self, n: u64, rref: &RecordRef, agents: &[Agent]) -> Option<usize> {
        self.record_lines += 1;
        if self.phase < Phase::Records {
            self.phase = Phase::Records;
        }
        if self.record_lines > MAX_RECORDS_PER_PACK {
            if self.record_lines == MAX_RECORDS_PER_PACK + 1 {
                self.tally.fail(
                    Some(rref.clone()),
                    format!("more than {MAX_RECORDS_PER_PACK} records in one pack; the rest are not checked"),
                );
            }
            return None;
        }
        let Some(&ai) = self.index.get(&rref.agent) else {
            self.tally.fail(
                Some(rref.clone()),
                format!("line {n}: agent {} is not listed in the header", rref.agent),
            );
            return None;
        };
        let a = &agents[ai];
        if !a.holds(rref.seq) {
            self.tally.fail(
                Some(rref.clone()),
                format!(
                    "line {n}: seq {} is outside the header's range {}..={}",
                    rref.seq, a.first_seq, a.last_seq
                ),
            );
            return None;
        }
        self.records[ai] += 1;
        Some(ai)
    }

    /// The last line had no newline.
    pub(crate) fn unterminated(&mut self) {
        self.unterminated = true;
    }

    /// Records of agent `ai` that passed the per-record rules.
    pub(crate) fn records_of(&self, ai: usize) -> u64 {
        self.records[ai]
    }

    /// Records that passed the per-record rules.
    pub(crate) fn records(&self) -> u64 {
        self.records.iter().sum()
    }

    /// The end line's counts against the lines of each type that parsed in
    /// the whole pack; the final newline.
    pub(crate) fn finish(mut self) -> CheckResult {
        match &self.end {
            None => self.tally.fail(None, "no end line: the pack is truncated"),
            Some(e) => {
                if e.checkpoints != self.checkpoint_lines || e.records != self.record_lines {
                    self.tally.fail(
                        None,
                        format!(
                            "the end line counts {} checkpoint and {} record lines, the pack has {} and {}: truncated or padded",
                            e.checkpoints, e.records, self.checkpoint_lines, self.record_lines
                        ),
                    );
                }
            }
        }
        if self.unterminated {
            self.tally
                .fail(None, "the last line does not end in a newline");
        }
        self.tally.finish(format!(
            "{} lines: a header, {} checkpoint and {} record lines, an end line whose counts match",
            self.lines + 1,
            self.checkpoint_lines,
            self.record_lines
        ))
    }
}
