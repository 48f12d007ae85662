//! A sample of every request variant of every service.

use super::*;

pub(crate) fn mgmt_requests() -> Vec<MgmtRequest> {
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

pub(crate) fn meta_requests() -> Vec<MetaRequest> {
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
            client: Some(ClientId(9)),
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
        MetaRequest::SyncHome {
            incarnation: 1_700_000_000,
            number: 17,
        },
        MetaRequest::Replay {
            client: ClientId(9),
            changes: vec![numbered_change()],
            done: true,
        },
    ]
}

pub(crate) fn storage_requests() -> Vec<StorageRequest> {
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
        StorageRequest::RemoveObjects {
            target: TargetId(3),
            mirror: mirror_route(),
            inodes: vec![inode(5), inode(6)],
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

pub(crate) fn bench_ops() -> Vec<StorageBenchOp> {
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
