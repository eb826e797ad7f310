//! The HTTP APIs' JSON bodies (tally_schemas::api; docs/api.md, and
//! docs/protocol.md §4.5 and §7.5) on fixtures: every accepted fixture
//! parses into its type, writes back to the same JSON, and validates
//! against its JSON Schema in schemas/json with a real validator; every
//! refused fixture is refused by the type with a message that names the
//! rule, and by the schema where a schema can say so. Real server output is
//! checked in tests/it/wire_schemas.rs.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tally_schemas::api::{
    AddAgentRequest, AgentHead, AgentList, ApiBody, ApiKeyRevoked, ConsistencyProofAnswer,
    CreateProjectRequest, CreateReadTokenRequest, ErrorBody, ErrorBodyError, InclusionProofAnswer,
    KeyDirectory, NewApiKey, NewReadToken, ProjectList, ReadTokenList, ReadTokenRevoked,
    RegisteredAgent, RetireRequest, RotateKeyRequest,
};
use tally_schemas::note::NoteSigner;
use tally_schemas::{Hash, SecretKey};

const SCHEMA_BASE: &str = "https://schemas.tally.invalid/v1/";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
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

fn validator(name: &str) -> jsonschema::Validator {
    let mut map = HashMap::new();
    for e in fs::read_dir(root().join("schemas/json")).unwrap() {
        let p = e.unwrap().path();
        let file = p.file_name().unwrap().to_str().unwrap().to_owned();
        let value: Value = serde_json::from_slice(&fs::read(&p).unwrap()).unwrap();
        map.insert(format!("{SCHEMA_BASE}{file}"), value);
    }
    let schema = map[&format!("{SCHEMA_BASE}{name}")].clone();
    jsonschema::options()
        .with_retriever(LocalSchemas(map))
        .build(&schema)
        .unwrap_or_else(|e| panic!("{name} is not a valid schema: {e}"))
}

/// Parses with `T` and writes it back as JSON.
fn typed<T: ApiBody>(bytes: &[u8]) -> Result<Value, String> {
    T::from_json(bytes)
        .map(|t| serde_json::to_value(&t).unwrap())
        .map_err(|e| e.to_string())
}

fn error_body(bytes: &[u8]) -> Result<Value, String> {
    ErrorBody::from_json(bytes)
        .map(|t| serde_json::to_value(&t).unwrap())
        .map_err(|e| e.to_string())
}

fn key_directory(bytes: &[u8]) -> Result<Value, String> {
    KeyDirectory::from_json(bytes)
        .map(|t| serde_json::to_value(&t).unwrap())
        .map_err(|e| e.to_string())
}

fn consistency(bytes: &[u8]) -> Result<Value, String> {
    ConsistencyProofAnswer::from_json(bytes)
        .map(|t| serde_json::to_value(&t).unwrap())
        .map_err(|e| e.to_string())
}

fn inclusion(bytes: &[u8]) -> Result<Value, String> {
    InclusionProofAnswer::from_json(bytes)
        .map(|t| serde_json::to_value(&t).unwrap())
        .map_err(|e| e.to_string())
}

/// One body: its schema, its parser, fixtures it accepts and fixtures it
/// refuses (with words the refusal must hold, and whether the schema can
/// refuse it too).
struct Body {
    schema: &'static str,
    parse: fn(&[u8]) -> Result<Value, String>,
    good: Vec<Value>,
    bad: Vec<(String, &'static str, bool)>,
}

/// `good` with one member changed (`None` removes it).
fn with(good: &Value, path: &[&str], new: Option<Value>) -> String {
    let mut v = good.clone();
    let mut at = &mut v;
    for p in &path[..path.len() - 1] {
        at = if let Ok(i) = p.parse::<usize>() {
            &mut at[i]
        } else {
            &mut at[*p]
        };
    }
    let last = path[path.len() - 1];
    let obj = at.as_object_mut().unwrap();
    match new {
        Some(x) => {
            obj.insert(last.to_owned(), x);
        }
        None => {
            obj.remove(last);
        }
    }
    v.to_string()
}

fn hash(i: u8) -> String {
    Hash::sha256(&[i]).to_hex()
}

const T0: &str = "2026-11-30T08:00:00.000Z";
const T1: &str = "2026-12-01T08:00:00.000Z";

fn bodies() -> Vec<Body> {
    let key = SecretKey::from_seed(&[3; 32]).public_key();
    let key2 = SecretKey::from_seed(&[4; 32]).public_key();
    let agent_key = |k: &tally_schemas::PublicKey, not_after: Value| json!({"key_id": k.key_id(), "public_key": k, "not_before": T0, "not_after": not_after});
    let agent = json!({"agent": "claims-bot", "project": "default",
        "keys": [agent_key(&key, json!(T1)), agent_key(&key2, Value::Null)]});
    let log = |seed: u8| {
        NoteSigner::from_secret("tally.local/log", SecretKey::from_seed(&[seed; 32]))
            .unwrap()
            .verifier()
            .vkey()
    };
    let directory = json!({"v": 1, "origin": "tally.local/log", "keys": [
        {"vkey": log(1), "not_before": T0, "not_after": T1},
        {"vkey": log(2), "not_before": T1, "not_after": null}]});
    let api_key = format!("tally_{}_{}", "0123456789abcdef", "ab".repeat(24));
    let read_token = format!("tallyread_{}_{}", "fedcba9876543210", "cd".repeat(24));
    let conflict = json!({"error": {"code": "chain_conflict", "message": "resync",
        "agent": "claims-bot", "head": {"seq": 4, "hash": hash(1)}}});
    let skew = json!({"error": {"code": "key_not_active", "message": "m", "agent": "claims-bot",
        "key_id": key.key_id(), "time": T1, "not_before": T0, "not_after": null}});
    let consistency_answer = json!({"v": 1, "from": 3, "to": 7, "consistency": [hash(1), hash(2)]});
    let inclusion_answer =
        json!({"v": 1, "index": 5, "size": 21, "leaf_hash": hash(0), "inclusion": [hash(1)]});
    vec![
        Body {
            schema: "api-error.schema.json",
            parse: error_body,
            good: vec![
                conflict.clone(),
                json!({"error": {"code": "chain_conflict", "message": "m", "agent": "a", "head": null}}),
                skew.clone(),
                json!({"error": {"code": "overloaded", "message": "busy"}}),
                json!({"error": {"code": "nonce_replayed", "message": "m",
                    "nonce": "00112233445566778899aabbccddeeff", "first_index": 3}}),
                json!({"error": {"code": "retroactive_key_change", "message": "m", "agent": "a",
                    "at": T0, "earliest_at": T1, "latest_record_time": null}}),
                json!({"error": {"code": "exists", "message": "m", "what": "project", "name": "team-a"}}),
                json!({"error": {"code": "malformed", "message": "m", "reason": "duplicate_key"}}),
                json!({"error": {"code": "unsupported_version", "message": "m", "found": "2", "supported": 1}}),
            ],
            bad: vec![
                (with(&conflict, &["error", "extra"], Some(json!(1))), "unknown field `extra`", true),
                (with(&conflict, &["error", "head", "seq"], Some(json!("4"))), "invalid type", true),
                (with(&conflict, &["error", "head", "hash"], Some(json!("AB"))), "64 lowercase hex", true),
                (with(&skew, &["error", "time"], Some(json!("2026-11-30T08:00:00Z"))), "time", true),
                (with(&skew, &["error", "message"], None), "not an error body", true),
                (r#"{"error":"busy"}"#.to_owned(), "not an error body", true),
            ],
        },
        Body {
            schema: "key-directory.schema.json",
            parse: key_directory,
            good: vec![directory.clone()],
            bad: vec![
                (with(&directory, &["keys", "1", "not_after"], None), "not_after", true),
                (with(&directory, &["v"], Some(json!(2))), "version 2", true),
                (with(&directory, &["keys"], Some(json!([]))), "keys is empty", true),
                (
                    with(&directory, &["origin"], Some(json!("other.log"))),
                    "not named after the origin",
                    false, // a schema cannot compare the names
                ),
            ],
        },
        Body {
            schema: "consistency-proof.schema.json",
            parse: consistency,
            good: vec![consistency_answer.clone()],
            bad: vec![
                (with(&consistency_answer, &["from"], Some(json!(0))), "1 <= from <= to", true),
                (with(&consistency_answer, &["x"], Some(json!(0))), "unknown field `x`", true),
            ],
        },
        Body {
            schema: "inclusion-proof.schema.json",
            parse: inclusion,
            good: vec![inclusion_answer.clone()],
            bad: vec![
                (with(&inclusion_answer, &["size"], Some(json!(0))), "not below size", true),
                (with(&inclusion_answer, &["v"], None), "missing field `v`", true),
            ],
        },
        Body {
            schema: "api-agent-add.schema.json",
            parse: typed::<AddAgentRequest>,
            good: vec![
                json!({"agent": "claims-bot", "public_key": key}),
                json!({"agent": "claims-bot", "public_key": key, "not_before": T0}),
            ],
            bad: vec![
                (json!({"public_key": key}).to_string(), "missing field `agent`", true),
                (json!({"agent": "-bad", "public_key": key}).to_string(), "agent", true),
                (json!({"agent": "a", "public_key": key, "x": 1}).to_string(), "unknown field `x`", true),
                (json!({"agent": "a", "public_key": key, "not_before": 5}).to_string(), "invalid type", true),
            ],
        },
        Body {
            schema: "api-agent-rotate.schema.json",
            parse: typed::<RotateKeyRequest>,
            good: vec![json!({"public_key": key2}), json!({"public_key": key2, "at": T1})],
            bad: vec![(json!({"at": T1}).to_string(), "missing field `public_key`", true)],
        },
        Body {
            schema: "api-agent-retire.schema.json",
            parse: typed::<RetireRequest>,
            good: vec![json!({}), json!({"at": T1})],
            bad: vec![(json!({"when": T1}).to_string(), "unknown field `when`", true)],
        },
        Body {
            schema: "api-agent.schema.json",
            parse: typed::<RegisteredAgent>,
            good: vec![agent.clone()],
            bad: vec![
                (with(&agent, &["keys", "1", "not_after"], None), "not_after", true),
                (with(&agent, &["keys", "0", "key_id"], Some(json!("00"))), "key", true),
                (with(&agent, &["extra"], Some(json!(true))), "unknown field `extra`", true),
            ],
        },
        Body {
            schema: "api-agent-list.schema.json",
            parse: typed::<AgentList>,
            good: vec![json!({"agents": [agent.clone()]}), json!({"agents": []})],
            bad: vec![(json!({"agents": [agent.clone()], "next": null}).to_string(), "unknown field `next`", true)],
        },
        Body {
            schema: "api-agent-head.schema.json",
            parse: typed::<AgentHead>,
            good: vec![json!({"agent": "claims-bot", "seq": 12, "hash": hash(3), "index": 41})],
            bad: vec![
                (json!({"agent": "claims-bot", "seq": 12, "hash": hash(3)}).to_string(), "missing field `index`", true),
                (json!({"agent": "claims-bot", "seq": 9007199254740992u64, "hash": hash(3), "index": 1}).to_string(), "9007199254740992", true),
            ],
        },
        Body {
            schema: "api-project-create.schema.json",
            parse: typed::<CreateProjectRequest>,
            good: vec![json!({"name": "team-a"})],
            bad: vec![(json!({"name": 7}).to_string(), "invalid type", true)],
        },
        Body {
            schema: "api-new-api-key.schema.json",
            parse: typed::<NewApiKey>,
            good: vec![json!({"project": "team-a", "api_key": api_key, "api_key_id": "0123456789abcdef"})],
            bad: vec![(json!({"project": "team-a", "api_key": api_key}).to_string(), "missing field `api_key_id`", true)],
        },
        Body {
            schema: "api-project-list.schema.json",
            parse: typed::<ProjectList>,
            good: vec![json!({"projects": [{"name": "default", "created": T0, "agents": 2}]})],
            bad: vec![
                (json!({"projects": [{"name": "default", "created": T0}]}).to_string(), "missing field `agents`", true),
                (json!({"projects": [{"name": "default", "created": T0, "agents": -1}]}).to_string(), "invalid value", true),
            ],
        },
        Body {
            schema: "api-api-key-revoked.schema.json",
            parse: typed::<ApiKeyRevoked>,
            good: vec![json!({"api_key_id": "0123456789abcdef", "revoked": true})],
            bad: vec![(json!({"api_key_id": "0123456789abcdef", "revoked": "yes"}).to_string(), "invalid type", true)],
        },
        Body {
            schema: "api-read-token-create.schema.json",
            parse: typed::<CreateReadTokenRequest>,
            good: vec![json!({"label": "monitor at example.org"}), json!({"label": ""})],
            bad: vec![(json!({"label": null}).to_string(), "invalid type", true)],
        },
        Body {
            schema: "api-new-read-token.schema.json",
            parse: typed::<NewReadToken>,
            good: vec![json!({"read_token": read_token, "read_token_id": "fedcba9876543210", "label": "auditor"})],
            bad: vec![(json!({"read_token": read_token, "label": "auditor"}).to_string(), "missing field `read_token_id`", true)],
        },
        Body {
            schema: "api-read-token-list.schema.json",
            parse: typed::<ReadTokenList>,
            good: vec![json!({"read_tokens": [
                {"id": "fedcba9876543210", "label": "auditor", "created": T0, "revoked": null},
                {"id": "0123456789abcdef", "label": "", "created": T0, "revoked": T1}]})],
            bad: vec![(
                json!({"read_tokens": [{"id": "fedcba9876543210", "label": "a", "created": T0}]}).to_string(),
                "missing field `revoked`",
                true,
            )],
        },
        Body {
            schema: "api-read-token-revoked.schema.json",
            parse: typed::<ReadTokenRevoked>,
            good: vec![json!({"read_token_id": "fedcba9876543210", "revoked": true})],
            bad: vec![(json!({"read_token_id": "fedcba9876543210"}).to_string(), "missing field `revoked`", true)],
        },
    ]
}

#[test]
fn every_body_reads_its_fixtures_as_its_schema_says() {
    let mut checked = 0;
    for body in bodies() {
        let schema = validator(body.schema);
        for good in &body.good {
            let errors: Vec<String> = schema.iter_errors(good).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{}: {good}: {errors:?}", body.schema);
            let read = (body.parse)(good.to_string().as_bytes())
                .unwrap_or_else(|e| panic!("{}: {good}: {e}", body.schema));
            assert_eq!(&read, good, "{}: round trip", body.schema);
            // Any white space and member order read the same (§2).
            let pretty = serde_json::to_vec_pretty(good).unwrap();
            assert_eq!((body.parse)(&pretty).unwrap(), read, "{}", body.schema);
            checked += 1;
        }
        for (bad, words, schema_refuses) in &body.bad {
            let err = (body.parse)(bad.as_bytes())
                .expect_err(&format!("{}: {bad} must be refused", body.schema));
            assert!(
                err.contains(words),
                "{}: {bad}: {err:?} should say {words:?}",
                body.schema
            );
            let value: Value = serde_json::from_str(bad).unwrap();
            assert_eq!(
                !schema.is_valid(&value),
                *schema_refuses,
                "{}: {bad}: the schema's verdict",
                body.schema
            );
            checked += 1;
        }
        // A duplicate member is refused by every parser (§2), which a
        // schema cannot see.
        let first = body.good[0].to_string();
        let dup = first.replacen('{', "{\"dup\":1,\"dup\":2,", 1);
        let err = (body.parse)(dup.as_bytes()).unwrap_err();
        assert!(err.contains("duplicate"), "{}: {err}", body.schema);
    }
    assert!(checked > 60, "{checked} fixtures");
}

#[test]
fn every_api_schema_is_used_here() {
    let used: Vec<&str> = bodies().iter().map(|b| b.schema).collect();
    for e in fs::read_dir(root().join("schemas/json")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if name.starts_with("api-") {
            assert!(used.contains(&name.as_str()), "{name} has no fixtures");
        }
    }
}

#[test]
fn an_error_body_with_wrong_evidence_keeps_its_code() {
    let bad = r#"{"error":{"code":"clock_skew","message":"late","agent_time":"yesterday"}}"#;
    match ErrorBody::from_json(bad.as_bytes()) {
        Err(ErrorBodyError::Malformed { code, message, .. }) => {
            assert_eq!((code.as_str(), message.as_str()), ("clock_skew", "late"));
        }
        other => panic!("{other:?}"),
    }
}
