//! The kill -9 loop of tests/it/log_kill9.rs under *batched* load
//! (`POST /v1/records/batch`, docs/protocol.md §8.1), against the real
//! `tally serve`: three loaders each send batches of 16 records of two
//! agents (interleaved, each chain in order), the server is SIGKILLed at a
//! random moment and restarted on the same data folder, and after every
//! restart:
//! - every checkpoint seen (in receipts and after restarts) is proven
//!   consistent with the new one, and no size has two roots;
//! - the last batches acknowledged before the kill, sent again as batches,
//!   answer with their original receipts byte for byte;
//! - a batch whose answer was lost in the crash landed whole or not at all
//!   (one batch is one group commit), and is sent again;
//! - a record reusing the nonce of an acknowledged record, old or among the
//!   last before the kill, is refused with that record's index. The server
//!   writes its in-memory `ids` and `chains` rows into their tables every
//!   [`IDS_GENERATION`] entries (docs/storage.md, "Deferred index rows"),
//!   so kills land before, during and after those merges, and each start
//!   rebuilds the rows not yet written.
//!
//! Every sixth stop is a SIGTERM: the server exits 0 and no batch whose
//! answer was lost in that stop may have landed. KILL9_ROUNDS sets the
//! number of kills (default 50).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand_core::{OsRng, RngCore};
use serde_json::{json, Value};
use tally_schemas::batch::{BatchAnswer, BatchOutcome, BatchRequest};
use tally_schemas::note::{open_checkpoint, NoteVerifier};
use tally_schemas::record::NoteBody;
use tally_schemas::tree::verify_consistency;
use tally_schemas::{
    AgentName, Body, Hash, Nonce, Receipt, Record, SecretKey, Seq, TreeSize, UnixMillis,
    UnsignedRecord,
};

use crate::common;

use common::Server;

const AGENTS: usize = 6;
/// Agents per loader; a loader's batch interleaves their chains.
const PER_LOADER: usize = 2;
/// Records per batch.
const BATCH: usize = 16;
/// `TALLY_LOG_IDS_GENERATION` of the server under test.
const IDS_GENERATION: &str = "40";

/// `tally serve` on `data`, merging its index rows every [`IDS_GENERATION`].
fn start(data: &std::path::Path) -> Server {
    Server::start_with_env(
        data,
        "127.0.0.1:0",
        &["--rate-limit", "0"],
        &[("TALLY_LOG_IDS_GENERATION", IDS_GENERATION)],
    )
}

struct Agent {
    name: AgentName,
    key: SecretKey,
    seq: u64,
    prev: Option<Hash>,
}

impl Agent {
    fn record(&self, seq: u64, prev: Option<Hash>) -> Record {
        self.record_with_nonce(seq, prev, Nonce::random(&mut OsRng))
    }

    fn record_with_nonce(&self, seq: u64, prev: Option<Hash>, nonce: Nonce) -> Record {
        UnsignedRecord {
            agent: self.name.clone(),
            key_id: self.key.public_key().key_id(),
            seq: Seq::new(seq).unwrap(),
            prev,
            time: UnixMillis::now(),
            nonce,
            body: Body::Note(NoteBody {
                text: format!("record {seq}"),
            }),
        }
        .sign(&self.key)
        .unwrap()
    }
}

/// A loader: its agents, and a batch sent whose answer was lost.
struct Loader {
    agents: Vec<Agent>,
    in_doubt: Option<Vec<Record>>,
}

impl Loader {
    /// The next batch: the one in doubt, or BATCH new records, the agents'
    /// chains interleaved.
    fn next(&self) -> Vec<Record> {
        if let Some(b) = &self.in_doubt {
            return b.clone();
        }
        let mut heads: Vec<(u64, Option<Hash>)> =
            self.agents.iter().map(|a| (a.seq, a.prev)).collect();
        (0..BATCH)
            .map(|i| {
                let k = i % self.agents.len();
                let r = self.agents[k].record(heads[k].0, heads[k].1);
                heads[k] = (r.seq.get() + 1, Some(r.hash()));
                r
            })
            .collect()
    }

    fn accept(&mut self, batch: &[Record]) {
        for r in batch {
            let a = self.agents.iter_mut().find(|a| a.name == r.agent).unwrap();
            a.seq = r.seq.get() + 1;
            a.prev = Some(r.hash());
        }
        self.in_doubt = None;
    }
}

struct Acked {
    batch: Vec<Record>,
    raw: Vec<Vec<u8>>,
}

#[derive(Default)]
struct Book {
    acked: Vec<Acked>,
    records: usize,
    /// Every checkpoint seen: size → root.
    checkpoints: BTreeMap<u64, Hash>,
}

async fn consistency(http: &reqwest::Client, url: &str, from: u64, to: u64) -> Vec<Hash> {
    let v: Value = http
        .get(format!("{url}/v1/proof/consistency?from={from}&to={to}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    serde_json::from_value(v["consistency"].clone()).unwrap_or_else(|e| panic!("{e}: {v}"))
}

/// Sends a batch: `None` when the connection failed (answer lost), else
/// the HTTP status and the answer.
async fn send(
    http: &reqwest::Client,
    url: &str,
    api_key: &str,
    batch: &[Record],
) -> Option<(u16, Vec<u8>)> {
    let resp = http
        .post(format!("{url}/v1/records/batch"))
        .bearer_auth(api_key)
        .body(BatchRequest::to_json(batch))
        .send()
        .await
        .ok()?;
    let status = resp.status().as_u16();
    let raw = resp.bytes().await.ok()?;
    Some((status, raw.to_vec()))
}

/// The receipts of a batch answer, every record receipted.
fn receipts(raw: &[u8]) -> Vec<Vec<u8>> {
    let answer = BatchAnswer::from_json(raw).unwrap();
    answer
        .results
        .into_iter()
        .map(|r| match r {
            BatchOutcome::Receipt(b) => b,
            refused => panic!("a record of the batch was refused: {refused:?}"),
        })
        .collect()
}

/// One loader's load: send batches until the connection fails.
async fn load(
    http: reqwest::Client,
    url: String,
    api_key: String,
    mut loader: Loader,
    log_key: Arc<NoteVerifier>,
    book: Arc<Mutex<Book>>,
) -> Loader {
    loop {
        let batch = loader.next();
        let Some((status, raw)) = send(&http, &url, &api_key, &batch).await else {
            loader.in_doubt = Some(batch);
            return loader;
        };
        match status {
            200 => {
                let raws = receipts(&raw);
                let mut sizes = BTreeMap::new();
                for (record, receipt) in batch.iter().zip(&raws) {
                    let receipt = Receipt::from_json(receipt).unwrap();
                    let (cp, _) = receipt
                        .verify(record, &log_key)
                        .expect("a receipt that verifies");
                    sizes.insert(cp.size.get(), cp.root);
                }
                assert_eq!(
                    sizes.len(),
                    1,
                    "a batch's receipts under several checkpoints"
                );
                loader.accept(&batch);
                let mut b = book.lock().unwrap();
                for (size, root) in sizes {
                    if let Some(old) = b.checkpoints.insert(size, root) {
                        assert_eq!(
                            old, root,
                            "two checkpoints of size {size} with different roots"
                        );
                    }
                }
                b.records += batch.len();
                b.acked.push(Acked { batch, raw: raws });
            }
            503 => tokio::time::sleep(Duration::from_millis(5)).await,
            other => panic!("unexpected {other}: {}", String::from_utf8_lossy(&raw)),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_loop_under_batched_load_loses_no_receipt_and_signs_no_inconsistent_checkpoint() {
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

    let server = start(&data);
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
    let agents: Vec<Agent> = (0..AGENTS)
        .map(|i| Agent {
            name: AgentName::new(&format!("k9b-{i}")).unwrap(),
            key: SecretKey::generate(&mut OsRng),
            seq: 0,
            prev: None,
        })
        .collect();
    // An agent that only ever sends its seq 0 with an old nonce.
    let replayer = Agent {
        name: AgentName::new("k9b-replayer").unwrap(),
        key: SecretKey::generate(&mut OsRng),
        seq: 0,
        prev: None,
    };
    let mut replays = 0;
    for a in agents.iter().chain([&replayer]) {
        let r = http
            .post(format!("{}/v1/agents", server.url))
            .bearer_auth(&api_key)
            .json(&json!({"agent": a.name, "public_key": a.key.public_key(), "not_before": UnixMillis::new(UnixMillis::now().as_millis() - 60_000)}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
    }
    let mut agents = agents.into_iter();
    let mut loaders: Vec<Loader> = (0..AGENTS / PER_LOADER)
        .map(|_| Loader {
            agents: agents.by_ref().take(PER_LOADER).collect(),
            in_doubt: None,
        })
        .collect();
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
        let s = server.take().unwrap_or_else(|| start(&data));
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

        // The batches acknowledged just before the kill still answer with
        // their original receipts; the ones in doubt landed whole or not at
        // all.
        let recent: Vec<(Vec<Record>, Vec<Vec<u8>>)> = {
            let b = book.lock().unwrap();
            b.acked
                .iter()
                .rev()
                .take(2 * loaders.len())
                .map(|a| (a.batch.clone(), a.raw.clone()))
                .collect()
        };
        for (batch, raws) in recent {
            let (status, raw) = send(&http, &url, &api_key, &batch).await.unwrap();
            assert_eq!(
                status,
                200,
                "round {round}: {}",
                String::from_utf8_lossy(&raw)
            );
            assert_eq!(
                receipts(&raw),
                raws,
                "round {round}: a resent batch's receipts differ"
            );
        }
        // Nonces of acknowledged records, the newest and one further back,
        // are refused: their rows are in the table or were rebuilt at start.
        let picks: Vec<(Nonce, u64)> = {
            let b = book.lock().unwrap();
            let n = b.acked.len();
            [
                n.checked_sub(1),
                (n > 1).then(|| OsRng.next_u64() as usize % n),
            ]
            .into_iter()
            .flatten()
            .map(|k| {
                let a = &b.acked[k];
                let j = OsRng.next_u64() as usize % a.batch.len();
                let index = Receipt::from_json(&a.raw[j]).unwrap().index.get();
                (a.batch[j].nonce.clone(), index)
            })
            .collect()
        };
        for (nonce, index) in picks {
            let replay = replayer.record_with_nonce(0, None, nonce);
            let (status, raw) = send(&http, &url, &api_key, &[replay]).await.unwrap();
            assert_eq!(
                status,
                200,
                "round {round}: {}",
                String::from_utf8_lossy(&raw)
            );
            let v: Value = serde_json::from_slice(&raw).unwrap();
            let result = &v["results"][0];
            assert_eq!(
                (
                    result["status"].as_u64(),
                    result["error"]["code"].as_str(),
                    result["error"]["first_index"].as_u64()
                ),
                (Some(409), Some("nonce_replayed"), Some(index)),
                "round {round}: {v}"
            );
            replays += 1;
        }
        for l in &loaders {
            let Some(batch) = &l.in_doubt else { continue };
            let mut landed = 0;
            for r in batch {
                let head: Value = http
                    .get(format!("{url}/v1/agents/{}/head", r.agent))
                    .bearer_auth(&api_key)
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                if head["seq"].as_u64().is_some_and(|s| s >= r.seq.get()) {
                    landed += 1;
                }
            }
            assert!(
                landed == 0 || landed == batch.len(),
                "round {round}: {landed} of the {} records of a batch in doubt landed",
                batch.len()
            );
            assert!(
                !(landed > 0 && last_stop_was_term),
                "round {round}: a batch landed but its answer was lost in a SIGTERM stop"
            );
            if landed > 0 {
                in_doubt_landed += 1;
            } else {
                in_doubt_new += 1;
            }
        }

        // Load, then kill -9 at a random moment.
        let tasks: Vec<_> = loaders
            .drain(..)
            .map(|l| {
                tokio::spawn(load(
                    http.clone(),
                    url.clone(),
                    api_key.clone(),
                    l,
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
            loaders.push(t.await.unwrap());
        }
    }

    // A final start: everything once more, then an export that tally verify passes.
    let s = start(&data);
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
    let acked = book.lock().unwrap().records;
    assert!(
        acked > rounds * BATCH,
        "the load acknowledged only {acked} records in {rounds} rounds"
    );
    for l in &loaders {
        for a in &l.agents {
            let v: Value = http
                .get(format!("{}/v1/agents/{}/head", s.url, a.name))
                .bearer_auth(&api_key)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            // The head is the last acknowledged record, or the agent's last
            // record of the batch in doubt.
            let in_doubt = l
                .in_doubt
                .as_ref()
                .and_then(|b| b.iter().rev().find(|r| r.agent == a.name).map(Record::hash));
            let head = serde_json::from_value::<Hash>(v["hash"].clone()).ok();
            assert!(
                head == a.prev || (head.is_some() && head == in_doubt),
                "{}: the witness's head {v} is neither the last acknowledged record nor in the batch in doubt",
                a.name
            );
        }
    }
    assert!(replays >= rounds, "only {replays} replays were checked");
    eprintln!(
        "kill -9 loop, batches of {BATCH}: {kills} kills and {terms} SIGTERMs under load in {:.1}s, {acked} receipts acknowledged, 0 lost, {} checkpoints seen, {proofs_checked} consistency proofs verified, 0 inconsistent; batches whose answer was lost: {in_doubt_landed} had landed whole, {in_doubt_new} not at all; {replays} replayed nonces refused",
        started.elapsed().as_secs_f64(),
        checkpoints.len(),
    );
    s.kill9();
}
