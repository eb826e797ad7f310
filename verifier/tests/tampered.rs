//! The tampered-pack corpus (testdata/tampered/, docs/protocol.md §11): the
//! valid pack passes every check; every case fails exactly the checks its
//! case.json names; regenerating the corpus gives the checked-in bytes.

mod common;
#[path = "../corpus/tampered.rs"]
mod tampered;

use std::collections::BTreeSet;
use std::path::Path;

use tally_schemas::report::{CheckStatus, Verdict};
use tally_verifier::{verify, Verification, VerifyError, VerifyOptions};

fn run(dir: &Path) -> Result<Verification, VerifyError> {
    let c = common::load(dir);
    verify(
        &c.pack[..],
        &c.keys,
        &c.log_key,
        Some(&c.head),
        VerifyOptions::default(),
    )
}

fn failing(v: &Verification) -> BTreeSet<String> {
    v.report
        .checks
        .iter()
        .filter(|c| c.status == CheckStatus::Fail)
        .map(|c| c.id.as_str().to_owned())
        .collect()
}

#[test]
fn the_valid_pack_passes_all_twelve() {
    let v = run(&common::corpus_dir().join("valid")).unwrap();
    let text = v.to_text();
    assert_eq!(v.report.result, Verdict::Pass, "{text}");
    for c in &v.report.checks {
        assert_eq!(c.status, CheckStatus::Pass, "{text}");
    }
    assert!(
        text.ends_with(
            "PASS: 12 checks, 12 pass, 0 pending, 0 not checked; 15 records from 2 agents\n"
        ),
        "{text}"
    );
    assert_eq!(
        v.report.coverage,
        vec![
            "claims-bot: 1 declared tool is not recorded: send_notification".to_owned(),
            "claims-bot: tool lookup_claim changed at seq 6: description".to_owned(),
            "mail-bot: all 2 declared tools are recorded".to_owned(),
        ],
        "{text}"
    );
}

#[test]
fn every_tampered_case_fails_exactly_the_checks_it_names() {
    let mut seen = 0;
    let mut problems = Vec::new();
    let mut dirs: Vec<_> = std::fs::read_dir(common::corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("case.json").exists())
        .collect();
    dirs.sort();
    for dir in dirs {
        seen += 1;
        let case: serde_json::Value =
            serde_json::from_slice(&common::read(&dir, "case.json").unwrap()).unwrap();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let result = run(&dir);
        if let Some(err) = case.get("expect_error") {
            assert_eq!(err, "unsupported_version");
            match result {
                Err(VerifyError::UnsupportedVersion(msg)) => {
                    assert!(msg.contains("version 2"), "{msg}")
                }
                other => problems.push(format!(
                    "{name}: expected an unsupported-version error, got {other:?}"
                )),
            }
            continue;
        }
        let v = result.unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut want: BTreeSet<String> = BTreeSet::new();
        want.insert(case["expect_fail"].as_str().unwrap().to_owned());
        for a in case
            .get("also_fail")
            .and_then(|a| a.as_array())
            .into_iter()
            .flatten()
        {
            want.insert(a.as_str().unwrap().to_owned());
        }
        let got = failing(&v);
        if got != want || v.report.result != Verdict::Fail {
            problems.push(format!(
                "{name}: want {want:?}, got {got:?}\n{}",
                v.to_text()
            ));
        }
    }
    assert!(seen >= 40, "only {seen} cases");
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

#[test]
fn regenerating_the_corpus_gives_the_checked_in_bytes() {
    let dir = common::corpus_dir();
    let (valid, cases) = tampered::corpus();
    let mut expected_dirs: BTreeSet<String> = BTreeSet::new();
    expected_dirs.insert("valid".into());
    for (name, bytes) in &valid {
        assert_eq!(
            common::read(&dir.join("valid"), name).as_ref(),
            Some(bytes),
            "valid/{name} differs: run gen_tampered"
        );
    }
    for c in &cases {
        expected_dirs.insert(c.name.clone());
        let d = dir.join(&c.name);
        assert_eq!(
            common::read(&d, "case.json"),
            Some(tampered::case_json(c)),
            "{}/case.json differs",
            c.name
        );
        for (name, bytes) in &c.files {
            assert_eq!(
                common::read(&d, name).as_ref(),
                Some(bytes),
                "{}/{name} differs: run gen_tampered",
                c.name
            );
        }
        let on_disk: BTreeSet<String> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let mut want: BTreeSet<String> = c.files.iter().map(|(n, _)| (*n).to_owned()).collect();
        want.insert("case.json".into());
        assert_eq!(on_disk, want, "{}: stray files", c.name);
    }
    let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            e.file_type()
                .unwrap()
                .is_dir()
                .then(|| e.file_name().to_string_lossy().into_owned())
        })
        .collect();
    assert_eq!(
        on_disk, expected_dirs,
        "case directories differ: run gen_tampered"
    );
}
