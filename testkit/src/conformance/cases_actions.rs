//! Cases of action outcomes and claims (protocol.md §5.2 "Action outcomes",
//! §5.6, §11 the action statement): the statement is a statement, never a
//! failure, so the passing cases test its lines; the failing ones are
//! outcomes whose action members break §5.2, refused by check 1.

use serde_json::{json, Value};
use tally_schemas::record::{ActionState, Body, Claim, Outcome, OutcomeStatus};

use super::base::{canon, case, finish, join, value, ORIGIN};
use super::case::{Case, Expected, Inputs};
use crate::fixture::{decision, digest, tool, tools, Fixture};

const ALL_RECORDED: &str = "claims-bot: all 2 declared tools are recorded";

/// claims-bot, which declared `lookup_claim` and the action tool
/// `send_email`.
fn fx() -> Fixture {
    let mut fx = Fixture::new(ORIGIN, "log");
    fx.add_agent("claims-bot", "claims-bot/1");
    fx.log(
        "claims-bot",
        tools(
            "t",
            vec![
                tool("lookup_claim", true, "v1"),
                tool("send_email", true, "v1"),
            ],
        ),
    );
    fx
}

/// A call of `tool_name` whose outcome has `status`, `state` and proof.
fn action(
    fx: &mut Fixture,
    call_id: &str,
    tool_name: &str,
    status: OutcomeStatus,
    state: Option<ActionState>,
    proof: (Option<&str>, bool),
) {
    let d = fx.log("claims-bot", decision(call_id, tool_name));
    fx.log(
        "claims-bot",
        Body::Outcome(Outcome {
            call_id: call_id.to_owned(),
            decision: d.hash(),
            status,
            output_hash: Some(digest(&format!("output {call_id}"))),
            state,
            proof: proof.0.map(str::to_owned),
            proof_hash: proof.1.then(|| digest(&format!("proof {call_id}"))),
        }),
    );
}

fn claim(fx: &mut Fixture, tool_name: &str, turn: &str) {
    fx.log(
        "claims-bot",
        Body::Claim(Claim {
            tool: tool_name.to_owned(),
            turn_hash: digest(turn),
        }),
    );
}

/// The pack of `inputs` with the body of its one outcome that has `state`
/// changed by `edit` (the signature no longer matches; check 1 refuses the
/// record before any other check sees it).
fn edit_action(mut inputs: Inputs, edit: &dyn Fn(&mut Value)) -> Inputs {
    let lines: Vec<Vec<u8>> = inputs
        .pack
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            let mut v = value(l);
            if v["record"]["body"].get("state").is_some() {
                edit(&mut v["record"]["body"]);
                canon(&v)
            } else {
                l.to_vec()
            }
        })
        .collect();
    inputs.pack = join(&lines);
    inputs
}

#[allow(clippy::too_many_lines)]
pub(super) fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let section = "§5.2, §5.6, §11 the action statement";
    {
        let mut f = fx();
        f.call("claims-bot", "1", "lookup_claim");
        let ok = OutcomeStatus::Ok;
        action(
            &mut f,
            "2",
            "send_email",
            ok,
            Some(ActionState::Posted),
            (None, true),
        );
        action(
            &mut f,
            "3",
            "send_email",
            ok,
            Some(ActionState::Posted),
            (Some("msg-0042"), false),
        );
        action(
            &mut f,
            "4",
            "send_email",
            ok,
            Some(ActionState::Unknown),
            (None, false),
        );
        action(
            &mut f,
            "5",
            "send_email",
            OutcomeStatus::Timeout,
            Some(ActionState::Unknown),
            (None, false),
        );
        action(
            &mut f,
            "6",
            "send_email",
            OutcomeStatus::Error,
            Some(ActionState::Failed),
            (None, false),
        );
        out.push(case(
            "action-outcomes-stated",
            section,
            "Per agent, after coverage, the action statement counts the outcomes by state (posted with proof or proof_hash, unknown with any status, failed with a status other than ok) and says when there is no claim; an outcome without state is not counted. It never fails a check.",
            "claims-bot calls lookup_claim once and the action tool send_email five times: posted with a proof hash, posted with the proof in clear, unknown (ok, no proof), unknown (timeout), failed (error)",
            finish(&mut f),
            Expected::passing(
                true,
                &[
                    ALL_RECORDED,
                    "claims-bot: action calls: 2 posted, 2 unknown, 1 failed",
                    "claims-bot: no claim without a call",
                ],
                13,
            ),
        ));
    }
    {
        let mut f = fx();
        claim(&mut f, "send_email", "I've sent the email to the customer");
        action(
            &mut f,
            "1",
            "send_email",
            OutcomeStatus::Ok,
            Some(ActionState::Posted),
            (None, true),
        );
        claim(&mut f, "send_email", "Done, the email is sent");
        out.push(case(
            "claim-without-call-stated",
            section,
            "claim records are named in pack order, `<tool> at seq <k>`, in the statement's second line; a claim never fails a check.",
            "claims-bot records a claim of send_email at seq 1, a posted send_email call, and a second claim at seq 4",
            finish(&mut f),
            Expected::passing(
                true,
                &[
                    ALL_RECORDED,
                    "claims-bot: action calls: 1 posted, 0 unknown, 0 failed",
                    "claims-bot: 2 claims without a call: send_email at seq 1, send_email at seq 4",
                ],
                5,
            ),
        ));
    }
    {
        let mut f = fx();
        claim(&mut f, "send_email", "I've sent the email to the customer");
        out.push(case(
            "claim-only-stated",
            section,
            "An agent with a claim and no action outcome has the statement, with 0 calls of each state.",
            "claims-bot records one claim of send_email at seq 1 and nothing else",
            finish(&mut f),
            Expected::passing(
                true,
                &[
                    ALL_RECORDED,
                    "claims-bot: action calls: 0 posted, 0 unknown, 0 failed",
                    "claims-bot: 1 claim without a call: send_email at seq 1",
                ],
                2,
            ),
        ));
    }

    // --- outcomes §5.2 refuses: check 1 --------------------------------------
    // The refused outcome is claims-bot's last record: the chain misses its
    // last seq, and its decision, without an outcome and within the grace
    // window, is pending.
    let refused = |name: &str,
                   rule: &str,
                   description: &str,
                   status: OutcomeStatus,
                   state: ActionState,
                   edit: &dyn Fn(&mut Value)| {
        let mut f = fx();
        action(
            &mut f,
            "1",
            "send_email",
            status,
            Some(state),
            (None, state == ActionState::Posted),
        );
        case(
            name,
            "§3, §5.2, §11 check 1",
            rule,
            description,
            edit_action(finish(&mut f), edit),
            Expected::passing(true, &[ALL_RECORDED], 2)
                .fail(&["schema", "chain"])
                .pending(&["outcomes"]),
        )
    };
    out.push(refused(
        "outcome-posted-without-proof",
        "state posted needs exactly one of proof and proof_hash: a posted outcome with neither fails check 1.",
        "claims-bot#2, a posted outcome, loses its proof_hash",
        OutcomeStatus::Ok,
        ActionState::Posted,
        &|body| {
            body.as_object_mut().expect("body").remove("proof_hash");
        },
    ));
    out.push(refused(
        "outcome-posted-with-both-proofs",
        "state posted needs exactly one of proof and proof_hash: a posted outcome with both fails check 1.",
        "claims-bot#2, a posted outcome with a proof_hash, gains \"proof\": \"msg-1\"",
        OutcomeStatus::Ok,
        ActionState::Posted,
        &|body| body["proof"] = json!("msg-1"),
    ));
    out.push(refused(
        "outcome-posted-with-status-error",
        "posted is allowed only with status ok: a posted outcome with status error fails check 1.",
        "claims-bot#2, a posted outcome, has its status changed to error",
        OutcomeStatus::Ok,
        ActionState::Posted,
        &|body| body["status"] = json!("error"),
    ));
    out.push(refused(
        "outcome-failed-with-status-ok",
        "failed is not allowed with status ok: a failed outcome with status ok fails check 1.",
        "claims-bot#2, a failed outcome, has its status changed to ok",
        OutcomeStatus::Error,
        ActionState::Failed,
        &|body| body["status"] = json!("ok"),
    ));
    out.push(refused(
        "outcome-proof-without-state",
        "proof and proof_hash are allowed only with state posted: an outcome with a proof_hash and no state fails check 1.",
        "claims-bot#2, a posted outcome, loses its state",
        OutcomeStatus::Ok,
        ActionState::Posted,
        &|body| {
            body.as_object_mut().expect("body").remove("state");
        },
    ));
    out.push(refused(
        "outcome-unknown-with-proof",
        "proof and proof_hash are allowed only with state posted: an unknown outcome with a proof fails check 1.",
        "claims-bot#2, an unknown outcome, gains \"proof\": \"msg-1\"",
        OutcomeStatus::Ok,
        ActionState::Unknown,
        &|body| body["proof"] = json!("msg-1"),
    ));
    out.push(refused(
        "outcome-state-not-a-state",
        "state is one of posted, unknown, failed: \"sent\" fails check 1.",
        "claims-bot#2, an unknown outcome, has its state changed to sent",
        OutcomeStatus::Ok,
        ActionState::Unknown,
        &|body| body["state"] = json!("sent"),
    ));
    out.push(refused(
        "outcome-proof-control-character",
        "proof is text: 1–256 bytes of UTF-8 with no control character; one with U+0007 fails check 1.",
        "claims-bot#2, a posted outcome, has its proof_hash replaced by \"proof\": \"msg\\u0007\"",
        OutcomeStatus::Ok,
        ActionState::Posted,
        &|body| {
            let b = body.as_object_mut().expect("body");
            b.remove("proof_hash");
            b.insert("proof".into(), json!("msg\u{7}"));
        },
    ));
    out
}
