//! The pack `tally-bench verify` generates and verifies (src/pack.rs,
//! docs/benchmarks.md "Verify") is valid, and the sample of its raw rate
//! signs the same messages.

#[test]
fn the_benchmark_pack_is_valid() {
    let mut pack = Vec::new();
    let made = tally_bench::pack::write_bench_pack(&mut pack, 300, 7, 2).unwrap();
    let key = tally_schemas::note::NoteVerifier::from_vkey(&made.vkey).unwrap();
    let v = tally_verifier::verify(
        &pack[..],
        &made.keys,
        &key,
        None,
        tally_verifier::VerifyOptions::default(),
    )
    .unwrap();
    let text = v.to_text();
    assert_eq!(
        v.report.result,
        tally_schemas::report::Verdict::Pass,
        "{text}"
    );
    assert!(
        text.contains(
            "PASS: 12 checks, 10 pass, 1 pending, 1 not checked; 300 records from 7 agents"
        ),
        "{text}"
    );
    let sample = tally_bench::pack::bench_sample(50, 7);
    assert!(tally_verifier::sig::verify_many(&sample, 2)
        .iter()
        .all(|ok| *ok));
    // The sample's messages are the pack's: its first signature is record 0's.
    let first = String::from_utf8(pack.split(|b| *b == b'\n').nth(2).unwrap().to_vec()).unwrap();
    let sig = tally_schemas::Signature::from_bytes(sample[0].2).to_base64();
    assert!(first.contains(&sig), "{first}");
}
