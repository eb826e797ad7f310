//! The log's JSON answers, as a real `tally serve` gives them, validate
//! against their JSON Schemas (docs/protocol.md §4.5 and §7.5:
//! schemas/json/key-directory, consistency-proof, inclusion-proof), and the
//! monitor's strict reader accepts the consistency answer.

use std::path::Path;

use rand_core::OsRng;
use serde_json::{json, Value};
use tally_schemas::note::{open_checkpoint, NoteVerifier};
use tally_schemas::record::NoteBody;
use tally_schemas::tree::verify_consistency;
use tally_schemas::{AgentName, Body, Hash, Nonce, SecretKey, Seq, UnixMillis, UnsignedRecord};
use tally_verifier::monitor::parse_consistency_proof;

mod common;

use common::Server;

fn validator(name: &str) -> jsonschema::Validator {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("schemas/json")
        .join(name);
    let schema: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    jsonschema::validator_for(&schema).unwrap()
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
