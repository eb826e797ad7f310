//! The witness's typed errors and the one table that maps each to an HTTP
//! status and a stable code (docs/api.md, "Errors").
//!
//! Every refusal is a JSON body `{"error":{"code","message",…evidence}}`,
//! tally-schemas' [`ErrorBody`], in canonical form.
//! A 500 says only "internal error"; the detail goes to the log.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tally_log::{AppendError, ProofRequestError, ReadError, StoreError};
use tally_schemas::api::{ChainHead, ErrorBody, ErrorDetail};
use tally_schemas::canonical::CanonicalError;
use tally_schemas::entry::EntryError;
use tally_schemas::record::RecordError;
use tally_schemas::{AgentName, Hash, KeyId, LeafIndex, Nonce, Seq, UnixMillis, UnusableKey};

/// What a 401 or 403 answer refused, set by the error mapping.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The stable code.
    pub code: &'static str,
    /// The agent the error names.
    pub agent: Option<String>,
    /// The agent key id the error names.
    pub key_id: Option<String>,
}

/// Why the witness refused a request. Variants carry the evidence a client
/// needs to act (resync from a head, wait, fix its clock).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WitnessError {
    /// The request body is larger than allowed.
    #[error("request body is {} bytes, more than the limit of {max}", size.map_or_else(|| "too many".to_owned(), |s| s.to_string()))]
    BodyTooLarge {
        /// Declared or counted size, when known.
        size: Option<u64>,
        /// The limit.
        max: usize,
    },
    /// The request body did not arrive by its deadline (docs/operations.md
    /// "Connections": `--body-timeout`, `--body-min-rate`).
    #[error("the request body did not arrive in time: {received} bytes in {elapsed_ms} ms; send the whole body at once")]
    BodyTimeout {
        /// Bytes of the body that did arrive.
        received: u64,
        /// Time from the request head to the cut-off.
        elapsed_ms: u64,
    },
    /// The record's canonical form is larger than `MAX_RECORD_BYTES`.
    #[error("record is {size} bytes in canonical form, more than the limit of {max}")]
    RecordTooLarge {
        /// Canonical size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// Not strict JSON, or not a v1 object of the expected shape.
    #[error("{message}")]
    Malformed {
        /// The specific rule broken (`duplicate_key`, `too_deep`, `schema`, …).
        reason: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A format version this build does not read.
    #[error("format version {found} is not supported (this witness reads version 1)")]
    UnsupportedVersion {
        /// The version as written.
        found: String,
    },
    /// No API key, or one the witness does not know.
    #[error("missing or unknown API key")]
    Unauthorized,
    /// No admin token, or a wrong one.
    #[error("missing or wrong admin token")]
    AdminUnauthorized,
    /// The log is readable with a read token only (`--log-read token`) and
    /// none, or an unknown or revoked one, was sent.
    #[error("this witness serves its log to read-token holders only; send Authorization: Bearer <read token> (docs/operations.md, \"Who can read the log\")")]
    ReadTokenRequired,
    /// The agent is not registered to the API key's project.
    #[error("agent {agent} is not registered to this API key's project")]
    AgentNotAllowed {
        /// The agent.
        agent: AgentName,
    },
    /// The record names a key that is not registered for its agent.
    #[error("key {key_id} is not registered for agent {agent}")]
    KeyNotAllowed {
        /// The agent.
        agent: AgentName,
        /// The key id the record names.
        key_id: KeyId,
    },
    /// The key is registered but was not active at the record's time.
    #[error("key {key_id} of agent {agent} is not active at {time} (valid from {not_before} until {})", not_after.map_or_else(|| "retired".to_owned(), |t| t.to_string()))]
    KeyNotActive {
        /// The agent.
        agent: AgentName,
        /// The key.
        key_id: KeyId,
        /// The record's time.
        time: UnixMillis,
        /// The key's validity start.
        not_before: UnixMillis,
        /// The key's validity end, if set.
        not_after: Option<UnixMillis>,
    },
    /// The signature does not verify strictly with the registered key.
    #[error("the record's signature does not verify with key {key_id} of agent {agent}")]
    BadSignature {
        /// The agent.
        agent: AgentName,
        /// The key.
        key_id: KeyId,
    },
    /// The agent's clock is too far from the witness's.
    #[error("record time {agent_time} is more than {max_skew_ms} ms from the witness's clock {witness_time}")]
    ClockSkew {
        /// The record's time.
        agent_time: UnixMillis,
        /// The witness's clock.
        witness_time: UnixMillis,
        /// The bound.
        max_skew_ms: u64,
    },
    /// The record does not extend its agent's chain.
    #[error("record does not extend the chain of {agent}; resync from the head")]
    ChainConflict {
        /// The agent.
        agent: AgentName,
        /// The chain's head (seq, record hash), `None` when it has no records.
        head: Option<(Seq, Hash)>,
    },
    /// In a batch (docs/api.md "POST /v1/records/batch"): an earlier record
    /// of the same agent in the batch (in seq order) was refused, so this
    /// one was not considered.
    #[error("record {seq} of {agent} was refused earlier in this batch, so this later record of the agent was not considered; send it again after that one")]
    PriorRecordRefused {
        /// The agent.
        agent: AgentName,
        /// The seq of the agent's first refused record in the batch.
        seq: Seq,
    },
    /// A batch holds more records than `MAX_BATCH_RECORDS`.
    #[error("a batch of {count} records is more than the limit of {max}; split it")]
    BatchTooLarge {
        /// Records in the batch.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The nonce was used by another record.
    #[error("nonce {nonce} was already used by the record at index {first_index}")]
    NonceReplayed {
        /// The nonce.
        nonce: Nonce,
        /// The first entry that used it.
        first_index: LeafIndex,
    },
    /// The API key's token bucket is empty.
    #[error("rate limit exceeded for this API key; retry in {retry_after_ms} ms")]
    RateLimited {
        /// When a token will be available.
        retry_after_ms: u64,
    },
    /// The project reached one of its quotas for the UTC day.
    #[error("project {project} reached its quota of {limit} {quota} per UTC day; retry in {retry_after_ms} ms, at the next UTC day")]
    QuotaExceeded {
        /// The project.
        project: String,
        /// Which quota: `records` or `bytes`.
        quota: &'static str,
        /// The quota.
        limit: u64,
        /// Time to the next UTC day, when the counts start again.
        retry_after_ms: u64,
    },
    /// Too much work in flight, or the log's queue is full.
    #[error("the witness is overloaded; retry later")]
    Overloaded,
    /// The witness is shutting down.
    #[error("the witness is shutting down; retry later")]
    ShuttingDown,
    /// PostgreSQL with several fronts: no sequencer answered within the
    /// front's waiting bound (a takeover is under way), or this front lost
    /// the lease mid-commit. The record may still be integrated; sending it
    /// again, to any front, is safe.
    #[error("no sequencer answered in time ({detail}); retry the same record")]
    SequencerUnavailable {
        /// Why, for the log.
        detail: String,
    },
    /// The agent has no records (in the range asked for).
    #[error("agent {agent} has no records{}", if *in_range { " in the requested range" } else { "" })]
    NoRecords {
        /// The agent.
        agent: AgentName,
        /// Whether a range narrowed the search.
        in_range: bool,
    },
    /// A bad query or admin request (unknown parameter, bad number, …).
    #[error("{message}")]
    BadRequest {
        /// The stable code.
        code: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A key change would take effect before a record the witness has
    /// already admitted for the agent, or before the skew bound: it would
    /// make witnessed history fail check 2 (docs/protocol.md §4.1).
    #[error("a key change for agent {agent} at {at} would reach back into witnessed history; the earliest allowed instant is {earliest_at}")]
    RetroactiveKeyChange {
        /// The agent.
        agent: AgentName,
        /// The instant asked for.
        at: UnixMillis,
        /// The earliest instant a change may take effect now.
        earliest_at: UnixMillis,
        /// The latest `time` among the agent's admitted records, if any.
        latest_record_time: Option<UnixMillis>,
    },
    /// A public key under which no signature verifies strictly.
    #[error("{0}")]
    UnusableKey(UnusableKey),
    /// The agent name is held elsewhere on this witness (another project,
    /// or a chain in the log). Says nothing about who holds it.
    #[error("agent name {agent} is not available; choose another name")]
    NameUnavailable {
        /// The name asked for.
        agent: AgentName,
    },
    /// The name is taken.
    #[error("{what} {name} already exists")]
    Exists {
        /// `agent`, `project` or `key`.
        what: &'static str,
        /// The name.
        name: String,
    },
    /// Another request (possibly through another front on the same
    /// PostgreSQL database) changed the same registration at the same time
    /// and won; nothing was written (docs/api.md "Errors").
    #[error("{what} was changed by another request at the same time; read it again and retry")]
    ConcurrentChange {
        /// What was changed, e.g. `agent claims-bot`.
        what: String,
    },
    /// No such route or object.
    #[error("{0}")]
    NotFound(String),
    /// Something failed inside the witness; the detail is logged, not shown.
    #[error("internal error: {0}")]
    Internal(String),
}

impl WitnessError {
    /// The status and stable code of this error: the one table of
    /// docs/api.md "Errors".
    #[must_use]
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::BodyTooLarge { .. } | Self::RecordTooLarge { .. } => {
                (StatusCode::PAYLOAD_TOO_LARGE, "too_large")
            }
            Self::BodyTimeout { .. } => (StatusCode::REQUEST_TIMEOUT, "body_timeout"),
            Self::Malformed { .. } => (StatusCode::BAD_REQUEST, "malformed"),
            Self::UnsupportedVersion { .. } => (StatusCode::BAD_REQUEST, "unsupported_version"),
            Self::BadRequest { code, .. } => (StatusCode::BAD_REQUEST, code),
            Self::Unauthorized | Self::AdminUnauthorized | Self::ReadTokenRequired => {
                (StatusCode::UNAUTHORIZED, "unauthorized")
            }
            Self::UnusableKey(_) => (StatusCode::BAD_REQUEST, "unusable_public_key"),
            Self::RetroactiveKeyChange { .. } => (StatusCode::CONFLICT, "retroactive_key_change"),
            Self::NameUnavailable { .. } => (StatusCode::CONFLICT, "name_unavailable"),
            Self::AgentNotAllowed { .. } => (StatusCode::FORBIDDEN, "agent_not_allowed"),
            Self::KeyNotAllowed { .. } => (StatusCode::FORBIDDEN, "key_not_allowed"),
            Self::NoRecords { .. } => (StatusCode::NOT_FOUND, "no_records"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Self::ChainConflict { .. } => (StatusCode::CONFLICT, "chain_conflict"),
            Self::PriorRecordRefused { .. } => {
                (StatusCode::FAILED_DEPENDENCY, "prior_record_refused")
            }
            Self::BatchTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "batch_too_large"),
            Self::NonceReplayed { .. } => (StatusCode::CONFLICT, "nonce_replayed"),
            Self::Exists { .. } => (StatusCode::CONFLICT, "exists"),
            Self::ConcurrentChange { .. } => (StatusCode::CONFLICT, "concurrent_change"),
            Self::BadSignature { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "bad_signature"),
            Self::ClockSkew { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "clock_skew"),
            Self::KeyNotActive { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "key_not_active"),
            Self::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            Self::QuotaExceeded { .. } => (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded"),
            Self::Overloaded => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
            Self::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
            Self::SequencerUnavailable { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "sequencer_unavailable")
            }
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }

    /// The error body (what [`IntoResponse`] sends): the code, the message
    /// (a 500's says only "internal error") and the evidence members of
    /// docs/api.md "Errors".
    #[must_use]
    pub fn body(&self) -> ErrorBody {
        let (_, code) = self.status_and_code();
        let message = match self {
            Self::Internal(_) => "internal error".to_owned(),
            other => other.to_string(),
        };
        let mut e = ErrorDetail::new(code, message);
        match self {
            Self::BodyTooLarge { max, .. } | Self::RecordTooLarge { max, .. } => {
                e.max_bytes = Some(*max as u64);
            }
            Self::Malformed { reason, .. } => e.reason = Some((*reason).to_owned()),
            Self::BodyTimeout { received, .. } => e.received_bytes = Some(*received),
            Self::UnsupportedVersion { found } => {
                e.found = Some(found.clone());
                e.supported = Some(1);
            }
            Self::UnusableKey(why) => e.reason = Some(why.code().to_owned()),
            Self::RetroactiveKeyChange {
                agent,
                at,
                earliest_at,
                latest_record_time,
            } => {
                e.agent = Some(agent.clone());
                e.at = Some(*at);
                e.earliest_at = Some(*earliest_at);
                e.latest_record_time = Some(*latest_record_time);
            }
            Self::AgentNotAllowed { agent }
            | Self::NoRecords { agent, .. }
            | Self::NameUnavailable { agent } => e.agent = Some(agent.clone()),
            Self::KeyNotAllowed { agent, key_id } | Self::BadSignature { agent, key_id } => {
                e.agent = Some(agent.clone());
                e.key_id = Some(*key_id);
            }
            Self::KeyNotActive {
                agent,
                key_id,
                time,
                not_before,
                not_after,
            } => {
                e.agent = Some(agent.clone());
                e.key_id = Some(*key_id);
                e.time = Some(*time);
                e.not_before = Some(*not_before);
                e.not_after = Some(*not_after);
            }
            Self::ClockSkew {
                agent_time,
                witness_time,
                max_skew_ms,
            } => {
                e.agent_time = Some(*agent_time);
                e.witness_time = Some(*witness_time);
                e.max_skew_ms = Some(*max_skew_ms);
            }
            Self::ChainConflict { agent, head } => {
                e.agent = Some(agent.clone());
                e.head = Some(head.map(|(seq, hash)| ChainHead { seq, hash }));
            }
            Self::PriorRecordRefused { agent, seq } => {
                e.agent = Some(agent.clone());
                e.seq = Some(*seq);
            }
            Self::BatchTooLarge { count, max } => {
                e.count = Some(*count as u64);
                e.max_records = Some(*max as u64);
            }
            Self::NonceReplayed { nonce, first_index } => {
                e.nonce = Some(nonce.clone());
                e.first_index = Some(*first_index);
            }
            Self::RateLimited { retry_after_ms } | Self::QuotaExceeded { retry_after_ms, .. } => {
                e.retry_after_ms = Some(*retry_after_ms);
            }
            Self::SequencerUnavailable { .. } => e.retry_after_ms = Some(1000),
            Self::Exists { what, name } => {
                e.what = Some((*what).to_owned());
                e.name = Some(name.clone());
            }
            _ => {}
        }
        ErrorBody { error: e }
    }

    /// What the refusal log (crate::refusal_log) says of a refused
    /// credential (401, 403); `None` for other errors.
    #[must_use]
    pub fn refusal(&self) -> Option<Refusal> {
        let (status, code) = self.status_and_code();
        if !matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            return None;
        }
        let (agent, key_id) = match self {
            Self::AgentNotAllowed { agent } => (Some(agent.to_string()), None),
            Self::KeyNotAllowed { agent, key_id } => {
                (Some(agent.to_string()), Some(key_id.to_string()))
            }
            _ => (None, None),
        };
        Some(Refusal {
            code,
            agent,
            key_id,
        })
    }

    /// A storage failure, logged here and shown as a bare 500.
    pub fn internal(e: &dyn std::fmt::Display) -> Self {
        tracing::error!(error = %e, "internal error");
        Self::Internal(e.to_string())
    }
}

impl IntoResponse for WitnessError {
    fn into_response(self) -> Response {
        let (status, _) = self.status_and_code();
        let body = self.body().to_json().unwrap_or_else(|_| {
            b"{\"error\":{\"code\":\"internal\",\"message\":\"internal error\"}}".to_vec()
        });
        let mut r = (status, body).into_response();
        if let Some(refusal) = self.refusal() {
            // For the log line of crate::refusal_log.
            r.extensions_mut().insert(refusal);
        }
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        match &self {
            Self::Unauthorized | Self::AdminUnauthorized | Self::ReadTokenRequired => {
                h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            Self::RateLimited { retry_after_ms } | Self::QuotaExceeded { retry_after_ms, .. } => {
                let secs = retry_after_ms.div_ceil(1000).max(1);
                if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                    h.insert(header::RETRY_AFTER, v);
                }
            }
            Self::BodyTooLarge { .. } | Self::BodyTimeout { .. } => {
                // The rest of the body is not read: the connection cannot be reused.
                h.insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Self::Overloaded | Self::ShuttingDown | Self::SequencerUnavailable { .. } => {
                h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        r
    }
}

impl From<CanonicalError> for WitnessError {
    fn from(e: CanonicalError) -> Self {
        match e {
            CanonicalError::TooLarge { size, max } => Self::BodyTooLarge {
                size: Some(size as u64),
                max,
            },
            other => Self::Malformed {
                reason: other.code(),
                message: other.to_string(),
            },
        }
    }
}

impl From<tally_schemas::batch::BatchError> for WitnessError {
    fn from(e: tally_schemas::batch::BatchError) -> Self {
        use tally_schemas::batch::BatchError;
        match e {
            BatchError::Canonical(c) => c.into(),
            BatchError::UnsupportedVersion { found } => Self::UnsupportedVersion { found },
            BatchError::TooManyRecords { count, max } => Self::BatchTooLarge { count, max },
            BatchError::Empty => Self::BadRequest {
                code: "empty_batch",
                message: e.to_string(),
            },
            BatchError::Schema { message } => Self::Malformed {
                reason: "schema",
                message,
            },
        }
    }
}

impl From<UnusableKey> for WitnessError {
    fn from(e: UnusableKey) -> Self {
        Self::UnusableKey(e)
    }
}

impl From<RecordError> for WitnessError {
    fn from(e: RecordError) -> Self {
        match e {
            RecordError::Canonical(c) => c.into(),
            RecordError::UnsupportedVersion { found } => Self::UnsupportedVersion { found },
            RecordError::TooLarge { size, max } => Self::RecordTooLarge { size, max },
            other => Self::Malformed {
                reason: other.code(),
                message: other.to_string(),
            },
        }
    }
}

impl From<AppendError> for WitnessError {
    fn from(e: AppendError) -> Self {
        match e {
            AppendError::Overloaded { .. } => Self::Overloaded,
            AppendError::NonceReplayed { nonce, first_index } => {
                Self::NonceReplayed { nonce, first_index }
            }
            AppendError::ChainConflict {
                agent,
                head_seq,
                head_hash,
            } => Self::ChainConflict {
                agent,
                head: head_seq.zip(head_hash),
            },
            AppendError::Closed => Self::ShuttingDown,
            AppendError::Unavailable(detail) => Self::SequencerUnavailable { detail },
            // Admitted again that many times, and each time the agent's
            // keys changed before the commit: rare, and safe to resend.
            AppendError::KeyChanged { agent } => Self::SequencerUnavailable {
                detail: format!("the keys of {agent} kept changing while this record was admitted"),
            },
            AppendError::Storage(StoreError::Fenced(detail)) => {
                Self::SequencerUnavailable { detail }
            }
            AppendError::PriorRecordRefused { agent, seq } => {
                Self::PriorRecordRefused { agent, seq }
            }
            AppendError::BatchTooLarge { count, max } => Self::BatchTooLarge { count, max },
            AppendError::Entry(EntryError::TooLarge { size, max }) => {
                Self::RecordTooLarge { size, max }
            }
            AppendError::Entry(e) => Self::internal(&e),
            other => Self::internal(&other),
        }
    }
}

impl From<StoreError> for WitnessError {
    fn from(e: StoreError) -> Self {
        Self::internal(&e)
    }
}

impl From<ReadError> for WitnessError {
    fn from(e: ReadError) -> Self {
        Self::internal(&e)
    }
}

impl From<ProofRequestError> for WitnessError {
    fn from(e: ProofRequestError) -> Self {
        match e {
            ProofRequestError::Store(s) => Self::internal(&s),
            ProofRequestError::SizeBeyondTree { .. } => Self::BadRequest {
                code: "size_beyond_tree",
                message: e.to_string(),
            },
            ProofRequestError::FromEmptyTree => Self::BadRequest {
                code: "from_empty_tree",
                message: e.to_string(),
            },
            ProofRequestError::SizesOutOfOrder { .. } => Self::BadRequest {
                code: "sizes_out_of_order",
                message: e.to_string(),
            },
            other => Self::BadRequest {
                code: "bad_parameter",
                message: other.to_string(),
            },
        }
    }
}

/// Why the witness's own tables (projects, API keys, agents) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The storage (redb file or PostgreSQL) failed.
    #[error("registry storage: {0}")]
    Storage(String),
    /// A stored row does not decode.
    #[error("registry row {table}/{key} is corrupt: {reason}")]
    Corrupt {
        /// Table.
        table: &'static str,
        /// Row key.
        key: String,
        /// Why.
        reason: String,
    },
}

impl From<crate::kv::KvError> for RegistryError {
    fn from(e: crate::kv::KvError) -> Self {
        Self::Storage(e.to_string())
    }
}

impl From<RegistryError> for WitnessError {
    fn from(e: RegistryError) -> Self {
        Self::internal(&e)
    }
}

/// Runs `f` (a storage or registry call that blocks) on tokio's blocking
/// threads, off the async ones; a task that panicked is an internal error.
/// The witness's handlers and the console's use it, each with its own
/// error type.
///
/// # Errors
/// What `f` returns, or [`WitnessError::internal`] (as `E`) when the task
/// panicked or was cancelled.
pub async fn blocking<T: Send + 'static, E: From<WitnessError> + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, E> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| E::from(WitnessError::internal(&e)))?
}
