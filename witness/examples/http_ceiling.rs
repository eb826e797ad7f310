//! The HTTP ceiling of ingest on this machine: `tally bench ingest` against a
//! server that does none of the witness's work. It serves through the same
//! `tally_witness::server::serve` loop (hyper, keep-alive) as `tally serve`,
//! answers agent registration with 201, and answers every
//! `POST /v1/records` with 200 and a receipt-sized body after reading the
//! body, and with `CEILING_PARSE=1` after the strict parse and
//! canonicalisation of the record too (`Record::from_json`), but verifies no
//! signature and appends nothing.
//!
//!     cargo run --release -p tally-witness --example http_ceiling &
//!     target/release/tally bench ingest --witness http://127.0.0.1:7899 --api-key x
//!
//! What `tally bench ingest` reports against it is the most any witness
//! behind this HTTP stack and load generator could reach here: the records/s
//! of transport and (optionally) parsing alone (docs/benchmarks.md,
//! "## Ingest").

use std::time::Duration;

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;
use tally_schemas::Record;

/// About the size of a real receipt (entry, checkpoint note, 17-hash proof).
const RECEIPT_BYTES: usize = 1_400;

#[tokio::main]
async fn main() {
    let parse = std::env::var("CEILING_PARSE").is_ok_and(|v| v == "1");
    let receipt: &'static [u8] = Box::leak(vec![b' '; RECEIPT_BYTES].into_boxed_slice());
    let app = Router::new()
        .route("/v1/agents", post(|| async { (StatusCode::CREATED, "{}") }))
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
    println!("http_ceiling: listening on http://{addr} (parse: {parse})");
    let options = tally_witness::server::ServeOptions {
        drain: Duration::from_secs(1),
        ..Default::default()
    };
    tally_witness::server::serve(listener, app, options, std::future::pending::<()>()).await;
}
