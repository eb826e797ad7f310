//! The MCP proxy driven in-process: a scripted client and
//! server on in-memory pipes, a real redb chain store (or one that fails on
//! demand), and checks of both what crosses the proxy and what is recorded.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tally_gateway::chain::AgentChain;
use tally_gateway::journal::{self, Journal, JournalError, JournalSink};
use tally_gateway::proxy::{run_proxy, ProxyConfig, ProxyDeps, ProxyReport, StrictPolicy};
use tally_gateway::recorder::Recorder;
use tally_gateway::store::{
    journal_path, Appended, ChainStore, ChainWriter, StoreError, SyncErrorNote,
};
use tally_gateway::sync::SyncProgress;
use tally_schemas::time::SystemClock;
use tally_schemas::{AgentName, Body, Hash, Record, SecretKey, Seq, UnixMillis};
use tokio::io::{
    AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader, DuplexStream, ReadHalf,
    WriteHalf,
};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

/// A store that commits the first `allowed` appends, then fails every one.
struct FailAfter {
    inner: Arc<ChainStore>,
    allowed: AtomicUsize,
    failures: Arc<AtomicUsize>,
}

impl ChainWriter for FailAfter {
    fn head(&self) -> Result<Option<(Seq, Hash, UnixMillis)>, StoreError> {
        self.inner.head()
    }
    fn append(&self, batch: &[Appended]) -> Result<(), StoreError> {
        if self
            .allowed
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_err()
        {
            self.failures.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::Db("injected: No space left on device".into()));
        }
        self.inner.append(batch)
    }
}

/// A journal that takes the first `allowed` appends, then fails every one
/// (cleanly: nothing of a failed append remains).
struct JournalFailAfter {
    inner: Journal,
    allowed: usize,
}

impl JournalSink for JournalFailAfter {
    fn append(&mut self, frames: &[u8]) -> Result<(), JournalError> {
        if self.allowed == 0 {
            return Err(JournalError::Io("injected: Input/output error".into()));
        }
        self.allowed -= 1;
        self.inner.append(frames)
    }
    fn clear(&mut self) -> Result<(), JournalError> {
        self.inner.clear()
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
}

struct Harness {
    /// What the client writes (the gateway's input), one pipe per
    /// direction so either can close alone.
    client: DuplexStream,
    /// What the client reads (the gateway's output).
    from_gateway: BufReader<DuplexStream>,
    server: WriteHalf<DuplexStream>,
    to_server: BufReader<ReadHalf<DuplexStream>>,
    proxy: JoinHandle<ProxyReport>,
    store: Arc<ChainStore>,
    _recorder: Recorder,
    _dir: tempfile::TempDir,
}

/// A proxy whose recorder commits every decision durably before it is
/// forwarded (`--sync-before-forward`), over a store that fails after
/// `allowed_appends` commits when given.
fn setup(
    config: ProxyConfig,
    allowed_appends: Option<usize>,
    receipts: Option<watch::Receiver<SyncProgress>>,
) -> Harness {
    setup_with(config, receipts, |_, store| match allowed_appends {
        None => Recorder::start(agent(), key(), Arc::new(SystemClock), store).unwrap(),
        Some(n) => Recorder::start(
            agent(),
            key(),
            Arc::new(SystemClock),
            FailAfter {
                inner: store,
                allowed: AtomicUsize::new(n),
                failures: Arc::default(),
            },
        )
        .unwrap(),
    })
}

fn agent() -> AgentName {
    AgentName::new("proxy-test").unwrap()
}

fn key() -> SecretKey {
    SecretKey::from_seed(&[4; 32])
}

fn setup_with(
    config: ProxyConfig,
    receipts: Option<watch::Receiver<SyncProgress>>,
    recorder: impl FnOnce(&std::path::Path, Arc<ChainStore>) -> Recorder,
) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(ChainStore::open(&dir.path().join("chain.redb")).unwrap());
    let recorder = recorder(dir.path(), Arc::clone(&store));
    let (client, gw_client_in) = tokio::io::duplex(1 << 20);
    let (gw_client_out, from_gateway) = tokio::io::duplex(1 << 20);
    let (server_end, gw_server) = tokio::io::duplex(1 << 20);
    let (gw_server_out, gw_server_in) = tokio::io::split(gw_server);
    let deps = ProxyDeps {
        chain: AgentChain::with_writer(recorder.handle(), Some(Arc::clone(&store)), receipts),
        client_gone: Arc::new(Notify::new()),
    };
    let proxy = tokio::spawn(run_proxy(
        config,
        deps,
        gw_client_in,
        gw_client_out,
        gw_server_in,
        gw_server_out,
    ));
    let (to_server, server) = tokio::io::split(server_end);
    Harness {
        client,
        from_gateway: BufReader::new(from_gateway),
        server,
        to_server: BufReader::new(to_server),
        proxy,
        store,
        _recorder: recorder,
        _dir: dir,
    }
}

async fn line_of<R: tokio::io::AsyncRead + Unpin>(r: &mut BufReader<R>) -> Vec<u8> {
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), r.read_until(b'\n', &mut buf))
        .await
        .expect("a line within 10 s")
        .unwrap();
    buf
}

fn js(line: &[u8]) -> Value {
    serde_json::from_slice(line).unwrap()
}

impl Harness {
    /// Call 1 goes through; call 2 must come back refused with -32001,
    /// never forwarded (fail closed). Returns the refusal's message.
    async fn second_call_refused(&mut self) -> String {
        self.client_sends(&call("1", "echo")).await;
        self.server_gets().await;
        self.client_sends(&call("2", "delete_everything")).await;
        let err = js(&self.client_gets().await);
        assert_eq!(err["id"], 2);
        assert_eq!(err["error"]["code"], -32001);
        err["error"]["message"].as_str().unwrap().to_owned()
    }

    /// The server never saw the refused call: the next thing it gets is a
    /// ping sent after it.
    async fn server_gets_the_ping_next(&mut self) {
        self.client_sends(r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#)
            .await;
        assert_eq!(js(&self.server_gets().await)["method"], "ping");
    }

    async fn client_sends(&mut self, line: &str) {
        self.client.write_all(line.as_bytes()).await.unwrap();
        self.client.write_all(b"\n").await.unwrap();
    }
    async fn server_sends(&mut self, line: &str) {
        self.server.write_all(line.as_bytes()).await.unwrap();
        self.server.write_all(b"\n").await.unwrap();
    }
    async fn server_gets(&mut self) -> Vec<u8> {
        line_of(&mut self.to_server).await
    }
    async fn client_gets(&mut self) -> Vec<u8> {
        line_of(&mut self.from_gateway).await
    }
    /// Waits until the chain has `n` records and returns them.
    async fn records(&self, n: usize) -> Vec<Record> {
        for _ in 0..500 {
            let r = self.store.records(0, 10_000).unwrap();
            if r.len() >= n {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "expected {n} records, have {}",
            self.store.records(0, 10_000).unwrap().len()
        );
    }
}

fn call(id: &str, tool: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{{"x":1}}}}}}"#
    )
}

fn body(r: &Record) -> Value {
    serde_json::to_value(&r.body).unwrap()
}

#[tokio::test]
async fn decision_is_durable_before_the_call_is_forwarded_and_bytes_pass_unchanged() {
    let mut h = setup(ProxyConfig::default(), None, None);
    let req = r#"{"jsonrpc":"2.0",  "id":7,"method":"tools/call","params":{"name":"echo","arguments":{"b":1,"a":"é"}}}"#;
    h.client_sends(req).await;
    let forwarded = h.server_gets().await;
    assert_eq!(forwarded, format!("{req}\n").into_bytes());
    // The decision was committed before the server got the call.
    let records = h.store.records(0, 10).unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(body(&records[0])["tool"], "echo");
    assert_eq!(body(&records[0])["call_id"], "7");

    let resp = r#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"hi"}]}}"#;
    h.server_sends(resp).await;
    assert_eq!(h.client_gets().await, format!("{resp}\n").into_bytes());
    let records = h.records(2).await;
    let o = body(&records[1]);
    assert_eq!(o["status"], "ok");
    assert_eq!(o["decision"], records[0].hash().to_hex());
    assert!(o["output_hash"].is_string());
    assert_eq!(records[1].prev, Some(records[0].hash()));
    // Each hash is SHA-256(salt || JCS(content)) with the salt kept in the
    // store (protocol.md §6.1): the arguments, then the result object.
    for (seq, member, content) in [
        (0, "input_hash", r#"{"a":"é","b":1}"#),
        (
            1,
            "output_hash",
            r#"{"content":[{"text":"hi","type":"text"}]}"#,
        ),
    ] {
        let secret = h.store.secret(seq).unwrap().expect("a salt is kept");
        let salt: [u8; 16] = hex::decode(&secret.salt).unwrap().try_into().unwrap();
        assert_eq!(
            body(&records[seq as usize])[member],
            tally_schemas::hash::salted_hash(&salt, content.as_bytes()).to_hex(),
            "{member}"
        );
    }
}

#[tokio::test]
async fn fail_closed_when_the_decision_cannot_be_committed() {
    // The first commit (a decision) succeeds, the next fails.
    let mut h = setup(ProxyConfig::default(), Some(1), None);
    let msg = h.second_call_refused().await;
    assert!(
        msg.contains("not forwarded")
            && msg.contains("could not be recorded")
            && msg.contains("No space left"),
        "{msg}"
    );
    h.server_gets_the_ping_next().await;
    assert_eq!(h.store.records(0, 10).unwrap().len(), 1);
}

#[tokio::test]
async fn errors_cancellations_and_server_exit_end_calls() {
    let mut h = setup(ProxyConfig::default(), None, None);
    for id in ["\"a\"", "2", "3", "4", "5"] {
        h.client_sends(&call(id, "t")).await;
        h.server_gets().await;
    }
    h.server_sends(r#"{"jsonrpc":"2.0","id":"a","error":{"code":-32602,"message":"bad"}}"#)
        .await;
    h.client_gets().await;
    h.server_sends(r#"{"jsonrpc":"2.0","id":2,"result":{"isError":true,"content":[]}}"#)
        .await;
    h.client_gets().await;
    h.client_sends(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3,"reason":"user"}}"#).await;
    assert_eq!(
        js(&h.server_gets().await)["method"],
        "notifications/cancelled"
    );
    // A late answer to the cancelled call is forwarded but ends nothing twice.
    h.server_sends(r#"{"jsonrpc":"2.0","id":3,"result":{"content":[]}}"#)
        .await;
    h.client_gets().await;
    // The server dies with calls 4 and 5 in flight.
    h.server.shutdown().await.unwrap();
    let mut errors = Vec::new();
    for _ in 0..2 {
        errors.push(js(&line_of(&mut h.from_gateway).await));
    }
    let ids: BTreeSet<String> = errors.iter().map(|e| e["id"].to_string()).collect();
    assert_eq!(ids, BTreeSet::from(["4".to_string(), "5".to_string()]));
    assert!(errors.iter().all(|e| e["error"]["code"] == -32002));
    let report = h.proxy.await.unwrap();
    assert_eq!(report.server_exited_calls, 2);
    assert_eq!(report.client_gone_calls, 0);

    let status_by_call = outcome_statuses(&h.store, 10).await;
    assert_eq!(
        status_by_call.into_iter().collect::<Vec<_>>(),
        vec![
            ("2", "error"),
            ("3", "cancelled"),
            ("4", "server_exited"),
            ("5", "server_exited"),
            ("a", "error"),
        ]
        .into_iter()
        .map(|(c, s)| (c.to_owned(), s.to_owned()))
        .collect::<Vec<_>>()
    );
}

fn tools_answer(id: &str, tools: &[(&str, &str)], next: Option<&str>) -> String {
    let tools: Vec<Value> = tools
        .iter()
        .map(|(n, d)| json!({"name": n, "description": d, "inputSchema": {"type": "object"}}))
        .collect();
    let mut result = json!({"tools": tools});
    if let Some(c) = next {
        result["nextCursor"] = json!(c);
    }
    json!({"jsonrpc": "2.0", "id": serde_json::from_str::<Value>(id).unwrap(), "result": result})
        .to_string()
}

fn tool_names(r: &Record) -> Vec<(String, bool)> {
    match &r.body {
        Body::Tools(t) => t
            .tools
            .iter()
            .map(|e| (e.name.clone(), e.recorded))
            .collect(),
        other => panic!("not a tools record: {other:?}"),
    }
}

#[tokio::test]
async fn tool_lists_are_recorded_once_per_change_pages_joined_and_relisted_after_list_changed() {
    let mut h = setup(
        ProxyConfig {
            record_only_prefix: Some("db_".into()),
            ..ProxyConfig::default()
        },
        None,
        None,
    );
    // Two pages from the client's own listing.
    h.client_sends(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
        .await;
    h.server_gets().await;
    h.server_sends(&tools_answer("1", &[("db_query", "q")], Some("p2")))
        .await;
    h.client_gets().await;
    h.client_sends(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"cursor":"p2"}}"#)
        .await;
    h.server_gets().await;
    h.server_sends(&tools_answer("2", &[("send_mail", "m")], None))
        .await;
    h.client_gets().await;
    let r = h.records(1).await;
    assert_eq!(
        tool_names(&r[0]),
        vec![("db_query".into(), true), ("send_mail".into(), false)]
    );

    // The same list again is not recorded again.
    h.client_sends(r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#)
        .await;
    h.server_gets().await;
    h.server_sends(&tools_answer(
        "3",
        &[("db_query", "q"), ("send_mail", "m")],
        None,
    ))
    .await;
    h.client_gets().await;

    // list_changed: the gateway lists the tools itself, and keeps the answer.
    h.server_sends(r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#)
        .await;
    assert_eq!(
        js(&h.client_gets().await)["method"],
        "notifications/tools/list_changed"
    );
    let own = js(&h.server_gets().await);
    assert_eq!(own["method"], "tools/list");
    let own_id = own["id"].to_string();
    assert!(own_id.contains("tally-gateway:"));
    h.server_sends(&tools_answer(
        &own_id,
        &[("db_query", "q, now with a changed description")],
        None,
    ))
    .await;
    let r = h.records(2).await;
    assert_eq!(r.len(), 2);
    assert_eq!(tool_names(&r[1]), vec![("db_query".into(), true)]);
    // The client never saw the gateway's own answer: the next line it gets is this ping.
    h.server_sends(r#"{"jsonrpc":"2.0","id":"s1","method":"ping"}"#)
        .await;
    assert_eq!(js(&h.client_gets().await)["id"], "s1");

    // A call to an unrecorded tool passes without records.
    h.client_sends(&call("9", "send_mail")).await;
    h.server_gets().await;
    h.server_sends(r#"{"jsonrpc":"2.0","id":9,"result":{"content":[]}}"#)
        .await;
    h.client_gets().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.store.records(0, 10).unwrap().len(), 2);
}

#[tokio::test]
async fn requests_that_cannot_be_recorded_faithfully_are_refused() {
    let mut h = setup(ProxyConfig::default(), None, None);
    let refused = [
        // Duplicate key: the server might read other arguments than recorded.
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"x":1,"x":2}}}"#,
        // An integer no double holds exactly.
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"a","arguments":{"x":9007199254740993}}}"#,
        // No tool name.
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"arguments":{}}}"#,
        // A batch holding a call.
        r#"[{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"a"}}]"#,
    ];
    for (i, line) in refused.iter().enumerate() {
        h.client_sends(line).await;
        let err = js(&h.client_gets().await);
        assert_eq!(err["id"], i + 1, "{line}");
        assert_eq!(err["error"]["code"], -32001, "{line}");
    }
    // A request id already in flight.
    h.client_sends(&call("5", "a")).await;
    h.server_gets().await;
    h.client_sends(&call("5", "a")).await;
    assert_eq!(
        js(&h.client_gets().await)["error"]["data"]["tally"],
        "duplicate_request_id"
    );
    h.client_sends(r#"{"jsonrpc":"2.0","id":6,"method":"ping"}"#)
        .await;
    assert_eq!(js(&h.server_gets().await)["id"], 6);
}

#[tokio::test]
async fn strict_calls_wait_for_an_accepted_receipt() {
    let (progress, rx) = watch::channel(SyncProgress::default());
    let mut h = setup(
        ProxyConfig {
            strict: StrictPolicy::Tools(BTreeSet::from(["pay".to_string()])),
            strict_timeout: Duration::from_millis(300),
            actions: tally_gateway::calls::ActionConfig::default(),
            ..ProxyConfig::default()
        },
        None,
        Some(rx),
    );
    // Not strict for this tool: forwarded at once.
    h.client_sends(&call("1", "read")).await;
    assert_eq!(js(&h.server_gets().await)["id"], 1);

    // Strict: held until the sync says seq 1 is receipted.
    h.client_sends(&call("2", "pay")).await;
    h.client_sends(r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#)
        .await;
    assert_eq!(
        js(&h.server_gets().await)["id"],
        3,
        "the held call must not overtake"
    );
    progress.send_modify(|p| p.cursor = 2);
    assert_eq!(js(&h.server_gets().await)["id"], 2);

    // No receipt in time: refused, outcome not_run.
    h.client_sends(&call("4", "pay")).await;
    let err = js(&h.client_gets().await);
    assert_eq!(err["id"], 4);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("missing receipt"),
        "{err}"
    );

    // Syncing halted (a receipt failed acceptance): refused with the reason.
    progress.send_modify(|p| {
        p.halted = Some(SyncErrorNote {
            time: UnixMillis::new(0),
            seq: Some(4),
            code: "receipt_untrusted".into(),
            message: "untrusted receipt: checkpoint is not signed by the trusted key".into(),
        })
    });
    h.client_sends(&call("5", "pay")).await;
    let err = js(&h.client_gets().await);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("untrusted receipt"),
        "{err}"
    );
    h.client_sends(r#"{"jsonrpc":"2.0","id":6,"method":"ping"}"#)
        .await;
    assert_eq!(
        js(&h.server_gets().await)["id"],
        6,
        "calls 4 and 5 never reached the server"
    );

    let records = h.records(6).await;
    let not_run: Vec<String> = records
        .iter()
        .filter_map(|r| match &r.body {
            Body::Outcome(o) if o.status.as_str() == "not_run" => Some(o.call_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(not_run, vec!["4".to_string(), "5".to_string()]);
}

#[tokio::test]
async fn strict_without_a_witness_refuses() {
    let mut h = setup(
        ProxyConfig {
            strict: StrictPolicy::All,
            ..ProxyConfig::default()
        },
        None,
        None,
    );
    h.client_sends(&call("1", "anything")).await;
    let err = js(&h.client_gets().await);
    assert!(err["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no witness is configured"));
}

/// Waits until the chain has `n` records, then maps each outcome's call id
/// to its status (one outcome per call, each naming its decision).
async fn outcome_statuses(
    store: &ChainStore,
    n: usize,
) -> std::collections::BTreeMap<String, String> {
    let mut records = Vec::new();
    for _ in 0..500 {
        records = store.records(0, 1000).unwrap();
        if records.len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(records.len(), n, "{records:#?}");
    let mut out = std::collections::BTreeMap::new();
    for r in &records {
        if let Body::Outcome(o) = &r.body {
            let d = records
                .iter()
                .find(|d| d.hash() == o.decision)
                .expect("outcome names a decision");
            assert!(matches!(&d.body, Body::Decision(dd) if dd.call_id == o.call_id));
            assert!(
                out.insert(o.call_id.clone(), o.status.as_str().to_owned())
                    .is_none(),
                "one outcome per call"
            );
        }
    }
    out
}

#[tokio::test]
async fn calls_in_flight_when_the_client_closes_its_input_end_as_client_gone() {
    let mut h = setup(ProxyConfig::default(), None, None);
    for id in ["1", "2", "3"] {
        h.client_sends(&call(id, "t")).await;
        h.server_gets().await;
    }
    h.client.shutdown().await.unwrap();
    // The server's input is closed: the MCP stdio shutdown.
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), h.to_server.read_to_end(&mut rest))
        .await
        .expect("the server's input closes")
        .unwrap();
    assert!(rest.is_empty());
    // An answer that still comes ends its call as usual, and the client (which
    // may still read) gets it.
    h.server_sends(r#"{"jsonrpc":"2.0","id":2,"result":{"content":[]}}"#)
        .await;
    assert_eq!(js(&h.client_gets().await)["id"], 2);
    // Then the server exits without answering 1 and 3.
    h.server.shutdown().await.unwrap();
    let mut errors = Vec::new();
    for _ in 0..2 {
        errors.push(js(&h.client_gets().await));
    }
    let ids: BTreeSet<String> = errors.iter().map(|e| e["id"].to_string()).collect();
    assert_eq!(ids, BTreeSet::from(["1".to_string(), "3".to_string()]));
    assert!(errors
        .iter()
        .all(|e| e["error"]["code"] == -32003 && e["error"]["data"]["tally"] == "client_gone"));
    let report = h.proxy.await.unwrap();
    assert_eq!(
        (report.client_gone_calls, report.server_exited_calls),
        (2, 0)
    );
    let statuses = outcome_statuses(&h.store, 6).await;
    assert_eq!(
        statuses.into_iter().collect::<Vec<_>>(),
        vec![
            ("1".to_string(), "client_gone".to_string()),
            ("2".to_string(), "ok".to_string()),
            ("3".to_string(), "client_gone".to_string()),
        ]
    );
}

#[tokio::test]
async fn a_client_that_stops_reading_is_gone_and_later_calls_are_not_forwarded() {
    let mut h = setup(ProxyConfig::default(), None, None);
    for id in ["1", "2"] {
        h.client_sends(&call(id, "t")).await;
        h.server_gets().await;
    }
    // The client dies on its reading side: the next answer cannot be written.
    let from_gateway =
        std::mem::replace(&mut h.from_gateway, BufReader::new(tokio::io::duplex(1).0));
    drop(from_gateway);
    h.server_sends(r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#)
        .await;
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), h.to_server.read_to_end(&mut rest))
        .await
        .expect("the server's input closes once writing to the client fails")
        .unwrap();
    assert!(rest.is_empty());
    // Input that still comes from the client is not forwarded and not recorded.
    h.client_sends(&call("3", "t")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    h.server.shutdown().await.unwrap();
    let report = h.proxy.await.unwrap();
    assert_eq!(report.client_gone_calls, 1);
    let statuses = outcome_statuses(&h.store, 4).await;
    assert_eq!(
        statuses.into_iter().collect::<Vec<_>>(),
        vec![
            ("1".to_string(), "ok".to_string()),
            ("2".to_string(), "client_gone".to_string()),
        ]
    );
}

#[tokio::test]
async fn a_strict_call_held_when_the_client_goes_away_is_not_run() {
    let (_progress, rx) = watch::channel(SyncProgress::default());
    let mut h = setup(
        ProxyConfig {
            strict: StrictPolicy::All,
            strict_timeout: Duration::from_secs(30),
            actions: tally_gateway::calls::ActionConfig::default(),
            ..ProxyConfig::default()
        },
        None,
        Some(rx),
    );
    h.client_sends(&call("1", "pay")).await;
    h.records(1).await;
    h.client.shutdown().await.unwrap();
    // Ended at once, not after the 30 s receipt timeout.
    let err = js(&h.client_gets().await);
    assert_eq!(err["id"], 1);
    assert_eq!(err["error"]["data"]["tally"], "client_gone");
    let mut rest = Vec::new();
    h.to_server.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty(), "the held call never reached the server");
    h.server.shutdown().await.unwrap();
    h.proxy.await.unwrap();
    let statuses = outcome_statuses(&h.store, 2).await;
    assert_eq!(statuses["1"], "not_run");
}

// ---- with the record journal (the default) ----

#[tokio::test]
async fn with_the_journal_a_decision_is_journaled_before_forwarding_and_committed_after() {
    let mut path = std::path::PathBuf::new();
    let mut h = setup_with(ProxyConfig::default(), None, |dir, store| {
        path = dir.join("chain.redb");
        let j = Journal::open(&journal_path(&path)).unwrap();
        Recorder::start_journaled(agent(), key(), Arc::new(SystemClock), store, j).unwrap()
    });
    h.client_sends(&call("1", "echo")).await;
    h.server_gets().await;
    // When the server has the call, its decision is in the journal (in the
    // OS: a kill -9 now keeps it, see tests/it/kill9.rs).
    let journaled = journal::read(&journal_path(&path)).unwrap();
    assert_eq!(journaled.records.len(), 1);
    assert_eq!(body(&journaled.records[0].record)["call_id"], "1");
    assert!(journaled.records[0].secret.is_some());
    // And it reaches the store right after, as does the outcome.
    h.server_sends(r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#)
        .await;
    h.client_gets().await;
    let records = h.records(2).await;
    assert_eq!(records[0], journaled.records[0].record);
    assert_eq!(body(&records[1])["status"], "ok");
    // Closing commits everything and empties the journal.
    h.client.shutdown().await.unwrap();
    h.server.shutdown().await.unwrap();
    h.proxy.await.unwrap();
    h._recorder.close();
    assert_eq!(std::fs::metadata(journal_path(&path)).unwrap().len(), 0);
    assert_eq!(h.store.records(0, 10).unwrap().len(), 2);
}

#[tokio::test]
async fn with_the_journal_fail_closed_when_the_decision_cannot_be_journaled() {
    let mut path = std::path::PathBuf::new();
    let mut h = setup_with(ProxyConfig::default(), None, |dir, store| {
        path = dir.join("chain.redb");
        let j = JournalFailAfter {
            inner: Journal::open(&journal_path(&path)).unwrap(),
            allowed: 1,
        };
        Recorder::start_journaled(agent(), key(), Arc::new(SystemClock), store, j).unwrap()
    });
    let msg = h.second_call_refused().await;
    assert!(
        msg.contains("not forwarded") && msg.contains("Input/output error"),
        "{msg}"
    );
    h.server_gets_the_ping_next().await;
    assert_eq!(h.records(1).await.len(), 1);
    assert_eq!(
        journal::read(&journal_path(&path)).unwrap().records.len(),
        1,
        "nothing of the refused decision is in the journal"
    );
}

#[tokio::test]
async fn with_the_journal_calls_are_refused_while_the_store_refuses_commits() {
    let failures = Arc::new(AtomicUsize::new(0));
    let mut path = std::path::PathBuf::new();
    let mut h = setup_with(ProxyConfig::default(), None, |dir, store| {
        path = dir.join("chain.redb");
        let j = Journal::open(&journal_path(&path)).unwrap();
        let store = FailAfter {
            inner: store,
            allowed: AtomicUsize::new(1),
            failures: Arc::clone(&failures),
        };
        Recorder::start_journaled(agent(), key(), Arc::new(SystemClock), store, j).unwrap()
    });
    h.client_sends(&call("1", "echo")).await;
    h.server_gets().await;
    h.records(1).await;
    // Journaled, so forwarded; then its store commit fails.
    h.client_sends(&call("2", "echo")).await;
    assert_eq!(js(&h.server_gets().await)["id"], 2);
    for _ in 0..500 {
        if failures.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    h.client_sends(&call("3", "echo")).await;
    let err = js(&h.client_gets().await);
    assert_eq!(err["id"], 3);
    let msg = err["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("refuses commits") && msg.contains("No space left"),
        "{msg}"
    );
    // The forwarded call's decision is kept in the journal for the next open.
    let journaled = journal::read(&journal_path(&path)).unwrap();
    let calls: Vec<String> = journaled
        .records
        .iter()
        .map(|a| body(&a.record)["call_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(calls, ["1", "2"]);
    assert_eq!(h.store.records(0, 10).unwrap().len(), 1);
}
