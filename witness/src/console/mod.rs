//! The console (issue 7): server-rendered pages at `/console` for operators
//! (login with a project API key) and auditors (a read-only link): overview,
//! agent pages with the verifier's coverage, record pages with proofs, a
//! verify page, and auditor links. docs/api.md "Console" lists the routes,
//! docs/operations.md "Console" how to run it.
//!
//! - [`handlers`]: the routes; [`pages`]: the HTML (auto-escaped);
//! - [`data`]: what the pages read from the log, and the verifier runs;
//! - [`auth`]: sessions and CSRF; [`store`]: auditor links (`console.redb`).
//!
//! Everything is served by the binary: the CSS and JS are embedded with
//! `include_str!`, no CDN. Every response carries a strict
//! Content-Security-Policy (no inline script or style, nothing from other
//! origins) and is not cached.

pub mod auth;
pub mod data;
mod handlers;
pub mod pages;
pub mod store;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::extract::DefaultBodyLimit;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use tally_schemas::AgentName;
use tally_verifier::Verification;

use crate::witness::Witness;
use data::TimeRange;
use store::{LinkStore, LinkStoreError};

/// The console's file in the data folder.
pub const CONSOLE_DB: &str = "console.redb";

/// Largest pack the verify page accepts, in bytes (64 MiB); larger packs
/// are for `tally verify`.
pub const MAX_VERIFY_PACK_BYTES: usize = 64 << 20;

/// The Content-Security-Policy of every console response.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
    connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Verifications kept for agent pages (keyed by agents and range; a report
/// is recomputed when the log has grown).
const MAX_CACHED_REPORTS: usize = 256;

type ReportKey = (Vec<AgentName>, TimeRange);

/// The console's state: the witness it shows, auditor links, sessions.
pub struct Console {
    witness: Arc<Witness>,
    links: LinkStore,
    sessions: auth::Sessions,
    secure_cookies: bool,
    reports: Mutex<HashMap<ReportKey, (u64, Arc<Verification>)>>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("secure_cookies", &self.secure_cookies)
            .finish_non_exhaustive()
    }
}

impl Console {
    /// The console over `witness`, with its auditor links in
    /// `data_dir/console.redb`. `secure_cookies` adds `Secure` to the session
    /// cookie; set it when the witness serves TLS.
    ///
    /// # Errors
    /// [`LinkStoreError`] when the link store cannot be opened.
    pub fn open(
        witness: Arc<Witness>,
        data_dir: &Path,
        secure_cookies: bool,
    ) -> Result<Arc<Self>, LinkStoreError> {
        Ok(Arc::new(Self {
            witness,
            links: LinkStore::open(&data_dir.join(CONSOLE_DB))?,
            sessions: auth::Sessions::default(),
            secure_cookies,
            reports: Mutex::new(HashMap::new()),
        }))
    }

    /// The witness.
    #[must_use]
    pub fn witness(&self) -> &Arc<Witness> {
        &self.witness
    }

    /// The auditor links.
    #[must_use]
    pub fn links(&self) -> &LinkStore {
        &self.links
    }

    fn cached_report(&self, key: &ReportKey, size: u64) -> Option<Arc<Verification>> {
        let map = self
            .reports
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(key)
            .filter(|(s, _)| *s == size)
            .map(|(_, v)| Arc::clone(v))
    }

    fn cache_report(&self, key: ReportKey, size: u64, v: Arc<Verification>) {
        let mut map = self
            .reports
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= MAX_CACHED_REPORTS && !map.contains_key(&key) {
            if let Some(k) = map
                .iter()
                .min_by_key(|(_, (s, _))| *s)
                .map(|(k, _)| k.clone())
            {
                map.remove(&k);
            }
        }
        map.insert(key, (size, v));
    }
}

/// Headers on every console response: the CSP, no caching, no framing, no
/// referrer (auditor tokens are in URLs), no MIME sniffing.
async fn security_headers(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// The console's routes, all under `/console`; merge them into the
/// witness's router.
pub fn router(console: Arc<Console>) -> Router {
    use handlers as h;
    let upload_limit = DefaultBodyLimit::max(
        MAX_VERIFY_PACK_BYTES + 2 * tally_schemas::limits::MAX_WIRE_OBJECT_BYTES + (64 << 10),
    );
    Router::new()
        .route("/console", get(h::overview))
        .route("/console/", get(h::overview))
        .route("/console/login", get(h::login_form).post(h::login))
        .route("/console/logout", post(h::logout))
        .route("/console/agents/{agent}", get(h::agent_page))
        .route("/console/agents/{agent}/pack", get(h::agent_pack))
        .route("/console/records/{index}", get(h::record_page))
        .route("/console/records/{index}/pack", get(h::record_pack))
        .route(
            "/console/verify",
            get(h::verify_form)
                .post(h::verify_upload)
                .layer(upload_limit),
        )
        .route("/console/links", get(h::links_page).post(h::links_create))
        .route("/console/links/{id}/revoke", post(h::links_revoke))
        .route("/console/a/{token}", get(h::auditor_home))
        .route("/console/a/{token}/agents/{agent}", get(h::auditor_agent))
        .route("/console/a/{token}/records/{index}", get(h::auditor_record))
        .route("/console/a/{token}/pack", get(h::auditor_pack))
        .route("/console/a/{token}/agent-keys.json", get(h::auditor_keys))
        .route(
            "/console/a/{token}/verify",
            get(h::auditor_verify_form)
                .post(h::auditor_verify_upload)
                .layer(upload_limit),
        )
        .route("/console/assets/console.css", get(h::css))
        .route("/console/assets/console.js", get(h::js))
        .route("/console/{*rest}", get(h::not_found))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(console)
}
