//! A gateway killed with SIGKILL right after it forwarded a call keeps the
//! call's decision (docs/operations.md "Durability of a decision before its
//! call is forwarded").
//!
//! The test re-runs its own binary as the gateway process (the
//! `child_gateway` test, which does nothing unless `TALLY_KILL9_STATE` is
//! set): a proxy with a real recorder and store in a state directory, an
//! in-process client that makes three calls, and a fake server that answers
//! the first two and, on the third, prints `forwarded` and waits. The parent
//! kills the child with SIGKILL as soon as it reads that line, then opens
//! the chain store as the next run would and looks for the decision.
//!
//! The child's store makes every commit wait 30 s (a very slow fsync), so
//! with the record journal nothing can have reached chain.redb before the
//! kill: the decision survives only if the journal works. With
//! `--sync-before-forward` (no journal, no slow store) the decision must be
//! in chain.redb already.

use std::io::{BufRead as _, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tally_gateway::chain::AgentChain;
use tally_gateway::journal::Journal;
use tally_gateway::proxy::{run_proxy, ProxyConfig, ProxyDeps};
use tally_gateway::recorder::Recorder;
use tally_gateway::store::{journal_path, Appended, ChainStore, ChainWriter, StoreError};
use tally_schemas::time::SystemClock;
use tally_schemas::{AgentName, Body, Hash, Record, SecretKey, Seq, UnixMillis};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::sync::Notify;

const STATE_ENV: &str = "TALLY_KILL9_STATE";
const MODE_ENV: &str = "TALLY_KILL9_MODE";
const MARK: &str = "tally-kill9: forwarded";

/// A store whose commits take 30 s.
struct SlowStore(Arc<ChainStore>);

impl ChainWriter for SlowStore {
    fn head(&self) -> Result<Option<(Seq, Hash, UnixMillis)>, StoreError> {
        self.0.head()
    }
    fn append(&self, batch: &[Appended]) -> Result<(), StoreError> {
        std::thread::sleep(Duration::from_secs(30));
        self.0.append(batch)
    }
}

fn call(id: u32) -> String {
    format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"refund\",\"arguments\":{{\"n\":{id}}}}}}}\n"
    )
}

/// The gateway process: runs only when the parent test starts it.
#[test]
fn child_gateway() {
    let Ok(state) = std::env::var(STATE_ENV) else {
        return;
    };
    let journaled = std::env::var(MODE_ENV).as_deref() != Ok("sync-before-forward");
    let path = Path::new(&state).join("chain.redb");
    let store = Arc::new(ChainStore::open(&path).unwrap());
    let agent = AgentName::new("kill9-bot").unwrap();
    let key = SecretKey::from_seed(&[6; 32]);
    let recorder = if journaled {
        Recorder::start_journaled(
            agent,
            key,
            Arc::new(SystemClock),
            SlowStore(Arc::clone(&store)),
            Journal::open(&journal_path(&path)).unwrap(),
        )
        .unwrap()
    } else {
        Recorder::start(agent, key, Arc::new(SystemClock), Arc::clone(&store)).unwrap()
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (mut client, gw_in) = tokio::io::duplex(1 << 16);
        let (gw_out, from_gateway) = tokio::io::duplex(1 << 16);
        let (server_end, gw_server) = tokio::io::duplex(1 << 16);
        let (gw_server_out, gw_server_in) = tokio::io::split(gw_server);
        let deps = ProxyDeps {
            chain: AgentChain::with_writer(recorder.handle(), Some(Arc::clone(&store)), None),
            client_gone: Arc::new(Notify::new()),
        };
        tokio::spawn(run_proxy(
            ProxyConfig::default(),
            deps,
            gw_in,
            gw_out,
            gw_server_in,
            gw_server_out,
        ));
        let mut from_gateway = BufReader::new(from_gateway);
        let (to_server, mut server) = tokio::io::split(server_end);
        let mut to_server = BufReader::new(to_server);
        for id in 1..=3 {
            client.write_all(call(id).as_bytes()).await.unwrap();
            let mut line = String::new();
            to_server.read_line(&mut line).await.unwrap();
            assert!(line.contains(&format!("\"id\":{id},")), "{line}");
            if id < 3 {
                server
                    .write_all(
                        format!(
                            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"content\":[]}}}}\n"
                        )
                        .as_bytes(),
                    )
                    .await
                    .unwrap();
                // The client has the answer (so its outcome is recorded)
                // before it makes the next call.
                let mut answer = String::new();
                from_gateway.read_line(&mut answer).await.unwrap();
                assert!(answer.contains("\"result\""), "{answer}");
            }
        }
        // The server has the third call: tell the parent, then wait to be killed.
        let mut out = std::io::stdout().lock();
        writeln!(out, "{MARK}").unwrap();
        out.flush().unwrap();
        drop(out);
        tokio::time::sleep(Duration::from_secs(120)).await;
    });
    panic!("the child gateway was not killed");
}

/// Runs the child gateway in `mode`, kills it with SIGKILL once the server
/// has the third call, and returns the state directory.
fn run_and_kill(mode: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    // The child test's name in this executable: its module path without the
    // crate's name (`kill9::child_gateway`).
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let test = format!("{module}::child_gateway");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([test.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(STATE_ENV, dir.path())
        .env(MODE_ENV, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let started = Instant::now();
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the child ended before forwarding the call"
        );
        // libtest may have printed "test child_gateway ... " on this line.
        if line.trim_end().ends_with(MARK) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60));
    }
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(!status.success());
    dir
}

/// The chain as the next run sees it: five linked records, the decisions
/// of calls 1 to 3 and the outcomes of 1 and 2 (an outcome may follow the
/// next call's decision), and call 3, in flight at the kill, is open.
fn assert_chain(records: &[Record]) {
    assert_eq!(records.len(), 5, "{records:#?}");
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.seq.get(), i as u64);
        assert_eq!(r.prev, i.checked_sub(1).map(|p| records[p].hash()));
    }
    let mut decided = Vec::new();
    let mut ended = Vec::new();
    for r in records {
        match &r.body {
            Body::Decision(d) => {
                assert_eq!(d.tool, "refund");
                decided.push(d.call_id.clone());
            }
            Body::Outcome(o) => ended.push(o.call_id.clone()),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(decided, ["1", "2", "3"]);
    assert_eq!(ended, ["1", "2"]);
}

#[test]
fn a_decision_in_the_journal_survives_kill_9_right_after_forwarding() {
    let dir = run_and_kill("journal");
    let path = dir.path().join("chain.redb");
    // Nothing reached chain.redb itself (its commits were stalled), so
    // every record comes back from the journal when the store is opened.
    let store = ChainStore::open(&path).unwrap();
    assert_eq!(store.recovered_from_journal().records, 5);
    assert_chain(&store.records(0, 100).unwrap());
    assert!(
        (0..5).all(|seq| store.secret(seq).unwrap().is_some()),
        "the salts came back too"
    );
    assert_eq!(std::fs::metadata(journal_path(&path)).unwrap().len(), 0);
    drop(store);
    // Opening again finds nothing more to recover.
    let store = ChainStore::open(&path).unwrap();
    assert_eq!(store.recovered_from_journal().records, 0);
    assert_eq!(store.records(0, 100).unwrap().len(), 5);
}

#[test]
fn with_sync_before_forward_the_decision_is_in_the_store_before_the_kill() {
    let dir = run_and_kill("sync-before-forward");
    let path = dir.path().join("chain.redb");
    assert!(!journal_path(&path).exists());
    let store = ChainStore::open(&path).unwrap();
    assert_eq!(store.recovered_from_journal().records, 0);
    assert_chain(&store.records(0, 100).unwrap());
}
