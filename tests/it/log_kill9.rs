//! The kill -9 loop (docs/storage.md "Recovery (open, and after a write
//! error)"), run against the real `tally serve`: append under load over
//! HTTP, SIGKILL the server at a random moment, restart it on the same data
//! folder, and after every restart check that
//! - every receipt ever acknowledged still stands: its checkpoint (verified
//!   with the pinned key when the receipt arrived, with `Receipt::verify`) is
//!   proven consistent with the new checkpoint through the JSON consistency
//!   route, and retrying the records acknowledged just before the kill
//!   returns their original receipts byte for byte;
//! - the new checkpoint is consistent with every checkpoint seen before
//!   (every receipt checkpoint and every checkpoint after a restart);
//! - a record whose answer was lost in the crash is either in the log or
//!   can still be appended (retrying it is safe).
//!
//! Every sixth stop is a SIGTERM instead (docs/operations.md "Shutdown,
//! crashes, restarts": SIGTERM drains in-flight appends before exit): the
//! server must exit 0, and no record whose answer the client lost in that
//! stop may have landed (a drained server answers every request it read).
//!
//! Its length is set by KILL9_ROUNDS (default 50 kills, plus one SIGTERM
//! per five kills).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand_core::{OsRng, RngCore};
use serde_json::{json, Value};
use tally_schemas::note::{open_checkpoint, NoteVerifier};
use tally_schemas::tree::verify_consistency;
use tally_schemas::{AgentName, Hash, Record, SecretKey, TreeSize, UnixMillis};

use crate::common;

use common::Server;

use crate::common::kill9;

use kill9::{consistency, load, Agent, Book, AGENTS};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_loop_loses_no_receipt_and_signs_no_inconsistent_checkpoint() {
    let _heavy = common::heavy().await;
    let rounds: usize = std::env::var("KILL9_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();

    let server = Server::start(&data, &["--rate-limit", "0"]);
    let api_key = server
        .banner
        .lines()
        .find_map(|l| {
            l.trim_start()
                .strip_prefix("API key")
                .map(|v| v.trim().to_owned())
        })
        .unwrap();
    let vkey = server
        .banner
        .lines()
        .find_map(|l| {
            l.trim_start()
                .strip_prefix("witness key")
                .map(|v| v.trim().to_owned())
        })
        .unwrap();
    let log_key = Arc::new(NoteVerifier::from_vkey(&vkey).unwrap());
    let mut agents: Vec<Agent> = (0..AGENTS)
        .map(|i| Agent {
            name: AgentName::new(&format!("k9-{i}")).unwrap(),
            key: SecretKey::generate(&mut OsRng),
            seq: 0,
            prev: None,
            in_doubt: None,
        })
        .collect();
    for a in &agents {
        let r = http
            .post(format!("{}/v1/agents", server.url))
            .bearer_auth(&api_key)
            .json(&json!({"agent": a.name, "public_key": a.key.public_key(), "not_before": UnixMillis::new(UnixMillis::now().as_millis() - 60_000)}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
    }
    let book = Arc::new(Mutex::new(Book::default()));
    let mut server = Some(server);
    let mut kills = 0;
    let mut terms = 0;
    let mut last_stop_was_term = false;
    let mut in_doubt_landed = 0;
    let mut in_doubt_new = 0;
    let mut proofs_checked = 0u64;
    let mut last_size = 0u64;

    for round in 0..rounds + rounds / 5 {
        let s = server
            .take()
            .unwrap_or_else(|| Server::start(&data, &["--rate-limit", "0"]));
        let url = s.url.clone();

        // After a restart: the new checkpoint against everything seen before.
        let note = http
            .get(format!("{url}/checkpoint"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let cp =
            open_checkpoint(&note, &log_key).expect("the checkpoint verifies with the pinned key");
        let size = cp.size.get();
        let earlier: Vec<(u64, Hash)> = book
            .lock()
            .unwrap()
            .checkpoints
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect();
        for (old_size, old_root) in earlier {
            assert!(old_size <= size, "round {round}: a checkpoint of size {old_size} was signed, the log restarted at {size}");
            if old_size == size {
                assert_eq!(
                    old_root, cp.root,
                    "round {round}: two roots for size {size}"
                );
            } else if old_size > 0 {
                let proof = consistency(&http, &url, old_size, size).await;
                verify_consistency(
                    TreeSize::new(old_size),
                    cp.size,
                    &old_root,
                    &cp.root,
                    &proof,
                )
                .unwrap_or_else(|e| {
                    panic!(
                        "round {round}: checkpoint {old_size} is not consistent with {size}: {e}"
                    )
                });
                proofs_checked += 1;
            }
        }
        assert!(size >= last_size);
        last_size = size;
        book.lock().unwrap().checkpoints.insert(size, cp.root);

        // The records acknowledged just before the kill still answer with
        // their original receipts; the ones in doubt are settled.
        let recent: Vec<(Record, Vec<u8>)> = {
            let b = book.lock().unwrap();
            b.acked
                .iter()
                .rev()
                .take(2 * AGENTS)
                .map(|a| (a.record.clone(), a.raw.clone()))
                .collect()
        };
        for (record, raw) in recent {
            let resp = common::post_record(&http, &url, &api_key, &record)
                .await
                .unwrap();
            assert_eq!(
                resp.status().as_u16(),
                200,
                "round {round}: an acknowledged record was refused on retry"
            );
            assert_eq!(
                resp.bytes().await.unwrap().to_vec(),
                raw,
                "round {round}: the retry's receipt differs"
            );
        }
        for a in &mut agents {
            if let Some(r) = &a.in_doubt {
                let landed = http
                    .get(format!("{url}/v1/agents/{}/head", a.name))
                    .bearer_auth(&api_key)
                    .send()
                    .await
                    .unwrap()
                    .json::<Value>()
                    .await
                    .unwrap()["hash"]
                    == json!(r.hash());
                assert!(
                    !(landed && last_stop_was_term),
                    "round {round}: {} landed but its answer was lost in a SIGTERM stop: the drain dropped a response",
                    a.name
                );
                if landed {
                    in_doubt_landed += 1;
                } else {
                    in_doubt_new += 1;
                }
            }
        }

        // Load, then kill -9 at a random moment.
        let tasks: Vec<_> = agents
            .drain(..)
            .map(|a| {
                tokio::spawn(load(
                    http.clone(),
                    url.clone(),
                    api_key.clone(),
                    a,
                    Arc::clone(&log_key),
                    Arc::clone(&book),
                ))
            })
            .collect();
        let delay = 100 + OsRng.next_u64() % 600;
        tokio::time::sleep(Duration::from_millis(delay)).await;
        last_stop_was_term = round % 6 == 5;
        if last_stop_was_term {
            let status = s.sigterm();
            assert!(
                status.success(),
                "round {round}: SIGTERM under load exited {status}"
            );
            terms += 1;
        } else {
            s.kill9();
            kills += 1;
        }
        for t in tasks {
            agents.push(t.await.unwrap());
        }
    }

    // A final start: everything once more, then an export that tally verify passes.
    let s = Server::start(&data, &["--rate-limit", "0"]);
    let note = http
        .get(format!("{}/checkpoint", s.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let cp = open_checkpoint(&note, &log_key).unwrap();
    let checkpoints: Vec<(u64, Hash)> = book
        .lock()
        .unwrap()
        .checkpoints
        .iter()
        .map(|(k, v)| (*k, *v))
        .collect();
    for (old_size, old_root) in &checkpoints {
        if *old_size > 0 && *old_size < cp.size.get() {
            let proof = consistency(&http, &s.url, *old_size, cp.size.get()).await;
            verify_consistency(
                TreeSize::new(*old_size),
                cp.size,
                old_root,
                &cp.root,
                &proof,
            )
            .unwrap();
            proofs_checked += 1;
        }
    }
    assert_eq!(kills, rounds);
    let acked = book.lock().unwrap().acked.len();
    assert!(
        acked > rounds,
        "the load acknowledged only {acked} records in {rounds} rounds"
    );
    for a in &agents {
        let v: Value = http
            .get(format!("{}/v1/agents/{}/head", s.url, a.name))
            .bearer_auth(&api_key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        // The head is the last acknowledged record, or the one in doubt.
        let ok = Some(serde_json::from_value::<Hash>(v["hash"].clone()).unwrap()) == a.prev
            || a.in_doubt
                .as_ref()
                .is_some_and(|r| v["hash"] == json!(r.hash()));
        assert!(ok, "{}: the witness's head {v} is neither the last acknowledged record nor the one in doubt", a.name);
    }
    eprintln!(
        "kill -9 loop: {kills} kills and {terms} SIGTERMs under load in {:.1}s, {acked} receipts acknowledged, 0 lost, {} checkpoints seen, {proofs_checked} consistency proofs verified, 0 inconsistent; answers lost in a crash: {in_doubt_landed} had landed, {in_doubt_new} had not",
        started.elapsed().as_secs_f64(),
        checkpoints.len(),
    );
    s.kill9();
}
