//! The tampered-pack corpus (testdata/tampered/) as the verifier's tests
//! read it: a case folder holds its pack and, where the case changes them,
//! its own agent-keys.json and head.json; the rest comes from `valid/`.

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use tally_schemas::note::NoteVerifier;
use tally_schemas::pack::{AgentKeys, Head};

/// testdata/tampered.
pub fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/tampered")
}

/// One case's inputs to the verifier.
pub struct Case {
    pub pack: Vec<u8>,
    pub keys: AgentKeys,
    pub head: Head,
    pub log_key: NoteVerifier,
}

/// The file `name` in `dir`, if there is one.
pub fn read(dir: &Path, name: &str) -> Option<Vec<u8>> {
    std::fs::read(dir.join(name)).ok()
}

/// The case in `dir`, with `valid/`'s files for those it does not have.
pub fn load(dir: &Path) -> Case {
    let valid = corpus_dir().join("valid");
    let own_or_valid = |name| read(dir, name).unwrap_or_else(|| read(&valid, name).unwrap());
    let vkey = String::from_utf8(read(&valid, "log.vkey").unwrap()).unwrap();
    Case {
        pack: read(dir, "pack.jsonl").unwrap(),
        keys: AgentKeys::from_json(&own_or_valid("agent-keys.json")).unwrap(),
        head: Head::from_json(&own_or_valid("head.json")).unwrap(),
        log_key: NoteVerifier::from_vkey(vkey.trim()).unwrap(),
    }
}
