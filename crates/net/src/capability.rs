//! Capabilities: a metadata server's grant of access to one file's objects, checked by the
//! storage servers for clients whose access the servers decide (docs/design/security.md,
//! "Capabilities"). Both derive the key from the cluster key; clients never hold it.

use crate::auth::Auth;
use ring::hmac;
use weft_proto::access::{Capability, GrowthBound, READ, WRITE};
use weft_proto::error::WireError;
use weft_proto::ids::{ClientId, InodeId};
use weft_proto::ErrorCode;

/// What the capability key is derived from the cluster key with.
const KEY_LABEL: &[u8] = b"weft capability key";
/// How long a capability is good for: a client that keeps a file open longer opens it again
/// for a new one, and a client that lost its right to the file (a chmod, a move out of its
/// subtree, a new rule) keeps at most this long what it was granted before.
pub const CAPABILITY_TTL: std::time::Duration = std::time::Duration::from_secs(600);

/// The key capabilities are granted and checked with.
#[derive(Clone)]
pub struct Capabilities {
    key: hmac::Key,
}

impl std::fmt::Debug for Capabilities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Capabilities")
    }
}

/// What a proof signs: the inode, the access, the session and the expiry; for the proof of a
/// growth bound, its fields too.
fn signed(
    inode: InodeId,
    access: u8,
    session: ClientId,
    expires: u64,
    growth: Option<&GrowthBound>,
) -> Vec<u8> {
    let mut input = Vec::with_capacity(45);
    input.extend_from_slice(&inode.0.to_le_bytes());
    input.push(access);
    input.extend_from_slice(&session.0.to_le_bytes());
    input.extend_from_slice(&expires.to_le_bytes());
    if let Some(growth) = growth {
        input.extend_from_slice(&growth.uid.to_le_bytes());
        input.extend_from_slice(&growth.gid.to_le_bytes());
        input.extend_from_slice(&growth.project.to_le_bytes());
        input.extend_from_slice(&growth.object_end.to_le_bytes());
    }
    input
}

/// This process's clock, in milliseconds since the Unix epoch. Tests move it by
/// `WEFT_TEST_CLOCK_SKEW_MS` (a fault-injection setting only tests set) to play a server
/// whose clock is off; the cluster's clock ([`crate::MgmtClient::cluster_clock_ms`]) is what
/// capabilities go by.
pub fn local_clock_ms() -> u64 {
    static SKEW_MS: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    let skew = *SKEW_MS.get_or_init(|| {
        std::env::var("WEFT_TEST_CLOCK_SKEW_MS")
            .ok()
            .and_then(|skew| skew.parse().ok())
            .unwrap_or(0)
    });
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64);
    now.saturating_add_signed(skew)
}

#[cfg(test)]
fn now_seconds() -> u64 {
    local_clock_ms() / 1000
}

impl Capabilities {
    /// The key of a process holding the cluster key; `None` for others.
    pub fn of(auth: &Auth) -> Option<Capabilities> {
        auth.derived_key(KEY_LABEL).map(|key| Capabilities { key })
    }

    /// A grant of `access` ([`READ`], [`WRITE`]) to the objects of `inode`, to `session`, for
    /// [`CAPABILITY_TTL`] from `now_seconds` (the cluster's clock), binding the file's growth
    /// through it to `growth`.
    pub fn grant(
        &self,
        (inode, access): (InodeId, u8),
        session: ClientId,
        now_seconds: u64,
        growth: Option<GrowthBound>,
    ) -> Capability {
        self.grant_until(
            (inode, access),
            session,
            now_seconds + CAPABILITY_TTL.as_secs(),
            growth,
        )
    }

    fn grant_until(
        &self,
        (inode, access): (InodeId, u8),
        session: ClientId,
        expires: u64,
        growth: Option<GrowthBound>,
    ) -> Capability {
        let access = access & (READ | WRITE);
        let sign = |growth: Option<&GrowthBound>| {
            let tag = hmac::sign(&self.key, &signed(inode, access, session, expires, growth));
            let mut proof = [0; 32];
            proof.copy_from_slice(tag.as_ref());
            proof
        };
        Capability {
            session,
            access,
            expires,
            proof: sign(None),
            growth: growth.map(|growth| GrowthBound {
                proof: sign(Some(&growth)),
                ..growth
            }),
        }
    }

    /// That `capability` grants `want` on the objects of `inode` at `now_seconds` (the
    /// cluster's clock; the session is checked elsewhere, as every session a client names).
    ///
    /// # Errors
    /// `CapabilityNeeded` when there is none, or it grants less or another file, or it
    /// expired, or it is forged.
    pub fn check(
        &self,
        inode: InodeId,
        want: u8,
        capability: Option<&Capability>,
        now_seconds: u64,
    ) -> Result<(), WireError> {
        let denied = |why: &str| {
            Err(WireError::new(
                ErrorCode::CapabilityNeeded,
                format!("access to the objects of {inode} denied: {why}"),
            ))
        };
        let Some(capability) = capability else {
            return denied("the client's access is checked by the servers, and it showed no capability from an open of the file");
        };
        if capability.access & want != want {
            return denied("its capability does not grant that access");
        }
        if !self.genuine(inode, capability) {
            return denied("its capability was not granted for this file and session");
        }
        if capability.expires <= now_seconds {
            return denied("its capability expired; open the file again");
        }
        Ok(())
    }
}

impl Capabilities {
    /// Whether `capability` was granted by a metadata server for `inode`, with at least
    /// `want`, expired or not: it proves what an open of its session was granted, which is
    /// what a change through that open is judged by (the metadata server checks that the
    /// session still holds an open of the file).
    pub fn proves(&self, inode: InodeId, want: u8, capability: &Capability) -> bool {
        capability.access & want == want && self.genuine(inode, capability)
    }

    /// Whether the proof of `capability` verifies for `inode`.
    fn genuine(&self, inode: InodeId, capability: &Capability) -> bool {
        let verify = |growth: Option<&GrowthBound>, proof: &[u8; 32]| {
            let input = signed(
                inode,
                capability.access,
                capability.session,
                capability.expires,
                growth,
            );
            hmac::verify(&self.key, &input, proof).is_ok()
        };
        verify(None, &capability.proof)
            && capability
                .growth
                .as_ref()
                .is_none_or(|growth| verify(Some(growth), &growth.proof))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capabilities(key: &[u8]) -> Capabilities {
        Capabilities {
            key: hmac::Key::new(hmac::HMAC_SHA256, key),
        }
    }

    // Goal: a capability opens what it was granted for and nothing else: not another file,
    // not more access, not another session, not for longer, not when made with another key.
    #[test]
    fn a_capability_grants_what_it_names() {
        let ours = capabilities(b"one");
        let inode = InodeId(7);
        let session = ClientId(3);
        let now = now_seconds();
        let read = ours.grant((inode, READ), session, now, None);
        assert!(ours.check(inode, READ, Some(&read), now).is_ok());
        assert!(ours.check(inode, 0, Some(&read), now).is_ok());
        assert!(ours.check(inode, WRITE, Some(&read), now).is_err());
        assert!(ours.check(InodeId(8), READ, Some(&read), now).is_err());
        assert!(ours.check(inode, READ, None, now).is_err());
        let mut widened = read;
        widened.access = READ | WRITE;
        assert!(ours.check(inode, WRITE, Some(&widened), now).is_err());
        let mut moved = read;
        moved.session = ClientId(4);
        assert!(ours.check(inode, READ, Some(&moved), now).is_err());
        let theirs = capabilities(b"two").grant((inode, READ), session, now, None);
        assert!(ours.check(inode, READ, Some(&theirs), now).is_err());
        let mut extended = read;
        extended.expires += 3600;
        assert!(ours.check(inode, READ, Some(&extended), now).is_err());
        let expired = ours.grant_until((inode, READ), session, now - 1, None);
        let refused = ours
            .check(inode, READ, Some(&expired), now)
            .expect_err("expired");
        assert_eq!(refused.code, ErrorCode::CapabilityNeeded);
        // An expired one still proves what its open was granted, and no more.
        assert!(ours.proves(inode, READ, &expired));
        assert!(!ours.proves(inode, WRITE, &expired));
        assert!(!ours.proves(InodeId(8), READ, &expired));
        assert!(!ours.proves(inode, READ | WRITE, &widened));
        assert!(!ours.proves(inode, READ, &theirs));
        // Expiry is read on the clock given (the cluster's): granted by one server's, it
        // holds on another's until the same moment.
        assert!(ours.check(inode, READ, Some(&read), now + 599).is_ok());
        assert!(ours.check(inode, READ, Some(&read), now + 600).is_err());
        // The growth bound is signed too: neither taken off, nor put on, nor moved.
        let bound = GrowthBound {
            uid: 65534,
            gid: 65534,
            project: 0,
            object_end: 1 << 20,
            proof: [0; 32],
        };
        let write = ours.grant((inode, WRITE), session, now, Some(bound));
        assert!(ours.check(inode, WRITE, Some(&write), now).is_ok());
        // A peer of version 8 never sees the bound: the rest still proves itself.
        let older = Capability {
            growth: None,
            ..write
        };
        assert!(ours.check(inode, WRITE, Some(&older), now).is_ok());
        let granted = write.growth.expect("a bound");
        for forged in [
            Some(GrowthBound {
                object_end: u64::MAX,
                ..granted
            }),
            Some(GrowthBound { uid: 0, ..granted }),
            Some(bound),
        ] {
            let forged = Capability {
                growth: forged,
                ..write
            };
            assert!(ours.check(inode, WRITE, Some(&forged), now).is_err());
        }
        let unbound = Capability {
            growth: Some(bound),
            ..read
        };
        assert!(ours.check(inode, READ, Some(&unbound), now).is_err());
    }
}
