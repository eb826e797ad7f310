//! Record kinds and bodies, docs/protocol.md §5.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::fields::check_text;
use super::RecordError;
use crate::hash::Hash;
use crate::keys::{KeyId, PublicKey};
use crate::limits::{
    DEFAULT_TOOL_LIST_LEASE_MS, MAX_NAME_BYTES, MAX_NOTE_TEXT_BYTES, MAX_TOOLS_PER_RECORD,
    MAX_TOOL_LIST_LEASE_MS, MAX_TOOL_LIST_PARTS, MIN_TOOL_LIST_LEASE_MS,
};

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
    /// A model's text turn claimed an action tool's work with no call to
    /// it in the turn (docs/protocol.md §5.6).
    Claim,
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
            Self::Claim => "claim",
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

/// What an action tool's call did, by its own receipt (docs/protocol.md
/// §5.2): never the model's word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionState {
    /// The call returned and its result held the proof (the other system's
    /// id for what it did).
    Posted,
    /// No proof: the call returned without one, or ended without an answer.
    Unknown,
    /// The call failed.
    Failed,
}

impl ActionState {
    /// The wire name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Posted => "posted",
            Self::Unknown => "unknown",
            Self::Failed => "failed",
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
    /// For an action tool: what the call did, by its receipt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ActionState>,
    /// The proof in clear, when the operator keeps it so; only with
    /// `state` `posted`, instead of `proof_hash`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<String>,
    /// Salted hash (docs/protocol.md §6.1) of the proof; only with `state`
    /// `posted`, instead of `proof`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof_hash: Option<Hash>,
}

/// Body of a `claim` record (docs/protocol.md §5.6): a text-only model turn
/// that claimed an action tool's work, with no call to that tool in the
/// turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    /// The action tool the turn claimed.
    pub tool: String,
    /// Salted hash (docs/protocol.md §6.1) of the turn's text, as a JSON
    /// string.
    pub turn_hash: Hash,
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
    /// The tool source this list declares (a gateway's server, an SDK
    /// program); `None` is the unnamed source of records without it
    /// (docs/protocol.md §5.3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// How long, in ms, the declaration holds; only with `source`, and
    /// [`DEFAULT_TOOL_LIST_LEASE_MS`] when a named source omits it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
}

impl ToolList {
    /// The lease of this list, for a named source: `lease_ms`, or
    /// [`DEFAULT_TOOL_LIST_LEASE_MS`] when omitted (docs/protocol.md §5.3).
    /// `None` for the unnamed source, whose list never expires.
    #[must_use]
    pub fn lease(&self) -> Option<u64> {
        self.source
            .as_ref()
            .map(|_| self.lease_ms.unwrap_or(DEFAULT_TOOL_LIST_LEASE_MS))
    }
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
    /// `claim`.
    Claim(Claim),
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
            Self::Claim(_) => RecordKind::Claim,
        }
    }

    pub(super) fn from_value(kind: RecordKind, value: Value) -> Result<Self, serde_json::Error> {
        Ok(match kind {
            RecordKind::Decision => Self::Decision(serde_json::from_value(value)?),
            RecordKind::Outcome => Self::Outcome(serde_json::from_value(value)?),
            RecordKind::Tools => Self::Tools(serde_json::from_value(value)?),
            RecordKind::Note => Self::Note(serde_json::from_value(value)?),
            RecordKind::KeyRotation => Self::KeyRotation(serde_json::from_value(value)?),
            RecordKind::Claim => Self::Claim(serde_json::from_value(value)?),
        })
    }

    pub(super) fn validate(&self) -> Result<(), RecordError> {
        match self {
            Self::Decision(d) => {
                check_text("body.call_id", &d.call_id, MAX_NAME_BYTES, false)?;
                check_text("body.tool", &d.tool, MAX_NAME_BYTES, false)
            }
            Self::Outcome(o) => {
                check_text("body.call_id", &o.call_id, MAX_NAME_BYTES, false)?;
                check_action(o)
            }
            Self::Claim(c) => check_text("body.tool", &c.tool, MAX_NAME_BYTES, false),
            Self::Tools(t) => {
                check_text("body.list_id", &t.list_id, MAX_NAME_BYTES, false)?;
                if let Some(source) = &t.source {
                    check_text("body.source", source, MAX_NAME_BYTES, false)?;
                }
                if let Some(lease) = t.lease_ms {
                    if t.source.is_none() {
                        return Err(RecordError::Invalid {
                            field: "body.lease_ms",
                            reason: "is allowed only together with source".into(),
                        });
                    }
                    if !(MIN_TOOL_LIST_LEASE_MS..=MAX_TOOL_LIST_LEASE_MS).contains(&lease) {
                        return Err(RecordError::Invalid {
                            field: "body.lease_ms",
                            reason: format!(
                                "{lease} is not within {MIN_TOOL_LIST_LEASE_MS} to {MAX_TOOL_LIST_LEASE_MS}"
                            ),
                        });
                    }
                }
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

/// The rules of an outcome's action members (docs/protocol.md §5.2):
/// `proof` or `proof_hash`, exactly one, exactly when `state` is `posted`;
/// `posted` only with status `ok`, `failed` only with another status.
fn check_action(o: &Outcome) -> Result<(), RecordError> {
    let proofs = usize::from(o.proof.is_some()) + usize::from(o.proof_hash.is_some());
    if let Some(proof) = &o.proof {
        check_text("body.proof", proof, MAX_NAME_BYTES, false)?;
    }
    let invalid = |field, reason: &str| {
        Err(RecordError::Invalid {
            field,
            reason: reason.into(),
        })
    };
    match o.state {
        None if proofs > 0 => invalid("body.proof", "is allowed only with state posted"),
        None => Ok(()),
        Some(ActionState::Posted) if proofs != 1 => invalid(
            "body.state",
            "posted needs exactly one of proof and proof_hash",
        ),
        Some(ActionState::Posted) if o.status != OutcomeStatus::Ok => {
            invalid("body.state", "posted is allowed only with status ok")
        }
        Some(ActionState::Posted) => Ok(()),
        Some(_) if proofs > 0 => invalid("body.proof", "is allowed only with state posted"),
        Some(ActionState::Failed) if o.status == OutcomeStatus::Ok => {
            invalid("body.state", "failed is not allowed with status ok")
        }
        Some(_) => Ok(()),
    }
}
