//! The client side of the witness HTTP contract the agent syncs to:
//! `POST /v1/records` (answer: a receipt, docs/protocol.md §8),
//! `POST /v1/records/batch` (one answer per record, §8.1),
//! `GET /v1/agents/{agent}/head`, and the key directory
//! `GET /.well-known/tally/keys` (§4.4) that `tally agent init --witness`
//! pins. Errors come back as `{"error":{"code","message",…}}`; a
//! `chain_conflict` carries the witness's head of the agent's chain.

use std::time::Duration;

use serde::Deserialize;
use tally_schemas::batch::{BatchAnswer, BatchOutcome, BatchRequest};
use tally_schemas::limits::{MAX_BATCH_ANSWER_BYTES, MAX_WIRE_OBJECT_BYTES};
use tally_schemas::{Hash, Record, UnixMillis};

/// The witness's head of an agent's chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct WitnessHead {
    /// Seq of the last record it holds.
    pub seq: u64,
    /// That record's hash.
    pub hash: Hash,
}

/// One key of the witness's key directory (docs/protocol.md §4.5: exactly
/// these members, all present).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirectoryKey {
    /// The C2SP vkey.
    pub vkey: String,
    /// Validity start (always given by the directory; `Option` because
    /// pins written before it was are read into the same shape).
    #[serde(deserialize_with = "required_time")]
    pub not_before: Option<UnixMillis>,
    /// Retirement, `null` while current.
    #[serde(deserialize_with = "present")]
    pub not_after: Option<UnixMillis>,
}

fn required_time<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<UnixMillis>, D::Error> {
    UnixMillis::deserialize(d).map(Some)
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<UnixMillis>, D::Error> {
    Option::<UnixMillis>::deserialize(d)
}

/// `/.well-known/tally/keys`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyDirectory {
    /// Version, 1.
    pub v: u64,
    /// The log's origin.
    pub origin: String,
    /// Current and retired log keys.
    pub keys: Vec<DirectoryKey>,
}

/// Why a witness request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WitnessError {
    /// The witness could not be reached or the connection failed.
    #[error("witness unreachable: {0}")]
    Transport(String),
    /// The witness answered with an error.
    #[error("witness refused ({status} {code}): {message}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// The stable error code.
        code: String,
        /// The witness's message.
        message: String,
        /// For `chain_conflict`: the witness's head (`Some(None)`: it holds
        /// no records for the agent).
        head: Option<Option<WitnessHead>>,
    },
    /// The answer was not what the contract says.
    #[error("unexpected answer from the witness: {0}")]
    BadResponse(String),
}

/// A transport failure with its first and last cause: reqwest's own
/// message names only the URL ("error sending request for url (…)"); the
/// last cause says why ("Connection refused", "timed out").
fn transport(e: reqwest::Error) -> WitnessError {
    let mut cause: &dyn std::error::Error = &e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    let (first, last) = (e.to_string(), cause.to_string());
    WitnessError::Transport(if first == last {
        first
    } else {
        format!("{first}: {last}")
    })
}

impl WitnessError {
    /// Whether retrying the same request later can succeed.
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Transport(_) | Self::BadResponse(_) => true,
            Self::Refused { status, code, .. } => {
                *status == 429
                    || *status >= 500
                    // Registration problems an operator can fix without
                    // touching the record.
                    || matches!(code.as_str(), "unauthorized" | "agent_not_allowed" | "key_not_allowed")
            }
        }
    }
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    code: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    head: Option<serde_json::Value>,
}

/// An HTTP client for one witness.
#[derive(Debug, Clone)]
pub struct WitnessClient {
    http: reqwest::Client,
    base: String,
    api_key: Option<String>,
}

impl WitnessClient {
    /// A client for the witness at `base_url`.
    ///
    /// # Errors
    /// [`WitnessError::Transport`] when the HTTP client cannot be built.
    pub fn new(base_url: &str, api_key: Option<String>) -> Result<Self, WitnessError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(transport)?;
        Ok(Self {
            http,
            base: base_url.trim_end_matches('/').to_owned(),
            api_key,
        })
    }

    /// The base URL.
    #[must_use]
    pub fn base_url(&self) -> &str {
        &self.base
    }

    async fn read_body(resp: reqwest::Response) -> Result<(u16, Vec<u8>), WitnessError> {
        Self::read_body_within(resp, MAX_WIRE_OBJECT_BYTES).await
    }

    async fn read_body_within(
        mut resp: reqwest::Response,
        max: usize,
    ) -> Result<(u16, Vec<u8>), WitnessError> {
        let status = resp.status().as_u16();
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(transport)? {
            if body.len() + chunk.len() > max {
                return Err(WitnessError::BadResponse(format!(
                    "answer larger than {max} bytes"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        Ok((status, body))
    }

    fn refusal(status: u16, body: &[u8]) -> WitnessError {
        match serde_json::from_slice::<ErrorBody>(body) {
            Ok(b) => {
                let head = if b.error.code == "chain_conflict" {
                    match b.error.head {
                        None | Some(serde_json::Value::Null) => Some(None),
                        Some(v) => match serde_json::from_value::<WitnessHead>(v) {
                            Ok(h) => Some(Some(h)),
                            Err(e) => {
                                return WitnessError::BadResponse(format!(
                                    "chain_conflict with a malformed head: {e}"
                                ))
                            }
                        },
                    }
                } else {
                    None
                };
                WitnessError::Refused {
                    status,
                    code: b.error.code,
                    message: b.error.message.chars().take(500).collect(),
                    head,
                }
            }
            Err(_) => WitnessError::Refused {
                status,
                code: format!("http_{status}"),
                message: String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
                head: None,
            },
        }
    }

    /// Posts a record; returns the receipt bytes (not yet accepted: see
    /// [`crate::acceptance::accept_receipt`]).
    ///
    /// # Errors
    /// [`WitnessError`] for transport failures and refusals.
    pub async fn post_record(&self, record: &Record) -> Result<Vec<u8>, WitnessError> {
        let mut req = self
            .http
            .post(format!("{}/v1/records", self.base))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(record.canonical_bytes().to_vec());
        if let Some(k) = &self.api_key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.map_err(transport)?;
        let (status, body) = Self::read_body(resp).await?;
        if status == 200 {
            Ok(body)
        } else {
            Err(Self::refusal(status, &body))
        }
    }

    /// Posts records in one batch (`POST /v1/records/batch`, protocol.md
    /// §8.1); the caller keeps to `MAX_BATCH_RECORDS` and `MAX_BATCH_BYTES`.
    /// Returns one result per record, in order: the receipt bytes (not yet
    /// accepted) or the refusal the one-record route would have given.
    ///
    /// # Errors
    /// [`WitnessError`] for transport failures and refusals of the batch as
    /// a whole (a witness without the batch route answers `404 not_found`),
    /// and [`WitnessError::BadResponse`] for an answer that does not hold
    /// one result per record.
    pub async fn post_batch(
        &self,
        records: &[Record],
    ) -> Result<Vec<Result<Vec<u8>, WitnessError>>, WitnessError> {
        let mut req = self
            .http
            .post(format!("{}/v1/records/batch", self.base))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(BatchRequest::to_json(records));
        if let Some(k) = &self.api_key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.map_err(transport)?;
        let (status, body) = Self::read_body_within(resp, MAX_BATCH_ANSWER_BYTES).await?;
        if status != 200 {
            return Err(Self::refusal(status, &body));
        }
        let answer = BatchAnswer::from_json(&body)
            .map_err(|e| WitnessError::BadResponse(format!("batch answer: {e}")))?;
        if answer.results.len() != records.len() {
            return Err(WitnessError::BadResponse(format!(
                "{} results for a batch of {} records",
                answer.results.len(),
                records.len()
            )));
        }
        Ok(answer
            .results
            .into_iter()
            .map(|r| match r {
                BatchOutcome::Receipt(bytes) => Ok(bytes),
                BatchOutcome::Refused { status, error } => {
                    let body = serde_json::json!({ "error": error });
                    Err(Self::refusal(
                        status,
                        &serde_json::to_vec(&body).unwrap_or_default(),
                    ))
                }
            })
            .collect())
    }

    /// The witness's head of `agent`'s chain, `None` when it has no records.
    ///
    /// # Errors
    /// [`WitnessError`] for transport failures and refusals.
    pub async fn head(&self, agent: &str) -> Result<Option<WitnessHead>, WitnessError> {
        let mut req = self
            .http
            .get(format!("{}/v1/agents/{agent}/head", self.base));
        if let Some(k) = &self.api_key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.map_err(transport)?;
        let (status, body) = Self::read_body(resp).await?;
        match status {
            200 => serde_json::from_slice(&body)
                .map(Some)
                .map_err(|e| WitnessError::BadResponse(e.to_string())),
            404 => match Self::refusal(status, &body) {
                WitnessError::Refused { code, .. } if code == "no_records" => Ok(None),
                other => Err(other),
            },
            _ => Err(Self::refusal(status, &body)),
        }
    }

    /// The key directory.
    ///
    /// # Errors
    /// [`WitnessError`] for transport failures, refusals and malformed answers.
    pub async fn key_directory(&self) -> Result<KeyDirectory, WitnessError> {
        let resp = self
            .http
            .get(format!("{}/.well-known/tally/keys", self.base))
            .send()
            .await
            .map_err(transport)?;
        let (status, body) = Self::read_body(resp).await?;
        if status != 200 {
            return Err(Self::refusal(status, &body));
        }
        Self::parse_key_directory(&body)
    }

    /// Reads a key directory strictly: its version first, then exactly the
    /// members of docs/protocol.md §4.5 (no unknown or repeated ones, every
    /// one present).
    ///
    /// # Errors
    /// [`WitnessError::BadResponse`] naming what is wrong.
    pub fn parse_key_directory(body: &[u8]) -> Result<KeyDirectory, WitnessError> {
        #[derive(Deserialize)]
        struct Version {
            v: u64,
        }
        let bad = |e: serde_json::Error| WitnessError::BadResponse(format!("key directory: {e}"));
        let Version { v } = serde_json::from_slice(body).map_err(bad)?;
        if v != 1 {
            return Err(WitnessError::BadResponse(format!(
                "key directory version {v} is not supported (this build reads 1)"
            )));
        }
        serde_json::from_slice(body).map_err(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"v": 1, "origin": "tally.local/log",
 "keys": [{"vkey": "k1", "not_before": "2026-11-01T08:00:00.000Z", "not_after": "2026-11-30T08:00:00.000Z"},
          {"vkey": "k2", "not_before": "2026-11-30T08:00:00.000Z", "not_after": null}]}"#;

    #[test]
    fn key_directory_is_read_strictly() {
        let dir = WitnessClient::parse_key_directory(GOOD.as_bytes()).unwrap();
        assert_eq!(dir.keys.len(), 2);
        assert!(dir.keys[0].not_after.is_some() && dir.keys[1].not_after.is_none());
        for (bad, why) in [
            (GOOD.replace(", \"not_after\": null", ""), "not_after"),
            (
                GOOD.replace("\"not_before\": \"2026-11-01T08:00:00.000Z\", ", ""),
                "not_before",
            ),
            (
                GOOD.replace("\"vkey\": \"k1\"", "\"vkey\": \"k1\", \"extra\": 1"),
                "unknown",
            ),
            (
                GOOD.replace("\"origin\"", "\"v\": 1, \"origin\""),
                "duplicate",
            ),
            (GOOD.replace("\"v\": 1", "\"v\": 2"), "version 2"),
            (
                GOOD.replace("\"v\": 1", "\"v\": 2, \"new\": true"),
                "version 2",
            ),
        ] {
            assert_ne!(bad, GOOD);
            let err = WitnessClient::parse_key_directory(bad.as_bytes()).unwrap_err();
            assert!(err.to_string().contains(why), "{why}: {err}");
        }
    }
}
