//! The records of moves: a file's move in flight ([`MOVES`], [`MoveWork`]) and the slots
//! that hold its tombstones once moved ([`TOMBSTONES`], [`SlotId`]). The mover
//! (`service/moves.rs`) plans and runs moves over them; the namespace operations read them
//! where a file's objects go (a truncate, a removal) and fsck checks them.

use super::{OpError, StoreError};
use redb::{ReadableTable, TableDefinition, WriteTransaction};
use serde::{Deserialize, Serialize};
use weft_proto::ids::{GroupId, InodeId, StoragePoolId, TargetId};
use weft_proto::layout::{FileLayout, PatternKind, Slot};

/// Files whose objects are moving: inode → postcard [`MoveWork`], in protocol version 5 (a
/// store's `moves` of version 4 is converted when it opens).
pub(crate) const MOVES: TableDefinition<u64, &[u8]> = TableDefinition::new("moves_v5");

/// Slots that hold a tombstone of a file (its objects moved away from them): inode →
/// postcard list of [`SlotId`]s. Their objects are removed with the file's.
pub(crate) const TOMBSTONES: TableDefinition<u64, &[u8]> = TableDefinition::new("tombstones");

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

/// Decodes a stored record of `inode` (`what` names it in the error of a damaged one).
pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    what: &str,
    inode: u64,
    bytes: &[u8],
) -> Result<T, OpError> {
    postcard::from_bytes(bytes)
        .map_err(|error| StoreError::damaged(format!("{what} of inode {inode:#x}"), error).into())
}

/// The move of `inode` in flight, if any.
pub(crate) fn load_move(
    table: &impl ReadableTable<u64, &'static [u8]>,
    inode: InodeId,
) -> Result<Option<MoveWork>, OpError> {
    match table.get(inode.0)? {
        Some(bytes) => decode("the move", inode.0, bytes.value()).map(Some),
        None => Ok(None),
    }
}

/// Records `work` as the move of `inode`.
pub(crate) fn store_move(
    moves: &mut redb::Table<'_, u64, &'static [u8]>,
    inode: InodeId,
    work: &MoveWork,
) -> Result<(), OpError> {
    let bytes = postcard::to_stdvec(work).expect("moves always encode");
    moves.insert(inode.0, bytes.as_slice())?;
    Ok(())
}

/// The slots that hold tombstones of `inode`.
pub(crate) fn load_tombstones(
    table: &impl ReadableTable<u64, &'static [u8]>,
    inode: InodeId,
) -> Result<Vec<SlotId>, OpError> {
    match table.get(inode.0)? {
        Some(bytes) => decode("the tombstones", inode.0, bytes.value()),
        None => Ok(Vec::new()),
    }
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
    let mut tombstones = txn.open_table(TOMBSTONES)?;
    slots.extend(
        load_tombstones(&tombstones, inode)?
            .into_iter()
            .map(|id| id.slot(kind)),
    );
    tombstones.remove(inode.0)?;
    let mut moves = txn.open_table(MOVES)?;
    if let Some(work) = load_move(&moves, inode)? {
        slots.extend(work.copies(kind));
    }
    moves.remove(inode.0)?;
    Ok(slots)
}
