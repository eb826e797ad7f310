//! Cases of `tool_check` records (protocol.md §5.7) and of the tool-check
//! lines of coverage (§11 after the table): a statement, never a failure;
//! a `tool_check` that breaks a §5.7 rule is refused as a record (check 1).

use serde_json::{json, Value};
use tally_schemas::record::{
    Body, CheckEffect, CheckException, CheckFinding, CheckObservation, CheckTrigger, ToolCheck,
    RECORD_SIGNATURE_DOMAIN,
};

use super::base::{case, finish, small, SMALL_COVERAGE};
use super::case::{Case, Expected};
use crate::fixture::digest;

fn finding(tool: Option<&str>, o: CheckObservation, e: CheckEffect) -> CheckFinding {
    CheckFinding {
        observation: o,
        effect: e,
        tool: tool.map(str::to_owned),
        parts: if o == CheckObservation::DescriptionChanged {
            vec!["description".to_owned()]
        } else {
            Vec::new()
        },
        exception: (e == CheckEffect::Exception).then(|| CheckException {
            by: "alice".to_owned(),
            until: "2030-01-01T00:00:00.000Z".to_owned(),
        }),
    }
}

fn check(findings: Vec<CheckFinding>) -> ToolCheck {
    let effect = findings
        .iter()
        .map(|f| f.effect)
        .max()
        .unwrap_or(CheckEffect::Proceed);
    let mut paused: Vec<String> = findings
        .iter()
        .filter(|f| f.effect == CheckEffect::PauseTool)
        .filter_map(|f| f.tool.clone())
        .collect();
    paused.sort();
    paused.dedup();
    ToolCheck {
        source: Some("claims".to_owned()),
        trigger: CheckTrigger::ListChanged,
        baseline: digest("lockfile"),
        policy: digest("policy"),
        offered: Some(digest("offered")),
        findings,
        effect,
        paused,
    }
}

/// A pack where claims-bot records `body` as signed JSON after an edit
/// that breaks a §5.7 rule; the record is pending, claimed by the header.
fn refused(edit: impl FnOnce(&mut Value)) -> super::case::Inputs {
    let mut fx = small();
    let draft = fx.draft(
        "claims-bot",
        Body::ToolCheck(check(vec![finding(
            Some("refund"),
            CheckObservation::DescriptionChanged,
            CheckEffect::PauseTool,
        )])),
    );
    let mut unsigned: Value =
        serde_json::from_slice(&draft.signing_bytes().expect("in range")).expect("JSON");
    edit(&mut unsigned["body"]);
    let sig = fx
        .agent_key("claims-bot")
        .sign(RECORD_SIGNATURE_DOMAIN, &super::base::canon(&unsigned));
    let mut record = unsigned;
    record["sig"] = json!(sig.to_base64());
    let line = super::base::canon(
        &json!({"type": "record", "record": record, "witnessed": null, "receipt": null}),
    );
    let mut inputs = finish(&mut fx);
    let mut l = super::base::Lines(super::cases_pack::split(&inputs.pack));
    let at = l.0.len() - 1;
    l.0.insert(at, line);
    l.set_last_seq("claims-bot", 1);
    l.bump_end(1, 0);
    inputs.pack = l.join();
    inputs
}

/// A failing case: name, rule, and the edit that breaks it.
type BadCase = (&'static str, &'static str, fn(&mut Value));

pub(super) fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let section = "§5.7, §11 coverage";
    {
        let mut fx = small();
        fx.log(
            "claims-bot",
            Body::ToolCheck(check(vec![
                finding(
                    Some("refund"),
                    CheckObservation::DescriptionChanged,
                    CheckEffect::PauseTool,
                ),
                finding(
                    Some("zap"),
                    CheckObservation::ToolAdded,
                    CheckEffect::PauseTool,
                ),
            ])),
        );
        fx.call("claims-bot", "1", "lookup_claim");
        out.push(case(
            "tool-check-pauses-tools",
            section,
            "An agent with tool_check records gets the tool-check lines: checks run, session stops, calls to tools not as approved (none here: the paused tools were not called), and the paused tools with their observations in byte order.",
            "claims-bot records a check pausing refund (description_changed) and zap (tool_added), then calls lookup_claim",
            finish(&mut fx),
            Expected::passing(
                true,
                &[
                    SMALL_COVERAGE[0],
                    "claims-bot: tool checks: 1 run, 0 paused or stopped the session; 0 calls to a tool not as approved, 0 calls under an approved exception",
                    "claims-bot: tool checks paused 2 tools: refund (description_changed), zap (tool_added)",
                ],
                4,
            ),
        ));
    }
    {
        let mut fx = small();
        fx.log(
            "claims-bot",
            Body::ToolCheck(check(vec![
                finding(
                    Some("lookup_claim"),
                    CheckObservation::SchemaChanged,
                    CheckEffect::Proceed,
                ),
                finding(
                    Some("refund"),
                    CheckObservation::DescriptionChanged,
                    CheckEffect::Exception,
                ),
                finding(
                    None,
                    CheckObservation::ServerVersionChanged,
                    CheckEffect::Proceed,
                ),
            ])),
        );
        fx.call("claims-bot", "1", "lookup_claim");
        fx.call("claims-bot", "2", "refund");
        fx.log(
            "claims-bot",
            Body::ToolCheck(check(vec![finding(
                None,
                CheckObservation::BaselineExpired,
                CheckEffect::PauseSession,
            )])),
        );
        fx.call("claims-bot", "3", "lookup_claim");
        out.push(case(
            "tool-check-counts-calls-not-as-approved",
            section,
            "A decision counts as a call to a tool not as approved when the latest check before it found that tool changed with an effect other than exception, and as under an approved exception when it is one; a source's later check replaces its earlier one.",
            "a check lets lookup_claim (schema_changed) proceed and refund (description_changed) proceed under an exception; both are called; a second check finds only the baseline expired and lookup_claim is called again",
            finish(&mut fx),
            Expected::passing(
                true,
                &[
                    "claims-bot: 1 recorded tool is not in the declared tool list: refund",
                    "claims-bot: tool checks: 2 run, 1 paused or stopped the session; 1 call to a tool not as approved, 1 call under an approved exception",
                ],
                9,
            ),
        ));
    }
    let bad: [BadCase; 4] = [
        (
            "tool-check-effect-not-the-strongest",
            "The record's effect must be the strongest of its findings' effects.",
            |b| b["effect"] = json!("proceed"),
        ),
        (
            "tool-check-pause-tool-for-the-whole-source",
            "pause_tool is only for an observation about one tool; a source-wide observation takes no tool name.",
            |b| {
                b["findings"] = json!([{"effect": "pause_tool", "observation": "baseline_expired"}]);
            },
        ),
        (
            "tool-check-exception-without-who",
            "An exception effect comes with its exception (who, until when), and only it.",
            |b| {
                b["findings"][0]["effect"] = json!("exception");
                b["effect"] = json!("exception");
                b["paused"] = json!([]);
            },
        ),
        (
            "tool-check-unknown-observation",
            "An observation outside §5.7's list is refused.",
            |b| b["findings"][0]["observation"] = json!("tool_renamed"),
        ),
    ];
    for (name, rule, edit) in bad {
        out.push(case(
            name,
            "§5.7, §11 check 1",
            rule,
            "claims-bot signs a tool_check that breaks the rule at seq 1, pending; the header claims it, so the chain then misses seq 1",
            refused(edit),
            Expected::passing(true, &SMALL_COVERAGE, 1).fail(&["schema", "chain"]),
        ));
    }
    out
}
