//! Cases of the pinned trust file (protocol.md §11.1): its syntax, and the
//! witness cosignatures check 6 then requires on the pack's checkpoint.

use serde_json::json;
use tally_schemas::cosignature::{cosignature_message, ALG_COSIGNATURE_V1};
use tally_schemas::note::{encode_vkey, key_id_for_algorithm};
use tally_schemas::SecretKey;

use super::base::{case, Base};
use super::case::{Case, Expected, LogKey};
use crate::fixture::key_from_label;

const W1: &str = "witness.example/w1";
const W2: &str = "witness.example/w2";

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A witness's cosignature key (§11.1).
fn witness_vkey(name: &str, key: &SecretKey) -> String {
    encode_vkey(ALG_COSIGNATURE_V1, name, &key.public_key())
}

/// The cosignature line of `key` named `name` over the note's body, at
/// `timestamp`; `tamper` may spoil the signature.
fn cosignature(note: &str, name: &str, key: &SecretKey, timestamp: u64, spoil: bool) -> String {
    let body = format!("{}\n", note.split_once("\n\n").expect("note").0);
    let mut sig = *key
        .sign_raw(&cosignature_message(timestamp, body.as_bytes()))
        .as_bytes();
    if spoil {
        sig[3] ^= 1;
    }
    let mut raw = key_id_for_algorithm(ALG_COSIGNATURE_V1, name, &key.public_key())
        .to_be_bytes()
        .to_vec();
    raw.extend_from_slice(&timestamp.to_be_bytes());
    raw.extend_from_slice(&sig);
    format!("\u{2014} {name} {}\n", b64(&raw))
}

#[allow(clippy::too_many_lines)]
pub(super) fn cases(b: &Base) -> Vec<Case> {
    let mut out = Vec::new();
    let vkey = b.vkey();
    let w1 = key_from_label("witness/1");
    let w1b = key_from_label("witness/1b");
    let w2 = key_from_label("witness/2");
    let header_note = b.lines().value(0)["checkpoint"]
        .as_str()
        .expect("note")
        .to_owned();
    // The base pack with the header checkpoint's note replaced.
    let with_header_note = |note: String| {
        let mut l = b.lines();
        l.edit(0, |v| v["checkpoint"] = json!(note));
        l.join()
    };
    let mut add = |name: &str, rule: &str, description: &str, trust: String, pack: Vec<u8>, e| {
        let mut i = b.inputs(pack);
        i.log_key = LogKey::Trust(trust.into_bytes());
        out.push(case(name, "§11.1", rule, description, i, e));
    };
    let pack = b.lines().join();
    let w1_line = cosignature(&header_note, W1, &w1, 1_796_025_600, false);
    let cosigned = format!("{header_note}{w1_line}");

    add(
        "trust-file-log-only",
        "A trust file with one log line stands in for --witness-key.",
        "the trust file names the log key and nothing else",
        format!("log {vkey}\n"),
        pack.clone(),
        b.passing(),
    );
    add(
        "trust-file-comments-crlf-tabs",
        "Lines end in LF with an optional CR; words are separated by runs of spaces and tabs; blank lines and lines whose first word starts with # are ignored; version 1 may come first.",
        "comments, a blank line, CRLF line ends, tabs and leading spaces around version 1 and the log line",
        format!("# pinned by the auditor\r\n\r\n  #indented comment\r\nversion\t1\r\n  log \t {vkey}  \r\n"),
        pack.clone(),
        b.passing(),
    );
    add(
        "trust-file-quorum-met",
        "With a quorum k > 0, the pack's header checkpoint carries valid cosignatures (tlog-cosignature/v1, verified strictly) from at least k distinct witness names; checkpoint lines need none.",
        "witness w1 cosigned the pack's checkpoint; the trust file lists w1 with quorum 1",
        format!("log {vkey}\nwitness {}\nquorum 1\n", witness_vkey(W1, &w1)),
        with_header_note(cosigned.clone()),
        b.passing(),
    );
    add(
        "trust-file-quorum-not-met",
        "Too few cosignatures fail witness_signatures.",
        "the trust file requires w1's cosignature; the pack's checkpoint has none",
        format!("log {vkey}\nwitness {}\nquorum 1\n", witness_vkey(W1, &w1)),
        pack.clone(),
        b.passing().fail(&["witness_signatures"]),
    );
    add(
        "trust-file-cosignature-does-not-verify",
        "A signature line that matches a listed witness key and does not verify fails witness_signatures.",
        "w1's cosignature line holds a spoiled signature",
        format!("log {vkey}\nwitness {}\nquorum 1\n", witness_vkey(W1, &w1)),
        with_header_note(format!(
            "{header_note}{}",
            cosignature(&header_note, W1, &w1, 1_796_025_600, true)
        )),
        b.passing().fail(&["witness_signatures"]),
    );
    add(
        "trust-file-default-quorum-is-every-name",
        "Without a quorum line, the quorum is the number of distinct witness names.",
        "w1 and w2 are listed without a quorum; only w1 cosigned",
        format!(
            "log {vkey}\nwitness {}\nwitness {}\n",
            witness_vkey(W1, &w1),
            witness_vkey(W2, &w2)
        ),
        with_header_note(cosigned.clone()),
        b.passing().fail(&["witness_signatures"]),
    );
    add(
        "trust-file-quorum-counts-names",
        "One witness may be listed with several keys; cosignatures count per witness name.",
        "w1 is listed with two keys and cosigned with both; quorum 1",
        format!(
            "log {vkey}\nwitness {}\nwitness {}\nquorum 1\n",
            witness_vkey(W1, &w1),
            witness_vkey(W1, &w1b)
        ),
        with_header_note(format!(
            "{cosigned}{}",
            cosignature(&header_note, W1, &w1b, 1_796_025_601, false)
        )),
        b.passing(),
    );
    add(
        "trust-file-quorum-0",
        "With quorum 0 cosignatures are not read.",
        "w1 is listed with quorum 0; the pack's checkpoint carries a spoiled w1 line",
        format!("log {vkey}\nwitness {}\nquorum 0\n", witness_vkey(W1, &w1)),
        with_header_note(format!(
            "{header_note}{}",
            cosignature(&header_note, W1, &w1, 1_796_025_600, true)
        )),
        b.passing(),
    );
    add(
        "trust-file-cosignature-repeated",
        "A second line with the name and key id of an earlier one is ignored.",
        "w1's good cosignature is followed by a spoiled one",
        format!("log {vkey}\nwitness {}\nquorum 1\n", witness_vkey(W1, &w1)),
        with_header_note(format!(
            "{cosigned}{}",
            cosignature(&header_note, W1, &w1, 1_796_025_601, true)
        )),
        b.passing(),
    );

    // --- refused trust files (exit 2) -----------------------------------------
    let mut usage = |name: &str, rule: &str, description: &str, trust: Vec<u8>| {
        let mut i = b.inputs(pack.clone());
        i.log_key = LogKey::Trust(trust);
        out.push(case(
            name,
            "§11.1",
            rule,
            description,
            i,
            Expected::UsageError,
        ));
    };
    let w1v = witness_vkey(W1, &w1);
    let mut identity = [0u8; 32];
    identity[0] = 1;
    let weak = {
        let mut raw = vec![ALG_COSIGNATURE_V1];
        raw.extend_from_slice(&identity);
        // The key id as §11.1 computes it, over the raw bytes.
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(W2.as_bytes());
        h.update(b"\n");
        h.update(&raw);
        let id = h.finalize();
        format!("{W2}+{}+{}", hex::encode(&id[..4]), b64(&raw))
    };
    for (name, rule, description, text) in [
        (
            "trust-file-unknown-keyword",
            "An unknown keyword is a usage error naming the line.",
            "a line \"favourite colour\"",
            format!("log {vkey}\nfavourite colour\n"),
        ),
        (
            "trust-file-three-words",
            "A directive is exactly two words; there are no comments after a value.",
            "log KEY # note",
            format!("log {vkey} # the log\n"),
        ),
        (
            "trust-file-two-log-lines",
            "Exactly one log line.",
            "the log line appears twice",
            format!("log {vkey}\nlog {vkey}\n"),
        ),
        (
            "trust-file-no-log-line",
            "A trust file without a log line is refused.",
            "only a comment",
            "# nothing pinned\n".to_owned(),
        ),
        (
            "trust-file-version-2",
            "A version other than 1 is unsupported (§12).",
            "version 2",
            format!("version 2\nlog {vkey}\n"),
        ),
        (
            "trust-file-version-not-first",
            "version may only be the first directive.",
            "version 1 after the log line",
            format!("log {vkey}\nversion 1\n"),
        ),
        (
            "trust-file-version-with-a-sign",
            "A decimal number is ASCII digits only, without a sign.",
            "version +1",
            format!("version +1\nlog {vkey}\n"),
        ),
        (
            "trust-file-quorum-above-the-names",
            "A quorum larger than the number of distinct witness names is refused.",
            "one witness with quorum 2",
            format!("log {vkey}\nwitness {w1v}\nquorum 2\n"),
        ),
        (
            "trust-file-quorum-not-a-number",
            "quorum is a decimal number.",
            "quorum one",
            format!("log {vkey}\nwitness {w1v}\nquorum one\n"),
        ),
        (
            "trust-file-witness-listed-twice",
            "The same witness key twice is refused.",
            "w1's key is listed twice",
            format!("log {vkey}\nwitness {w1v}\nwitness {w1v}\n"),
        ),
        (
            "trust-file-witness-key-malformed",
            "A witness key is name+hex8(key id)+base64(0x04 ‖ key); a note key (0x01) is not one.",
            "the log's own vkey is given as a witness key",
            format!("log {vkey}\nwitness {vkey}\n"),
        ),
        (
            "trust-file-witness-key-weak",
            "A witness key is a usable public key (§4.3): the identity point is refused.",
            "a witness key whose 32 bytes are the identity point, with a matching key id",
            format!("log {vkey}\nwitness {weak}\n"),
        ),
        (
            "trust-file-byte-order-mark",
            "A byte-order mark is not skipped: a file starting with one is refused.",
            "the file starts with U+FEFF",
            format!("\u{feff}log {vkey}\n"),
        ),
    ] {
        usage(name, rule, description, text.into_bytes());
    }
    let mut latin1 = b"# caf".to_vec();
    latin1.push(0xe9);
    latin1.extend_from_slice(format!("\nlog {vkey}\n").as_bytes());
    usage(
        "trust-file-not-utf-8",
        "The trust file is UTF-8; bytes that are not are a usage error.",
        "a comment holds the Latin-1 byte 0xE9",
        latin1,
    );
    out
}
