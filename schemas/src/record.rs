//! Records: what an agent signs, docs/protocol.md §3–§5.
//!
//! A [`Record`] that exists has passed every structural rule: strict JSON,
//! the v1 schema with no unknown fields, the per-kind body rules, the size
//! limit, and a round trip (its canonical form re-serialises to the bytes it
//! was parsed from). The signature is checked separately, against a key the
//! caller trusts ([`Record::verify_signature`]).
//!
//! A record's canonical bytes are written by [`write_canonical`], a JCS
//! writer for this one fixed shape (members in RFC 8785 order, strings
//! escaped as RFC 8785 §3.2.2.2 says); a test holds it byte-equal to the
//! general canonicaliser. Parsing has two roads with one answer: input that
//! is already canonical is read straight into the typed fields and accepted
//! only if writing those fields back gives the input byte for byte; anything
//! else (other spacing or member order, an error of any kind) goes the
//! strict road through [`canonical::parse_strict`], which gives the errors.

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
    /// Over MCP's Streamable HTTP transport, the exchange that carried the
    /// call failed without a JSON-RPC answer to it: an HTTP error status or
    /// an answer that is not MCP, or the upstream could not be reached.
    HttpError,
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
            Self::HttpError => "http_error",
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
    /// [`RecordError::Invalid`] for a time outside the wire range.
    pub fn signing_bytes(&self) -> Result<Vec<u8>, RecordError> {
        let mut out = Vec::with_capacity(512);
        write_canonical(self, None, &mut out)?;
        Ok(out)
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

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Appends `text` as a JSON string in RFC 8785 form (§3.2.2.2): `"` and `\`
/// escaped, U+0008, U+0009, U+000A, U+000C and U+000D as `\b \t \n \f \r`,
/// the other controls below U+0020 as `\u00xx` in lowercase hex, and every
/// other character as itself.
pub(crate) fn put_str(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x09 => b"\\t",
            0x0a => b"\\n",
            0x0c => b"\\f",
            0x0d => b"\\r",
            0x00..=0x1f => &[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX_DIGITS[usize::from(b >> 4)],
                HEX_DIGITS[usize::from(b & 0x0f)],
            ],
            _ => continue,
        };
        out.extend_from_slice(&bytes[run..i]);
        out.extend_from_slice(short);
        run = i + 1;
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

/// Appends `bytes` as a JSON string of lowercase hex.
pub(crate) fn put_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    let start = out.len();
    out.resize(start + 2 * bytes.len() + 2, b'"');
    let digits = &mut out[start + 1..start + 1 + 2 * bytes.len()];
    for (pair, &b) in digits.chunks_exact_mut(2).zip(bytes) {
        pair[0] = HEX_DIGITS[usize::from(b >> 4)];
        pair[1] = HEX_DIGITS[usize::from(b & 0x0f)];
    }
}

/// Appends a counter as a JSON integer; `None` above 2^53 − 1, which tally's
/// JSON refuses (§2), so nothing beyond it is ever written.
pub(crate) fn put_counter(out: &mut Vec<u8>, n: u64) -> Option<()> {
    if n > MAX_COUNTER {
        return None;
    }
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n;
    loop {
        at -= 1;
        // `rest % 10` is below 10, so the cast keeps it.
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
    Some(())
}

/// Appends a time in its one wire spelling (it needs no escaping); `None`
/// for a time outside the wire range.
pub(crate) fn put_time(out: &mut Vec<u8>, time: UnixMillis) -> Option<()> {
    out.push(b'"');
    out.extend_from_slice(time.to_rfc3339().ok()?.as_bytes());
    out.push(b'"');
    Some(())
}

/// Appends a key or signature (at most 64 bytes) as canonical standard
/// base64 with padding.
fn put_base64(out: &mut Vec<u8>, bytes: &[u8]) {
    use base64::Engine as _;
    let mut text = [0u8; 88];
    out.push(b'"');
    match base64::engine::general_purpose::STANDARD.encode_slice(bytes, &mut text) {
        Ok(n) => out.extend_from_slice(&text[..n]),
        // Longer input than any key or signature: the allocating encoder.
        Err(_) => out.extend_from_slice(
            base64::engine::general_purpose::STANDARD
                .encode(bytes)
                .as_bytes(),
        ),
    }
    out.push(b'"');
}

fn put_u32(out: &mut Vec<u8>, n: u32) {
    // A u32 is always below 2^53.
    let _ = put_counter(out, u64::from(n));
}

fn write_tool(out: &mut Vec<u8>, tool: &ToolEntry) {
    out.extend_from_slice(b"{\"digest\":");
    put_hex(out, tool.digest.as_bytes());
    out.extend_from_slice(b",\"name\":");
    put_str(out, &tool.name);
    out.extend_from_slice(b",\"parts\":{");
    let p = &tool.parts;
    let parts = [
        ("annotations", p.annotations),
        ("description", p.description),
        ("input_schema", p.input_schema),
        ("meta", p.meta),
        ("output_schema", p.output_schema),
        ("title", p.title),
    ];
    let mut first = true;
    for (name, digest) in parts {
        if let Some(d) = digest {
            if !first {
                out.push(b',');
            }
            first = false;
            put_str(out, name);
            out.push(b':');
            put_hex(out, d.as_bytes());
        }
    }
    out.extend_from_slice(b"},\"recorded\":");
    out.extend_from_slice(if tool.recorded { b"true" } else { b"false" });
    out.push(b'}');
}

fn write_body(out: &mut Vec<u8>, body: &Body) {
    match body {
        Body::Decision(d) => {
            out.extend_from_slice(b"{\"call_id\":");
            put_str(out, &d.call_id);
            out.extend_from_slice(b",\"input_hash\":");
            put_hex(out, d.input_hash.as_bytes());
            out.extend_from_slice(b",\"tool\":");
            put_str(out, &d.tool);
        }
        Body::Outcome(o) => {
            out.extend_from_slice(b"{\"call_id\":");
            put_str(out, &o.call_id);
            out.extend_from_slice(b",\"decision\":");
            put_hex(out, o.decision.as_bytes());
            if let Some(h) = &o.output_hash {
                out.extend_from_slice(b",\"output_hash\":");
                put_hex(out, h.as_bytes());
            }
            out.extend_from_slice(b",\"status\":");
            put_str(out, o.status.as_str());
        }
        Body::Tools(t) => {
            out.extend_from_slice(b"{\"list_id\":");
            put_str(out, &t.list_id);
            out.extend_from_slice(b",\"part\":");
            put_u32(out, t.part);
            out.extend_from_slice(b",\"parts\":");
            put_u32(out, t.parts);
            out.extend_from_slice(b",\"tools\":[");
            for (i, tool) in t.tools.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_tool(out, tool);
            }
            out.push(b']');
        }
        Body::Note(n) => {
            out.extend_from_slice(b"{\"text\":");
            put_str(out, &n.text);
        }
        Body::KeyRotation(k) => {
            out.extend_from_slice(b"{\"new_key_id\":");
            put_str(out, &k.new_key_id.to_hex());
            out.extend_from_slice(b",\"new_public_key\":");
            put_base64(out, &k.new_public_key.to_bytes());
        }
    }
    out.push(b'}');
}

/// Appends `JCS(record)`, or `JCS(record without "sig")` when `sig` is
/// `None`: the members in RFC 8785 order (all names are ASCII, so UTF-16
/// order is byte order), the numbers all counters below 2^53.
///
/// # Errors
/// [`RecordError::Invalid`] for a time outside the wire range (only a record
/// built in code, not parsed, can hold one).
fn write_canonical(
    u: &UnsignedRecord,
    sig: Option<&Signature>,
    out: &mut Vec<u8>,
) -> Result<(), RecordError> {
    out.extend_from_slice(b"{\"agent\":");
    put_str(out, u.agent.as_str());
    out.extend_from_slice(b",\"body\":");
    write_body(out, &u.body);
    out.extend_from_slice(b",\"key_id\":");
    put_str(out, &u.key_id.to_hex());
    out.extend_from_slice(b",\"kind\":");
    put_str(out, u.body.kind().as_str());
    out.extend_from_slice(b",\"nonce\":");
    put_hex(out, u.nonce.as_bytes());
    out.extend_from_slice(b",\"prev\":");
    match &u.prev {
        Some(h) => put_hex(out, h.as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"seq\":");
    // A `Seq` is at most 2^53 − 1 by construction.
    let _ = put_counter(out, u.seq.get());
    if let Some(sig) = sig {
        out.extend_from_slice(b",\"sig\":");
        put_base64(out, sig.as_bytes());
    }
    out.extend_from_slice(b",\"time\":");
    put_time(out, u.time).ok_or_else(|| RecordError::Invalid {
        field: "time",
        reason: format!("{} is outside the years 1970-9999", u.time),
    })?;
    out.extend_from_slice(b",\"v\":1}");
    Ok(())
}

/// A reader for the fast road: it walks bytes expected to be in the one
/// canonical layout and gives up (`None`) at anything else (white space,
/// members out of place, an escape JCS would not write, a number that is
/// not a plain counter). Giving up costs only the strict road; whatever it
/// reads is accepted only after the caller writes it back canonically and
/// compares, so the reader need not be exact, only never wrong about what
/// it did read.
pub(crate) struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `bytes`, which must be UTF-8.
    pub(crate) fn new(bytes: &'a [u8]) -> Option<Self> {
        Some(Self {
            text: std::str::from_utf8(bytes).ok()?,
            at: 0,
        })
    }

    pub(crate) fn at_end(&self) -> bool {
        self.at == self.text.len()
    }

    /// Consumes `lit` if the input goes on with it.
    pub(crate) fn eat(&mut self, lit: &[u8]) -> bool {
        let found = self.text.as_bytes()[self.at..].starts_with(lit);
        if found {
            self.at += lit.len();
        }
        found
    }

    /// Consumes `lit`, or gives up.
    pub(crate) fn expect(&mut self, lit: &[u8]) -> Option<()> {
        self.eat(lit).then_some(())
    }

    /// A string, with the escapes JCS writes (`\" \\ \b \f \n \r \t` and
    /// `\u00xx` for other controls) decoded; borrowed when it has none.
    pub(crate) fn string(&mut self) -> Option<std::borrow::Cow<'a, str>> {
        let b = self.text.as_bytes();
        if b.get(self.at) != Some(&b'"') {
            return None;
        }
        let start = self.at + 1;
        let len = b[start..]
            .iter()
            .position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
        if b[start + len] == b'"' {
            self.at = start + len + 1;
            return Some(std::borrow::Cow::Borrowed(&self.text[start..start + len]));
        }
        let mut out = String::from(&self.text[start..start + len]);
        let mut i = start + len;
        loop {
            let c = *b.get(i)?;
            match c {
                b'"' => break,
                b'\\' => {
                    let decoded = match *b.get(i + 1)? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hex = self.text.get(i + 2..i + 6)?;
                            let v = u8::from_str_radix(hex.strip_prefix("00")?, 16).ok()?;
                            i += 4;
                            (v < 0x20).then_some(char::from(v))?
                        }
                        _ => return None,
                    };
                    out.push(decoded);
                    i += 2;
                }
                0x00..=0x1f => return None,
                _ => {
                    let run = b[i..]
                        .iter()
                        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
                    out.push_str(&self.text[i..i + run]);
                    i += run;
                }
            }
        }
        self.at = i + 1;
        Some(std::borrow::Cow::Owned(out))
    }

    /// A counter: digits only, at most 2^53 − 1.
    pub(crate) fn counter(&mut self) -> Option<u64> {
        let digits = self.text.as_bytes()[self.at..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if digits == 0 || digits > 16 {
            return None;
        }
        let n = self.text[self.at..self.at + digits].parse::<u64>().ok()?;
        self.at += digits;
        (n <= MAX_COUNTER).then_some(n)
    }

    pub(crate) fn hash(&mut self) -> Option<Hash> {
        Hash::from_hex(&self.string()?).ok()
    }

    pub(crate) fn nonce(&mut self) -> Option<Nonce> {
        Nonce::from_hex(&self.string()?).ok()
    }

    pub(crate) fn time(&mut self) -> Option<UnixMillis> {
        UnixMillis::parse_rfc3339(&self.string()?).ok()
    }

    /// A string naming a variant of a unit enum (its serde name).
    fn variant<T: serde::de::DeserializeOwned>(&mut self) -> Option<T> {
        use serde::de::IntoDeserializer as _;
        let name = self.string()?;
        let d: serde::de::value::StrDeserializer<'_, serde::de::value::Error> =
            name.as_ref().into_deserializer();
        T::deserialize(d).ok()
    }
}

/// A record's fields as the fast road reads them ([`Record::from_json`]).
/// The body's members are all optional because in canonical order `body`
/// comes before `kind`; the kind picks the members afterwards, and a member
/// of another kind makes the bytes differ from the canonical ones.
pub(crate) struct FastRecord {
    agent: AgentName,
    body: FastBody,
    key_id: KeyId,
    kind: RecordKind,
    nonce: Nonce,
    prev: Option<Hash>,
    seq: Seq,
    sig: Signature,
    time: UnixMillis,
}

#[derive(Default)]
struct FastBody {
    call_id: Option<String>,
    input_hash: Option<Hash>,
    tool: Option<String>,
    decision: Option<Hash>,
    status: Option<OutcomeStatus>,
    output_hash: Option<Hash>,
    list_id: Option<String>,
    part: Option<u32>,
    parts: Option<u32>,
    tools: Option<Vec<ToolEntry>>,
    text: Option<String>,
    new_key_id: Option<KeyId>,
    new_public_key: Option<PublicKey>,
}

impl FastBody {
    fn read(c: &mut Cursor<'_>) -> Option<Self> {
        let mut b = Self::default();
        c.expect(b"{")?;
        if c.eat(b"}") {
            return Some(b);
        }
        loop {
            let key = c.string()?;
            c.expect(b":")?;
            match key.as_ref() {
                "call_id" => b.call_id = Some(c.string()?.into_owned()),
                "input_hash" => b.input_hash = Some(c.hash()?),
                "tool" => b.tool = Some(c.string()?.into_owned()),
                "decision" => b.decision = Some(c.hash()?),
                "status" => b.status = Some(c.variant()?),
                "output_hash" => b.output_hash = Some(c.hash()?),
                "list_id" => b.list_id = Some(c.string()?.into_owned()),
                "part" => b.part = Some(u32::try_from(c.counter()?).ok()?),
                "parts" => b.parts = Some(u32::try_from(c.counter()?).ok()?),
                "tools" => b.tools = Some(read_tools(c)?),
                "text" => b.text = Some(c.string()?.into_owned()),
                "new_key_id" => b.new_key_id = Some(KeyId::from_hex(&c.string()?).ok()?),
                "new_public_key" => {
                    b.new_public_key = Some(PublicKey::from_base64(&c.string()?).ok()?);
                }
                _ => return None,
            }
            if c.eat(b"}") {
                return Some(b);
            }
            c.expect(b",")?;
        }
    }
}

fn read_tools(c: &mut Cursor<'_>) -> Option<Vec<ToolEntry>> {
    let mut tools = Vec::new();
    c.expect(b"[")?;
    if c.eat(b"]") {
        return Some(tools);
    }
    loop {
        c.expect(b"{\"digest\":")?;
        let digest = c.hash()?;
        c.expect(b",\"name\":")?;
        let name = c.string()?.into_owned();
        c.expect(b",\"parts\":{")?;
        let mut parts = ToolPartDigests::default();
        if !c.eat(b"}") {
            loop {
                let key = c.string()?;
                c.expect(b":")?;
                let h = Some(c.hash()?);
                match key.as_ref() {
                    "annotations" => parts.annotations = h,
                    "description" => parts.description = h,
                    "input_schema" => parts.input_schema = h,
                    "meta" => parts.meta = h,
                    "output_schema" => parts.output_schema = h,
                    "title" => parts.title = h,
                    _ => return None,
                }
                if c.eat(b"}") {
                    break;
                }
                c.expect(b",")?;
            }
        }
        c.expect(b",\"recorded\":")?;
        let recorded = if c.eat(b"true") {
            true
        } else {
            c.expect(b"false")?;
            false
        };
        c.expect(b"}")?;
        tools.push(ToolEntry {
            name,
            recorded,
            digest,
            parts,
        });
        if c.eat(b"]") {
            return Some(tools);
        }
        c.expect(b",")?;
    }
}

impl FastRecord {
    /// Reads a record object in canonical layout at the cursor.
    pub(crate) fn read(c: &mut Cursor<'_>) -> Option<Self> {
        c.expect(b"{\"agent\":")?;
        let agent = AgentName::new(&c.string()?).ok()?;
        c.expect(b",\"body\":")?;
        let body = FastBody::read(c)?;
        c.expect(b",\"key_id\":")?;
        let key_id = KeyId::from_hex(&c.string()?).ok()?;
        c.expect(b",\"kind\":")?;
        let kind = c.variant()?;
        c.expect(b",\"nonce\":")?;
        let nonce = c.nonce()?;
        c.expect(b",\"prev\":")?;
        let prev = if c.eat(b"null") {
            None
        } else {
            Some(c.hash()?)
        };
        c.expect(b",\"seq\":")?;
        let seq = Seq::new(c.counter()?).ok()?;
        c.expect(b",\"sig\":")?;
        let sig = Signature::from_base64(&c.string()?).ok()?;
        c.expect(b",\"time\":")?;
        let time = c.time()?;
        c.expect(b",\"v\":1}")?;
        Some(Self {
            agent,
            body,
            key_id,
            kind,
            nonce,
            prev,
            seq,
            sig,
            time,
        })
    }
}

impl FastRecord {
    /// The record these fields make, or `None` when a member its kind needs
    /// is missing or a rule is broken (the strict road then says which).
    /// The caller still compares the canonical bytes with its input.
    pub(crate) fn into_record(self) -> Option<Record> {
        let b = self.body;
        let body = match self.kind {
            RecordKind::Decision => Body::Decision(Decision {
                call_id: b.call_id?,
                tool: b.tool?,
                input_hash: b.input_hash?,
            }),
            RecordKind::Outcome => Body::Outcome(Outcome {
                call_id: b.call_id?,
                decision: b.decision?,
                status: b.status?,
                output_hash: b.output_hash,
            }),
            RecordKind::Tools => Body::Tools(ToolList {
                list_id: b.list_id?,
                part: b.part?,
                parts: b.parts?,
                tools: b.tools?,
            }),
            RecordKind::Note => Body::Note(NoteBody { text: b.text? }),
            RecordKind::KeyRotation => Body::KeyRotation(KeyRotation {
                new_key_id: b.new_key_id?,
                new_public_key: b.new_public_key?,
            }),
        };
        let unsigned = UnsignedRecord {
            agent: self.agent,
            key_id: self.key_id,
            seq: self.seq,
            prev: self.prev,
            time: self.time,
            nonce: self.nonce,
            body,
        };
        unsigned.validate().ok()?;
        Record::assemble(unsigned, self.sig).ok()
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
        let mut canonical = Vec::with_capacity(512);
        write_canonical(&unsigned, Some(&sig), &mut canonical)?;
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
        if let Some(record) = Self::from_canonical(bytes) {
            return Ok(record);
        }
        Self::from_value(canonical::parse_strict(bytes, Limits::WIRE)?)
    }

    /// The fast road for input that is already canonical: the typed fields
    /// read straight from `bytes`, accepted only when their canonical bytes
    /// are `bytes` exactly. Those bytes have no duplicate member, no number
    /// but the record's own counters, no white space and no other spelling,
    /// so the strict road would accept them and read the same fields. `None`
    /// sends the input down the strict road, which names what is wrong.
    fn from_canonical(bytes: &[u8]) -> Option<Self> {
        let mut cursor = Cursor::new(bytes)?;
        let fields = FastRecord::read(&mut cursor)?;
        if !cursor.at_end() {
            return None;
        }
        let record = fields.into_record()?;
        (record.canonical == bytes).then_some(record)
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

    /// The message the signature is over (§3.1):
    /// `"tally/record/v1\n" ‖ JCS(record without "sig")`. The one place
    /// these bytes are built for a parsed record.
    ///
    /// JCS sorts members, so the top-level `"sig"` member sits between `seq`
    /// and `time`, and no body has a member named `sig`; inside JSON strings
    /// every `"` is escaped, so the bytes `,"sig":"` occur only there. Cutting
    /// that member out of the canonical bytes gives the canonical bytes
    /// without it, without re-serialising the record; should the cut not find
    /// exactly the record's own signature, the bytes are written afresh.
    #[must_use]
    pub fn signed_message(&self) -> Vec<u8> {
        const KEY: &[u8] = b",\"sig\":\"";
        let canonical = &self.canonical;
        let sig = self.sig.to_base64();
        let spliced = canonical
            .windows(KEY.len())
            .position(|w| w == KEY)
            .and_then(|at| {
                let value_start = at + KEY.len();
                let value_end = value_start + sig.len();
                (canonical.get(value_start..value_end) == Some(sig.as_bytes())
                    && canonical.get(value_end) == Some(&b'"'))
                .then_some((at, value_end + 1))
            });
        let mut message = Vec::with_capacity(RECORD_SIGNATURE_DOMAIN.len() + canonical.len());
        message.extend_from_slice(RECORD_SIGNATURE_DOMAIN);
        match spliced {
            Some((from, to)) => {
                message.extend_from_slice(&canonical[..from]);
                message.extend_from_slice(&canonical[to..]);
            }
            None => {
                // A parsed record was written by `write_canonical`, whose only
                // failure (a time outside the wire range) it has passed.
                let mut unsigned = Vec::with_capacity(canonical.len());
                if write_canonical(&self.unsigned, None, &mut unsigned).is_ok() {
                    message.extend_from_slice(&unsigned);
                }
            }
        }
        message
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
        key.verify_raw(&self.signed_message(), &self.sig)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SecretKey {
        SecretKey::from_seed(&[7; 32])
    }

    fn signed(seq: u64, body: Body) -> Record {
        UnsignedRecord {
            agent: AgentName::new("claims-bot.v2").unwrap(),
            key_id: key().public_key().key_id(),
            seq: Seq::new(seq).unwrap(),
            prev: (seq > 0).then(|| Hash::sha256(b"prev")),
            time: UnixMillis::new(1_795_000_000_123),
            nonce: Nonce::from_bytes((0..24).collect()).unwrap(),
            body,
        }
        .sign(&key())
        .unwrap()
    }

    fn digest(label: &str) -> Hash {
        Hash::sha256(label.as_bytes())
    }

    /// One record of every kind and shape, with text that needs escaping.
    fn samples() -> Vec<Record> {
        let tool = |name: &str, all: bool| ToolEntry {
            name: name.into(),
            recorded: all,
            digest: digest(name),
            parts: if all {
                ToolPartDigests {
                    title: Some(digest("t")),
                    description: Some(digest("d")),
                    input_schema: Some(digest("i")),
                    output_schema: Some(digest("o")),
                    annotations: Some(digest("a")),
                    meta: Some(digest("m")),
                }
            } else {
                ToolPartDigests {
                    input_schema: Some(digest("i")),
                    ..ToolPartDigests::default()
                }
            },
        };
        let new_key = SecretKey::from_seed(&[9; 32]).public_key();
        vec![
            signed(
                0,
                Body::Tools(ToolList {
                    list_id: "list \"1\"".into(),
                    part: 0,
                    parts: 2,
                    tools: vec![tool("refund", true), tool("zé\\ro", false)],
                }),
            ),
            signed(
                1,
                Body::Decision(Decision {
                    call_id: "42".into(),
                    tool: "refund/é😀\u{2028}".into(),
                    input_hash: digest("in"),
                }),
            ),
            signed(
                2,
                Body::Outcome(Outcome {
                    call_id: "42".into(),
                    decision: digest("d"),
                    status: OutcomeStatus::ServerExited,
                    output_hash: Some(digest("out")),
                }),
            ),
            signed(
                3,
                Body::Outcome(Outcome {
                    call_id: "43".into(),
                    decision: digest("d2"),
                    status: OutcomeStatus::NotRun,
                    output_hash: None,
                }),
            ),
            signed(
                4,
                Body::Note(NoteBody {
                    text: "line 1\nline\t2 \"quoted\" back\\slash é".into(),
                }),
            ),
            signed(
                5,
                Body::KeyRotation(KeyRotation {
                    new_key_id: new_key.key_id(),
                    new_public_key: new_key,
                }),
            ),
            signed(
                9_007_199_254_740_991,
                Body::Note(NoteBody { text: "max".into() }),
            ),
        ]
    }

    #[test]
    fn the_record_writer_is_the_general_canonicaliser() {
        for r in samples() {
            let general = canonical::canonicalize(&r).unwrap();
            assert_eq!(
                String::from_utf8(r.canonical_bytes().to_vec()).unwrap(),
                String::from_utf8(general.clone()).unwrap()
            );
            assert_eq!(r.hash(), Hash::sha256(&general));
            assert_eq!(
                r.unsigned().signing_bytes().unwrap(),
                canonical::canonicalize(&r.unsigned().wire(None)).unwrap()
            );
            let mut message = RECORD_SIGNATURE_DOMAIN.to_vec();
            message.extend_from_slice(&r.unsigned().signing_bytes().unwrap());
            assert_eq!(r.signed_message(), message);
        }
    }

    #[test]
    fn strings_are_escaped_as_rfc8785_says() {
        let mut texts: Vec<String> = (0u32..0x80)
            .filter_map(char::from_u32)
            .map(|c| format!("a{c}b{c}"))
            .collect();
        texts.extend(
            [
                "",
                "\u{80}\u{9f}\u{2028}\u{2029}\u{feff}",
                "😀é\\\"/",
                "\u{10ffff}",
            ]
            .map(String::from),
        );
        for t in texts {
            let mut out = Vec::new();
            put_str(&mut out, &t);
            assert_eq!(out, canonical::canonicalize(&t).unwrap(), "{t:?}");
        }
        for n in [0, 9, 10, 99, 100, 1 << 32, MAX_COUNTER] {
            let mut out = Vec::new();
            put_counter(&mut out, n).unwrap();
            assert_eq!(out, n.to_string().into_bytes());
        }
        assert_eq!(put_counter(&mut Vec::new(), MAX_COUNTER + 1), None);
    }

    fn strict(bytes: &[u8]) -> Result<Record, RecordError> {
        Record::from_value(canonical::parse_strict(bytes, Limits::WIRE)?)
    }

    #[test]
    fn canonical_input_takes_the_fast_road_to_the_same_record() {
        for r in samples() {
            let bytes = r.canonical_bytes();
            assert_eq!(Record::from_canonical(bytes).as_ref(), Some(&r));
            assert_eq!(strict(bytes).as_ref(), Ok(&r));
            // Other spacing is not canonical: the strict road reads it.
            let pretty = serde_json::to_vec_pretty(&r).unwrap();
            assert!(Record::from_canonical(&pretty).is_none());
            assert_eq!(Record::from_json(&pretty).as_ref(), Ok(&r));
        }
    }

    #[test]
    fn every_refusal_comes_from_the_strict_road_unchanged() {
        let r = &samples()[2];
        let text = String::from_utf8(r.canonical_bytes().to_vec()).unwrap();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                text.replace("\"seq\":2,", "\"seq\":2,\"seq\":2,").into(),
                "duplicate_key",
            ),
            (
                text.replace("\"body\":{", "\"body\":{\"status\":\"ok\",")
                    .into(),
                "duplicate_key",
            ),
            (
                text.replace("\"seq\":2,", "\"seq\":9007199254740992,")
                    .into(),
                "integer_out_of_range",
            ),
            (
                text.replace("\"seq\":2,", "\"seq\":2e400,").into(),
                "non_finite_number",
            ),
            (
                text.replace("\"v\":1}", "\"v\":2}").into(),
                "unsupported_version",
            ),
            (text.replace("\"seq\":2,", "\"seq\":2.0,").into(), "schema"),
            (
                text.replace(
                    "\"status\":\"server_exited\"",
                    "\"output_hash\":null,\"status\":\"server_exited\"",
                )
                .into(),
                "duplicate_key",
            ),
            (
                text.replace(",\"output_hash\":", ",\"extra\":1,\"output_hash\":")
                    .into(),
                "schema",
            ),
            (
                {
                    let at = text.find(",\"prev\":").unwrap();
                    format!("{}{}", &text[..at], &text[at + 74..]).into()
                },
                "invalid_field",
            ),
            (
                text.replace("\"call_id\":\"42\"", "\"call_id\":\"\"")
                    .into(),
                "invalid_field",
            ),
            (
                {
                    let mut b = text.clone().into_bytes();
                    let at = text.find("\"42\"").unwrap() + 1;
                    b[at] = 0xff;
                    b
                },
                "invalid_utf8",
            ),
        ];
        for (bytes, code) in cases {
            assert_ne!(bytes, text.as_bytes());
            assert!(
                Record::from_canonical(&bytes).is_none(),
                "{}",
                String::from_utf8_lossy(&bytes)
            );
            let fast = Record::from_json(&bytes);
            assert_eq!(fast, strict(&bytes));
            assert_eq!(
                fast.unwrap_err().code(),
                code,
                "{}",
                String::from_utf8_lossy(&bytes)
            );
        }
        // An explicit null where the writer omits the member, and an omitted
        // prev, are not v1 form.
        let r3 = &samples()[3];
        let t3 = String::from_utf8(r3.canonical_bytes().to_vec()).unwrap();
        let null = t3.replace(",\"status\":", ",\"output_hash\":null,\"status\":");
        assert!(Record::from_canonical(null.as_bytes()).is_none());
        assert_eq!(
            Record::from_json(null.as_bytes()).unwrap_err().code(),
            "schema"
        );
    }

    #[test]
    fn mutated_input_is_never_accepted_by_the_fast_road_alone() {
        // Whatever the fast road accepts, the strict road accepts as the
        // same record: flip, cut and repeat bytes of canonical records.
        let mut fast_hits = 0;
        for r in samples() {
            let base = r.canonical_bytes().to_vec();
            for m in crate::mutate::mutations(&base, 0x9e37_79b9_7f4a_7c15, 3000, 12) {
                if let Some(fast) = Record::from_canonical(&m) {
                    fast_hits += 1;
                    assert_eq!(strict(&m), Ok(fast), "{}", String::from_utf8_lossy(&m));
                }
            }
        }
        // Some mutations (a digit of seq or time, a hex digit) stay
        // canonical and must agree; most do not.
        assert!(fast_hits > 0);
    }
}
