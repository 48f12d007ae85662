//! What a primary does to bring a returning member up to date, as steps: storage servers run
//! them over their targets and the network, the simulator over its objects and messages.
//!
//! A member that left in sync gets the objects the primary recorded as missed; any other
//! first loses the objects it holds that the primary lacks, then gets every object the
//! primary holds ([`ResyncPlan`]). Removing first matters: a stale copy on the member of an
//! object the primary lacks (lost in a crash of every host, or removed while the member was
//! away) would otherwise take the forwards of a new object of that id on top of its old
//! bytes. An object is copied whole under its range lock, so no newer
//! change is overwritten: the member's copy removed, every byte written, then synced
//! ([`CopySteps`]). Every removal and write carries a tag of a client of the resync's own,
//! numbered in the order they are sent ([`StepNumbers`]): a step sent again after its answer
//! did not come is run once by the member's fence, and a first copy arriving after a later
//! step is dropped instead of undoing it. A resync ends by making everything the member holds
//! durable ([`ResyncStep::SyncMember`]).

use crate::{GroupId, ServerId, Version};
use std::collections::{HashMap, VecDeque};

/// One step of a resync ([`ResyncPlan::step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResyncStep {
    /// List the member's objects after this one; answer with [`ResyncPlan::listed`].
    ListMember {
        /// The last object of the previous page (0: from the start).
        after: u64,
    },
    /// Take the object's whole range, and keep it until [`ResyncStep::Release`]; answer
    /// with [`ResyncPlan::holds`]. The member's copy goes unless the primary holds the
    /// object. Asked again until answered (a shell that cannot take the range yet asks
    /// later).
    RemoveIfGone(u64),
    /// List the primary's objects; answer with [`ResyncPlan::primary_listed`].
    ListPrimary,
    /// Take the object's whole range, and keep it until [`ResyncStep::Release`]; answer
    /// with [`ResyncPlan::holds`]. The object is copied ([`CopySteps`]) if the primary
    /// holds it, otherwise the member's copy goes. Asked again until answered.
    Object(u64),
    /// Remove the member's copy of the object.
    Remove(u64),
    /// Seal the member's copy of the object: its file moved to another group, and only the
    /// seal is left here.
    Seal(u64),
    /// Write the primary's bytes `offset..offset + len` of the object, read now.
    Write {
        /// The object.
        object: u64,
        /// Where.
        offset: u64,
        /// How many.
        len: u64,
    },
    /// Sync the member's copy of the object.
    SyncObject(u64),
    /// The object is settled: let its range go.
    Release(u64),
    /// Make everything the member holds durable: it may hold changes it took before it left
    /// that no sync reached since (its primary synced without it), and once it is good it
    /// may be promoted, after a crash, as the only copy.
    SyncMember,
    /// Every step landed: the member is up to date.
    Done,
}

/// What the primary holds of an object, under its whole range ([`ResyncPlan::holds`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// The object, `length` bytes long; copied in writes of at most `largest`.
    Object {
        /// Its length.
        length: u64,
        /// The largest write of its copy.
        largest: u64,
    },
    /// Only its seal: the object's file moved to another group.
    SealedOff,
    /// Nothing: removed since the member left (or never made here).
    Gone,
}

#[derive(Debug)]
enum Listing {
    /// A page to ask for, after this object.
    Next(u64),
    /// A page asked for and not yet answered.
    Asked(u64),
    /// Objects of the last page to look at, the last object of the page, and whether it was
    /// the last page.
    Removing(VecDeque<u64>, u64, bool),
}

/// The steps of one resync, in order.
#[derive(Debug)]
pub struct ResyncPlan {
    /// The member's objects, looked at first in a full resync (`None`: done, or none to
    /// look at).
    member: Option<Listing>,
    /// The objects to copy (`None`: the primary's, still to be listed).
    objects: Option<VecDeque<u64>>,
    listed: bool,
    synced: bool,
    /// The object whose range the shell is to take (its step, asked again until
    /// answered), or the steps left for the object whose range it holds.
    object: Option<Object>,
    incremental: bool,
}

/// The object under way.
#[derive(Debug)]
enum Object {
    /// Its range to take.
    Taking(ResyncStep),
    /// Its steps left, the last its release.
    Steps(VecDeque<ResyncStep>),
}

impl ResyncPlan {
    /// A resync of what the member missed: `objects`.
    pub fn missed(objects: impl IntoIterator<Item = u64>) -> ResyncPlan {
        ResyncPlan {
            member: None,
            objects: Some(objects.into_iter().collect()),
            listed: false,
            synced: false,
            object: None,
            incremental: true,
        }
    }

    /// A full resync: first the member's objects the primary lacks go, page by page (an
    /// object the primary makes later reaches the member by its forwards, never over a
    /// stale copy), then every object the primary holds by then is copied.
    pub fn full() -> ResyncPlan {
        ResyncPlan {
            member: Some(Listing::Next(0)),
            objects: None,
            listed: false,
            synced: false,
            object: None,
            incremental: false,
        }
    }

    /// Whether this copies only what the member missed (its record is forgotten once it is
    /// done).
    pub fn incremental(&self) -> bool {
        self.incremental
    }

    /// The next step; a step is done before the next is asked for (a resync whose step
    /// failed is given up and planned again).
    pub fn step(&mut self) -> ResyncStep {
        match &mut self.object {
            Some(Object::Taking(step)) => return *step,
            Some(Object::Steps(steps)) => {
                let step = steps
                    .pop_front()
                    .expect("an object's steps end with its release");
                if steps.is_empty() {
                    self.object = None;
                }
                return step;
            }
            None => {}
        }
        let step = self.next_object_or_more();
        if let ResyncStep::RemoveIfGone(_) | ResyncStep::Object(_) = step {
            self.object = Some(Object::Taking(step));
        }
        step
    }

    /// The answer to [`ResyncStep::RemoveIfGone`] or [`ResyncStep::Object`]: what the
    /// primary holds of the object, now that the shell holds its whole range. The object's
    /// steps follow, the last its release: nothing to do when the member may keep its copy;
    /// the member's copy sealed or removed when the primary holds only a seal or nothing;
    /// otherwise the member's copy removed, every byte written, then synced.
    pub fn holds(&mut self, held: Held) {
        let Some(Object::Taking(step)) = self.object else {
            return;
        };
        let (object, copy) = match step {
            ResyncStep::RemoveIfGone(object) => (object, false),
            ResyncStep::Object(object) => (object, true),
            _ => unreachable!("only an object's step takes its range"),
        };
        let mut steps: VecDeque<ResyncStep> = match held {
            Held::Object { .. } if !copy => VecDeque::new(),
            Held::Object { length, largest } => CopySteps::new(length, largest)
                .map(|copy| match copy {
                    CopyStep::Remove => ResyncStep::Remove(object),
                    CopyStep::Write { offset, len } => ResyncStep::Write {
                        object,
                        offset,
                        len,
                    },
                    CopyStep::Sync => ResyncStep::SyncObject(object),
                })
                .collect(),
            Held::SealedOff => VecDeque::from([ResyncStep::Seal(object)]),
            Held::Gone => VecDeque::from([ResyncStep::Remove(object)]),
        };
        steps.push_back(ResyncStep::Release(object));
        self.object = Some(Object::Steps(steps));
    }

    /// The next step past the objects under way.
    fn next_object_or_more(&mut self) -> ResyncStep {
        while let Some(listing) = &mut self.member {
            match listing {
                Listing::Next(after) => {
                    let after = *after;
                    *listing = Listing::Asked(after);
                    return ResyncStep::ListMember { after };
                }
                Listing::Asked(after) => return ResyncStep::ListMember { after: *after },
                Listing::Removing(objects, last, end) => {
                    if let Some(object) = objects.pop_front() {
                        return ResyncStep::RemoveIfGone(object);
                    }
                    self.member = (!*end).then_some(Listing::Next(*last));
                }
            }
        }
        let Some(objects) = &mut self.objects else {
            self.listed = true;
            return ResyncStep::ListPrimary;
        };
        if let Some(object) = objects.pop_front() {
            return ResyncStep::Object(object);
        }
        if self.synced {
            return ResyncStep::Done;
        }
        self.synced = true;
        ResyncStep::SyncMember
    }

    /// The member's answer to [`ResyncStep::ListMember`]: its objects after the one asked
    /// for, in order, and whether they are the last.
    pub fn listed(&mut self, objects: Vec<u64>, end: bool) {
        if let Some(Listing::Asked(after)) = self.member {
            let last = objects.last().copied().unwrap_or(after);
            self.member = Some(Listing::Removing(objects.into(), last, end));
        }
    }

    /// The answer to [`ResyncStep::ListPrimary`]: the primary's objects; returns how many.
    pub fn primary_listed(&mut self, objects: impl IntoIterator<Item = u64>) -> usize {
        if !self.listed || self.objects.is_some() {
            return 0;
        }
        let objects: VecDeque<u64> = objects.into_iter().collect();
        let count = objects.len();
        self.objects = Some(objects);
        count
    }
}

/// One step of copying an object ([`CopySteps`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyStep {
    /// Remove the member's copy.
    Remove,
    /// Write the primary's bytes `offset..offset + len`, read now.
    Write {
        /// Where.
        offset: u64,
        /// How many.
        len: u64,
    },
    /// Sync the member's copy.
    Sync,
}

/// The steps of copying an object of `length` bytes in writes of at most `largest`.
#[derive(Clone, Debug)]
pub struct CopySteps {
    length: u64,
    largest: u64,
    /// The next byte to write, `None` before the removal.
    offset: Option<u64>,
    synced: bool,
}

impl CopySteps {
    /// Copying `length` bytes, in writes of at most `largest` (at least one byte).
    pub fn new(length: u64, largest: u64) -> CopySteps {
        CopySteps {
            length,
            largest: largest.max(1),
            offset: None,
            synced: false,
        }
    }
}

impl Iterator for CopySteps {
    type Item = CopyStep;

    fn next(&mut self) -> Option<CopyStep> {
        let Some(offset) = self.offset else {
            self.offset = Some(0);
            return Some(CopyStep::Remove);
        };
        if offset < self.length {
            let len = (self.length - offset).min(self.largest);
            self.offset = Some(offset + len);
            return Some(CopyStep::Write { offset, len });
        }
        if self.synced {
            return None;
        }
        self.synced = true;
        Some(CopyStep::Sync)
    }
}

/// The numbers of a member's resync steps in one version of its group, under a client of
/// their own: every resync of the member in that version numbers on, so a resync that
/// failed and started again settles the steps of the one it replaces.
#[derive(Clone, Copy, Debug)]
pub struct StepNumbers {
    /// The resyncs' client.
    pub client: u64,
    version: Version,
    next: u64,
}

impl StepNumbers {
    /// The next step's number; every step before it has landed (or its resync was given
    /// up), so it is also the number below which the client's steps are settled.
    pub fn draw(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

/// [`StepNumbers`] per (group, member).
#[derive(Debug, Default)]
pub struct ResyncNumbering {
    by_member: HashMap<(GroupId, ServerId), StepNumbers>,
}

impl ResyncNumbering {
    /// The step numbers of `member`'s resyncs in `version` of `group`; a new client (from
    /// `new_client`, which must not repeat) for a new version.
    pub fn of(
        &mut self,
        (group, version, member): (GroupId, Version, ServerId),
        new_client: impl FnOnce() -> u64,
    ) -> &mut StepNumbers {
        let key = (group, member);
        if self
            .by_member
            .get(&key)
            .is_none_or(|n| n.version != version)
        {
            let numbers = StepNumbers {
                client: new_client(),
                version,
                next: 0,
            };
            self.by_member.insert(key, numbers);
        }
        self.by_member.get_mut(&key).expect("present")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(plan: &mut ResyncPlan, mut member: Vec<Vec<u64>>, primary: &[u64]) -> Vec<ResyncStep> {
        let mut steps = Vec::new();
        loop {
            let step = plan.step();
            steps.push(step);
            match step {
                ResyncStep::Done => return steps,
                ResyncStep::ListMember { .. } => {
                    let page = member.remove(0);
                    plan.listed(page, member.is_empty());
                }
                ResyncStep::ListPrimary => {
                    plan.primary_listed(primary.iter().copied());
                }
                ResyncStep::RemoveIfGone(object) | ResyncStep::Object(object) => {
                    plan.holds(if primary.contains(&object) {
                        Held::Object {
                            length: 6,
                            largest: 4,
                        }
                    } else {
                        Held::Gone
                    });
                }
                _ => {}
            }
        }
    }

    // Goal: an incremental resync copies what was missed and nothing else; a full one first
    // pages through the member's objects to remove what the primary lacks, then copies
    // everything the primary holds by then, and both end with a sync of the member.
    #[test]
    fn a_plan_removes_what_the_member_alone_holds_then_copies() {
        use ResyncStep::*;
        let mut missed = ResyncPlan::missed([4, 9]);
        assert_eq!(
            all(&mut missed, vec![], &[9]),
            vec![
                Object(4),
                Remove(4),
                Release(4),
                Object(9),
                Remove(9),
                Write {
                    object: 9,
                    offset: 0,
                    len: 4
                },
                Write {
                    object: 9,
                    offset: 4,
                    len: 2
                },
                SyncObject(9),
                Release(9),
                SyncMember,
                Done
            ]
        );
        let mut full = ResyncPlan::full();
        assert_eq!(
            all(&mut full, vec![vec![1, 3], vec![], vec![5]], &[1, 2]),
            vec![
                ListMember { after: 0 },
                RemoveIfGone(1),
                Release(1),
                RemoveIfGone(3),
                Remove(3),
                Release(3),
                ListMember { after: 3 },
                ListMember { after: 3 },
                RemoveIfGone(5),
                Remove(5),
                Release(5),
                ListPrimary,
                Object(1),
                Remove(1),
                Write {
                    object: 1,
                    offset: 0,
                    len: 4
                },
                Write {
                    object: 1,
                    offset: 4,
                    len: 2
                },
                SyncObject(1),
                Release(1),
                Object(2),
                Remove(2),
                Write {
                    object: 2,
                    offset: 0,
                    len: 4
                },
                Write {
                    object: 2,
                    offset: 4,
                    len: 2
                },
                SyncObject(2),
                Release(2),
                SyncMember,
                Done
            ]
        );
    }

    // Goal: an object's step is asked again until the shell holds its range and says what
    // the primary holds; an object that moved away is sealed on the member, not removed.
    #[test]
    fn an_object_waits_for_its_range_and_a_moved_one_is_sealed() {
        use ResyncStep::*;
        let mut plan = ResyncPlan::missed([4]);
        assert_eq!(plan.step(), Object(4));
        assert_eq!(plan.step(), Object(4), "asked again until answered");
        plan.holds(Held::SealedOff);
        assert_eq!(
            [plan.step(), plan.step(), plan.step()],
            [Seal(4), Release(4), SyncMember]
        );
    }

    #[test]
    fn a_copy_removes_writes_in_pieces_and_syncs() {
        use CopyStep::*;
        let steps: Vec<CopyStep> = CopySteps::new(10, 4).collect();
        assert_eq!(
            steps,
            vec![
                Remove,
                Write { offset: 0, len: 4 },
                Write { offset: 4, len: 4 },
                Write { offset: 8, len: 2 },
                Sync
            ]
        );
        assert_eq!(CopySteps::new(0, 4).collect::<Vec<_>>(), vec![Remove, Sync]);
    }

    #[test]
    fn resyncs_of_a_member_number_on_within_a_version() {
        let mut numbering = ResyncNumbering::default();
        let mut clients = 100..;
        let mut next = || clients.next().expect("endless");
        assert_eq!(
            numbering
                .of((GroupId(1), Version(5), ServerId(2)), &mut next)
                .draw(),
            1
        );
        assert_eq!(
            numbering
                .of((GroupId(1), Version(5), ServerId(2)), &mut next)
                .draw(),
            2
        );
        let again = numbering.of((GroupId(1), Version(5), ServerId(2)), &mut next);
        assert_eq!((again.client, again.draw()), (100, 3));
        let newer = numbering.of((GroupId(1), Version(6), ServerId(2)), &mut next);
        assert_eq!((newer.client, newer.draw()), (101, 1));
        assert_eq!(
            numbering
                .of((GroupId(1), Version(6), ServerId(3)), &mut next)
                .client,
            102
        );
    }
}
