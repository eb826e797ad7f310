//! Console sessions (docs/console.md "Access"): an operator logs in with one of
//! the project's API keys and gets a session cookie; every state-changing
//! form carries the session's CSRF token.
//!
//! - The session token is 256 random bits, sent only in the cookie
//!   `tally_console` (`HttpOnly; SameSite=Strict; Path=/console`, plus
//!   `Secure` when the witness serves TLS); only its SHA-256 is kept, in
//!   memory. A restart logs everyone out, which is the safe direction.
//! - The API key is kept in the session (memory only) and re-checked on every
//!   request, so revoking the key ends its console sessions at once.
//! - Sessions end after [`SESSION_TTL_MS`]; at most [`MAX_SESSIONS`] live at
//!   once (the oldest is dropped first).
//! - CSRF: a per-session random token in a hidden field, compared in
//!   constant time, on top of `SameSite=Strict`; and any POST whose
//!   `Sec-Fetch-Site` or `Origin` says it came from another site is refused.
//! - The login form itself carries a random token that must equal the one in
//!   the `tally_login` cookie it set (`SameSite=Strict`, so another site's
//!   form post never has it): no login CSRF, even from a browser that sends
//!   neither `Sec-Fetch-Site` nor `Origin`.

use std::collections::HashMap;
use std::sync::Mutex;

use axum::http::{header, HeaderMap};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tally_schemas::UnixMillis;

use tally_witness::registry::Principal;
use tally_witness::witness::Witness;

/// The session cookie's name.
pub const COOKIE: &str = "tally_console";
/// The login form's cookie (its anti-CSRF token).
pub const LOGIN_COOKIE: &str = "tally_login";
/// How long a login form stays usable: 1 hour.
pub const LOGIN_TTL_SECS: i64 = 3_600;
/// How long a session lasts: 8 hours.
pub const SESSION_TTL_MS: i64 = 8 * 3_600_000;
/// Most sessions at once.
pub const MAX_SESSIONS: usize = 10_000;

struct Session {
    api_key: String,
    csrf: String,
    expires: UnixMillis,
}

/// A logged-in operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    /// The project the API key belongs to.
    pub project: String,
    /// The session's CSRF token (for forms).
    pub csrf: String,
    /// SHA-256 of the session token, hex (to end the session on logout).
    pub session_id: String,
}

/// The sessions, in memory.
#[derive(Default)]
pub struct Sessions {
    by_hash: Mutex<HashMap<String, Session>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").finish_non_exhaustive()
    }
}

fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        self.by_hash
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Logs in with `api_key`: returns the project and the new session token
    /// (for the cookie), or `None` when the key is unknown or revoked.
    pub fn login(&self, w: &Witness, api_key: &str) -> Option<(Principal, String)> {
        let principal = w.registry().authenticate(api_key.trim())?;
        let (token, csrf) = w.with_rng(|rng| {
            let mut t = [0u8; 32];
            let mut c = [0u8; 32];
            rng.fill_bytes(&mut t);
            rng.fill_bytes(&mut c);
            (hex::encode(t), hex::encode(c))
        });
        let now = w.now();
        let mut map = self.lock();
        map.retain(|_, s| s.expires > now);
        while map.len() >= MAX_SESSIONS {
            let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            map.remove(&oldest);
        }
        map.insert(
            sha256_hex(&token),
            Session {
                api_key: api_key.trim().to_owned(),
                csrf,
                expires: UnixMillis::new(now.as_millis().saturating_add(SESSION_TTL_MS)),
            },
        );
        Some((principal, token))
    }

    /// The operator of the request's session cookie, if it is live and its
    /// API key still authenticates.
    pub fn operator(&self, w: &Witness, headers: &HeaderMap) -> Option<Operator> {
        let token = cookie(headers, COOKIE)?;
        let id = sha256_hex(token);
        let now = w.now();
        let mut map = self.lock();
        let session = map.get(&id)?;
        if session.expires <= now {
            map.remove(&id);
            return None;
        }
        let Some(principal) = w.registry().authenticate(&session.api_key) else {
            map.remove(&id);
            return None;
        };
        Some(Operator {
            project: principal.project,
            csrf: session.csrf.clone(),
            session_id: id,
        })
    }

    /// Ends a session.
    pub fn logout(&self, session_id: &str) {
        self.lock().remove(session_id);
    }
}

/// The `Set-Cookie` value that starts a session.
#[must_use]
pub fn session_cookie(token: &str, secure: bool) -> String {
    format!(
        "{COOKIE}={token}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}{}",
        SESSION_TTL_MS / 1000,
        if secure { "; Secure" } else { "" }
    )
}

/// A fresh login-form token: 256 random bits, hex.
pub fn login_token(w: &Witness) -> String {
    w.with_rng(|rng| {
        let mut t = [0u8; 32];
        rng.fill_bytes(&mut t);
        hex::encode(t)
    })
}

/// The `Set-Cookie` value that carries a login form's token.
#[must_use]
pub fn login_cookie(token: &str, secure: bool) -> String {
    format!(
        "{LOGIN_COOKIE}={token}; Path=/console/login; HttpOnly; SameSite=Strict; Max-Age={LOGIN_TTL_SECS}{}",
        if secure { "; Secure" } else { "" }
    )
}

/// Whether a login post's form token equals its `tally_login` cookie
/// (compared in constant time).
#[must_use]
pub fn login_token_ok(headers: &HeaderMap, submitted: Option<&str>) -> bool {
    match (cookie(headers, LOGIN_COOKIE), submitted) {
        (Some(c), Some(s)) if c.len() == 64 && s.len() == c.len() => {
            s.as_bytes().ct_eq(c.as_bytes()).into()
        }
        _ => false,
    }
}

/// The `Set-Cookie` value that ends a session.
#[must_use]
pub fn clear_cookie(secure: bool) -> String {
    format!(
        "{COOKIE}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0{}",
        if secure { "; Secure" } else { "" }
    )
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// Whether a submitted CSRF token equals the session's (constant time).
#[must_use]
pub fn csrf_ok(operator: &Operator, submitted: Option<&str>) -> bool {
    match submitted {
        Some(s) if s.len() == operator.csrf.len() => {
            s.as_bytes().ct_eq(operator.csrf.as_bytes()).into()
        }
        _ => false,
    }
}

/// Whether a POST may have come from this site. Browsers send
/// `Sec-Fetch-Site`: a value other than `same-origin` or `none` (typed or
/// bookmarked) means another site made the request. Older ones send
/// `Origin`: one whose host is not the request's `Host` does too.
#[must_use]
pub fn same_site_post(headers: &HeaderMap) -> bool {
    if let Some(v) = headers.get("sec-fetch-site") {
        return matches!(v.to_str(), Ok("same-origin" | "none"));
    }
    match headers.get(header::ORIGIN) {
        None => true,
        Some(origin) => {
            let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
            let origin_host = origin
                .to_str()
                .ok()
                .and_then(|o| o.split_once("://"))
                .map(|(_, rest)| rest);
            matches!((origin_host, host), (Some(o), Some(h)) if o.eq_ignore_ascii_case(h))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn console_cookie_parsing_and_flags() {
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; tally_console=abc ; b=2"),
        );
        assert_eq!(cookie(&h, COOKIE), Some("abc"));
        assert_eq!(cookie(&h, "b"), Some("2"));
        assert_eq!(cookie(&h, "c"), None);
        let c = session_cookie("t", true);
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.ends_with("; Secure"));
        assert!(!session_cookie("t", false).contains("Secure"));
    }

    #[test]
    fn console_csrf_and_fetch_site() {
        let op = Operator {
            project: "p".into(),
            csrf: "abcd".into(),
            session_id: "x".into(),
        };
        assert!(csrf_ok(&op, Some("abcd")));
        assert!(!csrf_ok(&op, Some("abce")));
        assert!(!csrf_ok(&op, Some("abc")));
        assert!(!csrf_ok(&op, None));
        let mut h = HeaderMap::new();
        assert!(same_site_post(&h));
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(!same_site_post(&h));
        h.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(same_site_post(&h));
        // Without Sec-Fetch-Site, Origin must name the request's host.
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:7878"));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:7878"),
        );
        assert!(same_site_post(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert!(!same_site_post(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(!same_site_post(&h));
        h.remove(header::HOST);
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:7878"),
        );
        assert!(!same_site_post(&h));
    }

    #[test]
    fn console_login_token_must_match_its_cookie() {
        let t = "a".repeat(64);
        let mut h = HeaderMap::new();
        assert!(!login_token_ok(&h, Some(&t)), "no cookie");
        h.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("{LOGIN_COOKIE}={t}")).unwrap(),
        );
        assert!(login_token_ok(&h, Some(&t)));
        assert!(!login_token_ok(&h, Some(&"b".repeat(64))));
        assert!(!login_token_ok(&h, Some("")));
        assert!(!login_token_ok(&h, None));
        let c = login_cookie(&t, true);
        assert!(c.contains("Path=/console/login") && c.contains("SameSite=Strict"));
        assert!(c.contains("HttpOnly") && c.ends_with("; Secure"));
    }
}
