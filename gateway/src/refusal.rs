//! How the gateway answers a call it did not forward or could not
//! complete: the JSON-RPC error codes, the error answer, and [`Refusal`].
//! `calls` re-exports them; `toolcheck` refuses with them.

use serde_json::{json, Value};

/// JSON-RPC error code of a call the gateway did not forward.
pub const ERROR_NOT_FORWARDED: i64 = -32001;
/// JSON-RPC error code of a call whose server exited while it was in flight.
pub const ERROR_SERVER_EXITED: i64 = -32002;
/// JSON-RPC error code of a call still in flight when the client went away
/// and the server exited (sent in case the client still reads).
pub const ERROR_CLIENT_GONE: i64 = -32003;
/// JSON-RPC error code of a call whose HTTP exchange with the upstream
/// failed without a JSON-RPC answer (Streamable HTTP only).
pub const ERROR_UPSTREAM: i64 = -32004;

/// Why a call is not forwarded: a stable reason (the `data.tally` member of
/// the JSON-RPC error) and a message for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Stable reason code, e.g. `decision_not_recorded`.
    pub reason: &'static str,
    /// What happened.
    pub message: String,
}

impl Refusal {
    /// A refusal with `reason` and `message`.
    #[must_use]
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }

    /// The JSON-RPC error answer to request `id` (code -32001).
    #[must_use]
    pub fn to_answer(&self, id: &Value) -> Value {
        error_answer(
            id,
            ERROR_NOT_FORWARDED,
            self.reason,
            &format!("tally gateway: call not forwarded: {}", self.message),
        )
    }
}

/// A JSON-RPC error answer to request `id`, with the gateway's `reason` in
/// `error.data.tally`.
#[must_use]
pub fn error_answer(id: &Value, code: i64, reason: &str, message: &str) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code, "message": message, "data": {"tally": reason}},
    })
}
