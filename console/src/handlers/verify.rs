//! The Verify page: an uploaded pack, agent-keys.json and head.json
//! checked by the verifier, nothing stored (docs/console.md "Verify").

use std::sync::Arc;

use axum::extract::multipart::MultipartRejection;
use axum::extract::rejection::PathRejection;
use axum::extract::{Multipart, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tally_schemas::limits::MAX_WIRE_OBJECT_BYTES;
use tally_schemas::note::NoteVerifier;
use tally_schemas::pack::{AgentKeys, Head};
use tally_verifier::Verification;
use tokio::sync::OwnedSemaphorePermit;

use crate::auth::{self, Operator};
use crate::data::{self};
use crate::pages::{self, View};
use crate::{Console, MAX_VERIFY_PACK_BYTES};

type S = State<Arc<Console>>;

use super::common::*;

// ---- verify ----------------------------------------------------------------

fn vkey(c: &Console) -> String {
    c.witness.log().verifier().vkey()
}

pub(crate) async fn verify_form(State(c): S, headers: HeaderMap) -> Response {
    match operator(&c, &headers).await {
        Ok((_, view)) => ok(&pages::verify(
            &view,
            &vkey(&c),
            &pages::VerifySettings::default(),
            None,
        )),
        Err(r) => r.into_response(),
    }
}

pub(crate) async fn auditor_verify_form(
    State(c): S,
    token: Result<Path<String>, PathRejection>,
) -> Response {
    match auditor_scope(&c, &token) {
        Ok((_, scope)) => ok(&pages::verify(
            &scope.view,
            &vkey(&c),
            &pages::VerifySettings::default(),
            None,
        )),
        Err(e) => e.into_response(),
    }
}

/// Why an upload gave no report: the status to answer and a message.
#[derive(Debug, Clone)]
struct UploadError {
    status: StatusCode,
    message: String,
}

impl From<String> for UploadError {
    fn from(message: String) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message,
        }
    }
}

impl From<&str> for UploadError {
    fn from(message: &str) -> Self {
        message.to_owned().into()
    }
}

/// One read from an upload, cut off when the client sends nothing for the
/// console's idle timeout (a stalled upload must not hold a slot).
async fn within_idle<T>(
    c: &Console,
    read: impl std::future::Future<Output = T>,
) -> Result<T, UploadError> {
    let idle = c.limits.upload_idle;
    tokio::time::timeout(idle, read)
        .await
        .map_err(|_| UploadError {
            status: StatusCode::REQUEST_TIMEOUT,
            message: format!(
                "the upload sent nothing for {idle:?} and was cut off; send it again, or run tally verify on your machine"
            ),
        })
}

/// An upload whose reading failed: `408` when the server's body deadline
/// cut it off (docs/operations.md "Connections": `--body-timeout` from the
/// head, plus a second per `--body-min-rate` bytes received), else `400`.
fn unreadable(what: &str, e: &axum::extract::multipart::MultipartError) -> UploadError {
    if tally_witness::is_body_timeout(e) {
        UploadError {
            status: StatusCode::REQUEST_TIMEOUT,
            message: "the upload fell behind the server's body deadline and was cut off; send it again, or run tally verify on your machine".into(),
        }
    } else {
        format!("{what}: {}", e.body_text()).into()
    }
}

/// Reads a small multipart field whole, refusing one over `max` bytes.
async fn small_field(
    c: &Console,
    field: &mut axum::extract::multipart::Field<'_>,
    name: &str,
    max: usize,
) -> Result<Vec<u8>, UploadError> {
    let mut out = Vec::new();
    while let Some(chunk) = within_idle(c, field.chunk())
        .await?
        .map_err(|e| unreadable(&format!("reading {name}"), &e))?
    {
        if out.len() + chunk.len() > max {
            return Err(format!("{name} is larger than {max} bytes").into());
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Reads the verify form (fields in the form's order: csrf, witness key,
/// agent keys, head, then the pack, streamed into the verifier) and returns
/// the report. Nothing is written anywhere. `turn` is the upload's slot: it
/// is held until the verifier's thread has ended.
async fn run_upload(
    c: &Console,
    mut multipart: Multipart,
    csrf: Option<&Operator>,
    settings: &mut pages::VerifySettings,
    turn: OwnedSemaphorePermit,
) -> Result<Verification, UploadError> {
    let mut log_key: Option<NoteVerifier> = None;
    let mut keys: Option<AgentKeys> = None;
    let mut head: Option<Head> = None;
    let mut csrf_seen = csrf.is_none();
    loop {
        let mut field = match within_idle(c, multipart.next_field()).await? {
            Ok(Some(f)) => f,
            Ok(None) => return Err("the form has no pack; choose a pack file".into()),
            Err(e) => return Err(unreadable("the upload could not be read", &e)),
        };
        let name = field.name().unwrap_or("").to_owned();
        if !csrf_seen {
            if name != "csrf" {
                return Err("the form's token is missing; reload the page".into());
            }
            let token = small_field(c, &mut field, "csrf", 256).await?;
            let token = String::from_utf8(token).unwrap_or_default();
            if csrf.is_some_and(|op| auth::csrf_ok(op, Some(&token))) {
                csrf_seen = true;
                continue;
            }
            return Err("the form's token does not match your session; reload the page".into());
        }
        match name.as_str() {
            "witness_key" => {
                let text = small_field(c, &mut field, "the witness key", 1024).await?;
                let text = String::from_utf8(text)
                    .map_err(|_| "the witness key is not UTF-8".to_owned())?;
                let text = text.trim();
                if !text.is_empty() {
                    log_key = Some(
                        NoteVerifier::from_vkey(text).map_err(|e| format!("--witness-key: {e}"))?,
                    );
                }
            }
            "agent_keys" => {
                let bytes =
                    small_field(c, &mut field, "agent-keys.json", MAX_WIRE_OBJECT_BYTES).await?;
                keys = Some(AgentKeys::from_json(&bytes).map_err(|e| {
                    swapped(&bytes, "agent-keys.json")
                        .unwrap_or_else(|| format!("agent-keys.json: {e}"))
                })?);
            }
            "head" => {
                let bytes = small_field(c, &mut field, "head.json", MAX_WIRE_OBJECT_BYTES).await?;
                if !bytes.is_empty() {
                    head = Some(Head::from_json(&bytes).map_err(|e| {
                        swapped(&bytes, "head.json").unwrap_or_else(|| format!("head.json: {e}"))
                    })?);
                }
            }
            "max_skew" | "grace" => {
                let text = small_field(c, &mut field, &name, 32).await?;
                let text = String::from_utf8(text).unwrap_or_default();
                let text = text.trim();
                if !text.is_empty() {
                    let secs = text
                        .parse::<u64>()
                        .ok()
                        .filter(|s| *s <= pages::MAX_VERIFY_WINDOW_SECS)
                        .ok_or_else(|| {
                            format!(
                                "--{}: give whole seconds from 0 to {}",
                                name.replace('_', "-"),
                                pages::MAX_VERIFY_WINDOW_SECS
                            )
                        })?;
                    if name == "grace" {
                        settings.grace_secs = secs;
                    } else {
                        settings.max_skew_secs = secs;
                    }
                }
            }
            "pack" => {
                let keys = keys.ok_or_else(|| "choose an agent-keys.json file".to_owned())?;
                settings.head = head.is_some();
                return stream_pack(c, field, keys, log_key, head, settings, turn).await;
            }
            _ => {
                return Err(format!(
                    "unexpected form field {:?}",
                    name.chars().take(40).collect::<String>()
                )
                .into())
            }
        }
    }
}

/// The message for a file chosen under `field` that is recognisably
/// another of tally's files (as `tally verify` names it): which file it is
/// and where it goes. `None` when it is not recognised.
fn swapped(bytes: &[u8], field: &str) -> Option<String> {
    let first = bytes.split(|b| *b == b'\n').next().unwrap_or(bytes);
    let v: serde_json::Value = serde_json::from_slice(first)
        .or_else(|_| serde_json::from_slice(bytes))
        .ok()?;
    let o = v.as_object()?;
    let has = |names: &[&str]| names.iter().all(|n| o.contains_key(*n));
    let (what, goes) = if o.get("type").is_some_and(serde_json::Value::is_string) {
        ("a pack", "choose it under the pack")
    } else if has(&["v", "checkpoint", "from_size", "consistency"]) {
        ("head.json (from `tally head`)", "choose it under head.json")
    } else if has(&["v", "origin", "agents"]) {
        (
            "agent-keys.json (from `tally keys export`)",
            "choose it under agent-keys.json",
        )
    } else if has(&["v", "origin", "keys"]) {
        (
            "the witness's key directory (/.well-known/tally/keys)",
            "the verify page does not read it: paste the witness key instead",
        )
    } else {
        return None;
    };
    Some(format!(
        "the file chosen as {field} is {what}, not {field}: {goes}"
    ))
}

async fn stream_pack(
    c: &Console,
    mut field: axum::extract::multipart::Field<'_>,
    keys: AgentKeys,
    log_key: Option<NoteVerifier>,
    head: Option<Head>,
    settings: &pages::VerifySettings,
    turn: OwnedSemaphorePermit,
) -> Result<Verification, UploadError> {
    let log_key = log_key.unwrap_or_else(|| c.witness.log().verifier().clone());
    let max_skew_ms = settings.max_skew_secs.saturating_mul(1000);
    let grace_ms = settings.grace_secs.saturating_mul(1000);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(16);
    let verifier = tokio::task::spawn_blocking(move || {
        // The slot is free only once this thread is done, even when the
        // request was cut off before.
        let _turn = turn;
        let reader = data::ChunkReader::new(move || rx.blocking_recv());
        data::run_verify(
            reader,
            &keys,
            &log_key,
            head.as_ref(),
            max_skew_ms,
            grace_ms,
        )
    });
    let mut total = 0usize;
    let mut refused: Option<UploadError> = None;
    loop {
        let chunk = match within_idle(c, field.chunk()).await {
            Ok(chunk) => chunk,
            Err(stalled) => {
                let _ = tx
                    .send(Err(std::io::Error::other("the upload stalled")))
                    .await;
                refused = Some(stalled);
                break;
            }
        };
        match chunk {
            Ok(Some(chunk)) => {
                total += chunk.len();
                if total > MAX_VERIFY_PACK_BYTES {
                    let _ = tx
                        .send(Err(std::io::Error::other("the pack is too large")))
                        .await;
                    refused = Some(format!(
                        "the pack is larger than the {MAX_VERIFY_PACK_BYTES} bytes the console accepts; verify it with `tally verify`"
                    ).into());
                    break;
                }
                if tx.send(Ok(chunk.to_vec())).await.is_err() {
                    break; // the verifier stopped reading
                }
            }
            Ok(None) => break,
            Err(e) => {
                let _ = tx.send(Err(std::io::Error::other(e.body_text()))).await;
                refused = Some(unreadable("reading the pack", &e));
                break;
            }
        }
    }
    drop(tx);
    let result = verifier
        .await
        .map_err(|_| "the verifier stopped unexpectedly".to_owned())?;
    if let Some(e) = refused {
        return Err(e);
    }
    result.map_err(|e| format!("pack: {e}").into())
}

/// Runs an upload in its slot, within the console's upload deadline.
async fn upload_within_deadline(
    c: &Console,
    multipart: Result<Multipart, MultipartRejection>,
    csrf: Option<&Operator>,
    settings: &mut pages::VerifySettings,
    turn: OwnedSemaphorePermit,
) -> Result<Verification, UploadError> {
    let multipart =
        multipart.map_err(|e| format!("the upload could not be read: {}", e.body_text()))?;
    let deadline = c.limits.upload_deadline;
    tokio::time::timeout(deadline, run_upload(c, multipart, csrf, settings, turn))
        .await
        .unwrap_or_else(|_| {
            Err(UploadError {
                status: StatusCode::REQUEST_TIMEOUT,
                message: format!(
                    "the upload and its verification took longer than {deadline:?} and were cut off; run tally verify on your machine"
                ),
            })
        })
}

pub(crate) async fn verify_upload(
    State(c): S,
    headers: HeaderMap,
    multipart: Result<Multipart, MultipartRejection>,
) -> Response {
    let (op, view) = match operator(&c, &headers).await {
        Ok(x) => x,
        Err(r) => return r.into_response(),
    };
    if !auth::same_site_post(&headers) {
        return PageError::new(StatusCode::FORBIDDEN, "Cross-site form posts are refused.")
            .with_view(&view)
            .into_response();
    }
    // Operators have slots of their own: auditor links cannot take them.
    let Ok(turn) = Arc::clone(&c.operator_uploads).try_acquire_owned() else {
        return busy(&view);
    };
    let mut settings = pages::VerifySettings::default();
    let result = upload_within_deadline(&c, multipart, Some(&op), &mut settings, turn).await;
    verify_result(&c, &view, &settings, result)
}

fn busy(view: &View) -> Response {
    PageError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "Other uploads are being verified; try again in a moment, or run tally verify on your machine.",
    )
    .with_view(view)
    .into_response()
}

pub(crate) async fn auditor_verify_upload(
    State(c): S,
    token: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    multipart: Result<Multipart, MultipartRejection>,
) -> Response {
    let (_, scope) = match auditor_scope(&c, &token) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    if !auth::same_site_post(&headers) {
        return PageError::new(StatusCode::FORBIDDEN, "Cross-site form posts are refused.")
            .with_view(&scope.view)
            .into_response();
    }
    let Ok(turn) = Arc::clone(&c.auditor_uploads).try_acquire_owned() else {
        return busy(&scope.view);
    };
    let mut settings = pages::VerifySettings::default();
    let result = upload_within_deadline(&c, multipart, None, &mut settings, turn).await;
    verify_result(&c, &scope.view, &settings, result)
}

fn verify_result(
    c: &Console,
    view: &View,
    settings: &pages::VerifySettings,
    result: Result<Verification, UploadError>,
) -> Response {
    match result {
        Ok(v) => ok(&pages::verify(view, &vkey(c), settings, Some(Ok(&v)))),
        Err(e) => page(
            e.status,
            &pages::verify(view, &vkey(c), settings, Some(Err(e.message))),
        ),
    }
}
