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
    /// A comparison of a source's offered tools with their approved
    /// baseline, and the effect a policy gave it (docs/protocol.md §5.7).
    ToolCheck,
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
            Self::ToolCheck => "tool_check",
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

/// What a tool check saw, docs/protocol.md §5.7.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckObservation {
    /// The tool is offered as approved (never listed in `findings`; a
    /// policy may still name it).
    Unchanged,
    /// A tool the baseline does not hold.
    ToolAdded,
    /// A tool of the baseline that is no longer offered.
    ToolRemoved,
    /// `title` or `description` differs.
    DescriptionChanged,
    /// `inputSchema` or `outputSchema` differs.
    SchemaChanged,
    /// `annotations` or `_meta` differs.
    AnnotationsChanged,
    /// The server is not the one the baseline was approved for (its
    /// command or URL, or the name it gives in `initialize`).
    ServerIdentityChanged,
    /// The server gives another version in `initialize` than at approval.
    ServerVersionChanged,
    /// The baseline is older than its maximum age.
    BaselineExpired,
    /// The baseline's signature does not verify.
    SignatureInvalid,
    /// The baseline is signed by a key the policy does not list.
    KeyUnknown,
    /// The policy requires a signature and the baseline has none.
    SignatureMissing,
    /// The tool list could not be read in full (more pages than allowed).
    ListTruncated,
    /// The tool list is not a valid MCP `tools/list` answer.
    ListMalformed,
    /// The server did not answer the check's `tools/list`.
    ServerUnavailable,
}

impl CheckObservation {
    /// Every observation, in wire order.
    pub const ALL: [Self; 15] = [
        Self::Unchanged,
        Self::ToolAdded,
        Self::ToolRemoved,
        Self::DescriptionChanged,
        Self::SchemaChanged,
        Self::AnnotationsChanged,
        Self::ServerIdentityChanged,
        Self::ServerVersionChanged,
        Self::BaselineExpired,
        Self::SignatureInvalid,
        Self::KeyUnknown,
        Self::SignatureMissing,
        Self::ListTruncated,
        Self::ListMalformed,
        Self::ServerUnavailable,
    ];

    /// The wire name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Unchanged => "unchanged",
            Self::ToolAdded => "tool_added",
            Self::ToolRemoved => "tool_removed",
            Self::DescriptionChanged => "description_changed",
            Self::SchemaChanged => "schema_changed",
            Self::AnnotationsChanged => "annotations_changed",
            Self::ServerIdentityChanged => "server_identity_changed",
            Self::ServerVersionChanged => "server_version_changed",
            Self::BaselineExpired => "baseline_expired",
            Self::SignatureInvalid => "signature_invalid",
            Self::KeyUnknown => "key_unknown",
            Self::SignatureMissing => "signature_missing",
            Self::ListTruncated => "list_truncated",
            Self::ListMalformed => "list_malformed",
            Self::ServerUnavailable => "server_unavailable",
        }
    }

    /// Whether the observation is about one tool (else the whole source).
    #[must_use]
    pub const fn per_tool(self) -> bool {
        matches!(
            self,
            Self::Unchanged
                | Self::ToolAdded
                | Self::ToolRemoved
                | Self::DescriptionChanged
                | Self::SchemaChanged
                | Self::AnnotationsChanged
        )
    }
}

/// What a policy made of an observation, docs/protocol.md §5.7. Ordered
/// from weakest to strongest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckEffect {
    /// Go on.
    Proceed,
    /// Go on under an approved exception (recorded with who and until
    /// when; never the same as `proceed`).
    Exception,
    /// Hide the tool from the client and refuse its calls.
    PauseTool,
    /// Refuse every call of the session.
    PauseSession,
    /// Stop the session.
    Deny,
}

impl CheckEffect {
    /// The wire name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Proceed => "proceed",
            Self::Exception => "exception",
            Self::PauseTool => "pause_tool",
            Self::PauseSession => "pause_session",
            Self::Deny => "deny",
        }
    }
}

/// Who approved an exception and until when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckException {
    /// Who approved it.
    pub by: String,
    /// Until when it holds (RFC 3339, UTC).
    pub until: String,
}

/// One observation of a tool check and its effect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckFinding {
    /// What was seen.
    pub observation: CheckObservation,
    /// What the policy made of it.
    pub effect: CheckEffect,
    /// The tool, for an observation about one tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The parts that differ (`ToolPartDigests` wire names), for a changed tool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<String>,
    /// The approved exception, exactly when `effect` is `exception`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exception: Option<CheckException>,
}

/// What started a tool check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckTrigger {
    /// The runtime started, before the server was used.
    Start,
    /// The session was initialised.
    Initialize,
    /// A `tools/list` answer.
    ToolsList,
    /// The server's `notifications/tools/list_changed`.
    ListChanged,
    /// A call to a tool whose check was stale.
    Call,
}

/// Body of a `tool_check` record, docs/protocol.md §5.7.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCheck {
    /// The tool source checked (as in `tools` records); `None`: the unnamed source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// What started the check.
    pub trigger: CheckTrigger,
    /// SHA-256 of the baseline (lockfile) bytes.
    pub baseline: Hash,
    /// SHA-256 of the policy bytes.
    pub policy: Hash,
    /// The list digest (§5.7) of the tools offered, when a list was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offered: Option<Hash>,
    /// Every observation other than `unchanged`, in order.
    pub findings: Vec<CheckFinding>,
    /// The strongest effect of the findings (`proceed` when none).
    pub effect: CheckEffect,
    /// The tools paused after this check, by name, sorted.
    pub paused: Vec<String>,
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
    /// `tool_check`.
    ToolCheck(ToolCheck),
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
            Self::ToolCheck(_) => RecordKind::ToolCheck,
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
            RecordKind::ToolCheck => Self::ToolCheck(serde_json::from_value(value)?),
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
            Self::ToolCheck(c) => validate_check(c),
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
fn invalid(field: &'static str, reason: impl Into<String>) -> RecordError {
    RecordError::Invalid {
        field,
        reason: reason.into(),
    }
}

/// The rules of docs/protocol.md §5.7 beyond the schema.
fn validate_check(c: &ToolCheck) -> Result<(), RecordError> {
    if let Some(source) = &c.source {
        check_text("body.source", source, MAX_NAME_BYTES, false)?;
    }
    if c.findings.len() > crate::limits::MAX_TOOLS_PER_RECORD * 2 {
        return Err(invalid(
            "body.findings",
            format!(
                "{} findings, more than {}",
                c.findings.len(),
                crate::limits::MAX_TOOLS_PER_RECORD * 2
            ),
        ));
    }
    if c.paused.len() > crate::limits::MAX_TOOLS_PER_RECORD * 2 {
        return Err(invalid("body.paused", "more names than findings can hold"));
    }
    let mut strongest = CheckEffect::Proceed;
    for f in &c.findings {
        if f.observation == CheckObservation::Unchanged {
            return Err(invalid(
                "body.findings.observation",
                "unchanged is never a finding",
            ));
        }
        if f.observation.per_tool() != f.tool.is_some() {
            return Err(invalid(
                "body.findings.tool",
                format!(
                    "{} {} a tool name",
                    f.observation.as_str(),
                    if f.observation.per_tool() {
                        "needs"
                    } else {
                        "takes no"
                    }
                ),
            ));
        }
        if let Some(tool) = &f.tool {
            check_text("body.findings.tool", tool, MAX_NAME_BYTES, false)?;
        }
        if f.effect == CheckEffect::PauseTool && !f.observation.per_tool() {
            return Err(invalid(
                "body.findings.effect",
                format!(
                    "pause_tool for {}, which is about no one tool",
                    f.observation.as_str()
                ),
            ));
        }
        if (f.effect == CheckEffect::Exception) != f.exception.is_some() {
            return Err(invalid(
                "body.findings.exception",
                "is present exactly when the effect is exception",
            ));
        }
        if let Some(e) = &f.exception {
            check_text("body.findings.exception.by", &e.by, MAX_NAME_BYTES, false)?;
            crate::time::UnixMillis::parse_rfc3339(&e.until)
                .map_err(|err| invalid("body.findings.exception.until", err.to_string()))?;
        }
        for p in &f.parts {
            if !PART_NAMES.contains(&p.as_str()) {
                return Err(invalid(
                    "body.findings.parts",
                    format!("{p:?} is not a part name"),
                ));
            }
        }
        strongest = strongest.max(f.effect);
    }
    if c.effect != strongest {
        return Err(invalid(
            "body.effect",
            format!(
                "is {}, but the strongest finding's effect is {}",
                c.effect.as_str(),
                strongest.as_str()
            ),
        ));
    }
    let mut last: Option<&str> = None;
    for name in &c.paused {
        check_text("body.paused", name, MAX_NAME_BYTES, false)?;
        if last.is_some_and(|l| l >= name.as_str()) {
            return Err(invalid("body.paused", "is not sorted without repeats"));
        }
        last = Some(name);
    }
    Ok(())
}

/// The wire names of a tool definition's parts.
pub(crate) const PART_NAMES: [&str; 6] = [
    "title",
    "description",
    "input_schema",
    "output_schema",
    "annotations",
    "meta",
];
