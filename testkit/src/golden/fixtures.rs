//! The fixed keys, times, nonces and salts every golden vector is built
//! from, and how the files are written.

use std::fs;
use std::path::Path;

use serde_json::Value;
use tally_schemas::{Nonce, NoteSigner, SecretKey};

pub(super) const T0: i64 = 1_796_025_600_000; // 2026-11-30T08:00:00.000Z
pub(super) const ORIGIN: &str = "log.tally.test/v1";

pub(super) fn agent_key() -> SecretKey {
    SecretKey::from_seed(&[0x11; 32])
}

pub(super) fn rotated_key() -> SecretKey {
    SecretKey::from_seed(&[0x22; 32])
}

pub(super) fn log_signer() -> NoteSigner {
    // The key of the signed-note vectors, so both sets share one vkey.
    NoteSigner::from_secret(ORIGIN, SecretKey::from_seed(&[0x01; 32])).expect("valid origin")
}

pub(super) fn nonce(i: u8) -> Nonce {
    Nonce::from_bytes((0..16).map(|b| b ^ i).collect()).expect("16 bytes")
}

pub(super) fn salt(i: u8) -> [u8; 16] {
    [i; 16]
}

pub(super) fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("serialisable")
}

pub(super) fn write(dir: &Path, name: &str, value: &Value) {
    let mut text = serde_json::to_string_pretty(value).expect("json");
    text.push('\n');
    fs::write(dir.join(name), text).expect("write golden file");
}

/// Pretty JSON of a document with a final newline, as the golden files are
/// written.
#[must_use]
pub fn pretty<T: serde::Serialize>(value: &T) -> Vec<u8> {
    let mut text = serde_json::to_string_pretty(&to_value(value)).expect("json");
    text.push('\n');
    text.into_bytes()
}
