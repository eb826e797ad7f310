//! A pack has at most as many `checkpoint` lines as the records its header
//! claims (docs/protocol.md §9.1): the lines beyond fail `schema` once and
//! are not read, so a hostile pack cannot make the verifier keep an
//! unbounded set of checkpoint sizes.

use std::path::PathBuf;

use tally_schemas::note::NoteVerifier;
use tally_schemas::pack::AgentKeys;
use tally_schemas::report::CheckStatus;
use tally_verifier::{verify, VerifyOptions};

#[test]
fn checkpoint_lines_beyond_the_claimed_records_fail_schema_once() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/conformance/valid");
    let keys = AgentKeys::from_json(&std::fs::read(dir.join("agent-keys.json")).unwrap()).unwrap();
    let vkey = std::fs::read_to_string(dir.join("log.vkey")).unwrap();
    let log_key = NoteVerifier::from_vkey(vkey.trim()).unwrap();
    let pack = std::fs::read_to_string(dir.join("pack.jsonl")).unwrap();
    // The header now claims 2 records (seq 0 of each agent); the pack keeps
    // its 3 checkpoint lines, so the third is one too many.
    let tampered = pack.replacen(
        r#"{"agent":"claims-bot","first_seq":0,"last_seq":8},{"agent":"mail-bot","first_seq":0,"last_seq":5}"#,
        r#"{"agent":"claims-bot","first_seq":0,"last_seq":0},{"agent":"mail-bot","first_seq":0,"last_seq":0}"#,
        1,
    );
    assert_ne!(tampered, pack);
    assert_eq!(tampered.matches(r#""type":"checkpoint""#).count(), 3);
    let v = verify(
        tampered.as_bytes(),
        &keys,
        &log_key,
        None,
        VerifyOptions::default(),
    )
    .unwrap();
    let schema = &v.report.checks[0];
    assert_eq!(schema.status, CheckStatus::Fail);
    let text = v.to_text();
    let needle = "line 4: more checkpoint lines than the 2 records the header claims";
    assert_eq!(text.matches(needle).count(), 1, "{text}");
    // The line beyond the bound is not read: log_consistency saw two.
    assert!(
        text.contains("log_consistency: pass: 2 checkpoint lines"),
        "{text}"
    );
    // The valid pack itself is within the bound.
    let ok = verify(
        pack.as_bytes(),
        &keys,
        &log_key,
        None,
        VerifyOptions::default(),
    )
    .unwrap();
    assert!(!ok.to_text().contains("more checkpoint lines"));
}
