//! The cosigner's HTTP routes (docs/api.md, "The cosigner"):
//!
//! - `POST /add-checkpoint`: c2sp.org/tlog-witness add-checkpoint;
//! - `GET /<origin hash>/checkpoint`: the latest cosigned checkpoint of a
//!   log (the protocol's monitoring route);
//! - `GET /metrics`, `GET /healthz`.
//!
//! Refusals are `text/plain; charset=utf-8` bodies `<code>: <message>\n`
//! with a stable code, except `409`, whose body is the protocol's
//! `text/x.tlog.size`: the size last cosigned and a newline.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tally_schemas::cosignature::MAX_ADD_CHECKPOINT_BODY_BYTES;

use crate::cosigner::{AddCheckpointError, Cosigner};

const TEXT: &str = "text/plain; charset=utf-8";
/// The content type of a 409 answer (c2sp.org/tlog-witness).
pub const TLOG_SIZE: &str = "text/x.tlog.size";

/// What the routes share.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The cosigner.
    pub cosigner: Arc<Cosigner>,
    /// Testing only: how long to wait after the state is committed and
    /// before the cosignature is sent (the end-to-end test kills the
    /// process in that window). `None` in production.
    pub pause_before_answer: Option<Duration>,
}

/// The cosigner's routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/add-checkpoint", post(add_checkpoint))
        .route("/{origin_hash}/checkpoint", get(checkpoint))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .fallback(|| async { refusal(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .method_not_allowed_fallback(|| async {
            refusal(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take that method",
            )
        })
        // The body is read by the handler with its own limit (413 too_large).
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

/// A refusal: `<code>: <message>\n` as text.
pub fn refusal(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, HeaderValue::from_static(TEXT))],
        format!("{code}: {message}\n"),
    )
        .into_response()
}

fn too_large() -> Response {
    refusal(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        &format!("an add-checkpoint body is at most {MAX_ADD_CHECKPOINT_BODY_BYTES} bytes"),
    )
}

async fn add_checkpoint(State(app): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_ADD_CHECKPOINT_BODY_BYTES as u64) {
        app.cosigner.metrics().count_too_large();
        return too_large();
    }
    let bytes: Bytes = match axum::body::to_bytes(body, MAX_ADD_CHECKPOINT_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            let limited = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if limited {
                app.cosigner.metrics().count_too_large();
                return too_large();
            }
            return refusal(
                StatusCode::BAD_REQUEST,
                "malformed",
                "the request body could not be read",
            );
        }
    };
    let cosigner = Arc::clone(&app.cosigner);
    let outcome = tokio::task::spawn_blocking(move || cosigner.add_checkpoint(&bytes)).await;
    match outcome {
        Ok(Ok(line)) => {
            if let Some(pause) = app.pause_before_answer {
                tokio::time::sleep(pause).await;
            }
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, HeaderValue::from_static(TEXT))],
                line,
            )
                .into_response()
        }
        Ok(Err(AddCheckpointError::Conflict { known, .. })) => (
            StatusCode::CONFLICT,
            [(header::CONTENT_TYPE, HeaderValue::from_static(TLOG_SIZE))],
            format!("{}\n", known.get()),
        )
            .into_response(),
        Ok(Err(e @ AddCheckpointError::State(_))) => {
            tracing::error!(error = %e, "add-checkpoint: the state failed; nothing was cosigned");
            refusal(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error; nothing was cosigned",
            )
        }
        Ok(Err(e)) => refusal(
            StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST),
            e.code(),
            &e.to_string(),
        ),
        Err(e) => {
            tracing::error!(error = %e, "add-checkpoint task failed");
            refusal(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error; nothing was cosigned",
            )
        }
    }
}

async fn checkpoint(State(app): State<AppState>, Path(origin_hash): Path<String>) -> Response {
    let well_formed = origin_hash.len() == 64
        && origin_hash
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !well_formed {
        return refusal(
            StatusCode::NOT_FOUND,
            "not_found",
            "the origin hash is 64 lowercase hex digits (SHA-256 of the origin)",
        );
    }
    let cosigner = Arc::clone(&app.cosigner);
    let latest =
        tokio::task::spawn_blocking(move || cosigner.latest_by_origin_hash(&origin_hash)).await;
    match latest {
        Ok(Ok(Some(c))) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, HeaderValue::from_static(TEXT)),
                (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            ],
            c.note,
        )
            .into_response(),
        Ok(Ok(None)) => refusal(
            StatusCode::NOT_FOUND,
            "not_cosigned",
            "this cosigner has cosigned no checkpoint of a log with that origin hash",
        ),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "reading the state failed");
            refusal(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error",
            )
        }
        Err(e) => {
            tracing::error!(error = %e, "state read task failed");
            refusal(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error",
            )
        }
    }
}

async fn metrics(State(app): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        app.cosigner.metrics().render(app.cosigner.logs().len()),
    )
        .into_response()
}

async fn healthz() -> Response {
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static(TEXT))],
        "ok\n",
    )
        .into_response()
}
