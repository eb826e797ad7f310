//! Cases of head.json (protocol.md §9.4) and check 11 (`head`).

use serde_json::json;
use tally_schemas::note::Checkpoint;
use tally_schemas::pack::{Head, HeadAgent, Witnessed};
use tally_schemas::tree::{LeafIndex, TreeSize};

use super::base::{canon, case, finish_with, small, Base, BASE_RECORDS};
use super::case::Inputs;
use super::case::{Case, Expected};
use crate::fixture::{self, note, Fixture, PackSpec};

/// The head.json of `fx` with `agent`'s record replaced by its record at
/// `seq`, proven in the head's checkpoint.
fn head_with(fx: &Fixture, head: &Head, agent: &str, seq: u64) -> Head {
    let size = *fx.commits.last().expect("commit");
    let e = fx
        .entries
        .iter()
        .find(|e| e.record.agent.as_str() == agent && e.record.seq.get() == seq)
        .expect("logged");
    let mut h = head.clone();
    for a in &mut h.agents {
        if a.record.agent.as_str() == agent {
            *a = HeadAgent {
                record: e.record.clone(),
                witnessed: Witnessed {
                    index: LeafIndex::new(e.index),
                    received: e.received,
                    inclusion: fx.inclusion(e.index, size),
                },
            };
        }
    }
    h
}

#[allow(clippy::too_many_lines)]
pub(super) fn cases(b: &Base) -> Vec<Case> {
    let mut out = Vec::new();
    let pack = b.lines().join();
    let c11 = "§11 check 11";
    let mut with_head = |name: &str, section, rule: &str, description: &str, head: Vec<u8>, e| {
        let mut i = b.inputs(pack.clone());
        i.head = Some(head);
        out.push(case(name, section, rule, description, i, e));
    };
    let fail = || b.passing().fail(&["head"]);
    let json = |h: &Head| fixture::to_json(h);

    {
        let mut h = b.head.clone();
        h.consistency.pop();
        with_head(
            "head-consistency-truncated",
            c11,
            "The head checkpoint extends the pack's: consistency proves it (RFC 9162 §2.1.4.2).",
            "head.json's consistency proof loses a hash",
            json(&h),
            fail(),
        );
    }
    {
        let mut other = b.fx.clone();
        other.log = fixture::log_signer(super::base::ORIGIN, "impostor-log");
        with_head(
            "head-foreign-key",
            c11,
            "The head checkpoint verifies with the pinned key; a well-formed checkpoint of another key fails check 11 (not a usage error).",
            "head.json's checkpoint is signed by another key",
            json(&other.head(b.pack_size)),
            fail(),
        );
    }
    {
        let mut h = b.head.clone();
        h.agents.retain(|a| a.record.agent.as_str() != "mail-bot");
        with_head(
            "head-missing-agent",
            c11,
            "Every pack agent appears in head.json.",
            "head.json has no record for mail-bot",
            json(&h),
            fail(),
        );
    }
    with_head(
        "head-older-than-the-pack",
        c11,
        "h < w fails: the head is older than the pack (w is the pack's highest witnessed seq of the agent).",
        "head.json's claims-bot record is claims-bot#5, the pack holds claims-bot#8 witnessed",
        json(&head_with(&b.fx, &b.head, "claims-bot", 5)),
        fail(),
    );
    {
        let mut h = b.head.clone();
        h.from_size = TreeSize::new(b.pack_size - 1);
        h.consistency =
            b.fx.consistency(b.pack_size - 1, *b.fx.commits.last().expect("commit"));
        with_head(
            "head-from-size-not-the-pack-size",
            c11,
            "from_size equals the pack checkpoint's size.",
            "head.json proves consistency from size 14 instead of the pack's 15",
            json(&h),
            fail(),
        );
    }
    {
        // A split view: the log signed a checkpoint of the pack's size over
        // another tree, and head.json carries it.
        let mut forked = Fixture::new(super::base::ORIGIN, "log");
        forked.add_agent("claims-bot", "claims-bot/1");
        for _ in 0..b.pack_size {
            forked.log("claims-bot", note("a different history"));
        }
        let mut h = b.head.clone();
        h.checkpoint = forked.checkpoint(b.pack_size);
        h.consistency = Vec::new();
        with_head(
            "head-splits-the-view",
            "§11 checks 11 and 12",
            "No two checkpoints of one size have different roots, the head's included; the head then proves nothing.",
            "head.json's checkpoint has the pack's size and another root, signed by the log",
            json(&h),
            b.passing().fail(&["head", "log_consistency"]),
        );
    }

    // --- head.json refused as a whole (exit 2) ----------------------------
    let usage = |name: &str, rule: &str, description: &str, head: Vec<u8>| {
        let mut i = b.inputs(pack.clone());
        i.head = Some(head);
        case(name, "§9.4", rule, description, i, Expected::UsageError)
    };
    let head_value = serde_json::to_value(&b.head).expect("serialisable");
    let edited = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = head_value.clone();
        f(&mut v);
        canon(&v)
    };
    out.push(usage(
        "head-checkpoint-malformed",
        "A head.json whose checkpoint is not a signed note is refused as a whole (usage error, exit 2), like agent-keys.json.",
        "head.json's checkpoint is the text \"junk\"",
        edited(&|v| v["checkpoint"] = json!("junk")),
    ));
    out.push(usage(
        "head-checkpoint-over-8192-bytes",
        "head.json's checkpoint is at most 8,192 bytes.",
        "head.json's checkpoint carries an unknown signature line that takes it over 8,192 bytes",
        edited(&|v| {
            let note = v["checkpoint"].as_str().expect("note").to_owned();
            let line = {
                use base64::Engine as _;
                format!(
                    "\u{2014} w {}\n",
                    base64::engine::general_purpose::STANDARD.encode([1u8; 8000])
                )
            };
            v["checkpoint"] = json!(format!("{note}{line}"));
        }),
    ));
    out.push(usage(
        "head-checkpoint-body-malformed",
        "head.json's checkpoint body follows §7.4 (here: a size with a leading zero, signed by the log).",
        "head.json's checkpoint is a signed note whose size line is 018",
        edited(&|v| {
            let note = v["checkpoint"].as_str().expect("note");
            let cp = tally_schemas::note::peek_checkpoint(note).expect("checkpoint");
            let root = {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD.encode(cp.root.as_bytes())
            };
            let text = format!("{}\n0{}\n{root}\n", cp.origin, cp.size);
            v["checkpoint"] = json!(b.fx.log.sign_note(&text).expect("note text"));
        }),
    ));
    out.push(usage(
        "head-consistency-over-64-hashes",
        "head.json's consistency proof holds at most 64 hashes.",
        "head.json's consistency proof is padded to 65 hashes",
        edited(&|v| {
            let p = v["consistency"].as_array_mut().expect("proof");
            while p.len() < 65 {
                p.push(json!(fixture::digest("pad").to_hex()));
            }
        }),
    ));
    out.push(usage(
        "head-inclusion-over-64-hashes",
        "A head record's inclusion proof holds at most 64 hashes.",
        "claims-bot's inclusion proof in head.json is padded to 65 hashes",
        edited(&|v| {
            let p = v["agents"][0]["witnessed"]["inclusion"]
                .as_array_mut()
                .expect("proof");
            while p.len() < 65 {
                p.push(json!(fixture::digest("pad").to_hex()));
            }
        }),
    ));
    out.push(usage(
        "head-duplicate-agent",
        "head.json lists each agent at most once.",
        "claims-bot's record is listed twice",
        edited(&|v| {
            let a = v["agents"].as_array_mut().expect("agents");
            let again = a[0].clone();
            a.push(again);
        }),
    ));
    out.push(usage(
        "head-version-2",
        "head.json of another version is refused (§12).",
        "v is 2",
        edited(&|v| v["v"] = json!(2)),
    ));
    out.push(usage(
        "head-witnessed-null",
        "A head record's witnessed is an object, never null.",
        "claims-bot's witnessed in head.json is null",
        edited(&|v| v["agents"][0]["witnessed"] = serde_json::Value::Null),
    ));

    // --- the pack side of check 11 -----------------------------------------
    {
        let mut l = b.lines();
        let i = l.find("claims-bot", 8);
        l.remove(i);
        l.bump_end(-1, 0);
        l.set_last_seq("claims-bot", 7);
        out.push(case(
            "cut-end-vs-head",
            c11,
            "h > L fails when the head record's index is below the pack checkpoint's size: records L+1..=h were cut from the end.",
            "claims-bot#8 is cut and the header adjusted; head.json shows it inside the pack's tree (its decision is then open, within the grace window)",
            b.inputs(l.join()),
            b.passing()
                .fail(&["head"])
                .pending(&["outcomes"])
                .records(BASE_RECORDS - 1),
        ));
    }
    {
        let mail8 =
            b.fx.entries
                .iter()
                .find(|e| e.record.agent.as_str() == "mail-bot" && e.record.seq.get() == 8)
                .expect("logged after the pack");
        let mut l = b.lines();
        l.edit(0, |v| v["created"] = json!(mail8.received.to_string()));
        out.push(case(
            "head-record-received-by-the-pack-time",
            c11,
            "h > L also fails when the head record was received at or before the pack's created time, even beyond the pack's tree: it existed when the pack was made.",
            "the pack's created time is written as the receive time of mail-bot#8, which head.json shows (L = 5)",
            b.inputs(l.join()),
            fail(),
        ));
    }
    out.extend(scenario_cases());
    out
}

/// Cases on scenarios of their own: packs of the empty tree, agents with no
/// witnessed record.
fn scenario_cases() -> Vec<Case> {
    let mut out = Vec::new();
    let c11 = "§11 check 11";
    let empty_pack = || {
        let mut fx = small();
        fx.log("claims-bot", note("one"));
        fx.commit();
        let spec = PackSpec {
            size: Some(0),
            created: Some(fx.now),
            ..PackSpec::default()
        };
        let inputs = finish_with(&fx, &spec);
        (fx, inputs)
    };
    {
        let (_, inputs) = empty_pack();
        out.push(case(
            "head-from-size-0",
            c11,
            "From size 0 no consistency proof is checked (§7.2): every tree extends the empty one. Head agents that are not in the pack are checked and otherwise ignored.",
            "a pack of no records under the checkpoint of size 0; head.json from size 0 with an empty proof lists claims-bot",
            inputs,
            Expected::passing(true, &[], 0),
        ));
    }
    {
        let (_, mut inputs) = empty_pack();
        let mut h = Head::from_json(inputs.head.as_ref().expect("head")).expect("head");
        h.consistency = vec![fixture::digest("x")];
        inputs.head = Some(fixture::to_json(&h));
        out.push(case(
            "head-from-size-0-with-a-proof",
            c11,
            "From size 0 the consistency list must be empty, as on a checkpoint line of size 0 (check 12); a non-empty one fails.",
            "as head-from-size-0, with a one-hash consistency list",
            inputs,
            Expected::passing(true, &[], 0).fail(&["head"]),
        ));
    }
    {
        let (_, mut inputs) = empty_pack();
        let mut h = Head::from_json(inputs.head.as_ref().expect("head")).expect("head");
        h.agents[0].witnessed.inclusion = vec![fixture::digest("x")];
        inputs.head = Some(fixture::to_json(&h));
        out.push(case(
            "head-agent-not-in-the-pack-not-proven",
            c11,
            "A head agent that is not in the pack is still checked: its record is proven in the head checkpoint.",
            "as head-from-size-0, with claims-bot's inclusion proof in head.json replaced",
            inputs,
            Expected::passing(true, &[], 0).fail(&["head"]),
        ));
    }
    {
        // The pack checkpoint of size 0, signed by the log, with another
        // root than the empty tree's (§7.2): check 12's rule for size 0
        // holds for the header and head checkpoints as for lines.
        let (fx, mut inputs) = empty_pack();
        let note = fx
            .log
            .sign_checkpoint(&Checkpoint::new(
                fx.log.verifier().name(),
                TreeSize::new(0),
                fixture::digest("not the empty tree"),
            ))
            .expect("origin");
        let text = String::from_utf8(inputs.pack.clone()).expect("utf-8");
        let (first, rest) = text.split_once('\n').expect("lines");
        let mut header: serde_json::Value = serde_json::from_str(first).expect("header");
        header["checkpoint"] = json!(note);
        let mut pack = canon(&header);
        pack.push(b'\n');
        pack.extend_from_slice(rest.as_bytes());
        inputs.pack = pack;
        out.push(case(
            "header-checkpoint-size-0-other-root",
            "§7.2, §11 check 12",
            "A checkpoint of size 0 has the empty tree's root, SHA-256(\"\"); the pack's (or head.json's) of size 0 with another root fails log_consistency, as a checkpoint line of size 0 does.",
            "a pack of no records whose checkpoint, of size 0 and signed by the log, holds another root",
            inputs,
            Expected::passing(true, &[], 0).fail(&["log_consistency"]),
        ));
    }
    {
        // A malformed pack checkpoint when nothing needs proving: no
        // witnessed record, no checkpoint line, no head.json.
        let (_, mut inputs) = empty_pack();
        let text = String::from_utf8(inputs.pack.clone()).expect("utf-8");
        let (first, rest) = text.split_once('\n').expect("lines");
        let mut header: serde_json::Value = serde_json::from_str(first).expect("header");
        header["checkpoint"] = json!("not a signed note");
        let mut pack = canon(&header);
        pack.push(b'\n');
        pack.extend_from_slice(rest.as_bytes());
        inputs.pack = pack;
        inputs.head = None;
        out.push(case(
            "header-checkpoint-malformed-nothing-to-prove",
            "§7.4, §11 checks 6, 7 and 12",
            "A malformed pack checkpoint fails witness_signatures; inclusion and log_consistency fail only what they cannot prove with it, so with no witnessed record, no checkpoint line and no head.json they pass (nothing is judged).",
            "a pack of no records whose checkpoint is not a signed note, verified without head.json",
            inputs,
            Expected::passing(false, &[], 0).fail(&["witness_signatures"]),
        ));
    }
    // An agent whose records in the pack are all pending, which the log
    // holds (after the pack's checkpoint).
    let pending_only = |created_after_logging: bool| -> Inputs {
        let mut fx = small();
        fx.add_agent("audit-bot", "audit-bot/1");
        fx.commit();
        let before = fx.now;
        let r0 = fx.log("audit-bot", note("zero"));
        let r1 = fx.log("audit-bot", note("one"));
        fx.commit();
        fx.pending.push(r0);
        if created_after_logging {
            fx.tick(1000);
        } else {
            fx.pending.push(r1);
        }
        let spec = PackSpec {
            size: Some(1),
            created: Some(if created_after_logging {
                fx.now
            } else {
                before
            }),
            ..PackSpec::default()
        };
        finish_with(&fx, &spec)
    };
    out.push(case(
        "head-agent-with-no-witnessed-record",
        c11,
        "For an agent with no witnessed record in the pack there is no w: only h > L is judged, and a head record logged after the pack shows nothing cut.",
        "audit-bot's records 0..=1 are pending in the pack; head.json shows audit-bot#1 logged after the pack was made",
        pending_only(false),
        Expected::passing(
            true,
            &[
                "audit-bot: no tool list was declared, so the pack cannot show which of the agent's tools are recorded",
                "claims-bot: all 1 declared tool is recorded",
            ],
            3,
        )
        .pending(&["receipts"]),
    ));
    out.push(case(
        "head-agent-with-no-witnessed-record-cut",
        c11,
        "For an agent with no witnessed record, h > L fails when the head record was received by the pack's created time.",
        "audit-bot's record 0 is pending in the pack (L = 0); head.json shows audit-bot#1, received before the pack was made",
        pending_only(true),
        Expected::passing(
            true,
            &[
                "audit-bot: no tool list was declared, so the pack cannot show which of the agent's tools are recorded",
                "claims-bot: all 1 declared tool is recorded",
            ],
            2,
        )
        .fail(&["head"])
        .pending(&["receipts"]),
    ));
    out
}
