//! What the users of restricted clients, quotas and the native library count on: a
//! root-squashed mount keeps the read-only files it writes (as git and tar make them), and
//! the native library keeps what a handle dropped without a close wrote.

#[path = "../common/mod.rs"]
mod common;

use common::{cluster, weft};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::io::IntoRawFd;
use std::path::Path;
use std::process::Command;
use weft_net::MetaCalls;
use weft_net::MgmtCalls;
use weft_testkit::{wait_until, ClusterSpec};

/// Issues the key of client `name` in `dir` and sets its rule to `rule` (`--root-squash`…).
fn restricted_key(
    cluster: &weft_testkit::LocalCluster,
    dir: &Path,
    name: &str,
    rule: &[&str],
) -> std::path::PathBuf {
    let file = common::client_key(cluster, dir, name);
    let mut args = vec![name];
    args.extend_from_slice(rule);
    common::set_rule(cluster, &args);
    file
}

/// A view of `cluster` proving the client key in `key_file`, for requests through the
/// protocol.
fn view_as(cluster: &weft_testkit::LocalCluster, key_file: &Path) -> weft_net::ClusterView {
    weft_net::ClusterView::new(
        cluster.mgmt(),
        weft_net::RpcClientOptions {
            auth: weft_net::Auth::from_key_file(key_file).expect("the client key"),
            ..weft_net::RpcClientOptions::default()
        },
    )
}

/// A metadata client of `home`'s server proving the client key in `key_file`.
fn meta_as(
    runtime: &tokio::runtime::Runtime,
    cluster: &weft_testkit::LocalCluster,
    key_file: &Path,
    home: weft_proto::NodeId,
) -> std::sync::Arc<weft_net::MetaClient> {
    runtime
        .block_on(view_as(cluster, key_file).meta(home))
        .expect("the metadata server")
}

/// Runs `program` with `args` in `dir` as root; panics with its output when it fails.
fn run_in(dir: &Path, program: &str, args: &[&str]) {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .env("HOME", dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .expect("the tool runs");
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A mount of `cluster` with a root-squashed client key (issued in `dir`), once the servers
/// apply the squash: a file of root's mode 0600 made through the member mount `mnt` is
/// refused to it.
fn squashed_mount(
    cluster: &mut weft_testkit::LocalCluster,
    mnt: &Path,
    dir: &Path,
) -> std::path::PathBuf {
    fs::write(mnt.join("secret"), b"root's").expect("write");
    fs::set_permissions(mnt.join("secret"), fs::Permissions::from_mode(0o600)).expect("chmod");
    let key = restricted_key(cluster, dir, "squashed", &["--root-squash"]);
    let setting = format!("auth_key_file={:?}", key.display().to_string());
    let squash = cluster.mount_with(&[&setting]).expect("mount as squashed");
    wait_until("the servers to apply the squash", || {
        fs::read(squash.join("secret")).is_err()
    })
    .expect("root squash applies");
    squash
}

/// A cluster with a member mount, a directory `work` anyone may write in, and a
/// root-squashed mount of it ([`squashed_mount`]; its key in `scratch`).
fn squashed_cluster(
    scratch: &Path,
) -> (
    weft_testkit::LocalCluster,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    squashed_cluster_with(scratch, ClusterSpec::default())
}

/// [`squashed_cluster`] of `spec`.
fn squashed_cluster_with(
    scratch: &Path,
    spec: ClusterSpec,
) -> (
    weft_testkit::LocalCluster,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let mut cluster = cluster(spec);
    let mnt = cluster.mount().expect("mount");
    fs::create_dir(mnt.join("work")).expect("mkdir");
    fs::set_permissions(mnt.join("work"), fs::Permissions::from_mode(0o777)).expect("chmod");
    let squash = squashed_mount(&mut cluster, &mnt, scratch);
    (cluster, mnt, squash)
}

/// close(2) of `file`, with its error.
fn close(file: fs::File) -> std::io::Result<()> {
    // SAFETY: the descriptor is ours alone (taken out of the File) and closed once.
    if unsafe { libc::close(file.into_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

mod protocol;
mod squashed;
