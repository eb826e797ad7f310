//! Disclosure through the real binaries (docs/protocol.md §6.3): a witness
//! (`tally serve`), two agents recording calls with `--store-content`, a
//! pack exported from the witness; `tally disclose` writes a call's content
//! and salts from the agent's store, and `tally verify --disclosure` checks
//! it: a matching one passes and prints the content escaped; a changed byte
//! of content or of salt fails naming the record; a disclosure edited to
//! name another agent does not check; `tally disclose` refuses a call that
//! is not in the agent's own chain; `tally report` shows the disclosed call
//! escaped for HTML.

use crate::common;

use std::path::Path;

use common::{add_agent, tally, Server};
use serde_json::Value;

const HOSTILE_INPUT: &str =
    r#"{"to":"<script>alert('x')</script>","note":"pay\u202Eexe.txt","amount":12}"#;

fn record(state: &Path, args: &[&str]) -> String {
    let env = [("TALLY_STATE_DIR", state.to_str().unwrap())];
    let (ok, out, err) = tally(args, &env);
    assert!(ok, "{args:?}: {err}");
    out
}

struct Setup {
    _dir: tempfile::TempDir,
    _server: Server,
    dir: std::path::PathBuf,
    state: std::path::PathBuf,
    vkey: String,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let server = Server::start(&dir.join("data"), &[]);
    let api_key = server.banner_value("API key");
    let vkey = server.banner_value("witness key");
    let state = dir.join("agents");
    add_agent(&server, &api_key, &state, "claims-bot");
    add_agent(&server, &api_key, &state, "mail-bot");
    let common = ["--store-content", "--wait-receipt"];
    let mut args = vec![
        "record",
        "decision",
        "--agent",
        "claims-bot",
        "--tool",
        "refund",
        "--call-id",
        "c1",
        "--input",
        HOSTILE_INPUT,
    ];
    args.extend(common);
    record(&state, &args);
    let mut args = vec![
        "record",
        "outcome",
        "--agent",
        "claims-bot",
        "--call-id",
        "c1",
        "--status",
        "ok",
        "--output",
        r#"{"content":[{"type":"text","text":"refunded <b>12</b>"}]}"#,
    ];
    args.extend(common);
    record(&state, &args);
    let mut args = vec![
        "record",
        "decision",
        "--agent",
        "mail-bot",
        "--tool",
        "send",
        "--call-id",
        "m1",
        "--input",
        r#"{"to":"a@example.com"}"#,
    ];
    args.extend(common);
    record(&state, &args);
    let mut args = vec![
        "record",
        "outcome",
        "--agent",
        "mail-bot",
        "--call-id",
        "m1",
        "--status",
        "ok",
        "--output",
        r#"{"content":[]}"#,
    ];
    args.extend(common);
    record(&state, &args);
    let env = [
        ("TALLY_WITNESS_URL", server.url.as_str()),
        ("TALLY_API_KEY", api_key.as_str()),
    ];
    let keys = dir.join("agent-keys.json");
    let pack = dir.join("pack.jsonl");
    let (ok, _, err) = tally(&["keys", "export", "-o", keys.to_str().unwrap()], &env);
    assert!(ok, "keys export: {err}");
    let (ok, _, err) = tally(
        &[
            "export",
            "--agent",
            "claims-bot",
            "--agent",
            "mail-bot",
            "-o",
            pack.to_str().unwrap(),
        ],
        &env,
    );
    assert!(ok, "export: {err}");
    Setup {
        _dir: tmp,
        _server: server,
        dir,
        state,
        vkey,
    }
}

fn disclose(s: &Setup, args: &[&str]) -> (bool, String) {
    let env = [("TALLY_STATE_DIR", s.state.to_str().unwrap())];
    let mut all = vec!["disclose"];
    all.extend(args);
    let (ok, out, err) = tally(&all, &env);
    (ok, format!("{out}{err}"))
}

/// `tally verify` with the disclosures: (exit code, stdout).
fn verify(s: &Setup, disclosures: &[&Path]) -> (i32, String) {
    let mut cmd = std::process::Command::new(common::TALLY);
    cmd.arg("verify")
        .arg(s.dir.join("pack.jsonl"))
        .arg("--agent-keys")
        .arg(s.dir.join("agent-keys.json"))
        .arg("--witness-key")
        .arg(&s.vkey);
    for d in disclosures {
        cmd.arg("--disclosure").arg(d);
    }
    let o = cmd.output().unwrap();
    (
        o.status.code().unwrap(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

fn edit(from: &Path, to: &Path, f: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_slice(&std::fs::read(from).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(to, serde_json::to_vec(&v).unwrap()).unwrap();
}

#[test]
fn a_disclosed_call_checks_against_its_record_and_a_changed_byte_does_not() {
    let s = setup();
    let file = s.dir.join("c1.json");
    let (ok, out) = disclose(
        &s,
        &[
            "--agent",
            "claims-bot",
            "--call-id",
            "c1",
            "-o",
            file.to_str().unwrap(),
        ],
    );
    assert!(ok, "{out}");
    let d: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(d["input"]["seq"], 0);
    assert_eq!(d["output"]["seq"], 1);
    assert_eq!(d["input"]["content"]["amount"], 12);

    // A match passes and prints the content, escaped.
    let (code, out) = verify(&s, &[&file]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(": match: call \"c1\": input (claims-bot#0) and output (claims-bot#1) match"),
        "{out}"
    );
    assert!(out.contains(r"pay\u{202e}exe.txt"), "{out}");
    assert!(!out.contains('\u{202E}'), "{out}");
    assert!(
        out.contains("<script>alert('x')</script>"),
        "the text form keeps what is not spoofing: {out}"
    );

    // The JSON report carries the disclosures and validates.
    let mut cmd = std::process::Command::new(common::TALLY);
    let o = cmd
        .arg("verify")
        .arg(s.dir.join("pack.jsonl"))
        .arg("--agent-keys")
        .arg(s.dir.join("agent-keys.json"))
        .arg("--witness-key")
        .arg(&s.vkey)
        .arg("--disclosure")
        .arg(&file)
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    let schema: Value = serde_json::from_slice(
        &std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/json/report.schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let v = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = v.iter_errors(&report).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(report["disclosures"][0]["status"], "match");
    assert_eq!(report["disclosures"][0]["input"]["amount"], 12);

    // Only the input.
    let only = s.dir.join("c1-input.json");
    let (ok, out) = disclose(
        &s,
        &[
            "--agent",
            "claims-bot",
            "--call-id",
            "c1",
            "--input",
            "-o",
            only.to_str().unwrap(),
        ],
    );
    assert!(ok, "{out}");
    let d: Value = serde_json::from_slice(&std::fs::read(&only).unwrap()).unwrap();
    assert!(d.get("output").is_none());
    let (code, out) = verify(&s, &[&only]);
    assert_eq!(code, 0, "{out}");

    // A changed byte of content.
    let bad = s.dir.join("bad-content.json");
    edit(&file, &bad, |v| v["input"]["content"]["amount"] = 13.into());
    let (code, out) = verify(&s, &[&file, &bad]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("bad-content.json: mismatch: input does not match claims-bot#0's input_hash"),
        "{out}"
    );
    assert!(
        out.contains("; 1 of 2 disclosures did not check; "),
        "{out}"
    );
    // A changed byte of salt.
    let bad = s.dir.join("bad-salt.json");
    edit(&file, &bad, |v| {
        let salt = v["output"]["salt"].as_str().unwrap().to_owned();
        let flipped = if salt.starts_with('0') { "1" } else { "0" };
        v["output"]["salt"] = format!("{flipped}{}", &salt[1..]).into();
    });
    let (code, out) = verify(&s, &[&bad]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("mismatch: output does not match claims-bot#1's output_hash"),
        "{out}"
    );

    // Another agent's record: edited to name mail-bot, it is checked
    // against mail-bot#0, which is call m1.
    let other = s.dir.join("other-agent.json");
    edit(&file, &other, |v| v["agent"] = "mail-bot".into());
    let (code, out) = verify(&s, &[&other]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("mismatch: mail-bot#0 is of call \"m1\", not \"c1\""),
        "{out}"
    );
    // A record not in the pack is named.
    let absent = s.dir.join("absent.json");
    edit(&file, &absent, |v| {
        v["input"]["seq"] = 40.into();
        v.as_object_mut().unwrap().remove("output");
    });
    let (code, out) = verify(&s, &[&absent]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "not_in_pack: call \"c1\": claims-bot#40 is not among the pack's verified records"
        ),
        "{out}"
    );
    let nobody = s.dir.join("nobody.json");
    edit(&file, &nobody, |v| v["agent"] = "ghost-bot".into());
    let (code, out) = verify(&s, &[&nobody]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("the pack holds no agent \"ghost-bot\""),
        "{out}"
    );
    // Not a disclosure file: a usage error.
    let junk = s.dir.join("junk.json");
    std::fs::write(&junk, br#"{"v":1,"agent":"claims-bot","call_id":"c1"}"#).unwrap();
    let (code, out) = verify(&s, &[&junk]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("discloses nothing"), "{out}");

    // tally disclose refuses a call of another agent's chain, and a call
    // it does not know.
    let (ok, out) = disclose(
        &s,
        &[
            "--agent",
            "mail-bot",
            "--call-id",
            "c1",
            "-o",
            s.dir.join("x.json").to_str().unwrap(),
        ],
    );
    assert!(!ok, "{out}");
    assert!(
        out.contains("agent mail-bot's chain holds no call \"c1\""),
        "{out}"
    );
    assert!(!s.dir.join("x.json").exists());

    // The report shows the disclosed call, escaped for HTML.
    let o = std::process::Command::new(common::TALLY)
        .arg("report")
        .arg(s.dir.join("pack.jsonl"))
        .arg("--agent-keys")
        .arg(s.dir.join("agent-keys.json"))
        .arg("--witness-key")
        .arg(&s.vkey)
        .arg("--disclosure")
        .arg(&file)
        .output()
        .unwrap();
    let html = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(html.contains("<h2>Disclosed calls</h2>"), "{html}");
    assert!(
        html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"),
        "{html}"
    );
    assert!(html.contains(r"pay\u{202e}exe.txt"));
    assert!(!html.contains("<script"));
    assert!(
        html.contains("--disclosure"),
        "the reproducing command names it"
    );
}
