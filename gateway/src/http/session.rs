//! Sessions and their bookkeeping for the HTTP gateway (docs/operations.md
//! "The gateway over HTTP"): the calls kept per `Mcp-Session-Id`, how a
//! call ends and is forgotten, open streams, `DELETE` and idle expiry.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::Value;
use tally_schemas::record::OutcomeStatus;

use crate::calls::ERROR_NOT_FORWARDED;

use super::state::{lock, CallSlot, Inner};
use super::wire::{copy_headers, gateway_error};

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
