//! What an absent mirror member misses, recorded durably by its primary: the objects changed
//! since it left, so that when it comes back without having restarted only those are copied.
//!
//! One file per (group, member) in the primary target's `mirror/` directory,
//! `missed-<group>-<member>`: the inode id of every changed object, 8 bytes little endian,
//! each appended and synced before the change that made it is answered.

use std::collections::{BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use weft_proto::ids::InodeId;

struct Log {
    path: PathBuf,
    file: File,
    inodes: BTreeSet<InodeId>,
}

/// Every record this server keeps, by (group, member).
#[derive(Default)]
pub(crate) struct MissedLogs {
    logs: Mutex<HashMap<(u32, u32), Log>>,
}

fn file_name(group: u32, member: u32) -> String {
    format!("missed-{group}-{member}")
}

fn parse_name(name: &str) -> Option<(u32, u32)> {
    let (group, member) = name.strip_prefix("missed-")?.split_once('-')?;
    Some((group.parse().ok()?, member.parse().ok()?))
}

impl MissedLogs {
    fn logs(&self) -> std::sync::MutexGuard<'_, HashMap<(u32, u32), Log>> {
        self.logs.lock().expect("missed logs poisoned")
    }

    /// Loads the records kept in the `mirror/` directory of a target.
    pub fn load(&self, target_root: &Path) -> std::io::Result<()> {
        let dir = target_root.join("mirror");
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
            // A torn last id (a crash mid-append) was never answered: drop it.
            let inodes = bytes
                .chunks_exact(8)
                .map(|id| InodeId(u64::from_le_bytes(id.try_into().expect("8 bytes"))))
                .collect();
            self.logs().insert(key, Log { path, file, inodes });
        }
        Ok(())
    }

    /// Starts recording for `member` of `group` (no-op if a record exists), durably.
    pub fn start(&self, target_root: &Path, group: u32, member: u32) -> std::io::Result<()> {
        let mut logs = self.logs();
        if logs.contains_key(&(group, member)) {
            return Ok(());
        }
        let dir = target_root.join("mirror");
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(file_name(group, member));
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)?;
        file.sync_all()?;
        weft_service::durable::sync_directory(&dir)?;
        logs.insert(
            (group, member),
            Log {
                path,
                file,
                inodes: BTreeSet::new(),
            },
        );
        Ok(())
    }

    /// Whether `group` has any record.
    pub fn any(&self, group: u32) -> bool {
        self.logs().keys().any(|(g, _)| *g == group)
    }

    /// Records that `inode` changed for every member of `group` with a record; durable when
    /// this returns.
    pub fn note(&self, group: u32, inode: InodeId) -> std::io::Result<()> {
        let mut logs = self.logs();
        for ((g, _), log) in logs.iter_mut() {
            if *g != group || log.inodes.contains(&inode) {
                continue;
            }
            log.file.write_all(&inode.0.to_le_bytes())?;
            log.file.sync_data()?;
            log.inodes.insert(inode);
        }
        Ok(())
    }

    /// What `member` of `group` missed, if recorded.
    pub fn recorded(&self, group: u32, member: u32) -> Option<Vec<InodeId>> {
        self.logs()
            .get(&(group, member))
            .map(|log| log.inodes.iter().copied().collect())
    }

    /// Drops the record of `member` of `group`.
    pub fn forget(&self, group: u32, member: u32) {
        if let Some(log) = self.logs().remove(&(group, member)) {
            let _ = std::fs::remove_file(&log.path);
        }
    }

    /// Drops every record of `group` (this server is no longer its primary).
    pub fn forget_group(&self, group: u32) {
        let members: Vec<u32> = self
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

    // Goal: what a member missed survives a restart of its primary, each object once, and is
    // gone once forgotten.
    #[test]
    fn records_survive_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let logs = MissedLogs::default();
        logs.start(dir.path(), 2, 7).expect("start");
        for inode in [5, 3, 5, 9] {
            logs.note(2, InodeId(inode)).expect("note");
        }
        logs.note(3, InodeId(1))
            .expect("another group has no record");
        let reloaded = MissedLogs::default();
        reloaded.load(dir.path()).expect("load");
        assert_eq!(
            reloaded.recorded(2, 7),
            Some(vec![InodeId(3), InodeId(5), InodeId(9)])
        );
        assert_eq!(reloaded.recorded(3, 7), None);
        reloaded.forget(2, 7);
        let again = MissedLogs::default();
        again.load(dir.path()).expect("load");
        assert_eq!(again.recorded(2, 7), None);
    }
}
