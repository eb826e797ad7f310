//! Auditor links: scoped, read-only and revocable, limited to a time range,
//! record links kept in range.

use super::*;

#[tokio::test]
async fn console_auditor_link_is_scoped_read_only_and_revocable() {
    let h = harness();
    let mut bot = Agent::new("bot");
    let mut other = Agent::new("other-bot");
    h.register(&bot, "default");
    h.register(&other, "default");
    h.clock.0.store(T0 + 10, Ordering::SeqCst);
    let idx = hostile_chain(&h, &mut bot).await;
    let r = other.sign(
        T0 + 20,
        RecordBody::Note(NoteBody {
            text: "hidden".into(),
        }),
    );
    let other_idx = h.post(&h.api_key, &r).await;
    let (cookie, csrf) = h.login(&h.api_key).await;

    // Forms need the CSRF token and a same-site origin.
    let (s, _, _) = h
        .post_form("/console/links", Some(&cookie), "agent=bot&expires_hours=1")
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let mut req = Request::builder()
        .method("POST")
        .uri("/console/links")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::COOKIE, &cookie)
        .header("sec-fetch-site", "cross-site");
    req = req.header("x-test", "1");
    let (s, _, _) = h
        .call(
            req.body(Body::from(format!("csrf={csrf}&agent=bot")))
                .unwrap(),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // Bad forms are refused with a message.
    for (form, want) in [
        ("agent=nobody", "not in project"),
        ("", "at least one agent"),
        ("agent=bot&expires_hours=0", "1 to 8760"),
        // Errors name the fields as their labels do ("from", "to").
        ("agent=bot&since=yesterday", "from: "),
        ("agent=bot&until=yesterday", "to: "),
        (
            "agent=bot&since=2026-12-01T00:00:00.000Z&until=2026-11-30T00:00:00.000Z",
            "from must be before to",
        ),
    ] {
        let (s, _, body) = h
            .post_form(
                "/console/links",
                Some(&cookie),
                &format!("csrf={csrf}&{form}"),
            )
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{form}");
        assert!(body.contains(want), "{form}: {want}");
        assert!(
            !body.contains("since:") && !body.contains("until:"),
            "{form}"
        );
    }
    // A link for bot, received before T0 + 10 + ...: all of bot's records.
    let until = UnixMillis::new(T0 + 100_000).to_string();
    let (s, _, body) = h.post_form("/console/links", Some(&cookie), &format!("csrf={csrf}&agent=bot&since=&until={until}&expires_hours=2&label=%3Cb%3Eaudit%3C%2Fb%3E")).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert!(!body.contains("<b>audit"));
    let url = between(&body, "id=\"new-link-url\" href=\"", "\"").to_owned();
    let token = url.strip_prefix("/console/a/").unwrap();
    assert!(token.len() >= 16 + 1 + 64, "at least 256 bits of secret");

    // Without a cookie, the link opens bot's pages and nothing else.
    let (s, _, home) = h.get(&url, None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(home.contains("read-only auditor view"));
    assert!(home.contains("/agents/bot\""));
    assert!(!home.contains("other-bot"));
    assert!(!home.contains("Log out") && !home.contains("/console/links"));
    let (s, _, page) = h.get(&format!("{url}/agents/bot"), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_escaped(&page);
    assert!(page.contains("coverage: bot:"));
    assert!(
        !page.contains("Download this agent"),
        "operator download not offered"
    );
    let (s, _, _) = h.get(&format!("{url}/agents/other-bot"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _, _) = h.get(&format!("{url}/records/{other_idx}"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _, rec) = h.get(&format!("{url}/records/{}", idx[1]), None).await;
    assert_eq!(s, StatusCode::OK);
    // The auditor's record page offers the record's own pack, which verifies.
    let rec_pack_url = format!("{url}/records/{}/pack", idx[1]);
    assert!(rec.contains(&format!("href=\"{rec_pack_url}\"")));
    let (s, _, rec_pack) = h.get(&rec_pack_url, None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        verify_pack(&h, rec_pack.as_bytes()).await.report.result,
        Verdict::Pass
    );
    let (s, _, _) = h
        .get(&format!("{url}/records/{other_idx}/pack"), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // The link does not log anyone in to operator pages.
    let (s, _, _) = h.get("/console", None).await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    // Its pack and keys verify.
    let (s, _, pack) = h.get(&format!("{url}/pack"), None).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _, keys) = h.get(&format!("{url}/agent-keys.json"), None).await;
    assert_eq!(s, StatusCode::OK);
    let keys = AgentKeys::from_json(keys.as_bytes()).unwrap();
    assert_eq!(keys.agents.len(), 1);
    let v = crate::data::run_verify(
        pack.as_bytes(),
        &keys,
        h.witness.log().verifier(),
        None,
        300_000,
        300_000,
    )
    .unwrap();
    assert_eq!(v.report.records, 8);
    // The auditor's verify page works without a session.
    let keys_bytes = tally_witness::export::to_canonical(&keys).unwrap();
    let (s, body) = upload(
        &h,
        &format!("{url}/verify"),
        None,
        &[
            ("agent_keys", Some("k"), &keys_bytes),
            ("pack", Some("p"), pack.as_bytes()),
        ],
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert!(body.contains("12 checks"));

    // Revoke: the very next request is refused.
    let (_, _, list) = h.get("/console/links", Some(&cookie)).await;
    let id = between(&list, "data-link-id=\"", "\"").to_owned();
    assert!(list.contains("&lt;b&gt;audit&lt;/b&gt;"));
    let (s, _, _) = h
        .post_form(
            &format!("/console/links/{id}/revoke"),
            Some(&cookie),
            "csrf=wrong",
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(h.get(&url, None).await.0, StatusCode::OK);
    let (s, _, _) = h
        .post_form(
            &format!("/console/links/{id}/revoke"),
            Some(&cookie),
            &format!("csrf={csrf}"),
        )
        .await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    for u in [
        url.clone(),
        format!("{url}/agents/bot"),
        format!("{url}/pack"),
        format!("{url}/agent-keys.json"),
        format!("{url}/records/{}", idx[1]),
    ] {
        let (s, _, body) = h.get(&u, None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{u}");
        assert!(body.contains("unknown, expired or revoked"));
    }
    // Another project cannot revoke or see the link.
    let (cookie_b, csrf_b) = h.login(&h.other_key).await;
    let (_, _, list_b) = h.get("/console/links", Some(&cookie_b)).await;
    assert!(!list_b.contains(&id));
    let (s, _, _) = h
        .post_form(
            &format!("/console/links/{id}/revoke"),
            Some(&cookie_b),
            &format!("csrf={csrf_b}"),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // Expiry.
    let url2 = h
        .make_link(&cookie, &csrf, "agent=bot&expires_hours=1")
        .await;
    assert_eq!(h.get(&url2, None).await.0, StatusCode::OK);
    h.clock.0.store(T0 + 10 + 3_600_000, Ordering::SeqCst);
    assert_eq!(h.get(&url2, None).await.0, StatusCode::NOT_FOUND);
    let _ = &h.console;
}

#[tokio::test]
async fn console_time_range_limits_the_auditor_view() {
    let h = harness();
    let mut bot = Agent::new("bot");
    h.register(&bot, "default");
    let mut idx = Vec::new();
    for i in 0..4i64 {
        h.clock.0.store(T0 + i * 60_000, Ordering::SeqCst);
        let r = bot.sign(
            T0 + i * 60_000,
            RecordBody::Note(NoteBody {
                text: format!("note {i}"),
            }),
        );
        idx.push(h.post(&h.api_key, &r).await);
    }
    let (cookie, csrf) = h.login(&h.api_key).await;
    let since = UnixMillis::new(T0 + 60_000).to_string();
    let until = UnixMillis::new(T0 + 180_000).to_string();
    let url = h
        .make_link(
            &cookie,
            &csrf,
            &format!("agent=bot&since={since}&until={until}"),
        )
        .await;
    let (_, _, page) = h.get(&format!("{url}/agents/bot"), None).await;
    assert!(page.contains("note 1") && page.contains("note 2"));
    assert!(!page.contains("note 0") && !page.contains("note 3"));
    assert_eq!(
        h.get(&format!("{url}/records/{}", idx[0]), None).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        h.get(&format!("{url}/records/{}", idx[1]), None).await.0,
        StatusCode::OK
    );
    let (_, _, pack) = h.get(&format!("{url}/pack"), None).await;
    let v = verify_pack(&h, pack.as_bytes()).await;
    assert_eq!(v.report.records, 2);
    assert_eq!(v.report.result, Verdict::Pass, "{}", v.to_text());

    // Nothing of the chain outside the range shows: not the count, the head
    // or the last activity, even after more records arrive.
    h.clock.0.store(T0 + 400_000, Ordering::SeqCst);
    let r = bot.sign(
        T0 + 400_000,
        RecordBody::Note(NoteBody {
            text: "note 4".into(),
        }),
    );
    idx.push(h.post(&h.api_key, &r).await);
    let late = UnixMillis::new(T0 + 400_000).to_string();
    let last_in_range = UnixMillis::new(T0 + 120_000).to_string();
    let (_, _, home) = h.get(&url, None).await;
    let (_, _, page) = h.get(&format!("{url}/agents/bot"), None).await;
    for body in [&home, &page] {
        assert!(body.contains(&last_in_range), "last activity in range");
        assert!(!body.contains(&late), "nothing received after until");
        assert!(
            !body.contains(&format!("@{}", idx[3]))
                && !body.contains(&format!("/records/{}\"", idx[3]))
        );
        assert!(!body.contains(&format!("/records/{}\"", idx[4])));
    }
    assert_eq!(between(&home, "id=\"records-in-range\">", "<"), "2");
    assert_eq!(between(&page, "id=\"record-count\">", "<"), "2");
    assert!(page.contains(&format!("href=\"{url}/records/{}\"", idx[2])));
    // The operator still sees the whole chain.
    let (_, _, op_page) = h.get("/console/agents/bot", Some(&cookie)).await;
    assert_eq!(between(&op_page, "id=\"record-count\">", "<"), "5");
}

#[tokio::test]
async fn console_auditor_record_links_stay_in_range() {
    let h = harness();
    let mut bot = Agent::new("bot");
    h.register(&bot, "default");
    h.clock.0.store(T0, Ordering::SeqCst);
    let d = bot.sign(T0, decision("c-1", "refund"));
    let d_idx = h.post(&h.api_key, &d).await;
    h.clock.0.store(T0 + 120_000, Ordering::SeqCst);
    let o = bot.sign(T0 + 120_000, outcome("c-1", &d, OutcomeStatus::Ok));
    let o_idx = h.post(&h.api_key, &o).await;
    let (cookie, csrf) = h.login(&h.api_key).await;
    let until = UnixMillis::new(T0 + 60_000).to_string();
    let url = h
        .make_link(&cookie, &csrf, &format!("agent=bot&until={until}"))
        .await;
    // The operator's record page links the outcome; the auditor's, whose
    // range ends before it, does not, and the record's pack stops at the
    // decision.
    let (_, _, op) = h
        .get(&format!("/console/records/{d_idx}"), Some(&cookie))
        .await;
    assert!(op.contains(&format!("/console/records/{o_idx}\"")));
    let (s, _, rec) = h.get(&format!("{url}/records/{d_idx}"), None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(!rec.contains(&format!("/records/{o_idx}\"")), "{rec}");
    let (s, _, pack) = h.get(&format!("{url}/records/{d_idx}/pack"), None).await;
    assert_eq!(s, StatusCode::OK);
    let v = verify_pack(&h, pack.as_bytes()).await;
    assert_eq!(v.report.records, 1, "{}", v.to_text());
    assert_eq!(
        h.get(&format!("{url}/records/{o_idx}"), None).await.0,
        StatusCode::NOT_FOUND
    );
}
