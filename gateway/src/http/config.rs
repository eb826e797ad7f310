//! How the HTTP gateway is configured and bounded, what stops it from
//! starting, and the counts it reports at exit.

use std::time::Duration;

/// What the HTTP gateway bounds.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// Largest request body read from a client (else 413).
    pub max_body_bytes: usize,
    /// Largest JSON answer or single SSE event read from the upstream
    /// (else the exchange fails: 502 before the answer started, a cut stream after).
    pub max_answer_bytes: usize,
    /// Most sessions kept at once (a further `initialize` gets 503).
    pub max_sessions: usize,
    /// Most requests in flight at once, open streams included (else 503).
    pub max_in_flight: usize,
    /// Most client connections open at once (further ones wait to be accepted).
    pub max_connections: usize,
    /// Time a client has to send a request's headers.
    pub header_read_timeout: Duration,
    /// Time a client has to send a request's body (else 408).
    pub body_read_timeout: Duration,
    /// A session without requests or open streams for this long is
    /// forgotten; its open calls end with `client_gone`.
    pub session_idle: Duration,
    /// Time to connect to the upstream.
    pub connect_timeout: Duration,
    /// How long a stop waits for exchanges in flight before ending them.
    pub drain: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: 4 << 20,
            max_answer_bytes: 16 << 20,
            max_sessions: 256,
            max_in_flight: 512,
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            session_idle: Duration::from_secs(3600),
            connect_timeout: Duration::from_secs(10),
            drain: Duration::from_secs(5),
        }
    }
}

/// How the HTTP gateway is set up.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// The upstream MCP endpoint.
    pub upstream: reqwest::Url,
    /// PEM certificates trusted for the upstream's TLS, besides the
    /// built-in roots.
    pub upstream_ca_pem: Option<Vec<u8>>,
    /// Origins allowed besides the local ones (`http://localhost:PORT` and the like).
    pub allowed_origins: Vec<String>,
    /// Refuse requests whose `Host` is not a loopback name (DNS
    /// rebinding); set when the listener is on loopback.
    pub loopback_hosts_only: bool,
    /// The bounds.
    pub limits: HttpLimits,
}

/// Why the gateway could not be set up or the upstream is not usable.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The upstream URL.
    #[error("--upstream {url}: {reason}")]
    Upstream {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("the HTTP client: {0}")]
    Client(String),
    /// The TLS files.
    #[error("TLS: {0}")]
    Tls(String),
}

/// Counts of how calls ended, for the summary at exit.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HttpReport {
    /// `tools/call` requests seen.
    pub calls: u64,
    /// Calls ended `server_exited`.
    pub server_exited_calls: u64,
    /// Calls ended `http_error`.
    pub http_error_calls: u64,
    /// Calls ended `client_gone`.
    pub client_gone_calls: u64,
    /// Calls ended `cancelled`.
    pub cancelled_calls: u64,
}
