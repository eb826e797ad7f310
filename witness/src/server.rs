//! `tally serve`'s machinery (docs/operations.md "The data folder",
//! "Connections", "TLS", "Shutdown, crashes, restarts"): the data
//! folder (log key, key directory, log and registry files), the listener
//! (tally-net's server loop, with optional TLS) under the connection
//! policy of module `conn`, and graceful shutdown that drains in-flight
//! requests before the log's sequencer is stopped.
//!
//! Data folder layout:
//! - `log.skey`: the checkpoint (witness) signing key, C2SP skey, mode 0600;
//! - `keys.json`: the key directory served at `/.well-known/tally/keys`;
//! - `log.redb`: the log (tally-log, docs/storage.md), unless the config
//!   names a PostgreSQL store (`StoreChoice::Postgres`);
//! - `witness.redb`: projects, API key hashes, agents (module `registry`),
//!   unless the config names a PostgreSQL store: then they are there too;
//! - `admin.token`: the admin token, mode 0600, written on first start.

use std::future::Future;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tally_log::store::LogStore as _;
use tally_log::{Log, OpenError};
use tally_schemas::note::NoteError;
use tally_schemas::time::Clock;
use tally_schemas::NoteSigner;
use tokio::net::TcpListener;

use crate::config::{ConnLimits, ServeConfig, StoreChoice, TlsFiles, DEFAULT_ORIGIN};
use crate::conn::{ConnState, ConnectionStats, TrackedService, Tracker};
use crate::error::RegistryError;
use crate::keydir::{KeyDirectory, KeyDirectoryError, KeyDirectoryFile as _};
use crate::registry::{FirstStart, Registry};
use crate::witness::{Rng, Witness};

/// File names inside the data folder.
pub mod files {
    /// Checkpoint signing key.
    pub const LOG_SKEY: &str = "log.skey";
    /// Key directory.
    pub const KEYS: &str = "keys.json";
    /// The log.
    pub const LOG_DB: &str = "log.redb";
    /// The registry.
    pub const WITNESS_DB: &str = "witness.redb";
    /// The admin token.
    pub const ADMIN_TOKEN: &str = "admin.token";
}

/// Why the server could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A file or folder could not be made or read.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The log key file is not a valid skey, or the origin is not a valid key name.
    #[error("log key {path}: {source}")]
    Key {
        /// The file.
        path: PathBuf,
        /// Why.
        source: NoteError,
    },
    /// The data folder's key is for another origin than the one configured.
    #[error("the data folder's log key is for origin {existing:?}, but origin {configured:?} is configured; a log's origin cannot change")]
    OriginMismatch {
        /// In the key file.
        existing: String,
        /// Configured.
        configured: String,
    },
    /// The log refused to open.
    #[error("opening the log: {0}")]
    Log(#[from] OpenError),
    /// A front on PostgreSQL started with a data folder that lacked the
    /// log's key, on a database whose log another front signs.
    #[error("the log in PostgreSQL is signed by another front's key, and {dir} had no log.skey (a new one was made for this front, which the log does not trust: {source}). Copy log.skey and keys.json from the data folder of the front that started the log into {dir}, then start again (docs/operations.md, \"Running on PostgreSQL\")", dir = dir.display())]
    SharedKeyMissing {
        /// This front's data folder.
        dir: PathBuf,
        /// What the log said.
        source: OpenError,
    },
    /// The registry refused to open.
    #[error("opening the registry: {0}")]
    Registry(#[from] RegistryError),
    /// The key directory.
    #[error("key directory: {0}")]
    KeyDirectory(#[from] KeyDirectoryError),
    /// TLS files.
    #[error("TLS: {0}")]
    Tls(#[from] tally_net::TlsError),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ServeError + '_ {
    move |source| ServeError::Io {
        path: path.to_owned(),
        source,
    }
}

/// An opened data folder.
pub struct Opened {
    /// The witness over it.
    pub witness: Arc<Witness>,
    /// Set on the first start: the default project's API key and admin token.
    pub first_start: Option<FirstStart>,
    /// Whether the data folder was created now.
    pub created_dir: bool,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("created_dir", &self.created_dir)
            .finish_non_exhaustive()
    }
}

/// Writes `contents` to a new file with mode 0600 (refusing to overwrite).
fn write_private(path: &Path, contents: &[u8]) -> Result<(), ServeError> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path).map_err(io_err(path))?;
    f.write_all(contents).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))
}

/// Loads the log key, or makes one for `origin` on a new data folder.
fn load_or_create_key(
    dir: &Path,
    origin: Option<&str>,
    rng: &mut Rng,
) -> Result<NoteSigner, ServeError> {
    let path = dir.join(files::LOG_SKEY);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let signer = NoteSigner::from_skey(text.trim()).map_err(|source| ServeError::Key {
                path: path.clone(),
                source,
            })?;
            if let Some(o) = origin {
                if o != signer.verifier().name() {
                    return Err(ServeError::OriginMismatch {
                        existing: signer.verifier().name().to_owned(),
                        configured: o.to_owned(),
                    });
                }
            }
            Ok(signer)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Without --origin a new log gets an origin of its own, so two
            // installs' checkpoints (and their keys) never look alike
            // (docs/protocol.md §7.4; docs/operations.md, `--origin`).
            let origin = match origin {
                Some(o) => o.to_owned(),
                None => format!("{DEFAULT_ORIGIN}/{:08x}", rng.next_u32()),
            };
            let signer =
                NoteSigner::generate(&origin, rng.as_mut()).map_err(|source| ServeError::Key {
                    path: path.clone(),
                    source,
                })?;
            write_private(&path, format!("{}\n", signer.skey()).as_bytes())?;
            Ok(signer)
        }
        Err(e) => Err(io_err(&path)(e)),
    }
}

/// Opens (creating on first use) the data folder of `config`: log key, key
/// directory, log, registry; on first start the default project, its API
/// key and the admin token (written to `admin.token`, mode 0600).
/// `origin` is the configured origin, `None` for "the default, or whatever
/// the data folder already has".
///
/// # Errors
/// [`ServeError`] naming the file or component that failed.
pub fn open(
    config: &ServeConfig,
    origin: Option<&str>,
    clock: Arc<dyn Clock>,
    mut rng: Rng,
) -> Result<Opened, ServeError> {
    let dir = &config.data_dir;
    let created_dir = !dir.exists();
    if created_dir {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(io_err(dir))?;
        }
    }
    let had_key = dir.join(files::LOG_SKEY).exists();
    let signer = load_or_create_key(dir, origin, &mut rng)?;
    let now = clock.now();
    let keys = KeyDirectory::load_or_init(&dir.join(files::KEYS), signer.verifier(), now)?;
    let log = match &config.store {
        StoreChoice::Redb => Log::open_redb(&dir.join(files::LOG_DB), signer, config.log)?,
        StoreChoice::Postgres(url) => {
            // Every front admits and serves reads; the lease holder also
            // sequences (docs/operations.md, "Running on PostgreSQL").
            let store =
                tally_log::store::postgres::PostgresStore::open_front(url, config.lease_ttl)
                    .map_err(OpenError::from)?;
            let empty = store.latest_checkpoint().ok().flatten().is_none();
            Log::open(Arc::new(store), signer, config.log).map_err(|source| {
                if had_key || empty {
                    ServeError::Log(source)
                } else {
                    ServeError::SharedKeyMissing {
                        dir: dir.clone(),
                        source,
                    }
                }
            })?
        }
    };
    // The registry lives where the log does (docs/operations.md "Running
    // on PostgreSQL", "What is where").
    let registry = match &config.store {
        StoreChoice::Redb => Registry::open(&dir.join(files::WITNESS_DB))?,
        StoreChoice::Postgres(url) => Registry::open_postgres(url)?,
    };
    let first_start = registry.first_start_in(now, rng.as_mut(), Some(dir))?;
    if let Some(first) = &first_start {
        let path = dir.join(files::ADMIN_TOKEN);
        let _ = std::fs::remove_file(&path);
        write_private(&path, format!("{}\n", first.admin_token.token).as_bytes())?;
    }
    let witness = Witness::new(
        Arc::new(log),
        registry,
        clock,
        rng,
        config.witness.clone(),
        keys,
    );
    Ok(Opened {
        witness: Arc::new(witness),
        first_start,
        created_dir,
    })
}

/// Builds the rustls server config from PEM files (tally-net's
/// [`tally_net::tls_config`]: ring, safe defaults, ALPN h2 and http/1.1).
///
/// # Errors
/// [`ServeError::Tls`] when a file is unreadable or holds no usable key or certificate.
pub fn tls_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, ServeError> {
    Ok(tally_net::tls_config(&files.cert, &files.key)?)
}

/// How [`serve`] runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Serve HTTPS with this configuration; `None`: plain HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The connection cap and timeouts.
    pub limits: ConnLimits,
    /// Where the connection layer counts (rendered into `/metrics`).
    pub stats: Arc<ConnectionStats>,
    /// How long shutdown waits for requests in flight.
    pub drain: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            tls: None,
            limits: ConnLimits::default(),
            stats: Arc::new(ConnectionStats::default()),
            drain: Duration::from_secs(30),
        }
    }
}

/// The first pause after a failed accept; it doubles up to
/// [`ACCEPT_BACKOFF_MAX`] while accepts keep failing.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// The longest pause after a failed accept.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The loop settings of `tally serve` (tally-net's [`tally_net::serve`]).
fn net_options(
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: &ConnLimits,
    drain: Duration,
) -> tally_net::Options {
    tally_net::Options {
        tls,
        tls_handshake_timeout: limits.tls_handshake_timeout,
        // A connection waiting for its first byte holds only its socket;
        // the connection watchdog (module conn) bounds that wait (the
        // header timeout from the accept).
        wait_for_first_byte: true,
        http: tally_net::Http {
            // hyper's own header timer would also cut idle keep-alive
            // connections at the header timeout.
            header_read_timeout: None,
            // The head must fit in the read buffer: a longer one is
            // answered 431 and the connection closed, so an unfinished
            // head holds at most this much memory.
            max_buf_size: Some(limits.max_header_bytes.max(8 * 1024)),
            http2: Some(tally_net::Http2 {
                max_concurrent_streams: Some(limits.h2_max_streams),
                max_header_list_size: Some(
                    u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX),
                ),
            }),
        },
        connection_lifetime: None,
        accept_backoff: tally_net::Backoff {
            min: ACCEPT_BACKOFF_MIN,
            max: ACCEPT_BACKOFF_MAX,
        },
        drain,
    }
}

/// Serves `app` on `listener` until `shutdown` resolves; then stops
/// accepting, closes connections that have no request in flight, lets
/// in-flight requests finish (at most `options.drain`), and returns.
///
/// Every connection is bounded as docs/operations.md "Connections" says
/// (module `conn`, the connection policy of tally-net's loop): at most
/// `max_connections` are open (at the cap, the one that has waited longest
/// for a request is closed for room); heads, bodies, idle time, writes and
/// TLS handshakes have timeouts; heads have a size limit. A failed accept
/// (the open-file limit) backs off from 10 ms to 1 s and is logged at most
/// every 10 s.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) {
    let net = net_options(options.tls, &options.limits, options.drain);
    let tracker = Tracker::new(options.limits, options.stats);
    let service = move |state: &Arc<ConnState>, peer: SocketAddr, tls: bool| {
        TrackedService::new(app.clone(), Arc::clone(state), peer, tls)
    };
    if tally_net::serve(listener, tracker, service, net, shutdown).await
        == tally_net::Drained::TimedOut
    {
        tracing::warn!("drain timeout: closing connections with requests still in flight");
    }
}

/// Raises this process's soft limit on open files to its hard limit (what
/// the operator allows), so the connection cap is not held to a low
/// default soft limit. Returns the soft limit in effect, `None` when it
/// cannot be read.
#[must_use]
pub fn raise_open_file_limit() -> Option<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return Some(hard);
    }
    Some(soft)
}

/// Stops the log after the server has drained: every queued append is
/// committed and answered, then the sequencer thread ends.
pub async fn stop_log(log: Arc<Log>) {
    let _ = tokio::task::spawn_blocking(move || log.shutdown()).await;
}
