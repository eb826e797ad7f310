//! Login and sessions: pages need a login, the login cookie and its headers,
//! logout and key revocation, secure cookies, session limits and login
//! throttling.

use super::*;

#[tokio::test]
async fn console_pages_need_a_login() {
    let h = harness();
    for uri in [
        "/console",
        "/console/agents/bot",
        "/console/records/0",
        "/console/verify",
        "/console/links",
        "/console/agents/bot/pack",
    ] {
        let (s, hd, _) = h.get(uri, None).await;
        assert_eq!(s, StatusCode::SEE_OTHER, "{uri}");
        assert_eq!(hd.get(header::LOCATION).unwrap(), "/console/login");
    }
    let (s, _, body) = h.get("/console/login", None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(body.contains("name=\"api_key\""));
    let (s, _, body) = h
        .post_login("tally_0000000000000000_000000000000000000000000000000000000000000000000")
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(body.contains("unknown or revoked"));
    // A good key without the login form's token and cookie is refused (login
    // CSRF), as is a token that does not match the cookie.
    let (s, hd, _) = h.get("/console/login", None).await;
    assert_eq!(s, StatusCode::OK);
    let cookie = login_cookie(&hd);
    // A token the client made up itself, the same in cookie and form: not
    // one this server made.
    let forged = format!("tally_login={}", "a".repeat(64));
    for (cookie, form) in [
        (
            Some(forged.as_str()),
            format!("login_token={}&api_key={}", "a".repeat(64), h.api_key),
        ),
        (None, format!("api_key={}", h.api_key)),
        (Some(cookie.as_str()), format!("api_key={}", h.api_key)),
        (
            Some(cookie.as_str()),
            format!("login_token={}&api_key={}", "0".repeat(64), h.api_key),
        ),
    ] {
        let (s, hd, body) = h.post_form("/console/login", cookie, &form).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{form}");
        assert!(body.contains("log in again"));
        assert!(!hd
            .get_all(header::SET_COOKIE)
            .iter()
            .any(|v| v.to_str().unwrap().starts_with("tally_console=")));
    }
    // A forged cookie is not a session.
    let (s, _, _) = h.get("/console", Some("tally_console=00ff")).await;
    assert_eq!(s, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn console_login_cookie_headers_and_overview() {
    let h = harness();
    let mut bot = Agent::new("claims-bot");
    h.register(&bot, "default");
    let mut stranger = Agent::new("stranger");
    h.register(&stranger, "other");
    h.clock.0.store(T0 + 10, Ordering::SeqCst);
    hostile_chain(&h, &mut bot).await;
    let r = stranger.sign(T0, RecordBody::Note(NoteBody { text: "x".into() }));
    h.post(&h.other_key, &r).await;

    let (s, hd, _) = h.post_login(&h.api_key).await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    let set = hd.get(header::SET_COOKIE).unwrap().to_str().unwrap();
    assert!(
        set.starts_with("tally_console=")
            && set.contains("HttpOnly")
            && set.contains("SameSite=Strict")
            && set.contains("Path=/console")
    );
    assert!(!set.contains("Secure"), "no TLS here");
    let cookie = set.split(';').next().unwrap();

    let (s, hd, body) = h.get("/console", Some(cookie)).await;
    assert_eq!(s, StatusCode::OK);
    let csp = hd
        .get(header::CONTENT_SECURITY_POLICY)
        .unwrap()
        .to_str()
        .unwrap();
    assert!(
        csp.contains("default-src 'none'")
            && csp.contains("script-src 'self'")
            && !csp.contains("unsafe")
    );
    assert_eq!(hd.get(header::X_FRAME_OPTIONS).unwrap(), "DENY");
    assert_eq!(hd.get(header::CACHE_CONTROL).unwrap(), "no-store");
    assert!(body.contains("claims-bot"));
    assert!(
        !body.contains("stranger"),
        "another project's agent is shown"
    );
    assert!(body.contains("id=\"log-size\">9<"), "log size");
    assert!(
        body.contains("id=\"records-24h\">8<"),
        "records in the last 24 hours"
    );
    assert!(body.contains("<svg"), "chart");
    assert!(body.contains(
        &h.witness
            .log()
            .latest_checkpoint()
            .checkpoint
            .root
            .to_string()
    ));
    // The agent row: 8 records, head seq 7.
    assert!(body.contains(">8</td>"));
    assert!(body.contains("seq 7 @"));

    // Assets are served by the binary.
    let (s, hd, css) = h.get("/console/assets/console.css", None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(hd
        .get(header::CONTENT_TYPE)
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("text/css"));
    assert!(css.contains("svg.chart"));
    let (s, _, js) = h.get("/console/assets/console.js", None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(js.contains("addEventListener"));
}

#[tokio::test]
async fn console_session_ends_with_logout_and_key_revocation() {
    let h = harness();
    let (cookie, csrf) = h.login(&h.api_key).await;
    assert_eq!(h.get("/console", Some(&cookie)).await.0, StatusCode::OK);
    let (s, hd, _) = h
        .post_form("/console/logout", Some(&cookie), &format!("csrf={csrf}"))
        .await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    assert!(hd
        .get(header::SET_COOKIE)
        .unwrap()
        .to_str()
        .unwrap()
        .contains("Max-Age=0"));
    assert_eq!(
        h.get("/console", Some(&cookie)).await.0,
        StatusCode::SEE_OTHER
    );

    let (cookie, _) = h.login(&h.api_key).await;
    let id = h.api_key.split('_').nth(1).unwrap().to_owned();
    h.witness
        .registry()
        .revoke_api_key(&id, h.witness.now())
        .unwrap();
    assert_eq!(
        h.get("/console", Some(&cookie)).await.0,
        StatusCode::SEE_OTHER
    );

    // Sessions expire.
    let (cookie, _) = h.login(&h.other_key).await;
    h.clock
        .0
        .store(T0 + crate::auth::SESSION_TTL_MS, Ordering::SeqCst);
    assert_eq!(
        h.get("/console", Some(&cookie)).await.0,
        StatusCode::SEE_OTHER
    );
}

#[tokio::test]
async fn console_secure_cookie_with_tls() {
    let h = harness();
    let console = Console::open(
        Arc::clone(&h.witness),
        h._dir.path().join("tls").as_path(),
        true,
    );
    // A data folder that does not exist cannot hold the link store.
    assert!(console.is_err());
    std::fs::create_dir(h._dir.path().join("tls")).unwrap();
    let console = Console::open(Arc::clone(&h.witness), &h._dir.path().join("tls"), true).unwrap();
    let app = crate::router(console);
    let form = app
        .clone()
        .oneshot(
            Request::builder()
                .uri("/console/login")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let login = login_cookie(form.headers());
    assert!(form.headers()[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .ends_with("; Secure"));
    let page = form.into_body().collect().await.unwrap().to_bytes();
    let page = String::from_utf8_lossy(&page);
    let token = between(&page, "name=\"login_token\" value=\"", "\"");
    let req = Request::builder()
        .method("POST")
        .uri("/console/login")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::COOKIE, login)
        .body(Body::from(format!(
            "login_token={token}&api_key={}",
            h.api_key
        )))
        .unwrap();
    let resp = app.oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    let set = resp
        .headers()
        .get(header::SET_COOKIE)
        .unwrap()
        .to_str()
        .unwrap();
    assert!(set.ends_with("; Secure"));
}

/// One project's logins never end another project's sessions: sessions are
/// limited per project, and a full project gives up its own oldest.
#[tokio::test]
async fn console_logins_of_one_project_never_end_another_projects_session() {
    let h = harness();
    let (cookie_a, _) = h.login(&h.api_key).await;
    // Later logins expire later (the old table dropped the session that
    // expires first).
    h.clock.0.fetch_add(1, Ordering::SeqCst);
    // Far more logins with project "other"'s key than the session table
    // holds (straight at the session table: the login throttle would
    // refuse them long before over HTTP).
    for _ in 0..=10_000 {
        assert!(h
            .console
            .sessions
            .login(&h.witness, &h.other_key)
            .unwrap()
            .is_some());
    }
    assert_eq!(
        h.get("/console", Some(&cookie_a)).await.0,
        StatusCode::OK,
        "the default project's session survived"
    );
}

/// Logins are throttled per client address and globally, with 429 and
/// Retry-After; a throttled address does not slow another one down.
#[tokio::test]
async fn console_login_is_throttled_per_address_and_globally() {
    let h = harness();
    let a: SocketAddr = "192.0.2.1:40000".parse().unwrap();
    let mut refused = None;
    for i in 0..1_000 {
        let (s, hd, body) = h.post_login_from("tally_wrong_key", Some(a)).await;
        if s == StatusCode::TOO_MANY_REQUESTS {
            refused = Some((i, hd, body));
            break;
        }
        assert_eq!(s, StatusCode::UNAUTHORIZED);
    }
    let (attempts, hd, body) = refused.expect("wrong keys from one address are throttled");
    assert_eq!(attempts, 10, "the 11th attempt in a burst is refused");
    let retry: u64 = hd[header::RETRY_AFTER].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    assert!(body.contains("Too many login attempts"), "{body}");
    // Even the right key waits.
    assert_eq!(
        h.post_login_from(&h.api_key, Some(a)).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another address is not throttled.
    let b: SocketAddr = "198.51.100.7:40000".parse().unwrap();
    assert_eq!(
        h.post_login_from(&h.api_key, Some(b)).await.0,
        StatusCode::SEE_OTHER
    );
    // After Retry-After the address may try again.
    h.clock
        .0
        .fetch_add(i64::try_from(retry).unwrap() * 1000, Ordering::SeqCst);
    assert_eq!(
        h.post_login_from(&h.api_key, Some(a)).await.0,
        StatusCode::SEE_OTHER
    );

    // Globally: many addresses, one attempt each, are refused too once the
    // witness-wide budget is spent.
    let mut global = None;
    for i in 0..10_000u32 {
        let addr = SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 1));
        let (s, hd, _) = h.post_login_from("tally_wrong_key", Some(addr)).await;
        if s == StatusCode::TOO_MANY_REQUESTS {
            global = Some((i, hd));
            break;
        }
    }
    let (i, hd) = global.expect("a flood from many addresses is throttled");
    assert!(i >= 50, "the global budget is not tiny ({i})");
    assert!(hd.contains_key(header::RETRY_AFTER));
}

/// A full project gives up a session of the API key that holds the most of
/// its sessions; a full table, one of the project that holds the most.
#[tokio::test]
async fn console_session_limits_end_the_biggest_holders_sessions() {
    let h = harness_with(ConsoleLimits {
        sessions: crate::auth::SessionLimits {
            per_project: 3,
            total: 5,
        },
        ..ConsoleLimits::default()
    });
    let (cookie_first, _) = h.login(&h.api_key).await;
    // A second key of the same project logs in again and again: it ends
    // only its own sessions.
    let second = h.witness.new_api_key("default").unwrap().token;
    for _ in 0..20 {
        h.clock.0.fetch_add(1, Ordering::SeqCst);
        assert!(h
            .console
            .sessions
            .login(&h.witness, &second)
            .unwrap()
            .is_some());
    }
    assert_eq!(h.console.sessions.count("default"), 3);
    assert_eq!(
        h.get("/console", Some(&cookie_first)).await.0,
        StatusCode::OK
    );
    // Two sessions of another project fill the table (3 + 2 = 5) ...
    let (cookie_other, _) = h.login(&h.other_key).await;
    assert!(h
        .console
        .sessions
        .login(&h.witness, &h.other_key)
        .unwrap()
        .is_some());
    // ... so a third project's login ends one of the biggest project's,
    // and there of the key that holds the most.
    let third = h.witness.create_project("third").unwrap().token;
    assert!(h
        .console
        .sessions
        .login(&h.witness, &third)
        .unwrap()
        .is_some());
    assert_eq!(h.console.sessions.count("default"), 2);
    assert_eq!(h.console.sessions.count("other"), 2);
    assert_eq!(h.console.sessions.count("third"), 1);
    assert_eq!(
        h.get("/console", Some(&cookie_first)).await.0,
        StatusCode::OK
    );
    assert_eq!(
        h.get("/console", Some(&cookie_other)).await.0,
        StatusCode::OK
    );
}
