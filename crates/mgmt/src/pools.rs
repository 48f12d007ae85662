//! Storage pools in management: creating and removing them, moving targets between them (a
//! target in a storage mirror group moves with its group), and their capacity limits. Every
//! change is committed before it is answered and published in the next cluster map.

use crate::mirrors::Mirrors;
use crate::store::MgmtStore;
use crate::MgmtError;
use std::collections::BTreeSet;
use weft_proto::error::WireError;
use weft_proto::ids::{MemberId, StoragePoolId, TargetId};
use weft_proto::messages::{MgmtResponse, MirrorKind};
use weft_proto::pools::{valid_pool_name, CapacityLimits, PoolInfo, POOL_NAME_MAX};
use weft_proto::ErrorCode;

fn invalid(message: String) -> WireError {
    WireError::new(ErrorCode::InvalidArgument, message)
}

/// What a pool change did, for the answer and the event log.
pub(crate) struct Changed {
    pub response: MgmtResponse,
    pub event: String,
}

/// The pool `id`, or a NotFound naming it.
fn find(store: &MgmtStore, id: StoragePoolId) -> Result<PoolInfo, Refused> {
    store
        .pools()?
        .into_iter()
        .find(|pool| pool.id == id)
        .ok_or_else(|| {
            Refused::Wire(WireError::new(
                ErrorCode::NotFound,
                format!("storage pool {id} does not exist (weft pool list)"),
            ))
        })
}

/// Why a pool change was not made: the request's fault, or the store's.
pub(crate) enum Refused {
    Wire(WireError),
    Store(MgmtError),
}

impl From<MgmtError> for Refused {
    fn from(error: MgmtError) -> Refused {
        Refused::Store(error)
    }
}

impl From<WireError> for Refused {
    fn from(error: WireError) -> Refused {
        Refused::Wire(error)
    }
}

pub(crate) fn create(store: &MgmtStore, name: &str) -> Result<Changed, Refused> {
    if !valid_pool_name(name) {
        return Err(invalid(format!(
            "{name:?} cannot name a pool: use 1 to {POOL_NAME_MAX} letters, digits, '-', '_' or '.', not only digits"
        ))
        .into());
    }
    let Some(pool) = store.create_pool(name)? else {
        return Err(WireError::new(
            ErrorCode::Exists,
            format!("a storage pool is called {name:?} already"),
        )
        .into());
    };
    Ok(Changed {
        event: format!("storage pool {} ({}) created", pool.name, pool.id),
        response: MgmtResponse::Pool(pool),
    })
}

pub(crate) fn remove(store: &MgmtStore, id: StoragePoolId) -> Result<Changed, Refused> {
    let pool = find(store, id)?;
    if id == StoragePoolId::DEFAULT {
        return Err(invalid(
            "the default pool cannot be removed: every new target joins it".into(),
        )
        .into());
    }
    let held: Vec<String> = store
        .targets()?
        .into_iter()
        .filter(|(_, record)| record.pool == id)
        .map(|(target, _)| target.to_string())
        .collect();
    if !held.is_empty() {
        return Err(WireError::new(
            ErrorCode::NotEmpty,
            format!(
                "storage pool {} still holds targets {}: move them out first (weft pool remove-target)",
                pool.name,
                held.join(", ")
            ),
        )
        .into());
    }
    store.remove_pool(id)?;
    Ok(Changed {
        event: format!("storage pool {} ({id}) removed", pool.name),
        response: MgmtResponse::Done,
    })
}

/// Moves `targets` from pool `from` to pool `to`. A target in a storage mirror group moves
/// only with every other member of its group, so a group never spans two pools.
pub(crate) fn move_targets(
    store: &MgmtStore,
    mirrors: &Mirrors,
    targets: &[TargetId],
    from: StoragePoolId,
    to: StoragePoolId,
) -> Result<Changed, Refused> {
    let from_pool = find(store, from)?;
    let to_pool = find(store, to)?;
    if targets.is_empty() {
        return Err(invalid("name at least one target".into()).into());
    }
    let registered = store.targets()?;
    let moving: BTreeSet<TargetId> = targets.iter().copied().collect();
    for target in &moving {
        match registered.iter().find(|(id, _)| id == target) {
            None => {
                return Err(WireError::new(
                    ErrorCode::NotFound,
                    format!("target {target} is not registered (weft target list)"),
                )
                .into())
            }
            Some((_, record)) if record.pool != from => {
                return Err(invalid(format!(
                    "target {target} is in pool {}, not in {}",
                    record.pool, from_pool.name
                ))
                .into())
            }
            Some(_) => {}
        }
    }
    for group in mirrors.groups(MirrorKind::Storage) {
        let members: Vec<TargetId> = group
            .members
            .iter()
            .map(|m| TargetId::from(m.server))
            .collect();
        let named = members.iter().filter(|t| moving.contains(t)).count();
        if named > 0 && named < members.len() {
            let list: Vec<String> = members.iter().map(TargetId::to_string).collect();
            return Err(invalid(format!(
                "target {} is in storage mirror group {} with targets {}: a group moves whole, so name all its targets (or --mirror-groups {})",
                members
                    .iter()
                    .find(|t| moving.contains(t))
                    .copied()
                    .unwrap_or(TargetId(0)),
                group.id,
                list.join(", "),
                group.id
            ))
            .into());
        }
    }
    let list: Vec<TargetId> = moving.into_iter().collect();
    store.set_targets_pool(&list, to)?;
    let names: Vec<String> = list.iter().map(TargetId::to_string).collect();
    Ok(Changed {
        event: format!(
            "targets {} moved from storage pool {} to {}",
            names.join(", "),
            from_pool.name,
            to_pool.name
        ),
        response: MgmtResponse::Done,
    })
}

pub(crate) fn set_limits(
    store: &MgmtStore,
    id: StoragePoolId,
    low: CapacityLimits,
    emergency: CapacityLimits,
) -> Result<Changed, Refused> {
    let mut pool = find(store, id)?;
    if emergency.free_bytes > low.free_bytes || emergency.free_inodes > low.free_inodes {
        return Err(invalid(format!(
            "the emergency limits ({} bytes, {} inodes free) must not be above the low ones ({} bytes, {} inodes)",
            emergency.free_bytes, emergency.free_inodes, low.free_bytes, low.free_inodes
        ))
        .into());
    }
    pool.low = low;
    pool.emergency = emergency;
    store.save_pool(&pool)?;
    Ok(Changed {
        event: format!(
            "storage pool {} limits set: low below {} bytes or {} inodes free, emergency below {} bytes or {} inodes",
            pool.name, low.free_bytes, low.free_inodes, emergency.free_bytes, emergency.free_inodes
        ),
        response: MgmtResponse::Pool(pool),
    })
}

/// Refuses a storage mirror group whose members are in different pools: its chunks would
/// land in both.
pub(crate) fn check_group_pool(store: &MgmtStore, members: &[MemberId]) -> Result<(), Refused> {
    let targets = store.targets()?;
    let pools: BTreeSet<StoragePoolId> = targets
        .iter()
        .filter(|(id, _)| members.contains(&MemberId::from(*id)))
        .map(|(_, record)| record.pool)
        .collect();
    if pools.len() > 1 {
        let list: Vec<String> = pools.iter().map(StoragePoolId::to_string).collect();
        return Err(invalid(format!(
            "the members are in different storage pools ({}): a mirror group belongs to one pool, so move them into one first (weft pool add-target)",
            list.join(", ")
        ))
        .into());
    }
    Ok(())
}
