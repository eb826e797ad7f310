//! The log's read API as an axum `Router` (docs/storage.md, "Read API";
//! docs/protocol.md for the wire): C2SP tlog-tiles (`/checkpoint`,
//! `/tile/<L>/<N>[.p/<W>]`, `/tile/entries/<N>[.p/<W>]`) and the JSON proof
//! endpoints `/v1/proof/inclusion` and `/v1/proof/consistency` (protocol.md
//! §7.5, schemas/json/inclusion-proof.schema.json and
//! consistency-proof.schema.json).
//!
//! Everything is served from storage and bounded by the latest signed
//! checkpoint, so nothing unsigned is ever visible. Entry bundles, up to
//! 16.7 MB each, are bounded in memory (docs/storage.md "Read API"): each
//! is built once into shared bytes that every answer of it refers to, the
//! latest are kept in a small cache (a bundle of a given width never
//! changes), and the bundles alive at once, cached or being sent, hold at
//! most [`TileLimits::max_bundle_bytes`]; past it the answer is
//! `503 busy` with `Retry-After`. Errors are 4xx JSON
//! bodies `{"error":{"code":…,"message":…}}` with stable snake_case codes; a
//! 500 says only "internal error" and the detail goes to the log.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
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

/// The memory bounds of entry-bundle answers (docs/storage.md "Read API").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileLimits {
    /// Most bytes of entry bundles alive at once: cached, or held by
    /// answers not yet sent. A bundle that does not fit is answered
    /// `503 busy`.
    pub max_bundle_bytes: usize,
    /// Most bytes of the cache of recent bundles (within the above).
    pub cache_bytes: usize,
}

impl Default for TileLimits {
    fn default() -> Self {
        Self {
            max_bundle_bytes: 256 << 20,
            cache_bytes: 64 << 20,
        }
    }
}

/// What the read routes share: the log and the entry bundles.
#[derive(Debug)]
struct Reads {
    log: Arc<Log>,
    bundles: Bundles,
}

/// Entry bundles in memory: a budget of bytes, taken by a bundle while any
/// copy of its bytes (the cache's, an answer's) is alive, and the cache.
#[derive(Debug)]
struct Bundles {
    limits: TileLimits,
    budget: Arc<tokio::sync::Semaphore>,
    /// At most this many builds at once; the others wait their turn.
    building: tokio::sync::Semaphore,
    /// Most recent last, keyed by (tile index, width).
    cache: Mutex<VecDeque<((u64, u64), Bytes)>>,
}

/// Bundles built at once: reading 256 entries is I/O bound, a few at once
/// keep the disk busy without piling copies up.
const BUILDS_AT_ONCE: usize = 4;

/// A budget permit's unit: one KiB.
const KIB: usize = 1024;

/// The bytes of one bundle, with the budget they hold until the last copy
/// is dropped.
struct Owned {
    bytes: Vec<u8>,
    _budget: tokio::sync::OwnedSemaphorePermit,
}

impl AsRef<[u8]> for Owned {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Bundles {
    fn new(limits: TileLimits) -> Self {
        let kib = u32::try_from(limits.max_bundle_bytes.div_ceil(KIB)).unwrap_or(u32::MAX);
        Self {
            limits,
            budget: Arc::new(tokio::sync::Semaphore::new(kib as usize)),
            building: tokio::sync::Semaphore::new(BUILDS_AT_ONCE),
            cache: Mutex::new(VecDeque::new()),
        }
    }

    fn cached(&self, key: (u64, u64)) -> Option<Bytes> {
        let mut c = self
            .cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let i = c.iter().position(|(k, _)| *k == key)?;
        let hit = c.remove(i)?;
        let bytes = hit.1.clone();
        c.push_back(hit);
        Some(bytes)
    }

    fn keep(&self, key: (u64, u64), bytes: &Bytes) {
        let mut c = self
            .cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if c.iter().any(|(k, _)| *k == key) || bytes.len() > self.limits.cache_bytes {
            return;
        }
        let mut total: usize = c.iter().map(|(_, b)| b.len()).sum::<usize>() + bytes.len();
        while total > self.limits.cache_bytes {
            match c.pop_front() {
                Some((_, old)) => total -= old.len(),
                None => break,
            }
        }
        c.push_back((key, bytes.clone()));
    }

    /// Takes the budget for a bundle of `len` bytes, if it fits now.
    fn budget(&self, len: usize) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let kib = u32::try_from(len.div_ceil(KIB).max(1)).ok()?;
        Arc::clone(&self.budget).try_acquire_many_owned(kib).ok()
    }
}

/// The read routes, at the root, with the default [`TileLimits`]; the
/// witness nests or merges them.
pub fn router(log: Arc<Log>) -> Router {
    router_with(log, TileLimits::default())
}

/// [`router`] with these bounds on entry bundles.
pub fn router_with(log: Arc<Log>, limits: TileLimits) -> Router {
    Router::new()
        .route("/checkpoint", get(checkpoint))
        .route("/tile/{*path}", get(tile))
        .route("/v1/proof/inclusion", get(inclusion))
        .route("/v1/proof/consistency", get(consistency))
        .with_state(Arc::new(Reads {
            log,
            bundles: Bundles::new(limits),
        }))
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

    fn busy() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            "too many large tiles are being sent; try again in a second",
        )
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
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
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

async fn checkpoint(State(reads): State<Arc<Reads>>) -> Response {
    // With cosigners, the checkpoint they were last asked about, with their
    // cosignature lines (protocol.md §14.5).
    let cp = reads.log.published_checkpoint();
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

async fn tile(
    State(reads): State<Arc<Reads>>,
    Path(path): Path<String>,
) -> Result<Response, ApiError> {
    let tp = parse_tile_path(&path).map_err(|m| ApiError::bad_request("bad_tile_path", m))?;
    let log = Arc::clone(&reads.log);
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
    let body = match tp.level {
        Some(level) => Bytes::from(
            blocking(move || {
                tree::tile_hashes(log.store().as_ref(), level, tp.n, want)
                    .map_err(|e| ApiError::internal(&e))
            })
            .await?,
        ),
        None => shared_bundle(&reads, tp.n, want).await?,
    };
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

/// The entry bundle `n` of `width` entries, from the cache or built once
/// within the budget (see the module docs).
async fn shared_bundle(reads: &Arc<Reads>, n: u64, width: u64) -> Result<Bytes, ApiError> {
    let key = (n, width);
    if let Some(hit) = reads.bundles.cached(key) {
        return Ok(hit);
    }
    let _turn = reads
        .bundles
        .building
        .acquire()
        .await
        .map_err(|e| ApiError::internal(&e))?;
    // Another request may have built it while this one waited its turn.
    if let Some(hit) = reads.bundles.cached(key) {
        return Ok(hit);
    }
    let r = Arc::clone(reads);
    let bytes = blocking(move || {
        let bundle = entry_bundle(r.log.store().as_ref(), n, width)?;
        let budget = r.bundles.budget(bundle.len()).ok_or_else(ApiError::busy)?;
        Ok(Bytes::from_owner(Owned {
            bytes: bundle,
            _budget: budget,
        }))
    })
    .await?;
    reads.bundles.keep(key, &bytes);
    Ok(bytes)
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
    let mut out = Vec::with_capacity(entries.iter().map(|e| 2 + e.len()).sum());
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
    State(reads): State<Arc<Reads>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let log = Arc::clone(&reads.log);
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
    State(reads): State<Arc<Reads>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let log = Arc::clone(&reads.log);
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
