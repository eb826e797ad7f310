//! What the HTTP gateway reads from and writes into the messages it
//! passes: the MCP headers, the hop-by-hop headers it drops, and the
//! JSON-RPC answers it makes itself.

use axum::http::{header, HeaderMap, HeaderName, StatusCode};
use axum::response::{IntoResponse as _, Response};
use serde_json::Value;

use crate::calls::error_answer;

/// Protocol versions of the `initialize` era, where a client's disconnect
/// is not a cancellation; any other `MCP-Protocol-Version` (2026-07-28 and
/// later) cancels a call by closing its stream.
pub(super) const HANDSHAKE_VERSIONS: [&str; 4] =
    ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
pub(super) const SESSION_HEADER: &str = "mcp-session-id";
pub(super) const VERSION_HEADER: &str = "mcp-protocol-version";

/// Headers that belong to one connection (RFC 9110 §7.6.1), plus the ones
/// the gateway sets itself.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

pub(super) fn copy_headers(from: &HeaderMap) -> HeaderMap {
    let named_in_connection: Vec<String> = from
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|s| s.trim().to_ascii_lowercase()))
        .collect();
    let mut to = HeaderMap::with_capacity(from.len());
    for (name, value) in from {
        if !hop_by_hop(name) && !named_in_connection.iter().any(|n| n == name.as_str()) {
            to.append(name.clone(), value.clone());
        }
    }
    to
}

/// A response the gateway makes itself: a JSON-RPC error (with `id`, or
/// without one when the request had none) carrying a stable reason.
pub(super) fn gateway_error(
    status: StatusCode,
    id: Option<&Value>,
    code: i64,
    reason: &str,
    message: &str,
) -> Response {
    let body = error_answer(id.unwrap_or(&Value::Null), code, reason, message);
    let mut body = body;
    if id.is_none() {
        if let Some(m) = body.as_object_mut() {
            m.remove("id");
        }
    }
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(&body).unwrap_or_default(),
    )
        .into_response()
}

pub(super) fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(body).unwrap_or_default(),
    )
        .into_response()
}

pub(super) fn is_modern(headers: &HeaderMap) -> bool {
    headers
        .get(VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !HANDSHAKE_VERSIONS.contains(&v))
}

pub(super) fn session_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

pub(super) fn id_key(id: &Value) -> String {
    id.to_string()
}

pub(super) fn content_type_is(headers: &HeaderMap, wanted: &str) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(wanted))
}

pub(super) fn loopback_name(host: &str) -> bool {
    let host = host.trim();
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(h, p)| {
            if p.chars().all(|c| c.is_ascii_digit()) {
                h
            } else {
                host
            }
        })
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// An error with its sources, each once.
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let t = inner.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        source = inner.source();
    }
    s
}
