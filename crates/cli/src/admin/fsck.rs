//! `weft fsck`: every metadata server checks its namespace and its files' objects (all at once,
//! or one path's tree), reports progress while it runs, and repairs what is safe with
//! `--repair`.

use super::*;
use weft_net::MetaCalls;

#[derive(Args)]
pub struct FsckArgs {
    /// Fix what can be fixed safely, then check again.
    #[arg(long)]
    repair: bool,
    #[command(flatten)]
    cluster: ClusterArgs,
}

/// How often `weft fsck` shows how far a check is.
pub(super) const CHECK_PROGRESS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// How long `weft fsck` waits for one metadata server's check: comparing the copies of every
/// mirrored file reads all their data.
pub(super) const CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Runs `meta`'s check, showing on stderr how far it is while it runs.
pub(super) async fn check_one(
    mgmt: &Cluster,
    view: &ClusterView,
    node: &weft_proto::messages::NodeInfo,
    repair: bool,
    referenced: Vec<InodeId>,
) -> Result<weft_proto::messages::CheckReport> {
    // The check's own connection waits as long as the check takes.
    let patient = ClusterView::new(
        mgmt.mgmt.clone(),
        RpcClientOptions {
            request_timeout: CHECK_TIMEOUT,
            ..mgmt.options()?
        },
    );
    let meta = patient.meta(node.id).await?;
    let check = meta.check(repair, referenced);
    tokio::pin!(check);
    let mut ticker = tokio::time::interval(CHECK_PROGRESS_INTERVAL);
    ticker.tick().await;
    loop {
        tokio::select! {
            report = &mut check => {
                return report.with_context(|| format!("check of {} failed", node.alias));
            }
            _ = ticker.tick() => {
                let progress = view.meta(node.id).await?.check_progress().await;
                if let Some(progress) = progress.ok().filter(|progress| progress.running) {
                    let count = if progress.total > 0 {
                        format!(": {} of {}", progress.done, progress.total)
                    } else {
                        String::new()
                    };
                    eprintln!("{}: {}{count}", node.alias, progress.phase);
                }
            }
        }
    }
}

/// Runs the check on every metadata node; returns the problems found.
pub(super) async fn check_all(
    mgmt: &Cluster,
    view: &ClusterView,
    map: &ClusterMap,
    repair: bool,
) -> Result<u64> {
    // Directories may live on another server than the dentry naming them: each server learns
    // which of its inodes are named elsewhere.
    let mut referenced: std::collections::HashMap<weft_proto::NodeId, Vec<InodeId>> =
        std::collections::HashMap::new();
    for node in map.nodes.iter().filter(|n| n.kind == NodeKind::Meta) {
        let meta = view.meta(node.id).await?;
        for inode in meta
            .remote_references()
            .await
            .with_context(|| format!("cannot ask {}", node.alias))?
        {
            referenced.entry(inode.home()).or_default().push(inode);
        }
    }
    let mut problems = 0;
    for node in map.nodes.iter().filter(|n| n.kind == NodeKind::Meta) {
        let referenced = referenced.remove(&node.id).unwrap_or_default();
        let report = check_one(mgmt, view, node, repair, referenced).await?;
        println!(
            "{} [ID: {}]: {} inodes, {} entries, {} objects checked",
            node.alias, node.id, report.inodes, report.dentries, report.objects
        );
        for problem in &report.problems {
            println!("  problem: {problem}");
        }
        if report.problem_count > report.problems.len() as u64 {
            println!(
                "  … and {} more problems",
                report.problem_count - report.problems.len() as u64
            );
        }
        for repair in &report.repairs {
            println!("  repaired: {repair}");
        }
        for target in &report.unreachable_targets {
            println!("  warning: target {target} did not answer; its objects were not checked");
        }
        problems += report.problem_count;
    }
    Ok(problems)
}

pub fn fsck(args: FsckArgs) -> Result<()> {
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        let mgmt = locate(&args.cluster.locator, args.cluster.path.as_deref())?;
        let (view, map) = connect(&mgmt).await?;
        let mut problems = check_all(&mgmt, &view, &map, args.repair).await?;
        if args.repair && problems > 0 {
            println!("checking again after the repair:");
            problems = check_all(&mgmt, &view, &map, false).await?;
        }
        if problems > 0 {
            bail!(
                "{problems} problems remain{}",
                if args.repair {
                    " that cannot be fixed safely"
                } else {
                    "; run weft fsck --repair to fix what can be fixed safely"
                }
            );
        }
        println!("The namespace and the objects are consistent.");
        Ok(())
    })
}
