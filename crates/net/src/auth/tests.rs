use super::*;

fn key_auth(directory: &Path, name: &str) -> Auth {
    let file = directory.join(name);
    write_new_key(&file).expect("keygen");
    Auth::from_key_file(&file).expect("load")
}

async fn run(server: Auth, client: Auth) -> (Result<u16, Refusal>, Result<u16, ConnectError>) {
    let (mut a, mut b) = tokio::io::duplex(1024);
    let server = tokio::spawn(async move {
        let outcome = accept(&mut a, &server, &[]).await;
        drop(a);
        outcome.map(|(version, _)| version)
    });
    let client = connect(&mut b, (&client, VERSIONS_SPOKEN), ("server:1", &[])).await;
    // A client that refuses the server hangs up, as a real one drops its connection.
    drop(b);
    (server.await.expect("server task"), client)
}

// Goal: two holders of the same key agree on the version; another key, no key, or a key
// against a server without one, are each refused with a message that says so.
#[tokio::test]
async fn only_holders_of_the_same_key_get_in() {
    let directory = tempfile::tempdir().expect("tempdir");
    let one = key_auth(directory.path(), "one.key");
    let two = key_auth(directory.path(), "two.key");

    let (server, client) = run(one.clone(), one.clone()).await;
    assert_eq!(server, Ok(PROTOCOL_VERSION));
    assert_eq!(client.map_err(|e| format!("{e:?}")), Ok(PROTOCOL_VERSION));

    let (server, client) = run(one.clone(), two.clone()).await;
    assert!(server.is_err(), "{server:?}");
    let ConnectError::Refused(message) = client.expect_err("another key") else {
        panic!("not a refusal")
    };
    assert!(
        message.starts_with("authentication failed: the key in"),
        "{message}"
    );
    assert!(message.contains("two.key"), "{message}");

    let (server, client) = run(one.clone(), Auth::none()).await;
    assert_eq!(server, Err(Refusal::KeyRequired));
    assert!(
        matches!(client, Err(ConnectError::Refused(ref m)) if m.contains("requires the cluster key")),
        "{client:?}"
    );

    let (server, client) = run(Auth::none(), one.clone()).await;
    assert_eq!(server, Ok(PROTOCOL_VERSION));
    assert!(
        matches!(client, Err(ConnectError::Refused(ref m)) if m.contains("without authentication")),
        "{client:?}"
    );

    let (server, client) = run(Auth::none(), Auth::none()).await;
    assert_eq!(
        (server, client.map_err(|e| format!("{e:?}"))),
        (Ok(PROTOCOL_VERSION), Ok(PROTOCOL_VERSION))
    );
}

// Goal: a client key issued from the cluster key gets in as that client, and the server
// knows its name; a client key of another cluster, or one whose name line was edited, is
// refused; a client key cannot issue client keys, nor serve.
#[tokio::test]
async fn client_keys_prove_their_name() {
    let directory = tempfile::tempdir().expect("tempdir");
    let cluster = key_auth(directory.path(), "cluster.key");
    let other = key_auth(directory.path(), "other.key");
    let issue = |auth: &Auth, name: &str, file: &str| {
        let file = directory.path().join(file);
        write_client_key(auth, name, &file)?;
        Auth::from_key_file(&file)
    };
    let node7 = issue(&cluster, "node7", "node7.key").expect("client key");
    assert_eq!(node7.client_name(), Some("node7"));

    let (mut a, mut b) = tokio::io::duplex(1024);
    let server_key = cluster.clone();
    let server = tokio::spawn(async move { accept(&mut a, &server_key, &[]).await });
    let client = connect(&mut b, (&node7, VERSIONS_SPOKEN), ("server:1", &[])).await;
    assert_eq!(client.map_err(|e| format!("{e:?}")), Ok(PROTOCOL_VERSION));
    assert_eq!(
        server.await.expect("server task"),
        Ok((PROTOCOL_VERSION, Identity::Client("node7".into())))
    );

    let foreign = issue(&other, "node7", "foreign.key").expect("client key");
    let (server, client) = run(cluster.clone(), foreign).await;
    assert_eq!(server, Err(Refusal::WrongKey));
    assert!(
        matches!(client, Err(ConnectError::Refused(_))),
        "{client:?}"
    );

    // The key of node7 under another name: the server derives another key.
    let text = std::fs::read_to_string(directory.path().join("node7.key")).expect("read");
    let renamed = directory.path().join("renamed.key");
    write_key_file(&renamed, text.replace("node7", "node8").trim()).expect("write");
    let renamed = Auth::from_key_file(&renamed).expect("load");
    let (server, _) = run(cluster.clone(), renamed).await;
    assert_eq!(server, Err(Refusal::WrongKey));

    let issued_by_client = issue(&node7, "node9", "node9.key");
    assert!(
        issued_by_client
            .as_ref()
            .is_err_and(|message| message.contains("takes the cluster key")),
        "{issued_by_client:?}"
    );
    assert!(issue(&cluster, "a/b", "bad.key").is_err());
    let service = Auth::for_service(AuthSettings {
        key_file: Some(&directory.path().join("node7.key")),
        ..AuthSettings::default()
    });
    assert!(service.is_err_and(|message| message.contains("a service needs the cluster key")),);
}

// Goal: proofs are bound to the TLS session they run in: a handshake relayed from one
// session into another (the two ends see different keying material) does not verify.
#[tokio::test]
async fn a_handshake_relayed_into_another_tls_session_fails() {
    let directory = tempfile::tempdir().expect("tempdir");
    let key = key_auth(directory.path(), "cluster.key");
    let (mut a, mut b) = tokio::io::duplex(1024);
    let server_key = key.clone();
    let server = tokio::spawn(async move {
        accept(&mut a, &server_key, &[1; 32])
            .await
            .map(|(version, _)| version)
    });
    let client = connect(&mut b, (&key, VERSIONS_SPOKEN), ("server:1", &[2; 32])).await;
    drop(b);
    assert!(
        matches!(client, Err(ConnectError::Refused(_))),
        "{client:?}"
    );
    assert_eq!(server.await.expect("server task"), Err(Refusal::WrongKey));
}

/// Plays a recorded client message against a live server.
async fn replay(server: Auth, messages: Vec<Vec<u8>>) -> (Result<u16, Refusal>, Vec<u8>) {
    let (mut a, mut b) = tokio::io::duplex(1024);
    let server = tokio::spawn(async move {
        accept(&mut a, &server, &[])
            .await
            .map(|(version, _)| version)
    });
    for message in messages {
        let _ = b.write_all(&message).await;
    }
    let outcome = server.await.expect("server task");
    let mut answer = Vec::new();
    let _ = b.read_to_end(&mut answer).await;
    (outcome, answer)
}

// Goal: a recorded handshake, replayed whole, does not get in: the server's nonce is new.
#[tokio::test]
async fn a_recorded_handshake_cannot_be_replayed() {
    let directory = tempfile::tempdir().expect("tempdir");
    let key = key_auth(directory.path(), "cluster.key");
    // Record a real client's messages through a relay.
    let (mut client_end, mut relay_client) = tokio::io::duplex(1024);
    let (mut relay_server, mut server_end) = tokio::io::duplex(1024);
    let server_key = key.clone();
    let server = tokio::spawn(async move {
        accept(&mut server_end, &server_key, &[])
            .await
            .map(|(version, _)| version)
    });
    let client_key = key.clone();
    let client = tokio::spawn(async move {
        connect(&mut client_end, (&client_key, VERSIONS_SPOKEN), ("s", &[])).await
    });
    let mut hello = vec![0u8; 10 + NONCE_BYTES];
    relay_client.read_exact(&mut hello).await.expect("hello");
    relay_server.write_all(&hello).await.expect("relay hello");
    let mut challenge = vec![0u8; 3 + NONCE_BYTES + PROOF_BYTES];
    relay_server
        .read_exact(&mut challenge)
        .await
        .expect("challenge");
    relay_client
        .write_all(&challenge)
        .await
        .expect("relay challenge");
    let mut proof = vec![0u8; 1 + PROOF_BYTES];
    relay_client.read_exact(&mut proof).await.expect("proof");
    relay_server.write_all(&proof).await.expect("relay proof");
    let mut welcome = [0u8; 1];
    relay_server
        .read_exact(&mut welcome)
        .await
        .expect("welcome");
    relay_client
        .write_all(&welcome)
        .await
        .expect("relay welcome");
    assert_eq!(server.await.expect("server"), Ok(PROTOCOL_VERSION));
    assert_eq!(
        client.await.expect("client").map_err(|e| format!("{e:?}")),
        Ok(PROTOCOL_VERSION)
    );

    let (outcome, _) = replay(key, vec![hello, proof]).await;
    assert_eq!(outcome, Err(Refusal::WrongKey));
}

// Goal: a peer speaking only a newer protocol is refused and told the server's versions.
#[tokio::test]
async fn another_protocol_version_is_refused() {
    let mut hello = HANDSHAKE_MAGIC.to_vec();
    hello.extend_from_slice(&(PROTOCOL_VERSION + 1).to_le_bytes());
    hello.extend_from_slice(&(PROTOCOL_VERSION + 2).to_le_bytes());
    hello.extend_from_slice(&[0, 0]);
    hello.extend_from_slice(&[7; NONCE_BYTES]);
    let (outcome, answer) = replay(Auth::none(), vec![hello]).await;
    assert!(
        matches!(outcome, Err(Refusal::Version { .. })),
        "{outcome:?}"
    );
    assert_eq!(answer[..2], [TAG_REFUSED, 1]);
}

// Goal: the directory where mounts leave key links is used only when it is this user's
// own with mode 0700: one another user made first, or a link, is refused; and a secret
// that is not a regular file is refused.
#[test]
fn key_links_live_only_in_a_private_directory() {
    use std::os::unix::fs::PermissionsExt;
    let directory = tempfile::tempdir().expect("tempdir");
    let dir = directory.path().join("weft");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let error = check_private_dir(&dir).expect_err("group and others may enter");
    assert!(error.contains("not a private directory"), "{error}");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    check_private_dir(&dir).expect("private");
    let link = directory.path().join("link");
    std::os::unix::fs::symlink(&dir, &link).expect("symlink");
    assert!(
        check_private_dir(&link).is_err(),
        "a link is not the directory"
    );
    let error = open_private(&dir, "key file").expect_err("a directory");
    assert!(error.contains("not a regular file"), "{error}");
}

// Goal: key files are made private and never overwritten; a readable or damaged one is
// refused with the fix named.
#[test]
fn key_files_are_private_and_checked() {
    use std::os::unix::fs::PermissionsExt;
    let directory = tempfile::tempdir().expect("tempdir");
    let file = directory.path().join("cluster.key");
    write_new_key(&file).expect("keygen");
    let mode = std::fs::metadata(&file).expect("stat").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let error = write_new_key(&file).expect_err("exists");
    assert!(error.contains("never overwritten"), "{error}");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let error = Auth::from_key_file(&file).expect_err("readable");
    assert!(error.contains("chmod 600"), "{error}");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::fs::write(&file, "not a key\n").expect("write");
    let error = Auth::from_key_file(&file).expect_err("damaged");
    assert!(error.contains("weft keygen"), "{error}");
    let error = Auth::configured(None, None).expect_err("neither");
    assert!(
        error.contains("auth_key_file") && error.contains("auth = \"none\""),
        "{error}"
    );
}
