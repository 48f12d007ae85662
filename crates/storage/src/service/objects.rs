//! A request on one of this server's targets, run on the calling thread (it may block): a
//! read or change of an object's bytes ([`on_target`]), or a look at the target's objects
//! ([`look_at_target`]: listings, lengths, checksums, a member's seal).

use super::*;

/// Runs a request on `target`, this server's own, on the calling thread (it may block): a
/// read or change of an object, or a look at the target's objects. Its changes answer with
/// `verifier`, the server's loss epoch now.
pub(super) fn on_target(
    target: &Target,
    request: StorageRequest,
    payload: Bytes,
    verifier: u64,
) -> Result<(StorageResponse, Bytes), WireError> {
    let space = Space::of(request.mirror());
    let object = move |inode: InodeId| ObjectId::new(space, inode);
    match request {
        StorageRequest::Write {
            inode,
            generation,
            object_offset,
            tag,
            ..
        } => {
            let object = object(inode);
            let mut len = match tag.is_some_and(|tag| is_push_copy(tag.client)) {
                true => target.write_pushed(object, object_offset, payload, generation)?,
                false => target.write(object, object_offset, payload, generation)?,
            };
            if weft_service::failpoint::misbehave("storage-answers-short-writes") {
                len = len.saturating_sub(1);
            }
            Ok((StorageResponse::Written { len, verifier }, Bytes::new()))
        }
        StorageRequest::Read {
            inode,
            generation,
            object_offset,
            len,
            ..
        } => {
            if len > IO_BYTES_MAX {
                return Err(WireError::new(
                    ErrorCode::InvalidArgument,
                    format!("read of {len} bytes exceeds {IO_BYTES_MAX}"),
                ));
            }
            Ok((
                StorageResponse::Data,
                target.read_admitted(object(inode), generation, object_offset, len)?,
            ))
        }
        StorageRequest::Truncate {
            inode,
            length,
            generation,
            ..
        } => target
            .truncate(object(inode), length, generation)
            .map_err(WireError::from)
            .map(|()| (StorageResponse::Done, Bytes::new())),
        StorageRequest::Remove { inode, .. } => target
            .remove(object(inode))
            .map_err(WireError::from)
            .map(|()| (StorageResponse::Done, Bytes::new())),
        StorageRequest::Sync { inode, .. } => {
            target.sync(object(inode))?;
            // An object that moved away answers as it did when it was sealed.
            let verifier = target
                .moves()
                .sealed_verifier(object(inode))
                .unwrap_or(verifier);
            Ok((StorageResponse::Synced { verifier }, Bytes::new()))
        }
        StorageRequest::SyncTarget { .. } => target
            .sync_everything()
            .map_err(WireError::from)
            .map(|()| (StorageResponse::Synced { verifier }, Bytes::new())),
        StorageRequest::Fallocate {
            inode,
            generation,
            object_offset,
            len,
            mode,
            ..
        } => target
            .fallocate(object(inode), (object_offset, len), mode, generation)
            .map_err(WireError::from)
            .map(|()| (StorageResponse::Done, Bytes::new())),
        other => look_at_target(target, other, verifier),
    }
}

/// [`on_target`] for what is not a read or change of one object's bytes: listings, lengths,
/// checksums, and a member's seal.
fn look_at_target(
    target: &Target,
    request: StorageRequest,
    verifier: u64,
) -> Result<(StorageResponse, Bytes), WireError> {
    let space = Space::of(request.mirror());
    let object = move |inode: InodeId| ObjectId::new(space, inode);
    match request {
        StorageRequest::ListObjects {
            mirrored,
            home,
            after,
            max,
            ..
        } => {
            let (objects, end) = target.list_objects(
                Space::mirrored(mirrored),
                home,
                after,
                max.min(OBJECTS_PER_LIST_MAX),
            )?;
            Ok((StorageResponse::Objects { objects, end }, Bytes::new()))
        }
        StorageRequest::ObjectLength { inode, .. } => Ok((
            StorageResponse::Length(target.length(object(inode))?),
            Bytes::new(),
        )),
        StorageRequest::ObjectChecksum {
            mirrored,
            inode,
            offset,
            len,
            ..
        } => {
            let object = ObjectId::new(Space::mirrored(mirrored), inode);
            let range = (offset, len.min(CHECKSUM_BYTES_MAX));
            let (length, crc) = target.checksum(object, range)?;
            Ok((StorageResponse::Checksum { length, crc }, Bytes::new()))
        }
        StorageRequest::Seal { inode, mirror, .. } => target
            .seal_and_retire(
                object(inode),
                crate::moves::SealMark {
                    verifier,
                    group: mirror.map(|route| route.group.0),
                },
            )
            .map_err(WireError::from)
            .map(|()| (StorageResponse::Done, Bytes::new())),
        StorageRequest::NetBench { .. }
        | StorageRequest::Bench { .. }
        | StorageRequest::Push { .. }
        | StorageRequest::RemoveObjects { .. }
        | StorageRequest::CopyFrom { .. } => {
            unreachable!("answered, made a write, or made removals before it reaches its target")
        }
        StorageRequest::Write { .. }
        | StorageRequest::Read { .. }
        | StorageRequest::Truncate { .. }
        | StorageRequest::Remove { .. }
        | StorageRequest::Sync { .. }
        | StorageRequest::SyncTarget { .. }
        | StorageRequest::Fallocate { .. } => unreachable!("run by on_target"),
    }
}
