//! Golden bytes: the encoding of every message, fixed in `golden/messages.txt`.
//!
//! Every variant of every enum that crosses the wire is encoded here, with its nested
//! structures filled in, and the bytes compared with the ones recorded. A change of a tag, of
//! the order or type of a field, or of a nested structure shows as a difference: that is a
//! change of the protocol, which needs a new protocol version (docs/design/protocol.md,
//! "Versions"). Messages of the older version this build still speaks are recorded too.
//! After a deliberate change, `WEFT_BLESS=1 cargo test -p weft-proto --test golden` records
//! the new bytes; review the diff of the file like code.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use weft_mirror::pages::FileChange;
use weft_proto::access::{Caller, Capability, ClientRule, Subtree};
use weft_proto::codec::{encode_body_in, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN};
use weft_proto::ids::{GroupId, GroupVersion, MemberId};
use weft_proto::layout::{FileLayout, PatternKind, Slot, SlotSet, StripePattern};
use weft_proto::messages::*;
use weft_proto::{ClientId, ErrorCode, InodeId, NodeId, StoragePoolId, TargetId};

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/messages.txt");

fn inode(n: u64) -> InodeId {
    InodeId::new(NodeId(1), n)
}

fn drain_block() -> DrainBlock {
    DrainBlock {
        target: TargetId(3),
        files: 8,
        why: "no target".into(),
    }
}

fn capability() -> Capability {
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

fn mutation() -> MutationId {
    MutationId {
        client: ClientId(7),
        seq: 9,
        oldest_pending: 8,
    }
}

fn pattern() -> StripePattern {
    StripePattern {
        kind: PatternKind::Raid0,
        chunk_size_bytes: 1 << 19,
        num_targets: 2,
        pool: StoragePoolId(1),
    }
}

fn layout() -> FileLayout {
    FileLayout::new(
        StripePattern {
            kind: PatternKind::Mirrored,
            ..pattern()
        },
        vec![Slot::Group(GroupId(3)), Slot::Group(GroupId(4))],
    )
}

fn usage() -> SpaceUsage {
    SpaceUsage {
        total_bytes: 1000,
        free_bytes: 600,
        total_inodes: 50,
        free_inodes: 40,
    }
}

fn attr() -> InodeAttr {
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
        project: 42,
    }
}

fn new_inode(kind: FileKind) -> NewInode {
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

fn mirror_route() -> Option<MirrorRoute> {
    Some(MirrorRoute {
        group: GroupId(2),
        version: GroupVersion(3),
        forwarded: false,
    })
}

fn change_tag() -> Option<ChangeTag> {
    Some(ChangeTag {
        client: ClientId(7),
        number: 11,
        settled_below: 10,
        abandoned: vec![4],
    })
}

fn group() -> MirrorGroupInfo {
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

fn resync() -> ResyncProgress {
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

fn cluster_map() -> ClusterMap {
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

fn quota_key() -> weft_proto::quota::QuotaKey {
    weft_proto::quota::QuotaKey {
        kind: weft_proto::quota::QuotaKind::User,
        id: 65534,
        pool: StoragePoolId(2),
    }
}

fn quota_usage() -> weft_proto::quota::QuotaUsage {
    weft_proto::quota::QuotaUsage {
        kind: weft_proto::quota::QuotaKind::Project,
        id: 1001,
        pool: StoragePoolId(2),
        bytes: 1 << 40,
        inodes: 12_345,
    }
}

fn quota_rule() -> weft_proto::quota::QuotaRule {
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

fn pool() -> weft_proto::pools::PoolInfo {
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

fn lock() -> LockRange {
    LockRange {
        owner: 77,
        kind: LockKind::Write,
        start: 0,
        end: u64::MAX,
        pid: 1234,
    }
}

fn route() -> MetaRoute {
    MetaRoute {
        home: NodeId(1),
        version: GroupVersion(0),
    }
}

fn caller() -> Option<Caller> {
    Some(Caller {
        uid: 1000,
        gid: 100,
        groups: vec![10, 20],
    })
}

fn mgmt_requests() -> Vec<MgmtRequest> {
    vec![
        MgmtRequest::RegisterNode {
            node: Some(NodeId(2)),
            kind: NodeKind::Storage,
            alias: "storage-2".into(),
            addresses: vec!["10.0.0.2:8003".into()],
        },
        MgmtRequest::RegisterTarget {
            node: NodeId(2),
            target: None,
        },
        MgmtRequest::Heartbeat {
            kind: NodeKind::Storage,
            node: NodeId(2),
            targets: vec![TargetReport {
                target: TargetId(3),
                usage: usage(),
            }],
            meta_usage: None,
            meta_inodes_used: None,
            mirror: Some(MirrorHeartbeat {
                boot: 5,
                unsynced_boot: 4,
                interval_ms: 1000,
                resynced: vec![GroupMember {
                    group: GroupId(1),
                    version: GroupVersion(4),
                    member: MemberId(3),
                }],
                unreachable: vec![GroupMember {
                    group: GroupId(2),
                    version: GroupVersion(4),
                    member: MemberId(5),
                }],
                resyncs: vec![resync()],
            }),
            quota_usage: vec![(NodeId(1), vec![quota_usage()])],
            target_uses: vec![(NodeId(1), vec![(TargetId(3), 12)])],
            drain_blocked: vec![(NodeId(1), vec![drain_block()])],
        },
        MgmtRequest::RegisterClient {
            alias: "client-host".into(),
        },
        MgmtRequest::ClientHeartbeat {
            client: ClientId(7),
            unserved: vec![("ioctl".into(), 3)],
        },
        MgmtRequest::GetClusterMap,
        MgmtRequest::GetClusterStatus,
        MgmtRequest::CreateMirrorGroup {
            kind: MirrorKind::Storage,
            members: vec![MemberId(3), MemberId(4)],
        },
        MgmtRequest::GetResyncStats,
        MgmtRequest::AutoCreateMirrorGroups {
            kind: MirrorKind::Meta,
        },
        MgmtRequest::AcquireRenameLock {
            holder: NodeId(1),
            token: 99,
        },
        MgmtRequest::ReleaseRenameLock { token: 99 },
        MgmtRequest::SetClientRule {
            rule: ClientRule {
                name: "node17".into(),
                read_only: false,
                root_squash: true,
                revoked: false,
                subtree: Some(Subtree {
                    inode: inode(6),
                    path: "/projects/a".into(),
                }),
            },
        },
        MgmtRequest::RemoveClientRule {
            name: "node17".into(),
        },
        MgmtRequest::CreatePool {
            name: "fast".into(),
        },
        MgmtRequest::RemovePool {
            pool: StoragePoolId(2),
        },
        MgmtRequest::MovePoolTargets {
            targets: vec![TargetId(3), TargetId(4)],
            from: StoragePoolId(1),
            to: StoragePoolId(2),
        },
        MgmtRequest::SetPoolLimits {
            pool: StoragePoolId(2),
            low: pool().low,
            emergency: pool().emergency,
        },
        MgmtRequest::WatchClusterMap {
            after: 1_700_000_000_000_001,
            wait_ms: 10_000,
        },
        MgmtRequest::SetQuota { rule: quota_rule() },
        MgmtRequest::GetQuotas,
        MgmtRequest::GrantQuota {
            home: NodeId(2),
            key: quota_key(),
            bytes: 12 << 20,
            inodes: 64,
        },
        MgmtRequest::DrainTarget {
            target: TargetId(3),
            stop: false,
        },
        MgmtRequest::RemoveTarget {
            target: TargetId(3),
        },
        MgmtRequest::Raft {
            call: RaftCall::AppendEntries,
        },
        MgmtRequest::Raft {
            call: RaftCall::InstallSnapshot,
        },
    ]
}

fn meta_requests() -> Vec<MetaRequest> {
    vec![
        MetaRequest::Lookup {
            parent: inode(1),
            name: "a".into(),
        },
        MetaRequest::GetAttr { inode: inode(5) },
        MetaRequest::SetAttr {
            mutation: mutation(),
            inode: inode(5),
            changes: AttrChanges {
                mode: Some(0o600),
                uid: None,
                gid: Some(100),
                size: Some(10),
                atime: Some(TimeSet::Now),
                mtime: Some(TimeSet::At(Timestamp {
                    seconds: 9,
                    nanos: 1,
                })),
                project: None,
            },
            granted: Some(capability()),
        },
        MetaRequest::Create {
            mutation: mutation(),
            parent: inode(1),
            name: "f".into(),
            new: new_inode(FileKind::Regular),
            open: Some(3),
        },
        MetaRequest::CreateSpread {
            mutation: mutation(),
            parent: inode(1),
            name: "d".into(),
            new: new_inode(FileKind::Directory),
            shards: 4,
        },
        MetaRequest::Link {
            mutation: mutation(),
            inode: inode(5),
            new_parent: inode(1),
            new_name: "l".into(),
        },
        MetaRequest::Unlink {
            mutation: mutation(),
            parent: inode(1),
            name: "f".into(),
        },
        MetaRequest::Rmdir {
            mutation: mutation(),
            parent: inode(1),
            name: "d".into(),
        },
        MetaRequest::Rename {
            mutation: mutation(),
            parent: inode(1),
            name: "a".into(),
            new_parent: inode(2),
            new_name: "b".into(),
            flags: RenameFlags {
                no_replace: true,
                exchange: false,
            },
        },
        MetaRequest::ReadDir {
            dir: inode(1),
            shards: 1,
            after_cookie: 5,
            max_entries: 100,
        },
        MetaRequest::ReadLink { inode: inode(5) },
        MetaRequest::Open {
            client: ClientId(7),
            handle: 12,
            inode: inode(5),
            access: weft_proto::access::READ | weft_proto::access::WRITE,
            granted: Some(capability()),
        },
        MetaRequest::Release {
            client: ClientId(7),
            handles: vec![(inode(5), 12)],
        },
        MetaRequest::ApplyTruncate { inode: inode(5) },
        MetaRequest::Reserve {
            client: ClientId(7),
            handle: 3,
            inode: inode(5),
            to: 5 << 20,
        },
        MetaRequest::ReportSize {
            inode: inode(5),
            report: SizeReport {
                size: 4096,
                truncate_generation: 2,
                durable: true,
                modified: true,
                written: SlotSet::default(),
                allocated: 8192,
            },
            granted: Some(capability()),
        },
        MetaRequest::SetXattr {
            mutation: mutation(),
            inode: inode(5),
            name: "user.x".into(),
            value: vec![1, 2],
            mode: XattrSetMode::Create,
        },
        MetaRequest::GetXattr {
            inode: inode(5),
            name: "user.x".into(),
        },
        MetaRequest::ListXattr { inode: inode(5) },
        MetaRequest::RemoveXattr {
            mutation: mutation(),
            inode: inode(5),
            name: "user.x".into(),
        },
        MetaRequest::SetLock {
            client: ClientId(7),
            inode: inode(5),
            lock: lock(),
            wait_ms: 200,
            reclaim: false,
        },
        MetaRequest::GetLock {
            client: ClientId(7),
            inode: inode(5),
            lock: LockRange {
                kind: LockKind::Read,
                ..lock()
            },
        },
        MetaRequest::LockEpoch,
        MetaRequest::CreateDirInode {
            coordinator: NodeId(1),
            intent: 3,
            parent: inode(1),
            mode: 0o755,
            uid: 0,
            gid: 0,
            pattern: pattern(),
            acls: vec![("system.posix_acl_default".into(), vec![2, 0, 0, 0])],
            shard_of: Some(inode(2)),
            project: 42,
        },
        MetaRequest::SetShards {
            dir: inode(2),
            shards: vec![inode(2), inode(3)],
        },
        MetaRequest::SealShard {
            shard: inode(3),
            coordinator: NodeId(1),
            intent: 4,
            seal: true,
        },
        MetaRequest::SyncShard {
            shard: inode(3),
            mode: 0o700,
            uid: 1,
            gid: 2,
            pattern: pattern(),
            default_acl: None,
            default_spread: Some(b"4".to_vec()),
            project: 42,
        },
        MetaRequest::RemoveDirInode { inode: inode(3) },
        MetaRequest::RemoteReferences,
        MetaRequest::InsertDentry {
            coordinator: NodeId(1),
            intent: 5,
            parent: inode(1),
            name: "n".into(),
            child: inode(9),
            kind: FileKind::Symlink,
            no_replace: false,
            sealed_victim: None,
            project: 42,
        },
        MetaRequest::ExchangeDentry {
            coordinator: NodeId(1),
            intent: 6,
            parent: inode(1),
            name: "n".into(),
            expect: inode(9),
            child: inode(10),
            kind: FileKind::Fifo,
        },
        MetaRequest::Renamed {
            inode: inode(9),
            parent: inode(2),
        },
        MetaRequest::AdjustLinks {
            coordinator: NodeId(1),
            intent: 7,
            inode: inode(9),
            delta: -1,
        },
        MetaRequest::Check {
            repair: true,
            referenced: vec![inode(9)],
        },
        MetaRequest::SetPattern {
            mutation: mutation(),
            dir: inode(1),
            pattern: pattern(),
        },
        MetaRequest::ReplicaApply {
            group: GroupId(1),
            version: GroupVersion(2),
            link: 3,
            sequence: 4,
            changes: vec![
                FileChange::Write {
                    offset: 4096,
                    len: 10,
                },
                FileChange::SetLen(8192),
            ],
            sync: true,
        },
        MetaRequest::IntentsSettled {
            coordinator: NodeId(1),
            below: 8,
        },
        MetaRequest::CheckProgress,
        MetaRequest::QuotaUsage,
        MetaRequest::Migrate {
            inode: inode(5),
            pool: Some(weft_proto::ids::StoragePoolId(2)),
            targets: vec![TargetId(2), TargetId(4)],
            pattern: Some((1 << 20, 3)),
        },
        MetaRequest::ReadDirPlus {
            dir: inode(1),
            shards: 2,
            after_cookie: 5,
            max_entries: 100,
        },
    ]
}

fn storage_requests() -> Vec<StorageRequest> {
    vec![
        StorageRequest::Write {
            target: TargetId(3),
            mirror: mirror_route(),
            inode: inode(5),
            generation: 2,
            object_offset: 4096,
            tag: change_tag(),
            capability: Some(capability()),
            owner: Some((1001, 2002)),
            project: 42,
        },
        StorageRequest::Bench {
            op: StorageBenchOp::Start {
                targets: vec![TargetId(3)],
                read: false,
                block_bytes: 1 << 20,
                bytes_per_thread: 1 << 30,
                threads: 4,
            },
        },
        StorageRequest::NetBench {
            target: TargetId(3),
            read_len: 4096,
        },
        StorageRequest::Read {
            target: TargetId(3),
            mirror: None,
            inode: inode(5),
            generation: 2,
            object_offset: 0,
            len: 4096,
            capability: None,
        },
        StorageRequest::Truncate {
            target: TargetId(3),
            mirror: mirror_route(),
            inode: inode(5),
            length: 100,
            generation: 3,
        },
        StorageRequest::Remove {
            target: TargetId(3),
            mirror: None,
            inode: inode(5),
            tag: None,
        },
        StorageRequest::Sync {
            target: TargetId(3),
            mirror: mirror_route(),
            inode: inode(5),
            capability: Some(capability()),
        },
        StorageRequest::Fallocate {
            target: TargetId(3),
            mirror: None,
            inode: inode(5),
            generation: 2,
            object_offset: 0,
            len: 1 << 20,
            mode: FallocateMode::Zero,
            tag: change_tag(),
            capability: None,
            owner: Some((1000, 100)),
            project: 42,
        },
        StorageRequest::ListObjects {
            target: TargetId(3),
            mirrored: true,
            home: Some(NodeId(1)),
            after: 5,
            max: 1000,
        },
        StorageRequest::ObjectLength {
            target: TargetId(3),
            mirror: mirror_route(),
            inode: inode(5),
        },
        StorageRequest::ObjectChecksum {
            target: TargetId(3),
            mirrored: false,
            inode: inode(5),
            offset: 0,
            len: 4096,
        },
        StorageRequest::SyncTarget {
            target: TargetId(3),
            mirror: mirror_route(),
        },
        StorageRequest::CopyFrom {
            target: TargetId(3),
            inode: inode(6),
            generation: 2,
            object_offset: 1 << 20,
            source: (inode(5), 1),
            pieces: vec![weft_proto::messages::CopyPiece {
                target: TargetId(1),
                offset: 4096,
                len: 65536,
            }],
            tag: change_tag(),
            capability: Some(capability()),
            source_capability: Some(capability()),
            owner: Some((1000, 100)),
            project: 42,
        },
        StorageRequest::Seal {
            target: TargetId(2),
            mirror: Some(MirrorRoute {
                group: GroupId(3),
                version: GroupVersion(4),
                forwarded: true,
            }),
            inode: inode(5),
        },
        StorageRequest::Push {
            target: TargetId(1),
            inode: inode(5),
            to: TargetId(4),
            id: 0x1234_5678,
            seal: true,
            into: Some(weft_proto::messages::Restripe {
                slot: 1,
                from: layout(),
                to: FileLayout::new(
                    pattern(),
                    vec![Slot::Target(TargetId(7)), Slot::Target(TargetId(8))],
                ),
            }),
            group: Some(GroupId(4)),
        },
    ]
}

fn bench_ops() -> Vec<StorageBenchOp> {
    vec![
        StorageBenchOp::Start {
            targets: Vec::new(),
            read: true,
            block_bytes: 4096,
            bytes_per_thread: 1 << 20,
            threads: 1,
        },
        StorageBenchOp::Status,
        StorageBenchOp::Stop,
        StorageBenchOp::Cleanup,
    ]
}

fn meta_responses() -> Vec<MetaResponse> {
    vec![
        MetaResponse::Done,
        MetaResponse::Attr(attr()),
        MetaResponse::Created {
            attr: attr(),
            parent: None,
            capability: Some(capability()),
        },
        MetaResponse::DirEntries {
            entries: vec![DirEntry {
                name: "a".into(),
                inode: inode(5),
                kind: FileKind::Directory,
                cookie: 17,
            }],
            end: true,
        },
        MetaResponse::LinkTarget("../t".into()),
        MetaResponse::XattrValue(vec![9, 8]),
        MetaResponse::XattrNames(vec!["user.x".into()]),
        MetaResponse::CheckReport(CheckReport {
            node: NodeId(1),
            inodes: 10,
            dentries: 9,
            objects: 8,
            problems: vec!["p".into()],
            problem_count: 1,
            repairs: vec!["r".into()],
            unreachable_targets: vec![TargetId(4)],
        }),
        MetaResponse::LockConflict(Some(lock())),
        MetaResponse::LockEpoch(3),
        MetaResponse::Inodes(vec![inode(2), inode(3)]),
        MetaResponse::Unchanged,
        MetaResponse::CheckProgress(CheckProgress {
            running: true,
            phase: "objects".into(),
            done: 1,
            total: 2,
        }),
        MetaResponse::Opened {
            attr: attr(),
            capability: capability(),
        },
        MetaResponse::QuotaUsage(vec![quota_usage()]),
        MetaResponse::Migration {
            moving: 2,
            done: false,
        },
        MetaResponse::Reserved {
            to: 9 << 20,
            capability: Some(capability()),
        },
        MetaResponse::DirEntriesPlus {
            entries: vec![
                DirEntryPlus {
                    entry: DirEntry {
                        name: "f".into(),
                        inode: inode(6),
                        kind: FileKind::Regular,
                        cookie: 18,
                    },
                    attr: Some(attr()),
                },
                DirEntryPlus {
                    entry: DirEntry {
                        name: "elsewhere".into(),
                        inode: InodeId::new(NodeId(2), 7),
                        kind: FileKind::Directory,
                        cookie: 19,
                    },
                    attr: None,
                },
            ],
            end: false,
        },
    ]
}

fn mgmt_responses() -> Vec<MgmtResponse> {
    vec![
        MgmtResponse::Done,
        MgmtResponse::NodeRegistered { node: NodeId(2) },
        MgmtResponse::TargetRegistered {
            target: TargetId(3),
        },
        MgmtResponse::ClientRegistered {
            client: ClientId(7),
            session_timeout_ms: 30_000,
        },
        MgmtResponse::ClusterMap(cluster_map()),
        MgmtResponse::ClusterStatus(ClusterStatus {
            unix_ms: 1,
            sample_interval_ms: 2,
            totals: ClusterTotals {
                nodes: 3,
                nodes_online: 3,
                targets: 4,
                targets_online: 4,
                client_sessions: 1,
                capacity_bytes: 1000,
                free_bytes: 600,
                inodes: 10,
                now: ClusterSample {
                    unix_ms: 1,
                    read_bytes_per_second: 2,
                    written_bytes_per_second: 3,
                    meta_ops_per_second: 4,
                },
            },
            nodes: vec![NodeStatus {
                id: NodeId(1),
                kind: NodeKind::Management,
                alias: "mgmt".into(),
                addresses: vec!["10.0.0.1:8008".into()],
                reachability: Reachability::Offline,
                uptime_ms: 5,
                requests_per_second: 6,
                received_bytes_per_second: 7,
                sent_bytes_per_second: 8,
                in_flight: 9,
                meta_usage: None,
                meta_inodes: Some(1),
            }],
            targets: vec![TargetStatus {
                id: TargetId(3),
                node: NodeId(2),
                pool: StoragePoolId(1),
                reachability: Reachability::Online,
                consistency: "good".into(),
                usage: usage(),
                read_bytes_per_second: 1,
                written_bytes_per_second: 2,
                operations_per_second: 3,
                queue_depth: 4,
                drain_left: Some(12),
                drain_blocked: Some(drain_block()),
            }],
            clients: vec![ClientStatus {
                client: ClientId(7),
                requests_per_second: 1,
                written_bytes_per_second: 2,
                read_bytes_per_second: 3,
            }],
            history: vec![ClusterSample::default()],
            events: vec![ClusterEvent {
                unix_ms: 1,
                level: "info".into(),
                message: "m".into(),
            }],
            quotas: Vec::new(),
        }),
        MgmtResponse::MirrorGroups(vec![group()]),
        MgmtResponse::ResyncStats(vec![resync()]),
        MgmtResponse::HeartbeatAck {
            lease_ms: 3000,
            mirror_groups: vec![MirrorGroupInfo {
                kind: MirrorKind::Meta,
                ..group()
            }],
            unix_ms: 1_800_000_000_000,
        },
        MgmtResponse::Pool(pool()),
        MgmtResponse::Quotas(vec![weft_proto::quota::QuotaState {
            rule: quota_rule(),
            bytes: 3 << 30,
            inodes: 1500,
            bytes_grace_ends: None,
            inodes_grace_ends: Some(1_800_000_000),
            bytes_blocked: true,
            inodes_blocked: false,
        }]),
        MgmtResponse::Raft,
        MgmtResponse::QuotaGranted {
            bytes: 12 << 20,
            inodes: 64,
        },
    ]
}

fn storage_responses() -> Vec<StorageResponse> {
    vec![
        StorageResponse::Done,
        StorageResponse::Written {
            len: 4096,
            verifier: 33,
        },
        StorageResponse::Synced { verifier: 33 },
        StorageResponse::Data,
        StorageResponse::Length(100),
        StorageResponse::Objects {
            objects: vec![(inode(5), 4096)],
            end: false,
        },
        StorageResponse::StorageBench(StorageBenchStatus {
            running: true,
            read: false,
            targets: vec![TargetBenchResult {
                target: TargetId(3),
                bytes: 100,
                elapsed_micros: 200,
                finished: false,
                error: Some("e".into()),
            }],
        }),
        StorageResponse::Checksum {
            length: 4096,
            crc: 0xDEAD_BEEF,
        },
        StorageResponse::Pushed { copied: 1 << 20 },
    ]
}

fn stats_responses() -> Vec<StatsResponse> {
    vec![StatsResponse::Stats(NodeStats {
        uptime_ms: 1,
        requests: 2,
        errors: 3,
        received_bytes: 4,
        sent_bytes: 5,
        in_flight: 6,
        ops: vec![("create".into(), 7)],
        clients: vec![ClientStats {
            client: ClientId(7),
            requests: 8,
            received_bytes: 9,
            sent_bytes: 10,
        }],
        targets: vec![TargetStats {
            target: TargetId(3),
            operations: 11,
            read_bytes: 12,
            written_bytes: 13,
            queue_depth: 14,
            usage: usage(),
        }],
    })]
}

fn requests() -> Vec<Request> {
    vec![
        Request::Mgmt(MgmtRequest::GetClusterMap),
        Request::Meta(route(), MetaRequest::GetAttr { inode: inode(5) }, caller()),
        Request::Meta(route(), MetaRequest::LockEpoch, None),
        Request::Storage(StorageRequest::Sync {
            target: TargetId(3),
            mirror: None,
            inode: inode(5),
            capability: None,
        }),
        Request::Stats,
    ]
}

/// Each response of every service, as its tag and its encoding in a reply.
fn response_encodings() -> Vec<(u32, Result<Vec<u8>, String>)> {
    fn encoded<R: serde::Serialize>(
        responses: Vec<R>,
        tag: fn(&R) -> u32,
    ) -> Vec<(u32, Result<Vec<u8>, String>)> {
        responses
            .into_iter()
            .map(|response| {
                let tag = tag(&response);
                let reply: Reply<R> = Ok(response);
                (tag, encode_body_in(PROTOCOL_VERSION, &reply))
            })
            .collect()
    }
    let mut all = encoded(meta_responses(), MetaResponse::wire_tag);
    all.extend(encoded(mgmt_responses(), MgmtResponse::wire_tag));
    all.extend(encoded(storage_responses(), StorageResponse::wire_tag));
    all.extend(encoded(stats_responses(), StatsResponse::wire_tag));
    all
}

/// Each of `responses`, in a reply, decodes back to itself.
fn round_trips<R>(responses: Vec<R>)
where
    R: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    for response in responses {
        let reply: Reply<R> = Ok(response);
        let bytes = weft_proto::codec::encode_body(&reply);
        assert_eq!(
            weft_proto::codec::decode_body::<Reply<R>>(&bytes).as_ref(),
            Ok(&reply)
        );
    }
}

/// Every tag of `all` is the tag of one of `samples`.
fn covers(what: &str, all: &[(u32, &str)], samples: impl IntoIterator<Item = u32>) {
    let seen: BTreeSet<u32> = samples.into_iter().collect();
    let missing: Vec<&str> = all
        .iter()
        .filter(|(tag, _)| !seen.contains(tag))
        .map(|(_, name)| *name)
        .collect();
    assert!(missing.is_empty(), "{what}: no sample of {missing:?}");
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// `name version hex` lines of every sample.
fn encodings() -> String {
    let mut out = String::new();
    let mut line = |name: String, version: u16, bytes: Result<Vec<u8>, String>| {
        let bytes = bytes.unwrap_or_else(|error| panic!("{name} in version {version}: {error}"));
        writeln!(out, "{name} {version} {}", hex(&bytes)).expect("write to a string");
    };
    for request in mgmt_requests() {
        let name = format!("MgmtRequest::{}", <&str>::from(&request));
        line(
            name,
            PROTOCOL_VERSION,
            encode_body_in(PROTOCOL_VERSION, &request),
        );
    }
    for request in meta_requests() {
        let name = format!("MetaRequest::{}", <&str>::from(&request));
        line(
            name,
            PROTOCOL_VERSION,
            encode_body_in(PROTOCOL_VERSION, &request),
        );
    }
    for request in storage_requests() {
        let name = format!("StorageRequest::{}", <&str>::from(&request));
        line(
            name,
            PROTOCOL_VERSION,
            encode_body_in(PROTOCOL_VERSION, &request),
        );
    }
    for (index, op) in bench_ops().into_iter().enumerate() {
        let name = format!("StorageBenchOp#{index}");
        line(
            name,
            PROTOCOL_VERSION,
            encode_body_in(PROTOCOL_VERSION, &op),
        );
    }
    // The services' responses kept the tags they had in one enum: listed by tag, a tag that
    // several services answer (`Done`) once, after checking that they encode alike.
    let mut responses: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    for (tag, bytes) in response_encodings() {
        let bytes = bytes.unwrap_or_else(|error| panic!("response {tag}: {error}"));
        if let Some(earlier) = responses.insert(tag, bytes.clone()) {
            assert_eq!(earlier, bytes, "responses of tag {tag} encode differently");
        }
    }
    for (tag, bytes) in responses {
        line(format!("Response#{tag}"), PROTOCOL_VERSION, Ok(bytes));
    }
    let error: Reply<MetaResponse> =
        Err(weft_proto::error::WireError::new(ErrorCode::ReadOnly, "ro"));
    line(
        "Reply::Err".into(),
        PROTOCOL_VERSION,
        encode_body_in(PROTOCOL_VERSION, &error),
    );
    for request in requests() {
        let name = format!("Request::{}", request.op_name());
        line(
            name,
            PROTOCOL_VERSION,
            encode_body_in(PROTOCOL_VERSION, &request),
        );
    }
    // What a peer of the older version sends and is sent: the same messages without what
    // version 5 added.
    let older = PROTOCOL_VERSION_MIN;
    for request in requests() {
        let name = format!("Request::{}", request.op_name());
        line(name, older, encode_body_in(older, &request));
    }
    let open = &meta_requests()[11];
    line(
        "MetaRequest::open".into(),
        older,
        encode_body_in(older, open),
    );
    let map: Reply<MgmtResponse> = Ok(MgmtResponse::ClusterMap(cluster_map()));
    line(
        "Response::ClusterMap".into(),
        older,
        encode_body_in(older, &map),
    );
    out
}

// Goal: every variant of every message enum has a sample, so no message escapes the golden
// bytes.
#[test]
fn every_variant_has_a_sample() {
    covers(
        "MgmtRequest",
        MgmtRequest::WIRE_TAGS,
        mgmt_requests().iter().map(MgmtRequest::wire_tag),
    );
    covers(
        "MetaRequest",
        MetaRequest::WIRE_TAGS,
        meta_requests().iter().map(MetaRequest::wire_tag),
    );
    covers(
        "StorageRequest",
        StorageRequest::WIRE_TAGS,
        storage_requests().iter().map(StorageRequest::wire_tag),
    );
    covers(
        "StorageBenchOp",
        StorageBenchOp::WIRE_TAGS,
        bench_ops().iter().map(StorageBenchOp::wire_tag),
    );
    covers(
        "MetaResponse",
        MetaResponse::WIRE_TAGS,
        meta_responses().iter().map(MetaResponse::wire_tag),
    );
    covers(
        "MgmtResponse",
        MgmtResponse::WIRE_TAGS,
        mgmt_responses().iter().map(MgmtResponse::wire_tag),
    );
    covers(
        "StorageResponse",
        StorageResponse::WIRE_TAGS,
        storage_responses().iter().map(StorageResponse::wire_tag),
    );
    covers(
        "StatsResponse",
        StatsResponse::WIRE_TAGS,
        stats_responses().iter().map(StatsResponse::wire_tag),
    );
    covers(
        "Request",
        Request::WIRE_TAGS,
        requests().iter().map(Request::wire_tag),
    );
    let kinds = [
        FileKind::Regular,
        FileKind::Directory,
        FileKind::Symlink,
        FileKind::Fifo,
        FileKind::Socket,
        FileKind::CharDevice,
        FileKind::BlockDevice,
    ];
    covers(
        "FileKind",
        FileKind::WIRE_TAGS,
        kinds.iter().map(FileKind::wire_tag),
    );
}

// Goal: the bytes of every message are the ones recorded; a change of any of them is a
// change of the protocol and shows here. Every message also decodes back to itself.
#[test]
fn messages_keep_their_bytes() {
    for request in requests() {
        let bytes = weft_proto::codec::encode_body(&request);
        assert_eq!(
            weft_proto::codec::decode_body::<Request>(&bytes).as_ref(),
            Ok(&request)
        );
    }
    round_trips(meta_responses());
    round_trips(mgmt_responses());
    round_trips(storage_responses());
    round_trips(stats_responses());
    let now = encodings();
    if std::env::var_os("WEFT_BLESS").is_some() {
        std::fs::write(GOLDEN, &now).expect("write the golden file");
        return;
    }
    let recorded = std::fs::read_to_string(GOLDEN).expect("the golden file");
    for (now, recorded) in now.lines().zip(recorded.lines()) {
        assert_eq!(
            now, recorded,
            "an encoding changed (a protocol change: see the top of this file)"
        );
    }
    assert_eq!(
        now.lines().count(),
        recorded.lines().count(),
        "messages added or removed"
    );
}

// Goal: a message of the older version decodes into this version's type, with what version
// 5 added at its default, and what the older version cannot say is refused for it, not
// dropped: a project's quota, a setattr that gives a project.
#[test]
fn the_older_version_decodes_and_is_spoken() {
    let older = PROTOCOL_VERSION_MIN;
    fn in_older<R: serde::Serialize + serde::de::DeserializeOwned>(reply: &Reply<R>) -> Reply<R> {
        let older = PROTOCOL_VERSION_MIN;
        let bytes = encode_body_in(older, reply).expect("encodes for version 4");
        weft_proto::codec::decode_body_in::<Reply<R>>(older, &bytes).expect("decodes")
    }
    let decode_older = in_older::<MgmtResponse>;
    // The hard limits came in version 9: a peer of version 4 (or 8) goes without them, and
    // enforces the blocked list only.
    let map: Reply<MgmtResponse> = Ok(MgmtResponse::ClusterMap(ClusterMap {
        quota_hard: Vec::new(),
        ..cluster_map()
    }));
    assert_eq!(
        decode_older(&Ok(MgmtResponse::ClusterMap(cluster_map()))),
        map,
        "the map did not change in version 5 but for the hard limits of version 9"
    );
    let Ok(MetaResponse::Attr(decoded)) = in_older(&Ok(MetaResponse::Attr(attr()))) else {
        panic!("attributes")
    };
    assert_eq!(
        decoded,
        InodeAttr {
            project: 0,
            ..attr()
        },
        "a peer of version 4 gets attributes without the project"
    );
    let write = &storage_requests()[0];
    let bytes = encode_body_in(older, write).expect("a write encodes for version 4");
    let decoded: StorageRequest =
        weft_proto::codec::decode_body_in(older, &bytes).expect("decodes");
    let StorageRequest::Write { project, owner, .. } = decoded else {
        panic!("a write")
    };
    assert_eq!(
        (project, owner),
        (0, Some((1001, 2002))),
        "a server of version 4 checks the owner's quotas, not the project's"
    );
    // A project's rows are left out for it, and what it is sent goes on without them.
    let user_usage = weft_proto::quota::QuotaUsage {
        kind: weft_proto::quota::QuotaKind::User,
        ..quota_usage()
    };
    let usage: Reply<MetaResponse> = Ok(MetaResponse::QuotaUsage(vec![quota_usage(), user_usage]));
    assert_eq!(
        in_older(&usage),
        Ok(MetaResponse::QuotaUsage(vec![user_usage])),
        "a project's usage is not sent to a peer of version 4"
    );
    let mut blocked = cluster_map();
    blocked.quota_blocked.push(weft_proto::quota::QuotaBlock {
        kind: weft_proto::quota::QuotaKind::Project,
        ..blocked.quota_blocked[0]
    });
    assert_eq!(
        decode_older(&Ok(MgmtResponse::ClusterMap(blocked))),
        map,
        "a peer of version 4 gets the map without the blocked projects"
    );
    let project_rule = MgmtRequest::SetQuota {
        rule: weft_proto::quota::QuotaRule {
            kind: weft_proto::quota::QuotaKind::Project,
            ..quota_rule()
        },
    };
    assert!(encode_body_in(older, &project_rule)
        .is_err_and(|error| error.contains("needs protocol version 5")));
    let set_project = MetaRequest::SetAttr {
        mutation: mutation(),
        inode: inode(5),
        changes: AttrChanges {
            project: Some(42),
            ..AttrChanges::default()
        },
        granted: None,
    };
    assert!(
        encode_body_in(older, &set_project)
            .is_err_and(|error| error.contains("protocol version 5")),
        "a setattr that gives a project is refused for a server that would drop it"
    );
    let seal = storage_requests()
        .into_iter()
        .find(|request| matches!(request, StorageRequest::Seal { .. }))
        .expect("a seal");
    assert!(
        encode_body_in(5, &seal).is_err_and(|error| error.contains("protocol version 6")),
        "a seal is refused for a member of version 5, which could not seal"
    );
    let mirrored_push = storage_requests()
        .into_iter()
        .find(|request| matches!(request, StorageRequest::Push { .. }))
        .expect("a push");
    assert!(
        encode_body_in(5, &mirrored_push).is_err_and(|error| error.contains("protocol version 6")),
        "a mirrored object's push is refused for a primary of version 5, which would push nothing"
    );
    assert!(
        encode_body_in(
            6,
            &MgmtRequest::Raft {
                call: RaftCall::Vote
            }
        )
        .is_err_and(|error| error.contains("protocol version 7")),
        "replication is refused for a management server of version 6, which does not replicate"
    );
    let chmod = &meta_requests()[2];
    let bytes = encode_body_in(older, chmod).expect("a setattr without a project encodes");
    let decoded: MetaRequest = weft_proto::codec::decode_body_in(older, &bytes).expect("decodes");
    // The capability of the descriptor it went through is left out for an older server,
    // which judges the caller by the mode alone.
    let MetaRequest::SetAttr {
        mutation,
        inode,
        changes,
        granted,
    } = chmod.clone()
    else {
        panic!("the third request is a setattr");
    };
    assert!(granted.is_some());
    let without = MetaRequest::SetAttr {
        mutation,
        inode,
        changes,
        granted: None,
    };
    assert_eq!(decoded, without);
}
