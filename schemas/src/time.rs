//! Timestamps: `UnixMillis`, and its wire form, RFC 3339 in UTC with exactly
//! millisecond precision (`2026-11-30T08:00:00.123Z`), docs/protocol.md §2.
//!
//! One spelling per instant: a time with another offset, fewer or more
//! fractional digits, or a lowercase `t`/`z` is refused, so the canonical bytes
//! that are signed have one form.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Milliseconds since the Unix epoch, UTC.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct UnixMillis(i64);

/// The earliest time tally accepts (1970-01-01T00:00:00.000Z).
pub const MIN_TIME: UnixMillis = UnixMillis(0);
/// The latest time tally accepts (9999-12-31T23:59:59.999Z).
pub const MAX_TIME: UnixMillis = UnixMillis(253_402_300_799_999);

/// A time string that is not in tally's one RFC 3339 form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a time must look like 2026-11-30T08:00:00.123Z (UTC, milliseconds, years 1970-9999), got {got:?}")]
pub struct TimeParseError {
    /// The offending text, cut to 80 characters.
    pub got: String,
}

/// A time outside `MIN_TIME..=MAX_TIME`, which has no wire form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("time {millis} ms since the Unix epoch is outside 1970-01-01T00:00:00.000Z..=9999-12-31T23:59:59.999Z")]
pub struct TimeRangeError {
    /// The time, in milliseconds since the Unix epoch.
    pub millis: i64,
}

impl UnixMillis {
    /// Wraps a count of milliseconds.
    #[must_use]
    pub const fn new(millis: i64) -> Self {
        Self(millis)
    }

    /// The count of milliseconds.
    #[must_use]
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// The current time from the system clock. Callers that need a testable
    /// clock take a [`Clock`] instead.
    #[must_use]
    pub fn now() -> Self {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Self(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }

    /// The absolute difference in milliseconds.
    #[must_use]
    pub fn abs_diff(self, other: Self) -> u64 {
        self.0.abs_diff(other.0)
    }

    /// Whether the time lies in `MIN_TIME..=MAX_TIME`, the range the wire
    /// form can spell. Every time parsed from the wire does.
    #[must_use]
    pub const fn in_range(self) -> bool {
        self.0 >= MIN_TIME.0 && self.0 <= MAX_TIME.0
    }

    /// Wraps a count of milliseconds, refusing one outside
    /// `MIN_TIME..=MAX_TIME`.
    ///
    /// # Errors
    /// [`TimeRangeError`] for a time before 1970 or after 9999.
    pub const fn checked(millis: i64) -> Result<Self, TimeRangeError> {
        let t = Self(millis);
        if t.in_range() {
            Ok(t)
        } else {
            Err(TimeRangeError { millis })
        }
    }

    /// The wire form.
    ///
    /// # Errors
    /// [`TimeRangeError`] for a time outside `MIN_TIME..=MAX_TIME`, which
    /// has no wire form (it is never silently moved into range).
    pub fn to_rfc3339(self) -> Result<String, TimeRangeError> {
        let text = self.rfc3339_bytes()?;
        // Digits and ASCII punctuation only.
        Ok(text.iter().map(|&b| char::from(b)).collect())
    }

    /// The wire form as its 24 ASCII bytes, written without allocating
    /// (a pack line holds two times, and the verifier writes both back).
    ///
    /// # Errors
    /// [`TimeRangeError`] for a time outside `MIN_TIME..=MAX_TIME`.
    pub fn rfc3339_bytes(self) -> Result<[u8; 24], TimeRangeError> {
        if !self.in_range() {
            return Err(TimeRangeError { millis: self.0 });
        }
        // In range, so non-negative and the year has four digits.
        let millis = self.0.unsigned_abs();
        let (days, ms_of_day) = (millis / 86_400_000, millis % 86_400_000);
        let (year, month, day) = civil_from_days(days);
        let secs = ms_of_day / 1000;
        let fields = [
            (0, 4, year),
            (5, 2, month),
            (8, 2, day),
            (11, 2, secs / 3600),
            (14, 2, secs / 60 % 60),
            (17, 2, secs % 60),
            (20, 3, ms_of_day % 1000),
        ];
        let mut out = *b"0000-00-00T00:00:00.000Z";
        for (at, width, mut value) in fields {
            for i in (at..at + width).rev() {
                // `value % 10` is below 10, so the cast keeps it.
                out[i] = b'0' + (value % 10) as u8;
                value /= 10;
            }
        }
        Ok(out)
    }

    /// Parses the wire form.
    ///
    /// # Errors
    /// [`TimeParseError`] unless the text is exactly `YYYY-MM-DDTHH:MM:SS.mmmZ`
    /// naming a real instant between 1970 and 9999.
    pub fn parse_rfc3339(text: &str) -> Result<Self, TimeParseError> {
        let err = || TimeParseError {
            got: text.chars().take(80).collect(),
        };
        let b = text.as_bytes();
        let shape_ok = b.len() == 24
            && b.iter().enumerate().all(|(i, c)| match i {
                4 | 7 => *c == b'-',
                10 => *c == b'T',
                13 | 16 => *c == b':',
                19 => *c == b'.',
                23 => *c == b'Z',
                _ => c.is_ascii_digit(),
            });
        if !shape_ok {
            return Err(err());
        }
        let num = |r: std::ops::Range<usize>| -> i64 {
            text[r]
                .bytes()
                .fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0'))
        };
        let year = i32::try_from(num(0..4)).map_err(|_| err())?;
        let month = time::Month::try_from(u8::try_from(num(5..7)).map_err(|_| err())?)
            .map_err(|_| err())?;
        let date = time::Date::from_calendar_date(
            year,
            month,
            u8::try_from(num(8..10)).map_err(|_| err())?,
        )
        .map_err(|_| err())?;
        let clock = time::Time::from_hms(
            u8::try_from(num(11..13)).map_err(|_| err())?,
            u8::try_from(num(14..16)).map_err(|_| err())?,
            u8::try_from(num(17..19)).map_err(|_| err())?,
        )
        .map_err(|_| err())?;
        let secs = date.with_time(clock).assume_utc().unix_timestamp();
        let millis = secs * 1000 + num(20..23);
        if !(MIN_TIME.0..=MAX_TIME.0).contains(&millis) {
            return Err(err());
        }
        Ok(Self(millis))
    }
}

/// The proleptic Gregorian date `(year, month, day)` of the day `days` after
/// 1970-01-01 (the inverse of the day count of a date, in 400-year eras of
/// 146,097 days that start on March 1, so the leap day ends a year).
const fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Days since 0000-03-01.
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    // Months from March: 0 is March, 11 is February.
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = era * 400 + year_of_era + if month <= 2 { 1 } else { 0 };
    (year, month, day)
}

/// The wire form; a time outside the wire range shows as its count of
/// milliseconds, marked, rather than as some other instant.
impl fmt::Display for UnixMillis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_rfc3339() {
            Ok(text) => f.write_str(&text),
            Err(_) => write!(f, "{}ms (out of range)", self.0),
        }
    }
}

impl fmt::Debug for UnixMillis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UnixMillis({self})")
    }
}

/// Fails for a time outside `MIN_TIME..=MAX_TIME`, which has no wire form.
impl Serialize for UnixMillis {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let text = self.to_rfc3339().map_err(serde::ser::Error::custom)?;
        s.serialize_str(&text)
    }
}

impl<'de> Deserialize<'de> for UnixMillis {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::parse_rfc3339(&text).map_err(serde::de::Error::custom)
    }
}

/// A source of the current time, injected so that skew and expiry are testable.
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> UnixMillis;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> UnixMillis {
        UnixMillis::now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_other_spellings() {
        let t = UnixMillis::parse_rfc3339("2026-11-30T08:00:00.123Z").unwrap();
        assert_eq!(t.as_millis(), 1_796_025_600_123);
        assert_eq!(t.to_rfc3339().unwrap(), "2026-11-30T08:00:00.123Z");
        for bad in [
            "2026-11-30T08:00:00Z",
            "2026-11-30T08:00:00.1234Z",
            "2026-11-30T08:00:00.123+00:00",
            "2026-11-30t08:00:00.123z",
            "2026-02-30T08:00:00.123Z",
            "2026-11-30T24:00:00.123Z",
            "1969-12-31T23:59:59.999Z",
            "",
        ] {
            assert!(UnixMillis::parse_rfc3339(bad).is_err(), "{bad}");
        }
        assert_eq!(MAX_TIME.to_rfc3339().unwrap(), "9999-12-31T23:59:59.999Z");
        assert_eq!(MIN_TIME.to_rfc3339().unwrap(), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            UnixMillis::parse_rfc3339("9999-12-31T23:59:59.999Z"),
            Ok(MAX_TIME)
        );
        assert_eq!(
            UnixMillis::parse_rfc3339("1970-01-01T00:00:00.000Z"),
            Ok(MIN_TIME)
        );
    }

    /// The wire form as the `time` crate spells it (how it was written
    /// before the writer of its own), the oracle for `rfc3339_bytes`.
    fn oracle(t: UnixMillis) -> String {
        let dt = time::OffsetDateTime::from_unix_timestamp(t.0.div_euclid(1000)).unwrap();
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            dt.year(),
            u8::from(dt.month()),
            dt.day(),
            dt.hour(),
            dt.minute(),
            dt.second(),
            t.0.rem_euclid(1000)
        )
    }

    #[test]
    fn the_writer_spells_every_day_as_the_time_crate_does() {
        // Every day from 1970 to 9999 has the time crate's date; every 97th
        // day, at its first and last millisecond and one that moves with
        // it, the whole spelling, which parses back.
        let last_day = MAX_TIME.0 / 86_400_000;
        for day in 0..=last_day {
            let date = time::OffsetDateTime::from_unix_timestamp(day * 86_400)
                .unwrap()
                .date();
            let want = (
                u64::try_from(date.year()).unwrap(),
                u64::from(u8::from(date.month())),
                u64::from(date.day()),
            );
            assert_eq!(civil_from_days(day.unsigned_abs()), want, "day {day}");
            if day % 97 == 0 || day == last_day {
                let start = day * 86_400_000;
                for t in [
                    start,
                    start + (day * 7_919_993) % 86_400_000,
                    start + 86_399_999,
                ] {
                    let t = UnixMillis::new(t);
                    let text = t.to_rfc3339().unwrap();
                    assert_eq!(text, oracle(t));
                    assert_eq!(t.rfc3339_bytes().unwrap(), text.as_bytes());
                    assert_eq!(UnixMillis::parse_rfc3339(&text), Ok(t));
                }
            }
        }
    }

    #[test]
    fn out_of_range_times_have_no_wire_form() {
        for millis in [-1, MAX_TIME.0 + 1, i64::MIN, i64::MAX] {
            let t = UnixMillis::new(millis);
            assert!(!t.in_range());
            assert_eq!(t.to_rfc3339(), Err(TimeRangeError { millis }));
            assert_eq!(UnixMillis::checked(millis), Err(TimeRangeError { millis }));
            assert_eq!(t.to_string(), format!("{millis}ms (out of range)"));
            assert!(serde_json::to_string(&t).is_err());
            assert!(crate::canonical::canonicalize(&t).is_err());
        }
        assert_eq!(UnixMillis::checked(MAX_TIME.0), Ok(MAX_TIME));
        assert_eq!(UnixMillis::checked(0), Ok(MIN_TIME));
    }
}
