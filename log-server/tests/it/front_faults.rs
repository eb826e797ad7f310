//! Several fronts of one log on the fault-injecting store
//! (`FaultyStore::shared` over memory store fronts; docs/storage.md,
//! "Several fronts: the `Lease` and `HandOver` traits"): a renewal that
//! fails, a holder left with a stale token, a hand-over that fails. The
//! failover and fencing logic is the one that runs on PostgreSQL.

use std::sync::Arc;

use crate::common::{now, signer, Agent, AppendOne, Sequences};
use crate::fronts::{rt, same_receipt, store_token, wait_for, TTL};
use tally_log::store::memory::{MemoryFront, MemoryStore};
use tally_log::store::{Lease, LogStore, StoreError};
use tally_log::{AppendError, Log, LogConfig};
use tally_schemas::{LeafIndex, TreeSize};
use tally_testkit::faulty_store::{Fault, FaultyStore, SharedOp};

/// A front named `name` of `store`, behind the fault-injecting store, and
/// the log opened over it (`Log::open`, as for every backend).
fn open_faulty(store: &Arc<MemoryStore>, name: &str) -> (Arc<MemoryFront>, Arc<FaultyStore>, Log) {
    let front = Arc::new(store.front(name, TTL));
    let faulty = Arc::new(FaultyStore::shared(Arc::clone(&front) as _));
    let log = Log::open(
        Arc::clone(&faulty) as Arc<dyn LogStore>,
        signer(),
        LogConfig::default(),
    )
    .unwrap();
    (front, faulty, log)
}

#[test]
fn a_holder_whose_renewal_fails_stops_sequencing_and_another_front_takes_over() {
    let store = Arc::new(MemoryStore::new());
    let (a_front, a_faulty, a) = open_faulty(&store, "a");
    let (_b_front, b_faulty, b) = open_faulty(&store, "b");
    assert!(a.sequences());
    assert!(!b.sequences());
    let mut alpha = Agent::new("alpha");
    let rt = rt();
    let first = rt.block_on(a.append(alpha.next(), now())).unwrap();
    assert_eq!(first.receipt.index, LeafIndex::new(0));
    let old = store_token(&store);
    assert_eq!(a_faulty.lease_token(), old);

    // a is cut off from the store: its next renewal fails until the lease
    // runs out, and so do its attempts to take the lease again. b's first
    // two attempts at the lease fail too.
    b_faulty.script_shared(SharedOp::TryLease, [Fault::Fail, Fault::Fail]);
    a_faulty.script_shared(SharedOp::TryLease, [Fault::Fail; 1000]);
    a_faulty.script_shared(SharedOp::Renew, [Fault::Fail]);
    wait_for("b to take the lease over", || {
        b.sequences() && !a.sequences()
    });
    assert!(
        store_token(&store) > old,
        "the lease was taken with a newer token"
    );
    assert_eq!(a_faulty.lease_token(), 0);
    assert!(a_faulty
        .shared_history()
        .contains(&(SharedOp::Renew, Fault::Fail)));
    assert_eq!(
        b_faulty.shared_history(),
        vec![(SharedOp::TryLease, Fault::Fail); 2],
        "b took the lease only after its failed attempts"
    );

    // The lapsed holder writes nothing any more.
    let (size, note) = a_front.latest_checkpoint().unwrap().unwrap();
    let fenced = a_faulty.put_cosignature(size, "cosigner.example", "— line");
    assert!(matches!(fenced, Err(StoreError::Fenced(_))), "{fenced:?}");
    assert!(a_front.cosignatures(size).unwrap().is_empty());
    assert!(a_front.put_checkpoint(size, &note).is_err());

    // Both fronts still admit, in one chain, through b.
    let r1 = rt.block_on(a.append(alpha.next(), now())).unwrap();
    let r2 = rt.block_on(b.append(alpha.next(), now())).unwrap();
    assert_eq!(r1.receipt.index, LeafIndex::new(1));
    assert_eq!(r2.receipt.index, LeafIndex::new(2));
    same_receipt(&b, &r1.receipt);
    same_receipt(&b, &r2.receipt);
    wait_for("a to follow size 3", || {
        a.latest_checkpoint().checkpoint.size == TreeSize::new(3)
    });
    b.shutdown();
    a.shutdown();
}

#[test]
fn a_write_with_a_stale_fence_token_is_refused_and_nothing_lands() {
    let store = Arc::new(MemoryStore::new());
    let (a_front, a_faulty, a) = open_faulty(&store, "a");
    let (b_front, _b_faulty, b) = open_faulty(&store, "b");
    let mut alpha = Agent::new("alpha");
    let rt = rt();
    rt.block_on(a.append(alpha.next(), now())).unwrap();
    let stale = a_faulty.lease_token();
    assert_ne!(stale, 0);

    // a is paused past its lease's expiry and does not learn it: its token
    // is stale, and it goes on sequencing while b takes over.
    a_faulty.stale_token(true);
    store.expire_lease();
    wait_for("b to take the lease over", || b.sequences());
    assert!(a.sequences(), "a does not know it lost the lease");
    assert_eq!(a_faulty.lease_token(), stale);
    assert!(store_token(&store) > stale);

    // Every write a makes with its stale token is refused, and nothing lands.
    let record = alpha.next();
    let err = rt.block_on(a.append(record.clone(), now())).unwrap_err();
    assert!(
        matches!(err, AppendError::Storage(StoreError::Fenced(_))),
        "{err}"
    );
    assert_eq!(b_front.size().unwrap(), TreeSize::new(1));
    assert_eq!(b_front.index_of_record(&record.hash()).unwrap(), None);
    let (size, note) = b_front.latest_checkpoint().unwrap().unwrap();
    assert_eq!(size, TreeSize::new(1));
    let fenced = a_faulty.put_checkpoint(size, &note);
    assert!(matches!(fenced, Err(StoreError::Fenced(_))), "{fenced:?}");
    let fenced = a_faulty.put_cosignature(size, "cosigner.example", "— line");
    assert!(matches!(fenced, Err(StoreError::Fenced(_))), "{fenced:?}");
    assert!(a_front.cosignatures(size).unwrap().is_empty());

    // Once a learns it lost the lease it follows, and the same record goes
    // through b as a new one: the fenced write never landed.
    a_faulty.stale_token(false);
    wait_for("a to stop sequencing", || !a.sequences());
    let again = rt.block_on(a.append(record, now())).unwrap();
    assert!(!again.duplicate);
    assert_eq!(again.receipt.index, LeafIndex::new(1));
    same_receipt(&b, &again.receipt);
    b.shutdown();
    a.shutdown();
}

#[test]
fn a_failed_hand_over_is_refused_as_on_postgresql_and_sending_again_is_safe() {
    let store = Arc::new(MemoryStore::new());
    let (a_front, _a_faulty, a) = open_faulty(&store, "a");
    let (_b_front, b_faulty, b) = open_faulty(&store, "b");
    assert!(a.sequences() && !b.sequences());
    let mut alpha = Agent::new("alpha");
    let mut beta = Agent::new("beta");
    let rt = rt();

    // The request does not reach the store: the waiting front answers
    // what a PostgreSQL front answers when its INSERT fails, and nothing
    // is integrated.
    b_faulty.script_shared(SharedOp::PendingInsert, [Fault::Fail]);
    let lost = alpha.next();
    let err = rt.block_on(b.append(lost.clone(), now())).unwrap_err();
    let AppendError::Unavailable(why) = &err else {
        panic!("{err:?}");
    };
    assert!(
        why.starts_with("handing the record over failed: storage backend: injected"),
        "{why}"
    );

    // The request reaches the store but the front hears a failure: it
    // refuses the same way, and the sequencer still integrates it.
    b_faulty.script_shared(SharedOp::PendingInsert, [Fault::FailAfterLanding]);
    let landed = beta.next();
    let err = rt.block_on(b.append(landed.clone(), now())).unwrap_err();
    assert!(matches!(err, AppendError::Unavailable(_)), "{err}");
    wait_for("the sequencer to integrate the landed request", || {
        a_front.index_of_record(&landed.hash()).unwrap().is_some()
    });
    assert_eq!(a_front.index_of_record(&lost.hash()).unwrap(), None);
    assert_eq!(a_front.size().unwrap(), TreeSize::new(1));

    // Sending both again is safe: the landed one gets its first entry, the
    // lost one a new one. Reading the answers fails twice on the way.
    b_faulty.script_shared(SharedOp::PendingAnswers, [Fault::Fail, Fault::Fail]);
    let again = rt.block_on(b.append(landed, now())).unwrap();
    assert!(again.duplicate);
    assert_eq!(again.receipt.index, LeafIndex::new(0));
    let first = rt.block_on(b.append(lost, now())).unwrap();
    assert!(!first.duplicate);
    assert_eq!(first.receipt.index, LeafIndex::new(1));
    same_receipt(&a, &again.receipt);
    same_receipt(&a, &first.receipt);
    let history = b_faulty.shared_history();
    assert_eq!(
        history
            .iter()
            .filter(|(op, f)| *op == SharedOp::PendingAnswers && *f == Fault::Fail)
            .count(),
        2,
        "{history:?}"
    );
    b.shutdown();
    a.shutdown();
}
