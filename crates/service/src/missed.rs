//! What an absent mirror member misses, recorded durably by its primary: the items changed
//! since it left — a storage target's objects (inode ids), a metadata store's extents — so
//! that when it comes back without having restarted only those are copied.
//!
//! One file per (group, member) in the primary's `mirror/` directory (a storage target's, or a
//! metadata server's data directory), `missed-<group>-<member>`: every changed item, 8 bytes
//! little endian, each appended and synced before the change that made it is answered.

use std::collections::{BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use weft_net::mirror::Adopted;
use weft_proto::ids::{GroupId, MemberId};

struct Log {
    path: PathBuf,
    file: File,
    items: BTreeSet<u64>,
}

impl Log {
    /// Adds `items`; durable when this returns (one sync if any was new).
    fn append(&mut self, items: &[u64]) -> std::io::Result<()> {
        let mut bytes = Vec::new();
        for item in items {
            if self.items.insert(*item) {
                bytes.extend_from_slice(&item.to_le_bytes());
            }
        }
        if !bytes.is_empty() {
            self.file.write_all(&bytes)?;
            self.file.sync_data()?;
        }
        Ok(())
    }
}

/// Every record this server keeps, by (group, member).
#[derive(Default)]
pub struct MissedLogs {
    logs: Mutex<HashMap<(GroupId, MemberId), Log>>,
}

fn file_name(group: GroupId, member: MemberId) -> String {
    format!("missed-{group}-{member}")
}

fn parse_name(name: &str) -> Option<(GroupId, MemberId)> {
    let (group, member) = name.strip_prefix("missed-")?.split_once('-')?;
    Some((GroupId(group.parse().ok()?), MemberId(member.parse().ok()?)))
}

impl MissedLogs {
    fn logs(&self) -> std::sync::MutexGuard<'_, HashMap<(GroupId, MemberId), Log>> {
        self.logs.lock().expect("missed logs poisoned")
    }

    /// Loads the records kept in the `mirror/` directory under `root`.
    ///
    /// # Errors
    /// When a record cannot be read: without it a returning member could miss data.
    pub fn load(&self, root: &Path) -> std::io::Result<()> {
        let dir = root.join("mirror");
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error),
        };
        for entry in entries {
            let entry = entry?;
            let Some(key) = entry.file_name().to_str().and_then(parse_name) else {
                continue;
            };
            let path = entry.path();
            let mut file = OpenOptions::new().read(true).append(true).open(&path)?;
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)?;
            // A torn last item (a crash mid-append) was never answered: drop it.
            let items = bytes
                .chunks_exact(8)
                .map(|item| u64::from_le_bytes(item.try_into().expect("8 bytes")))
                .collect();
            self.logs().insert(key, Log { path, file, items });
        }
        Ok(())
    }

    /// Starts recording for `member` of `group` under `root` (no-op if a record exists),
    /// durably.
    ///
    /// # Errors
    /// When the record cannot be created.
    pub fn start(&self, root: &Path, group: GroupId, member: MemberId) -> std::io::Result<()> {
        let mut logs = self.logs();
        if logs.contains_key(&(group, member)) {
            return Ok(());
        }
        let dir = root.join("mirror");
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(file_name(group, member));
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)?;
        file.sync_all()?;
        crate::durable::sync_directory(&dir)?;
        logs.insert(
            (group, member),
            Log {
                path,
                file,
                items: BTreeSet::new(),
            },
        );
        tracing::info!(
            %group,
            %member,
            "recording what an absent mirror member misses"
        );
        Ok(())
    }

    /// Whether `group` has any record.
    pub fn any(&self, group: GroupId) -> bool {
        self.logs().keys().any(|(g, _)| *g == group)
    }

    /// Records that `items` changed for every member of `group` with a record; durable when
    /// this returns (one sync per record that learned something new).
    ///
    /// # Errors
    /// When a record cannot be written: the change must not be answered then.
    pub fn note(&self, group: GroupId, items: &[u64]) -> std::io::Result<()> {
        let mut logs = self.logs();
        for ((g, _), log) in logs.iter_mut() {
            if *g == group {
                log.append(items)?;
            }
        }
        Ok(())
    }

    /// Records that `items` changed for `member` of `group` alone, if it has a record.
    ///
    /// # Errors
    /// When the record cannot be written.
    pub fn note_member(
        &self,
        group: GroupId,
        member: MemberId,
        items: &[u64],
    ) -> std::io::Result<()> {
        match self.logs().get_mut(&(group, member)) {
            Some(log) => log.append(items),
            None => Ok(()),
        }
    }

    /// What `member` of `group` missed, if recorded, in order.
    pub fn recorded(&self, group: GroupId, member: MemberId) -> Option<Vec<u64>> {
        self.logs()
            .get(&(group, member))
            .map(|log| log.items.iter().copied().collect())
    }

    /// Drops the record of `member` of `group`.
    pub fn forget(&self, group: GroupId, member: MemberId) {
        if let Some(log) = self.logs().remove(&(group, member)) {
            let _ = std::fs::remove_file(&log.path);
        }
    }

    /// Does what a newer map asks of the records ([`Adopted`]): starts one for each member
    /// that left its group in sync while this server stayed its primary (in the directory
    /// `root` gives for the group's primary), and drops those of groups whose primary is no
    /// longer here.
    pub fn follow(&self, adopted: &Adopted, root: impl Fn(GroupId) -> Option<PathBuf>) {
        for group in &adopted.drop_missed {
            self.forget_group(*group);
        }
        for (group, member, owed) in &adopted.record_missed {
            let Some(root) = root(*group) else {
                continue;
            };
            let started = self
                .start(&root, *group, *member)
                .and_then(|()| self.note_member(*group, *member, owed));
            if let Err(error) = started {
                // Without a record the member is copied in full when it comes back.
                self.forget(*group, *member);
                tracing::error!(%group, %member, %error, "cannot record what a mirror member misses");
            }
        }
    }

    /// Drops every record of `group` (this server is no longer its primary).
    pub fn forget_group(&self, group: GroupId) {
        let members: Vec<MemberId> = self
            .logs()
            .keys()
            .filter(|(g, _)| *g == group)
            .map(|(_, m)| *m)
            .collect();
        for member in members {
            self.forget(group, member);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: what a member missed survives a restart of its primary, each item once, and is
    // gone once forgotten.
    #[test]
    fn records_survive_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let logs = MissedLogs::default();
        logs.start(dir.path(), GroupId(2), MemberId(7))
            .expect("start");
        for item in [5, 3, 5, 9] {
            logs.note(GroupId(2), &[item]).expect("note");
        }
        logs.note(GroupId(3), &[1])
            .expect("another group has no record");
        let reloaded = MissedLogs::default();
        reloaded.load(dir.path()).expect("load");
        assert_eq!(
            reloaded.recorded(GroupId(2), MemberId(7)),
            Some(vec![3, 5, 9])
        );
        assert_eq!(reloaded.recorded(GroupId(3), MemberId(7)), None);
        reloaded.forget(GroupId(2), MemberId(7));
        let again = MissedLogs::default();
        again.load(dir.path()).expect("load");
        assert_eq!(again.recorded(GroupId(2), MemberId(7)), None);
    }
}
