//! Key changes never rewrite witnessed history (docs/protocol.md §4.1 "Key
//! changes"): a rotation or retirement that would end a key before a record
//! the witness admitted, or before the skew bound, is refused; the default
//! instant moves past the agent's latest record; the rule survives a
//! restart and holds against admissions running at the same moment. Also
//! the registration rules: unusable keys and names held elsewhere.

use crate::common;

use std::sync::Arc;

use axum::http::StatusCode;
use base64::Engine as _;
use common::*;
use rand_core::OsRng;
use serde_json::{json, Value};
use tally_schemas::pack::AgentKeys;
use tally_schemas::report::Verdict;
use tally_schemas::{PublicKey, SecretKey, UnixMillis};
use tally_verifier::{verify, VerifyOptions};
use tally_witness::config::WitnessConfig;

fn config() -> WitnessConfig {
    WitnessConfig {
        rate_limit: None,
        ..WitnessConfig::default()
    }
}

fn assert_err(status: StatusCode, body: &[u8], want_status: u16, want_code: &str) {
    assert_eq!(
        (status.as_u16(), code(body).as_str()),
        (want_status, want_code),
        "{}",
        String::from_utf8_lossy(body)
    );
}

fn t(ms: i64) -> UnixMillis {
    UnixMillis::new(ms)
}

async fn rotate(
    h: &Harness,
    agent: &str,
    key: &PublicKey,
    at: Option<i64>,
) -> (StatusCode, Vec<u8>) {
    rotate_to(h, agent, &key.to_base64(), at).await
}

/// As [`rotate`], with the key as the request spells it (also keys
/// `PublicKey` cannot hold).
async fn rotate_to(h: &Harness, agent: &str, key: &str, at: Option<i64>) -> (StatusCode, Vec<u8>) {
    let mut body = json!({ "public_key": key });
    if let Some(at) = at {
        body["at"] = json!(t(at));
    }
    call(
        &h.app,
        "POST",
        &format!("/v1/agents/{agent}/rotate"),
        Some(&h.key_a),
        serde_json::to_vec(&body).unwrap(),
    )
    .await
}

async fn retire(h: &Harness, agent: &str, at: Option<i64>) -> (StatusCode, Vec<u8>) {
    let body = at.map_or_else(|| json!({}), |at| json!({ "at": t(at) }));
    call(
        &h.app,
        "POST",
        &format!("/v1/agents/{agent}/retire"),
        Some(&h.key_a),
        serde_json::to_vec(&body).unwrap(),
    )
    .await
}

/// Posts `n` records timed `time(i)` and returns the last record's time.
async fn post_chain(h: &Harness, a: &mut TestAgent, n: i64, time: impl Fn(i64) -> i64) -> i64 {
    let mut last = 0;
    for i in 0..n {
        last = time(i);
        let r = a.draft(last, &format!("record {i}"));
        let (s, b) = post(&h.app, Some(&h.key_a), bytes(&r)).await;
        assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
        a.accept(&r);
    }
    last
}

/// The agent's pack and keys pass the verifier.
async fn assert_pack_passes(h: &Harness, agent: &str) {
    let (s, keys) = call(&h.app, "GET", "/v1/agent-keys", Some(&h.key_a), vec![]).await;
    assert_eq!(s, StatusCode::OK);
    let keys = AgentKeys::from_json(&keys).unwrap();
    let (s, pack) = call(
        &h.app,
        "GET",
        &format!("/v1/export?agent={agent}"),
        Some(&h.key_a),
        vec![],
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&pack));
    let v = verify(
        pack.as_slice(),
        &keys,
        h.witness.log().verifier(),
        None,
        VerifyOptions::default(),
    )
    .unwrap();
    assert_eq!(v.report.result, Verdict::Pass, "{}", v.to_text());
}

#[tokio::test]
async fn a_change_before_an_admitted_record_or_the_skew_bound_is_refused() {
    let h = harness(config());
    let mut a = TestAgent::new("bot");
    a.register(&h.app, &h.key_a).await; // its key is valid from T0 - 1 h
    let latest = post_chain(&h, &mut a, 3, |i| T0 + i * 10).await;
    let new_key = SecretKey::generate(&mut OsRng).public_key();

    // The retroactive rotation (threat-model.md "Key changes and history"): the first key's not_before + 1 ms.
    for at in [T0 - 3_600_000 + 1, T0, latest - 1, latest] {
        let (s, b) = rotate(&h, "bot", &new_key, Some(at)).await;
        assert_err(s, &b, 409, "retroactive_key_change");
        let e = &json(&b)["error"];
        assert_eq!(e["agent"], "bot");
        assert_eq!(e["at"], json!(t(at)));
        assert_eq!(e["earliest_at"], json!(t(latest + 1)));
        assert_eq!(e["latest_record_time"], json!(t(latest)));
        let (s, b) = retire(&h, "bot", Some(at)).await;
        assert_err(s, &b, 409, "retroactive_key_change");
    }
    // Nothing was written: one key, still open.
    let (_, b) = call(&h.app, "GET", "/v1/agents", Some(&h.key_a), vec![]).await;
    assert_eq!(json(&b)["agents"][0]["keys"].as_array().unwrap().len(), 1);
    assert_eq!(json(&b)["agents"][0]["keys"][0]["not_after"], Value::Null);
    assert_pack_passes(&h, "bot").await;

    // Before now minus the skew bound, also for an agent without records.
    let quiet = TestAgent::new("quiet");
    quiet.register(&h.app, &h.key_a).await;
    h.clock.set(T0 + 1_000_000);
    let floor = T0 + 1_000_000 - 300_000;
    let (s, b) = retire(&h, "quiet", Some(floor - 1)).await;
    assert_err(s, &b, 409, "retroactive_key_change");
    assert_eq!(json(&b)["error"]["earliest_at"], json!(t(floor)));
    assert_eq!(json(&b)["error"]["latest_record_time"], Value::Null);
    let (s, b) = retire(&h, "quiet", Some(floor)).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));

    // Just after the latest record is the earliest instant allowed.
    let (s, b) = rotate(&h, "bot", &new_key, Some(latest + 1)).await;
    assert_err(s, &b, 409, "retroactive_key_change"); // the skew bound moved on
    h.clock.set(latest + 100);
    let (s, b) = rotate(&h, "bot", &new_key, Some(latest + 1)).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    assert_eq!(
        json(&b)["keys"][0]["not_after"],
        json!(t(latest + 1)),
        "the old key ends just after the latest record"
    );
    assert_pack_passes(&h, "bot").await;
}

#[tokio::test]
async fn without_an_instant_a_change_waits_for_a_record_timed_ahead_of_the_clock() {
    let h = harness(config());
    let mut a = TestAgent::new("fast-clock");
    a.register(&h.app, &h.key_a).await;
    // The agent's clock runs 200 s ahead of the witness's: within the bound.
    let ahead = post_chain(&h, &mut a, 2, |i| T0 + 200_000 + i).await;
    let new_key = SecretKey::generate(&mut OsRng);
    let (s, b) = rotate(&h, "fast-clock", &new_key.public_key(), None).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let keys = &json(&b)["keys"];
    assert_eq!(keys[0]["not_after"], json!(t(ahead + 1)));
    assert_eq!(keys[1]["not_before"], json!(t(ahead + 1)));
    assert_pack_passes(&h, "fast-clock").await;
    // The new key signs from there on; the old one no longer does.
    let old = std::mem::replace(&mut a.key, new_key);
    let r = a.draft(ahead + 1, "new key");
    let (s, b) = post(&h.app, Some(&h.key_a), bytes(&r)).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    a.accept(&r);
    let mut stale = TestAgent::new("fast-clock");
    (stale.key, stale.seq, stale.prev) = (old, a.seq, a.prev);
    let (s, b) = post(
        &h.app,
        Some(&h.key_a),
        bytes(&stale.draft(ahead + 2, "old")),
    )
    .await;
    assert_err(s, &b, 422, "key_not_active");
    // Retiring without an instant: after the new key's record, too.
    let (s, b) = retire(&h, "fast-clock", None).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    assert_eq!(json(&b)["keys"][1]["not_after"], json!(t(ahead + 2)));
    assert_pack_passes(&h, "fast-clock").await;
}

#[tokio::test]
async fn after_a_restart_the_records_in_the_log_still_bound_a_change() {
    let dir;
    let key_a;
    let latest;
    {
        let h = harness(config());
        let mut a = TestAgent::new("bot");
        a.register(&h.app, &h.key_a).await;
        // Agent times not in seq order: the latest time is not the head's.
        latest = T0 + 250_000;
        for (i, time) in [T0, latest, T0 + 5].into_iter().enumerate() {
            let r = a.draft(time, &format!("record {i}"));
            let (s, b) = post(&h.app, Some(&h.key_a), bytes(&r)).await;
            assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
            a.accept(&r);
        }
        key_a = h.key_a.clone();
        h.witness.log().shutdown();
        dir = h.dir;
    }
    let clock = Arc::new(TestClock(std::sync::atomic::AtomicI64::new(T0 + 10)));
    let (witness, _) = open_witness(dir.path(), config(), clock);
    let app = tally_witness::http::router(witness);
    let new_key = SecretKey::generate(&mut OsRng).public_key();
    let body = json!({"public_key": new_key, "at": t(T0 + 10)});
    let (s, b) = call(
        &app,
        "POST",
        "/v1/agents/bot/rotate",
        Some(&key_a),
        serde_json::to_vec(&body).unwrap(),
    )
    .await;
    assert_err(s, &b, 409, "retroactive_key_change");
    assert_eq!(json(&b)["error"]["latest_record_time"], json!(t(latest)));
    let (s, b) = call(
        &app,
        "POST",
        "/v1/agents/bot/retire",
        Some(&key_a),
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    assert_eq!(json(&b)["keys"][0]["not_after"], json!(t(latest + 1)));
}

/// A record admitted while a rotation runs must still pass check 2: each
/// round races one post (timed ahead of the clock, within the bound)
/// against one rotation without an instant, then checks the admitted
/// records against the keys the witness now lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_admitted_during_a_rotation_keeps_a_valid_key() {
    let h = harness(config());
    let h = Arc::new(h);
    let mut admitted_during_rotation = 0;
    for round in 0..60 {
        let name = format!("racer-{round}");
        let a = TestAgent::new(&name);
        a.register(&h.app, &h.key_a).await;
        let record = a.draft(T0 + 200_000, "racing a rotation");
        let new_key = SecretKey::generate(&mut OsRng).public_key();
        let (h1, h2) = (Arc::clone(&h), Arc::clone(&h));
        let posting =
            tokio::spawn(async move { post(&h1.app, Some(&h1.key_a), bytes(&record)).await });
        let n2 = name.clone();
        let rotating = tokio::spawn(async move { rotate(&h2, &n2, &new_key, None).await });
        let (posted, rotated) = (posting.await.unwrap(), rotating.await.unwrap());
        assert_eq!(
            rotated.0,
            StatusCode::OK,
            "{}",
            String::from_utf8_lossy(&rotated.1)
        );
        let old_key_end = json(&rotated.1)["keys"][0]["not_after"].clone();
        match posted.0.as_u16() {
            200 => {
                // Admitted: the old key must still be valid at its time.
                assert_eq!(
                    old_key_end,
                    json!(t(T0 + 200_001)),
                    "round {round}: admitted record timed T0+200 s, old key ends {old_key_end}"
                );
                if h.witness.log().chain_head(&a.name).unwrap().is_some() {
                    admitted_during_rotation += 1;
                }
            }
            422 => assert_eq!(code(&posted.1), "key_not_active", "round {round}"),
            other => panic!(
                "round {round}: {other} {}",
                String::from_utf8_lossy(&posted.1)
            ),
        }
    }
    assert!(admitted_during_rotation > 0, "no round admitted its record");
    for round in 0..60 {
        let name = format!("racer-{round}");
        if h.witness
            .log()
            .chain_head(&tally_schemas::AgentName::new(&name).unwrap())
            .unwrap()
            .is_some()
        {
            assert_pack_passes(&h, &name).await;
        }
    }
}

#[tokio::test]
async fn unusable_keys_are_refused_at_registration_and_rotation() {
    let h = harness(config());
    let mut small_order = [0u8; 32];
    small_order[0] = 1; // the identity point, y = 1
    let mut non_canonical = [0xffu8; 32]; // y = p + 3: a large-order point spelled with y >= p
    non_canonical[0] = 0xed + 3;
    non_canonical[31] = 0x7f;
    for (bytes_, reason) in [
        (small_order, "small_order"),
        (non_canonical, "non_canonical"),
    ] {
        // Weak keys cannot be held in a `PublicKey`: spell them as the wire does.
        let key = base64::engine::general_purpose::STANDARD.encode(bytes_);
        let body = json!({"agent": "weak", "public_key": key});
        let (s, b) = call(
            &h.app,
            "POST",
            "/v1/agents",
            Some(&h.key_a),
            serde_json::to_vec(&body).unwrap(),
        )
        .await;
        assert_err(s, &b, 400, "unusable_public_key");
        assert_eq!(json(&b)["error"]["reason"], reason);
        let a = TestAgent::new(&format!("strong-{reason}"));
        a.register(&h.app, &h.key_a).await;
        let (s, b) = rotate_to(&h, a.name.as_str(), &key, None).await;
        assert_err(s, &b, 400, "unusable_public_key");
        assert_eq!(json(&b)["error"]["reason"], reason);
    }
    let (_, b) = call(&h.app, "GET", "/v1/agents", Some(&h.key_a), vec![]).await;
    for agent in json(&b)["agents"].as_array().unwrap() {
        assert_eq!(agent["keys"].as_array().unwrap().len(), 1, "{agent}");
    }
}

#[tokio::test]
async fn a_name_held_elsewhere_is_unavailable_and_says_nothing_more() {
    let h = harness(config());
    let mut busy = TestAgent::new("busy-bot");
    busy.register(&h.app, &h.key_a).await;
    post_chain(&h, &mut busy, 2, |i| T0 + i).await;
    TestAgent::new("idle-bot").register(&h.app, &h.key_a).await;
    let try_add = |key: String, name: &'static str| {
        let app = h.app.clone();
        async move {
            let pk = SecretKey::generate(&mut OsRng).public_key();
            let body = json!({"agent": name, "public_key": pk});
            call(
                &app,
                "POST",
                "/v1/agents",
                Some(&key),
                serde_json::to_vec(&body).unwrap(),
            )
            .await
        }
    };
    // Another project: the same answer, whatever the holder did with it.
    let (s, busy_answer) = try_add(h.key_b.clone(), "busy-bot").await;
    assert_err(s, &busy_answer, 409, "name_unavailable");
    let (s, idle_answer) = try_add(h.key_b.clone(), "idle-bot").await;
    assert_err(s, &idle_answer, 409, "name_unavailable");
    let strip = |b: &[u8], name: &str| String::from_utf8_lossy(b).replace(name, "NAME");
    assert_eq!(
        strip(&busy_answer, "busy-bot"),
        strip(&idle_answer, "idle-bot")
    );
    assert!(!strip(&busy_answer, "busy-bot").contains("default"));
    // The holder's own project is told it already has it.
    let (s, b) = try_add(h.key_a.clone(), "idle-bot").await;
    assert_err(s, &b, 409, "exists");
    // A free name registers.
    let (s, b) = try_add(h.key_b.clone(), "free-bot").await;
    assert_eq!(s, StatusCode::CREATED, "{}", String::from_utf8_lossy(&b));
}

#[tokio::test]
async fn a_chain_in_the_log_keeps_its_name_when_the_registry_forgot_it() {
    let dir;
    {
        let h = harness(config());
        let mut a = TestAgent::new("orphan");
        a.register(&h.app, &h.key_a).await;
        post_chain(&h, &mut a, 1, |_| T0).await;
        h.witness.log().shutdown();
        dir = h.dir;
    }
    // The registry is lost (or restored from a backup older than the agent).
    std::fs::remove_file(dir.path().join("witness.redb")).unwrap();
    let clock = Arc::new(TestClock(std::sync::atomic::AtomicI64::new(T0)));
    let (witness, first) = open_witness(dir.path(), config(), clock);
    let api_key = first.expect("a new default project").api_key.token;
    let app = tally_witness::http::router(witness);
    let pk = SecretKey::generate(&mut OsRng).public_key();
    let (s, b) = call(
        &app,
        "POST",
        "/v1/agents",
        Some(&api_key),
        serde_json::to_vec(&json!({"agent": "orphan", "public_key": pk})).unwrap(),
    )
    .await;
    assert_err(s, &b, 409, "name_unavailable");
}
