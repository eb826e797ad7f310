//! Shared harness of the witness's handler tests: a witness over a temp
//! data folder with an injected, settable clock, its router driven with
//! `tower::ServiceExt::oneshot` (no sockets), and agents that sign records.

#![allow(dead_code)]

use std::path::Path;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use rand_core::OsRng;
use serde_json::Value;
use tally_schemas::record::NoteBody;
use tally_schemas::{
    AgentName, Body as RecordBody, Hash, Nonce, Record, SecretKey, Seq, UnixMillis, UnsignedRecord,
};
pub(crate) use tally_testkit::clock::TestClock;
use tally_witness::config::{ServeConfig, WitnessConfig};
use tally_witness::server;
use tally_witness::Witness;
use tower::ServiceExt;

/// 2026-11-30T08:00:00.000Z.
pub(crate) const T0: i64 = 1_796_025_600_000;

pub(crate) struct Harness {
    pub dir: tempfile::TempDir,
    pub witness: Arc<Witness>,
    pub app: Router,
    pub clock: Arc<TestClock>,
    /// The default project's API key.
    pub key_a: String,
    /// Project "other"'s API key.
    pub key_b: String,
    pub admin: String,
}

pub(crate) fn open_witness(
    dir: &Path,
    config: WitnessConfig,
    clock: Arc<TestClock>,
) -> (Arc<Witness>, Option<tally_witness::registry::FirstStart>) {
    let cfg = ServeConfig {
        data_dir: dir.to_owned(),
        witness: config,
        ..ServeConfig::default()
    };
    let opened = server::open(&cfg, None, clock, Box::new(OsRng)).expect("open the data folder");
    (opened.witness, opened.first_start)
}

pub(crate) fn harness(config: WitnessConfig) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(TestClock(AtomicI64::new(T0)));
    let (witness, first) = open_witness(dir.path(), config, Arc::clone(&clock));
    let first = first.expect("first start");
    let key_b = witness.create_project("other").unwrap().token;
    Harness {
        app: tally_witness::http::router(Arc::clone(&witness)),
        dir,
        witness,
        clock,
        key_a: first.api_key.token,
        key_b,
        admin: first.admin_token.token,
    }
}

pub(crate) async fn call(
    app: &Router,
    method: &str,
    uri: &str,
    bearer: Option<&str>,
    body: Vec<u8>,
) -> (StatusCode, Vec<u8>) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(b) = bearer {
        req = req.header("authorization", format!("Bearer {b}"));
    }
    let resp = app
        .clone()
        .oneshot(req.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, bytes)
}

pub(crate) fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(bytes)))
}

/// The error code of an error body.
pub(crate) fn code(bytes: &[u8]) -> String {
    json(bytes)["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// An agent that signs a chain.
pub(crate) struct TestAgent {
    pub name: AgentName,
    pub key: SecretKey,
    pub seq: u64,
    pub prev: Option<Hash>,
}

impl TestAgent {
    pub(crate) fn new(name: &str) -> Self {
        Self {
            name: AgentName::new(name).unwrap(),
            key: SecretKey::generate(&mut OsRng),
            seq: 0,
            prev: None,
        }
    }

    /// The next record of the chain (not yet counted as sent).
    pub(crate) fn draft(&self, time: i64, text: &str) -> Record {
        UnsignedRecord {
            agent: self.name.clone(),
            key_id: self.key.public_key().key_id(),
            seq: Seq::new(self.seq).unwrap(),
            prev: self.prev,
            time: UnixMillis::new(time),
            nonce: Nonce::random(&mut OsRng),
            body: RecordBody::Note(NoteBody { text: text.into() }),
        }
        .sign(&self.key)
        .unwrap()
    }

    /// Marks `r` as the chain's new head.
    pub(crate) fn accept(&mut self, r: &Record) {
        self.seq = r.seq.get() + 1;
        self.prev = Some(r.hash());
    }

    /// Registers this agent's key with `api_key`'s project.
    pub(crate) async fn register(&self, app: &Router, api_key: &str) {
        let body = serde_json::json!({"agent": self.name, "public_key": self.key.public_key(), "not_before": UnixMillis::new(T0 - 3_600_000)});
        let (s, b) = call(
            app,
            "POST",
            "/v1/agents",
            Some(api_key),
            serde_json::to_vec(&body).unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{}", String::from_utf8_lossy(&b));
    }
}

pub(crate) fn bytes(r: &Record) -> Vec<u8> {
    r.canonical_bytes().to_vec()
}

/// Posts `r` and returns status and body.
pub(crate) async fn post(
    app: &Router,
    api_key: Option<&str>,
    body: Vec<u8>,
) -> (StatusCode, Vec<u8>) {
    call(app, "POST", "/v1/records", api_key, body).await
}
