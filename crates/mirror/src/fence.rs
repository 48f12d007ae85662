//! Clients' changes apply at most once, and never late: the decisions of a server's change
//! fence, which storage servers run (around an async waiter) for the changes clients send
//! them and, per group version, for the changes a primary forwards; the simulator runs the
//! same fence in its members.
//!
//! A client retries a change whose answer did not come (a timeout, a broken connection) while
//! the original may still be on its way: in a socket, in a server's queue, or running. Once
//! the client has its answer it moves on, and a newer change of the same bytes may follow;
//! the original landing after it would undo it. Every change carries a [`Tag`]: its number
//! (the same in every retry), the number below which all of its client's changes are settled,
//! and the changes it gave up on. The fence
//!
//! - runs one copy of a change at a time, and keeps the answer of a copy that ran: a retry
//!   gets that answer instead of running again, so a late original finds its change answered
//!   and is dropped;
//! - drops a copy of a change its client settled or gave up on ([`Admission::Late`]);
//! - holds a change while a copy of one its client gave up on still runs here, so that copy
//!   lands before the change or not at all.
//!
//! The state lives in memory: a copy cannot outlive the process it was sent to. Answers are
//! kept until their client's mark passes them; a client idle for a while is forgotten
//! ([`Fence::forget_idle`]), which bounds the table when clients go away.

use crate::membership::{Membership, Refused};
use crate::{GroupId, ServerId, Time, Version};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// What a copy of a change says of itself and of its client's other changes.
#[derive(Clone, Copy, Debug)]
pub struct Tag<'a> {
    /// The client.
    pub client: u64,
    /// The change's number, the same in every copy.
    pub number: u64,
    /// Every change of the client numbered below this is settled.
    pub settled_below: u64,
    /// Changes at or above the mark the client gave up on.
    pub abandoned: &'a [u64],
}

/// What to do with a copy of a change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission<A> {
    /// Run it, then report with [`Fence::finished`].
    Run,
    /// It ran already: this was its answer.
    Answered(A),
    /// Its client settled it or gave up on it: a late copy, to drop.
    Late,
    /// Another copy of it, or a copy of a change its client gave up on, runs here: ask again
    /// once a change finishes.
    Wait,
}

#[derive(Debug)]
struct Changes<A> {
    settled_below: u64,
    abandoned: BTreeSet<u64>,
    /// Changes with a copy running here.
    running: BTreeSet<u64>,
    /// Answers of changes that ran here, at or above the mark.
    answered: BTreeMap<u64, A>,
    last_seen: Time,
}

/// The changes a server has seen, per client; `A` is an answer.
#[derive(Debug)]
pub struct Fence<A> {
    clients: HashMap<u64, Changes<A>>,
}

impl<A> Default for Fence<A> {
    fn default() -> Self {
        Fence {
            clients: HashMap::new(),
        }
    }
}

impl<A: Clone> Fence<A> {
    /// Decides about a copy of change `tag` arriving at `now`; [`Admission::Run`] marks it
    /// running.
    pub fn admit(&mut self, tag: Tag<'_>, now: Time) -> Admission<A> {
        let changes = self.clients.entry(tag.client).or_insert_with(|| Changes {
            settled_below: 0,
            abandoned: BTreeSet::new(),
            running: BTreeSet::new(),
            answered: BTreeMap::new(),
            last_seen: now,
        });
        changes.learn(tag, now);
        if tag.number < changes.settled_below || changes.abandoned.contains(&tag.number) {
            return Admission::Late;
        }
        if let Some(answer) = changes.answered.get(&tag.number) {
            return Admission::Answered(answer.clone());
        }
        let blocked = changes.running.iter().any(|&number| {
            number == tag.number
                || number < changes.settled_below
                || changes.abandoned.contains(&number)
        });
        if blocked {
            return Admission::Wait;
        }
        changes.running.insert(tag.number);
        Admission::Run
    }

    /// A copy admitted to run ended; `answer` is kept for later copies (`None`: the change
    /// was not made, and a later copy runs).
    pub fn finished(&mut self, client: u64, number: u64, answer: Option<A>) {
        let Some(changes) = self.clients.get_mut(&client) else {
            return;
        };
        changes.running.remove(&number);
        if let Some(answer) = answer {
            if number >= changes.settled_below && !changes.abandoned.contains(&number) {
                changes.answered.insert(number, answer);
            }
        }
    }

    /// Forgets clients with nothing running whose last change came `idle` or longer before
    /// `now`.
    pub fn forget_idle(&mut self, now: Time, idle: Time) {
        self.clients.retain(|_, changes| {
            !changes.running.is_empty() || now.saturating_sub(changes.last_seen) < idle
        });
    }
}

impl<A> Changes<A> {
    /// Takes in what `tag` says of its client's changes, and forgets what no copy can need.
    fn learn(&mut self, tag: Tag<'_>, now: Time) {
        self.last_seen = now;
        if tag.settled_below > self.settled_below {
            self.settled_below = tag.settled_below;
            let mark = self.settled_below;
            self.answered = self.answered.split_off(&mark);
            self.abandoned = self.abandoned.split_off(&mark);
        }
        for &number in tag.abandoned {
            if number >= self.settled_below {
                self.abandoned.insert(number);
                self.answered.remove(&number);
            }
        }
    }
}

/// The fences of the changes forwarded to a member, one per group in the version the group
/// is in: a primary sends a forward again when its answer does not come in time, and the
/// first copy, still on its way, must not land after a newer change. A new version starts a
/// new fence (a new primary forwards with its own numbering of steps).
#[derive(Debug)]
pub struct ForwardFences<F> {
    by_group: HashMap<GroupId, (Version, F)>,
}

/// The fence for a forward ([`ForwardFences::of`]).
pub enum FenceOf<'a, F> {
    /// The fence of the group's newest version seen.
    Current(&'a mut F),
    /// The forward is of an older version than one seen already (admitted just before the
    /// group moved on): it fences only itself.
    Older,
}

impl<F> Default for ForwardFences<F> {
    fn default() -> Self {
        ForwardFences {
            by_group: HashMap::new(),
        }
    }
}

impl<F> ForwardFences<F> {
    /// The fence of `group` in `version`, made with `new` when the version is newer than any
    /// seen (the older version's fence goes).
    pub fn of(
        &mut self,
        group: GroupId,
        version: Version,
        new: impl FnOnce() -> F,
    ) -> FenceOf<'_, F> {
        match self.by_group.get(&group) {
            Some((known, _)) if *known > version => return FenceOf::Older,
            Some((known, _)) if *known == version => {}
            _ => {
                self.by_group.insert(group, (version, new()));
            }
        }
        let (_, fence) = self.by_group.get_mut(&group).expect("inserted above");
        FenceOf::Current(fence)
    }

    /// A forward from the primary of `group` in `version` reaching `member`: admitted by the
    /// member's decisions (`member` is a present secondary of that version, see
    /// [`Membership::admit_forward`]), then the fence to pass it through. A forward that
    /// waited in its fence (a copy of it was running) is admitted again before it applies:
    /// the group may have moved on meanwhile.
    ///
    /// # Errors
    /// Why the member refuses it: the sender routes again once one of the two has the
    /// current map.
    pub fn admit<G: Clone>(
        &mut self,
        membership: &Membership<G>,
        member: ServerId,
        (group, version): (GroupId, Version),
        new: impl FnOnce() -> F,
    ) -> Result<FenceOf<'_, F>, Refused> {
        membership.admit_forward(member, group, version)?;
        Ok(self.of(group, version, new))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(number: u64, settled_below: u64, abandoned: &[u64]) -> Tag<'_> {
        Tag {
            client: 7,
            number,
            settled_below,
            abandoned,
        }
    }

    // Goal: a forward reaches a member's fence only when the member is a present secondary
    // of the version it carries; one of a version older than a fence kept runs through a fence
    // of its own.
    #[test]
    fn forwards_are_admitted_by_version_before_their_fence() {
        use crate::testing::adopt_pair;
        use crate::MemberState;
        let mut membership = Membership::new();
        let adopt = |membership: &mut Membership<()>, version, state| {
            adopt_pair(membership, ServerId(2), 0, (version, state));
        };
        adopt(&mut membership, Version(2), MemberState::Good);
        let mut fences = ForwardFences::<u32>::default();
        let group = GroupId(1);
        assert!(matches!(
            fences.admit(&membership, ServerId(2), (group, Version(2)), || 2),
            Ok(FenceOf::Current(2))
        ));
        assert_eq!(
            fences
                .admit(&membership, ServerId(2), (group, Version(1)), || 1)
                .err(),
            Some(Refused::WrongVersion { known: Version(2) })
        );
        adopt(&mut membership, Version(3), MemberState::Absent);
        assert_eq!(
            fences
                .admit(&membership, ServerId(2), (group, Version(3)), || 3)
                .err(),
            Some(Refused::NotPresent),
            "an absent member takes no forwards"
        );
        // This member admitted a forward of version 4 already (it heard of it first).
        fences.of(group, Version(4), || 4);
        let mut behind = Membership::new();
        adopt(&mut behind, Version(3), MemberState::Good);
        assert!(matches!(
            fences.admit(&behind, ServerId(2), (group, Version(3)), || 3),
            Ok(FenceOf::Older)
        ));
    }

    // Goal: a change runs once; a retry gets its answer; a late copy of a settled or
    // abandoned change is dropped; a change waits for a copy of an abandoned one still running.
    #[test]
    fn changes_apply_once_and_never_late() {
        let mut fence = Fence::<&str>::default();
        assert_eq!(fence.admit(tag(1, 1, &[]), 0), Admission::Run);
        assert_eq!(
            fence.admit(tag(1, 1, &[]), 0),
            Admission::Wait,
            "one copy at a time"
        );
        fence.finished(7, 1, Some("ten"));
        assert_eq!(fence.admit(tag(1, 1, &[]), 0), Admission::Answered("ten"));
        // An answer the client resends after is not kept: the retry runs.
        assert_eq!(fence.admit(tag(2, 1, &[]), 0), Admission::Run);
        fence.finished(7, 2, None);
        assert_eq!(fence.admit(tag(2, 1, &[]), 0), Admission::Run);
        fence.finished(7, 2, Some("five"));
        // Once the client settled them, late copies are dropped.
        assert_eq!(fence.admit(tag(1, 3, &[]), 0), Admission::Late);
        // A change given up on while a copy of it runs holds the next change until it ends.
        assert_eq!(fence.admit(tag(4, 3, &[]), 0), Admission::Run);
        assert_eq!(fence.admit(tag(5, 3, &[4]), 0), Admission::Wait);
        fence.finished(7, 4, None);
        assert_eq!(fence.admit(tag(5, 3, &[4]), 0), Admission::Run);
        assert_eq!(fence.admit(tag(4, 3, &[]), 0), Admission::Late);
        // Another client's changes are not held by this one's.
        let other = Tag {
            client: 8,
            ..tag(4, 0, &[])
        };
        assert_eq!(fence.admit(other, 0), Admission::Run);
    }

    #[test]
    fn idle_clients_are_forgotten_unless_a_change_runs() {
        let mut fence = Fence::<()>::default();
        assert_eq!(fence.admit(tag(1, 1, &[]), 0), Admission::Run);
        fence.forget_idle(1_000, 10);
        assert_eq!(
            fence.admit(tag(1, 1, &[]), 1_000),
            Admission::Wait,
            "still running"
        );
        fence.finished(7, 1, Some(()));
        fence.forget_idle(2_000, 10);
        assert_eq!(
            fence.admit(tag(1, 1, &[]), 2_000),
            Admission::Run,
            "forgotten"
        );
    }

    #[test]
    fn a_new_version_starts_a_new_fence_and_an_older_one_fences_itself() {
        let mut fences = ForwardFences::<u32>::default();
        let FenceOf::Current(fence) = fences.of(GroupId(1), Version(5), || 50) else {
            panic!("the first version seen is current");
        };
        *fence += 1;
        assert!(matches!(
            fences.of(GroupId(1), Version(5), || 0),
            FenceOf::Current(&mut 51)
        ));
        assert!(matches!(
            fences.of(GroupId(1), Version(4), || 0),
            FenceOf::Older
        ));
        assert!(matches!(
            fences.of(GroupId(1), Version(6), || 60),
            FenceOf::Current(&mut 60)
        ));
        assert!(matches!(
            fences.of(GroupId(2), Version(1), || 10),
            FenceOf::Current(&mut 10)
        ));
    }
}
