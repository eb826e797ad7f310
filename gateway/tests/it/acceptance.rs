//! The receipt acceptance suite (docs/protocol.md §8): one case
//! for each way a receipt can be wrong, and the right ones. Receipts are
//! built here the way a witness builds them: an entry per record, a tree
//! from the naive reference implementation, a checkpoint signed as a C2SP
//! note, an RFC 9162 inclusion proof.

use tally_gateway::acceptance::{
    accept_receipt, accept_receipt_with, parse_receipt, OpenedNote, ReceiptRejection,
    TrustedLogKey, WitnessTrust,
};
use tally_schemas::api::{DirectoryKey, KeyDirectory};
use tally_schemas::note::NoteSigner;
use tally_schemas::record::NoteBody;
use tally_schemas::tree::reference;
use tally_schemas::{
    AgentName, Body, Checkpoint, Entry, Hash, LeafIndex, Nonce, Receipt, Record, SecretKey, Seq,
    TreeSize, UnixMillis, UnsignedRecord,
};

const ORIGIN: &str = "tally.test/log";
const NOW: i64 = 1_796_025_600_000; // 2026-11-30T08:00:00.000Z
const SKEW: u64 = 300_000;

fn record(text: &str, nonce: u8) -> Record {
    let key = SecretKey::from_seed(&[5; 32]);
    UnsignedRecord {
        agent: AgentName::new("bot").unwrap(),
        key_id: key.public_key().key_id(),
        seq: Seq::GENESIS,
        prev: None,
        time: UnixMillis::new(NOW - 100),
        nonce: Nonce::from_bytes(vec![nonce; 16]).unwrap(),
        body: Body::Note(NoteBody { text: text.into() }),
    }
    .sign(&key)
    .unwrap()
}

fn log_key(seed: u8, name: &str) -> NoteSigner {
    NoteSigner::from_secret(name, SecretKey::from_seed(&[seed; 32])).unwrap()
}

fn trust(keys: &[&NoteSigner]) -> WitnessTrust {
    WitnessTrust::new(
        keys.iter()
            .map(|k| TrustedLogKey {
                verifier: k.verifier().clone(),
                not_before: None,
                not_after: None,
            })
            .collect(),
    )
}

/// A receipt for `rec` at `index` in a tree of `size`, received at `received`.
fn receipt_for(rec: &Record, signer: &NoteSigner, index: u64, size: u64, received: i64) -> Receipt {
    let entry = Entry::new(
        LeafIndex::new(index),
        UnixMillis::new(received),
        rec.clone(),
    )
    .unwrap();
    let leaves: Vec<Hash> = (0..size)
        .map(|i| {
            if i == index {
                entry.leaf_hash()
            } else {
                Hash::sha256(&i.to_be_bytes())
            }
        })
        .collect();
    let root = reference::root(&leaves);
    let checkpoint = signer
        .sign_checkpoint(&Checkpoint::new(
            signer.verifier().name(),
            TreeSize::new(size),
            root,
        ))
        .unwrap();
    Receipt {
        v: 1,
        record_hash: rec.hash(),
        nonce: rec.nonce.clone(),
        index: LeafIndex::new(index),
        received: UnixMillis::new(received),
        checkpoint,
        inclusion: reference::inclusion_proof(index as usize, &leaves),
    }
}

fn accept(r: &Receipt, rec: &Record, t: &WitnessTrust) -> Result<(), ReceiptRejection> {
    accept_receipt(r, rec, t, UnixMillis::new(NOW), SKEW).map(|_| ())
}

fn code(r: Result<(), ReceiptRejection>) -> &'static str {
    match r {
        Ok(()) => "accepted",
        Err(e) => e.code(),
    }
}

// ---- right ----

#[test]
fn accepts_receipts_at_every_position_and_tree_shape() {
    let log = log_key(1, ORIGIN);
    let t = trust(&[&log]);
    let rec = record("hello", 1);
    for (index, size) in [
        (0, 1),
        (0, 2),
        (1, 2),
        (3, 7),
        (6, 7),
        (7, 8),
        (5, 13),
        (100, 257),
    ] {
        let r = receipt_for(&rec, &log, index, size, NOW + 50);
        let accepted = accept_receipt(&r, &rec, &t, UnixMillis::new(NOW), SKEW).unwrap();
        assert_eq!(
            accepted.checkpoint.size,
            TreeSize::new(size),
            "{index}/{size}"
        );
    }
}

#[test]
fn accepts_witness_time_exactly_at_the_skew_bound_either_side() {
    let log = log_key(1, ORIGIN);
    let rec = record("hello", 1);
    let time = rec.time.as_millis();
    for received in [time - SKEW as i64, time + SKEW as i64] {
        assert_eq!(
            code(accept(
                &receipt_for(&rec, &log, 2, 5, received),
                &rec,
                &trust(&[&log])
            )),
            "accepted"
        );
    }
}

#[test]
fn accepts_the_new_key_after_a_rotation_and_the_old_key_before_its_retirement() {
    let old = log_key(1, ORIGIN);
    let new = log_key(2, ORIGIN);
    let rec = record("hello", 1);
    let t = WitnessTrust::new(vec![
        TrustedLogKey {
            verifier: old.verifier().clone(),
            not_before: None,
            not_after: Some(UnixMillis::new(NOW + 1000)),
        },
        TrustedLogKey {
            verifier: new.verifier().clone(),
            not_before: Some(UnixMillis::new(NOW - 1000)),
            not_after: None,
        },
    ]);
    assert_eq!(
        code(accept(&receipt_for(&rec, &new, 0, 3, NOW), &rec, &t)),
        "accepted"
    );
    assert_eq!(
        code(accept(&receipt_for(&rec, &old, 0, 3, NOW + 999), &rec, &t)),
        "accepted"
    );
}

#[test]
fn accepts_a_checkpoint_that_also_carries_a_cosignature() {
    let log = log_key(1, ORIGIN);
    let cosigner = log_key(9, "witness.example/cosigner");
    let rec = record("hello", 1);
    let mut r = receipt_for(&rec, &log, 1, 4, NOW);
    // Append a second signature line by an unknown key.
    let body_end = r.checkpoint.find("\n\n").unwrap() + 2;
    let cosig = cosigner.sign_note(&r.checkpoint[..body_end - 1]).unwrap();
    let cosig_line = cosig[cosig.find("\n\n").unwrap() + 2..].to_owned();
    r.checkpoint.push_str(&cosig_line);
    assert_eq!(code(accept(&r, &rec, &trust(&[&log]))), "accepted");
}

#[test]
fn parse_then_accept_round_trips_the_wire_form() {
    let log = log_key(1, ORIGIN);
    let rec = record("hello", 1);
    let r = receipt_for(&rec, &log, 2, 3, NOW);
    let bytes = serde_json::to_vec(&r).unwrap();
    let parsed = parse_receipt(&bytes).unwrap();
    assert_eq!(parsed, r);
    assert_eq!(code(accept(&parsed, &rec, &trust(&[&log]))), "accepted");
}

// ---- wrong: the receipt is for another record ----

#[test]
fn refuses_a_receipt_for_another_record() {
    let log = log_key(1, ORIGIN);
    let ours = record("ours", 1);
    let theirs = record("theirs", 2);
    let r = receipt_for(&theirs, &log, 0, 2, NOW);
    assert_eq!(code(accept(&r, &ours, &trust(&[&log]))), "mismatched");
}

#[test]
fn refuses_a_receipt_that_echoes_another_nonce() {
    let log = log_key(1, ORIGIN);
    let rec = record("ours", 1);
    let mut r = receipt_for(&rec, &log, 0, 2, NOW);
    r.nonce = Nonce::from_bytes(vec![7; 16]).unwrap();
    assert_eq!(code(accept(&r, &rec, &trust(&[&log]))), "mismatched");
}

#[test]
fn refuses_our_hash_on_a_proof_of_someone_elses_entry() {
    let log = log_key(1, ORIGIN);
    let ours = record("ours", 1);
    let theirs = record("theirs", 2);
    let mut r = receipt_for(&theirs, &log, 1, 4, NOW);
    r.record_hash = ours.hash();
    r.nonce = ours.nonce.clone();
    assert_eq!(code(accept(&r, &ours, &trust(&[&log]))), "invalid");
}

// ---- wrong: untrusted ----

#[test]
fn refuses_a_checkpoint_signed_by_an_unpinned_key() {
    let pinned = log_key(1, ORIGIN);
    let other = log_key(2, ORIGIN);
    let rec = record("hello", 1);
    let r = receipt_for(&rec, &other, 0, 2, NOW);
    assert_eq!(code(accept(&r, &rec, &trust(&[&pinned]))), "untrusted");
}

#[test]
fn refuses_a_checkpoint_of_another_log() {
    let pinned = log_key(1, ORIGIN);
    let other_log = log_key(1, "other.test/log");
    let rec = record("hello", 1);
    let r = receipt_for(&rec, &other_log, 0, 2, NOW);
    assert_eq!(code(accept(&r, &rec, &trust(&[&pinned]))), "untrusted");
}

#[test]
fn refuses_a_tampered_checkpoint() {
    let log = log_key(1, ORIGIN);
    let rec = record("hello", 1);
    let mut r = receipt_for(&rec, &log, 0, 2, NOW);
    r.checkpoint = r.checkpoint.replacen("\n2\n", "\n3\n", 1);
    assert_eq!(code(accept(&r, &rec, &trust(&[&log]))), "untrusted");
}

#[test]
fn refuses_everything_when_no_key_is_pinned() {
    let log = log_key(1, ORIGIN);
    let rec = record("hello", 1);
    let r = receipt_for(&rec, &log, 0, 1, NOW);
    assert_eq!(
        code(accept(&r, &rec, &WitnessTrust::new(vec![]))),
        "untrusted"
    );
}

#[test]
fn refuses_a_key_retired_before_the_receipt_or_not_yet_valid() {
    let log = log_key(1, ORIGIN);
    let rec = record("hello", 1);
    let r = receipt_for(&rec, &log, 0, 1, NOW);
    for (not_before, not_after) in [
        (None, Some(NOW)),
        (None, Some(NOW - 1)),
        (Some(NOW + 1), None),
    ] {
        let t = WitnessTrust::new(vec![TrustedLogKey {
            verifier: log.verifier().clone(),
            not_before: not_before.map(UnixMillis::new),
            not_after: not_after.map(UnixMillis::new),
        }]);
        let got = accept(&r, &rec, &t);
        assert!(
            matches!(got, Err(ReceiptRejection::KeyRetired { .. })),
            "{got:?}"
        );
    }
}

#[test]
fn refuses_a_checkpoint_note_that_is_not_a_note() {
    let log = log_key(1, ORIGIN);
    let rec = record("hello", 1);
    let mut r = receipt_for(&rec, &log, 0, 1, NOW);
    for garbage in ["", "not a note", "tally.test/log\n1\n", &"x".repeat(9000)] {
        r.checkpoint = garbage.to_owned();
        assert_ne!(
            code(accept(&r, &rec, &trust(&[&log]))),
            "accepted",
            "{garbage:.20}"
        );
    }
}

// ---- wrong: the proof does not hold ----

#[test]
fn refuses_broken_inclusion_proofs() {
    let log = log_key(1, ORIGIN);
    let rec = record("hello", 1);
    let t = trust(&[&log]);
    let good = receipt_for(&rec, &log, 5, 13, NOW);
    assert_eq!(code(accept(&good, &rec, &t)), "accepted");

    let mut flipped = good.clone();
    let mut b = *flipped.inclusion[1].as_bytes();
    b[0] ^= 1;
    flipped.inclusion[1] = Hash::from_bytes(b);
    let mut short = good.clone();
    short.inclusion.pop();
    let mut long = good.clone();
    long.inclusion.push(Hash::sha256(b"extra"));
    let mut empty = good.clone();
    empty.inclusion.clear();
    let mut huge = good.clone();
    huge.inclusion = vec![Hash::sha256(b"h"); 65];
    let mut moved = good.clone();
    moved.index = LeafIndex::new(4);
    let mut beyond = good.clone();
    beyond.index = LeafIndex::new(13);
    let mut other_time = good.clone();
    other_time.received = UnixMillis::new(NOW + 1);
    for (name, r) in [
        ("flipped hash", flipped),
        ("one hash short", short),
        ("one hash long", long),
        ("empty proof", empty),
        ("65 hashes", huge),
        ("other index", moved),
        ("index beyond the tree", beyond),
        ("other receive time", other_time),
    ] {
        assert_eq!(code(accept(&r, &rec, &t)), "invalid", "{name}");
    }
}

#[test]
fn refuses_an_unsupported_version() {
    let log = log_key(1, ORIGIN);
    let rec = record("hello", 1);
    let mut r = receipt_for(&rec, &log, 0, 1, NOW);
    r.v = 2;
    assert_eq!(code(accept(&r, &rec, &trust(&[&log]))), "invalid");
}

// ---- wrong: stale ----

#[test]
fn refuses_witness_times_beyond_the_skew_bound() {
    let log = log_key(1, ORIGIN);
    let rec = record("hello", 1);
    let time = rec.time.as_millis();
    for received in [time - SKEW as i64 - 1, time + SKEW as i64 + 1, 0] {
        let got = accept(
            &receipt_for(&rec, &log, 1, 2, received),
            &rec,
            &trust(&[&log]),
        );
        assert!(
            matches!(got, Err(ReceiptRejection::Stale { .. })),
            "{received}: {got:?}"
        );
    }
}

#[test]
fn refuses_a_witness_time_ahead_of_the_local_clock() {
    // A record timed ahead of the local clock (the clock stepped back since
    // it was signed), and a receipt within the bound of it but further
    // ahead of the local clock than the bound.
    let log = log_key(1, ORIGIN);
    let rec = UnsignedRecord {
        time: UnixMillis::new(NOW + SKEW as i64),
        ..record("hello", 1).unsigned().clone()
    }
    .sign(&SecretKey::from_seed(&[5; 32]))
    .unwrap();
    let r = receipt_for(&rec, &log, 1, 2, NOW + SKEW as i64 + 1);
    let got = accept(&r, &rec, &trust(&[&log]));
    assert!(
        matches!(
            got,
            Err(ReceiptRejection::Stale {
                ahead_of_local_clock: true,
                ..
            })
        ),
        "{got:?}"
    );
}

#[test]
fn accepts_the_original_receipt_of_a_record_retried_long_after() {
    // The answer to a post an hour ago was lost; the retry gets the
    // original receipt, with the witness's time of an hour ago.
    let log = log_key(1, ORIGIN);
    let hour = 3_600_000;
    let rec = UnsignedRecord {
        time: UnixMillis::new(NOW - hour),
        ..record("hello", 1).unsigned().clone()
    }
    .sign(&SecretKey::from_seed(&[5; 32]))
    .unwrap();
    let r = receipt_for(&rec, &log, 1, 2, NOW - hour + 2_000);
    assert_eq!(code(accept(&r, &rec, &trust(&[&log]))), "accepted");
}

// ---- a batch's checkpoint, its signature checked once ----

#[test]
fn a_checkpoint_opened_once_still_binds_each_receipt_to_its_record_and_key() {
    let log = log_key(1, ORIGIN);
    let other = log_key(2, ORIGIN);
    let t = trust(&[&log]);
    let (a, b) = (record("a", 1), record("b", 2));
    // One tree of two real entries, one signed checkpoint for both receipts,
    // as a batch is answered (protocol.md §8.1).
    let entries = [(&a, 0u64), (&b, 1)]
        .map(|(rec, i)| Entry::new(LeafIndex::new(i), UnixMillis::new(NOW), rec.clone()).unwrap());
    let leaves: Vec<Hash> = entries.iter().map(Entry::leaf_hash).collect();
    let note = log
        .sign_checkpoint(&Checkpoint::new(
            ORIGIN,
            TreeSize::new(2),
            reference::root(&leaves),
        ))
        .unwrap();
    let receipt = |rec: &Record, index: usize| Receipt {
        v: 1,
        record_hash: rec.hash(),
        nonce: rec.nonce.clone(),
        index: LeafIndex::new(index as u64),
        received: UnixMillis::new(NOW),
        checkpoint: note.clone(),
        inclusion: reference::inclusion_proof(index, &leaves),
    };
    let opened = OpenedNote::default();
    let with = |r: &Receipt, rec: &Record, t: &WitnessTrust| {
        accept_receipt_with(r, rec, t, UnixMillis::new(NOW), SKEW, &opened).map(|_| ())
    };
    assert_eq!(code(with(&receipt(&a, 0), &a, &t)), "accepted");
    assert_eq!(code(with(&receipt(&b, 1), &b, &t)), "accepted");
    // The note is known good now; the record, the proof and the key are
    // still checked for every receipt.
    assert_eq!(code(with(&receipt(&a, 0), &b, &t)), "mismatched");
    let mut wrong_proof = receipt(&b, 1);
    wrong_proof.index = LeafIndex::new(0);
    assert_eq!(code(with(&wrong_proof, &b, &t)), "invalid");
    assert_eq!(
        code(with(&receipt(&b, 1), &b, &trust(&[&other]))),
        "untrusted"
    );
    // A note differing by one byte is opened again, and fails.
    let mut tampered = receipt(&b, 1);
    tampered.checkpoint = tampered.checkpoint.replacen("\n2\n", "\n3\n", 1);
    assert_eq!(code(with(&tampered, &b, &t)), "untrusted");
}

// ---- wrong: not a receipt at all ----

#[test]
fn malformed_receipt_bytes_are_refused_without_panicking() {
    let log = log_key(1, ORIGIN);
    let rec = record("hello", 1);
    let good = serde_json::to_string(&receipt_for(&rec, &log, 0, 1, NOW)).unwrap();
    let cases = [
        String::new(),
        "null".into(),
        "[]".into(),
        "{\"v\":1}".into(),
        good.replacen("{", "{\"extra\":1,", 1),
        good.replacen("{", "{\"v\":1,", 1),
        good.replacen("\"index\":0", "\"index\":-1", 1),
        good.replacen("\"index\":0", "\"index\":9007199254740993", 1),
        good.replacen(&rec.hash().to_hex(), &rec.hash().to_hex().to_uppercase(), 1),
        format!("{}{}", "[".repeat(40), "]".repeat(40)),
        format!("{{\"pad\":\"{}\"}}", "x".repeat(200_000)),
    ];
    for c in cases {
        assert!(
            matches!(
                parse_receipt(c.as_bytes()),
                Err(ReceiptRejection::Malformed(_))
            ),
            "{c:.60}"
        );
    }
    assert!(matches!(
        parse_receipt(&[0xff, 0xfe]),
        Err(ReceiptRejection::Malformed(_))
    ));
}

// ---- pinned keys and the key directory fetched later ----

fn directory(origin: &str, keys: &[(&NoteSigner, Option<i64>)]) -> KeyDirectory {
    KeyDirectory {
        v: 1,
        origin: origin.into(),
        keys: keys
            .iter()
            .map(|(k, not_after)| DirectoryKey {
                vkey: k.verifier().clone(),
                not_before: UnixMillis::new(0),
                not_after: not_after.map(UnixMillis::new),
            })
            .collect(),
    }
}

#[test]
fn refuses_a_receipt_once_the_directory_retires_its_pinned_key() {
    let log = log_key(1, ORIGIN);
    let rec = record("hello", 1);
    let mut t = trust(&[&log]);
    let r = receipt_for(&rec, &log, 0, 1, NOW);
    assert_eq!(code(accept(&r, &rec, &t)), "accepted");

    // Fetched later: the pinned key was retired at NOW - 10.
    let review = t
        .apply_directory(&directory(ORIGIN, &[(&log, Some(NOW - 10))]))
        .unwrap();
    assert_eq!(
        review.retired,
        vec![(log.verifier().vkey(), UnixMillis::new(NOW - 10))]
    );
    let got = accept(&r, &rec, &t);
    assert!(
        matches!(got, Err(ReceiptRejection::KeyRetired { .. })),
        "{got:?}"
    );
    let message = got.unwrap_err().to_string();
    assert!(
        message.contains("which the witness retired at 2026-11-30T07:59:59.990Z")
            && message.contains("receipt's time 2026-11-30T08:00:00.000Z"),
        "{message}"
    );
    // A receipt from before the retirement stands.
    assert_eq!(
        code(accept(&receipt_for(&rec, &log, 0, 1, NOW - 11), &rec, &t)),
        "accepted"
    );
}

#[test]
fn a_directory_never_adds_a_key_or_moves_a_retirement_later() {
    let old = log_key(1, ORIGIN);
    let new = log_key(2, ORIGIN);
    let rec = record("hello", 1);
    let mut t = trust(&[&old]);
    t.apply_directory(&directory(ORIGIN, &[(&old, Some(NOW - 10))]))
        .unwrap();
    // A later directory that un-retires the key, or retires it later, and
    // lists a new current key.
    for later in [None, Some(NOW + 5000)] {
        let review = t
            .apply_directory(&directory(ORIGIN, &[(&old, later), (&new, None)]))
            .unwrap();
        assert!(review.retired.is_empty());
        assert_eq!(review.unpinned, vec![new.verifier().vkey()]);
        assert!(review.unpinned_note().contains("re-pin"));
    }
    assert_eq!(t.keys().len(), 1);
    assert_eq!(t.keys()[0].not_after, Some(UnixMillis::new(NOW - 10)));
    assert_eq!(
        code(accept(&receipt_for(&rec, &new, 0, 1, NOW), &rec, &t)),
        "untrusted"
    );
    assert_eq!(
        code(accept(&receipt_for(&rec, &old, 0, 1, NOW), &rec, &t)),
        "untrusted"
    );
    // A retirement earlier than the known one is taken.
    let review = t
        .apply_directory(&directory(ORIGIN, &[(&old, Some(NOW - 20))]))
        .unwrap();
    assert_eq!(review.retired.len(), 1);
    assert_eq!(t.keys()[0].not_after, Some(UnixMillis::new(NOW - 20)));
}

#[test]
fn a_directory_of_another_log_or_with_a_key_of_another_name_changes_nothing() {
    let log = log_key(1, ORIGIN);
    let mut t = trust(&[&log]);
    let before = t.clone();
    let other = log_key(1, "other.test/log");
    assert!(t
        .apply_directory(&directory("other.test/log", &[(&other, Some(NOW))]))
        .is_err());
    // (A key that is not a vkey cannot be in a KeyDirectory: reading the
    // directory refuses it, tally-schemas api::keydir.)
    // A key of another name under this origin.
    assert!(t
        .apply_directory(&directory(ORIGIN, &[(&log, Some(NOW)), (&other, None)]))
        .is_err());
    assert_eq!(t, before);
    // A pinned key the directory no longer lists is reported, not dropped.
    let review = t.apply_directory(&directory(ORIGIN, &[])).unwrap();
    assert_eq!(review.missing, vec![log.verifier().vkey()]);
    assert_eq!(t, before);
}
