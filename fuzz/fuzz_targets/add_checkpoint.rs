#![no_main]
//! Fuzz target: the tlog-witness add-checkpoint body
//! (`AddCheckpointRequest::parse`), and cosigner private keys
//! (`CosignatureSigner::from_skey`); a body that parses prints back to
//! itself, a key that parses prints back to the same key.

use libfuzzer_sys::fuzz_target;
use tally_schemas::cosignature::{AddCheckpointRequest, CosignatureSigner};

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = AddCheckpointRequest::parse(data) {
        assert_eq!(request.to_body().as_bytes(), data);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(signer) = CosignatureSigner::from_skey(text) {
            assert_eq!(signer.skey(), text);
        }
    }
});
