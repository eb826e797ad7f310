//! Overview, agent and record pages: action states and claims, coverage and
//! search, pages following new records, a record's pack, cosigners on the
//! overview.

use super::*;

/// An action tool's outcome with `state` (docs/protocol.md §5.2).
fn action_outcome(
    call_id: &str,
    decision: &Record,
    status: OutcomeStatus,
    state: ActionState,
) -> RecordBody {
    RecordBody::Outcome(Outcome {
        call_id: call_id.into(),
        decision: decision.hash(),
        status,
        output_hash: None,
        state: Some(state),
        proof: None,
        proof_hash: (state == ActionState::Posted).then(|| Hash::sha256(call_id.as_bytes())),
    })
}

#[tokio::test]
async fn console_agent_page_states_actions_and_claims_and_filters_calls_by_state() {
    let h = harness();
    let mut bot = Agent::new("bot");
    h.register(&bot, "default");
    h.clock.0.store(T0 + 10, Ordering::SeqCst);
    let r = bot.sign(
        T0,
        tools_body(
            "l1",
            vec![tool("send_email", true, 1), tool("lookup", true, 2)],
        ),
    );
    h.post(&h.api_key, &r).await;
    let mut t = T0 + 1;
    let calls = [
        ("1", OutcomeStatus::Ok, Some(ActionState::Posted)),
        ("2", OutcomeStatus::Ok, Some(ActionState::Posted)),
        ("3", OutcomeStatus::Ok, Some(ActionState::Unknown)),
        ("4", OutcomeStatus::Error, Some(ActionState::Failed)),
        ("5", OutcomeStatus::Ok, None),
    ];
    for (id, status, state) in calls {
        let tool_name = if state.is_some() {
            "send_email"
        } else {
            "lookup"
        };
        let d = bot.sign(t, decision(id, tool_name));
        h.post(&h.api_key, &d).await;
        let body = match state {
            Some(s) => action_outcome(id, &d, status, s),
            None => outcome(id, &d, status),
        };
        let o = bot.sign(t + 1, body);
        h.post(&h.api_key, &o).await;
        t += 2;
    }
    let claim = bot.sign(
        t,
        RecordBody::Claim(Claim {
            tool: "send_email".into(),
            turn_hash: Hash::sha256(b"I've sent the email"),
        }),
    );
    let claim_index = h.post(&h.api_key, &claim).await;
    h.clock.0.store(T0 + 1000, Ordering::SeqCst);
    let (cookie, _) = h.login(&h.api_key).await;
    let (s, _, body) = h.get("/console/agents/bot", Some(&cookie)).await;
    assert_eq!(s, StatusCode::OK);
    assert!(body.contains("id=\"action-count\">2 / 1 / 1<"), "{body}");
    assert!(body.contains("id=\"claim-count\">1<"));
    // The verifier's statement, as `tally verify` prints it.
    assert!(body.contains("coverage: bot: action calls: 2 posted, 1 unknown, 1 failed"));
    assert!(body.contains("coverage: bot: 1 claim without a call: send_email at seq 11"));
    assert!(body.contains(&format!("href=\"/console/records/{claim_index}\">11<")));
    assert!(body.contains(&Hash::sha256(b"I've sent the email").to_string()));
    // The action column, and the filter by state.
    assert_eq!(
        body.matches("<td class=\"state\"><span class=\"st pass\">posted<")
            .count(),
        2
    );
    for (state, n) in [("posted", 2), ("unknown", 1), ("failed", 1)] {
        let (s, _, page) = h
            .get(
                &format!("/console/agents/bot?status={state}"),
                Some(&cookie),
            )
            .await;
        assert_eq!(s, StatusCode::OK);
        assert!(page.contains(&format!("{n} of 5 calls")), "{state}");
        assert!(
            page.contains(&format!("<option value=\"{state}\" selected")),
            "{state}"
        );
    }
    let (s, _, _) = h
        .get("/console/agents/bot?status=sent", Some(&cookie))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    // An agent without actions has no such section.
    let (h2, _, _) = hostile_bot().await;
    let (cookie2, _) = h2.login(&h2.api_key).await;
    let (_, _, plain) = h2.get("/console/agents/bot", Some(&cookie2)).await;
    assert!(!plain.contains("actions-heading"));
    assert!(!plain.contains("action-count"));
}

#[tokio::test]
async fn console_agent_page_coverage_pairs_and_search() {
    let (h, mut bot, _) = hostile_bot().await;
    // Many answered calls, for paging.
    for i in 0..60 {
        let d = bot.sign(T0 + 100 + i * 2, decision(&format!("p{i}"), "lookup"));
        h.post(&h.api_key, &d).await;
        let o = bot.sign(
            T0 + 101 + i * 2,
            outcome(&format!("p{i}"), &d, OutcomeStatus::Ok),
        );
        h.post(&h.api_key, &o).await;
    }
    h.clock.0.store(T0 + 1000, Ordering::SeqCst);
    let (cookie, _) = h.login(&h.api_key).await;
    let (s, _, body) = h.get("/console/agents/bot", Some(&cookie)).await;
    assert_eq!(s, StatusCode::OK);

    // The coverage lines are the verifier's, over the same pack an export gives.
    let keys = tally_witness::export::agent_keys(
        h.witness.registry(),
        h.witness.log().origin(),
        "default",
        &[],
    )
    .unwrap();
    let v = crate::data::verify_export(
        &h.witness,
        "default",
        &[bot.name.clone()],
        tally_witness::export::ExportRange::All,
    )
    .unwrap();
    assert!(!v.report.coverage.is_empty());
    for line in &v.report.coverage {
        let shown = format!("coverage: {}", html_escape(line));
        assert!(body.contains(&shown), "missing {shown:?}");
    }
    assert!(v
        .report
        .coverage
        .iter()
        .any(|l| l == "bot: 1 declared tool is not recorded: send_mail"));
    assert!(v
        .report
        .coverage
        .iter()
        .any(|l| l == "bot: 2 recorded tools are not in the declared tool list: lookup, refund"));
    assert!(v
        .report
        .coverage
        .iter()
        .any(|l| l == "bot: tool search changed at seq 5: description"));
    assert!(body.contains("id=\"tool-changes\""));
    assert!(keys.agents.iter().any(|a| a.agent == bot.name));
    // The twelve checks are listed.
    assert_eq!(body.matches("data-check=").count(), 12);

    // Pairs: 63 calls, 1 open, 1 error, highlighted.
    assert!(body.contains("id=\"call-count\">63<"));
    assert!(body.contains("id=\"open-count\">1<"));
    assert!(body.contains("id=\"error-count\">1<"));
    assert_eq!(
        body.matches("<tr class=\"open\"").count(),
        0,
        "the open call is on the last page"
    );
    assert_eq!(
        body.matches("<tr class=\"ok\"").count(),
        50,
        "a page holds 50 rows"
    );
    assert!(body.contains("page 1 of 2"));
    let (_, _, p2) = h.get("/console/agents/bot?page=2", Some(&cookie)).await;
    assert_eq!(p2.matches("<tr class=\"open\"").count(), 1);
    assert_eq!(p2.matches("<tr class=\"error\"").count(), 1);
    // Filters.
    let (_, _, open) = h
        .get("/console/agents/bot?status=open", Some(&cookie))
        .await;
    assert!(open.contains("1 of 63 calls"));
    assert!(open.contains(">refund<"));
    let (_, _, err) = h
        .get("/console/agents/bot?status=error", Some(&cookie))
        .await;
    assert!(err.contains("1 of 63 calls"));
    let (_, _, q) = h.get("/console/agents/bot?q=p5", Some(&cookie)).await;
    assert!(q.contains("11 of 63 calls"), "p5 and p50..p59");
    let (_, _, q) = h
        .get("/console/agents/bot?q=LOOKUP&status=ok", Some(&cookie))
        .await;
    assert!(q.contains("60 of 63 calls"));
    // Key status.
    assert!(body.contains(&bot.key.public_key().key_id().to_string()));
    assert!(body.contains(">active<"));
}

#[tokio::test]
async fn console_pages_follow_new_records() {
    let (h, mut bot, _) = hostile_bot().await;
    let (cookie, _) = h.login(&h.api_key).await;
    let (_, _, over) = h.get("/console", Some(&cookie)).await;
    assert_eq!(between(&over, "id=\"records-24h\">", "<"), "8");
    let (_, _, page) = h.get("/console/agents/bot", Some(&cookie)).await;
    assert_eq!(between(&page, "id=\"call-count\">", "<"), "3");
    assert!(
        page.contains("PASS: 12 checks"),
        "the first report is computed for the page"
    );
    assert!(!page.contains("report-as-of"));

    // Two more calls, one of them answering the open decision.
    let d = bot.sign(T0 + 20, decision("late-1", "lookup"));
    h.post(&h.api_key, &d).await;
    let o = bot.sign(T0 + 21, outcome("late-1", &d, OutcomeStatus::Error));
    h.post(&h.api_key, &o).await;
    let (_, _, over) = h.get("/console", Some(&cookie)).await;
    assert_eq!(
        between(&over, "id=\"records-24h\">", "<"),
        "10",
        "counted from new entries"
    );
    let (_, _, page) = h.get("/console/agents/bot", Some(&cookie)).await;
    assert_eq!(
        between(&page, "id=\"call-count\">", "<"),
        "4",
        "the view grew"
    );
    assert_eq!(between(&page, "id=\"error-count\">", "<"), "2");
    assert_eq!(between(&page, "id=\"record-count\">", "<"), "10");
    // The report is either already over the new head, or the previous one,
    // said so, while the new one runs; it arrives without blocking pages.
    let mut page = page;
    for _ in 0..200 {
        if !page.contains("report-as-of") {
            break;
        }
        assert!(page.contains("covers seq 0 to 7"), "{page}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        page = h.get("/console/agents/bot", Some(&cookie)).await.2;
    }
    assert!(!page.contains("report-as-of"), "the new report arrived");
    assert!(
        page.contains("10 records from 1 agent"),
        "over the new head"
    );
    // An hour later the chart still counts those records in their hour.
    h.clock.0.store(T0 + 3_600_000, Ordering::SeqCst);
    let (_, _, over) = h.get("/console", Some(&cookie)).await;
    assert_eq!(between(&over, "id=\"records-24h\">", "<"), "10");
    // A day later they are out of the window.
    h.clock.0.store(T0 + 25 * 3_600_000, Ordering::SeqCst);
    let (cookie, _) = h.login(&h.api_key).await; // sessions last 8 hours
    let (_, _, over) = h.get("/console", Some(&cookie)).await;
    assert_eq!(between(&over, "id=\"records-24h\">", "<"), "0");
}

#[tokio::test]
async fn console_record_page_and_its_pack_verify() {
    let (h, _, idx) = hostile_bot().await;
    // Far past the grace window: a pack ending on an answered decision
    // would fail check 10, so the download runs through the outcome.
    h.clock.0.store(T0 + 3_600_000, Ordering::SeqCst);
    let (cookie, _) = h.login(&h.api_key).await;
    let (s, _, body) = h
        .get(&format!("/console/records/{}", idx[3]), Some(&cookie))
        .await;
    assert_eq!(s, StatusCode::OK);
    assert!(body.contains("id=\"record-kind\">decision<"));
    let (_, proof) = h
        .witness
        .log()
        .inclusion_proof(tally_schemas::LeafIndex::new(idx[3]), None)
        .unwrap();
    for p in &proof {
        assert!(body.contains(&p.to_string()), "inclusion proof hash shown");
    }
    assert!(body.contains(&html_escape(&h.witness.log().latest_checkpoint().note)));
    assert!(body.contains("through the decision's outcome"));
    for (i, records) in [(idx[3], 2u64), (idx[4], 1), (idx[7], 1), (idx[0], 1)] {
        let (s, hd, pack) = h
            .get(&format!("/console/records/{i}/pack"), Some(&cookie))
            .await;
        assert_eq!(s, StatusCode::OK);
        assert!(hd
            .get(header::CONTENT_DISPOSITION)
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("attachment"));
        let v = verify_pack(&h, pack.as_bytes()).await;
        assert_eq!(v.report.result, Verdict::Pass, "{}", v.to_text());
        assert_eq!(v.report.records, records);
    }
    // The open decision's pack is honest: it fails check 10.
    let (_, _, pack) = h
        .get(&format!("/console/records/{}/pack", idx[6]), Some(&cookie))
        .await;
    assert_eq!(
        verify_pack(&h, pack.as_bytes()).await.report.result,
        Verdict::Fail
    );
    // The agent's whole pack.
    let (s, _, pack) = h.get("/console/agents/bot/pack", Some(&cookie)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(verify_pack(&h, pack.as_bytes()).await.report.records, 8);
}

#[tokio::test]
async fn the_overview_shows_each_cosigner_and_its_state() {
    use tally_witness::cosigning::{CosignerConfig, CosignerState, Cosigning, CosigningConfig};
    let h = harness();
    let (cookie, _) = h.login(&h.api_key).await;
    let (_, _, body) = h.get("/console", Some(&cookie)).await;
    assert!(!body.contains("id=\"cosigners\""), "no cosigners, no panel");

    // A cosigner on a port nobody listens on: asked, it fails.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let vkey = tally_schemas::cosignature::CosignatureSigner::from_secret(
        "cosigner.example/down",
        tally_schemas::SecretKey::from_seed(&[9; 32]),
    )
    .unwrap()
    .verifier()
    .vkey();
    let config = CosigningConfig {
        cosigners: vec![CosignerConfig::new(
            "down-one",
            &vkey,
            &format!("http://127.0.0.1:{port}"),
        )
        .unwrap()],
        // Flagged stale one second after the start without a cosignature.
        max_age: std::time::Duration::from_secs(1),
        ..CosigningConfig::default()
    };
    let cosigning = Arc::new(Cosigning::new(Arc::clone(h.witness.log()), config).unwrap());
    h.witness.set_cosigning(Arc::clone(&cosigning));
    let mut bot = Agent::new("claims-bot");
    h.register(&bot, "default");
    let r = bot.sign(T0, RecordBody::Note(NoteBody { text: "x".into() }));
    h.post(&h.api_key, &r).await;
    let (_, _, body) = h.get("/console", Some(&cookie)).await;
    assert!(body.contains("id=\"cosigners\""), "{body}");
    assert!(body.contains("data-state=\"pending\""), "{body}");

    let task = tokio::spawn(Arc::clone(&cosigning).run());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while cosigning.status()[0].consecutive_failures == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            cosigning.status()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (_, _, body) = h.get("/console", Some(&cookie)).await;
    assert!(body.contains("down-one"), "{body}");
    assert!(body.contains("cosigner unreachable"), "{body}");
    // Past the max age with the latest checkpoint uncosigned: stale, on
    // the page and in /metrics.
    while cosigning.status()[0].state != CosignerState::Stale {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            cosigning.status()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let (_, _, body) = h.get("/console", Some(&cookie)).await;
    assert!(body.contains("data-state=\"stale\""), "{body}");
    let (_, _, metrics) = h.get("/metrics", None).await;
    assert!(
        metrics.contains("tally_log_cosigner_stale{cosigner=\"down-one\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tally_log_cosigner_state{cosigner=\"down-one\",state=\"stale\"} 1"),
        "{metrics}"
    );
    task.abort();
}
