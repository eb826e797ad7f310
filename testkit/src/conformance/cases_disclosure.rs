//! Cases of disclosure files (protocol.md §6.3): checked with
//! `--disclosure` against the record each part names; a match passes, a
//! changed byte of content or salt, a record of another call or kind, a
//! record or agent not in the pack, fail the run with every check passing;
//! a file that is not a disclosure is a usage error.

use serde_json::{json, Value};
use tally_schemas::hash::salted_hash;
use tally_schemas::record::{Body, Decision, Outcome, OutcomeStatus};

use super::base::{canon, case, finish, small, SMALL_COVERAGE};
use super::case::{Case, DisclosureCase, Expected};

const SALT_IN: [u8; 16] = [0xab; 16];
const SALT_OUT: [u8; 16] = [0x22; 16];

fn input() -> Value {
    json!({"claim": "C-17", "note": "<script>alert(1)</script> \u{202e}txt.exe"})
}

fn output() -> Value {
    json!({"content": [{"type": "text", "text": "claim C-17: open"}]})
}

/// claims-bot: its tool list (seq 0), call `c1` with salted hashes of
/// [`input`] and [`output`] (seq 1, 2), call `c2` cancelled without an
/// output (seq 3, 4).
fn inputs() -> super::case::Inputs {
    let mut fx = small();
    let d = fx.log(
        "claims-bot",
        Body::Decision(Decision {
            call_id: "c1".into(),
            tool: "lookup_claim".into(),
            input_hash: salted_hash(&SALT_IN, &canon(&input())),
        }),
    );
    fx.log(
        "claims-bot",
        Body::Outcome(Outcome {
            call_id: "c1".into(),
            decision: d.hash(),
            status: OutcomeStatus::Ok,
            output_hash: Some(salted_hash(&SALT_OUT, &canon(&output()))),
            state: None,
            proof: None,
            proof_hash: None,
        }),
    );
    let d2 = fx.log(
        "claims-bot",
        Body::Decision(Decision {
            call_id: "c2".into(),
            tool: "lookup_claim".into(),
            input_hash: salted_hash(&SALT_IN, &canon(&json!({}))),
        }),
    );
    fx.log(
        "claims-bot",
        Body::Outcome(Outcome {
            call_id: "c2".into(),
            decision: d2.hash(),
            status: OutcomeStatus::Cancelled,
            output_hash: None,
            state: None,
            proof: None,
            proof_hash: None,
        }),
    );
    finish(&mut fx)
}

/// The disclosure of `c1`, both parts.
fn disclosure() -> Value {
    json!({
        "v": 1,
        "agent": "claims-bot",
        "call_id": "c1",
        "input": {"seq": 1, "salt": hex::encode(SALT_IN), "content": input()},
        "output": {"seq": 2, "salt": hex::encode(SALT_OUT), "content": output()},
    })
}

fn file(v: &Value, status: &'static str) -> DisclosureCase {
    let mut bytes = serde_json::to_vec_pretty(v).expect("JSON");
    bytes.push(b'\n');
    DisclosureCase {
        file: "disclosure.json".into(),
        bytes,
        status,
    }
}

fn with(name: &str, rule: &str, description: &str, d: DisclosureCase) -> Case {
    with_all(name, rule, description, vec![d])
}

fn with_all(name: &str, rule: &str, description: &str, d: Vec<DisclosureCase>) -> Case {
    let mut c = case(
        name,
        "§6.3",
        rule,
        description,
        inputs(),
        Expected::passing(true, &SMALL_COVERAGE, 5),
    );
    c.disclosures = d;
    c
}

fn edited(f: impl FnOnce(&mut Value)) -> Value {
    let mut v = disclosure();
    f(&mut v);
    v
}

#[allow(clippy::too_many_lines)]
pub(super) fn cases() -> Vec<Case> {
    let mut out = vec![with(
        "disclosure-matches",
        "A disclosure whose every part recomputes, SHA-256(salt ‖ JCS(content)), to the salted hash of the record it names (a decision's input_hash, an outcome's output_hash, of the same call_id) matches, and the run passes.",
        "the input and output of claims-bot's call c1 (seq 1 and 2), with their salts",
        file(&disclosure(), "match"),
    )];
    let mut two = file(&disclosure(), "match");
    two.file = "disclosure-1.json".into();
    let mut only_input = file(
        &edited(|v| {
            v.as_object_mut().expect("object").remove("output");
        }),
        "match",
    );
    only_input.file = "disclosure-2.json".into();
    out.push(with_all(
        "disclosure-two-files",
        "Disclosures are checked one by one; a part may be disclosed alone.",
        "two disclosure files: c1 whole, and c1's input alone",
        vec![two, only_input],
    ));
    out.push(with(
        "disclosure-content-byte-changed",
        "A disclosure whose content differs from what was hashed by one byte does not match (mismatch), and the run fails though every check passes.",
        "c1's disclosure with the claim C-17 changed to C-18",
        file(
            &edited(|v| v["input"]["content"]["claim"] = "C-18".into()),
            "mismatch",
        ),
    ));
    out.push(with(
        "disclosure-salt-byte-changed",
        "A disclosure whose salt differs from the one hashed by one byte does not match.",
        "c1's disclosure with the output salt's first byte 0x22 changed to 0x23",
        file(
            &edited(|v| {
                v["output"]["salt"] = format!("23{}", "22".repeat(15)).into();
            }),
            "mismatch",
        ),
    ));
    out.push(with(
        "disclosure-another-call",
        "A part is checked only against the record it names, which must be of the disclosure's call_id.",
        "c1's disclosure naming seq 3, call c2's decision, for its input",
        file(&edited(|v| v["input"]["seq"] = 3.into()), "mismatch"),
    ));
    out.push(with(
        "disclosure-input-names-an-outcome",
        "An input part names a decision, an output part an outcome.",
        "c1's disclosure whose input names seq 2, c1's outcome",
        file(&edited(|v| v["input"]["seq"] = 2.into()), "mismatch"),
    ));
    out.push(with(
        "disclosure-outcome-without-output-hash",
        "An output part names an outcome with an output_hash; a call that ended without a result or error has nothing to disclose.",
        "an output part for call c2, cancelled without output_hash (seq 4)",
        file(
            &json!({
                "v": 1, "agent": "claims-bot", "call_id": "c2",
                "output": {"seq": 4, "salt": hex::encode(SALT_OUT), "content": {}},
            }),
            "mismatch",
        ),
    ));
    out.push(with(
        "disclosure-record-not-in-pack",
        "A disclosure naming a record that is not among the pack's verified records is not_in_pack, named, and fails the run.",
        "c1's input disclosed as seq 9, beyond the pack's claims-bot#0..4",
        file(
            &edited(|v| {
                v["input"]["seq"] = 9.into();
                v.as_object_mut().expect("object").remove("output");
            }),
            "not_in_pack",
        ),
    ));
    out.push(with(
        "disclosure-another-agent",
        "A disclosure is checked only against its own agent's records: one edited to name an agent the pack does not hold is not_in_pack.",
        "c1's disclosure with the agent changed to mail-bot, which the pack does not list",
        file(&edited(|v| v["agent"] = "mail-bot".into()), "not_in_pack"),
    ));
    let mut bad = case(
        "disclosure-malformed-salt",
        "§6.3",
        "A salt that is not 16 bytes of lowercase hex makes the file no disclosure file: a usage error.",
        "c1's disclosure with the input salt in uppercase hex",
        inputs(),
        Expected::UsageError,
    );
    bad.disclosures = vec![file(
        &edited(|v| v["input"]["salt"] = hex::encode_upper(SALT_IN).into()),
        "mismatch",
    )];
    out.push(bad);
    out
}
