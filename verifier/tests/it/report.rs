//! The JSON report (schemas/json/report.schema.json, docs/protocol.md §11)
//! validates for passing, failing, pending and not-checked reports; pending
//! records and open decisions within the grace window are `pending`, not
//! `fail`; the benchmark's pack is valid.

use std::path::PathBuf;

use tally_schemas::report::{CheckId, CheckStatus, Verdict};
use tally_testkit::fixture::{self, decision, note, Fixture, PackSpec};
use tally_verifier::{verify, Verification, VerifyOptions};

fn schema() -> jsonschema::Validator {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../schemas/json/report.schema.json");
    let schema: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    jsonschema::validator_for(&schema).unwrap()
}

fn run(fx: &Fixture, spec: &PackSpec, head: bool) -> Verification {
    let pack = fixture::to_jsonl(&fx.pack_lines(spec));
    let h = fx.head(spec.size.unwrap_or(*fx.commits.last().unwrap()));
    verify(
        &pack[..],
        &fx.agent_keys(),
        fx.log.verifier(),
        head.then_some(&h),
        VerifyOptions::default(),
    )
    .unwrap()
}

fn status(v: &Verification, id: CheckId) -> CheckStatus {
    v.report.checks.iter().find(|c| c.id == id).unwrap().status
}

#[test]
fn pending_records_and_open_decisions_are_pending_and_the_report_validates() {
    let mut fx = Fixture::new("tally.local/log", "log");
    fx.add_agent("claims-bot", "claims-bot/1");
    fx.log("claims-bot", note("start"));
    fx.commit();
    let d = fx.make("claims-bot", decision("1", "refund"));
    fx.pending.push(d);
    let spec = PackSpec {
        created: Some(fx.now + 1000),
        ..PackSpec::default()
    };
    let v = run(&fx, &spec, false);
    let text = v.to_text();
    assert_eq!(v.report.result, Verdict::Pass, "{text}");
    assert_eq!(
        status(&v, CheckId::Receipts),
        CheckStatus::Pending,
        "{text}"
    );
    assert_eq!(
        status(&v, CheckId::Outcomes),
        CheckStatus::Pending,
        "{text}"
    );
    assert_eq!(status(&v, CheckId::Head), CheckStatus::NotChecked, "{text}");
    assert!(
        text.ends_with(
            "PASS: 12 checks, 9 pass, 2 pending, 1 not checked; 2 records from 1 agent\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("coverage: claims-bot: no tool list was declared"),
        "{text}"
    );
    let json = serde_json::to_value(&v.report).unwrap();
    assert!(schema().is_valid(&json), "{json}");

    // Beyond the grace window the open decision fails.
    let late = PackSpec {
        created: Some(fx.now + 301_000),
        ..PackSpec::default()
    };
    let v = run(&fx, &late, true);
    assert_eq!(
        status(&v, CheckId::Outcomes),
        CheckStatus::Fail,
        "{}",
        v.to_text()
    );
    assert!(schema().is_valid(&serde_json::to_value(&v.report).unwrap()));
}

#[test]
fn failing_reports_name_records_and_validate() {
    let mut fx = Fixture::new("tally.local/log", "log");
    fx.add_agent("a", "a/1");
    for i in 0..150 {
        fx.log("a", note(&format!("n{i}")));
    }
    fx.commit();
    let mut keys = fx.agent_keys();
    keys.agents.clear();
    let pack = fixture::to_jsonl(&fx.pack_lines(&PackSpec::default()));
    let v = verify(
        &pack[..],
        &keys,
        fx.log.verifier(),
        None,
        VerifyOptions::default(),
    )
    .unwrap();
    let c = v
        .report
        .checks
        .iter()
        .find(|c| c.id == CheckId::AgentKeys)
        .unwrap();
    assert_eq!(c.status, CheckStatus::Fail);
    assert_eq!(c.records.len(), 100, "at most 100 records named");
    assert!(c.message.starts_with("150 failed: a#0@0: agent-keys.json has no keys for agent a; get them from the operator (`tally keys export`)"), "{}", c.message);
    assert_eq!(
        status(&v, CheckId::RecordSignatures),
        CheckStatus::NotChecked
    );
    assert!(schema().is_valid(&serde_json::to_value(&v.report).unwrap()));
}
