//! The log line for each refused credential (401 `unauthorized`, 403
//! `agent_not_allowed` and `key_not_allowed`, docs/api.md "Errors"), so an
//! operator sees why an agent fails without asking it (docs/operations.md,
//! "Logs"). One `warn` line per refusal with the route, the status and
//! stable code, the project of the API key when it is a current one, the
//! agent and key id the error names, and the API key's public id: never
//! its secret, never a token that does not have the shape of one.
//!
//! A client without a key must not be able to flood the log: at most
//! [`BURST`] lines per [`WINDOW`]; beyond that one line says that refusals
//! are being counted, and the next line logged after the window carries
//! the count.
//!
//! The error-to-response mapping ([`crate::error`]) marks a refusal with a
//! [`Refusal`] response extension; [`with_refusal_log`] adds the layer
//! that logs it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use axum::Router;

use crate::registry::{key_id_of, ADMIN_TOKEN_PREFIX, API_KEY_PREFIX};
use crate::Witness;

/// Lines logged per window at most.
pub const BURST: u32 = 20;
/// The window of [`BURST`].
pub const WINDOW: Duration = Duration::from_secs(60);

/// What a 401 or 403 answer refused (defined beside the error mapping
/// that sets it).
pub use crate::error::Refusal;

/// The refused credentials of the records of a batch answer (`POST
/// /v1/records/batch` answers 200 and refuses record by record): each
/// distinct one with the status its record got, logged like a [`Refusal`].
#[derive(Debug, Clone, Default)]
pub struct BatchRefusals(pub Vec<(u16, Refusal)>);

/// How many lines the current window allows, and how many were held back.
#[derive(Debug)]
struct Limiter {
    window_start: Instant,
    logged: u32,
    suppressed: u64,
}

enum Verdict {
    /// Log it, with the count held back since the last line.
    Log { suppressed: u64 },
    /// The first refusal over the limit: say that the rest are counted.
    Quiet,
    /// Count it.
    Count,
}

impl Limiter {
    fn judge(&mut self, now: Instant) -> Verdict {
        if now.duration_since(self.window_start) >= WINDOW {
            self.window_start = now;
            self.logged = 0;
        }
        if self.logged < BURST {
            self.logged += 1;
            return Verdict::Log {
                suppressed: std::mem::take(&mut self.suppressed),
            };
        }
        self.suppressed += 1;
        if self.suppressed == 1 {
            Verdict::Quiet
        } else {
            Verdict::Count
        }
    }
}

#[derive(Clone)]
struct LogState {
    witness: Arc<Witness>,
    limiter: Arc<Mutex<Limiter>>,
}

/// `router` with every 401 and 403 answer logged (module docs).
pub fn with_refusal_log(router: Router, witness: Arc<Witness>) -> Router {
    let state = LogState {
        witness,
        limiter: Arc::new(Mutex::new(Limiter {
            window_start: Instant::now(),
            logged: 0,
            suppressed: 0,
        })),
    };
    router.layer(axum::middleware::from_fn_with_state(state, log_refusals))
}

/// Who presented what, in words safe for a log: the public id of an API
/// key, never a secret.
fn presented(token: Option<&str>) -> String {
    match token {
        None => "no token".to_owned(),
        Some(t) => match key_id_of(t, API_KEY_PREFIX) {
            Some(id) => format!("API key {id}"),
            None if key_id_of(t, ADMIN_TOKEN_PREFIX).is_some() => "an admin token".to_owned(),
            None => "a token that is not an API key".to_owned(),
        },
    }
}

async fn log_refusals(State(s): State<LogState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| req.uri().path().to_owned(), |m| m.as_str().to_owned());
    let method = req.method().clone();
    let authorization = req.headers().get(header::AUTHORIZATION).cloned();
    let resp = next.run(req).await;
    let refusals: Vec<(u16, Refusal)> = match (
        resp.extensions().get::<Refusal>(),
        resp.extensions().get::<BatchRefusals>(),
    ) {
        (Some(r), _) => vec![(resp.status().as_u16(), r.clone())],
        (None, Some(b)) => b.0.clone(),
        (None, None) => return resp,
    };
    for (status, refusal) in refusals {
        let verdict = s
            .limiter
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .judge(Instant::now());
        match verdict {
            Verdict::Count => {}
            Verdict::Quiet => tracing::warn!(
                "more than {BURST} refused credentials within {} s: the rest are counted, not logged, until the window ends",
                WINDOW.as_secs()
            ),
            Verdict::Log { suppressed } => {
                let token = authorization.as_ref().and_then(|v| {
                    let (scheme, token) = v.to_str().ok()?.split_once(' ')?;
                    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
                });
                let project = token
                    .and_then(|t| s.witness.registry().authenticate(t))
                    .map(|p| p.project);
                tracing::warn!(
                    status,
                    code = refusal.code,
                    route = %format!("{method} {route}"),
                    project = project.as_deref().unwrap_or("-"),
                    agent = refusal.agent.as_deref().unwrap_or("-"),
                    key_id = refusal.key_id.as_deref().unwrap_or("-"),
                    presented = %presented(token),
                    suppressed_before = suppressed,
                    "refused"
                );
            }
        }
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limiter_logs_a_burst_then_counts_and_reports_the_count() {
        let t0 = Instant::now();
        let mut l = Limiter {
            window_start: t0,
            logged: 0,
            suppressed: 0,
        };
        for _ in 0..BURST {
            assert!(matches!(l.judge(t0), Verdict::Log { suppressed: 0 }));
        }
        assert!(matches!(l.judge(t0), Verdict::Quiet));
        for _ in 0..5 {
            assert!(matches!(l.judge(t0), Verdict::Count));
        }
        assert!(matches!(
            l.judge(t0 + WINDOW),
            Verdict::Log { suppressed: 6 }
        ));
        assert!(matches!(
            l.judge(t0 + WINDOW),
            Verdict::Log { suppressed: 0 }
        ));
    }

    #[test]
    fn only_the_public_id_of_a_key_is_named() {
        let secret = "ab".repeat(24);
        let key = format!("tally_0123456789abcdef_{secret}");
        assert_eq!(presented(Some(&key)), "API key 0123456789abcdef");
        assert_eq!(
            presented(Some("tally_0123456789abcdef_short")),
            "a token that is not an API key"
        );
        assert_eq!(presented(None), "no token");
        assert!(!presented(Some(&format!("tallyadm_0123456789abcdef_{secret}"))).contains(&secret));
    }
}
