//! Tool-interface continuity, docs/protocol.md §5.7 and docs/operations.md
//! "Approved tool definitions": an approved baseline of a source's tool
//! definitions (the lockfile), a policy mapping each observation to an
//! effect, and the session state that enforces it (which tools are paused,
//! whether the session is paused or denied, whether the check is stale).
//! Each check gives a `tool_check` body that the caller writes through the
//! agent's chain; this module does no I/O besides reading the two files.
//!
//! - `lockfile.rs`: the lockfile format, its signature and the list digest.
//! - `policy.rs`: the policy format, its defaults, effects and exceptions.
//! - `guard.rs`: comparing a server and its offered tools with the baseline
//!   (findings, `tool_check` bodies).
//! - `enforcer.rs`: each session's check state (paused tools, admitting calls).

mod enforcer;
mod error;
mod guard;
mod lockfile;
mod policy;
#[cfg(test)]
mod tests;

pub use enforcer::{Admission, Enforcer};
pub use guard::ToolGuard;
pub use lockfile::{
    list_digest, LockSignature, LockedTool, Lockfile, ServerId, ServerInfo, LOCK_SIGNATURE_DOMAIN,
    LOCK_VERSION,
};
pub use policy::{default_effect, Policy, PolicyException, DEFAULT_MAX_AGE_DAYS, POLICY_VERSION};

pub use error::{GuardError, MAX_FILE_BYTES};
