//! Two ACTIVE fronts on one PostgreSQL database, through the real binary
//! (docs/operations.md, "Running on PostgreSQL"): both admit records and
//! serve reads, the lease holder sequences, and the other hands its
//! records over through the database.
//! - a record admitted through one front and retried through the other
//!   gets the same receipt, byte for byte, both ways;
//! - races of the same (agent, seq) and of the same nonce, one post through
//!   each front at once, have exactly one winner; the other gets a stable
//!   refusal code (`chain_conflict`, `nonce_replayed`);
//! - the follower serves the log's reads (checkpoint, proofs);
//! - a follower with no sequencer answers 503 `sequencer_unavailable` at
//!   its waiting bound, and the record resent later gets its receipt;
//! - `tally-bench ingest` posts through both fronts.

use std::time::Duration;

use rand_core::OsRng;
use serde_json::Value;
use tally_schemas::note::{open_checkpoint, NoteVerifier};
use tally_schemas::{Nonce, Receipt, Record};

use crate::common;

use common::agent::Agent;
use common::Server;

async fn post(http: &reqwest::Client, url: &str, key: &str, r: &Record) -> (u16, Vec<u8>) {
    let resp = common::post_record(http, url, key, r).await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.bytes().await.unwrap().to_vec())
}

fn code(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body).unwrap()["error"]["code"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_active_fronts_give_one_receipt_per_record_and_one_winner_per_race() {
    let _alone = common::not_beside_heavy_async().await;
    let Some(db_url) = tally_testkit::postgres::database() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (data_a, data_b) = (tmp.path().join("a"), tmp.path().join("b"));
    let args = [
        "--store",
        db_url.as_str(),
        "--lease-ttl",
        "2",
        "--rate-limit",
        "0",
    ];
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();

    // Front a makes the data folder and registers the agents; b gets a
    // copy (for the log's key; the registry is in the database).
    let a = Server::start(&data_a, &args);
    let api_key = a.banner_value("API key");
    let vkey = a.banner_value("witness key");
    let log_key = NoteVerifier::from_vkey(&vkey).unwrap();
    let mut agents: Vec<Agent> = (0..4).map(|i| Agent::new(&format!("front-{i}"))).collect();
    for ag in &agents {
        ag.register(&http, &a.url, &api_key).await;
    }
    let listen_a = a.url.trim_start_matches("http://").to_owned();
    assert!(a.sigterm().success());
    common::copy_dir(&data_a, &data_b);
    let a = Server::start_at(&data_a, &listen_a, &args);
    // The second front starts at once (it follows) and serves.
    let b = Server::start(&data_b, &args);
    let fronts = [a.url.clone(), b.url.clone()];

    // 1. Admitted through one front, retried through the other: the same
    // receipt, byte for byte, both ways.
    for (first, second) in [(0usize, 1usize), (1, 0), (1, 1), (0, 0)] {
        let ag = &mut agents[0];
        let r = ag.record(&format!("via {first}"), Nonce::random(&mut OsRng));
        let (s1, raw1) = post(&http, &fronts[first], &api_key, &r).await;
        assert_eq!(s1, 200, "{}", String::from_utf8_lossy(&raw1));
        Receipt::from_json(&raw1)
            .unwrap()
            .verify(&r, &log_key)
            .expect("the receipt verifies");
        let (s2, raw2) = post(&http, &fronts[second], &api_key, &r).await;
        assert_eq!(s2, 200, "{}", String::from_utf8_lossy(&raw2));
        assert_eq!(
            raw1, raw2,
            "a record admitted through front {first} got another receipt through front {second}"
        );
        ag.accepted(&r);
    }

    // 2. Races: the same (agent, seq), or the same nonce, through both
    // fronts at once. Exactly one wins each.
    let pairs = 20;
    let (mut chain_refusals, mut nonce_refusals) = (0, 0);
    for k in 0..pairs {
        let (x, y) = if k % 2 == 0 { (0, 1) } else { (1, 0) };
        // Same agent and seq, two different records.
        let ag = &agents[1];
        let r1 = ag.record(&format!("race {k} one"), Nonce::random(&mut OsRng));
        let r2 = ag.record(&format!("race {k} two"), Nonce::random(&mut OsRng));
        let (o1, o2) = tokio::join!(
            post(&http, &fronts[x], &api_key, &r1),
            post(&http, &fronts[y], &api_key, &r2)
        );
        let winner = match (o1.0, o2.0) {
            (200, 409) => {
                assert_eq!(code(&o2.1), "chain_conflict");
                r1
            }
            (409, 200) => {
                assert_eq!(code(&o1.1), "chain_conflict");
                r2
            }
            other => panic!(
                "pair {k}: {other:?}: {} / {}",
                String::from_utf8_lossy(&o1.1),
                String::from_utf8_lossy(&o2.1)
            ),
        };
        chain_refusals += 1;
        agents[1].accepted(&winner);

        // One nonce, two agents' next records.
        let nonce = Nonce::random(&mut OsRng);
        let r1 = agents[2].record(&format!("nonce {k}"), nonce.clone());
        let r2 = agents[3].record(&format!("nonce {k}"), nonce);
        let (o1, o2) = tokio::join!(
            post(&http, &fronts[x], &api_key, &r1),
            post(&http, &fronts[y], &api_key, &r2)
        );
        match (o1.0, o2.0) {
            (200, 409) => {
                assert_eq!(code(&o2.1), "nonce_replayed");
                agents[2].accepted(&r1);
            }
            (409, 200) => {
                assert_eq!(code(&o1.1), "nonce_replayed");
                agents[3].accepted(&r2);
            }
            other => panic!(
                "nonce pair {k}: {other:?}: {} / {}",
                String::from_utf8_lossy(&o1.1),
                String::from_utf8_lossy(&o2.1)
            ),
        }
        nonce_refusals += 1;
    }
    eprintln!(
        "{pairs} seq races and {pairs} nonce races through two fronts: one winner each ({chain_refusals} chain_conflict, {nonce_refusals} nonce_replayed)"
    );

    // 3. The follower serves the log's reads: its checkpoint catches up
    // with the sequencer's and is consistent with it.
    let expected = 4 + pairs + pairs;
    let mut caught_up = false;
    for _ in 0..100 {
        let note = http
            .get(format!("{}/checkpoint", fronts[1]))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let cp = open_checkpoint(&note, &log_key).unwrap();
        if cp.size.get() == expected {
            caught_up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        caught_up,
        "the follower's checkpoint did not reach {expected}"
    );
    let a_note = http
        .get(format!("{}/checkpoint", fronts[0]))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let b_note = http
        .get(format!("{}/checkpoint", fronts[1]))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(a_note, b_note);
    let v: Value = http
        .get(format!(
            "{}/v1/proof/consistency?from=1&to={expected}",
            fronts[1]
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(v["consistency"].is_array(), "{v}");
    let pg = tally_testkit::postgres::shared();
    let db = db_url.rsplit('/').next().unwrap();
    assert_eq!(
        pg.psql(db, "SELECT count(*) FROM log_entries").trim(),
        expected.to_string()
    );
    // Every answered hand-over is collected and deleted (just after its
    // answer is sent, so give it a moment).
    let mut left = String::new();
    for _ in 0..50 {
        left = pg
            .psql(db, "SELECT count(*) FROM tally_pending")
            .trim()
            .to_owned();
        if left == "0" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(left, "0", "hand-over rows left in tally_pending");
    assert!(a.sigterm().success());
    assert!(b.sigterm().success());
}

/// The waiting bound (docs/operations.md, "Running on PostgreSQL"): a
/// follower whose sequencer is gone and whose lease cannot be taken
/// answers 503 `sequencer_unavailable` with Retry-After once the bound
/// (twice the lease ttl plus 2 s) is past, never 500; its request stays in
/// `tally_pending`, and once a sequencer is back the same record, sent
/// again, gets its receipt: the one issued for the queued request, the
/// same bytes through either front.
///
/// The sequencer is paused (SIGSTOP), and its lease is kept from expiring
/// by extending it in the database: a holder that renews but does not
/// answer, as far as the follower can tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_without_a_sequencer_answers_503_and_the_record_is_integrated_later() {
    let _alone = common::not_beside_heavy_async().await;
    let Some(db_url) = tally_testkit::postgres::database() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (data_a, data_b) = (tmp.path().join("a"), tmp.path().join("b"));
    // ttl 2 s: a waiting bound of 6 s. The sequencer renews every third of
    // the ttl, so its lease has at least 1.3 s left when it is stopped: time
    // for the test to extend it before the follower could take it.
    let args = [
        "--store",
        db_url.as_str(),
        "--lease-ttl",
        "2",
        "--rate-limit",
        "0",
    ];
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let a = Server::start(&data_a, &args);
    let api_key = a.banner_value("API key");
    let log_key = NoteVerifier::from_vkey(&a.banner_value("witness key")).unwrap();
    let mut agent = Agent::new("waiter");
    agent.register(&http, &a.url, &api_key).await;
    let listen_a = a.url.trim_start_matches("http://").to_owned();
    assert!(a.sigterm().success());
    common::copy_dir(&data_a, &data_b);
    let a = Server::start_at(&data_a, &listen_a, &args);
    let b = Server::start(&data_b, &args);
    let pg = tally_testkit::postgres::shared();
    let db = db_url.rsplit('/').next().unwrap();
    let sql = |q: &str| pg.psql(db, q).trim().to_owned();

    // A first record through the follower: the hand-over works.
    let first = agent.record("before", Nonce::random(&mut OsRng));
    let (s, raw) = post(&http, &b.url, &api_key, &first).await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&raw));
    agent.accepted(&first);

    // The sequencer stops answering, and keeps its lease.
    let token = sql("SELECT token FROM log_lease WHERE id = 1");
    a.signal("-STOP");
    let kept = sql(&format!(
        "UPDATE log_lease SET expires_at = clock_timestamp() + interval '1 hour' \
         WHERE id = 1 AND token = {token} AND expires_at > clock_timestamp() RETURNING token"
    ));
    assert_eq!(
        kept, token,
        "the stopped sequencer's lease ran out before the test could extend it"
    );
    let r = agent.record("while nobody sequences", Nonce::random(&mut OsRng));
    let started = std::time::Instant::now();
    let resp = common::post_record(&http, &b.url, &api_key, &r)
        .await
        .unwrap();
    let waited = started.elapsed();
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = resp.bytes().await.unwrap().to_vec();
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    assert_eq!(code(&body), "sequencer_unavailable");
    let seconds: u64 = retry_after
        .expect("a 503 sequencer_unavailable carries Retry-After")
        .parse()
        .expect("Retry-After in seconds");
    assert!(seconds >= 1);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert!(v["error"]["retry_after_ms"].as_u64().is_some(), "{v}");
    eprintln!("the follower answered 503 sequencer_unavailable after {waited:?} (lease ttl 2 s, bound 6 s)");
    // Nothing was integrated meanwhile, and the request waits in the table.
    assert_eq!(sql("SELECT count(*) FROM log_entries"), "1");
    assert_eq!(
        sql("SELECT count(*) FROM tally_pending WHERE answers IS NULL"),
        "1"
    );

    // The lease is free again and the old sequencer resumes: one of the two
    // fronts sequences, integrates the queued request, and the same record
    // sent again gets its receipt.
    sql("UPDATE log_lease SET expires_at = '-infinity' WHERE id = 1");
    a.signal("-CONT");
    let mut receipt = None;
    for _ in 0..30 {
        let (s, raw) = post(&http, &b.url, &api_key, &r).await;
        match s {
            200 => {
                receipt = Some(raw);
                break;
            }
            503 => assert_eq!(code(&raw), "sequencer_unavailable"),
            other => panic!("{other}: {}", String::from_utf8_lossy(&raw)),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let receipt = receipt.expect("no receipt after the sequencer came back");
    let parsed = Receipt::from_json(&receipt).unwrap();
    parsed.verify(&r, &log_key).expect("the receipt verifies");
    assert_eq!(parsed.index.get(), 1, "the record was integrated twice");
    let (s, again) = post(&http, &a.url, &api_key, &r).await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&again));
    assert_eq!(again, receipt, "the two fronts give different receipts");
    assert_eq!(sql("SELECT count(*) FROM log_entries"), "2");
    assert!(a.sigterm().success());
    assert!(b.sigterm().success());
}

/// `tally-bench ingest` through two fronts of one log (docs/benchmarks.md,
/// "Ingest on PostgreSQL, beside redb"): it registers every agent on both
/// (the second answers 409, as they share the registry), splits the workers between them, and every
/// record gets its receipt: the log holds them all, once.
#[test]
fn bench_ingest_posts_through_two_fronts() {
    let _alone = common::not_beside_heavy();
    let Some(db_url) = tally_testkit::postgres::database() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (data_a, data_b) = (tmp.path().join("a"), tmp.path().join("b"));
    let args = [
        "--store",
        db_url.as_str(),
        "--rate-limit",
        "0",
        "--max-skew",
        "86400",
    ];
    let a = Server::start(&data_a, &args);
    let api_key = a.banner_value("API key");
    let listen_a = a.url.trim_start_matches("http://").to_owned();
    assert!(a.sigterm().success());
    common::copy_dir(&data_a, &data_b);
    let a = Server::start_at(&data_a, &listen_a, &args);
    let b = Server::start(&data_b, &args);
    let (ok, out, err) = common::tally_bench(&[
        "ingest",
        "--records",
        "400",
        "--agents",
        "16",
        "--concurrency",
        "8",
        "--verify-secs",
        "0.2",
        "--witness",
        &a.url,
        "--witness",
        &b.url,
        "--api-key",
        &api_key,
    ]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("fronts:   2"), "{out}");
    assert!(out.contains("400 records in"), "{out}");
    assert!(out.contains("(0 errors)"), "{out}");
    let pg = tally_testkit::postgres::shared();
    let db = db_url.rsplit('/').next().unwrap();
    assert_eq!(
        pg.psql(db, "SELECT count(*) FROM log_entries").trim(),
        "400"
    );
    // Half of the workers posted through the follower: each of their 200
    // single-record requests was one tally_pending row (deleted once
    // answered, so count the ids handed out).
    assert_eq!(
        pg.psql(db, "SELECT last_value FROM tally_pending_id_seq")
            .trim(),
        "200"
    );
    assert!(a.sigterm().success());
    assert!(b.sigterm().success());
}
