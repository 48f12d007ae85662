//! What a client identity may do once in: its rule, its subtree, its capabilities.

use super::*;

// Goal: a client key proves its name and no more, and the servers hold the client to the
// rule management keeps for it, whatever its kernel allows: it cannot send what only members
// send (registering a node, removing objects); a read-only client reads but cannot write,
// create, remove, rename or set attributes; a squashed root acts as nobody, so it cannot read
// another user's 0600 file or change what is not its own, and what it creates is nobody's;
// a revoked client gets nothing. Each through a mount (as root, which the kernel lets
// through) and through the native library; the files are unchanged for the members.
// Method: a cluster of real processes; `weft keygen --client`, `weft client set`, mounts and
// native clients with the client keys, raw requests with a client key.
#[test]
fn client_identities_are_held_to_their_rules() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use weft_proto::access::{self, NOBODY};
    use weft_proto::ErrorCode;

    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    fs::write(mnt.join("open"), b"for everyone").expect("write");
    fs::write(mnt.join("secret"), b"for user 1000 only").expect("write");
    fs::set_permissions(mnt.join("secret"), fs::Permissions::from_mode(0o600)).expect("chmod");
    std::os::unix::fs::chown(mnt.join("secret"), Some(1000), Some(1000)).expect("chown");
    fs::create_dir(mnt.join("shared")).expect("mkdir");
    fs::set_permissions(mnt.join("shared"), fs::Permissions::from_mode(0o777)).expect("chmod");

    let scratch = tempfile::tempdir().expect("tempdir");
    let reader = client_key(&cluster, scratch.path(), "reader");
    let squashed = client_key(&cluster, scratch.path(), "squashed");
    set_rule(&cluster, &["reader", "--read-only"]);
    set_rule(&cluster, &["squashed", "--root-squash"]);
    let listed = cluster
        .weft(&["client", "list", "--mgmt", cluster.mgmt()])
        .expect("runs");
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(
        listed.contains("reader") && listed.contains("read-only") && listed.contains("root-squash"),
        "{listed}"
    );

    // What only members send is refused to a client, by every service.
    let runtime = common::runtime();
    let as_reader = weft_net::RpcClientOptions {
        auth: weft_net::Auth::from_key_file(&reader).expect("the client key"),
        ..weft_net::RpcClientOptions::default()
    };
    let mgmt = weft_net::RpcClient::new(cluster.mgmt(), as_reader.clone());
    let refused = runtime.block_on(mgmt.call::<weft_proto::messages::MgmtResponse>(
        &Request::Mgmt(MgmtRequest::RegisterNode {
            node: Some(weft_proto::NodeId(1)),
            kind: weft_proto::messages::NodeKind::Storage,
            alias: "impostor".into(),
            addresses: vec!["127.0.0.1:9".into()],
        }),
        bytes::Bytes::new(),
    ));
    let error = refused.expect_err("a client cannot register a node");
    assert_eq!(error.code(), ErrorCode::PermissionDenied, "{error}");
    assert!(
        error
            .to_string()
            .contains("client reader may not send register_node"),
        "{error}"
    );
    let inode = fs::metadata(mnt.join("open")).expect("stat").ino();
    for address in cluster.service_addresses().expect("addresses") {
        let storage = weft_net::RpcClient::new(address.clone(), as_reader.clone());
        let removal = Request::Storage(StorageRequest::Remove {
            target: TargetId(1),
            mirror: None,
            inode: InodeId(inode),
            tag: None,
        });
        let refused = runtime.block_on(
            storage.call::<weft_proto::messages::StorageResponse>(&removal, bytes::Bytes::new()),
        );
        assert_eq!(
            refused.expect_err("a client cannot remove objects").code(),
            ErrorCode::PermissionDenied,
            "{address}"
        );
    }

    // A read-only client, through a mount: reads, and every change is refused with EROFS.
    let reader_key = format!("auth_key_file={:?}", reader.display().to_string());
    let read_only = cluster.mount_with(&[&reader_key]).expect("mount as reader");
    let open_for_write = || {
        fs::OpenOptions::new()
            .write(true)
            .open(read_only.join("open"))
    };
    wait_until("the servers to apply the reader's rule", || {
        fails_with(open_for_write(), libc::EROFS)
    })
    .expect("read-only applies");
    assert_eq!(
        fs::read(read_only.join("open")).expect("a read-only client reads"),
        b"for everyone"
    );
    assert_eq!(
        common::errno(fs::write(read_only.join("new"), b"x")),
        libc::EROFS
    );
    assert_eq!(
        common::errno(fs::create_dir(read_only.join("dir"))),
        libc::EROFS
    );
    assert_eq!(
        common::errno(fs::remove_file(read_only.join("open"))),
        libc::EROFS
    );
    assert_eq!(
        common::errno(fs::rename(read_only.join("open"), read_only.join("moved"))),
        libc::EROFS
    );
    assert_eq!(
        common::errno(fs::set_permissions(
            read_only.join("open"),
            fs::Permissions::from_mode(0o777)
        )),
        libc::EROFS
    );

    // And through the native library, down to the storage servers.
    let native = keyed_client(&runtime, &cluster, &reader);
    let attr = runtime
        .block_on(native.lookup(InodeId::ROOT, "open"))
        .expect("lookup");
    assert_eq!(
        code(runtime.block_on(native.open(attr.inode, 1, access::WRITE))),
        ErrorCode::ReadOnly
    );
    assert_eq!(
        code(runtime.block_on(native.unlink(InodeId::ROOT, "open"))),
        ErrorCode::ReadOnly
    );
    let chmod = weft_proto::messages::AttrChanges {
        mode: Some(0o777),
        ..Default::default()
    };
    assert_eq!(
        code(runtime.block_on(native.set_attr(attr.inode, chmod))),
        ErrorCode::ReadOnly
    );
    // A client acts only in its own sessions: not in the member mount's, whose opens, locks
    // and stored replies it would otherwise release, steal or forge.
    let map = runtime.block_on(native.cluster_map()).expect("map");
    let member_session = *map
        .live_sessions
        .iter()
        .find(|session| map.session_owner(**session).is_none())
        .expect("the member mount's session");
    assert_eq!(
        map.session_owner(native.id()),
        Some("reader"),
        "management knows who registered the session"
    );
    let (home, route) = map.meta_route(InodeId::ROOT.home());
    let meta_address = map
        .node(weft_proto::messages::NodeKind::Meta, home)
        .expect("the root's server")
        .addresses[0]
        .clone();
    let meta = weft_net::RpcClient::new(meta_address, as_reader.clone());
    let release = Request::Meta(
        route,
        weft_proto::messages::MetaRequest::Release {
            client: member_session,
            handles: Vec::new(),
        },
        None,
    );
    let refused = runtime
        .block_on(meta.call::<weft_proto::messages::MetaResponse>(&release, bytes::Bytes::new()))
        .expect_err("another's session");
    assert_eq!(refused.code(), ErrorCode::PermissionDenied, "{refused}");
    assert!(
        refused.to_string().contains("may not act in session"),
        "{refused}"
    );
    let heartbeat = Request::Mgmt(MgmtRequest::ClientHeartbeat {
        client: member_session,
        unserved: Vec::new(),
    });
    let refused = runtime
        .block_on(mgmt.call::<weft_proto::messages::MgmtResponse>(&heartbeat, bytes::Bytes::new()))
        .expect_err("another's session");
    assert_eq!(refused.code(), ErrorCode::PermissionDenied, "{refused}");

    // The storage servers learn the rule on their own: until they do, the write puts back
    // the bytes already there.
    let opened = runtime
        .block_on(native.open_file(attr.inode, access::READ))
        .expect("a reader may open for reading");
    wait_until("the storage servers to refuse the reader's writes", || {
        let written = runtime.block_on(opened.write(0, bytes::Bytes::from_static(b"for everyone")));
        written.is_err_and(|error| error.code() == ErrorCode::ReadOnly)
    })
    .expect("storage refuses the write");

    // A squashed root, through a mount: nobody's access, whatever the kernel let through.
    let squashed_key = format!("auth_key_file={:?}", squashed.display().to_string());
    let squash = cluster
        .mount_with(&[&squashed_key])
        .expect("mount as squashed");
    wait_until("the servers to apply the squash", || {
        fails_with(fs::read(squash.join("secret")), libc::EACCES)
    })
    .expect("root squash applies");
    assert_eq!(
        fs::read(squash.join("open")).expect("others may read it"),
        b"for everyone"
    );
    assert_eq!(
        common::errno(
            fs::OpenOptions::new()
                .append(true)
                .open(squash.join("open"))
        ),
        libc::EACCES,
        "others may not write it"
    );
    assert_eq!(
        common::errno(fs::remove_file(squash.join("open"))),
        libc::EACCES,
        "the root directory is root's"
    );
    assert_eq!(
        common::errno(fs::set_permissions(
            squash.join("open"),
            fs::Permissions::from_mode(0o666)
        )),
        libc::EPERM
    );
    fs::write(squash.join("shared/mine"), b"made by nobody").expect("create in a 0777 dir");
    let made = fs::metadata(mnt.join("shared/mine")).expect("the members see it");
    assert_eq!((made.uid(), made.gid()), (NOBODY, NOBODY));

    // And through the native library (this process is root, as the mount's callers were).
    let native = keyed_client(&runtime, &cluster, &squashed);
    let secret = runtime
        .block_on(native.lookup(InodeId::ROOT, "secret"))
        .expect("lookup");
    assert_eq!(
        code(runtime.block_on(native.open(secret.inode, 1, access::READ))),
        ErrorCode::PermissionDenied
    );
    // A client that states another uid is checked as that uid: never as root.
    let acting_as = |uid: u32| weft_proto::access::Caller {
        uid,
        gid: uid,
        groups: Vec::new(),
    };
    let open_as = |uid: u32, handle: u64| {
        runtime.block_on(weft_net::stubs::acting_for(
            acting_as(uid),
            native.open(secret.inode, handle, access::READ),
        ))
    };
    assert_eq!(code(open_as(1, 2)), ErrorCode::PermissionDenied);
    assert!(open_as(1000, 3).is_ok(), "the owner it claims to be");
    let give_to_root = weft_proto::messages::AttrChanges {
        uid: Some(0),
        ..Default::default()
    };
    assert_eq!(
        code(runtime.block_on(weft_net::stubs::acting_for(
            acting_as(1000),
            native.set_attr(secret.inode, give_to_root),
        ))),
        ErrorCode::NotPermitted
    );
    let mut as_root = weft_client::client::directory(0o755, 0, (0, 0));
    as_root.kind = weft_proto::messages::FileKind::Regular;
    as_root.mode = 0o4755;
    let shared = runtime
        .block_on(native.lookup(InodeId::ROOT, "shared"))
        .expect("lookup");
    let planted = runtime
        .block_on(weft_net::stubs::acting_for(
            acting_as(1000),
            native.create(shared.inode, "planted", as_root),
        ))
        .expect("create in a 0777 directory");
    assert_eq!(
        (planted.uid, planted.gid),
        (1000, 1000),
        "what a caller creates is its own, whatever owner it asks for"
    );

    // A revoked client gets nothing at all.
    set_rule(&cluster, &["squashed", "--revoked"]);
    wait_until("the servers to apply the revocation", || {
        runtime
            .block_on(native.get_attr(InodeId::ROOT))
            .is_err_and(|error| error.code() == ErrorCode::PermissionDenied)
    })
    .expect("revocation applies");

    // The members' files are as they were.
    assert_eq!(fs::read(mnt.join("open")).expect("read"), b"for everyone");
    assert_eq!(
        fs::read(mnt.join("secret")).expect("read"),
        b"for user 1000 only"
    );
    assert_eq!(
        fs::metadata(mnt.join("open")).expect("stat").mode() & 0o777,
        0o644
    );
    drop(native);
    cluster.unmount(&squash).expect("unmount");
    cluster.unmount(&read_only).expect("unmount");
}

// Goal: a client confined to a subtree sees that directory as its mount's root and reaches
// nothing outside it, whatever inode it names: not the root, not a sibling's files, not by
// creating, renaming or linking out; a file a member moves out is out of its reach at once,
// a directory moved out once the servers' memory of it lapses; the members' files are
// untouched. Method: a cluster of real processes with two metadata servers (directories
// land on either, so the servers follow parents across servers), a mount with the client's
// key, and the native library naming inodes outside.
#[test]
fn a_client_confined_to_a_subtree_reaches_nothing_outside() {
    use std::os::unix::fs::MetadataExt;
    use weft_proto::access;
    use weft_proto::ErrorCode;

    let mut cluster = cluster(ClusterSpec {
        meta: 2,
        ..ClusterSpec::default()
    });
    let mnt = cluster.mount().expect("mount");
    fs::create_dir_all(mnt.join("projects/alice/deep/er")).expect("mkdir");
    fs::create_dir_all(mnt.join("projects/bob")).expect("mkdir");
    fs::write(mnt.join("projects/alice/notes"), b"alice's notes").expect("write");
    fs::write(mnt.join("projects/alice/deep/er/leaf"), b"deep down").expect("write");
    fs::write(mnt.join("projects/alice/leaving"), b"moves out").expect("write");
    fs::write(mnt.join("projects/bob/secret"), b"bob's").expect("write");
    fs::write(mnt.join("top"), b"at the top").expect("write");

    let scratch = tempfile::tempdir().expect("tempdir");
    let alice = client_key(&cluster, scratch.path(), "alice");
    let subtree = mnt.join("projects/alice");
    set_rule(
        &cluster,
        &["alice", "--subtree", subtree.to_str().expect("utf-8")],
    );
    let listed = cluster
        .weft(&["client", "list", "--mgmt", cluster.mgmt()])
        .expect("runs");
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(listed.contains("subtree /projects/alice"), "{listed}");

    // Through a mount: the subtree is the root, and everything in it works.
    let alice_key = format!("auth_key_file={:?}", alice.display().to_string());
    let confined = cluster.mount_with(&[&alice_key]).expect("mount as alice");
    assert_eq!(common::names(&confined), ["deep", "leaving", "notes"]);
    assert_eq!(
        fs::read(confined.join("notes")).expect("read"),
        b"alice's notes"
    );
    assert_eq!(
        fs::read(confined.join("deep/er/leaf")).expect("read"),
        b"deep down"
    );
    fs::write(confined.join("deep/new"), b"made by alice").expect("create");
    fs::rename(confined.join("deep/new"), confined.join("new")).expect("rename inside");
    assert_eq!(
        fs::read(mnt.join("projects/alice/new")).expect("the members see it"),
        b"made by alice"
    );

    // Through the native library, naming inodes outside.
    let runtime = common::runtime();
    let native = keyed_client(&runtime, &cluster, &alice);
    let root = native.root();
    assert_eq!(root.0, fs::metadata(&subtree).expect("stat").ino());
    let outside = |result: Result<weft_proto::messages::InodeAttr, weft_client::ClientError>| {
        result.is_err_and(|error| error.code() == ErrorCode::PermissionDenied)
    };
    assert!(outside(runtime.block_on(native.get_attr(InodeId::ROOT))));
    assert!(
        outside(runtime.block_on(native.get_attr(InodeId::new(root.home(), 1 << 40)))),
        "an inode that does not exist is refused as one outside: no oracle, no race"
    );
    assert!(outside(
        runtime.block_on(native.lookup(InodeId::ROOT, "projects"))
    ));
    let projects = InodeId(fs::metadata(mnt.join("projects")).expect("stat").ino());
    assert_eq!(
        code(runtime.block_on(native.read_dir(projects, 0, 100))),
        ErrorCode::PermissionDenied
    );
    let secret = InodeId(
        fs::metadata(mnt.join("projects/bob/secret"))
            .expect("stat")
            .ino(),
    );
    assert!(outside(runtime.block_on(native.get_attr(secret))));
    assert_eq!(
        code(runtime.block_on(native.open(secret, 1, access::READ))),
        ErrorCode::PermissionDenied
    );
    let mut file = weft_client::client::directory(0o644, 0, (0, 0));
    file.kind = weft_proto::messages::FileKind::Regular;
    assert!(outside(runtime.block_on(native.create(
        InodeId::ROOT,
        "planted",
        file
    ))));
    assert_eq!(
        code(runtime.block_on(native.rename(
            root,
            "notes",
            InodeId::ROOT,
            "stolen",
            Default::default()
        ))),
        ErrorCode::PermissionDenied
    );
    let notes = runtime
        .block_on(native.lookup(root, "notes"))
        .expect("a file inside");
    assert!(outside(runtime.block_on(native.link(
        notes.inode,
        InodeId::ROOT,
        "linked"
    ))));
    assert_eq!(
        code(runtime.block_on(native.rename(
            projects,
            "alice",
            InodeId::ROOT,
            "moved",
            Default::default()
        ))),
        ErrorCode::PermissionDenied,
        "nor can it move its own root"
    );

    // Nor can it reach the objects of a file outside on the storage servers: they want, with
    // each read and write, the capability its metadata server granted at an open.
    let member = keyed_client(&runtime, &cluster, &cluster.key_file());
    let secret_slot = runtime
        .block_on(member.get_attr(secret))
        .expect("the members see it")
        .layout
        .expect("a file's layout")
        .slot(0);
    let notes_slot = notes.layout.clone().expect("a file's layout").slot(0);
    runtime.block_on(async {
        let as_alice = weft_net::RpcClientOptions {
            auth: weft_net::Auth::from_key_file(&alice).expect("the client key"),
            ..weft_net::RpcClientOptions::default()
        };
        let view = weft_net::ClusterView::new(cluster.mgmt(), as_alice);
        view.refresh().await.expect("the map");
        let session = view
            .mgmt()
            .register_client("alice-by-hand".into())
            .await
            .expect("a session")
            .id;
        let meta = view.meta(notes.inode.home()).await.expect("its server");
        let (_, granted) = once_settled(|| meta.open(session, 1, notes.inode, access::READ, None))
            .await
            .expect("an open inside");
        let granted = granted.expect("a confined client is granted a capability");
        assert_eq!(granted.access, access::READ);
        let read =
            once_settled(|| object_io(&view, (notes.inode, notes_slot), Some(granted), false))
                .await;
        assert_eq!(read.expect("its capability reads it"), b"alice");
        for (what, file, capability, write) in [
            ("no capability", (secret, secret_slot), None, false),
            (
                "another file's capability",
                (secret, secret_slot),
                Some(granted),
                false,
            ),
            (
                "a capability to read, for a write",
                (notes.inode, notes_slot),
                Some(granted),
                true,
            ),
            (
                "no capability, for a write",
                (secret, secret_slot),
                None,
                true,
            ),
        ] {
            let refused = once_settled(|| object_io(&view, file, capability, write)).await;
            assert_eq!(
                refused.expect_err(what).code(),
                ErrorCode::CapabilityNeeded,
                "{what}"
            );
        }
    });

    // A file a member moves out is out of reach at once; a directory once the servers'
    // memory of it lapses.
    let leaving = runtime
        .block_on(native.lookup(root, "leaving"))
        .expect("a file inside");
    let deep = runtime
        .block_on(native.lookup(root, "deep"))
        .expect("a directory inside");
    fs::rename(mnt.join("projects/alice/leaving"), mnt.join("left")).expect("move out");
    assert!(outside(runtime.block_on(native.get_attr(leaving.inode))));
    fs::rename(mnt.join("projects/alice/deep"), mnt.join("deep")).expect("move out");
    wait_until("the moved directory to be out of reach", || {
        outside(runtime.block_on(native.get_attr(deep.inode)))
    })
    .expect("the directory moved out is refused");
    assert!(runtime.block_on(native.get_attr(notes.inode)).is_ok());

    // The members' files are as they were.
    assert_eq!(
        fs::read(mnt.join("projects/bob/secret")).expect("read"),
        b"bob's"
    );
    assert_eq!(fs::read(mnt.join("top")).expect("read"), b"at the top");
    assert!(!mnt.join("planted").exists() && !mnt.join("stolen").exists());
    drop(native);
    cluster.unmount(&confined).expect("unmount");
}

// Goal: a file a client opened before its rule made the servers decide its access (root
// squash set while the file was open) stays readable: the first read the storage servers
// refuse for want of a capability opens the file again for one, and is asked again.
// Method: a cluster of real processes, a native client with a client key holding a file open
// across `weft client set --root-squash`, and raw reads without a capability to see the
// storage servers apply the rule.
#[test]
fn a_file_opened_before_the_rule_changed_gets_a_capability_when_asked() {
    use weft_proto::access;
    use weft_proto::ErrorCode;

    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    fs::write(mnt.join("open"), b"for everyone").expect("write");
    let scratch = tempfile::tempdir().expect("tempdir");
    let late = client_key(&cluster, scratch.path(), "late");
    let runtime = common::runtime();
    let native = keyed_client(&runtime, &cluster, &late);
    let attr = runtime
        .block_on(native.lookup(InodeId::ROOT, "open"))
        .expect("lookup");
    let opened = runtime
        .block_on(native.open_file(attr.inode, access::READ))
        .expect("open before any rule");
    let layout = attr.layout.clone().expect("a file's layout");
    let read = || {
        runtime
            .block_on(opened.read(0, 12))
            .map(|data| data.into_bytes())
    };
    assert_eq!(read().expect("read").as_ref(), b"for everyone");

    set_rule(&cluster, &["late", "--root-squash"]);
    let as_late = weft_net::RpcClientOptions {
        auth: weft_net::Auth::from_key_file(&late).expect("the client key"),
        ..weft_net::RpcClientOptions::default()
    };
    let view = weft_net::ClusterView::new(cluster.mgmt(), as_late.clone());
    runtime.block_on(view.refresh()).expect("the map");
    let slot = layout.slot(0);
    wait_until(
        "the storage servers to want capabilities of the client",
        || {
            runtime
                .block_on(object_io(&view, (attr.inode, slot), None, false))
                .is_err_and(|error| error.code() == ErrorCode::CapabilityNeeded)
        },
    )
    .expect("the rule applies");
    assert_eq!(
        read().expect("read with a capability asked for").as_ref(),
        b"for everyone"
    );

    drop(native);
}
