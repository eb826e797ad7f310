//! Storage layout 4 through the real binary (docs/storage.md, "Migration
//! from layout 1" and "Migration from layouts 2 and 3"): today's `tally
//! serve`, started on a data folder written by the layout 1, 2 or 3
//! release (testdata/storage-v1/, storage-v2/ and storage-v3/, each made
//! through that release's `tally serve`, see their READMEs), migrates the
//! log on start and then serves the same log: the same checkpoint, every
//! record answering with the receipt the old release issued (same index,
//! receive time and checkpoint note), a record reusing an old nonce
//! refused, new records extending it consistently, and an export that
//! `tally verify` passes. Killed with SIGKILL at several points of the
//! layout 1 migration, each start goes on from where the last one got to,
//! and the last start ends with the same log.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use rand_core::OsRng;
use serde_json::json;
use tally_schemas::note::{open_checkpoint, peek_checkpoint, NoteVerifier};
use tally_schemas::pack::{PackLine, PackReceipt, Witnessed};
use tally_schemas::record::NoteBody;
use tally_schemas::tree::verify_consistency;
use tally_schemas::{
    AgentName, Body, Hash, Nonce, Receipt, Record, SecretKey, Seq, TreeSize, UnixMillis,
    UnsignedRecord,
};

use crate::common;

use common::{post_record, tally, Server, TALLY};

/// The fixture written by the release of storage layout `layout`.
fn fixture(layout: u8) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("testdata/storage-v{layout}"))
}

/// A copy of the fixture's data folder at `dst`.
fn copy_data(layout: u8, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for f in std::fs::read_dir(fixture(layout).join("data")).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), dst.join(f.file_name())).unwrap();
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for secret in ["log.skey", "admin.token"] {
            std::fs::set_permissions(dst.join(secret), std::fs::Permissions::from_mode(0o600))
                .unwrap();
        }
    }
}

struct Fixture {
    records: Vec<(Record, Witnessed, PackReceipt)>,
    /// Checkpoint notes of the old release, by size.
    notes: HashMap<u64, String>,
    /// The pack's checkpoint (the log's last one before the migration).
    head: String,
    log_key: NoteVerifier,
    api_key: String,
}

fn load_fixture(layout: u8) -> Fixture {
    let pack = std::fs::read(fixture(layout).join("pack.jsonl")).unwrap();
    let mut fx = Fixture {
        records: Vec::new(),
        notes: HashMap::new(),
        head: String::new(),
        log_key: NoteVerifier::from_vkey(
            std::fs::read_to_string(fixture(layout).join("witness.vkey"))
                .unwrap()
                .trim(),
        )
        .unwrap(),
        api_key: std::fs::read_to_string(fixture(layout).join("api.key"))
            .unwrap()
            .trim()
            .to_owned(),
    };
    for line in pack.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        match PackLine::from_json(line).unwrap() {
            PackLine::Header(h) => fx.head = h.checkpoint,
            PackLine::Checkpoint(c) => {
                let size = peek_checkpoint(&c.checkpoint).unwrap().size.get();
                fx.notes.insert(size, c.checkpoint);
            }
            PackLine::Record(r) => fx.records.push((
                r.record.clone(),
                r.witnessed.clone().unwrap(),
                r.receipt.clone().unwrap(),
            )),
            PackLine::End(_) => {}
        }
    }
    assert_eq!(fx.records.len(), 31);
    fx
}

async fn checkpoint(
    http: &reqwest::Client,
    url: &str,
    key: &NoteVerifier,
) -> (String, tally_schemas::Checkpoint) {
    let note = http
        .get(format!("{url}/checkpoint"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let cp = open_checkpoint(&note, key).expect("the checkpoint verifies with the old key");
    (note, cp)
}

/// Everything the old release promised still holds on a migrated server.
async fn check_migrated(url: &str, fx: &Fixture, work: &Path) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let (note, cp) = checkpoint(&http, url, &fx.log_key).await;
    assert_eq!(
        note, fx.head,
        "the migrated log serves the checkpoint it had"
    );
    // Every record, posted again, answers with the receipt first issued.
    for (record, witnessed, issued) in &fx.records {
        let resp = post_record(&http, url, &fx.api_key, record).await.unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let receipt = Receipt::from_json(&resp.bytes().await.unwrap()).unwrap();
        assert_eq!(
            (
                receipt.record_hash,
                &receipt.nonce,
                receipt.index,
                receipt.received
            ),
            (
                issued.record_hash,
                &issued.nonce,
                issued.index,
                witnessed.received
            )
        );
        assert_eq!(
            Some(&receipt.checkpoint),
            fx.notes.get(&issued.tree_size.get()),
            "record {}: the checkpoint note first issued",
            issued.index
        );
        receipt.verify(record, &fx.log_key).unwrap();
    }
    // New records of a new agent extend the same log.
    let key = SecretKey::generate(&mut OsRng);
    let agent = AgentName::new("after-migration").unwrap();
    let r = http
        .post(format!("{url}/v1/agents"))
        .bearer_auth(&fx.api_key)
        .json(&json!({"agent": agent, "public_key": key.public_key(), "not_before": UnixMillis::new(UnixMillis::now().as_millis() - 60_000)}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    // A record of the new agent reusing a nonce of the old log is refused.
    let (old, _, issued) = &fx.records[fx.records.len() / 2];
    let replay = UnsignedRecord {
        agent: agent.clone(),
        key_id: key.public_key().key_id(),
        seq: Seq::new(0).unwrap(),
        prev: None,
        time: UnixMillis::now(),
        nonce: old.nonce.clone(),
        body: Body::Note(NoteBody {
            text: "an old nonce".into(),
        }),
    }
    .sign(&key)
    .unwrap();
    let resp = post_record(&http, url, &fx.api_key, &replay).await.unwrap();
    assert_eq!(resp.status().as_u16(), 409);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "nonce_replayed", "{body}");
    assert_eq!(body["error"]["first_index"], issued.index.get(), "{body}");
    let mut prev: Option<Hash> = None;
    for seq in 0..3u64 {
        let record = UnsignedRecord {
            agent: agent.clone(),
            key_id: key.public_key().key_id(),
            seq: Seq::new(seq).unwrap(),
            prev,
            time: UnixMillis::now(),
            nonce: Nonce::random(&mut OsRng),
            body: Body::Note(NoteBody {
                text: format!("after the migration {seq}"),
            }),
        }
        .sign(&key)
        .unwrap();
        let resp = post_record(&http, url, &fx.api_key, &record).await.unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let receipt = Receipt::from_json(&resp.bytes().await.unwrap()).unwrap();
        let (new_cp, entry) = receipt.verify(&record, &fx.log_key).unwrap();
        assert_eq!(entry.index().get(), cp.size.get() + seq);
        let proof: serde_json::Value = http
            .get(format!(
                "{url}/v1/proof/consistency?from={}&to={}",
                cp.size, new_cp.size
            ))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let proof: Vec<Hash> = serde_json::from_value(proof["consistency"].clone()).unwrap();
        verify_consistency(cp.size, new_cp.size, &cp.root, &new_cp.root, &proof).unwrap();
        prev = Some(record.hash());
    }
    // An export of every agent passes tally verify with the old witness key.
    let pack = work.join("after.jsonl");
    let keys = work.join("agent-keys.json");
    let env = [
        ("TALLY_WITNESS_URL", url),
        ("TALLY_API_KEY", fx.api_key.as_str()),
    ];
    let (ok, _, err) = tally(
        &[
            "export",
            "--agent",
            "claims-bot",
            "--agent",
            "billing-bot",
            "--agent",
            "after-migration",
            "-o",
            pack.to_str().unwrap(),
        ],
        &env,
    );
    assert!(ok, "export: {err}");
    let (ok, _, err) = tally(&["keys", "export", "-o", keys.to_str().unwrap()], &env);
    assert!(ok, "keys export: {err}");
    let vkey = fx.log_key.vkey();
    let (ok, out, err) = tally(
        &[
            "verify",
            pack.to_str().unwrap(),
            "--agent-keys",
            keys.to_str().unwrap(),
            "--witness-key",
            &vkey,
        ],
        &[],
    );
    assert!(ok, "verify: {out}{err}");
    assert!(out.lines().last().unwrap().starts_with("PASS"), "{out}");
    assert!(out.contains("34 records from 3 agents"), "{out}");
}

/// Today's `tally serve` on a copy of the fixture of `layout`: everything
/// it promised holds, and after a kill -9 a restart opens the migrated
/// folder as it is.
async fn migrates_on_start_and_keeps_every_promise(layout: u8) {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    copy_data(layout, &data);
    let fx = load_fixture(layout);
    let server = Server::start(&data, &["--rate-limit", "0"]);
    check_migrated(&server.url, &fx, tmp.path()).await;
    server.kill9();
    let server = Server::start(&data, &["--rate-limit", "0"]);
    let http = reqwest::Client::new();
    let (_, cp) = checkpoint(&http, &server.url, &fx.log_key).await;
    assert_eq!(cp.size, TreeSize::new(34));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_1_data_folder_is_migrated_on_start_and_keeps_every_promise() {
    migrates_on_start_and_keeps_every_promise(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_2_data_folder_is_moved_to_layout_4_on_start_and_keeps_every_promise() {
    migrates_on_start_and_keeps_every_promise(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_3_data_folder_is_moved_to_layout_4_on_start_and_keeps_every_promise() {
    migrates_on_start_and_keeps_every_promise(3).await;
}

/// The `done=N` value of a migration log line.
fn done_of(line: &str) -> Option<u64> {
    let rest = &line[line.find("done=")? + 5..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_the_migration_loses_nothing_and_the_next_start_finishes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    copy_data(1, &data);
    let fx = load_fixture(1);
    // One entry per migration step: 31 durable steps and a last one. Kill
    // right after the announcement, then after a few more steps each start.
    let mut last_done = 0u64;
    let mut kills = 0;
    for (start, kill_after) in [0usize, 1, 2, 3, 4, 5].into_iter().enumerate() {
        let mut child = Command::new(TALLY)
            .arg("serve")
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen", "127.0.0.1:0", "--rate-limit", "0"])
            .env("RUST_LOG", "info")
            .env("TALLY_LOG_MIGRATION_CHUNK", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let mut steps = 0usize;
        let mut finished = false;
        let mut resumed_at = None;
        for line in stderr.lines() {
            let line = line.unwrap();
            if line.contains("from layout 1 to layout 4") {
                let at = done_of(&line).unwrap();
                // Every step logged before the last kill was durable.
                assert!(
                    at >= last_done,
                    "start {start}: resumed at {at}, {last_done} were done"
                );
                resumed_at = Some(at);
                last_done = at;
            } else if line.contains("migrating the log store to layout 4") {
                steps += 1;
                let done = done_of(&line).unwrap();
                assert!(
                    done > last_done,
                    "start {start}: a step went backwards: {line}"
                );
                last_done = done;
            } else if line.contains("log store migrated to layout 4") {
                finished = true;
            }
            assert!(!line.contains("ERROR"), "start {start}: {line}");
            if finished || (resumed_at.is_some() && steps >= kill_after) {
                break;
            }
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        assert!(
            resumed_at.is_some(),
            "start {start}: no migration was announced"
        );
        if finished {
            break;
        }
        kills += 1;
        eprintln!("start {start}: resumed at {resumed_at:?}, killed after {steps} steps (done {last_done} of 31)");
    }
    assert!(kills >= 4, "only {kills} kills landed inside the migration");
    // The last start finishes the migration and serves the same log.
    let server = Server::start(&data, &["--rate-limit", "0"]);
    check_migrated(&server.url, &fx, tmp.path()).await;
    server.kill9();
}
