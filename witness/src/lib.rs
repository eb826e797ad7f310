//! # tally-witness
//!
//! The front door of tally (docs/api.md is the HTTP contract,
//! docs/protocol.md the wire formats, docs/operations.md how to run it):
//! authentication, projects and agent keys, record admission, receipts,
//! exports, the key directory, metrics, and the server behind `tally serve`.
//!
//! - [`witness`]: admission in the order of docs/api.md "POST /v1/records", agent heads.
//! - [`registry`]: projects, API keys (hashed), agents and their keys.
//! - [`export`]: packs, agent-keys.json, head.json (protocol.md §9).
//! - [`http`]: the routes; [`error`]: the one error → status/code table.
//! - [`server`]: data folder, TLS, graceful drain; [`config`]: settings.
//! - `key_changes`: key changes never reach back before admitted records.
//! - `agent_fence`: the per-agent fence between admission and key changes.
//! - `conn`: the connection cap and the timeouts that bound every
//!   connection, head and body.
//! - `keydir`, `metrics`, `ratelimit`, `quota`, [`refusal_log`],
//!   [`log_filter`]: the smaller parts.
//!
//! The console at `/console` is its own crate, tally-console, on top of this
//! one; `tally serve` merges its routes into [`http::router`].

mod agent_fence;
pub mod cached_table;
pub mod config;
mod conn;
pub mod cosigning;
pub mod error;
pub mod export;
pub mod http;
mod key_changes;
mod keydir;
pub mod kv;
pub mod log_filter;
mod metrics;
mod quota;
mod ratelimit;
pub mod refusal_log;
pub mod registry;
pub mod server;
pub mod witness;

pub use agent_fence::{AgentTimes, KeyChanges};
pub use config::{ServeConfig, WitnessConfig};
pub use conn::{client_key, is_body_timeout, CloseReason, ConnTrust, ConnectionStats};
pub use error::WitnessError;
pub use keydir::KeyDirectoryError;
pub use metrics::Metrics;
pub use quota::ProjectQuota;
pub use witness::Witness;
