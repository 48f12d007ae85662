//! Every record the metadata servers and management store, as read back from disk.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    weft_meta::fuzzing::decode_stored_records(bytes);
    weft_mgmt::fuzzing::decode_stored_records(bytes);
});
