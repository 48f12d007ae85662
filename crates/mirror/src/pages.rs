//! Mirroring a metadata home's store file. The changes the store makes to its file between
//! two syncs ([`Changes`]) ship, one sync at a time and in order, to every present member of
//! the home's group; the sync (and every commit it covers) finishes only when each member
//! applied and synced them or left the group. Every send (each try to each member) is newer
//! than the one before ([`SendOrder`]), and a member applies a send only if it is newer than
//! every send it applied in the group's version ([`CopyOrder`]): a late copy of a send its
//! primary gave up on would write old bytes over newer ones. What an absent member misses is
//! recorded as the extents of the file the syncs wrote ([`Changes::extents`]); a returning
//! member gets those extents, or the whole file ([`PageResync`]), each piece read and sent
//! while no sync ships, and then the file's length and a sync.
//!
//! Metadata servers run these over their redb files (`meta/src/replica.rs`); the simulator's
//! servers run them over store files in memory (the homes of the simulator's servers, `crates/sim`).

use crate::Version;
use std::collections::VecDeque;
use weft_wire_derive::Wire;

/// A change to a store file, as shipped to mirror members.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Wire)]
pub enum FileChange {
    /// Writes the next `len` bytes of the payload at `offset`.
    #[wire(tag = 0)]
    Write {
        /// Where in the file.
        offset: u64,
        /// How many payload bytes.
        len: u32,
    },
    /// Cuts or extends (with zeros) the file to `len` bytes.
    #[wire(tag = 1)]
    SetLen(u64),
}

/// Changes to a store file, in order, with the bytes they write.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// The changes.
    pub changes: Vec<FileChange>,
    /// The bytes the writes among them write, in order.
    pub payload: Vec<u8>,
}

impl Changes {
    /// Adds a write of `data` at `offset`.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        self.changes.push(FileChange::Write {
            offset,
            len: data.len() as u32,
        });
        self.payload.extend_from_slice(data);
    }

    /// Adds a change of the file's length.
    pub fn set_len(&mut self, len: u64) {
        self.changes.push(FileChange::SetLen(len));
    }

    /// Adds `later` after these.
    pub fn extend(&mut self, later: &Changes) {
        self.changes.extend_from_slice(&later.changes);
        self.payload.extend_from_slice(&later.payload);
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// The file's length these leave, when one of them sets it.
    pub fn last_len(&self) -> Option<u64> {
        self.changes.iter().rev().find_map(|change| match change {
            FileChange::SetLen(len) => Some(*len),
            FileChange::Write { .. } => None,
        })
    }

    /// Lays the changes over `buffer`, which holds the file's bytes from `offset` on: what
    /// reads see before the changes reach the file.
    pub fn overlay(&self, offset: u64, buffer: &mut [u8]) {
        let end = offset + buffer.len() as u64;
        let mut at = 0usize;
        for change in &self.changes {
            match *change {
                FileChange::Write { offset: start, len } => {
                    let data = &self.payload[at..at + len as usize];
                    at += len as usize;
                    let from = start.max(offset);
                    let to = (start + u64::from(len)).min(end);
                    if from < to {
                        buffer[(from - offset) as usize..(to - offset) as usize]
                            .copy_from_slice(&data[(from - start) as usize..(to - start) as usize]);
                    }
                }
                FileChange::SetLen(len) if len < end => {
                    buffer[(len.max(offset) - offset) as usize..].fill(0);
                }
                FileChange::SetLen(_) => {}
            }
        }
    }

    /// The extents of `extent` bytes the changes touch, in order, for a file `len` bytes long
    /// before them: what an absent member misses. Those a write writes, and those a cut takes
    /// (grown again, the file reads as zeros there; the member's copy holds the old bytes).
    pub fn extents(&self, extent: u64, mut len: u64) -> Vec<u64> {
        let mut touched = Vec::new();
        let mut touch = |from: u64, to: u64| {
            if from < to {
                touched.extend(from / extent..=(to - 1) / extent);
            }
        };
        for change in &self.changes {
            match *change {
                FileChange::Write {
                    offset,
                    len: written,
                } => {
                    let end = offset + u64::from(written);
                    touch(offset, end);
                    len = len.max(end);
                }
                FileChange::SetLen(cut) => {
                    touch(cut, len);
                    len = cut;
                }
            }
        }
        touched.sort_unstable();
        touched.dedup();
        touched
    }

    /// Applies the changes to a file in memory.
    pub fn apply_to(&self, file: &mut Vec<u8>) {
        let applied: Result<(), std::convert::Infallible> =
            apply(&self.changes, &self.payload, |edit| {
                match edit {
                    Edit::Write(offset, data) => {
                        let (start, end) = (offset as usize, offset as usize + data.len());
                        if file.len() < end {
                            file.resize(end, 0);
                        }
                        file[start..end].copy_from_slice(data);
                    }
                    Edit::SetLen(len) => file.resize(len as usize, 0),
                }
                Ok(())
            });
        let Ok(()) = applied;
    }
}

/// The payload bytes `changes` write: what a send's payload must hold.
pub fn payload_len(changes: &[FileChange]) -> u64 {
    changes
        .iter()
        .map(|change| match change {
            FileChange::Write { len, .. } => u64::from(*len),
            FileChange::SetLen(_) => 0,
        })
        .sum()
}

/// One change with its bytes, as [`apply`] hands it over.
#[derive(Clone, Copy, Debug)]
pub enum Edit<'a> {
    /// Write the bytes at the offset.
    Write(u64, &'a [u8]),
    /// Cut or extend the file to the length.
    SetLen(u64),
}

/// Applies `changes` (whose written bytes `payload` holds in order, [`payload_len`] of them)
/// one after the other with `edit`.
///
/// # Errors
/// The first error of `edit`.
pub fn apply<E>(
    changes: &[FileChange],
    payload: &[u8],
    mut edit: impl FnMut(Edit<'_>) -> Result<(), E>,
) -> Result<(), E> {
    let mut at = 0usize;
    for change in changes {
        match *change {
            FileChange::Write { offset, len } => {
                let end = at + len as usize;
                edit(Edit::Write(offset, &payload[at..end]))?;
                at = end;
            }
            FileChange::SetLen(len) => edit(Edit::SetLen(len))?,
        }
    }
    Ok(())
}

/// Where a send stands among a home's sends: its group version, its primary's link to the
/// home (a primary that opens the home again sends under a later one) and its number on that
/// link, new for every send and every try. Later sends compare greater.
pub type SendOrder = (Version, u64, u64);

/// A member's copy of one home: the newest send applied to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyOrder {
    applied: Option<SendOrder>,
}

impl CopyOrder {
    /// Admits send `order` to the copy: applied, it is the newest.
    ///
    /// # Errors
    /// The newer send applied already: `order` is a late copy of a send its primary gave up on
    /// and sent again, perhaps followed by newer changes.
    pub fn admit(&mut self, order: SendOrder) -> Result<(), SendOrder> {
        if let Some(applied) = self.applied.filter(|applied| *applied > order) {
            return Err(applied);
        }
        self.applied = Some(order);
        Ok(())
    }
}

/// One send of a resync of a home's copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageStep {
    /// Write the file's `len` bytes at `offset` to the copy.
    Copy {
        /// Where.
        offset: u64,
        /// How many.
        len: u64,
    },
    /// Give the copy the file's length `len` and sync it: the last step.
    Finish {
        /// The file's length.
        len: u64,
    },
}

/// The steps of bringing a returning member's copy of a home up to date: the extents it
/// missed, or the whole file in pieces, then the file's length and a sync. Each step is
/// computed from the file's length when it is taken, while no sync ships.
#[derive(Clone, Debug)]
pub struct PageResync {
    /// The recorded extents left, for a resync of what the member missed.
    extents: Option<VecDeque<u64>>,
    /// Bytes per extent, or per piece of a full copy.
    piece: u64,
    /// Where a full copy is.
    offset: u64,
    finished: bool,
}

impl PageResync {
    /// A copy of the recorded `extents` of `extent` bytes.
    pub fn missed(extents: impl IntoIterator<Item = u64>, extent: u64) -> PageResync {
        PageResync {
            extents: Some(extents.into_iter().collect()),
            piece: extent,
            offset: 0,
            finished: false,
        }
    }

    /// A copy of the whole file, `piece` bytes at a time.
    pub fn full(piece: u64) -> PageResync {
        PageResync {
            extents: None,
            piece,
            offset: 0,
            finished: false,
        }
    }

    /// Whether only what the member missed is copied.
    pub fn incremental(&self) -> bool {
        self.extents.is_some()
    }

    /// Pieces to copy of a file of `len` bytes, for progress.
    pub fn total(&self, len: u64) -> u64 {
        match &self.extents {
            Some(extents) => extents.len() as u64,
            None => len.div_ceil(self.piece),
        }
    }

    /// The next step for a file of `len` bytes now; `None` once the last one was taken.
    pub fn step(&mut self, len: u64) -> Option<PageStep> {
        if self.finished {
            return None;
        }
        loop {
            let offset = match &mut self.extents {
                Some(extents) => match extents.pop_front() {
                    Some(extent) => extent * self.piece,
                    None => break,
                },
                None => self.offset,
            };
            if offset >= len {
                // An extent past the end: the file was cut since it was written.
                if self.extents.is_none() {
                    break;
                }
                continue;
            }
            let piece = (len - offset).min(self.piece);
            self.offset = offset + piece;
            return Some(PageStep::Copy { offset, len: piece });
        }
        self.finished = true;
        Some(PageStep::Finish { len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: reading the file under the changes not yet in it gives what the file holds once
    // they are (a store reads its unsynced pages back this way).
    #[test]
    fn overlaid_changes_read_as_if_applied() {
        let base: Vec<u8> = vec![7; 40_000];
        let mut flushing = Changes::default();
        flushing.write(4096, &[1; 8192]);
        flushing.set_len(10_000);
        let mut next = Changes::default();
        next.set_len(50_000);
        next.write(9_000, &[2; 100]);
        next.write(45_000, &[3; 5000]);
        next.write(12_000, &[4; 10]);
        let mut file = base.clone();
        flushing.apply_to(&mut file);
        next.apply_to(&mut file);
        assert_eq!(file.len(), 50_000);
        // The file's bytes from `offset`, zeros past its end.
        let read = |file: &[u8], offset: usize, len: usize| {
            let mut bytes = vec![0; len];
            let (start, end) = (offset.min(file.len()), (offset + len).min(file.len()));
            bytes[..end - start].copy_from_slice(&file[start..end]);
            bytes
        };
        for (offset, len) in [
            (0usize, 60_000usize),
            (4000, 200),
            (9_050, 3000),
            (44_000, 2000),
        ] {
            let mut view = read(&base, offset, len);
            flushing.overlay(offset as u64, &mut view);
            next.overlay(offset as u64, &mut view);
            assert_eq!(view, read(&file, offset, len), "bytes from {offset}");
        }
    }

    // Goal: a late copy of a send its primary gave up on (and sent again, followed by newer
    // changes) is refused; a later link or version starts over.
    #[test]
    fn a_copy_applies_only_newer_sends() {
        let mut copy = CopyOrder::default();
        copy.admit((Version(3), 100, 5)).expect("a send");
        copy.admit((Version(3), 100, 6)).expect("the next send");
        assert_eq!(
            copy.admit((Version(3), 100, 4)),
            Err((Version(3), 100, 6)),
            "a late send"
        );
        copy.admit((Version(3), 200, 0))
            .expect("a send of a later link");
        assert!(
            copy.admit((Version(3), 100, 7)).is_err(),
            "a send of the earlier link"
        );
        copy.admit((Version(4), 50, 0))
            .expect("a send in a later version");
    }

    // Goal: a resync of recorded extents copies each one that still lies in the file, cut at
    // its end, and ends with the length; a full one copies the file in pieces that follow it
    // as it grows.
    #[test]
    fn resync_steps_cover_what_is_asked() {
        let mut missed = PageResync::missed([0, 3, 9], 100);
        assert!(missed.incremental());
        assert_eq!(missed.total(1000), 3);
        assert_eq!(
            missed.step(350),
            Some(PageStep::Copy {
                offset: 0,
                len: 100
            })
        );
        assert_eq!(
            missed.step(350),
            Some(PageStep::Copy {
                offset: 300,
                len: 50
            })
        );
        assert_eq!(missed.step(350), Some(PageStep::Finish { len: 350 }));
        assert_eq!(missed.step(350), None);

        let mut full = PageResync::full(100);
        assert_eq!(full.total(250), 3);
        assert_eq!(
            full.step(150),
            Some(PageStep::Copy {
                offset: 0,
                len: 100
            })
        );
        // The file grew meanwhile.
        assert_eq!(
            full.step(260),
            Some(PageStep::Copy {
                offset: 100,
                len: 100
            })
        );
        assert_eq!(
            full.step(260),
            Some(PageStep::Copy {
                offset: 200,
                len: 60
            })
        );
        assert_eq!(full.step(260), Some(PageStep::Finish { len: 260 }));
        assert_eq!(full.step(260), None);
    }

    // Goal: the extents of a sync's writes are those its bytes fall in, each once.
    #[test]
    fn extents_are_those_written() {
        let mut changes = Changes::default();
        changes.write(10, &[1; 100]);
        changes.set_len(5000);
        changes.write(4096, &[2; 1]);
        changes.write(50, &[3; 0]);
        assert_eq!(changes.extents(64, 0), vec![0, 1, 64]);
    }

    // Goal: a file cut and grown again reads as zeros where it was cut; a member that missed
    // the cut holds the old bytes there, so the cut extents are missed too.
    #[test]
    fn a_cut_misses_the_extents_it_took() {
        let mut changes = Changes::default();
        changes.set_len(100);
        changes.set_len(1000);
        changes.write(0, &[1; 10]);
        let mut file = vec![9u8; 640];
        let mut copy = file.clone();
        let before = file.len() as u64;
        changes.apply_to(&mut file);
        // A member that missed these changes gets the extents recorded for it.
        for extent in changes.extents(64, before) {
            let (start, end) = ((extent * 64) as usize, ((extent + 1) * 64) as usize);
            copy.resize(copy.len().max(end.min(file.len())), 0);
            copy[start..end.min(file.len())].copy_from_slice(&file[start..end.min(file.len())]);
        }
        copy.resize(file.len(), 0);
        assert_eq!(copy, file);
    }
}
