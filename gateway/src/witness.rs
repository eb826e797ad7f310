//! The client side of the witness HTTP contract the agent syncs to:
//! `POST /v1/records` (answer: a receipt, docs/protocol.md §8),
//! `POST /v1/records/batch` (one answer per record, §8.1),
//! `GET /v1/agents/{agent}/head`, and the key directory
//! `GET /.well-known/tally/keys` (§4.5) that `tally agent init --witness`
//! pins. Errors come back as `{"error":{"code","message",…}}`; a
//! `chain_conflict` carries the witness's head of the agent's chain. The
//! bodies are tally-schemas' [`tally_schemas::api`] types, read strictly.

use std::time::Duration;

use tally_schemas::api::{
    AgentHead, ApiBody as _, ChainHead, ErrorBody, ErrorBodyError, KeyDirectory,
};
use tally_schemas::batch::{BatchAnswer, BatchOutcome, BatchRequest};
use tally_schemas::limits::{MAX_BATCH_ANSWER_BYTES, MAX_WIRE_OBJECT_BYTES};
use tally_schemas::Record;

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
        head: Option<Option<ChainHead>>,
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

    /// The refusal an error answer carries (docs/api.md "Errors", read by
    /// [`ErrorBody::from_json`]). A body that is no error body at all (a
    /// proxy's page) is known by its status alone; an error body whose
    /// evidence breaks api.md keeps its code, except a `chain_conflict`
    /// without a well-formed head, which cannot be resolved.
    fn refusal(status: u16, body: &[u8]) -> WitnessError {
        let (code, message, head) = match ErrorBody::from_json(body) {
            Ok(ErrorBody { error }) => (error.code, error.message, error.head),
            Err(ErrorBodyError::Malformed {
                code,
                message,
                reason,
            }) => {
                if code == "chain_conflict" {
                    return WitnessError::BadResponse(format!(
                        "{status} chain_conflict with a malformed body: {reason}"
                    ));
                }
                let message = format!("{message} (the error body breaks docs/api.md: {reason})");
                (code, message, None)
            }
            Err(ErrorBodyError::NotAnErrorBody(_)) => {
                return WitnessError::Refused {
                    status,
                    code: format!("http_{status}"),
                    message: String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
                    head: None,
                }
            }
        };
        let head = if code == "chain_conflict" {
            match head {
                Some(head) => Some(head),
                None => {
                    return WitnessError::BadResponse(format!(
                    "{status} chain_conflict without the witness's head (docs/api.md \"Errors\")"
                ))
                }
            }
        } else {
            None
        };
        WitnessError::Refused {
            status,
            code,
            message: message.chars().take(500).collect(),
            head,
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
    /// [`WitnessError`] for transport failures, refusals and malformed
    /// answers.
    pub async fn head(&self, agent: &str) -> Result<Option<AgentHead>, WitnessError> {
        let mut req = self
            .http
            .get(format!("{}/v1/agents/{agent}/head", self.base));
        if let Some(k) = &self.api_key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.map_err(transport)?;
        let (status, body) = Self::read_body(resp).await?;
        match status {
            200 => AgentHead::from_json(&body)
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
        KeyDirectory::from_json(&body).map_err(|e| WitnessError::BadResponse(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_schemas::{Hash, Seq};

    #[test]
    fn refusals_keep_their_code_and_a_chain_conflict_needs_its_head() {
        let hash = Hash::sha256(b"r");
        let conflict = format!(
            r#"{{"error":{{"code":"chain_conflict","message":"resync","agent":"bot","head":{{"seq":3,"hash":"{hash}"}}}}}}"#
        );
        match WitnessClient::refusal(409, conflict.as_bytes()) {
            WitnessError::Refused { code, head, .. } => {
                assert_eq!(code, "chain_conflict");
                let head = head.unwrap().unwrap();
                assert_eq!((head.seq, head.hash), (Seq::new(3).unwrap(), hash));
            }
            other => panic!("{other:?}"),
        }
        let empty =
            br#"{"error":{"code":"chain_conflict","message":"m","agent":"bot","head":null}}"#;
        assert!(matches!(
            WitnessClient::refusal(409, empty),
            WitnessError::Refused {
                head: Some(None),
                ..
            }
        ));
        // Without its head, or with a malformed one, it cannot be resolved.
        for body in [
            r#"{"error":{"code":"chain_conflict","message":"m","agent":"bot"}}"#,
            r#"{"error":{"code":"chain_conflict","message":"m","head":{"seq":3}}}"#,
        ] {
            assert!(
                matches!(
                    WitnessClient::refusal(409, body.as_bytes()),
                    WitnessError::BadResponse(_)
                ),
                "{body}"
            );
        }
        // Other evidence that breaks api.md keeps the code (and says so).
        match WitnessClient::refusal(
            422,
            br#"{"error":{"code":"clock_skew","message":"late","extra":1}}"#,
        ) {
            WitnessError::Refused { code, message, .. } => {
                assert_eq!(code, "clock_skew");
                assert!(
                    message.contains("late") && message.contains("extra"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        // Not an error body: the status is all there is.
        match WitnessClient::refusal(502, b"<html>Bad Gateway</html>") {
            WitnessError::Refused { code, message, .. } => {
                assert_eq!(code, "http_502");
                assert!(message.contains("Bad Gateway"));
            }
            other => panic!("{other:?}"),
        }
    }
}
