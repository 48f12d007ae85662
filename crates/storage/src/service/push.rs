//! Pushes: an object moving off this target (a drain, `weft entry migrate`) is copied to its
//! new target, or restriped into its file's new layout, in rounds, then sealed here and on
//! this group's members (see `crate::moves` for the seal and the watch of its changes).

use super::*;
use weft_mirror::push::{Restarted, Round, Step};
use weft_proto::answer::{Synced, Written};

impl Storage {
    /// Serves a push of an object of `target` to its new place (a move): to the target
    /// `to`, or restriped into the layout `into`; answers how many bytes it copied.
    pub(super) async fn serve_push(
        &self,
        target: Arc<Target>,
        (inode, to, id): (InodeId, weft_proto::TargetId, u64),
        seal: bool,
        (into, group): (
            Option<weft_proto::messages::Restripe>,
            Option<weft_proto::ids::GroupId>,
        ),
    ) -> Result<u64, WireError> {
        match into {
            Some(restripe) => {
                self.push_restripe(target, (inode, id), seal, (restripe, group))
                    .await
            }
            None => self.push(target, (inode, to, id), seal).await,
        }
    }

    /// Pushes the plain object of `inode` on `target` to target `to` for move `id` (see
    /// `crate::moves`): the first push copies it all, later ones what changed since the last
    /// that completed, and a push with `seal` seals it, copies its last changes, syncs the
    /// copy and drops the data here. The copy's writes go as the changes of one sender per
    /// object stripe, numbered in order, so a late copy of one retried cannot land over a
    /// newer one; a copy whose server restarted since it took earlier rounds (its verifier
    /// changed) is made again in full. Answers the bytes copied.
    pub(super) async fn push(
        &self,
        target: Arc<Target>,
        (inode, to, id): (InodeId, weft_proto::TargetId, u64),
        seal: bool,
    ) -> Result<u64, WireError> {
        /// Bytes read and sent per write of the copy.
        const PIECE: u64 = 1 << 20;
        let object = ObjectId::new(Space::Plain, inode);
        let (_one, stripe, taken) = self.take_push(&target, (object, None), id, seal).await?;
        let crate::target::Taken::Changed {
            watched,
            length,
            generation,
        } = taken
        else {
            return Ok(0);
        };
        let to_slot = weft_proto::layout::Slot::Target(to);
        let plan = weft_mirror::push::Plan {
            piece: PIECE,
            boundary: u64::MAX,
            verify_each_round: false,
            clear_when_whole: true,
            mirrored: false,
        };
        let mut round = Round::new(watched, length, seal, plan, Some(to_slot));
        let restarted = |Restarted(copy)| {
            target.moves().restart(object, id);
            copy_restarted(copy, inode)
        };
        let retry = weft_net::retry::RetryPolicy::default();
        let mut copied = 0;
        while let Some(step) = round.next_step() {
            match step {
                Step::Clear => {
                    let tag = self.push_tag(stripe);
                    self.cluster
                        .call_storage(to_slot, &retry, |storage, route| {
                            let tag = tag.clone();
                            async move { storage.remove_tagged(route, inode, tag).await }
                        })
                        .await
                        .map_err(rpc_error)?;
                }
                Step::Copy(piece) => {
                    let source = Arc::clone(&target);
                    let data =
                        blocking(move || source.read(object, piece.offset, piece.len as u32))
                            .await?;
                    // On a fresh copy a hole stays a hole, but for the last byte, which gives
                    // the copy its length; a changed range may have become zeros and is
                    // written.
                    if !piece.fresh || piece.last || data.iter().any(|&byte| byte != 0) {
                        let len = data.len() as u64;
                        let answered = self
                            .write_copy(
                                to_slot,
                                ((inode, generation), piece.offset),
                                (data, self.push_tag(stripe)),
                                (&retry, &|| Ok(())),
                            )
                            .await?;
                        round.answered(to_slot, answered).map_err(restarted)?;
                        copied += len;
                    }
                }
                Step::Verify => {
                    let Synced { verifier } = self
                        .cluster
                        .call_storage(to_slot, &retry, |storage, route| async move {
                            storage.sync(route, inode, None).await
                        })
                        .await
                        .map_err(rpc_error)?;
                    round.answered(to_slot, verifier).map_err(restarted)?;
                }
                Step::Retire => {
                    let target = Arc::clone(&target);
                    blocking(move || target.retire(object)).await?;
                }
                Step::Ack { verifier } => target.moves().ack(object, id, verifier),
                Step::SealMembers => unreachable!("a plain object has no members"),
            }
        }
        Ok(copied)
    }

    /// The start of a push of the plain object of `inode` on `target` for move `id`: alone
    /// on the object's push stripe (answered, with the guard), takes what changed of it since
    /// the last round, sealing it first for the last one.
    pub(super) async fn take_push(
        &self,
        target: &Arc<Target>,
        (object, group): (ObjectId, Option<weft_proto::ids::GroupId>),
        id: u64,
        seal: bool,
    ) -> Result<(tokio::sync::MutexGuard<'_, ()>, usize, crate::target::Taken), WireError> {
        let inode = object.inode;
        let stripe = push_stripe(inode);
        let one = self.pushing[stripe].lock().await;
        // A mirrored object is sealed once every change its primary took has reached the
        // members too: the changes hold their ranges until forwarded, and none is admitted
        // after the seal (see `as_primary`).
        let _whole = match (object.space, seal) {
            (Space::Mirrored, true) => {
                Some(self.mirror.lock_range(target.id, inode, 0..u64::MAX).await)
            }
            _ => None,
        };
        let looked = Arc::clone(target);
        let sealing = seal.then(|| crate::moves::SealMark {
            verifier: self.mirror.unsynced_boot(),
            group: group.map(|group| group.0),
        });
        let taken = blocking(move || looked.take_changes(object, id, sealing)).await?;
        Ok((one, stripe, taken))
    }

    /// The next change of the synthetic sender of object stripe `stripe` (see [`Self::push`]).
    pub(super) fn push_tag(&self, stripe: usize) -> weft_proto::messages::ChangeTag {
        let sender = weft_proto::ids::ClientId(self.push_sender | stripe as u64);
        let number = self.push_numbers[stripe].fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        weft_proto::messages::ChangeTag {
            client: sender,
            number,
            settled_below: number,
            abandoned: Vec::new(),
        }
    }

    /// Pushes the object of `inode` on `target`, slot `restripe.slot` of the file's layout,
    /// into the objects of the layout the file gets, for move `id`: as [`Self::push`], but
    /// each byte goes to its place in the new layout, ranges of zeros are punched there (the
    /// new objects may hold an earlier round's bytes; the object's last byte is written, so
    /// the copies' lengths still give the file's), and every round syncs the new objects
    /// before and after it: no earlier round can be lost by a restart of their servers, and
    /// one that restarted during the round (another verifier) has the whole object copied
    /// again. The new layout is another pattern (a restripe), or the same one with some
    /// slots on other mirror groups (a mirrored file's move).
    ///
    /// The object of a mirrored file is pushed by its group's primary (this target, or the
    /// push is refused as sent to a stale route), whose members took every change it did;
    /// the copies are writes to the new groups' primaries, which forward them as any write.
    /// Its last push seals it on every member as here ([`StorageRequest::Seal`]) once the
    /// copy is synced, then drops its data here: until then a member that takes over as
    /// primary holds all of it and is pushed from in full, and after it none takes a
    /// change a client with the old layout sends.
    pub(super) async fn push_restripe(
        &self,
        target: Arc<Target>,
        (inode, id): (InodeId, u64),
        seal: bool,
        (restripe, named): (
            weft_proto::messages::Restripe,
            Option<weft_proto::ids::GroupId>,
        ),
    ) -> Result<u64, WireError> {
        use weft_proto::layout::Slot;
        let group = restriped_group(inode, &restripe, named)?;
        let weft_proto::messages::Restripe { slot, from, to } = restripe;
        // A mirrored object is pushed by its group's primary only, and only while it is one:
        // checked before every write of the copy too (and every try of one), so a primary
        // deposed meanwhile (another took over, and its own push copies the object) sends no
        // stale bytes after its lease.
        let admitted = || match group {
            Some(group) => self.admit_group_push(&target, group),
            None => Ok(()),
        };
        admitted()?;
        let object = ObjectId::new(Space::mirrored(group.is_some()), inode);
        let (_one, stripe, taken) = self.take_push(&target, (object, group), id, seal).await?;
        let plan = restripe_plan(&from, group.is_some());
        let gone = matches!(taken, crate::target::Taken::Gone);
        let (mut round, generation) = match taken {
            crate::target::Taken::Changed {
                watched,
                length,
                generation,
            } => {
                if seal && group.is_some() {
                    weft_service::failpoint::failpoint("mirrored-push-after-seal");
                }
                (Round::new(watched, length, seal, plan, None), generation)
            }
            // Gone here: its members were sealed before (sealed again).
            crate::target::Taken::Gone => (Round::gone(plan), 0),
        };
        let restarted = |Restarted(copy)| {
            target.moves().restart(object, id);
            copy_restarted(copy, inode)
        };
        let retry = weft_net::retry::RetryPolicy::default();
        let copies: Vec<Slot> = to
            .slots()
            .filter(|s| !from.slots().any(|f| f == *s))
            .collect();
        let restriped = Restriped {
            file: (inode, generation),
            from: &from,
            slot,
            to: &to,
            copies: &copies,
        };
        // Held from the members' seal on: a resync of the object then finds it sealed.
        let mut _whole = None;
        let mut copied = 0;
        while let Some(step) = round.next_step() {
            match step {
                Step::Verify => {
                    for (copy, verifier) in self.copy_verifiers(inode, &copies, &retry).await? {
                        round.answered(copy, verifier).map_err(restarted)?;
                    }
                }
                Step::Copy(piece) => {
                    let source = (&target, object, piece);
                    for (copy, answered) in self
                        .copy_restriped(source, restriped, stripe, (&retry, &admitted))
                        .await?
                    {
                        if let Some((answered, written)) = answered {
                            round.answered(copy, answered).map_err(restarted)?;
                            copied += written;
                        }
                    }
                }
                Step::SealMembers => {
                    let group = group.expect("only a mirrored object's members are sealed");
                    _whole = Some(self.mirror.lock_range(target.id, inode, 0..u64::MAX).await);
                    admitted()?;
                    self.seal_members(&target, group, inode).await?;
                    if !gone {
                        weft_service::failpoint::failpoint("mirrored-push-after-members-sealed");
                    }
                }
                Step::Retire => {
                    let target = Arc::clone(&target);
                    blocking(move || target.retire(object)).await?;
                }
                Step::Ack { verifier } => {
                    weft_service::failpoint::failpoint("restripe-push-after-round");
                    target.moves().ack(object, id, verifier);
                }
                Step::Clear => unreachable!("a restripe's copies are not cleared"),
            }
        }
        Ok(copied)
    }

    /// Copies one piece of `object` on `target` into its places in the file's new layout, as
    /// changes of object stripe `stripe`'s push sender, each try only if `admitted` still says
    /// so: ranges of zeros are punched there (the new objects may hold an earlier round's
    /// bytes), but the object's last byte is written, so the copies' lengths still give the
    /// file's. Answers each copy written to, with the verifier its write answered and the
    /// bytes it wrote (a punch answers neither).
    async fn copy_restriped(
        &self,
        (target, object, piece): (&Arc<Target>, ObjectId, weft_mirror::push::Piece),
        restriped: Restriped<'_>,
        stripe: usize,
        (retry, admitted): (
            &weft_net::retry::RetryPolicy,
            &(dyn Fn() -> Result<(), WireError> + Sync),
        ),
    ) -> Result<Vec<(weft_proto::layout::Slot, Option<(u64, u64)>)>, WireError> {
        let Restriped {
            file,
            from,
            slot,
            to,
            copies,
        } = restriped;
        let inode = file.0;
        let source = Arc::clone(target);
        let data = blocking(move || source.read(object, piece.offset, piece.len as u32)).await?;
        let mut data = bytes::BytesMut::from(&data[..]);
        data.resize(piece.len as usize, 0);
        let data = data.freeze();
        let file_offset = weft_proto::layout::file_offset_of(from, usize::from(slot), piece.offset);
        let mut answers = Vec::new();
        for place in weft_proto::layout::map_range(to, file_offset, piece.len) {
            let copy = to.slot(place.slot_index);
            if !copies.contains(&copy) {
                return Err(WireError::new(
                    ErrorCode::InvalidArgument,
                    format!("a push of {inode} would write into {copy}, which holds an object of the file already"),
                ));
            }
            let start = (place.file_offset - file_offset) as usize;
            let bytes = data.slice(start..start + place.len as usize);
            let holds_last = piece.last && start + bytes.len() == data.len();
            let tag = self.push_tag(stripe);
            let answered = if bytes.iter().all(|&byte| byte == 0) && !holds_last {
                let punch = |storage: Arc<weft_net::StorageClient>, route| {
                    let tag = tag.clone();
                    let admitted = admitted().map_err(weft_net::RpcError::Remote);
                    async move {
                        admitted?;
                        storage
                            .fallocate(
                                route,
                                file,
                                place.object_offset,
                                place.len,
                                weft_proto::messages::FallocateMode::Zero,
                                Some(tag),
                                None,
                                // A move's copy: not a client's growth.
                                None,
                            )
                            .await
                    }
                };
                self.cluster
                    .call_storage(copy, retry, punch)
                    .await
                    .map_err(rpc_error)?;
                None
            } else {
                let answered = self
                    .write_copy(
                        copy,
                        (file, place.object_offset),
                        (bytes, tag),
                        (retry, admitted),
                    )
                    .await?;
                Some((answered, place.len))
            };
            answers.push((copy, answered));
        }
        Ok(answers)
    }

    /// Checks that `target` is the primary of `group`, whose object a push is for, in the
    /// group's version known here and with its lease.
    pub(super) fn admit_group_push(
        &self,
        target: &Target,
        group: weft_proto::ids::GroupId,
    ) -> Result<(), WireError> {
        let route = self.own_route(target, group)?;
        self.mirror.admit_primary(target.id, route).map(|_| ())
    }

    /// The route of a change `target` makes itself as primary of `group`: the group's version
    /// known here.
    pub(super) fn own_route(
        &self,
        target: &Target,
        group: weft_proto::ids::GroupId,
    ) -> Result<MirrorRoute, WireError> {
        let known = self.mirror.membership.group(group).ok_or_else(|| {
            weft_net::mirror::stale(format!(
                "target {} knows no storage mirror group {group}",
                target.id
            ))
        })?;
        Ok(MirrorRoute {
            group,
            version: known.version,
            forwarded: false,
        })
    }

    /// Seals the object of `inode` on every present member of `group`, whose primary is
    /// `target` (one absent is owed it, as any change, and gets it with its resync).
    pub(super) async fn seal_members(
        &self,
        target: &Target,
        group: weft_proto::ids::GroupId,
        inode: InodeId,
    ) -> Result<(), WireError> {
        let seal = StorageRequest::Seal {
            target: target.id,
            mirror: None,
            inode,
        };
        let route = self.own_route(target, group)?;
        let forwarding = self.mirror.begin(target.id, route, &seal, 0)?;
        self.mirror
            .forward(forwarding, &seal, &Bytes::new())
            .await
            .map(drop)
    }

    /// Writes `data` at `offset` of the object of `file` (inode, truncate generation) in
    /// slot `copy` (a target, or a mirror group through its primary), as change `tag` of a
    /// push, each try only if `admitted` still says so; a short write fails. Answers the
    /// copy's server's verifier.
    pub(super) async fn write_copy(
        &self,
        copy: weft_proto::layout::Slot,
        (file, offset): ((InodeId, u64), u64),
        (data, tag): (Bytes, weft_proto::messages::ChangeTag),
        (retry, admitted): (
            &weft_net::retry::RetryPolicy,
            &(dyn Fn() -> Result<(), WireError> + Sync),
        ),
    ) -> Result<u64, WireError> {
        let write = |storage: Arc<weft_net::StorageClient>, route| {
            let (data, tag) = (data.clone(), tag.clone());
            let admitted = admitted().map_err(weft_net::RpcError::Remote);
            async move {
                admitted?;
                let write = weft_net::ObjectWrite {
                    file,
                    offset,
                    data,
                    tag: Some(tag),
                    capability: None,
                    owner: None,
                };
                storage.write(route, write).await
            }
        };
        let Written {
            len: written,
            verifier: answered,
        } = self
            .cluster
            .call_storage(copy, retry, write)
            .await
            .map_err(rpc_error)?;
        if written as usize != data.len() {
            return Err(WireError::new(
                ErrorCode::Io,
                format!(
                    "{copy} took {written} of {} bytes copied of {}",
                    data.len(),
                    file.0
                ),
            ));
        }
        Ok(answered)
    }

    /// Syncs the objects of `inode` in `copies`, all at once, answering each one's verifier.
    pub(super) async fn copy_verifiers(
        &self,
        inode: InodeId,
        copies: &[weft_proto::layout::Slot],
        retry: &weft_net::retry::RetryPolicy,
    ) -> Result<std::collections::BTreeMap<weft_proto::layout::Slot, u64>, WireError> {
        let syncs = copies.iter().map(|&copy| async move {
            let Synced { verifier } = self
                .cluster
                .call_storage(copy, retry, |storage, route| async move {
                    storage.sync(route, inode, None).await
                })
                .await
                .map_err(rpc_error)?;
            Ok((copy, verifier))
        });
        futures::future::join_all(syncs).await.into_iter().collect()
    }
}

/// How a restripe's round copies (or a mirrored object's move), from layout `from`.
fn restripe_plan(from: &weft_proto::layout::FileLayout, mirrored: bool) -> weft_mirror::push::Plan {
    weft_mirror::push::Plan {
        // Bytes read per step of the copy.
        piece: 1 << 20,
        // Within one chunk of the old layout: one contiguous range of the file.
        boundary: u64::from(from.pattern.chunk_size_bytes),
        // A punch answers no verifier, so the copies are synced at both ends of a round.
        verify_each_round: true,
        clear_when_whole: false,
        mirrored,
    }
}

/// The storage mirror group of the object a push of `restripe` is for (`None`: a plain
/// object), checked against the group the request `named`.
fn restriped_group(
    inode: InodeId,
    restripe: &weft_proto::messages::Restripe,
    named: Option<weft_proto::ids::GroupId>,
) -> Result<Option<weft_proto::ids::GroupId>, WireError> {
    let (slot, from) = (restripe.slot, &restripe.from);
    if usize::from(slot) >= from.width() {
        return Err(WireError::new(
            ErrorCode::InvalidArgument,
            format!(
                "a push of slot {slot} of a layout of {} slots",
                from.width()
            ),
        ));
    }
    let group = match from.slot(usize::from(slot)) {
        weft_proto::layout::Slot::Target(_) => None,
        weft_proto::layout::Slot::Group(group) => Some(group),
    };
    if group != named {
        return Err(WireError::new(
            ErrorCode::InvalidArgument,
            format!("a push of slot {slot} of {inode} names another storage mirror group than its layout"),
        ));
    }
    Ok(group)
}

/// Where a restripe's piece goes: the object of `file` (inode, truncate generation) in slot
/// `slot` of layout `from`, into the objects of layout `to` in `copies` (its slots that the
/// file does not use yet).
#[derive(Clone, Copy)]
pub(super) struct Restriped<'a> {
    file: (InodeId, u64),
    from: &'a weft_proto::layout::FileLayout,
    slot: u16,
    to: &'a weft_proto::layout::FileLayout,
    copies: &'a [weft_proto::layout::Slot],
}

/// Stripes of the locks that keep one push of an object at a time (and a truncate from
/// landing while one runs), and of the pushes' change numbers.
pub(super) const PUSH_STRIPES: usize = 64;

/// The push stripe of the objects of `inode`.
pub(super) fn push_stripe(inode: InodeId) -> usize {
    (inode.0 % PUSH_STRIPES as u64) as usize
}

/// A push's copy whose server restarted during the round: the whole object is copied again.
pub(super) fn copy_restarted(copy: weft_proto::layout::Slot, inode: InodeId) -> WireError {
    WireError::new(
        ErrorCode::Unavailable,
        format!("the server of {copy} restarted while {inode} was copied to it: copying it again"),
    )
}
