#![no_main]
//! Fuzz target: log entry parsing (tile entry bundles hold these).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tally_schemas::Entry::from_json(data);
});
