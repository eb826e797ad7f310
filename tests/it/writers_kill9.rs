//! Several writers of one agent's chain, killed at random (docs/operations.md
//! "Several writers for one agent"): four loops of the real `tally record`
//! write notes for one agent at once while another thread SIGKILLs one of
//! the running processes every few tens of milliseconds, whichever holds the
//! chain at the time included. Every note a process acknowledged (exit 0,
//! its JSON line) is in the chain exactly once at the seq and hash it
//! printed, no note is in it twice, the chain is one line, and a process
//! that was not killed never failed: no writer was left blocked by a dead
//! one.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::common::{not_beside_heavy, tally, TALLY};

const WRITERS: usize = 4;
const RUN_FOR: Duration = Duration::from_secs(4);

#[derive(Default)]
struct Seen {
    acknowledged: BTreeMap<String, (u64, String)>,
    killed: usize,
    failed: Vec<String>,
}

#[test]
fn killing_any_writer_loses_nothing_it_acknowledged_and_blocks_no_other() {
    // Hundreds of processes in four seconds: not beside the suites that
    // load the machine on their own.
    let _quiet = not_beside_heavy();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let env = [("TALLY_STATE_DIR", state.to_str().unwrap())];
    let (ok, _, err) = tally(&["agent", "init", "many"], &env);
    assert!(ok, "{err}");
    let running: Arc<Mutex<BTreeSet<u32>>> = Arc::default();
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let end = Instant::now() + RUN_FOR;
    let mut threads = Vec::new();
    for w in 0..WRITERS {
        let (running, seen, state) = (Arc::clone(&running), Arc::clone(&seen), state.clone());
        threads.push(std::thread::spawn(move || {
            let mut i = 0;
            while Instant::now() < end {
                let text = format!("w{w}-{i}");
                i += 1;
                let child = Command::new(TALLY)
                    .args(["record", "note", "--agent", "many", &text])
                    .env("TALLY_STATE_DIR", &state)
                    .env_remove("TALLY_API_KEY")
                    .env_remove("TALLY_WITNESS_URL")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                let pid = child.id();
                running.lock().unwrap().insert(pid);
                let out = child.wait_with_output().unwrap();
                let was_killed = !running.lock().unwrap().remove(&pid);
                let mut seen = seen.lock().unwrap();
                if out.status.success() {
                    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                    seen.acknowledged.insert(
                        text,
                        (
                            line["seq"].as_u64().unwrap(),
                            line["hash"].as_str().unwrap().to_owned(),
                        ),
                    );
                } else if was_killed {
                    seen.killed += 1;
                } else {
                    seen.failed.push(format!(
                        "{text}: {:?}: {}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr)
                    ));
                }
            }
        }));
    }
    let killer = {
        let running = Arc::clone(&running);
        std::thread::spawn(move || {
            let mut n = 0u64;
            while Instant::now() < end {
                // Every 20 to 60 ms, the most recent process still running.
                std::thread::sleep(Duration::from_millis(20 + (n * 13) % 41));
                n += 1;
                let victim = running.lock().unwrap().pop_last();
                if let Some(pid) = victim {
                    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                }
            }
        })
    };
    for t in threads {
        t.join().unwrap();
    }
    killer.join().unwrap();

    let seen = seen.lock().unwrap();
    assert!(seen.failed.is_empty(), "{:#?}", seen.failed);
    assert!(seen.killed >= 10, "only {} kills", seen.killed);
    assert!(
        seen.acknowledged.len() >= 20,
        "{} acknowledged",
        seen.acknowledged.len()
    );
    let (ok, out, err) = tally(&["status", "--agent", "many", "--json", "--records"], &env);
    assert!(ok, "{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    let chain = status["agents"][0]["chain"].as_array().unwrap().clone();
    let mut texts = BTreeMap::new();
    let mut prev = serde_json::Value::Null;
    for (i, e) in chain.iter().enumerate() {
        let r = &e["record"];
        assert_eq!(r["seq"].as_u64(), Some(i as u64));
        assert_eq!(r["prev"], prev, "seq {i}");
        prev = e["hash"].clone();
        let text = r["body"]["text"].as_str().unwrap().to_owned();
        let hash = e["hash"].as_str().unwrap().to_owned();
        assert!(
            texts.insert(text.clone(), (i as u64, hash)).is_none(),
            "{text} is in the chain twice"
        );
    }
    for (text, at) in &seen.acknowledged {
        assert_eq!(texts.get(text), Some(at), "acknowledged {text}");
    }
    eprintln!(
        "{} acknowledged, {} killed, {} in the chain",
        seen.acknowledged.len(),
        seen.killed,
        chain.len()
    );
}
