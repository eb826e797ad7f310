//! The login throttle (docs/console.md "Access"): every `POST
//! /console/login` takes a token from its client address's bucket and one
//! from the witness-wide bucket before the API key is even looked at; with
//! either empty the answer is 429 with `Retry-After`. A guesser from one
//! address gets a few tries a minute; a guesser from many addresses is held
//! to the global rate, which is far above what people logging in need.
//!
//! An address is an IPv4 address or an IPv6 /64 (one host usually holds a
//! whole /64). Time comes from the witness's injected clock, so tests are
//! exact. Memory is bounded: at most [`MAX_TRACKED_ADDRESSES`] buckets are
//! kept, and a bucket that has refilled is worth nothing and is dropped
//! when room is needed.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;

use tally_schemas::UnixMillis;
use tally_witness::client_key;

/// Most client addresses tracked at once. Past it, a login from a new
/// address waits until buckets refill (only a flood from this many
/// addresses gets there, and the global bucket is empty by then anyway).
pub(crate) const MAX_TRACKED_ADDRESSES: usize = 65_536;

/// A token bucket's shape: `burst` tokens, refilled at `per_minute`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Tokens when full: attempts allowed back to back.
    pub burst: u32,
    /// Tokens added per minute.
    pub per_minute: f64,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: i64,
}

impl Bucket {
    fn full(rate: Rate, now: i64) -> Self {
        Self {
            tokens: f64::from(rate.burst),
            at: now,
        }
    }

    /// Refills to `now`.
    fn refill(&mut self, rate: Rate, now: i64) {
        let elapsed_min = (now - self.at).max(0) as f64 / 60_000.0;
        self.tokens = (self.tokens + elapsed_min * rate.per_minute).min(f64::from(rate.burst));
        self.at = now.max(self.at);
    }

    fn is_full(&self, rate: Rate) -> bool {
        self.tokens >= f64::from(rate.burst)
    }

    /// Milliseconds until one token is there (0: now).
    fn wait_ms(&self, rate: Rate) -> u64 {
        if self.tokens >= 1.0 {
            0
        } else if rate.per_minute > 0.0 {
            ((1.0 - self.tokens) / rate.per_minute * 60_000.0).ceil() as u64
        } else {
            u64::MAX / 2
        }
    }
}

struct State {
    global: Bucket,
    by_address: HashMap<IpAddr, Bucket>,
}

/// The throttle. See the module docs.
pub(crate) struct LoginThrottle {
    per_address: Rate,
    global: Rate,
    state: Mutex<State>,
}

impl std::fmt::Debug for LoginThrottle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginThrottle")
            .field("per_address", &self.per_address)
            .field("global", &self.global)
            .finish_non_exhaustive()
    }
}

impl LoginThrottle {
    /// A throttle with these rates; both buckets start full.
    #[must_use]
    pub(crate) fn new(per_address: Rate, global: Rate) -> Self {
        Self {
            per_address,
            global,
            state: Mutex::new(State {
                global: Bucket::full(global, 0),
                by_address: HashMap::new(),
            }),
        }
    }

    /// Takes one login attempt for `client` (`None`: the address is unknown,
    /// and all such attempts share one bucket) at `now`. Nothing is taken
    /// when the attempt is refused, so waiting out one bucket never drains
    /// the other.
    ///
    /// # Errors
    /// The milliseconds to wait (at least 1) when either bucket is empty.
    pub(crate) fn take(&self, client: Option<IpAddr>, now: UnixMillis) -> Result<(), u64> {
        let now = now.as_millis();
        let key = client.map_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED), client_key);
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let State { global, by_address } = &mut *state;
        global.refill(self.global, now);
        if !by_address.contains_key(&key) && by_address.len() >= MAX_TRACKED_ADDRESSES {
            let rate = self.per_address;
            by_address.retain(|_, b| {
                b.refill(rate, now);
                !b.is_full(rate)
            });
            if by_address.len() >= MAX_TRACKED_ADDRESSES {
                // Every tracked address is still waiting: so does this one,
                // for as long as the first of them to refill a token.
                let wait = by_address
                    .values()
                    .map(|b| b.wait_ms(rate))
                    .min()
                    .unwrap_or(1);
                return Err(wait.max(global.wait_ms(self.global)).max(1));
            }
        }
        let address = by_address
            .entry(key)
            .or_insert_with(|| Bucket::full(self.per_address, now));
        address.refill(self.per_address, now);
        let wait = address
            .wait_ms(self.per_address)
            .max(global.wait_ms(self.global));
        if wait > 0 {
            return Err(wait);
        }
        address.tokens -= 1.0;
        global.tokens -= 1.0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PER_ADDRESS: Rate = Rate {
        burst: 2,
        per_minute: 6.0,
    };
    const GLOBAL: Rate = Rate {
        burst: 3,
        per_minute: 60.0,
    };

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn console_throttle_buckets_per_address_and_global() {
        let t = LoginThrottle::new(PER_ADDRESS, GLOBAL);
        let at = UnixMillis::new;
        assert_eq!(t.take(ip("192.0.2.1"), at(0)), Ok(()));
        assert_eq!(t.take(ip("192.0.2.1"), at(0)), Ok(()));
        // The address's burst is spent: one token in 10 s.
        assert_eq!(t.take(ip("192.0.2.1"), at(0)), Err(10_000));
        // The same host through an IPv4-mapped IPv6 address is the same.
        assert_eq!(t.take(ip("::ffff:192.0.2.1"), at(0)), Err(10_000));
        // Another address has its own bucket, but the global one (3) is
        // spent after its first attempt: one token a second.
        assert_eq!(t.take(ip("198.51.100.1"), at(0)), Ok(()));
        assert_eq!(t.take(ip("198.51.100.2"), at(0)), Err(1_000));
        assert_eq!(t.take(ip("198.51.100.2"), at(1_000)), Ok(()));
        // Refused attempts took nothing: after 10 s the first address
        // has exactly one token again.
        assert_eq!(t.take(ip("192.0.2.1"), at(10_000)), Ok(()));
        assert!(t.take(ip("192.0.2.1"), at(10_000)).is_err());
    }

    #[test]
    fn console_throttle_groups_ipv6_by_64_and_unknown_together() {
        let t = LoginThrottle::new(
            PER_ADDRESS,
            Rate {
                burst: 100,
                per_minute: 6_000.0,
            },
        );
        let at = UnixMillis::new(0);
        assert_eq!(t.take(ip("2001:db8:1:2::1"), at), Ok(()));
        assert_eq!(t.take(ip("2001:db8:1:2:ffff::9"), at), Ok(()));
        assert!(t.take(ip("2001:db8:1:2:aaaa::1"), at).is_err(), "same /64");
        assert_eq!(t.take(ip("2001:db8:1:3::1"), at), Ok(()), "another /64");
        assert_eq!(t.take(None, at), Ok(()));
        assert_eq!(t.take(None, at), Ok(()));
        assert!(
            t.take(None, at).is_err(),
            "unknown addresses share a bucket"
        );
    }

    #[test]
    fn console_throttle_tracks_a_bounded_number_of_addresses() {
        let t = LoginThrottle::new(
            PER_ADDRESS,
            Rate {
                burst: u32::MAX,
                per_minute: 1e12,
            },
        );
        let at = UnixMillis::new(0);
        for i in 0..MAX_TRACKED_ADDRESSES as u32 {
            assert_eq!(t.take(Some(IpAddr::from(i.to_be_bytes())), at), Ok(()));
        }
        // Full of addresses that are still waiting: a new one waits too.
        let new = Some(IpAddr::from([255, 255, 255, 255]));
        assert!(t.take(new, at).is_err());
        // Once they have refilled they are dropped to make room.
        let later = UnixMillis::new(10_000);
        assert_eq!(t.take(new, later), Ok(()));
        let kept = t.state.lock().unwrap().by_address.len();
        assert_eq!(kept, 1);
    }
}
