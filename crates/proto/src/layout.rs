//! Stripe patterns and the layout math: where every byte of a file lives.
//!
//! A file striped over `n` slots (targets, or storage mirror groups) with chunk size `c` is cut
//! into chunks; chunk `i` lives on slot `i % n` at offset `(i / n) * c` in that slot's object. This module is the
//! only place that computes it, in both directions: [`map_range`] maps file bytes to object
//! pieces, [`object_length_for_file_size`] and [`file_size_from_object_lengths`] relate object
//! lengths to the file size.

use crate::ids::{GroupId, StoragePoolId, TargetId};
use crate::wire::Wire;
use serde::{Deserialize, Serialize};

/// Smallest chunk size a pattern may have.
pub const CHUNK_SIZE_MIN: u32 = 64 * 1024;
/// Largest chunk size a pattern may have.
pub const CHUNK_SIZE_MAX: u32 = 512 * 1024 * 1024;
/// Most targets one file may stripe over.
pub const NUM_TARGETS_MAX: u16 = 256;
/// Chunk size of the root directory's pattern in a new file system.
pub const CHUNK_SIZE_DEFAULT: u32 = 512 * 1024;
/// Number of targets of the root directory's pattern in a new file system.
pub const NUM_TARGETS_DEFAULT: u16 = 4;

const _: () = assert!(CHUNK_SIZE_MIN.is_power_of_two());
const _: () = assert!(CHUNK_SIZE_MAX.is_power_of_two());
const _: () = assert!(CHUNK_SIZE_DEFAULT >= CHUNK_SIZE_MIN && CHUNK_SIZE_DEFAULT <= CHUNK_SIZE_MAX);

/// How a file's chunks map to storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Wire)]
pub enum PatternKind {
    /// Chunks striped over targets, one copy each.
    #[wire(tag = 0)]
    Raid0,
    /// Chunks striped over storage mirror groups: every chunk is on each member of its group.
    /// The layout's slots are then groups, not targets.
    #[wire(tag = 1)]
    Mirrored,
}

/// A directory's stripe pattern, inherited by new files and subdirectories.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripePattern {
    /// How chunks map to storage.
    pub kind: PatternKind,
    /// Bytes per chunk: a power of two in `CHUNK_SIZE_MIN..=CHUNK_SIZE_MAX`.
    pub chunk_size_bytes: u32,
    /// Desired number of targets for a new file.
    pub num_targets: u16,
    /// Storage pool new files take their targets from.
    pub pool: StoragePoolId,
}

/// Why a pattern is invalid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PatternError {
    /// The chunk size is not a power of two in range.
    #[error("chunk size {chunk_size_bytes} must be a power of two between 64 KiB and 512 MiB")]
    ChunkSize {
        /// The rejected chunk size.
        chunk_size_bytes: u64,
    },
    /// The number of targets is out of range.
    #[error("number of targets {num_targets} must be between 1 and {NUM_TARGETS_MAX}")]
    NumTargets {
        /// The rejected target count.
        num_targets: u64,
    },
}

impl StripePattern {
    /// The pattern of the root directory of a new file system.
    pub const DEFAULT: StripePattern = StripePattern {
        kind: PatternKind::Raid0,
        chunk_size_bytes: CHUNK_SIZE_DEFAULT,
        num_targets: NUM_TARGETS_DEFAULT,
        pool: StoragePoolId::DEFAULT,
    };

    /// Builds a RAID0 pattern, checking its bounds.
    ///
    /// # Errors
    /// [`PatternError`] when the chunk size or target count is out of range.
    pub fn raid0(
        chunk_size_bytes: u64,
        num_targets: u64,
        pool: StoragePoolId,
    ) -> Result<StripePattern, PatternError> {
        let pattern = StripePattern {
            kind: PatternKind::Raid0,
            chunk_size_bytes: u32::try_from(chunk_size_bytes)
                .map_err(|_| PatternError::ChunkSize { chunk_size_bytes })?,
            num_targets: u16::try_from(num_targets)
                .map_err(|_| PatternError::NumTargets { num_targets })?,
            pool,
        };
        pattern.validate()?;
        Ok(pattern)
    }

    /// The same pattern striping over storage mirror groups instead of single targets.
    pub fn mirrored(self) -> StripePattern {
        StripePattern {
            kind: PatternKind::Mirrored,
            ..self
        }
    }

    /// Checks the pattern's bounds; patterns read from the wire are checked before use.
    ///
    /// # Errors
    /// [`PatternError`] when the chunk size or target count is out of range.
    pub fn validate(&self) -> Result<(), PatternError> {
        let chunk = self.chunk_size_bytes;
        if !chunk.is_power_of_two() || !(CHUNK_SIZE_MIN..=CHUNK_SIZE_MAX).contains(&chunk) {
            return Err(PatternError::ChunkSize {
                chunk_size_bytes: u64::from(chunk),
            });
        }
        if self.num_targets == 0 || self.num_targets > NUM_TARGETS_MAX {
            return Err(PatternError::NumTargets {
                num_targets: u64::from(self.num_targets),
            });
        }
        Ok(())
    }
}

/// A file's layout: its pattern and the slots chosen at creation, in stripe order; chunk `i`
/// is on slot `i % width`. Every slot is of the pattern's kind: a target for a striped
/// pattern, a storage mirror group for a mirrored one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "LayoutRecord", into = "LayoutRecord")]
pub struct FileLayout {
    /// The pattern the file was created with.
    pub pattern: StripePattern,
    slots: Vec<Slot>,
}

/// A layout as it is stored and sent: the slots' ids, whose kind the pattern gives.
#[derive(Clone, Serialize, Deserialize)]
struct LayoutRecord {
    pattern: StripePattern,
    slots: Vec<u32>,
}

impl From<LayoutRecord> for FileLayout {
    fn from(record: LayoutRecord) -> FileLayout {
        let slot = |id: u32| match record.pattern.kind {
            PatternKind::Raid0 => Slot::Target(TargetId(id)),
            PatternKind::Mirrored => Slot::Group(GroupId(id)),
        };
        FileLayout {
            slots: record.slots.iter().copied().map(slot).collect(),
            pattern: record.pattern,
        }
    }
}

impl From<FileLayout> for LayoutRecord {
    fn from(layout: FileLayout) -> LayoutRecord {
        LayoutRecord {
            pattern: layout.pattern,
            slots: layout
                .slots
                .iter()
                .map(|slot| match slot {
                    Slot::Target(target) => target.0,
                    Slot::Group(group) => group.0,
                })
                .collect(),
        }
    }
}

/// Where one stripe slot of a file lives: a storage target, or a storage mirror group whose
/// primary serves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Slot {
    /// One target holds the slot's object.
    Target(TargetId),
    /// Every member of this storage mirror group holds it.
    Group(GroupId),
}

impl From<TargetId> for Slot {
    fn from(target: TargetId) -> Slot {
        Slot::Target(target)
    }
}

impl std::fmt::Display for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Slot::Target(target) => write!(f, "target {target}"),
            Slot::Group(group) => write!(f, "mirror group {group}"),
        }
    }
}

impl FileLayout {
    /// A layout of `pattern` over `slots`, in stripe order.
    ///
    /// # Panics
    /// If a slot is not of the pattern's kind (a group in a striped layout, a target in a
    /// mirrored one), or there is no slot: a layout that could not be stored as it is.
    pub fn new(pattern: StripePattern, slots: Vec<Slot>) -> FileLayout {
        assert!(!slots.is_empty(), "a layout with no slot");
        for slot in &slots {
            assert!(
                matches!(
                    (pattern.kind, slot),
                    (PatternKind::Raid0, Slot::Target(_)) | (PatternKind::Mirrored, Slot::Group(_))
                ),
                "{slot} in a layout of pattern {:?}",
                pattern.kind
            );
        }
        FileLayout { pattern, slots }
    }

    /// The slot at `index` in stripe order.
    pub fn slot(&self, index: usize) -> Slot {
        self.slots[index]
    }

    /// Every slot, in stripe order.
    pub fn slots(&self) -> impl Iterator<Item = Slot> + '_ {
        self.slots.iter().copied()
    }

    /// How many slots the file is striped over.
    pub fn width(&self) -> usize {
        self.slots.len()
    }

    /// The index in the target list of the slot that has the object found on `target`, if
    /// this file has it: a plain object (`group` is `None`) when the target is one of its
    /// slots, a mirrored object of `group` when that group is one.
    pub fn index_of_object(&self, target: TargetId, group: Option<GroupId>) -> Option<usize> {
        self.slots().position(|slot| match slot {
            Slot::Target(mine) => mine == target,
            Slot::Group(mine) => group == Some(mine),
        })
    }
}

/// One contiguous piece of a file range that lies inside one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkPiece {
    /// The slot (its index in the layout) whose object holds the piece.
    pub slot_index: usize,
    /// The chunk's index in the file.
    pub chunk_index: u64,
    /// Offset of the piece in the file.
    pub file_offset: u64,
    /// Offset of the piece in the slot's object.
    pub object_offset: u64,
    /// Length of the piece in bytes; never zero, never crossing a chunk boundary.
    pub len: u64,
}

/// Maps the file range `[offset, offset + len)` to pieces, in file order, each within one chunk.
///
/// # Panics
/// If the layout has a zero chunk size, which validated layouts never have.
pub fn map_range(layout: &FileLayout, offset: u64, len: u64) -> Vec<ChunkPiece> {
    let chunk = u64::from(layout.pattern.chunk_size_bytes);
    let width = layout.width() as u64;
    assert!(chunk > 0, "layout with zero chunk size");
    let end = offset.checked_add(len).expect("file range overflows u64");
    let mut pieces = Vec::with_capacity((len / chunk + 2) as usize);
    let mut position = offset;
    while position < end {
        let chunk_index = position / chunk;
        let within = position % chunk;
        let piece_len = (chunk - within).min(end - position);
        let row = chunk_index / width;
        pieces.push(ChunkPiece {
            slot_index: (chunk_index % width) as usize,
            chunk_index,
            file_offset: position,
            object_offset: row * chunk + within,
            len: piece_len,
        });
        position += piece_len;
    }
    debug_assert_eq!(pieces.iter().map(|p| p.len).sum::<u64>(), len);
    pieces
}

/// Where byte `object_offset` of the object of slot `slot_index` lies in the file: the
/// inverse of [`map_range`]'s object offsets.
///
/// # Panics
/// If the layout has a zero chunk size, which validated layouts never have.
pub fn file_offset_of(layout: &FileLayout, slot_index: usize, object_offset: u64) -> u64 {
    let chunk = u64::from(layout.pattern.chunk_size_bytes);
    assert!(chunk > 0, "layout with zero chunk size");
    let row = object_offset / chunk;
    (row * layout.width() as u64 + slot_index as u64) * chunk + object_offset % chunk
}

/// Maps the file range `[offset, offset + len)` to pieces as [`map_range`] does, each further
/// cut so that none is longer than `most` bytes: one request each.
///
/// # Panics
/// If `most` is zero, or as [`map_range`].
pub fn map_requests(layout: &FileLayout, offset: u64, len: u64, most: u64) -> Vec<ChunkPiece> {
    assert!(most > 0, "requests of zero bytes");
    let mut out = Vec::new();
    for piece in map_range(layout, offset, len) {
        let mut done = 0;
        while done < piece.len {
            let part = (piece.len - done).min(most);
            out.push(ChunkPiece {
                file_offset: piece.file_offset + done,
                object_offset: piece.object_offset + done,
                len: part,
                ..piece
            });
            done += part;
        }
    }
    out
}

/// A set of a layout's slots by index: the slots a file's data was
/// written to, so that `weft fsck` can tell a lost object from a hole.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotSet([u64; 4]);

const _: () = assert!(NUM_TARGETS_MAX as usize <= 4 * 64);

impl SlotSet {
    /// The slots of `layout` that hold bytes of the file range `[offset, offset + len)`.
    pub fn of_range(layout: &FileLayout, offset: u64, len: u64) -> SlotSet {
        let mut set = SlotSet::default();
        if len == 0 {
            return set;
        }
        let chunk = u64::from(layout.pattern.chunk_size_bytes);
        let width = layout.width() as u64;
        let first = offset / chunk;
        let last = (offset + (len - 1)) / chunk;
        for chunk_index in first..=last.min(first + width - 1) {
            set.insert((chunk_index % width) as usize);
        }
        set
    }

    pub fn insert(&mut self, index: usize) {
        self.0[index / 64] |= 1 << (index % 64);
    }

    pub fn contains(&self, index: usize) -> bool {
        index < 4 * 64 && self.0[index / 64] & (1 << (index % 64)) != 0
    }

    /// Adds every slot of `other`.
    pub fn extend(&mut self, other: SlotSet) {
        for (word, more) in self.0.iter_mut().zip(other.0) {
            *word |= more;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|word| *word == 0)
    }

    /// The slots, in index order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..4 * 64).filter(|index| self.contains(*index))
    }

    /// Keeps only the slots for which `keep` holds.
    pub fn retain(&mut self, mut keep: impl FnMut(usize) -> bool) {
        for index in self.iter().collect::<Vec<_>>() {
            if !keep(index) {
                self.0[index / 64] &= !(1 << (index % 64));
            }
        }
    }
}

/// The length the object on `slot_index` has when the file is exactly `file_size` bytes long
/// and fully written. Truncate cuts each object to this length.
pub fn object_length_for_file_size(layout: &FileLayout, slot_index: usize, file_size: u64) -> u64 {
    let chunk = u64::from(layout.pattern.chunk_size_bytes);
    let width = layout.width() as u64;
    let slot = slot_index as u64;
    assert!(
        slot < width,
        "slot index {slot_index} outside a layout of {width}"
    );
    let full_chunks = file_size / chunk;
    let remainder = file_size % chunk;
    let full_on_slot = if full_chunks > slot {
        (full_chunks - slot).div_ceil(width)
    } else {
        0
    };
    let partial = if full_chunks % width == slot {
        remainder
    } else {
        0
    };
    let length = full_on_slot * chunk + partial;
    debug_assert!(length <= file_size, "slot {slot} holds more than the file");
    length
}

/// The object range on `slot_index` that holds the file range `[offset, offset + len)`.
/// A file range's bytes on one slot are contiguous in its object, so one range per slot
/// covers it; the range is empty when the file range has no byte there.
pub fn object_span(
    layout: &FileLayout,
    slot_index: usize,
    offset: u64,
    len: u64,
) -> std::ops::Range<u64> {
    let end = offset.checked_add(len).expect("file range overflows u64");
    object_length_for_file_size(layout, slot_index, offset)
        ..object_length_for_file_size(layout, slot_index, end)
}

/// The file size implied by the objects' lengths, `lengths[i]` being the object on
/// slot `i`: one past the last byte any object holds. Used to recompute a size from storage.
pub fn file_size_from_object_lengths(layout: &FileLayout, lengths: &[u64]) -> u64 {
    let chunk = u64::from(layout.pattern.chunk_size_bytes);
    let width = layout.width() as u64;
    assert_eq!(lengths.len() as u64, width, "one length per slot");
    lengths
        .iter()
        .enumerate()
        .filter(|(_, length)| **length > 0)
        .map(|(index, length)| {
            let last = length - 1;
            let chunk_index = (last / chunk) * width + index as u64;
            chunk_index * chunk + last % chunk + 1
        })
        .max()
        .unwrap_or(0)
}

/// Most shards a spread directory may have.
pub const DIR_SHARDS_MAX: u16 = 64;

/// Which of a spread directory's `shards` holds `name`: CRC32C of the name, modulo the shard
/// count. Stable forever, since entries stay where it put them.
pub fn dir_shard_of_name(name: &str, shards: usize) -> usize {
    if shards <= 1 {
        return 0;
    }
    crate::checksum::crc32c(name.as_bytes()) as usize % shards
}

/// Listing positions of a spread directory: the shard's index in the high bits above each
/// shard's own cookie, so a listing resumes in the right shard after the right entry.
pub const DIR_SHARD_COOKIE_BITS: u32 = 48;

/// The listing position of `cookie` in shard `index`.
pub fn dir_shard_cookie(index: usize, cookie: u64) -> u64 {
    debug_assert!(cookie < 1 << DIR_SHARD_COOKIE_BITS);
    ((index as u64) << DIR_SHARD_COOKIE_BITS) | cookie
}

/// The (shard index, shard cookie) of a spread directory's listing position.
pub fn split_dir_shard_cookie(position: u64) -> (usize, u64) {
    (
        (position >> DIR_SHARD_COOKIE_BITS) as usize,
        position & ((1 << DIR_SHARD_COOKIE_BITS) - 1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Goal: names spread over every shard of a spread directory, and a listing position
    // names its shard and cookie again.
    #[test]
    fn dir_shards_cover_names_and_positions_round_trip() {
        let mut seen = [0usize; 4];
        for i in 0..400 {
            seen[dir_shard_of_name(&format!("file-{i}"), 4)] += 1;
        }
        assert!(seen.iter().all(|count| *count > 50), "{seen:?}");
        assert_eq!(dir_shard_of_name("anything", 1), 0);
        let position = dir_shard_cookie(3, 12345);
        assert_eq!(split_dir_shard_cookie(position), (3, 12345));
        assert!(dir_shard_cookie(usize::from(DIR_SHARDS_MAX) - 1, (1 << 48) - 1) < i64::MAX as u64);
    }

    fn layout(chunk_shift: u32, targets: u32) -> FileLayout {
        FileLayout::new(
            StripePattern {
                kind: PatternKind::Raid0,
                chunk_size_bytes: 1 << chunk_shift,
                num_targets: targets as u16,
                pool: StoragePoolId::DEFAULT,
            },
            (0..targets)
                .map(|t| Slot::Target(TargetId(100 + t)))
                .collect(),
        )
    }

    // Goal: the example from the design, worked by hand: 64 KiB chunks over 4 targets.
    #[test]
    fn worked_example() {
        let l = layout(16, 4);
        let pieces = map_range(&l, 5 * 65536 + 10, 65536);
        assert_eq!(pieces.len(), 2);
        assert_eq!(pieces[0].slot_index, 1);
        assert_eq!(pieces[0].object_offset, 65536 + 10);
        assert_eq!(pieces[0].len, 65536 - 10);
        assert_eq!(pieces[1].slot_index, 2);
        assert_eq!(pieces[1].object_offset, 65536);
        assert_eq!(pieces[1].len, 10);
    }

    // Goal: the slots a write touches are exactly those `map_range` puts its pieces on, for
    // short writes, writes across chunks, writes longer than a stripe, and the last of 256
    // targets, so fsck expects an object on every slot written and on no other.
    #[test]
    fn written_slots_are_the_slots_of_the_pieces() {
        for (l, offset, len) in [
            (layout(16, 4), 5 * 65536 + 10, 65536),
            (layout(16, 4), 0, 1),
            (layout(16, 4), 3 * 65536, 10 * 65536),
            (layout(16, 256), 255 * 65536, 65536),
            (layout(16, 256), 200 * 65536, 100 * 65536),
        ] {
            let mut expected = SlotSet::default();
            for piece in map_range(&l, offset, len) {
                expected.insert(piece.slot_index);
            }
            assert_eq!(
                SlotSet::of_range(&l, offset, len),
                expected,
                "{offset}+{len}"
            );
        }
        assert!(SlotSet::of_range(&layout(16, 4), 7, 0).is_empty());
        let mut set = SlotSet::of_range(&layout(16, 256), 0, 256 * 65536);
        assert_eq!(set.iter().count(), 256);
        set.retain(|index| index % 2 == 0);
        assert_eq!(set.iter().count(), 128);
        assert!(set.contains(254) && !set.contains(255));
    }

    // Goal: pattern bounds are enforced with a message a user understands.
    #[test]
    fn pattern_bounds() {
        assert!(StripePattern::raid0(1 << 20, 4, StoragePoolId::DEFAULT).is_ok());
        assert!(StripePattern::raid0(1000, 4, StoragePoolId::DEFAULT).is_err());
        assert!(StripePattern::raid0(32 * 1024, 4, StoragePoolId::DEFAULT).is_err());
        assert!(StripePattern::raid0(1 << 30, 4, StoragePoolId::DEFAULT).is_err());
        assert!(StripePattern::raid0(1 << 20, 0, StoragePoolId::DEFAULT).is_err());
        assert!(StripePattern::raid0(1 << 20, 257, StoragePoolId::DEFAULT).is_err());
    }

    proptest! {
        // Goal: map_range covers the range exactly, in order, never crossing a chunk, and every
        // piece lands on the target and object offset the RAID0 rule gives for each of its bytes.
        #[test]
        fn map_range_is_exact(shift in 16u32..20, targets in 1u32..9, offset in 0u64..(1 << 26), len in 0u64..(1 << 22)) {
            let l = layout(shift, targets);
            let chunk = 1u64 << shift;
            let pieces = map_range(&l, offset, len);
            let mut expected = offset;
            for piece in &pieces {
                prop_assert_eq!(piece.file_offset, expected);
                prop_assert!(piece.len > 0);
                prop_assert_eq!(piece.file_offset / chunk, (piece.file_offset + piece.len - 1) / chunk);
                let i = piece.file_offset / chunk;
                prop_assert_eq!(piece.slot_index as u64, i % targets as u64);
                prop_assert_eq!(piece.object_offset, (i / targets as u64) * chunk + piece.file_offset % chunk);
                expected += piece.len;
            }
            prop_assert_eq!(expected, offset + len);
        }

        // Goal: map_requests covers the same bytes as map_range, in order, on the same slots
        // and object offsets, with no request longer than its limit.
        #[test]
        fn map_requests_cuts_pieces_to_the_limit(shift in 16u32..20, targets in 1u32..9, offset in 0u64..(1 << 26), len in 0u64..(1 << 22), most in 1u64..(1 << 20)) {
            let l = layout(shift, targets);
            let mut expected = offset;
            for request in map_requests(&l, offset, len, most) {
                prop_assert_eq!(request.file_offset, expected);
                prop_assert!(request.len > 0 && request.len <= most);
                let whole = map_range(&l, request.file_offset, request.len);
                prop_assert_eq!(whole.len(), 1);
                prop_assert_eq!(whole[0].slot_index, request.slot_index);
                prop_assert_eq!(whole[0].object_offset, request.object_offset);
                expected += request.len;
            }
            prop_assert_eq!(expected, offset + len);
        }

        // Goal: object_span covers exactly the pieces map_range puts on each target.
        #[test]
        fn object_span_matches_pieces(shift in 16u32..19, targets in 1u32..7, offset in 0u64..(1 << 24), len in 0u64..(1 << 22)) {
            let l = layout(shift, targets);
            let pieces = map_range(&l, offset, len);
            for index in 0..targets as usize {
                let mine: Vec<_> = pieces.iter().filter(|p| p.slot_index == index).collect();
                let span = object_span(&l, index, offset, len);
                match (mine.first(), mine.last()) {
                    (Some(first), Some(last)) => {
                        prop_assert_eq!(span.start, first.object_offset);
                        prop_assert_eq!(span.end, last.object_offset + last.len);
                        prop_assert_eq!(span.end - span.start, mine.iter().map(|p| p.len).sum::<u64>());
                    }
                    _ => prop_assert!(span.is_empty()),
                }
            }
        }

        // Goal: writing a file of size S leaves each object at object_length_for_file_size, and
        // the reverse mapping gives back S.
        #[test]
        fn sizes_round_trip(shift in 16u32..20, targets in 1u32..9, size in 0u64..(1 << 26)) {
            let l = layout(shift, targets);
            let mut lengths = vec![0u64; targets as usize];
            for piece in map_range(&l, 0, size) {
                let end = piece.object_offset + piece.len;
                lengths[piece.slot_index] = lengths[piece.slot_index].max(end);
            }
            for (index, length) in lengths.iter().enumerate() {
                prop_assert_eq!(*length, object_length_for_file_size(&l, index, size));
            }
            prop_assert_eq!(file_size_from_object_lengths(&l, &lengths), size);
        }
    }
}
