//! The witness's admin and agent API bodies (docs/api.md "Agents and their
//! keys", "Projects (admin token)", "Read tokens (admin token)" and
//! `GET /v1/agents/{agent}/head`): what `tally serve` reads and answers,
//! and what the CLI sends and reads.
//!
//! Requests and answers alike have exactly the members listed (§2 of
//! docs/protocol.md, docs/api.md "Conventions"); an optional request member
//! may be left out. Secrets shown once (a new API key, a new read token)
//! are left out of `Debug`.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{parse_body, present, BodyError};
use crate::canonical::Limits;
use crate::hash::Hash;
use crate::limits::MAX_LIST_ANSWER_BYTES;
use crate::pack::AgentKey;
use crate::record::{AgentName, Seq};
use crate::time::UnixMillis;
use crate::tree::LeafIndex;

/// A body of the API: a JSON object read strictly, with its name for
/// error messages and its size bound.
pub trait ApiBody: DeserializeOwned + Serialize {
    /// What the body is, for error messages (`agent list`, …).
    const WHAT: &'static str;
    /// Its bounds: [`Limits::WIRE`], or larger for a list that grows with
    /// the witness ([`MAX_LIST_ANSWER_BYTES`]).
    const LIMITS: Limits = Limits::WIRE;

    /// Parses the body strictly: §2 JSON within [`Self::LIMITS`], exactly
    /// the members listed.
    ///
    /// # Errors
    /// [`BodyError`] naming the first rule broken.
    fn from_json(bytes: &[u8]) -> Result<Self, BodyError> {
        parse_body(bytes, Self::WHAT, Self::LIMITS)
    }
}

/// Limits of the list answers, which grow with the witness.
const LIST: Limits = Limits {
    max_bytes: MAX_LIST_ANSWER_BYTES,
    max_depth: crate::limits::MAX_DEPTH,
};

/// `POST /v1/agents`: register an agent and its first key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddAgentRequest {
    /// The agent's name, unique on the witness.
    pub agent: AgentName,
    /// Its Ed25519 public key, standard base64. Text here, so that the
    /// witness can tell a weak key (`400 unusable_public_key`) from a
    /// malformed body.
    pub public_key: String,
    /// When the key becomes valid; the witness's default when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<UnixMillis>,
}

/// `POST /v1/agents/{agent}/rotate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RotateKeyRequest {
    /// The new public key, standard base64 (text, as in [`AddAgentRequest`]).
    pub public_key: String,
    /// When the old keys end and the new one starts; default as api.md says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<UnixMillis>,
}

/// `POST /v1/agents/{agent}/retire` (an empty body is `{}`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetireRequest {
    /// When the agent's keys end; default as api.md says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<UnixMillis>,
}

/// The agent object: the answer of `POST /v1/agents` (201), of rotate and
/// retire (200), and each item of `GET /v1/agents`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisteredAgent {
    /// The agent.
    pub agent: AgentName,
    /// The project it belongs to.
    pub project: String,
    /// Its keys, oldest first, with their validity ranges (as in
    /// agent-keys.json, protocol.md §9.3).
    pub keys: Vec<AgentKey>,
}

/// `GET /v1/agents`: the API key's project's agents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentList {
    /// The agents.
    pub agents: Vec<RegisteredAgent>,
}

/// `GET /v1/agents/{agent}/head`: the committed head of an agent's chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentHead {
    /// The agent.
    pub agent: AgentName,
    /// Seq of its last committed record.
    pub seq: Seq,
    /// That record's hash.
    pub hash: Hash,
    /// Its index in the log.
    pub index: LeafIndex,
}

/// `POST /v1/projects`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateProjectRequest {
    /// The project's name (1–64 bytes of `a-z 0-9 . _ -`; the witness
    /// refuses others with `400 bad_name`).
    pub name: String,
}

/// A new API key, shown once: the answer of `POST /v1/projects` and of
/// `POST /v1/projects/{project}/api-keys` (201).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewApiKey {
    /// The project it posts for.
    pub project: String,
    /// The key (`tally_<16 hex id>_<48 hex secret>`); the witness keeps
    /// only its SHA-256.
    pub api_key: String,
    /// Its public id (the 16 hex digits), for revoking it.
    pub api_key_id: String,
}

impl fmt::Debug for NewApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewApiKey")
            .field("project", &self.project)
            .field("api_key_id", &self.api_key_id)
            .finish_non_exhaustive()
    }
}

/// One project of `GET /v1/projects`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectSummary {
    /// Its name.
    pub name: String,
    /// When it was created.
    pub created: UnixMillis,
    /// How many agents are registered to it.
    pub agents: u64,
}

/// `GET /v1/projects`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectList {
    /// The projects.
    pub projects: Vec<ProjectSummary>,
}

/// `POST /v1/api-keys/{id}/revoke` (200).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyRevoked {
    /// The key's id.
    pub api_key_id: String,
    /// Always `true`.
    pub revoked: bool,
}

/// `POST /v1/read-tokens` (the body may be empty: no label).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateReadTokenRequest {
    /// Who it is for (at most 128 bytes, no control character); default
    /// empty.
    #[serde(default)]
    pub label: String,
}

/// A new read token, shown once (201).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewReadToken {
    /// The token (`tallyread_<16 hex id>_<48 hex secret>`); the witness
    /// keeps only its SHA-256.
    pub read_token: String,
    /// Its public id, for revoking it.
    pub read_token_id: String,
    /// Its label.
    pub label: String,
}

impl fmt::Debug for NewReadToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewReadToken")
            .field("read_token_id", &self.read_token_id)
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

/// One read token of `GET /v1/read-tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadTokenSummary {
    /// Its public id.
    pub id: String,
    /// Its label.
    pub label: String,
    /// When it was made.
    pub created: UnixMillis,
    /// When it was revoked; `None` (`null`, never omitted) while it is not.
    #[serde(deserialize_with = "present")]
    pub revoked: Option<UnixMillis>,
}

/// `GET /v1/read-tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadTokenList {
    /// The tokens.
    pub read_tokens: Vec<ReadTokenSummary>,
}

/// `POST /v1/read-tokens/{id}/revoke` (200).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadTokenRevoked {
    /// The token's id.
    pub read_token_id: String,
    /// Always `true`.
    pub revoked: bool,
}

macro_rules! api_body {
    ($($t:ty => $what:literal $(, $limits:expr)?;)*) => {$(
        impl ApiBody for $t {
            const WHAT: &'static str = $what;
            $(const LIMITS: Limits = $limits;)?
        }
    )*};
}

api_body! {
    AddAgentRequest => "agent registration";
    RotateKeyRequest => "key rotation";
    RetireRequest => "retirement";
    RegisteredAgent => "agent";
    AgentList => "agent list", LIST;
    AgentHead => "agent head";
    CreateProjectRequest => "project creation";
    NewApiKey => "new API key";
    ProjectList => "project list", LIST;
    ApiKeyRevoked => "API key revocation";
    CreateReadTokenRequest => "read token creation";
    NewReadToken => "new read token";
    ReadTokenList => "read token list", LIST;
    ReadTokenRevoked => "read token revocation";
}
