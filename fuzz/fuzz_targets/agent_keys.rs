#![no_main]
//! Fuzz target: agent-keys.json.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tally_schemas::pack::AgentKeys::from_json(data);
});
