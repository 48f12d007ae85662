//! One round of a move's copy (a drain, `weft entry migrate`, a restripe): the order in which
//! the object's source sends what its watch says changed ([`crate::watch`]) to the copy, and
//! checks that the copy kept it.
//!
//! A round's steps come from [`Round::next_step`], and its caller does each. The copy's servers
//! answer its writes and syncs with a *verifier* that changes whenever they may have lost
//! writes they answered before syncing them (a restart of their host). Every answer of a copy
//! within a round, and since the earlier rounds whose verifier the watch carries, must be the
//! same: [`Round::answered`] says when one is not, and the caller then restarts the watch
//! (the next round copies the whole object again) and fails the round.
//!
//! The order is the guarantee:
//! - a round that copies a whole object onto a copy earlier rounds wrote starts it over
//!   ([`Step::Clear`]), where the copy's length is the object's;
//! - a round is settled ([`Step::Ack`]: its watch owes nothing more) only after the copy
//!   answered every piece with the verifier it had before, and, where verifiers are checked
//!   each round, after a sync of the copy answered it again: nothing it copied can be lost;
//! - the last round (its object sealed first by the caller, so nothing changes it any more)
//!   syncs the copy, then seals a mirrored object's members, and only then drops the data
//!   ([`Step::Retire`]): until then a member that takes over holds all of it.
//!
//! Storage servers run it in their pushes (`weft_storage`'s `service/push.rs`), and the
//! simulator runs it in its primaries' moves of chunks between groups.

use crate::watch::{Changed, Watched};
use std::collections::{BTreeMap, VecDeque};

/// How a round copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Most bytes in one piece.
    pub piece: u64,
    /// Pieces do not cross multiples of this (the old layout's chunk size: one piece is one
    /// contiguous range of the file).
    pub boundary: u64,
    /// Whether every round syncs its copies before and after it, checking their verifiers
    /// then. Without, the watch carries the one copy's verifier from round to round (every
    /// write answers it), and only the last round syncs.
    pub verify_each_round: bool,
    /// Whether a round that copies the whole object clears the copy first (the copy's length
    /// is the object's). A restripe's copies hold bytes of other objects of the file, whose
    /// size bounds them instead.
    pub clear_when_whole: bool,
    /// Whether the object is mirrored: its last round seals its group's members.
    pub mirrored: bool,
}

/// Bytes of the object to copy in one piece.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Where, in the object.
    pub offset: u64,
    /// How many bytes.
    pub len: u64,
    /// The copy is made from nothing this round: a hole may stay a hole.
    pub fresh: bool,
    /// It holds the object's last byte, which gives the copy its length: written even when
    /// zero.
    pub last: bool,
}

/// What to do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Sync every copy and report each one's verifier ([`Round::answered`]).
    Verify,
    /// Remove what earlier rounds wrote to the copy.
    Clear,
    /// Copy these bytes, reporting the verifier the copy's write answered.
    Copy(Piece),
    /// Seal the object on its group's members (its primary is the source).
    SealMembers,
    /// Drop the object's data here: the move is done.
    Retire,
    /// Settle the round in the watch ([`crate::watch::Watches::ack`]) with this verifier of
    /// the copy.
    Ack {
        /// The copy's verifier to carry to the next round.
        verifier: Option<u64>,
    },
}

/// A copy answered another verifier than before: it may have lost what it took. The caller
/// restarts the watch and fails the round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restarted<S>(pub S);

/// One round of a move's copy, its copies named by `S`.
#[derive(Debug)]
pub struct Round<S> {
    steps: VecDeque<Step>,
    /// Each copy's verifier, as first answered (or carried by the watch).
    known: BTreeMap<S, u64>,
    /// The one copy whose verifier the watch carries (without verifying each round).
    carried: Option<S>,
}

impl<S: Ord + Copy> Round<S> {
    /// The round that copies what `watched` says of an object of `length` bytes, sealed
    /// first if `seal` (its last round). Without [`Plan::verify_each_round`], `carried` is
    /// the one copy, whose verifier the watch carries.
    pub fn new(watched: Watched, length: u64, seal: bool, plan: Plan, carried: Option<S>) -> Self {
        debug_assert!(
            plan.verify_each_round || carried.is_some(),
            "a round that does not verify each time carries its copy's verifier"
        );
        debug_assert!(plan.piece > 0 && plan.boundary > 0, "pieces of no bytes");
        let fresh = watched.changed == Changed::Whole;
        let mut steps = VecDeque::new();
        if plan.verify_each_round {
            steps.push_back(Step::Verify);
        }
        if fresh && plan.clear_when_whole {
            steps.push_back(Step::Clear);
        }
        for (offset, len) in watched.changed.to_copy(length) {
            let end = offset.saturating_add(len).min(length);
            let mut at = offset;
            while at < end {
                let len = (end - at)
                    .min(plan.piece)
                    .min(plan.boundary - at % plan.boundary);
                steps.push_back(Step::Copy(Piece {
                    offset: at,
                    len,
                    fresh,
                    last: at + len == length,
                }));
                at += len;
            }
        }
        if plan.verify_each_round || seal {
            steps.push_back(Step::Verify);
        }
        if seal {
            if plan.mirrored {
                steps.push_back(Step::SealMembers);
            }
            steps.push_back(Step::Retire);
        } else {
            steps.push_back(Step::Ack { verifier: None });
        }
        let known = match (carried, watched.verifier) {
            (Some(copy), Some(verifier)) if !plan.verify_each_round => {
                BTreeMap::from([(copy, verifier)])
            }
            _ => BTreeMap::new(),
        };
        Round {
            steps,
            known,
            carried: carried.filter(|_| !plan.verify_each_round),
        }
    }

    /// The round of an object gone here already (an earlier last round dropped its data):
    /// its members are sealed again, which does nothing to those that have it, for one that
    /// missed it and took over since.
    pub fn gone(plan: Plan) -> Self {
        Round {
            steps: plan
                .mirrored
                .then_some(Step::SealMembers)
                .into_iter()
                .collect(),
            known: BTreeMap::new(),
            carried: None,
        }
    }

    /// The next step, or `None` once the round is done.
    pub fn next_step(&mut self) -> Option<Step> {
        let step = self.steps.pop_front()?;
        Some(match step {
            Step::Ack { .. } => Step::Ack {
                verifier: self.carried.and_then(|copy| self.known.get(&copy).copied()),
            },
            step => step,
        })
    }

    /// Copy `copy` answered `verifier` (a write or a sync of this round).
    ///
    /// # Errors
    /// It answered another before: it may have lost what it took.
    pub fn answered(&mut self, copy: S, verifier: u64) -> Result<(), Restarted<S>> {
        match self.known.get(&copy) {
            Some(&known) if known != verifier => {
                self.steps.clear();
                Err(Restarted(copy))
            }
            Some(_) => Ok(()),
            None => {
                self.known.insert(copy, verifier);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EACH_ROUND: Plan = Plan {
        piece: 4,
        boundary: 6,
        verify_each_round: true,
        clear_when_whole: false,
        mirrored: true,
    };

    const CARRIED: Plan = Plan {
        piece: 4,
        boundary: u64::MAX,
        verify_each_round: false,
        clear_when_whole: true,
        mirrored: false,
    };

    fn steps(mut round: Round<u8>) -> Vec<Step> {
        std::iter::from_fn(|| round.next_step()).collect()
    }

    fn copy(offset: u64, len: u64, fresh: bool, last: bool) -> Step {
        Step::Copy(Piece {
            offset,
            len,
            fresh,
            last,
        })
    }

    fn watched(changed: Changed, verifier: Option<u64>) -> Watched {
        Watched { changed, verifier }
    }

    // Goal: a round verifies its copies around the pieces, cuts pieces at the piece size and
    // the boundary, and ends by settling; the last round syncs, seals the members, then
    // retires, in that order.
    #[test]
    fn a_round_settles_only_after_its_copies_answered() {
        let round = Round::new(watched(Changed::Whole, None), 10, false, EACH_ROUND, None);
        assert_eq!(
            steps(round),
            vec![
                Step::Verify,
                copy(0, 4, true, false),
                copy(4, 2, true, false),
                copy(6, 4, true, true),
                Step::Verify,
                Step::Ack { verifier: None },
            ]
        );
        let ranges = Changed::Ranges(vec![(8, 1), (1, 2)]);
        let round = Round::new(watched(ranges, None), 10, true, EACH_ROUND, None);
        assert_eq!(
            steps(round),
            vec![
                Step::Verify,
                copy(1, 2, false, false),
                copy(8, 1, false, false),
                Step::Verify,
                Step::SealMembers,
                Step::Retire,
            ]
        );
        assert_eq!(steps(Round::gone(EACH_ROUND)), vec![Step::SealMembers]);
        assert_eq!(steps(Round::<u8>::gone(CARRIED)), Vec::new());
    }

    // Goal: a round that carries its copy's verifier clears a whole copy first, answers the
    // verifier it saw to its settling, syncs only in the last round, and stops at the first
    // answer of another verifier.
    #[test]
    fn a_copy_that_answers_another_verifier_restarts_the_round() {
        let mut round = Round::new(watched(Changed::Whole, None), 5, false, CARRIED, Some(1));
        assert_eq!(round.next_step(), Some(Step::Clear));
        assert_eq!(round.next_step(), Some(copy(0, 4, true, false)));
        assert_eq!(round.answered(1, 7), Ok(()));
        assert_eq!(round.next_step(), Some(copy(4, 1, true, true)));
        assert_eq!(round.answered(1, 7), Ok(()));
        assert_eq!(round.next_step(), Some(Step::Ack { verifier: Some(7) }));
        assert_eq!(round.next_step(), None);

        let ranges = Changed::Ranges(vec![(0, 2)]);
        let mut round = Round::new(watched(ranges.clone(), Some(7)), 5, true, CARRIED, Some(1));
        assert_eq!(round.next_step(), Some(copy(0, 2, false, false)));
        assert_eq!(round.answered(1, 8), Err(Restarted(1)), "restarted since");
        assert_eq!(round.next_step(), None, "nothing after a restart");

        let mut round = Round::new(watched(ranges, Some(7)), 5, true, CARRIED, Some(1));
        assert_eq!(round.next_step(), Some(copy(0, 2, false, false)));
        assert_eq!(round.answered(1, 7), Ok(()));
        assert_eq!(round.next_step(), Some(Step::Verify));
        assert_eq!(round.answered(1, 7), Ok(()));
        assert_eq!(round.next_step(), Some(Step::Retire));
        assert_eq!(round.next_step(), None);
    }
}
