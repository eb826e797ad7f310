//! The login form, the session it makes, logout, and the checks every
//! other form post passes before its body is read (docs/console.md).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::rejection::FormRejection;
use axum::extract::{ConnectInfo, Form, FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::auth::{self, Operator};
use crate::pages::{self, View};
use crate::Console;

type S = State<Arc<Console>>;

use super::common::*;

// ---- login -----------------------------------------------------------------

/// The login page with a fresh form token in its field and its cookie.
fn login_page(c: &Console, status: StatusCode, message: Option<&str>) -> Response {
    let token = auth::login_token(&c.witness, &c.login_key);
    let mut r = page(status, &pages::login(&token, message));
    if let Ok(v) = HeaderValue::from_str(&auth::login_cookie(&token, c.secure_cookies)) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

pub(crate) async fn login_form(State(c): S) -> Response {
    login_page(&c, StatusCode::OK, None)
}

#[derive(Deserialize)]
pub(crate) struct LoginForm {
    api_key: String,
    #[serde(default)]
    login_token: Option<String>,
}

/// The client's address, when the server handed it over (`tally serve`
/// does, as axum's `ConnectInfo`).
pub(crate) struct ClientAddr(Option<IpAddr>);

impl<St: Send + Sync> FromRequestParts<St> for ClientAddr {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &St) -> Result<Self, Self::Rejection> {
        Ok(Self(
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|ConnectInfo(a)| a.ip()),
        ))
    }
}

/// Reads a form body, after the checks that need only the headers: the
/// console router bounds every form body to [`crate::MAX_FORM_BYTES`]
/// (docs/console.md "Access"), and the server gives it its deadline.
pub(super) async fn read_form<T: DeserializeOwned>(request: Request) -> Result<T, FormRejection> {
    Form::<T>::from_request(request, &()).await.map(|Form(t)| t)
}

/// Marks the request's connection as a key holder's (docs/operations.md
/// "Connections"), once a session or an API key has been checked.
pub(super) fn trust_connection(request: &Request) {
    if let Some(t) = request.extensions().get::<tally_witness::ConnTrust>() {
        t.authenticated();
    }
}

/// `POST /console/login`: the throttle and the origin are decided from the
/// headers, before any of the body is read (docs/console.md "Access").
pub(crate) async fn login(
    State(c): S,
    ClientAddr(client): ClientAddr,
    request: Request,
) -> Response {
    // Every attempt counts, before anything about it is looked at.
    if let Err(wait_ms) = c.login_throttle.take(client, c.witness.now()) {
        let secs = wait_ms.div_ceil(1000).max(1);
        let mut r = login_page(
            &c,
            StatusCode::TOO_MANY_REQUESTS,
            Some(&format!(
                "Too many login attempts; try again in {secs} second{}.",
                if secs == 1 { "" } else { "s" }
            )),
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        return r;
    }
    if !auth::same_site_post(request.headers()) {
        return PageError::new(StatusCode::FORBIDDEN, "Cross-site form posts are refused.")
            .into_response();
    }
    let headers = request.headers().clone();
    let trust = request
        .extensions()
        .get::<tally_witness::ConnTrust>()
        .cloned();
    let form = match read_form::<LoginForm>(request).await {
        Ok(f) => f,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return login_page(&c, e.status(), Some("That form is too large."));
        }
        Err(_) => return login_page(&c, StatusCode::BAD_REQUEST, Some("Enter an API key.")),
    };
    if !auth::login_token_ok(&c.login_key, &headers, form.login_token.as_deref()) {
        return login_page(
            &c,
            StatusCode::FORBIDDEN,
            Some("This login form has expired or was not sent from this site; log in again."),
        );
    }
    let api_key = form.api_key;
    let logged_in = on_sessions(&c, move |c| c.sessions.login(&c.witness, &api_key)).await;
    match logged_in {
        Err(page) => page.into_response(),
        Ok(Some((_, token))) => {
            if let Some(t) = trust {
                t.authenticated();
            }
            let mut r = Redirect::to("/console").into_response();
            if let Ok(v) = HeaderValue::from_str(&auth::session_cookie(&token, c.secure_cookies)) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        Ok(None) => login_page(
            &c,
            StatusCode::UNAUTHORIZED,
            Some("That API key is unknown or revoked."),
        ),
    }
}

/// The pairs of a form body (repeatable names allowed).
pub(super) type Pairs = Vec<(String, String)>;

pub(super) fn field<'a>(pairs: &'a Pairs, name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Checks the session and origin of an operator's form post from its
/// headers, then reads the form and checks its CSRF token: a post without
/// a session is refused with its body unread.
pub(super) async fn checked_post(
    c: &Arc<Console>,
    request: Request,
) -> Result<(Operator, View, Pairs), Refusal> {
    let (op, view) = operator(c, request.headers()).await?;
    trust_connection(&request);
    if !auth::same_site_post(request.headers()) {
        return Err(Refusal::Page(
            PageError::new(StatusCode::FORBIDDEN, "Cross-site form posts are refused.")
                .with_view(&view),
        ));
    }
    let pairs = match read_form::<Pairs>(request).await {
        Ok(p) => p,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return Err(Refusal::Page(
                PageError::new(e.status(), "The form is too large.").with_view(&view),
            ))
        }
        Err(_) => {
            return Err(Refusal::Page(
                PageError::bad("The form could not be read.").with_view(&view),
            ))
        }
    };
    if !auth::csrf_ok(&op, field(&pairs, "csrf")) {
        return Err(Refusal::Page(
            PageError::new(
                StatusCode::FORBIDDEN,
                "The form's token does not match your session; reload the page and try again.",
            )
            .with_view(&view),
        ));
    }
    Ok((op, view, pairs))
}

pub(crate) async fn logout(State(c): S, request: Request) -> Response {
    match checked_post(&c, request).await {
        Ok((op, view, _)) => {
            let id = op.session_id;
            if let Err(page) = on_sessions(&c, move |c| c.sessions.logout(&id)).await {
                return page.with_view(&view).into_response();
            }
            let mut r = Redirect::to("/console/login").into_response();
            if let Ok(v) = HeaderValue::from_str(&auth::clear_cookie(c.secure_cookies)) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        Err(r) => r.into_response(),
    }
}
