//! Exports through the routes, checked by the verifier library: packs over
//! seq and time ranges for several agents (merged in log order, receipt
//! checkpoints with consistency proofs), agent-keys.json and head.json
//! (docs/protocol.md §9). A pack the witness writes must PASS `verify`.

use crate::common;

use axum::http::StatusCode;
use common::*;
use tally_schemas::pack::{AgentKeys, Head, PackLine};
use tally_schemas::report::Verdict;
use tally_verifier::{verify, VerifyOptions};
use tally_witness::config::WitnessConfig;

fn config() -> WitnessConfig {
    WitnessConfig {
        rate_limit: None,
        ..WitnessConfig::default()
    }
}

fn lines(pack: &[u8]) -> Vec<PackLine> {
    pack.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| PackLine::from_json(l).unwrap())
        .collect()
}

async fn get(h: &Harness, uri: &str) -> Vec<u8> {
    let (s, b) = call(&h.app, "GET", uri, Some(&h.key_a), vec![]).await;
    assert_eq!(s, StatusCode::OK, "{uri}: {}", String::from_utf8_lossy(&b));
    b
}

fn check_passes(h: &Harness, pack: &[u8], keys: &AgentKeys, head: Option<&Head>) {
    let v = verify(
        pack,
        keys,
        h.witness.log().verifier(),
        head,
        VerifyOptions::default(),
    )
    .unwrap();
    assert_eq!(v.report.result, Verdict::Pass, "{}", v.to_text());
}

#[tokio::test]
async fn packs_agent_keys_and_head_pass_the_verifier() {
    let h = harness(config());
    let mut bots = [TestAgent::new("alpha"), TestAgent::new("beta")];
    for b in &bots {
        b.register(&h.app, &h.key_a).await;
    }
    // Interleave the two chains over several batches and clock ticks.
    for n in 0..12i64 {
        h.clock.set(T0 + n * 1000);
        let which = usize::from(n % 3 == 0);
        let r = bots[which].draft(T0 + n * 1000, &format!("note {n}"));
        let (s, body) = post(&h.app, Some(&h.key_a), bytes(&r)).await;
        assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        bots[which].accept(&r);
    }
    let keys = AgentKeys::from_json(&get(&h, "/v1/agent-keys").await).unwrap();
    assert_eq!(keys.agents.len(), 2);

    // The whole of both chains.
    let pack = get(&h, "/v1/export?agent=beta&agent=alpha").await;
    let ls = lines(&pack);
    let PackLine::Header(header) = &ls[0] else {
        panic!("no header")
    };
    assert_eq!(
        header
            .agents
            .iter()
            .map(|a| a.agent.as_str())
            .collect::<Vec<_>>(),
        ["alpha", "beta"]
    );
    let cps = ls
        .iter()
        .filter(|l| matches!(l, PackLine::Checkpoint(_)))
        .count();
    let recs: Vec<_> = ls
        .iter()
        .filter_map(|l| {
            if let PackLine::Record(r) = l {
                Some(r)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(recs.len(), 12);
    assert_eq!(cps, 12, "one receipt checkpoint per sequential admission");
    let indexes: Vec<u64> = recs
        .iter()
        .map(|r| r.witnessed.as_ref().unwrap().index.get())
        .collect();
    assert_eq!(indexes, (0..12).collect::<Vec<_>>());
    assert!(matches!(ls.last(), Some(PackLine::End(e)) if e.records == 12 && e.checkpoints == 12));
    check_passes(&h, &pack, &keys, None);

    // A seq range starting mid-chain (a proven anchor) for one agent.
    let pack = get(&h, "/v1/export?agent=alpha&from_seq=2&to_seq=5").await;
    let ls = lines(&pack);
    let PackLine::Header(header) = &ls[0] else {
        panic!()
    };
    assert_eq!(
        (
            header.agents[0].first_seq.get(),
            header.agents[0].last_seq.get()
        ),
        (2, 5)
    );
    check_passes(&h, &pack, &keys, None);

    // A time range: received in [T0+3s, T0+7s) → notes 3..=6.
    let pack = get(&h, "/v1/export?agent=alpha&agent=beta&since=2026-11-30T08%3A00%3A03.000Z&until=2026-11-30T08:00:07.000Z").await;
    let n = lines(&pack)
        .iter()
        .filter(|l| matches!(l, PackLine::Record(_)))
        .count();
    assert_eq!(n, 4);
    check_passes(&h, &pack, &keys, None);

    // head.json after more records shows nothing was cut from the end.
    let pack = get(&h, "/v1/export?agent=alpha&agent=beta").await;
    let pack_size = 12;
    h.clock.set(T0 + 20_000);
    let r = bots[0].draft(T0 + 20_000, "later");
    assert_eq!(
        post(&h.app, Some(&h.key_a), bytes(&r)).await.0,
        StatusCode::OK
    );
    bots[0].accept(&r);
    let head = Head::from_json(
        &get(
            &h,
            &format!("/v1/head?from_size={pack_size}&agent=alpha&agent=beta"),
        )
        .await,
    )
    .unwrap();
    assert_eq!(head.from_size.get(), pack_size);
    assert_eq!(head.agents.len(), 2);
    // Records appended after the pack's checkpoint are new, not cut: PASS.
    check_passes(&h, &pack, &keys, Some(&head));
    // A head from a size that is not the pack's fails the head check.
    let wrong = Head::from_json(&get(&h, "/v1/head?from_size=11").await).unwrap();
    let v = verify(
        pack.as_slice(),
        &keys,
        h.witness.log().verifier(),
        Some(&wrong),
        VerifyOptions::default(),
    )
    .unwrap();
    assert_eq!(v.report.result, Verdict::Fail, "{}", v.to_text());
    let fresh = get(&h, "/v1/export?agent=alpha&agent=beta").await;
    let PackLine::Header(hd) = &lines(&fresh)[0] else {
        panic!()
    };
    let size = tally_schemas::note::peek_checkpoint(&hd.checkpoint)
        .unwrap()
        .size
        .get();
    let head = Head::from_json(&get(&h, &format!("/v1/head?from_size={size}")).await).unwrap();
    check_passes(&h, &fresh, &keys, Some(&head));

    // Errors: an empty range, an agent without records.
    let (s, b) = call(
        &h.app,
        "GET",
        "/v1/export?agent=alpha&from_seq=100",
        Some(&h.key_a),
        vec![],
    )
    .await;
    assert_eq!((s.as_u16(), code(&b).as_str()), (404, "no_records"));
    let lonely = TestAgent::new("lonely");
    lonely.register(&h.app, &h.key_a).await;
    let (s, b) = call(
        &h.app,
        "GET",
        "/v1/export?agent=lonely",
        Some(&h.key_a),
        vec![],
    )
    .await;
    assert_eq!((s.as_u16(), code(&b).as_str()), (404, "no_records"));
    let (s, b) = call(
        &h.app,
        "GET",
        "/v1/head?from_size=0",
        Some(&h.key_a),
        vec![],
    )
    .await;
    assert_eq!((s.as_u16(), code(&b).as_str()), (400, "from_empty_tree"));
    let (s, b) = call(
        &h.app,
        "GET",
        "/v1/head?from_size=99",
        Some(&h.key_a),
        vec![],
    )
    .await;
    assert_eq!((s.as_u16(), code(&b).as_str()), (400, "size_beyond_tree"));
}
