//! Records: what an agent signs, docs/protocol.md §3–§5.
//!
//! A [`Record`] that exists has passed every structural rule: strict JSON,
//! the v1 schema with no unknown fields, the per-kind body rules, the size
//! limit, and a round trip (its canonical form re-serialises to the bytes it
//! was parsed from). The signature is checked separately, against a key the
//! caller trusts ([`Record::verify_signature`]).

use std::fmt;
use std::ops::Deref;

use rand_core::CryptoRngCore;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::canonical::{self, CanonicalError, Limits};
use crate::hash::Hash;
use crate::keys::{BadSignature, KeyId, PublicKey, SecretKey, Signature};
use crate::limits::{
    MAX_AGENT_NAME_BYTES, MAX_COUNTER, MAX_NAME_BYTES, MAX_NONCE_BYTES, MAX_NOTE_TEXT_BYTES,
    MAX_RECORD_BYTES, MAX_TOOLS_PER_RECORD, MAX_TOOL_LIST_PARTS, MIN_NONCE_BYTES,
};
use crate::time::UnixMillis;

/// The record format version this crate reads and writes.
pub const RECORD_VERSION: u64 = 1;

/// Domain separation prefix of the record signature: the agent signs
/// `"tally/record/v1\n" ‖ JCS(record without "sig")`.
pub const RECORD_SIGNATURE_DOMAIN: &[u8] = b"tally/record/v1\n";

/// Why a record was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Not strict JSON, or too large or deep to decode.
    #[error(transparent)]
    Canonical(#[from] CanonicalError),
    /// A format version this build does not read.
    #[error("record format version {found} is not supported (this build reads version {RECORD_VERSION})")]
    UnsupportedVersion {
        /// The `v` field as written.
        found: String,
    },
    /// Missing or unknown fields, or fields of the wrong type or spelling.
    #[error("record does not match the v1 schema: {message}")]
    Schema {
        /// What serde or the round trip said.
        message: String,
    },
    /// A field breaks a rule of its kind.
    #[error("record field {field}: {reason}")]
    Invalid {
        /// The field's path, e.g. `body.tools`.
        field: &'static str,
        /// The rule broken.
        reason: String,
    },
    /// The canonical form is larger than [`MAX_RECORD_BYTES`].
    #[error("record is {size} bytes in canonical form, more than the limit of {max}")]
    TooLarge {
        /// Canonical size.
        size: usize,
        /// The limit.
        max: usize,
    },
}

impl RecordError {
    /// A stable, snake_case code for this error, used in API error bodies
    /// and golden vectors.
    #[must_use]
    pub const fn code(&self) -> &'static str {
        match self {
            Self::Canonical(e) => e.code(),
            Self::UnsupportedVersion { .. } => "unsupported_version",
            Self::Schema { .. } => "schema",
            Self::Invalid { .. } => "invalid_field",
            Self::TooLarge { .. } => "too_large",
        }
    }
}

/// Why a record's signature was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordSignatureError {
    /// The record names another key than the one it was checked against.
    #[error("record names key {record_key_id}, not {given_key_id}")]
    KeyIdMismatch {
        /// Key id in the record.
        record_key_id: KeyId,
        /// Key id of the key given.
        given_key_id: KeyId,
    },
    /// The signature does not verify.
    #[error(transparent)]
    BadSignature(#[from] BadSignature),
}

/// Checks a free-text field: 1..=max bytes, no control characters (newline
/// and tab allowed where `allow_newlines`).
fn check_text(
    field: &'static str,
    text: &str,
    max: usize,
    allow_newlines: bool,
) -> Result<(), RecordError> {
    let invalid = |reason: String| RecordError::Invalid { field, reason };
    if text.is_empty() || text.len() > max {
        return Err(invalid(format!(
            "must be 1 to {max} bytes, is {}",
            text.len()
        )));
    }
    if let Some(c) = text
        .chars()
        .find(|c| c.is_control() && !(allow_newlines && matches!(c, '\n' | '\t')))
    {
        return Err(invalid(format!(
            "contains control character U+{:04X}",
            u32::from(c)
        )));
    }
    Ok(())
}

/// An agent's name: its chain's name, unique in a project. 1 to 64 bytes of
/// `A-Z a-z 0-9 . _ -`, starting with a letter or digit, so it is safe in
/// URLs, file names and log lines.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AgentName(String);

impl AgentName {
    /// Parses a name.
    ///
    /// # Errors
    /// [`RecordError::Invalid`] naming the rule broken.
    pub fn new(name: &str) -> Result<Self, RecordError> {
        let ok_len = !name.is_empty() && name.len() <= MAX_AGENT_NAME_BYTES;
        let ok_chars = name
            .bytes()
            .enumerate()
            .all(|(i, b)| b.is_ascii_alphanumeric() || (i > 0 && matches!(b, b'.' | b'_' | b'-')));
        if ok_len && ok_chars {
            Ok(Self(name.to_owned()))
        } else {
            Err(RecordError::Invalid {
                field: "agent",
                reason: format!(
                    "{name:?} is not 1 to {MAX_AGENT_NAME_BYTES} bytes of A-Z a-z 0-9 . _ - starting with a letter or digit"
                ),
            })
        }
    }

    /// The name.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AgentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for AgentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AgentName({})", self.0)
    }
}

impl Serialize for AgentName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for AgentName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::new(&text).map_err(serde::de::Error::custom)
    }
}

/// A record's 0-based position in its agent's chain.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
#[serde(transparent)]
pub struct Seq(u64);

impl Seq {
    /// The first record of a chain.
    pub const GENESIS: Self = Self(0);

    /// Wraps a sequence number.
    ///
    /// # Errors
    /// [`RecordError::Invalid`] above 2^53 − 1.
    pub fn new(n: u64) -> Result<Self, RecordError> {
        if n > MAX_COUNTER {
            return Err(RecordError::Invalid {
                field: "seq",
                reason: format!("{n} is above 2^53-1"),
            });
        }
        Ok(Self(n))
    }

    /// The number.
    #[must_use]
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The next sequence number, or `None` at the limit.
    #[must_use]
    pub fn next(self) -> Option<Self> {
        Self::new(self.0 + 1).ok()
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Debug for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Seq({})", self.0)
    }
}

impl<'de> Deserialize<'de> for Seq {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::new(u64::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// A record's nonce: 16 to 64 random bytes, fresh per record. On the wire:
/// lowercase hex.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nonce(Vec<u8>);

impl Nonce {
    /// 16 fresh random bytes.
    pub fn random<R: CryptoRngCore + ?Sized>(rng: &mut R) -> Self {
        let mut b = vec![0u8; MIN_NONCE_BYTES];
        rng.fill_bytes(&mut b);
        Self(b)
    }

    /// Wraps bytes.
    ///
    /// # Errors
    /// [`RecordError::Invalid`] outside 16..=64 bytes.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, RecordError> {
        if (MIN_NONCE_BYTES..=MAX_NONCE_BYTES).contains(&bytes.len()) {
            Ok(Self(bytes))
        } else {
            Err(RecordError::Invalid {
                field: "nonce",
                reason: format!(
                    "must be {MIN_NONCE_BYTES} to {MAX_NONCE_BYTES} bytes, is {}",
                    bytes.len()
                ),
            })
        }
    }

    /// Parses lowercase hex.
    ///
    /// # Errors
    /// [`RecordError::Invalid`] for other text or lengths.
    pub fn from_hex(text: &str) -> Result<Self, RecordError> {
        if !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(RecordError::Invalid {
                field: "nonce",
                reason: "must be lowercase hex".into(),
            });
        }
        let bytes = hex::decode(text).map_err(|_| RecordError::Invalid {
            field: "nonce",
            reason: "must be lowercase hex of whole bytes".into(),
        })?;
        Self::from_bytes(bytes)
    }

    /// The bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Lowercase hex.
    #[must_use]
    pub fn to_hex(&self) -> String {
        hex::encode(&self.0)
    }
}

impl fmt::Debug for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Nonce({})", self.to_hex())
    }
}

impl fmt::Display for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl Serialize for Nonce {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for Nonce {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::from_hex(&text).map_err(serde::de::Error::custom)
    }
}

/// The kind of a record; it selects the body's schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    /// The agent decided to call a tool.
    Decision,
    /// What came back from a call.
    Outcome,
    /// The tools the agent has.
    Tools,
    /// Free text.
    Note,
    /// The agent moves to a new key; signed by the old one.
    KeyRotation,
}

impl RecordKind {
    /// The wire name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Decision => "decision",
            Self::Outcome => "outcome",
            Self::Tools => "tools",
            Self::Note => "note",
            Self::KeyRotation => "key_rotation",
        }
    }
}

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeStatus {
    /// A result without `isError`.
    Ok,
    /// A JSON-RPC error, or a result with `isError: true`.
    Error,
    /// The client cancelled the call.
    Cancelled,
    /// The server exited while the call was in flight.
    ServerExited,
    /// The client went away (closed its input or died) while the call was
    /// in flight, and the call ended without an answer.
    ClientGone,
    /// No answer within the configured time.
    Timeout,
    /// The call was not forwarded (its decision could not be recorded, or a
    /// strict receipt check failed).
    NotRun,
}

impl OutcomeStatus {
    /// The wire name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Error => "error",
            Self::Cancelled => "cancelled",
            Self::ServerExited => "server_exited",
            Self::ClientGone => "client_gone",
            Self::Timeout => "timeout",
            Self::NotRun => "not_run",
        }
    }
}

/// Body of a `decision` record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    /// The agent's id for this call (for MCP, the JSON-RPC request id as text).
    pub call_id: String,
    /// The tool's name.
    pub tool: String,
    /// Salted hash of the canonical call arguments (docs/protocol.md §6).
    pub input_hash: Hash,
}

/// Body of an `outcome` record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outcome {
    /// The call id of the decision.
    pub call_id: String,
    /// The record hash of the decision.
    pub decision: Hash,
    /// How the call ended.
    pub status: OutcomeStatus,
    /// Salted hash of the canonical result or error, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_hash: Option<Hash>,
}

/// Digests of the parts of one MCP tool definition, each
/// `SHA-256(JCS(member value))`; absent members are omitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolPartDigests {
    /// `title`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<Hash>,
    /// `description`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<Hash>,
    /// `inputSchema`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Hash>,
    /// `outputSchema`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Hash>,
    /// `annotations`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Hash>,
    /// `_meta`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Hash>,
}

impl ToolPartDigests {
    /// The wire names of the parts whose digests differ (present vs absent
    /// counts as different), in a fixed order.
    #[must_use]
    pub fn changed_parts(&self, other: &Self) -> Vec<&'static str> {
        let pairs = [
            ("title", self.title, other.title),
            ("description", self.description, other.description),
            ("input_schema", self.input_schema, other.input_schema),
            ("output_schema", self.output_schema, other.output_schema),
            ("annotations", self.annotations, other.annotations),
            ("meta", self.meta, other.meta),
        ];
        pairs
            .into_iter()
            .filter(|(_, a, b)| a != b)
            .map(|(n, _, _)| n)
            .collect()
    }
}

/// One tool in a `tools` record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolEntry {
    /// The tool's name.
    pub name: String,
    /// Whether calls to this tool are recorded.
    pub recorded: bool,
    /// `SHA-256(JCS(definition))` of the whole definition object.
    pub digest: Hash,
    /// Per-part digests, so that a change is named.
    pub parts: ToolPartDigests,
}

/// Body of a `tools` record: one part of a tool list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolList {
    /// Id shared by all parts of one list.
    pub list_id: String,
    /// 0-based part number.
    pub part: u32,
    /// Number of parts in the list.
    pub parts: u32,
    /// The tools in this part, by name, without repeats.
    pub tools: Vec<ToolEntry>,
}

/// Body of a `note` record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoteBody {
    /// The text.
    pub text: String,
}

/// Body of a `key_rotation` record, signed by the key being retired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyRotation {
    /// Key id of the new key.
    pub new_key_id: KeyId,
    /// The new public key.
    pub new_public_key: PublicKey,
}

/// A record's body, by kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Body {
    /// `decision`.
    Decision(Decision),
    /// `outcome`.
    Outcome(Outcome),
    /// `tools`.
    Tools(ToolList),
    /// `note`.
    Note(NoteBody),
    /// `key_rotation`.
    KeyRotation(KeyRotation),
}

impl Body {
    /// The kind this body belongs to.
    #[must_use]
    pub const fn kind(&self) -> RecordKind {
        match self {
            Self::Decision(_) => RecordKind::Decision,
            Self::Outcome(_) => RecordKind::Outcome,
            Self::Tools(_) => RecordKind::Tools,
            Self::Note(_) => RecordKind::Note,
            Self::KeyRotation(_) => RecordKind::KeyRotation,
        }
    }

    fn from_value(kind: RecordKind, value: Value) -> Result<Self, serde_json::Error> {
        Ok(match kind {
            RecordKind::Decision => Self::Decision(serde_json::from_value(value)?),
            RecordKind::Outcome => Self::Outcome(serde_json::from_value(value)?),
            RecordKind::Tools => Self::Tools(serde_json::from_value(value)?),
            RecordKind::Note => Self::Note(serde_json::from_value(value)?),
            RecordKind::KeyRotation => Self::KeyRotation(serde_json::from_value(value)?),
        })
    }

    fn validate(&self) -> Result<(), RecordError> {
        match self {
            Self::Decision(d) => {
                check_text("body.call_id", &d.call_id, MAX_NAME_BYTES, false)?;
                check_text("body.tool", &d.tool, MAX_NAME_BYTES, false)
            }
            Self::Outcome(o) => check_text("body.call_id", &o.call_id, MAX_NAME_BYTES, false),
            Self::Tools(t) => {
                check_text("body.list_id", &t.list_id, MAX_NAME_BYTES, false)?;
                if t.parts == 0 || t.parts > MAX_TOOL_LIST_PARTS || t.part >= t.parts {
                    return Err(RecordError::Invalid {
                        field: "body.part",
                        reason: format!(
                            "part {} of {} is not a part number below parts, with parts 1 to {MAX_TOOL_LIST_PARTS}",
                            t.part, t.parts
                        ),
                    });
                }
                if t.tools.len() > MAX_TOOLS_PER_RECORD {
                    return Err(RecordError::Invalid {
                        field: "body.tools",
                        reason: format!(
                            "{} tools, more than {MAX_TOOLS_PER_RECORD} per record",
                            t.tools.len()
                        ),
                    });
                }
                let mut names = std::collections::BTreeSet::new();
                for tool in &t.tools {
                    check_text("body.tools.name", &tool.name, MAX_NAME_BYTES, false)?;
                    if !names.insert(tool.name.as_str()) {
                        return Err(RecordError::Invalid {
                            field: "body.tools.name",
                            reason: format!("tool {:?} is listed twice", tool.name),
                        });
                    }
                }
                Ok(())
            }
            Self::Note(n) => check_text("body.text", &n.text, MAX_NOTE_TEXT_BYTES, true),
            Self::KeyRotation(k) => {
                if k.new_public_key.key_id() == k.new_key_id {
                    Ok(())
                } else {
                    Err(RecordError::Invalid {
                        field: "body.new_key_id",
                        reason: "is not the key id of new_public_key".into(),
                    })
                }
            }
        }
    }
}

/// Everything in a record except its signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsignedRecord {
    /// The agent (chain) name.
    pub agent: AgentName,
    /// Id of the key that signs the record.
    pub key_id: KeyId,
    /// Position in the agent's chain.
    pub seq: Seq,
    /// Record hash of the previous record in the chain; `None` only at seq 0.
    pub prev: Option<Hash>,
    /// The agent's clock when it made the record.
    pub time: UnixMillis,
    /// Fresh random bytes.
    pub nonce: Nonce,
    /// The kind-specific body.
    pub body: Body,
}

#[derive(Serialize)]
struct WireOut<'a> {
    v: u64,
    kind: RecordKind,
    agent: &'a AgentName,
    key_id: &'a KeyId,
    seq: Seq,
    prev: &'a Option<Hash>,
    time: UnixMillis,
    nonce: &'a Nonce,
    body: &'a Body,
    #[serde(skip_serializing_if = "Option::is_none")]
    sig: Option<&'a Signature>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireIn {
    #[allow(dead_code)] // checked before this struct is decoded
    v: u64,
    kind: RecordKind,
    agent: AgentName,
    key_id: KeyId,
    seq: Seq,
    prev: Option<Hash>,
    time: UnixMillis,
    nonce: Nonce,
    body: Value,
    sig: Signature,
}

impl UnsignedRecord {
    fn wire<'a>(&'a self, sig: Option<&'a Signature>) -> WireOut<'a> {
        WireOut {
            v: RECORD_VERSION,
            kind: self.body.kind(),
            agent: &self.agent,
            key_id: &self.key_id,
            seq: self.seq,
            prev: &self.prev,
            time: self.time,
            nonce: &self.nonce,
            body: &self.body,
            sig,
        }
    }

    /// `JCS(record without "sig")`, the bytes after the signature domain.
    ///
    /// # Errors
    /// Only if a field holds a number JCS refuses, which the types prevent.
    pub fn signing_bytes(&self) -> Result<Vec<u8>, RecordError> {
        Ok(canonical::canonicalize(&self.wire(None))?)
    }

    fn validate(&self) -> Result<(), RecordError> {
        match (self.seq == Seq::GENESIS, self.prev.is_some()) {
            (true, true) => Err(RecordError::Invalid {
                field: "prev",
                reason: "must be null at seq 0".into(),
            }),
            (false, false) => Err(RecordError::Invalid {
                field: "prev",
                reason: format!("must name the previous record's hash at seq {}", self.seq),
            }),
            _ => self.body.validate(),
        }
    }

    /// Signs the record with `key`, setting `key_id` to that key's id.
    ///
    /// # Errors
    /// [`RecordError`] when the record breaks a structural rule or is too large.
    pub fn sign(mut self, key: &SecretKey) -> Result<Record, RecordError> {
        self.key_id = key.public_key().key_id();
        self.validate()?;
        let sig = key.sign(RECORD_SIGNATURE_DOMAIN, &self.signing_bytes()?);
        Record::assemble(self, sig)
    }
}

/// A structurally valid, signed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    unsigned: UnsignedRecord,
    sig: Signature,
    canonical: Vec<u8>,
    hash: Hash,
}

impl Deref for Record {
    type Target = UnsignedRecord;
    fn deref(&self) -> &UnsignedRecord {
        &self.unsigned
    }
}

impl Record {
    fn assemble(unsigned: UnsignedRecord, sig: Signature) -> Result<Self, RecordError> {
        let canonical = canonical::canonicalize(&unsigned.wire(Some(&sig)))?;
        if canonical.len() > MAX_RECORD_BYTES {
            return Err(RecordError::TooLarge {
                size: canonical.len(),
                max: MAX_RECORD_BYTES,
            });
        }
        let hash = Hash::sha256(&canonical);
        Ok(Self {
            unsigned,
            sig,
            canonical,
            hash,
        })
    }

    /// Parses a record from JSON bytes (any whitespace; strict JSON rules).
    ///
    /// # Errors
    /// [`RecordError`] naming the first rule broken.
    pub fn from_json(bytes: &[u8]) -> Result<Self, RecordError> {
        Self::from_value(canonical::parse_strict(bytes, Limits::WIRE)?)
    }

    /// Parses a record from a JSON value that was itself parsed strictly
    /// (see [`canonical::parse_strict`]).
    ///
    /// # Errors
    /// [`RecordError`] naming the first rule broken.
    pub fn from_value(value: Value) -> Result<Self, RecordError> {
        check_version(&value, RECORD_VERSION, |found| {
            RecordError::UnsupportedVersion { found }
        })
        .map_err(|e| e.unwrap_or_else(|message| RecordError::Schema { message }))?;
        let as_given = canonical::canonicalize(&value)?;
        let wire: WireIn = serde_json::from_value(value).map_err(|e| RecordError::Schema {
            message: e.to_string(),
        })?;
        let body = Body::from_value(wire.kind, wire.body).map_err(|e| RecordError::Schema {
            message: format!("body of a {} record: {e}", wire.kind.as_str()),
        })?;
        let unsigned = UnsignedRecord {
            agent: wire.agent,
            key_id: wire.key_id,
            seq: wire.seq,
            prev: wire.prev,
            time: wire.time,
            nonce: wire.nonce,
            body,
        };
        unsigned.validate()?;
        let record = Self::assemble(unsigned, wire.sig)?;
        if record.canonical != as_given {
            // Only a field tally never writes can cause this: an omitted
            // `prev`, say. Refusing keeps "the bytes signed" and "the fields
            // read" the same thing.
            return Err(RecordError::Schema {
                message: "record is not in v1 form (an omitted null field, or a value written in a form tally does not produce)"
                    .into(),
            });
        }
        Ok(record)
    }

    /// The record's RFC 8785 canonical bytes, signature included.
    #[must_use]
    pub fn canonical_bytes(&self) -> &[u8] {
        &self.canonical
    }

    /// The record hash: `SHA-256(JCS(record))`, signature included.
    #[must_use]
    pub fn hash(&self) -> Hash {
        self.hash
    }

    /// The signature.
    #[must_use]
    pub fn signature(&self) -> &Signature {
        &self.sig
    }

    /// The kind.
    #[must_use]
    pub fn kind(&self) -> RecordKind {
        self.unsigned.body.kind()
    }

    /// The fields without the signature.
    #[must_use]
    pub fn unsigned(&self) -> &UnsignedRecord {
        &self.unsigned
    }

    /// Checks the signature with `key`, which the caller trusts for this
    /// agent at this record's time.
    ///
    /// # Errors
    /// [`RecordSignatureError`] when the key id differs or the signature does
    /// not verify strictly.
    pub fn verify_signature(&self, key: &PublicKey) -> Result<(), RecordSignatureError> {
        let given = key.key_id();
        if given != self.unsigned.key_id {
            return Err(RecordSignatureError::KeyIdMismatch {
                record_key_id: self.unsigned.key_id,
                given_key_id: given,
            });
        }
        let signing = self
            .unsigned
            .signing_bytes()
            .map_err(|_| RecordSignatureError::BadSignature(BadSignature))?;
        key.verify(RECORD_SIGNATURE_DOMAIN, &signing, &self.sig)?;
        Ok(())
    }
}

impl Serialize for Record {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.unsigned.wire(Some(&self.sig)).serialize(s)
    }
}

/// Checks an object's `v` field. `Err(Ok(e))` is a version this build does
/// not read; `Err(Err(message))` is a missing or malformed field.
pub(crate) fn check_version<E>(
    value: &Value,
    supported: u64,
    unsupported: impl FnOnce(String) -> E,
) -> Result<(), Result<E, String>> {
    let Some(obj) = value.as_object() else {
        return Err(Err("expected a JSON object".into()));
    };
    match obj.get("v") {
        None => Err(Err("missing field `v` (the format version)".into())),
        Some(v) if v.as_u64() == Some(supported) => Ok(()),
        Some(v) if v.as_u64().is_some() => Err(Ok(unsupported(v.to_string()))),
        Some(v) => Err(Err(format!(
            "field `v` must be a positive integer, got {v}"
        ))),
    }
}
