//! The checker: what a run must leave, looked at once it ended (every answer, every group's
//! copies, the plain objects, the reads, the seals, one primary at a time).

use super::*;

impl World {
    /// Checks the run: each rule below adds what breaks it to the outcome's violations.
    pub(crate) fn check(&mut self) {
        let mut violations = Vec::new();
        let Some(mgmt) = self.mgmt.as_ref() else {
            violations.push("management is down at the end".to_string());
            self.outcome.violations = violations;
            return;
        };
        let map = mgmt.map().clone();
        // A move whose last round was answered since the last tick.
        for mover in self.config.clients..self.config.clients + self.config.movers {
            if self.clients[mover as usize].idle() {
                self.moved_on(mover);
            }
        }
        self.check_answers(&mut violations);
        self.check_groups(&map, &mut violations);
        self.check_plain_objects(&mut violations);
        self.check_reads(&map, &mut violations);
        self.check_seals(&mut violations);
        self.check_primaries(&mut violations);
        violations.truncate(20);
        self.outcome.violations = violations;
        let live: Vec<ResyncCounts> = self
            .servers
            .values()
            .filter_map(|slot| slot.machine.as_ref().map(|m| m.resync_counts))
            .collect();
        for counts in live {
            self.outcome.count_resyncs(counts);
        }
    }

    /// Every operation was answered; counts what the clients did.
    fn check_answers(&mut self, violations: &mut Vec<String>) {
        for (index, client) in self.clients.iter().enumerate() {
            let open = client.history.iter().filter(|r| r.done.is_none()).count();
            if open > 0 {
                violations.push(format!(
                    "client {index}: {open} operation(s) never answered"
                ));
            }
            self.outcome.operations +=
                client.history.iter().filter(|r| r.done.is_some()).count() as u64;
            for record in &client.history {
                match (&record.op, &record.done) {
                    (ClientOp::Move { seal: true, .. }, Some(_)) => self.outcome.seals += 1,
                    (ClientOp::Change { .. }, Some((_, Answer::Moved))) => self.outcome.moved += 1,
                    _ => {}
                }
            }
            self.outcome.home_commits += client
                .history
                .iter()
                .filter(|r| match (&r.op, &r.done) {
                    (ClientOp::Change { group, .. }, Some((_, Answer::Written { .. }))) => {
                        is_home(*group)
                    }
                    _ => false,
                })
                .count() as u64;
        }
    }

    /// Every group converged, and each member holds, chunk by chunk, a state its changes since the last acknowledged sync may have left; counts failovers.
    fn check_groups(&mut self, map: &weft_mirror::GroupMap, violations: &mut Vec<String>) {
        for (id, group) in &map.groups {
            if group.members.iter().any(|m| m.state != MemberState::Good) {
                violations.push(format!(
                    "group {id} did not converge: {:?} at version {}",
                    group.members, group.version
                ));
            }
            self.outcome.failovers += group.version.0.saturating_sub(1);
            if is_home(*id) {
                self.outcome.home_failovers += group.version.0.saturating_sub(1);
            }
            let Some(primary) = self.check_copies(id, group, violations) else {
                continue;
            };
            self.check_history(map, id, &primary, violations);
        }
    }

    /// Every member of `group` (`id`) holds the seals and the data its primary holds; answers
    /// the primary's data (`None` while it is down).
    fn check_copies(
        &self,
        id: &GroupId,
        group: &weft_mirror::Group,
        violations: &mut Vec<String>,
    ) -> Option<BTreeMap<ChunkId, Data>> {
        let data = |server: ServerId| -> Option<BTreeMap<ChunkId, Data>> {
            let machine = self.servers.get(&server)?.machine.as_ref()?;
            Some(
                machine
                    .store()
                    .volatile
                    .iter()
                    .filter(|((g, _), bytes)| g == id && !bytes.is_empty())
                    .map(|((_, chunk), bytes)| (*chunk, bytes.clone()))
                    .collect(),
            )
        };
        // Every member holds the seals its primary holds.
        let sealed = |server: ServerId| -> Option<BTreeSet<ChunkId>> {
            let machine = self.servers.get(&server)?.machine.as_ref()?;
            Some(
                machine
                    .store()
                    .sealed
                    .range((*id, 0)..=(*id, ChunkId::MAX))
                    .map(|(_, chunk)| *chunk)
                    .collect(),
            )
        };
        let primary_sealed = sealed(group.primary);
        for member in &group.members {
            let held = sealed(member.server);
            if held != primary_sealed {
                violations.push(format!(
                    "group {id}: member {} holds the seals {held:?}, primary {} {primary_sealed:?}",
                    member.server, group.primary
                ));
            }
        }
        let primary = data(group.primary);
        for member in &group.members {
            let held = data(member.server);
            if held != primary {
                let (held, primary) = (
                    held.unwrap_or_default(),
                    primary.clone().unwrap_or_default(),
                );
                let differ: Vec<String> = held
                    .keys()
                    .chain(primary.keys())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .filter(|chunk| held.get(chunk) != primary.get(chunk))
                    .map(|chunk| {
                        format!(
                            "chunk {chunk}: {:?} on the member, {:?} on the primary",
                            held.get(chunk),
                            primary.get(chunk)
                        )
                    })
                    .collect();
                violations.push(format!(
                    "group {id}: member {} differs from primary {}: {}",
                    member.server,
                    group.primary,
                    differ.join("; ")
                ));
            }
        }
        primary
    }

    /// What the primary of `group` (`id`) holds of each chunk, `primary`, is a state its
    /// clients' changes since their last acknowledged sync may have left.
    fn check_history(
        &self,
        map: &weft_mirror::GroupMap,
        id: &GroupId,
        primary: &BTreeMap<ChunkId, Data>,
        violations: &mut Vec<String>,
    ) {
        let group = &map.groups[id];
        for client in &self.clients {
            for (_, chunk) in World::chunks_in(&client.history)
                .into_iter()
                .filter(|(place, _)| place == id)
            {
                // Moved off: sealed, its bytes dropped.
                if self
                    .moved
                    .get(&chunk)
                    .is_some_and(|moved| moved.from == *id)
                {
                    if let Some(found) = primary.get(&chunk) {
                        violations.push(format!(
                            "group {id} chunk {chunk}: moved off to group {}, still holds {found:?}",
                            self.moved[&chunk].to
                        ));
                    }
                    continue;
                }
                // A home answers a commit only once it is synced everywhere: nothing it
                // answered is ever lost, whatever the loss epoch says.
                let (epoch, found) = if is_home(*id) {
                    (0, home_region(primary.get(&0), chunk))
                } else {
                    (
                        group.loss_epoch,
                        primary.get(&chunk).cloned().unwrap_or_default(),
                    )
                };
                let allowed = self.chunk_states(map, &client.history, (*id, chunk), epoch);
                if !allowed.contains(&found) {
                    violations.push(format!(
                        "group {id} chunk {chunk}: holds {found:?}, none of the {} states its changes since the last acknowledged sync may have left",
                        allowed.len()
                    ));
                }
            }
        }
    }

    /// Plain objects hold what they were synced with, or later.
    fn check_plain_objects(&self, violations: &mut Vec<String>) {
        // Plain objects hold what they were synced with, or later: on their server alone, never
        // touched by the resyncs of the groups its target is a member of.
        for (index, client) in self.clients.iter().enumerate() {
            for (place, chunk) in World::chunks_in(&client.history) {
                let Some(server) = place.plain_server() else {
                    continue;
                };
                let Some(machine) = self.servers.get(&server).and_then(|s| s.machine.as_ref())
                else {
                    violations.push(format!("server {server} is down at the end"));
                    continue;
                };
                let epoch = self.servers[&server].unsynced_boot;
                let empty = BTreeSet::from([Data::new()]);
                let allowed = allowed_states(&client.history, (place, chunk), epoch, empty);
                let found = machine
                    .store()
                    .volatile
                    .get(&(place, chunk))
                    .cloned()
                    .unwrap_or_default();
                if !allowed.contains(&found) {
                    violations.push(format!(
                        "client {index}'s plain chunk {chunk} on server {server}: holds {found:?}, none of the {} states its changes since the last acknowledged sync may have left",
                        allowed.len()
                    ));
                }
            }
        }
    }

    /// The states `chunk` of `place` may be in after `history` when the place's loss epoch
    /// is `epoch` ([`allowed_states`]); a chunk that moved to `place` starts from any state
    /// it may have been in where it moved from (its last round copied what it held once
    /// sealed, and synced the copy).
    fn chunk_states(
        &self,
        map: &weft_mirror::GroupMap,
        history: &[OpRecord<Data>],
        (place, chunk): (GroupId, ChunkId),
        epoch: u64,
    ) -> BTreeSet<Data> {
        let start = match self.moved.get(&chunk) {
            Some(moved) if moved.to == place => {
                let before = map.groups.get(&moved.from).map_or(0, |g| g.loss_epoch);
                let empty = BTreeSet::from([Data::new()]);
                allowed_states(history, (moved.from, chunk), before, empty)
            }
            _ => BTreeSet::from([Data::new()]),
        };
        allowed_states(history, (place, chunk), epoch, start)
    }

    /// Reads never see a synced change undone.
    fn check_reads(&self, map: &weft_mirror::GroupMap, violations: &mut Vec<String>) {
        // Reads never see a synced change undone: each returns what the chunk's last change
        // followed by an acknowledged sync left, or what a later one left.
        for (index, client) in self.clients.iter().enumerate() {
            for (at, record) in client.history.iter().enumerate() {
                let (ClientOp::Read { group, chunk }, Some((_, Answer::Data { data, epoch }))) =
                    (&record.op, &record.done)
                else {
                    continue;
                };
                let found = data.clone().unwrap_or_default();
                let allowed =
                    self.chunk_states(map, &client.history[..at], (*group, *chunk), *epoch);
                if !allowed.contains(&found) {
                    violations.push(format!(
                        "client {index} read {found:?} from chunk {chunk} at op {at}, none of the {} states its changes since the last acknowledged sync may have left",
                        allowed.len()
                    ));
                }
            }
        }
    }

    /// A moved chunk takes no change and serves no read where it moved off once its last
    /// round was answered: a writer with the moved file's old layout is never answered from
    /// the group nobody reads.
    fn check_seals(&self, violations: &mut Vec<String>) {
        for (index, client) in self.clients.iter().enumerate() {
            for (at, record) in client.history.iter().enumerate() {
                let (group, chunk) = match &record.op {
                    ClientOp::Change { group, change } => (*group, change.chunk()),
                    ClientOp::Read { group, chunk } => (*group, *chunk),
                    ClientOp::Sync { .. } | ClientOp::Move { .. } => continue,
                };
                let Some(moved) = self.moved.get(&chunk) else {
                    continue;
                };
                let answered = record.done.as_ref().map(|(_, answer)| answer);
                if moved.from == group
                    && record.issued > moved.at
                    && answered != Some(&Answer::Moved)
                {
                    violations.push(format!(
                        "client {index}: op {at} on chunk {chunk} of group {group}, moved off to group {} at {} ms, was answered {answered:?}",
                        moved.to, moved.at
                    ));
                }
            }
        }
    }

    /// No two primaries at once: versions never go back, and each version has one primary.
    fn check_primaries(&self, violations: &mut Vec<String>) {
        // No two primaries at once.
        let mut served = self.served.clone();
        served.sort();
        let mut latest: BTreeMap<GroupId, (Version, ServerId, Time)> = BTreeMap::new();
        let mut owner: BTreeMap<(GroupId, Version), ServerId> = BTreeMap::new();
        for (time, group, version, server) in served {
            if let Some((seen, by, at)) = latest.get(&group) {
                if version < *seen {
                    violations.push(format!(
                        "group {group}: server {server} served version {version} at {time} ms after server {by} served version {seen} at {at} ms"
                    ));
                }
            }
            if let Some(first) = owner.insert((group, version), server) {
                if first != server {
                    violations.push(format!(
                        "group {group}: version {version} served by servers {first} and {server}"
                    ));
                }
            }
            if latest
                .get(&group)
                .is_none_or(|(seen, _, _)| version >= *seen)
            {
                latest.insert(group, (version, server, time));
            }
        }
    }
}

/// The states `chunk` of `place` (a group, or a server's plain objects) may be in after
/// `history` when the place's loss epoch is `epoch`, an empty chunk standing for none: what
/// the changes up to the last sync that answered `Done` left, or what later changes left. A
/// crash of every copy (a later answer carries a newer loss epoch, or a sync answered `Lost`)
/// may have taken the chunk back to any state since that sync, and later changes apply to
/// whichever it was.
fn allowed_states(
    history: &[OpRecord<Data>],
    (place, chunk): (GroupId, ChunkId),
    epoch: u64,
    start: BTreeSet<Data>,
) -> BTreeSet<Data> {
    // The states the chunk may be in after each change since the last `Done` sync.
    let mut timeline: Vec<BTreeSet<Data>> = vec![start];
    let mut seen = 0;
    let mine = history.iter().filter(|record| match &record.op {
        ClientOp::Change { group, .. }
        | ClientOp::Sync { group }
        | ClientOp::Read { group, .. } => *group == place,
        ClientOp::Move { .. } => false,
    });
    let apply = |change: &Change, state: &Data| -> Data {
        let mut object = Some(state.clone());
        change.apply(&mut object);
        object.unwrap_or_default()
    };
    // The chunk's changes since the last `Done` sync.
    let mut recent: Vec<&Change> = Vec::new();
    // After a crash of every copy: any state since that sync; and, as the client runs one
    // operation at a time, the change it had under way then may have run again after the
    // crash (its retry, once a copy answered before the crash was lost), on top of
    // whichever it was.
    let anything_since = |timeline: &[BTreeSet<Data>], recent: &[&Change]| {
        let states: BTreeSet<Data> = timeline.iter().flatten().cloned().collect();
        let again: Vec<Data> = recent
            .iter()
            .flat_map(|change| states.iter().map(|state| apply(change, state)))
            .collect();
        vec![states.into_iter().chain(again).collect::<BTreeSet<Data>>()]
    };
    for record in mine {
        let (answered, lost) = match &record.done {
            Some((_, Answer::Written { epoch } | Answer::Data { epoch, .. })) => (*epoch, false),
            Some((_, Answer::Lost)) => (seen, true),
            _ => (seen, false),
        };
        if answered > seen || lost {
            timeline = anything_since(&timeline, &recent);
            seen = seen.max(answered);
        }
        match (&record.op, &record.done) {
            // A change answered `Moved` may have been applied before its chunk was sealed
            // (a first run of it given up), and copied with the chunk, or not.
            (ClientOp::Change { change, .. }, done) if change.chunk() == chunk => {
                let before = timeline.last().expect("never empty");
                let mut next: BTreeSet<Data> =
                    before.iter().map(|state| apply(change, state)).collect();
                if matches!(done, Some((_, Answer::Moved))) {
                    next.extend(before.iter().cloned());
                }
                timeline.push(next);
                recent.push(change);
            }
            (ClientOp::Sync { .. }, Some((_, Answer::Done))) => {
                timeline = vec![timeline.pop().expect("never empty")];
                recent.clear();
            }
            _ => {}
        }
    }
    if epoch > seen {
        timeline = anything_since(&timeline, &recent);
    }
    timeline.into_iter().flatten().collect()
}
