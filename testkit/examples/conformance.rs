//! Writes the conformance corpus (testkit/src/conformance/) to
//! testdata/conformance/, or to the folder given: one folder per case and
//! INDEX.md. Deterministic; CI reruns it and fails on any diff.
//!
//!     cargo run -p tally-testkit --example conformance -- testdata/conformance

fn main() -> std::io::Result<()> {
    let out = std::env::args_os().nth(1).map_or_else(
        || std::path::PathBuf::from("testdata/conformance"),
        std::path::PathBuf::from,
    );
    let n = tally_testkit::conformance::write_corpus(&out)?;
    println!("wrote {n} cases to {}", out.display());
    Ok(())
}
