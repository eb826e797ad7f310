//! The verification report: the twelve checks, their statuses, coverage
//! lines and the result, docs/protocol.md §11. `tally verify --format json`
//! prints a [`Report`]; its schema is schemas/json/report.schema.json.

use serde::{Deserialize, Serialize};

/// The report format version. Version 2 added [`Report::agents`]; the
/// rest is as in version 1.
pub const REPORT_VERSION: u64 = 2;

/// The twelve checks, in the order they are reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckId {
    /// 1. The pack and everything in it parse and validate.
    Schema,
    /// 2. Every signing key is trusted and active at the record's time.
    AgentKeys,
    /// 3. Every record's signature verifies.
    RecordSignatures,
    /// 4. Every hash that refers to a record recomputes.
    RecordHashes,
    /// 5. Per agent: contiguous seq, prev links, no fork, proper start.
    Chain,
    /// 6. Every checkpoint verifies with the pinned witness key.
    WitnessSignatures,
    /// 7. Every entry is proven in the pack's checkpoint.
    Inclusion,
    /// 8. Every record has a receipt that binds it.
    Receipts,
    /// 9. Witness time within skew; monotone; outcomes after decisions.
    Timing,
    /// 10. Every decision has exactly one outcome; no orphans.
    Outcomes,
    /// 11. head.json shows nothing was cut from the end.
    Head,
    /// 12. Every checkpoint is consistent with the pack's checkpoint.
    LogConsistency,
}

impl CheckId {
    /// All twelve, in report order.
    pub const ALL: [Self; 12] = [
        Self::Schema,
        Self::AgentKeys,
        Self::RecordSignatures,
        Self::RecordHashes,
        Self::Chain,
        Self::WitnessSignatures,
        Self::Inclusion,
        Self::Receipts,
        Self::Timing,
        Self::Outcomes,
        Self::Head,
        Self::LogConsistency,
    ];

    /// The wire id.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Schema => "schema",
            Self::AgentKeys => "agent_keys",
            Self::RecordSignatures => "record_signatures",
            Self::RecordHashes => "record_hashes",
            Self::Chain => "chain",
            Self::WitnessSignatures => "witness_signatures",
            Self::Inclusion => "inclusion",
            Self::Receipts => "receipts",
            Self::Timing => "timing",
            Self::Outcomes => "outcomes",
            Self::Head => "head",
            Self::LogConsistency => "log_consistency",
        }
    }
}

/// The status of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    /// Everything the check covers holds.
    Pass,
    /// Something does not hold; the check names the records.
    Fail,
    /// Not decided yet: something is still to come (a receipt, an outcome
    /// within the grace window). Not a failure.
    Pending,
    /// The input needed was not given (head.json for `head`).
    NotChecked,
}

/// A record named by a check: agent, seq, and log index when witnessed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordRef {
    /// The agent.
    pub agent: String,
    /// The seq.
    pub seq: u64,
    /// The log index, when the record is witnessed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u64>,
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckResult {
    /// Which check.
    pub id: CheckId,
    /// Its status.
    pub status: CheckStatus,
    /// One line for a person: why it failed, what is pending, or why it was
    /// not checked; for a pass, what was covered.
    pub message: String,
    /// The records it names (for `fail` and `pending`), at most 100.
    pub records: Vec<RecordRef>,
}

/// The overall result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Verdict {
    /// No check failed.
    Pass,
    /// At least one check failed.
    Fail,
}

/// One agent of the pack: the range its header line claims, and how many of
/// its records were verified (those that passed `schema`'s per-record
/// rules; fewer than the range holds when records are missing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportAgent {
    /// The agent.
    pub agent: String,
    /// `first_seq` in the pack's header.
    pub first_seq: u64,
    /// `last_seq` in the pack's header.
    pub last_seq: u64,
    /// Records of this agent verified.
    pub records: u64,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    /// Format version, 2.
    pub v: u64,
    /// The twelve checks, in [`CheckId::ALL`] order.
    pub checks: Vec<CheckResult>,
    /// The coverage lines, without the `coverage: ` prefix.
    pub coverage: Vec<String>,
    /// The agents of the pack's header, in header order, each once (empty
    /// when the pack has no valid header).
    pub agents: Vec<ReportAgent>,
    /// Number of records verified.
    pub records: u64,
    /// PASS or FAIL: FAIL when a check failed or a disclosure did not
    /// check.
    pub result: Verdict,
    /// The disclosures given with `--disclosure` (protocol.md §6.3), in the
    /// order given; absent when none was given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disclosures: Vec<DisclosureCheck>,
}

/// How a disclosure checked against the pack (protocol.md §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DisclosureStatus {
    /// Every part recomputes to its record's salted hash.
    Match,
    /// The record is in the pack and a part does not recompute to its hash
    /// (or is not the record the disclosure says).
    Mismatch,
    /// The pack holds no verified record the disclosure names.
    NotInPack,
}

impl DisclosureStatus {
    /// The wire id.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Match => "match",
            Self::Mismatch => "mismatch",
            Self::NotInPack => "not_in_pack",
        }
    }
}

/// One disclosure checked: which call, the result, why, and the disclosed
/// content when it matched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisclosureCheck {
    /// The file as given.
    pub file: String,
    /// The agent it names.
    pub agent: String,
    /// The call it names.
    pub call_id: String,
    /// The result.
    pub status: DisclosureStatus,
    /// One line for a person: what matched, or why not.
    pub message: String,
    /// The seq of the decision, when input was disclosed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_seq: Option<u64>,
    /// The disclosed arguments, when they matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<serde_json::Value>,
    /// The seq of the outcome, when output was disclosed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_seq: Option<u64>,
    /// The disclosed result or error, when it matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<serde_json::Value>,
}
