//! `weft serve` and `weft mount`.

use crate::signals::terminated;
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use weft_client::fuse::{mount as fuse_mount, Mounted, WeftFs};
use weft_client::{Client, ClientConfig};

#[derive(Clone, Copy, ValueEnum)]
pub enum Role {
    Mgmt,
    Meta,
    Storage,
}

#[derive(Args)]
pub struct ServeArgs {
    /// Which service to run.
    role: Role,
    /// TOML config file; unknown keys are rejected.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Any config key as key=value (repeatable); wins over the file.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Config key `data_dir`.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Config key `listen`.
    #[arg(long)]
    listen: Option<String>,
    /// Config key `mgmt` (metadata and storage).
    #[arg(long)]
    mgmt: Option<String>,
    /// Config key `targets` (storage; repeatable).
    #[arg(long = "target")]
    targets: Vec<PathBuf>,
}

fn overrides(args: &ServeArgs) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let quote = |text: &str| toml::Value::String(text.to_string()).to_string();
    if let Some(dir) = &args.data_dir {
        out.push((
            "data_dir".into(),
            quote(&crate::absolute(dir).display().to_string()),
        ));
    }
    if let Some(listen) = &args.listen {
        out.push(("listen".into(), quote(listen)));
    }
    if let Some(mgmt) = &args.mgmt {
        out.push(("mgmt".into(), quote(mgmt)));
    }
    if !args.targets.is_empty() {
        let list: Vec<String> = args
            .targets
            .iter()
            .map(|t| quote(&crate::absolute(t).display().to_string()))
            .collect();
        out.push(("targets".into(), format!("[{}]", list.join(", "))));
    }
    for item in &args.set {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| anyhow!("--set {item:?}: expected KEY=VALUE"))?;
        out.push((key.trim().to_string(), value.trim().to_string()));
    }
    Ok(out)
}

fn load<T: DeserializeOwned>(args: &ServeArgs) -> Result<T> {
    Ok(weft_service::config::load(
        args.config.as_deref(),
        &overrides(args)?,
    )?)
}

async fn bind(listen: &str) -> Result<weft_net::Listeners> {
    weft_net::Listeners::bind(listen).await.map_err(|error| {
        anyhow!(
            "{error}: pick free addresses with --listen HOST:PORT (or several, comma-separated: \
             one per rail)"
        )
    })
}

pub fn serve(args: ServeArgs) -> Result<()> {
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        let shutdown = async {
            if let Ok(signal) = terminated().await {
                tracing::info!(signal, "stopping");
            }
        };
        match args.role {
            Role::Mgmt => {
                let config: weft_mgmt::MgmtConfig = load(&args)?;
                crate::configure_log(config.log.as_deref())?;
                config
                    .validate()
                    .map_err(|problems| anyhow!("invalid configuration:\n{problems}"))?;
                let listener = bind(&config.listen).await?;
                weft_mgmt::run(config, listener, shutdown).await?;
            }
            Role::Meta => {
                let config: weft_meta::MetaConfig = load(&args)?;
                crate::configure_log(config.log.as_deref())?;
                config
                    .validate()
                    .map_err(|problems| anyhow!("invalid configuration:\n{problems}"))?;
                let listener = bind(&config.listen).await?;
                weft_meta::run(config, listener, shutdown).await?;
            }
            Role::Storage => {
                let config: weft_storage::StorageConfig = load(&args)?;
                crate::configure_log(config.log.as_deref())?;
                config
                    .validate()
                    .map_err(|problems| anyhow!("invalid configuration:\n{problems}"))?;
                let listener = bind(&config.listen).await?;
                weft_storage::run(config, listener, shutdown).await?;
            }
        }
        Ok(())
    })
}

#[derive(Args)]
pub struct MountArgs {
    /// Management address, HOST:PORT; several management servers separated by `;`.
    #[arg(long)]
    mgmt: Option<String>,
    /// Client config file (TOML); `mgmt` may be set there.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Any client config key as key=value (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// The cluster key file; by default the config's `auth_key_file`, then WEFT_KEY_FILE, then
    /// the key of the local `weft up` cluster, then /etc/weft/cluster.key.
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// A mounts file: one `<mountpoint> <client config file>` per line; mounts them all.
    #[arg(long, conflicts_with_all = ["mgmt", "config", "mountpoint"])]
    all: Option<PathBuf>,
    /// Where to mount.
    mountpoint: Option<PathBuf>,
}

/// What the command line says of a mount's client config: a config file, management's
/// address, the key file, and `--set KEY=VALUE` overrides.
struct ClientArgs<'a> {
    file: Option<&'a Path>,
    mgmt: Option<&'a str>,
    key_file: Option<&'a Path>,
    set: &'a [String],
}

fn client_config(args: ClientArgs<'_>) -> Result<ClientConfig> {
    let ClientArgs {
        file,
        mgmt,
        key_file,
        set,
    } = args;
    let mut overrides = Vec::new();
    if let Some(mgmt) = mgmt {
        overrides.push((
            "mgmt".to_string(),
            toml::Value::String(mgmt.to_string()).to_string(),
        ));
    }
    for item in set {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| anyhow!("--set {item:?}: expected KEY=VALUE"))?;
        overrides.push((key.trim().to_string(), value.trim().to_string()));
    }
    let mut config: ClientConfig = weft_service::config::load(file, &overrides)
        .map_err(|error| anyhow!("{error} (give the management address with --mgmt HOST:PORT)"))?;
    if key_file.is_some() || (config.auth_key_file.is_none() && config.auth.is_none()) {
        config =
            crate::admin::Cluster::at(config.mgmt.clone(), key_file).client_config_from(config);
    }
    Ok(config)
}

/// Parses a mounts file: `<mountpoint> <client config>` per line, `#` comments.
pub fn parse_mounts_file(path: &Path) -> Result<Vec<(PathBuf, PathBuf)>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read mounts file {}", path.display()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let mut mounts = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [mountpoint, config] = fields[..] else {
            bail!(
                "{}:{}: expected `<mountpoint> <client config file>`, found {line:?}",
                path.display(),
                number + 1
            );
        };
        mounts.push((PathBuf::from(mountpoint), base.join(config)));
    }
    if mounts.is_empty() {
        bail!("mounts file {} lists no file system", path.display());
    }
    Ok(mounts)
}

/// A mount this process serves, and the link through which the admin commands run inside it
/// find its key.
pub struct Mount {
    mounted: Mounted,
    /// The link, and the key file it points to.
    key_link: Option<(PathBuf, PathBuf)>,
}

/// Connects a client and mounts it.
pub async fn connect_and_mount(config: &ClientConfig, mountpoint: &Path) -> Result<Mount> {
    let client: Arc<Client> = Client::connect(config)
        .await
        .map_err(|error| crate::admin::not_reached(&error, &config.mgmt))?;
    // A mount that cannot reach its root would answer EIO: wait for the cluster instead.
    client
        .wait_for_root(config.mount_wait, |why| {
            eprintln!(
                "waiting for a metadata server to answer for the root at {} ({why}); \
                 giving up after {:?}",
                mountpoint.display(),
                config.mount_wait
            );
        })
        .await?;
    let fs = WeftFs::new(
        client,
        tokio::runtime::Handle::current(),
        config.attr_cache,
        config.writeback_cache,
    );
    let mounted = fuse_mount(fs, mountpoint, &config.mgmt, config.fuse_threads)?;
    // A client key proves only its client's name: the admin commands of this host would be
    // refused what members do with it, so it is not offered to them.
    let cluster_key = config.auth().is_ok_and(|auth| auth.client_name().is_none());
    let key_link = config
        .auth_key_file
        .as_deref()
        .filter(|_| cluster_key)
        .and_then(|key_file| link_key(&config.mgmt, key_file));
    Ok(Mount { mounted, key_link })
}

/// Leaves a link to the key where the admin commands look for the key of a cluster mounted
/// here ([`weft_net::auth::local_cluster_key`]); `None` when it cannot (they then need
/// --key-file).
fn link_key(mgmt: &str, key_file: &Path) -> Option<(PathBuf, PathBuf)> {
    let link = weft_net::auth::local_cluster_key(mgmt);
    let key_file = crate::absolute(key_file);
    let made = weft_net::auth::private_key_dir().and_then(|dir| {
        // Links of mounts that were killed point at keys that are gone: clear them.
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.path().is_symlink() && !entry.path().exists() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&key_file, &link)
            .map_err(|error| format!("cannot link {}: {error}", link.display()))
    });
    match made {
        Ok(()) => Some((link, key_file)),
        Err(error) => {
            tracing::warn!(%error, "cannot leave a link to the cluster key for the admin commands: give them --key-file");
            None
        }
    }
}

/// Waits for a signal or for every mount to be unmounted from outside, then unmounts the rest.
pub async fn hold_mounts(mounts: Vec<Mount>) -> Result<()> {
    let all_gone = async {
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            if mounts.iter().all(|mount| mount.mounted.is_finished()) {
                return;
            }
        }
    };
    tokio::select! {
        signal = terminated() => { tracing::info!(signal = signal?, "unmounting"); }
        () = all_gone => { tracing::info!("unmounted from outside; stopping"); }
    }
    for Mount { mounted, key_link } in mounts {
        // Only a link that is still this mount's: another mount of the cluster may have
        // replaced it since.
        if let Some((link, key_file)) = key_link {
            if std::fs::read_link(&link).is_ok_and(|target| target == key_file) {
                let _ = std::fs::remove_file(link);
            }
        }
        let path = mounted.mountpoint().display().to_string();
        mounted
            .unmount()
            .with_context(|| format!("unmount {path}"))?;
        println!("unmounted {path}");
    }
    Ok(())
}

pub fn mount(args: MountArgs) -> Result<()> {
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        let mut mounts = Vec::new();
        if let Some(file) = &args.all {
            for (mountpoint, config_file) in parse_mounts_file(file)? {
                let config = client_config(ClientArgs {
                    file: Some(&config_file),
                    mgmt: None,
                    key_file: args.key_file.as_deref(),
                    set: &[],
                })?;
                mounts.push(connect_and_mount(&config, &mountpoint).await?);
                println!("mounted weft@{} at {}", config.mgmt, mountpoint.display());
            }
        } else {
            let mountpoint = args.mountpoint.clone().ok_or_else(|| {
                anyhow!("give a mount point: weft mount --mgmt HOST:PORT MOUNTPOINT")
            })?;
            let config = client_config(ClientArgs {
                file: args.config.as_deref(),
                mgmt: args.mgmt.as_deref(),
                key_file: args.key_file.as_deref(),
                set: &args.set,
            })?;
            mounts.push(connect_and_mount(&config, &mountpoint).await?);
            println!("mounted weft@{} at {}", config.mgmt, mountpoint.display());
        }
        hold_mounts(mounts).await
    })
}
