//! Only the cluster's own members get in: every connection proves the cluster key before a
//! request of it is read, strangers are refused with a line in the server's log, and running
//! without a key must be asked for.

mod common;

use common::{binary, client_key, cluster, keyed_client, once_settled, set_rule};
use std::fs;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;
use weft_proto::codec::{self, FrameHeader, FrameKind};
use weft_proto::messages::{MgmtRequest, Request, StorageRequest};
use weft_proto::{InodeId, TargetId};
use weft_testkit::{wait_until, ClusterSpec};

/// The header of a request frame with a body of `body_len` bytes and no payload.
fn request_header(body_len: u32, flags: u8) -> [u8; codec::FRAME_HEADER_BYTES] {
    FrameHeader {
        version: codec::PROTOCOL_VERSION,
        flags,
        kind: FrameKind::Request,
        request_id: 1,
        body_len,
        payload_len: 0,
        payload_crc: 0,
        origin: 0,
    }
    .encode()
}

/// Sends `request` as a frame at once, as a peer that skips the handshake would (every Weft
/// before authentication did); returns every byte the server sent back before it closed.
fn unauthenticated_request(address: &str, request: &Request) -> Vec<u8> {
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let body = codec::encode_body(request);
    let header = request_header(body.len() as u32, 0);
    let mut frame = header.to_vec();
    frame.extend_from_slice(&body);
    // The server may hang up before all of it is read.
    let _ = stream.write_all(&frame);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    answer
}

/// Runs the CLI as on a host of its own, with `key_file` as its key (`None`: no key anywhere
/// it looks; the links of this host's mounts are out of its sight).
fn weft_with_key(key_file: Option<&Path>, args: &[&str]) -> Output {
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let mut command = Command::new(binary());
    command
        .args(args)
        .env("WEFT_LOG", "warn")
        .env("XDG_RUNTIME_DIR", elsewhere.path());
    match key_file {
        Some(file) => command.env("WEFT_KEY_FILE", file),
        None => command.env("WEFT_KEY_FILE", ""),
    };
    command.output().expect("weft runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

// Goal: a stranger on the network reaches nothing: a peer that sends requests without the
// handshake, one with another key and one with none are refused before any request is served,
// each refusal is a line in the server's log naming the peer and the reason, the stranger is
// told what is wrong, a server with another key cannot join, and the cluster's data is intact.
// Method: a cluster of real processes; raw frames to every service (a map request, an object
// removal), the CLI and a mount with another key or none, a storage server with another key.
#[test]
fn strangers_are_refused_before_any_request() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    fs::write(mnt.join("kept"), b"members only").expect("write");
    let inode = {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(mnt.join("kept")).expect("stat").ino()
    };

    // Without a handshake, no service answers anything, whatever is asked.
    let addresses = cluster.service_addresses().expect("addresses");
    assert!(addresses.len() >= 4, "{addresses:?}");
    for address in &addresses {
        let answer = unauthenticated_request(address, &Request::Mgmt(MgmtRequest::GetClusterMap));
        assert!(
            answer.is_empty(),
            "{address} answered a stranger: {answer:?}"
        );
        for target in 1..=4 {
            let answer = unauthenticated_request(
                address,
                &Request::Storage(StorageRequest::Sync {
                    target: TargetId(target),
                    mirror: None,
                    inode: InodeId(inode),
                    capability: None,
                }),
            );
            assert!(
                answer.is_empty(),
                "{address} answered a stranger: {answer:?}"
            );
        }
    }

    // Another key: refused, and told so with the key file named.
    let scratch = tempfile::tempdir().expect("tempdir");
    let other = scratch.path().join("other.key");
    let made = weft_with_key(None, &["keygen", other.to_str().expect("utf-8")]);
    assert!(made.status.success(), "{}", stderr(&made));
    let listed = weft_with_key(Some(&other), &["node", "list", "--mgmt", cluster.mgmt()]);
    assert!(!listed.status.success());
    let message = stderr(&listed);
    assert!(
        message.contains(&format!(
            "authentication failed: the key in {} does not match the cluster's",
            other.display()
        )),
        "{message}"
    );
    // No key at all: told where to give one.
    let listed = weft_with_key(None, &["node", "list", "--mgmt", cluster.mgmt()]);
    assert!(!listed.status.success());
    assert!(
        stderr(&listed).contains("requires the cluster key")
            && stderr(&listed).contains("--key-file"),
        "{}",
        stderr(&listed)
    );
    // The right key with TLS against a cluster without it: refused at once, told to check TLS.
    let tls_client = scratch.path().join("tls-client");
    fs::create_dir(&tls_client).expect("mkdir");
    fs::copy(cluster.key_file(), tls_client.join("cluster.key")).expect("copy the key");
    let made = weft_with_key(
        None,
        &["certgen", tls_client.join("tls").to_str().expect("utf-8")],
    );
    assert!(made.status.success(), "{}", stderr(&made));
    let listed = weft_with_key(
        Some(&tls_client.join("cluster.key")),
        &["node", "list", "--mgmt", cluster.mgmt()],
    );
    assert!(!listed.status.success());
    assert!(stderr(&listed).contains("TLS with"), "{}", stderr(&listed));
    // A mount with another key does not mount.
    let stranger_mnt = scratch.path().join("mnt");
    fs::create_dir(&stranger_mnt).expect("mkdir");
    let mounted = Command::new(binary())
        .args(["mount", "--mgmt", cluster.mgmt(), "--key-file"])
        .arg(&other)
        .arg(&stranger_mnt)
        .env("WEFT_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("weft mount");
    assert!(!mounted.status.success());
    assert!(
        stderr(&mounted).contains("authentication failed: the key in"),
        "{}",
        stderr(&mounted)
    );

    // A storage server with another key cannot register.
    let data = scratch.path().join("storage");
    let target = data.join("target");
    fs::create_dir_all(&target).expect("mkdir");
    let joined = Command::new(binary())
        .args([
            "serve",
            "storage",
            "--listen",
            "127.0.0.1:0",
            "--mgmt",
            cluster.mgmt(),
        ])
        .arg("--data-dir")
        .arg(&data)
        .arg("--target")
        .arg(&target)
        .arg("--set")
        .arg(format!("auth_key_file={:?}", other.display().to_string()))
        .env("WEFT_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("weft serve storage");
    assert!(!joined.status.success(), "a server with another key joined");
    assert!(
        stderr(&joined).contains("authentication failed"),
        "{}",
        stderr(&joined)
    );

    // Management logged each refusal with the peer's address and the reason.
    let log = cluster.log("mgmt");
    for reason in [
        "sent frames without authenticating",
        "proved another cluster key",
        "holds no cluster key",
    ] {
        assert!(
            log.lines().any(|line| line.contains("refused a connection")
                && line.contains("peer=127.0.0.1:")
                && line.contains(reason)),
            "management's log names the refusal ({reason}):\n{log}"
        );
    }
    // And the cluster's own members still work, with nothing lost.
    assert_eq!(fs::read(mnt.join("kept")).expect("read"), b"members only");
    let listed = cluster
        .weft(&["node", "list", "--mgmt", cluster.mgmt()])
        .expect("runs");
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout)
            .lines()
            .filter(|line| line.contains("storage"))
            .count(),
        2,
        "no stranger registered"
    );
}

// Goal: running without authentication is a choice the config states, never a default: a
// service with neither a key file nor `auth = "none"` does not start and names both keys; a
// key file others can read is refused with the chmod that fixes it; `auth = "none"` starts
// with a warning; `weft keygen` never overwrites a key. Method: `weft serve mgmt` each way.
#[test]
fn running_without_a_key_must_be_asked_for() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let data = scratch.path().join("mgmt");
    let serve = |settings: &[&str]| -> Output {
        let mut command = Command::new(binary());
        command
            .args(["serve", "mgmt", "--listen", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(&data)
            .env("WEFT_LOG", "warn")
            .stdin(Stdio::null());
        for setting in settings {
            command.args(["--set", setting]);
        }
        command.output().expect("weft serve mgmt")
    };
    let output = serve(&[]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("auth_key_file") && stderr(&output).contains("auth = \"none\""),
        "{}",
        stderr(&output)
    );

    let key = scratch.path().join("cluster.key");
    let made = weft_with_key(None, &["keygen", key.to_str().expect("utf-8")]);
    assert!(made.status.success(), "{}", stderr(&made));
    let again = weft_with_key(None, &["keygen", key.to_str().expect("utf-8")]);
    assert!(!again.status.success(), "a key is never overwritten");
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(&key).expect("stat").permissions().mode() & 0o777,
            0o600
        );
        fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).expect("chmod");
    }
    let output = serve(&[&format!("auth_key_file={:?}", key.display().to_string())]);
    assert!(!output.status.success());
    assert!(stderr(&output).contains("chmod 600"), "{}", stderr(&output));

    // With auth = "none" it starts, and says at once what that means.
    let log_path = scratch.path().join("open.log");
    let child = Command::new(binary())
        .args([
            "serve",
            "mgmt",
            "--listen",
            "127.0.0.1:0",
            "--set",
            "auth=none",
        ])
        .arg("--data-dir")
        .arg(&data)
        .env("WEFT_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log_path).expect("log"))
        .spawn()
        .expect("weft serve mgmt");
    let mut guard = common::ProcessGuard::new(child, scratch.path());
    wait_until("the warning", || {
        fs::read_to_string(&log_path)
            .unwrap_or_default()
            .contains("running without authentication")
    })
    .expect("auth = \"none\" is logged as a warning");
    guard.kill();
}

// Goal: with TLS, every connection of the cluster runs in TLS and data goes end to end (a
// mount writes and reads back a file, admin commands work); a member with the key but without
// TLS is refused and told the server requires TLS; a peer with the key and a certificate of
// another CA is refused; management logs both. Method: a TLS test cluster of real processes;
// the CLI with a copy of the key, without and with another CA's certificate beside it.
#[test]
fn a_tls_cluster_admits_only_certificates_of_its_ca() {
    let mut cluster = cluster(ClusterSpec {
        tls: true,
        ..ClusterSpec::default()
    });
    let mnt = cluster.mount().expect("mount");
    let data = common::pattern(7, 3 << 20);
    fs::write(mnt.join("over-tls"), &data).expect("write");
    fs::File::open(mnt.join("over-tls"))
        .and_then(|file| file.sync_all())
        .expect("fsync");
    assert_eq!(fs::read(mnt.join("over-tls")).expect("read"), data);
    let listed = cluster
        .weft(&["node", "list", "--mgmt", cluster.mgmt()])
        .expect("runs");
    assert!(listed.status.success(), "{}", stderr(&listed));

    let scratch = tempfile::tempdir().expect("tempdir");
    let plain = scratch.path().join("plain");
    fs::create_dir(&plain).expect("mkdir");
    fs::copy(cluster.key_file(), plain.join("cluster.key")).expect("copy the key");
    let refused = weft_with_key(
        Some(&plain.join("cluster.key")),
        &["node", "list", "--mgmt", cluster.mgmt()],
    );
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("requires TLS"),
        "{}",
        stderr(&refused)
    );

    let other = scratch.path().join("other");
    fs::create_dir(&other).expect("mkdir");
    fs::copy(cluster.key_file(), other.join("cluster.key")).expect("copy the key");
    let made = weft_with_key(
        None,
        &["certgen", other.join("tls").to_str().expect("utf-8")],
    );
    assert!(made.status.success(), "{}", stderr(&made));
    let refused = weft_with_key(
        Some(&other.join("cluster.key")),
        &["node", "list", "--mgmt", cluster.mgmt()],
    );
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("TLS with"),
        "{}",
        stderr(&refused)
    );

    // The server notes a failed TLS handshake when it sees the client give up, which may be
    // after the client's process ended: the line is waited for.
    for reason in ["came without TLS", "failed TLS"] {
        let logged = wait_until("management's log to name the refusal", || {
            cluster
                .log("mgmt")
                .lines()
                .any(|line| line.contains("refused a connection") && line.contains(reason))
        });
        assert!(
            logged.is_ok(),
            "management's log names the refusal ({reason}):\n{}",
            cluster.log("mgmt")
        );
    }
    assert_eq!(fs::read(mnt.join("over-tls")).expect("read"), data);
}

/// Reads 5 bytes of, or writes to, the first object of `inode` (at `slot`) on its storage
/// server, showing `capability`.
async fn object_io(
    view: &weft_net::ClusterView,
    (inode, slot): (InodeId, weft_proto::layout::Slot),
    capability: Option<weft_proto::access::Capability>,
    write: bool,
) -> Result<Vec<u8>, weft_net::RpcError> {
    let route = view.route(slot).await?;
    let storage = view.storage_for_target(route.target).await?;
    if write {
        let data = bytes::Bytes::from_static(b"overwritten");
        storage
            .write(
                route,
                weft_net::ObjectWrite {
                    file: (inode, 0),
                    offset: 0,
                    data,
                    tag: None,
                    capability,
                    owner: None,
                },
            )
            .await
            .map(|_| Vec::new())
    } else {
        storage
            .read(route, (inode, 0), 0, 5, capability)
            .await
            .map(|data| data.to_vec())
    }
}

/// Whether `result` is the error `errno`.
fn fails_with<T>(result: std::io::Result<T>, errno: i32) -> bool {
    result.is_err_and(|error| error.raw_os_error() == Some(errno))
}

fn code<T: std::fmt::Debug>(result: Result<T, weft_client::ClientError>) -> weft_proto::ErrorCode {
    result.expect_err("refused").code()
}

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
    let mut names: Vec<String> = fs::read_dir(&confined)
        .expect("list the root")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    assert_eq!(names, ["deep", "leaving", "notes"]);
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

// Goal: rolling upgrades: servers of this version serve a peer of the previous protocol
// version, which neither sends nor understands what the newer one added: it registers a
// session, reads the map, creates and opens a file, writes and reads its data, in frames of
// the older version; what it cannot say (a project's quota) is refused on the older
// peer's side with the reason, not sent garbled or dropped. Method: a cluster of real
// processes, and RPC clients that offer only the older protocol version in their handshake.
#[test]
fn a_peer_one_protocol_version_older_is_served() {
    use weft_proto::codec::PROTOCOL_VERSION_MIN;
    let cluster = cluster(ClusterSpec::default());
    let runtime = common::runtime();
    let older = weft_net::RpcClientOptions {
        protocol_max: PROTOCOL_VERSION_MIN,
        ..common::member_options(&cluster)
    };
    runtime.block_on(async {
        let view = weft_net::ClusterView::new(cluster.mgmt(), older);
        let map = view.refresh().await.expect("the map, in the older version");
        assert!(!map.nodes.is_empty() && !map.targets.is_empty(), "{map:?}");
        let session = view
            .mgmt()
            .register_client("older-peer".into())
            .await
            .expect("a session")
            .id;
        let meta = view
            .meta(InodeId::ROOT.home())
            .await
            .expect("the root's server");
        let mutation = weft_proto::messages::MutationId {
            client: session,
            seq: 1,
            oldest_pending: 1,
        };
        let new = weft_client::client::regular_file(0o644, 0o022, (0, 0));
        let attr = meta
            .create(mutation, InodeId::ROOT, "from-v1", new, None)
            .await
            .expect("create in the older version")
            .attr;
        let (opened, capability) = meta
            .open(session, 1, attr.inode, weft_proto::access::WRITE, None)
            .await
            .expect("open in the older version");
        assert_eq!(capability, None, "a member is granted none");
        let layout = opened.layout.expect("a file's layout");
        let route = view
            .route(layout.slot(0))
            .await
            .expect("the first object's route");
        let storage = view
            .storage_for_target(route.target)
            .await
            .expect("its server");
        let data = bytes::Bytes::from_static(b"written by an older peer");
        let weft_proto::answer::Written { len: written, .. } = storage
            .write(
                route,
                weft_net::ObjectWrite {
                    file: (attr.inode, 0),
                    offset: 0,
                    data: data.clone(),
                    tag: None,
                    capability: None,
                    owner: None,
                },
            )
            .await
            .expect("write in the older version");
        assert_eq!(written as usize, data.len());
        let read = storage
            .read(route, (attr.inode, 0), 0, data.len() as u32, None)
            .await
            .expect("read in the older version");
        assert_eq!(read, data);

        let refused = view
            .mgmt()
            .set_quota(weft_proto::quota::QuotaRule {
                kind: weft_proto::quota::QuotaKind::Project,
                id: 7,
                pool: weft_proto::StoragePoolId::DEFAULT,
                limits: weft_proto::quota::QuotaLimits {
                    hard_inodes: 10,
                    ..Default::default()
                },
            })
            .await
            .expect_err("the older version has no project quotas");
        assert_eq!(
            refused.code(),
            weft_proto::ErrorCode::VersionMismatch,
            "{refused}"
        );
        assert!(
            refused.to_string().contains("needs protocol version 5"),
            "{refused}"
        );
    });
    // And what the older peer wrote is there for this version's clients.
    let client = runtime
        .block_on(async {
            let mut config = weft_client::ClientConfig::new(cluster.mgmt().to_string());
            config.auth_key_file = Some(cluster.key_file());
            weft_client::Client::connect(&config).await
        })
        .expect("client");
    let attr = runtime
        .block_on(client.lookup(InodeId::ROOT, "from-v1"))
        .expect("the file");
    assert_eq!(attr.uid, 0);
}

/// The resident memory of process `pid`, in bytes.
fn resident_bytes(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("the process runs");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| {
            value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kib| kib << 10)
        .expect("VmRSS")
}

/// Most memory a flooded service may hold in this test: documented in docs/operations.md
/// ("What an attacker on the network can still do").
const FLOODED_SERVICE_BYTES_MAX: u64 = 256 << 20;

// Goal: a flood of hostile connections leaves every service serving its members, with its
// memory bounded: thousands of connections that send nothing, senders of one byte a second,
// members' connections whose headers claim 4 MiB bodies that never come, and garbage after a
// valid frame. Meanwhile a mount keeps reading and writing, and afterwards new connections
// get in. Method: a cluster of real processes; each service in turn flooded from this
// process, its resident memory sampled during the flood.
#[test]
fn a_flood_leaves_every_service_serving_and_bounded() {
    use tokio::io::AsyncWriteExt;
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let data = common::pattern(3, 1 << 20);
    fs::write(mnt.join("before"), &data).expect("write");
    let runtime = common::runtime();
    // The stalled frames come from a client identity: a quarter of a service's budget at most
    // is its to hold, so the members' requests are read meanwhile.
    let scratch = tempfile::tempdir().expect("tempdir");
    let flooder = client_key(&cluster, scratch.path(), "flooder");
    let flooder = weft_net::Auth::from_key_file(&flooder).expect("the client key");
    for (round, name) in ["mgmt", "meta-1", "storage-1"].into_iter().enumerate() {
        let address = cluster.address_of(name).expect("address");
        let pid = cluster.pid(name).expect("pid");
        let mut peak = resident_bytes(pid);

        // Members whose frames claim 4 MiB bodies and send 64 KiB of them; one that sends
        // garbage after a valid frame.
        let stalled = runtime.block_on(async {
            let mut streams = Vec::new();
            for index in 0..200 {
                let Ok(mut stream) = tokio::net::TcpStream::connect(&address).await else {
                    continue;
                };
                let versions = weft_net::auth::VERSIONS_SPOKEN;
                if weft_net::auth::connect(&mut stream, (&flooder, versions), (&address, &[]))
                    .await
                    .is_err()
                {
                    continue;
                }
                let header = request_header(codec::FRAME_BODY_BYTES_MAX, (index % 2) as u8);
                let _ = stream.write_all(&header).await;
                let _ = stream.write_all(&vec![0x5a; 64 << 10]).await;
                streams.push(stream);
            }
            if let Ok(mut stream) = tokio::net::TcpStream::connect(&address).await {
                let versions = weft_net::auth::VERSIONS_SPOKEN;
                if weft_net::auth::connect(&mut stream, (&flooder, versions), (&address, &[]))
                    .await
                    .is_ok()
                {
                    let body = codec::encode_body(&Request::Stats);
                    let header = request_header(body.len() as u32, 0);
                    let _ = stream.write_all(&header).await;
                    let _ = stream.write_all(&body).await;
                    let _ = stream.write_all(&[0xff; 4096]).await;
                    streams.push(stream);
                }
            }
            streams
        });
        // Then connections that never send a byte, and senders of a byte a second: new
        // connections wait for them to time out, those already in go on.
        let silent: Vec<std::net::TcpStream> = (0..2000)
            .filter_map(|_| std::net::TcpStream::connect(&address).ok())
            .collect();
        assert!(
            silent.len() >= 1000,
            "{name}: {} silent connections",
            silent.len()
        );
        let trickle: Vec<std::thread::JoinHandle<()>> = (0..20)
            .map(|_| {
                let address = address.clone();
                std::thread::spawn(move || {
                    let Ok(mut stream) = std::net::TcpStream::connect(&address) else {
                        return;
                    };
                    for byte in b"WFT" {
                        if stream.write_all(&[*byte]).is_err() {
                            return;
                        }
                        std::thread::sleep(Duration::from_secs(1));
                    }
                })
            })
            .collect();
        assert!(
            stalled.len() > 100,
            "{name}: only {} members got in",
            stalled.len()
        );

        // The members' mount keeps working through it, without waiting for the stalled
        // frames to be timed out.
        let flooded = std::time::Instant::now();
        for step in 0..3 {
            peak = peak.max(resident_bytes(pid));
            assert_eq!(
                fs::read(mnt.join("before")).expect("read during the flood"),
                data
            );
            let file = mnt.join(format!("during-{round}-{step}"));
            fs::write(&file, &data).expect("write during the flood");
            fs::File::open(&file)
                .and_then(|file| file.sync_all())
                .expect("fsync during the flood");
            std::thread::sleep(Duration::from_millis(500));
        }
        assert!(
            flooded.elapsed() < weft_net::server::FRAME_REST_TIMEOUT,
            "{name}: the mount's requests waited for the stalled frames to be closed"
        );
        peak = peak.max(resident_bytes(pid));
        assert!(
            peak < FLOODED_SERVICE_BYTES_MAX,
            "{name} held {} MiB during the flood",
            peak >> 20
        );
        drop((silent, stalled));
        for thread in trickle {
            let _ = thread.join();
        }
        // And once it ends, a new connection gets in.
        let listed = cluster
            .weft(&["node", "list", "--mgmt", cluster.mgmt()])
            .expect("runs");
        assert!(listed.status.success(), "{}", stderr(&listed));
        eprintln!("{name}: at most {} MiB during the flood", peak >> 20);
    }
    assert_eq!(fs::read(mnt.join("before")).expect("read"), data);
}
