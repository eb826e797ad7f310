//! Syncing against a fake witness that speaks the witness HTTP contract on
//! loopback (docs/api.md, docs/protocol.md §8): records go in order,
//! receipts are accepted before they are stored, transient errors are
//! retried, a fork halts syncing, a witness that lost records gets them
//! again, and `--strict` calls wait for a real receipt.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tally_gateway::acceptance::{TrustedLogKey, WitnessTrust};
use tally_gateway::chain::AgentChain;
use tally_gateway::proxy::{run_proxy, ProxyConfig, ProxyDeps, StrictPolicy};
use tally_gateway::recorder::Recorder;
use tally_gateway::store::ChainStore;
use tally_gateway::sync::{Step, Syncer};
use tally_gateway::witness::WitnessClient;
use tally_schemas::note::NoteSigner;
use tally_schemas::record::NoteBody;
use tally_schemas::time::SystemClock;
use tally_schemas::tree::reference;
use tally_schemas::{
    AgentName, Body, Checkpoint, Entry, Hash, LeafIndex, Nonce, Receipt, Record, SecretKey, Seq,
    TreeSize, UnixMillis, UnsignedRecord,
};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::sync::{watch, Notify};

const ORIGIN: &str = "fake.test/log";

#[derive(Default)]
struct Log {
    leaves: Vec<Hash>,
    heads: HashMap<String, (u64, Hash)>,
    receipts: HashMap<Hash, Value>,
    fail_next: usize,
    posts: Vec<u64>,
    /// Seqs in the order they were admitted.
    admitted: Vec<u64>,
    /// Posts hold this long (varying by seq) before they are looked at, so
    /// concurrent posts overtake each other.
    jitter_ms: u64,
    in_flight: usize,
    max_in_flight: usize,
    /// Refused for good (400 clock_skew).
    refuse_seq: Option<u64>,
}

#[derive(Clone)]
struct Fake {
    log: Arc<Mutex<Log>>,
    /// The key checkpoints are signed with (tests swap it).
    signer: Arc<Mutex<Arc<NoteSigner>>>,
    /// The key directory served; `None`: just the signer's key, current.
    keys: Arc<Mutex<Option<Value>>>,
}

impl Fake {
    fn signer(&self) -> Arc<NoteSigner> {
        Arc::clone(&self.signer.lock().unwrap())
    }
}

fn err(status: StatusCode, body: Value) -> (StatusCode, Json<Value>) {
    (status, Json(body))
}

async fn post_record(State(f): State<Fake>, body: axum::body::Bytes) -> (StatusCode, Json<Value>) {
    let record = match Record::from_json(&body) {
        Ok(r) => r,
        Err(e) => {
            return err(
                StatusCode::BAD_REQUEST,
                json!({"error": {"code": "malformed", "message": e.to_string()}}),
            )
        }
    };
    let jitter = {
        let mut log = f.log.lock().unwrap();
        log.in_flight += 1;
        log.max_in_flight = log.max_in_flight.max(log.in_flight);
        (record.seq.get() * 7919) % (log.jitter_ms + 1)
    };
    if jitter > 0 {
        tokio::time::sleep(Duration::from_millis(jitter)).await;
    }
    let mut log = f.log.lock().unwrap();
    log.in_flight -= 1;
    log.posts.push(record.seq.get());
    if log.refuse_seq == Some(record.seq.get()) {
        return err(
            StatusCode::BAD_REQUEST,
            json!({"error": {"code": "clock_skew", "message": "too far from the witness clock"}}),
        );
    }
    if log.fail_next > 0 {
        log.fail_next -= 1;
        return err(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"error": {"code": "overloaded", "message": "busy"}}),
        );
    }
    if let Some(r) = log.receipts.get(&record.hash()) {
        return (StatusCode::OK, Json(r.clone()));
    }
    let head = log.heads.get(record.agent.as_str()).copied();
    let extends = match head {
        None => record.seq == Seq::GENESIS,
        Some((seq, hash)) => record.seq.get() == seq + 1 && record.prev == Some(hash),
    };
    if !extends {
        let head = head.map_or(Value::Null, |(seq, hash)| json!({"seq": seq, "hash": hash}));
        return err(
            StatusCode::CONFLICT,
            json!({"error": {"code": "chain_conflict", "message": "does not extend the chain", "head": head}}),
        );
    }
    let index = log.leaves.len() as u64;
    let received = UnixMillis::now();
    let entry = Entry::new(LeafIndex::new(index), received, record.clone()).unwrap();
    log.leaves.push(entry.leaf_hash());
    let size = log.leaves.len() as u64;
    let checkpoint = f
        .signer()
        .sign_checkpoint(&Checkpoint::new(
            ORIGIN,
            TreeSize::new(size),
            reference::root(&log.leaves),
        ))
        .unwrap();
    let receipt = Receipt {
        v: 1,
        record_hash: record.hash(),
        nonce: record.nonce.clone(),
        index: LeafIndex::new(index),
        received,
        checkpoint,
        inclusion: reference::inclusion_proof(index as usize, &log.leaves),
    };
    let v = serde_json::to_value(&receipt).unwrap();
    log.receipts.insert(record.hash(), v.clone());
    log.heads
        .insert(record.agent.to_string(), (record.seq.get(), record.hash()));
    log.admitted.push(record.seq.get());
    (StatusCode::OK, Json(v))
}

async fn keys(State(f): State<Fake>) -> Json<Value> {
    if let Some(k) = f.keys.lock().unwrap().clone() {
        return Json(k);
    }
    Json(
        json!({"v": 1, "origin": ORIGIN, "keys": [{"vkey": f.signer().verifier().vkey(), "not_before": KEYS_FROM, "not_after": null}]}),
    )
}

async fn start_fake(signer_seed: u8) -> (String, Fake) {
    let fake = Fake {
        log: Arc::new(Mutex::new(Log::default())),
        signer: Arc::new(Mutex::new(Arc::new(log_key(signer_seed)))),
        keys: Arc::default(),
    };
    let app = Router::new()
        .route("/v1/records", post(post_record))
        .route("/.well-known/tally/keys", get(keys))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, fake)
}

struct Agent {
    store: Arc<ChainStore>,
    recorder: Recorder,
    _dir: tempfile::TempDir,
}

fn agent() -> Agent {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(ChainStore::open(&dir.path().join("chain.redb")).unwrap());
    let recorder = Recorder::start(
        AgentName::new("sync-bot").unwrap(),
        SecretKey::from_seed(&[8; 32]),
        Arc::new(SystemClock),
        Arc::clone(&store),
    )
    .unwrap();
    Agent {
        store,
        recorder,
        _dir: dir,
    }
}

fn log_key(seed: u8) -> NoteSigner {
    NoteSigner::from_secret(ORIGIN, SecretKey::from_seed(&[seed; 32])).unwrap()
}

fn pinned(seed: u8) -> WitnessTrust {
    let signer = log_key(seed);
    WitnessTrust::new(vec![TrustedLogKey {
        verifier: signer.verifier().clone(),
        not_before: None,
        not_after: None,
    }])
}

fn syncer(a: &Agent, url: &str, trust: WitnessTrust) -> Syncer {
    Syncer::new(
        Arc::clone(&a.store),
        "sync-bot",
        WitnessClient::new(url, Some("test-key".into())).unwrap(),
        trust,
        Arc::new(SystemClock),
        300_000,
    )
}

async fn note(a: &Agent, text: &str) -> Record {
    a.recorder
        .handle()
        .append(Body::Note(NoteBody { text: text.into() }), None)
        .await
        .unwrap()
}

fn soon() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(10)
}

#[tokio::test]
async fn syncs_in_order_retries_transient_failures_and_stores_accepted_receipts() {
    let (url, fake) = start_fake(1).await;
    let a = agent();
    for i in 0..3 {
        note(&a, &format!("n{i}")).await;
    }
    fake.log.lock().unwrap().fail_next = 2;
    // One post at a time, so the order of posts is exact.
    let s = syncer(&a, &url, pinned(1)).with_window(1);
    assert_eq!(s.sync_until_idle(soon()).await, Step::Idle);
    let st = a.store.status().unwrap();
    assert_eq!((st.records, st.receipted, st.sync_cursor), (3, 3, 3));
    assert_eq!(st.last_sync_error, None);
    assert_eq!(fake.log.lock().unwrap().posts, vec![0, 0, 0, 1, 2]);
    assert_eq!(
        *s.progress().borrow(),
        tally_gateway::sync::SyncProgress {
            cursor: 3,
            // Two failed posts, then three that were receipted and the
            // look that found nothing left.
            attempts: 6,
            ..Default::default()
        }
    );
    // Nothing left: a second run sends nothing.
    assert_eq!(s.sync_until_idle(soon()).await, Step::Idle);
    assert_eq!(fake.log.lock().unwrap().posts.len(), 5);
}

#[tokio::test]
async fn a_receipt_that_is_not_accepted_halts_syncing_and_is_not_stored() {
    let (url, _fake) = start_fake(1).await;
    let a = agent();
    note(&a, "n0").await;
    let s = syncer(&a, &url, pinned(2)); // another key is pinned
    match s.sync_until_idle(soon()).await {
        Step::Halt(n) => assert_eq!(n.code, "receipt_untrusted", "{n:?}"),
        other => panic!("{other:?}"),
    }
    let st = a.store.status().unwrap();
    assert_eq!((st.receipted, st.sync_cursor), (0, 0));
    assert_eq!(st.last_sync_error.unwrap().code, "receipt_untrusted");
}

#[tokio::test]
async fn a_different_chain_at_the_witness_is_a_fork() {
    let (url, fake) = start_fake(1).await;
    // Someone else wrote seq 0 of this agent's chain.
    let other = UnsignedRecord {
        agent: AgentName::new("sync-bot").unwrap(),
        key_id: SecretKey::from_seed(&[9; 32]).public_key().key_id(),
        seq: Seq::GENESIS,
        prev: None,
        time: UnixMillis::now(),
        nonce: Nonce::from_bytes(vec![1; 16]).unwrap(),
        body: Body::Note(NoteBody {
            text: "not ours".into(),
        }),
    }
    .sign(&SecretKey::from_seed(&[9; 32]))
    .unwrap();
    fake.log
        .lock()
        .unwrap()
        .heads
        .insert("sync-bot".into(), (0, other.hash()));
    let a = agent();
    note(&a, "ours").await;
    let s = syncer(&a, &url, pinned(1));
    match s.sync_until_idle(soon()).await {
        Step::Halt(n) => assert!(n.message.contains("FORK"), "{n:?}"),
        other => panic!("{other:?}"),
    }
    assert!(a.store.fork().unwrap().is_some());

    // A witness ahead of our chain is a fork too.
    fake.log
        .lock()
        .unwrap()
        .heads
        .insert("sync-bot".into(), (5, other.hash()));
    let b = agent();
    note(&b, "ours").await;
    match syncer(&b, &url, pinned(1)).sync_until_idle(soon()).await {
        Step::Halt(n) => assert!(n.message.contains("beyond our local chain"), "{n:?}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn records_a_witness_lost_are_sent_again_and_the_old_receipts_kept() {
    let (url, fake) = start_fake(1).await;
    let a = agent();
    let first = note(&a, "n0").await;
    note(&a, "n1").await;
    note(&a, "n2").await;
    let s = syncer(&a, &url, pinned(1)).with_window(1);
    assert_eq!(s.sync_until_idle(soon()).await, Step::Idle);
    {
        // The witness forgets everything after seq 0.
        let mut log = fake.log.lock().unwrap();
        log.heads.insert("sync-bot".into(), (0, first.hash()));
        log.receipts.retain(|h, _| *h == first.hash());
    }
    note(&a, "n3").await;
    assert_eq!(s.sync_until_idle(soon()).await, Step::Idle);
    let st = a.store.status().unwrap();
    assert_eq!((st.records, st.receipted, st.sync_cursor), (4, 4, 4));
    // The receipts the witness issued before it lost the records stay, as evidence.
    assert_eq!(st.superseded_receipts, 2);
    assert_eq!(fake.log.lock().unwrap().posts[3..], [3, 1, 2, 3]);
}

#[tokio::test]
async fn without_a_witness_at_all_sync_retries_and_records_the_error() {
    let a = agent();
    note(&a, "n0").await;
    let s = syncer(&a, "http://127.0.0.1:9", pinned(1));
    match s
        .sync_until_idle(tokio::time::Instant::now() + Duration::from_millis(500))
        .await
    {
        Step::Retry(n) => assert_eq!(n.code, "transport"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        a.store.status().unwrap().last_sync_error.unwrap().code,
        "transport"
    );
}

#[tokio::test]
async fn a_strict_call_is_forwarded_once_its_decision_is_receipted() {
    let (url, fake) = start_fake(1).await;
    let a = agent();
    let s = Arc::new(syncer(&a, &url, pinned(1)));
    let (_stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(Arc::clone(&s).run(a.recorder.handle().committed(), stop_rx));

    let (client_end, gw_client) = tokio::io::duplex(1 << 16);
    let (server_end, gw_server) = tokio::io::duplex(1 << 16);
    let (ci, co) = tokio::io::split(gw_client);
    let (so, si) = tokio::io::split(gw_server);
    let deps = ProxyDeps {
        chain: AgentChain::with_writer(
            a.recorder.handle(),
            Some(Arc::clone(&a.store)),
            Some(s.progress()),
        ),
        client_gone: Arc::new(Notify::new()),
    };
    let config = ProxyConfig {
        strict: StrictPolicy::All,
        strict_timeout: Duration::from_secs(10),
        actions: tally_gateway::calls::ActionConfig::default(),
        ..ProxyConfig::default()
    };
    tokio::spawn(run_proxy(config, deps, ci, co, si, so));
    let (_from_gw, mut client) = tokio::io::split(client_end);
    let (to_server, _server) = tokio::io::split(server_end);
    let mut to_server = BufReader::new(to_server);
    client
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"pay\",\"arguments\":{}}}\n")
        .await
        .unwrap();
    let mut line = Vec::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        to_server.read_until(b'\n', &mut line),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(line.starts_with(b"{\"jsonrpc\":\"2.0\",\"id\":1"));
    // By the time the server saw the call, the witness had its decision.
    assert_eq!(fake.log.lock().unwrap().posts, vec![0]);
    assert!(a.store.receipt(0).unwrap().is_some());
    let kinds: BTreeSet<_> = a
        .store
        .records(0, 10)
        .unwrap()
        .iter()
        .map(|r| r.kind().as_str())
        .collect();
    assert_eq!(kinds, BTreeSet::from(["decision"]));
}

// ---- log keys retired after they were pinned ----

/// When the fake's log keys start (docs/protocol.md §4.5: always a time).
const KEYS_FROM: &str = "2020-01-01T00:00:00.000Z";

fn directory(entries: &[(&NoteSigner, Option<UnixMillis>)]) -> Value {
    let keys: Vec<Value> = entries
        .iter()
        .map(|(k, not_after)| {
            json!({"vkey": k.verifier().vkey(), "not_before": KEYS_FROM, "not_after": not_after})
        })
        .collect();
    json!({"v": 1, "origin": ORIGIN, "keys": keys})
}

#[tokio::test]
async fn a_pinned_key_retired_later_is_honoured_from_its_retirement_on() {
    let (url, fake) = start_fake(1).await;
    let a = agent();
    note(&a, "n0").await;
    let s = syncer(&a, &url, pinned(1));
    assert_eq!(s.sync_until_idle(soon()).await, Step::Idle);
    assert!(a.store.receipt(0).unwrap().is_some());

    // The operator retires the key; this witness goes on signing with it.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let retired_at = UnixMillis::now();
    *fake.keys.lock().unwrap() = Some(directory(&[(&log_key(1), Some(retired_at))]));
    note(&a, "n1").await;
    // The next gateway run checks the key directory before it posts.
    let s = syncer(&a, &url, pinned(1));
    match s.sync_until_idle(soon()).await {
        Step::Halt(n) => {
            assert_eq!(n.code, "receipt_untrusted", "{n:?}");
            assert!(
                n.message.contains("which the witness retired at")
                    && n.message.contains(&retired_at.to_string()),
                "{}",
                n.message
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.trust().keys()[0].not_after, Some(retired_at));
    let st = a.store.status().unwrap();
    assert_eq!(
        (st.receipted, st.sync_cursor),
        (1, 1),
        "seq 1's receipt is not stored"
    );
    // The receipt from before the retirement still stands.
    let r0 =
        tally_gateway::acceptance::parse_receipt(&a.store.receipt(0).unwrap().unwrap()).unwrap();
    assert!(r0.received < retired_at);
    tally_gateway::acceptance::accept_receipt(
        &r0,
        &a.store.record(0).unwrap().unwrap(),
        &s.trust(),
        UnixMillis::now(),
        300_000,
    )
    .unwrap();
}

#[tokio::test]
async fn a_running_syncer_checks_the_key_directory_again_after_its_interval() {
    let (url, fake) = start_fake(1).await;
    let a = agent();
    note(&a, "n0").await;
    let s = syncer(&a, &url, pinned(1)).with_key_check_interval(Duration::from_millis(200));
    assert_eq!(s.sync_until_idle(soon()).await, Step::Idle);
    let retired_at = UnixMillis::now();
    *fake.keys.lock().unwrap() = Some(directory(&[(&log_key(1), Some(retired_at))]));
    tokio::time::sleep(Duration::from_millis(300)).await;
    note(&a, "n1").await;
    match s.sync_until_idle(soon()).await {
        Step::Halt(n) => assert!(n.message.contains("retired at"), "{}", n.message),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_witness_that_signs_with_a_new_key_is_refused_and_the_key_is_not_pinned() {
    let (url, fake) = start_fake(1).await;
    let dir = tempfile::tempdir().unwrap();
    let state = tally_gateway::state::StateDir::new(dir.path());
    let name = AgentName::new("sync-bot").unwrap();
    state
        .create_agent_with(&name, &SecretKey::from_seed(&[8; 32]), None, None)
        .unwrap();
    let mut config = state.load_config(&name).unwrap();
    config.witness = Some(tally_gateway::state::WitnessConfig {
        url: url.clone(),
        origin: ORIGIN.into(),
        keys: vec![tally_gateway::state::PinnedKey {
            vkey: log_key(1).verifier().vkey(),
            not_before: None,
            not_after: None,
        }],
    });
    state.save_config(&config).unwrap();
    let a = agent();
    note(&a, "n0").await;
    let s = tally_gateway::open_syncer(&state, &name, Arc::clone(&a.store), Arc::new(SystemClock))
        .unwrap()
        .unwrap();
    assert_eq!(s.sync_until_idle(soon()).await, Step::Idle);

    // A rotation: key 1 retired, key 2 current and signing.
    let retired_at = UnixMillis::now();
    *fake.keys.lock().unwrap() = Some(directory(&[
        (&log_key(1), Some(retired_at)),
        (&log_key(2), None),
    ]));
    *fake.signer.lock().unwrap() = Arc::new(log_key(2));
    note(&a, "n1").await;
    // Not due for a key check yet: the untrusted receipt triggers one.
    match s.sync_until_idle(soon()).await {
        Step::Halt(n) => {
            assert_eq!(n.code, "receipt_untrusted");
            assert!(
                n.message.contains("not pinned")
                    && n.message.contains(&log_key(2).verifier().vkey())
                    && n.message.contains("tally agent init"),
                "{}",
                n.message
            );
        }
        other => panic!("{other:?}"),
    }
    // The retirement is written to the agent's configuration; the new key
    // is trusted nowhere.
    let pins = state.load_config(&name).unwrap().witness.unwrap().keys;
    assert_eq!(pins.len(), 1);
    assert_eq!(pins[0].not_after, Some(retired_at));
    assert!(s
        .trust()
        .keys()
        .iter()
        .all(|k| k.verifier == *log_key(1).verifier()));
    assert_eq!(a.store.status().unwrap().sync_cursor, 1);
}

// ---- a witness without the batch route ----

/// The fake has no `POST /v1/records/batch` (an older witness): the syncer
/// falls back to one post at a time, in chain order, so nothing overtakes
/// and no post is refused. Batches against the real witness are tested in
/// tests/it/agent_batch_sync.rs.
#[tokio::test]
async fn a_witness_without_the_batch_route_gets_one_record_at_a_time_in_order() {
    let (url, fake) = start_fake(1).await;
    fake.log.lock().unwrap().jitter_ms = 15;
    let a = agent();
    for i in 0..40 {
        note(&a, &format!("n{i}")).await;
    }
    let s = syncer(&a, &url, pinned(1)).with_window(8);
    assert_eq!(s.sync_until_idle(soon()).await, Step::Idle);
    let st = a.store.status().unwrap();
    assert_eq!((st.records, st.receipted, st.sync_cursor), (40, 40, 40));
    assert_eq!(st.last_sync_error, None);
    let log = fake.log.lock().unwrap();
    assert_eq!(log.admitted, (0..40).collect::<Vec<u64>>());
    assert_eq!(log.max_in_flight, 1, "posts overlapped");
    assert_eq!(log.posts.len(), 40, "a post was refused and sent again");
}

#[tokio::test]
async fn a_later_record_refused_for_good_halts_syncing_when_it_reaches_the_cursor() {
    let (url, fake) = start_fake(1).await;
    fake.log.lock().unwrap().refuse_seq = Some(2);
    let a = agent();
    for i in 0..6 {
        note(&a, &format!("n{i}")).await;
    }
    let s = syncer(&a, &url, pinned(1)).with_window(8);
    match s.sync_until_idle(soon()).await {
        Step::Halt(n) => assert_eq!((n.code.as_str(), n.seq), ("clock_skew", Some(2)), "{n:?}"),
        other => panic!("{other:?}"),
    }
    let st = a.store.status().unwrap();
    assert_eq!((st.receipted, st.sync_cursor), (2, 2));
    assert_eq!(fake.log.lock().unwrap().admitted, vec![0, 1]);
}

// ---- the SDK's sync ----

/// `SdkAgent::sync` right after a burst of calls waits for every one of
/// them, those still in the journal and outcomes queued without waiting
/// too, not only for what the store had committed when it was called.
#[test]
fn an_sdk_sync_right_after_many_calls_waits_for_all_of_them() {
    use tally_gateway::sdk::{SdkAgent, SdkOptions};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (url, fake) = rt.block_on(start_fake(1));
    let dir = tempfile::tempdir().unwrap();
    let state = tally_gateway::state::StateDir::new(dir.path());
    let name = AgentName::new("sync-bot").unwrap();
    state
        .create_agent_with(&name, &SecretKey::from_seed(&[8; 32]), None, None)
        .unwrap();
    let mut config = state.load_config(&name).unwrap();
    config.witness = Some(tally_gateway::state::WitnessConfig {
        url,
        origin: ORIGIN.into(),
        keys: vec![tally_gateway::state::PinnedKey {
            vkey: log_key(1).verifier().vkey(),
            not_before: None,
            not_after: None,
        }],
    });
    state.save_config(&config).unwrap();
    let sdk = SdkAgent::open(
        "sync-bot",
        SdkOptions {
            state_dir: Some(dir.path().to_owned()),
            ..SdkOptions::default()
        },
    )
    .unwrap();
    for i in 0..300 {
        let call = sdk
            .decide("lookup", None, format!("{{\"i\":{i}}}").as_bytes())
            .unwrap();
        sdk.outcome(&call, "ok", Some(b"true")).unwrap();
    }
    let s = sdk.sync(Duration::from_secs(60)).unwrap();
    assert!(s.complete, "{s:?}");
    assert_eq!((s.records, s.pending), (600, 0), "{s:?}");
    assert_eq!(fake.log.lock().unwrap().admitted.len(), 600);
    // An outcome queued just before the sync, with nothing after it.
    for _ in 0..20 {
        let call = sdk.decide("lookup", None, b"{}").unwrap();
        sdk.outcome(&call, "error", None).unwrap();
        let s = sdk.sync(Duration::from_secs(60)).unwrap();
        assert!(s.complete && s.pending == 0, "{s:?}");
    }
    assert_eq!(fake.log.lock().unwrap().admitted.len(), 640);
    sdk.close();
}
