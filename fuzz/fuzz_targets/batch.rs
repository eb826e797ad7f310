#![no_main]
//! Fuzz target: batch requests and answers (docs/protocol.md §8.1). A
//! request that parses re-encodes, from its records, to a request that
//! parses to the same records; an answer that parses prints to bytes that
//! parse and print to the same bytes.

use libfuzzer_sys::fuzz_target;
use tally_schemas::batch::{BatchAnswer, BatchRequest};

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = BatchRequest::parse(data) {
        let records: Vec<_> = request
            .records
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .collect();
        if !records.is_empty() {
            let again = BatchRequest::parse(&BatchRequest::to_json(records.iter().copied()))
                .expect("an encoded batch parses");
            let back: Vec<_> = again
                .records
                .into_iter()
                .map(|r| r.expect("a valid record"))
                .collect();
            assert_eq!(back.iter().collect::<Vec<_>>(), records);
        }
    }
    if let Ok(answer) = BatchAnswer::from_json(data) {
        let bytes = answer.to_json().expect("an answer prints");
        assert_eq!(
            BatchAnswer::from_json(&bytes).expect("a printed answer parses"),
            answer
        );
    }
});
