//! The conformance corpus (testdata/conformance/, its README the runner
//! contract) as the verifier's own tests read it: each case's inputs,
//! parsed the way `tally verify` parses them, and its expected.json.

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde_json::Value;
use tally_schemas::note::NoteVerifier;
use tally_schemas::pack::{AgentKeys, Head};
use tally_verifier::trust::{TrustFile, WitnessPolicy};

/// testdata/conformance.
pub(crate) fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/conformance")
}

/// Every case folder, in name order.
pub(crate) fn case_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// One case's inputs to the verifier, parsed.
pub(crate) struct Case {
    pub pack: Vec<u8>,
    pub keys: AgentKeys,
    pub log_key: NoteVerifier,
    pub witnesses: Option<WitnessPolicy>,
    pub head: Option<Head>,
    pub max_skew_ms: u64,
    pub grace_ms: u64,
    /// The disclosure files options.json names (§6.3), parsed.
    pub disclosures: Vec<(String, tally_schemas::disclosure::Disclosure)>,
}

/// The file `name` in `dir`, if there is one.
pub(crate) fn read(dir: &Path, name: &str) -> Option<Vec<u8>> {
    std::fs::read(dir.join(name)).ok()
}

/// A JSON file of the case.
pub(crate) fn json(dir: &Path, name: &str) -> Value {
    serde_json::from_slice(&read(dir, name).unwrap()).unwrap()
}

/// The case in `dir`, or `None` when one of its inputs is refused before
/// the pack is read (agent-keys.json, head.json, the vkey or trust file:
/// a usage error).
pub(crate) fn load(dir: &Path) -> Option<Case> {
    let options = json(dir, "options.json");
    let file = |key: &str| options[key].as_str().map(|n| read(dir, n).unwrap());
    let keys = AgentKeys::from_json(&file("agent_keys").unwrap()).ok()?;
    let (log_key, witnesses) = match (file("witness_key"), file("trust")) {
        (Some(v), None) => (
            NoteVerifier::from_vkey(String::from_utf8(v).ok()?.trim()).ok()?,
            None,
        ),
        (None, Some(t)) => {
            let t = TrustFile::parse(&String::from_utf8(t).ok()?).ok()?;
            (t.log, Some(t.witnesses))
        }
        _ => panic!("{}: witness_key or trust", dir.display()),
    };
    let head = match file("head") {
        Some(h) => Some(Head::from_json(&h).ok()?),
        None => None,
    };
    let mut disclosures = Vec::new();
    for name in options["disclosures"].as_array().into_iter().flatten() {
        let name = name.as_str().unwrap();
        let d = tally_schemas::disclosure::Disclosure::from_json(&read(dir, name).unwrap()).ok()?;
        disclosures.push((name.to_owned(), d));
    }
    Some(Case {
        disclosures,
        pack: file("pack").unwrap(),
        keys,
        log_key,
        witnesses,
        head,
        max_skew_ms: options["max_skew"].as_u64().unwrap() * 1000,
        grace_ms: options["grace"].as_u64().unwrap() * 1000,
    })
}
