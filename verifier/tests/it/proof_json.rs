//! The monitor's strict reading of the consistency-proof answer
//! (docs/protocol.md §7.5), and the JSON Schemas of the log's JSON answers
//! (schemas/json/consistency-proof, inclusion-proof, key-directory) on
//! fixtures: each accepted answer validates, each refused one is refused by
//! the parser with a message that says why, and by the schema where a schema
//! can say so. Real server output is validated in tests/it/wire_schemas.rs.

use std::path::PathBuf;

use serde_json::{json, Value};
use tally_schemas::Hash;
use tally_verifier::monitor::parse_consistency_proof;

fn schema(name: &str) -> jsonschema::Validator {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../schemas/json")
        .join(name);
    let schema: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    jsonschema::validator_for(&schema).unwrap()
}

fn h(i: u8) -> String {
    Hash::sha256(&[i]).to_hex()
}

#[test]
fn a_well_formed_consistency_answer_is_read() {
    let body = json!({"v": 1, "from": 3, "to": 7, "consistency": [h(1), h(2)]});
    assert!(schema("consistency-proof.schema.json").is_valid(&body));
    let proof = parse_consistency_proof(body.to_string().as_bytes(), 3, 7).unwrap();
    assert_eq!(proof, vec![Hash::sha256(&[1]), Hash::sha256(&[2])]);
    // White space and member order are free (§2: receivers canonicalise).
    let spaced = format!(
        "{{ \"consistency\" : [ \"{}\" ],\r\n\t\"to\":7, \"from\":3 ,\"v\":1 }}",
        h(1)
    );
    assert_eq!(
        parse_consistency_proof(spaced.as_bytes(), 3, 7).unwrap(),
        vec![Hash::sha256(&[1])]
    );
}

#[test]
fn consistency_answers_that_break_a_rule_are_refused_with_the_reason() {
    let v = schema("consistency-proof.schema.json");
    let hash = h(1);
    let too_long: Vec<String> = (0..65).map(h).collect();
    // (body, asked from, asked to, words the message must hold, schema refuses)
    let cases: Vec<(String, u64, u64, &str, bool)> = vec![
        (
            r#"{"v":1,"from":3,"from":3,"to":7,"consistency":[]}"#.to_owned(),
            3,
            7,
            "duplicate",
            false, // a schema sees the parsed value, without the duplicate
        ),
        (
            json!({"v": 1, "from": 3, "to": 7, "consistency": [], "extra": 0}).to_string(),
            3,
            7,
            "unknown field `extra`",
            true,
        ),
        (
            json!({"from": 3, "to": 7, "consistency": []}).to_string(),
            3,
            7,
            "missing field `v`",
            true,
        ),
        (
            json!({"v": 2, "from": 3, "to": 7, "consistency": []}).to_string(),
            3,
            7,
            "version 2 is not supported",
            true,
        ),
        (
            json!({"v": "1", "from": 3, "to": 7, "consistency": []}).to_string(),
            3,
            7,
            "`v` must be a positive integer",
            true,
        ),
        (
            r#"{"v":1,"from":3.0,"to":7,"consistency":[]}"#.to_owned(),
            3,
            7,
            "floating point `3.0`",
            false, // JSON Schema counts 3.0 as an integer
        ),
        (
            r#"{"v":1,"from":-3,"to":7,"consistency":[]}"#.to_owned(),
            3,
            7,
            "integer `-3`",
            true,
        ),
        (
            r#"{"v":1,"from":3,"to":9007199254740992,"consistency":[]}"#.to_owned(),
            3,
            7,
            "9007199254740992",
            true,
        ),
        (
            json!({"v": 1, "from": 3, "to": 8, "consistency": []}).to_string(),
            3,
            7,
            "proof is for 3..8, asked 3..7",
            false,
        ),
        (
            json!({"v": 1, "from": 3, "to": 7}).to_string(),
            3,
            7,
            "missing field `consistency`",
            true,
        ),
        (
            json!({"v": 1, "from": 3, "to": 7, "consistency": [hash.to_uppercase()]}).to_string(),
            3,
            7,
            "64 lowercase hex digits",
            true,
        ),
        (
            json!({"v": 1, "from": 3, "to": 7, "consistency": [1]}).to_string(),
            3,
            7,
            "invalid type: integer `1`",
            true,
        ),
        (
            json!({"v": 1, "from": 3, "to": 7, "consistency": too_long}).to_string(),
            3,
            7,
            "more than 64",
            true,
        ),
        (
            json!([1, 2]).to_string(),
            3,
            7,
            "expected a JSON object",
            true,
        ),
        (
            r#"{"v":1,"from":3,"to":7,"consistency":["\ud800"]}"#.to_owned(),
            3,
            7,
            "not strict JSON",
            false,
        ),
    ];
    for (body, from, to, words, schema_refuses) in cases {
        let err = parse_consistency_proof(body.as_bytes(), from, to)
            .expect_err(&format!("{body} must be refused"));
        assert!(err.contains(words), "{body}: {err:?} should say {words:?}");
        if schema_refuses {
            let value: Value = serde_json::from_str(&body).unwrap();
            assert!(!v.is_valid(&value), "{body}: the schema should refuse it");
        }
    }
    let invalid_utf8 = b"{\"v\":1,\"from\":3,\"to\":7,\"consistency\":[\"\xff\"]}";
    assert!(parse_consistency_proof(invalid_utf8, 3, 7)
        .unwrap_err()
        .contains("not strict JSON"));
}

#[test]
fn inclusion_answer_schema() {
    let v = schema("inclusion-proof.schema.json");
    let good =
        json!({"v": 1, "index": 5, "size": 21, "leaf_hash": h(0), "inclusion": [h(1), h(2)]});
    assert!(v.is_valid(&good));
    for bad in [
        json!({"index": 5, "size": 21, "leaf_hash": h(0), "inclusion": []}),
        json!({"v": 1, "index": 5, "size": 0, "leaf_hash": h(0), "inclusion": []}),
        json!({"v": 1, "index": 5, "size": 21, "leaf_hash": "00", "inclusion": []}),
        json!({"v": 1, "index": 5, "size": 21, "leaf_hash": h(0), "inclusion": [], "x": 1}),
        json!({"v": 1, "index": 9007199254740992u64, "size": 21, "leaf_hash": h(0), "inclusion": []}),
    ] {
        assert!(!v.is_valid(&bad), "{bad}");
    }
}

#[test]
fn key_directory_schema() {
    let v = schema("key-directory.schema.json");
    let signer = tally_testkit::fixture::log_signer("tally.local/log", "log");
    let vkey = signer.verifier().vkey();
    let good = json!({"v": 1, "origin": signer.verifier().name(), "keys": [
        {"vkey": vkey, "not_before": "2026-01-01T00:00:00.000Z", "not_after": "2026-06-01T00:00:00.000Z"},
        {"vkey": vkey, "not_before": "2026-06-01T00:00:00.000Z", "not_after": null},
    ]});
    assert!(v.is_valid(&good), "{good}");
    for bad in [
        json!({"v": 2, "origin": "tally.local/log", "keys": [{"vkey": vkey, "not_before": "2026-01-01T00:00:00.000Z", "not_after": null}]}),
        json!({"v": 1, "origin": "tally.local/log", "keys": []}),
        json!({"v": 1, "origin": "tally local", "keys": [{"vkey": vkey, "not_before": "2026-01-01T00:00:00.000Z", "not_after": null}]}),
        json!({"v": 1, "origin": "tally.local/log", "keys": [{"vkey": vkey, "not_before": "2026-01-01T00:00:00.000Z"}]}),
        json!({"v": 1, "origin": "tally.local/log", "keys": [{"vkey": vkey, "not_before": 0, "not_after": null}]}),
        json!({"v": 1, "origin": "tally.local/log", "keys": [{"vkey": "tally.local/log+0000000+AAAA", "not_before": "2026-01-01T00:00:00.000Z", "not_after": null}]}),
        json!({"v": 1, "origin": "tally.local/log", "keys": [{"vkey": vkey, "not_before": "2026-01-01T00:00:00.000Z", "not_after": null, "x": 1}]}),
    ] {
        assert!(!v.is_valid(&bad), "{bad}");
    }
}
