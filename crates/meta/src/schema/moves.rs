//! The records of moves: a file's move in flight ([`MOVES`], [`MoveWork`]) and the slots
//! that hold its tombstones once moved ([`TOMBSTONES`], [`SlotId`]). The mover
//! (`service/moves.rs`) plans and runs moves over them; the namespace operations read them
//! where a file's objects go (a truncate, a removal) and fsck checks them.

use super::{OpError, RecordTable, Records};
use crate::store::{ReadableTable, WriteTransaction};
use serde::{Deserialize, Serialize};
use weft_proto::ids::{GroupId, InodeId, StoragePoolId, TargetId};
use weft_proto::layout::{FileLayout, PatternKind, Slot};

/// Files whose objects are moving: inode → postcard [`MoveWork`], in protocol version 5 (a
/// store's `moves` of version 4 is converted when it opens).
pub(crate) const MOVES: RecordTable<MoveWork> = RecordTable::new("moves_v5");

/// Slots that hold a tombstone of a file (its objects moved away from them): inode →
/// postcard list of [`SlotId`]s. Their objects are removed with the file's.
pub(crate) const TOMBSTONES: RecordTable<Vec<SlotId>> = RecordTable::new("tombstones");

/// A slot of a file's layout as a move or a tombstone records it: the id of a target, or of
/// a storage mirror group for a mirrored file, whose layout's kind tells which (as a stored
/// layout's slots do; a file keeps its kind through its moves).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct SlotId(pub u32);

impl SlotId {
    pub(crate) fn of(slot: Slot) -> SlotId {
        match slot {
            Slot::Target(target) => SlotId(target.0),
            Slot::Group(group) => SlotId(group.0),
        }
    }

    /// The slot this is in a layout of `kind`.
    pub(crate) fn slot(self, kind: PatternKind) -> Slot {
        match kind {
            PatternKind::Raid0 => Slot::Target(TargetId(self.0)),
            PatternKind::Mirrored => Slot::Group(GroupId(self.0)),
        }
    }
}

/// A file's move: which slots go where, and how far it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MoveWork {
    /// The move's number, which its pushes carry: the old targets start their copy over
    /// for a move of another number.
    pub id: u64,
    /// `(slot index, slot it leaves, slot it goes to)`: targets, or storage mirror groups for
    /// a mirrored file; for a restripe, every slot of the layout, each with its own id twice.
    pub slots: Vec<(u16, SlotId, SlotId)>,
    /// The file's pool once moved.
    pub pool: StoragePoolId,
    /// Whether the last pushes started: the move only goes forward from here.
    pub sealing: bool,
    /// For a restripe into another pattern: the layout the file gets, on targets that hold
    /// none of its objects or tombstones.
    #[serde(default, with = "weft_proto::wire::since_5")]
    pub layout: Option<FileLayout>,
}

impl MoveWork {
    /// The slots the move copies the objects of a file of `kind` onto.
    pub(crate) fn copies(&self, kind: PatternKind) -> Vec<Slot> {
        match &self.layout {
            Some(layout) => layout.slots().collect(),
            None => self.slots.iter().map(|&(_, _, to)| to.slot(kind)).collect(),
        }
    }

    /// The layout a file laid out as `layout` has once moved: a restripe's new one, or the
    /// same with the moved slots on their new targets (or groups) and in the move's pool.
    pub(crate) fn moved_layout(&self, layout: &FileLayout) -> Result<FileLayout, String> {
        if let Some(restriped) = &self.layout {
            return Ok(restriped.clone());
        }
        let kind = layout.pattern.kind;
        let mut slots: Vec<Slot> = layout.slots().collect();
        for &(index, from, to) in &self.slots {
            match slots.get_mut(usize::from(index)) {
                Some(slot) if *slot == from.slot(kind) => *slot = to.slot(kind),
                _ => {
                    return Err(format!(
                        "slot {index} is not on {} any more",
                        from.slot(kind)
                    ))
                }
            }
        }
        let pattern = weft_proto::layout::StripePattern {
            pool: self.pool,
            ..layout.pattern
        };
        Ok(FileLayout::new(pattern, slots))
    }

    /// Whether the file's objects go to their new places through the new layout (see
    /// `StorageRequest::Push::into`): a restripe's, and every move of a mirrored file.
    pub(crate) fn through_layout(&self, kind: PatternKind) -> bool {
        self.layout.is_some() || kind == PatternKind::Mirrored
    }
}

/// The move of `inode` in flight, if any.
pub(crate) fn load_move(
    table: &Records<impl ReadableTable<u64, &'static [u8]>, MoveWork>,
    inode: InodeId,
) -> Result<Option<MoveWork>, OpError> {
    table.get(inode.0)
}

/// The slots that hold tombstones of `inode`.
pub(crate) fn load_tombstones(
    table: &Records<impl ReadableTable<u64, &'static [u8]>, Vec<SlotId>>,
    inode: InodeId,
) -> Result<Vec<SlotId>, OpError> {
    Ok(table.get(inode.0)?.unwrap_or_default())
}

/// Forgets the move and the tombstones of a file of `kind` being disposed of, and answers
/// the slots whose objects go with it besides its layout's: its tombstones, and the copies
/// of a move in flight.
pub(crate) fn take_moved_objects(
    txn: &WriteTransaction,
    inode: InodeId,
    kind: PatternKind,
) -> Result<Vec<Slot>, OpError> {
    let mut slots: Vec<Slot> = Vec::new();
    let tombstones = TOMBSTONES.open(txn)?.take(inode.0)?.unwrap_or_default();
    slots.extend(tombstones.into_iter().map(|id| id.slot(kind)));
    if let Some(work) = MOVES.open(txn)?.take(inode.0)? {
        slots.extend(work.copies(kind));
    }
    Ok(slots)
}
