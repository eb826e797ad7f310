//! # tally-verifier
//!
//! The offline verifier of tally packs and the checkpoint monitor. Its
//! contract is docs/protocol.md: §9 (packs, agent-keys.json, head.json) and
//! §11 (the twelve checks, coverage and the result); the monitor follows §7.
//!
//! - [`verify()`]: streams a pack line by line, verifies record signatures on
//!   all cores (strict Ed25519, one signature at a time, never batched), and
//!   returns a [`Report`](tally_schemas::report::Report). The twelve checks
//!   are one module each under `src/checks/` (`checks/chain.rs` is check 5,
//!   and so on); `src/verify.rs` is the driver that reads the pack and hands
//!   them its lines.
//! - [`render_text`]: the report as `tally verify` prints it.
//! - [`trust`]: the pinned trust file (§11.1).
//! - [`monitor`]: follows a log's checkpoints and proves each consistent with
//!   the last one it verified.
//!
//! It depends on tally-schemas and, for the monitor's HTTP GET, `ureq`; never
//! on the log server, the witness, tokio or axum
//! (`cargo tree -p tally-verifier -e normal`).

mod actions;
mod activity;
pub mod audit;
mod checks;
mod continuity;
mod coverage;
mod lines;
pub mod monitor;
mod nonces;
mod pool;
mod render;
pub mod sig;
mod spill;
mod tally;
mod threads;
pub mod trust;
mod verify;

pub use activity::{AuditOptions, Period};
pub use render::{render_text, result_line};
pub use verify::{
    audit, verify, verify_with_budget, Audited, Verification, VerifyError, VerifyOptions,
};
