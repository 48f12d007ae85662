//! `weft pool create|list|add-target|remove-target|set|remove`: storage pools, the targets
//! (and storage mirror groups) in each, their space and capacity classes.

use crate::admin::{connect, format_size, parse_size, ClusterArgs};
use anyhow::{anyhow, bail, Result};
use clap::Subcommand;
use std::collections::BTreeSet;
use weft_net::MgmtCalls;
use weft_proto::ids::{GroupId, StoragePoolId, TargetId};
use weft_proto::messages::{ClusterMap, MirrorKind};
use weft_proto::pools::{CapacityClass, CapacityLimits, PoolInfo};

#[derive(Subcommand)]
pub enum PoolCommand {
    /// Create a storage pool, with these targets (and mirror groups) moved into it.
    Create {
        /// The pool's name: letters, digits, '-', '_' or '.'.
        name: String,
        #[command(flatten)]
        members: Members,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// List the pools: targets, mirror groups, capacity, free space, capacity classes.
    List {
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Move targets (and mirror groups, whose targets move together) into a pool from the
    /// pool they are in.
    AddTarget {
        /// The pool (name or id).
        pool: String,
        #[command(flatten)]
        members: Members,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Move targets (and mirror groups) out of a pool, back into the default pool.
    RemoveTarget {
        /// The pool (name or id).
        pool: String,
        #[command(flatten)]
        members: Members,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Set the free space and free inodes below which a pool's targets are low (new files
    /// go elsewhere while the pool has normal targets) or in emergency (used last).
    Set {
        /// The pool (name or id).
        pool: String,
        /// Free space below which a target is low (e.g. 100G).
        #[arg(long)]
        low_free: Option<String>,
        /// Free space below which a target is in emergency.
        #[arg(long)]
        emergency_free: Option<String>,
        /// Free inodes below which a target is low.
        #[arg(long)]
        low_free_inodes: Option<u64>,
        /// Free inodes below which a target is in emergency.
        #[arg(long)]
        emergency_free_inodes: Option<u64>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Remove an empty pool.
    Remove {
        /// The pool (name or id).
        pool: String,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

/// The targets a pool command names: target ids and mirror group ids (a group stands for
/// all its targets).
#[derive(clap::Args)]
pub struct Members {
    /// Target ids, e.g. 1,2.
    #[arg(long, value_delimiter = ',')]
    targets: Vec<u32>,
    /// Storage mirror group ids, e.g. 1: each moves with all its targets.
    #[arg(long, value_delimiter = ',')]
    mirror_groups: Vec<u32>,
}

impl Members {
    fn is_empty(&self) -> bool {
        self.targets.is_empty() && self.mirror_groups.is_empty()
    }

    /// The targets named, the mirror groups' members included.
    fn targets(&self, map: &ClusterMap) -> Result<Vec<TargetId>> {
        let mut targets: BTreeSet<TargetId> = self.targets.iter().copied().map(TargetId).collect();
        for id in &self.mirror_groups {
            let group = map
                .mirror_group(MirrorKind::Storage, GroupId(*id))
                .ok_or_else(|| {
                    anyhow!("storage mirror group {id} does not exist (weft mirror list)")
                })?;
            targets.extend(group.members.iter().map(|m| TargetId::from(m.id)));
        }
        Ok(targets.into_iter().collect())
    }
}

/// The pool `name` (or id) in `map`.
pub(crate) fn pool_named(map: &ClusterMap, name: &str) -> Result<PoolInfo> {
    map.pool_named(name).ok_or_else(|| {
        let known: Vec<String> = map.all_pools().into_iter().map(|p| p.name).collect();
        anyhow!(
            "there is no storage pool {name:?}; the pools are: {} (weft pool create)",
            known.join(", ")
        )
    })
}

/// The pool as `weft` names it: `fast (2)`.
pub(crate) fn pool_label(map: &ClusterMap, id: StoragePoolId) -> String {
    match map.pool(id) {
        Some(pool) => format!("{} ({id})", pool.name),
        None => format!("{id} (not defined)"),
    }
}

fn print_pools(map: &ClusterMap) {
    println!(
        "{:<5} {:<16} {:<10} {:>10} {:>10} {:>6}  {:<26} MIRROR GROUPS",
        "ID", "NAME", "TARGETS", "CAPACITY", "FREE", "FREE%", "CLASSES"
    );
    for pool in map.all_pools() {
        let targets: Vec<_> = map.pool_targets(pool.id).collect();
        let total: u64 = targets.iter().map(|t| t.usage.total_bytes).sum();
        let free: u64 = targets.iter().map(|t| t.usage.free_bytes).sum();
        let count = |class: CapacityClass| {
            targets
                .iter()
                .filter(|t| pool.class_of(&t.usage) == class)
                .count()
        };
        let classes = format!(
            "{} normal, {} low, {} emergency",
            count(CapacityClass::Normal),
            count(CapacityClass::Low),
            count(CapacityClass::Emergency)
        );
        let ids: Vec<String> = targets.iter().map(|t| t.id.to_string()).collect();
        let groups: Vec<String> = map
            .mirror_groups
            .iter()
            .filter(|g| g.kind == MirrorKind::Storage)
            .filter(|g| {
                map.target(TargetId::from(g.primary))
                    .is_some_and(|t| t.pool == pool.id)
            })
            .map(|g| g.id.to_string())
            .collect();
        println!(
            "{:<5} {:<16} {:<10} {:>10} {:>10} {:>6}  {:<26} {}",
            pool.id,
            pool.name,
            if ids.is_empty() {
                "-".to_string()
            } else {
                ids.join(",")
            },
            format_size(total),
            format_size(free),
            if total > 0 {
                format!("{:.0}%", free as f64 * 100.0 / total as f64)
            } else {
                "-".into()
            },
            classes,
            if groups.is_empty() {
                "-".to_string()
            } else {
                groups.join(",")
            },
        );
    }
    println!();
    println!("Capacity limits (a target below one is low, or in emergency):");
    for pool in map.all_pools() {
        println!(
            "  {}: low below {} or {} inodes free; emergency below {} or {} inodes free",
            pool.name,
            format_size(pool.low.free_bytes),
            pool.low.free_inodes,
            format_size(pool.emergency.free_bytes),
            pool.emergency.free_inodes
        );
    }
}

pub fn pool(command: PoolCommand) -> Result<()> {
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        match command {
            PoolCommand::Create {
                name,
                members,
                cluster,
            } => {
                let (view, map) = connect(&cluster.mgmt()?).await?;
                let targets = members.targets(&map)?;
                let created = view
                    .mgmt()
                    .create_pool(&name)
                    .await
                    .map_err(|error| anyhow!("cannot create pool {name:?}: {error}"))?;
                if !targets.is_empty() {
                    move_into(&view, &map, &targets, created.id).await?;
                }
                println!("storage pool {} ({}) created", created.name, created.id);
                print_pools(&*view.refresh().await?);
            }
            PoolCommand::List { cluster } => {
                let (_, map) = connect(&cluster.mgmt()?).await?;
                print_pools(&map);
            }
            PoolCommand::AddTarget {
                pool,
                members,
                cluster,
            } => {
                if members.is_empty() {
                    bail!("name the targets to add: --targets 1,2 and/or --mirror-groups 1");
                }
                let (view, map) = connect(&cluster.mgmt()?).await?;
                let pool = pool_named(&map, &pool)?;
                move_into(&view, &map, &members.targets(&map)?, pool.id).await?;
                print_pools(&*view.refresh().await?);
            }
            PoolCommand::RemoveTarget {
                pool,
                members,
                cluster,
            } => {
                if members.is_empty() {
                    bail!("name the targets to remove: --targets 1,2 and/or --mirror-groups 1");
                }
                let (view, map) = connect(&cluster.mgmt()?).await?;
                let pool = pool_named(&map, &pool)?;
                if pool.id == StoragePoolId::DEFAULT {
                    bail!("targets leave the default pool by joining another: weft pool add-target POOL");
                }
                let targets = members.targets(&map)?;
                view.mgmt()
                    .move_pool_targets(targets, pool.id, StoragePoolId::DEFAULT)
                    .await
                    .map_err(|error| anyhow!("cannot move the targets out of {}: {error}", pool.name))?;
                print_pools(&*view.refresh().await?);
            }
            PoolCommand::Set {
                pool,
                low_free,
                emergency_free,
                low_free_inodes,
                emergency_free_inodes,
                cluster,
            } => {
                let (view, map) = connect(&cluster.mgmt()?).await?;
                let pool = pool_named(&map, &pool)?;
                let size = |text: Option<String>, current: u64| match text {
                    Some(text) => parse_size(&text),
                    None => Ok(current),
                };
                let low = CapacityLimits {
                    free_bytes: size(low_free, pool.low.free_bytes)?,
                    free_inodes: low_free_inodes.unwrap_or(pool.low.free_inodes),
                };
                let emergency = CapacityLimits {
                    free_bytes: size(emergency_free, pool.emergency.free_bytes)?,
                    free_inodes: emergency_free_inodes.unwrap_or(pool.emergency.free_inodes),
                };
                view.mgmt()
                    .set_pool_limits(pool.id, low, emergency)
                    .await
                    .map_err(|error| anyhow!("cannot set the limits of {}: {error}", pool.name))?;
                print_pools(&*view.refresh().await?);
            }
            PoolCommand::Remove { pool, cluster } => {
                let (view, map) = connect(&cluster.mgmt()?).await?;
                let pool = pool_named(&map, &pool)?;
                view.mgmt()
                    .remove_pool(pool.id)
                    .await
                    .map_err(|error| anyhow!("cannot remove pool {}: {error}", pool.name))?;
                println!("storage pool {} ({}) removed", pool.name, pool.id);
            }
        }
        Ok(())
    })
}

/// Moves `targets` into pool `to`, from the pools they are in (one request per pool).
async fn move_into(
    view: &weft_net::ClusterView,
    map: &ClusterMap,
    targets: &[TargetId],
    to: StoragePoolId,
) -> Result<()> {
    let mut by_pool: std::collections::BTreeMap<StoragePoolId, Vec<TargetId>> = Default::default();
    for target in targets {
        let info = map
            .target(*target)
            .ok_or_else(|| anyhow!("target {target} is not registered (weft target list)"))?;
        if info.pool != to {
            by_pool.entry(info.pool).or_default().push(*target);
        }
    }
    for (from, targets) in by_pool {
        view.mgmt()
            .move_pool_targets(targets, from, to)
            .await
            .map_err(|error| {
                anyhow!(
                    "cannot move the targets into pool {}: {error}",
                    pool_label(map, to)
                )
            })?;
    }
    Ok(())
}
