//! Cases of checks 9 (`timing`) and 10 (`outcomes`), protocol.md §11, with
//! the `--max-skew` and `--grace` options.

use tally_schemas::record::{Body, Outcome, OutcomeStatus};

use super::base::{call, case, finish, finish_with, small, SMALL_COVERAGE};
use super::case::{Case, Expected};
use crate::fixture::{self, decision, note, outcome, PackSpec};

fn expected(records: u64) -> Expected {
    Expected::passing(true, &SMALL_COVERAGE, records)
}

#[allow(clippy::too_many_lines)]
pub(super) fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let t9 = "§11 check 9";
    let t10 = "§11 check 10";

    // The result line's counts (§11): `1 record from 1 agent`, singular.
    out.push(case(
        "one-record-from-one-agent",
        "§11, the result line",
        "The result line counts records and agents in the singular when there is one: `PASS: ...; 1 record from 1 agent`.",
        "a pack of one agent's one record, its tool list",
        finish(&mut small()),
        expected(1),
    ));

    // --- check 9 -------------------------------------------------------------
    let skewed = |skew_ms: i64| {
        let mut fx = small();
        let d = fx.make("claims-bot", decision("1", "lookup_claim"));
        let t = d.time.as_millis();
        fx.append(d.clone(), Some(t + skew_ms));
        fx.tick(skew_ms + 1000);
        fx.log("claims-bot", outcome("1", &d, OutcomeStatus::Ok));
        finish(&mut fx)
    };
    out.push(case(
        "time-skew",
        t9,
        "For every witnessed record |received − time| ≤ S (default 300 s); beyond it, timing fails.",
        "a decision is received 301 s after the agent's time",
        skewed(301_000),
        expected(3).fail(&["timing"]),
    ));
    out.push(case(
        "time-skew-exactly-the-bound",
        t9,
        "Equality passes: a record received exactly S after its time is within the bound.",
        "a decision is received exactly 300 s after the agent's time",
        skewed(300_000),
        expected(3),
    ));
    {
        let mut i = skewed(301_000);
        i.max_skew = 302;
        out.push(case(
            "time-skew-within-a-larger-bound",
            t9,
            "S is the --max-skew option (seconds): a record 301 s off passes a bound of 302 s.",
            "a decision is received 301 s after the agent's time, verified with --max-skew 302",
            i,
            expected(3),
        ));
    }
    {
        let mut fx = small();
        call(&mut fx, "1");
        let r = fx.make("claims-bot", note("late"));
        let back = fx.now - 10_000;
        fx.append(r, Some(back));
        fx.tick(1000);
        out.push(case(
            "received-goes-backwards",
            t9,
            "received never decreases in log order, which is pack order: each witnessed record's received is at least every received before it.",
            "the log gives an entry a receive time 10 s before the previous entry's",
            finish(&mut fx),
            expected(4).fail(&["timing"]),
        ));
    }
    {
        let mut fx = small();
        let d = fx.log("claims-bot", decision("1", "lookup_claim"));
        fx.tick(-1500);
        let o = fx.make("claims-bot", outcome("1", &d, OutcomeStatus::Ok));
        fx.append(o, Some(d.time.as_millis() + 100));
        fx.tick(10_000);
        out.push(case(
            "outcome-time-before-its-decision",
            t9,
            "An outcome's time is not before its decision's.",
            "an outcome's agent time is 500 ms before its decision's",
            finish(&mut fx),
            expected(3).fail(&["timing"]),
        ));
    }
    {
        let mut fx = small();
        let d = fx.make("claims-bot", decision("1", "lookup_claim"));
        fx.tick(100);
        let o = fx.make("claims-bot", outcome("1", &d, OutcomeStatus::Ok));
        // The log received them in order but wrote the outcome's time first.
        fx.append(d.clone(), Some(d.time.as_millis() + 500));
        fx.append(o.clone(), Some(o.time.as_millis() + 300));
        fx.tick(10_000);
        out.push(case(
            "outcome-received-before-its-decision",
            t9,
            "An outcome's received is not before its decision's (nor, in log order, before any earlier entry's).",
            "an outcome is received 100 ms before its decision, though logged after it",
            finish(&mut fx),
            expected(3).fail(&["timing"]),
        ));
    }

    // --- check 10 ------------------------------------------------------------
    {
        let mut fx = small();
        call(&mut fx, "1");
        fx.log(
            "claims-bot",
            Body::Outcome(Outcome {
                call_id: "9".into(),
                decision: fixture::digest("a decision that never was"),
                status: OutcomeStatus::Ok,
                output_hash: None,
                state: None,
                proof: None,
                proof_hash: None,
            }),
        );
        out.push(case(
            "orphan-outcome",
            t10,
            "No outcome names a decision that is absent from a pack that starts at genesis.",
            "an outcome names a decision that is not in the chain",
            finish(&mut fx),
            expected(4).fail(&["outcomes"]),
        ));
    }
    {
        let mut fx = small();
        let d = fx.log("claims-bot", decision("1", "lookup_claim"));
        fx.log("claims-bot", outcome("1", &d, OutcomeStatus::Ok));
        fx.log("claims-bot", outcome("1", &d, OutcomeStatus::Error));
        out.push(case(
            "two-outcomes-one-decision",
            t10,
            "Every decision has exactly one outcome: a second outcome for an answered decision fails.",
            "a decision gets a second outcome",
            finish(&mut fx),
            expected(4).fail(&["outcomes"]),
        ));
    }
    {
        let mut fx = small();
        let d1 = fx.log("claims-bot", decision("1", "lookup_claim"));
        fx.log("claims-bot", decision("2", "lookup_claim"));
        fx.log("claims-bot", outcome("2", &d1, OutcomeStatus::Ok));
        out.push(case(
            "outcome-names-a-decision-of-another-call-id",
            t10,
            "An outcome whose decision names an open decision of the agent with another call_id fails outcomes (both decisions stay open), and record_hashes, since it equals no open decision with its own call_id.",
            "decisions 1 and 2 are open; an outcome with call_id 2 names decision 1",
            finish(&mut fx),
            expected(4).fail(&["record_hashes", "outcomes"]),
        ));
    }
    {
        let mut fx = small();
        call(&mut fx, "1");
        call(&mut fx, "1");
        out.push(case(
            "call-id-reused-after-its-outcome",
            t10,
            "call_ids may repeat along a chain, as MCP request ids do: an outcome answers the open decision with its call_id.",
            "call_id 1 is used for two calls, one after the other",
            finish(&mut fx),
            expected(5),
        ));
    }
    let open_decision = |age_ms: i64| {
        let mut fx = small();
        let d = fx.log("claims-bot", decision("1", "lookup_claim"));
        fx.log("claims-bot", note("moving on"));
        fx.commit();
        let spec = PackSpec {
            created: Some(d.time.as_millis() + age_ms),
            ..PackSpec::default()
        };
        (fx.clone(), finish_with(&fx, &spec))
    };
    out.push(case(
        "decision-without-outcome-beyond-grace",
        t10,
        "A decision without an outcome fails when created − time > G (default 300 s).",
        "a decision has no outcome, made 300.001 s before the pack",
        open_decision(300_001).1,
        expected(3).fail(&["outcomes"]),
    ));
    out.push(case(
        "decision-without-outcome-exactly-grace",
        t10,
        "A decision without an outcome is pending when created − time ≤ G: equality is within the window.",
        "a decision has no outcome, made exactly 300 s before the pack",
        open_decision(300_000).1,
        expected(3).pending(&["outcomes"]),
    ));
    {
        let (_, mut i) = open_decision(600_000);
        i.grace = 601;
        out.push(case(
            "decision-without-outcome-within-a-larger-grace",
            t10,
            "G is the --grace option (seconds).",
            "a decision has no outcome, made 600 s before the pack, verified with --grace 601",
            i,
            expected(3).pending(&["outcomes"]),
        ));
    }
    out.push(case(
        "decision-after-the-pack-was-made",
        t10,
        "A decision whose time is after the pack's created counts as within the grace window: pending.",
        "a decision has no outcome; the pack says it was made 5 s before the decision",
        open_decision(-5_000).1,
        expected(3).pending(&["outcomes"]),
    ));
    out
}
