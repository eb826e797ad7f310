//! The checked-in test data is what the generators write, byte for byte:
//! testdata/conformance/ (every case folder, its files, INDEX.md) and the
//! golden pack's files there. CI also reruns both generators and diffs
//! (.ci/run); this says which file differs.

use std::collections::BTreeSet;
use std::path::PathBuf;

use tally_testkit::conformance::{corpus, index};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn the_conformance_corpus_is_what_the_generator_writes() {
    let dir = root().join("testdata/conformance");
    let cases = corpus();
    let mut want_dirs = BTreeSet::new();
    for c in &cases {
        want_dirs.insert(c.name.clone());
        let d = dir.join(&c.name);
        let mut want_files = BTreeSet::new();
        for (name, bytes) in c.files() {
            want_files.insert(name.to_owned());
            let on_disk = std::fs::read(d.join(name)).ok();
            assert!(
                on_disk.as_ref() == Some(&bytes),
                "{}/{name} differs: run `cargo run -p tally-testkit --example conformance`",
                c.name
            );
        }
        let files: BTreeSet<String> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(files, want_files, "{}: stray or missing files", c.name);
    }
    let dirs: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(dirs, want_dirs, "case folders differ: run the generator");
    assert_eq!(
        std::fs::read(dir.join("INDEX.md")).unwrap(),
        index(&cases),
        "INDEX.md differs: run the generator"
    );
}

#[test]
fn every_case_names_its_rule_and_a_section() {
    for c in corpus() {
        assert!(
            c.section.starts_with('§'),
            "{}: section {}",
            c.name,
            c.section
        );
        assert!(
            c.rule.ends_with('.') && c.rule.len() > 20,
            "{}: rule",
            c.name
        );
        assert!(!c.description.is_empty(), "{}: description", c.name);
    }
}
