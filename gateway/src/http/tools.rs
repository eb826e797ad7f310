//! Tool-check hooks for the HTTP gateway (docs/protocol.md §5.7): the
//! session's tool check, admitting a `tools/call`, the tool list shown to the
//! client, and the gateway's own `tools/list` requests.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderValue, Method};
use bytes::Bytes;
use serde_json::{json, Value};
use tally_schemas::record::{CheckObservation, CheckTrigger};

use crate::calls::{PageResult, Refusal, ToolPages};
use crate::sse::SseReader;
use crate::toolcheck::Admission;

use super::state::{lock, Inner, Watch};
use super::wire::{content_type_is, copy_headers, is_modern};

/// Request ids the gateway uses for its own `tools/list` requests.
pub(super) const OWN_ID_PREFIX: &str = "tally-gateway:tools/list:";
impl Inner {
    /// After `notifications/initialized` (`trigger` `initialize`, with that
    /// request's `headers`) and after `notifications/tools/list_changed`
    /// (with the session's last request headers), lists the tools and
    /// records the list (up to 2025-11-25; later versions deliver the change
    /// on the client's own subscription, and the client lists again itself).
    pub(super) fn list_tools_own(
        self: &Arc<Self>,
        session: Option<String>,
        trigger: CheckTrigger,
        headers: Option<&HeaderMap>,
    ) {
        if trigger == CheckTrigger::Initialize && self.core.config().tool_check.is_none() {
            return;
        }
        let headers = {
            let mut st = lock(&self.sessions);
            let Some(s) = st.get(session.as_deref()) else {
                return;
            };
            let Some(h) = headers.map(copy_headers).or_else(|| s.headers.clone()) else {
                return;
            };
            if s.own_list_running || is_modern(&h) {
                return;
            }
            s.own_list_running = true;
            h
        };
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let all = this.own_list(&headers).await;
            if let Some(s) = lock(&this.sessions).get(session.as_deref()) {
                s.own_list_running = false;
            }
            if let Some(c) = this.check_of(session.as_deref()) {
                let now = tally_schemas::time::Clock::now(&tally_schemas::time::SystemClock);
                let tools = all.as_deref().map_err(|(o, _)| *o);
                // The session's first check is its `initialize` one, also when
                // a list_changed came in before the upstream acknowledged the
                // client's `notifications/initialized` (this list then stood
                // in for that one), as for a call (`admit_call`).
                let trigger = if c.checks() == 0 {
                    CheckTrigger::Initialize
                } else {
                    trigger
                };
                this.core.record_check(c.list(trigger, tools, now));
            }
            match all {
                Ok(tools) => this.core.record_tools(&tools),
                Err((_, e)) => eprintln!("tally: gateway: could not list the tools: {e}"),
            }
        });
    }

    /// The tool check of `session`, made from the gateway's on first use.
    pub(super) fn check_of(
        &self,
        session: Option<&str>,
    ) -> Option<Arc<crate::toolcheck::Enforcer>> {
        let root = self.core.config().tool_check.as_ref()?;
        let mut st = lock(&self.sessions);
        let s = st.get(session)?;
        Some(Arc::clone(
            s.check.get_or_insert_with(|| Arc::new(root.fork())),
        ))
    }

    /// The tool check's answer for a `tools/call` (docs/protocol.md §5.7):
    /// `None` to go on. While the session's check is stale the gateway lists
    /// the tools itself with the request's headers and checks them first.
    pub(super) async fn admit_call(
        &self,
        session: Option<&str>,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Option<Refusal> {
        let check = self.check_of(session)?;
        let tool = serde_json::from_slice::<Value>(body)
            .ok()?
            .pointer("/params/name")?
            .as_str()?
            .to_owned();
        let tool = self.core.config().recorded_name(&tool);
        for _ in 0..3 {
            match check.admit(&tool) {
                Admission::Forward => return None,
                Admission::Refuse(r) => return Some(r),
                Admission::Wait => {
                    let listing = lock(&self.sessions)
                        .get(session)
                        .is_some_and(|s| s.own_list_running);
                    if listing && check.wait_fresh(Duration::from_secs(10)).await {
                        // The list the gateway is reading (the session's
                        // first, or after list_changed) decides.
                        continue;
                    }
                    let trigger = if check.checks() == 0 {
                        CheckTrigger::Initialize
                    } else {
                        CheckTrigger::Call
                    };
                    let all = self.own_list(headers).await;
                    let tools = all.as_deref().map_err(|(o, _)| *o);
                    let now = tally_schemas::time::Clock::now(&tally_schemas::time::SystemClock);
                    self.core.record_check(check.list(trigger, tools, now));
                }
            }
        }
        None
    }

    /// A `tools/list` answer as the client sees it: without the session's
    /// paused tools; `None` when nothing is left out. An `initialize`
    /// answer in a session the check denied is that refusal instead (the
    /// session stops, as over stdio).
    pub(super) fn shown_list(&self, watch: &Watch, msg: &Value) -> Option<Value> {
        if let Some(id) = watch.init.as_ref().filter(|i| msg.get("id") == Some(*i)) {
            let why = self.check_of(watch.session.as_deref())?.denied()?;
            let r = Refusal::new(
                "session_denied",
                format!("the tool check denied this session: {why}"),
            );
            return Some(r.to_answer(id));
        }
        watch.list.as_ref()?;
        let check = self.check_of(watch.session.as_deref())?;
        let mut shown = msg.clone();
        let now = tally_schemas::time::Clock::now(&tally_schemas::time::SystemClock);
        check.filter_page(&mut shown, now).then_some(shown)
    }

    /// Lists the tools itself, following every `nextCursor`. On failure,
    /// the observation for the check: `list_truncated` when a page after
    /// the first could not be read or the list has more than
    /// `MAX_LIST_PAGES` pages, else `server_unavailable`.
    pub(super) async fn own_list(
        &self,
        headers: &HeaderMap,
    ) -> Result<Vec<Value>, (CheckObservation, String)> {
        let mut cursor: Option<Value> = None;
        let fail = |cursor: &Option<Value>, e: String| {
            if cursor.is_some() {
                (CheckObservation::ListTruncated, e)
            } else {
                (CheckObservation::ServerUnavailable, e)
            }
        };
        let mut pages = ToolPages::default();
        for _ in 0..crate::calls::MAX_LIST_PAGES {
            let n = self.own_list_counter.fetch_add(1, Ordering::Relaxed) + 1;
            let id = Value::String(format!("{OWN_ID_PREFIX}{n}"));
            let mut req = json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"});
            if let Some(c) = &cursor {
                req["params"] = json!({"cursor": c});
            }
            let mut h = headers.clone();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            h.insert(
                header::ACCEPT,
                HeaderValue::from_static("application/json, text/event-stream"),
            );
            let resp = self
                .upstream_request(
                    &Method::POST,
                    self.upstream.clone(),
                    &h,
                    Some(Bytes::from(serde_json::to_vec(&req).unwrap_or_default())),
                )
                .send()
                .await
                .map_err(|e| fail(&cursor, e.to_string()))?;
            let answer = read_answer(resp, &id, self.config.limits.max_answer_bytes)
                .await
                .map_err(|e| fail(&cursor, e))?;
            match pages.add(cursor.is_some(), &answer) {
                PageResult::Complete(all) => return Ok(all),
                PageResult::More(next) => cursor = Some(next),
                PageResult::NoList => {
                    return Err(fail(&cursor, format!("the upstream answered {answer}")))
                }
            }
        }
        Err((
            CheckObservation::ListTruncated,
            format!("more than {} pages of tools", crate::calls::MAX_LIST_PAGES),
        ))
    }
}

/// The JSON-RPC answer with `id` from a JSON body or an SSE stream.
pub(super) async fn read_answer(
    mut resp: reqwest::Response,
    id: &Value,
    max: usize,
) -> Result<Value, String> {
    let status = resp.status();
    let sse = content_type_is(resp.headers(), "text/event-stream");
    let mut reader = SseReader::new(max);
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
        if sse {
            for ev in reader.feed(&chunk).map_err(|e| e.to_string())? {
                if let Ok(v) = serde_json::from_str::<Value>(&ev.data) {
                    if v.get("id") == Some(id) && v.get("method").is_none() {
                        return Ok(v);
                    }
                }
            }
        } else {
            body.extend_from_slice(&chunk);
            if body.len() > max {
                return Err(format!("answer larger than {max} bytes"));
            }
        }
    }
    if sse {
        return Err(format!("HTTP {status}: the stream ended without an answer"));
    }
    serde_json::from_slice(&body).map_err(|_| format!("HTTP {status}: not a JSON-RPC answer"))
}
