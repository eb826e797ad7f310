//! Writes the tampered-pack corpus to testdata/tampered/ (docs/protocol.md
//! §11): `valid/` and one directory per case with `case.json`.
//! Deterministic; `cargo test -p tally-verifier` fails if the checked-in
//! files differ from what this writes.
//!
//! `cargo run -p tally-verifier --example gen_tampered [OUT_DIR]`

#[path = "../corpus/tampered.rs"]
mod tampered;

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let out = std::env::args_os().nth(1).map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/tampered"),
        PathBuf::from,
    );
    let (valid, cases) = tampered::corpus();
    if out.exists() {
        std::fs::remove_dir_all(&out)?;
    }
    std::fs::create_dir_all(out.join("valid"))?;
    for (name, bytes) in &valid {
        std::fs::write(out.join("valid").join(name), bytes)?;
    }
    for c in &cases {
        let dir = out.join(&c.name);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("case.json"), tampered::case_json(c))?;
        for (name, bytes) in &c.files {
            std::fs::write(dir.join(name), bytes)?;
        }
    }
    println!(
        "wrote {} cases and the valid pack to {}",
        cases.len(),
        out.display()
    );
    Ok(())
}
