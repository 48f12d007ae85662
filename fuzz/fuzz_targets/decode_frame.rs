//! Frame headers from arbitrary bytes: decoding never panics, and whatever decodes re-encodes
//! to the same bytes it was read from (except the reserved fields, which are zero).
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_proto::codec::{FrameHeader, FRAME_HEADER_BYTES};

fuzz_target!(|data: &[u8]| {
    let mut bytes = [0u8; FRAME_HEADER_BYTES];
    for (slot, byte) in bytes.iter_mut().zip(data) {
        *slot = *byte;
    }
    if let Ok(header) = FrameHeader::decode(&bytes) {
        assert_eq!(FrameHeader::decode(&header.encode()), Ok(header));
    }
});
