//! Restricted clients speaking the protocol directly: re-sent creates, confined subtrees, locks,
//! capabilities, grants, sessions.

use super::*;

// Goal: a create sent again with an old mutation id is answered from its stored reply, but
// is granted access to the file only while the file still allows it: once a member gave the
// file to another user (chown, chmod 600), a squashed client that re-sends the create gets
// the reply without a capability, so it cannot read or write the file through it. Method: a
// cluster of real processes; a root-squashed client key; raw metadata requests through the
// protocol in the client's own session.
#[test]
fn a_create_sent_again_is_not_granted_what_the_file_no_longer_allows() {
    use std::os::unix::fs::MetadataExt;
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    fs::create_dir(mnt.join("shared")).expect("mkdir");
    fs::set_permissions(mnt.join("shared"), fs::Permissions::from_mode(0o777)).expect("chmod");
    let shared = weft_proto::ids::InodeId(fs::metadata(mnt.join("shared")).expect("stat").ino());
    let scratch = tempfile::tempdir().expect("tempdir");
    let key = restricted_key(&cluster, scratch.path(), "squashed", &["--root-squash"]);

    let runtime = common::runtime();
    let native = common::keyed_client(&runtime, &cluster, &key);
    let meta = meta_as(&runtime, &cluster, &key, shared.home());
    let mutation = weft_proto::messages::MutationId {
        client: native.id(),
        seq: 1 << 40,
        oldest_pending: 1,
    };
    let create = || {
        meta.create(
            mutation,
            shared,
            "given-away",
            weft_client::client::regular_file(0o644, 0, (0, 0)),
            Some(1 << 40),
        )
    };
    // The metadata server squashes the client (and grants capabilities) once its map has
    // the rule: probe with creates of their own.
    let probe = std::sync::atomic::AtomicU64::new(1 << 39);
    wait_until("the metadata server to apply the squash", || {
        let seq = probe.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let probe_mutation = weft_proto::messages::MutationId { seq, ..mutation };
        let name = format!("probe-{seq}");
        runtime
            .block_on(common::once_settled(|| {
                meta.create(
                    probe_mutation,
                    shared,
                    &name,
                    weft_client::client::regular_file(0o644, 0, (0, 0)),
                    Some(seq),
                )
            }))
            .is_ok_and(|created| created.capability.is_some())
    })
    .expect("the rule applies");
    let first = runtime
        .block_on(common::once_settled(create))
        .expect("the create runs");
    assert!(
        first.capability.is_some(),
        "a new file's creator may use it"
    );
    assert_eq!(first.attr.uid, weft_proto::access::NOBODY);

    // A member gives the file to user 1000 alone.
    let path = mnt.join("shared/given-away");
    std::os::unix::fs::chown(&path, Some(1000), Some(1000)).expect("chown");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");

    let again = runtime
        .block_on(common::once_settled(create))
        .expect("the create sent again is answered");
    assert_eq!(again.attr.inode, first.attr.inode, "the stored reply");
    assert!(
        again.capability.is_none(),
        "no access granted to a file that is another user's now"
    );
    drop(native);
}

// Goal: a client confined to a subtree, without root squash, cannot take its files out of
// what holds them: it may not change a file's project (a project quota) nor a directory's
// storage pool (a pool its members keep it out of), while it may still change the stripe
// width in its pool. Method: a cluster of real processes, a pool `fast`, a subtree-confined
// client key, the native library.
#[test]
fn a_confined_client_cannot_change_projects_or_pools() {
    use weft_proto::ErrorCode;
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let (ok, out, err) = weft(
        &cluster,
        &[
            "pool",
            "create",
            "fast",
            "--targets",
            "2,4",
            "--mgmt",
            cluster.mgmt(),
        ],
    );
    assert!(ok, "pool create: {out}{err}");
    let jail = mnt.join("jail");
    fs::create_dir(&jail).expect("mkdir");
    fs::write(jail.join("file"), b"confined").expect("write");
    let scratch = tempfile::tempdir().expect("tempdir");
    let key = restricted_key(
        &cluster,
        scratch.path(),
        "confined",
        &["--subtree", jail.to_str().expect("utf-8")],
    );
    let runtime = common::runtime();
    let native = common::keyed_client(&runtime, &cluster, &key);
    let root = native.root();
    let file = runtime
        .block_on(native.lookup(root, "file"))
        .expect("lookup")
        .inode;
    let map = runtime.block_on(native.cluster_map()).expect("map");
    let fast = map
        .all_pools()
        .into_iter()
        .find(|pool| pool.name == "fast")
        .expect("pool fast")
        .id;
    let set_project = || {
        runtime.block_on(native.set_attr(
            file,
            weft_proto::messages::AttrChanges {
                project: Some(42),
                ..Default::default()
            },
        ))
    };
    wait_until("the metadata server to confine the client", || {
        set_project().is_err_and(|error| error.code() == ErrorCode::NotPermitted)
    })
    .expect("a confined client may not change a project");
    let pattern = runtime
        .block_on(native.get_attr(root))
        .expect("stat")
        .pattern
        .unwrap_or(weft_proto::layout::StripePattern::DEFAULT);
    let into_fast = weft_proto::layout::StripePattern {
        pool: fast,
        ..pattern
    };
    assert_eq!(
        runtime
            .block_on(native.set_pattern(root, into_fast))
            .expect_err("a confined client may not change its pool")
            .code(),
        ErrorCode::NotPermitted
    );
    let narrower = weft_proto::layout::StripePattern {
        num_targets: 1,
        ..pattern
    };
    runtime
        .block_on(native.set_pattern(root, narrower))
        .expect("the width in its own pool is its own to change");
    let (ok, info, err) = weft(
        &cluster,
        &[
            "entry",
            "info",
            jail.join("file").to_str().expect("utf-8"),
            "--mgmt",
            cluster.mgmt(),
        ],
    );
    assert!(ok, "{err}");
    assert!(
        !info.contains("project: 42") && !info.contains("Project: 42"),
        "{info}"
    );
    drop(native);
}

// Goal: a restricted client's locks are held to what its session has open and bounded: a
// read-only client cannot hold an exclusive lock on another user's file (it would keep that
// file's writers waiting), a restricted client cannot lock a file it has not opened (or an
// inode number it made up) nor open one for nothing, and no session can split its locks of
// one file into more ranges than the bound, under any owners; shared locks of a file it opened
// work. Method: a cluster of real
// processes, a read-only client key, lock requests through the protocol in its own session.
#[test]
fn a_restricted_clients_locks_are_checked_and_bounded() {
    use std::os::unix::fs::MetadataExt;
    use weft_proto::messages::{LockKind, LockRange};
    use weft_proto::ErrorCode;
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    fs::write(mnt.join("theirs"), b"a file of user 1000").expect("write");
    std::os::unix::fs::chown(mnt.join("theirs"), Some(1000), Some(1000)).expect("chown");
    let inode = weft_proto::ids::InodeId(fs::metadata(mnt.join("theirs")).expect("stat").ino());
    let scratch = tempfile::tempdir().expect("tempdir");
    let key = restricted_key(&cluster, scratch.path(), "reader", &["--read-only"]);

    let runtime = common::runtime();
    let native = common::keyed_client(&runtime, &cluster, &key);
    let meta = meta_as(&runtime, &cluster, &key, inode.home());
    let session = native.id();
    let lock = |kind: LockKind, start: u64, end: u64| LockRange {
        owner: 77,
        kind,
        start,
        end,
        pid: 1,
    };
    let set = |range: LockRange, target: weft_proto::ids::InodeId| {
        runtime.block_on(common::once_settled(|| {
            meta.set_lock(session, target, range, 0, false)
        }))
    };
    let code = |result: Result<(), weft_net::RpcError>| result.expect_err("refused").code();
    wait_until("the metadata server to apply the read-only rule", || {
        set(lock(LockKind::Write, 0, 10), inode)
            .is_err_and(|error| error.code() == ErrorCode::ReadOnly)
    })
    .expect("a read-only client may not hold an exclusive lock");
    assert_eq!(
        code(set(lock(LockKind::Read, 0, 10), inode)),
        ErrorCode::NotPermitted,
        "a lock of a file the session has not open"
    );
    let made_up = weft_proto::ids::InodeId::new(inode.home(), 999_999);
    assert_eq!(
        code(set(lock(LockKind::Read, 0, 10), made_up)),
        ErrorCode::NotPermitted,
        "a lock of an inode number made up"
    );
    runtime
        .block_on(common::once_settled(|| {
            meta.open(session, 5, inode, weft_proto::access::READ, None)
        }))
        .expect("a reader opens for reading");
    set(lock(LockKind::Read, 0, 10), inode).expect("a shared lock of a file it opened");
    assert_eq!(
        runtime
            .block_on(common::once_settled(
                || meta.open(session, 6, inode, 0, None)
            ))
            .expect_err("an open for nothing")
            .code(),
        ErrorCode::InvalidArgument,
        "a restricted client says what it opens for"
    );
    // Every other byte, one range each and under owners of its choosing, up to the bound
    // of the session: the next split is refused.
    let bound = 4096u64;
    let owned = |owner: u64, kind: LockKind, start: u64, end: u64| LockRange {
        owner,
        kind,
        start,
        end,
        pid: 1,
    };
    for index in 1..bound {
        let start = 100 + index * 2;
        set(owned(index % 7, LockKind::Read, start, start), inode)
            .expect("a lock within the bound");
    }
    let past = 100 + bound * 2;
    assert_eq!(
        code(set(owned(1000, LockKind::Read, past, past), inode)),
        ErrorCode::TooManyLocks,
        "a lock past the bound of ranges, whatever its owner"
    );
    // Releasing stays possible, and frees room.
    for owner in 0..7 {
        set(owned(owner, LockKind::Unlock, 0, u64::MAX), inode).expect("release");
    }
    set(owned(1000, LockKind::Read, past, past), inode).expect("room again");
    drop(native);
}

// Goal: who uses what is for the cluster's members: management's HTTP view (`/api/cluster`,
// the web page), which anyone who reaches its port reads, and the status a client key asks
// for, show neither the client sessions nor the quotas; the members' `weft cluster status`
// shows both. Method: a cluster of real processes with a mount (a session) and a quota rule;
// GET /api/cluster; the status asked with a client key and with the cluster key.
#[test]
fn who_uses_what_is_for_the_members() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    fs::write(mnt.join("used"), common::pattern(3, 100_000)).expect("write");
    common::set_quota(&cluster, &["--user", "1000", "--hard-bytes", "1G"]);
    let (code, body) = weft_testkit::http_get(cluster.mgmt(), "/api/cluster").expect("GET");
    assert_eq!(code, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(json["quotas"].as_array().map(Vec::len), Some(0), "{json}");
    assert_eq!(json["clients"].as_array().map(Vec::len), Some(0), "{json}");
    assert!(
        json["totals"]["client_sessions"].as_u64() >= Some(1),
        "the totals stay: {json}"
    );

    let scratch = tempfile::tempdir().expect("tempdir");
    let key = restricted_key(&cluster, scratch.path(), "plain", &[]);
    let runtime = common::runtime();
    let as_client = weft_net::MgmtClient::new(
        cluster.mgmt(),
        weft_net::RpcClientOptions {
            auth: weft_net::Auth::from_key_file(&key).expect("the client key"),
            ..weft_net::RpcClientOptions::default()
        },
    );
    let status = runtime
        .block_on(as_client.cluster_status())
        .expect("a client reads the cluster's state");
    assert!(
        status.quotas.is_empty() && status.clients.is_empty(),
        "{status:?}"
    );
    let member = weft_net::MgmtClient::new(cluster.mgmt(), common::member_options(&cluster));
    let status = runtime
        .block_on(member.cluster_status())
        .expect("a member reads it all");
    assert_eq!(status.quotas.len(), 1, "{:?}", status.quotas);
}

// Goal: what a descriptor was granted goes with that descriptor: once a root-squashed
// client closed a file it had open for writing and the file's mode no longer lets it write,
// the capability of that closed open, shown with another open (for reading) or with a new
// handle, neither cuts the file nor gets write access again. Method: a cluster of real
// processes; a root-squashed client key; raw metadata requests in the client's own session.
#[test]
fn a_closed_descriptors_capability_grants_nothing() {
    use std::os::unix::fs::MetadataExt;
    use weft_proto::access::{READ, WRITE};
    use weft_proto::ErrorCode;
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    fs::write(mnt.join("root-file"), b"root's, writable by all for now").expect("write");
    fs::set_permissions(mnt.join("root-file"), fs::Permissions::from_mode(0o666)).expect("chmod");
    let inode = weft_proto::ids::InodeId(fs::metadata(mnt.join("root-file")).expect("stat").ino());
    let scratch = tempfile::tempdir().expect("tempdir");
    let key = restricted_key(&cluster, scratch.path(), "squashed", &["--root-squash"]);
    let runtime = common::runtime();
    let native = common::keyed_client(&runtime, &cluster, &key);
    let meta = meta_as(&runtime, &cluster, &key, inode.home());
    let session = native.id();
    let mut granted = None;
    wait_until(
        "the metadata server to grant the squashed client a capability",
        || {
            granted = runtime
                .block_on(common::once_settled(|| {
                    meta.open(session, 1, inode, READ | WRITE, None)
                }))
                .ok()
                .and_then(|(_, capability)| capability);
            granted.is_some()
        },
    )
    .expect("a capability for writing");
    runtime
        .block_on(meta.release(session, vec![(inode, 1)]))
        .expect("close");
    fs::set_permissions(mnt.join("root-file"), fs::Permissions::from_mode(0o644)).expect("chmod");
    // Another open, for reading, which the mode allows.
    runtime
        .block_on(meta.open(session, 2, inode, READ, None))
        .expect("others may read");
    let mutation = weft_proto::messages::MutationId {
        client: session,
        seq: 1 << 41,
        oldest_pending: 1,
    };
    let cut = weft_proto::messages::AttrChanges {
        size: Some(0),
        ..Default::default()
    };
    assert_eq!(
        runtime
            .block_on(meta.set_attr(mutation, inode, cut, granted))
            .expect_err("no cut through a closed descriptor")
            .code(),
        ErrorCode::PermissionDenied
    );
    assert_eq!(
        runtime
            .block_on(meta.open(session, 3, inode, READ | WRITE, granted))
            .expect_err("no write access again")
            .code(),
        ErrorCode::PermissionDenied
    );
    assert_eq!(
        fs::read(mnt.join("root-file")).expect("read"),
        b"root's, writable by all for now"
    );
    drop(native);
}

// Goal: capabilities expire by the cluster's clock, not each server's own: with a storage
// server whose clock runs 20 minutes ahead (twice a capability's life), a root-squashed mount
// still writes and reads files striped over it. Method: a cluster of real processes, one
// storage server started with its clock moved (`WEFT_TEST_CLOCK_SKEW_MS`, a test setting),
// a mount with a root-squashed client key.
#[test]
fn capabilities_expire_by_the_clusters_clock() {
    let mut cluster = cluster(ClusterSpec {
        env: vec![(
            "storage-2".into(),
            "WEFT_TEST_CLOCK_SKEW_MS".into(),
            "1200000".into(),
        )],
        ..ClusterSpec::default()
    });
    let mnt = cluster.mount().expect("mount");
    let wide = mnt.join("wide");
    fs::create_dir(&wide).expect("mkdir");
    fs::set_permissions(&wide, fs::Permissions::from_mode(0o777)).expect("chmod");
    let (ok, out, err) = weft(
        &cluster,
        &[
            "entry",
            "set",
            "--num-targets",
            "4",
            "--chunk-size",
            "64K",
            wide.to_str().expect("utf-8"),
            "--mgmt",
            cluster.mgmt(),
        ],
    );
    assert!(ok, "entry set: {out}{err}");
    fs::write(mnt.join("secret"), b"root's").expect("write");
    fs::set_permissions(mnt.join("secret"), fs::Permissions::from_mode(0o600)).expect("chmod");
    let scratch = tempfile::tempdir().expect("tempdir");
    let key = restricted_key(&cluster, scratch.path(), "squashed", &["--root-squash"]);
    let setting = format!("auth_key_file={:?}", key.display().to_string());
    let squash = cluster.mount_with(&[&setting]).expect("mount as squashed");
    wait_until("the servers to apply the squash", || {
        fs::read(squash.join("secret")).is_err()
    })
    .expect("root squash applies");
    let data = common::pattern(7, 1 << 20);
    let mut file = fs::File::create(squash.join("wide/striped")).expect("create");
    file.write_all(&data)
        .and_then(|()| file.sync_all())
        .expect("a write over every target, one of them 20 minutes ahead");
    close(file).expect("close");
    assert_eq!(
        fs::read(squash.join("wide/striped")).expect("read back"),
        data
    );
    assert_eq!(fs::read(mnt.join("wide/striped")).expect("read"), data);
    cluster.unmount(&squash).expect("unmount");
}

/// A storage client of the server holding `target`, proving the client key in `key_file`.
fn storage_as(
    runtime: &tokio::runtime::Runtime,
    cluster: &weft_testkit::LocalCluster,
    key_file: &Path,
    target: weft_proto::TargetId,
) -> std::sync::Arc<weft_net::StorageClient> {
    runtime
        .block_on(view_as(cluster, key_file).storage_for_target(target))
        .expect("the storage server")
}

// Goal: a restricted client that speaks the protocol itself cannot grow a file past the room
// its home reserved for it under a hard quota, nor count the growth in another owner's quota
// or in none: the storage servers judge a write by what its capability binds (the file's
// owner and the end its objects may grow to), whatever owner the write names. A forged bound
// is refused as any forged capability. Method: a cluster of real processes, a hard limit on
// nobody, a root-squashed client key (its files are nobody's), the file's capability from a
// raw open, raw writes to the file's first object.
#[test]
fn a_restricted_client_grows_a_file_only_into_its_room() {
    use weft_proto::access::{READ, WRITE};
    use weft_proto::ErrorCode;
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    common::set_quota(&cluster, &["--user", "65534", "--hard-bytes", "8M"]);
    fs::create_dir(mnt.join("q")).expect("mkdir");
    fs::set_permissions(mnt.join("q"), fs::Permissions::from_mode(0o1777)).expect("chmod");
    let scratch = tempfile::tempdir().expect("tempdir");
    let key = restricted_key(&cluster, scratch.path(), "squashed", &["--root-squash"]);
    let runtime = common::runtime();
    let native = common::keyed_client(&runtime, &cluster, &key);
    let q = runtime
        .block_on(common::once_settled(|| async {
            native
                .lookup(weft_proto::InodeId::ROOT, "q")
                .await
                .map_err(|error| match error {
                    weft_client::ClientError::Rpc(error) => error,
                    other => panic!("{other}"),
                })
        }))
        .expect("lookup q");
    let new = weft_client::client::regular_file(0o644, 0o022, (0, 0));
    let (file, _) = runtime
        .block_on(native.create_file((q.inode, "f"), new))
        .expect("create as the squashed client");
    runtime
        .block_on(file.write(0, bytes::Bytes::from(vec![1u8; 64 << 10])))
        .expect("a write within the limit");
    let attr = runtime
        .block_on(native.get_attr(file.inode()))
        .expect("stat");
    assert_eq!(attr.uid, 65534, "a squashed client's file is nobody's");
    let target = match attr.layout.as_ref().expect("a layout").slot(0) {
        weft_proto::layout::Slot::Target(target) => target,
        other => panic!("a striped file, not {other:?}"),
    };
    let meta = meta_as(&runtime, &cluster, &key, file.inode().home());
    let (_, capability) = runtime
        .block_on(meta.open(native.id(), 90, file.inode(), READ | WRITE, None))
        .expect("open");
    let capability = capability.expect("a capability");
    let bound = capability.growth.expect("a growth bound");
    assert_eq!((bound.uid, bound.gid), (65534, 65534));
    assert!(
        bound.object_end < 8 << 20,
        "the room is no wider than the limit"
    );
    let storage = storage_as(&runtime, &cluster, &key, target);
    let write = |offset: u64, capability, owner| {
        runtime.block_on(storage.write(
            target,
            weft_net::stubs::ObjectWrite {
                file: (file.inode(), 0),
                offset,
                data: bytes::Bytes::from(vec![2u8; 64 << 10]),
                tag: None,
                capability: Some(capability),
                owner,
            },
        ))
    };
    let root = weft_proto::quota::Owner {
        uid: 0,
        gid: 0,
        project: 0,
    };
    write(0, capability, None).expect("a write inside the file");
    for owner in [None, Some(root)] {
        let refused = write(8 << 20, capability, owner).expect_err("a write past the room");
        assert_eq!(refused.code(), ErrorCode::QuotaExceeded, "{refused}");
    }
    let forged = weft_proto::access::Capability {
        growth: Some(weft_proto::access::GrowthBound {
            object_end: u64::MAX,
            ..bound
        }),
        ..capability
    };
    let refused = write(8 << 20, forged, Some(root)).expect_err("a forged bound");
    assert_eq!(refused.code(), ErrorCode::CapabilityNeeded, "{refused}");
    // Nor can it take the bound off: a client of version 9 shows it.
    let stripped = weft_proto::access::Capability {
        growth: None,
        ..capability
    };
    let refused = write(8 << 20, stripped, Some(root)).expect_err("a stripped bound");
    assert_eq!(refused.code(), ErrorCode::CapabilityNeeded, "{refused}");
    runtime.block_on(file.close()).expect("close");
}

// Goal: one client key cannot make management's store grow without bound: past
// `sessions_per_client` live sessions its registrations are refused with a reason, while
// another key still registers. Method: a cluster of real processes with management's bound
// set to 4; registrations of sessions through the protocol with two client keys.
#[test]
fn a_client_key_holds_a_bounded_number_of_sessions() {
    let cluster = cluster(ClusterSpec {
        mgmt_settings: vec!["sessions_per_client=4".into()],
        ..ClusterSpec::default()
    });
    let scratch = tempfile::tempdir().expect("tempdir");
    let runtime = common::runtime();
    let mgmt_as = |name: &str| {
        view_as(
            &cluster,
            &common::client_key(&cluster, scratch.path(), name),
        )
    };
    let greedy = mgmt_as("greedy");
    for n in 0..4 {
        runtime
            .block_on(greedy.mgmt().register_client(format!("s{n}")))
            .expect("a session within the bound");
    }
    let refused = runtime
        .block_on(greedy.mgmt().register_client("one more".into()))
        .expect_err("a fifth session");
    assert_eq!(refused.code(), weft_proto::ErrorCode::PermissionDenied);
    assert!(
        refused.to_string().contains("sessions_per_client"),
        "{refused}"
    );
    let other = mgmt_as("other");
    runtime
        .block_on(other.mgmt().register_client("mine".into()))
        .expect("another key registers");
}

// Goal: a squashed client cannot have a request run unchecked by giving it the mutation id of
// one it made before, whose reply the server kept: the copy is answered with that reply and
// nothing of it is done. (A rename of a file whose inode lives on another server tells that
// server the file's new parent before the rename itself meets the kept reply; a confined
// client's subtree check follows that parent.) Method: real processes, two metadata servers;
// a member moves a file into a root-only directory on meta-1 from a directory on meta-2 (its
// name here, its inode there); the squashed client makes a file of its own in a shared
// directory on meta-1, then sends a rename of the root-only file under that create's id: it
// is refused as another request's number, and the file keeps its name and its parent.
#[test]
fn an_old_mutation_id_does_not_let_a_request_skip_its_checks() {
    let (cluster, _mnt, on) = two_homes(2);
    let (secret, shared, there) = (on[&1][0].clone(), on[&1][1].clone(), on[&2][0].clone());
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o700)).expect("chmod");
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).expect("chmod");
    let file = moved_across(&there, &secret);
    let secret_path = secret.join("f");
    let (secret, shared) = (inode_of(&secret), inode_of(&shared));
    assert_eq!(secret.home().0, 1);

    let squashed = SquashedClient::new(&cluster, shared);
    let (runtime, key) = (&squashed.runtime, &squashed.key);
    let meta = meta_as(runtime, &cluster, key, weft_proto::NodeId(1));
    let kept = squashed.mutation(squashed.made);

    let stolen = runtime.block_on(meta.rename(
        kept,
        secret,
        "f",
        shared,
        "stolen",
        weft_proto::messages::RenameFlags::default(),
    ));
    let refused = stolen.expect_err("not a rename");
    assert_eq!(
        refused.code(),
        weft_proto::ErrorCode::InvalidArgument,
        "{refused}"
    );
    assert!(secret_path.exists(), "the file keeps its name");
    let (member_runtime, member) = common::native_client(&cluster, |_| {});
    let attr = member_runtime
        .block_on(member.get_attr(file))
        .expect("the file");
    assert_eq!(
        attr.parent, secret,
        "the file's home was not told of a move"
    );
}

// Goal: a squashed client's unlink sent again while the first copy's cross-server intent is
// still in flight is answered as the first copy will be, not judged anew: the first copy
// removed the name already, so a kernel's check of the copy answers ENOENT for a file the
// client never saw removed. Method: two metadata servers, a file named on meta-1 whose inode
// lives on meta-2; meta-1 crashes right after recording the squashed client's unlink intent
// (the name is gone, meta-2 not told yet), meta-2 is killed and meta-1 restarted, so the
// intent cannot finish; the client sends the unlink again under the same mutation id, and
// meta-2 comes back once that copy is at meta-1 (or answered): the copy succeeds, and the
// file is gone on both servers.
#[test]
fn a_squashed_unlink_sent_again_during_its_intent_is_answered_as_the_first() {
    let (mut cluster, _mnt, dirs) = two_homes(1);
    let (shared, there) = (dirs[&1][0].clone(), dirs[&2][0].clone());
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).expect("chmod");
    let file = moved_across(&there, &shared);
    let shared = inode_of(&shared);
    assert_eq!(shared.home().0, 1);

    let squashed = SquashedClient::new(&cluster, shared);
    let (runtime, key) = (&squashed.runtime, &squashed.key);
    let unlink = squashed.mutation(squashed.next());
    common::arm(&mut cluster, "meta-1", "unlink-after-intent");
    let meta = meta_as(runtime, &cluster, key, weft_proto::NodeId(1));
    // The first copy: whatever becomes of it, its intent is recorded and the name is gone.
    let first = {
        let handle = runtime.handle().clone();
        std::thread::spawn(move || handle.block_on(meta.unlink(unlink, shared, "f")))
    };
    wait_until("meta-1 to crash", || cluster.has_exited("meta-1")).expect("crashed");
    cluster.kill("meta-2").expect("kill meta-2");
    cluster.set_env("meta-1", &[]).expect("disarm");
    cluster.restart("meta-1").expect("restart meta-1");

    // The restarted meta-1, once management lists it where it now listens.
    let mut restarted = None;
    wait_until("meta-1 to serve again", || {
        let meta = meta_as(runtime, &cluster, key, weft_proto::NodeId(1));
        let serves = runtime.block_on(meta.get_attr(shared)).is_ok();
        restarted = Some(meta);
        serves
    })
    .expect("meta-1 serves");
    let again = {
        let meta = restarted.expect("meta-1");
        let handle = runtime.handle().clone();
        // As the client library does: `Busy` (the intent still in flight) asks again.
        std::thread::spawn(move || {
            handle.block_on(async {
                for _ in 0..600 {
                    match common::once_settled(|| meta.unlink(unlink, shared, "f")).await {
                        Err(error) if error.code() == weft_proto::ErrorCode::Busy => {
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        }
                        answered => return answered,
                    }
                }
                panic!("the unlink sent again was busy for a minute")
            })
        })
    };
    wait_until("the copy to reach meta-1", || {
        again.is_finished()
            || common::metric_sum(
                &cluster,
                "weft_requests_in_flight",
                &["role=\"meta\"", "node=\"1\""],
            ) > 0
    })
    .expect("the copy is at meta-1");
    cluster.restart("meta-2").expect("restart meta-2");
    let answered = again.join().expect("the copy's thread");
    answered.unwrap_or_else(|error| panic!("the unlink sent again: {error}"));
    let _ = first.join().expect("the first copy's thread");
    let (member_runtime, member) = common::native_client(&cluster, |_| {});
    let gone = member_runtime.block_on(member.get_attr(file));
    assert!(
        gone.is_err(),
        "the file's inode is gone from meta-2: {gone:?}"
    );
}

/// A cluster of two metadata servers, mounted, and directories made in the mount until
/// `on_first` of them lie on meta-1 and one on meta-2, by the home of each.
fn two_homes(
    on_first: usize,
) -> (
    weft_testkit::LocalCluster,
    std::path::PathBuf,
    std::collections::HashMap<u32, Vec<std::path::PathBuf>>,
) {
    let mut cluster = cluster(ClusterSpec {
        meta: 2,
        ..ClusterSpec::default()
    });
    let mnt = cluster.mount().expect("mount");
    let mut on: std::collections::HashMap<u32, Vec<std::path::PathBuf>> =
        std::collections::HashMap::new();
    for index in 0..64 {
        let dir = mnt.join(format!("d{index}"));
        fs::create_dir(&dir).expect("mkdir");
        on.entry(inode_of(&dir).home().0).or_default().push(dir);
        if on.get(&1).is_some_and(|dirs| dirs.len() >= on_first) && on.contains_key(&2) {
            return (cluster, mnt, on);
        }
    }
    panic!("64 directories and not {on_first} on meta-1 and one on meta-2: {on:?}");
}

/// The inode a path of the mount names.
fn inode_of(path: &Path) -> weft_proto::ids::InodeId {
    use std::os::unix::fs::MetadataExt;
    weft_proto::ids::InodeId(fs::metadata(path).expect("stat").ino())
}

/// A file `f` of root's made in `there` (a directory on meta-2) and moved into `into` (on
/// meta-1): its name on meta-1, its inode staying on meta-2.
fn moved_across(there: &Path, into: &Path) -> weft_proto::ids::InodeId {
    fs::write(there.join("f"), b"root's").expect("create");
    fs::rename(there.join("f"), into.join("f")).expect("move it across servers");
    let file = inode_of(&into.join("f"));
    assert_eq!(file.home().0, 2, "its inode stays on meta-2");
    file
}

/// A root-squashed native client of a cluster, once meta-1 squashes it.
struct SquashedClient {
    _scratch: tempfile::TempDir,
    key: std::path::PathBuf,
    runtime: tokio::runtime::Runtime,
    native: std::sync::Arc<weft_client::Client>,
    seq: std::sync::atomic::AtomicU64,
    /// The number of a create of its own, of nobody's file, in the directory it was made with.
    made: u64,
}

impl SquashedClient {
    /// A client key that squashes root, its client, and a create of its own in `shared` (a
    /// directory on meta-1 anyone writes) that shows meta-1 applies the squash.
    fn new(cluster: &weft_testkit::LocalCluster, shared: weft_proto::ids::InodeId) -> Self {
        let scratch = tempfile::tempdir().expect("tempdir");
        let key = restricted_key(cluster, scratch.path(), "squashed", &["--root-squash"]);
        let runtime = common::runtime();
        let native = common::keyed_client(&runtime, cluster, &key);
        let mut client = SquashedClient {
            _scratch: scratch,
            key,
            runtime,
            native,
            seq: std::sync::atomic::AtomicU64::new(1 << 40),
            made: 0,
        };
        let mut made = None;
        wait_until("the metadata server to apply the squash", || {
            let meta = meta_as(&client.runtime, cluster, &client.key, weft_proto::NodeId(1));
            let seq = client.next();
            let name = format!("mine-{seq}");
            let created = client.runtime.block_on(common::once_settled(|| {
                meta.create(
                    client.mutation(seq),
                    shared,
                    &name,
                    weft_client::client::regular_file(0o644, 0, (0, 0)),
                    None,
                )
            }));
            let squashed =
                created.is_ok_and(|created| created.attr.uid == weft_proto::access::NOBODY);
            made = squashed.then_some(seq);
            squashed
        })
        .expect("the rule applies");
        client.made = made.expect("a create of its own");
        client
    }

    /// A new mutation number of its own.
    fn next(&self) -> u64 {
        self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Its mutation `seq`.
    fn mutation(&self, seq: u64) -> weft_proto::messages::MutationId {
        weft_proto::messages::MutationId {
            client: self.native.id(),
            seq,
            oldest_pending: 1,
        }
    }
}
