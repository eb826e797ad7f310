//! The key-change fence across fronts (docs/protocol.md §4.1 "Key
//! changes"; docs/operations.md "Running on PostgreSQL"), through the real
//! binary: two fronts on one database whose registry reload is slowed down
//! (`TALLY_REGISTRY_RELOAD_MS`), so that neither sees a change made through
//! the other in its memory copy for the whole test. The database decides
//! anyway:
//! - a retirement through one front ends the old key for records the other
//!   admits (a follower here), and a rotation through the follower ends it
//!   for records the sequencer's own front admits: a record signed with the
//!   old key and timed after the change is refused `key_not_active` (the
//!   commit refuses it, and its front checks it again); one timed just
//!   before the change is admitted under the new ranges and gets an
//!   ordinary receipt; a record signed with a key rotated in through the
//!   other front is admitted by a front that has not reloaded;
//! - a key change through one front sees a record committed through the
//!   other after it last read the agent: an `at` at that record's time is
//!   refused `retroactive_key_change` naming it as `latest_record_time`;
//! - records posting through both fronts while every agent's key is
//!   rotated: afterwards every record in the log was signed with a key
//!   valid at its time (the rule of check 2, protocol.md §11).

use std::time::Duration;

use rand_core::OsRng;
use serde_json::{json, Value};
use tally_schemas::api::{AgentList, RegisteredAgent};
use tally_schemas::note::NoteVerifier;
use tally_schemas::{AgentName, Entry, Nonce, Receipt, Record, SecretKey, UnixMillis};

use crate::common;

use common::agent::Agent;
use common::Server;

/// Long enough that no front reloads its registry during a test.
const SLOW_RELOAD_MS: &str = "600000";

async fn post(http: &reqwest::Client, url: &str, key: &str, r: &Record) -> (u16, Value) {
    let resp = common::post_record(http, url, key, r).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.bytes().await.unwrap();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

/// `POST /v1/agents/{agent}/{action}` with `body`: status and answer.
async fn change(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    agent: &AgentName,
    action: &str,
    body: Value,
) -> (u16, Value) {
    let resp = http
        .post(format!("{url}/v1/agents/{agent}/{action}"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

/// Two fronts on the database at `db_url` with `agents` registered: front
/// a (which sequences: it starts first) and front b, both reloading their
/// registry only every [`SLOW_RELOAD_MS`]. Returns them, the API key and
/// the log's key.
async fn two_slow_fronts(
    http: &reqwest::Client,
    tmp: &std::path::Path,
    db_url: &str,
    agents: &[&Agent],
) -> (Server, Server, String, NoteVerifier) {
    let (data_a, data_b) = (tmp.join("a"), tmp.join("b"));
    let args = ["--store", db_url, "--lease-ttl", "2", "--rate-limit", "0"];
    let env = [("TALLY_REGISTRY_RELOAD_MS", SLOW_RELOAD_MS)];
    let a = Server::start_with_env(&data_a, "127.0.0.1:0", &args, &env);
    let api_key = a.banner_value("API key");
    let log_key = NoteVerifier::from_vkey(&a.banner_value("witness key")).unwrap();
    for ag in agents {
        ag.register(http, &a.url, &api_key).await;
    }
    // Both fronts need the log's key: b gets a copy of a's data folder.
    let listen_a = a.url.trim_start_matches("http://").to_owned();
    assert!(a.sigterm().success());
    common::copy_dir(&data_a, &data_b);
    let a = Server::start_with_env(&data_a, &listen_a, &args, &env);
    let b = Server::start_with_env(&data_b, "127.0.0.1:0", &args, &env);
    (a, b, api_key, log_key)
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn time_of(v: &Value) -> UnixMillis {
    UnixMillis::parse_rfc3339(v.as_str().unwrap_or_else(|| panic!("not a time: {v}"))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_change_through_one_front_binds_records_admitted_by_another() {
    let _alone = common::not_beside_heavy_async().await;
    let Some(db_url) = tally_testkit::postgres::database() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let http = http();
    let mut retiree = Agent::new("retiree");
    let mut rotor = Agent::new("rotor");
    let mut rekeyed = Agent::new("rekeyed");
    let (a, b, key, log_key) =
        two_slow_fronts(&http, tmp.path(), &db_url, &[&retiree, &rotor, &rekeyed]).await;

    // Both fronts admit the agents' records.
    for ag in [&mut retiree, &mut rotor, &mut rekeyed] {
        for url in [&a.url, &b.url] {
            let r = ag.record("before", Nonce::random(&mut OsRng));
            let (s, v) = post(&http, url, &key, &r).await;
            assert_eq!(s, 200, "{v}");
            ag.accepted(&r);
        }
    }

    // Retired through a (the sequencer's front); b has not reloaded.
    let (s, v) = change(&http, &a.url, &key, &retiree.name, "retire", json!({})).await;
    assert_eq!(s, 200, "{v}");
    let at = time_of(&v["keys"][0]["not_after"]);
    let r = retiree.record("after the retirement", Nonce::random(&mut OsRng));
    assert!(r.time >= at, "the record is timed after the change");
    let (s, v) = post(&http, &b.url, &key, &r).await;
    assert_eq!(
        (s, code(&v)),
        (422, "key_not_active"),
        "a front that had not reloaded admitted a record under a key retired through another front: {v}"
    );

    // Rotated through b (the follower); a, which sequences, has not
    // reloaded: a record signed with the new key is admitted through a
    // (which looks again, at once, for a key it does not know).
    let new_key = SecretKey::generate(&mut OsRng);
    let (s, v) = change(
        &http,
        &b.url,
        &key,
        &rekeyed.name,
        "rotate",
        json!({"public_key": new_key.public_key()}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    rekeyed.key = new_key;
    let r = rekeyed.record("new key", Nonce::random(&mut OsRng));
    let (s, v) = post(&http, &a.url, &key, &r).await;
    assert_eq!(
        s, 200,
        "a front that had not reloaded refused a key rotated in through another: {v}"
    );

    // Rotated through b again, for another agent: a is behind again.
    let new_key = SecretKey::generate(&mut OsRng);
    let (s, v) = change(
        &http,
        &b.url,
        &key,
        &rotor.name,
        "rotate",
        json!({"public_key": new_key.public_key()}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let agent: RegisteredAgent = serde_json::from_value(v).unwrap();
    let at = agent.keys[1].not_before;
    let old = rotor.key.clone();
    let late = rotor.record_with(
        &old,
        "old key after the rotation",
        UnixMillis::now(),
        Nonce::random(&mut OsRng),
    );
    assert!(late.time >= at);
    let (s, v) = post(&http, &a.url, &key, &late).await;
    assert_eq!(
        (s, code(&v)),
        (422, "key_not_active"),
        "the sequencer's own front admitted a record under a key rotated away through another front: {v}"
    );
    // Timed just before the change, the old key's record is admitted under
    // the new ranges and gets an ordinary receipt.
    let early = rotor.record_with(
        &old,
        "old key before the rotation",
        UnixMillis::new(at.as_millis() - 1),
        Nonce::random(&mut OsRng),
    );
    let (s, v) = post(&http, &a.url, &key, &early).await;
    assert_eq!(s, 200, "{v}");
    let receipt = Receipt::from_json(&serde_json::to_vec(&v).unwrap()).unwrap();
    receipt
        .verify(&early, &log_key)
        .expect("the receipt verifies");
    rotor.accepted(&early);
    rotor.key = new_key;
    for url in [&a.url, &b.url] {
        let r = rotor.record("new key", Nonce::random(&mut OsRng));
        let (s, v) = post(&http, url, &key, &r).await;
        assert_eq!(s, 200, "{v}");
        rotor.accepted(&r);
    }
    assert!(a.sigterm().success());
    assert!(b.sigterm().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_change_sees_records_committed_through_another_front() {
    let _alone = common::not_beside_heavy_async().await;
    let Some(db_url) = tally_testkit::postgres::database() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let http = http();
    let mut ag = Agent::new("late-reader");
    let (a, b, key, _) = two_slow_fronts(&http, tmp.path(), &db_url, &[&ag]).await;

    let first = ag.record("first", Nonce::random(&mut OsRng));
    let (s, v) = post(&http, &a.url, &key, &first).await;
    assert_eq!(s, 200, "{v}");
    ag.accepted(&first);
    // b reads the agent's history: a change at the first record's time is
    // refused, naming it.
    let (s, v) = change(
        &http,
        &b.url,
        &key,
        &ag.name,
        "retire",
        json!({"at": first.time}),
    )
    .await;
    assert_eq!((s, code(&v)), (409, "retroactive_key_change"), "{v}");
    assert_eq!(time_of(&v["error"]["latest_record_time"]), first.time);

    // A record committed through a after that, timed a little ahead.
    let ahead = ag.record_with(
        &ag.key.clone(),
        "ahead",
        UnixMillis::new(UnixMillis::now().as_millis() + 2_000),
        Nonce::random(&mut OsRng),
    );
    let (s, v) = post(&http, &a.url, &key, &ahead).await;
    assert_eq!(s, 200, "{v}");
    ag.accepted(&ahead);
    // A change through b at that record's time would make it fail check 2.
    let (s, v) = change(
        &http,
        &b.url,
        &key,
        &ag.name,
        "retire",
        json!({"at": ahead.time}),
    )
    .await;
    assert_eq!(
        (s, code(&v)),
        (409, "retroactive_key_change"),
        "a key change through b reached back before a record committed through a: {v}"
    );
    assert_eq!(time_of(&v["error"]["latest_record_time"]), ahead.time);
    assert_eq!(
        time_of(&v["error"]["earliest_at"]),
        UnixMillis::new(ahead.time.as_millis() + 1)
    );
    // Just after it, the change is made.
    let (s, v) = change(
        &http,
        &b.url,
        &key,
        &ag.name,
        "retire",
        json!({"at": UnixMillis::new(ahead.time.as_millis() + 1)}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert!(a.sigterm().success());
    assert!(b.sigterm().success());
}

/// Every record in the log was signed with a key of its agent valid at its
/// time, by the agents' ranges as the witness lists them (check 2's rule).
async fn every_record_passes_check_2(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    db: &str,
) -> usize {
    let list: AgentList = http
        .get(format!("{url}/v1/agents"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let rows = tally_testkit::postgres::shared().psql(
        db,
        "SELECT convert_from(canonical, 'UTF8') FROM log_entries ORDER BY idx",
    );
    let mut n = 0;
    for line in rows.lines().filter(|l| !l.is_empty()) {
        let entry = Entry::from_json(line.as_bytes()).unwrap();
        let r = entry.record();
        let agent = list
            .agents
            .iter()
            .find(|a| a.agent == r.agent)
            .unwrap_or_else(|| panic!("no agent {}", r.agent));
        let k = agent.keys.iter().find(|k| k.key_id == r.key_id).unwrap();
        assert!(
            k.active_at(r.time),
            "record {} of {} (time {}) is signed with key {}, valid [{}, {:?}): check 2 fails",
            r.seq,
            r.agent,
            r.time,
            r.key_id,
            k.not_before,
            k.not_after
        );
        n += 1;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn records_posted_through_both_fronts_during_rotations_all_pass_check_2() {
    let _alone = common::not_beside_heavy_async().await;
    let Some(db_url) = tally_testkit::postgres::database() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let http = http();
    let agents: Vec<Agent> = (0..4).map(|i| Agent::new(&format!("busy-{i}"))).collect();
    let refs: Vec<&Agent> = agents.iter().collect();
    let (a, b, key, _) = two_slow_fronts(&http, tmp.path(), &db_url, &refs).await;
    let fronts = [a.url.clone(), b.url.clone()];
    let new_keys: Vec<SecretKey> = agents
        .iter()
        .map(|_| SecretKey::generate(&mut OsRng))
        .collect();

    // Each agent posts, alternating fronts, with its old key until it has
    // seen `key_not_active` after the rotation, then with the new one.
    let mut tasks = Vec::new();
    for (i, (mut ag, new_key)) in agents.into_iter().zip(new_keys.clone()).enumerate() {
        let (http, key, fronts) = (http.clone(), key.clone(), fronts.clone());
        tasks.push(tokio::spawn(async move {
            let (mut admitted, mut refused) = (0u32, 0u32);
            let mut switched = false;
            // At least 40 records, and on until the old key was refused.
            let mut k = 0usize;
            while k < 40 || (!switched && k < 2000) {
                k += 1;
                let r = ag.record(&format!("{i}: {k}"), Nonce::random(&mut OsRng));
                let (s, v) = post(&http, &fronts[(i + k) % 2], &key, &r).await;
                match (s, code(&v)) {
                    (200, _) => {
                        ag.accepted(&r);
                        admitted += 1;
                    }
                    (422, "key_not_active") if !switched => {
                        refused += 1;
                        switched = true;
                        ag.key = new_key.clone();
                    }
                    other => panic!("agent {i}: {other:?}: {v}"),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (admitted, refused, switched)
        }));
    }
    // Rotations, through alternating fronts, while they post.
    tokio::time::sleep(Duration::from_millis(400)).await;
    for (i, new_key) in new_keys.iter().enumerate() {
        let name = AgentName::new(&format!("busy-{i}")).unwrap();
        let (s, v) = change(
            &http,
            &fronts[i % 2],
            &key,
            &name,
            "rotate",
            json!({"public_key": new_key.public_key()}),
        )
        .await;
        assert_eq!(s, 200, "{v}");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let mut switched_all = true;
    for t in tasks {
        let (admitted, refused, switched) = t.await.unwrap();
        eprintln!("admitted {admitted}, refused key_not_active {refused}");
        switched_all &= switched;
    }
    assert!(switched_all, "an agent never saw its old key refused");
    let db = db_url.rsplit('/').next().unwrap();
    let n = every_record_passes_check_2(&http, &a.url, &key, db).await;
    eprintln!("{n} records in the log, each signed with a key valid at its time");
    assert!(a.sigterm().success());
    assert!(b.sigterm().success());
}
