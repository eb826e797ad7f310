//! `verify`: the twelve checks of docs/protocol.md §11 over a pack read as a
//! stream (§9.1), with the trust anchors of §9.3 (agent-keys.json) and §4.4
//! (the pinned log key), and optionally head.json (§9.4).
//!
//! The pack is read one line at a time and never held whole. Lines go to
//! worker threads in batches ([`crate::pool`]) for parsing, strict signature
//! checks and inclusion proofs; their results come back in pack order to the
//! reading thread, which keeps only per-agent state (the last seq and hash,
//! open decisions, tool lists) and the sets that span the whole pack (nonces,
//! [`crate::nonces`]; answered decisions and unmatched outcomes), which are
//! kept within a memory budget by [`crate::spill`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::BuildHasher;
use std::io::BufRead;

use tally_schemas::limits::{
    DEFAULT_MAX_SKEW_MS, MAX_AGENTS_PER_PACK, MAX_PACK_HEADER_BYTES, MAX_PROOF_HASHES,
    MAX_RECORDS_PER_PACK, MAX_WIRE_OBJECT_BYTES,
};
use tally_schemas::note::{open_checkpoint, peek_checkpoint, Checkpoint, NoteVerifier};
use tally_schemas::pack::{
    AgentKeys, Head, PackCheckpoint, PackEnd, PackError, PackHeader, PackLine,
};
use tally_schemas::record::Body;
use tally_schemas::report::{CheckId, RecordRef, Report, ReportAgent, Verdict, REPORT_VERSION};
use tally_schemas::time::UnixMillis;
use tally_schemas::tree::{empty_root, verify_consistency, TreeSize};
use tally_schemas::{Hash, KeyId};

use crate::coverage::Coverage;
use crate::lines::{read_line, Line};
use crate::nonces::NonceSet;
use crate::pool::{
    self, Batch, Context, JobQueue, KeyStatus, Parsed, Pipeline, RawLine, RecordWork,
};
use crate::sig::verify_record;
use crate::spill::{self, Spill};
use crate::tally::{ref_text, Tally};
use crate::trust::WitnessPolicy;

/// Why a pack could not be verified at all (exit 2), as opposed to a pack
/// that fails a check (a [`Report`] with result FAIL, exit 1).
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The pack could not be read.
    #[error("cannot read the pack: {0}")]
    Io(#[from] std::io::Error),
    /// The pack is of a format version this build does not read (§12).
    #[error("{0}")]
    UnsupportedVersion(String),
    /// The input is not JSON Lines at all (empty, or its first line is not
    /// JSON).
    #[error("the pack is not a tally pack (JSON Lines): {0}")]
    NotJsonLines(String),
}

/// What `verify` found: the report, and the number of agents in the pack's
/// header (for the result line; `report.agents` lists them once each, so
/// it is the same number unless the header repeats an agent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    /// The report of the twelve checks and the coverage.
    pub report: Report,
    /// Agents named in the pack's header.
    pub agents: usize,
}

impl Verification {
    /// The report as text (§11), as `tally verify` prints it.
    #[must_use]
    pub fn to_text(&self) -> String {
        crate::render::render_text(&self.report, self.agents)
    }
}

/// Parameters of a run (§11).
pub struct VerifyOptions<'a> {
    /// Skew bound `S` between agent and witness time, in milliseconds.
    pub max_skew_ms: u64,
    /// Grace window `G` for open decisions, in milliseconds before `created`.
    pub grace_ms: u64,
    /// Worker threads; 0 means one per core.
    pub threads: usize,
    /// Independent witnesses that must cosign the pack's checkpoint (from a
    /// trust file, §11.1); `None` requires none.
    pub witnesses: Option<&'a WitnessPolicy>,
    /// Called with the number of bytes read so far, after each batch.
    pub progress: Option<&'a mut dyn FnMut(u64)>,
}

impl Default for VerifyOptions<'_> {
    fn default() -> Self {
        Self {
            max_skew_ms: DEFAULT_MAX_SKEW_MS,
            grace_ms: DEFAULT_MAX_SKEW_MS,
            threads: 0,
            witnesses: None,
            progress: None,
        }
    }
}

impl std::fmt::Debug for VerifyOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifyOptions")
            .field("max_skew_ms", &self.max_skew_ms)
            .field("grace_ms", &self.grace_ms)
            .field("threads", &self.threads)
            .field("witnesses", &self.witnesses)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct OpenDecision {
    call_id: String,
    rref: RecordRef,
    time: UnixMillis,
    received: Option<UnixMillis>,
}

#[derive(Debug)]
struct AgentState {
    name: String,
    first_seq: u64,
    last_seq: u64,
    /// Records verified (past the per-record `schema` rules).
    records: u64,
    seen: bool,
    last_seen_seq: u64,
    last_hash: Hash,
    last_witnessed: Option<(u64, Hash)>,
    required_key: Option<(KeyId, u64)>,
    open: HashMap<Hash, OpenDecision>,
    open_by_call: HashMap<String, Hash>,
    coverage: Coverage,
}

struct Checks {
    schema: Tally,
    agent_keys: Tally,
    signatures: Tally,
    hashes: Tally,
    chain: Tally,
    witness: Tally,
    inclusion: Tally,
    receipts: Tally,
    timing: Tally,
    outcomes: Tally,
    head: Tally,
    consistency: Tally,
}

impl Checks {
    fn new() -> Self {
        Self {
            schema: Tally::new(CheckId::Schema),
            agent_keys: Tally::new(CheckId::AgentKeys),
            signatures: Tally::new(CheckId::RecordSignatures),
            hashes: Tally::new(CheckId::RecordHashes),
            chain: Tally::new(CheckId::Chain),
            witness: Tally::new(CheckId::WitnessSignatures),
            inclusion: Tally::new(CheckId::Inclusion),
            receipts: Tally::new(CheckId::Receipts),
            timing: Tally::new(CheckId::Timing),
            outcomes: Tally::new(CheckId::Outcomes),
            head: Tally::new(CheckId::Head),
            consistency: Tally::new(CheckId::LogConsistency),
        }
    }
}

#[derive(Debug, Default)]
struct Stats {
    lines: u64,
    checkpoint_lines: u64,
    record_lines: u64,
    records: u64,
    signatures: u64,
    no_trusted_key: u64,
    prev_links: u64,
    decision_links: u64,
    receipt_hashes: u64,
    entries: u64,
    receipts: u64,
    decisions: u64,
    checkpoints: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Checkpoints,
    Records,
    Ended,
}

struct State<'a> {
    c: Checks,
    s: Stats,
    opts: (u64, u64),
    log_key: &'a NoteVerifier,
    header: PackHeader,
    agents: Vec<AgentState>,
    agent_index: HashMap<String, usize>,
    pack_tree: Option<(TreeSize, Hash)>,
    checkpoint_sizes: BTreeSet<u64>,
    /// Records the header claims: also the most `checkpoint` lines a pack
    /// may have (§9.1), so that the sizes kept above are bounded.
    claimed: u64,
    roots: BTreeMap<u64, (Hash, String)>,
    last_checkpoint_size: Option<u64>,
    phase: Phase,
    end: Option<PackEnd>,
    unterminated: bool,
    last_index: Option<u64>,
    saw_pending: bool,
    last_received: Option<UnixMillis>,
    nonces: NonceSet,
    answered: Spill<u64>,
    unmatched: Spill<Unmatched>,
    fp_key: std::collections::hash_map::RandomState,
    /// Bytes each whole-pack set may hold in memory before it spills.
    budget: usize,
}

/// An outcome whose decision was not open when it came (check 10): a second
/// outcome, an orphan, or in a pack that starts mid-chain possibly the
/// answer to a decision before the anchor. Decided at the end, against the
/// answered decisions; ordered by the fingerprint of the decision it names,
/// then by its place in the pack.
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

fn record_ref(w: &RecordWork) -> RecordRef {
    RecordRef {
        agent: w.line.record.agent.as_str().to_owned(),
        seq: w.line.record.seq.get(),
        index: w.line.witnessed.as_ref().map(|x| x.index.get()),
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

impl State<'_> {
    fn note_root(&mut self, size: u64, root: Hash, source: String) {
        match self.roots.get(&size) {
            Some((r, first)) if *r != root => {
                let msg = format!("two checkpoints of size {size} have different roots ({first} and {source}): a split view");
                self.c.consistency.fail(None, msg);
            }
            Some(_) => {}
            None => {
                self.roots.insert(size, (root, source));
            }
        }
    }

    fn open_or_peek(&mut self, note: &str, what: &str) -> Option<Checkpoint> {
        match open_checkpoint(note, self.log_key) {
            Ok(cp) => {
                if cp.origin != self.header.origin {
                    self.c.witness.fail(
                        None,
                        format!(
                            "{what} names origin {:?}, the pack's is {:?}",
                            cp.origin, self.header.origin
                        ),
                    );
                }
                self.s.checkpoints += 1;
                Some(cp)
            }
            Err(e) => {
                self.c.witness.fail(None, format!("{what}: {e}"));
                peek_checkpoint(note).ok()
            }
        }
    }

    fn line(&mut self, n: u64, parsed: Parsed) {
        self.s.lines += 1;
        if self.phase == Phase::Ended {
            self.c
                .schema
                .fail(None, format!("line {n}: a line after the end line"));
        }
        match parsed {
            Parsed::Bad(e) => self.c.schema.fail(None, format!("line {n}: {e}")),
            Parsed::TooLong(len) => self.c.schema.fail(
                None,
                format!("line {n}: {len} bytes, more than the limit of {MAX_WIRE_OBJECT_BYTES}"),
            ),
            Parsed::Header => self
                .c
                .schema
                .fail(None, format!("line {n}: a second header line")),
            Parsed::End(e) => {
                if self.end.is_some() {
                    self.c
                        .schema
                        .fail(None, format!("line {n}: a second end line"));
                } else {
                    self.end = Some(e);
                }
                self.phase = Phase::Ended;
            }
            Parsed::Checkpoint(c) => {
                self.s.checkpoint_lines += 1;
                if self.s.checkpoint_lines > self.claimed {
                    if self.s.checkpoint_lines == self.claimed + 1 {
                        self.c.schema.fail(
                            None,
                            format!(
                                "line {n}: more checkpoint lines than the {} records the header claims (a pack has at most one per record); the rest are not checked",
                                self.claimed
                            ),
                        );
                    }
                    return;
                }
                if self.phase > Phase::Checkpoints {
                    self.c.schema.fail(
                        None,
                        format!("line {n}: a checkpoint line after the record lines"),
                    );
                }
                self.checkpoint_line(n, &c);
            }
            Parsed::Record(w) => {
                self.s.record_lines += 1;
                if self.phase < Phase::Records {
                    self.phase = Phase::Records;
                }
                self.record(n, *w);
            }
        }
    }

    fn checkpoint_line(&mut self, n: u64, line: &PackCheckpoint) {
        let Some(cp) = self.open_or_peek(&line.checkpoint, &format!("checkpoint line {n}")) else {
            self.c.consistency.fail(
                None,
                format!("checkpoint line {n}: the checkpoint cannot be read"),
            );
            return;
        };
        let size = cp.size.get();
        self.checkpoint_sizes.insert(size);
        if self.last_checkpoint_size.is_some_and(|last| size <= last) {
            self.c.schema.fail(
                None,
                format!("checkpoint line {n}: size {size} does not increase (sizes must be increasing and unique)"),
            );
        }
        self.last_checkpoint_size = Some(size);
        self.note_root(size, cp.root, format!("checkpoint line {n}"));
        let Some((psize, proot)) = self.pack_tree else {
            self.c.consistency.fail(
                None,
                format!("checkpoint line {n}: the pack checkpoint cannot be read, so nothing is proven against it"),
            );
            return;
        };
        let fail = |msg: String| format!("checkpoint line {n} (size {size}): {msg}");
        if size > psize.get() {
            self.c.consistency.fail(
                None,
                fail(format!("larger than the pack checkpoint's size {psize}")),
            );
        } else if line.consistency.len() > MAX_PROOF_HASHES {
            self.c.consistency.fail(
                None,
                fail(format!(
                    "consistency proof has {} hashes, more than {MAX_PROOF_HASHES}",
                    line.consistency.len()
                )),
            );
        } else if size == 0 {
            if cp.root != empty_root() || !line.consistency.is_empty() {
                self.c.consistency.fail(
                    None,
                    fail("an empty tree must have root SHA-256(\"\") and an empty proof".into()),
                );
            }
        } else if let Err(e) =
            verify_consistency(cp.size, psize, &cp.root, &proot, &line.consistency)
        {
            self.c.consistency.fail(
                None,
                fail(format!(
                    "not consistent with the pack checkpoint of size {psize}: {e}"
                )),
            );
        }
    }

    #[allow(clippy::too_many_lines)]
    fn record(&mut self, n: u64, w: RecordWork) {
        let rref = record_ref(&w);
        let rec = &w.line.record;
        if self.s.record_lines > MAX_RECORDS_PER_PACK {
            if self.s.record_lines == MAX_RECORDS_PER_PACK + 1 {
                self.c.schema.fail(
                    Some(rref),
                    format!("more than {MAX_RECORDS_PER_PACK} records in one pack; the rest are not checked"),
                );
            }
            return;
        }
        let Some(&ai) = self.agent_index.get(rec.agent.as_str()) else {
            self.c.schema.fail(
                Some(rref),
                format!("line {n}: agent {} is not listed in the header", rec.agent),
            );
            return;
        };
        let seq = rec.seq.get();
        let (first, last) = (self.agents[ai].first_seq, self.agents[ai].last_seq);
        if seq < first || seq > last {
            self.c.schema.fail(
                Some(rref),
                format!("line {n}: seq {seq} is outside the header's range {first}..={last}"),
            );
            return;
        }
        self.s.records += 1;
        self.agents[ai].records += 1;
        let hash = rec.hash();

        // 2. agent_keys
        match w.key {
            KeyStatus::Active => {}
            KeyStatus::UnknownAgent => self.c.agent_keys.fail(
                Some(rref.clone()),
                format!(
                    "agent-keys.json has no keys for agent {}; get them from the operator (`tally keys export`) and pass them with --agent-keys",
                    rec.agent
                ),
            ),
            KeyStatus::UnknownKey => self.c.agent_keys.fail(
                Some(rref.clone()),
                format!("key {} is not listed for {} in agent-keys.json", rec.key_id, rec.agent),
            ),
            KeyStatus::Inactive => self.c.agent_keys.fail(
                Some(rref.clone()),
                format!("key {} was not active at the record's time {}", rec.key_id, rec.time),
            ),
        }

        // 3. record_signatures
        match w.sig_ok {
            Some(true) => self.s.signatures += 1,
            Some(false) => self.c.signatures.fail(
                Some(rref.clone()),
                "signature does not verify (strict Ed25519)",
            ),
            None => self.s.no_trusted_key += 1,
        }

        // 5. chain (and the prev half of 4. record_hashes)
        let st = &mut self.agents[ai];
        let expected = if st.seen {
            st.last_seen_seq + 1
        } else {
            st.first_seq
        };
        if seq >= expected {
            if seq > expected {
                self.c.chain.fail(
                    Some(rref.clone()),
                    format!("seq {expected}..={} missing before it (a gap)", seq - 1),
                );
            } else if seq == st.first_seq {
                if seq > 0 && w.line.witnessed.is_none() {
                    self.c.chain.fail(
                        Some(rref.clone()),
                        format!("the chain's anchor (first_seq {seq}) is not witnessed, so nothing proves where the chain starts"),
                    );
                }
            } else {
                self.s.prev_links += 1;
                if rec.prev != Some(st.last_hash) {
                    let msg = format!(
                        "prev does not equal the hash of seq {} ({})",
                        seq - 1,
                        st.last_hash
                    );
                    self.c.hashes.fail(Some(rref.clone()), msg.clone());
                    self.c
                        .chain
                        .fail(Some(rref.clone()), format!("does not link: {msg}"));
                }
            }
            if let Some((kid, at)) = st.required_key {
                if rec.key_id != kid {
                    self.c.chain.fail(
                        Some(rref.clone()),
                        format!(
                            "signed by key {}, but the key_rotation at seq {at} moved the chain to key {kid}",
                            rec.key_id
                        ),
                    );
                }
            }
            st.seen = true;
            st.last_seen_seq = seq;
            st.last_hash = hash;
            if w.line.witnessed.is_some() {
                st.last_witnessed = Some((seq, hash));
            }
            if let Body::KeyRotation(k) = &rec.body {
                st.required_key = Some((k.new_key_id, seq));
            }
        } else {
            self.c.chain.fail(
                Some(rref.clone()),
                format!(
                    "seq {seq} comes after seq {}: a duplicate, a fork or records out of order",
                    st.last_seen_seq
                ),
            );
        }

        // 7. inclusion
        if let Some(wi) = &w.line.witnessed {
            if self.saw_pending {
                self.c.inclusion.fail(
                    Some(rref.clone()),
                    "a witnessed record after an unwitnessed one (pack order, §9.1)",
                );
            }
            let index = wi.index.get();
            if let Some(last) = self.last_index {
                if index <= last {
                    self.c.inclusion.fail(
                        Some(rref.clone()),
                        format!("index {index} does not increase (previous entry {last})"),
                    );
                }
            }
            self.last_index = Some(self.last_index.map_or(index, |l| l.max(index)));
            match &w.inclusion {
                Some(Ok(())) => self.s.entries += 1,
                Some(Err(e)) => self.c.inclusion.fail(Some(rref.clone()), e.clone()),
                None => {}
            }
        } else {
            self.saw_pending = true;
        }

        // 8. receipts (and the receipt half of 4. record_hashes)
        if let Some(r) = &w.line.receipt {
            self.s.receipt_hashes += 1;
            if r.record_hash != hash {
                let msg = format!(
                    "receipt names record hash {}, the record hashes to {hash}",
                    r.record_hash
                );
                self.c.hashes.fail(Some(rref.clone()), msg.clone());
                self.c.receipts.fail(Some(rref.clone()), msg);
            }
            if r.nonce != rec.nonce {
                self.c.receipts.fail(
                    Some(rref.clone()),
                    format!(
                        "receipt echoes nonce {}, the record's is {}",
                        r.nonce, rec.nonce
                    ),
                );
            }
            if !self.checkpoint_sizes.contains(&r.tree_size.get()) {
                self.c.receipts.fail(
                    Some(rref.clone()),
                    format!(
                        "receipt's tree_size {} names no checkpoint line",
                        r.tree_size
                    ),
                );
            }
            if r.index.get() >= r.tree_size.get() {
                self.c.receipts.fail(
                    Some(rref.clone()),
                    format!(
                        "receipt index {} is not below its tree_size {}",
                        r.index, r.tree_size
                    ),
                );
            }
        }
        match (&w.line.witnessed, &w.line.receipt) {
            (Some(wi), Some(r)) => {
                if r.index != wi.index {
                    self.c.receipts.fail(
                        Some(rref.clone()),
                        format!(
                            "receipt gives index {}, the entry is at {}",
                            r.index, wi.index
                        ),
                    );
                }
                self.s.receipts += 1;
            }
            (Some(_), None) => self
                .c
                .receipts
                .fail(Some(rref.clone()), "witnessed but has no receipt"),
            (None, None) => self
                .c
                .receipts
                .pending(Some(rref.clone()), "not witnessed yet"),
            (None, Some(_)) => self.c.receipts.fail(
                Some(rref.clone()),
                "has a receipt but its entry is not in the pack (witnessed is null)",
            ),
        }
        self.nonces.push(w.nonce_fp, ai, seq - first);

        // 9. timing
        if let Some(wi) = &w.line.witnessed {
            let skew = wi.received.abs_diff(rec.time);
            if skew > self.opts.0 {
                self.c.timing.fail(
                    Some(rref.clone()),
                    format!(
                        "received {} is {skew} ms from the agent's time {} (bound {} ms)",
                        wi.received, rec.time, self.opts.0
                    ),
                );
            }
            if let Some(last) = self.last_received {
                if wi.received < last {
                    self.c.timing.fail(
                        Some(rref.clone()),
                        format!(
                            "received {} is before the previous entry's {last}",
                            wi.received
                        ),
                    );
                }
            }
            self.last_received = Some(
                self.last_received
                    .map_or(wi.received, |l| l.max(wi.received)),
            );
        }

        // 10. outcomes, and coverage
        let received = w.line.witnessed.as_ref().map(|x| x.received);
        let st = &mut self.agents[ai];
        match &rec.body {
            Body::Decision(d) => {
                self.s.decisions += 1;
                st.coverage.called(&d.tool);
                st.open.entry(hash).or_insert(OpenDecision {
                    call_id: d.call_id.clone(),
                    rref: rref.clone(),
                    time: rec.time,
                    received,
                });
                st.open_by_call.insert(d.call_id.clone(), hash);
            }
            Body::Outcome(o) => {
                if let Some(h) = st.open_by_call.get(&o.call_id) {
                    self.s.decision_links += 1;
                    if *h != o.decision {
                        self.c.hashes.fail(
                            Some(rref.clone()),
                            format!(
                                "outcome names decision {}, but the decision with call_id {:?} hashes to {h}",
                                o.decision, o.call_id
                            ),
                        );
                    }
                }
                match st.open.get(&o.decision) {
                    Some(open) if open.call_id == o.call_id => {
                        if rec.time < open.time {
                            self.c.timing.fail(
                                Some(rref.clone()),
                                format!(
                                    "outcome time {} is before its decision's {}",
                                    rec.time, open.time
                                ),
                            );
                        }
                        if let (Some(r), Some(dr)) = (received, open.received) {
                            if r < dr {
                                self.c.timing.fail(
                                    Some(rref.clone()),
                                    format!("outcome received {r} is before its decision's {dr}"),
                                );
                            }
                        }
                        st.open.remove(&o.decision);
                        if st.open_by_call.get(&o.call_id) == Some(&o.decision) {
                            st.open_by_call.remove(&o.call_id);
                        }
                        self.answered
                            .push(self.fp_key.hash_one(o.decision.as_bytes()));
                    }
                    Some(open) => {
                        let msg = format!(
                            "outcome for call_id {:?} names decision {} whose call_id is {:?}",
                            o.call_id,
                            ref_text(&open.rref),
                            open.call_id
                        );
                        self.c.outcomes.fail(Some(rref.clone()), msg);
                    }
                    None => self.unmatched.push(Unmatched {
                        decision_fp: self.fp_key.hash_one(o.decision.as_bytes()),
                        line: n,
                        // Below MAX_AGENTS_PER_PACK by the header check.
                        agent: u32::try_from(ai).unwrap_or(u32::MAX),
                        seq,
                        index: rref.index.unwrap_or(u64::MAX),
                        decision: *o.decision.as_bytes(),
                    }),
                }
            }
            Body::Tools(t) => st.coverage.tools(seq, t),
            Body::Note(_) | Body::KeyRotation(_) => {}
        }
    }

    fn finish_stream(&mut self) -> std::io::Result<()> {
        match &self.end {
            None => self
                .c
                .schema
                .fail(None, "no end line: the pack is truncated"),
            Some(e) => {
                if e.checkpoints != self.s.checkpoint_lines || e.records != self.s.record_lines {
                    self.c.schema.fail(
                        None,
                        format!(
                            "the end line counts {} checkpoint and {} record lines, the pack has {} and {}: truncated or padded",
                            e.checkpoints, e.records, self.s.checkpoint_lines, self.s.record_lines
                        ),
                    );
                }
            }
        }
        if self.unterminated {
            self.c
                .schema
                .fail(None, "the last line does not end in a newline");
        }
        for st in &self.agents {
            if !st.seen {
                self.c.chain.fail(
                    None,
                    format!(
                        "agent {}: no records, the header says {}..={}",
                        st.name, st.first_seq, st.last_seq
                    ),
                );
            } else if st.last_seen_seq < st.last_seq {
                self.c.chain.fail(
                    None,
                    format!(
                        "agent {}: seq {}..={} missing at the end",
                        st.name,
                        st.last_seen_seq + 1,
                        st.last_seq
                    ),
                );
            }
        }
        let created = self.header.created;
        let grace = self.opts.1;
        for st in &self.agents {
            let mut open: Vec<&OpenDecision> = st.open.values().collect();
            open.sort_by_key(|o| o.rref.seq);
            for d in open {
                let age = created.as_millis().saturating_sub(d.time.as_millis());
                if age <= i64::try_from(grace).unwrap_or(i64::MAX) {
                    self.c.outcomes.pending(
                        Some(d.rref.clone()),
                        format!(
                            "decision (call_id {:?}) has no outcome yet, within the grace window",
                            d.call_id
                        ),
                    );
                } else {
                    self.c.outcomes.fail(
                        Some(d.rref.clone()),
                        format!(
                            "decision (call_id {:?}) has no outcome, {age} ms before the pack was made (grace {grace} ms)",
                            d.call_id
                        ),
                    );
                }
            }
        }
        self.judge_unmatched()?;
        self.judge_nonces()
    }

    /// Check 8's "no nonce appears in two records". The pairs come out of
    /// the nonce set in the order of its fingerprints, which are keyed at
    /// random for each run; they are sorted by the record that reuses the
    /// nonce (header order of agents, then seq), so that the report is the
    /// same on every run.
    fn judge_nonces(&mut self) -> std::io::Result<()> {
        const POSITION_BITS: u32 = 36;
        let position = |(agent, offset): (usize, u64)| {
            ((agent as u128) << 24) | u128::from(offset & ((1 << 24) - 1))
        };
        let mut pairs: Spill<u128> = Spill::new(self.budget);
        let nonces = std::mem::replace(&mut self.nonces, NonceSet::new(0));
        nonces.duplicates(|first, again| {
            pairs.push((position(again) << POSITION_BITS) | position(first));
        })?;
        let mut pairs = pairs.sorted()?;
        let split = |p: u128| {
            let agent = ((p >> 24) & 0xfff) as usize;
            let offset = (p & ((1 << 24) - 1)) as u64;
            (agent, offset)
        };
        while let Some(p) = pairs.next_item()? {
            let (a1, o1) = split(p & ((1 << POSITION_BITS) - 1));
            let (a2, o2) = split(p >> POSITION_BITS);
            let agents = &self.agents;
            let name = |a: usize, o: u64| {
                agents.get(a).map_or_else(
                    || format!("agent {a}"),
                    |s| format!("{}#{}", s.name, s.first_seq + o),
                )
            };
            let again = RecordRef {
                agent: agents.get(a2).map_or_else(String::new, |s| s.name.clone()),
                seq: agents.get(a2).map_or(0, |s| s.first_seq) + o2,
                index: None,
            };
            let msg = format!("nonce reused: already used by {}", name(a1, o1));
            self.c.receipts.fail(Some(again), msg);
        }
        Ok(())
    }

    /// Check 10 for the outcomes whose decision was not open when they came:
    /// naming an answered decision, a second outcome; otherwise an orphan,
    /// unless the agent's chain starts mid-way (then the decision may be
    /// before the anchor and cannot be judged). Both sets are sorted by the
    /// decision's fingerprint and walked together; the failures are then
    /// sorted back into pack order.
    fn judge_unmatched(&mut self) -> std::io::Result<()> {
        let budget = self.budget;
        let mut answered = std::mem::replace(&mut self.answered, Spill::new(0)).sorted()?;
        let mut unmatched = std::mem::replace(&mut self.unmatched, Spill::new(0)).sorted()?;
        let mut judged: Spill<Judged> = Spill::new(budget);
        let mut next_answered = answered.next_item()?;
        while let Some(u) = unmatched.next_item()? {
            while next_answered.is_some_and(|a| a < u.decision_fp) {
                next_answered = answered.next_item()?;
            }
            let second = next_answered == Some(u.decision_fp);
            let anchored = self
                .agents
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
                agent: self
                    .agents
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
            self.c.outcomes.fail(Some(rref), msg);
        }
        Ok(())
    }

    fn check_head(&mut self, head: &Head, keys: &Context) {
        let cp = match open_checkpoint(&head.checkpoint, self.log_key) {
            Ok(cp) => Some(cp),
            Err(e) => {
                self.c.head.fail(None, format!("head checkpoint: {e}"));
                peek_checkpoint(&head.checkpoint).ok()
            }
        };
        let Some(cp) = cp else { return };
        self.note_root(cp.size.get(), cp.root, "the head checkpoint".into());
        match self.pack_tree {
            Some((psize, proot)) => {
                if head.from_size != psize {
                    self.c.head.fail(
                        None,
                        format!(
                            "from_size {} is not the pack checkpoint's size {psize}",
                            head.from_size
                        ),
                    );
                } else if head.consistency.len() > MAX_PROOF_HASHES {
                    self.c
                        .head
                        .fail(None, "the head's consistency proof is too long");
                } else if psize.get() > 0 {
                    if let Err(e) =
                        verify_consistency(psize, cp.size, &proot, &cp.root, &head.consistency)
                    {
                        self.c.head.fail(
                            None,
                            format!("the head checkpoint (size {}) does not extend the pack's (size {psize}): {e}", cp.size),
                        );
                    }
                }
            }
            None => self.c.head.fail(None, "the pack checkpoint cannot be read"),
        }
        let mut by_agent: HashMap<&str, (u64, Hash, u64, UnixMillis)> = HashMap::new();
        for ha in &head.agents {
            let r = &ha.record;
            let rref = RecordRef {
                agent: r.agent.as_str().to_owned(),
                seq: r.seq.get(),
                index: Some(ha.witnessed.index.get()),
            };
            let (status, key) = pool::lookup_key(&keys.keys, r);
            if status != KeyStatus::Active {
                self.c.head.fail(
                    Some(rref.clone()),
                    "head record's key is not a trusted key active at its time",
                );
            }
            if key.is_some_and(|k| !verify_record(r, &k.public_key)) {
                self.c.head.fail(
                    Some(rref.clone()),
                    "head record's signature does not verify",
                );
            }
            if let Err(e) = pool::prove_entry(
                ha.witnessed.index,
                ha.witnessed.received,
                r,
                &ha.witnessed.inclusion,
                cp.size,
                &cp.root,
            ) {
                self.c
                    .head
                    .fail(Some(rref.clone()), format!("head record: {e}"));
            }
            by_agent.insert(
                r.agent.as_str(),
                (
                    r.seq.get(),
                    r.hash(),
                    ha.witnessed.index.get(),
                    ha.witnessed.received,
                ),
            );
        }
        let psize = self.pack_tree.map_or(0, |(s, _)| s.get());
        for st in &self.agents {
            let Some(&(hseq, hhash, hindex, hreceived)) = by_agent.get(st.name.as_str()) else {
                self.c
                    .head
                    .fail(None, format!("agent {} is not in head.json", st.name));
                continue;
            };
            let rref = RecordRef {
                agent: st.name.clone(),
                seq: hseq,
                index: Some(hindex),
            };
            match st.last_witnessed {
                Some((wseq, _)) if hseq < wseq => self.c.head.fail(
                    Some(rref),
                    format!(
                        "head record is older than the pack's last witnessed record (seq {wseq})"
                    ),
                ),
                Some((wseq, whash)) if hseq == wseq && hhash != whash => self.c.head.fail(
                    Some(rref),
                    format!("head record at seq {hseq} differs from the pack's (a fork)"),
                ),
                _ if hseq > st.last_seq && (hindex < psize || hreceived <= self.header.created) => {
                    self.c.head.fail(
                        Some(rref),
                        format!(
                            "records {}..={hseq} were cut from the end: the head record was logged at index {hindex}, inside the pack's tree or before the pack was made",
                            st.last_seq + 1
                        ),
                    );
                }
                _ => {}
            }
        }
    }

    fn report(
        mut self,
        head: Option<&Head>,
        ctx: &Context,
        policy: Option<&WitnessPolicy>,
    ) -> Report {
        if let Some(h) = head {
            self.check_head(h, ctx);
        } else {
            self.c
                .head
                .not_checked("no head.json given (--head), so the pack cannot show that nothing was cut from the end");
        }
        if let Some(p) = policy {
            if let Err(e) = p.check(&self.header.checkpoint) {
                self.c.witness.fail(None, format!("pack checkpoint: {e}"));
            }
        }
        let s = &self.s;
        let agents = self.agents.len() as u64;
        let psize = self
            .pack_tree
            .map_or_else(|| "?".to_owned(), |(z, _)| z.to_string());
        let mut sig_msg = format!(
            "{} verify (strict Ed25519)",
            plural(s.signatures, "signature", "signatures")
        );
        if s.no_trusted_key > 0 {
            sig_msg.push_str(&format!(
                "; {} not checked: no trusted key (see agent_keys)",
                plural(s.no_trusted_key, "record", "records")
            ));
        }
        let c = self.c;
        let checks = vec![
            c.schema.finish(format!(
                "{} lines: a header, {} checkpoint and {} record lines, an end line whose counts match",
                s.lines + 1,
                s.checkpoint_lines,
                s.record_lines
            )),
            c.agent_keys.finish(format!(
                "{} signed by keys listed in agent-keys.json and active at the record's time",
                plural(s.records, "record", "records")
            )),
            if s.signatures == 0 && s.no_trusted_key > 0 && !c.signatures.failed() {
                let mut t = c.signatures;
                t.not_checked("no record names a trusted key, so no signature could be checked (see agent_keys)");
                t.finish(String::new())
            } else {
                c.signatures.finish(sig_msg)
            },
            c.hashes.finish(format!(
                "{} prev links, {} outcome decision hashes and {} receipt hashes recompute",
                s.prev_links, s.decision_links, s.receipt_hashes
            )),
            c.chain.finish(format!(
                "{} seq contiguous and linked, starting at genesis or a witnessed anchor",
                plural(agents, "agent's chain is", "agents' chains are")
            )),
            c.witness.finish(format!(
                "{} verify with the pinned key {}",
                plural(s.checkpoints, "checkpoint", "checkpoints"),
                self.log_key.name()
            )),
            c.inclusion.finish(format!(
                "{} proven in the pack checkpoint (size {psize}), indexes increasing",
                plural(s.entries, "entry", "entries")
            )),
            c.receipts.finish(format!(
                "{} bind their records; no nonce repeats",
                plural(s.receipts, "receipt", "receipts")
            )),
            c.timing.finish(format!(
                "witness times within {} ms of agent times and never decreasing; outcomes follow their decisions",
                self.opts.0
            )),
            c.outcomes.finish(format!(
                "{} {} exactly one outcome; no orphan outcomes",
                plural(s.decisions, "decision", "decisions"),
                if s.decisions == 1 { "has" } else { "each have" }
            )),
            c.head.finish("the head checkpoint extends the pack's, and no record is cut from the end".into()),
            c.consistency.finish(format!(
                "{} consistent with the pack checkpoint",
                plural(
                    s.checkpoint_lines.min(self.claimed),
                    "checkpoint line is",
                    "checkpoint lines are"
                )
            )),
        ];
        let coverage = self
            .agents
            .iter()
            .flat_map(|a| a.coverage.lines(&a.name))
            .collect();
        let agents = self
            .agents
            .iter()
            .map(|a| ReportAgent {
                agent: a.name.clone(),
                first_seq: a.first_seq,
                last_seq: a.last_seq,
                records: a.records,
            })
            .collect();
        finish_report(checks, coverage, agents, self.s.records)
    }
}

fn finish_report(
    checks: Vec<tally_schemas::report::CheckResult>,
    coverage: Vec<String>,
    agents: Vec<ReportAgent>,
    records: u64,
) -> Report {
    let failed = checks
        .iter()
        .any(|c| c.status == tally_schemas::report::CheckStatus::Fail);
    Report {
        v: REPORT_VERSION,
        checks,
        coverage,
        agents,
        records,
        result: if failed { Verdict::Fail } else { Verdict::Pass },
    }
}

/// The report for a pack whose first line is not a usable header.
fn headerless_report(reason: String) -> Verification {
    let mut checks = Vec::new();
    for id in CheckId::ALL {
        let mut t = Tally::new(id);
        if id == CheckId::Schema {
            t.fail(None, format!("line 1: {reason}"));
        } else {
            t.not_checked("the pack has no valid header line, so nothing else can be checked");
        }
        checks.push(t.finish(String::new()));
    }
    Verification {
        report: finish_report(checks, Vec::new(), Vec::new(), 0),
        agents: 0,
    }
}

/// Verifies a pack (§9.1) read from `pack`, against the trusted agent keys
/// and the pinned log key, and optionally head.json. Returns the report of
/// the twelve checks of §11 with the coverage lines; a pack that fails a
/// check is a report with result FAIL, not an error.
///
/// # Errors
/// [`VerifyError`] when the pack cannot be verified at all: it cannot be
/// read, it is of an unsupported format version, or it is not JSON Lines.
pub fn verify<R: BufRead>(
    pack: R,
    keys: &AgentKeys,
    log_key: &NoteVerifier,
    head: Option<&Head>,
    options: VerifyOptions<'_>,
) -> Result<Verification, VerifyError> {
    verify_with_budget(
        pack,
        keys,
        log_key,
        head,
        options,
        spill::DEFAULT_BUDGET_BYTES,
    )
}

/// [`verify()`] with the memory budget of each set that spans the whole
/// pack (the nonces, the answered decisions, the unmatched outcomes) given
/// in bytes: past it, the set goes to a temporary file in sorted runs. The
/// report does not depend on the budget; tests use a tiny one to make the
/// sets spill.
///
/// # Errors
/// As [`verify()`]; also an I/O error of the temporary file.
#[allow(clippy::too_many_lines)]
pub fn verify_with_budget<R: BufRead>(
    mut pack: R,
    keys: &AgentKeys,
    log_key: &NoteVerifier,
    head: Option<&Head>,
    mut options: VerifyOptions<'_>,
    memory_budget: usize,
) -> Result<Verification, VerifyError> {
    let mut buf = Vec::new();
    // The header lists every agent, so it alone may exceed a wire object.
    let (first, mut bytes) = read_line(&mut pack, &mut buf, MAX_PACK_HEADER_BYTES)?;
    match first {
        Line::Eof => return Err(VerifyError::NotJsonLines("the file is empty".into())),
        Line::TooLong { len } => {
            return Err(VerifyError::NotJsonLines(format!(
                "its first line is {len} bytes, more than the limit of {MAX_PACK_HEADER_BYTES}"
            )))
        }
        Line::Text { .. } => {}
    }
    let header = match PackLine::from_json(&buf) {
        Ok(PackLine::Header(h)) => h,
        Err(e @ PackError::UnsupportedVersion { .. }) => {
            return Err(VerifyError::UnsupportedVersion(e.to_string()))
        }
        Err(e @ PackError::Canonical(_)) => {
            return Err(VerifyError::NotJsonLines(format!("line 1: {e}")))
        }
        Ok(_) => {
            return Ok(headerless_report(
                "the first line is not a header line".into(),
            ))
        }
        Err(e) => return Ok(headerless_report(e.to_string())),
    };

    let mut c = Checks::new();
    let mut agents = Vec::with_capacity(header.agents.len());
    let mut agent_index = HashMap::new();
    let mut claimed: u64 = 0;
    let mut sorted = true;
    for (i, a) in header.agents.iter().enumerate() {
        if i > 0 && header.agents[i - 1].agent >= a.agent {
            sorted = false;
        }
        let (f, l) = (a.first_seq.get(), a.last_seq.get());
        if f > l {
            c.schema.fail(
                None,
                format!(
                    "header: agent {} has first_seq {f} above last_seq {l}",
                    a.agent
                ),
            );
        }
        claimed = claimed.saturating_add(l.saturating_sub(f).saturating_add(1));
        if agent_index.contains_key(a.agent.as_str()) {
            continue;
        }
        agent_index.insert(a.agent.as_str().to_owned(), agents.len());
        agents.push(AgentState {
            name: a.agent.as_str().to_owned(),
            first_seq: f,
            last_seq: l,
            records: 0,
            seen: false,
            last_seen_seq: 0,
            last_hash: Hash::default(),
            last_witnessed: None,
            required_key: None,
            open: HashMap::new(),
            open_by_call: HashMap::new(),
            coverage: Coverage::default(),
        });
    }
    if !sorted {
        c.schema
            .fail(None, "header: agents are not sorted by name and unique");
    }
    if header.agents.len() > MAX_AGENTS_PER_PACK {
        c.schema.fail(
            None,
            format!(
                "header: {} agents, more than {MAX_AGENTS_PER_PACK}",
                header.agents.len()
            ),
        );
    }
    if claimed > MAX_RECORDS_PER_PACK {
        c.schema.fail(
            None,
            format!("header: the agents' ranges hold {claimed} records, more than {MAX_RECORDS_PER_PACK}"),
        );
    }
    if keys.origin != header.origin {
        c.agent_keys.fail(
            None,
            format!(
                "agent-keys.json is for origin {:?}, the pack's is {:?}",
                keys.origin, header.origin
            ),
        );
    }
    if header.origin != log_key.name() {
        c.witness.fail(
            None,
            format!(
                "the pack's origin {:?} is not the pinned key's name {:?}",
                header.origin,
                log_key.name()
            ),
        );
    }

    let ctx = Context {
        keys: keys
            .agents
            .iter()
            .map(|a| (a.agent.as_str().to_owned(), a.keys.clone()))
            .collect(),
        pack_tree: None,
        nonce_keys: Default::default(),
    };
    let mut st = State {
        c,
        s: Stats::default(),
        opts: (options.max_skew_ms, options.grace_ms),
        log_key,
        header,
        agents,
        agent_index,
        pack_tree: None,
        checkpoint_sizes: BTreeSet::new(),
        claimed: claimed.min(MAX_RECORDS_PER_PACK),
        roots: BTreeMap::new(),
        last_checkpoint_size: None,
        phase: Phase::Checkpoints,
        end: None,
        unterminated: false,
        last_index: None,
        saw_pending: false,
        last_received: None,
        nonces: NonceSet::new(memory_budget),
        answered: Spill::new(memory_budget),
        unmatched: Spill::new(memory_budget),
        fp_key: Default::default(),
        budget: memory_budget,
    };
    let note = st.header.checkpoint.clone();
    if let Some(cp) = st.open_or_peek(&note, "pack checkpoint") {
        st.note_root(cp.size.get(), cp.root, "the pack checkpoint".into());
        st.pack_tree = Some((cp.size, cp.root));
    }
    let ctx = Context {
        pack_tree: st.pack_tree,
        ..ctx
    };

    let threads = pool::thread_count(options.threads);
    let queue = JobQueue::new(threads * 2);
    let result: Result<(), VerifyError> = std::thread::scope(|scope| {
        let mut pipeline = Pipeline::start(scope, &ctx, &queue, threads);
        // Sized for a batch of typical lines; a batch of long ones grows.
        let mut batch = Batch::with_capacity(pool::BATCH_BYTES);
        let mut next_line: u64 = 2;
        let mut handle = |st: &mut State<'_>, batches: Vec<Vec<Parsed>>| {
            for b in batches {
                for parsed in b {
                    st.line(next_line, parsed);
                    next_line += 1;
                }
            }
        };
        loop {
            let start = batch.data.len();
            let (line, n) = match read_line(&mut pack, &mut batch.data, MAX_WIRE_OBJECT_BYTES) {
                Ok(x) => x,
                Err(e) => {
                    drop(pipeline.finish());
                    return Err(e.into());
                }
            };
            bytes += n;
            match line {
                Line::Eof => break,
                Line::TooLong { len } => batch.lines.push(RawLine::TooLong(len)),
                Line::Text { terminated } => {
                    if !terminated {
                        st.unterminated = true;
                    }
                    batch.lines.push(RawLine::Text(start..batch.data.len()));
                }
            }
            if batch.is_full() {
                let done = pipeline.send(std::mem::replace(
                    &mut batch,
                    Batch::with_capacity(pool::BATCH_BYTES),
                ));
                handle(&mut st, done);
                handle(&mut st, pipeline.ready());
                if let Some(p) = options.progress.as_mut() {
                    p(bytes);
                }
            }
        }
        if !batch.lines.is_empty() {
            let done = pipeline.send(batch);
            handle(&mut st, done);
        }
        let rest = pipeline.finish();
        handle(&mut st, rest);
        Ok(())
    });
    result?;
    if let Some(p) = options.progress.as_mut() {
        p(bytes);
    }
    st.finish_stream()?;
    let agents = st.agents.len();
    Ok(Verification {
        report: st.report(head, &ctx, options.witnesses),
        agents,
    })
}
