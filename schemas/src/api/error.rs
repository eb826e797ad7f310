//! The error body of the witness and of the log's JSON routes (docs/api.md
//! "Errors"; docs/protocol.md §7.5):
//!
//! ```json
//! {"error": {"code": "<stable code>", "message": "<for people>", …evidence}}
//! ```
//!
//! The evidence members are those of the api.md table, each with its type;
//! which ones an error carries depends on its code. A reader refuses a body
//! with other members, as §2 says of every object, but still learns the
//! code and message of an error body whose evidence is wrong
//! ([`ErrorBodyError::Malformed`]), so that a refusal is never lost.

use serde::{Deserialize, Serialize};

use super::{nullable, parse_body, BodyError};
use crate::canonical::{self, CanonicalError, Limits};
use crate::hash::Hash;
use crate::keys::KeyId;
use crate::record::{AgentName, Nonce, Seq};
use crate::time::UnixMillis;
use crate::tree::LeafIndex;

/// `{"error": {…}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// The head of an agent's chain, as a `chain_conflict` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainHead {
    /// Seq of the last record of the chain.
    pub seq: Seq,
    /// That record's hash.
    pub hash: Hash,
}

/// The error object: its code, its message and the evidence members of
/// docs/api.md "Errors" (absent when the code has none of them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorDetail {
    /// The stable code (`chain_conflict`, `malformed`, …).
    pub code: String,
    /// For people.
    pub message: String,
    /// `malformed`: the rule broken (`duplicate_key`, `schema`, …);
    /// `unusable_public_key`: `small_order` or `non_canonical`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `unsupported_version`: the version as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found: Option<String>,
    /// `unsupported_version`: the version the server reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supported: Option<u64>,
    /// The agent the error is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentName>,
    /// The key the error is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<KeyId>,
    /// `chain_conflict`: the witness's head of the chain, `Some(None)`
    /// (`null`) when the chain is empty.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "nullable"
    )]
    pub head: Option<Option<ChainHead>>,
    /// `prior_record_refused`: the seq of the agent's record in the same
    /// batch that was refused first (protocol.md §8.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<Seq>,
    /// `batch_too_large`: how many records the batch carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// `batch_too_large`: the most records a batch may carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_records: Option<u64>,
    /// `nonce_replayed`: the nonce.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<Nonce>,
    /// `nonce_replayed`: the entry that used it first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_index: Option<LeafIndex>,
    /// `exists`: `agent`, `project` or `key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub what: Option<String>,
    /// `exists`: the name that is taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `retroactive_key_change`: the instant asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<UnixMillis>,
    /// `retroactive_key_change`: the earliest instant allowed now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earliest_at: Option<UnixMillis>,
    /// `retroactive_key_change`: the latest admitted record's time,
    /// `Some(None)` (`null`) without records.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "nullable"
    )]
    pub latest_record_time: Option<Option<UnixMillis>>,
    /// `too_large`: the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// `body_timeout`: the bytes that did arrive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_bytes: Option<u64>,
    /// `clock_skew`: the record's time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_time: Option<UnixMillis>,
    /// `clock_skew`: the witness's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub witness_time: Option<UnixMillis>,
    /// `clock_skew`: the bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_skew_ms: Option<u64>,
    /// `rate_limited`: when a token is available again; `quota_exceeded`:
    /// the time to the next UTC day;
    /// `sequencer_unavailable`: when to send the same record again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// `key_not_active`: the record's time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<UnixMillis>,
    /// `key_not_active`: the key's validity start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<UnixMillis>,
    /// `key_not_active`: the key's validity end, `Some(None)` (`null`)
    /// while it has none.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "nullable"
    )]
    pub not_after: Option<Option<UnixMillis>>,
}

impl ErrorDetail {
    /// An error object with only a code and a message.
    #[must_use]
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
            ..Self::default()
        }
    }
}

/// Why bytes were not read as an error body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ErrorBodyError {
    /// Not `{"error":{"code":…,"message":…}}` at all (not JSON, another
    /// shape): for example a proxy's HTML page. The HTTP status is all
    /// there is.
    #[error("not an error body: {0}")]
    NotAnErrorBody(String),
    /// An error body whose code and message read, but whose other members
    /// break docs/api.md (an unknown member, evidence of the wrong type).
    #[error("error {code} ({message}) does not match docs/api.md: {reason}")]
    Malformed {
        /// The code.
        code: String,
        /// The message.
        message: String,
        /// What is wrong with the rest.
        reason: String,
    },
}

impl ErrorBody {
    /// Parses an error answer strictly (§2, exactly the members above).
    ///
    /// # Errors
    /// [`ErrorBodyError::Malformed`] when the code and message read but the
    /// rest breaks a rule; [`ErrorBodyError::NotAnErrorBody`] otherwise.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ErrorBodyError> {
        /// Just the code and message, whatever else is there.
        #[derive(Deserialize)]
        struct Envelope {
            error: Core,
        }
        #[derive(Deserialize)]
        struct Core {
            code: String,
            message: String,
        }
        match parse_body::<Self>(bytes, "error body", Limits::WIRE) {
            Ok(body) => Ok(body),
            Err(e) if bytes.len() > Limits::WIRE.max_bytes => {
                Err(ErrorBodyError::NotAnErrorBody(e.to_string()))
            }
            Err(e) => match serde_json::from_slice::<Envelope>(bytes) {
                Ok(Envelope { error }) => Err(ErrorBodyError::Malformed {
                    code: error.code,
                    message: error.message,
                    reason: match e {
                        BodyError::Schema { message, .. } => message,
                        other => other.to_string(),
                    },
                }),
                Err(_) => Err(ErrorBodyError::NotAnErrorBody(e.to_string())),
            },
        }
    }

    /// The canonical JSON bytes of the body (RFC 8785), as the witness
    /// sends them.
    ///
    /// # Errors
    /// [`CanonicalError`] only for a time outside the wire range in the
    /// evidence (a body built in code).
    pub fn to_json(&self) -> Result<Vec<u8>, CanonicalError> {
        canonical::canonicalize(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_conflict_reads_its_head_and_an_empty_chain_reads_as_null() {
        let hash = Hash::sha256(b"r");
        let body = format!(
            r#"{{"error":{{"code":"chain_conflict","message":"m","agent":"bot","head":{{"seq":4,"hash":"{hash}"}}}}}}"#
        );
        let e = ErrorBody::from_json(body.as_bytes()).unwrap().error;
        assert_eq!(
            e.head,
            Some(Some(ChainHead {
                seq: Seq::new(4).unwrap(),
                hash
            }))
        );
        let empty =
            br#"{"error":{"code":"chain_conflict","message":"m","agent":"bot","head":null}}"#;
        let e = ErrorBody::from_json(empty).unwrap().error;
        assert_eq!(e.head, Some(None));
        // Written back, the null stays and absent members stay absent.
        assert_eq!(
            ErrorBody { error: e }.to_json().unwrap(),
            br#"{"error":{"agent":"bot","code":"chain_conflict","head":null,"message":"m"}}"#
        );
        let plain = br#"{"error":{"code":"overloaded","message":"busy"}}"#;
        assert_eq!(
            ErrorBody::from_json(plain).unwrap().error,
            ErrorDetail::new("overloaded", "busy")
        );
    }

    #[test]
    fn broken_evidence_keeps_the_code_and_other_bodies_are_not_error_bodies() {
        for (body, why) in [
            (
                r#"{"error":{"code":"chain_conflict","message":"m","head":{"seq":"4"}}}"#,
                "string \"4\"",
            ),
            (
                r#"{"error":{"code":"overloaded","message":"m","extra":1}}"#,
                "unknown field `extra`",
            ),
            (
                r#"{"error":{"code":"overloaded","message":"m"},"also":1}"#,
                "unknown field `also`",
            ),
        ] {
            match ErrorBody::from_json(body.as_bytes()) {
                Err(ErrorBodyError::Malformed { code, reason, .. }) => {
                    assert!(code == "chain_conflict" || code == "overloaded");
                    assert!(reason.contains(why), "{why}: {reason}");
                }
                other => panic!("{body}: {other:?}"),
            }
        }
        for body in [
            "<html>502 Bad Gateway</html>",
            r#"{"error":"busy"}"#,
            r#"{"error":{"code":"x"}}"#,
            r#"{"error":{"code":"x","message":"m","code":"y"}}"#,
        ] {
            assert!(
                matches!(
                    ErrorBody::from_json(body.as_bytes()),
                    Err(ErrorBodyError::NotAnErrorBody(_))
                ),
                "{body}"
            );
        }
    }
}
