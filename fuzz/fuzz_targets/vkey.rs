#![no_main]
//! Fuzz target: verifier keys, as note keys (algorithm 0x01) and as C2SP
//! cosignature/v1 witness keys (`parse_vkey_with_algorithm` with 0x04); a key
//! that parses must print back to the same key.

use libfuzzer_sys::fuzz_target;
use tally_schemas::note::{key_id_for_algorithm, parse_vkey_with_algorithm, NoteVerifier};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for algorithm in [0x01, 0x04] {
        if let Ok((name, key)) = parse_vkey_with_algorithm(text, algorithm) {
            let id = format!("{:08x}", key_id_for_algorithm(algorithm, &name, &key));
            assert!(text.starts_with(&format!("{name}+{id}+")));
        }
    }
    if let Ok(v) = NoteVerifier::from_vkey(text) {
        assert_eq!(
            NoteVerifier::from_vkey(&v.vkey()).expect("printed vkey parses"),
            v
        );
    }
});
