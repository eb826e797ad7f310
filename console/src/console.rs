//! The console's state ([`Console`]: the witness, the sessions, the links,
//! the caches of verifier runs) and its limits; `lib.rs` re-exports the
//! public names and serves it through `handlers`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use tally_schemas::{AgentName, Seq};
use tally_verifier::Verification;

use crate::auth;
use crate::session_store::{self, SessionStoreError};
use crate::throttle;

use crate::data::{self, AgentSummary, ChainView, HourCounts, TimeRange};
use crate::store::{LinkStore, LinkStoreError};
use tally_witness::error::WitnessError;
use tally_witness::export::ExportRange;
use tally_witness::witness::Witness;

pub use crate::store::CONSOLE_DB;

/// Largest pack the verify page accepts, in bytes (64 MiB); larger packs
/// are for `tally verify`.
pub const MAX_VERIFY_PACK_BYTES: usize = 64 << 20;
/// Largest body of every console route but the verify uploads (the login,
/// logout and link forms are a few hundred bytes); a larger one is refused
/// with 413 unread (docs/console.md "Access").
pub const MAX_FORM_BYTES: usize = 16 << 10;

/// The Content-Security-Policy of every console response.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
    connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Verifications kept for agent pages, keyed by agent and range.
const MAX_CACHED_REPORTS: usize = 256;
/// Verifications the console runs at once (each on
/// [`data::VERIFY_THREADS`] threads); other pages show the last report or
/// wait for one.
const MAX_RUNNING_VERIFICATIONS: usize = 1;
/// How long a page with no report yet waits for one being computed.
const REPORT_WAIT: Duration = Duration::from_secs(10);
/// Default [`ConsoleLimits::operator_uploads`].
pub const OPERATOR_UPLOADS: usize = 2;
/// Default [`ConsoleLimits::auditor_uploads`].
pub const AUDITOR_UPLOADS: usize = 1;
/// Default [`ConsoleLimits::upload_idle`]: 20 seconds.
pub const UPLOAD_IDLE: Duration = Duration::from_secs(20);
/// Default [`ConsoleLimits::upload_deadline`]: 5 minutes.
pub const UPLOAD_DEADLINE: Duration = Duration::from_secs(300);
/// Chain views kept for agent pages (each holds at most 1.25 ×
/// [`data::MAX_SCAN_RECORDS`] records' rows).
const MAX_CACHED_VIEWS: usize = 8;

/// Default login throttle per client address: 10 attempts back to back,
/// then one every 6 seconds.
pub const LOGIN_PER_ADDRESS: throttle::Rate = throttle::Rate {
    burst: 10,
    per_minute: 10.0,
};
/// Default login throttle over all addresses: 100 attempts back to back,
/// then 20 a second.
pub const LOGIN_GLOBAL: throttle::Rate = throttle::Rate {
    burst: 100,
    per_minute: 1_200.0,
};

/// The console's limits. `tally serve` uses the defaults; tests lower them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConsoleLimits {
    /// Sessions per project and in all ([`auth::SessionLimits`]).
    pub sessions: auth::SessionLimits,
    /// Login attempts per client address ([`LOGIN_PER_ADDRESS`]).
    pub login_per_address: throttle::Rate,
    /// Login attempts over all addresses ([`LOGIN_GLOBAL`]).
    pub login_global: throttle::Rate,
    /// Uploads the operators' verify page checks at once (each on
    /// `VERIFY_THREADS` (module `data`) threads); more get 503 and a pointer to
    /// `tally verify`.
    pub operator_uploads: usize,
    /// The same for all auditor links together: slots of their own, so
    /// link holders can never take the operators'.
    pub auditor_uploads: usize,
    /// An upload that sends nothing for this long is cut off (408).
    pub upload_idle: Duration,
    /// An upload and its verification that take longer are cut off (408).
    pub upload_deadline: Duration,
}

impl Default for ConsoleLimits {
    fn default() -> Self {
        Self {
            sessions: auth::SessionLimits::default(),
            login_per_address: LOGIN_PER_ADDRESS,
            login_global: LOGIN_GLOBAL,
            operator_uploads: OPERATOR_UPLOADS,
            auditor_uploads: AUDITOR_UPLOADS,
            upload_idle: UPLOAD_IDLE,
            upload_deadline: UPLOAD_DEADLINE,
        }
    }
}

type ViewKey = (AgentName, TimeRange);

/// The verifier's report for an agent page.
#[derive(Debug, Clone)]
pub(crate) enum Report {
    /// Over the agent's records in range, through the head shown.
    Current(Arc<Verification>),
    /// Over its records through seq `as_of`; a newer one is being computed.
    Older {
        /// The report.
        report: Arc<Verification>,
        /// The last seq it covers.
        as_of: u64,
    },
    /// None yet: another verification is running; reload shortly.
    Busy,
    /// The last verification failed (the witness's log has why).
    Failed,
}

#[derive(Default)]
struct ReportSlot {
    /// The newest report and the last seq it covers.
    done: Option<(u64, Arc<Verification>)>,
    /// Whether a verification for this slot is running.
    running: bool,
    /// Whether the last one failed.
    failed: bool,
    /// Last use, for eviction.
    used: u64,
}

/// Chain views with their last use, for eviction.
#[derive(Default)]
struct Views {
    tick: u64,
    map: HashMap<ViewKey, (u64, Arc<Mutex<ChainView>>)>,
}

#[derive(Default)]
struct Reports {
    slots: HashMap<ViewKey, ReportSlot>,
    running: usize,
    tick: u64,
}

/// Why the console could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The auditor-link store.
    #[error(transparent)]
    Links(#[from] LinkStoreError),
    /// The session store (PostgreSQL).
    #[error(transparent)]
    Sessions(#[from] SessionStoreError),
}

/// The console's state: the witness it shows, auditor links, sessions, and
/// what agent pages keep between requests.
pub struct Console {
    pub(crate) witness: Arc<Witness>,
    pub(crate) links: Arc<LinkStore>,
    pub(crate) sessions: auth::Sessions,
    pub(crate) login_throttle: throttle::LoginThrottle,
    pub(crate) login_key: auth::LoginKey,
    pub(crate) secure_cookies: bool,
    reports: Mutex<Reports>,
    report_done: Condvar,
    views: Mutex<Views>,
    pub(crate) hours: Mutex<HourCounts>,
    pub(crate) limits: ConsoleLimits,
    pub(crate) operator_uploads: Arc<tokio::sync::Semaphore>,
    pub(crate) auditor_uploads: Arc<tokio::sync::Semaphore>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("secure_cookies", &self.secure_cookies)
            .finish_non_exhaustive()
    }
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Before `key` goes into a `map` of at most `cap` entries: drops the
/// entry with the oldest `last_use` (`None`: not to be dropped).
fn make_room<K: Clone + Eq + std::hash::Hash, V>(
    map: &mut HashMap<K, V>,
    key: &K,
    cap: usize,
    last_use: impl Fn(&V) -> Option<u64>,
) {
    if map.len() < cap || map.contains_key(key) {
        return;
    }
    if let Some(old) = map
        .iter()
        .filter_map(|(k, v)| last_use(v).map(|u| (u, k)))
        .min_by_key(|(u, _)| *u)
        .map(|(_, k)| k.clone())
    {
        map.remove(&old);
    }
}

impl Console {
    /// The console over `witness`, with its auditor links in
    /// `data_dir/console.redb`. `secure_cookies` adds `Secure` to the session
    /// cookie; set it when the witness serves TLS or sits behind a TLS proxy.
    ///
    /// # Errors
    /// [`LinkStoreError`] when the link store cannot be opened.
    pub fn open(
        witness: Arc<Witness>,
        data_dir: &Path,
        secure_cookies: bool,
    ) -> Result<Arc<Self>, LinkStoreError> {
        Self::open_with_limits(witness, data_dir, secure_cookies, ConsoleLimits::default())
    }

    /// [`Self::open`] with other limits than the defaults.
    ///
    /// # Errors
    /// [`LinkStoreError`] when the link store cannot be opened.
    pub fn open_with_limits(
        witness: Arc<Witness>,
        data_dir: &Path,
        secure_cookies: bool,
        limits: ConsoleLimits,
    ) -> Result<Arc<Self>, LinkStoreError> {
        let links = LinkStore::open(&data_dir.join(CONSOLE_DB))?;
        Ok(Self::with_links(witness, links, secure_cookies, limits))
    }

    /// The console over `witness` with its auditor links and sessions where
    /// `store` says: `data_dir/console.redb` and this process's memory, or
    /// the PostgreSQL database that also holds the log and the registry,
    /// shared by every front (docs/operations.md "Running on PostgreSQL").
    ///
    /// # Errors
    /// [`OpenError`] when the link store or the session store cannot be
    /// opened.
    pub fn open_on(
        witness: Arc<Witness>,
        data_dir: &Path,
        store: &tally_witness::config::StoreChoice,
        secure_cookies: bool,
    ) -> Result<Arc<Self>, OpenError> {
        let limits = ConsoleLimits::default();
        let links = LinkStore::open_for(data_dir, store)?;
        let sessions = match store {
            tally_witness::config::StoreChoice::Redb => auth::Sessions::new(limits.sessions),
            tally_witness::config::StoreChoice::Postgres(url) => auth::Sessions::on(
                Box::new(session_store::PostgresSessions::open(url)?),
                limits.sessions,
            ),
        };
        Ok(Self::with_stores(
            witness,
            links,
            sessions,
            secure_cookies,
            limits,
        ))
    }

    fn with_links(
        witness: Arc<Witness>,
        links: Arc<LinkStore>,
        secure_cookies: bool,
        limits: ConsoleLimits,
    ) -> Arc<Self> {
        let sessions = auth::Sessions::new(limits.sessions);
        Self::with_stores(witness, links, sessions, secure_cookies, limits)
    }

    fn with_stores(
        witness: Arc<Witness>,
        links: Arc<LinkStore>,
        sessions: auth::Sessions,
        secure_cookies: bool,
        limits: ConsoleLimits,
    ) -> Arc<Self> {
        let login_key = auth::LoginKey::new(&witness);
        Arc::new(Self {
            witness,
            links,
            sessions,
            login_key,
            login_throttle: throttle::LoginThrottle::new(
                limits.login_per_address,
                limits.login_global,
            ),
            secure_cookies,
            reports: Mutex::new(Reports::default()),
            report_done: Condvar::new(),
            views: Mutex::new(Views::default()),
            hours: Mutex::new(HourCounts::default()),
            limits,
            operator_uploads: Arc::new(tokio::sync::Semaphore::new(limits.operator_uploads)),
            auditor_uploads: Arc::new(tokio::sync::Semaphore::new(limits.auditor_uploads)),
        })
    }

    /// The witness.
    #[must_use]
    pub fn witness(&self) -> &Arc<Witness> {
        &self.witness
    }

    /// The auditor links.
    #[must_use]
    pub fn links(&self) -> &LinkStore {
        &self.links
    }

    /// Runs `f` over the chain view of `summary` (an agent within `range`),
    /// reading only the records appended since the view was last shown.
    /// Requests for the same agent and range take turns.
    ///
    /// # Errors
    /// Storage failures.
    pub(crate) fn with_chain_view<R>(
        &self,
        summary: &AgentSummary,
        range: TimeRange,
        f: impl FnOnce(&ChainView) -> R,
    ) -> Result<R, WitnessError> {
        let view = {
            let mut guard = locked(&self.views);
            let Views { tick, map } = &mut *guard;
            *tick += 1;
            let now = *tick;
            let key = (summary.agent.clone(), range);
            make_room(map, &key, MAX_CACHED_VIEWS, |(used, _)| Some(*used));
            let slot = map.entry(key).or_default();
            slot.0 = now;
            Arc::clone(&slot.1)
        };
        let mut view = locked(&view);
        if !view.fits(summary) {
            let (first, not_scanned) = ChainView::start_of(summary);
            *view = ChainView::starting_at(first, not_scanned);
        }
        if let Some(h) = &summary.head {
            view.extend(&self.witness, &summary.agent, h.seq.get())?;
        }
        Ok(f(&view))
    }

    /// The verifier's report over `summary`'s records (an agent within
    /// `range`, which must have a record in range), exported as a pack of
    /// seqs `first_seq..=head`. A report is computed once per head, on a
    /// thread of its own, at most [`MAX_RUNNING_VERIFICATIONS`] at once:
    /// while it runs, pages get the previous report, or wait up to
    /// [`REPORT_WAIT`] for the first and then [`Report::Busy`].
    ///
    /// # Errors
    /// Storage failures, or a verifier that refuses the export (a bug).
    pub(crate) fn report(
        self: &Arc<Self>,
        summary: &AgentSummary,
        range: TimeRange,
    ) -> Result<Report, WitnessError> {
        let Some(head) = summary.head.as_ref() else {
            return Err(WitnessError::internal(&"no record in range to verify"));
        };
        let last = head.seq.get();
        let key = (summary.agent.clone(), range);
        let mut reports = locked(&self.reports);
        reports.tick += 1;
        let tick = reports.tick;
        make_room(&mut reports.slots, &key, MAX_CACHED_REPORTS, |s| {
            (!s.running).then_some(s.used)
        });
        let mut waited = false;
        loop {
            let can_start = reports.running < MAX_RUNNING_VERIFICATIONS;
            let slot = reports.slots.entry(key.clone()).or_default();
            slot.used = tick;
            let start = !slot.running && can_start;
            match slot.done.clone() {
                Some((seq, v)) if seq >= last => return Ok(Report::Current(v)),
                Some((as_of, report)) => {
                    if start {
                        self.start_report(reports, summary, range);
                    }
                    return Ok(Report::Older { report, as_of });
                }
                None if waited && slot.failed && !slot.running => return Ok(Report::Failed),
                None if waited => return Ok(Report::Busy),
                None if start => {
                    self.start_report(reports, summary, range);
                    reports = locked(&self.reports);
                }
                None => {}
            }
            // Nothing to show yet and verifications are running: wait for
            // this one, or for a turn to run it.
            reports = self
                .report_done
                .wait_timeout_while(reports, REPORT_WAIT, |r| {
                    r.slots.get(&key).is_some_and(|s| {
                        s.done.is_none() && (s.running || r.running >= MAX_RUNNING_VERIFICATIONS)
                    })
                })
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
            waited = true;
        }
    }

    /// Marks `summary`'s slot running and runs [`Self::compute_report`] on
    /// a thread of its own.
    fn start_report(
        self: &Arc<Self>,
        mut reports: MutexGuard<'_, Reports>,
        summary: &AgentSummary,
        range: TimeRange,
    ) {
        reports.running += 1;
        reports
            .slots
            .entry((summary.agent.clone(), range))
            .or_default()
            .running = true;
        drop(reports);
        let this = Arc::clone(self);
        let job = summary.clone();
        let spawned = std::thread::Builder::new()
            .name("console-verify".into())
            .spawn(move || {
                if let Err(e) = this.compute_report(&job, range) {
                    tracing::error!(error = %e, "console verification failed");
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "could not start a console verification");
            self.finish_report(summary, range, None);
        }
    }

    /// Verifies `summary`'s records and stores the report in its slot,
    /// which the caller marked running.
    fn compute_report(
        &self,
        summary: &AgentSummary,
        range: TimeRange,
    ) -> Result<Arc<Verification>, WitnessError> {
        let result = summary
            .head
            .as_ref()
            .ok_or_else(|| WitnessError::internal(&"no record in range to verify"))
            .and_then(|head| {
                let from = Seq::new(summary.first_seq).map_err(|e| WitnessError::internal(&e))?;
                let v = data::verify_export(
                    &self.witness,
                    &self.project_of(&summary.agent),
                    std::slice::from_ref(&summary.agent),
                    ExportRange::Seq {
                        from: Some(from),
                        to: Some(head.seq),
                    },
                )?;
                Ok((head.seq.get(), Arc::new(v)))
            });
        let done = result.as_ref().ok().cloned();
        self.finish_report(summary, range, done);
        result.map(|(_, v)| v)
    }

    /// Marks the slot of `summary` not running, and keeps `done` if it is
    /// newer than its report.
    fn finish_report(
        &self,
        summary: &AgentSummary,
        range: TimeRange,
        done: Option<(u64, Arc<Verification>)>,
    ) {
        let mut reports = locked(&self.reports);
        reports.running = reports.running.saturating_sub(1);
        let slot = reports
            .slots
            .entry((summary.agent.clone(), range))
            .or_default();
        slot.running = false;
        slot.failed = done.is_none();
        if let Some((seq, v)) = done {
            if slot.done.as_ref().is_none_or(|(s, _)| *s < seq) {
                slot.done = Some((seq, v));
            }
        }
        drop(reports);
        self.report_done.notify_all();
    }

    /// Records of `agents` per hour over the last day, and whether the
    /// oldest hours are partial ([`HourCounts`]).
    ///
    /// # Errors
    /// Storage failures.
    pub(crate) fn records_per_hour(
        &self,
        agents: &std::collections::HashSet<AgentName>,
    ) -> Result<(Vec<u64>, bool), WitnessError> {
        let now = self.witness.now();
        let mut hours = locked(&self.hours);
        hours.update(&self.witness, now)?;
        Ok(hours.per_hour(agents, now))
    }

    /// The project an agent is registered in.
    fn project_of(&self, agent: &AgentName) -> String {
        self.witness
            .registry()
            .agent(agent)
            .map(|r| r.project)
            .unwrap_or_default()
    }
}
