//! A node's identity: the id management allocated, kept in the node's data directory so that a
//! restart (possibly on a new address) comes back as the same node.

use crate::durable::{read_record, write_record, RecordError};
use std::path::Path;
use weft_net::MgmtCalls;
use weft_proto::ids::{NodeId, TargetId};

const NODE_ID_MAGIC: [u8; 4] = *b"WNID";
const TARGET_ID_MAGIC: [u8; 4] = *b"WTID";
const BOOT_MAGIC: [u8; 4] = *b"WBOT";
const ID_FORMAT_VERSION: u16 = 1;
/// File in a node's data directory that holds its node id.
pub const NODE_ID_FILE: &str = "node.id";
/// File in a storage target's directory that holds its target id.
pub const TARGET_ID_FILE: &str = "target.id";
/// File in a node's data directory that holds the boot id of its last start.
pub const BOOT_FILE: &str = "boot.id";

fn read_u32(path: &Path, magic: [u8; 4]) -> Result<Option<u32>, RecordError> {
    let Some(payload) = read_record(path, magic, ID_FORMAT_VERSION)? else {
        return Ok(None);
    };
    let bytes: [u8; 4] = payload
        .as_slice()
        .try_into()
        .map_err(|_| RecordError::Corrupt {
            path: path.to_path_buf(),
            reason: "id record is not 4 bytes".into(),
        })?;
    Ok(Some(u32::from_le_bytes(bytes)))
}

/// The node id saved in `data_dir`, if any.
///
/// # Errors
/// [`RecordError`] when the file exists but cannot be read or is damaged.
pub fn load_node_id(data_dir: &Path) -> Result<Option<NodeId>, RecordError> {
    Ok(read_u32(&data_dir.join(NODE_ID_FILE), NODE_ID_MAGIC)?.map(NodeId))
}

/// Saves the node id in `data_dir`, durably.
///
/// # Errors
/// [`RecordError`] when the write fails.
pub fn save_node_id(data_dir: &Path, node: NodeId) -> Result<(), RecordError> {
    write_record(
        &data_dir.join(NODE_ID_FILE),
        NODE_ID_MAGIC,
        ID_FORMAT_VERSION,
        &node.0.to_le_bytes(),
    )
}

/// The target id saved in a target directory, if any.
///
/// # Errors
/// [`RecordError`] when the file exists but cannot be read or is damaged.
pub fn load_target_id(target_dir: &Path) -> Result<Option<TargetId>, RecordError> {
    Ok(read_u32(&target_dir.join(TARGET_ID_FILE), TARGET_ID_MAGIC)?.map(TargetId))
}

/// Saves a target id in its directory, durably.
///
/// # Errors
/// [`RecordError`] when the write fails.
pub fn save_target_id(target_dir: &Path, target: TargetId) -> Result<(), RecordError> {
    write_record(
        &target_dir.join(TARGET_ID_FILE),
        TARGET_ID_MAGIC,
        ID_FORMAT_VERSION,
        &target.0.to_le_bytes(),
    )
}

/// The boot id of this start of the node whose data directory is `data_dir`: larger than
/// the one of its last start (saved there, durably, before it is used), so that management
/// tells a late heartbeat of an earlier start from a restart. The clock's nanoseconds since
/// the epoch, or one more than the last boot id if the clock went back.
///
/// # Errors
/// [`RecordError`] when the last boot id cannot be read or the new one cannot be saved.
pub fn next_boot(data_dir: &Path) -> Result<u64, RecordError> {
    let path = data_dir.join(BOOT_FILE);
    let last = match read_record(&path, BOOT_MAGIC, ID_FORMAT_VERSION)? {
        Some(payload) => {
            let bytes: [u8; 8] =
                payload
                    .as_slice()
                    .try_into()
                    .map_err(|_| RecordError::Corrupt {
                        path: path.clone(),
                        reason: "boot record is not 8 bytes".into(),
                    })?;
            u64::from_le_bytes(bytes)
        }
        None => 0,
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let boot = now.max(last.saturating_add(1));
    write_record(&path, BOOT_MAGIC, ID_FORMAT_VERSION, &boot.to_le_bytes())?;
    Ok(boot)
}

/// Why a server could not register with management.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// The saved id could not be read or the new one saved.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// The listener's address could not be read.
    #[error("cannot read the listener's address")]
    Address(#[source] std::io::Error),
    /// Management refused, or stayed unreachable for the retry policy's time.
    #[error(
        "cannot register with management at {address} (check that management runs and the \
         address is right)"
    )]
    Management {
        /// Management's address.
        address: String,
        /// What the last attempt met.
        #[source]
        source: weft_net::RpcError,
    },
}

/// Registers a server with management, keeping the id saved in `data_dir` (or saving the one
/// management allocates). Retries while management is unreachable, so servers may start first.
///
/// # Errors
/// A damaged id file, or management refusing or unreachable after the retry policy's time.
pub async fn register_node(
    data_dir: &Path,
    mgmt: &weft_net::MgmtClient,
    kind: weft_proto::messages::NodeKind,
    alias: &str,
    addresses: Vec<String>,
) -> Result<NodeId, RegisterError> {
    let saved = load_node_id(data_dir)?;
    let policy = weft_net::retry::RetryPolicy::default();
    let node = policy
        .run(|| mgmt.register_node(saved, kind, alias.to_string(), addresses.clone()))
        .await
        .map_err(|source| RegisterError::Management {
            address: mgmt.address().to_string(),
            source,
        })?;
    if saved != Some(node) {
        save_node_id(data_dir, node)?;
    }
    Ok(node)
}

/// A member server registered with management: the address it serves on, its alias, and the
/// node id management knows it by.
#[derive(Clone, Debug)]
pub struct Registered {
    /// The addresses its listeners took, comma-separated (one per rail).
    pub address: String,
    /// Its alias: the configured one, or the host name.
    pub alias: String,
    /// Its node id.
    pub node: NodeId,
}

/// Registers a server of `kind` serving on `listeners` ([`register_node`]) with every rail's
/// address, named `alias` or else by the host name.
///
/// # Errors
/// As [`register_node`], or a listener's address unreadable.
pub async fn register_listener(
    data_dir: &Path,
    mgmt: &weft_net::MgmtClient,
    kind: weft_proto::messages::NodeKind,
    alias: Option<String>,
    listeners: &weft_net::Listeners,
) -> Result<Registered, RegisterError> {
    let addresses = listeners.addresses().map_err(RegisterError::Address)?;
    let address = weft_net::rail_address(&addresses);
    let alias = alias.unwrap_or_else(crate::host_name);
    let node = register_node(data_dir, mgmt, kind, &alias, addresses).await?;
    Ok(Registered {
        address,
        alias,
        node,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: every start of a node gets a boot id larger than the last one, also when the
    // clock went back (the saved id is ahead of it).
    #[test]
    fn boot_ids_grow_with_every_start() {
        let directory = tempfile::tempdir().expect("tempdir");
        let first = next_boot(directory.path()).expect("first start");
        let second = next_boot(directory.path()).expect("second start");
        assert!(second > first);
        let ahead = u64::MAX - 10;
        write_record(
            &directory.path().join(BOOT_FILE),
            BOOT_MAGIC,
            ID_FORMAT_VERSION,
            &ahead.to_le_bytes(),
        )
        .expect("a boot id from a clock ahead");
        assert_eq!(next_boot(directory.path()).expect("after"), ahead + 1);
    }
}
