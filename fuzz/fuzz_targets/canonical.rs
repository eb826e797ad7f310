#![no_main]
//! Fuzz target: strict JSON parsing and RFC 8785 canonicalisation; canonical output must parse back to itself.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = tally_schemas::canonical::parse_strict(data, tally_schemas::canonical::Limits::WIRE) {
        if let Ok(c) = tally_schemas::canonical::canonicalize(&v) {
            let again = tally_schemas::canonical::parse_strict(&c, tally_schemas::canonical::Limits::WIRE).expect("canonical output parses");
            assert_eq!(tally_schemas::canonical::canonicalize(&again).expect("idempotent"), c);
        }
    }
});
