#![no_main]
//! Fuzz target: opening a signed checkpoint note with the log key
//! (`open_checkpoint`); a body that parses, signed with that key, must open
//! to the same checkpoint.

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tally_schemas::note::{open_checkpoint, Checkpoint, NoteError, NoteSigner};
use tally_schemas::SecretKey;

fn signer() -> &'static NoteSigner {
    static SIGNER: OnceLock<NoteSigner> = OnceLock::new();
    SIGNER.get_or_init(|| {
        NoteSigner::from_secret("fuzz.tally.invalid/log", SecretKey::from_seed(&[7; 32]))
            .expect("valid key name")
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let key = signer().verifier();
    let _ = open_checkpoint(text, key);
    if let Ok(body) = Checkpoint::from_body(text) {
        if let Ok(note) = signer().sign_note(text) {
            match open_checkpoint(&note, key) {
                Ok(opened) => assert_eq!(opened, body),
                Err(NoteError::OriginMismatch { .. }) => assert_ne!(body.origin, key.name()),
                Err(NoteError::NoteFormat { .. }) => {} // over the note size limit
                Err(e) => panic!("a note signed with the key does not open: {e}"),
            }
        }
    }
});
