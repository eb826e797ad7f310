//! Packs, agent-keys.json and head.json, docs/protocol.md §9.
//!
//! A pack is JSON Lines so that it can be written and verified as a stream:
//! a `header` line (the pack's checkpoint first, so every later line can be
//! checked as it arrives), `checkpoint` lines (the checkpoints receipts were
//! issued under, each with a consistency proof to the pack's checkpoint),
//! `record` lines in log order, and an `end` line whose counts catch a
//! truncated file.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::canonical::{self, CanonicalError, Limits};
use crate::hash::Hash;
use crate::keys::{KeyId, PublicKey};
use crate::limits::{
    MAX_AGENTS_PER_PACK, MAX_KEYS_PER_AGENT, MAX_PROOF_HASHES, MAX_WIRE_OBJECT_BYTES,
};
use crate::record::{
    check_version, put_counter, put_hashes, put_hex, put_time, AgentName, Cursor, FastRecord,
    Nonce, Record, RecordError, Seq,
};
use crate::time::UnixMillis;
use crate::tree::{LeafIndex, TreeSize};

/// The pack, agent-keys and head format version.
pub const PACK_VERSION: u64 = 1;

/// Why a pack line, agent-keys file or head file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackError {
    /// Not strict JSON, or out of bounds.
    #[error(transparent)]
    Canonical(#[from] CanonicalError),
    /// A format version this build does not read.
    #[error("{what} format version {found} is not supported (this build reads version {PACK_VERSION}); upgrade tally")]
    UnsupportedVersion {
        /// Which document.
        what: &'static str,
        /// The `v` field as written.
        found: String,
    },
    /// A line whose `type` is not one of the four.
    #[error("unknown pack line type {0:?}")]
    UnknownLineType(String),
    /// Fields missing, unknown or of the wrong type.
    #[error("{what} does not match the v1 schema: {message}")]
    Schema {
        /// Which document.
        what: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A record inside is not valid.
    #[error("record: {0}")]
    Record(#[from] RecordError),
    /// More agents than one document may list.
    #[error("{what} lists {count} agents, more than the limit of {max}")]
    TooManyAgents {
        /// Which document.
        what: &'static str,
        /// Agents listed.
        count: usize,
        /// The limit, [`MAX_AGENTS_PER_PACK`].
        max: usize,
    },
    /// More keys for one agent than agent-keys.json may list.
    #[error("agent-keys lists {count} keys for agent {agent}, more than the limit of {max}")]
    TooManyKeys {
        /// The agent.
        agent: AgentName,
        /// Keys listed.
        count: usize,
        /// The limit, [`MAX_KEYS_PER_AGENT`].
        max: usize,
    },
    /// An agent listed twice: which entry counts would be ambiguous.
    #[error("{what} lists agent {agent} more than once")]
    DuplicateAgent {
        /// Which document.
        what: &'static str,
        /// The agent.
        agent: AgentName,
    },
    /// A key listed twice for one agent: which validity range counts would be
    /// ambiguous.
    #[error("agent-keys lists key {key_id} more than once for agent {agent}")]
    DuplicateKeyId {
        /// The agent.
        agent: AgentName,
        /// The key.
        key_id: KeyId,
    },
}

impl PackError {
    /// A stable short code for the error, for tests and golden vectors.
    #[must_use]
    pub const fn code(&self) -> &'static str {
        match self {
            Self::Canonical(e) => e.code(),
            Self::Record(e) => e.code(),
            Self::UnsupportedVersion { .. } => "unsupported_version",
            Self::UnknownLineType(_) | Self::Schema { .. } => "schema",
            Self::TooManyAgents { .. } => "too_many_agents",
            Self::TooManyKeys { .. } => "too_many_keys",
            Self::DuplicateAgent { .. } => "duplicate_agent",
            Self::DuplicateKeyId { .. } => "duplicate_key_id",
        }
    }
}

/// What the pack covers for one agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackAgent {
    /// The agent.
    pub agent: AgentName,
    /// Seq of the agent's first record in the pack. When above 0, that record
    /// is the chain's anchor: proven in the log, its `prev` not followed.
    pub first_seq: Seq,
    /// Seq of the agent's last record in the pack.
    pub last_seq: Seq,
}

/// First line of a pack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackHeader {
    /// Format version, 1.
    pub v: u64,
    /// The log's origin (its checkpoint key name).
    pub origin: String,
    /// The pack's checkpoint: every record entry is proven in it.
    pub checkpoint: String,
    /// When the pack was made (witness clock).
    pub created: UnixMillis,
    /// The agents in the pack, each once, sorted by name.
    pub agents: Vec<PackAgent>,
}

/// A checkpoint a receipt was issued under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackCheckpoint {
    /// The signed checkpoint note.
    pub checkpoint: String,
    /// Consistency proof from this checkpoint to the pack's checkpoint
    /// (empty when the sizes are equal).
    pub consistency: Vec<Hash>,
}

/// Where a record sits in the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Witnessed {
    /// The entry's log index.
    pub index: LeafIndex,
    /// The witness's receive time, as in the entry.
    pub received: UnixMillis,
    /// Inclusion proof of the entry in the pack's checkpoint.
    pub inclusion: Vec<Hash>,
}

/// The receipt the witness issued, with its checkpoint named by tree size
/// (a `checkpoint` line of the pack). Its inclusion proof is not repeated:
/// the entry is proven in the pack's checkpoint, and the receipt's checkpoint
/// is proven a prefix of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackReceipt {
    /// The record hash the receipt named.
    pub record_hash: Hash,
    /// The nonce the receipt echoed.
    pub nonce: Nonce,
    /// The index the receipt gave.
    pub index: LeafIndex,
    /// Size of the checkpoint the receipt was issued under.
    pub tree_size: TreeSize,
}

/// One record of the pack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PackRecord {
    /// The record.
    pub record: Record,
    /// Its place in the log; `None` for a record not yet witnessed (pending).
    pub witnessed: Option<Witnessed>,
    /// Its receipt; `None` when none was issued yet (pending).
    pub receipt: Option<PackReceipt>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PackRecordIn {
    record: Value,
    #[serde(deserialize_with = "present")]
    witnessed: Option<Witnessed>,
    #[serde(deserialize_with = "present")]
    receipt: Option<PackReceipt>,
}

/// Reads a member that may be `null` but must be there (docs/protocol.md
/// §9: `null`, never omitted); serde alone reads a missing `Option` member
/// as `None`.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d)
}

/// A record line as the fast road reads it (see [`Record::from_json`]).
struct FastRecordLine {
    receipt: Option<PackReceipt>,
    record: FastRecord,
    witnessed: Option<Witnessed>,
}

/// Reads a record line in canonical layout; `None` at anything else.
fn read_record_line(line: &[u8]) -> Option<FastRecordLine> {
    let mut c = Cursor::new(line)?;
    c.expect(b"{\"receipt\":")?;
    let receipt = if c.eat(b"null") {
        None
    } else {
        c.expect(b"{\"index\":")?;
        let index = LeafIndex::new(c.counter()?);
        c.expect(b",\"nonce\":")?;
        let nonce = c.nonce()?;
        c.expect(b",\"record_hash\":")?;
        let record_hash = c.hash()?;
        c.expect(b",\"tree_size\":")?;
        let tree_size = TreeSize::new(c.counter()?);
        c.expect(b"}")?;
        Some(PackReceipt {
            record_hash,
            nonce,
            index,
            tree_size,
        })
    };
    c.expect(b",\"record\":")?;
    let record = FastRecord::read(&mut c)?;
    c.expect(b",\"type\":\"record\",\"witnessed\":")?;
    let witnessed = if c.eat(b"null") {
        None
    } else {
        c.expect(b"{\"inclusion\":[")?;
        let inclusion = c.hash_list()?;
        c.expect(b",\"index\":")?;
        let index = LeafIndex::new(c.counter()?);
        c.expect(b",\"received\":")?;
        let received = c.time()?;
        c.expect(b"}")?;
        Some(Witnessed {
            index,
            received,
            inclusion,
        })
    };
    c.expect(b"}")?;
    c.at_end().then_some(FastRecordLine {
        receipt,
        record,
        witnessed,
    })
}

/// The fast road for a record line that is already canonical, as export
/// writes them: the typed fields read straight from the bytes, accepted only
/// when writing them back canonically gives `line` byte for byte (so the
/// strict road would read the same line). `None` for anything else, which
/// then takes the strict road and its errors.
fn fast_record_line(line: &[u8]) -> Option<PackRecord> {
    const START: &[u8] = b"{\"receipt\":";
    if line.len() > Limits::WIRE.max_bytes || !line.starts_with(START) {
        return None;
    }
    let fields = read_record_line(line)?;
    let record = fields.record.into_record()?;
    let same = LINE.with_borrow_mut(|out| {
        out.clear();
        write_record_line(out, &fields.receipt, &record, &fields.witnessed)?;
        Some(out == line)
    })?;
    same.then_some(PackRecord {
        record,
        witnessed: fields.witnessed,
        receipt: fields.receipt,
    })
}

thread_local! {
    /// The canonical line [`fast_record_line`] compares with its input,
    /// one buffer per thread for every line it reads.
    static LINE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Appends a record line's canonical bytes; `None` for a counter above
/// 2^53 − 1 or a time out of range, which a read line cannot hold.
fn write_record_line(
    out: &mut Vec<u8>,
    receipt: &Option<PackReceipt>,
    record: &Record,
    witnessed: &Option<Witnessed>,
) -> Option<()> {
    out.extend_from_slice(b"{\"receipt\":");
    match receipt {
        None => out.extend_from_slice(b"null"),
        Some(r) => {
            out.extend_from_slice(b"{\"index\":");
            put_counter(out, r.index.get())?;
            out.extend_from_slice(b",\"nonce\":");
            put_hex(out, r.nonce.as_bytes());
            out.extend_from_slice(b",\"record_hash\":");
            put_hex(out, r.record_hash.as_bytes());
            out.extend_from_slice(b",\"tree_size\":");
            put_counter(out, r.tree_size.get())?;
            out.push(b'}');
        }
    }
    out.extend_from_slice(b",\"record\":");
    out.extend_from_slice(record.canonical_bytes());
    out.extend_from_slice(b",\"type\":\"record\",\"witnessed\":");
    match witnessed {
        None => out.extend_from_slice(b"null"),
        Some(w) => {
            out.extend_from_slice(b"{\"inclusion\":");
            put_hashes(out, &w.inclusion);
            out.extend_from_slice(b",\"index\":");
            put_counter(out, w.index.get())?;
            out.extend_from_slice(b",\"received\":");
            put_time(out, w.received)?;
            out.push(b'}');
        }
    }
    out.push(b'}');
    Some(())
}

/// Last line of a pack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackEnd {
    /// Number of `checkpoint` lines.
    pub checkpoints: u64,
    /// Number of `record` lines.
    pub records: u64,
}

/// One line of a pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PackLine {
    /// `{"type":"header",…}`.
    Header(PackHeader),
    /// `{"type":"checkpoint",…}`.
    Checkpoint(PackCheckpoint),
    /// `{"type":"record",…}`.
    Record(Box<PackRecord>),
    /// `{"type":"end",…}`.
    End(PackEnd),
}

impl PackLine {
    /// Parses one line (without its newline).
    ///
    /// # Errors
    /// [`PackError`] naming the first rule broken.
    pub fn from_json(line: &[u8]) -> Result<Self, PackError> {
        match fast_record_line(line) {
            Some(record) => Ok(Self::Record(Box::new(record))),
            None => Self::from_json_strict(line),
        }
    }

    /// The strict road: every line that is not a canonical record line, and
    /// every line that breaks a rule.
    fn from_json_strict(line: &[u8]) -> Result<Self, PackError> {
        // Only the header may be longer than a wire object: it lists every
        // agent of the pack. The larger bound is checked before decoding, the
        // wire bound as soon as the line's type is known.
        let mut value = canonical::parse_strict(line, Limits::PACK_HEADER)?;
        let schema = |message: String| PackError::Schema {
            what: "pack line",
            message,
        };
        let obj = value
            .as_object_mut()
            .ok_or_else(|| schema("expected a JSON object".into()))?;
        let kind = match obj.remove("type") {
            Some(Value::String(s)) => s,
            _ => return Err(schema("missing string field `type`".into())),
        };
        if kind != "header" && line.len() > MAX_WIRE_OBJECT_BYTES {
            return Err(CanonicalError::TooLarge {
                size: line.len(),
                max: MAX_WIRE_OBJECT_BYTES,
            }
            .into());
        }
        let de = |e: serde_json::Error| schema(format!("{kind} line: {e}"));
        Ok(match kind.as_str() {
            "header" => {
                check_version(&value, PACK_VERSION, |found| {
                    PackError::UnsupportedVersion {
                        what: "pack",
                        found,
                    }
                })
                .map_err(|e| e.unwrap_or_else(schema))?;
                Self::Header(serde_json::from_value(value).map_err(de)?)
            }
            "checkpoint" => Self::Checkpoint(serde_json::from_value(value).map_err(de)?),
            "record" => {
                let raw: PackRecordIn = serde_json::from_value(value).map_err(de)?;
                Self::Record(Box::new(PackRecord {
                    record: Record::from_value(raw.record)?,
                    witnessed: raw.witnessed,
                    receipt: raw.receipt,
                }))
            }
            "end" => Self::End(serde_json::from_value(value).map_err(de)?),
            _ => return Err(PackError::UnknownLineType(kind)),
        })
    }

    /// The line's JSON (canonical, no trailing newline).
    ///
    /// # Errors
    /// Only if a value cannot be canonicalised, which the types prevent.
    pub fn to_json(&self) -> Result<Vec<u8>, CanonicalError> {
        #[derive(Serialize)]
        struct Tagged<'a, T: Serialize> {
            #[serde(rename = "type")]
            kind: &'static str,
            #[serde(flatten)]
            inner: &'a T,
        }
        match self {
            Self::Header(h) => canonical::canonicalize(&Tagged {
                kind: "header",
                inner: h,
            }),
            Self::Checkpoint(c) => canonical::canonicalize(&Tagged {
                kind: "checkpoint",
                inner: c,
            }),
            Self::Record(r) => canonical::canonicalize(&Tagged {
                kind: "record",
                inner: r,
            }),
            Self::End(e) => canonical::canonicalize(&Tagged {
                kind: "end",
                inner: e,
            }),
        }
    }
}

/// One key of an agent, with the time range it may sign in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentKey {
    /// The key id (must match `public_key`).
    pub key_id: KeyId,
    /// The public key.
    pub public_key: PublicKey,
    /// First instant the key may sign.
    pub not_before: UnixMillis,
    /// First instant the key may no longer sign; `None` (`null`, never
    /// omitted) while it is active.
    #[serde(deserialize_with = "present")]
    pub not_after: Option<UnixMillis>,
}

impl AgentKey {
    /// Whether the key may sign at `time`.
    #[must_use]
    pub fn active_at(&self, time: UnixMillis) -> bool {
        time >= self.not_before && self.not_after.is_none_or(|end| time < end)
    }
}

/// The keys of one agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentKeyList {
    /// The agent.
    pub agent: AgentName,
    /// Its keys, current and retired.
    pub keys: Vec<AgentKey>,
}

/// agent-keys.json: the trusted agent keys an auditor gets from the operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentKeys {
    /// Format version, 1.
    pub v: u64,
    /// The log origin these agents post to.
    pub origin: String,
    /// Agents and their keys.
    pub agents: Vec<AgentKeyList>,
}

/// An agent's latest record in head.json.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeadAgent {
    /// The record.
    pub record: Record,
    /// Its place in the log, proven in the head checkpoint.
    pub witnessed: Witnessed,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HeadAgentIn {
    record: Value,
    witnessed: Witnessed,
}

/// head.json: a newer checkpoint and each agent's latest record, to show
/// that nothing was cut from the end of a pack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Head {
    /// Format version, 1.
    pub v: u64,
    /// The newer checkpoint note.
    pub checkpoint: String,
    /// Size of the older checkpoint the consistency proof starts from (the
    /// pack's).
    pub from_size: TreeSize,
    /// Consistency proof from `from_size` to the head checkpoint.
    pub consistency: Vec<Hash>,
    /// Each agent's latest record.
    pub agents: Vec<HeadAgent>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HeadIn {
    #[allow(dead_code)] // checked before this struct is decoded
    v: u64,
    checkpoint: String,
    from_size: TreeSize,
    consistency: Vec<Hash>,
    agents: Vec<HeadAgentIn>,
}

fn parse_document<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    what: &'static str,
    limits: Limits,
) -> Result<T, PackError> {
    let value = canonical::parse_strict(bytes, limits)?;
    check_version(&value, PACK_VERSION, |found| {
        PackError::UnsupportedVersion { what, found }
    })
    .map_err(|e| e.unwrap_or_else(|message| PackError::Schema { what, message }))?;
    serde_json::from_value(value).map_err(|e| PackError::Schema {
        what,
        message: e.to_string(),
    })
}

/// At most [`MAX_AGENTS_PER_PACK`] agents, each named once: a document that
/// lists an agent twice would leave which entry counts to the reader.
fn check_agents<'a>(
    what: &'static str,
    agents: impl ExactSizeIterator<Item = &'a AgentName>,
) -> Result<(), PackError> {
    if agents.len() > MAX_AGENTS_PER_PACK {
        return Err(PackError::TooManyAgents {
            what,
            count: agents.len(),
            max: MAX_AGENTS_PER_PACK,
        });
    }
    let mut seen = std::collections::HashSet::with_capacity(agents.len());
    for agent in agents {
        if !seen.insert(agent) {
            return Err(PackError::DuplicateAgent {
                what,
                agent: agent.clone(),
            });
        }
    }
    Ok(())
}

impl AgentKeys {
    /// Parses agent-keys.json: at most [`MAX_AGENTS_PER_PACK`] agents, each
    /// once, with at most [`MAX_KEYS_PER_AGENT`] keys, each key id once.
    ///
    /// # Errors
    /// [`PackError`] naming the first rule broken.
    pub fn from_json(bytes: &[u8]) -> Result<Self, PackError> {
        const WHAT: &str = "agent-keys";
        let keys = parse_document::<Self>(bytes, WHAT, Limits::AGENT_KEYS)?;
        check_agents(WHAT, keys.agents.iter().map(|l| &l.agent))?;
        for list in &keys.agents {
            if list.keys.len() > MAX_KEYS_PER_AGENT {
                return Err(PackError::TooManyKeys {
                    agent: list.agent.clone(),
                    count: list.keys.len(),
                    max: MAX_KEYS_PER_AGENT,
                });
            }
            let mut ids = std::collections::HashSet::with_capacity(list.keys.len());
            if let Some(k) = list.keys.iter().find(|k| !ids.insert(k.key_id)) {
                return Err(PackError::DuplicateKeyId {
                    agent: list.agent.clone(),
                    key_id: k.key_id,
                });
            }
            for k in &list.keys {
                if k.public_key.key_id() != k.key_id {
                    return Err(PackError::Schema {
                        what: "agent-keys",
                        message: format!(
                            "agent {}: key_id {} is not the id of its public_key",
                            list.agent, k.key_id
                        ),
                    });
                }
            }
        }
        Ok(keys)
    }
}

impl Head {
    /// Parses head.json: at most [`MAX_AGENTS_PER_PACK`] agents, each once.
    ///
    /// # Errors
    /// [`PackError`] naming the first rule broken.
    pub fn from_json(bytes: &[u8]) -> Result<Self, PackError> {
        const WHAT: &str = "head";
        let raw = parse_document::<HeadIn>(bytes, WHAT, Limits::HEAD)?;
        let agents = raw
            .agents
            .into_iter()
            .map(|a| {
                Ok(HeadAgent {
                    record: Record::from_value(a.record)?,
                    witnessed: a.witnessed,
                })
            })
            .collect::<Result<Vec<HeadAgent>, PackError>>()?;
        check_agents(WHAT, agents.iter().map(|a| &a.record.agent))?;
        // The rules of the §9.4 table are the file's: a head.json that breaks
        // one is refused whole, like agent-keys.json. Whether its checkpoint
        // is signed by the pinned key, and whether it extends the pack, is
        // check 11's to say.
        let schema = |message: String| PackError::Schema {
            what: WHAT,
            message,
        };
        crate::note::peek_checkpoint(&raw.checkpoint)
            .map_err(|e| schema(format!("checkpoint: {e}")))?;
        if raw.consistency.len() > MAX_PROOF_HASHES {
            return Err(schema(format!(
                "consistency proof has {} hashes, more than {MAX_PROOF_HASHES}",
                raw.consistency.len()
            )));
        }
        if let Some(a) = agents
            .iter()
            .find(|a| a.witnessed.inclusion.len() > MAX_PROOF_HASHES)
        {
            return Err(schema(format!(
                "the inclusion proof of {}'s record has {} hashes, more than {MAX_PROOF_HASHES}",
                a.record.agent,
                a.witnessed.inclusion.len()
            )));
        }
        Ok(Self {
            v: PACK_VERSION,
            checkpoint: raw.checkpoint,
            from_size: raw.from_size,
            consistency: raw.consistency,
            agents,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::SecretKey;
    use crate::record::{Body, NoteBody, UnsignedRecord};

    fn line(seq: u64, witnessed: bool, receipt: bool) -> PackLine {
        let key = SecretKey::from_seed(&[3; 32]);
        let record = UnsignedRecord {
            agent: AgentName::new("a").unwrap(),
            key_id: key.public_key().key_id(),
            seq: Seq::new(seq).unwrap(),
            prev: (seq > 0).then(|| Hash::sha256(b"p")),
            time: UnixMillis::new(1_795_000_000_000 + 7),
            nonce: Nonce::from_bytes(vec![seq as u8; 16]).unwrap(),
            body: Body::Note(NoteBody {
                text: "\"note\"\n".into(),
            }),
        }
        .sign(&key)
        .unwrap();
        let hash = record.hash();
        PackLine::Record(Box::new(PackRecord {
            witnessed: witnessed.then(|| Witnessed {
                index: LeafIndex::new(seq + 5),
                received: UnixMillis::new(1_795_000_000_040),
                inclusion: (0..seq).map(|i| Hash::sha256(&[i as u8])).collect(),
            }),
            receipt: receipt.then(|| PackReceipt {
                record_hash: hash,
                nonce: record.nonce.clone(),
                index: LeafIndex::new(seq + 5),
                tree_size: TreeSize::new(900),
            }),
            record,
        }))
    }

    fn lines() -> Vec<PackLine> {
        vec![
            line(0, false, false),
            line(1, true, false),
            line(2, true, true),
            line(17, true, true),
        ]
    }

    #[test]
    fn agent_keys_spell_an_open_key_with_null_never_an_omission() {
        let key = SecretKey::from_seed(&[4; 32]).public_key();
        let doc = AgentKeys {
            v: 1,
            origin: "tally.local/log".into(),
            agents: vec![AgentKeyList {
                agent: AgentName::new("a").unwrap(),
                keys: vec![AgentKey {
                    key_id: key.key_id(),
                    public_key: key,
                    not_before: UnixMillis::new(1_795_000_000_000),
                    not_after: None,
                }],
            }],
        };
        let text = String::from_utf8(canonical::canonicalize(&doc).unwrap()).unwrap();
        assert_eq!(AgentKeys::from_json(text.as_bytes()), Ok(doc));
        let omitted = text.replace(",\"not_after\":null", "");
        assert_ne!(omitted, text);
        assert!(AgentKeys::from_json(omitted.as_bytes()).is_err());
    }

    #[test]
    fn canonical_record_lines_take_the_fast_road_to_the_same_line() {
        for l in lines() {
            let bytes = l.to_json().unwrap();
            let PackLine::Record(expected) = &l else {
                unreachable!()
            };
            assert_eq!(fast_record_line(&bytes).as_ref(), Some(&**expected));
            assert_eq!(PackLine::from_json_strict(&bytes), Ok(l.clone()));
            assert_eq!(PackLine::from_json(&bytes), Ok(l));
        }
    }

    /// `text` with the first character after `after` that `pick` takes
    /// written as a JSON `\u00xx` escape (the same string, not canonical).
    fn escape_first(text: &str, after: &str, pick: impl Fn(char) -> bool) -> String {
        let from = text.find(after).unwrap() + after.len();
        let (i, c) = text[from..].char_indices().find(|(_, c)| pick(*c)).unwrap();
        let at = from + i;
        format!("{}\\u{:04x}{}", &text[..at], u32::from(c), &text[at + 1..])
    }

    #[test]
    fn other_lines_take_the_strict_road_with_its_answers() {
        let text = String::from_utf8(line(2, true, true).to_json().unwrap()).unwrap();
        let big_proof = {
            let hashes = vec![format!("\"{}\"", Hash::default().to_hex()); 2100].join(",");
            text.replace("\"inclusion\":[", &format!("\"inclusion\":[{hashes},"))
        };
        let cases: Vec<(String, Result<(), &str>)> = vec![
            (
                text.replace(
                    "\"index\":7,\"received\"",
                    "\"index\":9007199254740992,\"received\"",
                ),
                Err("integer_out_of_range"),
            ),
            (
                text.replace("\"tree_size\":900", "\"tree_size\":1e400"),
                Err("non_finite_number"),
            ),
            (
                text.replace(
                    "\"type\":\"record\"",
                    "\"type\":\"record\",\"type\":\"record\"",
                ),
                Err("duplicate_key"),
            ),
            (
                text.replace("\"receipt\":{", "\"receipt\":{\"index\":7,"),
                Err("duplicate_key"),
            ),
            (
                text.replace("\"type\":\"record\"", "\"type\":\"rec\\u006frd\""),
                Ok(()),
            ),
            (text.replace(",\"witnessed\":{", ",\"x\":{"), Err("schema")),
            // `null`, never omitted.
            (
                String::from_utf8(line(0, false, false).to_json().unwrap())
                    .unwrap()
                    .replace("\"receipt\":null,", ""),
                Err("schema"),
            ),
            (
                String::from_utf8(line(0, false, false).to_json().unwrap())
                    .unwrap()
                    .replace(",\"witnessed\":null", ""),
                Err("schema"),
            ),
            (text.replace("{\"receipt\":", "{ \"receipt\":"), Ok(())),
            (big_proof, Err("too_large")),
            // Hashes and times are read at their fixed width: the same
            // value spelled with an escape, or cut short, or in uppercase,
            // is the strict road's to judge.
            (
                escape_first(&text, "\"inclusion\":[\"", |c| c.is_ascii_hexdigit()),
                Ok(()),
            ),
            (
                escape_first(&text, "\"received\":\"", |c| c.is_ascii_digit()),
                Ok(()),
            ),
            (
                escape_first(&text, "\"record_hash\":\"", |c| c.is_ascii_hexdigit()),
                Ok(()),
            ),
            (
                {
                    let at = text.find("\"inclusion\":[\"").unwrap() + 14;
                    format!("{}{}", &text[..at], &text[at + 2..])
                },
                Err("schema"),
            ),
            (
                {
                    let from = text.find("\"inclusion\":[\"").unwrap() + 14;
                    let at = from
                        + text[from..from + 64]
                            .find(|c: char| c.is_ascii_lowercase())
                            .unwrap();
                    let upper = text[at..=at].to_ascii_uppercase();
                    format!("{}{upper}{}", &text[..at], &text[at + 1..])
                },
                Err("schema"),
            ),
        ];
        for (bytes, expect) in cases {
            assert_ne!(bytes, text);
            assert!(fast_record_line(bytes.as_bytes()).is_none(), "{bytes}");
            let got = PackLine::from_json(bytes.as_bytes());
            assert_eq!(got, PackLine::from_json_strict(bytes.as_bytes()));
            let code = got.as_ref().map(|_| ()).map_err(|e| match e {
                PackError::Canonical(c) => c.code(),
                PackError::Record(r) => r.code(),
                _ => "schema",
            });
            assert_eq!(code, expect, "{bytes}");
        }
    }

    #[test]
    fn whatever_the_fast_road_accepts_the_strict_road_reads_the_same() {
        let mut fast_hits = 0;
        for l in lines() {
            let base = l.to_json().unwrap();
            for m in crate::mutate::mutations(&base, 0x2545_f491_4f6c_dd1d, 2000, 16) {
                if let Some(fast) = fast_record_line(&m) {
                    fast_hits += 1;
                    assert_eq!(
                        PackLine::from_json_strict(&m),
                        Ok(PackLine::Record(Box::new(fast))),
                        "{}",
                        String::from_utf8_lossy(&m)
                    );
                }
            }
        }
        assert!(fast_hits > 0);
    }
}
