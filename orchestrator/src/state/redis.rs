//! The Redis [`StateStore`] (`orchard serve --state redis://HOST:PORT`): the same
//! guarantees as [`super::memory::MemoryStore`], across every replica that points at the
//! same Redis.
//!
//! Every step that reads and then writes is one Lua script, so Redis runs it atomically:
//! the compare-and-set of a record's version, a job queued only behind a live
//! incarnation, a job taken or finished only under the newest grant of its lease,
//! counters that stop at their limit. Time that must agree across replicas (lease expiry,
//! rate windows) is Redis's own: `PEXPIRE` and `TIME`, never a replica's clock.
//!
//! Keys, under a prefix (`orchard` by default, so several deployments can share one
//! Redis database):
//! - `P:sb:<id>`: hash `v` (version), `uid`, `phase`, `r` (the record's JSON); `P:sbs`
//!   the set of ids; `P:ver` the version counter;
//! - `P:job:<id>`: hash `r` (the job's JSON as queued, then as finished), `st` (`q`
//!   queued, `r` running, `d` done), `started` and `fence` (of the worker's lease it
//!   was taken under); `P:q:<sandbox>` the queue (a list of ids), `P:run:<sandbox>` the
//!   running ones; `P:done` finished jobs by finish time (for the purge); `P:busy` the
//!   sandboxes that had jobs queued (pruned when their queue and running set are empty);
//! - `P:ctr:<name>` counters, `P:rate:<key>` rate windows (sorted by Redis's time);
//! - `P:lease:<name>` hash `holder`, `fence` that expires with the lease, `P:fence:<name>`
//!   the newest grant's fence (it outlives the lease: a holder that paused past its
//!   expiry is refused while it exists), `P:fences` the fence counter.
//!
//! Notifications: every write publishes its topic (`s:<id>`, `j:<id>`, `q:<id>`) on one
//! channel, `P:ev`, and every replica keeps one subscription to it, fanned out to local
//! `watch` counters per topic. One channel rather than one per topic: a subscription
//! must be in force before the caller's read ([`StateStore::subscribe`] is synchronous),
//! and the single channel is subscribed once, before the store is used. When that
//! connection drops, every local subscriber is woken (it re-reads: a spurious wake is
//! harmless, a missed one would hang a wait), and again once it is back.
//!
//! What this store does not do (documented in the README's orchestrator section): Redis Cluster (the
//! scripts touch keys they do not declare), and the memory store's output budget:
//! finished jobs' output lives in Redis until the retention purge, so Redis's
//! `maxmemory` is the operator's bound. Persistence is Redis's: with AOF
//! (`appendfsync everysec`) a Redis crash loses at most the last second of writes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use orchard_protocol::compat::JobStatus;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;
use tokio::sync::watch;

use super::{
    JobRecord, Lease, Phase, SandboxRecord, StateStore, StoreError, StoreFuture, Subscription,
    Topic, Version, Versioned,
};

/// How long one Redis call may take before it fails as `Unavailable` (a request then
/// answers 503 instead of hanging while Redis is away).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the newest fence of a lease is kept after its last grant or renewal.
const FENCE_KEEP: Duration = Duration::from_secs(3600);
/// Jobs purged per script call (a purge of many runs in several short scripts).
const PURGE_BATCH: usize = 1000;

/// The Lua scripts, each one atomic step.
struct Scripts {
    insert_sandbox: Script,
    update_sandbox: Script,
    remove_sandbox: Script,
    sandboxes: Script,
    phase_counts: Script,
    insert_job: Script,
    take_job: Script,
    queued_jobs: Script,
    unattended: Script,
    running_jobs: Script,
    finish_job: Script,
    purge_jobs: Script,
    acquire_slot: Script,
    release_slot: Script,
    hit_rate: Script,
    acquire_lease: Script,
    renew_lease: Script,
    release_lease: Script,
}

impl Scripts {
    /// Every script, compiled once.
    // Over 100 lines because it is one literal: each Lua script reads best beside its name.
    fn new() -> Scripts {
        Scripts {
            insert_sandbox: Script::new(
                r"if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
                local v = redis.call('INCR', KEYS[3])
                redis.call('HSET', KEYS[1], 'v', v, 'uid', ARGV[2], 'phase', ARGV[3], 'r', ARGV[4])
                redis.call('SADD', KEYS[2], ARGV[1])
                redis.call('PUBLISH', ARGV[5], ARGV[6])
                return v",
            ),
            update_sandbox: Script::new(
                r"local cur = redis.call('HMGET', KEYS[1], 'v', 'uid')
                if not cur[1] then return -1 end
                if cur[1] ~= ARGV[4] or cur[2] ~= ARGV[1] then return -2 end
                local v = redis.call('INCR', KEYS[2])
                redis.call('HSET', KEYS[1], 'v', v, 'phase', ARGV[2], 'r', ARGV[3])
                redis.call('PUBLISH', ARGV[5], ARGV[6])
                return v",
            ),
            remove_sandbox: Script::new(
                r"local cur = redis.call('HMGET', KEYS[1], 'uid', 'r')
                if (not cur[1]) or cur[1] ~= ARGV[2] then return false end
                redis.call('DEL', KEYS[1])
                redis.call('SREM', KEYS[2], ARGV[1])
                redis.call('PUBLISH', ARGV[3], ARGV[4])
                redis.call('PUBLISH', ARGV[3], ARGV[5])
                return cur[2]",
            ),
            sandboxes: Script::new(
                r"local out = {}
                for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
                  local cur = redis.call('HMGET', ARGV[1] .. id, 'v', 'r')
                  if cur[1] then out[#out + 1] = cur[1]; out[#out + 1] = cur[2] end
                end
                return out",
            ),
            phase_counts: Script::new(
                r"local out = {}
                for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
                  local p = redis.call('HGET', ARGV[1] .. id, 'phase')
                  if p then out[#out + 1] = p end
                end
                return out",
            ),
            insert_job: Script::new(
                r"if redis.call('HGET', KEYS[1], 'uid') ~= ARGV[1] then return -1 end
                if redis.call('EXISTS', KEYS[2]) == 1 then return -2 end
                redis.call('HSET', KEYS[2], 'r', ARGV[2], 'st', 'q')
                redis.call('RPUSH', KEYS[3], ARGV[3])
                redis.call('SADD', KEYS[4], ARGV[6])
                redis.call('PUBLISH', ARGV[4], ARGV[5])
                return 1",
            ),
            take_job: Script::new(
                r"local f = redis.call('GET', KEYS[2])
                if f and tonumber(f) > tonumber(ARGV[1]) then return {-1, false} end
                while true do
                  local id = redis.call('LPOP', KEYS[1])
                  if not id then return {0, false} end
                  local k = ARGV[2] .. id
                  if redis.call('HGET', k, 'st') == 'q' then
                    redis.call('HSET', k, 'st', 'r', 'started', ARGV[3], 'fence', ARGV[1])
                    redis.call('SADD', KEYS[3], id)
                    redis.call('PUBLISH', ARGV[4], ARGV[5] .. id)
                    return {1, redis.call('HGET', k, 'r')}
                  end
                end",
            ),
            // `P:busy` holds every sandbox that had a job queued; members whose queue
            // and running set are both gone (Redis drops empty keys) leave it here.
            unattended: Script::new(
                r"local out = {}
                for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
                  if redis.call('EXISTS', ARGV[1] .. id) == 0 and redis.call('EXISTS', ARGV[2] .. id) == 0 then
                    redis.call('SREM', KEYS[1], id)
                  elseif redis.call('EXISTS', ARGV[3] .. id) == 0 then
                    table.insert(out, id)
                  end
                end
                return out",
            ),
            queued_jobs: Script::new(
                r"local out = {}
                for _, id in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
                  local cur = redis.call('HMGET', ARGV[1] .. id, 'r', 'st')
                  if cur[1] and cur[2] == 'q' then
                    out[#out + 1] = cur[1]
                  else
                    redis.call('LREM', KEYS[1], 0, id)
                  end
                end
                return out",
            ),
            running_jobs: Script::new(
                r"local out = {}
                for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
                  local cur = redis.call('HMGET', ARGV[1] .. id, 'r', 'st', 'started', 'fence')
                  if cur[1] and cur[2] == 'r' then
                    out[#out + 1] = cur[1]; out[#out + 1] = cur[3]; out[#out + 1] = cur[4]
                  else
                    redis.call('SREM', KEYS[1], id)
                  end
                end
                return out",
            ),
            finish_job: Script::new(
                r"if ARGV[1] == '1' then
                  local f = redis.call('GET', KEYS[2])
                  if f and tonumber(f) > tonumber(ARGV[2]) then return -1 end
                end
                local st = redis.call('HGET', KEYS[1], 'st')
                if (not st) or st == 'd' then return 0 end
                if ARGV[8] == '1' and st ~= 'q' then return 0 end
                if st == 'q' then redis.call('LREM', KEYS[5], 0, ARGV[5]) end
                redis.call('HSET', KEYS[1], 'r', ARGV[3], 'st', 'd')
                redis.call('HDEL', KEYS[1], 'fence')
                redis.call('ZADD', KEYS[3], ARGV[4], ARGV[5])
                redis.call('SREM', KEYS[4], ARGV[5])
                redis.call('PUBLISH', ARGV[6], ARGV[7])
                return 1",
            ),
            purge_jobs: Script::new(
                r"local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
                for _, id in ipairs(ids) do
                  redis.call('DEL', ARGV[2] .. id)
                  redis.call('ZREM', KEYS[1], id)
                end
                return #ids",
            ),
            acquire_slot: Script::new(
                r"local n = tonumber(redis.call('GET', KEYS[1]) or '0')
                local lim = tonumber(ARGV[1])
                if lim > 0 and n >= lim then return 0 end
                redis.call('INCR', KEYS[1])
                return 1",
            ),
            release_slot: Script::new(
                r"local n = tonumber(redis.call('GET', KEYS[1]) or '0')
                if n <= 1 then redis.call('DEL', KEYS[1]) else redis.call('DECR', KEYS[1]) end
                return 1",
            ),
            hit_rate: Script::new(
                r"local t = redis.call('TIME')
                local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
                redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]) * 1000)
                local lim = tonumber(ARGV[2])
                if lim > 0 and redis.call('ZCARD', KEYS[1]) >= lim then return 0 end
                redis.call('ZADD', KEYS[1], now, ARGV[3])
                redis.call('PEXPIRE', KEYS[1], ARGV[1])
                return 1",
            ),
            acquire_lease: Script::new(
                r"local cur = redis.call('HMGET', KEYS[1], 'holder', 'fence')
                if cur[1] then
                  if cur[1] == ARGV[1] then
                    redis.call('PEXPIRE', KEYS[1], ARGV[2])
                    redis.call('PEXPIRE', KEYS[2], ARGV[3])
                    return tonumber(cur[2])
                  end
                  return -1
                end
                local f = redis.call('INCR', KEYS[3])
                redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'fence', f)
                redis.call('PEXPIRE', KEYS[1], ARGV[2])
                redis.call('SET', KEYS[2], f, 'PX', ARGV[3])
                return f",
            ),
            renew_lease: Script::new(
                r"local cur = redis.call('HMGET', KEYS[1], 'holder', 'fence')
                if cur[1] == ARGV[1] and cur[2] == ARGV[2] then
                  redis.call('PEXPIRE', KEYS[1], ARGV[3])
                  redis.call('PEXPIRE', KEYS[2], ARGV[4])
                  return 1
                end
                return 0",
            ),
            release_lease: Script::new(
                r"local cur = redis.call('HMGET', KEYS[1], 'holder', 'fence')
                if cur[1] == ARGV[1] and cur[2] == ARGV[2] then redis.call('DEL', KEYS[1]) end
                return 1",
            ),
        }
    }
}

/// The local fan-out of the `P:ev` channel: a `watch` counter per topic.
#[derive(Default)]
struct Hub {
    topics: Mutex<HashMap<Topic, watch::Sender<u64>>>,
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, HashMap<Topic, watch::Sender<u64>>> {
        self.topics.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self, topic: &Topic) {
        let mut topics = self.lock();
        if let Some(tx) = topics.get(topic) {
            if tx.receiver_count() == 0 {
                topics.remove(topic);
            } else {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// Wakes every subscriber (notifications may have been missed).
    fn bump_all(&self) {
        let mut topics = self.lock();
        topics.retain(|_, tx| tx.receiver_count() > 0);
        for tx in topics.values() {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn subscribe(&self, topic: Topic) -> Subscription {
        let mut topics = self.lock();
        let tx = topics.entry(topic).or_insert_with(|| watch::Sender::new(0));
        Subscription::new(tx.subscribe())
    }
}

fn event(topic: &Topic) -> String {
    match topic {
        Topic::Sandbox(id) => format!("s:{id}"),
        Topic::Job(id) => format!("j:{id}"),
        Topic::Queue(id) => format!("q:{id}"),
    }
}

fn parse_event(payload: &str) -> Option<Topic> {
    let (kind, id) = payload.split_once(':')?;
    let id = id.to_string();
    match kind {
        "s" => Some(Topic::Sandbox(id)),
        "j" => Some(Topic::Job(id)),
        "q" => Some(Topic::Queue(id)),
        _ => None,
    }
}

/// A call Redis failed (or a failure on the way to one), `e` its cause.
fn unavailable<E: std::error::Error + Send + Sync + 'static>(e: E) -> StoreError {
    StoreError::unavailable(format!("redis: {e}"), e)
}

/// A call Redis did not answer within [`CALL_TIMEOUT`].
fn no_answer(elapsed: tokio::time::error::Elapsed) -> StoreError {
    StoreError::unavailable("redis: no answer within the call timeout", elapsed)
}

/// A value in Redis that does not parse as the `what` it should be.
fn corrupt<E: std::error::Error + Send + Sync + 'static>(what: &str, e: E) -> StoreError {
    StoreError::unavailable(format!("redis holds an unreadable {what}: {e}"), e)
}

/// `d` in ms (0 is valid: a lease or window of 0 ms has ended at once, as in memory).
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The Redis store. Cheap to share: one multiplexed connection (reconnected on loss)
/// and one subscription task.
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: String,
    scripts: Arc<Scripts>,
    hub: Arc<Hub>,
    events: String,
    listener: tokio::task::JoinHandle<()>,
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl RedisStore {
    /// Connects to `url` (`redis://HOST:PORT[/DB]`, `redis://:PASSWORD@HOST:PORT`),
    /// keys under `prefix`; answers once the notification channel is subscribed, so no
    /// write after this returns goes unnoticed.
    pub async fn connect(url: &str, prefix: &str) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(url)
            .map_err(|e| StoreError::unavailable(format!("bad redis URL {url}: {e}"), e))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CALL_TIMEOUT))
            .set_response_timeout(Some(CALL_TIMEOUT))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(1));
        let conn = tokio::time::timeout(
            CALL_TIMEOUT * 2,
            ConnectionManager::new_with_config(client.clone(), config),
        )
        .await
        .map_err(|e| StoreError::unavailable(format!("redis at {url} did not answer"), e))?
        .map_err(|e| StoreError::unavailable(format!("cannot reach redis at {url}: {e}"), e))?;
        let hub = Arc::new(Hub::default());
        let events = format!("{prefix}:ev");
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let listener = tokio::spawn(listen(client, events.clone(), hub.clone(), ready_tx));
        let failed: Option<crate::backend::BoxError> =
            match tokio::time::timeout(CALL_TIMEOUT * 2, ready_rx).await {
                Ok(Ok(())) => None,
                // The listener ended before it subscribed.
                Ok(Err(gone)) => Some(gone.into()),
                Err(elapsed) => Some(elapsed.into()),
            };
        if let Some(cause) = failed {
            listener.abort();
            return Err(StoreError::unavailable(
                format!("cannot subscribe to {events} on redis at {url}"),
                cause,
            ));
        }
        Ok(RedisStore {
            conn,
            prefix: prefix.to_string(),
            scripts: Arc::new(Scripts::new()),
            hub,
            events,
            listener,
        })
    }

    fn key(&self, kind: &str, name: &str) -> String {
        format!("{}:{kind}:{name}", self.prefix)
    }

    fn kind_prefix(&self, kind: &str) -> String {
        format!("{}:{kind}:", self.prefix)
    }

    /// Runs `inv` with the call timeout.
    async fn run<T: redis::FromRedisValue>(
        &self,
        inv: redis::ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.clone();
        match tokio::time::timeout(CALL_TIMEOUT, inv.invoke_async(&mut conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(unavailable(e)),
            Err(elapsed) => Err(no_answer(elapsed)),
        }
    }

    /// The job record in `r` as its state `st` says it is now.
    fn job_from(
        r: &str,
        st: Option<&str>,
        started: Option<f64>,
        fence: Option<u64>,
    ) -> Result<JobRecord, StoreError> {
        let mut job: JobRecord = serde_json::from_str(r).map_err(|e| corrupt("job", e))?;
        match st {
            Some("r") => {
                job.job.status = JobStatus::Running;
                job.job.started_at = started.or(job.job.started_at);
                job.fence = fence.or(job.fence);
            }
            Some("q") => job.job.status = JobStatus::Queued,
            _ => {}
        }
        Ok(job)
    }

    /// Every sandbox record and its version.
    async fn all_sandboxes(&self) -> Result<Vec<Versioned<SandboxRecord>>, StoreError> {
        let mut inv = self.scripts.sandboxes.key(self.key("sbs", "all"));
        inv.arg(self.kind_prefix("sb"));
        let flat: Vec<String> = self.run(inv).await?;
        flat.chunks(2)
            .filter(|c| c.len() == 2)
            .map(|c| {
                let version = c[0].parse().map_err(|e| corrupt("version", e))?;
                let value = serde_json::from_str(&c[1]).map_err(|e| corrupt("sandbox", e))?;
                Ok(Versioned { value, version })
            })
            .collect()
    }
}

/// Keeps the subscription to `channel`, waking `hub`'s topics on each event; signals
/// `ready` once first subscribed. Reconnects on loss with a short backoff, waking every
/// subscriber on the loss and again on the reconnection.
async fn listen(
    client: redis::Client,
    channel: String,
    hub: Arc<Hub>,
    ready: tokio::sync::oneshot::Sender<()>,
) {
    let mut ready = Some(ready);
    let mut backoff = Duration::from_millis(50);
    loop {
        let subscribed = async {
            let mut ps = client.get_async_pubsub().await?;
            ps.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(ps)
        };
        match tokio::time::timeout(CALL_TIMEOUT, subscribed).await {
            Ok(Ok(ps)) => {
                backoff = Duration::from_millis(50);
                if let Some(tx) = ready.take() {
                    let _ = tx.send(());
                }
                // Whatever was written while we were away.
                hub.bump_all();
                let mut stream = ps.into_on_message();
                while let Some(msg) = stream.next().await {
                    if let Some(topic) = msg
                        .get_payload::<String>()
                        .ok()
                        .and_then(|p| parse_event(&p))
                    {
                        hub.bump(&topic);
                    }
                }
                tracing::warn!(channel = %channel, "the redis notification channel dropped; reconnecting");
                hub.bump_all();
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot subscribe to redis notifications; retrying");
            }
            Err(_) => tracing::warn!("redis did not answer the subscription; retrying"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

impl StateStore for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn shared(&self) -> bool {
        true
    }

    fn insert_sandbox(&self, record: SandboxRecord) -> StoreFuture<'_, Version> {
        Box::pin(async move {
            let json = serde_json::to_string(&record).map_err(|e| corrupt("sandbox", e))?;
            let topic = Topic::Sandbox(record.id.clone());
            let mut inv = self.scripts.insert_sandbox.key(self.key("sb", &record.id));
            inv.key(self.key("sbs", "all"))
                .key(self.key("ver", "all"))
                .arg(&record.id)
                .arg(&record.uid)
                .arg(record.phase.name())
                .arg(json)
                .arg(&self.events)
                .arg(event(&topic));
            let v: i64 = self.run(inv).await?;
            if v < 0 {
                return Err(StoreError::Exists(format!("sandbox {}", record.id)));
            }
            self.hub.bump(&topic);
            Ok(v as Version)
        })
    }

    fn sandbox<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<Versioned<SandboxRecord>>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let cmd = redis::cmd("HMGET")
                .arg(self.key("sb", id))
                .arg("v")
                .arg("r")
                .to_owned();
            let (v, r): (Option<u64>, Option<String>) =
                match tokio::time::timeout(CALL_TIMEOUT, cmd.query_async(&mut conn)).await {
                    Ok(res) => res.map_err(unavailable)?,
                    Err(elapsed) => return Err(no_answer(elapsed)),
                };
            match (v, r) {
                (Some(version), Some(r)) => Ok(Some(Versioned {
                    value: serde_json::from_str(&r).map_err(|e| corrupt("sandbox", e))?,
                    version,
                })),
                _ => Ok(None),
            }
        })
    }

    fn sandboxes(&self) -> StoreFuture<'_, Vec<Versioned<SandboxRecord>>> {
        Box::pin(self.all_sandboxes())
    }

    fn phase_counts(&self) -> StoreFuture<'_, BTreeMap<&'static str, u64>> {
        Box::pin(async move {
            let mut inv = self.scripts.phase_counts.key(self.key("sbs", "all"));
            inv.arg(self.kind_prefix("sb"));
            let phases: Vec<String> = self.run(inv).await?;
            let mut counts = BTreeMap::new();
            for p in phases {
                let name = match p.as_str() {
                    "pending" => Phase::Pending.name(),
                    "running" => Phase::Ready.name(),
                    _ => "failed",
                };
                *counts.entry(name).or_default() += 1;
            }
            Ok(counts)
        })
    }

    fn update_sandbox(&self, record: SandboxRecord, expected: Version) -> StoreFuture<'_, Version> {
        Box::pin(async move {
            let json = serde_json::to_string(&record).map_err(|e| corrupt("sandbox", e))?;
            let topic = Topic::Sandbox(record.id.clone());
            let mut inv = self.scripts.update_sandbox.key(self.key("sb", &record.id));
            inv.key(self.key("ver", "all"))
                .arg(&record.uid)
                .arg(record.phase.name())
                .arg(json)
                .arg(expected.to_string())
                .arg(&self.events)
                .arg(event(&topic));
            let v: i64 = self.run(inv).await?;
            match v {
                -1 => Err(StoreError::NotFound(format!("sandbox {}", record.id))),
                v if v < 0 => Err(StoreError::Conflict(format!("sandbox {}", record.id))),
                v => {
                    self.hub.bump(&topic);
                    Ok(v as Version)
                }
            }
        })
    }

    fn remove_sandbox<'a>(
        &'a self,
        id: &'a str,
        uid: &'a str,
    ) -> StoreFuture<'a, Option<SandboxRecord>> {
        Box::pin(async move {
            let sandbox = Topic::Sandbox(id.to_string());
            let queue = Topic::Queue(id.to_string());
            let mut inv = self.scripts.remove_sandbox.key(self.key("sb", id));
            inv.key(self.key("sbs", "all"))
                .arg(id)
                .arg(uid)
                .arg(&self.events)
                .arg(event(&sandbox))
                .arg(event(&queue));
            let r: Option<String> = self.run(inv).await?;
            let Some(r) = r else { return Ok(None) };
            self.hub.bump(&sandbox);
            self.hub.bump(&queue);
            Ok(Some(
                serde_json::from_str(&r).map_err(|e| corrupt("sandbox", e))?,
            ))
        })
    }

    fn insert_job<'a>(&'a self, job: JobRecord, sandbox_uid: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let id = job.job.job_id.clone();
            let sandbox = job.job.sandbox_id.clone();
            let json = serde_json::to_string(&job).map_err(|e| corrupt("job", e))?;
            let topic = Topic::Queue(sandbox.clone());
            let mut inv = self.scripts.insert_job.key(self.key("sb", &sandbox));
            inv.key(self.key("job", &id))
                .key(self.key("q", &sandbox))
                .key(self.key("busy", "all"))
                .arg(sandbox_uid)
                .arg(json)
                .arg(&id)
                .arg(&self.events)
                .arg(event(&topic))
                .arg(&sandbox);
            match self.run::<i64>(inv).await? {
                -1 => Err(StoreError::NotFound(format!("sandbox {sandbox}"))),
                -2 => Err(StoreError::Exists(format!("job {id}"))),
                _ => {
                    self.hub.bump(&topic);
                    Ok(())
                }
            }
        })
    }

    fn job<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<JobRecord>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let cmd = redis::cmd("HMGET")
                .arg(self.key("job", id))
                .arg("r")
                .arg("st")
                .arg("started")
                .arg("fence")
                .to_owned();
            #[allow(clippy::type_complexity)]
            let (r, st, started, fence): (
                Option<String>,
                Option<String>,
                Option<f64>,
                Option<u64>,
            ) = match tokio::time::timeout(CALL_TIMEOUT, cmd.query_async(&mut conn)).await {
                Ok(res) => res.map_err(unavailable)?,
                Err(elapsed) => return Err(no_answer(elapsed)),
            };
            match r {
                Some(r) => Ok(Some(Self::job_from(&r, st.as_deref(), started, fence)?)),
                None => Ok(None),
            }
        })
    }

    fn take_job<'a>(
        &'a self,
        sandbox: &'a str,
        lease: &'a Lease,
    ) -> StoreFuture<'a, Option<JobRecord>> {
        Box::pin(async move {
            let now = crate::time::now_secs();
            let mut inv = self.scripts.take_job.key(self.key("q", sandbox));
            inv.key(self.key("fence", &lease.name))
                .key(self.key("run", sandbox))
                .arg(lease.fence)
                .arg(self.kind_prefix("job"))
                .arg(now)
                .arg(&self.events)
                .arg("j:");
            let (code, r): (i64, Option<String>) = self.run(inv).await?;
            match (code, r) {
                (-1, _) => Err(StoreError::Conflict(format!("lease {}", lease.name))),
                (1, Some(r)) => {
                    let job = Self::job_from(&r, Some("r"), Some(now), Some(lease.fence))?;
                    self.hub.bump(&Topic::Job(job.job.job_id.clone()));
                    Ok(Some(job))
                }
                _ => Ok(None),
            }
        })
    }

    fn running_jobs<'a>(&'a self, sandbox: &'a str) -> StoreFuture<'a, Vec<JobRecord>> {
        Box::pin(async move {
            let mut inv = self.scripts.running_jobs.key(self.key("run", sandbox));
            inv.arg(self.kind_prefix("job"));
            let flat: Vec<Option<String>> = self.run(inv).await?;
            flat.chunks(3)
                .filter_map(|c| match c {
                    [Some(r), started, fence] => Some(Self::job_from(
                        r,
                        Some("r"),
                        started.as_deref().and_then(|s| s.parse().ok()),
                        fence.as_deref().and_then(|f| f.parse().ok()),
                    )),
                    _ => None,
                })
                .collect()
        })
    }

    fn unattended_sandboxes<'a>(&'a self, lease_prefix: &'a str) -> StoreFuture<'a, Vec<String>> {
        Box::pin(async move {
            let mut inv = self.scripts.unattended.key(self.key("busy", "all"));
            inv.arg(self.kind_prefix("q"))
                .arg(self.kind_prefix("run"))
                .arg(format!("{}{lease_prefix}", self.kind_prefix("lease")));
            self.run(inv).await
        })
    }

    fn queued_jobs<'a>(&'a self, sandbox: &'a str) -> StoreFuture<'a, Vec<JobRecord>> {
        Box::pin(async move {
            let mut inv = self.scripts.queued_jobs.key(self.key("q", sandbox));
            inv.arg(self.kind_prefix("job"));
            let rs: Vec<String> = self.run(inv).await?;
            rs.iter()
                .map(|r| Self::job_from(r, Some("q"), None, None))
                .collect()
        })
    }

    fn finish_job<'a>(&'a self, job: JobRecord, lease: Option<&'a Lease>) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let id = job.job.job_id.clone();
            let finished = job.finished_ms.unwrap_or_else(crate::time::now_ms);
            let json = serde_json::to_string(&job).map_err(|e| corrupt("job", e))?;
            let topic = Topic::Job(id.clone());
            let fence_key =
                lease.map_or_else(|| self.key("fence", "none"), |l| self.key("fence", &l.name));
            let mut inv = self.scripts.finish_job.key(self.key("job", &id));
            inv.key(fence_key)
                .key(self.key("done", "all"))
                .key(self.key("run", &job.job.sandbox_id))
                .key(self.key("q", &job.job.sandbox_id))
                .arg(if lease.is_some() { "1" } else { "0" })
                .arg(lease.map_or(0, |l| l.fence))
                .arg(json)
                .arg(finished)
                .arg(&id)
                .arg(&self.events)
                .arg(event(&topic))
                // Never taken (read from the queue): written only while still queued.
                .arg(if job.fence.is_none() { "1" } else { "0" });
            match self.run::<i64>(inv).await? {
                -1 => Err(StoreError::Conflict(format!("job {id}"))),
                0 => Ok(false),
                _ => {
                    self.hub.bump(&topic);
                    Ok(true)
                }
            }
        })
    }

    fn purge_jobs(&self, before_ms: u64) -> StoreFuture<'_, usize> {
        Box::pin(async move {
            let mut total = 0;
            loop {
                let mut inv = self.scripts.purge_jobs.key(self.key("done", "all"));
                inv.arg(before_ms)
                    .arg(self.kind_prefix("job"))
                    .arg(PURGE_BATCH);
                let n: usize = self.run(inv).await?;
                total += n;
                if n < PURGE_BATCH {
                    // Topics whose subscribers all left.
                    self.hub.lock().retain(|_, tx| tx.receiver_count() > 0);
                    return Ok(total);
                }
            }
        })
    }

    fn acquire_slot<'a>(&'a self, counter: &'a str, limit: u64) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let mut inv = self.scripts.acquire_slot.key(self.key("ctr", counter));
            inv.arg(limit);
            Ok(self.run::<i64>(inv).await? == 1)
        })
    }

    fn release_slot<'a>(&'a self, counter: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let inv = self.scripts.release_slot.key(self.key("ctr", counter));
            self.run::<i64>(inv).await.map(|_| ())
        })
    }

    fn hit_rate<'a>(&'a self, key: &'a str, window: Duration, limit: u64) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            // A member unique to this hit (two hits in one microsecond both count).
            let member = crate::random::hex(8).map_err(unavailable)?;
            let mut inv = self.scripts.hit_rate.key(self.key("rate", key));
            inv.arg(ms(window)).arg(limit).arg(member);
            Ok(self.run::<i64>(inv).await? == 1)
        })
    }

    fn acquire_lease<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, Option<Lease>> {
        Box::pin(async move {
            let mut inv = self.scripts.acquire_lease.key(self.key("lease", name));
            inv.key(self.key("fence", name))
                .key(self.key("fences", "all"))
                .arg(holder)
                .arg(ms(ttl))
                .arg(ms(ttl.max(FENCE_KEEP)));
            let fence: i64 = self.run(inv).await?;
            Ok((fence > 0).then(|| Lease {
                name: name.to_string(),
                holder: holder.to_string(),
                fence: fence as u64,
            }))
        })
    }

    fn renew_lease<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let mut inv = self.scripts.renew_lease.key(self.key("lease", &lease.name));
            inv.key(self.key("fence", &lease.name))
                .arg(&lease.holder)
                .arg(lease.fence.to_string())
                .arg(ms(ttl))
                .arg(ms(ttl.max(FENCE_KEEP)));
            Ok(self.run::<i64>(inv).await? == 1)
        })
    }

    fn release_lease<'a>(&'a self, lease: &'a Lease) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let mut inv = self
                .scripts
                .release_lease
                .key(self.key("lease", &lease.name));
            inv.arg(&lease.holder).arg(lease.fence.to_string());
            self.run::<i64>(inv).await.map(|_| ())
        })
    }

    fn subscribe(&self, topic: Topic) -> Subscription {
        self.hub.subscribe(topic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_name_their_topic_and_parse_back() {
        for t in [
            Topic::Sandbox("a:b".into()),
            Topic::Job("job-1".into()),
            Topic::Queue("sb".into()),
        ] {
            assert_eq!(parse_event(&event(&t)), Some(t));
        }
        assert_eq!(parse_event("x:1"), None);
        assert_eq!(parse_event("nocolon"), None);
    }

    #[tokio::test]
    async fn a_wake_of_every_subscriber_reaches_each_topic() {
        let hub = Hub::default();
        let mut a = hub.subscribe(Topic::Job("a".into()));
        let mut b = hub.subscribe(Topic::Queue("b".into()));
        hub.bump_all();
        assert!(a.changed().await);
        assert!(b.changed().await);
    }

    /// Redis' own error is the cause of the store's, under the same message as before.
    #[tokio::test]
    async fn a_bad_url_keeps_redis_own_error() {
        use std::error::Error as _;
        let Err(err) = RedisStore::connect("nosuch://x", "t").await else {
            panic!("a bad URL connected");
        };
        let redis = err
            .source()
            .and_then(|s| s.downcast_ref::<redis::RedisError>());
        let Some(redis) = redis else {
            panic!("no RedisError under {err:?}")
        };
        assert_eq!(
            err.to_string(),
            format!("the state store failed: bad redis URL nosuch://x: {redis}")
        );
    }

    /// A corrupt record keeps the parser's error.
    #[test]
    fn a_corrupt_record_keeps_the_parsers_error() {
        use std::error::Error as _;
        let parsed = serde_json::from_str::<JobRecord>("{").unwrap_err();
        let err = corrupt("job", parsed);
        assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
        assert!(err.source().is_some_and(|s| s.is::<serde_json::Error>()));
    }
}
