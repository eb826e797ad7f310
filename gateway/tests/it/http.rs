//! The Streamable HTTP proxy on real loopback sockets: a scripted upstream
//! MCP server (axum), the gateway's own server in front of it, a reqwest
//! client, and a real redb chain store. Checks what crosses the gateway
//! (bytes, headers, status codes) and what is recorded (docs/protocol.md §5).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse as _, Response};
use axum::routing::any;
use axum::Router;
use bytes::Bytes;
use serde_json::{json, Value};
use tally_gateway::calls::{CallRecorder, ProxyConfig, StrictPolicy};
use tally_gateway::chain::AgentChain;
use tally_gateway::http::{serve, HttpConfig, HttpGateway, HttpLimits, ProbeResult};
use tally_gateway::recorder::{Recorder, RecorderHandle};
use tally_gateway::store::ChainStore;
use tally_gateway::sync::SyncProgress;
use tally_schemas::time::SystemClock;
use tally_schemas::{AgentName, Record, SecretKey};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch, Notify};

const TOKEN: &str = "Bearer secret-token-that-must-never-be-recorded";

/// What the scripted upstream saw.
#[derive(Default)]
struct Seen {
    requests: Vec<(String, HeaderMap, Bytes)>,
}

type Handler = Arc<dyn Fn(&str, &HeaderMap, &Bytes) -> Response + Send + Sync>;

async fn start_upstream(handler: Handler) -> (String, Arc<Mutex<Seen>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s = Arc::clone(&seen);
    let app = Router::new().route(
        "/mcp",
        any(
            move |method: axum::http::Method, headers: HeaderMap, body: Bytes| {
                let s = Arc::clone(&s);
                let handler = Arc::clone(&handler);
                async move {
                    s.lock().unwrap().requests.push((
                        method.to_string(),
                        headers.clone(),
                        body.clone(),
                    ));
                    handler(method.as_str(), &headers, &body)
                }
            },
        ),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/mcp"), seen)
}

struct Gateway {
    url: String,
    store: Arc<ChainStore>,
    gateway: HttpGateway,
    stop: Option<oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<tally_gateway::http::HttpReport>,
    _recorder: Option<Recorder>,
    dir: tempfile::TempDir,
}

async fn start_gateway(upstream: &str, limits: HttpLimits, working_store: bool) -> Gateway {
    start_gateway_with(
        upstream,
        limits,
        working_store,
        ProxyConfig::default(),
        None,
    )
    .await
}

async fn start_gateway_with(
    upstream: &str,
    limits: HttpLimits,
    working_store: bool,
    config: ProxyConfig,
    receipts: Option<watch::Receiver<SyncProgress>>,
) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(ChainStore::open(&dir.path().join("chain.redb")).unwrap());
    let (recorder, handle) = if working_store {
        let r = Recorder::start(
            AgentName::new("http-test").unwrap(),
            SecretKey::from_seed(&[9; 32]),
            Arc::new(SystemClock),
            Arc::clone(&store),
        )
        .unwrap();
        let h = r.handle();
        (Some(r), h)
    } else {
        (
            None,
            RecorderHandle::unavailable("injected: the store is read-only"),
        )
    };
    let core = CallRecorder::new(
        config,
        AgentChain::with_writer(handle, Some(Arc::clone(&store)), receipts),
    );
    let gateway = HttpGateway::new(
        core,
        HttpConfig {
            upstream: upstream.parse().unwrap(),
            upstream_ca_pem: None,
            allowed_origins: vec![],
            loopback_hosts_only: true,
            limits,
        },
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn(serve(gateway.clone(), listener, None, async move {
        let _ = stopped.await;
    }));
    Gateway {
        url: format!("http://{addr}/mcp"),
        store,
        gateway,
        stop: Some(stop),
        served,
        _recorder: recorder,
        dir,
    }
}

impl Gateway {
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
            "expected {n} records, have {:?}",
            self.store
                .records(0, 10_000)
                .unwrap()
                .iter()
                .map(body)
                .collect::<Vec<_>>()
        );
    }

    /// Outcome status by the tool of the decision it names.
    async fn outcomes(&self, n: usize) -> BTreeMap<String, String> {
        let records = self.records(n).await;
        let tools: BTreeMap<String, String> = records
            .iter()
            .filter(|r| body(r)["tool"].is_string())
            .map(|r| {
                (
                    r.hash().to_hex(),
                    body(r)["tool"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        records
            .iter()
            .filter(|r| body(r)["status"].is_string())
            .map(|r| {
                let b = body(r);
                (
                    tools[b["decision"].as_str().unwrap()].clone(),
                    b["status"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    async fn stop(mut self) -> tally_gateway::http::HttpReport {
        let _ = self.stop.take().unwrap().send(());
        let report = (&mut self.served).await.unwrap();
        // Keep the state directory until the caller has looked at it.
        std::mem::forget(self.dir);
        report
    }
}

fn body(r: &Record) -> Value {
    serde_json::to_value(&r.body).unwrap()
}

fn call(id: Value, tool: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": tool, "arguments": {"x": 1}}})
    .to_string()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

async fn post(url: &str, body: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = client()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_owned());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

fn json_answer(body: &Value) -> Response {
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn request_id(body: &Bytes) -> Value {
    serde_json::from_slice::<Value>(body).unwrap()["id"].clone()
}

/// An SSE answer fed from a channel: the test decides what comes and when;
/// an `Err` breaks the connection.
fn sse_answer(rx: mpsc::UnboundedReceiver<Result<Bytes, std::io::Error>>) -> Response {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .header("mcp-session-id", "s-1")
        .body(Body::from_stream(stream))
        .unwrap()
}

#[tokio::test]
async fn a_call_is_decided_before_it_reaches_the_upstream_and_bytes_and_auth_pass_unchanged() {
    let gw_store: Arc<Mutex<Option<Arc<ChainStore>>>> = Arc::default();
    let at_upstream = Arc::clone(&gw_store);
    let decisions_seen = Arc::new(Mutex::new(Vec::new()));
    let ds = Arc::clone(&decisions_seen);
    let answer =
        r#"{"result":{"content":[{"type":"text","text":"hi  é"}]},"jsonrpc":"2.0","id":7}"#;
    let (upstream, seen) = start_upstream(Arc::new(move |_, _, _| {
        // The decision is in the chain before the call reaches the server.
        let n = at_upstream
            .lock()
            .unwrap()
            .as_ref()
            .map_or(0, |s| s.records(0, 10).unwrap().len());
        ds.lock().unwrap().push(n);
        Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .header("x-upstream", "kept")
            .body(Body::from(answer))
            .unwrap()
    }))
    .await;
    let gw = start_gateway(&upstream, HttpLimits::default(), true).await;
    *gw_store.lock().unwrap() = Some(Arc::clone(&gw.store));
    let req = r#"{"jsonrpc":"2.0",  "id":7,"method":"tools/call","params":{"name":"echo","arguments":{"b":1,"a":"é"}}}"#;
    let resp = post(
        &gw.url,
        req,
        &[
            ("authorization", TOKEN),
            ("mcp-protocol-version", "2025-11-25"),
        ],
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-upstream"], "kept");
    assert_eq!(resp.bytes().await.unwrap(), answer.as_bytes());
    {
        let seen = seen.lock().unwrap();
        let (method, headers, bytes) = &seen.requests[0];
        assert_eq!(method, "POST");
        assert_eq!(bytes, req.as_bytes());
        assert_eq!(headers["authorization"], TOKEN);
        assert_eq!(headers["mcp-protocol-version"], "2025-11-25");
    }
    assert_eq!(*decisions_seen.lock().unwrap(), vec![1]);
    let records = gw.records(2).await;
    assert_eq!(body(&records[0])["call_id"], "7");
    assert_eq!(body(&records[0])["tool"], "echo");
    assert_eq!(body(&records[1])["status"], "ok");
    assert!(body(&records[1])["output_hash"].is_string());
    let dir = gw.dir.path().to_owned();
    let _keep = gw.stop().await;
    // The credentials were passed on, never written anywhere.
    for entry in std::fs::read_dir(&dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        assert!(!bytes
            .windows(b"secret-token".len())
            .any(|w| w == b"secret-token"));
    }
}

#[tokio::test]
async fn an_sse_answer_streams_through_unchanged_and_ends_the_call() {
    let (tx, rx) = mpsc::unbounded_channel();
    let rx = Arc::new(Mutex::new(Some(rx)));
    let (upstream, _) = start_upstream(Arc::new(move |_, _, _| {
        sse_answer(rx.lock().unwrap().take().unwrap())
    }))
    .await;
    let gw = start_gateway(&upstream, HttpLimits::default(), true).await;
    let mut resp = post(&gw.url, &call(json!(1), "slow"), &[]).await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert_eq!(resp.headers()["mcp-session-id"], "s-1");
    let progress = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":1}}\n\n";
    tx.send(Ok(Bytes::from(progress))).unwrap();
    // The progress notification arrives before the answer exists.
    let first = resp.chunk().await.unwrap().unwrap();
    assert_eq!(first, progress.as_bytes());
    assert_eq!(gw.store.records(0, 10).unwrap().len(), 1);
    // The answer, split across chunks with CRLF line ends.
    tx.send(Ok(Bytes::from("data: {\"jsonrpc\":\"2.0\",\"id\":1,")))
        .unwrap();
    tx.send(Ok(Bytes::from("\"result\":{\"isError\":true}}\r\n\r\n")))
        .unwrap();
    drop(tx);
    let mut rest = Vec::new();
    while let Some(c) = resp.chunk().await.unwrap() {
        rest.extend_from_slice(&c);
    }
    assert_eq!(
        rest,
        b"data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"isError\":true}}\r\n\r\n"
    );
    assert_eq!(gw.outcomes(2).await["slow"], "error");
}

#[tokio::test]
async fn concurrent_sessions_with_the_same_request_ids_keep_their_calls_apart() {
    // Each session's call 1 is held until both have arrived; then session
    // B's is answered with an error first, A's with a result.
    let (tx_a, rx_a) = mpsc::unbounded_channel();
    let (tx_b, rx_b) = mpsc::unbounded_channel();
    let streams = Arc::new(Mutex::new(BTreeMap::from([
        ("A".to_owned(), rx_a),
        ("B".to_owned(), rx_b),
    ])));
    let arrived = Arc::new(Notify::new());
    let ar = Arc::clone(&arrived);
    let (upstream, _) = start_upstream(Arc::new(move |_, headers, _| {
        let sid = headers["mcp-session-id"].to_str().unwrap().to_owned();
        ar.notify_one();
        sse_answer(streams.lock().unwrap().remove(&sid).unwrap())
    }))
    .await;
    let gw = start_gateway(&upstream, HttpLimits::default(), true).await;
    let (url_a, url_b) = (gw.url.clone(), gw.url.clone());
    let a = tokio::spawn(async move {
        let r = post(&url_a, &call(json!(1), "alpha"), &[("mcp-session-id", "A")]).await;
        r.bytes().await.unwrap()
    });
    arrived.notified().await;
    let b = tokio::spawn(async move {
        let r = post(&url_b, &call(json!(1), "beta"), &[("mcp-session-id", "B")]).await;
        r.bytes().await.unwrap()
    });
    arrived.notified().await;
    // Within one session an id still in flight is refused, never forwarded.
    let dup = post(
        &gw.url,
        &call(json!(1), "again"),
        &[("mcp-session-id", "A")],
    )
    .await;
    let v: Value = dup.json().await.unwrap();
    assert_eq!(v["error"]["data"]["tally"], "duplicate_request_id");
    tx_b.send(Ok(Bytes::from(
        "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-1,\"message\":\"no\"}}\n\n",
    )))
    .unwrap();
    drop(tx_b);
    b.await.unwrap();
    tx_a.send(Ok(Bytes::from(
        "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n",
    )))
    .unwrap();
    drop(tx_a);
    a.await.unwrap();
    let outcomes = gw.outcomes(4).await;
    assert_eq!(outcomes["alpha"], "ok");
    assert_eq!(outcomes["beta"], "error");
}

#[tokio::test]
async fn an_upstream_that_dies_mid_stream_ends_the_call_server_exited() {
    let (tx, rx) = mpsc::unbounded_channel();
    let rx = Arc::new(Mutex::new(Some(rx)));
    let (upstream, _) = start_upstream(Arc::new(move |_, _, _| {
        sse_answer(rx.lock().unwrap().take().unwrap())
    }))
    .await;
    let gw = start_gateway(&upstream, HttpLimits::default(), true).await;
    let mut resp = post(
        &gw.url,
        &call(json!("c"), "doomed"),
        &[("mcp-session-id", "s-1")],
    )
    .await;
    tx.send(Ok(Bytes::from(
        "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":1}}\n\n",
    )))
    .unwrap();
    resp.chunk().await.unwrap().unwrap();
    // The connection breaks: no answer, and no event ids to resume from.
    tx.send(Err(std::io::Error::other("killed"))).unwrap();
    while let Ok(Some(_)) = resp.chunk().await {}
    assert_eq!(gw.outcomes(2).await["doomed"], "server_exited");
}

#[tokio::test]
async fn a_broken_stream_with_event_ids_is_resumed_and_the_resumed_answer_ends_the_call() {
    let (tx, rx) = mpsc::unbounded_channel();
    let rx = Arc::new(Mutex::new(Some(rx)));
    let (upstream, seen) = start_upstream(Arc::new(move |method, headers, _| {
        if method == "GET" {
            assert_eq!(headers["last-event-id"], "ev-1");
            return Response::builder()
                .status(200)
                .header("content-type", "text/event-stream")
                .body(Body::from(
                    "id: ev-2\ndata: {\"jsonrpc\":\"2.0\",\"id\":5,\"result\":{\"content\":[]}}\n\n",
                ))
                .unwrap();
        }
        sse_answer(rx.lock().unwrap().take().unwrap())
    }))
    .await;
    let gw = start_gateway(&upstream, HttpLimits::default(), true).await;
    let mut resp = post(
        &gw.url,
        &call(json!(5), "resumable"),
        &[("mcp-session-id", "s-1")],
    )
    .await;
    tx.send(Ok(Bytes::from("id: ev-1\ndata:\n\n"))).unwrap();
    resp.chunk().await.unwrap().unwrap();
    tx.send(Err(std::io::Error::other("server closed the connection")))
        .unwrap();
    while let Ok(Some(_)) = resp.chunk().await {}
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Still open: the client may resume.
    assert_eq!(gw.store.records(0, 10).unwrap().len(), 1);
    let resumed = client()
        .get(&gw.url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", "s-1")
        .header("last-event-id", "ev-1")
        .send()
        .await
        .unwrap();
    let text = resumed.text().await.unwrap();
    assert!(text.contains("\"id\":5"), "{text}");
    assert_eq!(gw.outcomes(2).await["resumable"], "ok");
    assert_eq!(seen.lock().unwrap().requests.len(), 2);
}

#[tokio::test]
async fn http_errors_and_answers_that_are_not_mcp_end_calls_http_error() {
    let (upstream, _) = start_upstream(Arc::new(|_, _, body| {
        let id = request_id(body);
        match id.as_str() {
            Some("plain-500") => {
                (StatusCode::INTERNAL_SERVER_ERROR, "upstream crashed").into_response()
            }
            Some("html") => (
                StatusCode::OK,
                [("content-type", "text/html")],
                "<html>login</html>",
            )
                .into_response(),
            // A 4xx that is a JSON-RPC error for the call is an `error`.
            _ => (
                StatusCode::BAD_REQUEST,
                [("content-type", "application/json")],
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32602, "message": "bad"}})
                    .to_string(),
            )
                .into_response(),
        }
    }))
    .await;
    let gw = start_gateway(&upstream, HttpLimits::default(), true).await;
    let r = post(&gw.url, &call(json!("plain-500"), "t500"), &[]).await;
    assert_eq!(r.status(), 500);
    assert_eq!(r.text().await.unwrap(), "upstream crashed");
    let r = post(&gw.url, &call(json!("html"), "thtml"), &[]).await;
    assert_eq!(r.text().await.unwrap(), "<html>login</html>");
    let r = post(&gw.url, &call(json!("rpc"), "trpc"), &[]).await;
    assert_eq!(r.status(), 400);
    let outcomes = gw.outcomes(6).await;
    assert_eq!(outcomes["t500"], "http_error");
    assert_eq!(outcomes["thtml"], "http_error");
    assert_eq!(outcomes["trpc"], "error");
}

#[tokio::test]
async fn an_unreachable_upstream_gets_502_and_http_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let gw = start_gateway(
        &format!("http://127.0.0.1:{port}/mcp"),
        HttpLimits::default(),
        true,
    )
    .await;
    let r = post(&gw.url, &call(json!(3), "nowhere"), &[]).await;
    assert_eq!(r.status(), 502);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["id"], 3);
    assert_eq!(v["error"]["data"]["tally"], "upstream_unreachable");
    assert_eq!(gw.outcomes(2).await["nowhere"], "http_error");
    let report = gw.stop().await;
    assert_eq!(report.http_error_calls, 1);
}

#[tokio::test]
async fn cancellation_by_notification_and_by_closing_the_stream_at_2026_07_28() {
    let (upstream, seen) = start_upstream(Arc::new(|method, _, body| {
        if method != "POST" || request_id(body).is_null() {
            return StatusCode::ACCEPTED.into_response();
        }
        // Never answers: the stream stays open.
        let (tx, rx) = mpsc::unbounded_channel::<Result<Bytes, std::io::Error>>();
        tx.send(Ok(Bytes::from(": open\n\n"))).unwrap();
        std::mem::forget(tx);
        sse_answer(rx)
    }))
    .await;
    let gw = start_gateway(&upstream, HttpLimits::default(), true).await;
    // Up to 2025-11-25: notifications/cancelled names the call.
    let mut held = post(
        &gw.url,
        &call(json!(1), "by_notification"),
        &[("mcp-session-id", "s-1")],
    )
    .await;
    held.chunk().await.unwrap();
    let cancel =
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}});
    let r = post(&gw.url, &cancel.to_string(), &[("mcp-session-id", "s-1")]).await;
    assert_eq!(r.status(), 202);
    // 2026-07-28: closing the call's stream is the cancellation.
    let mut modern = post(
        &gw.url,
        &call(json!(1), "by_closing"),
        &[("mcp-protocol-version", "2026-07-28")],
    )
    .await;
    modern.chunk().await.unwrap();
    drop(modern);
    let outcomes = gw.outcomes(4).await;
    assert_eq!(outcomes["by_notification"], "cancelled");
    assert_eq!(outcomes["by_closing"], "cancelled");
    assert!(seen
        .lock()
        .unwrap()
        .requests
        .iter()
        .any(|(_, _, b)| b.as_ref() == cancel.to_string().as_bytes()));
    drop(held);
}

#[tokio::test]
async fn session_end_and_gateway_stop_end_open_calls_client_gone() {
    let (upstream, _) = start_upstream(Arc::new(|method, _, _| {
        if method == "DELETE" {
            return StatusCode::OK.into_response();
        }
        let (tx, rx) = mpsc::unbounded_channel::<Result<Bytes, std::io::Error>>();
        // A priming event with an id, then the connection closes: the
        // client could resume, so the call stays open in its session.
        tx.send(Ok(Bytes::from("id: p\ndata:\n\n"))).unwrap();
        tokio::spawn(async move {
            // After the event has been written out.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let _ = tx.send(Err(std::io::Error::other("poll later")));
        });
        sse_answer(rx)
    }))
    .await;
    let gw = start_gateway(&upstream, HttpLimits::default(), true).await;
    for (sid, tool) in [("s-1", "ended_by_delete"), ("s-2", "ended_by_stop")] {
        let mut r = post(&gw.url, &call(json!(1), tool), &[("mcp-session-id", sid)]).await;
        while let Ok(Some(_)) = r.chunk().await {}
    }
    let deleted = client()
        .delete(&gw.url)
        .header("mcp-session-id", "s-1")
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    assert_eq!(gw.outcomes(3).await["ended_by_delete"], "client_gone");
    let store = Arc::clone(&gw.store);
    let report = gw.stop().await;
    assert_eq!(report.client_gone_calls, 2);
    let statuses: Vec<String> = store
        .records(0, 10)
        .unwrap()
        .iter()
        .filter_map(|r| body(r)["status"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(statuses, vec!["client_gone", "client_gone"]);
}

#[tokio::test]
async fn fail_closed_a_call_whose_decision_cannot_be_recorded_never_reaches_the_upstream() {
    let (upstream, seen) = start_upstream(Arc::new(|_, _, body| {
        json_answer(&json!({"jsonrpc": "2.0", "id": request_id(body), "result": {}}))
    }))
    .await;
    let gw = start_gateway(&upstream, HttpLimits::default(), false).await;
    let r = post(&gw.url, &call(json!(9), "refund"), &[]).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["id"], 9);
    assert_eq!(v["error"]["code"], -32001);
    assert_eq!(v["error"]["data"]["tally"], "decision_not_recorded");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("read-only"));
    // Other traffic still flows.
    let r = post(
        &gw.url,
        r#"{"jsonrpc":"2.0","id":10,"method":"tools/list"}"#,
        &[],
    )
    .await;
    assert_eq!(r.status(), 200);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.requests.len(), 1);
    assert!(!String::from_utf8_lossy(&seen.requests[0].2).contains("tools/call"));
}

#[tokio::test]
async fn refusals_and_limits_have_stable_codes() {
    let (upstream, seen) = start_upstream(Arc::new(|_, headers, body| {
        let mut r = json_answer(&json!({"jsonrpc": "2.0", "id": request_id(body), "result": {}}));
        if !headers.contains_key("mcp-session-id") {
            r.headers_mut()
                .insert("mcp-session-id", "fresh".parse().unwrap());
        }
        r
    }))
    .await;
    let limits = HttpLimits {
        max_body_bytes: 1024,
        max_sessions: 1,
        ..HttpLimits::default()
    };
    let gw = start_gateway(&upstream, limits, true).await;
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{}"}}}}"#,
        "x".repeat(2000)
    );
    let r = post(&gw.url, &big, &[]).await;
    assert_eq!(r.status(), 413);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["data"]["tally"],
        "body_too_large"
    );

    let r = post(
        &gw.url,
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
        &[("origin", "https://evil.example")],
    )
    .await;
    assert_eq!(r.status(), 403);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["data"]["tally"],
        "forbidden_origin"
    );
    let r = post(
        &gw.url,
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
        &[("host", "evil.example")],
    )
    .await;
    assert_eq!(r.status(), 403);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["data"]["tally"],
        "forbidden_host"
    );
    let r = post(
        &gw.url,
        r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
        &[("origin", "http://localhost:3000")],
    )
    .await;
    assert_eq!(r.status(), 200);

    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#;
    let r = post(&gw.url, init, &[]).await;
    assert_eq!(r.headers()["mcp-session-id"], "fresh");
    let r = post(&gw.url, init, &[]).await;
    assert_eq!(r.status(), 503);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["data"]["tally"],
        "too_many_sessions"
    );

    let batch = format!("[{},{}]", call(json!(1), "a"), call(json!(2), "b"));
    let r = post(&gw.url, &batch, &[("mcp-session-id", "fresh")]).await;
    let v: Value = r.json().await.unwrap();
    assert_eq!(v[0]["error"]["data"]["tally"], "batch_not_supported");
    assert_eq!(v[1]["id"], 2);
    let dup = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"a":1,"a":2}}}"#;
    let r = post(&gw.url, dup, &[("mcp-session-id", "fresh")]).await;
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["data"]["tally"],
        "not_strict_json"
    );
    let forwarded = seen.lock().unwrap().requests.len();
    // ping with the local origin, and the first initialize.
    assert_eq!(forwarded, 2);
}

#[tokio::test]
async fn tool_lists_are_recorded_and_listed_again_after_list_changed() {
    let version = Arc::new(Mutex::new("one"));
    let v = Arc::clone(&version);
    let (upstream, seen) = start_upstream(Arc::new(move |_, _, body| {
        let msg: Value = serde_json::from_slice(body).unwrap();
        let description = *v.lock().unwrap();
        match msg["method"].as_str() {
            Some("tools/list") => json_answer(
                &json!({"jsonrpc": "2.0", "id": msg["id"], "result": {"tools": [
                {"name": "echo", "description": description, "inputSchema": {"type": "object"}}]}}),
            ),
            _ => {
                // The call's answer stream carries list_changed first.
                *v.lock().unwrap() = "two";
                let events = format!(
                    "data: {}\n\ndata: {}\n\n",
                    json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}),
                    json!({"jsonrpc": "2.0", "id": msg["id"], "result": {}})
                );
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Body::from(events))
                    .unwrap()
            }
        }
    }))
    .await;
    let gw = start_gateway(&upstream, HttpLimits::default(), true).await;
    let h = [
        ("mcp-session-id", "s-9"),
        ("authorization", TOKEN),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    let r = post(
        &gw.url,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
        &h,
    )
    .await;
    r.bytes().await.unwrap();
    let r = post(&gw.url, &call(json!(2), "echo"), &h).await;
    r.bytes().await.unwrap();
    let records = gw.records(4).await;
    let lists: Vec<Value> = records
        .iter()
        .map(body)
        .filter(|b| b["tools"].is_array())
        .collect();
    assert_eq!(lists.len(), 2, "{records:?}");
    assert_ne!(
        lists[0]["tools"][0]["digest"],
        lists[1]["tools"][0]["digest"]
    );
    // The gateway's own listing went with the session's headers.
    let seen = seen.lock().unwrap();
    let own = seen
        .requests
        .iter()
        .find(|(_, _, b)| String::from_utf8_lossy(b).contains("tally-gateway:tools/list:"))
        .expect("the gateway listed the tools itself");
    assert_eq!(own.1["mcp-session-id"], "s-9");
    assert_eq!(own.1["authorization"], TOKEN);
}

#[tokio::test]
async fn the_probe_tells_an_mcp_endpoint_from_something_else() {
    let (mcp, _) = start_upstream(Arc::new(|_, _, _| {
        (
            StatusCode::BAD_REQUEST,
            [("content-type", "application/json")],
            r#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session ID provided"},"id":null}"#,
        )
            .into_response()
    }))
    .await;
    let gw = start_gateway(&mcp, HttpLimits::default(), true).await;
    assert_eq!(gw.gateway.probe().await.unwrap(), ProbeResult::Mcp);

    let (web, _) = start_upstream(Arc::new(|_, _, _| {
        (
            StatusCode::NOT_FOUND,
            [("content-type", "text/html")],
            "<h1>Not Found</h1>",
        )
            .into_response()
    }))
    .await;
    let gw = start_gateway(&web, HttpLimits::default(), true).await;
    let err = gw.gateway.probe().await.unwrap_err().to_string();
    assert!(
        err.contains("not an MCP endpoint") && err.contains("404"),
        "{err}"
    );
}

fn answering_upstream() -> Handler {
    Arc::new(|_, _, body| {
        let msg: Value = serde_json::from_slice(body).unwrap();
        if msg["method"] == "tools/list" {
            return json_answer(
                &json!({"jsonrpc": "2.0", "id": msg["id"], "result": {"tools": [
                {"name": "safe_read", "inputSchema": {"type": "object"}},
                {"name": "other", "inputSchema": {"type": "object"}}]}}),
            );
        }
        json_answer(&json!({"jsonrpc": "2.0", "id": msg["id"], "result": {"content": []}}))
    })
}

fn calls_seen(seen: &Mutex<Seen>) -> Vec<String> {
    seen.lock()
        .unwrap()
        .requests
        .iter()
        .filter_map(|(_, _, b)| serde_json::from_slice::<Value>(b).ok())
        .filter_map(|v| v["params"]["name"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn strict_calls_wait_for_their_receipt_and_are_refused_without_it() {
    let (upstream, seen) = start_upstream(answering_upstream()).await;
    let (progress, rx) = watch::channel(SyncProgress::default());
    let config = ProxyConfig {
        strict: StrictPolicy::Tools(["pay".to_owned()].into()),
        strict_timeout: Duration::from_millis(300),
        actions: tally_gateway::calls::ActionConfig::default(),
        ..ProxyConfig::default()
    };
    let gw = start_gateway_with(&upstream, HttpLimits::default(), true, config, Some(rx)).await;
    // Not strict for this tool: forwarded at once.
    post(&gw.url, &call(json!(1), "read"), &[])
        .await
        .bytes()
        .await
        .unwrap();
    // Strict: held until the sync says the decision (seq 2) is receipted.
    let url = gw.url.clone();
    let held =
        tokio::spawn(async move { post(&url, &call(json!(2), "pay"), &[]).await.bytes().await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(calls_seen(&seen), vec!["read"], "the strict call waits");
    progress.send_modify(|p| p.cursor = 3);
    held.await.unwrap().unwrap();
    assert_eq!(calls_seen(&seen), vec!["read", "pay"]);
    // No receipt in time: refused, never forwarded, outcome not_run.
    let r = post(&gw.url, &call(json!(3), "pay"), &[]).await;
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["data"]["tally"], "strict_receipt");
    assert_eq!(calls_seen(&seen), vec!["read", "pay"]);
    let records = gw.records(6).await;
    let statuses: Vec<String> = records
        .iter()
        .filter_map(|r| body(r)["status"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(statuses, vec!["ok", "ok", "not_run"]);
}

#[tokio::test]
async fn with_a_name_prefix_other_tools_are_declared_unrecorded_and_their_calls_pass() {
    let (upstream, seen) = start_upstream(answering_upstream()).await;
    let config = ProxyConfig {
        record_only_prefix: Some("safe_".into()),
        ..ProxyConfig::default()
    };
    let gw = start_gateway_with(&upstream, HttpLimits::default(), true, config, None).await;
    post(
        &gw.url,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
        &[],
    )
    .await
    .bytes()
    .await
    .unwrap();
    post(&gw.url, &call(json!(2), "other"), &[])
        .await
        .bytes()
        .await
        .unwrap();
    post(&gw.url, &call(json!(3), "safe_read"), &[])
        .await
        .bytes()
        .await
        .unwrap();
    assert_eq!(calls_seen(&seen), vec!["other", "safe_read"]);
    let records = gw.records(3).await;
    let tools = body(&records[0]);
    assert_eq!(tools["tools"][0]["recorded"], true);
    assert_eq!(tools["tools"][1]["recorded"], false);
    assert_eq!(body(&records[1])["tool"], "safe_read");
    assert_eq!(body(&records[2])["status"], "ok");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(gw.store.records(0, 10).unwrap().len(), 3);
}

#[tokio::test]
async fn an_idle_session_expires_and_its_open_calls_end_client_gone() {
    let (upstream, _) = start_upstream(Arc::new(|_, _, _| {
        let (tx, rx) = mpsc::unbounded_channel::<Result<Bytes, std::io::Error>>();
        tx.send(Ok(Bytes::from("id: p\ndata:\n\n"))).unwrap();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = tx.send(Err(std::io::Error::other("poll later")));
        });
        sse_answer(rx)
    }))
    .await;
    let limits = HttpLimits {
        session_idle: Duration::from_millis(400),
        ..HttpLimits::default()
    };
    let gw = start_gateway(&upstream, limits, true).await;
    let mut r = post(
        &gw.url,
        &call(json!(1), "left_open"),
        &[("mcp-session-id", "idle")],
    )
    .await;
    while let Ok(Some(_)) = r.chunk().await {}
    // Resumable, so still open; the client never comes back.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(gw.store.records(0, 10).unwrap().len(), 1);
    assert_eq!(gw.outcomes(2).await["left_open"], "client_gone");
}
