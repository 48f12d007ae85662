//! `weft entry migrate`: moves a file, or every file of a tree, onto other targets while it
//! stays in use. The metadata server of each file runs the move (and resumes it after a
//! restart); this command asks for each file in turn and waits for it.

use crate::admin::{connect, inode_of, Cluster};
use anyhow::{bail, Context, Result};
use std::path::Path;
use weft_net::ClusterView;
use weft_proto::ids::{StoragePoolId, TargetId};
use weft_proto::layout::StripePattern;

/// Where the files should go.
pub(crate) struct Destination {
    pub pool: Option<StoragePoolId>,
    pub targets: Vec<TargetId>,
}

/// What a migrate did.
#[derive(Default)]
struct Tally {
    files: u64,
    moved: u64,
    slots: u64,
    directories: u64,
}

/// Moves `path` (a file, or every file under a directory) to `destination`; with a pool, the
/// directories of the tree send their new files there too.
pub(crate) async fn migrate(
    cluster: &Cluster,
    path: &Path,
    pool: Option<String>,
    targets: Option<String>,
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
    if pool.is_none() && targets.is_empty() {
        bail!("nowhere to move to: give --pool NAME or --targets ID,ID,…");
    }
    let metadata = std::fs::symlink_metadata(path)
        .with_context(|| format!("cannot stat {}", path.display()))?;
    if metadata.is_dir() && !targets.is_empty() {
        bail!("--targets names the targets of one file: give --pool to move a tree");
    }
    let destination = Destination { pool, targets };
    let mut tally = Tally::default();
    let client = if metadata.is_dir() {
        Some(cluster.client().await?)
    } else {
        None
    };
    for entry in crate::admin::Tree::new(path) {
        let (path, metadata) = entry?;
        if metadata.is_dir() {
            if let (Some(client), Some(pool)) = (&client, destination.pool) {
                set_directory_pool(client, &path, pool).await?;
                tally.directories += 1;
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
    println!(
        "{} files looked at: {} moved ({} objects), {} already in place; {} directories send new files to the pool",
        tally.files,
        tally.moved,
        tally.slots,
        tally.files - tally.moved,
        tally.directories
    );
    Ok(())
}

/// Moves one file and waits until its move is done; answers how many of its objects moved.
async fn migrate_file(view: &ClusterView, path: &Path, to: &Destination) -> Result<u16> {
    let inode = inode_of(path)?;
    let meta = view.meta(inode.home()).await?;
    loop {
        let (moving, done) = meta
            .migrate(inode, to.pool, to.targets.clone())
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

/// Makes a directory's new files go to `pool`, keeping the rest of its pattern.
async fn set_directory_pool(
    client: &std::sync::Arc<weft_client::Client>,
    path: &Path,
    pool: StoragePoolId,
) -> Result<()> {
    let inode = inode_of(path)?;
    let attr = client
        .get_attr(inode)
        .await
        .with_context(|| format!("cannot read {}", path.display()))?;
    let Some(pattern) = attr.pattern else {
        return Ok(());
    };
    if pattern.pool == pool {
        return Ok(());
    }
    let pattern = StripePattern { pool, ..pattern };
    client
        .set_pattern(inode, pattern)
        .await
        .with_context(|| format!("cannot set the pool of {}", path.display()))?;
    Ok(())
}
