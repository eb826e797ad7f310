//! How tally connects to PostgreSQL (docs/operations.md, "Running on
//! PostgreSQL", "TLS to the database"): the connection URL (or libpq
//! key/value string) with libpq's `sslmode` and `sslrootcert`, and the
//! rustls connector every connection of the log's store, its LISTEN
//! connections and the registry's store uses.
//!
//! tokio-postgres parses the URL but knows only `disable`, `prefer` and
//! `require`, and no `sslrootcert`; those two parameters are taken out
//! here and the rest is left to it. The certificate checks are rustls's
//! (ring provider, the one rustls in the tree): `verify-full` is its
//! standard web PKI verifier; `verify-ca` checks the chain the same way
//! but not the host name; `prefer` and `require` without `sslrootcert`
//! check neither (libpq's meaning), only the handshake's signatures.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};
use tokio_postgres::{Client, Config, Connection, Socket};

/// libpq's `sslmode`, as tally implements it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// No TLS.
    Disable,
    /// TLS if the server offers it, else plain; the certificate is not
    /// checked (unless `sslrootcert` is given). Protects against a
    /// passive eavesdropper only when the server has TLS, and against no
    /// active attacker, who can refuse TLS or present any certificate.
    Prefer,
    /// TLS or no connection; the certificate is not checked (unless
    /// `sslrootcert` is given): encrypted against a passive eavesdropper,
    /// not against an active attacker.
    Require,
    /// TLS, and the server's certificate must chain to a trusted root; its
    /// host name is not checked.
    VerifyCa,
    /// TLS, a certificate that chains to a trusted root and names the host
    /// connected to (DNS name, or IP address in the certificate).
    VerifyFull,
}

impl SslMode {
    /// The default when the URL names none: libpq's, so that a URL means
    /// the same to tally as to psql (docs/operations.md says why).
    pub const DEFAULT: Self = Self::Prefer;

    /// The libpq spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }

    fn parse(value: &str) -> Result<Self, String> {
        Ok(match value {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            "allow" => {
                return Err(
                    "sslmode=allow is not supported (it tries without TLS first): \
                     use prefer, require, verify-ca or verify-full, or disable"
                        .into(),
                )
            }
            other => {
                return Err(format!(
                "sslmode={other:?} is not one of disable, prefer, require, verify-ca, verify-full"
            ))
            }
        })
    }

    /// Whether the server's certificate chain is checked.
    fn checks_chain(self, rootcert: bool) -> bool {
        match self {
            Self::Disable => false,
            // libpq: with a root certificate file, prefer and require check
            // the chain as verify-ca does.
            Self::Prefer | Self::Require => rootcert,
            Self::VerifyCa | Self::VerifyFull => true,
        }
    }
}

/// Where the trusted roots come from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Roots {
    /// Mozilla's roots built into tally (the webpki-roots crate).
    Builtin,
    /// A PEM bundle named by `sslrootcert`.
    File(PathBuf),
}

/// A parsed connection string and the TLS it asks for: what every
/// PostgreSQL connection of tally is made with.
#[derive(Clone)]
pub struct Connector {
    config: Config,
    mode: SslMode,
    roots: Roots,
    tls: MakeRustls,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("mode", &self.mode)
            .field("roots", &self.roots)
            .finish_non_exhaustive()
    }
}

/// The connection a [`Connector`] makes (drive it on a runtime).
pub type PgConnection = Connection<Socket, PgTlsStream>;

impl Connector {
    /// Parses `url` (a `postgres://` URL or a libpq key/value string) with
    /// its `sslmode` (default [`SslMode::DEFAULT`]) and `sslrootcert` (a
    /// PEM file of CA certificates; without it the roots built into tally),
    /// reading the root file at once. `application_name` is set to `app`.
    ///
    /// # Errors
    /// A message (without the URL, which the caller names redacted) when
    /// the string does not parse, `sslmode` is not one tally supports, or
    /// the root file cannot be read or holds no certificate.
    pub fn parse(url: &str, app: &str) -> Result<Self, String> {
        let (rest, params) = take_tls_params(url)?;
        let mode = match &params.sslmode {
            Some(m) => SslMode::parse(m)?,
            None => SslMode::DEFAULT,
        };
        let mut config: Config = rest
            .parse()
            .map_err(|e: tokio_postgres::Error| e.to_string())?;
        config.ssl_mode(match mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        config.application_name(app);
        let roots = match params.sslrootcert.as_deref() {
            None | Some("") => Roots::Builtin,
            Some("system") => {
                return Err(
                    "sslrootcert=system is not supported: leave sslrootcert out to \
                     check against the Mozilla roots built into tally, or name a PEM file \
                     (for the system's roots on Debian: /etc/ssl/certs/ca-certificates.crt)"
                        .into(),
                )
            }
            Some(path) => Roots::File(PathBuf::from(path)),
        };
        let tls = MakeRustls::new(mode, &roots)?;
        Ok(Self {
            config,
            mode,
            roots,
            tls,
        })
    }

    /// The `sslmode` in force.
    #[must_use]
    pub fn ssl_mode(&self) -> SslMode {
        self.mode
    }

    /// What the connection's TLS checks, for messages: `sslmode=verify-full,
    /// roots from ca.pem`.
    #[must_use]
    pub fn describe(&self) -> String {
        let roots = match &self.roots {
            Roots::Builtin => "the Mozilla roots built into tally".to_owned(),
            Roots::File(p) => p.display().to_string(),
        };
        let rootcert = matches!(self.roots, Roots::File(_));
        match self.mode {
            SslMode::Disable => "sslmode=disable".into(),
            m if !m.checks_chain(rootcert) => {
                format!("sslmode={}, server certificate not checked", m.as_str())
            }
            SslMode::VerifyFull => format!("sslmode=verify-full, roots from {roots}"),
            m => format!(
                "sslmode={}, roots from {roots}, host name not checked",
                m.as_str()
            ),
        }
    }

    /// A warning for the operator when the connection goes beyond this
    /// machine without a checked certificate (anyone on the path could
    /// read or change what tally stores); `None` for verify-ca/verify-full
    /// and for loopback and Unix-socket hosts.
    #[must_use]
    pub fn unverified_warning(&self) -> Option<String> {
        let rootcert = matches!(self.roots, Roots::File(_));
        if self.mode.checks_chain(rootcert) {
            return None;
        }
        let mut remote: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .filter_map(|h| match h {
                tokio_postgres::config::Host::Tcp(name) => {
                    let local = name == "localhost"
                        || name
                            .parse::<std::net::IpAddr>()
                            .is_ok_and(|ip| ip.is_loopback());
                    (!local).then(|| name.clone())
                }
                tokio_postgres::config::Host::Unix(_) => None,
            })
            .collect();
        // hostaddr is where the connection goes, whatever host says.
        let addrs = self.config.get_hostaddrs();
        if !addrs.is_empty() {
            remote = addrs
                .iter()
                .filter(|ip| !ip.is_loopback())
                .map(ToString::to_string)
                .collect();
        }
        if remote.is_empty() {
            return None;
        }
        Some(format!(
            "the connection to PostgreSQL at {} is not authenticated ({}): anyone on the network \
             path can read and change what tally stores; use sslmode=verify-full \
             (docs/operations.md, \"TLS to the database\")",
            remote.join(", "),
            self.describe()
        ))
    }

    /// Connects; the caller drives the returned connection.
    ///
    /// # Errors
    /// The driver's error (see [`Connector::explain`]).
    pub async fn connect(&self) -> Result<(Client, PgConnection), tokio_postgres::Error> {
        self.config.connect(self.tls.clone()).await
    }

    /// A connection error as a message: a server error with its SQLSTATE,
    /// anything else (unreachable, TLS refused or failed) with what the
    /// TLS settings were.
    #[must_use]
    pub fn explain(&self, e: &tokio_postgres::Error) -> String {
        match e.as_db_error() {
            Some(db) => format!("postgresql: {} ({})", db.message(), db.code().code()),
            None => {
                // The driver's message names the step; its causes say why.
                let mut text = format!("postgresql ({}): {e}", self.describe());
                let mut cause = std::error::Error::source(e);
                while let Some(c) = cause {
                    let line = c.to_string();
                    if !text.ends_with(&line) {
                        text.push_str(": ");
                        text.push_str(&line);
                    }
                    cause = c.source();
                }
                text
            }
        }
    }
}

/// The `sslmode` and `sslrootcert` values taken out of a connection string.
#[derive(Debug, Default, PartialEq, Eq)]
struct TlsParams {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
}

/// Splits `sslmode` and `sslrootcert` off `url`: the rest, for
/// tokio-postgres, and their values (the last of each, as libpq takes).
fn take_tls_params(url: &str) -> Result<(String, TlsParams), String> {
    let mut params = TlsParams::default();
    let mut take = |key: &str, value: String| match key {
        "sslmode" => {
            params.sslmode = Some(value);
            true
        }
        "sslrootcert" => {
            params.sslrootcert = Some(value);
            true
        }
        _ => false,
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            None => url.to_owned(),
            Some((base, query)) => {
                let kept: Vec<&str> = query
                    .split('&')
                    .filter(|pair| {
                        let (k, v) = pair.split_once('=').unwrap_or((*pair, ""));
                        !take(&percent_decode(k), percent_decode(v))
                    })
                    .collect();
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        let mut rest = String::new();
        for pair in key_value_pairs(url)? {
            if !take(&pair.key, pair.value) {
                rest.push_str(&url[pair.span.0..pair.span.1]);
                rest.push(' ');
            }
        }
        rest
    };
    Ok((rest, params))
}

/// `%XX` escapes decoded (bytes that do not form UTF-8 are replaced; a
/// `%` not followed by two hex digits is kept).
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// One `key = value` of a libpq key/value string, with where it is.
struct Pair {
    key: String,
    value: String,
    span: (usize, usize),
}

/// The pairs of a libpq key/value string: `key = value`, whitespace
/// between pairs, a value either bare (backslash escapes) or in single
/// quotes (`\'` and `\\` inside).
fn key_value_pairs(s: &str) -> Result<Vec<Pair>, String> {
    let b = s.as_bytes();
    let mut pairs = Vec::new();
    let mut i = 0;
    let skip_ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    loop {
        skip_ws(&mut i);
        if i >= b.len() {
            return Ok(pairs);
        }
        let start = i;
        while i < b.len() && b[i] != b'=' && !b[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = s[start..i].to_owned();
        skip_ws(&mut i);
        if i >= b.len() || b[i] != b'=' {
            return Err(format!(
                "missing \"=\" after {key:?} in the connection string"
            ));
        }
        i += 1;
        skip_ws(&mut i);
        let mut value = Vec::new();
        if i < b.len() && b[i] == b'\'' {
            i += 1;
            loop {
                match b.get(i) {
                    None => return Err("unterminated quoted value in the connection string".into()),
                    Some(b'\'') => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') if i + 1 < b.len() => {
                        value.push(b[i + 1]);
                        i += 2;
                    }
                    Some(&c) => {
                        value.push(c);
                        i += 1;
                    }
                }
            }
        } else {
            while i < b.len() && !b[i].is_ascii_whitespace() {
                if b[i] == b'\\' && i + 1 < b.len() {
                    i += 1;
                }
                value.push(b[i]);
                i += 1;
            }
        }
        pairs.push(Pair {
            key,
            value: String::from_utf8_lossy(&value).into_owned(),
            span: (start, i),
        });
    }
}

/// Hides the password of a connection string, for messages: the
/// `user:password@` of a URL, and a `password` parameter in a URL's query
/// or a key/value string.
#[must_use]
pub(crate) fn redact(url: &str) -> String {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let (base, query) = match url.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (url, None),
        };
        let base = match (base.find("://"), base.rfind('@')) {
            (Some(s), Some(at)) if at > s => {
                let user_pass = &base[s + 3..at];
                match user_pass.find(':') {
                    Some(c) => format!("{}{}:***{}", &base[..s + 3], &user_pass[..c], &base[at..]),
                    None => base.to_owned(),
                }
            }
            _ => base.to_owned(),
        };
        match query {
            None => base,
            Some(q) => {
                let q: Vec<String> = q
                    .split('&')
                    .map(|pair| match pair.split_once('=') {
                        Some((k, _)) if percent_decode(k) == "password" => format!("{k}=***"),
                        _ => pair.to_owned(),
                    })
                    .collect();
                format!("{base}?{}", q.join("&"))
            }
        }
    } else {
        match key_value_pairs(url) {
            Ok(pairs) => {
                let mut out = String::new();
                for p in pairs {
                    if p.key == "password" {
                        out.push_str("password=***");
                    } else {
                        out.push_str(&url[p.span.0..p.span.1]);
                    }
                    out.push(' ');
                }
                out.trim_end().to_owned()
            }
            // It does not parse: show nothing of it past a password key.
            Err(_) => match url.find("password") {
                Some(at) => format!("{}password=***", &url[..at]),
                None => url.to_owned(),
            },
        }
    }
}

/// Reads a PEM bundle of CA certificates into a root store.
fn read_roots(path: &Path) -> Result<RootCertStore, String> {
    let text = std::fs::read(path)
        .map_err(|e| format!("sslrootcert {}: cannot read it: {e}", path.display()))?;
    let mut roots = RootCertStore::empty();
    let mut n = 0usize;
    for cert in CertificateDer::pem_slice_iter(&text) {
        let cert = cert.map_err(|e| {
            format!(
                "sslrootcert {}: not a PEM certificate file: {e}",
                path.display()
            )
        })?;
        roots.add(cert).map_err(|e| {
            format!(
                "sslrootcert {}: a certificate in it is not usable as a root: {e}",
                path.display()
            )
        })?;
        n += 1;
    }
    if n == 0 {
        return Err(format!(
            "sslrootcert {}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(roots)
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls client configuration for `mode` and `roots`.
fn client_config(mode: SslMode, roots: &Roots) -> Result<ClientConfig, String> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS settings: {e}"))?;
    let rootcert = matches!(roots, Roots::File(_));
    if !mode.checks_chain(rootcert) {
        return Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unchecked(provider)))
            .with_no_client_auth());
    }
    let store = match roots {
        Roots::Builtin => RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        },
        Roots::File(path) => read_roots(path)?,
    };
    if mode == SslMode::VerifyFull {
        return Ok(builder.with_root_certificates(store).with_no_client_auth());
    }
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ChainOnly {
            roots: store,
            provider,
        }))
        .with_no_client_auth())
}

/// `prefer`/`require` without roots: any certificate, but the handshake's
/// signatures are still checked against it (a passive eavesdropper learns
/// nothing; an active attacker is not kept out, as with libpq).
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain to a trusted root, validity dates and key usage,
/// exactly as rustls's web PKI verifier checks them, but not the name.
#[derive(Debug)]
struct ChainOnly {
    roots: RootCertStore,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// tokio-postgres's `MakeTlsConnect` over rustls. A Unix-socket host has
/// no name: the connector is still made (tokio-postgres makes it before it
/// knows whether TLS is needed; PostgreSQL never offers TLS on a Unix
/// socket) and refuses only if a handshake is attempted.
#[derive(Clone)]
struct MakeRustls {
    config: Arc<ClientConfig>,
}

impl MakeRustls {
    fn new(mode: SslMode, roots: &Roots) -> Result<Self, String> {
        if mode == SslMode::Disable {
            // Never used for a handshake; no roots file is read.
            return client_config(SslMode::Require, &Roots::Builtin).map(|c| Self {
                config: Arc::new(c),
            });
        }
        Ok(Self {
            config: Arc::new(client_config(mode, roots)?),
        })
    }
}

impl MakeTlsConnect<Socket> for MakeRustls {
    type Stream = PgTlsStream;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsConnect, io::Error> {
        Ok(RustlsConnect {
            config: Arc::clone(&self.config),
            name: ServerName::try_from(domain.to_owned()).ok(),
            domain: domain.to_owned(),
        })
    }
}

/// One connection's TLS handshake.
pub(crate) struct RustlsConnect {
    config: Arc<ClientConfig>,
    name: Option<ServerName<'static>>,
    domain: String,
}

impl TlsConnect<Socket> for RustlsConnect {
    type Stream = PgTlsStream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<PgTlsStream>> + Send>>;

    fn connect(self, stream: Socket) -> Self::Future {
        Box::pin(async move {
            let Some(name) = self.name else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{:?} is not a host name for TLS", self.domain),
                ));
            };
            let connector = tokio_rustls::TlsConnector::from(self.config);
            connector.connect(name, stream).await.map(PgTlsStream)
        })
    }
}

/// A TLS stream to PostgreSQL. It offers no channel binding
/// (SCRAM-SHA-256-PLUS), so `channel_binding=require` fails with it.
pub struct PgTlsStream(tokio_rustls::client::TlsStream<Socket>);

impl tokio_postgres::tls::TlsStream for PgTlsStream {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl AsyncRead for PgTlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for PgTlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_and_sslrootcert_are_taken_out_of_a_url() {
        let (rest, p) = take_tls_params(
            "postgres://u:pw@db:5432/tally?sslmode=verify-full&connect_timeout=3&sslrootcert=%2Ftmp%2Fa%20b.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u:pw@db:5432/tally?connect_timeout=3");
        assert_eq!(p.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(p.sslrootcert.as_deref(), Some("/tmp/a b.pem"));
        let (rest, p) = take_tls_params("postgres://db/tally?sslmode=require").unwrap();
        assert_eq!(rest, "postgres://db/tally");
        assert_eq!(p.sslmode.as_deref(), Some("require"));
    }

    #[test]
    fn sslmode_and_sslrootcert_are_taken_out_of_a_key_value_string() {
        let (rest, p) = take_tls_params(
            "host=db sslmode = verify-ca  sslrootcert='/tmp/it\\'s.pem' dbname=tally",
        )
        .unwrap();
        assert_eq!(rest, "host=db dbname=tally ");
        assert_eq!(p.sslmode.as_deref(), Some("verify-ca"));
        assert_eq!(p.sslrootcert.as_deref(), Some("/tmp/it's.pem"));
        assert!(take_tls_params("host=db sslrootcert='/x").is_err());
        assert!(take_tls_params("host").is_err());
    }

    #[test]
    fn the_default_is_prefer_and_unsupported_modes_are_refused_by_name() {
        let c = Connector::parse("postgres://tally@127.0.0.1/t", "tally").unwrap();
        assert_eq!(c.ssl_mode(), SslMode::Prefer);
        assert_eq!(
            c.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Prefer
        );
        for (url, wanted) in [
            (
                "postgres://h/t?sslmode=allow",
                "sslmode=allow is not supported",
            ),
            ("postgres://h/t?sslmode=verify", "is not one of"),
            ("postgres://h/t?sslrootcert=system", "sslrootcert=system"),
            (
                "postgres://h/t?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
                "sslrootcert /nonexistent/ca.pem: cannot read it",
            ),
        ] {
            let e = Connector::parse(url, "tally").unwrap_err();
            assert!(e.contains(wanted), "{url}: {e}");
        }
        // verify-ca and verify-full ask tokio-postgres for TLS or nothing.
        let c = Connector::parse("host=h sslmode=verify-full", "tally").unwrap();
        assert_eq!(
            c.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
    }

    #[test]
    fn a_roots_file_without_certificates_is_refused() {
        let dir = std::env::temp_dir().join(format!("tally-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = Connector::parse(
            &format!("host=h sslmode=verify-ca sslrootcert={}", empty.display()),
            "tally",
        )
        .unwrap_err();
        assert!(e.contains("holds no PEM certificate"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unverified_connections_beyond_loopback_are_warned_about() {
        let warn = |url: &str| Connector::parse(url, "tally").unwrap().unverified_warning();
        assert!(warn("postgres://tally@127.0.0.1/t").is_none());
        assert!(warn("postgres://tally@localhost/t?sslmode=require").is_none());
        assert!(warn("host=/var/run/postgresql dbname=t").is_none());
        assert!(warn("postgres://tally@db.internal/t?sslmode=verify-full").is_none());
        let w = warn("postgres://tally@db.internal/t").unwrap();
        assert!(
            w.contains("db.internal") && w.contains("sslmode=prefer"),
            "{w}"
        );
        assert!(warn("postgres://tally@db.internal/t?sslmode=require").is_some());
    }

    #[test]
    fn passwords_are_redacted_in_every_form() {
        assert_eq!(redact("postgres://u:pw@h:1/d"), "postgres://u:***@h:1/d");
        assert_eq!(redact("postgres://u@h/d"), "postgres://u@h/d");
        assert_eq!(
            redact("postgres://u@h/d?password=pw&sslmode=require"),
            "postgres://u@h/d?password=***&sslmode=require"
        );
        assert_eq!(
            redact("host=h password='p w' dbname=d"),
            "host=h password=*** dbname=d"
        );
        assert!(!redact("host=h password='unterminated").contains("unterminated"));
    }
}
