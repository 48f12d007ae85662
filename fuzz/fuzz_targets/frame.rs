//! A frame as a server or client reads it: the fixed header, then the body in the version the
//! header names, as a request and as a reply. Nothing may panic; every length is bounded.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_proto::codec::{decode_body_in, FrameHeader, FRAME_HEADER_BYTES};
use weft_proto::messages::{
    MetaResponse, MgmtResponse, Reply, Request, StatsResponse, StorageResponse,
};

fuzz_target!(|bytes: &[u8]| {
    let Some((head, body)) = bytes.split_first_chunk::<FRAME_HEADER_BYTES>() else {
        return;
    };
    let Ok(header) = FrameHeader::decode(head) else {
        return;
    };
    assert!(header.body_len <= weft_proto::codec::FRAME_BODY_BYTES_MAX);
    let _ = decode_body_in::<Request>(header.version, body);
    let _ = decode_body_in::<Reply<MetaResponse>>(header.version, body);
    let _ = decode_body_in::<Reply<MgmtResponse>>(header.version, body);
    let _ = decode_body_in::<Reply<StorageResponse>>(header.version, body);
    let _ = decode_body_in::<Reply<StatsResponse>>(header.version, body);
    if let Some(payload) = body.get(..header.payload_len as usize) {
        let _ = header.check_payload(payload);
    }
});
