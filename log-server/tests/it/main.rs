//! The integration tests of `log-server`, one module per suite, in one test
//! executable: each executable links the whole workspace, so one per
//! crate instead of one per file keeps `cargo test` cheap (DEVELOPERS.md
//! "Tests"). Run one suite with `cargo test -p <crate> --test it <suite>::`.
//! A new suite is a file here and a `mod` line below (CI fails on a file
//! under tests/ that no test target compiles).

mod common;

mod backends;
mod batch;
mod faults;
mod front_faults;
mod fronts;
mod http;
mod ids;
mod migration;
mod postgres;
mod prop;
