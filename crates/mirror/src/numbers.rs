//! The numbers of a sender's changes, and what the sender has settled of them: a client's
//! requests, and a primary's forwards to its members.
//!
//! Every change gets a number, the same in each of its retries. Each copy also carries the
//! number below which all of the sender's changes are settled (none is still pending) and the
//! changes it gave up on: a metadata server forgets stored replies below the mark, and a
//! storage server's fence ([`crate::fence`]) drops a late copy of a settled or abandoned
//! change. That mark must never pass a number a change still uses, so a number is drawn and
//! entered as pending in one step: drawn first and entered after, another change could be
//! sent in between with a mark above it, and the receiver would take the first change, when
//! it comes, for a late copy of a settled one.

use std::collections::BTreeSet;
use std::sync::Mutex;

/// The numbers of a sender's changes ([`Numbers::begin`], or [`Numbers::draw`] and
/// [`Numbers::end`] by hand).
#[derive(Debug)]
pub struct Numbers {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    next: u64,
    /// Requests begun and not ended.
    pending: BTreeSet<u64>,
    /// Data changes that failed while older requests are still pending: a copy of one still
    /// on its way is dropped by its server ([`ChangeTag::abandoned`]).
    abandoned: BTreeSet<u64>,
}

/// A change's number, pending until dropped.
#[derive(Debug)]
pub struct Pending<'a> {
    numbers: &'a Numbers,
    /// The change's number.
    pub number: u64,
    /// The oldest number pending when this one began.
    pub oldest_pending: u64,
    failed: bool,
}

/// What a copy of a change sent now tells its receiver of the sender's other changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marks {
    /// Every change numbered below this is settled.
    pub settled_below: u64,
    /// Failed changes at or above the mark.
    pub abandoned: Vec<u64>,
}

impl Default for Numbers {
    fn default() -> Numbers {
        Numbers {
            state: Mutex::new(State {
                next: 1,
                pending: BTreeSet::new(),
                abandoned: BTreeSet::new(),
            }),
        }
    }
}

impl Numbers {
    /// Draws the next number, pending until the returned guard drops.
    pub fn begin(&self) -> Pending<'_> {
        let (number, oldest_pending) = self.draw();
        Pending {
            numbers: self,
            number,
            oldest_pending,
            failed: false,
        }
    }

    /// Draws the next number, pending until [`Numbers::end`]; returns it with the oldest
    /// number pending.
    pub fn draw(&self) -> (u64, u64) {
        let mut state = self.state.lock().expect("change numbers poisoned");
        let number = state.next;
        state.next += 1;
        state.pending.insert(number);
        (number, *state.pending.first().expect("just inserted"))
    }

    /// The marks a copy of pending change `number` sent now carries: looked at again for
    /// every retry.
    pub fn marks(&self, number: u64) -> Marks {
        let mut state = self.state.lock().expect("change numbers poisoned");
        let settled_below = state.pending.first().copied().unwrap_or(number);
        // The mark never passes a change still sent: its receiver would drop it as late.
        assert!(
            settled_below <= number,
            "change {number} is sent with everything below {settled_below} settled (pending: {:?})",
            state.pending
        );
        state.abandoned = state.abandoned.split_off(&settled_below);
        Marks {
            settled_below,
            abandoned: state.abandoned.iter().copied().collect(),
        }
    }

    /// Change `number` is settled; `failed`: it was given up, so a copy of it still on its
    /// way must not land later.
    pub fn end(&self, number: u64, failed: bool) {
        let mut state = self.state.lock().expect("change numbers poisoned");
        let was_pending = state.pending.remove(&number);
        debug_assert!(was_pending, "change {number} settled twice");
        if failed {
            state.abandoned.insert(number);
        }
    }
}

impl Pending<'_> {
    /// The marks a copy of this change sent now carries: looked at again for every retry.
    pub fn marks(&self) -> Marks {
        self.numbers.marks(self.number)
    }

    /// The change failed: a copy of it still on its way must not land later.
    pub fn failed(&mut self) {
        self.failed = true;
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.numbers.end(self.number, self.failed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests begun on many threads at once, each sent right after it begins, one at a time
    /// (the lock plays the server's socket): the server's mark, the highest `settled_below`
    /// it has seen, never passes a request that comes after it.
    #[test]
    fn no_request_arrives_below_the_mark_of_one_sent_before_it() {
        let numbers = Numbers::default();
        let server_mark = Mutex::new(0u64);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..200_000 {
                        let change = numbers.begin();
                        let marks = change.marks();
                        let mut mark = server_mark.lock().expect("mark");
                        assert!(
                            change.number >= *mark,
                            "change {} arrived below the mark {} of one sent before it",
                            change.number,
                            *mark
                        );
                        *mark = (*mark).max(marks.settled_below).max(change.oldest_pending);
                    }
                });
            }
        });
    }

    #[test]
    fn failed_changes_are_named_until_everything_before_them_settles() {
        let numbers = Numbers::default();
        let first = numbers.begin();
        let mut second = numbers.begin();
        second.failed();
        drop(second);
        let third = numbers.begin();
        assert_eq!(
            third.marks(),
            Marks {
                settled_below: 1,
                abandoned: vec![2]
            }
        );
        drop(first);
        assert_eq!(
            third.marks(),
            Marks {
                settled_below: 3,
                abandoned: vec![]
            }
        );
    }
}
