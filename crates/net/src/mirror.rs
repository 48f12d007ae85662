//! A server's side of its mirror groups, for storage targets and metadata homes alike: which
//! groups it holds members of in which version, its lease as primary, the members its changes
//! do not reach, and the resyncs it runs. What a change or a resync carries is the server's
//! own business; the rules are the same for both kinds and follow the `weft-mirror` state
//! machines, which the simulator checks:
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
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use weft_proto::error::WireError;
use weft_proto::messages::{
    Consistency, GroupMember, MirrorGroupInfo, MirrorHeartbeat, ResyncProgress,
};
use weft_proto::ErrorCode;

/// Pause between attempts to reach a member.
pub const MEMBER_RETRY: Duration = Duration::from_millis(100);

/// A `StaleRoute` refusal: the sender fetches the map again and routes anew.
pub fn stale(message: String) -> WireError {
    WireError::new(ErrorCode::StaleRoute, message)
}

#[derive(Default)]
struct State {
    /// Groups with a member on this server, as last heard from management.
    groups: HashMap<u32, MirrorGroupInfo>,
    /// A primary serves until then.
    lease_until: Option<Instant>,
    /// Members a change has not reached, since when, and the group version those changes
    /// carried: (group, member) → (since, version). A failure under an older version is about
    /// a membership that no longer holds, and is neither reported nor kept.
    failing: HashMap<(u32, u32), (Instant, u64)>,
    /// Resyncs running: (group, member) → the version they run in.
    resyncs: HashMap<(u32, u32), u64>,
    /// Resyncs finished, reported until management marks the member good.
    resynced: HashSet<GroupMember>,
    /// Progress of the resyncs running or finished, by (group, member), with their start.
    progress: HashMap<(u32, u32), (ResyncProgress, Instant)>,
}

/// A resync this server must run as primary: bring `member` of `group` up to date in
/// `version`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResyncStart {
    pub group: u32,
    pub version: u64,
    pub member: u32,
    /// Whether management asks for a full copy.
    pub full: bool,
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

/// A server's mirror groups and lease.
pub struct Membership {
    boot: u64,
    unsynced_boot: u64,
    interval: Duration,
    state: Mutex<State>,
    /// Wakes the heartbeat loop early: a request showed that a newer map exists, or a resync
    /// finished.
    pub wake: tokio::sync::Notify,
}

impl Membership {
    /// The membership of a server that sends a heartbeat every `interval` and keeps its
    /// unsynced writes as `unsynced` says; its boot id differs on every start, so management
    /// tells a restart from a late heartbeat.
    pub fn new(interval: Duration, unsynced: Unsynced) -> Membership {
        let boot = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id());
        let unsynced_boot = match unsynced {
            Unsynced::InProcess => boot,
            Unsynced::InKernel => kernel_boot().unwrap_or(boot),
        };
        Membership {
            boot,
            unsynced_boot,
            interval,
            state: Mutex::default(),
            wake: tokio::sync::Notify::new(),
        }
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

    /// A change unacknowledged this long makes its member unreachable.
    pub fn member_timeout(&self) -> Duration {
        (self.interval * 2).max(Duration::from_secs(1))
    }

    /// The group as last heard.
    pub fn group(&self, group: u32) -> Option<MirrorGroupInfo> {
        self.state().groups.get(&group).cloned()
    }

    /// Every group with a member here, as last heard.
    pub fn groups(&self) -> Vec<MirrorGroupInfo> {
        self.state().groups.values().cloned().collect()
    }

    /// Whether the lease of this server's primaries holds now.
    pub fn lease_holds(&self) -> bool {
        self.state()
            .lease_until
            .is_some_and(|until| Instant::now() < until)
    }

    /// What the next heartbeat tells management.
    pub fn report(&self) -> MirrorHeartbeat {
        let state = self.state();
        let timeout = self.member_timeout();
        let unreachable = state
            .failing
            .iter()
            .filter(|(_, (since, _))| since.elapsed() >= timeout)
            .map(|((group, member), (_, version))| (*group, *version, *member))
            .collect();
        MirrorHeartbeat {
            boot: self.boot,
            unsynced_boot: self.unsynced_boot,
            interval_ms: self.interval.as_millis() as u64,
            resynced: state.resynced.iter().copied().collect(),
            unreachable,
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
    /// (newer versions replace older ones; `adopted` sees each with the version it replaces).
    /// Returns the resyncs this server must start as the primary of a group, the primary
    /// being one of its members when `local` says so.
    pub fn adopt(
        &self,
        sent: Instant,
        lease: Duration,
        groups: Vec<MirrorGroupInfo>,
        local: impl Fn(u32) -> bool,
        mut adopted: impl FnMut(Option<&MirrorGroupInfo>, &MirrorGroupInfo),
    ) -> Vec<ResyncStart> {
        let mut starts = Vec::new();
        let mut state = self.state();
        let until = sent + lease;
        state.lease_until = Some(state.lease_until.map_or(until, |known| known.max(until)));
        for group in groups {
            let newer = state
                .groups
                .get(&group.id)
                .is_none_or(|known| known.version < group.version);
            if newer {
                tracing::info!(
                    group = group.id,
                    kind = <&str>::from(group.kind),
                    version = group.version,
                    primary = group.primary,
                    "mirror group version adopted"
                );
                let before = state.groups.insert(group.id, group.clone());
                adopted(before.as_ref(), &group);
            }
        }
        let State {
            groups,
            resyncs,
            resynced,
            failing,
            progress,
            ..
        } = &mut *state;
        // Progress is kept while the member still needs it or the resync's version holds.
        progress.retain(|(group, member), (p, _)| {
            groups.get(group).is_some_and(|g| {
                g.members
                    .iter()
                    .any(|m| m.id == *member && m.state == Consistency::NeedsResync)
                    && (g.version == p.version || !p.done)
            })
        });
        // Reports management has acted on are dropped.
        resynced.retain(|(group, version, member)| {
            groups.get(group).is_some_and(|g| {
                g.version == *version
                    || g.members
                        .iter()
                        .any(|m| m.id == *member && m.state == Consistency::NeedsResync)
            })
        });
        failing.retain(|(group, member), (_, version)| {
            groups.get(group).is_some_and(|g| {
                g.version == *version
                    && g.members
                        .iter()
                        .any(|m| m.id == *member && m.state != Consistency::Bad)
            })
        });
        for group in groups.values() {
            if !local(group.primary) {
                continue;
            }
            for member in &group.members {
                let key = (group.id, member.id);
                let wanted = member.state == Consistency::NeedsResync
                    && member.id != group.primary
                    && !resynced.contains(&(group.id, group.version, member.id));
                if wanted && resyncs.get(&key) != Some(&group.version) {
                    resyncs.insert(key, group.version);
                    starts.push(ResyncStart {
                        group: group.id,
                        version: group.version,
                        member: member.id,
                        full: member.full_resync,
                    });
                }
            }
        }
        starts
    }

    /// Records how a resync ended: a finished one is reported until management marks the
    /// member good; a stopped one starts again with the next version.
    pub fn resync_ended(&self, start: ResyncStart, outcome: &Result<(), WireError>) {
        let ResyncStart {
            group,
            version,
            member,
            ..
        } = start;
        let mut state = self.state();
        if state.resyncs.get(&(group, member)) == Some(&version) {
            state.resyncs.remove(&(group, member));
        }
        match outcome {
            Ok(()) => {
                tracing::info!(group, version, member, "member resynced");
                state.resynced.insert((group, version, member));
                if let Some((progress, _)) = state.progress.get_mut(&(group, member)) {
                    progress.done = true;
                }
                drop(state);
                self.wake.notify_one();
            }
            Err(error) => {
                tracing::info!(group, version, member, %error, "resync stopped; it starts again with the next version");
            }
        }
    }

    /// Starts the progress record of a resync of `total` objects.
    pub fn resync_started(&self, start: ResyncStart, total: u64, full: bool) {
        let mut state = self.state();
        let kind = state
            .groups
            .get(&start.group)
            .map_or(weft_proto::messages::MirrorKind::Storage, |g| g.kind);
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

    /// Counts one object of `bytes` copied by a resync.
    pub fn resync_copied(&self, start: ResyncStart, bytes: u64) {
        if let Some((progress, _)) = self.state().progress.get_mut(&(start.group, start.member)) {
            if progress.version == start.version {
                progress.objects_copied += 1;
                progress.bytes_copied += bytes;
            }
        }
    }

    /// Checks a request routed to member `primary` of `group` as primary in `version`; returns
    /// the group.
    ///
    /// # Errors
    /// `StaleRoute` when the version is not the one known, `primary` is not the primary, or
    /// the lease ran out.
    pub fn admit_primary(
        &self,
        primary: u32,
        group: u32,
        version: u64,
    ) -> Result<MirrorGroupInfo, WireError> {
        let state = self.state();
        let Some(known) = state.groups.get(&group) else {
            self.wake.notify_one();
            return Err(stale(format!(
                "mirror group {group} is not known on this server yet"
            )));
        };
        if known.version != version {
            if version > known.version {
                self.wake.notify_one();
            }
            return Err(stale(format!(
                "mirror group {group} is at version {} here, the request was routed with {version}",
                known.version
            )));
        }
        if known.primary != primary {
            return Err(stale(format!(
                "member {primary} is not the primary of mirror group {group} (member {} is)",
                known.primary
            )));
        }
        if state
            .lease_until
            .is_none_or(|until| Instant::now() >= until)
        {
            self.wake.notify_one();
            return Err(stale(format!(
                "the lease of mirror group {group}'s primary ran out: management has not answered lately"
            )));
        }
        Ok(known.clone())
    }

    /// Checks a change forwarded to `member` of `group` by its primary in `version`.
    ///
    /// # Errors
    /// `StaleRoute` when the version differs or `member` is not a present secondary.
    pub fn admit_forward(&self, member: u32, group: u32, version: u64) -> Result<(), WireError> {
        let state = self.state();
        let known = state.groups.get(&group);
        let known_version = known.map_or(0, |g| g.version);
        if known_version != version {
            if version > known_version {
                self.wake.notify_one();
            }
            return Err(stale(format!(
                "mirror group {group} is at version {known_version} here, the forward carries {version}"
            )));
        }
        let present = known.is_some_and(|g| {
            g.primary != member
                && g.members
                    .iter()
                    .any(|m| m.id == member && m.state != Consistency::Bad)
        });
        if present {
            Ok(())
        } else {
            Err(stale(format!(
                "member {member} is no present secondary of mirror group {group} in version {known_version}"
            )))
        }
    }

    /// The members other than the primary that get changes now.
    pub fn present_secondaries(&self, group: u32) -> Vec<u32> {
        self.state().groups.get(&group).map_or(Vec::new(), |g| {
            g.members
                .iter()
                .filter(|m| m.id != g.primary && m.state != Consistency::Bad)
                .map(|m| m.id)
                .collect()
        })
    }

    /// The version a change from `primary` to `member` carries now; `None` when the member
    /// left the group.
    ///
    /// # Errors
    /// `StaleRoute` when `primary` is no longer the primary, or its lease ran out.
    pub fn version_to_member(
        &self,
        primary: u32,
        group: u32,
        member: u32,
    ) -> Result<Option<u64>, WireError> {
        let state = self.state();
        let Some(known) = state.groups.get(&group) else {
            return Err(stale(format!("mirror group {group} is gone")));
        };
        if known.primary != primary {
            return Err(stale(format!(
                "member {primary} stopped being the primary of mirror group {group}"
            )));
        }
        if state
            .lease_until
            .is_none_or(|until| Instant::now() >= until)
        {
            // Management may promote another member soon: stop waiting for this one.
            return Err(stale(format!(
                "the lease of mirror group {group}'s primary ran out while a member was unreachable"
            )));
        }
        let present = known
            .members
            .iter()
            .any(|m| m.id == member && m.state != Consistency::Bad);
        Ok(present.then_some(known.version))
    }

    /// The version a resync step of `start` carries; fails once the resync's version is over.
    ///
    /// # Errors
    /// `StaleRoute` when the group moved on.
    pub fn resync_version(&self, primary: u32, start: ResyncStart) -> Result<u64, WireError> {
        match self.version_to_member(primary, start.group, start.member)? {
            Some(version) if version == start.version => Ok(version),
            _ => Err(stale(format!(
                "mirror group {} left version {}",
                start.group, start.version
            ))),
        }
    }

    /// Delivers a change from `primary` to every present secondary of `group` with `send`
    /// (member, version, attempt), trying each until it has it or has left the group. A
    /// member that does not take it within the member timeout is reported unreachable.
    ///
    /// # Errors
    /// `StaleRoute` when `primary` stopped being the primary or its lease ran out meanwhile.
    pub async fn deliver<F, Fut>(&self, primary: u32, group: u32, send: F) -> Result<(), WireError>
    where
        F: Fn(u32, u64, u32) -> Fut,
        Fut: Future<Output = Result<(), RpcError>>,
    {
        let members = self.present_secondaries(group);
        let send = &send;
        let sends = members.into_iter().map(|member| async move {
            // When sends under the current version began to fail.
            let mut first_failure: Option<(Instant, u64)> = None;
            let mut attempt = 0;
            loop {
                let Some(version) = self.version_to_member(primary, group, member)? else {
                    return Ok(());
                };
                match send(member, version, attempt).await {
                    Ok(()) => {
                        self.state().failing.remove(&(group, member));
                        return Ok(());
                    }
                    Err(error) => {
                        if first_failure.is_none() {
                            tracing::warn!(group, member, %error, "a mirror member did not take a change; trying again");
                        }
                        // A new version starts the member's time over.
                        let since = match first_failure {
                            Some((since, under)) if under == version => since,
                            _ => Instant::now(),
                        };
                        first_failure = Some((since, version));
                        if !error.is_retryable() || since.elapsed() >= self.member_timeout() {
                            let mut state = self.state();
                            // Only while the version the change carried still holds: a send
                            // that failed as the group moved on says nothing of the new one.
                            let holds =
                                state.groups.get(&group).is_some_and(|g| g.version == version);
                            let kept = state.failing.get(&(group, member)).map(|(_, v)| *v);
                            if holds && kept != Some(version) {
                                state.failing.insert((group, member), (since, version));
                            }
                        }
                        attempt += 1;
                        tokio::time::sleep(MEMBER_RETRY).await;
                    }
                }
            }
        });
        for result in futures::future::join_all(sends).await {
            result?;
        }
        Ok(())
    }

    /// Sends one resync step with `send` until it lands or the member timeout passes.
    ///
    /// # Errors
    /// `Unavailable` with the last failure.
    pub async fn resync_step<F, Fut, T>(&self, member: u32, send: F) -> Result<T, WireError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, RpcError>>,
    {
        let started = Instant::now();
        loop {
            match send().await {
                Ok(value) => return Ok(value),
                Err(error) if started.elapsed() < self.member_timeout() => {
                    tracing::debug!(member, %error, "resync step failed; trying again");
                    tokio::time::sleep(MEMBER_RETRY).await;
                }
                Err(error) => {
                    return Err(WireError::new(ErrorCode::Unavailable, error.to_string()))
                }
            }
        }
    }
}
