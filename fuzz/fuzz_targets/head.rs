#![no_main]
//! Fuzz target: head.json.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tally_schemas::pack::Head::from_json(data);
});
