//! POSIX ACLs in Linux's extended-attribute format, as the kernel hands them over FUSE:
//! a 4-byte version (2), then 8-byte entries (tag u16, permissions u16, id u32), little endian.
//! The kernel enforces ACLs; the metadata server stores them, keeps the mode bits in step with
//! an access ACL, and applies a directory's default ACL to what is created in it.

/// The access ACL attribute.
pub(crate) const ACL_ACCESS: &str = "system.posix_acl_access";
/// The default ACL attribute of a directory.
pub(crate) const ACL_DEFAULT: &str = "system.posix_acl_default";
/// A directory's default spread (see [`weft_proto::messages::DIR_SPREAD_XATTR`]).
pub(crate) const DIR_SPREAD: &str = weft_proto::messages::DIR_SPREAD_XATTR;

/// The spread a [`DIR_SPREAD`] value asks for, if it is a valid one (0 and 1: none).
pub(crate) fn parse_dir_spread(value: &[u8]) -> Option<u16> {
    std::str::from_utf8(value)
        .ok()?
        .trim()
        .parse::<u16>()
        .ok()
        .filter(|count| *count <= weft_proto::layout::DIR_SHARDS_MAX)
}

const ACL_VERSION: u32 = 2;
const ENTRY_BYTES: usize = 8;
/// Most entries one ACL may have (the ext4 limit is lower; this bounds the decoder).
const ACL_ENTRIES_MAX: usize = 8192;

const TAG_USER_OBJ: u16 = 0x01;
const TAG_USER: u16 = 0x02;
const TAG_GROUP_OBJ: u16 = 0x04;
const TAG_GROUP: u16 = 0x08;
const TAG_MASK: u16 = 0x10;
const TAG_OTHER: u16 = 0x20;

/// One ACL entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AclEntry {
    pub tag: u16,
    pub permissions: u16,
    pub id: u32,
}

/// A decoded ACL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Acl {
    pub entries: Vec<AclEntry>,
}

impl Acl {
    /// Decodes and validates an ACL: known tags, exactly one owner, owning group and other entry,
    /// a mask whenever named entries exist.
    pub fn decode(bytes: &[u8]) -> Result<Acl, String> {
        if bytes.len() < 4 || (bytes.len() - 4) % ENTRY_BYTES != 0 {
            return Err(format!("an ACL of {} bytes is malformed", bytes.len()));
        }
        let version = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        if version != ACL_VERSION {
            return Err(format!("ACL version {version} is not supported"));
        }
        let count = (bytes.len() - 4) / ENTRY_BYTES;
        if count > ACL_ENTRIES_MAX {
            return Err(format!("an ACL of {count} entries is too long"));
        }
        let entries: Vec<AclEntry> = bytes[4..]
            .chunks_exact(ENTRY_BYTES)
            .map(|e| AclEntry {
                tag: u16::from_le_bytes([e[0], e[1]]),
                permissions: u16::from_le_bytes([e[2], e[3]]),
                id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            })
            .collect();
        let count_of = |tag: u16| entries.iter().filter(|e| e.tag == tag).count();
        if entries.iter().any(|e| {
            ![
                TAG_USER_OBJ,
                TAG_USER,
                TAG_GROUP_OBJ,
                TAG_GROUP,
                TAG_MASK,
                TAG_OTHER,
            ]
            .contains(&e.tag)
                || e.permissions > 7
        }) {
            return Err("an ACL entry has an unknown tag or permission bits".to_string());
        }
        if count_of(TAG_USER_OBJ) != 1 || count_of(TAG_GROUP_OBJ) != 1 || count_of(TAG_OTHER) != 1 {
            return Err("an ACL needs exactly one owner, owning-group and other entry".to_string());
        }
        let named = count_of(TAG_USER) + count_of(TAG_GROUP);
        if count_of(TAG_MASK) > 1 || (named > 0 && count_of(TAG_MASK) == 0) {
            return Err("an ACL with named entries needs exactly one mask".to_string());
        }
        Ok(Acl { entries })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = ACL_VERSION.to_le_bytes().to_vec();
        for entry in &self.entries {
            bytes.extend_from_slice(&entry.tag.to_le_bytes());
            bytes.extend_from_slice(&entry.permissions.to_le_bytes());
            bytes.extend_from_slice(&entry.id.to_le_bytes());
        }
        bytes
    }

    fn permissions_of(&self, tag: u16) -> Option<u32> {
        self.entries
            .iter()
            .find(|e| e.tag == tag)
            .map(|e| u32::from(e.permissions))
    }

    /// The permission bits (0o777) an access ACL implies: owner, mask (or owning group), other.
    pub fn mode_bits(&self) -> u32 {
        let owner = self.permissions_of(TAG_USER_OBJ).unwrap_or(0);
        let group = self
            .permissions_of(TAG_MASK)
            .or_else(|| self.permissions_of(TAG_GROUP_OBJ))
            .unwrap_or(0);
        let other = self.permissions_of(TAG_OTHER).unwrap_or(0);
        (owner << 6) | (group << 3) | other
    }

    /// True when the ACL says no more than the mode bits (only the three base entries).
    pub fn is_equivalent_to_mode(&self) -> bool {
        self.entries
            .iter()
            .all(|e| matches!(e.tag, TAG_USER_OBJ | TAG_GROUP_OBJ | TAG_OTHER))
    }

    /// Applies a new inode's requested `mode` to an ACL inherited from a default ACL, as Linux's
    /// posix_acl_create_masq does; returns the resulting permission bits.
    pub fn create_masq(&mut self, mode: u32) -> u32 {
        let mut mode = mode & 0o777;
        let mut has_mask = false;
        for entry in &mut self.entries {
            let permissions = u32::from(entry.permissions);
            match entry.tag {
                TAG_USER_OBJ => {
                    let kept = permissions & (mode >> 6);
                    entry.permissions = kept as u16;
                    mode = (mode & !0o700) | (kept << 6);
                }
                TAG_OTHER => {
                    let kept = permissions & mode & 0o7;
                    entry.permissions = kept as u16;
                    mode = (mode & !0o7) | kept;
                }
                TAG_MASK => has_mask = true,
                _ => {}
            }
        }
        let group_tag = if has_mask { TAG_MASK } else { TAG_GROUP_OBJ };
        if let Some(entry) = self.entries.iter_mut().find(|e| e.tag == group_tag) {
            let kept = u32::from(entry.permissions) & ((mode >> 3) & 0o7);
            entry.permissions = kept as u16;
            mode = (mode & !0o70) | (kept << 3);
        }
        mode
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Acl {
        Acl {
            entries: entries
                .iter()
                .map(|&(tag, permissions, id)| AclEntry {
                    tag,
                    permissions,
                    id,
                })
                .collect(),
        }
    }

    // Goal: ACLs round-trip through the xattr format and malformed ones are refused.
    #[test]
    fn round_trip_and_validation() {
        let full = acl(&[
            (TAG_USER_OBJ, 7, 0),
            (TAG_USER, 6, 65534),
            (TAG_GROUP_OBJ, 5, 0),
            (TAG_MASK, 6, 0),
            (TAG_OTHER, 0, 0),
        ]);
        assert_eq!(Acl::decode(&full.encode()), Ok(full.clone()));
        assert_eq!(full.mode_bits(), 0o760);
        assert!(!full.is_equivalent_to_mode());
        assert!(Acl::decode(&[2, 0, 0, 0, 1]).is_err(), "truncated");
        assert!(
            Acl::decode(
                &acl(&[
                    (TAG_USER_OBJ, 7, 0),
                    (TAG_USER, 6, 1),
                    (TAG_GROUP_OBJ, 5, 0),
                    (TAG_OTHER, 0, 0)
                ])
                .encode()
            )
            .is_err(),
            "named entry without a mask"
        );
        assert!(
            Acl::decode(&acl(&[(TAG_USER_OBJ, 7, 0)]).encode()).is_err(),
            "missing base entries"
        );
    }

    // Goal: inheritance masks the default ACL with the requested mode, as Linux does.
    #[test]
    fn create_masq_follows_linux() {
        let mut inherited = acl(&[
            (TAG_USER_OBJ, 7, 0),
            (TAG_USER, 7, 65534),
            (TAG_GROUP_OBJ, 5, 0),
            (TAG_MASK, 7, 0),
            (TAG_OTHER, 5, 0),
        ]);
        let mode = inherited.create_masq(0o644);
        assert_eq!(mode, 0o644);
        assert_eq!(inherited.mode_bits(), 0o644);
        assert_eq!(
            inherited.entries[3].permissions, 4,
            "the mask takes the group bits of the mode"
        );
        assert_eq!(
            inherited.entries[1].permissions, 7,
            "named entries are limited by the mask, not rewritten"
        );
    }
}
