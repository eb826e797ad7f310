//! The load and bookkeeping shared by the kill -9 loops through the real
//! binary (tests/it/log_kill9.rs on redb, tests/it/postgres_failover.rs on
//! PostgreSQL): agents that append until their connection is cut, keeping
//! the record whose answer was lost, and the book of acknowledged receipts
//! and every checkpoint seen.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand_core::OsRng;
use serde_json::Value;
use tally_schemas::note::NoteVerifier;
use tally_schemas::record::NoteBody;
use tally_schemas::{
    AgentName, Body, Hash, Nonce, Receipt, Record, SecretKey, Seq, UnixMillis, UnsignedRecord,
};

use crate::common;

pub(crate) const AGENTS: usize = 6;

pub(crate) struct Agent {
    pub(crate) name: AgentName,
    pub(crate) key: SecretKey,
    pub(crate) seq: u64,
    pub(crate) prev: Option<Hash>,
    /// A record sent whose answer was lost (connection cut by the kill).
    pub(crate) in_doubt: Option<Record>,
}

impl Agent {
    pub(crate) fn next(&mut self) -> Record {
        if let Some(r) = &self.in_doubt {
            return r.clone();
        }
        UnsignedRecord {
            agent: self.name.clone(),
            key_id: self.key.public_key().key_id(),
            seq: Seq::new(self.seq).unwrap(),
            prev: self.prev,
            time: UnixMillis::now(),
            nonce: Nonce::random(&mut OsRng),
            body: Body::Note(NoteBody {
                text: format!("record {}", self.seq),
            }),
        }
        .sign(&self.key)
        .unwrap()
    }
}

pub(crate) struct Acked {
    pub(crate) record: Record,
    pub(crate) raw: Vec<u8>,
}

#[derive(Default)]
pub(crate) struct Book {
    pub(crate) acked: Vec<Acked>,
    /// Every checkpoint seen: size → root.
    pub(crate) checkpoints: BTreeMap<u64, Hash>,
}

pub(crate) async fn consistency(
    http: &reqwest::Client,
    url: &str,
    from: u64,
    to: u64,
) -> Vec<Hash> {
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

/// One agent's load: append until the connection fails.
#[allow(dead_code)]
pub(crate) async fn load(
    http: reqwest::Client,
    url: String,
    api_key: String,
    agent: Agent,
    log_key: Arc<NoteVerifier>,
    book: Arc<Mutex<Book>>,
) -> Agent {
    let never = Arc::new(std::sync::atomic::AtomicBool::new(false));
    load_until(http, url, api_key, agent, log_key, book, never).await
}

/// [`load`], also stopping (between records) once `stop` is set. A record
/// answered 503 is sent again unchanged (the answer says nothing of
/// whether it will land: docs/api.md, "Errors").
#[allow(dead_code)]
pub(crate) async fn load_until(
    http: reqwest::Client,
    url: String,
    api_key: String,
    mut agent: Agent,
    log_key: Arc<NoteVerifier>,
    book: Arc<Mutex<Book>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Agent {
    loop {
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            return agent;
        }
        let record = agent.next();
        let sent = common::post_record(&http, &url, &api_key, &record).await;
        let resp = match sent {
            Ok(r) => r,
            Err(_) => {
                agent.in_doubt = Some(record);
                return agent;
            }
        };
        let status = resp.status().as_u16();
        let Ok(raw) = resp.bytes().await else {
            agent.in_doubt = Some(record);
            return agent;
        };
        match status {
            200 => {
                let receipt = Receipt::from_json(&raw).unwrap();
                let (cp, _) = receipt
                    .verify(&record, &log_key)
                    .expect("a receipt that verifies");
                agent.seq = record.seq.get() + 1;
                agent.prev = Some(record.hash());
                agent.in_doubt = None;
                let mut b = book.lock().unwrap();
                if let Some(root) = b.checkpoints.insert(cp.size.get(), cp.root) {
                    assert_eq!(
                        root, cp.root,
                        "two checkpoints of size {} with different roots",
                        cp.size
                    );
                }
                b.acked.push(Acked {
                    record,
                    raw: raw.to_vec(),
                });
            }
            503 => {
                agent.in_doubt = Some(record);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            other => panic!("unexpected {other}: {}", String::from_utf8_lossy(&raw)),
        }
    }
}
