//! The HTTP ceiling of ingest on this machine: `tally-bench ingest` against a
//! server that does none of the witness's work. It serves through the same
//! `tally_witness::server::serve` loop (hyper, keep-alive) as `tally serve`,
//! answers agent registration with 201, and answers every
//! `POST /v1/records` with 200 and a receipt-sized body after reading the
//! body, and with `CEILING_PARSE=1` after the strict parse and
//! canonicalisation of the record too (`Record::from_json`), but verifies no
//! signature and appends nothing.
//!
//! `POST /v1/records/batch` (`tally-bench ingest --batch N`) is answered the
//! same way: after reading the body (and with `CEILING_PARSE=1` the strict
//! parse of the batch, `BatchRequest::parse`), one receipt of a real
//! receipt's shape and size per record, in a batch answer the bench parses
//! as it parses the witness's. With `CEILING_VERIFY=1` each record's
//! signature is also checked strictly (`verify_strict`, on a blocking
//! thread as the witness does) against the key its agent was registered
//! with: the ceiling of transport, parse and signature checks, with no log.
//!
//!     cargo run --release -p tally-witness --example http_ceiling &
//!     target/release/tally-bench ingest --witness http://127.0.0.1:7899 --api-key x
//!     CEILING_PARSE=1 CEILING_VERIFY=1 target/release/examples/http_ceiling &
//!     target/release/tally-bench ingest --batch 64 --concurrency 4 --witness http://127.0.0.1:7899 --api-key x
//!
//! What `tally-bench ingest` reports against it is the most any witness
//! behind this HTTP stack and load generator could reach here: the records/s
//! of transport and (optionally) parsing alone (docs/benchmarks.md,
//! "## Ingest").

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;
use tally_schemas::batch::{BatchAnswer, BatchOutcome, BatchRequest};
use tally_schemas::{Hash, Nonce, PublicKey, Receipt, Record, UnixMillis};

/// Agent name → the key it was registered with (`CEILING_VERIFY=1`).
type Keys = Arc<RwLock<HashMap<String, PublicKey>>>;

#[derive(serde::Deserialize)]
struct Registration {
    agent: String,
    public_key: PublicKey,
}

/// The canonical bytes of a receipt of a real receipt's shape: a checkpoint
/// note of a real note's length and a 17-hash inclusion proof.
fn sample_receipt() -> Vec<u8> {
    let note = format!(
        "tally.local/log\n1000000\n{}\n\n\u{2014} tally.local/log {}\n",
        "A".repeat(44),
        "B".repeat(96)
    );
    let receipt = Receipt {
        v: 1,
        record_hash: Hash::from_bytes([7u8; 32]),
        nonce: Nonce::from_bytes(vec![5u8; 16]).unwrap_or_else(|e| panic!("nonce: {e}")),
        index: tally_schemas::LeafIndex::new(999_999),
        received: UnixMillis::new(1_764_000_000_000),
        checkpoint: note,
        inclusion: vec![Hash::from_bytes([9u8; 32]); 17],
    };
    tally_schemas::canonical::canonicalize(&receipt).unwrap_or_else(|e| panic!("receipt: {e}"))
}

/// The batch answer: one receipt per record, or 400 when the batch (or,
/// with `verify`, a signature) does not pass.
fn answer_batch(
    body: &[u8],
    parse: bool,
    verify: Option<&Keys>,
    receipt: &[u8],
) -> Option<Vec<u8>> {
    let count = if parse || verify.is_some() {
        let request = BatchRequest::parse(body).ok()?;
        let records: Vec<Record> = request.records.into_iter().collect::<Result<_, _>>().ok()?;
        if let Some(keys) = verify {
            let keys = keys.read().ok()?;
            for r in &records {
                let key = keys.get(r.agent.as_str())?;
                key.verify_raw(&r.signed_message(), r.signature()).ok()?;
            }
        }
        records.len()
    } else {
        // Records are objects at depth 2; count their opening braces.
        let mut depth = 0usize;
        let mut count = 0usize;
        let mut in_string = false;
        let mut escaped = false;
        for &b in body {
            match (in_string, escaped, b) {
                (true, true, _) => escaped = false,
                (true, false, b'\\') => escaped = true,
                (true, false, b'"') => in_string = false,
                (true, false, _) => {}
                (false, _, b'"') => in_string = true,
                (false, _, b'{' | b'[') => {
                    depth += 1;
                    if depth == 3 && b == b'{' {
                        count += 1;
                    }
                }
                (false, _, b'}' | b']') => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        count
    };
    // Built as the witness builds its answer: one receipt's bytes each.
    let results = (0..count)
        .map(|_| BatchOutcome::Receipt(receipt.to_vec()))
        .collect();
    BatchAnswer { results }.to_json().ok()
}

/// About the size of a real receipt (entry, checkpoint note, 17-hash proof).
const RECEIPT_BYTES: usize = 1_400;

#[tokio::main]
async fn main() {
    let parse = std::env::var("CEILING_PARSE").is_ok_and(|v| v == "1");
    let verify = std::env::var("CEILING_VERIFY").is_ok_and(|v| v == "1");
    let receipt: &'static [u8] = Box::leak(vec![b' '; RECEIPT_BYTES].into_boxed_slice());
    let batch_receipt: &'static [u8] = Box::leak(sample_receipt().into_boxed_slice());
    let keys: Keys = Arc::default();
    let registered = Arc::clone(&keys);
    let app = Router::new()
        .route(
            "/v1/agents",
            post(move |body: Bytes| async move {
                if let Ok(r) = serde_json::from_slice::<Registration>(&body) {
                    if let Ok(mut k) = registered.write() {
                        k.insert(r.agent, r.public_key);
                    }
                }
                (StatusCode::CREATED, "{}")
            }),
        )
        .route(
            "/v1/records/batch",
            post(move |body: Bytes| {
                let keys = Arc::clone(&keys);
                async move {
                    let answer = tokio::task::spawn_blocking(move || {
                        answer_batch(&body, parse, verify.then_some(&keys), batch_receipt)
                    })
                    .await
                    .ok()
                    .flatten();
                    match answer {
                        Some(a) => (StatusCode::OK, a),
                        None => (StatusCode::BAD_REQUEST, b"{}".to_vec()),
                    }
                }
            }),
        )
        .route(
            "/v1/records",
            post(move |body: Bytes| async move {
                if parse && Record::from_json(&body).is_err() {
                    return (StatusCode::BAD_REQUEST, &b"{}"[..]);
                }
                (StatusCode::OK, receipt)
            }),
        )
        .route("/metrics", get(|| async { "" }));
    let addr = std::env::var("CEILING_LISTEN").unwrap_or_else(|_| "127.0.0.1:7899".into());
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    println!("http_ceiling: listening on http://{addr} (parse: {parse}, verify batches: {verify})");
    let options = tally_witness::server::ServeOptions {
        drain: Duration::from_secs(1),
        ..Default::default()
    };
    tally_witness::server::serve(listener, app, options, std::future::pending::<()>()).await;
}
