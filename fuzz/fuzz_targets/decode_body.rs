//! Request and reply bodies from arbitrary bytes: decoding never panics, and a decoded message
//! round-trips through the encoder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_proto::codec::{decode_body, encode_body};
use weft_proto::messages::{
    MetaResponse, MgmtResponse, Reply, Request, StatsResponse, StorageResponse,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = decode_body::<Request>(data) {
        assert_eq!(decode_body::<Request>(&encode_body(&request)), Ok(request));
    }
    let _ = decode_body::<Reply<MetaResponse>>(data);
    let _ = decode_body::<Reply<MgmtResponse>>(data);
    let _ = decode_body::<Reply<StorageResponse>>(data);
    let _ = decode_body::<Reply<StatsResponse>>(data);
});
