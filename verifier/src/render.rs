//! The text form of a report, docs/protocol.md §11: one line per check, then
//! the coverage lines, then the result line. Messages and coverage lines
//! carry names from agents and MCP servers, so their bidirectional controls
//! and other invisible characters are escaped (§11.2); the JSON report
//! keeps them as they are.

use std::fmt::Write as _;

use tally_schemas::display::escape;
use tally_schemas::report::{CheckStatus, DisclosureStatus, Report, Verdict};

/// The status as printed.
fn status_text(s: CheckStatus) -> &'static str {
    match s {
        CheckStatus::Pass => "pass",
        CheckStatus::Fail => "fail",
        CheckStatus::Pending => "pending",
        CheckStatus::NotChecked => "not checked",
    }
}

/// The result line: `PASS: 12 checks, …` or `FAIL: <f> of 12 checks failed …`.
#[must_use]
pub fn result_line(report: &Report, agents: usize) -> String {
    let count = |s| report.checks.iter().filter(|c| c.status == s).count();
    let tail = format!(
        "{} record{} from {agents} agent{}",
        report.records,
        if report.records == 1 { "" } else { "s" },
        if agents == 1 { "" } else { "s" }
    );
    match report.result {
        Verdict::Pass => format!(
            "PASS: {} checks, {} pass, {} pending, {} not checked; {tail}",
            report.checks.len(),
            count(CheckStatus::Pass),
            count(CheckStatus::Pending),
            count(CheckStatus::NotChecked)
        ),
        Verdict::Fail => {
            let ids: Vec<&str> = report
                .checks
                .iter()
                .filter(|c| c.status == CheckStatus::Fail)
                .map(|c| c.id.as_str())
                .collect();
            let bad = report
                .disclosures
                .iter()
                .filter(|d| d.status != DisclosureStatus::Match)
                .count();
            let disclosures = if bad == 0 {
                String::new()
            } else {
                format!(
                    "; {bad} of {} disclosure{} did not check",
                    report.disclosures.len(),
                    if report.disclosures.len() == 1 {
                        ""
                    } else {
                        "s"
                    }
                )
            };
            format!(
                "FAIL: {} of {} checks failed ({}){disclosures}; {tail}",
                ids.len(),
                report.checks.len(),
                ids.join(", ")
            )
        }
    }
}

/// The report as `tally verify` prints it. `agents` is the number of agents
/// in the pack's header (the report counts records, not agents).
#[must_use]
pub fn render_text(report: &Report, agents: usize) -> String {
    let mut out = String::new();
    for c in &report.checks {
        let _ = writeln!(
            out,
            "{}: {}: {}",
            c.id.as_str(),
            status_text(c.status),
            escape(&c.message)
        );
    }
    for line in &report.coverage {
        let _ = writeln!(out, "coverage: {}", escape(line));
    }
    for d in &report.disclosures {
        let _ = writeln!(
            out,
            "disclosure: {}: {}: {}",
            escape(&d.file),
            d.status.as_str(),
            escape(&d.message)
        );
        for (what, content) in [("input", &d.input), ("output", &d.output)] {
            if let Some(c) = content {
                // Canonical JSON (§2) on one line; JSON escapes the
                // controls, and escape() what JSON leaves raw (§11.2).
                let json = tally_schemas::canonical::canonicalize(c)
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                let _ = writeln!(
                    out,
                    "disclosure: {}: {what}: {}",
                    escape(&d.file),
                    escape(&json)
                );
            }
        }
    }
    let _ = writeln!(out, "{}", result_line(report, agents));
    out
}
