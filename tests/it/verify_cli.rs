//! `tally verify` through the real binary (docs/protocol.md §11): exit 0 on
//! a valid pack, 1 on a tampered one, 2 on usage and I/O errors and on a
//! pack of a newer version; the log key from `--witness-key` (inline or a
//! file) or from a pinned trust file (`--trust`, §11.1); `--format json`
//! validates against schemas/json/report.schema.json.
//!
//! The valid pack is made here with the test fixture (tally-testkit); the
//! failing ones are cases of the conformance corpus (testdata/conformance/,
//! which tests/it/conformance.rs runs whole).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use tally_schemas::record::OutcomeStatus;
use tally_testkit::fixture::{self, outcome, tool, tools, Fixture, PackSpec};
use tally_verifier::trust::WitnessKey;

/// A valid pack of two agents with its agent-keys.json, head.json and the
/// log's vkey, written to a temporary directory.
struct Pack {
    dir: tempfile::TempDir,
    vkey: String,
}

impl Pack {
    fn new() -> Self {
        let mut fx = Fixture::new("tally.local/log", "log");
        fx.add_agent("claims-bot", "claims-bot/1");
        fx.add_agent("mail-bot", "mail-bot/1");
        fx.log(
            "claims-bot",
            tools(
                "l1",
                vec![tool("refund", true, "1"), tool("lookup", true, "1")],
            ),
        );
        for i in 0..3 {
            fx.call("claims-bot", &format!("c{i}"), "refund");
            fx.call("mail-bot", &format!("m{i}"), "send");
        }
        let (d, _) = fx.call("claims-bot", "c9", "lookup");
        fx.commit();
        let created = fx.now;
        // A record logged after the pack was made, seen only by head.json.
        fx.log("claims-bot", outcome("c9b", &d, OutcomeStatus::Ok));
        fx.commit();
        let size = fx.commits[0];
        let spec = PackSpec {
            size: Some(size),
            created: Some(created),
            ..PackSpec::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let write =
            |name: &str, bytes: &[u8]| std::fs::write(dir.path().join(name), bytes).unwrap();
        write("pack.jsonl", &fixture::to_jsonl(&fx.pack_lines(&spec)));
        write("agent-keys.json", &fixture::to_json(&fx.agent_keys()));
        write("head.json", &fixture::to_json(&fx.head(size)));
        let vkey = fx.log.verifier().vkey();
        write("log.vkey", format!("{vkey}\n").as_bytes());
        Self { dir, vkey }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }
}

fn tally(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    Command::new(common::TALLY)
        .arg("verify")
        .args(args.iter().map(|a| a.as_ref()))
        .output()
        .expect("run tally verify")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited, not killed")
}

fn corpus(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/conformance")
        .join(case)
}

fn report_schema() -> jsonschema::Validator {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/json/report.schema.json");
    let schema: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    jsonschema::validator_for(&schema).unwrap()
}

#[test]
fn a_valid_pack_passes_with_the_key_inline_or_from_a_file() {
    let p = Pack::new();
    let pack = p.path("pack.jsonl");
    let keys = p.path("agent-keys.json");
    let o = tally(&[&pack, &"--agent-keys", &keys, &"--witness-key", &p.vkey]);
    let text = stdout(&o);
    assert_eq!(code(&o), 0, "{text}{}", stderr(&o));
    assert_eq!(
        text.lines().filter(|l| l.contains(": pass:")).count(),
        11,
        "{text}"
    );
    assert!(text.contains("\nhead: not checked: "), "{text}");
    assert!(
        text.ends_with(
            "PASS: 12 checks, 11 pass, 0 pending, 1 not checked; 15 records from 2 agents\n"
        ),
        "{text}"
    );
    // The key from a file, and head.json: all twelve pass.
    let o = tally(&[
        &pack,
        &"--agent-keys",
        &keys,
        &"--witness-key",
        &p.path("log.vkey"),
        &"--head",
        &p.path("head.json"),
    ]);
    let text = stdout(&o);
    assert_eq!(code(&o), 0, "{text}{}", stderr(&o));
    assert!(text.contains("\nhead: pass: "), "{text}");
    assert!(
        text.ends_with(
            "PASS: 12 checks, 12 pass, 0 pending, 0 not checked; 15 records from 2 agents\n"
        ),
        "{text}"
    );
}

#[test]
fn a_tampered_pack_fails_with_exit_1_naming_the_check() {
    let valid = corpus("valid");
    let vkey = valid.join("log.vkey");
    for (case, check) in [
        ("nonce-reused", "receipts"),
        ("record-edit-note-text", "record_signatures"),
    ] {
        let dir = corpus(case);
        assert!(dir.join("pack.jsonl").exists(), "{case} is in the corpus");
        let o = tally(&[
            &dir.join("pack.jsonl"),
            &"--agent-keys",
            &valid.join("agent-keys.json"),
            &"--witness-key",
            &vkey,
        ]);
        let text = stdout(&o);
        assert_eq!(code(&o), 1, "{case}: {text}{}", stderr(&o));
        assert!(
            text.contains(&format!("\n{check}: fail: ")),
            "{case}: {text}"
        );
        assert!(text.lines().last().unwrap().starts_with("FAIL: "), "{text}");
    }
}

#[test]
fn usage_and_io_errors_exit_2() {
    let p = Pack::new();
    let pack = p.path("pack.jsonl");
    let keys = p.path("agent-keys.json");
    let vkey = p.vkey.as_str();
    let missing = p.path("no-such-pack.jsonl");
    let empty = p.write("empty.jsonl", b"");
    let bad_trust = p.write(
        "bad.trust",
        format!("log {vkey}\nfavourite colour\n").as_bytes(),
    );
    let cases: Vec<(&str, Vec<&dyn AsRef<std::ffi::OsStr>>, &str)> = vec![
        ("no arguments", vec![], "Usage"),
        (
            "no key at all",
            vec![&pack, &"--agent-keys", &keys],
            "--witness-key",
        ),
        (
            "both --witness-key and --trust",
            vec![
                &pack,
                &"--agent-keys",
                &keys,
                &"--witness-key",
                &vkey,
                &"--trust",
                &bad_trust,
            ],
            "cannot be used with",
        ),
        (
            "a missing pack",
            vec![&missing, &"--agent-keys", &keys, &"--witness-key", &vkey],
            "no-such-pack.jsonl",
        ),
        (
            "missing agent keys",
            vec![&pack, &"--agent-keys", &missing, &"--witness-key", &vkey],
            "agent keys",
        ),
        (
            "a witness key that is not a vkey",
            vec![
                &pack,
                &"--agent-keys",
                &keys,
                &"--witness-key",
                &"not-a-vkey",
            ],
            "--witness-key",
        ),
        (
            "an empty pack",
            vec![&empty, &"--agent-keys", &keys, &"--witness-key", &vkey],
            "not a tally pack",
        ),
        (
            "a trust file with an unknown keyword",
            vec![&pack, &"--agent-keys", &keys, &"--trust", &bad_trust],
            "bad.trust",
        ),
    ];
    for (what, args, says) in cases {
        let o = tally(&args);
        assert_eq!(code(&o), 2, "{what}: {}{}", stdout(&o), stderr(&o));
        assert!(stderr(&o).contains(says), "{what}: {}", stderr(&o));
        assert!(stdout(&o).is_empty(), "{what}: {}", stdout(&o));
    }
}

#[test]
fn a_pack_of_a_newer_version_is_a_usage_error_not_a_guess() {
    let p = Pack::new();
    let text = String::from_utf8(std::fs::read(p.path("pack.jsonl")).unwrap()).unwrap();
    let (header, rest) = text.split_once('\n').unwrap();
    assert!(header.ends_with("\"type\":\"header\",\"v\":1}"), "{header}");
    let newer = format!("{}2}}\n{rest}", &header[..header.len() - 2]);
    let pack = p.write("v2.jsonl", newer.as_bytes());
    let o = tally(&[
        &pack,
        &"--agent-keys",
        &p.path("agent-keys.json"),
        &"--witness-key",
        &p.vkey,
    ]);
    assert_eq!(code(&o), 2, "{}{}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains("pack format version 2 is not supported"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn the_trust_file_stands_in_for_the_witness_key() {
    let p = Pack::new();
    let pack = p.path("pack.jsonl");
    let keys = p.path("agent-keys.json");
    let trust = p.write(
        "tally.trust",
        format!("# pinned by the auditor\n\nlog {}\n", p.vkey).as_bytes(),
    );
    let o = tally(&[&pack, &"--agent-keys", &keys, &"--trust", &trust]);
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("\nwitness_signatures: pass: "));

    // A quorum of one witness whose cosignature the pack's checkpoint lacks.
    let witness = WitnessKey::new(
        "witness.example/w1",
        fixture::key_from_label("w1").public_key(),
    )
    .unwrap();
    let quorum = p.write(
        "quorum.trust",
        format!("log {}\nwitness {}\nquorum 1\n", p.vkey, witness.vkey()).as_bytes(),
    );
    let o = tally(&[&pack, &"--agent-keys", &keys, &"--trust", &quorum]);
    let text = stdout(&o);
    assert_eq!(code(&o), 1, "{text}{}", stderr(&o));
    assert!(text.contains("\nwitness_signatures: fail: "), "{text}");

    // A trust file for another log: its key does not sign the pack.
    let other = tally_testkit::fixture::log_signer("tally.local/log", "another log");
    let wrong = p.write(
        "wrong.trust",
        format!("log {}\n", other.verifier().vkey()).as_bytes(),
    );
    let o = tally(&[&pack, &"--agent-keys", &keys, &"--trust", &wrong]);
    assert_eq!(code(&o), 1, "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("\nwitness_signatures: fail: "));
    // The same wrong key as --witness-key: the key that did sign is named.
    let other_vkey = other.verifier().vkey();
    let o = tally(&[&pack, &"--agent-keys", &keys, &"--witness-key", &other_vkey]);
    let text = stdout(&o);
    assert_eq!(code(&o), 1, "{text}{}", stderr(&o));
    let signer = p.vkey.rsplit_once('+').unwrap().0;
    assert!(
        text.contains(&format!("it is signed by {signer}")) && text.contains("another log"),
        "{text}"
    );

    // A cosigner's key given as the log's: pointed to --trust.
    let o = tally(&[
        &pack,
        &"--agent-keys",
        &keys,
        &"--witness-key",
        &witness.vkey(),
    ]);
    assert_eq!(code(&o), 2, "{}{}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains("is a cosigner's key") && stderr(&o).contains("--trust FILE"),
        "{}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("algorithm byte"), "{}", stderr(&o));

    // A quorum met: the pass says it was checked.
    let case = corpus("trust-file-quorum-met");
    let o = tally(&[
        &case.join("pack.jsonl"),
        &"--agent-keys",
        &case.join("agent-keys.json"),
        &"--trust",
        &case.join("trust.txt"),
    ]);
    let text = stdout(&o);
    assert_eq!(code(&o), 0, "{text}{}", stderr(&o));
    assert!(
        text.contains(
            "cosigned by 1 of the trust file's cosigners (`witness` lines), its quorum is 1"
        ),
        "{text}"
    );
}

/// A head.json made for another pack (an older export): check 11 says to
/// make it again with `tally head`.
#[test]
fn a_stale_head_says_to_make_it_again() {
    let p = Pack::new();
    let mut head: serde_json::Value =
        serde_json::from_slice(&std::fs::read(p.path("head.json")).unwrap()).unwrap();
    head["from_size"] = serde_json::json!(head["from_size"].as_u64().unwrap() - 1);
    let stale = p.write("stale.json", &serde_json::to_vec(&head).unwrap());
    let o = tally(&[
        &p.path("pack.jsonl"),
        &"--agent-keys",
        &p.path("agent-keys.json"),
        &"--witness-key",
        &p.vkey,
        &"--head",
        &stale,
    ]);
    let text = stdout(&o);
    assert_eq!(code(&o), 1, "{text}{}", stderr(&o));
    assert!(
        text.contains("made for another pack") && text.contains("tally head --pack"),
        "{text}"
    );
}

#[test]
fn the_json_report_validates_against_its_schema() {
    let schema = report_schema();
    let p = Pack::new();
    let o = tally(&[
        &p.path("pack.jsonl"),
        &"--agent-keys",
        &p.path("agent-keys.json"),
        &"--witness-key",
        &p.vkey,
        &"--format",
        &"json",
    ]);
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    let text = stdout(&o);
    assert_eq!(text.lines().count(), 1, "one JSON object on one line");
    let report: Value = serde_json::from_str(&text).unwrap();
    let errors: Vec<String> = schema.iter_errors(&report).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:#?}\n{report:#}");
    assert_eq!(report["v"], 2);
    assert_eq!(report["result"], "PASS");
    assert_eq!(report["records"], 15);
    assert_eq!(
        report["agents"],
        serde_json::json!([
            {"agent": "claims-bot", "first_seq": 0, "last_seq": 8, "records": 9},
            {"agent": "mail-bot", "first_seq": 0, "last_seq": 5, "records": 6}
        ])
    );

    // A failing report validates too, and exits 1.
    let valid = corpus("valid");
    let o = tally(&[
        &corpus("nonce-reused").join("pack.jsonl"),
        &"--agent-keys",
        &valid.join("agent-keys.json"),
        &"--witness-key",
        &valid.join("log.vkey"),
        &"--format",
        &"json",
    ]);
    assert_eq!(code(&o), 1, "{}{}", stdout(&o), stderr(&o));
    let report: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(schema.is_valid(&report), "{report:#}");
    assert_eq!(report["result"], "FAIL");
    let receipts = &report["checks"][7];
    assert_eq!(receipts["id"], "receipts");
    assert_eq!(receipts["status"], "fail");
    assert!(!receipts["records"].as_array().unwrap().is_empty());
}

/// A hostile MCP server declares a tool whose name holds a right-to-left
/// override (U+202E) and a line separator (U+2028; records refuse control
/// characters, but not this one): `tally verify` prints them as
/// visible escapes (protocol.md §11.2), so the coverage line cannot be
/// reordered or split into a forged line; `--format json` keeps the names
/// exactly.
#[test]
fn hostile_tool_names_are_escaped_in_the_text_report_and_exact_in_json() {
    // Shown raw, "…: refund\u{202e}gnp.exe" reads as "…: refundexe.png",
    // and the line separator would start a line of its own.
    let spoof = "refund\u{202e}gnp.exe";
    let forged = "x\u{2028}coverage: claims-bot: all 1 declared tools are recorded";
    let mut fx = Fixture::new("tally.local/log", "log");
    fx.add_agent("claims-bot", "claims-bot/1");
    fx.log(
        "claims-bot",
        tools(
            "l1",
            vec![tool(spoof, false, "1"), tool(forged, false, "1")],
        ),
    );
    fx.call("claims-bot", "c\u{2066}1", "lookup\u{200b}");
    fx.commit();
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("pack.jsonl");
    let keys = dir.path().join("agent-keys.json");
    std::fs::write(
        &pack,
        fixture::to_jsonl(&fx.pack_lines(&PackSpec::default())),
    )
    .unwrap();
    std::fs::write(&keys, fixture::to_json(&fx.agent_keys())).unwrap();
    let vkey = fx.log.verifier().vkey();

    let o = tally(&[&pack, &"--agent-keys", &keys, &"--witness-key", &vkey]);
    let text = stdout(&o);
    assert_eq!(code(&o), 0, "{text}{}", stderr(&o));
    for raw in ['\u{202e}', '\u{2028}', '\u{2066}', '\u{200b}'] {
        assert!(
            !text.contains(raw),
            "U+{:04X} printed raw:\n{text}",
            u32::from(raw)
        );
    }
    assert!(
        text.contains(
            "coverage: claims-bot: 2 declared tools are not recorded: refund\\u{202e}gnp.exe, x\\u{2028}coverage: claims-bot: all 1 declared tools are recorded\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("coverage: claims-bot: 1 recorded tool is not in the declared tool list: lookup\\u{200b}\n"),
        "{text}"
    );
    // One line per check, two coverage lines, the result: nothing forged.
    assert_eq!(text.lines().count(), 12 + 2 + 1, "{text}");
    assert_eq!(
        text.lines().filter(|l| l.starts_with("coverage: ")).count(),
        2,
        "{text}"
    );

    let o = tally(&[
        &pack,
        &"--agent-keys",
        &keys,
        &"--witness-key",
        &vkey,
        &"--format",
        &"json",
    ]);
    assert_eq!(code(&o), 0);
    let report: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let coverage: Vec<&str> = report["coverage"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(
        coverage,
        [
            format!("claims-bot: 2 declared tools are not recorded: {spoof}, {forged}"),
            "claims-bot: 1 recorded tool is not in the declared tool list: lookup\u{200b}"
                .to_owned(),
        ]
    );
}

/// The result line's counts are singular for one (protocol.md §11).
#[test]
fn one_record_from_one_agent_is_said_in_the_singular() {
    let case = corpus("one-record-from-one-agent");
    let o = tally(&[
        &case.join("pack.jsonl"),
        &"--agent-keys",
        &case.join("agent-keys.json"),
        &"--witness-key",
        &case.join("log.vkey"),
        &"--head",
        &case.join("head.json"),
    ]);
    let text = stdout(&o);
    assert_eq!(code(&o), 0, "{text}{}", stderr(&o));
    assert!(
        text.trim_end().ends_with("; 1 record from 1 agent"),
        "{text}"
    );
}
