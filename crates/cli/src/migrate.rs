//! `weft entry migrate`: moves a file, or every file of a tree, onto other targets while it
//! stays in use. The metadata server of each file runs the move (and resumes it after a
//! restart); this command asks for each file in turn and waits for it.

use crate::admin::{connect, inode_of, Cluster};
use anyhow::{bail, Context, Result};
use std::path::Path;
use weft_net::ClusterView;
use weft_net::MetaCalls;
use weft_proto::ids::{StoragePoolId, TargetId};
use weft_proto::layout::StripePattern;

/// Where the files should go.
pub(crate) struct Destination {
    pub pool: Option<StoragePoolId>,
    pub targets: Vec<TargetId>,
    /// The chunk size and width to restripe into (0: the file's own).
    pub pattern: Option<(u32, u16)>,
}

/// What a migrate did.
#[derive(Default)]
struct Tally {
    files: u64,
    moved: u64,
    slots: u64,
    directories: u64,
}

/// Moves `path` (a file, or every file under a directory) to `destination` (a pool, targets,
/// a pattern of another chunk size or width: `(chunk, width)`, 0 for the file's own); the
/// directories of the tree give their new files the pool and the pattern too.
pub(crate) async fn migrate(
    cluster: &Cluster,
    path: &Path,
    (pool, targets): (Option<String>, Option<String>),
    pattern: Option<(u32, u16)>,
) -> Result<()> {
    let (view, map) = connect(cluster).await?;
    let pool = match pool {
        Some(name) => Some(crate::pool::pool_named(&map, &name)?.id),
        None => None,
    };
    let targets = match targets {
        Some(list) => list
            .split(',')
            .map(|id| {
                id.trim()
                    .parse::<u32>()
                    .map(TargetId)
                    .with_context(|| format!("--targets: {id:?} is not a target id"))
            })
            .collect::<Result<Vec<_>>>()?,
        None => Vec::new(),
    };
    if pool.is_none() && targets.is_empty() && pattern.is_none() {
        bail!(
            "nowhere to move to: give --pool NAME, --targets ID,ID,… or --chunk-size and --num-targets"
        );
    }
    let metadata = std::fs::symlink_metadata(path)
        .with_context(|| format!("cannot stat {}", path.display()))?;
    if metadata.is_dir() && !targets.is_empty() {
        bail!("--targets names the targets of one file: give --pool to move a tree");
    }
    let destination = Destination {
        pool,
        targets,
        pattern,
    };
    let mut tally = Tally::default();
    let client = if metadata.is_dir() {
        Some(cluster.client().await?)
    } else {
        None
    };
    for entry in crate::admin::Tree::new(path) {
        let (path, metadata) = entry?;
        if metadata.is_dir() {
            if let Some(client) = &client {
                if set_directory_pattern(client, &path, &destination).await? {
                    tally.directories += 1;
                }
            }
        } else if metadata.is_file() {
            let slots = migrate_file(&view, &path, &destination).await?;
            tally.files += 1;
            if slots > 0 {
                tally.moved += 1;
                tally.slots += u64::from(slots);
            }
        }
    }
    if let Some(client) = &client {
        // On disk before the tool goes, which it tells the homes: it keeps nothing to replay
        // once it has exited.
        client.close().await?;
    }
    println!(
        "{} files looked at: {} moved ({} objects), {} already in place; {} directories give their new files the new pool or pattern",
        tally.files,
        tally.moved,
        tally.slots,
        tally.files - tally.moved,
        tally.directories
    );
    Ok(())
}

/// How long a migrate waits for a file's metadata server that does not answer (restarting,
/// or its mirror group failing over) before it gives up.
const META_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// Moves one file and waits until its move is done; answers how many of its objects moved. A
/// metadata server that does not answer is waited for (the move is asked for again: asking
/// twice does not move twice).
async fn migrate_file(view: &ClusterView, path: &Path, to: &Destination) -> Result<u16> {
    let inode = inode_of(path)?;
    let patience = weft_net::retry::RetryPolicy {
        total_timeout: META_WAIT,
        ..weft_net::retry::RetryPolicy::default()
    };
    loop {
        let (moving, done) = view
            .call_meta(inode.home(), &patience, |meta| {
                let targets = to.targets.clone();
                async move { meta.migrate(inode, to.pool, targets, to.pattern).await }
            })
            .await
            .with_context(|| format!("cannot move {}", path.display()))?;
        if done {
            if moving > 0 {
                println!("{}: {moving} objects moved", path.display());
            }
            return Ok(moving);
        }
        println!("{}: {moving} objects moving…", path.display());
    }
}

/// Gives a directory's new files the pool and the chunk size and width the files move to,
/// keeping the rest of its pattern; answers whether it changed.
async fn set_directory_pattern(
    client: &std::sync::Arc<weft_client::Client>,
    path: &Path,
    to: &Destination,
) -> Result<bool> {
    let inode = inode_of(path)?;
    let attr = client
        .get_attr(inode)
        .await
        .with_context(|| format!("cannot read {}", path.display()))?;
    let Some(pattern) = attr.pattern else {
        return Ok(false);
    };
    let (chunk, width) = to.pattern.unwrap_or((0, 0));
    let new = StripePattern {
        pool: to.pool.unwrap_or(pattern.pool),
        chunk_size_bytes: if chunk == 0 {
            pattern.chunk_size_bytes
        } else {
            chunk
        },
        num_targets: if width == 0 {
            pattern.num_targets
        } else {
            width
        },
        ..pattern
    };
    if new == pattern {
        return Ok(false);
    }
    client
        .set_pattern(inode, new)
        .await
        .with_context(|| format!("cannot set the pattern of {}", path.display()))?;
    Ok(true)
}
