//! Nodes and targets as operators see them: `weft node list`, `weft target list|drain|remove`,
//! and `weft df`.

use super::*;
use weft_net::MgmtCalls;

#[derive(Subcommand)]
pub enum NodeCommand {
    /// List metadata and storage nodes.
    List(ClusterArgs),
}

#[derive(Subcommand)]
pub enum TargetCommand {
    /// List storage targets.
    List {
        /// Show reachability, consistency and drain states.
        #[arg(long)]
        state: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Move every file off a target: new files avoid it, and the metadata servers re-place
    /// the files on it onto the other targets of its pool while they stay in use. `weft
    /// target list --state` shows how many are left; `weft target remove` follows.
    Drain {
        /// The target's id.
        target: u32,
        /// Stop draining it: it takes new files again (files already moved stay moved).
        #[arg(long)]
        stop: bool,
        /// Wait until no file uses it any more; fail, saying why, once every file left has no
        /// place to move to.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Remove a drained target from the cluster for good: refused while any file still uses
    /// it. Take its directory out of its storage server's config afterwards.
    Remove {
        /// The target's id.
        target: u32,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

pub(crate) fn reachability(state: Reachability) -> &'static str {
    match state {
        Reachability::Online => "online",
        Reachability::ProbablyOffline => "probably-offline",
        Reachability::Offline => "offline",
    }
}

pub fn node(command: NodeCommand) -> Result<()> {
    let NodeCommand::List(args) = command;
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        let map = cluster_map(&locate(&args.locator, args.path.as_deref())?).await?;
        for (kind, title) in [
            (NodeKind::Meta, "Metadata nodes"),
            (NodeKind::Storage, "Storage nodes"),
        ] {
            println!("{title}:");
            println!("  {:<6} {:<20} {:<17} ADDRESSES", "ID", "ALIAS", "STATE");
            for node in map.nodes.iter().filter(|n| n.kind == kind) {
                println!(
                    "  {:<6} {:<20} {:<17} {}",
                    node.id.0,
                    node.alias,
                    reachability(node.reachability),
                    node.addresses.join(",")
                );
            }
        }
        Ok(())
    })
}

pub fn target(command: TargetCommand) -> Result<()> {
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        match command {
            TargetCommand::List { state, cluster } => list_targets(&cluster, state).await,
            TargetCommand::Drain {
                target,
                stop,
                wait,
                cluster,
            } => {
                let (view, _) = connect(&cluster.mgmt()?).await?;
                let target = TargetId(target);
                view.mgmt()
                    .drain_target(target, stop)
                    .await
                    .map_err(|error| anyhow!("cannot drain target {target}: {error}"))?;
                if stop {
                    println!("target {target} takes new files again");
                    return Ok(());
                }
                println!("target {target} is being drained: new files avoid it, files on it move off");
                if wait {
                    wait_drained(&view, target).await?;
                }
                Ok(())
            }
            TargetCommand::Remove { target, cluster } => {
                let (view, _) = connect(&cluster.mgmt()?).await?;
                let target = TargetId(target);
                view.mgmt()
                    .remove_target(target)
                    .await
                    .map_err(|error| anyhow!("cannot remove target {target}: {error}"))?;
                println!("target {target} removed from the cluster: take its directory out of its storage server's config");
                Ok(())
            }
        }
    })
}

/// Waits until management hears from every metadata server that no file uses draining
/// `target`.
pub(super) async fn wait_drained(view: &ClusterView, target: TargetId) -> Result<()> {
    let mut told = None;
    loop {
        let status = view.mgmt().cluster_status().await?;
        let listed = status.targets.iter().find(|t| t.id == target);
        let left = listed.map(|t| t.drain_left);
        // Every file left has no place to go: waiting would be for ever.
        if let Some((Some(left), Some(blocked))) = listed.map(|t| (t.drain_left, &t.drain_blocked))
        {
            if left > 0 && blocked.files >= left {
                bail!(
                    "target {target} cannot be drained as things stand: {} files cannot move off it: {} (`weft target list --state` shows this while it waits; `weft target drain {target} --stop` ends the drain)",
                    blocked.files,
                    blocked.why
                );
            }
        }
        if left == Some(None)
            && !view
                .refresh()
                .await?
                .target(target)
                .is_some_and(|t| t.draining)
        {
            bail!("target {target} is not being drained");
        }
        match left {
            None => bail!("target {target} is no longer listed"),
            Some(Some(0)) => {
                println!("target {target} is drained: `weft target remove {target}` takes it out");
                return Ok(());
            }
            Some(Some(left)) if told != Some(left) => {
                println!("target {target}: {left} files left");
                told = Some(left);
            }
            _ => {}
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

pub(super) async fn list_targets(cluster: &ClusterArgs, state: bool) -> Result<()> {
    let (view, map) = connect(&locate(&cluster.locator, cluster.path.as_deref())?).await?;
    if state {
        let status = view.mgmt().cluster_status().await?;
        println!(
            "{:<9} {:<17} {:<12} {:<6} {:<30} NODE",
            "TARGETID", "REACHABILITY", "CONSISTENCY", "POOL", "DRAIN"
        );
        let mut stuck = Vec::new();
        for target in &map.targets {
            let node = node_name(&map, NodeKind::Storage, target.node);
            let consistency: &str = map.target_consistency(target.id).into();
            let left = status
                .targets
                .iter()
                .find(|t| t.id == target.id)
                .and_then(|t| t.drain_left);
            let blocked = status
                .targets
                .iter()
                .find(|t| t.id == target.id)
                .and_then(|t| t.drain_blocked.clone());
            let drain = match (target.draining, left, &blocked) {
                (false, _, _) => "-".to_string(),
                (true, Some(left), Some(blocked)) => {
                    format!("draining, {left} left, {} stuck", blocked.files)
                }
                (true, Some(left), None) => format!("draining, {left} left"),
                (true, None, _) => "draining".to_string(),
            };
            if let Some(blocked) = blocked.filter(|_| target.draining) {
                stuck.push((target.id, blocked));
            }
            println!(
                "{:<9} {:<17} {:<12} {:<6} {:<30} {node}",
                target.id.0,
                reachability(target.reachability),
                consistency,
                target.pool.0,
                drain
            );
        }
        for (target, blocked) in stuck {
            println!(
                "target {target}: the drain waits: {} files cannot move off it: {}",
                blocked.files, blocked.why
            );
        }
    } else {
        println!("{:<9} {:<6} NODE", "TARGETID", "POOL");
        for target in &map.targets {
            let node = node_name(&map, NodeKind::Storage, target.node);
            println!("{:<9} {:<6} {node}", target.id.0, target.pool.0);
        }
    }
    Ok(())
}

pub(super) fn usage_line(name: &str, usage: &SpaceUsage) -> String {
    let percent = |free: u64, total: u64| (free * 100).checked_div(total).unwrap_or(0);
    format!(
        "{name:<24} {:>11} {:>11} {:>4}% {:>12} {:>12} {:>4}%",
        human(usage.total_bytes),
        human(usage.free_bytes),
        percent(usage.free_bytes, usage.total_bytes),
        usage.total_inodes,
        usage.free_inodes,
        percent(usage.free_inodes, usage.total_inodes)
    )
}

pub fn df(args: ClusterArgs) -> Result<()> {
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        let map = cluster_map(&locate(&args.locator, args.path.as_deref())?).await?;
        let header = format!(
            "{:<24} {:>11} {:>11} {:>5} {:>12} {:>12} {:>5}",
            "", "SIZE", "FREE", "FREE", "INODES", "IFREE", "IFREE"
        );
        println!("METADATA SERVERS:\n{header}");
        for node in map.nodes.iter().filter(|n| n.kind == NodeKind::Meta) {
            let usage = node.meta_usage.unwrap_or_default();
            println!(
                "{}",
                usage_line(&format!("{} [ID: {}]", node.alias, node.id), &usage)
            );
        }
        println!("\nSTORAGE TARGETS:\n{header}");
        let mut total = SpaceUsage::default();
        for target in &map.targets {
            println!(
                "{}",
                usage_line(
                    &format!("target {} @ node {}", target.id, target.node),
                    &target.usage
                )
            );
            total.total_bytes += target.usage.total_bytes;
            total.free_bytes += target.usage.free_bytes;
        }
        println!(
            "\nTotal storage: {} of which {} free",
            human(total.total_bytes),
            human(total.free_bytes)
        );
        Ok(())
    })
}
