//! The admission rules of the log (docs/storage.md, "Write path" and
//! "Batches"; docs/protocol.md §8): what one record is against what storage
//! holds plus the records already taken into the group commit being built.
//! Pure: no I/O, no clock. The sequencer asks storage once per commit
//! ([`crate::store::LogStore::lookup`]) and then runs every record of the
//! commit through [`CommitRules::classify`] in order.
//!
//! A record is, in this order of precedence:
//! 1. a **retry**: the same record (same record hash) is committed, or is
//!    earlier in this commit: it resolves to that entry and its receipt;
//! 2. **after a refusal**: an earlier record of the same agent in the same
//!    batch was refused: [`AppendError::PriorRecordRefused`];
//! 3. a **nonce replay**: another record used its nonce:
//!    [`AppendError::NonceReplayed`];
//! 4. a **chain conflict**: its seq/prev do not extend the agent's head:
//!    [`AppendError::ChainConflict`];
//! 5. otherwise **new**: an entry at the next index (refused with
//!    [`AppendError::LogFull`] or [`AppendError::Entry`] if it cannot be).

use std::collections::HashMap;

use tally_schemas::limits::MAX_COUNTER;
use tally_schemas::{AgentName, Entry, Hash, LeafIndex, Nonce, Record, Seq, TreeSize, UnixMillis};

use crate::error::AppendError;
use crate::store::{ChainHead, Found};

/// What became of one record.
#[derive(Debug)]
pub(crate) enum Decision {
    /// A new entry, at this position of the commit's new entries.
    New(usize),
    /// The same record as the new entry at this position of the commit.
    Again(usize),
    /// The same record as the committed entry at this index.
    Existing(LeafIndex),
    /// Refused.
    Refused(AppendError),
}

/// The state of one group commit being built: the entries taken so far and
/// what they change (heads, nonces, hashes), over a store of `old_size`.
#[derive(Debug)]
pub(crate) struct CommitRules {
    old_size: TreeSize,
    entries: Vec<Entry>,
    by_hash: HashMap<Hash, usize>,
    by_nonce: HashMap<Nonce, LeafIndex>,
    heads: HashMap<AgentName, ChainHead>,
}

impl CommitRules {
    /// An empty commit over a store holding `old_size` entries.
    pub(crate) fn new(old_size: TreeSize) -> Self {
        Self {
            old_size,
            entries: Vec::new(),
            by_hash: HashMap::new(),
            by_nonce: HashMap::new(),
            heads: HashMap::new(),
        }
    }

    /// Classifies `record`, received at `received`, given what storage
    /// answered for it (`found`, read before this commit began) and the
    /// first refused seq of its agent earlier in its batch, if any. A new
    /// record is taken into the commit.
    pub(crate) fn classify(
        &mut self,
        record: &Record,
        received: UnixMillis,
        found: &Found,
        refused_before: Option<Seq>,
    ) -> Decision {
        let hash = record.hash();
        if let Some(&pos) = self.by_hash.get(&hash) {
            return Decision::Again(pos);
        }
        if let Some(index) = found.record {
            return Decision::Existing(index);
        }
        if let Some(seq) = refused_before {
            return Decision::Refused(AppendError::PriorRecordRefused {
                agent: record.agent.clone(),
                seq,
            });
        }
        if let Some(first_index) = self.by_nonce.get(&record.nonce).copied().or(found.nonce) {
            return Decision::Refused(AppendError::NonceReplayed {
                nonce: record.nonce.clone(),
                first_index,
            });
        }
        let head = self
            .heads
            .get(&record.agent)
            .cloned()
            .or_else(|| found.head.clone());
        let extends = match &head {
            None => record.seq == Seq::GENESIS,
            Some(h) => h.seq.next() == Some(record.seq) && record.prev == Some(h.record_hash),
        };
        if !extends {
            return Decision::Refused(AppendError::ChainConflict {
                agent: record.agent.clone(),
                head_seq: head.as_ref().map(|h| h.seq),
                head_hash: head.as_ref().map(|h| h.record_hash),
            });
        }
        let index = self.old_size.get() + self.entries.len() as u64;
        if index >= MAX_COUNTER {
            return Decision::Refused(AppendError::LogFull);
        }
        let index = LeafIndex::new(index);
        let entry = match Entry::new(index, received, record.clone()) {
            Ok(e) => e,
            Err(e) => return Decision::Refused(AppendError::Entry(e)),
        };
        let pos = self.entries.len();
        self.by_hash.insert(hash, pos);
        self.by_nonce.insert(record.nonce.clone(), index);
        self.heads.insert(
            record.agent.clone(),
            ChainHead {
                seq: record.seq,
                record_hash: hash,
                index,
            },
        );
        self.entries.push(entry);
        Decision::New(pos)
    }

    /// The new entries, in log order.
    pub(crate) fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The commit's new entries, consumed.
    pub(crate) fn into_entries(self) -> Vec<Entry> {
        self.entries
    }
}

/// The order in which a batch's items are classified: input order, except
/// that each agent's items are taken in ascending seq (ties in input order),
/// each filling the next of that agent's input positions. So `[a5, b0, a4]`
/// is classified as `[a4, b0, a5]`, and an agent's records are admitted in
/// seq order however the client listed them.
pub(crate) fn admission_order(keys: &[(&AgentName, Seq)]) -> Vec<usize> {
    let mut by_agent: HashMap<&AgentName, Vec<usize>> = HashMap::new();
    for (i, (agent, _)) in keys.iter().enumerate() {
        by_agent.entry(agent).or_default().push(i);
    }
    for positions in by_agent.values_mut() {
        let mut sorted = positions.clone();
        sorted.sort_by_key(|&i| (keys[i].1, i));
        *positions = sorted;
    }
    let mut taken: HashMap<&AgentName, usize> = HashMap::new();
    keys.iter()
        .map(|(agent, _)| {
            let k = taken.entry(agent).or_default();
            let i = by_agent[agent][*k];
            *k += 1;
            i
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_schemas::record::NoteBody;
    use tally_schemas::{Body, SecretKey, UnsignedRecord};

    fn name(s: &str) -> AgentName {
        AgentName::new(s).unwrap()
    }

    fn seq(n: u64) -> Seq {
        Seq::new(n).unwrap()
    }

    /// A chain of `n` records of `agent`, nonces from `salt`.
    fn chain(agent: &str, n: u64, salt: u8) -> Vec<Record> {
        let key = SecretKey::from_seed(&[salt; 32]);
        let mut prev = None;
        (0..n)
            .map(|s| {
                let r = UnsignedRecord {
                    agent: name(agent),
                    key_id: key.public_key().key_id(),
                    seq: seq(s),
                    prev,
                    time: UnixMillis::new(1_800_000_000_000),
                    nonce: Nonce::from_bytes(vec![
                        salt, s as u8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                    ])
                    .unwrap(),
                    body: Body::Note(NoteBody {
                        text: format!("{agent} {s}"),
                    }),
                }
                .sign(&key)
                .unwrap();
                prev = Some(r.hash());
                r
            })
            .collect()
    }

    const T: UnixMillis = UnixMillis::new(1_800_000_000_000);

    #[test]
    fn new_records_extend_their_chains_and_take_the_next_indexes() {
        let a = chain("a", 3, 1);
        let b = chain("b", 1, 2);
        let mut rules = CommitRules::new(TreeSize::new(10));
        for (r, want) in [(&a[0], 0), (&b[0], 1), (&a[1], 2), (&a[2], 3)] {
            assert!(
                matches!(rules.classify(r, T, &Found::default(), None), Decision::New(p) if p == want)
            );
        }
        let idx: Vec<u64> = rules.entries().iter().map(|e| e.index().get()).collect();
        assert_eq!(idx, vec![10, 11, 12, 13]);
    }

    #[test]
    fn a_retry_resolves_to_its_entry_before_any_refusal_is_considered() {
        let a = chain("a", 2, 1);
        let mut rules = CommitRules::new(TreeSize::new(0));
        assert!(matches!(
            rules.classify(&a[0], T, &Found::default(), None),
            Decision::New(0)
        ));
        // Again in the same commit, even after a refusal of the agent.
        assert!(matches!(
            rules.classify(&a[0], T, &Found::default(), Some(seq(0))),
            Decision::Again(0)
        ));
        // Committed earlier.
        let found = Found {
            record: Some(LeafIndex::new(7)),
            nonce: Some(LeafIndex::new(7)),
            head: None,
        };
        assert!(
            matches!(rules.classify(&a[1], T, &found, Some(seq(0))), Decision::Existing(i) if i.get() == 7)
        );
    }

    #[test]
    fn refusals_carry_their_evidence() {
        let a = chain("a", 3, 1);
        let mut rules = CommitRules::new(TreeSize::new(0));
        // seq 1 without seq 0: the head is empty.
        match rules.classify(&a[1], T, &Found::default(), None) {
            Decision::Refused(AppendError::ChainConflict {
                head_seq: None,
                head_hash: None,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        // A prior refusal in the batch.
        match rules.classify(&a[0], T, &Found::default(), Some(seq(0))) {
            Decision::Refused(AppendError::PriorRecordRefused { seq: s, .. }) => {
                assert_eq!(s, seq(0))
            }
            other => panic!("{other:?}"),
        }
        // A nonce used in storage.
        let found = Found {
            record: None,
            nonce: Some(LeafIndex::new(3)),
            head: None,
        };
        match rules.classify(&a[0], T, &found, None) {
            Decision::Refused(AppendError::NonceReplayed { first_index, .. }) => {
                assert_eq!(first_index.get(), 3);
            }
            other => panic!("{other:?}"),
        }
        // A nonce used earlier in the commit by another record.
        assert!(matches!(
            rules.classify(&a[0], T, &Found::default(), None),
            Decision::New(0)
        ));
        let b = chain("b", 1, 1); // same salt: same nonce bytes as a[0]
        match rules.classify(&b[0], T, &Found::default(), None) {
            Decision::Refused(AppendError::NonceReplayed { first_index, .. }) => {
                assert_eq!(first_index.get(), 0);
            }
            other => panic!("{other:?}"),
        }
        // The head moved within the commit: seq 0 again is a conflict naming it.
        let mut fork = chain("a", 1, 9);
        let fork0 = fork.remove(0);
        match rules.classify(&fork0, T, &Found::default(), None) {
            Decision::Refused(AppendError::ChainConflict {
                head_seq,
                head_hash,
                ..
            }) => {
                assert_eq!(head_seq, Some(seq(0)));
                assert_eq!(head_hash, Some(a[0].hash()));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_admission_order_sorts_each_agent_by_seq_in_its_own_positions() {
        let (a, b) = (name("a"), name("b"));
        let keys = [
            (&a, seq(5)),
            (&b, seq(0)),
            (&a, seq(4)),
            (&b, seq(1)),
            (&a, seq(6)),
        ];
        assert_eq!(admission_order(&keys), vec![2, 1, 0, 3, 4]);
        let ties = [(&a, seq(1)), (&a, seq(1)), (&a, seq(0))];
        assert_eq!(admission_order(&ties), vec![2, 0, 1]);
        assert_eq!(admission_order(&[]), Vec::<usize>::new());
    }
}
