//! The sets that span a whole pack (nonces, answered decisions, unmatched
//! outcomes) spill to a temporary file past a memory budget; the report must
//! not depend on the budget. A pack full of reused nonces, second outcomes
//! and orphans gives the same report with a budget of one item as with the
//! default (every case of the conformance corpus does too:
//! tests/it/conformance.rs).

use std::collections::BTreeMap;

use tally_schemas::record::OutcomeStatus;
use tally_schemas::report::{CheckId, CheckStatus};
use tally_testkit::fixture::{self, decision, outcome, Fixture, PackSpec};
use tally_verifier::{verify, verify_with_budget, Verification, VerifyOptions};

const TINY: usize = 1;

fn check(v: &Verification, id: CheckId) -> &tally_schemas::report::CheckResult {
    v.report.checks.iter().find(|c| c.id == id).unwrap()
}

#[test]
fn reused_nonces_and_second_or_orphan_outcomes_are_found_across_spilled_runs() {
    let mut fx = Fixture::new("tally.local/log", "log");
    let mut elsewhere = Fixture::new("tally.local/log", "log");
    elsewhere.add_agent("a", "a/1");
    elsewhere.skip_nonces(1 << 40);
    let agents = ["a", "b", "c"];
    for a in agents {
        fx.add_agent(a, &format!("{a}/1"));
    }
    let mut first_nonces: Vec<tally_schemas::Nonce> = Vec::new();
    for i in 0..120 {
        let a = agents[i % 3];
        let call = format!("c{i}");
        if i % 6 == 5 {
            // A decision whose nonce another agent already used.
            let mut d = fx.draft(a, decision(&call, "refund"));
            d.nonce = first_nonces[i / 2].clone();
            let d = fx.sign(d, None);
            fx.append(d.clone(), None);
            fx.tick(1000);
            fx.log(a, outcome(&call, &d, OutcomeStatus::Ok));
        } else {
            let (d, _) = fx.call(a, &call, "refund");
            first_nonces.push(d.nonce.clone());
            if i % 10 == 3 {
                // A second outcome for an answered decision.
                fx.log(a, outcome(&call, &d, OutcomeStatus::Error));
            }
        }
        if i % 15 == 7 {
            // An orphan: its decision is in no pack.
            let gone = elsewhere.make("a", decision("x", "refund"));
            fx.log(a, outcome("x", &gone, OutcomeStatus::Ok));
        }
    }
    fx.commit();
    let keys = fx.agent_keys();
    let whole = PackSpec::default();
    // A pack that starts mid-chain for one agent: some outcomes there name
    // decisions before the anchor and cannot be judged.
    let last = |a: &str| {
        fx.entries
            .iter()
            .filter(|e| e.record.agent.as_str() == a)
            .map(|e| e.record.seq.get())
            .max()
            .unwrap()
    };
    let mid = PackSpec {
        ranges: Some(BTreeMap::from([
            ("a".to_owned(), (0, last("a"))),
            ("b".to_owned(), (31, last("b"))),
            ("c".to_owned(), (0, last("c"))),
        ])),
        ..PackSpec::default()
    };
    // All orphans are b's; in the mid-chain pack b is anchored, so they
    // cannot be judged there and only the second outcomes fail.
    for (spec, reused, outcomes_failed) in [
        (whole, "20 failed: ", "16 failed: "),
        (mid, "", "7 failed: "),
    ] {
        let pack = fixture::to_jsonl(&fx.pack_lines(&spec));
        let run = |budget: usize| {
            verify_with_budget(
                &pack[..],
                &keys,
                fx.log.verifier(),
                None,
                VerifyOptions::default(),
                budget,
            )
            .unwrap()
        };
        let default = verify(
            &pack[..],
            &keys,
            fx.log.verifier(),
            None,
            VerifyOptions::default(),
        )
        .unwrap();
        for budget in [TINY, 40, 1000] {
            assert_eq!(run(budget).report, default.report, "budget {budget}");
        }
        let receipts = check(&default, CheckId::Receipts);
        assert_eq!(receipts.status, CheckStatus::Fail);
        assert!(
            receipts.message.starts_with(reused)
                && receipts.message.contains("nonce reused: already used by"),
            "{}",
            receipts.message
        );
        let outcomes = check(&default, CheckId::Outcomes);
        assert_eq!(outcomes.status, CheckStatus::Fail);
        assert!(
            outcomes.message.starts_with(outcomes_failed)
                && outcomes.message.contains("a second outcome for decision"),
            "{}",
            outcomes.message
        );
        assert_eq!(
            outcomes.message.contains("orphan outcome"),
            outcomes_failed == "16 failed: ",
            "{}",
            outcomes.message
        );
    }
}
