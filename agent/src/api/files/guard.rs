//! Where a client's read may lead: never through a `/proc` magic link, never into the
//! agent's own `/proc` entries.
//!
//! Reads run as the image's user (see [`crate::pid1::fsuser`]), and the kernel then refuses root-only
//! files. Two things it still lets through, because the reading thread belongs to the
//! agent itself: a process may always list its own `/proc/PID/fd` and follow its own
//! descriptors' magic links (`/proc/1/fd/1` is the agent's log on the host, outside the
//! sandbox's root), and may always pass the ptrace check on its own entries
//! (`/proc/1/maps`...). A link the sandbox plants to `/proc/1` would hand those to the
//! client. So every read path is first resolved here, with `openat2`:
//! `RESOLVE_NO_MAGICLINKS` refuses any magic link on the way (the final one too), and
//! a result on procfs under the agent's own process (PID 1, `self` and the agent's
//! threads all resolve to it) is refused unless it is one of the entries every process
//! may read ([`AGENT_ENTRIES_READABLE`]). This holds in root images too: root in the
//! sandbox has no `CAP_SYS_PTRACE` and cannot read those entries of the agent either. The caller then works on the descriptor,
//! not on the path again, where it can.

use std::fs::{File, Metadata};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use rustix::fs::{Mode, OFlags, ResolveFlags, CWD, PROC_SUPER_MAGIC};

/// Resolves `path` to an `O_PATH` descriptor, following a final symbolic link only when
/// `follow`. Refused (permission denied): a path through a magic link, or one that
/// lands in the agent's own `/proc` entries.
pub(super) fn resolve(path: &Path, follow: bool) -> io::Result<OwnedFd> {
    let mut flags = OFlags::PATH | OFlags::CLOEXEC;
    if !follow {
        flags |= OFlags::NOFOLLOW;
    }
    let fd = rustix::fs::openat2(CWD, path, flags, Mode::empty(), ResolveFlags::NO_MAGICLINKS)
        .map_err(|err| match err {
            // What RESOLVE_NO_MAGICLINKS answers for a magic link (also what a loop of
            // ordinary links answers: refused either way).
            rustix::io::Errno::LOOP => {
                refused("it goes through a /proc descriptor link or a loop of links")
            }
            err => io::Error::from(err),
        })?;
    if is_agents_own(&fd)? {
        return Err(refused("it is the agent's own process entry"));
    }
    Ok(fd)
}

/// Opens `path` for reading when it is a regular file: `Ok(Err(meta))` answers the
/// metadata of what is there instead. Resolved by [`resolve`], then opened from that
/// descriptor, so nothing swapped in between is read.
pub(super) fn open_regular(path: &Path) -> io::Result<Result<(File, Metadata), Metadata>> {
    let fd = resolve(path, true)?;
    let meta = File::from(fd.try_clone()?).metadata()?;
    if !meta.is_file() {
        return Ok(Err(meta));
    }
    // Reopening an O_PATH descriptor through /proc/self/fd checks the file's
    // permissions again, as this thread's (the user's) file-system identity.
    let file = File::open(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    Ok(Ok((file, meta)))
}

fn refused(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, format!("refused: {why}"))
}

/// Entries of the agent's own `/proc/PID` (and of its threads' `task/TID`) a client
/// may read: those any process of the sandbox may read too (world-readable, no ptrace
/// check), which clients use to watch the agent (its status, memory, OOM score). Every
/// other entry (`fd`, `fdinfo`, `maps`, `environ`, `mem`, `auxv`, `stack`...) is open
/// to the reading thread only because it is the agent's own, so it is refused.
const AGENT_ENTRIES_READABLE: &[&str] = &[
    "cgroup",
    "cmdline",
    "comm",
    "cpuset",
    "gid_map",
    "limits",
    "mountinfo",
    "mounts",
    "oom_adj",
    "oom_score",
    "oom_score_adj",
    "setgroups",
    "stat",
    "statm",
    "status",
    "uid_map",
];

/// Whether `fd` is on procfs under the agent's own process, in an entry other than
/// [`AGENT_ENTRIES_READABLE`] (the pid directory itself and `task/` may be listed).
fn is_agents_own(fd: &OwnedFd) -> io::Result<bool> {
    if rustix::fs::fstatfs(fd.as_fd())?.f_type != PROC_SUPER_MAGIC {
        return Ok(false);
    }
    // The descriptor's path as the kernel names it: pid directories by number, so
    // `self` and `thread-self` are already resolved.
    let at = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    let Ok(rest) = at.strip_prefix("/proc") else {
        // procfs mounted somewhere else: the sandbox cannot mount, so only the
        // runtime did that; refuse rather than guess.
        return Ok(true);
    };
    let parts: Vec<String> = rest
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let Some(first) = parts.first() else {
        return Ok(false);
    };
    if first.parse::<u32>().is_err() {
        return Ok(false);
    }
    // The agent's process and each of its threads (they have /proc/TID too).
    let own = *first == std::process::id().to_string()
        || Path::new("/proc/self/task").join(first).exists();
    Ok(own && !agent_entry_readable(&parts[1..]))
}

/// Whether `entry` (the path under an agent's `/proc/PID`) may be read by a client.
fn agent_entry_readable(entry: &[String]) -> bool {
    match entry {
        [] => true,
        [task] if task == "task" => true,
        [task, _tid, rest @ ..] if task == "task" => agent_entry_readable(rest),
        [name] => AGENT_ENTRIES_READABLE.contains(&name.as_str()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn own_proc_entries_and_magic_links_are_refused_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        let me = std::process::id();
        symlink(format!("/proc/{me}"), dir.path().join("me")).unwrap();
        symlink("/proc/self/fd", dir.path().join("fds")).unwrap();
        for bad in [
            format!("/proc/{me}/environ"),
            "/proc/self/maps".to_string(),
            "/proc/thread-self/environ".to_string(),
            "/proc/self/fd/0".to_string(),
            format!("{}/me/maps", dir.path().display()),
            format!("{}/me/task/{me}/fd", dir.path().display()),
            format!("{}/fds", dir.path().display()),
        ] {
            let err = resolve(Path::new(&bad), true).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{bad}: {err}");
        }
        // The link itself, not followed, is the caller's own file.
        resolve(&dir.path().join("me"), false).unwrap();
        resolve(Path::new("/proc/cpuinfo"), true).unwrap();
        // What every process of the sandbox may read of the agent stays readable.
        for good in ["/proc/self", "/proc/self/status", "/proc/self/task"] {
            resolve(Path::new(good), true).unwrap();
        }
        resolve(&dir.path().join("me/oom_score_adj"), true).unwrap();
        resolve(Path::new("/proc/thread-self/stat"), true).unwrap();
        resolve(Path::new("/proc"), true).unwrap();
        let (mut file, meta) = open_regular(&dir.path().join("f")).unwrap().unwrap();
        assert_eq!(meta.len(), 1);
        let mut text = String::new();
        std::io::Read::read_to_string(&mut file, &mut text).unwrap();
        assert_eq!(text, "x");
        assert!(open_regular(dir.path()).unwrap().unwrap_err().is_dir());
    }
}
