//! Rate-limited logging of the libraries under `tally serve` (docs/operations.md
//! "Logs"): tally's own warnings are already at most one line per interval,
//! with counts (module `conn`, [`crate::refusal_log`]); the lines of hyper,
//! h2, rustls and the other libraries come once per hostile connection (an
//! HTTP/2 rapid reset logs a warning each), so a keyless client could fill
//! the disk and bury tally's own lines. This filter lets through at most
//! [`BURST`] events per call site of such a library per [`INTERVAL`];
//! the rest are counted in `tally_log_lines_suppressed_total`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::callsite::Identifier;
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::Metadata;
use tracing_subscriber::layer::{Context, Filter};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// The window of the limit.
pub const INTERVAL: Duration = Duration::from_secs(10);
/// Events of one library call site let through per [`INTERVAL`].
pub const BURST: u32 = 5;

static SUPPRESSED: AtomicU64 = AtomicU64::new(0);

/// Library log lines suppressed by [`RateLimitedLibraries`] since start.
#[must_use]
pub fn suppressed() -> u64 {
    SUPPRESSED.load(Ordering::Relaxed)
}

/// The filter: first `RUST_LOG`'s (an [`EnvFilter`]); of what that lets
/// through, tally's own events and every span pass, a library's events at
/// most [`BURST`] per call site per [`INTERVAL`].
#[derive(Debug)]
pub struct RateLimitedLibraries {
    env: EnvFilter,
    windows: Mutex<HashMap<Identifier, (Instant, u32)>>,
}

fn is_tally(meta: &Metadata<'_>) -> bool {
    let t = meta.target();
    t == "tally" || t.starts_with("tally_") || t.starts_with("tally::")
}

impl RateLimitedLibraries {
    /// `env`, with the libraries' events rate-limited.
    #[must_use]
    pub fn new(env: EnvFilter) -> Self {
        Self {
            env,
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// Whether one more event of `callsite` passes at `now`.
    fn pass(&self, callsite: Identifier, now: Instant) -> bool {
        let mut w = self
            .windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (start, count) = w.entry(callsite).or_insert((now, 0));
        if now.duration_since(*start) >= INTERVAL {
            *start = now;
            *count = 0;
        }
        if *count < BURST {
            *count += 1;
            true
        } else {
            SUPPRESSED.fetch_add(1, Ordering::Relaxed);
            false
        }
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Filter<S> for RateLimitedLibraries {
    fn enabled(&self, meta: &Metadata<'_>, cx: &Context<'_, S>) -> bool {
        if !Filter::<S>::enabled(&self.env, meta, cx) {
            return false;
        }
        if !meta.is_event() || is_tally(meta) {
            return true;
        }
        self.pass(meta.callsite(), Instant::now())
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        let env = Filter::<S>::callsite_enabled(&self.env, meta);
        if env.is_never() || !meta.is_event() || is_tally(meta) {
            env
        } else {
            // Asked event by event, so that the window can pass or refuse.
            Interest::sometimes()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Filter::<S>::max_level_hint(&self.env)
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, cx: Context<'_, S>) {
        Filter::<S>::on_new_span(&self.env, attrs, id, cx);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, cx: Context<'_, S>) {
        Filter::<S>::on_record(&self.env, id, values, cx);
    }

    fn on_enter(&self, id: &Id, cx: Context<'_, S>) {
        Filter::<S>::on_enter(&self.env, id, cx);
    }

    fn on_exit(&self, id: &Id, cx: Context<'_, S>) {
        Filter::<S>::on_exit(&self.env, id, cx);
    }

    fn on_close(&self, id: Id, cx: Context<'_, S>) {
        Filter::<S>::on_close(&self.env, id, cx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_call_site_passes_a_burst_per_interval() {
        let f = RateLimitedLibraries::new(EnvFilter::new("info"));
        let id = Identifier(&CALLSITE);
        let t0 = Instant::now();
        let before = suppressed();
        let passed = (0..100).filter(|_| f.pass(id.clone(), t0)).count();
        assert_eq!(passed, BURST as usize);
        assert!(suppressed() >= before + 95);
        // The next interval lets a burst through again.
        assert!(f.pass(id, t0 + INTERVAL));
    }

    struct Site;
    static CALLSITE: Site = Site;
    impl tracing::callsite::Callsite for Site {
        fn set_interest(&self, _: Interest) {}
        fn metadata(&self) -> &Metadata<'_> {
            unreachable!("not asked in this test")
        }
    }
}
