//! The batch append API over every backend (docs/storage.md, "Batches"):
//! one answer per item in order, one group commit and one checkpoint per
//! batch, each agent's records admitted in seq order, a refusal carried to
//! the agent's later records, exact resubmission idempotent per record.

use crate::common;

use std::sync::Arc;

use common::{backends, now, signer, Agent, AppendOne};
use tally_log::{AppendError, BatchItem, Log, LogConfig};
use tally_schemas::tree::verify_inclusion;
use tally_schemas::{LeafIndex, Record, Seq, TreeSize};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn open(store: &Arc<dyn tally_log::LogStore>) -> Log {
    Log::open(Arc::clone(store), signer(), LogConfig::default()).unwrap()
}

fn items(records: &[Record]) -> Vec<BatchItem> {
    records.iter().cloned().map(BatchItem::Record).collect()
}

fn seq(n: u64) -> Seq {
    Seq::new(n).unwrap()
}

#[test]
fn a_batch_of_several_agents_is_one_commit_with_one_checkpoint_and_a_proof_each() {
    for b in backends() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&b.make(&dir));
        let mut agents: Vec<Agent> = (0..4).map(|i| Agent::new(&format!("agent-{i}"))).collect();
        // Something in the log first, so the batch extends a tree.
        rt().block_on(log.append(agents[0].next(), now())).unwrap();
        let mut records = Vec::new();
        for _ in 0..16 {
            for a in &mut agents {
                records.push(a.next());
            }
        }
        let before = log.stats();
        let answers = rt()
            .block_on(log.append_batch(items(&records), now()))
            .unwrap();
        assert_eq!(answers.len(), records.len(), "{}", b.name());
        assert_eq!(
            log.stats().batches,
            before.batches + 1,
            "{}: one commit",
            b.name()
        );
        let note = &answers[0].as_ref().unwrap().receipt.checkpoint;
        for (i, (r, got)) in records.iter().zip(&answers).enumerate() {
            let got = got
                .as_ref()
                .unwrap_or_else(|e| panic!("{}: item {i}: {e}", b.name()));
            assert!(!got.duplicate);
            assert_eq!(
                got.entry.index(),
                LeafIndex::new(1 + i as u64),
                "{}",
                b.name()
            );
            assert_eq!(
                &got.receipt.checkpoint,
                note,
                "{}: one checkpoint",
                b.name()
            );
            let (cp, entry) = got.receipt.verify(r, signer().verifier()).unwrap();
            assert_eq!(cp.size, TreeSize::new(65));
            verify_inclusion(
                entry.index(),
                cp.size,
                &entry.leaf_hash(),
                &got.receipt.inclusion,
                &cp.root,
            )
            .unwrap();
        }
        assert_eq!(log.latest_checkpoint().note, *note);
    }
}

#[test]
fn an_agents_records_are_admitted_in_seq_order_whatever_the_batch_order() {
    for b in backends() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&b.make(&dir));
        let mut a = Agent::new("alpha");
        let mut z = Agent::new("zeta");
        let (a0, a1, a2) = (a.next(), a.next(), a.next());
        let (z0, z1) = (z.next(), z.next());
        let batch = vec![a2.clone(), z1.clone(), a0.clone(), z0.clone(), a1.clone()];
        let answers = rt()
            .block_on(log.append_batch(items(&batch), now()))
            .unwrap();
        let index = |i: usize| answers[i].as_ref().unwrap().entry.index().get();
        // Classified as [a0, z0, a1, z1, a2]: a0 takes a2's position, and so on.
        assert_eq!(
            (index(2), index(3), index(4), index(1), index(0)),
            (0, 1, 2, 3, 4),
            "{}",
            b.name()
        );
        assert_eq!(
            log.chain_head(&a.name).unwrap().unwrap().record_hash,
            a2.hash()
        );
        assert_eq!(
            log.chain_head(&z.name).unwrap().unwrap().record_hash,
            z1.hash()
        );
    }
}

#[test]
fn a_refused_record_refuses_the_agents_later_records_and_no_one_elses() {
    for b in backends() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&b.make(&dir));
        let mut a = Agent::new("alpha");
        let mut z = Agent::new("zeta");
        let first = a.next();
        rt().block_on(log.append(first.clone(), now())).unwrap();
        // a1 reuses the committed record's nonce: refused; a2, a3 follow it.
        let a1 = a.next_with_nonce(first.nonce.clone());
        a.next(); // the chain moves on as if a1 had been fine
        let a2 = a.record_at(2, Some(a1.hash()), 77, "after the replay");
        let a3 = a.record_at(3, Some(a2.hash()), 78, "later still");
        let (z0, z1) = (z.next(), z.next());
        let batch = vec![a1.clone(), z0.clone(), a2.clone(), z1.clone(), a3.clone()];
        let answers = rt()
            .block_on(log.append_batch(items(&batch), now()))
            .unwrap();
        match &answers[0] {
            Err(AppendError::NonceReplayed { first_index, .. }) => {
                assert_eq!(first_index.get(), 0, "{}", b.name());
            }
            other => panic!("{}: {other:?}", b.name()),
        }
        for k in [2, 4] {
            match &answers[k] {
                Err(AppendError::PriorRecordRefused { agent, seq: s }) => {
                    assert_eq!(agent, &a.name);
                    assert_eq!(*s, seq(1), "{}", b.name());
                }
                other => panic!("{}: item {k}: {other:?}", b.name()),
            }
        }
        assert!(answers[1].is_ok() && answers[3].is_ok(), "{}", b.name());
        assert_eq!(log.latest_checkpoint().checkpoint.size, TreeSize::new(3));
        assert_eq!(log.chain_head(&a.name).unwrap().unwrap().seq, seq(0));
    }
}

#[test]
fn a_record_the_caller_refused_holds_its_place_in_its_agents_order() {
    for b in backends() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&b.make(&dir));
        let mut a = Agent::new("alpha");
        let (a0, a1, a2) = (a.next(), a.next(), a.next());
        let batch = vec![
            BatchItem::Record(a2.clone()),
            BatchItem::Refused {
                agent: a.name.clone(),
                seq: seq(1),
            },
            BatchItem::Record(a0.clone()),
        ];
        let answers = rt().block_on(log.append_batch(batch, now())).unwrap();
        let _ = a1;
        assert!(
            answers[2].is_ok(),
            "{}: seq 0 comes before the refusal",
            b.name()
        );
        assert!(
            matches!(answers[1], Err(AppendError::RefusedByCaller)),
            "{}",
            b.name()
        );
        assert!(
            matches!(&answers[0], Err(AppendError::PriorRecordRefused { seq: s, .. }) if *s == seq(1)),
            "{}: {:?}",
            b.name(),
            answers[0]
        );
    }
}

#[test]
fn resubmitting_a_batch_returns_every_receipt_byte_for_byte_and_adds_nothing() {
    for b in backends() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&b.make(&dir));
        let mut a = Agent::new("alpha");
        let mut z = Agent::new("zeta");
        let first: Vec<Record> = vec![a.next(), z.next(), a.next()];
        let one = rt()
            .block_on(log.append_batch(items(&first), now()))
            .unwrap();
        // The same batch again, then the same records with new ones after
        // them and a refused fork in between: the old ones answer with their
        // receipts even after the agent's refusal.
        let again = rt()
            .block_on(log.append_batch(items(&first), now()))
            .unwrap();
        for (x, y) in one.iter().zip(&again) {
            let (x, y) = (x.as_ref().unwrap(), y.as_ref().unwrap());
            assert!(y.duplicate, "{}", b.name());
            assert_eq!(
                serde_json::to_vec(&x.receipt).unwrap(),
                serde_json::to_vec(&y.receipt).unwrap()
            );
        }
        let fork = a.record_at(0, None, 500, "fork");
        let more = a.next();
        let mixed = vec![fork, first[2].clone(), more.clone(), first[0].clone()];
        let answers = rt()
            .block_on(log.append_batch(items(&mixed), now()))
            .unwrap();
        // Seq order: fork (seq 0) and first[0] (seq 0), first[2] (1), more (2).
        assert!(
            matches!(answers[0], Err(AppendError::ChainConflict { .. })),
            "{}: {:?}",
            b.name(),
            answers[0]
        );
        assert_eq!(
            answers[1].as_ref().unwrap().receipt,
            one[2].as_ref().unwrap().receipt
        );
        assert_eq!(
            answers[3].as_ref().unwrap().receipt,
            one[0].as_ref().unwrap().receipt
        );
        assert!(
            matches!(&answers[2], Err(AppendError::PriorRecordRefused { seq: s, .. }) if *s == seq(0)),
            "{}: {:?}",
            b.name(),
            answers[2]
        );
        assert_eq!(log.latest_checkpoint().checkpoint.size, TreeSize::new(3));
        // On its own, the new record extends the chain.
        rt().block_on(log.append(more, now())).unwrap();
    }
}

#[test]
fn the_same_record_twice_in_a_batch_gets_one_entry() {
    for b in backends() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&b.make(&dir));
        let mut a = Agent::new("alpha");
        let r = a.next();
        let answers = rt()
            .block_on(log.append_batch(items(&[r.clone(), r.clone()]), now()))
            .unwrap();
        let (x, y) = (answers[0].as_ref().unwrap(), answers[1].as_ref().unwrap());
        assert!(!x.duplicate && y.duplicate, "{}", b.name());
        assert_eq!(x.receipt, y.receipt);
        assert_eq!(log.latest_checkpoint().checkpoint.size, TreeSize::new(1));
    }
}

#[test]
fn batch_bounds_empty_and_too_large() {
    let store: Arc<dyn tally_log::LogStore> =
        Arc::new(tally_log::store::memory::MemoryStore::new());
    let config = LogConfig {
        max_batch: 4,
        ..LogConfig::default()
    };
    let log = Log::open(store, signer(), config).unwrap();
    assert_eq!(
        rt().block_on(log.append_batch(Vec::new(), now())).unwrap(),
        Vec::new()
    );
    let mut a = Agent::new("alpha");
    let five: Vec<Record> = (0..5).map(|_| a.next()).collect();
    assert_eq!(
        log.enqueue_batch(items(&five), now()).err(),
        Some(AppendError::BatchTooLarge { count: 5, max: 4 })
    );
    assert_eq!(log.latest_checkpoint().checkpoint.size, TreeSize::new(0));
    let answers = rt()
        .block_on(log.append_batch(items(&five[..4]), now()))
        .unwrap();
    assert!(answers.iter().all(Result::is_ok));
}

#[test]
fn the_store_answers_every_lookup_after_a_batch() {
    for b in backends() {
        let dir = tempfile::tempdir().unwrap();
        let store = b.make(&dir);
        let log = open(&store);
        let mut agents: Vec<Agent> = (0..3).map(|i| Agent::new(&format!("agent-{i}"))).collect();
        let mut records = Vec::new();
        for _ in 0..7 {
            for a in &mut agents {
                records.push(a.next());
            }
        }
        let answers = rt()
            .block_on(log.append_batch(items(&records), now()))
            .unwrap();
        for (r, got) in records.iter().zip(&answers) {
            let got = got.as_ref().unwrap();
            let i = got.entry.index();
            assert_eq!(
                store.index_of_nonce(&r.nonce).unwrap(),
                Some(i),
                "{}",
                b.name()
            );
            assert_eq!(store.index_of_record(&r.hash()).unwrap(), Some(i));
            assert_eq!(
                store.index_of_leaf(&got.entry.leaf_hash()).unwrap(),
                Some(i)
            );
            assert_eq!(store.receipt_size(i).unwrap(), Some(TreeSize::new(21)));
        }
        let other = Agent::new("nobody").next();
        assert_eq!(store.index_of_nonce(&other.nonce).unwrap(), None);
        assert_eq!(store.index_of_record(&other.hash()).unwrap(), None);
        for a in &agents {
            let head = store.chain_head(&a.name).unwrap().unwrap();
            assert_eq!((head.seq, Some(head.record_hash)), (seq(6), a.prev));
            let rows = store.agent_indexes(&a.name, seq(2), 3).unwrap();
            assert_eq!(
                rows.iter().map(|(s, _)| s.get()).collect::<Vec<_>>(),
                vec![2, 3, 4]
            );
        }
        assert_eq!(store.chain_head(&Agent::new("nobody").name).unwrap(), None);
    }
}
