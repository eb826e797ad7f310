//! The log asks its cosigners (docs/protocol.md §14.5): after the
//! log signs a checkpoint, one background task sends it to every
//! configured cosigner (C2SP tlog-witness `add-checkpoint`, through
//! [`tally_cosigner::client::CosignerClient`]), keeps each cosignature line
//! that verifies with the configured key beside the checkpoint
//! ([`tally_log::LogStore::put_cosignature`]) and publishes the checkpoint
//! with its lines ([`Log::publish`]): that note is what `/checkpoint`,
//! packs and head.json carry.
//!
//! Only the latest checkpoint is ever sent: checkpoints signed while a round
//! is in flight are coalesced into the next round. Each request is bounded
//! by a timeout and a failing cosigner is skipped until its backoff
//! expires, so a cosigner that is down or slow never holds up admission or
//! checkpoint signing (they never wait for this task), and delays the
//! publication of a checkpoint by at most one timeout.
//!
//! With several fronts on PostgreSQL (docs/operations.md, "Cosigners for
//! the log") every front may run this task with the same cosigners, and
//! only the one that sequences ([`Log::watch_sequencing`]) asks them and stores
//! their lines. The others ask nothing: each reads the lines the sequencer
//! stored for the checkpoint it follows and publishes them, so every front
//! serves the same cosigned checkpoint; the one that takes the lease over
//! carries on asking from the sizes those lines showed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tally_cosigner::client::{ClientError, CosignerClient};
use tally_log::{Log, SignedCheckpoint, StoreError};
use tally_schemas::cosignature::CosignatureVerifier;
use tally_schemas::TreeSize;
use tokio::sync::watch;

/// First wait after a failure; it doubles with each consecutive failure.
pub const BACKOFF_FIRST: Duration = Duration::from_secs(1);
/// Longest wait between attempts at a failing cosigner.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How often a front that does not sequence looks for cosignatures of the
/// latest checkpoint that are not stored yet: soon while the sequencer may
/// still be asking (the cosigner timeout), then now and then (a cosigner
/// in backoff may answer later).
const FOLLOW_POLL: Duration = Duration::from_millis(250);
const FOLLOW_POLL_LATE: Duration = Duration::from_secs(1);

/// One configured cosigner (docs/operations.md "Cosigners for the log").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CosignerConfig {
    /// The operator's name for it (metrics labels, the console).
    pub name: String,
    /// Its cosignature/v1 verifier key.
    pub key: CosignatureVerifier,
    /// Its submission prefix: `add-checkpoint` is posted to `<url>/add-checkpoint`.
    pub url: String,
}

impl CosignerConfig {
    /// Parses the `--cosigner` option, `name=N,vkey=K,url=U` (any order).
    ///
    /// # Errors
    /// A message naming what is missing or malformed.
    pub fn parse_option(text: &str) -> Result<Self, String> {
        let (mut name, mut vkey, mut url) = (None, None, None);
        for part in text.split(',') {
            let Some((k, v)) = part.split_once('=') else {
                return Err(format!(
                    "--cosigner takes name=NAME,vkey=VKEY,url=URL; {part:?} is not key=value"
                ));
            };
            let slot = match k.trim() {
                "name" => &mut name,
                "vkey" => &mut vkey,
                "url" => &mut url,
                other => {
                    return Err(format!(
                        "--cosigner takes name, vkey and url, not {other:?}"
                    ))
                }
            };
            if slot.replace(v.trim().to_owned()).is_some() {
                return Err(format!("--cosigner names {} twice", k.trim()));
            }
        }
        let missing =
            |what: &str| format!("--cosigner needs {what}= (name=NAME,vkey=VKEY,url=URL)");
        Self::new(
            &name.ok_or_else(|| missing("name"))?,
            &vkey.ok_or_else(|| missing("vkey"))?,
            &url.ok_or_else(|| missing("url"))?,
        )
    }

    /// Checks one cosigner's settings: a name of 1 to 64 ASCII letters,
    /// digits and `._-/:` (it is a metrics label), a C2SP cosignature/v1 vkey (algorithm 0x04), an
    /// `http://` or `https://` URL.
    ///
    /// # Errors
    /// A message naming the cosigner and the setting.
    pub fn new(name: &str, vkey: &str, url: &str) -> Result<Self, String> {
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-/:".contains(c))
        {
            return Err(format!(
                "cosigner name {name:?} must be 1 to 64 of A-Z a-z 0-9 . _ - / :"
            ));
        }
        let key = CosignatureVerifier::from_vkey(vkey).map_err(|e| {
            format!(
                "cosigner {name}: vkey is not a C2SP cosignature/v1 key (name+hash+base64 of 0x04 and an Ed25519 key): {e}"
            )
        })?;
        let lower = url.to_ascii_lowercase();
        if !(lower.starts_with("http://") || lower.starts_with("https://"))
            || url.len() <= "http://".len()
        {
            return Err(format!(
                "cosigner {name}: url {url:?} must be an http:// or https:// submission prefix"
            ));
        }
        Ok(Self {
            name: name.to_owned(),
            key,
            url: url.trim_end_matches('/').to_owned(),
        })
    }

    /// The key under which its cosignatures are stored: `name+keyid` of its
    /// vkey (protocol.md §14.5), so that renaming it in the config keeps them.
    #[must_use]
    pub fn store_key(&self) -> String {
        format!("{}+{:08x}", self.key.name(), self.key.id())
    }
}

/// The cosigning settings of `tally serve`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CosigningConfig {
    /// The cosigners; none turns cosigning off.
    pub cosigners: Vec<CosignerConfig>,
    /// Bound on each add-checkpoint request (connect and answer).
    pub timeout: Duration,
    /// A cosigner whose cosignature on the latest checkpoint is missing
    /// for longer than this is flagged `stale` (metrics, console).
    pub max_age: Duration,
    /// How long an export (pack, head.json) waits for the cosigners to be
    /// asked about the latest checkpoint before it goes without them.
    pub export_wait: Duration,
}

impl Default for CosigningConfig {
    fn default() -> Self {
        Self {
            cosigners: Vec::new(),
            timeout: Duration::from_secs(10),
            max_age: Duration::from_secs(300),
            export_wait: Duration::from_secs(10),
        }
    }
}

impl CosigningConfig {
    /// Refuses two cosigners with one name or one key, and zero durations.
    ///
    /// # Errors
    /// A message naming the duplicate or the setting.
    pub fn check(&self) -> Result<(), String> {
        for (i, a) in self.cosigners.iter().enumerate() {
            for b in &self.cosigners[..i] {
                if a.name == b.name {
                    return Err(format!("two cosigners are named {}", a.name));
                }
                if a.store_key() == b.store_key() {
                    return Err(format!(
                        "cosigners {} and {} have the same key",
                        b.name, a.name
                    ));
                }
            }
        }
        if self.timeout.is_zero() || self.max_age.is_zero() {
            return Err(
                "the cosigner timeout and the cosigned max age must be at least 1 second".into(),
            );
        }
        Ok(())
    }
}

/// A cosigner's health, as `/metrics` and the console show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CosignerState {
    /// Not asked yet (no checkpoint to cosign since the start).
    Pending,
    /// It cosigned the latest checkpoint, or its last answer was a
    /// cosignature less than the max age ago.
    Ok,
    /// Its last request failed; it is retried with backoff.
    Failing,
    /// The latest checkpoint has no cosignature of it, and its last
    /// cosignature (or the start) is older than the max age.
    Stale,
}

impl CosignerState {
    /// The label value: `pending`, `ok`, `failing`, `stale`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Ok => "ok",
            Self::Failing => "failing",
            Self::Stale => "stale",
        }
    }
}

/// A snapshot of one cosigner for `/metrics` and the console.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CosignerStatus {
    /// Its configured name.
    pub name: String,
    /// Its submission prefix.
    pub url: String,
    /// The largest checkpoint size it cosigned for this log (this run, or
    /// stored beside the latest checkpoint).
    pub cosigned_size: Option<TreeSize>,
    /// When it last returned a valid cosignature (POSIX seconds).
    pub last_success: Option<u64>,
    /// Failed requests since its last success.
    pub consecutive_failures: u64,
    /// The last failure, as the client reported it.
    pub last_error: Option<String>,
    /// Its state.
    pub state: CosignerState,
}

#[derive(Debug, Default)]
struct Track {
    /// The size the log believes it holds (0: unknown; a 409 corrects it).
    believed: TreeSize,
    cosigned_size: Option<TreeSize>,
    last_success: Option<SystemTime>,
    consecutive_failures: u64,
    last_error: Option<String>,
    retry_at: Option<Instant>,
    asked: bool,
}

struct Cosigner {
    config: CosignerConfig,
    client: CosignerClient,
    track: Mutex<Track>,
}

impl Cosigner {
    fn track(&self) -> MutexGuard<'_, Track> {
        match self.track.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

/// The cosigning task's shared state. See the module docs.
pub struct Cosigning {
    log: Arc<Log>,
    config: CosigningConfig,
    cosigners: Vec<Cosigner>,
    started: SystemTime,
    /// The size of the latest checkpoint every cosigner not in backoff was
    /// asked about (a finished round).
    rounds: watch::Sender<TreeSize>,
    /// On a front that does not sequence: the checkpoint followed and when
    /// this front first saw it.
    followed: Mutex<Option<(TreeSize, Instant)>>,
}

impl std::fmt::Debug for Cosigning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cosigning")
            .field("cosigners", &self.config.cosigners.len())
            .finish_non_exhaustive()
    }
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Cosigning {
    /// Prepares cosigning for `log`; nothing is sent until [`Cosigning::run`].
    ///
    /// # Errors
    /// A message when `config` fails [`CosigningConfig::check`] or an HTTP
    /// client cannot be built.
    pub fn new(log: Arc<Log>, config: CosigningConfig) -> Result<Self, String> {
        config.check()?;
        let cosigners = config
            .cosigners
            .iter()
            .map(|c| {
                let client = CosignerClient::new(&c.url, c.key.clone(), config.timeout)
                    .map_err(|e| format!("cosigner {}: {e}", c.name))?;
                Ok(Cosigner {
                    config: c.clone(),
                    client,
                    track: Mutex::new(Track::default()),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self {
            log,
            config,
            cosigners,
            started: SystemTime::now(),
            rounds: watch::Sender::new(TreeSize::new(0)),
            followed: Mutex::new(None),
        })
    }

    /// The settings.
    #[must_use]
    pub fn config(&self) -> &CosigningConfig {
        &self.config
    }

    /// Runs forever: while this process sequences, a round for each new
    /// latest checkpoint (coalescing those signed meanwhile), and another
    /// when a failing cosigner's backoff expires while the latest
    /// checkpoint lacks its cosignature; while another front sequences,
    /// the cosignatures it stored for each checkpoint followed, published
    /// as they appear.
    pub async fn run(self: Arc<Self>) {
        let mut signed = self.log.watch_checkpoints();
        let mut role = self.log.watch_sequencing();
        loop {
            signed.borrow_and_update();
            let sequences = *role.borrow_and_update();
            let cp = self.log.latest_checkpoint();
            let retry = if sequences {
                self.round(&cp).await;
                self.next_retry(cp.checkpoint.size)
            } else {
                self.follow(&cp).await
            };
            tokio::select! {
                changed = signed.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                changed = role.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                () = sleep_until(retry), if retry.is_some() => {}
            }
        }
    }

    /// On a front that does not sequence: publishes `cp` with the lines
    /// the sequencer stored for it and takes each cosigner's state from
    /// them (a line stored is a cosignature it returned). The round counts
    /// as finished (for exports) once every cosigner's line is there, or
    /// once the request timeout has passed since this front saw `cp` (the
    /// sequencer has asked by then). Returns when to look again: soon
    /// while a line is missing.
    async fn follow(&self, cp: &Arc<SignedCheckpoint>) -> Option<Instant> {
        let size = cp.checkpoint.size;
        let stored = match self.stored_lines(size).await {
            Ok(lines) => lines,
            Err(e) => {
                tracing::warn!("reading the cosignatures of checkpoint {size}: {e}");
                BTreeMap::new()
            }
        };
        let mut missing = false;
        for c in &self.cosigners {
            let mut t = c.track();
            if stored.contains_key(&c.config.store_key()) {
                if t.cosigned_size.is_none_or(|s| s < size) {
                    t.cosigned_size = Some(size);
                    t.last_success = Some(SystemTime::now());
                    t.consecutive_failures = 0;
                    t.last_error = None;
                }
                t.believed = t.believed.max(size);
                t.retry_at = None;
            } else {
                missing = true;
            }
        }
        let lines: Vec<(String, String)> = stored.into_iter().collect();
        if let Err(e) = self.log.publish(with_lines(cp, &lines)) {
            tracing::warn!("publishing checkpoint {size}: {e}");
        }
        let seen = {
            let mut followed = self
                .followed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match *followed {
                Some((s, at)) if s == size => at,
                _ => {
                    let now = Instant::now();
                    *followed = Some((size, now));
                    now
                }
            }
        };
        let late = seen.elapsed() >= self.config.timeout;
        if !missing || late {
            self.rounds.send_if_modified(|s| {
                let newer = *s < size;
                *s = (*s).max(size);
                newer
            });
        }
        missing.then(|| Instant::now() + if late { FOLLOW_POLL_LATE } else { FOLLOW_POLL })
    }

    /// Waits until cosigners were asked about a checkpoint of at least
    /// `size`, for at most `wait`. Returns whether they were.
    pub async fn wait_for_round(&self, size: TreeSize, wait: Duration) -> bool {
        let mut rx = self.rounds.subscribe();
        tokio::time::timeout(wait, rx.wait_for(|s| *s >= size))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// The checkpoint an export pins (protocol.md §14.5): after waiting up
    /// to the export wait for the cosigners to be asked about the latest
    /// checkpoint, the published one (with its cosignature lines); if they
    /// were not asked in time, the latest checkpoint with whatever lines are
    /// stored for it.
    ///
    /// # Errors
    /// A message when storage fails.
    pub async fn checkpoint_for_export(&self) -> Result<Arc<SignedCheckpoint>, String> {
        let latest = self.log.latest_checkpoint();
        let size = latest.checkpoint.size;
        if self.wait_for_round(size, self.config.export_wait).await {
            let published = self.log.published_checkpoint();
            if published.checkpoint.size >= size {
                return Ok(published);
            }
        }
        let log = Arc::clone(&self.log);
        let lines = tokio::task::spawn_blocking(move || log.store().cosignatures(size))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(with_lines(&latest, &lines)))
    }

    /// Each cosigner's status, in configuration order.
    #[must_use]
    pub fn status(&self) -> Vec<CosignerStatus> {
        let latest = self.log.latest_checkpoint().checkpoint.size;
        let now = SystemTime::now();
        self.cosigners
            .iter()
            .map(|c| {
                let t = c.track();
                let since_success = now
                    .duration_since(t.last_success.unwrap_or(self.started))
                    .unwrap_or_default();
                let has_latest = t.cosigned_size == Some(latest);
                let state = if !has_latest && since_success > self.config.max_age {
                    CosignerState::Stale
                } else if t.consecutive_failures > 0 {
                    CosignerState::Failing
                } else if t.asked || t.cosigned_size.is_some() {
                    CosignerState::Ok
                } else {
                    CosignerState::Pending
                };
                CosignerStatus {
                    name: c.config.name.clone(),
                    url: c.config.url.clone(),
                    cosigned_size: t.cosigned_size,
                    last_success: t.last_success.map(unix_secs),
                    consecutive_failures: t.consecutive_failures,
                    last_error: t.last_error.clone(),
                    state,
                }
            })
            .collect()
    }

    /// Appends the `tally_log_cosigner_*` gauges (docs/operations.md
    /// "Cosigners for the log") to a Prometheus text exposition.
    pub fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        let status = self.status();
        let gauge =
            |out: &mut String, name: &str, help: &str, value: &dyn Fn(&CosignerStatus) -> u64| {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
                for s in &status {
                    let _ = writeln!(out, "{name}{{cosigner=\"{}\"}} {}", s.name, value(s));
                }
            };
        gauge(
            out,
            "tally_log_cosigner_cosigned_size",
            "Largest checkpoint size the cosigner cosigned for this log (0: none yet).",
            &|s| s.cosigned_size.map_or(0, TreeSize::get),
        );
        gauge(
            out,
            "tally_log_cosigner_last_success_seconds",
            "When the cosigner last returned a valid cosignature, POSIX seconds (0: not since the start).",
            &|s| s.last_success.unwrap_or(0),
        );
        gauge(
            out,
            "tally_log_cosigner_consecutive_failures",
            "Requests to the cosigner that failed since its last cosignature.",
            &|s| s.consecutive_failures,
        );
        gauge(
            out,
            "tally_log_cosigner_stale",
            "1 when the latest checkpoint lacks the cosigner's cosignature for longer than the cosigned max age.",
            &|s| u64::from(s.state == CosignerState::Stale),
        );
        let name = "tally_log_cosigner_state";
        let _ = writeln!(
            out,
            "# HELP {name} The cosigner's state (1 for the current one): pending, ok, failing, stale.\n# TYPE {name} gauge"
        );
        for s in &status {
            for state in [
                CosignerState::Pending,
                CosignerState::Ok,
                CosignerState::Failing,
                CosignerState::Stale,
            ] {
                let _ = writeln!(
                    out,
                    "{name}{{cosigner=\"{}\",state=\"{}\"}} {}",
                    s.name,
                    state.as_str(),
                    u64::from(s.state == state)
                );
            }
        }
    }

    /// When to try again at a cosigner whose cosignature on the checkpoint
    /// of `size` is missing: the earliest backoff expiry among them.
    fn next_retry(&self, size: TreeSize) -> Option<Instant> {
        self.cosigners
            .iter()
            .filter_map(|c| {
                let t = c.track();
                (t.cosigned_size != Some(size))
                    .then_some(t.retry_at)
                    .flatten()
            })
            .min()
    }

    /// Asks every cosigner that has not cosigned `cp` and is not in backoff,
    /// all at once; stores and publishes each line as it comes.
    async fn round(&self, cp: &Arc<SignedCheckpoint>) {
        let size = cp.checkpoint.size;
        let stored = match self.stored_lines(size).await {
            Ok(lines) => lines,
            Err(e) => {
                tracing::warn!("reading the cosignatures of checkpoint {size}: {e}");
                BTreeMap::new()
            }
        };
        let now = Instant::now();
        let mut asks = tokio::task::JoinSet::new();
        for (i, c) in self.cosigners.iter().enumerate() {
            let mut t = c.track();
            if stored.contains_key(&c.config.store_key()) {
                // Cosigned before a restart, or in an earlier round.
                t.cosigned_size = Some(t.cosigned_size.map_or(size, |s| s.max(size)));
                t.believed = t.believed.max(size);
                continue;
            }
            if t.retry_at.is_some_and(|at| at > now) {
                continue;
            }
            t.asked = true;
            let client = c.client.clone();
            let believed = t.believed;
            let log = Arc::clone(&self.log);
            let note = cp.note.clone();
            asks.spawn(async move {
                let got = client
                    .request_cosignature(&note, believed, |old| {
                        log.consistency_proof(old, Some(size)).map(|(_, p)| p)
                    })
                    .await;
                (i, got)
            });
        }
        let mut published = false;
        while let Some(joined) = asks.join_next().await {
            let Ok((i, got)) = joined else {
                continue;
            };
            let c = &self.cosigners[i];
            match got {
                Ok(cosignature) => {
                    match self.keep(size, c, &cosignature.line).await {
                        Ok(()) => {}
                        Err(StoreError::Fenced(e)) => {
                            // Another front took the lease meanwhile: it
                            // asks and stores from now on. Not the
                            // cosigner's fault.
                            tracing::info!(
                                "not keeping the cosignature of {} on checkpoint {size}: {e}",
                                c.config.name
                            );
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(
                                "keeping the cosignature of {} on checkpoint {size}: {e}",
                                c.config.name
                            );
                            self.failed(c, format!("storing its cosignature: {e}"));
                            continue;
                        }
                    }
                    // Published before the status says so: whoever sees
                    // the cosigned size in /metrics finds the line served.
                    self.publish(cp).await;
                    published = true;
                    let mut t = c.track();
                    t.believed = cosignature.size;
                    t.cosigned_size = Some(cosignature.size);
                    t.last_success = Some(SystemTime::now());
                    t.consecutive_failures = 0;
                    t.last_error = None;
                    t.retry_at = None;
                }
                Err(e) => {
                    if let ClientError::Conflict { known } | ClientError::Ahead { known, .. } = &e {
                        c.track().believed = *known;
                    }
                    tracing::warn!(
                        "cosigner {} did not cosign checkpoint {size}: {e}",
                        c.config.name
                    );
                    self.failed(c, e.to_string());
                }
            }
        }
        if !published {
            self.publish(cp).await;
        }
        self.rounds.send_if_modified(|s| {
            let newer = *s < size;
            *s = (*s).max(size);
            newer
        });
    }

    fn failed(&self, c: &Cosigner, error: String) {
        let mut t = c.track();
        t.consecutive_failures += 1;
        let shift = u32::try_from(t.consecutive_failures - 1)
            .unwrap_or(u32::MAX)
            .min(16);
        let wait = BACKOFF_FIRST.saturating_mul(1 << shift).min(BACKOFF_MAX);
        t.retry_at = Some(Instant::now() + wait);
        t.last_error = Some(error);
    }

    async fn stored_lines(&self, size: TreeSize) -> Result<BTreeMap<String, String>, String> {
        let log = Arc::clone(&self.log);
        let rows = tokio::task::spawn_blocking(move || log.store().cosignatures(size))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        Ok(rows.into_iter().collect())
    }

    async fn keep(&self, size: TreeSize, c: &Cosigner, line: &str) -> Result<(), StoreError> {
        let log = Arc::clone(&self.log);
        let key = c.config.store_key();
        let line = line.to_owned();
        tokio::task::spawn_blocking(move || log.store().put_cosignature(size, &key, &line))
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?
    }

    /// Publishes `cp` with every line stored for it.
    async fn publish(&self, cp: &Arc<SignedCheckpoint>) {
        let size = cp.checkpoint.size;
        let lines = match self.stored_lines(size).await {
            Ok(lines) => lines.into_iter().collect::<Vec<_>>(),
            Err(e) => {
                tracing::warn!("reading the cosignatures of checkpoint {size}: {e}");
                Vec::new()
            }
        };
        if let Err(e) = self.log.publish(with_lines(cp, &lines)) {
            tracing::warn!("publishing checkpoint {size}: {e}");
        }
    }
}

/// `cp` with the cosignature `lines` appended to its note, in the given
/// (cosigner) order.
fn with_lines(cp: &SignedCheckpoint, lines: &[(String, String)]) -> SignedCheckpoint {
    let mut note = cp.note.clone();
    for (_, line) in lines {
        note.push_str(line);
    }
    SignedCheckpoint {
        checkpoint: cp.checkpoint.clone(),
        note,
    }
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at.into()).await;
    }
}
