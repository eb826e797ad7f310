//! `batch_sig` against strict single verification (docs/protocol.md §4.3):
//! [`PreparedKey`], one signature at a time and over many signatures per
//! key as the witness uses it, must accept exactly what
//! ed25519-dalek's `verify_strict` accepts, on the edge-case corpus
//! (testdata/sigs/), on signatures built
//! with small-order and mixed-order `A` and `R`, and on random mutations of
//! valid signatures. It also shows why batch verification (one random
//! linear combination of the equations) is not used: it accepts a
//! mixed-order `R` that `verify_strict` refuses.

use std::path::PathBuf;

use curve25519_dalek::constants::ED25519_BASEPOINT_POINT as B;
use curve25519_dalek::edwards::{CompressedEdwardsY, EdwardsPoint};
use curve25519_dalek::scalar::Scalar;
use curve25519_dalek::traits::{Identity as _, IsIdentity as _, VartimeMultiscalarMul as _};
use sha2::{Digest, Sha512};
use tally_schemas::batch_sig::PreparedKey;
use tally_schemas::keys::{PublicKey, Signature};

struct Case {
    id: String,
    public_key: [u8; 32],
    message: Vec<u8>,
    signature: [u8; 64],
    strict_valid: bool,
}

fn corpus() -> Vec<Case> {
    let mut out = Vec::new();
    for name in ["speccheck.json", "tally.json"] {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/sigs")
            .join(name);
        let cases: Vec<serde_json::Value> =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        for c in cases {
            let h = |k: &str| hex::decode(c[k].as_str().unwrap()).unwrap();
            out.push(Case {
                id: c["id"].as_str().unwrap().to_owned(),
                public_key: h("public_key").try_into().unwrap(),
                message: h("message"),
                signature: h("signature").try_into().unwrap(),
                strict_valid: c["strict_valid"].as_bool().unwrap(),
            });
        }
    }
    out
}

/// `verify_strict` itself, on raw bytes (a key that does not decode is refused).
fn dalek_strict(pk: &[u8; 32], msg: &[u8], sig: &[u8; 64]) -> bool {
    ed25519_dalek::VerifyingKey::from_bytes(pk).is_ok_and(|k| {
        k.verify_strict(msg, &ed25519_dalek::Signature::from_bytes(sig))
            .is_ok()
    })
}

/// The prepared path on raw bytes (a key that does not decode is refused,
/// as `PublicKey::from_bytes` refuses it).
fn prepared(pk: &[u8; 32], msg: &[u8], sig: &[u8; 64]) -> bool {
    PublicKey::from_bytes(pk).is_ok_and(|k| {
        PreparedKey::new(&k)
            .verify_raw(msg, &Signature::from_bytes(*sig))
            .is_ok()
    })
}

/// Every item checked strictly with its key prepared
/// ([`PreparedKey::verify_raw`], as the witness checks a batch's records),
/// for items whose keys decode; `None` for the others.
fn batch(items: &[([u8; 32], Vec<u8>, [u8; 64])]) -> Vec<Option<bool>> {
    items
        .iter()
        .map(|(k, signed, s)| {
            PublicKey::from_bytes(k).ok().map(|key| {
                PreparedKey::new(&key)
                    .verify_raw(signed, &Signature::from_bytes(*s))
                    .is_ok()
            })
        })
        .collect()
}

#[test]
fn the_edge_case_corpus_is_accepted_and_refused_exactly_as_strict_verification_does() {
    let cases = corpus();
    assert!(cases.len() >= 19, "{} cases", cases.len());
    assert!(cases.iter().any(|c| c.strict_valid));
    for c in &cases {
        let strict = dalek_strict(&c.public_key, &c.message, &c.signature);
        assert_eq!(strict, c.strict_valid, "{}: verify_strict", c.id);
        assert_eq!(
            prepared(&c.public_key, &c.message, &c.signature),
            strict,
            "{}: prepared key",
            c.id
        );
    }
    // Several signatures per key, in turns.
    let items: Vec<([u8; 32], Vec<u8>, [u8; 64])> = cases
        .iter()
        .cycle()
        .take(cases.len() * 3)
        .map(|c| (c.public_key, c.message.clone(), c.signature))
        .collect();
    for (i, got) in batch(&items).into_iter().enumerate() {
        let c = &cases[i % cases.len()];
        if let Some(got) = got {
            assert_eq!(got, c.strict_valid, "{}: verify_batch", c.id);
        } else {
            assert!(!c.strict_valid, "{}: key does not decode", c.id);
        }
    }
}

/// A deterministic scalar from a label.
fn scalar(label: &str) -> Scalar {
    Scalar::from_bytes_mod_order_wide(&Sha512::digest(label.as_bytes()).into())
}

fn point(hex32: &str) -> EdwardsPoint {
    let bytes: [u8; 32] = hex::decode(hex32).unwrap().try_into().unwrap();
    CompressedEdwardsY(bytes).decompress().unwrap()
}

/// The point of order 2, (0, −1).
fn order2() -> EdwardsPoint {
    point("ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f")
}

/// A point of order 8 (the small-order `A` of speccheck case 0).
fn order8() -> EdwardsPoint {
    let t = point("c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa");
    assert!(t.is_small_order());
    let t2 = t + t;
    assert!(!(t2 + t2).is_identity(), "order 8");
    t
}

fn hram(r: &CompressedEdwardsY, a: &CompressedEdwardsY, m: &[u8]) -> Scalar {
    let mut h = Sha512::new();
    h.update(r.as_bytes());
    h.update(a.as_bytes());
    h.update(m);
    Scalar::from_bytes_mod_order_wide(&h.finalize().into())
}

/// A signature by secret scalar `a` (public point `A` = `a_point`) with
/// nonce point `R = [r]B + t`.
fn forge(a: &Scalar, a_point: &EdwardsPoint, r: &Scalar, t: &EdwardsPoint, m: &[u8]) -> [u8; 64] {
    let big_r = (r * B + t).compress();
    let k = hram(&big_r, &a_point.compress(), m);
    let s = r + k * a;
    let mut sig = [0u8; 64];
    sig[..32].copy_from_slice(big_r.as_bytes());
    sig[32..].copy_from_slice(s.as_bytes());
    sig
}

#[test]
fn a_mixed_order_r_passes_the_batch_equation_for_some_z_but_never_strict_or_prepared() {
    let a = scalar("key");
    let a_point = a * B;
    let pk = a_point.compress().to_bytes();
    let m = b"tally/record/v1\n{}".to_vec();
    for (name, t) in [("order 2", order2()), ("order 8", order8())] {
        let sig = forge(&a, &a_point, &scalar(name), &t, &m);
        assert!(!dalek_strict(&pk, &m, &sig), "{name}: strict refuses");
        assert!(!prepared(&pk, &m, &sig), "{name}: prepared refuses");
        assert_eq!(
            batch(&vec![(pk, m.clone(), sig); 4]),
            vec![Some(false); 4],
            "{name}: verify_batch refuses"
        );
        // The batch equation z·([s]B − R − [k]A) = 0, as ed25519-dalek's
        // verify_batch computes it, holds for a z that kills the torsion.
        let big_r = CompressedEdwardsY(sig[..32].try_into().unwrap());
        let s = Scalar::from_canonical_bytes(sig[32..].try_into().unwrap()).unwrap();
        let k = hram(&big_r, &a_point.compress(), &m);
        let equation = |z: Scalar| {
            EdwardsPoint::vartime_multiscalar_mul(
                [-(z * s), z, z * k],
                [B, big_r.decompress().unwrap(), a_point],
            )
            .is_identity()
        };
        assert!(!equation(Scalar::ONE), "{name}: z = 1 catches it");
        assert!(
            equation(Scalar::from(8u64)),
            "{name}: z = 8 lets it through"
        );
    }
}

#[test]
fn small_and_mixed_order_keys_follow_strict_verification() {
    let m = b"tally/record/v1\nmixed".to_vec();
    let a = scalar("mixed key");
    let t = order2();
    // A mixed-order key A = [a]B + T. A valid strict signature needs
    // R = [s]B − [k]A exactly: with R = [r]B + T and s = r + k·a that holds
    // when k is odd (−[k]T = T for T of order 2); search r until it is.
    let a_point = a * B + t;
    let mut found_valid = false;
    for n in 0..64 {
        let r = scalar(&format!("mixed r {n}"));
        let sig = forge(&a, &a_point, &r, &t, &m);
        let pk = a_point.compress().to_bytes();
        let strict = dalek_strict(&pk, &m, &sig);
        assert_eq!(prepared(&pk, &m, &sig), strict, "mixed-order A, r {n}");
        found_valid |= strict;
    }
    assert!(
        found_valid,
        "a mixed-order key with a mixed-order R verifies strictly"
    );
    // Small-order keys: never valid, whatever the signature.
    for (name, t) in [("order 2", order2()), ("order 8", order8())] {
        let pk = t.compress().to_bytes();
        for n in 0..8 {
            let r = scalar(&format!("small {n}"));
            let sig = forge(&Scalar::ZERO, &t, &r, &EdwardsPoint::identity(), &m);
            assert!(!dalek_strict(&pk, &m, &sig), "{name}");
            assert!(!prepared(&pk, &m, &sig), "{name}");
        }
    }
    // A small-order R on a good key: refused by both.
    let good = scalar("good");
    let good_point = good * B;
    let sig = forge(&good, &good_point, &Scalar::ZERO, &order8(), &m);
    let pk = good_point.compress().to_bytes();
    assert!(!dalek_strict(&pk, &m, &sig));
    assert!(!prepared(&pk, &m, &sig));
    // R the identity and s = k·a: the equation R = [s]B − [k]A holds, and
    // only the small-order check on R refuses it.
    let sig = forge(
        &good,
        &good_point,
        &Scalar::ZERO,
        &EdwardsPoint::identity(),
        &m,
    );
    assert!(!dalek_strict(&pk, &m, &sig));
    assert!(!prepared(&pk, &m, &sig));
}

#[test]
fn random_mutations_of_valid_signatures_agree_with_strict_verification() {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let keys: Vec<tally_schemas::SecretKey> = (0..4u8)
        .map(|i| tally_schemas::SecretKey::from_seed(&[i + 40; 32]))
        .collect();
    let mut items = Vec::new();
    for i in 0..400usize {
        let key = &keys[i % keys.len()];
        let mut msg = format!("tally/record/v1\n{{\"n\":{i}}}").into_bytes();
        let mut sig = *key.sign_raw(&msg).as_bytes();
        let mut pk = key.public_key().to_bytes();
        match next() % 6 {
            0 => {}
            1 => sig[(next() % 32) as usize] ^= 1 << (next() % 8),
            2 => sig[32 + (next() % 32) as usize] ^= 1 << (next() % 8),
            3 => {
                let at = (next() as usize) % msg.len();
                msg[at] ^= 1;
            }
            4 => pk[(next() % 32) as usize] ^= 1 << (next() % 8),
            _ => {
                // S + ℓ: the same scalar, not canonical.
                let s = Scalar::from_canonical_bytes(sig[32..].try_into().unwrap()).unwrap();
                let mut wide = [0u8; 33];
                // ℓ = 2^252 + 27742317777372353535851937790883648493, little-endian.
                let l: [u8; 32] =
                    hex::decode("edd3f55c1a631258d69cf7a2def9de1400000000000000000000000000000010")
                        .unwrap()
                        .try_into()
                        .unwrap();
                let mut carry = 0u16;
                for (j, w) in wide.iter_mut().take(32).enumerate() {
                    let v = u16::from(s.as_bytes()[j]) + u16::from(l[j]) + carry;
                    *w = v as u8;
                    carry = v >> 8;
                }
                if carry == 0 {
                    sig[32..].copy_from_slice(&wide[..32]);
                }
            }
        }
        items.push((pk, msg, sig));
    }
    let got = batch(&items);
    let mut accepted = 0;
    for (i, (pk, msg, sig)) in items.iter().enumerate() {
        let strict = dalek_strict(pk, msg, sig);
        accepted += usize::from(strict);
        assert_eq!(prepared(pk, msg, sig), strict, "item {i}: prepared");
        assert_eq!(got[i].unwrap_or(false), strict, "item {i}: verify_batch");
    }
    assert!(
        accepted > 40 && accepted < 360,
        "{accepted} of 400 accepted"
    );
}
