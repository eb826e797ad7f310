//! Who can read the log (docs/operations.md "Who can read the log"): in the
//! default public mode every read route answers without a token; with
//! `--log-read token` the tiles, proofs, `/checkpoint` and `/metrics` answer
//! read-token holders only, API keys and the admin token are not read
//! tokens, revoking one works at once, and a read token can fetch head.json
//! and packs of any agent it names.

use crate::common;

use axum::http::StatusCode;
use common::*;
use serde_json::json;
use tally_schemas::pack::PackLine;
use tally_witness::config::{LogRead, WitnessConfig};

fn config(log_read: LogRead) -> WitnessConfig {
    WitnessConfig {
        rate_limit: None,
        log_read,
        ..WitnessConfig::default()
    }
}

/// Every route that shows what is in the log or how much of it there is.
const LOG_READS: [&str; 7] = [
    "/checkpoint",
    "/tile/0/000.p/2",
    "/tile/entries/000.p/2",
    "/v1/proof/inclusion?index=0",
    "/v1/proof/consistency?from=1&to=2",
    "/metrics",
    "/tile/0/999",
];

/// A witness with two records of `bot` (project A) and a read token.
async fn setup(log_read: LogRead) -> (Harness, String, String) {
    let h = harness(config(log_read));
    let mut a = TestAgent::new("bot");
    a.register(&h.app, &h.key_a).await;
    for i in 0..2 {
        let r = a.draft(T0 + i, &format!("secret note {i}"));
        let (s, b) = post(&h.app, Some(&h.key_a), bytes(&r)).await;
        assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
        a.accept(&r);
    }
    let (s, b) = call(
        &h.app,
        "POST",
        "/v1/read-tokens",
        Some(&h.admin),
        br#"{"label":"monitor at example.org"}"#.to_vec(),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{}", String::from_utf8_lossy(&b));
    let v = json(&b);
    let token = v["read_token"].as_str().unwrap().to_owned();
    assert!(token.starts_with("tallyread_"), "{token}");
    assert_eq!(v["label"], "monitor at example.org");
    let id = v["read_token_id"].as_str().unwrap().to_owned();
    (h, token, id)
}

#[tokio::test]
async fn public_mode_serves_every_read_without_a_token() {
    let (h, _token, _) = setup(LogRead::Public).await;
    for uri in LOG_READS {
        let (s, b) = call(&h.app, "GET", uri, None, vec![]).await;
        let want = if uri == "/tile/0/999" { 404 } else { 200 };
        assert_eq!(s.as_u16(), want, "{uri}: {}", String::from_utf8_lossy(&b));
    }
    let (_, b) = call(&h.app, "GET", "/tile/entries/000.p/2", None, vec![]).await;
    assert!(String::from_utf8_lossy(&b).contains("secret note 0"));
    let (_, b) = call(&h.app, "GET", "/healthz", None, vec![]).await;
    assert_eq!(json(&b), json!({"status": "ok", "tree_size": 2}));
}

#[tokio::test]
async fn token_mode_serves_reads_to_read_token_holders_only() {
    let (h, token, id) = setup(LogRead::Token).await;
    let bad = "tallyread_0123456789abcdef_000000000000000000000000000000000000000000000000";
    for uri in LOG_READS {
        for (who, bearer) in [
            ("nobody", None),
            ("an API key", Some(h.key_a.as_str())),
            ("the admin token", Some(h.admin.as_str())),
            ("an unknown read token", Some(bad)),
        ] {
            let (s, b) = call(&h.app, "GET", uri, bearer, vec![]).await;
            assert_eq!(
                (s.as_u16(), code(&b).as_str()),
                (401, "unauthorized"),
                "{uri} with {who}: {}",
                String::from_utf8_lossy(&b)
            );
            assert!(!String::from_utf8_lossy(&b).contains("secret"));
        }
        let (s, b) = call(&h.app, "GET", uri, Some(&token), vec![]).await;
        let want = if uri == "/tile/0/999" { 404 } else { 200 };
        assert_eq!(s.as_u16(), want, "{uri}: {}", String::from_utf8_lossy(&b));
    }
    // The answer says what is missing, and asks for a bearer token.
    let resp = {
        use tower::ServiceExt;
        h.app
            .clone()
            .oneshot(
                axum::http::Request::get("/checkpoint")
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap()
    };
    assert_eq!(resp.headers()["www-authenticate"], "Bearer");
    // Still public: the key directory and health, without the log's size.
    let (s, _) = call(&h.app, "GET", "/.well-known/tally/keys", None, vec![]).await;
    assert_eq!(s, StatusCode::OK);
    let (_, b) = call(&h.app, "GET", "/healthz", None, vec![]).await;
    assert_eq!(json(&b), json!({"status": "ok"}));
    // Agents keep posting and reading their own heads with API keys.
    let (s, _) = call(&h.app, "GET", "/v1/agents/bot/head", Some(&h.key_a), vec![]).await;
    assert_eq!(s, StatusCode::OK);

    // Revoked: refused from the next request on.
    let (s, b) = call(
        &h.app,
        "POST",
        &format!("/v1/read-tokens/{id}/revoke"),
        Some(&h.admin),
        vec![],
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    let (s, b) = call(&h.app, "GET", "/checkpoint", Some(&token), vec![]).await;
    assert_eq!((s.as_u16(), code(&b).as_str()), (401, "unauthorized"));
    let (s, b) = call(&h.app, "GET", "/v1/read-tokens", Some(&h.admin), vec![]).await;
    assert_eq!(s, StatusCode::OK);
    let list = &json(&b)["read_tokens"];
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["id"], id.as_str());
    assert_eq!(list[0]["label"], "monitor at example.org");
    assert!(list[0]["revoked"].is_string(), "{list}");
    assert!(!String::from_utf8_lossy(&b).contains(&token));
}

/// GETs `uri` with `bearer` and returns (status, Cache-Control).
async fn cache_control(h: &Harness, uri: &str, bearer: &str) -> (u16, String) {
    use tower::ServiceExt;
    let resp = h
        .app
        .clone()
        .oneshot(
            axum::http::Request::get(uri)
                .header("authorization", format!("Bearer {bearer}"))
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let cc = resp
        .headers()
        .get("cache-control")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (resp.status().as_u16(), cc)
}

#[tokio::test]
async fn full_tiles_are_not_for_shared_caches_when_the_log_is_not_public() {
    for mode in [LogRead::Public, LogRead::Token] {
        let (h, token, _) = setup(mode).await;
        // Fill the first tile: 256 entries, from 8 agents in parallel.
        let posts = (0..8).map(|n| {
            let app = h.app.clone();
            let key = h.key_a.clone();
            async move {
                let mut a = TestAgent::new(&format!("filler-{n}"));
                a.register(&app, &key).await;
                for i in 0..32 {
                    let r = a.draft(T0 + i, "fill");
                    let (s, b) = post(&app, Some(&key), bytes(&r)).await;
                    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
                    a.accept(&r);
                }
            }
        });
        futures::future::join_all(posts).await;
        for uri in ["/tile/0/000", "/tile/entries/000"] {
            let (s, cc) = cache_control(&h, uri, &token).await;
            assert_eq!(s, 200, "{mode:?} {uri}");
            let want = match mode {
                LogRead::Public => "public, max-age=31536000, immutable",
                LogRead::Token => "private, max-age=31536000, immutable",
            };
            assert_eq!(cc, want, "{mode:?} {uri}");
        }
        // What was not shareable stays as it was.
        let (_, cc) = cache_control(&h, "/checkpoint", &token).await;
        assert_eq!(cc, "no-cache");
    }
}

#[tokio::test]
async fn read_token_routes_are_for_the_admin_only() {
    let (h, token, id) = setup(LogRead::Token).await;
    for (method, uri, body) in [
        ("POST", "/v1/read-tokens", b"{}".to_vec()),
        ("GET", "/v1/read-tokens", vec![]),
        (
            "POST",
            &format!("/v1/read-tokens/{id}/revoke") as &str,
            vec![],
        ),
    ] {
        for bearer in [None, Some(h.key_a.as_str()), Some(token.as_str())] {
            let (s, b) = call(&h.app, method, uri, bearer, body.clone()).await;
            assert_eq!(
                (s.as_u16(), code(&b).as_str()),
                (401, "unauthorized"),
                "{uri}"
            );
        }
    }
    let (s, b) = call(
        &h.app,
        "POST",
        "/v1/read-tokens/0000000000000000/revoke",
        Some(&h.admin),
        vec![],
    )
    .await;
    assert_eq!((s.as_u16(), code(&b).as_str()), (404, "not_found"));
    let long = json!({ "label": "x".repeat(129) });
    let (s, b) = call(
        &h.app,
        "POST",
        "/v1/read-tokens",
        Some(&h.admin),
        serde_json::to_vec(&long).unwrap(),
    )
    .await;
    assert_eq!((s.as_u16(), code(&b).as_str()), (400, "bad_label"));
    // Without a label: allowed, empty.
    let (s, b) = call(&h.app, "POST", "/v1/read-tokens", Some(&h.admin), vec![]).await;
    assert_eq!(s, StatusCode::CREATED, "{}", String::from_utf8_lossy(&b));
    assert_eq!(json(&b)["label"], "");
}

#[tokio::test]
async fn a_read_token_fetches_head_and_packs_of_named_agents() {
    for mode in [LogRead::Public, LogRead::Token] {
        let (h, token, _) = setup(mode).await;
        let (s, b) = call(
            &h.app,
            "GET",
            "/v1/head?from_size=1&agent=bot",
            Some(&token),
            vec![],
        )
        .await;
        assert_eq!(
            s,
            StatusCode::OK,
            "{mode:?}: {}",
            String::from_utf8_lossy(&b)
        );
        let (s, b) = call(&h.app, "GET", "/v1/export?agent=bot", Some(&token), vec![]).await;
        assert_eq!(
            s,
            StatusCode::OK,
            "{mode:?}: {}",
            String::from_utf8_lossy(&b)
        );
        let first = b.split(|c| *c == b'\n').next().unwrap();
        assert!(matches!(
            PackLine::from_json(first).unwrap(),
            PackLine::Header(_)
        ));
        // Agents must be named: a read token has no project to default to.
        let (s, b) = call(&h.app, "GET", "/v1/head?from_size=1", Some(&token), vec![]).await;
        assert_eq!((s.as_u16(), code(&b).as_str()), (400, "missing_parameter"));
        // Another project's API key still cannot.
        let (s, b) = call(
            &h.app,
            "GET",
            "/v1/export?agent=bot",
            Some(&h.key_b),
            vec![],
        )
        .await;
        assert_eq!((s.as_u16(), code(&b).as_str()), (403, "agent_not_allowed"));
        // A forged read token is an unknown key.
        let (s, b) = call(
            &h.app,
            "GET",
            "/v1/export?agent=bot",
            Some("tallyread_0123456789abcdef_000000000000000000000000000000000000000000000000"),
            vec![],
        )
        .await;
        assert_eq!((s.as_u16(), code(&b).as_str()), (401, "unauthorized"));
        // A read token is not an API key: it cannot post or register.
        let (s, b) = call(&h.app, "GET", "/v1/agents", Some(&token), vec![]).await;
        assert_eq!((s.as_u16(), code(&b).as_str()), (401, "unauthorized"));
    }
}
