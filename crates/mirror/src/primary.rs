//! A client's change at its group's primary, from the moment it holds its range of the
//! object to its answer. Storage servers run it in `Storage::as_primary`
//! (`crates/storage/src/service.rs`, `crates/storage/src/mirror.rs`), the simulator's
//! server (`crates/sim`) in its changes and syncs.
//!
//! Before it starts, the shell admits the request ([`Membership::admit_primary`]) and takes
//! the change's range ([`crate::ranges::RangeTable`]), which may wait for overlapping changes.
//! Then [`PrimaryChange::begin`]:
//! - admits it again: the wait may have outlived this server's role or lease, and a change
//!   with no member to reach would otherwise be answered from a deposed primary alone;
//! - numbers it among this primary's forwards ([`Numbers`]), not by its client: a change run
//!   again here (its forwarding given up, its client sending it again) is a new forward that
//!   each member applies again, not a copy of the first run it answered already;
//! - starts its [`Delivery`] to every present secondary.
//!
//! The shell applies the change here and sends the copies the delivery asks for, each tagged
//! with [`PrimaryChange::tag`] as it is at that moment. [`PrimaryChange::end`] gives the
//! answer: the group's loss epoch (the verifier of the write: only a crash of every copy
//! loses what was not synced), or why it was given up; a change given up is named to the
//! members' fences as abandoned, so a copy of it still on its way is dropped.

use crate::delivery::{Delivery, GivenUp, Sending};
use crate::membership::{Membership, Refused};
use crate::numbers::{Marks, Numbers};
use crate::{GroupId, ServerId, Time, Version};

/// A change at its group's primary, holding its range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrimaryChange {
    /// Its number among this primary's forwards (a sync has none: its members run every
    /// copy).
    number: Option<u64>,
    /// The group's loss epoch when it was admitted.
    epoch: u64,
    /// Its copies to the members.
    pub delivery: Delivery,
}

impl PrimaryChange {
    /// Begins a change to `items` of `group`, routed with `version` to `primary`, once it
    /// holds its range: admitted again, numbered among `forwards` when `numbered`, and its
    /// delivery started.
    ///
    /// # Errors
    /// Why this server may no longer serve it; the client routes again.
    #[allow(clippy::too_many_arguments)]
    pub fn begin<G: Clone>(
        membership: &Membership<G>,
        forwards: &Numbers,
        now: Time,
        primary: ServerId,
        (group, version): (GroupId, Version),
        items: Vec<u64>,
        numbered: bool,
    ) -> Result<PrimaryChange, Refused> {
        let (known, _) = membership.admit_primary(now, primary, group, version)?;
        let epoch = known.loss_epoch;
        let number = numbered.then(|| forwards.draw().0);
        let delivery = Delivery::new(membership, now, primary, group, Sending::Change { items });
        Ok(PrimaryChange {
            number,
            epoch,
            delivery,
        })
    }

    /// Its number among the primary's forwards (`None`: a sync, not numbered).
    pub fn number(&self) -> Option<u64> {
        self.number
    }

    /// The number and marks a copy sent now carries: what this primary settled or gave up
    /// on is looked at again for every copy.
    pub fn tag(&self, forwards: &Numbers) -> Option<(u64, Marks)> {
        self.number.map(|number| (number, forwards.marks(number)))
    }

    /// Ends the change as its delivery ended: the verifier to answer with, or why it was
    /// given up (its number is then abandoned). Call once the delivery has an outcome, or to
    /// give the change up (it had none: abandoned as well).
    ///
    /// # Errors
    /// Why it was given up.
    pub fn end(self, forwards: &Numbers) -> Result<u64, GivenUp> {
        let outcome = self
            .delivery
            .outcome()
            .unwrap_or(Err(GivenUp::Refused(Refused::NoLease)));
        if let Some(number) = self.number {
            forwards.end(number, outcome.is_err());
        }
        outcome.map(|()| self.epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::adopt_pair;
    use crate::MemberState;

    fn primary_of(version: Version) -> Membership<()> {
        let mut membership = Membership::new();
        adopt_pair(
            &mut membership,
            ServerId(1),
            0,
            (version, MemberState::Good),
        );
        membership
    }

    // Goal: a change that waited for its range past its primary's lease is refused, not
    // applied by a primary that may have been replaced.
    #[test]
    fn a_change_that_outlived_its_lease_is_refused() {
        let membership = primary_of(Version(1));
        let forwards = Numbers::default();
        let group = (GroupId(1), Version(1));
        assert!(PrimaryChange::begin(
            &membership,
            &forwards,
            10,
            ServerId(1),
            group,
            vec![7],
            true
        )
        .is_ok());
        assert_eq!(
            PrimaryChange::begin(
                &membership,
                &forwards,
                10_000,
                ServerId(1),
                group,
                vec![7],
                true
            ),
            Err(Refused::NoLease)
        );
    }

    // Goal: a change given up while an older one is still on its way is named as abandoned
    // to the members' fences, so a copy of it still on its way is dropped (the older one
    // keeps the settled mark below it); one answered is settled.
    #[test]
    fn a_change_given_up_is_abandoned() {
        let mut membership = primary_of(Version(1));
        let forwards = Numbers::default();
        let group = (GroupId(1), Version(1));
        let begin = |items| {
            PrimaryChange::begin(&membership, &forwards, 0, ServerId(1), group, items, true)
                .expect("admitted")
        };
        let older = begin(vec![6]);
        let mut given_up = begin(vec![7]);
        let mut answered = begin(vec![8]);
        let pace = crate::delivery::Pace {
            resend: 100,
            retry: 100,
            member_timeout: 1_000_000,
        };
        answered.delivery.due(&mut membership, 0, pace);
        answered.delivery.acknowledged(&mut membership, ServerId(2));
        let (answered_number, _) = answered.tag(&forwards).expect("numbered");
        assert_eq!(answered.end(&forwards), Ok(0));
        // Past the lease: given up.
        given_up.delivery.revisit(&mut membership, 10_000);
        let (number, _) = given_up.tag(&forwards).expect("numbered");
        assert!(given_up.end(&forwards).is_err());
        let (_, marks) = older.tag(&forwards).expect("numbered");
        assert!(
            marks.settled_below < number,
            "the older change is still pending"
        );
        assert!(
            marks.abandoned.contains(&number),
            "the given-up change is named abandoned: {marks:?}"
        );
        assert!(
            !marks.abandoned.contains(&answered_number),
            "the answered one is not"
        );
    }
}
