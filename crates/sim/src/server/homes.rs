//! The simulator's metadata homes: groups from [`HOMES`] on hold one store file each, mirrored
//! as metadata servers mirror their store files ([`crate::pages`]). A client's change is a
//! commit that writes its region of the file; it is answered once the sync covering it is on
//! the primary's disk and on every present member. Syncs ship one at a time and in order, each
//! send (every try) newer than the last, and a member applies only sends newer than every one
//! it applied. A sync that cannot ship closes the home; its changes are kept and ship first
//! when the home is opened again, unless another primary's send reaches this server first.
//! Absent members' records get the extents each sync wrote, and a returning member gets those,
//! or the whole file, piece by piece between syncs, then the length and a sync.
//!
//! A metadata server keeps the commits of its next sync in its own memory: every restart of
//! it loses them (its heartbeats say so), but none of them was answered.

use super::{refusal, reply, Server};
use std::collections::BTreeMap;
use std::sync::Arc;
use weft_mirror::delivery::{Delivery, GivenUp, Sending};
use weft_mirror::home::{HomeSends, NextSend, Pieces, StepEnd, SyncSend};
use weft_mirror::pages::{Changes, CopyOrder, FileChange, PageStep, SendOrder};
use weft_mirror::ResyncStart;
use weft_mirror::{
    Answer, Bytes, Change, ChunkId, ClientId, GroupId, Msg, Node, Refusal, Send, ServerId, Time,
    Version, HOMES, PLAIN,
};

/// Bytes of a home's store file per client chunk: a change of chunk `c` at `offset` writes
/// the file at `c * REGION + offset`.
pub const REGION: u64 = 64;
/// A store file grows in steps of this.
const GROWTH: u64 = 512;

/// Whether `group` is a metadata home.
pub fn is_home(group: GroupId) -> bool {
    (HOMES..PLAIN).contains(&group)
}

/// Chunk `chunk` of a home whose store file is `file`: its region, without trailing zeros.
pub fn home_region(file: Option<&Bytes>, chunk: ChunkId) -> Bytes {
    let file = file.map_or(&[][..], Vec::as_slice);
    let start = (chunk * REGION).min(file.len() as u64) as usize;
    let end = (chunk * REGION + REGION).min(file.len() as u64) as usize;
    let region = &file[start..end];
    let used = region
        .iter()
        .rposition(|byte| *byte != 0)
        .map_or(0, |at| at + 1);
    region[..used].to_vec()
}

/// How a home's file is cut for the absent members' records and for full copies: extents of
/// several regions, so a returning member gets other clients' bytes again too, and pieces
/// that are not a multiple of an extent, several per file.
const PIECES: Pieces = Pieces {
    extent: 256,
    piece: 160,
};

/// What a server keeps of the homes it serves and mirrors.
#[derive(Debug, Default)]
pub(super) struct Homes {
    /// The homes this server serves as primary, open.
    served: BTreeMap<GroupId, Home>,
    /// The copies this server holds as a member: the newest send applied to each.
    copies: BTreeMap<GroupId, CopyOrder>,
    /// Syncs of a home that could not ship: the home's next opening ships them first.
    unshipped: BTreeMap<GroupId, Unshipped>,
    /// Openings of homes so far.
    links: u64,
    /// Sends so far.
    sends: u64,
}

/// A home served here: one opening of its store file.
#[derive(Debug)]
struct Home {
    /// This opening: sends of a later one compare greater.
    link: u64,
    /// What the store wrote and the order of its sends, as a metadata server runs them.
    sends: HomeSends,
    /// The clients of commits, with the sync that answers each.
    waiting: Vec<(u64, ClientId, u64)>,
    /// The send under way: a sync's changes, or a resync's step.
    busy: Option<Shipment>,
}

/// A sync that could not ship. Its commits are in this server's file: a store opened from it
/// holds them, and a client asking again is answered from the reply they stored, once the
/// next sync shipped them. Here their clients wait for that sync.
#[derive(Debug, Default)]
struct Unshipped {
    changes: Changes,
    clients: Vec<(ClientId, u64)>,
}

/// Changes sent to members, waiting for their acknowledgements.
#[derive(Debug)]
struct Shipment {
    op: u64,
    /// A sync's ticket (a resync's step: 0).
    ticket: u64,
    changes: Arc<Changes>,
    /// The file's length before a sync's changes.
    before: u64,
    sync: bool,
    /// The members it waits for, as [`Delivery`] decides (a resync's step: its member).
    delivery: Delivery,
}

impl Shipment {
    /// The resync this is a step of.
    fn resync(&self) -> Option<ResyncStart> {
        self.delivery.step_of()
    }
}

impl Server {
    fn file_len(&self, group: GroupId) -> u64 {
        self.store.volatile.get(&(group, 0)).map_or(0, Vec::len) as u64
    }

    /// The home `group` served here, opened if it is not: the changes a sync of it could not
    /// ship are the first of its next sync, and this server's copy of it is closed.
    fn open_home(&mut self, group: GroupId) -> &mut Home {
        if !self.homes.served.contains_key(&group) {
            self.homes.links += 1;
            let Unshipped { changes, clients } =
                self.homes.unshipped.remove(&group).unwrap_or_default();
            let sends = HomeSends::open(changes, self.file_len(group), PIECES);
            self.homes.copies.remove(&group);
            let ticket = sends.asked();
            let home = Home {
                link: self.boot << 32 | self.homes.links,
                sends,
                waiting: clients
                    .into_iter()
                    .map(|(client, seq)| (ticket, client, seq))
                    .collect(),
                busy: None,
            };
            self.homes.served.insert(group, home);
        }
        self.homes.served.get_mut(&group).expect("opened above")
    }

    /// A client's commit: a write of its chunk's region, answered when its sync finished.
    pub(super) fn home_change(
        &mut self,
        now: Time,
        client: ClientId,
        (group, version): (GroupId, Version),
        change: Change,
        seq: u64,
    ) -> Vec<Send<Bytes>> {
        if let Err(out) = self.fence_client(now, client, seq) {
            return out;
        }
        let admitted = match (change, self.admit(now, group, version)) {
            (_, Some(refusal)) => Err(refusal),
            (
                Change::Write {
                    chunk,
                    offset,
                    data,
                },
                None,
            ) => Ok((chunk, offset, data)),
            // A store's commits write pages, nothing else.
            _ => Err(Refusal::WrongVersion),
        };
        let (chunk, offset, data) = match admitted {
            Ok(write) => write,
            Err(refusal) => {
                self.fence.finished(u64::from(client), seq, None);
                return vec![reply(client, seq, Answer::Refused(refusal))];
            }
        };
        let at = chunk * REGION + offset;
        let end = at + data.len() as u64;
        // What the file holds: up to its last byte written (written bytes are never zero).
        let held = self.store.volatile.get(&(group, 0)).map_or(0, |file| {
            file.iter()
                .rposition(|byte| *byte != 0)
                .map_or(0, |at| at + 1)
        }) as u64;
        let home = self.open_home(group);
        let sends = &mut home.sends;
        if end > sends.file_len() {
            // A store grows its file ahead of its needs...
            sends.set_len(end.next_multiple_of(GROWTH) + 2 * GROWTH);
        } else if seq % 7 == 0 {
            // ...and now and then gives the unused tail back.
            let written = sends.next().changes.iter().map(|change| match *change {
                FileChange::Write { offset, len } => offset + u64::from(len),
                FileChange::SetLen(_) => 0,
            });
            let used = written.chain([held, end]).max().unwrap_or(0);
            if used.next_multiple_of(GROWTH) < sends.file_len() {
                sends.set_len(used.next_multiple_of(GROWTH));
            }
        }
        sends.write(at, &data);
        let ticket = sends.ask().expect("a home whose sync failed is closed");
        home.waiting.push((ticket, client, seq));
        self.ship_next(now, group)
    }

    /// A client's sync: every answered commit is durable on every present member already.
    pub(super) fn home_sync(
        &mut self,
        now: Time,
        client: ClientId,
        (group, version): (GroupId, Version),
        seq: u64,
    ) -> Vec<Send<Bytes>> {
        let answer = match self.admit(now, group, version) {
            Some(refusal) => Answer::Refused(refusal),
            None => Answer::Done,
        };
        vec![reply(client, seq, answer)]
    }

    /// A client's read of its chunk's region.
    pub(super) fn home_read(
        &mut self,
        now: Time,
        client: ClientId,
        (group, version): (GroupId, Version),
        chunk: ChunkId,
        seq: u64,
    ) -> Vec<Send<Bytes>> {
        let answer = match self.admit(now, group, version) {
            Some(refusal) => Answer::Refused(refusal),
            None => Answer::Data {
                data: Some(home_region(self.store.volatile.get(&(group, 0)), chunk)),
                epoch: 0,
            },
        };
        vec![reply(client, seq, answer)]
    }

    /// Starts the next send of a home when none is under way, as its [`HomeSends`] picks
    /// it: a sync, written and synced here first, or a resync's step.
    fn ship_next(&mut self, now: Time, group: GroupId) -> Vec<Send<Bytes>> {
        let before = self.file_len(group);
        let Some(home) = self.homes.served.get_mut(&group) else {
            return Vec::new();
        };
        if home.busy.is_some() {
            return Vec::new();
        }
        let (changes, ticket, sending) = match home.sends.next_send(before) {
            None => return Vec::new(),
            Some(NextSend::Sync(SyncSend { changes, ticket })) => {
                changes.apply_to(self.store.volatile.entry((group, 0)).or_default());
                self.store.sync(group);
                // A sync given up is shipped again at the home's next opening: no member is
                // owed anything beyond it.
                (changes, ticket, Sending::Change { items: Vec::new() })
            }
            Some(NextSend::Step(start, step)) => {
                let mut changes = Changes::default();
                match step {
                    PageStep::Copy { offset, len } => {
                        let file = &self.store.volatile[&(group, 0)];
                        changes.write(offset, &file[offset as usize..(offset + len) as usize]);
                    }
                    PageStep::Finish { len } => changes.set_len(len),
                }
                (Arc::new(changes), 0, Sending::Step(start))
            }
        };
        let delivery = Delivery::new(&self.membership, now, self.id, group, sending);
        // A sync, or a resync's last step, syncs the member's copy.
        let sync = ticket > 0 || changes.last_len().is_some();
        let shipment = Shipment {
            op: self.op_id(),
            ticket,
            changes,
            before,
            sync,
            delivery,
        };
        let Some(home) = self.homes.served.get_mut(&group) else {
            return Vec::new();
        };
        home.busy = Some(shipment);
        let mut out = self.send_pages(now, group);
        out.extend(self.settle(now, group));
        out
    }

    /// Sends the copies of the shipment under way that its [`Delivery`] says are due, each a
    /// new send of its own.
    fn send_pages(&mut self, now: Time, group: GroupId) -> Vec<Send<Bytes>> {
        let pace = self.pace();
        let Some(home) = self.homes.served.get_mut(&group) else {
            return Vec::new();
        };
        let link = home.link;
        let Some(shipment) = home.busy.as_mut() else {
            return Vec::new();
        };
        let copies = shipment.delivery.due(&mut self.membership, now, pace);
        copies
            .into_iter()
            .map(|(member, version)| {
                self.homes.sends += 1;
                let order: SendOrder = (version, link, self.homes.sends);
                Send {
                    to: Node::Server(member),
                    msg: Msg::PageApply {
                        group,
                        version,
                        op: shipment.op,
                        order,
                        changes: shipment.changes.changes.clone(),
                        payload: shipment.changes.payload.clone(),
                        sync: shipment.sync,
                    },
                }
            })
            .collect()
    }

    fn shipment(&mut self, group: GroupId) -> Option<&mut Shipment> {
        self.homes
            .served
            .get_mut(&group)
            .and_then(|h| h.busy.as_mut())
    }

    /// A member applied send `op` of a home.
    pub(super) fn page_acknowledged(
        &mut self,
        now: Time,
        member: ServerId,
        group: GroupId,
        op: u64,
    ) -> Vec<Send<Bytes>> {
        let Some(shipment) = self
            .homes
            .served
            .get_mut(&group)
            .and_then(|h| h.busy.as_mut())
            .filter(|s| s.op == op)
        else {
            return Vec::new();
        };
        shipment.delivery.acknowledged(&mut self.membership, member);
        self.settle(now, group)
    }

    /// Ends the shipment under way once no member is waited for: a sync's extents go into
    /// the absent members' records before its commits are answered; a resync's step tells
    /// its resync, which the last step finishes. The next send starts.
    fn settle(&mut self, now: Time, group: GroupId) -> Vec<Send<Bytes>> {
        match self.shipment(group).and_then(|s| s.delivery.outcome()) {
            None => return Vec::new(),
            Some(Err(given_up)) => return self.give_up(now, group, given_up),
            Some(Ok(())) => {}
        }
        let home = self.homes.served.get_mut(&group).expect("has a shipment");
        let shipment = home.busy.take().expect("has a shipment");
        let mut out = Vec::new();
        match shipment.resync() {
            Some(start) => {
                if let StepEnd::Finished { incremental } = home.sends.stepped(start, true) {
                    self.resync_counts.finished += 1;
                    if incremental {
                        self.store.missed.remove(&(start.group, start.member));
                    }
                    self.membership.resync_ended(start, true);
                }
            }
            None => {
                let extents = home.sends.missed(shipment.before);
                for ((missed_group, _), missed) in &mut self.store.missed {
                    if *missed_group == group {
                        missed.extend(extents.iter().copied());
                    }
                }
                home.sends.synced(true);
                let sends = &home.sends;
                let (answered, waiting) = std::mem::take(&mut home.waiting)
                    .into_iter()
                    .partition(|(ticket, ..)| sends.outcome(*ticket).is_some());
                home.waiting = waiting;
                for (_, client, seq) in answered {
                    let answer = Answer::Written { epoch: 0 };
                    self.fence
                        .finished(u64::from(client), seq, Some(answer.clone()));
                    out.push(reply(client, seq, answer));
                }
            }
        }
        out.extend(self.ship_next(now, group));
        out
    }

    /// The shipment under way can no longer be sent: a resync's step stops its resync; a
    /// sync is kept, with its clients, for the home's next opening, and the home closes: the
    /// commits of the next sync, not in the file, are refused.
    fn give_up(&mut self, now: Time, group: GroupId, given_up: GivenUp) -> Vec<Send<Bytes>> {
        let Some(home) = self.homes.served.get_mut(&group) else {
            return Vec::new();
        };
        let Some(shipment) = home.busy.take() else {
            return Vec::new();
        };
        if let Some(start) = shipment.resync() {
            if home.sends.stepped(start, false) == StepEnd::Stopped {
                self.resync_counts.stopped += 1;
            }
            self.membership.resync_ended(start, false);
            return self.ship_next(now, group);
        }
        // Written and synced here, perhaps not on every member: its commits wait for the
        // home's next opening; later ones, not in the file, are refused.
        let kept = home.sends.synced(false);
        let (clients, later): (Vec<_>, Vec<_>) = std::mem::take(&mut home.waiting)
            .into_iter()
            .partition(|(ticket, ..)| *ticket <= shipment.ticket);
        home.waiting = later;
        let unshipped = self.homes.unshipped.entry(group).or_default();
        if let Some(kept) = kept {
            unshipped.changes.extend(&kept);
        }
        unshipped
            .clients
            .extend(clients.into_iter().map(|(_, client, seq)| (client, seq)));
        let refused = match given_up {
            GivenUp::Refused(refused) => refusal(refused),
            GivenUp::Late { .. } => Refusal::WrongVersion,
        };
        self.close_home(group, refused)
    }

    fn refuse(&mut self, clients: Vec<(ClientId, u64)>, refusal: Refusal) -> Vec<Send<Bytes>> {
        clients
            .into_iter()
            .map(|(client, seq)| {
                self.fence.finished(u64::from(client), seq, None);
                reply(client, seq, Answer::Refused(refusal))
            })
            .collect()
    }

    /// Stops serving a home: its commits not answered yet are refused, a sync under way is
    /// not kept (the home is served elsewhere now), and its resyncs stop (they start again at
    /// the next map while their members need them).
    fn close_home(&mut self, group: GroupId, refusal: Refusal) -> Vec<Send<Bytes>> {
        let Some(home) = self.homes.served.remove(&group) else {
            return Vec::new();
        };
        for start in home.sends.resyncs() {
            self.resync_counts.stopped += 1;
            self.membership.resync_ended(start, false);
        }
        let clients = home
            .waiting
            .into_iter()
            .map(|(_, client, seq)| (client, seq))
            .collect();
        self.refuse(clients, refusal)
    }

    /// Stops resync `start` (its version ended, or its member did not take a step in time);
    /// it starts again at the next map while the member needs it.
    fn stop_page_resync(&mut self, now: Time, start: ResyncStart) -> Vec<Send<Bytes>> {
        self.membership.resync_ended(start, false);
        let Some(home) = self.homes.served.get_mut(&start.group) else {
            return Vec::new();
        };
        if home.sends.stop_resync(start) {
            self.resync_counts.stopped += 1;
        }
        if home.busy.as_ref().and_then(Shipment::resync) == Some(start) {
            home.busy = None;
        }
        self.ship_next(now, start.group)
    }

    /// Starts resync `start` of a home this server is primary of: the extents its member
    /// missed, when it left in sync and they were recorded, else the whole file.
    pub(super) fn start_page_resync(&mut self, now: Time, start: ResyncStart) -> Vec<Send<Bytes>> {
        let key = (start.group, start.member);
        let recorded = self
            .store
            .missed
            .get(&key)
            .map(|extents| extents.iter().copied().collect());
        let len = self.file_len(start.group);
        let begun = self
            .open_home(start.group)
            .sends
            .begin_resync(start, recorded, len);
        if begun.forget_record {
            self.store.missed.remove(&key);
        }
        self.resync_counts.started += 1;
        // A step of a resync this one replaces may still be under way: it lands or not, and
        // is no step of this one.
        if begun.replaced.is_some() {
            self.resync_counts.stopped += 1;
        }
        self.ship_next(now, start.group)
    }

    /// A newer version of home `group`: resyncs of another version stop; a deposed primary
    /// stops serving it; a primary stops waiting for members that left.
    pub(super) fn adopt_home(&mut self, now: Time, group: &weft_mirror::Group) -> Vec<Send<Bytes>> {
        let mut out = Vec::new();
        let ended: Vec<ResyncStart> = self
            .homes
            .served
            .get(&group.id)
            .into_iter()
            .flat_map(|home| home.sends.resyncs())
            .filter(|start| start.version != group.version)
            .collect();
        for start in ended {
            out.extend(self.stop_page_resync(now, start));
        }
        if group.primary != self.id {
            out.extend(self.close_home(group.id, Refusal::NotPrimary));
            return out;
        }
        if let Some(shipment) = self
            .homes
            .served
            .get_mut(&group.id)
            .and_then(|h| h.busy.as_mut())
        {
            shipment.delivery.revisit(&mut self.membership, now);
        }
        out.extend(self.settle(now, group.id));
        out
    }

    /// Retries of sends not acknowledged in time; members that did not take one for the
    /// member timeout are reported (or their resync stops).
    pub(super) fn tick_homes(&mut self, now: Time) -> Vec<Send<Bytes>> {
        let mut out = Vec::new();
        // A home this server is primary of is served: opened again after a sync failed.
        let primary_of: Vec<GroupId> = self
            .membership
            .groups()
            .filter(|(g, _)| is_home(g.id) && g.primary == self.id)
            .map(|(g, _)| g.id)
            .collect();
        for group in primary_of {
            if !self.homes.served.contains_key(&group) {
                self.open_home(group);
            }
        }
        for group in self.homes.served.keys().copied().collect::<Vec<_>>() {
            out.extend(self.send_pages(now, group));
            out.extend(self.settle(now, group));
            out.extend(self.ship_next(now, group));
        }
        out
    }

    /// A send of a home's primary to this member: admitted by version, then applied only if
    /// it is newer than every send applied to the copy.
    pub(super) fn page_apply(&mut self, primary: ServerId, msg: Msg<Bytes>) -> Vec<Send<Bytes>> {
        let Msg::PageApply {
            group,
            version,
            op,
            order,
            changes,
            payload,
            sync,
        } = msg
        else {
            return Vec::new();
        };
        if self
            .membership
            .admit_forward(self.id, group, version)
            .is_err()
        {
            return self.member_refused(primary, group, op);
        }
        // A member serves no home it receives a copy of.
        let mut out = self.close_home(group, Refusal::NotPrimary);
        if self
            .homes
            .copies
            .entry(group)
            .or_default()
            .admit(order)
            .is_err()
        {
            // A late copy: dropped, as a metadata server answers `Superseded`.
            return out;
        }
        // Another primary wrote this copy: what this server could not ship of it is void.
        if let Some(void) = self.homes.unshipped.remove(&group) {
            out.extend(self.refuse(void.clients, Refusal::NotPrimary));
        }
        Changes { changes, payload }.apply_to(self.store.volatile.entry((group, 0)).or_default());
        if sync {
            self.store.sync(group);
        }
        out.push(Send {
            to: Node::Server(primary),
            msg: Msg::MemberAck { group, version, op },
        });
        out
    }
}
