//! Verify uploads: the verify page prints what `tally verify` prints.

use super::*;

#[tokio::test]
async fn console_verify_page_prints_what_tally_verify_prints() {
    let (h, _, _) = hostile_bot().await;
    let (cookie, csrf) = h.login(&h.api_key).await;
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
    let expected = verify_pack(&h, pack.as_bytes()).await.to_text();

    let (s, body) = upload(
        &h,
        "/console/verify",
        Some(&cookie),
        &[
            ("csrf", None, csrf.as_bytes()),
            ("witness_key", None, b""),
            ("agent_keys", Some("agent-keys.json"), &keys),
            ("head", Some(""), b""),
            ("pack", Some("pack.jsonl"), pack.as_bytes()),
        ],
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    // The text block is exactly the CLI's text, HTML-escaped.
    assert!(
        body.contains(&html_escape(&expected)),
        "report text differs"
    );
    assert!(body.contains("PASS: 12 checks"));
    assert!(
        body.contains("--max-skew 300 --grace 300"),
        "the CLI's defaults"
    );
    assert_escaped(&body);

    // --max-skew and --grace are tally verify's: a skew bound of 0 s fails
    // the timing check of records whose agent and witness times differ, as
    // the CLI would; the command shown says so.
    let strict = crate::data::run_verify(
        pack.as_bytes(),
        &AgentKeys::from_json(&keys).unwrap(),
        h.witness.log().verifier(),
        None,
        0,
        0,
    )
    .unwrap()
    .to_text();
    assert_ne!(strict, expected, "the settings change the report");
    let (s, body) = upload(
        &h,
        "/console/verify",
        Some(&cookie),
        &[
            ("csrf", None, csrf.as_bytes()),
            ("agent_keys", Some("k"), &keys),
            ("max_skew", None, b"0"),
            ("grace", None, b"0"),
            ("pack", Some("p"), pack.as_bytes()),
        ],
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert!(body.contains(&html_escape(&strict)), "report text differs");
    assert!(body.contains("--max-skew 0 --grace 0"));
    for bad in [&b"soon"[..], b"-1", b"999999999999"] {
        let (s, body) = upload(
            &h,
            "/console/verify",
            Some(&cookie),
            &[
                ("csrf", None, csrf.as_bytes()),
                ("agent_keys", Some("k"), &keys),
                ("max_skew", None, bad),
                ("pack", Some("p"), pack.as_bytes()),
            ],
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert!(body.contains("--max-skew: give whole seconds"), "{body}");
    }

    // A tampered pack fails, and says which check.
    let tampered = pack.replacen("\"c2\"", "\"c9\"", 1);
    let (s, body) = upload(
        &h,
        "/console/verify",
        Some(&cookie),
        &[
            ("csrf", None, csrf.as_bytes()),
            ("agent_keys", Some("k"), &keys),
            ("pack", Some("p"), tampered.as_bytes()),
        ],
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert!(body.contains("FAIL: "), "{body}");
    assert!(body.contains("record_signatures"));

    // Refusals: wrong CSRF token, no keys, bad keys, a bad vkey, not a pack.
    let big = vec![b' '; 200_000];
    let cases: Vec<(Vec<Field<'_>>, &str)> = vec![
        (
            vec![
                ("csrf", None, b"nope"),
                ("agent_keys", Some("k"), &keys),
                ("pack", Some("p"), pack.as_bytes()),
            ],
            "does not match your session",
        ),
        (
            vec![
                ("csrf", None, csrf.as_bytes()),
                ("pack", Some("p"), pack.as_bytes()),
            ],
            "choose an agent-keys.json",
        ),
        (
            vec![
                ("csrf", None, csrf.as_bytes()),
                ("agent_keys", Some("k"), b"{\"v\":1"),
                ("pack", Some("p"), pack.as_bytes()),
            ],
            "agent-keys.json:",
        ),
        // Swapped files are named, as `tally verify` names them.
        (
            vec![
                ("csrf", None, csrf.as_bytes()),
                ("agent_keys", Some("k"), pack.as_bytes()),
                ("pack", Some("p"), pack.as_bytes()),
            ],
            "the file chosen as agent-keys.json is a pack",
        ),
        (
            vec![
                ("csrf", None, csrf.as_bytes()),
                ("agent_keys", Some("k"), &keys),
                ("head", Some("h"), &keys),
                ("pack", Some("p"), pack.as_bytes()),
            ],
            "the file chosen as head.json is agent-keys.json",
        ),
        (
            vec![
                ("csrf", None, csrf.as_bytes()),
                ("witness_key", None, b"not a key"),
                ("agent_keys", Some("k"), &keys),
                ("pack", Some("p"), pack.as_bytes()),
            ],
            "--witness-key",
        ),
        (
            vec![
                ("csrf", None, csrf.as_bytes()),
                ("agent_keys", Some("k"), &keys),
                ("pack", Some("p"), b"<html>"),
            ],
            "not a tally pack",
        ),
        (
            vec![
                ("csrf", None, csrf.as_bytes()),
                ("agent_keys", Some("k"), &big),
                ("pack", Some("p"), pack.as_bytes()),
            ],
            "larger than",
        ),
    ];
    for (fields, want) in cases {
        let (s, body) = upload(&h, "/console/verify", Some(&cookie), &fields).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{want}");
        assert!(body.contains(want), "{want}: {body}");
    }
    // Not multipart at all.
    let (s, _, _) = h.post_form("/console/verify", Some(&cookie), "a=b").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    // Without a session, no verification.
    let (s, _) = upload(
        &h,
        "/console/verify",
        None,
        &[
            ("agent_keys", Some("k"), &keys),
            ("pack", Some("p"), pack.as_bytes()),
        ],
    )
    .await;
    assert_eq!(s, StatusCode::SEE_OTHER);
}
