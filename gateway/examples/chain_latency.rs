//! Benchmark (not a test): what a decision costs a writer that holds the
//! agent's chain against one that hands it to the holder over the writer
//! socket (gateway/src/chain/; docs/benchmarks.md "Several writers"). Both
//! append through one `AgentChain` each, to one state folder, alternating
//! rounds of sequential decisions with fresh salted hashes, the way the
//! gateway records a `tools/call`; each append returns once the record is in
//! the journal. `TMPDIR` picks the disk.
//!
//!     cargo run --release -p tally-gateway --example chain_latency -- [appends] [rounds]

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand_core::OsRng;
use tally_gateway::chain::{AgentChain, ChainOptions, WriterInfo};
use tally_gateway::state::StateDir;
use tally_gateway::store::Secret;
use tally_schemas::record::Decision;
use tally_schemas::time::SystemClock;
use tally_schemas::{AgentName, Body, SecretKey};

fn percentile(xs: &mut [f64], p: f64) -> f64 {
    xs.sort_by(f64::total_cmp);
    let k = ((p / 100.0) * (xs.len() - 1) as f64).round() as usize;
    xs[k.min(xs.len() - 1)]
}

async fn round(chain: &AgentChain, n: usize, out: &mut Vec<f64>) {
    for i in 0..n {
        let args = serde_json::json!({"message": format!("m{i}")});
        let t0 = Instant::now();
        let (input_hash, secret) = Secret::for_content(&args, false, &mut OsRng).expect("hash");
        let body = Body::Decision(Decision {
            call_id: i.to_string(),
            tool: "echo".into(),
            input_hash,
        });
        chain.append(body, Some(secret)).await.expect("append");
        out.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let appends: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4000);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(8);
    let dir = tempfile::tempdir().expect("temporary folder");
    let state = StateDir::new(dir.path());
    let agent = AgentName::new("bench").expect("name");
    state
        .create_agent_with(&agent, &SecretKey::from_seed(&[7; 32]), None, None)
        .expect("agent");
    let open = |kind: &str| {
        let state = state.clone();
        let agent = agent.clone();
        let kind = kind.to_owned();
        async move {
            AgentChain::open(
                &state,
                &agent,
                Arc::new(SystemClock),
                ChainOptions {
                    me: WriterInfo::new(&kind),
                    durable: false,
                    final_sync: Duration::ZERO,
                    window: None,
                    keep_trying: false,
                },
            )
            .await
            .expect("open")
        }
    };
    let holder = open("holder").await;
    let member = open("member").await;
    let per_round = appends / rounds;
    round(&holder, 200, &mut Vec::new()).await;
    round(&member, 200, &mut Vec::new()).await;
    let (mut own, mut handed) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        round(&holder, per_round, &mut own).await;
        round(&member, per_round, &mut handed).await;
    }
    member.close().await;
    holder.close().await;
    println!("| writer | appends | p50 ms | p99 ms | mean ms |");
    println!("|---|---|---|---|---|");
    for (name, xs) in [
        ("holds the chain", &mut own),
        ("hands over (member)", &mut handed),
    ] {
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let (p50, p99) = (percentile(xs, 50.0), percentile(xs, 99.0));
        println!(
            "| {name} | {} | {p50:.3} | {p99:.3} | {mean:.3} |",
            xs.len()
        );
    }
}
