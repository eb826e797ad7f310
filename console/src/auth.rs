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
//! - Sessions end after [`SESSION_TTL_MS`]. A project holds at most
//!   [`SessionLimits::per_project`] sessions: a login past that ends the
//!   oldest session of the project's API key that holds the most, so one
//!   key holder logging in again and again ends only its own sessions, and
//!   never another project's. The whole table holds at most
//!   [`SessionLimits::total`]: past that a login ends the oldest session of
//!   the project that holds the most.
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
pub(crate) const COOKIE: &str = "tally_console";
/// The login form's cookie (its anti-CSRF token).
pub(crate) const LOGIN_COOKIE: &str = "tally_login";
/// How long a login form stays usable: 1 hour.
pub(crate) const LOGIN_TTL_SECS: i64 = 3_600;
/// How long a session lasts: 8 hours.
pub(crate) const SESSION_TTL_MS: i64 = 8 * 3_600_000;
/// Default [`SessionLimits::per_project`].
pub(crate) const MAX_SESSIONS_PER_PROJECT: usize = 100;
/// Default [`SessionLimits::total`].
pub(crate) const MAX_SESSIONS: usize = 10_000;

/// How many sessions are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// Most sessions of one project.
    pub per_project: usize,
    /// Most sessions in all.
    pub total: usize,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            per_project: MAX_SESSIONS_PER_PROJECT,
            total: MAX_SESSIONS,
        }
    }
}

struct Session {
    api_key: String,
    /// The API key's public id and its project, for the limits.
    key_id: String,
    project: String,
    csrf: String,
    expires: UnixMillis,
    /// Login order (clock ties are common).
    order: u64,
}

/// A logged-in operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Operator {
    /// The project the API key belongs to.
    pub project: String,
    /// The session's CSRF token (for forms).
    pub csrf: String,
    /// SHA-256 of the session token, hex (to end the session on logout).
    pub session_id: String,
}

/// The sessions, in memory.
pub(crate) struct Sessions {
    limits: SessionLimits,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    by_hash: HashMap<String, Session>,
    logins: u64,
}

impl Default for Sessions {
    fn default() -> Self {
        Self::new(SessionLimits::default())
    }
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// The session to end so that a new one fits, if one must end: see the
/// module docs.
fn victim(map: &HashMap<String, Session>, project: &str, limits: SessionLimits) -> Option<String> {
    let in_project = map.values().filter(|s| s.project == project).count();
    let project = if in_project >= limits.per_project.max(1) {
        project.to_owned()
    } else if map.len() >= limits.total.max(1) {
        // The project with the most sessions (ties: the one whose oldest
        // session is oldest).
        let mut counts: HashMap<&str, (usize, u64)> = HashMap::new();
        for s in map.values() {
            let c = counts.entry(&s.project).or_insert((0, u64::MAX));
            c.0 += 1;
            c.1 = c.1.min(s.order);
        }
        counts
            .into_iter()
            .max_by_key(|(_, (n, oldest))| (*n, std::cmp::Reverse(*oldest)))
            .map(|(p, _)| p.to_owned())?
    } else {
        return None;
    };
    // Within it, the API key with the most sessions, and its oldest one.
    let mut by_key: HashMap<&str, (usize, u64, &str)> = HashMap::new();
    for (id, s) in map.iter().filter(|(_, s)| s.project == project) {
        let e = by_key.entry(&s.key_id).or_insert((0, u64::MAX, id));
        e.0 += 1;
        if s.order < e.1 {
            e.1 = s.order;
            e.2 = id;
        }
    }
    by_key
        .into_values()
        .max_by_key(|(n, oldest, _)| (*n, std::cmp::Reverse(*oldest)))
        .map(|(_, _, id)| id.to_owned())
}

fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

impl Sessions {
    /// An empty table with these limits.
    #[must_use]
    pub(crate) fn new(limits: SessionLimits) -> Self {
        Self {
            limits,
            table: Mutex::new(Table::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Logs in with `api_key`: returns the project and the new session token
    /// (for the cookie), or `None` when the key is unknown or revoked.
    pub(crate) fn login(&self, w: &Witness, api_key: &str) -> Option<(Principal, String)> {
        let principal = w.registry().authenticate(api_key.trim())?;
        let (token, csrf) = w.with_rng(|rng| {
            let mut t = [0u8; 32];
            let mut c = [0u8; 32];
            rng.fill_bytes(&mut t);
            rng.fill_bytes(&mut c);
            (hex::encode(t), hex::encode(c))
        });
        let now = w.now();
        let mut table = self.lock();
        table.by_hash.retain(|_, s| s.expires > now);
        if let Some(id) = victim(&table.by_hash, &principal.project, self.limits) {
            table.by_hash.remove(&id);
        }
        table.logins += 1;
        let order = table.logins;
        table.by_hash.insert(
            sha256_hex(&token),
            Session {
                api_key: api_key.trim().to_owned(),
                key_id: principal.key_id.clone(),
                project: principal.project.clone(),
                csrf,
                expires: UnixMillis::new(now.as_millis().saturating_add(SESSION_TTL_MS)),
                order,
            },
        );
        Some((principal, token))
    }

    /// The operator of the request's session cookie, if it is live and its
    /// API key still authenticates.
    pub(crate) fn operator(&self, w: &Witness, headers: &HeaderMap) -> Option<Operator> {
        let token = cookie(headers, COOKIE)?;
        let id = sha256_hex(token);
        let now = w.now();
        let mut table = self.lock();
        let map = &mut table.by_hash;
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
    pub(crate) fn logout(&self, session_id: &str) {
        self.lock().by_hash.remove(session_id);
    }

    /// Sessions held now by `project` (expired ones not yet dropped count).
    #[cfg(test)]
    #[must_use]
    pub(crate) fn count(&self, project: &str) -> usize {
        self.lock()
            .by_hash
            .values()
            .filter(|s| s.project == project)
            .count()
    }
}

/// The `Set-Cookie` value that starts a session.
#[must_use]
pub(crate) fn session_cookie(token: &str, secure: bool) -> String {
    format!(
        "{COOKIE}={token}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}{}",
        SESSION_TTL_MS / 1000,
        if secure { "; Secure" } else { "" }
    )
}

/// A fresh login-form token: 256 random bits, hex.
pub(crate) fn login_token(w: &Witness) -> String {
    w.with_rng(|rng| {
        let mut t = [0u8; 32];
        rng.fill_bytes(&mut t);
        hex::encode(t)
    })
}

/// The `Set-Cookie` value that carries a login form's token.
#[must_use]
pub(crate) fn login_cookie(token: &str, secure: bool) -> String {
    format!(
        "{LOGIN_COOKIE}={token}; Path=/console/login; HttpOnly; SameSite=Strict; Max-Age={LOGIN_TTL_SECS}{}",
        if secure { "; Secure" } else { "" }
    )
}

/// Whether a login post's form token equals its `tally_login` cookie
/// (compared in constant time).
#[must_use]
pub(crate) fn login_token_ok(headers: &HeaderMap, submitted: Option<&str>) -> bool {
    match (cookie(headers, LOGIN_COOKIE), submitted) {
        (Some(c), Some(s)) if c.len() == 64 && s.len() == c.len() => {
            s.as_bytes().ct_eq(c.as_bytes()).into()
        }
        _ => false,
    }
}

/// The `Set-Cookie` value that ends a session.
#[must_use]
pub(crate) fn clear_cookie(secure: bool) -> String {
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
pub(crate) fn csrf_ok(operator: &Operator, submitted: Option<&str>) -> bool {
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
pub(crate) fn same_site_post(headers: &HeaderMap) -> bool {
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
