//! The audit report, docs/protocol.md §11.3: what `tally report` writes (as
//! HTML, or as this data with `--format json`; its schema is
//! schemas/json/audit-report.schema.json). It holds the verifier's
//! [`Report`] as it is and, per agent, what the verifier read while
//! checking: calls per tool over time, outcome statuses, unanswered
//! decisions, key changes and the agent's statements (the coverage lines
//! and every other per-agent line the verifier prints).

use serde::{Deserialize, Serialize};

use crate::report::Report;

/// The audit report format version.
pub const AUDIT_REPORT_VERSION: u64 = 1;

/// Calls, unanswered decisions and key changes listed per agent, at most.
pub const MAX_LISTED: usize = 100;

/// Tools with their own series per agent, at most; the rest are counted
/// together.
pub const MAX_TOOL_SERIES: usize = 12;

/// Time buckets of an agent's chart, at most.
pub const MAX_BUCKETS: usize = 240;

/// The pack as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackInfo {
    /// The file as given.
    pub file: String,
    /// SHA-256 of its bytes, lowercase hex.
    pub sha256: String,
    /// Its size in bytes.
    pub bytes: u64,
}

/// The trust anchors the pack was verified with (§9.3, §4.4, §11.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustInfo {
    /// agent-keys.json as given.
    pub agent_keys_file: String,
    /// SHA-256 of agent-keys.json, lowercase hex.
    pub agent_keys_sha256: String,
    /// The log's origin in agent-keys.json.
    pub origin: String,
    /// The pinned log key (the witness key), a vkey.
    pub log_key: String,
    /// The trust file, when one was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_file: Option<String>,
    /// The witness cosigners of the trust file, as vkeys.
    pub cosigners: Vec<String>,
    /// Cosigners that must cosign the pack's checkpoint (0 without a trust
    /// file).
    pub quorum: u64,
    /// head.json, when one was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_file: Option<String>,
}

/// The period the per-agent figures cover; the twelve checks always cover
/// the whole pack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Period {
    /// Records made at or after this time (RFC 3339), when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Records made before this time (RFC 3339), when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

/// One tool's calls over time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSeries {
    /// The tool's name, or `None` for the tools past [`MAX_TOOL_SERIES`]
    /// counted together.
    pub tool: Option<String>,
    /// Decisions calling it within the period.
    pub calls: u64,
    /// Decisions per bucket, one count per bucket of [`Chart`].
    pub counts: Vec<u64>,
}

/// An agent's calls per tool over time: buckets of `bucket_ms` from
/// `start_ms` (milliseconds since the Unix epoch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Chart {
    /// The first bucket's start.
    pub start_ms: i64,
    /// The width of a bucket.
    pub bucket_ms: u64,
    /// Buckets, at most [`MAX_BUCKETS`].
    pub buckets: u64,
    /// Records of any kind per bucket.
    pub records: Vec<u64>,
    /// The tools called most, then the rest together.
    pub tools: Vec<ToolSeries>,
}

/// How many outcomes ended with one status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusCount {
    /// The outcome status (§5.2).
    pub status: String,
    /// Outcomes with it within the period.
    pub count: u64,
}

/// A call named in the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallRef {
    /// The seq of the record named: the outcome, or the open decision.
    pub seq: u64,
    /// Its time (RFC 3339).
    pub time: String,
    /// The call.
    pub call_id: String,
    /// The tool, when its decision was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The outcome's status, or `open` for a decision without one.
    pub status: String,
}

/// A key rotation record (§5.5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyChange {
    /// Its seq.
    pub seq: u64,
    /// Its time (RFC 3339).
    pub time: String,
    /// The key signing from the next record on.
    pub new_key_id: String,
}

/// What the report says about one agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSection {
    /// The agent.
    pub agent: String,
    /// The header's range.
    pub first_seq: u64,
    /// The header's range.
    pub last_seq: u64,
    /// Its records verified, in the whole pack.
    pub records: u64,
    /// Its verified records made within the period.
    pub period_records: u64,
    /// The first of those (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_time: Option<String>,
    /// The last of those (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_time: Option<String>,
    /// Decisions within the period.
    pub calls: u64,
    /// Calls per tool over time; absent when the period holds no record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart: Option<Chart>,
    /// Outcomes per status within the period, `ok` first.
    pub outcomes: Vec<StatusCount>,
    /// Outcomes other than `ok` within the period, at most [`MAX_LISTED`].
    pub not_ok: Vec<CallRef>,
    /// Outcomes other than `ok` past the listed ones.
    pub not_ok_more: u64,
    /// Decisions within the period without an outcome in the pack, at most
    /// [`MAX_LISTED`].
    pub open: Vec<CallRef>,
    /// Open decisions past the listed ones.
    pub open_more: u64,
    /// Key rotations within the period.
    pub key_changes: Vec<KeyChange>,
    /// The verifier's statements about the agent (coverage, tool-list
    /// changes and every other per-agent line), without the agent's name.
    pub statements: Vec<String>,
    /// The records of this agent the checks name, as `check: seq`.
    pub named_by_checks: Vec<NamedRecord>,
}

/// A record a check names (a failure or a pending one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedRecord {
    /// The check's id.
    pub check: String,
    /// The check's status.
    pub status: String,
    /// The record's seq.
    pub seq: u64,
}

/// The whole audit report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditReport {
    /// Format version, 1.
    pub v: u64,
    /// The tally version that made it.
    pub tally_version: String,
    /// When it was made (RFC 3339).
    pub generated: String,
    /// The pack.
    pub pack: PackInfo,
    /// The trust anchors.
    pub trust: TrustInfo,
    /// The period of the per-agent figures.
    pub period: Period,
    /// The `tally verify` command that reproduces the verification.
    pub command: String,
    /// The verification as `tally verify --format json` prints it.
    pub verification: Report,
    /// Per agent, in header order.
    pub agents: Vec<AgentSection>,
    /// Statements of the verifier not about one agent.
    pub statements: Vec<String>,
}
