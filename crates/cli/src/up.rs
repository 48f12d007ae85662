//! `weft up`: management, metadata and storage in this process, and a FUSE mount.

use crate::serve::{connect_and_mount, hold_mounts};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use weft_client::{Client, ClientConfig};
use weft_proto::messages::NodeKind;
use weft_proto::InodeId;

/// Longest wait for the local services to come up.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Args)]
pub struct UpArgs {
    /// Where every service keeps its data (created if missing).
    #[arg(long, default_value = "weft-data")]
    data_dir: PathBuf,
    /// Where to mount the file system (created if missing).
    #[arg(long, default_value = "weft-mnt")]
    mountpoint: PathBuf,
    /// Storage servers to run.
    #[arg(long, default_value_t = 1)]
    storage_servers: usize,
    /// Storage targets per storage server.
    #[arg(long, default_value_t = 4)]
    targets_per_server: usize,
    /// Storage servers read and write object data with O_DIRECT (config key `direct_io`).
    #[arg(long)]
    direct_io: bool,
    /// Without --direct-io: writes of at least this many bytes, 4 KiB-aligned, skip the
    /// storage servers' page cache (config key `direct_write_min_bytes`; 0: never).
    #[arg(long, default_value_t = 256 << 10)]
    direct_write_min_bytes: u64,
    /// Metadata servers to run.
    #[arg(long, default_value_t = 1)]
    meta_servers: usize,
    /// Bytes of a metadata server's change log between checkpoints of its tables; 0 commits
    /// every batch of changes to the tables (config key `checkpoint_bytes`).
    #[arg(long, default_value_t = weft_meta::config::CHECKPOINT_BYTES_DEFAULT)]
    checkpoint_bytes: u64,
    /// Metadata servers answer a client's change only once it is on disk (config key
    /// `sync_every_change = true`), not as soon as it is made and logged, the client keeping
    /// it until it is on disk and replaying it after a restart.
    #[arg(long)]
    sync_every_change: bool,
    /// Every connection in TLS, with a CA and a certificate made in the data directory
    /// (`tls/`) on the first start.
    #[arg(long)]
    tls: bool,
    /// Management's listening address (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    mgmt_listen: String,
}

type ServiceTask = JoinHandle<Result<()>>;

async fn local_listener() -> Result<(TcpListener, String)> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .context("cannot bind a local port")?;
    let address = listener.local_addr()?.to_string();
    Ok((listener, address))
}

fn prepare(directory: &std::path::Path) -> Result<PathBuf> {
    std::fs::create_dir_all(directory)
        .with_context(|| format!("cannot create {}", directory.display()))?;
    Ok(crate::absolute(directory))
}

pub fn run(args: UpArgs) -> Result<()> {
    if args.meta_servers == 0 || args.meta_servers > 64 {
        bail!(
            "--meta-servers {}: run between 1 and 64 metadata servers",
            args.meta_servers
        );
    }
    if args.storage_servers == 0 || args.targets_per_server == 0 {
        bail!("need at least one storage server with at least one target");
    }
    let runtime = crate::runtime()?;
    runtime.block_on(up(args))
}

async fn up(args: UpArgs) -> Result<()> {
    let data_dir = prepare(&args.data_dir)?;
    let key_file = cluster_key(&data_dir)?;
    let tls = args.tls.then(|| tls_files(&data_dir)).transpose()?;
    let secured = Secured {
        key_file: key_file.clone(),
        tls: tls.clone(),
    };
    weft_client::fuse::detach_stale_mount(&args.mountpoint)?;
    let mountpoint = prepare(&args.mountpoint)?;
    let (stop, stopped) = watch::channel(false);
    let shutdown = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }
    };
    let mut services: Vec<(String, ServiceTask)> = Vec::new();

    let mgmt_listener = TcpListener::bind(&args.mgmt_listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.mgmt_listen))?;
    let mgmt = mgmt_listener.local_addr()?.to_string();
    let config = secured.mgmt(prepare(&data_dir.join("mgmt"))?, mgmt.clone());
    let stopping = shutdown();
    services.push((
        "management".into(),
        tokio::spawn(
            async move { Ok(weft_mgmt::run(config, mgmt_listener.into(), stopping).await?) },
        ),
    ));

    let mut lines = vec![format!("  management   {mgmt}")];
    // Every service answers HTTP on its own port: /metrics for Prometheus.
    let mut endpoints = vec![format!("http://{mgmt}/metrics")];
    for index in 1..=args.meta_servers {
        let (listener, address) = local_listener().await?;
        let data_dir = prepare(&data_dir.join(format!("meta-{index}")))?;
        let config = secured.meta(&args, data_dir, (address.clone(), mgmt.clone()), index);
        lines.push(format!("  metadata     meta-{index} at {address}"));
        endpoints.push(format!("http://{address}/metrics"));
        let stopping = shutdown();
        services.push((
            format!("meta-{index}"),
            tokio::spawn(
                async move { Ok(weft_meta::run(config, listener.into(), stopping).await?) },
            ),
        ));
        // One at a time, so that meta-N registers as metadata node N on a new cluster.
        wait_until_ready(
            &client_config(&mgmt, &key_file, tls.as_ref()),
            &mut services,
            (index, 0),
            false,
        )
        .await?;
    }
    for index in 1..=args.storage_servers {
        let (listener, address) = local_listener().await?;
        let config = secured.storage(&args, &data_dir, (address.clone(), mgmt.clone()), index)?;
        lines.push(format!(
            "  storage      storage-{index} at {address}, {} targets",
            args.targets_per_server
        ));
        endpoints.push(format!("http://{address}/metrics"));
        let stopping = shutdown();
        services.push((
            format!("storage-{index}"),
            tokio::spawn(
                async move { Ok(weft_storage::run(config, listener.into(), stopping).await?) },
            ),
        ));
    }

    let client_config = client_config(&mgmt, &key_file, tls.as_ref());
    let expected_targets = args.storage_servers * args.targets_per_server;
    wait_until_ready(
        &client_config,
        &mut services,
        (args.meta_servers, expected_targets),
        true,
    )
    .await?;
    let mounted = connect_and_mount(&client_config, &mountpoint).await?;

    print_up(
        &data_dir,
        &secured,
        &mountpoint,
        &mgmt,
        (&lines, &endpoints),
    );

    hold_mounts(vec![mounted]).await?;
    let _ = stop.send(true);
    stop_all(services).await;
    println!("stopped");
    Ok(())
}

/// What `weft up` started, and where to look.
fn print_up(
    data_dir: &std::path::Path,
    secured: &Secured,
    mountpoint: &std::path::Path,
    mgmt: &str,
    (lines, endpoints): (&[String], &[String]),
) {
    println!("Weft is up.");
    println!("  data         {}", data_dir.display());
    println!("  cluster key  {}", secured.key_file.display());
    if let Some(tls) = &secured.tls {
        println!("  TLS CA       {}", tls.ca.display());
    }
    println!("  mounted at   {}", mountpoint.display());
    for line in lines {
        println!("{line}");
    }
    println!("  web page     http://{mgmt}/");
    for (index, endpoint) in endpoints.iter().enumerate() {
        let heading = if index == 0 { "metrics" } else { "" };
        println!("  {heading:<12} {endpoint}");
    }
    println!(
        "Try: weft entry info {}   ·   weft df --mgmt {mgmt}",
        mountpoint.display()
    );
    println!("Press Ctrl-C to unmount and stop.");
}

/// Waits for every service to stop, up to ten seconds each, and says which failed.
async fn stop_all(services: Vec<(String, ServiceTask)>) {
    for (name, task) in services {
        match tokio::time::timeout(Duration::from_secs(10), task).await {
            Ok(Ok(Err(error))) => eprintln!("weft: {name} stopped with an error: {error:#}"),
            Ok(Err(join)) => eprintln!("weft: {name} failed: {join}"),
            _ => {}
        }
    }
}

/// The cluster key and TLS files every service of a local cluster runs with.
struct Secured {
    key_file: PathBuf,
    tls: Option<weft_net::tls::TlsFiles>,
}

impl Secured {
    fn tls_file(&self, pick: fn(&weft_net::tls::TlsFiles) -> &PathBuf) -> Option<PathBuf> {
        self.tls.as_ref().map(pick).cloned()
    }

    /// Management's configuration: in `data_dir`, listening at `listen`.
    fn mgmt(&self, data_dir: PathBuf, listen: String) -> weft_mgmt::MgmtConfig {
        weft_mgmt::MgmtConfig {
            data_dir,
            listen,
            node_offline_timeout: weft_mgmt::config::NODE_OFFLINE_TIMEOUT_DEFAULT,
            session_timeout: weft_mgmt::config::SESSION_TIMEOUT_DEFAULT,
            rename_lock_lease: weft_mgmt::config::RENAME_LOCK_LEASE_DEFAULT,
            stats_interval: weft_mgmt::config::STATS_INTERVAL_DEFAULT,
            mirror_promotion_timeout: weft_mgmt::config::MIRROR_PROMOTION_TIMEOUT_DEFAULT,
            quota_grace_period: weft_mgmt::config::QUOTA_GRACE_PERIOD_DEFAULT,
            replicas: Vec::new(),
            replica: 0,
            web_details: false,
            sessions_per_client: weft_mgmt::config::SESSIONS_PER_CLIENT_DEFAULT,
            influxdb: None,
            metrics_listen: None,
            log: None,
            connections_max: weft_net::CONNECTIONS_MAX_DEFAULT,
            auth_key_file: Some(self.key_file.clone()),
            auth: None,
            tls_cert_file: self.tls_file(|files| &files.cert),
            tls_key_file: self.tls_file(|files| &files.key),
            tls_ca_file: self.tls_file(|files| &files.ca),
        }
    }

    /// Metadata server `index`'s configuration: in `data_dir`, listening at the first
    /// address, registering with management at the second.
    fn meta(
        &self,
        args: &UpArgs,
        data_dir: PathBuf,
        (listen, mgmt): (String, String),
        index: usize,
    ) -> weft_meta::MetaConfig {
        weft_meta::MetaConfig {
            data_dir,
            listen,
            mgmt,
            alias: Some(format!("meta-{index}")),
            target_chooser: weft_meta::TargetChooser::default(),
            directory_chooser: weft_meta::TargetChooser::default(),
            heartbeat_interval: weft_meta::config::HEARTBEAT_INTERVAL_DEFAULT,
            lock_grace: weft_meta::config::LOCK_GRACE_DEFAULT,
            rebalance_bytes_per_second: weft_meta::config::REBALANCE_BYTES_PER_SECOND_DEFAULT,
            rebalance_margin_percent: weft_meta::config::REBALANCE_MARGIN_PERCENT_DEFAULT,
            checkpoint_bytes: args.checkpoint_bytes,
            sync_every_change: args.sync_every_change,
            recovery_window: weft_meta::config::RECOVERY_WINDOW_DEFAULT,
            sync_delay_ms: None,
            names_lease: weft_meta::config::NAMES_LEASE_DEFAULT,
            influxdb: None,
            metrics_listen: None,
            log: None,
            connections_max: weft_net::CONNECTIONS_MAX_DEFAULT,
            auth_key_file: Some(self.key_file.clone()),
            auth: None,
            tls_cert_file: self.tls_file(|files| &files.cert),
            tls_key_file: self.tls_file(|files| &files.key),
            tls_ca_file: self.tls_file(|files| &files.ca),
        }
    }

    /// Storage server `index`'s configuration, its targets made under `data_dir`: listening
    /// at the first address, registering with management at the second.
    fn storage(
        &self,
        args: &UpArgs,
        data_dir: &std::path::Path,
        (listen, mgmt): (String, String),
        index: usize,
    ) -> Result<weft_storage::StorageConfig> {
        let node_dir = prepare(&data_dir.join(format!("storage-{index}")))?;
        let targets = (1..=args.targets_per_server)
            .map(|t| prepare(&node_dir.join(format!("target-{t}"))))
            .collect::<Result<Vec<_>>>()?;
        Ok(weft_storage::StorageConfig {
            data_dir: node_dir,
            targets,
            listen,
            mgmt,
            alias: Some(format!("storage-{index}")),
            heartbeat_interval: std::time::Duration::from_secs(2),
            target_capacity_bytes: None,
            crash_test_discard_unsynced: false,
            direct_io: args.direct_io,
            direct_write_min_bytes: args.direct_write_min_bytes,
            influxdb: None,
            metrics_listen: None,
            log: None,
            connections_max: weft_net::CONNECTIONS_MAX_DEFAULT,
            auth_key_file: Some(self.key_file.clone()),
            auth: None,
            tls_cert_file: self.tls_file(|files| &files.cert),
            tls_key_file: self.tls_file(|files| &files.key),
            tls_ca_file: self.tls_file(|files| &files.ca),
        })
    }
}

/// The cluster key in `data_dir`, made on the first start.
fn cluster_key(data_dir: &std::path::Path) -> Result<PathBuf> {
    let file = data_dir.join("cluster.key");
    if !file.exists() {
        weft_net::auth::write_new_key(&file).map_err(anyhow::Error::msg)?;
    }
    Ok(file)
}

/// The CA and certificate in `data_dir/tls`, made on the first start with `--tls`.
fn tls_files(data_dir: &std::path::Path) -> Result<weft_net::tls::TlsFiles> {
    let dir = data_dir.join("tls");
    let files = weft_net::tls::TlsFiles::in_dir(&dir);
    if files.cert.exists() {
        return Ok(files);
    }
    weft_net::tls::write_new_ca(&dir).map_err(anyhow::Error::msg)
}

/// A client config for the local cluster.
fn client_config(
    mgmt: &str,
    key_file: &std::path::Path,
    tls: Option<&weft_net::tls::TlsFiles>,
) -> ClientConfig {
    let mut config = ClientConfig::new(mgmt);
    config.auth_key_file = Some(key_file.to_path_buf());
    if let Some(tls) = tls {
        config.tls_cert_file = Some(tls.cert.clone());
        config.tls_key_file = Some(tls.key.clone());
        config.tls_ca_file = Some(tls.ca.clone());
    }
    config
}

/// Polls until every service registered and the root directory answers; fails early with the
/// error of a service that stopped.
/// Waits until management lists `meta` metadata nodes and `targets` storage targets, and with
/// `root`, until the root directory answers; fails when a service stops meanwhile.
async fn wait_until_ready(
    config: &ClientConfig,
    services: &mut [(String, ServiceTask)],
    (meta, targets): (usize, usize),
    root: bool,
) -> Result<()> {
    let started = Instant::now();
    let view = weft_net::ClusterView::new(
        config.mgmt.clone(),
        weft_net::RpcClientOptions {
            auth: config.auth().map_err(anyhow::Error::msg)?,
            ..weft_net::RpcClientOptions::default()
        },
    );
    loop {
        for (name, task) in services.iter_mut() {
            if task.is_finished() {
                let outcome = task.await;
                return Err(match outcome {
                    Ok(Err(error)) => error.context(format!("{name} failed to start")),
                    Ok(Ok(())) => anyhow!("{name} stopped during start-up"),
                    Err(join) => anyhow!("{name} crashed during start-up: {join}"),
                });
            }
        }
        if let Ok(map) = view.refresh().await {
            let metas = map
                .nodes
                .iter()
                .filter(|n| n.kind == NodeKind::Meta)
                .count();
            if metas >= meta && map.targets.len() >= targets {
                if !root {
                    return Ok(());
                }
                if let Ok(client) = Client::connect(config).await {
                    if client.get_attr(InodeId::ROOT).await.is_ok() {
                        return Ok(());
                    }
                }
            }
        }
        if started.elapsed() > STARTUP_TIMEOUT {
            bail!("the local cluster did not come up within {STARTUP_TIMEOUT:?}; run with --log debug to see why");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
