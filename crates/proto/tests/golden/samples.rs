//! The values the samples of messages are made of.

use super::*;

pub(crate) fn inode(n: u64) -> InodeId {
    InodeId::new(NodeId(1), n)
}

pub(crate) fn drain_block() -> DrainBlock {
    DrainBlock {
        target: TargetId(3),
        files: 8,
        why: "no target".into(),
    }
}

pub(crate) fn capability() -> Capability {
    Capability {
        session: ClientId(7),
        access: 6,
        expires: 1_800_000_000,
        proof: [0xab; 32],
        growth: Some(weft_proto::access::GrowthBound {
            uid: 65534,
            gid: 65534,
            project: 9,
            object_end: 3 << 20,
            proof: [0xcd; 32],
        }),
    }
}

pub(crate) fn numbered_change() -> NumberedChange {
    NumberedChange {
        incarnation: 1_700_000_000,
        number: 17,
        mutation: mutation(),
        rows: vec![1, 2, 3],
        proof: vec![4; 32],
    }
}

pub(crate) fn mutation() -> MutationId {
    MutationId {
        client: ClientId(7),
        seq: 9,
        oldest_pending: 8,
    }
}

pub(crate) fn pattern() -> StripePattern {
    StripePattern {
        kind: PatternKind::Raid0,
        chunk_size_bytes: 1 << 19,
        num_targets: 2,
        pool: StoragePoolId(1),
    }
}

pub(crate) fn layout() -> FileLayout {
    FileLayout::new(
        StripePattern {
            kind: PatternKind::Mirrored,
            ..pattern()
        },
        vec![Slot::Group(GroupId(3)), Slot::Group(GroupId(4))],
    )
}

pub(crate) fn usage() -> SpaceUsage {
    SpaceUsage {
        total_bytes: 1000,
        free_bytes: 600,
        total_inodes: 50,
        free_inodes: 40,
    }
}

pub(crate) fn attr() -> InodeAttr {
    InodeAttr {
        inode: inode(5),
        kind: FileKind::Regular,
        mode: 0o644,
        nlink: 1,
        uid: 1000,
        gid: 100,
        size: 4096,
        rdev: 0,
        atime: Timestamp {
            seconds: 1,
            nanos: 2,
        },
        mtime: Timestamp {
            seconds: 3,
            nanos: 4,
        },
        ctime: Timestamp {
            seconds: -5,
            nanos: 6,
        },
        truncate_generation: 2,
        layout: Some(layout()),
        pattern: Some(pattern()),
        parent: inode(1),
        shards: vec![inode(6)],
        xattr_free: true,
        project: 42,
    }
}

pub(crate) fn new_inode(kind: FileKind) -> NewInode {
    NewInode {
        kind,
        mode: 0o755,
        uid: 1000,
        gid: 100,
        umask: 0o022,
        rdev: 0,
        symlink: Some("target".into()),
    }
}

pub(crate) fn mirror_route() -> Option<MirrorRoute> {
    Some(MirrorRoute {
        group: GroupId(2),
        version: GroupVersion(3),
        forwarded: false,
    })
}

pub(crate) fn change_tag() -> Option<ChangeTag> {
    Some(ChangeTag {
        client: ClientId(7),
        number: 11,
        settled_below: 10,
        abandoned: vec![4],
    })
}

pub(crate) fn group() -> MirrorGroupInfo {
    MirrorGroupInfo {
        id: GroupId(1),
        kind: MirrorKind::Storage,
        version: GroupVersion(4),
        primary: MemberId(3),
        members: vec![
            MirrorMember {
                id: MemberId(3),
                node: NodeId(1),
                state: Consistency::Good,
                full_resync: false,
            },
            MirrorMember {
                id: MemberId(4),
                node: NodeId(2),
                state: Consistency::NeedsResync,
                full_resync: true,
            },
        ],
        loss_epoch: 1,
    }
}

pub(crate) fn resync() -> ResyncProgress {
    ResyncProgress {
        kind: MirrorKind::Meta,
        group: GroupId(1),
        member: MemberId(2),
        version: GroupVersion(3),
        objects_total: 4,
        objects_copied: 5,
        bytes_copied: 6,
        elapsed_ms: 7,
        done: false,
        full: true,
    }
}

pub(crate) fn cluster_map() -> ClusterMap {
    ClusterMap {
        nodes: vec![NodeInfo {
            id: NodeId(1),
            kind: NodeKind::Meta,
            alias: "meta-1".into(),
            addresses: vec!["10.0.0.1:8010".into()],
            reachability: Reachability::Online,
            meta_usage: Some(usage()),
            meta_inodes_used: Some(3),
        }],
        targets: vec![TargetInfo {
            id: TargetId(3),
            node: NodeId(2),
            pool: StoragePoolId(1),
            reachability: Reachability::ProbablyOffline,
            usage: usage(),
            draining: true,
        }],
        live_sessions: vec![ClientId(7)],
        mirror_groups: vec![group()],
        clients: vec![ClientRule {
            name: "node17".into(),
            read_only: true,
            root_squash: false,
            revoked: false,
            subtree: None,
        }],
        session_owners: vec![(ClientId(7), "node17".into())],
        pools: vec![pool()],
        epoch: 1_700_000_000_000_001,
        quota_blocked: vec![weft_proto::quota::QuotaBlock {
            kind: weft_proto::quota::QuotaKind::User,
            id: 1001,
            pool: StoragePoolId(2),
            bytes: true,
            inodes: false,
        }],
        quota_hard: vec![weft_proto::quota::QuotaHard {
            key: quota_key(),
            bytes: 8 << 20,
            inodes: 1000,
        }],
    }
}

pub(crate) fn quota_key() -> weft_proto::quota::QuotaKey {
    weft_proto::quota::QuotaKey {
        kind: weft_proto::quota::QuotaKind::User,
        id: 65534,
        pool: StoragePoolId(2),
    }
}

pub(crate) fn quota_usage() -> weft_proto::quota::QuotaUsage {
    weft_proto::quota::QuotaUsage {
        kind: weft_proto::quota::QuotaKind::Project,
        id: 1001,
        pool: StoragePoolId(2),
        bytes: 1 << 40,
        inodes: 12_345,
    }
}

pub(crate) fn quota_rule() -> weft_proto::quota::QuotaRule {
    weft_proto::quota::QuotaRule {
        kind: weft_proto::quota::QuotaKind::User,
        id: 1001,
        pool: StoragePoolId(2),
        limits: weft_proto::quota::QuotaLimits {
            soft_bytes: 1 << 30,
            hard_bytes: 2 << 30,
            soft_inodes: 1000,
            hard_inodes: 2000,
        },
    }
}

pub(crate) fn pool() -> weft_proto::pools::PoolInfo {
    weft_proto::pools::PoolInfo {
        id: StoragePoolId(2),
        name: "fast".into(),
        low: weft_proto::pools::CapacityLimits {
            free_bytes: 1 << 30,
            free_inodes: 1000,
        },
        emergency: weft_proto::pools::CapacityLimits {
            free_bytes: 1 << 20,
            free_inodes: 10,
        },
    }
}

pub(crate) fn lock() -> LockRange {
    LockRange {
        owner: 77,
        kind: LockKind::Write,
        start: 0,
        end: u64::MAX,
        pid: 1234,
    }
}

pub(crate) fn route() -> MetaRoute {
    MetaRoute {
        home: NodeId(1),
        version: GroupVersion(0),
    }
}

pub(crate) fn caller() -> Option<Caller> {
    Some(Caller {
        uid: 1000,
        gid: 100,
        groups: vec![10, 20],
    })
}
