#![no_main]
//! Fuzz target: record parsing; a parsed record must re-parse from its canonical bytes.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = tally_schemas::Record::from_json(data) {
        let again =
            tally_schemas::Record::from_json(r.canonical_bytes()).expect("canonical record parses");
        assert_eq!(again, r);
    }
});
