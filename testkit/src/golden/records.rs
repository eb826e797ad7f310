//! records/: the valid record cases and the refused ones.

use serde_json::{json, Value};
use tally_schemas::canonical::canonicalize;
use tally_schemas::limits::MAX_TOOLS_PER_RECORD;
use tally_schemas::record::RECORD_SIGNATURE_DOMAIN;
use tally_schemas::{Hash, Record, SecretKey};

use super::fixtures::*;

pub(super) fn valid_record_case(description: &str, record: &Record, key: &SecretKey) -> Value {
    let signing = record.unsigned().signing_bytes().expect("canonical");
    let mut signed_message = RECORD_SIGNATURE_DOMAIN.to_vec();
    signed_message.extend_from_slice(&signing);
    json!({
        "description": description,
        "expect": "valid",
        "public_key": key.public_key().to_base64(),
        "input": to_value(record),
        "canonical": String::from_utf8(record.canonical_bytes().to_vec()).expect("utf-8"),
        "signed_message_hex": hex::encode(signed_message),
        "record_hash": record.hash().to_hex(),
    })
}

pub(super) fn invalid_cases(
    sample: &Record,
) -> Vec<(&'static str, &'static str, &'static str, Value)> {
    let good = to_value(sample);
    let with = |f: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        let mut v = good.clone();
        f(v.as_object_mut().expect("object"));
        v
    };
    let text = String::from_utf8(sample.canonical_bytes().to_vec()).expect("utf-8");
    vec![
        (
            "refused-unknown-field",
            "a member the v1 schema does not list",
            "schema",
            with(&|o| {
                o.insert("extra".into(), json!(1));
            }),
        ),
        (
            "refused-missing-prev",
            "prev omitted after seq 0 (it is always present)",
            "invalid_field",
            with(&|o| {
                o.remove("prev");
            }),
        ),
        (
            "refused-prev-at-genesis",
            "seq 0 with a prev hash",
            "invalid_field",
            with(&|o| {
                o.insert("seq".into(), json!(0));
            }),
        ),
        (
            "refused-uppercase-hash",
            "a hash in uppercase hex (one spelling per value)",
            "schema",
            with(&|o| {
                let p = o["prev"].as_str().expect("prev").to_uppercase();
                o.insert("prev".into(), json!(p));
            }),
        ),
        (
            "refused-time-without-millis",
            "a time without its three fractional digits",
            "schema",
            with(&|o| {
                o.insert("time".into(), json!("2026-11-30T08:00:01Z"));
            }),
        ),
        (
            "refused-short-nonce",
            "a nonce of 8 bytes",
            "schema",
            with(&|o| {
                o.insert("nonce".into(), json!("0011223344556677"));
            }),
        ),
        (
            "refused-version-2",
            "a record from a newer format version",
            "unsupported_version",
            with(&|o| {
                o.insert("v".into(), json!(2));
            }),
        ),
        (
            "refused-wrong-type",
            "seq as a string",
            "schema",
            with(&|o| {
                o.insert("seq".into(), json!("1"));
            }),
        ),
        (
            "refused-unknown-kind",
            "a kind the v1 schema does not list",
            "schema",
            with(&|o| {
                o.insert("kind".into(), json!("payment"));
            }),
        ),
        (
            "refused-duplicate-key",
            "the member seq written twice",
            "duplicate_key",
            Value::String(text.replacen("\"seq\":", "\"seq\":5,\"seq\":", 1)),
        ),
        (
            "refused-big-integer",
            "seq written as 2^60, beyond 2^53-1",
            "integer_out_of_range",
            Value::String(text.replacen(
                &format!("\"seq\":{}", sample.seq),
                "\"seq\":1152921504606846976",
                1,
            )),
        ),
        (
            "refused-truncated",
            "the record cut in half",
            "malformed_json",
            Value::String(text[..text.len() / 2].to_owned()),
        ),
    ]
}

/// Refused cases built from other kinds of record: `(file name,
/// description, code, input, schema_refuses)`. Inputs that are strings go
/// under `input_text`.
pub(super) fn more_invalid_cases(
    tools: &Record,
    decision: &Record,
    note: &Record,
    rotation: &Record,
) -> Vec<(&'static str, &'static str, &'static str, Value, bool)> {
    let edit = |r: &Record, f: &dyn Fn(&mut Value)| {
        let mut v = to_value(r);
        f(&mut v);
        v
    };
    let text = |r: &Record| String::from_utf8(r.canonical_bytes().to_vec()).expect("utf-8");
    let note_text = text(note);
    let deep = format!("{}1{}", "[".repeat(16), "]".repeat(16));
    let big_tools: Vec<Value> = (0..MAX_TOOLS_PER_RECORD)
        .map(|i| {
            let h = Hash::sha256(&[i as u8]).to_hex();
            json!({
                "name": format!("{i:02}{}", "t".repeat(254)),
                "recorded": true,
                "digest": h,
                "parts": {"title": h, "description": h, "input_schema": h,
                          "output_schema": h, "annotations": h, "meta": h},
            })
        })
        .collect();
    vec![
        (
            "refused-lease-without-source",
            "a tools record with lease_ms and no source (protocol.md §5.3)",
            "invalid_field",
            edit(tools, &|v| v["body"]["lease_ms"] = json!(60_000)),
            true,
        ),
        (
            "refused-lease-below-its-range",
            "a tools record of source crm with lease_ms 999, below 1,000 (protocol.md §5.3)",
            "invalid_field",
            edit(tools, &|v| {
                v["body"]["source"] = json!("crm");
                v["body"]["lease_ms"] = json!(999);
            }),
            true,
        ),
        (
            "refused-non-finite-number",
            "seq written as 1e400, which is not a finite double",
            "non_finite_number",
            Value::String(note_text.replacen("\"seq\":5", "\"seq\":1e400", 1)),
            true,
        ),
        (
            "refused-too-deep",
            "the note text replaced by arrays nested 16 deep: 18 levels with the record and body, over the limit of 16",
            "too_deep",
            Value::String(
                String::from_utf8(
                    canonicalize(&edit(note, &|v| {
                        v["body"]["text"] = serde_json::from_str(&deep).expect("json");
                    }))
                    .expect("canonical"),
                )
                .expect("utf-8"),
            ),
            true,
        ),
        (
            "refused-too-large",
            "a tools record of 48 tools with 256-byte names and every part digest: its canonical form is over 32,768 bytes",
            "too_large",
            Value::String(
                String::from_utf8(
                    canonicalize(&edit(tools, &|v| v["body"]["tools"] = json!(big_tools)))
                        .expect("canonical"),
                )
                .expect("utf-8"),
            ),
            true,
        ),
        (
            "refused-control-character-in-name",
            "a decision whose tool name holds U+0007",
            "invalid_field",
            edit(decision, &|v| v["body"]["tool"] = json!("lookup\u{7}claim")),
            true,
        ),
        (
            "refused-control-character-in-note",
            "a note whose text holds U+001B (newline and tab are the only controls allowed)",
            "invalid_field",
            edit(note, &|v| v["body"]["text"] = json!("colour \u{1b}[31m red")),
            false,
        ),
        (
            "refused-bad-agent-name",
            "an agent name that starts with a dash",
            "schema",
            edit(note, &|v| v["agent"] = json!("-claims-bot")),
            true,
        ),
        (
            "refused-too-many-tools",
            "a tools record listing 49 tools (at most 48 per record)",
            "invalid_field",
            edit(tools, &|v| {
                let one = v["body"]["tools"][0].clone();
                v["body"]["tools"] = Value::Array(
                    (0..=MAX_TOOLS_PER_RECORD)
                        .map(|i| {
                            let mut t = one.clone();
                            t["name"] = json!(format!("tool-{i}"));
                            t
                        })
                        .collect(),
                );
            }),
            true,
        ),
        (
            "refused-part-not-below-parts",
            "a tools record claiming part 1 of a 1-part list",
            "invalid_field",
            edit(tools, &|v| v["body"]["part"] = json!(1)),
            false,
        ),
        (
            "refused-key-rotation-id-mismatch",
            "a key_rotation whose new_key_id is not the id of new_public_key",
            "invalid_field",
            edit(rotation, &|v| {
                v["body"]["new_key_id"] = json!(agent_key().public_key().key_id().to_hex());
            }),
            false,
        ),
    ]
}
