//! # tally-console
//!
//! The witness's console: server-rendered pages at `/console` for operators
//! (login with a project API key) and auditors (a read-only link): overview,
//! agent pages with the verifier's coverage, record pages with proofs, a
//! verify page, and auditor links. docs/console.md describes the pages,
//! docs/api.md "Console" lists the routes, docs/operations.md "Console" how
//! to run it. `tally serve` merges [`router`] into the witness's router.
//!
//! - `handlers`: the routes (`handlers/login.rs` the login, logout and form checks, `handlers/verify.rs` the Verify page); `pages`: the HTML (auto-escaped);
//! - `data`: what the pages read from the log, and the verifier runs;
//! - `auth`: sessions and CSRF, over `session_store` (memory, or the
//!   PostgreSQL database every front shares); `throttle`: the login
//!   throttle; [`store`]: auditor links (`console.redb`).
//! - [`ConsoleLimits`]: every limit the console keeps, with its default.
//!
//! Everything is served by the binary: the CSS and JS are embedded with
//! `include_str!`, no CDN. Every response carries a strict
//! Content-Security-Policy (no inline script or style, nothing from other
//! origins) and is not cached.

mod auth;
mod console;
mod data;
mod handlers;
mod pages;
mod session_store;
pub mod store;
#[cfg(test)]
mod tests;
mod throttle;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;

pub use auth::SessionLimits;
pub(crate) use console::Report;
pub use console::{
    Console, ConsoleLimits, OpenError, AUDITOR_UPLOADS, CONSOLE_DB, CSP, LOGIN_GLOBAL,
    LOGIN_PER_ADDRESS, MAX_FORM_BYTES, MAX_VERIFY_PACK_BYTES, OPERATOR_UPLOADS, UPLOAD_DEADLINE,
    UPLOAD_IDLE,
};
pub use session_store::SessionStoreError;
pub use throttle::Rate;

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
        .route("/console/agents/{agent}/report", get(h::agent_report))
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
        .route("/console/links/{id}/disclosures", post(h::links_disclose))
        .route("/console/a/{token}", get(h::auditor_home))
        .route("/console/a/{token}/agents/{agent}", get(h::auditor_agent))
        .route("/console/a/{token}/records/{index}", get(h::auditor_record))
        .route(
            "/console/a/{token}/records/{index}/pack",
            get(h::auditor_record_pack),
        )
        .route("/console/a/{token}/pack", get(h::auditor_pack))
        .route("/console/a/{token}/report", get(h::auditor_report))
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
        // Every route's body is small but the verify uploads' (their own
        // limit, set on the route, takes precedence over this one).
        .layer(DefaultBodyLimit::max(MAX_FORM_BYTES))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(console)
}
