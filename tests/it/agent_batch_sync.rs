//! The agent side sends its backlog in batches (gateway/src/sync.rs;
//! docs/protocol.md §8.1): a local chain of 10,000 records, written while
//! no witness was reachable, is synced by the real `tally agent sync`
//! against the real `tally serve` with no refused record and in a handful
//! of requests, counted from the witness's /metrics.

use std::sync::Arc;

use tally_gateway::recorder::Recorder;
use tally_gateway::state::StateDir;
use tally_gateway::store::ChainStore;
use tally_schemas::record::NoteBody;
use tally_schemas::time::SystemClock;
use tally_schemas::{AgentName, Body};

use crate::common;

use common::{tally, Server};

const BACKLOG: usize = 10_000;

/// The sum of a metric's samples whose line starts with `prefix`.
fn metric_sum(text: &str, prefix: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn a_backlog_of_ten_thousand_records_syncs_in_a_handful_of_batches_without_a_refusal() {
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&tmp.path().join("data"), &[]);
    let api_key = server.banner_value("API key");
    let state = tmp.path().join("state");
    common::add_agent(&server, &api_key, &state, "backlog-bot");

    // The backlog, written straight into the agent's local chain.
    let agent = AgentName::new("backlog-bot").unwrap();
    let dir = StateDir::new(&state);
    let key = dir.load_key(&agent).unwrap();
    let store = Arc::new(ChainStore::open(&dir.agent(&agent).store()).unwrap());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let recorder = Recorder::start(
            agent.clone(),
            key,
            Arc::new(SystemClock),
            Arc::clone(&store),
        )
        .unwrap();
        let handle = recorder.handle();
        let queued: Vec<_> = (0..BACKLOG)
            .map(|i| {
                handle
                    .append_queued(
                        Body::Note(NoteBody {
                            text: format!("backlog {i}"),
                        }),
                        None,
                    )
                    .unwrap()
            })
            .collect();
        for q in queued {
            q.await.unwrap();
        }
    });
    drop(store);

    let env = [("TALLY_STATE_DIR", state.to_str().unwrap())];
    let (ok, out, err) = tally(&["agent", "sync", "backlog-bot", "--timeout", "240"], &env);
    assert!(ok, "agent sync: {out}{err}");
    assert!(
        out.contains(&format!("synced: {BACKLOG} records, all receipted")),
        "{out}"
    );

    let metrics = runtime.block_on(async {
        reqwest::get(format!("{}/metrics", server.url))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    });
    let batches = metric_sum(&metrics, "tally_batch_requests_total{");
    let batches_ok = metric_sum(&metrics, "tally_batch_requests_total{status=\"200\"");
    let single_posts = metric_sum(&metrics, "tally_admission_seconds_count");
    let answered = metric_sum(&metrics, "tally_admissions_total{");
    let receipts = metric_sum(&metrics, "tally_admissions_total{status=\"200\"");
    eprintln!("{BACKLOG} records: {batches} batch requests, {single_posts} single posts, {answered} record answers");
    assert_eq!(single_posts, 0, "{metrics}");
    assert_eq!(batches, batches_ok, "a batch was refused whole: {metrics}");
    assert_eq!(batches as usize, BACKLOG.div_ceil(256), "{metrics}");
    assert_eq!(
        (answered, receipts),
        (BACKLOG as u64, BACKLOG as u64),
        "{metrics}"
    );
}
