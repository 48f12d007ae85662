//! The simulator's storage server: primary and secondary of its groups. What it decides
//! about its groups (versions, lease, admission, unreachable members, resyncs to run, records
//! of missed changes) is [`Membership`]; how it keeps members' copies equal is what storage
//! servers run too: clients' changes pass a change [`Fence`], a primary holds the chunk's
//! range ([`RangeTable`]) while it applies a change and forwards it, each member passes
//! forwards through the fence of their group's version ([`ForwardFences`]), and a returning
//! member is brought up to date by a [`ResyncPlan`] whose objects are copied by
//! [`CopySteps`] under their range lock, every step tagged by [`ResyncNumbering`]. Nothing
//! here orders copies by anything the storage servers do not have: no stamps, no versions on
//! data.

use std::collections::{BTreeMap, VecDeque};
use weft_mirror::delivery::{Delivery, GivenUp, Pace, Sending};
use weft_mirror::fence::{Admission, Fence, FenceOf, ForwardFences, Tag};
use weft_mirror::numbers::Numbers;
use weft_mirror::primary::PrimaryChange;
use weft_mirror::ranges::RangeTable;
use weft_mirror::resync::{self, ResyncNumbering, ResyncPlan, ResyncStep};
use weft_mirror::watch::Watches;
use weft_mirror::{
    Answer, Bytes, Change, ChangeId, ChunkId, ClientId, GroupId, GroupMap, Msg, Node, Refusal,
    Send, ServerId, Time, Timing, Version, PLAIN,
};
use weft_mirror::{Membership, Refused, ResyncStart};

mod homes;
mod member;
mod pushes;
mod resyncs;
mod store;

pub use homes::{home_region, is_home, REGION};
pub use pushes::{copier_of, COPIERS};
use resyncs::LIST_PAGE;
pub use store::Store;

/// What a forward to the members does.
#[derive(Clone, Debug)]
enum Work {
    /// A change, tagged by its client (or its resync).
    Change { tag: ChangeId, change: Change },
    /// Make the group's data durable.
    Sync,
    /// Make one chunk durable (a resync's copy).
    SyncChunk(ChunkId),
    /// List the member's chunks after one (a full resync).
    List { after: ChunkId },
}

/// A forward waiting for members' acknowledgements.
#[derive(Clone, Debug)]
struct Pending {
    work: Work,
    run: Run,
    /// Who waits for it to end.
    waiter: Waiter,
}

/// What a forward is.
#[derive(Clone, Debug)]
enum Run {
    /// A client's change or sync, as its primary runs it.
    Client(PrimaryChange),
    /// A step of a resync: sent with the resync's version only, and given up (the resync
    /// stops) when the member does not take it within the member timeout.
    Step(Delivery),
}

impl Pending {
    fn delivery(&self) -> &Delivery {
        match &self.run {
            Run::Client(change) => &change.delivery,
            Run::Step(delivery) => delivery,
        }
    }

    fn delivery_mut(&mut self) -> &mut Delivery {
        match &mut self.run {
            Run::Client(change) => &mut change.delivery,
            Run::Step(delivery) => delivery,
        }
    }

    fn group(&self) -> GroupId {
        self.delivery().group()
    }

    /// The resync this is a step of.
    fn resync(&self) -> Option<ResyncStart> {
        self.delivery().step_of()
    }
}

/// Who waits for a forward to end.
#[derive(Clone, Copy, Debug, Default)]
struct Waiter {
    /// The client to answer.
    client: Option<(ClientId, u64)>,
    /// The chunk range the forward holds, released when it ends.
    held: Option<Held>,
    /// Whether the push under way waits for it (its seal of the members).
    for_push: bool,
}

/// A chunk's whole range, held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    key: (GroupId, ChunkId),
    id: u64,
}

/// A client's change waiting for its range of the chunk.
#[derive(Clone, Debug)]
struct Queued {
    client: ClientId,
    seq: u64,
    /// The version the client routed with.
    version: Version,
    change: Change,
}

/// Bringing one returning member up to date, in one version of its group.
#[derive(Debug)]
struct Resync {
    start: ResyncStart,
    plan: ResyncPlan,
    /// The range of the chunk being brought over, held.
    object: Option<Held>,
    /// The forward under way.
    in_flight: Option<u64>,
}

/// A storage server's mirror machine.
#[derive(Debug)]
pub struct Server {
    id: ServerId,
    timing: Timing,
    boot: u64,
    unsynced_boot: u64,
    store: Store,
    membership: Membership<()>,
    next_heartbeat: Time,
    next_op: u64,
    /// Clients' changes sent to this server.
    fence: Fence<Answer<Bytes>>,
    /// Changes forwarded to this server, per group version.
    forward_fences: ForwardFences<Fence<()>>,
    /// Chunk ranges held by changes and resync copies under way here as primary.
    ranges: RangeTable<(GroupId, ChunkId), ()>,
    /// Client writes waiting for a chunk's range, in arrival order.
    queued: BTreeMap<(GroupId, ChunkId), VecDeque<Queued>>,
    pending: BTreeMap<u64, Pending>,
    resyncs: BTreeMap<(GroupId, ServerId), Resync>,
    numbering: ResyncNumbering,
    next_resync_client: u64,
    /// The numbers of this server's forwards of clients' changes, as primary.
    forwards: Numbers,
    /// The sender id of those forwards: this start of this server.
    forwarder: u64,
    /// The metadata homes it serves and mirrors.
    homes: homes::Homes,
    /// What changed of each chunk being moved off, as primary, since its move's last round.
    watches: Watches<(GroupId, ChunkId)>,
    /// The move's round under way here, as primary of the group its chunk moves off.
    push: Option<pushes::PushRun>,
    /// The client this server's pushes write their copies through, and what it sends.
    copier: crate::Client<Bytes>,
    copier_out: Vec<Send<Bytes>>,
    /// Client operations served as primary: (time, group, version), for the simulator's
    /// split-brain check.
    pub served: Vec<(Time, GroupId, Version)>,
    /// Resyncs this server ran as primary: started, finished, and stopped before they
    /// finished (their version ended, a step was not taken in time, or a newer one replaced
    /// them), for the simulator's account of what it exercised.
    pub resync_counts: ResyncCounts,
}

/// How many resyncs a server started, finished, and stopped before they finished.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResyncCounts {
    /// Started.
    pub started: u64,
    /// Finished: every step landed.
    pub finished: u64,
    /// Stopped before they finished.
    pub stopped: u64,
}

/// A server's own clients (its forwards and its resyncs): ids no client gets.
const OWN_CLIENTS: u64 = 1 << 63;

impl Server {
    /// A server starting (or restarting: `boot` must differ) with `store`; `unsynced_boot`
    /// differs from the last one when the restart lost what the store had not synced.
    pub fn new(
        id: ServerId,
        timing: Timing,
        boot: u64,
        unsynced_boot: u64,
        store: Store,
        now: Time,
    ) -> Server {
        Server {
            id,
            timing,
            boot,
            unsynced_boot,
            store,
            membership: Membership::new(),
            next_heartbeat: now,
            next_op: 1,
            fence: Fence::default(),
            forward_fences: ForwardFences::default(),
            ranges: RangeTable::default(),
            queued: BTreeMap::new(),
            pending: BTreeMap::new(),
            resyncs: BTreeMap::new(),
            numbering: ResyncNumbering::default(),
            next_resync_client: OWN_CLIENTS | u64::from(id.0) << 40 | (boot & 0xff_ffff) << 16,
            forwards: Numbers::default(),
            forwarder: OWN_CLIENTS | u64::from(id.0) << 40 | (boot & 0xff_ffff) << 16,
            homes: homes::Homes::default(),
            watches: Watches::default(),
            push: None,
            copier: crate::Client::new(copier_of(id, boot), timing),
            copier_out: Vec::new(),
            served: Vec::new(),
            resync_counts: ResyncCounts::default(),
        }
    }

    /// The data.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Gives the data back (for a restart after a crash).
    pub fn into_store(self) -> Store {
        self.store
    }

    fn op_id(&mut self) -> u64 {
        self.next_op += 1;
        self.next_op
    }

    fn loss_epoch(&self, group: GroupId) -> u64 {
        self.membership
            .group(group)
            .map_or(0, |(g, _)| g.loss_epoch)
    }

    /// How this server paces its copies to members: a copy lost on the network is sent
    /// again after the retry interval.
    fn pace(&self) -> Pace {
        Pace {
            resend: self.timing.retry_ms,
            retry: self.timing.retry_ms,
            member_timeout: self.timing.member_timeout_ms,
        }
    }

    /// Heartbeats, retries of forwards, and resync progress.
    pub fn tick(&mut self, now: Time) -> Vec<Send<Bytes>> {
        let mut out = Vec::new();
        // Copies due, members late (reported, or their resync step given up).
        for op in self.pending.keys().copied().collect::<Vec<_>>() {
            out.extend(self.send_due(now, op));
        }
        out.extend(self.settle_all(now));
        if now >= self.next_heartbeat {
            self.next_heartbeat = now + self.timing.heartbeat_ms;
            out.push(Send {
                to: Node::Mgmt,
                msg: Msg::Heartbeat {
                    boot: self.boot,
                    unsynced_boot: self.unsynced_boot,
                    sent_at: now,
                    resynced: self.membership.resynced(),
                    unreachable: self
                        .membership
                        .unreachable(now, self.timing.member_timeout_ms),
                },
            });
        }
        out.extend(self.advance_resyncs(now));
        out.extend(self.tick_homes(now));
        out.extend(self.tick_push(now));
        out
    }

    /// Sends the copies of forward `op` that its [`Delivery`] says are due, each with the
    /// version it carries and (a client's change) what this server settled or gave up on
    /// as it is now.
    fn send_due(&mut self, now: Time, op: u64) -> Vec<Send<Bytes>> {
        let pace = self.pace();
        let Some(pending) = self.pending.get_mut(&op) else {
            return Vec::new();
        };
        let copies = pending.delivery_mut().due(&mut self.membership, now, pace);
        if let (Run::Client(change), Work::Change { tag, .. }) = (&pending.run, &mut pending.work) {
            if let Some((_, marks)) = change.tag(&self.forwards) {
                tag.settled_below = marks.settled_below;
                tag.abandoned = marks.abandoned;
            }
        }
        copies
            .into_iter()
            .map(|(member, version)| forward(op, pending, version, member))
            .collect()
    }

    /// Ends every forward whose delivery ended: taken by every member (its client answered,
    /// its resync moved on), or given up (its client told to route again, its resync
    /// stopped).
    fn settle_all(&mut self, now: Time) -> Vec<Send<Bytes>> {
        let ended: Vec<(u64, Result<(), GivenUp>)> = self
            .pending
            .iter()
            .filter_map(|(op, p)| Some((*op, p.delivery().outcome()?)))
            .collect();
        let mut out = Vec::new();
        for (op, outcome) in ended {
            let Some(pending) = self.pending.get(&op) else {
                continue;
            };
            let resync = pending.resync();
            match (outcome, resync) {
                (Ok(()), Some(start)) => {
                    out.extend(self.end_pending(now, op));
                    if let Some(resync) = self.resyncs.get_mut(&(start.group, start.member)) {
                        if resync.in_flight == Some(op) {
                            resync.in_flight = None;
                        }
                    }
                }
                (Ok(()), None) => out.extend(self.end_pending(now, op)),
                (Err(_), Some(start)) => {
                    out.extend(self.end_pending(now, op));
                    out.extend(self.stop_resync(now, start));
                }
                (Err(_), None) => out.extend(self.end_pending(now, op)),
            }
        }
        out
    }

    /// Ends forward `op`: its client gets its answer (a refusal is not kept by the fence, so
    /// a retry runs again), its range is released and writes waiting for it go on.
    fn end_pending(&mut self, now: Time, op: u64) -> Vec<Send<Bytes>> {
        let Some(pending) = self.pending.remove(&op) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if pending.waiter.for_push {
            if let Run::Client(change) = pending.run {
                out.extend(self.members_sealed(now, change.end(&self.forwards).is_ok()));
            }
            return out;
        }
        if let Run::Client(change) = pending.run {
            let answer = match (change.end(&self.forwards), &pending.work) {
                (Ok(epoch), Work::Change { .. }) => Answer::Written { epoch },
                (Ok(_), _) => Answer::Done,
                (Err(GivenUp::Refused(refused)), _) => Answer::Refused(refusal(refused)),
                (Err(GivenUp::Late { .. }), _) => Answer::Refused(Refusal::WrongVersion),
            };
            if let Some((client, seq)) = pending.waiter.client {
                if let Work::Change { .. } = pending.work {
                    let kept = (!matches!(answer, Answer::Refused(_))).then(|| answer.clone());
                    self.fence.finished(u64::from(client), seq, kept);
                }
                out.push(reply(client, seq, answer));
            }
        }
        if let Some(held) = pending.waiter.held {
            out.extend(self.release(now, held));
        }
        out
    }

    /// Lets a chunk's range go; the first write waiting for it takes it.
    fn release(&mut self, now: Time, held: Held) -> Vec<Send<Bytes>> {
        self.ranges.unlock(&held.key, held.id);
        let Some(queue) = self.queued.get_mut(&held.key) else {
            return Vec::new();
        };
        let Some(next) = queue.pop_front() else {
            return Vec::new();
        };
        if queue.is_empty() {
            self.queued.remove(&held.key);
        }
        self.apply_change(now, held.key, next)
    }

    /// Handles a message.
    pub fn handle(&mut self, now: Time, from: Node, msg: Msg<Bytes>) -> Vec<Send<Bytes>> {
        match (from, msg) {
            (Node::Mgmt, Msg::HeartbeatAck { sent_at, map }) => self.adopt(sent_at, map, now),
            (
                Node::Client(mover),
                Msg::Push {
                    group,
                    version,
                    chunk,
                    to,
                    id,
                    seal,
                    seq,
                },
            ) => self.push_request(now, (mover, seq), (group, version, chunk), (to, id, seal)),
            (Node::Client(client), msg) => self.client_message(now, client, msg),
            (Node::Server(primary), msg @ Msg::PageApply { .. }) => self.page_apply(primary, msg),
            (Node::Server(member), Msg::MemberAck { group, op, .. }) if is_home(group) => {
                self.page_acknowledged(now, member, group, op)
            }
            (
                Node::Server(primary),
                msg @ (Msg::Forward { .. } | Msg::SyncReplica { .. } | Msg::SyncChunk { .. }),
            ) => self.as_member(now, primary, msg),
            (
                Node::Server(primary),
                Msg::ListChunks {
                    group, op, after, ..
                },
            ) => vec![self.list_chunks(primary, group, op, after)],
            (
                Node::Server(member),
                Msg::Chunks {
                    group,
                    op,
                    chunks,
                    end,
                },
            ) => {
                self.chunks_listed(op, chunks, end);
                self.acknowledged(group, op, member, now)
            }
            (Node::Server(member), Msg::MemberAck { group, op, .. }) => {
                self.acknowledged(group, op, member, now)
            }
            // A member that knows another version refused: the forward is sent again after a
            // pause, once one of the two has the current map.
            (Node::Server(member), Msg::MemberRefused { group, op, .. }) if !is_home(group) => {
                self.refused_by_member(now, op, member);
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// Handles a client's message: to a metadata home, a plain group (no mirror) or a
    /// mirrored one.
    fn client_message(&mut self, now: Time, client: ClientId, msg: Msg<Bytes>) -> Vec<Send<Bytes>> {
        match msg {
            Msg::Change {
                group,
                version,
                change,
                seq,
            } if is_home(group) => self.home_change(now, client, (group, version), change, seq),
            Msg::Sync {
                group,
                version,
                seq,
                ..
            } if is_home(group) => self.home_sync(now, client, (group, version), seq),
            Msg::Read {
                group,
                version,
                chunk,
                seq,
            } if is_home(group) => self.home_read(now, client, (group, version), chunk, seq),
            Msg::Change {
                group, change, seq, ..
            } if group >= PLAIN => self.plain_change(now, client, group, change, seq),
            Msg::Sync {
                group, since, seq, ..
            } if group >= PLAIN => {
                let answer = if since < self.unsynced_boot {
                    Answer::Lost
                } else {
                    self.store.sync(group);
                    Answer::Done
                };
                vec![reply(client, seq, answer)]
            }
            Msg::Read {
                group, chunk, seq, ..
            } if group >= PLAIN => {
                let answer = Answer::Data {
                    data: self.store.volatile.get(&(group, chunk)).cloned(),
                    epoch: self.unsynced_boot,
                };
                vec![reply(client, seq, answer)]
            }
            Msg::Change {
                group,
                version,
                change,
                seq,
            } => self.client_change(now, client, (group, version), change, seq),
            Msg::Sync {
                group,
                version,
                since,
                seq,
            } => self.client_sync(now, client, (group, version), since, seq),
            Msg::Read {
                group,
                version,
                chunk,
                seq,
            } => {
                let answer = match self.admit(now, group, version) {
                    Some(refusal) => Answer::Refused(refusal),
                    None if self.store.sealed.contains(&(group, chunk)) => Answer::Moved,
                    None => Answer::Data {
                        data: self.store.volatile.get(&(group, chunk)).cloned(),
                        epoch: self.loss_epoch(group),
                    },
                };
                vec![reply(client, seq, answer)]
            }
            _ => Vec::new(),
        }
    }

    /// A page of this member's chunks of `group` after `after`, for its primary's resync:
    /// pages of a few, so that the listing is paged as a storage server's is.
    fn list_chunks(
        &self,
        primary: ServerId,
        group: GroupId,
        op: u64,
        after: ChunkId,
    ) -> Send<Bytes> {
        let chunks: Vec<ChunkId> = self
            .store
            .chunks(group)
            .filter(|chunk| *chunk > after)
            .take(LIST_PAGE + 1)
            .collect();
        let end = chunks.len() <= LIST_PAGE;
        Send {
            to: Node::Server(primary),
            msg: Msg::Chunks {
                group,
                op,
                chunks: chunks.into_iter().take(LIST_PAGE).collect(),
                end,
            },
        }
    }

    /// A member's listing for the resync step `op`, if that resync still waits for it.
    fn chunks_listed(&mut self, op: u64, chunks: Vec<ChunkId>, end: bool) {
        let listed = self.pending.get(&op).and_then(Pending::resync);
        if let Some(start) = listed {
            if let Some(resync) = self.resyncs.get_mut(&(start.group, start.member)) {
                if resync.in_flight == Some(op) {
                    resync.plan.listed(chunks, end);
                }
            }
        }
    }

    /// Admits a client operation on `group` routed with `version`, recording it as served, or
    /// says why this server may not serve it.
    fn admit(&mut self, now: Time, group: GroupId, version: Version) -> Option<Refusal> {
        match self.membership.admit_primary(now, self.id, group, version) {
            Ok(_) => {
                self.served.push((now, group, version));
                None
            }
            Err(refused) => Some(refusal(refused)),
        }
    }

    /// Passes change `seq` of `client` through the clients' fence: `Ok` to run it, or what to
    /// answer instead (the answer of the copy that ran; nothing while a copy runs here, which
    /// answers it, or for a late copy).
    fn fence_client(
        &mut self,
        now: Time,
        client: ClientId,
        seq: u64,
    ) -> Result<(), Vec<Send<Bytes>>> {
        // One operation at a time per client: every earlier one is settled.
        let tag = Tag {
            client: u64::from(client),
            number: seq,
            settled_below: seq,
            abandoned: &[],
        };
        match self.fence.admit(tag, now) {
            Admission::Run => Ok(()),
            Admission::Answered(answer) => Err(vec![reply(client, seq, answer)]),
            Admission::Wait | Admission::Late => Err(Vec::new()),
        }
    }

    /// A change of a plain object of this server's target: through the fence, applied here
    /// alone.
    fn plain_change(
        &mut self,
        now: Time,
        client: ClientId,
        place: GroupId,
        change: Change,
        seq: u64,
    ) -> Vec<Send<Bytes>> {
        if let Err(out) = self.fence_client(now, client, seq) {
            return out;
        }
        change.apply_to(&mut self.store.volatile, place);
        let answer = Answer::Written {
            epoch: self.unsynced_boot,
        };
        self.fence
            .finished(u64::from(client), seq, Some(answer.clone()));
        vec![reply(client, seq, answer)]
    }

    /// A client's change: through the fence (a retry of one that ran gets its answer, one
    /// still running here waits for it), admitted as primary, then applied and forwarded
    /// under its range of the chunk.
    fn client_change(
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
        if let Some(refusal) = self.admit(now, group, version) {
            self.fence.finished(u64::from(client), seq, None);
            return vec![reply(client, seq, Answer::Refused(refusal))];
        }
        let key = (group, change.chunk());
        let queued = Queued {
            client,
            seq,
            version,
            change,
        };
        if self.queued.contains_key(&key) {
            self.queued.entry(key).or_default().push_back(queued);
            return Vec::new();
        }
        self.apply_change(now, key, queued)
    }

    /// Takes the change's range of the chunk (or waits for it), applies the change here and
    /// forwards it to every present member; the client is answered once each has it.
    fn apply_change(
        &mut self,
        now: Time,
        key: (GroupId, ChunkId),
        queued: Queued,
    ) -> Vec<Send<Bytes>> {
        let Ok(id) = self.ranges.try_lock(&key, queued.change.range(), || ()) else {
            self.queued.entry(key).or_default().push_front(queued);
            return Vec::new();
        };
        let (group, chunk) = key;
        let Queued {
            client,
            seq,
            version,
            change,
        } = queued;
        let held = Held { key, id };
        // A sealed chunk takes no change (its copy elsewhere would miss it), as a storage
        // server refuses one to a sealed object before it forwards it.
        if self.store.sealed.contains(&key) {
            let answer = match self.admit(now, group, version) {
                Some(refusal) => Answer::Refused(refusal),
                None => Answer::Moved,
            };
            let kept = (answer == Answer::Moved).then(|| answer.clone());
            self.fence.finished(u64::from(client), seq, kept);
            let mut out = vec![reply(client, seq, answer)];
            out.extend(self.release(now, held));
            return out;
        }
        let run = match self.begin_change(now, (group, version), chunk) {
            Ok(run) => run,
            Err(refused) => {
                self.fence.finished(u64::from(client), seq, None);
                let mut out = vec![reply(client, seq, Answer::Refused(refusal(refused)))];
                out.extend(self.release(now, held));
                return out;
            }
        };
        self.served.push((now, group, version));
        self.store.apply(group, &change);
        self.note(key, &change);
        let waiter = Waiter {
            client: Some((client, seq)),
            held: Some(held),
            ..Waiter::default()
        };
        self.forward_change(now, (group, run), change, waiter)
    }

    /// Begins a change of `chunk` of `group` as its primary in `version`: admitted again,
    /// numbered among this server's forwards.
    fn begin_change(
        &self,
        now: Time,
        (group, version): (GroupId, Version),
        chunk: ChunkId,
    ) -> Result<PrimaryChange, Refused> {
        PrimaryChange::begin(
            &self.membership,
            &self.forwards,
            now,
            self.id,
            (group, version),
            vec![chunk],
            true,
        )
    }

    /// Forwards `change` of `group`, begun as `run` (and applied here), to every present
    /// member; an absent one gets its chunk in its record of what it misses. `waiter` says
    /// who waits for it to end.
    fn forward_change(
        &mut self,
        now: Time,
        (group, run): (GroupId, PrimaryChange),
        change: Change,
        waiter: Waiter,
    ) -> Vec<Send<Bytes>> {
        for ((missed_group, _), missed) in &mut self.store.missed {
            if *missed_group == group {
                missed.insert(change.chunk());
            }
        }
        // Its tag's marks are set as each copy leaves.
        let number = run.number().expect("numbered");
        let tag = ChangeId {
            client: self.forwarder,
            number,
            settled_below: number,
            abandoned: Vec::new(),
        };
        self.start(
            now,
            Pending {
                work: Work::Change { tag, change },
                run: Run::Client(run),
                waiter,
            },
        )
        .1
    }

    fn client_sync(
        &mut self,
        now: Time,
        client: ClientId,
        (group, version): (GroupId, Version),
        since: u64,
        seq: u64,
    ) -> Vec<Send<Bytes>> {
        // Not a change: not numbered, nothing for the fence to keep.
        let begun = PrimaryChange::begin(
            &self.membership,
            &self.forwards,
            now,
            self.id,
            (group, version),
            Vec::new(),
            false,
        );
        let run = match begun {
            Ok(run) => run,
            Err(refused) => return vec![reply(client, seq, Answer::Refused(refusal(refused)))],
        };
        self.served.push((now, group, version));
        if since < self.loss_epoch(group) {
            return vec![reply(client, seq, Answer::Lost)];
        }
        self.store.sync(group);
        let pending = Pending {
            work: Work::Sync,
            run: Run::Client(run),
            waiter: Waiter {
                client: Some((client, seq)),
                ..Waiter::default()
            },
        };
        self.start(now, pending).1
    }

    /// Starts forward `pending`, sending its first copies; it ends at once when no member
    /// waits for it. Returns the forward's operation id while it waits, beside what to send.
    fn start(&mut self, now: Time, pending: Pending) -> (Option<u64>, Vec<Send<Bytes>>) {
        let op = self.op_id();
        self.pending.insert(op, pending);
        let mut out = self.send_due(now, op);
        out.extend(self.settle_all(now));
        (self.pending.contains_key(&op).then_some(op), out)
    }

    /// A member took forward `op`.
    fn acknowledged(
        &mut self,
        group: GroupId,
        op: u64,
        member: ServerId,
        now: Time,
    ) -> Vec<Send<Bytes>> {
        let Some(pending) = self.pending.get_mut(&op) else {
            return Vec::new();
        };
        if pending.group() != group {
            return Vec::new();
        }
        pending
            .delivery_mut()
            .acknowledged(&mut self.membership, member);
        let mut out = self.settle_all(now);
        out.extend(self.advance_resyncs(now));
        out
    }

    /// A member refused forward `op` (it knows another version): the next copy waits for the
    /// retry interval.
    fn refused_by_member(&mut self, now: Time, op: u64, member: ServerId) {
        let pace = self.pace();
        if let Some(pending) = self.pending.get_mut(&op) {
            pending.delivery_mut().failed(member, now, pace);
        }
    }

    /// Takes a newer map, as the decisions say: forwards stop waiting for members that left
    /// (their records of what they miss started), a deposed primary gives its forwards up,
    /// resyncs of versions that ended stop and new ones start.
    fn adopt(&mut self, sent_at: Time, map: GroupMap, now: Time) -> Vec<Send<Bytes>> {
        let id = self.id;
        let adopted = self.membership.adopt(
            sent_at,
            self.timing.lease_ms,
            map.groups.into_values().map(|g| (g, ())).collect(),
            |member| member == id,
        );
        let mut out = Vec::new();
        for group in &adopted.drop_missed {
            self.store.missed.retain(|(g, _), _| g != group);
        }
        for (group, member, owed) in &adopted.record_missed {
            // It misses what it had not acknowledged or was given up, and every later write.
            let unacknowledged = self
                .pending
                .values()
                .filter(|p| p.group() == *group && p.delivery().waits_for(*member))
                .filter_map(|p| match &p.work {
                    Work::Change { change, .. } => Some(change.chunk()),
                    _ => None,
                })
                .chain(owed.iter().copied())
                .collect();
            self.store
                .missed
                .entry((*group, *member))
                .or_insert(unacknowledged);
        }
        for (_, group) in &adopted.taken {
            if is_home(group.id) {
                out.extend(self.adopt_home(now, group));
                continue;
            }
            // Another version: another primary may have run rounds of this group's moves
            // meanwhile, whose whole copies cleared what this one's watches count on.
            self.watches.forget_where(|(g, _)| *g == group.id);
            let ended: Vec<ResyncStart> = self
                .resyncs
                .values()
                .filter(|r| r.start.group == group.id && r.start.version != group.version)
                .map(|r| r.start)
                .collect();
            for start in ended {
                out.extend(self.stop_resync(now, start));
            }
            // A deposed primary gives its forwards up (their clients route again); one still
            // primary stops waiting for members that left.
            for pending in self.pending.values_mut() {
                if pending.group() == group.id {
                    pending.delivery_mut().revisit(&mut self.membership, now);
                }
            }
        }
        out.extend(self.settle_all(now));
        for start in adopted.starts {
            if is_home(start.group) {
                out.extend(self.start_page_resync(now, start));
                continue;
            }
            let key = (start.group, start.member);
            let plan = match self.store.missed.get(&key) {
                Some(chunks) if !start.full => ResyncPlan::missed(chunks.iter().copied()),
                _ => {
                    // A record of what it missed does not cover a full copy.
                    self.store.missed.remove(&key);
                    ResyncPlan::full()
                }
            };
            let resync = Resync {
                start,
                plan,
                object: None,
                in_flight: None,
            };
            self.resync_counts.started += 1;
            if let Some(replaced) = self.resyncs.insert(key, resync) {
                self.resync_counts.stopped += 1;
                if let Some(op) = replaced.in_flight {
                    out.extend(self.end_pending(now, op));
                }
                if let Some(held) = replaced.object {
                    out.extend(self.release(now, held));
                }
            }
        }
        out.extend(self.settle_all(now));
        out.extend(self.advance_resyncs(now));
        out
    }
}

/// Forward `op` to `member` under `version`.
fn forward(op: u64, pending: &Pending, version: Version, member: ServerId) -> Send<Bytes> {
    let group = pending.group();
    let msg = match &pending.work {
        Work::Change { tag, change } => Msg::Forward {
            group,
            version,
            op,
            tag: tag.clone(),
            change: change.clone(),
        },
        Work::Sync => Msg::SyncReplica { group, version, op },
        Work::SyncChunk(chunk) => Msg::SyncChunk {
            group,
            version,
            op,
            chunk: *chunk,
        },
        Work::List { after } => Msg::ListChunks {
            group,
            version,
            op,
            after: *after,
        },
    };
    Send {
        to: Node::Server(member),
        msg,
    }
}

/// A refusal as the simulated wire carries it.
fn refusal(refused: Refused) -> Refusal {
    match refused {
        Refused::UnknownGroup | Refused::WrongVersion { .. } | Refused::NotPresent => {
            Refusal::WrongVersion
        }
        Refused::NotPrimary { .. } => Refusal::NotPrimary,
        Refused::NoLease => Refusal::NoLease,
    }
}

fn reply(client: ClientId, seq: u64, answer: Answer<Bytes>) -> Send<Bytes> {
    Send {
        to: Node::Client(client),
        msg: Msg::Reply { seq, answer },
    }
}

#[cfg(test)]
mod tests;
