//! The console's route handlers (docs/api.md "Console"). Operator routes
//! need a session ([`super::auth`]); `/console/a/<token>/…` routes need a
//! live auditor link ([`super::store`]) and show only its agents and time
//! range. Bad input (paths, queries, forms, uploads) gets a 4xx page, never
//! a panic; a 5xx page says nothing about internals (the detail goes to the
//! log).

use std::collections::HashSet;
use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::Markup;
use serde::Deserialize;
use tally_schemas::limits::MAX_AGENTS_PER_PACK;
use tally_schemas::{AgentName, LeafIndex, UnixMillis};

use crate::auth::{self, Operator};
use crate::data::{self, TimeRange};
use crate::pages::{self, AuditorScope, CallFilter, View};
use crate::session_store::SessionStoreError;
use crate::store::{AuditorLink, LinkStoreError, NewLink};
use crate::Console;
use tally_witness::error::{blocking, WitnessError};
use tally_witness::export::{self, ExportRange};
use tally_witness::http::PACK_CONTENT_TYPE;

type S = State<Arc<Console>>;

mod links;
mod login;
mod report;
mod verify;

pub(crate) use links::{links_create, links_disclose, links_page, links_revoke};
use login::{checked_post, field, Pairs};
pub(crate) use login::{login, login_form, logout};
pub(crate) use report::{agent_report, auditor_report};
pub(crate) use verify::{auditor_verify_form, auditor_verify_upload, verify_form, verify_upload};

/// A page that could not be shown: status and a message safe to show.
#[derive(Debug)]
pub(crate) struct PageError {
    status: StatusCode,
    message: String,
    view: Option<Box<View>>,
    /// `Retry-After`, in seconds.
    retry_after: Option<u32>,
}

impl PageError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            view: None,
            retry_after: None,
        }
    }

    /// The session store (the database) cannot be reached: a 503 that says
    /// so; the detail goes to the log.
    fn sessions_unavailable(e: &SessionStoreError) -> Self {
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

    fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "There is no such page.")
    }

    fn with_view(mut self, view: &View) -> Self {
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

fn page(status: StatusCode, markup: &Markup) -> Response {
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

fn ok(markup: &Markup) -> Response {
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
async fn on_sessions<T: Send + 'static>(
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
async fn operator(c: &Arc<Console>, headers: &HeaderMap) -> Result<(Operator, View), Refusal> {
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
fn project_agents(c: &Console, project: &str) -> Vec<AgentName> {
    c.witness
        .registry()
        .agents_of(project)
        .into_iter()
        .map(|(a, _)| a)
        .collect()
}

/// What a request may see: the agents, the time range, the view.
struct Scope {
    view: View,
    agents: Vec<AgentName>,
    range: TimeRange,
}

impl Scope {
    fn allows(&self, agent: &AgentName) -> bool {
        self.agents.contains(agent)
    }
}

async fn operator_scope(
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

fn auditor_scope(
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

fn path_agent(p: Result<Path<String>, PathRejection>) -> Result<AgentName, PageError> {
    let Path(s) = p.map_err(|_| PageError::not_found())?;
    AgentName::new(&s).map_err(|_| PageError::not_found())
}

fn path_index(p: Result<Path<String>, PathRejection>) -> Result<LeafIndex, PageError> {
    let Path(s) = p.map_err(|_| PageError::not_found())?;
    let ok = !s.is_empty() && s.len() <= 16 && s.bytes().all(|b| b.is_ascii_digit());
    let n = ok
        .then(|| s.parse::<u64>().ok())
        .flatten()
        .filter(|n| *n <= tally_schemas::limits::MAX_COUNTER)
        .ok_or_else(PageError::not_found)?;
    Ok(LeafIndex::new(n))
}

// ---- overview --------------------------------------------------------------

pub(crate) async fn overview(State(c): S, headers: HeaderMap) -> Response {
    let (_, scope) = match operator_scope(&c, &headers).await {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let view = scope.view.clone();
    let result = blocking::<_, PageError>(move || {
        let w = &c.witness;
        let now = w.now();
        let summaries = data::agent_summaries(w, &scope.agents, scope.range)?;
        let set: HashSet<AgentName> = scope.agents.iter().cloned().collect();
        let (counts, truncated) = c.records_per_hour(&set)?;
        let cp = w.log().latest_checkpoint();
        Ok(pages::overview(
            &scope.view,
            &summaries,
            &counts,
            truncated,
            &pages::LogState {
                checkpoint: &cp,
                stats: w.log().stats(),
                cosigners: &w.cosigning().map(|c| c.status()).unwrap_or_default(),
            },
            now,
        ))
    })
    .await;
    match result {
        Ok(m) => ok(&m),
        Err(e) => e.with_view(&view).into_response(),
    }
}

pub(crate) async fn auditor_home(
    State(c): S,
    token: Result<Path<String>, PathRejection>,
) -> Response {
    let (_, scope) = match auditor_scope(&c, &token) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let view = scope.view.clone();
    match blocking::<_, PageError>(move || {
        let summaries = data::agent_summaries(&c.witness, &scope.agents, scope.range)?;
        let cp = c.witness.log().latest_checkpoint();
        Ok(pages::auditor_home(&scope.view, &summaries, &cp))
    })
    .await
    {
        Ok(m) => ok(&m),
        Err(e) => e.with_view(&view).into_response(),
    }
}

// ---- agent page ------------------------------------------------------------

#[derive(Deserialize, Default)]
pub(crate) struct AgentQuery {
    #[serde(default)]
    q: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    page: Option<String>,
}

fn call_filter(q: Result<Query<AgentQuery>, QueryRejection>) -> Result<CallFilter, PageError> {
    let Query(q) = q.map_err(|_| PageError::bad("The search could not be read."))?;
    if q.q.len() > 256 {
        return Err(PageError::bad("The search text is longer than 256 bytes."));
    }
    if ![
        "", "all", "open", "error", "ok", "posted", "unknown", "failed",
    ]
    .contains(&q.status.as_str())
    {
        return Err(PageError::bad(
            "status must be all, open, error, ok, posted, unknown or failed.",
        ));
    }
    let page = match q.page.as_deref() {
        None | Some("") => 1,
        Some(p) => p
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=1_000_000).contains(n))
            .ok_or_else(|| PageError::bad("page must be a number from 1."))?,
    };
    Ok(CallFilter {
        q: q.q,
        status: q.status,
        page,
    })
}

async fn agent_common(
    c: Arc<Console>,
    scope: Scope,
    agent: Result<Path<String>, PathRejection>,
    query: Result<Query<AgentQuery>, QueryRejection>,
) -> Response {
    let view = scope.view.clone();
    let result = async {
        let agent = path_agent(agent)?;
        if !scope.allows(&agent) {
            return Err(PageError::not_found());
        }
        let filter = call_filter(query)?;
        blocking::<_, PageError>(move || {
            let w = &c.witness;
            let now = w.now();
            let summary = data::agent_summaries(w, std::slice::from_ref(&agent), scope.range)?
                .pop()
                .ok_or_else(PageError::not_found)?;
            let keys = w
                .registry()
                .agent(&agent)
                .map(|r| r.keys)
                .unwrap_or_default();
            let report = match summary.head {
                Some(_) => Some(c.report(&summary, scope.range)?),
                None => None,
            };
            c.with_chain_view(&summary, scope.range, |chain| {
                pages::agent(
                    &scope.view,
                    &pages::AgentPage {
                        summary: &summary,
                        keys: &keys,
                        chain,
                        report: report.as_ref(),
                        filter: &filter,
                        now,
                    },
                )
            })
            .map_err(PageError::from)
        })
        .await
    }
    .await;
    match result {
        Ok(m) => ok(&m),
        Err(e) => e.with_view(&view).into_response(),
    }
}

pub(crate) async fn agent_page(
    State(c): S,
    headers: HeaderMap,
    agent: Result<Path<String>, PathRejection>,
    query: Result<Query<AgentQuery>, QueryRejection>,
) -> Response {
    match operator_scope(&c, &headers).await {
        Ok((_, scope)) => agent_common(c, scope, agent, query).await,
        Err(r) => r.into_response(),
    }
}

#[derive(Deserialize)]
pub(crate) struct AuditorAgentPath {
    token: String,
    agent: String,
}

pub(crate) async fn auditor_agent(
    State(c): S,
    path: Result<Path<AuditorAgentPath>, PathRejection>,
    query: Result<Query<AgentQuery>, QueryRejection>,
) -> Response {
    let Ok(Path(p)) = path else {
        return PageError::not_found().into_response();
    };
    match auditor_scope(&c, &Ok(Path(p.token))) {
        Ok((_, scope)) => agent_common(c, scope, Ok(Path(p.agent)), query).await,
        Err(e) => e.into_response(),
    }
}

// ---- record page -----------------------------------------------------------

/// The record at `index` if `scope` may see it, with links to its paired
/// decision or outcome only when those are in the scope's range too: a link
/// outside the range would name what the scope hides.
fn scoped_detail(
    w: &tally_witness::witness::Witness,
    scope: &Scope,
    index: LeafIndex,
) -> Result<data::RecordDetail, PageError> {
    let mut detail = data::record_detail(w, index)?
        .filter(|d| {
            scope.allows(&d.entry.record().agent) && scope.range.contains(d.entry.received())
        })
        .ok_or_else(PageError::not_found)?;
    if scope.range == TimeRange::default() {
        return Ok(detail);
    }
    let in_range = |i: LeafIndex| -> Result<bool, PageError> {
        Ok(w.log()
            .entry(i)
            .map_err(WitnessError::from)?
            .is_some_and(|e| scope.range.contains(e.received())))
    };
    if let Some((_, i)) = detail.outcome {
        if !in_range(i)? {
            detail.outcome = None;
        }
    }
    if let Some(i) = detail.decision_index {
        if !in_range(i)? {
            detail.decision_index = None;
        }
    }
    Ok(detail)
}

async fn record_common(
    c: Arc<Console>,
    scope: Scope,
    index: Result<Path<String>, PathRejection>,
) -> Response {
    let view = scope.view.clone();
    let result = async {
        let index = path_index(index)?;
        blocking::<_, PageError>(move || {
            let detail = scoped_detail(&c.witness, &scope, index)?;
            Ok(pages::record(&scope.view, &detail))
        })
        .await
    }
    .await;
    match result {
        Ok(m) => ok(&m),
        Err(e) => e.with_view(&view).into_response(),
    }
}

pub(crate) async fn record_page(
    State(c): S,
    headers: HeaderMap,
    index: Result<Path<String>, PathRejection>,
) -> Response {
    match operator_scope(&c, &headers).await {
        Ok((_, scope)) => record_common(c, scope, index).await,
        Err(r) => r.into_response(),
    }
}

#[derive(Deserialize)]
pub(crate) struct AuditorIndexPath {
    token: String,
    index: String,
}

/// The scope of an auditor link and the index of a
/// `/console/a/{token}/records/{index}…` path.
fn auditor_index(
    c: &Console,
    path: Result<Path<AuditorIndexPath>, PathRejection>,
) -> Result<(Scope, Result<Path<String>, PathRejection>), PageError> {
    let Ok(Path(p)) = path else {
        return Err(PageError::not_found());
    };
    let (_, scope) = auditor_scope(c, &Ok(Path(p.token)))?;
    Ok((scope, Ok(Path(p.index))))
}

pub(crate) async fn auditor_record(
    State(c): S,
    path: Result<Path<AuditorIndexPath>, PathRejection>,
) -> Response {
    match auditor_index(&c, path) {
        Ok((scope, index)) => record_common(c, scope, index).await,
        Err(e) => e.into_response(),
    }
}

// ---- packs -----------------------------------------------------------------

/// Streams the pack of `agents` over `range` as a download. Agents with
/// nothing in a time range are left out; with none left, 404.
async fn pack_download(
    c: Arc<Console>,
    agents: Vec<AgentName>,
    range: ExportRange,
    filename: String,
) -> Result<Response, PageError> {
    let w = Arc::clone(&c.witness);
    // The same checkpoint as `GET /v1/export`: with cosigners, the cosigned one.
    let cp = export::pinned_checkpoint(&w).await?;
    let plan = blocking::<_, PageError>(move || {
        let mut agents = agents;
        loop {
            if agents.is_empty() {
                return Err(PageError::new(
                    StatusCode::NOT_FOUND,
                    "There are no witnessed records to export in this range.",
                ));
            }
            match export::plan_pack_at(w.log(), Arc::clone(&cp), &agents, range) {
                Ok(plan) => return Ok(plan),
                Err(WitnessError::NoRecords { agent, .. }) => agents.retain(|a| *a != agent),
                Err(e) => return Err(e.into()),
            }
        }
    })
    .await?;
    let disposition = HeaderValue::from_str(&format!("attachment; filename=\"{filename}\""))
        .map_err(|e| PageError::from(WitnessError::internal(&e)))?;
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static(PACK_CONTENT_TYPE),
            ),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        export::pack_body(Arc::clone(c.witness.log()), plan, c.witness.now()),
    )
        .into_response())
}

pub(crate) async fn agent_pack(
    State(c): S,
    headers: HeaderMap,
    agent: Result<Path<String>, PathRejection>,
) -> Response {
    let (_, scope) = match operator_scope(&c, &headers).await {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let result = async {
        let agent = path_agent(agent)?;
        if !scope.allows(&agent) {
            return Err(PageError::not_found());
        }
        let name = format!("{agent}.pack.jsonl");
        pack_download(Arc::clone(&c), vec![agent], ExportRange::All, name).await
    }
    .await;
    result.unwrap_or_else(|e| e.with_view(&scope.view).into_response())
}

/// The download of one record: the record alone, or for an answered
/// decision the records through its outcome (within the scope's range).
async fn record_pack_common(
    c: Arc<Console>,
    scope: Scope,
    index: Result<Path<String>, PathRejection>,
) -> Response {
    let view = scope.view.clone();
    let result = async {
        let index = path_index(index)?;
        let c2 = Arc::clone(&c);
        let (agent, from, to) = blocking::<_, PageError>(move || {
            let d = scoped_detail(&c2.witness, &scope, index)?;
            let agent = d.entry.record().agent.clone();
            let (from, to) = d.pack_range();
            Ok((agent, from, to))
        })
        .await?;
        let name = format!("{agent}-{from}.pack.jsonl");
        let range = ExportRange::Seq {
            from: Some(from),
            to: Some(to),
        };
        pack_download(c, vec![agent], range, name).await
    }
    .await;
    result.unwrap_or_else(|e| e.with_view(&view).into_response())
}

pub(crate) async fn record_pack(
    State(c): S,
    headers: HeaderMap,
    index: Result<Path<String>, PathRejection>,
) -> Response {
    match operator_scope(&c, &headers).await {
        Ok((_, scope)) => record_pack_common(c, scope, index).await,
        Err(r) => r.into_response(),
    }
}

pub(crate) async fn auditor_record_pack(
    State(c): S,
    path: Result<Path<AuditorIndexPath>, PathRejection>,
) -> Response {
    match auditor_index(&c, path) {
        Ok((scope, index)) => record_pack_common(c, scope, index).await,
        Err(e) => e.into_response(),
    }
}

pub(crate) async fn auditor_pack(
    State(c): S,
    token: Result<Path<String>, PathRejection>,
) -> Response {
    let (_, scope) = match auditor_scope(&c, &token) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let name = match scope.agents.as_slice() {
        [one] => format!("{one}.pack.jsonl"),
        _ => "pack.jsonl".to_owned(),
    };
    pack_download(
        Arc::clone(&c),
        scope.agents.clone(),
        scope.range.export_range(),
        name,
    )
    .await
    .unwrap_or_else(|e| e.with_view(&scope.view).into_response())
}

pub(crate) async fn auditor_keys(
    State(c): S,
    token: Result<Path<String>, PathRejection>,
) -> Response {
    let (link, scope) = match auditor_scope(&c, &token) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let w = &c.witness;
    let doc = export::agent_keys(w.registry(), w.log().origin(), &link.project, &scope.agents)
        .and_then(|d| export::to_canonical(&d));
    match doc {
        Ok(bytes) => (
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                ),
                (
                    header::CONTENT_DISPOSITION,
                    HeaderValue::from_static("attachment; filename=\"agent-keys.json\""),
                ),
            ],
            bytes,
        )
            .into_response(),
        Err(e) => PageError::from(e).with_view(&scope.view).into_response(),
    }
}

// ---- assets and the rest ---------------------------------------------------

const CSS: &str = include_str!("../assets/console.css");
const JS: &str = include_str!("../assets/console.js");

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=3600"),
            ),
        ],
        body,
    )
        .into_response()
}

pub(crate) async fn css() -> Response {
    asset("text/css; charset=utf-8", CSS)
}

pub(crate) async fn js() -> Response {
    asset("text/javascript; charset=utf-8", JS)
}

pub(crate) async fn not_found() -> Response {
    PageError::not_found().into_response()
}
