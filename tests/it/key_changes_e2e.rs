//! Through the real binaries: a key change cannot make witnessed records
//! fail audit (docs/protocol.md §4.1 "Key changes"), unusable keys are
//! refused, and a witness whose log is not public serves monitors and
//! auditors that hold a read token (docs/operations.md "Who can read the
//! log").

use crate::common;

use base64::Engine as _;
use std::path::Path;
use std::process::Command;

use common::{tally, Server, TALLY};

/// `tally agent init` (key in `state`) and `tally agent add`; returns the
/// `add` output.
fn add_agent(server: &Server, api_key: &str, state: &Path, agent: &str) -> String {
    let env = [("TALLY_STATE_DIR", state.to_str().unwrap())];
    let (ok, out, err) = tally(
        &[
            "agent",
            "init",
            agent,
            "--witness",
            &server.url,
            "--api-key",
            api_key,
        ],
        &env,
    );
    assert!(ok, "agent init: {err}");
    let public = out
        .lines()
        .find_map(|l| l.strip_prefix("public key: "))
        .unwrap_or_else(|| panic!("no public key in {out}"))
        .trim()
        .to_owned();
    let (ok, out, err) = tally(
        &[
            "agent",
            "add",
            agent,
            "--public-key",
            &public,
            "--witness",
            &server.url,
            "--api-key",
            api_key,
        ],
        &[],
    );
    assert!(ok, "agent add: {err}");
    out
}

/// Records `n` notes for `agent`, each waiting for its receipt.
fn record_notes(state: &Path, agent: &str, n: usize) {
    let env = [("TALLY_STATE_DIR", state.to_str().unwrap())];
    for i in 0..n {
        let (ok, _, err) = tally(
            &[
                "record",
                "note",
                "--agent",
                agent,
                &format!("note {i}"),
                "--wait-receipt",
            ],
            &env,
        );
        assert!(ok, "record note: {err}");
    }
}

/// `tally keys export`, `tally export` and `tally verify`: (passed, report).
fn export_and_verify(
    server: &Server,
    api_key: &str,
    vkey: &str,
    dir: &Path,
    agent: &str,
) -> (bool, String) {
    let env = [
        ("TALLY_WITNESS_URL", server.url.as_str()),
        ("TALLY_API_KEY", api_key),
    ];
    let keys = dir.join(format!("{agent}-keys.json"));
    let pack = dir.join(format!("{agent}-pack.jsonl"));
    let (ok, _, err) = tally(&["keys", "export", "-o", keys.to_str().unwrap()], &env);
    assert!(ok, "keys export: {err}");
    // The same pack file is exported again after each key change.
    let (ok, _, err) = tally(
        &[
            "export",
            "--agent",
            agent,
            "-o",
            pack.to_str().unwrap(),
            "--force",
        ],
        &env,
    );
    assert!(ok, "export: {err}");
    let (ok, out, err) = tally(
        &[
            "verify",
            pack.to_str().unwrap(),
            "--agent-keys",
            keys.to_str().unwrap(),
            "--witness-key",
            vkey,
        ],
        &[],
    );
    (ok, format!("{out}{err}"))
}

fn plus_one_ms(time: &str) -> String {
    let t = tally_schemas::UnixMillis::parse_rfc3339(time).unwrap();
    tally_schemas::UnixMillis::new(t.as_millis() + 1)
        .to_rfc3339()
        .unwrap()
}

#[test]
fn a_rotation_or_retirement_cannot_reach_back_into_witnessed_records() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let api_key = server.banner_value("API key");
    let vkey = server.banner_value("witness key");
    let state = dir.path().join("agents");
    let added = add_agent(&server, &api_key, &state, "claims-bot");
    let not_before = added
        .lines()
        .find_map(|l| l.split("valid from ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no validity in {added}"))
        .to_owned();
    record_notes(&state, "claims-bot", 3);
    let (ok, report) = export_and_verify(&server, &api_key, &vkey, dir.path(), "claims-bot");
    assert!(ok, "before any change:\n{report}");

    // The attack: end the first key 1 ms after it began, before the three
    // receipted records.
    let env = [
        ("TALLY_WITNESS_URL", server.url.as_str()),
        ("TALLY_API_KEY", api_key.as_str()),
    ];
    let new_public = tally_schemas::SecretKey::generate(&mut rand_core::OsRng)
        .public_key()
        .to_base64();
    let early = plus_one_ms(&not_before);
    let (ok, out, err) = tally(
        &[
            "agent",
            "rotate",
            "claims-bot",
            "--public-key",
            &new_public,
            "--at",
            &early,
        ],
        &env,
    );
    assert!(
        !ok && err.contains("409 retroactive_key_change"),
        "rotate at {early}: {out}{err}"
    );
    let (ok, out, err) = tally(&["agent", "retire", "claims-bot", "--at", &early], &env);
    assert!(
        !ok && err.contains("409 retroactive_key_change"),
        "retire at {early}: {out}{err}"
    );
    let (ok, report) = export_and_verify(&server, &api_key, &vkey, dir.path(), "claims-bot");
    assert!(ok, "after the refused changes:\n{report}");

    // A rotation without an instant is allowed, and history still passes.
    let (ok, out, err) = tally(
        &["agent", "rotate", "claims-bot", "--public-key", &new_public],
        &env,
    );
    assert!(ok, "rotate now: {out}{err}");
    let (ok, report) = export_and_verify(&server, &api_key, &vkey, dir.path(), "claims-bot");
    assert!(ok, "after the rotation:\n{report}");
    assert!(report.contains("agent_keys: pass"), "{report}");

    // Unusable keys are refused before anything is sent: the identity point.
    let identity = {
        let mut b = [0u8; 32];
        b[0] = 1;
        base64::engine::general_purpose::STANDARD.encode(b)
    };
    let (ok, out, err) = tally(
        &["agent", "add", "weak-bot", "--public-key", &identity],
        &env,
    );
    assert!(!ok && err.contains("small order"), "{out}{err}");
}

/// One `tally monitor --once` round, with `extra` arguments and `env`.
fn monitor(
    server: &Server,
    vkey: &str,
    state: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (i32, String) {
    let out = Command::new(TALLY)
        .args([
            "monitor",
            "--once",
            "--log",
            &server.url,
            "--witness-key",
            vkey,
            "--state",
        ])
        .arg(state)
        .args(extra)
        .env_remove("TALLY_READ_TOKEN")
        .envs(env.iter().copied())
        .output()
        .expect("run tally monitor");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn a_token_mode_log_serves_monitors_and_auditors_with_read_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data, &["--log-read", "token"]);
    assert!(
        server.banner.contains("readable with a read token only"),
        "{}",
        server.banner
    );
    let api_key = server.banner_value("API key");
    let vkey = server.banner_value("witness key");
    let state = dir.path().join("agents");
    add_agent(&server, &api_key, &state, "claims-bot");
    record_notes(&state, "claims-bot", 2);

    // The operator makes a read token for the monitor and the auditor.
    let admin = [
        ("TALLY_WITNESS_URL", server.url.as_str()),
        ("TALLY_DATA_DIR", data.to_str().unwrap()),
    ];
    let (ok, out, err) = tally(&["read-token", "create", "--label", "auditor"], &admin);
    assert!(ok, "read-token create: {out}{err}");
    let token = out
        .lines()
        .find_map(|l| l.strip_prefix("read token: "))
        .unwrap_or_else(|| panic!("no token in {out}"))
        .trim()
        .to_owned();
    let id = out
        .lines()
        .find_map(|l| l.strip_prefix("id:"))
        .unwrap()
        .trim()
        .to_owned();

    // A monitor without it is told why it cannot read; with it, it follows.
    let mstate = dir.path().join("monitor.state");
    let (code, out) = monitor(&server, &vkey, &mstate, &[], &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("read-token holders only"), "{out}");
    for tiles in [false, true] {
        let extra: &[&str] = if tiles { &["--from-tiles"] } else { &[] };
        let (code, out) = monitor(
            &server,
            &vkey,
            &mstate,
            extra,
            &[("TALLY_READ_TOKEN", &token)],
        );
        assert_eq!(code, 0, "{out}");
        record_notes(&state, "claims-bot", 1);
    }
    let (code, out) = monitor(&server, &vkey, &mstate, &["--read-token", &token], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("consistent: size"), "{out}");

    // The auditor: a pack and head.json with the read token, the keys from
    // the operator (API key), then an offline verify.
    let keys = dir.path().join("agent-keys.json");
    let pack = dir.path().join("pack.jsonl");
    let head = dir.path().join("head.json");
    let (ok, _, err) = tally(
        &["keys", "export", "-o", keys.to_str().unwrap()],
        &[
            ("TALLY_WITNESS_URL", &server.url),
            ("TALLY_API_KEY", &api_key),
        ],
    );
    assert!(ok, "{err}");
    let reader = [
        ("TALLY_WITNESS_URL", server.url.as_str()),
        ("TALLY_READ_TOKEN", token.as_str()),
    ];
    let (ok, out, err) = tally(
        &[
            "export",
            "--agent",
            "claims-bot",
            "-o",
            pack.to_str().unwrap(),
        ],
        &reader,
    );
    assert!(ok, "export with a read token: {out}{err}");
    record_notes(&state, "claims-bot", 1);
    let (ok, out, err) = tally(
        &[
            "head",
            "--pack",
            pack.to_str().unwrap(),
            "-o",
            head.to_str().unwrap(),
        ],
        &reader,
    );
    assert!(ok, "head with a read token: {out}{err}");
    let (ok, out, err) = tally(
        &[
            "verify",
            pack.to_str().unwrap(),
            "--agent-keys",
            keys.to_str().unwrap(),
            "--head",
            head.to_str().unwrap(),
            "--witness-key",
            &vkey,
        ],
        &[],
    );
    assert!(ok && out.contains("head: pass"), "{out}{err}");

    // Revoked: the monitor stops, and says the token was refused.
    let (ok, out, err) = tally(&["read-token", "revoke", &id], &admin);
    assert!(ok, "{out}{err}");
    let (ok, out, _) = tally(&["read-token", "list"], &admin);
    assert!(
        ok && out.contains("revoked") && out.contains("auditor"),
        "{out}"
    );
    let (code, out) = monitor(&server, &vkey, &mstate, &["--read-token", &token], &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("refused the read token"), "{out}");
}
