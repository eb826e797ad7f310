//! Test helpers shared by the integration tests: deterministic agents that
//! sign chained records, the log key, and backend constructors.
#![allow(dead_code)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tally_log::store::memory::MemoryStore;
use tally_log::store::postgres::PostgresStore;
use tally_log::store::redb::RedbStore;
use tally_log::store::KeyVersion;
use tally_log::{AppendError, Appended, BatchItem, Log, LogStore, PendingBatch};
use tally_schemas::record::NoteBody;
use tally_schemas::{
    AgentName, Body, Hash, Nonce, NoteSigner, Record, SecretKey, Seq, UnixMillis, UnsignedRecord,
};
use tally_testkit::faulty_store::FaultyStore;

pub(crate) const ORIGIN: &str = "log.example/test";

pub(crate) fn signer() -> NoteSigner {
    NoteSigner::from_secret(ORIGIN, SecretKey::from_seed(&[7; 32])).unwrap()
}

/// An agent that signs the next record of its chain on demand.
pub(crate) struct Agent {
    pub name: AgentName,
    key: SecretKey,
    pub next_seq: u64,
    pub prev: Option<Hash>,
    counter: u64,
}

impl Agent {
    pub(crate) fn new(name: &str) -> Self {
        let mut seed = [0u8; 32];
        for (i, b) in name.bytes().enumerate().take(32) {
            seed[i] = b;
        }
        Self {
            name: AgentName::new(name).unwrap(),
            key: SecretKey::from_seed(&seed),
            next_seq: 0,
            prev: None,
            counter: 0,
        }
    }

    /// A record at an explicit position, with a nonce derived from `salt`.
    pub(crate) fn record_at(&self, seq: u64, prev: Option<Hash>, salt: u64, text: &str) -> Record {
        let mut nonce = vec![0u8; 16];
        nonce[..8].copy_from_slice(&salt.to_be_bytes());
        nonce[8..16].copy_from_slice(&seq.to_be_bytes());
        nonce.extend_from_slice(
            self.name
                .as_str()
                .as_bytes()
                .get(..8.min(self.name.as_str().len()))
                .unwrap(),
        );
        UnsignedRecord {
            agent: self.name.clone(),
            key_id: self.key.public_key().key_id(),
            seq: Seq::new(seq).unwrap(),
            prev,
            time: UnixMillis::new(1_796_025_600_000 + seq as i64),
            nonce: Nonce::from_bytes(nonce).unwrap(),
            body: Body::Note(NoteBody {
                text: text.to_owned(),
            }),
        }
        .sign(&self.key)
        .unwrap()
    }

    /// The next record of the chain; the chain advances.
    pub(crate) fn next(&mut self) -> Record {
        self.counter += 1;
        let r = self.record_at(
            self.next_seq,
            self.prev,
            self.counter,
            &format!("note {}", self.counter),
        );
        self.next_seq += 1;
        self.prev = Some(r.hash());
        r
    }

    /// The next record of the chain with another record's nonce; the chain
    /// does not advance.
    pub(crate) fn next_with_nonce(&self, nonce: Nonce) -> Record {
        let mut u = self
            .record_at(self.next_seq, self.prev, u64::MAX, "replay")
            .unsigned()
            .clone();
        u.nonce = nonce;
        u.sign(&self.key).unwrap()
    }

    /// Moves the chain to a known head.
    pub(crate) fn resync(&mut self, seq: Seq, hash: Hash) {
        self.next_seq = seq.get() + 1;
        self.prev = Some(hash);
    }
}

pub(crate) fn now() -> UnixMillis {
    UnixMillis::new(1_796_025_600_500)
}

/// The backends every suite runs over. The tempdir must outlive the store.
pub(crate) enum Backend {
    Memory,
    Redb,
    /// redb writing its in-memory `ids` rows into the table every
    /// [`SMALL_GENERATION`] entries (docs/storage.md, "Deferred index
    /// rows"), so that the suites run across many merges.
    RedbMerging,
    Faulty,
    /// A fresh database on a real PostgreSQL server (tally-testkit's
    /// harness); left out, with a message, under `TALLY_SKIP_POSTGRES=1`.
    Postgres,
}

/// The merge generation of [`Backend::RedbMerging`].
pub(crate) const SMALL_GENERATION: u64 = 3;

pub(crate) const BACKENDS: [Backend; 5] = [
    Backend::Memory,
    Backend::Redb,
    Backend::RedbMerging,
    Backend::Faulty,
    Backend::Postgres,
];

/// [`BACKENDS`] less the ones this run skips (said on stderr).
pub(crate) fn backends() -> impl Iterator<Item = Backend> {
    BACKENDS.into_iter().filter(|b| {
        let skip = matches!(b, Backend::Postgres) && tally_testkit::postgres::skipped();
        if skip {
            eprintln!("SKIPPED: the postgres backend (TALLY_SKIP_POSTGRES=1)");
        }
        !skip
    })
}

impl Backend {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Redb => "redb",
            Self::RedbMerging => "redb(generation 3)",
            Self::Faulty => "faulty(pass)",
            Self::Postgres => "postgres",
        }
    }

    pub(crate) fn make(&self, dir: &tempfile::TempDir) -> Arc<dyn LogStore> {
        match self {
            Self::Memory => Arc::new(MemoryStore::new()),
            Self::Redb => Arc::new(RedbStore::open(&dir.path().join("log.redb")).unwrap()),
            Self::RedbMerging => Arc::new(
                RedbStore::open_with(&dir.path().join("log.redb"), 1 << 24, SMALL_GENERATION)
                    .unwrap(),
            ),
            Self::Faulty => Arc::new(FaultyStore::new(Arc::new(MemoryStore::new()))),
            Self::Postgres => {
                let url = tally_testkit::postgres::shared().fresh_database();
                Arc::new(PostgresStore::open(&url).unwrap())
            }
        }
    }
}

/// `join_all` without the futures crate: polls every future on one task.
pub(crate) async fn futures_join_all<F: std::future::Future>(
    futs: impl Iterator<Item = F>,
) -> Vec<F::Output> {
    let mut handles: Vec<std::pin::Pin<Box<F>>> = futs.map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = handles.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (h, o) in handles.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match h.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|o| o.unwrap()).collect()
}

/// One record appended the way the product appends it: a batch of one
/// through [`Log::enqueue_batch_fenced`] (the witness's admission path,
/// docs/storage.md "Batches"), answered with the batch's one answer. The
/// suites call these as methods of the [`Log`].
pub(crate) trait AppendOne {
    /// Queues `record` now, as a one-item batch fenced by `fence`
    /// (docs/protocol.md §4.1); the future resolves to its answer.
    fn enqueue_fenced(
        &self,
        record: Record,
        received: UnixMillis,
        fence: Option<KeyVersion>,
    ) -> Result<PendingOne, AppendError>;

    /// Queues `record` unfenced when first polled and resolves once it is
    /// committed and signed, or refused.
    async fn append(&self, record: Record, received: UnixMillis) -> Result<Appended, AppendError>;
}

impl AppendOne for Log {
    fn enqueue_fenced(
        &self,
        record: Record,
        received: UnixMillis,
        fence: Option<KeyVersion>,
    ) -> Result<PendingOne, AppendError> {
        self.enqueue_batch_fenced(vec![BatchItem::Record(record)], vec![fence], received)
            .map(PendingOne)
    }

    async fn append(&self, record: Record, received: UnixMillis) -> Result<Appended, AppendError> {
        self.enqueue_fenced(record, received, None)?.await
    }
}

/// The answer of a one-item batch ([`AppendOne`]).
pub(crate) struct PendingOne(PendingBatch);

impl Future for PendingOne {
    type Output = Result<Appended, AppendError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|answers| {
            answers?
                .into_iter()
                .next()
                .unwrap_or(Err(AppendError::Closed))
        })
    }
}

/// Whether `log` sequences now, read from the watch the witness's
/// cosigning follows ([`Log::watch_sequencing`]).
pub(crate) trait Sequences {
    /// The current value of [`Log::watch_sequencing`].
    fn sequences(&self) -> bool;
}

impl Sequences for Log {
    fn sequences(&self) -> bool {
        *self.watch_sequencing().borrow()
    }
}
