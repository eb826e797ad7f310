//! Through the real binaries: a key change cannot make witnessed records
//! fail audit (docs/protocol.md §4.1 "Key changes"), and unusable keys are
//! refused.

mod common;

use std::path::Path;

use common::{tally, Server};

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
    let (ok, _, err) = tally(
        &["export", "--agent", agent, "-o", pack.to_str().unwrap()],
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
        tally_schemas::PublicKey::from_bytes(&b)
            .unwrap()
            .to_base64()
    };
    let (ok, out, err) = tally(
        &["agent", "add", "weak-bot", "--public-key", &identity],
        &env,
    );
    assert!(!ok && err.contains("small order"), "{out}{err}");
}
