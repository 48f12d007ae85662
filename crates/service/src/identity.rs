//! A node's identity: the id management allocated, kept in the node's data directory so that a
//! restart (possibly on a new address) comes back as the same node.

use crate::durable::{read_record, write_record, RecordError};
use std::path::Path;
use weft_proto::ids::{NodeId, TargetId};

const NODE_ID_MAGIC: [u8; 4] = *b"WNID";
const TARGET_ID_MAGIC: [u8; 4] = *b"WTID";
const ID_FORMAT_VERSION: u16 = 1;
/// File in a node's data directory that holds its node id.
pub const NODE_ID_FILE: &str = "node.id";
/// File in a storage target's directory that holds its target id.
pub const TARGET_ID_FILE: &str = "target.id";

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

/// Registers a server with management, keeping the id saved in `data_dir` (or saving the one
/// management allocates). Retries while management is unreachable, so servers may start first.
///
/// # Errors
/// A message saying what is wrong: a damaged id file, or management refusing or unreachable
/// after the retry policy's time.
pub async fn register_node(
    data_dir: &Path,
    mgmt: &weft_net::MgmtClient,
    kind: weft_proto::messages::NodeKind,
    alias: &str,
    addresses: Vec<String>,
) -> Result<NodeId, String> {
    let saved = load_node_id(data_dir).map_err(|e| e.to_string())?;
    let policy = weft_net::retry::RetryPolicy::default();
    let node = policy
        .run(|| mgmt.register_node(saved, kind, alias.to_string(), addresses.clone()))
        .await
        .map_err(|error| format!("cannot register with management at {}: {error}; check that management runs and the address is right", mgmt.address()))?;
    if saved != Some(node) {
        save_node_id(data_dir, node).map_err(|e| e.to_string())?;
    }
    Ok(node)
}
