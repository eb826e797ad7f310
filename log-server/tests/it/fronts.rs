//! Several fronts of one log (docs/operations.md, "Running on
//! PostgreSQL", "Several fronts"), on the memory store's fronts
//! (`MemoryStore::front`): the same lease, fencing and hand-over logic as on
//! PostgreSQL, without a database server, so failover runs in fast tests.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{now, signer, Agent, AppendOne, Sequences};
use tally_log::store::memory::{MemoryFront, MemoryStore};
use tally_log::store::{Lease, LogStore, StoreError};
use tally_log::{Log, LogConfig};
use tally_schemas::{LeafIndex, Receipt};

/// The lease's ttl: a follower tries the lease every 100 ms and waits
/// 2.8 s for an answer (the waits `Log::open` gives a front).
pub(crate) const TTL: Duration = Duration::from_millis(400);

fn open(store: &Arc<MemoryStore>, name: &str) -> (Arc<MemoryFront>, Log) {
    let front = Arc::new(store.front(name, TTL));
    let log = Log::open(
        Arc::clone(&front) as Arc<dyn LogStore>,
        signer(),
        LogConfig::default(),
    )
    .unwrap();
    (front, log)
}

pub(crate) fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Waits until `done` holds, for at most 10 s.
pub(crate) fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The receipt a front built is the one the log holds for that index.
pub(crate) fn same_receipt(log: &Log, receipt: &Receipt) {
    let (_, stored) = log.receipt(receipt.index).unwrap().unwrap();
    assert_eq!(&stored, receipt);
}

#[test]
fn the_first_front_sequences_and_a_follower_hands_its_records_over() {
    let store = Arc::new(MemoryStore::new());
    let (a_store, a) = open(&store, "a");
    let (b_store, b) = open(&store, "b");
    assert!(a.sequences());
    assert!(!b.sequences());
    assert_ne!(a_store.lease_token(), 0);
    assert_eq!(b_store.lease_token(), 0);
    assert!(b_store.lease_holder().unwrap().starts_with("a "));

    let mut alpha = Agent::new("alpha");
    let mut beta = Agent::new("beta");
    let rt = rt();
    let first = rt.block_on(a.append(alpha.next(), now())).unwrap();
    let record = beta.next();
    let handed = rt.block_on(b.append(record.clone(), now())).unwrap();
    assert_eq!(first.receipt.index, LeafIndex::new(0));
    assert_eq!(handed.receipt.index, LeafIndex::new(1));
    assert!(!handed.duplicate);
    same_receipt(&a, &handed.receipt);
    // The same record again, through the other front: its first receipt.
    let again = rt.block_on(a.append(record, now())).unwrap();
    assert_eq!(again.receipt.index, LeafIndex::new(1));
    assert!(again.duplicate);
    wait_for("the follower to follow size 2", || {
        b.latest_checkpoint().checkpoint.size.get() == 2
    });
    b.shutdown();
    a.shutdown();
}

#[test]
fn a_front_whose_lease_expired_stops_sequencing_and_another_takes_over() {
    let store = Arc::new(MemoryStore::new());
    let (a_store, a) = open(&store, "a");
    let (_b_store, b) = open(&store, "b");
    let mut alpha = Agent::new("alpha");
    let rt = rt();
    rt.block_on(a.append(alpha.next(), now())).unwrap();
    let old = a_store.lease_token();

    // a stops renewing (paused past its expiry): it learns it lost the
    // lease, and one of the two fronts takes it with a newer token.
    store.expire_lease();
    wait_for("a front to take the lease again", || {
        (a.sequences() || b.sequences()) && store_token(&store) > old
    });
    assert!(!(a.sequences() && b.sequences()), "two sequencers at once");

    // Both fronts still admit, in one chain, through whichever sequences.
    let r1 = rt.block_on(a.append(alpha.next(), now())).unwrap();
    let r2 = rt.block_on(b.append(alpha.next(), now())).unwrap();
    assert_eq!(r1.receipt.index, LeafIndex::new(1));
    assert_eq!(r2.receipt.index, LeafIndex::new(2));
    let sequencer = if a.sequences() { &a } else { &b };
    same_receipt(sequencer, &r1.receipt);
    same_receipt(sequencer, &r2.receipt);
    // The new sequencer recovered the log and extended what was signed.
    wait_for("both fronts to serve size 3", || {
        a.latest_checkpoint().checkpoint.size.get() == 3
            && b.latest_checkpoint().checkpoint.size.get() == 3
    });
    b.shutdown();
    a.shutdown();
}

/// The lease token the store holds now, as a fresh front reads it.
pub(crate) fn store_token(store: &Arc<MemoryStore>) -> i64 {
    let probe = store.front("probe", TTL);
    let holder = probe.lease_holder().unwrap();
    // "<name> (token <n>[, expired])"
    holder
        .split("token ")
        .nth(1)
        .and_then(|t| t.split([',', ')']).next())
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_deposed_holder_cannot_write_the_log() {
    let store = Arc::new(MemoryStore::new());
    let (a_store, a) = open(&store, "a");
    let mut alpha = Agent::new("alpha");
    rt().block_on(a.append(alpha.next(), now())).unwrap();
    a.shutdown();
    let (size, note) = a_store.latest_checkpoint().unwrap().unwrap();
    // While a holds the lease, storing the same note again is a no-op.
    a_store.put_checkpoint(size, &note).unwrap();

    // Another front takes the lease after a's expired: every write of a is
    // fenced, and nothing lands.
    store.expire_lease();
    let b = store.front("b", TTL);
    assert!(b.try_lease().unwrap());
    assert!(!a_store.try_lease().unwrap(), "two holders at once");
    let fenced = a_store.put_checkpoint(size, &note);
    assert!(matches!(fenced, Err(StoreError::Fenced(_))), "{fenced:?}");
    let fenced = a_store.put_cosignature(size, "cosigner.example", "— line");
    assert!(matches!(fenced, Err(StoreError::Fenced(_))), "{fenced:?}");
    assert_eq!(a_store.lease_token(), 0);
    assert!(a_store.cosignatures(size).unwrap().is_empty());

    // Released (its holder stopped): a takes it at once, with a newer token.
    let held = b.lease_token();
    drop(b);
    assert!(a_store.try_lease().unwrap());
    assert!(a_store.lease_token() > held);
    a_store.put_checkpoint(size, &note).unwrap();
}
