//! The golden pack (the conformance corpus's `golden-pack` case) and the
//! log it is cut from.

use tally_schemas::pack::{
    AgentKey, AgentKeyList, AgentKeys, Head, HeadAgent, PackAgent, PackCheckpoint, PackEnd,
    PackHeader, PackLine, PackReceipt, PackRecord, Witnessed, PACK_VERSION,
};
use tally_schemas::tree::reference;
use tally_schemas::{AgentName, Checkpoint, Entry, Hash, LeafIndex, Seq, TreeSize, UnixMillis};

use super::chain::{build_chain, Chain};
use super::fixtures::*;

/// The golden pack: the golden chain's 8 records, every one witnessed
/// with its receipt, under the checkpoint of size 8, receipts issued in two
/// batches; with its agent-keys.json (the rotation's two keys, their
/// validity ranges meeting), head.json and the log's vkey.
pub struct GoldenPack {
    /// pack.jsonl.
    pub pack: Vec<u8>,
    /// agent-keys.json.
    pub keys: AgentKeys,
    /// head.json: the same checkpoint, so it proves the pack's end.
    pub head: Head,
    /// The log key.
    pub vkey: String,
}

/// The log of the golden chain: one entry per record, received 150 ms after
/// its time.
pub(super) fn golden_log(chain: &Chain) -> (Vec<Entry>, Vec<Hash>) {
    let entries: Vec<Entry> = chain
        .records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            Entry::new(
                LeafIndex::new(i as u64),
                UnixMillis::new(r.time.as_millis() + 150),
                r.clone(),
            )
            .expect("fits")
        })
        .collect();
    let leaves: Vec<Hash> = entries.iter().map(Entry::leaf_hash).collect();
    (entries, leaves)
}

/// The golden pack (the conformance corpus's `golden-pack` case).
///
/// # Panics
/// Never: every value is fixed and valid.
#[must_use]
pub fn golden_pack() -> GoldenPack {
    let chain = build_chain();
    let signer = log_signer();
    let (entries, leaves) = golden_log(&chain);
    let checkpoint_at = |n: usize| {
        let cp = Checkpoint::new(
            ORIGIN,
            TreeSize::new(n as u64),
            reference::root(&leaves[..n]),
        );
        (
            cp.clone(),
            signer.sign_checkpoint(&cp).expect("origin matches"),
        )
    };
    let batches = [5usize, 8];
    let receipt_size = |i: usize| *batches.iter().find(|&&b| i < b).expect("covered");
    // The pack: all 8 records under the checkpoint of size 8.
    let pack_size = 8usize;
    let (_, pack_note) = checkpoint_at(pack_size);
    let mut lines = vec![PackLine::Header(PackHeader {
        v: PACK_VERSION,
        origin: ORIGIN.into(),
        checkpoint: pack_note.clone(),
        created: UnixMillis::new(T0 + 60_000),
        agents: vec![PackAgent {
            agent: AgentName::new("claims-bot").expect("valid"),
            first_seq: Seq::GENESIS,
            last_seq: Seq::new(7).expect("small"),
        }],
    })];
    for &b in &batches {
        lines.push(PackLine::Checkpoint(PackCheckpoint {
            checkpoint: checkpoint_at(b).1,
            consistency: if b == pack_size {
                Vec::new()
            } else {
                reference::consistency_proof(b, &leaves[..pack_size])
            },
        }));
    }
    for (i, e) in entries.iter().enumerate() {
        lines.push(PackLine::Record(Box::new(PackRecord {
            record: e.record().clone(),
            witnessed: Some(Witnessed {
                index: e.index(),
                received: e.received(),
                inclusion: reference::inclusion_proof(i, &leaves[..pack_size]),
            }),
            receipt: Some(PackReceipt {
                record_hash: e.record().hash(),
                nonce: e.record().nonce.clone(),
                index: e.index(),
                tree_size: TreeSize::new(receipt_size(i) as u64),
            }),
        })));
    }
    lines.push(PackLine::End(PackEnd {
        checkpoints: batches.len() as u64,
        records: entries.len() as u64,
    }));
    let mut pack = Vec::new();
    for l in &lines {
        pack.extend_from_slice(&l.to_json().expect("canonical"));
        pack.push(b'\n');
    }

    let keys = AgentKeys {
        v: PACK_VERSION,
        origin: ORIGIN.into(),
        agents: vec![AgentKeyList {
            agent: AgentName::new("claims-bot").expect("valid"),
            keys: vec![
                AgentKey {
                    key_id: agent_key().public_key().key_id(),
                    public_key: agent_key().public_key(),
                    not_before: UnixMillis::new(T0 - 86_400_000),
                    not_after: Some(UnixMillis::new(T0 + 4500)),
                },
                AgentKey {
                    key_id: rotated_key().public_key().key_id(),
                    public_key: rotated_key().public_key(),
                    not_before: UnixMillis::new(T0 + 4000),
                    not_after: None,
                },
            ],
        }],
    };

    // head.json: the same 8 entries plus nothing new, so the head proves the
    // pack's end; from_size == to size gives an empty consistency proof.
    let head = Head {
        v: PACK_VERSION,
        checkpoint: pack_note,
        from_size: TreeSize::new(pack_size as u64),
        consistency: Vec::new(),
        agents: vec![HeadAgent {
            record: chain.records[7].clone(),
            witnessed: Witnessed {
                index: entries[7].index(),
                received: entries[7].received(),
                inclusion: reference::inclusion_proof(7, &leaves[..pack_size]),
            },
        }],
    };

    GoldenPack {
        pack,
        keys,
        head,
        vkey: signer.verifier().vkey(),
    }
}
