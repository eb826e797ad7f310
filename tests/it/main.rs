//! The integration tests of `tally`, one module per suite, in one test
//! executable: each executable links the whole workspace, so one per
//! crate instead of one per file keeps `cargo test` cheap (DEVELOPERS.md
//! "Tests"). Run one suite with `cargo test -p <crate> --test it <suite>::`.
//! A new suite is a file here and a `mod` line below (CI fails on a file
//! under tests/ that no test target compiles).

mod common;

mod agent_batch_sync;
mod attack;
mod batch_e2e;
mod conformance;
mod cosigner_e2e;
mod cosigning_e2e;
mod disclose_e2e;
mod key_changes_e2e;
mod log_kill9;
mod log_kill9_batch;
mod monitor_e2e;
mod newcomer;
mod postgres_console;
mod postgres_cosigning;
mod postgres_e2e;
mod postgres_failover;
mod postgres_fronts;
mod postgres_key_fence;
mod postgres_tls;
mod report_cli;
mod retry_e2e;
mod storage_migration;
mod verify_cli;
mod wire_schemas;
mod witness_e2e;
mod witness_tls;
mod writers_kill9;
