//! Writes tally's golden vectors (testkit/src/golden/) to
//! testdata/golden/, or to the folder given. Deterministic; CI reruns it and
//! fails on any diff.
//!
//!     cargo run -p tally-testkit --example golden -- testdata/golden

fn main() {
    let out = std::env::args_os().nth(1).map_or_else(
        || std::path::PathBuf::from("testdata/golden"),
        std::path::PathBuf::from,
    );
    tally_testkit::golden::write_golden(&out);
}
