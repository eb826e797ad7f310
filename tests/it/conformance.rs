//! The conformance corpus (testdata/conformance/, docs/protocol.md §9–§12)
//! through the real `tally verify`: every case's exit code, and for a
//! report every check's status, the coverage lines, the records verified
//! and the result, as its expected.json states them. The runner contract is
//! testdata/conformance/README.md; this is tally's own runner.
//!
//! `TALLY_CONFORMANCE_BIN` names another binary with the same command line
//! to run instead (an older build, say, to see which rules it breaks).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/conformance")
}

fn binary() -> PathBuf {
    std::env::var_os("TALLY_CONFORMANCE_BIN")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_tally")), PathBuf::from)
}

fn read_json(path: &Path) -> Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The `tally verify` arguments options.json names, relative to the case.
fn args(dir: &Path, options: &Value) -> Vec<String> {
    let file = |key: &str| {
        options[key]
            .as_str()
            .map(|name| dir.join(name).display().to_string())
    };
    let mut a = vec![
        "verify".to_owned(),
        file("pack").expect("pack"),
        "--agent-keys".into(),
        file("agent_keys").expect("agent_keys"),
    ];
    match (file("witness_key"), file("trust")) {
        (Some(k), None) => a.extend(["--witness-key".into(), k]),
        (None, Some(t)) => a.extend(["--trust".into(), t]),
        other => panic!("{}: witness_key or trust, not {other:?}", dir.display()),
    }
    if let Some(h) = file("head") {
        a.extend(["--head".into(), h]);
    }
    for (key, flag) in [("max_skew", "--max-skew"), ("grace", "--grace")] {
        let n = options[key].as_u64().expect("seconds");
        a.extend([flag.into(), n.to_string()]);
    }
    for name in options["disclosures"].as_array().into_iter().flatten() {
        let name = name.as_str().expect("a file name");
        a.extend(["--disclosure".into(), dir.join(name).display().to_string()]);
    }
    a.extend(["--format".into(), "json".into()]);
    a
}

/// What differs between the run and expected.json, if anything.
fn compare(dir: &Path) -> Result<(), String> {
    let options = read_json(&dir.join("options.json"));
    let expected = read_json(&dir.join("expected.json"));
    let out = Command::new(binary())
        .args(args(dir, &options))
        .output()
        .map_err(|e| format!("cannot run {}: {e}", binary().display()))?;
    let code = out.status.code().ok_or("killed by a signal")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let want_code = expected["exit"].as_i64().expect("exit");
    if i64::from(code) != want_code {
        return Err(format!(
            "exit {code}, expected {want_code}\n{stdout}{stderr}"
        ));
    }
    if want_code == 2 {
        if !stdout.trim().is_empty() {
            return Err(format!("a usage error printed a report: {stdout}"));
        }
        return Ok(());
    }
    let report: Value =
        serde_json::from_str(&stdout).map_err(|e| format!("not a JSON report ({e}): {stdout}"))?;
    let mut problems = Vec::new();
    let got: Vec<(String, String)> = report["checks"]
        .as_array()
        .ok_or("no checks")?
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap_or("?").to_owned(),
                c["status"].as_str().unwrap_or("?").to_owned(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = expected["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| {
            (
                c["id"].as_str().expect("id").to_owned(),
                c["status"].as_str().expect("status").to_owned(),
            )
        })
        .collect();
    if got != want {
        let diff: Vec<String> = want
            .iter()
            .zip(
                got.iter()
                    .chain(std::iter::repeat(&("?".into(), "?".into()))),
            )
            .filter(|(w, g)| w != g)
            .map(|(w, g)| format!("{}: {} expected, got {}", w.0, w.1, g.1))
            .collect();
        let messages: Vec<String> = report["checks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["status"] != "pass")
            .map(|c| format!("  {}: {}", c["id"], c["message"]))
            .collect();
        problems.push(format!(
            "statuses differ: {}\n{}",
            diff.join("; "),
            messages.join("\n")
        ));
    }
    // Disclosures (§6.3): in order, each file's status; the report names
    // the file as given, here a path ending in the case's file name.
    let disclosures = |v: &Value, base: bool| -> Vec<(String, String)> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|d| {
                let file = d["file"].as_str().unwrap_or("?");
                let file = if base {
                    Path::new(file)
                        .file_name()
                        .map_or(file.to_owned(), |f| f.to_string_lossy().into_owned())
                } else {
                    file.to_owned()
                };
                (file, d["status"].as_str().unwrap_or("?").to_owned())
            })
            .collect()
    };
    if disclosures(&report["disclosures"], true) != disclosures(&expected["disclosures"], false) {
        problems.push(format!(
            "disclosures: expected {}, got {}",
            expected["disclosures"], report["disclosures"]
        ));
    }
    for key in ["result", "coverage", "records"] {
        if report[key] != expected[key] {
            problems.push(format!(
                "{key}: expected {}, got {}",
                expected[key], report[key]
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

#[test]
fn tally_verify_gives_every_case_its_expected_result() {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .expect("testdata/conformance")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    let mut failed = Vec::new();
    for dir in &dirs {
        for file in [
            "pack.jsonl",
            "agent-keys.json",
            "options.json",
            "expected.json",
        ] {
            assert!(dir.join(file).is_file(), "{}: no {file}", dir.display());
        }
        if let Err(e) = compare(dir) {
            failed.push(format!(
                "--- {}\n{e}",
                dir.file_name().unwrap_or_default().to_string_lossy()
            ));
        }
    }
    assert!(dirs.len() >= 200, "only {} cases", dirs.len());
    assert!(
        failed.is_empty(),
        "{} of {} cases differ from expected.json:\n{}",
        failed.len(),
        dirs.len(),
        failed.join("\n")
    );
}
