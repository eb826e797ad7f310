//! # tally-testkit
//!
//! Test builders and the generators of checked-in test data, kept out of the
//! product crates (it is `publish = false`, and only ever a
//! dev-dependency):
//!
//! - [`fixture`]: a simulated agent, witness and log that make valid packs
//!   from scratch, deterministically.
//!
//! It depends on tally-schemas only, so every crate's tests may use it.

pub mod fixture;
