//! Per-project quotas (docs/api.md "POST /v1/records", 429
//! `quota_exceeded`; docs/operations.md "Quotas"): records and bytes a
//! project may have checked per UTC day of the witness clock. A key's rate
//! limit bounds how fast; a quota bounds how much a project can grow the
//! log in a day, whatever its keys.
//!
//! Counted in each front's memory, per project: a record counts when it is
//! checked (after it parsed, before its agent, key and signature checks),
//! with its canonical bytes. Time comes from the injected clock.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use tally_schemas::UnixMillis;

use crate::error::WitnessError;

/// A UTC day in milliseconds.
const DAY_MS: i64 = 86_400_000;

/// The quotas of every project; `None`: no bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectQuota {
    /// Records per project per UTC day.
    pub records_per_day: Option<u64>,
    /// Canonical record bytes per project per UTC day.
    pub bytes_per_day: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Today {
    day: i64,
    records: u64,
    bytes: u64,
}

/// The counts of the current day, per project.
#[derive(Debug)]
pub(crate) struct Quotas {
    quota: ProjectQuota,
    used: Mutex<HashMap<String, Today>>,
}

impl Quotas {
    pub(crate) fn new(quota: ProjectQuota) -> Self {
        Self {
            quota,
            used: Mutex::new(HashMap::new()),
        }
    }

    /// Counts `records` records of `bytes` canonical bytes for `project`
    /// at `now`, unless that would pass one of its quotas.
    ///
    /// # Errors
    /// [`WitnessError::QuotaExceeded`], naming the quota and the time to
    /// the next UTC day; nothing is counted then.
    pub(crate) fn charge(
        &self,
        project: &str,
        records: u64,
        bytes: u64,
        now: UnixMillis,
    ) -> Result<(), WitnessError> {
        if self.quota == ProjectQuota::default() {
            return Ok(());
        }
        let now = now.as_millis();
        let day = now.div_euclid(DAY_MS);
        let mut used = self
            .used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let t = used.entry(project.to_owned()).or_default();
        if t.day != day {
            *t = Today {
                day,
                ..Today::default()
            };
        }
        let over = |used: u64, more: u64, max: Option<u64>| {
            max.filter(|max| used.saturating_add(more) > *max)
        };
        let exceeded = over(t.records, records, self.quota.records_per_day)
            .map(|m| ("records", m))
            .or_else(|| over(t.bytes, bytes, self.quota.bytes_per_day).map(|m| ("bytes", m)));
        if let Some((quota, limit)) = exceeded {
            let next_day = (day + 1) * DAY_MS;
            return Err(WitnessError::QuotaExceeded {
                project: project.to_owned(),
                quota,
                limit,
                retry_after_ms: u64::try_from(next_day - now).unwrap_or(1).max(1),
            });
        }
        t.records += records;
        t.bytes += bytes;
        Ok(())
    }

    /// Appends the Prometheus text of today's counts to `out`.
    pub(crate) fn render(&self, out: &mut String, now: UnixMillis) {
        if self.quota == ProjectQuota::default() {
            return;
        }
        let day = now.as_millis().div_euclid(DAY_MS);
        let used = self
            .used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut rows: Vec<_> = used.iter().filter(|(_, t)| t.day == day).collect();
        rows.sort_by(|a, b| a.0.cmp(b.0));
        out.push_str("# HELP tally_project_records_today Records checked for the project this UTC day (its quota: --project-records-per-day).\n# TYPE tally_project_records_today gauge\n");
        for (p, t) in &rows {
            let _ = writeln!(
                out,
                "tally_project_records_today{{project=\"{p}\"}} {}",
                t.records
            );
        }
        out.push_str("# HELP tally_project_bytes_today Canonical record bytes checked for the project this UTC day (its quota: --project-bytes-per-day).\n# TYPE tally_project_bytes_today gauge\n");
        for (p, t) in &rows {
            let _ = writeln!(
                out,
                "tally_project_bytes_today{{project=\"{p}\"}} {}",
                t.bytes
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_project_is_held_to_its_day_and_starts_again_the_next() {
        let q = Quotas::new(ProjectQuota {
            records_per_day: Some(3),
            bytes_per_day: Some(1_000),
        });
        let t = UnixMillis::new(10 * DAY_MS + 1_000);
        assert!(q.charge("a", 2, 100, t).is_ok());
        assert!(q.charge("a", 1, 100, t).is_ok());
        match q.charge("a", 1, 1, t) {
            Err(WitnessError::QuotaExceeded {
                quota,
                limit,
                retry_after_ms,
                ..
            }) => {
                assert_eq!((quota, limit), ("records", 3));
                assert_eq!(retry_after_ms, (DAY_MS - 1_000) as u64);
            }
            other => panic!("{other:?}"),
        }
        // Another project has its own counts; bytes are a quota too.
        assert!(matches!(
            q.charge("b", 1, 1_001, t),
            Err(WitnessError::QuotaExceeded { quota: "bytes", .. })
        ));
        assert!(q.charge("b", 1, 1_000, t).is_ok());
        // The next UTC day starts from zero.
        assert!(q
            .charge("a", 3, 1_000, UnixMillis::new(11 * DAY_MS))
            .is_ok());
        let mut text = String::new();
        q.render(&mut text, UnixMillis::new(11 * DAY_MS));
        assert!(
            text.contains("tally_project_records_today{project=\"a\"} 3"),
            "{text}"
        );
        assert!(!text.contains("project=\"b\""), "{text}");
    }

    #[test]
    fn no_quota_counts_nothing() {
        let q = Quotas::new(ProjectQuota::default());
        let t = UnixMillis::new(0);
        assert!(q.charge("a", u64::MAX, u64::MAX, t).is_ok());
        let mut text = String::new();
        q.render(&mut text, t);
        assert!(text.is_empty());
    }
}
