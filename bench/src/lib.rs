//! # tally-bench
//!
//! The benchmarks of docs/benchmarks.md and the log's load generator, kept
//! out of the product: `cargo build --release -p tally` compiles none of
//! this. The `tally-bench` binary has one subcommand each: `ingest` (records
//! over HTTP into a witness, docs/benchmarks.md "Ingest"), `verify` (the
//! offline verifier, docs/benchmarks.md "Verify") and `log-load` (appends to
//! a redb log file until killed, the process of the kill -9 loop in
//! `tests/it/kill9.rs`, docs/storage.md "Recovery").
//!
//! The library holds what the binary and its tests share:
//! - [`pack`]: the valid pack `tally-bench verify` verifies.

pub mod pack;
