//! Per-API-key token buckets for `POST /v1/records` (docs/api.md, 429
//! `rate_limited`). Time comes from the injected clock, so tests are exact.

use std::collections::HashMap;
use std::sync::Mutex;

use tally_schemas::UnixMillis;

use crate::config::RateLimit;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: i64,
}

/// The buckets, one per API key id.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    limit: Option<RateLimit>,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RateLimiter {
    /// A limiter; `None` admits everything.
    #[must_use]
    pub(crate) fn new(limit: Option<RateLimit>) -> Self {
        Self {
            limit,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token from `key`'s bucket at `now`.
    ///
    /// # Errors
    /// The milliseconds until a token is available, when the bucket is empty.
    pub(crate) fn take(&self, key: &str, now: UnixMillis) -> Result<(), u64> {
        self.take_n(key, 1, now)
    }

    /// Takes `n` tokens (one per record of a batch) from `key`'s bucket at
    /// `now`. A batch needs only one token in the bucket; the rest is taken
    /// as debt that the refill pays off before the key's next request, so
    /// the long-run rate in records stays the configured one whatever the
    /// batch sizes, and a batch larger than the burst is not refused forever.
    ///
    /// # Errors
    /// The milliseconds until a token is available, when the bucket is empty.
    pub(crate) fn take_n(&self, key: &str, n: usize, now: UnixMillis) -> Result<(), u64> {
        self.take_or_charge(key, n, now, false)
    }

    /// Takes `n` tokens from `key`'s bucket at `now` whatever it holds (the
    /// rest of a batch already admitted by [`Self::take_n`]), as debt.
    pub(crate) fn charge(&self, key: &str, n: usize, now: UnixMillis) {
        if n > 0 {
            let _ = self.take_or_charge(key, n, now, true);
        }
    }

    fn take_or_charge(&self, key: &str, n: usize, now: UnixMillis, force: bool) -> Result<(), u64> {
        let Some(limit) = self.limit else {
            return Ok(());
        };
        let burst = f64::from(limit.burst.max(1));
        let now = now.as_millis();
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let b = buckets.entry(key.to_owned()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let elapsed = (now - b.at).max(0) as f64 / 1000.0;
        b.tokens = (b.tokens + elapsed * limit.per_second).min(burst);
        b.at = now.max(b.at);
        if force {
            b.tokens -= n as f64;
            Ok(())
        } else if b.tokens >= 1.0 {
            b.tokens -= n.max(1) as f64;
            Ok(())
        } else {
            let wait = if limit.per_second > 0.0 {
                ((1.0 - b.tokens) / limit.per_second * 1000.0).ceil() as u64
            } else {
                u64::MAX / 2
            };
            Err(wait.max(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_empties_and_refills() {
        let r = RateLimiter::new(Some(RateLimit {
            per_second: 2.0,
            burst: 2,
        }));
        let t = UnixMillis::new(1_000_000);
        assert!(r.take("a", t).is_ok());
        assert!(r.take("a", t).is_ok());
        assert_eq!(r.take("a", t), Err(500));
        // Another key has its own bucket.
        assert!(r.take("b", t).is_ok());
        assert!(r.take("a", UnixMillis::new(1_000_500)).is_ok());
        assert!(r.take("a", UnixMillis::new(1_000_500)).is_err());
        assert!(RateLimiter::new(None).take("a", t).is_ok());
    }

    #[test]
    fn a_batch_takes_one_token_per_record_as_debt() {
        let r = RateLimiter::new(Some(RateLimit {
            per_second: 10.0,
            burst: 5,
        }));
        let t = UnixMillis::new(1_000_000);
        // 20 records with 5 tokens: admitted, leaving a debt of 15.
        assert!(r.take_n("a", 20, t).is_ok());
        // 1.6 s pays 16 tokens: 15 of debt and one for the next request.
        assert_eq!(r.take("a", t), Err(1600));
        assert!(r.take("a", UnixMillis::new(1_001_600)).is_ok());
    }

    #[test]
    fn a_charge_is_debt_taken_whatever_the_bucket_holds() {
        let r = RateLimiter::new(Some(RateLimit {
            per_second: 10.0,
            burst: 5,
        }));
        let t = UnixMillis::new(1_000_000);
        // Three tokens by size before the parse, 17 more records after it:
        // the same debt as 20 records taken at once.
        assert!(r.take_n("a", 3, t).is_ok());
        r.charge("a", 17, t);
        assert_eq!(r.take("a", t), Err(1600));
        // A charge on an empty bucket still counts.
        r.charge("a", 10, t);
        assert_eq!(r.take("a", t), Err(2600));
    }
}
