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

use crate::fence::{Admission, Fence, FenceOf, ForwardFences, Tag};
use crate::membership::{Membership, Refused, ResyncStart};
use crate::numbers::Numbers;
use crate::ranges::RangeTable;
use crate::resync::{CopyStep, CopySteps, ResyncNumbering, ResyncPlan, ResyncStep};
use crate::{
    Answer, Bytes, Change, ChangeId, ChunkId, ClientId, GroupId, GroupMap, Msg, Node, Refusal,
    Send, ServerId, Time, Timing, Version, PLAIN,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

mod homes;
pub use homes::{home_region, is_home, REGION};

/// A server's data: what the page cache holds (`volatile`) and what reached the disk
/// (`durable`). A crash keeps only `durable`. The records of what absent members missed are
/// written durably before the writes they cover are acknowledged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Store {
    /// Every chunk as reads see it.
    pub volatile: BTreeMap<(GroupId, ChunkId), Bytes>,
    /// Every chunk as it is on disk.
    pub durable: BTreeMap<(GroupId, ChunkId), Bytes>,
    /// The chunks each absent member misses, per (group, member); durable.
    pub missed: BTreeMap<(GroupId, ServerId), BTreeSet<ChunkId>>,
}

impl Store {
    /// A crash: what was not synced is gone.
    pub fn crash(&mut self) {
        self.volatile = self.durable.clone();
    }

    fn sync(&mut self, group: GroupId) {
        self.durable.retain(|(g, _), _| *g != group);
        for (key, data) in self.volatile.range((group, 0)..=(group, ChunkId::MAX)) {
            self.durable.insert(*key, data.clone());
        }
    }

    fn sync_chunk(&mut self, key: (GroupId, ChunkId)) {
        match self.volatile.get(&key) {
            Some(data) => self.durable.insert(key, data.clone()),
            None => self.durable.remove(&key),
        };
    }

    fn chunks(&self, group: GroupId) -> impl Iterator<Item = ChunkId> + '_ {
        self.volatile
            .range((group, 0)..=(group, ChunkId::MAX))
            .map(|((_, chunk), _)| *chunk)
    }
}

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

/// A member a forward waits for.
#[derive(Clone, Copy, Debug)]
struct Waiting {
    /// When it was last sent.
    sent: Time,
    /// The version it was last sent with, and since when sends under that version failed.
    version: Version,
    since: Time,
}

impl Waiting {
    /// Notes in `waiting` that a send to `member` under `version` left at `now`.
    fn sent(
        waiting: &mut BTreeMap<ServerId, Waiting>,
        member: ServerId,
        now: Time,
        version: Version,
    ) {
        let waiting = waiting.entry(member).or_insert(Waiting {
            sent: now,
            version,
            since: now,
        });
        if waiting.version != version {
            // A new version starts the member's time over.
            waiting.version = version;
            waiting.since = now;
        }
        waiting.sent = now;
    }
}

/// A forward waiting for members' acknowledgements.
#[derive(Clone, Debug)]
struct Pending {
    group: GroupId,
    work: Work,
    waiting: BTreeMap<ServerId, Waiting>,
    /// The client to answer when every member has it, with the answer.
    client: Option<(ClientId, u64, Answer<Bytes>)>,
    /// The chunk range this forward holds, released when it ends.
    held: Option<Held>,
    /// The resync this is a step of: sent with the resync's version only, and given up (the
    /// resync stops) when the member does not take it within the member timeout.
    resync: Option<ResyncStart>,
    /// The number of a client's change among this server's forwards.
    forward: Option<u64>,
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
    /// Only what the member missed (not a full copy).
    incremental: bool,
    /// A step waiting for its chunk's range.
    blocked: Option<ResyncStep>,
    /// The chunk being brought over, held, and the forwards left for it.
    object: Option<(Held, VecDeque<Step>)>,
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

    /// Heartbeats, retries of forwards, and resync progress.
    pub fn tick(&mut self, now: Time) -> Vec<Send<Bytes>> {
        let mut out = Vec::new();
        let timeout = self.timing.member_timeout_ms;
        // Members a change has not reached for the member timeout; resync steps the member
        // has not taken for as long stop their resync.
        for op in self.pending.keys().copied().collect::<Vec<_>>() {
            let pending = &self.pending[&op];
            let late: Vec<(ServerId, Waiting)> = pending
                .waiting
                .iter()
                .filter(|(_, w)| now.saturating_sub(w.since) >= timeout)
                .map(|(member, w)| (*member, *w))
                .collect();
            if late.is_empty() {
                continue;
            }
            match pending.resync {
                Some(start) => {
                    out.extend(self.end_pending(now, op));
                    out.extend(self.stop_resync(now, start));
                }
                None => {
                    let group = pending.group;
                    for (member, waiting) in late {
                        self.membership.delivery_failing(
                            group,
                            member,
                            waiting.version,
                            waiting.since,
                        );
                    }
                }
            }
        }
        if now >= self.next_heartbeat {
            self.next_heartbeat = now + self.timing.heartbeat_ms;
            out.push(Send {
                to: Node::Mgmt,
                msg: Msg::Heartbeat {
                    boot: self.boot,
                    unsynced_boot: self.unsynced_boot,
                    sent_at: now,
                    resynced: self.membership.resynced(),
                    unreachable: self.membership.unreachable(now, timeout),
                },
            });
        }
        let retry = self.timing.retry_ms;
        for op in self.pending.keys().copied().collect::<Vec<_>>() {
            let due: Vec<ServerId> = self.pending.get(&op).map_or(Vec::new(), |p| {
                p.waiting
                    .iter()
                    .filter(|(_, w)| now.saturating_sub(w.sent) >= retry)
                    .map(|(member, _)| *member)
                    .collect()
            });
            for member in due {
                out.extend(self.send_forward(now, op, member));
            }
        }
        out.extend(self.complete_finished(now));
        out.extend(self.advance_resyncs(now));
        out.extend(self.tick_homes(now));
        out
    }

    /// Sends forward `op` to `member` with the version the decisions give; a member that left
    /// stops being waited for; a forward this server may no longer send is given up (its
    /// client told to route again, a resync stopped).
    fn send_forward(&mut self, now: Time, op: u64, member: ServerId) -> Vec<Send<Bytes>> {
        let Some(pending) = self.pending.get(&op) else {
            return Vec::new();
        };
        match self.send_version(now, pending.group, member, pending.resync) {
            Ok(Some(version)) => {
                let pending = self.pending.get_mut(&op).expect("looked up above");
                Waiting::sent(&mut pending.waiting, member, now, version);
                if let (Some(number), Work::Change { tag, .. }) =
                    (pending.forward, &mut pending.work)
                {
                    // What this server settled or gave up on is looked at again for every copy.
                    let marks = self.forwards.marks(number);
                    tag.settled_below = marks.settled_below;
                    tag.abandoned = marks.abandoned;
                }
                vec![forward(op, pending, version, member)]
            }
            Ok(None) => {
                let pending = self.pending.get_mut(&op).expect("looked up above");
                pending.waiting.remove(&member);
                Vec::new()
            }
            Err(refused) => {
                let pending = &self.pending[&op];
                if let Some(start) = pending.resync {
                    let mut out = self.end_pending(now, op);
                    out.extend(self.stop_resync(now, start));
                    return out;
                }
                if let Work::Change { change, .. } = &pending.work {
                    // Applied here, given up before these members took it.
                    let chunk = change.chunk();
                    for member in pending.waiting.keys() {
                        self.membership.undelivered(pending.group, *member, [chunk]);
                    }
                }
                if let Some(pending) = self.pending.get_mut(&op) {
                    if let Some((_, _, answer)) = &mut pending.client {
                        *answer = Answer::Refused(refusal(refused));
                    }
                }
                self.end_pending(now, op)
            }
        }
    }

    /// Ends forward `op`: its client gets its answer (a refusal is not kept by the fence, so
    /// a retry runs again), its range is released and writes waiting for it go on.
    fn end_pending(&mut self, now: Time, op: u64) -> Vec<Send<Bytes>> {
        let Some(pending) = self.pending.remove(&op) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if let Some(number) = pending.forward {
            let given_up = matches!(pending.client, Some((_, _, Answer::Refused(_))));
            self.forwards.end(number, given_up);
        }
        if let Some((client, seq, answer)) = pending.client {
            let kept = (!matches!(answer, Answer::Refused(_))).then(|| answer.clone());
            self.fence.finished(u64::from(client), seq, kept);
            out.push(reply(client, seq, answer));
        }
        if let Some(held) = pending.held {
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
                Node::Client(client),
                Msg::Change {
                    group,
                    version,
                    change,
                    seq,
                },
            ) if is_home(group) => self.home_change(now, client, (group, version), change, seq),
            (
                Node::Client(client),
                Msg::Sync {
                    group,
                    version,
                    seq,
                    ..
                },
            ) if is_home(group) => self.home_sync(now, client, (group, version), seq),
            (
                Node::Client(client),
                Msg::Read {
                    group,
                    version,
                    chunk,
                    seq,
                },
            ) if is_home(group) => self.home_read(now, client, (group, version), chunk, seq),
            (Node::Server(primary), msg @ Msg::PageApply { .. }) => self.page_apply(primary, msg),
            (Node::Server(member), Msg::MemberAck { group, op, .. }) if is_home(group) => {
                self.page_acknowledged(now, member, group, op)
            }
            (
                Node::Client(client),
                Msg::Change {
                    group, change, seq, ..
                },
            ) if group >= PLAIN => self.plain_change(now, client, group, change, seq),
            (
                Node::Client(client),
                Msg::Sync {
                    group, since, seq, ..
                },
            ) if group >= PLAIN => {
                let answer = if since < self.unsynced_boot {
                    Answer::Lost
                } else {
                    self.store.sync(group);
                    Answer::Done
                };
                vec![reply(client, seq, answer)]
            }
            (
                Node::Client(client),
                Msg::Read {
                    group, chunk, seq, ..
                },
            ) if group >= PLAIN => {
                let answer = Answer::Data {
                    data: self.store.volatile.get(&(group, chunk)).cloned(),
                    epoch: self.unsynced_boot,
                };
                vec![reply(client, seq, answer)]
            }
            (
                Node::Client(client),
                Msg::Change {
                    group,
                    version,
                    change,
                    seq,
                },
            ) => self.client_change(now, client, (group, version), change, seq),
            (
                Node::Client(client),
                Msg::Sync {
                    group,
                    version,
                    since,
                    seq,
                },
            ) => self.client_sync(now, client, (group, version), since, seq),
            (
                Node::Client(client),
                Msg::Read {
                    group,
                    version,
                    chunk,
                    seq,
                },
            ) => {
                let answer = match self.admit(now, group, version) {
                    Some(refusal) => Answer::Refused(refusal),
                    None => Answer::Data {
                        data: self.store.volatile.get(&(group, chunk)).cloned(),
                        epoch: self.loss_epoch(group),
                    },
                };
                vec![reply(client, seq, answer)]
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
            ) => {
                // Pages of a few, so that the listing is paged as a storage server's is.
                let chunks: Vec<ChunkId> = self
                    .store
                    .chunks(group)
                    .filter(|chunk| *chunk > after)
                    .take(LIST_PAGE + 1)
                    .collect();
                let end = chunks.len() <= LIST_PAGE;
                vec![Send {
                    to: Node::Server(primary),
                    msg: Msg::Chunks {
                        group,
                        op,
                        chunks: chunks.into_iter().take(LIST_PAGE).collect(),
                        end,
                    },
                }]
            }
            (
                Node::Server(member),
                Msg::Chunks {
                    group,
                    op,
                    chunks,
                    end,
                },
            ) => {
                let listed = self.pending.get(&op).and_then(|p| p.resync);
                if let Some(start) = listed {
                    if let Some(resync) = self.resyncs.get_mut(&(start.group, start.member)) {
                        if resync.in_flight == Some(op) {
                            resync.plan.listed(chunks, end);
                        }
                    }
                }
                self.acknowledged(group, op, member, now)
            }
            (Node::Server(member), Msg::MemberAck { group, op, .. }) => {
                self.acknowledged(group, op, member, now)
            }
            // A member that knows another version refused: the forward is sent again on a
            // later tick, once one of the two has the current map.
            _ => Vec::new(),
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
        // The wait may have outlived this server's primacy or its lease: admitted again, or a
        // change with no member to reach would be answered from a deposed primary alone.
        if let Some(refusal) = self.admit(now, group, version) {
            self.fence.finished(u64::from(client), seq, None);
            let mut out = vec![reply(client, seq, Answer::Refused(refusal))];
            out.extend(self.release(now, held));
            return out;
        }
        change.apply_to(&mut self.store.volatile, group);
        for ((missed_group, _), missed) in &mut self.store.missed {
            if *missed_group == group {
                missed.insert(chunk);
            }
        }
        let answer = Answer::Written {
            epoch: self.loss_epoch(group),
        };
        let members = self.membership.present_secondaries(group);
        // Numbered among this server's forwards, not by its client: a change run again here
        // (its forwarding given up, its client sending it again) is a new forward that each
        // member applies again, not a copy of the first run it answered already.
        let (number, _) = self.forwards.draw();
        let tag = ChangeId {
            client: self.forwarder,
            number,
            settled_below: number,
            abandoned: Vec::new(),
        };
        self.start(
            now,
            Pending {
                group,
                work: Work::Change { tag, change },
                waiting: BTreeMap::new(),
                client: Some((client, seq, answer)),
                held: Some(held),
                resync: None,
                forward: Some(number),
            },
            members,
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
        if let Some(refusal) = self.admit(now, group, version) {
            return vec![reply(client, seq, Answer::Refused(refusal))];
        }
        if since < self.loss_epoch(group) {
            return vec![reply(client, seq, Answer::Lost)];
        }
        self.store.sync(group);
        let members = self.membership.present_secondaries(group);
        // Not a change: nothing for the fence to keep.
        let pending = Pending {
            group,
            work: Work::Sync,
            waiting: BTreeMap::new(),
            client: None,
            held: None,
            resync: None,
            forward: None,
        };
        let (op, mut out) = self.start(now, pending, members);
        match op.and_then(|op| self.pending.get_mut(&op)) {
            Some(pending) => pending.client = Some((client, seq, Answer::Done)),
            None => out.push(reply(client, seq, Answer::Done)),
        }
        out
    }

    /// Sends `pending` to `members`; ends it at once if there is none. Returns the forward's
    /// operation id while it waits, beside what to send.
    fn start(
        &mut self,
        now: Time,
        pending: Pending,
        members: Vec<ServerId>,
    ) -> (Option<u64>, Vec<Send<Bytes>>) {
        let op = self.op_id();
        self.pending.insert(op, pending);
        if members.is_empty() {
            return (None, self.end_pending(now, op));
        }
        let mut out = Vec::new();
        for member in members {
            out.extend(self.send_forward(now, op, member));
        }
        out.extend(self.complete_finished(now));
        (self.pending.contains_key(&op).then_some(op), out)
    }

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
        if pending.group != group || pending.waiting.remove(&member).is_none() {
            return Vec::new();
        }
        if pending.resync.is_none() {
            self.membership.delivered(group, member);
        }
        let mut out = self.complete_finished(now);
        out.extend(self.advance_resyncs(now));
        out
    }

    /// Ends the forwards every member has acknowledged, and moves their resyncs on.
    fn complete_finished(&mut self, now: Time) -> Vec<Send<Bytes>> {
        let finished: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.waiting.is_empty())
            .map(|(op, _)| *op)
            .collect();
        let mut out = Vec::new();
        for op in finished {
            let resync = self.pending.get(&op).and_then(|p| p.resync);
            out.extend(self.end_pending(now, op));
            let Some(start) = resync else {
                continue;
            };
            if let Some(resync) = self.resyncs.get_mut(&(start.group, start.member)) {
                if resync.in_flight == Some(op) {
                    resync.in_flight = None;
                }
            }
        }
        out
    }

    /// A resync stops (its version ended, or the member does not take its steps); it starts
    /// again at the next map while the member needs it.
    fn stop_resync(&mut self, now: Time, start: ResyncStart) -> Vec<Send<Bytes>> {
        let key = (start.group, start.member);
        let mut out = Vec::new();
        if self.resyncs.get(&key).is_some_and(|r| r.start == start) {
            self.resync_counts.stopped += 1;
            let resync = self.resyncs.remove(&key).expect("looked up above");
            if let Some(op) = resync.in_flight {
                out.extend(self.end_pending(now, op));
            }
            if let Some((held, _)) = resync.object {
                out.extend(self.release(now, held));
            }
        }
        self.membership.resync_ended(start, false);
        out
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
                .filter(|p| p.group == *group && p.waiting.contains_key(member))
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
            let ended: Vec<ResyncStart> = self
                .resyncs
                .values()
                .filter(|r| r.start.group == group.id && r.start.version != group.version)
                .map(|r| r.start)
                .collect();
            for start in ended {
                out.extend(self.stop_resync(now, start));
            }
            let mine: Vec<u64> = self
                .pending
                .iter()
                .filter(|(_, p)| p.group == group.id)
                .map(|(op, _)| *op)
                .collect();
            if group.primary != id {
                // Given up: their clients route again.
                for op in mine {
                    if let Some(Pending {
                        client: Some((_, _, answer)),
                        ..
                    }) = self.pending.get_mut(&op)
                    {
                        *answer = Answer::Refused(Refusal::NotPrimary);
                    }
                    out.extend(self.end_pending(now, op));
                }
            } else {
                let present: BTreeSet<ServerId> =
                    group.present_secondaries().map(|m| m.server).collect();
                for op in mine {
                    if let Some(pending) = self.pending.get_mut(&op) {
                        pending.waiting.retain(|member, _| present.contains(member));
                    }
                }
            }
        }
        for start in adopted.starts {
            if is_home(start.group) {
                out.extend(self.start_page_resync(now, start));
                continue;
            }
            let key = (start.group, start.member);
            let (incremental, plan) = match self.store.missed.get(&key) {
                Some(chunks) if !start.full => (true, ResyncPlan::missed(chunks.iter().copied())),
                _ => {
                    // A record of what it missed does not cover a full copy.
                    self.store.missed.remove(&key);
                    (false, ResyncPlan::full())
                }
            };
            let resync = Resync {
                start,
                incremental,
                plan,
                blocked: None,
                object: None,
                in_flight: None,
            };
            self.resync_counts.started += 1;
            if let Some(replaced) = self.resyncs.insert(key, resync) {
                self.resync_counts.stopped += 1;
                if let Some(op) = replaced.in_flight {
                    out.extend(self.end_pending(now, op));
                }
                if let Some((held, _)) = replaced.object {
                    out.extend(self.release(now, held));
                }
            }
        }
        out.extend(self.complete_finished(now));
        out.extend(self.advance_resyncs(now));
        out
    }

    /// Moves each resync on as far as it goes without waiting: the next forward of the
    /// object under way; else the plan's next step, its chunk's range taken first (a step
    /// whose range is held waits); a resync whose steps all landed is reported finished.
    fn advance_resyncs(&mut self, now: Time) -> Vec<Send<Bytes>> {
        let mut out = Vec::new();
        for key in self.resyncs.keys().copied().collect::<Vec<_>>() {
            while let Some(resync) = self.resyncs.get_mut(&key) {
                if resync.in_flight.is_some() {
                    break;
                }
                let start = resync.start;
                if let Some((held, steps)) = &mut resync.object {
                    let Some(step) = steps.pop_front() else {
                        let held = *held;
                        resync.object = None;
                        out.extend(self.release(now, held));
                        continue;
                    };
                    let work = match step {
                        Step::Change(change) => {
                            let numbers = self.numbering.of(
                                (start.group, start.version, start.member),
                                || {
                                    self.next_resync_client += 1;
                                    self.next_resync_client
                                },
                            );
                            let number = numbers.draw();
                            let tag = ChangeId {
                                client: numbers.client,
                                number,
                                settled_below: number,
                                abandoned: Vec::new(),
                            };
                            Work::Change { tag, change }
                        }
                        Step::Sync(chunk) => Work::SyncChunk(chunk),
                    };
                    out.extend(self.send_step(now, start, work));
                    continue;
                }
                let step = match resync.blocked.take() {
                    Some(step) => step,
                    None => resync.plan.step(),
                };
                match step {
                    ResyncStep::Object(chunk) | ResyncStep::RemoveIfGone(chunk) => {
                        let object = (start.group, chunk);
                        let Ok(id) = self.ranges.try_lock(&object, 0..u64::MAX, || ()) else {
                            resync.blocked = Some(step);
                            break;
                        };
                        let held = Held { key: object, id };
                        let steps = match (step, self.store.volatile.get(&object)) {
                            (ResyncStep::RemoveIfGone(_), Some(_)) => VecDeque::new(),
                            (_, Some(data)) => CopySteps::new(data.len() as u64, COPY_PIECE)
                                .map(|copy| match copy {
                                    CopyStep::Remove => Step::Change(Change::Remove { chunk }),
                                    CopyStep::Write { offset, len } => {
                                        let piece = offset as usize..(offset + len) as usize;
                                        Step::Change(Change::Write {
                                            chunk,
                                            offset,
                                            data: data[piece].to_vec(),
                                        })
                                    }
                                    CopyStep::Sync => Step::Sync(chunk),
                                })
                                .collect(),
                            (_, None) => VecDeque::from([Step::Change(Change::Remove { chunk })]),
                        };
                        resync.object = Some((held, steps));
                    }
                    ResyncStep::ListMember { after } => {
                        out.extend(self.send_step(now, start, Work::List { after }));
                    }
                    ResyncStep::ListPrimary => {
                        resync.plan.primary_listed(self.store.chunks(start.group));
                    }
                    ResyncStep::SyncMember => {
                        out.extend(self.send_step(now, start, Work::Sync));
                    }
                    ResyncStep::Done => {
                        self.resync_counts.finished += 1;
                        let resync = self.resyncs.remove(&key).expect("looked up above");
                        if resync.incremental {
                            self.store.missed.remove(&key);
                        }
                        self.membership.resync_ended(start, true);
                        break;
                    }
                }
            }
        }
        out
    }

    /// Sends one step of `start`'s resync to its member, as the resync's forward under way.
    fn send_step(&mut self, now: Time, start: ResyncStart, work: Work) -> Vec<Send<Bytes>> {
        let pending = Pending {
            group: start.group,
            work,
            waiting: BTreeMap::new(),
            client: None,
            held: None,
            resync: Some(start),
            forward: None,
        };
        let (op, out) = self.start(now, pending, vec![start.member]);
        if let Some(resync) = self.resyncs.get_mut(&(start.group, start.member)) {
            if resync.start == start {
                // A step that ended at once (the member left) leaves nothing to wait for.
                resync.in_flight = op;
            }
        }
        out
    }

    /// The version a send to `member` of `group` carries now: a resync step's, or a change's
    /// (`None`: the member left).
    fn send_version(
        &self,
        now: Time,
        group: GroupId,
        member: ServerId,
        resync: Option<ResyncStart>,
    ) -> Result<Option<Version>, Refused> {
        match resync {
            Some(start) => self
                .membership
                .resync_version(now, self.id, start)
                .map(Some),
            None => self
                .membership
                .version_to_member(now, self.id, group, member),
        }
    }

    /// Admits send `op` of `primary` to this member of `group` in `version`, or answers that
    /// this member knows another version.
    fn admit_from_primary(
        &self,
        primary: ServerId,
        group: GroupId,
        version: Version,
        op: u64,
    ) -> Result<(), Vec<Send<Bytes>>> {
        if self
            .membership
            .admit_forward(self.id, group, version)
            .is_ok()
        {
            return Ok(());
        }
        let known = self
            .membership
            .group(group)
            .map_or(Version(0), |(g, _)| g.version);
        Err(vec![Send {
            to: Node::Server(primary),
            msg: Msg::MemberRefused {
                group,
                version: known,
                op,
            },
        }])
    }

    /// A forward from this group's primary: admitted by version, a change through the fence
    /// of the group's version, so a late copy never lands after a newer change.
    fn as_member(&mut self, now: Time, primary: ServerId, msg: Msg<Bytes>) -> Vec<Send<Bytes>> {
        let (group, version, op) = match &msg {
            Msg::Forward {
                group, version, op, ..
            }
            | Msg::SyncReplica { group, version, op }
            | Msg::SyncChunk {
                group, version, op, ..
            } => (*group, *version, *op),
            _ => return Vec::new(),
        };
        if let Err(refused) = self.admit_from_primary(primary, group, version, op) {
            return refused;
        }
        match msg {
            Msg::Forward { tag, change, .. } => {
                let mut alone = Fence::default();
                let fence = match self.forward_fences.of(group, version, Fence::default) {
                    FenceOf::Current(fence) => fence,
                    FenceOf::Older => &mut alone,
                };
                match fence.admit(tag.tag(), now) {
                    Admission::Run => {
                        fence.finished(tag.client, tag.number, Some(()));
                        change.apply_to(&mut self.store.volatile, group);
                    }
                    Admission::Answered(()) => {}
                    // Dropped, as a storage server answers `Superseded`: the primary tries
                    // again until it gives the member up.
                    Admission::Late | Admission::Wait => return Vec::new(),
                }
            }
            Msg::SyncReplica { .. } => self.store.sync(group),
            Msg::SyncChunk { chunk, .. } => self.store.sync_chunk((group, chunk)),
            _ => {}
        }
        vec![Send {
            to: Node::Server(primary),
            msg: Msg::MemberAck { group, version, op },
        }]
    }
}

/// A step of bringing one object over, before its tag is drawn.
#[derive(Clone, Debug)]
enum Step {
    Change(Change),
    Sync(ChunkId),
}

/// Chunks per page of a member's listing.
const LIST_PAGE: usize = 4;

/// Bytes per write of a resync's copy of a chunk, so that a copy takes several.
const COPY_PIECE: u64 = 8;

/// Forward `op` to `member` under `version`.
fn forward(op: u64, pending: &Pending, version: Version, member: ServerId) -> Send<Bytes> {
    let group = pending.group;
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
mod tests {
    use super::*;
    use crate::testing::{pair, TIMING};
    use crate::MemberState;

    fn map(version: Version) -> GroupMap {
        GroupMap {
            groups: BTreeMap::from([(GroupId(1), pair(version, MemberState::Good))]),
        }
    }

    fn write(data: &[u8]) -> Change {
        Change::Write {
            chunk: 7,
            offset: 0,
            data: data.to_vec(),
        }
    }

    /// Delivers to `member` every forward in `out`, returning what it answered.
    fn to_member(member: &mut Server, now: Time, out: Vec<Send<Bytes>>) -> Vec<Send<Bytes>> {
        out.into_iter()
            .filter(|send| send.to == Node::Server(ServerId(2)))
            .flat_map(|send| member.handle(now, Node::Server(ServerId(1)), send.msg))
            .collect()
    }

    // Goal: a change whose forwarding its primary gave up (its lease ran out before the member
    // answered), sent again by its client after another client changed the same bytes, ends
    // the same on both copies: the member applies the primary's new run of it instead of
    // answering it from its fence as a copy of the first run.
    #[test]
    fn a_change_run_again_after_its_forward_was_given_up_reaches_the_member_again() {
        let mut primary = Server::new(ServerId(1), TIMING, 1, 1, Store::default(), 0);
        let mut member = Server::new(ServerId(2), TIMING, 1, 1, Store::default(), 0);
        let ack = |sent_at| Msg::HeartbeatAck {
            sent_at,
            map: map(Version(1)),
        };
        primary.handle(0, Node::Mgmt, ack(0));
        member.handle(0, Node::Mgmt, ack(0));
        let change = |group_change: Change, seq| Msg::Change {
            group: GroupId(1),
            version: Version(1),
            change: group_change,
            seq,
        };
        // Client 10's change reaches the member, whose answer is lost.
        let out = primary.handle(10, Node::Client(10), change(write(b"first"), 5));
        assert!(
            !to_member(&mut member, 20, out).is_empty(),
            "the member took it"
        );
        // The primary's lease runs out before it hears from the member: the change is refused.
        let out = primary.tick(400);
        assert!(
            out.iter().any(|send| send.to == Node::Client(10)
                && matches!(
                    &send.msg,
                    Msg::Reply {
                        answer: Answer::Refused(_),
                        ..
                    }
                )),
            "the change is refused: {out:?}"
        );
        // The lease comes back in the same version; client 11 overwrites the same bytes.
        primary.handle(410, Node::Mgmt, ack(405));
        let out = primary.handle(420, Node::Client(11), change(write(b"other"), 9));
        for answer in to_member(&mut member, 425, out) {
            primary.handle(430, Node::Server(ServerId(2)), answer.msg);
        }
        // Client 10 sends its change again; it runs again at the primary.
        let out = primary.handle(440, Node::Client(10), change(write(b"first"), 5));
        for answer in to_member(&mut member, 445, out) {
            primary.handle(450, Node::Server(ServerId(2)), answer.msg);
        }
        assert_eq!(
            member.store().volatile,
            primary.store().volatile,
            "the member holds what the primary holds"
        );
    }
}
