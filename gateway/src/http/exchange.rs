//! The request handler and exchange of the HTTP gateway (docs/operations.md
//! "The gateway over HTTP"): refusing non-local origins, routing a request
//! by session, deciding its calls and forwarding it to the upstream.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use http_body_util::BodyExt as _;
use serde_json::Value;
use tally_schemas::record::{CheckTrigger, OutcomeStatus};
use tokio::sync::oneshot;

use crate::calls::{is_paged_list_request, Refusal, ERROR_NOT_FORWARDED};

use super::relay::{relay, StreamEnd};
use super::session::too_many_sessions;
use super::state::{lock, CallSlot, Inner, Reply, Session, Watch};
use super::wire::{
    copy_headers, gateway_error, id_key, is_modern, json_response, loopback_name, session_of,
};

impl Inner {
    pub(super) fn upstream_url(&self, uri: &axum::http::Uri) -> reqwest::Url {
        let mut url = self.upstream.clone();
        if uri.path() != self.upstream.path() {
            url.set_path(uri.path());
            url.set_query(None);
        }
        if let Some(q) = uri.query() {
            let joined = match url.query() {
                Some(own) if !own.is_empty() => format!("{own}&{q}"),
                _ => q.to_owned(),
            };
            url.set_query(Some(&joined));
        }
        url
    }

    pub(super) fn upstream_request(
        &self,
        method: &Method,
        url: reqwest::Url,
        headers: &HeaderMap,
        body: Option<Bytes>,
    ) -> reqwest::RequestBuilder {
        let mut req = self
            .client
            .request(method.clone(), url)
            .headers(copy_headers(headers));
        if let Some(b) = body {
            req = req.body(b);
        }
        req
    }
}

pub(super) fn origin_allowed(inner: &Inner, headers: &HeaderMap) -> Result<(), &'static str> {
    if inner.config.loopback_hosts_only {
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !host.is_empty() && !loopback_name(host) {
            return Err("forbidden_host");
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        let local = origin.split_once("://").is_some_and(|(scheme, rest)| {
            matches!(scheme, "http" | "https") && loopback_name(rest)
        });
        let listed = inner
            .config
            .allowed_origins
            .iter()
            .any(|o| o.eq_ignore_ascii_case(origin));
        if !(local || listed) {
            return Err("forbidden_origin");
        }
    }
    Ok(())
}

pub(super) async fn handle(State(inner): State<Arc<Inner>>, req: Request) -> Response {
    if let Err(reason) = origin_allowed(&inner, req.headers()) {
        return gateway_error(
            StatusCode::FORBIDDEN,
            None,
            ERROR_NOT_FORWARDED,
            reason,
            "tally gateway: request refused: its Host or Origin is not allowed (the gateway refuses non-local origins; see --allow-origin)",
        );
    }
    let Ok(permit) = Arc::clone(&inner.in_flight).try_acquire_owned() else {
        return gateway_error(
            StatusCode::SERVICE_UNAVAILABLE,
            None,
            ERROR_NOT_FORWARDED,
            "busy",
            "tally gateway: too many requests in flight; try again",
        );
    };
    let (parts, body) = req.into_parts();
    let body = match tokio::time::timeout(
        inner.config.limits.body_read_timeout,
        http_body_util::Limited::new(body, inner.config.limits.max_body_bytes).collect(),
    )
    .await
    {
        Err(_) => {
            return gateway_error(
                StatusCode::REQUEST_TIMEOUT,
                None,
                ERROR_NOT_FORWARDED,
                "body_timeout",
                "tally gateway: the request body did not arrive in time",
            )
        }
        Ok(Err(e)) => {
            let too_large = e
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some();
            return if too_large {
                gateway_error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    None,
                    ERROR_NOT_FORWARDED,
                    "body_too_large",
                    &format!(
                        "tally gateway: the request body is larger than {} bytes (--max-body-bytes)",
                        inner.config.limits.max_body_bytes
                    ),
                )
            } else {
                gateway_error(
                    StatusCode::BAD_REQUEST,
                    None,
                    ERROR_NOT_FORWARDED,
                    "body_unreadable",
                    "tally gateway: the request body could not be read",
                )
            };
        }
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    let on_endpoint = parts.uri.path() == inner.upstream.path();
    let (reply_tx, reply_rx) = oneshot::channel();
    // The exchange runs in its own task, so a client that goes away (and
    // makes hyper drop this handler) cannot stop an outcome from being recorded.
    let task = Arc::clone(&inner);
    tokio::spawn(async move {
        exchange(
            task,
            parts.method,
            parts.uri,
            parts.headers,
            body,
            on_endpoint,
            reply_tx,
        )
        .await;
        drop(permit);
    });
    reply_rx.await.unwrap_or_else(|_| {
        gateway_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            None,
            ERROR_NOT_FORWARDED,
            "internal",
            "tally gateway: the exchange ended without an answer",
        )
    })
}

/// What a `POST` to the MCP endpoint carries, as far as recording goes.
pub(super) enum Carried {
    Call(Value),
    List(Value, bool),
    Cancel(Value),
    Initialize(Value),
    /// The client's `notifications/initialized`.
    Initialized,
    /// A batch with a `tools/call`: refused, with these request ids.
    CallBatch(Vec<Value>),
    Other,
}

pub(super) fn carried(method: &Method, body: &[u8]) -> Carried {
    if method != Method::POST {
        return Carried::Other;
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => {
            let id = m.get("id").cloned();
            match (m.get("method").and_then(Value::as_str), id) {
                (Some("tools/call"), Some(id)) => Carried::Call(id),
                (Some("tools/list"), Some(id)) => {
                    Carried::List(id, is_paged_list_request(&Value::Object(m)))
                }
                (Some("initialize"), Some(id)) => Carried::Initialize(id),
                (Some("notifications/initialized"), None) => Carried::Initialized,
                (Some("notifications/cancelled"), None) => {
                    match m.get("params").and_then(|p| p.get("requestId")) {
                        Some(rid) => Carried::Cancel(rid.clone()),
                        None => Carried::Other,
                    }
                }
                _ => Carried::Other,
            }
        }
        Ok(Value::Array(items)) => {
            let is_call = |v: &Value| v.get("method").and_then(Value::as_str) == Some("tools/call");
            if items.iter().any(is_call) {
                Carried::CallBatch(
                    items
                        .iter()
                        .filter(|i| i.get("method").is_some())
                        .filter_map(|i| i.get("id").cloned())
                        .collect(),
                )
            } else {
                Carried::Other
            }
        }
        _ => Carried::Other,
    }
}

#[allow(clippy::too_many_lines)]
pub(super) async fn exchange(
    inner: Arc<Inner>,
    method: Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
    on_endpoint: bool,
    reply: Reply,
) {
    let url = inner.upstream_url(&uri);
    if !on_endpoint {
        // Not the MCP endpoint (OAuth metadata, for example): passed through.
        let sent = inner
            .upstream_request(&method, url, &headers, request_body(&method, body))
            .send()
            .await;
        let watch = Watch {
            session: None,
            call: None,
            list: None,
            init: None,
        };
        let _ = relay(&inner, sent, watch, reply, false, None).await;
        return;
    }
    let session = session_of(&headers);
    let modern = is_modern(&headers);
    let what = carried(&method, &body);

    // Sessions: a new one comes with an `initialize`; a known id is used;
    // an unknown id (the gateway restarted, say) is adopted, within the bound.
    if let Some(sid) = &session {
        let mut st = lock(&inner.sessions);
        if !st.by_id.contains_key(sid) {
            if st.by_id.len() >= inner.config.limits.max_sessions {
                drop(st);
                inner.expire_sessions();
                st = lock(&inner.sessions);
            }
            if st.by_id.len() >= inner.config.limits.max_sessions {
                drop(st);
                let _ = reply.send(too_many_sessions(&inner));
                return;
            }
            st.by_id.insert(sid.clone(), Session::default());
        }
    } else if matches!(what, Carried::Initialize(_)) {
        inner.expire_sessions();
        if lock(&inner.sessions).by_id.len() >= inner.config.limits.max_sessions {
            let _ = reply.send(too_many_sessions(&inner));
            return;
        }
    }
    inner.touch(
        session.as_deref(),
        (method == Method::POST).then_some(&headers),
    );

    let is_initialize = matches!(what, Carried::Initialize(_));
    let is_initialized = matches!(what, Carried::Initialized);
    let mut watch = Watch {
        session: session.clone(),
        call: None,
        list: None,
        init: None,
    };
    match what {
        Carried::CallBatch(ids) => {
            let refusal = Refusal::new(
                "batch_not_supported",
                "JSON-RPC batches that contain tools/call are not supported",
            );
            let answers: Vec<Value> = ids.iter().map(|id| refusal.to_answer(id)).collect();
            let _ = reply.send(json_response(StatusCode::OK, &Value::Array(answers)));
            return;
        }
        Carried::Cancel(rid) => {
            let key = id_key(&rid);
            let slot = {
                let mut st = lock(&inner.sessions);
                st.get(session.as_deref()).and_then(|s| {
                    let matching: Vec<_> = s.calls.iter().filter(|c| c.key == key).collect();
                    // Without a session, ids repeat across clients: only an
                    // unambiguous match is taken.
                    (matching.len() == 1).then(|| Arc::clone(matching[0]))
                })
            };
            if let Some(slot) = slot {
                inner.finish_call(session.as_deref(), &slot, OutcomeStatus::Cancelled, None);
            }
        }
        Carried::List(id, paged) => watch.list = Some((id, paged)),
        Carried::Call(id) => {
            lock(&inner.report).calls += 1;
            let key = id_key(&id);
            if session.is_some() {
                let duplicate = lock(&inner.sessions)
                    .get(session.as_deref())
                    .is_some_and(|s| s.calls.iter().any(|c| c.key == key));
                if duplicate {
                    let r = Refusal::new(
                        "duplicate_request_id",
                        format!("request id {key} is already in flight in this session"),
                    );
                    let _ = reply.send(json_response(StatusCode::OK, &r.to_answer(&id)));
                    return;
                }
            }
            if let Some(r) = inner.admit_call(session.as_deref(), &headers, &body).await {
                let _ = reply.send(json_response(StatusCode::OK, &r.to_answer(&id)));
                return;
            }
            let call = match inner.core.decide(&id, &body).await {
                Ok(c) => c,
                Err(r) => {
                    let _ = reply.send(json_response(StatusCode::OK, &r.to_answer(&id)));
                    return;
                }
            };
            let slot = Arc::new(CallSlot {
                id: id.clone(),
                key,
                call,
                ended: AtomicBool::new(false),
                last_event_id: Mutex::new(None),
            });
            if let Some(s) = lock(&inner.sessions).get(session.as_deref()) {
                s.calls.push(Arc::clone(&slot));
            }
            if slot.call.strict {
                let mut reply = reply;
                let waited = tokio::select! {
                    r = inner.core.wait_receipt(&slot.call) => Some(r),
                    () = reply.closed() => None,
                };
                match waited {
                    Some(Ok(())) => {
                        return forward_call(
                            inner,
                            method,
                            url,
                            headers,
                            body,
                            watch_with(&watch, &slot),
                            reply,
                            modern,
                        )
                        .await;
                    }
                    Some(Err(r)) => {
                        inner.finish_call(session.as_deref(), &slot, OutcomeStatus::NotRun, None);
                        let _ = reply.send(json_response(StatusCode::OK, &r.to_answer(&id)));
                    }
                    None => {
                        inner.finish_call(session.as_deref(), &slot, OutcomeStatus::NotRun, None);
                    }
                }
                return;
            }
            let w = watch_with(&watch, &slot);
            return forward_call(inner, method, url, headers, body, w, reply, modern).await;
        }
        Carried::Initialize(id) => watch.init = Some(id),
        Carried::Initialized | Carried::Other => {}
    }

    let last_event_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // A resumption continues the stream of the call whose last event id it
    // names: if it fails, that call's answer is lost.
    let resumed = last_event_id.as_deref().and_then(|leid| {
        lock(&inner.sessions).get(session.as_deref()).and_then(|s| {
            s.calls
                .iter()
                .find(|c| lock(&c.last_event_id).as_deref() == Some(leid))
                .cloned()
        })
    });
    let sent = inner
        .upstream_request(&method, url, &headers, request_body(&method, body))
        .send()
        .await;
    if let (true, Some(sid)) = (method == Method::DELETE, &session) {
        match &sent {
            Ok(r) if r.status().is_success() => inner.end_session(sid, OutcomeStatus::ClientGone),
            // The upstream is gone: so is every answer still owed in the session.
            Err(e) if e.is_connect() => inner.end_session(sid, OutcomeStatus::ServerExited),
            _ => {}
        }
    }
    if let (Some(slot), Err(e)) = (&resumed, &sent) {
        let status = if e.is_connect() {
            OutcomeStatus::ServerExited
        } else {
            OutcomeStatus::HttpError
        };
        inner.finish_call(session.as_deref(), slot, status, None);
    }
    if let (Some(slot), Ok(r)) = (&resumed, &sent) {
        if !r.status().is_success() {
            inner.finish_call(session.as_deref(), slot, OutcomeStatus::HttpError, None);
        }
    }
    if let Ok(r) = &sent {
        if is_initialize {
            if let Some(sid) = session_of(r.headers()) {
                lock(&inner.sessions)
                    .by_id
                    .entry(sid.clone())
                    .or_default()
                    .last_used = Some(Instant::now());
                // The answer belongs to the session it opens: its
                // `serverInfo` is checked in that session.
                watch.session = Some(sid);
            }
        }
        if is_initialized && r.status().is_success() {
            // The session's first check, as soon as the server may be
            // asked (docs/protocol.md §5.7): the client's
            // `notifications/initialized` follows the `initialize` answer.
            inner.list_tools_own(session.clone(), CheckTrigger::Initialize, Some(&headers));
        }
        if r.status() == StatusCode::NOT_FOUND {
            if let Some(sid) = &session {
                // The upstream ended the session: what was still open in it is lost.
                inner.end_session(sid, OutcomeStatus::HttpError);
            }
        }
    }
    let streaming = method == Method::GET;
    if streaming {
        inner.open_stream(session.as_deref(), 1);
    }
    let _ = relay(&inner, sent, watch, reply, false, resumed).await;
    if streaming {
        inner.open_stream(session.as_deref(), -1);
    }
}

/// The body to send on: none for a bodiless GET, HEAD, DELETE or OPTIONS.
pub(super) fn request_body(method: &Method, body: Bytes) -> Option<Bytes> {
    let bodiless = matches!(
        *method,
        Method::GET | Method::HEAD | Method::DELETE | Method::OPTIONS
    );
    (!(bodiless && body.is_empty())).then_some(body)
}

pub(super) fn watch_with(watch: &Watch, slot: &Arc<CallSlot>) -> Watch {
    Watch {
        session: watch.session.clone(),
        call: Some(Arc::clone(slot)),
        list: None,
        init: None,
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn forward_call(
    inner: Arc<Inner>,
    method: Method,
    url: reqwest::Url,
    headers: HeaderMap,
    body: Bytes,
    watch: Watch,
    mut reply: Reply,
    modern: bool,
) {
    let Some(slot) = watch.call.clone() else {
        return;
    };
    let session = watch.session.clone();
    let send = inner
        .upstream_request(&method, url, &headers, Some(body))
        .send();
    tokio::pin!(send);
    let mut client_left = false;
    let sent = loop {
        tokio::select! {
            r = &mut send => break r,
            () = reply.closed(), if !client_left => {
                if modern {
                    // Closing the stream is the cancellation (2026-07-28):
                    // dropping the upstream request passes it on.
                    inner.finish_call(session.as_deref(), &slot, OutcomeStatus::Cancelled, None);
                    return;
                }
                client_left = true;
            }
        }
    };
    let sent = match sent {
        Ok(r) => Ok(r),
        Err(e) => {
            let status = if e.is_connect() {
                OutcomeStatus::HttpError
            } else {
                OutcomeStatus::ServerExited
            };
            inner.finish_call(session.as_deref(), &slot, status, None);
            Err(e)
        }
    };
    // An answer stream in progress keeps its session from expiring.
    inner.open_stream(session.as_deref(), 1);
    let ended = relay(&inner, sent, watch, reply, modern, None).await;
    inner.open_stream(session.as_deref(), -1);
    if slot.ended.load(Ordering::SeqCst) {
        return;
    }
    match ended {
        StreamEnd::Answered => {}
        StreamEnd::ClientLeft if modern => {
            inner.finish_call(session.as_deref(), &slot, OutcomeStatus::Cancelled, None);
        }
        StreamEnd::NotMcp => {
            inner.finish_call(session.as_deref(), &slot, OutcomeStatus::HttpError, None);
        }
        StreamEnd::ClientLeft | StreamEnd::Broken | StreamEnd::Closed => {
            if session.is_some() && lock(&slot.last_event_id).is_some() {
                // The upstream gave the stream event ids: the client can
                // resume it with GET and Last-Event-ID in its session, so
                // the call stays open there until an answer, a failed
                // resumption, the session's end or the gateway's stop.
                return;
            }
            let status = if client_left || ended == StreamEnd::ClientLeft {
                OutcomeStatus::ClientGone
            } else {
                OutcomeStatus::ServerExited
            };
            inner.finish_call(session.as_deref(), &slot, status, None);
        }
    }
}
