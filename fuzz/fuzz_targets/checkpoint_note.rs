#![no_main]
//! Fuzz target: signed notes, checkpoint bodies, vkey and skey strings.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = tally_schemas::note::peek_checkpoint(text);
        let _ = tally_schemas::note::Checkpoint::from_body(text);
        let _ = tally_schemas::note::NoteVerifier::from_vkey(text);
        let _ = tally_schemas::note::NoteSigner::from_skey(text);
    }
});
