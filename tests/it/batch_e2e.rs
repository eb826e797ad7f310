//! `POST /v1/records/batch` (docs/api.md; docs/protocol.md §8.1) through the
//! real `tally serve` on loopback: several agents in one batch, a refused
//! record in the middle and the agent's later records refused with
//! `prior_record_refused`, one checkpoint for the batch with a proof for
//! each receipt, a whole batch resubmitted (the same receipts byte for
//! byte), malformed members answered in their place, over-limit batches,
//! and the request and answer against their JSON Schemas.

use std::path::Path;

use rand_core::OsRng;
use serde_json::Value;
use tally_schemas::batch::{BatchAnswer, BatchOutcome, BatchRequest};
use tally_schemas::note::{open_checkpoint, NoteVerifier};
use tally_schemas::tree::verify_inclusion;
use tally_schemas::{Entry, Receipt, Record, SecretKey, UnsignedRecord};

use crate::common;

use common::agent::Agent;
use common::Server;

fn validator(name: &str) -> jsonschema::Validator {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/json");
    let schema: Value = serde_json::from_slice(&std::fs::read(dir.join(name)).unwrap()).unwrap();
    jsonschema::options()
        .with_retriever(Local(dir))
        .build(&schema)
        .unwrap()
}

/// Resolves `defs.schema.json` and the other schemas from schemas/json.
struct Local(std::path::PathBuf);

impl jsonschema::Retrieve for Local {
    fn retrieve(
        &self,
        uri: &jsonschema::Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        let file = uri.path().as_str().rsplit('/').next().unwrap_or("");
        Ok(serde_json::from_slice(&std::fs::read(self.0.join(file))?)?)
    }
}

fn assert_valid(name: &str, value: &Value) {
    let v = validator(name);
    let errors: Vec<String> = v
        .iter_errors(value)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{name}: {errors:#?}");
}

/// Posts a batch body; the status and the answer's bytes.
pub(crate) async fn post_batch(
    http: &reqwest::Client,
    url: &str,
    api_key: &str,
    body: Vec<u8>,
) -> (u16, Vec<u8>) {
    let resp = http
        .post(format!("{url}/v1/records/batch"))
        .bearer_auth(api_key)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.bytes().await.unwrap().to_vec())
}

fn error_code(body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap();
    v["error"]["code"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_several_agents_is_answered_record_by_record() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&tmp.path().join("data"), &[]);
    let url = server.url.clone();
    let api_key = server.banner_value("API key");
    let log_key = NoteVerifier::from_vkey(&server.banner_value("witness key")).unwrap();
    let http = reqwest::Client::new();

    let mut a = Agent::new("batch-a");
    let mut b = Agent::new("batch-b");
    a.register(&http, &url, &api_key).await;
    b.register(&http, &url, &api_key).await;

    // a0 b0 a1 b1(bad signature) a2 b2 b3: b1 is refused, b2 and b3 follow it.
    let a0 = a.next("a0");
    let b0 = b.next("b0");
    let a1 = a.next("a1");
    let b1 = b.next("b1");
    let b1_forged = {
        let other = SecretKey::generate(&mut OsRng);
        let mut v: Value = serde_json::from_slice(b1.canonical_bytes()).unwrap();
        let fake = UnsignedRecord {
            ..b1.unsigned().clone()
        }
        .sign(&other)
        .unwrap();
        v["sig"] = serde_json::from_slice::<Value>(fake.canonical_bytes()).unwrap()["sig"].clone();
        Record::from_value(v).unwrap()
    };
    let a2 = a.next("a2");
    let b2 = b.next("b2");
    let b3 = b.next("b3");
    let batch = [&a0, &b0, &a1, &b1_forged, &a2, &b2, &b3];
    let body = BatchRequest::to_json(batch);
    assert_valid(
        "batch-request.schema.json",
        &serde_json::from_slice(&body).unwrap(),
    );
    let (status, answer_bytes) = post_batch(&http, &url, &api_key, body.clone()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer_bytes));
    assert_valid(
        "batch-answer.schema.json",
        &serde_json::from_slice(&answer_bytes).unwrap(),
    );
    let answer = BatchAnswer::from_json(&answer_bytes).unwrap();
    assert_eq!(answer.results.len(), 7);
    let codes: Vec<Option<&str>> = answer.results.iter().map(BatchOutcome::code).collect();
    assert_eq!(
        codes,
        [
            None,
            None,
            None,
            Some("bad_signature"),
            None,
            Some("prior_record_refused"),
            Some("prior_record_refused")
        ]
    );
    let BatchOutcome::Refused { status, error } = &answer.results[5] else {
        unreachable!()
    };
    assert_eq!(*status, 424);
    assert_eq!(error["agent"], "batch-b");
    assert_eq!(error["seq"], 1);
    let BatchOutcome::Refused { status, .. } = &answer.results[3] else {
        unreachable!()
    };
    assert_eq!(*status, 422);

    // One checkpoint for the batch; each receipt proven in it.
    let mut checkpoint = None;
    for (i, record) in [(0, &a0), (1, &b0), (2, &a1), (4, &a2)] {
        let BatchOutcome::Receipt(bytes) = &answer.results[i] else {
            unreachable!()
        };
        let receipt = Receipt::from_json(bytes).unwrap();
        assert_eq!(receipt.record_hash, record.hash());
        let cp = open_checkpoint(&receipt.checkpoint, &log_key).unwrap();
        assert_eq!(cp.size.get(), 4);
        checkpoint.get_or_insert_with(|| receipt.checkpoint.clone());
        assert_eq!(Some(&receipt.checkpoint), checkpoint.as_ref());
        let entry = Entry::new(receipt.index, receipt.received, (*record).clone()).unwrap();
        verify_inclusion(
            receipt.index,
            cp.size,
            &entry.leaf_hash(),
            &receipt.inclusion,
            &cp.root,
        )
        .unwrap();
    }

    // The same batch again: the same receipts byte for byte, and the same
    // refusals (nothing new appended).
    let (status, again) = post_batch(&http, &url, &api_key, body).await;
    assert_eq!(status, 200);
    let again = BatchAnswer::from_json(&again).unwrap();
    for i in [0, 1, 2, 4] {
        assert_eq!(again.results[i], answer.results[i], "record {i}");
    }
    assert_eq!(again.results[3].code(), Some("bad_signature"));
    assert_eq!(again.results[5].code(), Some("prior_record_refused"));

    // The fixed chain of b, with a record of a already in the log, mixed in
    // a different order (the log admits each agent's records in seq order).
    let body = BatchRequest::to_json([&b2, &a1, &b1, &b3]);
    let (status, fixed) = post_batch(&http, &url, &api_key, body).await;
    assert_eq!(status, 200);
    let fixed = BatchAnswer::from_json(&fixed).unwrap();
    assert_eq!(fixed.results[1], answer.results[2], "a1's original receipt");
    for i in [0, 2, 3] {
        assert!(
            matches!(fixed.results[i], BatchOutcome::Receipt(_)),
            "{i}: {:?}",
            fixed.results[i]
        );
    }

    // Malformed members are answered in their place; the others go on.
    let a3 = a.next("a3");
    let good = String::from_utf8(a3.canonical_bytes().to_vec()).unwrap();
    let body = format!("{{\"v\":1,\"records\":[{{\"v\":1}},{good},\"text\",{{\"v\":2}}]}}");
    let (status, mixed) = post_batch(&http, &url, &api_key, body.into_bytes()).await;
    assert_eq!(status, 200);
    let mixed = BatchAnswer::from_json(&mixed).unwrap();
    let codes: Vec<Option<&str>> = mixed.results.iter().map(BatchOutcome::code).collect();
    assert_eq!(
        codes,
        [
            Some("malformed"),
            None,
            Some("malformed"),
            Some("unsupported_version")
        ]
    );

    // Chain conflict keeps its status and evidence inside a batch.
    let mut stale = Agent::new("batch-a");
    stale.key = a.key.clone();
    let (status, conflict) = post_batch(
        &http,
        &url,
        &api_key,
        BatchRequest::to_json([&stale.next("again genesis")]),
    )
    .await;
    assert_eq!(status, 200);
    let conflict = BatchAnswer::from_json(&conflict).unwrap();
    let BatchOutcome::Refused { status, error } = &conflict.results[0] else {
        panic!("{conflict:?}")
    };
    assert_eq!(
        (*status, error["code"].as_str()),
        (409, Some("chain_conflict"))
    );
    assert_eq!(error["head"]["seq"], 3);

    // The metrics count the batch requests and each record's answer.
    let metrics = http
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("tally_batch_requests_total{status=\"200\",code=\"ok\"} 5"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tally_admissions_total{status=\"424\",code=\"prior_record_refused\"} 4")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_over_the_limits_and_bad_bodies_are_refused_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&tmp.path().join("data"), &[]);
    let url = server.url.clone();
    let api_key = server.banner_value("API key");
    let http = reqwest::Client::new();
    let mut a = Agent::new("limit-bot");
    a.register(&http, &url, &api_key).await;

    // No API key: 401 before the body is looked at.
    let resp = http
        .post(format!("{url}/v1/records/batch"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);

    // 257 records: 413 batch_too_large, nothing appended.
    let records: Vec<Record> = (0..257).map(|i| a.next(&format!("n{i}"))).collect();
    let (status, body) = post_batch(&http, &url, &api_key, BatchRequest::to_json(&records)).await;
    assert_eq!(
        (status, error_code(&body).as_str()),
        (413, "batch_too_large")
    );
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["max_records"], 256);
    assert_eq!(v["error"]["count"], 257);

    // Over 1 MiB: 413 too_large.
    let big = format!(
        "{{\"v\":1,\"records\":[\"{}\"]}}",
        "x".repeat(tally_schemas::limits::MAX_BATCH_BYTES)
    );
    let (status, body) = post_batch(&http, &url, &api_key, big.into_bytes()).await;
    assert_eq!((status, error_code(&body).as_str()), (413, "too_large"));

    for (body, status, code) in [
        (&b"{\"v\":1,\"records\":[]}"[..], 400, "empty_batch"),
        (b"[1,2]", 400, "malformed"),
        (b"{\"v\":1,\"records\":[],\"v\":1}", 400, "malformed"),
        (b"{\"v\":1}", 400, "malformed"),
        (b"{\"v\":3,\"records\":[1]}", 400, "unsupported_version"),
        (b"{\"v\":1,\"records\":{}}", 400, "malformed"),
    ] {
        let (s, b) = post_batch(&http, &url, &api_key, body.to_vec()).await;
        assert_eq!(
            (s, error_code(&b).as_str()),
            (status, code),
            "{}",
            String::from_utf8_lossy(body)
        );
    }

    // The log is still empty, and the 256 first records go in one batch.
    let (status, body) = post_batch(
        &http,
        &url,
        &api_key,
        BatchRequest::to_json(&records[..256]),
    )
    .await;
    assert_eq!(status, 200);
    let answer = BatchAnswer::from_json(&body).unwrap();
    assert!(answer.results.iter().all(|r| r.code().is_none()));
    let health: Value = http
        .get(format!("{url}/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["tree_size"], 256);
}

/// The witness checks each signature by its own strict equation
/// (schemas/src/batch_sig.rs). After many good records by an agent's key, a
/// record carrying a valid signature by that key over another message is
/// refused, on the batch route and on the one-record route, and good records
/// still pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_key_still_refuses_a_signature_over_another_message() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&tmp.path().join("data"), &[]);
    let url = server.url.clone();
    let api_key = server.banner_value("API key");
    let http = reqwest::Client::new();
    let mut a = Agent::new("busy-bot");
    a.register(&http, &url, &api_key).await;

    // Many good records, in batches of 32.
    let enough = 96;
    let records: Vec<Record> = (0..enough).map(|i| a.next(&format!("n{i}"))).collect();
    for chunk in records.chunks(32) {
        let (status, body) = post_batch(&http, &url, &api_key, BatchRequest::to_json(chunk)).await;
        assert_eq!(status, 200);
        let answer = BatchAnswer::from_json(&body).unwrap();
        assert!(answer.results.iter().all(|r| r.code().is_none()));
    }

    // The next record with the signature of the one before it: the right
    // key, another message.
    let good = a.next("good");
    let swapped = {
        let mut v: Value = serde_json::from_slice(good.canonical_bytes()).unwrap();
        let last: Value = serde_json::from_slice(records[enough - 1].canonical_bytes()).unwrap();
        v["sig"] = last["sig"].clone();
        Record::from_value(v).unwrap()
    };
    let (status, body) = post_batch(
        &http,
        &url,
        &api_key,
        BatchRequest::to_json([&swapped, &a.next("after")]),
    )
    .await;
    assert_eq!(status, 200);
    let answer = BatchAnswer::from_json(&body).unwrap();
    let codes: Vec<Option<&str>> = answer.results.iter().map(BatchOutcome::code).collect();
    assert_eq!(codes, [Some("bad_signature"), Some("prior_record_refused")]);

    // The one-record route: the same refusal, then the good record passes.
    let resp = http
        .post(format!("{url}/v1/records"))
        .bearer_auth(&api_key)
        .body(swapped.canonical_bytes().to_vec())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    assert_eq!(
        (status, error_code(&resp.bytes().await.unwrap()).as_str()),
        (422, "bad_signature")
    );
    let resp = http
        .post(format!("{url}/v1/records"))
        .bearer_auth(&api_key)
        .body(good.canonical_bytes().to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
}
