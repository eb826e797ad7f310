//! Connections of `tally serve`, bounded in number, time and memory
//! (docs/operations.md "Connections", docs/threat-model.md "Hostile
//! connections"), so a client without a key cannot hold capacity that
//! agents need.
//!
//! - [`Tracker`]: the open-connection cap. At the cap, a new connection makes
//!   room by closing the connection that has waited longest for a request;
//!   when none waits, the oldest connection on which no request has yet
//!   shown a valid credential ([`ConnTrust`]), requests in flight or not;
//!   when every connection is a key holder's with a request in flight,
//!   accepting waits. A client address (an IPv4 address, an IPv6 /64) holds
//!   at most `max_connections_per_client` such unauthenticated connections:
//!   its next one closes its oldest.
//! - [`ConnState`] and its watchdog (`state.rs`): per connection, a deadline
//!   while no request is in flight: the first request head within the
//!   header timeout of the accept; later, a new request within the idle
//!   timeout, and its head within the header timeout of its first byte.
//! - [`ConnIo`] (`socket.rs`): the socket, noting reads for those deadlines and closing a
//!   connection whose writes make no progress (a client that does not read).
//!   With requests in flight, the watchdog also closes an HTTP/2 connection
//!   one of whose answers the client has not taken from for the write
//!   timeout (a stream without flow-control window, whose socket is not
//!   blocked).
//! - [`DeadlineBody`] (`body.rs`): every request body must arrive by its deadline
//!   (`body_timeout`, extended by `body_min_rate`); a late one fails with
//!   [`BodyTimeout`], which the routes answer with 408.
//! - [`TrackedService`] (`service.rs`): counts the requests in flight of a connection and
//!   gives each request body its deadline.
//!
//! [`Tracker`] is the connection policy (`tally_net::ConnPolicy`) of the
//! shared server loop, tally-net's `serve` (docs/architecture.md "One
//! server loop"), which accepts, runs the TLS handshake and hyper; the
//! request-head size bound is hyper's (`max_buf_size`, answered 431), set
//! in [`crate::server::serve`].

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{watch, OwnedSemaphorePermit};

use state::{tls_handshake_timed_out, watch_connection};

mod body;
mod service;
mod socket;
mod state;

pub(crate) use body::body_timeout;
pub use body::is_body_timeout;
pub(crate) use service::TrackedService;
pub(crate) use socket::ConnIo;
pub use state::{client_key, CloseReason, ConnTrust, ConnectionStats};
pub(crate) use state::{ConnState, Tracker};

/// The connection policy of `tally serve` in tally-net's server loop:
/// slots with eviction at the cap, the per-client limit, the socket
/// wrapper and the watchdog of this module.
impl tally_net::ConnPolicy for Tracker {
    type Slot = OwnedSemaphorePermit;
    type Conn = Arc<ConnState>;
    type Io<T>
        = ConnIo<T>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    async fn slot(self: &Arc<Self>) -> Option<OwnedSemaphorePermit> {
        Some(Tracker::slot(self).await)
    }

    fn accept_failed(&self, error: &io::Error) {
        Tracker::accept_failed(self, error);
    }

    fn open(self: &Arc<Self>, slot: OwnedSemaphorePermit, peer: SocketAddr) -> Arc<ConnState> {
        self.register(slot, peer.ip())
    }

    fn wrap_io<T>(conn: Arc<ConnState>, io: T) -> ConnIo<T>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        ConnIo::new(io, conn)
    }

    fn tls_handshake_timed_out(conn: &Arc<ConnState>) {
        tls_handshake_timed_out(conn);
    }

    fn watch<F>(
        conn: Arc<ConnState>,
        connection: F,
        stopping: watch::Receiver<bool>,
    ) -> impl Future<Output = ()> + Send + 'static
    where
        F: Future<Output = ()> + Send + 'static,
    {
        watch_connection(conn, connection, stopping)
    }
}
