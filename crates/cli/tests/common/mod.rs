//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use weft_testkit::{wait_until, ClusterSpec, LocalCluster};

/// The `weft` binary under test.
pub fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_weft"))
}

/// Runs the binary with `args` outside any cluster (logging errors only); whether it
/// succeeded, and what it printed on both outputs.
pub fn run(args: &[&str]) -> (bool, String) {
    let mut command = std::process::Command::new(binary());
    command.args(args).env("WEFT_LOG", "error");
    let output = weft_testkit::output_apart(command).expect("weft runs");
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

/// Starts the standard test cluster: management, one metadata server, two storage servers
/// with two targets each.
pub fn cluster(spec: ClusterSpec) -> LocalCluster {
    LocalCluster::start(binary(), spec).expect("local cluster starts")
}

/// The errno of a failed operation, or panics if it succeeded.
pub fn errno<T: std::fmt::Debug>(result: std::io::Result<T>) -> i32 {
    match result {
        Ok(value) => panic!("expected an error, got {value:?}"),
        Err(error) => error
            .raw_os_error()
            .unwrap_or_else(|| panic!("no OS error in {error}")),
    }
}

/// Deterministic test data: every byte depends on its offset and a seed.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Runs the CLI and returns (success, stdout, stderr). A call that takes long is reported on
/// stderr, to tell a slow management answer from a slow cluster when a test stalls.
pub fn weft(cluster: &LocalCluster, args: &[&str]) -> (bool, String, String) {
    let started = std::time::Instant::now();
    let output = cluster.weft(args).expect("weft runs");
    if started.elapsed() > std::time::Duration::from_secs(2) {
        eprintln!(
            "weft {} took {:?}: {}",
            args.join(" "),
            started.elapsed(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A `weft` process a test started: if the test fails before stopping it, dropping the guard
/// kills it and detaches its mount, so a failed test leaves nothing running.
pub struct ProcessGuard {
    child: Option<std::process::Child>,
    mountpoint: std::path::PathBuf,
}

impl ProcessGuard {
    /// Guards `child`, which mounts at `mountpoint`.
    pub fn new(child: std::process::Child, mountpoint: &Path) -> ProcessGuard {
        ProcessGuard {
            child: Some(child),
            mountpoint: mountpoint.to_path_buf(),
        }
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: i32) {
        if let Some(child) = &self.child {
            // SAFETY: kill(2) on a child we own.
            unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        }
    }

    /// Kills the process with SIGKILL and waits for it (the mount stays, as after a crash).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// How the process ended, if it has.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// Waits for the process to exit.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child
            .take()
            .expect("a process to wait for")
            .wait()
            .expect("wait")
    }
}

impl Drop for ProcessGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if weft_testkit::is_mounted(&self.mountpoint) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.mountpoint)
                .status();
        }
    }
}

/// The metadata node `weft entry info` names for `path`.
pub fn metadata_node(cluster: &LocalCluster, path: &Path) -> String {
    let (ok, info, stderr) = weft(cluster, &["entry", "info", path.to_str().expect("utf-8")]);
    assert!(ok, "{stderr}");
    info.lines()
        .find_map(|l| l.strip_prefix("Metadata node: "))
        .expect("metadata node line")
        .to_string()
}

/// Restarts `service` with the fault-injection points `points` armed (`WEFT_FAILPOINTS`) and
/// waits until the cluster is ready.
pub fn arm(cluster: &mut LocalCluster, service: &str, points: &str) {
    cluster
        .set_env(service, &[("WEFT_FAILPOINTS", points)])
        .expect("arm");
    cluster.restart(service).expect("restart armed");
    cluster.wait_ready().expect("ready");
}

/// The names in directory `dir`, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("list")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// Runs `weft fsck` and asserts it finds nothing.
pub fn fsck_clean(cluster: &LocalCluster) {
    let (ok, report, stderr) = weft(cluster, &["fsck", "--mgmt", cluster.mgmt()]);
    assert!(ok, "fsck finds the namespace consistent:\n{report}{stderr}");
}

/// Runs `operation` on `paths` in a thread while `meta-1` is armed with `point`; waits for the
/// crash, restarts meta-1 unarmed, and returns the operation's results (the client retries
/// through the restart).
pub fn crash_during(
    cluster: &mut LocalCluster,
    point: &str,
    paths: Vec<PathBuf>,
    operation: fn(&Path) -> std::io::Result<()>,
) -> Vec<std::io::Result<()>> {
    arm(cluster, "meta-1", point);
    let worker = std::thread::spawn(move || paths.iter().map(|p| operation(p)).collect::<Vec<_>>());
    wait_until(&format!("meta-1 to crash at {point}"), || {
        cluster.has_exited("meta-1")
    })
    .expect("crashed");
    cluster.set_env("meta-1", &[]).expect("disarm");
    cluster.restart("meta-1").expect("restart");
    worker.join().expect("worker")
}

/// A path as a C string.
pub fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).expect("no NUL in test paths")
}

/// The targets of a file's layout in stripe order, as `weft entry info` lists them (with the
/// whole listing, for messages).
pub fn layout_targets(cluster: &LocalCluster, file: &Path) -> (Vec<u32>, String) {
    let (ok, info, err) = weft(
        cluster,
        &[
            "entry",
            "info",
            file.to_str().expect("utf-8"),
            "--mgmt",
            cluster.mgmt(),
        ],
    );
    assert!(ok, "entry info failed: {err}");
    let order = info
        .lines()
        .filter_map(|line| {
            line.trim()
                .strip_prefix("+ ")
                .and_then(|rest| rest.split_once(" @ "))
                .and_then(|(id, _)| id.parse().ok())
        })
        .collect();
    (order, info)
}

/// Pairs the storage targets into mirror groups (`weft mirror autocreate storage`); returns
/// what it printed.
pub fn autocreate_storage_groups(cluster: &LocalCluster) -> String {
    let (ok, out, err) = weft(
        cluster,
        &["mirror", "autocreate", "storage", "--mgmt", cluster.mgmt()],
    );
    assert!(ok, "{err}");
    out
}

/// Two storage servers of one target each, paired into a storage mirror group, once both
/// members are good.
pub fn mirrored_pair() -> LocalCluster {
    let cluster = cluster(ClusterSpec {
        storage: 2,
        targets_per_storage: 1,
        ..ClusterSpec::default()
    });
    autocreate_storage_groups(&cluster);
    weft_testkit::wait_until("both members good", || {
        let (_, list, _) = weft(&cluster, &["mirror", "list", "--mgmt", cluster.mgmt()]);
        list.matches("(good)").count() == 2
    })
    .expect("group formed");
    cluster
}

/// The route by which the first storage group's primary forwards to its secondary, as the
/// cluster map has it now.
pub async fn secondary_route(view: &weft_net::ClusterView) -> weft_proto::messages::Route {
    use weft_proto::messages::{MirrorKind, MirrorRoute, Route};
    let map = view.refresh().await.expect("map");
    let group = map
        .mirror_groups
        .iter()
        .find(|group| group.kind == MirrorKind::Storage)
        .expect("a storage group");
    let member = group
        .members
        .iter()
        .find(|member| member.id != group.primary)
        .expect("a secondary")
        .id;
    Route {
        target: weft_proto::TargetId::from(member),
        mirror: Some(MirrorRoute {
            group: group.id,
            version: group.version,
            forwarded: true,
        }),
    }
}

/// Creates `dir` and sets the pattern of its new files (`weft entry set` with `pattern`
/// arguments); returns what `weft entry set` printed.
pub fn make_dir_with_pattern(cluster: &LocalCluster, dir: &Path, pattern: &[&str]) -> String {
    std::fs::create_dir(dir).expect("mkdir");
    let path = dir.display().to_string();
    let mut args = vec!["entry", "set"];
    args.extend_from_slice(pattern);
    args.extend([path.as_str(), "--mgmt", cluster.mgmt()]);
    let (ok, out, err) = weft(cluster, &args);
    assert!(ok, "entry set failed: {err}");
    out
}

/// Creates `dir` and makes its new files mirrored (`weft entry set --pattern mirrored`, with
/// `more` arguments); returns what `weft entry set` printed.
pub fn make_mirrored_dir(cluster: &LocalCluster, dir: &Path, more: &[&str]) -> String {
    let mut pattern = vec!["--pattern", "mirrored"];
    pattern.extend_from_slice(more);
    make_dir_with_pattern(cluster, dir, &pattern)
}

/// Writes a new file and fsyncs it.
pub fn write_synced(path: &Path, data: &[u8]) {
    use std::io::Write;
    let mut file = std::fs::File::create(path).expect("create");
    file.write_all(data).expect("write");
    file.sync_all().expect("fsync");
}

/// The object files of `inode` on every target of `cluster` (`space` is `objects` for a plain
/// file, `mirrored` for a mirrored one), as (storage server, target, path) of those that exist.
pub fn object_files(
    cluster: &LocalCluster,
    (storage, targets): (usize, usize),
    space: &str,
    inode: u64,
) -> Vec<(usize, usize, PathBuf)> {
    let hash = weft_proto::checksum::crc32c(&inode.to_le_bytes()).to_le_bytes();
    let mut found = Vec::new();
    for server in 1..=storage {
        for target in 1..=targets {
            let path = cluster
                .target_dir(server, target)
                .join(space)
                .join(format!("{:02x}", hash[0]))
                .join(format!("{inode:016x}"));
            if path.exists() {
                found.push((server, target, path));
            }
        }
    }
    found
}

/// Every object of a mirrored file on a storage target (its `mirrored` tree): relative path →
/// content, for comparing mirror members on disk.
pub fn mirrored_objects(target: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    fn walk(dir: &Path, root: &Path, out: &mut std::collections::BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, root, out);
            } else {
                let name = path.strip_prefix(root).expect("under root");
                out.insert(
                    name.display().to_string(),
                    std::fs::read(&path).expect("read object"),
                );
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    let root = target.join("mirrored");
    walk(&root, &root, &mut out);
    out
}

/// Pairs the metadata servers into a mirror group (`weft mirror autocreate meta`) and waits
/// until every copy is good; returns what the command printed.
pub fn autocreate_meta_groups(cluster: &LocalCluster) -> String {
    let (ok, out, err) = weft(
        cluster,
        &["mirror", "autocreate", "meta", "--mgmt", cluster.mgmt()],
    );
    assert!(ok, "{err}");
    weft_testkit::wait_until("every metadata copy to be good", || {
        let (_, list, _) = weft(cluster, &["mirror", "list", "--mgmt", cluster.mgmt()]);
        list.lines()
            .filter(|line| line.contains(" meta "))
            .all(|line| !line.contains("(needs-resync)") && !line.contains("(bad)"))
    })
    .expect("metadata copies made");
    out
}

/// The metadata mirror group's line in `weft mirror list`: primary first.
pub fn meta_group_line(cluster: &LocalCluster) -> String {
    let (ok, list, err) = weft(cluster, &["mirror", "list", "--mgmt", cluster.mgmt()]);
    assert!(ok, "{err}");
    list.lines()
        .find(|line| line.contains(" meta "))
        .unwrap_or_else(|| panic!("a metadata group is listed:\n{list}"))
        .to_string()
}

/// Kills meta-1, the primary of the metadata group, and waits until meta-2 serves its home
/// (lists first in the group).
pub fn fail_meta_1_over(cluster: &mut LocalCluster) {
    cluster.kill("meta-1").expect("kill meta-1");
    weft_testkit::wait_until("meta-2 to take over meta-1's home", || {
        let line = meta_group_line(cluster);
        line.find("meta-2") < line.find("meta-1")
    })
    .expect("metadata failover");
}

/// Waits until the metadata group lists `member` (an alias such as `meta-2`) good.
pub fn wait_meta_member_good(cluster: &LocalCluster, member: &str) {
    weft_testkit::wait_until(&format!("{member} to be a good copy"), || {
        let (_, list, _) = weft(cluster, &["mirror", "list", "--mgmt", cluster.mgmt()]);
        list.lines()
            .filter(|line| line.contains(" meta "))
            .any(|line| line.contains(&format!("({member}) (good)")))
    })
    .expect("copy resynced");
}

/// Asserts the two members of metadata group 1 (home 1: meta-1's own store and meta-2's copy
/// of it) hold the same store file, byte for byte, once no commit is in flight.
pub fn assert_meta_copies_identical(cluster: &LocalCluster, what: &str) {
    let own = cluster.meta_dir(1).join("meta.redb");
    let copy = cluster.meta_dir(2).join("mirror").join("home-1.redb");
    weft_testkit::wait_until(
        &format!("{what}: identical metadata copies"),
        || matches!((std::fs::read(&own), std::fs::read(&copy)), (Ok(a), Ok(b)) if a == b),
    )
    .expect("the members' store files are identical");
}

/// Gives the calling thread a file descriptor table of its own (`unshare(CLONE_FILES)`), for a
/// thread that keeps files of a Weft mount open while other threads start processes. A started
/// process gets a copy of its parent's table and closes the copies at exec; closing a copy of a
/// mount's file sends FLUSH, which waits for that file's writes — through a failover, the
/// length of the pause. Files opened in a private table are never copied into them. Call it
/// before any other thread may be starting a process: the private table is a copy of the
/// shared one, pipes of a process being started included.
pub fn private_file_table() {
    // SAFETY: unshare(CLONE_FILES) only gives this thread a copy of the table it already has.
    let result = unsafe { libc::unshare(libc::CLONE_FILES) };
    assert_eq!(
        result,
        0,
        "unshare(CLONE_FILES): {}",
        std::io::Error::last_os_error()
    );
}

/// A mount of `cluster` whose attribute and entry caches last ten minutes: nothing the kernel
/// or the mount keeps expires during a test that counts requests.
pub fn long_cached_mount(cluster: &mut LocalCluster) -> PathBuf {
    cluster
        .mount_with(&["attr_cache_ms=600000"])
        .expect("mount")
}

/// The sum over every service of the cluster of metric `name`, over its series whose labels
/// include every one of `labels` (e.g. `state="good"`).
pub fn metric_sum(cluster: &LocalCluster, name: &str, labels: &[&str]) -> u64 {
    let endpoints = cluster.service_addresses().expect("service addresses");
    endpoints
        .iter()
        .filter_map(|endpoint| weft_testkit::http_get(endpoint, "/metrics").ok())
        .flat_map(|(_, text)| {
            text.lines()
                .filter(|line| {
                    line.strip_prefix(name)
                        .is_some_and(|rest| rest.starts_with(['{', ' ']))
                        && labels.iter().all(|label| line.contains(label))
                })
                .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// Requests of the kinds `ops` (`get_xattr`, `read_dir`…) the cluster's metadata servers
/// answered so far.
pub fn meta_requests(cluster: &LocalCluster, ops: &[&str]) -> u64 {
    ops.iter()
        .map(|op| {
            metric_sum(
                cluster,
                "weft_request_duration_seconds_count",
                &["role=\"meta\"", &format!("op=\"{op}\"")],
            )
        })
        .sum()
}

/// Connection options of a cluster member: the test cluster's key, every other default.
pub fn member_options(cluster: &LocalCluster) -> weft_net::RpcClientOptions {
    weft_net::RpcClientOptions {
        auth: weft_net::Auth::from_key_file(&cluster.key_file()).expect("the cluster key"),
        ..weft_net::RpcClientOptions::default()
    }
}

/// A two-thread runtime, for native clients and RPC clients of a test cluster.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A two-thread runtime, and a native client of `cluster` on it with the cluster key and the
/// config as `configure` leaves it.
pub fn native_client(
    cluster: &LocalCluster,
    configure: impl FnOnce(&mut weft_client::ClientConfig),
) -> (tokio::runtime::Runtime, std::sync::Arc<weft_client::Client>) {
    let runtime = runtime();
    let mut config = weft_client::ClientConfig::new(cluster.mgmt().to_string());
    config.auth_key_file = Some(cluster.key_file());
    configure(&mut config);
    let client = runtime
        .block_on(weft_client::Client::connect(&config))
        .expect("a native client");
    (runtime, client)
}

/// Bytes one write of the writers carries.
pub const RECORD_BYTES: usize = 1 << 20;

/// A file written record after record (through a mount) until stopped.
pub struct Writer {
    written: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<std::io::Result<u64>>,
}

impl Writer {
    pub fn start(path: PathBuf, seed: u64) -> Writer {
        let written = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let (written, stop) = (Arc::clone(&written), Arc::clone(&stop));
            move || {
                private_file_table();
                let mut file = std::fs::File::create(&path)?;
                let mut records = 0;
                while !stop.load(Ordering::Acquire) {
                    file.write_all(&pattern(seed + records, RECORD_BYTES))?;
                    records += 1;
                    written.store(records * RECORD_BYTES as u64, Ordering::Release);
                }
                file.sync_all()?;
                Ok(records)
            }
        });
        Writer {
            written,
            stop,
            thread,
        }
    }

    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// Waits until `more` bytes were written after now.
    pub fn advance(&self, more: u64, what: &str) {
        let from = self.written();
        wait_until(what, || {
            self.thread.is_finished() || self.written() >= from + more
        })
        .expect("the writer goes on");
        assert!(!self.thread.is_finished(), "the writer stopped: {what}");
    }

    /// Stops the writer; answers how many records it wrote, or the error it met.
    pub fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Release);
        self.thread
            .join()
            .expect("writer thread")
            .expect("every write and the fsync succeed: a failure is a pause, not an error")
    }
}

/// Checks the `records` records of `seed` at `path`.
pub fn verify(path: &Path, seed: u64, records: u64) {
    let data = std::fs::read(path).expect("read back");
    assert_eq!(
        data.len() as u64,
        records * RECORD_BYTES as u64,
        "{} holds every record",
        path.display()
    );
    for (record, chunk) in data.chunks(RECORD_BYTES).enumerate() {
        assert!(
            chunk == pattern(seed + record as u64, RECORD_BYTES).as_slice(),
            "record {record} of {} reads back as written",
            path.display()
        );
    }
}

/// Issues the key of client `name` from the test cluster's key, in `dir`.
pub fn client_key(cluster: &LocalCluster, dir: &Path, name: &str) -> PathBuf {
    let file = dir.join(format!("{name}.key"));
    let mut command = std::process::Command::new(binary());
    command
        .args(["keygen", "--client", name, file.to_str().expect("utf-8")])
        .env("WEFT_KEY_FILE", cluster.key_file())
        .env("WEFT_LOG", "error");
    let made = weft_testkit::output_apart(command).expect("weft runs");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    file
}

/// Sets a client's rule: `weft client set ARGS…` (the client's name first).
pub fn set_rule(cluster: &LocalCluster, args: &[&str]) {
    set(cluster, "client", args);
}

/// Sets a quota rule: `weft quota set ARGS --mgmt …` (`--user 65534 --hard-bytes 8M`…).
pub fn set_quota(cluster: &LocalCluster, args: &[&str]) {
    set(cluster, "quota", args);
}

/// Runs `weft WHAT set ARGS --mgmt …`, which must succeed.
fn set(cluster: &LocalCluster, what: &str, args: &[&str]) {
    let mut all = vec![what, "set"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--mgmt", cluster.mgmt()]);
    let (ok, out, err) = weft(cluster, &all);
    assert!(ok, "weft {all:?}: {out}{err}");
}

/// A native client of the cluster proving the key in `key_file`, on `runtime`; every write
/// is answered by its servers (no write-behind), so a refusal is the write's own answer.
pub fn keyed_client(
    runtime: &tokio::runtime::Runtime,
    cluster: &LocalCluster,
    key_file: &Path,
) -> Arc<weft_client::Client> {
    let mut config = weft_client::ClientConfig::new(cluster.mgmt().to_string());
    config.auth_key_file = Some(key_file.to_path_buf());
    config.heartbeat_interval = std::time::Duration::from_millis(300);
    config.write_behind_bytes = 0;
    runtime
        .block_on(weft_client::Client::connect(&config))
        .expect("a client key connects")
}

/// Runs `attempt` again while it is answered `Unavailable` (a server whose map does not list a
/// new session yet answers so), at most 100 times.
pub async fn once_settled<T, F, Fut>(attempt: F) -> Result<T, weft_net::RpcError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, weft_net::RpcError>>,
{
    for _ in 0..100 {
        match attempt().await {
            Err(error) if error.code() == weft_proto::ErrorCode::Unavailable => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
    attempt().await
}
