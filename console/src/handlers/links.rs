//! Auditor links: making, revoking, and attaching disclosures to them
//! (docs/console.md "Auditor links").

use super::common::*;
use super::login::{checked_post, field, Pairs};

fn links_markup(c: &Console, view: &View, made: Option<&str>, message: Option<&str>) -> Markup {
    let agents = project_agents(c, &view.project);
    let links = c.links.list(&view.project);
    pages::links(view, &agents, &links, made, message, c.witness.now())
}

pub(crate) async fn links_page(State(c): S, headers: HeaderMap) -> Response {
    match operator(&c, &headers).await {
        Ok((_, view)) => ok(&links_markup(&c, &view, None, None)),
        Err(r) => r.into_response(),
    }
}

/// Parses the link form into a [`NewLink`].
fn new_link(c: &Console, project: &str, pairs: &Pairs) -> Result<NewLink, String> {
    let owned: HashSet<AgentName> = project_agents(c, project).into_iter().collect();
    let mut agents = Vec::new();
    for (_, v) in pairs.iter().filter(|(k, _)| k == "agent") {
        let a = AgentName::new(v).map_err(|_| "an agent name is not valid".to_owned())?;
        if !owned.contains(&a) {
            return Err(format!("agent {a} is not in project {project}"));
        }
        if !agents.contains(&a) {
            agents.push(a);
        }
    }
    if agents.is_empty() {
        return Err("choose at least one agent".into());
    }
    if agents.len() > MAX_AGENTS_PER_PACK {
        return Err(format!("a link shows at most {MAX_AGENTS_PER_PACK} agents"));
    }
    agents.sort();
    // Messages name the fields by their labels on the form ("from", "to").
    let time = |name: &str, label: &str| -> Result<Option<UnixMillis>, String> {
        match field(pairs, name).map(str::trim) {
            None | Some("") => Ok(None),
            Some(t) => UnixMillis::parse_rfc3339(t)
                .map(Some)
                .map_err(|e| format!("{label}: {e}")),
        }
    };
    let (since, until) = (time("since", "from")?, time("until", "to")?);
    if let (Some(s), Some(u)) = (since, until) {
        if s >= u {
            return Err("from must be before to".into());
        }
    }
    let hours = field(pairs, "expires_hours")
        .unwrap_or("72")
        .trim()
        .parse::<i64>()
        .ok()
        .filter(|h| (1..=8760).contains(h))
        .ok_or_else(|| "expires after must be 1 to 8760 hours".to_owned())?;
    let label = field(pairs, "label").unwrap_or("").trim().to_owned();
    if label.len() > 100 || label.chars().any(char::is_control) {
        return Err("the label is at most 100 bytes without control characters".into());
    }
    let now = c.witness.now();
    Ok(NewLink {
        project: project.to_owned(),
        agents,
        since,
        until,
        expires: UnixMillis::new(now.as_millis().saturating_add(hours * 3_600_000)),
        label,
    })
}

pub(crate) async fn links_create(State(c): S, request: Request) -> Response {
    let (op, view, pairs) = match checked_post(&c, request).await {
        Ok(x) => x,
        Err(r) => return r.into_response(),
    };
    let new = match new_link(&c, &op.project, &pairs) {
        Ok(n) => n,
        Err(m) => {
            return page(
                StatusCode::BAD_REQUEST,
                &links_markup(&c, &view, None, Some(&m)),
            )
        }
    };
    let now = c.witness.now();
    let made = c.witness.with_rng(|rng| c.links.create(new, now, rng));
    match made {
        Ok((_, token)) => {
            let url = format!("/console/a/{token}");
            ok(&links_markup(&c, &view, Some(&url), None))
        }
        Err(LinkStoreError::TooMany) => page(
            StatusCode::CONFLICT,
            &links_markup(&c, &view, None, Some(&LinkStoreError::TooMany.to_string())),
        ),
        Err(e) => PageError::from(WitnessError::internal(&e))
            .with_view(&view)
            .into_response(),
    }
}

pub(crate) async fn links_revoke(
    State(c): S,
    id: Result<Path<String>, PathRejection>,
    request: Request,
) -> Response {
    let (op, view, _) = match checked_post(&c, request).await {
        Ok(x) => x,
        Err(r) => return r.into_response(),
    };
    let Ok(Path(id)) = id else {
        return PageError::not_found().with_view(&view).into_response();
    };
    link_changed(&view, c.links.revoke(&op.project, &id, c.witness.now()))
}

/// The answer to a change of a link: back to the links page, or why not.
fn link_changed(view: &View, changed: Result<(), LinkStoreError>) -> Response {
    match changed {
        Ok(()) => Redirect::to("/console/links").into_response(),
        Err(LinkStoreError::NotFound) => PageError::not_found().with_view(view).into_response(),
        Err(e) => PageError::from(WitnessError::internal(&e))
            .with_view(view)
            .into_response(),
    }
}

/// Attaches a disclosure (protocol.md §6.3, pasted as JSON) to a link:
/// the auditor's report checks it against the pack and shows its content.
pub(crate) async fn links_disclose(
    State(c): S,
    id: Result<Path<String>, PathRejection>,
    request: Request,
) -> Response {
    let (op, view, pairs) = match checked_post(&c, request).await {
        Ok(x) => x,
        Err(r) => return r.into_response(),
    };
    let Ok(Path(id)) = id else {
        return PageError::not_found().with_view(&view).into_response();
    };
    let refuse = |message: String| {
        page(
            StatusCode::BAD_REQUEST,
            &links_markup(&c, &view, None, Some(&message)),
        )
    };
    let text = field(&pairs, "disclosure").unwrap_or("");
    let disclosure = match tally_schemas::disclosure::Disclosure::from_json(text.as_bytes()) {
        Ok(d) => d,
        Err(e) => return refuse(format!("disclosure: {e}")),
    };
    let name = match field(&pairs, "name").map(str::trim) {
        Some(n) if !n.is_empty() => n.chars().take(100).collect(),
        _ => format!("{}-{}.json", disclosure.agent, disclosure.call_id)
            .chars()
            .take(100)
            .collect(),
    };
    let attached = crate::store::AttachedDisclosure { name, disclosure };
    match c
        .links
        .attach_disclosure(&op.project, &id, attached, c.witness.now())
    {
        Err(LinkStoreError::Disclosure(m)) => refuse(format!("disclosure: {m}")),
        changed => link_changed(&view, changed),
    }
}
