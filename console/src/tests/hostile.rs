//! Hostile input: escaped names and notes, bad input gets a page not a panic,
//! bidirectional and invisible characters marked.

use super::*;

#[tokio::test]
async fn console_escapes_hostile_names_and_notes() {
    let (h, _, idx) = hostile_bot().await;
    let (cookie, _) = h.login(&h.api_key).await;
    let (s, _, body) = h.get("/console/agents/bot", Some(&cookie)).await;
    assert_eq!(s, StatusCode::OK);
    assert_escaped(&body);
    assert!(
        body.contains("&lt;script&gt;alert('tool')&lt;/script&gt;"),
        "tool name shown as text"
    );
    assert!(
        body.contains("&lt;img src=x onerror=alert('note')&gt; &amp; &quot;quoted&quot;"),
        "note shown as text"
    );
    assert!(
        body.contains("&quot;&gt;&lt;svg onload=alert(1)&gt;"),
        "call id shown as text"
    );
    for i in &idx {
        let (s, _, body) = h.get(&format!("/console/records/{i}"), Some(&cookie)).await;
        assert_eq!(s, StatusCode::OK);
        assert_escaped(&body);
    }
    let (_, _, body) = h
        .get(&format!("/console/records/{}", idx[7]), Some(&cookie))
        .await;
    assert!(body.contains("&lt;img src=x"));
    // A search for the hostile text is echoed escaped too.
    let (s, _, body) = h
        .get(
            "/console/agents/bot?q=%3Cscript%3Ealert(%27x%27)%3C%2Fscript%3E",
            Some(&cookie),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_escaped(&body);
}

#[tokio::test]
async fn console_bad_input_gets_a_page_not_a_panic() {
    let (h, _, _) = hostile_bot().await;
    let (cookie, _) = h.login(&h.api_key).await;
    for (uri, want) in [
        ("/console/records/abc", StatusCode::NOT_FOUND),
        (
            "/console/records/99999999999999999999999",
            StatusCode::NOT_FOUND,
        ),
        ("/console/records/9007199254740991", StatusCode::NOT_FOUND),
        ("/console/records/1000", StatusCode::NOT_FOUND),
        ("/console/records/-1/pack", StatusCode::NOT_FOUND),
        ("/console/agents/%3Cscript%3E", StatusCode::NOT_FOUND),
        ("/console/agents/nobody", StatusCode::NOT_FOUND),
        ("/console/agents/nobody/pack", StatusCode::NOT_FOUND),
        ("/console/agents/bot?page=0", StatusCode::BAD_REQUEST),
        ("/console/agents/bot?page=x", StatusCode::BAD_REQUEST),
        (
            "/console/agents/bot?status=%3Cb%3E",
            StatusCode::BAD_REQUEST,
        ),
        ("/console/agents/bot?page=999", StatusCode::OK),
        ("/console/a/garbage", StatusCode::NOT_FOUND),
        ("/console/a/%00/agents/bot", StatusCode::NOT_FOUND),
        ("/console/nowhere/%3Cscript%3E", StatusCode::NOT_FOUND),
    ] {
        let (s, hd, body) = h.get(uri, Some(&cookie)).await;
        assert_eq!(s, want, "{uri}");
        assert!(hd.get(header::CONTENT_SECURITY_POLICY).is_some(), "{uri}");
        assert!(!body.contains("<script>"), "{uri}");
    }
    let long = format!("/console/agents/bot?q={}", "a".repeat(300));
    assert_eq!(h.get(&long, Some(&cookie)).await.0, StatusCode::BAD_REQUEST);
    // Another project's agent and records are not found, not forbidden.
    let (cookie_b, _) = h.login(&h.other_key).await;
    assert_eq!(
        h.get("/console/agents/bot", Some(&cookie_b)).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        h.get("/console/records/1", Some(&cookie_b)).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        h.get("/console/records/1/pack", Some(&cookie_b)).await.0,
        StatusCode::NOT_FOUND
    );
}

/// Tool names, call ids and notes with bidirectional controls and
/// invisible characters (which records may hold: a tool name is what a
/// server declares) are isolated and shown as marked escapes, never raw.
#[tokio::test]
async fn console_isolates_and_marks_bidi_and_invisible_characters() {
    let h = harness();
    let mut bot = Agent::new("bot");
    h.register(&bot, "default");
    h.clock.0.store(T0 + 10, Ordering::SeqCst);
    let spoof = "refund\u{202e}gnp.exe";
    // Declared as not recorded, so that coverage names it.
    let r = bot.sign(T0, tools_body("l\u{200b}1", vec![tool(spoof, false, 1)]));
    h.post(&h.api_key, &r).await;
    let d = bot.sign(T0 + 1, decision("c\u{2066}1", spoof));
    let d_index = h.post(&h.api_key, &d).await;
    let o = bot.sign(T0 + 2, outcome("c\u{2066}1", &d, OutcomeStatus::Ok));
    h.post(&h.api_key, &o).await;
    let n = bot.sign(
        T0 + 3,
        RecordBody::Note(NoteBody {
            text: "first line\nsecond \u{202e}line\u{feff}".into(),
        }),
    );
    h.post(&h.api_key, &n).await;
    let (cookie, csrf) = h.login(&h.api_key).await;
    let raw = ['\u{202e}', '\u{2066}', '\u{200b}', '\u{feff}'];
    let no_raw = |page: &str, what: &str| {
        for c in raw {
            assert!(!page.contains(c), "{what}: U+{:04X} raw", u32::from(c));
        }
    };
    let mark = |cp: &str| {
        format!(
            "<span class=\"hidden-char\" title=\"U+{}\">\\u{{{}}}</span>",
            cp.to_uppercase(),
            cp
        )
    };

    let (s, _, page) = h.get("/console/agents/bot", Some(&cookie)).await;
    assert_eq!(s, StatusCode::OK);
    no_raw(&page, "agent page");
    // The tool name in the calls table and the tool list, isolated.
    assert!(
        page.contains(&format!(
            "<bdi class=\"ext\">refund{}gnp.exe</bdi>",
            mark("202e")
        )),
        "{page}"
    );
    assert!(page.contains(&format!("c{}1", mark("2066"))), "call id");
    assert!(page.contains(&format!("l{}1", mark("200b"))), "list id");
    // The note keeps its line break and marks the rest.
    assert!(
        page.contains(&format!(
            "<bdi class=\"ext\">first line\nsecond {}line{}</bdi>",
            mark("202e"),
            mark("feff")
        )),
        "{page}"
    );
    // The coverage line names it marked, and the report's text, as tally
    // verify prints it, escaped.
    assert!(
        page.contains(&format!(
            "1 declared tool is not recorded: refund{}gnp.exe</bdi>",
            mark("202e")
        )),
        "{page}"
    );
    assert!(
        page.contains("coverage: bot: 1 declared tool is not recorded: refund\\u{202e}gnp.exe\n"),
        "{page}"
    );

    let (s, _, page) = h
        .get(&format!("/console/records/{d_index}"), Some(&cookie))
        .await;
    assert_eq!(s, StatusCode::OK);
    no_raw(&page, "record page");
    // The JSON shown is the same value, with JSON escapes.
    assert!(page.contains("refund\\u202egnp.exe"), "{page}");
    assert!(page.contains("c\\u20661"), "{page}");

    // An uploaded pack's report on the verify page.
    let (_, _, pack) = h.get("/console/agents/bot/pack", Some(&cookie)).await;
    let keys = tally_witness::export::to_canonical(
        &tally_witness::export::agent_keys(
            h.witness.registry(),
            h.witness.log().origin(),
            "default",
            &[],
        )
        .unwrap(),
    )
    .unwrap();
    let (s, page) = upload(
        &h,
        "/console/verify",
        Some(&cookie),
        &[
            ("csrf", None, csrf.as_bytes()),
            ("agent_keys", Some("agent-keys.json"), &keys),
            ("pack", Some("pack.jsonl"), pack.as_bytes()),
        ],
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{page}");
    no_raw(&page, "verify page");
    assert!(page.contains("PASS: 12 checks"), "{page}");
}
