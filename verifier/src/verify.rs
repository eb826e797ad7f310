//! `verify`: the streaming driver of the twelve checks of docs/protocol.md
//! §11 over a pack (§9.1), with the trust anchors of §9.3 (agent-keys.json)
//! and §4.4 (the pinned log key), and optionally head.json (§9.4). The
//! checks themselves are in [`crate::checks`], one module each.
//!
//! The pack is read one line at a time and never held whole. Lines go to
//! worker threads in batches ([`crate::pool`]) for parsing, strict signature
//! checks and inclusion proofs; their results come back in pack order to the
//! reading thread, which hands each line to the checks that judge it. The
//! checks keep only per-agent state (the chain walk, open decisions, tool
//! lists) and the sets that span the whole pack (nonces, [`crate::nonces`];
//! answered decisions and unmatched outcomes), which are kept within a
//! memory budget by [`crate::spill`].

use std::collections::HashMap;
use std::io::BufRead;

use tally_schemas::limits::{DEFAULT_MAX_SKEW_MS, MAX_PACK_HEADER_BYTES, MAX_WIRE_OBJECT_BYTES};
use tally_schemas::note::NoteVerifier;
use tally_schemas::pack::{AgentKeys, Head, PackCheckpoint, PackError, PackHeader, PackLine};
use tally_schemas::record::Body;
use tally_schemas::report::{CheckId, RecordRef, Report, ReportAgent, Verdict, REPORT_VERSION};
use tally_schemas::tree::TreeSize;
use tally_schemas::Hash;

use crate::actions::Actions;
use crate::activity::{Activity, AuditOptions};
use crate::checks::agent_keys::AgentKeys as AgentKeysCheck;
use crate::checks::chain::Chain;
use crate::checks::head::{HeadCheck, PackSide};
use crate::checks::inclusion::Inclusion;
use crate::checks::log_consistency::LogConsistency;
use crate::checks::outcomes::Outcomes;
use crate::checks::receipts::Receipts;
use crate::checks::record_hashes::RecordHashes;
use crate::checks::record_signatures::RecordSignatures;
use crate::checks::schema::Schema;
use crate::checks::timing::Timing;
use crate::checks::witness_signatures::WitnessSignatures;
use crate::checks::{Agent, Facts};
use crate::continuity::Continuity;
use crate::coverage::Coverage;
use crate::lines::{read_line, Line};
use crate::pool::{self, Batch, Context, JobQueue, Parsed, Pipeline, RawLine, RecordWork};
use crate::spill;
use crate::tally::Tally;
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

/// What `verify` found: the report, and the number of header agents (each
/// name once, §9.1) for the result line; `report.agents` lists the same
/// agents (it is empty when the pack has no valid header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    /// The report of the twelve checks and the coverage.
    pub report: Report,
    /// Header agents, each name once.
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

/// The twelve checks over one pack, and the pack's header agents.
struct Run<'a> {
    header: PackHeader,
    agents: Vec<Agent>,
    pack_tree: Option<(TreeSize, Hash)>,
    schema: Schema,
    agent_keys: AgentKeysCheck,
    signatures: RecordSignatures,
    hashes: RecordHashes,
    chain: Chain,
    witness: WitnessSignatures<'a>,
    inclusion: Inclusion,
    receipts: Receipts,
    timing: Timing,
    outcomes: Outcomes,
    head: HeadCheck,
    consistency: LogConsistency,
    coverage: Vec<Coverage>,
    /// The audit report's per-agent figures and the disclosures (§11.3),
    /// when asked for.
    activity: Option<Activity>,
    actions: Vec<Actions>,
    continuity: Vec<Continuity>,
}

fn record_ref(w: &RecordWork) -> RecordRef {
    RecordRef {
        agent: w.line.record.agent.as_str().to_owned(),
        seq: w.line.record.seq.get(),
        index: w.line.witnessed.as_ref().map(|x| x.index.get()),
    }
}

impl<'a> Run<'a> {
    /// The checks, after the header: its agents read, the pack checkpoint
    /// opened.
    fn new(
        header: PackHeader,
        keys: &AgentKeys,
        log_key: &'a NoteVerifier,
        options: &VerifyOptions<'_>,
        budget: usize,
        audit: Option<AuditOptions>,
    ) -> Self {
        let (schema, agents) = Schema::new(&header);
        let n = agents.len();
        let mut witness = WitnessSignatures::new(log_key, &header.origin);
        let mut consistency = LogConsistency::new();
        let pack_tree = witness
            .open(&header.checkpoint, "pack checkpoint")
            .map(|cp| {
                consistency.root(cp.size, cp.root, "the pack checkpoint".into());
                (cp.size, cp.root)
            });
        Self {
            agent_keys: AgentKeysCheck::new(&keys.origin, &header.origin),
            header,
            pack_tree,
            schema,
            signatures: RecordSignatures::new(),
            hashes: RecordHashes::new(),
            chain: Chain::new(n),
            witness,
            inclusion: Inclusion::new(),
            receipts: Receipts::new(budget),
            timing: Timing::new(options.max_skew_ms),
            outcomes: Outcomes::new(n, budget),
            head: HeadCheck::new(n),
            consistency,
            coverage: (0..n).map(|_| Coverage::default()).collect(),
            activity: audit.map(|a| Activity::new(n, a)),
            actions: (0..n).map(|_| Actions::default()).collect(),
            continuity: (0..n).map(|_| Continuity::default()).collect(),
            agents,
        }
    }

    /// One line after the header, in pack order (`n` is its line number).
    fn line(&mut self, n: u64, parsed: Parsed) {
        self.schema.line(n);
        match parsed {
            Parsed::Bad(e) => self.schema.bad(n, &e),
            Parsed::TooLong(len) => self.schema.too_long(n, len),
            Parsed::Header => self.schema.second_header(n),
            Parsed::End(e) => self.schema.end_line(n, e),
            Parsed::Checkpoint(c) => self.checkpoint_line(n, &c),
            Parsed::Record(w) => self.record(n, &w),
        }
    }

    fn checkpoint_line(&mut self, n: u64, line: &PackCheckpoint) {
        if !self.schema.checkpoint_line(n) {
            return;
        }
        let cp = self
            .witness
            .open(&line.checkpoint, &format!("checkpoint line {n}"));
        if let Some(cp) = &cp {
            self.schema.checkpoint_size(n, cp.size);
            self.receipts.checkpoint_size(cp.size);
        }
        self.consistency
            .line(n, cp.as_ref(), &line.consistency, self.pack_tree);
    }

    /// A record line: check 1's per-record rules first; a record that
    /// passes them goes to every other check, in table order.
    fn record(&mut self, n: u64, w: &RecordWork) {
        let rref = record_ref(w);
        let Some(agent) = self.schema.record(n, &rref, &self.agents) else {
            return;
        };
        let f = Facts {
            line: n,
            agent,
            work: w,
            rref,
            hash: w.line.record.hash(),
        };
        self.agent_keys.record(&f);
        self.signatures.record(&f);
        let step = self.chain.record(&f, &self.agents);
        self.hashes.prev(&f, &step);
        self.hashes.receipt(&f);
        self.inclusion.record(&f);
        self.receipts.record(&f, &self.agents);
        self.timing.record(&f);
        self.coverage[agent].record(f.record().time);
        if let Some(a) = &mut self.activity {
            a.record(agent, f.record());
        }
        match &f.record().body {
            Body::Decision(d) => {
                self.outcomes.decision(&f, d);
                self.coverage[agent].called(&d.tool);
                self.continuity[agent].called(&d.tool);
            }
            Body::Outcome(o) => {
                self.actions[agent].outcome(o);
                let answer = self.outcomes.outcome(&f, o);
                self.hashes.outcome(&f, o, &answer);
                self.timing.outcome(&f, &answer);
            }
            Body::Tools(t) => self.coverage[agent].tools(f.seq(), t),
            Body::Claim(c) => self.actions[agent].claim(f.seq(), c),
            Body::ToolCheck(c) => self.continuity[agent].check(c),
            Body::Note(_) | Body::KeyRotation(_) => {}
        }
        self.head.record(&f);
    }

    /// The checks that judge at the end, then the report.
    fn finish(
        mut self,
        head: Option<&Head>,
        ctx: &Context,
        options: &VerifyOptions<'_>,
        log_key: &NoteVerifier,
    ) -> std::io::Result<Audited> {
        match head {
            Some(h) => {
                let pack = PackSide {
                    agents: &self.agents,
                    tree: self.pack_tree,
                    created: self.header.created,
                    origin: &self.header.origin,
                };
                self.head
                    .check(h, log_key, ctx, &pack, &mut self.consistency);
            }
            None => self.head.not_given(),
        }
        if let Some(policy) = options.witnesses {
            self.witness.cosignatures(policy, &self.header.checkpoint);
        }
        let records = self.schema.records();
        let report_agents: Vec<ReportAgent> = self
            .agents
            .iter()
            .enumerate()
            .map(|(i, a)| ReportAgent {
                agent: a.name.clone(),
                first_seq: a.first_seq,
                last_seq: a.last_seq,
                records: self.schema.records_of(i),
            })
            .collect();
        let coverage = self
            .agents
            .iter()
            .zip(
                self.coverage
                    .iter()
                    .zip(self.actions.iter().zip(&self.continuity)),
            )
            .flat_map(|(a, (c, (x, t)))| {
                let mut lines = c.lines(&a.name);
                lines.extend(x.lines(&a.name));
                lines.extend(t.lines(&a.name));
                lines
            })
            .collect();
        let checks = vec![
            self.schema.finish(),
            self.agent_keys.finish(),
            self.signatures.finish(),
            self.hashes.finish(),
            self.chain.finish(&self.agents),
            self.witness.finish(),
            self.inclusion.finish(self.pack_tree.map(|(s, _)| s)),
            self.receipts.finish(&self.agents)?,
            self.timing.finish(),
            self.outcomes
                .finish(&self.agents, self.header.created, options.grace_ms)?,
            self.head.finish(),
            self.consistency.finish(),
        ];
        let (sections, disclosures) = match self.activity {
            Some(a) => {
                let list: Vec<(String, u64, u64, u64)> = report_agents
                    .iter()
                    .map(|a| (a.agent.clone(), a.first_seq, a.last_seq, a.records))
                    .collect();
                a.finish(&list)
            }
            None => (Vec::new(), Vec::new()),
        };
        let mut report = finish_report(checks, coverage, report_agents, records);
        add_disclosures(&mut report, disclosures);
        Ok(Audited {
            verification: Verification {
                report,
                agents: self.agents.len(),
            },
            sections,
        })
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
        disclosures: Vec::new(),
    }
}

/// Adds the disclosures checked (§6.3): one that does not match its record,
/// or names none in the pack, fails the run.
fn add_disclosures(report: &mut Report, disclosures: Vec<tally_schemas::report::DisclosureCheck>) {
    if disclosures
        .iter()
        .any(|d| d.status != tally_schemas::report::DisclosureStatus::Match)
    {
        report.result = Verdict::Fail;
    }
    report.disclosures = disclosures;
}

/// A verification with what the audit report adds (§11.3): the per-agent
/// sections, in header order, before the report's statements are sorted
/// into them ([`crate::audit::sections`]).
#[derive(Debug)]
pub struct Audited {
    /// The verification; its report carries the disclosures checked.
    pub verification: Verification,
    /// Per header agent, the figures gathered while verifying.
    pub sections: Vec<tally_schemas::audit::AgentSection>,
}

/// The report for a pack whose first line is not a usable header.
fn headerless_report(reason: String, audit: Option<AuditOptions>) -> Audited {
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
    let mut report = finish_report(checks, Vec::new(), Vec::new(), 0);
    if let Some(a) = audit {
        add_disclosures(&mut report, Activity::new(0, a).finish(&[]).1);
    }
    Audited {
        verification: Verification { report, agents: 0 },
        sections: Vec::new(),
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
pub fn verify_with_budget<R: BufRead>(
    pack: R,
    keys: &AgentKeys,
    log_key: &NoteVerifier,
    head: Option<&Head>,
    options: VerifyOptions<'_>,
    memory_budget: usize,
) -> Result<Verification, VerifyError> {
    run(pack, keys, log_key, head, options, memory_budget, None).map(|a| a.verification)
}

/// [`verify()`], gathering also what the audit report (§11.3) shows per
/// agent within `audit.period`, and checking `audit.disclosures` (§6.3)
/// against their records: a disclosure that does not check makes the
/// result FAIL.
///
/// # Errors
/// As [`verify()`].
pub fn audit<R: BufRead>(
    pack: R,
    keys: &AgentKeys,
    log_key: &NoteVerifier,
    head: Option<&Head>,
    options: VerifyOptions<'_>,
    audit: AuditOptions,
) -> Result<Audited, VerifyError> {
    run(
        pack,
        keys,
        log_key,
        head,
        options,
        spill::DEFAULT_BUDGET_BYTES,
        Some(audit),
    )
}

#[allow(clippy::too_many_lines)]
fn run<R: BufRead>(
    mut pack: R,
    keys: &AgentKeys,
    log_key: &NoteVerifier,
    head: Option<&Head>,
    mut options: VerifyOptions<'_>,
    memory_budget: usize,
    audit: Option<AuditOptions>,
) -> Result<Audited, VerifyError> {
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
                audit,
            ))
        }
        Err(e) => return Ok(headerless_report(e.to_string(), audit)),
    };

    let ctx = Context {
        keys: keys
            .agents
            .iter()
            .map(|a| (a.agent.as_str().to_owned(), a.keys.clone()))
            .collect::<HashMap<_, _>>(),
        pack_tree: None,
        nonce_keys: Default::default(),
    };
    let mut st = Run::new(header, keys, log_key, &options, memory_budget, audit);
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
        let mut handle = |st: &mut Run<'_>, batches: Vec<Vec<Parsed>>| {
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
                        st.schema.unterminated();
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
    Ok(st.finish(head, &ctx, &options, log_key)?)
}
