//! Mounting: stale-mount detection, the FUSE session on its own threads, and clean unmount.

use super::WeftFs;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Why a mount failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MountError {
    /// The mount point does not exist or is not a directory.
    #[error(
        "mount point {0} does not exist or is not a directory: create it first (mkdir -p {0})"
    )]
    NoMountPoint(String),
    /// Something is already mounted there and answering.
    #[error("{0} is already a mounted file system: unmount it first (umount {0})")]
    AlreadyMounted(String),
    /// The kernel refused the mount.
    #[error("cannot mount at {path}: {source}")]
    Mount {
        /// The mount point.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// The file systems mounted now, from /proc/mounts: (source, mount point, type).
pub fn mounted_file_systems() -> Vec<(String, PathBuf, String)> {
    mounts(|_| true)
}

/// The source a mount of the cluster whose management is at `mgmt` shows (`weft@ADDRESS`). A
/// management on several rails has a comma-separated address; mount options are
/// comma-separated too (fusermount would split the name), so its commas are shown as `+`.
pub fn source_of(mgmt: &str) -> String {
    format!("weft@{}", mgmt.replace(',', "+"))
}

/// The management address of a mount whose source is `source` ([`source_of`]), if it is one
/// of Weft's.
pub fn mgmt_of(source: &str) -> Option<String> {
    source
        .strip_prefix("weft@")
        .map(|mgmt| mgmt.replace('+', ","))
}

/// The FUSE file systems mounted by this user or by root: what the admin commands may take a
/// management address from. A mount another user made (FUSE lets users mount with any
/// `fsname`) could point them at a server of its choosing.
pub fn trusted_fuse_mounts() -> Vec<(String, PathBuf, String)> {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() }.to_string();
    mounts(|options| {
        options
            .split(',')
            .find_map(|option| option.strip_prefix("user_id="))
            .is_some_and(|owner| owner == "0" || owner == me)
    })
}

/// Mounts whose options `keep` accepts: (source, target, type).
fn mounts(keep: impl Fn(&str) -> bool) -> Vec<(String, PathBuf, String)> {
    let text = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let source = fields.next()?;
            let target = fields.next()?;
            let kind = fields.next()?;
            if !keep(fields.next().unwrap_or_default()) {
                return None;
            }
            // /proc/mounts escapes spaces and a few other bytes as octal.
            let target = target
                .replace("\\040", " ")
                .replace("\\011", "\t")
                .replace("\\134", "\\");
            Some((source.to_string(), PathBuf::from(target), kind.to_string()))
        })
        .collect()
}

fn lazy_unmount(path: &Path) -> std::io::Result<()> {
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains a NUL byte")
    })?;
    // SAFETY: c_path is a valid NUL-terminated string for the duration of the call.
    let result = unsafe { libc::umount2(c_path.as_ptr(), libc::MNT_DETACH) };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Detaches a dead FUSE mount (its process was killed: the kernel answers ENOTCONN) at `path`.
/// Returns true when one was detached.
///
/// # Errors
/// The OS error when the stale mount cannot be detached.
pub fn detach_stale_mount(path: &Path) -> std::io::Result<bool> {
    // statfs always reaches the file system's process (a stat may be answered from the
    // kernel's attribute cache), so a dead one shows as ENOTCONN.
    let c_path = CString::new(path.as_os_str().as_bytes())?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: statvfs(3) writes the struct for a NUL-terminated path.
    let result = unsafe { libc::statvfs(c_path.as_ptr(), stats.as_mut_ptr()) };
    let outcome = if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    };
    match outcome {
        Err(error) if error.raw_os_error() == Some(libc::ENOTCONN) => {
            eprintln!(
                "weft: {} is a stale mount left by a process that died; detaching it",
                path.display()
            );
            lazy_unmount(path)?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// A mounted Weft file system; dropping it does not unmount, call [`Mounted::unmount`].
pub struct Mounted {
    mountpoint: PathBuf,
    unmounter: fuser::SessionUnmounter,
    session: Option<JoinHandle<std::io::Result<()>>>,
}

impl std::fmt::Debug for Mounted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mounted")
            .field("mountpoint", &self.mountpoint)
            .finish()
    }
}

/// Mounts `fs` at `mountpoint` with `default_permissions` and `allow_other`.
///
/// # Errors
/// [`MountError`] when the mount point is missing, busy, or the kernel refuses.
pub fn mount(
    fs: WeftFs,
    mountpoint: &Path,
    mgmt: &str,
    threads: usize,
) -> Result<Mounted, MountError> {
    let display = mountpoint.display().to_string();
    let _ = detach_stale_mount(mountpoint);
    if !mountpoint.is_dir() {
        return Err(MountError::NoMountPoint(display));
    }
    let canonical = mountpoint
        .canonicalize()
        .unwrap_or_else(|_| mountpoint.to_path_buf());
    if mounted_file_systems()
        .iter()
        .any(|(_, target, _)| *target == canonical)
    {
        return Err(MountError::AlreadyMounted(display));
    }
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(source_of(mgmt)),
        fuser::MountOption::Subtype("weft".to_string()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoAtime,
    ];
    config.acl = fuser::SessionACL::All;
    config.n_threads = Some(threads.max(1));
    let state = Arc::clone(&fs.state);
    let mut session =
        fuser::Session::new(fs, &canonical, &config).map_err(|source| MountError::Mount {
            path: display.clone(),
            source,
        })?;
    let _ = state.notifier.set(session.notifier());
    let unmounter = session.unmount_callable();
    let thread = std::thread::Builder::new()
        .name("weft-fuse".into())
        .spawn(move || session.run())
        .map_err(|source| MountError::Mount {
            path: display,
            source,
        })?;
    Ok(Mounted {
        mountpoint: canonical,
        unmounter,
        session: Some(thread),
    })
}

impl Mounted {
    /// The mount point.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// True when the session ended (someone ran umount).
    pub fn is_finished(&self) -> bool {
        self.session.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Unmounts and waits for the session to end.
    ///
    /// # Errors
    /// The OS error of umount (for example EBUSY while a process works in the mount).
    pub fn unmount(mut self) -> std::io::Result<()> {
        if !self.is_finished() {
            if let Err(error) = self.unmounter.unmount() {
                // A busy mount is detached instead, so the process can still stop.
                eprintln!(
                    "weft: unmount of {} failed ({error}); detaching it",
                    self.mountpoint.display()
                );
                lazy_unmount(&self.mountpoint)?;
            }
        }
        if let Some(thread) = self.session.take() {
            let _ = thread.join();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a mount's source names management on every rail without a comma (fusermount
    // splits its options at commas), and the admin commands read the address back whole.
    #[test]
    fn a_source_names_every_rail_without_a_comma() {
        let mgmt = "10.1.0.2:7000,10.2.0.2:7000";
        let source = source_of(mgmt);
        assert!(!source.contains(','), "{source}");
        assert_eq!(mgmt_of(&source).as_deref(), Some(mgmt));
        assert_eq!(
            mgmt_of(&source_of("127.0.0.1:1")).as_deref(),
            Some("127.0.0.1:1")
        );
        assert_eq!(mgmt_of("tmpfs"), None);
    }
}
