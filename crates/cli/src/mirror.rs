//! `weft mirror create|autocreate|list|resync-stats`: mirror groups of storage targets and
//! metadata nodes, and how far returning members are brought up to date.

use crate::admin::{connect, ClusterArgs};
use anyhow::{anyhow, Result};
use clap::{Subcommand, ValueEnum};
use weft_net::MgmtCalls;
use weft_proto::ids::MemberId;
use weft_proto::messages::{
    ClusterMap, Consistency, MirrorGroupInfo, MirrorKind, NodeKind, ResyncProgress,
};

#[derive(Clone, Copy, ValueEnum)]
pub enum Kind {
    /// Storage targets, each group's members on different storage servers.
    Storage,
    /// Metadata nodes.
    Meta,
}

impl From<Kind> for MirrorKind {
    fn from(kind: Kind) -> MirrorKind {
        match kind {
            Kind::Storage => MirrorKind::Storage,
            Kind::Meta => MirrorKind::Meta,
        }
    }
}

#[derive(Subcommand)]
pub enum MirrorCommand {
    /// Create a mirror group of these members (target ids or metadata node ids; the first is
    /// primary), each on a different node.
    Create {
        /// What the group mirrors.
        kind: Kind,
        /// Member ids, e.g. 1,3.
        #[arg(long, value_delimiter = ',', required = true)]
        members: Vec<u32>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Pair every target (or metadata node) not in a group yet with one on another node.
    Autocreate {
        /// What the groups mirror.
        kind: Kind,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// List the mirror groups: members, primary, version and states.
    List {
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Show how far each storage member that needs a resync has been brought up to date.
    ResyncStats {
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

fn state(state: Consistency) -> &'static str {
    state.into()
}

/// A member as `weft` shows it: `target 3 @ storage-2` or `meta-1`.
fn member_name(map: &ClusterMap, group: &MirrorGroupInfo, id: MemberId) -> String {
    let node = group.members.iter().find(|m| m.id == id).map(|m| m.node);
    let alias = |kind: NodeKind| {
        node.and_then(|node| map.node(kind, node))
            .map(|n| n.alias.clone())
            .unwrap_or_else(|| "?".to_string())
    };
    match group.kind {
        MirrorKind::Storage => format!("target {id} @ {}", alias(NodeKind::Storage)),
        MirrorKind::Meta => format!("metadata node {id} ({})", alias(NodeKind::Meta)),
    }
}

fn print_groups(map: &ClusterMap, groups: &[MirrorGroupInfo]) {
    println!(
        "{:<7} {:<8} {:<8} {:<32} SECONDARIES",
        "GROUP", "KIND", "VERSION", "PRIMARY"
    );
    for group in groups {
        let primary_state = group
            .members
            .iter()
            .find(|m| m.id == group.primary)
            .map_or("?", |m| state(m.state));
        let primary = format!(
            "{} ({primary_state})",
            member_name(map, group, group.primary)
        );
        let secondaries: Vec<String> = group
            .members
            .iter()
            .filter(|m| m.id != group.primary)
            .map(|m| format!("{} ({})", member_name(map, group, m.id), state(m.state)))
            .collect();
        println!(
            "{:<7} {:<8} {:<8} {:<32} {}",
            group.id,
            <&str>::from(group.kind),
            group.version,
            primary,
            secondaries.join(", ")
        );
    }
}

fn print_resyncs(map: &ClusterMap, stats: &[ResyncProgress]) {
    let resyncing = map
        .mirror_groups
        .iter()
        .flat_map(|g| g.members.iter().map(move |m| (g, m)))
        .filter(|(_, m)| m.state == Consistency::NeedsResync)
        .count();
    if resyncing == 0 {
        println!("no mirror member needs a resync");
        return;
    }
    println!(
        "{:<7} {:<8} {:<32} {:<8} {:<10} {:<20} {:<10} STATE",
        "GROUP", "KIND", "MEMBER", "VERSION", "ELAPSED", "COPIED", "BYTES"
    );
    for group in &map.mirror_groups {
        let kind = <&str>::from(group.kind);
        let unit = match group.kind {
            MirrorKind::Storage => "objects",
            MirrorKind::Meta => "chunks",
        };
        for member in group
            .members
            .iter()
            .filter(|m| m.state == Consistency::NeedsResync)
        {
            let name = member_name(map, group, member.id);
            match stats
                .iter()
                .find(|p| p.kind == group.kind && p.group == group.id && p.member == member.id)
            {
                Some(progress) => println!(
                    "{:<7} {:<8} {:<32} {:<8} {:<10} {:<20} {:<10} {}",
                    group.id,
                    kind,
                    name,
                    progress.version,
                    format!("{:.1} s", progress.elapsed_ms as f64 / 1000.0),
                    format!(
                        "{} / {} {unit}",
                        progress.objects_copied, progress.objects_total
                    ),
                    crate::admin::format_size(progress.bytes_copied),
                    if progress.done {
                        "copied, waiting for management"
                    } else {
                        "copying"
                    }
                ),
                None => println!(
                    "{:<7} {:<8} {:<32} {:<8} {:<10} {:<20} {:<10} waiting for the primary",
                    group.id, kind, name, group.version, "-", "-", "-"
                ),
            }
        }
    }
}

pub fn mirror(command: MirrorCommand) -> Result<()> {
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        match command {
            MirrorCommand::Create {
                kind,
                members,
                cluster,
            } => {
                let mgmt = cluster.mgmt()?;
                let (view, _) = connect(&mgmt).await?;
                let created = view
                    .mgmt()
                    .create_mirror_group(kind.into(), members.into_iter().map(MemberId).collect())
                    .await
                    .map_err(|error| anyhow!("cannot create the mirror group: {error}"))?;
                let map = view.refresh().await?;
                print_groups(&map, &created);
            }
            MirrorCommand::Autocreate { kind, cluster } => {
                let mgmt = cluster.mgmt()?;
                let (view, _) = connect(&mgmt).await?;
                let created = view
                    .mgmt()
                    .autocreate_mirror_groups(kind.into())
                    .await
                    .map_err(|error| anyhow!("cannot create mirror groups: {error}"))?;
                let map = view.refresh().await?;
                if created.is_empty() {
                    println!(
                        "nothing to pair: every member is in a group, or the rest share one node"
                    );
                } else {
                    print_groups(&map, &created);
                }
            }
            MirrorCommand::List { cluster } => {
                let (_, map) = connect(&cluster.mgmt()?).await?;
                print_groups(&map, &map.mirror_groups);
            }
            MirrorCommand::ResyncStats { cluster } => {
                let (view, map) = connect(&cluster.mgmt()?).await?;
                let stats = view
                    .mgmt()
                    .resync_stats()
                    .await
                    .map_err(|error| anyhow!("cannot ask for resync progress: {error}"))?;
                print_resyncs(&map, &stats);
            }
        }
        Ok(())
    })
}
