//! Console sessions (docs/console.md "Access"): an operator logs in with one of
//! the project's API keys and gets a session cookie; every state-changing
//! form carries the session's CSRF token. The rules are here, one code path
//! whichever store keeps the sessions (`session_store`: this process's
//! memory with redb, the shared database with PostgreSQL).
//!
//! - The session token is 256 random bits, sent only in the cookie
//!   `tally_console` (`HttpOnly; SameSite=Strict; Path=/console`, plus
//!   `Secure` when the witness serves TLS). The store keeps its SHA-256
//!   (the session's id), never the token.
//! - The API key is not kept either: only its public id and its SHA-256,
//!   as the registry keeps it. The key is re-checked against the registry
//!   on every request (on a shared registry after asking the database
//!   whether it changed), so revoking it ends its console sessions at once,
//!   on every front.
//! - Sessions end after [`SESSION_TTL_MS`]; expired ones are deleted by
//!   the next login, or when presented. A project holds at most
//!   [`SessionLimits::per_project`] sessions: a login past that ends the
//!   oldest session of the project's API key that holds the most, so one
//!   key holder logging in again and again ends only its own sessions, and
//!   never another project's. The whole table holds at most
//!   [`SessionLimits::total`]: past that a login ends the oldest session of
//!   the project that holds the most. A login decides and writes in one
//!   transaction that no other login interleaves with, through any front.
//! - CSRF: a per-session token in a hidden field, compared in constant
//!   time, on top of `SameSite=Strict`; and any POST whose `Sec-Fetch-Site`
//!   or `Origin` says it came from another site is refused. The token is
//!   SHA-256 of a domain prefix and the session token, so every front
//!   derives the same one and nothing that makes it is stored.
//! - The login form itself carries a random token that must equal the one in
//!   the `tally_login` cookie it set (`SameSite=Strict`, so another site's
//!   form post never has it): no login CSRF, even from a browser that sends
//!   neither `Sec-Fetch-Site` nor `Origin`.

use std::cmp::Reverse;
use std::collections::HashMap;

use axum::http::{header, HeaderMap};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tally_schemas::UnixMillis;

use crate::session_store::{
    KeySessions, MemorySessions, SessionStore, SessionStoreError, StoredSession,
};
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
/// The domain prefix of a session's CSRF token.
const CSRF_DOMAIN: &[u8] = b"tally/console/csrf\n";

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

/// The sessions: the rules of the module docs over a [`SessionStore`].
pub(crate) struct Sessions {
    limits: SessionLimits,
    store: Box<dyn SessionStore>,
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
            .field("shared", &self.store.is_shared())
            .finish_non_exhaustive()
    }
}

/// The session a login of `project` ends so that the new one fits, if one
/// must end, from the census of every API key holding sessions: see the
/// module docs.
pub(crate) fn victim(
    census: &[KeySessions],
    project: &str,
    limits: SessionLimits,
) -> Option<String> {
    let in_project: usize = census
        .iter()
        .filter(|k| k.project == project)
        .map(|k| k.sessions)
        .sum();
    let total: usize = census.iter().map(|k| k.sessions).sum();
    let project = if in_project >= limits.per_project.max(1) {
        project
    } else if total >= limits.total.max(1) {
        // The project with the most sessions (ties: the one whose oldest
        // session is oldest).
        let mut counts: HashMap<&str, (usize, u64)> = HashMap::new();
        for k in census {
            let c = counts.entry(&k.project).or_insert((0, u64::MAX));
            c.0 += k.sessions;
            c.1 = c.1.min(k.oldest_order);
        }
        counts
            .into_iter()
            .max_by_key(|(_, (n, oldest))| (*n, Reverse(*oldest)))
            .map(|(p, _)| p)?
    } else {
        return None;
    };
    // Within it, the API key with the most sessions, and its oldest one.
    census
        .iter()
        .filter(|k| k.project == project)
        .max_by_key(|k| (k.sessions, Reverse(k.oldest_order)))
        .map(|k| k.oldest_id.clone())
}

fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// The CSRF token of the session whose token is `token`.
fn csrf_token(token: &str) -> String {
    let mut h = Sha256::new();
    h.update(CSRF_DOMAIN);
    h.update(token.as_bytes());
    hex::encode(h.finalize())
}

fn is_session_token(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// On a registry shared through the database, the changes other fronts
/// made (a revoked key) before a key is checked: one cheap query, and a
/// reload when something changed.
fn fresh_registry(w: &Witness) -> Result<(), SessionStoreError> {
    let registry = w.registry();
    if registry.is_shared() {
        registry
            .refresh_if_changed()
            .map_err(|e| SessionStoreError::Storage(format!("reading the registry: {e}")))?;
    }
    Ok(())
}

impl Sessions {
    /// Sessions in this process's memory, with these limits.
    #[must_use]
    pub(crate) fn new(limits: SessionLimits) -> Self {
        Self::on(Box::new(MemorySessions::default()), limits)
    }

    /// Sessions in `store`, with these limits.
    #[must_use]
    pub(crate) fn on(store: Box<dyn SessionStore>, limits: SessionLimits) -> Self {
        Self { limits, store }
    }

    /// Whether the store is shared (and its calls may wait on the network).
    #[must_use]
    pub(crate) fn is_shared(&self) -> bool {
        self.store.is_shared()
    }

    /// Logs in with `api_key`: returns the project and the new session token
    /// (for the cookie), or `None` when the key is unknown or revoked.
    ///
    /// # Errors
    /// [`SessionStoreError`] when the store (or the shared registry) cannot
    /// be reached; no session is made then.
    pub(crate) fn login(
        &self,
        w: &Witness,
        api_key: &str,
    ) -> Result<Option<(Principal, String)>, SessionStoreError> {
        let api_key = api_key.trim();
        fresh_registry(w)?;
        let Some(principal) = w.registry().authenticate(api_key) else {
            return Ok(None);
        };
        let token = w.with_rng(|rng| {
            let mut t = [0u8; 32];
            rng.fill_bytes(&mut t);
            hex::encode(t)
        });
        let now = w.now();
        let new = StoredSession {
            id: sha256_hex(&token),
            project: principal.project.clone(),
            key_id: principal.key_id.clone(),
            key_sha256: sha256_hex(api_key),
            created: now,
            expires: UnixMillis::new(now.as_millis().saturating_add(SESSION_TTL_MS)),
        };
        let limits = self.limits;
        self.store.login(&new, now, &|census: &[KeySessions]| {
            victim(census, &new.project, limits)
        })?;
        Ok(Some((principal, token)))
    }

    /// The operator of session token `token` (the cookie's value), if the
    /// session is live and its API key still authenticates; a session that
    /// is not is deleted.
    ///
    /// # Errors
    /// [`SessionStoreError`] when the store (or the shared registry) cannot
    /// be reached.
    pub(crate) fn operator(
        &self,
        w: &Witness,
        token: &str,
    ) -> Result<Option<Operator>, SessionStoreError> {
        if !is_session_token(token) {
            return Ok(None);
        }
        let id = sha256_hex(token);
        let Some(session) = self.store.get(&id)? else {
            return Ok(None);
        };
        if session.expires <= w.now() {
            self.store.remove(&id)?;
            return Ok(None);
        }
        fresh_registry(w)?;
        let mut key_sha256 = [0u8; 32];
        let principal = hex::decode_to_slice(&session.key_sha256, &mut key_sha256)
            .ok()
            .and_then(|()| w.registry().authenticate_hash(&session.key_id, &key_sha256))
            .filter(|p| p.project == session.project);
        let Some(principal) = principal else {
            self.store.remove(&id)?;
            return Ok(None);
        };
        Ok(Some(Operator {
            project: principal.project,
            csrf: csrf_token(token),
            session_id: id,
        }))
    }

    /// Ends a session.
    ///
    /// # Errors
    /// [`SessionStoreError`] when the store cannot be reached.
    pub(crate) fn logout(&self, session_id: &str) -> Result<(), SessionStoreError> {
        self.store.remove(session_id)
    }

    /// Sessions held now by `project` (expired ones not yet dropped count).
    #[cfg(test)]
    #[must_use]
    pub(crate) fn count(&self, project: &str) -> usize {
        self.store.count(project).unwrap()
    }
}

/// The session token of the request's cookie, if there is one.
#[must_use]
pub(crate) fn session_token(headers: &HeaderMap) -> Option<&str> {
    cookie(headers, COOKIE)
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

/// The server's key for login-form tokens, random per process: a token
/// this server did not make (one a client set in its own cookie and form
/// alike) is refused (docs/console.md "Access").
pub(crate) struct LoginKey([u8; 32]);

impl LoginKey {
    /// A fresh key from the witness's randomness.
    pub(crate) fn new(w: &Witness) -> Self {
        Self(w.with_rng(|rng| {
            let mut k = [0u8; 32];
            rng.fill_bytes(&mut k);
            k
        }))
    }

    /// The tag of a token's random half: SHA-256 of a label, the key and
    /// the nonce, cut to 128 bits.
    fn tag(&self, nonce: &[u8; 16]) -> [u8; 16] {
        let d = Sha256::new()
            .chain_update(b"tally console login form\n")
            .chain_update(self.0)
            .chain_update(nonce)
            .finalize();
        let mut t = [0u8; 16];
        t.copy_from_slice(&d[..16]);
        t
    }

    /// Whether `token` (64 hex digits) is one this key made.
    fn made(&self, token: &str) -> bool {
        let Ok(bytes) = hex::decode(token) else {
            return false;
        };
        let Ok(bytes) = <[u8; 32]>::try_from(bytes) else {
            return false;
        };
        let mut nonce = [0u8; 16];
        nonce.copy_from_slice(&bytes[..16]);
        self.tag(&nonce).ct_eq(&bytes[16..]).into()
    }
}

/// A fresh login-form token: 128 random bits and their tag under the
/// server's [`LoginKey`], hex.
pub(crate) fn login_token(w: &Witness, key: &LoginKey) -> String {
    let nonce = w.with_rng(|rng| {
        let mut t = [0u8; 16];
        rng.fill_bytes(&mut t);
        t
    });
    let mut t = nonce.to_vec();
    t.extend_from_slice(&key.tag(&nonce));
    hex::encode(t)
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
/// (compared in constant time) and was made by this server's `key`.
#[must_use]
pub(crate) fn login_token_ok(key: &LoginKey, headers: &HeaderMap, submitted: Option<&str>) -> bool {
    match (cookie(headers, LOGIN_COOKIE), submitted) {
        (Some(c), Some(s)) if c.len() == 64 && s.len() == c.len() => {
            bool::from(s.as_bytes().ct_eq(c.as_bytes())) && key.made(c)
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

    /// Every front derives the same CSRF token from the session token; it
    /// is neither the token nor the stored id, and tells sessions apart.
    #[test]
    fn console_csrf_token_is_derived_from_the_session_token() {
        let t = "ab".repeat(32);
        assert_eq!(csrf_token(&t), csrf_token(&t));
        assert_eq!(csrf_token(&t).len(), 64);
        assert_ne!(csrf_token(&t), sha256_hex(&t), "not the session's id");
        assert_ne!(csrf_token(&t), t);
        assert_ne!(csrf_token(&t), csrf_token(&"ac".repeat(32)));
        assert!(is_session_token(&t));
        for junk in [
            "",
            "ab",
            &t.to_uppercase(),
            &format!("{t}0"),
            &"g".repeat(64),
        ] {
            assert!(!is_session_token(junk), "{junk}");
        }
    }

    #[test]
    fn console_login_token_must_match_its_cookie_and_be_the_servers() {
        let key = LoginKey([7; 32]);
        let mut nonce = [0u8; 16];
        nonce[0] = 1;
        let t = format!("{}{}", hex::encode(nonce), hex::encode(key.tag(&nonce)));
        let mut h = HeaderMap::new();
        assert!(!login_token_ok(&key, &h, Some(&t)), "no cookie");
        h.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("{LOGIN_COOKIE}={t}")).unwrap(),
        );
        assert!(login_token_ok(&key, &h, Some(&t)));
        assert!(!login_token_ok(&key, &h, Some(&"b".repeat(64))));
        assert!(!login_token_ok(&key, &h, Some("")));
        assert!(!login_token_ok(&key, &h, None));
        // A token the client made up, the same in cookie and form, or one
        // another server (key) made: refused.
        let forged = "a".repeat(64);
        let mut h2 = HeaderMap::new();
        h2.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("{LOGIN_COOKIE}={forged}")).unwrap(),
        );
        assert!(!login_token_ok(&key, &h2, Some(&forged)));
        assert!(!login_token_ok(&LoginKey([8; 32]), &h, Some(&t)));
        let c = login_cookie(&t, true);
        assert!(c.contains("Path=/console/login") && c.contains("SameSite=Strict"));
        assert!(c.contains("HttpOnly") && c.ends_with("; Secure"));
    }
}
