//! The seccomp filter of every sandbox: the kernel surface that code written by models
//! under training must not reach.
//!
//! Docker's default profile is the reference. It allows about 350 system calls by name
//! and refuses the rest; this filter takes the same decisions the other way round (allow
//! by default, refuse a list), which keeps new, harmless system calls of newer C
//! libraries working on this older kernel while refusing everything Docker refuses for
//! a container with Docker's default capabilities:
//! - **kernel keyrings** (`add_key`, `keyctl`, `request_key`): keyrings are not
//!   namespaced, so one sandbox could read or replace another's (or the host's) keys;
//! - **user namespaces**: `unshare` and `clone` with `CLONE_NEWUSER`, and `clone3`
//!   (its flags sit behind a pointer no filter can read; it answers `ENOSYS`, so C
//!   libraries fall back to `clone`, where the flags are checked). A user namespace
//!   would hand the sandbox `CAP_SYS_ADMIN` over new mount namespaces: tmpfs, overlay
//!   and cgroup mounts, and the kernel code behind them;
//! - **kernel attack surface with a history**: `bpf`, `perf_event_open`, `io_uring_*`,
//!   `userfaultfd`, the new mount API (`fsopen`, `fsmount`, `open_tree`, ...);
//! - **host-wide state** even root in a container must not touch: modules, `kexec`,
//!   clocks, swap, `reboot`, `acct`, quotas, `syslog`, `setns`, `mount`, `pivot_root`,
//!   file handles (`open_by_handle_at`: the "shocker" escape).
//!
//! - **packet sockets** (`socket(AF_PACKET)`, and the 32-bit `socketcall` that hides
//!   its arguments): they would send frames beneath the egress filter.
//!
//! Refused calls fail with `EPERM` (as under Docker), never kill the process, so
//! programs that probe a feature (libuv's io_uring, glibc's clone3) fall back.

use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArgBuilder, LinuxSeccompBuilder,
    LinuxSeccompOperator, LinuxSyscall, LinuxSyscallBuilder,
};

/// `CLONE_NEWUSER` from `<linux/sched.h>`.
const CLONE_NEWUSER: u64 = 0x1000_0000;
/// `AF_PACKET` from `<linux/socket.h>`.
const AF_PACKET: u64 = 17;
/// `EPERM`.
const EPERM: u32 = 1;
/// `ENOSYS`.
const ENOSYS: u32 = 38;

/// Refused whatever their arguments (the names libseccomp knows on x86_64).
pub const REFUSED: &[&str] = &[
    // Keyrings: not namespaced.
    "add_key",
    "keyctl",
    "request_key",
    // Kernel surface.
    "bpf",
    "perf_event_open",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "userfaultfd",
    "lookup_dcookie",
    "kcmp",
    // Mounts and namespaces (only reachable with CAP_SYS_ADMIN, which a user namespace
    // would give).
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "setns",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "open_by_handle_at",
    "name_to_handle_at",
    // Host-wide state.
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "query_module",
    "get_kernel_syms",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "syslog",
    "quotactl",
    "quotactl_fd",
    "nfsservctl",
    "iopl",
    "ioperm",
    "uselib",
    "_sysctl",
    "sysfs",
    "ustat",
    // The 32-bit multiplexer of the socket calls: its arguments sit behind a pointer,
    // so the packet-socket rule below could not see them. 32-bit programs use the
    // direct calls (socket, connect...) on every kernel since 4.3.
    "socketcall",
];

fn rule(names: &[&str], errno: u32) -> Result<LinuxSyscall, oci_spec::OciSpecError> {
    LinuxSyscallBuilder::default()
        .names(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
        .action(LinuxSeccompAction::ScmpActErrno)
        .errno_ret(errno)
        .build()
}

/// A rule refusing `name` when its first argument has `CLONE_NEWUSER` set.
fn refuse_new_user_ns(name: &str) -> Result<LinuxSyscall, oci_spec::OciSpecError> {
    LinuxSyscallBuilder::default()
        .names(vec![name.to_string()])
        .action(LinuxSeccompAction::ScmpActErrno)
        .errno_ret(EPERM)
        .args(vec![LinuxSeccompArgBuilder::default()
            .index(0usize)
            .value(CLONE_NEWUSER)
            .value_two(CLONE_NEWUSER)
            .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
            .build()?])
        .build()
}

/// A rule refusing `socket` for packet sockets: with `CAP_NET_RAW` they write whole
/// frames to `tap0` beneath the egress filter's output hook (see `egress`), so a
/// sandbox could reach the addresses the filter refuses. Raw IP sockets still work
/// (`ping`): their packets pass the hook.
fn refuse_packet_sockets() -> Result<LinuxSyscall, oci_spec::OciSpecError> {
    LinuxSyscallBuilder::default()
        .names(vec!["socket".to_string()])
        .action(LinuxSeccompAction::ScmpActErrno)
        .errno_ret(EPERM)
        .args(vec![LinuxSeccompArgBuilder::default()
            .index(0usize)
            .value(AF_PACKET)
            .op(LinuxSeccompOperator::ScmpCmpEq)
            .build()?])
        .build()
}

/// The filter. `user_namespaces` lets an operator who needs them (nested container
/// builds) allow `CLONE_NEWUSER` and `clone3` again; everything else stays refused.
pub fn profile(user_namespaces: bool) -> Result<LinuxSeccomp, oci_spec::OciSpecError> {
    let mut syscalls = vec![rule(REFUSED, EPERM)?, refuse_packet_sockets()?];
    if !user_namespaces {
        syscalls.push(refuse_new_user_ns("unshare")?);
        syscalls.push(refuse_new_user_ns("clone")?);
        syscalls.push(rule(&["clone3"], ENOSYS)?);
    }
    LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActAllow)
        // 32-bit and x32 entry points are filtered too: their own syscall numbers
        // would otherwise pass unfiltered.
        .architectures(vec![
            Arch::ScmpArchX86_64,
            Arch::ScmpArchX86,
            Arch::ScmpArchX32,
        ])
        .syscalls(syscalls)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyrings_bpf_io_uring_and_user_namespaces_are_refused() {
        let p = serde_json::to_value(profile(false).unwrap()).unwrap();
        assert_eq!(p["defaultAction"], "SCMP_ACT_ALLOW");
        let rules = p["syscalls"].as_array().unwrap();
        let names: Vec<&str> = rules[0]["names"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        for call in [
            "keyctl",
            "add_key",
            "bpf",
            "perf_event_open",
            "io_uring_setup",
        ] {
            assert!(names.contains(&call), "{call}");
        }
        assert_eq!(rules[0]["errnoRet"], EPERM);
        assert_eq!(rules[1]["names"][0], "socket");
        assert_eq!(rules[1]["args"][0]["value"], AF_PACKET);
        let unshare = &rules[2];
        assert_eq!(unshare["names"][0], "unshare");
        assert_eq!(unshare["args"][0]["op"], "SCMP_CMP_MASKED_EQ");
        assert_eq!(unshare["args"][0]["value"], CLONE_NEWUSER);
        assert_eq!(unshare["args"][0]["valueTwo"], CLONE_NEWUSER);
        assert_eq!(rules[4]["names"][0], "clone3");
        assert_eq!(rules[4]["errnoRet"], ENOSYS);
    }

    #[test]
    fn an_operator_may_allow_user_namespaces() {
        let p = serde_json::to_value(profile(true).unwrap()).unwrap();
        assert_eq!(p["syscalls"].as_array().unwrap().len(), 2);
    }
}
