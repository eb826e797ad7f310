//! Cases of checkpoints: the checkpoint body and signed-note grammar
//! (protocol.md §7.4), and checks 6 (`witness_signatures`) and 12
//! (`log_consistency`).

use serde_json::json;
use tally_schemas::note::{peek_checkpoint, Checkpoint};
use tally_schemas::pack::{PackCheckpoint, PackLine};
use tally_schemas::tree::{empty_root, TreeSize};

use super::base::{case, Base, ORIGIN};
use super::case::Case;
use crate::fixture::{self, note, Fixture};

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A signature line for `name` holding `raw` (key id, then signature).
fn sig_line(name: &str, raw: &[u8]) -> String {
    format!("\u{2014} {name} {}\n", b64(raw))
}

/// `text` with one unused bit set in the base64 of its last line.
fn stray_bit(note: &str) -> String {
    let (head, last) = note
        .trim_end_matches('\n')
        .rsplit_once(' ')
        .expect("a signature line");
    let alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut chars: Vec<char> = last.chars().collect();
    let i = chars.iter().position(|c| *c == '=').expect("padding") - 1;
    let pos = alphabet.find(chars[i]).expect("base64");
    chars[i] = alphabet.chars().nth(pos ^ 1).expect("base64");
    format!("{head} {}\n", chars.into_iter().collect::<String>())
}

/// An unknown witness's cosignature-shaped line.
fn unknown_line() -> String {
    sig_line("witness.example/w9", &[0x5a; 76])
}

#[allow(clippy::too_many_lines)]
pub(super) fn cases(b: &Base) -> Vec<Case> {
    let mut out = Vec::new();
    let first_note = b.lines().value(1)["checkpoint"]
        .as_str()
        .expect("note")
        .to_owned();
    let first = peek_checkpoint(&first_note).expect("checkpoint");
    let first_size = first.size.get();
    let log = b.fx.log.clone();
    let (body, log_line) = {
        let (t, s) = first_note.split_once("\n\n").expect("note");
        (format!("{t}\n"), s.to_owned())
    };
    // The first checkpoint line with another note.
    let with_first_note = |note: String| {
        let mut l = b.lines();
        l.edit(1, |v| v["checkpoint"] = json!(note));
        l.join()
    };
    let mut add = |name: &str, section, rule: &str, description: &str, pack: Vec<u8>, e| {
        out.push(case(name, section, rule, description, b.inputs(pack), e));
    };
    let ok = b.passing();
    // A malformed note or checkpoint on the first checkpoint line: it is not
    // read at all, so nothing is proven from it and the receipts issued
    // under its size name no checkpoint line.
    let malformed = || {
        b.passing()
            .fail(&["witness_signatures", "log_consistency", "receipts"])
    };
    let unverified = || b.passing().fail(&["witness_signatures"]);
    let grammar = "§7.4";

    // --- what the grammar accepts ------------------------------------------
    add(
        "note-unknown-signature-line",
        grammar,
        "Signature lines of keys the verifier does not know are ignored.",
        "the first checkpoint line's note carries a second, unknown key's line",
        with_first_note(format!("{first_note}{}", unknown_line())),
        ok.clone(),
    );
    add(
        "note-stray-bits-in-an-unknown-line",
        grammar,
        "Bits left over in the last base64 character of a signature line need not be zero (as Go's note package reads them): an unknown key's line written so is accepted and ignored.",
        "an unknown key's line whose base64 has one unused bit set",
        with_first_note(stray_bit(&format!("{first_note}{}", unknown_line()))),
        ok.clone(),
    );
    add(
        "note-stray-bits-in-the-log-line",
        grammar,
        "Unused base64 bits are ignored in the log key's own line too: the signature is the bytes decoded.",
        "the log's signature line of the first checkpoint line has one unused bit set",
        with_first_note(stray_bit(&first_note)),
        ok.clone(),
    );
    {
        let mut cp = Checkpoint::new(ORIGIN, first.size, first.root);
        cp.extensions = vec!["ext-one \u{7f} allowed".into(), "ext-two".into()];
        add(
            "note-extension-lines",
            grammar,
            "Extension lines after the root are accepted and ignored when non-empty (U+007F is not a control character to the grammar).",
            "the first checkpoint line's body has two extension lines, one holding U+007F, signed by the log",
            with_first_note(log.sign_checkpoint(&cp).expect("origin")),
            ok.clone(),
        );
    }
    {
        let mut raw = log.verifier().id().to_be_bytes().to_vec();
        raw.extend_from_slice(&[0x11; 64]);
        add(
            "note-log-line-repeated",
            grammar,
            "Only the first line with the pinned key's name and key id is checked; later ones are ignored, whatever they hold.",
            "a second line of the log key, holding a wrong signature, follows the good one",
            with_first_note(format!("{first_note}{}", sig_line(log.verifier().name(), &raw))),
            ok.clone(),
        );
        add(
            "note-log-line-bad-then-good",
            grammar,
            "The first line of the pinned key decides: when it does not verify, the checkpoint is unverified even if a later line would.",
            "a line of the log key holding a wrong signature stands before the good one",
            with_first_note(format!(
                "{body}\n{}{log_line}",
                sig_line(log.verifier().name(), &raw)
            )),
            unverified(),
        );
        raw.truncate(4 + 63);
        add(
            "note-log-signature-63-bytes",
            grammar,
            "A line of the pinned key whose signature is not 64 bytes does not verify: unverified, not malformed.",
            "the only log line holds 63 signature bytes",
            with_first_note(format!(
                "{body}\n{}",
                sig_line(log.verifier().name(), &raw)
            )),
            unverified(),
        );
        let mut other_id = (log.verifier().id() ^ 1).to_be_bytes().to_vec();
        other_id.extend_from_slice(&[0x11; 64]);
        add(
            "note-log-name-other-key-id",
            grammar,
            "A line with the pinned key's name but another key id is another key's, and ignored: the note has no line of the pinned key.",
            "the only signature line has the log's name and another key id",
            with_first_note(format!(
                "{body}\n{}",
                sig_line(log.verifier().name(), &other_id)
            )),
            unverified(),
        );
    }
    {
        let short = sig_line("w", &[1, 2, 3, 4, 5]);
        add(
            "note-100-signature-lines",
            grammar,
            "A note may carry up to MAX_NOTE_SIGNATURES (100) signature lines; a signature line decodes to at least 5 bytes.",
            "the log's line and 99 unknown lines of 5 bytes",
            with_first_note(format!("{first_note}{}", short.repeat(99))),
            ok.clone(),
        );
        add(
            "note-101-signature-lines",
            grammar,
            "More than MAX_NOTE_SIGNATURES (100) signature lines make the note malformed.",
            "the log's line and 100 unknown lines",
            with_first_note(format!("{first_note}{}", short.repeat(100))),
            malformed(),
        );
    }

    // --- what makes a note malformed --------------------------------------
    {
        let mut bad = format!("{first_note}{}", unknown_line());
        bad.insert(bad.len() - 4, '*');
        add(
            "note-invalid-base64-in-an-unknown-line",
            grammar,
            "A rule broken in any signature line, even one of an unknown key, makes the whole note malformed (as in Go): here a character outside the base64 alphabet.",
            "an unknown key's line holds a '*'",
            with_first_note(bad),
            malformed(),
        );
        let unpadded = format!("{first_note}{}", sig_line("w", &[1u8; 76]))
            .strip_suffix("=\n")
            .expect("padded")
            .to_owned()
            + "\n";
        add(
            "note-unpadded-base64",
            grammar,
            "Signature base64 is padded: a length that is not a multiple of 4 makes the note malformed.",
            "an unknown key's line without its '=' padding",
            with_first_note(unpadded),
            malformed(),
        );
        add(
            "note-signature-of-4-bytes",
            grammar,
            "A signature line decodes to at least 5 bytes (a key id and a signature); fewer make the note malformed.",
            "an unknown key's line holds 4 bytes",
            with_first_note(format!("{first_note}{}", sig_line("w", &[1, 2, 3, 4]))),
            malformed(),
        );
        add(
            "note-key-name-with-a-plus",
            grammar,
            "A signature line's key name is a valid key name (no '+', no white space); otherwise the note is malformed.",
            "an unknown key's line is named w+x",
            with_first_note(format!("{first_note}{}", sig_line("w+x", &[1u8; 8]))),
            malformed(),
        );
        add(
            "note-no-em-dash",
            grammar,
            "Every line after the blank line is a signature line starting with U+2014 and a space.",
            "a line starting with '-' follows the log's line",
            with_first_note(format!("{first_note}- w AAAAAAA=\n")),
            malformed(),
        );
        add(
            "note-no-blank-line",
            grammar,
            "The text and the signatures are separated by a blank line; a note without one is malformed.",
            "the blank line of the first checkpoint line's note is removed",
            with_first_note(first_note.replacen("\n\n", "\n", 1)),
            malformed(),
        );
        add(
            "note-without-final-newline",
            grammar,
            "The signature block ends in a newline.",
            "the final newline of the first checkpoint line's note is removed",
            with_first_note(first_note.trim_end_matches('\n').to_owned()),
            malformed(),
        );
        let tabbed = log
            .sign_note(&body.replacen('\n', "\t\n", 1))
            .unwrap_or_else(|_| {
                // signed_note refuses to sign a control character: sign the
                // text by hand.
                let text = body.replacen('\n', "\t\n", 1);
                let sig = fixture::key_from_label("log").sign_raw(text.as_bytes());
                let mut raw = log.verifier().id().to_be_bytes().to_vec();
                raw.extend_from_slice(sig.as_bytes());
                format!("{text}\n{}", sig_line(log.verifier().name(), &raw))
            });
        add(
            "note-control-character",
            grammar,
            "A note holds no character below U+0020 but newline; a tab makes it malformed, signed or not.",
            "the origin line of the first checkpoint line ends in a tab, and the log signed that text",
            with_first_note(tabbed),
            malformed(),
        );
        add(
            "note-over-8192-bytes",
            grammar,
            "A note is at most MAX_CHECKPOINT_NOTE_BYTES (8,192) bytes; a longer one is malformed.",
            "an unknown key's line of 8,000 signature bytes takes the note over the bound",
            with_first_note(format!("{first_note}{}", sig_line("w", &[1u8; 8000]))),
            malformed(),
        );
    }
    // Bodies that break the checkpoint grammar, signed by the log key.
    let root = b64(first.root.as_bytes());
    for (name, rule, description, text) in [
        (
            "checkpoint-size-leading-zero",
            "The size line is decimal without leading zeros; a body that breaks a body rule is a malformed checkpoint, even when the log signed it.",
            "the first checkpoint line's size is written with a leading zero, and signed",
            format!("{ORIGIN}\n0{first_size}\n{root}\n"),
        ),
        (
            "checkpoint-size-beyond-2-53",
            "The size is at most 2^53 − 1.",
            "a checkpoint of size 9007199254740992, signed",
            format!("{ORIGIN}\n9007199254740992\n{root}\n"),
        ),
        (
            "checkpoint-empty-extension-line",
            "Extension lines are non-empty: the note's last blank line is the separator, so an earlier one is an empty line of the body.",
            "the first checkpoint line's body has an empty line and then an extension line, signed",
            format!("{ORIGIN}\n{first_size}\n{root}\n\next\n"),
        ),
        (
            "checkpoint-root-non-canonical",
            "The root is the canonical base64 of 32 bytes (unused bits zero).",
            "the first checkpoint line's root has one unused bit set, signed",
            {
                let alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
                let mut chars: Vec<char> = root.chars().collect();
                let i = chars.len() - 2;
                let pos = alphabet.find(chars[i]).expect("base64");
                chars[i] = alphabet.chars().nth(pos ^ 1).expect("base64");
                format!(
                    "{ORIGIN}\n{first_size}\n{}\n",
                    chars.into_iter().collect::<String>()
                )
            },
        ),
    ] {
        add(
            name,
            grammar,
            rule,
            description,
            with_first_note(log.sign_note(&text).expect("note text")),
            malformed(),
        );
    }

    // --- check 6 -------------------------------------------------------------
    {
        let mut other = b.fx.clone();
        other.log = fixture::log_signer(ORIGIN, "impostor-log");
        add(
            "foreign-log-key",
            "§11 check 6",
            "Every checkpoint verifies with the pinned log key; a well-formed checkpoint signed by another key is unverified, and its size and root are still read for the other checks.",
            "every checkpoint of the pack is signed by another key under the same origin",
            super::base::join(&super::base::bytes_of(&other.pack_lines(&b.spec))),
            unverified(),
        );
    }
    {
        let mut other = b.fx.clone();
        other.origin = "evil.example/log".into();
        other.log = fixture::log_signer("evil.example/log", "log");
        add(
            "other-origin",
            "§11 checks 2 and 6",
            "The pack's origin is the pinned key's name, and agent-keys.json's origin the pack's.",
            "the pack comes from a log with another origin and key",
            super::base::join(&super::base::bytes_of(&other.pack_lines(&b.spec))),
            b.passing().fail(&["witness_signatures", "agent_keys"]),
        );
    }
    {
        let mut l = b.lines();
        l.edit(0, |v| {
            let note = v["checkpoint"].as_str().expect("note").to_owned();
            let cp = peek_checkpoint(&note).expect("cp");
            v["checkpoint"] = json!(note.replacen(
                &format!("\n{}\n", cp.size),
                &format!("\n{}\n", cp.size.get() + 1),
                1
            ));
        });
        add(
            "header-checkpoint-size-edited",
            "§11 checks 6, 7, 11 and 12",
            "An edited pack checkpoint does not verify; its claimed size is still read, and nothing proven at the real size is proven at it.",
            "the pack checkpoint's size is raised by one without re-signing",
            l.join(),
            b.passing().fail(&[
                "witness_signatures",
                "inclusion",
                "log_consistency",
                "head",
            ]),
        );
    }
    {
        let mut l = b.lines();
        l.edit(0, |v| v["checkpoint"] = json!("not a signed note"));
        add(
            "header-checkpoint-malformed",
            "§7.4, §11 checks 6, 7, 11 and 12",
            "A malformed pack checkpoint has no size or root: no entry, checkpoint line or head can be proven against it.",
            "the pack checkpoint is the text \"not a signed note\"",
            l.join(),
            b.passing().fail(&[
                "witness_signatures",
                "inclusion",
                "log_consistency",
                "head",
            ]),
        );
    }
    {
        let mut l = b.lines();
        l.edit(1, |v| {
            let note = v["checkpoint"].as_str().expect("note").to_owned();
            let cp = peek_checkpoint(&note).expect("cp");
            let old = b64(cp.root.as_bytes());
            let new = b64(fixture::digest("root").as_bytes());
            v["checkpoint"] = json!(note.replacen(&old, &new, 1));
        });
        add(
            "checkpoint-line-root-edited",
            "§11 checks 6 and 12",
            "An edited checkpoint line does not verify, and its root is not consistent with the pack checkpoint.",
            "the first checkpoint line's root is replaced without re-signing",
            l.join(),
            b.passing().fail(&["witness_signatures", "log_consistency"]),
        );
    }

    // --- check 12 ------------------------------------------------------------
    let mut add = |name: &str, rule: &str, description: &str, pack: Vec<u8>, e| {
        out.push(case(
            name,
            "§7.2, §11 check 12",
            rule,
            description,
            b.inputs(pack),
            e,
        ));
    };
    let c12 = || b.passing().fail(&["log_consistency"]);
    {
        let mut l = b.lines();
        l.edit(1, |v| {
            v["consistency"].as_array_mut().expect("proof").pop();
        });
        add(
            "consistency-proof-truncated",
            "A checkpoint line's consistency proof to the pack checkpoint verifies by RFC 9162 §2.1.4.2, with exactly the hashes it needs.",
            "the first checkpoint line's proof loses its last hash",
            l.join(),
            c12(),
        );
    }
    {
        let mut l = b.lines();
        l.edit(1, |v| {
            v["consistency"]
                .as_array_mut()
                .expect("proof")
                .push(json!(fixture::digest("pad").to_hex()));
        });
        add(
            "consistency-proof-padded",
            "A consistency proof with one hash too many is invalid.",
            "the first checkpoint line's proof gains a hash",
            l.join(),
            c12(),
        );
    }
    {
        let mut l = b.lines();
        l.edit(1, |v| {
            let p = v["consistency"].as_array_mut().expect("proof");
            while p.len() < 65 {
                p.push(json!(fixture::digest("pad").to_hex()));
            }
        });
        add(
            "consistency-proof-over-64-hashes",
            "A consistency proof holds at most MAX_PROOF_HASHES (64) hashes.",
            "the first checkpoint line's proof is padded to 65 hashes",
            l.join(),
            c12(),
        );
    }
    let zero_line = |root: tally_schemas::Hash, proof: Vec<tally_schemas::Hash>| {
        let signer = &b.fx.log;
        let note = signer
            .sign_checkpoint(&Checkpoint::new(ORIGIN, TreeSize::new(0), root))
            .expect("origin");
        let mut l = b.lines();
        l.0.insert(
            1,
            PackLine::Checkpoint(PackCheckpoint {
                checkpoint: note,
                consistency: proof,
            })
            .to_json()
            .expect("canonical"),
        );
        l.bump_end(0, 1);
        l.join()
    };
    add(
        "checkpoint-line-size-0",
        "A checkpoint line of size 0 needs no proof: its root is SHA-256(\"\") and its consistency list empty (§7.2: no proof from the empty tree exists).",
        "a signed checkpoint of size 0 with the empty root and no proof comes first",
        zero_line(empty_root(), Vec::new()),
        b.passing(),
    );
    add(
        "checkpoint-line-size-0-with-a-proof",
        "A checkpoint line of size 0 with a non-empty consistency list fails.",
        "a signed checkpoint of size 0 with the empty root and a one-hash proof comes first",
        zero_line(empty_root(), vec![fixture::digest("x")]),
        c12(),
    );
    add(
        "checkpoint-line-size-0-other-root",
        "A checkpoint of size 0 must have root SHA-256(\"\").",
        "a signed checkpoint of size 0 with another root comes first",
        zero_line(fixture::digest("not empty"), Vec::new()),
        c12(),
    );
    {
        let mut l = b.lines();
        let last = l.last_of("checkpoint");
        l.edit(last, |v| {
            v["consistency"] = json!([fixture::digest("x").to_hex()]);
        });
        add(
            "checkpoint-line-of-the-pack-size-with-a-proof",
            "A checkpoint line of the pack checkpoint's own size needs an empty list and the same root.",
            "the checkpoint line of the pack's size carries a one-hash proof",
            l.join(),
            c12(),
        );
    }
    {
        // A split view: a validly signed checkpoint of the pack's size over
        // another tree.
        let mut forked = Fixture::new(ORIGIN, "log");
        forked.add_agent("claims-bot", "claims-bot/1");
        for _ in 0..b.pack_size {
            forked.log("claims-bot", note("a different history"));
        }
        let split_note = forked.checkpoint(b.pack_size);
        let mut l = b.lines();
        let last = l.last_of("checkpoint");
        l.0[last] = PackLine::Checkpoint(PackCheckpoint {
            checkpoint: split_note,
            consistency: Vec::new(),
        })
        .to_json()
        .expect("canonical");
        add(
            "two-checkpoints-same-size",
            "No two checkpoints of one size (lines, header, head) have different roots: a split view.",
            "the checkpoint line of the pack's size is replaced by one the log signed over another tree of that size",
            l.join(),
            c12(),
        );
    }
    {
        let mut l = b.lines();
        let newer = b.fx.checkpoint(*b.fx.commits.last().expect("commit"));
        let last = l.last_of("checkpoint");
        l.0.insert(
            last + 1,
            PackLine::Checkpoint(PackCheckpoint {
                checkpoint: newer,
                consistency: Vec::new(),
            })
            .to_json()
            .expect("canonical"),
        );
        l.bump_end(0, 1);
        add(
            "checkpoint-line-beyond-the-pack",
            "Every checkpoint line's size is at most the pack checkpoint's.",
            "a newer (larger) checkpoint line follows the others",
            l.join(),
            c12(),
        );
    }
    out
}
