//! The witness's HTTP routes (docs/api.md is their contract): record
//! admission, agent heads, registration of projects, agents and keys, read
//! tokens, exports, the key directory, metrics and health; the log's read
//! routes (tiles, `/checkpoint`, `/v1/proof/…`) are merged in from
//! [`tally_log::http::router`]. With `--log-read token` those and `/metrics`
//! answer read-token holders only (docs/operations.md "Who can read the log").
//!
//! Every refusal goes through [`WitnessError`]'s one status/code table.
//! Handlers parse requests themselves (strict JSON, known query parameters
//! only), so a bad request never reaches a framework rejection with a
//! different body shape.

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::json;
use tally_schemas::api::{
    AddAgentRequest, AgentHead, AgentList, ApiBody, ApiKeyRevoked, BodyError, CreateProjectRequest,
    CreateReadTokenRequest, NewApiKey, NewReadToken, ProjectList, ProjectSummary, ReadTokenList,
    ReadTokenRevoked, ReadTokenSummary, RegisteredAgent, RetireRequest, RotateKeyRequest,
};
use tally_schemas::batch::{BatchAnswer, BatchOutcome};
use tally_schemas::{AgentName, KeyError, PublicKey, Seq, TreeSize, UnixMillis};

use crate::config::LogRead;
use crate::error::{blocking, WitnessError};
use crate::export::{self, ExportRange};
use crate::key_changes;
use crate::registry::KeyChange;
use crate::registry::{Principal, READ_TOKEN_PREFIX};
use crate::witness::Witness;

/// Content type of packs (JSON Lines).
pub const PACK_CONTENT_TYPE: &str = "application/jsonl; charset=utf-8";

/// All routes of the witness, the log's read routes included.
pub fn router(witness: Arc<Witness>) -> Router {
    let log_reads = Router::new()
        .route("/metrics", get(metrics))
        .with_state(Arc::clone(&witness))
        .merge(tally_log::http::router(Arc::clone(witness.log())));
    let log_reads = match witness.config().log_read {
        LogRead::Public => log_reads,
        LogRead::Token => log_reads.route_layer(middleware::from_fn_with_state(
            Arc::clone(&witness),
            require_read_token,
        )),
    };
    Router::new()
        .route("/v1/records", post(post_record))
        .route("/v1/records/batch", post(post_batch))
        .route("/v1/agents", post(add_agent).get(list_agents))
        .route("/v1/agents/{agent}/head", get(agent_head))
        .route("/v1/agents/{agent}/rotate", post(rotate_key))
        .route("/v1/agents/{agent}/retire", post(retire_agent))
        .route("/v1/agent-keys", get(agent_keys))
        .route("/v1/export", get(export_pack))
        .route("/v1/head", get(head))
        .route("/v1/projects", post(create_project).get(list_projects))
        .route("/v1/projects/{project}/api-keys", post(new_api_key))
        .route("/v1/api-keys/{id}/revoke", post(revoke_api_key))
        .route(
            "/v1/read-tokens",
            post(create_read_token).get(list_read_tokens),
        )
        .route("/v1/read-tokens/{id}/revoke", post(revoke_read_token))
        .route("/.well-known/tally/keys", get(key_directory))
        .route("/healthz", get(healthz))
        .with_state(Arc::clone(&witness))
        .merge(log_reads)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(witness, trust_key_holders))
}

/// Marks the connection of a request whose headers carry a valid API key,
/// admin token or read token as a key holder's, which the connection cap
/// never closes for room (docs/operations.md "Connections"). Once per
/// connection: a connection already marked is not looked at again.
async fn trust_key_holders(
    State(w): State<Arc<Witness>>,
    request: axum::extract::Request,
    next: Next,
) -> Response {
    if let Some(trust) = request.extensions().get::<crate::conn::ConnTrust>() {
        if !trust.is_authenticated() {
            let registry = w.registry();
            let valid = bearer(request.headers()).is_some_and(|t| {
                registry.authenticate(t).is_some()
                    || registry.is_admin(t)
                    || registry.authenticate_reader(t).is_some()
            });
            if valid {
                trust.authenticated();
            }
        }
    }
    next.run(request).await
}

async fn not_found() -> WitnessError {
    WitnessError::NotFound("no such route; see docs/api.md".into())
}

async fn method_not_allowed() -> Response {
    let e = WitnessError::BadRequest {
        code: "method_not_allowed",
        message: "this route does not take that method; see docs/api.md".into(),
    };
    let mut r = e.into_response();
    *r.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    r
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Cache header of full tiles when the log is not public: the client may
/// keep them, a shared cache (a CDN or proxy in front) must not, or it
/// would serve them to requests without a token (RFC 9111 §5.2.2.7).
const PRIVATE_IMMUTABLE: &str = "private, max-age=31536000, immutable";

/// The guard of the log's read routes under `--log-read token`: a valid,
/// unrevoked read token, else `401 unauthorized`.
async fn require_read_token(
    State(w): State<Arc<Witness>>,
    request: axum::extract::Request,
    next: Next,
) -> Response {
    let ok =
        bearer(request.headers()).is_some_and(|t| w.registry().authenticate_reader(t).is_some());
    if !ok {
        return WitnessError::ReadTokenRequired.into_response();
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    let shared = headers.get(header::CACHE_CONTROL).is_some_and(|v| {
        v.to_str()
            .is_ok_and(|v| v.split(',').any(|d| d.trim() == "public"))
    });
    if shared {
        headers.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static(PRIVATE_IMMUTABLE),
        );
    }
    response
}

/// Who asks for records: a project (its own agents) or a read-token holder
/// (any agent it names; it may read the whole log anyway).
enum RecordReader {
    Project(Principal),
    Log,
}

/// Authenticates an API key or a read token (told apart by prefix).
fn record_reader(w: &Witness, headers: &HeaderMap) -> Result<RecordReader, WitnessError> {
    match bearer(headers) {
        Some(t) if t.starts_with(READ_TOKEN_PREFIX) => w
            .registry()
            .authenticate_reader(t)
            .map(|_| RecordReader::Log)
            .ok_or(WitnessError::Unauthorized),
        other => w.authenticate(other).map(RecordReader::Project),
    }
}

/// The agents a reader asked for, checked: a project's own (all of them
/// when none is named), or with a read token, the named ones.
fn readable_agents(
    w: &Witness,
    reader: &RecordReader,
    named: Vec<AgentName>,
) -> Result<Vec<AgentName>, WitnessError> {
    match reader {
        RecordReader::Project(p) => owned_agents(w, p, named),
        RecordReader::Log if named.is_empty() => Err(WitnessError::BadRequest {
            code: "missing_parameter",
            message: "with a read token, name the agents (agent=NAME, repeatable)".into(),
        }),
        RecordReader::Log => Ok(named),
    }
}

/// Reads a body of at most `max` bytes, refusing larger ones without
/// reading them whole. The server gives every request body a deadline
/// (module [`crate::conn`]); a body that misses it is `408 body_timeout`.
async fn read_body(body: Body, headers: &HeaderMap, max: usize) -> Result<Bytes, WitnessError> {
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > max as u64 {
            return Err(WitnessError::BodyTooLarge {
                size: Some(len),
                max,
            });
        }
    }
    match http_body_util::Limited::new(body, max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(WitnessError::BodyTooLarge { size: None, max })
        }
        Err(e) => Err(match crate::conn::body_timeout(e.as_ref()) {
            Some(t) => WitnessError::BodyTimeout {
                received: t.received,
                elapsed_ms: u64::try_from(t.elapsed.as_millis()).unwrap_or(u64::MAX),
            },
            None => WitnessError::Malformed {
                reason: "body",
                message: "the request body could not be read".into(),
            },
        }),
    }
}

/// Parses a small JSON request body strictly into `T` (an empty body is
/// `{}`), a body tally-schemas' [`tally_schemas::api`] defines.
fn json_body<T: ApiBody>(bytes: &[u8]) -> Result<T, WitnessError> {
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        bytes
    };
    T::from_json(bytes).map_err(|e| match e {
        BodyError::Canonical { source, .. } => source.into(),
        other => WitnessError::Malformed {
            reason: other.code(),
            message: other.to_string(),
        },
    })
}

fn json_response(status: StatusCode, bytes: Vec<u8>) -> Response {
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        bytes,
    )
        .into_response()
}

fn json_value(status: StatusCode, v: &serde_json::Value) -> Response {
    json_response(status, serde_json::to_vec(v).unwrap_or_default())
}

/// An answer of the API (a [`tally_schemas::api`] body), in canonical form.
fn api_answer<T: ApiBody>(status: StatusCode, body: &T) -> Result<Response, WitnessError> {
    Ok(json_response(status, export::to_canonical(body)?))
}

/// Decodes `%XX` and `+` in a query component (with percent-encoding, the
/// crate the PostgreSQL URL parser uses); a `%` not followed by two hex
/// digits, or bytes that are not UTF-8, are refused rather than passed
/// through.
fn percent_decode(s: &str) -> Result<String, WitnessError> {
    let bad = || WitnessError::BadRequest {
        code: "bad_parameter",
        message: "query string is not valid percent-encoded UTF-8".into(),
    };
    let b = s.as_bytes();
    let escapes_ok = b.iter().enumerate().all(|(i, &c)| {
        c != b'%'
            || b.get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    if !escapes_ok {
        return Err(bad());
    }
    let spaced = s.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(|_| bad())
}

/// Parses a query string; only `allowed` names, each at most once except
/// those in `repeatable`.
fn query(
    raw: Option<&str>,
    allowed: &[&'static str],
    repeatable: &[&'static str],
) -> Result<Vec<(&'static str, String)>, WitnessError> {
    let mut out: Vec<(&'static str, String)> = Vec::new();
    for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = percent_decode(k)?;
        let Some(&key) = allowed.iter().find(|a| **a == k) else {
            return Err(WitnessError::BadRequest {
                code: "unknown_parameter",
                message: format!(
                    "unknown query parameter {:?}; allowed: {}",
                    k.chars().take(40).collect::<String>(),
                    allowed.join(", ")
                ),
            });
        };
        if !repeatable.contains(&key) && out.iter().any(|(seen, _)| *seen == key) {
            return Err(WitnessError::BadRequest {
                code: "repeated_parameter",
                message: format!("query parameter {key} is repeated"),
            });
        }
        out.push((key, percent_decode(v)?));
    }
    Ok(out)
}

fn param<'a>(params: &'a [(&'static str, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.as_str())
}

fn number(name: &str, v: &str) -> Result<u64, WitnessError> {
    let ok = !v.is_empty()
        && v.len() <= 16
        && v.bytes().all(|b| b.is_ascii_digit())
        && (v == "0" || !v.starts_with('0'));
    ok.then(|| v.parse::<u64>().ok())
        .flatten()
        .filter(|n| *n <= tally_schemas::limits::MAX_COUNTER)
        .ok_or_else(|| WitnessError::BadRequest {
            code: "bad_parameter",
            message: format!(
                "{name} must be a decimal integer from 0 to 2^53-1 without leading zeros"
            ),
        })
}

fn time_param(name: &str, v: &str) -> Result<UnixMillis, WitnessError> {
    UnixMillis::parse_rfc3339(v).map_err(|e| WitnessError::BadRequest {
        code: "bad_parameter",
        message: format!("{name}: {e}"),
    })
}

fn agent_name(v: &str) -> Result<AgentName, WitnessError> {
    AgentName::new(v).map_err(|e| WitnessError::BadRequest {
        code: "bad_parameter",
        message: format!("agent: {e}"),
    })
}

fn path_agent(p: Result<Path<String>, PathRejection>) -> Result<AgentName, WitnessError> {
    let Path(s) = p.map_err(|e| WitnessError::BadRequest {
        code: "bad_parameter",
        message: e.body_text(),
    })?;
    agent_name(&s)
}

fn agents_param(params: &[(&'static str, String)]) -> Result<Vec<AgentName>, WitnessError> {
    params
        .iter()
        .filter(|(k, _)| *k == "agent")
        .map(|(_, v)| agent_name(v))
        .collect()
}

// ---- admission -------------------------------------------------------------

/// `POST /v1/records` (docs/api.md): the API key is checked from the
/// headers, before any of the body is read, so a client without a key is
/// answered at once and holds nothing; the body is read whole (within its
/// size limit and deadline) before an admission slot is taken, so a slow
/// body holds no slot either.
async fn post_record(State(w): State<Arc<Witness>>, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let refused = |e: WitnessError| {
        w.count_refusal(&e, started);
        e.into_response()
    };
    let principal = match w.authenticate(bearer(&headers)) {
        Ok(p) => p,
        Err(e) => return refused(e),
    };
    let bytes = match read_body(body, &headers, w.config().max_body_bytes).await {
        Ok(b) => b,
        Err(e) => return refused(e),
    };
    let _permit = match w.in_flight_permit() {
        Ok(p) => p,
        Err(e) => return refused(e),
    };
    match w.admit_measured(&principal, &bytes, started).await {
        Ok(receipt) => json_response(StatusCode::OK, receipt),
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/records/batch` (docs/api.md): many records in one request,
/// one answer each. The same order as [`post_record`]: the API key from the
/// headers before any of the body is read; the body read whole, within
/// `MAX_BATCH_BYTES` and the body deadline; then one admission slot for
/// the whole batch.
async fn post_batch(State(w): State<Arc<Witness>>, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let refused = |e: WitnessError| {
        let (s, c) = e.status_and_code();
        w.metrics().batch_request(s.as_u16(), c, started.elapsed());
        e.into_response()
    };
    let principal = match w.authenticate(bearer(&headers)) {
        Ok(p) => p,
        Err(e) => return refused(e),
    };
    let bytes = match read_body(body, &headers, tally_schemas::limits::MAX_BATCH_BYTES).await {
        Ok(b) => b,
        Err(e) => return refused(e),
    };
    let _permit = match w.in_flight_permit() {
        Ok(p) => p,
        Err(e) => return refused(e),
    };
    let results = match w.admit_batch(&principal, bytes.to_vec()).await {
        Ok(r) => r,
        Err(e) => return refused(e),
    };
    let mut outcomes = Vec::with_capacity(results.len());
    let mut refusals = crate::refusal_log::BatchRefusals::default();
    for result in results {
        let outcome = match result.and_then(|a| {
            a.receipt
                .to_canonical_json()
                .map_err(|e| WitnessError::internal(&e))
        }) {
            Ok(receipt) => {
                w.metrics().batch_record(200, "ok");
                BatchOutcome::Receipt(receipt)
            }
            Err(e) => {
                let (status, code) = e.status_and_code();
                w.metrics().batch_record(status.as_u16(), code);
                if let Some(r) = e.refusal() {
                    let seen = refusals.0.iter().any(|(_, o)| {
                        o.code == r.code && o.agent == r.agent && o.key_id == r.key_id
                    });
                    if !seen {
                        refusals.0.push((status.as_u16(), r));
                    }
                }
                let error = match serde_json::to_value(e.body().error) {
                    Ok(serde_json::Value::Object(err)) => err,
                    _ => serde_json::Map::new(),
                };
                BatchOutcome::Refused {
                    status: status.as_u16(),
                    error,
                }
            }
        };
        outcomes.push(outcome);
    }
    match (BatchAnswer { results: outcomes }).to_json() {
        Ok(bytes) => {
            w.metrics().batch_request(200, "ok", started.elapsed());
            let mut response = json_response(StatusCode::OK, bytes);
            if !refusals.0.is_empty() {
                response.extensions_mut().insert(refusals);
            }
            response
        }
        Err(e) => refused(WitnessError::internal(&e)),
    }
}

async fn agent_head(
    State(w): State<Arc<Witness>>,
    headers: HeaderMap,
    agent: Result<Path<String>, PathRejection>,
) -> Result<Response, WitnessError> {
    let principal = w.authenticate(bearer(&headers))?;
    let agent = path_agent(agent)?;
    let w2 = Arc::clone(&w);
    let a2 = agent.clone();
    let head = blocking(move || w2.agent_head(&principal, &a2)).await?;
    api_answer(
        StatusCode::OK,
        &AgentHead {
            agent,
            seq: head.seq,
            hash: head.record_hash,
            index: head.index,
        },
    )
}

// ---- registration ----------------------------------------------------------

/// A request's public key: a weak one (small order, non-canonical:
/// protocol.md §4.3) is `unusable_public_key`, other bad ones `malformed`.
fn public_key(text: &str) -> Result<PublicKey, WitnessError> {
    PublicKey::from_base64(text).map_err(|e| match e {
        KeyError::WeakKey(why) => WitnessError::UnusableKey(why),
        other => WitnessError::Malformed {
            reason: "schema",
            message: format!("public_key: {other}"),
        },
    })
}

fn agent_answer(agent: &AgentName, row: &crate::registry::AgentRow) -> RegisteredAgent {
    RegisteredAgent {
        agent: agent.clone(),
        project: row.project.clone(),
        keys: row.keys.clone(),
    }
}

async fn add_agent(
    State(w): State<Arc<Witness>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, WitnessError> {
    let principal = w.authenticate(bearer(&headers))?;
    let bytes = read_body(body, &headers, w.config().max_body_bytes).await?;
    let req: AddAgentRequest = json_body(&bytes)?;
    let row = key_changes::add_agent(
        &w,
        &principal.project,
        &req.agent,
        public_key(&req.public_key)?,
        req.not_before,
    )
    .await?;
    api_answer(StatusCode::CREATED, &agent_answer(&req.agent, &row))
}

async fn list_agents(
    State(w): State<Arc<Witness>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, WitnessError> {
    let principal = w.authenticate(bearer(&headers))?;
    query(raw.as_deref(), &[], &[])?;
    let agents = w
        .registry()
        .agents_of(&principal.project)
        .iter()
        .map(|(a, row)| agent_answer(a, row))
        .collect();
    api_answer(StatusCode::OK, &AgentList { agents })
}

async fn rotate_key(
    State(w): State<Arc<Witness>>,
    headers: HeaderMap,
    agent: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<Response, WitnessError> {
    let principal = w.authenticate(bearer(&headers))?;
    let agent = path_agent(agent)?;
    let bytes = read_body(body, &headers, w.config().max_body_bytes).await?;
    let req: RotateKeyRequest = json_body(&bytes)?;
    let row = key_changes::change_keys(
        &w,
        &principal.project,
        &agent,
        KeyChange::Rotate(public_key(&req.public_key)?),
        req.at,
    )
    .await?;
    api_answer(StatusCode::OK, &agent_answer(&agent, &row))
}

async fn retire_agent(
    State(w): State<Arc<Witness>>,
    headers: HeaderMap,
    agent: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<Response, WitnessError> {
    let principal = w.authenticate(bearer(&headers))?;
    let agent = path_agent(agent)?;
    let bytes = read_body(body, &headers, w.config().max_body_bytes).await?;
    let req: RetireRequest = json_body(&bytes)?;
    let row =
        key_changes::change_keys(&w, &principal.project, &agent, KeyChange::Retire, req.at).await?;
    api_answer(StatusCode::OK, &agent_answer(&agent, &row))
}

async fn create_project(
    State(w): State<Arc<Witness>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, WitnessError> {
    w.authenticate_admin(bearer(&headers))?;
    let bytes = read_body(body, &headers, w.config().max_body_bytes).await?;
    let req: CreateProjectRequest = json_body(&bytes)?;
    let key = w.create_project(&req.name)?;
    api_answer(
        StatusCode::CREATED,
        &NewApiKey {
            api_key_id: key.id().to_owned(),
            project: req.name,
            api_key: key.token,
        },
    )
}

async fn list_projects(
    State(w): State<Arc<Witness>>,
    headers: HeaderMap,
) -> Result<Response, WitnessError> {
    w.authenticate_admin(bearer(&headers))?;
    let projects = w
        .registry()
        .projects()
        .into_iter()
        .map(|(name, row)| ProjectSummary {
            agents: w.registry().agents_of(&name).len() as u64,
            name,
            created: row.created,
        })
        .collect();
    api_answer(StatusCode::OK, &ProjectList { projects })
}

async fn new_api_key(
    State(w): State<Arc<Witness>>,
    headers: HeaderMap,
    project: Result<Path<String>, PathRejection>,
) -> Result<Response, WitnessError> {
    w.authenticate_admin(bearer(&headers))?;
    let Path(project) = project.map_err(|e| WitnessError::BadRequest {
        code: "bad_parameter",
        message: e.body_text(),
    })?;
    let key = w.new_api_key(&project)?;
    api_answer(
        StatusCode::CREATED,
        &NewApiKey {
            api_key_id: key.id().to_owned(),
            project,
            api_key: key.token,
        },
    )
}

async fn revoke_api_key(
    State(w): State<Arc<Witness>>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, WitnessError> {
    w.authenticate_admin(bearer(&headers))?;
    let Path(id) = id.map_err(|e| WitnessError::BadRequest {
        code: "bad_parameter",
        message: e.body_text(),
    })?;
    w.registry().revoke_api_key(&id, w.now())?;
    api_answer(
        StatusCode::OK,
        &ApiKeyRevoked {
            api_key_id: id,
            revoked: true,
        },
    )
}

async fn create_read_token(
    State(w): State<Arc<Witness>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, WitnessError> {
    w.authenticate_admin(bearer(&headers))?;
    let bytes = read_body(body, &headers, w.config().max_body_bytes).await?;
    let req: CreateReadTokenRequest = json_body(&bytes)?;
    let now = w.now();
    let token = w.with_rng(|rng| w.registry().create_read_token(&req.label, now, rng))?;
    api_answer(
        StatusCode::CREATED,
        &NewReadToken {
            read_token_id: token.id().to_owned(),
            read_token: token.token,
            label: req.label,
        },
    )
}

async fn list_read_tokens(
    State(w): State<Arc<Witness>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, WitnessError> {
    w.authenticate_admin(bearer(&headers))?;
    query(raw.as_deref(), &[], &[])?;
    let read_tokens = w
        .registry()
        .read_tokens()
        .into_iter()
        .map(|(id, row)| ReadTokenSummary {
            id,
            label: row.label,
            created: row.created,
            revoked: row.revoked,
        })
        .collect();
    api_answer(StatusCode::OK, &ReadTokenList { read_tokens })
}

async fn revoke_read_token(
    State(w): State<Arc<Witness>>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, WitnessError> {
    w.authenticate_admin(bearer(&headers))?;
    let Path(id) = id.map_err(|e| WitnessError::BadRequest {
        code: "bad_parameter",
        message: e.body_text(),
    })?;
    w.registry().revoke_read_token(&id, w.now())?;
    api_answer(
        StatusCode::OK,
        &ReadTokenRevoked {
            read_token_id: id,
            revoked: true,
        },
    )
}

// ---- exports ---------------------------------------------------------------

fn owned_agents(
    w: &Witness,
    principal: &Principal,
    agents: Vec<AgentName>,
) -> Result<Vec<AgentName>, WitnessError> {
    if agents.is_empty() {
        return Ok(w
            .registry()
            .agents_of(&principal.project)
            .into_iter()
            .map(|(a, _)| a)
            .collect());
    }
    for a in &agents {
        w.owned_agent(principal, a)?;
    }
    Ok(agents)
}

async fn agent_keys(
    State(w): State<Arc<Witness>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, WitnessError> {
    let principal = w.authenticate(bearer(&headers))?;
    let params = query(raw.as_deref(), &["agent"], &["agent"])?;
    let only = agents_param(&params)?;
    let doc = export::agent_keys(w.registry(), w.log().origin(), &principal.project, &only)?;
    Ok(json_response(StatusCode::OK, export::to_canonical(&doc)?))
}

async fn head(
    State(w): State<Arc<Witness>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, WitnessError> {
    let reader = record_reader(&w, &headers)?;
    let params = query(raw.as_deref(), &["from_size", "agent"], &["agent"])?;
    let from_size = TreeSize::new(number(
        "from_size",
        param(&params, "from_size").ok_or_else(|| WitnessError::BadRequest {
            code: "missing_parameter",
            message: "from_size is required (the pack checkpoint's size)".into(),
        })?,
    )?);
    let named = agents_param(&params)?;
    let require_all = !named.is_empty();
    let agents = readable_agents(&w, &reader, named)?;
    let cp = export::pinned_checkpoint(&w).await?;
    let w2 = Arc::clone(&w);
    let doc =
        blocking(move || export::head_at(w2.log(), &cp, from_size, &agents, require_all)).await?;
    Ok(json_response(StatusCode::OK, export::to_canonical(&doc)?))
}

fn export_range(params: &[(&'static str, String)]) -> Result<ExportRange, WitnessError> {
    let seq = |n: &str| -> Result<Option<Seq>, WitnessError> {
        param(params, n)
            .map(|v| {
                number(n, v).and_then(|x| {
                    Seq::new(x).map_err(|e| WitnessError::BadRequest {
                        code: "bad_parameter",
                        message: e.to_string(),
                    })
                })
            })
            .transpose()
    };
    let time = |n: &str| param(params, n).map(|v| time_param(n, v)).transpose();
    let (from, to) = (seq("from_seq")?, seq("to_seq")?);
    let (since, until) = (time("since")?, time("until")?);
    match (
        from.is_some() || to.is_some(),
        since.is_some() || until.is_some(),
    ) {
        (true, true) => Err(WitnessError::BadRequest {
            code: "bad_parameter",
            message: "give a seq range or a time range, not both".into(),
        }),
        (true, false) => {
            if let (Some(f), Some(t)) = (from, to) {
                if f > t {
                    return Err(WitnessError::BadRequest {
                        code: "bad_parameter",
                        message: "from_seq is after to_seq".into(),
                    });
                }
            }
            Ok(ExportRange::Seq { from, to })
        }
        (false, true) => Ok(ExportRange::Time { since, until }),
        (false, false) => Ok(ExportRange::All),
    }
}

async fn export_pack(
    State(w): State<Arc<Witness>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, WitnessError> {
    let reader = record_reader(&w, &headers)?;
    let params = query(
        raw.as_deref(),
        &["agent", "from_seq", "to_seq", "since", "until"],
        &["agent"],
    )?;
    let range = export_range(&params)?;
    let named = agents_param(&params)?;
    if named.is_empty() {
        return Err(WitnessError::BadRequest {
            code: "missing_parameter",
            message: "name at least one agent (agent=NAME, repeatable)".into(),
        });
    }
    let agents = readable_agents(&w, &reader, named)?;
    let cp = export::pinned_checkpoint(&w).await?;
    let missing = missing_cosigners(&w, &cp.note);
    let w2 = Arc::clone(&w);
    let plan = blocking(move || export::plan_pack_at(w2.log(), cp, &agents, range)).await?;
    let body = export::pack_body(Arc::clone(w.log()), plan, w.now());
    let mut response = (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static(PACK_CONTENT_TYPE),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body,
    )
        .into_response();
    if let Some(v) = (!missing.is_empty())
        .then(|| HeaderValue::from_str(&missing.join(", ")).ok())
        .flatten()
    {
        response
            .headers_mut()
            .insert(header::HeaderName::from_static(COSIGNERS_MISSING), v);
    }
    Ok(response)
}

/// The export's answer header naming the configured cosigners whose
/// cosignature the pack's checkpoint lacks (docs/api.md "Exports"): a
/// `verify --trust` that counts them may then fail its quorum.
const COSIGNERS_MISSING: &str = "tally-cosigners-missing";

/// The configured cosigners (their operator names) with no signature line
/// on `note`.
fn missing_cosigners(w: &Witness, note: &str) -> Vec<String> {
    let (Some(c), Ok(parsed)) = (w.cosigning(), tally_schemas::note::SignedNote::parse(note))
    else {
        return Vec::new();
    };
    c.config()
        .cosigners
        .iter()
        .filter(|k| parsed.signature_by(k.key.name(), k.key.id()).is_none())
        .map(|k| k.name.clone())
        .collect()
}

// ---- public reads ----------------------------------------------------------

async fn key_directory(State(w): State<Arc<Witness>>) -> Result<Response, WitnessError> {
    Ok(json_response(
        StatusCode::OK,
        export::to_canonical(w.key_directory())?,
    ))
}

async fn metrics(State(w): State<Arc<Witness>>) -> Response {
    let size = w.log().latest_checkpoint().checkpoint.size.get();
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        {
            let mut text = w.metrics().render(w.log().stats(), size);
            w.render_quotas(&mut text);
            if let Some(c) = w.cosigning() {
                c.render_metrics(&mut text);
            }
            text
        },
    )
        .into_response()
}

async fn healthz(State(w): State<Arc<Witness>>) -> Response {
    // The log's size tells how much was recorded: withheld from the public
    // when the log is not.
    if w.config().log_read == LogRead::Token {
        return json_value(StatusCode::OK, &json!({"status": "ok"}));
    }
    let size = w.log().latest_checkpoint().checkpoint.size.get();
    json_value(StatusCode::OK, &json!({"status": "ok", "tree_size": size}))
}
