//! The OCI runtime config (`config.json`) of a sandbox, built with the `oci-spec` crate.
//!
//! What it holds and why:
//! - PID 1 is the agent from the read-only injected volume (`/.orchard`), serving on a
//!   Unix socket the backend bound on the host and handed over as fd 3 (`--listen-fd 3`):
//!   no path of it exists in the sandbox, so sandbox code cannot replace or redirect
//!   it. The token comes in `ORCHARD_AGENT_TOKEN` (the agent removes it from its own
//!   environment, so commands never see it).
//! - The agent runs as root (it must bind its socket and serve files anywhere) and runs
//!   commands as the image's user (`--user`), which is also recorded in the annotations
//!   (`org.orchard.image.user`, `org.orchard.image.user.resolved`).
//! - The image's Env and WorkingDir are the agent's, which its commands inherit.
//! - A writable root (the overlay) and a tmpfs `/tmp`; `/proc`, `/dev`, `/dev/pts`,
//!   `/dev/shm` (64 MiB), `/dev/mqueue`, `/sys` (read-only) and the masked and read-only
//!   paths of runc's default spec; the runtime's `/etc/hosts`, `/etc/hostname` and
//!   `/etc/resolv.conf` bound over the image's (see `runtime_files`).
//! - Namespaces: pid, mount, ipc, uts, cgroup and network (the network namespace has only
//!   `lo` unless slirp4netns is attached).
//! - Docker's default capability set, `no_new_privileges`, no devices but runc's defaults.
//! - Limits: CPU quota over a 100 ms period, memory with memory+swap equal to it (no
//!   swap), pids, `RLIMIT_NOFILE`.

use std::collections::HashMap;
use std::path::Path;

use oci_spec::runtime::{
    get_default_maskedpaths, get_default_mounts, get_default_readonly_paths, Capability, Linux,
    LinuxBuilder, LinuxCapabilitiesBuilder, LinuxCpuBuilder, LinuxDeviceCgroupBuilder,
    LinuxMemoryBuilder, LinuxNamespaceBuilder, LinuxNamespaceType, LinuxPidsBuilder,
    LinuxResourcesBuilder, Mount, MountBuilder, PosixRlimitBuilder, PosixRlimitType, Process,
    ProcessBuilder, RootBuilder, Spec, SpecBuilder, UserBuilder,
};

/// Where the injected volume is mounted in every sandbox.
pub const INJECT_MOUNT: &str = "/.orchard";
/// The agent inside the sandbox.
pub const AGENT_IN_SANDBOX: &str = "/.orchard/bin/orchard-agent";
/// Where the harness tools are mounted read-only, as Orchard mounts them (their `bin/`
/// is appended to PATH; the agent adds `/usr/local/bin` shims and a profile entry).
pub const TOOLS_MOUNT: &str = "/opt/sandbox-tools";
/// The descriptor the agent's listening socket has in the sandbox: runc's stdin, which
/// runc passes through to the init (see `runc.rs`; the agent moves it off fd 0).
pub const LISTEN_FD: &str = "0";
/// CFS period of the CPU quota, in microseconds.
pub const CPU_PERIOD_US: u64 = 100_000;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The oci-spec builder refused a value.
    #[error("building the OCI runtime config: {0}")]
    Build(#[from] oci_spec::OciSpecError),
    /// A limit is out of range.
    #[error("invalid limit: {0}")]
    Limit(String),
    /// The config could not be written.
    #[error("writing {path}: {reason}")]
    Write {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}

/// Resource limits of the sandbox as the runtime applies them.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ResourceLimits {
    /// CPU cores (quota = cores × period).
    pub cpus: Option<f64>,
    /// Memory in bytes, swap excluded.
    pub memory_bytes: Option<u64>,
    /// Whether the kernel accounts swap (memory.memsw.*): only then is memory+swap set.
    pub swap_accounting: bool,
    /// Maximum number of processes (threads included).
    pub pids: Option<u64>,
    /// `/tmp` size in bytes.
    pub tmp_bytes: Option<u64>,
    /// `RLIMIT_NOFILE`, soft and hard.
    pub nofile: u64,
}

/// Everything the config is made from.
#[derive(Debug, Clone)]
pub struct SpecInput<'a> {
    /// Hostname of the sandbox.
    pub hostname: &'a str,
    /// Arguments of the agent after `--listen-fd 3`.
    pub agent_args: &'a [String],
    /// The agent's environment, token included.
    pub env: Vec<String>,
    /// The agent's (and its commands') working directory.
    pub cwd: &'a str,
    /// Host directory of the injected volume.
    pub inject_dir: &'a Path,
    /// Relative cgroups path (see `cgroup`).
    pub cgroups_path: &'a str,
    /// Limits.
    pub limits: ResourceLimits,
    /// Annotations (labels).
    pub annotations: HashMap<String, String>,
    /// Let the sandbox make user namespaces (off by default: see `seccomp`).
    pub user_namespaces: bool,
    /// The injected volume holds the harness tools (`harness/`): mount them at
    /// [`TOOLS_MOUNT`] and have the agent publish them.
    pub tools: bool,
    /// The runtime's files, bind-mounted over the image's paths (see `runtime_files`).
    pub runtime_files: &'a [super::runtime_files::RuntimeFile],
    /// The CPU weight the sandbox starts with; `None` when its cgroup was made idle
    /// beforehand (`cgroup::start_idle`), where the kernel refuses any weight.
    pub starting_shares: Option<u64>,
}

/// Docker's default capability set.
pub fn docker_capabilities() -> Vec<Capability> {
    vec![
        Capability::Chown,
        Capability::DacOverride,
        Capability::Fsetid,
        Capability::Fowner,
        Capability::Mknod,
        Capability::NetRaw,
        Capability::Setgid,
        Capability::Setuid,
        Capability::Setfcap,
        Capability::Setpcap,
        Capability::NetBindService,
        Capability::SysChroot,
        Capability::Kill,
        Capability::AuditWrite,
    ]
}

fn cpu_quota(cpus: f64) -> Result<i64, SpecError> {
    if !cpus.is_finite() || !(0.01..=1024.0).contains(&cpus) {
        return Err(SpecError::Limit(format!(
            "cpus must be between 0.01 and 1024, got {cpus}"
        )));
    }
    // The kernel's smallest quota is 1 ms.
    Ok(((cpus * CPU_PERIOD_US as f64).round() as i64).max(1000))
}

fn i64_limit(what: &str, v: u64) -> Result<i64, SpecError> {
    i64::try_from(v).map_err(|_| SpecError::Limit(format!("{what} {v} is too large")))
}

/// A read-only bind mount of the host's `source` at `destination`, without setuid
/// files or devices.
fn read_only_bind(destination: &str, source: &Path) -> Result<oci_spec::runtime::Mount, SpecError> {
    Ok(MountBuilder::default()
        .destination(destination)
        .typ("bind")
        .source(source)
        .options(vec![
            "bind".to_string(),
            "ro".into(),
            "nosuid".into(),
            "nodev".into(),
        ])
        .build()?)
}

/// Builds the runtime config.
pub fn build(input: &SpecInput) -> Result<Spec, SpecError> {
    let process = process(input)?;
    let mounts = mounts(input)?;
    let linux = linux(input)?;
    Ok(SpecBuilder::default()
        .version("1.0.2-dev")
        .hostname(input.hostname)
        .root(
            RootBuilder::default()
                .path("rootfs")
                .readonly(false)
                .build()?,
        )
        .process(process)
        .mounts(mounts)
        .linux(linux)
        .annotations(input.annotations.clone())
        .build()?)
}

/// The config's process: the agent, as root, with Docker's capabilities.
fn process(input: &SpecInput) -> Result<Process, SpecError> {
    let mut args = vec![
        AGENT_IN_SANDBOX.to_string(),
        "--listen-fd".into(),
        LISTEN_FD.into(),
    ];
    if input.tools {
        args.extend(["--publish-tools".to_string(), TOOLS_MOUNT.into()]);
    }
    args.extend(input.agent_args.iter().cloned());
    let caps: oci_spec::runtime::Capabilities = docker_capabilities().into_iter().collect();
    Ok(ProcessBuilder::default()
        .terminal(false)
        .user(UserBuilder::default().uid(0u32).gid(0u32).build()?)
        .args(args)
        .env(input.env.clone())
        .cwd(input.cwd)
        .no_new_privileges(true)
        .capabilities(
            LinuxCapabilitiesBuilder::default()
                .bounding(caps.clone())
                .effective(caps.clone())
                .permitted(caps)
                .inheritable(oci_spec::runtime::Capabilities::new())
                .ambient(oci_spec::runtime::Capabilities::new())
                .build()?,
        )
        .rlimits(vec![PosixRlimitBuilder::default()
            .typ(PosixRlimitType::RlimitNofile)
            .soft(input.limits.nofile)
            .hard(input.limits.nofile)
            .build()?])
        .build()?)
}

/// The config's mounts: the defaults, `/tmp`, the agent, the runtime files and the tools.
fn mounts(input: &SpecInput) -> Result<Vec<Mount>, SpecError> {
    let mut mounts = get_default_mounts();
    let mut tmp_options = vec!["nosuid".to_string(), "nodev".into(), "mode=1777".into()];
    if let Some(bytes) = input.limits.tmp_bytes {
        tmp_options.push(format!("size={bytes}"));
    }
    mounts.push(
        MountBuilder::default()
            .destination("/tmp")
            .typ("tmpfs")
            .source("tmpfs")
            .options(tmp_options)
            .build()?,
    );
    mounts.push(read_only_bind(INJECT_MOUNT, input.inject_dir)?);
    for file in input.runtime_files {
        // Writable, as Docker's and the kubelet's are: what is written stays in the
        // sandbox's own host file, on its disk.
        mounts.push(
            MountBuilder::default()
                .destination(file.destination())
                .typ("bind")
                .source(&file.source)
                .options(vec![
                    "bind".to_string(),
                    "nosuid".into(),
                    "nodev".into(),
                    "noexec".into(),
                ])
                .build()?,
        );
    }
    if input.tools {
        mounts.push(read_only_bind(
            TOOLS_MOUNT,
            &input.inject_dir.join("harness"),
        )?);
    }
    Ok(mounts)
}

/// The config's Linux part: namespaces, cgroup limits, seccomp and masked paths.
fn linux(input: &SpecInput) -> Result<Linux, SpecError> {
    let mut resources = LinuxResourcesBuilder::default().devices(vec![
        // Deny every device; runc then allows its defaults (null, zero, full, tty,
        // random, urandom, pts, ptmx).
        LinuxDeviceCgroupBuilder::default()
            .allow(false)
            .access("rwm")
            .build()?,
    ]);
    // A starting sandbox weighs little; the create restores the default weight once
    // it is ready (`cgroup::run_at_normal_priority`).
    let mut cpu = LinuxCpuBuilder::default();
    if let Some(shares) = input.starting_shares {
        cpu = cpu.shares(shares);
    }
    if let Some(cpus) = input.limits.cpus {
        cpu = cpu.quota(cpu_quota(cpus)?).period(CPU_PERIOD_US);
    }
    resources = resources.cpu(cpu.build()?);
    if let Some(bytes) = input.limits.memory_bytes {
        let limit = i64_limit("memory", bytes)?;
        let mut memory = LinuxMemoryBuilder::default().limit(limit);
        if input.limits.swap_accounting {
            memory = memory.swap(limit);
        }
        resources = resources.memory(memory.build()?);
    }
    if let Some(pids) = input.limits.pids {
        resources = resources.pids(
            LinuxPidsBuilder::default()
                .limit(i64_limit("pids", pids)?)
                .build()?,
        );
    }
    let namespaces = [
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Network,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Mount,
        LinuxNamespaceType::Cgroup,
    ]
    .into_iter()
    .map(|typ| LinuxNamespaceBuilder::default().typ(typ).build())
    .collect::<Result<Vec<_>, _>>()?;
    Ok(LinuxBuilder::default()
        .namespaces(namespaces)
        .resources(resources.build()?)
        .cgroups_path(input.cgroups_path)
        .seccomp(super::seccomp::profile(input.user_namespaces)?)
        .masked_paths(get_default_maskedpaths())
        .readonly_paths(get_default_readonly_paths())
        .build()?)
}

/// Writes `spec` as `path` (mode 0600: it holds the token).
pub fn write(spec: &Spec, path: &Path) -> Result<(), SpecError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |reason: String| SpecError::Write {
        path: path.display().to_string(),
        reason,
    };
    let bytes = serde_json::to_vec_pretty(spec).map_err(|e| err(e.to_string()))?;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(&bytes))
        .map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn input<'a>(limits: ResourceLimits, extra: &'a [String]) -> SpecInput<'a> {
        SpecInput {
            hostname: "sb-1",
            agent_args: extra,
            env: vec!["PATH=/bin".into(), "ORCHARD_AGENT_TOKEN=t".into()],
            cwd: "/workspace",
            inject_dir: Path::new("/var/lib/orchard/inject"),
            cgroups_path: "orchard-abc-sb-1",
            limits,
            annotations: HashMap::from([("org.orchard.sandbox.id".into(), "sb-1".into())]),
            user_namespaces: false,
            tools: false,
            runtime_files: &[],
            starting_shares: Some(super::super::cgroup::STARTING_CPU_SHARES),
        }
    }

    #[test]
    fn the_runtime_files_are_bound_writable_over_the_images_paths() {
        let files = [super::super::runtime_files::RuntimeFile {
            in_root: "etc/hosts".into(),
            source: "/sb/disk/etc/hosts".into(),
        }];
        let mut i = input(ResourceLimits::default(), &[]);
        i.runtime_files = &files;
        let v = serde_json::to_value(build(&i).unwrap()).unwrap();
        let mounts = v["mounts"].as_array().unwrap();
        let hosts = mounts
            .iter()
            .find(|m| m["destination"] == "/etc/hosts")
            .unwrap();
        assert_eq!(hosts["source"], "/sb/disk/etc/hosts");
        assert_eq!(hosts["type"], "bind");
        let opts = hosts["options"].as_array().unwrap();
        assert!(!opts.iter().any(|o| o == "ro"), "{opts:?}");
        let shm = mounts
            .iter()
            .find(|m| m["destination"] == "/dev/shm")
            .unwrap();
        assert!(
            shm["options"]
                .as_array()
                .unwrap()
                .iter()
                .any(|o| o == "size=65536k"),
            "/dev/shm is 64 MiB as Docker's: {shm}"
        );
    }

    fn json(limits: ResourceLimits) -> Value {
        serde_json::to_value(build(&input(limits, &[])).unwrap()).unwrap()
    }

    #[test]
    fn harness_tools_are_mounted_read_only_where_orchard_users_look() {
        let v = json(ResourceLimits::default());
        assert!(!v["process"]["args"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("--publish-tools")));
        let mut with = input(ResourceLimits::default(), &[]);
        with.tools = true;
        let v = serde_json::to_value(build(&with).unwrap()).unwrap();
        let args = v["process"]["args"].as_array().unwrap();
        assert_eq!(
            args[3..5],
            [
                serde_json::json!("--publish-tools"),
                serde_json::json!(TOOLS_MOUNT)
            ]
        );
        let mount = v["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == TOOLS_MOUNT)
            .expect("the tools mount");
        assert_eq!(mount["source"], "/var/lib/orchard/inject/harness");
        assert!(mount["options"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("ro")));
    }

    #[test]
    fn every_sandbox_gets_the_seccomp_filter() {
        let v = json(ResourceLimits::default());
        assert_eq!(v["linux"]["seccomp"]["defaultAction"], "SCMP_ACT_ALLOW");
        assert!(v["linux"]["seccomp"]["syscalls"][0]["names"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("keyctl")));
    }

    #[test]
    fn the_agent_is_pid_1_from_the_read_only_volume() {
        let extra = vec!["--workers".to_string(), "1".into()];
        let v = serde_json::to_value(build(&input(ResourceLimits::default(), &extra)).unwrap())
            .unwrap();
        let p = &v["process"];
        assert_eq!(
            p["args"],
            serde_json::json!([
                "/.orchard/bin/orchard-agent",
                "--listen-fd",
                "0",
                "--workers",
                "1"
            ])
        );
        assert_eq!(p["cwd"], "/workspace");
        assert_eq!(p["env"][1], "ORCHARD_AGENT_TOKEN=t");
        assert_eq!(
            (p["user"]["uid"].as_u64(), p["user"]["gid"].as_u64()),
            (Some(0), Some(0))
        );
        assert_eq!(p["noNewPrivileges"], true);
        assert_eq!(
            v["root"],
            serde_json::json!({"path": "rootfs", "readonly": false})
        );
        assert_eq!(v["hostname"], "sb-1");
        assert_eq!(v["annotations"]["org.orchard.sandbox.id"], "sb-1");
        let mounts = v["mounts"].as_array().unwrap();
        let find = |d: &str| {
            mounts
                .iter()
                .find(|m| m["destination"] == d)
                .unwrap()
                .clone()
        };
        let inject = find("/.orchard");
        assert_eq!(inject["source"], "/var/lib/orchard/inject");
        assert!(inject["options"].as_array().unwrap().contains(&"ro".into()));
        // Regression: the socket directory was mounted writable, so sandbox code could
        // replace its own agent. Nothing of the agent channel is mounted now.
        assert!(
            !mounts.iter().any(|m| m["destination"]
                .as_str()
                .is_some_and(|d| d.starts_with("/.orchard/"))),
            "{mounts:?}"
        );
        assert_eq!(find("/tmp")["type"], "tmpfs");
        assert!(find("/sys")["options"]
            .as_array()
            .unwrap()
            .contains(&"ro".into()));
        for d in ["/proc", "/dev", "/dev/pts", "/dev/shm"] {
            find(d);
        }
        assert!(v["linux"]["maskedPaths"]
            .as_array()
            .unwrap()
            .contains(&"/proc/kcore".into()));
        assert!(v["linux"]["readonlyPaths"]
            .as_array()
            .unwrap()
            .contains(&"/proc/sys".into()));
        let ns: Vec<&str> = v["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["type"].as_str().unwrap())
            .collect();
        assert_eq!(ns, ["pid", "network", "ipc", "uts", "mount", "cgroup"]);
        assert_eq!(v["linux"]["cgroupsPath"], "orchard-abc-sb-1");
    }

    #[test]
    fn capabilities_are_dockers_default_set() {
        let v = json(ResourceLimits::default());
        let mut caps: Vec<String> = v["process"]["capabilities"]["bounding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap().to_string())
            .collect();
        caps.sort();
        let mut want = [
            "CAP_AUDIT_WRITE",
            "CAP_CHOWN",
            "CAP_DAC_OVERRIDE",
            "CAP_FOWNER",
            "CAP_FSETID",
            "CAP_KILL",
            "CAP_MKNOD",
            "CAP_NET_BIND_SERVICE",
            "CAP_NET_RAW",
            "CAP_SETFCAP",
            "CAP_SETGID",
            "CAP_SETPCAP",
            "CAP_SETUID",
            "CAP_SYS_CHROOT",
        ];
        want.sort();
        assert_eq!(caps, want);
        assert_eq!(
            v["process"]["capabilities"]["inheritable"],
            serde_json::json!([])
        );
    }

    #[test]
    fn limits_become_cgroup_settings_and_rlimits() {
        let v = json(ResourceLimits {
            cpus: Some(0.5),
            memory_bytes: Some(64 << 20),
            swap_accounting: true,
            pids: Some(128),
            tmp_bytes: Some(1 << 30),
            nofile: 65536,
        });
        let r = &v["linux"]["resources"];
        assert_eq!(r["cpu"]["quota"], 50_000);
        assert_eq!(r["cpu"]["period"], 100_000);
        assert_eq!(r["memory"]["limit"], 64 << 20);
        assert_eq!(r["memory"]["swap"], 64 << 20);
        assert_eq!(r["pids"]["limit"], 128);
        assert_eq!(r["devices"][0]["allow"], false);
        assert_eq!(
            v["process"]["rlimits"][0],
            serde_json::json!({"type": "RLIMIT_NOFILE", "soft": 65536, "hard": 65536})
        );
        let tmp = v["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == "/tmp")
            .unwrap()
            .clone();
        assert!(tmp["options"]
            .as_array()
            .unwrap()
            .contains(&"size=1073741824".into()));
        let v = json(ResourceLimits {
            memory_bytes: Some(64 << 20),
            swap_accounting: false,
            ..ResourceLimits::default()
        });
        assert!(v["linux"]["resources"]["memory"].get("swap").is_none());
        let cpu = &v["linux"]["resources"]["cpu"];
        assert!(cpu.get("quota").is_none(), "{cpu}");
        assert_eq!(cpu["shares"], super::super::cgroup::STARTING_CPU_SHARES);
        // An idle cgroup takes no weight: runc writing one would fail the create.
        let idle = build(&SpecInput {
            starting_shares: None,
            ..input(ResourceLimits::default(), &[])
        })
        .unwrap();
        let idle = serde_json::to_value(&idle).unwrap();
        assert!(idle["linux"]["resources"]["cpu"].get("shares").is_none());
    }

    #[test]
    fn out_of_range_limits_are_refused() {
        for cpus in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = build(&input(
                ResourceLimits {
                    cpus: Some(cpus),
                    ..ResourceLimits::default()
                },
                &[],
            ))
            .unwrap_err();
            assert!(matches!(e, SpecError::Limit(_)), "{e}");
        }
        let e = build(&input(
            ResourceLimits {
                memory_bytes: Some(u64::MAX),
                ..ResourceLimits::default()
            },
            &[],
        ))
        .unwrap_err();
        assert!(matches!(e, SpecError::Limit(_)), "{e}");
    }
}
