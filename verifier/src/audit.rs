//! The audit report of docs/protocol.md §11.3: the verifier's statements
//! sorted to their agents, and the report as one self-contained HTML page
//! (no external fonts, scripts or images; the charts are inline SVG), with
//! a print stylesheet. Every string from a pack (agent and tool names, call
//! ids, statements, disclosed content) is escaped twice: the characters of
//! §11.2 visibly, as in text output, then for HTML.

use std::fmt::Write as _;

use tally_schemas::audit::{AgentSection, AuditReport, Chart, NamedRecord};
use tally_schemas::display::escape;
use tally_schemas::report::{CheckStatus, DisclosureStatus, Report, Verdict};

/// Sorts the report's statements (its coverage lines, and every other line
/// the verifier states about an agent, which all begin `NAME: `) into the
/// agents' sections, and the records the checks name; returns the
/// sections and the statements about no single agent.
#[must_use]
pub fn sections(
    report: &Report,
    mut sections: Vec<AgentSection>,
) -> (Vec<AgentSection>, Vec<String>) {
    let mut rest = Vec::new();
    for line in &report.coverage {
        // Agent names hold no `:` (protocol.md §3.1), so the prefix is
        // exact.
        let owner = line.split_once(": ").and_then(|(name, tail)| {
            sections
                .iter_mut()
                .find(|s| s.agent == name)
                .map(|s| (s, tail))
        });
        match owner {
            Some((s, tail)) => s.statements.push(tail.to_owned()),
            None => rest.push(line.clone()),
        }
    }
    for c in &report.checks {
        for r in &c.records {
            if let Some(s) = sections.iter_mut().find(|s| s.agent == r.agent) {
                s.named_by_checks.push(NamedRecord {
                    check: c.id.as_str().to_owned(),
                    status: status_text(c.status).to_owned(),
                    seq: r.seq,
                });
            }
        }
    }
    (sections, rest)
}

fn status_text(s: CheckStatus) -> &'static str {
    match s {
        CheckStatus::Pass => "pass",
        CheckStatus::Fail => "fail",
        CheckStatus::Pending => "pending",
        CheckStatus::NotChecked => "not checked",
    }
}

/// Text from a pack, for HTML: §11.2's escape, then `& < > " '`.
#[must_use]
pub fn html_text(s: &str) -> String {
    let visible = escape(s);
    let mut out = String::with_capacity(visible.len());
    for c in visible.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = r#"
:root { --pass: #0a6b2e; --fail: #b3001b; --pend: #8a5a00; --ink: #1b1b1b; --mute: #5a5a5a; --line: #d0d0d0; }
* { box-sizing: border-box; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: var(--ink); margin: 2rem auto; max-width: 60rem; padding: 0 1rem; line-height: 1.4; }
h1, h2, h3 { line-height: 1.2; }
code, pre, .mono { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 0.9em; overflow-wrap: anywhere; }
pre { white-space: pre-wrap; background: #f5f5f5; padding: 0.5rem; border: 1px solid var(--line); }
table { border-collapse: collapse; width: 100%; margin: 0.5rem 0 1rem; }
th, td { border: 1px solid var(--line); padding: 0.25rem 0.5rem; text-align: left; vertical-align: top; overflow-wrap: anywhere; }
th { background: #f0f0f0; }
#verdict { border: 3px solid; padding: 1rem 1.25rem; margin-bottom: 1.5rem; }
#verdict.pass { border-color: var(--pass); }
#verdict.fail { border-color: var(--fail); }
#verdict h1 { margin: 0 0 0.5rem; font-size: 2.5rem; }
#verdict.pass h1 { color: var(--pass); }
#verdict.fail h1 { color: var(--fail); }
.st-pass { color: var(--pass); font-weight: 600; }
.st-fail { color: var(--fail); font-weight: 700; }
.st-pending, .st-not-checked { color: var(--pend); font-weight: 600; }
.st-match { color: var(--pass); font-weight: 600; }
.st-mismatch, .st-not_in_pack { color: var(--fail); font-weight: 700; }
.muted { color: var(--mute); }
.legend span { display: inline-block; margin-right: 1rem; }
.swatch { display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.3em; vertical-align: middle; }
svg { max-width: 100%; height: auto; }
#checks td:nth-child(2), #checks td:nth-child(2) code { white-space: nowrap; overflow-wrap: normal; }
section.agent { border-top: 2px solid var(--ink); margin-top: 2rem; }
footer { margin-top: 2rem; border-top: 1px solid var(--line); color: var(--mute); font-size: 0.85em; }
@page { size: A4; margin: 15mm 12mm 18mm; @bottom-center { content: "page " counter(page) " of " counter(pages); font-size: 9pt; } }
@media print {
  body { margin: 0; max-width: none; font-size: 10pt; }
  section.agent, section#checks, section#trust { break-before: page; border-top: none; }
  table, svg, pre, tr { break-inside: avoid; }
  h2, h3 { break-after: avoid; }
  #verdict { break-inside: avoid; }
}
"#;

const PALETTE: [&str; 13] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#637939", "#aaaaaa",
];

fn time_of(ms: i64) -> String {
    tally_schemas::UnixMillis::new(ms)
        .to_rfc3339()
        .unwrap_or_else(|_| ms.to_string())
}

fn duration(ms: u64) -> String {
    match ms {
        m if m % 86_400_000 == 0 => format!("{} d", m / 86_400_000),
        m if m >= 3_600_000 => format!("{:.1} h", m as f64 / 3_600_000.0),
        m if m >= 60_000 => format!("{:.1} min", m as f64 / 60_000.0),
        m => format!("{:.1} s", m as f64 / 1000.0),
    }
}

/// Calls per tool over time: one stacked bar per bucket.
fn chart_svg(out: &mut String, agent: &str, c: &Chart) {
    let n = usize::try_from(c.buckets).unwrap_or(0).max(1);
    let totals: Vec<u64> = (0..n)
        .map(|i| {
            c.tools
                .iter()
                .map(|t| t.counts.get(i).copied().unwrap_or(0))
                .sum()
        })
        .collect();
    let max = totals.iter().copied().max().unwrap_or(0).max(1);
    let (w, h, left, bottom, top) = (720.0_f64, 220.0_f64, 48.0_f64, 36.0_f64, 10.0_f64);
    let plot_w = w - left - 8.0;
    let plot_h = h - bottom - top;
    let bar = plot_w / n as f64;
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="calls per tool over time for {}">"#,
        html_text(agent)
    );
    let _ = write!(
        out,
        r##"<line x1="{left}" y1="{top}" x2="{left}" y2="{y}" stroke="#444"/><line x1="{left}" y1="{y}" x2="{x2}" y2="{y}" stroke="#444"/>"##,
        y = top + plot_h,
        x2 = left + plot_w
    );
    let _ = write!(
        out,
        r##"<text x="{x}" y="{y}" font-size="11" text-anchor="end" fill="#444">{max}</text><text x="{x}" y="{y0}" font-size="11" text-anchor="end" fill="#444">0</text>"##,
        x = left - 4.0,
        y = top + 10.0,
        y0 = top + plot_h
    );
    for i in 0..n {
        let mut y = top + plot_h;
        for (k, t) in c.tools.iter().enumerate() {
            let v = t.counts.get(i).copied().unwrap_or(0);
            if v == 0 {
                continue;
            }
            let bh = plot_h * v as f64 / max as f64;
            y -= bh;
            let _ = write!(
                out,
                r#"<rect x="{:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="{}"><title>{}: {v}</title></rect>"#,
                left + bar * i as f64 + bar * 0.1,
                y,
                (bar * 0.8).max(0.5),
                bh,
                PALETTE[k.min(PALETTE.len() - 1)],
                t.tool
                    .as_deref()
                    .map_or_else(|| "other tools".to_owned(), html_text)
            );
        }
    }
    let start = c.start_ms;
    let end = start
        .saturating_add(i64::try_from(c.bucket_ms.saturating_mul(c.buckets)).unwrap_or(i64::MAX));
    let _ = write!(
        out,
        r##"<text x="{left}" y="{y}" font-size="11" fill="#444">{}</text><text x="{x2}" y="{y}" font-size="11" text-anchor="end" fill="#444">{}</text></svg>"##,
        time_of(start),
        time_of(end),
        y = top + plot_h + 16.0,
        x2 = left + plot_w
    );
    let _ = write!(
        out,
        r#"<p class="legend muted">One bar per {} ({} bucket{}). "#,
        duration(c.bucket_ms),
        c.buckets,
        if c.buckets == 1 { "" } else { "s" }
    );
    for (k, t) in c.tools.iter().enumerate() {
        let _ = write!(
            out,
            r#"<span><i class="swatch" style="background:{}"></i>{} ({})</span>"#,
            PALETTE[k.min(PALETTE.len() - 1)],
            t.tool.as_deref().map_or_else(
                || "other tools".to_owned(),
                |n| format!("<code>{}</code>", html_text(n))
            ),
            t.calls
        );
    }
    out.push_str("</p>");
}

fn calls_table(out: &mut String, calls: &[tally_schemas::audit::CallRef]) {
    out.push_str(
        "<table><tr><th>seq</th><th>time</th><th>call id</th><th>tool</th><th>status</th></tr>",
    );
    for c in calls {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td><code>{}</code></td><td>{}</td></tr>",
            c.seq,
            html_text(&c.time),
            html_text(&c.call_id),
            c.tool.as_deref().map(html_text).unwrap_or_default(),
            html_text(&c.status)
        );
    }
    out.push_str("</table>");
}

fn agent_html(out: &mut String, i: usize, a: &AgentSection) {
    let _ = write!(
        out,
        r#"<section class="agent" id="agent-{i}"><h2>Agent <code>{}</code></h2>"#,
        html_text(&a.agent)
    );
    let _ = write!(
        out,
        "<p>seq {}–{} in the pack's header; {} records verified; {} within the period{}; {} calls.</p>",
        a.first_seq,
        a.last_seq,
        a.records,
        a.period_records,
        match (&a.first_time, &a.last_time) {
            (Some(f), Some(l)) => format!(", from {} to {}", html_text(f), html_text(l)),
            _ => String::new(),
        },
        a.calls
    );
    out.push_str("<h3>Calls per tool over time</h3>");
    match &a.chart {
        Some(c) => chart_svg(out, &a.agent, c),
        None => out.push_str("<p class=\"muted\">No records within the period.</p>"),
    }
    out.push_str("<h3>Outcomes</h3>");
    if a.outcomes.is_empty() {
        out.push_str("<p class=\"muted\">No outcomes within the period.</p>");
    } else {
        out.push_str("<table><tr><th>status</th><th>outcomes</th></tr>");
        for s in &a.outcomes {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td></tr>",
                html_text(&s.status),
                s.count
            );
        }
        out.push_str("</table>");
    }
    if !a.not_ok.is_empty() {
        out.push_str("<h3>Calls that did not end ok</h3>");
        calls_table(out, &a.not_ok);
        if a.not_ok_more > 0 {
            let _ = write!(out, "<p class=\"muted\">and {} more.</p>", a.not_ok_more);
        }
    }
    out.push_str("<h3>Open decisions</h3>");
    if a.open.is_empty() {
        out.push_str("<p>Every decision within the period has an outcome in the pack.</p>");
    } else {
        calls_table(out, &a.open);
        if a.open_more > 0 {
            let _ = write!(out, "<p class=\"muted\">and {} more.</p>", a.open_more);
        }
    }
    out.push_str("<h3>Statements</h3>");
    if a.statements.is_empty() {
        out.push_str("<p class=\"muted\">None.</p>");
    } else {
        out.push_str("<ul class=\"statements\">");
        for s in &a.statements {
            let _ = write!(out, "<li>{}</li>", html_text(s));
        }
        out.push_str("</ul>");
    }
    out.push_str("<h3>Key changes</h3>");
    if a.key_changes.is_empty() {
        out.push_str("<p class=\"muted\">None within the period.</p>");
    } else {
        out.push_str("<table><tr><th>seq</th><th>time</th><th>new key id</th></tr>");
        for k in &a.key_changes {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
                k.seq,
                html_text(&k.time),
                html_text(&k.new_key_id)
            );
        }
        out.push_str("</table>");
    }
    if !a.named_by_checks.is_empty() {
        out.push_str("<h3>Records the checks name</h3><table><tr><th>check</th><th>status</th><th>seq</th></tr>");
        for r in &a.named_by_checks {
            let cls = r.status.replace(' ', "-");
            let _ = write!(
                out,
                "<tr><td>{}</td><td class=\"st-{cls}\">{}</td><td>{}</td></tr>",
                html_text(&r.check),
                html_text(&r.status),
                r.seq
            );
        }
        out.push_str("</table>");
    }
    out.push_str("</section>");
}

fn json_line(v: &serde_json::Value) -> String {
    tally_schemas::canonical::canonicalize(v)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// The audit report as one self-contained HTML page (§11.3).
#[must_use]
#[allow(clippy::too_many_lines)]
pub fn render_html(r: &AuditReport) -> String {
    let v = &r.verification;
    let pass = v.result == Verdict::Pass;
    let verdict = if pass { "PASS" } else { "FAIL" };
    let mut out = String::with_capacity(64 << 10);
    let _ = write!(
        out,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:"><title>tally report: {verdict}: {}</title><style>{STYLE}</style></head><body>"#,
        html_text(&r.pack.file)
    );
    let _ = write!(
        out,
        r#"<section id="verdict" class="{}"><h1>{verdict}</h1><p><strong>{}</strong></p>"#,
        if pass { "pass" } else { "fail" },
        html_text(&crate::render::result_line(v, r.agents.len()))
    );
    let failed: Vec<_> = v
        .checks
        .iter()
        .filter(|c| c.status == CheckStatus::Fail)
        .collect();
    if !failed.is_empty() {
        out.push_str("<p>Failing checks:</p><ul>");
        for c in &failed {
            let _ = write!(
                out,
                r#"<li><span class="st-fail">{}</span>: {}</li>"#,
                c.id.as_str(),
                html_text(&c.message)
            );
        }
        out.push_str("</ul>");
    }
    let bad: Vec<_> = v
        .disclosures
        .iter()
        .filter(|d| d.status != DisclosureStatus::Match)
        .collect();
    if !bad.is_empty() {
        out.push_str("<p>Disclosures that did not check:</p><ul>");
        for d in bad {
            let _ = write!(
                out,
                r#"<li><span class="st-fail">{}</span> <code>{}</code>: {}</li>"#,
                d.status.as_str(),
                html_text(&d.file),
                html_text(&d.message)
            );
        }
        out.push_str("</ul>");
    }
    let _ = write!(
        out,
        "<table><tr><th>pack</th><td><code>{}</code>, {} bytes</td></tr><tr><th>pack SHA-256</th><td><code>{}</code></td></tr><tr><th>records verified</th><td>{}</td></tr><tr><th>agents</th><td>{}</td></tr><tr><th>period</th><td>{}</td></tr><tr><th>made</th><td>{} by tally {}</td></tr></table>",
        html_text(&r.pack.file),
        r.pack.bytes,
        html_text(&r.pack.sha256),
        v.records,
        r.agents
            .iter()
            .map(|a| format!("<a href=\"#agent-{}\"><code>{}</code></a>", r.agents.iter().position(|x| std::ptr::eq(x, a)).unwrap_or(0), html_text(&a.agent)))
            .collect::<Vec<_>>()
            .join(", "),
        match (&r.period.from, &r.period.to) {
            (None, None) => "the whole pack".to_owned(),
            (f, t) => format!(
                "{} to {} (the per-agent figures; the checks cover the whole pack)",
                f.as_deref().map_or_else(|| "the start".to_owned(), html_text),
                t.as_deref().map_or_else(|| "the end".to_owned(), html_text)
            ),
        },
        html_text(&r.generated),
        html_text(&r.tally_version)
    );
    out.push_str("</section>");

    if !v.disclosures.is_empty() {
        out.push_str("<section id=\"disclosures\"><h2>Disclosed calls</h2>");
        for d in &v.disclosures {
            let _ = write!(
                out,
                r#"<h3><code>{}</code> call <code>{}</code>: <span class="st-{}">{}</span></h3><p>{}</p><p class="muted">file <code>{}</code></p>"#,
                html_text(&d.agent),
                html_text(&d.call_id),
                d.status.as_str(),
                d.status.as_str(),
                html_text(&d.message),
                html_text(&d.file)
            );
            for (what, seq, content) in [
                ("input", d.input_seq, &d.input),
                ("output", d.output_seq, &d.output),
            ] {
                if let Some(c) = content {
                    let _ = write!(
                        out,
                        "<p>{what} (seq {}):</p><pre>{}</pre>",
                        seq.unwrap_or(0),
                        html_text(&json_line(c))
                    );
                }
            }
        }
        out.push_str("</section>");
    }

    for (i, a) in r.agents.iter().enumerate() {
        agent_html(&mut out, i, a);
    }
    if !r.statements.is_empty() {
        out.push_str("<section id=\"statements\"><h2>Other statements</h2><ul>");
        for s in &r.statements {
            let _ = write!(out, "<li>{}</li>", html_text(s));
        }
        out.push_str("</ul></section>");
    }

    out.push_str("<section id=\"checks\"><h2>The twelve checks</h2><table><tr><th>#</th><th>check</th><th>status</th><th>what it found</th></tr>");
    for (i, c) in v.checks.iter().enumerate() {
        let st = status_text(c.status);
        let _ = write!(
            out,
            "<tr><td>{}</td><td><code>{}</code></td><td class=\"st-{}\">{st}</td><td>{}</td></tr>",
            i + 1,
            c.id.as_str(),
            st.replace(' ', "-"),
            html_text(&c.message)
        );
    }
    out.push_str("</table></section>");

    let t = &r.trust;
    let _ = write!(
        out,
        "<section id=\"trust\"><h2>Trust anchors</h2><table><tr><th>log origin</th><td><code>{}</code></td></tr><tr><th>witness key (log key)</th><td><code>{}</code></td></tr><tr><th>agent keys</th><td><code>{}</code>, SHA-256 <code>{}</code></td></tr>",
        html_text(&t.origin),
        html_text(&t.log_key),
        html_text(&t.agent_keys_file),
        html_text(&t.agent_keys_sha256)
    );
    if let Some(f) = &t.trust_file {
        let _ = write!(
            out,
            "<tr><th>trust file</th><td><code>{}</code></td></tr>",
            html_text(f)
        );
    }
    let _ = write!(
        out,
        "<tr><th>cosigners</th><td>{}</td></tr><tr><th>quorum</th><td>{}</td></tr><tr><th>head.json</th><td>{}</td></tr></table>",
        if t.cosigners.is_empty() {
            "none".to_owned()
        } else {
            t.cosigners
                .iter()
                .map(|c| format!("<code>{}</code>", html_text(c)))
                .collect::<Vec<_>>()
                .join("<br>")
        },
        t.quorum,
        t.head_file
            .as_deref()
            .map_or_else(|| "not given (check 11 not checked)".to_owned(), |h| format!("<code>{}</code>", html_text(h)))
    );
    let _ = write!(
        out,
        "<h2>Reproduce</h2><p>The same verification, from the same files:</p><pre>{}</pre></section>",
        html_text(&r.command)
    );
    let _ = writeln!(
        out,
        "<footer>tally {} · report format {} · pack SHA-256 <code>{}</code></footer></body></html>",
        html_text(&r.tally_version),
        r.v,
        html_text(&r.pack.sha256)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_schemas::audit::{AgentSection, AuditReport, CallRef, PackInfo, Period, TrustInfo};
    use tally_schemas::report::{
        CheckId, CheckResult, DisclosureCheck, DisclosureStatus, RecordRef, Report,
    };

    const HOSTILE: &str = "<script>alert(1)</script>\u{202e}\"'&";

    fn hostile_report() -> AuditReport {
        let checks = CheckId::ALL
            .iter()
            .map(|&id| CheckResult {
                id,
                status: if id == CheckId::Chain {
                    CheckStatus::Fail
                } else {
                    CheckStatus::Pass
                },
                message: format!("{HOSTILE}#3: does not link"),
                records: vec![RecordRef {
                    agent: HOSTILE.into(),
                    seq: 3,
                    index: None,
                }],
            })
            .collect();
        let verification = Report {
            v: 2,
            checks,
            coverage: vec![
                format!("{HOSTILE}: tool {HOSTILE} added at seq 1"),
                HOSTILE.into(),
            ],
            agents: Vec::new(),
            records: 4,
            result: Verdict::Fail,
            disclosures: vec![DisclosureCheck {
                file: HOSTILE.into(),
                agent: HOSTILE.into(),
                call_id: HOSTILE.into(),
                status: DisclosureStatus::Match,
                message: HOSTILE.into(),
                input_seq: Some(1),
                input: Some(serde_json::json!({"x": HOSTILE})),
                output_seq: None,
                output: None,
            }],
        };
        let call = CallRef {
            seq: 2,
            time: HOSTILE.into(),
            call_id: HOSTILE.into(),
            tool: Some(HOSTILE.into()),
            status: "error".into(),
        };
        let section = AgentSection {
            agent: HOSTILE.into(),
            first_seq: 0,
            last_seq: 3,
            records: 4,
            period_records: 4,
            first_time: None,
            last_time: None,
            calls: 1,
            chart: Some(Chart {
                start_ms: 0,
                bucket_ms: 1000,
                buckets: 1,
                records: vec![4],
                tools: vec![tally_schemas::audit::ToolSeries {
                    tool: Some(HOSTILE.into()),
                    calls: 1,
                    counts: vec![1],
                }],
            }),
            outcomes: Vec::new(),
            not_ok: vec![call.clone()],
            not_ok_more: 0,
            open: vec![call],
            open_more: 0,
            key_changes: Vec::new(),
            statements: Vec::new(),
            named_by_checks: Vec::new(),
        };
        let (agents, statements) = sections(&verification, vec![section]);
        AuditReport {
            v: 1,
            tally_version: "0".into(),
            generated: HOSTILE.into(),
            pack: PackInfo {
                file: HOSTILE.into(),
                sha256: "0".repeat(64),
                bytes: 1,
            },
            trust: TrustInfo {
                agent_keys_file: HOSTILE.into(),
                agent_keys_sha256: "0".repeat(64),
                origin: HOSTILE.into(),
                log_key: HOSTILE.into(),
                trust_file: Some(HOSTILE.into()),
                cosigners: vec![HOSTILE.into()],
                quorum: 1,
                head_file: Some(HOSTILE.into()),
            },
            period: Period {
                from: Some(HOSTILE.into()),
                to: None,
            },
            command: HOSTILE.into(),
            verification,
            agents,
            statements,
        }
    }

    #[test]
    fn every_string_from_a_pack_is_escaped_in_the_page() {
        let r = hostile_report();
        // The statement about the agent went to its section, the other to
        // the pack-wide list; the check's record to the agent.
        assert_eq!(
            r.agents[0].statements,
            vec![format!("tool {HOSTILE} added at seq 1")]
        );
        assert_eq!(r.statements, vec![HOSTILE.to_owned()]);
        assert_eq!(r.agents[0].named_by_checks.len(), 12);
        let html = render_html(&r);
        assert!(!html.contains("<script"), "a raw script tag");
        assert!(!html.contains('\u{202e}'), "a raw bidi override");
        assert!(html.contains(r"&lt;script&gt;alert(1)&lt;/script&gt;\u{202e}&quot;&#39;&amp;"));
        // The disclosed content: JSON, then escaped.
        assert!(
            html.contains(r#"{&quot;x&quot;:&quot;&lt;script&gt;"#),
            "{html}"
        );
        // Leads with the verdict and the failing check.
        let body = html.split_once("<body>").unwrap().1;
        assert!(body.starts_with(r#"<section id="verdict" class="fail"><h1>FAIL</h1>"#));
        assert!(body.contains(r#"<li><span class="st-fail">chain</span>"#));
    }
}
