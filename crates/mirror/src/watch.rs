//! The watches of objects moving off their target (a drain, `weft entry migrate`, a
//! restripe): what changed of each since the last round of its move's copy took it.
//!
//! A move copies an object in rounds. The first round copies it all and starts its watch;
//! every change made from then on notes the bytes it touched ([`Watches::note`]), or that it
//! cut the object ([`Watches::note_cut`]: the next round copies it all again), and each later
//! round copies only what was noted ([`Watches::take`]). What a round takes stays owed until
//! the round is acknowledged ([`Watches::ack`]), so a round that fails is made again in full
//! by the next. A round whose copy's server restarted since it took earlier ones (another
//! verifier) has the whole object copied again onto a fresh copy ([`Watches::restart`]). The
//! last round ends the watch: the object is sealed (by its owner) before it takes the notes,
//! so no change slips between.
//!
//! Storage servers keep the watches of their targets' objects in memory, beside the seals
//! they keep on disk (`weft_storage::moves`), and call these under the object's seal lock,
//! so a change and the last round exclude each other. A watch lives in memory only: a
//! restart loses it, and the next round copies the whole object again.

use std::collections::HashMap;
use std::hash::Hash;

/// Ranges a watch keeps apart before it merges them into one span.
const RANGES_MAX: usize = 1024;

/// What changed of a watched object since the last round looked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Changed {
    /// Everything: a new watch, or a truncate (the copy is made again from nothing).
    Whole,
    /// These byte ranges, `(offset, len)`, unordered and maybe overlapping.
    Ranges(Vec<(u64, u64)>),
}

impl Changed {
    /// Both changes.
    fn join(self, other: Changed) -> Changed {
        match (self, other) {
            (Changed::Ranges(mut ranges), Changed::Ranges(more)) => {
                ranges.extend(more);
                Changed::Ranges(ranges)
            }
            _ => Changed::Whole,
        }
    }

    /// The ranges a round copies of an object of `length` bytes: disjoint, in order.
    pub fn to_copy(self, length: u64) -> Vec<(u64, u64)> {
        match self {
            Changed::Whole => vec![(0, length)],
            Changed::Ranges(ranges) => merged(ranges),
        }
    }
}

/// What a round copies ([`Watches::take`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Watched {
    /// What changed since the last round that completed, and what failed rounds owe.
    pub changed: Changed,
    /// The copy's server's verifier at the last round that completed.
    pub verifier: Option<u64>,
}

/// The watch of one object moving.
#[derive(Debug)]
struct Watch {
    /// The move it is for: a round of another (a move given up and planned again) starts
    /// over.
    id: u64,
    /// Noted since the last round took them.
    changed: Changed,
    /// Taken by rounds that did not complete yet.
    owed: Changed,
    /// What the copy's server answered its first writes with: another answer means it
    /// restarted and may have lost what it was sent before.
    verifier: Option<u64>,
}

/// The watches of the objects (keyed by `K`) being moved.
#[derive(Debug)]
pub struct Watches<K> {
    watches: HashMap<K, Watch>,
}

impl<K> Default for Watches<K> {
    fn default() -> Watches<K> {
        Watches {
            watches: HashMap::new(),
        }
    }
}

impl<K: Copy + Eq + Hash> Watches<K> {
    /// How many objects are watched.
    pub fn len(&self) -> usize {
        self.watches.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.watches.is_empty()
    }

    /// Notes that `[offset, offset + len)` of `object` changed, if it is watched.
    pub fn note(&mut self, object: K, offset: u64, len: u64) {
        let Some(Watch {
            changed: Changed::Ranges(ranges),
            ..
        }) = self.watches.get_mut(&object)
        else {
            return;
        };
        ranges.push((offset, len));
        if ranges.len() > RANGES_MAX {
            let start = ranges.iter().map(|r| r.0).min().unwrap_or(0);
            let end = ranges.iter().map(|r| r.0 + r.1).max().unwrap_or(0);
            *ranges = vec![(start, end - start)];
        }
    }

    /// Notes that `object` was cut, if it is watched: the next round copies it all again.
    pub fn note_cut(&mut self, object: K) {
        if let Some(watch) = self.watches.get_mut(&object) {
            watch.changed = Changed::Whole;
        }
    }

    /// What a round of move `id` copies of `object`: what changed since the last round of
    /// that move that completed ([`Watches::ack`]) and the verifier its copy's server
    /// answered then. A watch of another move, or none (lost with a restart), starts over:
    /// [`Changed::Whole`]. What it answers stays owed until acknowledged. The `last` round
    /// (its object sealed by the caller first) ends the watch: one that fails is made again
    /// from the sealed, unchanging object, in full.
    pub fn take(&mut self, object: K, id: u64, last: bool) -> Watched {
        let fresh = || Watch {
            id,
            changed: Changed::Ranges(Vec::new()),
            owed: Changed::Whole,
            verifier: None,
        };
        let watch = self.watches.entry(object).or_insert_with(fresh);
        if watch.id != id {
            *watch = fresh();
        }
        let changed = std::mem::replace(&mut watch.changed, Changed::Ranges(Vec::new()));
        watch.owed = watch.owed.clone().join(changed);
        let taken = Watched {
            changed: watch.owed.clone(),
            verifier: watch.verifier,
        };
        if last {
            self.watches.remove(&object);
        }
        taken
    }

    /// Settles a round of move `id` that copied all it was owed, with the verifier the
    /// copy's server answered (its copy is lost if it answers another later).
    pub fn ack(&mut self, object: K, id: u64, verifier: Option<u64>) {
        if let Some(watch) = self.watches.get_mut(&object).filter(|w| w.id == id) {
            watch.owed = Changed::Ranges(Vec::new());
            if verifier.is_some() {
                watch.verifier = verifier;
            }
        }
    }

    /// Makes the next round of move `id` copy the whole object again onto a fresh copy.
    pub fn restart(&mut self, object: K, id: u64) {
        if let Some(watch) = self.watches.get_mut(&object).filter(|w| w.id == id) {
            watch.owed = Changed::Whole;
            watch.verifier = None;
        }
    }

    /// Forgets the watches of the objects `ended` says: the next round of each copies it
    /// all again.
    pub fn forget_where(&mut self, ended: impl Fn(&K) -> bool) {
        self.watches.retain(|object, _| !ended(object));
    }

    /// Forgets `object`'s watch (its file was removed); answers whether it had one.
    pub fn forget(&mut self, object: K) -> bool {
        self.watches.remove(&object).is_some()
    }
}

/// Merges ranges into disjoint ones in offset order.
pub fn merged(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (offset, len) in ranges {
        let end = offset.saturating_add(len);
        match out.last_mut() {
            Some((start, span)) if offset <= *start + *span => {
                *span = (*span).max(end - *start);
            }
            _ => out.push((offset, len)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: ranges noted in any order come out disjoint and in order, touching ones joined.
    #[test]
    fn ranges_merge_in_order() {
        assert_eq!(
            merged(vec![(10, 5), (0, 4), (4, 2), (12, 10), (40, 1)]),
            vec![(0, 6), (10, 12), (40, 1)]
        );
        assert_eq!(merged(Vec::new()), Vec::new());
        assert_eq!(Changed::Whole.to_copy(7), vec![(0, 7)]);
    }

    // Goal: a watch sees every change after it started, owes what a round took until the
    // round is acknowledged, keeps the copy's verifier, copies all again after a cut or for
    // another move, and ends with the last round.
    #[test]
    fn a_watch_owes_what_no_round_settled() {
        let mut watches: Watches<u64> = Watches::default();
        let take = |watches: &mut Watches<u64>, id, last| watches.take(42, id, last).changed;
        watches.note(42, 0, 10);
        assert_eq!(take(&mut watches, 1, false), Changed::Whole);
        // Not acknowledged: owed again, with what came since.
        watches.note(42, 100, 10);
        assert_eq!(take(&mut watches, 1, false), Changed::Whole);
        watches.ack(42, 1, Some(7));
        watches.note(42, 100, 10);
        watches.note(42, 5, 1);
        assert_eq!(
            take(&mut watches, 1, false),
            Changed::Ranges(vec![(100, 10), (5, 1)])
        );
        watches.note(42, 50, 1);
        assert_eq!(
            take(&mut watches, 1, false),
            Changed::Ranges(vec![(100, 10), (5, 1), (50, 1)]),
            "a round that failed is owed again"
        );
        watches.ack(42, 1, None);
        assert_eq!(watches.take(42, 1, false).verifier, Some(7));
        watches.ack(42, 1, None);
        watches.note_cut(42);
        assert_eq!(take(&mut watches, 1, false), Changed::Whole);
        watches.ack(42, 1, None);
        watches.restart(42, 1);
        assert_eq!(
            watches.take(42, 1, false),
            Watched {
                changed: Changed::Whole,
                verifier: None
            },
            "a restarted copy is made again in full"
        );
        watches.ack(42, 1, None);
        assert_eq!(
            take(&mut watches, 2, false),
            Changed::Whole,
            "another move starts over"
        );
        watches.ack(42, 2, None);
        assert_eq!(take(&mut watches, 2, true), Changed::Ranges(Vec::new()));
        assert!(watches.is_empty(), "the last round ends the watch");
        watches.note(42, 0, 1);
        assert!(
            watches.is_empty(),
            "changes of an unwatched object are not noted"
        );
    }
}
