//! `weft quota set|list|report|project`: limits on the space and inodes users, groups and
//! projects use in each storage pool, what they use, summed over every metadata home, and
//! the project of a directory tree.

use crate::admin::{connect, format_size, ClusterArgs};
use anyhow::{anyhow, Context, Result};
use clap::Subcommand;
use weft_net::MetaCalls;
use weft_net::MgmtCalls;
use weft_proto::quota::{add_usage, QuotaKind, QuotaLimits, QuotaRule, QuotaUsage};

/// Whose quota: a user, a group or a project.
#[derive(clap::Args)]
#[group(multiple = false)]
pub struct Whose {
    /// A user (name or id).
    #[arg(long)]
    user: Option<String>,
    /// A group (name or id).
    #[arg(long)]
    group: Option<String>,
    /// A project: the id `weft quota project` gave a directory tree.
    #[arg(long)]
    project: Option<u32>,
}

impl Whose {
    /// The kind and id named, if one is.
    fn named(&self) -> Result<Option<(QuotaKind, u32)>> {
        Ok(match (&self.user, &self.group, self.project) {
            (Some(user), _, _) => Some((QuotaKind::User, id_of(QuotaKind::User, user)?)),
            (_, Some(group), _) => Some((QuotaKind::Group, id_of(QuotaKind::Group, group)?)),
            (_, _, Some(0)) => anyhow::bail!("project 0 is no project: name one from 1 up"),
            (_, _, Some(project)) => Some((QuotaKind::Project, project)),
            (None, None, None) => None,
        })
    }
}

#[derive(Subcommand)]
pub enum QuotaCommand {
    /// Set the limits of a user, group or project in a pool (0 or absent: no limit; all
    /// absent: the rule is removed). Over a hard limit, or over a soft one for longer than
    /// the grace period (management's quota_grace_period_ms, a week by default), new inodes
    /// or writes that grow files are refused with EDQUOT.
    Set {
        #[command(flatten)]
        whose: Whose,
        /// The pool (name or id); the default pool when absent.
        #[arg(long)]
        pool: Option<String>,
        /// Soft limit of bytes (file sizes), e.g. 900G.
        #[arg(long)]
        soft_bytes: Option<String>,
        /// Hard limit of bytes, e.g. 1T.
        #[arg(long)]
        hard_bytes: Option<String>,
        /// Soft limit of inodes.
        #[arg(long)]
        soft_inodes: Option<u64>,
        /// Hard limit of inodes.
        #[arg(long)]
        hard_inodes: Option<u64>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// List every quota rule with what its user, group or project uses and where it stands.
    List {
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// What each user, group and project uses, per storage pool: bytes (file sizes) and
    /// inodes.
    Report {
        /// Only this user, group or project.
        #[command(flatten)]
        whose: Whose,
        /// Only this pool (name or id).
        #[arg(long)]
        pool: Option<String>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Make a directory tree a project: DIR and everything under it count in project ID's
    /// quotas (0: in none), and what is made in it later takes the id. A rename into a tree
    /// of another project is refused with EXDEV (`mv` then copies), as on XFS and Lustre.
    Project {
        /// The top of the tree, through a Weft mount.
        dir: std::path::PathBuf,
        /// The project id.
        id: u32,
        #[command(flatten)]
        locator: crate::MgmtLocator,
    },
}

/// A user's or group's id from its name or number.
fn id_of(kind: QuotaKind, name: &str) -> Result<u32> {
    if let Ok(id) = name.parse() {
        return Ok(id);
    }
    let found = match kind {
        QuotaKind::User => nix_user(name),
        QuotaKind::Group => nix_group(name),
        QuotaKind::Project => None,
    };
    found.ok_or_else(|| {
        anyhow!(
            "there is no {} called {name:?} on this host",
            <&str>::from(kind)
        )
    })
}

fn nix_user(name: &str) -> Option<u32> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: getpwnam reads a NUL-terminated name; the record it returns is read at once.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    // SAFETY: a non-null record from getpwnam is valid until the next call.
    (!entry.is_null()).then(|| unsafe { (*entry).pw_uid })
}

fn nix_group(name: &str) -> Option<u32> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: getgrnam reads a NUL-terminated name; the record it returns is read at once.
    let entry = unsafe { libc::getgrnam(name.as_ptr()) };
    // SAFETY: a non-null record from getgrnam is valid until the next call.
    (!entry.is_null()).then(|| unsafe { (*entry).gr_gid })
}

/// The name this host gives a user or group id, or the number.
fn name_of(kind: QuotaKind, id: u32) -> String {
    // SAFETY: getpwuid/getgrgid return a record valid until the next call, read at once.
    let name = unsafe {
        match kind {
            QuotaKind::User => {
                let entry = libc::getpwuid(id);
                (!entry.is_null()).then(|| std::ffi::CStr::from_ptr((*entry).pw_name))
            }
            QuotaKind::Group => {
                let entry = libc::getgrgid(id);
                (!entry.is_null()).then(|| std::ffi::CStr::from_ptr((*entry).gr_name))
            }
            QuotaKind::Project => None,
        }
        .map(|name| name.to_string_lossy().into_owned())
    };
    name.unwrap_or_else(|| id.to_string())
}

/// What every metadata home says its inodes use, summed.
pub(crate) async fn cluster_usage(view: &weft_net::ClusterView) -> Result<Vec<QuotaUsage>> {
    let map = view.map();
    let mut total = Vec::new();
    for home in map.meta_homes() {
        let meta = view.meta(home).await?;
        let usage = meta
            .quota_usage()
            .await
            .map_err(|error| anyhow!("cannot read the usage of metadata home {home}: {error}"))?;
        add_usage(&mut total, &usage);
    }
    Ok(total)
}

/// A limit as `weft` shows it: `-` for none.
fn limit(value: u64, size: bool) -> String {
    match (value, size) {
        (0, _) => "-".into(),
        (value, true) => format_size(value),
        (value, false) => value.to_string(),
    }
}

/// Where a quota stands: ok, in its grace period (until when), or blocked.
fn standing(blocked: bool, grace_ends: Option<u64>) -> String {
    if blocked {
        return "BLOCKED".into();
    }
    match grace_ends {
        Some(end) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            format!("grace {}h left", end.saturating_sub(now) / 3600)
        }
        None => "ok".into(),
    }
}

pub fn quota(command: QuotaCommand) -> Result<()> {
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        match command {
            QuotaCommand::Set {
                whose,
                pool,
                soft_bytes,
                hard_bytes,
                soft_inodes,
                hard_inodes,
                cluster,
            } => {
                let limits = (soft_bytes, hard_bytes, soft_inodes, hard_inodes);
                set(&whose, pool, limits, &cluster).await
            }
            QuotaCommand::Project { dir, id, locator } => project(&dir, id, &locator).await,
            QuotaCommand::List { cluster } => list(&cluster).await,
            QuotaCommand::Report {
                whose,
                pool,
                cluster,
            } => report(&whose, pool, &cluster).await,
        }
    })
}

/// `weft quota set`: the limits are soft and hard bytes (sizes), soft and hard inodes.
async fn set(
    whose: &Whose,
    pool: Option<String>,
    (soft_bytes, hard_bytes, soft_inodes, hard_inodes): Limits,
    cluster: &ClusterArgs,
) -> Result<()> {
    let (view, map) = connect(&cluster.mgmt()?).await?;
    let (kind, id) = whose
        .named()?
        .ok_or_else(|| anyhow!("name a --user, a --group or a --project"))?;
    let pool = match pool {
        Some(name) => crate::pool::pool_named(&map, &name)?.id,
        None => weft_proto::StoragePoolId::DEFAULT,
    };
    let size = |text: Option<String>| -> Result<u64> {
        text.map_or(Ok(0), |text| crate::admin::parse_size(&text))
    };
    let rule = QuotaRule {
        kind,
        id,
        pool,
        limits: QuotaLimits {
            soft_bytes: size(soft_bytes)?,
            hard_bytes: size(hard_bytes)?,
            soft_inodes: soft_inodes.unwrap_or(0),
            hard_inodes: hard_inodes.unwrap_or(0),
        },
    };
    view.mgmt()
        .set_quota(rule)
        .await
        .map_err(|error| anyhow!("cannot set the quota: {error}"))?;
    if rule.limits.is_empty() {
        println!(
            "quota of {} {id} in pool {} removed",
            <&str>::from(kind),
            crate::pool::pool_label(&map, pool)
        );
    } else {
        println!(
            "quota of {} {id} in pool {} set",
            <&str>::from(kind),
            crate::pool::pool_label(&map, pool)
        );
    }
    Ok(())
}

/// `weft quota project`.
async fn project(dir: &std::path::Path, id: u32, locator: &crate::MgmtLocator) -> Result<()> {
    let dir = crate::absolute(dir);
    let cluster = crate::admin::locate(locator, Some(&dir))?;
    let client = cluster.client().await?;
    let changes = weft_proto::messages::AttrChanges {
        project: Some(id),
        ..Default::default()
    };
    let mut entries = 0u64;
    for entry in crate::admin::Tree::new(&dir) {
        let (path, _) = entry?;
        client
            .set_attr(crate::admin::inode_of(&path)?, changes)
            .await
            .with_context(|| format!("cannot set the project of {}", path.display()))?;
        entries += 1;
    }
    // On disk before the tool goes, which it tells the homes: it keeps nothing to replay
    // once it has exited.
    client.close().await?;
    match id {
        0 => println!("{entries} entries of {} are in no project", dir.display()),
        id => println!(
            "{entries} entries of {} count in project {id}; new ones will too",
            dir.display()
        ),
    }
    Ok(())
}

/// `weft quota list`.
async fn list(cluster: &ClusterArgs) -> Result<()> {
    let (view, map) = connect(&cluster.mgmt()?).await?;
    let states = view
        .mgmt()
        .quotas()
        .await
        .map_err(|error| anyhow!("cannot read the quotas: {error}"))?;
    println!(
        "{:<6} {:<12} {:>8} {:<12} {:>10} {:>10} {:>10} {:<16} {:>8} {:>8} {:>8} STATE",
        "TYPE", "NAME", "ID", "POOL", "USED", "SOFT", "HARD", "SPACE", "INODES", "SOFT", "HARD"
    );
    for state in states {
        let rule = state.rule;
        println!(
            "{:<6} {:<12} {:>8} {:<12} {:>10} {:>10} {:>10} {:<16} {:>8} {:>8} {:>8} {}",
            <&str>::from(rule.kind),
            name_of(rule.kind, rule.id),
            rule.id,
            map.pool(rule.pool)
                .map_or_else(|| rule.pool.to_string(), |p| p.name),
            format_size(state.bytes),
            limit(rule.limits.soft_bytes, true),
            limit(rule.limits.hard_bytes, true),
            standing(state.bytes_blocked, state.bytes_grace_ends),
            state.inodes,
            limit(rule.limits.soft_inodes, false),
            limit(rule.limits.hard_inodes, false),
            standing(state.inodes_blocked, state.inodes_grace_ends),
        );
    }
    Ok(())
}

/// `weft quota report`.
async fn report(whose: &Whose, pool: Option<String>, cluster: &ClusterArgs) -> Result<()> {
    let (view, map) = connect(&cluster.mgmt()?).await?;
    let pool = pool
        .map(|name| crate::pool::pool_named(&map, &name))
        .transpose()?;
    let whose = whose.named()?;
    let rows: Vec<QuotaUsage> = cluster_usage(&view)
        .await?
        .into_iter()
        .filter(|row| pool.as_ref().is_none_or(|p| p.id == row.pool))
        .filter(|row| whose.is_none_or(|whose| whose == (row.kind, row.id)))
        .collect();
    println!(
        "{:<6} {:<16} {:>8} {:<16} {:>12} {:>10}",
        "TYPE", "NAME", "ID", "POOL", "USED", "INODES"
    );
    for row in rows {
        println!(
            "{:<6} {:<16} {:>8} {:<16} {:>12} {:>10}",
            <&str>::from(row.kind),
            name_of(row.kind, row.id),
            row.id,
            crate::pool::pool_label(&map, row.pool),
            format_size(row.bytes),
            row.inodes
        );
    }
    Ok(())
}

/// The limits `weft quota set` is given: soft and hard bytes, soft and hard inodes.
type Limits = (Option<String>, Option<String>, Option<u64>, Option<u64>);
