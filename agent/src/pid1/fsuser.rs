//! File access made as the image's user.
//!
//! The agent runs as root, and in an image with a `User` its commands run as that user
//! (`--user`). Code in the sandbox can plant a symbolic link (`/tmp/link -> /etc`) in a
//! directory it owns; a root agent writing `/tmp/link/passwd` for a client would
//! follow it and change a file the user could never touch. So every file the agent
//! creates, replaces, moves or removes on a client's behalf (write, mkdir, move,
//! remove, archive upload) is changed under the user's file-system identity: the
//! thread's fsuid, fsgid and supplementary groups become the user's for the call, the
//! kernel checks permissions as it would for the user's own commands (a link into
//! `/etc` leads to a refusal), and what is created belongs to the user.
//!
//! Reads (read, stat, list, archive download) go the same way. A root read through a
//! planted link (`/workspace/k -> /root/.key`, or `-> /proc/1/environ`, the agent's
//! first environment, which held its token) would hand the client, and through it the
//! sandbox's code, what the user may not read. As the user, the kernel's own checks
//! refuse it: `/proc/1/*` of the root agent is root's and 0400 or 0500, and without
//! fsuid 0 the thread has no `CAP_DAC_OVERRIDE` or `CAP_DAC_READ_SEARCH` to pass them.
//! A file is opened as the user and then read from its descriptor anywhere.
//!
//! The switch is per thread (`setfsuid`, `setfsgid` and the raw `setgroups` system
//! call all change only the calling thread's credentials; libc's `setgroups` would
//! change every thread), so [`run`] is called on a blocking thread and restores the
//! root identity before returning, by a guard that also runs on unwinding. Going from
//! fsuid 0 to the user's also drops the file-system capabilities (`CAP_DAC_OVERRIDE`,
//! `CAP_FOWNER`, `CAP_CHOWN`...) from the thread's effective set; going back restores
//! them.

use rustix::process::Gid;

use super::user::{run_as, RunAs};

/// The thread's credentials before the switch.
struct Restore {
    gid: u32,
    groups: Vec<Gid>,
}

impl Drop for Restore {
    fn drop(&mut self) {
        // SAFETY: setfsuid and setfsgid (which rustix does not offer) take plain ids and
        // change only this thread's credentials.
        unsafe {
            libc::setfsuid(0);
            libc::setfsgid(self.gid);
        }
        let _ = rustix::thread::set_thread_groups(&self.groups);
    }
}

/// Takes on `user`'s file-system identity on this thread until the guard drops.
fn switch(user: &RunAs) -> Restore {
    // getgroups is the raw system call too: this thread's groups.
    let saved_groups = rustix::process::getgroups().unwrap_or_default();
    let mut groups: Vec<Gid> = user.groups.iter().map(|&g| Gid::from_raw(g)).collect();
    if !user.groups.contains(&user.gid) {
        groups.insert(0, Gid::from_raw(user.gid));
    }
    // The order matters: groups and fsgid while this thread still has its capabilities,
    // fsuid last. rustix's `set_thread_groups` is the raw system call: this thread only.
    let _ = rustix::thread::set_thread_groups(&groups);
    // SAFETY: as in Restore::drop. setfsgid(-1) is the getfsgid idiom: an invalid id
    // changes nothing and answers the current one.
    let gid = unsafe {
        let gid = libc::setfsgid(u32::MAX) as u32;
        libc::setfsgid(user.gid);
        libc::setfsuid(user.uid);
        gid
    };
    Restore {
        gid,
        groups: saved_groups,
    }
}

/// Runs `f` on this thread as the image's user when commands run as one (`--user`),
/// else as it is. Call it on a blocking thread, never across an `.await`.
pub fn run<T>(f: impl FnOnce() -> T) -> T {
    match run_as() {
        Some(user) if user.uid != 0 => {
            let _restore = switch(user);
            f()
        }
        _ => f(),
    }
}

/// [`run`] on tokio's blocking pool. It starts at once, not when awaited (as
/// `spawn_blocking`): an archive extraction must be running while its body is fed in
/// through a bounded channel.
pub fn blocking<T, F>(f: F) -> tokio::task::JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(move || run(f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_switched_thread_creates_as_the_user_is_refused_as_the_user_and_switches_back() {
        // Only root can switch; elsewhere the test says so and passes.
        orchard_test_support::require_root!("to switch file-system ids");
        let dir = tempfile::tempdir().unwrap();
        let root_only = dir.path().join("root-only");
        std::fs::create_dir(&root_only).unwrap();
        std::fs::set_permissions(
            &root_only,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let user = RunAs {
            uid: 4242,
            gid: 4243,
            groups: vec![4244],
        };
        std::thread::scope(|s| {
            s.spawn(|| {
                let (denied, made) = {
                    let _restore = switch(&user);
                    (
                        std::fs::write(root_only.join("x"), b"x"),
                        std::fs::write(open.join("mine"), b"x"),
                    )
                };
                assert_eq!(
                    denied.unwrap_err().kind(),
                    std::io::ErrorKind::PermissionDenied
                );
                made.unwrap();
                let meta = std::fs::metadata(open.join("mine")).unwrap();
                assert_eq!((meta.uid(), meta.gid()), (4242, 4243));
                // Back to root: the same write succeeds.
                std::fs::write(root_only.join("x"), b"x").unwrap();
            })
            .join()
            .unwrap();
        });
    }
}
