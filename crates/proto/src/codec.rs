//! The frame: a fixed 32-byte header, a postcard-encoded body, and an optional raw payload.
//!
//! ```text
//! offset  size  field
//!      0     4  magic "WEFT" (0x54464557 little endian)
//!      4     2  protocol version the body is encoded in (the one the connection agreed on)
//!      6     1  kind: 0 request, 1 response
//!      7     1  flags: 1 = a request a server passes on to another (a mirror forward, a
//!               metadata replica's change), taken from a budget of its own
//!      8     8  request id, echoed by the response
//!     16     4  body length
//!     20     4  payload length
//!     24     4  CRC32C of the payload (0 when there is none)
//!     28     4  origin: the client session that sent a request (the low 32 bits of its
//!               id), 0 from servers and tools; zero in responses
//! ```
//!
//! Every length is bounded by a named `*_MAX` constant before anything is allocated; a frame
//! that breaks a bound is a [`DecodeError`] and closes its connection.

use serde::{de::DeserializeOwned, Serialize};

/// "WEFT" in little endian.
pub const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"WEFT");
/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 15;
/// The oldest protocol version this build speaks with a peer (in the handshake): older
/// ones, for rolling upgrades (version 6 only added the seal mirror members take from their
/// primary, version 7 the messages management servers replicate with, version 8 the
/// capability a change through a descriptor shows, version 9 the grants of hard quotas, version
/// 10 the listing with attributes, version 11 a removal's answer with its directory's
/// attributes, version 12 the removal of many objects in one request, version 13 whether an
/// inode has no extended attributes, version 14 numbered changes and their replay, version 15
/// names leases, so a peer of version 4 is still spoken to as before).
pub const PROTOCOL_VERSION_MIN: u16 = 4;
/// Size of the fixed header.
pub const FRAME_HEADER_BYTES: usize = 32;
/// A header flag: the request is one a server passes on to another (a mirror forward, a
/// metadata replica's change).
pub const FLAG_FORWARDED: u8 = 1;
/// Largest body: directory listings are batched to stay below it.
pub const FRAME_BODY_BYTES_MAX: u32 = 4 * 1024 * 1024;
/// Largest raw payload: clients cut I/O into pieces no larger.
pub const FRAME_PAYLOAD_BYTES_MAX: u32 = 16 * 1024 * 1024;

/// Whether a frame is a request or a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// A request; the peer answers with a response of the same id.
    Request = 0,
    /// A response to the request with the same id.
    Response = 1,
}

/// The decoded fixed header of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// The protocol version of the body: [`PROTOCOL_VERSION_MIN`] to [`PROTOCOL_VERSION`].
    pub version: u16,
    /// [`FLAG_FORWARDED`], or 0.
    pub flags: u8,
    /// Request or response.
    pub kind: FrameKind,
    /// Chosen by the requester, echoed by the response.
    pub request_id: u64,
    /// Length of the postcard body that follows the header.
    pub body_len: u32,
    /// Length of the raw payload that follows the body.
    pub payload_len: u32,
    /// CRC32C of the payload.
    pub payload_crc: u32,
    /// The client session that sent a request (the low 32 bits of its id), 0 for servers and
    /// tools: servers count load per client by it.
    pub origin: u32,
}

/// Why a frame could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// The magic number is wrong: the peer does not speak Weft.
    #[error("bad frame magic {found:#010x}: the peer does not speak the Weft protocol")]
    BadMagic {
        /// What was found instead.
        found: u32,
    },
    /// The peer speaks another protocol version.
    #[error("protocol version {found} is not supported (this build speaks {PROTOCOL_VERSION_MIN} to {PROTOCOL_VERSION})")]
    Version {
        /// The peer's version.
        found: u16,
    },
    /// The kind byte is neither request nor response.
    #[error("unknown frame kind {found}")]
    Kind {
        /// The byte found.
        found: u8,
    },
    /// The body is larger than [`FRAME_BODY_BYTES_MAX`].
    #[error("frame body of {body_len} bytes exceeds the limit of {FRAME_BODY_BYTES_MAX}")]
    BodyTooLarge {
        /// The announced length.
        body_len: u32,
    },
    /// The payload is larger than [`FRAME_PAYLOAD_BYTES_MAX`].
    #[error("frame payload of {payload_len} bytes exceeds the limit of {FRAME_PAYLOAD_BYTES_MAX}")]
    PayloadTooLarge {
        /// The announced length.
        payload_len: u32,
    },
    /// The payload's CRC32C does not match the header's.
    #[error("payload checksum mismatch (expected {expected:#010x}, found {found:#010x})")]
    PayloadChecksum {
        /// The header's checksum.
        expected: u32,
        /// The checksum of the bytes received.
        found: u32,
    },
    /// The body is not a valid encoding of the expected message.
    #[error("malformed frame body: {reason}")]
    Body {
        /// The decoder's complaint.
        reason: String,
    },
}

impl FrameHeader {
    /// Encodes the header into its fixed 32 bytes.
    pub fn encode(&self) -> [u8; FRAME_HEADER_BYTES] {
        let mut bytes = [0u8; FRAME_HEADER_BYTES];
        bytes[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        bytes[4..6].copy_from_slice(&self.version.to_le_bytes());
        bytes[6] = self.kind as u8;
        bytes[7] = self.flags;
        bytes[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        bytes[16..20].copy_from_slice(&self.body_len.to_le_bytes());
        bytes[20..24].copy_from_slice(&self.payload_len.to_le_bytes());
        bytes[24..28].copy_from_slice(&self.payload_crc.to_le_bytes());
        bytes[28..32].copy_from_slice(&self.origin.to_le_bytes());
        bytes
    }

    /// Decodes and bounds-checks a header.
    ///
    /// # Errors
    /// [`DecodeError`] for a wrong magic, version or kind, or a length over its limit.
    pub fn decode(bytes: &[u8; FRAME_HEADER_BYTES]) -> Result<FrameHeader, DecodeError> {
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let magic = u32_at(0);
        if magic != FRAME_MAGIC {
            return Err(DecodeError::BadMagic { found: magic });
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        if !(PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION).contains(&version) {
            return Err(DecodeError::Version { found: version });
        }
        let kind = match bytes[6] {
            0 => FrameKind::Request,
            1 => FrameKind::Response,
            found => return Err(DecodeError::Kind { found }),
        };
        let mut request_id = [0u8; 8];
        request_id.copy_from_slice(&bytes[8..16]);
        let header = FrameHeader {
            version,
            flags: bytes[7],
            kind,
            request_id: u64::from_le_bytes(request_id),
            body_len: u32_at(16),
            payload_len: u32_at(20),
            payload_crc: u32_at(24),
            origin: u32_at(28),
        };
        if header.body_len > FRAME_BODY_BYTES_MAX {
            return Err(DecodeError::BodyTooLarge {
                body_len: header.body_len,
            });
        }
        if header.payload_len > FRAME_PAYLOAD_BYTES_MAX {
            return Err(DecodeError::PayloadTooLarge {
                payload_len: header.payload_len,
            });
        }
        Ok(header)
    }

    /// Checks a received payload against the header's checksum.
    ///
    /// # Errors
    /// [`DecodeError::PayloadChecksum`] when the bytes were damaged on the way.
    pub fn check_payload(&self, payload: &[u8]) -> Result<(), DecodeError> {
        debug_assert_eq!(payload.len() as u64, u64::from(self.payload_len));
        let found = crate::checksum::crc32c(payload);
        if found != self.payload_crc {
            return Err(DecodeError::PayloadChecksum {
                expected: self.payload_crc,
                found,
            });
        }
        Ok(())
    }
}

/// Encodes a message body in this build's protocol version.
///
/// # Panics
/// If the message cannot be encoded, which for Weft's own message types cannot happen.
pub fn encode_body<T: Serialize>(message: &T) -> Vec<u8> {
    postcard::to_stdvec(message).expect("Weft messages always encode")
}

/// Encodes a message body in protocol `version` (see [`crate::wire`]).
///
/// # Errors
/// When the message has no encoding in `version` (it is newer than the peer), saying what.
pub fn encode_body_in<T: Serialize>(version: u16, message: &T) -> Result<Vec<u8>, String> {
    crate::wire::in_version(version, || postcard::to_stdvec(message)).map_err(|error| {
        crate::wire::take_too_new().map_or_else(|| error.to_string(), str::to_string)
    })
}

/// Decodes a message body of this build's protocol version.
///
/// # Errors
/// [`DecodeError::Body`] when the bytes are not a valid `T`.
pub fn decode_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    decode_body_in(PROTOCOL_VERSION, bytes)
}

/// Decodes a message body of protocol `version` (a frame header's).
///
/// # Errors
/// [`DecodeError::Body`] when the bytes are not a valid `T`.
pub fn decode_body_in<T: DeserializeOwned>(version: u16, bytes: &[u8]) -> Result<T, DecodeError> {
    let (message, rest) = crate::wire::in_version(version, || postcard::take_from_bytes(bytes))
        .map_err(|error| DecodeError::Body {
            reason: error.to_string(),
        })?;
    // A body is one message: bytes after it are a peer that encodes something else (another
    // version's fields, say) and must not be taken for this one.
    if !rest.is_empty() {
        return Err(DecodeError::Body {
            reason: format!("{} bytes after the message", rest.len()),
        });
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{GroupId, GroupVersion};
    use crate::messages::{Request, StorageRequest};
    use crate::{InodeId, TargetId};
    use proptest::prelude::*;

    fn header() -> FrameHeader {
        FrameHeader {
            version: PROTOCOL_VERSION,
            flags: 0,
            kind: FrameKind::Request,
            request_id: 42,
            body_len: 10,
            payload_len: 3,
            payload_crc: crate::checksum::crc32c(b"abc"),
            origin: 7,
        }
    }

    // Goal: a header decodes to what was encoded, and its golden bytes never change; a header
    // of the older version this build still speaks decodes as that version.
    #[test]
    fn header_round_trip_and_golden_bytes() {
        let bytes = header().encode();
        assert_eq!(FrameHeader::decode(&bytes), Ok(header()));
        assert_eq!(&bytes[0..8], &[b'W', b'E', b'F', b'T', 15, 0, 0, 0]);
        let older = FrameHeader {
            version: PROTOCOL_VERSION_MIN,
            ..header()
        };
        assert_eq!(&older.encode()[4..6], &[4, 0]);
        assert_eq!(FrameHeader::decode(&older.encode()), Ok(older));
        assert_eq!(&bytes[8..16], &42u64.to_le_bytes());
        assert_eq!(&bytes[28..32], &7u32.to_le_bytes());
    }

    // Goal: malformed or oversized headers are rejected with a precise error, never allocated.
    #[test]
    fn rejects_malformed_headers() {
        let mut bytes = header().encode();
        bytes[0] = b'X';
        assert!(matches!(
            FrameHeader::decode(&bytes),
            Err(DecodeError::BadMagic { .. })
        ));
        let mut bytes = header().encode();
        bytes[4] = 16;
        assert_eq!(
            FrameHeader::decode(&bytes),
            Err(DecodeError::Version { found: 16 })
        );
        let mut bytes = header().encode();
        bytes[6] = 7;
        assert_eq!(
            FrameHeader::decode(&bytes),
            Err(DecodeError::Kind { found: 7 })
        );
        let oversized = FrameHeader {
            body_len: FRAME_BODY_BYTES_MAX + 1,
            ..header()
        };
        assert!(matches!(
            FrameHeader::decode(&oversized.encode()),
            Err(DecodeError::BodyTooLarge { .. })
        ));
        let oversized = FrameHeader {
            payload_len: FRAME_PAYLOAD_BYTES_MAX + 1,
            ..header()
        };
        assert!(matches!(
            FrameHeader::decode(&oversized.encode()),
            Err(DecodeError::PayloadTooLarge { .. })
        ));
    }

    // Goal: a damaged payload is caught by its checksum.
    #[test]
    fn payload_checksum() {
        assert!(header().check_payload(b"abc").is_ok());
        assert!(matches!(
            header().check_payload(b"abd"),
            Err(DecodeError::PayloadChecksum { .. })
        ));
    }

    // Goal: bodies round-trip through the codec.
    #[test]
    fn body_round_trip() {
        let request = Request::Storage(StorageRequest::Read {
            target: TargetId(3),
            mirror: Some(crate::messages::MirrorRoute {
                group: GroupId(2),
                version: GroupVersion(7),
                forwarded: true,
            }),
            inode: InodeId::ROOT,
            generation: 5,
            object_offset: 4096,
            len: 65536,
            capability: None,
        });
        let bytes = encode_body(&request);
        assert_eq!(decode_body::<Request>(&bytes), Ok(request));
    }

    proptest! {
        // Goal: no byte string makes the decoders panic; they either decode or return an error.
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut header_bytes = [0u8; FRAME_HEADER_BYTES];
            for (slot, byte) in header_bytes.iter_mut().zip(bytes.iter()) { *slot = *byte; }
            let _ = FrameHeader::decode(&header_bytes);
            let _ = decode_body::<Request>(&bytes);
        }
    }
}
