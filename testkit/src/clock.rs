//! Clocks for tests, behind tally-schemas' [`Clock`] (which the witness,
//! the console, the gateway and the cosigner take so that skew, validity
//! ranges and expiry are testable).

use std::sync::atomic::{AtomicI64, Ordering};

use tally_schemas::time::{Clock, UnixMillis};

/// A clock that always says the same time.
#[derive(Debug, Clone, Copy)]
pub struct FixedClock(pub UnixMillis);

impl Clock for FixedClock {
    fn now(&self) -> UnixMillis {
        self.0
    }
}

/// A clock the test moves: milliseconds since the Unix epoch, shared
/// (behind an `Arc`) between the test and the component it drives.
#[derive(Debug)]
pub struct TestClock(pub AtomicI64);

impl TestClock {
    /// A clock at `ms`.
    #[must_use]
    pub const fn at(ms: i64) -> Self {
        Self(AtomicI64::new(ms))
    }

    /// Sets the time to `ms`.
    pub fn set(&self, ms: i64) {
        self.0.store(ms, Ordering::SeqCst);
    }

    /// Moves the time by `ms` (back when negative).
    pub fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for TestClock {
    fn now(&self) -> UnixMillis {
        UnixMillis::new(self.0.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_clock_says_what_it_was_set_to() {
        let c = TestClock::at(1_000);
        assert_eq!(c.now().as_millis(), 1_000);
        c.advance(500);
        assert_eq!(c.now().as_millis(), 1_500);
        c.set(7);
        assert_eq!(c.now().as_millis(), 7);
        assert_eq!(FixedClock(UnixMillis::new(9)).now().as_millis(), 9);
    }
}
