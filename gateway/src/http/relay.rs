//! The answer relay of the HTTP gateway (docs/operations.md "The gateway
//! over HTTP"): passing the upstream's JSON or SSE answer to the client
//! unchanged while observing the answers that end calls (docs/protocol.md §5.2).

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse as _, Response};
use bytes::Bytes;
use serde_json::Value;
use tally_schemas::record::CheckTrigger;
use tokio::sync::mpsc;

use crate::calls::{PageResult, ToolPages, ERROR_UPSTREAM};
use crate::sse::SseReader;

use super::state::{lock, CallSlot, Inner, Reply, Watch};
use super::wire::{content_type_is, copy_headers, error_chain, gateway_error, id_key};

impl Inner {
    /// Observes one JSON-RPC message from the upstream.
    pub(super) fn observe(self: &Arc<Self>, watch: &Watch, msg: &Value) {
        let method = msg.get("method").and_then(Value::as_str);
        match (method, msg.get("id")) {
            (None, Some(id)) => self.answer(watch, id, msg),
            (Some("notifications/tools/list_changed"), None) => {
                if let Some(c) = self.check_of(watch.session.as_deref()) {
                    c.list_changed();
                }
                self.list_tools_own(watch.session.clone(), CheckTrigger::ListChanged, None);
            }
            _ => {}
        }
    }

    pub(super) fn answer(self: &Arc<Self>, watch: &Watch, id: &Value, msg: &Value) {
        if watch.init.as_ref() == Some(id) {
            // The upstream's `serverInfo` against the approved one.
            if let (Some(c), Some(result)) =
                (self.check_of(watch.session.as_deref()), msg.get("result"))
            {
                let now = tally_schemas::time::Clock::now(&tally_schemas::time::SystemClock);
                if let Some(body) = c.initialized(result, now) {
                    self.core.record_check(body);
                }
            }
            return;
        }
        if let Some(slot) = &watch.call {
            if &slot.id == id {
                let (status, _) = crate::calls::answer_status(msg);
                self.finish_call(watch.session.as_deref(), slot, status, Some(msg));
                return;
            }
        }
        if let Some((list_id, paged)) = &watch.list {
            if list_id == id {
                let page = match lock(&self.sessions).get(watch.session.as_deref()) {
                    Some(s) => s.pages.add(*paged, msg),
                    None => ToolPages::default().add(*paged, msg),
                };
                if let PageResult::Complete(all) = page {
                    self.core.record_tools(&all);
                    if let Some(c) = self.check_of(watch.session.as_deref()) {
                        let now =
                            tally_schemas::time::Clock::now(&tally_schemas::time::SystemClock);
                        self.core
                            .record_check(c.list(CheckTrigger::ToolsList, Ok(&all), now));
                    }
                }
                return;
            }
        }
        // An answer on another stream of the session: a resumed stream
        // (GET with Last-Event-ID) carrying the answer to a call whose own
        // stream broke. Without a session, ids are not unique: nothing to match.
        let Some(session) = watch.session.as_deref() else {
            return;
        };
        let key = id_key(id);
        let slot = lock(&self.sessions)
            .get(Some(session))
            .and_then(|s| s.calls.iter().find(|c| c.key == key).cloned());
        if let Some(slot) = slot {
            let (status, _) = crate::calls::answer_status(msg);
            self.finish_call(Some(session), &slot, status, Some(msg));
        }
    }

    pub(super) fn observe_json_body(self: &Arc<Self>, watch: &Watch, body: &[u8]) -> bool {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Array(items)) => {
                for item in &items {
                    self.observe(watch, item);
                }
                true
            }
            Ok(v @ Value::Object(_)) => {
                self.observe(watch, &v);
                true
            }
            _ => false,
        }
    }
}

/// How a relayed answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StreamEnd {
    /// A JSON body (observed) or a stream that ended cleanly after its answer.
    Answered,
    /// The answer is not JSON-RPC: an HTTP error or another content type.
    NotMcp,
    /// The client stopped reading.
    ClientLeft,
    /// The upstream's stream broke (connection reset, oversized event).
    Broken,
    /// The upstream closed the stream cleanly.
    Closed,
}

/// Sends the upstream's answer to the client unchanged while observing it.
/// `keep_reading_after_client`: read the upstream to its end after the
/// client left (a call in the 2025-era, whose answer is still recorded).
pub(super) async fn relay(
    inner: &Arc<Inner>,
    sent: Result<reqwest::Response, reqwest::Error>,
    watch: Watch,
    reply: Reply,
    modern: bool,
    resumed: Option<Arc<CallSlot>>,
) -> StreamEnd {
    let mut resp = match sent {
        Ok(r) => r,
        Err(e) => {
            let id = watch.call.as_ref().map(|c| c.id.clone());
            let detail = error_chain(&e);
            eprintln!("tally: gateway: upstream {}: {detail}", inner.upstream);
            let _ = reply.send(gateway_error(
                StatusCode::BAD_GATEWAY,
                id.as_ref(),
                ERROR_UPSTREAM,
                "upstream_unreachable",
                &format!("tally gateway: the upstream MCP server could not be reached or broke the connection: {detail}"),
            ));
            return StreamEnd::Broken;
        }
    };
    let status = resp.status();
    let sse = content_type_is(resp.headers(), "text/event-stream");
    let json = content_type_is(resp.headers(), "application/json");
    let mut builder = Response::builder().status(status);
    if let Some(h) = builder.headers_mut() {
        *h = copy_headers(resp.headers());
    }
    let max = inner.config.limits.max_answer_bytes;

    if !sse {
        // A JSON answer (or anything else): read whole, bounded, observed,
        // then passed on.
        let mut body = Vec::new();
        let mut broken = false;
        loop {
            match resp.chunk().await {
                Ok(Some(c)) => {
                    body.extend_from_slice(&c);
                    if body.len() > max {
                        let id = watch.call.as_ref().map(|c| c.id.clone());
                        let _ = reply.send(gateway_error(
                            StatusCode::BAD_GATEWAY,
                            id.as_ref(),
                            ERROR_UPSTREAM,
                            "answer_too_large",
                            &format!("tally gateway: the upstream's answer is larger than {max} bytes (--max-answer-bytes)"),
                        ));
                        return StreamEnd::NotMcp;
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    broken = true;
                    break;
                }
            }
        }
        if broken {
            let id = watch.call.as_ref().map(|c| c.id.clone());
            let _ = reply.send(gateway_error(
                StatusCode::BAD_GATEWAY,
                id.as_ref(),
                ERROR_UPSTREAM,
                "upstream_broken",
                "tally gateway: the upstream broke the connection while sending its answer",
            ));
            return StreamEnd::Broken;
        }
        let observed = json && inner.observe_json_body(&watch, &body);
        // Parsed again only for a tools/list answer under a tool check.
        let listed = (watch.list.is_some() || watch.init.is_some())
            && inner.core.config().tool_check.is_some();
        if let Some(shown) = listed
            .then(|| serde_json::from_slice::<Value>(&body).ok())
            .flatten()
            .and_then(|v| inner.shown_list(&watch, &v))
        {
            body = serde_json::to_vec(&shown).unwrap_or_default();
            if let Some(h) = builder.headers_mut() {
                h.remove(header::CONTENT_LENGTH);
            }
        }
        let _ = reply.send(
            builder
                .body(Body::from(body))
                .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response()),
        );
        let answered = watch
            .call
            .as_ref()
            .is_none_or(|c| c.ended.load(Ordering::SeqCst));
        return if observed && answered {
            StreamEnd::Answered
        } else {
            StreamEnd::NotMcp
        };
    }

    // An SSE stream: each chunk goes on as it arrives.
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let sent = reply.send(
        builder
            .body(Body::from_stream(stream))
            .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response()),
    );
    if sent.is_err() && (modern || watch.call.is_none()) {
        return StreamEnd::ClientLeft;
    }
    let mut reader = SseReader::new(max);
    let mut client_open = !tx.is_closed();
    // Up to 2025-11-25 a client's disconnect is not a cancellation: the
    // upstream's answer to an open call is still read, to be recorded.
    let keep_reading = || {
        !modern
            && watch
                .call
                .as_ref()
                .is_some_and(|c| !c.ended.load(Ordering::SeqCst))
    };
    let slot = watch.call.clone().or(resumed);
    loop {
        let chunk = if client_open {
            tokio::select! {
                c = resp.chunk() => c,
                () = tx.closed() => {
                    client_open = false;
                    if !keep_reading() {
                        return StreamEnd::ClientLeft;
                    }
                    continue;
                }
            }
        } else {
            resp.chunk().await
        };
        let chunk = match chunk {
            Ok(Some(c)) => c,
            Ok(None) => {
                return if client_open {
                    StreamEnd::Closed
                } else {
                    StreamEnd::ClientLeft
                }
            }
            Err(_) => {
                return if client_open {
                    StreamEnd::Broken
                } else {
                    StreamEnd::ClientLeft
                }
            }
        };
        let Ok(events) = reader.feed(&chunk) else {
            eprintln!("tally: gateway: an event from the upstream is larger than {max} bytes (--max-answer-bytes); the stream is cut");
            return StreamEnd::Broken;
        };
        // Observed (outcomes and tool lists queued to the chain writer)
        // before the client sees the chunk, so a record of an answer always
        // precedes the records of what the client does next.
        // A tools/list answer leaving out paused tools is sent as events
        // written again (id and data), instead of the chunk.
        let mut rewritten: Option<Vec<u8>> = None;
        for ev in events {
            if let (Some(s), true) = (&slot, ev.has_id) {
                ev.id.clone_into(&mut lock(&s.last_event_id));
            }
            if ev.data.is_empty() {
                continue;
            }
            if let Ok(msg) = serde_json::from_str::<Value>(&ev.data) {
                inner.observe(&watch, &msg);
                if let Some(shown) = inner.shown_list(&watch, &msg) {
                    let out = rewritten.get_or_insert_with(Vec::new);
                    if let Some(id) = ev.id.as_deref().filter(|_| ev.has_id) {
                        out.extend_from_slice(format!("id: {id}\n").as_bytes());
                    }
                    out.extend_from_slice(b"event: message\ndata: ");
                    out.extend(serde_json::to_vec(&shown).unwrap_or_default());
                    out.extend_from_slice(b"\n\n");
                }
            }
        }
        let chunk = rewritten.map_or(chunk, Bytes::from);
        if client_open && tx.send(Ok(chunk)).await.is_err() {
            client_open = false;
        }
        if client_open
            && watch
                .call
                .as_ref()
                .is_some_and(|c| c.ended.load(Ordering::SeqCst))
        {
            // The call's answer is relayed: the client's stream ends here, as
            // a server's should after its response (operations.md "The
            // gateway over HTTP"), instead of waiting for the upstream's end.
            drop(tx);
            drain(inner, &watch, &mut resp, &mut reader).await;
            return StreamEnd::Answered;
        }
        if !client_open && !keep_reading() {
            return StreamEnd::ClientLeft;
        }
    }
}

/// How long the rest of a call's upstream stream is read after its answer
/// went to the client, so that the connection is reused.
const DRAIN_AFTER_ANSWER: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads the upstream's stream to its end (at most [`DRAIN_AFTER_ANSWER`])
/// after the client's stream ended, observing what it still carries.
async fn drain(
    inner: &Arc<Inner>,
    watch: &Watch,
    resp: &mut reqwest::Response,
    reader: &mut SseReader,
) {
    let rest = async {
        while let Ok(Some(chunk)) = resp.chunk().await {
            let Ok(events) = reader.feed(&chunk) else {
                return;
            };
            for ev in events {
                if let Ok(msg) = serde_json::from_str::<Value>(&ev.data) {
                    inner.observe(watch, &msg);
                }
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_AFTER_ANSWER, rest).await;
}
