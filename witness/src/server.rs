//! `tally serve`'s machinery (issue 4 §1; docs/operations.md): the data
//! folder (log key, key directory, log and registry files), the listener
//! with optional TLS (rustls), and graceful shutdown that drains in-flight
//! requests before the log's sequencer is stopped.
//!
//! Data folder layout:
//! - `log.skey`: the checkpoint (witness) signing key, C2SP skey, mode 0600;
//! - `keys.json`: the key directory served at `/.well-known/tally/keys`;
//! - `log.redb`: the log (tally-log, docs/storage.md);
//! - `witness.redb`: projects, API key hashes, agents (module `registry`);
//! - `admin.token`: the admin token, mode 0600, written on first start.

use std::future::Future;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tally_log::{Log, OpenError};
use tally_schemas::note::NoteError;
use tally_schemas::time::Clock;
use tally_schemas::NoteSigner;
use tokio::net::TcpListener;

use crate::config::{ServeConfig, TlsFiles, DEFAULT_ORIGIN};
use crate::error::RegistryError;
use crate::keydir::{KeyDirectory, KeyDirectoryError};
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
    /// The registry refused to open.
    #[error("opening the registry: {0}")]
    Registry(#[from] RegistryError),
    /// The key directory.
    #[error("key directory: {0}")]
    KeyDirectory(#[from] KeyDirectoryError),
    /// TLS files.
    #[error("TLS: {0}")]
    Tls(String),
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
            let origin = origin.unwrap_or(DEFAULT_ORIGIN);
            let signer =
                NoteSigner::generate(origin, rng.as_mut()).map_err(|source| ServeError::Key {
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
    let signer = load_or_create_key(dir, origin, &mut rng)?;
    let now = clock.now();
    let keys = KeyDirectory::load_or_init(&dir.join(files::KEYS), signer.verifier(), now)?;
    let log = Log::open_redb(&dir.join(files::LOG_DB), signer, config.log)?;
    let registry = Registry::open(&dir.join(files::WITNESS_DB))?;
    let first_start = registry.first_start(now, rng.as_mut())?;
    if let Some(first) = &first_start {
        let path = dir.join(files::ADMIN_TOKEN);
        let _ = std::fs::remove_file(&path);
        write_private(&path, format!("{}\n", first.admin_token.token).as_bytes())?;
    }
    let witness = Witness::new(
        Arc::new(log),
        Arc::new(registry),
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

/// Builds the rustls server config from PEM files.
///
/// # Errors
/// [`ServeError::Tls`] when a file is unreadable or holds no usable key or certificate.
pub fn tls_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, ServeError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| ServeError::Tls(format!("{}: {e}", files.cert.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| ServeError::Tls(format!("{}: {e}", files.cert.display())))?;
    if certs.is_empty() {
        return Err(ServeError::Tls(format!(
            "{}: no certificate",
            files.cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| ServeError::Tls(format!("{}: {e}", files.key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServeError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| ServeError::Tls(e.to_string()))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Serves `app` on `listener` (over TLS when `tls` is set) until `shutdown`
/// resolves; then stops accepting, lets in-flight requests finish (at most
/// `drain`), and returns. Keep-alive connections are closed after their
/// current request.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    let graceful = GracefulShutdown::new();
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        // The client's address reaches handlers as axum's ConnectInfo (the
        // console's login throttle counts attempts per address).
        let service = TowerToHyperService::new(tower::ServiceExt::map_request(
            app.clone(),
            move |mut req: axum::extract::Request<hyper::body::Incoming>| {
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                req
            },
        ));
        let watcher = graceful.watcher();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            match acceptor {
                None => {
                    let conn =
                        builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                    let _ = watcher.watch(conn).await;
                }
                Some(acceptor) => {
                    let handshake =
                        tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream))
                            .await;
                    let Ok(Ok(tls_stream)) = handshake else {
                        return;
                    };
                    let conn =
                        builder.serve_connection_with_upgrades(TokioIo::new(tls_stream), service);
                    let _ = watcher.watch(conn).await;
                }
            }
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(drain) => {
            tracing::warn!("drain timeout: closing connections with requests still in flight");
        }
    }
}

/// Stops the log after the server has drained: every queued append is
/// committed and answered, then the sequencer thread ends.
pub async fn stop_log(log: Arc<Log>) {
    let _ = tokio::task::spawn_blocking(move || log.shutdown()).await;
}
