//! The console's HTML (docs/console.md "Pages"), written with `maud`, whose
//! `(expr)` splices are HTML-escaped. Every value that came from a record
//! (agent, tool, call id, list id, note text) is hostile input and is only
//! ever spliced that way; this module never uses `PreEscaped` (maud's own
//! `DOCTYPE` constant is the only pre-escaped text on a page). No inline script or style: the Content-Security-Policy set in
//! [`super::security_headers`] forbids both, and the SVG chart is styled
//! through classes.

use maud::{html, Markup, DOCTYPE};
use tally_schemas::display;
use tally_schemas::record::ActionState;
use tally_schemas::report::CheckStatus;
use tally_schemas::{AgentName, UnixMillis};
use tally_verifier::Verification;

use crate::data::{AgentSummary, CallRow, ChainView, RecordDetail, TimeRange, CHART_HOURS};
use crate::store::AuditorLink;
use crate::Report;

/// Rows per page of the calls table.
pub(crate) const PAGE_ROWS: usize = 50;

/// Who is looking, and where the links of a page point.
#[derive(Debug, Clone)]
pub(crate) struct View {
    /// The project.
    pub project: String,
    /// URL prefix: `/console` or `/console/a/<token>`.
    pub base: String,
    /// For an operator: the CSRF token of the session's forms.
    pub csrf: Option<String>,
    /// For an auditor: the link's scope.
    pub auditor: Option<AuditorScope>,
}

/// What an auditor link shows.
#[derive(Debug, Clone)]
pub(crate) struct AuditorScope {
    /// The agents.
    pub agents: Vec<AgentName>,
    /// The time range.
    pub range: TimeRange,
    /// Expiry.
    pub expires: UnixMillis,
    /// Disclosures the operator attached (protocol.md §6.3).
    pub disclosures: usize,
}

/// A piece of hostile text: plain text, or one character that
/// protocol.md §11.2 escapes.
enum Piece<'a> {
    Text(&'a str),
    Hidden(char),
}

fn pieces(s: &str, keep_newlines: bool) -> Vec<Piece<'_>> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, c) in s.char_indices() {
        if display::is_escaped(c) && !(keep_newlines && c == '\n') {
            if start < i {
                out.push(Piece::Text(&s[start..i]));
            }
            out.push(Piece::Hidden(c));
            start = i + c.len_utf8();
        }
    }
    if start < s.len() {
        out.push(Piece::Text(&s[start..]));
    }
    out
}

/// Text that came from a record, a report or an upload (tool names, call
/// ids, list ids, notes, labels, messages): HTML-escaped like every splice,
/// in a `<bdi>` so that right-to-left text or a bidirectional control
/// cannot reorder what is around it, and with each character of
/// protocol.md §11.2 (bidirectional controls, invisible and line-breaking
/// characters) shown as a marked escape, `\u{202e}`, as `tally verify`
/// prints it.
fn ext(s: &str) -> Markup {
    ext_text(s, false)
}

/// [`ext`] for text of several lines (notes): line breaks stay breaks.
fn ext_lines(s: &str) -> Markup {
    ext_text(s, true)
}

fn ext_text(s: &str, keep_newlines: bool) -> Markup {
    html! {
        bdi.ext {
            @for piece in pieces(s, keep_newlines) {
                @match piece {
                    Piece::Text(t) => (t),
                    Piece::Hidden(c) => {
                        span.hidden-char title=(format!("U+{:04X}", u32::from(c))) {
                            "\\u{" (format!("{:x}", u32::from(c))) "}"
                        }
                    }
                }
            }
        }
    }
}

/// Pretty JSON of a record or entry for a `pre`: the characters of
/// protocol.md §11.2 (which can only be inside strings) written as JSON
/// `\uXXXX` escapes, so the text is the same JSON value and shows them.
fn json_text(canonical: &[u8]) -> String {
    let pretty = serde_json::from_slice::<serde_json::Value>(canonical)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_default();
    let mut out = String::with_capacity(pretty.len());
    for c in pretty.chars() {
        if display::is_escaped(c) && c != '\n' {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn time(t: UnixMillis) -> String {
    t.to_string()
}

fn opt_time(t: Option<UnixMillis>) -> String {
    t.map_or_else(|| "—".to_owned(), time)
}

fn range_text(r: &TimeRange) -> String {
    match (r.since, r.until) {
        (None, None) => "all records".into(),
        (Some(s), None) => format!("records received from {}", time(s)),
        (None, Some(u)) => format!("records received before {}", time(u)),
        (Some(s), Some(u)) => format!("records received from {} to {}", time(s), time(u)),
    }
}

/// The page frame: head, navigation, main.
pub(crate) fn layout(view: Option<&View>, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="no-referrer";
                title { (title) " · tally console" }
                link rel="stylesheet" href="/console/assets/console.css";
                script src="/console/assets/console.js" defer {}
            }
            body {
                header.top {
                    span.brand { "tally" }
                    @if let Some(v) = view {
                        nav {
                            @if v.auditor.is_some() {
                                a href=(v.base) { "Agents" }
                                a href=(format!("{}/verify", v.base)) { "Verify" }
                                a href=(format!("{}/pack", v.base)) download { "Download pack" }
                                span.badge.readonly { "read-only auditor view" }
                            } @else {
                                a href="/console" { "Overview" }
                                a href="/console/verify" { "Verify" }
                                a href="/console/links" { "Auditor links" }
                                span.project { "project " (v.project) }
                                @if let Some(csrf) = &v.csrf {
                                    form.inline method="post" action="/console/logout" {
                                        input type="hidden" name="csrf" value=(csrf);
                                        button type="submit" { "Log out" }
                                    }
                                }
                            }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// The login form, carrying `token` (which must come back with the
/// matching cookie).
pub(crate) fn login(token: &str, message: Option<&str>) -> Markup {
    layout(
        None,
        "Log in",
        html! {
            h1 { "Log in" }
            p { "Log in with one of your project's API keys (as " code { "tally serve" } " printed it on first start, or " code { "tally project new-key" } " made it). The console shows that project's agents." }
            @if let Some(m) = message { p.error role="alert" { (m) } }
            form method="post" action="/console/login" {
                input type="hidden" name="login_token" value=(token);
                label for="api_key" { "API key" }
                input #api_key type="password" name="api_key" autocomplete="off" required;
                button type="submit" { "Log in" }
            }
        },
    )
}

/// An error page.
pub(crate) fn error(view: Option<&View>, status: u16, message: &str) -> Markup {
    layout(
        view,
        "Error",
        html! {
            h1 { "Error " (status) }
            p.error role="alert" { (ext(message)) }
        },
    )
}

fn chart(counts: &[u64], now: UnixMillis) -> Markup {
    let max = counts.iter().copied().max().unwrap_or(0).max(1);
    let (w, h, gap) = (20u64, 100u64, 4u64);
    let width = counts.len() as u64 * (w + gap);
    let hour = 3_600_000i64;
    let first_hour = (now.as_millis().div_euclid(hour) + 1 - CHART_HOURS as i64) * hour;
    html! {
        svg.chart role="img" aria-label="records per hour, last 24 hours" viewBox=(format!("0 0 {width} {}", h + 16)) {
            @for (i, c) in counts.iter().enumerate() {
                @let bar = if *c == 0 { 0 } else { (c * h / max).max(2) };
                @let x = i as u64 * (w + gap);
                @let start = UnixMillis::new(first_hour + i as i64 * hour);
                rect.bar x=(x) y=(h - bar) width=(w) height=(bar) data-count=(c) {
                    title { (c) " records from " (time(start)) }
                }
                @if i % 6 == 0 {
                    text.axis x=(x) y=(h + 13) { (time(start).get(11..16).unwrap_or("")) }
                }
            }
        }
    }
}

/// What the overview shows of the log itself.
pub(crate) struct LogState<'a> {
    /// The latest checkpoint.
    pub checkpoint: &'a tally_log::SignedCheckpoint,
    /// The sequencer's counters.
    pub stats: tally_log::LogStats,
    /// The cosigners `tally serve` asks, if any.
    pub cosigners: &'a [tally_witness::cosigning::CosignerStatus],
}

/// The overview of the operator's project.
pub(crate) fn overview(
    view: &View,
    agents: &[AgentSummary],
    counts: &[u64],
    chart_truncated: bool,
    log: &LogState<'_>,
    now: UnixMillis,
) -> Markup {
    let (checkpoint, stats, cosigners) = (log.checkpoint, log.stats, log.cosigners);
    let total: u64 = counts.iter().sum();
    layout(
        Some(view),
        "Overview",
        html! {
            h1 { "Overview" }
            section.cards {
                div.card { div.label { "log size" } div.value #log-size { (checkpoint.checkpoint.size) } div.small { "entries in the latest checkpoint" } }
                div.card { div.label { "agents" } div.value #agent-count { (agents.len()) } div.small { "in project " (view.project) } }
                div.card { div.label { "last 24 hours" } div.value #records-24h { (total) } div.small { "records of this project" } }
                div.card { div.label { "since start" } div.value { (stats.entries) } div.small { "entries committed in " (stats.batches) " batches" } }
            }
            h2 { "Records per hour" }
            (chart(counts, now))
            @if chart_truncated { p.small { "The chart counts only the newest entries of a busy log." } }
            h2 { "Agents" }
            @if agents.is_empty() {
                p { "No agents yet. Register one with " code { "tally agent add" } "." }
            } @else {
                table #agents {
                    thead { tr { th { "agent" } th.num { "records" } th { "last activity" } th { "head" } th { "keys" } } }
                    tbody {
                        @for a in agents {
                            tr {
                                td { a href=(format!("{}/agents/{}", view.base, a.agent)) { (a.agent) } }
                                td.num { (a.records()) }
                                td { (opt_time(a.last_received)) }
                                td.mono { @if let Some(h) = &a.head { "seq " (h.seq) " @" (h.index) } @else { "—" } }
                                td { (a.active_keys) " active of " (a.keys) }
                            }
                        }
                    }
                }
            }
            (cosigners_section(cosigners))
            (checkpoint_section(checkpoint))
        },
    )
}

/// The log's cosigners and their state (docs/protocol.md §14.5), when
/// `tally serve` has any.
fn cosigners_section(cosigners: &[tally_witness::cosigning::CosignerStatus]) -> Markup {
    html! {
        @if !cosigners.is_empty() {
            h2 { "Cosigners" }
            table #cosigners {
                thead { tr { th { "cosigner" } th { "state" } th.num { "cosigned size" } th { "last cosignature" } th.num { "failures" } th { "last error" } } }
                tbody {
                    @for c in cosigners {
                        tr {
                            td { (c.name) div.small.mono { (c.url) } }
                            td data-state=(c.state.as_str()) { (c.state.as_str()) }
                            td.num { @if let Some(s) = c.cosigned_size { (s) } @else { "—" } }
                            td { @if let Some(t) = c.last_success { (time(UnixMillis::new(i64::try_from(t.saturating_mul(1000)).unwrap_or(i64::MAX)))) } @else { "—" } }
                            td.num { (c.consecutive_failures) }
                            td.small { (c.last_error.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
            p.small { "Each new checkpoint is sent to every cosigner; packs and " code { "/checkpoint" } " carry the cosignatures. A cosigner is " em { "stale" } " when the latest checkpoint has lacked its cosignature longer than the cosigned max age." }
        }
    }
}

/// The latest checkpoint, as the overview and the auditor's page show it.
fn checkpoint_section(checkpoint: &tally_log::SignedCheckpoint) -> Markup {
    html! {
        h2 { "Latest checkpoint" }
        dl.kv {
            dt { "origin" } dd.mono { (checkpoint.checkpoint.origin) }
            dt { "tree size" } dd.mono #checkpoint-size { (checkpoint.checkpoint.size) }
            dt { "root hash" } dd.mono { (checkpoint.checkpoint.root) }
        }
        pre.note #checkpoint-note { (checkpoint.note) }
    }
}

/// The auditor's landing page: the link's scope, its agents within the
/// range, the downloads, and the log's latest checkpoint. The overview's
/// records-per-hour chart is left out: it counts the last day, not the
/// link's range.
pub(crate) fn auditor_home(
    view: &View,
    agents: &[AgentSummary],
    checkpoint: &tally_log::SignedCheckpoint,
) -> Markup {
    let scope = view.auditor.as_ref();
    let total: u64 = agents.iter().map(AgentSummary::records).sum();
    layout(
        Some(view),
        "Auditor view",
        html! {
            h1 { "Auditor view" }
            @if let Some(s) = scope {
                p #scope { "Read-only. Shows " (range_text(&s.range)) " of " (s.agents.len()) " agent(s) of project " (view.project) "; the link expires at " (time(s.expires)) "." }
            }
            section.cards {
                div.card { div.label { "log size" } div.value #log-size { (checkpoint.checkpoint.size) } div.small { "entries in the latest checkpoint" } }
                div.card { div.label { "agents" } div.value #agent-count { (agents.len()) } div.small { "shared by this link" } }
                div.card { div.label { "records" } div.value #records-in-range { (total) } div.small { "of these agents in range" } }
            }
            p {
                a.button href=(format!("{}/pack", view.base)) download { "Download the pack" }
                " "
                a.button href=(format!("{}/agent-keys.json", view.base)) download { "Download agent-keys.json" }
                " "
                a.button #download-report href=(format!("{}/report", view.base)) download { "Download the report" }
            }
            @if let Some(s) = scope {
                @if s.disclosures > 0 {
                    p #disclosures { (s.disclosures) " disclosed call(s) attached by the operator: the report checks each against its record's salted hash and shows its content." }
                }
            }
            p.small { "Verify the pack offline with " code { "tally verify PACK --agent-keys agent-keys.json --witness-key VKEY" } ". Get the agent keys and the witness key from the operator out of band as well: a verification is only as good as its trust anchors." }
            h2 { "Agents" }
            table #agents {
                thead { tr { th { "agent" } th.num { "records in range" } th { "last activity in range" } th { "last record in range" } } }
                tbody {
                    @for a in agents {
                        tr {
                            td { a href=(format!("{}/agents/{}", view.base, a.agent)) { (a.agent) } }
                            td.num { (a.records()) }
                            td { (opt_time(a.last_received)) }
                            td.mono { @if let Some(h) = &a.head { "seq " (h.seq) " @" (h.index) } @else { "—" } }
                        }
                    }
                }
            }
            (checkpoint_section(checkpoint))
        },
    )
}

fn status_class(s: CheckStatus) -> &'static str {
    match s {
        CheckStatus::Pass => "pass",
        CheckStatus::Fail => "fail",
        CheckStatus::Pending => "pending",
        CheckStatus::NotChecked => "notchecked",
    }
}

fn status_word(s: CheckStatus) -> &'static str {
    match s {
        CheckStatus::Pass => "pass",
        CheckStatus::Fail => "fail",
        CheckStatus::Pending => "pending",
        CheckStatus::NotChecked => "not checked",
    }
}

/// The twelve checks, coverage and result of a verification, and the exact
/// text `tally verify` prints (folded away unless `text_open`).
pub(crate) fn report(v: &Verification, text_open: bool) -> Markup {
    let text = v.to_text();
    let result = text.lines().last().unwrap_or("");
    html! {
        table.checks {
            thead { tr { th { "check" } th { "status" } th { "message" } } }
            tbody {
                @for c in &v.report.checks {
                    tr class=(status_class(c.status)) data-check=(c.id.as_str()) {
                        td.mono { (c.id.as_str()) }
                        td { span class=(format!("st {}", status_class(c.status))) { (status_word(c.status)) } }
                        td { (ext(&c.message)) }
                    }
                }
            }
        }
        @if !v.report.coverage.is_empty() {
            ul.coverage {
                @for line in &v.report.coverage { li { "coverage: " (ext(line)) } }
            }
        }
        p class=(if result.starts_with("PASS") { "result pass" } else { "result fail" }) { (result) }
        details open[text_open] {
            summary { "as " code { "tally verify" } " prints it" }
            pre.report-text { (text) }
        }
    }
}

/// Query of the calls table.
#[derive(Debug, Clone, Default)]
pub(crate) struct CallFilter {
    /// Text searched in tool names and call ids.
    pub q: String,
    /// `all`, `open`, `error` or `ok`; or an action state (docs/protocol.md
    /// §5.2), `posted`, `unknown` or `failed`.
    pub status: String,
    /// 1-based page.
    pub page: usize,
}

impl CallFilter {
    /// Whether `row` passes the filter.
    #[must_use]
    pub(crate) fn matches(&self, row: &CallRow) -> bool {
        let status_ok = match self.status.as_str() {
            "open" => row.is_open(),
            "error" => row.is_error(),
            "ok" => !row.is_open() && !row.is_error(),
            "posted" => row.state == Some(ActionState::Posted),
            "unknown" => row.state == Some(ActionState::Unknown),
            "failed" => row.state == Some(ActionState::Failed),
            _ => true,
        };
        let q = self.q.to_lowercase();
        status_ok
            && (q.is_empty()
                || row.tool.to_lowercase().contains(&q)
                || row.call_id.to_lowercase().contains(&q))
    }

    fn query(&self, page: usize) -> String {
        let enc = |s: &str| {
            let mut out = String::new();
            for b in s.bytes() {
                if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                    out.push(char::from(b));
                } else {
                    out.push_str(&format!("%{b:02X}"));
                }
            }
            out
        };
        format!(
            "?q={}&status={}&page={page}",
            enc(&self.q),
            enc(&self.status)
        )
    }
}

/// Inputs of an agent page.
#[derive(Debug)]
pub(crate) struct AgentPage<'a> {
    /// The agent.
    pub summary: &'a AgentSummary,
    /// Its registered keys.
    pub keys: &'a [tally_schemas::pack::AgentKey],
    /// The chain read.
    pub chain: &'a ChainView,
    /// The verifier's report over the agent's records in range (`None`
    /// when none is in range).
    pub report: Option<&'a Report>,
    /// The table's filter.
    pub filter: &'a CallFilter,
    /// Now (key status).
    pub now: UnixMillis,
}

/// The agent page.
pub(crate) fn agent(view: &View, p: &AgentPage<'_>) -> Markup {
    let a = p.summary;
    let base = &view.base;
    let calls = p.chain.calls();
    let matching: Vec<&CallRow> = calls
        .iter()
        .copied()
        .filter(|c| p.filter.matches(c))
        .collect();
    let pages = matching.len().div_ceil(PAGE_ROWS).max(1);
    let page = p.filter.page.clamp(1, pages);
    let shown = matching.iter().skip((page - 1) * PAGE_ROWS).take(PAGE_ROWS);
    let open = calls.iter().filter(|c| c.is_open()).count();
    let errors = calls.iter().filter(|c| c.is_error()).count();
    let verification = match p.report {
        Some(Report::Current(v) | Report::Older { report: v, .. }) => Some(v.as_ref()),
        Some(Report::Busy | Report::Failed) | None => None,
    };
    let (posted, unknown, failed) = p.chain.action_counts();
    let (claims, claim_count) = p.chain.claims();
    // The verifier's action statement (docs/protocol.md §11, after coverage).
    let statement: Vec<&String> = verification
        .map(|v| {
            let prefix = format!("{}: ", a.agent);
            v.report
                .coverage
                .iter()
                .filter(|l| {
                    l.strip_prefix(&prefix).is_some_and(|rest| {
                        rest.starts_with("action calls: ")
                            || rest.starts_with("no claim without a call")
                            || rest.contains(" without a call: ")
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    // The verifier's coverage lines about tool definitions that changed
    // (docs/protocol.md §11), and its note when it listed only some.
    let changes: Vec<&String> = verification
        .map(|v| {
            v.report
                .coverage
                .iter()
                .filter(|l| {
                    l.starts_with(&format!("{}: tool ", a.agent))
                        || l.starts_with(&format!("{}: ", a.agent)) && l.contains("tool change")
                })
                .collect()
        })
        .unwrap_or_default();
    layout(
        Some(view),
        a.agent.as_str(),
        html! {
            h1 { "Agent " span #agent-name { (a.agent) } }
            @if let Some(s) = &view.auditor {
                p.small { "Showing " (range_text(&s.range)) "." }
            }
            section.cards {
                div.card { div.label { "records" } div.value #record-count { (a.records()) } div.small { (if view.auditor.is_some() { "in range" } else { "in the chain" }) } }
                div.card { div.label { "calls" } div.value #call-count { (calls.len()) } div.small { "decision/outcome pairs shown" } }
                div class=(if open > 0 { "card warn" } else { "card" }) { div.label { "open decisions" } div.value #open-count { (open) } }
                div class=(if errors > 0 { "card bad" } else { "card" }) { div.label { "errors" } div.value #error-count { (errors) } div.small { "outcomes other than ok" } }
                @if posted + unknown + failed > 0 || claim_count > 0 {
                    div class=(if unknown + failed > 0 { "card warn" } else { "card" }) { div.label { "action calls" } div.value #action-count { (posted) " / " (unknown) " / " (failed) } div.small { "posted / unknown / failed" } }
                    div class=(if claim_count > 0 { "card bad" } else { "card" }) { div.label { "claims without a call" } div.value #claim-count { (claim_count) } }
                }
            }
            h2 { (if view.auditor.is_some() { "Last record in range" } else { "Chain head" }) }
            @if let Some(h) = &a.head {
                dl.kv #chain-head {
                    dt { "seq" } dd.mono { (h.seq) }
                    dt { "record hash" } dd.mono { (h.record_hash) }
                    dt { "log index" } dd.mono { a href=(format!("{base}/records/{}", h.index)) { (h.index) } }
                    dt { "last activity" } dd { (opt_time(a.last_received)) }
                }
            } @else {
                p { "No records yet." }
            }
            h2 { "Keys" }
            table #keys {
                thead { tr { th { "key id" } th { "not before" } th { "not after" } th { "status" } } }
                tbody {
                    @for k in p.keys {
                        @let active = k.active_at(p.now);
                        tr {
                            td.mono { (k.key_id) }
                            td { (time(k.not_before)) }
                            td { (opt_time(k.not_after)) }
                            td { span class=(if active { "st pass" } else { "st notchecked" }) { (if active { "active" } else if k.not_before > p.now { "not yet valid" } else { "retired" }) } }
                        }
                    }
                }
            }
            h2 { "Coverage and checks" }
            @match p.report {
                Some(Report::Current(v)) => {
                    p.small { "Computed by the verifier library over a pack of this agent's records (seq " (a.first_seq) " to " (a.head.as_ref().map_or(0, |h| h.seq.get())) "), exactly as " code { "tally verify" } " would report it." }
                    (report(v, false))
                }
                Some(Report::Older { report: v, as_of }) => {
                    p.small.warn #report-as-of { "This report covers seq " (a.first_seq) " to " (as_of) "; the verification of the newer records is running. Reload to see it." }
                    (report(v, false))
                }
                Some(Report::Busy) => { p.small.warn #no-report { "The verification of this agent's records is still running. Reload in a moment." } }
                Some(Report::Failed) => { p.small.error #no-report { "The verification of this agent's records failed; the detail is in the witness's log. Reload to try again." } }
                None => { p.small #no-report { "No witnessed records in range, so there is no pack to verify yet." } }
            }
            h2 { "Tool-definition changes" }
            @if changes.is_empty() {
                p.small #no-changes { "No tool definition changed between the declared tool lists." }
            } @else {
                ul #tool-changes { @for c in &changes { li { (ext(c)) } } }
            }
            @if p.chain.tool_lists().len() > 0 {
                details #tool-lists {
                    summary { "Declared tool lists (" (p.chain.tool_lists().len()) " newest parts)" }
                    @for l in p.chain.tool_lists() {
                        h3 { "list " span.mono { (ext(&l.list_id)) } ", part " (l.part + 1) " of " (l.parts) @if let Some(s) = &l.source { ", source " span.mono { (ext(s)) } } " — seq " a href=(format!("{base}/records/{}", l.at.index)) { (l.at.seq) } " at " (time(l.at.received)) }
                        table {
                            thead { tr { th { "tool" } th { "recorded" } th { "digest" } } }
                            tbody {
                                @for t in &l.tools {
                                    tr { td { (ext(&t.name)) } td { (if t.recorded { "yes" } else { "no" }) } td.mono { (t.digest) } }
                                }
                            }
                        }
                    }
                }
            }
            @if posted + unknown + failed > 0 || claim_count > 0 || !statement.is_empty() {
                h2 #actions-heading { "Actions and claims" }
                p.small { "An action tool's call is " em { "posted" } " when its result held the other system's proof, " em { "unknown" } " when it returned without one, " em { "failed" } " when it failed. A claim is a model turn that said an action was done with no call to it. Both inform; neither fails a check." }
                @if !statement.is_empty() {
                    ul #action-statement { @for l in &statement { li { "coverage: " (ext(l)) } } }
                }
                @if claim_count > 0 {
                    table #claims {
                        thead { tr { th { "seq" } th { "received" } th { "tool claimed" } th { "turn hash" } } }
                        tbody {
                            @for c in claims {
                                tr {
                                    td { a href=(format!("{base}/records/{}", c.at.index)) { (c.at.seq) } }
                                    td { (time(c.at.received)) }
                                    td.tool { (ext(&c.tool)) }
                                    td.mono { (c.turn_hash) }
                                }
                            }
                        }
                    }
                }
            }
            h2 #calls-heading { "Calls" }
            form.filters method="get" action=(format!("{base}/agents/{}", a.agent)) {
                input type="search" name="q" value=(p.filter.q) placeholder="tool or call id" maxlength="256";
                select name="status" {
                    @for (v, label) in [("all", "all"), ("open", "open decisions"), ("error", "errors"), ("ok", "ok"), ("posted", "actions posted"), ("unknown", "actions unknown"), ("failed", "actions failed")] {
                        option value=(v) selected[p.filter.status == v || (v == "all" && p.filter.status.is_empty())] { (label) }
                    }
                }
                button type="submit" { "Search" }
                span.small { (matching.len()) " of " (calls.len()) " calls" }
            }
            table #calls {
                thead { tr { th { "tool" } th { "call id" } th { "status" } th { "decided (agent time)" } th { "ended (agent time)" } th { "receipt" } th { "action" } } }
                tbody {
                    @for c in shown {
                        tr class=(if c.is_open() { "open" } else if c.is_error() { "error" } else { "ok" }) {
                            td.tool { @if c.tool.is_empty() { em { "(decision not shown)" } } @else { (ext(&c.tool)) } }
                            td.mono { (ext(&c.call_id)) }
                            td { span class=(format!("st {}", if c.is_open() { "pending" } else if c.is_error() { "fail" } else { "pass" })) { (c.status()) } }
                            td { @if let Some(d) = &c.decision { a href=(format!("{base}/records/{}", d.index)) { (time(d.time)) } } @else { "—" } }
                            td { @if let Some((o, _)) = &c.outcome { a href=(format!("{base}/records/{}", o.index)) { (time(o.time)) } } @else { "—" } }
                            td.small {
                                @if let Some(d) = &c.decision { "decision under checkpoint " (d.receipt_size) }
                                @if let Some((o, _)) = &c.outcome { @if c.decision.is_some() { br; } "outcome under checkpoint " (o.receipt_size) }
                            }
                            td.state {
                                @match c.state {
                                    Some(ActionState::Posted) => span.st.pass { "posted" },
                                    Some(ActionState::Unknown) => span.st.pending { "unknown" },
                                    Some(ActionState::Failed) => span.st.fail { "failed" },
                                    None => "—",
                                }
                            }
                        }
                    }
                }
            }
            nav.pager {
                @if page > 1 { a rel="prev" href=(format!("{base}/agents/{}{}", a.agent, p.filter.query(page - 1))) { "← newer" } }
                span { "page " (page) " of " (pages) }
                @if page < pages { a rel="next" href=(format!("{base}/agents/{}{}", a.agent, p.filter.query(page + 1))) { "older →" } }
            }
            @if p.chain.not_scanned > 0 {
                p.small { "The " (p.chain.not_scanned) " oldest records are not read on this page; export a pack to see them all." }
            }
            h2 { "Notes, key rotations and tool checks" }
            @if p.chain.others().len() == 0 {
                p.small { "None." }
            } @else {
                table #notes {
                    thead { tr { th { "seq" } th { "received" } th { "kind" } th { "text" } } }
                    tbody {
                        @for n in p.chain.others() {
                            tr {
                                td { a href=(format!("{base}/records/{}", n.at.index)) { (n.at.seq) } }
                                td { (time(n.at.received)) }
                                td { (n.kind) }
                                td.note-text { (ext_lines(&n.text)) }
                            }
                        }
                    }
                }
            }
            @if view.auditor.is_none() && a.head.is_some() {
                p {
                    a.button href=(format!("{base}/agents/{}/pack", a.agent)) download { "Download this agent's pack" }
                    " "
                    a.button #download-report href=(format!("{base}/agents/{}/report", a.agent)) download { "Download the report" }
                }
                form.report-period method="get" action=(format!("{base}/agents/{}/report", a.agent)) {
                    label { "Report from " input type="text" name="from" placeholder="2026-12-01T00:00:00.000Z"; }
                    " "
                    label { "to " input type="text" name="to" placeholder="2026-12-02T00:00:00.000Z"; }
                    " "
                    button type="submit" { "Report on this period" }
                }
            }
        },
    )
}

/// The record page.
pub(crate) fn record(view: &View, d: &RecordDetail) -> Markup {
    let r = d.entry.record();
    let base = &view.base;
    let record_json = json_text(r.canonical_bytes());
    let entry_json = json_text(d.entry.canonical_bytes());
    let (from, to) = d.pack_range();
    layout(
        Some(view),
        &format!("{} #{}", r.agent, r.seq),
        html! {
            h1 { "Record " a href=(format!("{base}/agents/{}", r.agent)) { (r.agent) } " #" (r.seq) }
            dl.kv #record-facts {
                dt { "kind" } dd #record-kind { (format!("{:?}", r.kind()).to_lowercase()) }
                dt { "record hash" } dd.mono { (r.hash()) }
                dt { "log index" } dd.mono #record-index { (d.entry.index()) }
                dt { "agent time" } dd { (time(r.time)) }
                dt { "received" } dd { (time(d.entry.received())) }
                dt { "receipt" } dd { "issued under the checkpoint of size " (d.receipt_size) }
                dt { "leaf hash" } dd.mono { (d.entry.leaf_hash()) }
                @if let Some((s, i)) = d.outcome {
                    dt { "outcome" } dd { a href=(format!("{base}/records/{i}")) { "seq " (s) " @" (i) } }
                }
                @if let Some(i) = d.decision_index {
                    dt { "decision" } dd { a href=(format!("{base}/records/{i}")) { "@" (i) } }
                }
            }
            p {
                a.button #download-record-pack href=(format!("{base}/records/{}/pack", d.entry.index())) download { "Download a pack of this record" }
                @if from != to { span.small { " (seq " (from) " to " (to) ": through the decision's outcome, so that check 10 can pass)" } }
            }
            h2 { "Record" }
            pre.json #record-json { (record_json) }
            h2 { "Entry" }
            p.small { "The leaf data: the record with the witness's receive time and the log index (docs/protocol.md §7.1)." }
            pre.json #entry-json { (entry_json) }
            h2 { "Inclusion proof" }
            p.small { "Of leaf " (d.entry.index()) " in the tree of size " (d.tree_size) " (RFC 9162), " (d.inclusion.len()) " hashes:" }
            ol.mono #inclusion { @for h in &d.inclusion { li { (h) } } }
            h2 { "Checkpoint" }
            pre.note #record-checkpoint { (d.checkpoint) }
        },
    )
}

/// Largest `--max-skew` or `--grace` the verify page takes, in seconds
/// (ten years).
pub(crate) const MAX_VERIFY_WINDOW_SECS: u64 = 10 * 366 * 86_400;

/// The verify page's settings: `tally verify`'s options and defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VerifySettings {
    /// `--max-skew`, seconds.
    pub max_skew_secs: u64,
    /// `--grace`, seconds.
    pub grace_secs: u64,
    /// Whether a head.json was given.
    pub head: bool,
}

impl Default for VerifySettings {
    /// `tally verify`'s defaults.
    fn default() -> Self {
        Self {
            max_skew_secs: tally_schemas::limits::DEFAULT_MAX_SKEW_MS / 1000,
            grace_secs: tally_schemas::limits::DEFAULT_MAX_SKEW_MS / 1000,
            head: false,
        }
    }
}

/// The verify page, with the result of an upload if there was one.
pub(crate) fn verify(
    view: &View,
    vkey: &str,
    settings: &VerifySettings,
    outcome: Option<Result<&Verification, String>>,
) -> Markup {
    let action = format!("{}/verify", view.base);
    let command = format!(
        "tally verify PACK --agent-keys agent-keys.json{} --witness-key '{vkey}' --max-skew {} --grace {}",
        if settings.head { " --head head.json" } else { "" },
        settings.max_skew_secs,
        settings.grace_secs
    );
    layout(
        Some(view),
        "Verify",
        html! {
            h1 { "Verify a pack" }
            p { "The twelve checks, the coverage and the result, exactly as " code { "tally verify" } " prints them. Nothing you upload is stored." }
            form #verify-form method="post" action=(action) enctype="multipart/form-data" {
                @if let Some(csrf) = &view.csrf { input type="hidden" name="csrf" value=(csrf); }
                label for="witness_key" { "witness key (vkey)" }
                input #witness_key type="text" name="witness_key" value=(vkey) size="80";
                label for="agent_keys" { "agent-keys.json" }
                input #agent_keys type="file" name="agent_keys" required;
                label for="head" { "head.json (optional)" }
                input #head type="file" name="head";
                label for="max_skew" { "--max-skew (seconds)" }
                input #max_skew type="number" name="max_skew" min="0" max=(MAX_VERIFY_WINDOW_SECS) value=(settings.max_skew_secs);
                label for="grace" { "--grace (seconds)" }
                input #grace type="number" name="grace" min="0" max=(MAX_VERIFY_WINDOW_SECS) value=(settings.grace_secs);
                label for="pack" { "pack (JSON Lines)" }
                input #pack type="file" name="pack" required;
                button type="submit" { "Verify" }
            }
            @match outcome {
                None => {}
                Some(Ok(v)) => {
                    section #verify-result {
                        h2 { "Result" }
                        p.small { "The same as " code #verify-command { (command) } " prints:" }
                        (report(v, true))
                    }
                }
                Some(Err(e)) => { section #verify-result { h2 { "Result" } p.error role="alert" { (ext(&e)) } } }
            }
        },
    )
}

/// The auditor-link page: the form and the project's links.
pub(crate) fn links(
    view: &View,
    agents: &[AgentName],
    links: &[(String, AuditorLink)],
    made: Option<&str>,
    message: Option<&str>,
    now: UnixMillis,
) -> Markup {
    let csrf = view.csrf.clone().unwrap_or_default();
    layout(
        Some(view),
        "Auditor links",
        html! {
            h1 { "Auditor links" }
            p { "A read-only link for an auditor: the chosen agents' pages, limited to a time range, and their pack. Anyone holding the link can use it until it expires or is revoked; revoking works at once." }
            @if let Some(url) = made {
                div.made #new-link {
                    p { "The new link (shown once; only its hash is stored):" }
                    p { a #new-link-url href=(url) { (url) } " " button.copy type="button" data-copy=(url) { "Copy" } }
                }
            }
            @if let Some(m) = message { p.error role="alert" { (ext(m)) } }
            h2 { "New link" }
            form #link-form method="post" action="/console/links" {
                input type="hidden" name="csrf" value=(csrf);
                fieldset {
                    legend { "agents" }
                    @for a in agents {
                        label.check { input type="checkbox" name="agent" value=(a); " " (a) }
                    }
                }
                label for="since" { "from (UTC, optional)" }
                input #since type="text" name="since" placeholder="2026-11-30T08:00:00.000Z";
                label for="until" { "to (UTC, optional)" }
                input #until type="text" name="until" placeholder="2026-12-01T08:00:00.000Z";
                label for="expires_hours" { "expires after (hours)" }
                input #expires_hours type="number" name="expires_hours" value="72" min="1" max="8760";
                label for="label" { "label (for you)" }
                input #label type="text" name="label" maxlength="100";
                button type="submit" { "Make link" }
            }
            h2 { "Links" }
            table #links {
                thead { tr { th { "label" } th { "agents" } th { "range" } th { "expires" } th { "state" } th {} } }
                tbody {
                    @for (id, l) in links {
                        tr data-link-id=(id) {
                            td { (ext(&l.label)) }
                            td { @for (i, a) in l.agents.iter().enumerate() { @if i > 0 { ", " } (a) } }
                            td { (range_text(&TimeRange { since: l.since, until: l.until })) }
                            td { (time(l.expires)) }
                            td {
                                @if l.revoked.is_some() { span.st.fail { "revoked" } }
                                @else if !l.usable_at(now) { span.st.notchecked { "expired" } }
                                @else { span.st.pass { "active" } }
                            }
                            td {
                                @if l.usable_at(now) {
                                    form.inline.revoke method="post" action=(format!("/console/links/{id}/revoke")) {
                                        input type="hidden" name="csrf" value=(csrf);
                                        button type="submit" { "Revoke" }
                                    }
                                }
                                @for d in &l.disclosures {
                                    div.small.disclosed { "disclosed: " (ext(&d.disclosure.agent)) " call " code { (ext(&d.disclosure.call_id)) } }
                                }
                                @if l.usable_at(now) {
                                    form.disclose method="post" action=(format!("/console/links/{id}/disclosures")) {
                                        input type="hidden" name="csrf" value=(csrf);
                                        label { "attach a disclosure (" code { "tally disclose" } " output) " textarea name="disclosure" rows="2" cols="40" {} }
                                        button type="submit" { "Attach" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}
