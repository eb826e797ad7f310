//! What the console's pages show, read from the log and the registry
//! (issue 7, "Pages"): per-agent summaries, records per hour, an agent's
//! decision/outcome pairs, tool lists and notes, one record with its proof,
//! and the verifier's report over a pack exported on the fly.
//!
//! Coverage and the twelve checks are never computed here: a pack of the
//! agent's records is written by [`crate::export::write_pack`] into a pipe
//! and read by [`tally_verifier::verify`], exactly as an auditor's
//! `tally verify` would read it (docs/protocol.md §9, §11). Memory stays
//! bounded: the pack is never held whole.
//!
//! Every read here is blocking (redb); handlers call these from
//! `spawn_blocking`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{BufReader, Read};

use tally_log::ChainHead;
use tally_schemas::limits::DEFAULT_MAX_SKEW_MS;
use tally_schemas::pack::AgentKeys;
use tally_schemas::record::{Body, OutcomeStatus};
use tally_schemas::{AgentName, Entry, Hash, LeafIndex, Seq, TreeSize, UnixMillis};
use tally_verifier::{verify, Verification, VerifyError, VerifyOptions};

use crate::error::WitnessError;
use crate::export::{self, ExportRange};
use crate::witness::Witness;

/// Most records of one chain an agent page reads (the newest ones).
pub const MAX_SCAN_RECORDS: u64 = 200_000;
/// Most log entries the records-per-hour chart reads.
pub const MAX_CHART_SCAN: u64 = 100_000;
/// Hours in the records-per-hour chart.
pub const CHART_HOURS: usize = 24;
/// Notes kept for an agent page (the newest).
const MAX_NOTES: usize = 50;
/// Tool-list records kept for an agent page (the newest).
const MAX_TOOL_LISTS: usize = 20;
/// Records after a decision searched for its outcome (record page).
const OUTCOME_SEARCH: u64 = 10_000;
/// Worker threads for a verification run by the console.
pub const VERIFY_THREADS: usize = 2;

/// A time range on the witness's receive time: `since <= received < until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TimeRange {
    /// Inclusive start.
    pub since: Option<UnixMillis>,
    /// Exclusive end.
    pub until: Option<UnixMillis>,
}

impl TimeRange {
    /// Whether `t` is in the range.
    #[must_use]
    pub fn contains(&self, t: UnixMillis) -> bool {
        self.since.is_none_or(|s| t >= s) && self.until.is_none_or(|u| t < u)
    }

    /// The export range of this time range.
    #[must_use]
    pub fn export_range(&self) -> ExportRange {
        if self.since.is_none() && self.until.is_none() {
            ExportRange::All
        } else {
            ExportRange::Time {
                since: self.since,
                until: self.until,
            }
        }
    }
}

/// One agent on the overview.
#[derive(Debug, Clone)]
pub struct AgentSummary {
    /// Its name.
    pub agent: AgentName,
    /// Its chain head (`None` before its first record).
    pub head: Option<ChainHead>,
    /// The witness's receive time of the head record.
    pub last_received: Option<UnixMillis>,
    /// Keys active now.
    pub active_keys: usize,
    /// Keys registered.
    pub keys: usize,
}

impl AgentSummary {
    /// Number of records in its chain.
    #[must_use]
    pub fn records(&self) -> u64 {
        self.head.as_ref().map_or(0, |h| h.seq.get() + 1)
    }
}

/// Summaries of `agents` (their registry rows are read from the registry).
///
/// # Errors
/// Storage failures.
pub fn agent_summaries(
    w: &Witness,
    agents: &[AgentName],
) -> Result<Vec<AgentSummary>, WitnessError> {
    let now = w.now();
    let mut out = Vec::with_capacity(agents.len());
    for agent in agents {
        let row = w.registry().agent(agent);
        let head = w.log().chain_head(agent)?;
        let last_received = match &head {
            Some(h) => w.log().entry(h.index)?.map(|e| e.received()),
            None => None,
        };
        out.push(AgentSummary {
            agent: agent.clone(),
            head,
            last_received,
            active_keys: row
                .as_ref()
                .map_or(0, |r| r.keys.iter().filter(|k| k.active_at(now)).count()),
            keys: row.as_ref().map_or(0, |r| r.keys.len()),
        });
    }
    Ok(out)
}

/// Records per hour for the last [`CHART_HOURS`] hours (oldest first) of
/// `agents`, and whether the scan stopped at [`MAX_CHART_SCAN`] entries.
/// Receive times never decrease in log order, so the scan walks back from
/// the end of the log and stops at the window's start.
///
/// # Errors
/// Storage failures.
pub fn records_per_hour(
    w: &Witness,
    agents: &HashSet<AgentName>,
    now: UnixMillis,
) -> Result<(Vec<u64>, bool), WitnessError> {
    let hour = 3_600_000i64;
    let end_hour = now.as_millis().div_euclid(hour) + 1;
    let start = (end_hour - CHART_HOURS as i64) * hour;
    let mut counts = vec![0u64; CHART_HOURS];
    let size = w.log().latest_checkpoint().checkpoint.size.get();
    let mut next_end = size;
    let mut scanned = 0u64;
    while next_end > 0 {
        if scanned >= MAX_CHART_SCAN {
            return Ok((counts, true));
        }
        let begin = next_end.saturating_sub(256);
        let raw = w
            .log()
            .store()
            .entries(LeafIndex::new(begin), LeafIndex::new(next_end))?;
        for bytes in raw.iter().rev() {
            scanned += 1;
            let entry = Entry::from_json(bytes).map_err(|e| WitnessError::internal(&e))?;
            let t = entry.received().as_millis();
            if t < start {
                return Ok((counts, false));
            }
            if agents.contains(&entry.record().agent) {
                let slot = usize::try_from((t - start) / hour).unwrap_or(usize::MAX);
                if let Some(c) = counts.get_mut(slot) {
                    *c += 1;
                }
            }
        }
        next_end = begin;
    }
    Ok((counts, false))
}

/// Where a record sits in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// Its seq.
    pub seq: u64,
    /// Its log index.
    pub index: u64,
    /// The agent's time.
    pub time: UnixMillis,
    /// The witness's receive time.
    pub received: UnixMillis,
    /// The size of the checkpoint its receipt was issued under.
    pub receipt_size: u64,
}

/// One decision and its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRow {
    /// The call id.
    pub call_id: String,
    /// The tool (empty for an outcome whose decision is not shown).
    pub tool: String,
    /// The decision, if read.
    pub decision: Option<Placed>,
    /// The outcome and its status, if there is one.
    pub outcome: Option<(Placed, OutcomeStatus)>,
}

impl CallRow {
    /// Whether the call has no outcome yet.
    #[must_use]
    pub fn is_open(&self) -> bool {
        self.outcome.is_none()
    }

    /// Whether the call ended in anything but `ok`.
    #[must_use]
    pub fn is_error(&self) -> bool {
        self.outcome
            .as_ref()
            .is_some_and(|(_, s)| *s != OutcomeStatus::Ok)
    }

    /// The status word shown.
    #[must_use]
    pub fn status(&self) -> &'static str {
        match &self.outcome {
            None => "open",
            Some((_, s)) => s.as_str(),
        }
    }

    /// Time of the newest record of the pair (for ordering).
    fn newest_index(&self) -> u64 {
        self.outcome
            .as_ref()
            .map(|(p, _)| p.index)
            .or(self.decision.as_ref().map(|p| p.index))
            .unwrap_or(0)
    }
}

/// One tool of a tools record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolRow {
    /// Name.
    pub name: String,
    /// Whether calls to it are recorded.
    pub recorded: bool,
    /// The definition digest.
    pub digest: Hash,
}

/// One `tools` record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolListRow {
    /// Where it is.
    pub at: Placed,
    /// List id.
    pub list_id: String,
    /// Part number (0-based).
    pub part: u32,
    /// Number of parts.
    pub parts: u32,
    /// The tools of this part.
    pub tools: Vec<ToolRow>,
}

/// A note or key rotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherRow {
    /// Where it is.
    pub at: Placed,
    /// `note` or `key_rotation`.
    pub kind: &'static str,
    /// The note's text, or the new key id.
    pub text: String,
}

/// What an agent page shows of the chain.
#[derive(Debug, Clone, Default)]
pub struct ChainView {
    /// Decision/outcome pairs, newest first.
    pub calls: Vec<CallRow>,
    /// The newest tools records, newest first.
    pub tool_lists: Vec<ToolListRow>,
    /// The newest notes and key rotations, newest first.
    pub others: Vec<OtherRow>,
    /// Records read.
    pub scanned: u64,
    /// Older records not read (beyond [`MAX_SCAN_RECORDS`]).
    pub not_scanned: u64,
}

fn placed(seq: Seq, entry: &Entry, receipt_size: TreeSize) -> Placed {
    Placed {
        seq: seq.get(),
        index: entry.index().get(),
        time: entry.record().time,
        received: entry.received(),
        receipt_size: receipt_size.get(),
    }
}

/// Reads `agent`'s chain (the newest [`MAX_SCAN_RECORDS`] records within
/// `range`) into pairs, tool lists and notes.
///
/// # Errors
/// Storage failures.
pub fn chain_view(
    w: &Witness,
    agent: &AgentName,
    head: Option<&ChainHead>,
    range: TimeRange,
) -> Result<ChainView, WitnessError> {
    let mut view = ChainView::default();
    let Some(head) = head else {
        return Ok(view);
    };
    let total = head.seq.get() + 1;
    let from = total.saturating_sub(MAX_SCAN_RECORDS);
    view.not_scanned = from;
    let from = Seq::new(from).map_err(|e| WitnessError::internal(&e))?;
    let mut by_decision: HashMap<Hash, usize> = HashMap::new();
    let mut tool_lists = VecDeque::new();
    let mut others = VecDeque::new();
    for item in w.log().chain_entries(agent, from, None) {
        let ce = item?;
        let entry = &ce.entry;
        if !range.contains(entry.received()) {
            if range.until.is_some_and(|u| entry.received() >= u) {
                break;
            }
            continue;
        }
        view.scanned += 1;
        let record = entry.record();
        let at = placed(record.seq, entry, ce.receipt_size);
        match &record.body {
            Body::Decision(d) => {
                by_decision.insert(record.hash(), view.calls.len());
                view.calls.push(CallRow {
                    call_id: d.call_id.clone(),
                    tool: d.tool.clone(),
                    decision: Some(at),
                    outcome: None,
                });
            }
            Body::Outcome(o) => match by_decision.get(&o.decision) {
                Some(&i) if view.calls[i].outcome.is_none() => {
                    view.calls[i].outcome = Some((at, o.status));
                }
                _ => view.calls.push(CallRow {
                    call_id: o.call_id.clone(),
                    tool: String::new(),
                    decision: None,
                    outcome: Some((at, o.status)),
                }),
            },
            Body::Tools(list) => {
                if tool_lists.len() == MAX_TOOL_LISTS {
                    tool_lists.pop_front();
                }
                tool_lists.push_back(ToolListRow {
                    at,
                    list_id: list.list_id.clone(),
                    part: list.part,
                    parts: list.parts,
                    tools: list
                        .tools
                        .iter()
                        .map(|t| ToolRow {
                            name: t.name.clone(),
                            recorded: t.recorded,
                            digest: t.digest,
                        })
                        .collect(),
                });
            }
            Body::Note(n) => {
                if others.len() == MAX_NOTES {
                    others.pop_front();
                }
                others.push_back(OtherRow {
                    at,
                    kind: "note",
                    text: n.text.clone(),
                });
            }
            Body::KeyRotation(k) => {
                if others.len() == MAX_NOTES {
                    others.pop_front();
                }
                others.push_back(OtherRow {
                    at,
                    kind: "key_rotation",
                    text: format!("new key {}", k.new_key_id),
                });
            }
        }
    }
    view.calls
        .sort_by_key(|c| std::cmp::Reverse(c.newest_index()));
    view.tool_lists = tool_lists.into_iter().rev().collect();
    view.others = others.into_iter().rev().collect();
    Ok(view)
}

/// One record with its entry, proof and checkpoints.
#[derive(Debug, Clone)]
pub struct RecordDetail {
    /// The entry (record, index, receive time).
    pub entry: Entry,
    /// Size of the checkpoint the receipt was issued under.
    pub receipt_size: TreeSize,
    /// The latest checkpoint's size.
    pub tree_size: TreeSize,
    /// The latest checkpoint (signed note).
    pub checkpoint: String,
    /// The inclusion proof of the entry in the latest checkpoint.
    pub inclusion: Vec<Hash>,
    /// For a decision: the seq and index of its outcome, if found.
    pub outcome: Option<(Seq, LeafIndex)>,
    /// For an outcome: the index of its decision, if in the log.
    pub decision_index: Option<LeafIndex>,
}

impl RecordDetail {
    /// The seq range of the record's download: the record alone, or for an
    /// answered decision the records through its outcome, because a pack
    /// that ends on a decision without its outcome fails check 10
    /// (`outcomes`) once the grace window has passed.
    #[must_use]
    pub fn pack_range(&self) -> (Seq, Seq) {
        let seq = self.entry.record().seq;
        (seq, self.outcome.map_or(seq, |(s, _)| s))
    }
}

/// The record at `index`, if the latest checkpoint covers it.
///
/// # Errors
/// Storage failures.
pub fn record_detail(w: &Witness, index: LeafIndex) -> Result<Option<RecordDetail>, WitnessError> {
    let cp = w.log().latest_checkpoint();
    let Some(entry) = w.log().entry(index)? else {
        return Ok(None);
    };
    let receipt_size = w
        .log()
        .receipt_size(index)?
        .ok_or_else(|| WitnessError::internal(&format!("entry {index} has no receipt size")))?;
    let (tree_size, inclusion) = w.log().inclusion_proof(index, Some(cp.checkpoint.size))?;
    let record = entry.record();
    let mut outcome = None;
    let mut decision_index = None;
    match &record.body {
        Body::Decision(_) => {
            let hash = record.hash();
            if let Some(next) = record.seq.next() {
                let to = Seq::new(
                    next.get()
                        .saturating_add(OUTCOME_SEARCH)
                        .min(tally_schemas::limits::MAX_COUNTER),
                )
                .ok();
                for item in w.log().chain_entries(&record.agent, next, to) {
                    let ce = item?;
                    if let Body::Outcome(o) = &ce.entry.record().body {
                        if o.decision == hash {
                            outcome = Some((ce.entry.record().seq, ce.entry.index()));
                            break;
                        }
                    }
                }
            }
        }
        Body::Outcome(o) => decision_index = w.log().index_of_record(&o.decision)?,
        _ => {}
    }
    Ok(Some(RecordDetail {
        entry,
        receipt_size,
        tree_size,
        checkpoint: cp.note.clone(),
        inclusion,
        outcome,
        decision_index,
    }))
}

/// Reads bytes that arrive as chunks from another thread.
pub struct ChunkReader<F> {
    next: F,
    chunk: Vec<u8>,
    pos: usize,
}

impl<F: FnMut() -> Option<std::io::Result<Vec<u8>>>> ChunkReader<F> {
    /// A reader over the chunks `next` yields (`None` is the end).
    pub fn new(next: F) -> Self {
        Self {
            next,
            chunk: Vec::new(),
            pos: 0,
        }
    }
}

impl<F: FnMut() -> Option<std::io::Result<Vec<u8>>>> Read for ChunkReader<F> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.pos == self.chunk.len() {
            match (self.next)() {
                None => return Ok(0),
                Some(Err(e)) => return Err(e),
                Some(Ok(c)) => {
                    self.chunk = c;
                    self.pos = 0;
                }
            }
        }
        let n = out.len().min(self.chunk.len() - self.pos);
        out[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Runs the verifier over a pack read from `pack`, with the witness's own
/// log key pinned unless `log_key` names another.
///
/// # Errors
/// [`VerifyError`] when the input is not a pack at all (what `tally
/// verify` exits 2 for).
pub fn run_verify(
    pack: impl Read,
    keys: &AgentKeys,
    log_key: &tally_schemas::NoteVerifier,
    head: Option<&tally_schemas::pack::Head>,
    max_skew_ms: u64,
) -> Result<Verification, VerifyError> {
    verify(
        BufReader::with_capacity(1 << 16, pack),
        keys,
        log_key,
        head,
        VerifyOptions {
            max_skew_ms,
            grace_ms: DEFAULT_MAX_SKEW_MS,
            threads: VERIFY_THREADS,
            witnesses: None,
            progress: None,
        },
    )
}

/// Exports a pack of `agents` over `range` and verifies it with the
/// project's agent keys and the witness's log key: the report an auditor
/// would get from `tally verify` on the same pack.
///
/// # Errors
/// `NoRecords` when an agent has nothing in range; storage failures; a
/// verifier that refuses the pack (which would be a bug in the export).
pub fn verify_export(
    w: &Witness,
    project: &str,
    agents: &[AgentName],
    range: ExportRange,
) -> Result<Verification, WitnessError> {
    let plan = export::plan_pack(w.log(), agents, range)?;
    let keys = export::agent_keys(w.registry(), w.log().origin(), project, agents)?;
    let created = w.now();
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(64);
    let log = std::sync::Arc::clone(w.log());
    let writer = std::thread::Builder::new()
        .name("console-export".into())
        .spawn(move || {
            let mut sink = |line: Vec<u8>| tx.send(line).map_err(|_| WitnessError::ShuttingDown);
            export::write_pack(&log, &plan, created, &mut sink)
        })
        .map_err(|e| WitnessError::internal(&e))?;
    let reader = ChunkReader::new(move || rx.recv().ok().map(Ok));
    let result = run_verify(
        reader,
        &keys,
        w.log().verifier(),
        None,
        w.config().max_skew_ms,
    );
    let written = writer
        .join()
        .map_err(|_| WitnessError::internal(&"the export thread panicked"))?;
    // A verifier that stopped early drops the pipe, which ends the export
    // with `ShuttingDown`; its own error is the one to report.
    let verification = result.map_err(|e| WitnessError::internal(&e))?;
    written?;
    Ok(verification)
}
