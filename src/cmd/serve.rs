//! `tally serve`: run the witness. Flags override the config file
//! (`--config`), which overrides the defaults; docs/operations.md lists
//! them all. On a fresh machine it needs no flags: it creates ./tally-data,
//! the log key and the default project, and prints the API key once.

use super::data_folder::{self, DataFolder};
use super::out::outln;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rand_core::OsRng;
use tally_log::store::postgres::redact_url;
use tally_schemas::time::SystemClock;
use tally_witness::config::{
    ConfigFile, ConnLimits, LogRead, RateLimit, ServeConfig, StoreChoice, TlsFiles,
};
use tally_witness::cosigning::{CosignerConfig, Cosigning, CosigningConfig};
use tally_witness::server::{self, files, ServeOptions};

/// Arguments of `tally serve`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// A TOML config file (keys as in docs/operations.md); flags override it.
    #[arg(long, env = "TALLY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on (port 0 picks a free port, printed at start).
    #[arg(long, env = "TALLY_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// The data folder (log, keys, registry); created on first start.
    #[arg(long, env = "TALLY_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Where the log is kept: `redb` (log.redb in the data folder) or a
    /// PostgreSQL URL, postgres://user@host:port/database (docs/operations.md
    /// "Running on PostgreSQL"), where the registry and the console's links
    /// then are too; the key files stay in the data folder [default: redb].
    /// TLS as libpq: `?sslmode=verify-full&sslrootcert=ca.pem` checks the
    /// server's certificate and name (sslmode disable, prefer (default),
    /// require, verify-ca, verify-full; without sslrootcert, the Mozilla
    /// roots built into tally).
    #[arg(
        long,
        env = "TALLY_STORE",
        hide_env_values = true,
        value_name = "redb|postgres://..."
    )]
    pub store: Option<StoreChoice>,
    /// PostgreSQL store: seconds the sequencer's lease lasts unrenewed.
    /// Every `tally serve` on the database admits records and serves reads;
    /// only the lease holder sequences and signs, and another takes over at
    /// most this long after it dies (at once after a clean stop). A front
    /// waits at most twice this plus 2 s for the sequencer's answer, then
    /// answers 503 sequencer_unavailable [default: 10].
    #[arg(long, value_name = "SECS")]
    pub lease_ttl: Option<u64>,
    /// The checkpoint origin (and log key name) of a new log [default:
    /// tally.local/log/ and 8 random hex digits, one of its own per install].
    #[arg(long)]
    pub origin: Option<String>,
    /// Largest |witness clock - record time| admitted, in seconds [default: 300].
    #[arg(long)]
    pub max_skew: Option<u64>,
    /// Largest request body in bytes [default and maximum: 131072].
    #[arg(long)]
    pub max_body_bytes: Option<usize>,
    /// Most record admissions in flight; beyond it 503 overloaded [default: 4096].
    #[arg(long)]
    pub max_in_flight: Option<usize>,
    /// Records per second per API key (token bucket); 0 turns the limit off
    /// [default: 5000].
    #[arg(long)]
    pub rate_limit: Option<f64>,
    /// Token bucket size per API key [default: 2 x rate limit].
    #[arg(long)]
    pub rate_burst: Option<u32>,
    /// Records a project may have checked per UTC day; past it 429
    /// quota_exceeded; 0: no quota [default: no quota].
    #[arg(long, value_name = "N")]
    pub project_records_per_day: Option<u64>,
    /// Canonical record bytes a project may have checked per UTC day; past
    /// it 429 quota_exceeded; 0: no quota [default: no quota].
    #[arg(long, value_name = "BYTES")]
    pub project_bytes_per_day: Option<u64>,
    /// Appends that may wait for the log's writer [default: 8192].
    #[arg(long)]
    pub queue_capacity: Option<usize>,
    /// Most records per group commit [default: 2048].
    #[arg(long)]
    pub max_batch: Option<usize>,
    /// The log store's page cache in MiB: memory the server uses for reads
    /// (exports, proofs) stays within it; the OS page cache holds the rest
    /// [default: 64].
    #[arg(long)]
    pub cache_mib: Option<usize>,
    /// Seconds to let in-flight requests finish on SIGTERM [default: 30].
    #[arg(long)]
    pub drain_timeout: Option<u64>,
    /// Mark the console's session cookies Secure although this server speaks
    /// plain HTTP: set it when a TLS proxy in front of it serves the console
    /// (with --tls-cert they always are).
    #[arg(long)]
    pub secure_cookies: bool,
    /// Who may read the log: `public` (anyone: tiles, proofs, /checkpoint
    /// and /metrics need no token, as for any C2SP log) or `token` (only
    /// holders of a read token from `tally read-token create`; see
    /// docs/operations.md "Who can read the log") [default: public].
    #[arg(long, value_name = "public|token")]
    pub log_read: Option<LogRead>,
    /// TLS certificate chain (PEM); with --tls-key, serve HTTPS.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    #[command(flatten)]
    pub connections: ConnArgs,
    #[command(flatten)]
    pub cosigning: CosignArgs,
}

/// The cosigners `tally serve` asks (docs/operations.md "Cosigners for the log";
/// config file `[[cosigner]]` and `[cosigning]`).
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Cosigners (docs/operations.md \"Cosigners for the log\")")]
pub(crate) struct CosignArgs {
    /// A C2SP tlog-witness to ask for a cosignature of each new checkpoint,
    /// as name=NAME,vkey=VKEY,url=URL (VKEY: the cosigner's cosignature/v1
    /// key, as `tally cosigner` prints it; URL: its submission prefix).
    /// Repeat for more; added to the config file's [[cosigner]] tables.
    #[arg(long, value_name = "name=N,vkey=K,url=U")]
    pub cosigner: Vec<String>,
    /// Seconds each add-checkpoint request may take [default: 10].
    #[arg(long, value_name = "SECS")]
    pub cosigner_timeout: Option<u64>,
    /// Seconds the latest checkpoint may lack a cosigner's cosignature
    /// before /metrics and the console flag that cosigner stale
    /// [default: 300].
    #[arg(long, value_name = "SECS")]
    pub cosigned_max_age: Option<u64>,
    /// Seconds an export (pack, head.json) waits for the cosigners to be
    /// asked about the latest checkpoint; then it goes with the cosignatures
    /// it has [default: 10].
    #[arg(long, value_name = "SECS")]
    pub export_cosign_wait: Option<u64>,
}

impl CosignArgs {
    /// Applies the flags given over `c`.
    fn apply(&self, c: &mut CosigningConfig) -> Result<(), String> {
        for text in &self.cosigner {
            c.cosigners.push(CosignerConfig::parse_option(text)?);
        }
        if let Some(v) = self.cosigner_timeout {
            c.timeout = Duration::from_secs(v);
        }
        if let Some(v) = self.cosigned_max_age {
            c.max_age = Duration::from_secs(v);
        }
        if let Some(v) = self.export_cosign_wait {
            c.export_wait = Duration::from_secs(v);
        }
        c.check()
    }
}

/// Connection limits and timeouts of `tally serve` (docs/operations.md
/// "Connections"; config file table `[connections]`).
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Connections (docs/operations.md \"Connections\")")]
pub(crate) struct ConnArgs {
    /// Most open connections; at the cap a new one closes the connection
    /// that has waited longest for a request, else the oldest
    /// unauthenticated one. Lowered to fit the open-file limit, which is
    /// raised to its hard limit at start [default: 10000].
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Most unauthenticated connections one client address (IPv4 address,
    /// IPv6 /64) holds; its next one closes its oldest [default: 1000].
    #[arg(long)]
    pub max_connections_per_client: Option<usize>,
    /// Largest request head (HTTP/1.1) or header list (HTTP/2) in bytes,
    /// 8192 to 65536; a larger one is answered 431 [default: 16384].
    #[arg(long)]
    pub max_header_bytes: Option<usize>,
    /// Seconds a new connection has to deliver its first request head, and
    /// any request head has from its first byte [default: 10].
    #[arg(long, value_name = "SECS")]
    pub header_timeout: Option<u64>,
    /// Seconds a connection may wait for its next request with none in
    /// flight [default: 30].
    #[arg(long, value_name = "SECS")]
    pub idle_timeout: Option<u64>,
    /// Seconds a request body has from its head, plus --body-min-rate;
    /// a late body is answered 408 body_timeout [default: 10].
    #[arg(long, value_name = "SECS")]
    pub body_timeout: Option<u64>,
    /// Bytes per second that earn a body one more second past
    /// --body-timeout (so a large upload that keeps arriving is not cut
    /// off); 0: a fixed deadline [default: 8192].
    #[arg(long, value_name = "BYTES_PER_SEC")]
    pub body_min_rate: Option<u64>,
    /// Seconds a connection's writes may make no progress (a client that
    /// does not read its answers) before it is closed [default: 30].
    #[arg(long, value_name = "SECS")]
    pub write_timeout: Option<u64>,
    /// Seconds the TLS handshake may take [default: 10].
    #[arg(long, value_name = "SECS")]
    pub tls_handshake_timeout: Option<u64>,
    /// Most concurrent HTTP/2 streams per connection [default: 64].
    #[arg(long)]
    pub h2_max_streams: Option<u32>,
}

impl ConnArgs {
    /// Applies the flags given over `limits`.
    fn apply(&self, limits: &mut ConnLimits) {
        let secs = Duration::from_secs;
        if let Some(v) = self.max_connections {
            limits.max_connections = v;
        }
        if let Some(v) = self.max_connections_per_client {
            limits.max_connections_per_client = v;
        }
        if let Some(v) = self.max_header_bytes {
            limits.max_header_bytes = v;
        }
        if let Some(v) = self.header_timeout {
            limits.header_timeout = secs(v);
        }
        if let Some(v) = self.idle_timeout {
            limits.idle_timeout = secs(v);
        }
        if let Some(v) = self.body_timeout {
            limits.body_timeout = secs(v);
        }
        if let Some(v) = self.body_min_rate {
            limits.body_min_rate = v;
        }
        if let Some(v) = self.write_timeout {
            limits.write_timeout = secs(v);
        }
        if let Some(v) = self.tls_handshake_timeout {
            limits.tls_handshake_timeout = secs(v);
        }
        if let Some(v) = self.h2_max_streams {
            limits.h2_max_streams = v;
        }
    }
}

impl Args {
    /// Defaults, then the config file, then flags; and whether the store
    /// was given (by the file, `--store` or `TALLY_STORE`) or is the default.
    fn config(&self) -> anyhow::Result<(ServeConfig, Option<String>, bool)> {
        let mut c = ServeConfig::default();
        let mut origin = None;
        let mut store_given = self.store.is_some();
        if let Some(path) = &self.config {
            let file = ConfigFile::load(path)?;
            origin.clone_from(&file.origin);
            store_given |= file.store.is_some();
            file.apply_cosigning(&mut c.cosigning)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            c.apply_file(file);
        }
        if let Some(v) = self.listen {
            c.listen = v;
        }
        if let Some(v) = &self.data_dir {
            c.data_dir.clone_from(v);
        }
        if let Some(v) = &self.store {
            c.store.clone_from(v);
        }
        if let Some(v) = self.lease_ttl {
            c.lease_ttl = Duration::from_secs(v.max(1));
        }
        if let Some(v) = &self.origin {
            origin = Some(v.clone());
        }
        if let Some(v) = self.max_skew {
            c.witness.max_skew_ms = v.saturating_mul(1000);
        }
        if let Some(v) = self.max_body_bytes {
            c.witness.max_body_bytes = v.min(tally_schemas::limits::MAX_WIRE_OBJECT_BYTES);
        }
        if let Some(v) = self.max_in_flight {
            c.witness.max_in_flight = v.max(1);
        }
        if let Some(per_second) = self.rate_limit {
            c.witness.rate_limit = (per_second > 0.0).then(|| RateLimit {
                per_second,
                burst: self
                    .rate_burst
                    .unwrap_or((per_second * 2.0).ceil().min(f64::from(u32::MAX)) as u32),
            });
        } else if let (Some(burst), Some(rl)) = (self.rate_burst, c.witness.rate_limit.as_mut()) {
            rl.burst = burst;
        }
        if let Some(v) = self.project_records_per_day {
            c.witness.project_quota.records_per_day = (v > 0).then_some(v);
        }
        if let Some(v) = self.project_bytes_per_day {
            c.witness.project_quota.bytes_per_day = (v > 0).then_some(v);
        }
        if let Some(v) = self.queue_capacity {
            c.log.queue_capacity = v.max(1);
        }
        if let Some(v) = self.max_batch {
            c.log.max_batch = v.max(1);
        }
        if let Some(v) = self.cache_mib {
            c.log.cache_bytes = tally_witness::config::mib(v);
        }
        if let Some(v) = self.drain_timeout {
            c.drain_timeout_secs = v;
        }
        if self.secure_cookies {
            c.secure_cookies = true;
        }
        if let Some(v) = self.log_read {
            c.witness.log_read = v;
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            c.tls = Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
            });
        }
        if let Some(o) = &origin {
            c.origin.clone_from(o);
        }
        self.connections.apply(&mut c.connections);
        c.connections.check().map_err(anyhow::Error::msg)?;
        self.cosigning
            .apply(&mut c.cosigning)
            .map_err(anyhow::Error::msg)?;
        Ok((c, origin, store_given))
    }
}

/// Runs `tally serve` until SIGTERM or Ctrl-C.
///
/// # Errors
/// Configuration, data folder, bind or TLS errors (exit 2).
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    super::init_server_logs();
    let (config, origin, store_given) = args.config()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(config, origin, store_given))
}

/// Settles where the data folder's log is (docs/operations.md, "Running on
/// PostgreSQL"): a store given explicitly is used, unless it is `redb` in
/// a folder whose log moved to PostgreSQL (refused, naming the database:
/// its `log.redb` stopped growing then, and serving it would roll the log
/// back); no store given means the one the folder records, else `redb`.
/// Returns the PostgreSQL URL to record once the folder is open, when it
/// is not already the recorded one.
fn where_the_log_is(config: &mut ServeConfig, store_given: bool) -> anyhow::Result<Option<String>> {
    let dir = config.data_dir.clone();
    let recorded = data_folder::recorded_store(&dir)?;
    let file = dir.join(data_folder::STORE_FILE);
    match (&config.store, recorded) {
        (StoreChoice::Redb, Some(url)) if store_given => Err(anyhow::anyhow!(
            "the log of {} moved to PostgreSQL at {} (recorded in {}): its log.redb is an old copy, and serving it would roll the log back. Serve without --store (or with --store '{}'); only if nothing was ever served from that database, delete {} to serve log.redb again",
            dir.display(),
            redact_url(&url),
            file.display(),
            redact_url(&url),
            file.display()
        )),
        (StoreChoice::Redb, Some(url)) => {
            outln!(
                "tally: the log of {} is in PostgreSQL at {} (recorded in {}): serving it from there",
                dir.display(),
                redact_url(&url),
                file.display()
            )?;
            config.store = StoreChoice::Postgres(url);
            Ok(None)
        }
        (StoreChoice::Postgres(url), recorded) if recorded.as_deref() != Some(url.as_str()) => {
            Ok(Some(url.clone()))
        }
        _ => Ok(None),
    }
}

/// The accept backlog of the listening socket (tokio's own default).
const LISTEN_BACKLOG: u32 = 1024;

/// A TCP socket bound to `addr` but not yet listening, with `SO_REUSEADDR`
/// as `TcpListener::bind` sets it on Unix (a restart is not refused by
/// connections of the last run still in TIME_WAIT).
fn bind_socket(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpSocket> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

async fn serve(
    mut config: ServeConfig,
    origin: Option<String>,
    store_given: bool,
) -> anyhow::Result<ExitCode> {
    let shutdown = shutdown_signal();
    // Everything that can fail without the data folder fails before it is
    // touched: bad TLS files, a port in use.
    let tls = config.tls.as_ref().map(server::tls_config).transpose()?;
    if let Some(nofile) = server::raise_open_file_limit() {
        if let Some(configured) = config.connections.fit_to_file_limit(nofile) {
            tracing::warn!(
                "lowering the connection cap from {configured} to {}: the open-file limit is {nofile} (raise it with `ulimit -n` or systemd's LimitNOFILE=)",
                config.connections.max_connections
            );
        }
    }
    // The address is bound now (a port in use fails here, before the data
    // folder is touched) but connections are refused until the folder is
    // ready and `listen` is called below: a client that waits for the port
    // to accept finds the admin token and the first API key already written.
    let socket = match bind_socket(config.listen) {
        Ok(s) => s,
        Err(e) => {
            // A second `serve` on the same folder and port meets the port
            // first: name the one that holds both, as the lock would.
            if e.kind() == std::io::ErrorKind::AddrInUse {
                if let Some(who) = data_folder::holder(&config.data_dir) {
                    anyhow::bail!(
                        "{who} is using the data folder {} (and the address {} is in use); stop it first, or give this one another --data-dir and --listen",
                        config.data_dir.display(),
                        config.listen
                    );
                }
            }
            return Err(e).with_context(|| format!("listening on {}", config.listen));
        }
    };
    let addr = socket.local_addr().context("reading the bound address")?;
    // Locked for this process; a first start that fails from here on
    // removes what it made (see data_folder).
    let mut folder = DataFolder::claim(&config.data_dir)?;
    if let Some(notice) = folder.notice() {
        outln!("tally: {notice}")?;
    }
    let record_store = where_the_log_is(&mut config, store_given)?;
    let opened = server::open(
        &config,
        origin.as_deref(),
        Arc::new(SystemClock),
        Box::new(OsRng),
    )
    .with_context(|| format!("opening the data folder {}", config.data_dir.display()))?;
    if let Some(url) = record_store {
        data_folder::record_store(&config.data_dir, &url, "recorded by `tally serve --store`")?;
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://{addr}");
    let witness = Arc::clone(&opened.witness);
    let log = Arc::clone(witness.log());
    let console = tally_console::Console::open_on(
        Arc::clone(&witness),
        &config.data_dir,
        &config.store,
        tls.is_some() || config.secure_cookies,
    )?;
    let listener = socket
        .listen(LISTEN_BACKLOG)
        .with_context(|| format!("listening on {addr}"))?;
    if let Some(first) = &opened.first_start {
        let vkey = log.verifier().vkey();
        outln!(
            "tally: first start; created the data folder {}",
            config.data_dir.display()
        )?;
        outln!()?;
        outln!("  project       default")?;
        outln!("  API key       {}", first.api_key.token)?;
        outln!("                (shown once: it is stored only as a hash; keep it now)")?;
        outln!("  witness key   {vkey}")?;
        outln!("  origin        {}", log.origin())?;
        outln!(
            "  admin token   in {} (mode 0600)",
            config.data_dir.join(files::ADMIN_TOKEN).display()
        )?;
        outln!()?;
        outln!("next: register an agent and post records:")?;
        outln!(
            "  export TALLY_WITNESS_URL={url} TALLY_API_KEY={}",
            first.api_key.token
        )?;
        outln!("  tally agent init claims-bot --witness {url} --api-key $TALLY_API_KEY")?;
        outln!("  tally agent add claims-bot --public-key <the public key it printed>")?;
        outln!("console: {url}/console (log in with the API key)")?;
        outln!()?;
    }
    folder.first_start_done()?;
    if opened.first_start.is_some() {
        // On PostgreSQL: no other front makes the default project anew.
        witness.registry().first_start_shown()?;
    }
    let tree_size = log.latest_checkpoint().checkpoint.size;
    let shared_elsewhere = witness
        .registry()
        .first_start_place()
        .filter(|p| witness.registry().is_shared() && Path::new(&p.data_dir) != config.data_dir);
    if let (None, Some(place)) = (&opened.first_start, &shared_elsewhere) {
        outln!(
            "tally: the registry is in PostgreSQL and was set up by the first start on {} (data folder {}): the default project's API key was shown there once, and the admin token is in its admin.token; copy that file to {} (or give --admin-token) for `tally project` and `tally read-token` here",
            place.host,
            place.data_dir,
            config.data_dir.join(files::ADMIN_TOKEN).display()
        )?;
    } else if opened.first_start.is_none() && tree_size.get() == 0 {
        outln!(
            "tally: no records yet; the default project's API key was shown once, on the first start: if it is lost, make another with `tally project new-key default` (admin token in {})",
            config.data_dir.join(files::ADMIN_TOKEN).display()
        )?;
    }
    if config.witness.log_read == LogRead::Token {
        outln!("tally: the log (tiles, proofs, /checkpoint, /metrics) is readable with a read token only; make one with `tally read-token create`")?;
    }
    if !config.cosigning.cosigners.is_empty() {
        let cosigning = Arc::new(
            Cosigning::new(Arc::clone(&log), config.cosigning.clone())
                .map_err(anyhow::Error::msg)?,
        );
        witness.set_cosigning(Arc::clone(&cosigning));
        let names: Vec<&str> = config
            .cosigning
            .cosigners
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        let which = if matches!(config.store, StoreChoice::Postgres(_)) {
            " (while this front sequences; while another does, serving the cosignatures it stores)"
        } else {
            ""
        };
        outln!(
            "tally: asking cosigners {} for cosignatures{which}",
            names.join(", ")
        )?;
        tokio::spawn(cosigning.run());
    }
    if let StoreChoice::Postgres(url) = &config.store {
        outln!(
            "tally: the log is in PostgreSQL: {} (with the registry and the console's links)",
            config.store
        )?;
        if let Some(warning) = tally_log::store::postgres::Connector::parse(url, "tally")
            .ok()
            .and_then(|c| c.unverified_warning())
        {
            outln!("tally: warning: {warning}")?;
        }
    }
    outln!(
        "tally: listening on {url} (origin {}, tree size {tree_size}); console at {url}/console",
        log.origin(),
    )?;

    let connection_stats = Arc::clone(witness.metrics().connections());
    let app = tally_witness::refusal_log::with_refusal_log(
        tally_witness::http::router(Arc::clone(&witness)).merge(tally_console::router(console)),
        Arc::clone(&witness),
    );
    let options = ServeOptions {
        tls,
        limits: config.connections.clone(),
        stats: connection_stats,
        drain: Duration::from_secs(config.drain_timeout_secs),
    };
    server::serve(listener, app, options, shutdown).await;
    tracing::info!("drained; stopping the log");
    server::stop_log(log).await;
    outln!("tally: stopped")?;
    Ok(ExitCode::SUCCESS)
}

/// The future that resolves on SIGTERM or Ctrl-C. The SIGTERM handler is
/// installed when this is called, not when the future is first polled:
/// `serve` calls it before it prints anything, so a SIGTERM sent as soon as
/// the "listening" line appears (as service managers and scripts do) stops
/// the server gracefully instead of killing it with the signal's default
/// action.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    async move {
        #[cfg(unix)]
        match term {
            Some(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("shutdown requested: no new connections; draining in-flight requests");
    }
}
