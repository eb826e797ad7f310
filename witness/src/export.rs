//! Exports in exactly the formats of docs/protocol.md §9: packs (§9.1–§9.2),
//! agent-keys.json (§9.3) and head.json (§9.4).
//!
//! A pack is written as a stream with memory independent of its length: the
//! plan (first and last seq per agent, pinned to one checkpoint) walks only
//! the `agent_seq` index rows, then two merged walks over the agents' chains
//! in log-index order write the `checkpoint` lines (receipt sizes are
//! non-decreasing in index, so each is seen in order and once) and the
//! `record` lines. Only one page of index rows per agent is held at a time.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use tally_log::{Log, SignedCheckpoint};
use tally_schemas::canonical;
use tally_schemas::limits::{MAX_AGENTS_PER_PACK, MAX_PACK_HEADER_BYTES, MAX_RECORDS_PER_PACK};
use tally_schemas::pack::{
    AgentKeyList, AgentKeys, Head, HeadAgent, PackAgent, PackCheckpoint, PackEnd, PackHeader,
    PackLine, PackReceipt, PackRecord, Witnessed, PACK_VERSION,
};
use tally_schemas::{AgentName, LeafIndex, Seq, TreeSize, UnixMillis};

use crate::error::WitnessError;
use crate::registry::Registry;

/// Index rows read per page while walking a chain.
const PAGE: usize = 1024;

/// Which records of each agent a pack holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExportRange {
    /// Every record up to the agent's head.
    #[default]
    All,
    /// Records with `from <= seq <= to` (either end open).
    Seq {
        /// First seq, inclusive.
        from: Option<Seq>,
        /// Last seq, inclusive.
        to: Option<Seq>,
    },
    /// Records the witness received at `since <= received < until`; the
    /// pack holds every record between the first and the last such record.
    Time {
        /// Start, inclusive.
        since: Option<UnixMillis>,
        /// End, exclusive.
        until: Option<UnixMillis>,
    },
}

/// What a pack will hold, fixed before the first byte is written.
#[derive(Debug, Clone)]
pub struct PackPlan {
    checkpoint: Arc<SignedCheckpoint>,
    agents: Vec<PackAgent>,
    records: u64,
}

impl PackPlan {
    /// The pack checkpoint's size.
    #[must_use]
    pub fn size(&self) -> TreeSize {
        self.checkpoint.checkpoint.size
    }

    /// The agents and their seq ranges.
    #[must_use]
    pub fn agents(&self) -> &[PackAgent] {
        &self.agents
    }

    /// Number of record lines.
    #[must_use]
    pub fn records(&self) -> u64 {
        self.records
    }
}

/// What a written pack held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackCounts {
    /// `checkpoint` lines.
    pub checkpoints: u64,
    /// `record` lines.
    pub records: u64,
}

/// Walks one agent's `(seq, index)` rows from `from` on, a page at a time,
/// stopping past `last` or at the tree size.
struct ChainCursor {
    agent: AgentName,
    next: Option<Seq>,
    last: Option<Seq>,
    size: TreeSize,
    page: VecDeque<(Seq, LeafIndex)>,
}

impl ChainCursor {
    fn new(agent: AgentName, from: Seq, last: Option<Seq>, size: TreeSize) -> Self {
        Self {
            agent,
            next: Some(from),
            last,
            size,
            page: VecDeque::new(),
        }
    }

    fn next(&mut self, log: &Log) -> Result<Option<(Seq, LeafIndex)>, WitnessError> {
        if self.page.is_empty() {
            let Some(from) = self.next else {
                return Ok(None);
            };
            let rows = log.store().agent_indexes(&self.agent, from, PAGE)?;
            if rows.is_empty() {
                self.next = None;
                return Ok(None);
            }
            self.page.extend(rows);
        }
        let Some((seq, index)) = self.page.pop_front() else {
            return Ok(None);
        };
        if self.last.is_some_and(|l| seq > l) || !self.size.contains(index) {
            self.page.clear();
            self.next = None;
            return Ok(None);
        }
        self.next = seq.next();
        Ok(Some((seq, index)))
    }
}

/// Merges the agents' chains by log index.
struct Merged {
    cursors: Vec<ChainCursor>,
    heap: BinaryHeap<Reverse<(LeafIndex, usize, Seq)>>,
}

impl Merged {
    fn new(log: &Log, plan: &PackPlan) -> Result<Self, WitnessError> {
        let mut m = Self {
            cursors: plan
                .agents
                .iter()
                .map(|a| {
                    ChainCursor::new(a.agent.clone(), a.first_seq, Some(a.last_seq), plan.size())
                })
                .collect(),
            heap: BinaryHeap::new(),
        };
        for i in 0..m.cursors.len() {
            if let Some((seq, index)) = m.cursors[i].next(log)? {
                m.heap.push(Reverse((index, i, seq)));
            }
        }
        Ok(m)
    }

    /// The next `(agent position, seq, index)` in log order.
    fn next(&mut self, log: &Log) -> Result<Option<(usize, Seq, LeafIndex)>, WitnessError> {
        let Some(Reverse((index, i, seq))) = self.heap.pop() else {
            return Ok(None);
        };
        if let Some((s, ix)) = self.cursors[i].next(log)? {
            self.heap.push(Reverse((ix, i, s)));
        }
        Ok(Some((i, seq, index)))
    }
}

/// The checkpoint packs and head.json are pinned to: with cosigners, the
/// cosigned one of protocol.md §14.5 (waiting at most the export wait for
/// the cosigners to be asked about the latest checkpoint), else the latest.
///
/// # Errors
/// `Internal` when storage fails.
pub async fn pinned_checkpoint(
    w: &crate::witness::Witness,
) -> Result<Arc<SignedCheckpoint>, WitnessError> {
    match w.cosigning() {
        Some(c) => c
            .checkpoint_for_export()
            .await
            .map_err(|e| WitnessError::internal(&e)),
        None => Ok(w.log().latest_checkpoint()),
    }
}

/// Fixes what a pack of `agents` over `range` holds, pinned to the latest
/// checkpoint.
///
/// # Errors
/// `BadRequest` for no agents, too many agents or records;
/// `NoRecords` for an agent with nothing in range; storage failures.
pub fn plan_pack(
    log: &Log,
    agents: &[AgentName],
    range: ExportRange,
) -> Result<PackPlan, WitnessError> {
    plan_pack_at(log, log.latest_checkpoint(), agents, range)
}

/// [`plan_pack`] pinned to `checkpoint`, a checkpoint this log signed and
/// stored, whose note may carry cosignature lines (protocol.md §14.5):
/// the pack holds the records it covers.
///
/// # Errors
/// As [`plan_pack`].
pub fn plan_pack_at(
    log: &Log,
    checkpoint: Arc<SignedCheckpoint>,
    agents: &[AgentName],
    range: ExportRange,
) -> Result<PackPlan, WitnessError> {
    let mut agents = agents.to_vec();
    agents.sort();
    agents.dedup();
    if agents.is_empty() {
        return Err(WitnessError::BadRequest {
            code: "missing_parameter",
            message: "name at least one agent".into(),
        });
    }
    if agents.len() > MAX_AGENTS_PER_PACK {
        return Err(WitnessError::BadRequest {
            code: "too_many_agents",
            message: format!("a pack holds at most {MAX_AGENTS_PER_PACK} agents"),
        });
    }
    let size = checkpoint.checkpoint.size;
    let mut planned = Vec::with_capacity(agents.len());
    let mut records: u64 = 0;
    for agent in agents {
        let (first, last, n) =
            agent_range(log, &agent, range, size)?.ok_or_else(|| WitnessError::NoRecords {
                agent: agent.clone(),
                in_range: range != ExportRange::All,
            })?;
        records += n;
        if records > MAX_RECORDS_PER_PACK {
            return Err(WitnessError::BadRequest {
                code: "too_many_records",
                message: format!(
                    "a pack holds at most {MAX_RECORDS_PER_PACK} records; narrow the range"
                ),
            });
        }
        planned.push(PackAgent {
            agent,
            first_seq: first,
            last_seq: last,
        });
    }
    let plan = PackPlan {
        checkpoint,
        agents: planned,
        records,
    };
    // The header is one line with its own limit: refuse a plan it cannot
    // hold. With at most MAX_AGENTS_PER_PACK agents it cannot happen (the
    // worst case, built in schemas/tests/it/limits.rs, is 647,267 bytes of
    // 1 MiB), so this only guards a change to those limits.
    let header = header_line(&plan, UnixMillis::new(0))?;
    if header.len() > MAX_PACK_HEADER_BYTES {
        return Err(WitnessError::BadRequest {
            code: "too_many_agents",
            message: format!(
                "the pack header would exceed {MAX_PACK_HEADER_BYTES} bytes; export fewer agents per pack"
            ),
        });
    }
    Ok(plan)
}

/// `(first seq, last seq, count)` of `agent`'s records in `range` within `size`.
fn agent_range(
    log: &Log,
    agent: &AgentName,
    range: ExportRange,
    size: TreeSize,
) -> Result<Option<(Seq, Seq, u64)>, WitnessError> {
    let (from, last) = match range {
        ExportRange::All => (Seq::GENESIS, None),
        ExportRange::Seq { from, to } => (from.unwrap_or(Seq::GENESIS), to),
        ExportRange::Time { since, until } => {
            // Receive times never decrease along a chain: binary search for
            // the range's ends instead of reading every entry.
            let Some(head) = log.chain_head(agent)? else {
                return Ok(None);
            };
            let len = head.seq.get() + 1;
            let first = match since {
                Some(t) => log.chain_seq_received_from(agent, len, t)?,
                None => 0,
            };
            let end = match until {
                Some(t) => log.chain_seq_received_from(agent, len, t)?,
                None => len,
            };
            if end <= first {
                return Ok(None);
            }
            let seq = |n: u64| Seq::new(n).map_err(|e| WitnessError::internal(&e));
            (seq(first)?, Some(seq(end - 1)?))
        }
    };
    let mut cursor = ChainCursor::new(agent.clone(), from, last, size);
    let mut first: Option<Seq> = None;
    let mut end: Option<Seq> = None;
    let mut n = 0u64;
    while let Some((seq, _)) = cursor.next(log)? {
        first.get_or_insert(seq);
        end = Some(seq);
        n += 1;
    }
    Ok(first.zip(end).map(|(f, l)| (f, l, n)))
}

fn header_line(plan: &PackPlan, created: UnixMillis) -> Result<Vec<u8>, WitnessError> {
    line(&PackLine::Header(PackHeader {
        v: PACK_VERSION,
        origin: plan.checkpoint.checkpoint.origin.clone(),
        checkpoint: plan.checkpoint.note.clone(),
        created,
        agents: plan.agents.clone(),
    }))
}

fn line(l: &PackLine) -> Result<Vec<u8>, WitnessError> {
    let mut bytes = l.to_json().map_err(|e| WitnessError::internal(&e))?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Writes the pack of `plan` to `sink`, one line per call, each ending in `\n`.
///
/// # Errors
/// Storage failures, or the sink's own error (a closed connection).
pub fn write_pack(
    log: &Log,
    plan: &PackPlan,
    created: UnixMillis,
    sink: &mut dyn FnMut(Vec<u8>) -> Result<(), WitnessError>,
) -> Result<PackCounts, WitnessError> {
    let size = plan.size();
    sink(header_line(plan, created)?)?;

    // Checkpoint lines: the receipt sizes, in order, once each.
    let mut checkpoints = 0u64;
    let mut last_size: Option<TreeSize> = None;
    let mut merged = Merged::new(log, plan)?;
    while let Some((_, _, index)) = merged.next(log)? {
        let rs = log
            .receipt_size(index)?
            .ok_or_else(|| WitnessError::internal(&format!("entry {index} has no receipt size")))?;
        match last_size {
            Some(l) if rs == l => continue,
            Some(l) if rs < l => {
                return Err(WitnessError::internal(&format!(
                    "receipt size {rs} of entry {index} is below the previous one {l}"
                )))
            }
            _ => {}
        }
        last_size = Some(rs);
        let note = log.checkpoint_note(rs)?.ok_or_else(|| {
            WitnessError::internal(&format!("receipt checkpoint of size {rs} is not stored"))
        })?;
        let consistency = if rs == size {
            Vec::new()
        } else {
            log.consistency_proof(rs, Some(size))?.1
        };
        sink(line(&PackLine::Checkpoint(PackCheckpoint {
            checkpoint: note,
            consistency,
        }))?)?;
        checkpoints += 1;
    }

    // Record lines, in log order.
    let mut records = 0u64;
    let mut merged = Merged::new(log, plan)?;
    while let Some((i, seq, index)) = merged.next(log)? {
        let entry = log.entry(index)?.ok_or_else(|| {
            WitnessError::internal(&format!("entry {index} is indexed but not readable"))
        })?;
        let record = entry.record();
        if record.agent != plan.agents[i].agent || record.seq != seq {
            return Err(WitnessError::internal(&format!(
                "entry {index} holds {}#{}, the index says {}#{seq}",
                record.agent, record.seq, plan.agents[i].agent
            )));
        }
        let receipt_size = log
            .receipt_size(index)?
            .ok_or_else(|| WitnessError::internal(&format!("entry {index} has no receipt size")))?;
        let (_, inclusion) = log.inclusion_proof(index, Some(size))?;
        let pack_record = PackRecord {
            witnessed: Some(Witnessed {
                index,
                received: entry.received(),
                inclusion,
            }),
            receipt: Some(PackReceipt {
                record_hash: record.hash(),
                nonce: record.nonce.clone(),
                index,
                tree_size: receipt_size,
            }),
            record: record.clone(),
        };
        sink(line(&PackLine::Record(Box::new(pack_record)))?)?;
        records += 1;
    }
    if records != plan.records {
        return Err(WitnessError::internal(&format!(
            "planned {} records, wrote {records}",
            plan.records
        )));
    }
    sink(line(&PackLine::End(PackEnd {
        checkpoints,
        records,
    }))?)?;
    Ok(PackCounts {
        checkpoints,
        records,
    })
}

/// The pack of `plan` as a streamed HTTP body: [`write_pack`] runs on a
/// blocking thread and hands each line over a bounded channel, so memory
/// stays at a few lines whatever the pack's length, and a client that stops
/// reading stops the writer. `GET /v1/export` and the console's pack
/// downloads both answer with this body.
///
/// The status line has gone out before the first byte is written, so a
/// storage failure mid-stream cannot become an error answer: the error is
/// logged and the body ends with an I/O error, which the client sees as a
/// pack without its `end` line (check 1 fails on it, protocol.md §9.1).
pub fn pack_body(log: Arc<Log>, plan: PackPlan, created: UnixMillis) -> axum::body::Body {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(64);
    tokio::task::spawn_blocking(move || {
        let mut sink = |line: Vec<u8>| {
            tx.blocking_send(Ok(bytes::Bytes::from(line)))
                .map_err(|_| WitnessError::ShuttingDown)
        };
        if let Err(e) = write_pack(&log, &plan, created, &mut sink) {
            // ShuttingDown here means the client went away.
            if !matches!(e, WitnessError::ShuttingDown) {
                tracing::error!(error = %e, "export failed mid-stream; the pack is cut short (no end line)");
            }
            let _ = tx.blocking_send(Err(std::io::Error::other("export failed")));
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    axum::body::Body::from_stream(stream)
}

/// agent-keys.json for `project`'s agents (all of them, or those named).
///
/// # Errors
/// `AgentNotAllowed` for a named agent that is not the project's;
/// `BadRequest` (`too_many_agents`) for more than [`MAX_AGENTS_PER_PACK`]
/// agents, which agent-keys.json cannot list.
pub fn agent_keys(
    registry: &Registry,
    origin: &str,
    project: &str,
    only: &[AgentName],
) -> Result<AgentKeys, WitnessError> {
    let all = registry.agents_of(project);
    for a in only {
        if !all.iter().any(|(n, _)| n == a) {
            return Err(WitnessError::AgentNotAllowed { agent: a.clone() });
        }
    }
    let agents: Vec<AgentKeyList> = all
        .into_iter()
        .filter(|(n, _)| only.is_empty() || only.contains(n))
        .map(|(agent, row)| AgentKeyList {
            agent,
            keys: row.keys,
        })
        .collect();
    // AgentKeys::from_json refuses more than MAX_AGENTS_PER_PACK agents, so
    // refuse to write such a file. The other rules hold by construction:
    // agent names are unique in the registry, `Registry::rotate_key` keeps
    // an agent at MAX_KEYS_PER_AGENT keys with unique ids, and within those
    // counts the document is at most 44,703,774 bytes, under
    // MAX_AGENT_KEYS_BYTES (schemas/tests/it/limits.rs builds the worst case).
    if agents.len() > MAX_AGENTS_PER_PACK {
        return Err(too_many_agents("agent-keys.json", agents.len()));
    }
    Ok(AgentKeys {
        v: PACK_VERSION,
        origin: origin.to_owned(),
        agents,
    })
}

/// head.json: the latest checkpoint, a consistency proof from `from_size`,
/// and each agent's latest record within it. Agents without records are
/// left out unless `require_all`.
///
/// # Errors
/// `BadRequest` for a `from_size` of 0 or beyond the log, or more than
/// [`MAX_AGENTS_PER_PACK`] agents; `NoRecords` when `require_all` and an
/// agent has none.
pub fn head(
    log: &Log,
    from_size: TreeSize,
    agents: &[AgentName],
    require_all: bool,
) -> Result<Head, WitnessError> {
    head_at(
        log,
        &log.latest_checkpoint(),
        from_size,
        agents,
        require_all,
    )
}

/// [`head`] with `cp` as the head checkpoint: one this log signed and
/// stored, whose note may carry cosignature lines (protocol.md §14.5).
///
/// # Errors
/// As [`head`].
pub fn head_at(
    log: &Log,
    cp: &SignedCheckpoint,
    from_size: TreeSize,
    agents: &[AgentName],
    require_all: bool,
) -> Result<Head, WitnessError> {
    let mut agents = agents.to_vec();
    agents.sort();
    agents.dedup();
    // Head::from_json refuses more than MAX_AGENTS_PER_PACK agents. Within
    // that count each agent is listed once (deduplicated above) with one
    // record of at most MAX_RECORD_BYTES and one inclusion proof, so the
    // document is at most 152,256,783 bytes, under MAX_HEAD_BYTES
    // (schemas/tests/it/limits.rs builds the worst case).
    if agents.len() > MAX_AGENTS_PER_PACK {
        return Err(too_many_agents("head.json", agents.len()));
    }
    let size = cp.checkpoint.size;
    if from_size.get() == 0 {
        return Err(WitnessError::BadRequest {
            code: "from_empty_tree",
            message: "from_size must be the pack checkpoint's size, at least 1".into(),
        });
    }
    if from_size > size {
        return Err(WitnessError::BadRequest {
            code: "size_beyond_tree",
            message: format!("from_size {from_size} is beyond the head checkpoint's size {size}"),
        });
    }
    let consistency = if from_size == size {
        Vec::new()
    } else {
        log.consistency_proof(from_size, Some(size))?.1
    };
    let mut out = Vec::new();
    for agent in agents {
        match latest_within(log, &agent, size)? {
            Some(index) => {
                let entry = log.entry(index)?.ok_or_else(|| {
                    WitnessError::internal(&format!("entry {index} is indexed but not readable"))
                })?;
                let (_, inclusion) = log.inclusion_proof(index, Some(size))?;
                out.push(HeadAgent {
                    witnessed: Witnessed {
                        index,
                        received: entry.received(),
                        inclusion,
                    },
                    record: entry.record().clone(),
                });
            }
            None if require_all => {
                return Err(WitnessError::NoRecords {
                    agent,
                    in_range: false,
                });
            }
            None => {}
        }
    }
    Ok(Head {
        v: PACK_VERSION,
        checkpoint: cp.note.clone(),
        from_size,
        consistency,
        agents: out,
    })
}

fn too_many_agents(what: &str, count: usize) -> WitnessError {
    WitnessError::BadRequest {
        code: "too_many_agents",
        message: format!(
            "{what} lists at most {MAX_AGENTS_PER_PACK} agents, {count} asked for; name fewer agents"
        ),
    }
}

/// The index of `agent`'s latest record inside a tree of `size`. The
/// committed head can be one batch past the latest checkpoint; then step
/// back through the chain.
fn latest_within(
    log: &Log,
    agent: &AgentName,
    size: TreeSize,
) -> Result<Option<LeafIndex>, WitnessError> {
    let Some(head) = log.chain_head(agent)? else {
        return Ok(None);
    };
    if size.contains(head.index) {
        return Ok(Some(head.index));
    }
    let mut back: u64 = 64;
    loop {
        let from = head.seq.get().saturating_sub(back);
        let from_seq = Seq::new(from).map_err(|e| WitnessError::internal(&e))?;
        let rows = log
            .store()
            .agent_indexes(agent, from_seq, (back as usize).saturating_add(1))?;
        if let Some((_, index)) = rows.iter().rev().find(|(_, i)| size.contains(*i)) {
            return Ok(Some(*index));
        }
        if from == 0 {
            return Ok(None);
        }
        back = back.saturating_mul(4);
    }
}

/// Canonical JSON bytes of a document.
///
/// # Errors
/// Only if canonicalisation fails, which the types prevent.
pub fn to_canonical<T: serde::Serialize>(doc: &T) -> Result<Vec<u8>, WitnessError> {
    canonical::canonicalize(doc).map_err(|e| WitnessError::internal(&e))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tally_log::store::memory::MemoryStore;
    use tally_log::{Log, LogConfig};
    use tally_schemas::limits::MAX_AGENTS_PER_PACK;
    use tally_schemas::{AgentName, NoteSigner, SecretKey, TreeSize};

    use super::head;
    use crate::error::WitnessError;

    #[test]
    fn head_refuses_more_agents_than_head_json_may_list() {
        let signer =
            NoteSigner::from_secret("tally.test/log", SecretKey::from_seed(&[1; 32])).unwrap();
        let log = Log::open(Arc::new(MemoryStore::new()), signer, LogConfig::default()).unwrap();
        let names: Vec<AgentName> = (0..=MAX_AGENTS_PER_PACK)
            .map(|i| AgentName::new(&format!("a{i}")).unwrap())
            .collect();
        // The count is checked before anything is read from the log.
        assert!(matches!(
            head(&log, TreeSize::new(1), &names, false),
            Err(WitnessError::BadRequest {
                code: "too_many_agents",
                ..
            })
        ));
        // Repeats count once.
        let mut repeated = names[..MAX_AGENTS_PER_PACK].to_vec();
        repeated.extend_from_slice(&names[..10]);
        assert!(matches!(
            head(&log, TreeSize::new(1), &repeated, false),
            Err(WitnessError::BadRequest {
                code: "size_beyond_tree",
                ..
            })
        ));
    }
}
