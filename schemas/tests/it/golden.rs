//! Golden vectors (testdata/golden, written by tally-testkit's golden/): every
//! fixture parses into the Rust types, round-trips byte for byte, reproduces
//! its derived hashes and signatures, and validates against its JSON Schema
//! in schemas/json with a real validator; every refused fixture is refused by
//! the parser with its stable code, and by the schema where a schema can say so;
//! every salted hash and tool digest in hashes/ is reproduced.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tally_schemas::batch_sig::PreparedKey;
use tally_schemas::canonical::{canonicalize, parse_strict, Limits};
use tally_schemas::hash::salted_hash;
use tally_schemas::note::{open_checkpoint, NoteVerifier};
use tally_schemas::pack::{AgentKeys, Head, PackLine};
use tally_schemas::record::RECORD_SIGNATURE_DOMAIN;
use tally_schemas::tools::digest_tool_definition;
use tally_schemas::{Entry, PublicKey, Receipt, Record};

const SCHEMA_BASE: &str = "https://schemas.tally.invalid/v1/";

/// A record's signature checked as the witness checks it (docs/protocol.md
/// §4.3): the record names `key`, and the signature verifies strictly
/// under it ([`PreparedKey::verify_record`]).
fn verify_signature(record: &Record, key: &PublicKey) -> Result<(), String> {
    if record.key_id != key.key_id() {
        return Err(format!(
            "record names key {}, not {}",
            record.key_id,
            key.key_id()
        ));
    }
    if !PreparedKey::new(key).verify_record(record) {
        return Err("the signature does not verify".into());
    }
    Ok(())
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

/// Serves schemas/json/*.schema.json for `$ref`s, and nothing else.
struct LocalSchemas(HashMap<String, Value>);

impl jsonschema::Retrieve for LocalSchemas {
    fn retrieve(
        &self,
        uri: &jsonschema::Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        self.0
            .get(uri.as_str())
            .cloned()
            .ok_or_else(|| format!("no local schema for {uri}").into())
    }
}

fn schemas() -> LocalSchemas {
    let mut map = HashMap::new();
    for e in fs::read_dir(root().join("schemas/json")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_owned();
        map.insert(format!("{SCHEMA_BASE}{name}"), read_json(&p));
    }
    LocalSchemas(map)
}

fn validator(name: &str) -> jsonschema::Validator {
    let all = schemas();
    let schema = all.0[&format!("{SCHEMA_BASE}{name}")].clone();
    jsonschema::options()
        .with_retriever(all)
        .build(&schema)
        .unwrap_or_else(|e| panic!("{name} is not a valid schema: {e}"))
}

fn assert_valid(v: &jsonschema::Validator, value: &Value, what: &str) {
    let errors: Vec<String> = v
        .iter_errors(value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{what}: schema errors {errors:#?}");
}

#[test]
fn every_schema_is_a_valid_2020_12_schema() {
    let all = schemas();
    assert!(all.0.len() >= 7, "schemas/json has {} files", all.0.len());
    for name in all.0.keys() {
        let file = name.strip_prefix(SCHEMA_BASE).unwrap().to_owned();
        let _ = validator(&file);
    }
}

#[test]
fn record_fixtures() {
    let schema = validator("record.schema.json");
    let dir = root().join("testdata/golden/records");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 44, "record fixtures");
    let (mut valid, mut refused) = (0, 0);
    for f in files {
        let case = read_json(&f);
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let expect = case["expect"].as_str().unwrap();
        match expect {
            "valid" | "bad_signature" => {
                let input = &case["input"];
                let record =
                    Record::from_value(input.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(
                    &serde_json::to_value(&record).unwrap(),
                    input,
                    "{name}: round trip"
                );
                assert_valid(&schema, input, &name);
                let key = PublicKey::from_base64(case["public_key"].as_str().unwrap()).unwrap();
                let verified = verify_signature(&record, &key);
                if expect == "bad_signature" {
                    assert!(verified.is_err(), "{name}: signature should not verify");
                    refused += 1;
                    continue;
                }
                verified.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(
                    record.canonical_bytes(),
                    case["canonical"].as_str().unwrap().as_bytes(),
                    "{name}"
                );
                assert_eq!(
                    record.hash().to_hex(),
                    case["record_hash"].as_str().unwrap(),
                    "{name}"
                );
                let mut message = RECORD_SIGNATURE_DOMAIN.to_vec();
                message.extend_from_slice(&record.unsigned().signing_bytes().unwrap());
                assert_eq!(
                    hex::encode(message),
                    case["signed_message_hex"].as_str().unwrap(),
                    "{name}"
                );
                // Canonical bytes re-parse to the same record.
                assert_eq!(
                    Record::from_json(record.canonical_bytes()).unwrap(),
                    record,
                    "{name}"
                );
                valid += 1;
            }
            code => {
                let err = if let Some(text) = case["input_text"].as_str() {
                    Record::from_json(text.as_bytes()).expect_err(&name)
                } else {
                    let input = &case["input"];
                    // A rule JSON Schema cannot state (part < parts, say) is
                    // marked, and the schema must then accept the input, so
                    // the mark stays true.
                    let schema_refuses = case["schema_refuses"].as_bool().unwrap_or(true);
                    assert_eq!(
                        !schema.is_valid(input),
                        schema_refuses,
                        "{name}: schema_refuses is {schema_refuses}"
                    );
                    Record::from_value(input.clone()).expect_err(&name)
                };
                assert_eq!(err.code(), code, "{name}: {err}");
                refused += 1;
            }
        }
    }
    // Exact, so that a lost fixture is noticed: 8 records of the main chain
    // and 12 of the second (a two-part tool list, six outcome statuses, a
    // named source's list, two posted action outcomes and a claim); a bad
    // signature and 23 refused inputs.
    assert_eq!(
        (valid, refused),
        (20, 24),
        "valid and refused record fixtures"
    );
}

#[test]
fn log_fixtures() {
    let dir = root().join("testdata/golden/log");
    let case = read_json(&dir.join("entry.json"));
    assert_valid(&validator("entry.schema.json"), &case["input"], "entry");
    let entry = Entry::from_value(case["input"].clone()).unwrap();
    assert_eq!(
        entry.canonical_bytes(),
        case["canonical"].as_str().unwrap().as_bytes()
    );
    assert_eq!(
        entry.leaf_hash().to_hex(),
        case["leaf_hash"].as_str().unwrap()
    );
    assert_eq!(serde_json::to_value(&entry).unwrap(), case["input"]);

    let case = read_json(&dir.join("checkpoint.json"));
    let key = NoteVerifier::from_vkey(case["vkey"].as_str().unwrap()).unwrap();
    let cp = open_checkpoint(case["note"].as_str().unwrap(), &key).unwrap();
    assert_eq!(cp.to_body(), case["body"].as_str().unwrap());

    let case = read_json(&dir.join("receipt.json"));
    assert_valid(&validator("receipt.schema.json"), &case["input"], "receipt");
    let receipt: Receipt = serde_json::from_value(case["input"].clone()).unwrap();
    let record = Record::from_value(case["record"].clone()).unwrap();
    let key = NoteVerifier::from_vkey(case["vkey"].as_str().unwrap()).unwrap();
    let (checkpoint, entry) = receipt.verify(&record, &key).unwrap();
    assert!(checkpoint.size.contains(entry.index()));
    assert_eq!(serde_json::to_value(&receipt).unwrap(), case["input"]);
}

#[test]
fn pack_fixtures() {
    // The golden pack is the conformance corpus's golden-pack case, made by
    // the same generator (tally-testkit's golden/); the refused documents
    // stay with the golden vectors.
    let dir = root().join("testdata/conformance/golden-pack");
    let refused_dir = root().join("testdata/golden/pack");
    let line_schema = validator("pack-line.schema.json");
    let text = fs::read(dir.join("pack.jsonl")).unwrap();
    let lines: Vec<&[u8]> = text
        .strip_suffix(b"\n")
        .unwrap()
        .split(|b| *b == b'\n')
        .collect();
    assert!(lines.len() >= 4);
    for (i, line) in lines.iter().enumerate() {
        let value = parse_strict(line, Limits::WIRE).unwrap();
        assert_valid(&line_schema, &value, &format!("pack line {i}"));
        let parsed = PackLine::from_json(line).unwrap_or_else(|e| panic!("pack line {i}: {e}"));
        assert_eq!(parsed.to_json().unwrap(), *line, "pack line {i} round trip");
    }
    assert!(matches!(
        PackLine::from_json(lines[0]).unwrap(),
        PackLine::Header(_)
    ));
    assert!(matches!(
        PackLine::from_json(lines[lines.len() - 1]).unwrap(),
        PackLine::End(_)
    ));

    let keys_bytes = fs::read(dir.join("agent-keys.json")).unwrap();
    assert_valid(
        &validator("agent-keys.schema.json"),
        &serde_json::from_slice(&keys_bytes).unwrap(),
        "agent-keys",
    );
    let keys = AgentKeys::from_json(&keys_bytes).unwrap();
    assert_eq!(keys.agents[0].keys.len(), 2);
    assert_eq!(
        serde_json::to_value(&keys).unwrap(),
        serde_json::from_slice::<Value>(&keys_bytes).unwrap(),
        "agent-keys round trip"
    );
    assert_eq!(
        AgentKeys::from_json(&canonicalize(&keys).unwrap()).unwrap(),
        keys
    );

    let head_bytes = fs::read(dir.join("head.json")).unwrap();
    let head_value: Value = serde_json::from_slice(&head_bytes).unwrap();
    assert_valid(&validator("head.schema.json"), &head_value, "head");
    let head = Head::from_json(&head_bytes).unwrap();
    assert_eq!(serde_json::to_value(&head).unwrap(), head_value);

    let mut refused = 0;
    for e in fs::read_dir(&refused_dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("refused-") {
            continue;
        }
        let case = read_json(&path);
        let bytes = canonicalize(&case["input"]).unwrap();
        let err = match case["document"].as_str().unwrap() {
            "agent-keys" => AgentKeys::from_json(&bytes).map(|_| ()),
            "head" => Head::from_json(&bytes).map(|_| ()),
            other => panic!("{name}: unknown document {other}"),
        }
        .expect_err(&name);
        assert_eq!(
            err.code(),
            case["expect"].as_str().unwrap(),
            "{name}: {err}"
        );
        refused += 1;
    }
    assert_eq!(refused, 3, "refused agent-keys and head fixtures");
}

#[test]
fn hash_fixtures() {
    let dir = root().join("testdata/golden/hashes");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let (mut salted, mut digests) = (0, 0);
    for f in &files {
        let case = read_json(f);
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(case["expect"], "valid", "{name}");
        if let Some(salt_hex) = case["salt_hex"].as_str() {
            let salt: [u8; 16] = hex::decode(salt_hex).unwrap().try_into().unwrap();
            let canonical = canonicalize(&case["content"]).unwrap();
            assert_eq!(
                canonical,
                case["canonical_content"].as_str().unwrap().as_bytes(),
                "{name}"
            );
            assert_eq!(
                salted_hash(&salt, &canonical).to_hex(),
                case["hash"].as_str().unwrap(),
                "{name}"
            );
            salted += 1;
        } else {
            let definition = &case["definition"];
            assert_eq!(
                canonicalize(definition).unwrap(),
                case["canonical"].as_str().unwrap().as_bytes(),
                "{name}"
            );
            let (tool, digest, parts) = digest_tool_definition(definition).unwrap();
            assert_eq!(tool, case["name"].as_str().unwrap(), "{name}");
            assert_eq!(digest.to_hex(), case["digest"].as_str().unwrap(), "{name}");
            assert_eq!(
                serde_json::to_value(&parts).unwrap(),
                case["parts"],
                "{name}"
            );
            digests += 1;
        }
    }
    assert_eq!(
        (salted, digests),
        (4, 2),
        "salted hash and tool digest fixtures"
    );
}
