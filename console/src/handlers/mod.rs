//! The console's route handlers (docs/api.md "Console"). Operator routes
//! need a session ([`super::auth`]); `/console/a/<token>/…` routes need a
//! live auditor link ([`super::store`]) and show only its agents and time
//! range. Bad input (paths, queries, forms, uploads) gets a 4xx page, never
//! a panic; a 5xx page says nothing about internals (the detail goes to the
//! log).

mod common;
mod links;
mod login;
mod report;
mod verify;

use common::*;
pub(crate) use common::{not_found, PageError};
pub(crate) use links::{links_create, links_disclose, links_page, links_revoke};
pub(crate) use login::{login, login_form, logout};
pub(crate) use report::{agent_report, auditor_report};
pub(crate) use verify::{auditor_verify_form, auditor_verify_upload, verify_form, verify_upload};

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
        let agent = scope.agent(agent)?;
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
        let agent = scope.agent(agent)?;
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
