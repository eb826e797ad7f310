//! `tally report` through the real binary (docs/protocol.md §11.3): the
//! HTML report leads with PASS or FAIL and the failing checks, has a section
//! per agent, the twelve checks, the trust anchors, the pack's SHA-256 and a
//! `tally verify` command that reproduces the verification; it loads
//! nothing from outside; names from the pack (HTML, script, bidirectional
//! controls) are escaped; `--format json` validates against
//! schemas/json/audit-report.schema.json; `--from`/`--to` bound the
//! per-agent figures.

use crate::common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use sha2::Digest as _;
use tally_schemas::record::OutcomeStatus;
use tally_testkit::fixture::{self, decision, outcome, tool, tools, Fixture, PackSpec};

const SCRIPT_TOOL: &str = "<script>alert('tool')</script>";
const BIDI_TOOL: &str = "refund\u{202E}exe.txt";
const HOSTILE_CALL: &str = "\"><img src=x onerror=alert(1)>";

struct Pack {
    dir: tempfile::TempDir,
    vkey: String,
    /// The fixture's clock at the first and the last record.
    start: i64,
    end: i64,
}

impl Pack {
    fn new() -> Self {
        let mut fx = Fixture::new("tally.local/log", "log");
        fx.add_agent("claims-bot", "claims-bot/1");
        fx.add_agent("mail-bot", "mail-bot/1");
        let start = fx.now;
        fx.log(
            "claims-bot",
            tools(
                "l1",
                vec![tool("refund", true, "1"), tool(SCRIPT_TOOL, true, "1")],
            ),
        );
        for i in 0..3 {
            fx.call("claims-bot", &format!("c{i}"), "refund");
            fx.call("mail-bot", &format!("m{i}"), "send");
        }
        fx.call("claims-bot", "s1", SCRIPT_TOOL);
        fx.log(
            "claims-bot",
            tools(
                "l2",
                vec![tool("refund", true, "2"), tool(SCRIPT_TOOL, true, "1")],
            ),
        );
        let d = fx.log("claims-bot", decision(HOSTILE_CALL, BIDI_TOOL));
        fx.log(
            "claims-bot",
            outcome(HOSTILE_CALL, &d, OutcomeStatus::Error),
        );
        fx.rotate("mail-bot", "mail-bot/2");
        fx.call("mail-bot", "m9", "send");
        // A decision left open, within the grace window (pending).
        fx.log("mail-bot", decision("m-open", "send"));
        let end = fx.now;
        fx.commit();
        let spec = PackSpec::default();
        let dir = tempfile::tempdir().unwrap();
        let write =
            |name: &str, bytes: &[u8]| std::fs::write(dir.path().join(name), bytes).unwrap();
        write("pack.jsonl", &fixture::to_jsonl(&fx.pack_lines(&spec)));
        write("agent-keys.json", &fixture::to_json(&fx.agent_keys()));
        let vkey = fx.log.verifier().vkey();
        Self {
            dir,
            vkey,
            start,
            end,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn tally(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    Command::new(common::TALLY)
        .args(args.iter().map(|a| a.as_ref()))
        .output()
        .expect("run tally")
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited, not killed")
}

fn report(pack: &Path, keys: &Path, vkey: &str, extra: &[&str]) -> (i32, String, String) {
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![
        &"report",
        &pack,
        &"--agent-keys",
        &keys,
        &"--witness-key",
        &vkey,
    ];
    for e in extra {
        args.push(e);
    }
    let o = tally(&args);
    (
        code(&o),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Resolves report.schema.json for audit-report.schema.json's `$ref`,
/// from schemas/json only.
struct LocalSchemas(HashMap<String, Value>);

impl jsonschema::Retrieve for LocalSchemas {
    fn retrieve(
        &self,
        uri: &jsonschema::Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        self.0
            .get(uri.as_str())
            .cloned()
            .ok_or_else(|| format!("no local schema for {uri}").into())
    }
}

fn audit_schema() -> jsonschema::Validator {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/json");
    let load = |name: &str| -> Value {
        serde_json::from_slice(&std::fs::read(dir.join(name)).unwrap()).unwrap()
    };
    let mut map = HashMap::new();
    map.insert(
        "https://schemas.tally.invalid/v1/report.schema.json".to_owned(),
        load("report.schema.json"),
    );
    jsonschema::options()
        .with_retriever(LocalSchemas(map))
        .build(&load("audit-report.schema.json"))
        .expect("a valid schema")
}

#[test]
fn the_html_report_leads_with_the_verdict_escapes_names_and_reproduces() {
    let p = Pack::new();
    let pack = p.path("pack.jsonl");
    let keys = p.path("agent-keys.json");
    let (c, html, err) = report(&pack, &keys, &p.vkey, &[]);
    assert_eq!(c, 0, "{err}");
    // The verdict comes before anything else the body says.
    let body = html.split_once("<body>").unwrap().1;
    assert!(
        body.starts_with(r#"<section id="verdict" class="pass"><h1>PASS</h1>"#),
        "{}",
        &body[..200.min(body.len())]
    );
    for agent in ["claims-bot", "mail-bot"] {
        assert!(
            html.contains(&format!("<h2>Agent <code>{agent}</code></h2>")),
            "{agent}"
        );
    }
    for check in tally_schemas::report::CheckId::ALL {
        assert!(
            html.contains(&format!("<td><code>{}</code></td>", check.as_str())),
            "{check:?}"
        );
    }
    // Self-contained: no script, no external resource.
    assert!(!html.contains("<script"), "a raw script tag");
    assert!(!html.contains("<img"), "a raw img tag");
    assert!(!html.contains("<link"));
    assert!(!html.contains(" src=\""));
    assert!(!html.contains(" href=\"http"));
    assert!(!html.contains("url("));
    assert!(html.contains("&lt;script&gt;alert(&#39;tool&#39;)&lt;/script&gt;"));
    assert!(html.contains("&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"));
    assert!(!html.contains('\u{202E}'), "a raw bidi override");
    assert!(
        html.contains(r"refund\u{202e}exe.txt"),
        "the escape of §11.2"
    );
    // Charts, the open decision, the error, the key change, the tool change.
    assert!(html.matches("<svg ").count() >= 2);
    assert!(html.contains("m-open"));
    assert!(html.contains("<td>error</td>"));
    assert!(html.contains("<h3>Key changes</h3><table>"));
    assert!(html.contains("tool refund changed at seq"), "{html}");
    // The pack's SHA-256 and the trust anchors.
    let sha = hex::encode(sha2::Sha256::digest(std::fs::read(&pack).unwrap()));
    assert!(html.contains(&sha));
    assert!(html.contains(&p.vkey));
    // The reproducing command runs and passes.
    let cmd = html
        .split_once("<pre>tally verify ")
        .and_then(|(_, rest)| rest.split_once("</pre>"))
        .map(|(c, _)| c.to_owned())
        .expect("a tally verify command");
    let words: Vec<String> = cmd
        .split(' ')
        .map(|w| w.replace("&#39;", "'").trim_matches('\'').to_owned())
        .collect();
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"verify"];
    for w in &words {
        args.push(w);
    }
    let o = tally(&args);
    assert_eq!(code(&o), 0, "{cmd}: {}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn the_json_report_validates_and_from_to_bound_the_figures() {
    let p = Pack::new();
    let pack = p.path("pack.jsonl");
    let keys = p.path("agent-keys.json");
    let out = p.path("report.json");
    let (c, _, err) = report(
        &pack,
        &keys,
        &p.vkey,
        &["--format", "json", "-o", out.to_str().unwrap()],
    );
    assert_eq!(c, 0, "{err}");
    let v: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let errors: Vec<String> = audit_schema()
        .iter_errors(&v)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    let claims = &v["agents"][0];
    assert_eq!(claims["agent"], "claims-bot");
    assert_eq!(claims["calls"], 5);
    assert_eq!(claims["not_ok"][0]["tool"], BIDI_TOOL);
    assert_eq!(claims["not_ok"][0]["status"], "error");
    let mail = &v["agents"][1];
    assert_eq!(mail["open"][0]["call_id"], "m-open");
    assert_eq!(mail["key_changes"].as_array().unwrap().len(), 1);
    assert!(claims["statements"].as_array().unwrap().iter().any(|s| s
        .as_str()
        .unwrap()
        .starts_with("tool refund changed at seq")));
    assert_eq!(v["verification"]["result"], "PASS");

    // The first ten seconds: only the first records.
    let t = |ms: i64| tally_schemas::UnixMillis::new(ms).to_rfc3339().unwrap();
    let (c, json, err) = report(
        &pack,
        &keys,
        &p.vkey,
        &[
            "--format",
            "json",
            "--from",
            &t(p.start),
            "--to",
            &t(p.start + 10_000),
        ],
    );
    assert_eq!(c, 0, "{err}");
    let v: Value = serde_json::from_str(&json).unwrap();
    let total: u64 = v["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["period_records"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 10, "{json}");
    assert!(p.end > p.start + 10_000);
    assert_eq!(v["period"]["from"], t(p.start));
    // The checks still cover the whole pack.
    assert_eq!(
        v["verification"]["records"],
        v["agents"][0]["records"].as_u64().unwrap() + v["agents"][1]["records"].as_u64().unwrap()
    );

    // Bad times are usage errors.
    let (c, _, err) = report(&pack, &keys, &p.vkey, &["--from", "yesterday"]);
    assert_eq!(c, 2, "{err}");
    assert!(
        err.contains("--from \"yesterday\": not an RFC 3339 time"),
        "{err}"
    );
    let (c, _, err) = report(
        &pack,
        &keys,
        &p.vkey,
        &["--from", &t(p.end), "--to", &t(p.start)],
    );
    assert_eq!(c, 2, "{err}");
    assert!(err.contains("is not before --to"), "{err}");
}

#[test]
fn a_failing_pack_leads_with_fail_and_the_failing_checks() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/conformance");
    let valid = corpus.join("valid");
    let vkey = std::fs::read_to_string(valid.join("log.vkey")).unwrap();
    let (c, html, err) = report(
        &corpus.join("record-edit-note-text/pack.jsonl"),
        &valid.join("agent-keys.json"),
        vkey.trim(),
        &[],
    );
    assert_eq!(c, 1, "{err}");
    let body = html.split_once("<body>").unwrap().1;
    assert!(
        body.starts_with(r#"<section id="verdict" class="fail"><h1>FAIL</h1>"#),
        "{body}"
    );
    let verdict = body.split_once("</section>").unwrap().0;
    assert!(
        verdict.contains(
            r#"<p>Failing checks:</p><ul><li><span class="st-fail">record_signatures</span>"#
        ),
        "{verdict}"
    );
}
