//! File changes made as the image's user.
//!
//! The agent runs as root, and in an image with a `User` its commands run as that user
//! (`--user`). Code in the sandbox can plant a symbolic link (`/tmp/link -> /etc`) in a
//! directory it owns; a root agent writing `/tmp/link/passwd` for a client would
//! follow it and change a file the user could never touch. So every file the agent
//! creates, replaces, moves or removes on a client's behalf (write, mkdir, move,
//! remove, archive upload) is changed under the user's file-system identity: the
//! thread's fsuid, fsgid and supplementary groups become the user's for the call, the
//! kernel checks permissions as it would for the user's own commands (a link into
//! `/etc` leads to a refusal), and what is created belongs to the user. Reads stay
//! root's: they change nothing.
//!
//! The switch is per thread (`setfsuid`, `setfsgid` and the raw `setgroups` system
//! call all change only the calling thread's credentials; libc's `setgroups` would
//! change every thread), so [`run`] is called on a blocking thread and restores the
//! root identity before returning, by a guard that also runs on unwinding. Going from
//! fsuid 0 to the user's also drops the file-system capabilities (`CAP_DAC_OVERRIDE`,
//! `CAP_FOWNER`, `CAP_CHOWN`...) from the thread's effective set; going back restores
//! them.

use crate::spawn::{run_as, RunAs};

/// The thread's credentials before the switch.
struct Restore {
    gid: u32,
    groups: Vec<libc::gid_t>,
}

impl Drop for Restore {
    fn drop(&mut self) {
        // SAFETY: plain system calls on this thread's credentials, with a valid
        // pointer and length for the group list.
        unsafe {
            libc::setfsuid(0);
            libc::setfsgid(self.gid);
            libc::syscall(libc::SYS_setgroups, self.groups.len(), self.groups.as_ptr());
        }
    }
}

/// The thread's supplementary groups.
fn current_groups() -> Vec<libc::gid_t> {
    // SAFETY: getgroups with a zero size only counts; the second call gets a buffer of
    // that many entries.
    unsafe {
        let n = libc::getgroups(0, std::ptr::null_mut());
        if n <= 0 {
            return Vec::new();
        }
        let mut groups = vec![0; n as usize];
        let got = libc::getgroups(n, groups.as_mut_ptr());
        groups.truncate(got.max(0) as usize);
        groups
    }
}

/// Takes on `user`'s file-system identity on this thread until the guard drops.
fn switch(user: &RunAs) -> Restore {
    // SAFETY: getfsgid-by-setfsgid(-1) idiom: an invalid id changes nothing and
    // answers the current one.
    let gid = unsafe { libc::setfsgid(u32::MAX) } as u32;
    let restore = Restore {
        gid,
        groups: current_groups(),
    };
    let mut groups: Vec<libc::gid_t> = user.groups.clone();
    if !groups.contains(&user.gid) {
        groups.insert(0, user.gid);
    }
    // SAFETY: as in Restore::drop. The order matters: groups and fsgid while this
    // thread still has its capabilities, fsuid last.
    unsafe {
        libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr());
        libc::setfsgid(user.gid);
        libc::setfsuid(user.uid);
    }
    restore
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
