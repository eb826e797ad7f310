//! Retrying a record whose answer was lost (protocol.md §8, docs/api.md
//! "POST /v1/records"): an exact resubmission of an admitted record gets
//! its original receipt at any later time, whatever has happened to clocks
//! and keys since, and the agent side recovers from a lost answer however
//! late it syncs again.
//!
//! - through the real `tally serve` with `--max-skew 2`: a record posted,
//!   then posted again after the skew window and after its agent's key was
//!   rotated; and the same for a batch;
//! - through the real `tally record` and `tally agent sync`, with a proxy
//!   in front of the witness that loses the answers of record posts;
//! - an agent's syncer (in-process, with the witness served on loopback)
//!   whose clock and the witness's move on by an hour before it retries:
//!   beyond the agent's own skew bound for receipts.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand_core::OsRng;
use serde_json::Value;
use tally_schemas::note::NoteVerifier;
use tally_schemas::{SecretKey, UnixMillis};
use tally_testkit::clock::TestClock;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::common::hostile;
use crate::{batch_e2e, common};

use common::agent::Agent;
use common::{tally, Server};

async fn post(http: &reqwest::Client, url: &str, key: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
    let r = http
        .post(format!("{url}/v1/records"))
        .bearer_auth(key)
        .body(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.bytes().await.unwrap().to_vec())
}

async fn tree_size(http: &reqwest::Client, url: &str) -> u64 {
    let v: Value = http
        .get(format!("{url}/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["tree_size"].as_u64().unwrap()
}

/// Rotates `agent`'s key (from now on) with the real `tally agent rotate`.
fn rotate(url: &str, api_key: &str, agent: &str) {
    let env = [("TALLY_WITNESS_URL", url), ("TALLY_API_KEY", api_key)];
    let new_key = SecretKey::generate(&mut OsRng);
    let (ok, out, err) = tally(
        &[
            "agent",
            "rotate",
            agent,
            "--public-key",
            &new_key.public_key().to_base64(),
        ],
        &env,
    );
    assert!(ok, "{out}{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_reposted_after_the_skew_window_and_a_key_rotation_gets_its_original_receipt() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &["--max-skew", "2"]);
    let (url, key) = (server.url.clone(), server.banner_value("API key"));
    let log_key = NoteVerifier::from_vkey(&server.banner_value("witness key")).unwrap();
    let http = reqwest::Client::new();
    let mut bot = Agent::new("retry-bot");
    bot.register(&http, &url, &key).await;

    let r0 = bot.draft("the answer to this post is lost");
    let (s, first) = post(&http, &url, &key, r0.canonical_bytes().to_vec()).await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&first));
    tally_schemas::Receipt::from_json(&first)
        .unwrap()
        .verify(&r0, &log_key)
        .unwrap();
    bot.accepted(&r0);

    // Past the skew window: a new record with r0's time would be refused.
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let (s, again) = post(&http, &url, &key, r0.canonical_bytes().to_vec()).await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&again));
    assert_eq!(again, first, "not the original receipt");

    // The agent's key is rotated (from now on); the retry still gets it.
    rotate(&url, &key, "retry-bot");
    let (s, b) = post(
        &http,
        &url,
        &key,
        bot.draft("old key, after the rotation")
            .canonical_bytes()
            .to_vec(),
    )
    .await;
    assert_eq!(
        s,
        422,
        "the rotation did not take effect: {}",
        String::from_utf8_lossy(&b)
    );
    let (s, again) = post(&http, &url, &key, r0.canonical_bytes().to_vec()).await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&again));
    assert_eq!(again, first, "not the original receipt");
    assert_eq!(
        tree_size(&http, &url).await,
        1,
        "a retry was appended again"
    );
}

/// The same through `POST /v1/records/batch`: a batch sent again at once
/// (each retry passes every check and the log recognises it), after the
/// skew window, and after the agent's key was rotated (each retry refused by
/// a check, then found in the log) gets the original receipts byte for
/// byte, beside a new record that the rotation refuses; nothing is
/// appended twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_resent_after_the_skew_window_and_a_key_rotation_gets_its_original_receipts() {
    use tally_schemas::batch::{BatchAnswer, BatchOutcome, BatchRequest};

    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &["--max-skew", "2"]);
    let (url, key) = (server.url.clone(), server.banner_value("API key"));
    let http = reqwest::Client::new();
    let mut bot = Agent::new("batch-retry-bot");
    bot.register(&http, &url, &key).await;
    let post_batch = |body: Vec<u8>| {
        let (http, url, key) = (http.clone(), url.clone(), key.clone());
        async move {
            let (status, answer) = batch_e2e::post_batch(&http, &url, &key, body).await;
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
            BatchAnswer::from_json(&answer).unwrap()
        }
    };

    let r0 = bot.next("r0");
    let r1 = bot.next("r1");
    let body = BatchRequest::to_json([&r0, &r1]);
    let first = post_batch(body.clone()).await;
    for outcome in &first.results {
        assert!(matches!(outcome, BatchOutcome::Receipt(_)), "{outcome:?}");
    }
    let again = post_batch(body.clone()).await;
    assert_eq!(again.results, first.results, "at once");

    // Past the skew window: new records with these times would be refused.
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let again = post_batch(body.clone()).await;
    assert_eq!(again.results, first.results, "after the skew window");

    rotate(&url, &key, "batch-retry-bot");
    let r2 = bot.draft("old key, after the rotation");
    let again = post_batch(BatchRequest::to_json([&r0, &r1, &r2])).await;
    assert_eq!(again.results[..2], first.results[..], "after the rotation");
    assert_eq!(again.results[2].code(), Some("key_not_active"), "{again:?}");
    assert_eq!(
        tree_size(&http, &url).await,
        2,
        "a retry was appended again"
    );
}

/// A TCP proxy in front of the witness that, while `lose` is set, forwards
/// `POST /v1/records` requests but drops their answers and closes the
/// client's connection: the witness admitted the record, the agent never
/// heard.
struct LossyProxy {
    url: String,
    lose: Arc<AtomicBool>,
    lost: Arc<AtomicUsize>,
}

async fn lossy_proxy(upstream: SocketAddr) -> LossyProxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let lose = Arc::new(AtomicBool::new(false));
    let lost = Arc::new(AtomicUsize::new(0));
    let (lose2, lost2) = (Arc::clone(&lose), Arc::clone(&lost));
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(upstream).await else {
                continue;
            };
            let (lose, lost) = (Arc::clone(&lose2), Arc::clone(&lost2));
            tokio::spawn(pump(client, server, lose, lost));
        }
    });
    LossyProxy { url, lose, lost }
}

async fn pump(client: TcpStream, server: TcpStream, lose: Arc<AtomicBool>, lost: Arc<AtomicUsize>) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let posted = Arc::new(AtomicBool::new(false));
    let posted2 = Arc::clone(&posted);
    let upstream = tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if lose.load(Ordering::SeqCst) && buf[..n].windows(16).any(|w| w == b"POST /v1/records")
            {
                posted2.store(true, Ordering::SeqCst);
            }
            if sw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match sr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if posted.load(Ordering::SeqCst) {
            // The witness answered; the agent never gets it.
            lost.fetch_add(1, Ordering::SeqCst);
            break;
        }
        if cw.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    upstream.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_sync_recovers_a_lost_answer_after_the_skew_window_and_a_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &["--max-skew", "2"]);
    let (url, key) = (server.url.clone(), server.banner_value("API key"));
    let http = reqwest::Client::new();
    let proxy = lossy_proxy(hostile::addr_of(&url)).await;
    let state = dir.path().join("state");
    let state = state.to_str().unwrap();
    let admin = [
        ("TALLY_WITNESS_URL", url.as_str()),
        ("TALLY_API_KEY", key.as_str()),
    ];
    let agent_env = [("TALLY_STATE_DIR", state)];

    // The agent talks to the witness through the proxy.
    let (ok, out, err) = tally(
        &[
            "agent",
            "init",
            "lossy-bot",
            "--witness",
            &proxy.url,
            "--api-key",
            &key,
        ],
        &agent_env,
    );
    assert!(ok, "{out}{err}");
    let pk = out
        .lines()
        .find_map(|l| l.strip_prefix("public key: "))
        .unwrap()
        .trim()
        .to_owned();
    let (ok, out, err) = tally(&["agent", "add", "lossy-bot", "--public-key", &pk], &admin);
    assert!(ok, "{out}{err}");

    // The record reaches the witness; every answer is lost for a second.
    proxy.lose.store(true, Ordering::SeqCst);
    let (_, out, err) = tally(
        &[
            "record",
            "note",
            "lost answer",
            "--agent",
            "lossy-bot",
            "--sync-timeout",
            "1",
        ],
        &agent_env,
    );
    let line: Value = serde_json::from_str(out.trim()).unwrap_or_else(|_| panic!("{out}{err}"));
    assert_eq!(line["receipt"], "pending", "{out}{err}");
    assert!(proxy.lost.load(Ordering::SeqCst) >= 1, "no answer was lost");
    assert_eq!(
        tree_size(&http, &url).await,
        1,
        "the witness did not admit the record"
    );

    // Later than the skew window, and after the agent's key was rotated on
    // the witness, the agent syncs again and gets the original receipt.
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let new_key = SecretKey::generate(&mut OsRng);
    let (ok, out, err) = tally(
        &[
            "agent",
            "rotate",
            "lossy-bot",
            "--public-key",
            &new_key.public_key().to_base64(),
        ],
        &admin,
    );
    assert!(ok, "{out}{err}");
    proxy.lose.store(false, Ordering::SeqCst);
    let (ok, out, err) = tally(
        &["agent", "sync", "lossy-bot", "--timeout", "20"],
        &agent_env,
    );
    assert!(ok, "the agent did not recover: {out}{err}");
    assert!(
        out.contains("synced: 1 records, all receipted"),
        "{out}{err}"
    );
    assert_eq!(
        tree_size(&http, &url).await,
        1,
        "a retry was appended again"
    );
}

/// The agent's syncer retries an hour after its answer was lost: beyond the
/// witness's skew bound and the agent's own bound for receipt times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_syncer_accepts_the_original_receipt_an_hour_after_the_answer_was_lost() {
    use tally_gateway::acceptance::{TrustedLogKey, WitnessTrust};
    use tally_gateway::recorder::Recorder;
    use tally_gateway::store::ChainStore;
    use tally_gateway::sync::{Step, Syncer};
    use tally_gateway::witness::WitnessClient;
    use tally_schemas::record::NoteBody;
    use tally_schemas::{AgentName, Body};

    let dir = tempfile::tempdir().unwrap();
    let t0 = UnixMillis::now().as_millis();
    let clock = Arc::new(TestClock(AtomicI64::new(t0)));
    // The witness, on loopback, with the shared clock.
    let config = tally_witness::ServeConfig {
        data_dir: dir.path().join("data"),
        ..Default::default()
    };
    let opened =
        tally_witness::server::open(&config, None, clock.clone(), Box::new(OsRng)).unwrap();
    let witness = opened.witness;
    let api_key = opened.first_start.unwrap().api_key.token;
    let name = AgentName::new("late-bot").unwrap();
    let agent_key = SecretKey::generate(&mut OsRng);
    witness
        .registry()
        .add_agent(
            "default",
            &name,
            agent_key.public_key(),
            UnixMillis::new(t0 - 60_000),
        )
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(tally_witness::server::serve(
        listener,
        tally_witness::http::router(Arc::clone(&witness)),
        tally_witness::server::ServeOptions::default(),
        std::future::pending::<()>(),
    ));

    // The agent records; its post reaches the witness, the answer is lost.
    let store = Arc::new(ChainStore::open(&dir.path().join("chain.redb")).unwrap());
    let recorder =
        Recorder::start(name.clone(), agent_key, clock.clone(), Arc::clone(&store)).unwrap();
    let record = recorder
        .handle()
        .append(
            Body::Note(NoteBody {
                text: "lost answer".into(),
            }),
            None,
        )
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let (s, first) = post(&http, &url, &api_key, record.canonical_bytes().to_vec()).await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&first));

    // An hour later (both clocks), the syncer sends the record again.
    clock.0.fetch_add(3_600_000, Ordering::SeqCst);
    let trust = WitnessTrust::new(vec![TrustedLogKey {
        verifier: witness.log().verifier().clone(),
        not_before: None,
        not_after: None,
    }]);
    let syncer = Syncer::new(
        Arc::clone(&store),
        name.as_str(),
        WitnessClient::new(&url, Some(api_key)).unwrap(),
        trust,
        clock.clone(),
        tally_schemas::limits::DEFAULT_MAX_SKEW_MS,
    )
    .with_window(1);
    let step = syncer
        .sync_until_idle(tokio::time::Instant::now() + Duration::from_secs(20))
        .await;
    assert_eq!(step, Step::Idle, "{step:?}");
    let status = store.status().unwrap();
    assert_eq!((status.receipted, status.sync_cursor), (1, 1));
    assert_eq!(
        store.receipt(0).unwrap().unwrap(),
        first,
        "not the original receipt"
    );
    recorder.close();
}
