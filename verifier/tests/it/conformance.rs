//! The conformance corpus (testdata/conformance/, docs/protocol.md §9–§12)
//! through the library: every case gives the report its expected.json
//! states (each check's status, the coverage lines, the records verified,
//! the result), or is refused before a report when it expects exit 2; and
//! the report does not depend on the memory budget of the sets that span
//! the pack (they spill to disk past it, src/spill.rs): a budget of one
//! item gives the same report as the default. The real binary is run over
//! the same corpus by the root package's tests/it/conformance.rs.

use crate::common;

use std::path::Path;

use serde_json::Value;
use tally_verifier::{verify, verify_with_budget, AuditOptions, Verification, VerifyOptions};

/// Runs a case; `None` when it is refused before a report (exit 2).
fn run(dir: &Path, budget: Option<usize>) -> Option<Verification> {
    let c = common::load(dir)?;
    let options = VerifyOptions {
        max_skew_ms: c.max_skew_ms,
        grace_ms: c.grace_ms,
        witnesses: c.witnesses.as_ref(),
        ..VerifyOptions::default()
    };
    if !c.disclosures.is_empty() {
        let audit = AuditOptions {
            disclosures: c.disclosures,
            ..AuditOptions::default()
        };
        return tally_verifier::audit(
            &c.pack[..],
            &c.keys,
            &c.log_key,
            c.head.as_ref(),
            options,
            audit,
        )
        .ok()
        .map(|a| a.verification);
    }
    match budget {
        None => verify(&c.pack[..], &c.keys, &c.log_key, c.head.as_ref(), options),
        Some(b) => verify_with_budget(
            &c.pack[..],
            &c.keys,
            &c.log_key,
            c.head.as_ref(),
            options,
            b,
        ),
    }
    .ok()
}

/// What differs from expected.json.
fn differences(v: Option<&Verification>, expected: &Value) -> Vec<String> {
    let Some(v) = v else {
        return if expected["exit"] == 2 {
            Vec::new()
        } else {
            vec!["refused before a report, expected one".into()]
        };
    };
    if expected["exit"] == 2 {
        return vec![format!(
            "a report, expected a usage error:\n{}",
            v.to_text()
        )];
    }
    let report = serde_json::to_value(&v.report).unwrap();
    let mut out = Vec::new();
    let statuses = |checks: &Value| -> Vec<(Value, Value)> {
        checks
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["id"].clone(), c["status"].clone()))
            .collect()
    };
    if statuses(&report["checks"]) != statuses(&expected["checks"]) {
        out.push(format!("statuses differ:\n{}", v.to_text()));
    }
    let disclosures = |v: &Value| -> Vec<(Value, Value)> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|d| (d["file"].clone(), d["status"].clone()))
            .collect()
    };
    if disclosures(&report["disclosures"]) != disclosures(&expected["disclosures"]) {
        out.push(format!(
            "disclosures: expected {}, got {}",
            expected["disclosures"], report["disclosures"]
        ));
    }
    for key in ["result", "coverage", "records"] {
        if report[key] != expected[key] {
            out.push(format!(
                "{key}: expected {}, got {}",
                expected[key], report[key]
            ));
        }
    }
    out
}

#[test]
fn every_case_gives_its_expected_report_at_any_memory_budget() {
    let dirs = common::case_dirs();
    let mut problems = Vec::new();
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let expected = common::json(dir, "expected.json");
        let default = run(dir, None);
        for p in differences(default.as_ref(), &expected) {
            problems.push(format!("{name}: {p}"));
        }
        let tiny = run(dir, Some(1));
        if tiny.as_ref().map(|v| &v.report) != default.as_ref().map(|v| &v.report) {
            problems.push(format!("{name}: a budget of one item changes the report"));
        }
    }
    assert!(dirs.len() >= 200, "only {} cases", dirs.len());
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

/// §11: a witnessed record named by a check is named with its `@index`.
/// The corpus does not compare named records yet; the records check 8
/// names for reusing a nonce are checked here, at any memory budget (the
/// index is found by a merge that spills like the nonce set).
#[test]
fn a_witnessed_record_named_for_reusing_a_nonce_comes_with_its_index() {
    for case in [
        "nonce-reused",
        "record-duplicated",
        "spliced-from-other-agent",
    ] {
        let dir = common::case_dirs()
            .into_iter()
            .find(|d| d.ends_with(case))
            .unwrap();
        for budget in [None, Some(1)] {
            let v = run(&dir, budget).unwrap();
            let receipts = v
                .report
                .checks
                .iter()
                .find(|c| c.id == tally_schemas::report::CheckId::Receipts)
                .unwrap();
            assert!(
                receipts.message.contains("nonce reused") && !receipts.records.is_empty(),
                "{case}: {}",
                v.to_text()
            );
            for r in &receipts.records {
                assert!(
                    r.index.is_some(),
                    "{case}: {}#{} without its index:\n{}",
                    r.agent,
                    r.seq,
                    v.to_text()
                );
            }
        }
    }
}
