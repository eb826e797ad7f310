//! The pack `tally-bench verify` verifies (docs/benchmarks.md "Verify"):
//! `n` valid records of `agents` agents, every one witnessed with its
//! receipt under one checkpoint, made deterministically (keys and nonces
//! from labels) and written as a stream, so that a pack of millions of
//! records costs about 100 bytes of memory per record to make. The test
//! builders live in the dev-only tally-testkit crate.

use sha2::{Digest, Sha256};
use tally_schemas::entry::leaf_data;
use tally_schemas::hash::leaf_hash;
use tally_schemas::note::{Checkpoint, NoteSigner};
use tally_schemas::pack::{
    AgentKey, AgentKeyList, AgentKeys, PackAgent, PackCheckpoint, PackEnd, PackHeader, PackLine,
    PackReceipt, PackRecord, Witnessed, PACK_VERSION,
};
use tally_schemas::record::{Body, Decision, Outcome, OutcomeStatus};
use tally_schemas::tree::{LeafIndex, TreeSize};
use tally_schemas::{AgentName, Hash, Nonce, Record, SecretKey, Seq, UnixMillis, UnsignedRecord};

/// 2026-11-30T08:00:00.000Z, the first record's time.
const EPOCH_MS: i64 = 1_796_025_600_000;

/// The key of `label`: the seed is `SHA-256("tally-fixture-key\n" ‖ label)`,
/// the derivation the test builders use, so the same labels name the same keys.
fn key_from_label(label: &str) -> SecretKey {
    let seed: [u8; 32] = Sha256::digest(format!("tally-fixture-key\n{label}").as_bytes()).into();
    SecretKey::from_seed(&seed)
}

fn log_signer(origin: &str, label: &str) -> NoteSigner {
    NoteSigner::from_secret(origin, key_from_label(label))
        .expect("the bench origin is a valid name")
}

fn decision(call_id: &str, tool_name: &str) -> Body {
    Body::Decision(Decision {
        call_id: call_id.to_owned(),
        tool: tool_name.to_owned(),
        input_hash: Hash::sha256(format!("input {call_id}").as_bytes()),
    })
}

/// What [`write_bench_pack`] made besides the pack.
#[derive(Debug)]
pub struct BenchPack {
    /// agent-keys.json for the pack.
    pub keys: AgentKeys,
    /// The log key's vkey.
    pub vkey: String,
}

/// `(public key, signed message, signature)` of the benchmark's first
/// `count` records, for measuring the raw strict verification rate on the
/// same messages the pack's records sign.
#[must_use]
pub fn bench_sample(count: u64, agents: u64) -> Vec<([u8; 32], Vec<u8>, [u8; 64])> {
    let keys: Vec<SecretKey> = (0..agents)
        .map(|a| key_from_label(&format!("bench-agent-{a}")))
        .collect();
    let mut prevs: Vec<Option<Hash>> = vec![None; agents as usize];
    (0..count)
        .map(|i| {
            let a = (i % agents) as usize;
            let r = bench_record(i, agents, &keys, prevs[a]);
            prevs[a] = Some(r.hash());
            (
                keys[a].public_key().to_bytes(),
                r.signed_message(),
                *r.signature().as_bytes(),
            )
        })
        .collect()
}

/// A Merkle tree kept as levels (level 0 the leaves; a lone last node is
/// carried up unchanged), which is the RFC 9162 tree; proofs in O(log n).
struct Levels(Vec<Vec<Hash>>);

impl Levels {
    fn new(leaves: Vec<Hash>) -> Self {
        let mut levels = vec![leaves];
        while levels.last().is_some_and(|l| l.len() > 1) {
            let prev = levels.last().expect("nonempty");
            let next = prev
                .chunks(2)
                .map(|p| {
                    if p.len() == 2 {
                        tally_schemas::hash::node_hash(&p[0], &p[1])
                    } else {
                        p[0]
                    }
                })
                .collect();
            levels.push(next);
        }
        Self(levels)
    }

    fn root(&self) -> Hash {
        self.0
            .last()
            .and_then(|l| l.first().copied())
            .unwrap_or_else(tally_schemas::tree::empty_root)
    }

    fn inclusion(&self, index: usize) -> Vec<Hash> {
        let mut out = Vec::new();
        let mut i = index;
        for level in &self.0[..self.0.len().saturating_sub(1)] {
            let sibling = i ^ 1;
            if sibling < level.len() {
                out.push(level[sibling]);
            }
            i >>= 1;
        }
        out
    }
}

/// The benchmark's record at log index `i` (agent `i % agents`, seq
/// `i / agents`): decisions and outcomes alternating, each outcome naming
/// the decision before it. `prev` is the hash of the agent's previous record.
fn bench_record(i: u64, agents: u64, keys: &[SecretKey], prev: Option<Hash>) -> Record {
    let a = (i % agents) as usize;
    let seq = i / agents;
    let body = if seq % 2 == 0 {
        decision(&format!("{}", seq / 2), &format!("tool_{}", seq % 8))
    } else {
        Body::Outcome(Outcome {
            call_id: format!("{}", seq / 2),
            decision: prev.expect("an outcome follows its decision"),
            status: OutcomeStatus::Ok,
            output_hash: Some(Hash::sha256(format!("out {i}").as_bytes())),
            state: None,
            proof: None,
            proof_hash: None,
        })
    };
    let nonce = Sha256::digest(format!("bench nonce {i}").as_bytes());
    UnsignedRecord {
        agent: AgentName::new(&format!("agent-{a:04}")).expect("valid"),
        key_id: keys[a].public_key().key_id(),
        seq: Seq::new(seq).expect("small"),
        prev,
        time: UnixMillis::new(EPOCH_MS + i as i64),
        nonce: Nonce::from_bytes(nonce[..16].to_vec()).expect("16 bytes"),
        body,
    }
    .sign(&keys[a])
    .expect("valid")
}

/// Writes a valid pack of `n` records from `agents` agents (one checkpoint,
/// every record witnessed with its receipt) to `out`, using `threads`
/// threads to sign. Records are made twice (once for the tree, once to
/// write them) so that memory stays at ~100 bytes per record.
///
/// # Errors
/// Write errors from `out`.
///
/// # Panics
/// If `agents` is 0 or above 4096.
pub fn write_bench_pack<W: std::io::Write>(
    out: &mut W,
    n: u64,
    agents: u64,
    threads: usize,
) -> std::io::Result<BenchPack> {
    assert!((1..=4096).contains(&agents));
    let origin = "bench.tally.local/log";
    let log = log_signer(origin, "bench-log");
    let keys: Vec<SecretKey> = (0..agents)
        .map(|a| key_from_label(&format!("bench-agent-{a}")))
        .collect();
    let threads = threads.max(1) as u64;
    // Pass 1: per agent, in parallel: record hashes and leaf hashes.
    let mut hashes = vec![Hash::default(); n as usize];
    let mut leaves = vec![Hash::default(); n as usize];
    let parts: Vec<Vec<(u64, Hash, Hash)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let keys = &keys;
                s.spawn(move || {
                    let mut out = Vec::new();
                    for a in (t..agents).step_by(threads as usize) {
                        let mut prev = None;
                        let mut i = a;
                        while i < n {
                            let r = bench_record(i, agents, keys, prev);
                            let received = UnixMillis::new(r.time.as_millis() + 40);
                            let leaf = leaf_hash(&leaf_data(LeafIndex::new(i), received, &r));
                            prev = Some(r.hash());
                            out.push((i, r.hash(), leaf));
                            i += agents;
                        }
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect()
    });
    for (i, h, l) in parts.into_iter().flatten() {
        hashes[i as usize] = h;
        leaves[i as usize] = l;
    }
    let tree = Levels::new(leaves);
    let size = TreeSize::new(n);
    let note = log
        .sign_checkpoint(&Checkpoint::new(origin, size, tree.root()))
        .expect("origin matches");
    let pack_agents: Vec<PackAgent> = (0..agents.min(n))
        .map(|a| PackAgent {
            agent: AgentName::new(&format!("agent-{a:04}")).expect("valid"),
            first_seq: Seq::GENESIS,
            last_seq: Seq::new((n - 1 - a) / agents).expect("small"),
        })
        .collect();
    let header = PackLine::Header(PackHeader {
        v: PACK_VERSION,
        origin: origin.to_owned(),
        checkpoint: note.clone(),
        created: UnixMillis::new(EPOCH_MS + n as i64 + 1000),
        agents: pack_agents,
    });
    let write_line = |l: &PackLine, out: &mut W| -> std::io::Result<()> {
        out.write_all(&l.to_json().map_err(std::io::Error::other)?)?;
        out.write_all(b"\n")
    };
    write_line(&header, out)?;
    write_line(
        &PackLine::Checkpoint(PackCheckpoint {
            checkpoint: note,
            consistency: Vec::new(),
        }),
        out,
    )?;
    // Pass 2: in chunks, in parallel, then written in order.
    let chunk = 4096u64;
    let mut start = 0u64;
    while start < n {
        let end = (start + chunk * threads).min(n);
        let pieces: Vec<Vec<u8>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (keys, hashes, tree) = (&keys, &hashes, &tree);
                    s.spawn(move || {
                        let mut buf = Vec::new();
                        let lo = start + t * chunk;
                        let hi = (lo + chunk).min(end);
                        for i in lo..hi {
                            let prev = (i >= agents).then(|| hashes[(i - agents) as usize]);
                            let r = bench_record(i, agents, keys, prev);
                            let received = UnixMillis::new(r.time.as_millis() + 40);
                            let line = PackLine::Record(Box::new(PackRecord {
                                witnessed: Some(Witnessed {
                                    index: LeafIndex::new(i),
                                    received,
                                    inclusion: tree.inclusion(i as usize),
                                }),
                                receipt: Some(PackReceipt {
                                    record_hash: r.hash(),
                                    nonce: r.nonce.clone(),
                                    index: LeafIndex::new(i),
                                    tree_size: size,
                                }),
                                record: r,
                            }));
                            buf.extend_from_slice(&line.to_json().expect("canonical"));
                            buf.push(b'\n');
                        }
                        buf
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("no panic"))
                .collect()
        });
        for p in pieces {
            out.write_all(&p)?;
        }
        start = end;
    }
    write_line(
        &PackLine::End(PackEnd {
            checkpoints: 1,
            records: n,
        }),
        out,
    )?;
    let keys_file = AgentKeys {
        v: PACK_VERSION,
        origin: origin.to_owned(),
        agents: keys
            .iter()
            .enumerate()
            .take(agents.min(n) as usize)
            .map(|(a, k)| AgentKeyList {
                agent: AgentName::new(&format!("agent-{a:04}")).expect("valid"),
                keys: vec![AgentKey {
                    key_id: k.public_key().key_id(),
                    public_key: k.public_key(),
                    not_before: UnixMillis::new(EPOCH_MS),
                    not_after: None,
                }],
            })
            .collect(),
    };
    Ok(BenchPack {
        keys: keys_file,
        vkey: log.verifier().vkey(),
    })
}
