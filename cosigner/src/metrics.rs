//! The cosigner's Prometheus metrics (`GET /metrics`, docs/api.md "The
//! cosigner"). Every name starts `tally_cosigner_`, so they never mix with
//! the witness's `tally_` metrics on one dashboard.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use crate::state::Cosigned;

/// Results an add-checkpoint request can have, in the order they are shown.
pub(crate) const RESULTS: [&str; 9] = [
    "ok",
    "malformed",
    "unknown_origin",
    "not_signed",
    "bad_signature",
    "old_size_too_large",
    "conflict",
    "inconsistent",
    "internal",
];

/// Request counters and, per log, the latest cosigned size and timestamp.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    results: BTreeMap<&'static str, u64>,
    too_large: u64,
    logs: BTreeMap<String, (u64, u64)>,
}

impl Metrics {
    /// Counts one add-checkpoint answer with result `code`.
    pub fn count(&self, code: &'static str) {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *inner.results.entry(code).or_default() += 1;
    }

    /// Counts one body refused as too large (413, before it was read).
    pub fn count_too_large(&self) {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.too_large += 1;
    }

    /// Records the latest cosigned checkpoint of `origin`.
    pub fn cosigned(&self, origin: &str, c: &Cosigned) {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        inner
            .logs
            .insert(origin.to_owned(), (c.size.get(), c.timestamp));
    }

    /// The Prometheus text exposition.
    #[must_use]
    pub fn render(&self, configured_logs: usize) -> String {
        let inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut s = String::new();
        s.push_str("# HELP tally_cosigner_add_checkpoint_requests_total add-checkpoint requests by result (docs/api.md error codes; ok = cosigned).\n");
        s.push_str("# TYPE tally_cosigner_add_checkpoint_requests_total counter\n");
        for r in RESULTS {
            let n = inner.results.get(r).copied().unwrap_or(0);
            let _ = writeln!(
                s,
                "tally_cosigner_add_checkpoint_requests_total{{result=\"{r}\"}} {n}"
            );
        }
        let _ = writeln!(
            s,
            "tally_cosigner_add_checkpoint_requests_total{{result=\"too_large\"}} {}",
            inner.too_large
        );
        s.push_str("# HELP tally_cosigner_logs_configured Logs this cosigner cosigns for.\n");
        s.push_str("# TYPE tally_cosigner_logs_configured gauge\n");
        let _ = writeln!(s, "tally_cosigner_logs_configured {configured_logs}");
        s.push_str("# HELP tally_cosigner_log_tree_size Size of the latest checkpoint cosigned, per log origin.\n");
        s.push_str("# TYPE tally_cosigner_log_tree_size gauge\n");
        for (origin, (size, _)) in &inner.logs {
            let _ = writeln!(
                s,
                "tally_cosigner_log_tree_size{{origin=\"{}\"}} {size}",
                escape(origin)
            );
        }
        s.push_str("# HELP tally_cosigner_log_cosigned_timestamp_seconds Timestamp of the latest cosignature, per log origin.\n");
        s.push_str("# TYPE tally_cosigner_log_cosigned_timestamp_seconds gauge\n");
        for (origin, (_, ts)) in &inner.logs {
            let _ = writeln!(
                s,
                "tally_cosigner_log_cosigned_timestamp_seconds{{origin=\"{}\"}} {ts}",
                escape(origin)
            );
        }
        s
    }
}

/// A Prometheus label value: backslash, double quote and newline escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
