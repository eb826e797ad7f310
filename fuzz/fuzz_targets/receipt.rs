#![no_main]
//! Fuzz target: receipt decoding.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tally_schemas::Receipt::from_json(data);
});
