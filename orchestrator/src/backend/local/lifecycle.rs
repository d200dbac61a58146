//! A sandbox's life on the host: create (directories, overlay, config, `runc create`,
//! network, `runc start`, wait for the agent), delete (kill, reap, remove cgroups,
//! unmount, remove), recovery of what a previous backend process left, and destroy.
//!
//! Teardown works from whatever exists, with or without a state file, so the same code
//! removes a healthy sandbox, a half-created one and the remains of a crash.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use orchard_client::{AgentClient, Endpoint};

use crate::backend::local::error::io_err;
use crate::backend::local::error::LocalError;
use crate::backend::local::inner::{Entry, Inner, Paths};
use crate::backend::local::limits::Limits;
use crate::backend::local::network::NetworkMode;
use crate::backend::local::process::{Liveness, ProcRef};
use crate::backend::local::request::{build_env, valid_hostname, validate_labels};
use crate::backend::local::request::{
    valid_id, FailPoint, RecoverReport, SandboxInfo, SandboxSpec,
};
use crate::backend::local::spec::ResourceLimits;
use crate::backend::local::state::{self, Phase, SandboxState};
use crate::backend::local::ANNOTATION_PREFIX;
use crate::backend::local::{
    audit, cgroup, diskpool, egress, network, rootfs, runc, runtime_files, spec,
};

/// Longest Unix socket path (`sun_path` holds 108 bytes with the NUL).
const MAX_SOCKET_PATH: usize = 107;
/// How long delete waits for a process to die after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// How long recovery gives an agent to answer before calling its sandbox broken.
const RECOVER_HEALTH_LIMIT: Duration = Duration::from_secs(3);

impl Inner {
    /// Checks the request, reserves the id, creates; on failure removes what was made.
    pub(super) async fn create(
        self: &Arc<Self>,
        spec: SandboxSpec,
    ) -> Result<SandboxInfo, LocalError> {
        let id = match &spec.id {
            Some(id) => id.clone(),
            None => format!("sb-{}", crate::random::hex(6)?),
        };
        if !valid_id(&id) {
            return Err(LocalError::InvalidId(id));
        }
        let hostname = spec
            .hostname
            .clone()
            .unwrap_or_else(|| id.replace(['_', '.'], "-"));
        if !valid_hostname(&hostname) {
            return Err(LocalError::Invalid(format!(
                "hostname {hostname:?}: use 1-63 letters, digits and '-'"
            )));
        }
        let limits = spec.limits.or(self.config.default_limits);
        limits.validate()?;
        validate_labels(&spec.labels)?;
        let paths = self.paths(&id);
        if paths.socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(LocalError::Invalid(format!(
                "the agent socket {} would be longer than {MAX_SOCKET_PATH} bytes: use a \
                 shorter backend root",
                paths.socket.display()
            )));
        }
        {
            let mut table = self.lock_table();
            // Checked under the table's lock, which the shutdown takes to look for
            // creates in flight: a create either shows there or is refused.
            if self.closing.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(LocalError::ShuttingDown);
            }
            if table.contains_key(&id) || paths.dir.exists() {
                return Err(LocalError::AlreadyExists(id));
            }
            table.insert(id.clone(), Entry::Creating);
        }
        let _ended = CreateEnded(self);
        // Held until the create is done or undone (dropped on return): no other process
        // of a shared root recovers, deletes or creates this id meanwhile. Taken after
        // the table's reservation; the directory is checked again under it, since
        // another process may have made it since.
        let _lock = match self.try_lock_sandbox(&id) {
            Ok(Some(lock)) if !paths.dir.exists() => lock,
            Ok(_) => {
                self.lock_table().remove(&id);
                return Err(LocalError::AlreadyExists(id));
            }
            Err(e) => {
                self.lock_table().remove(&id);
                return Err(e);
            }
        };
        let mut state: Option<SandboxState> = None;
        match self
            .create_reserved(&id, &hostname, limits, &spec, &paths, &mut state)
            .await
        {
            Ok(()) => {
                let Some(state) = state else {
                    self.lock_table().remove(&id);
                    return Err(LocalError::Task("create finished without a state".into()));
                };
                let info = self.info(&state);
                self.lock_table()
                    .insert(id.clone(), Entry::Ready(Box::new(state)));
                Ok(info)
            }
            Err(e) => {
                let e = match e {
                    LocalError::NotReady { id, reason, .. } => LocalError::NotReady {
                        id,
                        reason,
                        log: runc::tail(&paths.log, 8192),
                    },
                    other => other,
                };
                // Whatever was made goes; the error is what the caller needs. Anything
                // teardown could not remove shows in audit() and goes with recover().
                let _ = self.teardown(&id, state.as_ref()).await;
                self.lock_table().remove(&id);
                Err(e)
            }
        }
    }

    /// The steps of a create, each recorded in the state file before the next.
    async fn create_reserved(
        &self,
        id: &str,
        hostname: &str,
        limits: Limits,
        spec: &SandboxSpec,
        paths: &Paths,
        state_slot: &mut Option<SandboxState>,
    ) -> Result<(), LocalError> {
        self.make_dirs(paths).await?;
        let new_state = self.new_state(id, hostname, limits, spec)?;
        let token = new_state.token.clone();
        *state_slot = Some(new_state);
        save(paths, state_slot)?;

        self.mount_rootfs(spec, paths, state_slot).await?;
        if let Some(s) = state_slot.as_mut() {
            let idle = super::cgroup::start_idle(&s.cgroup_dirs);
            let starting_shares = (!idle).then_some(super::cgroup::STARTING_CPU_SHARES);
            self.write_config(id, hostname, spec, paths, s, starting_shares)?;
        }
        save(paths, state_slot)?;

        // slirp4netns must join the network namespace before the agent starts; without
        // egress, one `runc run --detach` does create and start.
        let split =
            matches!(spec.network, NetworkMode::Egress { .. }) || self.config.fail_point.is_some();
        let (pid, init) = self.start_init(id, paths, split).await?;
        if let Some(s) = state_slot.as_mut() {
            s.init = Some(init);
            // Only the hierarchies runc really used.
            s.cgroup_dirs.retain(|d| d.is_dir());
        }
        save(paths, state_slot)?;

        if let NetworkMode::Egress {
            allow_host_loopback,
        } = spec.network
        {
            let slirp = self
                .start_egress(id, pid, allow_host_loopback, paths)
                .await?;
            if let Some(s) = state_slot.as_mut() {
                s.slirp = Some(slirp);
            }
            save(paths, state_slot)?;
        }
        if self.config.fail_point == Some(FailPoint::HangAfterRuncCreate) {
            let _ = fs::write(paths.dir.join("failpoint"), b"hang-after-runc-create\n");
            std::future::pending::<()>().await;
        }
        if split {
            self.runc.start(id).await?;
        }
        self.wait_ready(id, &paths.socket, &token, init).await?;
        if let Some(s) = state_slot.as_ref() {
            super::cgroup::run_at_normal_priority(&s.cgroup_dirs);
        }
        if let Some(sid) = &spec.snapshot {
            self.fill_tmp(sid, init.pid).await?;
        }
        if let Some(s) = state_slot.as_mut() {
            s.phase = Phase::Running;
        }
        save(paths, state_slot)
    }

    /// Create step 1: the sandbox's directories, and its disk when disks are limited.
    async fn make_dirs(&self, paths: &Paths) -> Result<(), LocalError> {
        fs::create_dir(&paths.dir).map_err(io_err("creating", &paths.dir))?;
        fs::set_permissions(&paths.dir, fs::Permissions::from_mode(0o700))
            .map_err(io_err("setting the mode of", &paths.dir))?;
        fs::create_dir(&paths.disk).map_err(io_err("creating", &paths.disk))?;
        if let Some(limit) = self.config.disk {
            let pool = self.disk_pool.as_ref();
            diskpool::make_and_mount(&paths.disk_image, &paths.disk, limit, pool).await?;
        }
        for d in [&paths.rootfs, &paths.upper, &paths.work, &paths.run] {
            fs::create_dir(d).map_err(io_err("creating", d))?;
        }
        Ok(())
    }

    /// Create step 2: the first state (phase `Creating`), with a fresh agent token.
    fn new_state(
        &self,
        id: &str,
        hostname: &str,
        limits: Limits,
        spec: &SandboxSpec,
    ) -> Result<SandboxState, LocalError> {
        let created_unix_ms = state::now_unix_ms();
        let token = crate::random::hex(16)?;
        let cgroup_name = self.cgroup_name(id);
        Ok(SandboxState {
            version: state::STATE_VERSION,
            id: id.to_string(),
            phase: Phase::Creating,
            token,
            image: spec.image.reference.clone(),
            image_digest: spec.image.digest.clone(),
            created_unix_ms,
            created_at: state::rfc3339(created_unix_ms),
            limits,
            network: spec.network,
            hostname: hostname.to_string(),
            labels: spec.labels.clone(),
            user: None,
            cgroup_dirs: self
                .cgroup_parents
                .iter()
                .map(|p| p.join(&cgroup_name))
                .collect(),
            cgroup_name,
            init: None,
            slirp: None,
            env: spec.env.clone(),
            image_layers: spec.image.layers.clone(),
            image_config: spec.image.config.clone(),
            snapshot: spec.snapshot.clone(),
            snapshot_layers: Vec::new(),
            runtime_files: Vec::new(),
        })
    }

    /// Create step 3: the overlay root from the image's layers and, for a fork, the
    /// snapshot's (recorded in the state file first).
    async fn mount_rootfs(
        &self,
        spec: &SandboxSpec,
        paths: &Paths,
        state_slot: &mut Option<SandboxState>,
    ) -> Result<(), LocalError> {
        let mut layers = if spec.image.layers.is_empty() {
            vec![self.empty_layer.clone()]
        } else {
            spec.image.layers.clone()
        };
        if let Some(sid) = &spec.snapshot {
            // Checked after the state file names the snapshot: a delete of the snapshot
            // either saw this fork (and refused) or removed it before this check.
            let fork_layers = self.fork_layers(sid).await?;
            layers.extend(fork_layers.iter().map(|hex| self.layers_dir().join(hex)));
            if let Some(s) = state_slot.as_mut() {
                s.snapshot_layers = fork_layers;
            }
            save(paths, state_slot)?;
        }
        rootfs::mount_overlay(
            self.mounter.as_ref(),
            &layers,
            &paths.upper,
            &paths.work,
            &paths.rootfs,
        )?;
        Ok(())
    }

    /// Create step 4: the image's user and working directory, the runtime files and
    /// the OCI config; records the user and the runtime files in `state` (not saved).
    fn write_config(
        &self,
        id: &str,
        hostname: &str,
        spec: &SandboxSpec,
        paths: &Paths,
        state: &mut SandboxState,
        starting_shares: Option<u64>,
    ) -> Result<(), LocalError> {
        let limits = state.limits;
        let config = &spec.image.config;
        let user = rootfs::resolve_user(&paths.rootfs, config.user.as_deref())?;
        if user.uid != 0 {
            rootfs::make_user_dir(&paths.rootfs, "/workspace", user.uid, user.gid)?;
        }
        let cwd = rootfs::prepare_workdir(&paths.rootfs, config.working_dir.as_deref())?;
        // Mounted over the image's paths, whatever the image holds; recorded before
        // anything can snapshot the sandbox, which leaves their mount points out.
        let files =
            runtime_files::prepare(&paths.rootfs, &paths.runtime_files, hostname, spec.network)?;
        state.runtime_files = files.iter().map(|f| f.in_root.clone()).collect();
        // The agent runs as root; its commands run as the image's user (`--user`), with
        // that user's HOME unless the image sets one.
        let mut agent_args = self.config.agent_args.clone();
        if user.uid != 0 {
            let mut ids = format!("{}:{}", user.uid, user.gid);
            for g in &user.additional_gids {
                ids.push_str(&format!(",{g}"));
            }
            agent_args.extend(["--user".to_string(), ids]);
        }
        let home = if user.uid == 0 && user.home == "/" {
            "/root"
        } else {
            user.home.as_str()
        };
        let env = build_env(
            &config.env,
            &spec.env,
            home,
            hostname,
            self.config.harness.is_some(),
            &state.token,
        )?;
        let annotations = self.annotations(id, spec, &limits, &user, state.created_unix_ms);
        state.user = Some(user);
        let oci = spec::build(&spec::SpecInput {
            hostname,
            agent_args: &agent_args,
            env,
            cwd: &cwd,
            inject_dir: &self.inject_dir,
            cgroups_path: &state.cgroup_name,
            limits: ResourceLimits {
                cpus: limits.cpus,
                memory_bytes: limits.memory_bytes,
                swap_accounting: self.swap_accounting,
                pids: limits.pids,
                tmp_bytes: limits.tmp_bytes,
                nofile: self.nofile,
            },
            annotations,
            user_namespaces: self.config.allow_user_namespaces,
            tools: self.config.harness.is_some(),
            runtime_files: &files,
            starting_shares,
        })?;
        spec::write(&oci, &paths.config)?;
        Ok(())
    }

    /// Create step 5: binds the agent's socket, has runc create (when `split`) or run
    /// the container, and returns its init's pid.
    async fn start_init(
        &self,
        id: &str,
        paths: &Paths,
        split: bool,
    ) -> Result<(i32, ProcRef), LocalError> {
        // The agent's socket is bound here, on the host, in a directory the sandbox
        // never sees, and handed to the agent as fd 3: code in the sandbox cannot
        // replace, remove or redirect it (it used to be a writable bind mount).
        let _ = fs::remove_file(&paths.socket);
        let listener = std::os::unix::net::UnixListener::bind(&paths.socket)
            .map_err(io_err("binding the agent socket", &paths.socket))?;
        fs::set_permissions(&paths.socket, fs::Permissions::from_mode(0o600))
            .map_err(io_err("securing the agent socket", &paths.socket))?;
        let fd = Some(std::os::fd::AsFd::as_fd(&listener));
        if split {
            self.runc
                .create(id, &paths.dir, &paths.pid_file, &paths.log, fd)
                .await?;
        } else {
            self.runc
                .run_detached(id, &paths.dir, &paths.pid_file, &paths.log, fd)
                .await?;
        }
        // The agent holds it now; this copy would only keep a dead sandbox's socket open.
        drop(listener);
        let pid: i32 = fs::read_to_string(&paths.pid_file)
            .map_err(io_err("reading", &paths.pid_file))?
            .trim()
            .parse()
            .map_err(|_| LocalError::Task(format!("runc wrote a bad pid file for {id}")))?;
        let init = ProcRef::of(pid).ok_or_else(|| LocalError::NotReady {
            id: id.to_string(),
            reason: format!("its init {pid} vanished right after runc create"),
            log: String::new(),
        })?;
        Ok((pid, init))
    }

    /// Create step 6 (egress only): the filter, then slirp4netns, whose process it returns.
    async fn start_egress(
        &self,
        id: &str,
        pid: i32,
        allow_host_loopback: bool,
        paths: &Paths,
    ) -> Result<ProcRef, LocalError> {
        // The filter first: no packet leaves before it (see `egress`).
        egress::install(
            &self.config.nft,
            &self.config.egress,
            pid,
            allow_host_loopback,
        )
        .await
        .map_err(network::NetworkError::from)?;
        Ok(network::start_slirp(
            &self.config.slirp4netns,
            pid,
            allow_host_loopback,
            &paths.slirp_log,
            &self.marker(id),
            Duration::from_secs(10),
        )
        .await?)
    }

    fn annotations(
        &self,
        id: &str,
        spec: &SandboxSpec,
        limits: &Limits,
        user: &rootfs::ResolvedUser,
        created_unix_ms: u64,
    ) -> HashMap<String, String> {
        let p = ANNOTATION_PREFIX;
        let mut a = HashMap::from([
            (format!("{p}sandbox.id"), id.to_string()),
            (format!("{p}backend.tag"), self.tag.clone()),
            (format!("{p}image.reference"), spec.image.reference.clone()),
            (format!("{p}image.digest"), spec.image.digest.clone()),
            (format!("{p}created"), state::rfc3339(created_unix_ms)),
            (format!("{p}network"), spec.network.label().to_string()),
            (format!("{p}image.user"), user.spec.clone()),
            (
                format!("{p}image.user.resolved"),
                format!(
                    "{}:{}{}",
                    user.uid,
                    user.gid,
                    user.additional_gids
                        .iter()
                        .map(|g| format!(",{g}"))
                        .collect::<String>()
                ),
            ),
        ]);
        if let Some(c) = limits.cpus {
            a.insert(format!("{p}limits.cpus"), c.to_string());
        }
        if let Some(m) = limits.memory_bytes {
            a.insert(format!("{p}limits.memory_bytes"), m.to_string());
        }
        if let Some(n) = limits.pids {
            a.insert(format!("{p}limits.pids"), n.to_string());
        }
        if let Some(t) = limits.tmp_bytes {
            a.insert(format!("{p}limits.tmp_bytes"), t.to_string());
        }
        for (k, v) in &spec.labels {
            a.insert(format!("{p}label.{k}"), v.clone());
        }
        a
    }

    /// Polls the agent's health until it answers, its init dies, or the deadline.
    async fn wait_ready(
        &self,
        id: &str,
        socket: &Path,
        token: &str,
        init: ProcRef,
    ) -> Result<(), LocalError> {
        let client = AgentClient::new(Endpoint::Unix(socket.to_path_buf()), token);
        let limit = self.config.ready_timeout;
        let deadline = Instant::now() + limit;
        let mut last = String::from("its socket never appeared");
        let not_ready = |reason: String| LocalError::NotReady {
            id: id.to_string(),
            reason,
            log: String::new(),
        };
        loop {
            if socket.exists() {
                match tokio::time::timeout(Duration::from_secs(2), client.health()).await {
                    Ok(Ok(h)) if h.status == "ok" => return Ok(()),
                    Ok(Ok(h)) => last = format!("health answered status {:?}", h.status),
                    Ok(Err(e)) => last = e.to_string(),
                    Err(_) => last = "health did not answer within 2s".into(),
                }
            }
            // Only evidence ends the wait early; an unreadable /proc waits for the deadline.
            if init.liveness() == Liveness::Stopped {
                return Err(not_ready(format!("the agent (pid {}) exited", init.pid)));
            }
            if Instant::now() >= deadline {
                return Err(not_ready(format!(
                    "no answer within {limit:?}; last: {last}"
                )));
            }
            // The agent binds its socket within a few milliseconds of starting.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Deletes a ready sandbox of the table, or on a shared root a running sandbox
    /// another process created, under the sandbox's lock.
    pub(super) async fn delete(&self, id: &str) -> Result<(), LocalError> {
        let not_found = || LocalError::NotFound(id.to_string());
        let known = {
            let mut table = self.lock_table();
            match table.get(id) {
                Some(Entry::Ready(_)) => match table.insert(id.to_string(), Entry::Deleting) {
                    Some(Entry::Ready(s)) => Some(*s),
                    _ => return Err(not_found()),
                },
                // Perhaps another process's: its state file says (read under the lock).
                // A valid id is a plain file name, never a path out of the root.
                None if self.config.shared && valid_id(id) => {
                    table.insert(id.to_string(), Entry::Deleting);
                    None
                }
                _ => return Err(not_found()),
            }
        };
        let _lock = match self.lock_sandbox(id).await {
            Ok(lock) => lock,
            Err(e) => {
                let mut table = self.lock_table();
                match known {
                    Some(s) => table.insert(id.to_string(), Entry::Ready(Box::new(s))),
                    None => table.remove(id),
                };
                return Err(e);
            }
        };
        let paths = self.paths(id);
        let state = match known {
            // On a shared root the file is the truth: another process may have deleted
            // (or deleted and made again) the sandbox since this one listed it.
            Some(s) if !self.config.shared => s,
            _ => match state::load(&paths.state) {
                Ok(s) if s.phase == Phase::Running && s.id == id => s,
                _ => {
                    self.lock_table().remove(id);
                    return Err(not_found());
                }
            },
        };
        let mut deleting = state.clone();
        deleting.phase = Phase::Deleting;
        let _ = state::save(&self.paths(id).state, &deleting);
        let problems = self.teardown(id, Some(&deleting)).await;
        self.lock_table().remove(id);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(LocalError::Cleanup {
                id: id.to_string(),
                problems,
            })
        }
    }

    /// Removes everything of sandbox `id` that exists, with or without its state;
    /// answers what could not be removed.
    async fn teardown(&self, id: &str, state: Option<&SandboxState>) -> Vec<String> {
        let mut problems = Vec::new();
        let paths = self.paths(id);
        // slirp4netns first: it holds the sandbox's network namespace.
        let mut slirps: Vec<ProcRef> = state.and_then(|s| s.slirp).into_iter().collect();
        for p in audit::marked_processes(&self.marker(id)) {
            if !slirps.contains(&p) {
                slirps.push(p);
            }
        }
        for p in slirps {
            if let Err(e) = p
                .terminate(Duration::from_millis(500), KILL_WAIT, "slirp4netns")
                .await
            {
                problems.push(e.to_string());
            }
        }
        let mut init = state.and_then(|s| s.init);
        if init.is_none() {
            // A crash between `runc create` and the state update: runc knows the init
            // (and checks its identity before answering).
            if let Ok(Some(c)) = self.runc.state(id).await {
                init = (c.pid > 0).then(|| ProcRef::of(c.pid)).flatten();
            }
        }
        // SIGKILL to the init ends the whole pid namespace. Killing and reaping it
        // ourselves first lets `runc delete` see a stopped container and skip the
        // 100 ms polls it makes when it has to kill a running one.
        if let Some(init) = init {
            init.signal(rustix::process::Signal::KILL);
            // A paused sandbox's processes die only once thawed.
            for d in state.map(|s| s.cgroup_dirs.as_slice()).unwrap_or_default() {
                cgroup::thaw(d);
            }
            if let Err(e) = init.wait_exit(KILL_WAIT, "the container's init").await {
                problems.push(e.to_string());
            }
        }
        // `--force`: also when something still runs (a crash before the init was
        // known), which runc then kills.
        let runc_deleted = match self.runc.delete(id).await {
            Ok(()) => true,
            Err(e) => {
                problems.push(e.to_string());
                false
            }
        };
        let mut cgroups: Vec<PathBuf> = state.map(|s| s.cgroup_dirs.clone()).unwrap_or_default();
        for d in cgroup::dirs_named(&self.cgroup_parents, &self.cgroup_name(id)) {
            if !cgroups.contains(&d) {
                cgroups.push(d);
            }
        }
        for d in cgroups {
            if let Err(e) = cgroup::remove(&d, KILL_WAIT).await {
                problems.push(e.to_string());
            }
        }
        if !runc_deleted {
            // runc could not delete it (its state is broken); its processes are gone
            // with the cgroups, so its state directory can go too.
            let runc_state = self.runc.root().join(id);
            if runc_state.exists() {
                if let Err(e) = fs::remove_dir_all(&runc_state) {
                    problems.push(format!("removing {}: {e}", runc_state.display()));
                }
            }
        }
        match self.unmount_under(&paths.dir) {
            Ok(()) => {}
            Err(e) => problems.push(e),
        }
        if paths.dir.exists() {
            // Never recurse into a mount: a still-mounted rootfs would be emptied.
            match crate::backend::local::sys::mounts_under(&paths.dir) {
                Ok(m) if m.is_empty() => {
                    if let Err(e) = fs::remove_dir_all(&paths.dir) {
                        problems.push(format!("removing {}: {e}", paths.dir.display()));
                    }
                }
                Ok(m) => problems.push(format!(
                    "not removing {}: still mounted: {m:?}",
                    paths.dir.display()
                )),
                Err(e) => problems.push(e.to_string()),
            }
        }
        problems
    }

    /// Unmounts every mount under `dir`, deepest first.
    fn unmount_under(&self, dir: &Path) -> Result<(), String> {
        let mut mounts =
            crate::backend::local::sys::mounts_under(dir).map_err(|e| e.to_string())?;
        mounts.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
        let mut problems = Vec::new();
        for m in mounts {
            if let Err(e) = rootfs::unmount(self.mounter.as_ref(), &m) {
                problems.push(e.to_string());
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    /// Every sandbox id with a trace on the host: a directory, a runc container, a
    /// cgroup, a marked process.
    async fn ids_on_host(&self) -> (HashSet<String>, Vec<String>) {
        let mut ids = HashSet::new();
        let mut problems = Vec::new();
        if let Ok(entries) = fs::read_dir(&self.sandboxes_dir) {
            for e in entries.flatten() {
                if let Some(name) = e.file_name().to_str() {
                    ids.insert(name.to_string());
                }
            }
        }
        match self.runc.list().await {
            Ok(list) => ids.extend(list.into_iter().map(|c| c.id)),
            Err(e) => problems.push(e.to_string()),
        }
        if let Ok(entries) = fs::read_dir(self.runc.root()) {
            for e in entries.flatten() {
                if let Some(name) = e.file_name().to_str() {
                    ids.insert(name.to_string());
                }
            }
        }
        let prefix = self.cgroup_prefix();
        for name in cgroup::names_with_prefix(&self.cgroup_parents, &prefix) {
            if let Some(id) = name.strip_prefix(&prefix) {
                ids.insert(id.to_string());
            }
        }
        for (_, marker) in audit::all_marked_processes() {
            if let Some(id) = marker.strip_prefix(&format!("{}/", self.tag)) {
                ids.insert(id.to_string());
            }
        }
        (ids, problems)
    }

    /// Adopts or removes every sandbox on the host this backend does not know.
    pub(super) async fn recover(&self) -> Result<RecoverReport, LocalError> {
        let (ids, mut problems) = self.ids_on_host().await;
        for dir in self.stale_captures() {
            if let Err(e) = fs::remove_dir_all(&dir) {
                problems.push(format!("removing {}: {e}", dir.display()));
            }
        }
        let mut report = RecoverReport::default();
        let mut ids: Vec<String> = ids.into_iter().collect();
        ids.sort();
        for id in ids {
            if self.lock_table().contains_key(&id) {
                continue;
            }
            // Held through the adoption or teardown. Held elsewhere: another process of a
            // shared root is creating or deleting it, and it is that process's to finish
            // or undo. An invalid id (a stray name) has no lock: no create accepts it.
            let _lock = if valid_id(&id) {
                match self.try_lock_sandbox(&id) {
                    Ok(Some(lock)) => Some(lock),
                    Ok(None) => {
                        report.skipped.push(id);
                        continue;
                    }
                    Err(e) => {
                        problems.push(e.to_string());
                        continue;
                    }
                }
            } else {
                None
            };
            let paths = self.paths(&id);
            let state = match state::load(&paths.state) {
                Ok(s) => Some(s),
                // No state file: a create that never finished writing it.
                Err(state::StateError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    None
                }
                Err(e @ state::StateError::Io { .. }) => {
                    // Unreadable is not absent: left alone, for the next start to see.
                    problems.push(format!("left as it is: {e}"));
                    report.skipped.push(id);
                    continue;
                }
                Err(_) => None,
            };
            let adoption = match &state {
                Some(s) => self.adoptable(s).await,
                None => Adoption::Remove,
            };
            if let Adoption::Doubt(why) = &adoption {
                tracing::warn!(sandbox_id = %id, reason = %why, "adopting a sandbox whose state could not be checked: it is not removed on doubt");
            }
            match (adoption, state) {
                (Adoption::Adopt | Adoption::Doubt(_), Some(s)) => {
                    let mut table = self.lock_table();
                    if table.contains_key(&id) {
                        continue;
                    }
                    table.insert(id.clone(), Entry::Ready(Box::new(s)));
                    report.adopted.push(id);
                }
                (_, state) => {
                    problems.extend(self.teardown(&id, state.as_ref()).await);
                    report.removed.push(id);
                }
            }
        }
        report.problems = problems;
        Ok(report)
    }

    /// Whether a sandbox left by a previous backend is whole and healthy, known to be
    /// broken, or cannot be told (a check that failed is no evidence).
    async fn adoptable(&self, s: &SandboxState) -> Adoption {
        if s.phase != Phase::Running || !valid_id(&s.id) {
            return Adoption::Remove;
        }
        let Some(init) = s.init else {
            return Adoption::Remove;
        };
        match init.liveness() {
            Liveness::Running => {}
            Liveness::Stopped => return Adoption::Remove,
            Liveness::Unknown => return Adoption::Doubt("its init's /proc entry is unreadable"),
        }
        if matches!(s.network, NetworkMode::Egress { .. }) {
            match s.slirp.map_or(Liveness::Stopped, |p| p.liveness()) {
                Liveness::Running => {}
                Liveness::Stopped => return Adoption::Remove,
                Liveness::Unknown => {
                    return Adoption::Doubt("its network helper's /proc entry is unreadable")
                }
            }
        }
        match self.runc.state(&s.id).await {
            Ok(Some(c)) if c.status == "running" && c.pid == init.pid => {}
            // Paused: on a shared root another replica's, kept paused (its record says
            // so); alone, this process adopts it running again, as its new record says,
            // instead of removing it for an agent that cannot answer while frozen.
            Ok(Some(c)) if c.status == "paused" && c.pid == init.pid => {
                if self.config.shared {
                    return Adoption::Adopt;
                }
                if let Err(e) = self.runc.resume(&s.id).await {
                    tracing::warn!(sandbox_id = %s.id, error = %e, "cannot resume a paused sandbox to adopt it");
                    return Adoption::Remove;
                }
                tracing::warn!(sandbox_id = %s.id, "a paused sandbox was resumed to be adopted");
            }
            // runc could not be asked: no evidence either way.
            Err(_) => return Adoption::Doubt("runc state failed"),
            _ => return Adoption::Remove,
        }
        if self.config.shared {
            // Another live replica's sandbox, whole and running: a slow answer (a busy
            // machine) is no reason to tear it down under that replica. A broken agent
            // is the service's to find (its calls fail, reconciliation fails the record).
            return Adoption::Adopt;
        }
        let client = AgentClient::new(Endpoint::Unix(self.paths(&s.id).socket), s.token.clone());
        match tokio::time::timeout(RECOVER_HEALTH_LIMIT, client.health()).await {
            Ok(Ok(h)) if h.status == "ok" => Adoption::Adopt,
            _ => Adoption::Remove,
        }
    }

    /// Deletes everything, then the root.
    pub(super) async fn destroy(&self) -> Result<(), LocalError> {
        let ids: Vec<String> = self
            .lock_table()
            .iter()
            .filter(|(_, e)| matches!(e, Entry::Ready(_)))
            .map(|(id, _)| id.clone())
            .collect();
        let mut problems = Vec::new();
        for id in ids {
            if let Err(e) = self.delete(&id).await {
                problems.push(e.to_string());
            }
        }
        // Whatever is left: a previous backend's, our leaks, and creates still in flight
        // (or hung: a create task aborted with its runtime never reaches its own
        // cleanup). The backend is going away, so an in-flight create loses its sandbox
        // here; its next step fails on the missing directory and tears down again.
        let (ids, more) = self.ids_on_host().await;
        problems.extend(more);
        for id in ids {
            if matches!(self.lock_table().get(&id), Some(Entry::Ready(_))) {
                continue;
            }
            let state = state::load(&self.paths(&id).state).ok();
            problems.extend(self.teardown(&id, state.as_ref()).await);
            self.lock_table().remove(&id);
        }
        // Before the root goes: the pool's thread writes under it.
        if let Some(pool) = &self.disk_pool {
            pool.stop();
        }
        if let Err(e) = self.unmount_under(&self.root) {
            problems.push(e);
        }
        match crate::backend::local::sys::mounts_under(&self.root) {
            Ok(m) if m.is_empty() => {
                if let Err(e) = fs::remove_dir_all(&self.root) {
                    problems.push(format!("removing {}: {e}", self.root.display()));
                }
            }
            Ok(m) => problems.push(format!("not removing the root: still mounted: {m:?}")),
            Err(e) => problems.push(e.to_string()),
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(LocalError::Cleanup {
                id: "(backend)".into(),
                problems,
            })
        }
    }
}

/// What a restart does with a sandbox a previous backend left.
#[derive(Debug)]
enum Adoption {
    /// Whole and healthy: adopted.
    Adopt,
    /// Known broken or half-made: removed.
    Remove,
    /// A check failed (the reason): adopted, since a failed read is no evidence.
    Doubt(&'static str),
}

/// Wakes a shutdown waiting for the creates in flight when a create ends, however it
/// ends (made, undone, or its future dropped).
struct CreateEnded<'a>(&'a Inner);

impl Drop for CreateEnded<'_> {
    fn drop(&mut self) {
        self.0.create_ended.notify_waiters();
    }
}

/// Saves the sandbox's state file, once there is a state.
fn save(paths: &Paths, s: &Option<SandboxState>) -> Result<(), LocalError> {
    match s {
        Some(s) => Ok(state::save(&paths.state, s)?),
        None => Ok(()),
    }
}
