//! Sessions and their bookkeeping for the HTTP gateway (docs/operations.md
//! "The gateway over HTTP"): the calls kept per `Mcp-Session-Id`, how a
//! call ends and is forgotten, open streams, `DELETE` and idle expiry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::Value;
use tally_schemas::record::OutcomeStatus;

use crate::calls::{OpenCall, ToolPages, ERROR_NOT_FORWARDED};

use super::{copy_headers, gateway_error, lock, Inner};

/// One `tools/call` from its decision to its outcome.
#[derive(Debug)]
pub(super) struct CallSlot {
    pub(super) id: Value,
    pub(super) key: String,
    pub(super) call: OpenCall,
    pub(super) ended: AtomicBool,
    /// The last SSE event id seen on the call's answer stream: a resumption
    /// (`GET` with this `Last-Event-ID`) continues that stream.
    pub(super) last_event_id: Mutex<Option<String>>,
}

#[derive(Debug, Default)]
pub(super) struct Session {
    pub(super) last_used: Option<Instant>,
    /// Streams open in this session (they keep it from expiring).
    pub(super) open: usize,
    pub(super) calls: Vec<Arc<CallSlot>>,
    pub(super) pages: ToolPages,
    /// The headers of the client's last request, kept in memory only to
    /// list the tools again after `notifications/tools/list_changed`.
    pub(super) headers: Option<HeaderMap>,
    pub(super) own_list_running: bool,
    /// The session's tool check (docs/protocol.md §5.7), made at its first use.
    pub(super) check: Option<Arc<crate::toolcheck::Enforcer>>,
}

#[derive(Debug, Default)]
pub(super) struct Sessions {
    pub(super) by_id: HashMap<String, Session>,
    /// Requests without a session id: calls belong to their exchange, and
    /// ids may repeat across clients.
    pub(super) none: Session,
}

impl Sessions {
    pub(super) fn get(&mut self, key: Option<&str>) -> Option<&mut Session> {
        match key {
            None => Some(&mut self.none),
            Some(k) => self.by_id.get_mut(k),
        }
    }
}

impl Inner {
    pub(super) fn end_call(
        &self,
        slot: &CallSlot,
        status: OutcomeStatus,
        answer: Option<&Value>,
    ) -> bool {
        if slot.ended.swap(true, Ordering::SeqCst) {
            return false;
        }
        match answer {
            Some(msg) => self.core.end_with_answer(&slot.call, msg),
            None => self.core.end(&slot.call, status, None),
        }
        {
            let mut r = lock(&self.report);
            match status {
                OutcomeStatus::ServerExited => r.server_exited_calls += 1,
                OutcomeStatus::HttpError => r.http_error_calls += 1,
                OutcomeStatus::ClientGone => r.client_gone_calls += 1,
                OutcomeStatus::Cancelled => r.cancelled_calls += 1,
                _ => {}
            }
        }
        true
    }

    pub(super) fn forget_call(&self, session: Option<&str>, slot: &Arc<CallSlot>) {
        if let Some(s) = lock(&self.sessions).get(session) {
            s.calls.retain(|c| !Arc::ptr_eq(c, slot));
        }
    }

    pub(super) fn finish_call(
        &self,
        session: Option<&str>,
        slot: &Arc<CallSlot>,
        status: OutcomeStatus,
        answer: Option<&Value>,
    ) {
        self.end_call(slot, status, answer);
        self.forget_call(session, slot);
    }

    pub(super) fn touch(&self, session: Option<&str>, headers: Option<&HeaderMap>) {
        let mut st = lock(&self.sessions);
        if let Some(s) = st.get(session) {
            s.last_used = Some(Instant::now());
            // Only a real session's own headers are kept: without a session
            // id, requests of different clients would lend each other
            // their credentials.
            if let (Some(h), Some(_)) = (headers, session) {
                s.headers = Some(copy_headers(h));
            }
        }
    }

    pub(super) fn open_stream(&self, session: Option<&str>, delta: isize) {
        if let Some(s) = lock(&self.sessions).get(session) {
            s.open = s.open.saturating_add_signed(delta);
            s.last_used = Some(Instant::now());
        }
    }

    /// Ends the calls of `session` still open (and forgets the session):
    /// the client ended it, it expired, or the upstream ended it.
    pub(super) fn end_session(&self, session: &str, status: OutcomeStatus) {
        let removed = lock(&self.sessions).by_id.remove(session);
        if let Some(s) = removed {
            for slot in s.calls {
                self.end_call(&slot, status, None);
            }
        }
    }

    pub(super) fn expire_sessions(&self) {
        let idle = self.config.limits.session_idle;
        let expired: Vec<String> = lock(&self.sessions)
            .by_id
            .iter()
            .filter(|(_, s)| s.open == 0 && s.last_used.is_some_and(|t| t.elapsed() >= idle))
            .map(|(k, _)| k.clone())
            .collect();
        for k in expired {
            self.end_session(&k, OutcomeStatus::ClientGone);
        }
    }
}

pub(super) fn too_many_sessions(inner: &Inner) -> Response {
    gateway_error(
        StatusCode::SERVICE_UNAVAILABLE,
        None,
        ERROR_NOT_FORWARDED,
        "too_many_sessions",
        &format!(
            "tally gateway: {} sessions are open (--max-sessions); end one (DELETE) or wait for one to expire",
            inner.config.limits.max_sessions
        ),
    )
}
