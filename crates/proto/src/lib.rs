//! Weft's shared vocabulary: everything two processes must compute identically.
//!
//! Layout:
//! - [`access`] — client identities' restrictions, and which requests are for clients.
//! - [`ids`] — newtypes for every identifier (nodes, targets, inodes, clients).
//! - [`error`] — the stable wire [`ErrorCode`] and its one mapping to errno.
//! - [`layout`] — stripe patterns and the byte → (target, object offset) mapping.
//! - [`locks`] — byte-range lock arithmetic shared by servers and clients.
//! - [`codec`] — the frame header and body encoding, with every size bounded.
//! - [`messages`] — the typed request and response bodies of every service.
//! - [`pools`] — storage pools and the capacity classes of their targets.
//! - [`quota`] — the space and inodes users and groups use, per pool.
//! - [`checksum`] — the payload checksum (CRC32C).
//! - [`wire`] — explicit variant tags, and the version a message is encoded in.
//!
//! This crate is pure: no tokio, no file system, so the simulator, fuzzers and every service can
//! use it and agree byte for byte.

pub mod access;
pub mod answer;
pub mod checksum;
pub mod codec;
pub mod error;
pub mod ids;
pub mod layout;
pub mod locks;
pub mod messages;
pub mod pools;
pub mod quota;
pub mod wire;

// The `Wire` derive names this crate by its name, from inside it too.
extern crate self as weft_proto;

pub use error::{ErrorCode, Recovery};
pub use ids::{ClientId, InodeId, NodeId, StoragePoolId, TargetId};

/// A duration kept in a config as whole milliseconds: `#[serde(rename = "x_ms", with =
/// "weft_proto::millis")] pub x: Duration`.
pub mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    /// Writes `duration` as milliseconds.
    ///
    /// # Errors
    /// What the serializer gives.
    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
    }

    /// Reads milliseconds as a duration.
    ///
    /// # Errors
    /// What the deserializer gives for a value that is not a whole number.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        u64::deserialize(deserializer).map(Duration::from_millis)
    }
}
