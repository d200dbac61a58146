//! Egress that means the internet only, on the local backend.
//!
//! slirp4netns gives a sandbox egress through ordinary sockets of a process on the
//! host, so without more the sandbox reaches whatever the host reaches: private
//! networks, the cloud's metadata service at 169.254.169.254, and the host's own
//! non-loopback addresses (its services listening on 0.0.0.0). slirp4netns itself can
//! only refuse the host's loopback (`--disable-host-loopback`); it has no destination
//! filter, and seccomp cannot read the address behind `connect`'s pointer.
//!
//! So the filter sits in the sandbox's own network namespace: an nftables table whose
//! output hook rejects every packet to a denied range ([`crate::egress`]) or to one of
//! the host's own addresses, unless the operator allowed it. It is loaded after
//! `runc create` and before slirp4netns attaches and the sandbox's first process runs,
//! so no packet leaves before it. Why it holds against hostile code in the sandbox:
//! - changing rules or routes needs `CAP_NET_ADMIN`, which the sandbox does not have
//!   (Docker's default set), and a user namespace that would give it is refused by
//!   seccomp;
//! - every IP packet the sandbox sends, raw (`CAP_NET_RAW`: `SOCK_RAW`, `IP_HDRINCL`)
//!   or not, passes the output hook; only packet sockets (`AF_PACKET`) write frames
//!   to `tap0` below it, and seccomp refuses them (see `seccomp`);
//! - slirp4netns' own addresses are handled first: 10.0.2.3 is its DNS forwarder and
//!   any port there reaches the host's name server at that port, so only port 53 is
//!   let through; 10.0.2.2 is the host's loopback (already refused by slirp4netns
//!   unless the sandbox was created with host loopback).
//!
//! Rejections answer at once (ICMP administratively prohibited, a TCP reset), so a
//! connect fails fast and says nothing about what is behind the address.

use std::io::{self, Write};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::egress::{denied, EgressPolicy, IpNet};

/// The address slirp4netns' DNS forwarder answers on in the sandbox.
const SLIRP_DNS: &str = "10.0.2.3";
/// slirp4netns' address for the host's loopback.
const SLIRP_HOST: &str = "10.0.2.2";
/// slirp4netns' network.
const SLIRP_NET: &str = "10.0.2.0/24";

/// Why the filter could not be loaded. A sandbox without it is not started.
#[derive(Debug, thiserror::Error)]
#[error("cannot load the egress filter with {binary}: {reason} (install nftables for sandboxes with egress)")]
pub struct FirewallError {
    /// The nft binary.
    pub binary: String,
    /// What failed.
    pub reason: String,
}

/// The `nft -f` script of a sandbox's filter.
pub fn ruleset(policy: &EgressPolicy, host: &[IpAddr], allow_host_loopback: bool) -> String {
    let mut rules = vec![
        "oifname \"lo\" accept".to_string(),
        format!("ip daddr {SLIRP_DNS} udp dport 53 accept"),
        format!("ip daddr {SLIRP_DNS} tcp dport 53 accept"),
    ];
    if allow_host_loopback {
        rules.push(format!("ip daddr {SLIRP_HOST} accept"));
    }
    rules.push(reject(&SLIRP_NET.parse().unwrap_or_default()));
    // Allowed ranges first: the operator's word wins over the defaults.
    rules.extend(policy.allow.iter().map(accept));
    rules.extend(denied().iter().map(reject));
    rules.extend(host.iter().map(|ip| reject(&IpNet::from(*ip))));
    let mut script = String::from(
        "table inet orchard_egress {\n  chain out {\n    \
         type filter hook output priority 0; policy accept;\n",
    );
    for rule in rules {
        script.push_str("    ");
        script.push_str(&rule);
        script.push('\n');
    }
    script.push_str("  }\n}\n");
    script
}

fn family(net: &IpNet) -> &'static str {
    match net {
        IpNet::V4(_) => "ip",
        IpNet::V6(_) => "ip6",
    }
}

fn accept(net: &IpNet) -> String {
    format!("{} daddr {net} accept", family(net))
}

fn reject(net: &IpNet) -> String {
    // A TCP reset for TCP (a connect fails with "connection refused" at once), ICMP
    // "administratively prohibited" for the rest.
    let f = family(net);
    format!(
        "{f} daddr {net} meta l4proto tcp reject with tcp reset\n    \
         {f} daddr {net} reject with icmpx admin-prohibited"
    )
}

/// The host's own addresses (every interface's, as this process sees them), which a
/// sandbox must not reach through slirp4netns. Loopback is left out: slirp4netns
/// refuses it already and 127/8 is denied anyway.
pub fn host_addresses() -> io::Result<Vec<IpAddr>> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list freed below by freeifaddrs; every
    // node and address is only read while the list is alive.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut node = head;
        while !node.is_null() {
            let addr = (*node).ifa_addr;
            if !addr.is_null() {
                match i32::from((*addr).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(addr as *const libc::sockaddr_in);
                        out.push(IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes()));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(addr as *const libc::sockaddr_in6);
                        out.push(IpAddr::from(sin6.sin6_addr.s6_addr));
                    }
                    _ => {}
                }
            }
            node = (*node).ifa_next;
        }
        libc::freeifaddrs(head);
    }
    out.retain(|ip| !ip.is_loopback());
    out.sort();
    out.dedup();
    Ok(out)
}

/// Loads `script` with `nft -f -` inside the network namespace of `pid`.
pub fn load(nft: &Path, pid: i32, script: &str) -> Result<(), FirewallError> {
    let fail = |reason: String| FirewallError {
        binary: nft.display().to_string(),
        reason,
    };
    let ns: OwnedFd = std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .map_err(|e| fail(format!("opening the network namespace of {pid}: {e}")))?
        .into();
    let ns_fd = ns.as_raw_fd();
    let mut cmd = Command::new(nft);
    cmd.args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: only setns, a plain system call, runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(ns_fd, libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| fail(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| fail(format!("writing the rules: {e}")))?;
    }
    let out = child.wait_with_output().map_err(|e| fail(e.to_string()))?;
    drop(ns);
    if !out.status.success() {
        return Err(fail(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Loads the filter of a sandbox whose init is `pid`: the host's addresses as this
/// process sees them, `policy`'s allowed ranges, into the sandbox's namespace.
pub async fn install(
    nft: &Path,
    policy: &EgressPolicy,
    pid: i32,
    allow_host_loopback: bool,
) -> Result<(), FirewallError> {
    let fail = |reason: String| FirewallError {
        binary: nft.display().to_string(),
        reason,
    };
    let host = host_addresses().map_err(|e| fail(format!("listing the host's addresses: {e}")))?;
    let script = ruleset(policy, &host, allow_host_loopback);
    let nft_owned = nft.to_path_buf();
    tokio::task::spawn_blocking(move || load(&nft_owned, pid, &script))
        .await
        .map_err(|e| fail(format!("the loading task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ruleset_lets_dns_and_allowed_ranges_through_and_rejects_the_rest_in_order() {
        let policy = EgressPolicy::parse(&["10.1.0.0/16"]).unwrap();
        let host: Vec<IpAddr> = vec!["192.0.2.2".parse().unwrap(), "fd00::2".parse().unwrap()];
        let script = ruleset(&policy, &host, false);
        let at = |needle: &str| {
            script
                .find(needle)
                .unwrap_or_else(|| panic!("{needle} missing:\n{script}"))
        };
        assert!(at("udp dport 53 accept") < at("ip daddr 10.0.2.0/24 meta l4proto tcp reject"));
        assert!(at("ip daddr 10.1.0.0/16 accept") < at("ip daddr 10.0.0.0/8 reject"));
        at("ip daddr 169.254.0.0/16 reject with icmpx admin-prohibited");
        at("ip daddr 192.0.2.2/32 meta l4proto tcp reject with tcp reset");
        at("ip6 daddr fd00::2/128 reject");
        at("ip6 daddr fe80::/10 reject");
        assert!(!script.contains("10.0.2.2 accept"));
        assert!(ruleset(&policy, &host, true).contains("ip daddr 10.0.2.2 accept"));
    }

    #[test]
    fn host_addresses_leave_out_loopback() {
        let addrs = host_addresses().unwrap();
        assert!(addrs.iter().all(|ip| !ip.is_loopback()), "{addrs:?}");
    }
}
