//! Audit reports and disclosures: the report for the operator and the auditor,
//! disclosures attached to an auditor link and checked by its report.

use super::*;

/// The audit report (protocol.md §11.3) from the console: the operator's
/// for one agent, with a period, as HTML and JSON; the auditor's for the
/// link's agents and range; names escaped; other agents and bad periods
/// refused.
#[tokio::test]
async fn console_offers_the_audit_report_to_the_operator_and_the_auditor() {
    let h = harness();
    let mut bot = Agent::new("bot");
    let mut other = Agent::new("other-bot");
    h.register(&bot, "default");
    h.register(&other, "default");
    h.clock.0.store(T0 + 10, Ordering::SeqCst);
    hostile_chain(&h, &mut bot).await;
    let r = other.sign(
        T0 + 20,
        RecordBody::Note(NoteBody {
            text: "hidden".into(),
        }),
    );
    h.post(&h.api_key, &r).await;
    let (cookie, csrf) = h.login(&h.api_key).await;

    let (s, _, page) = h.get("/console/agents/bot", Some(&cookie)).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        page.contains("href=\"/console/agents/bot/report\""),
        "offered"
    );

    let (s, hd, html) = h.get("/console/agents/bot/report", Some(&cookie)).await;
    assert_eq!(s, StatusCode::OK, "{html}");
    assert_eq!(hd[header::CONTENT_TYPE], "text/html; charset=utf-8");
    assert!(hd[header::CONTENT_DISPOSITION]
        .to_str()
        .unwrap()
        .contains("report.html"));
    let body = html.split_once("<body>").unwrap().1;
    // The open decision c3 is within the grace window: pending, a pass.
    assert!(
        body.starts_with(r#"<section id="verdict" class="pass"><h1>PASS</h1>"#),
        "{body}"
    );
    assert!(html.contains("<h2>Agent <code>bot</code></h2>"));
    assert!(!html.contains("other-bot"));
    assert_escaped(&html);
    assert!(
        html.contains("tally verify bot.pack.jsonl --agent-keys agent-keys.json --witness-key ")
    );

    // JSON, with a period holding the first three records only.
    let from = UnixMillis::new(T0).to_string();
    let to = UnixMillis::new(T0 + 3).to_string();
    let (s, _, json) = h
        .get(
            &format!("/console/agents/bot/report?format=json&from={from}&to={to}"),
            Some(&cookie),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["agents"][0]["period_records"], 3, "{json}");
    assert_eq!(v["agents"][0]["not_ok"][0]["status"], "error");
    assert_eq!(v["verification"]["result"], "PASS");
    for q in [
        "from=yesterday",
        "format=pdf",
        &format!("from={to}&to={from}"),
    ] {
        let (s, _, _) = h
            .get(&format!("/console/agents/bot/report?{q}"), Some(&cookie))
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{q}");
    }
    let (s, _, _) = h.get("/console/agents/bot/report", None).await;
    assert_ne!(s, StatusCode::OK, "needs a login");
    let (s, _, _) = h.get("/console/agents/nobody/report", Some(&cookie)).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // The auditor's report covers the link's agent only.
    let (s, _, made) = h
        .post_form(
            "/console/links",
            Some(&cookie),
            &format!("csrf={csrf}&agent=bot&expires_hours=1"),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{made}");
    let url = between(&made, "id=\"new-link-url\" href=\"", "\"").to_owned();
    let (s, _, home) = h.get(&url, None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(home.contains(&format!("href=\"{url}/report\"")), "offered");
    let (s, _, html) = h.get(&format!("{url}/report"), None).await;
    assert_eq!(s, StatusCode::OK, "{html}");
    assert!(html.contains("<h1>PASS</h1>"));
    assert!(html.contains("<h2>Agent <code>bot</code></h2>"));
    assert!(!html.contains("other-bot"));
    assert_escaped(&html);
    let (s, _, _) = h.get("/console/a/not-a-token/report", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

/// Every byte but ASCII letters and digits as `%XX`, for a form body.
fn form_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// An operator attaches a disclosure (protocol.md §6.3) to an auditor
/// link; the auditor's report checks it against the record and shows the
/// content, escaped; one of an agent the link does not show, one that is
/// not a disclosure, and one whose content was changed are refused or fail.
#[tokio::test]
async fn console_attaches_disclosures_to_an_auditor_link_and_its_report_checks_them() {
    let h = harness();
    let mut bot = Agent::new("bot");
    let other = Agent::new("other-bot");
    h.register(&bot, "default");
    h.register(&other, "default");
    h.clock.0.store(T0 + 10, Ordering::SeqCst);
    hostile_chain(&h, &mut bot).await;
    let salt = [7u8; 16];
    let content = serde_json::json!({"q": "<script>alert(3)</script> \u{202e}fdp.exe"});
    let input_hash = tally_schemas::hash::salted_hash(
        &salt,
        &tally_schemas::canonical::canonicalize(&content).unwrap(),
    );
    let d = bot.sign(
        T0 + 8,
        RecordBody::Decision(Decision {
            call_id: "d1".into(),
            tool: "search".into(),
            input_hash,
        }),
    );
    h.post(&h.api_key, &d).await;
    let o = bot.sign(T0 + 9, outcome("d1", &d, OutcomeStatus::Ok));
    h.post(&h.api_key, &o).await;
    let (cookie, csrf) = h.login(&h.api_key).await;
    let (s, _, made) = h
        .post_form(
            "/console/links",
            Some(&cookie),
            &format!("csrf={csrf}&agent=bot&expires_hours=1"),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{made}");
    let url = between(&made, "id=\"new-link-url\" href=\"", "\"").to_owned();
    let id = url
        .strip_prefix("/console/a/")
        .unwrap()
        .split('_')
        .next()
        .unwrap()
        .to_owned();
    let disclosure = |agent: &str, content: &serde_json::Value| {
        serde_json::json!({
            "v": 1, "agent": agent, "call_id": "d1",
            "input": {"seq": 8, "salt": hex::encode(salt), "content": content},
        })
        .to_string()
    };
    let attach = |body: String| {
        let h = &h;
        let cookie = cookie.clone();
        let path = format!("/console/links/{id}/disclosures");
        let form = format!("csrf={csrf}&disclosure={}", form_encode(&body));
        async move { h.post_form(&path, Some(&cookie), &form).await }
    };
    // Refused: another agent's, and not a disclosure.
    let (s, _, page) = attach(disclosure("other-bot", &content)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(page.contains("which the link does not show"), "{page}");
    let (s, _, page) = attach("{\"v\":1}".into()).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(page.contains("not a disclosure file"), "{page}");
    // Without the CSRF token: refused.
    let (s, _, _) = h
        .post_form(
            &format!("/console/links/{id}/disclosures"),
            Some(&cookie),
            &format!("disclosure={}", form_encode(&disclosure("bot", &content))),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // Attached.
    let (s, _, _) = attach(disclosure("bot", &content)).await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    let (_, _, links) = h.get("/console/links", Some(&cookie)).await;
    assert!(
        links.contains(r#"disclosed: <bdi class="ext">bot</bdi> call"#),
        "{links}"
    );
    let (_, _, home) = h.get(&url, None).await;
    assert!(home.contains("1 disclosed call(s) attached"), "{home}");
    let (s, _, html) = h.get(&format!("{url}/report"), None).await;
    assert_eq!(s, StatusCode::OK, "{html}");
    assert!(html.contains("<h1>PASS</h1>"), "{html}");
    assert!(html.contains("<h2>Disclosed calls</h2>"));
    assert!(
        html.contains("&lt;script&gt;alert(3)&lt;/script&gt; \\u{202e}fdp.exe"),
        "{html}"
    );
    assert_escaped(&html);
    // A changed byte: the report fails, naming the disclosure.
    let changed = serde_json::json!({"q": "<script>alert(4)</script> \u{202e}fdp.exe"});
    let (s, _, _) = attach(disclosure("bot", &changed)).await;
    assert_eq!(s, StatusCode::SEE_OTHER);
    let (s, _, json) = h.get(&format!("{url}/report?format=json"), None).await;
    assert_eq!(s, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["verification"]["result"], "FAIL");
    assert_eq!(v["verification"]["disclosures"][0]["status"], "match");
    assert_eq!(v["verification"]["disclosures"][1]["status"], "mismatch");
}
