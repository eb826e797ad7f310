//! The kill -9 loop (docs/storage.md "Recovery"; docs/benchmarks.md "Log":
//! 50 kills, zero lost acknowledged entries, zero inconsistent
//! checkpoints), against a real process: `tally-bench log-load`
//! appending to a redb file under load with durable group commits. Each round starts it, lets it append for a random time,
//! SIGKILLs it, then reopens the file in this process (which runs recovery)
//! and checks that every receipt ever acknowledged (a complete stdout line)
//! still verifies against the new checkpoint, and that the new checkpoint is
//! consistent with every checkpoint seen before.
//!
//! The whole-system version (`tally serve` over HTTP) belongs to the CLI;
//! this one covers the log engine and its storage.

use std::collections::HashMap;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use tally_log::{AppendError, BatchItem, Log, LogConfig};
use tally_schemas::note::open_checkpoint;
use tally_schemas::tree::{verify_consistency, verify_inclusion};
use tally_schemas::{
    Checkpoint, Entry, Hash, NoteSigner, NoteVerifier, Receipt, Record, SecretKey,
};

const LOAD_LOG_SEED: [u8; 32] = [0x4c; 32];
const LOAD_ORIGIN: &str = "tally.test/kill9";

fn kills() -> usize {
    std::env::var("TALLY_KILL9_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
}

struct Acked {
    record: Record,
    receipt: Receipt,
    leaf: Hash,
}

#[test]
fn kill_9_at_random_moments_loses_no_acknowledged_entry_and_signs_nothing_inconsistent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.redb");
    let signer =
        NoteSigner::from_secret(LOAD_ORIGIN, SecretKey::from_seed(&LOAD_LOG_SEED)).unwrap();
    let verifier: NoteVerifier = signer.verifier().clone();
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("kill9 seed {seed}");
    let mut acked: Vec<Acked> = Vec::new();
    let mut seen: Vec<Checkpoint> = Vec::new();
    let mut notes_ok: HashMap<String, Checkpoint> = HashMap::new();
    let mut killed_mid_run = 0;
    for round in 0..kills() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let wait = Duration::from_millis(40 + seed % 400);
        let mut child = Command::new(env!("CARGO_BIN_EXE_tally-bench"))
            .arg("log-load")
            .arg(&path)
            .args(["--agents", "6"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(wait);
        let still_running = child.try_wait().unwrap().is_none();
        child.kill().unwrap(); // SIGKILL on Unix
        child.wait().unwrap();
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert!(
            still_running,
            "round {round}: the load process exited on its own: {stderr}"
        );
        killed_mid_run += 1;
        let mut out = Vec::new();
        child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
        // Only complete lines were acknowledged.
        let complete = out.iter().rposition(|b| *b == b'\n').map_or(0, |p| p + 1);
        let before = acked.len();
        for line in out[..complete]
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
        {
            let v: serde_json::Value = serde_json::from_slice(line).unwrap();
            let record = Record::from_value(v["record"].clone()).unwrap();
            let receipt: Receipt = serde_json::from_value(v["receipt"].clone()).unwrap();
            let (_, entry) = receipt.verify(&record, &verifier).unwrap();
            acked.push(Acked {
                record,
                receipt,
                leaf: entry.leaf_hash(),
            });
        }

        // Restart: recovery runs in Log::open.
        let log = Log::open_redb(&path, signer.clone(), LogConfig::default())
            .unwrap_or_else(|e| panic!("round {round}: reopen failed: {e}"));
        let latest = log.latest_checkpoint().checkpoint.clone();
        open_checkpoint(&log.latest_checkpoint().note, &verifier).unwrap();
        for a in &acked {
            // The entry is still there, byte for byte, and proven in the new checkpoint.
            let index = a.receipt.index;
            let entry: Entry = log
                .entry(index)
                .unwrap()
                .unwrap_or_else(|| panic!("round {round}: entry {index} lost"));
            assert_eq!(
                entry.leaf_hash(),
                a.leaf,
                "round {round}: entry {index} changed"
            );
            assert_eq!(entry.record().hash(), a.record.hash());
            let (_, proof) = log.inclusion_proof(index, None).unwrap();
            verify_inclusion(index, latest.size, &a.leaf, &proof, &latest.root).unwrap();
            // Its receipt checkpoint is consistent with the new one.
            let cp = notes_ok
                .entry(a.receipt.checkpoint.clone())
                .or_insert_with(|| open_checkpoint(&a.receipt.checkpoint, &verifier).unwrap())
                .clone();
            let (_, c) = log.consistency_proof(cp.size, None).unwrap();
            verify_consistency(cp.size, latest.size, &cp.root, &latest.root, &c).unwrap();
        }
        for old in &seen {
            if old.size.get() == 0 {
                continue;
            }
            assert!(old.size <= latest.size, "round {round}: the log shrank");
            let (_, c) = log.consistency_proof(old.size, None).unwrap();
            verify_consistency(old.size, latest.size, &old.root, &latest.root, &c).unwrap_or_else(
                |e| panic!("round {round}: checkpoint {} inconsistent: {e}", old.size),
            );
        }
        // A retried acknowledged record gets its receipt back, byte for byte.
        if let Some(a) = acked.last() {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            // Appended as the witness appends: a batch of one (docs/storage.md,
            // "Batches").
            let again = rt
                .block_on(async {
                    let answers = log
                        .enqueue_batch_fenced(
                            vec![BatchItem::Record(a.record.clone())],
                            Vec::new(),
                            tally_schemas::UnixMillis::now(),
                        )?
                        .await?;
                    answers
                        .into_iter()
                        .next()
                        .unwrap_or(Err(AppendError::Closed))
                })
                .unwrap();
            assert!(again.duplicate);
            assert_eq!(again.receipt, a.receipt, "round {round}");
        }
        seen.push(latest);
        log.shutdown();
        drop(log);
        eprintln!(
            "round {round}: killed after {wait:?}, {} new receipts, {} in all",
            acked.len() - before,
            acked.len()
        );
    }
    assert_eq!(killed_mid_run, kills());
    assert!(
        acked.len() > kills(),
        "the load process acknowledged too little to test anything: {}",
        acked.len()
    );
}
