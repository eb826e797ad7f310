//! Configuration of the witness: admission limits ([`WitnessConfig`]) and
//! the server ([`ServeConfig`], read from a TOML file and overridden by
//! flags). docs/operations.md "Configuration" lists every key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tally_schemas::limits::{DEFAULT_MAX_SKEW_MS, MAX_WIRE_OBJECT_BYTES};

/// Default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";
/// Default data folder.
pub const DEFAULT_DATA_DIR: &str = "./tally-data";
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
    /// TLS; absent means plain HTTP.
    pub tls: Option<TlsFiles>,
    /// Who may read the log: `"public"` (default) or `"token"`.
    pub log_read: Option<LogRead>,
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
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN
                .parse()
                .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 7878))),
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            origin: DEFAULT_ORIGIN.into(),
            witness: WitnessConfig::default(),
            log: tally_log::LogConfig::default(),
            drain_timeout_secs: 30,
            tls: None,
            secure_cookies: false,
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
        if let Some(v) = file.tls {
            self.tls = Some(v);
        }
        if let Some(v) = file.log_read {
            self.witness.log_read = v;
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
}
