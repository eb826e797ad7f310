//! Strict Ed25519 verifications per second on one thread: `verify_strict`
//! one at a time, and [`tally_schemas::batch_sig::PreparedKey`] (same
//! answers, the strict equation without decompressing `R`). The two are
//! timed in turns over 25 rounds and the ratio's quartiles printed, since
//! a shared machine's speed moves between rounds; a benchmark, not a test.
//!
//!     cargo run --release -p tally-schemas --example sig_rate

use std::time::Instant;

use tally_schemas::batch_sig::PreparedKey;
use tally_schemas::SecretKey;

fn main() {
    let keys: Vec<SecretKey> = (0..8u8)
        .map(|i| SecretKey::from_seed(&[i + 1; 32]))
        .collect();
    let items: Vec<(usize, Vec<u8>, tally_schemas::Signature)> = (0..2048usize)
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
    let mut ratios = Vec::new();
    let mut strict_rates = Vec::new();
    for _ in 0..25 {
        let t = Instant::now();
        let ok = items
            .iter()
            .filter(|(k, m, s)| publics[*k].verify_raw(m, s).is_ok())
            .count();
        let strict = ok as f64 / t.elapsed().as_secs_f64();
        // Each signature prepares its key afresh: the preparation is timed too.
        let t = Instant::now();
        let ok = items
            .iter()
            .filter(|(k, m, s)| PreparedKey::new(&publics[*k]).verify_raw(m, s).is_ok())
            .count();
        let prepared = ok as f64 / t.elapsed().as_secs_f64();
        assert_eq!(ok, items.len());
        ratios.push(prepared / strict);
        strict_rates.push(strict);
    }
    ratios.sort_by(f64::total_cmp);
    strict_rates.sort_by(f64::total_cmp);
    let t = Instant::now();
    for _ in 0..4096 {
        std::hint::black_box(PreparedKey::new(std::hint::black_box(&publics[0])));
    }
    let prep_us = t.elapsed().as_secs_f64() / 4096.0 * 1e6;
    println!(
        "verify_strict: median {:.0}/s; prepared key (prepared for each signature) / verify_strict: median {:.3}, quartiles {:.3} .. {:.3}; preparing a key {prep_us:.2} µs",
        strict_rates[12], ratios[12], ratios[6], ratios[18]
    );
}
