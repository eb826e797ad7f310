//! What every console handler shares: the error page ([`PageError`]),
//! who is asking (an operator's session or an auditor's link, and the
//! scope it may see), and the path parsers. `handlers` and each of its
//! route files take it whole (`use super::common::*`), imports included.

pub(super) use std::collections::HashSet;
pub(super) use std::sync::Arc;

pub(super) use axum::extract::rejection::{PathRejection, QueryRejection};
pub(super) use axum::extract::{Path, Query, Request, State};
pub(super) use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
pub(super) use axum::response::{IntoResponse, Redirect, Response};
pub(super) use maud::Markup;
pub(super) use serde::Deserialize;
pub(super) use tally_schemas::limits::MAX_AGENTS_PER_PACK;
pub(super) use tally_schemas::{AgentName, LeafIndex, UnixMillis};

pub(super) use crate::auth::{self, Operator};
pub(super) use crate::data::{self, TimeRange};
pub(super) use crate::pages::{self, AuditorScope, CallFilter, View};
pub(super) use crate::session_store::SessionStoreError;
pub(super) use crate::store::{AuditorLink, LinkStoreError, NewLink};
pub(super) use crate::Console;
pub(super) use tally_witness::error::{blocking, WitnessError};
pub(super) use tally_witness::export::{self, ExportRange};
pub(super) use tally_witness::http::PACK_CONTENT_TYPE;

pub(super) type S = State<Arc<Console>>;

/// A page that could not be shown: status and a message safe to show.
#[derive(Debug)]
pub(crate) struct PageError {
    pub(super) status: StatusCode,
    pub(super) message: String,
    pub(super) view: Option<Box<View>>,
    /// `Retry-After`, in seconds.
    pub(super) retry_after: Option<u32>,
}

impl PageError {
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            view: None,
            retry_after: None,
        }
    }

    /// The session store (the database) cannot be reached: a 503 that says
    /// so; the detail goes to the log.
    pub(super) fn sessions_unavailable(e: &SessionStoreError) -> Self {
        tracing::error!(error = %e, "console sessions unavailable");
        Self {
            retry_after: Some(5),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "The console cannot reach its database, so it cannot check sessions \
                 right now. Try again in a few seconds; the witness's log has the detail.",
            )
        }
    }

    pub(super) fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub(super) fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "There is no such page.")
    }

    pub(super) fn with_view(mut self, view: &View) -> Self {
        self.view = Some(Box::new(view.clone()));
        self
    }
}

impl From<WitnessError> for PageError {
    fn from(e: WitnessError) -> Self {
        let (status, _) = e.status_and_code();
        let message = if status.is_server_error() {
            "The witness could not show this page; the detail is in its log.".to_owned()
        } else {
            e.to_string()
        };
        Self::new(status, message)
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let mut r = page(
            self.status,
            &pages::error(self.view.as_deref(), self.status.as_u16(), &self.message),
        );
        if let Some(secs) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        r
    }
}

pub(super) fn page(status: StatusCode, markup: &Markup) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        )],
        markup.0.clone(),
    )
        .into_response()
}

pub(super) fn ok(markup: &Markup) -> Response {
    page(StatusCode::OK, markup)
}

// ---- who is asking ---------------------------------------------------------

/// Why an operator route did not run: no session (go log in), or a page.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// No live session: redirect to the login page.
    Login,
    /// A refusal page.
    Page(PageError),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Self::Login => Redirect::to("/console/login").into_response(),
            Self::Page(p) => p.into_response(),
        }
    }
}

/// Runs `f` on the console's sessions: on a blocking thread when they are
/// in the database (the call waits on it), else right here.
///
/// # Errors
/// A 503 page when the session store cannot be reached.
pub(super) async fn on_sessions<T: Send + 'static>(
    c: &Arc<Console>,
    f: impl FnOnce(&Console) -> Result<T, SessionStoreError> + Send + 'static,
) -> Result<T, PageError> {
    let result = if c.sessions.is_shared() {
        let c = Arc::clone(c);
        tokio::task::spawn_blocking(move || f(&c))
            .await
            .map_err(|e| PageError::from(WitnessError::internal(&e)))?
    } else {
        f(c.as_ref())
    };
    result.map_err(|e| PageError::sessions_unavailable(&e))
}

/// The logged-in operator and their view, or a redirect to the login page.
pub(super) async fn operator(
    c: &Arc<Console>,
    headers: &HeaderMap,
) -> Result<(Operator, View), Refusal> {
    let Some(token) = auth::session_token(headers).map(str::to_owned) else {
        return Err(Refusal::Login);
    };
    let found = on_sessions(c, move |c| c.sessions.operator(&c.witness, &token))
        .await
        .map_err(Refusal::Page)?;
    match found {
        Some(op) => {
            let view = View {
                project: op.project.clone(),
                base: "/console".into(),
                csrf: Some(op.csrf.clone()),
                auditor: None,
            };
            Ok((op, view))
        }
        None => Err(Refusal::Login),
    }
}

/// The project's agents.
pub(super) fn project_agents(c: &Console, project: &str) -> Vec<AgentName> {
    c.witness
        .registry()
        .agents_of(project)
        .into_iter()
        .map(|(a, _)| a)
        .collect()
}

/// What a request may see: the agents, the time range, the view.
pub(super) struct Scope {
    pub(super) view: View,
    pub(super) agents: Vec<AgentName>,
    pub(super) range: TimeRange,
}

impl Scope {
    pub(super) fn allows(&self, agent: &AgentName) -> bool {
        self.agents.contains(agent)
    }

    /// The agent a path names, when this scope may see it (else not found,
    /// as for an agent that does not exist).
    pub(super) fn agent(
        &self,
        p: Result<Path<String>, PathRejection>,
    ) -> Result<AgentName, PageError> {
        let agent = path_agent(p)?;
        if !self.allows(&agent) {
            return Err(PageError::not_found());
        }
        Ok(agent)
    }
}

pub(super) async fn operator_scope(
    c: &Arc<Console>,
    headers: &HeaderMap,
) -> Result<(Operator, Scope), Refusal> {
    let (op, view) = operator(c, headers).await?;
    let agents = project_agents(c, &op.project);
    Ok((
        op,
        Scope {
            view,
            agents,
            range: TimeRange::default(),
        },
    ))
}

pub(super) fn auditor_scope(
    c: &Console,
    token: &Result<Path<String>, PathRejection>,
) -> Result<(AuditorLink, Scope), PageError> {
    let refused = || {
        PageError::new(
            StatusCode::NOT_FOUND,
            "This auditor link is unknown, expired or revoked. Ask the operator for a new one.",
        )
    };
    let Ok(Path(token)) = token else {
        return Err(refused());
    };
    let (_, link) = c
        .links
        .open_token(token, c.witness.now())
        .ok_or_else(refused)?;
    let owned: HashSet<AgentName> = project_agents(c, &link.project).into_iter().collect();
    let agents: Vec<AgentName> = link
        .agents
        .iter()
        .filter(|a| owned.contains(*a))
        .cloned()
        .collect();
    let range = TimeRange {
        since: link.since,
        until: link.until,
    };
    let view = View {
        project: link.project.clone(),
        base: format!("/console/a/{token}"),
        csrf: None,
        auditor: Some(AuditorScope {
            agents: agents.clone(),
            range,
            expires: link.expires,
            disclosures: link.disclosures.len(),
        }),
    };
    Ok((
        link,
        Scope {
            view,
            agents,
            range,
        },
    ))
}

pub(super) fn path_agent(p: Result<Path<String>, PathRejection>) -> Result<AgentName, PageError> {
    let Path(s) = p.map_err(|_| PageError::not_found())?;
    AgentName::new(&s).map_err(|_| PageError::not_found())
}

pub(super) fn path_index(p: Result<Path<String>, PathRejection>) -> Result<LeafIndex, PageError> {
    let Path(s) = p.map_err(|_| PageError::not_found())?;
    let ok = !s.is_empty() && s.len() <= 16 && s.bytes().all(|b| b.is_ascii_digit());
    let n = ok
        .then(|| s.parse::<u64>().ok())
        .flatten()
        .filter(|n| *n <= tally_schemas::limits::MAX_COUNTER)
        .ok_or_else(PageError::not_found)?;
    Ok(LeafIndex::new(n))
}

pub(crate) async fn not_found() -> Response {
    PageError::not_found().into_response()
}
