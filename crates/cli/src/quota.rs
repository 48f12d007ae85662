//! `weft quota report`: the space and inodes each user and group uses, per storage pool,
//! summed over every metadata home.

use crate::admin::{connect, format_size, ClusterArgs};
use anyhow::{anyhow, Result};
use clap::Subcommand;
use weft_proto::quota::{add_usage, QuotaKind, QuotaUsage};

#[derive(Subcommand)]
pub enum QuotaCommand {
    /// What each user and group uses, per storage pool: bytes (file sizes) and inodes.
    Report {
        /// Only this user (name or id).
        #[arg(long)]
        user: Option<String>,
        /// Only this group (name or id).
        #[arg(long)]
        group: Option<String>,
        /// Only this pool (name or id).
        #[arg(long)]
        pool: Option<String>,
        #[command(flatten)]
        cluster: ClusterArgs,
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

pub fn quota(command: QuotaCommand) -> Result<()> {
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        match command {
            QuotaCommand::Report {
                user,
                group,
                pool,
                cluster,
            } => {
                let (view, map) = connect(&cluster.mgmt()?).await?;
                let pool = pool
                    .map(|name| crate::pool::pool_named(&map, &name))
                    .transpose()?;
                let user = user.map(|u| id_of(QuotaKind::User, &u)).transpose()?;
                let group = group.map(|g| id_of(QuotaKind::Group, &g)).transpose()?;
                let rows: Vec<QuotaUsage> = cluster_usage(&view)
                    .await?
                    .into_iter()
                    .filter(|row| pool.as_ref().is_none_or(|p| p.id == row.pool))
                    .filter(|row| match (user, group) {
                        (None, None) => true,
                        (Some(uid), gid) => {
                            (row.kind == QuotaKind::User && row.id == uid)
                                || gid.is_some_and(|gid| {
                                    row.kind == QuotaKind::Group && row.id == gid
                                })
                        }
                        (None, Some(gid)) => row.kind == QuotaKind::Group && row.id == gid,
                    })
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
            }
        }
        Ok(())
    })
}
