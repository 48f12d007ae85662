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
use weft_mirror::delivery::{Delivery, GivenUp, Sending};
use weft_mirror::pages::{Changes, CopyOrder, FileChange, PageResync, PageStep, SendOrder};
use weft_mirror::ResyncStart;
use weft_mirror::{
    Answer, Bytes, Change, ChunkId, ClientId, GroupId, Msg, Node, Refusal, Send, ServerId, Time,
    Version, HOMES, PLAIN,
};

/// Bytes of a home's store file per client chunk: a change of chunk `c` at `offset` writes
/// the file at `c * REGION + offset`.
pub const REGION: u64 = 64;
/// Bytes per extent of a record of what an absent member misses: several regions, so a
/// returning member gets other clients' bytes again too.
const EXTENT: u64 = 256;
/// Bytes per piece of a full copy: not a multiple of an extent, and several per file.
const PIECE: u64 = 160;
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

/// What a server keeps of the homes it serves and mirrors.
#[derive(Debug, Default)]
pub(super) struct Homes {
    /// The homes this server serves as primary, open.
    served: BTreeMap<GroupId, Home>,
    /// The copies this server holds as a member: the newest send applied to each.
    copies: BTreeMap<GroupId, CopyOrder>,
    /// Syncs of a home that could not ship: the home's next opening ships them first.
    unshipped: BTreeMap<GroupId, Unshipped>,
    /// Resyncs of members' copies this server runs as primary.
    resyncs: BTreeMap<(GroupId, ServerId), PageRun>,
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
    /// The file's length with `next` applied.
    len: u64,
    /// The commits of the next sync, in memory.
    next: Changes,
    /// Their clients, answered when it finished.
    next_clients: Vec<(ClientId, u64)>,
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
    changes: Changes,
    /// The file's length before a sync's changes.
    before: u64,
    sync: bool,
    /// The members it waits for, as [`Delivery`] decides (a resync's step: its member).
    delivery: Delivery,
    /// The clients of a sync's commits.
    clients: Vec<(ClientId, u64)>,
}

impl Shipment {
    /// The resync this is a step of.
    fn resync(&self) -> Option<ResyncStart> {
        self.delivery.step_of()
    }
}

/// A resync of a member's copy.
#[derive(Debug)]
struct PageRun {
    start: ResyncStart,
    plan: PageResync,
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
            let Unshipped {
                changes: next,
                clients: next_clients,
            } = self.homes.unshipped.remove(&group).unwrap_or_default();
            let len = next.last_len().unwrap_or_else(|| self.file_len(group));
            self.homes.copies.remove(&group);
            let home = Home {
                link: self.boot << 32 | self.homes.links,
                len,
                next,
                next_clients,
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
        if end > home.len {
            // A store grows its file ahead of its needs...
            home.len = end.next_multiple_of(GROWTH) + 2 * GROWTH;
            home.next.set_len(home.len);
        } else if seq % 7 == 0 {
            // ...and now and then gives the unused tail back.
            let written = home.next.changes.iter().map(|change| match *change {
                FileChange::Write { offset, len } => offset + u64::from(len),
                FileChange::SetLen(_) => 0,
            });
            let used = written.chain([held, end]).max().unwrap_or(0);
            if used.next_multiple_of(GROWTH) < home.len {
                home.len = used.next_multiple_of(GROWTH);
                home.next.set_len(home.len);
            }
        }
        home.next.write(at, &data);
        home.next_clients.push((client, seq));
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

    /// Starts the next send of a home when none is under way: its next sync, written and
    /// synced here first, else the next step of a resync.
    fn ship_next(&mut self, now: Time, group: GroupId) -> Vec<Send<Bytes>> {
        let Some(home) = self.homes.served.get_mut(&group) else {
            return Vec::new();
        };
        if home.busy.is_some() {
            return Vec::new();
        }
        if !home.next.is_empty() {
            let changes = std::mem::take(&mut home.next);
            let clients = std::mem::take(&mut home.next_clients);
            let before = self.file_len(group);
            changes.apply_to(self.store.volatile.entry((group, 0)).or_default());
            self.store.sync(group);
            // A sync given up is shipped again at the home's next opening: no member is owed
            // anything beyond it.
            let delivery = Delivery::new(
                &self.membership,
                now,
                self.id,
                group,
                Sending::Change { items: Vec::new() },
            );
            let shipment = Shipment {
                op: 0,
                changes,
                before,
                sync: true,
                delivery,
                clients,
            };
            return self.start_shipment(now, group, shipment);
        }
        let Some(key) = self
            .homes
            .resyncs
            .keys()
            .copied()
            .find(|(g, _)| *g == group)
        else {
            return Vec::new();
        };
        let len = self.file_len(group);
        let run = self.homes.resyncs.get_mut(&key).expect("found above");
        let mut changes = Changes::default();
        let sync = match run.plan.step(len) {
            Some(PageStep::Copy { offset, len }) => {
                let file = &self.store.volatile[&(group, 0)];
                changes.write(offset, &file[offset as usize..(offset + len) as usize]);
                false
            }
            Some(PageStep::Finish { len }) => {
                changes.set_len(len);
                true
            }
            None => return Vec::new(),
        };
        let start = run.start;
        let delivery = Delivery::new(&self.membership, now, self.id, group, Sending::Step(start));
        let shipment = Shipment {
            op: 0,
            changes,
            before: len,
            sync,
            delivery,
            clients: Vec::new(),
        };
        self.start_shipment(now, group, shipment)
    }

    fn start_shipment(
        &mut self,
        now: Time,
        group: GroupId,
        mut shipment: Shipment,
    ) -> Vec<Send<Bytes>> {
        shipment.op = self.op_id();
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
    /// the absent members' records before its commits are answered; a resync's last step
    /// finishes it. The next send starts.
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
                let key = (start.group, start.member);
                let current = self
                    .homes
                    .resyncs
                    .get(&key)
                    .is_some_and(|r| r.start == start);
                if shipment.sync && current {
                    let run = self.homes.resyncs.remove(&key).expect("looked up above");
                    self.resync_counts.finished += 1;
                    if run.plan.incremental() {
                        self.store.missed.remove(&key);
                    }
                    self.membership.resync_ended(start, true);
                }
            }
            None => {
                let extents = shipment.changes.extents(EXTENT, shipment.before);
                for ((missed_group, _), missed) in &mut self.store.missed {
                    if *missed_group == group {
                        missed.extend(extents.iter().copied());
                    }
                }
                for (client, seq) in shipment.clients {
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
        let Some(shipment) = self
            .homes
            .served
            .get_mut(&group)
            .and_then(|h| h.busy.take())
        else {
            return Vec::new();
        };
        if let Some(start) = shipment.resync() {
            let mut out = self.stop_page_resync(now, start);
            out.extend(self.ship_next(now, group));
            return out;
        }
        // Written and synced here, perhaps not on every member.
        let kept = self.homes.unshipped.entry(group).or_default();
        kept.changes.extend(&shipment.changes);
        kept.clients.extend(shipment.clients);
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

    /// Stops serving a home: its commits not answered yet are refused, and a sync under way
    /// is not kept (the home is served elsewhere now).
    fn close_home(&mut self, group: GroupId, refusal: Refusal) -> Vec<Send<Bytes>> {
        let Some(home) = self.homes.served.remove(&group) else {
            return Vec::new();
        };
        let mut clients = home.next_clients;
        clients.extend(home.busy.into_iter().flat_map(|s| s.clients));
        self.refuse(clients, refusal)
    }

    /// Stops resync `start` (its version ended, or its member did not take a step in time);
    /// it starts again at the next map while the member needs it.
    fn stop_page_resync(&mut self, now: Time, start: ResyncStart) -> Vec<Send<Bytes>> {
        let key = (start.group, start.member);
        if self
            .homes
            .resyncs
            .get(&key)
            .is_some_and(|r| r.start == start)
        {
            self.homes.resyncs.remove(&key);
            self.resync_counts.stopped += 1;
        }
        self.membership.resync_ended(start, false);
        let ours = self
            .shipment(start.group)
            .is_some_and(|s| s.resync() == Some(start));
        if !ours {
            return Vec::new();
        }
        if let Some(home) = self.homes.served.get_mut(&start.group) {
            home.busy = None;
        }
        self.ship_next(now, start.group)
    }

    /// Starts resync `start` of a home this server is primary of: the extents its member
    /// missed, when it left in sync and they were recorded, else the whole file.
    pub(super) fn start_page_resync(&mut self, now: Time, start: ResyncStart) -> Vec<Send<Bytes>> {
        let key = (start.group, start.member);
        let plan = match self.store.missed.get(&key) {
            Some(extents) if !start.full => PageResync::missed(extents.iter().copied(), EXTENT),
            _ => {
                // A record of what it missed does not cover a full copy.
                self.store.missed.remove(&key);
                PageResync::full(PIECE)
            }
        };
        self.resync_counts.started += 1;
        // A step of a resync this one replaces may still be under way: it lands or not, and
        // is no step of this one.
        if self
            .homes
            .resyncs
            .insert(key, PageRun { start, plan })
            .is_some()
        {
            self.resync_counts.stopped += 1;
        }
        self.open_home(start.group);
        self.ship_next(now, start.group)
    }

    /// A newer version of home `group`: resyncs of another version stop; a deposed primary
    /// stops serving it; a primary stops waiting for members that left.
    pub(super) fn adopt_home(&mut self, now: Time, group: &weft_mirror::Group) -> Vec<Send<Bytes>> {
        let mut out = Vec::new();
        let ended: Vec<ResyncStart> = self
            .homes
            .resyncs
            .values()
            .filter(|r| r.start.group == group.id && r.start.version != group.version)
            .map(|r| r.start)
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
