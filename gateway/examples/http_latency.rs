//! Benchmark (not a test): the latency `tally gateway --upstream` adds to a
//! `tools/call` over Streamable HTTP, measured against calling the same
//! upstream directly, in alternating rounds of one run (docs/benchmarks.md,
//! "Gateway over HTTP").
//!
//! The upstream is a minimal MCP endpoint on loopback that answers each
//! `tools/call` the way the reference server does, with an SSE stream of
//! one event (an id and the JSON-RPC result), so that its own time is small
//! and the difference is the gateway's: parsing, the signed decision
//! journaled before forwarding, the second HTTP hop, the relayed stream,
//! the outcome. The gateway is the library's, with a journaled recorder on
//! a real redb store in a temporary directory (`TMPDIR` picks the disk).
//!
//!     cargo run --release -p tally-gateway --example http_latency -- [calls] [rounds]

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use serde_json::Value;
use tally_gateway::calls::{CallRecorder, ProxyConfig};
use tally_gateway::chain::AgentChain;
use tally_gateway::http::{serve, HttpConfig, HttpGateway, HttpLimits};
use tally_gateway::journal::Journal;
use tally_gateway::recorder::Recorder;
use tally_gateway::store::ChainStore;
use tally_schemas::time::SystemClock;
use tally_schemas::{AgentName, SecretKey};
use tokio::net::TcpListener;

async fn upstream() -> String {
    let app = Router::new().route(
        "/mcp",
        post(|body: Bytes| async move {
            let msg: Value = serde_json::from_slice(&body).unwrap_or_default();
            let answer = serde_json::json!({"jsonrpc": "2.0", "id": msg["id"],
                "result": {"content": [{"type": "text", "text": "Echo: m"}]}});
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(axum::body::Body::from(format!("id: 1\ndata: {answer}\n\n")))
                .unwrap_or_default()
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/mcp")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let k = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[k.min(sorted.len() - 1)]
}

async fn timed(client: &reqwest::Client, url: &str, n: usize, out: &mut Vec<f64>) {
    for i in 0..n {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"echo","arguments":{{"message":"m{i}"}}}}}}"#
        );
        let t0 = Instant::now();
        let text = client
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", "bench")
            .body(body)
            .send()
            .await
            .expect("send")
            .text()
            .await
            .expect("answer");
        out.push(t0.elapsed().as_secs_f64() * 1000.0);
        assert!(text.contains("Echo"), "{text}");
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let calls: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4000);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(8);
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(ChainStore::open(&dir.path().join("chain.redb")).expect("store"));
    let journal = Journal::open(&dir.path().join("chain.journal")).expect("journal");
    let recorder = Recorder::start_journaled(
        AgentName::new("bench").expect("name"),
        SecretKey::from_seed(&[7; 32]),
        Arc::new(SystemClock),
        Arc::clone(&store),
        journal,
    )
    .expect("recorder");
    let core = CallRecorder::new(
        ProxyConfig::default(),
        AgentChain::with_writer(recorder.handle(), Some(store), None),
    );
    let direct_url = upstream().await;
    let gateway = HttpGateway::new(
        core,
        HttpConfig {
            upstream: direct_url.parse().expect("url"),
            upstream_ca_pem: None,
            allowed_origins: vec![],
            loopback_hosts_only: true,
            limits: HttpLimits::default(),
        },
    )
    .expect("gateway");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let gateway_url = format!("http://{}/mcp", listener.local_addr().expect("addr"));
    tokio::spawn(serve(gateway, listener, None, std::future::pending()));
    let client = reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .build()
        .expect("client");

    let warmup = 200;
    let per_round = calls / rounds;
    let (mut direct, mut through) = (Vec::new(), Vec::new());
    timed(&client, &direct_url, warmup, &mut Vec::new()).await;
    timed(&client, &gateway_url, warmup, &mut Vec::new()).await;
    for _ in 0..rounds {
        timed(&client, &direct_url, per_round, &mut direct).await;
        timed(&client, &gateway_url, per_round, &mut through).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    direct.sort_by(f64::total_cmp);
    through.sort_by(f64::total_cmp);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!("| path | calls | p50 ms | p99 ms | mean ms |");
    println!("|---|---|---|---|---|");
    for (name, v) in [("direct", &direct), ("through the gateway", &through)] {
        println!(
            "| {name} | {} | {:.3} | {:.3} | {:.3} |",
            v.len(),
            percentile(v, 50.0),
            percentile(v, 99.0),
            mean(v)
        );
    }
    println!(
        "| added | | {:.3} | {:.3} | {:.3} |",
        percentile(&through, 50.0) - percentile(&direct, 50.0),
        percentile(&through, 99.0) - percentile(&direct, 99.0),
        mean(&through) - mean(&direct)
    );
    drop(recorder);
}
