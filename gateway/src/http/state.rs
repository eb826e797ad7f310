//! What the HTTP gateway holds while it runs: the shared state behind every
//! exchange ([`Inner`]), the sessions and the calls kept in them, and what
//! an exchange watches for in the messages it carries.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::Value;
use tokio::sync::{oneshot, Semaphore};

use crate::calls::{CallRecorder, OpenCall, ToolPages};

use super::config::{HttpConfig, HttpReport};

/// What every exchange of one gateway shares.
pub(super) struct Inner {
    pub(super) core: CallRecorder,
    pub(super) client: reqwest::Client,
    pub(super) upstream: reqwest::Url,
    pub(super) config: HttpConfig,
    pub(super) sessions: Mutex<Sessions>,
    pub(super) in_flight: Arc<Semaphore>,
    pub(super) own_list_counter: AtomicU64,
    pub(super) report: Mutex<HttpReport>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks is a single insert, remove or
    // assignment, so the data is consistent even after a panic elsewhere.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The Streamable HTTP gateway; clone it freely.
#[derive(Clone)]
pub struct HttpGateway {
    pub(super) inner: Arc<Inner>,
}

/// What one upstream exchange observes in the messages it carries.
#[derive(Clone)]
pub(super) struct Watch {
    pub(super) session: Option<String>,
    /// The call this exchange carries.
    pub(super) call: Option<Arc<CallSlot>>,
    /// The `tools/list` request this exchange carries: its id and whether paged.
    pub(super) list: Option<(Value, bool)>,
    /// The `initialize` request this exchange carries: its id (its answer's
    /// `serverInfo` is checked, docs/protocol.md §5.7).
    pub(super) init: Option<Value>,
}

/// What the exchange task hands the handler: the response to send.
pub(super) type Reply = oneshot::Sender<Response>;

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
