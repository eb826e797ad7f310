//! Property test (docs/storage.md "The `LogStore` contract", "Recovery"):
//! random appends, retries, refused records, injected write faults (failing,
//! and failing after landing) and crashes with reopen, checked after every
//! step against the naive reference tree of
//! `tally_schemas::tree::reference`. Invariants: the latest checkpoint is
//! the reference root of every entry ever acknowledged or landed; every
//! checkpoint ever observed stays consistent with the latest; every receipt
//! ever issued still verifies and is returned again, byte for byte, on retry.

use crate::common;

use std::sync::Arc;

use common::{futures_join_all, now, signer, Agent, AppendOne};
use proptest::prelude::*;
use tally_log::store::memory::MemoryStore;
use tally_log::store::redb::RedbStore;
use tally_log::{AppendError, Log, LogConfig, LogStore};
use tally_schemas::tree::{reference, verify_consistency};
use tally_schemas::{Checkpoint, Hash, LeafIndex, Receipt, Record, Seq, TreeSize};
use tally_testkit::faulty_store::{Fault, FaultyStore};

#[derive(Debug, Clone)]
enum Op {
    /// `n` new records from agent `agent`, sent concurrently.
    Append { agent: usize, n: usize },
    /// Retry an earlier acknowledged record.
    Retry { pick: usize },
    /// A record that forks the agent's chain.
    Fork { agent: usize },
    /// A record reusing an acknowledged record's nonce.
    Replay { pick: usize, agent: usize },
    /// The next write gets this fault.
    Fault(Fault),
    /// Drop the log without shutdown and reopen it over the same storage.
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3usize, 1..12usize).prop_map(|(agent, n)| Op::Append { agent, n }),
        2 => any::<usize>().prop_map(|pick| Op::Retry { pick }),
        1 => (0..3usize).prop_map(|agent| Op::Fork { agent }),
        1 => (any::<usize>(), 0..3usize).prop_map(|(pick, agent)| Op::Replay { pick, agent }),
        2 => prop_oneof![Just(Fault::Fail), Just(Fault::FailAfterLanding)].prop_map(Op::Fault),
        1 => Just(Op::Crash),
    ]
}

struct Model {
    leaves: Vec<Hash>,
    agents: Vec<Agent>,
    acked: Vec<(Record, Receipt)>,
    seen: Vec<Checkpoint>,
}

fn open(store: &Arc<FaultyStore>) -> Log {
    // Opening may itself meet an injected fault (its recovery writes a checkpoint).
    for _ in 0..8 {
        if let Ok(log) = Log::open(store.clone(), signer(), LogConfig::default()) {
            return log;
        }
    }
    panic!("log does not open");
}

async fn append_until_done(log: &Log, model: &mut Model, r: &Record) {
    for _ in 0..8 {
        match log.append(r.clone(), now()).await {
            Ok(got) => return accept(model, r, got.receipt, got.entry.leaf_hash()),
            Err(AppendError::Storage(_)) => continue,
            Err(e) => panic!("append refused: {e}"),
        }
    }
    panic!("append never succeeded");
}

fn accept(model: &mut Model, r: &Record, receipt: Receipt, leaf: Hash) {
    let i = receipt.index.get() as usize;
    if i == model.leaves.len() {
        model.leaves.push(leaf);
    } else {
        assert!(
            i < model.leaves.len(),
            "index {i} skips ahead of {}",
            model.leaves.len()
        );
        assert_eq!(model.leaves[i], leaf, "index {i} holds another leaf");
    }
    if let Some((_, old)) = model.acked.iter().find(|(x, _)| x.hash() == r.hash()) {
        assert_eq!(*old, receipt, "a retry got another receipt");
    } else {
        model.acked.push((r.clone(), receipt));
    }
}

fn check(log: &Log, model: &mut Model) {
    let latest = log.latest_checkpoint().checkpoint.clone();
    assert_eq!(latest.size.get() as usize, model.leaves.len());
    assert_eq!(latest.root, reference::root(&model.leaves));
    model.seen.push(latest.clone());
    for cp in &model.seen {
        if cp.size.get() == 0 {
            continue;
        }
        let (_, proof) = log.consistency_proof(cp.size, None).unwrap();
        verify_consistency(cp.size, latest.size, &cp.root, &latest.root, &proof).unwrap();
    }
    if let Some((r, receipt)) = model.acked.last() {
        receipt.verify(r, signer().verifier()).unwrap();
        let i = receipt.index;
        let (_, p) = log.inclusion_proof(i, None).unwrap();
        assert_eq!(
            p,
            reference::inclusion_proof(i.get() as usize, &model.leaves)
        );
    }
}

fn run(ops: Vec<Op>, inner: Arc<dyn LogStore>) {
    let store = Arc::new(FaultyStore::new(inner));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut model = Model {
        leaves: Vec::new(),
        agents: (0..3).map(|i| Agent::new(&format!("agent-{i}"))).collect(),
        acked: Vec::new(),
        seen: Vec::new(),
    };
    let mut log = open(&store);
    rt.block_on(async {
        for op in ops {
            match op {
                Op::Append { agent, n } => {
                    let recs: Vec<Record> = (0..n).map(|_| model.agents[agent].next()).collect();
                    let results =
                        futures_join_all(recs.iter().map(|r| log.append(r.clone(), now()))).await;
                    // In order: once one failed, the records after it in
                    // the chain may be refused until it is retried.
                    let mut failed = false;
                    for (r, got) in recs.iter().zip(results) {
                        match got {
                            Ok(got) => accept(&mut model, r, got.receipt, got.entry.leaf_hash()),
                            Err(AppendError::Storage(_)) => {
                                failed = true;
                                append_until_done(&log, &mut model, r).await;
                            }
                            Err(AppendError::ChainConflict { .. }) if failed => {
                                append_until_done(&log, &mut model, r).await;
                            }
                            Err(e) => panic!("append refused: {e}"),
                        }
                    }
                }
                Op::Retry { pick } => {
                    if !model.acked.is_empty() {
                        let r = model.acked[pick % model.acked.len()].0.clone();
                        append_until_done(&log, &mut model, &r).await;
                    }
                }
                Op::Fork { agent } => {
                    let a = &model.agents[agent];
                    let fork = if a.next_seq == 0 {
                        a.record_at(1, Some(Hash::sha256(b"nowhere")), 1, "fork")
                    } else {
                        a.record_at(0, None, 1 << 40, "fork")
                    };
                    loop {
                        match log.append(fork.clone(), now()).await {
                            Err(AppendError::ChainConflict {
                                head_seq,
                                head_hash,
                                ..
                            }) => {
                                assert_eq!(
                                    head_seq,
                                    a.next_seq.checked_sub(1).map(|s| Seq::new(s).unwrap())
                                );
                                assert_eq!(head_hash, a.prev);
                                break;
                            }
                            Err(AppendError::Storage(_)) => continue,
                            other => panic!("fork not refused: {other:?}"),
                        }
                    }
                }
                Op::Replay { pick, agent } => {
                    if !model.acked.is_empty() {
                        let (first, receipt) = &model.acked[pick % model.acked.len()];
                        let replay = model.agents[agent].next_with_nonce(first.nonce.clone());
                        loop {
                            match log.append(replay.clone(), now()).await {
                                Err(AppendError::NonceReplayed { first_index, .. }) => {
                                    assert_eq!(first_index, receipt.index);
                                    break;
                                }
                                Err(AppendError::Storage(_)) => continue,
                                other => panic!("replay not refused: {other:?}"),
                            }
                        }
                    }
                }
                Op::Fault(f) => store.script([f]),
                Op::Crash => {
                    drop(std::mem::replace(&mut log, open(&store)));
                }
            }
            check(&log, &mut model);
        }
        // Every receipt ever issued verifies and comes back byte for byte.
        for (r, receipt) in model.acked.clone() {
            receipt.verify(&r, signer().verifier()).unwrap();
            let again = loop {
                match log.append(r.clone(), now()).await {
                    Err(AppendError::Storage(_)) => continue,
                    other => break other.unwrap(),
                }
            };
            assert_eq!(again.receipt, receipt);
            assert_eq!(log.entry(receipt.index).unwrap().unwrap(), again.entry);
        }
        assert_eq!(
            log.latest_checkpoint().checkpoint.size,
            TreeSize::new(model.leaves.len() as u64)
        );
        let _ = LeafIndex::new(0);
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn memory_log_matches_the_reference_through_faults_and_crashes(ops in proptest::collection::vec(op(), 1..32)) {
        run(ops, Arc::new(MemoryStore::new()));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]

    #[test]
    fn redb_log_matches_the_reference_through_faults_and_crashes(ops in proptest::collection::vec(op(), 1..24)) {
        let dir = tempfile::tempdir().unwrap();
        run(ops, Arc::new(RedbStore::open(&dir.path().join("log.redb")).unwrap()));
    }
}
