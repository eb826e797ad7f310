//! Configuration of the witness: admission limits ([`WitnessConfig`]) and
//! the server ([`ServeConfig`], read from a TOML file and overridden by
//! flags). docs/operations.md "Configuration" lists every key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::cosigning::{CosignerConfig, CosigningConfig};
use tally_schemas::limits::{DEFAULT_MAX_SKEW_MS, MAX_WIRE_OBJECT_BYTES};

/// Default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";
/// Default data folder.
pub const DEFAULT_DATA_DIR: &str = "./tally-data";

/// The default lease of a PostgreSQL store's sequencer, seconds.
pub const DEFAULT_LEASE_TTL_SECS: u64 = 10;

/// Where `tally serve` keeps the log (docs/operations.md, "Running on
/// PostgreSQL"): the data folder's `log.redb` (the default), or a
/// PostgreSQL database. The key files, the registry and the console's
/// store stay in the data folder either way.
#[derive(Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(try_from = "String")]
pub enum StoreChoice {
    /// `log.redb` in the data folder.
    #[default]
    Redb,
    /// A PostgreSQL database, by connection URL.
    Postgres(String),
}

impl StoreChoice {
    /// Parses `redb` or a `postgres://` / `postgresql://` URL.
    ///
    /// # Errors
    /// A message saying what is accepted.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s == "redb" {
            Ok(Self::Redb)
        } else if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            Ok(Self::Postgres(s.to_owned()))
        } else {
            Err(format!(
                "store {:?}: expected `redb` (the data folder's log.redb) or a PostgreSQL URL \
                 (postgres://user@host:port/database)",
                tally_log::store::postgres::redact_url(s)
            ))
        }
    }
}

impl TryFrom<String> for StoreChoice {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Self::parse(&s)
    }
}

impl std::str::FromStr for StoreChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s)
    }
}

impl std::fmt::Debug for StoreChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Redb => f.write_str("Redb"),
            Self::Postgres(url) => f
                .debug_tuple("Postgres")
                .field(&tally_log::store::postgres::redact_url(url))
                .finish(),
        }
    }
}

impl std::fmt::Display for StoreChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Redb => f.write_str("redb (log.redb in the data folder)"),
            Self::Postgres(url) => f.write_str(&tally_log::store::postgres::redact_url(url)),
        }
    }
}
/// Default checkpoint origin (and log key name).
pub const DEFAULT_ORIGIN: &str = "tally.local/log";

/// A token bucket per API key: `per_second` tokens refill each second, up
/// to `burst`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Sustained requests per second.
    pub per_second: f64,
    /// Bucket size.
    pub burst: u32,
}

/// Who may read the log (`tally serve --log-read`; docs/operations.md "Who
/// can read the log", docs/threat-model.md "Who can read the log").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogRead {
    /// Anyone: the C2SP tlog-tiles read API, proofs, `/checkpoint` and
    /// `/metrics` need no token, as for any public transparency log.
    #[default]
    Public,
    /// Those routes need a read token (or the admin token).
    Token,
}

impl std::str::FromStr for LogRead {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "public" => Ok(Self::Public),
            "token" => Ok(Self::Token),
            other => Err(format!(
                "log read access is `public` or `token`, not {other:?}"
            )),
        }
    }
}

/// What admission enforces.
#[derive(Debug, Clone, PartialEq)]
pub struct WitnessConfig {
    /// Largest |witness time − record time| admitted, in milliseconds.
    pub max_skew_ms: u64,
    /// Largest request body, in bytes (at most the protocol's 131,072).
    pub max_body_bytes: usize,
    /// Per-API-key rate limit on `POST /v1/records`; `None`: unlimited.
    pub rate_limit: Option<RateLimit>,
    /// Most admissions in flight at once; beyond it, 503 `overloaded`.
    pub max_in_flight: usize,
    /// Who may read the log's tiles, proofs, checkpoint and metrics.
    pub log_read: LogRead,
    /// Records and bytes per project per UTC day; unbounded by default.
    pub project_quota: crate::quota::ProjectQuota,
}

impl Default for WitnessConfig {
    fn default() -> Self {
        Self {
            max_skew_ms: DEFAULT_MAX_SKEW_MS,
            max_body_bytes: MAX_WIRE_OBJECT_BYTES,
            rate_limit: Some(RateLimit {
                per_second: 5000.0,
                burst: 10_000,
            }),
            max_in_flight: 4096,
            log_read: LogRead::Public,
            project_quota: crate::quota::ProjectQuota::default(),
        }
    }
}

/// How many connections the server holds, and how long and how much of
/// each it waits for (docs/operations.md "Connections"). Every connection
/// is bounded in time and memory, so clients without a key cannot hold
/// capacity that agents need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnLimits {
    /// Most open connections. At the cap, a new connection makes room by
    /// closing the one that has waited longest for a request; when every
    /// connection has a request in flight, accepting waits.
    pub max_connections: usize,
    /// Most unauthenticated connections (none of whose requests has shown
    /// a valid credential) one client address (an IPv4 address, an IPv6
    /// /64) holds open; its next one closes its oldest.
    pub max_connections_per_client: usize,
    /// Largest request head (request line and headers) of HTTP/1.1, and
    /// header list of HTTP/2, in bytes; beyond it, 431.
    pub max_header_bytes: usize,
    /// A new connection must deliver its first request head (after its TLS
    /// handshake) within this time of being accepted.
    pub header_timeout: Duration,
    /// A connection with no request in flight is closed after this long
    /// without a new request; once a new request's first byte arrives, its
    /// head must be complete within `header_timeout`.
    pub idle_timeout: Duration,
    /// A request body must be complete within this time of its head ...
    pub body_timeout: Duration,
    /// ... plus one second for every this many bytes received (so a large
    /// body that keeps arriving at this rate is not cut off); 0: a fixed
    /// deadline.
    pub body_min_rate: u64,
    /// A connection whose writes make no progress for this long (a client
    /// that does not read its answers) is closed.
    pub write_timeout: Duration,
    /// The TLS handshake must complete within this time of the connection
    /// being accepted.
    pub tls_handshake_timeout: Duration,
    /// Most concurrent HTTP/2 streams (requests) per connection.
    pub h2_max_streams: u32,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            max_connections_per_client: 1_000,
            max_header_bytes: 16 * 1024,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(10),
            body_min_rate: 8 * 1024,
            write_timeout: Duration::from_secs(30),
            tls_handshake_timeout: Duration::from_secs(10),
            h2_max_streams: 64,
        }
    }
}

/// Bounds of [`ConnLimits`]' settings.
pub mod conn_bounds {
    /// `max_header_bytes`: 8 KiB (the smallest buffer hyper takes) to 64 KiB.
    pub const HEADER_BYTES: std::ops::RangeInclusive<usize> = 8 * 1024..=64 * 1024;
    /// Every timeout, in seconds: 1 s to a day.
    pub const TIMEOUT_SECS: std::ops::RangeInclusive<u64> = 1..=86_400;
    /// `h2_max_streams`.
    pub const H2_STREAMS: std::ops::RangeInclusive<u32> = 1..=1_000;
    /// Open files kept free for the server's own use (log and registry
    /// files, the listener, blocking threads) when the connection cap is
    /// fitted to the open-file limit.
    pub const RESERVED_FILES: u64 = 64;
}

impl ConnLimits {
    /// Checks every setting against [`conn_bounds`].
    ///
    /// # Errors
    /// A message naming the setting (as its flag) and its allowed range.
    pub fn check(&self) -> Result<(), String> {
        use conn_bounds::{H2_STREAMS, HEADER_BYTES, TIMEOUT_SECS};
        if self.max_connections == 0 {
            return Err("--max-connections must be at least 1".into());
        }
        if self.max_connections_per_client == 0 {
            return Err("--max-connections-per-client must be at least 1".into());
        }
        if !HEADER_BYTES.contains(&self.max_header_bytes) {
            return Err(format!(
                "--max-header-bytes must be from {} to {}",
                HEADER_BYTES.start(),
                HEADER_BYTES.end()
            ));
        }
        for (flag, d) in [
            ("--header-timeout", self.header_timeout),
            ("--idle-timeout", self.idle_timeout),
            ("--body-timeout", self.body_timeout),
            ("--write-timeout", self.write_timeout),
            ("--tls-handshake-timeout", self.tls_handshake_timeout),
        ] {
            if !TIMEOUT_SECS.contains(&d.as_secs()) || d.subsec_nanos() != 0 {
                return Err(format!(
                    "{flag} must be a whole number of seconds from {} to {}",
                    TIMEOUT_SECS.start(),
                    TIMEOUT_SECS.end()
                ));
            }
        }
        if !H2_STREAMS.contains(&self.h2_max_streams) {
            return Err(format!(
                "--h2-max-streams must be from {} to {}",
                H2_STREAMS.start(),
                H2_STREAMS.end()
            ));
        }
        Ok(())
    }

    /// Lowers the connection cap to fit an open-file limit of `nofile`
    /// (keeping [`conn_bounds::RESERVED_FILES`] free). Returns the cap as it
    /// was when it had to be lowered.
    pub fn fit_to_file_limit(&mut self, nofile: u64) -> Option<usize> {
        let room = nofile.saturating_sub(conn_bounds::RESERVED_FILES).max(1);
        let room = usize::try_from(room).unwrap_or(usize::MAX);
        (self.max_connections > room).then(|| std::mem::replace(&mut self.max_connections, room))
    }
}

/// The `[connections]` table of the config file: [`ConnLimits`], every key
/// optional, times in whole seconds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionsFile {
    /// [`ConnLimits::max_connections`].
    pub max_connections: Option<usize>,
    /// [`ConnLimits::max_connections_per_client`].
    pub max_connections_per_client: Option<usize>,
    /// [`ConnLimits::max_header_bytes`].
    pub max_header_bytes: Option<usize>,
    /// [`ConnLimits::header_timeout`].
    pub header_timeout_secs: Option<u64>,
    /// [`ConnLimits::idle_timeout`].
    pub idle_timeout_secs: Option<u64>,
    /// [`ConnLimits::body_timeout`].
    pub body_timeout_secs: Option<u64>,
    /// [`ConnLimits::body_min_rate`], bytes per second.
    pub body_min_rate: Option<u64>,
    /// [`ConnLimits::write_timeout`].
    pub write_timeout_secs: Option<u64>,
    /// [`ConnLimits::tls_handshake_timeout`].
    pub tls_handshake_timeout_secs: Option<u64>,
    /// [`ConnLimits::h2_max_streams`].
    pub h2_max_streams: Option<u32>,
}

impl ConnLimits {
    /// Applies the keys set in `file` over `self`.
    pub fn apply_file(&mut self, file: &ConnectionsFile) {
        let secs = Duration::from_secs;
        if let Some(v) = file.max_connections {
            self.max_connections = v;
        }
        if let Some(v) = file.max_connections_per_client {
            self.max_connections_per_client = v;
        }
        if let Some(v) = file.max_header_bytes {
            self.max_header_bytes = v;
        }
        if let Some(v) = file.header_timeout_secs {
            self.header_timeout = secs(v);
        }
        if let Some(v) = file.idle_timeout_secs {
            self.idle_timeout = secs(v);
        }
        if let Some(v) = file.body_timeout_secs {
            self.body_timeout = secs(v);
        }
        if let Some(v) = file.body_min_rate {
            self.body_min_rate = v;
        }
        if let Some(v) = file.write_timeout_secs {
            self.write_timeout = secs(v);
        }
        if let Some(v) = file.tls_handshake_timeout_secs {
            self.tls_handshake_timeout = secs(v);
        }
        if let Some(v) = file.h2_max_streams {
            self.h2_max_streams = v;
        }
    }
}

/// TLS files (PEM).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// Certificate chain.
    pub cert: PathBuf,
    /// Private key.
    pub key: PathBuf,
}

/// The config file, every key optional (docs/operations.md).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Listen address.
    pub listen: Option<SocketAddr>,
    /// Data folder.
    pub data_dir: Option<PathBuf>,
    /// Where the log is kept: `redb` (default) or a PostgreSQL URL.
    pub store: Option<StoreChoice>,
    /// PostgreSQL store: seconds the sequencer's lease lasts unrenewed.
    pub lease_ttl_secs: Option<u64>,
    /// Checkpoint origin, used when the log key is created.
    pub origin: Option<String>,
    /// Skew bound in seconds.
    pub max_skew_secs: Option<u64>,
    /// Body limit in bytes.
    pub max_body_bytes: Option<usize>,
    /// In-flight admissions.
    pub max_in_flight: Option<usize>,
    /// Log queue capacity.
    pub queue_capacity: Option<usize>,
    /// Largest group commit.
    pub max_batch: Option<usize>,
    /// The log store's page cache, MiB.
    pub cache_mib: Option<usize>,
    /// Seconds to wait for in-flight requests on SIGTERM.
    pub drain_timeout_secs: Option<u64>,
    /// Mark the console's cookies `Secure` although the witness serves
    /// plain HTTP (a TLS proxy in front of it).
    pub secure_cookies: Option<bool>,
    /// Rate limit per API key; `per_second = 0` turns it off.
    pub rate_limit: Option<RateLimit>,
    /// Quotas per project and UTC day (`[project_quota]`:
    /// `records_per_day`, `bytes_per_day`).
    pub project_quota: Option<crate::quota::ProjectQuota>,
    /// TLS; absent means plain HTTP.
    pub tls: Option<TlsFiles>,
    /// Who may read the log: `"public"` (default) or `"token"`.
    pub log_read: Option<LogRead>,
    /// Connection limits and timeouts.
    pub connections: Option<ConnectionsFile>,
    /// Cosigning settings (docs/operations.md "Cosigners for the log").
    pub cosigning: Option<CosigningFile>,
    /// The cosigners the log asks, one `[[cosigner]]` table each.
    pub cosigner: Option<Vec<CosignerEntry>>,
}

/// One `[[cosigner]]` table: a C2SP tlog-witness the log asks for
/// cosignatures (protocol.md §14.5).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CosignerEntry {
    /// The operator's name for it.
    pub name: String,
    /// Its C2SP cosignature/v1 vkey.
    pub vkey: String,
    /// Its submission prefix (`<url>/add-checkpoint`).
    pub url: String,
}

/// The `[cosigning]` table, every key optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CosigningFile {
    /// [`CosigningConfig::timeout`], seconds.
    pub timeout_secs: Option<u64>,
    /// [`CosigningConfig::max_age`], seconds.
    pub max_age_secs: Option<u64>,
    /// [`CosigningConfig::export_wait`], seconds.
    pub export_wait_secs: Option<u64>,
}

impl ConfigFile {
    /// Applies the file's `[cosigning]` table and `[[cosigner]]` tables over
    /// `c`, checking each cosigner (its vkey above all).
    ///
    /// # Errors
    /// A message naming the cosigner and the setting that is wrong.
    pub fn apply_cosigning(&self, c: &mut CosigningConfig) -> Result<(), String> {
        if let Some(f) = &self.cosigning {
            if let Some(v) = f.timeout_secs {
                c.timeout = Duration::from_secs(v);
            }
            if let Some(v) = f.max_age_secs {
                c.max_age = Duration::from_secs(v);
            }
            if let Some(v) = f.export_wait_secs {
                c.export_wait = Duration::from_secs(v);
            }
        }
        for e in self.cosigner.iter().flatten() {
            c.cosigners
                .push(CosignerConfig::new(&e.name, &e.vkey, &e.url)?);
        }
        Ok(())
    }
}

/// Why the config file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// It could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is not valid TOML for this schema.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What toml said.
        message: String,
    },
}

impl ConfigFile {
    /// Reads a TOML config file. Unknown keys are refused.
    ///
    /// # Errors
    /// [`ConfigError`] when unreadable or invalid.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })
    }
}

/// Everything `tally serve` needs, after flags, environment and file are merged.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// Data folder.
    pub data_dir: PathBuf,
    /// Where the log is kept.
    pub store: StoreChoice,
    /// PostgreSQL store: how long the sequencer's lease lasts unrenewed
    /// (a standby takes over at most this long after the holder dies).
    pub lease_ttl: Duration,
    /// Checkpoint origin for a new log key.
    pub origin: String,
    /// Admission limits.
    pub witness: WitnessConfig,
    /// The log's queue, group commit and page cache.
    pub log: tally_log::LogConfig,
    /// Drain timeout on SIGTERM, seconds.
    pub drain_timeout_secs: u64,
    /// TLS files.
    pub tls: Option<TlsFiles>,
    /// The console's cookies are `Secure` even without `tls` (a TLS proxy
    /// in front); with `tls` they always are.
    pub secure_cookies: bool,
    /// Connection limits and timeouts.
    pub connections: ConnLimits,
    /// The cosigners the log asks, and how (protocol.md §14.5).
    pub cosigning: CosigningConfig,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN
                .parse()
                .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 7878))),
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            store: StoreChoice::Redb,
            lease_ttl: Duration::from_secs(DEFAULT_LEASE_TTL_SECS),
            origin: DEFAULT_ORIGIN.into(),
            witness: WitnessConfig::default(),
            log: tally_log::LogConfig::default(),
            drain_timeout_secs: 30,
            tls: None,
            secure_cookies: false,
            connections: ConnLimits::default(),
            cosigning: CosigningConfig::default(),
        }
    }
}

impl ServeConfig {
    /// Applies the keys set in `file` over `self`.
    pub fn apply_file(&mut self, file: ConfigFile) {
        if let Some(v) = file.listen {
            self.listen = v;
        }
        if let Some(v) = file.data_dir {
            self.data_dir = v;
        }
        if let Some(v) = file.store {
            self.store = v;
        }
        if let Some(v) = file.lease_ttl_secs {
            self.lease_ttl = Duration::from_secs(v.max(1));
        }
        if let Some(v) = file.origin {
            self.origin = v;
        }
        if let Some(v) = file.max_skew_secs {
            self.witness.max_skew_ms = v.saturating_mul(1000);
        }
        if let Some(v) = file.max_body_bytes {
            self.witness.max_body_bytes = v.min(MAX_WIRE_OBJECT_BYTES);
        }
        if let Some(v) = file.max_in_flight {
            self.witness.max_in_flight = v.max(1);
        }
        if let Some(v) = file.queue_capacity {
            self.log.queue_capacity = v.max(1);
        }
        if let Some(v) = file.max_batch {
            self.log.max_batch = v.max(1);
        }
        if let Some(v) = file.cache_mib {
            self.log.cache_bytes = mib(v);
        }
        if let Some(v) = file.drain_timeout_secs {
            self.drain_timeout_secs = v;
        }
        if let Some(v) = file.secure_cookies {
            self.secure_cookies = v;
        }
        if let Some(v) = file.rate_limit {
            self.witness.rate_limit = (v.per_second > 0.0).then_some(v);
        }
        if let Some(v) = file.project_quota {
            // 0, as for the flags: no quota.
            self.witness.project_quota = crate::quota::ProjectQuota {
                records_per_day: v.records_per_day.filter(|n| *n > 0),
                bytes_per_day: v.bytes_per_day.filter(|n| *n > 0),
            };
        }
        if let Some(v) = file.tls {
            self.tls = Some(v);
        }
        if let Some(v) = file.log_read {
            self.witness.log_read = v;
        }
        if let Some(v) = &file.connections {
            self.connections.apply_file(v);
        }
    }
}

/// `v` MiB in bytes, at least 1 MiB.
pub fn mib(v: usize) -> usize {
    v.max(1).saturating_mul(1024 * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_key_takes_redb_or_a_postgres_url_and_hides_the_password() {
        let f: ConfigFile = toml::from_str("store = \"postgres://u:pw@db:5432/tally\"\n").unwrap();
        let mut c = ServeConfig::default();
        assert_eq!(c.store, StoreChoice::Redb);
        c.apply_file(f);
        assert_eq!(
            c.store,
            StoreChoice::Postgres("postgres://u:pw@db:5432/tally".into())
        );
        assert_eq!(c.store.to_string(), "postgres://u:***@db:5432/tally");
        assert!(!format!("{c:?}").contains("pw@"));
        let f: ConfigFile = toml::from_str("store = \"redb\"\n").unwrap();
        assert_eq!(f.store, Some(StoreChoice::Redb));
        let err = toml::from_str::<ConfigFile>("store = \"mysql://x\"\n").unwrap_err();
        assert!(err.to_string().contains("expected `redb`"), "{err}");
    }

    #[test]
    fn file_overrides_defaults_and_refuses_unknown_keys() {
        let f: ConfigFile = toml::from_str(
            "listen = \"0.0.0.0:9000\"\nmax_skew_secs = 10\ncache_mib = 16\n[rate_limit]\nper_second = 0\nburst = 1\n[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\n",
        )
        .unwrap();
        let mut c = ServeConfig::default();
        c.apply_file(f);
        assert_eq!(c.listen.port(), 9000);
        assert_eq!(c.witness.max_skew_ms, 10_000);
        assert_eq!(c.log.cache_bytes, 16 * 1024 * 1024);
        assert!(c.witness.rate_limit.is_none());
        assert!(c.tls.is_some());
        assert!(toml::from_str::<ConfigFile>("lisen = \"x\"").is_err());
        assert_eq!(c.witness.log_read, LogRead::Public);
        c.apply_file(toml::from_str("log_read = \"token\"").unwrap());
        assert_eq!(c.witness.log_read, LogRead::Token);
        assert!(toml::from_str::<ConfigFile>("log_read = \"private\"").is_err());
        assert_eq!("token".parse::<LogRead>(), Ok(LogRead::Token));
        assert!("Token".parse::<LogRead>().is_err());
    }

    #[test]
    fn cosigners_from_the_file_are_checked() {
        let vkey = tally_schemas::cosignature::CosignatureSigner::from_secret(
            "cosigner.example/one",
            tally_schemas::SecretKey::from_seed(&[5; 32]),
        )
        .unwrap()
        .verifier()
        .vkey();
        let text = format!(
            "[cosigning]\ntimeout_secs = 3\n[[cosigner]]\nname = \"one\"\nvkey = \"{vkey}\"\nurl = \"http://127.0.0.1:1/\"\n"
        );
        let f: ConfigFile = toml::from_str(&text).unwrap();
        let mut c = CosigningConfig::default();
        f.apply_cosigning(&mut c).unwrap();
        assert_eq!(c.timeout, Duration::from_secs(3));
        assert_eq!(c.cosigners.len(), 1);
        assert_eq!(c.cosigners[0].url, "http://127.0.0.1:1");
        assert!(c.check().is_ok());
        // A log (note) key is not a cosigner key: refused, naming the cosigner.
        let note_vkey = tally_schemas::NoteSigner::from_secret(
            "log.example/a",
            tally_schemas::SecretKey::from_seed(&[6; 32]),
        )
        .unwrap()
        .verifier()
        .vkey();
        let bad: ConfigFile = toml::from_str(&text.replace(&vkey, &note_vkey)).unwrap();
        let err = bad
            .apply_cosigning(&mut CosigningConfig::default())
            .unwrap_err();
        assert!(
            err.contains("cosigner one") && err.contains("vkey"),
            "{err}"
        );
        let bad: ConfigFile = toml::from_str(&text.replace(&vkey, "nonsense")).unwrap();
        assert!(bad
            .apply_cosigning(&mut CosigningConfig::default())
            .is_err());
        let bad: ConfigFile =
            toml::from_str(&text.replace("http://127.0.0.1:1/", "ftp://x")).unwrap();
        assert!(bad
            .apply_cosigning(&mut CosigningConfig::default())
            .unwrap_err()
            .contains("url"));
        assert!(toml::from_str::<ConfigFile>(&text.replace("url =", "uri =")).is_err());
        // Two cosigners with one key are refused.
        c.cosigners.push(
            CosignerConfig::parse_option(&format!("name=two,vkey={vkey},url=http://h:2")).unwrap(),
        );
        assert!(c.check().unwrap_err().contains("same key"));
        assert!(CosignerConfig::parse_option("name=x,url=http://h").is_err());
        assert!(
            CosignerConfig::parse_option(&format!("name=x,vkey={vkey},url=http://h,port=1"))
                .is_err()
        );
    }

    #[test]
    fn project_quotas_from_the_file_and_zero_is_none() {
        let f: ConfigFile =
            toml::from_str("[project_quota]\nrecords_per_day = 1000\nbytes_per_day = 0\n").unwrap();
        let mut c = ServeConfig::default();
        assert_eq!(
            c.witness.project_quota,
            crate::quota::ProjectQuota::default()
        );
        c.apply_file(f);
        assert_eq!(c.witness.project_quota.records_per_day, Some(1000));
        assert_eq!(c.witness.project_quota.bytes_per_day, None);
        let bad: Result<ConfigFile, _> = toml::from_str("[project_quota]\nrecords = 1\n");
        assert!(bad.is_err(), "unknown keys are refused");
    }

    #[test]
    fn connection_limits_from_the_file_are_checked() {
        let f: ConfigFile = toml::from_str(
            "[connections]\nmax_connections = 500\nheader_timeout_secs = 3\nbody_min_rate = 0\n",
        )
        .unwrap();
        let mut c = ServeConfig::default();
        c.apply_file(f);
        assert_eq!(c.connections.max_connections, 500);
        assert_eq!(c.connections.header_timeout, Duration::from_secs(3));
        assert_eq!(c.connections.body_min_rate, 0);
        assert_eq!(
            c.connections.idle_timeout,
            ConnLimits::default().idle_timeout
        );
        assert!(c.connections.check().is_ok());
        assert!(toml::from_str::<ConfigFile>("[connections]\nmax_conections = 1\n").is_err());

        let bad = |f: &dyn Fn(&mut ConnLimits)| {
            let mut l = ConnLimits::default();
            f(&mut l);
            l.check().unwrap_err()
        };
        assert!(bad(&|l| l.max_header_bytes = 4096).contains("--max-header-bytes"));
        assert!(bad(&|l| l.header_timeout = Duration::ZERO).contains("--header-timeout"));
        assert!(bad(&|l| l.max_connections = 0).contains("--max-connections"));
        assert!(bad(&|l| l.h2_max_streams = 0).contains("--h2-max-streams"));
    }

    #[test]
    fn the_connection_cap_fits_the_file_limit() {
        let mut l = ConnLimits::default();
        assert_eq!(l.fit_to_file_limit(1_000_000), None);
        assert_eq!(l.max_connections, 10_000);
        assert_eq!(l.fit_to_file_limit(1024), Some(10_000));
        assert_eq!(
            l.max_connections,
            1024 - conn_bounds::RESERVED_FILES as usize
        );
        assert_eq!(l.fit_to_file_limit(10), Some(960));
        assert_eq!(l.max_connections, 1);
    }
}
