//! `/metrics` in the Prometheus text exposition format (docs/api.md
//! "`GET /metrics`"):
//! admissions by status code and error code, admission latency, group-commit
//! batch sizes, the log's counters, and the connection layer's
//! ([`crate::conn::ConnectionStats`]). Hand-rolled: a few atomics and one
//! small map, no registry crate.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tally_log::LogStats;

use crate::conn::ConnectionStats;

/// Upper bounds of the latency buckets, seconds.
const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Upper bounds of the batch-size buckets, entries.
const BATCH_BUCKETS: [f64; 12] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0,
];

#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micro: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_micro: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    fn observe(&self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|b| v <= *b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.sum_micro
            .fetch_add((v * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cumulative += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            self.sum_micro.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count {count}");
    }
}

/// The witness's metrics.
#[derive(Debug)]
pub struct Metrics {
    admissions: Mutex<BTreeMap<(u16, &'static str), u64>>,
    latency: Histogram,
    batch_requests: Mutex<BTreeMap<(u16, &'static str), u64>>,
    batch_latency: Histogram,
    batches: Histogram,
    last_batch_end: Mutex<u64>,
    connections: Arc<ConnectionStats>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            admissions: Mutex::new(BTreeMap::new()),
            latency: Histogram::new(&LATENCY_BUCKETS),
            batch_requests: Mutex::new(BTreeMap::new()),
            batch_latency: Histogram::new(&LATENCY_BUCKETS),
            batches: Histogram::new(&BATCH_BUCKETS),
            last_batch_end: Mutex::new(0),
            connections: Arc::default(),
        }
    }
}

impl Metrics {
    /// The connection layer's counters, for the server to count into
    /// (`crate::server::ServeOptions::stats`).
    #[must_use]
    pub fn connections(&self) -> &Arc<ConnectionStats> {
        &self.connections
    }

    /// Counts one answer of `POST /v1/records` and its latency.
    pub fn admission(&self, status: u16, code: &'static str, elapsed: Duration) {
        *self
            .admissions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry((status, code))
            .or_insert(0) += 1;
        self.latency.observe(elapsed.as_secs_f64());
    }

    /// Counts the answer for one record of a batch (without a latency of its
    /// own: the batch request's is counted by [`Metrics::batch_request`]).
    pub fn batch_record(&self, status: u16, code: &'static str) {
        *self
            .admissions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry((status, code))
            .or_insert(0) += 1;
    }

    /// Counts one answer of `POST /v1/records/batch` (200 when the batch was
    /// answered record by record) and its latency.
    pub fn batch_request(&self, status: u16, code: &'static str, elapsed: Duration) {
        *self
            .batch_requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry((status, code))
            .or_insert(0) += 1;
        self.batch_latency.observe(elapsed.as_secs_f64());
    }

    /// Notes a receipt issued under a checkpoint of `size` for a new entry at
    /// `index`: the first receipt seen of a batch records the batch's size
    /// (entries since the previous batch end seen).
    pub fn receipt(&self, index: u64, size: u64) {
        let mut last = self
            .last_batch_end
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if size > *last && index >= *last {
            self.batches.observe((size - *last) as f64);
            *last = size;
        }
    }

    /// Sets where the log stood at start, so the first batch is measured right.
    pub fn start_at(&self, size: u64) {
        *self
            .last_batch_end
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = size;
    }

    /// The exposition text.
    #[must_use]
    pub fn render(&self, log: LogStats, tree_size: u64) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP tally_log_lines_suppressed_total Log lines of libraries (hyper, h2, rustls) over their rate limit, not written.\n# TYPE tally_log_lines_suppressed_total counter\ntally_log_lines_suppressed_total {}",
            crate::log_filter::suppressed()
        );
        out.push_str("# HELP tally_admissions_total Answers for records (of POST /v1/records, and each record of POST /v1/records/batch) by HTTP status and code.\n# TYPE tally_admissions_total counter\n");
        for ((status, code), n) in self
            .admissions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
        {
            let _ = writeln!(
                out,
                "tally_admissions_total{{status=\"{status}\",code=\"{code}\"}} {n}"
            );
        }
        self.latency.render(
            &mut out,
            "tally_admission_seconds",
            "Time from request to answer of POST /v1/records.",
        );
        out.push_str("# HELP tally_batch_requests_total Answers of POST /v1/records/batch by HTTP status and code (200 ok: answered record by record).\n# TYPE tally_batch_requests_total counter\n");
        for ((status, code), n) in self
            .batch_requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
        {
            let _ = writeln!(
                out,
                "tally_batch_requests_total{{status=\"{status}\",code=\"{code}\"}} {n}"
            );
        }
        self.batch_latency.render(
            &mut out,
            "tally_batch_request_seconds",
            "Time from request to answer of POST /v1/records/batch.",
        );
        self.batches.render(
            &mut out,
            "tally_batch_entries",
            "Entries per group commit, as seen from the receipts issued.",
        );
        let _ = writeln!(
            out,
            "# HELP tally_log_batches_total Group commits since start.\n# TYPE tally_log_batches_total counter\ntally_log_batches_total {}",
            log.batches
        );
        let _ = writeln!(
            out,
            "# HELP tally_log_entries_total Entries committed since start.\n# TYPE tally_log_entries_total counter\ntally_log_entries_total {}",
            log.entries
        );
        let _ = writeln!(
            out,
            "# HELP tally_log_largest_batch Largest group commit since start.\n# TYPE tally_log_largest_batch gauge\ntally_log_largest_batch {}",
            log.largest_batch
        );
        let _ = writeln!(
            out,
            "# HELP tally_log_tree_size Size of the latest signed checkpoint.\n# TYPE tally_log_tree_size gauge\ntally_log_tree_size {tree_size}"
        );
        self.connections.render(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_and_cumulative_buckets() {
        let m = Metrics::default();
        m.admission(200, "ok", Duration::from_micros(700));
        m.admission(409, "chain_conflict", Duration::from_millis(3));
        m.admission(200, "ok", Duration::from_millis(3));
        m.receipt(0, 3);
        m.receipt(1, 3);
        m.receipt(3, 4);
        let text = m.render(LogStats::default(), 4);
        assert!(text.contains("tally_admissions_total{status=\"200\",code=\"ok\"} 2"));
        assert!(text.contains("tally_admissions_total{status=\"409\",code=\"chain_conflict\"} 1"));
        assert!(text.contains("tally_admission_seconds_bucket{le=\"0.001\"} 1"));
        assert!(text.contains("tally_admission_seconds_bucket{le=\"0.005\"} 3"));
        assert!(text.contains("tally_batch_entries_bucket{le=\"1\"} 1"));
        assert!(text.contains("tally_batch_entries_bucket{le=\"4\"} 2"));
        assert!(text.contains("tally_batch_entries_count 2"));
        assert!(text.contains("tally_log_tree_size 4"));
    }
}
