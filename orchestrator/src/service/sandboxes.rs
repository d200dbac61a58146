//! The sandbox lifecycle over the store: create (validated up front, then a create
//! task: image, backend, agent probe), wait for ready, heartbeat, delete, adopt what a
//! previous process left, shut down.
//!
//! Who deletes the backend sandbox is decided by the store: [`StateStore::remove_sandbox`](crate::state::StateStore::remove_sandbox)
//! is atomic and answers the record as it was. Removed while `pending`, the create task
//! finds its record gone when it tries to mark it ready (the compare-and-set fails) and
//! deletes what it made; removed later, the remover deletes it. Exactly one of them
//! does, whichever replica each runs on.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::backend::{BackendSandbox, CreateSpec, SandboxImage, StartProgress};
use crate::state::{AgentRecord, Lease, Phase, SandboxRecord, StoreError, Topic, Version};
use crate::units;

use crate::time::now_ms;

use super::auth::Tenant;
use super::checks::{validate_env_and_labels, MAX_TTL_S, META};
use super::config::CreateRequest;
use super::error::{BadLabel, Error, OverCapacity, QuotaExceeded};
use super::handle::Service;
use super::runtime::Live;
use super::worker;

/// The lease a create holds on its sandbox id from before its record exists until it
/// is marked ready or failed.
pub(super) fn create_lease(id: &str) -> String {
    format!("create/{id}")
}

/// The quota counter of a tenant's sandboxes.
fn held_counter(tenant: &str) -> String {
    format!("tenant/{tenant}/sandboxes")
}

impl Service {
    /// The record `id` of `tenant`.
    pub async fn get(&self, tenant: &Tenant, id: &str) -> Result<SandboxRecord, Error> {
        Ok(self.get_versioned(tenant, id).await?.0)
    }

    async fn get_versioned(
        &self,
        tenant: &Tenant,
        id: &str,
    ) -> Result<(SandboxRecord, Version), Error> {
        match self.store().sandbox(id).await? {
            Some(r) if r.value.tenant == tenant.0 => Ok((r.value, r.version)),
            _ => Err(Error::no_sandbox(id)),
        }
    }

    /// The records of `tenant`, oldest first.
    pub async fn list(&self, tenant: &Tenant) -> Result<Vec<SandboxRecord>, Error> {
        let mut list: Vec<_> = self
            .all()
            .await?
            .into_iter()
            .filter(|r| r.tenant == tenant.0)
            .collect();
        list.sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then(a.id.cmp(&b.id)));
        Ok(list)
    }

    /// Every record, of every tenant.
    pub async fn all(&self) -> Result<Vec<SandboxRecord>, Error> {
        Ok(self
            .store()
            .sandboxes()
            .await?
            .into_iter()
            .map(|r| r.value)
            .collect())
    }

    /// Counts of every record by phase name.
    pub async fn counts(&self) -> BTreeMap<&'static str, u64> {
        let mut counts = BTreeMap::from([("pending", 0), ("running", 0), ("failed", 0)]);
        for (phase, n) in self.store().phase_counts().await.unwrap_or_default() {
            *counts.entry(phase).or_default() += n;
        }
        counts
    }

    /// The live agent of a ready sandbox; 409 while pending, 502 when failed.
    pub async fn ready(&self, tenant: &Tenant, id: &str) -> Result<Arc<Live>, Error> {
        let rec = self.get(tenant, id).await?;
        self.live_of(&rec)
    }

    /// The live agent of `rec`, or why there is none (409 while paused: a frozen agent
    /// would hold the call until the sandbox is resumed).
    pub fn live_of(&self, rec: &SandboxRecord) -> Result<Arc<Live>, Error> {
        if rec.paused {
            return Err(Error::Paused(rec.id.clone()));
        }
        self.agent_of(rec)
    }

    /// The live agent of `rec`, paused or not: for the jobs accepted before a pause,
    /// which wait for the resume instead of failing.
    pub(super) fn agent_of(&self, rec: &SandboxRecord) -> Result<Arc<Live>, Error> {
        let id = &rec.id;
        match &rec.phase {
            Phase::Ready => self
                .inner
                .runtime
                .live(rec)
                .ok_or_else(|| Error::internal("the sandbox has no agent", id)),
            Phase::Pending => Err(Error::not_ready(id)),
            Phase::Failed { message } => Err(Error::sandbox_failed(id, message)),
        }
    }

    /// Waits until the sandbox is ready (`Ok`), failed (502) or `timeout` passes (408).
    pub async fn wait_ready(
        &self,
        tenant: &Tenant,
        id: &str,
        timeout: Duration,
    ) -> Result<SandboxRecord, Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Subscribed before the read: a change after the read wakes the wait.
            let mut changes = self.store().subscribe(Topic::Sandbox(id.to_string()));
            let rec = self.get(tenant, id).await?;
            match &rec.phase {
                Phase::Ready => return Ok(rec),
                Phase::Failed { message } => return Err(Error::start_failed(id, message)),
                Phase::Pending => {}
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                return Err(Error::ready_timeout(id, timeout));
            }
        }
    }

    /// Changes the record `id` with `change`, retrying on a concurrent write; answers the
    /// record as written.
    pub(super) async fn update(
        &self,
        tenant: Option<&Tenant>,
        id: &str,
        uid: Option<&str>,
        change: impl Fn(&mut SandboxRecord),
    ) -> Result<SandboxRecord, Error> {
        loop {
            let Some(current) = self.store().sandbox(id).await? else {
                return Err(Error::no_sandbox(id));
            };
            let mut rec = current.value;
            if tenant.is_some_and(|t| t.0 != rec.tenant) || uid.is_some_and(|u| u != rec.uid) {
                return Err(Error::no_sandbox(id));
            }
            change(&mut rec);
            match self
                .store()
                .update_sandbox(rec.clone(), current.version)
                .await
            {
                Ok(_) => return Ok(rec),
                Err(StoreError::Conflict(_)) => continue,
                Err(StoreError::NotFound(_)) => return Err(Error::no_sandbox(id)),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Records a heartbeat; from now on the sandbox is reaped when they stop.
    pub async fn heartbeat(&self, tenant: &Tenant, id: &str) -> Result<SandboxRecord, Error> {
        let now = now_ms();
        self.update(Some(tenant), id, None, |r| r.heartbeat_ms = Some(now))
            .await
    }

    /// Deletes a sandbox: its record at once (waiters are woken, queued jobs fail), then
    /// everything it holds in the backend before answering.
    pub async fn delete(&self, tenant: &Tenant, id: &str) -> Result<(), Error> {
        let rec = self.get(tenant, id).await?;
        self.remove(&rec, "the sandbox was deleted").await
    }

    /// Removes a record and its backend sandbox; `why` is logged.
    #[tracing::instrument(level = "warn", name = "remove", skip_all, fields(sandbox_id = %rec.id))]
    pub(super) async fn remove(&self, rec: &SandboxRecord, why: &str) -> Result<(), Error> {
        let Some(was) = self.store().remove_sandbox(&rec.id, &rec.uid).await? else {
            // Someone else removed it first; they delete what it holds.
            return Ok(());
        };
        self.store()
            .release_slot(&held_counter(&was.tenant))
            .await?;
        self.inner.runtime.forget(&was.id);
        match was.phase {
            // The create task removes what it made once it finds the record gone.
            Phase::Pending => {}
            Phase::Ready | Phase::Failed { .. } => {
                let _ = self.backend().delete(&was.id).await;
            }
        }
        // The span names the sandbox.
        tracing::info!(reason = %why, "sandbox removed");
        Ok(())
    }

    /// The limits a create gets: those asked for (or the defaults), parsed. Beyond what
    /// the backend's largest machine has, they are lowered to it where the backend
    /// clamps (a limit is a ceiling there, not a reservation) and the lowering is said
    /// in the notice; refused (400) where it does not.
    fn fit_limits(&self, cpu: String, memory: String) -> Result<FittedLimits, Error> {
        let mut fitted = FittedLimits {
            cpus: units::parse_cpu(&cpu)?,
            memory_bytes: units::parse_memory(&memory)?,
            cpu,
            memory,
            notice: None,
        };
        let Some(cap) = self.backend().capacity() else {
            return Ok(fitted);
        };
        let clamps = self.backend().clamps_to_capacity();
        let mut lowered = Vec::new();
        if fitted.cpus > cap.cpus {
            if !clamps {
                return Err(OverCapacity::Cpus {
                    asked: fitted.cpus,
                    max: cap.cpus,
                }
                .into());
            }
            let now = format!("{}", cap.cpus);
            lowered.push(format!("cpu {} to {now}", fitted.cpu));
            (fitted.cpus, fitted.cpu) = (cap.cpus, now);
        }
        if fitted.memory_bytes > cap.memory_bytes {
            if !clamps {
                return Err(OverCapacity::Memory {
                    asked: fitted.memory_bytes,
                    max: cap.memory_bytes,
                }
                .into());
            }
            // Whole MiB, so that the text and the bytes applied say the same.
            let mib = cap.memory_bytes >> 20;
            let now = format!("{mib}Mi");
            lowered.push(format!("memory {} to {now}", fitted.memory));
            (fitted.memory_bytes, fitted.memory) = (mib << 20, now);
        }
        if !lowered.is_empty() {
            fitted.notice = Some(format!(
                "limits lowered to what this host has ({} CPUs, {} MiB of memory): {}",
                cap.cpus,
                cap.memory_bytes >> 20,
                lowered.join(", ")
            ));
        }
        Ok(fitted)
    }

    /// Takes one of `tenant`'s sandbox slots and one create of its rate; on `Err`
    /// nothing is held.
    async fn take_quota(&self, tenant: &Tenant) -> Result<(), Error> {
        let q = self.inner.config.quotas;
        let counter = held_counter(&tenant.0);
        if !self
            .store()
            .acquire_slot(&counter, q.max_sandboxes as u64)
            .await?
        {
            return Err(QuotaExceeded::Sandboxes {
                held: q.max_sandboxes,
                limit: q.max_sandboxes,
            }
            .into());
        }
        if q.creates_per_minute > 0 {
            let key = format!("tenant/{}/creates", tenant.0);
            let admitted = self
                .store()
                .hit_rate(&key, Duration::from_secs(60), q.creates_per_minute as u64)
                .await;
            if !matches!(admitted, Ok(true)) {
                self.store().release_slot(&counter).await?;
                admitted?;
                return Err(QuotaExceeded::CreatesPerMinute {
                    limit: q.creates_per_minute,
                }
                .into());
            }
        }
        Ok(())
    }

    /// Starts creating a sandbox and returns its record at once (phase `pending`).
    pub async fn create(
        &self,
        tenant: &Tenant,
        req: CreateRequest,
    ) -> Result<SandboxRecord, Error> {
        let (limits, ready_timeout, ttl) = self.check_create(&req)?;
        let id = match &req.id {
            Some(id) => {
                if !crate::backend::valid_id(id) {
                    return Err(Error::BadSandboxId(id.clone()));
                }
                id.clone()
            }
            None => format!("sb-{}", crate::random::hex(6)?),
        };
        let lease = self.reserve_create(tenant, &id).await?;
        let mut rec = self.new_record(id.clone(), tenant, &req, ready_timeout, ttl, now_ms())?;
        // The record says what the sandbox has, and why it differs from the request.
        (rec.cpu, rec.memory) = (limits.cpu.clone(), limits.memory.clone());
        rec.notice = limits.notice.clone();
        if let Some(notice) = &rec.notice {
            tracing::info!(sandbox_id = %id, %notice, "limits above the host's size were lowered");
        }
        match self.store().insert_sandbox(rec.clone()).await {
            Ok(_) => {}
            Err(e) => {
                let _ = self.store().release_lease(&lease).await;
                self.store().release_slot(&held_counter(&tenant.0)).await?;
                return Err(match e {
                    StoreError::Exists(_) => Error::SandboxExists(id),
                    e => e.into(),
                });
            }
        }
        worker::spawn_worker(self, &rec);
        let spec = self.create_spec(&rec, &req, Some(limits.cpus), Some(limits.memory_bytes));
        self.inner.pending.fetch_add(1, Ordering::Relaxed);
        let service = self.clone();
        let task_rec = rec.clone();
        // The request's line names the sandbox it made (its path has no id).
        tracing::Span::current().record("sandbox_id", rec.id.as_str());
        tokio::spawn(async move {
            let ttl = service.policy().worker_lease;
            let create = service.clone().run_create(task_rec, spec);
            tokio::pin!(create);
            loop {
                tokio::select! {
                    _ = &mut create => break,
                    _ = tokio::time::sleep(ttl / 3) => {
                        let _ = service.store().renew_lease(&lease, ttl).await;
                    }
                }
            }
            let _ = service.store().release_lease(&lease).await;
        });
        Ok(rec)
    }

    /// The create's checks of the request: its limits fitted to the host, its ready
    /// timeout and its TTL.
    fn check_create(
        &self,
        req: &CreateRequest,
    ) -> Result<(FittedLimits, Duration, Option<Duration>), Error> {
        if req.image.trim().is_empty() {
            return Err(Error::BadRequest("image must not be empty".into()));
        }
        // Input the backend would refuse is refused here, as a 400: found only by the
        // create task, it would be a sandbox that failed to start (502).
        crate::image::Reference::parse(&req.image).map_err(|e| Error::BadRequest(e.to_string()))?;
        validate_env_and_labels(&req.env, &req.labels)?;
        let defaults = &self.inner.config.defaults;
        let limits = self.fit_limits(
            req.cpu.clone().unwrap_or_else(|| defaults.cpu.clone()),
            req.memory
                .clone()
                .unwrap_or_else(|| defaults.memory.clone()),
        )?;
        let policy = &self.inner.config.policy;
        let ready_timeout = match req.ready_timeout_s {
            None | Some(0) => policy.ready_timeout,
            Some(s) => Duration::from_secs(s).min(policy.max_ready_timeout),
        };
        let ttl = match req.ttl_s {
            Some(0) => None,
            Some(s) if s > MAX_TTL_S => {
                return Err(Error::BadRequest(format!(
                    "ttl_s {s}: at most {MAX_TTL_S} seconds (100 years); 0 keeps the sandbox until deleted"
                )))
            }
            Some(s) => Some(Duration::from_secs(s)),
            None => policy.default_ttl,
        };
        for k in req.labels.keys() {
            if k.starts_with(META) {
                return Err(BadLabel::Reserved {
                    key: k.clone(),
                    prefix: META,
                }
                .into());
            }
        }
        Ok((limits, ready_timeout, ttl))
    }

    /// The create's reservation of `id`: room in the create queue, no record yet, the
    /// create lease and the tenant's quota (the lease released if the quota refuses).
    async fn reserve_create(&self, tenant: &Tenant, id: &str) -> Result<Lease, Error> {
        let cfg = &self.inner.config;
        let room = (cfg.max_concurrent_creates.max(1) + cfg.create_queue) as u64;
        if self.inner.pending.load(Ordering::Relaxed) >= room {
            return Err(Error::Unavailable(format!(
                "{} sandboxes are being created and {} more wait in the queue, which is full; retry shortly",
                cfg.max_concurrent_creates, cfg.create_queue
            )));
        }
        if self.store().sandbox(id).await?.is_some() {
            return Err(Error::SandboxExists(id.to_string()));
        }
        // The create lease, taken before the record exists and held until the record
        // is marked: a pending record whose lease nobody holds lost its creator (a
        // replica that died), and the policy loop fails it.
        // A holder of its own per create: two racing creates of one id in one replica
        // must not share (and the loser release) the winner's lease.
        let holder = format!("{}/create/{}", self.inner.holder, crate::random::hex(4)?);
        let Some(lease) = self
            .store()
            .acquire_lease(&create_lease(id), &holder, self.policy().worker_lease)
            .await?
        else {
            return Err(Error::SandboxExists(id.to_string()));
        };
        if let Err(e) = self.take_quota(tenant).await {
            let _ = self.store().release_lease(&lease).await;
            return Err(e);
        }
        Ok(lease)
    }

    /// A new pending record.
    fn new_record(
        &self,
        id: String,
        tenant: &Tenant,
        req: &CreateRequest,
        ready_timeout: Duration,
        ttl: Option<Duration>,
        created_ms: u64,
    ) -> Result<SandboxRecord, Error> {
        let defaults = &self.inner.config.defaults;
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Ok(SandboxRecord {
            id,
            uid: crate::random::hex(8)?,
            tenant: tenant.0.clone(),
            image: req.image.clone(),
            cpu: req.cpu.clone().unwrap_or_else(|| defaults.cpu.clone()),
            memory: req
                .memory
                .clone()
                .unwrap_or_else(|| defaults.memory.clone()),
            working_dir: defaults.working_dir.clone(),
            block_network: req.block_network,
            ready_timeout_ms: ms(ready_timeout),
            ttl_ms: ttl.map(ms),
            labels: req.labels.clone(),
            created_ms,
            heartbeat_ms: None,
            phase: Phase::Pending,
            agent: None,
            paused: false,
            notice: None,
            unschedulable: None,
        })
    }

    /// What the backend is asked for; the server's own metadata rides in its labels, so
    /// a restarted server can rebuild the record.
    fn create_spec(
        &self,
        rec: &SandboxRecord,
        req: &CreateRequest,
        cpus: Option<f64>,
        memory_bytes: Option<u64>,
    ) -> (String, CreateSpecParts) {
        let mut labels = req.labels.clone();
        labels.insert(format!("{META}tenant"), rec.tenant.clone());
        labels.insert(format!("{META}image"), rec.image.clone());
        labels.insert(format!("{META}created_ms"), rec.created_ms.to_string());
        labels.insert(
            format!("{META}block_network"),
            rec.block_network.to_string(),
        );
        labels.insert(format!("{META}cpu"), rec.cpu.clone());
        labels.insert(format!("{META}memory"), rec.memory.clone());
        if let Some(notice) = &rec.notice {
            labels.insert(format!("{META}notice"), notice.clone());
        }
        if let Some(t) = rec.ttl_ms {
            labels.insert(format!("{META}ttl_s"), (t / 1000).to_string());
        }
        if let Some(sid) = &req.snapshot {
            labels.insert(format!("{META}snapshot"), sid.clone());
        }
        let env = req.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        (
            rec.image.clone(),
            CreateSpecParts {
                cpus,
                memory_bytes,
                env,
                labels,
                snapshot: req.snapshot.clone(),
                sessions: req.sessions.clone(),
            },
        )
    }

    /// The create task: waits for a slot, makes the sandbox within its readiness limit,
    /// and marks the record ready or failed. While the backend says no node can take
    /// the sandbox yet, the pending record says so (and why), and keeps waiting.
    #[tracing::instrument(level = "warn", name = "create", skip_all, fields(sandbox_id = %rec.id))]
    async fn run_create(self, rec: SandboxRecord, (image, parts): (String, CreateSpecParts)) {
        let started = Instant::now();
        let (progress, mut waiting) = StartProgress::channel();
        let mut attempt = {
            let (service, rec) = (self.clone(), rec.clone());
            tokio::spawn(
                async move {
                    // The image first, outside the slots: a pull waits on its registry,
                    // not on this machine, and while it held a slot, creates of cached
                    // images queued behind it (a stalled registry held one for a minute).
                    let image = service.sandbox_image(&image, &parts).await?;
                    // Creates beyond the concurrency limit wait here, each key in its
                    // own line and the keys served in turn (`fair`); the readiness limit
                    // counts the wait.
                    let _slot = service.inner.create_slots.acquire(&rec.tenant).await;
                    if !service.is_current(&rec).await {
                        return Err("the sandbox was deleted before it started".to_string());
                    }
                    service.start(&rec, image, parts, progress).await
                }
                .in_current_span(),
            )
        };
        let limit = tokio::time::sleep(rec.ready_timeout());
        tokio::pin!(limit);
        let finished = loop {
            tokio::select! {
                joined = &mut attempt => break Some(joined),
                () = &mut limit => break None,
                // Ends in an error once the attempt is over and its sink dropped; the
                // attempt's own branch then ends the loop.
                Ok(()) = waiting.changed() => {
                    let now = waiting.borrow_and_update().clone();
                    self.mark_unschedulable(&rec, now).await;
                }
            }
        };
        let outcome = match finished {
            Some(joined) => joined.unwrap_or_else(|e| Err(format!("internal error: {e}"))),
            None => {
                // The backend create goes on in its own task; what it makes is removed
                // once it is done.
                let svc = self.clone();
                let id = rec.id.clone();
                tokio::spawn(
                    async move {
                        if let Ok(Ok(_)) = attempt.await {
                            let _ = svc.backend().delete(&id).await;
                        }
                    }
                    .in_current_span(),
                );
                let waited = rec.ready_timeout().as_secs();
                Err(match waiting.borrow().as_deref() {
                    Some(why) => {
                        format!(
                            "the sandbox was not ready within {waited} s (unschedulable: {why})"
                        )
                    }
                    None => format!("the sandbox was not ready within {waited} s"),
                })
            }
        };
        self.inner.pending.fetch_sub(1, Ordering::Relaxed);
        match outcome {
            Ok(agent) => {
                self.metrics()
                    .create_seconds
                    .observe(started.elapsed().as_secs_f64());
                // Only a record still pending turns ready: one the policy loop failed
                // meanwhile (its create lease lapsed) had what was made deleted.
                let marked = self
                    .update(None, &rec.id, Some(&rec.uid), |r| {
                        if r.phase == Phase::Pending {
                            r.phase = Phase::Ready;
                            r.agent = Some(agent.clone());
                            r.unschedulable = None;
                        }
                    })
                    .await;
                if marked.is_ok_and(|r| r.phase == Phase::Ready) {
                    tracing::info!("sandbox ready");
                } else {
                    // Deleted while it was being made: what was made goes too.
                    let _ = self.backend().delete(&rec.id).await;
                }
            }
            Err(message) => {
                tracing::warn!(sandbox_id = %rec.id, error = %message, "sandbox failed to start");
                let _ = self
                    .update(None, &rec.id, Some(&rec.uid), |r| {
                        r.phase = Phase::Failed {
                            message: message.clone(),
                        };
                        r.unschedulable = None;
                    })
                    .await;
            }
        }
    }

    /// Records on `rec`'s pending record why no node can take it (`None`: one took it).
    /// A record no longer pending, or gone, is left as it is.
    async fn mark_unschedulable(&self, rec: &SandboxRecord, why: Option<String>) {
        match &why {
            Some(w) => tracing::info!(reason = %w, "no node can take the sandbox yet; waiting"),
            None => tracing::info!("a node took the sandbox"),
        }
        let _ = self
            .update(None, &rec.id, Some(&rec.uid), |r| {
                if r.phase == Phase::Pending {
                    r.unschedulable = why.clone();
                }
            })
            .await;
    }

    /// Whether `rec`'s incarnation is still stored.
    pub(super) async fn is_current(&self, rec: &SandboxRecord) -> bool {
        matches!(self.store().sandbox(&rec.id).await, Ok(Some(r)) if r.value.uid == rec.uid)
    }

    /// What the backend gets for `image`: the reference, for a backend that pulls
    /// itself (and for a fork, whose layers the snapshot names), or the local store's
    /// image, pulled first when it is not there yet.
    async fn sandbox_image(
        &self,
        image: &str,
        parts: &CreateSpecParts,
    ) -> Result<SandboxImage, String> {
        if self.backend().pulls_images() || parts.snapshot.is_some() {
            let reference =
                crate::image::Reference::parse(image).map_err(|e| format!("image {image}: {e}"))?;
            return Ok(SandboxImage::Reference(reference.to_string()));
        }
        let store = self.images().clone();
        Ok(SandboxImage::Local(match store.get(image) {
            Ok(Some(i)) => i,
            Ok(None) => store
                .ensure(image, |_| {})
                .await
                .map_err(|e| format!("image {image}: {e}"))?,
            Err(e) => return Err(format!("image {image}: {e}")),
        }))
    }

    async fn start(
        &self,
        rec: &SandboxRecord,
        image: SandboxImage,
        parts: CreateSpecParts,
        progress: StartProgress,
    ) -> Result<AgentRecord, String> {
        let spec = CreateSpec {
            id: rec.id.clone(),
            image,
            ttl: rec.ttl_ms.map(Duration::from_millis),
            cpus: parts.cpus,
            memory_bytes: parts.memory_bytes,
            egress: !rec.block_network,
            env: parts.env,
            labels: parts.labels,
            snapshot: parts.snapshot,
            progress,
        };
        let sb = self
            .backend()
            .create(spec)
            .await
            .map_err(|e| e.to_string())?;
        let agent = self.probe(&sb).await;
        self.restore_sessions(&sb, &parts.sessions).await?;
        Ok(agent)
    }

    /// What the compatible exec needs to know about a ready sandbox's image (bash or sh,
    /// `/workspace`, made when missing), asked of its agent.
    async fn probe(&self, sb: &BackendSandbox) -> AgentRecord {
        let agent = orchard_client::AgentClient::with_pool(
            self.inner.runtime.pool().clone(),
            sb.agent.client(),
            sb.token.clone(),
        );
        let bash =
            agent.stat("/bin/bash").await.is_ok() || agent.stat("/usr/bin/bash").await.is_ok();
        let wanted = &self.inner.config.defaults.working_dir;
        let workdir = match agent.stat(wanted).await {
            Ok(s) if s.kind == orchard_protocol::files::FileKind::Directory => wanted.clone(),
            _ => match agent.mkdir(wanted).await {
                Ok(_) => wanted.clone(),
                Err(e) => {
                    tracing::warn!(path = %wanted, error = %e, "cannot make the default working directory; commands run in /");
                    "/".into()
                }
            },
        };
        AgentRecord {
            endpoint: sb.agent.clone(),
            token: sb.token.clone(),
            ready_ms: now_ms(),
            shell: if bash { "bash" } else { "sh" }.into(),
            workdir,
        }
    }

    /// Adopts the backend's sandboxes a previous process made, rebuilding their records
    /// from the labels it left.
    pub(super) async fn adopt(&self) -> Result<(), Error> {
        self.backend()
            .recover()
            .await
            .map_err(|e| Error::internal("cannot recover sandboxes", e))?;
        if self.store().shared() {
            // The records live in the shared store, not in this process. A sandbox
            // without one is being deleted (the record goes first) or was lost with the
            // store; rebuilding its record here raced a delete in flight and left a
            // record for a sandbox about to vanish. Reconciliation removes the lost.
            return Ok(());
        }
        let list = match self.backend().list().await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list sandboxes to adopt");
                return Ok(());
            }
        };
        for sb in list {
            let Some(tenant) = sb.labels.get("orchard.tenant").cloned() else {
                // Not made by a server: leave it to whoever made it.
                continue;
            };
            if self.store().sandbox(&sb.id).await?.is_some() {
                // Another replica's record (a shared store): it is theirs already.
                continue;
            }
            let meta = |k: &str| sb.labels.get(&format!("{META}{k}")).cloned();
            let labels = sb
                .labels
                .iter()
                .filter(|(k, _)| !k.starts_with(META))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let tenant = Tenant(tenant);
            let req = CreateRequest {
                image: meta("image").unwrap_or_else(|| sb.image.clone()),
                cpu: meta("cpu"),
                memory: meta("memory"),
                block_network: meta("block_network").as_deref() != Some("false"),
                labels,
                ..Default::default()
            };
            let ttl = meta("ttl_s")
                .and_then(|t| t.parse().ok())
                .map(Duration::from_secs);
            let created = meta("created_ms")
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(now_ms);
            let mut rec =
                self.new_record(sb.id.clone(), &tenant, &req, Duration::ZERO, ttl, created)?;
            rec.phase = Phase::Ready;
            rec.notice = meta("notice");
            let span = tracing::warn_span!("adopt", sandbox_id = %sb.id);
            rec.agent = Some(self.probe(&sb).instrument(span).await);
            // Adopted sandboxes count against the quota, but are never refused by it.
            self.store()
                .acquire_slot(&held_counter(&tenant.0), 0)
                .await?;
            if self.store().insert_sandbox(rec.clone()).await.is_err() {
                self.store().release_slot(&held_counter(&tenant.0)).await?;
                continue;
            }
            worker::spawn_worker(self, &rec);
            tracing::info!(sandbox_id = %sb.id, "adopted sandbox");
        }
        Ok(())
    }

    /// Deletes every sandbox (graceful shutdown).
    pub async fn shutdown(&self) {
        let all = self.all().await.unwrap_or_default();
        let mut tasks = Vec::new();
        for r in all {
            let s = self.clone();
            tasks.push(tokio::spawn(async move {
                s.remove(&r, "the orchestrator shut down").await
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        let _ = self.backend().shutdown().await;
    }
}

/// The limits of a create as the backend is given them.
struct FittedLimits {
    /// CPUs applied.
    cpus: f64,
    /// Memory applied, bytes.
    memory_bytes: u64,
    /// CPUs as recorded and echoed (the request's text, or what it was lowered to).
    cpu: String,
    /// Memory as recorded and echoed.
    memory: String,
    /// What was lowered and why, when anything was.
    notice: Option<String>,
}

/// What a create task passes to the backend besides the record.
struct CreateSpecParts {
    cpus: Option<f64>,
    memory_bytes: Option<u64>,
    env: Vec<String>,
    labels: BTreeMap<String, String>,
    snapshot: Option<String>,
    sessions: Vec<orchard_protocol::session::SessionState>,
}
