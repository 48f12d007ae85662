//! `LocalCluster`: a real Weft cluster of separate processes on 127.0.0.1 (or, with
//! `netns`, each service in a network namespace of its own) in a temporary directory, for
//! integration tests. Each service is a `weft serve` process, each mount a
//! `weft mount` process; services can be killed (SIGKILL) and restarted with the same data,
//! and every process's log is kept and printed when a test fails.
//!
//! Tests never sleep for a fixed time: [`wait_until`] polls an observable state under a
//! generous deadline that can only fail the test.

mod netns;
mod support;

use support::lazy_unmount;
pub use support::{free_port, http_get, is_mounted, output_apart, wait_until};

use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Deadline for a cluster state a test waits for.
pub const WAIT_DEADLINE: Duration = Duration::from_secs(90);

/// The shape of a local cluster.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    /// Metadata servers.
    pub meta: usize,
    /// Storage servers.
    pub storage: usize,
    /// Targets per storage server.
    pub targets_per_storage: usize,
    /// Storage keeps unsynced writes in memory, so a kill loses them as a power loss would.
    pub crash_test: bool,
    /// Per-target capacity limit in bytes.
    pub target_capacity_bytes: Option<u64>,
    /// Config settings (`key=value`) given to every service, e.g. `influxdb.url=...`.
    pub settings: Vec<String>,
    /// Config settings given to the storage servers only, e.g. `direct_io=true`.
    pub storage_settings: Vec<String>,
    /// Config settings given to the metadata servers only, e.g. `target_chooser="balanced"`.
    pub meta_settings: Vec<String>,
    /// Config settings given to management only, e.g. `quota_grace_period_ms=1000`.
    pub mgmt_settings: Vec<String>,
    /// Management servers: 1 (`mgmt`), or 3 or 5 replicating management (`mgmt-1`,
    /// `mgmt-2`, …), which every node and tool is given together ([`LocalCluster::mgmt`]).
    pub mgmt_replicas: usize,
    /// Every service in a network namespace of its own, on a bridge the host reaches, so a
    /// test can cut one off the network ([`LocalCluster::set_link`]). Needs root.
    pub netns: bool,
    /// With `netns`: the networks (rails) every host is on, each a bridge of its own; every
    /// service listens on, and is reached at, one address per rail.
    pub rails: usize,
    /// With `netns`: every server link's rate each way in megabits per second (`tc`), so
    /// that the network limits bandwidth as it does between real hosts.
    pub link_rate_mbit: Option<u32>,
    /// With `netns`: every client host's link rate each way ([`LocalCluster::mount_on`]).
    pub client_link_rate_mbit: Option<u32>,
    /// Every connection in TLS, with a CA and certificate made by `weft certgen` in the
    /// cluster's directory (`tls/`, beside the key, where mounts and tools find it).
    pub tls: bool,
    /// Extra environment of services from their first start, `(service, key, value)`, e.g.
    /// `("storage-1", "WEFT_FAILPOINTS", "…")`; [`LocalCluster::set_env`] changes it later.
    pub env: Vec<(String, String, String)>,
}

impl Default for ClusterSpec {
    fn default() -> Self {
        ClusterSpec {
            meta: 1,
            storage: 2,
            targets_per_storage: 2,
            crash_test: false,
            target_capacity_bytes: None,
            settings: Vec::new(),
            storage_settings: Vec::new(),
            meta_settings: Vec::new(),
            mgmt_settings: Vec::new(),
            mgmt_replicas: 1,
            netns: false,
            rails: 1,
            link_rate_mbit: None,
            client_link_rate_mbit: None,
            tls: false,
            env: Vec::new(),
        }
    }
}

struct Service {
    args: Vec<String>,
    /// Extra environment, e.g. armed fault-injection points.
    env: Vec<(String, String)>,
    child: Option<Child>,
}

/// A running local cluster. Dropping it stops every process and unmounts every mount.
pub struct LocalCluster {
    binary: PathBuf,
    root: tempfile::TempDir,
    mgmt: String,
    spec: ClusterSpec,
    services: BTreeMap<String, Service>,
    mounts: Vec<(PathBuf, Child)>,
    /// Mounts started so far: names mount points and logs uniquely.
    mounts_started: usize,
    /// The namespaces of the services, when the spec asks for them; dropped after them.
    network: Option<netns::Network>,
}

/// The names of `replicas` management servers: `mgmt` alone, `mgmt-1`, `mgmt-2`, … when
/// replicated.
fn mgmt_names(replicas: usize) -> Vec<String> {
    match replicas {
        0 | 1 => vec!["mgmt".to_string()],
        count => (1..=count).map(|index| format!("mgmt-{index}")).collect(),
    }
}

impl LocalCluster {
    /// Starts management, metadata and storage processes and waits until all registered.
    ///
    /// # Errors
    /// When a process cannot start or the cluster does not come up in time.
    pub fn start(binary: &Path, spec: ClusterSpec) -> Result<LocalCluster> {
        let root = tempfile::Builder::new().prefix("weft-test-").tempdir()?;
        // Non-root test users must reach the mount points inside.
        fs::set_permissions(
            root.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        fs::create_dir_all(root.path().join("logs"))?;
        let mut network = if spec.netns {
            Some(netns::Network::create(spec.rails)?)
        } else {
            None
        };
        // In namespaces every service has an address of its own, so ports can be fixed.
        let mut listen = |service: &str, host: u8, port: u16| -> Result<String> {
            match network.as_mut() {
                Some(network) => Ok(network
                    .add(service, host, spec.link_rate_mbit)?
                    .iter()
                    .map(|address| format!("{address}:{port}"))
                    .collect::<Vec<_>>()
                    .join(",")),
                None if service.starts_with("mgmt") => Ok(format!("127.0.0.1:{}", free_port()?)),
                None => Ok("127.0.0.1:0".to_string()),
            }
        };
        let mgmt_names = mgmt_names(spec.mgmt_replicas);
        let mgmt_listen: Vec<String> = mgmt_names
            .iter()
            .enumerate()
            .map(|(index, name)| listen(name, 2 + index as u8, 7000))
            .collect::<Result<_>>()?;
        let mgmt = mgmt_listen.join(";");
        let meta_listen: Vec<String> = (1..=spec.meta)
            .map(|index| listen(&format!("meta-{index}"), 10 + index as u8, 7001))
            .collect::<Result<_>>()?;
        let storage_listen: Vec<String> = (1..=spec.storage)
            .map(|index| listen(&format!("storage-{index}"), 40 + index as u8, 7002))
            .collect::<Result<_>>()?;
        let mut cluster = LocalCluster {
            binary: binary.to_path_buf(),
            root,
            mgmt: mgmt.clone(),
            spec: spec.clone(),
            services: BTreeMap::new(),
            mounts: Vec::new(),
            mounts_started: 0,
            network,
        };
        cluster.make_keys()?;
        cluster.start_mgmt(&mgmt_names, &mgmt_listen)?;
        for (index, listen) in (1..=spec.meta).zip(meta_listen) {
            cluster.start_meta(index, listen)?;
        }
        for (index, listen) in (1..=spec.storage).zip(storage_listen) {
            cluster.start_storage(index, listen)?;
        }
        cluster.wait_ready()?;
        Ok(cluster)
    }

    /// Makes the cluster's key, which every process of the cluster and every tool run
    /// against it holds, and its TLS files when the spec asks for TLS.
    fn make_keys(&self) -> Result<()> {
        let key_file = self.key_file();
        let keygen = self.weft(&["keygen", &key_file.display().to_string()])?;
        if !keygen.status.success() {
            bail!(
                "weft keygen failed: {}",
                String::from_utf8_lossy(&keygen.stderr)
            );
        }
        if self.spec.tls {
            let made = self.weft(&["certgen", &self.tls_dir().display().to_string()])?;
            if !made.status.success() {
                bail!(
                    "weft certgen failed: {}",
                    String::from_utf8_lossy(&made.stderr)
                );
            }
        }
        Ok(())
    }

    fn data_dir(&self, name: &str) -> Result<PathBuf> {
        let dir = self.root.path().join("data").join(name);
        fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    /// Starts management's servers, `names` listening at `listen`.
    fn start_mgmt(&mut self, names: &[String], listen: &[String]) -> Result<()> {
        for (index, name) in names.iter().enumerate() {
            let mgmt_dir = self.data_dir(name)?;
            let mut args: Vec<String> = vec![
                "serve".into(),
                "mgmt".into(),
                "--data-dir".into(),
                mgmt_dir.display().to_string(),
                "--listen".into(),
                listen[index].clone(),
                "--set".into(),
                "node_offline_timeout_ms=4000".into(),
                "--set".into(),
                "session_timeout_ms=3000".into(),
                "--set".into(),
                "rename_lock_lease_ms=2000".into(),
                "--set".into(),
                "stats_interval_ms=500".into(),
                "--set".into(),
                "mirror_promotion_timeout_ms=3000".into(),
            ];
            if names.len() > 1 {
                args.extend([
                    "--set".into(),
                    format!("replicas={listen:?}"),
                    "--set".into(),
                    format!("replica={}", index + 1),
                ]);
            }
            args.extend(settings(&self.spec.mgmt_settings));
            self.add_service(name, args)?;
        }
        Ok(())
    }

    /// Starts metadata server `index`, listening at `listen`, and waits until it registered:
    /// one at a time, so that meta-N is metadata node N (meta-1 holds the root).
    fn start_meta(&mut self, index: usize, listen: String) -> Result<()> {
        let name = format!("meta-{index}");
        let dir = self.data_dir(&name)?;
        let mut args = self.server_args(("meta", &name), &dir, listen);
        args.extend([
            "--set".into(),
            "lock_grace_ms=2000".into(),
            // Deterministic placement, so tests know directories spread.
            "--set".into(),
            "directory_chooser=\"roundrobin\"".into(),
        ]);
        args.extend(settings(&self.spec.meta_settings));
        self.add_service(&name, args)?;
        self.wait_registered(&name)
    }

    /// The arguments every metadata or storage server of the cluster starts with: `kind`
    /// and `name`, its data directory, where it listens, management, a fast heartbeat.
    fn server_args(&self, (kind, name): (&str, &str), dir: &Path, listen: String) -> Vec<String> {
        vec![
            "serve".into(),
            kind.into(),
            "--data-dir".into(),
            dir.display().to_string(),
            "--listen".into(),
            listen,
            "--mgmt".into(),
            self.mgmt.clone(),
            "--set".into(),
            "heartbeat_interval_ms=300".into(),
            "--set".into(),
            format!("alias={name}"),
        ]
    }

    /// Starts storage server `index`, listening at `listen`, and waits until its targets
    /// registered: one server's at a time, so storage-N holds targets
    /// (N-1)*targets_per_storage+1 ..= N*targets_per_storage, in --target order.
    fn start_storage(&mut self, index: usize, listen: String) -> Result<()> {
        let name = format!("storage-{index}");
        let dir = self.data_dir(&name)?;
        let mut args = self.server_args(("storage", &name), &dir, listen);
        for target in 1..=self.spec.targets_per_storage {
            let target_dir = dir.join(format!("target-{target}"));
            fs::create_dir_all(&target_dir)?;
            args.push("--target".into());
            args.push(target_dir.display().to_string());
        }
        if self.spec.crash_test {
            args.extend(["--set".into(), "crash_test_discard_unsynced=true".into()]);
        }
        if let Some(capacity) = self.spec.target_capacity_bytes {
            args.extend(["--set".into(), format!("target_capacity_bytes={capacity}")]);
        }
        args.extend(settings(&self.spec.storage_settings));
        self.add_service(&name, args)?;
        self.wait_registered(&name)?;
        self.wait_targets(index * self.spec.targets_per_storage)
    }

    fn add_service(&mut self, name: &str, mut args: Vec<String>) -> Result<()> {
        args.extend([
            "--set".to_string(),
            format!("auth_key_file={:?}", self.key_file().display().to_string()),
        ]);
        if self.spec.tls {
            let dir = self.tls_dir();
            for (key, file) in [
                ("tls_cert_file", "cert.pem"),
                ("tls_key_file", "cert.key"),
                ("tls_ca_file", "ca.pem"),
            ] {
                args.extend([
                    "--set".to_string(),
                    format!("{key}={:?}", dir.join(file).display().to_string()),
                ]);
            }
        }
        for setting in &self.spec.settings {
            args.extend(["--set".to_string(), setting.clone()]);
        }
        let env = self
            .spec
            .env
            .iter()
            .filter(|(service, _, _)| service == name)
            .map(|(_, key, value)| (key.clone(), value.clone()))
            .collect();
        self.services.insert(
            name.to_string(),
            Service {
                args,
                env,
                child: None,
            },
        );
        self.start_service(name)
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.root.path().join("logs").join(format!("{name}.log"))
    }

    /// Starts the binary as `name` (its log's name) in the network namespace of `host` (a
    /// service or a client host; the host's own network when it has none).
    fn spawn_logged(
        &self,
        name: &str,
        host: &str,
        args: &[String],
        env: &[(String, String)],
    ) -> Result<Child> {
        let mut command = match &self.network {
            Some(network) => network.command(host, &self.binary),
            None => Command::new(&self.binary),
        };
        command
            .args(args)
            .env("WEFT_KEY_FILE", self.key_file())
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("WEFT_LOG", "info");
        support::spawn_apart(command, self.log_path(name))
            .with_context(|| format!("cannot start {name}"))
    }

    fn start_service(&mut self, name: &str) -> Result<()> {
        let service = self
            .services
            .get(name)
            .ok_or_else(|| anyhow!("no service {name}"))?;
        let (args, env) = (service.args.clone(), service.env.clone());
        let child = self.spawn_logged(name, name, &args, &env)?;
        self.services.get_mut(name).expect("checked above").child = Some(child);
        Ok(())
    }

    /// Management's address: every management server's, separated by `;`, when replicated.
    pub fn mgmt(&self) -> &str {
        &self.mgmt
    }

    /// The management server that leads a replicated management now (`mgmt-2`): the one that
    /// answers; waits while none does (an election).
    ///
    /// # Errors
    /// When none leads within [`WAIT_DEADLINE`].
    pub fn mgmt_leader(&self) -> Result<String> {
        let names = mgmt_names(self.spec.mgmt_replicas);
        let mut leader = None;
        wait_until("a management server that leads", || {
            leader = names.iter().find(|name| {
                self.address_of(name).is_ok_and(|address| {
                    self.weft(&["node", "list", "--mgmt", &address])
                        .is_ok_and(|output| output.status.success())
                })
            });
            leader.is_some()
        })?;
        Ok(leader.expect("found").clone())
    }

    /// The address of every service, management first, as management lists them.
    ///
    /// # Errors
    /// When management cannot be asked.
    pub fn service_addresses(&self) -> Result<Vec<String>> {
        let output = self.weft(&["node", "list", "--mgmt", &self.mgmt])?;
        let mut addresses: Vec<String> = self.mgmt.split(';').map(str::to_string).collect();
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() >= 4 && fields[0].parse::<u32>().is_ok() {
                addresses.push(fields[3].trim_end_matches(',').to_string());
            }
        }
        Ok(addresses)
    }

    /// The cluster key file every service, mount and tool of this cluster uses.
    pub fn key_file(&self) -> PathBuf {
        self.root.path().join("cluster.key")
    }

    /// Where the cluster's TLS CA and certificate are, with [`ClusterSpec::tls`].
    pub fn tls_dir(&self) -> PathBuf {
        self.root.path().join("tls")
    }

    /// The temporary directory holding data, logs and mount points.
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// The data directory (metadata target) of metadata server `meta` (1-based).
    pub fn meta_dir(&self, meta: usize) -> PathBuf {
        self.root.path().join("data").join(format!("meta-{meta}"))
    }

    /// The directory of storage target `target` (1-based) of storage server `storage`.
    pub fn target_dir(&self, storage: usize, target: usize) -> PathBuf {
        self.root
            .path()
            .join("data")
            .join(format!("storage-{storage}"))
            .join(format!("target-{target}"))
    }

    /// Runs the CLI against this cluster's management; returns its output.
    ///
    /// # Errors
    /// When the binary cannot run.
    pub fn weft(&self, args: &[&str]) -> Result<Output> {
        let mut command = Command::new(&self.binary);
        command
            .args(args)
            .env("WEFT_KEY_FILE", self.key_file())
            .env("WEFT_LOG", "warn");
        Ok(output_apart(command)?)
    }

    /// Waits until management lists the node with alias `name`.
    fn wait_registered(&self, name: &str) -> Result<()> {
        wait_until(&format!("{name} to register"), || {
            let Ok(output) = self.weft(&["node", "list", "--mgmt", &self.mgmt]) else {
                return false;
            };
            String::from_utf8_lossy(&output.stdout)
                .lines()
                .any(|line| line.split_whitespace().nth(1) == Some(name))
        })
    }

    fn wait_targets(&self, count: usize) -> Result<()> {
        wait_until(&format!("{count} targets to register"), || {
            let Ok(output) = self.weft(&["target", "list", "--mgmt", &self.mgmt]) else {
                return false;
            };
            String::from_utf8_lossy(&output.stdout)
                .lines()
                .filter(|line| {
                    line.split_whitespace()
                        .next()
                        .is_some_and(|id| id.parse::<u32>().is_ok())
                })
                .count()
                >= count
        })
    }

    /// Waits until every node registered and is online and every target is listed.
    ///
    /// # Errors
    /// When the cluster does not come up in time.
    pub fn wait_ready(&self) -> Result<()> {
        let targets = self.spec.storage * self.spec.targets_per_storage;
        let nodes = self.spec.meta + self.spec.storage;
        wait_until("every node online", || {
            let Ok(output) = self.weft(&["node", "list", "--mgmt", &self.mgmt]) else {
                return false;
            };
            let text = String::from_utf8_lossy(&output.stdout);
            text.lines()
                .filter(|line| line.contains(" online "))
                .count()
                >= nodes
        })?;
        wait_until("every target listed", || {
            let Ok(output) = self.weft(&["target", "list", "--state", "--mgmt", &self.mgmt]) else {
                return false;
            };
            let text = String::from_utf8_lossy(&output.stdout);
            text.lines()
                .filter(|line| line.contains(" online "))
                .count()
                >= targets
        })
    }

    /// Mounts the file system at a new directory; returns the mount point.
    ///
    /// # Errors
    /// When the mount does not come up in time.
    pub fn mount(&mut self) -> Result<PathBuf> {
        self.mount_with(&[])
    }

    /// Starts a `weft mount` with client config `settings` (`key=value`) on top of the test
    /// defaults.
    ///
    /// # Errors
    /// When the mount does not come up in time.
    pub fn mount_with(&mut self, settings: &[&str]) -> Result<PathBuf> {
        self.mount_with_env(settings, &[])
    }

    /// Mounts as [`LocalCluster::mount_with`] does, with `env` added to the `weft mount`
    /// process's environment (fault-injection points: `WEFT_FAILPOINTS`).
    ///
    /// # Errors
    /// When the mount does not come up in time.
    pub fn mount_with_env(&mut self, settings: &[&str], env: &[(&str, &str)]) -> Result<PathBuf> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect();
        let (mountpoint, _) = self.start_mount_on("", settings, &env)?;
        wait_until("the mount to answer", || {
            is_mounted(&mountpoint) && fs::read_dir(&mountpoint).is_ok()
        })?;
        Ok(mountpoint)
    }

    /// Starts a `weft mount` as [`LocalCluster::mount_with`] does, without waiting for it to
    /// answer; returns the mount point and the mount's name (for [`LocalCluster::log`] and
    /// [`LocalCluster::has_exited`]).
    ///
    /// # Errors
    /// When the process cannot be started.
    pub fn start_mount(&mut self, settings: &[&str]) -> Result<(PathBuf, String)> {
        self.start_mount_on("", settings, &[])
    }

    /// Mounts the file system from client host `host` (1, 2, …): a network namespace of its
    /// own with an address on every rail, as a compute node on the cluster's networks would
    /// be; the mount point is seen on this host as any other. Only for clusters started with
    /// `netns`.
    ///
    /// # Errors
    /// When the host's namespace cannot be made or the mount does not come up in time.
    pub fn mount_on(&mut self, host: usize, settings: &[&str]) -> Result<PathBuf> {
        let name = format!("client-{host}");
        let network = self
            .network
            .as_mut()
            .ok_or_else(|| anyhow!("client hosts need a cluster started with netns"))?;
        if !network.has(&name) {
            anyhow::ensure!(
                (1..=150).contains(&host),
                "client hosts are numbered 1 to 150"
            );
            let number = u8::try_from(100 + host).context("client host number")?;
            network.add(&name, number, self.spec.client_link_rate_mbit)?;
        }
        let (mountpoint, _) = self.start_mount_on(&name, settings, &[])?;
        wait_until("the mount to answer", || {
            is_mounted(&mountpoint) && fs::read_dir(&mountpoint).is_ok()
        })?;
        Ok(mountpoint)
    }

    fn start_mount_on(
        &mut self,
        host: &str,
        settings: &[&str],
        env: &[(String, String)],
    ) -> Result<(PathBuf, String)> {
        let mountpoint = self
            .root
            .path()
            .join(format!("mnt-{}", self.mounts_started + 1));
        fs::create_dir_all(&mountpoint)?;
        self.mounts_started += 1;
        let name = format!("mount-{}", self.mounts_started);
        let mut args = vec![
            "mount".into(),
            "--mgmt".into(),
            self.mgmt.clone(),
            "--set".into(),
            "heartbeat_interval_ms=300".into(),
        ];
        for setting in settings {
            args.push("--set".into());
            args.push((*setting).to_string());
        }
        args.push(mountpoint.display().to_string());
        let child = self.spawn_logged(&name, host, &args, env)?;
        self.mounts.push((mountpoint.clone(), child));
        Ok((mountpoint, name))
    }

    /// Unmounts a mount point cleanly (SIGTERM to its `weft mount`, which unmounts).
    ///
    /// # Errors
    /// When the mount process does not exit in time.
    pub fn unmount(&mut self, mountpoint: &Path) -> Result<()> {
        let Some(index) = self.mounts.iter().position(|(path, _)| path == mountpoint) else {
            bail!("{} is not mounted by this cluster", mountpoint.display())
        };
        let (path, mut child) = self.mounts.remove(index);
        terminate(&mut child)?;
        if is_mounted(&path) {
            lazy_unmount(&path);
        }
        Ok(())
    }

    /// Kills the `weft mount` process of a mount point with SIGKILL (a client crash) and
    /// detaches the dead mount.
    ///
    /// # Errors
    /// When the mount point is not mounted by this cluster.
    pub fn kill_mount(&mut self, mountpoint: &Path) -> Result<()> {
        let Some(index) = self.mounts.iter().position(|(path, _)| path == mountpoint) else {
            bail!("{} is not mounted by this cluster", mountpoint.display())
        };
        let (path, mut child) = self.mounts.remove(index);
        let _ = child.kill();
        let _ = child.wait();
        lazy_unmount(&path);
        Ok(())
    }

    /// Stops the `weft mount` process of a mount point with SIGSTOP (`paused`: a frozen
    /// machine, a long pause) or lets it go on with SIGCONT. While it is stopped, nothing this
    /// process does may touch the mount, or start a process that inherits a file of it.
    ///
    /// # Errors
    /// When the mount point is not mounted by this cluster.
    pub fn pause_mount(&self, mountpoint: &Path, paused: bool) -> Result<()> {
        let Some((_, child)) = self.mounts.iter().find(|(path, _)| path == mountpoint) else {
            bail!("{} is not mounted by this cluster", mountpoint.display())
        };
        let signal = if paused { libc::SIGSTOP } else { libc::SIGCONT };
        // SAFETY: kill(2) with a pid we own; at worst it fails with ESRCH.
        unsafe {
            libc::kill(child.id() as libc::pid_t, signal);
        }
        Ok(())
    }

    /// Kills a service with SIGKILL, as a crash or power loss would.
    ///
    /// # Errors
    /// When the service is unknown.
    pub fn kill(&mut self, name: &str) -> Result<()> {
        let service = self
            .services
            .get_mut(name)
            .ok_or_else(|| anyhow!("no service {name}"))?;
        if let Some(mut child) = service.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        Ok(())
    }

    /// Stops a service cleanly (SIGTERM, as an operator's stop), waiting until it exited.
    ///
    /// # Errors
    /// When the service is unknown, or did not exit within 20 s (it is then killed).
    pub fn stop(&mut self, name: &str) -> Result<()> {
        let service = self
            .services
            .get_mut(name)
            .ok_or_else(|| anyhow!("no service {name}"))?;
        match service.child.take() {
            Some(mut child) => terminate(&mut child),
            None => Ok(()),
        }
    }

    /// Sets the extra environment a service gets from its next (re)start on, e.g.
    /// `[("WEFT_FAILPOINTS", "mkdir-after-intent")]`; an empty list clears it.
    ///
    /// # Errors
    /// When the service is unknown.
    pub fn set_env(&mut self, name: &str, env: &[(&str, &str)]) -> Result<()> {
        let service = self
            .services
            .get_mut(name)
            .ok_or_else(|| anyhow!("no service {name}"))?;
        service.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Ok(())
    }

    /// Whether the `weft mount` serving `mountpoint` has exited.
    pub fn mount_has_exited(&mut self, mountpoint: &Path) -> bool {
        match self.mounts.iter_mut().find(|(path, _)| path == mountpoint) {
            Some((_, child)) => !matches!(child.try_wait(), Ok(None)),
            None => true,
        }
    }

    /// Whether a service's process has exited (for example at a fault-injection point).
    pub fn has_exited(&mut self, name: &str) -> bool {
        match self.services.get_mut(name).and_then(|s| s.child.as_mut()) {
            Some(child) => !matches!(child.try_wait(), Ok(None)),
            None => true,
        }
    }

    /// Starts a killed or stopped service again with the same data and arguments.
    ///
    /// # Errors
    /// When the process cannot start.
    pub fn restart(&mut self, name: &str) -> Result<()> {
        self.kill(name)?;
        self.start_service(name)
    }

    /// Takes a service's network link down (`up: false`), as a pulled cable would, or brings
    /// it back; the process keeps running. Only for clusters started with `netns`.
    ///
    /// # Errors
    /// When the cluster has no namespaces or `ip` fails.
    pub fn set_link(&self, name: &str, up: bool) -> Result<()> {
        self.network
            .as_ref()
            .ok_or_else(|| anyhow!("the cluster was started without network namespaces"))?
            .set_link(name, None, up)
    }

    /// Cuts the path between two services (`mgmt-1`, `mgmt-2`) on every rail, both ways
    /// (`up: false`), while each still reaches every other host; or mends it. Only for
    /// clusters started with `netns`.
    ///
    /// # Errors
    /// When the cluster has no namespaces or `ip` fails.
    pub fn set_path(&self, a: &str, b: &str, up: bool) -> Result<()> {
        self.network
            .as_ref()
            .ok_or_else(|| anyhow!("the cluster was started without network namespaces"))?
            .set_path(a, b, up)
    }

    /// Takes the link of a service or client host (`client-1`) on one rail (0, 1, …) down or
    /// brings it back; its other rails stay up.
    ///
    /// # Errors
    /// When the cluster has no namespaces or no such rail, or `ip` fails.
    pub fn set_rail(&self, name: &str, rail: usize, up: bool) -> Result<()> {
        self.network
            .as_ref()
            .ok_or_else(|| anyhow!("the cluster was started without network namespaces"))?
            .set_link(name, Some(rail), up)
    }

    /// Bytes carried so far, both ways, by the link of a service or client host on `rail`.
    ///
    /// # Errors
    /// When the cluster has no namespaces or the host no such link.
    pub fn rail_bytes(&self, name: &str, rail: usize) -> Result<u64> {
        self.network
            .as_ref()
            .ok_or_else(|| anyhow!("the cluster was started without network namespaces"))?
            .link_bytes(name, rail)
    }

    /// The process id of service `name`, while it runs.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.services
            .get(name)
            .and_then(|service| service.child.as_ref())
            .map(std::process::Child::id)
    }

    /// The address of service `name` (`mgmt`, `meta-1`, `storage-2`), as management lists it.
    ///
    /// # Errors
    /// When management cannot be asked or does not list it.
    pub fn address_of(&self, name: &str) -> Result<String> {
        if name == "mgmt" {
            return Ok(self.mgmt.clone());
        }
        if let Some(index) = name
            .strip_prefix("mgmt-")
            .and_then(|index| index.parse::<usize>().ok())
        {
            return self
                .mgmt
                .split(';')
                .nth(index.wrapping_sub(1))
                .map(str::to_string)
                .ok_or_else(|| anyhow!("no management server {name}"));
        }
        let output = self.weft(&["node", "list", "--mgmt", &self.mgmt])?;
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|line| line.split_whitespace().collect::<Vec<_>>())
            .find(|fields| fields.len() >= 4 && fields[1] == name)
            .map(|fields| fields[3].trim_end_matches(',').to_string())
            .ok_or_else(|| anyhow!("management does not list {name}"))
    }

    /// Names of all services, e.g. `mgmt`, `meta-1`, `storage-2`.
    pub fn service_names(&self) -> Vec<String> {
        self.services.keys().cloned().collect()
    }

    /// The log of a service or mount, for assertions and failure reports.
    pub fn log(&self, name: &str) -> String {
        fs::read_to_string(self.log_path(name)).unwrap_or_default()
    }

    /// Prints the end of every log, and copies the whole logs into the directory
    /// `WEFT_TEST_KEEP_LOGS` names, if set (the cluster's own directory goes with it).
    /// The name of a log in which a process of the cluster panicked, if one did.
    fn log_with_a_panic(&self) -> Option<String> {
        let entries = fs::read_dir(self.root.path().join("logs")).ok()?;
        entries.flatten().find_map(|entry| {
            let text = fs::read_to_string(entry.path()).unwrap_or_default();
            text.contains("panicked at")
                .then(|| entry.file_name().to_string_lossy().into_owned())
        })
    }

    fn print_logs(&self) {
        let Ok(entries) = fs::read_dir(self.root.path().join("logs")) else {
            return;
        };
        let keep = std::env::var_os("WEFT_TEST_KEEP_LOGS").and_then(|keep| {
            let into = PathBuf::from(keep).join(
                self.root
                    .path()
                    .file_name()
                    .unwrap_or_else(|| std::ffi::OsStr::new("cluster")),
            );
            match fs::create_dir_all(&into) {
                Ok(()) => Some(into),
                Err(error) => {
                    eprintln!("cannot keep the logs in {}: {error}", into.display());
                    None
                }
            }
        });
        for entry in entries.flatten() {
            let text = fs::read_to_string(entry.path()).unwrap_or_default();
            if let Some(into) = &keep {
                if let Err(error) = fs::write(into.join(entry.file_name()), &text) {
                    eprintln!(
                        "cannot keep {} in {}: {error}",
                        entry.path().display(),
                        into.display()
                    );
                }
            }
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            eprintln!(
                "===== {} (last {} lines) =====",
                entry.path().display(),
                tail.len()
            );
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

fn terminate(child: &mut Child) -> Result<()> {
    // SAFETY: kill(2) with a pid we own; at worst it fails with ESRCH.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let started = Instant::now();
    loop {
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            bail!("process {} did not stop on SIGTERM", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.print_logs();
        }
        for (path, mut child) in std::mem::take(&mut self.mounts) {
            let _ = terminate(&mut child);
            if is_mounted(&path) {
                lazy_unmount(&path);
            }
        }
        let names: Vec<String> = self.services.keys().cloned().collect();
        for name in names {
            let _ = self.kill(&name);
        }
        // An assertion that fired in a server is a bug, even where its client got over it
        // (a request answered by another server, or tried again).
        if !std::thread::panicking() {
            if let Some(log) = self.log_with_a_panic() {
                self.print_logs();
                panic!("a process of the cluster panicked (see {log} above)");
            }
        }
    }
}

/// `--set` arguments of `settings`.
fn settings(settings: &[String]) -> impl Iterator<Item = String> + '_ {
    settings
        .iter()
        .flat_map(|setting| ["--set".to_string(), setting.clone()])
}
