//! Administration: `weft entry info|set|migrate` and `weft mkdir`, and what the other
//! commands share (finding the cluster from a path, sizes, a tree walk); nodes, targets and
//! `weft df` are `admin/nodes.rs`, `weft fsck` is `admin/fsck.rs`.

mod fsck;
mod nodes;

pub use fsck::{fsck, FsckArgs};
pub(crate) use nodes::reachability;
pub use nodes::{df, node, target, NodeCommand, TargetCommand};

use crate::MgmtLocator;
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use weft_client::{Client, ClientConfig, ClientError};
use weft_net::MetaCalls;
use weft_net::{ClusterView, RpcClientOptions};
use weft_proto::layout::{PatternKind, Slot, StripePattern};
use weft_proto::messages::{
    ClusterMap, FileKind, InodeAttr, MirrorKind, NodeKind, Reachability, SpaceUsage,
    DIR_SPREAD_XATTR,
};
use weft_proto::InodeId;
use weft_proto::TargetId;

#[derive(Subcommand)]
pub enum EntryCommand {
    /// Show an entry's type, id, metadata node and stripe pattern.
    Info {
        /// A file or directory inside a Weft mount.
        path: PathBuf,
        #[command(flatten)]
        locator: MgmtLocator,
    },
    /// Change a directory's stripe pattern for new files and subdirectories.
    Set(EntrySetArgs),
    /// Move a file, or every file of a tree, onto other targets while in use: into a storage
    /// pool (a tree's directories then send new files there too), or onto the targets named.
    /// Readers and writers go on; a crash of a server resumes the move.
    Migrate {
        /// The storage pool (name or id) to move into (`weft pool list`).
        #[arg(long)]
        pool: Option<String>,
        /// The targets to move one file onto, in stripe order (ids, comma separated; as many
        /// as the file is striped over; those it is on already stay).
        #[arg(long, value_name = "ID,ID,…")]
        targets: Option<String>,
        /// Restripe into chunks of this size (e.g. 1M), onto targets the file was never on.
        #[arg(long)]
        chunk_size: Option<String>,
        /// Restripe over this many targets, onto targets the file was never on.
        #[arg(long)]
        num_targets: Option<u16>,
        /// A file or directory inside a Weft mount.
        path: PathBuf,
        #[command(flatten)]
        locator: MgmtLocator,
    },
}

/// How new files of a directory place their chunks.
/// What `weft entry set` changes, and where.
#[derive(Args)]
pub struct EntrySetArgs {
    /// Chunk size: a power of two from 64K to 512M (suffixes K, M, G).
    #[arg(long)]
    chunk_size: Option<String>,
    /// Number of storage targets (mirror groups, for `mirrored`) per new file.
    #[arg(long)]
    num_targets: Option<u16>,
    /// `raid0`: each chunk on one target; `mirrored`: each chunk on every member of a
    /// storage mirror group (define them with `weft mirror create|autocreate storage`).
    #[arg(long, value_enum)]
    pattern: Option<PatternArg>,
    /// Spread every new subdirectory over this many metadata servers (inherited by the
    /// subdirectories; 0 or 1: not spread).
    #[arg(long)]
    spread: Option<u16>,
    /// The storage pool (name or id) new files go to (`weft pool list`).
    #[arg(long)]
    pool: Option<String>,
    /// A directory inside a Weft mount.
    path: PathBuf,
    #[command(flatten)]
    locator: MgmtLocator,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum PatternArg {
    /// Striped over targets, one copy of each chunk.
    Raid0,
    /// Striped over storage mirror groups, a copy of each chunk on every member.
    Mirrored,
}

/// `weft mkdir`: directories with placement a plain mkdir cannot ask for.
#[derive(Args)]
pub struct MkdirArgs {
    /// Spread the directory's entries over this many metadata servers by name hash (for
    /// directories of very many entries).
    #[arg(long, value_name = "K")]
    spread: u16,
    /// Permission bits, in octal; the umask applies.
    #[arg(long, default_value = "777")]
    mode: String,
    /// The new directory, inside a Weft mount.
    path: PathBuf,
    #[command(flatten)]
    locator: MgmtLocator,
}

#[derive(Args)]
pub struct ClusterArgs {
    #[command(flatten)]
    pub(crate) locator: MgmtLocator,
    /// A path inside the Weft mount to ask (default: the working directory).
    #[arg(long)]
    pub(crate) path: Option<PathBuf>,
}

impl ClusterArgs {
    /// Management's address and the key that lets the command in.
    pub(crate) fn mgmt(&self) -> Result<Cluster> {
        locate(&self.locator, self.path.as_deref())
    }
}

/// The cluster a command talks to: management's address and the key that lets it in.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// Management's address.
    pub mgmt: String,
    /// The key file found, if any: without one the command connects without a key, and a
    /// cluster that requires one says so.
    key_file: Option<PathBuf>,
}

impl Cluster {
    /// The cluster whose management is at `mgmt`, with the key found as
    /// [`weft_net::auth::find_key_file`] finds it (`explicit` first).
    pub fn at(mgmt: String, explicit: Option<&Path>) -> Cluster {
        let key_file = weft_net::auth::find_key_file(explicit, &mgmt);
        Cluster { mgmt, key_file }
    }

    /// A client config for this cluster, every other setting at its default.
    pub fn client_config(&self) -> ClientConfig {
        self.client_config_from(ClientConfig::new(self.mgmt.clone()))
    }

    /// `config` with this cluster's key (or none, when none was found), and the TLS files of
    /// a `tls` directory beside the key file (where `weft up --tls` and `weft certgen` put
    /// them), when there is one.
    pub fn client_config_from(&self, mut config: ClientConfig) -> ClientConfig {
        (config.auth_key_file, config.auth) = match &self.key_file {
            Some(file) => (Some(file.clone()), None),
            None => (None, Some(weft_net::AuthMode::None)),
        };
        let tls = self
            .key_file
            .as_deref()
            .and_then(|file| std::fs::canonicalize(file).ok())
            .and_then(|file| {
                file.parent()
                    .map(|dir| weft_net::tls::TlsFiles::in_dir(&dir.join("tls")))
            })
            .filter(|files| files.cert.exists() && files.key.exists() && files.ca.exists());
        if let Some(tls) = tls {
            config.tls_cert_file = Some(tls.cert);
            config.tls_key_file = Some(tls.key);
            config.tls_ca_file = Some(tls.ca);
        }
        config
    }

    /// Connection options for this cluster: one connection per server, the key.
    pub fn options(&self) -> Result<RpcClientOptions> {
        Ok(RpcClientOptions {
            connections: 1,
            auth: self.client_config().auth().map_err(anyhow::Error::msg)?,
            ..RpcClientOptions::default()
        })
    }

    /// A native client of this cluster.
    pub async fn client(&self) -> Result<std::sync::Arc<Client>> {
        Client::connect(&self.client_config())
            .await
            .map_err(|error| not_reached(&error, &self.mgmt))
    }
}

/// The Weft mount holding `path`: (mount point, management address).
fn mount_of(path: &Path) -> Option<(PathBuf, String)> {
    // A path that does not exist still tells the mount by its nearest existing ancestor.
    let path = crate::absolute(path)
        .ancestors()
        .find_map(|ancestor| ancestor.canonicalize().ok())?;
    weft_client::fuse::mount::trusted_fuse_mounts()
        .into_iter()
        .filter(|(_, target, kind)| {
            (kind == "fuse.weft" || kind == "fuse") && path.starts_with(target)
        })
        .max_by_key(|(_, target, _)| target.as_os_str().len())
        .and_then(|(source, target, _)| {
            weft_client::fuse::mount::mgmt_of(&source).map(|mgmt| (target, mgmt))
        })
}

pub fn locate(locator: &MgmtLocator, path: Option<&Path>) -> Result<Cluster> {
    let key_file = locator.key_file.as_deref();
    Ok(Cluster::at(locate_mgmt(locator, path)?, key_file))
}

fn locate_mgmt(locator: &MgmtLocator, path: Option<&Path>) -> Result<String> {
    if let Some(mgmt) = &locator.mgmt {
        return Ok(mgmt.clone());
    }
    let here = match path {
        Some(path) => path.to_path_buf(),
        None => std::env::current_dir()?,
    };
    if let Some((_, mgmt)) = mount_of(&here) {
        return Ok(mgmt);
    }
    if path.is_none() {
        let mounts: Vec<_> = weft_client::fuse::mount::trusted_fuse_mounts()
            .into_iter()
            .filter(|(_, _, kind)| kind == "fuse.weft" || kind == "fuse")
            .filter_map(|(source, _, _)| weft_client::fuse::mount::mgmt_of(&source))
            .collect();
        if let [only] = &mounts[..] {
            return Ok(only.clone());
        }
    }
    bail!(
        "{} is not inside a Weft mount: pass --mgmt HOST:PORT or a path inside a mount",
        here.display()
    )
}

/// Management at `mgmt` could not be asked: the error, with the question an unreachable
/// server raises (a refusal already says what to do).
pub(crate) fn not_reached(error: &ClientError, mgmt: &str) -> anyhow::Error {
    match error {
        ClientError::Rpc(weft_net::RpcError::Refused { .. }) | ClientError::Config(_) => {
            anyhow!("{error}")
        }
        _ => anyhow!("{error}: is management running at {mgmt}?"),
    }
}

/// A view of the cluster, with the map fetched.
pub(crate) async fn connect(
    cluster: &Cluster,
) -> Result<(ClusterView, std::sync::Arc<ClusterMap>)> {
    let view = ClusterView::new(cluster.mgmt.clone(), cluster.options()?);
    let map = view
        .refresh()
        .await
        .map_err(|error| not_reached(&error.into(), &cluster.mgmt))?;
    Ok((view, map))
}

async fn cluster_map(cluster: &Cluster) -> Result<std::sync::Arc<ClusterMap>> {
    Ok(connect(cluster).await?.1)
}

/// The inode of a path inside a Weft mount.
pub(crate) fn inode_of(path: &Path) -> Result<InodeId> {
    let metadata = std::fs::symlink_metadata(path)
        .with_context(|| format!("cannot stat {}", path.display()))?;
    Ok(if metadata.ino() == 1 {
        InodeId::ROOT
    } else {
        InodeId(metadata.ino())
    })
}

/// Every entry of a tree, its top first, depth first in name order, with its metadata (not
/// following symbolic links). A directory is listed only when the entry after it is asked
/// for, so what the caller does to a directory (its project, its pool) comes before the
/// listing: an entry made in it meanwhile inherits it or is listed.
pub(crate) struct Tree {
    pending: Vec<PathBuf>,
    /// The directory last answered, not listed yet.
    unlisted: Option<PathBuf>,
}

impl Tree {
    pub(crate) fn new(top: &Path) -> Tree {
        Tree {
            pending: vec![top.to_path_buf()],
            unlisted: None,
        }
    }
}

impl Iterator for Tree {
    type Item = Result<(PathBuf, std::fs::Metadata)>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(dir) = self.unlisted.take() {
            let listed: Result<Vec<PathBuf>> = std::fs::read_dir(&dir)
                .and_then(|entries| entries.map(|entry| entry.map(|e| e.path())).collect())
                .with_context(|| format!("cannot list {}", dir.display()));
            match listed {
                Ok(mut children) => {
                    children.sort();
                    self.pending.extend(children.into_iter().rev());
                }
                Err(error) => return Some(Err(error)),
            }
        }
        let path = self.pending.pop()?;
        let metadata = match std::fs::symlink_metadata(&path) {
            Ok(metadata) => metadata,
            Err(error) => {
                return Some(Err(
                    anyhow::Error::new(error).context(format!("cannot stat {}", path.display()))
                ))
            }
        };
        if metadata.is_dir() {
            self.unlisted = Some(path.clone());
        }
        Some(Ok((path, metadata)))
    }
}

/// "512K", "1M", "4G", or bytes.
pub fn parse_size(text: &str) -> Result<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| anyhow!("{text:?} is not a size such as 512K or 1M"))?;
    let multiplier = match suffix
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => bail!("{text:?}: unknown size suffix {suffix:?} (use K, M or G)"),
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| anyhow!("{text:?} is too large"))
}

pub(crate) fn format_size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => format!("{b}"),
    }
}

pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1}{}", UNITS[unit])
}

fn node_name(map: &ClusterMap, kind: NodeKind, node: weft_proto::NodeId) -> String {
    let alias = map
        .node(kind, node)
        .map(|n| n.alias.as_str())
        .unwrap_or("?");
    format!("{alias} [ID: {node}]")
}

/// The entry info report, in the shape operators know from BeeGFS `getentryinfo`.
pub fn format_entry_info(attr: &InodeAttr, map: &ClusterMap) -> String {
    let kind = match attr.kind {
        FileKind::Regular => "file",
        FileKind::Directory => "directory",
        FileKind::Symlink => "symlink",
        FileKind::Fifo => "fifo",
        FileKind::Socket => "socket",
        FileKind::CharDevice => "character device",
        FileKind::BlockDevice => "block device",
    };
    let mut out = String::new();
    out.push_str(&format!("Entry type: {kind}\n"));
    out.push_str(&format!("EntryID: {}\n", attr.inode.entry_id()));
    out.push_str(&format!(
        "Metadata node: {}\n",
        node_name(map, NodeKind::Meta, attr.inode.home())
    ));
    if let Some(group) = map.meta_group_of_home(attr.inode.home()) {
        out.push_str(&format!(
            "Metadata mirror group: {} (version {}), served by {}\n",
            group.id,
            group.version,
            node_name(
                map,
                NodeKind::Meta,
                weft_proto::ids::NodeId::from(group.primary)
            )
        ));
    }
    if attr.project != 0 {
        out.push_str(&format!("Project: {}\n", attr.project));
    }
    if attr.shards.len() > 1 {
        out.push_str(&format!(
            "Spread over {} metadata nodes:\n",
            attr.shards.len()
        ));
        for shard in &attr.shards {
            out.push_str(&format!(
                "+ shard {} @ {}\n",
                shard.entry_id(),
                node_name(map, NodeKind::Meta, shard.home())
            ));
        }
    }
    let pattern = attr.layout.as_ref().map(|l| l.pattern).or(attr.pattern);
    if let Some(pattern) = pattern {
        out.push_str("Stripe pattern details:\n");
        let kind = match pattern.kind {
            PatternKind::Raid0 => "RAID0",
            PatternKind::Mirrored => "Mirrored (RAID10: striped over mirror groups)",
        };
        out.push_str(&format!("+ Type: {kind}\n"));
        out.push_str(&format!(
            "+ Chunksize: {}\n",
            format_size(u64::from(pattern.chunk_size_bytes))
        ));
        match &attr.layout {
            Some(layout) => {
                out.push_str(&format!(
                    "+ Number of storage targets: desired: {}; actual: {}\n",
                    pattern.num_targets,
                    layout.width()
                ));
                if layout.width() < usize::from(pattern.num_targets) {
                    out.push_str(&format!(
                        "+ Fewer than desired: its pool had {} reachable when the file was made\n",
                        layout.width()
                    ));
                }
            }
            None => out.push_str(&format!(
                "+ Number of storage targets: desired: {}\n",
                pattern.num_targets
            )),
        }
        out.push_str(&format!(
            "+ Storage Pool: {}\n",
            crate::pool::pool_label(map, pattern.pool)
        ));
        if let Some(layout) = &attr.layout {
            out.push_str(&format_slots(layout, map));
        }
    }
    out
}

/// The targets or mirror groups of a file's layout, in stripe order, with their servers.
fn format_slots(layout: &weft_proto::layout::FileLayout, map: &ClusterMap) -> String {
    let mut out = String::new();
    let target_name = |target: TargetId| {
        let node = map
            .target(target)
            .map(|t| node_name(map, NodeKind::Storage, t.node))
            .unwrap_or_else(|| "? [ID: ?]".into());
        format!("{target} @ {node}")
    };
    match layout.pattern.kind {
        PatternKind::Raid0 => out.push_str("+ Storage targets:\n"),
        PatternKind::Mirrored => out.push_str("+ Storage mirror groups:\n"),
    }
    for slot in layout.slots() {
        match slot {
            Slot::Target(target) => {
                out.push_str(&format!("  + {}\n", target_name(target)));
            }
            Slot::Group(id) => match map.mirror_group(MirrorKind::Storage, id) {
                Some(group) => {
                    let members: Vec<String> = group
                        .members
                        .iter()
                        .map(|m| {
                            format!(
                                "{} ({})",
                                target_name(TargetId::from(m.id)),
                                <&str>::from(m.state)
                            )
                        })
                        .collect();
                    out.push_str(&format!(
                        "  + group {id} (version {}), primary {}: {}\n",
                        group.version,
                        group.primary,
                        members.join(", ")
                    ));
                }
                None => out.push_str(&format!("  + group {id} (not defined)\n")),
            },
        }
    }
    out
}

pub fn entry(command: EntryCommand) -> Result<()> {
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        match command {
            EntryCommand::Info { path, locator } => {
                let mgmt = locate(&locator, Some(&path))?;
                let inode = inode_of(&path)?;
                let (view, map) = connect(&mgmt).await?;
                let meta = view.meta(inode.home()).await?;
                let attr = meta
                    .get_attr(inode)
                    .await
                    .with_context(|| format!("cannot read {}", path.display()))?;
                print!("{}", format_entry_info(&attr, &map));
                if attr.kind == FileKind::Directory {
                    if let Ok(value) = meta.get_xattr(inode, DIR_SPREAD_XATTR).await {
                        println!(
                            "New subdirectories spread over: {} metadata nodes",
                            String::from_utf8_lossy(&value)
                        );
                    }
                }
            }
            EntryCommand::Set(args) => set_entry(args).await?,
            EntryCommand::Migrate {
                pool,
                targets,
                chunk_size,
                num_targets,
                path,
                locator,
            } => {
                let mgmt = locate(&locator, Some(&path))?;
                let chunk = chunk_size.map(|size| parse_size(&size)).transpose()?;
                let chunk = chunk
                    .map(|chunk| {
                        u32::try_from(chunk)
                            .map_err(|_| anyhow!("--chunk-size {chunk} is too large"))
                    })
                    .transpose()?;
                let pattern = (chunk.is_some() || num_targets.is_some())
                    .then(|| (chunk.unwrap_or(0), num_targets.unwrap_or(0)));
                crate::migrate::migrate(&mgmt, &path, (pool, targets), pattern).await?;
            }
        }
        Ok(())
    })
}

/// `weft entry set`: a directory's new pattern (or spread), its unchanged parts kept.
async fn set_entry(args: EntrySetArgs) -> Result<()> {
    let EntrySetArgs {
        chunk_size,
        num_targets,
        pattern,
        spread,
        pool,
        path,
        locator,
    } = args;
    if chunk_size.is_none()
        && num_targets.is_none()
        && spread.is_none()
        && pattern.is_none()
        && pool.is_none()
    {
        bail!("nothing to change: give --chunk-size, --num-targets, --pattern, --pool and/or --spread");
    }
    let mgmt = locate(&locator, Some(&path))?;
    let inode = inode_of(&path)?;
    let client = mgmt.client().await?;
    let attr = client
        .get_attr(inode)
        .await
        .with_context(|| format!("cannot read {}", path.display()))?;
    let Some(current) = attr.pattern else {
        bail!(
            "{} is not a directory: patterns are set on directories",
            path.display()
        )
    };
    let chunk = match chunk_size {
        Some(text) => parse_size(&text)?,
        None => u64::from(current.chunk_size_bytes),
    };
    let targets = num_targets
        .map(u64::from)
        .unwrap_or(u64::from(current.num_targets));
    if let Some(count) = spread {
        if count > 1 {
            client
                .set_xattr(
                    inode,
                    DIR_SPREAD_XATTR,
                    count.to_string().as_bytes(),
                    weft_proto::messages::XattrSetMode::Any,
                )
                .await
                .with_context(|| format!("cannot set the spread of {}", path.display()))?;
        } else if let Err(error) = client.remove_xattr(inode, DIR_SPREAD_XATTR).await {
            if error.code() != weft_proto::ErrorCode::NoAttribute {
                return Err(error.into());
            }
        }
    }
    let pool = match pool {
        Some(name) => crate::pool::pool_named(&*client.cluster_map().await?, &name)?.id,
        None => current.pool,
    };
    let mut new_pattern = StripePattern::raid0(chunk, targets, pool)?;
    let mirrored = match pattern {
        Some(PatternArg::Mirrored) => true,
        Some(PatternArg::Raid0) => false,
        None => current.kind == PatternKind::Mirrored,
    };
    if mirrored {
        new_pattern = new_pattern.mirrored();
    }
    let attr = client.set_pattern(inode, new_pattern).await?;
    // On disk before the tool goes, which it tells the homes: it keeps nothing to replay
    // once it has exited.
    client.close().await?;
    let map = client.cluster_map().await?;
    println!(
        "New pattern set on {}; new files and directories inherit it.",
        path.display()
    );
    print!("{}", format_entry_info(&attr, &map));
    Ok(())
}

pub fn mkdir(args: MkdirArgs) -> Result<()> {
    let mode = u32::from_str_radix(&args.mode, 8)
        .ok()
        .filter(|mode| *mode <= 0o7777)
        .ok_or_else(|| anyhow!("--mode {:?} is not an octal mode such as 755", args.mode))?;
    let path = crate::absolute(&args.path);
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        bail!("{} names no new directory", path.display());
    };
    let name = name
        .to_str()
        .ok_or_else(|| anyhow!("{} is not UTF-8", path.display()))?;
    let mgmt = locate(&args.locator, Some(parent))?;
    let parent_inode = inode_of(parent)?;
    // The kernel checks a mkdir through the mount; this one goes around it, so check here.
    let c_parent = std::ffi::CString::new(parent.as_os_str().as_encoded_bytes())?;
    // SAFETY: access(2) reads a NUL-terminated path and nothing else.
    if unsafe { libc::access(c_parent.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        bail!(
            "cannot create {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: umask(2) cannot fail; it is set straight back.
    let umask = unsafe {
        let umask = libc::umask(0o022);
        libc::umask(umask);
        umask
    };
    // SAFETY: getuid(2) and getgid(2) cannot fail.
    let owner = unsafe { (libc::getuid(), libc::getgid()) };
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        let client = mgmt.client().await?;
        let attr = client
            .mkdir_spread((parent_inode, name), (mode, umask), owner, args.spread)
            .await
            .with_context(|| format!("cannot create {}", path.display()))?;
        client.close().await?;
        let map = client.cluster_map().await?;
        print!("{}", format_entry_info(&attr, &map));
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: sizes are parsed the way operators type them, and bad ones are refused.
    #[test]
    fn sizes() {
        assert_eq!(parse_size("1M").expect("1M"), 1 << 20);
        assert_eq!(parse_size("512k").expect("512k"), 512 << 10);
        assert_eq!(parse_size("64KiB").expect("64KiB"), 64 << 10);
        assert_eq!(parse_size("4096").expect("bytes"), 4096);
        assert!(parse_size("1X").is_err());
        assert!(parse_size("M").is_err());
        assert_eq!(format_size(1 << 20), "1M");
        assert_eq!(format_size(512 << 10), "512K");
    }
}
