//! # tally-testkit
//!
//! Test builders and the generators of checked-in test data, kept out of the
//! product crates (it is `publish = false`, and only ever a
//! dev-dependency):
//!
//! - [`clock`]: a fixed clock and one the test moves.
//! - [`fixture`]: a simulated agent, witness and log that make valid packs
//!   from scratch, deterministically.
//! - [`golden`]: the golden vectors of testdata/golden/.
//! - [`conformance`]: the conformance corpus of testdata/conformance/.
//! - [`postgres`]: a real PostgreSQL server in a temporary folder, for the
//!   tests of the PostgreSQL backend.
//!
//! It depends on tally-schemas only, so every crate's tests may use it.

pub mod clock;
pub mod conformance;
pub mod fixture;
pub mod golden;
pub mod postgres;
