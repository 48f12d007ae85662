//! The protocol version a message is encoded in, for peers one version older
//! (docs/design/protocol.md, "Versions").
//!
//! Enums that cross the wire or are stored on disk derive [`Wire`]: each variant's tag is in
//! the source (`#[wire(tag = N)]`). A message changes between versions only by a variant
//! added (`#[wire(tag = N, since = V)]`) or a field added (`#[serde(default, with =
//! "crate::wire::since_3")]`): encoding for a peer of an older version refuses the variant,
//! and the field too unless it has its default (then it is left out: the peer would not
//! have acted on it); decoding a message of an older version gives the field its default.
//! (Fields of version 2, `since_2`, date from when version 1 was still spoken and are
//! always present now.)
//! [`crate::codec`] encodes and decodes bodies in the version a connection agreed on; stored
//! records are always in the current version.

use crate::codec::PROTOCOL_VERSION;
use std::cell::Cell;

pub use weft_wire_derive::Wire;

thread_local! {
    static VERSION: Cell<u16> = const { Cell::new(PROTOCOL_VERSION) };
    /// Why the last encoding on this thread failed, when a message was too new for its peer
    /// (postcard keeps no message of a serializer's own error).
    static TOO_NEW: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// The error of encoding `what` (a variant or field) for a peer of an older version; used by
/// the [`Wire`] derive.
pub fn too_new<E: serde::ser::Error>(what: &'static str) -> E {
    TOO_NEW.with(|cell| cell.set(Some(what)));
    E::custom(what)
}

/// Why the last encoding on this thread failed for an older peer, if it did; cleared.
pub(crate) fn take_too_new() -> Option<&'static str> {
    TOO_NEW.with(Cell::take)
}

/// The version being encoded or decoded on this thread: [`PROTOCOL_VERSION`] outside
/// [`in_version`].
pub fn version() -> u16 {
    VERSION.with(Cell::get)
}

/// Runs `work` (an encoding or a decoding, which never yields) in `version`.
pub fn in_version<T>(version: u16, work: impl FnOnce() -> T) -> T {
    let before = VERSION.with(|cell| cell.replace(version));
    // Restored even if `work` panics, so a later message is not encoded in the wrong version.
    struct Restore(u16);
    impl Drop for Restore {
        fn drop(&mut self) {
            VERSION.with(|cell| cell.set(self.0));
        }
    }
    let _restore = Restore(before);
    work()
}

/// Encodes a field added in protocol version `SINCE`, or nothing for an older peer.
///
/// # Errors
/// As `value`'s own encoding.
fn encode_since<const SINCE: u16, T: serde::Serialize, S: serde::Serializer>(
    value: &T,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    if version() < SINCE {
        serializer.serialize_unit()
    } else {
        value.serialize(serializer)
    }
}

/// Encodes a field added in protocol version `SINCE` that an older peer must not go without:
/// nothing for an older peer when it is unset, refused with `refusal` when it is set.
///
/// # Errors
/// As `value`'s own encoding; for an older peer, the field when it is set.
fn encode_set_since<const SINCE: u16, T, S>(
    value: &T,
    serializer: S,
    refusal: &'static str,
) -> Result<S::Ok, S::Error>
where
    T: serde::Serialize + Unset,
    S: serde::Serializer,
{
    if version() >= SINCE {
        value.serialize(serializer)
    } else if value.is_unset() {
        serializer.serialize_unit()
    } else {
        Err(too_new(refusal))
    }
}

/// Decodes a field added in protocol version `SINCE`, or gives its default for a message of
/// an older version.
///
/// # Errors
/// As `T`'s own decoding.
fn decode_since<'de, const SINCE: u16, T, D>(deserializer: D) -> Result<T, D::Error>
where
    T: serde::Deserialize<'de> + Default,
    D: serde::Deserializer<'de>,
{
    if version() < SINCE {
        Ok(T::default())
    } else {
        T::deserialize(deserializer)
    }
}

/// A field of a later version: an `Option`, unset when `None`.
pub trait Unset {
    /// Whether it holds nothing an older peer would miss.
    fn is_unset(&self) -> bool;
}

impl<T> Unset for Option<T> {
    fn is_unset(&self) -> bool {
        self.is_none()
    }
}

impl<T: Unset + ?Sized> Unset for &T {
    fn is_unset(&self) -> bool {
        (**self).is_unset()
    }
}

/// A `with` module for a field added in protocol version `$since` that an older peer does
/// without: left out of encodings for it whatever it holds, and its default when decoded
/// from one.
macro_rules! field_since {
    ($(#[$doc:meta])* $name:ident, $since:literal) => {
        $(#[$doc])*
        pub mod $name {
            use serde::{Deserialize, Deserializer, Serialize, Serializer};

            /// Encodes `value`, or nothing for a peer of an older version.
            ///
            /// # Errors
            /// As `value`'s own encoding.
            pub fn serialize<T: Serialize, S: Serializer>(
                value: &T,
                serializer: S,
            ) -> Result<S::Ok, S::Error> {
                super::encode_since::<$since, T, S>(value, serializer)
            }

            /// Decodes the field, or gives its default for a message of an older version.
            ///
            /// # Errors
            /// As `T`'s own decoding.
            pub fn deserialize<'de, T: Deserialize<'de> + Default, D: Deserializer<'de>>(
                deserializer: D,
            ) -> Result<T, D::Error> {
                super::decode_since::<$since, T, D>(deserializer)
            }
        }
    };
}

/// A `with` module for a field added in protocol version `$since` (an `Option`) that an
/// older peer must not go without: left out of encodings for it when unset, refused when set
/// (a peer that cannot read it must not act without it); its default when decoded from one.
macro_rules! set_field_since {
    ($(#[$doc:meta])* $name:ident, $since:literal, $refusal:literal) => {
        $(#[$doc])*
        pub mod $name {
            use serde::{Deserialize, Deserializer, Serialize, Serializer};

            /// Encodes `value`; for a peer of an older version, nothing when it is unset.
            ///
            /// # Errors
            /// As `value`'s own encoding; for a peer of an older version, the field when it
            /// is set.
            pub fn serialize<T: Serialize + super::Unset, S: Serializer>(
                value: &T,
                serializer: S,
            ) -> Result<S::Ok, S::Error> {
                super::encode_set_since::<$since, T, S>(value, serializer, $refusal)
            }

            /// Decodes the field, or gives its default for a message of an older version.
            ///
            /// # Errors
            /// As `T`'s own decoding.
            pub fn deserialize<'de, T: Deserialize<'de> + Default, D: Deserializer<'de>>(
                deserializer: D,
            ) -> Result<T, D::Error> {
                super::decode_since::<$since, T, D>(deserializer)
            }
        }
    };
}

field_since!(
    /// A field added in protocol version 2: absent from encodings for version 1, and its
    /// default when decoded from one.
    since_2,
    2
);

set_field_since!(
    /// A field added in protocol version 3 (an `Option`): left out of encodings for version 2
    /// when it is `None`, and refused when it is set (a client's subtree rule is not silently
    /// dropped); its default when decoded from version 2.
    since_3,
    3,
    "a field of protocol version 3 is set, and the peer speaks an older one"
);

field_since!(
    /// A field added in protocol version 3 that an older peer has no use for (a capability,
    /// which servers of version 2 do not check): left out of encodings for version 2 whatever
    /// it holds, and its default when decoded from version 2.
    since_3_advisory,
    3
);

field_since!(
    /// A field added in protocol version 4 that an older peer does without (the storage
    /// pools' names and limits in the cluster map: a peer of version 3 places files by pool id
    /// alone): left out of encodings for version 3, and its default when decoded from it.
    since_4,
    4
);

field_since!(
    /// A field added in protocol version 5 (project quotas: an inode's project, carried where
    /// its owner is): left out of encodings for version 4, and its default when decoded from
    /// version 4.
    since_5,
    5
);

set_field_since!(
    /// A field added in protocol version 5 that an older peer must not go without (the
    /// project a setattr gives an inode, a restripe's pattern, an `Option`): left out of
    /// encodings for version 4 when it is `None`, refused when it is set; its default when
    /// decoded from version 4.
    since_5_set,
    5,
    "a field of protocol version 5 is set, and the peer speaks an older one"
);

field_since!(
    /// A field added in protocol version 7 that an older peer does without (how long a new
    /// client session lives unheard, which a client of version 6 takes from its own
    /// settings): left out of encodings for version 6, and its default when decoded from it.
    since_7,
    7
);

field_since!(
    /// A field added in protocol version 8 that an older peer does without (the capability
    /// of the open a change is made through, which a server of version 7 does not look at):
    /// left out of encodings for version 7, and its default when decoded from it.
    since_8,
    8
);

field_since!(
    /// A field added in protocol version 9 that an older peer does without (the hard quota
    /// limits in the cluster map, which homes of version 8 enforce by the blocked list only):
    /// left out of encodings for version 8, and its default when decoded from it.
    since_9,
    9
);

field_since!(
    /// A field added in protocol version 13 that an older peer does without (whether an inode
    /// has no extended attributes, which a client of version 12 asks its server instead): left
    /// out of encodings for version 12, and its default when decoded from it.
    since_13,
    13
);

field_since!(
    /// A field added in protocol version 14 that an older peer does without (the session a
    /// size report is made in, which a server of version 13 does not number): left out of
    /// encodings for version 13, and its default when decoded from it.
    since_14,
    14
);

field_since!(
    /// A field added in protocol version 15 that an older peer does without (a names lease,
    /// which a client of version 14 never gets): left out of encodings for version 14, and
    /// its default when decoded from it.
    since_15,
    15
);

set_field_since!(
    /// A field added in protocol version 6 that an older peer must not go without (the
    /// storage mirror group a push of a mirrored object is from): left out of encodings for
    /// version 5 when it is `None`, refused when it is set; its default when decoded from an
    /// older version.
    since_6_set,
    6,
    "a field of protocol version 6 is set, and the peer speaks an older one"
);
