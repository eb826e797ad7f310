#![no_main]
//! Fuzz target: strict JSON parsing and RFC 8785 canonicalisation; canonical output must parse back to itself.

use libfuzzer_sys::fuzz_target;
use tally_schemas::canonical::{canonicalize, parse_strict, Limits};

/// JCS output can be longer than its input: `9e15` (4 bytes) is written as
/// `9000000000000000` (16 bytes), `1e300` as `1e+300`. Larger numbers are
/// refused by `canonicalize`, so output is at most 4 times the input; the
/// re-parse gets 8 times the wire limit so that a maximal input cannot fail
/// it falsely.
const REPARSE: Limits = Limits {
    max_bytes: 8 * Limits::WIRE.max_bytes,
    max_depth: Limits::WIRE.max_depth,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = parse_strict(data, Limits::WIRE) {
        if let Ok(c) = canonicalize(&v) {
            let again = parse_strict(&c, REPARSE).expect("canonical output parses");
            assert_eq!(canonicalize(&again).expect("idempotent"), c);
        }
    }
});
