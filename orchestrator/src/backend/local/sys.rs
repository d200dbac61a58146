//! The mount syscalls the backend makes on the host, behind the [`Mounter`] trait: the
//! real one calls `mount(2)`/`umount2(2)`, the [`RecordingMounter`] only writes down what
//! was asked, so unit tests check "which mounts, with which flags" without root (the way
//! youki tests its rootfs code).

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use rustix::mount::{MountFlags, UnmountFlags};

/// One `mount(2)` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountRequest {
    /// Source (`"overlay"` for an overlay).
    pub source: String,
    /// Mount point.
    pub target: PathBuf,
    /// Filesystem type.
    pub fstype: String,
    /// `MS_*` flags.
    pub flags: libc::c_ulong,
    /// Filesystem options (`lowerdir=...,upperdir=...`).
    pub data: String,
}

/// How to unmount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnmountMode {
    /// Plain `umount2(target, 0)`: fails with `EBUSY` while the mount is in use.
    Normal,
    /// `MNT_DETACH`: gone from the mount table now, released when the last user leaves.
    Detach,
}

/// Mounts and unmounts on the host.
pub trait Mounter: Send + Sync {
    /// Performs `req`.
    fn mount(&self, req: &MountRequest) -> io::Result<()>;
    /// Unmounts `target`.
    fn unmount(&self, target: &Path, mode: UnmountMode) -> io::Result<()>;
}

fn cstring(s: &[u8]) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in path"))
}

/// The real syscalls.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealMounter;

impl Mounter for RealMounter {
    fn mount(&self, req: &MountRequest) -> io::Result<()> {
        let source = cstring(req.source.as_bytes())?;
        let target = cstring(req.target.as_os_str().as_bytes())?;
        let fstype = cstring(req.fstype.as_bytes())?;
        let data = cstring(req.data.as_bytes())?;
        // Every MS_* flag fits the 32 bits the system call reads.
        let flags = u32::try_from(req.flags)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "mount flags over 32 bits"))?;
        rustix::mount::mount(
            source.as_c_str(),
            target.as_c_str(),
            fstype.as_c_str(),
            MountFlags::from_bits_retain(flags),
            data.as_c_str(),
        )?;
        Ok(())
    }

    fn unmount(&self, target: &Path, mode: UnmountMode) -> io::Result<()> {
        let target = cstring(target.as_os_str().as_bytes())?;
        let flags = match mode {
            UnmountMode::Normal => UnmountFlags::empty(),
            UnmountMode::Detach => UnmountFlags::DETACH,
        };
        rustix::mount::unmount(target.as_c_str(), flags)?;
        Ok(())
    }
}

/// A recorded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountCall {
    /// A mount.
    Mount(MountRequest),
    /// An unmount.
    Unmount {
        /// Mount point.
        target: PathBuf,
        /// How.
        mode: UnmountMode,
    },
}

/// Records calls instead of making them; can pretend the next plain unmounts are busy.
#[derive(Debug, Default)]
pub struct RecordingMounter {
    calls: Mutex<Vec<MountCall>>,
    busy_unmounts: AtomicUsize,
}

impl RecordingMounter {
    /// A recorder where every call succeeds.
    pub fn new() -> Self {
        Self::default()
    }

    /// The next `n` plain unmounts fail with `EBUSY`.
    pub fn fail_unmounts_busy(&self, n: usize) {
        self.busy_unmounts.store(n, Ordering::SeqCst);
    }

    /// The calls so far.
    pub fn calls(&self) -> Vec<MountCall> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn record(&self, call: MountCall) {
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(call);
    }
}

impl Mounter for RecordingMounter {
    fn mount(&self, req: &MountRequest) -> io::Result<()> {
        self.record(MountCall::Mount(req.clone()));
        Ok(())
    }

    fn unmount(&self, target: &Path, mode: UnmountMode) -> io::Result<()> {
        self.record(MountCall::Unmount {
            target: target.to_path_buf(),
            mode,
        });
        if mode == UnmountMode::Normal
            && self
                .busy_unmounts
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        Ok(())
    }
}

/// Mount points (decoded) of this process's mount namespace, from `/proc/self/mountinfo`,
/// with their filesystem type.
pub fn mount_points() -> io::Result<Vec<(PathBuf, String)>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let point = fields.get(4)?;
            let dash = fields.iter().position(|f| *f == "-")?;
            let fstype = fields.get(dash + 1)?;
            Some((unescape_mountinfo(point), fstype.to_string()))
        })
        .collect())
}

/// Mount points at or under `dir` in our mount namespace.
pub fn mounts_under(dir: &Path) -> io::Result<Vec<PathBuf>> {
    Ok(mount_points()?
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| p.starts_with(dir))
        .collect())
}

/// Mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> PathBuf {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)) && d[0] <= b'3');
        if let (b'\\', Some(d)) = (bytes[i], octal) {
            out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        let p = |s: &str| PathBuf::from(s);
        assert_eq!(unescape_mountinfo("/a\\040b"), p("/a b"));
        assert_eq!(unescape_mountinfo("/plain"), p("/plain"));
        assert_eq!(unescape_mountinfo("/end\\"), p("/end\\"));
        assert_eq!(unescape_mountinfo("/x\\04"), p("/x\\04"));
        assert_eq!(unescape_mountinfo("/\\303\\251"), p("/é"));
    }

    #[test]
    fn the_recorder_fails_the_requested_number_of_plain_unmounts() {
        let m = RecordingMounter::new();
        m.fail_unmounts_busy(1);
        let p = Path::new("/x");
        assert_eq!(
            m.unmount(p, UnmountMode::Normal)
                .unwrap_err()
                .raw_os_error(),
            Some(libc::EBUSY)
        );
        m.unmount(p, UnmountMode::Normal).unwrap();
        assert_eq!(m.calls().len(), 2);
    }
}
