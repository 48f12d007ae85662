//! Every message body, in each protocol version this build speaks: whatever decodes encodes
//! again in the same version and decodes to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_proto::codec::{decode_body_in, encode_body_in, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN};
use weft_proto::messages::{
    MetaResponse, MgmtResponse, Reply, Request, StatsResponse, StorageResponse,
};

fn round_trip<T>(version: u16, bytes: &[u8])
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let Ok(message) = decode_body_in::<T>(version, bytes) else {
        return;
    };
    // What version 1 decoded may hold what only version 2 can say (defaults aside), so it is
    // encoded again in the newest version.
    let again = encode_body_in(PROTOCOL_VERSION, &message).expect("a decoded message encodes");
    let decoded = decode_body_in::<T>(PROTOCOL_VERSION, &again).expect("and decodes");
    assert_eq!(decoded, message);
}

fuzz_target!(|bytes: &[u8]| {
    let Some((&selector, body)) = bytes.split_first() else {
        return;
    };
    let version = PROTOCOL_VERSION_MIN + u16::from(selector & 1);
    let version = version.min(PROTOCOL_VERSION);
    match selector >> 1 & 7 {
        0 => round_trip::<Request>(version, body),
        1 => round_trip::<Reply<MetaResponse>>(version, body),
        2 => round_trip::<Reply<MgmtResponse>>(version, body),
        3 => round_trip::<Reply<StorageResponse>>(version, body),
        4 => round_trip::<Reply<StatsResponse>>(version, body),
        5 => round_trip::<weft_proto::error::WireError>(version, body),
        _ => round_trip::<weft_proto::messages::ClusterMap>(version, body),
    }
});
