//! `tally cosigner` against real `tally serve` logs (docs/protocol.md §14):
//!
//! - a fork made for real: a log's data folder copied while it is stopped
//!   and both copies grown differently, signed by the same key. The
//!   cosigner cosigns one branch and refuses the other; `tally monitor`
//!   prints both checkpoints as evidence, and with a trust file reports a
//!   checkpoint without its quorum of cosignatures;
//! - kill -9 of the cosigner after it committed a new state and before it
//!   answered: restarted, it carries on from that state (409 with the
//!   size), cosigns the same checkpoint again and still refuses the other
//!   branch.
//!
//! The log side is driven by tally's cosigner client
//! (`tally_cosigner::client`), with proofs from each log's JSON route.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{add_agent, copy_dir, record_notes, tally, Server, TALLY};
use tally_cosigner::client::{attach_cosignature, ClientError, CosignerClient};
use tally_schemas::cosignature::CosignatureVerifier;
use tally_schemas::hash::Hash;
use tally_schemas::note::peek_checkpoint;
use tally_schemas::tree::TreeSize;

/// A running `tally cosigner serve`, killed on drop.
struct CosignerProc {
    child: Child,
    url: String,
}

impl Drop for CosignerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl CosignerProc {
    // The child is reaped by Drop.
    #[allow(clippy::zombie_processes)]
    fn start(dir: &Path, extra: &[&str]) -> Self {
        let mut child = Command::new(TALLY)
            .args(["cosigner", "serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tally cosigner serve");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let url = line
            .strip_prefix("tally cosigner: listening on ")
            .unwrap_or_else(|| panic!("no listening line: {line:?}"))
            .split_whitespace()
            .next()
            .unwrap()
            .to_owned();
        std::thread::spawn(move || for _ in out.lines() {});
        Self { child, url }
    }
}

/// `tally cosigner init` + `add-log` for the log key `log_vkey`; returns the
/// cosigner's vkey.
fn init_cosigner(dir: &Path, name: &str, log_vkey: &str) -> String {
    let d = dir.to_str().unwrap();
    let (ok, out, err) = tally(&["cosigner", "init", "--name", name, "--data-dir", d], &[]);
    assert!(ok, "{err}");
    // The state is never restored from a backup (docs/operations.md).
    assert!(
        out.contains("never restore an older copy") && !out.contains("together with"),
        "{out}"
    );
    let vkey = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("cosigner key"))
        .unwrap()
        .trim()
        .to_owned();
    let (ok, _, err) = tally(
        &["cosigner", "add-log", "--data-dir", d, "--key", log_vkey],
        &[],
    );
    assert!(ok, "{err}");
    vkey
}

async fn get(url: &str) -> (u16, String) {
    let r = reqwest::get(url).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The log's latest signed checkpoint.
async fn checkpoint(log: &Server) -> String {
    let (status, note) = get(&format!("{}/checkpoint", log.url)).await;
    assert_eq!(status, 200);
    note
}

/// The log's consistency proof from `from` to `to`.
async fn proof(log: &Server, from: u64, to: u64) -> Vec<Hash> {
    let (status, body) = get(&format!(
        "{}/v1/proof/consistency?from={from}&to={to}",
        log.url
    ))
    .await;
    assert_eq!(status, 200, "{body}");
    tally_verifier::monitor::parse_consistency_proof(body.as_bytes(), from, to).unwrap()
}

/// Asks `client` to cosign the latest checkpoint of `log`, believing the
/// cosigner holds `believed`; the proof for the size the cosigner names is
/// fetched from `log` first (`proof_sizes` lists the sizes it may name).
async fn cosign(
    client: &CosignerClient,
    log: &Server,
    note: &str,
    believed: u64,
    proof_sizes: &[u64],
) -> Result<tally_cosigner::client::Cosignature, ClientError> {
    let size = peek_checkpoint(note).unwrap().size.get();
    let mut proofs = Vec::new();
    for &from in proof_sizes {
        if from > 0 && from < size {
            proofs.push((from, proof(log, from, size).await));
        }
    }
    client
        .request_cosignature(note, TreeSize::new(believed), |old| {
            proofs
                .iter()
                .find(|(from, _)| *from == old.get())
                .map(|(_, p)| p.clone())
                .ok_or_else(|| format!("no proof from {old} prepared"))
        })
        .await
}

struct Fork {
    a: Server,
    b: Server,
    vkey: String,
    /// The size both branches share.
    base: u64,
}

/// A log with 3 records, stopped, copied, and both copies served and grown
/// differently: branch A by 2 records, branch B by 4.
fn fork(dir: &Path) -> Fork {
    let (data_a, data_b) = (dir.join("data-a"), dir.join("data-b"));
    let a = Server::start(&data_a, &[]);
    let vkey = a.banner_value("witness key");
    let api_key = a.banner_value("API key");
    let agents = dir.join("agents");
    add_agent(&a, &api_key, &agents, "alpha");
    record_notes(&agents, "alpha", 3);
    assert!(a.sigterm().success());
    copy_dir(&data_a, &data_b);
    let a = Server::start(&data_a, &[]);
    let b = Server::start(&data_b, &[]);
    let (agents_a, agents_b) = (dir.join("agents-a"), dir.join("agents-b"));
    add_agent(&a, &api_key, &agents_a, "beta-a");
    record_notes(&agents_a, "beta-a", 2);
    add_agent(&b, &api_key, &agents_b, "beta-b");
    record_notes(&agents_b, "beta-b", 4);
    Fork {
        a,
        b,
        vkey,
        base: 3,
    }
}

fn monitor(args: &[&str]) -> (i32, String) {
    let out = Command::new(TALLY)
        .args(["monitor", "--once"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_is_cosigned_on_one_branch_only_and_the_monitor_shows_both() {
    let dir = tempfile::tempdir().unwrap();
    let f = fork(dir.path());
    let cosigner_dir = dir.path().join("cosigner");
    let cosigner_vkey = init_cosigner(&cosigner_dir, "cosigner.example/c1", &f.vkey);
    let c = CosignerProc::start(&cosigner_dir, &[]);
    let key = CosignatureVerifier::from_vkey(&cosigner_vkey).unwrap();
    let client = CosignerClient::new(&c.url, key.clone(), Duration::from_secs(30)).unwrap();

    // Branch A: its checkpoint is cosigned (the cosigner held nothing).
    let note_a = checkpoint(&f.a).await;
    let size_a = peek_checkpoint(&note_a).unwrap().size.get();
    assert_eq!(size_a, f.base + 2);
    let got = cosign(&client, &f.a, &note_a, 0, &[]).await.unwrap();
    assert_eq!(got.size.get(), size_a);
    let cosigned_a = attach_cosignature(&note_a, &got.line);
    assert!(tally_verifier::trust::WitnessPolicy {
        witnesses: vec![key.clone()],
        quorum: 1
    }
    .check(&cosigned_a)
    .is_ok());

    // Branch B, same key, larger tree: the client learns the size the
    // cosigner holds (409) and sends B's proof from there, which cannot
    // join B to A's root: refused with 422.
    let note_b = checkpoint(&f.b).await;
    let size_b = peek_checkpoint(&note_b).unwrap().size.get();
    assert_eq!(size_b, f.base + 4);
    match cosign(&client, &f.b, &note_b, f.base, &[f.base, size_a]).await {
        Err(ClientError::Refused { status: 422, body }) => {
            assert!(body.starts_with("inconsistent: "), "{body}");
        }
        other => panic!("branch B must be refused: {other:?}"),
    }
    // Told the right old size directly, B is refused all the same.
    assert!(matches!(
        cosign(&client, &f.b, &note_b, size_a, &[size_a]).await,
        Err(ClientError::Refused { status: 422, .. })
    ));

    // The cosigner still stands on branch A: its monitoring route serves
    // A's checkpoint with its cosignature, and A grows on.
    let origin_hash = tally_cosigner::config::origin_hash(f.vkey.split('+').next().unwrap());
    let (status, served) = get(&format!("{}/{origin_hash}/checkpoint", c.url)).await;
    assert_eq!((status, served.as_str()), (200, cosigned_a.as_str()));
    let agents_a = dir.path().join("agents-a");
    record_notes(&agents_a, "beta-a", 1);
    let note_a2 = checkpoint(&f.a).await;
    let got = cosign(&client, &f.a, &note_a2, size_a, &[size_a])
        .await
        .unwrap();
    assert_eq!(got.size.get(), size_a + 1);

    // The monitor follows A, then is shown B: it prints both checkpoints.
    let state = dir.path().join("monitor.state");
    let s = state.to_str().unwrap();
    let (code, out) = monitor(&["--log", &f.a.url, "--witness-key", &f.vkey, "--state", s]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = monitor(&["--log", &f.b.url, "--witness-key", &f.vkey, "--state", s]);
    assert_eq!(code, 1, "{out}");
    let note_a_now = checkpoint(&f.a).await;
    assert!(out.contains("INCONSISTENT: "), "{out}");
    assert!(
        out.contains(&format!("--- last verified checkpoint ---\n{note_a_now}")),
        "{out}"
    );
    assert!(
        out.contains(&format!("--- new checkpoint ---\n{note_b}")),
        "{out}"
    );

    // With a trust file requiring this cosigner, the monitor reports that
    // the log's own /checkpoint carries no cosignature (this log is not
    // configured to ask the cosigner: tests/it/cosigning_e2e.rs has one that
    // is) and prints it.
    let trust = dir.path().join("trust");
    std::fs::write(
        &trust,
        format!("log {}\nwitness {cosigner_vkey}\nquorum 1\n", f.vkey),
    )
    .unwrap();
    let state2 = dir.path().join("monitor2.state");
    let (code, out) = monitor(&[
        "--log",
        &f.a.url,
        "--trust",
        trust.to_str().unwrap(),
        "--state",
        state2.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("QUORUM NOT MET: 0 of the 1"), "{out}");
    assert!(
        out.contains(&format!("--- checkpoint ---\n{note_a_now}")),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_between_commit_and_answer_then_restart_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let f = fork(dir.path());
    let cosigner_dir = dir.path().join("cosigner");
    let cosigner_vkey = init_cosigner(&cosigner_dir, "cosigner.example/c2", &f.vkey);
    let key = CosignatureVerifier::from_vkey(&cosigner_vkey).unwrap();
    let origin_hash = tally_cosigner::config::origin_hash(f.vkey.split('+').next().unwrap());

    // The cosigner waits 60 s between committing and answering; the
    // request runs in the background while the test watches the
    // monitoring route for the commit, then kills the process.
    let paused = CosignerProc::start(
        &cosigner_dir,
        &["--testing-pause-before-answer-ms", "60000"],
    );
    let client = CosignerClient::new(&paused.url, key.clone(), Duration::from_secs(90)).unwrap();
    let note_a = checkpoint(&f.a).await;
    let size_a = peek_checkpoint(&note_a).unwrap().size.get();
    let pending = {
        let (client, note) = (client.clone(), note_a.clone());
        tokio::spawn(async move {
            client
                .request_cosignature(&note, TreeSize::new(0), |_| {
                    Err::<Vec<Hash>, _>("no proof needed from 0")
                })
                .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let committed = loop {
        let (status, served) = get(&format!("{}/{origin_hash}/checkpoint", paused.url)).await;
        if status == 200 {
            break served;
        }
        assert!(Instant::now() < deadline, "the state was never committed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(committed.starts_with(&note_a), "{committed}");
    assert!(!pending.is_finished(), "the answer must still be held back");
    drop(paused); // SIGKILL
    match pending.await.unwrap() {
        Err(ClientError::Transport(_)) => {}
        other => panic!("the killed cosigner cannot have answered: {other:?}"),
    }

    // Restarted: it holds A's size (409 to a client that believes 0), and
    // the client's retry from that size gets A's checkpoint cosigned.
    let c = CosignerProc::start(&cosigner_dir, &[]);
    let client = CosignerClient::new(&c.url, key.clone(), Duration::from_secs(30)).unwrap();
    let (status, served) = get(&format!("{}/{origin_hash}/checkpoint", c.url)).await;
    assert_eq!((status, served.as_str()), (200, committed.as_str()));
    let got = cosign(&client, &f.a, &note_a, 0, &[]).await.unwrap();
    assert_eq!(got.size.get(), size_a);

    // The other branch is still refused after the crash.
    let note_b = checkpoint(&f.b).await;
    assert!(matches!(
        cosign(&client, &f.b, &note_b, 0, &[size_a]).await,
        Err(ClientError::Refused { status: 422, .. })
    ));

    // And a state file that disappears is not taken for a fresh start.
    drop(c);
    std::fs::rename(
        cosigner_dir.join("state.redb"),
        dir.path().join("state.redb.moved"),
    )
    .unwrap();
    let out = Command::new(TALLY)
        .args(["cosigner", "serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&cosigner_dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the cosigner's state is lost"), "{err}");
}
