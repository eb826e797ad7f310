//! Handler tests without sockets (`Router` + `oneshot`): every row of the
//! admission status table, the order of the checks, replay, skew with the
//! injected clock, restart, the authorisation matrix and the bad-input
//! corpus (docs/api.md).

use crate::common;

use axum::http::StatusCode;
use common::*;
use serde_json::{json, Value};
use tally_schemas::{Receipt, UnixMillis};
use tally_witness::config::{RateLimit, WitnessConfig};

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

#[tokio::test]
async fn admitted_record_gets_a_receipt_that_verifies_and_a_retry_gets_the_same_bytes() {
    let h = harness(config());
    let mut a = TestAgent::new("claims-bot");
    a.register(&h.app, &h.key_a).await;
    let r0 = a.draft(T0, "hello");
    let (s, body) = post(&h.app, Some(&h.key_a), bytes(&r0)).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let receipt = Receipt::from_json(&body).unwrap();
    let (cp, entry) = receipt.verify(&r0, h.witness.log().verifier()).unwrap();
    assert_eq!(cp.size.get(), 1);
    assert_eq!(entry.received(), UnixMillis::new(T0));
    assert_eq!(receipt.nonce, r0.nonce);
    a.accept(&r0);

    // A retry, even later and with whitespace, returns the original receipt byte for byte.
    h.clock.set(T0 + 5_000);
    let mut spaced = b" \n".to_vec();
    spaced.extend(serde_json::to_vec_pretty(&r0).unwrap());
    let (s2, body2) = post(&h.app, Some(&h.key_a), spaced).await;
    assert_eq!(s2, StatusCode::OK);
    assert_eq!(body, body2);

    // The next record extends the chain; its head is reported.
    let r1 = a.draft(T0 + 5_000, "second");
    let (s, _) = post(&h.app, Some(&h.key_a), bytes(&r1)).await;
    assert_eq!(s, StatusCode::OK);
    let (s, body) = call(
        &h.app,
        "GET",
        "/v1/agents/claims-bot/head",
        Some(&h.key_a),
        vec![],
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let head = json(&body);
    assert_eq!(head["seq"], 1);
    assert_eq!(head["hash"], r1.hash().to_hex());
    assert_eq!(head["index"], 1);
    assert_eq!(head["agent"], "claims-bot");
}

#[tokio::test]
async fn every_row_of_the_status_table() {
    let h = harness(config());
    let mut a = TestAgent::new("bot-a");
    a.register(&h.app, &h.key_a).await;
    let b = TestAgent::new("bot-b");
    b.register(&h.app, &h.key_b).await;

    // 400 malformed and unsupported_version.
    let (s, body) = post(&h.app, Some(&h.key_a), b"{\"v\":1,".to_vec()).await;
    assert_err(s, &body, 400, "malformed");
    assert_eq!(json(&body)["error"]["reason"], "malformed_json");
    let mut v2: Value = serde_json::to_value(a.draft(T0, "x")).unwrap();
    v2["v"] = json!(2);
    let (s, body) = post(&h.app, Some(&h.key_a), serde_json::to_vec(&v2).unwrap()).await;
    assert_err(s, &body, 400, "unsupported_version");

    // 401 without a key and with an unknown one.
    let r0 = a.draft(T0, "first");
    let (s, body) = post(&h.app, None, bytes(&r0)).await;
    assert_err(s, &body, 401, "unauthorized");
    let (s, body) = post(
        &h.app,
        Some("tally_0000000000000000_000000000000000000000000000000000000000000000000"),
        bytes(&r0),
    )
    .await;
    assert_err(s, &body, 401, "unauthorized");

    // 403 agent_not_allowed: project A's key posting project B's agent.
    let rb = b.draft(T0, "b");
    let (s, body) = post(&h.app, Some(&h.key_a), bytes(&rb)).await;
    assert_err(s, &body, 403, "agent_not_allowed");
    // 403 key_not_allowed: a key not registered for the agent.
    let stranger = TestAgent::new("bot-a");
    let (s, body) = post(&h.app, Some(&h.key_a), bytes(&stranger.draft(T0, "x"))).await;
    assert_err(s, &body, 403, "key_not_allowed");

    // 422 bad_signature: another record's signature on this record.
    let mut forged: Value = serde_json::to_value(&r0).unwrap();
    forged["sig"] = serde_json::to_value(a.draft(T0, "other").signature()).unwrap();
    let (s, body) = post(&h.app, Some(&h.key_a), serde_json::to_vec(&forged).unwrap()).await;
    assert_err(s, &body, 422, "bad_signature");
    // 422 clock_skew, with the evidence.
    let skewed = a.draft(T0 + 300_001, "late");
    let (s, body) = post(&h.app, Some(&h.key_a), bytes(&skewed)).await;
    assert_err(s, &body, 422, "clock_skew");
    let e = &json(&body)["error"];
    assert_eq!(e["agent_time"], "2026-11-30T08:05:00.001Z");
    assert_eq!(e["witness_time"], "2026-11-30T08:00:00.000Z");
    assert_eq!(e["max_skew_ms"], 300_000);
    // 422 key_not_active: a record timed before the key's not_before.
    let early = a.draft(T0 - 7_200_000, "too early");
    h.clock.set(T0 - 7_200_000);
    let (s, body) = post(&h.app, Some(&h.key_a), bytes(&early)).await;
    assert_err(s, &body, 422, "key_not_active");
    h.clock.set(T0);

    // 200, then 409 chain_conflict with the head, and nonce_replayed with the first index.
    let (s, _) = post(&h.app, Some(&h.key_a), bytes(&r0)).await;
    assert_eq!(s, StatusCode::OK);
    let fork = a.draft(T0, "fork at genesis");
    let (s, body) = post(&h.app, Some(&h.key_a), bytes(&fork)).await;
    assert_err(s, &body, 409, "chain_conflict");
    assert_eq!(
        json(&body)["error"]["head"],
        json!({"seq": 0, "hash": r0.hash().to_hex()})
    );
    a.accept(&r0);
    let mut replay = tally_schemas::UnsignedRecord::clone(a.draft(T0, "replay").unsigned());
    replay.nonce = r0.nonce.clone();
    let replay = replay.sign(&a.key).unwrap();
    let (s, body) = post(&h.app, Some(&h.key_a), bytes(&replay)).await;
    assert_err(s, &body, 409, "nonce_replayed");
    assert_eq!(json(&body)["error"]["first_index"], 0);
    // A first record for an agent without records: chain_conflict with head null.
    let mut b_late = TestAgent::new("bot-b");
    b_late.key = b.key.clone();
    b_late.seq = 3;
    b_late.prev = Some(r0.hash());
    let (s, body) = post(&h.app, Some(&h.key_b), bytes(&b_late.draft(T0, "gap"))).await;
    assert_err(s, &body, 409, "chain_conflict");
    assert_eq!(json(&body)["error"]["head"], Value::Null);

    // 413: a body over the limit, and a record over MAX_RECORD_BYTES.
    let (s, body) = post(&h.app, Some(&h.key_a), vec![b' '; 131_073]).await;
    assert_err(s, &body, 413, "too_large");
    let mut big: Value = serde_json::to_value(a.draft(T0, "x")).unwrap();
    big["body"] = json!({"text": "y".repeat(4096)});
    big["kind"] = json!("note");
    // 4096 bytes is the note limit; a tools record of 48 long entries is past 32 KiB.
    let tools: Vec<Value> = (0..48)
        .map(|i| {
            json!({"name": format!("{i:0>256}"), "recorded": true, "digest": "00".repeat(32),
                   "parts": {"title": "11".repeat(32), "description": "22".repeat(32), "input_schema": "33".repeat(32),
                             "output_schema": "44".repeat(32), "annotations": "55".repeat(32), "meta": "66".repeat(32)}})
        })
        .collect();
    big["kind"] = json!("tools");
    big["body"] = json!({"list_id": "l", "part": 0, "parts": 1, "tools": tools});
    let big = serde_json::to_vec(&big).unwrap();
    assert!(big.len() > 32_768 && big.len() < 131_072);
    let (s, body) = post(&h.app, Some(&h.key_a), big).await;
    assert_err(s, &body, 413, "too_large");

    // 429: a bucket of one.
    let h2 = harness(WitnessConfig {
        rate_limit: Some(RateLimit {
            per_second: 1.0,
            burst: 1,
        }),
        ..WitnessConfig::default()
    });
    let mut c = TestAgent::new("bot-c");
    c.register(&h2.app, &h2.key_a).await;
    let c0 = c.draft(T0, "one");
    assert_eq!(
        post(&h2.app, Some(&h2.key_a), bytes(&c0)).await.0,
        StatusCode::OK
    );
    c.accept(&c0);
    let (s, body) = post(&h2.app, Some(&h2.key_a), bytes(&c.draft(T0, "two"))).await;
    assert_err(s, &body, 429, "rate_limited");
    assert_eq!(json(&body)["error"]["retry_after_ms"], 1000);
    // Another project's key has its own bucket.
    let mut d = TestAgent::new("bot-d");
    d.register(&h2.app, &h2.key_b).await;
    assert_eq!(
        post(&h2.app, Some(&h2.key_b), bytes(&d.draft(T0, "d")))
            .await
            .0,
        StatusCode::OK
    );
    d.seq = 0;
    // After a second the bucket has a token again.
    h2.clock.set(T0 + 1000);
    assert_eq!(
        post(&h2.app, Some(&h2.key_a), bytes(&c.draft(T0 + 1000, "two")))
            .await
            .0,
        StatusCode::OK
    );

    // 503: every admission slot taken.
    let h3 = harness(WitnessConfig {
        max_in_flight: 1,
        ..config()
    });
    let mut e = TestAgent::new("bot-e");
    e.register(&h3.app, &h3.key_a).await;
    let held = h3.witness.in_flight_permit().unwrap();
    let (s, body) = post(&h3.app, Some(&h3.key_a), bytes(&e.draft(T0, "e"))).await;
    assert_err(s, &body, 503, "overloaded");
    drop(held);
    let e0 = e.draft(T0, "e");
    assert_eq!(
        post(&h3.app, Some(&h3.key_a), bytes(&e0)).await.0,
        StatusCode::OK
    );
    e.accept(&e0);

    // Metrics counted the answers by code.
    let (_, m) = call(&h.app, "GET", "/metrics", None, vec![]).await;
    let m = String::from_utf8(m).unwrap();
    for line in [
        "tally_admissions_total{status=\"200\",code=\"ok\"} 1",
        "tally_admissions_total{status=\"401\",code=\"unauthorized\"} 2",
        "tally_admissions_total{status=\"409\",code=\"chain_conflict\"} 2",
        "tally_admissions_total{status=\"413\",code=\"too_large\"} 2",
        "tally_batch_entries_count 1",
    ] {
        assert!(m.contains(line), "missing {line} in\n{m}");
    }
}

#[tokio::test]
async fn checks_run_in_the_issue_order() {
    let h = harness(config());
    let a = TestAgent::new("bot-a");
    a.register(&h.app, &h.key_a).await;
    // The API key before the body: without one, neither a malformed nor
    // an oversized body is looked at.
    let (s, body) = post(&h.app, None, b"[]".to_vec()).await;
    assert_err(s, &body, 401, "unauthorized");
    let (s, body) = post(&h.app, None, vec![b'{'; 200_000]).await;
    assert_err(s, &body, 401, "unauthorized");
    // Then body size, then schema.
    let (s, body) = post(&h.app, Some(&h.key_a), vec![b'{'; 200_000]).await;
    assert_err(s, &body, 413, "too_large");
    let (s, body) = post(&h.app, Some(&h.key_a), b"[]".to_vec()).await;
    assert_err(s, &body, 400, "malformed");
    // The agent's project before the key's registration: a record of an
    // agent of another project is agent_not_allowed.
    let (s, body) = post(&h.app, Some(&h.key_b), bytes(&a.draft(T0, "x"))).await;
    assert_err(s, &body, 403, "agent_not_allowed");
    // The key's registration before its activity and the signature.
    let stranger = TestAgent::new("bot-a");
    let (s, body) = post(
        &h.app,
        Some(&h.key_a),
        bytes(&stranger.draft(T0 + 900_000, "x")),
    )
    .await;
    assert_err(s, &body, 403, "key_not_allowed");
    // The signature before the clock.
    let mut forged: Value = serde_json::to_value(a.draft(T0 + 900_000, "late")).unwrap();
    forged["sig"] = serde_json::to_value(a.draft(T0, "other").signature()).unwrap();
    let (s, body) = post(&h.app, Some(&h.key_a), serde_json::to_vec(&forged).unwrap()).await;
    assert_err(s, &body, 422, "bad_signature");
    // The clock before the chain: a skewed fork is clock_skew, not chain_conflict.
    let r0 = a.draft(T0, "first");
    assert_eq!(
        post(&h.app, Some(&h.key_a), bytes(&r0)).await.0,
        StatusCode::OK
    );
    let (s, body) = post(
        &h.app,
        Some(&h.key_a),
        bytes(&a.draft(T0 + 900_000, "fork, late")),
    )
    .await;
    assert_err(s, &body, 422, "clock_skew");
    // A retry of an admitted record answers with its receipt (before the
    // key and clock checks: a retry_of_an_admitted_record_* test below).
    assert_eq!(
        post(&h.app, Some(&h.key_a), bytes(&r0)).await.0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn skew_bound_is_inclusive_and_follows_the_injected_clock() {
    let h = harness(config());
    let mut a = TestAgent::new("bot");
    a.register(&h.app, &h.key_a).await;
    for (offset, ok) in [
        (300_000, true),
        (-300_000, true),
        (300_001, false),
        (-300_001, false),
    ] {
        let r = a.draft(T0 + offset, "t");
        let (s, body) = post(&h.app, Some(&h.key_a), bytes(&r)).await;
        if ok {
            assert_eq!(
                s,
                StatusCode::OK,
                "{offset}: {}",
                String::from_utf8_lossy(&body)
            );
            a.accept(&r);
        } else {
            assert_err(s, &body, 422, "clock_skew");
        }
    }
    // The witness clock moved: the refused time is now fine.
    h.clock.set(T0 + 300_001);
    let r = a.draft(T0 + 600_001, "t");
    assert_eq!(
        post(&h.app, Some(&h.key_a), bytes(&r)).await.0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn received_times_never_go_backwards_even_when_the_clock_does() {
    let h = harness(config());
    let mut a = TestAgent::new("bot");
    a.register(&h.app, &h.key_a).await;
    let r0 = a.draft(T0, "a");
    let rec0 = Receipt::from_json(&post(&h.app, Some(&h.key_a), bytes(&r0)).await.1).unwrap();
    a.accept(&r0);
    h.clock.set(T0 - 1_000);
    let r1 = a.draft(T0 - 1_000, "b");
    let rec1 = Receipt::from_json(&post(&h.app, Some(&h.key_a), bytes(&r1)).await.1).unwrap();
    assert_eq!(rec0.received, UnixMillis::new(T0));
    assert_eq!(rec1.received, UnixMillis::new(T0));
}

#[tokio::test]
async fn concurrent_admissions_keep_received_in_log_order() {
    let h = harness(config());
    let agents: Vec<TestAgent> = (0..16)
        .map(|i| TestAgent::new(&format!("bot-{i}")))
        .collect();
    for a in &agents {
        a.register(&h.app, &h.key_a).await;
    }
    let mut tasks = Vec::new();
    for (i, mut a) in agents.into_iter().enumerate() {
        let app = h.app.clone();
        let key = h.key_a.clone();
        let clock = std::sync::Arc::clone(&h.clock);
        tasks.push(tokio::spawn(async move {
            for n in 0..20 {
                clock.set(T0 + (n * 16 + i as i64) % 50);
                let r = a.draft(T0, "x");
                let (s, body) = post(&app, Some(&key), bytes(&r)).await;
                assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
                a.accept(&r);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let log = h.witness.log();
    let size = log.latest_checkpoint().checkpoint.size.get();
    assert_eq!(size, 320);
    let mut last = UnixMillis::new(0);
    for i in 0..size {
        let e = log
            .entry(tally_schemas::LeafIndex::new(i))
            .unwrap()
            .unwrap();
        assert!(e.received() >= last, "entry {i} went back in time");
        last = e.received();
    }
}

#[tokio::test]
async fn restart_keeps_receipts_registrations_and_chains() {
    let dir;
    let r0;
    let receipt0;
    let key_a;
    let mut a = TestAgent::new("bot");
    {
        let h = harness(config());
        a.register(&h.app, &h.key_a).await;
        r0 = a.draft(T0, "before restart");
        let (s, body) = post(&h.app, Some(&h.key_a), bytes(&r0)).await;
        assert_eq!(s, StatusCode::OK);
        receipt0 = body;
        a.accept(&r0);
        key_a = h.key_a.clone();
        h.witness.log().shutdown();
        dir = h.dir;
    }
    let clock = std::sync::Arc::new(TestClock(std::sync::atomic::AtomicI64::new(T0 + 1_000)));
    let (witness, first) = open_witness(dir.path(), config(), clock);
    assert!(first.is_none(), "the default project is made only once");
    let app = tally_witness::http::router(witness);
    // The same record gets the same receipt bytes; the API key still works.
    let (s, body) = post(&app, Some(&key_a), bytes(&r0)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(body, receipt0);
    let r1 = a.draft(T0 + 1_000, "after restart");
    let (s, body) = post(&app, Some(&key_a), bytes(&r1)).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(Receipt::from_json(&body).unwrap().index.get(), 1);
}

/// Every route × no key / another project's key / another agent's record.
#[tokio::test]
async fn authorisation_matrix() {
    let h = harness(config());
    let mut a = TestAgent::new("bot-a");
    a.register(&h.app, &h.key_a).await;
    let r0 = a.draft(T0, "a");
    assert_eq!(
        post(&h.app, Some(&h.key_a), bytes(&r0)).await.0,
        StatusCode::OK
    );
    a.accept(&r0);
    let rotate_body = serde_json::to_vec(&json!({"public_key": tally_schemas::SecretKey::generate(&mut rand_core::OsRng).public_key()})).unwrap();
    let add_body =
        serde_json::to_vec(&json!({"agent": "bot-a", "public_key": a.key.public_key()})).unwrap();
    // (method, uri, body, status with another project's key, code)
    let project_routes: Vec<(&str, &str, Vec<u8>, u16, &str)> = vec![
        (
            "POST",
            "/v1/records",
            bytes(&a.draft(T0, "b")),
            403,
            "agent_not_allowed",
        ),
        (
            "GET",
            "/v1/agents/bot-a/head",
            vec![],
            403,
            "agent_not_allowed",
        ),
        ("POST", "/v1/agents", add_body, 409, "name_unavailable"),
        (
            "POST",
            "/v1/agents/bot-a/rotate",
            rotate_body.clone(),
            403,
            "agent_not_allowed",
        ),
        (
            "POST",
            "/v1/agents/bot-a/retire",
            b"{}".to_vec(),
            403,
            "agent_not_allowed",
        ),
        (
            "GET",
            "/v1/agent-keys?agent=bot-a",
            vec![],
            403,
            "agent_not_allowed",
        ),
        (
            "GET",
            "/v1/export?agent=bot-a",
            vec![],
            403,
            "agent_not_allowed",
        ),
        (
            "GET",
            "/v1/head?from_size=1&agent=bot-a",
            vec![],
            403,
            "agent_not_allowed",
        ),
    ];
    for (method, uri, body, status_b, code_b) in &project_routes {
        let (s, b) = call(&h.app, method, uri, None, body.clone()).await;
        assert_err(s, &b, 401, "unauthorized");
        let (s, b) = call(&h.app, method, uri, Some(&h.key_b), body.clone()).await;
        assert_err(s, &b, *status_b, code_b);
        // The admin token is not an API key.
        let (s, b) = call(&h.app, method, uri, Some(&h.admin), body.clone()).await;
        assert_err(s, &b, 401, "unauthorized");
    }
    // Listing routes show only the caller's own agents.
    let (s, b) = call(&h.app, "GET", "/v1/agents", Some(&h.key_b), vec![]).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(json(&b)["agents"], json!([]));
    let (s, b) = call(&h.app, "GET", "/v1/agent-keys", Some(&h.key_b), vec![]).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(json(&b)["agents"], json!([]));
    let (s, b) = call(&h.app, "GET", "/v1/agents", None, vec![]).await;
    assert_err(s, &b, 401, "unauthorized");
    // Admin routes: no token and an API key are both 401.
    for (method, uri, body) in [
        ("POST", "/v1/projects", b"{\"name\":\"p2\"}".to_vec()),
        ("GET", "/v1/projects", vec![]),
        ("POST", "/v1/projects/default/api-keys", vec![]),
        ("POST", "/v1/api-keys/0000000000000000/revoke", vec![]),
    ] {
        let (s, b) = call(&h.app, method, uri, None, body.clone()).await;
        assert_err(s, &b, 401, "unauthorized");
        let (s, b) = call(&h.app, method, uri, Some(&h.key_a), body.clone()).await;
        assert_err(s, &b, 401, "unauthorized");
    }
    let (s, b) = call(
        &h.app,
        "POST",
        "/v1/projects",
        Some(&h.admin),
        b"{\"name\":\"p2\"}".to_vec(),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{}", String::from_utf8_lossy(&b));
    // Another agent's record: a record naming bot-b signed with bot-a's key,
    // under a key whose project owns both, extends neither chain.
    let mut b_agent = TestAgent::new("bot-b");
    b_agent.register(&h.app, &h.key_a).await;
    b_agent.key = a.key.clone();
    let (s, body) = post(&h.app, Some(&h.key_a), bytes(&b_agent.draft(T0, "posing"))).await;
    assert_err(s, &body, 403, "key_not_allowed");
    // Public routes need no key.
    for uri in [
        "/.well-known/tally/keys",
        "/metrics",
        "/healthz",
        "/checkpoint",
        "/v1/proof/inclusion?index=0",
    ] {
        let (s, b) = call(&h.app, "GET", uri, None, vec![]).await;
        assert_eq!(s, StatusCode::OK, "{uri}: {}", String::from_utf8_lossy(&b));
    }
}

/// name, body, status, code, reason.
type Case<'a> = (&'a str, Vec<u8>, u16, &'a str, Option<&'a str>);

/// Bad input gets a 4xx and a code; never a 500, never a panic.
#[tokio::test]
async fn bad_input_corpus() {
    let h = harness(config());
    let a = TestAgent::new("bot");
    a.register(&h.app, &h.key_a).await;
    let good: Value = serde_json::to_value(a.draft(T0, "x")).unwrap();
    let good_text = serde_json::to_string(&good).unwrap();
    let with = |f: &dyn Fn(&mut Value)| {
        let mut v = good.clone();
        f(&mut v);
        serde_json::to_vec(&v).unwrap()
    };
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)).into_bytes();
    let mut invalid_utf8 = good_text.clone().into_bytes();
    invalid_utf8.splice(10..10, [0xff, 0xfe]);
    let corpus: Vec<Case<'_>> = vec![
        ("empty", vec![], 400, "malformed", Some("malformed_json")),
        (
            "truncated",
            good_text.as_bytes()[..good_text.len() / 2].to_vec(),
            400,
            "malformed",
            Some("malformed_json"),
        ),
        (
            "10 MB",
            vec![b'{'; 10 * 1024 * 1024],
            413,
            "too_large",
            None,
        ),
        ("depth 10000", deep, 400, "malformed", Some("too_deep")),
        (
            "duplicate key",
            good_text.replacen('{', "{\"v\":1,", 1).into_bytes(),
            400,
            "malformed",
            Some("duplicate_key"),
        ),
        (
            "2^60",
            with(&|v| v["seq"] = json!(1u64 << 60)),
            400,
            "malformed",
            Some("integer_out_of_range"),
        ),
        (
            "-2^60",
            good_text
                .replacen("\"seq\":0", "\"seq\":-1152921504606846976", 1)
                .into_bytes(),
            400,
            "malformed",
            Some("integer_out_of_range"),
        ),
        (
            "1e400",
            good_text
                .replacen("\"seq\":0", "\"seq\":1e400", 1)
                .into_bytes(),
            400,
            "malformed",
            Some("non_finite_number"),
        ),
        (
            "invalid utf-8",
            invalid_utf8,
            400,
            "malformed",
            Some("invalid_utf8"),
        ),
        (
            "wrong type seq",
            with(&|v| v["seq"] = json!("0")),
            400,
            "malformed",
            Some("schema"),
        ),
        (
            "wrong type body",
            with(&|v| v["body"] = json!([])),
            400,
            "malformed",
            Some("schema"),
        ),
        (
            "unknown field",
            with(&|v| v["extra"] = json!(1)),
            400,
            "malformed",
            Some("schema"),
        ),
        (
            "unknown body field",
            with(&|v| v["body"]["x"] = json!(1)),
            400,
            "malformed",
            Some("schema"),
        ),
        (
            "missing prev",
            with(&|v| {
                v.as_object_mut().unwrap().remove("prev");
            }),
            400,
            "malformed",
            Some("schema"),
        ),
        (
            "v as string",
            with(&|v| v["v"] = json!("1")),
            400,
            "malformed",
            Some("schema"),
        ),
        (
            "v 2",
            with(&|v| v["v"] = json!(2)),
            400,
            "unsupported_version",
            None,
        ),
        (
            "not an object",
            b"42".to_vec(),
            400,
            "malformed",
            Some("schema"),
        ),
        (
            "uppercase hex nonce",
            with(&|v| {
                v["nonce"] = json!(v["nonce"]
                    .as_str()
                    .unwrap()
                    .to_uppercase()
                    .replace('X', "x"))
            }),
            400,
            "malformed",
            None,
        ),
        (
            "bad time",
            with(&|v| v["time"] = json!("2026-11-30T08:00:00Z")),
            400,
            "malformed",
            Some("schema"),
        ),
        (
            "agent name",
            with(&|v| v["agent"] = json!("../etc")),
            400,
            "malformed",
            Some("schema"),
        ),
        (
            "nul in note",
            with(&|v| v["body"]["text"] = json!("a\u{0}b")),
            400,
            "malformed",
            Some("invalid_field"),
        ),
        (
            "trailing garbage",
            format!("{good_text}x").into_bytes(),
            400,
            "malformed",
            Some("malformed_json"),
        ),
        (
            "two values",
            format!("{good_text}{good_text}").into_bytes(),
            400,
            "malformed",
            Some("malformed_json"),
        ),
    ];
    for (name, body, status, want, reason) in corpus {
        let (s, b) = post(&h.app, Some(&h.key_a), body.clone()).await;
        assert_eq!(
            (s.as_u16(), code(&b).as_str()),
            (status, want),
            "{name}: {}",
            String::from_utf8_lossy(&b)
        );
        if let Some(r) = reason {
            assert_eq!(json(&b)["error"]["reason"], r, "{name}");
        }
        // Without a key the body is not read at all.
        let (s, b) = post(&h.app, None, body).await;
        assert_err(s, &b, 401, "unauthorized");
    }
    // The admin and registration bodies are parsed as strictly.
    for body in [
        b"{\"agent\":\"x\",\"agent\":\"y\"}".to_vec(),
        b"{".to_vec(),
        vec![0xff],
        b"{\"agent\":\"x\",\"public_key\":\"AA==\"}".to_vec(),
        b"{\"agent\":\"x\",\"public_key\":1,\"z\":2}".to_vec(),
    ] {
        let (s, b) = call(&h.app, "POST", "/v1/agents", Some(&h.key_a), body).await;
        assert_eq!(s.as_u16(), 400, "{}", String::from_utf8_lossy(&b));
        assert_eq!(code(&b), "malformed");
    }
    // Query strings and paths.
    for (uri, want) in [
        ("/v1/export?agent=bot&from_seq=01", "bad_parameter"),
        ("/v1/export?agent=bot&bogus=1", "unknown_parameter"),
        (
            "/v1/export?agent=bot&from_seq=1&since=2026-11-30T08:00:00.000Z",
            "bad_parameter",
        ),
        ("/v1/export?agent=%ff", "bad_parameter"),
        ("/v1/export", "missing_parameter"),
        ("/v1/head?from_size=18446744073709551616", "bad_parameter"),
        ("/v1/head", "missing_parameter"),
        ("/v1/agents/..%2f/head", "bad_parameter"),
    ] {
        let (s, b) = call(&h.app, "GET", uri, Some(&h.key_a), vec![]).await;
        assert_eq!(
            (s.as_u16(), code(&b).as_str()),
            (400, want),
            "{uri}: {}",
            String::from_utf8_lossy(&b)
        );
    }
    let (s, b) = call(&h.app, "GET", "/v1/agents/bot/head", Some(&h.key_a), vec![]).await;
    assert_err(s, &b, 404, "no_records");
    let (s, b) = call(&h.app, "DELETE", "/v1/records", Some(&h.key_a), vec![]).await;
    assert_eq!(s.as_u16(), 405, "{}", String::from_utf8_lossy(&b));
    let (s, b) = call(&h.app, "GET", "/nowhere", None, vec![]).await;
    assert_err(s, &b, 404, "not_found");
}

#[tokio::test]
async fn rotate_and_retire_govern_admission_and_agent_keys() {
    let h = harness(config());
    let mut a = TestAgent::new("bot");
    a.register(&h.app, &h.key_a).await;
    let r0 = a.draft(T0, "old key");
    assert_eq!(
        post(&h.app, Some(&h.key_a), bytes(&r0)).await.0,
        StatusCode::OK
    );
    a.accept(&r0);
    let new_key = tally_schemas::SecretKey::generate(&mut rand_core::OsRng);
    let body = json!({"public_key": new_key.public_key(), "at": UnixMillis::new(T0 + 10)});
    let (s, b) = call(
        &h.app,
        "POST",
        "/v1/agents/bot/rotate",
        Some(&h.key_a),
        serde_json::to_vec(&body).unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    // The old key is not active at T0+10 or later.
    h.clock.set(T0 + 20);
    let (s, b) = post(
        &h.app,
        Some(&h.key_a),
        bytes(&a.draft(T0 + 20, "old key, late")),
    )
    .await;
    assert_err(s, &b, 422, "key_not_active");
    let old = std::mem::replace(&mut a.key, new_key);
    let r1 = a.draft(T0 + 20, "new key");
    assert_eq!(
        post(&h.app, Some(&h.key_a), bytes(&r1)).await.0,
        StatusCode::OK
    );
    a.accept(&r1);
    // agent-keys.json lists both with their ranges, in the protocol's format.
    let (s, b) = call(&h.app, "GET", "/v1/agent-keys", Some(&h.key_a), vec![]).await;
    assert_eq!(s, StatusCode::OK);
    let keys = tally_schemas::pack::AgentKeys::from_json(&b).unwrap();
    // The origin of the harness's own log (a new install's, docs/protocol.md §7.4).
    assert_eq!(keys.origin, h.witness.log().origin());
    assert!(
        keys.origin.starts_with("tally.local/log/"),
        "{}",
        keys.origin
    );
    let list = &keys.agents[0].keys;
    assert_eq!(list.len(), 2);
    assert_eq!(list[0].public_key, old.public_key());
    assert_eq!(list[0].not_after, Some(UnixMillis::new(T0 + 10)));
    assert_eq!(list[1].not_before, UnixMillis::new(T0 + 10));
    assert_eq!(list[1].not_after, None);
    // Retired: nothing timed later is admitted.
    let (s, _) = call(
        &h.app,
        "POST",
        "/v1/agents/bot/retire",
        Some(&h.key_a),
        serde_json::to_vec(&json!({"at": UnixMillis::new(T0 + 30)})).unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    h.clock.set(T0 + 40);
    let (s, b) = post(
        &h.app,
        Some(&h.key_a),
        bytes(&a.draft(T0 + 40, "after retirement")),
    )
    .await;
    assert_err(s, &b, 422, "key_not_active");
}

#[tokio::test]
async fn a_new_key_covers_records_signed_within_the_skew_bound_before_registration() {
    let h = harness(config());
    let a = TestAgent::new("early-bird");
    let body = json!({"agent": a.name, "public_key": a.key.public_key()});
    let (s, b) = call(
        &h.app,
        "POST",
        "/v1/agents",
        Some(&h.key_a),
        serde_json::to_vec(&body).unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(
        json(&b)["keys"][0]["not_before"],
        "2026-11-30T07:55:00.000Z"
    );
    let (s, b) = post(
        &h.app,
        Some(&h.key_a),
        bytes(&a.draft(T0 - 200_000, "signed before registration")),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
}

/// A record whose answer was lost is retried, possibly much later: the
/// exact bytes are recognised first and get the original receipt, whatever
/// the witness clock says now (protocol.md §8).
#[tokio::test]
async fn a_retry_of_an_admitted_record_gets_its_receipt_after_the_skew_window() {
    let h = harness(config());
    let mut a = TestAgent::new("late-retry-bot");
    a.register(&h.app, &h.key_a).await;
    let r0 = a.draft(T0, "answer lost");
    let (s, first) = post(&h.app, Some(&h.key_a), bytes(&r0)).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&first));
    a.accept(&r0);

    // An hour later, and an hour before (the witness clock stepped back).
    for now in [T0 + 3_600_000, T0 - 3_600_000] {
        h.clock.set(now);
        let (s, again) = post(&h.app, Some(&h.key_a), bytes(&r0)).await;
        assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&again));
        assert_eq!(again, first, "not the original receipt");
    }
    // A new record with that old time is still refused.
    h.clock.set(T0 + 3_600_000);
    let (s, b) = post(
        &h.app,
        Some(&h.key_a),
        bytes(&a.draft(T0 + 1, "new, old time")),
    )
    .await;
    assert_err(s, &b, 422, "clock_skew");
    // The retries added nothing to the log.
    assert_eq!(h.witness.log().latest_checkpoint().checkpoint.size.get(), 1);
}

/// The same after the agent's key was rotated (after the window). A key
/// change that no longer covers the record's time, which the API does not
/// make, is tested inside the crate (witness.rs).
#[tokio::test]
async fn a_retry_of_an_admitted_record_gets_its_receipt_after_its_key_changed() {
    let h = harness(config());
    let mut a = TestAgent::new("rotated-bot");
    a.register(&h.app, &h.key_a).await;
    let r0 = a.draft(T0, "answer lost");
    let (s, first) = post(&h.app, Some(&h.key_a), bytes(&r0)).await;
    assert_eq!(s, StatusCode::OK);
    a.accept(&r0);

    h.clock.set(T0 + 600_000);
    let new_key = tally_schemas::SecretKey::generate(&mut rand_core::OsRng);
    let body = json!({"public_key": new_key.public_key()});
    let (s, b) = call(
        &h.app,
        "POST",
        "/v1/agents/rotated-bot/rotate",
        Some(&h.key_a),
        serde_json::to_vec(&body).unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let (s, again) = post(&h.app, Some(&h.key_a), bytes(&r0)).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&again));
    assert_eq!(again, first);
}

/// Recognising a resubmission comes after the key and the agent's project:
/// another project's key, or none, gets nothing of it.
#[tokio::test]
async fn a_resubmission_is_answered_only_to_the_agents_project() {
    let h = harness(config());
    let a = TestAgent::new("own-bot");
    a.register(&h.app, &h.key_a).await;
    let r0 = a.draft(T0, "mine");
    assert_eq!(
        post(&h.app, Some(&h.key_a), bytes(&r0)).await.0,
        StatusCode::OK
    );
    let (s, b) = post(&h.app, Some(&h.key_b), bytes(&r0)).await;
    assert_err(s, &b, 403, "agent_not_allowed");
    let (s, b) = post(&h.app, None, bytes(&r0)).await;
    assert_err(s, &b, 401, "unauthorized");
}
