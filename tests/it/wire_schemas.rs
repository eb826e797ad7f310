//! The JSON answers of a real `tally serve` validate against their JSON
//! Schemas in schemas/json and are read by their tally_schemas::api types:
//! the log's (docs/protocol.md §4.5 and §7.5: key-directory,
//! consistency-proof, inclusion-proof; the monitor's strict reader accepts
//! the consistency answer), and the agent and admin API's answers and error
//! bodies (docs/api.md: api-*.schema.json).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rand_core::OsRng;
use serde_json::{json, Value};
use tally_schemas::api::{
    AddAgentRequest, AgentHead, AgentList, ApiBody, ApiKeyRevoked, CreateProjectRequest,
    CreateReadTokenRequest, ErrorBody, ErrorDetail, NewApiKey, NewReadToken, ProjectList,
    ReadTokenList, ReadTokenRevoked, RegisteredAgent, RetireRequest, RotateKeyRequest,
};
use tally_schemas::note::{open_checkpoint, NoteVerifier};
use tally_schemas::record::NoteBody;
use tally_schemas::tree::verify_consistency;
use tally_schemas::{AgentName, Body, Hash, Nonce, SecretKey, Seq, UnixMillis, UnsignedRecord};
use tally_verifier::monitor::parse_consistency_proof;

use crate::common;

use common::Server;

const SCHEMA_BASE: &str = "https://schemas.tally.invalid/v1/";

fn schema_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/json")
}

/// Serves schemas/json/*.schema.json for `$ref`s (defs.schema.json), and
/// nothing else: no schema is fetched from the network.
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
    for e in std::fs::read_dir(schema_dir()).unwrap() {
        let p = e.unwrap().path();
        let file = p.file_name().unwrap().to_str().unwrap().to_owned();
        let value: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        map.insert(format!("{SCHEMA_BASE}{file}"), value);
    }
    let schema = map[&format!("{SCHEMA_BASE}{name}")].clone();
    jsonschema::options()
        .with_retriever(LocalSchemas(map))
        .build(&schema)
        .unwrap_or_else(|e| panic!("{name} is not a valid schema: {e}"))
}

fn assert_valid(name: &str, value: &Value) {
    let v = validator(name);
    let errors: Vec<String> = v
        .iter_errors(value)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{name}: {value}: {errors:#?}");
}

async fn get(http: &reqwest::Client, url: &str) -> (u16, Vec<u8>) {
    let resp = http.get(url).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.bytes().await.unwrap().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_answers_validate_against_their_schemas() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&tmp.path().join("data"), &[]);
    let url = server.url.clone();
    let api_key = server.banner_value("API key");
    let log_key = NoteVerifier::from_vkey(&server.banner_value("witness key")).unwrap();
    let http = reqwest::Client::new();

    // The key directory.
    let (status, body) = get(&http, &format!("{url}/.well-known/tally/keys")).await;
    assert_eq!(status, 200);
    let dir: Value = serde_json::from_slice(&body).unwrap();
    assert_valid("key-directory.schema.json", &dir);
    assert_eq!(dir["origin"], log_key.name());
    assert_eq!(dir["keys"][0]["vkey"], log_key.vkey());

    // Three records, so that there are proofs to ask for.
    let key = SecretKey::generate(&mut OsRng);
    let agent = AgentName::new("schema-bot").unwrap();
    let r = http
        .post(format!("{url}/v1/agents"))
        .bearer_auth(&api_key)
        .json(&json!({"agent": agent, "public_key": key.public_key(),
            "not_before": UnixMillis::new(UnixMillis::now().as_millis() - 3_600_000)}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let mut prev: Option<Hash> = None;
    for seq in 0..3u64 {
        let record = UnsignedRecord {
            agent: agent.clone(),
            key_id: key.public_key().key_id(),
            seq: Seq::new(seq).unwrap(),
            prev,
            time: UnixMillis::now(),
            nonce: Nonce::random(&mut OsRng),
            body: Body::Note(NoteBody {
                text: format!("note {seq}"),
            }),
        }
        .sign(&key)
        .unwrap();
        let resp = common::post_record(&http, &url, &api_key, &record)
            .await
            .unwrap();
        assert_eq!(
            resp.status().as_u16(),
            200,
            "{}",
            resp.text().await.unwrap()
        );
        prev = Some(record.hash());
    }
    let (_, note) = get(&http, &format!("{url}/checkpoint")).await;
    let cp = open_checkpoint(std::str::from_utf8(&note).unwrap(), &log_key).unwrap();
    assert_eq!(cp.size.get(), 3);

    // Consistency, with `to` given and left out, and for equal sizes.
    for (query, from, to) in [
        ("from=1&to=3", 1u64, 3u64),
        ("from=2", 2, 3),
        ("from=3&to=3", 3, 3),
    ] {
        let (status, body) = get(&http, &format!("{url}/v1/proof/consistency?{query}")).await;
        assert_eq!(status, 200, "{query}");
        let value: Value = serde_json::from_slice(&body).unwrap();
        assert_valid("consistency-proof.schema.json", &value);
        let proof = parse_consistency_proof(&body, from, to).unwrap_or_else(|e| panic!("{e}"));
        if from == to {
            assert!(proof.is_empty());
        }
    }
    // A proof from 1 to 3 joins the first record's tree to the checkpoint.
    let (_, body) = get(&http, &format!("{url}/v1/proof/inclusion?index=0&size=1")).await;
    let one: Value = serde_json::from_slice(&body).unwrap();
    assert_valid("inclusion-proof.schema.json", &one);
    let root1: Hash = serde_json::from_value(one["leaf_hash"].clone()).unwrap();
    let (_, body) = get(&http, &format!("{url}/v1/proof/consistency?from=1&to=3")).await;
    let proof = parse_consistency_proof(&body, 1, 3).unwrap();
    verify_consistency(
        tally_schemas::TreeSize::new(1),
        cp.size,
        &root1,
        &cp.root,
        &proof,
    )
    .unwrap();

    // Inclusion by index and by leaf hash.
    for query in [
        "index=2".to_owned(),
        "index=0&size=2".to_owned(),
        format!("leaf_hash={root1}"),
    ] {
        let (status, body) = get(&http, &format!("{url}/v1/proof/inclusion?{query}")).await;
        assert_eq!(status, 200, "{query}");
        assert_valid(
            "inclusion-proof.schema.json",
            &serde_json::from_slice(&body).unwrap(),
        );
    }
}

/// One request to the witness: its status and body.
async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    token: &str,
    body: Option<&Value>,
) -> (u16, Vec<u8>) {
    let mut req = http.request(method, url).bearer_auth(token);
    if let Some(body) = body {
        req = req.body(body.to_string());
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.bytes().await.unwrap().to_vec())
}

/// A request body we send validates against its schema and is read by its
/// type (the witness reads it with the same type).
fn request<T: ApiBody>(schema: &str, body: Value) -> Value {
    assert_valid(schema, &body);
    T::from_json(body.to_string().as_bytes()).unwrap_or_else(|e| panic!("{schema}: {e}"));
    body
}

/// An answer: the expected status, canonical JSON (api.md "Errors",
/// "Conventions"), valid against `schema`, read strictly by `T`, which
/// writes it back as the same JSON.
fn answer<T: ApiBody>(schema: &str, status: u16, expected: u16, bytes: &[u8]) -> T {
    let text = String::from_utf8_lossy(bytes);
    assert_eq!(status, expected, "{schema}: {text}");
    let value: Value = serde_json::from_slice(bytes).unwrap();
    assert_eq!(
        tally_schemas::canonical::canonicalize(&value).unwrap(),
        bytes,
        "{schema}: not in canonical form: {text}"
    );
    assert_valid(schema, &value);
    let typed = T::from_json(bytes).unwrap_or_else(|e| panic!("{schema}: {text}: {e}"));
    assert_eq!(serde_json::to_value(&typed).unwrap(), value, "{schema}");
    typed
}

/// An error answer: the status and code expected, valid against
/// api-error.schema.json and read strictly (evidence included) by
/// [`ErrorBody`].
fn refusal(status: u16, expected: (u16, &str), bytes: &[u8]) -> ErrorDetail {
    let text = String::from_utf8_lossy(bytes);
    assert_eq!(status, expected.0, "{text}");
    let value: Value = serde_json::from_slice(bytes).unwrap();
    assert_valid("api-error.schema.json", &value);
    let body = ErrorBody::from_json(bytes).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(body.error.code, expected.1, "{text}");
    assert_eq!(serde_json::to_value(&body).unwrap(), value);
    body.error
}

fn note(key: &SecretKey, agent: &AgentName, seq: u64, prev: Option<Hash>) -> tally_schemas::Record {
    UnsignedRecord {
        agent: agent.clone(),
        key_id: key.public_key().key_id(),
        seq: Seq::new(seq).unwrap(),
        prev,
        time: UnixMillis::now(),
        nonce: Nonce::random(&mut OsRng),
        body: Body::Note(NoteBody {
            text: format!("note {seq}"),
        }),
    }
    .sign(key)
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_api_answers_validate_against_their_schemas() {
    use reqwest::Method;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let server = Server::start(&data, &[]);
    let url = server.url.clone();
    let api_key = server.banner_value("API key");
    let admin = std::fs::read_to_string(data.join("admin.token"))
        .unwrap()
        .trim()
        .to_owned();
    let http = reqwest::Client::new();
    let post = Method::POST;
    let get = Method::GET;

    // Agents and their keys (api.md "Agents and their keys").
    let key = SecretKey::generate(&mut OsRng);
    let agent = AgentName::new("admin-bot").unwrap();
    let hour_ago = UnixMillis::new(UnixMillis::now().as_millis() - 3_600_000);
    let add = request::<AddAgentRequest>(
        "api-agent-add.schema.json",
        json!({"agent": agent, "public_key": key.public_key(), "not_before": hour_ago}),
    );
    let (s, b) = call(
        &http,
        post.clone(),
        &format!("{url}/v1/agents"),
        &api_key,
        Some(&add),
    )
    .await;
    let added: RegisteredAgent = answer("api-agent.schema.json", s, 201, &b);
    assert_eq!((added.agent.as_str(), added.keys.len()), ("admin-bot", 1));
    let (s, b) = call(
        &http,
        post.clone(),
        &format!("{url}/v1/agents"),
        &api_key,
        Some(&add),
    )
    .await;
    let exists = refusal(s, (409, "exists"), &b);
    assert_eq!(exists.name.as_deref(), Some("admin-bot"));
    let (s, b) = call(
        &http,
        get.clone(),
        &format!("{url}/v1/agents"),
        &api_key,
        None,
    )
    .await;
    let list: AgentList = answer("api-agent-list.schema.json", s, 200, &b);
    assert!(list.agents.contains(&added));

    // The agent head, before and after a record; a chain conflict's head.
    let head_url = format!("{url}/v1/agents/{agent}/head");
    let (s, b) = call(&http, get.clone(), &head_url, &api_key, None).await;
    let none = refusal(s, (404, "no_records"), &b);
    assert_eq!(none.agent.as_ref(), Some(&agent));
    let first = note(&key, &agent, 0, None);
    let resp = common::post_record(&http, &url, &api_key, &first)
        .await
        .unwrap();
    assert_eq!(
        resp.status().as_u16(),
        200,
        "{}",
        resp.text().await.unwrap()
    );
    let (s, b) = call(&http, get.clone(), &head_url, &api_key, None).await;
    let head: AgentHead = answer("api-agent-head.schema.json", s, 200, &b);
    assert_eq!((head.seq.get(), head.hash), (0, first.hash()));
    let again = note(&key, &agent, 0, None);
    let resp = common::post_record(&http, &url, &api_key, &again)
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let conflict = refusal(
        status,
        (409, "chain_conflict"),
        &resp.bytes().await.unwrap(),
    );
    let conflict_head = conflict.head.flatten().expect("the head");
    assert_eq!(
        (conflict_head.seq, conflict_head.hash),
        (head.seq, head.hash)
    );

    // Rotate, then a retroactive retirement (refused, with its evidence),
    // then retire.
    let key2 = SecretKey::generate(&mut OsRng);
    let rotate = request::<RotateKeyRequest>(
        "api-agent-rotate.schema.json",
        json!({"public_key": key2.public_key()}),
    );
    let (s, b) = call(
        &http,
        post.clone(),
        &format!("{url}/v1/agents/{agent}/rotate"),
        &api_key,
        Some(&rotate),
    )
    .await;
    let rotated: RegisteredAgent = answer("api-agent.schema.json", s, 200, &b);
    assert_eq!(rotated.keys.len(), 2);
    assert!(rotated.keys[0].not_after.is_some() && rotated.keys[1].not_after.is_none());
    let retire_url = format!("{url}/v1/agents/{agent}/retire");
    let back = request::<RetireRequest>("api-agent-retire.schema.json", json!({"at": hour_ago}));
    let (s, b) = call(&http, post.clone(), &retire_url, &api_key, Some(&back)).await;
    let retro = refusal(s, (409, "retroactive_key_change"), &b);
    assert_eq!(retro.at, Some(hour_ago));
    assert!(retro.earliest_at.is_some() && retro.latest_record_time.flatten().is_some());
    let retire = request::<RetireRequest>("api-agent-retire.schema.json", json!({}));
    let (s, b) = call(&http, post.clone(), &retire_url, &api_key, Some(&retire)).await;
    let retired: RegisteredAgent = answer("api-agent.schema.json", s, 200, &b);
    assert!(retired.keys.iter().all(|k| k.not_after.is_some()));

    // A malformed request's refusal.
    let (s, b) = call(
        &http,
        post.clone(),
        &format!("{url}/v1/agents"),
        &api_key,
        Some(&json!({"agent": "x", "extra": 1})),
    )
    .await;
    let malformed = refusal(s, (400, "malformed"), &b);
    assert_eq!(malformed.reason.as_deref(), Some("schema"));

    // Projects and API keys (admin token).
    let create = request::<CreateProjectRequest>(
        "api-project-create.schema.json",
        json!({"name": "team-a"}),
    );
    let (s, b) = call(
        &http,
        post.clone(),
        &format!("{url}/v1/projects"),
        &admin,
        Some(&create),
    )
    .await;
    let made: NewApiKey = answer("api-new-api-key.schema.json", s, 201, &b);
    assert!(made
        .api_key
        .starts_with(&format!("tally_{}_", made.api_key_id)));
    let (s, b) = call(
        &http,
        post.clone(),
        &format!("{url}/v1/projects"),
        &admin,
        Some(&create),
    )
    .await;
    refusal(s, (409, "exists"), &b);
    let (s, b) = call(
        &http,
        get.clone(),
        &format!("{url}/v1/projects"),
        &admin,
        None,
    )
    .await;
    let projects: ProjectList = answer("api-project-list.schema.json", s, 200, &b);
    let names: Vec<&str> = projects.projects.iter().map(|p| p.name.as_str()).collect();
    assert!(
        names.contains(&"team-a") && names.contains(&"default"),
        "{names:?}"
    );
    let (s, b) = call(
        &http,
        post.clone(),
        &format!("{url}/v1/projects/team-a/api-keys"),
        &admin,
        None,
    )
    .await;
    let second: NewApiKey = answer("api-new-api-key.schema.json", s, 201, &b);
    let (s, b) = call(
        &http,
        post.clone(),
        &format!("{url}/v1/api-keys/{}/revoke", second.api_key_id),
        &admin,
        None,
    )
    .await;
    let revoked: ApiKeyRevoked = answer("api-api-key-revoked.schema.json", s, 200, &b);
    assert_eq!(
        (revoked.api_key_id, revoked.revoked),
        (second.api_key_id, true)
    );
    let (s, b) = call(
        &http,
        get.clone(),
        &format!("{url}/v1/projects"),
        &api_key,
        None,
    )
    .await;
    refusal(s, (401, "unauthorized"), &b);

    // Read tokens (admin token), with a label and without a body.
    let labelled = request::<CreateReadTokenRequest>(
        "api-read-token-create.schema.json",
        json!({"label": "auditor"}),
    );
    let (s, b) = call(
        &http,
        post.clone(),
        &format!("{url}/v1/read-tokens"),
        &admin,
        Some(&labelled),
    )
    .await;
    let token: NewReadToken = answer("api-new-read-token.schema.json", s, 201, &b);
    assert_eq!(token.label, "auditor");
    let (s, b) = call(
        &http,
        post.clone(),
        &format!("{url}/v1/read-tokens"),
        &admin,
        None,
    )
    .await;
    let unlabelled: NewReadToken = answer("api-new-read-token.schema.json", s, 201, &b);
    assert_eq!(unlabelled.label, "");
    let (s, b) = call(
        &http,
        post.clone(),
        &format!("{url}/v1/read-tokens/{}/revoke", token.read_token_id),
        &admin,
        None,
    )
    .await;
    let gone: ReadTokenRevoked = answer("api-read-token-revoked.schema.json", s, 200, &b);
    assert!(gone.revoked);
    let (s, b) = call(
        &http,
        get.clone(),
        &format!("{url}/v1/read-tokens"),
        &admin,
        None,
    )
    .await;
    let tokens: ReadTokenList = answer("api-read-token-list.schema.json", s, 200, &b);
    let revoked_of = |id: &str| {
        tokens
            .read_tokens
            .iter()
            .find(|t| t.id == id)
            .map(|t| t.revoked.is_some())
    };
    assert_eq!(revoked_of(&token.read_token_id), Some(true));
    assert_eq!(revoked_of(&unlabelled.read_token_id), Some(false));
}
