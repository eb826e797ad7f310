//! The JSON bodies of tally's HTTP APIs, each defined once for the server
//! that writes it and the clients that read it: the witness's error body
//! and admin API (docs/api.md), the key directory (docs/protocol.md §4.5)
//! and the log's JSON proof answers (§7.5).
//!
//! - [`error`]: `{"error":{"code","message",…evidence}}`, every refusal.
//! - [`keydir`]: `GET /.well-known/tally/keys`.
//! - [`proof`]: `GET /v1/proof/consistency` and `/v1/proof/inclusion`.
//! - [`admin`]: projects, API keys, agents and their keys, read tokens, the
//!   agent head: the request and answer bodies.
//!
//! Every body is read as protocol.md §2 says: strict JSON, and exactly the
//! members its section lists, unknown ones refused (docs/api.md
//! "Conventions": answers too). Versioned bodies (the key directory, the
//! proof answers) check `v` first, so that another version is reported as
//! such (§12); the admin API is versioned by its path (`/v1/`).

pub mod admin;
mod body;
pub mod error;
pub mod keydir;
pub mod proof;

pub use admin::{
    AddAgentRequest, AgentHead, AgentList, ApiBody, ApiKeyRevoked, CreateProjectRequest,
    CreateReadTokenRequest, NewApiKey, NewReadToken, ProjectList, ProjectSummary, ReadTokenList,
    ReadTokenRevoked, ReadTokenSummary, RegisteredAgent, RetireRequest, RotateKeyRequest,
};
pub use error::{ChainHead, ErrorBody, ErrorBodyError, ErrorDetail};
pub use keydir::{DirectoryKey, KeyDirectory, KEY_DIRECTORY_VERSION};
pub use proof::{ConsistencyProofAnswer, InclusionProofAnswer, PROOF_JSON_VERSION};

pub(crate) use body::{nullable, parse_versioned, present};
pub use body::{parse_body, BodyError};
