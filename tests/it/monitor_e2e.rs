//! `tally monitor` against the real `tally serve` (docs/operations.md
//! "Monitoring"): it follows
//! a growing log through the JSON consistency route and through C2SP tiles,
//! and it catches a fork made for real: the data folder is copied while the
//! witness is stopped, both copies are served with the same checkpoint key,
//! and each gets different records.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::{add_agent, copy_dir, record_notes, Server, TALLY};

/// One `tally monitor --once` round: (exit code, stdout + stderr).
fn monitor(server: &Server, vkey: &str, state: &Path, tiles: bool) -> (i32, String) {
    let mut cmd = Command::new(TALLY);
    cmd.args([
        "monitor",
        "--once",
        "--log",
        &server.url,
        "--witness-key",
        vkey,
        "--state",
    ])
    .arg(state);
    if tiles {
        cmd.arg("--from-tiles");
    }
    let out = cmd.output().expect("run tally monitor");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn monitor_follows_a_real_log_and_catches_a_real_fork() {
    let dir = tempfile::tempdir().unwrap();
    let (data_a, data_b) = (dir.path().join("data-a"), dir.path().join("data-b"));
    let agents = dir.path().join("agents");

    let a = Server::start(&data_a, &[]);
    let vkey = a.banner_value("witness key");
    // Shown only on first start; the copy in B's data folder accepts it too.
    let api_key = a.banner_value("API key");
    let json_state = dir.path().join("monitor-json.state");
    let tiles_state = dir.path().join("monitor-tiles.state");

    // The empty log is the first checkpoint; equal sizes are "unchanged".
    let (code, out) = monitor(&a, &vkey, &json_state, false);
    assert_eq!(code, 0, "{out}");
    let (code, out) = monitor(&a, &vkey, &json_state, false);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("unchanged"), "{out}");

    add_agent(&a, &api_key, &agents, "alpha");
    record_notes(&agents, "alpha", 3);
    for (state, tiles) in [(&json_state, false), (&tiles_state, true)] {
        let (code, out) = monitor(&a, &vkey, state, tiles);
        assert_eq!(code, 0, "{out}");
    }
    record_notes(&agents, "alpha", 4);
    for (state, tiles) in [(&json_state, false), (&tiles_state, true)] {
        let (code, out) = monitor(&a, &vkey, state, tiles);
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("consistent"), "{out}");
    }

    // A monitor pinned to another key refuses the log outright.
    let other = Server::start(&dir.path().join("data-other"), &[]);
    let other_key = other.banner_value("witness key");
    drop(other);
    let (code, out) = monitor(
        &a,
        &other_key,
        &dir.path().join("monitor-other.state"),
        false,
    );
    assert_ne!(
        code, 0,
        "a checkpoint under a foreign key must not verify: {out}"
    );

    // Fork: stop A, copy its data folder (same checkpoint key, same history so
    // far), serve both, and give each different records.
    assert!(a.sigterm().success());
    copy_dir(&data_a, &data_b);
    let a = Server::start(&data_a, &[]);
    let b = Server::start(&data_b, &[]);
    let (agents_a, agents_b) = (dir.path().join("agents-a"), dir.path().join("agents-b"));
    add_agent(&a, &api_key, &agents_a, "beta-a");
    record_notes(&agents_a, "beta-a", 2);
    add_agent(&b, &api_key, &agents_b, "beta-b");
    record_notes(&agents_b, "beta-b", 5);

    // The monitor follows A, then is shown B: same key, different history.
    for (state, tiles) in [(&json_state, false), (&tiles_state, true)] {
        let (code, out) = monitor(&a, &vkey, state, tiles);
        assert_eq!(code, 0, "A alone is consistent: {out}");
        let before = std::fs::read(state).unwrap();
        let (code, out) = monitor(&b, &vkey, state, tiles);
        assert_ne!(code, 0, "the fork must be caught (tiles: {tiles}): {out}");
        assert_eq!(
            std::fs::read(state).unwrap(),
            before,
            "the last verified checkpoint must not move to the forked log"
        );
    }
}
