//! Environment lists and percentiles, shared by `benches/log.rs` and
//! `examples/proofs_at_scale.rs`.

use std::time::Duration;

/// The comma-separated numbers in `name`, or in `default` when it is unset.
pub(crate) fn env_list(name: &str, default: &str) -> Vec<u64> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

/// The `p` quantile (nearest rank) of `sorted`; zero when it is empty.
pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}
