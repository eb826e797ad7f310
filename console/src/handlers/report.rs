//! The audit report (docs/protocol.md §11.3) as the console offers it: an
//! operator's for one agent and a period, an auditor link's for its agents
//! and range (docs/console.md).

use super::common::*;

#[derive(Deserialize, Default)]
pub(crate) struct ReportQuery {
    #[serde(default)]
    from: String,
    #[serde(default)]
    to: String,
    #[serde(default)]
    format: String,
}

fn report_time(name: &str, text: &str) -> Result<Option<UnixMillis>, PageError> {
    if text.is_empty() {
        return Ok(None);
    }
    UnixMillis::parse_rfc3339(text).map(Some).map_err(|_| {
        PageError::bad(format!(
            "{name} must be an RFC 3339 time such as 2026-12-01T00:00:00.000Z."
        ))
    })
}

/// The audit report of `agents` over `range` with the figures bounded by
/// the query's period, as the HTML file `tally report` writes (a download,
/// so it is opened and filed as that file) or its JSON.
async fn report_common(
    c: Arc<Console>,
    project: String,
    agents: Vec<AgentName>,
    range: ExportRange,
    query: Result<Query<ReportQuery>, QueryRejection>,
    pack_name: String,
    disclosures: Vec<(String, tally_schemas::disclosure::Disclosure)>,
) -> Result<Response, PageError> {
    let Query(q) = query.map_err(|_| PageError::bad("The report's period could not be read."))?;
    let period = tally_verifier::Period {
        from: report_time("from", &q.from)?,
        to: report_time("to", &q.to)?,
    };
    if let (Some(f), Some(t)) = (period.from, period.to) {
        if f >= t {
            return Err(PageError::bad("from must be before to."));
        }
    }
    let json = match q.format.as_str() {
        "" | "html" => false,
        "json" => true,
        _ => return Err(PageError::bad("format must be html or json.")),
    };
    let report = blocking::<_, PageError>(move || {
        data::audit_export(
            &c.witness,
            &project,
            &agents,
            range,
            period,
            &pack_name,
            disclosures,
        )
        .map_err(PageError::from)
    })
    .await?;
    let (body, kind, name) = if json {
        let mut v =
            serde_json::to_vec(&report).map_err(|e| PageError::from(WitnessError::internal(&e)))?;
        v.push(b'\n');
        (v, "application/json", "report.json")
    } else {
        (
            tally_verifier::audit::render_html(&report).into_bytes(),
            "text/html; charset=utf-8",
            "report.html",
        )
    };
    Ok((
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(kind)),
            (
                header::CONTENT_DISPOSITION,
                HeaderValue::from_str(&format!("attachment; filename=\"{name}\""))
                    .map_err(|e| PageError::from(WitnessError::internal(&e)))?,
            ),
        ],
        body,
    )
        .into_response())
}

/// The operator's report of one agent (`?from=&to=` bound the figures).
pub(crate) async fn agent_report(
    State(c): S,
    headers: HeaderMap,
    agent: Result<Path<String>, PathRejection>,
    query: Result<Query<ReportQuery>, QueryRejection>,
) -> Response {
    let (_, scope) = match operator_scope(&c, &headers).await {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let result = async {
        let agent = scope.agent(agent)?;
        let name = format!("{agent}.pack.jsonl");
        report_common(
            Arc::clone(&c),
            scope.view.project.clone(),
            vec![agent],
            ExportRange::All,
            query,
            name,
            Vec::new(),
        )
        .await
    }
    .await;
    result.unwrap_or_else(|e| e.with_view(&scope.view).into_response())
}

/// The auditor's report: the link's agents and range.
pub(crate) async fn auditor_report(
    State(c): S,
    token: Result<Path<String>, PathRejection>,
    query: Result<Query<ReportQuery>, QueryRejection>,
) -> Response {
    let (link, scope) = match auditor_scope(&c, &token) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let name = match scope.agents.as_slice() {
        [one] => format!("{one}.pack.jsonl"),
        _ => "pack.jsonl".to_owned(),
    };
    let disclosures = link
        .disclosures
        .iter()
        .map(|d| (d.name.clone(), d.disclosure.clone()))
        .collect();
    report_common(
        Arc::clone(&c),
        link.project.clone(),
        scope.agents.clone(),
        scope.range.export_range(),
        query,
        name,
        disclosures,
    )
    .await
    .unwrap_or_else(|e| e.with_view(&scope.view).into_response())
}
