//! The integration tests of `tally-bench`, one module per suite, in one test
//! executable (DEVELOPERS.md "Tests"). Run one suite with `cargo test -p
//! tally-bench --test it <suite>::`. A new suite is a file here and a `mod`
//! line below (CI fails on a file under tests/ that no test target compiles).

mod kill9;
mod pack;
