//! Builds tally logs and packs from scratch, deterministically (fixed keys,
//! a clock that only moves when told, nonces derived from a counter), for
//! the tests and the conformance corpus (testdata/conformance/). It plays
//! agent, witness and log at once, using only tally-schemas: records are
//! signed by agent keys, entries are appended to an RFC 9162 tree,
//! checkpoints are signed notes, packs follow docs/protocol.md §9. It does
//! no I/O.
//!
//! Nothing here is trusted by the verifier; it only produces inputs.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};
use tally_schemas::hash::leaf_hash;
use tally_schemas::note::{Checkpoint, NoteSigner};
use tally_schemas::pack::{
    AgentKey, AgentKeyList, AgentKeys, Head, HeadAgent, PackAgent, PackCheckpoint, PackEnd,
    PackHeader, PackLine, PackReceipt, PackRecord, Witnessed, PACK_VERSION,
};
use tally_schemas::record::{
    Body, Decision, KeyRotation, NoteBody, Outcome, OutcomeStatus, ToolEntry, ToolList,
    ToolPartDigests,
};
use tally_schemas::tree::{reference, LeafIndex, TreeSize};
use tally_schemas::{AgentName, Hash, Nonce, Record, SecretKey, Seq, UnixMillis, UnsignedRecord};

use tally_schemas::entry::leaf_data;

/// 2026-11-30T08:00:00.000Z, the fixture's epoch.
pub const EPOCH_MS: i64 = 1_796_025_600_000;

/// A deterministic secret key from a label.
#[must_use]
pub fn key_from_label(label: &str) -> SecretKey {
    let seed: [u8; 32] = Sha256::digest(format!("tally-fixture-key\n{label}").as_bytes()).into();
    SecretKey::from_seed(&seed)
}

/// A deterministic log signer for `origin` from a label.
///
/// # Panics
/// Never for a valid origin; the fixture's origins are constants.
#[must_use]
pub fn log_signer(origin: &str, label: &str) -> NoteSigner {
    NoteSigner::from_secret(origin, key_from_label(label))
        .expect("fixture origins are valid key names")
}

/// A salted-hash stand-in: SHA-256 of a label (the verifier never opens it).
#[must_use]
pub fn digest(label: &str) -> Hash {
    Hash::sha256(label.as_bytes())
}

/// A tool entry with per-part digests derived from `version`.
#[must_use]
pub fn tool(name: &str, recorded: bool, version: &str) -> ToolEntry {
    ToolEntry {
        name: name.to_owned(),
        recorded,
        digest: digest(&format!("{name}/{version}/definition")),
        parts: ToolPartDigests {
            description: Some(digest(&format!("{name}/{version}/description"))),
            input_schema: Some(digest(&format!("{name}/input"))),
            ..ToolPartDigests::default()
        },
    }
}

/// One entry of the simulated log.
#[derive(Debug, Clone)]
pub struct Logged {
    /// The record.
    pub record: Record,
    /// Its index.
    pub index: u64,
    /// The witness's receive time.
    pub received: UnixMillis,
}

#[derive(Debug, Clone)]
struct AgentSim {
    key: SecretKey,
    keys: Vec<SecretKey>,
    seq: u64,
    prev: Option<Hash>,
}

/// A simulated agent set, witness and log.
#[derive(Debug, Clone)]
pub struct Fixture {
    /// The log's origin.
    pub origin: String,
    /// The log's checkpoint key.
    pub log: NoteSigner,
    /// Every entry, in log order.
    pub entries: Vec<Logged>,
    /// Records made but not (yet) logged.
    pub pending: Vec<Record>,
    /// Sizes at which checkpoints were signed (receipts were issued under
    /// the first one covering each entry).
    pub commits: Vec<u64>,
    /// The clock, in Unix milliseconds.
    pub now: i64,
    /// Milliseconds between a record's time and its receive time.
    pub latency: i64,
    leaves: Vec<Hash>,
    agents: BTreeMap<String, AgentSim>,
    nonces: u64,
}

/// What a pack covers and when it was made.
#[derive(Debug, Clone, Default)]
pub struct PackSpec {
    /// The pack checkpoint's size (default: the last commit).
    pub size: Option<u64>,
    /// Per agent, `(first_seq, last_seq)`; default every agent, all of its
    /// records logged below the pack size plus its pending records.
    pub ranges: Option<BTreeMap<String, (u64, u64)>>,
    /// `created` (default: the clock).
    pub created: Option<i64>,
    /// Leave pending records out.
    pub no_pending: bool,
}

impl Fixture {
    /// An empty log for `origin`, its key derived from `log_label`.
    #[must_use]
    pub fn new(origin: &str, log_label: &str) -> Self {
        Self {
            origin: origin.to_owned(),
            log: log_signer(origin, log_label),
            entries: Vec::new(),
            pending: Vec::new(),
            commits: Vec::new(),
            now: EPOCH_MS,
            latency: 40,
            leaves: Vec::new(),
            agents: BTreeMap::new(),
            nonces: 0,
        }
    }

    /// Adds an agent whose key is derived from `key_label`.
    pub fn add_agent(&mut self, name: &str, key_label: &str) {
        let key = key_from_label(key_label);
        self.agents.insert(
            name.to_owned(),
            AgentSim {
                key: key.clone(),
                keys: vec![key],
                seq: 0,
                prev: None,
            },
        );
    }

    /// Moves the clock.
    pub fn tick(&mut self, ms: i64) {
        self.now += ms;
    }

    /// Skips `n` nonces (so that a copy of the fixture makes different ones).
    pub fn skip_nonces(&mut self, n: u64) {
        self.nonces += n;
    }

    /// The next nonce (16 bytes derived from a counter).
    pub fn next_nonce(&mut self) -> Nonce {
        self.nonces += 1;
        let d = Sha256::digest(format!("tally-fixture-nonce\n{}", self.nonces).as_bytes());
        Nonce::from_bytes(d[..16].to_vec()).expect("16 bytes")
    }

    /// The unsigned next record of `agent` with `body` (time: now).
    ///
    /// # Panics
    /// If the agent was not added.
    pub fn draft(&mut self, agent: &str, body: Body) -> UnsignedRecord {
        let nonce = self.next_nonce();
        let a = &self.agents[agent];
        UnsignedRecord {
            agent: AgentName::new(agent).expect("fixture agent names are valid"),
            key_id: a.key.public_key().key_id(),
            seq: Seq::new(a.seq).expect("small"),
            prev: a.prev,
            time: UnixMillis::new(self.now),
            nonce,
            body,
        }
    }

    /// Signs `draft` with the agent's current key (or `key`) and advances
    /// the agent's chain to it.
    ///
    /// # Panics
    /// If the draft breaks a record rule.
    pub fn sign(&mut self, draft: UnsignedRecord, key: Option<&SecretKey>) -> Record {
        let agent = draft.agent.as_str().to_owned();
        let a = self.agents.get_mut(&agent).expect("agent added");
        let record = draft
            .sign(key.unwrap_or(&a.key))
            .expect("fixture records are valid");
        a.seq = record.seq.get() + 1;
        a.prev = Some(record.hash());
        record
    }

    /// Makes the next record of `agent`, then replaces its signature by the
    /// 64 bytes `tamper` makes of the valid one (the record parses; whether
    /// the signature verifies is the verifier's business), and advances the
    /// agent's chain to the result, so that the next record links to it.
    ///
    /// # Panics
    /// If the agent was not added.
    pub fn make_with_signature(
        &mut self,
        agent: &str,
        body: Body,
        tamper: impl FnOnce(&[u8; 64]) -> [u8; 64],
    ) -> Record {
        let good = self.make(agent, body);
        let mut value = serde_json::to_value(&good).expect("serialisable");
        let sig = tally_schemas::Signature::from_bytes(tamper(good.signature().as_bytes()));
        value["sig"] = serde_json::Value::String(sig.to_base64());
        let record = Record::from_value(value).expect("only the signature changed");
        let a = self.agents.get_mut(agent).expect("agent added");
        a.prev = Some(record.hash());
        record
    }

    /// Makes and signs the next record of `agent`.
    pub fn make(&mut self, agent: &str, body: Body) -> Record {
        let d = self.draft(agent, body);
        self.sign(d, None)
    }

    /// Appends a record to the log, received `latency` ms after its time
    /// (or at `received`).
    pub fn append(&mut self, record: Record, received: Option<i64>) -> u64 {
        let index = self.entries.len() as u64;
        let received = UnixMillis::new(received.unwrap_or(record.time.as_millis() + self.latency));
        self.leaves.push(leaf_hash(&leaf_data(
            LeafIndex::new(index),
            received,
            &record,
        )));
        self.entries.push(Logged {
            record,
            index,
            received,
        });
        index
    }

    /// Makes, signs and logs the next record of `agent`; moves the clock 1 s.
    pub fn log(&mut self, agent: &str, body: Body) -> Record {
        let r = self.make(agent, body);
        self.append(r.clone(), None);
        self.tick(1000);
        r
    }

    /// Signs a checkpoint at the current size.
    pub fn commit(&mut self) {
        self.commits.push(self.entries.len() as u64);
    }

    /// A decision and its outcome, both logged.
    pub fn call(&mut self, agent: &str, call_id: &str, tool_name: &str) -> (Record, Record) {
        let d = self.log(agent, decision(call_id, tool_name));
        let o = self.log(agent, outcome(call_id, &d, OutcomeStatus::Ok));
        (d, o)
    }

    /// Rotates `agent` to a key derived from `label`: a key_rotation record
    /// signed by the old key, logged; later records use the new key.
    pub fn rotate(&mut self, agent: &str, label: &str) -> Record {
        let new = key_from_label(label);
        let body = Body::KeyRotation(KeyRotation {
            new_key_id: new.public_key().key_id(),
            new_public_key: new.public_key(),
        });
        let r = self.log(agent, body);
        let a = self.agents.get_mut(agent).expect("agent added");
        a.key = new.clone();
        a.keys.push(new);
        r
    }

    /// The agent's current secret key.
    #[must_use]
    pub fn agent_key(&self, agent: &str) -> SecretKey {
        self.agents[agent].key.clone()
    }

    /// agent-keys.json listing every key each agent has used, active from
    /// the epoch with no end.
    #[must_use]
    pub fn agent_keys(&self) -> AgentKeys {
        AgentKeys {
            v: PACK_VERSION,
            origin: self.origin.clone(),
            agents: self
                .agents
                .iter()
                .map(|(name, a)| AgentKeyList {
                    agent: AgentName::new(name).expect("valid"),
                    keys: a
                        .keys
                        .iter()
                        .map(|k| AgentKey {
                            key_id: k.public_key().key_id(),
                            public_key: k.public_key(),
                            not_before: UnixMillis::new(EPOCH_MS),
                            not_after: None,
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// The signed checkpoint note of the tree at `size`.
    ///
    /// # Panics
    /// If `size` is beyond the log.
    #[must_use]
    pub fn checkpoint(&self, size: u64) -> String {
        let root = reference::root(&self.leaves[..usize::try_from(size).expect("small")]);
        self.log
            .sign_checkpoint(&Checkpoint::new(&self.origin, TreeSize::new(size), root))
            .expect("origin matches")
    }

    /// Root of the tree at `size`.
    #[must_use]
    pub fn root(&self, size: u64) -> Hash {
        reference::root(&self.leaves[..size as usize])
    }

    /// Inclusion proof of `index` in the tree at `size`.
    #[must_use]
    pub fn inclusion(&self, index: u64, size: u64) -> Vec<Hash> {
        reference::inclusion_proof(index as usize, &self.leaves[..size as usize])
    }

    /// Consistency proof from `old` to `new`.
    #[must_use]
    pub fn consistency(&self, old: u64, new: u64) -> Vec<Hash> {
        reference::consistency_proof(old as usize, &self.leaves[..new as usize])
    }

    /// The pack's lines as values (header first, end last).
    ///
    /// # Panics
    /// If there is no commit to use as the pack checkpoint.
    #[must_use]
    pub fn pack_lines(&self, spec: &PackSpec) -> Vec<PackLine> {
        let size = spec
            .size
            .unwrap_or_else(|| *self.commits.last().expect("a commit"));
        let in_range = |r: &Record| match &spec.ranges {
            None => self.agents.contains_key(r.agent.as_str()),
            Some(m) => m
                .get(r.agent.as_str())
                .is_some_and(|&(f, l)| (f..=l).contains(&r.seq.get())),
        };
        let receipt_size = |index: u64| {
            self.commits
                .iter()
                .copied()
                .find(|&c| c > index && c <= size)
                .unwrap_or(size)
        };
        let witnessed: Vec<&Logged> = self
            .entries
            .iter()
            .filter(|e| e.index < size && in_range(&e.record))
            .collect();
        let pending: Vec<&Record> = if spec.no_pending {
            Vec::new()
        } else {
            let mut p: Vec<&Record> = self.pending.iter().filter(|r| in_range(r)).collect();
            p.sort_by(|a, b| (a.agent.as_str(), a.seq).cmp(&(b.agent.as_str(), b.seq)));
            p
        };
        let mut ranges: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for r in witnessed
            .iter()
            .map(|e| &e.record)
            .chain(pending.iter().copied())
        {
            let e = ranges
                .entry(r.agent.as_str().to_owned())
                .or_insert((r.seq.get(), r.seq.get()));
            e.0 = e.0.min(r.seq.get());
            e.1 = e.1.max(r.seq.get());
        }
        if let Some(m) = &spec.ranges {
            ranges.clone_from(m);
        }
        let mut sizes: Vec<u64> = witnessed.iter().map(|e| receipt_size(e.index)).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let mut lines = vec![PackLine::Header(PackHeader {
            v: PACK_VERSION,
            origin: self.origin.clone(),
            checkpoint: self.checkpoint(size),
            created: UnixMillis::new(spec.created.unwrap_or(self.now)),
            agents: ranges
                .iter()
                .map(|(a, &(f, l))| PackAgent {
                    agent: AgentName::new(a).expect("valid"),
                    first_seq: Seq::new(f).expect("small"),
                    last_seq: Seq::new(l).expect("small"),
                })
                .collect(),
        })];
        for &s in &sizes {
            lines.push(PackLine::Checkpoint(PackCheckpoint {
                checkpoint: self.checkpoint(s),
                consistency: if s == size {
                    Vec::new()
                } else {
                    self.consistency(s, size)
                },
            }));
        }
        for e in &witnessed {
            lines.push(PackLine::Record(Box::new(PackRecord {
                record: e.record.clone(),
                witnessed: Some(Witnessed {
                    index: LeafIndex::new(e.index),
                    received: e.received,
                    inclusion: self.inclusion(e.index, size),
                }),
                receipt: Some(PackReceipt {
                    record_hash: e.record.hash(),
                    nonce: e.record.nonce.clone(),
                    index: LeafIndex::new(e.index),
                    tree_size: TreeSize::new(receipt_size(e.index)),
                }),
            })));
        }
        for r in &pending {
            lines.push(PackLine::Record(Box::new(PackRecord {
                record: (*r).clone(),
                witnessed: None,
                receipt: None,
            })));
        }
        lines.push(PackLine::End(PackEnd {
            checkpoints: sizes.len() as u64,
            records: (witnessed.len() + pending.len()) as u64,
        }));
        lines
    }

    /// head.json at the last commit, from the pack size `from_size`, with
    /// each agent's latest logged record.
    ///
    /// # Panics
    /// If there is no commit.
    #[must_use]
    pub fn head(&self, from_size: u64) -> Head {
        let size = *self.commits.last().expect("a commit");
        let mut latest: BTreeMap<&str, &Logged> = BTreeMap::new();
        for e in self.entries.iter().filter(|e| e.index < size) {
            latest.insert(e.record.agent.as_str(), e);
        }
        Head {
            v: PACK_VERSION,
            checkpoint: self.checkpoint(size),
            from_size: TreeSize::new(from_size),
            consistency: if from_size == size || from_size == 0 {
                Vec::new()
            } else {
                self.consistency(from_size, size)
            },
            agents: latest
                .values()
                .map(|e| HeadAgent {
                    record: e.record.clone(),
                    witnessed: Witnessed {
                        index: LeafIndex::new(e.index),
                        received: e.received,
                        inclusion: self.inclusion(e.index, size),
                    },
                })
                .collect(),
        }
    }
}

/// Serialises pack lines as JSON Lines.
///
/// # Panics
/// Never: the types only hold canonicalisable values.
#[must_use]
pub fn to_jsonl(lines: &[PackLine]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in lines {
        out.extend_from_slice(&l.to_json().expect("canonical"));
        out.push(b'\n');
    }
    out
}

/// Canonical JSON of any serialisable value, with a trailing newline.
///
/// # Panics
/// Never for the fixture's types.
#[must_use]
pub fn to_json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    let mut v = tally_schemas::canonical::canonicalize(value).expect("canonical");
    v.push(b'\n');
    v
}

/// A decision body.
#[must_use]
pub fn decision(call_id: &str, tool_name: &str) -> Body {
    Body::Decision(Decision {
        call_id: call_id.to_owned(),
        tool: tool_name.to_owned(),
        input_hash: digest(&format!("input {call_id}")),
    })
}

/// An outcome body for decision `d`.
#[must_use]
pub fn outcome(call_id: &str, d: &Record, status: OutcomeStatus) -> Body {
    Body::Outcome(Outcome {
        call_id: call_id.to_owned(),
        decision: d.hash(),
        status,
        output_hash: Some(digest(&format!("output {call_id}"))),
        state: None,
        proof: None,
        proof_hash: None,
    })
}

/// A one-part tool list body.
#[must_use]
pub fn tools(list_id: &str, entries: Vec<ToolEntry>) -> Body {
    Body::Tools(ToolList {
        list_id: list_id.to_owned(),
        part: 0,
        parts: 1,
        tools: entries,
        source: None,
        lease_ms: None,
    })
}

/// A note body.
#[must_use]
pub fn note(text: &str) -> Body {
    Body::Note(NoteBody {
        text: text.to_owned(),
    })
}
