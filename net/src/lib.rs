//! tally-net: the one bounded HTTP server loop and the one TLS
//! configuration of `tally serve` (tally-witness), `tally gateway
//! --upstream` (tally-gateway) and `tally cosigner serve` (tally-cosigner)
//! (docs/architecture.md "One server loop").
//!
//! - [`serve`]: the accept loop under a connection bound ([`ConnPolicy`];
//!   [`Bounded`] is a plain cap), per-connection serving (hyper's auto
//!   builder, the header read timeout, optional TLS with a handshake
//!   timeout, HTTP/2 where the caller enables it), graceful shutdown
//!   within a drain limit.
//! - [`tls_config`]: rustls (ring) from PEM files, ALPN `h2` and
//!   `http/1.1`, with a typed [`TlsError`].

mod server;
mod tls;

pub use server::{serve, Backoff, Bounded, BoxError, ConnPolicy, Drained, Http, Http2, Options};
pub use tls::{tls_config, TlsError};
