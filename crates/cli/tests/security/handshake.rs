//! Who gets in: strangers, keys, certificates, older peers, floods.

use super::*;

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
