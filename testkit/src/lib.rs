//! # tally-testkit
//!
//! Test builders and the generators of checked-in test data, kept out of the
//! product crates (it is `publish = false`, and only ever a
//! dev-dependency):
//!
//! - [`clock`]: a fixed clock and one the test moves.
//! - [`fixture`]: a simulated agent, witness and log that make valid packs
//!   from scratch, deterministically.
//! - `faulty_store` (feature `log-store`, for tally-log's tests): a
//!   tally-log `LogStore` that fails writes on demand,
//!   including a write that fails but lands; over a memory store's front,
//!   a `SharedStore` that also fails the lease and the hand-over.
//! - [`golden`]: the golden vectors of testdata/golden/.
//! - [`conformance`]: the conformance corpus of testdata/conformance/.
//! - [`postgres`]: a real PostgreSQL server in a temporary folder, for the
//!   tests of the PostgreSQL backend.
//!
//! It depends on tally-schemas only (on tally-log too with `log-store`),
//! so every crate's tests may use it.

pub mod clock;
pub mod conformance;
#[cfg(feature = "log-store")]
pub mod faulty_store;
pub mod fixture;
pub mod golden;
pub mod postgres;
