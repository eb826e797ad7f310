//! The state behind the connection policy: the open-connection cap with its
//! queues ([`Tracker`]) and each connection's requests in flight and
//! deadline ([`ConnState`]), with the watchdog that closes a connection
//! when they say so (docs/operations.md "Connections").

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{sleep_until, Instant};

use crate::config::ConnLimits;

/// How often at most the server logs about the connection cap or about
/// failed accepts (with the counts since the last line).
pub(crate) const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Why the server closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The request head did not arrive within the header timeout.
    HeaderTimeout,
    /// No request within the idle timeout.
    IdleTimeout,
    /// Writes made no progress within the write timeout.
    WriteTimeout,
    /// The TLS handshake did not finish within its timeout.
    TlsHandshakeTimeout,
    /// Closed to make room for a new connection at the cap.
    Evicted,
    /// Unauthenticated, closed because its client address opened more than
    /// `max_connections_per_client` unauthenticated connections.
    ClientLimit,
}

impl CloseReason {
    const ALL: [Self; 6] = [
        Self::HeaderTimeout,
        Self::IdleTimeout,
        Self::WriteTimeout,
        Self::TlsHandshakeTimeout,
        Self::Evicted,
        Self::ClientLimit,
    ];

    /// The metric label.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::HeaderTimeout => "header_timeout",
            Self::IdleTimeout => "idle_timeout",
            Self::WriteTimeout => "write_timeout",
            Self::TlsHandshakeTimeout => "tls_handshake_timeout",
            Self::Evicted => "evicted",
            Self::ClientLimit => "client_limit",
        }
    }
}

/// Counters of the connection layer, rendered into `/metrics`.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    open: AtomicU64,
    accepted: AtomicU64,
    closed: [AtomicU64; 6],
    pub(super) body_timeouts: AtomicU64,
    accept_errors: AtomicU64,
    cap_waits: AtomicU64,
}

impl ConnectionStats {
    fn closed_by(&self, reason: CloseReason) {
        let i = CloseReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.closed[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Connections open now.
    #[must_use]
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    /// Appends the Prometheus text of these counters to `out`.
    pub fn render(&self, out: &mut String) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP tally_connections_open Connections open now.\n# TYPE tally_connections_open gauge\ntally_connections_open {}",
            load(&self.open)
        );
        let _ = writeln!(
            out,
            "# HELP tally_connections_accepted_total Connections accepted since start.\n# TYPE tally_connections_accepted_total counter\ntally_connections_accepted_total {}",
            load(&self.accepted)
        );
        out.push_str("# HELP tally_connections_closed_total Connections the server closed, by reason (timeouts, room at the cap).\n# TYPE tally_connections_closed_total counter\n");
        for (reason, n) in CloseReason::ALL.iter().zip(&self.closed) {
            let _ = writeln!(
                out,
                "tally_connections_closed_total{{reason=\"{}\"}} {}",
                reason.label(),
                load(n)
            );
        }
        let _ = writeln!(
            out,
            "# HELP tally_request_body_timeouts_total Request bodies cut off by their deadline (408).\n# TYPE tally_request_body_timeouts_total counter\ntally_request_body_timeouts_total {}",
            load(&self.body_timeouts)
        );
        let _ = writeln!(
            out,
            "# HELP tally_accept_errors_total Failed accepts (e.g. the open-file limit).\n# TYPE tally_accept_errors_total counter\ntally_accept_errors_total {}",
            load(&self.accept_errors)
        );
        let _ = writeln!(
            out,
            "# HELP tally_connection_cap_waits_total Times accepting waited at the connection cap because every connection had a request in flight.\n# TYPE tally_connection_cap_waits_total counter\ntally_connection_cap_waits_total {}",
            load(&self.cap_waits)
        );
    }
}

/// Events counted between two log lines.
#[derive(Debug)]
struct LogWindow {
    last: Option<Instant>,
    evicted: u64,
    waited: u64,
    client_limited: u64,
    accept_errors: u64,
    last_accept_error: String,
}

/// The open-connection cap, and the queue of connections waiting for a
/// request, oldest first (the ones to close for room).
#[derive(Debug)]
pub(crate) struct Tracker {
    pub(super) limits: ConnLimits,
    slots: Arc<Semaphore>,
    waiting: Mutex<VecDeque<(Weak<ConnState>, u64)>>,
    untrusted: Mutex<Untrusted>,
    pub(super) stats: Arc<ConnectionStats>,
    log: Mutex<LogWindow>,
}

/// The connections on which no request has shown a valid credential yet,
/// oldest first, in all and per client address. Entries of connections
/// since authenticated or closed are skipped when met, and swept out when
/// the queues outgrow the open connections.
#[derive(Debug, Default)]
struct Untrusted {
    order: VecDeque<Weak<ConnState>>,
    by_client: HashMap<IpAddr, VecDeque<Weak<ConnState>>>,
}

fn is_untrusted(c: &Weak<ConnState>) -> bool {
    c.upgrade()
        .is_some_and(|c| !c.trusted.load(Ordering::Relaxed) && !c.lock().evicted)
}

/// The address a per-client limit counts under: an IPv4 address as is
/// (also when mapped into IPv6), an IPv6 address cut to its /64 (one host
/// usually holds a whole /64).
#[must_use]
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

impl Tracker {
    /// A tracker for `limits`, counting into `stats`.
    #[must_use]
    pub(crate) fn new(limits: ConnLimits, stats: Arc<ConnectionStats>) -> Arc<Self> {
        Arc::new(Self {
            slots: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            limits,
            waiting: Mutex::new(VecDeque::new()),
            untrusted: Mutex::new(Untrusted::default()),
            stats,
            log: Mutex::new(LogWindow {
                last: None,
                evicted: 0,
                waited: 0,
                client_limited: 0,
                accept_errors: 0,
                last_accept_error: String::new(),
            }),
        })
    }

    /// A slot for one more connection. At the cap, first closes the
    /// connection that has waited longest for a request, or else the oldest
    /// unauthenticated one, then waits for a slot to free up.
    pub(super) async fn slot(&self) -> OwnedSemaphorePermit {
        if let Ok(p) = Arc::clone(&self.slots).try_acquire_owned() {
            return p;
        }
        let evicted = self.evict_one() || self.evict_untrusted();
        if !evicted {
            self.stats.cap_waits.fetch_add(1, Ordering::Relaxed);
        }
        self.note(|w| {
            if evicted {
                w.evicted += 1;
            } else {
                w.waited += 1;
            }
        });
        match Arc::clone(&self.slots).acquire_owned().await {
            Ok(p) => p,
            // The semaphore is never closed.
            Err(_) => unreachable_slot(),
        }
    }

    /// Counts a failed accept for the rate-limited log line.
    pub(super) fn accept_failed(&self, e: &io::Error) {
        self.stats.accept_errors.fetch_add(1, Ordering::Relaxed);
        self.note(|w| {
            w.accept_errors += 1;
            w.last_accept_error = e.to_string();
        });
    }

    /// Records an event and writes the log line if the last one is at least
    /// [`LOG_INTERVAL`] old.
    fn note(&self, event: impl FnOnce(&mut LogWindow)) {
        let mut w = self
            .log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        event(&mut w);
        let now = Instant::now();
        if w.last.is_some_and(|t| now < t + LOG_INTERVAL) {
            return;
        }
        w.last = Some(now);
        if w.evicted + w.waited > 0 {
            tracing::warn!(
                max_connections = self.limits.max_connections,
                closed_for_room = w.evicted,
                waited_for_a_slot = w.waited,
                "connection cap reached: closed connections that were waiting for a request to make room (counts since the last such line; at most one line per {}s)",
                LOG_INTERVAL.as_secs()
            );
        }
        if w.client_limited > 0 {
            tracing::warn!(
                max_connections_per_client = self.limits.max_connections_per_client,
                closed = w.client_limited,
                "a client address opened more unauthenticated connections than allowed: closed its oldest (counts since the last such line; at most one line per {}s)",
                LOG_INTERVAL.as_secs()
            );
        }
        if w.accept_errors > 0 {
            tracing::warn!(
                failures = w.accept_errors,
                last_error = %w.last_accept_error,
                "accept failed; backing off (counts since the last such line; at most one line per {}s)",
                LOG_INTERVAL.as_secs()
            );
        }
        w.evicted = 0;
        w.waited = 0;
        w.client_limited = 0;
        w.accept_errors = 0;
    }

    /// Closes the connection that has waited longest for a request.
    /// Returns whether there was one.
    fn evict_one(&self) -> bool {
        let mut q = self
            .waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while let Some((conn, epoch)) = q.pop_front() {
            if conn.upgrade().is_some_and(|c| c.evict(epoch)) {
                return true;
            }
        }
        false
    }

    /// Closes the oldest connection that has not authenticated, requests
    /// in flight or not. Returns whether there was one.
    fn evict_untrusted(&self) -> bool {
        let mut u = self
            .untrusted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while let Some(conn) = u.order.pop_front() {
            if conn
                .upgrade()
                .is_some_and(|c| c.evict_untrusted(CloseReason::Evicted))
            {
                return true;
            }
        }
        false
    }

    /// Notes a new unauthenticated connection of `client`; when its client
    /// already holds `max_connections_per_client` of them, closes the
    /// oldest.
    fn untrusted_from(&self, conn: &Arc<ConnState>, client: IpAddr) {
        let max = self.limits.max_connections_per_client.max(1);
        let open = usize::try_from(self.stats.open()).unwrap_or(usize::MAX);
        let mut u = self
            .untrusted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if u.order.len() > 2 * open + 64 {
            u.order.retain(is_untrusted);
        }
        if u.by_client.len() > 2 * open + 64 {
            u.by_client.retain(|_, q| {
                q.retain(is_untrusted);
                !q.is_empty()
            });
        }
        u.order.push_back(Arc::downgrade(conn));
        let mine = u.by_client.entry(client).or_default();
        mine.retain(is_untrusted);
        let mut closed = 0;
        while mine.len() >= max {
            let Some(oldest) = mine.pop_front() else {
                break;
            };
            if oldest
                .upgrade()
                .is_some_and(|c| c.evict_untrusted(CloseReason::ClientLimit))
            {
                closed += 1;
            }
        }
        mine.push_back(Arc::downgrade(conn));
        drop(u);
        if closed > 0 {
            self.note(|w| w.client_limited += closed);
        }
    }

    /// Queues a connection that now waits for a request.
    fn waiting(&self, conn: &Arc<ConnState>, epoch: u64) {
        let mut q = self
            .waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Entries of connections that went busy or closed are skipped when
        // popped; keep the queue from growing with them on a busy server.
        let open = usize::try_from(self.stats.open()).unwrap_or(usize::MAX);
        if q.len() > 2 * open + 64 {
            q.retain(|(c, e)| c.upgrade().is_some_and(|c| c.is_waiting(*e)));
        }
        q.push_back((Arc::downgrade(conn), epoch));
    }

    /// Registers a connection accepted now from `peer`, holding `slot`.
    #[must_use]
    pub(super) fn register(
        self: &Arc<Self>,
        slot: OwnedSemaphorePermit,
        peer: IpAddr,
    ) -> Arc<ConnState> {
        self.stats.accepted.fetch_add(1, Ordering::Relaxed);
        self.stats.open.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(ConnState {
            tracker: Arc::clone(self),
            phase: Mutex::new(Phase {
                in_flight: 0,
                deadline: Some(Instant::now() + self.limits.header_timeout),
                epoch: 0,
                first: true,
                saw_byte: false,
                evicted: false,
                close_now: None,
                shutting_down: false,
            }),
            notify: Notify::new(),
            watch_first_byte: AtomicBool::new(false),
            write_timed_out: AtomicBool::new(false),
            trusted: AtomicBool::new(false),
            started: Instant::now(),
            responses: Mutex::new(Vec::new()),
            slot: Mutex::new(Some(Slot {
                _permit: slot,
                stats: Arc::clone(&self.stats),
            })),
        });
        self.waiting(&conn, 0);
        self.untrusted_from(&conn, client_key(peer));
        conn
    }
}

#[cold]
fn unreachable_slot() -> OwnedSemaphorePermit {
    // Only reachable if the semaphore were closed, which nothing does.
    panic!("the connection semaphore was closed")
}

#[derive(Debug)]
struct Phase {
    /// Requests whose response has not been sent in full.
    in_flight: usize,
    /// When the connection is closed if no request starts; `None` while a
    /// request is in flight.
    deadline: Option<Instant>,
    /// Counts changes of state, so a queued eviction of an earlier wait
    /// does not close a connection that has since served a request.
    epoch: u64,
    /// Still waiting for the first request.
    first: bool,
    /// A byte arrived while waiting (the next head has begun).
    saw_byte: bool,
    evicted: bool,
    /// Closed at once, requests in flight or not (an unauthenticated
    /// connection closed for room), for this reason.
    close_now: Option<CloseReason>,
    shutting_down: bool,
}

/// One connection's requests in flight and deadline.
#[derive(Debug)]
pub(crate) struct ConnState {
    pub(super) tracker: Arc<Tracker>,
    phase: Mutex<Phase>,
    notify: Notify,
    /// Set while waiting after a request, until the next byte arrives.
    watch_first_byte: AtomicBool,
    pub(super) write_timed_out: AtomicBool,
    /// A request on this connection showed a valid credential.
    trusted: AtomicBool,
    /// When the connection was accepted (the base of `ResponseProgress`).
    started: Instant,
    /// The response bodies of the requests in flight.
    responses: Mutex<Vec<Weak<ResponseProgress>>>,
    /// The connection's place under the cap, given back when the watchdog
    /// ends (the socket is closed then), not when the last request of the
    /// connection ends: an HTTP/2 request of a connection closed for room
    /// may run on until its body deadline, and must not hold the slot.
    slot: Mutex<Option<Slot>>,
}

/// A place under the connection cap, counted in `tally_connections_open`.
#[derive(Debug)]
struct Slot {
    _permit: OwnedSemaphorePermit,
    stats: Arc<ConnectionStats>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ConnState {
    /// Gives the connection's slot back (the connection is closed).
    fn release_slot(&self) {
        let slot = self
            .slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        drop(slot);
    }
}

impl ConnState {
    fn lock(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A request started; the guard ends it when dropped.
    #[must_use]
    pub(crate) fn begin(self: &Arc<Self>) -> RequestGuard {
        self.watch_first_byte.store(false, Ordering::Relaxed);
        let mut p = self.lock();
        p.in_flight += 1;
        p.deadline = None;
        p.epoch += 1;
        RequestGuard(Arc::clone(self))
    }

    fn end(self: &Arc<Self>) {
        let epoch = {
            let mut p = self.lock();
            p.in_flight = p.in_flight.saturating_sub(1);
            if p.in_flight > 0 {
                return;
            }
            p.deadline = Some(Instant::now() + self.tracker.limits.idle_timeout);
            p.first = false;
            p.saw_byte = false;
            p.epoch += 1;
            p.epoch
        };
        self.watch_first_byte.store(true, Ordering::Relaxed);
        self.tracker.waiting(self, epoch);
        self.notify.notify_one();
    }

    /// Bytes arrived: if the connection was waiting idle, the next request's
    /// head has begun and must be complete within the header timeout.
    pub(super) fn bytes_read(&self) {
        if !self.watch_first_byte.swap(false, Ordering::Relaxed) {
            return;
        }
        let mut p = self.lock();
        if p.in_flight == 0 && !p.saw_byte {
            p.saw_byte = true;
            let by = Instant::now() + self.tracker.limits.header_timeout;
            p.deadline = Some(p.deadline.map_or(by, |d| d.min(by)));
            drop(p);
            self.notify.notify_one();
        }
    }

    pub(super) fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Starts following an HTTP/2 response body.
    pub(super) fn track_response(&self) -> Arc<ResponseProgress> {
        let progress = Arc::new(ResponseProgress {
            last_ms: AtomicU64::new(self.elapsed_ms()),
            waiting_on_body: AtomicBool::new(false),
        });
        let mut r = self
            .responses
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        r.retain(|w| w.strong_count() > 0);
        r.push(Arc::downgrade(&progress));
        drop(r);
        // The watchdog of a busy connection recomputes its deadline.
        self.notify.notify_one();
        progress
    }

    /// When the HTTP/2 response that has waited longest for the client to
    /// take what it was given has waited the write timeout. A response is
    /// followed until hyper drops its body, after its last frame is sent;
    /// one whose body waits for its own data does not count.
    fn response_deadline(&self) -> Option<Instant> {
        let r = self
            .responses
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        r.iter()
            .filter_map(Weak::upgrade)
            .filter(|p| !p.waiting_on_body.load(Ordering::Relaxed))
            .map(|p| p.last_ms.load(Ordering::Relaxed))
            .min()
            .map(|ms| self.started + Duration::from_millis(ms) + self.tracker.limits.write_timeout)
    }

    fn evict(&self, epoch: u64) -> bool {
        let mut p = self.lock();
        if p.in_flight > 0 || p.epoch != epoch || p.evicted {
            return false;
        }
        p.evicted = true;
        drop(p);
        self.notify.notify_one();
        true
    }

    /// Closes this connection now, requests in flight or not, unless a
    /// request on it has authenticated. Returns whether it will close.
    fn evict_untrusted(&self, reason: CloseReason) -> bool {
        if self.trusted.load(Ordering::Relaxed) {
            return false;
        }
        let mut p = self.lock();
        if p.evicted {
            return false;
        }
        p.evicted = true;
        p.close_now = Some(reason);
        drop(p);
        self.notify.notify_one();
        true
    }

    fn is_waiting(&self, epoch: u64) -> bool {
        let p = self.lock();
        p.in_flight == 0 && p.epoch == epoch && !p.evicted
    }

    fn shut_down(&self) {
        self.lock().shutting_down = true;
        self.notify.notify_one();
    }

    /// What the watchdog should do now: `Err(reason)` to close (reason
    /// `None` for a close at shutdown), else the deadline to wake at.
    fn check(&self, now: Instant) -> Result<Option<Instant>, Option<CloseReason>> {
        let p = self.lock();
        if let Some(reason) = p.close_now {
            return Err(Some(reason));
        }
        // Closed for room while it waited, and a request has begun since:
        // a key holder's request is let finish, an unauthenticated one
        // is not (it could hold the slot accepting waits for until its
        // body deadline).
        if p.evicted && !self.trusted.load(Ordering::Relaxed) {
            return Err(Some(CloseReason::Evicted));
        }
        if p.in_flight > 0 {
            drop(p);
            return match self.response_deadline() {
                Some(d) if now >= d => Err(Some(CloseReason::WriteTimeout)),
                other => Ok(other),
            };
        }
        if p.evicted {
            return Err(Some(CloseReason::Evicted));
        }
        if p.shutting_down {
            return Err(None);
        }
        match p.deadline {
            Some(d) if now >= d => Err(Some(if p.first || p.saw_byte {
                CloseReason::HeaderTimeout
            } else {
                CloseReason::IdleTimeout
            })),
            other => Ok(other),
        }
    }
}

/// A request's handle on its connection, in the request's extensions:
/// a route that finds a valid credential in the request's headers (an API
/// key, the admin token, a read token, a console session) marks the
/// connection as a key holder's, which is then never closed for room nor
/// counted against its client address's limit of unauthenticated
/// connections (docs/operations.md "Connections").
#[derive(Debug, Clone)]
pub struct ConnTrust(pub(super) Weak<ConnState>);

impl ConnTrust {
    /// Marks the connection as authenticated.
    pub fn authenticated(&self) {
        if let Some(c) = self.0.upgrade() {
            c.trusted.store(true, Ordering::Relaxed);
        }
    }

    /// Whether a request on the connection has authenticated.
    #[must_use]
    pub fn is_authenticated(&self) -> bool {
        self.0
            .upgrade()
            .is_some_and(|c| c.trusted.load(Ordering::Relaxed))
    }
}

/// Ends a request when dropped (its response sent, or abandoned).
#[derive(Debug)]
pub(crate) struct RequestGuard(Arc<ConnState>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// Drives `connection` (the TLS handshake and HTTP serving of one accepted
/// socket) until it ends, or closes it (drops it) when its deadline passes
/// with no request in flight, when it is evicted for room, or at shutdown
/// while no request is in flight. A connection with requests in flight is
/// left to finish them (hyper's graceful shutdown closes it after).
pub(super) async fn watch_connection<F: Future>(
    state: Arc<ConnState>,
    connection: F,
    shutdown: watch::Receiver<bool>,
) {
    watch_until_closed(&state, connection, shutdown).await;
    // The connection (socket and HTTP state) was dropped with the future.
    state.release_slot();
}

/// [`watch_connection`] up to the close.
async fn watch_until_closed<F: Future>(
    state: &Arc<ConnState>,
    connection: F,
    mut shutdown: watch::Receiver<bool>,
) {
    tokio::pin!(connection);
    let mut shutdown_seen = *shutdown.borrow();
    if shutdown_seen {
        state.shut_down();
    }
    loop {
        let wake = match state.check(Instant::now()) {
            Ok(wake) => wake,
            Err(reason) => {
                if let Some(r) = reason {
                    state.tracker.stats.closed_by(r);
                }
                return;
            }
        };
        let notified = state.notify.notified();
        tokio::select! {
            _ = &mut connection => {
                if state.write_timed_out.load(Ordering::Relaxed) {
                    state.tracker.stats.closed_by(CloseReason::WriteTimeout);
                }
                return;
            }
            () = notified => {}
            () = sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {}
            changed = shutdown.changed(), if !shutdown_seen => {
                shutdown_seen = true;
                if changed.is_err() || *shutdown.borrow() {
                    state.shut_down();
                }
            }
        }
    }
}

/// Counts a TLS handshake that timed out.
pub(super) fn tls_handshake_timed_out(state: &ConnState) {
    state
        .tracker
        .stats
        .closed_by(CloseReason::TlsHandshakeTimeout);
}

/// How a response body is being taken by the connection.
#[derive(Debug, Default)]
pub(super) struct ResponseProgress {
    /// When the body was created or last polled, ms after the connection's
    /// start.
    pub(super) last_ms: AtomicU64,
    /// The last poll returned `Pending`: the body waits for its own data
    /// (an export being read), not for the client.
    pub(super) waiting_on_body: AtomicBool,
}
