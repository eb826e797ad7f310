#![no_main]
//! Fuzz target: one line of a pack.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tally_schemas::pack::PackLine::from_json(data);
});
