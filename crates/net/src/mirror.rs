//! A server's side of its mirror groups, for storage targets and metadata homes alike: the
//! I/O shell around [`weft_mirror::Membership`], the machine the simulator checks, which
//! decides which version of each group holds, the lease, admission, which members a change
//! must reach and which to report unreachable, the resyncs to run and the records of missed
//! changes to keep. The shell adds the clock, the waits and retries, and resync progress.
//! What a change or a resync carries is the server's own business; the rules are the same
//! for both kinds:
//! - a request carries the group version it was routed with; a member that knows another
//!   version refuses it ([`ErrorCode::StaleRoute`]) and the sender fetches the map again;
//! - the primary serves only while its lease holds (management grants it in heartbeat
//!   answers, ending before management may promote anyone else);
//! - a change is answered only once every present member has it ([`Membership::deliver`]);
//! - a member that stops acknowledging is reported unreachable; management takes it out of
//!   the group under a new version, and the primary stops waiting for it;
//! - a member in `needs-resync` is brought up to date by the primary, which reports it
//!   resynced until management marks it good.

use crate::RpcError;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use weft_mirror::delivery::{Delivery, GivenUp, Pace, Sending};
use weft_mirror::primary::PrimaryChange;
use weft_mirror::{Group, Member, MemberState, Refused, Time};
use weft_proto::error::WireError;
use weft_proto::ids::NodeId;
use weft_proto::ids::{GroupId, GroupVersion, MemberId};
use weft_proto::messages::{
    Consistency, MirrorGroupInfo, MirrorHeartbeat, MirrorKind, MirrorMember, ResyncProgress,
};
use weft_proto::ErrorCode;

pub use weft_mirror::{Adopted, ResyncStart};

/// Pause between attempts to reach a member.
pub const MEMBER_RETRY: Duration = Duration::from_millis(100);

/// A `StaleRoute` refusal: the sender fetches the map again and routes anew.
pub fn stale(message: String) -> WireError {
    WireError::new(ErrorCode::StaleRoute, message)
}

/// A group of `kind` as management publishes it, each member on the node `node_of` gives;
/// [`decided`] turns it back.
pub fn published(
    kind: MirrorKind,
    group: &Group,
    node_of: impl Fn(MemberId) -> NodeId,
) -> MirrorGroupInfo {
    MirrorGroupInfo {
        id: group.id,
        kind,
        version: group.version,
        primary: group.primary,
        loss_epoch: group.loss_epoch,
        members: group
            .members
            .iter()
            .map(|member| MirrorMember {
                id: member.server,
                node: node_of(member.server),
                state: match member.state {
                    MemberState::Good => Consistency::Good,
                    MemberState::NeedsResync { .. } => Consistency::NeedsResync,
                    MemberState::Absent => Consistency::Bad,
                },
                full_resync: member.state == MemberState::NeedsResync { full: true },
            })
            .collect(),
    }
}

/// A published group as the decisions see it.
pub fn decided(group: &MirrorGroupInfo) -> Group {
    Group {
        id: group.id,
        version: group.version,
        primary: group.primary,
        loss_epoch: group.loss_epoch,
        members: group
            .members
            .iter()
            .map(|member| Member {
                server: member.id,
                state: match member.state {
                    Consistency::Good => MemberState::Good,
                    Consistency::NeedsResync => MemberState::NeedsResync {
                        full: member.full_resync,
                    },
                    Consistency::Bad => MemberState::Absent,
                },
            })
            .collect(),
    }
}

#[derive(Default)]
struct State {
    /// The decisions, with each group as management published it.
    decisions: weft_mirror::Membership<MirrorGroupInfo>,
    /// Progress of the resyncs running or finished, by (group, member), with their start.
    progress: HashMap<(GroupId, MemberId), (ResyncProgress, Instant)>,
}

/// Where a server keeps the writes it answered before syncing them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unsynced {
    /// In its own memory: every restart may lose them (a metadata server's unsynced store
    /// pages, a crash-test storage target's journal).
    InProcess,
    /// In the kernel (written to its files before the answer): only a restart of the host
    /// loses them.
    InKernel,
}

/// The kernel's boot id (`/proc/sys/kernel/random/boot_id`, a UUID), as a number.
fn kernel_boot() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: String = text
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(16)
        .collect();
    (hex.len() == 16).then(|| u64::from_str_radix(&hex, 16).ok())?
}

/// A server's mirror groups and lease: the decisions of [`weft_mirror::Membership`] on the
/// process's clock, and the waits and retries around them.
pub struct Membership {
    boot: u64,
    unsynced_boot: u64,
    interval: Duration,
    /// Time zero of the decisions' clock.
    epoch: Instant,
    state: Mutex<State>,
    /// The last lease management granted, in milliseconds.
    lease_ms: std::sync::atomic::AtomicU64,
    /// Wakes the heartbeat loop early: a request showed that a newer map exists, or a resync
    /// finished.
    pub wake: tokio::sync::Notify,
}

impl Membership {
    /// The membership of a server in its start `boot` (larger on every start of the node,
    /// `weft_service::identity::next_boot`, so management tells a restart from a late
    /// heartbeat of an earlier start) that sends a heartbeat every `interval` and keeps its
    /// unsynced writes as `unsynced` says.
    pub fn new(boot: u64, interval: Duration, unsynced: Unsynced) -> Membership {
        let unsynced_boot = match unsynced {
            Unsynced::InProcess => boot,
            Unsynced::InKernel => kernel_boot().unwrap_or(boot),
        };
        Membership {
            boot,
            unsynced_boot,
            interval,
            epoch: Instant::now(),
            state: Mutex::default(),
            lease_ms: std::sync::atomic::AtomicU64::new(0),
            wake: tokio::sync::Notify::new(),
        }
    }

    /// How long the next heartbeat may wait for its answer: the last lease granted (an answer
    /// later than that renews nothing), and at least [`crate::stubs::HEARTBEAT_DEADLINE`], so
    /// that a heartbeat sent over a cut rail gives way to the next over another in time.
    pub fn heartbeat_deadline(&self) -> Duration {
        Duration::from_millis(self.lease_ms.load(std::sync::atomic::Ordering::Relaxed))
            .max(crate::stubs::HEARTBEAT_DEADLINE)
    }

    /// This process's boot id.
    pub fn boot(&self) -> u64 {
        self.boot
    }

    /// The id that changes whenever the writes this server answered before syncing them may
    /// be gone: its boot id, or the host's for a server whose writes are in the kernel.
    pub fn unsynced_boot(&self) -> u64 {
        self.unsynced_boot
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("mirror state poisoned")
    }

    /// `at` on the decisions' clock.
    fn time(&self, at: Instant) -> Time {
        at.saturating_duration_since(self.epoch).as_millis() as Time
    }

    fn now(&self) -> Time {
        self.time(Instant::now())
    }

    /// A change unacknowledged this long makes its member unreachable.
    pub fn member_timeout(&self) -> Duration {
        (self.interval * 2).max(Duration::from_secs(1))
    }

    /// The group as last heard.
    pub fn group(&self, group: GroupId) -> Option<MirrorGroupInfo> {
        self.state()
            .decisions
            .group(group)
            .map(|(_, info)| info.clone())
    }

    /// Every group with a member here, as last heard.
    pub fn groups(&self) -> Vec<MirrorGroupInfo> {
        self.state()
            .decisions
            .groups()
            .map(|(_, info)| info.clone())
            .collect()
    }

    /// Whether the lease of this server's primaries holds now.
    pub fn lease_holds(&self) -> bool {
        self.state().decisions.lease_holds(self.now())
    }

    /// What the next heartbeat tells management.
    pub fn report(&self) -> MirrorHeartbeat {
        let state = self.state();
        let timeout = self.member_timeout().as_millis() as u64;
        MirrorHeartbeat {
            boot: self.boot,
            unsynced_boot: self.unsynced_boot,
            interval_ms: self.interval.as_millis() as u64,
            resynced: state.decisions.resynced(),
            unreachable: state.decisions.unreachable(self.now(), timeout),
            resyncs: state
                .progress
                .values()
                .map(|(progress, started)| ResyncProgress {
                    elapsed_ms: started.elapsed().as_millis() as u64,
                    ..*progress
                })
                .collect(),
        }
    }

    /// Takes management's answer to a heartbeat sent at `sent`: the lease, and the groups
    /// (newer versions replace older ones). `local` says which members live on this server.
    /// `records` starts and drops the records of missed changes the new versions ask for
    /// before any other thread sees them: a change that finds a member gone must find its
    /// record started, or what it wrote would be missing from it. Returns what changed: the
    /// resyncs this server must start as primary, and the records started or dropped.
    pub fn adopt(
        &self,
        sent: Instant,
        lease: Duration,
        groups: Vec<MirrorGroupInfo>,
        local: impl Fn(MemberId) -> bool,
        records: impl FnOnce(&Adopted),
    ) -> Adopted {
        let sent_at = self.time(sent);
        self.lease_ms.store(
            lease.as_millis() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        let mut state = self.state();
        let adopted = state.decisions.adopt(
            sent_at,
            lease.as_millis() as u64,
            groups
                .into_iter()
                .map(|info| (decided(&info), info))
                .collect(),
            local,
        );
        for (_, group) in &adopted.taken {
            tracing::info!(
                group = %group.id,
                kind = state
                    .decisions
                    .group(group.id)
                    .map_or("", |(_, info)| <&str>::from(info.kind)),
                version = %group.version,
                primary = %group.primary,
                "mirror group version adopted"
            );
        }
        let State {
            decisions,
            progress,
        } = &mut *state;
        // Progress is kept while the member still needs it or the resync's version holds.
        progress.retain(|(group, member), (p, _)| {
            decisions.group(*group).is_some_and(|(g, _)| {
                g.member(*member)
                    .is_some_and(|m| matches!(m.state, MemberState::NeedsResync { .. }))
                    && (g.version == p.version || !p.done)
            })
        });
        records(&adopted);
        adopted
    }

    /// Records how a resync ended: a finished one is reported until management marks the
    /// member good; a stopped one starts again at the next map while the member needs it.
    pub fn resync_ended(&self, start: ResyncStart, outcome: &Result<(), WireError>) {
        let ResyncStart {
            group,
            version,
            member,
            ..
        } = start;
        let mut state = self.state();
        state.decisions.resync_ended(start, outcome.is_ok());
        match outcome {
            Ok(()) => {
                tracing::info!(%group, %version, %member, "member resynced");
                if let Some((progress, _)) = state.progress.get_mut(&(group, member)) {
                    progress.done = true;
                }
                drop(state);
                self.wake.notify_one();
            }
            Err(error) => {
                tracing::info!(%group, %version, %member, %error, "resync stopped; it starts again at the next map while the member needs it");
            }
        }
    }

    /// Starts the progress record of a resync of `total` objects.
    pub fn resync_started(&self, start: ResyncStart, total: u64, full: bool) {
        let mut state = self.state();
        let kind = state
            .decisions
            .group(start.group)
            .map_or(weft_proto::messages::MirrorKind::Storage, |(_, g)| g.kind);
        state.progress.insert(
            (start.group, start.member),
            (
                ResyncProgress {
                    kind,
                    group: start.group,
                    member: start.member,
                    version: start.version,
                    objects_total: total,
                    objects_copied: 0,
                    bytes_copied: 0,
                    elapsed_ms: 0,
                    done: false,
                    full,
                },
                Instant::now(),
            ),
        );
    }

    /// Sets how many objects resync `start` copies, once it knows (a full resync lists the
    /// primary's objects after it removed the member's extra ones).
    pub fn resync_total(&self, start: ResyncStart, total: u64) {
        if let Some((progress, _)) = self.state().progress.get_mut(&(start.group, start.member)) {
            if progress.version == start.version {
                progress.objects_total = total;
            }
        }
    }

    /// Counts one object of `bytes` copied by a resync.
    pub fn resync_copied(&self, start: ResyncStart, bytes: u64) {
        if let Some((progress, _)) = self.state().progress.get_mut(&(start.group, start.member)) {
            if progress.version == start.version {
                progress.objects_copied += 1;
                progress.bytes_copied += bytes;
            }
        }
    }

    /// A refusal as the sender sees it; wakes the heartbeat loop when the sender knows a
    /// newer map than this server or the lease ran out.
    fn refusal(
        &self,
        refused: Refused,
        group: GroupId,
        routed: GroupVersion,
        what: &str,
    ) -> WireError {
        if refused.sender_is_ahead(routed) {
            self.wake.notify_one();
        }
        stale(match refused {
            Refused::UnknownGroup => {
                format!("mirror group {group} is not known on this server yet")
            }
            Refused::WrongVersion { known } => format!(
                "mirror group {group} is at version {known} here, the {what} carries {routed}"
            ),
            Refused::NotPrimary { primary } => format!(
                "this member is not the primary of mirror group {group} (member {primary} is)"
            ),
            Refused::NoLease => format!(
                "the lease of mirror group {group}'s primary ran out: management has not answered lately"
            ),
            Refused::NotPresent => format!(
                "this member is no present secondary of mirror group {group} in version {routed}"
            ),
        })
    }

    /// Checks a request routed to member `primary` of `group` as primary in `version`; returns
    /// the group.
    ///
    /// # Errors
    /// `StaleRoute` when the version is not the one known, `primary` is not the primary, or
    /// the lease ran out.
    pub fn admit_primary(
        &self,
        primary: MemberId,
        group: GroupId,
        version: GroupVersion,
    ) -> Result<MirrorGroupInfo, WireError> {
        let state = self.state();
        state
            .decisions
            .admit_primary(self.now(), primary, group, version)
            .map(|(_, info)| info.clone())
            .map_err(|refused| self.refusal(refused, group, version, "request"))
    }

    /// Checks a change forwarded to `member` of `group` by its primary in `version`.
    ///
    /// # Errors
    /// `StaleRoute` when the version differs or `member` is not a present secondary.
    pub fn admit_forward(
        &self,
        member: MemberId,
        group: GroupId,
        version: GroupVersion,
    ) -> Result<(), WireError> {
        let state = self.state();
        state
            .decisions
            .admit_forward(member, group, version)
            .map_err(|refused| self.refusal(refused, group, version, "forward"))
    }

    /// Admits a forward from the primary of `group` in `version` to `member` and gives the
    /// fence to pass it through ([`weft_mirror::fence::ForwardFences::admit`]).
    ///
    /// # Errors
    /// `StaleRoute` when the version differs or `member` is not a present secondary.
    pub fn admit_forward_fence<'a, F>(
        &self,
        fences: &'a mut weft_mirror::fence::ForwardFences<F>,
        member: MemberId,
        group: GroupId,
        version: GroupVersion,
        new: impl FnOnce() -> F,
    ) -> Result<weft_mirror::fence::FenceOf<'a, F>, WireError> {
        let state = self.state();
        fences
            .admit(&state.decisions, member, (group, version), new)
            .map_err(|refused| self.refusal(refused, group, version, "forward"))
    }

    /// The members other than the primary that get changes now.
    pub fn present_secondaries(&self, group: GroupId) -> Vec<MemberId> {
        self.state().decisions.present_secondaries(group)
    }

    /// The version a change from `primary` to `member` carries now; `None` when the member
    /// left the group.
    ///
    /// # Errors
    /// `StaleRoute` when `primary` is no longer the primary, or its lease ran out.
    pub fn version_to_member(
        &self,
        primary: MemberId,
        group: GroupId,
        member: MemberId,
    ) -> Result<Option<GroupVersion>, WireError> {
        let state = self.state();
        state
            .decisions
            .version_to_member(self.now(), primary, group, member)
            .map_err(|refused| self.refusal(refused, group, GroupVersion(0), "change"))
    }

    /// The version a resync step of `start` carries; fails once the resync's version is over.
    ///
    /// # Errors
    /// `StaleRoute` when the group moved on.
    pub fn resync_version(
        &self,
        primary: MemberId,
        start: ResyncStart,
    ) -> Result<GroupVersion, WireError> {
        let state = self.state();
        state
            .decisions
            .resync_version(self.now(), primary, start)
            .map_err(|refused| self.refusal(refused, start.group, start.version, "resync"))
    }

    /// How this server paces its copies to members: a copy failed is sent again after
    /// [`MEMBER_RETRY`]; each call ends by itself within the member timeout, so a copy is
    /// never sent again while one is on its way.
    fn pace(&self) -> Pace {
        let member_timeout = self.member_timeout().as_millis() as Time;
        Pace {
            resend: member_timeout.saturating_mul(2),
            retry: MEMBER_RETRY.as_millis() as Time,
            member_timeout,
        }
    }

    /// Delivers a change from `primary` to every present secondary of `group` with `send`
    /// (member, version, attempt), as [`Delivery`] decides: each member is tried until it has
    /// it or has left the group; one that does not take it within the member timeout is
    /// reported unreachable. When the change is given up, the members that did not take it
    /// are owed `items` (see [`weft_mirror::Membership::undelivered`]).
    ///
    /// # Errors
    /// `StaleRoute` when `primary` stopped being the primary or its lease ran out meanwhile.
    pub async fn deliver<F, Fut>(
        &self,
        primary: MemberId,
        group: GroupId,
        items: &[u64],
        send: F,
    ) -> Result<(), WireError>
    where
        F: Fn(MemberId, GroupVersion, u32) -> Fut,
        Fut: Future<Output = Result<(), RpcError>>,
    {
        let sending = Sending::Change {
            items: items.to_vec(),
        };
        let mut delivery =
            Delivery::new(&self.state().decisions, self.now(), primary, group, sending);
        self.deliver_change(&mut delivery, send).await
    }

    /// Begins a change of `items` of `group`, routed with `version` to member `primary`, once
    /// it holds its range (see [`PrimaryChange::begin`]).
    ///
    /// # Errors
    /// `StaleRoute` when this member may no longer serve it.
    pub fn begin_change(
        &self,
        primary: MemberId,
        (group, version): (GroupId, GroupVersion),
        items: Vec<u64>,
        forwards: &weft_mirror::numbers::Numbers,
        numbered: bool,
    ) -> Result<PrimaryChange, WireError> {
        PrimaryChange::begin(
            &self.state().decisions,
            forwards,
            self.now(),
            primary,
            (group, version),
            items,
            numbered,
        )
        .map_err(|refused| self.refusal(refused, group, version, "request"))
    }

    /// Runs the delivery of a change to its end with `send` (member, version, attempt).
    ///
    /// # Errors
    /// `StaleRoute` when the primary stopped being the primary or its lease ran out
    /// meanwhile.
    pub async fn deliver_change<F, Fut>(
        &self,
        delivery: &mut Delivery,
        send: F,
    ) -> Result<(), WireError>
    where
        F: Fn(MemberId, GroupVersion, u32) -> Fut,
        Fut: Future<Output = Result<(), RpcError>>,
    {
        let group = delivery.group();
        self.drive(delivery, send)
            .await
            .map(drop)
            .map_err(|(given_up, _)| self.given_up(given_up, group, GroupVersion(0), "change"))
    }

    /// Sends one step of resync `start` from `primary` with `send` until its member takes
    /// it; returns the member's answer.
    ///
    /// # Errors
    /// `StaleRoute` once the group left the resync's version (or `primary` its role or
    /// lease); `Unavailable` with the last failure when the member did not take it within
    /// the member timeout.
    pub async fn resync_step<F, Fut, T>(
        &self,
        primary: MemberId,
        start: ResyncStart,
        send: F,
    ) -> Result<T, WireError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, RpcError>>,
    {
        let mut delivery = Delivery::new(
            &self.state().decisions,
            self.now(),
            primary,
            start.group,
            Sending::Step(start),
        );
        let mut taken = self.drive(&mut delivery, |_, _, _| send()).await.map_err(
            |(given_up, last)| match (given_up, last) {
                (GivenUp::Late { member }, Some(error)) => WireError::new(
                    ErrorCode::Unavailable,
                    format!("member {member} did not take a resync step in time: {error}"),
                ),
                (given_up, _) => self.given_up(given_up, start.group, start.version, "resync"),
            },
        )?;
        let (_, answer) = taken.pop().ok_or_else(|| {
            WireError::new(
                ErrorCode::StaleRoute,
                format!("member {} left mirror group {}", start.member, start.group),
            )
        })?;
        Ok(answer)
    }

    /// Runs `delivery` to its end: sends each copy it asks for with `send` (member, version,
    /// attempt), tells it how each fared, and wakes when it says. Returns the answers of the
    /// members that took it, or why it was given up with the last failure seen.
    async fn drive<F, Fut, T>(
        &self,
        delivery: &mut Delivery,
        send: F,
    ) -> Result<Vec<(MemberId, T)>, (GivenUp, Option<RpcError>)>
    where
        F: Fn(MemberId, GroupVersion, u32) -> Fut,
        Fut: Future<Output = Result<T, RpcError>>,
    {
        use futures::stream::{FuturesUnordered, StreamExt};
        let pace = self.pace();
        let group = delivery.group();
        let send = &send;
        let mut calls = FuturesUnordered::new();
        let mut attempts: HashMap<MemberId, u32> = HashMap::new();
        let mut taken = Vec::new();
        let mut last_failure = None;
        loop {
            let copies = delivery.due(&mut self.state().decisions, self.now(), pace);
            for (member, version) in copies {
                let attempt = attempts.entry(member).or_default();
                let this = *attempt;
                *attempt += 1;
                calls.push(async move { (member, send(member, version, this).await) });
            }
            match delivery.outcome() {
                Some(Ok(())) => return Ok(taken),
                Some(Err(given_up)) => return Err((given_up, last_failure)),
                None => {}
            }
            let wake = delivery
                .next_wake(pace)
                .map_or(self.epoch + self.member_timeout(), |at| {
                    self.epoch + Duration::from_millis(at)
                });
            tokio::select! {
                Some((member, result)) = calls.next(), if !calls.is_empty() => match result {
                    Ok(answer) => {
                        delivery.acknowledged(&mut self.state().decisions, member);
                        taken.push((member, answer));
                    }
                    Err(error) => {
                        if attempts.get(&member) == Some(&1) {
                            tracing::warn!(%group, %member, %error, "a mirror member did not take a send; trying again");
                        }
                        delivery.failed(member, self.now(), pace);
                        last_failure = Some(error);
                    }
                },
                () = tokio::time::sleep_until(wake.into()) => {}
            }
        }
    }

    /// What a sender sees of a send given up.
    fn given_up(
        &self,
        given_up: GivenUp,
        group: GroupId,
        routed: GroupVersion,
        what: &str,
    ) -> WireError {
        match given_up {
            GivenUp::Refused(refused) => self.refusal(refused, group, routed, what),
            GivenUp::Late { member } => WireError::new(
                ErrorCode::Unavailable,
                format!("member {member} of mirror group {group} did not take a {what} in time"),
            ),
        }
    }
}

/// The tag a copy of pending change `number` of `sender` carries when it is sent now, with
/// what the sender has settled or given up on as `marks` say now (looked at again for every
/// copy: a client's requests, a primary's forwards).
pub fn change_tag(
    sender: weft_proto::ids::ClientId,
    number: u64,
    marks: weft_mirror::numbers::Marks,
) -> weft_proto::messages::ChangeTag {
    weft_proto::messages::ChangeTag {
        client: sender,
        number,
        settled_below: marks.settled_below,
        abandoned: marks.abandoned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a full resync learns how many objects it copies only after it removed the
    // member's extra ones; setting that total keeps what it counted so far and its start.
    #[test]
    fn a_resync_total_set_late_keeps_its_progress() {
        let membership = Membership::new(1, Duration::from_millis(100), Unsynced::InProcess);
        let start = ResyncStart {
            group: GroupId(3),
            version: GroupVersion(7),
            member: MemberId(2),
            full: true,
        };
        membership.resync_started(start, 0, true);
        membership.resync_copied(start, 4096);
        std::thread::sleep(Duration::from_millis(20));
        membership.resync_total(start, 12);
        let report = membership.report();
        let progress = report.resyncs.first().expect("the resync is reported");
        assert_eq!(progress.objects_total, 12);
        assert_eq!((progress.objects_copied, progress.bytes_copied), (1, 4096));
        assert!(progress.elapsed_ms >= 20, "counted from the resync's start");
    }
}
