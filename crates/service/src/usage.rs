//! Space and inode usage of the file system holding a directory.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use weft_proto::messages::SpaceUsage;

/// statvfs(3) of the file system holding `path`.
///
/// # Errors
/// The OS error when `path` cannot be examined.
pub fn file_system_usage(path: &Path) -> std::io::Result<SpaceUsage> {
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains a NUL byte")
    })?;
    // SAFETY: statvfs is plain data, so all-zero bytes are a valid value to overwrite.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c_path is a valid NUL-terminated string and stat a valid, writable statvfs.
    let result = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fragment = stat.f_frsize;
    Ok(SpaceUsage {
        total_bytes: stat.f_blocks.saturating_mul(fragment),
        free_bytes: stat.f_bavail.saturating_mul(fragment),
        total_inodes: stat.f_files,
        free_inodes: stat.f_favail,
    })
}
