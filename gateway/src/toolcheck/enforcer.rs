//! The Enforcer, docs/protocol.md §5.7 and docs/operations.md "Approved
//! tool definitions": one session's check state (paused tools, a paused or
//! denied session, a stale check) and whether a call is admitted.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde_json::Value;
use tally_schemas::record::{CheckEffect, CheckFinding, CheckObservation, CheckTrigger, ToolCheck};
use tally_schemas::UnixMillis;

use crate::calls::Refusal;

use super::guard::ToolGuard;
use super::lockfile::ServerId;

/// Where a session stands after its checks.
#[derive(Debug, Default)]
struct SessionState {
    /// Source-wide findings that hold for the whole session (start and
    /// `initialize`); repeated in every check.
    standing: Vec<CheckFinding>,
    /// Paused tools (recorded names) and why.
    paused: BTreeMap<String, String>,
    /// The strongest source-wide effect so far.
    session: Option<(CheckEffect, String)>,
    /// A list is awaited: calls wait for it (`notifications/tools/list_changed`
    /// or the session's first list).
    stale: bool,
    /// Checks written.
    checks: u64,
}

/// The enforcement state of one session (a gateway's server, an SDK
/// adapter's client), shared by the transports.
#[derive(Debug)]
pub struct Enforcer {
    guard: ToolGuard,
    source: Option<String>,
    prefix: String,
    state: Mutex<SessionState>,
    fresh: tokio::sync::Notify,
}

/// What a session is told about a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Forward it.
    Forward,
    /// The check is stale: wait for the next list, then ask again.
    Wait,
    /// Refuse it.
    Refuse(Refusal),
}

fn why(f: &CheckFinding) -> String {
    let mut s = f.observation.as_str().to_owned();
    if !f.parts.is_empty() {
        s.push_str(&format!(" ({})", f.parts.join(", ")));
    }
    s
}

impl Enforcer {
    /// An enforcer of `guard` for `source`, tool names recorded as `prefix` + name.
    #[must_use]
    pub fn new(guard: ToolGuard, source: Option<String>, prefix: Option<String>) -> Self {
        Self {
            guard,
            source,
            prefix: prefix.unwrap_or_default(),
            state: Mutex::new(SessionState {
                stale: true,
                ..SessionState::default()
            }),
            fresh: tokio::sync::Notify::new(),
        }
    }

    /// A new session's enforcer under the same baseline and policy: it
    /// keeps this one's source-wide findings (those of the start check)
    /// and awaits its first list.
    #[must_use]
    pub fn fork(&self) -> Self {
        let st = self.lock();
        Self {
            guard: self.guard.clone(),
            source: self.source.clone(),
            prefix: self.prefix.clone(),
            state: Mutex::new(SessionState {
                standing: st.standing.clone(),
                session: st.session.clone(),
                stale: true,
                ..SessionState::default()
            }),
            fresh: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SessionState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The guard.
    #[must_use]
    pub fn guard(&self) -> &ToolGuard {
        &self.guard
    }

    fn apply_session(&self, st: &mut SessionState, findings: &[CheckFinding]) {
        for f in findings.iter().filter(|f| f.tool.is_none()) {
            if f.effect >= CheckEffect::PauseSession
                && st.session.as_ref().is_none_or(|(e, _)| f.effect > *e)
            {
                st.session = Some((f.effect, why(f)));
            }
        }
    }

    /// The check at start, before the server is used: `None` when nothing
    /// differs (no record is needed), else the body to record.
    #[must_use]
    pub fn start(&self, server: &ServerId, now: UnixMillis) -> Option<ToolCheck> {
        let findings = self.guard.start_findings(server, now);
        let mut st = self.lock();
        self.apply_session(&mut st, &findings);
        st.standing.extend(findings.iter().cloned());
        if findings.is_empty() {
            return None;
        }
        st.checks += 1;
        Some(
            self.guard
                .body(self.source.clone(), CheckTrigger::Start, None, findings),
        )
    }

    /// The server's `initialize` result; its findings hold for the
    /// session. Returns the check to record when they deny it (no list
    /// check follows then).
    pub fn initialized(&self, result: &Value, now: UnixMillis) -> Option<ToolCheck> {
        let findings = self.guard.initialize_findings(result, now);
        let mut st = self.lock();
        self.apply_session(&mut st, &findings);
        st.standing.extend(findings);
        if !matches!(st.session, Some((CheckEffect::Deny, _))) {
            return None;
        }
        st.checks += 1;
        let all = st.standing.clone();
        Some(
            self.guard
                .body(self.source.clone(), CheckTrigger::Initialize, None, all),
        )
    }

    /// The list may have changed (`notifications/tools/list_changed`):
    /// calls wait for the next one.
    pub fn list_changed(&self) {
        self.lock().stale = true;
    }

    /// A complete tool list, or `Err(observation)` when none could be read
    /// (`list_malformed`, `server_unavailable`, `list_truncated`). Updates
    /// the paused tools and returns the check to record.
    pub fn list(
        &self,
        trigger: CheckTrigger,
        tools: Result<&[Value], CheckObservation>,
        now: UnixMillis,
    ) -> ToolCheck {
        let (mut findings, offered) = match tools {
            Ok(t) => self.guard.list_findings(t, &self.prefix, now),
            Err(o) => (
                vec![self.guard.finding(o, None, Vec::new(), None, now)],
                None,
            ),
        };
        let mut body;
        {
            let mut st = self.lock();
            let mut all = st.standing.clone();
            all.append(&mut findings);
            self.apply_session(&mut st, &all);
            if offered.is_some() {
                st.paused = all
                    .iter()
                    .filter(|f| f.effect == CheckEffect::PauseTool)
                    .filter_map(|f| f.tool.clone().map(|t| (t, why(f))))
                    .collect();
            }
            st.stale = false;
            st.checks += 1;
            let listed = offered.is_some();
            body = self.guard.body(self.source.clone(), trigger, offered, all);
            if !listed {
                // No list was read: the tools paused before stay paused.
                body.paused = st.paused.keys().cloned().collect();
            }
        }
        self.fresh.notify_waiters();
        body
    }

    /// Waits until the check is no longer stale, at most `timeout`; false
    /// when it still is.
    pub async fn wait_fresh(&self, timeout: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.fresh.notified();
            if !self.lock().stale {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return !self.lock().stale;
            }
        }
    }

    /// Whether the session is denied (it stops).
    #[must_use]
    pub fn denied(&self) -> Option<String> {
        match &self.lock().session {
            Some((CheckEffect::Deny, why)) => Some(why.clone()),
            _ => None,
        }
    }

    /// What to do with a call to `tool` (the recorded name).
    #[must_use]
    pub fn admit(&self, tool: &str) -> Admission {
        let st = self.lock();
        match &st.session {
            Some((CheckEffect::Deny, why)) => {
                return Admission::Refuse(Refusal::new(
                    "session_denied",
                    format!("the tool check denied this session: {why} (the approved baseline does not hold; approve again with tally tools approve)"),
                ))
            }
            Some((_, why)) => {
                return Admission::Refuse(Refusal::new(
                    "session_paused",
                    format!("the tool check paused this session: {why}"),
                ))
            }
            None => {}
        }
        if st.stale {
            return Admission::Wait;
        }
        match st.paused.get(tool) {
            Some(why) => Admission::Refuse(Refusal::new(
                "tool_paused",
                format!("the tool check paused {tool}: {why}; its definition is not the approved one (approve it with tally tools approve)"),
            )),
            None => Admission::Forward,
        }
    }

    /// Filters the tools of one `tools/list` answer page the client is
    /// about to see: paused tools (and every tool of a paused session) are
    /// left out. Returns whether anything was left out.
    pub fn filter_page(&self, msg: &mut Value, now: UnixMillis) -> bool {
        let session_stopped = self.lock().session.is_some();
        let Some(tools) = msg
            .get_mut("result")
            .and_then(|r| r.get_mut("tools"))
            .and_then(Value::as_array_mut)
        else {
            return false;
        };
        let before = tools.len();
        tools.retain(|def| {
            !session_stopped && self.guard.tool_effect(def, now) < CheckEffect::PauseTool
        });
        tools.len() != before
    }

    /// Checks written so far.
    #[must_use]
    pub fn checks(&self) -> u64 {
        self.lock().checks
    }
}
