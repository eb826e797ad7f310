//! The log's read API as an axum `Router` (docs/storage.md, "Read API";
//! docs/protocol.md for the wire): C2SP tlog-tiles (`/checkpoint`,
//! `/tile/<L>/<N>[.p/<W>]`, `/tile/entries/<N>[.p/<W>]`) and the JSON proof
//! endpoints `/v1/proof/inclusion` and `/v1/proof/consistency` (protocol.md
//! §7.5, schemas/json/inclusion-proof.schema.json and
//! consistency-proof.schema.json).
//!
//! Everything is served from storage and bounded by the latest signed
//! checkpoint, so nothing unsigned is ever visible. Errors are 4xx JSON
//! bodies `{"error":{"code":…,"message":…}}` with stable snake_case codes; a
//! 500 says only "internal error" and the detail goes to the log.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use tally_schemas::api::{
    ConsistencyProofAnswer, ErrorBody, ErrorDetail, InclusionProofAnswer, PROOF_JSON_VERSION,
};
use tally_schemas::{Hash, LeafIndex, TreeSize};

use crate::error::ProofRequestError;
use crate::log::Log;
use crate::store::StoreError;
use crate::tree::{self, TILE_WIDTH};

pub use crate::tile_path::{parse_tile_path, TilePath};

/// Cache header of full tiles, which never change.
pub const IMMUTABLE: &str = "public, max-age=31536000, immutable";
/// Cache header of the checkpoint and partial tiles, which are superseded.
pub const SHORT_LIVED: &str = "no-cache";

/// The read routes, at the root; the witness nests or merges them.
pub fn router(log: Arc<Log>) -> Router {
    Router::new()
        .route("/checkpoint", get(checkpoint))
        .route("/tile/{*path}", get(tile))
        .route("/v1/proof/inclusion", get(inclusion))
        .route("/v1/proof/consistency", get(consistency))
        .with_state(log)
}

/// A 4xx or 500 error with its stable code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    fn internal(e: &dyn std::fmt::Display) -> Self {
        tracing::error!(error = %e, "log read failed");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // The error body of docs/api.md "Errors", defined once in
        // tally-schemas.
        let body = ErrorBody {
            error: ErrorDetail::new(self.code, self.message),
        };
        let mut r = (self.status, Json(body)).into_response();
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static(SHORT_LIVED));
        r
    }
}

impl From<ProofRequestError> for ApiError {
    fn from(e: ProofRequestError) -> Self {
        let code = match &e {
            ProofRequestError::SizeBeyondTree { .. } => "size_beyond_tree",
            ProofRequestError::IndexBeyondSize { .. } => "index_beyond_size",
            ProofRequestError::SizesOutOfOrder { .. } => "sizes_out_of_order",
            ProofRequestError::FromEmptyTree => "from_empty_tree",
            ProofRequestError::UnknownLeafHash { .. } => {
                return Self::new(StatusCode::NOT_FOUND, "unknown_leaf_hash", e.to_string())
            }
            ProofRequestError::Store(s) => return Self::internal(s),
        };
        Self::bad_request(code, e.to_string())
    }
}

/// Runs a blocking storage read off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(&e))?
}

async fn checkpoint(State(log): State<Arc<Log>>) -> Response {
    // With cosigners, the checkpoint they were last asked about, with their
    // cosignature lines (protocol.md §14.5).
    let cp = log.published_checkpoint();
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static(SHORT_LIVED)),
        ],
        cp.note.clone(),
    )
        .into_response()
}

async fn tile(State(log): State<Arc<Log>>, Path(path): Path<String>) -> Result<Response, ApiError> {
    let tp = parse_tile_path(&path).map_err(|m| ApiError::bad_request("bad_tile_path", m))?;
    let size = log.latest_checkpoint().checkpoint.size;
    let have = tree::tile_width_at(size, tp.level.unwrap_or(0), tp.n);
    let want = tp.partial.unwrap_or(TILE_WIDTH);
    if have < want {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "tile_not_found",
            format!("tile {path} is not in the tree of size {size}"),
        ));
    }
    let body = blocking(move || {
        let store = log.store().as_ref();
        match tp.level {
            Some(level) => {
                tree::tile_hashes(store, level, tp.n, want).map_err(|e| ApiError::internal(&e))
            }
            None => entry_bundle(store, tp.n, want),
        }
    })
    .await?;
    let cache = if tp.partial.is_some() {
        SHORT_LIVED
    } else {
        IMMUTABLE
    };
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static(cache)),
        ],
        body,
    )
        .into_response())
}

/// C2SP entry bundle: each entry prefixed with its big-endian uint16 length.
fn entry_bundle(
    store: &dyn crate::store::LogStore,
    n: u64,
    width: u64,
) -> Result<Vec<u8>, ApiError> {
    let start = n * TILE_WIDTH;
    let entries = store
        .entries(LeafIndex::new(start), LeafIndex::new(start + width))
        .map_err(|e| ApiError::internal(&e))?;
    if entries.len() as u64 != width {
        return Err(ApiError::internal(&StoreError::Corrupt(format!(
            "entry bundle {n} has {} entries stored, {width} expected",
            entries.len()
        ))));
    }
    let mut out = Vec::new();
    for e in entries {
        let len = u16::try_from(e.len()).map_err(|_| {
            ApiError::internal(&StoreError::Corrupt(
                "stored entry exceeds 65535 bytes".into(),
            ))
        })?;
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&e);
    }
    Ok(out)
}

/// Parses a query string into known keys, refusing unknown or repeated ones.
fn query<'a>(
    raw: Option<&'a str>,
    allowed: &[&'static str],
) -> Result<Vec<(&'static str, &'a str)>, ApiError> {
    let mut out: Vec<(&'static str, &'a str)> = Vec::new();
    for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let Some(&key) = allowed.iter().find(|a| **a == k) else {
            return Err(ApiError::bad_request(
                "unknown_parameter",
                format!(
                    "unknown query parameter {:?}; allowed: {}",
                    k.chars().take(40).collect::<String>(),
                    allowed.join(", ")
                ),
            ));
        };
        if out.iter().any(|(seen, _)| *seen == key) {
            return Err(ApiError::bad_request(
                "repeated_parameter",
                format!("query parameter {key} is repeated"),
            ));
        }
        out.push((key, v));
    }
    Ok(out)
}

fn number(name: &'static str, v: &str) -> Result<u64, ApiError> {
    let ok = !v.is_empty()
        && v.len() <= 16
        && v.bytes().all(|b| b.is_ascii_digit())
        && (v == "0" || !v.starts_with('0'));
    let n = if ok { v.parse::<u64>().ok() } else { None };
    n.filter(|n| *n <= tally_schemas::limits::MAX_COUNTER)
        .ok_or_else(|| {
            ApiError::bad_request(
                "bad_parameter",
                format!("{name} must be a decimal integer from 0 to 2^53-1 without leading zeros"),
            )
        })
}

fn get_param<'a>(params: &[(&'static str, &'a str)], name: &str) -> Option<&'a str> {
    params.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
}

async fn inclusion(
    State(log): State<Arc<Log>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let params = query(raw.as_deref(), &["index", "leaf_hash", "size"])?;
    let size = get_param(&params, "size")
        .map(|v| number("size", v))
        .transpose()?
        .map(TreeSize::new);
    enum By {
        Index(LeafIndex),
        Leaf(Hash),
    }
    let by = match (get_param(&params, "index"), get_param(&params, "leaf_hash")) {
        (Some(i), None) => By::Index(LeafIndex::new(number("index", i)?)),
        (None, Some(h)) => By::Leaf(
            Hash::from_hex(h)
                .map_err(|e| ApiError::bad_request("bad_parameter", format!("leaf_hash: {e}")))?,
        ),
        _ => {
            return Err(ApiError::bad_request(
                "missing_parameter",
                "give exactly one of index or leaf_hash",
            ))
        }
    };
    let body = blocking(move || {
        let (index, size, proof) = match by {
            By::Index(index) => {
                let (size, proof) = log.inclusion_proof(index, size)?;
                (index, size, proof)
            }
            By::Leaf(h) => log.inclusion_proof_by_leaf_hash(&h, size)?,
        };
        let leaf_hash = log
            .store()
            .entries(index, LeafIndex::new(index.get() + 1))
            .map_err(|e| ApiError::internal(&e))?
            .first()
            .map(|e| tally_schemas::hash::leaf_hash(e))
            .ok_or_else(|| {
                ApiError::internal(&StoreError::Corrupt(format!("entry {index} missing")))
            })?;
        // The answer of docs/protocol.md §7.5, defined once in tally-schemas.
        Ok(InclusionProofAnswer {
            v: PROOF_JSON_VERSION,
            index,
            size,
            leaf_hash,
            inclusion: proof,
        })
    })
    .await?;
    Ok(json_ok(&body))
}

async fn consistency(
    State(log): State<Arc<Log>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let params = query(raw.as_deref(), &["from", "to"])?;
    let from = TreeSize::new(
        get_param(&params, "from")
            .map(|v| number("from", v))
            .transpose()?
            .ok_or_else(|| ApiError::bad_request("missing_parameter", "from is required"))?,
    );
    let to = get_param(&params, "to")
        .map(|v| number("to", v))
        .transpose()?
        .map(TreeSize::new);
    let body = blocking(move || {
        let (to, proof) = log.consistency_proof(from, to)?;
        Ok(ConsistencyProofAnswer::new(from, to, proof))
    })
    .await?;
    Ok(json_ok(&body))
}

fn json_ok<T: Serialize>(body: &T) -> Response {
    let mut r = Json(body).into_response();
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static(SHORT_LIVED));
    r
}
