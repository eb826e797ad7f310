//! What the console's pages show, read from the log and the registry
//! (docs/console.md "Pages"): per-agent summaries, records per hour, an agent's
//! decision/outcome pairs, tool lists and notes, one record with its proof,
//! and the verifier's report over a pack exported on the fly.
//!
//! Coverage and the twelve checks are never computed here: a pack of the
//! agent's records is written by [`tally_witness::export::write_pack`] into a pipe
//! and read by [`tally_verifier::verify`], exactly as an auditor's
//! `tally verify` would read it (docs/protocol.md §9, §11). Memory stays
//! bounded: the pack is never held whole.
//!
//! Every read here is blocking (redb); handlers call these from
//! `spawn_blocking`.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io::{BufReader, Read};

use tally_log::ChainHead;
use tally_schemas::limits::DEFAULT_MAX_SKEW_MS;
use tally_schemas::pack::AgentKeys;
use tally_schemas::record::{ActionState, Body, OutcomeStatus};
use tally_schemas::{AgentName, Entry, Hash, LeafIndex, Seq, TreeSize, UnixMillis};
use tally_verifier::{verify, Verification, VerifyError, VerifyOptions};

use tally_witness::error::WitnessError;
use tally_witness::export::{self, ExportRange};
use tally_witness::witness::Witness;

/// Most records of one chain an agent page reads (the newest ones in range).
pub(crate) const MAX_SCAN_RECORDS: u64 = 50_000;
/// Most log entries the records-per-hour chart reads.
pub(crate) const MAX_CHART_SCAN: u64 = 100_000;
/// Hours in the records-per-hour chart.
pub(crate) const CHART_HOURS: usize = 24;
/// Notes kept for an agent page (the newest).
const MAX_NOTES: usize = 50;
/// Tool-list records kept for an agent page (the newest).
const MAX_TOOL_LISTS: usize = 20;
/// Records after a decision searched for its outcome (record page).
const OUTCOME_SEARCH: u64 = 10_000;
/// Worker threads for a verification run by the console.
pub(crate) const VERIFY_THREADS: usize = 2;

/// A time range on the witness's receive time: `since <= received < until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct TimeRange {
    /// Inclusive start.
    pub since: Option<UnixMillis>,
    /// Exclusive end.
    pub until: Option<UnixMillis>,
}

impl TimeRange {
    /// Whether `t` is in the range.
    #[must_use]
    pub(crate) fn contains(&self, t: UnixMillis) -> bool {
        self.since.is_none_or(|s| t >= s) && self.until.is_none_or(|u| t < u)
    }

    /// The export range of this time range.
    #[must_use]
    pub(crate) fn export_range(&self) -> ExportRange {
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

/// One agent on the overview, or within an auditor link's time range.
#[derive(Debug, Clone)]
pub(crate) struct AgentSummary {
    /// Its name.
    pub agent: AgentName,
    /// The seq of its first record in range (0 without a range).
    pub first_seq: u64,
    /// Its last record in range: the chain head without a range (`None`
    /// when nothing is in range).
    pub head: Option<ChainHead>,
    /// The witness's receive time of that record.
    pub last_received: Option<UnixMillis>,
    /// Keys active now.
    pub active_keys: usize,
    /// Keys registered.
    pub keys: usize,
}

impl AgentSummary {
    /// Number of its records in range.
    #[must_use]
    pub(crate) fn records(&self) -> u64 {
        self.head
            .as_ref()
            .map_or(0, |h| (h.seq.get() + 1).saturating_sub(self.first_seq))
    }
}

/// Summaries of `agents` within `range` (registry rows are read from the
/// registry). With a range, the head shown is the last record in range and
/// the count is of records in range: an auditor link shows nothing of the
/// chain outside its range.
///
/// # Errors
/// Storage failures.
pub(crate) fn agent_summaries(
    w: &Witness,
    agents: &[AgentName],
    range: TimeRange,
) -> Result<Vec<AgentSummary>, WitnessError> {
    let now = w.now();
    let mut out = Vec::with_capacity(agents.len());
    for agent in agents {
        let row = w.registry().agent(agent);
        let (first_seq, head, last_received) = in_range(w, agent, range)?;
        out.push(AgentSummary {
            agent: agent.clone(),
            first_seq,
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

/// `agent`'s first seq in `range`, its last record in range, and that
/// record's receive time (while the latest checkpoint covers it).
fn in_range(
    w: &Witness,
    agent: &AgentName,
    range: TimeRange,
) -> Result<(u64, Option<ChainHead>, Option<UnixMillis>), WitnessError> {
    let Some(head) = w.log().chain_head(agent)? else {
        return Ok((0, None, None));
    };
    let len = head.seq.get() + 1;
    let first = match range.since {
        Some(s) => w.log().chain_seq_received_from(agent, len, s)?,
        None => 0,
    };
    let end = match range.until {
        Some(u) => w.log().chain_seq_received_from(agent, len, u)?,
        None => len,
    };
    if end <= first {
        return Ok((first, None, None));
    }
    if end == len {
        let received = w.log().entry(head.index)?.map(|e| e.received());
        return Ok((first, Some(head), received));
    }
    let entry = w.log().chain_entry(agent, end - 1)?.ok_or_else(|| {
        WitnessError::internal(&format!("{agent} record {} is not readable", end - 1))
    })?;
    let last = ChainHead {
        seq: entry.record().seq,
        record_hash: entry.record().hash(),
        index: entry.index(),
    };
    Ok((first, Some(last), Some(entry.received())))
}

const HOUR_MS: i64 = 3_600_000;

/// Records per hour and agent over the last [`CHART_HOURS`] hours, kept by
/// the console between requests: each update reads only the log entries
/// appended since the last one, so a page costs what the log grew by, not
/// what it holds.
#[derive(Debug, Default)]
pub(crate) struct HourCounts {
    /// Log entries before this index are counted.
    counted_to: u64,
    /// Hour (since the epoch) → agent → records.
    hours: BTreeMap<i64, HashMap<AgentName, u64>>,
    /// When the last full read stopped at [`MAX_CHART_SCAN`] entries: the
    /// hour of the oldest entry it read, whose counts (and older) are partial.
    partial_through: Option<i64>,
}

impl HourCounts {
    /// Counts the entries appended since the last update. When there are
    /// none counted yet, or more than [`MAX_CHART_SCAN`] new ones, it reads
    /// back from the end of the log instead, to the window's start or
    /// [`MAX_CHART_SCAN`] entries (receive times never decrease in log order).
    ///
    /// # Errors
    /// Storage failures.
    pub(crate) fn update(&mut self, w: &Witness, now: UnixMillis) -> Result<(), WitnessError> {
        let first_hour = now.as_millis().div_euclid(HOUR_MS) + 1 - CHART_HOURS as i64;
        self.hours.retain(|h, _| *h >= first_hour);
        let size = w.log().latest_checkpoint().checkpoint.size.get();
        if self.counted_to == 0 || size.saturating_sub(self.counted_to) > MAX_CHART_SCAN {
            self.hours.clear();
            self.partial_through = None;
            self.counted_to = size;
            let mut next_end = size;
            let mut scanned = 0u64;
            'back: while next_end > 0 {
                let begin = next_end.saturating_sub(256);
                let raw = w
                    .log()
                    .store()
                    .entries(LeafIndex::new(begin), LeafIndex::new(next_end))?;
                for bytes in raw.iter().rev() {
                    let entry = Entry::from_json(bytes).map_err(|e| WitnessError::internal(&e))?;
                    let hour = entry.received().as_millis().div_euclid(HOUR_MS);
                    if hour < first_hour {
                        break 'back;
                    }
                    if scanned == MAX_CHART_SCAN {
                        self.partial_through = Some(hour);
                        break 'back;
                    }
                    scanned += 1;
                    self.count(hour, &entry);
                }
                next_end = begin;
            }
            return Ok(());
        }
        while self.counted_to < size {
            let end = size.min(self.counted_to + 256);
            let raw = w
                .log()
                .store()
                .entries(LeafIndex::new(self.counted_to), LeafIndex::new(end))?;
            for bytes in &raw {
                let entry = Entry::from_json(bytes).map_err(|e| WitnessError::internal(&e))?;
                let hour = entry.received().as_millis().div_euclid(HOUR_MS);
                if hour >= first_hour {
                    self.count(hour, &entry);
                }
            }
            self.counted_to = end;
        }
        Ok(())
    }

    fn count(&mut self, hour: i64, entry: &Entry) {
        *self
            .hours
            .entry(hour)
            .or_default()
            .entry(entry.record().agent.clone())
            .or_default() += 1;
    }

    /// Records of `agents` per hour for the last [`CHART_HOURS`] hours
    /// before `now` (oldest first), and whether the oldest hours are partial
    /// (a busy log: the last full read stopped at [`MAX_CHART_SCAN`] entries).
    #[must_use]
    pub(crate) fn per_hour(
        &self,
        agents: &HashSet<AgentName>,
        now: UnixMillis,
    ) -> (Vec<u64>, bool) {
        let first_hour = now.as_millis().div_euclid(HOUR_MS) + 1 - CHART_HOURS as i64;
        let counts = (first_hour..first_hour + CHART_HOURS as i64)
            .map(|h| {
                self.hours.get(&h).map_or(0, |by_agent| {
                    agents.iter().filter_map(|a| by_agent.get(a)).sum()
                })
            })
            .collect();
        (
            counts,
            self.partial_through.is_some_and(|h| h >= first_hour),
        )
    }
}

/// Where a record sits in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placed {
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
pub(crate) struct CallRow {
    /// The call id.
    pub call_id: String,
    /// The tool (empty for an outcome whose decision is not shown).
    pub tool: String,
    /// The decision, if read.
    pub decision: Option<Placed>,
    /// The outcome and its status, if there is one.
    pub outcome: Option<(Placed, OutcomeStatus)>,
    /// For an action tool's call, its outcome's state (docs/protocol.md §5.2).
    pub state: Option<ActionState>,
}

impl CallRow {
    /// Whether the call has no outcome yet.
    #[must_use]
    pub(crate) fn is_open(&self) -> bool {
        self.outcome.is_none()
    }

    /// Whether the call ended in anything but `ok`.
    #[must_use]
    pub(crate) fn is_error(&self) -> bool {
        self.outcome
            .as_ref()
            .is_some_and(|(_, s)| *s != OutcomeStatus::Ok)
    }

    /// The status word shown.
    #[must_use]
    pub(crate) fn status(&self) -> &'static str {
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
pub(crate) struct ToolRow {
    /// Name.
    pub name: String,
    /// Whether calls to it are recorded.
    pub recorded: bool,
    /// The definition digest.
    pub digest: Hash,
}

/// One `tools` record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToolListRow {
    /// Where it is.
    pub at: Placed,
    /// List id.
    pub list_id: String,
    /// Part number (0-based).
    pub part: u32,
    /// Number of parts.
    pub parts: u32,
    /// The tool source that declared it (docs/protocol.md §5.3), if named.
    pub source: Option<String>,
    /// The tools of this part.
    pub tools: Vec<ToolRow>,
}

/// A note or key rotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OtherRow {
    /// Where it is.
    pub at: Placed,
    /// `note`, `key_rotation` or `tool_check`.
    pub kind: &'static str,
    /// The note's text, the new key id, or what a tool check found.
    pub text: String,
}

/// A `claim` record (docs/protocol.md §5.6): a model turn that claimed an
/// action tool's work with no call to it.
#[derive(Debug, Clone)]
pub(crate) struct ClaimRow {
    /// Where it is.
    pub at: Placed,
    /// The action tool claimed.
    pub tool: String,
    /// The salted hash of the turn's text.
    pub turn_hash: Hash,
}

/// What an agent page shows of the chain: read once from the first record
/// shown, then extended by the records appended since (the console keeps
/// views per agent and range, see [`super::Console`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct ChainView {
    /// Decision/outcome pairs, in decision order.
    calls: Vec<CallRow>,
    /// Decisions still without an outcome: record hash → row.
    open: HashMap<Hash, usize>,
    /// The newest tools records, oldest first.
    tool_lists: VecDeque<ToolListRow>,
    /// The newest notes and key rotations, oldest first.
    others: VecDeque<OtherRow>,
    /// The newest claims (docs/protocol.md §5.6), oldest first.
    claims: VecDeque<ClaimRow>,
    /// Claims read, all of them.
    claim_count: u64,
    /// The first seq read.
    first_seq: u64,
    /// The next seq to read.
    next_seq: u64,
    /// Records in range before `first_seq`, not read.
    pub not_scanned: u64,
}

impl ChainView {
    /// An empty view that starts reading at `first_seq`, leaving the
    /// `not_scanned` records before it unread.
    #[must_use]
    pub(crate) fn starting_at(first_seq: u64, not_scanned: u64) -> Self {
        Self {
            first_seq,
            next_seq: first_seq,
            not_scanned,
            ..Self::default()
        }
    }

    /// Where a view of `summary` (an agent in range) starts: its newest
    /// [`MAX_SCAN_RECORDS`] records, and `(first seq, records not read)`.
    #[must_use]
    pub(crate) fn start_of(summary: &AgentSummary) -> (u64, u64) {
        let end = summary.head.as_ref().map_or(0, |h| h.seq.get() + 1);
        let first = summary.first_seq.max(end.saturating_sub(MAX_SCAN_RECORDS));
        (first, first - summary.first_seq.min(first))
    }

    /// Whether this view can be extended to show `summary` rather than
    /// read again: it starts where a new view would, or not too far before
    /// (a view holds at most 1.25 × [`MAX_SCAN_RECORDS`] records).
    #[must_use]
    pub(crate) fn fits(&self, summary: &AgentSummary) -> bool {
        let end = summary.head.as_ref().map_or(0, |h| h.seq.get() + 1);
        let (start, _) = Self::start_of(summary);
        self.first_seq <= start
            && self.first_seq >= summary.first_seq
            && self.next_seq <= end
            && end - self.first_seq <= MAX_SCAN_RECORDS + MAX_SCAN_RECORDS / 4
    }

    /// Reads `agent`'s records from the next unread one through `last`.
    ///
    /// # Errors
    /// Storage failures.
    pub(crate) fn extend(
        &mut self,
        w: &Witness,
        agent: &AgentName,
        last: u64,
    ) -> Result<(), WitnessError> {
        if self.next_seq > last {
            return Ok(());
        }
        let from = Seq::new(self.next_seq).map_err(|e| WitnessError::internal(&e))?;
        let to = Seq::new(last + 1).map_err(|e| WitnessError::internal(&e))?;
        for item in w.log().chain_entries(agent, from, Some(to)) {
            let ce = item?;
            self.add(&ce.entry, ce.receipt_size);
            self.next_seq = ce.entry.record().seq.get() + 1;
        }
        Ok(())
    }

    fn add(&mut self, entry: &Entry, receipt_size: TreeSize) {
        let record = entry.record();
        let at = placed(record.seq, entry, receipt_size);
        match &record.body {
            Body::Decision(d) => {
                self.open.insert(record.hash(), self.calls.len());
                self.calls.push(CallRow {
                    call_id: d.call_id.clone(),
                    tool: d.tool.clone(),
                    decision: Some(at),
                    outcome: None,
                    state: None,
                });
            }
            Body::Outcome(o) => match self.open.remove(&o.decision) {
                Some(i) => {
                    self.calls[i].outcome = Some((at, o.status));
                    self.calls[i].state = o.state;
                }
                None => self.calls.push(CallRow {
                    call_id: o.call_id.clone(),
                    tool: String::new(),
                    decision: None,
                    outcome: Some((at, o.status)),
                    state: o.state,
                }),
            },
            Body::Tools(list) => {
                if self.tool_lists.len() == MAX_TOOL_LISTS {
                    self.tool_lists.pop_front();
                }
                self.tool_lists.push_back(ToolListRow {
                    at,
                    list_id: list.list_id.clone(),
                    part: list.part,
                    parts: list.parts,
                    source: list.source.clone(),
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
            Body::Note(n) => self.push_other(OtherRow {
                at,
                kind: "note",
                text: n.text.clone(),
            }),
            Body::KeyRotation(k) => self.push_other(OtherRow {
                at,
                kind: "key_rotation",
                text: format!("new key {}", k.new_key_id),
            }),
            Body::Claim(c) => {
                if self.claims.len() == MAX_NOTES {
                    self.claims.pop_front();
                }
                self.claims.push_back(ClaimRow {
                    at,
                    tool: c.tool.clone(),
                    turn_hash: c.turn_hash,
                });
                self.claim_count += 1;
            }
            Body::ToolCheck(c) => self.push_other(OtherRow {
                at,
                kind: "tool_check",
                text: check_text(c),
            }),
        }
    }

    fn push_other(&mut self, row: OtherRow) {
        if self.others.len() == MAX_NOTES {
            self.others.pop_front();
        }
        self.others.push_back(row);
    }

    /// Decision/outcome pairs, newest first (by their newest record).
    #[must_use]
    pub(crate) fn calls(&self) -> Vec<&CallRow> {
        let mut calls: Vec<&CallRow> = self.calls.iter().collect();
        calls.sort_by_key(|c| std::cmp::Reverse(c.newest_index()));
        calls
    }

    /// The newest tools records, newest first.
    pub(crate) fn tool_lists(&self) -> impl ExactSizeIterator<Item = &ToolListRow> {
        self.tool_lists.iter().rev()
    }

    /// The newest notes and key rotations, newest first.
    pub(crate) fn others(&self) -> impl ExactSizeIterator<Item = &OtherRow> {
        self.others.iter().rev()
    }

    /// The newest claims, newest first, and how many were read in all.
    pub(crate) fn claims(&self) -> (impl ExactSizeIterator<Item = &ClaimRow>, u64) {
        (self.claims.iter().rev(), self.claim_count)
    }

    /// The calls read by their action state: (posted, unknown, failed).
    #[must_use]
    pub(crate) fn action_counts(&self) -> (usize, usize, usize) {
        let count = |s| self.calls.iter().filter(|c| c.state == Some(s)).count();
        (
            count(ActionState::Posted),
            count(ActionState::Unknown),
            count(ActionState::Failed),
        )
    }
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

/// One record with its entry, proof and checkpoints.
#[derive(Debug, Clone)]
pub(crate) struct RecordDetail {
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
    pub(crate) fn pack_range(&self) -> (Seq, Seq) {
        let seq = self.entry.record().seq;
        (seq, self.outcome.map_or(seq, |(s, _)| s))
    }
}

/// The record at `index`, if the latest checkpoint covers it.
///
/// # Errors
/// Storage failures.
pub(crate) fn record_detail(
    w: &Witness,
    index: LeafIndex,
) -> Result<Option<RecordDetail>, WitnessError> {
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
pub(crate) struct ChunkReader<F> {
    next: F,
    chunk: Vec<u8>,
    pos: usize,
}

impl<F: FnMut() -> Option<std::io::Result<Vec<u8>>>> ChunkReader<F> {
    /// A reader over the chunks `next` yields (`None` is the end).
    pub(crate) fn new(next: F) -> Self {
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
pub(crate) fn run_verify(
    pack: impl Read,
    keys: &AgentKeys,
    log_key: &tally_schemas::NoteVerifier,
    head: Option<&tally_schemas::pack::Head>,
    max_skew_ms: u64,
    grace_ms: u64,
) -> Result<Verification, VerifyError> {
    verify(
        BufReader::with_capacity(1 << 16, pack),
        keys,
        log_key,
        head,
        VerifyOptions {
            max_skew_ms,
            grace_ms,
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
pub(crate) fn verify_export(
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
        DEFAULT_MAX_SKEW_MS,
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

/// Reads through to the verifier and hashes what passes: the exported
/// pack's SHA-256, taken in the same pass (protocol.md §11.3).
struct Hashing<R> {
    inner: R,
    hash: sha2::Sha256,
    bytes: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use sha2::Digest as _;
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

/// The audit report (protocol.md §11.3) of a pack of `agents` over `range`
/// as the witness exports it, verified with the project's agent keys and
/// the witness's log key, the per-agent figures bounded by `period`, with
/// `disclosures` (named) checked against their records: what
/// `tally report` writes for the same pack and anchors. `pack_name` is the
/// file name the pack downloads as, which the reproducing command uses.
///
/// # Errors
/// As [`verify_export`].
pub(crate) fn audit_export(
    w: &Witness,
    project: &str,
    agents: &[AgentName],
    range: ExportRange,
    period: tally_verifier::Period,
    pack_name: &str,
    disclosures: Vec<(String, tally_schemas::disclosure::Disclosure)>,
) -> Result<tally_schemas::audit::AuditReport, WitnessError> {
    use sha2::Digest as _;
    let plan = export::plan_pack(w.log(), agents, range)?;
    let keys = export::agent_keys(w.registry(), w.log().origin(), project, agents)?;
    let keys_bytes = export::to_canonical(&keys)?;
    let created = w.now();
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(64);
    let log = std::sync::Arc::clone(w.log());
    let writer = std::thread::Builder::new()
        .name("console-report".into())
        .spawn(move || {
            let mut sink = |line: Vec<u8>| tx.send(line).map_err(|_| WitnessError::ShuttingDown);
            export::write_pack(&log, &plan, created, &mut sink)
        })
        .map_err(|e| WitnessError::internal(&e))?;
    let mut reader = BufReader::with_capacity(
        1 << 16,
        Hashing {
            inner: ChunkReader::new(move || rx.recv().ok().map(Ok)),
            hash: sha2::Sha256::new(),
            bytes: 0,
        },
    );
    let result = tally_verifier::audit(
        &mut reader,
        &keys,
        w.log().verifier(),
        None,
        VerifyOptions {
            max_skew_ms: w.config().max_skew_ms,
            grace_ms: DEFAULT_MAX_SKEW_MS,
            threads: VERIFY_THREADS,
            witnesses: None,
            progress: None,
        },
        tally_verifier::AuditOptions {
            period,
            disclosures,
        },
    );
    let drained = std::io::copy(&mut reader, &mut std::io::sink());
    let written = writer
        .join()
        .map_err(|_| WitnessError::internal(&"the export thread panicked"))?;
    let audited = result.map_err(|e| WitnessError::internal(&e))?;
    written?;
    drained.map_err(|e| WitnessError::internal(&e))?;
    let hashing = reader.into_inner();
    let (sections, statements) =
        tally_verifier::audit::sections(&audited.verification.report, audited.sections);
    let vkey = w.log().verifier().vkey();
    let rfc = |t: Option<UnixMillis>| t.and_then(|t| t.to_rfc3339().ok());
    Ok(tally_schemas::audit::AuditReport {
        v: tally_schemas::audit::AUDIT_REPORT_VERSION,
        tally_version: env!("CARGO_PKG_VERSION").to_owned(),
        generated: created.to_rfc3339().unwrap_or_default(),
        pack: tally_schemas::audit::PackInfo {
            file: pack_name.to_owned(),
            sha256: hex::encode(hashing.hash.finalize()),
            bytes: hashing.bytes,
        },
        trust: tally_schemas::audit::TrustInfo {
            agent_keys_file: "agent-keys.json".into(),
            agent_keys_sha256: hex::encode(sha2::Sha256::digest(&keys_bytes)),
            origin: keys.origin.clone(),
            log_key: vkey.clone(),
            trust_file: None,
            cosigners: Vec::new(),
            quorum: 0,
            head_file: None,
        },
        period: tally_schemas::audit::Period {
            from: rfc(period.from),
            to: rfc(period.to),
        },
        command: format!(
            "tally verify {pack_name} --agent-keys agent-keys.json --witness-key {vkey}"
        ),
        verification: audited.verification.report,
        agents: sections,
        statements,
    })
}
/// One line for a `tool_check` record (docs/protocol.md §5.7): its effect,
/// the source, each finding and the paused tools.
fn check_text(c: &tally_schemas::record::ToolCheck) -> String {
    let mut text = format!(
        "{} at {}",
        c.effect.as_str(),
        c.source.as_deref().unwrap_or("(unnamed source)")
    );
    for f in &c.findings {
        text.push_str("; ");
        if let Some(t) = &f.tool {
            text.push_str(t);
            text.push(' ');
        }
        text.push_str(f.observation.as_str());
        if !f.parts.is_empty() {
            text.push_str(&format!(" ({})", f.parts.join(", ")));
        }
        text.push_str(&format!(" → {}", f.effect.as_str()));
        if let Some(e) = &f.exception {
            text.push_str(&format!(" by {} until {}", e.by, e.until));
        }
    }
    if !c.paused.is_empty() {
        text.push_str(&format!("; paused: {}", c.paused.join(", ")));
    }
    text
}

#[cfg(test)]
mod check_text_tests {
    use tally_schemas::record::{
        CheckEffect, CheckException, CheckFinding, CheckObservation, CheckTrigger, ToolCheck,
    };
    use tally_schemas::Hash;

    #[test]
    fn a_tool_check_row_names_each_finding_and_the_paused_tools() {
        let c = ToolCheck {
            source: Some("ev".into()),
            trigger: CheckTrigger::ListChanged,
            baseline: Hash::sha256(b"l"),
            policy: Hash::sha256(b"p"),
            offered: None,
            findings: vec![
                CheckFinding {
                    observation: CheckObservation::DescriptionChanged,
                    effect: CheckEffect::PauseTool,
                    tool: Some("weather".into()),
                    parts: vec!["description".into()],
                    exception: None,
                },
                CheckFinding {
                    observation: CheckObservation::SchemaChanged,
                    effect: CheckEffect::Exception,
                    tool: Some("add".into()),
                    parts: vec!["input_schema".into()],
                    exception: Some(CheckException {
                        by: "alice".into(),
                        until: "2030-01-01T00:00:00.000Z".into(),
                    }),
                },
            ],
            effect: CheckEffect::PauseTool,
            paused: vec!["weather".into()],
        };
        assert_eq!(
            super::check_text(&c),
            "pause_tool at ev; weather description_changed (description) → pause_tool; add schema_changed (input_schema) → exception by alice until 2030-01-01T00:00:00.000Z; paused: weather"
        );
    }
}
