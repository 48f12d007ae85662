//! `weft client set|list|remove`: the restrictions of client identities, which management
//! keeps and the metadata and storage servers enforce (docs/operations.md, "Security").

use crate::admin::{connect, ClusterArgs};
use anyhow::{anyhow, bail, Context, Result};
use clap::Subcommand;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use weft_net::MgmtCalls;
use weft_proto::access::{ClientRule, Subtree};

#[derive(Subcommand)]
pub enum ClientCommand {
    /// Set the restrictions of the client NAME (its key made with `weft keygen --client
    /// NAME`), replacing any it had; without flags it has none.
    Set {
        /// The client's name.
        name: String,
        /// It may read but not change files, directories or attributes.
        #[arg(long)]
        read_only: bool,
        /// Its root (uid 0) acts as nobody, and the servers check its access themselves.
        #[arg(long)]
        root_squash: bool,
        /// Refuse every request of it.
        #[arg(long)]
        revoked: bool,
        /// Confine it to this directory (a path in a mount of the cluster): its mounts show
        /// the directory as their root, and the servers refuse it anything outside.
        #[arg(long, value_name = "DIR")]
        subtree: Option<std::path::PathBuf>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// List the clients with restrictions.
    List {
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Remove the restrictions of the client NAME.
    Remove {
        /// The client's name.
        name: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

fn restrictions(rule: &ClientRule) -> String {
    let flags: Vec<String> = [
        (rule.read_only, "read-only"),
        (rule.root_squash, "root-squash"),
        (rule.revoked, "revoked"),
    ]
    .into_iter()
    .filter_map(|(set, name)| set.then_some(name.to_string()))
    .chain(
        rule.subtree
            .iter()
            .map(|subtree| format!("subtree {} ({})", subtree.path, subtree.inode)),
    )
    .collect();
    if flags.is_empty() {
        "none".to_string()
    } else {
        flags.join(", ")
    }
}

/// The directory at `dir`, a path in a mount of the cluster: its inode, and its path from the
/// mount's root.
fn subtree_at(dir: &Path) -> Result<Subtree> {
    let dir = dir
        .canonicalize()
        .with_context(|| format!("cannot find {}", dir.display()))?;
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    let inode = crate::admin::inode_of(&dir)?;
    if inode == weft_proto::InodeId::ROOT {
        // Also what the root of a confined client's mount looks like from here.
        bail!(
            "{} is the root of its mount: a subtree there confines nothing (give a directory \
             below the root of a mount with the cluster key, or no --subtree)",
            dir.display()
        );
    }
    // The mount's root is the highest directory of the same file system.
    let device = std::fs::metadata(&dir)?.dev();
    let mut root = dir.as_path();
    while let Some(parent) = root.parent() {
        if std::fs::metadata(parent)?.dev() != device {
            break;
        }
        root = parent;
    }
    let inside = dir.strip_prefix(root).unwrap_or(Path::new(""));
    Ok(Subtree {
        inode,
        path: format!("/{}", inside.display()),
    })
}

pub fn client(command: ClientCommand) -> Result<()> {
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        match command {
            ClientCommand::Set {
                name,
                read_only,
                root_squash,
                revoked,
                subtree,
                cluster,
            } => {
                let rule = ClientRule {
                    name: name.clone(),
                    read_only,
                    root_squash,
                    revoked,
                    subtree: subtree.as_deref().map(subtree_at).transpose()?,
                };
                let (view, _) = connect(&cluster.mgmt()?).await?;
                view.mgmt()
                    .set_client_rule(rule.clone())
                    .await
                    .map_err(|error| anyhow!("cannot set the rule of client {name}: {error}"))?;
                println!(
                    "client {name}: {} (servers apply it from their next cluster map)",
                    restrictions(&rule)
                );
            }
            ClientCommand::List { cluster } => {
                let (_, map) = connect(&cluster.mgmt()?).await?;
                println!("{:<24} RESTRICTIONS", "CLIENT");
                for rule in &map.clients {
                    println!("{:<24} {}", rule.name, restrictions(rule));
                }
            }
            ClientCommand::Remove { name, cluster } => {
                let (view, _) = connect(&cluster.mgmt()?).await?;
                view.mgmt()
                    .remove_client_rule(&name)
                    .await
                    .map_err(|error| anyhow!("cannot remove the rule of client {name}: {error}"))?;
                println!("client {name}: no restrictions");
            }
        }
        Ok(())
    })
}
