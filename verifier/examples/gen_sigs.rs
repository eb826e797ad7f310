//! Writes testdata/sigs/tally.json: Ed25519 edge cases built from fixed
//! seeds (see testdata/sigs/README.md). Deterministic.
//!
//! `cargo run -p tally-verifier --example gen_sigs [OUT_FILE]`

use std::path::PathBuf;

use serde_json::json;
use tally_schemas::record::RECORD_SIGNATURE_DOMAIN;
use tally_testkit::fixture::key_from_label;

/// ℓ, little-endian.
const ELL: [u8; 32] = [
    0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde, 0x14,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
];

fn add_ell(s: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; 32];
    let mut carry = 0u16;
    for i in 0..32 {
        let v = u16::from(s[i]) + u16::from(ELL[i]) + carry;
        out[i] = (v & 0xff) as u8;
        carry = v >> 8;
    }
    out
}

fn main() -> std::io::Result<()> {
    let out = std::env::args_os().nth(1).map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/sigs/tally.json"),
        PathBuf::from,
    );
    let key = key_from_label("sigs/valid");
    let mut message = RECORD_SIGNATURE_DOMAIN.to_vec();
    message.extend_from_slice(br#"{"agent":"claims-bot","seq":0}"#);
    let sig = key.sign_raw(&message);
    let pk = key.public_key().to_bytes();
    let (r, s) = sig.as_bytes().split_at(32);
    let mut s_plus_ell = r.to_vec();
    s_plus_ell.extend_from_slice(&add_ell(s));
    let mut high_bit = sig.as_bytes().to_vec();
    high_bit[63] |= 0x80;
    let identity = {
        let mut b = [0u8; 32];
        b[0] = 1;
        b
    };
    let order2 = {
        let mut b = [0xffu8; 32];
        b[0] = 0xec;
        b[31] = 0x7f;
        b
    };
    let identity_noncanonical = {
        let mut b = [0xffu8; 32];
        b[0] = 0xee;
        b[31] = 0x7f;
        b
    };
    let zero_sig = |r: &[u8; 32]| {
        let mut v = r.to_vec();
        v.extend_from_slice(&[0u8; 32]);
        v
    };
    let m = hex::encode(&message);
    let cases = json!([
        {"id": "tally-valid", "source": "gen_sigs: seed label sigs/valid", "description": "a valid signature over a record-domain message",
         "public_key": hex::encode(pk), "message": m, "signature": hex::encode(sig.as_bytes()), "strict_valid": true},
        {"id": "tally-s-plus-ell", "source": "gen_sigs", "description": "the valid signature with S + ℓ (same scalar mod ℓ, non-canonical)",
         "public_key": hex::encode(pk), "message": m, "signature": hex::encode(&s_plus_ell), "strict_valid": false},
        {"id": "tally-s-high-bit", "source": "gen_sigs", "description": "the valid signature with the top bit of S set",
         "public_key": hex::encode(pk), "message": m, "signature": hex::encode(&high_bit), "strict_valid": false},
        {"id": "tally-identity-key", "source": "gen_sigs", "description": "A = identity (small order), R = identity, S = 0: holds for every message under lax verification",
         "public_key": hex::encode(identity), "message": m, "signature": hex::encode(zero_sig(&identity)), "strict_valid": false},
        {"id": "tally-order2-key", "source": "gen_sigs", "description": "A = the point of order 2 (y = -1), R = identity, S = 0",
         "public_key": hex::encode(order2), "message": m, "signature": hex::encode(zero_sig(&identity)), "strict_valid": false},
        {"id": "tally-noncanonical-identity-key", "source": "gen_sigs", "description": "A = identity encoded non-canonically (y = p + 1), R = identity, S = 0",
         "public_key": hex::encode(identity_noncanonical), "message": m, "signature": hex::encode(zero_sig(&identity)), "strict_valid": false},
        {"id": "tally-noncanonical-identity-r", "source": "gen_sigs", "description": "the valid key, R = identity encoded non-canonically (y = p + 1), S = 0",
         "public_key": hex::encode(pk), "message": m, "signature": hex::encode(zero_sig(&identity_noncanonical)), "strict_valid": false}
    ]);
    let mut text = serde_json::to_string_pretty(&cases).map_err(std::io::Error::other)?;
    text.push('\n');
    std::fs::write(&out, text)?;
    println!("wrote {}", out.display());
    Ok(())
}
