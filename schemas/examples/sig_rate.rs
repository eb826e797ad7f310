//! Strict Ed25519 verifications per second on one thread: `verify_strict`
//! one at a time, and [`tally_schemas::batch_sig::PreparedKey`] (same
//! answers, per-key table). Ratios in the same run; a benchmark, not a test.
//!
//!     cargo run --release -p tally-schemas --example sig_rate

use std::time::Instant;

use tally_schemas::batch_sig::PreparedKey;
use tally_schemas::SecretKey;

fn main() {
    let keys: Vec<SecretKey> = (0..8u8)
        .map(|i| SecretKey::from_seed(&[i + 1; 32]))
        .collect();
    let items: Vec<(usize, Vec<u8>, tally_schemas::Signature)> = (0..4096usize)
        .map(|i| {
            let msg = format!(
                "tally/record/v1\n{{\"agent\":\"a{}\",\"seq\":{i},\"body\":\"{}\"}}",
                i % 8,
                "x".repeat(300)
            )
            .into_bytes();
            let sig = keys[i % 8].sign_raw(&msg);
            (i % 8, msg, sig)
        })
        .collect();
    let publics: Vec<_> = keys.iter().map(SecretKey::public_key).collect();
    let prepared: Vec<PreparedKey> = publics.iter().map(PreparedKey::new).collect();
    for round in 0..3 {
        let t = Instant::now();
        let ok = items
            .iter()
            .filter(|(k, m, s)| publics[*k].verify_raw(m, s).is_ok())
            .count();
        let strict = ok as f64 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        let ok = items
            .iter()
            .filter(|(k, m, s)| prepared[*k].verify_raw(m, s).is_ok())
            .count();
        let fast = ok as f64 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..64 {
            std::hint::black_box(PreparedKey::new(&publics[0]));
        }
        let prep_us = t.elapsed().as_secs_f64() / 64.0 * 1e6;
        // Signatures by one key after which preparing it has paid for itself.
        let saved_us = 1e6 / strict - 1e6 / fast;
        let break_even = if saved_us > 0.0 {
            prep_us / saved_us
        } else {
            f64::INFINITY
        };
        println!("round {round}: verify_strict {strict:.0}/s, prepared key {fast:.0}/s, ratio {:.2}; preparing a key {prep_us:.0} µs = {:.1} verifications; break-even {break_even:.0} signatures per key", fast / strict, prep_us * strict / 1e6);
    }
}
