//! A sample of every response variant of every service.

use super::*;

pub(crate) fn meta_responses() -> Vec<MetaResponse> {
    vec![
        MetaResponse::Done,
        MetaResponse::Attr(attr()),
        MetaResponse::Created {
            attr: attr(),
            parent: None,
            capability: Some(capability()),
            lease_ms: 250,
            parent_lease_ms: 250,
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
        MetaResponse::Removed {
            parent: Some(attr()),
        },
        MetaResponse::Numbered {
            reply: Box::new(MetaResponse::Removed { parent: None }),
            change: numbered_change(),
            synced: 16,
        },
        MetaResponse::Synced(17),
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

pub(crate) fn mgmt_responses() -> Vec<MgmtResponse> {
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

pub(crate) fn storage_responses() -> Vec<StorageResponse> {
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

pub(crate) fn stats_responses() -> Vec<StatsResponse> {
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
